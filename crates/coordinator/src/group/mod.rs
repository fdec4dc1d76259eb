//! The group coordinator: it owns the membership state machine of every group it
//! coordinates, classic ([`state`]) or consumer protocol (KIP-848, [`consumer`] with the
//! server-side assignors of [`assignor`]), the committed offsets ([`offsets`]) and their
//! durable log ([`journal`]). A group id names one group of one protocol at a time. A node
//! coordinates the groups whose `__consumer_offsets` partition ([`crate::placement`]) it leads:
//! on a single node its one local partition, in a cluster the replicated partitions the
//! controller made it leader of ([`shards`]: loading, dropping, compaction, retention).
//!
//! Why it looks like this: group traffic must never slow the data path, so the
//! coordinator keeps its state behind its own locks (shards, then groups, then offsets;
//! always taken in that order, never held across an `.await`) and long-polls (JoinGroup,
//! SyncGroup) wait on `oneshot` channels that the state machine completes. One tokio task
//! ticks every [`TICK_INTERVAL_MS`] to expire sessions, end join or sync phases, and run
//! the offsets upkeep.
//!
//! ```text
//! let coordinator = GroupCoordinator::open_local(data_dir, timing, settings, segment_bytes)?;
//! coordinator.start_ticker(&host);
//! match coordinator.join("g", request)? { Reply::Ready(r) => .., Reply::Wait(rx) => rx.await }
//! ```

pub mod assignor;
pub mod consumer;
pub mod error;
pub mod journal;
pub mod offsets;
pub mod shards;
pub mod state;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use sluice_storage::Syncer;

use crate::group::consumer::{ConsumerGroup, Heartbeat, HeartbeatAnswer, JOIN_GROUP_MEMBER_EPOCH};
use crate::group::error::{GroupError, GroupRefusal};
use crate::group::journal::{OffsetRecord, OffsetsLog};
use crate::group::offsets::{CommittedOffset, OffsetTable};
use crate::group::shards::{OffsetsSettings, ShardMap};
use crate::group::state::{
    Group, GroupState, JoinRequest, JoinResponse, MemberDescription, Reply, SyncRequest, SyncResponse, Timing,
};
use sluice_meta::topics::TopicCatalog;
use sluice_replication::ReplicaHost;

pub use crate::group::journal::OFFSETS_TOPIC;

/// Members per group (Kafka's `group.max.size` defaults to unbounded; a group this large
/// already makes every rebalance ship megabytes to its leader).
pub const GROUP_MEMBERS_MAX: usize = 1_000;
/// Groups this coordinator holds state for (live groups plus groups with offsets).
pub const GROUPS_MAX: usize = 100_000;
/// Bytes of all protocol metadata one member may send in JoinGroup.
pub const MEMBER_METADATA_BYTES_MAX: usize = 1024 * 1024;
/// Bytes of one member's assignment in SyncGroup.
pub const MEMBER_ASSIGNMENT_BYTES_MAX: usize = 1024 * 1024;
/// Assignors one member may offer.
pub const MEMBER_PROTOCOLS_MAX: usize = 64;
/// Kafka's `group.min.session.timeout.ms` and `group.max.session.timeout.ms`.
pub const SESSION_TIMEOUT_MS_MIN: i32 = 6_000;
pub const SESSION_TIMEOUT_MS_MAX: i32 = 1_800_000;
/// Rebalance timeouts are clamped to this, which bounds every JoinGroup long-poll.
pub const REBALANCE_TIMEOUT_MS_MAX: i32 = 30 * 60 * 1000;
/// Kafka's `offset.metadata.max.bytes`.
pub const OFFSET_METADATA_BYTES_MAX: usize = 4096;
/// One OffsetCommit is one batch of the offsets log; this is its size limit.
pub const OFFSETS_BATCH_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Group ids longer than this are refused (they are stored in every offsets record).
pub const GROUP_ID_BYTES_MAX: usize = 4096;
/// How often sessions and rebalance deadlines are checked.
pub const TICK_INTERVAL_MS: u64 = 100;
/// How long an offsets write may wait for its fsync before the client hears a timeout.
pub const OFFSETS_WRITE_TIMEOUT_MS: u64 = 30_000;
/// Slack on top of a long-poll's own deadline before the handler gives up on it.
pub const LONG_POLL_SLACK_MS: u64 = 5_000;

const _: () = assert!(GROUP_ID_BYTES_MAX < u16::MAX as usize);
const _: () = assert!(SESSION_TIMEOUT_MS_MIN < SESSION_TIMEOUT_MS_MAX);
const _: () = assert!(MEMBER_METADATA_BYTES_MAX < OFFSETS_BATCH_BYTES_MAX);

/// Group types as ListGroups v5 shows them.
pub const GROUP_TYPE_CLASSIC: &str = "classic";
pub const GROUP_TYPE_CONSUMER: &str = "consumer";
/// The protocol type of consumer-protocol groups in ListGroups and DescribeGroups.
pub const PROTOCOL_TYPE_CONSUMER: &str = "consumer";

/// A group as ListGroups shows it.
#[derive(Debug, Clone)]
pub struct GroupListing {
    pub group_id: String,
    pub protocol_type: String,
    pub state: &'static str,
    pub group_type: &'static str,
}

/// A group as DescribeGroups shows it.
#[derive(Debug, Clone)]
pub struct GroupDescription {
    pub state: &'static str,
    pub protocol_type: String,
    pub protocol_name: String,
    pub members: Vec<MemberDescription>,
}

