//! The durable share-partition state: Kafka's share coordinator and its internal topic
//! `__share_group_state`.
//!
//! Which records of a topic partition a share group has acknowledged (its window: start,
//! in-flight states, delivery counts, dead letters to copy) is kept in memory by the
//! *partition leader*, which serves ShareFetch and ShareAcknowledge (`share/mod.rs`). Every
//! change is written here, keyed by (group, topic, partition), and acknowledged to the
//! client only once durable. The store is sharded like the other coordinators' logs: a
//! share-partition belongs to partition `abs(hash("group:topic:partition")) % N` of the
//! state topic, and that partition's leader stores it in a [`StateLog`]. A single node
//! holds the one local partition `<data_dir>/share/__share_group_state-0`; in a cluster
//! the topic is replicated (created at formation, min(3, nodes) replicas), a write is
//! durable once past the high watermark, and a data partition leader reaches a state
//! partition led elsewhere with Kafka's broker-to-broker ReadShareGroupState,
//! WriteShareGroupState and ReadShareGroupStateSummary.
//!
//! Fencing: each state carries the leader epoch of the data partition leader that wrote
//! it and a version the leader increments per change. A read by a new leader raises the
//! stored epoch (durably, before the answer), so a deposed leader's later writes are
//! refused (FENCED_LEADER_EPOCH) and can never overwrite what the new leader serves. Writes
//! of one leader may arrive out of order (parallel connections); each carries the whole
//! state, so an older version than the stored one is already included and is answered
//! once everything written so far is durable.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::{
    delete_share_group_state_request, initialize_share_group_state_request, read_share_group_state_request,
    read_share_group_state_summary_request, write_share_group_state_request, ApiKey, DeleteShareGroupStateRequest,
    InitializeShareGroupStateRequest, ReadShareGroupStateRequest, ReadShareGroupStateSummaryRequest, RequestKind,
    ResponseKind, WriteShareGroupStateRequest,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use parking_lot::{Mutex, RwLock};
use sluice_storage::Syncer;
use uuid::Uuid;

use super::partition::StoredPartition;
use super::{config_log_key, parse_partition_log_key, partition_log_key, GroupConfigs, PartitionKey, ShareRecord};
use crate::leadership::{CoordinatorShard, Load, NotServed, Shards};
use crate::placement::IncomingLeaderships;
use crate::state_log::{PendingChange, StateLog, STATE_LOG_WRITE_TIMEOUT_MS};
use crate::CoordinatorHost;
use sluice_replication::Replica;

pub use sluice_meta::internal::SHARE_STATE_TOPIC;
/// Partitions of `__share_group_state` in a cluster (Kafka's
/// `share.coordinator.state.topic.num.partitions` is 50; share-partitions are fewer than
/// groups' offsets, so fewer partitions keep a cluster's internal replicas few).
pub const SHARE_STATE_NUM_PARTITIONS: i32 = 10;
/// The version of the share-state RPCs brokers send each other (Kafka's only one).
const SHARE_STATE_RPC_VERSION: i16 = 0;
/// Kafka's delivery states in a state batch, and Sluice's two for dead letters still to
/// copy (carried only between Sluice brokers).
const DEAD_LETTER_REJECTED: i8 = 100;
const DEAD_LETTER_DELIVERY_LIMIT: i8 = 101;

/// One partition of the state topic this node leads.
struct StateShard {
    log: StateLog<ShareRecord>,
    /// The last state of each share-partition key (`partition_log_key`).
    states: Mutex<HashMap<String, StoredPartition>>,
    /// Single node only: the share groups' configs (a cluster keeps them in its metadata).
    configs: Mutex<BTreeMap<String, GroupConfigs>>,
}

/// What [`ShareStateStore::summary`] answers of a stored share-partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub version: i32,
    /// -1 after an administrator's change no leader has read yet.
    pub leader_epoch: i32,
    pub start: i64,
    /// Records at or past `start` already acknowledged or archived (KIP-1226's
    /// DeliveryCompleteCount); `None` when the state lives on another node.
    pub delivery_complete: Option<i64>,
}

