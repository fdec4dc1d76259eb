//! One partition's log: segments, offsets, idempotent-producer state and the high watermark.
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

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::batch::{self, BatchError, BatchHeader, BatchIter};
use crate::producer_state::{ProducerStateTable, SequenceCheck};
use crate::segment::{index_file_name, ReadMode, Segment, INDEX_INTERVAL_BYTES};
use crate::syncer::WalLink;
use crate::wal::Control;

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
/// A read never returns more than this, whatever the client asks for.
pub const READ_BYTES_MAX: usize = 64 * 1024 * 1024;

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
    pub log_start_offset: i64,
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
    /// A [`ReadMode::CachedOnly`] read of data that is not in the page cache.
    #[error("the data is not in the page cache")]
    WouldBlock,
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
    wal_pending: Vec<u8>,
    /// (end in `wal_pending`, offset after the batch) of each pending batch.
    wal_pending_ends: Vec<(usize, i64)>,
    /// Bumped when the log is cut or reset: a sync captured before then covers nothing now.
    sync_generation: u64,
    /// Deleted: nothing more is appended or logged.
    retired: bool,
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
}

/// [`LogOffsets`] and the offline flag as of the last publish.
#[derive(Default)]
struct PublishedOffsets {
    log_start_offset: AtomicI64,
    high_watermark: AtomicI64,
    log_end_offset: AtomicI64,
    last_stable_offset: AtomicI64,
    failed: AtomicBool,
}

/// What a cleaning pass may work on, taken under the log's lock (see [`crate::cleaner`]).
pub(crate) struct CleaningPlan {
    /// Sealed, committed segments old enough to clean, oldest first.
    pub(crate) segments: Vec<CleanableSegment>,
    /// Segments from this base offset on are dirty (never cleaned).
    pub(crate) cleaned_up_to: i64,
    pub(crate) config: LogConfig,
    /// Aborted transactions: their records are dropped, never kept as a key's latest.
    pub(crate) aborted: Vec<AbortedTransaction>,
}

pub(crate) struct CleanableSegment {
    pub(crate) base: i64,
    /// The next segment's base offset: this segment covers `[base, end)`.
    pub(crate) end: i64,
    pub(crate) file: Arc<std::fs::File>,
    pub(crate) size: u64,
}

/// What one fsync must cover and what it makes visible.
pub(crate) struct SyncTarget {
    pub(crate) file: Arc<std::fs::File>,
    pub(crate) end_offset: i64,
    pub(crate) generation: u64,
}

/// A partition's batches for its next WAL record.
pub(crate) struct WalPending {
    pub(crate) path: Arc<str>,
    pub(crate) batches: Vec<u8>,
    /// The offset after the last batch: durable once the record is.
    pub(crate) end_offset: i64,
    pub(crate) generation: u64,
}

impl Partition {
    /// Opens (recovering) or creates the partition log in `dir`.
    pub fn open(dir: &Path, config: LogConfig) -> io::Result<Partition> {
        crate::durable::create_dir_all(dir)?;
        let compacted = AtomicBool::new(config.cleanup_compact);
        let state = load_state(dir, config)?;
        let end = state.log_end_offset;
        let (visible, _) = watch::channel(Visible { high_watermark: end, failed: false });
        let (progress, _) = watch::channel(Progress { log_end_offset: end, local_end: end });
        let published = PublishedOffsets::default();
        let partition = Partition {
            dir: dir.to_path_buf(),
            state: Mutex::new(state),
            visible,
            progress,
            sync_queued: AtomicBool::new(false),
            flush_queued: AtomicBool::new(false),
            wal: OnceLock::new(),
            published,
            signal: OnceLock::new(),
            compacted,
            failures: OnceLock::new(),
        };
        partition.publish_offsets(&partition.state.lock());
        Ok(partition)
    }

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

    pub fn set_config(&self, config: LogConfig) {
        let mut state = self.state.lock();
        self.compacted.store(config.cleanup_compact, Ordering::Release);
        if config.fsync_before_ack() && !state.config.fsync_before_ack() && state.local_end < state.log_end_offset {
            // From page-cache to fsync-per-write: what was appended before is not among the
            // batches the WAL will log, so it is made durable here, once.
            let active = state.segments.values().next_back().expect("active segment").file().clone();
            match crate::durable::sync_data(&active) {
                Ok(()) => state.local_end = state.log_end_offset,
                Err(error) => self.fail(&mut state, "fdatasync", &error),
            }
        }
        state.config = config;
    }

