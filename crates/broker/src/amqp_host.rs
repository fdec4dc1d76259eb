//! The broker's side of the AMQP front door: its request handlers, run in process as the
//! AMQP user (authorized as a Kafka client of that name would be), and its users' passwords.
//!
//! Logins are required whenever a Kafka listener requires SASL (the broker has users), as
//! for the HTTP APIs; otherwise AMQP connections are anonymous, as Kafka clients on a
//! PLAINTEXT listener.

use std::io;
use std::sync::Arc;

use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use kafka_protocol::ResponseError;
use sluice_amqp::state_store::{Entries, FileStore, StateStore, StoreError};
use sluice_amqp::{AmqpConfig, Gateway, GatewayFuture, QueueDepth, Server, Session};
use sluice_security::acl::{CLUSTER_RESOURCE_NAME, OP_CREATE, RESOURCE_CLUSTER};

use crate::amqp_routing::{self, Forwarder, Target};
use crate::handlers::ClientSession;
use crate::Broker;

/// The address the broker's own requests come from (the broker itself, not a client).
const BROKER_ITSELF: std::net::SocketAddr =
    std::net::SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 0));

/// Where the AMQP topology lives, under the data directory.
const AMQP_STATE_DIR: &str = "amqp";

struct AmqpGateway {
    broker: Arc<Broker>,
    login_required: bool,
    /// Sends the parts of requests other nodes serve (a cluster).
    forwarder: Arc<Forwarder>,
}

/// The AMQP server of `broker`.
pub fn server(broker: &Arc<Broker>) -> io::Result<Arc<Server>> {
    let login_required = broker.listeners().iter().any(|listener| listener.protocol.uses_sasl());
    let gateway = Arc::new(AmqpGateway { broker: broker.clone(), login_required, forwarder: Arc::default() });
    let config = AmqpConfig { state_dir: broker.config().data_dir.join(AMQP_STATE_DIR) };
    // Its entry in the data dir made durable too: a directory created and never synced in its
    // parent vanishes with every file in it at a power cut.
    sluice_storage::durable::create_dir_all(&config.state_dir)?;
    let store: Arc<dyn StateStore> = match broker.cluster {
        None => {
            use sluice_amqp::topology::{legacy_entries, transient_entry};
            Arc::new(FileStore::open(&config.state_dir, transient_entry, legacy_entries)?)
        }
        Some(_) => Arc::new(ClusterStore { broker: broker.clone() }),
    };
    Server::new(gateway, &config, store)
}

/// The AMQP topology of a cluster: entries of the replicated cluster metadata, changed
/// through the controller. Transient exchanges and exclusive queues are kept too: a node's
/// restart does not end the connections of the others.
struct ClusterStore {
    broker: Arc<Broker>,
}

impl StateStore for ClusterStore {
    fn version(&self) -> u64 {
        self.broker.cluster.as_ref().map_or(0, |cluster| cluster.metadata().amqp_version)
    }

    fn snapshot(&self) -> (u64, Arc<Entries>) {
        let Some(cluster) = &self.broker.cluster else { return (0, Arc::default()) };
        let metadata = cluster.metadata();
        (metadata.amqp_version, Arc::new(metadata.amqp.clone()))
    }

    fn commit(
        &self,
        expected_version: u64,
        puts: Entries,
        deletes: Vec<String>,
    ) -> GatewayFuture<'static, Result<(), StoreError>> {
        let broker = self.broker.clone();
        Box::pin(async move {
            let controller =
                crate::metadata_writes::controller(&broker).map_err(|(_, text)| StoreError::Failed(text))?;
            let write = controller.alter_amqp_state(Some(expected_version), puts, deletes);
            match crate::metadata_writes::controller_write(&broker, write).await {
                Ok(()) => Ok(()),
                Err((ResponseError::InvalidUpdateVersion, _)) => Err(StoreError::Conflict),
                Err((_, text)) => Err(StoreError::Failed(text)),
            }
        })
    }
}

