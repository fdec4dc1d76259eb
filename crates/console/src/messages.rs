//! Reading messages for the browser: from an offset, a timestamp or the end of one partition
//! or of every partition of a topic, fetched by the broker from each partition's leader and
//! shown decoded; at most [`MESSAGES_MAX`] per page, so a page never ships the log.

use std::sync::Arc;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Record, RecordBatchDecoder};

use crate::cluster::{versions, ClusterClient, ClusterMetadata};
use crate::display::{SchemaDecoder, Shown};
use crate::topics::{offsets, PartitionRow, LATEST};

/// The most messages one page shows.
pub const MESSAGES_MAX: usize = 500;
/// Bytes one Fetch asks of a partition.
const FETCH_PARTITION_BYTES: i32 = 1024 * 1024;
/// Fetches per partition for one page at most (a partition of tiny or filtered-out
/// records ends the page early instead of looping).
const FETCHES_PER_PARTITION_MAX: usize = 8;

/// Where a page starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At this offset of each partition read.
    Offset(i64),
    /// At the first message at or after this time (ms since the epoch).
    Timestamp(i64),
    /// The newest messages: this many before each partition's end.
    End,
}

/// One message as the page shows it.
#[derive(Debug, Clone)]
pub struct MessageRow {
    pub partition: i32,
    pub offset: i64,
    pub timestamp: i64,
    pub key: Shown,
    pub value: Shown,
    pub headers: Vec<(String, Shown)>,
}

impl MessageRow {
    /// How `record` of `partition` is shown: its key and value decoded by `decoder` where
    /// it knows their schema (in hex when `raw`).
    pub fn of(partition: i32, record: &Record, decoder: Option<&dyn SchemaDecoder>, raw: bool) -> MessageRow {
        MessageRow {
            partition,
            offset: record.offset,
            timestamp: record.timestamp,
            key: Shown::decoded(record.key.as_deref(), decoder, raw),
            value: Shown::decoded(record.value.as_deref(), decoder, raw),
            headers: record.headers.iter().map(|(k, v)| (k.to_string(), Shown::of(v.as_deref()))).collect(),
        }
    }
}

/// How a page shows keys and values framed with a schema id.
#[derive(Clone, Default)]
pub struct Decoding {
    pub decoder: Option<Arc<dyn SchemaDecoder>>,
    /// Their bytes in hex rather than decoded.
    pub raw: bool,
}

/// Up to `max` messages of `topic` (one partition, or all), from `start`, oldest first
/// within a partition; with `End`, the newest `max` of each partition read.
pub async fn browse(
    client: &Arc<ClusterClient>,
    metadata: &ClusterMetadata,
    topic: &str,
    partitions: &[PartitionRow],
    start: Start,
    max: usize,
    decoding: &Decoding,
) -> anyhow::Result<Vec<MessageRow>> {
    assert!(max <= MESSAGES_MAX, "a page shows at most {MESSAGES_MAX} messages");
    let per_partition = max.div_ceil(partitions.len().max(1)).max(1);
    let from = starting_offsets(client, metadata, topic, partitions, start, per_partition as i64).await?;
    let reads = partitions.iter().filter(|p| p.leader >= 0).map(|partition| {
        let client = client.clone();
        let address = metadata.address(partition.leader).map(str::to_string);
        let offset = from.iter().find(|(id, _)| *id == partition.id).map_or(0, |(_, offset)| *offset);
        let (topic, id, decoding) = (topic.to_string(), partition.id, decoding.clone());
        async move { read_partition(&client, &address?, &topic, id, offset, per_partition, &decoding).await }
    });
    let mut rows: Vec<MessageRow> = futures::future::try_join_all(reads).await?.into_iter().flatten().collect();
    rows.sort_by_key(|row| (row.timestamp, row.partition, row.offset));
    rows.truncate(max);
    Ok(rows)
}

/// The first offset to read in each partition.
pub async fn starting_offsets(
    client: &Arc<ClusterClient>,
    metadata: &ClusterMetadata,
    topic: &str,
    partitions: &[PartitionRow],
    start: Start,
    per_partition: i64,
) -> anyhow::Result<Vec<(i32, i64)>> {
    let timestamp = match start {
        Start::Offset(offset) => return Ok(partitions.iter().map(|p| (p.id, offset.max(p.start))).collect()),
        Start::Timestamp(at) => at,
        Start::End => LATEST,
    };
    let found = offsets(client, metadata, timestamp).await?;
    Ok(partitions
        .iter()
        .map(|p| {
            let at = found.get(&(topic.to_string(), p.id)).copied();
            let offset = match start {
                Start::End => at.map_or(p.start, |end| (end - per_partition).max(p.start)),
                // No message at or after the time: start at the end (nothing to show).
                _ => at.unwrap_or(p.end),
            };
            (p.id, offset)
        })
        .collect())
}

/// Up to `max` messages of one partition from `offset`, from its leader at `address`.
async fn read_partition(
    client: &Arc<ClusterClient>,
    address: &str,
    topic: &str,
    partition: i32,
    mut offset: i64,
    max: usize,
    decoding: &Decoding,
) -> anyhow::Result<Vec<MessageRow>> {
    let mut rows = Vec::new();
    for _ in 0..FETCHES_PER_PARTITION_MAX {
        let answer = client.send(address, versions::FETCH, fetch_request(topic, partition, offset)).await?;
        let Some(data) =
            answer.responses.into_iter().flat_map(|t| t.partitions).find(|p| p.partition_index == partition)
        else {
            break;
        };
        if data.error_code != 0 {
            anyhow::bail!("partition {partition}: {}", crate::topics::error_name(data.error_code));
        }
        let mut records = data.records.unwrap_or_default();
        if records.is_empty() {
            break;
        }
        let sets = RecordBatchDecoder::decode_all(&mut records)?;
        let before = offset;
        for record in sets.into_iter().flat_map(|set| set.records) {
            offset = offset.max(record.offset + 1);
            if record.control || record.offset < before || rows.len() >= max {
                continue;
            }
            rows.push(MessageRow::of(partition, &record, decoding.decoder.as_deref(), decoding.raw));
        }
        if rows.len() >= max || offset >= data.high_watermark || offset == before {
            break;
        }
    }
    Ok(rows)
}

pub fn fetch_request(topic: &str, partition: i32, offset: i64) -> FetchRequest {
    let mut wanted = FetchPartition::default();
    wanted.partition = partition;
    wanted.fetch_offset = offset;
    wanted.current_leader_epoch = -1;
    wanted.last_fetched_epoch = -1;
    wanted.log_start_offset = -1;
    wanted.partition_max_bytes = FETCH_PARTITION_BYTES;
    let mut fetched = FetchTopic::default();
    fetched.topic = TopicName(StrBytes::from_string(topic.to_string()));
    fetched.partitions = vec![wanted];
    let mut request = FetchRequest::default();
    request.replica_id = BrokerId(-1);
    request.max_wait_ms = 0;
    request.min_bytes = 0;
    request.max_bytes = FETCH_PARTITION_BYTES;
    request.session_epoch = -1;
    request.topics = vec![fetched];
    request
}
