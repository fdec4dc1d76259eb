//! ShareFetch and ShareAcknowledge v2 (KIP-1206 acquire modes, KIP-1222 lock renewal) over a
//! codec that knows v1 only.
//!
//! The `kafka-protocol` crate was generated from Kafka 4.1, where both APIs stop at v1, and
//! Kafka 4.2+ clients need v2 for RENEW and `share.acquire.mode=record_limit`. v2 differs
//! from v1 by fixed-size fields at fixed places, so this module converts between the two
//! rather than hand-writing the messages:
//! - ShareFetch request: `ShareAcquireMode` (int8) and `IsRenewAck` (bool) after `BatchSize`;
//! - ShareAcknowledge request: `IsRenewAck` (bool) after `ShareSessionEpoch`;
//! - ShareAcknowledge response: `AcquisitionLockTimeoutMs` (int32) after `ErrorMessage`;
//! - ShareFetch response: unchanged;
//! - DescribeShareGroupOffsets v1 (KIP-1226): the request is v0's; the response adds `Lag`
//!   (int64) after each partition's `LeaderEpoch`.
//!
//! The v2 values travel between this module and the broker's handlers in the message's
//! unknown tagged fields under [`RESERVED_TAG_MIN`] and above: only this module reads or
//! writes those tags. They are taken out of every decoded request first (a client cannot
//! set them) and out of every response before it is encoded (they never reach the wire).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::describe_share_group_offsets_response::DescribeShareGroupOffsetsResponsePartition;
use kafka_protocol::messages::{
    ApiKey, DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse, RequestKind, ShareAcknowledgeRequest,
    ShareAcknowledgeResponse, ShareFetchRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable};

/// The newest ShareFetch and ShareAcknowledge version this module converts.
pub const SHARE_WIRE_VERSION_MAX: i16 = 2;
/// The version the codec decodes and encodes in its place.
const CODEC_VERSION: i16 = 1;

/// Tags from here on are this module's (Kafka's own tags are small numbers).
const RESERVED_TAG_MIN: i32 = 0x7fff_ff00;
const TAG_ACQUIRE_MODE: i32 = RESERVED_TAG_MIN;
const TAG_IS_RENEW_ACK: i32 = RESERVED_TAG_MIN + 1;
const TAG_ACQUISITION_LOCK_TIMEOUT_MS: i32 = RESERVED_TAG_MIN + 2;
const TAG_LAG: i32 = RESERVED_TAG_MIN + 3;
/// A DescribeShareGroupOffsets one broker sends another for the AMQP front door asks the
/// partitions' leader for their ready and unacknowledged counts (request), which its answer
/// carries (response partitions).
const TAG_QUEUE_DEPTH: i32 = RESERVED_TAG_MIN + 4;
/// A ShareAcknowledge one broker sends another for the AMQP front door asks the partition's
/// leader to archive this many of its oldest ready records (a queue over its `x-max-length`,
/// request); the answer carries their offsets (response).
const TAG_DISCARD_READY: i32 = RESERVED_TAG_MIN + 5;

/// The newest DescribeShareGroupOffsets version this module converts.
pub const DESCRIBE_SHARE_GROUP_OFFSETS_VERSION_MAX: i16 = 1;
/// Bytes of `PartitionIndex`, `StartOffset` and `LeaderEpoch`, before v1's `Lag`.
const DESCRIBED_PARTITION_FIXED_PREFIX_BYTES: usize = 4 + 8 + 4;

/// Bytes of the int32 fields between `MemberId` and the v2 fields of a ShareFetch request
/// (`ShareSessionEpoch`, `MaxWaitMs`, `MinBytes`, `MaxBytes`, `MaxRecords`, `BatchSize`).
const SHARE_FETCH_FIXED_PREFIX_BYTES: usize = 6 * 4;
/// Bytes of `ShareSessionEpoch` in a ShareAcknowledge request.
const SHARE_ACKNOWLEDGE_FIXED_PREFIX_BYTES: usize = 4;
/// Bytes of `ThrottleTimeMs` and `ErrorCode` at the start of a ShareAcknowledge response.
const SHARE_ACKNOWLEDGE_RESPONSE_FIXED_PREFIX_BYTES: usize = 4 + 2;

