//! Share groups (KIP-932): queues on the log. Members of a share group take records of
//! any assigned partition one by one, acknowledge each (accept, release, reject), and get
//! back, after the lock duration, what they took and did not acknowledge.
//!
//! The coordinator keeps three things behind one lock, where Kafka keeps them:
//! - *groups* (at the group's coordinator, the node FindCoordinator names, as for consumer
//!   groups): members, their subscriptions and assignments (ShareGroupHeartbeat). The
//!   assignor spreads each topic's partitions over its subscribers and, when there are
//!   more members than partitions, shares partitions (every member gets at least one), as
//!   Kafka's simple assignor does. Membership is in memory: after a restart or a
//!   coordinator failover members rejoin (UNKNOWN_MEMBER_ID), as after a session timeout.
//! - *share-partitions* (at the data partition's leader; `partition.rs`): per (group,
//!   topic, partition), the window of records in flight, their states, locks and delivery
//!   counts. Loaded from the share state store on first use at a leader epoch.
//! - *share sessions* (at each broker a member fetches from): per (group, member), the
//!   partitions the member fetches there and the session epoch.
//!
//! Durability: every acknowledgement is written to the share state store (`store.rs`: the
//! partitions of `__share_group_state`, local or replicated) and answered only once
//! durable, so an acknowledged record is never delivered again after a crash or a leader
//! failover. Acquisitions are not written: after a crash, records that were locked are
//! available again (with the delivery count last written). A partition's start, when first
//! fetched (`share.auto.offset.reset`), is written before anything is handed out. Other
//! changes (releases, expired locks, dead letters copied) are written in the background.
//! Per-group configs live in the share state log on a single node and in the cluster
//! metadata in a cluster (every broker needs them).
//!
//! Not yet: `share.isolation.level=read_committed`, the share-group offsets admin APIs.

pub mod dead_letter;
pub mod partition;
pub mod store;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::Path;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::CoordinatorHost;
use partition::{AckError, AcquiredRange, BatchSpan, DeadRecord, SharePartition, StoredPartition};
pub use partition::{Depth, RecordLimit};
use store::ShareStateStore;

/// Kafka's `group.share.max.share.sessions`.
pub const SHARE_SESSIONS_MAX: usize = 2_000;
/// Kafka's `group.share.max.size`: members per share group.
pub const SHARE_GROUP_MEMBERS_MAX: usize = 200;
/// Share groups at most on one broker.
pub const SHARE_GROUPS_MAX: usize = 10_000;
/// Longest member id a client may send (Kafka's rule).
const MEMBER_ID_CHARS_MAX: usize = 36;
/// State changes queued for the background writer at most; beyond, the oldest are
/// dropped (each write carries a share-partition's whole state, so a later one covers it).
const BACKGROUND_WRITES_MAX: usize = 100_000;

/// Kafka's per-group share configs (IncrementalAlterConfigs on a GROUP resource).
pub const CONFIG_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";
pub const CONFIG_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
pub const CONFIG_DELIVERY_COUNT_LIMIT: &str = "share.delivery.count.limit";
/// KIP-1222: whether members may renew their acquisition locks (default true).
pub const CONFIG_RENEW_ACKNOWLEDGE_ENABLE: &str = "share.renew.acknowledge.enable";
pub const CONFIG_HEARTBEAT_INTERVAL_MS: &str = "share.heartbeat.interval.ms";
pub const CONFIG_SESSION_TIMEOUT_MS: &str = "share.session.timeout.ms";
/// Only `read_uncommitted` (Kafka's default) is served.
pub const CONFIG_ISOLATION_LEVEL: &str = "share.isolation.level";

pub use crate::GroupConfigs;

/// A reserved group config (never described, not settable by clients) recording that a
/// share group exists and the topics its members subscribed to. It lives with the group's
/// configs (the share state log on a single node, the cluster metadata in a cluster), so
/// any coordinator, also after a failover, describes, lists, resets and deletes an empty
/// group, and knows which share-partitions it has.
pub const CONFIG_GROUP_TOPICS: &str = "sluice.share.group.topics";

/// The topics [`CONFIG_GROUP_TOPICS`] records, if the group is registered.
fn registered_topics(configs: Option<&GroupConfigs>) -> Option<BTreeSet<String>> {
    let topics = configs?.get(CONFIG_GROUP_TOPICS)?;
    Some(topics.split(',').filter(|t| !t.is_empty()).map(str::to_string).collect())
}

/// The broker's share-group settings (Kafka's `group.share.*` broker configs).
#[derive(Debug, Clone, Copy)]
pub struct ShareSettings {
    pub record_lock_duration_ms: i64,
    pub delivery_count_limit: i16,
    pub partition_max_record_locks: usize,
    pub heartbeat_interval_ms: i32,
    pub session_timeout_ms: i64,
}

/// What the share state log holds per key.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum ShareRecord {
    Partition(StoredPartition),
    GroupConfig(GroupConfigs),
}

/// (group, topic, partition)
pub type PartitionKey = (String, String, i32);

fn partition_log_key((group, topic, partition): &PartitionKey) -> String {
    format!("p\u{0}{group}\u{0}{topic}\u{0}{partition}")
}

/// The share-partition a state log key names.
fn parse_partition_log_key(key: &str) -> Option<PartitionKey> {
    let mut parts = key.split('\u{0}');
    match (parts.next(), parts.next(), parts.next(), parts.next().map(str::parse::<i32>)) {
        (Some("p"), Some(group), Some(topic), Some(Ok(partition))) => {
            Some((group.to_string(), topic.to_string(), partition))
        }
        _ => None,
    }
}

fn config_log_key(group: &str) -> String {
    format!("c\u{0}{group}")
}

/// The leader epoch of `topic`/`partition` if this node leads it (a single node leads
/// every partition at epoch [`sluice_meta::LEADER_EPOCH`]).
pub fn leader_epoch(host: &dyn CoordinatorHost, topic: &str, partition: i32) -> Option<i32> {
    match host.replicas() {
        None => host.partition(topic, partition).map(|_| sluice_meta::LEADER_EPOCH),
        Some(replicas) => replicas.get(topic, partition)?.leader_epoch(),
    }
}

