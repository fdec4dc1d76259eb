//! The node's set of partition logs, keyed by topic and partition, and their upkeep
//! (retention, page-cache flushes, clean shutdown).

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::log::{LogConfig, Partition};
use crate::syncer::Syncer;

/// Threads used to recover partitions in parallel at startup.
const RECOVERY_THREADS: usize = 4;
/// Threads sealing and fsyncing partitions in parallel at clean shutdown (fsync-bound).
const CLOSE_THREADS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> TopicPartition {
        TopicPartition { topic: topic.into(), partition }
    }

    /// Directory name, as Kafka names it: `<topic>-<partition>`.
    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }
}

pub struct LogManager {
    root: PathBuf,
    partitions: RwLock<HashMap<TopicPartition, Arc<Partition>>>,
    syncer: Syncer,
}

impl LogManager {
    /// `root` holds one directory per partition.
    pub fn new(root: &Path) -> io::Result<LogManager> {
        crate::durable::create_dir_all(root)?;
        Ok(LogManager { root: root.to_path_buf(), partitions: RwLock::new(HashMap::new()), syncer: Syncer::start() })
    }

    pub fn syncer(&self) -> &Syncer {
        &self.syncer
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<Arc<Partition>> {
        self.partitions.read().get(tp).cloned()
    }

    /// Opens (recovering) or creates the given partitions, several at a time.
    pub fn open_all(&self, wanted: Vec<(TopicPartition, LogConfig)>) -> io::Result<()> {
        let chunk = wanted.len().div_ceil(RECOVERY_THREADS).max(1);
        let results: Vec<io::Result<Vec<(TopicPartition, Partition)>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = wanted
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter()
                            .map(|(tp, config)| {
                                Ok((tp.clone(), Partition::open(&self.root.join(tp.dir_name()), config.clone())?))
                            })
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("recovery thread panicked")).collect()
        });
        let mut partitions = self.partitions.write();
        for result in results {
            for (tp, partition) in result? {
                partitions.insert(tp, Arc::new(partition));
            }
        }
        Ok(())
    }

    /// Creates (or opens) one partition.
    pub fn open(&self, tp: &TopicPartition, config: LogConfig) -> io::Result<Arc<Partition>> {
        if let Some(existing) = self.get(tp) {
            return Ok(existing);
        }
        let partition = Arc::new(Partition::open(&self.root.join(tp.dir_name()), config)?);
        self.partitions.write().insert(tp.clone(), partition.clone());
        Ok(partition)
    }

    /// Forgets a partition and deletes its directory.
    pub fn delete(&self, tp: &TopicPartition) -> io::Result<()> {
        let removed = self.partitions.write().remove(tp);
        if let Some(partition) = removed {
            std::fs::remove_dir_all(partition.dir())?;
        }
        Ok(())
    }

    /// Where a partition's directory is (or would be).
    pub fn dir_of(&self, tp: &TopicPartition) -> PathBuf {
        self.root.join(tp.dir_name())
    }

    /// Directories under the root that no open partition uses: once a cluster node has
    /// opened every partition it hosts, the logs of partitions deleted or moved away while
    /// it was down.
    pub fn unopened_dirs(&self) -> io::Result<Vec<PathBuf>> {
        let open: HashSet<std::ffi::OsString> = self.partitions.read().keys().map(|tp| tp.dir_name().into()).collect();
        let mut unopened = Vec::new();
        for entry in std::fs::read_dir(&self.root)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() && !open.contains(&entry.file_name()) {
                unopened.push(entry.path());
            }
        }
        Ok(unopened)
    }

    pub fn partitions(&self) -> Vec<(TopicPartition, Arc<Partition>)> {
        self.partitions.read().iter().map(|(tp, p)| (tp.clone(), p.clone())).collect()
    }

    /// Periodic upkeep: retention, and flushes due in page-cache mode.
    pub fn tick(&self, now_ms: i64) {
        for (tp, partition) in self.partitions() {
            let deleted = partition.apply_retention(now_ms);
            if deleted > 0 {
                tracing::info!(topic = %tp.topic, partition = tp.partition, deleted, "retention deleted segments");
            }
            if partition.flush_due(now_ms) {
                self.syncer.schedule(&partition);
            }
        }
    }

    /// Clean shutdown: stop syncing, then seal every partition and make it durable (in
    /// parallel, file by file).
    pub fn close(&self) {
        self.syncer.shutdown();
        let partitions = self.partitions();
        let chunk = partitions.len().div_ceil(CLOSE_THREADS).max(1);
        std::thread::scope(|scope| {
            for part in partitions.chunks(chunk) {
                scope.spawn(move || {
                    for (tp, partition) in part {
                        if let Err(error) = partition.close() {
                            tracing::error!(topic = %tp.topic, partition = tp.partition, %error, "failed to close partition");
                        }
                    }
                });
            }
        });
    }
}
