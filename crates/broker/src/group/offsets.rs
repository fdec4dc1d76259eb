//! Committed offsets in memory: group -> (topic, partition) -> offset, leader epoch and
//! metadata. This table is a cache of the `__consumer_offsets` log (see `journal`): an
//! entry changes only once the log record that carries it is durable, and each entry
//! remembers that record's log offset, so that answers applied out of order (two commits
//! waiting on the same fsync) still leave the newest value, exactly as a replay would.

use std::collections::{BTreeMap, HashMap};

/// One committed offset as a client sees it in OffsetFetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CommittedOffset {
    pub(crate) offset: i64,
    pub(crate) leader_epoch: i32,
    pub(crate) metadata: Option<String>,
    pub(crate) commit_timestamp_ms: i64,
}

#[derive(Debug, Clone)]
struct Entry {
    value: CommittedOffset,
    /// Offset of the `__consumer_offsets` record this value came from.
    log_offset: i64,
}

/// The in-memory committed offsets of every group.
#[derive(Debug, Default)]
pub(crate) struct OffsetTable {
    groups: HashMap<String, BTreeMap<(String, i32), Entry>>,
    /// Tombstones newer than any commit, kept so that a commit applied late (it waited on
    /// the same fsync) cannot bring a deleted offset back. Key: group, topic, partition.
    deleted_at: HashMap<(String, String, i32), i64>,
}

impl OffsetTable {
    /// Applies a durable commit unless a newer record for the key was applied already.
    pub(crate) fn apply_commit(
        &mut self,
        group: &str,
        topic: &str,
        partition: i32,
        value: CommittedOffset,
        log_offset: i64,
    ) {
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
    pub(crate) fn apply_delete(&mut self, group: &str, topic: &str, partition: i32, log_offset: i64) {
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

    /// Forgets tombstones once nothing can be in flight behind them (called on a tick).
    pub(crate) fn forget_tombstones(&mut self) {
        self.deleted_at.clear();
    }

    pub(crate) fn get(&self, group: &str, topic: &str, partition: i32) -> Option<&CommittedOffset> {
        self.groups.get(group)?.get(&(topic.to_string(), partition)).map(|entry| &entry.value)
    }

    /// Every committed offset of `group`, ordered by topic and partition.
    pub(crate) fn all(&self, group: &str) -> Vec<(String, i32, CommittedOffset)> {
        self.groups
            .get(group)
            .map(|offsets| offsets.iter().map(|((t, p), e)| (t.clone(), *p, e.value.clone())).collect())
            .unwrap_or_default()
    }

    pub(crate) fn has_group(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    pub(crate) fn group_ids(&self) -> impl Iterator<Item = &str> {
        self.groups.keys().map(String::as_str)
    }

    pub(crate) fn group_count(&self) -> usize {
        self.groups.len()
    }
}
