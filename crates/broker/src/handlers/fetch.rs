//! Fetch: read whole batches up to the high watermark, honouring the request's byte limits,
//! and long-poll (`max_wait_ms` / `min_bytes`) by waiting on the partitions' high-watermark
//! channels, so a fetch is answered as soon as a produce becomes visible.
//!
//! A fetch with a replica id is a follower replicating: it reads up to the log end, not
//! the high watermark, waits on the log's progress, and its fetch offset tells the leader
//! how far the follower got (see `crate::replication`).
//!
//! Reads never wait for the disk on an async runtime thread: a fetch first reads from the
//! page cache only (`ReadMode::CachedOnly`); if anything it needs is not cached (a consumer
//! catching up on a cold backlog), the whole read is redone on the blocking pool, at most
//! `FETCH_DISK_READS_MAX` at once and `sluice_config::fetch_disk_read_bytes` each (4-16 MiB), so
//! producers' requests on the runtime threads never queue behind a disk read, and cold reads
//! hold little memory. With direct I/O (`log_segment_direct_io`, the default) a cold read goes
//! from the disk to its buffer without entering the page cache (`sluice_storage`'s
//! `segment.rs::read_direct`); through the page cache, what a cold read brought in is
//! dropped from it, and so is whatever a blocking read finds far behind the log end (see
//! `BACKLOG_DISTANCE_BYTES` in `sluice_storage`'s reader).
//!
//! Fetch sessions (KIP-227, `crate::fetch_session`): a fetch reads the partitions its
//! session holds, and an incremental one answers only those with news.
//!
//! Zero copy: on a plaintext listener, a consumer's read of at least
//! `FILE_RANGE_BYTES_MIN` that is all in the page cache is not read into memory. The
//! response carries a placeholder of its length (`sluice_protocol::records_placeholder`) and
//! the connection sends the segment file's bytes with `sendfile`, as Kafka does. TLS needs
//! the bytes in memory to encrypt them, and a follower's reads may pass the high watermark
//! (where a log can be truncated), so those are copied. Records in memory (the segments'
//! tails) are never copied: a read that spans several tail chunks is sent as those chunks,
//! one after the other, behind a placeholder too (`splice`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ProducerId, TopicName};
use kafka_protocol::ResponseError;
use sluice_protocol::{records_placeholder, FileChunk, Spliced};
use sluice_security::acl;
use sluice_storage::{Partition, ReadError, ReadLimit, ReadMode};
use tokio::time::Instant;
use uuid::Uuid;

use crate::fetch_session::FetchItem;
use crate::Broker;
use sluice_config::FETCH_WAIT_MS_MAX;
use sluice_tiered::RemoteReadError;

/// First Fetch version that names topics by id.
const TOPIC_ID_VERSION: i16 = 13;
/// Last Fetch version with `replica_id` in the body (later ones use `replica_state`).
const LAST_REPLICA_ID_VERSION: i16 = 14;

struct Target {
    partition: i32,
    fetch_offset: i64,
    partition_max_bytes: usize,
    log: ServingLog,
    /// A follower's log diverges: (epoch, end offset) it must truncate to.
    diverging: Option<(i32, i64)>,
}

