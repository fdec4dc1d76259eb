//! Committed offsets in memory: group -> (topic, partition) -> offset, leader epoch and
//! metadata. This table is a cache of the `__consumer_offsets` log (see `journal`): an
//! entry changes only once the log record that carries it is durable, and each entry
//! remembers that record's log offset, so that answers applied out of order (two commits
//! waiting on the same fsync) still leave the newest value, exactly as a replay would.
//!
//! Offsets sent with a transaction (TxnOffsetCommit) wait here, by producer id, until the
//! transaction coordinator's marker for the group's offsets partition ends the transaction:
//! a commit applies them (at the marker's log offset), an abort drops them. A marker also
//! records the producer's epoch: offsets sent later with an older epoch come from a fenced
//! producer (a zombie) and are ignored, so they can never ride on a later commit.

use std::collections::{BTreeMap, HashMap};

/// One committed offset as a client sees it in OffsetFetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    pub commit_timestamp_ms: i64,
}

#[derive(Debug, Clone)]
struct Entry {
    value: CommittedOffset,
    /// Offset of the `__consumer_offsets` record this value came from.
    log_offset: i64,
}

/// The in-memory committed offsets of every group.
#[derive(Debug, Default)]
pub struct OffsetTable {
    groups: HashMap<String, BTreeMap<(String, i32), Entry>>,
    /// Tombstones newer than any commit, kept so that a commit applied late (it waited on
    /// the same fsync) cannot bring a deleted offset back. Key: group, topic, partition.
    deleted_at: HashMap<(String, String, i32), i64>,
    /// Offsets of transactions not ended yet, by producer id.
    pending_txn: HashMap<i64, PendingTxnOffsets>,
    /// The newest epoch each transactional producer ended a transaction at.
    ended_epochs: HashMap<i64, i16>,
}

/// The offsets one producer's open transaction sent, with the epoch it sent them at.
#[derive(Debug, Default)]
struct PendingTxnOffsets {
    epoch: i16,
    offsets: BTreeMap<(String, String, i32), CommittedOffset>,
}

/// An offset waiting for its transaction's end: producer id, epoch, (group, topic,
/// partition) and the value.
pub type PendingTxnOffset = (i64, i16, (String, String, i32), CommittedOffset);

impl OffsetTable {
    /// Applies a durable commit unless a newer record for the key was applied already.
    pub fn apply_commit(&mut self, group: &str, topic: &str, partition: i32, value: CommittedOffset, log_offset: i64) {
        let tombstone = (group.to_string(), topic.to_string(), partition);
        if self.deleted_at.get(&tombstone).is_some_and(|deleted| *deleted > log_offset) {
            return;
        }
        self.deleted_at.remove(&tombstone);
        let offsets = self.groups.entry(group.to_string()).or_default();
        let key = (topic.to_string(), partition);
        if offsets.get(&key).is_some_and(|existing| existing.log_offset > log_offset) {
            return;
        }
        offsets.insert(key, Entry { value, log_offset });
    }

    /// Applies a durable tombstone.
    pub fn apply_delete(&mut self, group: &str, topic: &str, partition: i32, log_offset: i64) {
        let Some(offsets) = self.groups.get_mut(group) else {
            self.deleted_at.insert((group.to_string(), topic.to_string(), partition), log_offset);
            return;
        };
        let key = (topic.to_string(), partition);
        match offsets.get(&key) {
            Some(existing) if existing.log_offset > log_offset => return,
            Some(_) => {
                offsets.remove(&key);
            }
            None => {
                self.deleted_at.insert((group.to_string(), topic.to_string(), partition), log_offset);
            }
        }
        if offsets.is_empty() {
            self.groups.remove(group);
        }
    }

    /// Holds a durable transactional offset until its transaction ends; ignored when the
    /// producer already ended a transaction at a newer epoch (it was fenced).
    pub fn apply_txn_commit(
        &mut self,
        producer_id: i64,
        producer_epoch: i16,
        key: (String, String, i32),
        value: CommittedOffset,
    ) {
        if self.ended_epochs.get(&producer_id).is_some_and(|ended| *ended > producer_epoch) {
            return;
        }
        let pending = self.pending_txn.entry(producer_id).or_default();
        if pending.epoch > producer_epoch {
            return;
        }
        if pending.epoch < producer_epoch {
            pending.offsets.clear();
            pending.epoch = producer_epoch;
        }
        pending.offsets.insert(key, value);
    }

