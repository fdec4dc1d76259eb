//! Where the coordinator's state lives: one *shard* per `__consumer_offsets` partition
//! this node leads (the single node leads its one local partition). A group is served
//! only by the leader of its partition ([`crate::placement::partition_for`]); every other node
//! answers NOT_COORDINATOR, and a new leader answers COORDINATOR_LOAD_IN_PROGRESS until it
//! has replayed the partition. Losing leadership drops the partition's groups from memory.
//!
//! Why a shard and not a coordinator per partition: groups, offsets and the ticker stay
//! one structure with one lock order (shards, then groups, then offsets), and the
//! single-node path is the same code with one always-led shard.
//!
//! Compaction (a snapshot, not a key-based cleaner): once a shard has appended
//! `offsets_snapshot_interval_bytes` since its last snapshot, the ticker appends every live
//! offset of the partition as ordinary commit records (the *snapshot*), waits until they
//! are durable, and moves the log start offset to the snapshot's first record; storage
//! then deletes the whole segments before it, and followers follow the leader's log
//! start offset (`sluice_replication::spawn_supervisor`). Replaying from the new log start rebuilds the
//! same state: every key's newest value before the snapshot is in the snapshot, and
//! anything after it overrides it. Writes still waiting for durability when the snapshot
//! is taken are folded in from `ShardWrites::pending` (the log is a prefix: if the
//! snapshot is durable, so are they).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_storage::Syncer;

use crate::group::error::GroupError;
use crate::group::journal::{OffsetRecord, OffsetsLog};
use crate::group::offsets::{CommittedOffset, OffsetTable};
use crate::group::{GroupCoordinator, OFFSETS_WRITE_TIMEOUT_MS};
use crate::leadership::{CoordinatorShard, Load, NotServed, Shards};
use crate::placement::{partition_for, IncomingLeaderships};
use sluice_replication::Replica;

/// Records per snapshot batch: far below `OFFSETS_BATCH_BYTES_MAX` even with the largest
/// group ids, topic names and metadata (about 8 KiB a record).
const SNAPSHOT_RECORDS_PER_BATCH: usize = 512;
const _: () = assert!(SNAPSHOT_RECORDS_PER_BATCH * 9 * 1024 < crate::group::OFFSETS_BATCH_BYTES_MAX);

/// The offsets log's settings (Kafka's `offsets.*` broker configs).
#[derive(Debug, Clone, Copy)]
pub struct OffsetsSettings {
    /// Kafka's `offsets.retention.minutes`, in ms.
    pub retention_ms: i64,
    /// Kafka's `offsets.retention.check.interval.ms`.
    pub retention_check_interval_ms: i64,
    /// Bytes appended to a partition after which a compaction snapshot is written.
    pub snapshot_interval_bytes: u64,
}

/// The shards of this node by offsets partition.
pub type ShardMap = Shards<ShardLog>;

/// One offsets partition this node serves.
pub struct ShardLog {
    partition: i32,
    leader_epoch: i32,
    log: OffsetsLog,
    /// Cleared (under the offsets lock) when the shard is dropped: late write answers
    /// must not bring its groups back into memory.
    live: AtomicBool,
    writes: Mutex<ShardWrites>,
}

#[derive(Default)]
struct ShardWrites {
    /// Appended, not yet applied to the offsets table, by base offset.
    pending: BTreeMap<i64, (String, Vec<OffsetRecord>)>,
    bytes_since_snapshot: u64,
    snapshot_in_flight: bool,
}

impl CoordinatorShard for ShardLog {
    fn leader_epoch(&self) -> i32 {
        self.leader_epoch
    }
}

/// A single node's one offsets partition, active from the start.
pub fn local_shards(log: OffsetsLog) -> ShardMap {
    let bytes_since_snapshot = log.partition().size_bytes();
    Shards::local(ShardLog::new(0, sluice_meta::LEADER_EPOCH, log, bytes_since_snapshot))
}

fn refusal(not_served: NotServed) -> GroupError {
    match not_served {
        NotServed::Loading => GroupError::CoordinatorLoadInProgress,
        NotServed::NotLeader | NotServed::NoPartitions => GroupError::NotCoordinator,
    }
}

impl ShardLog {
    fn new(partition: i32, leader_epoch: i32, log: OffsetsLog, bytes_since_snapshot: u64) -> ShardLog {
        let writes = ShardWrites { bytes_since_snapshot, ..ShardWrites::default() };
        ShardLog { partition, leader_epoch, log, live: AtomicBool::new(true), writes: Mutex::new(writes) }
    }

    #[cfg(test)]
    pub fn log_partition(&self) -> &Arc<sluice_storage::Partition> {
        self.log.partition()
    }

    #[cfg(test)]
    pub fn snapshot_in_flight(&self) -> bool {
        self.writes.lock().snapshot_in_flight
    }

