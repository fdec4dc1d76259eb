//! One partition's log: segments, offsets, idempotent-producer state and the high watermark.
//!
//! The log is one [`Partition`] (its state under one lock, [`LogState`]) in named parts,
//! each an `impl Partition` block stating its own durability contract:
//! - [`append`]: the appender (client, follower and marker appends, segment rolls) and
//!   its hand-off to the syncer, which moves the locally durable end;
//! - [`read`]: the reader (batches up to a read limit, timestamp lookups, transaction state);
//! - [`retention`]: what leaves the log at its head (retention, DeleteRecords, the cleaner's hooks);
//! - [`tier`]: what the tiering layer (KIP-405, the broker's `tiered` module) copies to
//!   the object store, and the remote range it reports back;
//! - [`recovery`]: opening from disk, truncation, reset, clean shutdown, and the files
//!   beside the segments (producer snapshots, leader epochs, aborted transactions);
//! - this module: the shared types, the offsets and their publication to readers, waiting
//!   producers and replication, and the invariants checked on every publish.
//!
//! Durability contract: [`Partition::append`] returns once the batch is in the page cache
//! and tells the caller which offset must become visible before the produce may be
//! answered. Under the default config (`flush.messages` = 1) the high watermark moves only
//! when the [`crate::Syncer`] has fsynced the data; in page-cache mode it moves at once and
//! the data is flushed by count (`flush.messages`) or age (`flush.ms`).
//! Readers never see bytes past the high watermark.
//!
//! Replication: a replicated partition's high watermark is moved by the replication layer
//! ([`Partition::set_replicated`], [`Partition::advance_high_watermark`]) instead of by
//! fsyncs; the log then reports its own progress (end offset, locally durable end) on a
//! separate channel ([`Partition::progress`]). Followers append the leader's batches as
//! they are ([`Partition::append_replica`]) and cut a divergent tail with
//! [`Partition::truncate_to`], guided by the leader-epoch cache ([`Partition::epoch_end_offset`]).

mod append;
pub(crate) use self::append::CheckpointSync;
mod read;
mod recovery;
mod retention;
mod tier;
pub(crate) mod wal_link;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use self::wal_link::WalLink;
use crate::batch::BatchError;
use crate::producer_state::ProducerStateTable;
use crate::segment::Segment;

pub use self::read::{joined, read_file_range, FileRange, FILE_RANGE_BYTES_MIN};
pub(crate) use self::retention::{CleanableSegment, CleaningPlan, Installed};
pub use self::tier::SealedSegment;

const LOG_START_OFFSET_FILE: &str = "log-start-offset";
/// The aborted transactions still in the log (JSON; written before their abort marker).
const ABORTED_TRANSACTIONS_FILE: &str = "aborted-transactions";
/// Where the cleaner has cleaned up to (a segment base offset): segments below it are clean.
const CLEANER_CHECKPOINT_FILE: &str = "cleaner-offset";
/// The cleaner builds cleaned segments here before moving them over the originals;
/// whatever a crash left in it is deleted when the log opens.
pub(crate) const CLEANING_DIR: &str = "cleaning";
/// The leader-epoch cache: which epoch started at which offset (JSON, fsynced on change).
const LEADER_EPOCHS_FILE: &str = "leader-epochs";
/// Leader epochs remembered per partition (the oldest are dropped).
const LEADER_EPOCHS_MAX: usize = 1024;
const SNAPSHOT_SUFFIX: &str = ".snapshot";
/// Producer snapshots kept per partition (older ones are deleted).
const SNAPSHOTS_KEPT: usize = 2;
/// A WAL checkpoint writes a recovery image of the active segment (its index and the
/// producer state, see [`Partition::sync_for_wal_checkpoint`]) once the segment has grown
/// by this much, and by a sixteenth of what the last image covered, since that image: a
/// restart after a crash scans only what came after it, at a cost per image that stays a
/// small fraction of the bytes written.
const RECOVERY_IMAGE_GROWTH_BYTES_MIN: u64 = 128 * 1024;
/// ... and at most once in this interval per partition. A checkpoint comes with every full
/// WAL file (five a second at a 300 MB/s ingest); an image each time for every busy
/// partition, each a new index file and a new producer snapshot (new inodes, renames,
/// fsyncs), took a tenth of the broker's CPU while 100 new segments grew at 250 MB/s, most
/// of it ext4 looking for free inodes among the ones just deleted. A restart after a crash
/// scans at most this long's appends of a partition past its image.
const RECOVERY_IMAGE_INTERVAL_MS: i64 = 2_000;
/// A partition without appends for this long lets the budget of open files close its active
/// segment's file ([`Partition::release_file_if_idle`]).
pub const ACTIVE_SEGMENT_IDLE_MS: i64 = 60_000;
/// An active segment without appends for this long lets go of its tail's memory
/// (`segment_tail.rs`): a tailing reader has read it by then.
pub const TAIL_IDLE_MS: i64 = 10_000;

