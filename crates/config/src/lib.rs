//! Broker configuration: listener, data dir, limits and topic defaults, with the named
//! limits every queue and buffer is bounded by.
//!
//! A crate below the broker: the settings, their parsing and their checks need nothing of
//! the broker's, so the command line and the broker read them from one definition, and
//! their tests run without building the broker.

mod limits;
mod suggest;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use serde::Deserialize;
use sluice_security::{
    ClusterSecuritySettings, Listener, OauthSettings, SecurityProtocol, SecuritySettings, TlsSettings,
};

use sluice_meta::topic_config::TopicDefaults;

pub use crate::limits::*;
pub use crate::suggest::{closest, explain_unknown_key};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    pub node_id: i32,
    pub listen: SocketAddr,
    /// Address given to clients in metadata; defaults to `listen` (127.0.0.1 if unspecified).
    pub advertised_listener: Option<String>,
    pub data_dir: PathBuf,
    pub max_request_bytes: usize,
    /// Kafka's `max.connections`: connections open at once, broker-wide
    /// ([`CONNECTIONS_MAX_DEFAULT`]); more are closed at accept.
    #[serde(alias = "max.connections")]
    pub max_connections: usize,
    /// Kafka's `max.connections.per.ip`: connections open at once from one address
    /// ([`CONNECTIONS_PER_IP_MAX_DEFAULT`]: no limit); more are closed at accept.
    #[serde(rename = "max.connections.per.ip")]
    pub max_connections_per_ip: usize,
    /// Kafka's `max.connections.per.ip.overrides`: `address:count,...`, a per-address
    /// limit replacing `max.connections.per.ip` (addresses are IP literals).
    #[serde(rename = "max.connections.per.ip.overrides")]
    pub max_connections_per_ip_overrides: String,
    /// Kafka's `connections.max.idle.ms` ([`CONNECTIONS_MAX_IDLE_MS_DEFAULT`]).
    #[serde(rename = "connections.max.idle.ms")]
    pub connections_max_idle_ms: u64,
    /// Kafka's `connection.failed.authentication.delay.ms`
    /// ([`CONNECTION_FAILED_AUTHENTICATION_DELAY_MS_DEFAULT`]); 0 answers at once.
    #[serde(rename = "connection.failed.authentication.delay.ms")]
    pub connection_failed_authentication_delay_ms: u64,
    /// How long a request may take to arrive once its size prefix has
    /// ([`REQUEST_READ_TIMEOUT_MS_DEFAULT`]).
    pub request_read_timeout_ms: u64,
    pub max_inflight_requests_per_connection: usize,
    /// Request bytes admitted broker-wide ([`QUEUED_MAX_REQUEST_BYTES_DEFAULT`]); the old
    /// key `produce_memory_bytes` (which bounded only produce requests) still reads.
    #[serde(alias = "queued.max.request.bytes", alias = "produce_memory_bytes")]
    pub queued_max_request_bytes: usize,
    /// Request bytes one connection may have admitted ([`QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION_DEFAULT`]).
    pub queued_max_request_bytes_per_connection: usize,
    /// Acknowledged appends are made durable through one write-ahead log (one fsync per
    /// group-commit round, whatever the number of partitions) instead of one fsync per
    /// partition file (storage `wal.rs`).
    pub log_wal: bool,
    /// Least time, in microseconds, between the starts of two WAL rounds after a round
    /// that logged several batches (`Syncer::set_wal_round_interval`): fewer, fuller rounds
    /// for less CPU, for up to this much more acknowledgement latency. At most
    /// [`WAL_ROUND_INTERVAL_US_MAX`]; 0 starts every round as soon as there is work.
    pub log_wal_round_interval_us: u64,
    /// A WAL file is closed and checkpointed (every partition it covers fsynced, then the
    /// file recycled) once it holds this many bytes: at least
    /// `sluice_storage::WAL_FILE_BYTES_MIN`. Smaller files mean a shorter replay after
    /// a crash for more segment fsyncs.
    pub log_wal_file_bytes: u64,
    /// The active segments' tails reach their files with direct I/O instead of through
    /// the page cache (storage `segment_tail.rs`): no page-cache copy of the bytes the WAL
    /// already made durable; and a blocking read of bytes the page cache lacks (a reader
    /// behind the tails' memory) reads them with direct I/O, leaving the page cache alone.
    /// A reader that lags keeps its segment's frozen chunks in memory for the next 3 s. On
    /// by default (README, "Benchmarks").
    pub log_segment_direct_io: bool,
    /// Threads that serve connections and run request handlers (the async runtime's
    /// workers); 0 = [`io_threads_auto`]. Disk waits (fsync, cold reads) run on their own
    /// threads, so these only compute and move bytes between sockets and memory.
    pub io_threads: usize,
    /// Where `/metrics` (Prometheus), `/healthz` and `/readyz` are served over HTTP; off when unset.
    pub metrics_listen: Option<SocketAddr>,
    /// Where the Schema Registry's REST API (Confluent-compatible) is served over HTTP; off
    /// when unset (8081 by convention).
    pub schema_registry_listen: Option<SocketAddr>,
    /// Serve the Schema Registry over HTTPS with the listeners' `ssl.keystore.*` (and
    /// `ssl.client.auth`).
    pub schema_registry_tls: bool,
    /// Where the web console is served over HTTP; off when unset.
    pub console_listen: Option<SocketAddr>,
    /// Serve the web console over HTTPS with the listeners' `ssl.keystore.*`.
    pub console_tls: bool,
    /// A folder of `sluice bench` runs the console's benchmarks pages show.
    pub console_bench_dir: Option<PathBuf>,
    /// How often the console samples each group's lag and each topic's end offsets for its
    /// charts (at least `CONSOLE_HISTORY_INTERVAL_MS_MIN`).
    pub console_history_interval_ms: u64,
    /// Where AMQP 0-9-1 clients (RabbitMQ's) connect; off when unset (5672 by convention).
    pub amqp_listen: Option<SocketAddr>,
    /// Kafka's `listeners` (`NAME://host:port,...`); replaces `listen` when set.
    pub listeners: Option<String>,
    /// Kafka's `advertised.listeners`; a listener not named here advertises its own address.
    #[serde(rename = "advertised.listeners")]
    pub advertised_listeners: Option<String>,
    /// Kafka's `listener.security.protocol.map` (`NAME:PROTOCOL,...`).
    #[serde(rename = "listener.security.protocol.map")]
    pub listener_security_protocol_map: Option<String>,
    /// Kafka's `inter.broker.listener.name`: the listener other nodes replicate from
    /// (default: the first PLAINTEXT listener).
    #[serde(rename = "inter.broker.listener.name")]
    pub inter_broker_listener_name: Option<String>,
    /// Kafka's `ssl.*` settings of TLS listeners (`sluice_security::tls`); PEM only.
    #[serde(rename = "ssl.keystore.type")]
    pub ssl_keystore_type: String,
    #[serde(rename = "ssl.keystore.location")]
    pub ssl_keystore_location: Option<PathBuf>,
    #[serde(rename = "ssl.keystore.certificate.chain")]
    pub ssl_keystore_certificate_chain: Option<String>,
    #[serde(rename = "ssl.keystore.key")]
    pub ssl_keystore_key: Option<String>,
    #[serde(rename = "ssl.key.password", alias = "ssl.keystore.password")]
    pub ssl_key_password: Option<String>,
    #[serde(rename = "ssl.truststore.type")]
    pub ssl_truststore_type: String,
    #[serde(rename = "ssl.truststore.location")]
    pub ssl_truststore_location: Option<PathBuf>,
    #[serde(rename = "ssl.truststore.certificates")]
    pub ssl_truststore_certificates: Option<String>,
    /// none | requested | required.
    #[serde(rename = "ssl.client.auth")]
    pub ssl_client_auth: String,
    /// Kafka's `ssl.principal.mapping.rules`: how a client certificate's subject becomes
    /// its principal name (`sluice_security::PrincipalMappingRules`).
    #[serde(rename = "ssl.principal.mapping.rules", deserialize_with = "principal_mapping_rules")]
    pub ssl_principal_mapping_rules: sluice_security::PrincipalMappingRules,
    /// Kafka's `authorizer.class.name`: any value (e.g.
    /// `org.apache.kafka.metadata.authorizer.StandardAuthorizer`) turns on ACL checks.
    #[serde(rename = "authorizer.class.name")]
    pub authorizer_class_name: Option<String>,
    /// Kafka's `super.users`: `User:admin;User:ops`, allowed everything.
    #[serde(rename = "super.users")]
    pub super_users: String,
    /// Kafka's `allow.everyone.if.no.acl.found`.
    #[serde(rename = "allow.everyone.if.no.acl.found")]
    pub allow_everyone_if_no_acl_found: bool,
    /// Kafka's `sasl.enabled.mechanisms` for SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512.
    #[serde(rename = "sasl.enabled.mechanisms")]
    pub sasl_enabled_mechanisms: String,
    /// Kafka's `sasl.mechanism.inter.broker.protocol`: what followers authenticate with on a
    /// SASL inter-broker listener (default: the strongest enabled mechanism).
    #[serde(rename = "sasl.mechanism.inter.broker.protocol")]
    pub sasl_mechanism_inter_broker_protocol: Option<String>,
    /// Kafka's `connections.max.reauth.ms` (KIP-368): SASL sessions last at most this long
    /// (and no longer than an OAUTHBEARER token); clients re-authenticate on the same
    /// connection before then, or it is closed at their next request. 0: sessions never end.
    #[serde(rename = "connections.max.reauth.ms")]
    pub connections_max_reauth_ms: u64,
    /// Kafka's `sasl.server.max.receive.size`: larger requests before authentication close
    /// the connection ([`SASL_SERVER_MAX_RECEIVE_SIZE_DEFAULT`]).
    #[serde(rename = "sasl.server.max.receive.size")]
    pub sasl_server_max_receive_size: usize,
    /// Kafka's `log.cleaner.enable`: compacted topics are cleaned.
    #[serde(rename = "log.cleaner.enable")]
    pub log_cleaner_enable: bool,
    /// Kafka's `log.cleaner.backoff.ms`: the cleaner's pause when no log needs cleaning.
    #[serde(rename = "log.cleaner.backoff.ms")]
    pub log_cleaner_backoff_ms: u64,
    /// Kafka's `log.cleaner.io.max.bytes.per.second`: the cleaner's read plus write rate.
    #[serde(rename = "log.cleaner.io.max.bytes.per.second")]
    pub log_cleaner_io_max_bytes_per_second: u64,
    /// Kafka's `log.cleaner.dedupe.buffer.size`: memory for the cleaner's key map.
    #[serde(rename = "log.cleaner.dedupe.buffer.size")]
    pub log_cleaner_dedupe_buffer_size: u64,
    /// OAUTHBEARER (`sluice_security::OauthValidator`): a `file:` URL of the identity provider's JWK set.
    #[serde(rename = "sasl.oauthbearer.jwks.endpoint.url")]
    pub sasl_oauthbearer_jwks_endpoint_url: Option<String>,
    /// Comma-separated audiences a token must name one of (unset: not checked).
    #[serde(rename = "sasl.oauthbearer.expected.audience")]
    pub sasl_oauthbearer_expected_audience: String,
    /// The issuer a token must name (unset: not checked).
    #[serde(rename = "sasl.oauthbearer.expected.issuer")]
    pub sasl_oauthbearer_expected_issuer: Option<String>,
    /// The claim that names the principal.
    #[serde(rename = "sasl.oauthbearer.sub.claim.name")]
    pub sasl_oauthbearer_sub_claim_name: String,
    /// Leeway on the token's expiry and not-before times.
    #[serde(rename = "sasl.oauthbearer.clock.skew.seconds")]
    pub sasl_oauthbearer_clock_skew_seconds: u64,
    pub auto_create_topics: bool,
    pub num_partitions: i32,
    pub log_retention_check_interval_ms: u64,
    /// Kafka's `group.initial.rebalance.delay.ms`: the first rebalance of an empty group
    /// waits this long for more members to join.
    pub group_initial_rebalance_delay_ms: u64,
    /// Kafka's `group.consumer.heartbeat.interval.ms` (consumer-protocol groups).
    pub group_consumer_heartbeat_interval_ms: u64,
    /// Kafka's `group.consumer.session.timeout.ms` (consumer-protocol groups).
    pub group_consumer_session_timeout_ms: u64,
    /// Kafka's `offsets.topic.num.partitions` (cluster mode; a single node keeps one local
    /// partition). Fixed once the topic exists.
    pub offsets_topic_num_partitions: i32,
    /// Kafka's `offsets.topic.replication.factor`; 0 = min(3, voters).
    pub offsets_topic_replication_factor: i16,
    /// Kafka's `offsets.topic.segment.bytes`.
    pub offsets_topic_segment_bytes: u64,
    /// Kafka's `group.share.record.lock.duration.ms` (1000-3600000).
    pub group_share_record_lock_duration_ms: u64,
    /// Kafka's `group.share.delivery.count.limit` (2-10).
    pub group_share_delivery_count_limit: i16,
    /// Kafka's `group.share.partition.max.record.locks` (100-10000).
    pub group_share_partition_max_record_locks: usize,
    /// Kafka's `group.share.heartbeat.interval.ms`.
    pub group_share_heartbeat_interval_ms: u64,
    /// Kafka's `group.share.session.timeout.ms` (above the heartbeat interval).
    pub group_share_session_timeout_ms: u64,
    /// Kafka's `transaction.state.log.num.partitions` (cluster mode; a single node keeps
    /// one local partition). Fixed once the topic exists.
    pub transaction_state_num_partitions: i32,
    /// Kafka's `transaction.state.log.replication.factor`; 0 = min(3, voters).
    pub transaction_state_replication_factor: i16,
    /// Kafka's `offsets.retention.minutes`: offsets of a group without members expire
    /// once this long has passed since their commit and since the group had members.
    pub offsets_retention_minutes: u64,
    /// Overrides `offsets_retention_minutes` when set (as `log.retention.ms` overrides
    /// `log.retention.minutes` in Kafka).
    pub offsets_retention_ms: Option<u64>,
    /// Kafka's `offsets.retention.check.interval.ms`.
    pub offsets_retention_check_interval_ms: u64,
    /// An offsets partition writes a compaction snapshot (and drops what it supersedes)
    /// once this many bytes were appended since its last one.
    pub offsets_snapshot_interval_bytes: u64,
    pub topic_defaults: TopicDefaults,
    /// Set to run as a node of a replicated cluster; absent = a single node.
    pub cluster: Option<ClusterConfig>,
    /// `[tiered_storage]`: the object store tiered topics keep their history in.
    pub tiered_storage: TieredStorageConfig,
}

