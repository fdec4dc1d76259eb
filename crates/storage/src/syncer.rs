//! Group commit: a few threads that fsync dirty partitions and advance their high watermark.
//!
//! A produce handler appends to the page cache, then schedules its partition here and
//! waits for the high watermark. A partition is queued at most once however many batches
//! arrive meanwhile, and one `fdatasync` covers them all; several workers sync different
//! partitions concurrently so the filesystem can merge their journal commits.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::log::Partition;

/// Concurrent fsync workers.
pub const SYNC_THREADS: usize = 4;

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
        let partition = {
            let mut queue = shared.queue.lock();
            loop {
                if let Some(partition) = queue.partitions.pop_front() {
                    break partition;
                }
                if queue.shutdown {
                    return;
                }
                shared.ready.wait(&mut queue);
            }
        };
        // Clear the flag before capturing the target: an append after this point queues
        // the partition again, so no write is left without a covering fsync.
        partition.sync_queued.store(false, Ordering::Release);
        let target = partition.sync_target();
        partition.sync(target);
    }
}
