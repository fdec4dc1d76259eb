//! Partition replication, Kafka's design: one leader per partition takes produce and
//! consumer fetches; followers fetch from it with the ordinary Fetch API (replica id set)
//! and append the leader's batches byte for byte. The leader tracks how far each follower
//! has fetched and moves the high watermark to the smallest such offset over the in-sync
//! replicas (ISR). Leadership, leader epochs and the ISR are decided by the controller
//! quorum (`sluice-cluster`); this crate applies them ([`ReplicaManager::apply`]) and
//! asks the controller to shrink or expand the ISR.
//!
//! It sits below the broker: what the follower fetch loops need from the node running
//! them (its replicas, logs, cluster id, inter-broker security) comes through
//! [`ReplicaHost`], which the broker implements, and ISR changes go to the controller
//! through [`IsrChanges`].
//!
//! Why followers fetch (and not Raft per partition): one fetch per node pair carries all
//! partitions between them, so replication traffic and fsyncs batch across partitions,
//! and a partition with RF=1 keeps the single-node fast path untouched.
//!
//! Durability: a follower reports an offset (its next fetch offset) only once that data
//! is as durable as the topic's level asks (fsynced at level 1). The leader's own share
//! is its locally durable end ([`sluice_storage::Progress::local_end`]). So at levels 1
//! and 2 a high watermark at offset N means every ISR member holds [0, N) durably per the
//! level, and an acknowledged write survives any failure that leaves one ISR member.
//!
//! Safety rules that live here:
//! - a follower truncates to the leader's epoch end before fetching on (divergence is
//!   answered in the fetch response, KIP-595 style, from the leader-epoch cache);
//! - an ISR expansion counts the new member for the high watermark from the moment it is
//!   requested (Kafka's "maximal ISR"), a shrink only once the controller committed it;
//! - the high watermark stands still while the ISR is smaller than `min.insync.replicas`
//!   (at most the replica count): the replicas that left it meanwhile hold everything below
//!   it, which is what lets the controller elect them (eligible leader replicas) when no
//!   ISR member is left.

mod fetcher;
mod peer;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use parking_lot::{Mutex, RwLock};
use sluice_storage::{LogManager, Partition, TopicPartition};
use tokio::sync::Notify;

/// How long a follower may stay behind the leader's log end before it leaves the ISR
/// (Kafka's `replica.lag.time.max.ms` is 30 s; a dead node is fenced by the controller
/// much sooner, this catches slow but live ones).
pub const REPLICA_LAG_TIME_MS_DEFAULT: u64 = 10_000;
/// How often leaders look for followers to drop from the ISR.
pub const ISR_CHECK_INTERVAL_MS: u64 = 250;

/// Where a partition lives and who leads it, as the controller decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub replicas: Vec<i32>,
    pub leader: i32,
    pub leader_epoch: i32,
    pub isr: Vec<i32>,
    pub partition_epoch: i32,
}

pub use fetcher::{spawn_supervisor, ReplicaHost};
pub use peer::PeerConnection;
pub use sluice_meta::durability::{DurabilityLevel, ReplicationConfig};

/// What the replication layer needs from the controller: ISR changes.
pub trait IsrChanges: Send + Sync + 'static {
    /// Proposes a new ISR; resolves once the controller committed or refused it.
    fn alter_isr(
        &self,
        topic: String,
        partition: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: Vec<i32>,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
}

/// A follower as its leader sees it.
#[derive(Debug, Clone, Copy)]
struct FollowerProgress {
    /// The follower's last fetch offset: it holds [0, end) at the topic's durability.
    end: i64,
    /// The last time the follower had fetched everything the leader had.
    caught_up_ms: i64,
    /// The leader's log end at the follower's previous fetch.
    leader_end_at_last_fetch: i64,
    last_fetch_ms: i64,
}

#[derive(Debug)]
struct LeaderRole {
    assignment: Assignment,
    /// The log end when this node became leader at this epoch (Kafka's leader epoch start
    /// offset): until the high watermark reaches it, the records below it may already have
    /// been acknowledged by the previous leader, so the high watermark here is not yet the
    /// end clients may rely on (ListOffsets answers OFFSET_NOT_AVAILABLE, as KIP-207).
    epoch_start_offset: i64,
    level: DurabilityLevel,
    min_insync: usize,
    /// Followers being added to the ISR, counted for the high watermark already. A refused
    /// expansion keeps them here: "refused" may mean the controller committed it and the
    /// answer was lost, so until metadata newer than the proposal arrives (which either lists
    /// them in the ISR or proves the proposal stale) the high watermark must not pass them.
    joining: HashSet<i32>,
    /// An ISR change is in flight with the controller.
    isr_change_pending: bool,
    /// The last proposed expansion was refused: retried by the ISR check, dropped once the
    /// partition epoch moves past the one it was proposed at.
    expansion_refused_at: Option<i32>,
    followers: HashMap<i32, FollowerProgress>,
}

