//! Group commit: one fsync covers every batch, on every partition, that arrived meanwhile.
//!
//! A produce handler appends to the page cache, queues its partition here (at most once
//! however many batches arrive) and waits for the high watermark. A worker takes the
//! whole queue, captures each partition's log end, and makes it durable with one call:
//! `fdatasync` when a single partition is dirty, `syncfs` when several are, so the cost of
//! a round does not grow with the number of partitions (one journal commit and one device
//! cache flush for all of them). Then it advances every high watermark in the round.
//! Two workers let the next round gather while the previous one is on the device.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::log::Partition;

/// Concurrent group-commit workers.
pub const SYNC_THREADS: usize = 2;
/// Partitions made durable by one round at most (bounds the work done between wake-ups).
pub const SYNC_ROUND_PARTITIONS_MAX: usize = 16_384;

struct Queue {
    partitions: VecDeque<Arc<Partition>>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

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
            let take = queue.partitions.len().min(SYNC_ROUND_PARTITIONS_MAX);
            queue.partitions.drain(..take).collect()
        };
        // Clear the flags before capturing targets: an append after this point queues its
        // partition again, so no write is left without a covering fsync.
        for partition in &round {
            partition.sync_queued.store(false, Ordering::Release);
        }
        let targets: Vec<_> = round.iter().map(|p| p.sync_target()).collect();
        let result = match targets.as_slice() {
            [single] => single.file.sync_data(),
            [first, ..] => crate::syncfs(&first.file),
            [] => unreachable!("a round has at least one partition"),
        };
        for (partition, target) in round.iter().zip(targets) {
            partition.finish_sync(target, &result);
        }
    }
}