    pub fn close(&self) {
        if let Err(error) = self.log.close() {
            tracing::error!(%error, "failed to close the offsets log");
        }
    }
}

impl GroupCoordinator {
    /// The log of offsets partition `partition` while this node serves it (a single node
    /// serves its one partition, 0): what Fetch and ListOffsets of `__consumer_offsets` read.
    pub fn offsets_partition(&self, partition: i32) -> Option<Arc<sluice_storage::Partition>> {
        let shards = self.shards.read();
        shards.serving_partition(partition).ok().map(|shard| shard.log.partition().clone())
    }

    /// The shard serving `group_id` here, or why this node cannot serve it.
    pub fn serving(&self, group_id: &str) -> Result<Arc<ShardLog>, GroupError> {
        self.shards.read().serving(group_id).cloned().map_err(refusal)
    }

    /// The shard of offsets partition `partition`, or why this node cannot serve it.
    pub fn serving_partition(&self, partition: i32) -> Result<Arc<ShardLog>, GroupError> {
        self.shards.read().serving_partition(partition).cloned().map_err(refusal)
    }

    /// Cluster mode: the offsets partitions that the metadata being applied has this node
    /// lead, before [`GroupCoordinator::follow_leadership`] takes them.
    pub fn expect_leadership(&self, incoming: IncomingLeaderships) {
        self.shards.write().expect(incoming);
    }

    /// The offsets partition count (0 until a cluster node learns it; 1 on a single node).
    pub fn offsets_partition_count(&self) -> i32 {
        self.shards.read().partition_count()
    }

    /// Cluster mode: follows the leadership of the offsets partitions (`leaders[p]` is the
    /// replica and leader epoch when this node leads partition p). Starts loading newly
    /// led partitions and drops the groups of those led no longer (or led at another epoch).
    pub fn follow_leadership(self: &Arc<Self>, leaders: Vec<Option<(Arc<Replica>, i32)>>) {
        let mut shards = self.shards.write();
        let count = shards.partition_count();
        let followed = shards.follow(leaders);
        if shards.partition_count() != count {
            tracing::info!(partitions = shards.partition_count(), "offsets topic partition count");
        }
        for dropped in followed.dropped {
            self.forget(&dropped.shard, dropped.partition, dropped.partition_count);
        }
        for load in followed.loads {
            let coordinator = self.clone();
            tracing::info!(partition = load.partition, leader_epoch = load.leader_epoch, "loading offsets partition");
            tokio::task::spawn_blocking(move || coordinator.load(load));
        }
    }

    /// Drops the groups and offsets of a partition this node no longer serves (under the
    /// shards' lock: lock order shards, groups, offsets).
    fn forget(&self, shard: &ShardLog, partition: i32, count: i32) {
        let mut groups = self.groups.lock();
        let mut offsets = self.offsets.lock();
        shard.live.store(false, Ordering::Release);
        groups.classic.retain(|group_id, _| partition_for(group_id, count) != partition);
        groups.consumer.retain(|group_id, _| partition_for(group_id, count) != partition);
        offsets.remove_groups(|group_id| partition_for(group_id, count) == partition);
        tracing::info!(partition, "no longer coordinator of offsets partition; groups dropped");
    }

    /// Replays the partition (outside any lock), then serves it if this node still leads
    /// it at the same epoch.
    fn load(&self, load: Load<Arc<Replica>>) {
        let Load { partition, replica, leader_epoch, generation } = load;
        let started = std::time::Instant::now();
        let log = OffsetsLog::replicated(replica, leader_epoch);
        let records = match log.replay() {
            Ok(records) => records,
            Err(error) => {
                tracing::error!(partition, %error, "cannot load offsets partition");
                return;
            }
        };
        let replayed = records.len();
        let table = table_from(records);
        let bytes_since_snapshot = log.partition().size_bytes();
        let mut shards = self.shards.write();
        if !shards.awaits(partition, generation) {
            return;
        }
        let count = shards.partition_count();
        {
            let mut groups = self.groups.lock();
            let mut offsets = self.offsets.lock();
            groups.classic.retain(|group_id, _| partition_for(group_id, count) != partition);
            groups.consumer.retain(|group_id, _| partition_for(group_id, count) != partition);
            offsets.remove_groups(|group_id| partition_for(group_id, count) == partition);
            offsets.absorb(table);
        }
        let shard = ShardLog::new(partition, leader_epoch, log, bytes_since_snapshot);
        assert!(shards.activate(partition, generation, shard), "awaited under the same lock");
        let elapsed_ms = started.elapsed().as_millis() as u64;
        tracing::info!(partition, leader_epoch, records = replayed, elapsed_ms, "offsets partition loaded");
    }

