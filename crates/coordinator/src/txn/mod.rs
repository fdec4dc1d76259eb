//! The transaction coordinator (KIP-98, KIP-447).
//!
//! One entry per `transactional.id`: its producer id and epoch, its state
//! (Empty -> Ongoing -> PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort), the
//! partitions and groups it wrote. Every change is appended to the transaction log
//! ([`log`], fsynced by the group-commit syncer, never under a coordinator lock) and
//! answered once durable, so a decision survives a crash: a transaction found in a
//! Prepare state after a restart or a failover is completed again. A decision is durable
//! before any marker.
//!
//! Where the state lives: one *shard* per partition of the transaction log this node
//! leads, exactly as the group coordinator shards `__consumer_offsets`. A single node
//! leads its one local partition; in a cluster a transactional id belongs to partition
//! `abs(hash(id)) % transaction_state_num_partitions` of the replicated
//! `__transaction_state` (Kafka's placement), and only that partition's leader serves it;
//! a new leader replays the partition (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and then
//! completes what its predecessor left prepared. Markers carry the partition's leader
//! epoch as the coordinator epoch.
//!
//! Ending a transaction writes a commit or abort marker to each of its partitions and to
//! the `__consumer_offsets` partition of each group it sent offsets for
//! ([`markers`]: locally, or with WriteTxnMarkers to the partition's leader), and
//! waits until each is durable; the group coordinator then commits or drops the offsets
//! the transaction sent (TxnOffsetCommit). A transaction open longer than its
//! `transaction.timeout.ms` is aborted with the producer's epoch bumped, which fences the
//! producer, as Kafka does.
//!
//! Produce checks: a transactional batch is appended only to a partition its producer's
//! open transaction has added (AddPartitionsToTxn), checked under the shard's lock so no
//! batch lands after its markers, when this node coordinates the producer's transaction.
//! A partition leader in a cluster that does not coordinate it accepts the batch on the
//! producer's epoch alone (Kafka's behaviour before KIP-890's verification).

pub mod log;
pub mod markers;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use sluice_storage::Syncer;

use crate::group::offsets::CommittedOffset;
use crate::leadership::{CoordinatorShard, Load, NotServed, Shards};
use crate::placement::{partition_for, IncomingLeaderships};
use crate::state_log::PendingChange;
use crate::txn::log::TxnLog;
use crate::txn::markers::{Marker, MarkerTarget};
use crate::CoordinatorHost;
use sluice_replication::Replica;

/// Kafka's `transaction.max.timeout.ms` default: the longest `transaction.timeout.ms`.
pub const TRANSACTION_TIMEOUT_MS_MAX: i32 = 900_000;
/// The most transactional ids kept (each is a few hundred bytes in memory and on disk).
pub const TRANSACTIONAL_IDS_MAX: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

impl TxnState {
    /// Kafka's name, as ListTransactions and DescribeTransactions report it.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
        }
    }

    fn is_prepared(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// An offset commit a transaction carried in the coordinator's own state (versions before
/// the group coordinator kept transactional offsets did so); applied when it commits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnMetadata {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<(String, i32)>,
    /// Groups added with AddOffsetsToTxn (the offsets themselves wait at the group
    /// coordinator; only a state written by an older version has any here).
    pub offsets: BTreeMap<String, Vec<PendingOffset>>,
    pub started_ms: i64,
}

/// The transactions by transactional id, and the id of each producer id (every transactional
/// batch looks its producer up: O(log n), not a scan).
#[derive(Default)]
struct Transactions {
    by_id: BTreeMap<String, TxnMetadata>,
    ids_by_producer: HashMap<i64, String>,
}

impl Transactions {
    fn new(by_id: BTreeMap<String, TxnMetadata>) -> Transactions {
        let ids_by_producer = by_id.iter().map(|(id, meta)| (meta.producer_id, id.clone())).collect();
        Transactions { by_id, ids_by_producer }
    }

    /// The only way an entry (and so a producer id) is added or replaced.
    fn insert(&mut self, transactional_id: String, meta: TxnMetadata) {
        if let Some(old) = self.by_id.get(&transactional_id) {
            self.ids_by_producer.remove(&old.producer_id);
        }
        self.ids_by_producer.insert(meta.producer_id, transactional_id.clone());
        self.by_id.insert(transactional_id, meta);
        debug_assert_eq!(self.ids_by_producer.len(), self.by_id.len());
    }

