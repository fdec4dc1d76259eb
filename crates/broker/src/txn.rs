//! The transaction coordinator (KIP-98, KIP-447) of a single node.
//!
//! One entry per `transactional.id`: its producer id and epoch, its state
//! (Empty -> Ongoing -> PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort), the
//! partitions and group offsets it wrote. Every change is appended to the transaction log
//! (`txn_log.rs`, fsynced by the group-commit syncer, never under this coordinator's lock)
//! and answered once durable, so a decision survives a crash: a transaction found in a
//! Prepare state at startup is completed again. A decision is durable before any marker.
//!
//! Ending a transaction writes a commit or abort marker to each of its partitions
//! ([`sluice_storage::Partition::append_marker`]) and waits until each is durable; a commit
//! then applies the offsets sent with it (TxnOffsetCommit) to their groups. A transaction
//! open longer than its `transaction.timeout.ms` is aborted with the producer's epoch
//! bumped, which fences the producer, as Kafka does. A transactional batch is appended only
//! to a partition its producer's open transaction has added (AddPartitionsToTxn), so no
//! producer can hold a partition's last stable offset back outside a transaction.
//!
//! Not yet: a cluster's coordinator (`__transaction_state` replicated with failover), so
//! in cluster mode transactional producers are refused.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use sluice_storage::Syncer;

use crate::group::offsets::CommittedOffset;
use crate::txn_log::{PendingChange, TxnLog};
use crate::Broker;

/// Kafka's `transaction.max.timeout.ms` default: the longest `transaction.timeout.ms`.
pub const TRANSACTION_TIMEOUT_MS_MAX: i32 = 900_000;
/// The most transactional ids kept (each is a few hundred bytes in memory and on disk).
pub const TRANSACTIONAL_IDS_MAX: usize = 100_000;
/// The coordinator epoch written in markers: one coordinator, never moved.
const COORDINATOR_EPOCH: i32 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

impl TxnState {
    /// Kafka's name, as ListTransactions and DescribeTransactions report it.
    pub(crate) fn name(self) -> &'static str {
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

/// An offset commit sent with a transaction, applied when it commits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PendingOffset {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) leader_epoch: i32,
    pub(crate) metadata: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TxnMetadata {
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) timeout_ms: i32,
    pub(crate) state: TxnState,
    pub(crate) partitions: BTreeSet<(String, i32)>,
    /// Groups added with AddOffsetsToTxn, with the offsets sent for them.
    pub(crate) offsets: BTreeMap<String, Vec<PendingOffset>>,
    pub(crate) started_ms: i64,
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

pub(crate) struct TransactionCoordinator {
    log: TxnLog,
    transactions: Mutex<Transactions>,
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

impl TransactionCoordinator {
    pub(crate) fn open(data_dir: &std::path::Path, syncer: &Syncer) -> io::Result<TransactionCoordinator> {
        let (log, transactions) = TxnLog::open(data_dir, syncer)?;
        Ok(TransactionCoordinator {
            log,
            transactions: Mutex::new(Transactions::new(transactions)),
            completing: Default::default(),
        })
    }

    /// Appends `transactional_id`'s metadata as it is now (under the lock, so the log
    /// holds the changes in their order); the caller answers once it is durable.
    fn record(
        &self,
        broker: &Broker,
        transactions: &Transactions,
        transactional_id: &str,
    ) -> Result<PendingChange, ResponseError> {
        let meta = transactions.get(transactional_id).expect("a recorded entry exists");
        self.log.append(transactional_id, meta, broker.logs.syncer())
    }

    /// Clean shutdown.
    pub(crate) fn close(&self) {
        if let Err(error) = self.log.close() {
            tracing::error!(%error, "failed to close the transaction log");
        }
    }

    pub(crate) fn describe(&self, transactional_id: &str) -> Option<TxnMetadata> {
        self.transactions.lock().get(transactional_id).cloned()
    }

    pub(crate) fn list(&self) -> Vec<(String, TxnMetadata)> {
        self.transactions.lock().iter().map(|(id, meta)| (id.clone(), meta.clone())).collect()
    }

