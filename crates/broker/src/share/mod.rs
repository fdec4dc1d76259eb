//! Share groups (KIP-932): queues on the log. Members of a share group take records of
//! any assigned partition one by one, acknowledge each (accept, release, reject), and get
//! back, after the lock duration, what they took and did not acknowledge.
//!
//! The coordinator keeps three things behind one lock:
//! - *groups*: members, their subscriptions and assignments (ShareGroupHeartbeat). The
//!   assignor spreads each topic's partitions over its subscribers and, when there are
//!   more members than partitions, shares partitions (every member gets at least one), as
//!   Kafka's simple assignor does. Membership is in memory: after a restart members rejoin
//!   (UNKNOWN_MEMBER_ID), as after a session timeout.
//! - *share-partitions* (`partition.rs`): per (group, topic, partition), the window of
//!   records in flight, their states, locks and delivery counts.
//! - *share sessions* (ShareFetch/ShareAcknowledge): per (group, member), the partitions the
//!   member fetches and the session epoch.
//!
//! Durability: every acknowledgement is written to the share state log (a [`StateLog`],
//! `<data_dir>/share/__share_group_state-0`, key per share-partition, value its window) and
//! answered only once durable, so an acknowledged record is never delivered again after a
//! crash. Acquisitions are not written: after a crash, records that were locked are
//! available again (with the delivery count last written). A partition's start, when first
//! fetched (`share.auto.offset.reset`), and per-group configs are written too.
//!
//! Not yet: share groups in a cluster (ShareGroupHeartbeat answers UNSUPPORTED_VERSION
//! there), `share.isolation.level=read_committed`, the share-group offsets admin APIs.

pub(crate) mod dead_letter;
pub(crate) mod partition;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::Path;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_storage::Syncer;
use uuid::Uuid;

use crate::state_log::{PendingChange, StateLog};
use partition::{AckError, AcquiredRange, BatchSpan, DeadRecord, SharePartition, StoredPartition};

/// Kafka's `group.share.max.share.sessions`.
pub(crate) const SHARE_SESSIONS_MAX: usize = 2_000;
/// Kafka's `group.share.max.size`: members per share group.
pub(crate) const SHARE_GROUP_MEMBERS_MAX: usize = 200;
/// Share groups at most on one broker.
pub(crate) const SHARE_GROUPS_MAX: usize = 10_000;
/// Longest member id a client may send (Kafka's rule).
const MEMBER_ID_CHARS_MAX: usize = 36;

/// Kafka's per-group share configs (IncrementalAlterConfigs on a GROUP resource).
pub(crate) const CONFIG_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";
pub(crate) const CONFIG_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
pub(crate) const CONFIG_DELIVERY_COUNT_LIMIT: &str = "share.delivery.count.limit";

/// The broker's share-group settings (Kafka's `group.share.*` broker configs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShareSettings {
    pub(crate) record_lock_duration_ms: i64,
    pub(crate) delivery_count_limit: i16,
    pub(crate) partition_max_record_locks: usize,
    pub(crate) heartbeat_interval_ms: i32,
    pub(crate) session_timeout_ms: i64,
}

/// What the share state log holds per key.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum ShareRecord {
    Partition(StoredPartition),
    GroupConfig(BTreeMap<String, String>),
}

/// (group, topic, partition)
pub(crate) type PartitionKey = (String, String, i32);

fn partition_log_key((group, topic, partition): &PartitionKey) -> String {
    format!("p\u{0}{group}\u{0}{topic}\u{0}{partition}")
}

fn config_log_key(group: &str) -> String {
    format!("c\u{0}{group}")
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
    partitions: HashMap<PartitionKey, SharePartition>,
    sessions: HashMap<(String, String), ShareSession>,
    configs: HashMap<String, BTreeMap<String, String>>,
}