impl LeaderRole {
    /// Fewer in-sync replicas than `min.insync.replicas`, counted as at most the replica
    /// count (a topic asking for more than it has waits for all of them).
    fn isr_below_min_insync(&self) -> bool {
        self.assignment.isr.len() < self.min_insync.min(self.assignment.replicas.len())
    }

    /// Drops the joiners of a proposal that metadata newer than it has settled: those it
    /// added are in the ISR (and left `joining` then), the rest were never added.
    fn forget_settled_expansion(&mut self) {
        assert!(
            self.joining.iter().all(|j| !self.assignment.isr.contains(j)),
            "a joiner leaves `joining` when metadata lists it in the ISR"
        );
        self.joining.clear();
        self.expansion_refused_at = None;
    }
}

#[derive(Debug)]
enum Role {
    Leader(LeaderRole),
    /// Following `leader` (-1: no leader right now) at `leader_epoch`.
    Follower {
        leader: i32,
        leader_epoch: i32,
    },
}

/// One partition hosted on this node.
pub struct Replica {
    pub topic: String,
    pub partition: i32,
    pub log: Arc<Partition>,
    role: Mutex<Role>,
    /// Wakes the leader's high-watermark task when the role changes.
    role_changed: Notify,
}

/// Why a request for a partition cannot be served here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotServed {
    UnknownPartition,
    NotLeader,
    /// The client's leader epoch is older than ours.
    FencedLeaderEpoch,
    /// The client's leader epoch is newer than ours (our metadata lags).
    UnknownLeaderEpoch,
    NotEnoughReplicas,
}

impl NotServed {
    /// The Kafka error a client gets for it.
    pub fn error(self) -> ResponseError {
        match self {
            NotServed::UnknownPartition => ResponseError::UnknownTopicOrPartition,
            NotServed::NotLeader => ResponseError::NotLeaderOrFollower,
            NotServed::FencedLeaderEpoch => ResponseError::FencedLeaderEpoch,
            NotServed::UnknownLeaderEpoch => ResponseError::UnknownLeaderEpoch,
            NotServed::NotEnoughReplicas => ResponseError::NotEnoughReplicas,
        }
    }
}

/// What a produce on the leader must wait for.
#[derive(Debug, Clone, Copy)]
pub struct LeaderWrite {
    pub leader_epoch: i32,
    /// Wait for the high watermark (ISR) rather than the local durable end.
    pub waits_for_replicas: bool,
}

impl Replica {
    fn new(topic: String, partition: i32, log: Arc<Partition>) -> Replica {
        Replica {
            topic,
            partition,
            log,
            role: Mutex::new(Role::Follower { leader: -1, leader_epoch: -1 }),
            role_changed: Notify::new(),
        }
    }

    /// Whether this leader's high watermark is the end clients may rely on yet: false
    /// while it is below the log end at which this node became leader (KIP-207).
    pub fn high_watermark_settled(&self) -> bool {
        match &*self.role.lock() {
            Role::Leader(leader) => self.log.offsets().high_watermark >= leader.epoch_start_offset,
            Role::Follower { .. } => false,
        }
    }

    /// The leader epoch if this node leads the partition.
    pub fn leader_epoch(&self) -> Option<i32> {
        match &*self.role.lock() {
            Role::Leader(leader) => Some(leader.assignment.leader_epoch),
            Role::Follower { .. } => None,
        }
    }

    /// Resolves once this node no longer leads at `epoch`: a new epoch, a follower, or the
    /// partition moved away. Writes waiting for their acknowledgement race this, so a
    /// deposed leader answers NOT_LEADER_OR_FOLLOWER at once instead of at the timeout.
    pub async fn leadership_lost(&self, epoch: i32) {
        loop {
            let changed = self.role_changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a change in between still wakes us.
            changed.as_mut().enable();
            if self.leader_epoch() != Some(epoch) {
                return;
            }
            changed.await;
        }
    }

    /// Checks that a client request may be served by this node as leader.
    pub fn check_leader(&self, client_epoch: i32) -> Result<i32, NotServed> {
        let Some(epoch) = self.leader_epoch() else { return Err(NotServed::NotLeader) };
        check_epoch(epoch, client_epoch)?;
        Ok(epoch)
    }