#[derive(Debug, Clone)]
struct ShareMember {
    epoch: i32,
    previous_epoch: i32,
    subscribed: Vec<String>,
    rack: Option<String>,
    client_id: String,
    client_host: String,
    last_heartbeat_ms: i64,
    assignment: BTreeMap<String, Vec<i32>>,
    /// The assignment last sent to the member (sent again only when it changes).
    sent: Option<BTreeMap<String, Vec<i32>>>,
}

#[derive(Debug, Default)]
struct ShareGroup {
    epoch: i32,
    members: BTreeMap<String, ShareMember>,
    /// The topic catalog generation the assignment was computed for.
    catalog_generation: u64,
}

struct ShareSession {
    epoch: i32,
    partitions: BTreeSet<(Uuid, i32)>,
}

#[derive(Default)]
struct ShareState {
    groups: HashMap<String, ShareGroup>,
    partitions: HashMap<PartitionKey, LoadedPartition>,
    sessions: HashMap<(String, String), ShareSession>,
    configs: HashMap<String, GroupConfigs>,
}

/// A member's heartbeat answer.
pub struct HeartbeatAnswer {
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// Topic -> partitions, when it must be sent.
    pub assignment: Option<BTreeMap<String, Vec<i32>>>,
    /// Topics the group's registration lacks: the caller records them
    /// ([`ShareCoordinator::register_group`]).
    pub unregistered: Option<BTreeSet<String>>,
}

/// One member as ShareGroupDescribe shows it.
pub struct MemberDescription {
    pub member_id: String,
    pub member_epoch: i32,
    pub rack: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed: Vec<String>,
    pub assignment: BTreeMap<String, Vec<i32>>,
}

pub struct GroupDescription {
    pub epoch: i32,
    pub members: Vec<MemberDescription>,
}

/// Which records a fetch pass may acquire for a partition: read from `offset`.
pub struct FetchPlan {
    pub offset: i64,
}

/// Outcome of a share-session step.
pub enum ShareSessionStep {
    /// Fetch (or acknowledge) these partitions.
    Open(Vec<(Uuid, i32)>),
    /// The session closed (epoch -1): the member's records were released.
    Closed,
}

/// A share-partition served here: its state and where its durable state stands.
struct LoadedPartition {
    partition: SharePartition,
    topic_id: Uuid,
    /// The data partition's leader epoch it was loaded at (its writes carry it).
    leader_epoch: i32,
    /// The version of its last change.
    version: i32,
}

impl LoadedPartition {
    /// The durable form of its state after a change (one call per change).
    fn next_write(&mut self, key: &PartitionKey) -> StateWrite {
        self.version = self.version.checked_add(1).expect("share-partition versions fit i32");
        let mut state = self.partition.stored();
        state.leader_epoch = self.leader_epoch;
        state.version = self.version;
        StateWrite { key: key.clone(), topic_id: self.topic_id, state }
    }
}

/// A share-partition's new state, to write to the store.
pub struct StateWrite {
    key: PartitionKey,
    topic_id: Uuid,
    state: StoredPartition,
}

pub struct ShareCoordinator {
    settings: ShareSettings,
    pub store: Arc<ShareStateStore>,
    state: Mutex<ShareState>,
    /// Woken when records may have become available again (released, lock expired).
    released: tokio::sync::Notify,
    /// Share-partitions whose dead letters are being copied now.
    flushing: Mutex<std::collections::HashSet<PartitionKey>>,
    /// Groups whose registration is being written.
    registering: Mutex<std::collections::HashSet<String>>,
    /// Changes written in the background, and its wake-up.
    background: Mutex<Vec<StateWrite>>,
    background_ready: tokio::sync::Notify,
}

impl ShareCoordinator {
    /// Single node: opens (replaying) the share state log under `data_dir/share`.
    pub fn open_local(data_dir: &Path, settings: ShareSettings) -> io::Result<ShareCoordinator> {
        let (store, configs) = ShareStateStore::open_local(data_dir)?;
        Ok(ShareCoordinator::new(settings, store, configs))
    }

    /// Cluster mode: share-partition state in the replicated `__share_group_state`, group
    /// configs from the cluster metadata.
    pub fn replicated(settings: ShareSettings) -> ShareCoordinator {
        ShareCoordinator::new(settings, ShareStateStore::replicated(), BTreeMap::new())
    }

    fn new(settings: ShareSettings, store: ShareStateStore, configs: BTreeMap<String, GroupConfigs>) -> Self {
        let state = ShareState { configs: configs.into_iter().collect(), ..ShareState::default() };
        ShareCoordinator {
            settings,
            store: Arc::new(store),
            state: Mutex::new(state),
            released: Default::default(),
            flushing: Default::default(),
            registering: Default::default(),
            background: Default::default(),
            background_ready: Default::default(),
        }
    }

    /// Clean shutdown.
    pub fn close(&self) {
        self.store.close();
    }

