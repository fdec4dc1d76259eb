//! Request decoding and response encoding around the `kafka-protocol` codecs.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use crate::chunked::{ChunkedBuf, ResponseChunk, Spliced, ZERO_COPY_BYTES_MIN};
use crate::share_wire;
use crate::versions::supported_range;

/// A decoded request.
#[derive(Debug)]
pub struct Request {
    pub api_key: ApiKey,
    pub api_version: i16,
    pub correlation_id: i32,
    pub client_id: Option<StrBytes>,
    pub body: RequestKind,
}

/// Why a frame could not become a [`Request`].
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("frame too short for a request header")]
    TooShort,
    #[error("unknown api key {api_key}")]
    UnknownApiKey { api_key: i16, correlation_id: i32 },
    /// The version is outside what we advertise. For ApiVersions the caller answers with
    /// UNSUPPORTED_VERSION; for anything else Kafka closes the connection.
    #[error("unsupported version {api_version} of {api_key:?}")]
    UnsupportedVersion { api_key: ApiKey, api_version: i16, correlation_id: i32 },
    #[error("malformed {api_key:?} v{api_version} request: {reason}")]
    Malformed { api_key: ApiKey, api_version: i16, correlation_id: i32, reason: String },
}

/// Decodes a frame (size prefix already removed) into a request.
pub fn parse_request(frame: Bytes) -> Result<Request, RequestError> {
    parse(frame, false)
}

/// Decodes a request another broker forwarded (an Envelope's): unlike a client's, the v2
/// share fields it carries in this crate's reserved tags are kept (`share_wire`).
pub fn parse_forwarded_request(frame: Bytes) -> Result<Request, RequestError> {
    parse(frame, true)
}