/// Committed offsets asked for in OffsetFetch: `None` means every committed one.
pub type OffsetQuery = Option<Vec<(String, Vec<i32>)>>;
/// OffsetFetch's answer: per topic, per partition, the committed offset if any.
pub type FetchedOffsets = Vec<(String, Vec<(i32, Option<CommittedOffset>)>)>;
/// OffsetDelete's answer: per topic, per partition, whether it may be deleted.
pub type DeleteResults = Vec<(String, Vec<(i32, Result<(), GroupError>)>)>;

/// Every live group, by protocol. Invariant: a group id is a key of at most one map.
#[derive(Debug, Default)]
struct Groups {
    classic: HashMap<String, Group>,
    consumer: HashMap<String, ConsumerGroup>,
}

impl Groups {
    fn len(&self) -> usize {
        self.classic.len() + self.consumer.len()
    }

    fn contains(&self, group_id: &str) -> bool {
        self.classic.contains_key(group_id) || self.consumer.contains_key(group_id)
    }
}

/// The coordinator of every group whose offsets partition this node leads.
pub struct GroupCoordinator {
    timing: Timing,
    settings: OffsetsSettings,
    /// Lock order: shards, then groups, then offsets.
    shards: RwLock<ShardMap>,
    groups: Mutex<Groups>,
    offsets: Mutex<OffsetTable>,
    /// When each group with offsets was last seen with members (for retention).
    idle_since_ms: Mutex<HashMap<String, i64>>,
    last_retention_check_ms: Mutex<i64>,
    ticker_started: AtomicBool,
    /// Cluster mode: a creation of the offsets topic is under way.
    pub creating_offsets_topic: AtomicBool,
}

/// Group ids must be non-empty and bounded.
pub fn validate_group_id(group_id: &str) -> Result<(), GroupError> {
    if group_id.is_empty() || group_id.len() > GROUP_ID_BYTES_MAX {
        return Err(GroupError::InvalidGroupId);
    }
    Ok(())
}

