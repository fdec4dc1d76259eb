//! Helpers shared by the storage tests that append acknowledged batches of one record.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use sluice_storage::{LogManager, Partition};

/// A batch of one record whose value is `value_bytes` copies of `fill`.
pub fn batch(fill: u8, value_bytes: usize) -> Bytes {
    let record = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: sluice_storage::now_ms(),
        key: None,
        value: Some(Bytes::from(vec![fill; value_bytes])),
        headers: Default::default(),
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &[record],
        &RecordEncodeOptions { version: 2, compression: Compression::None },
    )
    .unwrap();
    buf.freeze()
}

/// Appends `batches` and waits until the group commit made them durable (their acknowledgement).
#[allow(dead_code)] // not every test binary that includes this module uses it
pub fn append_acknowledged(manager: &LogManager, partition: &Arc<Partition>, batches: &[Bytes]) {
    append_all_acknowledged(manager, &[(partition, batches)]);
}

/// Appends each partition's batches, then waits until the group commit made all of them
/// durable: the partitions share the commit rounds, as concurrent producers' would.
pub fn append_all_acknowledged(manager: &LogManager, appends: &[(&Arc<Partition>, &[Bytes])]) {
    let mut waits = Vec::with_capacity(appends.len());
    for (partition, batches) in appends {
        let mut visible_at = 0;
        for batch in batches.iter() {
            visible_at = partition.append(batch, 0, sluice_storage::now_ms()).unwrap().visible_at;
        }
        manager.syncer().schedule(partition);
        waits.push((partition.subscribe(), visible_at));
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for (mut visible, visible_at) in waits {
        runtime.block_on(visible.wait_for(|v| v.high_watermark >= visible_at)).unwrap();
    }
}
