//! The durable raft log, vote and committed index (openraft's `RaftLogStorage`, v2 API).
//!
//! Durability contract: `append` calls openraft's flush callback only after the entries are
//! `fdatasync`ed, and `save_vote` returns only after the vote file is fsynced and renamed into
//! place, so a vote or an entry is never acknowledged to a peer before it survives `kill -9`
//! or a power cut.
//!
//! Layout under `<data_dir>/controller/`:
//! ```text
//! log/<first_index:020>.seg   records: [len u32 LE][crc32c u32 LE][JSON entry]; rolled at SEGMENT_BYTES_MAX
//! vote.json                   the last vote (atomic replace)
//! committed.json              the last committed log id (atomic replace; lets a restart re-apply at once)
//! purged.json                 the last purged log id (written before segments are deleted)
//! ```
//! The controller's log is small (metadata changes, compacted by snapshots), so every live
//! entry is also kept in memory: reads never touch the disk. Recovery reads each segment,
//! checks every CRC, and cuts the last segment at the first torn record (a write cut by a
//! crash, never acknowledged); a bad record in an earlier segment is corruption and stops
//! startup.
//!
//! The file I/O is synchronous inside openraft's async calls: openraft serializes storage
//! calls on its own task, and a controller writes a few entries per second at most (liveness
//! is not logged), so an fsync blocking one worker thread briefly costs less than handing
//! every append to a blocking pool.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::types::TypeConfig;

/// A segment is rolled once it is larger than this.
pub(crate) const SEGMENT_BYTES_MAX: u64 = 8 << 20;
/// Largest single log record; larger means corruption (a command is far smaller).
pub(crate) const ENTRY_BYTES_MAX: usize = 16 << 20;
const RECORD_HEADER_BYTES: usize = 8;
const SEGMENT_SUFFIX: &str = ".seg";

type NodeId = u64;
type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// The raft log store; clones share the same log (one is the reader openraft asks for).
#[derive(Clone)]
pub(crate) struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

struct LogInner {
    dir: PathBuf,
    /// Live entries (after the purge point) by index.
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    /// Where each live entry starts: (segment first index, byte offset).
    positions: BTreeMap<u64, (u64, u64)>,
    /// Segment first index -> file length.
    segments: BTreeMap<u64, u64>,
    /// The last segment, open for appending.
    active: Option<(u64, File)>,
    last_purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

impl LogStore {
    /// Opens (or creates) the log under `dir`, recovering what the last run left.
    pub(crate) fn open(dir: &Path) -> io::Result<LogStore> {
        let log_dir = dir.join("log");
        create_dir_durably(&log_dir)?;
        let mut inner = LogInner {
            dir: dir.to_path_buf(),
            entries: BTreeMap::new(),
            positions: BTreeMap::new(),
            segments: BTreeMap::new(),
            active: None,
            last_purged: read_json(&dir.join("purged.json"))?,
            vote: read_json(&dir.join("vote.json"))?,
            committed: read_json(&dir.join("committed.json"))?,
        };
        inner.recover()?;
        Ok(LogStore { inner: Arc::new(Mutex::new(inner)) })
    }

    fn lock(&self) -> MutexGuard<'_, LogInner> {
        self.inner.lock().expect("log store lock poisoned")
    }
}

impl LogInner {
    fn log_dir(&self) -> PathBuf {
        self.dir.join("log")
    }

    fn segment_path(&self, first_index: u64) -> PathBuf {
        self.log_dir().join(format!("{first_index:020}{SEGMENT_SUFFIX}"))
    }

    fn recover(&mut self) -> io::Result<()> {
        let mut firsts = Vec::new();
        for dir_entry in fs::read_dir(self.log_dir())? {
            let name = dir_entry?.file_name().to_string_lossy().into_owned();
            if let Some(first) = name.strip_suffix(SEGMENT_SUFFIX).and_then(|stem| stem.parse::<u64>().ok()) {
                firsts.push(first);
            }
        }
        firsts.sort_unstable();
        let purged_index = self.last_purged.map(|log_id| log_id.index);
        for (position, &first) in firsts.iter().enumerate() {
            let is_last = position + 1 == firsts.len();
            let length = self.recover_segment(first, is_last, purged_index)?;
            self.segments.insert(first, length);
        }
        if let Some(&first) = self.segments.keys().next_back() {
            let file = OpenOptions::new().append(true).open(self.segment_path(first))?;
            self.active = Some((first, file));
        }
        if let (Some(purged), Some((&first, _))) = (purged_index, self.entries.first_key_value()) {
            if first != purged + 1 {
                return Err(corrupt(format!("log starts at {first} but was purged up to {purged}")));
            }
        }
        Ok(())
    }

