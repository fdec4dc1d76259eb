//! `sluice produce`: records from standard input to a topic, through `sluice-client` (each
//! partition's leader, in batches), so that a refused batch is told in the broker's words.
//! The input is lines, kcat/rpk templates or JSON lines (`record_format`); flags give what
//! the input does not: a key for every record, headers, a partition.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use bytes::{Bytes, BytesMut};
use indexmap::IndexMap;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, MetadataRequest, ProduceRequest, RequestKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions};
use sluice_client::check;

use crate::kafka_connection::{Cluster, ConnectionArgs};
use crate::output::count;
use crate::record_format::{InputRecord, RecordFormat, RecordReader};

/// How long the broker may take to store a produced batch.
const BROKER_TIMEOUT_MS: i32 = 30_000;
/// Records of `produce` are sent once this many bytes of them are buffered (a longer
/// input is sent as it is read: a pipe of any length is produced in bounded memory).
const PRODUCE_BUFFER_BYTES: usize = 512 * 1024;
/// How long `produce` waits for a topic it created to have leaders.
const PRODUCE_LEADERS_WAIT: Duration = Duration::from_secs(10);
/// Produce v9: each partition's answer carries the broker's `error_message`.
const PRODUCE_VERSION: i16 = 9;
const METADATA_VERSION: i16 = 12;
/// Metadata error code of a partition whose leader is being elected.
const LEADER_NOT_AVAILABLE: i16 = 5;
/// Metadata error code of a topic the cluster does not have.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

#[derive(Debug, clap::Args)]
pub struct ProduceArgs {
    topic: String,
    /// Split each input line into key and value at the first occurrence of this string
    /// (kcat's -K: -K: or -K '\t').
    #[arg(long, short = 'K', value_name = "SEPARATOR")]
    key_separator: Option<String>,
    /// The key of every record (a key read from the input comes first).
    #[arg(long, short = 'k')]
    key: Option<String>,
    /// A header of every record, repeatable: -H trace-id:abc (name, colon, value).
    #[arg(long = "header", short = 'H', value_name = "NAME:VALUE")]
    headers: Vec<String>,
    /// Send every record to this partition (else by key as Kafka's clients do, keyless
    /// records round robin).
    #[arg(long, short = 'p')]
    partition: Option<i32>,
    /// acks: 0, 1 or all.
    #[arg(long, default_value = "all")]
    acks: String,
    /// none, gzip, snappy, lz4 or zstd.
    #[arg(long, default_value = "none")]
    compression: String,
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// `-H NAME:VALUE` pairs; the value may hold colons.
fn headers_of(given: &[String]) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    given
        .iter()
        .map(|header| match header.split_once(':') {
            Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.as_bytes().to_vec())),
            _ => bail!("--header {header:?} is not NAME:VALUE"),
        })
        .collect()
}

/// `\t` in a `-K` separator is a tab, as kcat reads it.
fn unescape(separator: &str) -> String {
    separator.replace("\\t", "\t").replace("\\n", "\n")
}