    /// A produce with `acks`: refused when this node does not lead or the ISR is too small.
    pub fn begin_write(&self, acks: i16) -> Result<LeaderWrite, NotServed> {
        let role = self.role.lock();
        let Role::Leader(leader) = &*role else { return Err(NotServed::NotLeader) };
        let waits = leader.level.waits_for_replicas() && acks == -1;
        if waits && leader.assignment.isr.len() < leader.min_insync {
            return Err(NotServed::NotEnoughReplicas);
        }
        Ok(LeaderWrite { leader_epoch: leader.assignment.leader_epoch, waits_for_replicas: waits })
    }

    /// `Some(true)` when this node leads with an ISR smaller than the replica set (Kafka's
    /// under-replicated partition), `Some(false)` when it leads with all in sync, `None`
    /// when it does not lead.
    pub fn under_replicated(&self) -> Option<bool> {
        match &*self.role.lock() {
            Role::Leader(leader) => Some(leader.assignment.isr.len() < leader.assignment.replicas.len()),
            _ => None,
        }
    }

    /// True when this node leads with fewer in-sync replicas than `min.insync.replicas`
    /// (the ISR shrank after a write was accepted).
    pub fn isr_below_min_insync(&self) -> bool {
        match &*self.role.lock() {
            Role::Leader(leader) => leader.isr_below_min_insync(),
            _ => false,
        }
    }

    /// Resolves once this node leads at `epoch` with an ISR below `min.insync.replicas`, or
    /// no longer leads at `epoch`: either way the high watermark will not move on here, so
    /// a write waiting for it can be answered at once.
    pub async fn commit_stalled(&self, epoch: i32) {
        loop {
            let changed = self.role_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.leader_epoch() != Some(epoch) || self.isr_below_min_insync() {
                return;
            }
            changed.await;
        }
    }

    /// Records a follower's fetch at `fetch_offset` (it holds everything before it) and
    /// checks its log against ours: `Some((epoch, end offset))` when it diverges and must
    /// truncate. Moves the high watermark; may ask to expand the ISR.
    pub fn follower_fetched(
        self: &Arc<Self>,
        follower: i32,
        client_epoch: i32,
        fetch_offset: i64,
        last_fetched_epoch: i32,
        now_ms: i64,
        isr_changes: &Arc<dyn IsrChanges>,
    ) -> Result<Option<(i32, i64)>, NotServed> {
        let mut role = self.role.lock();
        let Role::Leader(leader) = &mut *role else { return Err(NotServed::NotLeader) };
        check_epoch(leader.assignment.leader_epoch, client_epoch)?;
        if !leader.assignment.replicas.contains(&follower) {
            return Err(NotServed::UnknownPartition);
        }
        if last_fetched_epoch >= 0 {
            match self.log.epoch_end_offset(last_fetched_epoch) {
                Some((epoch, end)) if epoch == last_fetched_epoch && end >= fetch_offset => {}
                Some(diverging) => return Ok(Some(diverging)),
                None => return Ok(Some((-1, -1))),
            }
        }
        let log_end = self.log.offsets().log_end_offset;
        let progress = leader.followers.entry(follower).or_insert(FollowerProgress {
            end: -1,
            caught_up_ms: now_ms,
            leader_end_at_last_fetch: -1,
            last_fetch_ms: now_ms,
        });
        if fetch_offset >= log_end {
            progress.caught_up_ms = now_ms;
        } else if fetch_offset >= progress.leader_end_at_last_fetch && progress.leader_end_at_last_fetch >= 0 {
            progress.caught_up_ms = progress.last_fetch_ms;
        }
        progress.end = fetch_offset;
        progress.leader_end_at_last_fetch = log_end;
        progress.last_fetch_ms = now_ms;
        let high_watermark = self.log.offsets().high_watermark;
        let may_join = !leader.assignment.isr.contains(&follower)
            && !leader.joining.contains(&follower)
            && !leader.isr_change_pending
            && fetch_offset >= high_watermark
            && fetch_offset >= self.log.epoch_end_offset(leader.assignment.leader_epoch - 1).map_or(0, |(_, end)| end);
        if may_join {
            leader.joining.insert(follower);
            let mut isr = leader.assignment.isr.clone();
            isr.push(follower);
            isr.sort_unstable();
            self.request_isr_change(leader, isr, isr_changes);
        }
        self.advance_high_watermark(leader);
        Ok(None)
    }