    /// Reads one segment into memory; returns its valid length.
    fn recover_segment(&mut self, first: u64, is_last: bool, purged_index: Option<u64>) -> io::Result<u64> {
        let path = self.segment_path(first);
        let bytes = fs::read(&path)?;
        let mut offset = 0usize;
        while offset < bytes.len() {
            let Some(payload) = parse_record(&bytes[offset..]) else {
                if !is_last {
                    return Err(corrupt(format!("bad record in sealed segment {} at {offset}", path.display())));
                }
                // A torn tail: never acknowledged, so cut it off before anything is appended.
                tracing::warn!(segment = %path.display(), offset, "cutting torn log tail");
                let file = OpenOptions::new().write(true).open(&path)?;
                file.set_len(offset as u64)?;
                file.sync_all()?;
                break;
            };
            let entry: Entry<TypeConfig> =
                serde_json::from_slice(payload).map_err(|error| corrupt(format!("undecodable entry: {error}")))?;
            let index = entry.log_id.index;
            // Only live entries must be contiguous: after a snapshot install the log jumps
            // from a purged prefix to the entry after the snapshot.
            if purged_index.is_none_or(|purged| index > purged) {
                if let Some((&previous, _)) = self.entries.last_key_value() {
                    if index != previous + 1 {
                        return Err(corrupt(format!("log index {index} follows {previous}")));
                    }
                }
                self.positions.insert(index, (first, offset as u64));
                self.entries.insert(index, entry);
            }
            offset += RECORD_HEADER_BYTES + payload.len();
        }
        Ok(offset as u64)
    }

    fn append_entries(&mut self, entries: Vec<Entry<TypeConfig>>) -> io::Result<()> {
        let mut new_segment = false;
        for entry in entries {
            let index = entry.log_id.index;
            match (self.entries.last_key_value(), self.last_purged) {
                (Some((&last, _)), _) => assert_eq!(index, last + 1, "the log must not have holes"),
                (None, Some(purged)) => assert!(index > purged.index, "append at {index} below the purge point"),
                (None, None) => {}
            }
            let payload = serde_json::to_vec(&entry).map_err(io::Error::other)?;
            assert!(payload.len() <= ENTRY_BYTES_MAX, "log entry of {} bytes", payload.len());
            // Everything in the active segment is purged (e.g. a snapshot was installed): the
            // log may continue at a much later index, so start a segment named after it.
            let roll = match &self.active {
                None => true,
                Some((first, _)) => {
                    self.segments[first] >= SEGMENT_BYTES_MAX || (self.entries.is_empty() && self.segments[first] > 0)
                }
            };
            if roll {
                self.roll(index)?;
                new_segment = true;
            }
            let (first, file) = self.active.as_mut().expect("rolled above");
            let length = self.segments.get_mut(first).expect("active segment is listed");
            file.write_all(&record(&payload))?;
            self.positions.insert(index, (*first, *length));
            *length += (RECORD_HEADER_BYTES + payload.len()) as u64;
            self.entries.insert(index, entry);
        }
        if let Some((_, file)) = &self.active {
            file.sync_data()?;
        }
        if new_segment {
            sync_dir(&self.log_dir())?;
        }
        Ok(())
    }

    fn roll(&mut self, first_index: u64) -> io::Result<()> {
        if let Some((_, file)) = &self.active {
            file.sync_data()?;
        }
        let path = self.segment_path(first_index);
        // A segment is only ever created for the next index, so the name must be new.
        let file = OpenOptions::new().create_new(true).append(true).open(&path)?;
        self.segments.insert(first_index, 0);
        self.active = Some((first_index, file));
        Ok(())
    }

