//! The steps of opening a broker (`Broker::open`), each building the parts of one concern
//! from the configuration: the log manager and its write mode, the node's role in a
//! cluster, the recovered logs, tiered storage, security, and the coordinators.

use std::io;
use std::sync::Arc;

use sluice_config::BrokerConfig;
use sluice_coordinator::group::{self, GroupCoordinator};
use sluice_coordinator::share::{self, ShareCoordinator};
use sluice_coordinator::txn::TransactionCoordinator;
use sluice_meta::meta_properties;
use sluice_meta::topics::TopicRegistry;
use sluice_replication::ReplicaManager;
use sluice_storage::{LogConfig, LogManager, TopicPartition};
use sluice_tiered::{RemoteLogController, TieredStorage};

use crate::{cluster_id_for, cluster_link, metrics};

fn invalid(error: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, error)
}

/// The log manager of `<data>/logs`, with or without the WAL. Before any log opens, every
/// segment tail takes its write mode: direct I/O only where the filesystem's is trusted
/// (`durable::direct_io_trusted`; not on FUSE, say).
pub(crate) fn log_manager(config: &BrokerConfig) -> io::Result<LogManager> {
    let direct_io_trusted = sluice_storage::durable::direct_io_trusted(&config.data_dir);
    if config.log_segment_direct_io && !direct_io_trusted {
        tracing::info!(
            dir = %config.data_dir.display(),
            "log_segment_direct_io is on, but this filesystem's direct I/O is not trusted: segments are written through the page cache"
        );
    }
    sluice_storage::set_direct_writes(config.log_segment_direct_io && direct_io_trusted);
    let logs_dir = config.data_dir.join("logs");
    let logs = if config.log_wal {
        LogManager::with_wal_files_of(&logs_dir, config.log_wal_file_bytes)?
    } else {
        LogManager::new(&logs_dir)?
    };
    logs.syncer().set_wal_round_interval(std::time::Duration::from_micros(config.log_wal_round_interval_us));
    Ok(logs)
}

/// A cluster node's replica manager and link to the controller (none on a single node).
pub(crate) type ClusterRole = (Option<Arc<ReplicaManager>>, Option<Arc<cluster_link::ClusterLink>>);

/// In a cluster: the replica manager and the link to the controller. The controller's
/// metadata then decides which logs this node hosts; they are opened as it arrives
/// (`cluster_link`), not from the local registry, which is emptied here.
pub(crate) fn cluster_role(config: &BrokerConfig, topics: &TopicRegistry) -> io::Result<ClusterRole> {
    let Some(cluster_config) = &config.cluster else { return Ok((None, None)) };
    topics.replace_all(Vec::new());
    let cluster_id = cluster_config.cluster_id.clone().unwrap_or_else(|| cluster_id_for(&cluster_config.voters));
    let directory_id = meta_properties::check_or_write(&config.data_dir, config.node_id, &cluster_id)?;
    topics.set_cluster_id(cluster_id);
    topics.use_node_producer_ids(config.node_id);
    let link = Arc::new(cluster_link::ClusterLink::new(directory_id));
    let replicas = ReplicaManager::new(config.node_id, link.clone(), cluster_config.replica_lag_time_max_ms);
    Ok((Some(replicas), Some(link)))
}

/// Opens (recovering) the log of every partition the registry holds; returns how many.
pub(crate) fn recover_logs(config: &BrokerConfig, topics: &TopicRegistry, logs: &LogManager) -> io::Result<usize> {
    let wanted: Vec<(TopicPartition, LogConfig)> = topics
        .all()
        .into_iter()
        .flat_map(|topic| {
            let log_config = config.topic_defaults.log_config(&topic.configs);
            (0..topic.partitions).map(move |p| (TopicPartition::new(topic.name.clone(), p), log_config.clone()))
        })
        .collect();
    let partition_count = wanted.len();
    logs.open_all(wanted)?;
    Ok(partition_count)
}

/// The object store of tiered topics, attached to their local logs; `None` when
/// `tiered_storage.enabled` is off, or in a cluster without a shared `tiered_storage.url`
/// (the per-node default directory cannot be the one store every node shares).
pub(crate) fn tiered_storage(
    config: &BrokerConfig,
    topics: &TopicRegistry,
    logs: &LogManager,
    cluster: Option<&Arc<cluster_link::ClusterLink>>,
    metrics: &metrics::Metrics,
) -> io::Result<Option<Arc<TieredStorage>>> {
    let shared_store = config.cluster.is_none() || config.tiered_storage.url.is_some();
    if !config.tiered_storage.enabled || !shared_store {
        return Ok(None);
    }
    let controller = cluster.cloned().map(|link| link as Arc<dyn RemoteLogController>);
    let tiered = TieredStorage::open(&config.tiered_storage, &config.data_dir, controller, metrics.tiered.clone())?;
    for topic in topics.all().into_iter().filter(sluice_tiered::is_tiered) {
        for p in 0..topic.partitions {
            if let Some(log) = logs.get_in(&topic.name, p) {
                tiered.attach(&topic, &log, p);
            }
        }
    }
    Ok(Some(Arc::new(tiered)))
}