    /// InitProducerId with a `transactional.id`: a new id gets a producer id; a known one
    /// gets its epoch bumped (fencing any older producer with that id), after its open
    /// transaction, if any, is aborted.
    pub(crate) async fn init_producer_id(
        &self,
        broker: &Arc<Broker>,
        transactional_id: &str,
        timeout_ms: i32,
    ) -> Result<(i64, i16), ResponseError> {
        if !(1..=TRANSACTION_TIMEOUT_MS_MAX).contains(&timeout_ms) {
            return Err(ResponseError::InvalidTransactionTimeout);
        }
        loop {
            let (change, done) = {
                let mut transactions = self.transactions.lock();
                match transactions.get(transactional_id).cloned() {
                    None => {
                        if transactions.len() >= TRANSACTIONAL_IDS_MAX {
                            return Err(ResponseError::CoordinatorNotAvailable);
                        }
                        let producer_id = broker.topics.allocate_producer_id().map_err(|error| {
                            tracing::warn!(%error, "could not persist producer id block");
                            ResponseError::KafkaStorageError
                        })?;
                        transactions.insert(transactional_id.to_string(), new_metadata(producer_id, 0, timeout_ms));
                        (Some(self.record(broker, &transactions, transactional_id)?), Some((producer_id, 0)))
                    }
                    Some(meta) if meta.state == TxnState::Ongoing => {
                        // Abort the old producer's transaction, fencing it with a new epoch.
                        let meta = transactions.get_mut(transactional_id).expect("present");
                        meta.producer_epoch = bumped(meta.producer_epoch);
                        meta.state = TxnState::PrepareAbort;
                        (Some(self.record(broker, &transactions, transactional_id)?), None)
                    }
                    Some(meta) if meta.state.is_prepared() => (None, None),
                    Some(meta) => {
                        let (producer_id, producer_epoch) = if meta.producer_epoch >= i16::MAX - 1 {
                            let producer_id =
                                broker.topics.allocate_producer_id().map_err(|_| ResponseError::KafkaStorageError)?;
                            (producer_id, 0)
                        } else {
                            (meta.producer_id, meta.producer_epoch + 1)
                        };
                        transactions.insert(
                            transactional_id.to_string(),
                            new_metadata(producer_id, producer_epoch, timeout_ms),
                        );
                        (
                            Some(self.record(broker, &transactions, transactional_id)?),
                            Some((producer_id, producer_epoch)),
                        )
                    }
                }
            };
            if let Some(change) = change {
                self.log.wait_durable(change).await?;
            }
            match done {
                Some(ids) => return Ok(ids),
                None => self.complete(broker, transactional_id).await?,
            }
        }
    }

    /// AddPartitionsToTxn: the partitions the producer is about to write in its transaction.
    pub(crate) async fn add_partitions(
        &self,
        broker: &Broker,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[(String, i32)],
    ) -> Result<(), ResponseError> {
        for (topic, partition) in partitions {
            if broker.partition(topic, *partition).is_none() {
                return Err(ResponseError::UnknownTopicOrPartition);
            }
        }
        self.update_ongoing(broker, transactional_id, producer_id, producer_epoch, |meta| {
            meta.partitions.extend(partitions.iter().cloned());
        })
        .await
    }

    /// AddOffsetsToTxn: the transaction will commit offsets of `group_id`.
    pub(crate) async fn add_offsets(
        &self,
        broker: &Broker,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        group_id: &str,
    ) -> Result<(), ResponseError> {
        self.update_ongoing(broker, transactional_id, producer_id, producer_epoch, |meta| {
            meta.offsets.entry(group_id.to_string()).or_default();
        })
        .await
    }

    /// TxnOffsetCommit: offsets to commit for `group_id` if the transaction commits.
    pub(crate) async fn commit_offsets(
        &self,
        broker: &Broker,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        group_id: &str,
        offsets: Vec<PendingOffset>,
    ) -> Result<(), ResponseError> {
        let change = {
            let mut transactions = self.transactions.lock();
            let meta = transactions.get_mut(transactional_id).ok_or(ResponseError::InvalidProducerIdMapping)?;
            check_producer(meta, producer_id, producer_epoch)?;
            if meta.state != TxnState::Ongoing {
                return Err(ResponseError::InvalidTxnState);
            }
            let pending = meta.offsets.get_mut(group_id).ok_or(ResponseError::InvalidTxnState)?;
            for offset in offsets {
                pending.retain(|p| (p.topic.as_str(), p.partition) != (offset.topic.as_str(), offset.partition));
                pending.push(offset);
            }
            self.record(broker, &transactions, transactional_id)?
        };
        self.log.wait_durable(change).await
    }

    async fn update_ongoing(
        &self,
        broker: &Broker,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        change: impl FnOnce(&mut TxnMetadata),
    ) -> Result<(), ResponseError> {
        let recorded = {
            let mut transactions = self.transactions.lock();
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
            self.record(broker, &transactions, transactional_id)?
        };
        self.log.wait_durable(recorded).await
    }