/// `[tiered_storage]`: defined by tiered storage, which checks its bounds.
pub use sluice_tiered::TieredStorageConfig;

/// Longest accepted `cluster.cluster_id` (Kafka's are 22 characters of base64).
pub const CLUSTER_ID_BYTES_MAX: usize = 64;

/// `[cluster]`: this node's part in a replicated cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Where this node's controller (Raft) listens for the other controllers.
    pub controller_listen: SocketAddr,
    /// The controller quorum's initial voters as `id@host:port,...` (Kafka's
    /// `controller.quorum.voters`): whom a new cluster starts with, and where a node finds the
    /// quorum. A node not among them joins as an observer (a broker that does not vote) and
    /// may be made a voter with AddRaftVoter (`kafka-metadata-quorum.sh add-controller`).
    pub voters: String,
    /// How often a broker tells the active controller it is alive.
    pub heartbeat_interval_ms: u64,
    /// A broker silent for this long is fenced and its partitions get new leaders.
    pub session_timeout_ms: u64,
    /// Raft election timeout (the upper bound is twice this).
    pub election_timeout_min_ms: u64,
    /// Kafka's `replica.lag.time.max.ms`.
    pub replica_lag_time_max_ms: u64,
    /// Kafka's `default.replication.factor`, for topics created without one.
    pub default_replication_factor: i16,
    /// Local IP every outgoing connection to another node (controller RPC, replica fetch)
    /// binds to; absent = chosen by the system. Lets a proxy tell nodes apart by peer IP.
    pub source_address: Option<IpAddr>,
    /// A file holding a secret every node of the cluster shares (at least 16 bytes, e.g.
    /// `head -c 32 /dev/urandom | base64`, mode 0600): every controller RPC between nodes is
    /// authenticated with it, and brokers derive their inter-broker credential from it.
    /// Required with more than one voter; a single voter generates its own at first start
    /// (`<data_dir>/controller.secret`).
    pub rpc_secret_file: Option<PathBuf>,
    /// Controller RPC over TLS, with the broker's `ssl.keystore.*` (this node's certificate,
    /// which must name its controller address's host) and `ssl.truststore.*` (the CAs of
    /// the other nodes' certificates). Needs `rpc_secret_file` (who may talk is still
    /// decided by the secret).
    pub rpc_tls: bool,
    /// The cluster's id (Kafka's `cluster.id`); absent = derived from `voters`. Kept in
    /// `<data_dir>/meta.properties`: a data dir of another cluster is refused at startup,
    /// and so are controller RPCs and replica fetches from nodes of another cluster.
    pub cluster_id: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            controller_listen: "127.0.0.1:9093".parse().expect("valid address"),
            voters: String::new(),
            heartbeat_interval_ms: 250,
            session_timeout_ms: 1_500,
            election_timeout_min_ms: 500,
            replica_lag_time_max_ms: sluice_replication::REPLICA_LAG_TIME_MS_DEFAULT,
            default_replication_factor: 3,
            source_address: None,
            rpc_secret_file: None,
            rpc_tls: false,
            cluster_id: None,
        }
    }
}

