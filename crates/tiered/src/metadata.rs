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
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
pub use sluice_cluster::{RemoteLog as RemotePartition, RemoteLogSegment as RemoteSegment};
use uuid::Uuid;

use crate::RemoteLogController;
use sluice_meta::topics::TopicMeta;

const METADATA_FILE: &str = "remote-log.json";
const METADATA_VERSION: u32 = 1;

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

/// Where the remote log metadata lives: a file on a single node, the controller's
/// replicated metadata in a cluster (where only a partition's leader at its current epoch
/// may change it, so a deposed leader's late commit is refused).
pub enum RemoteLogMetadata {
    Local(LocalMetadata),
    /// With the lock that serialises this node's commits (each is a read-modify-write).
    Replicated(Arc<dyn RemoteLogController>, tokio::sync::Mutex<()>),
}

/// A single node's remote log metadata, in `meta/remote-log.json`.
pub struct LocalMetadata {
    path: PathBuf,
    partitions: Mutex<Partitions>,
    /// Serialises commits: each writes the whole file, so two must not interleave.
    commit_lock: tokio::sync::Mutex<()>,
}

impl RemoteLogMetadata {
    pub fn replicated(controller: Arc<dyn RemoteLogController>) -> RemoteLogMetadata {
        RemoteLogMetadata::Replicated(controller, tokio::sync::Mutex::new(()))
    }

    pub fn open_local(data_dir: &Path) -> io::Result<RemoteLogMetadata> {
        let dir = data_dir.join("meta");
        sluice_storage::durable::create_dir_all(&dir)?;
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
        Ok(RemoteLogMetadata::Local(LocalMetadata {
            path,
            partitions: Mutex::new(partitions),
            commit_lock: tokio::sync::Mutex::new(()),
        }))
    }

    /// A copy of one partition's remote part (empty when it has none).
    pub fn partition(&self, topic_id: Uuid, partition: i32) -> RemotePartition {
        match self {
            RemoteLogMetadata::Local(local) => {
                local.partitions.lock().get(&(topic_id, partition)).cloned().unwrap_or_default()
            }
            RemoteLogMetadata::Replicated(controller, _) => {
                controller.remote_log(topic_id, partition).unwrap_or_default()
            }
        }
    }

    /// The remote segment holding `offset` of a partition.
    pub fn segment_for(&self, topic_id: Uuid, partition: i32, offset: i64) -> Option<RemoteSegment> {
        self.partition(topic_id, partition).segment_for(offset).cloned()
    }

    /// The first remote segment with a record at or after `timestamp` (and at or after the
    /// remote start).
    pub fn segment_for_timestamp(&self, topic_id: Uuid, partition: i32, timestamp: i64) -> Option<RemoteSegment> {
        let remote = self.partition(topic_id, partition);
        remote.segments.values().find(|s| s.end_offset > remote.start_offset && s.max_timestamp >= timestamp).cloned()
    }

    /// Applies `change` to one partition's remote part and makes it durable (a file write,
    /// or a controller commit applied on this node) before it is visible; `leader_epoch` is
    /// the epoch this node leads the partition at. Returns what `change` returned and the
    /// remote range after.
    pub async fn commit<T>(
        &self,
        topic: &TopicMeta,
        partition: i32,
        leader_epoch: i32,
        change: impl FnOnce(&mut RemotePartition) -> T,
    ) -> io::Result<(T, Option<(i64, i64)>)> {
        match self {
            RemoteLogMetadata::Local(local) => {
                let _serialised = local.commit_lock.lock().await;
                let mut next = local.partitions.lock().clone();
                let remote = next.entry((topic.id, partition)).or_default();
                let result = change(remote);
                let range = remote.range();
                next.retain(|_, remote| *remote != RemotePartition::default());
                local.write(next).await?;
                Ok((result, range))
            }
            RemoteLogMetadata::Replicated(controller, commit_lock) => {
                let _serialised = commit_lock.lock().await;
                let mut remote = self.partition(topic.id, partition);
                let result = change(&mut remote);
                let range = remote.range();
                controller.set_remote_log(&topic.name, partition, leader_epoch, remote).await?;
                Ok((result, range))
            }
        }
    }

    /// Forgets a deleted topic's remote parts (a cluster's controller does so itself).
    pub async fn forget_topic(&self, topic_id: Uuid) -> io::Result<()> {
        match self {
            RemoteLogMetadata::Local(local) => {
                let _serialised = local.commit_lock.lock().await;
                let mut next = local.partitions.lock().clone();
                next.retain(|(id, _), _| *id != topic_id);
                local.write(next).await
            }
            RemoteLogMetadata::Replicated(..) => Ok(()),
        }
    }
}

impl LocalMetadata {
    async fn write(&self, next: Partitions) -> io::Result<()> {
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
        Ok(())
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
        let topic = TopicMeta { name: "t".into(), id: Uuid::new_v4(), partitions: 4, configs: BTreeMap::new() };
        let metadata = RemoteLogMetadata::open_local(dir.path()).unwrap();
        let ((), range) = metadata
            .commit(&topic, 3, 0, |remote| {
                remote.segments.insert(0, segment(0, 10));
                remote.segments.insert(10, segment(10, 25));
            })
            .await
            .unwrap();
        assert_eq!(range, Some((0, 25)));
        let reopened = RemoteLogMetadata::open_local(dir.path()).unwrap();
        let remote = reopened.partition(topic.id, 3);
        assert_eq!(remote.range(), Some((0, 25)));
        assert_eq!(remote.segment_for(12).map(|s| s.base_offset), Some(10));
        assert!(remote.segment_for(25).is_none());
        reopened.commit(&topic, 3, 0, |remote| remote.start_offset = 12).await.unwrap();
        let remote = RemoteLogMetadata::open_local(dir.path()).unwrap().partition(topic.id, 3);
        assert_eq!(remote.range(), Some((12, 25)));
        assert!(remote.segment_for(11).is_none(), "below the remote start nothing is readable");
        assert!(RemoteLogMetadata::open_local(dir.path()).unwrap().partition(Uuid::new_v4(), 3).range().is_none());
        reopened.forget_topic(topic.id).await.unwrap();
        assert!(RemoteLogMetadata::open_local(dir.path()).unwrap().partition(topic.id, 3).range().is_none());
    }
}