/// A member's heartbeat answer.
pub(crate) struct HeartbeatAnswer {
    pub(crate) member_epoch: i32,
    pub(crate) heartbeat_interval_ms: i32,
    /// Topic -> partitions, when it must be sent.
    pub(crate) assignment: Option<BTreeMap<String, Vec<i32>>>,
}

/// One member as ShareGroupDescribe shows it.
pub(crate) struct MemberDescription {
    pub(crate) member_id: String,
    pub(crate) member_epoch: i32,
    pub(crate) rack: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) subscribed: Vec<String>,
    pub(crate) assignment: BTreeMap<String, Vec<i32>>,
}

pub(crate) struct GroupDescription {
    pub(crate) epoch: i32,
    pub(crate) members: Vec<MemberDescription>,
}

/// Which records a fetch pass may acquire for a partition: read from `offset`.
pub(crate) struct FetchPlan {
    pub(crate) offset: i64,
}

/// Outcome of a share-session step.
pub(crate) enum SessionStep {
    /// Fetch (or acknowledge) these partitions.
    Open(Vec<(Uuid, i32)>),
    /// The session closed (epoch -1): the member's records were released.
    Closed,
}

pub(crate) struct ShareCoordinator {
    settings: ShareSettings,
    /// `None` in a cluster (share groups are single-node for now).
    log: Option<StateLog<ShareRecord>>,
    state: Mutex<ShareState>,
    /// Woken when records may have become available again (released, lock expired).
    released: tokio::sync::Notify,
    /// Share-partitions whose dead letters are being copied now.
    flushing: Mutex<std::collections::HashSet<PartitionKey>>,
}

impl ShareCoordinator {
    /// Single node: opens (replaying) the share state log under `data_dir/share`.
    pub(crate) fn open_local(data_dir: &Path, settings: ShareSettings) -> io::Result<ShareCoordinator> {
        let (log, stored) = StateLog::<ShareRecord>::open_local(&data_dir.join("share").join("__share_group_state-0"))?;
        let mut state = ShareState::default();
        for (key, record) in stored {
            let mut parts = key.split('\u{0}');
            match (parts.next(), record) {
                (Some("p"), ShareRecord::Partition(stored)) => {
                    let (Some(group), Some(topic), Some(Ok(partition))) =
                        (parts.next(), parts.next(), parts.next().map(str::parse::<i32>))
                    else {
                        continue;
                    };
                    let key = (group.to_string(), topic.to_string(), partition);
                    state.partitions.insert(key, SharePartition::from_stored(&stored));
                }
                (Some("c"), ShareRecord::GroupConfig(configs)) => {
                    if let Some(group) = parts.next() {
                        state.configs.insert(group.to_string(), configs);
                    }
                }
                _ => tracing::warn!(key, "skipping an unreadable share state record"),
            }
        }
        tracing::info!(share_partitions = state.partitions.len(), "replayed share group state");
        Ok(ShareCoordinator {
            settings,
            log: Some(log),
            state: Mutex::new(state),
            released: Default::default(),
            flushing: Default::default(),
        })
    }

    /// Cluster mode: share groups are not served yet.
    pub(crate) fn unavailable(settings: ShareSettings) -> ShareCoordinator {
        ShareCoordinator {
            settings,
            log: None,
            state: Mutex::default(),
            released: Default::default(),
            flushing: Default::default(),
        }
    }

    fn log(&self) -> Result<&StateLog<ShareRecord>, ResponseError> {
        self.log.as_ref().ok_or(ResponseError::UnsupportedVersion)
    }

    /// Clean shutdown.
    pub(crate) fn close(&self) {
        if let Some(log) = &self.log {
            if let Err(error) = log.close() {
                tracing::error!(%error, "failed to close the share state log");
            }
        }
    }