pub(super) async fn handle(
    broker: &Arc<Broker>,
    request: FetchRequest,
    version: i16,
    client: &super::ClientSession,
) -> (FetchResponse, Vec<Spliced>) {
    let deadline = Instant::now() + Duration::from_millis(request.max_wait_ms.clamp(0, FETCH_WAIT_MS_MAX) as u64);
    let min_bytes = request.min_bytes.max(0) as usize;
    let max_bytes = if request.max_bytes <= 0 { i32::MAX as usize } else { request.max_bytes as usize };
    let replica_id =
        if version <= LAST_REPLICA_ID_VERSION { request.replica_id.0 } else { request.replica_state.replica_id.0 };
    let follower = (replica_id >= 0).then_some(replica_id);
    // A follower copies up to the log end; a read_committed consumer stops at the last
    // stable offset (KIP-98), others at the high watermark.
    let limit = match (follower, request.isolation_level) {
        (Some(_), _) => ReadLimit::LogEnd,
        (None, READ_COMMITTED) => ReadLimit::LastStable,
        (None, _) => ReadLimit::HighWatermark,
    };
    if let Some(error) = follower.and_then(|replica_id| refuse_follower(broker, &request, replica_id, client)) {
        return (refused(error), Vec::new());
    }
    let (session, items) = match broker.fetch_sessions.begin(request) {
        Ok(begun) => begun,
        Err(error) => return (refused(error), Vec::new()),
    };
    // Whether this fetch may send records as file ranges (see the module's doc).
    let zero_copy = limit != ReadLimit::LogEnd && !broker.listeners()[client.listener].protocol.uses_tls();
    let mut targets = resolve_targets(broker, &items, version, follower, client);
    let signals = topic_signals(&targets);
    loop {
        // Subscribe before reading so a produce landing in between still wakes us. A
        // follower waits for the log end to move, a consumer for the high watermark.
        let mut notified: Vec<_> = signals.iter().map(|s| Box::pin(s.notified())).collect();
        for notified in &mut notified {
            notified.as_mut().enable();
        }
        let mut receivers: Vec<_> =
            targets
                .iter()
                .filter_map(|t| t.log.as_ref().ok())
                .filter(|log| log.signal().is_none())
                .map(|log| {
                    if follower.is_some() {
                        Wakeup::Progress(log.progress())
                    } else {
                        Wakeup::Visible(log.subscribe())
                    }
                })
                .collect();
        // A wake-up (or a fetch arriving) with nothing new for any of its partitions waits
        // again without building an answer: a round wakes every fetch of its topics, most of
        // them for partitions it did not touch.
        let nothing_to_wait_for = receivers.is_empty() && notified.is_empty();
        if min_bytes > 0 && !nothing_to_wait_for && nothing_new(&targets, limit) && Instant::now() < deadline {
            wait_for_news(&mut receivers, &mut notified, deadline).await;
            continue;
        }
        let mut pass;
        (targets, pass) = read_pass(broker, targets, max_bytes, limit, zero_copy).await;
        if !pass.remote.is_empty() {
            read_remote(broker, &items, &targets, &mut pass, max_bytes, limit, version).await;
        }
        let remote_read = !pass.remote.is_empty();
        if pass.bytes >= min_bytes || pass.has_error || remote_read || nothing_to_wait_for || Instant::now() >= deadline
        {
            let answered = broker.fetch_sessions.finish(session, items, pass.partitions);
            let mut response = build_response(answered, version);
            count_fetched_bytes(broker, &response, version);
            response.session_id = session.id();
            return (response, pass.spliced);
        }
        wait_for_news(&mut receivers, &mut notified, deadline).await;
    }
}

/// A fetch answered with `error` alone.
fn refused(error: ResponseError) -> FetchResponse {
    let mut response = FetchResponse::default();
    response.error_code = error.code();
    response
}

/// Why a follower's fetch is refused: it belongs to another cluster, or its principal may
/// not replicate.
fn refuse_follower(
    broker: &Broker,
    request: &FetchRequest,
    replica_id: i32,
    client: &super::ClientSession,
) -> Option<ResponseError> {
    if request.cluster_id.as_ref().is_some_and(|id| id.as_str() != broker.topics.cluster_id()) {
        tracing::warn!(replica_id, theirs = ?request.cluster_id, "refusing a replica fetch from another cluster");
        return Some(ResponseError::InconsistentClusterId);
    }
    (!broker.may_replicate(client)).then_some(ResponseError::ClusterAuthorizationFailed)
}