    /// A durable marker at `log_offset`: `producer_id`'s transaction ended. Its pending
    /// offsets of groups for which `in_partition` holds (the marker's offsets partition)
    /// are committed or dropped.
    pub fn apply_txn_end(
        &mut self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        log_offset: i64,
        mut in_partition: impl FnMut(&str) -> bool,
    ) {
        let ended = self.ended_epochs.entry(producer_id).or_insert(producer_epoch);
        *ended = (*ended).max(producer_epoch);
        let Some(pending) = self.pending_txn.get_mut(&producer_id) else { return };
        let epoch = pending.epoch;
        let ending: Vec<(String, String, i32)> =
            pending.offsets.keys().filter(|(group, _, _)| in_partition(group)).cloned().collect();
        let mut committed = Vec::new();
        for key in ending {
            let value = pending.offsets.remove(&key).expect("listed above");
            if commit && epoch <= producer_epoch {
                committed.push((key, value));
            }
        }
        if pending.offsets.is_empty() {
            self.pending_txn.remove(&producer_id);
        }
        for ((group, topic, partition), value) in committed {
            self.apply_commit(&group, &topic, partition, value, log_offset);
        }
    }

    /// Whether `producer_id` already ended a transaction at a newer epoch than
    /// `producer_epoch` here (it was fenced by a newer producer with its transactional id).
    pub fn producer_fenced(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.ended_epochs.get(&producer_id).is_some_and(|ended| *ended > producer_epoch)
    }

    /// Whether an open transaction holds an offset of this group and partition
    /// (OffsetFetch with `require_stable` answers UNSTABLE_OFFSET_COMMIT then).
    pub fn has_pending_txn(&self, group: &str, topic: &str, partition: i32) -> bool {
        let key = (group.to_string(), topic.to_string(), partition);
        self.pending_txn.values().any(|pending| pending.offsets.contains_key(&key))
    }

    /// The pending transactional offsets of the groups for which `wanted` holds, and the
    /// ended epochs (what a compaction snapshot must carry over).
    pub fn live_txn_state(&self, mut wanted: impl FnMut(&str) -> bool) -> (Vec<PendingTxnOffset>, Vec<(i64, i16)>) {
        let mut pending = Vec::new();
        for (producer_id, txn) in &self.pending_txn {
            for (key, value) in txn.offsets.iter().filter(|((group, _, _), _)| wanted(group)) {
                pending.push((*producer_id, txn.epoch, key.clone(), value.clone()));
            }
        }
        let ended = self.ended_epochs.iter().map(|(id, epoch)| (*id, *epoch)).collect();
        (pending, ended)
    }

    /// Forgets tombstones once nothing can be in flight behind them (called on a tick).
    pub fn forget_tombstones(&mut self) {
        self.deleted_at.clear();
    }

    pub fn get(&self, group: &str, topic: &str, partition: i32) -> Option<&CommittedOffset> {
        self.groups.get(group)?.get(&(topic.to_string(), partition)).map(|entry| &entry.value)
    }

    /// Every committed offset of `group`, ordered by topic and partition.
    pub fn all(&self, group: &str) -> Vec<(String, i32, CommittedOffset)> {
        self.groups
            .get(group)
            .map(|offsets| offsets.iter().map(|((t, p), e)| (t.clone(), *p, e.value.clone())).collect())
            .unwrap_or_default()
    }

