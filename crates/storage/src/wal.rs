//! The write-ahead log: one `fdatasync` per group-commit round, whatever the number of
//! partitions it covers.
//!
//! Without it, a round fsyncs every partition it covers, one file each: at 100 partitions
//! and 10k small batches a second that is ~10k fsyncs a second, each a device flush and two
//! context switches, and at 10,000 partitions a produce request that touches 40 partitions
//! waits for 40 of them. With it, the syncer copies each covered partition's batches
//! (appended to its segment's page cache as before) into one record of the WAL, writes the
//! round's records with one `pwrite` and makes them durable with one `fdatasync` of the
//! WAL file; only then do the partitions' high watermarks move. The segment files are made
//! durable later, off the acknowledgement path, by the checkpointer: when a WAL file is
//! full, every partition it holds records of is fsynced, and then the file is deleted.
//!
//! Durability contract: a batch is acknowledged only once its WAL record is fsynced (and
//! the WAL file's directory entry was fsynced when the file was created). At startup,
//! before any partition opens, [`replay`] appends every batch of the WAL that its
//! partition's recovered log lacks, closes (fsyncs) those partitions and deletes the WAL.
//!
//! What makes replay exact:
//! - WAL files are deleted strictly in order, so the files left are a suffix of the log;
//!   records are applied in WAL order.
//! - A batch already in the recovered log (by offset) is skipped; the segment files and
//!   the WAL hold the same bytes for it.
//! - A follower that cuts its log ([`crate::Partition::truncate_to`]) logs a
//!   [`Control::Truncate`] record before it appends anything past the cut, so the old tail
//!   replayed from earlier records is cut again before the new one is appended.
//! - A deleted partition logs [`Control::Forget`] before its directory goes: its earlier
//!   records never replay into a later partition of the same name.
//!
//! Rounds are written with direct I/O (`O_DIRECT`) where the filesystem's direct I/O is
//! trusted ([`crate::durable::direct_io_trusted`]: ext4, xfs, btrfs, f2fs): the
//! round is gathered into a page-aligned buffer and written straight to the device, so
//! the `fdatasync` that follows is only the device's cache flush. A round that fits one
//! write (most of them) is written with `RWF_DSYNC` instead of a write and an `fdatasync`:
//! one system call, one sleep of the WAL thread, and one FUA write where the device has
//! it. Through the page cache
//! each round would be copied into page-cache folios, written back by that `fdatasync`
//! (the kernel's writeback path cost more CPU than the rest of the WAL thread), and kept
//! in memory where it crowds out what consumers read. Any other filesystem (FUSE, NFS,
//! tmpfs) gets the same writes through the page cache.
//!
//! WAL files are recycled: a checkpointed file becomes the spare that the next rotation
//! renames into place (the first spare is zero-filled in the background), so an `fdatasync`
//! of the WAL overwrites allocated blocks and never waits for a journal commit of the
//! file's size. Each record names its file's sequence number, so what an earlier use of a
//! recycled file left behind is never read as a record.
//!
//! Record layout (little-endian): `len: u32` (bytes after this field), `crc32c: u32` (of the
//! body), body = `sequence: u64` (its file's), `kind: u8`, `path_len: u16`, `path` (the
//! partition directory relative to the data directory), payload (batches, or the
//! truncation offset). A zero length ends a file; so does a record whose length, CRC or
//! sequence does not hold (an earlier use's bytes, or the torn tail of the newest file,
//! written but never acknowledged). Replay reports records of a file found past the point
//! where it stopped: a torn last round can leave them, a filesystem that lost acknowledged
//! writes does.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::checksum::{crc32c, crc32c_append};
use crate::log::wal_link::Control;
use crate::log::{CheckpointSync, LogConfig, Partition};

/// A WAL file is closed (and handed to the checkpointer) once it holds this much, by
/// default ([`WalWriter::start`] takes another size).
pub const WAL_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// The smallest WAL file size accepted: every file is a checkpoint of all the partitions it
/// covers, so smaller files mean more fsyncs of segment files.
pub const WAL_FILE_BYTES_MIN: u64 = 1024 * 1024;

/// The WAL directory's name inside a [`crate::LogManager`]'s root.
pub const WAL_DIR: &str = "wal";
const WAL_SUFFIX: &str = ".wal";
const RECORD_PREFIX_BYTES: usize = 8;
/// sequence + kind + path length.
const BODY_HEADER_BYTES: usize = 8 + 1 + 2;
/// The recycled (or zero-filled) file the next rotation renames into place.
const SPARE_FILE: &str = "spare";
const SPARE_TMP_FILE: &str = "spare.tmp";
/// A zero-filled spare is prepared only when the disk has this many times the file size
/// free (without one, the next file grows as it is written).
const SPARE_FREE_FILES_MIN: u64 = 16;
/// Threads fsyncing partitions in parallel for a checkpoint.
const CHECKPOINT_THREADS: usize = 8;
/// How long a checkpoint that could not finish (a roll that could not complete) waits
/// before it is tried again.
const CHECKPOINT_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// How often a checkpoint that keeps failing to finish is reported at warn level (with
/// the partitions' errors); the tries in between log at debug. A disk that stays full
/// would otherwise log a line per partition every [`CHECKPOINT_RETRY_INTERVAL`].
const CHECKPOINT_RETRY_REPORT_PERIOD: Duration = Duration::from_secs(60);
/// How often the WAL thread hands the partitions it logged since to the steady writeback
/// (at most one such job is queued at a time).
const WRITEBACK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);
/// Rounds are written in whole pages of this size (see [`WalWriter::write_round`]); it is
/// also the alignment of the write buffer's memory, as direct I/O needs.
const WAL_PAGE_BYTES: u64 = 4096;
/// A round is written in pieces of at most this much (the write buffer's size; a multiple
/// of [`WAL_PAGE_BYTES`]).
const WAL_WRITE_CHUNK_BYTES: usize = 2 * 1024 * 1024;
const _: () = assert!(WAL_WRITE_CHUNK_BYTES.is_multiple_of(WAL_PAGE_BYTES as usize));
/// The largest record replay accepts (a round's batches of one partition).
const RECORD_BYTES_MAX: usize = 1 << 30;

const KIND_BATCHES: u8 = 1;
const KIND_TRUNCATE: u8 = 2;
const KIND_FORGET: u8 = 3;