/// An administrator's change of a share-partition (the group has no members).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminChange {
    /// AlterShareGroupOffsets: consume from this offset (nothing in flight).
    Start(i64),
    /// DeleteShareGroupOffsets, DeleteGroups: forget the share-partition.
    Delete,
}

impl CoordinatorShard for StateShard {
    fn leader_epoch(&self) -> i32 {
        self.log.coordinator_epoch()
    }
}

/// Where a share-partition's state is kept.
enum Route {
    Here(Arc<StateShard>),
    Node(i32),
}

pub struct ShareStateStore {
    shards: RwLock<Shards<StateShard>>,
    /// Cluster mode: a creation of `__share_group_state` is under way.
    pub creating_topic: AtomicBool,
    peers: crate::txn::markers::PeerPool,
}

impl StateShard {
    fn new(log: StateLog<ShareRecord>, stored: BTreeMap<String, ShareRecord>) -> StateShard {
        let mut states = HashMap::new();
        let mut configs = BTreeMap::new();
        for (key, record) in stored {
            match (key.split('\u{0}').next(), record) {
                (Some("p"), ShareRecord::Partition(state)) => {
                    states.insert(key, state);
                }
                (Some("c"), ShareRecord::GroupConfig(group_configs)) => {
                    let group = key.split('\u{0}').nth(1).unwrap_or_default().to_string();
                    configs.insert(group, group_configs);
                }
                _ => tracing::warn!(key, "skipping an unreadable share state record"),
            }
        }
        StateShard { log, states: Mutex::new(states), configs: Mutex::new(configs) }
    }

    /// The state of `key` for a leader at `leader_epoch`, which from now on fences older
    /// leaders; with what to wait for before answering.
    fn read(
        &self,
        key: &str,
        leader_epoch: i32,
        syncer: &Syncer,
    ) -> Result<(Option<StoredPartition>, PendingChange), ResponseError> {
        let mut states = self.states.lock();
        let Some(state) = states.get_mut(key) else { return Ok((None, self.log.written())) };
        if state.leader_epoch > leader_epoch {
            return Err(ResponseError::FencedLeaderEpoch);
        }
        if state.deleted {
            let change = self.log.remove(key, syncer)?;
            states.remove(key);
            return Ok((None, change));
        }
        if state.reset || state.leader_epoch < leader_epoch {
            let mut raised = state.clone();
            raised.leader_epoch = leader_epoch;
            raised.reset = false;
            let change = self.log.append(key, &ShareRecord::Partition(raised.clone()), syncer)?;
            *state = raised;
            return Ok((Some(state.clone()), change));
        }
        Ok((Some(state.clone()), self.log.written()))
    }

    fn write(&self, key: &str, state: StoredPartition, syncer: &Syncer) -> Result<PendingChange, ResponseError> {
        let mut states = self.states.lock();
        if let Some(current) = states.get(key) {
            if state.leader_epoch < current.leader_epoch || current.reset {
                return Err(ResponseError::FencedLeaderEpoch);
            }
            if state.leader_epoch == current.leader_epoch && state.version <= current.version {
                return Ok(self.log.written());
            }
        }
        let change = self.log.append(key, &ShareRecord::Partition(state.clone()), syncer)?;
        states.insert(key.to_string(), state);
        Ok(change)
    }

    /// Of `key`, if stored: its version, the leader epoch it was written at (-1 after an
    /// administrator's change, which no leader has read yet) and its start offset.
    fn summary(&self, key: &str) -> Option<Summary> {
        let states = self.states.lock();
        let state = states.get(key).filter(|state| !state.deleted)?;
        let leader_epoch = if state.reset { -1 } else { state.leader_epoch };
        let delivery_complete = state.delivery_complete();
        Some(Summary {
            version: state.version,
            leader_epoch,
            start: state.start,
            delivery_complete: Some(delivery_complete),
        })
    }