fn parse(mut frame: Bytes, forwarded: bool) -> Result<Request, RequestError> {
    if frame.len() < 8 {
        return Err(RequestError::TooShort);
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let api_version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes(frame[4..8].try_into().expect("4 bytes"));
    let api_key =
        ApiKey::try_from(raw_key).map_err(|()| RequestError::UnknownApiKey { api_key: raw_key, correlation_id })?;
    let Some(range) = supported_range(api_key) else {
        return Err(RequestError::UnknownApiKey { api_key: raw_key, correlation_id });
    };
    let crate_range = api_key.valid_versions();
    let version_max = share_wire::version_max(api_key);
    if api_version < range.0 || api_version > range.1 || api_version < crate_range.min || api_version > version_max {
        return Err(RequestError::UnsupportedVersion { api_key, api_version, correlation_id });
    }
    let malformed = |reason: String| RequestError::Malformed { api_key, api_version, correlation_id, reason };
    let header_version = api_key.request_header_version(api_version);
    let header = RequestHeader::decode(&mut frame, header_version).map_err(|e| malformed(e.to_string()))?;
    let body = if forwarded {
        share_wire::decode_forwarded_request(api_key, api_version, &mut frame)
    } else {
        share_wire::decode_request(api_key, api_version, &mut frame)
    }
    .map_err(malformed)?;
    // Trailing bytes are tolerated, as Kafka does: librdkafka sends a few on some versions.
    Ok(Request { api_key, api_version, correlation_id, client_id: header.client_id, body })
}

/// Encodes a response frame: size prefix, response header (v0 for ApiVersions, else per
/// the API's flexible versions) and body, as chunks for a vectored write. Record batches of
/// a Fetch response are referenced, not copied (see [`ChunkedBuf`]).
pub fn encode_response(
    api_key: ApiKey,
    api_version: i16,
    correlation_id: i32,
    body: &ResponseKind,
    spliced: Vec<Spliced>,
) -> anyhow::Result<Vec<ResponseChunk>> {
    let header_version = if api_key == ApiKey::ApiVersions { 0 } else { api_key.response_header_version(api_version) };
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    if let ResponseKind::Fetch(fetch) = body {
        // Only payloads large enough to be referenced rather than copied are registered.
        let large = |records: &&Bytes| records.len() >= ZERO_COPY_BYTES_MIN;
        let partitions = fetch.responses.iter().flat_map(|t| t.partitions.iter());
        let payloads = partitions.filter_map(|p| p.records.as_ref().filter(large).cloned()).collect();
        let mut out = ChunkedBuf::new(payloads, spliced);
        header.encode(&mut out, header_version)?;
        fetch.encode(&mut out, api_version)?;
        let size = i32::try_from(out.len())?;
        let mut chunks = vec![ResponseChunk::Bytes(Bytes::copy_from_slice(&size.to_be_bytes()))];
        chunks.extend(out.into_chunks());
        return Ok(chunks);
    }
    anyhow::ensure!(spliced.is_empty(), "only fetch responses carry spliced records");
    let mut out = BytesMut::with_capacity(256);
    out.put_i32(0);
    header.encode(&mut out, header_version)?;
    match body {
        ResponseKind::ShareAcknowledge(response) => {
            share_wire::encode_acknowledge_response(response, api_version, &mut out)?
        }
        ResponseKind::DescribeShareGroupOffsets(response) => {
            share_wire::encode_described_offsets(response, api_version, &mut out)?
        }
        _ => body.encode(&mut out, share_wire::codec_version(api_key, api_version))?,
    }
    let size = i32::try_from(out.len() - 4)?;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Ok(vec![ResponseChunk::Bytes(out.freeze())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest};

    fn frame(api_key: ApiKey, version: i16, body: RequestKind) -> Bytes {
        let mut out = BytesMut::new();
        let mut header = RequestHeader::default();
        header.request_api_key = api_key as i16;
        header.request_api_version = version;
        header.correlation_id = 7;
        header.client_id = Some(StrBytes::from_static_str("test"));
        header.encode(&mut out, api_key.request_header_version(version)).unwrap();
        body.encode(&mut out, version).unwrap();
        out.freeze()
    }

    #[test]
    fn decodes_a_flexible_request() {
        let request = parse_request(frame(ApiKey::Metadata, 12, MetadataRequest::default().into())).unwrap();
        assert_eq!(request.api_key, ApiKey::Metadata);
        assert_eq!(request.correlation_id, 7);
        assert_eq!(request.client_id.as_deref(), Some("test"));
    }

    #[test]
    fn classifies_bad_requests() {
        let mut unknown = frame(ApiKey::Metadata, 12, MetadataRequest::default().into()).to_vec();
        unknown[0..2].copy_from_slice(&999i16.to_be_bytes());
        assert!(matches!(parse_request(unknown.into()), Err(RequestError::UnknownApiKey { api_key: 999, .. })));
        let mut future = frame(ApiKey::ApiVersions, 3, ApiVersionsRequest::default().into()).to_vec();
        future[2..4].copy_from_slice(&99i16.to_be_bytes());
        assert!(matches!(parse_request(future.into()), Err(RequestError::UnsupportedVersion { api_version: 99, .. })));
        let truncated = frame(ApiKey::Metadata, 12, MetadataRequest::default().into()).slice(..9);
        assert!(matches!(parse_request(truncated), Err(RequestError::Malformed { .. })));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_frames_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_request(Bytes::from(bytes));
        }

        #[test]
        fn huge_array_counts_are_refused_not_fatal(count in 1_000_000_000i32..i32::MAX) {
            // Metadata v4: topics array count right after the header.
            let mut bytes = frame(ApiKey::Metadata, 4, MetadataRequest::default().into()).to_vec();
            let len = bytes.len();
            bytes.truncate(len - 5);
            bytes.extend_from_slice(&count.to_be_bytes());
            proptest::prop_assert!(parse_request(Bytes::from(bytes)).is_err());
        }

        #[test]
        fn mutated_requests_never_panic(position in 0usize..64, value in proptest::num::u8::ANY, cut in 0usize..64) {
            let mut bytes = frame(ApiKey::Metadata, 12, MetadataRequest::default().into()).to_vec();
            let len = bytes.len();
            bytes[position % len] = value;
            bytes.truncate(len - cut % len);
            let _ = parse_request(Bytes::from(bytes));
        }
    }
}
