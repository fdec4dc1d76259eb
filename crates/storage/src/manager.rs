//! The node's set of partition logs, keyed by topic and partition, and their upkeep
//! (retention, page-cache flushes, the log cleaner's thread, clean shutdown).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::cleaner::{CleanerSettings, IoPacer};
use crate::log::{LogConfig, Partition};
use crate::syncer::Syncer;

/// Threads used to recover partitions in parallel at startup.
const RECOVERY_THREADS: usize = 16;
/// Threads sealing and fsyncing partitions in parallel at clean shutdown (fsync-bound).
const CLOSE_THREADS: usize = 16;
/// Every partition's high watermark, as of the last checkpoint (Kafka's file name).
const HIGH_WATERMARK_CHECKPOINT_FILE: &str = "replication-offset-checkpoint";
/// The end of the name a deleted partition's directory is renamed to (Kafka's own): no
/// partition directory ends so (theirs end in `-<partition>`).
const DELETED_DIR_SUFFIX: &str = "-delete";
/// How often the high watermarks are checkpointed (Kafka's default, 5 s).
pub const HIGH_WATERMARK_CHECKPOINT_INTERVAL_MS: i64 = 5_000;

#[derive(Serialize, Deserialize, Default)]
struct HighWatermarkCheckpoint {
    version: u32,
    /// Partition directory name -> high watermark.
    high_watermarks: BTreeMap<String, i64>,
}

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

type Partitions = Arc<RwLock<HashMap<TopicPartition, Arc<Partition>>>>;

/// A topic's open partitions by index, and the signal they share (see
/// [`Partition::set_signal`]): looked up by `&str` without building a [`TopicPartition`].
#[derive(Default)]
struct TopicLogs {
    partitions: Vec<Option<Arc<Partition>>>,
    signal: Arc<tokio::sync::Notify>,
}

/// The log cleaner's thread and what stops it.
struct CleanerThread {
    handle: std::thread::JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

/// Held by the cleaner while it works on a partition; deleting a partition or closing the
/// logs takes it (after asking the cleaner to stop with [`LogManager::cleaner_abort`]).
type CleanerLock = Arc<Mutex<()>>;

pub struct LogManager {
    root: PathBuf,
    partitions: Partitions,
    by_topic: RwLock<HashMap<String, TopicLogs>>,
    cleaner: Mutex<Option<CleanerThread>>,
    cleaner_lock: CleanerLock,
    /// Asks a cleaning pass to stop at its next segment.
    cleaner_abort: Arc<AtomicBool>,
    syncer: Syncer,
    /// fsyncs of any partition that failed since the start (see [`LogManager::fsync_failures`]).
    fsync_failures: Arc<watch::Sender<u64>>,
    /// The high watermarks read at startup: where a replicated partition's starts again.
    recovered_high_watermarks: BTreeMap<String, i64>,
    /// (time of the last checkpoint, what it wrote)
    last_checkpoint: Mutex<(i64, BTreeMap<String, i64>)>,
}

impl LogManager {
    /// `root` holds one directory per partition; acknowledged appends are made durable by
    /// per-file fsyncs.
    pub fn new(root: &Path) -> io::Result<LogManager> {
        LogManager::start(root, None)
    }

    /// Like [`LogManager::new`], with acknowledged appends made durable through the
    /// write-ahead log in `<root>/wal` (see [`crate::wal`]).
    pub fn with_wal(root: &Path) -> io::Result<LogManager> {
        LogManager::with_wal_files_of(root, crate::wal::WAL_FILE_BYTES)
    }

    /// [`LogManager::with_wal`] with WAL files of `wal_file_bytes` (at least
    /// [`crate::wal::WAL_FILE_BYTES_MIN`]).
    pub fn with_wal_files_of(root: &Path, wal_file_bytes: u64) -> io::Result<LogManager> {
        LogManager::start(root, Some(wal_file_bytes))
    }