/// Each fetched partition with the log that serves it here, or why none does (an unknown
/// topic, one the client may not read, a partition not led here).
fn resolve_targets(
    broker: &Arc<Broker>,
    items: &[FetchItem],
    version: i16,
    follower: Option<i32>,
    client: &super::ClientSession,
) -> Vec<Target> {
    let now_ms = sluice_storage::now_ms();
    let unknown_error = if version >= TOPIC_ID_VERSION {
        ResponseError::UnknownTopicId
    } else {
        ResponseError::UnknownTopicOrPartition
    };
    let mut targets = Vec::with_capacity(items.len());
    // (first item of the topic, its name, whether the client may read it)
    let mut resolved: Option<(&FetchItem, Option<String>, bool)> = None;
    for item in items {
        // Consecutive partitions of one topic resolve its name once.
        let same_topic = resolved.as_ref().is_some_and(|(last, _, _)| last.same_topic(item));
        if !same_topic {
            let name = if version >= TOPIC_ID_VERSION {
                broker.topics.name_for_id(&item.topic_id)
            } else {
                Some(item.topic.to_string())
            };
            let readable = follower.is_some()
                || name
                    .as_deref()
                    .is_some_and(|name| broker.authorized(client, acl::OP_READ, acl::RESOURCE_TOPIC, name));
            resolved = Some((item, name, readable));
        }
        let (name, readable) = match &resolved {
            Some((_, name, readable)) => (name.as_deref(), *readable),
            None => (None, false),
        };
        let partition = &item.partition;
        let (log, diverging) = match name {
            None => (Err(unknown_error), None),
            Some(_) if !readable => (Err(ResponseError::TopicAuthorizationFailed), None),
            Some(name) => serving_log(broker, name, partition, follower, now_ms, unknown_error),
        };
        targets.push(Target {
            partition: partition.partition,
            fetch_offset: partition.fetch_offset,
            partition_max_bytes: partition.partition_max_bytes.max(0) as usize,
            log,
            diverging,
        });
    }
    targets
}

/// The topics' signals a fetch waits on (a handful, however many partitions); the
/// partitions without one are waited on one by one.
fn topic_signals(targets: &[Target]) -> Vec<Arc<tokio::sync::Notify>> {
    let mut signals: Vec<Arc<tokio::sync::Notify>> = Vec::new();
    for log in targets.iter().filter_map(|t| t.log.as_ref().ok()) {
        if let Some(signal) = log.signal() {
            if !signals.iter().any(|s| Arc::ptr_eq(s, signal)) {
                signals.push(signal.clone());
            }
        }
    }
    signals
}

/// Reads every target once: from the page cache and the tails' memory on this thread, or,
/// when some bytes are on the disk only, on the blocking pool (at most
/// `fetch_disk_reads` at once, each taking less).
async fn read_pass(
    broker: &Broker,
    targets: Vec<Target>,
    max_bytes: usize,
    limit: ReadLimit,
    zero_copy: bool,
) -> (Vec<Target>, ReadPass) {
    if let Some(pass) = read_all(&targets, max_bytes, limit, ReadMode::CachedOnly, zero_copy) {
        return (targets, pass);
    }
    tracing::debug!("fetch data not in the page cache: reading on the blocking pool");
    broker.metrics.fetch_disk_reads.inc();
    let _permit = broker.fetch_disk_reads.acquire().await.expect("never closed");
    let (targets, read) = tokio::task::spawn_blocking(move || {
        let cold_max_bytes = max_bytes.min(sluice_config::fetch_disk_read_bytes());
        let read = read_all(&targets, cold_max_bytes, limit, ReadMode::MayBlock, false);
        (targets, read)
    })
    .await
    .expect("fetch read panicked");
    (targets, read.expect("a blocking read never would block"))
}

/// Waits until one of the fetch's channels or topic signals fires, or the deadline.
async fn wait_for_news<'a>(
    receivers: &mut [Wakeup],
    notified: &mut [std::pin::Pin<Box<tokio::sync::futures::Notified<'a>>>],
    deadline: Instant,
) {
    let any_changed =
        futures::future::select_all(receivers.iter_mut().map(|r| r.changed()).chain(notified.iter_mut().map(|n| {
            let wait: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> = Box::pin(n.as_mut());
            wait
        })));
    tokio::select! {
        _ = any_changed => {}
        () = tokio::time::sleep_until(deadline) => {}
    }
}

