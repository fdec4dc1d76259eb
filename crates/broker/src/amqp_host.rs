//! The broker's side of the AMQP front door: its request handlers, run in process as the
//! AMQP user (authorized as a Kafka client of that name would be), and its users' passwords.
//!
//! Logins are required whenever a Kafka listener requires SASL (the broker has users), as
//! for the HTTP APIs; otherwise AMQP connections are anonymous, as Kafka clients on a
//! PLAINTEXT listener.

use std::io;
use std::sync::Arc;

use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use sluice_amqp::{AmqpConfig, Gateway, GatewayFuture, QueueDepth, Server, Session};
use sluice_security::acl::{CLUSTER_RESOURCE_NAME, OP_CREATE, RESOURCE_CLUSTER};

use crate::handlers::ClientSession;
use crate::Broker;

/// Where the AMQP topology lives, under the data directory.
const AMQP_STATE_DIR: &str = "amqp";

struct AmqpGateway {
    broker: Arc<Broker>,
    login_required: bool,
}

/// The AMQP server of `broker`.
pub fn server(broker: &Arc<Broker>) -> io::Result<Arc<Server>> {
    let login_required = broker.listeners().iter().any(|listener| listener.protocol.uses_sasl());
    let gateway = Arc::new(AmqpGateway { broker: broker.clone(), login_required });
    let config = AmqpConfig { state_dir: broker.config().data_dir.join(AMQP_STATE_DIR) };
    // Its entry in the data dir made durable too: a directory created and never synced in its
    // parent vanishes with every file in it at a power cut.
    sluice_storage::durable::create_dir_all(&config.state_dir)?;
    Server::new(gateway, &config)
}

/// The share-partition of queue `queue`'s `partition` (its share group has the queue's name),
/// loaded here if this node leads the partition: its key, the leader epoch and the log's
/// (start, high watermark).
async fn served_share_partition(
    broker: &Arc<Broker>,
    queue: &str,
    partition: i32,
) -> Option<(sluice_coordinator::share::PartitionKey, i32, (i64, i64))> {
    let (topic_id, _) = broker.topics.catalog().get(queue)?;
    let log = broker.partition(queue, partition)?;
    let epoch = sluice_coordinator::share::leader_epoch(&**broker, queue, partition)?;
    let offsets = log.offsets();
    let bounds = (offsets.log_start_offset, offsets.high_watermark);
    let key = (queue.to_string(), queue.to_string(), partition);
    broker.shares.ensure_loaded(&**broker, &key, topic_id, epoch, bounds, false).await.ok()?;
    Some((key, epoch, bounds))
}

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
        crate::handlers::answer_in_process(&self.broker, &session, api, api_version, request)
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
        let (broker, queue) = (self.broker.clone(), queue.to_string());
        Box::pin(async move {
            let (key, epoch, bounds) = served_share_partition(&broker, &queue, partition).await?;
            let depth = broker.shares.depth(&key, epoch, bounds)?;
            Some(QueueDepth { ready: depth.ready, unacknowledged: depth.unacknowledged })
        })
    }

    fn drop_ready(&self, queue: &str, partition: i32, count: u64) -> GatewayFuture<'static, Option<Vec<i64>>> {
        let (broker, queue) = (self.broker.clone(), queue.to_string());
        Box::pin(async move {
            let (key, epoch, bounds) = served_share_partition(&broker, &queue, partition).await?;
            let (dropped, write) = broker.shares.discard_ready(&key, epoch, count, bounds)?;
            broker.shares.persist(&*broker, write).await.ok()?;
            Some(dropped)
        })
    }

    fn read_batches(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: usize,
    ) -> GatewayFuture<'static, Option<bytes::Bytes>> {
        let log = self.broker.partition(topic, partition);
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
        let local = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        self.run(self.client_session(sluice_security::INTER_BROKER_PRINCIPAL, local), api_version, request)
    }
}