    /// `wal`: the size of the WAL's files, or `None` for one fsync per partition file.
    fn start(root: &Path, wal: Option<u64>) -> io::Result<LogManager> {
        crate::durable::create_dir_all(root)?;
        remove_deleted_dirs(root)?;
        // Whatever a previous run left in the WAL goes into the logs before any opens.
        let wal_dir = root.join(crate::wal::WAL_DIR);
        let base = root.parent().unwrap_or(root);
        let replayed = crate::wal::replay(&wal_dir, base)?;
        if replayed.files > 0 {
            tracing::info!(
                files = replayed.files,
                records = replayed.records,
                partitions_extended = replayed.partitions_extended,
                batches_appended = replayed.batches_appended,
                "replayed the write-ahead log"
            );
        }
        let syncer = match wal {
            Some(file_bytes) => Syncer::start_with_wal(&wal_dir, base, file_bytes)?,
            None => Syncer::start(),
        };
        let recovered = read_high_watermark_checkpoint(root);
        Ok(LogManager {
            root: root.to_path_buf(),
            partitions: Arc::new(RwLock::new(HashMap::new())),
            by_topic: RwLock::new(HashMap::new()),
            cleaner: Mutex::new(None),
            cleaner_lock: Arc::new(Mutex::new(())),
            cleaner_abort: Arc::new(AtomicBool::new(false)),
            syncer,
            fsync_failures: Arc::new(watch::Sender::new(0)),
            last_checkpoint: Mutex::new((0, recovered.clone())),
            recovered_high_watermarks: recovered,
        })
    }

    /// Opens one partition log and tells it where its replicated high watermark restarts.
    fn open_partition(&self, tp: &TopicPartition, config: LogConfig) -> io::Result<Partition> {
        let partition = Partition::open(&self.root.join(tp.dir_name()), config)?;
        partition.count_failures_in(self.fsync_failures.clone());
        let recovered = self.recovered_high_watermarks.get(&tp.dir_name()).copied();
        partition.set_recovered_high_watermark(recovered.unwrap_or(0));
        Ok(partition)
    }

    /// Writes every partition's high watermark if they changed since the last checkpoint.
    pub fn checkpoint_high_watermarks(&self, now_ms: i64) -> io::Result<()> {
        let current: BTreeMap<String, i64> =
            self.partitions().iter().map(|(tp, p)| (tp.dir_name(), p.offsets().high_watermark)).collect();
        let mut last = self.last_checkpoint.lock();
        if last.1 == current {
            return Ok(());
        }
        let checkpoint = HighWatermarkCheckpoint { version: 1, high_watermarks: current };
        let body = serde_json::to_vec(&checkpoint).map_err(io::Error::other)?;
        crate::write_file_atomically(&self.root.join(HIGH_WATERMARK_CHECKPOINT_FILE), &body)?;
        *last = (now_ms, checkpoint.high_watermarks);
        Ok(())
    }

    /// The number of fsyncs of this manager's partitions that failed so far (each failure
    /// took its partition offline), so a node in a cluster can stop and let its leaderships
    /// move, as Kafka halts a broker whose log directory failed.
    pub fn fsync_failures(&self) -> watch::Receiver<u64> {
        self.fsync_failures.subscribe()
    }