/// The share-partition of `group` on `topic`'s `partition` (a queue's share group has the
/// queue's name), loaded here if this node leads the partition: its key, the leader epoch and
/// the log's (start, high watermark).
async fn served_share_partition(
    broker: &Arc<Broker>,
    group: &str,
    topic: &str,
    partition: i32,
) -> Option<(sluice_coordinator::share::PartitionKey, i32, (i64, i64))> {
    let (topic_id, _) = broker.topics.catalog().get(topic)?;
    let log = broker.partition(topic, partition)?;
    let epoch = sluice_coordinator::share::leader_epoch(&**broker, topic, partition)?;
    let offsets = log.offsets();
    let bounds = (offsets.log_start_offset, offsets.high_watermark);
    let key = (group.to_string(), topic.to_string(), partition);
    let give_up_at = tokio::time::Instant::now() + SHARE_STATE_WAIT;
    loop {
        match broker.shares.ensure_loaded(&**broker, &key, topic_id, epoch, bounds, false).await {
            Ok(()) => return Some((key, epoch, bounds)),
            // The share-state topic of a cluster just formed may have no leaders yet, or
            // leaders still taking over.
            Err(error) if tokio::time::Instant::now() < give_up_at => {
                tracing::debug!(group, topic, partition, %error, "share-partition state not readable yet");
                tokio::time::sleep(SHARE_STATE_RETRY_PAUSE).await;
            }
            Err(_) => return None,
        }
    }
}

/// How long a queue's depth waits for its share-partition's state to be readable.
const SHARE_STATE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
const SHARE_STATE_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// How many records of `group`'s share-partition of `topic`'s `partition` are ready and how
/// many handed out and unacknowledged, when this node leads the partition.
pub(crate) async fn local_depth(broker: &Arc<Broker>, group: &str, topic: &str, partition: i32) -> Option<(u64, u64)> {
    let (key, epoch, bounds) = served_share_partition(broker, group, topic, partition).await?;
    let depth = broker.shares.depth(&key, epoch, bounds)?;
    Some((depth.ready, depth.unacknowledged))
}

/// Archives `count` of the oldest ready records of queue `queue`'s `partition`, durably,
/// when this node leads it; their offsets.
pub(crate) async fn discard_ready_here(
    broker: &Arc<Broker>,
    queue: &str,
    partition: i32,
    count: u64,
) -> Option<Vec<i64>> {
    let (key, epoch, bounds) = served_share_partition(broker, queue, queue, partition).await?;
    let (dropped, write) = broker.shares.discard_ready(&key, epoch, count, bounds)?;
    broker.shares.persist(&**broker, write).await.ok()?;
    Some(dropped)
}

/// Has `node`, the leader of a queue's partition, archive `count` of its oldest ready records.
async fn discard_ready_at(
    broker: &Arc<Broker>,
    forwarder: &Forwarder,
    node: i32,
    (queue, partition): (&str, i32),
    count: u64,
) -> Option<Vec<i64>> {
    use kafka_protocol::messages::share_acknowledge_request::{AcknowledgePartition, AcknowledgeTopic};
    let topic_id = broker.topics.catalog().get(queue)?.0;
    let mut topic = AcknowledgeTopic::default();
    topic.topic_id = topic_id;
    topic.partitions = vec![AcknowledgePartition::default().with_partition_index(partition)];
    let mut request = kafka_protocol::messages::ShareAcknowledgeRequest::default();
    request.group_id = Some(kafka_protocol::messages::GroupId(queue.to_string().into()));
    request.topics = vec![topic];
    sluice_protocol::ask_to_discard_ready(&mut request, count);
    let internal = (sluice_security::INTER_BROKER_PRINCIPAL, BROKER_ITSELF);
    let api = (ApiKey::ShareAcknowledge, sluice_amqp::gateway::versions::SHARE_ACKNOWLEDGE);
    let answer = forwarder.forward(broker, node, internal, api, RequestKind::ShareAcknowledge(request)).await;
    let Some(ResponseKind::ShareAcknowledge(response)) = answer else { return None };
    sluice_protocol::discarded(&response)
}

/// The node other than this one that leads `topic`'s `partition`, in a cluster.
fn remote_leader(broker: &Broker, topic: &str, partition: i32) -> Option<i32> {
    let metadata = broker.cluster.as_ref()?.metadata();
    match amqp_routing::leader(&metadata, broker.node_id(), topic, partition) {
        Target::Node(node) => Some(node),
        Target::Here => None,
    }
}

/// Groups have no coordinator before the offsets topic exists; a Kafka client's
/// FindCoordinator has it created, so the front door asks one too, as the broker.
async fn create_offsets_topic(broker: &Arc<Broker>, session: &ClientSession) {
    let mut find = kafka_protocol::messages::FindCoordinatorRequest::default();
    find.key = kafka_protocol::protocol::StrBytes::from_static_str("amqp");
    let internal = ClientSession { principal: sluice_security::INTER_BROKER_PRINCIPAL.into(), ..session.clone() };
    let found = RequestKind::FindCoordinator(find);
    let _ = crate::handlers::answer_in_process(broker, &internal, ApiKey::FindCoordinator, 3, found).await;
}