impl GroupCoordinator {
    /// Single node: opens the one local offsets partition under `data_dir/groups` and
    /// replays it into memory; this node coordinates every group.
    pub fn open_local(
        data_dir: &Path,
        timing: Timing,
        settings: OffsetsSettings,
        segment_bytes: u64,
    ) -> io::Result<Arc<GroupCoordinator>> {
        let started = std::time::Instant::now();
        let log = OffsetsLog::open_local(&data_dir.join("groups"), segment_bytes)?;
        let records = log.replay()?;
        let replayed = records.len();
        let table = shards::table_from(records);
        tracing::info!(
            records = replayed,
            groups = table.group_count(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "replayed committed offsets"
        );
        Ok(Arc::new(GroupCoordinator::new(timing, settings, crate::group::shards::local_shards(log), table)))
    }

    /// Cluster mode: coordinates nothing until [`GroupCoordinator::follow_leadership`]
    /// says which offsets partitions this node leads.
    pub fn replicated(timing: Timing, settings: OffsetsSettings) -> Arc<GroupCoordinator> {
        Arc::new(GroupCoordinator::new(timing, settings, ShardMap::default(), OffsetTable::default()))
    }

    fn new(timing: Timing, settings: OffsetsSettings, shards: ShardMap, table: OffsetTable) -> GroupCoordinator {
        GroupCoordinator {
            timing,
            settings,
            shards: RwLock::new(shards),
            groups: Mutex::new(Groups::default()),
            offsets: Mutex::new(table),
            idle_since_ms: Mutex::new(HashMap::new()),
            last_retention_check_ms: Mutex::new(sluice_storage::now_ms()),
            ticker_started: AtomicBool::new(false),
            creating_offsets_topic: AtomicBool::new(false),
        }
    }

    /// Starts the tick task once (inside the runtime): group timers, and the offsets
    /// upkeep (compaction, retention), which needs the host's syncer.
    pub fn start_ticker<H: ReplicaHost>(self: &Arc<Self>, host: &Arc<H>) {
        if self.ticker_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let coordinator: Weak<GroupCoordinator> = Arc::downgrade(self);
        let host: Weak<H> = Arc::downgrade(host);
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_millis(TICK_INTERVAL_MS));
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let Some(coordinator) = coordinator.upgrade() else { return };
                let Some(host) = host.upgrade() else { return };
                let now_ms = sluice_storage::now_ms();
                coordinator.tick(now_ms);
                coordinator.upkeep(now_ms, host.logs().syncer());
            }
        });
    }

    /// Expires sessions, ends overdue join and sync phases, and forgets empty groups that
    /// have no committed offsets.
    pub fn tick(&self, now_ms: i64) {
        let mut groups = self.groups.lock();
        for group in groups.classic.values_mut() {
            group.tick(now_ms, &self.timing);
        }
        for group in groups.consumer.values_mut() {
            group.tick(now_ms, &self.timing);
        }
        let offsets = self.offsets.lock();
        groups.classic.retain(|group_id, group| !group.is_idle() || offsets.has_group(group_id));
        groups.consumer.retain(|group_id, group| !group.is_empty() || offsets.has_group(group_id));
    }

    /// A request that passed the coordinator check just before its partition moved away
    /// may have created a group here; nothing can reach it, so it is forgotten (from the
    /// periodic upkeep: it costs a hash per group).
    fn forget_unserved_groups(&self) {
        let shards = self.shards.read();
        let mut groups = self.groups.lock();
        groups.classic.retain(|group_id, _| shards.serving(group_id).is_ok());
        groups.consumer.retain(|group_id, _| shards.serving(group_id).is_ok());
    }

    pub fn join(&self, group_id: &str, request: JoinRequest) -> Result<Reply<JoinResponse>, GroupError> {
        validate_group_id(group_id)?;
        self.serving(group_id)?;
        let mut groups = self.groups.lock();
        if let Some(group) = groups.consumer.get(group_id) {
            // An empty consumer-protocol group becomes a classic group (its offsets stay);
            // Sluice does not mix protocols within one live group.
            if !group.is_empty() {
                return Err(GroupError::InconsistentGroupProtocol);
            }
            tracing::info!(group = group_id, "empty consumer-protocol group converted to a classic group");
            groups.consumer.remove(group_id);
        }
        if !groups.classic.contains_key(group_id) {
            if !request.member_id.is_empty() {
                return Err(GroupError::UnknownMemberId);
            }
            if groups.len() >= GROUPS_MAX {
                return Err(GroupError::TooManyGroups);
            }
            groups.classic.insert(group_id.to_string(), Group::new(group_id));
        }
        let group = groups.classic.get_mut(group_id).expect("inserted above");
        Ok(group.join(request, sluice_storage::now_ms(), &self.timing))
    }

    pub fn sync(&self, group_id: &str, request: SyncRequest) -> Reply<SyncResponse> {
        if let Err(error) = self.serving(group_id) {
            return Reply::Ready(SyncResponse::failed(error));
        }
        let mut groups = self.groups.lock();
        match groups.classic.get_mut(group_id) {
            Some(group) => group.sync(request, sluice_storage::now_ms()),
            None => Reply::Ready(SyncResponse::failed(GroupError::UnknownMemberId)),
        }
    }

    pub fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        group_instance_id: Option<&str>,
        generation_id: i32,
    ) -> Result<(), GroupError> {
        self.serving(group_id)?;
        let mut groups = self.groups.lock();
        let group = groups.classic.get_mut(group_id).ok_or(GroupError::UnknownMemberId)?;
        group.heartbeat(member_id, group_instance_id, generation_id, sluice_storage::now_ms())
    }

    /// LeaveGroup for each (member id, instance id); the outer error is for the group.
    pub fn leave(
        &self,
        group_id: &str,
        members: &[(String, Option<String>)],
    ) -> Result<Vec<Result<(), GroupError>>, GroupError> {
        self.serving(group_id)?;
        let mut groups = self.groups.lock();
        let Some(group) = groups.classic.get_mut(group_id) else {
            return Ok(members.iter().map(|_| Err(GroupError::UnknownMemberId)).collect());
        };
        let now_ms = sluice_storage::now_ms();
        Ok(members
            .iter()
            .map(|(member_id, instance_id)| group.leave(member_id, instance_id.as_deref(), now_ms, &self.timing))
            .collect())
    }

    /// Checks the committer, appends the commit to the offsets log and returns a future
    /// that resolves once it is durable and visible to OffsetFetch. `generation_id` is the
    /// member epoch for consumer-protocol groups (OffsetCommit v9).
    pub fn commit_offsets(
        self: &Arc<Self>,
        group_id: &str,
        committer: Committer<'_>,
        commits: Vec<(String, i32, CommittedOffset)>,
        syncer: &Syncer,
    ) -> Result<impl Future<Output = Result<(), GroupError>> + Send + 'static, GroupError> {
        validate_group_id(group_id)?;
        let shard = self.serving(group_id)?;
        let Committer { member_id, group_instance_id, generation_id, version } = committer;
        {
            let mut groups = self.groups.lock();
            let consumer_group = groups.consumer.get(group_id);
            if let Some(group) = consumer_group {
                group.validate_commit(member_id, generation_id, version)?;
            }
            let consumer_group = consumer_group.is_some();
            match groups.classic.get_mut(group_id) {
                Some(group) => group.validate_commit(
                    member_id,
                    group_instance_id,
                    generation_id,
                    false,
                    sluice_storage::now_ms(),
                )?,
                None if consumer_group => {}
                None if generation_id < 0 => {
                    let offsets = self.offsets.lock();
                    if !offsets.has_group(group_id) && groups.len() + offsets.group_count() >= GROUPS_MAX {
                        return Err(GroupError::TooManyGroups);
                    }
                }
                None => return Err(GroupError::IllegalGeneration),
            }
        }
        self.write_commits(&shard, group_id, commits, syncer)
    }

    /// TxnOffsetCommit: checks the committer (KIP-447: one that names its member or
    /// generation must be a current member at the group's generation, so a producer whose
    /// consumer was rebalanced away cannot commit offsets for partitions it lost; clients
    /// before KIP-447 send no member and generation -1 and are checked by their producer
    /// epoch alone, as in Kafka), then appends the offsets as pending on `producer_id`'s
    /// transaction: they become committed offsets when its commit marker arrives
    /// ([`GroupCoordinator::end_transaction`]) and vanish on an abort.
    pub fn commit_transactional_offsets(
        self: &Arc<Self>,
        group_id: &str,
        committer: Committer<'_>,
        producer_id: i64,
        producer_epoch: i16,
        commits: Vec<(String, i32, CommittedOffset)>,
        syncer: &Syncer,
    ) -> Result<impl Future<Output = Result<(), GroupError>> + Send + 'static, GroupError> {
        validate_group_id(group_id)?;
        let shard = self.serving(group_id)?;
        let Committer { member_id, group_instance_id, generation_id, .. } = committer;
        if generation_id >= 0 || !member_id.is_empty() || group_instance_id.is_some() {
            let mut groups = self.groups.lock();
            if let Some(group) = groups.consumer.get(group_id) {
                group.validate_transactional_commit(member_id, generation_id)?;
            } else {
                match groups.classic.get_mut(group_id) {
                    Some(group) => group.validate_commit(
                        member_id,
                        group_instance_id,
                        generation_id,
                        true,
                        sluice_storage::now_ms(),
                    )?,
                    None if generation_id < 0 => {}
                    None => return Err(GroupError::UnknownMemberId),
                }
            }
        }
        if self.offsets.lock().producer_fenced(producer_id, producer_epoch) {
            return Err(GroupError::ProducerFenced);
        }
        let records = commits
            .into_iter()
            .map(|(topic, partition, value)| OffsetRecord::TxnCommit {
                producer_id,
                producer_epoch,
                group: group_id.to_string(),
                topic,
                partition,
                value,
            })
            .collect();
        self.write(&shard, group_id, records, syncer)
    }

    /// A transaction coordinator's marker for offsets partition `partition`: the
    /// transaction of `producer_id` ended; its pending offsets there commit or vanish once
    /// the returned future resolves (the marker is durable).
    pub fn end_transaction(
        self: &Arc<Self>,
        partition: i32,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        syncer: &Syncer,
    ) -> Result<impl Future<Output = Result<(), GroupError>> + Send + 'static, GroupError> {
        let shard = self.serving_partition(partition)?;
        self.write(&shard, "", vec![OffsetRecord::TxnEnd { producer_id, producer_epoch, commit }], syncer)
    }

    /// Whether an open transaction holds offsets of `group_id` for this partition that are
    /// not committed yet (OffsetFetch with `require_stable`).
    pub fn has_pending_txn_offsets(&self, group_id: &str, topic: &str, partition: i32) -> bool {
        self.offsets.lock().has_pending_txn(group_id, topic, partition)
    }

    /// Commits offsets a transaction carried in the transaction coordinator's own state
    /// (how versions before the transactional offsets records kept them); only a single
    /// node's transaction decided before an upgrade has any.
    pub fn commit_legacy_transactional_offsets(
        self: &Arc<Self>,
        group_id: &str,
        commits: Vec<(String, i32, CommittedOffset)>,
        syncer: &Syncer,
    ) -> Result<impl Future<Output = Result<(), GroupError>> + Send + 'static, GroupError> {
        validate_group_id(group_id)?;
        let shard = self.serving(group_id)?;
        self.write_commits(&shard, group_id, commits, syncer)
    }

    /// Appends offset commits to the group's offsets log.
    fn write_commits(
        self: &Arc<Self>,
        shard: &Arc<shards::ShardLog>,
        group_id: &str,
        commits: Vec<(String, i32, CommittedOffset)>,
        syncer: &Syncer,
    ) -> Result<impl Future<Output = Result<(), GroupError>> + Send + 'static, GroupError> {
        let records: Vec<OffsetRecord> = commits
            .into_iter()
            .map(|(topic, partition, value)| OffsetRecord::Commit {
                group: group_id.to_string(),
                topic,
                partition,
                value,
            })
            .collect();
        self.write(shard, group_id, records, syncer)
    }

    /// OffsetFetch v9 from a member of a consumer-protocol group must carry its current
    /// epoch; everyone else (classic members, admin tools, unknown groups, whose offsets
    /// come back as -1) may fetch freely.
    pub fn validate_offset_fetch(
        &self,
        group_id: &str,
        member_id: Option<&str>,
        member_epoch: i32,
    ) -> Result<(), GroupError> {
        self.serving(group_id)?;
        let groups = self.groups.lock();
        match groups.consumer.get(group_id) {
            Some(group) => group.validate_fetch(member_id, member_epoch),
            None => Ok(()),
        }
    }

    /// Committed offsets of `group_id` for the asked partitions (or all of them).
    pub fn fetch_offsets(&self, group_id: &str, query: OffsetQuery) -> Result<FetchedOffsets, GroupError> {
        self.serving(group_id)?;
        let offsets = self.offsets.lock();
        Ok(match query {
            Some(topics) => topics
                .into_iter()
                .map(|(topic, partitions)| {
                    let found =
                        partitions.into_iter().map(|p| (p, offsets.get(group_id, &topic, p).cloned())).collect();
                    (topic, found)
                })
                .collect(),
            None => {
                let mut by_topic: BTreeMap<String, Vec<(i32, Option<CommittedOffset>)>> = BTreeMap::new();
                for (topic, partition, value) in offsets.all(group_id) {
                    by_topic.entry(topic).or_default().push((partition, Some(value)));
                }
                by_topic.into_iter().collect()
            }
        })
    }

    /// Topics the live members of a consumer-protocol group subscribe to, or `None` when
    /// the group has members of another protocol type (then nothing may be deleted).
    fn subscribed_topics(group: &Group) -> Option<Vec<String>> {
        if group.member_count() == 0 {
            return Some(Vec::new());
        }
        if group.protocol_type() != Some("consumer") {
            return None;
        }
        let mut topics = Vec::new();
        for metadata in group.member_metadata() {
            topics.extend(decode_subscription(&metadata));
        }
        Some(topics)
    }

    /// OffsetDelete: tombstones for the asked partitions not subscribed to by live
    /// members. Returns per-partition results and a future for the durable write.
    pub fn delete_offsets(
        self: &Arc<Self>,
        group_id: &str,
        topics: Vec<(String, Vec<i32>)>,
        syncer: &Syncer,
    ) -> Result<(DeleteResults, impl Future<Output = Result<(), GroupError>> + Send), GroupError> {
        self.serving(group_id)?;
        let subscribed = {
            let groups = self.groups.lock();
            let offsets = self.offsets.lock();
            match (groups.classic.get(group_id), groups.consumer.get(group_id)) {
                (Some(group), _) => Self::subscribed_topics(group).ok_or(GroupError::NonEmptyGroup)?,
                (None, Some(group)) => group.subscribed_topic_names(),
                (None, None) if offsets.has_group(group_id) => Vec::new(),
                (None, None) => return Err(GroupError::GroupIdNotFound),
            }
        };
        let mut results = Vec::new();
        let mut deletions = Vec::new();
        {
            let offsets = self.offsets.lock();
            for (topic, partitions) in topics {
                let blocked = subscribed.contains(&topic);
                let mut topic_results = Vec::new();
                for partition in partitions {
                    if blocked {
                        topic_results.push((partition, Err(GroupError::GroupSubscribedToTopic)));
                        continue;
                    }
                    if offsets.get(group_id, &topic, partition).is_some() {
                        deletions.push((topic.clone(), partition));
                    }
                    topic_results.push((partition, Ok(())));
                }
                results.push((topic, topic_results));
            }
        }
        let write = self.write_tombstones(group_id, deletions, syncer)?;
        Ok((results, write))
    }

    fn write_tombstones(
        self: &Arc<Self>,
        group_id: &str,
        deletions: Vec<(String, i32)>,
        syncer: &Syncer,
    ) -> Result<impl Future<Output = Result<(), GroupError>> + Send + 'static, GroupError> {
        let shard = self.serving(group_id)?;
        let records: Vec<OffsetRecord> = deletions
            .into_iter()
            .map(|(topic, partition)| OffsetRecord::Delete { group: group_id.to_string(), topic, partition })
            .collect();
        self.write(&shard, group_id, records, syncer)
    }

    /// DeleteGroups for one group: refused while it has members; otherwise the group is
    /// forgotten and its offsets deleted durably.
    pub fn delete_group(
        self: &Arc<Self>,
        group_id: &str,
        syncer: &Syncer,
    ) -> Result<impl Future<Output = Result<(), GroupError>> + Send + 'static, GroupError> {
        validate_group_id(group_id)?;
        self.serving(group_id)?;
        let deletions: Vec<(String, i32)> = {
            let mut groups = self.groups.lock();
            let offsets = self.offsets.lock();
            let known = groups.contains(group_id) || offsets.has_group(group_id);
            if !known {
                return Err(GroupError::GroupIdNotFound);
            }
            if let Some(group) = groups.classic.get_mut(group_id) {
                if group.state() != GroupState::Empty {
                    return Err(GroupError::NonEmptyGroup);
                }
                group.mark_dead();
            }
            if groups.consumer.get(group_id).is_some_and(|group| !group.is_empty()) {
                return Err(GroupError::NonEmptyGroup);
            }
            groups.classic.remove(group_id);
            groups.consumer.remove(group_id);
            offsets.all(group_id).into_iter().map(|(topic, partition, _)| (topic, partition)).collect()
        };
        tracing::info!(group = group_id, offsets = deletions.len(), "deleting group");
        self.write_tombstones(group_id, deletions, syncer)
    }

    /// Every committed offset this coordinator holds: (group, topic, partition, offset), at
    /// most `limit` of them (the metrics' lag series are bounded).
    pub fn committed_offsets(&self, limit: usize) -> Vec<(String, String, i32, i64)> {
        let offsets = self.offsets.lock();
        let mut all = Vec::new();
        for group in offsets.group_ids() {
            for (topic, partition, committed) in offsets.all(group) {
                if all.len() >= limit {
                    return all;
                }
                all.push((group.to_string(), topic, partition, committed.offset));
            }
        }
        all
    }

    /// Every group: live ones and those known only by their committed offsets.
    pub fn list_groups(&self) -> Vec<GroupListing> {
        let groups = self.groups.lock();
        let offsets = self.offsets.lock();
        let mut listings: Vec<GroupListing> = groups
            .classic
            .iter()
            .filter(|(_, group)| group.state() != GroupState::Dead)
            .map(|(group_id, group)| GroupListing {
                group_id: group_id.clone(),
                protocol_type: group.protocol_type().unwrap_or_default().to_string(),
                state: group.state().name(),
                group_type: GROUP_TYPE_CLASSIC,
            })
            .collect();
        listings.extend(groups.consumer.iter().map(|(group_id, group)| GroupListing {
            group_id: group_id.clone(),
            protocol_type: PROTOCOL_TYPE_CONSUMER.to_string(),
            state: group.state().name(),
            group_type: GROUP_TYPE_CONSUMER,
        }));
        listings.extend(offsets.group_ids().filter(|id| !groups.contains(id)).map(|id| GroupListing {
            group_id: id.to_string(),
            protocol_type: String::new(),
            state: GroupState::Empty.name(),
            group_type: GROUP_TYPE_CLASSIC,
        }));
        listings.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        listings
    }

    /// DescribeGroups for one group; an unknown group is `Dead`, as in Kafka. A
    /// consumer-protocol group is shown in the classic shape: its assignor as the protocol,
    /// each member's assignment encoded as a ConsumerProtocolAssignment.
    pub fn describe_group(&self, group_id: &str, catalog: &TopicCatalog) -> GroupDescription {
        let groups = self.groups.lock();
        if let Some(group) = groups.consumer.get(group_id) {
            return classic_description(group, catalog);
        }
        match groups.classic.get(group_id) {
            Some(group) => GroupDescription {
                state: group.state().name(),
                protocol_type: group.protocol_type().unwrap_or_default().to_string(),
                protocol_name: if group.state() == GroupState::Stable {
                    group.protocol_name().unwrap_or_default().to_string()
                } else {
                    String::new()
                },
                members: group.describe_members(),
            },
            None => {
                let state = if self.offsets.lock().has_group(group_id) { GroupState::Empty } else { GroupState::Dead };
                GroupDescription {
                    state: state.name(),
                    protocol_type: String::new(),
                    protocol_name: String::new(),
                    members: Vec::new(),
                }
            }
        }
    }

    /// ConsumerGroupHeartbeat. A heartbeat with epoch 0 creates the group, or converts an
    /// idle classic group of that id; a live classic group is GROUP_ID_NOT_FOUND, as in
    /// Kafka. A known epoch for a group this node does not have gets UNKNOWN_MEMBER_ID so
    /// the member rejoins: membership lives in memory here, so after a restart the group
    /// is gone (Kafka, which persists it, would never see this case).
    pub fn consumer_heartbeat(
        &self,
        group_id: &str,
        request: Heartbeat,
        catalog: &TopicCatalog,
    ) -> Result<HeartbeatAnswer, GroupRefusal> {
        if validate_group_id(group_id).is_err() {
            return Err(GroupError::InvalidRequest.because("GroupId can't be empty."));
        }
        self.serving(group_id)?;
        let mut groups = self.groups.lock();
        if let Some(classic) = groups.classic.get(group_id) {
            if request.member_epoch != JOIN_GROUP_MEMBER_EPOCH || !classic.is_idle() {
                return Err(GroupError::GroupIdNotFound.because(format!("Group {group_id} is not a consumer group.")));
            }
            tracing::info!(group = group_id, "empty classic group converted to a consumer-protocol group");
            groups.classic.remove(group_id);
        }
        if !groups.consumer.contains_key(group_id) {
            if request.member_epoch != JOIN_GROUP_MEMBER_EPOCH {
                let message = format!("Member {} is not a member of group {group_id}.", request.member_id);
                return Err(GroupError::UnknownMemberId.because(message));
            }
            if groups.len() >= GROUPS_MAX {
                return Err(GroupError::TooManyGroups.into());
            }
            groups.consumer.insert(group_id.to_string(), ConsumerGroup::new(group_id));
        }
        let group = groups.consumer.get_mut(group_id).expect("inserted above");
        group.heartbeat(request, catalog, sluice_storage::now_ms(), &self.timing)
    }

    /// ConsumerGroupDescribe for one group: GROUP_ID_NOT_FOUND for unknown and classic
    /// groups (the admin client then falls back to DescribeGroups), as in Kafka.
    pub fn describe_consumer_group(&self, group_id: &str) -> Result<consumer::GroupDescription, GroupRefusal> {
        self.serving(group_id)?;
        let groups = self.groups.lock();
        if let Some(group) = groups.consumer.get(group_id) {
            return Ok(group.describe());
        }
        let message = if groups.classic.contains_key(group_id) {
            format!("Group {group_id} is not a consumer group.")
        } else {
            format!("Group {group_id} not found.")
        };
        Err(GroupError::GroupIdNotFound.because(message))
    }

    /// Clean shutdown: fsync and seal the local offsets log (after the syncer has stopped).
    pub fn close(&self) {
        let active: Vec<_> = self.shards.read().active().cloned().collect();
        for shard in active {
            shard.close();
        }
    }
}