    fn lock_duration_ms(&self, configs: &HashMap<String, GroupConfigs>, group: &str) -> i64 {
        configs
            .get(group)
            .and_then(|c| c.get(CONFIG_LOCK_DURATION_MS))
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.settings.record_lock_duration_ms)
    }

    fn heartbeat_interval_ms(&self, configs: &HashMap<String, GroupConfigs>, group: &str) -> i32 {
        Self::group_number(configs, group, CONFIG_HEARTBEAT_INTERVAL_MS, self.settings.heartbeat_interval_ms)
    }

    /// A numeric group config, or the broker's setting.
    fn group_number<T: std::str::FromStr>(
        configs: &HashMap<String, GroupConfigs>,
        group: &str,
        name: &str,
        broker_setting: T,
    ) -> T {
        configs.get(group).and_then(|c| c.get(name)).and_then(|v| v.parse().ok()).unwrap_or(broker_setting)
    }

    /// Whether the group lets members renew their locks ([`CONFIG_RENEW_ACKNOWLEDGE_ENABLE`]).
    fn renewal_enabled(configs: &HashMap<String, GroupConfigs>, group: &str) -> bool {
        configs.get(group).and_then(|c| c.get(CONFIG_RENEW_ACKNOWLEDGE_ENABLE)).is_none_or(|v| v != "false")
    }

    /// Keeps `dead` for the group's dead-letter topic, if it has one; else they are simply
    /// archived.
    fn keep_dead(
        configs: &HashMap<String, GroupConfigs>,
        group: &str,
        partition: &mut SharePartition,
        dead: Vec<DeadRecord>,
    ) {
        let has_topic = configs.get(group).is_some_and(|c| c.contains_key(dead_letter::CONFIG_DEAD_LETTER_TOPIC));
        if !dead.is_empty() && has_topic {
            partition.add_dead_letters(dead);
        }
    }

    fn delivery_limit(&self, configs: &HashMap<String, GroupConfigs>, group: &str) -> i16 {
        configs
            .get(group)
            .and_then(|c| c.get(CONFIG_DELIVERY_COUNT_LIMIT))
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.settings.delivery_count_limit)
    }

    /// The lock duration members of `group` get (ShareFetch `acquisition_lock_timeout_ms`).
    pub fn group_lock_duration_ms(&self, group: &str) -> i64 {
        self.lock_duration_ms(&self.state.lock().configs, group)
    }

    /// Queues `writes` for the background writer.
    fn write_later(&self, writes: Vec<StateWrite>) {
        if writes.is_empty() {
            return;
        }
        let mut queued = self.background.lock();
        queued.extend(writes);
        if queued.len() > BACKGROUND_WRITES_MAX {
            let excess = queued.len() - BACKGROUND_WRITES_MAX;
            queued.drain(..excess);
        }
        drop(queued);
        self.background_ready.notify_one();
    }

    /// The background writer: writes queued changes (the newest per share-partition), in
    /// parallel, forever. A failed write is not retried: the next change of the
    /// share-partition carries its whole state again.
    pub async fn run_background_writes(&self, host: &dyn CoordinatorHost) {
        loop {
            self.background_ready.notified().await;
            let queued = std::mem::take(&mut *self.background.lock());
            let mut newest: HashMap<PartitionKey, StateWrite> = HashMap::new();
            for write in queued {
                match newest.get(&write.key) {
                    Some(kept) if kept.state.version >= write.state.version => {}
                    _ => {
                        newest.insert(write.key.clone(), write);
                    }
                }
            }
            let writes = newest.into_values().map(|write| async move {
                if let Err(error) = self.persist(host, write).await {
                    tracing::debug!(?error, "a background share state write failed");
                }
            });
            futures::future::join_all(writes).await;
        }
    }

    /// Writes a change and waits until it is durable. Refused as fenced (a newer leader, or
    /// an administrator's change): the share-partition is dropped here, to be read again.
    pub async fn persist(&self, host: &dyn CoordinatorHost, write: StateWrite) -> Result<(), ResponseError> {
        let (key, leader_epoch) = (write.key.clone(), write.state.leader_epoch);
        let written = self.store.write(host, &write.key, write.topic_id, write.state).await;
        if written == Err(ResponseError::FencedLeaderEpoch) {
            let mut state = self.state.lock();
            if state.partitions.get(&key).is_some_and(|p| p.leader_epoch == leader_epoch) {
                tracing::info!(group = %key.0, topic = %key.1, partition = key.2, "share-partition changed elsewhere; reloading");
                state.partitions.remove(&key);
            }
        }
        written
    }

    /// Whether `group_id` has members here (its coordinator).
    pub fn has_members(&self, group_id: &str) -> bool {
        self.state.lock().groups.get(group_id).is_some_and(|group| !group.members.is_empty())
    }

    /// After DeleteGroups: forgets the group's membership record here.
    pub fn forget_group(&self, group_id: &str) {
        self.state.lock().groups.remove(group_id);
    }

    /// After an administrator's change of `key`: drops it if served here (a leader
    /// elsewhere finds out when it next writes or opens a share session).
    pub fn drop_served(&self, key: &PartitionKey) {
        self.state.lock().partitions.remove(key);
    }

    /// ShareGroupHeartbeat at the group's coordinator: join (epoch 0), leave (-1) or
    /// heartbeat. `catalog` resolves subscriptions to partitions.
    #[allow(clippy::too_many_arguments)]
    pub fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        member_epoch: i32,
        rack: Option<String>,
        subscribed: Option<Vec<String>>,
        client: (&str, &str),
        catalog: &sluice_meta::topics::TopicCatalog,
        now_ms: i64,
    ) -> Result<HeartbeatAnswer, (ResponseError, String)> {
        let invalid = |message: &str| Err((ResponseError::InvalidRequest, message.to_string()));
        if group_id.is_empty() || member_id.is_empty() || member_id.chars().count() > MEMBER_ID_CHARS_MAX {
            return invalid("group id and member id must be non-empty, member id at most 36 characters");
        }
        if member_epoch < -1 {
            return invalid("member epoch below -1");
        }
        if member_epoch == 0 && subscribed.as_ref().is_none_or(Vec::is_empty) {
            return invalid("a joining member must subscribe to at least one topic");
        }
        let mut state = self.state.lock();
        let ShareState { groups, partitions, sessions, configs } = &mut *state;
        if member_epoch == -1 {
            if let Some(group) = groups.get_mut(group_id) {
                if group.members.remove(member_id).is_some() {
                    group.epoch += 1;
                    assign(group, catalog);
                }
            }
            sessions.remove(&(group_id.to_string(), member_id.to_string()));
            self.release_member(partitions, configs, group_id, member_id);
            return Ok(HeartbeatAnswer {
                member_epoch: -1,
                heartbeat_interval_ms: self.heartbeat_interval_ms(configs, group_id),
                assignment: None,
                unregistered: None,
            });
        }
        if !groups.contains_key(group_id) && groups.len() >= SHARE_GROUPS_MAX {
            // Empty groups are kept (described, listed) until deleted, or until room is needed.
            let empty = groups.iter().find(|(_, group)| group.members.is_empty()).map(|(id, _)| id.clone());
            match empty {
                Some(empty) => {
                    groups.remove(&empty);
                }
                None => {
                    return Err((
                        ResponseError::GroupMaxSizeReached,
                        "too many share groups on this broker".to_string(),
                    ))
                }
            }
        }
        let group = groups.entry(group_id.to_string()).or_default();
        let full = subscribed.is_some();
        let mut changed = group.catalog_generation != catalog.generation();
        match group.members.get_mut(member_id) {
            None if member_epoch != 0 => {
                return Err((ResponseError::UnknownMemberId, "unknown member: rejoin".to_string()));
            }
            None => {
                if group.members.len() >= SHARE_GROUP_MEMBERS_MAX {
                    return Err((ResponseError::GroupMaxSizeReached, "the share group is full".to_string()));
                }
                group.members.insert(
                    member_id.to_string(),
                    ShareMember {
                        epoch: 0,
                        previous_epoch: 0,
                        subscribed: subscribed.clone().unwrap_or_default(),
                        rack: rack.clone(),
                        client_id: client.0.to_string(),
                        client_host: client.1.to_string(),
                        last_heartbeat_ms: now_ms,
                        assignment: BTreeMap::new(),
                        sent: None,
                    },
                );
                changed = true;
            }
            Some(member) => {
                if member_epoch != 0 && member_epoch != member.epoch && member_epoch != member.previous_epoch {
                    return Err((ResponseError::FencedMemberEpoch, "stale member epoch: rejoin".to_string()));
                }
                if member_epoch == 0 {
                    member.sent = None;
                }
                if let Some(topics) = &subscribed {
                    if *topics != member.subscribed {
                        member.subscribed = topics.clone();
                        changed = true;
                    }
                }
                member.last_heartbeat_ms = now_ms;
            }
        }
        if changed {
            group.epoch += 1;
            assign(group, catalog);
        }
        let group_epoch = group.epoch;
        let member = group.members.get_mut(member_id).expect("present");
        if member.epoch != group_epoch {
            member.previous_epoch = member.epoch;
            member.epoch = group_epoch;
        }
        let send = member_epoch == 0 || full || member.sent.as_ref() != Some(&member.assignment);
        let assignment = send.then(|| {
            member.sent = Some(member.assignment.clone());
            member.assignment.clone()
        });
        let registered = registered_topics(configs.get(group_id)).unwrap_or_default();
        let unregistered = (!member.subscribed.iter().all(|t| registered.contains(t)))
            .then(|| member.subscribed.iter().cloned().chain(registered).collect());
        Ok(HeartbeatAnswer {
            member_epoch: member.epoch,
            heartbeat_interval_ms: self.heartbeat_interval_ms(configs, group_id),
            assignment,
            unregistered,
        })
    }

    /// Releases every record `member_id` holds in `group_id`'s share-partitions served here
    /// (written in the background).
    fn release_member(
        &self,
        partitions: &mut HashMap<PartitionKey, LoadedPartition>,
        configs: &HashMap<String, GroupConfigs>,
        group_id: &str,
        member_id: &str,
    ) {
        let limit = self.delivery_limit(configs, group_id);
        let mut writes = Vec::new();
        for (key, loaded) in partitions.iter_mut() {
            if key.0 == group_id {
                let (changed, dead) = loaded.partition.release_expired(i64::MIN, Some(member_id), limit);
                if changed {
                    Self::keep_dead(configs, group_id, &mut loaded.partition, dead);
                    writes.push(loaded.next_write(key));
                }
            }
        }
        if !writes.is_empty() {
            self.write_later(writes);
            self.released.notify_waiters();
        }
    }

    /// A share group known here: while it has members, is registered, or has share-partition
    /// state stored here (an empty group stays until deleted, as in Kafka).
    pub fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        let known_state = self.store.groups_here().contains(group_id);
        let state = self.state.lock();
        let known_state = known_state || registered_topics(state.configs.get(group_id)).is_some();
        let empty = ShareGroup::default();
        let group = match state.groups.get(group_id) {
            Some(group) => group,
            None if known_state => &empty,
            None => return None,
        };
        Some(GroupDescription {
            epoch: group.epoch,
            members: group
                .members
                .iter()
                .map(|(id, m)| MemberDescription {
                    member_id: id.clone(),
                    member_epoch: m.epoch,
                    rack: m.rack.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    subscribed: m.subscribed.clone(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        })
    }

    /// Share groups known here: (id, member count), those with state stored here but no
    /// members included.
    pub fn list(&self) -> Vec<(String, usize)> {
        let mut listed: BTreeMap<String, usize> = self.store.groups_here().into_iter().map(|g| (g, 0)).collect();
        let state = self.state.lock();
        let registered = state.configs.iter().filter(|(_, c)| c.contains_key(CONFIG_GROUP_TOPICS));
        listed.extend(registered.map(|(id, _)| (id.clone(), 0)));
        listed.extend(state.groups.iter().map(|(id, g)| (id.clone(), g.members.len())));
        listed.into_iter().collect()
    }

    /// The topics `group_id` consumes: those registered, its members' subscriptions and the
    /// topics of its share-partitions served or stored here.
    pub fn group_topics(&self, group_id: &str) -> BTreeSet<String> {
        let mut topics = self.store.topics_here(group_id);
        let state = self.state.lock();
        topics.extend(registered_topics(state.configs.get(group_id)).unwrap_or_default());
        if let Some(group) = state.groups.get(group_id) {
            topics.extend(group.members.values().flat_map(|m| m.subscribed.iter().cloned()));
        }
        topics.extend(state.partitions.keys().filter(|(g, _, _)| g == group_id).map(|(_, t, _)| t.clone()));
        topics
    }

    /// Whether `member_id` has a share session in `group_id` (a final request needs one).
    pub fn has_session(&self, group_id: &str, member_id: &str) -> bool {
        self.state.lock().sessions.contains_key(&(group_id.to_string(), member_id.to_string()))
    }

    /// A ShareFetch's or ShareAcknowledge's session step (`fetch`: ShareFetch, which may
    /// open a session with epoch 0; ShareAcknowledge may not). `added` and `forgotten`
    /// change the session's partitions (added first, then forgotten, as Kafka does).
    pub fn session_step(
        &self,
        group_id: &str,
        member_id: &str,
        epoch: i32,
        added: &[(Uuid, i32)],
        forgotten: &[(Uuid, i32)],
        fetch: bool,
    ) -> Result<ShareSessionStep, ResponseError> {
        let key = (group_id.to_string(), member_id.to_string());
        let mut state = self.state.lock();
        let ShareState { sessions, partitions, configs, .. } = &mut *state;
        if epoch == 0 {
            if !fetch {
                return Err(ResponseError::InvalidShareSessionEpoch);
            }
            if !sessions.contains_key(&key) && sessions.len() >= SHARE_SESSIONS_MAX {
                return Err(ResponseError::ShareSessionLimitReached);
            }
            let partitions: BTreeSet<(Uuid, i32)> = added.iter().copied().collect();
            let open = partitions.iter().copied().collect();
            sessions.insert(key, ShareSession { epoch: 1, partitions });
            return Ok(ShareSessionStep::Open(open));
        }
        let Some(session) = sessions.get_mut(&key) else { return Err(ResponseError::ShareSessionNotFound) };
        if epoch == -1 {
            sessions.remove(&key);
            self.release_member(partitions, configs, group_id, member_id);
            return Ok(ShareSessionStep::Closed);
        }
        if epoch != session.epoch {
            return Err(ResponseError::InvalidShareSessionEpoch);
        }
        session.epoch = if session.epoch == i32::MAX { 1 } else { session.epoch + 1 };
        session.partitions.extend(added.iter().copied());
        for forgotten in forgotten {
            session.partitions.remove(forgotten);
        }
        Ok(ShareSessionStep::Open(session.partitions.iter().copied().collect()))
    }

    /// Applies acknowledgement batches of one share-partition served here; the partition
    /// is unchanged unless all apply. Returns the change to [`ShareCoordinator::persist`]
    /// before answering.
    pub fn acknowledge(
        &self,
        group_id: &str,
        member_id: &str,
        (topic, partition): (&str, i32),
        batches: &[(i64, i64, Vec<i8>)],
        renewing: bool,
        now_ms: i64,
    ) -> Result<StateWrite, ResponseError> {
        let mut previous_last = i64::MIN;
        for (first, last, types) in batches {
            if first > last || *first <= previous_last || types.is_empty() {
                return Err(ResponseError::InvalidRequest);
            }
            previous_last = *last;
        }
        let key = (group_id.to_string(), topic.to_string(), partition);
        let mut state = self.state.lock();
        let limit = self.delivery_limit(&state.configs, group_id);
        // RENEW only in a request that announced it (IsRenewAck: else INVALID_REQUEST, below),
        // for a group that allows it (else INVALID_RECORD_STATE, as Kafka answers).
        let renews = batches.iter().any(|(_, _, types)| types.contains(&partition::ACK_RENEW));
        if renewing && renews && !Self::renewal_enabled(&state.configs, group_id) {
            return Err(ResponseError::InvalidRecordState);
        }
        let renew_until_ms = renewing.then(|| now_ms + self.lock_duration_ms(&state.configs, group_id));
        let ShareState { configs, partitions, .. } = &mut *state;
        let Some(loaded) = partitions.get_mut(&key) else {
            return Err(ResponseError::InvalidRecordState);
        };
        let mut updated = loaded.partition.clone();
        let mut dead = Vec::new();
        for (first, last, types) in batches {
            let archived =
                updated.acknowledge(member_id, (*first, *last), types, limit, renew_until_ms).map_err(|error| {
                    match error {
                        AckError::NotAcquired => ResponseError::InvalidRecordState,
                        AckError::Invalid => ResponseError::InvalidRequest,
                    }
                })?;
            dead.extend(archived);
        }
        Self::keep_dead(configs, group_id, &mut updated, dead);
        loaded.partition = updated;
        let write = loaded.next_write(&key);
        drop(state);
        self.released.notify_waiters();
        Ok(write)
    }

    /// Makes sure `key` is served here at the data partition's `leader_epoch`: loads its
    /// state from the store (fencing older leaders), or creates it at the group's
    /// `share.auto.offset.reset` (`log_start` for earliest, `high_watermark` for latest),
    /// durably, before anything is handed out. `verify` (a new share session): first asks
    /// the store whether what is served here is still current (an administrator may have
    /// reset or deleted it while the group had no members).
    pub async fn ensure_loaded(
        &self,
        host: &dyn CoordinatorHost,
        key: &PartitionKey,
        topic_id: Uuid,
        leader_epoch: i32,
        (log_start, high_watermark): (i64, i64),
        verify: bool,
    ) -> Result<(), ResponseError> {
        let served =
            self.state.lock().partitions.get(key).filter(|p| p.leader_epoch == leader_epoch).map(|p| p.version);
        if let Some(version) = served {
            if !verify {
                return Ok(());
            }
            let summary = self.store.summary(host, key, topic_id).await?;
            if summary.is_some_and(|s| s.leader_epoch == leader_epoch && s.version <= version) {
                return Ok(());
            }
            let mut state = self.state.lock();
            if state.partitions.get(key).is_some_and(|p| p.leader_epoch == leader_epoch && p.version == version) {
                state.partitions.remove(key);
            }
        }
        let stored = self.store.read(host, key, topic_id, leader_epoch).await?;
        let mut loaded = match stored {
            Some(stored) => LoadedPartition {
                partition: SharePartition::from_stored(&stored),
                topic_id,
                leader_epoch,
                version: stored.version,
            },
            None => {
                let earliest = self
                    .state
                    .lock()
                    .configs
                    .get(&key.0)
                    .and_then(|c| c.get(CONFIG_AUTO_OFFSET_RESET))
                    .is_some_and(|reset| reset == "earliest");
                let start = if earliest { log_start } else { high_watermark };
                let mut created = LoadedPartition {
                    partition: SharePartition::starting_at(start),
                    topic_id,
                    leader_epoch,
                    version: 0,
                };
                self.persist(host, created.next_write(key)).await?;
                created
            }
        };
        let mut state = self.state.lock();
        match state.partitions.get(key) {
            Some(present) if present.leader_epoch == leader_epoch => {}
            _ => {
                loaded.partition.skip_to(log_start);
                state.partitions.insert(key.clone(), loaded);
            }
        }
        Ok(())
    }

    /// Where `member_id`'s fetch should read a loaded share-partition from; `None` when it
    /// is not served here at `leader_epoch`, the in-flight limit is reached, or the group's
    /// membership is kept here and the member's current assignment no longer holds the
    /// partition. Skips past records deleted below `log_start`.
    ///
    /// The last case is the assignment race of consumers that start together: the first
    /// member is given every partition, the next one joins a moment later and takes some
    /// of them, and the first member's fetch still lists them until its next heartbeat.
    /// Records acquired for it then are not processed by the member (the Java client drops
    /// the acknowledgements of a partition it has already forgotten) and stay locked until
    /// their acquisition lock expires, stalling the partition. Where membership lives on
    /// another broker nothing is known here and the fetch is served, as in Kafka.
    pub fn plan_fetch(
        &self,
        key: &PartitionKey,
        member_id: &str,
        leader_epoch: i32,
        log_start: i64,
    ) -> Option<FetchPlan> {
        let mut state = self.state.lock();
        let member = state.groups.get(&key.0).and_then(|group| group.members.get(member_id));
        if member.is_some_and(|m| !m.assignment.get(&key.1).is_some_and(|partitions| partitions.contains(&key.2))) {
            return None;
        }
        let loaded = state.partitions.get_mut(key).filter(|p| p.leader_epoch == leader_epoch)?;
        loaded.partition.skip_to(log_start);
        loaded
            .partition
            .next_fetch_offset(self.settings.partition_max_record_locks, log_start)
            .map(|offset| FetchPlan { offset })
    }

    /// Acquires for `member_id` the records of `batches` (read from the plan's offset).
    pub fn acquire(
        &self,
        key: &PartitionKey,
        member_id: &str,
        batches: &[BatchSpan],
        limit: RecordLimit,
        now_ms: i64,
    ) -> (Vec<AcquiredRange>, Vec<usize>) {
        let mut state = self.state.lock();
        let lock_ms = self.lock_duration_ms(&state.configs, &key.0);
        let Some(loaded) = state.partitions.get_mut(key) else { return (Vec::new(), Vec::new()) };
        let member: Arc<str> = member_id.into();
        loaded.partition.acquire(&member, batches, limit, self.settings.partition_max_record_locks, now_ms + lock_ms)
    }

    /// The ready and unacknowledged records of `key` when it is served here at
    /// `leader_epoch`, for a log from `log_start` up to `high_watermark`.
    pub fn depth(
        &self,
        key: &PartitionKey,
        leader_epoch: i32,
        (log_start, high_watermark): (i64, i64),
    ) -> Option<Depth> {
        let state = self.state.lock();
        let loaded = state.partitions.get(key).filter(|p| p.leader_epoch == leader_epoch)?;
        Some(loaded.partition.depth(log_start, high_watermark))
    }

    /// Archives up to `count` of the oldest ready records of `key`, served here at
    /// `leader_epoch` (a queue over its length limit): their offsets, and the change to
    /// [`ShareCoordinator::persist`]. `None` when it is not served here.
    pub fn discard_ready(
        &self,
        key: &PartitionKey,
        leader_epoch: i32,
        count: u64,
        (log_start, high_watermark): (i64, i64),
    ) -> Option<(Vec<i64>, StateWrite)> {
        let mut state = self.state.lock();
        let loaded = state.partitions.get_mut(key).filter(|p| p.leader_epoch == leader_epoch)?;
        let max_in_flight = self.settings.partition_max_record_locks;
        let discarded = loaded.partition.discard_ready(count, log_start, high_watermark, max_in_flight);
        Some((discarded, loaded.next_write(key)))
    }

    /// A future that resolves when records may have become available again.
    pub fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.released.notified()
    }

    /// Periodic upkeep: members past their session timeout leave (their records are
    /// released), expired locks release their records, share-partitions this node no
    /// longer leads are dropped, dead letters are copied, and the state log is compacted
    /// when due.
    pub async fn upkeep<H: CoordinatorHost>(self: &Arc<Self>, host: &Arc<H>, now_ms: i64) {
        let catalog = host.topics().catalog();
        let catalog = &*catalog;
        let mut dead_letters = Vec::new();
        {
            let mut state = self.state.lock();
            let ShareState { groups, partitions, sessions, configs } = &mut *state;
            for (group_id, group) in groups.iter_mut() {
                let timeout_ms =
                    Self::group_number(configs, group_id, CONFIG_SESSION_TIMEOUT_MS, self.settings.session_timeout_ms);
                let expired: Vec<String> = group
                    .members
                    .iter()
                    .filter(|(_, m)| now_ms - m.last_heartbeat_ms > timeout_ms)
                    .map(|(id, _)| id.clone())
                    .collect();
                for member_id in &expired {
                    tracing::info!(group = %group_id, member = %member_id, "share group member timed out");
                    group.members.remove(member_id);
                    sessions.remove(&(group_id.clone(), member_id.clone()));
                    self.release_member(partitions, configs, group_id, member_id);
                }
                if !expired.is_empty() {
                    group.epoch += 1;
                    assign(group, catalog);
                }
            }
            partitions.retain(|(_, topic, partition), loaded| {
                leader_epoch(&**host, topic, *partition) == Some(loaded.leader_epoch)
            });
            let mut writes = Vec::new();
            for (key, loaded) in partitions.iter_mut() {
                let limit = self.delivery_limit(configs, &key.0);
                if loaded.partition.next_deadline().is_some_and(|deadline| deadline <= now_ms) {
                    let (changed, dead) = loaded.partition.release_expired(now_ms, None, limit);
                    if changed {
                        Self::keep_dead(configs, &key.0, &mut loaded.partition, dead);
                        writes.push(loaded.next_write(key));
                    }
                }
                if !loaded.partition.dead_letters().is_empty() {
                    dead_letters.push(key.clone());
                }
            }
            if !writes.is_empty() {
                self.write_later(writes);
                self.released.notify_waiters();
            }
        }
        for key in dead_letters {
            if self.flushing.lock().insert(key.clone()) {
                let (host, shares) = (host.clone(), self.clone());
                tokio::spawn(async move {
                    dead_letter::flush(&*host, &shares, key.clone()).await;
                    shares.flushing.lock().remove(&key);
                });
            }
        }
        self.store.upkeep(host.logs().syncer()).await;
    }

    /// The dead letters waiting in `key` and the group's dead-letter topic (`None` when
    /// there are none, or no topic is configured any more: then they are dropped).
    pub fn pending_dead_letters(&self, key: &PartitionKey) -> Option<(Vec<DeadRecord>, String)> {
        let mut state = self.state.lock();
        let ShareState { partitions, configs, .. } = &mut *state;
        let loaded = partitions.get_mut(key)?;
        if loaded.partition.dead_letters().is_empty() {
            return None;
        }
        match configs.get(&key.0).and_then(|c| c.get(dead_letter::CONFIG_DEAD_LETTER_TOPIC)) {
            Some(topic) => Some((loaded.partition.dead_letters().to_vec(), topic.clone())),
            None => {
                let all = loaded.partition.dead_letters().to_vec();
                loaded.partition.dead_letters_copied(&all);
                let write = loaded.next_write(key);
                drop(state);
                self.write_later(vec![write]);
                None
            }
        }
    }

    /// `copied` are durable in the dead-letter topic (or gone from the log): drops them
    /// from the share state (written in the background: a crash copies them again).
    pub fn dead_letters_copied(&self, key: &PartitionKey, copied: &[DeadRecord]) {
        let mut state = self.state.lock();
        if let Some(loaded) = state.partitions.get_mut(key) {
            loaded.partition.dead_letters_copied(copied);
            let write = loaded.next_write(key);
            drop(state);
            self.write_later(vec![write]);
        }
    }

    /// The per-group configs set with IncrementalAlterConfigs (GROUP resource).
    pub fn group_configs(&self, group_id: &str) -> GroupConfigs {
        self.state.lock().configs.get(group_id).cloned().unwrap_or_default()
    }

    /// Single node: stores `group_id`'s configs (validated by the caller), durably, and
    /// serves them.
    pub async fn set_group_configs(
        &self,
        host: &dyn CoordinatorHost,
        group_id: &str,
        configs: GroupConfigs,
    ) -> Result<(), ResponseError> {
        self.store.write_configs(host, group_id, configs.clone()).await?;
        self.state.lock().configs.insert(group_id.to_string(), configs);
        Ok(())
    }

    /// Records that `group_id` exists and consumes `topics` (see [`CONFIG_GROUP_TOPICS`]),
    /// once per change (concurrent heartbeats of one group write it once). `None` topics:
    /// removes the registration (DeleteGroups).
    pub async fn register_group(
        &self,
        host: &dyn CoordinatorHost,
        group_id: &str,
        topics: Option<BTreeSet<String>>,
    ) -> Result<(), ResponseError> {
        if topics.is_some() && !self.registering.lock().insert(group_id.to_string()) {
            return Ok(());
        }
        let mut configs = self.group_configs(group_id);
        match &topics {
            Some(topics) => {
                configs.insert(CONFIG_GROUP_TOPICS.to_string(), topics.iter().cloned().collect::<Vec<_>>().join(","))
            }
            None => configs.remove(CONFIG_GROUP_TOPICS),
        };
        let written = match host.group_configs_write_to_controller(group_id, &configs) {
            Some(write) => write.await,
            None => self.set_group_configs(host, group_id, configs).await,
        };
        if topics.is_some() {
            self.registering.lock().remove(group_id);
        }
        if let Err(error) = &written {
            tracing::debug!(group = group_id, ?error, "could not record the share group's registration");
        }
        written
    }

    /// Cluster mode: the group configs of the applied cluster metadata.
    pub fn follow_group_configs(&self, configs: &BTreeMap<String, GroupConfigs>) {
        let mut state = self.state.lock();
        if state.configs.len() != configs.len() || configs.iter().any(|(g, c)| state.configs.get(g) != Some(c)) {
            state.configs = configs.iter().map(|(g, c)| (g.clone(), c.clone())).collect();
        }
    }
}