/// KIP-1206's acquire modes (ShareFetch `ShareAcquireMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShareAcquireMode {
    /// `MaxRecords` is a soft limit: whole batches are acquired (Kafka's default).
    #[default]
    BatchOptimized,
    /// `MaxRecords` is a hard limit, splitting a batch when needed.
    RecordLimit,
}

/// What a ShareFetch v2 adds to v1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShareFetchOptions {
    pub acquire_mode: ShareAcquireMode,
    /// The request carries RENEW acknowledgements (and so fetches nothing new).
    pub is_renew_ack: bool,
}

/// Whether `api_key` at `version` is decoded and encoded here.
pub fn converts(api_key: ApiKey, version: i16) -> bool {
    version == version_max(api_key) && version > api_key.valid_versions().max
}

/// The newest version of `api_key` that can be decoded: the codec's, or this module's.
pub fn version_max(api_key: ApiKey) -> i16 {
    match api_key {
        ApiKey::ShareFetch | ApiKey::ShareAcknowledge => SHARE_WIRE_VERSION_MAX,
        ApiKey::DescribeShareGroupOffsets => DESCRIBE_SHARE_GROUP_OFFSETS_VERSION_MAX,
        other => other.valid_versions().max,
    }
}

/// The version the codec is asked for in place of `version` (the same one unless converted).
pub fn codec_version(api_key: ApiKey, version: i16) -> i16 {
    if converts(api_key, version) {
        version - 1
    } else {
        version
    }
}

/// A request body, v2 share requests converted; the reserved tags of any decoded share
/// request hold only what this module put there.
pub fn decode_request(api_key: ApiKey, version: i16, body: &mut Bytes) -> Result<RequestKind, String> {
    let mut decoded = if converts(api_key, version) && api_key != ApiKey::DescribeShareGroupOffsets {
        decode_v2(api_key, body)?
    } else if converts(api_key, version) {
        // v1's request is v0's.
        RequestKind::decode(api_key, body, codec_version(api_key, version)).map_err(|e| e.to_string())?
    } else {
        RequestKind::decode(api_key, body, version).map_err(|e| e.to_string())?
    };
    match &mut decoded {
        RequestKind::ShareFetch(request) if !converts(api_key, version) => {
            request.unknown_tagged_fields.retain(|tag, _| *tag < RESERVED_TAG_MIN)
        }
        RequestKind::ShareAcknowledge(request) if !converts(api_key, version) => {
            request.unknown_tagged_fields.retain(|tag, _| *tag < RESERVED_TAG_MIN)
        }
        RequestKind::DescribeShareGroupOffsets(request) => {
            request.unknown_tagged_fields.retain(|tag, _| *tag < RESERVED_TAG_MIN)
        }
        _ => {}
    }
    Ok(decoded)
}

/// Decodes a request a broker built and another forwarded: its reserved tags are the
/// sender's, kept (a client's request never reaches here: `decode_request` strips them).
pub(crate) fn decode_forwarded_request(api_key: ApiKey, version: i16, body: &mut Bytes) -> Result<RequestKind, String> {
    if converts(api_key, version) {
        return decode_request(api_key, version, body);
    }
    RequestKind::decode(api_key, body, version).map_err(|e| e.to_string())
}