    fn lock_duration_ms(&self, configs: &HashMap<String, BTreeMap<String, String>>, group: &str) -> i64 {
        configs
            .get(group)
            .and_then(|c| c.get(CONFIG_LOCK_DURATION_MS))
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.settings.record_lock_duration_ms)
    }

    /// Keeps `dead` for the group's dead-letter topic, if it has one; else they are simply
    /// archived. Returns whether any was kept.
    fn keep_dead(
        configs: &HashMap<String, BTreeMap<String, String>>,
        group: &str,
        partition: &mut SharePartition,
        dead: Vec<DeadRecord>,
    ) -> bool {
        let has_topic = configs.get(group).is_some_and(|c| c.contains_key(dead_letter::CONFIG_DEAD_LETTER_TOPIC));
        if dead.is_empty() || !has_topic {
            return false;
        }
        partition.add_dead_letters(dead);
        true
    }

    fn delivery_limit(&self, configs: &HashMap<String, BTreeMap<String, String>>, group: &str) -> i16 {
        configs
            .get(group)
            .and_then(|c| c.get(CONFIG_DELIVERY_COUNT_LIMIT))
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.settings.delivery_count_limit)
    }

    /// The lock duration members of `group` get (ShareFetch `acquisition_lock_timeout_ms`).
    pub(crate) fn group_lock_duration_ms(&self, group: &str) -> i64 {
        self.lock_duration_ms(&self.state.lock().configs, group)
    }

    /// ShareGroupHeartbeat: join (epoch 0), leave (-1) or heartbeat. `catalog` resolves
    /// subscriptions to partitions.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        member_epoch: i32,
        rack: Option<String>,
        subscribed: Option<Vec<String>>,
        client: (&str, &str),
        catalog: &crate::topics::TopicCatalog,
        now_ms: i64,
        syncer: &Syncer,
    ) -> Result<HeartbeatAnswer, (ResponseError, String)> {
        self.log().map_err(|e| (e, "share groups are not served in cluster mode yet".to_string()))?;
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
            self.release_member(partitions, configs, group_id, member_id, syncer);
            return Ok(HeartbeatAnswer {
                member_epoch: -1,
                heartbeat_interval_ms: self.settings.heartbeat_interval_ms,
                assignment: None,
            });
        }
        if !groups.contains_key(group_id) && groups.len() >= SHARE_GROUPS_MAX {
            return Err((ResponseError::GroupMaxSizeReached, "too many share groups on this broker".to_string()));
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
        Ok(HeartbeatAnswer {
            member_epoch: member.epoch,
            heartbeat_interval_ms: self.settings.heartbeat_interval_ms,
            assignment,
        })
    }

    /// Releases every record `member_id` holds in `group_id`'s share-partitions.
    fn release_member(
        &self,
        partitions: &mut HashMap<PartitionKey, SharePartition>,
        configs: &HashMap<String, BTreeMap<String, String>>,
        group_id: &str,
        member_id: &str,
        syncer: &Syncer,
    ) {
        let limit = self.delivery_limit(configs, group_id);
        let mut any = false;
        for (key, partition) in partitions.iter_mut() {
            if key.0 == group_id {
                let (changed, dead) = partition.release_expired(i64::MIN, Some(member_id), limit);
                any |= changed;
                if Self::keep_dead(configs, group_id, partition, dead) {
                    if let Some(log) = &self.log {
                        let record = ShareRecord::Partition(partition.stored());
                        let _ = log.append(&partition_log_key(key), &record, syncer);
                    }
                }
            }
        }
        if any {
            self.released.notify_waiters();
        }
    }

    /// A share group: known while it has members, share-partition state or configs (an
    /// empty group stays until deleted, as in Kafka).
    pub(crate) fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        let state = self.state.lock();
        let empty = ShareGroup::default();
        let group = match state.groups.get(group_id) {
            Some(group) => group,
            None if state.partitions.keys().any(|(g, _, _)| g == group_id) => &empty,
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

    /// Share groups: (id, member count), those with state but no members included.
    pub(crate) fn list(&self) -> Vec<(String, usize)> {
        let state = self.state.lock();
        let mut listed: BTreeMap<String, usize> =
            state.partitions.keys().map(|(group, _, _)| (group.clone(), 0)).collect();
        listed.extend(state.groups.iter().map(|(id, g)| (id.clone(), g.members.len())));
        listed.into_iter().collect()
    }

    /// The share-partitions of `group_id` and their start offsets (Kafka's SPSO): what
    /// DescribeShareGroupOffsets answers.
    pub(crate) fn start_offsets(&self, group_id: &str) -> BTreeMap<(String, i32), i64> {
        let state = self.state.lock();
        state
            .partitions
            .iter()
            .filter(|((group, _, _), _)| group == group_id)
            .map(|((_, topic, partition), p)| ((topic.clone(), *partition), p.start()))
            .collect()
    }

    /// Whether `member_id` has a share session in `group_id` (a final request needs one).
    pub(crate) fn has_session(&self, group_id: &str, member_id: &str) -> bool {
        self.state.lock().sessions.contains_key(&(group_id.to_string(), member_id.to_string()))
    }

    /// A ShareFetch's or ShareAcknowledge's session step (`fetch`: ShareFetch, which may
    /// open a session with epoch 0; ShareAcknowledge may not). `added` and `forgotten`
    /// change the session's partitions (added first, then forgotten, as Kafka does).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn session_step(
        &self,
        group_id: &str,
        member_id: &str,
        epoch: i32,
        added: &[(Uuid, i32)],
        forgotten: &[(Uuid, i32)],
        fetch: bool,
        syncer: &Syncer,
    ) -> Result<SessionStep, ResponseError> {
        self.log()?;
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
            return Ok(SessionStep::Open(open));
        }
        let Some(session) = sessions.get_mut(&key) else { return Err(ResponseError::ShareSessionNotFound) };
        if epoch == -1 {
            sessions.remove(&key);
            self.release_member(partitions, configs, group_id, member_id, syncer);
            return Ok(SessionStep::Closed);
        }
        if epoch != session.epoch {
            return Err(ResponseError::InvalidShareSessionEpoch);
        }
        session.epoch = if session.epoch == i32::MAX { 1 } else { session.epoch + 1 };
        session.partitions.extend(added.iter().copied());
        for forgotten in forgotten {
            session.partitions.remove(forgotten);
        }
        Ok(SessionStep::Open(session.partitions.iter().copied().collect()))
    }

    /// Applies acknowledgement batches of one share-partition; the partition is unchanged
    /// unless all apply. Returns the change to wait for before answering (a durable write).
    pub(crate) fn acknowledge(
        &self,
        group_id: &str,
        member_id: &str,
        topic: &str,
        partition: i32,
        batches: &[(i64, i64, Vec<i8>)],
        syncer: &Syncer,
    ) -> Result<Option<PendingChange>, ResponseError> {
        let log = self.log()?;
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
        let Some(share_partition) = state.partitions.get_mut(&key) else {
            return Err(ResponseError::InvalidRecordState);
        };
        let mut updated = share_partition.clone();
        let mut dead = Vec::new();
        for (first, last, types) in batches {
            let archived =
                updated.acknowledge(member_id, *first, *last, types, limit).map_err(|error| match error {
                    AckError::NotAcquired => ResponseError::InvalidRecordState,
                    AckError::Invalid => ResponseError::InvalidRequest,
                })?;
            dead.extend(archived);
        }
        let ShareState { configs, partitions, .. } = &mut *state;
        Self::keep_dead(configs, group_id, &mut updated, dead);
        let change = log.append(&partition_log_key(&key), &ShareRecord::Partition(updated.stored()), syncer)?;
        *partitions.get_mut(&key).expect("present") = updated;
        drop(state);
        self.released.notify_waiters();
        Ok(Some(change))
    }

    /// Waits until an acknowledgement is durable.
    pub(crate) async fn wait_durable(&self, change: PendingChange) -> Result<(), ResponseError> {
        self.log()?.wait_durable(change).await
    }

    /// Where a fetch should read a share-partition from, creating it at `initial_offset`
    /// (the group's `share.auto.offset.reset`, resolved by the caller) on first use;
    /// `None` when the in-flight limit is reached. Skips past records deleted below
    /// `log_start`.
    pub(crate) fn plan_fetch(
        &self,
        key: &(String, String, i32),
        log_start: i64,
        initial_offset: impl FnOnce(&str) -> i64,
        syncer: &Syncer,
    ) -> Option<FetchPlan> {
        let log = self.log.as_ref()?;
        let mut state = self.state.lock();
        let ShareState { partitions, configs, .. } = &mut *state;
        let share_partition = match partitions.get_mut(key) {
            Some(p) => p,
            None => {
                let reset = configs.get(&key.0).and_then(|c| c.get(CONFIG_AUTO_OFFSET_RESET)).map(String::as_str);
                let created = SharePartition::starting_at(initial_offset(reset.unwrap_or("latest")));
                // Remembered so a restart does not move the start (written, not awaited).
                let _ = log.append(&partition_log_key(key), &ShareRecord::Partition(created.stored()), syncer);
                partitions.entry(key.clone()).or_insert(created)
            }
        };
        share_partition.skip_to(log_start);
        share_partition
            .next_fetch_offset(self.settings.partition_max_record_locks, log_start)
            .map(|offset| FetchPlan { offset })
    }

    /// Acquires for `member_id` the records of `batches` (read from the plan's offset).
    pub(crate) fn acquire(
        &self,
        key: &(String, String, i32),
        member_id: &str,
        batches: &[BatchSpan],
        max_records: usize,
        now_ms: i64,
    ) -> (Vec<AcquiredRange>, Vec<usize>) {
        let mut state = self.state.lock();
        let lock_ms = self.lock_duration_ms(&state.configs, &key.0);
        let Some(partition) = state.partitions.get_mut(key) else { return (Vec::new(), Vec::new()) };
        let member: Arc<str> = member_id.into();
        partition.acquire(&member, batches, max_records, self.settings.partition_max_record_locks, now_ms + lock_ms)
    }

    /// A future that resolves when records may have become available again.
    pub(crate) fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.released.notified()
    }

    /// Periodic upkeep: members past their session timeout leave (their records are
    /// released), expired locks release their records (written, not awaited), and the
    /// state log is compacted when due.
    pub(crate) async fn upkeep(&self, broker: &Arc<crate::Broker>, now_ms: i64) {
        let catalog = broker.topics.catalog();
        let catalog = &*catalog;
        let syncer = broker.logs.syncer();
        let Some(log) = &self.log else { return };
        let mut dead_letters = Vec::new();
        let snapshot = {
            let mut state = self.state.lock();
            let ShareState { groups, partitions, sessions, configs } = &mut *state;
            for (group_id, group) in groups.iter_mut() {
                let expired: Vec<String> = group
                    .members
                    .iter()
                    .filter(|(_, m)| now_ms - m.last_heartbeat_ms > self.settings.session_timeout_ms)
                    .map(|(id, _)| id.clone())
                    .collect();
                for member_id in &expired {
                    tracing::info!(group = %group_id, member = %member_id, "share group member timed out");
                    group.members.remove(member_id);
                    sessions.remove(&(group_id.clone(), member_id.clone()));
                    self.release_member(partitions, configs, group_id, member_id, syncer);
                }
                if !expired.is_empty() {
                    group.epoch += 1;
                    assign(group, catalog);
                }
            }
            let mut released = false;
            for (key, partition) in partitions.iter_mut() {
                let limit = self.delivery_limit(configs, &key.0);
                if partition.next_deadline().is_some_and(|deadline| deadline <= now_ms) {
                    let (changed, dead) = partition.release_expired(now_ms, None, limit);
                    if changed {
                        released = true;
                        Self::keep_dead(configs, &key.0, partition, dead);
                        let record = ShareRecord::Partition(partition.stored());
                        let _ = log.append(&partition_log_key(key), &record, syncer);
                    }
                }
                if !partition.dead_letters().is_empty() {
                    dead_letters.push(key.clone());
                }
            }
            if released {
                self.released.notify_waiters();
            }
            if log.snapshot_due() {
                let mut entries: BTreeMap<String, ShareRecord> = partitions
                    .iter()
                    .map(|(key, p)| (partition_log_key(key), ShareRecord::Partition(p.stored())))
                    .collect();
                entries.extend(configs.iter().map(|(g, c)| (config_log_key(g), ShareRecord::GroupConfig(c.clone()))));
                log.write_snapshot(&entries, syncer).ok().flatten()
            } else {
                None
            }
        };
        for key in dead_letters {
            if self.flushing.lock().insert(key.clone()) {
                let broker = broker.clone();
                tokio::spawn(async move {
                    dead_letter::flush(broker.clone(), key.clone()).await;
                    broker.shares.flushing.lock().remove(&key);
                });
            }
        }
        if let Some((start, change)) = snapshot {
            if log.wait_durable(change).await.is_ok() {
                log.truncate_before(start);
            }
        }
    }

    /// The dead letters waiting in `key` and the group's dead-letter topic (`None` when
    /// there are none, or no topic is configured any more: then they are dropped).
    pub(crate) fn pending_dead_letters(&self, key: &PartitionKey) -> Option<(Vec<DeadRecord>, String)> {
        let mut state = self.state.lock();
        let ShareState { partitions, configs, .. } = &mut *state;
        let partition = partitions.get_mut(key)?;
        if partition.dead_letters().is_empty() {
            return None;
        }
        match configs.get(&key.0).and_then(|c| c.get(dead_letter::CONFIG_DEAD_LETTER_TOPIC)) {
            Some(topic) => Some((partition.dead_letters().to_vec(), topic.clone())),
            None => {
                let all = partition.dead_letters().to_vec();
                partition.dead_letters_copied(&all);
                None
            }
        }
    }

    /// `copied` are durable in the dead-letter topic (or gone from the log): drops them
    /// from the share state (written, not awaited: a crash copies them again).
    pub(crate) fn dead_letters_copied(&self, key: &PartitionKey, copied: &[DeadRecord], syncer: &Syncer) {
        let Some(log) = &self.log else { return };
        let mut state = self.state.lock();
        if let Some(partition) = state.partitions.get_mut(key) {
            partition.dead_letters_copied(copied);
            let _ = log.append(&partition_log_key(key), &ShareRecord::Partition(partition.stored()), syncer);
        }
    }

    /// The per-group configs set with IncrementalAlterConfigs (GROUP resource).
    pub(crate) fn group_configs(&self, group_id: &str) -> BTreeMap<String, String> {
        self.state.lock().configs.get(group_id).cloned().unwrap_or_default()
    }

    /// Replaces `group_id`'s configs (validated by the caller); durable once the returned
    /// change is.
    pub(crate) fn set_group_configs(
        &self,
        group_id: &str,
        configs: BTreeMap<String, String>,
        syncer: &Syncer,
    ) -> Result<PendingChange, ResponseError> {
        let log = self.log()?;
        let mut state = self.state.lock();
        let change = log.append(&config_log_key(group_id), &ShareRecord::GroupConfig(configs.clone()), syncer)?;
        state.configs.insert(group_id.to_string(), configs);
        Ok(change)
    }
}

