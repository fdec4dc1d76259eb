//! The records inside a v2 batch, for the two places storage must look inside one: the
//! cleaner (which record has which key, which is a tombstone) and the key check of a
//! compacted topic. Everything else treats a batch as opaque bytes.
//!
//! Records are decoded only as far as their key and whether their value is null; a kept
//! record's bytes are copied as they are, so a rebuilt batch holds the client's records
//! unchanged, only fewer of them.

use std::io;
use std::ops::Range;

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::compression::{Compressor, Decompressor, Gzip, Lz4, Snappy, Zstd};

use crate::batch::{BatchHeader, BATCH_HEADER_BYTES};
use crate::checksum::crc32c;

/// Compression codec ids in the batch attributes.
const CODEC_NONE: i16 = 0;
const CODEC_GZIP: i16 = 1;
const CODEC_SNAPPY: i16 = 2;
const CODEC_LZ4: i16 = 3;
const CODEC_ZSTD: i16 = 4;
/// The CRC covers everything from the attributes field on.
const CRC_START: usize = 21;
/// The largest batch the cleaner decompresses: a bound on a hostile compression ratio.
pub const DECOMPRESSED_BYTES_MAX: usize = 256 * 1024 * 1024;

/// One record of a batch: where its bytes are in the decompressed payload, its offset
/// delta, its key and whether it is a tombstone (null value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordView {
    pub(crate) bytes: Range<usize>,
    pub(crate) offset_delta: i32,
    pub(crate) key: Option<Range<usize>>,
    pub(crate) tombstone: bool,
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed record batch: {what}"))
}

/// The decompressed records payload of `batch` (a whole, validated batch).
pub(crate) fn payload(header: &BatchHeader, batch: &[u8]) -> io::Result<Bytes> {
    let mut compressed = Bytes::copy_from_slice(&batch[BATCH_HEADER_BYTES..]);
    let take = |buf: &mut Bytes| -> anyhow::Result<Bytes> {
        anyhow::ensure!(buf.len() <= DECOMPRESSED_BYTES_MAX, "decompressed batch too large");
        Ok(buf.copy_to_bytes(buf.remaining()))
    };
    let result = match header.compression() {
        CODEC_NONE => return Ok(compressed),
        CODEC_GZIP => Gzip::decompress(&mut compressed, take),
        CODEC_SNAPPY => Snappy::decompress(&mut compressed, take),
        CODEC_LZ4 => Lz4::decompress(&mut compressed, take),
        CODEC_ZSTD => Zstd::decompress(&mut compressed, take),
        other => return Err(invalid(&format!("unknown compression codec {other}"))),
    };
    result.map_err(|error| invalid(&format!("{error:#}")))
}

/// Parses the `count` records of a decompressed payload.
pub(crate) fn parse(payload: &[u8], count: i32) -> io::Result<Vec<RecordView>> {
    let mut records = Vec::with_capacity(count.clamp(0, 1 << 16) as usize);
    let mut position = 0;
    for _ in 0..count {
        let mut reader = Reader { buf: payload, position };
        let length = reader.varint()?;
        let start = reader.position;
        let end = start.checked_add(usize::try_from(length).map_err(|_| invalid("negative record length"))?);
        let end = end.filter(|&end| end <= payload.len()).ok_or_else(|| invalid("record past the batch end"))?;
        reader.buf = &payload[..end];
        reader.skip(1)?; // attributes
        reader.varint()?; // timestamp delta
        let offset_delta = i32::try_from(reader.varint()?).map_err(|_| invalid("offset delta"))?;
        let key = reader.bytes()?;
        let value = reader.bytes()?;
        records.push(RecordView { bytes: position..end, offset_delta, key, tombstone: value.is_none() });
        position = end;
    }
    Ok(records)
}

/// The kind of a transaction marker (a control batch): `Some(true)` commit, `Some(false)`
/// abort (its one record's key is i16 version, i16 type: 0 abort, 1 commit); `None` for a
/// batch that is not a marker.
pub fn marker_commits(header: &BatchHeader, batch: &[u8]) -> io::Result<Option<bool>> {
    if !header.is_control() {
        return Ok(None);
    }
    let payload = payload(header, batch)?;
    let records = parse(&payload, header.record_count)?;
    let key = records.first().and_then(|record| record.key.clone()).map(|range| &payload[range]);
    match key {
        Some([_, _, type_high, type_low, ..]) => Ok(Some(i16::from_be_bytes([*type_high, *type_low]) == 1)),
        _ => Err(invalid("control record without a marker key")),
    }
}

/// Indexes (within the batch) of records that have no key: what a compacted topic refuses.
pub fn keyless_records(header: &BatchHeader, batch: &[u8]) -> io::Result<Vec<i32>> {
    if header.is_control() {
        return Ok(Vec::new());
    }
    let payload = payload(header, batch)?;
    let records = parse(&payload, header.record_count)?;
    Ok((0..).zip(records).filter(|(_, record)| record.key.is_none()).map(|(index, _)| index).collect())
}