/// Who commits offsets: `generation_id` is the classic generation or, for members of a
/// consumer-protocol group, the member epoch; `version` is the OffsetCommit version.
#[derive(Debug, Clone, Copy)]
pub struct Committer<'a> {
    pub member_id: &'a str,
    pub group_instance_id: Option<&'a str>,
    pub generation_id: i32,
    pub version: i16,
}

impl Committer<'_> {
    /// A commit from outside any group (admin tools, manually assigned consumers).
    #[cfg(test)]
    fn simple() -> Committer<'static> {
        Committer { member_id: "", group_instance_id: None, generation_id: -1, version: 9 }
    }
}

/// A consumer-protocol group in DescribeGroups' classic shape.
fn classic_description(group: &ConsumerGroup, catalog: &TopicCatalog) -> GroupDescription {
    let description = group.describe();
    let members = description
        .members
        .into_iter()
        .map(|m| MemberDescription {
            member_id: m.member_id,
            group_instance_id: m.instance_id,
            client_id: m.client_id,
            client_host: m.client_host,
            metadata: bytes::Bytes::new(),
            assignment: encode_assignment(&m.assignment, catalog),
        })
        .collect();
    GroupDescription {
        state: description.state.name(),
        protocol_type: PROTOCOL_TYPE_CONSUMER.to_string(),
        protocol_name: description.assignor.to_string(),
        members,
    }
}