/// The depth of queue `queue`'s `partition` as its leader, `node`, counts it.
async fn remote_depth(
    broker: &Arc<Broker>,
    forwarder: &Forwarder,
    node: i32,
    queue: &str,
    partition: i32,
) -> Option<(u64, u64)> {
    use kafka_protocol::messages::describe_share_group_offsets_request::{
        DescribeShareGroupOffsetsRequestGroup, DescribeShareGroupOffsetsRequestTopic,
    };
    let name = kafka_protocol::protocol::StrBytes::from_string(queue.to_string());
    let mut topic = DescribeShareGroupOffsetsRequestTopic::default();
    topic.topic_name = kafka_protocol::messages::TopicName(name.clone());
    topic.partitions = vec![partition];
    let mut group = DescribeShareGroupOffsetsRequestGroup::default();
    group.group_id = kafka_protocol::messages::GroupId(name);
    group.topics = Some(vec![topic]);
    let mut request = kafka_protocol::messages::DescribeShareGroupOffsetsRequest::default();
    request.groups = vec![group];
    sluice_protocol::ask_for_queue_depth(&mut request);
    let internal = (sluice_security::INTER_BROKER_PRINCIPAL, BROKER_ITSELF);
    let api = (ApiKey::DescribeShareGroupOffsets, DEPTH_VERSION);
    let answer = forwarder.forward(broker, node, internal, api, RequestKind::DescribeShareGroupOffsets(request)).await;
    let Some(ResponseKind::DescribeShareGroupOffsets(response)) = answer else { return None };
    let partition = response.groups.first()?.topics.first()?.partitions.first()?;
    sluice_protocol::queue_depth(partition)
}

/// The DescribeShareGroupOffsets version a queue depth is asked at (the one whose answer
/// keeps this crate's tags as they are).
const DEPTH_VERSION: i16 = 0;

/// The API of the requests the AMQP front door sends; None for any other.
fn api_of(request: &RequestKind) -> Option<ApiKey> {
    Some(match request {
        RequestKind::Produce(_) => ApiKey::Produce,
        RequestKind::Metadata(_) => ApiKey::Metadata,
        RequestKind::ListOffsets(_) => ApiKey::ListOffsets,
        RequestKind::CreateTopics(_) => ApiKey::CreateTopics,
        RequestKind::DeleteTopics(_) => ApiKey::DeleteTopics,
        RequestKind::DeleteRecords(_) => ApiKey::DeleteRecords,
        RequestKind::IncrementalAlterConfigs(_) => ApiKey::IncrementalAlterConfigs,
        RequestKind::ShareGroupHeartbeat(_) => ApiKey::ShareGroupHeartbeat,
        RequestKind::ShareFetch(_) => ApiKey::ShareFetch,
        RequestKind::ShareAcknowledge(_) => ApiKey::ShareAcknowledge,
        RequestKind::DescribeShareGroupOffsets(_) => ApiKey::DescribeShareGroupOffsets,
        _ => return None,
    })
}

impl AmqpGateway {
    fn client_session(&self, principal: &str, peer: std::net::SocketAddr) -> ClientSession {
        ClientSession {
            peer,
            listener: 0,
            principal: principal.into(),
            throttle: Arc::new(sluice_security::quota::ConnectionThrottle::default()),
        }
    }

    fn run(
        &self,
        session: ClientSession,
        api_version: i16,
        request: RequestKind,
    ) -> GatewayFuture<'static, Option<ResponseKind>> {
        let Some(api) = api_of(&request) else {
            tracing::error!("the AMQP front door sent a request it has no rule for");
            return Box::pin(async { None });
        };
        match &self.broker.cluster {
            None => crate::handlers::answer_in_process(&self.broker, &session, api, api_version, request),
            Some(cluster) => self.answer_in_cluster(&cluster.metadata(), session, (api, api_version), request),
        }
    }

    /// `request` cut into the parts each node serves (`amqp_routing`), each answered there
    /// (or here, when its node cannot be asked), the answers merged.
    fn answer_in_cluster(
        &self,
        metadata: &sluice_cluster::ClusterMetadata,
        session: ClientSession,
        (api, api_version): (ApiKey, i16),
        request: RequestKind,
    ) -> GatewayFuture<'static, Option<ResponseKind>> {
        let first_group = matches!(request, RequestKind::ShareGroupHeartbeat(_))
            && !metadata.topics.contains_key(sluice_coordinator::group::OFFSETS_TOPIC);
        let parts = amqp_routing::parts(metadata, self.broker.node_id(), request);
        let (broker, forwarder) = (self.broker.clone(), self.forwarder.clone());
        Box::pin(async move {
            if first_group {
                create_offsets_topic(&broker, &session).await;
            }
            let answers = parts.into_iter().map(|(target, part)| {
                let (broker, forwarder, session) = (broker.clone(), forwarder.clone(), session.clone());
                async move {
                    if let Target::Node(node) = target {
                        let user = (&*session.principal, session.peer);
                        let forwarded = forwarder.forward(&broker, node, user, (api, api_version), part.clone());
                        if let Some(answer) = forwarded.await {
                            return Some(answer);
                        }
                    }
                    // Here, or its node could not be asked: this node answers with the error
                    // a Kafka client would get from it (not the leader, not the coordinator).
                    crate::handlers::answer_in_process(&broker, &session, api, api_version, part).await
                }
            });
            let answers: Option<Vec<ResponseKind>> = futures::future::join_all(answers).await.into_iter().collect();
            amqp_routing::merge(answers?)
        })
    }
}