/// Kafka's simple assignor, per topic: its partitions spread over its subscribers; with
/// more subscribers than partitions, partitions are shared so every member gets one.
fn assign(group: &mut ShareGroup, catalog: &sluice_meta::topics::TopicCatalog) {
    group.catalog_generation = catalog.generation();
    let mut subscribers: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (member_id, member) in &group.members {
        for topic in &member.subscribed {
            subscribers.entry(topic.as_str()).or_default().push(member_id.clone());
        }
    }
    let mut assignments: BTreeMap<String, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
    for (topic, members) in subscribers {
        let Some((_, partitions)) = catalog.get(topic) else { continue };
        if partitions <= 0 {
            continue;
        }
        let count = members.len();
        if count <= partitions as usize {
            for partition in 0..partitions {
                let member = &members[partition as usize % count];
                assignments.entry(member.clone()).or_default().entry(topic.to_string()).or_default().push(partition);
            }
        } else {
            for (index, member) in members.iter().enumerate() {
                let partition = (index % partitions as usize) as i32;
                assignments.entry(member.clone()).or_default().entry(topic.to_string()).or_default().push(partition);
            }
        }
    }
    for (member_id, member) in group.members.iter_mut() {
        member.assignment = assignments.remove(member_id).unwrap_or_default();
    }
}