impl ClusterConfig {
    /// The shared controller-RPC secret read from `rpc_secret_file` (surrounding whitespace
    /// removed), if one is configured.
    pub fn rpc_secret(&self) -> Result<Option<Vec<u8>>, String> {
        self.rpc_secret_file.as_deref().map(sluice_security::read_rpc_secret).transpose()
    }

    /// The voters by node id.
    pub fn voters(&self) -> Result<BTreeMap<i32, String>, String> {
        let mut voters = BTreeMap::new();
        for entry in self.voters.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (id, address) =
                entry.split_once('@').ok_or_else(|| format!("cluster.voters entry {entry:?} is not id@host:port"))?;
            let id: i32 = id.parse().map_err(|_| format!("cluster.voters entry {entry:?} has a bad node id"))?;
            if !address.contains(':') {
                return Err(format!("cluster.voters entry {entry:?} has no port"));
            }
            if voters.insert(id, address.to_string()).is_some() {
                return Err(format!("cluster.voters names node {id} twice"));
            }
        }
        if voters.is_empty() {
            return Err("cluster.voters is empty".into());
        }
        Ok(voters)
    }

    pub fn validate(&self, node_id: i32) -> Result<(), String> {
        let voters = self.voters()?;
        let observer = !voters.contains_key(&node_id);
        if self.heartbeat_interval_ms == 0 || self.session_timeout_ms <= self.heartbeat_interval_ms * 2 {
            return Err("cluster.session_timeout_ms must exceed twice cluster.heartbeat_interval_ms".into());
        }
        if self.election_timeout_min_ms < 50 {
            return Err("cluster.election_timeout_min_ms must be at least 50".into());
        }
        if self.default_replication_factor < 1 {
            return Err("cluster.default_replication_factor must be at least 1".into());
        }
        if let Some(ip) = self.source_address.filter(|ip| ip.is_unspecified() || ip.is_multicast()) {
            return Err(format!("cluster.source_address must be a concrete unicast address, got {ip}"));
        }
        match &self.rpc_secret_file {
            Some(path) => {
                self.rpc_secret().map_err(|error| format!("cluster.rpc_secret_file {}: {error}", path.display()))?;
            }
            None if voters.len() > 1 || observer => {
                return Err(format!(
                    "cluster.rpc_secret_file is not set: the {} nodes authenticate each other with a secret \
                     they share, so that nobody else can vote, replicate or propose changes. Create one (e.g. \
                     `head -c 32 /dev/urandom | base64 > cluster.secret; chmod 600 cluster.secret`), give every node \
                     the same file (--cluster-rpc-secret-file or cluster.rpc_secret_file)",
                    voters.len() + usize::from(observer)
                ));
            }
            None => {}
        }
        if let Some(id) = &self.cluster_id {
            let valid_char = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
            if id.is_empty() || id.len() > CLUSTER_ID_BYTES_MAX || !id.chars().all(valid_char) {
                return Err(format!(
                    "cluster.cluster_id must be 1-{CLUSTER_ID_BYTES_MAX} characters of A-Z a-z 0-9 - _ ., got {id:?}"
                ));
            }
        }
        Ok(())
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        let cleaner = sluice_storage::CleanerSettings::default();
        BrokerConfig {
            node_id: 0,
            listen: "127.0.0.1:9092".parse().expect("valid address"),
            advertised_listener: None,
            data_dir: PathBuf::from("./sluice-data"),
            max_request_bytes: REQUEST_BYTES_MAX_DEFAULT,
            max_connections: CONNECTIONS_MAX_DEFAULT,
            max_connections_per_ip: CONNECTIONS_PER_IP_MAX_DEFAULT,
            max_connections_per_ip_overrides: String::new(),
            connections_max_idle_ms: CONNECTIONS_MAX_IDLE_MS_DEFAULT,
            connection_failed_authentication_delay_ms: CONNECTION_FAILED_AUTHENTICATION_DELAY_MS_DEFAULT,
            request_read_timeout_ms: REQUEST_READ_TIMEOUT_MS_DEFAULT,
            max_inflight_requests_per_connection: INFLIGHT_REQUESTS_PER_CONNECTION_DEFAULT,
            queued_max_request_bytes: QUEUED_MAX_REQUEST_BYTES_DEFAULT,
            queued_max_request_bytes_per_connection: QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION_DEFAULT,
            log_wal: true,
            log_wal_round_interval_us: WAL_ROUND_INTERVAL_US_DEFAULT,
            log_wal_file_bytes: sluice_storage::WAL_FILE_BYTES,
            log_segment_direct_io: true,
            io_threads: 0,
            metrics_listen: None,
            schema_registry_listen: None,
            console_listen: None,
            console_tls: false,
            console_bench_dir: None,
            console_history_interval_ms: 10_000,
            amqp_listen: None,
            schema_registry_tls: false,
            listeners: None,
            advertised_listeners: None,
            listener_security_protocol_map: None,
            inter_broker_listener_name: None,
            ssl_keystore_type: "PEM".into(),
            ssl_keystore_location: None,
            ssl_keystore_certificate_chain: None,
            ssl_keystore_key: None,
            ssl_key_password: None,
            ssl_truststore_type: "PEM".into(),
            ssl_truststore_location: None,
            ssl_truststore_certificates: None,
            ssl_client_auth: "none".into(),
            ssl_principal_mapping_rules: Default::default(),
            sasl_enabled_mechanisms: sluice_security::SASL_MECHANISMS_DEFAULT.into(),
            sasl_mechanism_inter_broker_protocol: None,
            connections_max_reauth_ms: 0,
            sasl_server_max_receive_size: SASL_SERVER_MAX_RECEIVE_SIZE_DEFAULT,
            log_cleaner_enable: cleaner.enabled,
            log_cleaner_backoff_ms: cleaner.backoff_ms,
            log_cleaner_io_max_bytes_per_second: cleaner.io_max_bytes_per_second,
            log_cleaner_dedupe_buffer_size: cleaner.dedupe_buffer_bytes,
            sasl_oauthbearer_jwks_endpoint_url: None,
            sasl_oauthbearer_expected_audience: String::new(),
            sasl_oauthbearer_expected_issuer: None,
            sasl_oauthbearer_sub_claim_name: "sub".into(),
            sasl_oauthbearer_clock_skew_seconds: 30,
            authorizer_class_name: None,
            super_users: String::new(),
            allow_everyone_if_no_acl_found: false,
            auto_create_topics: true,
            num_partitions: 1,
            log_retention_check_interval_ms: 60_000,
            group_initial_rebalance_delay_ms: GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT,
            group_consumer_heartbeat_interval_ms: GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT,
            group_consumer_session_timeout_ms: GROUP_CONSUMER_SESSION_TIMEOUT_MS_DEFAULT,
            offsets_topic_num_partitions: OFFSETS_TOPIC_NUM_PARTITIONS_DEFAULT,
            offsets_topic_replication_factor: 0,
            offsets_topic_segment_bytes: OFFSETS_TOPIC_SEGMENT_BYTES_DEFAULT,
            group_share_record_lock_duration_ms: GROUP_SHARE_RECORD_LOCK_DURATION_MS_DEFAULT,
            group_share_delivery_count_limit: GROUP_SHARE_DELIVERY_COUNT_LIMIT_DEFAULT,
            group_share_partition_max_record_locks: GROUP_SHARE_PARTITION_MAX_RECORD_LOCKS_DEFAULT,
            group_share_heartbeat_interval_ms: GROUP_SHARE_HEARTBEAT_INTERVAL_MS_DEFAULT,
            group_share_session_timeout_ms: GROUP_SHARE_SESSION_TIMEOUT_MS_DEFAULT,
            transaction_state_num_partitions: TRANSACTION_STATE_NUM_PARTITIONS_DEFAULT,
            transaction_state_replication_factor: 0,
            offsets_retention_minutes: OFFSETS_RETENTION_MINUTES_DEFAULT,
            offsets_retention_ms: None,
            offsets_retention_check_interval_ms: OFFSETS_RETENTION_CHECK_INTERVAL_MS_DEFAULT,
            offsets_snapshot_interval_bytes: OFFSETS_SNAPSHOT_INTERVAL_BYTES_DEFAULT,
            topic_defaults: TopicDefaults::default(),
            cluster: None,
            tiered_storage: TieredStorageConfig::default(),
        }
    }
}

