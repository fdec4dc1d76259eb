//! Followers' side of replication: one fetch loop per leader node, carrying every
//! partition this node follows from that leader in one long-polling Fetch (so
//! replication batches per node pair). Each round appends what came back, fsyncs it
//! when the topic's level asks, and waits for that before fetching on. The fetch offset is
//! the follower's promise of durability, so it is the locally durable end, never the log
//! end: a round that gave up waiting for its fsync (or whose fsync failed) re-fetches what
//! is not durable yet instead of reporting it to the leader as held, and a follower whose
//! log went offline stops advancing and leaves the ISR after `replica_lag_time_max_ms`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, RequestKind, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_security::InterBroker;
use sluice_storage::LogManager;

use crate::peer::PeerConnection;
use crate::{Replica, ReplicaManager};

/// Fetch version followers use (replica id in the body, last fetched epoch, diverging epoch).
pub const REPLICA_FETCH_VERSION: i16 = 12;
/// How long a follower's fetch waits at the leader for new data.
pub const REPLICA_FETCH_WAIT_MS: i32 = 500;
pub const REPLICA_FETCH_BYTES_MAX: i32 = 32 * 1024 * 1024;
pub const REPLICA_FETCH_PARTITION_BYTES_MAX: i32 = 4 * 1024 * 1024;
/// Pause after a failed round (connection refused, leader moved) before the next.
pub const REPLICA_FETCH_BACKOFF_MS: u64 = 100;
/// Longest a round waits for its own fsync before fetching on (from its durable end).
pub const REPLICA_SYNC_WAIT_MS: u64 = 30_000;
/// While a leader cannot be fetched from, one warning per this interval says so.
pub const REPLICA_FAILURE_LOG_INTERVAL_MS: u64 = 30_000;

/// What the follower fetch loops need from the node that runs them (the broker).
pub trait ReplicaHost: Send + Sync + 'static {
    /// The partitions this node hosts; `None` (a single node) ends the fetch loops.
    fn replicas(&self) -> Option<Arc<ReplicaManager>>;
    /// The local address connections to leaders are made from (`[cluster] source_address`).
    fn source_address(&self) -> Option<IpAddr>;
    /// How this node authenticates to the leaders' inter-broker listener.
    fn inter_broker(&self) -> &InterBroker;
    /// The cluster id, which a leader checks on every replica fetch.
    fn cluster_id(&self) -> String;
    /// The logs of the hosted partitions, whose syncer fsyncs what followers append.
    fn logs(&self) -> &LogManager;
}