    fn request_isr_change(self: &Arc<Self>, leader: &mut LeaderRole, isr: Vec<i32>, isr_changes: &Arc<dyn IsrChanges>) {
        leader.isr_change_pending = true;
        let counter = if isr.len() < leader.assignment.isr.len() { &ISR_SHRINKS } else { &ISR_EXPANDS };
        let replica = self.clone();
        let change = isr_changes.alter_isr(
            self.topic.clone(),
            self.partition,
            leader.assignment.leader_epoch,
            leader.assignment.partition_epoch,
            isr.clone(),
        );
        tracing::info!(topic = %self.topic, partition = self.partition, ?isr, "proposing ISR change");
        let proposed_at = leader.assignment.partition_epoch;
        tokio::spawn(async move {
            let result = change.await;
            let mut role = replica.role.lock();
            if let Role::Leader(leader) = &mut *role {
                leader.isr_change_pending = false;
                match result {
                    Ok(()) => {
                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(error) => {
                        tracing::warn!(topic = %replica.topic, partition = replica.partition, %error, "ISR change refused");
                        if !leader.joining.is_empty() {
                            leader.expansion_refused_at = Some(proposed_at);
                        }
                    }
                }
                if leader.assignment.partition_epoch > proposed_at {
                    // Metadata newer than the proposal arrived while it was out: whatever it
                    // committed is in the ISR by now, and a refused one can never commit. A
                    // joiner still outside the ISR joins again with its next fetch.
                    leader.forget_settled_expansion();
                }
            }
        });
    }

    /// Recomputes the high watermark from the leader's durable end and the ISR's fetches.
    /// At every level: levels 3 and 4 acknowledge before replication, but consumers still
    /// see only what the ISR holds, so a failover never takes back a record a consumer read.
    fn advance_high_watermark(&self, leader: &LeaderRole) {
        if leader.assignment.replicas.len() == 1 || leader.isr_below_min_insync() {
            return;
        }
        let mut high_watermark = self.log.progress().borrow().local_end;
        for member in leader.assignment.isr.iter().chain(leader.joining.iter()) {
            if *member == leader.assignment.leader {
                continue;
            }
            high_watermark = high_watermark.min(leader.followers.get(member).map_or(-1, |f| f.end));
        }
        if high_watermark >= 0 {
            self.log.advance_high_watermark(high_watermark);
        }
    }

    /// Drops followers that fell behind for longer than `lag_ms` from the ISR.
    fn check_isr(self: &Arc<Self>, now_ms: i64, lag_ms: u64, isr_changes: &Arc<dyn IsrChanges>) {
        let mut role = self.role.lock();
        let Role::Leader(leader) = &mut *role else { return };
        if leader.isr_change_pending {
            return;
        }
        if leader.expansion_refused_at.is_some() {
            // Retry the refused expansion (a stale-epoch refusal brings newer metadata, which
            // settles it), without followers that stopped fetching meanwhile.
            let followers = &leader.followers;
            leader.joining.retain(|j| followers.get(j).is_some_and(|f| now_ms - f.last_fetch_ms <= lag_ms as i64));
            leader.expansion_refused_at = None;
            if !leader.joining.is_empty() {
                let mut isr = leader.assignment.isr.clone();
                isr.extend(leader.joining.iter().copied());
                isr.sort_unstable();
                self.request_isr_change(leader, isr, isr_changes);
            }
            return;
        }
        if leader.assignment.isr.len() <= 1 {
            return;
        }
        let log_end = self.log.offsets().log_end_offset;
        let me = leader.assignment.leader;
        let lagging: Vec<i32> = leader
            .assignment
            .isr
            .iter()
            .copied()
            .filter(|&member| member != me)
            .filter(|member| match leader.followers.get(member) {
                Some(f) => f.end < log_end && now_ms - f.caught_up_ms > lag_ms as i64,
                None => false,
            })
            .collect();
        if lagging.is_empty() {
            return;
        }
        let isr: Vec<i32> = leader.assignment.isr.iter().copied().filter(|m| !lagging.contains(m)).collect();
        tracing::warn!(topic = %self.topic, partition = self.partition, ?lagging, "followers fell behind");
        self.request_isr_change(leader, isr, isr_changes);
    }
}

/// Whether the leader's high watermark waits for followers (else it follows local
/// durability): whenever there are followers, at every durability level.
fn leader_replicates(assignment: &Assignment) -> bool {
    assignment.replicas.len() > 1
}

fn check_epoch(ours: i32, client: i32) -> Result<(), NotServed> {
    match client {
        -1 => Ok(()),
        e if e < ours => Err(NotServed::FencedLeaderEpoch),
        e if e > ours => Err(NotServed::UnknownLeaderEpoch),
        _ => Ok(()),
    }
}

/// ISR changes this node's leaders got committed (Kafka's IsrShrinksPerSec and
/// IsrExpandsPerSec, as totals), for the metrics.
pub static ISR_SHRINKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static ISR_EXPANDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The replicas this node hosts and their roles.
pub struct ReplicaManager {
    node_id: i32,
    replicas: RwLock<HashMap<TopicPartition, Arc<Replica>>>,
    /// Kafka listener address of every known broker, for fetchers.
    brokers: RwLock<BTreeMap<i32, String>>,
    /// Wakes fetchers when the set of followed partitions changes.
    pub(crate) followers_changed: Notify,
    isr_changes: Arc<dyn IsrChanges>,
    lag_ms: u64,
}

impl ReplicaManager {
    pub fn new(node_id: i32, isr_changes: Arc<dyn IsrChanges>, lag_ms: u64) -> Arc<ReplicaManager> {
        Arc::new(ReplicaManager {
            node_id,
            replicas: RwLock::new(HashMap::new()),
            brokers: RwLock::new(BTreeMap::new()),
            followers_changed: Notify::new(),
            isr_changes,
            lag_ms,
        })
    }