impl Gateway for AmqpGateway {
    fn login_required(&self) -> bool {
        self.login_required
    }

    fn authenticate(&self, user: String, password: String) -> GatewayFuture<'static, bool> {
        let broker = self.broker.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || sluice_security::password_matches(&*broker, &user, &password))
                .await
                .unwrap_or(false)
        })
    }

    fn certificate_user(&self, certificate: &[u8]) -> Option<String> {
        let certificate = rustls::pki_types::CertificateDer::from(certificate);
        let subject = sluice_security::tls::certificate_user(&certificate)?;
        self.broker.config().ssl_principal_mapping_rules.apply(&subject)
    }

    fn may_configure_routing(&self, session: &Session) -> bool {
        let client = self.client_session(&session.principal, session.peer);
        self.broker.authorized(&client, OP_CREATE, RESOURCE_CLUSTER, CLUSTER_RESOURCE_NAME)
    }

    fn call(
        &self,
        session: &Session,
        api_version: i16,
        request: RequestKind,
    ) -> GatewayFuture<'static, Option<ResponseKind>> {
        self.run(self.client_session(&session.principal, session.peer), api_version, request)
    }

    fn local_log_end(&self, topic: &str, partition: i32) -> Option<i64> {
        let log = match &self.broker.replicas {
            None => self.broker.logs.get_in(topic, partition),
            Some(replicas) => replicas.get(topic, partition).map(|replica| replica.log.clone()),
        }?;
        Some(log.offsets().log_end_offset)
    }

    fn queue_depth(&self, queue: &str, partition: i32) -> GatewayFuture<'static, Option<QueueDepth>> {
        let (broker, forwarder, queue) = (self.broker.clone(), self.forwarder.clone(), queue.to_string());
        Box::pin(async move {
            let (ready, unacknowledged) = match remote_leader(&broker, &queue, partition) {
                None => local_depth(&broker, &queue, &queue, partition).await?,
                Some(node) => remote_depth(&broker, &forwarder, node, &queue, partition).await?,
            };
            Some(QueueDepth { ready, unacknowledged })
        })
    }

    fn drop_ready(&self, queue: &str, partition: i32, count: u64) -> GatewayFuture<'static, Option<Vec<i64>>> {
        let (broker, forwarder, queue) = (self.broker.clone(), self.forwarder.clone(), queue.to_string());
        Box::pin(async move {
            match remote_leader(&broker, &queue, partition) {
                None => discard_ready_here(&broker, &queue, partition, count).await,
                Some(node) => discard_ready_at(&broker, &forwarder, node, (&queue, partition), count).await,
            }
        })
    }

    fn read_batches(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: usize,
    ) -> GatewayFuture<'static, Option<bytes::Bytes>> {
        // The leader's log, or this node's replica of it (a follower's high watermark may
        // trail the leader's a little: a read from it can end early).
        let log = self.broker.partition(topic, partition).or_else(|| {
            let replicas = self.broker.replicas.as_ref()?;
            replicas.get(topic, partition).map(|replica| replica.log.clone())
        });
        Box::pin(async move {
            let log = log?;
            let read = move || {
                log.read_until(
                    offset,
                    max_bytes,
                    true,
                    sluice_storage::ReadLimit::HighWatermark,
                    sluice_storage::ReadMode::MayBlock,
                )
            };
            tokio::task::spawn_blocking(read).await.ok()?.ok()
        })
    }

    fn call_internal(&self, api_version: i16, request: RequestKind) -> GatewayFuture<'static, Option<ResponseKind>> {
        self.run(self.client_session(sluice_security::INTER_BROKER_PRINCIPAL, BROKER_ITSELF), api_version, request)
    }
}
