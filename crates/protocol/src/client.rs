//! The client side of the codec, for brokers talking to brokers (a follower fetching from
//! its leader): encode a request frame, decode a response frame.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

/// A whole request frame, size prefix included.
pub fn encode_request(
    api_key: ApiKey,
    api_version: i16,
    correlation_id: i32,
    client_id: &str,
    body: &RequestKind,
) -> anyhow::Result<Bytes> {
    let mut header = RequestHeader::default();
    header.request_api_key = api_key as i16;
    header.request_api_version = api_version;
    header.correlation_id = correlation_id;
    header.client_id = Some(StrBytes::from_string(client_id.to_string()));
    let mut out = BytesMut::new();
    out.put_i32(0);
    header.encode(&mut out, api_key.request_header_version(api_version))?;
    body.encode(&mut out, api_version)?;
    let size = i32::try_from(out.len() - 4)?;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Ok(out.freeze())
}

/// Decodes a response frame (size prefix removed): its correlation id and body.
pub fn decode_response(api_key: ApiKey, api_version: i16, mut frame: Bytes) -> anyhow::Result<(i32, ResponseKind)> {
    let header_version = if api_key == ApiKey::ApiVersions { 0 } else { api_key.response_header_version(api_version) };
    let header = ResponseHeader::decode(&mut frame, header_version)?;
    let body = ResponseKind::decode(api_key, &mut frame, api_version)?;
    Ok((header.correlation_id, body))
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::{FetchRequest, FetchResponse};

    use super::*;
    use crate::{encode_response, parse_request};

    #[test]
    fn a_request_we_encode_is_one_we_parse_and_back() {
        let mut fetch = FetchRequest::default();
        fetch.replica_id = kafka_protocol::messages::BrokerId(3);
        fetch.max_wait_ms = 500;
        let frame = encode_request(ApiKey::Fetch, 12, 77, "sluice-replica-3", &RequestKind::Fetch(fetch)).unwrap();
        let request = parse_request(frame.slice(4..)).unwrap();
        assert_eq!(request.correlation_id, 77);
        let RequestKind::Fetch(parsed) = request.body else { panic!("not a fetch") };
        assert_eq!(parsed.replica_id.0, 3);
        assert_eq!(parsed.max_wait_ms, 500);

        let mut response = FetchResponse::default();
        response.throttle_time_ms = 9;
        let chunks = encode_response(ApiKey::Fetch, 12, 77, &ResponseKind::Fetch(response), Vec::new()).unwrap();
        let whole: Vec<u8> = chunks
            .iter()
            .flat_map(|chunk| match chunk {
                crate::ResponseChunk::Bytes(bytes) => bytes.to_vec(),
                crate::ResponseChunk::File(_) => panic!("no file chunks registered"),
            })
            .collect();
        let (correlation_id, body) = decode_response(ApiKey::Fetch, 12, Bytes::from(whole).slice(4..)).unwrap();
        assert_eq!(correlation_id, 77);
        let ResponseKind::Fetch(decoded) = body else { panic!("not a fetch response") };
        assert_eq!(decoded.throttle_time_ms, 9);
    }
}
