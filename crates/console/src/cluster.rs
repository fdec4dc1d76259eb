//! The console's view of the cluster: a Kafka client authenticated as the user who logged
//! in, so every page shows what that principal's ACLs allow and nothing else, answered by
//! the same authorizer as any client.
//!
//! Requests are the protocol's own (`sluice-client`), sent on the blocking pool (the client
//! is synchronous) over a few pooled connections per broker.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anyhow::{anyhow, Context};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{DescribeClusterRequest, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use parking_lot::Mutex;
use sluice_client::{Connector, Exchange, KafkaConnection};

/// The API versions the console sends (every one served by Sluice and Kafka 4).
pub mod versions {
    pub const METADATA: i16 = 12;
    pub const LIST_OFFSETS: i16 = 7;
    pub const DESCRIBE_LOG_DIRS: i16 = 4;
    pub const DESCRIBE_CONFIGS: i16 = 4;
    pub const FETCH: i16 = 12;
    pub const LIST_GROUPS: i16 = 5;
    pub const DESCRIBE_GROUPS: i16 = 5;
    pub const OFFSET_FETCH: i16 = 8;
    pub const FIND_COORDINATOR: i16 = 4;
    pub const CONSUMER_GROUP_DESCRIBE: i16 = 0;
    pub const SHARE_GROUP_DESCRIBE: i16 = 1;
    pub const DESCRIBE_SHARE_GROUP_OFFSETS: i16 = 0;
    pub const CREATE_TOPICS: i16 = 7;
    pub const CREATE_PARTITIONS: i16 = 3;
    pub const DELETE_TOPICS: i16 = 6;
    pub const INCREMENTAL_ALTER_CONFIGS: i16 = 1;
    pub const PRODUCE: i16 = 9;
    pub const OFFSET_COMMIT: i16 = 8;
    pub const OFFSET_DELETE: i16 = 0;
    pub const DELETE_GROUPS: i16 = 2;
    pub const ALTER_SHARE_GROUP_OFFSETS: i16 = 0;
    pub const DELETE_SHARE_GROUP_OFFSETS: i16 = 0;
    pub const DESCRIBE_USER_SCRAM_CREDENTIALS: i16 = 0;
    pub const ALTER_USER_SCRAM_CREDENTIALS: i16 = 0;
    pub const DESCRIBE_ACLS: i16 = 3;
    pub const DESCRIBE_CLUSTER: i16 = 1;
    pub const CREATE_ACLS: i16 = 3;
    pub const DELETE_ACLS: i16 = 3;
    pub const DESCRIBE_CLIENT_QUOTAS: i16 = 1;
    pub const ALTER_CLIENT_QUOTAS: i16 = 1;
}

/// Idle connections kept per broker.
const POOLED_PER_BROKER: usize = 4;

/// One user's client of the cluster.
pub struct ClusterClient {
    connector: Connector,
    bootstrap: String,
    /// Idle authenticated connections by broker address.
    idle: Mutex<HashMap<String, Vec<KafkaConnection>>>,
}

/// What Metadata says of the cluster, with broker addresses by id.
pub struct ClusterMetadata {
    pub cluster_id: String,
    pub controller: i32,
    /// Broker id -> (`host:port`, rack).
    pub brokers: BTreeMap<i32, (String, Option<String>)>,
    pub topics: Vec<kafka_protocol::messages::metadata_response::MetadataResponseTopic>,
}

impl ClusterMetadata {
    pub fn address(&self, broker: i32) -> anyhow::Result<&str> {
        self.brokers
            .get(&broker)
            .map(|(address, _)| address.as_str())
            .ok_or_else(|| anyhow!("broker {broker} is unknown"))
    }
}

/// Kafka's ACL operation code of DESCRIBE, a bit of `cluster_authorized_operations`.
const DESCRIBE_OPERATION: i32 = 8;

impl ClusterClient {
    /// Whether this client's user may DESCRIBE the cluster (Kafka's gate on broker-wide
    /// information such as its configs), asked with DescribeCluster.
    pub async fn may_describe_cluster(self: &Arc<Self>) -> bool {
        let mut request = DescribeClusterRequest::default();
        request.include_cluster_authorized_operations = true;
        let bootstrap = self.bootstrap().to_string();
        match self.send(&bootstrap, versions::DESCRIBE_CLUSTER, request).await {
            Ok(answer) => {
                answer.error_code == 0 && answer.cluster_authorized_operations & (1 << DESCRIBE_OPERATION) != 0
            }
            Err(_) => false,
        }
    }

    /// Opens a first connection to `bootstrap` (so that a login with a wrong password fails
    /// here) and keeps it.
    pub async fn open(connector: Connector, bootstrap: String) -> anyhow::Result<Arc<ClusterClient>> {
        let client = Arc::new(ClusterClient { connector, bootstrap, idle: Mutex::new(HashMap::new()) });
        let opened = client.clone();
        let connection = tokio::task::spawn_blocking(move || opened.connector.connect(&opened.bootstrap)).await??;
        client.put_back(connection);
        Ok(client)
    }

    /// The address the console reaches the cluster through.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Sends `request` to the broker at `address` and returns its answer.
    pub async fn send<R>(self: &Arc<Self>, address: &str, version: i16, request: R) -> anyhow::Result<R::Answer>
    where
        R: Exchange + Send + 'static,
        R::Answer: Send + 'static,
    {
        let client = self.clone();
        let address = address.to_string();
        tokio::task::spawn_blocking(move || {
            let mut connection = match client.take(&address) {
                Some(connection) => connection,
                None => client.connector.connect(&address)?,
            };
            let answer = connection.send(version, request)?;
            client.put_back(connection);
            Ok(answer)
        })
        .await
        .context("the console's request task failed")?
    }

    fn take(&self, address: &str) -> Option<KafkaConnection> {
        self.idle.lock().get_mut(address).and_then(Vec::pop)
    }

    fn put_back(&self, connection: KafkaConnection) {
        let mut idle = self.idle.lock();
        let pool = idle.entry(connection.address().to_string()).or_default();
        if pool.len() < POOLED_PER_BROKER {
            pool.push(connection);
        }
    }

    /// Metadata of every topic (`None`) or of the ones named.
    pub async fn metadata(self: &Arc<Self>, topics: Option<&[String]>) -> anyhow::Result<ClusterMetadata> {
        let mut request = MetadataRequest::default();
        request.topics = topics.map(|names| {
            names
                .iter()
                .map(|name| {
                    let mut topic = MetadataRequestTopic::default();
                    topic.name = Some(TopicName(StrBytes::from_string(name.clone())));
                    topic
                })
                .collect()
        });
        request.allow_auto_topic_creation = false;
        let bootstrap = self.bootstrap.clone();
        let answer = self.send(&bootstrap, versions::METADATA, request).await?;
        let brokers = answer
            .brokers
            .iter()
            .map(|b| (b.node_id.0, (format!("{}:{}", b.host, b.port), b.rack.as_ref().map(|r| r.to_string()))))
            .collect();
        Ok(ClusterMetadata {
            cluster_id: answer.cluster_id.map(|id| id.to_string()).unwrap_or_default(),
            controller: answer.controller_id.0,
            brokers,
            topics: answer.topics,
        })
    }
}