/// A batch holding only `kept` (raw records, in order, from the original payload) of the
/// original batch: same offsets range, timestamps, producer fields and codec; the length,
/// record count and CRC describe the new content. With no record left the batch keeps its
/// header only (uncompressed), as Kafka's cleaner keeps a producer's last batch.
pub(crate) fn rebuild(original: &[u8], header: &BatchHeader, kept: &[u8], kept_count: i32) -> io::Result<Vec<u8>> {
    let codec = if kept_count == 0 { CODEC_NONE } else { header.compression() };
    let mut records = BytesMut::new();
    let fill = |buf: &mut BytesMut| -> anyhow::Result<()> {
        buf.extend_from_slice(kept);
        Ok(())
    };
    let compressed = match codec {
        CODEC_NONE => fill(&mut records),
        CODEC_GZIP => Gzip::compress(&mut records, fill),
        CODEC_SNAPPY => Snappy::compress(&mut records, fill),
        CODEC_LZ4 => Lz4::compress(&mut records, fill),
        CODEC_ZSTD => Zstd::compress(&mut records, fill),
        other => return Err(invalid(&format!("unknown compression codec {other}"))),
    };
    compressed.map_err(|error| invalid(&format!("{error:#}")))?;
    let mut batch = Vec::with_capacity(BATCH_HEADER_BYTES + records.len());
    batch.extend_from_slice(&original[..BATCH_HEADER_BYTES]);
    batch.extend_from_slice(&records);
    let batch_length =
        i32::try_from(batch.len() - crate::batch::LOG_OVERHEAD_BYTES).map_err(|_| invalid("too large"))?;
    batch[8..12].copy_from_slice(&batch_length.to_be_bytes());
    let attributes = (header.attributes & !0x07) | codec;
    batch[21..23].copy_from_slice(&attributes.to_be_bytes());
    batch[57..61].copy_from_slice(&kept_count.to_be_bytes());
    let crc = crc32c(&batch[CRC_START..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(batch)
}

struct Reader<'a> {
    buf: &'a [u8],
    position: usize,
}

impl Reader<'_> {
    fn skip(&mut self, n: usize) -> io::Result<()> {
        if self.position + n > self.buf.len() {
            return Err(invalid("record truncated"));
        }
        self.position += n;
        Ok(())
    }

    /// A zigzag varlong, as record fields are encoded.
    fn varint(&mut self) -> io::Result<i64> {
        let mut value: u64 = 0;
        for shift in (0..70).step_by(7) {
            let byte = *self.buf.get(self.position).ok_or_else(|| invalid("varint truncated"))?;
            self.position += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
            }
        }
        Err(invalid("varint too long"))
    }

    /// A length-prefixed byte field (key or value); `None` for length -1.
    fn bytes(&mut self) -> io::Result<Option<Range<usize>>> {
        let length = self.varint()?;
        if length < 0 {
            return Ok(None);
        }
        let start = self.position;
        self.skip(length as usize)?;
        Ok(Some(start..self.position))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::validate_stored_batch;

    /// A v2 batch encoded by the kafka-protocol crate (an independent encoder).
    pub(crate) fn encoded_batch(records: &[(Option<&str>, Option<&str>)], compression: i16) -> Vec<u8> {
        use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
        let records: Vec<Record> = (0..)
            .zip(records)
            .map(|(i, (key, value))| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i,
                // The encoder splits batches where offset - sequence changes.
                sequence: i as i32,
                timestamp: 1_000 + i,
                key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
                value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
                headers: Default::default(),
            })
            .collect();
        let compression = match compression {
            CODEC_GZIP => Compression::Gzip,
            CODEC_SNAPPY => Compression::Snappy,
            CODEC_LZ4 => Compression::Lz4,
            CODEC_ZSTD => Compression::Zstd,
            _ => Compression::None,
        };
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression };
        RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
        buf.to_vec()
    }

    #[test]
    fn rebuilt_batches_keep_what_was_kept_under_every_codec() {
        let records = [(Some("a"), Some("1")), (Some("b"), None), (None, Some("3")), (Some("a"), Some("4"))];
        for codec in [CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD] {
            let batch = encoded_batch(&records, codec);
            let header = validate_stored_batch(&batch).unwrap();
            assert_eq!(header.compression(), codec);
            assert_eq!(keyless_records(&header, &batch).unwrap(), vec![2]);
            let payload = payload(&header, &batch).unwrap();
            let views = parse(&payload, header.record_count).unwrap();
            assert_eq!(views.iter().map(|v| v.offset_delta).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
            assert_eq!(views.iter().map(|v| v.tombstone).collect::<Vec<_>>(), vec![false, true, false, false]);
            // Keep records 1 and 3.
            let mut kept = payload[views[1].bytes.clone()].to_vec();
            kept.extend_from_slice(&payload[views[3].bytes.clone()]);
            let rebuilt = rebuild(&batch, &header, &kept, 2).unwrap();
            let rebuilt_header = validate_stored_batch(&rebuilt).expect("a valid CRC");
            assert_eq!(rebuilt_header.last_offset_delta, 3, "the offset range stays");
            assert_eq!(rebuilt_header.record_count, 2);
            assert_eq!(rebuilt_header.compression(), codec);
            let decoded =
                kafka_protocol::records::RecordBatchDecoder::decode(&mut Bytes::from(rebuilt.clone())).unwrap();
            let offsets: Vec<i64> = decoded.records.iter().map(|r| r.offset).collect();
            assert_eq!(offsets, vec![1, 3]);
            assert_eq!(decoded.records[1].value.as_deref(), Some(&b"4"[..]));
            assert!(decoded.records[0].value.is_none());
            let empty = rebuild(&batch, &header, &[], 0).unwrap();
            let empty_header = validate_stored_batch(&empty).unwrap();
            assert_eq!((empty_header.record_count, empty_header.last_offset_delta), (0, 3));
        }
    }

    #[test]
    fn malformed_records_are_errors_not_panics() {
        let batch = encoded_batch(&[(Some("key"), Some("value"))], CODEC_NONE);
        let header = validate_stored_batch(&batch).unwrap();
        let payload = payload(&header, &batch).unwrap();
        for cut in 0..payload.len() {
            assert!(parse(&payload[..cut], 1).is_err(), "cut at {cut}");
        }
        assert!(parse(&payload, 2).is_err(), "more records than bytes");
    }
}
