//! Which offsets of which partition live in the object store: the remote segments of every
//! tiered partition and each partition's remote log start, persisted atomically in
//! `<data_dir>/meta/remote-log.json` beside the topic registry (`meta/cluster.json`).
//!
//! Why its own module: this is the single source of truth for what the object store holds
//! for readers. An object exists before its segment is listed here (copy, then commit), and
//! a segment leaves this list before its objects are deleted (commit, then delete), so a
//! crash at any point leaves at worst unlisted objects, never a listed segment without
//! its data.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

const METADATA_FILE: &str = "remote-log.json";
const METADATA_VERSION: u32 = 1;

/// One segment copied to the object store (Kafka's RemoteLogSegmentMetadata).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSegment {
    /// Names its objects: a segment copied twice (a retry after a crash) gets two ids,
    /// and only the committed one is read.
    pub id: Uuid,
    pub base_offset: i64,
    /// The segment covers `[base_offset, end_offset)`.
    pub end_offset: i64,
    pub max_timestamp: i64,
    pub size_bytes: u64,
    /// (leader epoch, first offset) of the epochs with records in the segment.
    pub leader_epochs: Vec<(i32, i64)>,
    /// A producer snapshot at `end_offset` was copied beside it.
    pub has_producer_snapshot: bool,
    /// Aborted transactions were copied beside it (read_committed reads need them).
    pub has_aborted_transactions: bool,
}

/// A tiered partition's remote part.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemotePartition {
    /// The first readable offset of the remote part (moved by DeleteRecords and retention).
    pub start_offset: i64,
    /// By base offset.
    pub segments: BTreeMap<i64, RemoteSegment>,
}

impl RemotePartition {
    /// `[start, end)` the remote part holds, `None` when it holds nothing.
    pub fn range(&self) -> Option<(i64, i64)> {
        let first = self.segments.values().next()?;
        let end = self.segments.values().map(|s| s.end_offset).max().expect("non-empty");
        Some((self.start_offset.max(first.base_offset).min(end), end))
    }

    /// The segment holding `offset`, if the remote part has it.
    pub fn segment_for(&self, offset: i64) -> Option<&RemoteSegment> {
        if offset < self.start_offset {
            return None;
        }
        let (_, segment) = self.segments.range(..=offset).next_back()?;
        (offset < segment.end_offset).then_some(segment)
    }

    pub fn size_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.size_bytes).sum()
    }
}

#[derive(Serialize, Deserialize)]
struct MetadataFile {
    version: u32,
    partitions: Vec<PartitionEntry>,
}

#[derive(Serialize, Deserialize)]
struct PartitionEntry {
    topic_id: Uuid,
    partition: i32,
    remote: RemotePartition,
}

type Partitions = BTreeMap<(Uuid, i32), RemotePartition>;

/// The remote log metadata of this node's tiered partitions.
pub struct RemoteLogMetadata {
    path: PathBuf,
    partitions: Mutex<Partitions>,
    /// Serialises commits: each writes the whole file, so two must not interleave.
    commit_lock: tokio::sync::Mutex<()>,
}

impl RemoteLogMetadata {
    pub fn open(data_dir: &Path) -> io::Result<RemoteLogMetadata> {
        let dir = data_dir.join("meta");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(METADATA_FILE);
        let partitions = match std::fs::read(&path) {
            Ok(bytes) => {
                let file: MetadataFile = serde_json::from_slice(&bytes)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
                if file.version != METADATA_VERSION {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}: unknown version {}", path.display(), file.version),
                    ));
                }
                file.partitions.into_iter().map(|e| ((e.topic_id, e.partition), e.remote)).collect()
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => Partitions::new(),
            Err(error) => return Err(error),
        };
        Ok(RemoteLogMetadata { path, partitions: Mutex::new(partitions), commit_lock: tokio::sync::Mutex::new(()) })
    }

    /// A copy of one partition's remote part (empty when it has none).
    pub fn partition(&self, topic_id: Uuid, partition: i32) -> RemotePartition {
        self.partitions.lock().get(&(topic_id, partition)).cloned().unwrap_or_default()
    }

    /// The remote segment holding `offset` of a partition.
    pub fn segment_for(&self, topic_id: Uuid, partition: i32, offset: i64) -> Option<RemoteSegment> {
        self.partitions.lock().get(&(topic_id, partition))?.segment_for(offset).cloned()
    }

    /// The first remote segment with a record at or after `timestamp` (and at or after the
    /// remote start).
    pub fn segment_for_timestamp(&self, topic_id: Uuid, partition: i32, timestamp: i64) -> Option<RemoteSegment> {
        let partitions = self.partitions.lock();
        let remote = partitions.get(&(topic_id, partition))?;
        remote.segments.values().find(|s| s.end_offset > remote.start_offset && s.max_timestamp >= timestamp).cloned()
    }

    /// Applies `change` to every partition's remote part and makes it durable before it is
    /// visible. Returns what `change` returned.
    pub async fn commit<T>(&self, change: impl FnOnce(&mut Partitions) -> T) -> io::Result<T> {
        let _serialised = self.commit_lock.lock().await;
        let mut next = self.partitions.lock().clone();
        let result = change(&mut next);
        next.retain(|_, remote| !remote.segments.is_empty() || remote.start_offset > 0);
        let file = MetadataFile {
            version: METADATA_VERSION,
            partitions: next
                .iter()
                .map(|(&(topic_id, partition), remote)| PartitionEntry { topic_id, partition, remote: remote.clone() })
                .collect(),
        };
        let body = serde_json::to_vec(&file).map_err(io::Error::other)?;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || sluice_storage::write_file_atomically(&path, &body))
            .await
            .map_err(io::Error::other)??;
        *self.partitions.lock() = next;
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(base: i64, end: i64) -> RemoteSegment {
        RemoteSegment {
            id: Uuid::new_v4(),
            base_offset: base,
            end_offset: end,
            max_timestamp: base,
            size_bytes: 100,
            leader_epochs: vec![(0, 0)],
            has_producer_snapshot: false,
            has_aborted_transactions: false,
        }
    }

    #[tokio::test]
    async fn commits_survive_a_reopen_and_ranges_follow_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let topic = Uuid::new_v4();
        let metadata = RemoteLogMetadata::open(dir.path()).unwrap();
        metadata
            .commit(|partitions| {
                let remote = partitions.entry((topic, 3)).or_default();
                remote.segments.insert(0, segment(0, 10));
                remote.segments.insert(10, segment(10, 25));
            })
            .await
            .unwrap();
        let reopened = RemoteLogMetadata::open(dir.path()).unwrap();
        let remote = reopened.partition(topic, 3);
        assert_eq!(remote.range(), Some((0, 25)));
        assert_eq!(remote.segment_for(12).map(|s| s.base_offset), Some(10));
        assert!(remote.segment_for(25).is_none());
        reopened.commit(|partitions| partitions.get_mut(&(topic, 3)).unwrap().start_offset = 12).await.unwrap();
        let remote = RemoteLogMetadata::open(dir.path()).unwrap().partition(topic, 3);
        assert_eq!(remote.range(), Some((12, 25)));
        assert!(remote.segment_for(11).is_none(), "below the remote start nothing is readable");
        assert!(RemoteLogMetadata::open(dir.path()).unwrap().partition(Uuid::new_v4(), 3).range().is_none());
    }
}
