//! Group commit: what makes appended batches durable before they are acknowledged.
//!
//! A produce handler appends to the page cache, queues its partition here (at most once
//! however many batches arrive) and waits for the high watermark. Two ways to make the
//! batches durable, chosen per node ([`Syncer::start`] / [`Syncer::start_with_wal`]):
//! - **Per-file fsync**: [`SYNC_THREADS`] workers each take a share of the queue, capture
//!   each partition's log end, `fdatasync` its active segment and advance its high
//!   watermark as soon as its own fsync is done; the filesystem's journal batches the
//!   concurrent fsyncs into shared commits.
//! - **Write-ahead log** ([`crate::wal`]): one thread takes the whole queue, writes every
//!   covered partition's new batches as one WAL record each, makes the round durable with
//!   one `fdatasync` of the WAL file and then advances every partition in it. One fsync per
//!   round whatever the number of partitions; the segment files are fsynced later by the
//!   WAL's checkpointer.
//!
//! Page-cache topics (`flush.messages` > 1) are flushed by count or age through
//! [`Syncer::schedule_flush`] on the per-file workers in both modes, so their fsyncs never
//! delay the acknowledgements of fsync-per-write topics in WAL mode.
//! Data is made durable file by file, never with `syncfs` (see [`crate::durable`]).
//!
//! A failed fsync takes its partitions offline ([`Partition::finish_sync`]; counted in
//! [`crate::LogManager::fsync_failures`]).

use std::collections::VecDeque;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::log::wal_link::{Control, ControlLog, WalLink};
use crate::log::{Partition, TopicSignals};
use crate::wal::{self, WalWriter};

/// Concurrent per-file group-commit workers (fsyncs in flight at once).
pub const SYNC_THREADS: usize = 8;
/// Partitions made durable by one round at most (bounds the work done between wake-ups).
pub const SYNC_ROUND_PARTITIONS_MAX: usize = 16_384;
/// Longest [`Syncer::set_wal_round_interval`] accepted: every acknowledgement may wait this
/// much longer.
pub const WAL_ROUND_INTERVAL_MAX: Duration = Duration::from_millis(10);
/// Batches a WAL round must have logged for the next round to be paced: a lone producer
/// that waits for each acknowledgement before it sends again logs one batch a round, and
/// pacing would only slow it down, with no other writer's batches to gather.
pub const WAL_PACED_ROUND_BATCHES_MIN: usize = 2;
/// A WAL round whose write and `fdatasync` take longer than this is logged (a round takes
/// ~0.2 ms on an idle SSD): every acknowledgement of the round waited that long, and the
/// log line says when, for tail latencies that need a cause.
const WAL_ROUND_SLOW: Duration = Duration::from_millis(100);
/// At most one slow-round line per this period; the line counts the rounds it stood for.
const WAL_ROUND_SLOW_LOG_PERIOD: Duration = Duration::from_secs(10);
/// The WAL thread's buffer of record headers is given back after a round that grew it past
/// this (a round of very many partitions), instead of being kept for the next.
const HEADERS_CAPACITY_KEPT_MAX: usize = wal::WAL_FILE_BYTES as usize;

/// A change logged in the WAL before it takes effect, and who waits for it to be durable.
struct ControlRequest {
    path: String,
    control: Control,
    done: mpsc::SyncSender<io::Result<()>>,
}

#[derive(Default)]
struct Queue {
    partitions: VecDeque<Arc<Partition>>,
    controls: Vec<ControlRequest>,
    shutdown: bool,
}

struct Shared {
    /// Per-file fsyncs (every schedule without a WAL; page-cache flushes always).
    files: Mutex<Queue>,
    files_ready: Condvar,
    /// The WAL thread's queue (WAL mode only).
    wal: Mutex<Queue>,
    wal_ready: Condvar,
    /// The data directory WAL record paths are relative to; set in WAL mode.
    wal_base: Option<std::path::PathBuf>,
    observer: OnceLock<FsyncObserver>,
    /// Least time between the starts of two WAL rounds after a round shared by several
    /// batches, in microseconds ([`Syncer::set_wal_round_interval`]).
    wal_round_interval_us: AtomicU64,
}