/// The batches of a read, in order: their offsets and whether each is a control batch;
/// and where each starts and ends in `bytes`.
pub fn batch_spans(bytes: &[u8]) -> Vec<(BatchSpan, std::ops::Range<usize>)> {
    let mut spans = Vec::new();
    let mut position = 0;
    while let Ok(header) = sluice_storage::batch::BatchHeader::parse(&bytes[position..]) {
        let end = position + 12 + header.batch_length as usize;
        if end > bytes.len() || header.batch_length <= 0 {
            break;
        }
        let span = BatchSpan {
            base_offset: header.base_offset,
            last_offset: header.base_offset + i64::from(header.last_offset_delta),
            control: header.attributes & 0x20 != 0,
        };
        spans.push((span, position..end));
        position = end;
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(topics: &[(&str, i32)]) -> sluice_meta::topics::TopicCatalog {
        sluice_meta::topics::TopicCatalog::from_topics(
            topics.iter().map(|(name, n)| (name.to_string(), Uuid::new_v4(), *n)),
        )
    }

    fn settings() -> ShareSettings {
        ShareSettings {
            record_lock_duration_ms: 30_000,
            delivery_count_limit: 5,
            partition_max_record_locks: 2_000,
            heartbeat_interval_ms: 5_000,
            session_timeout_ms: 45_000,
        }
    }

    #[test]
    fn bad_sessions_epochs_and_acknowledgements_get_kafkas_errors_and_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let shares = ShareCoordinator::open_local(dir.path(), settings()).unwrap();
        let catalog = catalog(&[("t", 1)]);
        let topic_id = catalog.get("t").unwrap().0;
        let join = |member: &str, epoch: i32, topics: Option<Vec<String>>| {
            shares.heartbeat("g", member, epoch, None, topics, ("c", "h"), &catalog, 0).map(|a| a.member_epoch)
        };
        assert_eq!(join("m", 0, None).unwrap_err().0, ResponseError::InvalidRequest, "a join names topics");
        let epoch = join("m", 0, Some(vec!["t".into()])).unwrap();
        assert!(epoch >= 1);
        assert_eq!(join("m", epoch + 3, None).unwrap_err().0, ResponseError::FencedMemberEpoch);
        assert_eq!(join("other", 2, None).unwrap_err().0, ResponseError::UnknownMemberId);
        assert_eq!(join("", 0, Some(vec!["t".into()])).unwrap_err().0, ResponseError::InvalidRequest);

        let step = |epoch: i32, fetch: bool| shares.session_step("g", "m", epoch, &[(topic_id, 0)], &[], fetch);
        assert_eq!(step(3, true).err(), Some(ResponseError::ShareSessionNotFound));
        assert_eq!(step(0, false).err(), Some(ResponseError::InvalidShareSessionEpoch), "ShareAcknowledge cannot open");
        assert!(matches!(step(0, true), Ok(ShareSessionStep::Open(p)) if p == vec![(topic_id, 0)]));
        assert_eq!(step(7, true).err(), Some(ResponseError::InvalidShareSessionEpoch));
        assert!(matches!(step(1, true), Ok(ShareSessionStep::Open(_))));
        assert_eq!(step(1, true).err(), Some(ResponseError::InvalidShareSessionEpoch), "a replayed epoch");

        // Five records acquired by m; another member's acknowledgement is refused and
        // changes nothing: m can still accept all of them.
        let key = ("g".to_string(), "t".to_string(), 0);
        let loaded =
            LoadedPartition { partition: SharePartition::starting_at(0), topic_id, leader_epoch: 0, version: 1 };
        shares.state.lock().partitions.insert(key.clone(), loaded);
        assert_eq!(shares.plan_fetch(&key, "m", 1, 0).map(|p| p.offset), None, "not served at another leader epoch");
        assert_eq!(shares.plan_fetch(&key, "m", 0, 0).map(|p| p.offset), Some(0));
        let batch = [BatchSpan { base_offset: 0, last_offset: 4, control: false }];
        assert_eq!(shares.acquire(&key, "m", &batch, RecordLimit::batches(100), 0).0.len(), 1);
        let ack = |member: &str, batches: &[(i64, i64, Vec<i8>)]| {
            shares.acknowledge("g", member, ("t", 0), batches, false, 0).map(|w| (w.state.version, w.state.start))
        };
        assert_eq!(ack("intruder", &[(0, 4, vec![1])]).err(), Some(ResponseError::InvalidRecordState));
        assert_eq!(
            ack("m", &[(0, 1, vec![1]), (3, 9, vec![1])]).err(),
            Some(ResponseError::InvalidRequest),
            "past the end"
        );
        assert_eq!(ack("m", &[(2, 1, vec![1])]).err(), Some(ResponseError::InvalidRequest));
        assert_eq!(ack("m", &[(0, 2, vec![1, 1])]).err(), Some(ResponseError::InvalidRequest), "types per offset");
        assert_eq!(ack("m", &[(3, 4, vec![1]), (0, 1, vec![1])]).err(), Some(ResponseError::InvalidRequest));
        assert_eq!(ack("m", &[(0, 4, vec![1])]), Ok((2, 5)), "one new version, the window moved past the five");
        assert_eq!(shares.plan_fetch(&key, "m", 0, 0).map(|p| p.offset), Some(5));
    }

    #[test]
    fn a_member_is_not_handed_records_of_a_partition_another_member_has_taken() {
        let dir = tempfile::tempdir().unwrap();
        let shares = ShareCoordinator::open_local(dir.path(), settings()).unwrap();
        let catalog = catalog(&[("t", 2)]);
        let topic_id = catalog.get("t").unwrap().0;
        let join = |member: &str| {
            shares.heartbeat("g", member, 0, None, Some(vec!["t".into()]), ("c", "h"), &catalog, 0).unwrap()
        };
        for partition in 0..2 {
            let loaded =
                LoadedPartition { partition: SharePartition::starting_at(0), topic_id, leader_epoch: 0, version: 1 };
            shares.state.lock().partitions.insert(("g".into(), "t".into(), partition), loaded);
        }
        let plan = |member: &str, partition: i32| {
            shares.plan_fetch(&("g".into(), "t".into(), partition), member, 0, 0).map(|p| p.offset)
        };
        assert_eq!(join("a").assignment.unwrap()["t"], vec![0, 1], "the first member gets both partitions");
        assert_eq!((plan("a", 0), plan("a", 1)), (Some(0), Some(0)));
        let taken = join("b").assignment.unwrap()["t"].clone();
        assert_eq!(taken.len(), 1, "the second member takes one of them");
        // Until its next heartbeat, `a`'s share session still lists the partition `b` took:
        // its fetch gets nothing from it, `b`'s does.
        assert_eq!(plan("a", taken[0]), None);
        assert_eq!(plan("b", taken[0]), Some(0));
        assert_eq!(plan("a", 1 - taken[0]), Some(0));
        // A member whose membership is kept on another broker is served.
        assert_eq!(plan("elsewhere", taken[0]), Some(0));
    }

    #[test]
    fn more_members_than_partitions_share_them_and_everyone_gets_one() {
        let mut group = ShareGroup::default();
        for id in ["a", "b", "c", "d"] {
            let member = ShareMember {
                epoch: 0,
                previous_epoch: 0,
                subscribed: vec!["t".into()],
                rack: None,
                client_id: String::new(),
                client_host: String::new(),
                last_heartbeat_ms: 0,
                assignment: BTreeMap::new(),
                sent: None,
            };
            group.members.insert(id.into(), member);
        }
        assign(&mut group, &catalog(&[("t", 2)]));
        let got: Vec<Vec<i32>> = group.members.values().map(|m| m.assignment["t"].clone()).collect();
        assert_eq!(got, vec![vec![0], vec![1], vec![0], vec![1]]);
        group.members.retain(|id, _| id == "a");
        assign(&mut group, &catalog(&[("t", 2)]));
        assert_eq!(group.members["a"].assignment["t"], vec![0, 1]);
    }
}