    pub fn node_id(&self) -> i32 {
        self.node_id
    }

    pub fn get(&self, topic: &str, partition: i32) -> Option<Arc<Replica>> {
        self.replicas.read().get(&TopicPartition::new(topic, partition)).cloned()
    }

    pub fn isr_changes(&self) -> &Arc<dyn IsrChanges> {
        &self.isr_changes
    }

    pub fn set_brokers(&self, brokers: BTreeMap<i32, String>) {
        *self.brokers.write() = brokers;
    }

    pub fn broker_address(&self, node: i32) -> Option<String> {
        self.brokers.read().get(&node).cloned()
    }

    /// Partitions this node follows, grouped by leader: (replica, leader epoch).
    pub fn followed_by_leader(&self) -> BTreeMap<i32, Vec<(Arc<Replica>, i32)>> {
        let mut by_leader: BTreeMap<i32, Vec<(Arc<Replica>, i32)>> = BTreeMap::new();
        for replica in self.replicas.read().values() {
            if let Role::Follower { leader, leader_epoch } = &*replica.role.lock() {
                if *leader >= 0 {
                    by_leader.entry(*leader).or_default().push((replica.clone(), *leader_epoch));
                }
            }
        }
        by_leader
    }

    /// Applies the controller's decision for one partition hosted here: opens the log if
    /// needed and becomes leader or follower. Idempotent.
    pub fn apply(
        self: &Arc<Self>,
        logs: &LogManager,
        topic: &str,
        partition: i32,
        assignment: &Assignment,
        config: &ReplicationConfig,
    ) -> std::io::Result<()> {
        assert!(assignment.replicas.contains(&self.node_id));
        let tp = TopicPartition::new(topic, partition);
        let existing = self.replicas.read().get(&tp).cloned();
        let replica = match existing {
            Some(replica) => replica,
            None => {
                let log = logs.open(&tp, config.log.clone())?;
                let replica = Arc::new(Replica::new(topic.to_string(), partition, log));
                self.replicas.write().insert(tp, replica.clone());
                replica
            }
        };
        replica.log.set_config(config.log.clone());
        let mut role = replica.role.lock();
        let leads = assignment.leader == self.node_id;
        let changed = match &mut *role {
            Role::Leader(leader) if leads && leader.assignment.leader_epoch == assignment.leader_epoch => {
                if leader.assignment.isr != assignment.isr {
                    // Writes waiting for the high watermark check whether it still can move.
                    replica.role_changed.notify_waiters();
                }
                leader.assignment = assignment.clone();
                leader.joining.retain(|j| !leader.assignment.isr.contains(j));
                if leader.expansion_refused_at.is_some_and(|epoch| assignment.partition_epoch > epoch) {
                    // The refused proposal can no longer commit: whoever it added is in the
                    // ISR now or was never added.
                    leader.forget_settled_expansion();
                }
                leader.level = config.level;
                leader.min_insync = config.min_insync_replicas;
                // The replica set (a reassignment) or the durability level may have changed
                // within the epoch: a joining replica must hold back the high watermark.
                replica.log.set_replicated(leader_replicates(assignment));
                replica.advance_high_watermark(leader);
                false
            }
            Role::Follower { leader, leader_epoch }
                if !leads && *leader == assignment.leader && *leader_epoch == assignment.leader_epoch =>
            {
                false
            }
            current if leads => {
                tracing::info!(topic, partition, epoch = assignment.leader_epoch, "becoming leader");
                let leader = LeaderRole {
                    assignment: assignment.clone(),
                    epoch_start_offset: replica.log.progress().borrow().local_end,
                    level: config.level,
                    min_insync: config.min_insync_replicas,
                    joining: HashSet::new(),
                    isr_change_pending: false,
                    expansion_refused_at: None,
                    followers: HashMap::new(),
                };
                replica.log.set_replicated(leader_replicates(assignment));
                replica.advance_high_watermark(&leader);
                *current = Role::Leader(leader);
                true
            }
            current => {
                tracing::info!(
                    topic,
                    partition,
                    leader = assignment.leader,
                    epoch = assignment.leader_epoch,
                    "following"
                );
                replica.log.set_replicated(true);
                *current = Role::Follower { leader: assignment.leader, leader_epoch: assignment.leader_epoch };
                true
            }
        };
        drop(role);
        if changed {
            replica.role_changed.notify_waiters();
            self.followers_changed.notify_waiters();
            if leads {
                self.spawn_high_watermark_task(&replica, assignment.leader_epoch);
            }
        }
        Ok(())
    }

