//! Kafka record batch (magic v2) headers: parsing, validation and the two fields the broker
//! writes.
//!
//! Batches are stored exactly as the client sent them. The broker only writes the base
//! offset and the partition leader epoch, which sit before the CRC-covered region, so the
//! client's CRC32C stays valid and is never recomputed. Records inside a batch are never
//! decoded here: compression codecs pass through untouched.

use crate::checksum::{crc32c, crc32c_append};
use std::ops::Range;

/// Bytes before `batch_length` counts: base offset (8) + batch length (4).
pub const LOG_OVERHEAD_BYTES: usize = 12;
/// Fixed size of a v2 batch header, up to the first record.
pub const BATCH_HEADER_BYTES: usize = 61;
/// The only record format Sluice accepts.
pub const MAGIC_V2: i8 = 2;
/// The CRC covers everything from the attributes field to the end of the batch.
const CRC_START: usize = 21;
const CRC_FIELD: Range<usize> = 17..21;
const BASE_OFFSET_FIELD: Range<usize> = 0..8;
const LENGTH_FIELD: Range<usize> = 8..12;
const LEADER_EPOCH_FIELD: Range<usize> = 12..16;
const ATTRIBUTES_AT: usize = 21;
const MAX_TIMESTAMP_FIELD: Range<usize> = 35..43;

const ATTRIBUTE_COMPRESSION_MASK: i16 = 0x07;
const ATTRIBUTE_TIMESTAMP_TYPE: i16 = 0x08;
const ATTRIBUTE_TRANSACTIONAL: i16 = 0x10;
const ATTRIBUTE_CONTROL: i16 = 0x20;

/// Why a byte range is not a valid v2 batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("batch truncated: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("batch length field {0} is invalid")]
    InvalidLength(i32),
    #[error("unsupported record batch magic {0}")]
    UnsupportedMagic(i8),
    #[error("crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("record count {record_count} does not match last offset delta {last_offset_delta}")]
    InvalidRecordCount { record_count: i32, last_offset_delta: i32 },
    #[error("unknown compression codec {0}")]
    UnknownCompression(i16),
}

/// A parsed copy of a v2 batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

fn read_i16(buf: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([buf[at], buf[at + 1]])
}
fn read_i32(buf: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}
fn read_i64(buf: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

impl BatchHeader {
    /// Parses the fixed header at the start of `buf`. Checks only what is needed to know
    /// the batch's extent (length and magic); the CRC is checked by [`validate_batch`].
    pub fn parse(buf: &[u8]) -> Result<BatchHeader, BatchError> {
        if buf.len() < BATCH_HEADER_BYTES {
            return Err(BatchError::Truncated { needed: BATCH_HEADER_BYTES, available: buf.len() });
        }
        let batch_length = read_i32(buf, LENGTH_FIELD.start);
        if batch_length < (BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES) as i32 {
            return Err(BatchError::InvalidLength(batch_length));
        }
        let magic = buf[16] as i8;
        if magic != MAGIC_V2 {
            return Err(BatchError::UnsupportedMagic(magic));
        }
        Ok(BatchHeader {
            base_offset: read_i64(buf, BASE_OFFSET_FIELD.start),
            batch_length,
            partition_leader_epoch: read_i32(buf, LEADER_EPOCH_FIELD.start),
            magic,
            crc: u32::from_be_bytes(buf[CRC_FIELD].try_into().expect("4 bytes")),
            attributes: read_i16(buf, ATTRIBUTES_AT),
            last_offset_delta: read_i32(buf, 23),
            base_timestamp: read_i64(buf, 27),
            max_timestamp: read_i64(buf, MAX_TIMESTAMP_FIELD.start),
            producer_id: read_i64(buf, 43),
            producer_epoch: read_i16(buf, 51),
            base_sequence: read_i32(buf, 53),
            record_count: read_i32(buf, 57),
        })
    }

    /// Size of the whole batch on disk and on the wire.
    pub fn total_bytes(&self) -> usize {
        LOG_OVERHEAD_BYTES + self.batch_length as usize
    }

    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }

    /// Compression codec id: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
    pub fn compression(&self) -> i16 {
        self.attributes & ATTRIBUTE_COMPRESSION_MASK
    }

    pub fn is_log_append_time(&self) -> bool {
        self.attributes & ATTRIBUTE_TIMESTAMP_TYPE != 0
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTRIBUTE_TRANSACTIONAL != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & ATTRIBUTE_CONTROL != 0
    }

    /// True when the batch carries idempotent-producer sequence numbers.
    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }

    /// Sequence number of the batch's last record (sequences wrap at `i32::MAX`).
    pub fn last_sequence(&self) -> i32 {
        let last = i64::from(self.base_sequence) + i64::from(self.last_offset_delta);
        if last > i64::from(i32::MAX) {
            (last - i64::from(i32::MAX) - 1) as i32
        } else {
            last as i32
        }
    }
}