/// Told how long each group-commit fsync took (the broker's metrics).
pub type FsyncObserver = Box<dyn Fn(Duration) + Send + Sync>;

impl ControlLog for Shared {
    fn log(&self, path: &str, control: Control) -> io::Result<()> {
        let (done, wait) = mpsc::sync_channel(1);
        {
            let mut queue = self.wal.lock();
            if queue.shutdown {
                return Err(io::Error::other("the WAL is shut down"));
            }
            queue.controls.push(ControlRequest { path: path.to_string(), control, done });
        }
        self.wal_ready.notify_one();
        wait.recv().map_err(|_| io::Error::other("the WAL thread stopped"))?
    }
}

/// The group-commit threads.
pub struct Syncer {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Syncer {
    /// Per-file fsyncs only.
    pub fn start() -> Syncer {
        Syncer::start_threads(None, None).expect("no WAL to open")
    }

    /// Acknowledged appends go through a write-ahead log in `dir` (emptied by
    /// [`crate::wal::replay`] first) of files of `wal_file_bytes`; record paths are relative
    /// to `base`.
    pub fn start_with_wal(dir: &Path, base: &Path, wal_file_bytes: u64) -> io::Result<Syncer> {
        let writer = WalWriter::start(dir, wal_file_bytes)?;
        Syncer::start_threads(Some(writer), Some(base))
    }

    fn start_threads(writer: Option<WalWriter>, base: Option<&Path>) -> io::Result<Syncer> {
        let shared = Arc::new(Shared {
            files: Mutex::new(Queue::default()),
            files_ready: Condvar::new(),
            wal: Mutex::new(Queue::default()),
            wal_ready: Condvar::new(),
            wal_base: base.map(Path::to_path_buf),
            observer: OnceLock::new(),
            wal_round_interval_us: AtomicU64::new(0),
        });
        let mut workers: Vec<JoinHandle<()>> = (0..SYNC_THREADS)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("sluice-sync-{i}"))
                    .spawn(move || file_worker(&shared))
                    .expect("spawn sync worker")
            })
            .collect();
        if let Some(writer) = writer {
            let shared = shared.clone();
            workers.push(
                std::thread::Builder::new().name("sluice-wal".into()).spawn(move || wal_worker(&shared, writer))?,
            );
        }
        Ok(Syncer { shared, workers: Mutex::new(workers) })
    }

    /// True when acknowledged appends go through the WAL.
    pub fn uses_wal(&self) -> bool {
        self.shared.wal_base.is_some()
    }

    /// Paces the WAL's rounds: after a round that logged several batches, the next starts
    /// no sooner than `interval` after it started (0, the default here: as soon as there
    /// is work). Each round costs the same CPU (a write, a device cache flush, a wake-up of
    /// every acknowledgement and fetch it completes) whatever it carries, so fewer, fuller
    /// rounds cost less (the broker's default and its measurements: `sluice-config`'s
    /// `limits.rs`). A round that logged fewer than [`WAL_PACED_ROUND_BATCHES_MIN`] batches
    /// is not followed by a wait. Acknowledgements still follow their round's fsync; only
    /// its start moves.
    pub fn set_wal_round_interval(&self, interval: Duration) {
        assert!(
            interval <= WAL_ROUND_INTERVAL_MAX,
            "WAL round interval {interval:?} is over {WAL_ROUND_INTERVAL_MAX:?}"
        );
        self.shared.wal_round_interval_us.store(interval.as_micros() as u64, Ordering::Relaxed);
    }

    /// Sets what is told each fsync's duration (once; later calls are ignored).
    pub fn observe(&self, observer: FsyncObserver) {
        let _ = self.shared.observer.set(observer);
    }

    /// Asks for everything appended to `partition` so far to be made durable (an
    /// fsync-per-write topic waiting to acknowledge).
    pub fn schedule(&self, partition: &Arc<Partition>) {
        let Some(base) = &self.shared.wal_base else {
            return self.schedule_flush(partition);
        };
        partition.link_wal(|| WalLink::new(wal::record_path(base, partition.dir()).into(), self.shared.clone()));
        if partition.sync_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.wal.lock().partitions.push_back(partition.clone());
        self.shared.wal_ready.notify_one();
    }

    /// Asks for an fsync of `partition`'s active segment (a page-cache topic's flush).
    pub fn schedule_flush(&self, partition: &Arc<Partition>) {
        if partition.flush_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.files.lock().partitions.push_back(partition.clone());
        self.shared.files_ready.notify_one();
    }

    /// Finishes queued work and stops the threads.
    pub fn shutdown(&self) {
        self.shared.files.lock().shutdown = true;
        self.shared.files_ready.notify_all();
        self.shared.wal.lock().shutdown = true;
        self.shared.wal_ready.notify_all();
        for handle in self.workers.lock().drain(..) {
            let _ = handle.join();
        }
    }
}