/// The per-topic settings storage acts on, in Kafka's names and units.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// `segment.bytes`
    pub segment_bytes: u64,
    /// `segment.ms`
    pub segment_ms: i64,
    /// `retention.ms`, negative = forever
    pub retention_ms: i64,
    /// `retention.bytes`, negative = unlimited
    pub retention_bytes: i64,
    /// `max.message.bytes`: the largest batch accepted
    pub max_message_bytes: usize,
    /// `flush.messages`: 1 = fsync before acknowledging (the default); N > 1 = page-cache
    /// mode, flushed after N messages
    pub flush_messages: u64,
    /// `flush.ms`: in page-cache mode, flush data older than this
    pub flush_ms: i64,
    /// `message.timestamp.before.max.ms`: how far in the past a batch's first timestamp may be
    pub timestamp_before_max_ms: i64,
    /// `message.timestamp.after.max.ms`: how far in the future a batch's max timestamp may be
    /// (retention goes by it: a far-future timestamp would pin its segment)
    pub timestamp_after_max_ms: i64,
    /// `message.timestamp.type=LogAppendTime`: the broker stamps each batch with its append
    /// time (and the timestamp bounds above do not apply)
    pub log_append_time: bool,
    /// `cleanup.policy` holds `delete`: `retention.ms` and `retention.bytes` apply
    pub cleanup_delete: bool,
    /// `cleanup.policy` holds `compact`: the cleaner keeps the latest record per key
    /// (see [`crate::cleaner`]) and records must have keys
    pub cleanup_compact: bool,
    /// `delete.retention.ms`: how long a tombstone outlives its first cleaning
    pub delete_retention_ms: i64,
    /// `min.cleanable.dirty.ratio`: the share of not-yet-cleaned bytes that starts a cleaning
    pub min_cleanable_dirty_ratio: f64,
    /// `min.compaction.lag.ms`: records younger than this are never cleaned
    pub min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms`: a record older than this is cleaned whatever the dirty ratio
    pub max_compaction_lag_ms: i64,
    /// `remote.storage.enable`: sealed segments are copied to the object store (KIP-405,
    /// see the broker's `tiered` module) and leave the local disk only once copied, by
    /// `local_retention_ms` / `local_retention_bytes`; `retention_ms` / `retention_bytes`
    /// then bound the whole log, remote part included, and are applied by the tiering layer.
    pub remote_storage: bool,
    /// `local.retention.ms` (resolved: -2 in Kafka's config means `retention.ms`)
    pub local_retention_ms: i64,
    /// `local.retention.bytes` (resolved: -2 means `retention.bytes`)
    pub local_retention_bytes: i64,
}

/// Kafka's default `delete.retention.ms`: one day.
pub const DELETE_RETENTION_MS_DEFAULT: i64 = 86_400_000;
/// Kafka's default `min.cleanable.dirty.ratio`.
pub const MIN_CLEANABLE_DIRTY_RATIO_DEFAULT: f64 = 0.5;

/// Kafka 4's default `message.timestamp.after.max.ms`: one hour.
pub const TIMESTAMP_AFTER_MAX_MS_DEFAULT: i64 = 3_600_000;

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            max_message_bytes: 1_048_588,
            flush_messages: 1,
            flush_ms: i64::MAX,
            timestamp_before_max_ms: i64::MAX,
            timestamp_after_max_ms: TIMESTAMP_AFTER_MAX_MS_DEFAULT,
            log_append_time: false,
            cleanup_delete: true,
            cleanup_compact: false,
            delete_retention_ms: DELETE_RETENTION_MS_DEFAULT,
            min_cleanable_dirty_ratio: MIN_CLEANABLE_DIRTY_RATIO_DEFAULT,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            remote_storage: false,
            local_retention_ms: 7 * 24 * 3600 * 1000,
            local_retention_bytes: -1,
        }
    }
}

impl LogConfig {
    /// True when a write may be acknowledged only after fsync.
    pub fn fsync_before_ack(&self) -> bool {
        self.flush_messages <= 1
    }
}

/// What readers and waiting producers observe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Visible {
    pub high_watermark: i64,
    /// The log hit an I/O error it cannot recover from without a restart.
    pub failed: bool,
}

/// What the replication layer observes: the log's own progress, which for a replicated
/// partition runs ahead of the high watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub log_end_offset: i64,
    /// The end of what this node holds at the topic's local durability: fsynced data, or
    /// everything appended when the topic acknowledges from the page cache.
    pub local_end: i64,
}

/// A follower's append of batches fetched from the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAppend {
    pub log_end_offset: i64,
    /// The caller must ask the syncer for an fsync before reporting the data as durable.
    pub needs_sync: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogOffsets {
    /// The first offset a consumer can read: in the remote tier when the topic is tiered
    /// and its oldest segments left the local disk (see [`Partition::set_remote_tier`]).
    pub log_start_offset: i64,
    /// The first offset on the local disk (Kafka's local log start offset): a follower
    /// copies from here, and reads below it go to the remote tier.
    pub local_log_start_offset: i64,
    pub high_watermark: i64,
    pub log_end_offset: i64,
    /// Where `read_committed` consumers stop: the first offset of the oldest open
    /// transaction, or the high watermark.
    pub last_stable_offset: i64,
}

/// A transaction that was aborted in this partition: its records from `first_offset` by
/// `producer_id` are to be skipped by `read_committed` consumers; its abort marker is at
/// `last_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortedTransaction {
    pub producer_id: i64,
    pub first_offset: i64,
    pub last_offset: i64,
}