/// The smallest request memory budgets accepted (unless `max_request_bytes` is smaller).
const QUEUED_REQUEST_BYTES_MIN: usize = 1024 * 1024;

/// The smallest `log.cleaner.dedupe.buffer.size` (Kafka's minimum is 1 MiB per thread).
const LOG_CLEANER_DEDUPE_BUFFER_MIN: u64 = 1024 * 1024;
/// The shortest interval between the console's history samples.
pub const CONSOLE_HISTORY_INTERVAL_MS_MIN: u64 = 500;

impl BrokerConfig {
    /// The log cleaner's settings.
    pub fn cleaner_settings(&self) -> sluice_storage::CleanerSettings {
        sluice_storage::CleanerSettings {
            enabled: self.log_cleaner_enable,
            backoff_ms: self.log_cleaner_backoff_ms,
            io_max_bytes_per_second: self.log_cleaner_io_max_bytes_per_second,
            dedupe_buffer_bytes: self.log_cleaner_dedupe_buffer_size,
        }
    }

    /// Checks relations between settings; the error says which setting is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.node_id < 0 {
            return Err(format!("node_id must be >= 0, got {}", self.node_id));
        }
        if self.schema_registry_tls && self.schema_registry_listen.is_none() {
            return Err("schema_registry_tls needs schema_registry_listen (--schema-registry-listen)".into());
        }
        self.amqp_listeners()?;
        if self.console_tls && self.console_listen.is_none() {
            return Err("console_tls needs console_listen (--console-listen)".into());
        }
        if self.console_history_interval_ms < CONSOLE_HISTORY_INTERVAL_MS_MIN {
            return Err(format!(
                "console_history_interval_ms must be at least {CONSOLE_HISTORY_INTERVAL_MS_MIN}, got {}",
                self.console_history_interval_ms
            ));
        }
        if self.max_request_bytes < 1024 || self.max_request_bytes > i32::MAX as usize {
            return Err(format!("max_request_bytes must be in [1024, {}], got {}", i32::MAX, self.max_request_bytes));
        }
        if self.log_wal_round_interval_us > WAL_ROUND_INTERVAL_US_MAX {
            return Err(format!(
                "log_wal_round_interval_us must be at most {WAL_ROUND_INTERVAL_US_MAX}, got {}",
                self.log_wal_round_interval_us
            ));
        }
        if self.log_wal_file_bytes < sluice_storage::WAL_FILE_BYTES_MIN {
            return Err(format!(
                "log_wal_file_bytes must be at least {}, got {}",
                sluice_storage::WAL_FILE_BYTES_MIN,
                self.log_wal_file_bytes
            ));
        }
        if self.io_threads > IO_THREADS_MAX {
            return Err(format!(
                "io_threads must be at most {IO_THREADS_MAX} (0 = half the cores), got {}",
                self.io_threads
            ));
        }
        if self.max_connections == 0 || self.max_inflight_requests_per_connection == 0 {
            return Err("max_connections and max_inflight_requests_per_connection must be > 0".into());
        }
        // A request larger than a budget is charged the whole budget (connection.rs), so a
        // budget below max_request_bytes still serves the largest request, one at a time;
        // but a budget smaller than common requests would serialise everything.
        if self.queued_max_request_bytes < self.max_request_bytes.min(QUEUED_REQUEST_BYTES_MIN) {
            return Err(format!(
                "queued_max_request_bytes must be at least {QUEUED_REQUEST_BYTES_MIN} (or max_request_bytes, if smaller), got {}",
                self.queued_max_request_bytes
            ));
        }
        if self.queued_max_request_bytes_per_connection < self.max_request_bytes.min(QUEUED_REQUEST_BYTES_MIN) {
            return Err(format!(
                "queued_max_request_bytes_per_connection must be at least {QUEUED_REQUEST_BYTES_MIN} (or max_request_bytes, if smaller), got {}",
                self.queued_max_request_bytes_per_connection
            ));
        }
        self.validate_connection_limits()?;
        if !(1..=PARTITIONS_PER_TOPIC_MAX).contains(&self.num_partitions) {
            return Err(format!("num_partitions must be in [1, {PARTITIONS_PER_TOPIC_MAX}]"));
        }
        if self.group_initial_rebalance_delay_ms > GROUP_INITIAL_REBALANCE_DELAY_MS_MAX {
            return Err(format!(
                "group_initial_rebalance_delay_ms must be at most {GROUP_INITIAL_REBALANCE_DELAY_MS_MAX}, got {}",
                self.group_initial_rebalance_delay_ms
            ));
        }
        if self.log_cleaner_io_max_bytes_per_second == 0 {
            return Err("log.cleaner.io.max.bytes.per.second must be > 0".into());
        }
        if self.log_cleaner_dedupe_buffer_size < LOG_CLEANER_DEDUPE_BUFFER_MIN {
            return Err(format!("log.cleaner.dedupe.buffer.size must be at least {LOG_CLEANER_DEDUPE_BUFFER_MIN}"));
        }
        self.validate_consumer_group_timing()?;
        self.validate_offsets()?;
        self.advertised_address()?;
        self.inter_broker_listener()?;
        sluice_security::validate(&self.security_settings()?)?;
        if let Some(cluster) = &self.cluster {
            cluster.validate(self.node_id)?;
        }
        self.tiered_storage.validate()?;
        self.topic_defaults.validate()
    }

    /// The limits on what one connection, or one address, may hold and for how long.
    fn validate_connection_limits(&self) -> Result<(), String> {
        if self.sasl_server_max_receive_size == 0 {
            return Err("sasl.server.max.receive.size must be > 0".into());
        }
        if self.max_connections_per_ip > CONNECTIONS_PER_IP_MAX_DEFAULT {
            return Err(format!("max.connections.per.ip must be at most {CONNECTIONS_PER_IP_MAX_DEFAULT}"));
        }
        let overrides = self.connections_per_ip_overrides()?;
        if self.max_connections_per_ip == 0 && overrides.is_empty() {
            return Err("max.connections.per.ip may be 0 only with max.connections.per.ip.overrides".into());
        }
        for (name, value) in [
            ("connections.max.idle.ms", self.connections_max_idle_ms),
            ("request_read_timeout_ms", self.request_read_timeout_ms),
        ] {
            if value < CONNECTION_TIMEOUT_MS_MIN {
                return Err(format!("{name} must be at least {CONNECTION_TIMEOUT_MS_MIN}, got {value}"));
            }
        }
        // As in Kafka: the delayed answer must go out before the idle timeout closes it.
        if self.connection_failed_authentication_delay_ms >= self.connections_max_idle_ms {
            return Err(format!(
                "connection.failed.authentication.delay.ms must be below connections.max.idle.ms ({}), got {}",
                self.connections_max_idle_ms, self.connection_failed_authentication_delay_ms
            ));
        }
        Ok(())
    }

    /// `max.connections.per.ip.overrides` by address.
    pub fn connections_per_ip_overrides(&self) -> Result<HashMap<IpAddr, usize>, String> {
        let mut overrides = HashMap::new();
        for entry in self.max_connections_per_ip_overrides.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || format!("max.connections.per.ip.overrides entry {entry:?} is not address:count");
            let (address, count) = entry.rsplit_once(':').ok_or_else(bad)?;
            let address = address.trim().trim_start_matches('[').trim_end_matches(']');
            let address: IpAddr = address.parse().map_err(|_| {
                format!("max.connections.per.ip.overrides entry {entry:?}: {address:?} is not an IP address")
            })?;
            let count: usize = count.trim().parse().map_err(|_| bad())?;
            if overrides.insert(address, count).is_some() {
                return Err(format!("max.connections.per.ip.overrides names {address} twice"));
            }
        }
        Ok(overrides)
    }

    fn validate_offsets(&self) -> Result<(), String> {
        if !(1..=PARTITIONS_PER_TOPIC_MAX).contains(&self.offsets_topic_num_partitions) {
            return Err(format!("offsets_topic_num_partitions must be in [1, {PARTITIONS_PER_TOPIC_MAX}]"));
        }
        if !(1_000..=3_600_000).contains(&self.group_share_record_lock_duration_ms) {
            return Err("group_share_record_lock_duration_ms must be in [1000, 3600000]".into());
        }
        if !(2..=10).contains(&self.group_share_delivery_count_limit) {
            return Err("group_share_delivery_count_limit must be in [2, 10]".into());
        }
        if !(100..=10_000).contains(&self.group_share_partition_max_record_locks) {
            return Err("group_share_partition_max_record_locks must be in [100, 10000]".into());
        }
        if self.group_share_heartbeat_interval_ms < 100
            || self.group_share_session_timeout_ms <= self.group_share_heartbeat_interval_ms
        {
            return Err(
                "group_share_heartbeat_interval_ms must be 100 or more and below group_share_session_timeout_ms".into(),
            );
        }
        if !(1..=PARTITIONS_PER_TOPIC_MAX).contains(&self.transaction_state_num_partitions) {
            return Err(format!("transaction_state_num_partitions must be in [1, {PARTITIONS_PER_TOPIC_MAX}]"));
        }
        if self.transaction_state_replication_factor < 0 {
            return Err("transaction_state_replication_factor must be 0 (automatic) or more".into());
        }
        if self.offsets_topic_replication_factor < 0 {
            return Err("offsets_topic_replication_factor must be 0 (automatic) or more".into());
        }
        if self.offsets_topic_segment_bytes < OFFSETS_TOPIC_SEGMENT_BYTES_MIN {
            return Err(format!("offsets_topic_segment_bytes must be at least {OFFSETS_TOPIC_SEGMENT_BYTES_MIN}"));
        }
        if self.offsets_retention_ms() < 1 || self.offsets_retention_check_interval_ms < 1 {
            return Err("offsets_retention_minutes/_ms and offsets_retention_check_interval_ms must be positive".into());
        }
        if self.offsets_snapshot_interval_bytes < OFFSETS_SNAPSHOT_INTERVAL_BYTES_MIN {
            return Err(format!(
                "offsets_snapshot_interval_bytes must be at least {OFFSETS_SNAPSHOT_INTERVAL_BYTES_MIN}"
            ));
        }
        Ok(())
    }

    /// The effective offsets retention.
    pub fn offsets_retention_ms(&self) -> i64 {
        let ms = self.offsets_retention_ms.unwrap_or(self.offsets_retention_minutes.saturating_mul(60_000));
        i64::try_from(ms).unwrap_or(i64::MAX)
    }

    fn validate_consumer_group_timing(&self) -> Result<(), String> {
        let heartbeat_ms = self.group_consumer_heartbeat_interval_ms;
        let session_ms = self.group_consumer_session_timeout_ms;
        if !(GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_MIN..=GROUP_CONSUMER_TIMEOUT_MS_MAX).contains(&heartbeat_ms) {
            return Err(format!(
                "group_consumer_heartbeat_interval_ms must be in [{GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_MIN}, \
                 {GROUP_CONSUMER_TIMEOUT_MS_MAX}], got {heartbeat_ms}"
            ));
        }
        if !(GROUP_CONSUMER_SESSION_TIMEOUT_MS_MIN..=GROUP_CONSUMER_TIMEOUT_MS_MAX).contains(&session_ms) {
            return Err(format!(
                "group_consumer_session_timeout_ms must be in [{GROUP_CONSUMER_SESSION_TIMEOUT_MS_MIN}, \
                 {GROUP_CONSUMER_TIMEOUT_MS_MAX}], got {session_ms}"
            ));
        }
        if heartbeat_ms >= session_ms {
            return Err(format!(
                "group_consumer_heartbeat_interval_ms ({heartbeat_ms}) must be below group_consumer_session_timeout_ms \
                 ({session_ms})"
            ));
        }
        Ok(())
    }

    /// The listeners, in the order `listeners` names them (the first is the one other
    /// nodes use in a cluster unless `inter.broker.listener.name` says otherwise); without
    /// `listeners`, one PLAINTEXT listener on `listen`, advertised as `advertised_listener`.
    pub fn listeners(&self) -> Result<Vec<Listener>, String> {
        let Some(listeners) = &self.listeners else {
            return Ok(vec![Listener {
                name: "PLAINTEXT".into(),
                protocol: SecurityProtocol::Plaintext,
                bind: self.listen,
                advertised: self.advertised_address()?,
            }]);
        };
        if self.listen != BrokerConfig::default().listen || self.advertised_listener.is_some() {
            return Err("set either `listeners` (and `advertised.listeners`) or `listen`/`advertised_listener`, \
                        not both"
                .into());
        }
        sluice_security::parse_listeners(
            listeners,
            self.advertised_listeners.as_deref(),
            self.listener_security_protocol_map.as_deref(),
        )
    }

    /// The AMQP 0-9-1 ports: `amqp_listen` (plain), and the `AMQP://` / `AMQPS://` entries of
    /// `listeners`. Setting both ways is refused: one place says where AMQP is served.
    pub fn amqp_listeners(&self) -> Result<Vec<sluice_security::AmqpListener>, String> {
        let named = match &self.listeners {
            None => Vec::new(),
            Some(listeners) => sluice_security::parse_amqp_listeners(
                listeners,
                self.advertised_listeners.as_deref(),
                self.listener_security_protocol_map.as_deref(),
            )?,
        };
        match self.amqp_listen {
            None => Ok(named),
            Some(_) if !named.is_empty() => {
                Err("set either `amqp_listen` or AMQP:// listeners in `listeners`, not both".into())
            }
            Some(bind) => Ok(vec![sluice_security::AmqpListener { name: "AMQP".into(), bind, tls: false }]),
        }
    }

    /// Index of the listener other nodes fetch from: `inter.broker.listener.name`, else the
    /// first PLAINTEXT listener, else the first one.
    pub fn inter_broker_listener(&self) -> Result<usize, String> {
        sluice_security::inter_broker_listener(&self.listeners()?, self.inter_broker_listener_name.as_deref())
    }

    /// What the security checks read of this configuration.
    pub fn security_settings(&self) -> Result<SecuritySettings, String> {
        let listeners = self.listeners()?;
        let inter_broker_listener =
            sluice_security::inter_broker_listener(&listeners, self.inter_broker_listener_name.as_deref())?;
        Ok(SecuritySettings {
            listeners,
            inter_broker_listener,
            sasl_enabled_mechanisms: self.sasl_enabled_mechanisms.clone(),
            sasl_mechanism_inter_broker_protocol: self.sasl_mechanism_inter_broker_protocol.clone(),
            authorizer_class_name: self.authorizer_class_name.clone(),
            super_users: self.super_users.clone(),
            allow_everyone_if_no_acl_found: self.allow_everyone_if_no_acl_found,
            tls: self.tls_settings(),
            oauth: OauthSettings {
                jwks_endpoint_url: self.sasl_oauthbearer_jwks_endpoint_url.clone(),
                expected_audience: self.sasl_oauthbearer_expected_audience.clone(),
                expected_issuer: self.sasl_oauthbearer_expected_issuer.clone(),
                sub_claim_name: self.sasl_oauthbearer_sub_claim_name.clone(),
                clock_skew_seconds: self.sasl_oauthbearer_clock_skew_seconds,
            },
            cluster: self.cluster.as_ref().map(|cluster| ClusterSecuritySettings {
                rpc_secret_file: cluster.rpc_secret_file.clone(),
                rpc_tls: cluster.rpc_tls,
            }),
        })
    }

    /// The `ssl.*` settings.
    pub fn tls_settings(&self) -> TlsSettings {
        TlsSettings {
            keystore_type: self.ssl_keystore_type.clone(),
            keystore_location: self.ssl_keystore_location.clone(),
            keystore_certificate_chain: self.ssl_keystore_certificate_chain.clone(),
            keystore_key: self.ssl_keystore_key.clone(),
            key_password: self.ssl_key_password.clone(),
            truststore_type: self.ssl_truststore_type.clone(),
            truststore_location: self.ssl_truststore_location.clone(),
            truststore_certificates: self.ssl_truststore_certificates.clone(),
            client_auth: self.ssl_client_auth.clone(),
        }
    }

    /// (host, port) advertised in Metadata.
    pub fn advertised_address(&self) -> Result<(String, i32), String> {
        match &self.advertised_listener {
            Some(text) => {
                let (host, port) =
                    text.rsplit_once(':').ok_or_else(|| format!("advertised_listener {text:?} is not host:port"))?;
                let port: u16 = port.parse().map_err(|_| format!("advertised_listener {text:?} has a bad port"))?;
                Ok((host.to_string(), i32::from(port)))
            }
            None => {
                let ip = if self.listen.ip().is_unspecified() {
                    "127.0.0.1".to_string()
                } else {
                    self.listen.ip().to_string()
                };
                Ok((ip, i32::from(self.listen.port())))
            }
        }
    }
}