    /// Removes entries `since..`: cuts the segment holding `since`, deletes later ones.
    fn truncate(&mut self, since: u64) -> io::Result<()> {
        let Some(&(segment, offset)) = self.positions.get(&since) else {
            return Ok(());
        };
        let later: Vec<u64> = self.segments.range(segment + 1..).map(|(&first, _)| first).collect();
        for first in later {
            fs::remove_file(self.segment_path(first))?;
            self.segments.remove(&first);
        }
        let file = OpenOptions::new().append(true).open(self.segment_path(segment))?;
        file.set_len(offset)?;
        file.sync_all()?;
        sync_dir(&self.log_dir())?;
        self.segments.insert(segment, offset);
        self.active = Some((segment, file));
        self.entries.split_off(&since);
        self.positions.split_off(&since);
        assert!(self.entries.last_key_value().is_none_or(|(&last, _)| last < since));
        Ok(())
    }

    /// Forgets entries `..=log_id.index`; deletes segments that hold nothing newer.
    fn purge(&mut self, log_id: LogId<NodeId>) -> io::Result<()> {
        assert!(self.last_purged.is_none_or(|purged| purged.index <= log_id.index), "purge goes forward");
        write_json_atomic(&self.dir, "purged.json", &log_id)?;
        self.last_purged = Some(log_id);
        self.entries = self.entries.split_off(&(log_id.index + 1));
        self.positions = self.positions.split_off(&(log_id.index + 1));
        let active = self.active.as_ref().map(|(first, _)| *first);
        let firsts: Vec<u64> = self.segments.keys().copied().collect();
        for pair in firsts.windows(2) {
            // Segment pair[0] holds pair[0]..pair[1]: obsolete when all of it is purged.
            if pair[1] <= log_id.index + 1 && Some(pair[0]) != active {
                fs::remove_file(self.segment_path(pair[0]))?;
                self.segments.remove(&pair[0]);
            }
        }
        Ok(())
    }

    fn last_log_id(&self) -> Option<LogId<NodeId>> {
        self.entries.last_key_value().map(|(_, entry)| entry.log_id).or(self.last_purged)
    }
}

fn record(payload: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(RECORD_HEADER_BYTES + payload.len());
    record.extend_from_slice(&u32::try_from(payload.len()).expect("bounded by ENTRY_BYTES_MAX").to_le_bytes());
    record.extend_from_slice(&crc_fast::crc32_iscsi(payload).to_le_bytes());
    record.extend_from_slice(payload);
    record
}

/// The payload of the record at the start of `bytes`, or `None` if it is torn or corrupt.
fn parse_record(bytes: &[u8]) -> Option<&[u8]> {
    let header = bytes.get(..RECORD_HEADER_BYTES)?;
    let length = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    if length == 0 || length > ENTRY_BYTES_MAX {
        return None;
    }
    let payload = bytes.get(RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + length)?;
    (crc_fast::crc32_iscsi(payload) == crc).then_some(payload)
}

fn corrupt(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Fsyncs a directory so a created, renamed or removed name in it is durable.
/// `create_dir_all` that fsyncs the parent of every directory it created: a raft log whose
/// directory a power cut takes back would forget the votes and entries it promised.
pub(crate) fn create_dir_durably(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    create_dir_durably(parent)?;
    match fs::create_dir(dir) {
        Err(error) if !(error.kind() == io::ErrorKind::AlreadyExists && dir.is_dir()) => return Err(error),
        _ => {}
    }
    sync_dir(parent)
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replaces `dir/name` with `bytes` so a crash leaves the old or the new content, never a mix.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let temporary = dir.join(format!("{name}.tmp"));
    let mut file = File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&temporary, dir.join(name))?;
    sync_dir(dir)
}

fn write_json_atomic<T: Serialize>(dir: &Path, name: &str, value: &T) -> io::Result<()> {
    write_atomic(dir, name, &serde_json::to_vec(value).map_err(io::Error::other)?)
}

fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map(Some).map_err(|error| corrupt(format!("{}: {error}", path.display())))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let inner = self.lock();
        Ok(inner.entries.range(range).map(|(_, entry)| entry.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let inner = self.lock();
        Ok(LogState { last_purged_log_id: inner.last_purged, last_log_id: inner.last_log_id() })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        let mut inner = self.lock();
        write_json_atomic(&inner.dir, "vote.json", vote).map_err(|error| StorageIOError::write_vote(&error))?;
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        Ok(self.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        let mut inner = self.lock();
        write_json_atomic(&inner.dir, "committed.json", &committed).map_err(|error| StorageIOError::write(&error))?;
        inner.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        Ok(self.lock().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        let result = self.lock().append_entries(entries);
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                let storage_error = StorageIOError::write_logs(&error).into();
                callback.log_io_completed(Err(error));
                Err(storage_error)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.lock().truncate(log_id.index).map_err(|error| StorageIOError::write_logs(&error).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.lock().purge(log_id).map_err(|error| StorageIOError::write_logs(&error).into())
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry { log_id: LogId::new(CommittedLeaderId::new(term, 1), index), payload: EntryPayload::Blank }
    }

    fn indexes(store: &LogStore) -> Vec<u64> {
        store.lock().entries.keys().copied().collect()
    }

    #[test]
    fn append_truncate_purge_and_recover() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(dir.path()).unwrap();
        store.lock().append_entries((1..=10).map(|index| entry(1, index)).collect()).unwrap();
        store.lock().truncate(8).unwrap();
        store.lock().append_entries(vec![entry(2, 8)]).unwrap();
        store.lock().purge(LogId::new(CommittedLeaderId::new(1, 1), 3)).unwrap();
        assert_eq!(indexes(&store), (4..=8).collect::<Vec<_>>());
        drop(store);
        let store = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&store), (4..=8).collect::<Vec<_>>());
        assert_eq!(store.lock().last_log_id().unwrap().leader_id.term, 2);
    }

    #[test]
    fn torn_tail_is_cut_and_appends_continue() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(dir.path()).unwrap();
        store.lock().append_entries((1..=3).map(|index| entry(1, index)).collect()).unwrap();
        let segment = store.lock().segment_path(1);
        drop(store);
        let length = fs::metadata(&segment).unwrap().len();
        OpenOptions::new().write(true).open(&segment).unwrap().set_len(length - 3).unwrap();
        let store = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&store), vec![1, 2]);
        store.lock().append_entries(vec![entry(1, 3)]).unwrap();
        drop(store);
        assert_eq!(indexes(&LogStore::open(dir.path()).unwrap()), vec![1, 2, 3]);
    }

    #[test]
    fn a_bad_record_in_a_sealed_segment_stops_startup() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(dir.path()).unwrap();
        store.lock().append_entries(vec![entry(1, 1), entry(1, 2)]).unwrap();
        store.lock().roll(3).unwrap();
        store.lock().append_entries(vec![entry(1, 3)]).unwrap();
        let sealed = store.lock().segment_path(1);
        drop(store);
        let mut bytes = fs::read(&sealed).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x40;
        fs::write(&sealed, bytes).unwrap();
        let error = LogStore::open(dir.path()).err().expect("corruption is refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn log_continues_after_a_purge_past_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(dir.path()).unwrap();
        store.lock().append_entries((1..=5).map(|index| entry(1, index)).collect()).unwrap();
        // As after installing a snapshot up to 59: everything is purged, the log goes on at 60.
        store.lock().purge(LogId::new(CommittedLeaderId::new(2, 1), 59)).unwrap();
        store.lock().append_entries((60..=62).map(|index| entry(2, index)).collect()).unwrap();
        store.lock().purge(LogId::new(CommittedLeaderId::new(2, 1), 60)).unwrap();
        assert_eq!(store.lock().segments.keys().copied().collect::<Vec<_>>(), vec![60]);
        drop(store);
        let store = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&store), vec![61, 62]);
        assert_eq!(store.lock().last_log_id().unwrap().index, 62);
    }

    #[test]
    fn segments_roll_and_purge_deletes_old_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(dir.path()).unwrap();
        for index in 1..=4 {
            store.lock().append_entries(vec![entry(1, index)]).unwrap();
            store.lock().roll(index + 1).unwrap();
        }
        assert_eq!(store.lock().segments.len(), 5);
        store.lock().purge(LogId::new(CommittedLeaderId::new(1, 1), 2)).unwrap();
        assert_eq!(store.lock().segments.keys().copied().collect::<Vec<_>>(), vec![3, 4, 5]);
        drop(store);
        assert_eq!(indexes(&LogStore::open(dir.path()).unwrap()), vec![3, 4]);
    }
}