/// True when every partition of a consumer's fetch is online and caught up: a read would
/// return nothing and no error, so a fetch waiting for `min_bytes` keeps waiting.
fn nothing_new(targets: &[Target], read_limit: ReadLimit) -> bool {
    targets.iter().all(|target| {
        target.diverging.is_none()
            && target.log.as_ref().is_ok_and(|log| caught_up(log, target.fetch_offset, read_limit))
    })
}

/// Reads the partitions of `pass` whose fetch offset is in the remote tier (`sluice-tiered`), all
/// at once, within what the fetch may still return; a read not done within
/// `tiered_storage.fetch_max_wait_ms` is answered empty (the client fetches again, and the
/// chunk it waited for is then cached), a failed one with a retriable error.
async fn read_remote(
    broker: &Arc<Broker>,
    items: &[FetchItem],
    targets: &[Target],
    pass: &mut ReadPass,
    max_bytes: usize,
    limit: ReadLimit,
    version: i16,
) {
    let Some(tiered) = &broker.tiered else {
        for &index in &pass.remote {
            pass.partitions[index].error_code = ResponseError::OffsetOutOfRange.code();
        }
        return;
    };
    let mut budget = max_bytes.saturating_sub(pass.bytes);
    let mut reads = Vec::with_capacity(pass.remote.len());
    for &index in &pass.remote {
        let (item, target) = (&items[index], &targets[index]);
        let name = if version >= TOPIC_ID_VERSION {
            broker.topics.name_for_id(&item.topic_id)
        } else {
            Some(item.topic.to_string())
        };
        let topic = name.and_then(|name| broker.topics.get(&name));
        let partition_max = target.partition_max_bytes.min(budget);
        let min_one_batch = pass.bytes == 0 && reads.is_empty();
        budget -= partition_max;
        let (partition, fetch_offset) = (target.partition, target.fetch_offset);
        reads.push(async move {
            let Some(topic) = topic else { return Err(RemoteReadError::NotRemote) };
            tiered.read(&topic, partition, fetch_offset, partition_max, min_one_batch).await
        });
    }
    let wait = Duration::from_millis(broker.config().tiered_storage.fetch_max_wait_ms);
    let results = tokio::time::timeout(wait, futures::future::join_all(reads)).await;
    for (position, &index) in pass.remote.iter().enumerate() {
        let data = &mut pass.partitions[index];
        match results.as_ref().map(|results| &results[position]) {
            Err(_elapsed) => data.records = Some(Bytes::new()),
            Ok(Ok(read)) => {
                let from = targets[index].fetch_offset;
                if limit == ReadLimit::LastStable {
                    let aborted = read.aborted.iter().filter(|a| a.last_offset >= from).map(aborted_on_the_wire);
                    data.aborted_transactions = Some(aborted.collect());
                }
                pass.bytes += read.records.len();
                data.records = Some(read.records.clone());
            }
            Ok(Err(RemoteReadError::NotRemote)) => {
                data.error_code = ResponseError::OffsetOutOfRange.code();
                pass.has_error = true;
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, partition = targets[index].partition, "remote fetch read failed");
                data.error_code = ResponseError::KafkaStorageError.code();
                pass.has_error = true;
            }
        }
    }
}

/// A channel whose change should end a fetch's long-poll.
enum Wakeup {
    Visible(tokio::sync::watch::Receiver<sluice_storage::Visible>),
    Progress(tokio::sync::watch::Receiver<sluice_storage::Progress>),
}

impl Wakeup {
    fn changed(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        match self {
            Wakeup::Visible(rx) => Box::pin(async move {
                let _ = rx.changed().await;
            }),
            Wakeup::Progress(rx) => Box::pin(async move {
                let _ = rx.changed().await;
            }),
        }
    }
}

type ServingLog = Result<Arc<Partition>, ResponseError>;