/// Validates one complete batch occupying all of `buf` as a client sends it: extent,
/// magic, record count (one record per offset), codec and CRC32C. The CRC is checked,
/// never recomputed.
pub fn validate_batch(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = validate_stored_batch(buf)?;
    if !header.is_control() && header.record_count != header.last_offset_delta + 1 {
        return Err(BatchError::InvalidRecordCount {
            record_count: header.record_count,
            last_offset_delta: header.last_offset_delta,
        });
    }
    Ok(header)
}

/// Validates a batch as a log may hold it: like [`validate_batch`], but a compacted batch
/// keeps its offset range while holding fewer records (even none), as Kafka's cleaner
/// leaves it.
pub fn validate_stored_batch(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(buf)?;
    if header.total_bytes() != buf.len() {
        if header.total_bytes() > buf.len() {
            return Err(BatchError::Truncated { needed: header.total_bytes(), available: buf.len() });
        }
        return Err(BatchError::InvalidLength(header.batch_length));
    }
    if header.record_count < 0 || header.last_offset_delta < 0 || header.record_count > header.last_offset_delta + 1 {
        return Err(BatchError::InvalidRecordCount {
            record_count: header.record_count,
            last_offset_delta: header.last_offset_delta,
        });
    }
    if header.compression() > 4 {
        return Err(BatchError::UnknownCompression(header.compression()));
    }
    let computed = crc32c(&buf[CRC_START..]);
    if computed != header.crc {
        return Err(BatchError::CrcMismatch { stored: header.crc, computed });
    }
    Ok(header)
}

/// The 16 broker-owned header bytes (base offset, length, leader epoch) with the base
/// offset and leader epoch replaced. Written in front of the client's bytes `16..`, so an
/// append needs no copy of the batch.
pub fn patched_prefix(batch: &[u8], base_offset: i64, leader_epoch: i32) -> [u8; 16] {
    assert!(batch.len() >= BATCH_HEADER_BYTES, "patched_prefix needs a whole header");
    let mut prefix = [0u8; 16];
    prefix[BASE_OFFSET_FIELD].copy_from_slice(&base_offset.to_be_bytes());
    prefix[LENGTH_FIELD].copy_from_slice(&batch[LENGTH_FIELD]);
    prefix[LEADER_EPOCH_FIELD].copy_from_slice(&leader_epoch.to_be_bytes());
    prefix
}