    pub fn offsets(&self) -> LogOffsets {
        let state = self.state.lock();
        LogOffsets {
            log_start_offset: state.log_start_offset,
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

    /// Validates and appends one batch (as sent by the client) at the log end.
    pub fn append(&self, batch: &Bytes, leader_epoch: i32, now_ms: i64) -> Result<AppendOutcome, AppendError> {
        let header = batch::validate_batch(batch)?;
        // A compacted topic's records must have keys (Kafka decompresses to check too). The
        // decoding runs before the partition lock, so other appends, fetches and the fsync
        // round never wait for it. A config change in between is harmless: the cleaner
        // drops keyless records.
        if self.compacted.load(Ordering::Acquire) {
            let keyless = crate::records::keyless_records(&header, batch)
                .map_err(|_| AppendError::InvalidRecord("records do not decode"))?;
            if !keyless.is_empty() {
                return Err(AppendError::KeylessRecords(keyless));
            }
        }
        let mut state = self.state.lock();
        if state.failed || state.retired {
            return Err(AppendError::Offline);
        }
        if batch.len() > state.config.max_message_bytes {
            return Err(AppendError::TooLarge { size: batch.len(), limit: state.config.max_message_bytes });
        }
        if header.is_control() {
            return Err(AppendError::InvalidRecord("control batches are written by the broker only"));
        }
        if header.is_transactional() && !header.has_producer_id() {
            return Err(AppendError::InvalidRecord("a transactional batch needs a producer id"));
        }
        if header.record_count == 0 {
            return Err(AppendError::InvalidRecord("empty batch"));
        }
        if !state.config.log_append_time {
            check_timestamps(&header, &state.config, now_ms)?;
        }
        match state.producers.check(&header) {
            SequenceCheck::Append => {}
            SequenceCheck::Duplicate { base_offset } => {
                // The retry is answered once the whole original batch is visible, as the
                // original would have been.
                return Ok(AppendOutcome {
                    base_offset,
                    log_start_offset: state.log_start_offset,
                    visible_at: base_offset + i64::from(header.last_offset_delta) + 1,
                    needs_sync: false,
                    duplicate: true,
                    log_append_time_ms: None,
                });
            }
            SequenceCheck::OutOfOrder => return Err(AppendError::OutOfOrderSequence),
            SequenceCheck::StaleEpoch => return Err(AppendError::StaleProducerEpoch),
        }
        let base_offset = state.log_end_offset;
        let mut header = header;
        header.base_offset = base_offset;
        header.partition_leader_epoch = leader_epoch;
        let log_append_time_ms = state.config.log_append_time.then_some(now_ms);
        let fsync = match log_append_time_ms {
            None => {
                let prefix = batch::patched_prefix(batch, base_offset, leader_epoch);
                self.append_at_end(&mut state, &prefix, &batch[16..], &header, now_ms)?
            }
            Some(append_time) => {
                let stamped = batch::log_append_time_header(batch, base_offset, leader_epoch, append_time);
                let header = BatchHeader::parse(&stamped).expect("a stamped header parses");
                self.append_at_end(&mut state, &stamped, &batch[batch::BATCH_HEADER_BYTES..], &header, now_ms)?
            }
        };
        let end_offset = state.log_end_offset;
        Ok(AppendOutcome {
            base_offset,
            log_start_offset: state.log_start_offset,
            visible_at: end_offset,
            needs_sync: fsync,
            duplicate: false,
            log_append_time_ms,
        })
    }

    /// Appends batches fetched from the leader, stored byte for byte (their offsets and
    /// leader epochs are already in their headers). They must follow this log's end, with
    /// a gap where the leader's log was compacted.
    pub fn append_replica(&self, batches: &Bytes, now_ms: i64) -> Result<ReplicaAppend, AppendError> {
        let mut state = self.state.lock();
        if state.failed {
            return Err(AppendError::Offline);
        }
        let mut needs_sync = false;
        for item in BatchIter::new(batches) {
            let (_, range) = item?;
            let bytes = &batches[range];
            let header = batch::validate_stored_batch(bytes)?;
            if header.last_offset() < state.log_end_offset {
                continue;
            }
            if header.base_offset < state.log_end_offset && self.is_empty_at_start(&state) {
                // Just reset to the leader's log start, which lies inside this batch:
                // the log takes the whole batch and keeps its start offset, as Kafka does.
                self.rebase_empty(&mut state, header.base_offset)?;
            }
            // A compacted leader log has gaps: a batch may start past this log's end.
            if header.base_offset < state.log_end_offset {
                return Err(AppendError::InvalidRecord("replicated batch overlaps the log"));
            }
            // A copied abort marker is indexed as the leader indexed it, before it is
            // appended: a follower that becomes leader names it to read_committed fetches.
            if header.is_control() && header.has_producer_id() {
                let commits = crate::records::marker_commits(&header, bytes)
                    .map_err(|_| AppendError::InvalidRecord("unreadable transaction marker"))?;
                if commits == Some(false) {
                    self.record_abort(&mut state, header.producer_id, header.base_offset)?;
                }
            }
            needs_sync |= self.append_at_end(&mut state, &bytes[..16], &bytes[16..], &header, now_ms)?;
        }
        Ok(ReplicaAppend { log_end_offset: state.log_end_offset, needs_sync })
    }

    /// True when the log holds no batch at all (one empty segment).
    fn is_empty_at_start(&self, state: &LogState) -> bool {
        state.segments.len() == 1 && state.segments.values().all(|s| s.is_empty())
    }

    /// Moves an empty log's only segment back to `base` (below the log start offset, which
    /// stays): the first batch a reset follower fetches may begin before the leader's log start.
    fn rebase_empty(&self, state: &mut LogState, base: i64) -> io::Result<()> {
        assert!(self.is_empty_at_start(state) && base < state.log_end_offset);
        let segment = Segment::create(&self.dir, base)?;
        let (_, old) = state.segments.pop_first().expect("one segment");
        old.delete_files()?;
        state.segments.insert(base, segment);
        state.log_end_offset = base;
        state.local_end = state.local_end.min(base);
        state.high_watermark = state.high_watermark.min(base);
        Ok(())
    }

    /// Writes one batch whose header is final at the log end and does the bookkeeping.
    /// Returns true when the batch waits for an fsync to become locally durable.
    fn append_at_end(
        &self,
        state: &mut LogState,
        prefix: &[u8],
        rest: &[u8],
        header: &BatchHeader,
        now_ms: i64,
    ) -> Result<bool, AppendError> {
        self.roll_if_needed(state, header, now_ms)?;
        if state.epochs.last().is_none_or(|&(epoch, _)| header.partition_leader_epoch > epoch) {
            state.epochs.push((header.partition_leader_epoch, header.base_offset));
            if state.epochs.len() > LEADER_EPOCHS_MAX {
                state.epochs.remove(0);
            }
            write_leader_epochs(&self.dir, &state.epochs)?;
        }
        let segment_bytes = state.config.segment_bytes;
        let segment = state.segments.values_mut().next_back().expect("active segment");
        segment.append(prefix, rest, header, now_ms, segment_bytes)?;
        state.producers.record(header);
        assert!(header.last_offset() >= state.log_end_offset, "an append moves the log end forward");
        state.log_end_offset = header.last_offset() + 1;
        let fsync = state.config.fsync_before_ack();
        if fsync {
            state.wal_pending.extend_from_slice(prefix);
            state.wal_pending.extend_from_slice(rest);
            let (end, offset) = (state.wal_pending.len(), state.log_end_offset);
            state.wal_pending_ends.push((end, offset));
        } else {
            state.local_end = state.log_end_offset;
            if !state.replicated {
                state.high_watermark = state.local_end;
            }
            state.unflushed_messages += header.record_count as u64;
            state.oldest_unflushed_ms.get_or_insert(now_ms);
            self.publish(state);
        }
        Ok(fsync)
    }

    fn roll_if_needed(&self, state: &mut LogState, header: &BatchHeader, now_ms: i64) -> io::Result<()> {
        let config = &state.config;
        let active = state.segments.values().next_back().expect("active segment");
        let too_old = active.first_append_ms().is_some_and(|first| now_ms - first >= config.segment_ms);
        let full = active.is_full_for(header.total_bytes() as u64, header.last_offset(), config.segment_bytes);
        if !(full || (too_old && !active.is_empty())) {
            return Ok(());
        }
        let new_base = state.log_end_offset;
        // Seal (fsync) the old segment before the new file exists: recovery takes the last
        // segment's base as the least log end, so a new segment must never be durable while
        // batches before it are only in the WAL. If creating the new file fails (disk
        // full), the sealed segment stays active and takes appends again.
        let active = state.segments.values_mut().next_back().expect("active segment");
        active.seal(false).map_err(|e| self.fail_if_fsync(state, e))?;
        let segment = Segment::create(&self.dir, new_base).map_err(|e| self.fail_if_fsync(state, e))?;
        // Everything in the sealed segment is now durable.
        if state.local_end < new_base {
            state.local_end = new_base;
            if !state.replicated {
                state.high_watermark = new_base;
            }
            self.publish(state);
        }
        state.segments.insert(new_base, segment);
        write_snapshot(&self.dir, new_base, &state.producers).map_err(|e| self.fail_if_fsync(state, e))?;
        Ok(())
    }

    fn publish(&self, state: &LogState) {
        assert_invariants(&self.dir, state);
        self.publish_offsets(state);
        let visible = Visible { high_watermark: state.high_watermark, failed: state.failed };
        let mut changed = self.visible.send_if_modified(|current| std::mem::replace(current, visible) != visible);
        let progress = Progress { log_end_offset: state.log_end_offset, local_end: state.local_end };
        changed |= self.progress.send_if_modified(|current| std::mem::replace(current, progress) != progress);
        if changed {
            if let Some(signal) = self.signal.get() {
                signal.notify_waiters();
            }
        }
    }

    fn publish_offsets(&self, state: &LogState) {
        let published = &self.published;
        published.log_end_offset.store(state.log_end_offset, Ordering::Release);
        published.high_watermark.store(state.high_watermark, Ordering::Release);
        published.last_stable_offset.store(last_stable_offset(state), Ordering::Release);
        published.log_start_offset.store(state.log_start_offset, Ordering::Release);
        published.failed.store(state.failed, Ordering::Release);
    }

    /// The offsets as last published, without the lock: what a fetch of a partition with
    /// nothing new answers. Each is exact; together they may be one publish apart.
    pub fn published_offsets(&self) -> (LogOffsets, bool) {
        let published = &self.published;
        let offsets = LogOffsets {
            log_start_offset: published.log_start_offset.load(Ordering::Acquire),
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

    /// Captures what an fsync issued now would make durable. Called by the syncer.
    pub(crate) fn sync_target(&self) -> SyncTarget {
        let mut state = self.state.lock();
        // The file's fsync covers whatever waited for a WAL record too.
        state.wal_pending.clear();
        state.wal_pending_ends.clear();
        let active = state.segments.values().next_back().expect("active segment");
        SyncTarget { file: active.file().clone(), end_offset: state.log_end_offset, generation: state.sync_generation }
    }

    /// Hands the batches appended since the last call to the WAL thread (`None` when there
    /// are none, or the partition is offline or deleted).
    pub(crate) fn take_wal_pending(&self) -> Option<WalPending> {
        let mut state = self.state.lock();
        let &(_, end_offset) = state.wal_pending_ends.last()?;
        state.wal_pending_ends.clear();
        let batches = std::mem::take(&mut state.wal_pending);
        if state.failed || state.retired {
            return None;
        }
        let path = self.wal.get().expect("a partition is linked to the WAL before it is queued").path.clone();
        Some(WalPending { path, batches, end_offset, generation: state.sync_generation })
    }

    /// Links the partition to the WAL it logs into (once).
    pub(crate) fn link_wal(&self, link: impl FnOnce() -> WalLink) {
        self.wal.get_or_init(link);
    }

    /// The WAL checkpoint: makes the segment files durable (everything the WAL held for
    /// this partition up to now). False when the fsync failed, which takes the log offline.
    pub(crate) fn sync_for_wal_checkpoint(&self) -> bool {
        let active = {
            let state = self.state.lock();
            if state.failed || state.retired {
                return !state.failed;
            }
            state.segments.values().next_back().expect("active segment").file().clone()
        };
        match crate::durable::sync_data(&active) {
            Ok(()) => true,
            Err(error) => {
                let mut state = self.state.lock();
                self.fail(&mut state, "fdatasync (WAL checkpoint)", &error);
                self.publish(&state);
                false
            }
        }
    }

    /// Deleted: refuses appends and logs nothing more, then logs [`Control::Forget`] so the
    /// WAL never replays this partition's records into a later one of the same name.
    pub(crate) fn retire(&self) -> io::Result<()> {
        {
            let mut state = self.state.lock();
            state.retired = true;
            state.wal_pending.clear();
            state.wal_pending_ends.clear();
            state.sync_generation += 1;
        }
        match self.wal.get() {
            Some(link) => link.log(Control::Forget),
            None => Ok(()),
        }
    }

    /// Advances the high watermark after an fsync (of the segment, or of the WAL record)
    /// covering everything up to `end_offset` finished with `result`. Called by the syncer.
    /// A sync captured before the log was cut (`generation`) moves nothing.
    pub(crate) fn finish_sync(&self, end_offset: i64, generation: u64, result: &io::Result<()>) {
        let mut state = self.state.lock();
        match result {
            Ok(()) if generation != state.sync_generation => return,
            Ok(()) => {
                assert!(end_offset <= state.log_end_offset, "a sync covers only appended batches");
                if end_offset > state.local_end {
                    state.local_end = end_offset;
                    if !state.replicated {
                        state.high_watermark = end_offset;
                    }
                }
                if end_offset >= state.log_end_offset {
                    state.unflushed_messages = 0;
                    state.oldest_unflushed_ms = None;
                }
            }
            Err(error) => self.fail(&mut state, "fdatasync", error),
        }
        self.publish(&state);
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

    /// The latest leader epoch written to this log, if any.
    pub fn latest_epoch(&self) -> Option<i32> {
        self.state.lock().epochs.last().map(|&(epoch, _)| epoch)
    }

    /// The leader epoch of the batch holding `offset` (the latest epoch starting at or
    /// before it), if the log knows one.
    pub fn epoch_at(&self, offset: i64) -> Option<i32> {
        let state = self.state.lock();
        let index = state.epochs.partition_point(|&(_, start)| start <= offset);
        index.checked_sub(1).map(|i| state.epochs[i].0)
    }

    /// Kafka's OffsetForLeaderEpoch: the largest epoch <= `epoch` this log knows and the
    /// offset where it ended (the start of the next epoch, or the log end). `None` when
    /// the log knows no epoch that old.
    pub fn epoch_end_offset(&self, epoch: i32) -> Option<(i32, i64)> {
        let state = self.state.lock();
        let index = state.epochs.partition_point(|&(e, _)| e <= epoch);
        if index == 0 {
            return None;
        }
        let found = state.epochs[index - 1].0;
        let end = state.epochs.get(index).map_or(state.log_end_offset, |&(_, start)| start);
        Some((found, end))
    }

    /// Cuts the log so that it ends at or before `offset` (at a batch boundary): a
    /// follower dropping the tail it does not share with its new leader. The high
    /// watermark never moves back past what replication committed, except onto the cut.
    pub fn truncate_to(&self, offset: i64) -> io::Result<()> {
        let cut = self.truncate_locked(offset)?;
        // Logged after the cut, before anything is appended past it: a crash in between
        // replays the old tail, which the leader has the follower cut again.
        let (Some(offset), Some(link)) = (cut, self.wal.get()) else { return Ok(()) };
        link.log(Control::Truncate(offset)).inspect_err(|error| {
            // Without the record a replay could put the old tail back under new batches:
            // nothing more is appended until a restart (which replays and cuts again).
            let mut state = self.state.lock();
            self.fail(&mut state, "logging a truncation in the WAL", error);
            self.publish(&state);
        })
    }

    /// [`Partition::truncate_to`] under the lock; returns where the log now ends when it cut.
    fn truncate_locked(&self, offset: i64) -> io::Result<Option<i64>> {
        let mut state = self.state.lock();
        if offset >= state.log_end_offset {
            return Ok(None);
        }
        let offset = offset.max(state.log_start_offset);
        let bases: Vec<i64> = state.segments.keys().copied().collect();
        let first_base = bases[0];
        for base in bases.into_iter().rev() {
            let segment = &state.segments[&base];
            if base >= offset && base > first_base {
                segment.delete_files()?;
                state.segments.remove(&base);
                continue;
            }
            // The segment holding the cut: keep its batches before `offset`.
            let mut cut = 0;
            segment.scan_from(segment.position_at_or_before(offset.max(base)), &mut |header, position| {
                if header.last_offset() >= offset {
                    cut = position;
                    return false;
                }
                cut = position + header.total_bytes() as u64;
                true
            })?;
            segment.file().set_len(cut)?;
            crate::durable::sync_all(segment.file())?;
            let _ = std::fs::remove_file(self.dir.join(index_file_name(base)));
            break;
        }
        for snapshot in list_snapshots(&self.dir) {
            if snapshot > offset {
                let _ = std::fs::remove_file(self.dir.join(snapshot_file_name(snapshot)));
            }
        }
        let config = state.config.clone();
        let replicated = state.replicated;
        let high_watermark = state.high_watermark;
        state.segments.clear();
        let mut reloaded = load_state(&self.dir, config)?;
        reloaded.replicated = replicated;
        // The reload fsynced what is left: unreplicated, all of it is visible (WAL replay
        // cuts such logs); replicated, never more than replication had committed.
        reloaded.high_watermark =
            if replicated { high_watermark.min(reloaded.log_end_offset) } else { reloaded.local_end };
        // The reload fsynced what is left, so no batch waits for a WAL record any more,
        // and a sync captured before the cut moves nothing.
        reloaded.sync_generation = state.sync_generation + 1;
        if reloaded.epochs.len() != state.epochs.len() {
            write_leader_epochs(&self.dir, &reloaded.epochs)?;
        }
        *state = reloaded;
        tracing::info!(dir = %self.dir.display(), log_end_offset = state.log_end_offset, "truncated log");
        self.publish(&state);
        Ok(Some(state.log_end_offset))
    }

    /// Drops the whole log and starts it empty at `offset`: a follower whose log ends
    /// before its leader's log start offset (a new replica of a partition whose head was
    /// deleted by retention or DeleteRecords) cannot fetch what it lacks, so it restarts
    /// where the leader's log starts, as Kafka's follower does on OFFSET_OUT_OF_RANGE.
    pub fn reset_to(&self, offset: i64) -> io::Result<()> {
        assert!(offset >= 0, "a log cannot start at a negative offset");
        let mut state = self.state.lock();
        assert!(offset > state.log_end_offset, "reset_to only moves a log forward past its end");
        // The start offset is written first: a crash part way leaves either the old log
        // (fetched from and reset again) or an empty one that recovery opens at `offset`.
        crate::write_file_atomically(&self.dir.join(LOG_START_OFFSET_FILE), offset.to_string().as_bytes())?;
        for segment in state.segments.values() {
            segment.delete_files()?;
        }
        state.segments.clear();
        for snapshot in list_snapshots(&self.dir) {
            let _ = std::fs::remove_file(self.dir.join(snapshot_file_name(snapshot)));
        }
        write_leader_epochs(&self.dir, &[])?;
        let config = state.config.clone();
        let replicated = state.replicated;
        let mut reloaded = load_state(&self.dir, config)?;
        assert_eq!(reloaded.log_end_offset, offset);
        reloaded.replicated = replicated;
        // Pending batches lie below `offset`: replay skips them, nothing to log.
        reloaded.sync_generation = state.sync_generation + 1;
        *state = reloaded;
        tracing::info!(dir = %self.dir.display(), offset, "log reset to the leader's log start");
        self.publish(&state);
        Ok(())
    }

    /// In page-cache mode, true when `flush.messages` or `flush.ms` asks for an fsync now.
    pub fn flush_due(&self, now_ms: i64) -> bool {
        let state = self.state.lock();
        if state.config.fsync_before_ack() || state.unflushed_messages == 0 {
            return false;
        }
        state.unflushed_messages >= state.config.flush_messages
            || state.oldest_unflushed_ms.is_some_and(|t| now_ms - t >= state.config.flush_ms)
    }

    /// Reads whole batches starting with the one containing `offset`, up to `max_bytes`
    /// (at least one batch when `min_one_batch`) and never past the high watermark. With
    /// [`ReadMode::CachedOnly`], data not in the page cache is [`ReadError::WouldBlock`].
    pub fn read(&self, offset: i64, max_bytes: usize, min_one_batch: bool, mode: ReadMode) -> Result<Bytes, ReadError> {
        self.read_until(offset, max_bytes, min_one_batch, ReadLimit::HighWatermark, mode)
    }

    /// Like [`Partition::read`] but up to the log end: what a follower fetches.
    pub fn read_for_replica(&self, offset: i64, max_bytes: usize, mode: ReadMode) -> Result<Bytes, ReadError> {
        self.read_until(offset, max_bytes, true, ReadLimit::LogEnd, mode)
    }

    /// Reads whole batches from `offset` up to `limit` (see [`Partition::read`]).
    pub fn read_until(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one_batch: bool,
        limit: ReadLimit,
        mode: ReadMode,
    ) -> Result<Bytes, ReadError> {
        let max_bytes = max_bytes.min(READ_BYTES_MAX);
        let mut offset = offset;
        loop {
            let (batches, next_segment) = self.read_segment(offset, max_bytes, min_one_batch, limit, mode)?;
            match next_segment {
                // Nothing at or after `offset` in its segment (compaction left a gap at
                // its end): continue in the next one, as a consumer expects.
                Some(next) => offset = next,
                None => return Ok(batches),
            }
        }
    }

    /// One segment's part of [`Partition::read_until`]: the batches, and the next
    /// segment's base offset when that is still below the read limit.
    fn read_segment(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one_batch: bool,
        limit: ReadLimit,
        mode: ReadMode,
    ) -> Result<(Bytes, Option<i64>), ReadError> {
        let located = {
            let state = self.state.lock();
            if state.failed {
                return Err(ReadError::Offline);
            }
            if offset < state.log_start_offset || offset > state.log_end_offset {
                return Err(ReadError::OffsetOutOfRange {
                    offset,
                    log_start_offset: state.log_start_offset,
                    log_end_offset: state.log_end_offset,
                });
            }
            let limit = match limit {
                ReadLimit::HighWatermark => state.high_watermark,
                ReadLimit::LastStable => last_stable_offset(&state),
                ReadLimit::LogEnd => state.log_end_offset,
            };
            if offset >= limit {
                return Ok((Bytes::new(), None));
            }
            let (_, segment) = state.segments.range(..=offset).next_back().expect("offset is inside the log");
            // Past the segment's last batch but before the next segment: a compaction gap.
            let past_last_batch = segment.next_offset() <= offset;
            let next = state.segments.range(offset + 1..).next().map(|(&base, _)| base);
            if let Some(next) = next.filter(|&next| past_last_batch && next < limit) {
                return Ok((Bytes::new(), Some(next)));
            }
            (segment.file().clone(), segment.position_at_or_before(offset), segment.size_bytes(), limit)
        };
        let (file, start, end, limit) = located;
        let batches =
            read_batches(&file, start, end, offset..limit, max_bytes, min_one_batch, mode).map_err(|error| {
                if error.kind() == io::ErrorKind::WouldBlock {
                    ReadError::WouldBlock
                } else {
                    ReadError::Storage(error)
                }
            })?;
        Ok((batches, None))
    }

    /// The first batch whose max timestamp is >= `timestamp`, for ListOffsets.
    pub fn batch_for_timestamp(&self, timestamp: i64) -> Result<Option<Bytes>, ReadError> {
        let located = {
            let state = self.state.lock();
            let mut found = None;
            for segment in state.segments.values() {
                if segment.max_timestamp() < timestamp || segment.next_offset() <= state.log_start_offset {
                    continue;
                }
                let mut hit = None;
                let start = segment.position_for_timestamp(timestamp);
                let high_watermark = state.high_watermark;
                segment.scan_from(start, &mut |header, position| {
                    if header.base_offset >= high_watermark {
                        return false;
                    }
                    if header.max_timestamp >= timestamp && header.last_offset() >= state.log_start_offset {
                        hit = Some((position, header.total_bytes()));
                        return false;
                    }
                    true
                })?;
                if let Some((position, length)) = hit {
                    found = Some((segment.file().clone(), position, length));
                    break;
                }
            }
            found
        };
        match located {
            None => Ok(None),
            Some((file, position, length)) => Ok(Some(Segment::read_at(&file, position, length, ReadMode::MayBlock)?)),
        }
    }

    /// The batch holding the largest timestamp in the log (ListOffsets MAX_TIMESTAMP).
    pub fn batch_with_max_timestamp(&self) -> Result<Option<Bytes>, ReadError> {
        let offset = {
            let state = self.state.lock();
            let best = state
                .segments
                .values()
                .filter(|s| !s.is_empty() && s.offset_of_max_timestamp() >= state.log_start_offset)
                .max_by_key(|s| s.max_timestamp());
            match best {
                Some(segment) if segment.offset_of_max_timestamp() < state.high_watermark => {
                    segment.offset_of_max_timestamp()
                }
                _ => return Ok(None),
            }
        };
        let batches = self.read(offset, 1, true, ReadMode::MayBlock)?;
        let Some(Ok((header, range))) = BatchIter::new(&batches).next() else { return Ok(None) };
        assert!(header.base_offset <= offset && offset <= header.last_offset());
        Ok(Some(batches.slice(range)))
    }

    /// Moves the log start offset forward (DeleteRecords). `offset` must be <= the high watermark.
    pub fn delete_records_before(&self, offset: i64) -> Result<i64, ReadError> {
        let mut state = self.state.lock();
        if offset < 0 || offset > state.high_watermark {
            return Err(ReadError::OffsetOutOfRange {
                offset,
                log_start_offset: state.log_start_offset,
                log_end_offset: state.high_watermark,
            });
        }
        if offset > state.log_start_offset {
            crate::write_file_atomically(&self.dir.join(LOG_START_OFFSET_FILE), offset.to_string().as_bytes())?;
            state.log_start_offset = offset;
            delete_segments(&mut state, |segment, state_start| segment.next_offset() <= state_start);
            self.publish_offsets(&state);
        }
        Ok(state.log_start_offset)
    }

    /// Applies `retention.ms` and `retention.bytes`. Returns the number of segments deleted.
    pub fn apply_retention(&self, now_ms: i64) -> usize {
        let deleted = self.delete_expired_segments(now_ms);
        if deleted > 0 {
            // Deleted segments must stay deleted: a power loss that brought them back would
            // move the log start offset back.
            if let Err(error) = crate::durable::sync_dir(&self.dir) {
                tracing::warn!(dir = %self.dir.display(), %error, "fsync of the log directory after retention failed");
            }
        }
        deleted
    }

    fn delete_expired_segments(&self, now_ms: i64) -> usize {
        let mut state = self.state.lock();
        if !state.config.cleanup_delete {
            return 0;
        }
        let retention_ms = state.config.retention_ms;
        let mut deleted = 0;
        if retention_ms >= 0 {
            deleted += delete_segments(&mut state, |segment, _| segment.max_timestamp() < now_ms - retention_ms);
        }
        let retention_bytes = state.config.retention_bytes;
        if retention_bytes >= 0 {
            let mut total: u64 = state.segments.values().map(|s| s.size_bytes()).sum();
            deleted += delete_segments(&mut state, |segment, _| {
                let excess = total.saturating_sub(segment.size_bytes()) >= retention_bytes as u64;
                if excess {
                    total -= segment.size_bytes();
                }
                excess
            });
        }
        if deleted > 0 {
            self.publish_offsets(&state);
        }
        deleted
    }

    /// Writes the marker that commits or aborts `producer_id`'s transaction in this
    /// partition (on a leader; the transaction coordinator calls it). An abort is
    /// recorded in the aborted-transactions file, fsynced, before its marker is appended,
    /// so `read_committed` readers can never take aborted records for committed ones.
    /// The caller waits for the high watermark to reach `visible_at`, as for a produce.
    pub fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<AppendOutcome, AppendError> {
        let mut state = self.state.lock();
        if state.failed {
            return Err(AppendError::Offline);
        }
        if state.producers.epoch(producer_id).is_some_and(|current| current > producer_epoch) {
            return Err(AppendError::StaleProducerEpoch);
        }
        let base_offset = state.log_end_offset;
        if !commit {
            self.record_abort(&mut state, producer_id, base_offset)?;
        }
        let marker = batch::transaction_marker(
            base_offset,
            leader_epoch,
            producer_id,
            producer_epoch,
            commit,
            coordinator_epoch,
            now_ms,
        );
        let header = BatchHeader::parse(&marker).expect("a marker parses");
        let fsync = self.append_at_end(&mut state, &marker[..16], &marker[16..], &header, now_ms)?;
        Ok(AppendOutcome {
            base_offset,
            log_start_offset: state.log_start_offset,
            visible_at: state.log_end_offset,
            needs_sync: fsync,
            duplicate: false,
            log_append_time_ms: None,
        })
    }

    /// Records that `producer_id`'s open transaction is aborted by a marker at
    /// `marker_offset` (leader and follower alike), durably, before the marker is appended.
    /// Nothing to record when the producer has no open transaction here.
    fn record_abort(&self, state: &mut LogState, producer_id: i64, marker_offset: i64) -> io::Result<()> {
        let Some(first_offset) = state.producers.open_transaction(producer_id) else { return Ok(()) };
        assert!(first_offset < marker_offset, "an open transaction starts before its marker");
        let aborted = AbortedTransaction { producer_id, first_offset, last_offset: marker_offset };
        let log_start = state.log_start_offset;
        state.aborted.retain(|a| a.last_offset >= log_start && a.last_offset < marker_offset);
        state.aborted.push(aborted);
        let body = serde_json::to_vec(&state.aborted).map_err(io::Error::other)?;
        crate::write_file_atomically(&self.dir.join(ABORTED_TRANSACTIONS_FILE), &body)
    }

    /// The aborted transactions a `read_committed` fetch of `[from, to)` must name: those
    /// whose records may lie in that range.
    pub fn aborted_transactions(&self, from: i64, to: i64) -> Vec<AbortedTransaction> {
        let state = self.state.lock();
        state.aborted.iter().filter(|a| a.last_offset >= from && a.first_offset < to).copied().collect()
    }

    /// Whether `producer_id` has a transaction open in this partition.
    pub fn has_open_transaction(&self, producer_id: i64) -> bool {
        self.state.lock().producers.open_transaction(producer_id).is_some()
    }

    /// The producers with transactions open in this partition: (producer id, epoch,
    /// first offset), for DescribeProducers.
    pub fn open_transactions(&self) -> Vec<(i64, i16, i64)> {
        let state = self.state.lock();
        state.producers.open_transactions()
    }

    /// Every producer's state in this partition (DescribeProducers).
    pub fn producers(&self) -> Vec<crate::producer_state::ProducerSummary> {
        self.state.lock().producers.summaries()
    }

    /// The cleaner's next pass over this log, if one is due: the log is compacted and its
    /// dirty share reached `min.cleanable.dirty.ratio`, or dirty data is older than
    /// `max.compaction.lag.ms`, or a kept tombstone's `delete.retention.ms` ran out. Only
    /// sealed segments wholly below the last stable offset and older than
    /// `min.compaction.lag.ms` are cleanable: the active segment is never touched.
    pub(crate) fn cleaning_plan(&self, now_ms: i64) -> Option<CleaningPlan> {
        let state = self.state.lock();
        let config = &state.config;
        if !config.cleanup_compact || state.failed {
            return None;
        }
        let bases: Vec<i64> = state.segments.keys().copied().collect();
        let mut segments = Vec::new();
        let (mut dirty_bytes, mut total_bytes, mut lag_due) = (0u64, 0u64, false);
        for (&base, &end) in bases.iter().zip(bases.iter().skip(1)) {
            let segment = &state.segments[&base];
            let too_young = config.min_compaction_lag_ms > 0
                && segment.max_timestamp() > now_ms.saturating_sub(config.min_compaction_lag_ms);
            // Never past the last stable offset: an open transaction may still abort.
            if end > last_stable_offset(&state) || too_young {
                break;
            }
            total_bytes += segment.size_bytes();
            if base >= state.cleaned_up_to {
                dirty_bytes += segment.size_bytes();
                lag_due |= segment
                    .first_append_ms()
                    .is_some_and(|first| first <= now_ms.saturating_sub(config.max_compaction_lag_ms));
            }
            segments.push(CleanableSegment { base, end, file: segment.file().clone(), size: segment.size_bytes() });
        }
        let ratio_due = dirty_bytes > 0 && dirty_bytes as f64 >= config.min_cleanable_dirty_ratio * total_bytes as f64;
        let tombstones_due = state.tombstones_due_ms.is_some_and(|due| due <= now_ms);
        if segments.is_empty() || !(ratio_due || lag_due || tombstones_due) {
            return None;
        }
        Some(CleaningPlan {
            segments,
            cleaned_up_to: state.cleaned_up_to,
            config: config.clone(),
            aborted: state.aborted.clone(),
        })
    }

    /// Base offset of `producer_id`'s last batch in this log.
    pub(crate) fn last_producer_batch(&self, producer_id: i64) -> Option<i64> {
        self.state.lock().producers.last_batch_base(producer_id)
    }

    /// Puts a cleaned copy in place of `original`, unless the log changed under the
    /// cleaner (the segment was deleted by retention or truncation): then the copy is
    /// dropped and false returned.
    pub(crate) fn install_cleaned(&self, original: &CleanableSegment, mut cleaned: Segment) -> io::Result<bool> {
        let mut state = self.state.lock();
        let unchanged = state.segments.get(&original.base).is_some_and(|s| Arc::ptr_eq(s.file(), &original.file));
        if !unchanged || state.failed {
            cleaned.delete_files()?;
            return Ok(false);
        }
        assert_eq!(cleaned.base_offset(), original.base);
        assert!(cleaned.next_offset() <= original.end, "a cleaned segment stays within its offsets");
        cleaned.move_into(&self.dir)?;
        state.segments.insert(original.base, cleaned);
        Ok(true)
    }

    /// Records a finished pass: segments below `cleaned_up_to` are clean, and the next
    /// pass is due at `tombstones_due_ms` for the tombstones it kept.
    pub(crate) fn finish_cleaning(&self, cleaned_up_to: i64, tombstones_due_ms: Option<i64>) -> io::Result<()> {
        crate::write_file_atomically(&self.dir.join(CLEANER_CHECKPOINT_FILE), cleaned_up_to.to_string().as_bytes())?;
        let mut state = self.state.lock();
        state.cleaned_up_to = state.cleaned_up_to.max(cleaned_up_to);
        state.tombstones_due_ms = tombstones_due_ms;
        Ok(())
    }

    /// Clean shutdown: fsync the data, cut preallocation, persist the index and producer
    /// state, and make all of it durable, so the next start trusts the index and loads
    /// producer state without a scan.
    pub fn close(&self) -> io::Result<()> {
        let mut state = self.state.lock();
        let log_end_offset = state.log_end_offset;
        let active = state.segments.values_mut().next_back().expect("active segment");
        active.seal(true)?;
        write_snapshot(&self.dir, log_end_offset, &state.producers)?;
        crate::durable::sync_path(&self.dir.join(snapshot_file_name(log_end_offset)))?;
        crate::durable::sync_dir(&self.dir)
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
    debug_assert!(
        state.epochs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
        "{}: leader epochs not monotonic: {:?}",
        dir.display(),
        state.epochs
    );
}

/// Kafka's `message.timestamp.{before,after}.max.ms` checks (CreateTime), on the batch
/// header (records are not decoded): its first timestamp must not be too old, its max
/// timestamp not too far in the future.
fn check_timestamps(header: &BatchHeader, config: &LogConfig, now_ms: i64) -> Result<(), AppendError> {
    let earliest_ms = now_ms.saturating_sub(config.timestamp_before_max_ms);
    let latest_ms = now_ms.saturating_add(config.timestamp_after_max_ms);
    for timestamp in [header.max_timestamp, header.base_timestamp] {
        if timestamp < earliest_ms || timestamp > latest_ms {
            return Err(AppendError::InvalidTimestamp { timestamp, earliest_ms, latest_ms });
        }
    }
    Ok(())
}

/// Recovers a partition's state from its directory (see [`Partition::open`]).
fn load_state(dir: &Path, config: LogConfig) -> io::Result<LogState> {
    loop {
        let state = load_state_once(dir, config.clone())?;
        // A producer snapshot describes the log up to its offset; one beyond the recovered
        // log end (its data was lost) would answer a retry of a lost batch as a duplicate
        // at an offset that does not exist. Drop it and replay from an older one.
        let stale: Vec<i64> = list_snapshots(dir).into_iter().filter(|&o| o > state.log_end_offset).collect();
        if stale.is_empty() {
            return Ok(state);
        }
        for offset in stale {
            tracing::warn!(dir = %dir.display(), offset, log_end_offset = state.log_end_offset, "dropping producer snapshot beyond the log end");
            std::fs::remove_file(dir.join(snapshot_file_name(offset)))?;
        }
        crate::durable::sync_dir(dir)?;
    }
}

fn load_state_once(dir: &Path, config: LogConfig) -> io::Result<LogState> {
    // A cleaning pass cut short: the originals are still in place (or already replaced).
    match std::fs::remove_dir_all(dir.join(CLEANING_DIR)) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let (snapshot_offset, producers) = load_latest_snapshot(dir);
    let mut replay = ProducerReplay { from: snapshot_offset, producers };
    let mut segments: BTreeMap<i64, Segment> = BTreeMap::new();
    for base_offset in list_segment_bases(dir)? {
        let (segment, trusted) = Segment::open(dir, base_offset, &mut |header| replay.apply(header))?;
        if trusted && segment.next_offset() > replay.from {
            let start = segment.position_at_or_before(replay.from);
            segment.scan_from(start, &mut |header, _| {
                replay.apply(header);
                true
            })?;
        }
        if let Some(previous) = segments.values().next_back().map(|s| s.next_offset()) {
            // A compacted segment may end before the next one starts, never after.
            if previous > base_offset {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: segment {base_offset} overlaps offsets up to {previous}", dir.display()),
                ));
            }
        }
        segments.insert(base_offset, segment);
    }
    let producers = replay.producers;
    let stored_start = read_log_start_offset(dir);
    if segments.is_empty() {
        let base = stored_start.unwrap_or(0);
        segments.insert(base, Segment::create(dir, base)?);
    }
    let active = segments.values().next_back().expect("at least one segment");
    // The active segment will be appended to: its index file would go stale.
    let _ = std::fs::remove_file(dir.join(index_file_name(active.base_offset())));
    crate::durable::sync_data(active.file())?;
    let first_base = *segments.keys().next().expect("at least one segment");
    let log_end_offset = active.next_offset();
    let log_start_offset = stored_start.unwrap_or(first_base).max(first_base).min(log_end_offset);
    let mut epochs = read_leader_epochs(dir);
    epochs.retain(|&(_, start)| start < log_end_offset);
    let cleaned_up_to = read_offset_file(&dir.join(CLEANER_CHECKPOINT_FILE)).unwrap_or(first_base);
    let aborted = read_aborted_transactions(dir, log_start_offset, log_end_offset);
    // Kept tombstones' deadlines are not stored: one pass after a start finds them again.
    let tombstones_due_ms = config.cleanup_compact.then_some(0);
    Ok(LogState {
        config,
        segments,
        log_start_offset,
        log_end_offset,
        high_watermark: log_end_offset,
        local_end: log_end_offset,
        replicated: false,
        recovered_high_watermark: None,
        epochs,
        producers,
        aborted,
        cleaned_up_to,
        tombstones_due_ms,
        unflushed_messages: 0,
        oldest_unflushed_ms: None,
        failed: false,
        wal_pending: Vec::new(),
        wal_pending_ends: Vec::new(),
        sync_generation: 0,
        retired: false,
    })
}

/// Rebuilds producer state from batch headers at or after `from`, each applied once.
struct ProducerReplay {
    from: i64,
    producers: ProducerStateTable,
}

impl ProducerReplay {
    fn apply(&mut self, header: &BatchHeader) {
        if header.base_offset >= self.from {
            self.producers.record(header);
            self.from = header.last_offset() + 1;
        }
    }
}

/// Deletes oldest sealed segments while `expired` says so, then moves the log start offset.
/// Only segments wholly below the high watermark go: what is not yet committed is not
/// history to expire (a follower still has to fetch it, a failover may still need it).
fn delete_segments(state: &mut LogState, mut expired: impl FnMut(&Segment, i64) -> bool) -> usize {
    let mut deleted = 0;
    while state.segments.len() > 1 {
        let (base, segment) = state.segments.iter().next().expect("non-empty");
        if segment.next_offset() > state.high_watermark || !expired(segment, state.log_start_offset) {
            break;
        }
        if let Err(error) = segment.delete_files() {
            tracing::warn!(%error, "failed to delete segment files");
            break;
        }
        let base = *base;
        state.segments.remove(&base);
        deleted += 1;
    }
    let first_base = *state.segments.keys().next().expect("non-empty");
    state.log_start_offset = state.log_start_offset.max(first_base);
    deleted
}

/// Reads whole batches holding `offsets` from `start` (a batch boundary at or before
/// `offsets.start`) to the file position `end`. Batches at or past `offsets.end` are left out.
fn read_batches(
    file: &std::fs::File,
    mut start: u64,
    end: u64,
    offsets: std::ops::Range<i64>,
    max_bytes: usize,
    min_one_batch: bool,
    mode: ReadMode,
) -> io::Result<Bytes> {
    let offset = offsets.start;
    while start < end {
        let length =
            ((end - start) as usize).min(max_bytes.max(batch::BATCH_HEADER_BYTES) + INDEX_INTERVAL_BYTES as usize);
        let chunk = Segment::read_at(file, start, length, mode)?;
        let mut taken: Option<(usize, usize)> = None;
        let mut iter = BatchIter::new(&chunk);
        for item in iter.by_ref() {
            let (header, range) = item.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if header.last_offset() < offset {
                continue;
            }
            if header.base_offset >= offsets.end {
                return Ok(taken.map_or_else(Bytes::new, |(begin, end)| chunk.slice(begin..end)));
            }
            match taken {
                None if range.len() > max_bytes && !min_one_batch => return Ok(Bytes::new()),
                None => taken = Some((range.start, range.end)),
                Some((begin, _)) if range.end - begin > max_bytes => break,
                Some((begin, _)) => taken = Some((begin, range.end)),
            }
        }
        if let Some((begin, end)) = taken {
            return Ok(chunk.slice(begin..end));
        }
        match iter.position() {
            0 => {
                // Not even one whole batch in the chunk: read the batch at `start` alone.
                let header = batch::BatchHeader::parse(&chunk)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                if header.base_offset >= offsets.end {
                    return Ok(Bytes::new());
                }
                if header.last_offset() >= offset {
                    if !min_one_batch && header.total_bytes() > max_bytes {
                        return Ok(Bytes::new());
                    }
                    return Segment::read_at(file, start, header.total_bytes(), mode);
                }
                start += header.total_bytes() as u64;
            }
            consumed => start += consumed as u64,
        }
    }
    Ok(Bytes::new())
}

fn list_segment_bases(dir: &Path) -> io::Result<Vec<i64>> {
    let mut bases = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(stem) = name.strip_suffix(".log") {
            if let Ok(base) = stem.parse::<i64>() {
                bases.push(base);
            }
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

fn read_leader_epochs(dir: &Path) -> Vec<(i32, i64)> {
    let Ok(body) = std::fs::read(dir.join(LEADER_EPOCHS_FILE)) else { return Vec::new() };
    match serde_json::from_slice::<Vec<(i32, i64)>>(&body) {
        Ok(epochs) if epochs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1) => epochs,
        _ => {
            tracing::warn!(dir = %dir.display(), "ignoring unreadable leader-epoch cache");
            Vec::new()
        }
    }
}

fn write_leader_epochs(dir: &Path, epochs: &[(i32, i64)]) -> io::Result<()> {
    let body = serde_json::to_vec(epochs).map_err(io::Error::other)?;
    crate::write_file_atomically(&dir.join(LEADER_EPOCHS_FILE), &body)
}

/// The offset `read_committed` readers stop at: the first offset of the oldest open
/// transaction, or the high watermark.
fn last_stable_offset(state: &LogState) -> i64 {
    let open = state.producers.first_open_transaction_offset().unwrap_or(i64::MAX);
    open.min(state.high_watermark).max(state.log_start_offset)
}

/// The aborted transactions recorded for `dir` whose markers are within the log.
fn read_aborted_transactions(dir: &Path, log_start: i64, log_end: i64) -> Vec<AbortedTransaction> {
    let Ok(body) = std::fs::read(dir.join(ABORTED_TRANSACTIONS_FILE)) else { return Vec::new() };
    let mut aborted: Vec<AbortedTransaction> = serde_json::from_slice(&body).unwrap_or_else(|error| {
        tracing::error!(dir = %dir.display(), %error, "unreadable aborted-transactions file");
        Vec::new()
    });
    // An abort recorded whose marker a crash took back is recorded again when the
    // coordinator writes the marker anew.
    aborted.retain(|a| a.last_offset >= log_start && a.last_offset < log_end);
    aborted
}

fn read_offset_file(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn read_log_start_offset(dir: &Path) -> Option<i64> {
    read_offset_file(&dir.join(LOG_START_OFFSET_FILE))
}

#[derive(Serialize, Deserialize)]
struct ProducerSnapshot {
    version: u32,
    offset: i64,
    producers: ProducerStateTable,
}

fn write_snapshot(dir: &Path, offset: i64, producers: &ProducerStateTable) -> io::Result<()> {
    let snapshot = ProducerSnapshot { version: 1, offset, producers: producers.clone() };
    let body = serde_json::to_vec(&snapshot).map_err(io::Error::other)?;
    // Unsynced: a lost snapshot only means a longer replay from an older one.
    crate::write_file_unsynced(&dir.join(snapshot_file_name(offset)), &body)?;
    let mut snapshots = list_snapshots(dir);
    while snapshots.len() > SNAPSHOTS_KEPT {
        let oldest = snapshots.remove(0);
        let _ = std::fs::remove_file(dir.join(snapshot_file_name(oldest)));
    }
    Ok(())
}

fn snapshot_file_name(offset: i64) -> String {
    format!("{offset:020}{SNAPSHOT_SUFFIX}")
}

fn list_snapshots(dir: &Path) -> Vec<i64> {
    let mut offsets: Vec<i64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().strip_suffix(SNAPSHOT_SUFFIX)?.parse().ok())
        .collect();
    offsets.sort_unstable();
    offsets
}

/// The newest readable producer snapshot, or an empty table replayed from offset 0.
fn load_latest_snapshot(dir: &Path) -> (i64, ProducerStateTable) {
    for offset in list_snapshots(dir).into_iter().rev() {
        let path = dir.join(snapshot_file_name(offset));
        let parsed = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<ProducerSnapshot>(&b).ok());
        match parsed {
            Some(snapshot) if snapshot.version == 1 && snapshot.offset == offset => {
                return (offset, snapshot.producers)
            }
            _ => tracing::warn!(path = %path.display(), "ignoring unreadable producer snapshot"),
        }
    }
    (0, ProducerStateTable::default())
}