/// Appends to `buf` the header of one record of WAL file `sequence` whose payload is
/// `payload_len` bytes, up to where that payload starts, with its CRC left to [`seal`].
/// Returns where the header starts in `buf`.
fn encode_unsealed_header(buf: &mut Vec<u8>, sequence: u64, path: &str, kind: u8, payload_len: usize) -> usize {
    let path_len = u16::try_from(path.len()).expect("partition paths are short");
    let body_len = BODY_HEADER_BYTES + path.len() + payload_len;
    let len = u32::try_from(4 + body_len).expect("a WAL record fits in 4 GiB");
    let start = buf.len();
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&sequence.to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(&path_len.to_le_bytes());
    buf.extend_from_slice(path.as_bytes());
    start
}

/// Writes into `header` (from [`encode_unsealed_header`]) the CRC of its record, whose
/// payload is `payload`, in parts.
fn seal<'a>(header: &mut [u8], payload: impl Iterator<Item = &'a [u8]>) {
    let crc = payload.fold(crc32c(&header[RECORD_PREFIX_BYTES..]), crc32c_append);
    header[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Appends one whole record of WAL file `sequence` to `buf`.
fn encode_record(buf: &mut Vec<u8>, sequence: u64, path: &str, kind: u8, payload: &[u8]) {
    let start = encode_unsealed_header(buf, sequence, path, kind, payload.len());
    seal(&mut buf[start..], std::iter::once(payload));
    buf.extend_from_slice(payload);
}

/// Appends to `buf` the header of a record of `batches` (in parts, which follow it in the
/// round, each where it lies). Its CRC is left to [`WalWriter::write_round`], which
/// computes it just before it gathers the record into its write buffer: the gathering then
/// reads the batches from the cache that checksumming them brought them into, rather than
/// from memory a second time.
pub(crate) fn encode_batches_header<'a>(
    buf: &mut Vec<u8>,
    sequence: u64,
    path: &str,
    batches: impl Iterator<Item = &'a [u8]>,
) {
    encode_unsealed_header(buf, sequence, path, KIND_BATCHES, batches.map(<[u8]>::len).sum());
}

/// One record of a round, as [`WalWriter::write_round`] takes it.
pub(crate) enum RoundRecord<'a> {
    /// Whole records (controls), their CRCs in place.
    Sealed(&'a [u8]),
    /// A header from [`encode_batches_header`] and its batches.
    Batches { header: &'a [u8], batches: Vec<&'a [u8]> },
}

impl RoundRecord<'_> {
    fn len(&self) -> usize {
        match self {
            RoundRecord::Sealed(bytes) => bytes.len(),
            RoundRecord::Batches { header, batches } => header.len() + batches.iter().map(|b| b.len()).sum::<usize>(),
        }
    }
}

#[cfg(test)]
fn encode_batches(buf: &mut Vec<u8>, sequence: u64, path: &str, batches: &[u8]) {
    encode_record(buf, sequence, path, KIND_BATCHES, batches);
}

pub(crate) fn encode_control(buf: &mut Vec<u8>, sequence: u64, path: &str, control: Control) {
    match control {
        Control::Truncate(offset) => encode_record(buf, sequence, path, KIND_TRUNCATE, &offset.to_le_bytes()),
        Control::Forget => encode_record(buf, sequence, path, KIND_FORGET, &[]),
    }
}

/// One decoded record (borrowing the file's bytes).
#[derive(Debug, PartialEq)]
enum Record<'a> {
    Batches(&'a [u8]),
    Truncate(i64),
    Forget,
}

/// Decodes the records of WAL file `sequence`, up to the first byte that is not one of its
/// records. Returns them with the position where decoding stopped.
fn decode_records(data: &[u8], sequence: u64) -> (Vec<(&str, Record<'_>)>, usize) {
    let mut records = Vec::new();
    let mut position = 0;
    loop {
        let Some(prefix) = data.get(position..position + RECORD_PREFIX_BYTES) else {
            return (records, position);
        };
        let len = u32::from_le_bytes(prefix[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(prefix[4..8].try_into().expect("4 bytes"));
        let end = position + 4 + len;
        let body = match data.get(position + RECORD_PREFIX_BYTES..end) {
            Some(body) if len <= RECORD_BYTES_MAX && body.len() >= BODY_HEADER_BYTES && crc32c(body) == crc => body,
            _ => return (records, position),
        };
        if u64::from_le_bytes(body[..8].try_into().expect("8 bytes")) != sequence {
            return (records, position);
        }
        let path_len = u16::from_le_bytes([body[9], body[10]]) as usize;
        let Some(path) =
            body.get(BODY_HEADER_BYTES..BODY_HEADER_BYTES + path_len).and_then(|p| std::str::from_utf8(p).ok())
        else {
            return (records, position);
        };
        let payload = &body[BODY_HEADER_BYTES + path_len..];
        let record = match (body[8], payload.len()) {
            (KIND_BATCHES, _) => Record::Batches(payload),
            (KIND_TRUNCATE, 8) => Record::Truncate(i64::from_le_bytes(payload.try_into().expect("8 bytes"))),
            (KIND_FORGET, 0) => Record::Forget,
            _ => return (records, position),
        };
        records.push((path, record));
        position = end;
    }
}

/// The position of the first record of WAL file `sequence` that starts after `from`, if
/// any: records past the point where decoding stopped.
fn next_record_after(data: &[u8], from: usize, sequence: u64) -> Option<usize> {
    let sequence_bytes = sequence.to_le_bytes();
    (from + 1..data.len().saturating_sub(RECORD_PREFIX_BYTES + BODY_HEADER_BYTES)).find(|&at| {
        let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
        len >= 4 + BODY_HEADER_BYTES
            && at + 4 + len <= data.len()
            && data[at + RECORD_PREFIX_BYTES..at + RECORD_PREFIX_BYTES + 8] == sequence_bytes
            && !decode_records(&data[at..at + 4 + len], sequence).0.is_empty()
    })
}

fn wal_file_name(sequence: u64) -> String {
    format!("{sequence:020}{WAL_SUFFIX}")
}

/// The WAL files in `dir`, oldest first.
fn list_wal_files(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(files),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(sequence) = name.to_str().and_then(|n| n.strip_suffix(WAL_SUFFIX)).and_then(|s| s.parse().ok()) else {
            continue;
        };
        files.push((sequence, entry.path()));
    }
    files.sort();
    Ok(files)
}

/// The path a partition's records carry: its directory relative to `base` when below it.
pub(crate) fn record_path(base: &Path, dir: &Path) -> String {
    dir.strip_prefix(base).unwrap_or(dir).to_string_lossy().into_owned()
}

/// What [`replay`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReplayOutcome {
    pub files: usize,
    pub records: usize,
    /// Partitions that took batches from the WAL (their recovered log lacked them).
    pub partitions_extended: usize,
    pub batches_appended: usize,
}

/// Applies the WAL in `dir` to the partitions (directories relative to `base`), makes
/// them durable and deletes the WAL. Runs before anything opens those partitions.
pub fn replay(dir: &Path, base: &Path) -> io::Result<ReplayOutcome> {
    let files = list_wal_files(dir)?;
    let mut outcome = ReplayOutcome { files: files.len(), ..ReplayOutcome::default() };
    if files.is_empty() {
        return Ok(outcome);
    }
    let contents: Vec<Vec<u8>> = files.iter().map(|(_, path)| std::fs::read(path)).collect::<io::Result<_>>()?;
    let mut records = Vec::new();
    for ((sequence, path), data) in files.iter().zip(&contents) {
        let (decoded, stopped_at) = decode_records(data, *sequence);
        tracing::debug!(file = %path.display(), records = decoded.len(), bytes = stopped_at, "read WAL file");
        if let Some(next) = next_record_after(data, stopped_at, *sequence) {
            // The torn last round of a crash can look the same (a later piece of its write
            // reached the disk, an earlier one did not); anything else lost acknowledged data.
            tracing::error!(
                file = %path.display(),
                stopped_at,
                next_record_at = next,
                "WAL file holds records of its own after bytes that are not one: replay stops at the first; unless they are the torn last round of a crash, the filesystem lost acknowledged writes"
            );
        }
        records.extend(decoded);
    }
    outcome.records = records.len();
    // A partition deleted (and maybe created again) takes only the records after its last Forget.
    let mut first_live: HashMap<&str, usize> = HashMap::new();
    for (i, (path, record)) in records.iter().enumerate() {
        if *record == Record::Forget {
            first_live.insert(path, i + 1);
        }
    }
    // Each partition's records, in WAL order; partitions are independent of each other.
    let mut by_partition: HashMap<&str, Vec<&Record>> = HashMap::new();
    for (i, (path, record)) in records.iter().enumerate() {
        if i < first_live.get(path).copied().unwrap_or(0) || *record == Record::Forget {
            continue;
        }
        by_partition.entry(path).or_default().push(record);
    }
    let work: Vec<(&str, Vec<&Record>)> = by_partition.into_iter().collect();
    let chunk = work.len().div_ceil(CHECKPOINT_THREADS).max(1);
    let replayed: Vec<io::Result<(usize, usize)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = work
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut totals = (0, 0);
                    for (path, records) in part {
                        let batches = replay_partition(&base.join(path), path, records)?;
                        totals.0 += usize::from(batches > 0);
                        totals.1 += batches;
                    }
                    Ok(totals)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("WAL replay thread panicked")).collect()
    });
    for result in replayed {
        let (extended, batches) = result?;
        outcome.partitions_extended += extended;
        outcome.batches_appended += batches;
    }
    for (_, file) in &files {
        std::fs::remove_file(file)?;
    }
    crate::durable::sync_dir(dir)?;
    Ok(outcome)
}