    /// Forgets a partition no longer hosted here (deleted or moved away) and deletes its log.
    pub fn remove(&self, logs: &LogManager, topic: &str, partition: i32) -> std::io::Result<()> {
        let tp = TopicPartition::new(topic, partition);
        if let Some(replica) = self.replicas.write().remove(&tp) {
            *replica.role.lock() = Role::Follower { leader: -1, leader_epoch: -1 };
            replica.role_changed.notify_waiters();
            self.followers_changed.notify_waiters();
            logs.delete(&tp)?;
        }
        Ok(())
    }

    /// All hosted partitions.
    pub fn hosted(&self) -> Vec<(TopicPartition, Arc<Replica>)> {
        self.replicas.read().iter().map(|(tp, r)| (tp.clone(), r.clone())).collect()
    }

    /// While this node leads `replica` at `epoch`, moves its high watermark when its own
    /// durable end moves (followers' fetches move it from the fetch path).
    fn spawn_high_watermark_task(&self, replica: &Arc<Replica>, epoch: i32) {
        let replica = replica.clone();
        tokio::spawn(async move {
            let mut progress = replica.log.progress();
            loop {
                {
                    let role = replica.role.lock();
                    match &*role {
                        Role::Leader(leader) if leader.assignment.leader_epoch == epoch => {
                            replica.advance_high_watermark(leader)
                        }
                        _ => return,
                    }
                }
                let role_changed = replica.role_changed.notified();
                tokio::select! {
                    changed = progress.changed() => if changed.is_err() { return },
                    () = role_changed => {}
                }
            }
        });
    }

    /// Runs the periodic ISR check until the process ends.
    pub fn spawn_isr_checker(self: &Arc<Self>) {
        let manager = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(std::time::Duration::from_millis(ISR_CHECK_INTERVAL_MS));
            loop {
                interval.tick().await;
                let Some(manager) = manager.upgrade() else { return };
                let now = sluice_storage::now_ms();
                for (_, replica) in manager.hosted() {
                    replica.check_isr(now, manager.lag_ms, &manager.isr_changes);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sluice_storage::LogConfig;

    use super::*;

    /// An ISR change whose answer never arrives intact: the controller may or may not have
    /// committed it. (Tests that change no ISR use it too.)
    struct RefusedIsrChanges;

    impl IsrChanges for RefusedIsrChanges {
        fn alter_isr(
            &self,
            _topic: String,
            _partition: i32,
            _leader_epoch: i32,
            _partition_epoch: i32,
            _isr: Vec<i32>,
        ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
            Box::pin(async { Err("request timed out".to_string()) })
        }
    }

    fn one_batch(count: i32) -> bytes::Bytes {
        use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
        let records: Vec<Record> = (0..count)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i64::from(i),
                sequence: i,
                timestamp: sluice_storage::now_ms(),
                key: None,
                value: Some(bytes::Bytes::from_static(b"v")),
                headers: Default::default(),
            })
            .collect();
        let mut buffer = bytes::BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut buffer, &records, &options).unwrap();
        buffer.freeze()
    }

    /// A refused ISR expansion may have been committed all the same (only the answer was
    /// lost): until newer metadata says otherwise, the joining follower still holds back the
    /// high watermark, so no acknowledged write can be missing from an ISR member.
    #[tokio::test]
    async fn a_refused_isr_expansion_still_holds_back_the_high_watermark() {
        let (_dir, logs, isr_changes, manager) = leader_with_refused_isr_changes();
        let config = page_cache_config(DurabilityLevel::ReplicatedFsynced);
        let alone = Assignment { replicas: vec![1, 2], leader: 1, leader_epoch: 1, isr: vec![1], partition_epoch: 1 };
        manager.apply(&logs, "t", 0, &alone, &config).unwrap();
        let replica = manager.get("t", 0).unwrap();
        let now = sluice_storage::now_ms();
        replica.log.append(&one_batch(3), 1, now).unwrap();
        // The follower catches up: its expansion is proposed, then "refused".
        replica.follower_fetched(2, 1, 3, 1, now, &isr_changes).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The leader's own progress moves the high watermark before the follower fetches again.
        replica.log.append(&one_batch(3), 1, now).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            replica.log.offsets().high_watermark,
            3,
            "the high watermark passed a follower that may be in the ISR"
        );