fn decode_v2(api_key: ApiKey, body: &mut Bytes) -> Result<RequestKind, String> {
    let strings_end = skip_compact_nullable_string(body, 0).and_then(|at| skip_compact_nullable_string(body, at))?;
    match api_key {
        ApiKey::ShareFetch => {
            let at = strings_end + SHARE_FETCH_FIXED_PREFIX_BYTES;
            let (fields, mut v1) = cut(body, at, 2)?;
            let mut request = ShareFetchRequest::decode(&mut v1, CODEC_VERSION).map_err(|e| e.to_string())?;
            request.unknown_tagged_fields.retain(|tag, _| *tag < RESERVED_TAG_MIN);
            request.unknown_tagged_fields.insert(TAG_ACQUIRE_MODE, Bytes::copy_from_slice(&fields[..1]));
            request.unknown_tagged_fields.insert(TAG_IS_RENEW_ACK, Bytes::copy_from_slice(&fields[1..]));
            Ok(RequestKind::ShareFetch(request))
        }
        ApiKey::ShareAcknowledge => {
            let at = strings_end + SHARE_ACKNOWLEDGE_FIXED_PREFIX_BYTES;
            let (fields, mut v1) = cut(body, at, 1)?;
            let mut request = ShareAcknowledgeRequest::decode(&mut v1, CODEC_VERSION).map_err(|e| e.to_string())?;
            request.unknown_tagged_fields.retain(|tag, _| *tag < RESERVED_TAG_MIN);
            request.unknown_tagged_fields.insert(TAG_IS_RENEW_ACK, Bytes::copy_from_slice(&fields));
            Ok(RequestKind::ShareAcknowledge(request))
        }
        other => Err(format!("{other:?} is not converted")),
    }
}

/// Splits `len` bytes at `at` out of `body`: (those bytes, the body without them).
fn cut(body: &Bytes, at: usize, len: usize) -> Result<(Bytes, Bytes), String> {
    if body.len() < at + len {
        return Err(format!("body of {} bytes ends before its v2 fields", body.len()));
    }
    let mut rest = BytesMut::with_capacity(body.len() - len);
    rest.put_slice(&body[..at]);
    rest.put_slice(&body[at + len..]);
    Ok((body.slice(at..at + len), rest.freeze()))
}

/// The offset after the compact nullable string at `at` (an unsigned varint of length + 1,
/// 0 for null, then the bytes).
fn skip_compact_nullable_string(body: &Bytes, at: usize) -> Result<usize, String> {
    let (length_plus_one, varint_bytes) = unsigned_varint(body.get(at..).unwrap_or_default())?;
    let end = at + varint_bytes + (length_plus_one.saturating_sub(1) as usize);
    if end > body.len() {
        return Err("string runs past the end of the body".into());
    }
    Ok(end)
}

/// An unsigned varint (at most 5 bytes) and how many bytes it took.
fn unsigned_varint(bytes: &[u8]) -> Result<(u32, usize), String> {
    let mut value = 0u32;
    for (index, byte) in bytes.iter().take(5).enumerate() {
        value |= u32::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Ok((value, index + 1));
        }
    }
    Err("malformed varint".into())
}

/// The v2 fields of a ShareFetch (defaults for v1).
pub fn share_fetch_options(request: &ShareFetchRequest) -> Result<ShareFetchOptions, String> {
    let acquire_mode = match request.unknown_tagged_fields.get(&TAG_ACQUIRE_MODE).map(|b| b[0]) {
        None | Some(0) => ShareAcquireMode::BatchOptimized,
        Some(1) => ShareAcquireMode::RecordLimit,
        Some(other) => return Err(format!("unknown share acquire mode {other}")),
    };
    Ok(ShareFetchOptions { acquire_mode, is_renew_ack: flag(request.unknown_tagged_fields.get(&TAG_IS_RENEW_ACK)) })
}

/// Sets the v2 fields of a ShareFetch that a broker component builds itself.
pub fn set_share_fetch_options(request: &mut ShareFetchRequest, options: ShareFetchOptions) {
    let mode = match options.acquire_mode {
        ShareAcquireMode::BatchOptimized => 0u8,
        ShareAcquireMode::RecordLimit => 1,
    };
    request.unknown_tagged_fields.insert(TAG_ACQUIRE_MODE, Bytes::copy_from_slice(&[mode]));
    request.unknown_tagged_fields.insert(TAG_IS_RENEW_ACK, Bytes::copy_from_slice(&[u8::from(options.is_renew_ack)]));
}