/// How far a read may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadLimit {
    /// The high watermark: what `read_uncommitted` consumers see.
    HighWatermark,
    /// The last stable offset: what `read_committed` consumers see.
    LastStable,
    /// The log end: what a follower copies.
    LogEnd,
}

/// A successful append (or a recognised duplicate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendOutcome {
    pub base_offset: i64,
    pub log_start_offset: i64,
    /// The produce may be answered once the high watermark reaches this offset.
    pub visible_at: i64,
    /// The caller must ask the syncer for an fsync.
    pub needs_sync: bool,
    pub duplicate: bool,
    /// The append time stamped on the batch, on a LogAppendTime topic (Kafka's
    /// `log_append_time_ms` in the produce answer).
    pub log_append_time_ms: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("corrupt batch: {0}")]
    Corrupt(#[from] BatchError),
    #[error("batch of {size} bytes exceeds max.message.bytes {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("invalid record: {0}")]
    InvalidRecord(&'static str),
    /// Records without a key, by index in the batch, sent to a compacted topic.
    #[error("compacted topic cannot accept a record without a key")]
    KeylessRecords(Vec<i32>),
    #[error("out of order sequence number")]
    OutOfOrderSequence,
    #[error("stale producer epoch")]
    StaleProducerEpoch,
    /// A record's timestamp is outside `[earliest_ms, latest_ms]` (the topic's
    /// `message.timestamp.before/after.max.ms` around the broker's clock).
    #[error("timestamp {timestamp} is out of range for this topic: must be within [{earliest_ms}, {latest_ms}]")]
    InvalidTimestamp { timestamp: i64, earliest_ms: i64, latest_ms: i64 },
    #[error("storage error: {0}")]
    Storage(#[from] io::Error),
    #[error("partition log is offline after an I/O error")]
    Offline,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("offset {offset} out of range [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange { offset: i64, log_start_offset: i64, log_end_offset: i64 },
    #[error("storage error: {0}")]
    Storage(#[from] io::Error),
    #[error("partition log is offline after an I/O error")]
    Offline,
    /// A [`ReadMode::CachedOnly`](crate::ReadMode::CachedOnly) read of data that is not in the page cache.
    #[error("the data is not in the page cache")]
    WouldBlock,
    /// The offset left the local disk and lives in the remote tier only (read it there).
    #[error("offset {offset} is in the remote tier, below the local log start {local_log_start_offset}")]
    InRemoteTier { offset: i64, local_log_start_offset: i64 },
}

struct LogState {
    config: LogConfig,
    segments: BTreeMap<i64, Segment>,
    log_start_offset: i64,
    log_end_offset: i64,
    high_watermark: i64,
    /// Appended and locally durable per the topic's config (see [`Progress::local_end`]).
    local_end: i64,
    /// The high watermark is moved by the replication layer, not by local durability.
    replicated: bool,
    /// Where the high watermark starts when replication first takes the partition over
    /// after it was opened: the checkpointed one (`LogManager`), as the recovered log may
    /// hold records that were never committed. `None` once applied.
    recovered_high_watermark: Option<i64>,
    /// (leader epoch, first offset written in it), ascending in both.
    epochs: Vec<(i32, i64)>,
    /// `epochs` holds entries the leader-epochs file lacks (noted by appends, or found by
    /// the scan at open); see [`recovery::write_leader_epochs_if_unwritten`].
    epochs_unwritten: bool,
    producers: ProducerStateTable,
    /// Aborted transactions whose abort marker is still in the log, by marker offset.
    aborted: Vec<AbortedTransaction>,
    /// Segments below this offset have been cleaned (compacted topics).
    cleaned_up_to: i64,
    /// When a tombstone the cleaner kept may go (its next pass is due then).
    tombstones_due_ms: Option<i64>,
    unflushed_messages: u64,
    oldest_unflushed_ms: Option<i64>,
    failed: bool,
    /// Batches appended under fsync-per-write and not yet handed to the syncer: what the
    /// next WAL record of this partition holds (see [`crate::wal`]).
    wal_pending: append::PendingBatches,
    /// Bumped when the log is cut or reset: a sync captured before then covers nothing now.
    sync_generation: u64,
    /// A roll whose disk work is not done yet (see [`Partition::complete_roll`]): the
    /// segments from its sealing one on are not sealed, and the last has no file yet.
    roll: Option<append::PendingRoll>,
    /// Deleted: nothing more is appended or logged.
    retired: bool,
    /// (base offset, bytes covered) of the last recovery image written for the active
    /// segment (see `recovery.rs`, [`RECOVERY_IMAGE_GROWTH_BYTES_MIN`]).
    recovery_image: (i64, u64),
    /// When the last recovery image was written (ms; [`RECOVERY_IMAGE_INTERVAL_MS`]).
    recovery_image_ms: i64,
    /// The offsets `[start, end)` held in the remote tier, as the tiering layer committed
    /// them (`None` when nothing is): local segments below `end` may be deleted by local
    /// retention, and reads below the local log start but at or above `start` go there.
    remote_tier: Option<(i64, i64)>,
}

/// A partition's log. Shared between request handlers and the syncer as `Arc<Partition>`.
pub struct Partition {
    dir: PathBuf,
    state: Mutex<LogState>,
    visible: watch::Sender<Visible>,
    progress: watch::Sender<Progress>,
    /// Queued for the WAL thread (or, without a WAL, for a per-file fsync).
    pub(crate) sync_queued: AtomicBool,
    /// Queued for a per-file fsync (a page-cache topic's flush).
    pub(crate) flush_queued: AtomicBool,
    /// Set once the partition first logs into the WAL.
    wal: OnceLock<WalLink>,
    /// The offsets as last published, readable without the lock (see [`Partition::published_offsets`]).
    published: PublishedOffsets,
    /// Notified whenever this partition publishes, shared by its topic's partitions: a fetch
    /// over many partitions waits on its topics' signals, not on each partition.
    signal: OnceLock<Arc<tokio::sync::Notify>>,
    /// `config.cleanup_compact`, readable without the lock (the append path checks it
    /// before taking the lock); written with the config under the lock.
    compacted: AtomicBool,
    /// Where fsync failures are counted (`LogManager::fsync_failures`), when set.
    failures: OnceLock<Arc<watch::Sender<u64>>>,
    /// Held while a roll's disk work runs ([`Partition::complete_roll`]), one at a time;
    /// taken before the state's lock, never under it.
    roll_lock: Mutex<()>,
    /// Held while the log's head changes on disk without the state's lock (DeleteRecords'
    /// log-start file, the unlinks of segments retention or DeleteRecords let go) and while
    /// a cut or a reset reloads the log from its directory, which must not find a segment
    /// being deleted; one at a time, taken before the state's lock, never under it.
    head_lock: Mutex<()>,
    /// The producer snapshot files in `dir` (see `recovery.rs::SnapshotFiles`).
    snapshots: recovery::SnapshotFiles,
}

/// [`LogOffsets`] and the offline flag as of the last publish.
#[derive(Default)]
struct PublishedOffsets {
    log_start_offset: AtomicI64,
    local_log_start_offset: AtomicI64,
    high_watermark: AtomicI64,
    log_end_offset: AtomicI64,
    last_stable_offset: AtomicI64,
    failed: AtomicBool,
}

impl Partition {
    /// Takes the log offline if `error` is a failed fsync (see [`Partition::fail`]); other
    /// errors (a full disk) leave it to be retried. Returns the error.
    fn fail_if_fsync(&self, state: &mut LogState, error: io::Error) -> io::Error {
        if crate::durable::is_fsync_failure(&error) {
            self.fail(state, "fsync while rolling a segment", &error);
            self.publish(state);
        }
        error
    }

    /// Counts this log's fsync failures in `counter` from now on.
    pub(crate) fn count_failures_in(&self, counter: Arc<watch::Sender<u64>>) {
        let _ = self.failures.set(counter);
    }

    /// After a failed fsync the page cache may have dropped the data, and a retried fsync
    /// may report success without writing it: nothing unsynced can be trusted, so the log
    /// goes offline until a restart recovers what is on disk. The caller publishes.
    fn fail(&self, state: &mut LogState, what: &str, error: &io::Error) {
        tracing::error!(dir = %self.dir.display(), %error, "{what} failed; partition offline");
        state.failed = true;
        self.published.failed.store(true, Ordering::Release);
        if let Some(counter) = self.failures.get() {
            counter.send_modify(|failures| *failures += 1);
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> LogConfig {
        self.state.lock().config.clone()
    }

    /// After [`ACTIVE_SEGMENT_IDLE_MS`] without appends, puts the active segment's file
    /// under the budget of open files like a sealed one's, so idle partitions hold no
    /// descriptor once the budget is full; the next write reopens and pins it.
    /// After [`TAIL_IDLE_MS`] it lets go of its tail's memory, once the tail's bytes are in
    /// the file.
    pub fn release_file_if_idle(&self, now_ms: i64) {
        let mut state = self.state.lock();
        let active = state.segments.values_mut().next_back().expect("active segment");
        let idle_ms = now_ms - active.last_write_ms();
        if idle_ms >= TAIL_IDLE_MS {
            active.release_tail();
        }
        if !active.has_unwritten() && idle_ms >= ACTIVE_SEGMENT_IDLE_MS {
            active.release_file();
        }
    }

    pub fn set_config(&self, config: LogConfig) {
        // From page-cache to fsync-per-write below needs the active segment's file.
        let mut state = match self.lock_settled() {
            Ok(state) => state,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "a roll could not finish before a config change");
                self.state.lock()
            }
        };
        self.compacted.store(config.cleanup_compact, Ordering::Release);
        if config.fsync_before_ack() && !state.config.fsync_before_ack() && state.local_end < state.log_end_offset {
            // From page-cache to fsync-per-write: what was appended before is not among the
            // batches the WAL will log, so it is made durable here, once.
            let active = state.segments.values_mut().next_back().expect("active segment").flushed_file();
            match active.and_then(|active| crate::durable::sync_data(&active)) {
                Ok(()) => state.local_end = state.log_end_offset,
                Err(error) => self.fail(&mut state, "fdatasync", &error),
            }
        }
        state.config = config;
    }

    pub fn offsets(&self) -> LogOffsets {
        let state = self.state.lock();
        LogOffsets {
            log_start_offset: first_readable_offset(&state),
            local_log_start_offset: state.log_start_offset,
            high_watermark: state.high_watermark,
            log_end_offset: state.log_end_offset,
            last_stable_offset: last_stable_offset(&state),
        }
    }

    /// True once a storage error took the log offline (until a restart).
    pub fn is_offline(&self) -> bool {
        self.state.lock().failed
    }

    /// A receiver that changes whenever the high watermark moves or the log fails.
    pub fn subscribe(&self) -> watch::Receiver<Visible> {
        self.visible.subscribe()
    }

    fn publish(&self, state: &LogState) {
        if let Some(signal) = self.publish_to_watchers(state) {
            signal.notify_waiters();
        }
    }

    /// As [`Partition::publish`], but the topic's signal (fetches waiting on the topic) is
    /// added to `signals` rather than notified: the watchers of this partition's offsets
    /// (produce acknowledgements) are woken now, the fetches when the caller is done.
    fn publish_deferring(&self, state: &LogState, signals: &mut TopicSignals) {
        if let Some(signal) = self.publish_to_watchers(state) {
            signals.add(signal);
        }
    }

    /// Publishes the offsets and wakes the watchers of this partition's own channels; the
    /// topic's signal when something changed and the fetches waiting on it are owed a wake.
    fn publish_to_watchers(&self, state: &LogState) -> Option<&Arc<tokio::sync::Notify>> {
        assert_invariants(&self.dir, state);
        self.publish_offsets(state);
        let visible = Visible { high_watermark: state.high_watermark, failed: state.failed };
        let mut changed = self.visible.send_if_modified(|current| std::mem::replace(current, visible) != visible);
        let progress = Progress { log_end_offset: state.log_end_offset, local_end: state.local_end };
        changed |= self.progress.send_if_modified(|current| std::mem::replace(current, progress) != progress);
        changed.then(|| self.signal.get()).flatten()
    }

    fn publish_offsets(&self, state: &LogState) {
        let published = &self.published;
        published.log_end_offset.store(state.log_end_offset, Ordering::Release);
        published.high_watermark.store(state.high_watermark, Ordering::Release);
        published.last_stable_offset.store(last_stable_offset(state), Ordering::Release);
        published.log_start_offset.store(first_readable_offset(state), Ordering::Release);
        published.local_log_start_offset.store(state.log_start_offset, Ordering::Release);
        published.failed.store(state.failed, Ordering::Release);
    }

    /// The offsets as last published, without the lock: what a fetch of a partition with
    /// nothing new answers. Each is exact; together they may be one publish apart.
    pub fn published_offsets(&self) -> (LogOffsets, bool) {
        let published = &self.published;
        let offsets = LogOffsets {
            log_start_offset: published.log_start_offset.load(Ordering::Acquire),
            local_log_start_offset: published.local_log_start_offset.load(Ordering::Acquire),
            high_watermark: published.high_watermark.load(Ordering::Acquire),
            log_end_offset: published.log_end_offset.load(Ordering::Acquire),
            last_stable_offset: published.last_stable_offset.load(Ordering::Acquire),
        };
        (offsets, published.failed.load(Ordering::Acquire))
    }

    /// Shares `signal` with the rest of the topic (once): it is notified on every publish.
    pub fn set_signal(&self, signal: Arc<tokio::sync::Notify>) {
        let _ = self.signal.set(signal);
    }

    /// The topic's signal, when the partition has one (see [`Partition::set_signal`]).
    pub fn signal(&self) -> Option<&Arc<tokio::sync::Notify>> {
        self.signal.get()
    }

    /// A receiver that changes whenever the log end or the locally durable end moves.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// The high watermark that replication starts from after this log was opened (the
    /// checkpointed one; the log start when none was checkpointed): a restarted replica must
    /// not expose the tail it recovered past what was committed, even once it leads.
    pub fn set_recovered_high_watermark(&self, offset: i64) {
        self.state.lock().recovered_high_watermark = Some(offset);
    }

    /// Hands the high watermark to the replication layer (`true`) or back to local
    /// durability (`false`, which moves it to the locally durable end at once).
    pub fn set_replicated(&self, replicated: bool) {
        let mut state = self.state.lock();
        if let Some(recovered) = state.recovered_high_watermark.take() {
            if replicated {
                state.high_watermark = recovered.clamp(state.log_start_offset, state.high_watermark);
            }
        }
        state.replicated = replicated;
        if !replicated && state.high_watermark < state.local_end {
            state.high_watermark = state.local_end;
        }
        self.publish(&state);
    }

    /// Moves a replicated partition's high watermark forward (never back, never past the
    /// log end; ignored when the partition is not replicated). Returns the high watermark
    /// now in force.
    pub fn advance_high_watermark(&self, offset: i64) -> i64 {
        let mut state = self.state.lock();
        let offset = offset.min(state.log_end_offset);
        if state.replicated && offset > state.high_watermark {
            state.high_watermark = offset;
            self.publish(&state);
        }
        state.high_watermark
    }

    pub fn producer_count(&self) -> usize {
        self.state.lock().producers.producer_count()
    }

    pub fn size_bytes(&self) -> u64 {
        self.state.lock().segments.values().map(|s| s.size_bytes()).sum()
    }
}

/// The offsets' order, checked whenever a change is published (after every append that
/// moves the high watermark, every fsync round, truncation and reset):
/// log start <= high watermark <= log end, and locally durable end <= log end. A partition
/// whose high watermark follows local durability has it exactly at the durable end.
/// Topic signals owed a notification, each once however many of its partitions moved.
/// A group-commit round publishes every partition it made durable first, waking their
/// produce acknowledgements, and only then the fetches waiting on those topics: the
/// acknowledgements run before the fetch responses on a busy thread, and each fetch
/// wakes once per round and finds the whole round readable.
#[derive(Default)]
pub(crate) struct TopicSignals {
    signals: Vec<Arc<tokio::sync::Notify>>,
    /// The signals' addresses, so a round over many topics adds each in O(1).
    seen: std::collections::HashSet<usize>,
}

impl TopicSignals {
    fn add(&mut self, signal: &Arc<tokio::sync::Notify>) {
        if self.seen.insert(Arc::as_ptr(signal) as usize) {
            self.signals.push(signal.clone());
        }
    }

    /// Wakes every fetch waiting on the added topics.
    pub(crate) fn notify(self) {
        for signal in self.signals {
            signal.notify_waiters();
        }
    }
}

fn assert_invariants(dir: &Path, state: &LogState) {
    assert!(
        state.log_start_offset <= state.high_watermark
            && state.high_watermark <= state.log_end_offset
            && state.local_end <= state.log_end_offset,
        "{}: log start {} <= high watermark {} <= log end {} and durable end {} <= log end",
        dir.display(),
        state.log_start_offset,
        state.high_watermark,
        state.log_end_offset,
        state.local_end,
    );
    debug_assert!(state.replicated || state.high_watermark == state.local_end, "{}: unreplicated hw", dir.display());
    assert!(
        state.remote_tier.is_none_or(|(start, end)| start <= end),
        "{}: remote tier {:?} runs backwards",
        dir.display(),
        state.remote_tier
    );
    debug_assert!(
        state.epochs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
        "{}: leader epochs not monotonic: {:?}",
        dir.display(),
        state.epochs
    );
}

/// The first offset readers can have: the remote tier's start when the tier reaches the
/// local log (a tier that ends below the local start, as after DeleteRecords moved past
/// it, holds nothing readable).
fn first_readable_offset(state: &LogState) -> i64 {
    match state.remote_tier {
        Some((start, end)) if start < state.log_start_offset && end >= state.log_start_offset => start,
        _ => state.log_start_offset,
    }
}

/// The offset `read_committed` readers stop at: the first offset of the oldest open
/// transaction, or the high watermark.
fn last_stable_offset(state: &LogState) -> i64 {
    let open = state.producers.first_open_transaction_offset().unwrap_or(i64::MAX);
    open.min(state.high_watermark).max(first_readable_offset(state))
}