/// The header (bytes `0..BATCH_HEADER_BYTES`) of a batch appended to a
/// `message.timestamp.type=LogAppendTime` topic: base offset and leader epoch as in
/// [`patched_prefix`], the timestamp-type attribute set, the max timestamp replaced by the
/// append time and the CRC32C computed again over the changed header and the unchanged
/// records, as Kafka does (the client's CRC was checked by [`validate_batch`] first).
/// Written in front of the client's bytes `BATCH_HEADER_BYTES..`.
pub fn log_append_time_header(
    batch: &[u8],
    base_offset: i64,
    leader_epoch: i32,
    append_time_ms: i64,
) -> [u8; BATCH_HEADER_BYTES] {
    let mut header = [0u8; BATCH_HEADER_BYTES];
    header[..16].copy_from_slice(&patched_prefix(batch, base_offset, leader_epoch));
    header[16..].copy_from_slice(&batch[16..BATCH_HEADER_BYTES]);
    let attributes = read_i16(&header, ATTRIBUTES_AT) | ATTRIBUTE_TIMESTAMP_TYPE;
    header[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    header[MAX_TIMESTAMP_FIELD].copy_from_slice(&append_time_ms.to_be_bytes());
    let crc = crc32c_append(crc32c(&header[CRC_START..]), &batch[BATCH_HEADER_BYTES..]);
    header[CRC_FIELD].copy_from_slice(&crc.to_be_bytes());
    header
}

/// A transaction marker: the control batch the broker writes to a partition to end a
/// producer's transaction there (KIP-98), one record whose key is (version 0, type: 0 abort,
/// 1 commit) and whose value is (version 0, coordinator epoch).
#[allow(clippy::too_many_arguments)]
pub fn transaction_marker(
    base_offset: i64,
    leader_epoch: i32,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    timestamp: i64,
) -> Vec<u8> {
    // Varints are zigzag: length 16 -> 32, key length 4 -> 8, value length 6 -> 12.
    #[rustfmt::skip]
    const RECORD: [u8; 17] = [
        32, 0, 0, 0,         // length, attributes, timestamp delta, offset delta
        8, 0, 0, 0, 0,       // key: version 0, type (set below)
        12, 0, 0, 0, 0, 0, 0, // value: version 0, coordinator epoch (set below)
        0,                   // no headers
    ];
    let mut record = RECORD;
    record[8] = u8::from(commit);
    record[12..16].copy_from_slice(&coordinator_epoch.to_be_bytes());
    let mut batch = Vec::with_capacity(BATCH_HEADER_BYTES + record.len());
    batch.extend_from_slice(&base_offset.to_be_bytes());
    batch.extend_from_slice(&((BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES + record.len()) as i32).to_be_bytes());
    batch.extend_from_slice(&leader_epoch.to_be_bytes());
    batch.push(MAGIC_V2 as u8);
    batch.extend_from_slice(&[0; 4]); // CRC, below
    batch.extend_from_slice(&(ATTRIBUTE_TRANSACTIONAL | ATTRIBUTE_CONTROL).to_be_bytes());
    batch.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
    batch.extend_from_slice(&timestamp.to_be_bytes());
    batch.extend_from_slice(&timestamp.to_be_bytes());
    batch.extend_from_slice(&producer_id.to_be_bytes());
    batch.extend_from_slice(&producer_epoch.to_be_bytes());
    batch.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    batch.extend_from_slice(&1i32.to_be_bytes()); // record count
    batch.extend_from_slice(&record);
    let crc = crc32c(&batch[CRC_START..]);
    batch[CRC_FIELD].copy_from_slice(&crc.to_be_bytes());
    batch
}

/// Walks consecutive batches in `buf`, yielding each header and its byte range. Stops
/// (returning `None`) at the first incomplete batch; a malformed header yields an error once.
pub struct BatchIter<'a> {
    buf: &'a [u8],
    position: usize,
    failed: bool,
}