    /// An administrator's change of `key` (a new start offset, or a deletion); the leader
    /// serving it must read it again before it writes.
    fn administer(&self, key: &str, change: AdminChange, syncer: &Syncer) -> Result<PendingChange, ResponseError> {
        let mut states = self.states.lock();
        let current = states.get(key);
        if matches!(change, AdminChange::Delete) && current.is_none_or(|state| state.deleted) {
            return Ok(self.log.written());
        }
        let start = match change {
            AdminChange::Start(start) => start,
            AdminChange::Delete => current.map_or(0, |state| state.start),
        };
        let state = StoredPartition {
            start,
            end: start,
            runs: Vec::new(),
            dead_letters: Vec::new(),
            leader_epoch: current.map_or(0, |state| state.leader_epoch),
            version: current.map_or(0, |state| state.version),
            reset: true,
            deleted: matches!(change, AdminChange::Delete),
        };
        let change = self.log.append(key, &ShareRecord::Partition(state.clone()), syncer)?;
        states.insert(key.to_string(), state);
        Ok(change)
    }

    /// Compacts the log when due: every live value again, then the start moves past the
    /// old ones once that is durable.
    async fn upkeep(&self, syncer: &Syncer) {
        if !self.log.snapshot_due() {
            return;
        }
        let snapshot = {
            let states = self.states.lock();
            let configs = self.configs.lock();
            let mut entries: BTreeMap<String, ShareRecord> =
                states.iter().map(|(key, state)| (key.clone(), ShareRecord::Partition(state.clone()))).collect();
            entries.extend(configs.iter().map(|(g, c)| (config_log_key(g), ShareRecord::GroupConfig(c.clone()))));
            self.log.write_snapshot(&entries, syncer).ok().flatten()
        };
        if let Some((start, change)) = snapshot {
            if self.log.wait_durable(change).await.is_ok() {
                self.log.truncate_before(start);
            }
        }
    }
}

impl ShareStateStore {
    /// Single node: opens (replaying) the local state partition; returns the stored group
    /// configs too.
    pub fn open_local(data_dir: &Path) -> io::Result<(ShareStateStore, BTreeMap<String, GroupConfigs>)> {
        let path = data_dir.join("share").join(format!("{SHARE_STATE_TOPIC}-0"));
        let (log, stored) = StateLog::<ShareRecord>::open_local(&path)?;
        let shard = StateShard::new(log, stored);
        let configs = shard.configs.lock().clone();
        tracing::info!(share_partitions = shard.states.lock().len(), "replayed share group state");
        let shards = Shards::local(shard);
        Ok((ShareStateStore::new(shards), configs))
    }

    /// Cluster mode: stores nothing until [`ShareStateStore::follow_leadership`] hands it
    /// the partitions this node leads.
    pub fn replicated() -> ShareStateStore {
        ShareStateStore::new(Shards::default())
    }

    fn new(shards: Shards<StateShard>) -> ShareStateStore {
        ShareStateStore {
            shards: RwLock::new(shards),
            creating_topic: AtomicBool::new(false),
            peers: Default::default(),
        }
    }

    fn active(&self) -> Vec<Arc<StateShard>> {
        self.shards.read().active().cloned().collect()
    }

    /// Cluster mode: the state topic's partitions that the metadata being applied has this
    /// node lead, before [`ShareStateStore::follow_leadership`] takes them.
    pub fn expect_leadership(&self, incoming: IncomingLeaderships) {
        self.shards.write().expect(incoming);
    }

    /// Cluster mode: follows the leadership of the state topic's partitions (`leaders[p]`:
    /// the replica and leader epoch when this node leads p), as the other coordinators do.
    pub fn follow_leadership(self: &Arc<Self>, leaders: Vec<Option<(Arc<Replica>, i32)>>) {
        let followed = self.shards.write().follow(leaders);
        for load in followed.loads {
            let store = self.clone();
            tokio::task::spawn_blocking(move || store.load(load));
        }
    }