        // Metadata newer than the proposal without the follower in the ISR settles it.
        let moved_on = Assignment { partition_epoch: 2, ..alone.clone() };
        manager.apply(&logs, "t", 0, &moved_on, &config).unwrap();
        replica.log.append(&one_batch(1), 1, now).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(replica.log.offsets().high_watermark, 7);
        manager.remove(&logs, "t", 0).unwrap();
    }

    /// ISR changes whose answers wait until the test releases them (each a refusal), so
    /// metadata can arrive while a proposal is out, as it does when the controller moves the
    /// partition on (fencing a node) before the leader hears back.
    struct HeldIsrChanges {
        proposed: Mutex<Vec<(i32, Vec<i32>)>>,
        answer: Arc<tokio::sync::Semaphore>,
    }

    impl IsrChanges for HeldIsrChanges {
        fn alter_isr(
            &self,
            _topic: String,
            _partition: i32,
            _leader_epoch: i32,
            partition_epoch: i32,
            isr: Vec<i32>,
        ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
            self.proposed.lock().push((partition_epoch, isr));
            let answer = self.answer.clone();
            Box::pin(async move {
                answer.acquire().await.unwrap().forget();
                Err("stale partition epoch".to_string())
            })
        }
    }

    /// A follower whose expansion is refused after newer metadata (without it in the ISR)
    /// already arrived is proposed again when it fetches: the refused proposal can never
    /// commit, so nothing else would ever bring it back into the ISR.
    #[tokio::test]
    async fn a_follower_whose_expansion_is_refused_after_the_partition_moved_on_is_proposed_again() {
        let dir = tempfile::tempdir().unwrap();
        let logs = LogManager::new(dir.path()).unwrap();
        let held = Arc::new(HeldIsrChanges {
            proposed: Mutex::new(Vec::new()),
            answer: Arc::new(tokio::sync::Semaphore::new(0)),
        });
        let isr_changes: Arc<dyn IsrChanges> = held.clone();
        let manager = ReplicaManager::new(1, isr_changes.clone(), 10_000);
        let config = page_cache_config(DurabilityLevel::ReplicatedFsynced);
        let alone =
            Assignment { replicas: vec![1, 2, 3], leader: 1, leader_epoch: 1, isr: vec![1, 3], partition_epoch: 1 };
        manager.apply(&logs, "t", 0, &alone, &config).unwrap();
        let replica = manager.get("t", 0).unwrap();
        let now = sluice_storage::now_ms();
        replica.log.append(&one_batch(3), 1, now).unwrap();
        replica.follower_fetched(3, 1, 3, 1, now, &isr_changes).unwrap();
        replica.follower_fetched(2, 1, 3, 1, now, &isr_changes).unwrap();
        assert_eq!(held.proposed.lock().clone(), vec![(1, vec![1, 2, 3])]);

        // The controller moved the partition on (node 3 fenced) before answering.
        let moved_on = Assignment { isr: vec![1], partition_epoch: 2, ..alone.clone() };
        manager.apply(&logs, "t", 0, &moved_on, &config).unwrap();
        held.answer.add_permits(1);
        tokio::time::sleep(Duration::from_millis(50)).await;

        replica.follower_fetched(2, 1, 3, 1, now, &isr_changes).unwrap();
        replica.check_isr(now, 10_000, &isr_changes);
        assert_eq!(
            held.proposed.lock().last().cloned(),
            Some((2, vec![1, 2])),
            "the caught-up follower was never proposed again"
        );
        held.answer.add_permits(1);
        manager.remove(&logs, "t", 0).unwrap();
    }

    /// Levels 3 and 4 acknowledge before the followers have a write, but consumers must not
    /// see it before they do: a failover would take back a record a consumer already read.
    #[tokio::test]
    async fn the_high_watermark_waits_for_the_isr_at_every_level() {
        let (_dir, logs, isr_changes, manager) = leader_with_refused_isr_changes();
        for (partition, level) in [DurabilityLevel::LeaderFsynced, DurabilityLevel::LeaderOnly].into_iter().enumerate()
        {
            let partition = partition as i32;
            let config = page_cache_config(level);
            manager.apply(&logs, "t", partition, &assignment(1, 1), &config).unwrap();
            let replica = manager.get("t", partition).unwrap();
            let now = sluice_storage::now_ms();
            replica.log.append(&one_batch(3), 1, now).unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(replica.log.offsets().high_watermark, 0, "{level:?}: visible before the follower has it");
            replica.follower_fetched(2, 1, 3, 1, now, &isr_changes).unwrap();
            assert_eq!(replica.log.offsets().high_watermark, 3, "{level:?}");
            manager.remove(&logs, "t", partition).unwrap();
        }
    }