/// The log a fetch reads from, if this node may serve it: on a single node any hosted
/// partition; in a cluster the leader's, for consumers and followers alike. A follower's
/// fetch is recorded (it moves the high watermark) and checked for divergence here.
fn serving_log(
    broker: &Arc<Broker>,
    name: &str,
    partition: &kafka_protocol::messages::fetch_request::FetchPartition,
    follower: Option<i32>,
    now_ms: i64,
    unknown_error: ResponseError,
) -> (ServingLog, Option<(i32, i64)>) {
    let Some(replicas) = &broker.replicas else {
        return (broker.partition(name, partition.partition).ok_or(unknown_error), None);
    };
    let replica = match broker.hosted_replica(name, partition.partition, unknown_error) {
        Ok(replica) => replica,
        Err(error) => return (Err(error), None),
    };
    let served = match follower {
        None => replica.check_leader(partition.current_leader_epoch).map(|_| None),
        Some(id) => replica.follower_fetched(
            id,
            partition.current_leader_epoch,
            partition.fetch_offset,
            partition.last_fetched_epoch,
            now_ms,
            replicas.isr_changes(),
        ),
    };
    match served {
        Ok(diverging) => (Ok(replica.log.clone()), diverging),
        Err(not_served) => (Err(not_served.error()), None),
    }
}

/// Fetch's `isolation_level` for read_committed.
const READ_COMMITTED: i8 = 1;

/// The aborted transactions a read_committed client needs for `[from, to)`: it drops
/// their records (those of the producer from the first offset up to the abort marker).
fn aborted_transactions(log: &Partition, from: i64, to: i64) -> Vec<AbortedTransaction> {
    log.aborted_transactions(from, to).iter().map(aborted_on_the_wire).collect()
}

fn aborted_on_the_wire(aborted: &sluice_storage::AbortedTransaction) -> AbortedTransaction {
    let mut entry = AbortedTransaction::default();
    entry.producer_id = ProducerId(aborted.producer_id);
    entry.first_offset = aborted.first_offset;
    entry
}

/// What one pass over a fetch's partitions read.
struct ReadPass {
    /// Data per partition, in the order the fetch reads them.
    partitions: Vec<PartitionData>,
    bytes: usize,
    has_error: bool,
    /// Partitions (by index) whose fetch offset is in the remote tier: read by [`read_remote`].
    remote: Vec<usize>,
    /// What the records' placeholders stand for: file ranges (`zero_copy` reads) and reads
    /// that span several tail chunks.
    spliced: Vec<Spliced>,
}

/// One pass over all partitions; `None` when a [`ReadMode::CachedOnly`] pass found data that
/// is not in the page cache.
/// True when a consumer's fetch offset is where its reads stop (the high watermark; the
/// last stable offset is never past it), on a log that is online: the common case of a
/// fetch over many partitions, most of them without news.
fn caught_up(log: &Partition, fetch_offset: i64, read_limit: ReadLimit) -> bool {
    let (offsets, failed) = log.published_offsets();
    read_limit != ReadLimit::LogEnd && !failed && fetch_offset == offsets.high_watermark
}