/// A ConsumerProtocolAssignment (v0, with its version prefix) naming the topics; topics
/// deleted meanwhile are left out.
fn encode_assignment(assignment: &assignor::Assignment, catalog: &TopicCatalog) -> bytes::Bytes {
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
    use kafka_protocol::messages::{ConsumerProtocolAssignment, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let assigned_partitions = assignment
        .iter()
        .filter_map(|(topic_id, partitions)| {
            let name = catalog.name_for_id(topic_id)?;
            let mut topic = TopicPartition::default();
            topic.topic = TopicName(StrBytes::from_string(name.to_string()));
            topic.partitions = partitions.iter().copied().collect();
            Some(topic)
        })
        .collect();
    let mut message = ConsumerProtocolAssignment::default();
    message.assigned_partitions = assigned_partitions;
    let mut buffer = bytes::BytesMut::new();
    buffer.extend_from_slice(&0i16.to_be_bytes());
    match message.encode(&mut buffer, 0) {
        Ok(()) => buffer.freeze(),
        Err(error) => {
            tracing::error!(%error, "failed to encode a consumer protocol assignment");
            bytes::Bytes::new()
        }
    }
}

/// Topics in a ConsumerProtocolSubscription (the consumer protocol's member metadata);
/// empty if it cannot be decoded.
fn decode_subscription(metadata: &bytes::Bytes) -> Vec<String> {
    use kafka_protocol::messages::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::Decodable;
    let mut buffer = metadata.clone();
    if buffer.len() < 2 {
        return Vec::new();
    }
    let version = i16::from_be_bytes([buffer[0], buffer[1]]);
    bytes::Buf::advance(&mut buffer, 2);
    let version = version.clamp(0, 3);
    match ConsumerProtocolSubscription::decode(&mut buffer, version) {
        Ok(subscription) => subscription.topics.iter().map(|t| t.to_string()).collect(),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: Timing = Timing {
        initial_rebalance_delay_ms: 0,
        consumer_heartbeat_interval_ms: 5_000,
        consumer_session_timeout_ms: 45_000,
    };

    const SETTINGS: OffsetsSettings =
        OffsetsSettings { retention_ms: 60_000, retention_check_interval_ms: 1_000, snapshot_interval_bytes: 4_096 };

    fn open(dir: &Path) -> Arc<GroupCoordinator> {
        GroupCoordinator::open_local(dir, TIMING, SETTINGS, 64 * 1024).unwrap()
    }

    fn offset(value: i64, metadata: &str) -> CommittedOffset {
        CommittedOffset { offset: value, leader_epoch: 3, metadata: Some(metadata.into()), commit_timestamp_ms: 1 }
    }

    #[test]
    fn a_leadership_being_applied_answers_load_in_progress_until_taken() {
        use crate::placement::{partition_for, IncomingLeaderships};
        let coordinator = GroupCoordinator::replicated(TIMING, SETTINGS);
        let syncer = Syncer::start();
        let commit = |group: &str| coordinator.commit_offsets(group, Committer::simple(), Vec::new(), &syncer).err();
        let (mine, other) = ("hello", "g-elsewhere");
        assert_ne!(partition_for(mine, 50), partition_for(other, 50));
        // Before the offsets topic is known here at all.
        assert_eq!(commit(mine), Some(GroupError::NotCoordinator));
        coordinator.expect_leadership(IncomingLeaderships::new(50, [partition_for(mine, 50)].into()));
        assert_eq!(commit(mine), Some(GroupError::CoordinatorLoadInProgress));
        assert_eq!(commit(other), Some(GroupError::NotCoordinator));
        // The apply reached the coordinator, and this node leads nothing after all.
        coordinator.follow_leadership((0..50).map(|_| None).collect());
        assert_eq!(commit(mine), Some(GroupError::NotCoordinator));
        syncer.shutdown();
    }

    #[tokio::test]
    async fn committed_offsets_and_deletions_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start();
        {
            let coordinator = open(dir.path());
            let commits = vec![("t".to_string(), 0, offset(10, "a")), ("t".to_string(), 1, offset(20, "b"))];
            coordinator.commit_offsets("simple", Committer::simple(), commits, &syncer).unwrap().await.unwrap();
            let again = vec![("t".to_string(), 0, offset(11, "c"))];
            coordinator.commit_offsets("simple", Committer::simple(), again, &syncer).unwrap().await.unwrap();
            let doomed = vec![("t".to_string(), 0, offset(5, "d"))];
            coordinator.commit_offsets("doomed", Committer::simple(), doomed, &syncer).unwrap().await.unwrap();
            coordinator.delete_group("doomed", &syncer).unwrap().await.unwrap();
            let (results, write) = coordinator.delete_offsets("simple", vec![("t".into(), vec![1])], &syncer).unwrap();
            write.await.unwrap();
            assert_eq!(results[0].1, vec![(1, Ok(()))]);
            // A commit with a generation for a group nobody joined is refused.
            let member = Committer { member_id: "m", generation_id: 4, ..Committer::simple() };
            let stale = coordinator.commit_offsets("simple", member, Vec::new(), &syncer);
            assert_eq!(stale.err(), Some(GroupError::IllegalGeneration));
            coordinator.close();
        }
        let coordinator = open(dir.path());
        let fetched = coordinator.fetch_offsets("simple", Some(vec![("t".into(), vec![0, 1])])).unwrap();
        assert_eq!(fetched, vec![("t".to_string(), vec![(0, Some(offset(11, "c"))), (1, None)])]);
        assert!(coordinator.fetch_offsets("doomed", None).unwrap().is_empty());
        let listed: Vec<String> = coordinator.list_groups().into_iter().map(|g| g.group_id).collect();
        assert_eq!(listed, vec!["simple".to_string()]);
        assert_eq!(coordinator.delete_group("doomed", &syncer).err(), Some(GroupError::GroupIdNotFound));
        syncer.shutdown();
    }

    /// An offset committed now: the ticker's retention check (every second) does not expire
    /// it, however slowly the test runs.
    fn fresh_offset(value: i64) -> CommittedOffset {
        CommittedOffset { commit_timestamp_ms: sluice_storage::now_ms(), ..offset(value, "m") }
    }

    async fn eventually(mut done: impl FnMut() -> bool) {
        for _ in 0..200 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached in 2 s");
    }

    #[tokio::test]
    async fn compaction_snapshot_bounds_the_log_and_keeps_the_latest_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start();
        {
            let coordinator = open(dir.path());
            for round in 0..100 {
                let commits = (0..50).map(|p| ("t".to_string(), p, fresh_offset(round))).collect();
                coordinator.commit_offsets("g", Committer::simple(), commits, &syncer).unwrap().await.unwrap();
                coordinator.upkeep(sluice_storage::now_ms(), &syncer);
            }
            let shard = coordinator.serving("g").unwrap();
            let partition = shard.log_partition().clone();
            eventually(|| !shard.snapshot_in_flight()).await;
            let offsets = partition.offsets();
            assert!(offsets.log_start_offset > 4_000, "log start {}", offsets.log_start_offset);
            assert!(partition.size_bytes() < 4 * 64 * 1024, "offsets log is {} bytes", partition.size_bytes());
            coordinator.close();
        }
        let coordinator = open(dir.path());
        let fetched = coordinator.fetch_offsets("g", None).unwrap();
        assert_eq!(fetched[0].1.len(), 50);
        assert!(fetched[0].1.iter().all(|(_, value)| value.as_ref().map(|v| v.offset) == Some(99)));
        syncer.shutdown();
    }

    #[tokio::test]
    async fn transactional_offsets_survive_snapshots_and_reopens_until_their_marker() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start();
        let pending = |offset_value| vec![("t".to_string(), 0, offset(offset_value, "txn"))];
        {
            let coordinator = open(dir.path());
            let write = coordinator.commit_transactional_offsets("g", Committer::simple(), 7, 1, pending(42), &syncer);
            write.unwrap().await.unwrap();
            // Enough other traffic for several compaction snapshots.
            for round in 0..100 {
                let commits = (0..20).map(|p| ("u".to_string(), p, fresh_offset(round))).collect();
                coordinator.commit_offsets("g", Committer::simple(), commits, &syncer).unwrap().await.unwrap();
                coordinator.upkeep(sluice_storage::now_ms(), &syncer);
            }
            let shard = coordinator.serving("g").unwrap();
            eventually(|| !shard.snapshot_in_flight()).await;
            assert!(shard.log_partition().offsets().log_start_offset > 0, "no snapshot was taken");
            assert!(coordinator.has_pending_txn_offsets("g", "t", 0));
            coordinator.close();
        }
        let coordinator = open(dir.path());
        assert!(coordinator.has_pending_txn_offsets("g", "t", 0), "pending offsets lost by a snapshot or reopen");
        let t0 = || coordinator.fetch_offsets("g", Some(vec![("t".into(), vec![0])])).unwrap()[0].1[0].1.clone();
        assert_eq!(t0(), None, "visible before the commit marker");
        coordinator.end_transaction(0, 7, 1, true, &syncer).unwrap().await.unwrap();
        assert_eq!(t0(), Some(offset(42, "txn")));
        // The producer is fenced (epoch 2 ended a transaction): its epoch-1 offsets are refused.
        coordinator.end_transaction(0, 7, 2, false, &syncer).unwrap().await.unwrap();
        let zombie = coordinator.commit_transactional_offsets("g", Committer::simple(), 7, 1, pending(99), &syncer);
        assert_eq!(zombie.err(), Some(GroupError::ProducerFenced));
        coordinator.close();
        drop(coordinator);
        let coordinator = open(dir.path());
        assert_eq!(
            coordinator.fetch_offsets("g", Some(vec![("t".into(), vec![0])])).unwrap()[0].1[0].1,
            Some(offset(42, "txn"))
        );
        assert!(!coordinator.has_pending_txn_offsets("g", "t", 0));
        syncer.shutdown();
    }

    #[tokio::test]
    async fn retention_expires_offsets_of_groups_without_members() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start();
        let opened_ms = sluice_storage::now_ms();
        let coordinator = open(dir.path());
        let old = CommittedOffset { commit_timestamp_ms: 1, ..offset(3, "old") };
        let fresh = CommittedOffset { commit_timestamp_ms: sluice_storage::now_ms(), ..offset(4, "fresh") };
        let commits = vec![("t".to_string(), 0, old), ("t".to_string(), 1, fresh)];
        coordinator.commit_offsets("idle", Committer::simple(), commits, &syncer).unwrap().await.unwrap();
        // Before the check interval nothing happens (however slowly the test runs: the
        // interval counts from the open); after it the old offset expires.
        coordinator.upkeep(opened_ms, &syncer);
        assert_eq!(coordinator.fetch_offsets("idle", None).unwrap()[0].1.len(), 2);
        coordinator.upkeep(sluice_storage::now_ms() + SETTINGS.retention_check_interval_ms, &syncer);
        eventually(|| coordinator.fetch_offsets("idle", None).unwrap()[0].1.len() == 1).await;
        coordinator.close();
        drop(coordinator);
        let fetched = open(dir.path()).fetch_offsets("idle", None).unwrap();
        assert_eq!(
            fetched,
            vec![(
                "t".to_string(),
                vec![(
                    1,
                    Some(CommittedOffset {
                        commit_timestamp_ms: fetched[0].1[0].1.as_ref().unwrap().commit_timestamp_ms,
                        ..offset(4, "fresh")
                    })
                )]
            )]
        );
        syncer.shutdown();
    }
}