    pub fn has_group(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    pub fn group_ids(&self) -> impl Iterator<Item = &str> {
        self.groups.keys().map(String::as_str)
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Forgets every group for which `doomed` holds (its offsets partition moved away).
    pub fn remove_groups(&mut self, mut doomed: impl FnMut(&str) -> bool) {
        self.groups.retain(|group, _| !doomed(group));
        self.deleted_at.retain(|(group, _, _), _| !doomed(group));
        for pending in self.pending_txn.values_mut() {
            pending.offsets.retain(|(group, _, _), _| !doomed(group));
        }
        self.pending_txn.retain(|_, pending| !pending.offsets.is_empty());
    }

    /// Takes over the groups of `loaded` (a freshly replayed partition), replacing any
    /// entries of the same groups.
    pub fn absorb(&mut self, loaded: OffsetTable) {
        for (group, offsets) in loaded.groups {
            self.groups.insert(group, offsets);
        }
        for (producer_id, epoch) in loaded.ended_epochs {
            let ended = self.ended_epochs.entry(producer_id).or_insert(epoch);
            *ended = (*ended).max(epoch);
        }
        for (producer_id, loaded) in loaded.pending_txn {
            for (key, value) in loaded.offsets {
                self.apply_txn_commit(producer_id, loaded.epoch, key, value);
            }
        }
    }

    /// Every committed offset of the groups for which `wanted` holds.
    pub fn live_offsets(&self, mut wanted: impl FnMut(&str) -> bool) -> Vec<OffsetKeyValue> {
        let mut live = Vec::new();
        for (group, offsets) in self.groups.iter().filter(|(group, _)| wanted(group)) {
            for ((topic, partition), entry) in offsets {
                live.push(((group.clone(), topic.clone(), *partition), entry.value.clone(), entry.log_offset));
            }
        }
        live
    }

    /// Offsets to expire (Kafka's `offsets.retention.minutes`): of each group for which
    /// `idle_since` gives a time (no members since then; `i64::MIN` = never seen with
    /// members), those committed, and idle, for at least `retention_ms` at `now_ms`.
    /// Groups with members (`idle_since` is `None`) keep every offset.
    pub fn expired(
        &self,
        now_ms: i64,
        retention_ms: i64,
        mut idle_since: impl FnMut(&str) -> Option<i64>,
    ) -> Vec<(String, Vec<(String, i32)>)> {
        let mut expired = Vec::new();
        for (group, offsets) in &self.groups {
            let Some(idle_since_ms) = idle_since(group) else { continue };
            let doomed: Vec<(String, i32)> = offsets
                .iter()
                .filter(|(_, entry)| {
                    let since = entry.value.commit_timestamp_ms.max(idle_since_ms);
                    since.saturating_add(retention_ms) <= now_ms
                })
                .map(|(key, _)| key.clone())
                .collect();
            if !doomed.is_empty() {
                expired.push((group.clone(), doomed));
            }
        }
        expired
    }
}

/// (group, topic, partition), its committed offset and the log offset of that record.
pub type OffsetKeyValue = ((String, String, i32), CommittedOffset, i64);

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(offset: i64, at_ms: i64) -> CommittedOffset {
        CommittedOffset { offset, leader_epoch: -1, metadata: None, commit_timestamp_ms: at_ms }
    }

    fn check_expired(table: &OffsetTable, now_ms: i64, live: &[&str], expected: &[(&str, &[(&str, i32)])]) {
        let mut got = table.expired(now_ms, 1_000, |group| (!live.contains(&group)).then_some(i64::MIN));
        got.sort();
        let expected: Vec<(String, Vec<(String, i32)>)> = expected
            .iter()
            .map(|(g, keys)| (g.to_string(), keys.iter().map(|(t, p)| (t.to_string(), *p)).collect()))
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn retention_expires_old_offsets_of_groups_without_members() {
        let mut table = OffsetTable::default();
        table.apply_commit("idle", "t", 0, committed(5, 100), 0);
        table.apply_commit("idle", "t", 1, committed(6, 900), 1);
        table.apply_commit("busy", "t", 0, committed(7, 100), 2);
        check_expired(&table, 1_099, &["busy"], &[]);
        check_expired(&table, 1_100, &["busy"], &[("idle", &[("t", 0)])]);
        check_expired(&table, 5_000, &["busy"], &[("idle", &[("t", 0), ("t", 1)])]);
        check_expired(&table, 5_000, &[], &[("busy", &[("t", 0)]), ("idle", &[("t", 0), ("t", 1)])]);
        // A group that had members until recently keeps its offsets for a full retention.
        assert!(table.expired(5_000, 1_000, |g| (g == "idle").then_some(4_500)).is_empty());
    }

    #[test]
    fn transactional_offsets_wait_for_their_marker_and_fenced_ones_never_land() {
        let key = |group: &str| (group.to_string(), "t".to_string(), 0);
        let mut table = OffsetTable::default();
        table.apply_txn_commit(7, 1, key("a"), committed(10, 0));
        table.apply_txn_commit(7, 1, key("b"), committed(20, 0));
        assert!(table.get("a", "t", 0).is_none(), "not visible before the commit marker");
        assert!(table.has_pending_txn("a", "t", 0));
        // The marker of group a's partition commits a's offset only.
        table.apply_txn_end(7, 1, true, 5, |group| group == "a");
        assert_eq!(table.get("a", "t", 0).map(|v| v.offset), Some(10));
        assert!(!table.has_pending_txn("a", "t", 0) && table.has_pending_txn("b", "t", 0));
        // An abort drops b's.
        table.apply_txn_end(7, 2, false, 6, |group| group == "b");
        assert!(table.get("b", "t", 0).is_none() && !table.has_pending_txn("b", "t", 0));
        // The fenced epoch 1 sends again: ignored, and a later commit at epoch 2 never
        // carries it.
        table.apply_txn_commit(7, 1, key("a"), committed(99, 0));
        table.apply_txn_end(7, 2, true, 7, |_| true);
        assert_eq!(table.get("a", "t", 0).map(|v| v.offset), Some(10));
    }

    #[test]
    fn a_loaded_partition_replaces_its_groups_only() {
        let mut table = OffsetTable::default();
        table.apply_commit("a", "t", 0, committed(1, 0), 0);
        table.apply_commit("b", "t", 0, committed(2, 0), 1);
        table.remove_groups(|g| g == "a");
        let mut loaded = OffsetTable::default();
        loaded.apply_commit("a", "t", 0, committed(9, 0), 7);
        table.absorb(loaded);
        assert_eq!(table.get("a", "t", 0).map(|v| v.offset), Some(9));
        assert_eq!(table.get("b", "t", 0).map(|v| v.offset), Some(2));
        let mut live = table.live_offsets(|g| g == "b");
        live.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(live, vec![(("b".to_string(), "t".to_string(), 0), committed(2, 0), 1)]);
    }
}