    fn load(&self, load: Load<Arc<Replica>>) {
        let Load { partition, replica, leader_epoch, generation } = load;
        let (log, stored) = match StateLog::<ShareRecord>::replicated(replica, leader_epoch) {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::error!(partition, %error, "cannot load a share state partition");
                return;
            }
        };
        let shard = StateShard::new(log, stored);
        let share_partitions = shard.states.lock().len();
        if self.shards.write().activate(partition, generation, shard) {
            tracing::debug!(partition, leader_epoch, share_partitions, "share state loaded");
        }
    }

    /// Clean shutdown.
    pub fn close(&self) {
        for shard in self.active() {
            if let Err(error) = shard.log.close() {
                tracing::error!(%error, "failed to close the share state log");
            }
        }
    }

    /// The groups with share-partition state in the partitions led here.
    pub fn groups_here(&self) -> BTreeSet<String> {
        let mut groups = BTreeSet::new();
        for shard in self.active() {
            let states = shard.states.lock();
            let live = states.iter().filter(|(_, state)| !state.deleted);
            groups.extend(live.filter_map(|(key, _)| parse_partition_log_key(key)).map(|k| k.0));
        }
        groups
    }

    /// The topics of `group`'s share-partitions stored in the partitions led here.
    pub fn topics_here(&self, group: &str) -> BTreeSet<String> {
        let mut topics = BTreeSet::new();
        for shard in self.active() {
            let states = shard.states.lock();
            let live = states.iter().filter(|(_, state)| !state.deleted);
            topics
                .extend(live.filter_map(|(key, _)| parse_partition_log_key(key)).filter(|k| k.0 == group).map(|k| k.1));
        }
        topics
    }

    /// Compacts each led partition's log when due.
    pub async fn upkeep(&self, syncer: &Syncer) {
        for shard in self.active() {
            shard.upkeep(syncer).await;
        }
    }

    fn route(&self, host: &dyn CoordinatorHost, key: &PartitionKey) -> Result<(Route, i32), ResponseError> {
        let shards = self.shards.read();
        let (group, topic, partition) = key;
        let state_key = format!("{group}:{topic}:{partition}");
        let index = shards.partition_of(&state_key).unwrap_or(0);
        match shards.serving(&state_key) {
            Ok(shard) => Ok((Route::Here(shard.clone()), index)),
            Err(NotServed::Loading) => Err(ResponseError::CoordinatorLoadInProgress),
            // A cluster creates the topic once formed (`create_internal_topics_once_formed`).
            Err(NotServed::NoPartitions) => Err(ResponseError::CoordinatorNotAvailable),
            Err(NotServed::NotLeader) => {
                let leader = host.partition_leader(SHARE_STATE_TOPIC, index).filter(|&led| led != host.node_id());
                leader.map(|node| (Route::Node(node), index)).ok_or(ResponseError::CoordinatorNotAvailable)
            }
        }
    }

    /// The stored state of `key` for the data partition's leader at `leader_epoch` (which
    /// fences older leaders from then on); `None` if the group never fetched it.
    pub async fn read(
        &self,
        host: &dyn CoordinatorHost,
        key: &PartitionKey,
        topic_id: Uuid,
        leader_epoch: i32,
    ) -> Result<Option<StoredPartition>, ResponseError> {
        match self.route(host, key)?.0 {
            Route::Here(shard) => {
                let (state, change) = shard.read(&partition_log_key(key), leader_epoch, host.logs().syncer())?;
                shard.log.wait_durable(change).await?;
                Ok(state)
            }
            Route::Node(node) => {
                let mut partition = read_share_group_state_request::PartitionData::default();
                partition.partition = key.2;
                partition.leader_epoch = leader_epoch;
                let mut topic = read_share_group_state_request::ReadStateData::default();
                topic.topic_id = topic_id;
                topic.partitions = vec![partition];
                let mut request = ReadShareGroupStateRequest::default();
                request.group_id = StrBytes::from_string(key.0.clone());
                request.topics = vec![topic];
                let answer = self.call(host, node, ApiKey::ReadShareGroupState, request.into()).await?;
                let ResponseKind::ReadShareGroupState(response) = answer else { unreachable!("answered in kind") };
                let result = response
                    .results
                    .into_iter()
                    .flat_map(|r| r.partitions)
                    .next()
                    .ok_or(ResponseError::CoordinatorNotAvailable)?;
                if result.error_code != 0 {
                    return Err(error_of(result.error_code));
                }
                if result.state_epoch < 0 {
                    return Ok(None);
                }
                let batches = result
                    .state_batches
                    .iter()
                    .map(|b| (b.first_offset, b.last_offset, b.delivery_state, b.delivery_count));
                Ok(Some(from_wire(result.state_epoch, leader_epoch, result.start_offset, batches)))
            }
        }
    }

    /// Writes the whole new state of `key` and waits until it is durable.
    pub async fn write(
        &self,
        host: &dyn CoordinatorHost,
        key: &PartitionKey,
        topic_id: Uuid,
        state: StoredPartition,
    ) -> Result<(), ResponseError> {
        match self.route(host, key)?.0 {
            Route::Here(shard) => {
                let change = shard.write(&partition_log_key(key), state, host.logs().syncer())?;
                shard.log.wait_durable(change).await
            }
            Route::Node(node) => {
                let mut partition = write_share_group_state_request::PartitionData::default();
                partition.partition = key.2;
                partition.leader_epoch = state.leader_epoch;
                partition.state_epoch = state.version;
                partition.start_offset = state.start;
                partition.state_batches = to_wire(&state)
                    .into_iter()
                    .map(|(first, last, delivery_state, count)| {
                        let mut batch = write_share_group_state_request::StateBatch::default();
                        batch.first_offset = first;
                        batch.last_offset = last;
                        batch.delivery_state = delivery_state;
                        batch.delivery_count = count;
                        batch
                    })
                    .collect();
                let mut topic = write_share_group_state_request::WriteStateData::default();
                topic.topic_id = topic_id;
                topic.partitions = vec![partition];
                let mut request = WriteShareGroupStateRequest::default();
                request.group_id = StrBytes::from_string(key.0.clone());
                request.topics = vec![topic];
                let answer = self.call(host, node, ApiKey::WriteShareGroupState, request.into()).await?;
                let ResponseKind::WriteShareGroupState(response) = answer else { unreachable!("answered in kind") };
                match response.results.iter().flat_map(|r| r.partitions.iter()).next() {
                    Some(result) if result.error_code == 0 => Ok(()),
                    Some(result) => Err(error_of(result.error_code)),
                    None => Err(ResponseError::CoordinatorNotAvailable),
                }
            }
        }
    }

    /// The summary of `key`'s stored state, if any.
    pub async fn summary(
        &self,
        host: &dyn CoordinatorHost,
        key: &PartitionKey,
        topic_id: Uuid,
    ) -> Result<Option<Summary>, ResponseError> {
        match self.route(host, key)?.0 {
            Route::Here(shard) => Ok(shard.summary(&partition_log_key(key))),
            Route::Node(node) => {
                let mut partition = read_share_group_state_summary_request::PartitionData::default();
                partition.partition = key.2;
                partition.leader_epoch = -1;
                let mut topic = read_share_group_state_summary_request::ReadStateSummaryData::default();
                topic.topic_id = topic_id;
                topic.partitions = vec![partition];
                let mut request = ReadShareGroupStateSummaryRequest::default();
                request.group_id = StrBytes::from_string(key.0.clone());
                request.topics = vec![topic];
                let answer = self.call(host, node, ApiKey::ReadShareGroupStateSummary, request.into()).await?;
                let ResponseKind::ReadShareGroupStateSummary(response) = answer else {
                    unreachable!("answered in kind")
                };
                match response.results.iter().flat_map(|r| r.partitions.iter()).next() {
                    Some(result) if result.error_code == 0 => Ok((result.state_epoch >= 0).then_some(Summary {
                        version: result.state_epoch,
                        leader_epoch: result.leader_epoch,
                        start: result.start_offset,
                        delivery_complete: None,
                    })),
                    Some(result) => Err(error_of(result.error_code)),
                    None => Err(ResponseError::CoordinatorNotAvailable),
                }
            }
        }
    }

    /// An administrator's change of `key`, durable before it returns.
    pub async fn administer(
        &self,
        host: &dyn CoordinatorHost,
        key: &PartitionKey,
        topic_id: Uuid,
        change: AdminChange,
    ) -> Result<(), ResponseError> {
        match self.route(host, key)?.0 {
            Route::Here(shard) => {
                let pending = shard.administer(&partition_log_key(key), change, host.logs().syncer())?;
                shard.log.wait_durable(pending).await
            }
            Route::Node(node) => {
                let group_id = StrBytes::from_string(key.0.clone());
                let (api_key, request): (ApiKey, RequestKind) = match change {
                    AdminChange::Start(start) => {
                        let mut partition = initialize_share_group_state_request::PartitionData::default();
                        partition.partition = key.2;
                        partition.start_offset = start;
                        let mut topic = initialize_share_group_state_request::InitializeStateData::default();
                        topic.topic_id = topic_id;
                        topic.partitions = vec![partition];
                        let mut request = InitializeShareGroupStateRequest::default();
                        request.group_id = group_id;
                        request.topics = vec![topic];
                        (ApiKey::InitializeShareGroupState, request.into())
                    }
                    AdminChange::Delete => {
                        let mut partition = delete_share_group_state_request::PartitionData::default();
                        partition.partition = key.2;
                        let mut topic = delete_share_group_state_request::DeleteStateData::default();
                        topic.topic_id = topic_id;
                        topic.partitions = vec![partition];
                        let mut request = DeleteShareGroupStateRequest::default();
                        request.group_id = group_id;
                        request.topics = vec![topic];
                        (ApiKey::DeleteShareGroupState, request.into())
                    }
                };
                let code = match self.call(host, node, api_key, request).await? {
                    ResponseKind::InitializeShareGroupState(response) => {
                        response.results.iter().flat_map(|r| r.partitions.iter()).map(|p| p.error_code).next()
                    }
                    ResponseKind::DeleteShareGroupState(response) => {
                        response.results.iter().flat_map(|r| r.partitions.iter()).map(|p| p.error_code).next()
                    }
                    _ => unreachable!("answered in kind"),
                };
                match code {
                    Some(0) => Ok(()),
                    Some(code) => Err(error_of(code)),
                    None => Err(ResponseError::CoordinatorNotAvailable),
                }
            }
        }
    }

    /// InitializeShareGroupState / DeleteShareGroupState at this node.
    pub async fn administer_here(
        &self,
        host: &dyn CoordinatorHost,
        key: &PartitionKey,
        change: AdminChange,
    ) -> Result<(), ResponseError> {
        let shard = self.shard_here(host, key)?;
        let pending = shard.administer(&partition_log_key(key), change, host.logs().syncer())?;
        shard.log.wait_durable(pending).await
    }

    async fn call(
        &self,
        host: &dyn CoordinatorHost,
        node: i32,
        api_key: ApiKey,
        request: RequestKind,
    ) -> Result<ResponseKind, ResponseError> {
        let timeout = Duration::from_millis(STATE_LOG_WRITE_TIMEOUT_MS + 5_000);
        self.peers.call(host, node, api_key, SHARE_STATE_RPC_VERSION, &request, timeout).await.map_err(|error| {
            tracing::debug!(node, ?api_key, ?error, "share state request to another broker failed");
            ResponseError::CoordinatorNotAvailable
        })
    }

    /// The state partition led here that holds `key`, for the broker-to-broker handlers.
    fn shard_here(&self, host: &dyn CoordinatorHost, key: &PartitionKey) -> Result<Arc<StateShard>, ResponseError> {
        match self.route(host, key)?.0 {
            Route::Here(shard) => Ok(shard),
            Route::Node(_) => Err(ResponseError::NotCoordinator),
        }
    }

    /// ReadShareGroupState at this node (the handler's side of [`ShareStateStore::read`]):
    /// (state epoch, start offset, batches); state epoch -1 when nothing is stored.
    pub async fn read_here(
        &self,
        host: &dyn CoordinatorHost,
        key: &PartitionKey,
        leader_epoch: i32,
    ) -> Result<(i32, i64, Vec<(i64, i64, i8, i16)>), ResponseError> {
        let shard = self.shard_here(host, key)?;
        let (state, change) = shard.read(&partition_log_key(key), leader_epoch, host.logs().syncer())?;
        shard.log.wait_durable(change).await?;
        Ok(match state {
            None => (-1, -1, Vec::new()),
            Some(state) => (state.version, state.start, to_wire(&state)),
        })
    }

    /// WriteShareGroupState at this node.
    pub async fn write_here(
        &self,
        host: &dyn CoordinatorHost,
        key: &PartitionKey,
        (version, leader_epoch, start): (i32, i32, i64),
        batches: impl Iterator<Item = (i64, i64, i8, i16)>,
    ) -> Result<(), ResponseError> {
        let shard = self.shard_here(host, key)?;
        let state = from_wire(version, leader_epoch, start, batches);
        let change = shard.write(&partition_log_key(key), state, host.logs().syncer())?;
        shard.log.wait_durable(change).await
    }

    /// ReadShareGroupStateSummary at this node: (state epoch, leader epoch, start), state
    /// epoch -1 when nothing is stored.
    pub fn summary_here(
        &self,
        host: &dyn CoordinatorHost,
        key: &PartitionKey,
    ) -> Result<Option<Summary>, ResponseError> {
        Ok(self.shard_here(host, key)?.summary(&partition_log_key(key)))
    }

    /// Single node: stores a group's configs; durable once the returned change is.
    pub async fn write_configs(
        &self,
        host: &dyn CoordinatorHost,
        group: &str,
        configs: GroupConfigs,
    ) -> Result<(), ResponseError> {
        let shard = match self.shards.read().serving_partition(0) {
            Ok(shard) if !host.clustered() => shard.clone(),
            _ => return Err(ResponseError::NotController),
        };
        let change = {
            let mut stored = shard.configs.lock();
            let change = shard.log.append(
                &config_log_key(group),
                &ShareRecord::GroupConfig(configs.clone()),
                host.logs().syncer(),
            )?;
            stored.insert(group.to_string(), configs);
            change
        };
        shard.log.wait_durable(change).await
    }
}