    pub fn syncer(&self) -> &Syncer {
        &self.syncer
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<Arc<Partition>> {
        self.get_in(&tp.topic, tp.partition)
    }

    /// Like [`LogManager::get`], without allocating: the fetch path looks up every
    /// partition it serves on every pass.
    pub fn get_in(&self, topic: &str, partition: i32) -> Option<Arc<Partition>> {
        let index = usize::try_from(partition).ok()?;
        self.by_topic.read().get(topic)?.partitions.get(index)?.clone()
    }

    /// Adds an opened partition to the maps and gives it its topic's signal.
    fn insert(
        &self,
        partitions: &mut HashMap<TopicPartition, Arc<Partition>>,
        tp: TopicPartition,
        partition: Arc<Partition>,
    ) {
        let mut by_topic = self.by_topic.write();
        let topic = by_topic.entry(tp.topic.clone()).or_default();
        partition.set_signal(topic.signal.clone());
        if let Ok(index) = usize::try_from(tp.partition) {
            if topic.partitions.len() <= index {
                topic.partitions.resize(index + 1, None);
            }
            topic.partitions[index] = Some(partition.clone());
        }
        partitions.insert(tp, partition);
    }

    /// Opens (recovering) or creates the given partitions, several at a time; those open
    /// already stay as they are.
    pub fn open_all(&self, wanted: Vec<(TopicPartition, LogConfig)>) -> io::Result<()> {
        let wanted: Vec<_> = wanted.into_iter().filter(|(tp, _)| self.get(tp).is_none()).collect();
        let chunk = wanted.len().div_ceil(RECOVERY_THREADS).max(1);
        let results: Vec<io::Result<Vec<(TopicPartition, Partition)>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = wanted
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter()
                            .map(|(tp, config)| Ok((tp.clone(), self.open_partition(tp, config.clone())?)))
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("recovery thread panicked")).collect()
        });
        let mut partitions = self.partitions.write();
        for result in results {
            for (tp, partition) in result? {
                self.insert(&mut partitions, tp, Arc::new(partition));
            }
        }
        Ok(())
    }

    /// Creates (or opens) one partition.
    pub fn open(&self, tp: &TopicPartition, config: LogConfig) -> io::Result<Arc<Partition>> {
        if let Some(existing) = self.get(tp) {
            return Ok(existing);
        }
        let partition = Arc::new(self.open_partition(tp, config)?);
        self.insert(&mut self.partitions.write(), tp.clone(), partition.clone());
        Ok(partition)
    }

    /// Forgets a partition and deletes its directory.
    pub fn delete(&self, tp: &TopicPartition) -> io::Result<()> {
        self.delete_all(std::slice::from_ref(tp))
    }

    /// Forgets partitions (all at once, so no reader finds some of them gone and others
    /// not), then deletes their directories.
    pub fn delete_all(&self, tps: &[TopicPartition]) -> io::Result<()> {
        let removed: Vec<Arc<Partition>> = {
            let mut partitions = self.partitions.write();
            let mut by_topic = self.by_topic.write();
            let removed = tps.iter().filter_map(|tp| partitions.remove(tp)).collect();
            for tp in tps {
                if let Some(topic) = by_topic.get_mut(&tp.topic) {
                    if let Some(slot) = usize::try_from(tp.partition).ok().and_then(|i| topic.partitions.get_mut(i)) {
                        *slot = None;
                    }
                    if topic.partitions.iter().all(Option::is_none) {
                        by_topic.remove(&tp.topic);
                    }
                }
            }
            removed
        };
        // Renamed away first, durably: a directory whose removal a power cut takes back
        // would come back with its segments, and a later partition of the same name would
        // open them as its own. What is renamed is removed after (and at the next start).
        let _cleaner = self.pause_cleaner();
        let mut doomed = Vec::with_capacity(removed.len());
        for partition in removed {
            partition.retire()?;
            let target = deleted_dir_path(partition.dir());
            std::fs::rename(partition.dir(), &target)?;
            doomed.push(target);
        }
        if !doomed.is_empty() {
            crate::durable::sync_dir(&self.root)?;
        }
        // One at a time: removals in one parent directory serialize on its lock anyway.
        for dir in doomed {
            remove_deleted_dir(&dir);
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
            let is_wal = entry.file_name() == crate::wal::WAL_DIR;
            let is_deleted = entry.file_name().to_string_lossy().ends_with(DELETED_DIR_SUFFIX);
            if entry.file_type()?.is_dir() && !open.contains(&entry.file_name()) && !is_wal && !is_deleted {
                unopened.push(entry.path());
            }
        }
        Ok(unopened)
    }

    pub fn partitions(&self) -> Vec<(TopicPartition, Arc<Partition>)> {
        self.partitions.read().iter().map(|(tp, p)| (tp.clone(), p.clone())).collect()
    }

    /// Periodic upkeep: retention, flushes due in page-cache mode, the high-watermark
    /// checkpoint, idle partitions' files released to the budget of open files.
    pub fn tick(&self, now_ms: i64) {
        let checkpoint_due = now_ms - self.last_checkpoint.lock().0 >= HIGH_WATERMARK_CHECKPOINT_INTERVAL_MS;
        if checkpoint_due {
            if let Err(error) = self.checkpoint_high_watermarks(now_ms) {
                tracing::warn!(%error, "high-watermark checkpoint failed");
            }
        }
        for (tp, partition) in self.partitions() {
            let deleted = partition.apply_retention(now_ms);
            if deleted > 0 {
                tracing::info!(topic = %tp.topic, partition = tp.partition, deleted, "retention deleted segments");
            }
            if partition.flush_due(now_ms) {
                self.syncer.schedule_flush(&partition);
            }
            partition.release_file_if_idle(now_ms);
        }
    }

    /// Starts the log cleaner's thread (compacted topics; see [`crate::cleaner`]).
    pub fn start_cleaner(&self, settings: CleanerSettings) -> io::Result<()> {
        if !settings.enabled {
            return Ok(());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (partitions, lock, abort, thread_stop) =
            (self.partitions.clone(), self.cleaner_lock.clone(), self.cleaner_abort.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name("log-cleaner".into())
            .spawn(move || cleaner_loop(&partitions, &settings, &lock, &abort, &thread_stop))?;
        *self.cleaner.lock() = Some(CleanerThread { handle, stop });
        Ok(())
    }

    /// Stops a cleaning pass at its next segment and keeps the cleaner off the logs while
    /// the guard lives.
    fn pause_cleaner(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.cleaner_abort.store(true, Ordering::Relaxed);
        let guard = self.cleaner_lock.lock();
        self.cleaner_abort.store(false, Ordering::Relaxed);
        guard
    }

    /// Clean shutdown: stop the cleaner and syncing, then seal every partition and make it
    /// durable (in parallel, file by file).
    pub fn close(&self) {
        if let Some(cleaner) = self.cleaner.lock().take() {
            cleaner.stop.store(true, Ordering::Relaxed);
            self.cleaner_abort.store(true, Ordering::Relaxed);
            if cleaner.handle.join().is_err() {
                tracing::error!("log cleaner thread panicked");
            }
        }
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
        if let Err(error) = self.checkpoint_high_watermarks(i64::MAX) {
            tracing::error!(%error, "final high-watermark checkpoint failed");
        }
    }
}

/// The last checkpointed high watermarks; empty when there is none or it is unreadable (then
/// replicated partitions restart from their log start and learn the rest from the leader).
fn read_high_watermark_checkpoint(root: &Path) -> BTreeMap<String, i64> {
    let path = root.join(HIGH_WATERMARK_CHECKPOINT_FILE);
    let Ok(body) = std::fs::read(&path) else { return BTreeMap::new() };
    match serde_json::from_slice::<HighWatermarkCheckpoint>(&body) {
        Ok(checkpoint) if checkpoint.version == 1 => checkpoint.high_watermarks,
        _ => {
            tracing::warn!(path = %path.display(), "ignoring unreadable high-watermark checkpoint");
            BTreeMap::new()
        }
    }
}

/// The cleaner thread: passes over every compacted partition that is due, then a pause of
/// `log.cleaner.backoff.ms` when none was.
fn cleaner_loop(
    partitions: &Partitions,
    settings: &CleanerSettings,
    lock: &CleanerLock,
    abort: &AtomicBool,
    stop: &AtomicBool,
) {
    let mut pacer = IoPacer::new(settings.io_max_bytes_per_second.max(1));
    let interrupted = || abort.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed);
    while !stop.load(Ordering::Relaxed) {
        let mut cleaned_any = false;
        let logs: Vec<(TopicPartition, Arc<Partition>)> =
            partitions.read().iter().map(|(tp, p)| (tp.clone(), p.clone())).collect();
        for (tp, partition) in logs {
            let _working = lock.lock();
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let started = std::time::Instant::now();
            match crate::cleaner::clean_partition(&partition, crate::now_ms(), settings, &mut pacer, &interrupted) {
                Ok(None) => {}
                Ok(Some(stats)) => {
                    cleaned_any = true;
                    tracing::info!(
                        topic = %tp.topic,
                        partition = tp.partition,
                        segments = stats.segments_rewritten,
                        segments_removed = stats.segments_removed,
                        bytes_before = stats.bytes_before,
                        bytes_after = stats.bytes_after,
                        records_removed = stats.records_removed,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "log cleaned"
                    );
                }
                Err(error) => {
                    tracing::warn!(topic = %tp.topic, partition = tp.partition, %error, "log cleaning failed")
                }
            }
        }
        if !cleaned_any {
            let mut slept = 0;
            while slept < settings.backoff_ms && !stop.load(Ordering::Relaxed) {
                let step = (settings.backoff_ms - slept).min(100);
                std::thread::sleep(Duration::from_millis(step));
                slept += step;
            }
        }
    }
}

/// Where a deleted partition's directory `dir` goes before it is removed: a sibling named
/// `<name>.<unique>-delete`.
fn deleted_dir_path(dir: &Path) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let unique = format!("{}.{}", crate::now_ms(), COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dir.with_file_name(format!("{name}.{unique}{DELETED_DIR_SUFFIX}"))
}

/// Removes what deletions renamed away and a crash kept from removing.
fn remove_deleted_dirs(root: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() && entry.file_name().to_string_lossy().ends_with(DELETED_DIR_SUFFIX) {
            tracing::info!(dir = %entry.path().display(), "removing the log of a deleted partition");
            remove_deleted_dir(&entry.path());
        }
    }
    Ok(())
}

/// Removes a directory a deletion renamed away. One that cannot be removed now is left for
/// the next start: its name keeps it from ever being opened as a partition, so it costs disk
/// space only, and refusing to start over it would cost the whole broker.
fn remove_deleted_dir(dir: &Path) {
    if let Err(error) = std::fs::remove_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), %error, "the log of a deleted partition is left for the next start");
    }
}