impl<'a> BatchIter<'a> {
    pub fn new(buf: &'a [u8]) -> BatchIter<'a> {
        BatchIter { buf, position: 0, failed: false }
    }

    /// Bytes consumed by complete batches so far.
    pub fn position(&self) -> usize {
        self.position
    }
}

impl Iterator for BatchIter<'_> {
    type Item = Result<(BatchHeader, Range<usize>), BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let rest = &self.buf[self.position..];
        if rest.len() < BATCH_HEADER_BYTES {
            return None;
        }
        match BatchHeader::parse(rest) {
            Err(error) => {
                self.failed = true;
                Some(Err(error))
            }
            Ok(header) if header.total_bytes() > rest.len() => None,
            Ok(header) => {
                let range = self.position..self.position + header.total_bytes();
                self.position = range.end;
                Some(Ok((header, range)))
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a syntactically valid uncompressed batch with `count` tiny records.
    pub(crate) fn make_batch(count: i32, timestamp: i64, producer: Option<(i64, i16, i32)>) -> Vec<u8> {
        let mut records = Vec::new();
        for i in 0..count {
            // length varint, attributes, ts delta, offset delta varint, key len -1, value len 1, 'x', 0 headers
            let body = [0u8, 0, (i as u8) << 1, 1, 2, b'x', 0];
            records.push((body.len() as u8) << 1);
            records.extend_from_slice(&body);
        }
        let (pid, epoch, seq) = producer.unwrap_or((-1, -1, -1));
        let mut buf = Vec::new();
        buf.extend_from_slice(&0i64.to_be_bytes());
        buf.extend_from_slice(&((BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES + records.len()) as i32).to_be_bytes());
        buf.extend_from_slice(&0i32.to_be_bytes());
        buf.push(2);
        buf.extend_from_slice(&0u32.to_be_bytes());
        buf.extend_from_slice(&0i16.to_be_bytes());
        buf.extend_from_slice(&(count - 1).to_be_bytes());
        buf.extend_from_slice(&timestamp.to_be_bytes());
        buf.extend_from_slice(&timestamp.to_be_bytes());
        buf.extend_from_slice(&pid.to_be_bytes());
        buf.extend_from_slice(&epoch.to_be_bytes());
        buf.extend_from_slice(&seq.to_be_bytes());
        buf.extend_from_slice(&count.to_be_bytes());
        buf.extend_from_slice(&records);
        let crc = crc32c(&buf[CRC_START..]);
        buf[CRC_FIELD].copy_from_slice(&crc.to_be_bytes());
        buf
    }

    #[test]
    fn valid_batch_round_trips() {
        let batch = make_batch(3, 1000, Some((7, 1, 10)));
        let header = validate_batch(&batch).unwrap();
        assert_eq!(header.record_count, 3);
        assert_eq!(header.last_offset_delta, 2);
        assert_eq!(header.producer_id, 7);
        assert_eq!(header.last_sequence(), 12);
        assert_eq!(header.total_bytes(), batch.len());
    }

    #[test]
    fn corrupted_byte_fails_crc() {
        let mut batch = make_batch(2, 5, None);
        let last = batch.len() - 1;
        batch[last] ^= 0xff;
        assert!(matches!(validate_batch(&batch), Err(BatchError::CrcMismatch { .. })));
    }

    #[test]
    fn patched_prefix_keeps_crc_valid() {
        let batch = make_batch(2, 5, None);
        let prefix = patched_prefix(&batch, 1234, 9);
        let mut stored = prefix.to_vec();
        stored.extend_from_slice(&batch[16..]);
        let header = validate_batch(&stored).unwrap();
        assert_eq!(header.base_offset, 1234);
        assert_eq!(header.partition_leader_epoch, 9);
    }

    #[test]
    fn sequence_wraps() {
        let batch = make_batch(3, 5, Some((1, 0, i32::MAX - 1)));
        assert_eq!(validate_batch(&batch).unwrap().last_sequence(), 0);
    }

    #[test]
    fn iterator_stops_at_partial_batch() {
        let mut buf = make_batch(1, 1, None);
        buf.extend_from_slice(&make_batch(2, 1, None));
        let whole = buf.len();
        buf.extend_from_slice(&make_batch(2, 1, None)[..30]);
        let mut iter = BatchIter::new(&buf);
        assert_eq!(iter.by_ref().count(), 2);
        assert_eq!(iter.position(), whole);
    }

    proptest::proptest! {
        #[test]
        fn validation_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = validate_batch(&bytes);
            for item in BatchIter::new(&bytes) { let _ = item; }
        }

        #[test]
        fn any_single_bit_flip_is_rejected(seed in 0usize..10_000) {
            let mut batch = make_batch(3, 42, Some((1, 0, 0)));
            let bit = seed % ((batch.len() - CRC_START) * 8);
            batch[CRC_START + bit / 8] ^= 1 << (bit % 8);
            proptest::prop_assert!(validate_batch(&batch).is_err());
        }
    }
}