/// Kafka's simple assignor, per topic: its partitions spread over its subscribers; with
/// more subscribers than partitions, partitions are shared so every member gets one.
fn assign(group: &mut ShareGroup, catalog: &crate::topics::TopicCatalog) {
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
pub(crate) fn batch_spans(bytes: &[u8]) -> Vec<(BatchSpan, std::ops::Range<usize>)> {
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

    fn catalog(topics: &[(&str, i32)]) -> crate::topics::TopicCatalog {
        crate::topics::TopicCatalog::from_topics(topics.iter().map(|(name, n)| (name.to_string(), Uuid::new_v4(), *n)))
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

    #[tokio::test]
    async fn bad_sessions_epochs_and_acknowledgements_get_kafkas_errors_and_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start();
        let shares = ShareCoordinator::open_local(dir.path(), settings()).unwrap();
        let catalog = catalog(&[("t", 1)]);
        let topic_id = catalog.get("t").unwrap().0;
        let join = |member: &str, epoch: i32, topics: Option<Vec<String>>| {
            shares.heartbeat("g", member, epoch, None, topics, ("c", "h"), &catalog, 0, &syncer).map(|a| a.member_epoch)
        };
        assert_eq!(join("m", 0, None).unwrap_err().0, ResponseError::InvalidRequest, "a join names topics");
        let epoch = join("m", 0, Some(vec!["t".into()])).unwrap();
        assert!(epoch >= 1);
        assert_eq!(join("m", epoch + 3, None).unwrap_err().0, ResponseError::FencedMemberEpoch);
        assert_eq!(join("other", 2, None).unwrap_err().0, ResponseError::UnknownMemberId);
        assert_eq!(join("", 0, Some(vec!["t".into()])).unwrap_err().0, ResponseError::InvalidRequest);

        let step =
            |epoch: i32, fetch: bool| shares.session_step("g", "m", epoch, &[(topic_id, 0)], &[], fetch, &syncer);
        assert_eq!(step(3, true).err(), Some(ResponseError::ShareSessionNotFound));
        assert_eq!(step(0, false).err(), Some(ResponseError::InvalidShareSessionEpoch), "ShareAcknowledge cannot open");
        assert!(matches!(step(0, true), Ok(SessionStep::Open(p)) if p == vec![(topic_id, 0)]));
        assert_eq!(step(7, true).err(), Some(ResponseError::InvalidShareSessionEpoch));
        assert!(matches!(step(1, true), Ok(SessionStep::Open(_))));
        assert_eq!(step(1, true).err(), Some(ResponseError::InvalidShareSessionEpoch), "a replayed epoch");

        // Five records acquired by m; another member's acknowledgement is refused and
        // changes nothing: m can still accept all of them.
        let key = ("g".to_string(), "t".to_string(), 0);
        assert_eq!(shares.plan_fetch(&key, 0, |_| 0, &syncer).map(|p| p.offset), Some(0));
        let batch = [BatchSpan { base_offset: 0, last_offset: 4, control: false }];
        assert_eq!(shares.acquire(&key, "m", &batch, 100, 0).0.len(), 1);
        let ack =
            |member: &str, batches: &[(i64, i64, Vec<i8>)]| shares.acknowledge("g", member, "t", 0, batches, &syncer);
        assert_eq!(ack("intruder", &[(0, 4, vec![1])]).err(), Some(ResponseError::InvalidRecordState));
        assert_eq!(
            ack("m", &[(0, 1, vec![1]), (3, 9, vec![1])]).err(),
            Some(ResponseError::InvalidRequest),
            "past the end"
        );
        assert_eq!(ack("m", &[(2, 1, vec![1])]).err(), Some(ResponseError::InvalidRequest));
        assert_eq!(ack("m", &[(0, 2, vec![1, 1])]).err(), Some(ResponseError::InvalidRequest), "types per offset");
        assert_eq!(ack("m", &[(3, 4, vec![1]), (0, 1, vec![1])]).err(), Some(ResponseError::InvalidRequest));
        let change = ack("m", &[(0, 4, vec![1])]).unwrap().unwrap();
        shares.wait_durable(change).await.unwrap();
        assert_eq!(shares.plan_fetch(&key, 0, |_| 0, &syncer).map(|p| p.offset), Some(5));
        syncer.shutdown();
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