    /// Appends `records` of `group_id` to its shard; the future resolves once they are
    /// durable and applied to the offsets table.
    pub fn write(
        self: &Arc<Self>,
        shard: &Arc<ShardLog>,
        group_id: &str,
        records: Vec<OffsetRecord>,
        syncer: &Syncer,
    ) -> Result<impl std::future::Future<Output = Result<(), GroupError>> + Send + 'static, GroupError> {
        let pending = if records.is_empty() {
            None
        } else {
            let mut writes = shard.writes.lock();
            let pending = shard.log.append(&records, syncer)?;
            writes.bytes_since_snapshot += pending.bytes() as u64;
            writes.pending.insert(pending.base_offset(), (group_id.to_string(), records));
            Some(pending)
        };
        let coordinator = self.clone();
        let shard = shard.clone();
        Ok(async move {
            let Some(pending) = pending else { return Ok(()) };
            let timeout = Duration::from_millis(OFFSETS_WRITE_TIMEOUT_MS);
            let result = shard.log.wait_durable(pending.visible_at(), timeout).await;
            let base_offset = pending.base_offset();
            // Applied before it leaves `pending`, so a snapshot always sees it in one.
            let written = shard.writes.lock().pending.get(&base_offset).cloned();
            let (group_id, records) = written.expect("a pending write is removed only here");
            if result.is_ok() {
                let count = coordinator.shards.read().partition_count();
                let mut offsets = coordinator.offsets.lock();
                if shard.live.load(Ordering::Acquire) {
                    for (index, record) in records.into_iter().enumerate() {
                        if let OffsetRecord::Commit { group, .. } = &record {
                            debug_assert_eq!(group, &group_id);
                        }
                        let in_partition = |group: &str| partition_for(group, count) == shard.partition;
                        apply_record(&mut offsets, base_offset + index as i64, record, in_partition);
                    }
                }
            }
            shard.writes.lock().pending.remove(&base_offset);
            result
        })
    }

    /// Periodic offsets upkeep (from the ticker): compaction snapshots, and every
    /// `retention_check_interval_ms` the expiry of old offsets of groups without members.
    pub fn upkeep(self: &Arc<Self>, now_ms: i64, syncer: &Syncer) {
        let active: Vec<Arc<ShardLog>> = self.shards.read().active().cloned().collect();
        for shard in &active {
            self.maybe_snapshot(shard, syncer);
        }
        let mut last = self.last_retention_check_ms.lock();
        if now_ms - *last < self.settings.retention_check_interval_ms {
            return;
        }
        *last = now_ms;
        drop(last);
        self.forget_unserved_groups();
        self.expire_offsets(&active, now_ms, syncer);
    }

    fn expire_offsets(self: &Arc<Self>, active: &[Arc<ShardLog>], now_ms: i64, syncer: &Syncer) {
        let expired = {
            let groups = self.groups.lock();
            let offsets = self.offsets.lock();
            let mut idle_since = self.idle_since_ms.lock();
            let expired = offsets.expired(now_ms, self.settings.retention_ms, |group_id| {
                let has_members = groups.classic.get(group_id).is_some_and(|g| !g.is_idle())
                    || groups.consumer.get(group_id).is_some_and(|g| !g.is_empty());
                if has_members {
                    idle_since.insert(group_id.to_string(), now_ms);
                    return None;
                }
                Some(idle_since.get(group_id).copied().unwrap_or(i64::MIN))
            });
            idle_since.retain(|group_id, _| offsets.has_group(group_id));
            expired
        };
        for (group_id, keys) in expired {
            let Ok(shard) = self.serving(&group_id) else { continue };
            if !active.iter().any(|s| Arc::ptr_eq(s, &shard)) {
                continue;
            }
            tracing::info!(group = %group_id, offsets = keys.len(), "expiring committed offsets (retention)");
            let records = keys
                .into_iter()
                .map(|(topic, partition)| OffsetRecord::Delete { group: group_id.clone(), topic, partition })
                .collect();
            match self.write(&shard, &group_id, records, syncer) {
                Ok(write) => {
                    tokio::spawn(async move {
                        if let Err(error) = write.await {
                            tracing::warn!(%error, "offsets expiry write failed");
                        }
                    });
                }
                Err(error) => tracing::warn!(%error, "offsets expiry write refused"),
            }
        }
    }

    /// Writes a compaction snapshot of `shard` when enough was appended since the last.
    fn maybe_snapshot(self: &Arc<Self>, shard: &Arc<ShardLog>, syncer: &Syncer) {
        let count = self.shards.read().partition_count();
        let mut writes = shard.writes.lock();
        if writes.snapshot_in_flight || writes.bytes_since_snapshot < self.settings.snapshot_interval_bytes {
            return;
        }
        // Newest value per key: the durable table, overridden by newer pending writes.
        let in_partition = |group_id: &str| partition_for(group_id, count) == shard.partition;
        let (mut live, (pending_txn, ended_epochs)) = {
            let offsets = self.offsets.lock();
            (offsets.live_offsets(in_partition), offsets.live_txn_state(in_partition))
        };
        let mut live: BTreeMap<(String, String, i32), (Option<CommittedOffset>, i64)> =
            live.drain(..).map(|(key, value, log_offset)| (key, (Some(value), log_offset))).collect();
        // Transaction records still in flight are carried over as they are, in their order,
        // after the durable transaction state (replaying them again is harmless).
        let mut in_flight_txn = Vec::new();
        for (base_offset, (_, records)) in &writes.pending {
            for (index, record) in records.iter().enumerate() {
                let log_offset = base_offset + index as i64;
                let (key, value) = match record.clone() {
                    OffsetRecord::Commit { group, topic, partition, value } => ((group, topic, partition), Some(value)),
                    OffsetRecord::Delete { group, topic, partition } => ((group, topic, partition), None),
                    txn @ (OffsetRecord::TxnCommit { .. } | OffsetRecord::TxnEnd { .. }) => {
                        in_flight_txn.push(txn);
                        continue;
                    }
                };
                if live.get(&key).is_none_or(|(_, known)| *known < log_offset) {
                    live.insert(key, (value, log_offset));
                }
            }
        }
        let commits = live.into_iter().filter_map(|((group, topic, partition), (value, _))| {
            value.map(|value| OffsetRecord::Commit { group, topic, partition, value })
        });
        // Ended epochs first (markers with nothing left to end), then what is still pending.
        let ended = ended_epochs.into_iter().map(|(producer_id, producer_epoch)| OffsetRecord::TxnEnd {
            producer_id,
            producer_epoch,
            commit: false,
        });
        let pending = pending_txn.into_iter().map(|(producer_id, producer_epoch, (group, topic, partition), value)| {
            OffsetRecord::TxnCommit { producer_id, producer_epoch, group, topic, partition, value }
        });
        let records: Vec<OffsetRecord> = commits.chain(ended).chain(pending).chain(in_flight_txn).collect();
        let mut start = shard.log.partition().offsets().log_end_offset;
        let mut end = start;
        for (index, batch) in records.chunks(SNAPSHOT_RECORDS_PER_BATCH).enumerate() {
            match shard.log.append(batch, syncer) {
                Ok(pending) => {
                    if index == 0 {
                        start = pending.base_offset();
                    }
                    end = pending.visible_at();
                }
                Err(error) => {
                    tracing::warn!(partition = shard.partition, %error, "offsets snapshot append failed");
                    return;
                }
            }
        }
        writes.bytes_since_snapshot = 0;
        writes.snapshot_in_flight = true;
        drop(writes);
        tracing::info!(partition = shard.partition, records = records.len(), start, "offsets snapshot written");
        let shard = shard.clone();
        tokio::spawn(async move {
            let timeout = Duration::from_millis(OFFSETS_WRITE_TIMEOUT_MS);
            if shard.log.wait_durable(end, timeout).await.is_ok() {
                match shard.log.partition().delete_records_before(start) {
                    Ok(log_start) => tracing::info!(partition = shard.partition, log_start, "offsets log compacted"),
                    Err(error) => tracing::warn!(partition = shard.partition, %error, "offsets log start not moved"),
                }
            }
            shard.writes.lock().snapshot_in_flight = false;
        });
    }
}