/// `ssl.principal.mapping.rules` parsed where the config is read, so a bad rule stops the
/// start with its reason.
fn principal_mapping_rules<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<sluice_security::PrincipalMappingRules, D::Error> {
    let text = String::deserialize(deserializer)?;
    sluice_security::PrincipalMappingRules::parse(&text).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listeners_config(listeners: &str) -> BrokerConfig {
        BrokerConfig { listeners: Some(listeners.into()), ..BrokerConfig::default() }
    }

    #[test]
    fn without_listeners_one_plaintext_listener_on_listen() {
        let listeners = BrokerConfig::default().listeners().unwrap();
        assert_eq!(listeners.len(), 1);
        assert_eq!(listeners[0].protocol, SecurityProtocol::Plaintext);
        assert_eq!(listeners[0].advertised, ("127.0.0.1".to_string(), 9092));
    }

    #[test]
    fn listeners_and_listen_are_not_both_set() {
        let both = BrokerConfig { listen: "127.0.0.1:1".parse().unwrap(), ..listeners_config("PLAINTEXT://:9092") };
        assert!(both.listeners().unwrap_err().contains("not both"));
        let mut named = listeners_config("CLIENT://127.0.0.1:9092");
        named.listener_security_protocol_map = Some("CLIENT:SASL_SSL".into());
        assert_eq!(named.listeners().unwrap()[0].protocol, SecurityProtocol::SaslSsl);
    }

    fn check_cluster(change: impl FnOnce(&mut ClusterConfig), expected: Result<(), &str>) {
        let mut cluster = ClusterConfig { voters: "1@127.0.0.1:9093".to_string(), ..ClusterConfig::default() };
        change(&mut cluster);
        let config = BrokerConfig { node_id: 1, cluster: Some(cluster), ..BrokerConfig::default() };
        match (config.validate(), expected) {
            (Ok(()), Ok(())) => {}
            (Err(error), Err(part)) => assert!(error.contains(part), "{error}"),
            (got, expected) => panic!("got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn request_memory_budgets() {
        let config = BrokerConfig::default();
        assert!(config.validate().is_ok());
        assert!(config.queued_max_request_bytes >= config.max_request_bytes);
        // Kafka's name and the former produce-only name both set the broker-wide budget.
        for key in ["queued_max_request_bytes", "queued.max.request.bytes", "produce_memory_bytes"] {
            let parsed: BrokerConfig = serde_json::from_value(serde_json::json!({ key: 3 << 20 })).unwrap();
            assert_eq!(parsed.queued_max_request_bytes, 3 << 20, "{key}");
        }
        // Below max_request_bytes is allowed (a larger request is charged the whole budget,
        // and runs alone), but not below 1 MiB.
        let small = BrokerConfig { queued_max_request_bytes: 2 << 20, ..BrokerConfig::default() };
        assert!(small.validate().is_ok());
        let tiny = BrokerConfig { queued_max_request_bytes: 64 << 10, ..BrokerConfig::default() };
        assert!(tiny.validate().unwrap_err().contains("queued_max_request_bytes"));
        let tiny = BrokerConfig { queued_max_request_bytes_per_connection: 1000, ..BrokerConfig::default() };
        assert!(tiny.validate().unwrap_err().contains("queued_max_request_bytes_per_connection"));
        // Unless every request is smaller.
        let small_requests = BrokerConfig {
            max_request_bytes: 4096,
            queued_max_request_bytes_per_connection: 4096,
            ..BrokerConfig::default()
        };
        assert!(small_requests.validate().is_ok());
    }

    #[test]
    fn connection_limits_take_kafka_names_and_refuse_bad_values() {
        let parsed: BrokerConfig = serde_json::from_value(serde_json::json!({
            "max.connections": 50,
            "max.connections.per.ip": 5,
            "max.connections.per.ip.overrides": "10.0.0.1:7",
            "connections.max.idle.ms": 2_000,
            "connection.failed.authentication.delay.ms": 250,
        }))
        .unwrap();
        assert!(parsed.validate().is_ok());
        assert_eq!((parsed.max_connections, parsed.max_connections_per_ip), (50, 5));
        assert_eq!(parsed.connections_per_ip_overrides().unwrap()[&"10.0.0.1".parse::<IpAddr>().unwrap()], 7);
        assert_eq!((parsed.connections_max_idle_ms, parsed.connection_failed_authentication_delay_ms), (2_000, 250));
        let defaults = BrokerConfig::default();
        assert_eq!(defaults.max_connections_per_ip, i32::MAX as usize, "Kafka's default: no limit");
        assert_eq!(defaults.connections_max_idle_ms, 600_000);
        assert_eq!(defaults.connection_failed_authentication_delay_ms, 100);
        for (bad, expected) in [
            (BrokerConfig { connections_max_idle_ms: 0, ..BrokerConfig::default() }, "connections.max.idle.ms"),
            (BrokerConfig { request_read_timeout_ms: 10, ..BrokerConfig::default() }, "request_read_timeout_ms"),
            (
                BrokerConfig {
                    connections_max_idle_ms: 1_000,
                    connection_failed_authentication_delay_ms: 1_000,
                    ..BrokerConfig::default()
                },
                "connection.failed.authentication.delay.ms",
            ),
            (BrokerConfig { max_connections_per_ip: usize::MAX, ..BrokerConfig::default() }, "max.connections.per.ip"),
        ] {
            let error = bad.validate().unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn wal_round_interval_is_bounded() {
        assert_eq!(BrokerConfig::default().log_wal_round_interval_us, WAL_ROUND_INTERVAL_US_DEFAULT);
        for (interval, valid) in [(0, true), (WAL_ROUND_INTERVAL_US_MAX, true), (WAL_ROUND_INTERVAL_US_MAX + 1, false)]
        {
            let config = BrokerConfig { log_wal_round_interval_us: interval, ..BrokerConfig::default() };
            match config.validate() {
                Ok(()) => assert!(valid, "{interval} accepted"),
                Err(error) => assert!(!valid && error.contains("log_wal_round_interval_us"), "{interval}: {error}"),
            }
        }
    }

    #[test]
    fn cluster_source_address() {
        check_cluster(|_| {}, Ok(()));
        check_cluster(|cluster| cluster.source_address = Some("127.0.0.11".parse().unwrap()), Ok(()));
        check_cluster(|cluster| cluster.source_address = Some("0.0.0.0".parse().unwrap()), Err("source_address"));
        check_cluster(|cluster| cluster.source_address = Some("ff02::1".parse().unwrap()), Err("source_address"));
    }
}