/// The v2 `IsRenewAck` of a ShareAcknowledge (false for v1).
pub fn share_acknowledge_is_renew(request: &ShareAcknowledgeRequest) -> bool {
    flag(request.unknown_tagged_fields.get(&TAG_IS_RENEW_ACK))
}

/// Announces RENEW acknowledgements in a ShareAcknowledge a broker component builds itself.
pub fn set_share_acknowledge_renew(request: &mut ShareAcknowledgeRequest, renew: bool) {
    request.unknown_tagged_fields.insert(TAG_IS_RENEW_ACK, Bytes::copy_from_slice(&[u8::from(renew)]));
}

fn flag(value: Option<&Bytes>) -> bool {
    value.is_some_and(|b| b.first().is_some_and(|byte| *byte != 0))
}

/// Sets the v2 `AcquisitionLockTimeoutMs` of a ShareAcknowledge response (not sent to v1).
pub fn set_acknowledge_lock_timeout_ms(response: &mut ShareAcknowledgeResponse, lock_timeout_ms: i32) {
    let bytes = Bytes::copy_from_slice(&lock_timeout_ms.to_be_bytes());
    response.unknown_tagged_fields.insert(TAG_ACQUISITION_LOCK_TIMEOUT_MS, bytes);
}

/// Encodes a ShareAcknowledge response body at `version` (1 or 2) into `out`.
pub fn encode_acknowledge_response(
    response: &ShareAcknowledgeResponse,
    version: i16,
    out: &mut BytesMut,
) -> anyhow::Result<()> {
    let mut v1 = response.clone();
    let lock_timeout = v1.unknown_tagged_fields.remove(&TAG_ACQUISITION_LOCK_TIMEOUT_MS);
    // Discarded offsets are only ever set in answer to a broker's request (a client's cannot
    // ask: `decode_request`), and travel back to it.
    v1.unknown_tagged_fields.retain(|tag, _| *tag < RESERVED_TAG_MIN || *tag == TAG_DISCARD_READY);
    let mut body = BytesMut::new();
    v1.encode(&mut body, CODEC_VERSION)?;
    if version < SHARE_WIRE_VERSION_MAX {
        out.put_slice(&body);
        return Ok(());
    }
    let body = body.freeze();
    let at = skip_compact_nullable_string(&body, SHARE_ACKNOWLEDGE_RESPONSE_FIXED_PREFIX_BYTES)
        .map_err(anyhow::Error::msg)?;
    let lock_timeout_ms = lock_timeout.map_or(0, |mut b| if b.len() == 4 { b.get_i32() } else { 0 });
    out.put_slice(&body[..at]);
    out.put_i32(lock_timeout_ms);
    out.put_slice(&body[at..]);
    Ok(())
}

/// Sets the v1 `Lag` of a described share-partition (-1, unknown, unless set).
pub fn set_described_lag(partition: &mut DescribeShareGroupOffsetsResponsePartition, lag: i64) {
    partition.unknown_tagged_fields.insert(TAG_LAG, Bytes::copy_from_slice(&lag.to_be_bytes()));
}

/// Makes `request` ask its partition's leader to archive `count` of the oldest ready records.
pub fn ask_to_discard_ready(request: &mut ShareAcknowledgeRequest, count: u64) {
    request.unknown_tagged_fields.insert(TAG_DISCARD_READY, Bytes::copy_from_slice(&count.to_be_bytes()));
}

/// How many of the oldest ready records `request` (a broker's) asks to archive, if it does.
pub fn discard_ready_asked(request: &ShareAcknowledgeRequest) -> Option<u64> {
    let mut bytes = request.unknown_tagged_fields.get(&TAG_DISCARD_READY).filter(|b| b.len() == 8)?.clone();
    Some(bytes.get_u64())
}

/// Sets the offsets archived in answer to [`ask_to_discard_ready`].
pub fn set_discarded(response: &mut ShareAcknowledgeResponse, offsets: &[i64]) {
    let mut bytes = BytesMut::with_capacity(offsets.len() * 8);
    for offset in offsets {
        bytes.put_i64(*offset);
    }
    response.unknown_tagged_fields.insert(TAG_DISCARD_READY, bytes.freeze());
}