fn read_all(
    targets: &[Target],
    max_bytes: usize,
    read_limit: ReadLimit,
    mode: ReadMode,
    zero_copy: bool,
) -> Option<ReadPass> {
    let mut used = 0usize;
    let mut spliced = Vec::new();
    let mut has_error = false;
    let mut partitions = Vec::with_capacity(targets.len());
    let mut remote = Vec::new();
    for target in targets {
        let mut data = PartitionData::default();
        data.partition_index = target.partition;
        data.high_watermark = -1;
        data.last_stable_offset = -1;
        data.log_start_offset = -1;
        match &target.log {
            Err(error) => data.error_code = error.code(),
            Ok(_) if target.diverging.is_some() => {
                let (epoch, end_offset) = target.diverging.expect("checked");
                data.diverging_epoch.epoch = epoch;
                data.diverging_epoch.end_offset = end_offset;
                has_error = true;
            }
            Ok(log) if caught_up(log, target.fetch_offset, read_limit) => {
                // Nothing new: answered from the published offsets, without the log's lock.
                let (offsets, _) = log.published_offsets();
                data.high_watermark = offsets.high_watermark;
                data.last_stable_offset = offsets.last_stable_offset;
                data.log_start_offset = offsets.log_start_offset;
                data.aborted_transactions = Some(Vec::new());
                data.records = Some(Bytes::new());
            }
            Ok(log) => {
                let offsets = log.offsets();
                data.high_watermark = offsets.high_watermark;
                data.last_stable_offset = offsets.last_stable_offset;
                // A follower copies the local log only (the remote tier is shared).
                data.log_start_offset = if read_limit == ReadLimit::LogEnd {
                    offsets.local_log_start_offset
                } else {
                    offsets.log_start_offset
                };
                data.aborted_transactions = Some(if read_limit == ReadLimit::LastStable {
                    aborted_transactions(log, target.fetch_offset, offsets.last_stable_offset)
                } else {
                    Vec::new()
                });
                let limit = target.partition_max_bytes.min(max_bytes.saturating_sub(used));
                let in_file = (zero_copy && limit > 0)
                    .then(|| log.read_range_cached(target.fetch_offset, limit, used == 0, read_limit))
                    .flatten()
                    .and_then(|range| Some((records_placeholder(spliced.len(), range.length)?, range)));
                let read = if let Some((placeholder, range)) = in_file {
                    let file = FileChunk { file: range.file, position: range.position, length: range.length };
                    spliced.push(Spliced::File(file));
                    Ok(placeholder)
                } else if limit == 0 && used > 0 {
                    Ok(Bytes::new())
                } else {
                    // A follower always gets a batch, however large (it must not stall).
                    let follower = read_limit == ReadLimit::LogEnd;
                    let (limit, min_one_batch) = if follower { (limit.max(1), true) } else { (limit, used == 0) };
                    log.read_parts_until(target.fetch_offset, limit, min_one_batch, read_limit, mode)
                        .map(|parts| splice(parts, &mut spliced))
                };
                match read {
                    Ok(records) => {
                        used += records.len();
                        data.records = Some(records);
                    }
                    Err(ReadError::OffsetOutOfRange { .. }) => data.error_code = ResponseError::OffsetOutOfRange.code(),
                    // A follower starts over at the local log start (KIP-405's
                    // OFFSET_MOVED_TO_TIERED_STORAGE, which Sluice's followers take as this).
                    Err(ReadError::InRemoteTier { .. }) if read_limit == ReadLimit::LogEnd => {
                        data.error_code = ResponseError::OffsetOutOfRange.code()
                    }
                    Err(ReadError::InRemoteTier { .. }) => remote.push(partitions.len()),
                    Err(ReadError::WouldBlock) => return None,
                    Err(error) => {
                        tracing::warn!(%error, partition = target.partition, "fetch read failed");
                        data.error_code = ResponseError::KafkaStorageError.code();
                    }
                }
            }
        }
        has_error |= data.error_code != 0;
        partitions.push(data);
    }
    Some(ReadPass { partitions, bytes: used, has_error, remote, spliced })
}

/// A read's pieces as one partition's records: the piece itself when there is one, else a
/// placeholder for them all (sent one after the other, without joining them in a new buffer),
/// or a copy of them joined when a response has no placeholder left.
fn splice(parts: Vec<Bytes>, spliced: &mut Vec<Spliced>) -> Bytes {
    let placeholder =
        (parts.len() > 1).then(|| records_placeholder(spliced.len(), parts.iter().map(Bytes::len).sum())).flatten();
    match placeholder {
        Some(placeholder) => {
            spliced.push(Spliced::Parts(parts));
            placeholder
        }
        None => sluice_storage::joined(parts),
    }
}