    fn by_producer(&self, producer_id: i64) -> Option<&TxnMetadata> {
        self.ids_by_producer.get(&producer_id).and_then(|id| self.by_id.get(id))
    }
}

impl std::ops::Deref for Transactions {
    type Target = BTreeMap<String, TxnMetadata>;
    fn deref(&self) -> &Self::Target {
        &self.by_id
    }
}

/// Entries are changed in place (never their producer id) through `get_mut`/`iter_mut`.
impl std::ops::DerefMut for Transactions {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.by_id
    }
}

/// The transactions of one transaction log partition this node leads.
pub struct TxnShard {
    partition: i32,
    log: TxnLog,
    transactions: Mutex<Transactions>,
}

impl CoordinatorShard for TxnShard {
    fn leader_epoch(&self) -> i32 {
        self.log.coordinator_epoch()
    }
}

/// The shards of this node by transaction log partition.
type TxnShards = Shards<TxnShard>;

pub struct TransactionCoordinator {
    /// Lock order: shards, then a shard's transactions.
    shards: RwLock<TxnShards>,
    /// Cluster mode: a creation of `__transaction_state` is under way.
    pub creating_topic: AtomicBool,
    /// Connections to other brokers for markers.
    pub peers: crate::txn::markers::PeerPool,
    /// One completion (markers, offsets) at a time per transactional id, so EndTxn, a
    /// timeout and a restart's recovery never write a transaction's markers twice at once;
    /// different transactions complete in parallel. At most one entry per known id.
    completing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Whether a request's producer id and epoch are the transaction's current ones.
fn check_producer(meta: &TxnMetadata, producer_id: i64, producer_epoch: i16) -> Result<(), ResponseError> {
    if meta.producer_id != producer_id {
        return Err(ResponseError::InvalidProducerIdMapping);
    }
    if meta.producer_epoch != producer_epoch {
        return Err(ResponseError::ProducerFenced);
    }
    Ok(())
}

impl TxnShard {
    fn new(partition: i32, log: TxnLog, transactions: BTreeMap<String, TxnMetadata>) -> TxnShard {
        TxnShard { partition, log, transactions: Mutex::new(Transactions::new(transactions)) }
    }

    /// Appends `transactional_id`'s metadata as it is now (under the lock, so the log
    /// holds the changes in their order); the caller answers once it is durable.
    fn record(
        &self,
        host: &dyn CoordinatorHost,
        transactions: &Transactions,
        transactional_id: &str,
    ) -> Result<PendingChange, ResponseError> {
        let meta = transactions.get(transactional_id).expect("a recorded entry exists");
        self.log.append(transactional_id, meta, host.logs().syncer())
    }
}

impl TransactionCoordinator {
    /// Single node: opens (replaying) the one local transaction log partition.
    pub fn open_local(data_dir: &std::path::Path, syncer: &Syncer) -> io::Result<TransactionCoordinator> {
        let (log, transactions) = crate::txn::log::open_local(data_dir, syncer)?;
        let shards = Shards::local(TxnShard::new(0, log, transactions));
        Ok(TransactionCoordinator::new(shards))
    }

    /// Cluster mode: coordinates nothing until [`TransactionCoordinator::follow_leadership`]
    /// says which `__transaction_state` partitions this node leads.
    pub fn replicated() -> TransactionCoordinator {
        TransactionCoordinator::new(TxnShards::default())
    }

    fn new(shards: TxnShards) -> TransactionCoordinator {
        TransactionCoordinator {
            shards: RwLock::new(shards),
            creating_topic: AtomicBool::new(false),
            peers: Default::default(),
            completing: Default::default(),
        }
    }

    fn active(&self) -> Vec<Arc<TxnShard>> {
        self.shards.read().active().cloned().collect()
    }

    /// The shard serving `transactional_id` here, or why this node cannot serve it.
    fn serving(&self, transactional_id: &str) -> Result<Arc<TxnShard>, ResponseError> {
        self.shards.read().serving(transactional_id).cloned().map_err(|not_served| match not_served {
            NotServed::Loading => ResponseError::CoordinatorLoadInProgress,
            NotServed::NotLeader | NotServed::NoPartitions => ResponseError::NotCoordinator,
        })
    }