/// Applies one partition's records (in WAL order) to its recovered log; returns how many
/// batches it lacked. A log that changed is made durable before the WAL may go; one that
/// did not was made durable by opening it.
fn replay_partition(dir: &Path, path: &str, records: &[&Record]) -> io::Result<usize> {
    if !dir.is_dir() {
        return Ok(0);
    }
    let partition = Partition::open(dir, LogConfig::default())?;
    let now_ms = crate::now_ms();
    let mut appended_batches = 0;
    let mut changed = false;
    for record in records {
        match record {
            Record::Batches(batches) => {
                let before = partition.offsets().log_end_offset;
                let appended = partition
                    .append_replica(&Bytes::copy_from_slice(batches), now_ms)
                    .map_err(|error| io::Error::other(format!("replaying the WAL into {path}: {error}")))?;
                if appended.log_end_offset > before {
                    changed = true;
                    appended_batches += crate::batch::BatchIter::new(batches)
                        .filter_map(Result::ok)
                        .filter(|(header, _)| header.last_offset() >= before)
                        .count();
                }
            }
            Record::Truncate(offset) => {
                partition.truncate_to(*offset)?;
                changed = true;
            }
            Record::Forget => unreachable!("skipped by the caller"),
        }
    }
    if changed {
        match partition.sync_for_wal_checkpoint(true) {
            CheckpointSync::Synced => {}
            CheckpointSync::Retry => {
                return Err(io::Error::other(format!("could not finish a segment roll of {path} after WAL replay")))
            }
            CheckpointSync::Offline => {
                return Err(io::Error::other(format!("fsync of {path} after WAL replay failed")))
            }
        }
    }
    // Closed as at a clean shutdown (index and producer snapshot written): the broker's own
    // open, which follows, then trusts the active segment instead of scanning it again, which
    // kept restarts under load long. Only that: the data is durable already, so a close that
    // fails (a full disk refusing the index) costs the scan, not the start.
    if let Err(error) = partition.close() {
        tracing::warn!(partition = path, %error, "could not close a partition after WAL replay (its next open scans it)");
    }
    Ok(appended_batches)
}

/// Work for the checkpointer thread.
enum Job {
    /// Zero-fill the first spare of this many bytes (asked once the first file is a quarter
    /// full, so a broker that writes little never writes a spare).
    PrepareSpare(u64),
    /// A full WAL file and the partitions it holds records of.
    Checkpoint { file: PathBuf, partitions: Vec<Arc<Partition>> },
    /// Partitions logged since the last such job: write back what their files took
    /// ([`Partition::write_back`]); `queued` is cleared when done.
    WriteBack { partitions: Vec<Arc<Partition>>, queued: Arc<AtomicBool> },
    /// A partition that started a roll: its disk work ([`Partition::complete_roll`]).
    Roll(Arc<Partition>),
}

/// The WAL's file being written. Owned by the syncer's WAL thread.
pub(crate) struct WalWriter {
    dir: PathBuf,
    file: File,
    path: PathBuf,
    /// `file` was opened with `O_DIRECT`.
    direct: bool,
    /// The directory's filesystem is one whose direct I/O is trusted
    /// ([`crate::durable::direct_io_trusted`]).
    direct_allowed: bool,
    /// A file is closed once it holds this much.
    file_bytes: u64,
    /// Where a round is gathered before it is written.
    chunk: AlignedChunk,
    sequence: u64,
    position: u64,
    /// The bytes of the current file from the start of `position`'s page up to `position`:
    /// the next round rewrites them (unchanged) ahead of its records.
    tail_page: Vec<u8>,
    /// The header of the record being gathered, with its CRC ([`seal`]).
    sealed_header: Vec<u8>,
    /// Partitions with records in the current file (by address).
    touched: HashMap<usize, Arc<Partition>>,
    /// Partitions with records since the last writeback job (by address).
    unwritten_back: HashMap<usize, Arc<Partition>>,
    last_writeback: Instant,
    /// A writeback job is queued or running.
    writeback_queued: Arc<AtomicBool>,
    checkpoints: Option<mpsc::Sender<Job>>,
    spare_asked: bool,
    checkpointer: Option<std::thread::JoinHandle<()>>,
    /// An fsync failed (or a rotation): nothing written since may be trusted, every round fails.
    broken: bool,
    /// Rounds made durable by their one `RWF_DSYNC` write, with no `fdatasync`.
    rounds_write_synced: u64,
}