/// Applies one durable record at `log_offset`; `in_partition` says which groups live in
/// the record's offsets partition (a marker ends the transaction there only).
fn apply_record(
    offsets: &mut OffsetTable,
    log_offset: i64,
    record: OffsetRecord,
    in_partition: impl FnMut(&str) -> bool,
) {
    match record {
        OffsetRecord::Commit { group, topic, partition, value } => {
            offsets.apply_commit(&group, &topic, partition, value, log_offset)
        }
        OffsetRecord::Delete { group, topic, partition } => offsets.apply_delete(&group, &topic, partition, log_offset),
        OffsetRecord::TxnCommit { producer_id, producer_epoch, group, topic, partition, value } => {
            offsets.apply_txn_commit(producer_id, producer_epoch, (group, topic, partition), value)
        }
        OffsetRecord::TxnEnd { producer_id, producer_epoch, commit } => {
            offsets.apply_txn_end(producer_id, producer_epoch, commit, log_offset, in_partition)
        }
    }
}

/// The offsets table a replay of one partition's `records` gives.
pub fn table_from(records: Vec<(i64, OffsetRecord)>) -> OffsetTable {
    let mut table = OffsetTable::default();
    for (log_offset, record) in records {
        apply_record(&mut table, log_offset, record, |_| true);
    }
    table.forget_tombstones();
    table
}