    /// EndTxn: commits or aborts the producer's transaction; answers once every marker is
    /// durable (and, for a commit, the offsets are committed).
    pub(crate) async fn end(
        &self,
        broker: &Arc<Broker>,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
    ) -> Result<(), ResponseError> {
        let decided = {
            let mut transactions = self.transactions.lock();
            let meta = transactions.get_mut(transactional_id).ok_or(ResponseError::InvalidProducerIdMapping)?;
            check_producer(meta, producer_id, producer_epoch)?;
            match (meta.state, commit) {
                (TxnState::Ongoing, _) => {
                    meta.state = if commit { TxnState::PrepareCommit } else { TxnState::PrepareAbort };
                    Some(self.record(broker, &transactions, transactional_id)?)
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
            self.log.wait_durable(change).await?;
        }
        self.complete(broker, transactional_id).await
    }

    /// Finishes a prepared transaction: writes its markers, waits until they are durable,
    /// applies its offsets on commit, then records it complete.
    async fn complete(&self, broker: &Arc<Broker>, transactional_id: &str) -> Result<(), ResponseError> {
        let completion = self.completing.lock().entry(transactional_id.to_string()).or_default().clone();
        let _one_at_a_time = completion.lock().await;
        let Some(meta) = self.describe(transactional_id) else { return Ok(()) };
        let commit = match meta.state {
            TxnState::PrepareCommit => true,
            TxnState::PrepareAbort => false,
            _ => return Ok(()),
        };
        // The decision is durable before any marker is written (it may have been appended by
        // a request still waiting for its fsync).
        self.log.wait_durable(self.log.written()).await?;
        let now_ms = sluice_storage::now_ms();
        let mut waits = Vec::new();
        for (topic, partition) in &meta.partitions {
            let marker = Marker {
                producer_id: meta.producer_id,
                producer_epoch: meta.producer_epoch,
                commit,
                coordinator_epoch: COORDINATOR_EPOCH,
            };
            match write_marker(broker, topic, *partition, marker, now_ms) {
                Ok(wait) => waits.extend(wait),
                // The partition is gone (its topic was deleted): nothing to end there.
                Err(ResponseError::UnknownTopicOrPartition) => {}
                Err(error) => {
                    tracing::warn!(topic, partition, ?error, "could not write a transaction marker; will retry");
                    return Err(error);
                }
            }
        }
        wait_markers(waits).await?;
        if commit {
            for (group_id, offsets) in &meta.offsets {
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
                let write = broker.groups.commit_transactional_offsets(group_id, commits, broker.logs.syncer());
                let written = match write {
                    Ok(write) => write.await,
                    Err(error) => Err(error),
                };
                if let Err(error) = written {
                    tracing::warn!(group_id, ?error, "could not commit a transaction's offsets; will retry");
                    return Err(ResponseError::CoordinatorLoadInProgress);
                }
            }
        }
        let completed = {
            let mut transactions = self.transactions.lock();
            match transactions.get_mut(transactional_id) {
                Some(current) if current.state == meta.state && current.producer_epoch == meta.producer_epoch => {
                    current.state = if commit { TxnState::CompleteCommit } else { TxnState::CompleteAbort };
                    current.partitions.clear();
                    current.offsets.clear();
                    Some(self.record(broker, &transactions, transactional_id)?)
                }
                _ => None,
            }
        };
        if let Some(change) = completed {
            self.log.wait_durable(change).await?;
        }
        tracing::debug!(transactional_id, commit, "transaction completed");
        Ok(())
    }

    /// Whether an open or deciding transaction holds offsets of `group_id` for this
    /// partition that are not committed yet (OffsetFetch with `require_stable`).
    pub(crate) fn has_pending_offsets(&self, group_id: &str, topic: &str, partition: i32) -> bool {
        let transactions = self.transactions.lock();
        transactions.values().any(|meta| {
            matches!(meta.state, TxnState::Ongoing | TxnState::PrepareCommit)
                && meta
                    .offsets
                    .get(group_id)
                    .is_some_and(|offsets| offsets.iter().any(|o| o.topic == topic && o.partition == partition))
        })
    }

    /// Appends a transactional batch of `producer_id` with `append`, only as part of its
    /// open transaction that added this partition (else INVALID_TXN_STATE). The append
    /// runs under the coordinator's lock, so the transaction cannot move to Prepare between
    /// the check and the append: every batch lands before its transaction's markers.
    pub(crate) fn append_verified<R>(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        topic: &str,
        partition: i32,
        append: impl FnOnce() -> R,
    ) -> Result<R, ResponseError> {
        let transactions = self.transactions.lock();
        let meta = transactions.by_producer(producer_id);
        match meta {
            None => Err(ResponseError::InvalidProducerIdMapping),
            Some(meta) if meta.producer_epoch > producer_epoch => Err(ResponseError::InvalidProducerEpoch),
            Some(meta)
                if meta.state == TxnState::Ongoing && meta.partitions.contains(&(topic.to_string(), partition)) =>
            {
                Ok(append())
            }
            Some(_) => Err(ResponseError::InvalidTxnState),
        }
    }

    /// Periodic upkeep: aborts transactions open past their timeout (bumping the epoch, so
    /// their producer is fenced) and completes those left prepared (a failed marker write,
    /// or a restart).
    pub(crate) async fn upkeep(&self, broker: &Arc<Broker>) {
        let now_ms = sluice_storage::now_ms();
        let (due, snapshot) = {
            let mut transactions = self.transactions.lock();
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
                if self.record(broker, &transactions, id).is_err() {
                    return;
                }
            }
            let snapshot = if self.log.snapshot_due() {
                self.log.write_snapshot(&transactions, broker.logs.syncer()).ok().flatten()
            } else {
                None
            };
            let due: Vec<String> =
                transactions.iter().filter(|(_, meta)| meta.state.is_prepared()).map(|(id, _)| id.clone()).collect();
            (due, snapshot)
        };
        if let Some((start, change)) = snapshot {
            if self.log.wait_durable(change).await.is_ok() {
                self.log.truncate_before(start);
            }
        }
        for id in due {
            if let Err(error) = self.complete(broker, &id).await {
                tracing::warn!(transactional_id = id, ?error, "completing a transaction failed; will retry");
            }
        }
    }
}

/// A commit or abort marker (control batch) for one producer's transaction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Marker {
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) commit: bool,
    pub(crate) coordinator_epoch: i32,
}

/// A written marker: durable once the partition's high watermark reaches `at`.
pub(crate) struct MarkerWait {
    visible: tokio::sync::watch::Receiver<sluice_storage::Visible>,
    at: i64,
}

/// How long a marker may take to become durable (fsynced, and in a cluster in the ISR).
pub(crate) const MARKER_DURABLE_TIMEOUT_MS: u64 = 30_000;

/// Appends `marker` to a partition this node leads, stamped with its leader epoch.
/// `Ok(None)`: the producer was already fenced there by a newer epoch, so there is
/// nothing to end. Used by the coordinator and by WriteTxnMarkers.
pub(crate) fn write_marker(
    broker: &Broker,
    topic: &str,
    partition: i32,
    marker: Marker,
    now_ms: i64,
) -> Result<Option<MarkerWait>, ResponseError> {
    let (log, leader_epoch) = match &broker.replicas {
        None => {
            (broker.partition(topic, partition).ok_or(ResponseError::UnknownTopicOrPartition)?, crate::LEADER_EPOCH)
        }
        Some(_) => {
            let replica = broker.hosted_replica(topic, partition, ResponseError::UnknownTopicOrPartition)?;
            let write = replica.begin_write(-1).map_err(crate::replication::NotServed::error)?;
            (replica.log.clone(), write.leader_epoch)
        }
    };
    let Marker { producer_id, producer_epoch, commit, coordinator_epoch } = marker;
    match log.append_marker(producer_id, producer_epoch, commit, coordinator_epoch, leader_epoch, now_ms) {
        Ok(outcome) => {
            if outcome.needs_sync {
                broker.logs.syncer().schedule(&log);
            }
            Ok(Some(MarkerWait { visible: log.subscribe(), at: outcome.visible_at }))
        }
        Err(sluice_storage::AppendError::StaleProducerEpoch) => Ok(None),
        Err(error) => {
            tracing::warn!(topic, partition, %error, "could not write a transaction marker");
            Err(ResponseError::KafkaStorageError)
        }
    }
}

/// Waits until every written marker is durable.
pub(crate) async fn wait_markers(waits: Vec<MarkerWait>) -> Result<(), ResponseError> {
    let timeout = std::time::Duration::from_millis(MARKER_DURABLE_TIMEOUT_MS);
    for MarkerWait { mut visible, at } in waits {
        let reached = tokio::time::timeout(timeout, visible.wait_for(|v| v.high_watermark >= at || v.failed))
            .await
            .map_err(|_| ResponseError::RequestTimedOut)?;
        if !reached.is_ok_and(|v| v.high_watermark >= at) {
            return Err(ResponseError::KafkaStorageError);
        }
    }
    Ok(())
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