    /// Below min.insync.replicas the high watermark stands still, so the replicas that left
    /// the ISR meanwhile (the controller's eligible leader replicas) hold all of it; it moves
    /// on once the ISR is back at min.insync.replicas.
    #[tokio::test]
    async fn the_high_watermark_stands_still_below_min_insync() {
        let (_dir, logs, isr_changes, manager) = leader_with_refused_isr_changes();
        let config = ReplicationConfig { min_insync_replicas: 2, ..page_cache_config(DurabilityLevel::LeaderOnly) };
        let with_isr = |isr: &[i32], partition_epoch| Assignment {
            replicas: vec![1, 2, 3],
            leader: 1,
            leader_epoch: 1,
            isr: isr.to_vec(),
            partition_epoch,
        };
        manager.apply(&logs, "t", 0, &with_isr(&[1, 2, 3], 1), &config).unwrap();
        let replica = manager.get("t", 0).unwrap();
        let now = sluice_storage::now_ms();
        let append_and_fetch = |fetchers: &[i32], end: i64| {
            replica.log.append(&one_batch(3), 1, now).unwrap();
            for &follower in fetchers {
                replica.follower_fetched(follower, 1, end, 1, now, &isr_changes).unwrap();
            }
        };
        append_and_fetch(&[2, 3], 3);
        assert_eq!(replica.log.offsets().high_watermark, 3);
        // At min.insync.replicas it still moves.
        manager.apply(&logs, "t", 0, &with_isr(&[1, 2], 2), &config).unwrap();
        append_and_fetch(&[2], 6);
        assert_eq!(replica.log.offsets().high_watermark, 6);
        // Below it, not even a follower that has everything moves it.
        manager.apply(&logs, "t", 0, &with_isr(&[1], 3), &config).unwrap();
        append_and_fetch(&[2, 3], 9);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(replica.log.offsets().high_watermark, 6);
        assert!(replica.isr_below_min_insync());
        tokio::time::timeout(Duration::from_secs(5), replica.commit_stalled(1)).await.expect("stalled at once");
        manager.apply(&logs, "t", 0, &with_isr(&[1, 2], 4), &config).unwrap();
        assert_eq!(replica.log.offsets().high_watermark, 9);
        manager.remove(&logs, "t", 0).unwrap();
    }

    /// Node 1's replica manager, whose ISR change requests the controller refuses.
    fn leader_with_refused_isr_changes() -> (tempfile::TempDir, LogManager, Arc<dyn IsrChanges>, Arc<ReplicaManager>) {
        let dir = tempfile::tempdir().unwrap();
        let logs = LogManager::new(dir.path()).unwrap();
        let isr_changes: Arc<dyn IsrChanges> = Arc::new(RefusedIsrChanges);
        let manager = ReplicaManager::new(1, isr_changes.clone(), 10_000);
        (dir, logs, isr_changes, manager)
    }

    /// `level`, min.insync.replicas 1, local fsync asynchronous.
    fn page_cache_config(level: DurabilityLevel) -> ReplicationConfig {
        ReplicationConfig {
            level,
            min_insync_replicas: 1,
            log: LogConfig { flush_messages: u64::MAX, ..LogConfig::default() },
        }
    }

    fn assignment(leader: i32, leader_epoch: i32) -> Assignment {
        Assignment { replicas: vec![1, 2], leader, leader_epoch, isr: vec![1, 2], partition_epoch: leader_epoch }
    }

    /// A write waiting under epoch 1 learns at once that the leadership is gone: when the
    /// partition gets a new leader, and when it moves away from this node altogether.
    #[tokio::test]
    async fn leadership_lost_fires_on_a_new_leader_and_on_removal() {
        let dir = tempfile::tempdir().unwrap();
        let logs = LogManager::new(dir.path()).unwrap();
        let manager = ReplicaManager::new(1, Arc::new(RefusedIsrChanges), 10_000);
        let config = ReplicationConfig {
            level: DurabilityLevel::ReplicatedFsynced,
            min_insync_replicas: 1,
            log: LogConfig::default(),
        };
        let within = Duration::from_secs(5);
        for moved_away in [false, true] {
            manager.apply(&logs, "t", 0, &assignment(1, 1), &config).unwrap();
            let replica = manager.get("t", 0).unwrap();
            let lost = tokio::spawn({
                let replica = replica.clone();
                async move { replica.leadership_lost(1).await }
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(!lost.is_finished(), "still leading at epoch 1");
            if moved_away {
                manager.remove(&logs, "t", 0).unwrap();
            } else {
                manager.apply(&logs, "t", 0, &assignment(2, 2), &config).unwrap();
            }
            tokio::time::timeout(within, lost).await.expect("woken at once").unwrap();
            manager.remove(&logs, "t", 0).unwrap();
        }
    }
}