fn str_bytes(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// Failures to fetch from one leader, logged once and then summarised.
#[derive(Default)]
struct FailureLog {
    failures: u64,
    last_warned: Option<std::time::Instant>,
}

impl FailureLog {
    fn failed(&mut self, leader: i32, address: &str, error: &str) {
        self.failures += 1;
        let due =
            self.last_warned.is_none_or(|at| at.elapsed() >= Duration::from_millis(REPLICA_FAILURE_LOG_INTERVAL_MS));
        if due {
            tracing::warn!(leader, %address, failures = self.failures, %error, "cannot fetch from leader");
            self.last_warned = Some(std::time::Instant::now());
        } else {
            tracing::debug!(leader, %address, %error, "cannot fetch from leader");
        }
    }

    fn succeeded(&mut self, leader: i32) {
        if self.failures > 0 {
            tracing::info!(leader, failures = self.failures, "fetching from leader again");
            *self = FailureLog::default();
        }
    }
}

/// Keeps one fetch loop running per leader this node follows something from.
pub fn spawn_supervisor<H: ReplicaHost>(host: &Arc<H>) {
    let weak = Arc::downgrade(host);
    tokio::spawn(async move {
        let mut running: HashMap<i32, tokio::task::JoinHandle<()>> = HashMap::new();
        loop {
            let Some(host) = weak.upgrade() else { return };
            let Some(replicas) = host.replicas() else { return };
            let changed = replicas.followers_changed.notified();
            running.retain(|_, task| !task.is_finished());
            for leader in replicas.followed_by_leader().into_keys() {
                running.entry(leader).or_insert_with(|| tokio::spawn(fetch_loop(weak.clone(), leader)));
            }
            drop(host);
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    });
}

async fn fetch_loop<H: ReplicaHost>(host: Weak<H>, leader: i32) {
    let mut connection: Option<PeerConnection> = None;
    let mut failures = FailureLog::default();
    loop {
        let Some(strong) = host.upgrade() else { return };
        let Some(replicas) = strong.replicas() else { return };
        let Some(partitions) = replicas.followed_by_leader().remove(&leader) else { return };
        let Some(address) = replicas.broker_address(leader) else {
            drop(strong);
            tokio::time::sleep(Duration::from_millis(REPLICA_FETCH_BACKOFF_MS)).await;
            continue;
        };
        if connection.is_none() {
            let source = strong.source_address();
            let client_id = format!("sluice-replica-{}", replicas.node_id());
            match PeerConnection::connect(&address, source, client_id, strong.inter_broker()).await {
                Ok(c) => connection = Some(c),
                Err(error) => {
                    failures.failed(leader, &address, &format!("{error:#}"));
                    drop(strong);
                    tokio::time::sleep(Duration::from_millis(REPLICA_FETCH_BACKOFF_MS)).await;
                    continue;
                }
            }
        }
        let request = fetch_request(replicas.node_id(), &strong.cluster_id(), &partitions);
        let timeout = Duration::from_millis(REPLICA_FETCH_WAIT_MS as u64 + 10_000);
        let call =
            connection.as_mut().expect("connected").call(ApiKey::Fetch, REPLICA_FETCH_VERSION, &request, timeout);
        let response = match call.await {
            Ok(ResponseKind::Fetch(response)) if response.error_code == 0 => response,
            Ok(ResponseKind::Fetch(response)) => {
                let error = kafka_protocol::ResponseError::try_from_code(response.error_code);
                failures.failed(leader, &address, &format!("replica fetch refused: {error:?}"));
                connection = None;
                drop(strong);
                tokio::time::sleep(Duration::from_millis(REPLICA_FETCH_BACKOFF_MS)).await;
                continue;
            }
            Ok(_) => unreachable!("a fetch is answered by a fetch response"),
            Err(error) => {
                failures.failed(leader, &address, &format!("{error:#}"));
                connection = None;
                drop(strong);
                tokio::time::sleep(Duration::from_millis(REPLICA_FETCH_BACKOFF_MS)).await;
                continue;
            }
        };
        failures.succeeded(leader);
        let by_name: HashMap<(&str, i32), &Arc<Replica>> =
            partitions.iter().map(|(r, _)| ((r.topic.as_str(), r.partition), r)).collect();
        let mut awaiting_sync = Vec::new();
        let mut backoff = false;
        for topic in &response.responses {
            for data in &topic.partitions {
                let Some(replica) = by_name.get(&(topic.topic.as_str(), data.partition_index)) else { continue };
                match apply_partition(strong.logs(), replica, data) {
                    Ok(Some(end)) => awaiting_sync.push((replica.log.progress(), end)),
                    Ok(None) => {}
                    Err(()) => backoff = true,
                }
            }
        }
        drop(strong);
        for (mut progress, end) in awaiting_sync {
            let synced = progress.wait_for(|p| p.local_end >= end);
            let _ = tokio::time::timeout(Duration::from_millis(REPLICA_SYNC_WAIT_MS), synced).await;
        }
        if backoff {
            tokio::time::sleep(Duration::from_millis(REPLICA_FETCH_BACKOFF_MS)).await;
        }
    }
}

fn fetch_request(node_id: i32, cluster_id: &str, partitions: &[(Arc<Replica>, i32)]) -> RequestKind {
    let mut topics: Vec<FetchTopic> = Vec::new();
    for (replica, leader_epoch) in partitions {
        let offsets = replica.log.offsets();
        // What this follower holds at the topic's durability (all of it at levels 2 and 4).
        let fetch_offset = offsets.log_end_offset.min(replica.log.progress().borrow().local_end);
        let mut partition = FetchPartition::default();
        partition.partition = replica.partition;
        partition.current_leader_epoch = *leader_epoch;
        partition.fetch_offset = fetch_offset;
        partition.last_fetched_epoch = replica.log.epoch_at(fetch_offset - 1).unwrap_or(-1);
        partition.log_start_offset = offsets.local_log_start_offset;
        partition.partition_max_bytes = REPLICA_FETCH_PARTITION_BYTES_MAX;
        match topics.iter_mut().find(|t| t.topic.as_str() == replica.topic) {
            Some(topic) => topic.partitions.push(partition),
            None => {
                let mut topic = FetchTopic::default();
                topic.topic = TopicName(str_bytes(&replica.topic));
                topic.partitions.push(partition);
                topics.push(topic);
            }
        }
    }
    let mut request = FetchRequest::default();
    request.replica_id = BrokerId(node_id);
    // The leader refuses a follower of another cluster (INCONSISTENT_CLUSTER_ID).
    request.cluster_id = Some(str_bytes(cluster_id));
    request.max_wait_ms = REPLICA_FETCH_WAIT_MS;
    request.min_bytes = 1;
    request.max_bytes = REPLICA_FETCH_BYTES_MAX;
    request.session_id = 0;
    request.session_epoch = -1;
    request.topics = topics;
    RequestKind::Fetch(request)
}

/// Applies one partition of a fetch response. Returns the log end to wait on for an
/// fsync, or `Err` when the round should back off (leader moved, our metadata lags).
fn apply_partition(
    logs: &LogManager,
    replica: &Replica,
    data: &kafka_protocol::messages::fetch_response::PartitionData,
) -> Result<Option<i64>, ()> {
    if data.error_code == ResponseError::OffsetOutOfRange.code() {
        return restart_at_leader_start(replica, data.log_start_offset);
    }
    if data.error_code != 0 {
        let error = ResponseError::try_from_code(data.error_code);
        tracing::debug!(topic = %replica.topic, partition = replica.partition, ?error, "replica fetch error");
        return Err(());
    }
    if data.diverging_epoch.epoch >= 0 || data.diverging_epoch.end_offset >= 0 {
        let (epoch, leader_end) = (data.diverging_epoch.epoch, data.diverging_epoch.end_offset);
        let ours = replica.log.epoch_end_offset(epoch).map_or(0, |(_, end)| end);
        let cut = if epoch < 0 { 0 } else { leader_end.min(ours) };
        tracing::warn!(topic = %replica.topic, partition = replica.partition, epoch, cut, "log diverges from leader; truncating");
        if let Err(error) = replica.log.truncate_to(cut) {
            tracing::error!(%error, "truncation failed");
            return Err(());
        }
        return Ok(None);
    }
    let mut wait_for = None;
    if let Some(records) = &data.records {
        if !records.is_empty() {
            match replica.log.append_replica(records, sluice_storage::now_ms()) {
                Ok(appended) => {
                    if appended.needs_sync {
                        logs.syncer().schedule(&replica.log);
                        wait_for = Some(appended.log_end_offset);
                    }
                }
                Err(error) => {
                    tracing::warn!(topic = %replica.topic, partition = replica.partition, %error, "replica append failed");
                    return Err(());
                }
            }
        }
    }
    if replica.leader_epoch().is_none() {
        let high_watermark = replica.log.advance_high_watermark(data.high_watermark);
        // Follow the leader's log start offset (DeleteRecords, offsets-log compaction), as
        // Kafka's followers do, never past what this follower knows to be committed.
        let leader_start = data.log_start_offset.min(high_watermark);
        if leader_start > replica.log.offsets().local_log_start_offset {
            if let Err(error) = replica.log.delete_records_before(leader_start) {
                tracing::warn!(topic = %replica.topic, partition = replica.partition, %error, "log start not moved");
            }
        }
    }
    Ok(wait_for)
}

/// OFFSET_OUT_OF_RANGE: when our log ends before the leader's log start (a new replica of
/// a partition whose head was deleted), nothing we lack can be fetched any more: drop our
/// log and start at the leader's log start, as Kafka's follower does. Any other case backs
/// off (the leader's log is shorter than ours: divergence handling cuts our tail).
fn restart_at_leader_start(replica: &Replica, leader_log_start: i64) -> Result<Option<i64>, ()> {
    let ours = replica.log.offsets().log_end_offset;
    if leader_log_start <= ours {
        tracing::debug!(topic = %replica.topic, partition = replica.partition, ours, leader_log_start, "offset out of range");
        return Err(());
    }
    // A new replica of a tiered partition (or one whose head was deleted) starts here.
    tracing::info!(
        topic = %replica.topic,
        partition = replica.partition,
        ours,
        leader_log_start,
        "log ends before the leader's log start; restarting there"
    );
    match replica.log.reset_to(leader_log_start) {
        Ok(()) => Ok(None),
        Err(error) => {
            tracing::error!(%error, "log reset failed");
            Err(())
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
    use sluice_storage::{LogConfig, LogManager, TopicPartition};

    use super::*;

    /// One batch of `count` records at `base_offset`, as a leader would send it.
    fn leader_batch(base_offset: i64, count: i64, leader_epoch: i32) -> Bytes {
        let records: Vec<Record> = (0..count)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: leader_epoch,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: base_offset + i,
                sequence: (base_offset + i) as i32,
                timestamp: sluice_storage::now_ms(),
                key: None,
                value: Some(Bytes::from_static(b"v")),
                headers: Default::default(),
            })
            .collect();
        let mut buffer = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut buffer, &records, &options).unwrap();
        buffer.freeze()
    }

    fn fetched_offset_and_epoch(request: &RequestKind) -> (i64, i32) {
        let RequestKind::Fetch(fetch) = request else { panic!("a fetch") };
        let partition = &fetch.topics[0].partitions[0];
        (partition.fetch_offset, partition.last_fetched_epoch)
    }

    /// A follower reports as held only what is durable at the topic's level: appended but
    /// not yet fsynced data (its fsync slow, timed out or failed) is fetched again rather
    /// than counted by the leader toward an acks=all acknowledgement.
    #[test]
    fn the_fetch_offset_is_the_durable_end_not_the_log_end() {
        let dir = tempfile::tempdir().unwrap();
        let logs = LogManager::new(dir.path()).unwrap();
        let log = logs.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
        log.set_replicated(true);
        log.append_replica(&leader_batch(0, 3, 1), 0).unwrap();
        let replica = Arc::new(Replica::new("t".into(), 0, log.clone()));
        let partitions = [(replica, 2)];
        assert_eq!(log.offsets().log_end_offset, 3);
        assert_eq!(fetched_offset_and_epoch(&fetch_request(2, "c", &partitions)), (0, -1), "nothing is fsynced yet");

        logs.syncer().schedule(&log);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while log.progress().borrow().local_end < 3 {
            assert!(std::time::Instant::now() < deadline, "fsync did not finish");
            std::thread::sleep(Duration::from_millis(5));
        }
        // A later epoch's batch, not yet durable: the fetch names the epoch of offset 2.
        log.append_replica(&leader_batch(3, 2, 2), 0).unwrap();
        assert_eq!(fetched_offset_and_epoch(&fetch_request(2, "c", &partitions)), (3, 1));
        logs.close();
    }
}
