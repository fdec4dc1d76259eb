//! The broker side of the Schema Registry: the `_schemas` partition its state lives in.
//!
//! The registry reads the committed records of this node's replica (led or followed: any
//! node holding one answers reads) and writes through the partition's leader with the
//! internal-log write path of the coordinators (fsynced, and in a cluster past the high
//! watermark while still leading). The topic is created on the first write: one
//! partition, compacted, replicated like the internal topics, durability level 1.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;
use kafka_protocol::ResponseError;
use sluice_coordinator::internal_log::{encode_internal_batch, InternalLog, LogWriteError};
use sluice_meta::topics::TopicMeta;
use sluice_schema_registry::{
    LogFuture, LogRecord, Registry, RegistryError, RegistryTls, SchemaLog, Writer, SCHEMAS_TOPIC,
};
use sluice_storage::{Partition, ReadMode};

use crate::metadata_writes::{internal_topic_configs, MetadataWriter, NewTopic};
use crate::Broker;

/// Bytes read from the log per catch-up step.
const READ_BYTES: usize = 4 * 1024 * 1024;
/// How long a registry write waits to become durable.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Replicas of `_schemas` at most (fewer on a smaller cluster).
const REPLICATION_FACTOR_MAX: usize = 3;
/// The largest registry batch (a schema with its references).
const MAX_MESSAGE_BYTES: usize = 20 * 1024 * 1024;

/// `_schemas` as the broker hosts it.
pub struct BrokerSchemaLog {
    broker: Arc<Broker>,
}

impl BrokerSchemaLog {
    pub fn new(broker: Arc<Broker>) -> BrokerSchemaLog {
        BrokerSchemaLog { broker }
    }

    /// This node's replica of `_schemas`-0, led or followed.
    fn local(&self) -> Option<Arc<Partition>> {
        match &self.broker.replicas {
            None => self.broker.logs.get_in(SCHEMAS_TOPIC, 0),
            Some(replicas) => replicas.get(SCHEMAS_TOPIC, 0).map(|replica| replica.log.clone()),
        }
    }

    /// The write path of the partition as this node leads it.
    fn led(&self) -> Result<InternalLog, RegistryError> {
        match &self.broker.replicas {
            None => self.local().map(InternalLog::local).ok_or_else(|| RegistryError::Store("no _schemas log".into())),
            Some(replicas) => {
                let replica = replicas.get(SCHEMAS_TOPIC, 0).ok_or_else(not_leader)?;
                let epoch = replica.leader_epoch().ok_or_else(not_leader)?;
                Ok(InternalLog::replicated(replica, epoch))
            }
        }
    }

    fn topic_exists(&self) -> bool {
        match &self.broker.cluster {
            None => self.broker.topics.get(SCHEMAS_TOPIC).is_some(),
            Some(cluster) => cluster.metadata().topics.contains_key(SCHEMAS_TOPIC),
        }
    }

    /// Whether this node's replica is in sync (always, on a single node): a replica out of
    /// the ISR (one still catching up after a restart) would answer from an older state
    /// than the one a client may have seen a moment ago.
    fn in_sync(&self) -> bool {
        let Some(cluster) = &self.broker.cluster else { return true };
        let metadata = cluster.metadata();
        let partition = metadata.topics.get(SCHEMAS_TOPIC).and_then(|topic| topic.partitions.first());
        partition.is_some_and(|partition| partition.isr.contains(&self.broker.node_id()))
    }

    /// The node leading `_schemas`-0 (`None`: no leader right now), in a cluster.
    fn leader(&self) -> Option<i32> {
        let cluster = self.broker.cluster.as_ref()?;
        let metadata = cluster.metadata();
        let leader = metadata.topics.get(SCHEMAS_TOPIC)?.partitions.first()?.leader;
        (leader >= 0).then_some(leader)
    }

    /// The registry address of node `node`, from its registration.
    fn registry_address(&self, node: i32) -> Option<String> {
        let cluster = self.broker.cluster.as_ref()?;
        let metadata = cluster.metadata();
        let (host, port) = metadata.brokers.get(&node)?.endpoint(sluice_schema_registry::REGISTRY_ENDPOINT)?;
        Some(format!("{host}:{port}"))
    }