    /// Cluster mode: the transaction log partitions that the metadata being applied has
    /// this node lead, before [`TransactionCoordinator::follow_leadership`] takes them.
    pub fn expect_leadership(&self, incoming: IncomingLeaderships) {
        self.shards.write().expect(incoming);
    }

    /// Cluster mode: follows the leadership of the `__transaction_state` partitions
    /// (`leaders[p]` is the replica and leader epoch when this node leads partition p):
    /// loads newly led partitions, drops those led no longer or at another epoch.
    pub fn follow_leadership(self: &Arc<Self>, leaders: Vec<Option<(Arc<Replica>, i32)>>) {
        let followed = self.shards.write().follow(leaders);
        for dropped in followed.dropped {
            tracing::debug!(partition = dropped.partition, "no longer transaction coordinator of this partition");
        }
        for load in followed.loads {
            let coordinator = self.clone();
            tracing::debug!(
                partition = load.partition,
                leader_epoch = load.leader_epoch,
                "loading transaction log partition"
            );
            tokio::task::spawn_blocking(move || coordinator.load(load));
        }
    }

    /// Replays the partition (outside any lock), then serves it if this node still leads
    /// it at the same epoch.
    fn load(&self, load: Load<Arc<Replica>>) {
        let Load { partition, replica, leader_epoch, generation } = load;
        let started = std::time::Instant::now();
        let (log, transactions) = match TxnLog::replicated(replica, leader_epoch) {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::error!(partition, %error, "cannot load transaction log partition");
                return;
            }
        };
        let count = transactions.len();
        if !self.shards.write().activate(partition, generation, TxnShard::new(partition, log, transactions)) {
            return;
        }
        let elapsed_ms = started.elapsed().as_millis() as u64;
        // Prepared transactions are completed by the next upkeep (at most a second away).
        tracing::debug!(
            partition,
            leader_epoch,
            transactional_ids = count,
            elapsed_ms,
            "transaction log partition loaded"
        );
    }

    /// Clean shutdown.
    pub fn close(&self) {
        for shard in self.active() {
            if let Err(error) = shard.log.close() {
                tracing::error!(%error, "failed to close the transaction log");
            }
        }
    }

    /// The state of `transactional_id`, if this node coordinates it.
    pub fn describe(&self, transactional_id: &str) -> Result<Option<TxnMetadata>, ResponseError> {
        Ok(self.serving(transactional_id)?.transactions.lock().get(transactional_id).cloned())
    }

    /// Every transaction this node coordinates.
    pub fn list(&self) -> Vec<(String, TxnMetadata)> {
        let mut listed = Vec::new();
        for shard in self.active() {
            listed.extend(shard.transactions.lock().iter().map(|(id, meta)| (id.clone(), meta.clone())));
        }
        listed
    }

    /// InitProducerId with a `transactional.id`: a new id gets a producer id; a known one
    /// gets its epoch bumped (fencing any older producer with that id), after its open
    /// transaction, if any, is aborted.
    pub async fn init_producer_id(
        &self,
        host: &dyn CoordinatorHost,
        transactional_id: &str,
        timeout_ms: i32,
    ) -> Result<(i64, i16), ResponseError> {
        if !(1..=TRANSACTION_TIMEOUT_MS_MAX).contains(&timeout_ms) {
            return Err(ResponseError::InvalidTransactionTimeout);
        }
        loop {
            let shard = self.serving(transactional_id)?;
            let (change, done) = {
                let mut transactions = shard.transactions.lock();
                match transactions.get(transactional_id).cloned() {
                    None => {
                        if transactions.len() >= TRANSACTIONAL_IDS_MAX {
                            return Err(ResponseError::CoordinatorNotAvailable);
                        }
                        let producer_id = host.topics().allocate_producer_id().map_err(|error| {
                            tracing::warn!(%error, "could not persist producer id block");
                            ResponseError::KafkaStorageError
                        })?;
                        transactions.insert(transactional_id.to_string(), new_metadata(producer_id, 0, timeout_ms));
                        (Some(shard.record(host, &transactions, transactional_id)?), Some((producer_id, 0)))
                    }
                    Some(meta) if meta.state == TxnState::Ongoing => {
                        // Abort the old producer's transaction, fencing it with a new epoch.
                        let meta = transactions.get_mut(transactional_id).expect("present");
                        meta.producer_epoch = bumped(meta.producer_epoch);
                        meta.state = TxnState::PrepareAbort;
                        (Some(shard.record(host, &transactions, transactional_id)?), None)
                    }
                    Some(meta) if meta.state.is_prepared() => (None, None),
                    Some(meta) => {
                        let (producer_id, producer_epoch) = if meta.producer_epoch >= i16::MAX - 1 {
                            let producer_id =
                                host.topics().allocate_producer_id().map_err(|_| ResponseError::KafkaStorageError)?;
                            (producer_id, 0)
                        } else {
                            (meta.producer_id, meta.producer_epoch + 1)
                        };
                        transactions.insert(
                            transactional_id.to_string(),
                            new_metadata(producer_id, producer_epoch, timeout_ms),
                        );
                        (
                            Some(shard.record(host, &transactions, transactional_id)?),
                            Some((producer_id, producer_epoch)),
                        )
                    }
                }
            };
            if let Some(change) = change {
                shard.log.wait_durable(change).await?;
            }
            match done {
                Some(ids) => return Ok(ids),
                None => self.complete(host, &shard, transactional_id).await.map_err(retriable)?,
            }
        }
    }