/// Kafka's default partitioner for keyed records: murmur2 of the key, made positive.
fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len() as u32;
    let mut h: u32 = SEED ^ length;
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for chunk in chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    match tail.len() {
        3 => {
            h ^= u32::from(tail[2]) << 16;
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        2 => {
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        1 => {
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    (h & 0x7fff_ffff) as i32
}

/// Where `produce` sends its records: each partition's leader.
struct ProduceTarget {
    topic: String,
    /// Leader node of each partition, by partition index (in index order).
    leaders: Vec<(i32, i32)>,
    addresses: BTreeMap<i32, String>,
    acks: i16,
    compression: Compression,
}

/// The topic's partitions and leaders; the topic is created if the broker creates topics
/// on first use (producing is a write: as with any producer).
fn produce_target(
    cluster: &mut Cluster,
    topic: &str,
    acks: i16,
    compression: Compression,
) -> anyhow::Result<ProduceTarget> {
    let deadline = Instant::now() + PRODUCE_LEADERS_WAIT;
    loop {
        let mut request = MetadataRequest::default();
        request.allow_auto_topic_creation = true;
        request.topics = Some(vec![kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
            .with_name(Some(topic_name(topic)))]);
        let metadata = cluster.bootstrap.send(METADATA_VERSION, request)?;
        let found = metadata.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == topic));
        let ready = found.filter(|t| {
            t.error_code == 0 && !t.partitions.is_empty() && t.partitions.iter().all(|p| p.leader_id.0 >= 0)
        });
        if let Some(found) = ready {
            let mut leaders: Vec<(i32, i32)> =
                found.partitions.iter().map(|p| (p.partition_index, p.leader_id.0)).collect();
            leaders.sort_unstable();
            return Ok(ProduceTarget {
                topic: topic.to_string(),
                leaders,
                addresses: Cluster::addresses(&metadata),
                acks,
                compression,
            });
        }
        let code = found.map_or(UNKNOWN_TOPIC_OR_PARTITION, |t| t.error_code);
        if code == UNKNOWN_TOPIC_OR_PARTITION {
            bail!("topic {topic} does not exist (and the broker does not create topics on first use)");
        }
        if code != LEADER_NOT_AVAILABLE {
            check(code, None, &format!("topic {topic}"))?;
        }
        if Instant::now() >= deadline {
            bail!("topic {topic} has partitions without a leader");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl ProduceTarget {
    /// Sends the buffered records of each partition, one request per leader, and says what
    /// the broker said of any it refused.
    fn send(
        &self,
        cluster: &Cluster,
        leaders: &mut BTreeMap<i32, sluice_client::KafkaConnection>,
        buffered: &mut BTreeMap<i32, Vec<Record>>,
    ) -> anyhow::Result<()> {
        let mut by_leader: BTreeMap<i32, Vec<PartitionProduceData>> = BTreeMap::new();
        for (partition, records) in std::mem::take(buffered) {
            if records.is_empty() {
                continue;
            }
            let leader = self.leaders.iter().find(|(p, _)| *p == partition).map_or(-1, |(_, l)| *l);
            by_leader
                .entry(leader)
                .or_default()
                .push(PartitionProduceData::default().with_index(partition).with_records(Some(self.batch(records)?)));
        }
        for (leader, partitions) in by_leader {
            let connection = match leaders.entry(leader) {
                std::collections::btree_map::Entry::Occupied(open) => open.into_mut(),
                std::collections::btree_map::Entry::Vacant(entry) => {
                    let address =
                        self.addresses.get(&leader).context("a partition's leader is not among the brokers")?;
                    entry.insert(cluster.connect(address)?)
                }
            };
            let mut request = ProduceRequest::default();
            request.acks = self.acks;
            request.timeout_ms = BROKER_TIMEOUT_MS;
            request.topic_data =
                vec![TopicProduceData::default().with_name(topic_name(&self.topic)).with_partition_data(partitions)];
            if self.acks == 0 {
                connection.send_only(ApiKey::Produce, PRODUCE_VERSION, RequestKind::Produce(request))?;
                continue;
            }
            let response = connection.send(PRODUCE_VERSION, request)?;
            for topic in &response.responses {
                for partition in &topic.partition_responses {
                    let what = format!("producing to {}-{}", self.topic, partition.index);
                    let record_error =
                        partition.record_errors.iter().find_map(|e| e.batch_index_error_message.as_deref());
                    check(partition.error_code, partition.error_message.as_deref().or(record_error), &what)?;
                }
            }
        }
        Ok(())
    }

    /// `records` as one batch: offsets as rising deltas, and offset minus sequence constant
    /// so that the encoder keeps them in one batch (no producer id: base sequence -1).
    fn batch(&self, mut records: Vec<Record>) -> anyhow::Result<Bytes> {
        for (index, record) in records.iter_mut().enumerate() {
            record.offset = index as i64;
            record.sequence = index as i32 - 1;
        }
        let mut buffer = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: self.compression };
        RecordBatchEncoder::encode(&mut buffer, &records, &options).context("encoding records")?;
        Ok(buffer.freeze())
    }
}

fn acks_of(acks: &str) -> anyhow::Result<i16> {
    match acks {
        "all" | "-1" => Ok(-1),
        "1" => Ok(1),
        "0" => Ok(0),
        other => bail!("--acks {other}: must be 0, 1 or all"),
    }
}

fn compression_of(name: &str) -> anyhow::Result<Compression> {
    match name {
        "none" => Ok(Compression::None),
        "gzip" => Ok(Compression::Gzip),
        "snappy" => Ok(Compression::Snappy),
        "lz4" => Ok(Compression::Lz4),
        "zstd" => Ok(Compression::Zstd),
        other => bail!("--compression {other}: must be none, gzip, snappy, lz4 or zstd"),
    }
}

pub fn produce(connection: &ConnectionArgs, format: &str, args: ProduceArgs) -> anyhow::Result<()> {
    let (acks, compression) = (acks_of(&args.acks)?, compression_of(&args.compression)?);
    let flag_headers = headers_of(&args.headers)?;
    let key_separator = args.key_separator.as_deref().map(unescape);
    let stdin = std::io::stdin().lock();
    let mut reader = RecordReader::new(stdin, RecordFormat::parse(format)?, key_separator.as_deref())?;
    // Before reading stdin: a cluster that cannot be reached is said at once.
    let mut cluster = connection.cluster()?;
    let target = produce_target(&mut cluster, &args.topic, acks, compression)?;
    let partitions = target.leaders.len().max(1);
    let mut buffered: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
    // One connection per leader, opened at its first batch.
    let mut leaders = BTreeMap::new();
    let (mut buffered_bytes, mut count_produced, mut next_partition) = (0usize, 0u64, 0usize);
    while let Some(input) = reader.next_record()? {
        let InputRecord { key, value, headers, partition, timestamp } = input;
        let key = key.or_else(|| args.key.as_ref().map(|k| k.as_bytes().to_vec())).map(Bytes::from);
        let partition = match partition.or(args.partition) {
            Some(partition) => {
                if !target.leaders.iter().any(|(p, _)| *p == partition) {
                    bail!("topic {} has no partition {partition} ({})", args.topic, count(partitions, "partition"));
                }
                partition
            }
            None => {
                let slot = match &key {
                    Some(key) => murmur2(key) as usize % partitions,
                    None => {
                        next_partition = (next_partition + 1) % partitions;
                        next_partition
                    }
                };
                target.leaders.get(slot).map_or(0, |(p, _)| *p)
            }
        };
        let mut record_headers = IndexMap::new();
        for (name, value) in flag_headers.iter().map(|(n, v)| (n.clone(), Some(v.clone()))).chain(headers) {
            buffered_bytes += name.len() + value.as_ref().map_or(0, Vec::len);
            record_headers.insert(StrBytes::from_string(name), value.map(Bytes::from));
        }
        buffered_bytes += value.as_ref().map_or(0, Vec::len) + key.as_ref().map_or(0, Bytes::len);
        buffered.entry(partition).or_default().push(sluice_protocol::new_record(
            key,
            value.map(Bytes::from),
            record_headers,
            timestamp.unwrap_or_else(now_millis),
        ));
        count_produced += 1;
        if buffered_bytes >= PRODUCE_BUFFER_BYTES {
            target.send(&cluster, &mut leaders, &mut buffered)?;
            buffered_bytes = 0;
        }
    }
    target.send(&cluster, &mut leaders, &mut buffered)?;
    eprintln!("produced {} to {}", count(count_produced as usize, "record"), args.topic);
    Ok(())
}

fn now_millis() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own test vectors (`Utils.murmur2`), made positive as its partitioner does.
    #[test]
    fn keyed_records_go_where_kafka_clients_send_them() {
        let vectors: [(&str, i32); 5] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
        ];
        for (key, kafka) in vectors {
            assert_eq!(murmur2(key.as_bytes()), kafka & 0x7fff_ffff, "{key}");
        }
    }
}
