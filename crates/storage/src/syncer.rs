//! Group commit: one `fdatasync` of a partition covers every batch that arrived on it
//! since the previous one.
//!
//! A produce handler appends to the page cache, queues its partition here (at most once
//! however many batches arrive) and waits for the high watermark. A worker takes its share
//! of the queue, captures each partition's log end, `fdatasync`s each partition's active
//! segment and advances that partition's high watermark as soon as its own fsync is done.
//! Data is made durable file by file, never with `syncfs` (see [`crate::durable`]).
//! [`SYNC_THREADS`] workers keep that many fsyncs in flight, which the filesystem's
//! journal batches into shared commits, while the next round gathers.
//!
//! A failed fsync takes its partition offline ([`Partition::finish_sync`]; counted in
//! [`crate::LogManager::fsync_failures`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::log::Partition;

/// Concurrent group-commit workers (fsyncs in flight at once).
pub const SYNC_THREADS: usize = 8;
/// Partitions made durable by one round at most (bounds the work done between wake-ups).
pub const SYNC_ROUND_PARTITIONS_MAX: usize = 16_384;

struct Queue {
    partitions: VecDeque<Arc<Partition>>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    observer: OnceLock<FsyncObserver>,
}

/// Told how long each group-commit fsync took (the broker's metrics).
pub type FsyncObserver = Box<dyn Fn(Duration) + Send + Sync>;

/// The group-commit worker pool.
pub struct Syncer {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Syncer {
    pub fn start() -> Syncer {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue { partitions: VecDeque::new(), shutdown: false }),
            ready: Condvar::new(),
            observer: OnceLock::new(),
        });
        let workers = (0..SYNC_THREADS)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("sluice-sync-{i}"))
                    .spawn(move || worker(&shared))
                    .expect("spawn sync worker")
            })
            .collect();
        Syncer { shared, workers: Mutex::new(workers) }
    }

    /// Sets what is told each fsync's duration (once; later calls are ignored).
    pub fn observe(&self, observer: FsyncObserver) {
        let _ = self.shared.observer.set(observer);
    }

    /// Asks for an fsync of `partition` covering everything appended so far.
    pub fn schedule(&self, partition: &Arc<Partition>) {
        if partition.sync_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.queue.lock().partitions.push_back(partition.clone());
        self.shared.ready.notify_one();
    }

    /// Finishes queued work and stops the workers.
    pub fn shutdown(&self) {
        self.shared.queue.lock().shutdown = true;
        self.shared.ready.notify_all();
        for handle in self.workers.lock().drain(..) {
            let _ = handle.join();
        }
    }
}

fn worker(shared: &Shared) {
    loop {
        let round: Vec<Arc<Partition>> = {
            let mut queue = shared.queue.lock();
            while queue.partitions.is_empty() {
                if queue.shutdown {
                    return;
                }
                shared.ready.wait(&mut queue);
            }
            // An even share, so idle workers take the rest and the fsyncs run in parallel.
            let take = queue.partitions.len().div_ceil(SYNC_THREADS).min(SYNC_ROUND_PARTITIONS_MAX);
            let round: Vec<_> = queue.partitions.drain(..take).collect();
            if !queue.partitions.is_empty() {
                shared.ready.notify_one();
            }
            round
        };
        // Clear the flags before capturing targets: an append after this point queues its
        // partition again, so no write is left without a covering fsync.
        for partition in &round {
            partition.sync_queued.store(false, Ordering::Release);
        }
        let targets: Vec<_> = round.iter().map(|p| p.sync_target()).collect();
        for (partition, target) in round.iter().zip(targets) {
            let started = Instant::now();
            let result = crate::durable::sync_data(&target.file);
            if let Some(observe) = shared.observer.get() {
                observe(started.elapsed());
            }
            partition.finish_sync(target, &result);
        }
    }
}