    /// AddPartitionsToTxn: the partitions the producer is about to write in its transaction.
    pub async fn add_partitions(
        &self,
        host: &dyn CoordinatorHost,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[(String, i32)],
    ) -> Result<(), ResponseError> {
        for (topic, partition) in partitions {
            let known = host.topics().get(topic).is_some_and(|t| (0..t.partitions).contains(partition));
            if !known || sluice_meta::topics::is_internal(topic) {
                return Err(ResponseError::UnknownTopicOrPartition);
            }
        }
        self.update_ongoing(host, transactional_id, producer_id, producer_epoch, |meta| {
            meta.partitions.extend(partitions.iter().cloned());
        })
        .await
    }

    /// AddOffsetsToTxn: the transaction will commit offsets of `group_id` (sent to the
    /// group coordinator with TxnOffsetCommit; this coordinator sends the group's offsets
    /// partition a marker when the transaction ends).
    pub async fn add_offsets(
        &self,
        host: &dyn CoordinatorHost,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        group_id: &str,
    ) -> Result<(), ResponseError> {
        self.update_ongoing(host, transactional_id, producer_id, producer_epoch, |meta| {
            meta.offsets.entry(group_id.to_string()).or_default();
        })
        .await
    }

    async fn update_ongoing(
        &self,
        host: &dyn CoordinatorHost,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        change: impl FnOnce(&mut TxnMetadata),
    ) -> Result<(), ResponseError> {
        let shard = self.serving(transactional_id)?;
        let recorded = {
            let mut transactions = shard.transactions.lock();
            let meta = transactions.get_mut(transactional_id).ok_or(ResponseError::InvalidProducerIdMapping)?;
            check_producer(meta, producer_id, producer_epoch)?;
            match meta.state {
                TxnState::PrepareCommit | TxnState::PrepareAbort => return Err(ResponseError::ConcurrentTransactions),
                TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                    meta.state = TxnState::Ongoing;
                    meta.started_ms = sluice_storage::now_ms();
                    meta.partitions.clear();
                    meta.offsets.clear();
                }
                TxnState::Ongoing => {}
            }
            change(meta);
            shard.record(host, &transactions, transactional_id)?
        };
        shard.log.wait_durable(recorded).await
    }

    /// EndTxn: commits or aborts the producer's transaction; answers once every marker is
    /// durable (and, for a commit, the offsets are committed).
    pub async fn end(
        &self,
        host: &dyn CoordinatorHost,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
    ) -> Result<(), ResponseError> {
        let shard = self.serving(transactional_id)?;
        let decided = {
            let mut transactions = shard.transactions.lock();
            let meta = transactions.get_mut(transactional_id).ok_or(ResponseError::InvalidProducerIdMapping)?;
            check_producer(meta, producer_id, producer_epoch)?;
            match (meta.state, commit) {
                (TxnState::Ongoing, _) => {
                    meta.state = if commit { TxnState::PrepareCommit } else { TxnState::PrepareAbort };
                    Some(shard.record(host, &transactions, transactional_id)?)
                }
                // A retry of an EndTxn that was already decided.
                (TxnState::PrepareCommit | TxnState::CompleteCommit, true)
                | (TxnState::PrepareAbort | TxnState::CompleteAbort, false) => None,
                // Aborting a transaction that never started is a no-op (librdkafka does it).
                (TxnState::Empty, false) => return Ok(()),
                _ => return Err(ResponseError::InvalidTxnState),
            }
        };
        if let Some(change) = decided {
            shard.log.wait_durable(change).await?;
        }
        self.complete(host, &shard, transactional_id).await.map_err(retriable)
    }

    /// Finishes a prepared transaction: writes its markers (to its partitions and its
    /// groups' offsets partitions), waits until they are durable, then records it complete.
    async fn complete(
        &self,
        host: &dyn CoordinatorHost,
        shard: &TxnShard,
        transactional_id: &str,
    ) -> Result<(), ResponseError> {
        let completion = self.completing.lock().entry(transactional_id.to_string()).or_default().clone();
        let _one_at_a_time = completion.lock().await;
        let Some(meta) = shard.transactions.lock().get(transactional_id).cloned() else { return Ok(()) };
        let commit = match meta.state {
            TxnState::PrepareCommit => true,
            TxnState::PrepareAbort => false,
            _ => return Ok(()),
        };
        // The decision is durable before any marker is written (it may have been appended by
        // a request still waiting for its fsync).
        shard.log.wait_durable(shard.log.written()).await?;
        let now_ms = sluice_storage::now_ms();
        if commit {
            self.commit_legacy_offsets(host, &meta, now_ms).await?;
        }
        let mut targets: Vec<MarkerTarget> = meta
            .partitions
            .iter()
            .map(|(topic, partition)| MarkerTarget::Partition(topic.clone(), *partition))
            .collect();
        if !meta.offsets.is_empty() {
            let count = host.groups().offsets_partition_count();
            if count == 0 {
                return Err(ResponseError::CoordinatorNotAvailable);
            }
            let partitions: BTreeSet<i32> = meta.offsets.keys().map(|group| partition_for(group, count)).collect();
            targets.extend(partitions.into_iter().map(MarkerTarget::Offsets));
        }
        let marker = Marker {
            producer_id: meta.producer_id,
            producer_epoch: meta.producer_epoch,
            commit,
            coordinator_epoch: shard.log.coordinator_epoch(),
        };
        crate::txn::markers::write_all(host, &self.peers, marker, targets, now_ms).await?;
        let completed = {
            let mut transactions = shard.transactions.lock();
            match transactions.get_mut(transactional_id) {
                Some(current) if current.state == meta.state && current.producer_epoch == meta.producer_epoch => {
                    current.state = if commit { TxnState::CompleteCommit } else { TxnState::CompleteAbort };
                    current.partitions.clear();
                    current.offsets.clear();
                    Some(shard.record(host, &transactions, transactional_id)?)
                }
                _ => None,
            }
        };
        if let Some(change) = completed {
            shard.log.wait_durable(change).await?;
        }
        tracing::debug!(transactional_id, commit, "transaction completed");
        Ok(())
    }

    /// Commits offsets an older version kept in the transaction's own state (a single
    /// node's transaction decided across an upgrade); nothing for any other.
    async fn commit_legacy_offsets(
        &self,
        host: &dyn CoordinatorHost,
        meta: &TxnMetadata,
        now_ms: i64,
    ) -> Result<(), ResponseError> {
        for (group_id, offsets) in meta.offsets.iter().filter(|(_, offsets)| !offsets.is_empty()) {
            let commits = offsets
                .iter()
                .map(|p| {
                    let value = CommittedOffset {
                        offset: p.offset,
                        leader_epoch: p.leader_epoch,
                        metadata: p.metadata.clone(),
                        commit_timestamp_ms: now_ms,
                    };
                    (p.topic.clone(), p.partition, value)
                })
                .collect();
            let write = host.groups().commit_legacy_transactional_offsets(group_id, commits, host.logs().syncer());
            let written = match write {
                Ok(write) => write.await,
                Err(error) => Err(error),
            };
            if let Err(error) = written {
                tracing::warn!(group_id, ?error, "could not commit a transaction's offsets; will retry");
                return Err(ResponseError::CoordinatorLoadInProgress);
            }
        }
        Ok(())
    }

    /// Appends a transactional batch of `producer_id` with `append`. When this node
    /// coordinates the producer's transaction, only as part of its open transaction that
    /// added this partition (else INVALID_TXN_STATE); the append then runs under the
    /// shard's lock, so the transaction cannot move to Prepare between the check and the
    /// append: every batch lands before its transaction's markers. On a single node an
    /// unknown producer id is INVALID_PRODUCER_ID_MAPPING; in a cluster its coordinator may
    /// be another node, and the batch is appended on its epoch alone.
    pub fn append_verified<R>(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        topic: &str,
        partition: i32,
        clustered: bool,
        append: impl FnOnce() -> R,
    ) -> Result<R, ResponseError> {
        // No allocation on this per-batch path: the shards are walked under their read lock
        // (lock order: shards, then a shard's transactions).
        let shards = self.shards.read();
        let active = shards.active();
        for shard in active {
            let transactions = shard.transactions.lock();
            let Some(meta) = transactions.by_producer(producer_id) else { continue };
            return match meta {
                meta if meta.producer_epoch > producer_epoch => Err(ResponseError::InvalidProducerEpoch),
                meta if meta.state == TxnState::Ongoing
                    && meta.partitions.contains(&(topic.to_string(), partition)) =>
                {
                    Ok(append())
                }
                _ => Err(ResponseError::InvalidTxnState),
            };
        }
        if clustered {
            Ok(append())
        } else {
            Err(ResponseError::InvalidProducerIdMapping)
        }
    }

    /// Periodic upkeep of every shard: aborts transactions open past their timeout (bumping
    /// the epoch, so their producer is fenced), completes those left prepared (a failed
    /// marker write, a restart or a failover), and writes log snapshots when due.
    pub async fn upkeep(&self, host: &dyn CoordinatorHost) {
        for shard in self.active() {
            if shard.log.is_current() {
                self.upkeep_shard(host, &shard).await;
            }
        }
    }

    async fn upkeep_shard(&self, host: &dyn CoordinatorHost, shard: &TxnShard) {
        let now_ms = sluice_storage::now_ms();
        let (due, snapshot) = {
            let mut transactions = shard.transactions.lock();
            let mut expired = Vec::new();
            for (id, meta) in transactions.iter_mut() {
                if meta.state == TxnState::Ongoing && now_ms - meta.started_ms > i64::from(meta.timeout_ms) {
                    tracing::info!(transactional_id = id, "aborting a transaction past its timeout");
                    meta.producer_epoch = bumped(meta.producer_epoch);
                    meta.state = TxnState::PrepareAbort;
                    expired.push(id.clone());
                }
            }
            for id in &expired {
                // `complete` waits for this to be durable before it writes markers.
                if shard.record(host, &transactions, id).is_err() {
                    return;
                }
            }
            let snapshot = if shard.log.snapshot_due() {
                shard.log.write_snapshot(&transactions, host.logs().syncer()).ok().flatten()
            } else {
                None
            };
            let due: Vec<String> =
                transactions.iter().filter(|(_, meta)| meta.state.is_prepared()).map(|(id, _)| id.clone()).collect();
            (due, snapshot)
        };
        if let Some((start, change)) = snapshot {
            if shard.log.wait_durable(change).await.is_ok() {
                shard.log.truncate_before(start);
            }
        }
        for id in due {
            if let Err(error) = self.complete(host, shard, &id).await {
                tracing::warn!(
                    transactional_id = id,
                    partition = shard.partition,
                    ?error,
                    "completing a transaction failed; will retry"
                );
            }
        }
    }
}

/// What EndTxn (or InitProducerId) answers when the markers could not all be written
/// yet: a retriable error, so the client sends it again; the upkeep retries meanwhile.
fn retriable(error: ResponseError) -> ResponseError {
    match error {
        ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable | ResponseError::ProducerFenced => error,
        _ => ResponseError::ConcurrentTransactions,
    }
}

fn new_metadata(producer_id: i64, producer_epoch: i16, timeout_ms: i32) -> TxnMetadata {
    TxnMetadata {
        producer_id,
        producer_epoch,
        timeout_ms,
        state: TxnState::Empty,
        partitions: BTreeSet::new(),
        offsets: BTreeMap::new(),
        started_ms: -1,
    }
}

/// The next epoch (a fenced producer's epoch never comes back).
fn bumped(epoch: i16) -> i16 {
    epoch.saturating_add(1)
}
