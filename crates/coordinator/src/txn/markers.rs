//! Transaction markers: the commit or abort control batch that ends one producer's
//! transaction in a partition, and the end record a group's offsets partition gets for the
//! offsets the transaction sent.
//!
//! The coordinator writes a marker where the partition is led: on this node directly
//! ([`write_local`]: appended at the partition's leader epoch, durable once its high
//! watermark passes it), on another node with WriteTxnMarkers, which that node's handler
//! answers through the same [`write_local`] once durable. A marker is idempotent in
//! effect (a second one for an ended transaction changes nothing a reader sees), so every
//! failure is retried by sending all of them again.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
use kafka_protocol::messages::{ApiKey, ProducerId, RequestKind, ResponseKind, TopicName, WriteTxnMarkersRequest};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use parking_lot::Mutex;

use crate::group::OFFSETS_TOPIC;
use crate::CoordinatorHost;
use sluice_replication::PeerConnection;

/// How long a marker may take to become durable (fsynced, and in a cluster in the ISR).
pub const MARKER_DURABLE_TIMEOUT_MS: u64 = 30_000;
/// The WriteTxnMarkers version brokers send each other.
const WRITE_TXN_MARKERS_VERSION: i16 = 1;
/// Idle connections kept per peer broker.
const PEER_CONNECTIONS_PER_NODE_MAX: usize = 4;

/// A commit or abort marker (control batch) for one producer's transaction.
#[derive(Debug, Clone, Copy)]
pub struct Marker {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// Where a transaction's end must be written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum MarkerTarget {
    /// A partition the transaction produced to: a control batch.
    Partition(String, i32),
    /// A `__consumer_offsets` partition holding offsets the transaction sent.
    Offsets(i32),
}

impl MarkerTarget {
    fn topic(&self) -> &str {
        match self {
            MarkerTarget::Partition(topic, _) => topic,
            MarkerTarget::Offsets(_) => OFFSETS_TOPIC,
        }
    }

    fn partition(&self) -> i32 {
        match self {
            MarkerTarget::Partition(_, partition) | MarkerTarget::Offsets(partition) => *partition,
        }
    }

    /// As named on the wire (WriteTxnMarkers names offsets partitions by the topic).
    pub fn from_wire(topic: &str, partition: i32) -> MarkerTarget {
        if topic == OFFSETS_TOPIC {
            MarkerTarget::Offsets(partition)
        } else {
            MarkerTarget::Partition(topic.to_string(), partition)
        }
    }
}

/// A written marker's wait until it is durable.
pub type MarkerWait = Pin<Box<dyn Future<Output = Result<(), ResponseError>> + Send>>;

/// Writes `marker` to `target`, which this node must lead. `Ok(None)`: nothing to end
/// there (the producer was already fenced there by a newer epoch). Used by the
/// coordinator and by the WriteTxnMarkers handler.
pub fn write_local(
    host: &dyn CoordinatorHost,
    target: &MarkerTarget,
    marker: Marker,
    now_ms: i64,
) -> Result<Option<MarkerWait>, ResponseError> {
    let Marker { producer_id, producer_epoch, commit, coordinator_epoch } = marker;
    let (topic, partition) = match target {
        MarkerTarget::Offsets(partition) => {
            let write = host
                .groups()
                .end_transaction(*partition, producer_id, producer_epoch, commit, host.logs().syncer())
                .map_err(|error| match error.response_error() {
                    ResponseError::NotCoordinator => ResponseError::NotLeaderOrFollower,
                    other => other,
                })?;
            return Ok(Some(Box::pin(async move { write.await.map_err(|error| error.response_error()) })));
        }
        MarkerTarget::Partition(topic, partition) => (topic.as_str(), *partition),
    };
    let (log, leader_epoch) = host.led_partition(topic, partition)?;
    match log.append_marker(producer_id, producer_epoch, commit, coordinator_epoch, leader_epoch, now_ms) {
        Ok(outcome) => {
            if outcome.needs_sync {
                host.logs().syncer().schedule(&log);
            }
            let mut visible = log.subscribe();
            let at = outcome.visible_at;
            Ok(Some(Box::pin(async move {
                let timeout = Duration::from_millis(MARKER_DURABLE_TIMEOUT_MS);
                let reached = tokio::time::timeout(timeout, visible.wait_for(|v| v.high_watermark >= at || v.failed))
                    .await
                    .map_err(|_| ResponseError::RequestTimedOut)?;
                if reached.is_ok_and(|v| v.high_watermark >= at) {
                    Ok(())
                } else {
                    Err(ResponseError::KafkaStorageError)
                }
            })))
        }
        Err(sluice_storage::AppendError::StaleProducerEpoch) => Ok(None),
        Err(error) => {
            tracing::warn!(topic, partition, %error, "could not write a transaction marker");
            Err(ResponseError::KafkaStorageError)
        }
    }
}

/// Idle connections to other brokers, by node id, reused by marker writes.
#[derive(Default)]
pub struct PeerPool {
    idle: Mutex<BTreeMap<i32, Vec<PeerConnection>>>,
}

impl PeerPool {
    async fn connect(&self, host: &dyn CoordinatorHost, node: i32) -> Result<PeerConnection, ResponseError> {
        if let Some(connection) = self.idle.lock().get_mut(&node).and_then(Vec::pop) {
            return Ok(connection);
        }
        let replicas = host.replicas().ok_or(ResponseError::NotLeaderOrFollower)?;
        let address = replicas.broker_address(node).ok_or(ResponseError::NotLeaderOrFollower)?;
        let source = host.source_address();
        let client_id = format!("sluice-txn-markers-{}", host.node_id());
        PeerConnection::connect(&address, source, client_id, host.inter_broker()).await.map_err(|error| {
            tracing::debug!(node, %error, "cannot connect to a partition leader for markers");
            ResponseError::NotLeaderOrFollower
        })
    }