/// Adds each topic's record bytes in the answer to its fetch-bytes metric.
fn count_fetched_bytes(broker: &Broker, response: &FetchResponse, version: i16) {
    for topic in &response.responses {
        let bytes: usize = topic.partitions.iter().map(|p| p.records.as_ref().map_or(0, |records| records.len())).sum();
        if bytes == 0 {
            continue;
        }
        if version >= TOPIC_ID_VERSION {
            if let Some(name) = broker.topics.name_for_id(&topic.topic_id) {
                broker.metrics.fetched(&name, bytes as u64);
            }
        } else {
            broker.metrics.fetched(topic.topic.as_str(), bytes as u64);
        }
    }
}

/// The response: partitions grouped by topic, topics in order of first appearance. Items
/// come in runs of one topic (request order), so each topic's partitions are allocated
/// once, at their size, and a map of topics is built only when there is more than one run.
fn build_response(answered: Vec<(FetchItem, PartitionData)>, version: i16) -> FetchResponse {
    let mut runs: Vec<usize> = Vec::with_capacity(1);
    for (position, (item, _)) in answered.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if answered[position - 1].0.same_topic(item) => *run += 1,
            _ => runs.push(1),
        }
    }
    let mut responses: Vec<FetchableTopicResponse> = Vec::with_capacity(runs.len());
    let mut index_of: HashMap<(Uuid, TopicName), usize> = HashMap::new();
    let mut answered = answered.into_iter();
    for &run in &runs {
        let (item, data) = answered.next().expect("every run has a first item");
        let index = match runs.len() {
            1 => None,
            _ => index_of.get(&(item.topic_id, item.topic.clone())).copied(),
        };
        let index = index.unwrap_or_else(|| {
            let mut topic = FetchableTopicResponse::default();
            if version >= TOPIC_ID_VERSION {
                topic.topic_id = item.topic_id;
            } else {
                topic.topic = item.topic.clone();
            }
            topic.partitions = Vec::with_capacity(run);
            responses.push(topic);
            if runs.len() > 1 {
                index_of.insert((item.topic_id, item.topic.clone()), responses.len() - 1);
            }
            responses.len() - 1
        });
        let partitions = &mut responses[index].partitions;
        partitions.reserve(run);
        partitions.push(data);
        partitions.extend(answered.by_ref().take(run - 1).map(|(_, data)| data));
    }
    let mut response = FetchResponse::default();
    response.responses = responses;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_request::FetchPartition;
    use kafka_protocol::protocol::StrBytes;

    fn answered(topic: &str, partition: i32) -> (FetchItem, PartitionData) {
        let mut request = FetchPartition::default();
        request.partition = partition;
        let item = FetchItem {
            topic: TopicName(StrBytes::from_string(topic.to_string())),
            topic_id: Uuid::from_u128(topic.len() as u128),
            partition: request,
        };
        let mut data = PartitionData::default();
        data.partition_index = partition;
        (item, data)
    }

    fn layout(response: &FetchResponse) -> Vec<(String, Uuid, Vec<i32>)> {
        let topics = response.responses.iter();
        topics
            .map(|t| (t.topic.to_string(), t.topic_id, t.partitions.iter().map(|p| p.partition_index).collect()))
            .collect()
    }

    #[test]
    fn a_response_groups_partitions_by_topic_in_order_of_first_appearance() {
        let one_topic = vec![answered("a", 0), answered("a", 1), answered("a", 2)];
        assert_eq!(layout(&build_response(one_topic, 12)), vec![("a".into(), Uuid::nil(), vec![0, 1, 2])]);
        // An incremental session moves partitions that returned records to the end, so a
        // topic's partitions may come in more than one run.
        let interleaved = vec![answered("a", 0), answered("a", 1), answered("bb", 0), answered("a", 3)];
        assert_eq!(
            layout(&build_response(interleaved.clone(), 12)),
            vec![("a".into(), Uuid::nil(), vec![0, 1, 3]), ("bb".into(), Uuid::nil(), vec![0])]
        );
        assert_eq!(
            layout(&build_response(interleaved, TOPIC_ID_VERSION)),
            vec![(String::new(), Uuid::from_u128(1), vec![0, 1, 3]), (String::new(), Uuid::from_u128(2), vec![0])]
        );
        assert!(build_response(Vec::new(), 12).responses.is_empty());
    }
}