/// The offsets an answer to [`ask_to_discard_ready`] says were archived.
pub fn discarded(response: &ShareAcknowledgeResponse) -> Option<Vec<i64>> {
    let mut bytes = response.unknown_tagged_fields.get(&TAG_DISCARD_READY).filter(|b| b.len() % 8 == 0)?.clone();
    let mut offsets = Vec::with_capacity(bytes.len() / 8);
    while bytes.has_remaining() {
        offsets.push(bytes.get_i64());
    }
    Some(offsets)
}

/// Makes `request` ask the partitions' leader for their ready and unacknowledged counts.
pub fn ask_for_queue_depth(request: &mut DescribeShareGroupOffsetsRequest) {
    request.unknown_tagged_fields.insert(TAG_QUEUE_DEPTH, Bytes::from_static(&[1]));
}

/// Whether `request` (a broker's) asks for the partitions' ready and unacknowledged counts.
pub fn asks_for_queue_depth(request: &DescribeShareGroupOffsetsRequest) -> bool {
    flag(request.unknown_tagged_fields.get(&TAG_QUEUE_DEPTH))
}

/// Sets a partition's ready and unacknowledged counts in an answer to
/// [`ask_for_queue_depth`].
pub fn set_queue_depth(partition: &mut DescribeShareGroupOffsetsResponsePartition, ready: u64, unacknowledged: u64) {
    let mut bytes = BytesMut::with_capacity(16);
    bytes.put_u64(ready);
    bytes.put_u64(unacknowledged);
    partition.unknown_tagged_fields.insert(TAG_QUEUE_DEPTH, bytes.freeze());
}

/// A partition's (ready, unacknowledged) counts, as [`set_queue_depth`] set them.
pub fn queue_depth(partition: &DescribeShareGroupOffsetsResponsePartition) -> Option<(u64, u64)> {
    let mut bytes = partition.unknown_tagged_fields.get(&TAG_QUEUE_DEPTH).filter(|b| b.len() == 16)?.clone();
    Some((bytes.get_u64(), bytes.get_u64()))
}

/// Encodes a DescribeShareGroupOffsets response body at `version` (0 or 1) into `out`. v1
/// is written level by level around each partition's v0 encoding, `Lag` spliced in.
pub fn encode_described_offsets(
    response: &DescribeShareGroupOffsetsResponse,
    version: i16,
    out: &mut BytesMut,
) -> anyhow::Result<()> {
    let mut plain = response.clone();
    let lags: Vec<Vec<Vec<i64>>> = plain
        .groups
        .iter_mut()
        .map(|g| {
            let topics = g.topics.iter_mut();
            topics.map(|t| t.partitions.iter_mut().map(take_lag).collect()).collect()
        })
        .collect();
    if version < DESCRIBE_SHARE_GROUP_OFFSETS_VERSION_MAX {
        plain.encode(out, version)?;
        return Ok(());
    }
    out.put_i32(plain.throttle_time_ms);
    put_length(out, plain.groups.len());
    for (group, lags) in plain.groups.iter().zip(&lags) {
        put_compact_string(out, Some(group.group_id.as_str()));
        put_length(out, group.topics.len());
        for (topic, lags) in group.topics.iter().zip(lags) {
            put_compact_string(out, Some(topic.topic_name.as_str()));
            out.put_slice(topic.topic_id.as_bytes());
            put_length(out, topic.partitions.len());
            for (partition, lag) in topic.partitions.iter().zip(lags) {
                let mut v0 = BytesMut::new();
                partition.encode(&mut v0, 0)?;
                out.put_slice(&v0[..DESCRIBED_PARTITION_FIXED_PREFIX_BYTES]);
                out.put_i64(*lag);
                out.put_slice(&v0[DESCRIBED_PARTITION_FIXED_PREFIX_BYTES..]);
            }
            out.put_u8(0); // no tagged fields
        }
        out.put_i16(group.error_code);
        put_compact_string(out, group.error_message.as_deref());
        out.put_u8(0);
    }
    out.put_u8(0);
    Ok(())
}