impl WalWriter {
    /// Starts a new WAL in `dir` (which replay has emptied) and its checkpointer thread; its
    /// files are closed once they hold `file_bytes` (at least [`WAL_FILE_BYTES_MIN`]).
    pub(crate) fn start(dir: &Path, file_bytes: u64) -> io::Result<WalWriter> {
        assert!(file_bytes >= WAL_FILE_BYTES_MIN, "a WAL file of {file_bytes} bytes is below the minimum");
        crate::durable::create_dir_all(dir)?;
        let sequence = list_wal_files(dir)?.last().map_or(0, |(sequence, _)| sequence + 1);
        discard_spare(dir)?;
        let direct_allowed = crate::durable::direct_io_trusted(dir);
        let (path, file, direct) = next_wal_file(dir, sequence, direct_allowed)?;
        tracing::info!(dir = %dir.display(), direct, direct_allowed, "write-ahead log started");
        let (sender, receiver) = mpsc::channel();
        let checkpoint_dir = dir.to_path_buf();
        let checkpointer = std::thread::Builder::new()
            .name("sluice-wal-checkpoint".into())
            .spawn(move || checkpointer(&checkpoint_dir, &receiver))?;
        Ok(WalWriter {
            dir: dir.to_path_buf(),
            file,
            path,
            direct,
            direct_allowed,
            file_bytes,
            chunk: AlignedChunk::new(),
            sequence,
            position: 0,
            tail_page: Vec::new(),
            sealed_header: Vec::new(),
            touched: HashMap::new(),
            unwritten_back: HashMap::new(),
            last_writeback: Instant::now(),
            writeback_queued: Arc::new(AtomicBool::new(false)),
            checkpoints: Some(sender),
            spare_asked: false,
            checkpointer: Some(checkpointer),
            broken: false,
            rounds_write_synced: 0,
        })
    }

    /// Hands a roll `partition` started to the checkpointer thread (see
    /// [`Partition::complete_roll`]); one that cannot be handed over (the WAL is closing)
    /// is finished by whatever needs it next.
    pub(crate) fn queue_roll(&self, partition: &Arc<Partition>) {
        if let Some(checkpoints) = &self.checkpoints {
            let _ = checkpoints.send(Job::Roll(partition.clone()));
        }
    }