    /// Creates `_schemas` unless it exists, and waits until it has a leader and this
    /// node, if it leads, has its log.
    async fn ensure_topic(&self) -> Result<(), RegistryError> {
        if !self.topic_exists() {
            let voters = self.broker.config().cluster.as_ref().and_then(|c| c.voters().ok()).map_or(1, |v| v.len());
            let replication_factor = voters.min(REPLICATION_FACTOR_MAX) as i16;
            let mut configs = internal_topic_configs(replication_factor);
            configs.extend([
                ("cleanup.policy".to_string(), "compact".to_string()),
                ("max.message.bytes".to_string(), MAX_MESSAGE_BYTES.to_string()),
            ]);
            let meta = TopicMeta { name: SCHEMAS_TOPIC.to_string(), id: uuid::Uuid::new_v4(), partitions: 1, configs };
            let topic = NewTopic { meta, replication_factor, assignment: None };
            let writer = MetadataWriter::of(&self.broker).map_err(|(_, message)| RegistryError::NotLeader(message))?;
            match writer.create_topic(topic, false).await {
                Ok(_) => {
                    tracing::info!(topic = SCHEMAS_TOPIC, replication_factor, "created the schema registry's topic")
                }
                Err((ResponseError::TopicAlreadyExists, _)) => {}
                Err((_, message)) => return Err(RegistryError::Store(format!("creating {SCHEMAS_TOPIC}: {message}"))),
            }
        }
        let deadline = tokio::time::Instant::now() + WRITE_TIMEOUT;
        let ready = |log: &Self| match &log.broker.cluster {
            None => log.local().is_some(),
            Some(_) => log.leader().is_some_and(|leader| leader != log.broker.node_id() || log.led().is_ok()),
        };
        while !ready(self) {
            if tokio::time::Instant::now() > deadline {
                return Err(not_leader());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

fn not_leader() -> RegistryError {
    RegistryError::NotLeader(format!("this node does not lead {SCHEMAS_TOPIC}; send writes to the node that does"))
}

impl SchemaLog for BrokerSchemaLog {
    fn read(&self, offset: i64) -> Result<Vec<LogRecord>, RegistryError> {
        let Some(partition) = self.local() else { return Ok(Vec::new()) };
        let offsets = partition.offsets();
        if offset >= offsets.high_watermark {
            return Ok(Vec::new());
        }
        let mut chunk = partition
            .read(offset.max(offsets.log_start_offset), READ_BYTES, true, ReadMode::MayBlock)
            .map_err(|error| RegistryError::Store(error.to_string()))?;
        let batches = RecordBatchDecoder::decode_all(&mut chunk)
            .map_err(|error| RegistryError::Store(format!("{SCHEMAS_TOPIC}: {error}")))?;
        Ok(batches
            .into_iter()
            .flat_map(|batch| batch.records)
            .filter(|record| record.offset >= offset && !record.control)
            .map(|record| (record.offset, record.key, record.value))
            .collect())
    }

    fn writer(&self) -> LogFuture<'_, Writer> {
        Box::pin(async move {
            if self.broker.cluster.is_none() {
                return Ok(Writer::Local);
            }
            self.ensure_topic().await?;
            match self.leader() {
                Some(leader) if leader == self.broker.node_id() => Ok(Writer::Local),
                Some(leader) => self.registry_address(leader).map(Writer::Remote).ok_or_else(|| {
                    RegistryError::NotLeader(format!(
                        "node {leader} leads {SCHEMAS_TOPIC} and serves no schema registry"
                    ))
                }),
                None => Err(not_leader()),
            }
        })
    }

    fn committed_end(&self) -> i64 {
        self.local().map_or(0, |partition| partition.offsets().high_watermark)
    }

    fn log_end(&self) -> i64 {
        self.local().map_or(0, |partition| partition.offsets().log_end_offset)
    }

    fn answers_reads(&self) -> bool {
        !self.topic_exists() || (self.local().is_some() && self.in_sync())
    }

    fn append(&self, records: Vec<(Bytes, Option<Bytes>)>) -> LogFuture<'_, i64> {
        Box::pin(async move {
            self.ensure_topic().await?;
            let log = self.led()?;
            let batch =
                encode_internal_batch(records.into_iter(), sluice_storage::now_ms()).map_err(RegistryError::Store)?;
            let appended = log.append(&batch, self.broker.logs.syncer()).map_err(write_error)?;
            log.wait_durable(appended.visible_at, WRITE_TIMEOUT).await.map_err(write_error)?;
            Ok(appended.visible_at)
        })
    }
}

fn write_error(error: LogWriteError) -> RegistryError {
    match error {
        LogWriteError::NotLeader => not_leader(),
        LogWriteError::NotEnoughReplicas => {
            RegistryError::Store(format!("fewer in-sync replicas of {SCHEMAS_TOPIC} than min.insync.replicas"))
        }
        LogWriteError::Storage => RegistryError::Store(format!("{SCHEMAS_TOPIC}: the write failed on disk")),
        LogWriteError::Timeout => RegistryError::Timeout,
    }
}

/// The registry's HTTPS, when `schema_registry_tls` is on: the broker's certificate, and in
/// a cluster the truststore's CAs to check other nodes' (writes are forwarded to the leader
/// of `_schemas` over HTTPS too).
pub fn tls(broker: &Broker) -> Result<Option<RegistryTls>, String> {
    if !broker.config().schema_registry_tls {
        return Ok(None);
    }
    let settings = broker.config().tls_settings();
    let why = |error: String| format!("schema registry TLS: {error}");
    let acceptor = sluice_security::tls::server_acceptor(&settings).map_err(why)?;
    let peers = match broker.cluster {
        None => None,
        Some(_) => Some(sluice_security::tls::connector(&settings).map_err(why)?),
    };
    Ok(Some(RegistryTls { acceptor, peers }))
}

/// The registry over this node's `_schemas` (its state starts empty and catches up on use).
pub fn registry(broker: &Arc<Broker>) -> Arc<Registry> {
    Arc::new(Registry::new(Arc::new(BrokerSchemaLog::new(broker.clone()))))
}

/// Serves the Schema Registry's REST API on `listener` for as long as the broker runs.
pub async fn serve(
    broker: Arc<Broker>,
    registry: Arc<Registry>,
    listener: tokio::net::TcpListener,
    tls: Option<RegistryTls>,
) {
    let gate = crate::http_auth::BasicAuth::for_broker(&broker);
    sluice_schema_registry::serve(listener, registry, gate, tls).await
}