/// A partition's lag taken out of its reserved tag (-1 when never set).
fn take_lag(partition: &mut DescribeShareGroupOffsetsResponsePartition) -> i64 {
    let lag = partition.unknown_tagged_fields.remove(&TAG_LAG);
    // A queue depth is only ever set in answer to a broker's request (a client's request
    // cannot ask for one: `decode_request`), and travels back to it.
    partition.unknown_tagged_fields.retain(|tag, _| *tag < RESERVED_TAG_MIN || *tag == TAG_QUEUE_DEPTH);
    lag.filter(|b| b.len() == 8).map_or(-1, |mut b| b.get_i64())
}

/// A compact array's length (unsigned varint of length + 1).
fn put_length(out: &mut BytesMut, length: usize) {
    put_unsigned_varint(out, length as u32 + 1);
}

fn put_compact_string(out: &mut BytesMut, value: Option<&str>) {
    match value {
        None => out.put_u8(0),
        Some(text) => {
            put_unsigned_varint(out, text.len() as u32 + 1);
            out.put_slice(text.as_bytes());
        }
    }
}

fn put_unsigned_varint(out: &mut BytesMut, mut value: u32) {
    while value >= 0x80 {
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::share_acknowledge_request::{
        AcknowledgePartition, AcknowledgeTopic, AcknowledgementBatch,
    };
    use kafka_protocol::messages::share_fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::GroupId;
    use kafka_protocol::protocol::StrBytes;

    fn v1_bytes(request: &impl Encodable) -> Vec<u8> {
        let mut bytes = BytesMut::new();
        request.encode(&mut bytes, CODEC_VERSION).unwrap();
        bytes.to_vec()
    }

    /// A v2 body as Kafka's generated code lays it out: v1 with `fields` inserted at `at`.
    fn v2_body(v1: &[u8], at: usize, fields: &[u8]) -> Bytes {
        let mut body = v1[..at].to_vec();
        body.extend_from_slice(fields);
        body.extend_from_slice(&v1[at..]);
        Bytes::from(body)
    }

    #[test]
    fn share_fetch_v2_decodes_its_acquire_mode_and_renew_flag() {
        let mut request = ShareFetchRequest::default();
        request.group_id = Some(GroupId(StrBytes::from_static_str("group")));
        request.member_id = Some(StrBytes::from_static_str("member-1"));
        request.max_records = 7;
        request.batch_size = 3;
        let mut partition = FetchPartition::default();
        partition.partition_index = 4;
        let mut topic = FetchTopic::default();
        topic.topic_id = Default::default();
        topic.partitions.push(partition);
        request.topics.push(topic);
        let v1 = v1_bytes(&request);
        // 1 + 5 ("group") and 1 + 8 ("member-1") bytes of strings, then six int32s.
        let at = 6 + 9 + SHARE_FETCH_FIXED_PREFIX_BYTES;
        let RequestKind::ShareFetch(decoded) =
            decode_request(ApiKey::ShareFetch, 2, &mut v2_body(&v1, at, &[1, 1])).unwrap()
        else {
            panic!("not a ShareFetch")
        };
        assert_eq!((decoded.max_records, decoded.batch_size), (7, 3));
        assert_eq!(decoded.topics[0].partitions[0].partition_index, 4);
        let options = share_fetch_options(&decoded).unwrap();
        assert_eq!(options, ShareFetchOptions { acquire_mode: ShareAcquireMode::RecordLimit, is_renew_ack: true });
        let bad_mode = v2_body(&v1, at, &[7, 0]);
        let RequestKind::ShareFetch(decoded) = decode_request(ApiKey::ShareFetch, 2, &mut bad_mode.clone()).unwrap()
        else {
            panic!("not a ShareFetch")
        };
        assert!(share_fetch_options(&decoded).is_err());
        assert!(decode_request(ApiKey::ShareFetch, 2, &mut Bytes::copy_from_slice(&v1[..at])).is_err());
    }

    #[test]
    fn share_acknowledge_v2_round_trips_renewals_and_lock_timeout() {
        let mut request = ShareAcknowledgeRequest::default();
        request.group_id = Some(GroupId(StrBytes::from_static_str("g")));
        request.member_id = Some(StrBytes::from_static_str("m"));
        request.share_session_epoch = 3;
        let mut batch = AcknowledgementBatch::default();
        (batch.first_offset, batch.last_offset, batch.acknowledge_types) = (5, 6, vec![4]);
        let mut partition = AcknowledgePartition::default();
        partition.acknowledgement_batches.push(batch);
        let mut topic = AcknowledgeTopic::default();
        topic.partitions.push(partition);
        request.topics.push(topic);
        let v1 = v1_bytes(&request);
        let at = 2 + 2 + SHARE_ACKNOWLEDGE_FIXED_PREFIX_BYTES;
        let RequestKind::ShareAcknowledge(decoded) =
            decode_request(ApiKey::ShareAcknowledge, 2, &mut v2_body(&v1, at, &[1])).unwrap()
        else {
            panic!("not a ShareAcknowledge")
        };
        assert!(share_acknowledge_is_renew(&decoded));
        assert_eq!(decoded.topics[0].partitions[0].acknowledgement_batches[0].acknowledge_types, vec![4]);

        let mut response = ShareAcknowledgeResponse::default();
        response.error_message = Some(StrBytes::from_static_str("oops"));
        set_acknowledge_lock_timeout_ms(&mut response, 15_000);
        let (mut v1_out, mut v2_out) = (BytesMut::new(), BytesMut::new());
        encode_acknowledge_response(&response, 1, &mut v1_out).unwrap();
        encode_acknowledge_response(&response, 2, &mut v2_out).unwrap();
        let field_at = SHARE_ACKNOWLEDGE_RESPONSE_FIXED_PREFIX_BYTES + 5;
        assert_eq!(v2_out.len(), v1_out.len() + 4);
        assert_eq!(&v2_out[field_at..field_at + 4], &15_000i32.to_be_bytes());
        let back = ShareAcknowledgeResponse::decode(&mut v1_out.freeze(), 1).unwrap();
        assert!(back.unknown_tagged_fields.is_empty(), "the reserved tag never reaches the wire");
    }

    #[test]
    fn described_offsets_v1_carry_each_partitions_lag() {
        use kafka_protocol::messages::describe_share_group_offsets_response::{
            DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponseTopic,
        };
        let mut partition = DescribeShareGroupOffsetsResponsePartition::default();
        (partition.partition_index, partition.start_offset, partition.leader_epoch) = (3, 40, 2);
        set_described_lag(&mut partition, 17);
        let mut topic = DescribeShareGroupOffsetsResponseTopic::default();
        topic.topic_name = kafka_protocol::messages::TopicName(StrBytes::from_static_str("orders"));
        topic.partitions = vec![partition.clone(), DescribeShareGroupOffsetsResponsePartition::default()];
        let mut group = DescribeShareGroupOffsetsResponseGroup::default();
        group.group_id = GroupId(StrBytes::from_static_str("g"));
        group.error_message = Some(StrBytes::from_static_str("x"));
        group.topics.push(topic);
        let mut response = DescribeShareGroupOffsetsResponse::default();
        response.groups.push(group);
        let (mut v0, mut v1) = (BytesMut::new(), BytesMut::new());
        encode_described_offsets(&response, 0, &mut v0).unwrap();
        encode_described_offsets(&response, 1, &mut v1).unwrap();
        assert_eq!(v1.len(), v0.len() + 2 * 8, "one Lag per partition");
        // v0 is the codec's own encoding with the reserved tag taken out.
        let back = DescribeShareGroupOffsetsResponse::decode(&mut v0.freeze(), 0).unwrap();
        assert!(back.groups[0].topics[0].partitions[0].unknown_tagged_fields.is_empty());
        assert_eq!(back.groups[0].topics[0].partitions[0].start_offset, 40);
        // v1: throttle, groups, "g", topics, "orders", id, partitions, then the first partition.
        let at = 4 + 1 + 2 + 1 + 7 + 16 + 1 + DESCRIBED_PARTITION_FIXED_PREFIX_BYTES;
        assert_eq!(&v1[at..at + 8], &17i64.to_be_bytes());
    }

    #[test]
    fn a_client_cannot_set_the_reserved_tags() {
        let mut request = ShareAcknowledgeRequest::default();
        request.member_id = Some(StrBytes::from_static_str("m"));
        request.unknown_tagged_fields.insert(TAG_IS_RENEW_ACK, Bytes::from_static(&[1]));
        let mut v1 = Bytes::from(v1_bytes(&request));
        let RequestKind::ShareAcknowledge(decoded) = decode_request(ApiKey::ShareAcknowledge, 1, &mut v1).unwrap()
        else {
            panic!("not a ShareAcknowledge")
        };
        assert!(!share_acknowledge_is_renew(&decoded));
    }

    #[test]
    fn broker_marks_travel_between_brokers_and_never_from_clients() {
        let mut ask = DescribeShareGroupOffsetsRequest::default();
        ask_for_queue_depth(&mut ask);
        let mut body = BytesMut::new();
        ask.encode(&mut body, 0).unwrap();
        let from_client = decode_request(ApiKey::DescribeShareGroupOffsets, 0, &mut body.clone().freeze()).unwrap();
        let RequestKind::DescribeShareGroupOffsets(from_client) = from_client else { panic!("not a describe") };
        assert!(!asks_for_queue_depth(&from_client), "a client cannot ask for a queue depth");
        let forwarded = decode_forwarded_request(ApiKey::DescribeShareGroupOffsets, 0, &mut body.freeze()).unwrap();
        let RequestKind::DescribeShareGroupOffsets(forwarded) = forwarded else { panic!("not a describe") };
        assert!(asks_for_queue_depth(&forwarded));

        let mut partition = DescribeShareGroupOffsetsResponsePartition::default();
        set_queue_depth(&mut partition, 7, 2);
        let mut topic = kafka_protocol::messages::describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseTopic::default();
        topic.partitions = vec![partition];
        let mut group = kafka_protocol::messages::describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseGroup::default();
        group.topics = vec![topic];
        let mut response = DescribeShareGroupOffsetsResponse::default();
        response.groups = vec![group];
        let mut out = BytesMut::new();
        encode_described_offsets(&response, 0, &mut out).unwrap();
        let decoded = DescribeShareGroupOffsetsResponse::decode(&mut out.freeze(), 0).unwrap();
        assert_eq!(queue_depth(&decoded.groups[0].topics[0].partitions[0]), Some((7, 2)));

        let mut discard = ShareAcknowledgeRequest::default();
        ask_to_discard_ready(&mut discard, 3);
        let mut body = BytesMut::new();
        discard.encode(&mut body, 1).unwrap();
        let RequestKind::ShareAcknowledge(from_client) =
            decode_request(ApiKey::ShareAcknowledge, 1, &mut body.clone().freeze()).unwrap()
        else {
            panic!("not an acknowledge")
        };
        assert_eq!(discard_ready_asked(&from_client), None, "a client cannot discard ready records");
        let RequestKind::ShareAcknowledge(forwarded) =
            decode_forwarded_request(ApiKey::ShareAcknowledge, 1, &mut body.freeze()).unwrap()
        else {
            panic!("not an acknowledge")
        };
        assert_eq!(discard_ready_asked(&forwarded), Some(3));
        let mut answer = ShareAcknowledgeResponse::default();
        set_discarded(&mut answer, &[4, 5, 6]);
        let mut out = BytesMut::new();
        encode_acknowledge_response(&answer, 1, &mut out).unwrap();
        let decoded = ShareAcknowledgeResponse::decode(&mut out.freeze(), 1).unwrap();
        assert_eq!(discarded(&decoded), Some(vec![4, 5, 6]));
    }
}