    /// The sequence number the next round's records must carry.
    pub(crate) fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Writes one round's records and makes them durable. `partitions` are those with
    /// batches in it (the checkpointer fsyncs them before the file goes).
    ///
    /// The write covers whole pages: it starts at the page holding the current end (whose
    /// earlier bytes it rewrites as they are) and is padded with zeros to a page end (where
    /// replay stops, as at any byte that is not a record). A partial-page write to a page
    /// the kernel evicted would first read it from the disk, and a producer's round would
    /// then queue behind a catch-up reader's reads.
    ///
    /// A failed write (a full disk) is returned as it is and changes nothing: the next round
    /// writes at the same position, and the caller makes this round durable file by file
    /// instead. A failed fsync is marked as such ([`crate::durable::is_fsync_failure`]) and
    /// breaks the WAL for good.
    ///
    /// `records` are the round's records (headers and the partitions' pending batches, where
    /// they lie); they are gathered into the page-aligned write buffer,
    /// [`WAL_WRITE_CHUNK_BYTES`] at a time, each record of batches sealed just before.
    pub(crate) fn write_round(
        &mut self,
        records: &[RoundRecord<'_>],
        partitions: &[&Arc<Partition>],
    ) -> io::Result<()> {
        if self.broken {
            let error = io::Error::other("the WAL's fsync failed earlier; restart the broker to recover");
            return Err(io::Error::new(error.kind(), crate::durable::FsyncFailed::from(error)));
        }
        let page_start = self.position - self.tail_page.len() as u64;
        debug_assert_eq!(page_start % WAL_PAGE_BYTES, 0);
        let end = self.position + records.iter().map(|record| record.len() as u64).sum::<u64>();
        // Durable once written: by the write itself (RWF_DSYNC) or by an fdatasync after it.
        let durable = self.write_pages(page_start, end, records).and_then(|(tail_page, synced)| {
            if !synced {
                crate::durable::sync_data(&self.file)?;
            }
            Ok((tail_page, synced))
        });
        let (tail_page, synced) = match durable {
            Ok(written) => written,
            Err(error) => {
                // Pages that failed to sync may be lost whatever a retry says: stop for good.
                if crate::durable::is_fsync_failure(&error) {
                    self.broken = true;
                    tracing::error!(file = %self.path.display(), %error, "WAL fsync failed: every partition it serves goes offline");
                }
                return Err(error);
            }
        };
        self.rounds_write_synced += u64::from(synced);
        crate::segment::note_wal_round_bytes(usize::try_from(end - self.position).unwrap_or(usize::MAX));
        self.position = end;
        self.tail_page = tail_page;
        for partition in partitions {
            let key = Arc::as_ptr(partition) as usize;
            self.touched.entry(key).or_insert_with(|| (*partition).clone());
            self.unwritten_back.entry(key).or_insert_with(|| (*partition).clone());
        }
        if self.last_writeback.elapsed() >= WRITEBACK_INTERVAL && !self.writeback_queued.load(Ordering::Acquire) {
            self.last_writeback = Instant::now();
            if let Some(checkpoints) = &self.checkpoints {
                self.writeback_queued.store(true, Ordering::Release);
                let partitions = self.unwritten_back.drain().map(|(_, partition)| partition).collect();
                let _ = checkpoints.send(Job::WriteBack { partitions, queued: self.writeback_queued.clone() });
            }
        }
        if !self.spare_asked && self.position >= self.file_bytes / 4 {
            self.spare_asked = true;
            if let Some(checkpoints) = &self.checkpoints {
                let _ = checkpoints.send(Job::PrepareSpare(self.file_bytes));
            }
        }
        if self.position >= self.file_bytes {
            // This round is durable either way; a failed rotation fails the next ones.
            if let Err(error) = self.rotate() {
                self.broken = true;
                tracing::error!(dir = %self.dir.display(), %error, "could not start the next WAL file");
            }
        }
        Ok(())
    }

    /// Writes the current file's tail page and then `records` from `page_start`, padded with
    /// zeros to a page end (`end` is where the records end). Returns the bytes of the last,
    /// partly filled page (the next round rewrites them ahead of its records) and whether
    /// the round is durable already: a round written in one direct write is written with
    /// `RWF_DSYNC` ([`crate::durable::write_data_synced`]), so no `fdatasync` follows it.
    /// (Only then: the flag's FUA write makes durable that write alone, not earlier ones.)
    fn write_pages(&mut self, page_start: u64, end: u64, records: &[RoundRecord<'_>]) -> io::Result<(Vec<u8>, bool)> {
        let mut gather = Gather {
            chunk: self.chunk.as_mut_slice(),
            offset: page_start,
            filled: 0,
            file: &mut self.file,
            direct: &mut self.direct,
            path: &self.path,
        };
        gather.push(&self.tail_page)?;
        for record in records {
            match record {
                RoundRecord::Sealed(bytes) => gather.push(bytes)?,
                RoundRecord::Batches { header, batches } => {
                    let sealed = &mut self.sealed_header;
                    sealed.clear();
                    sealed.extend_from_slice(header);
                    seal(sealed, batches.iter().copied());
                    gather.push(sealed)?;
                    for batch in batches {
                        gather.push(batch)?;
                    }
                }
            }
        }
        let (offset, filled) = (gather.offset, gather.filled);
        let chunk = self.chunk.as_mut_slice();
        debug_assert_eq!(offset + filled as u64, end);
        // Chunks end on page boundaries, so the last partial page is in this chunk.
        let tail_len = (end % WAL_PAGE_BYTES) as usize;
        let tail_page = chunk[filled - tail_len..filled].to_vec();
        let padded = filled.div_ceil(WAL_PAGE_BYTES as usize) * WAL_PAGE_BYTES as usize;
        chunk[filled..padded].fill(0);
        if padded == 0 {
            return Ok((tail_page, false));
        }
        let one_write = offset == page_start;
        if one_write && self.direct && crate::durable::write_data_synced(&self.file, &chunk[..padded], offset)? {
            return Ok((tail_page, true));
        }
        write_pages_at(&mut self.file, &mut self.direct, &self.path, &chunk[..padded], offset)?;
        Ok((tail_page, false))
    }

    /// The current file is written with direct I/O (for tests and the startup log).
    #[cfg(test)]
    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }

    /// Starts the next file and hands the full one to the checkpointer.
    fn rotate(&mut self) -> io::Result<()> {
        let (path, file, direct) = next_wal_file(&self.dir, self.sequence + 1, self.direct_allowed)?;
        let full = std::mem::replace(&mut self.path, path);
        self.file = file;
        self.direct = direct;
        self.sequence += 1;
        self.position = 0;
        self.tail_page.clear();
        let partitions = self.touched.drain().map(|(_, partition)| partition).collect();
        if let Some(checkpoints) = &self.checkpoints {
            let _ = checkpoints.send(Job::Checkpoint { file: full, partitions });
        }
        Ok(())
    }

    /// Stops the checkpointer after the files it was handed (the current file stays for
    /// replay at the next start).
    pub(crate) fn shutdown(&mut self) {
        self.checkpoints = None;
        if let Some(handle) = self.checkpointer.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for WalWriter {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A buffer of [`WAL_WRITE_CHUNK_BYTES`] whose memory starts on a page boundary, as direct
/// I/O needs.
struct AlignedChunk {
    storage: Vec<u8>,
    start: usize,
}

impl AlignedChunk {
    fn new() -> AlignedChunk {
        let storage = vec![0; WAL_WRITE_CHUNK_BYTES + WAL_PAGE_BYTES as usize];
        let start = storage.as_ptr().align_offset(WAL_PAGE_BYTES as usize);
        AlignedChunk { storage, start }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + WAL_WRITE_CHUNK_BYTES]
    }
}

/// A round's bytes being gathered into the write buffer, which is written out each time it
/// is full.
struct Gather<'a> {
    chunk: &'a mut [u8],
    /// The file offset of `chunk[0]`.
    offset: u64,
    /// How much of `chunk` is filled.
    filled: usize,
    file: &'a mut File,
    direct: &'a mut bool,
    path: &'a Path,
}

impl Gather<'_> {
    fn push(&mut self, mut part: &[u8]) -> io::Result<()> {
        while !part.is_empty() {
            let take = part.len().min(self.chunk.len() - self.filled);
            self.chunk[self.filled..self.filled + take].copy_from_slice(&part[..take]);
            self.filled += take;
            part = &part[take..];
            if self.filled == self.chunk.len() {
                write_pages_at(self.file, self.direct, self.path, self.chunk, self.offset)?;
                self.offset += self.filled as u64;
                self.filled = 0;
            }
        }
        Ok(())
    }
}

/// Writes whole pages of `data` at `offset` (both page-aligned, as is `data`'s memory). A
/// file opened with `O_DIRECT` whose filesystem then refuses the write (`EINVAL`) is
/// reopened without it and written through the page cache from then on.
fn write_pages_at(file: &mut File, direct: &mut bool, path: &Path, data: &[u8], offset: u64) -> io::Result<()> {
    debug_assert!(offset.is_multiple_of(WAL_PAGE_BYTES) && (data.len() as u64).is_multiple_of(WAL_PAGE_BYTES));
    debug_assert!((data.as_ptr() as usize).is_multiple_of(WAL_PAGE_BYTES as usize));
    match file.write_all_at(data, offset) {
        Err(error) if *direct && error.raw_os_error() == Some(libc::EINVAL) => {
            tracing::warn!(file = %path.display(), %error, "direct I/O refused: WAL writes go through the page cache");
            *file = OpenOptions::new().read(true).write(true).open(path)?;
            *direct = false;
            file.write_all_at(data, offset)
        }
        result => result,
    }
}

/// Opens a WAL file for rounds: with `O_DIRECT` when `direct_allowed` and the filesystem
/// takes it.
fn open_for_rounds(path: &Path, direct_allowed: bool) -> io::Result<(File, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    if !direct_allowed {
        return Ok((OpenOptions::new().read(true).write(true).open(path)?, false));
    }
    match OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(path) {
        Ok(file) => Ok((file, true)),
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
            Ok((OpenOptions::new().read(true).write(true).open(path)?, false))
        }
        Err(error) => Err(error),
    }
}

