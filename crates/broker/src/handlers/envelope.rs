//! Envelope (API 58): a request one broker forwards to another on behalf of a client,
//! carrying the client's principal and address, as Kafka's brokers forward to the
//! controller.
//!
//! Why: the AMQP front door of a node serves queues led by other nodes. It authenticates
//! the AMQP user itself, then sends each Kafka request it builds to the node that serves it,
//! wrapped here; that node authorizes and answers the inner request as the user, so ACLs,
//! quotas and durability apply exactly as if the user were connected there.
//!
//! Only the brokers' own principal may send one (CLUSTER_ACTION, `authorize::rule`), and an
//! Envelope inside an Envelope is refused. The principal travels as Kafka's
//! `DefaultPrincipalData`, version-prefixed, as `KafkaPrincipalSerde` writes it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, DefaultPrincipalData, EnvelopeRequest, EnvelopeResponse, RequestKind, ResponseKind,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;
use sluice_protocol::{decode_response, encode_request, encode_response, parse_forwarded_request, ResponseChunk};

use super::{answer_in_process, Answer, Call, ClientSession};

/// The `DefaultPrincipalData` version written (its only one).
const PRINCIPAL_DATA_VERSION: i16 = 0;
/// The Envelope version sent and served.
pub(crate) const ENVELOPE_VERSION: i16 = 0;
/// The client id inner requests carry.
const FORWARDED_CLIENT_ID: &str = "sluice-forwarded";

/// `principal` (`Type:name`) as Kafka serializes it for an Envelope.
fn encode_principal(principal: &str) -> Bytes {
    let (kind, name) = principal.split_once(':').unwrap_or(("User", principal));
    let data = DefaultPrincipalData::default()
        .with_type(StrBytes::from_string(kind.to_string()))
        .with_name(StrBytes::from_string(name.to_string()));
    let mut out = BytesMut::new();
    out.put_i16(PRINCIPAL_DATA_VERSION);
    data.encode(&mut out, PRINCIPAL_DATA_VERSION).expect("a principal encodes");
    out.freeze()
}

/// The principal an Envelope names, as `Type:name`.
fn decode_principal(mut bytes: Bytes) -> Option<String> {
    if bytes.remaining() < 2 {
        return None;
    }
    let version = bytes.get_i16();
    if version != PRINCIPAL_DATA_VERSION {
        return None;
    }
    let data = DefaultPrincipalData::decode(&mut bytes, version).ok()?;
    Some(format!("{}:{}", data._type.as_str(), data.name.as_str()))
}

/// `request` wrapped for forwarding as `principal`, connected from `peer`.
pub(crate) fn wrap(
    principal: &str,
    peer: SocketAddr,
    api_key: ApiKey,
    api_version: i16,
    request: &RequestKind,
) -> anyhow::Result<RequestKind> {
    let frame = encode_request(api_key, api_version, 0, FORWARDED_CLIENT_ID, request)?;
    let address = match peer.ip() {
        IpAddr::V4(ip) => Bytes::copy_from_slice(&ip.octets()),
        IpAddr::V6(ip) => Bytes::copy_from_slice(&ip.octets()),
    };
    let envelope = EnvelopeRequest::default()
        .with_request_data(frame.slice(4..))
        .with_request_principal(Some(encode_principal(principal)))
        .with_client_host_address(address);
    Ok(RequestKind::Envelope(envelope))
}

/// The inner response of an Envelope's answer.
pub(crate) fn unwrap(api_key: ApiKey, api_version: i16, response: ResponseKind) -> anyhow::Result<ResponseKind> {
    let ResponseKind::Envelope(envelope) = response else { anyhow::bail!("not an Envelope response") };
    if let Some(error) = ResponseError::try_from_code(envelope.error_code) {
        anyhow::bail!("the Envelope was refused: {error}");
    }
    let data = envelope.response_data.ok_or_else(|| anyhow::anyhow!("an Envelope response without data"))?;
    Ok(decode_response(api_key, api_version, data)?.1)
}

fn refused(error: ResponseError) -> ResponseKind {
    ResponseKind::Envelope(EnvelopeResponse::default().with_error_code(error.code()))
}

fn client_address(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// Answers a forwarded request as the principal it carries.
pub(super) fn answer(call: &Call, request: EnvelopeRequest) -> Answer {
    let principal = request.request_principal.and_then(decode_principal);
    let address = client_address(&request.client_host_address);
    let (Some(principal), Some(address)) = (principal, address) else {
        return super::now(refused(ResponseError::InvalidRequest));
    };
    let inner = match parse_forwarded_request(request.request_data) {
        Ok(inner) if inner.api_key != ApiKey::Envelope && inner.api_key != ApiKey::Fetch => inner,
        Ok(_) => return super::now(refused(ResponseError::InvalidRequest)),
        Err(error) => {
            tracing::debug!(%error, "a forwarded request does not parse");
            return super::now(refused(ResponseError::InvalidRequest));
        }
    };
    let session = ClientSession {
        peer: SocketAddr::new(address, 0),
        listener: call.session.listener,
        principal: Arc::from(principal.as_str()),
        throttle: Arc::new(sluice_security::quota::ConnectionThrottle::default()),
    };
    let (api_key, api_version) = (inner.api_key, inner.api_version);
    let answered = answer_in_process(&call.broker, &session, api_key, api_version, inner.body);
    Box::pin(async move {
        let Some(response) = answered.await else { return Some(refused(ResponseError::UnknownServerError)) };
        let encoded = match encode_response(api_key, api_version, 0, &response, Vec::new()) {
            Ok(chunks) => chunks,
            Err(error) => {
                tracing::warn!(%error, ?api_key, "a forwarded request's answer does not encode");
                return Some(refused(ResponseError::UnknownServerError));
            }
        };
        let mut data = BytesMut::new();
        for chunk in encoded {
            let ResponseChunk::Bytes(bytes) = chunk else { unreachable!("only Fetch answers carry file chunks") };
            data.extend_from_slice(&bytes);
        }
        Some(ResponseKind::Envelope(EnvelopeResponse::default().with_response_data(Some(data.freeze().slice(4..)))))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_survives_its_envelope() {
        assert_eq!(decode_principal(encode_principal("User:alice")).as_deref(), Some("User:alice"));
        assert_eq!(decode_principal(encode_principal("User:ANONYMOUS")).as_deref(), Some("User:ANONYMOUS"));
        assert_eq!(decode_principal(Bytes::from_static(&[0, 9, 1])), None);
    }
}