    /// One request to `node` over a pooled connection; the connection is kept for reuse
    /// only after a complete answer.
    pub async fn call(
        &self,
        host: &dyn CoordinatorHost,
        node: i32,
        api_key: ApiKey,
        version: i16,
        request: &RequestKind,
        timeout: Duration,
    ) -> Result<ResponseKind, ResponseError> {
        let mut connection = self.connect(host, node).await?;
        let answer = connection.call(api_key, version, request, timeout).await.map_err(|error| {
            tracing::debug!(node, ?api_key, %error, "a request to another broker failed");
            ResponseError::NotLeaderOrFollower
        })?;
        self.put_back(node, connection);
        Ok(answer)
    }

    fn put_back(&self, node: i32, connection: PeerConnection) {
        let mut idle = self.idle.lock();
        let connections = idle.entry(node).or_default();
        if connections.len() < PEER_CONNECTIONS_PER_NODE_MAX {
            connections.push(connection);
        }
    }
}

/// Writes `marker` to every target (here or at its leader) and waits until all are
/// durable. A target whose topic was deleted has nothing to end. The first other failure
/// is returned once every write was tried: the caller retries all of them later.
pub async fn write_all(
    host: &dyn CoordinatorHost,
    peers: &PeerPool,
    marker: Marker,
    targets: Vec<MarkerTarget>,
    now_ms: i64,
) -> Result<(), ResponseError> {
    let mut local = Vec::new();
    let mut remote: BTreeMap<i32, Vec<MarkerTarget>> = BTreeMap::new();
    for target in targets {
        match leader_of(host, &target) {
            Some(node) if node != host.node_id() => remote.entry(node).or_default().push(target),
            _ => local.push(target),
        }
    }
    let mut waits = Vec::new();
    let mut failure = None;
    for target in &local {
        match write_local(host, target, marker, now_ms) {
            Ok(wait) => waits.extend(wait),
            Err(ResponseError::UnknownTopicOrPartition) => {}
            Err(error) => {
                tracing::debug!(?target, ?error, "could not write a transaction marker; will retry");
                failure.get_or_insert(error);
            }
        }
    }
    let sends = remote.into_iter().map(|(node, targets)| send(host, peers, node, marker, targets));
    let (written, sent) = tokio::join!(futures::future::join_all(waits), futures::future::join_all(sends));
    for result in written.into_iter().chain(sent) {
        if let Err(error) = result {
            failure.get_or_insert(error);
        }
    }
    failure.map_or(Ok(()), Err)
}

/// The node leading `target`'s partition, from the cluster metadata (`None` on a single
/// node, or when unknown: then it is tried here and answers why not).
fn leader_of(host: &dyn CoordinatorHost, target: &MarkerTarget) -> Option<i32> {
    host.partition_leader(target.topic(), target.partition())
}

/// WriteTxnMarkers to `node` for `targets`; the first error any target answers.
async fn send(
    host: &dyn CoordinatorHost,
    peers: &PeerPool,
    node: i32,
    marker: Marker,
    targets: Vec<MarkerTarget>,
) -> Result<(), ResponseError> {
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for target in &targets {
        topics.entry(target.topic()).or_default().push(target.partition());
    }
    let mut request_marker = WritableTxnMarker::default();
    request_marker.producer_id = ProducerId(marker.producer_id);
    request_marker.producer_epoch = marker.producer_epoch;
    request_marker.transaction_result = marker.commit;
    request_marker.coordinator_epoch = marker.coordinator_epoch;
    request_marker.topics = topics
        .into_iter()
        .map(|(name, partition_indexes)| {
            let mut topic = WritableTxnMarkerTopic::default();
            topic.name = TopicName(StrBytes::from_string(name.to_string()));
            topic.partition_indexes = partition_indexes;
            topic
        })
        .collect();
    let mut request = WriteTxnMarkersRequest::default();
    request.markers = vec![request_marker];
    let request = RequestKind::WriteTxnMarkers(request);
    let mut connection = peers.connect(host, node).await?;
    let timeout = Duration::from_millis(MARKER_DURABLE_TIMEOUT_MS + 5_000);
    let answer = connection.call(ApiKey::WriteTxnMarkers, WRITE_TXN_MARKERS_VERSION, &request, timeout).await;
    let response = match answer {
        Ok(ResponseKind::WriteTxnMarkers(response)) => response,
        Ok(_) => unreachable!("WriteTxnMarkers is answered by its response"),
        Err(error) => {
            tracing::debug!(node, %error, "WriteTxnMarkers to a partition leader failed; will retry");
            return Err(ResponseError::NotLeaderOrFollower);
        }
    };
    peers.put_back(node, connection);
    let codes = response.markers.iter().flat_map(|m| m.topics.iter()).flat_map(|t| t.partitions.iter());
    for code in codes.map(|p| p.error_code).filter(|code| *code != 0) {
        let error = ResponseError::try_from_code(code).unwrap_or(ResponseError::UnknownServerError);
        if error != ResponseError::UnknownTopicOrPartition {
            tracing::debug!(node, ?error, "a partition leader refused a transaction marker; will retry");
            return Err(error);
        }
    }
    Ok(())
}