/// Who may connect and what they may do.
pub(crate) struct Security {
    pub(crate) listeners: Vec<sluice_security::Listener>,
    pub(crate) inter_broker_listener: usize,
    pub(crate) inter_broker: sluice_security::InterBroker,
    pub(crate) oauth: Option<sluice_security::OauthValidator>,
    pub(crate) security: sluice_security::SecurityStore,
    pub(crate) authorizer: Option<sluice_security::Authorizer>,
    pub(crate) quotas: sluice_security::quota::QuotaManager,
}

/// The listeners, the authenticators and authorizer, and the store of credentials, ACLs
/// and quotas (local on a single node, the controller's metadata in a cluster).
pub(crate) fn security(config: &BrokerConfig) -> io::Result<Security> {
    let settings = config.security_settings().map_err(invalid)?;
    let authorizer = sluice_security::Authorizer::new(&settings);
    let inter_broker = sluice_security::InterBroker::new(&settings).map_err(invalid)?;
    let oauth = sluice_security::oauth_validator(&settings).map_err(invalid)?;
    let sluice_security::SecuritySettings { listeners, inter_broker_listener, .. } = settings;
    let quotas = sluice_security::quota::QuotaManager::default();
    let security = match &config.cluster {
        None => sluice_security::SecurityStore::open_local(&config.data_dir)?,
        Some(_) => sluice_security::SecurityStore::replicated(),
    };
    security.with_local_quotas(|local| quotas.set_configured(local));
    Ok(Security { listeners, inter_broker_listener, inter_broker, oauth, security, authorizer, quotas })
}

/// The group, share and transaction coordinators.
pub(crate) struct Coordinators {
    pub(crate) groups: Arc<GroupCoordinator>,
    pub(crate) shares: Arc<ShareCoordinator>,
    pub(crate) transactions: Arc<TransactionCoordinator>,
}

/// The coordinators: on a single node over their local partitions (replayed here); in a
/// cluster serving nothing until the metadata says which internal partitions this node
/// leads.
pub(crate) fn coordinators(
    config: &BrokerConfig,
    topics: &TopicRegistry,
    logs: &LogManager,
) -> io::Result<Coordinators> {
    let timing = group::state::Timing {
        initial_rebalance_delay_ms: config.group_initial_rebalance_delay_ms as i64,
        consumer_heartbeat_interval_ms: config.group_consumer_heartbeat_interval_ms as i32,
        consumer_session_timeout_ms: config.group_consumer_session_timeout_ms as i64,
    };
    let settings = group::shards::OffsetsSettings {
        retention_ms: config.offsets_retention_ms(),
        retention_check_interval_ms: config.offsets_retention_check_interval_ms as i64,
        snapshot_interval_bytes: config.offsets_snapshot_interval_bytes,
    };
    let groups = match &config.cluster {
        None => {
            topics.register_local_offsets_topic(config.offsets_topic_segment_bytes);
            GroupCoordinator::open_local(&config.data_dir, timing, settings, config.offsets_topic_segment_bytes)?
        }
        Some(_) => GroupCoordinator::replicated(timing, settings),
    };
    let share_settings = share::ShareSettings {
        record_lock_duration_ms: config.group_share_record_lock_duration_ms as i64,
        delivery_count_limit: config.group_share_delivery_count_limit,
        partition_max_record_locks: config.group_share_partition_max_record_locks,
        heartbeat_interval_ms: config.group_share_heartbeat_interval_ms as i32,
        session_timeout_ms: config.group_share_session_timeout_ms as i64,
    };
    let shares = Arc::new(match &config.cluster {
        None => ShareCoordinator::open_local(&config.data_dir, share_settings)?,
        Some(_) => ShareCoordinator::replicated(share_settings),
    });
    let transactions = Arc::new(match &config.cluster {
        None => TransactionCoordinator::open_local(&config.data_dir, logs.syncer())?,
        Some(_) => TransactionCoordinator::replicated(),
    });
    Ok(Coordinators { groups, shares, transactions })
}