/// Puts WAL file `sequence` in place: the spare renamed (its stale bytes carry older
/// sequence numbers), or a new empty file. Its directory entry is durable before any
/// record in it can be acknowledged. Returns whether it is written with direct I/O.
fn next_wal_file(dir: &Path, sequence: u64, direct_allowed: bool) -> io::Result<(PathBuf, File, bool)> {
    let path = dir.join(wal_file_name(sequence));
    match std::fs::rename(dir.join(SPARE_FILE), &path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            OpenOptions::new().write(true).create_new(true).open(&path)?;
        }
        Err(error) => return Err(error),
    }
    let (file, direct) = open_for_rounds(&path, direct_allowed)?;
    crate::durable::sync_dir(dir)?;
    Ok((path, file, direct))
}

/// Deletes a spare (and a half-made one) left by an earlier run, before this run's first
/// file. Replay empties the directory, so every run numbers its files from 0 again, and a
/// spare recycled in an earlier run holds that run's records under the same numbers: read
/// on past this run's records (a round that ended on a page boundary has no zeros after
/// it), they would replay as this run's, an old truncation among them.
fn discard_spare(dir: &Path) -> io::Result<()> {
    let mut removed = false;
    for name in [SPARE_FILE, SPARE_TMP_FILE] {
        match std::fs::remove_file(dir.join(name)) {
            Ok(()) => removed = true,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    if removed {
        crate::durable::sync_dir(dir)?;
    }
    Ok(())
}

/// Writes a zero-filled spare of `file_bytes` (blocks allocated and durable), unless one is
/// there or the disk has less than [`SPARE_FREE_FILES_MIN`] times that free.
fn prepare_spare(dir: &Path, file_bytes: u64) -> io::Result<()> {
    if dir.join(SPARE_FILE).exists() || free_bytes(dir)? < SPARE_FREE_FILES_MIN * file_bytes {
        return Ok(());
    }
    let tmp = dir.join(SPARE_TMP_FILE);
    let file = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
    let zeros = vec![0u8; 1 << 20];
    for i in 0..file_bytes.div_ceil(zeros.len() as u64) {
        file.write_all_at(&zeros, i * zeros.len() as u64)?;
    }
    crate::durable::sync_data(&file)?;
    std::fs::rename(&tmp, dir.join(SPARE_FILE))
}

/// Bytes available to this process on `dir`'s filesystem.
fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: statvfs writes into the zeroed struct we own; `path` is a valid C string.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// Makes full WAL files unnecessary, oldest first: fsyncs every partition the file holds
/// records of, then recycles the file as the spare (or deletes it). A partition whose
/// fsync fails goes offline and the file (and every later one) stays, for replay at the
/// next start. A partition whose roll cannot complete for another reason (a full disk)
/// keeps the file (and every later one) until a later try, every
/// [`CHECKPOINT_RETRY_INTERVAL`], succeeds. Also zero-fills the first spare, completes
/// rolls (`Job::Roll`), and writes back what partitions logged since the last such job
/// (`Job::WriteBack`), so a checkpoint has little left to write.
fn checkpointer(dir: &Path, jobs: &mpsc::Receiver<Job>) {
    let mut stuck = false;
    // Full files not checkpointed yet, oldest first, and when to try the first again.
    let mut waiting: VecDeque<(PathBuf, Vec<Arc<Partition>>)> = VecDeque::new();
    let mut retry_at: Option<Instant> = None;
    let mut reports = RetryReports::default();
    loop {
        let job = match retry_at {
            // Files still waiting when the WAL closes stay, for replay at the next start.
            None => match jobs.recv() {
                Ok(job) => Some(job),
                Err(_) => break,
            },
            Some(at) => match jobs.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(job) => Some(job),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    retry_at = None;
                    None
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            },
        };
        match job {
            None => {} // time to try the first waiting file again
            Some(Job::PrepareSpare(file_bytes)) => {
                if let Err(error) = prepare_spare(dir, file_bytes) {
                    tracing::warn!(dir = %dir.display(), %error, "could not prepare a spare WAL file (new ones grow instead)");
                    let _ = std::fs::remove_file(dir.join(SPARE_TMP_FILE));
                }
                continue;
            }
            Some(Job::WriteBack { partitions, queued }) => {
                for partition in &partitions {
                    partition.write_back(false);
                }
                queued.store(false, Ordering::Release);
                continue;
            }
            Some(Job::Roll(partition)) => {
                if let Err(error) = partition.complete_roll() {
                    // Tried again when an append or the next checkpoint needs it.
                    tracing::warn!(dir = %partition.dir().display(), %error, "could not finish a segment roll");
                }
                continue;
            }
            Some(Job::Checkpoint { file, partitions }) => waiting.push_back((file, partitions)),
        }
        if stuck || retry_at.is_some() {
            continue;
        }
        while let Some((file, partitions)) = waiting.front() {
            let now = Instant::now();
            let report = reports.due(now);
            match checkpoint(dir, file, partitions, report, reports.retries) {
                CheckpointSync::Synced => {
                    let retries = reports.finished();
                    if retries > 0 {
                        tracing::info!(file = %file.display(), retries, "WAL checkpoint finished");
                    }
                    waiting.pop_front();
                }
                CheckpointSync::Retry => {
                    reports.failed(now, report);
                    retry_at = Some(Instant::now() + CHECKPOINT_RETRY_INTERVAL);
                    break;
                }
                CheckpointSync::Offline => {
                    stuck = true;
                    waiting.clear();
                    break;
                }
            }
        }
    }
    let _ = crate::durable::sync_dir(dir);
}

/// When a WAL checkpoint that keeps failing to finish is reported at warn level: its
/// first try, then once per [`CHECKPOINT_RETRY_REPORT_PERIOD`].
#[derive(Debug, Default)]
struct RetryReports {
    /// Tries of the first waiting file that did not finish.
    retries: u64,
    reported_at: Option<Instant>,
}

impl RetryReports {
    /// Whether a try starting at `now` is reported if it does not finish.
    fn due(&self, now: Instant) -> bool {
        self.reported_at.is_none_or(|at| now.saturating_duration_since(at) >= CHECKPOINT_RETRY_REPORT_PERIOD)
    }

    /// A try that started at `now` did not finish (`reported`: it was logged at warn level).
    fn failed(&mut self, now: Instant, reported: bool) {
        self.retries += 1;
        if reported {
            self.reported_at = Some(now);
        }
    }

    /// A try finished: returns how many tries before it did not, and starts over.
    fn finished(&mut self) -> u64 {
        std::mem::take(self).retries
    }
}

/// Checkpoints one full WAL file (see [`checkpointer`]): recycled once every partition
/// with records in it is synced. A try that does not finish is logged at warn level only
/// when `report` (`retries`: the earlier tries of this file that did not finish).
fn checkpoint(dir: &Path, file: &Path, partitions: &[Arc<Partition>], report: bool, retries: u64) -> CheckpointSync {
    let chunk = partitions.len().div_ceil(CHECKPOINT_THREADS).max(1);
    let outcome = std::thread::scope(|scope| {
        let handles: Vec<_> = partitions
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(|p| p.sync_for_wal_checkpoint(report)).collect::<Vec<_>>()))
            .collect();
        let outcomes = handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|_| vec![CheckpointSync::Offline]));
        outcomes.max().unwrap_or(CheckpointSync::Synced)
    });
    match outcome {
        CheckpointSync::Synced => {
            let spare = dir.join(SPARE_FILE);
            let recycled = if spare.exists() { std::fs::remove_file(file) } else { std::fs::rename(file, &spare) };
            if let Err(error) = recycled {
                tracing::warn!(file = %file.display(), %error, "could not recycle a checkpointed WAL file");
            }
        }
        CheckpointSync::Retry if report => {
            tracing::warn!(
                file = %file.display(),
                retries,
                "WAL checkpoint not finished: the file is kept and tried again every second (reported once a minute)"
            );
        }
        CheckpointSync::Retry => {
            tracing::debug!(file = %file.display(), retries, "WAL checkpoint not finished: tried again");
        }
        CheckpointSync::Offline => {
            tracing::error!(file = %file.display(), "WAL checkpoint failed: WAL files are kept until a restart");
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page_cache::{write_back, WRITEBACK_CHUNK_BYTES};

    #[test]
    fn a_checkpoint_retried_on_a_full_disk_is_reported_once_a_minute() {
        let mut reports = RetryReports::default();
        let start = Instant::now();
        assert!(reports.due(start), "the first try that fails is reported");
        reports.failed(start, true);
        // Tried every second: the next 59 tries are quiet, the one a minute on is reported.
        for second in 1..60 {
            let now = start + Duration::from_secs(second);
            assert!(!reports.due(now), "try {second} s after the report");
            reports.failed(now, false);
        }
        let minute = start + CHECKPOINT_RETRY_REPORT_PERIOD;
        assert!(reports.due(minute));
        reports.failed(minute, true);
        assert!(!reports.due(minute + Duration::from_secs(1)));
        assert_eq!(reports.finished(), 61, "the tries before the one that finished");
        assert!(reports.due(minute + Duration::from_secs(2)), "the next file's first failure is reported");
        assert_eq!(reports.retries, 0);
    }

    #[test]
    fn write_back_leaves_no_dirty_page_in_its_range() {
        let dir = tempfile::tempdir().unwrap();
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(dir.path().join("segment")).unwrap();
        let bytes = 3 * WRITEBACK_CHUNK_BYTES + 4096;
        file.write_all_at(&vec![7u8; bytes as usize], 0).unwrap();
        let dirty = |from, to| {
            crate::page_cache::cachestat(&file, from, to - from).map(|stat| stat.nr_dirty + stat.nr_writeback)
        };
        let Some(before) = dirty(0, bytes) else { return }; // no cachestat (Linux < 6.5)
        assert!(before > 0, "a fresh write leaves dirty pages");
        write_back(&file, 0, 2 * WRITEBACK_CHUNK_BYTES + 4096);
        assert_eq!(dirty(0, 2 * WRITEBACK_CHUNK_BYTES + 4096), Some(0), "the range is on the disk");
        assert!(dirty(2 * WRITEBACK_CHUNK_BYTES + 4096, bytes).unwrap() > 0, "bytes past it are not written");
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_ends_the_file() {
        let mut buf = Vec::new();
        encode_batches(&mut buf, 7, "logs/a-0", b"batches");
        encode_control(&mut buf, 7, "logs/a-0", Control::Truncate(42));
        encode_control(&mut buf, 7, "logs/b-1", Control::Forget);
        let whole = buf.len();
        let (records, end) = decode_records(&buf, 7);
        assert_eq!(
            records,
            vec![
                ("logs/a-0", Record::Batches(b"batches")),
                ("logs/a-0", Record::Truncate(42)),
                ("logs/b-1", Record::Forget)
            ]
        );
        assert_eq!(end, whole);

        // Zeros after the records (a zero-filled spare) end the file.
        buf.extend_from_slice(&[0; 64]);
        assert_eq!(decode_records(&buf, 7).1, whole);

        // A record cut short, or one whose bytes changed, ends it too.
        let mut torn = buf[..whole].to_vec();
        encode_batches(&mut torn, 7, "logs/a-0", b"more batches");
        torn.truncate(torn.len() - 3);
        assert_eq!(decode_records(&torn, 7).0.len(), 3);
        let mut flipped = buf[..whole].to_vec();
        flipped[20] ^= 1;
        assert_eq!(decode_records(&flipped, 7), (vec![], 0));

        // A payload in parts (batches where they lie) gets the header of the whole once
        // sealed.
        let mut in_parts = Vec::new();
        let parts = [&b"bat"[..], b"", b"ches"];
        encode_batches_header(&mut in_parts, 7, "logs/a-0", parts.into_iter());
        seal(&mut in_parts, parts.into_iter());
        in_parts.extend_from_slice(b"batches");
        let mut whole_record = Vec::new();
        encode_batches(&mut whole_record, 7, "logs/a-0", b"batches");
        assert_eq!(in_parts, whole_record);

        // A recycled file: what its earlier use (sequence 3) left after the new records is
        // not read, valid as it is.
        let mut recycled = Vec::new();
        encode_batches(&mut recycled, 7, "logs/a-0", b"new");
        let new_end = recycled.len();
        encode_batches(&mut recycled, 3, "logs/a-0", b"stale batches");
        assert_eq!(decode_records(&recycled, 7), (vec![("logs/a-0", Record::Batches(b"new"))], new_end));
        assert!(decode_records(&recycled, 3).0.is_empty());
    }

    #[test]
    fn records_after_a_hole_are_found_and_a_clean_end_has_none() {
        let mut file = Vec::new();
        encode_batches(&mut file, 5, "logs/a-0", &[1; 3000]);
        let first_end = file.len();
        encode_batches(&mut file, 5, "logs/a-0", &[2; 9000]);
        let second = first_end + 4 + 4000;
        encode_batches(&mut file, 5, "logs/b-1", &[3; 100]);
        let third_at = file.len() - (RECORD_PREFIX_BYTES + BODY_HEADER_BYTES + "logs/b-1".len() + 100);
        let clean = file.clone();
        file.extend_from_slice(&[0; 8192]);
        assert_eq!(next_record_after(&file, clean.len(), 5), None, "zeros after the last record");
        // The second record's middle reads as zeros (a write lost under an acknowledged
        // round): decoding stops at it, and the third record is found behind it.
        file[first_end + 100..second].fill(0);
        let (records, stopped_at) = decode_records(&file, 5);
        assert_eq!((records.len(), stopped_at), (1, first_end));
        assert_eq!(next_record_after(&file, stopped_at, 5), Some(third_at));
        // Another file's records (an earlier use of a recycled file) are not its own.
        assert_eq!(next_record_after(&file, stopped_at, 6), None);
    }

    #[test]
    fn a_spare_left_by_an_earlier_run_is_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        // An earlier run's file 0, recycled as the spare: its records carry sequence 0,
        // which this run's first file reuses; one starts where this run's first round ends.
        let mut stale = vec![0; WAL_PAGE_BYTES as usize];
        encode_control(&mut stale, 0, "logs/a-0", Control::Truncate(0));
        std::fs::write(dir.path().join(SPARE_FILE), &stale).unwrap();
        std::fs::write(dir.path().join(SPARE_TMP_FILE), b"half").unwrap();
        let mut writer = WalWriter::start(dir.path(), WAL_FILE_BYTES_MIN).unwrap();
        assert_eq!(writer.sequence(), 0);
        let mut round = Vec::new();
        let header_bytes = RECORD_PREFIX_BYTES + BODY_HEADER_BYTES + "logs/a-0".len();
        encode_batches(&mut round, 0, "logs/a-0", &vec![9; WAL_PAGE_BYTES as usize - header_bytes]);
        assert_eq!(round.len() as u64, WAL_PAGE_BYTES, "the round ends on a page boundary, with no zeros after it");
        writer.write_round(&[RoundRecord::Sealed(&round)], &[]).unwrap();
        let data = std::fs::read(&writer.path).unwrap();
        let (records, _) = decode_records(&data, 0);
        assert_eq!(records.len(), 1, "an earlier run's record read as this run's: {:?}", records.last().map(|r| &r.1));
        assert!(!dir.path().join(SPARE_TMP_FILE).exists(), "a half-made spare is gone too");
    }

    #[test]
    fn direct_io_is_trusted_on_block_filesystems_only() {
        let dir = tempfile::tempdir().unwrap();
        let name = crate::durable::filesystem_name(dir.path()).unwrap();
        let block = ["ext2/3/4", "xfs", "btrfs", "f2fs"].contains(&name.as_str());
        assert_eq!(crate::durable::direct_io_trusted(dir.path()), block, "{name}");
        if Path::new("/dev/shm").is_dir() {
            assert!(!crate::durable::direct_io_trusted(Path::new("/dev/shm")), "tmpfs");
        }
        let writer = WalWriter::start(dir.path(), WAL_FILE_BYTES_MIN).unwrap();
        assert!(!writer.is_direct() || block, "direct I/O on {name}");
    }

    #[test]
    fn rounds_written_in_parts_read_back_as_their_records_in_whole_pages() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = WalWriter::start(dir.path(), WAL_FILE_BYTES).unwrap();
        // Where the filesystem takes direct I/O and it is trusted, the WAL uses it.
        let probe = dir.path().join("probe");
        std::fs::write(&probe, b"").unwrap();
        let direct_supported = crate::durable::direct_io_trusted(dir.path()) && {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(&probe).is_ok()
        };
        assert_eq!(writer.is_direct(), direct_supported);
        let sequence = writer.sequence();
        let mut expected = Vec::new();
        // Rounds of odd sizes: within a page, across pages, of many parts, and across
        // write chunks; `FILL` is a record that ends its round exactly on a chunk boundary.
        const FILL: usize = usize::MAX;
        for (round, (records, mut payload_bytes)) in
            [(1, 10), (3, 5000), (700, 3), (2, 9000), (3, 1_500_000), (1, 1), (1, FILL), (1, 1)].into_iter().enumerate()
        {
            if payload_bytes == FILL {
                let tail = (writer.position % WAL_PAGE_BYTES) as usize;
                payload_bytes =
                    WAL_WRITE_CHUNK_BYTES - tail - RECORD_PREFIX_BYTES - BODY_HEADER_BYTES - "logs/a-0".len();
            }
            let payloads: Vec<Vec<u8>> = (0..records).map(|i| vec![(round * 31 + i) as u8; payload_bytes]).collect();
            let mut headers = Vec::new();
            let mut ranges = Vec::new();
            for payload in &payloads {
                let start = headers.len();
                encode_batches_header(&mut headers, sequence, "logs/a-0", std::iter::once(&payload[..]));
                ranges.push(start..headers.len());
            }
            let mut parts = vec![RoundRecord::Sealed(&[])];
            for (range, payload) in ranges.iter().zip(&payloads) {
                parts.push(RoundRecord::Batches { header: &headers[range.clone()], batches: vec![payload] });
            }
            writer.write_round(&parts, &[]).unwrap();
            expected.extend(payloads);
            assert_eq!(writer.file.metadata().unwrap().len() % WAL_PAGE_BYTES, 0, "whole pages");
        }
        if direct_supported && !crate::durable::fsync_skipped() {
            // The rounds that fit one write were made durable by it (RWF_DSYNC); the
            // 1.5 MB round and the one ending on a chunk boundary got an fdatasync.
            assert_eq!(writer.rounds_write_synced, 6);
        }
        if direct_supported {
            // Written around the page cache: a round's pages are not kept in memory.
            let cached = crate::page_cache::cached_pages(&writer.file, 0, writer.position);
            assert!(cached.is_none_or(|pages| pages == 0), "{cached:?} WAL pages cached");
        }
        let data = std::fs::read(&writer.path).unwrap();
        let (records, end) = decode_records(&data, sequence);
        assert_eq!(end as u64, writer.position);
        let read: Vec<&[u8]> = records
            .iter()
            .map(|(_, record)| match record {
                Record::Batches(bytes) => *bytes,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(read, expected.iter().map(Vec::as_slice).collect::<Vec<_>>());
        assert!(data[end..].iter().all(|&b| b == 0), "padded with zeros");
    }

    #[test]
    fn record_paths_are_relative_to_the_data_dir() {
        assert_eq!(record_path(Path::new("/d"), Path::new("/d/logs/t-0")), "logs/t-0");
        assert_eq!(record_path(Path::new("/d"), Path::new("/e/t-0")), "/e/t-0");
    }
}