/// Takes the next round from `queue`: `share` of its partitions (at least one) and every
/// control request, once there is work and `not_before` has passed (what arrives in
/// between joins the round). `None` at shutdown once the queue is empty.
fn next_round(
    queue: &Mutex<Queue>,
    ready: &Condvar,
    share: impl Fn(usize) -> usize,
    not_before: Option<Instant>,
) -> Option<(Vec<Arc<Partition>>, Vec<ControlRequest>)> {
    let mut queue = queue.lock();
    while queue.partitions.is_empty() && queue.controls.is_empty() {
        if queue.shutdown {
            return None;
        }
        ready.wait(&mut queue);
    }
    if let Some(wait) = not_before.and_then(|at| at.checked_duration_since(Instant::now())) {
        parking_lot::MutexGuard::unlocked(&mut queue, || std::thread::sleep(wait));
    }
    let take = share(queue.partitions.len()).min(SYNC_ROUND_PARTITIONS_MAX);
    let round: Vec<_> = queue.partitions.drain(..take).collect();
    if !queue.partitions.is_empty() {
        ready.notify_one();
    }
    Some((round, std::mem::take(&mut queue.controls)))
}

fn file_worker(shared: &Shared) {
    // An even share, so idle workers take the rest and the fsyncs run in parallel.
    while let Some((round, _)) = next_round(&shared.files, &shared.files_ready, |n| n.div_ceil(SYNC_THREADS), None) {
        // Clear the flags before capturing targets: an append after this point queues its
        // partition again, so no write is left without a covering fsync.
        for partition in &round {
            partition.flush_queued.store(false, Ordering::Release);
        }
        let targets: Vec<_> = round.iter().map(|p| p.sync_target()).collect();
        for (partition, target) in round.iter().zip(targets) {
            let started = Instant::now();
            let result = target.sync();
            if let Some(observe) = shared.observer.get() {
                observe(started.elapsed());
            }
            // One fsync per partition here: its fetches need not wait for the next.
            let mut signals = TopicSignals::default();
            partition.finish_sync(target.end_offset, target.generation, &result, &mut signals);
            signals.notify();
        }
    }
}

/// Rate-limited logging of WAL rounds slower than [`WAL_ROUND_SLOW`].
#[derive(Default)]
struct SlowRounds {
    last_logged: Option<Instant>,
    /// Slow rounds since the last line, not logged yet.
    unlogged: u64,
}

impl SlowRounds {
    fn note(&mut self, took: Duration, batches: usize, partitions: usize) {
        if took < WAL_ROUND_SLOW {
            return;
        }
        self.unlogged += 1;
        let now = Instant::now();
        if self.last_logged.is_some_and(|last| now < last + WAL_ROUND_SLOW_LOG_PERIOD) {
            return;
        }
        tracing::warn!(
            took_ms = took.as_millis() as u64,
            batches,
            partitions,
            slow_rounds = self.unlogged,
            "slow WAL round: its write and fdatasync held every acknowledgement of the round (slow_rounds: since the last such line)"
        );
        self.last_logged = Some(now);
        self.unlogged = 0;
    }
}