fn error_of(code: i16) -> ResponseError {
    ResponseError::try_from_code(code).unwrap_or(ResponseError::UnknownServerError)
}

/// A state as Kafka's state batches carry it (plus Sluice's dead-letter batches): every
/// offset of the window `[start, end)` in a batch (so the window's end travels too), and
/// each pending dead letter as a one-offset batch.
fn to_wire(state: &StoredPartition) -> Vec<(i64, i64, i8, i16)> {
    let mut batches: Vec<(i64, i64, i8, i16)> = state
        .runs
        .iter()
        .map(|&(first, last, delivery_state, count)| (first, last, delivery_state as i8, count))
        .collect();
    let covered = batches.iter().map(|b| b.1 + 1).max().unwrap_or(state.start).max(state.start);
    if covered < state.end {
        batches.push((covered, state.end - 1, 0, 0));
    }
    for (offset, reason, count) in &state.dead_letters {
        let kind = if reason == "rejected" { DEAD_LETTER_REJECTED } else { DEAD_LETTER_DELIVERY_LIMIT };
        batches.push((*offset, *offset, kind, *count));
    }
    batches
}

fn from_wire(
    version: i32,
    leader_epoch: i32,
    start: i64,
    batches: impl Iterator<Item = (i64, i64, i8, i16)>,
) -> StoredPartition {
    let mut state = StoredPartition {
        start,
        end: start,
        runs: Vec::new(),
        dead_letters: Vec::new(),
        leader_epoch,
        version,
        reset: false,
        deleted: false,
    };
    for (first, last, delivery_state, count) in batches {
        match delivery_state {
            DEAD_LETTER_REJECTED => state.dead_letters.push((first, "rejected".to_string(), count)),
            DEAD_LETTER_DELIVERY_LIMIT => state.dead_letters.push((first, "delivery-limit".to_string(), count)),
            _ => {
                state.end = state.end.max(last + 1);
                state.runs.push((first, last, delivery_state as u8, count));
            }
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_travels_between_brokers_unchanged() {
        let state = StoredPartition {
            start: 10,
            end: 20,
            runs: vec![(10, 11, 2, 1), (12, 12, 4, 3), (13, 14, 0, 1)],
            dead_letters: vec![(7, "rejected".to_string(), 1), (12, "delivery-limit".to_string(), 3)],
            leader_epoch: 4,
            version: 9,
            reset: false,
            deleted: false,
        };
        let back = from_wire(9, 4, 10, to_wire(&state).into_iter());
        assert_eq!(back.end, 20, "the window's end travels as an available batch");
        assert_eq!(back.dead_letters, state.dead_letters);
        assert_eq!(&back.runs[..3], &state.runs[..]);
        assert_eq!(back.runs[3], (15, 19, 0, 0));
    }

    #[tokio::test]
    async fn a_new_leader_fences_the_old_one_and_old_versions_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start();
        let (log, stored) = StateLog::<ShareRecord>::open_local(&dir.path().join("s-0")).unwrap();
        let shard = StateShard::new(log, stored);
        let state = |leader_epoch, version, start| StoredPartition {
            start,
            end: start,
            runs: Vec::new(),
            dead_letters: Vec::new(),
            leader_epoch,
            version,
            reset: false,
            deleted: false,
        };
        let change = shard.write("k", state(1, 1, 0), &syncer).unwrap();
        shard.log.wait_durable(change).await.unwrap();
        let change = shard.write("k", state(1, 3, 30), &syncer).unwrap();
        shard.log.wait_durable(change).await.unwrap();
        let change = shard.write("k", state(1, 2, 20), &syncer).unwrap();
        shard.log.wait_durable(change).await.unwrap();
        let summary =
            |leader_epoch, start| Some(Summary { version: 3, leader_epoch, start, delivery_complete: Some(0) });
        assert_eq!(shard.summary("k"), summary(1, 30), "a late, older version is already included");

        let (read, change) = shard.read("k", 2, &syncer).unwrap();
        shard.log.wait_durable(change).await.unwrap();
        assert_eq!(read.map(|s| s.start), Some(30));
        assert_eq!(shard.write("k", state(1, 9, 90), &syncer).err(), Some(ResponseError::FencedLeaderEpoch));
        assert_eq!(shard.read("k", 1, &syncer).err(), Some(ResponseError::FencedLeaderEpoch));
        assert_eq!(shard.summary("k"), summary(2, 30));

        // An administrator moves the start: the leader's writes are refused until it reads.
        let change = shard.administer("k", AdminChange::Start(7), &syncer).unwrap();
        shard.log.wait_durable(change).await.unwrap();
        assert_eq!(shard.summary("k"), summary(-1, 7), "no leader has read the change yet");
        assert_eq!(shard.write("k", state(2, 4, 40), &syncer).err(), Some(ResponseError::FencedLeaderEpoch));
        let (read, change) = shard.read("k", 2, &syncer).unwrap();
        shard.log.wait_durable(change).await.unwrap();
        assert_eq!(read.map(|s| (s.start, s.reset)), Some((7, false)));
        shard.log.wait_durable(shard.write("k", state(2, 4, 8), &syncer).unwrap()).await.unwrap();

        // Deleted: refused writes, then nothing for the next reader, and forgotten on replay.
        let change = shard.administer("k", AdminChange::Delete, &syncer).unwrap();
        shard.log.wait_durable(change).await.unwrap();
        assert_eq!(shard.summary("k"), None);
        assert_eq!(shard.write("k", state(2, 5, 9), &syncer).err(), Some(ResponseError::FencedLeaderEpoch));
        let (read, change) = shard.read("k", 2, &syncer).unwrap();
        shard.log.wait_durable(change).await.unwrap();
        assert!(read.is_none());
        shard.log.close().unwrap();
        let (_, replayed) = StateLog::<ShareRecord>::open_local(&dir.path().join("s-0")).unwrap();
        assert!(replayed.is_empty(), "the tombstone forgets the key: {replayed:?}");
        syncer.shutdown();
    }
}
