//! Which records of a queue may have been delivered before the broker last stopped, for
//! the `redelivered` flag.
//!
//! RabbitMQ's promise: a message delivered with `redelivered=false` was never delivered
//! before. A share group does not write its acquisitions (after a crash a record that was
//! locked comes back with the delivery count last written), so the delivery count alone
//! would break that promise after a crash. This module keeps, per queue partition, a mark
//! below which every offset may have been handed out over AMQP. The mark is written ahead
//! of what is delivered — durably, before the delivery — in steps of [`MARK_STEP`] records,
//! so few deliveries wait for a write. After a restart, a record below the mark the node
//! started with is flagged redelivered: it may have been delivered. Some of them were not;
//! the flag errs only that way, as RabbitMQ allows. A mark is lowered at start to the log's
//! end, so what is published after a restart is never flagged.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::state_store::write_atomically;

/// The file of marks in the state directory.
const MARKS_FILE: &str = "amqp-delivered.json";
/// How far ahead of a delivery a mark is written.
pub const MARK_STEP: i64 = 10_000;
/// Queue partitions with a mark at most (beyond it, the first by name are forgotten: their
/// records lose only the flag a crash would have given them).
const MARKS_MAX: usize = 100_000;

type Key = (String, i32);

/// The marks as stored: `queue/partition` -> first offset never handed out.
fn to_file(marks: &BTreeMap<Key, i64>) -> Vec<u8> {
    let named: BTreeMap<String, i64> = marks.iter().map(|((q, p), m)| (format!("{q}/{p}"), *m)).collect();
    serde_json::to_vec(&named).expect("marks serialize")
}

fn from_file(bytes: &[u8], path: &Path) -> io::Result<BTreeMap<Key, i64>> {
    let named: BTreeMap<String, i64> = serde_json::from_slice(bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
    Ok(named
        .into_iter()
        .filter_map(|(name, mark)| {
            let (queue, partition) = name.rsplit_once('/')?;
            Some(((queue.to_string(), partition.parse().ok()?), mark))
        })
        .collect())
}

pub struct DeliveredMarks {
    path: PathBuf,
    /// The marks the node started with: below them, records may have been delivered.
    at_start: BTreeMap<Key, i64>,
    /// The marks written (durable).
    written: Mutex<BTreeMap<Key, i64>>,
    /// One write at a time, each carrying every mark.
    writer: tokio::sync::Mutex<()>,
    /// The highest offset of each queue partition this process handed out. A partition's
    /// leader hands its records out in offset order, so one at or below it comes back: a
    /// redelivery, which the leader itself may not know of when it took over from a leader
    /// that crashed (acquisitions are not replicated).
    /// By topic id: a queue deleted and declared again (anywhere) starts afresh.
    handed_out: Mutex<BTreeMap<(uuid::Uuid, i32), i64>>,
}

impl DeliveredMarks {
    /// The marks kept in `dir`, each lowered to its partition's `log_end` (when this node
    /// has the partition): nothing above the end was handed out.
    pub fn open(dir: &Path, log_end: impl Fn(&str, i32) -> Option<i64>) -> io::Result<DeliveredMarks> {
        let path = dir.join(MARKS_FILE);
        let mut at_start = match std::fs::read(&path) {
            Ok(bytes) => from_file(&bytes, &path)?,
            Err(error) if error.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(error) => return Err(error),
        };
        for ((queue, partition), mark) in at_start.iter_mut() {
            if let Some(end) = log_end(queue, *partition) {
                *mark = (*mark).min(end);
            }
        }
        Ok(DeliveredMarks {
            path,
            written: Mutex::new(at_start.clone()),
            at_start,
            writer: tokio::sync::Mutex::new(()),
            handed_out: Mutex::default(),
        })
    }

    /// Whether `offset` of `queue`'s `partition` may have been delivered before the node
    /// started.
    pub fn before_start(&self, queue: &str, partition: i32, offset: i64) -> bool {
        self.at_start.get(&(queue.to_string(), partition)).is_some_and(|mark| offset < *mark)
    }

    /// Notes that `offset` of partition `partition` of the queue's topic `topic_id` is
    /// handed out now; whether this process had handed out that offset or a later one before.
    pub fn note_handed_out(&self, topic_id: uuid::Uuid, partition: i32, offset: i64) -> bool {
        let mut handed_out = self.handed_out.lock();
        if handed_out.len() >= MARKS_MAX && !handed_out.contains_key(&(topic_id, partition)) {
            handed_out.clear();
        }
        let highest = handed_out.entry((topic_id, partition)).or_insert(i64::MIN);
        let again = offset <= *highest;
        *highest = (*highest).max(offset);
        again
    }

    fn covered(&self, key: &Key, offset: i64) -> bool {
        self.written.lock().get(key).is_some_and(|mark| offset < *mark)
    }

    /// Returns once a crash can no longer hide that `offset` of `queue`'s `partition` was
    /// handed out: the mark is above it, durably.
    pub async fn cover(&self, queue: &str, partition: i32, offset: i64) -> io::Result<()> {
        let key = (queue.to_string(), partition);
        if self.covered(&key, offset) {
            return Ok(());
        }
        let _writing = self.writer.lock().await;
        if self.covered(&key, offset) {
            return Ok(());
        }
        let mut marks = self.written.lock().clone();
        marks.insert(key, offset + MARK_STEP);
        while marks.len() > MARKS_MAX {
            let oldest = marks.keys().next().cloned().expect("not empty");
            marks.remove(&oldest);
        }
        let path = self.path.clone();
        let bytes = to_file(&marks);
        tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
            .await
            .map_err(|e| io::Error::other(format!("mark writer: {e}")))??;
        *self.written.lock() = marks;
        Ok(())
    }

    /// Forgets a deleted queue's marks (at the next write).
    pub fn forget(&self, queue: &str) {
        self.written.lock().retain(|(q, _), _| q != queue);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_mark_written_before_a_delivery_flags_it_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let marks = DeliveredMarks::open(dir.path(), |_, _| None).unwrap();
        assert!(!marks.before_start("orders", 0, 0));
        marks.cover("orders", 0, 5).await.unwrap();
        marks.cover("orders", 0, 6).await.unwrap();
        assert!(!marks.before_start("orders", 0, 5), "this run's deliveries count themselves");
        let restarted = DeliveredMarks::open(dir.path(), |_, _| None).unwrap();
        assert!(restarted.before_start("orders", 0, 5));
        assert!(restarted.before_start("orders", 0, 5 + MARK_STEP - 1));
        assert!(!restarted.before_start("orders", 0, 5 + MARK_STEP));
        assert!(!restarted.before_start("orders", 1, 0));
        restarted.forget("orders");
        restarted.cover("other", 0, 0).await.unwrap();
        assert!(!DeliveredMarks::open(dir.path(), |_, _| None).unwrap().before_start("orders", 0, 5));
        let trimmed = DeliveredMarks::open(dir.path(), |_, _| Some(3)).unwrap();
        assert!(trimmed.before_start("other", 0, 2) && !trimmed.before_start("other", 0, 3));
    }
}