fn wal_worker(shared: &Shared, mut writer: WalWriter) {
    // Record headers (and whole control records); the batches stay in the buffers taken
    // from the partitions and are written from there.
    let mut headers = Vec::new();
    // When the last round that logged several batches started.
    let mut paced_from: Option<Instant> = None;
    let mut slow_rounds = SlowRounds::default();
    loop {
        let interval = Duration::from_micros(shared.wal_round_interval_us.load(Ordering::Relaxed));
        let not_before = paced_from.map(|started| started + interval);
        let Some((round, controls)) = next_round(&shared.wal, &shared.wal_ready, |n| n, not_before) else {
            break;
        };
        let round_started = Instant::now();
        for partition in &round {
            partition.sync_queued.store(false, Ordering::Release);
        }
        headers.clear();
        let mut logged = Vec::with_capacity(round.len());
        let mut batches = Vec::with_capacity(round.len());
        let mut round_batches = 0;
        for partition in &round {
            if let Some(pending) = partition.take_wal_pending() {
                if pending.roll_due {
                    writer.queue_roll(partition);
                }
                let start = headers.len();
                wal::encode_batches_header(&mut headers, writer.sequence(), &pending.path, pending.batches.parts());
                round_batches += pending.batches.len();
                batches.push((start..headers.len(), pending.batches));
                logged.push((partition, pending.end_offset, pending.generation));
            }
        }
        // Controls after the batches: a batch taken before a cut is logged before the cut.
        let controls_start = headers.len();
        for control in &controls {
            wal::encode_control(&mut headers, writer.sequence(), &control.path, control.control);
        }
        // A header and the parts of each partition's batches, then the controls.
        let mut records: Vec<wal::RoundRecord<'_>> = Vec::with_capacity(batches.len() + 1);
        for (header, batches) in &batches {
            records.push(wal::RoundRecord::Batches {
                header: &headers[header.clone()],
                batches: batches.parts().collect(),
            });
        }
        records.push(wal::RoundRecord::Sealed(&headers[controls_start..]));
        let result = if headers.is_empty() {
            Ok(())
        } else {
            let started = Instant::now();
            let partitions: Vec<&Arc<Partition>> = logged.iter().map(|(p, _, _)| *p).collect();
            let result = writer.write_round(&records, &partitions);
            let took = started.elapsed();
            if let Some(observe) = shared.observer.get() {
                observe(took);
            }
            slow_rounds.note(took, round_batches, partitions.len());
            result
        };
        // Every partition of the round is published (its acknowledgements woken) before
        // the fetches waiting on its topics are.
        let mut signals = TopicSignals::default();
        match &result {
            Err(error) if !crate::durable::is_fsync_failure(error) => {
                // The WAL could not take the round (a full disk): the batches are in their
                // segments (written out of memory by `sync_target`), so each partition is
                // made durable by its own fsync.
                tracing::warn!(%error, "WAL write failed; fsyncing this round's partitions one by one");
                for (partition, _, _) in logged {
                    let target = partition.sync_target();
                    let synced = target.sync();
                    partition.finish_sync(target.end_offset, target.generation, &synced, &mut signals);
                }
            }
            _ => {
                for (partition, end_offset, generation) in logged {
                    partition.finish_sync(end_offset, generation, &result, &mut signals);
                }
            }
        }
        signals.notify();
        paced_from = (round_batches >= WAL_PACED_ROUND_BATCHES_MIN).then_some(round_started);
        for control in controls {
            let answer = result.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string()));
            let _ = control.done.send(answer);
        }
        if headers.capacity() > HEADERS_CAPACITY_KEPT_MAX {
            headers = Vec::new();
        }
    }
    writer.shutdown();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_rounds_are_logged_at_most_once_a_period_and_counted() {
        let mut slow = SlowRounds::default();
        slow.note(WAL_ROUND_SLOW - Duration::from_millis(1), 4, 2);
        assert_eq!((slow.last_logged, slow.unlogged), (None, 0), "a round under the threshold is not slow");
        slow.note(WAL_ROUND_SLOW, 4, 2);
        let logged = slow.last_logged.expect("the first slow round is logged");
        assert_eq!(slow.unlogged, 0);
        slow.note(WAL_ROUND_SLOW * 3, 4, 2);
        slow.note(WAL_ROUND_SLOW * 2, 4, 2);
        assert_eq!((slow.last_logged, slow.unlogged), (Some(logged), 2), "held back within the period, counted");
        // A period later the next slow round is logged with the two it stands for.
        slow.last_logged = Some(logged - WAL_ROUND_SLOW_LOG_PERIOD);
        slow.note(WAL_ROUND_SLOW, 4, 2);
        assert_eq!(slow.unlogged, 0);
        assert!(slow.last_logged.unwrap() >= logged);
    }
}
