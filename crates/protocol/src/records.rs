//! A new record as a client writes it, in one place for every part of Sluice that produces
//! (the command-line tools, the console, the AMQP front door): created now, with no producer
//! id or sequence (offsets and sequences are set when a batch is encoded).

use bytes::Bytes;
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Record, TimestampType};

/// A plain record (no producer id, not transactional) created at `timestamp_ms`.
pub fn new_record(
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: IndexMap<StrBytes, Option<Bytes>>,
    timestamp_ms: i64,
) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: timestamp_ms,
        key,
        value,
        headers,
    }
}
