//! One client connection: read frames, dispatch requests in arrival order, write responses
//! in the same order, with at most `max_inflight_requests_per_connection` outstanding.
//!
//! Bad input closes only this connection (as Kafka does): oversized or negative frame
//! sizes, undecodable headers or bodies, unknown APIs and unsupported versions. The one
//! exception is ApiVersions at an unsupported version, answered with UNSUPPORTED_VERSION.
//!
//! The stream is a TCP socket or a TLS session over one. On a SASL listener only
//! ApiVersions and the SASL exchange are served until the client authenticated
//! (security/sasl.rs); any other request before that closes the connection, as in Kafka.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use futures::stream::{FuturesOrdered, StreamExt};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use kafka_protocol::ResponseError;
use sluice_protocol::{api_versions_response, decode_frame, encode_response, parse_request, Request, RequestError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;

use crate::handlers::{self, ResponseFuture, Session};
use crate::security::sasl::{Authenticator, Next};
use crate::Broker;

const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Serves one connection of listener `listener` (index in [`Broker::listeners`]) until
/// the client closes it or sends something that closes it. `certificate_user`: the
/// subject of the client's TLS certificate, its principal on an SSL listener.
pub(crate) async fn run(
    broker: Arc<Broker>,
    mut reader: impl AsyncRead + Unpin,
    mut writer: impl AsyncWrite + Unpin,
    peer: SocketAddr,
    listener: usize,
    certificate_user: Option<String>,
) {
    let mut authenticator = Authenticator::new(broker.listeners()[listener].protocol.uses_sasl(), certificate_user);
    let mut session = Session { peer, listener, principal: Arc::from(""), throttle: Default::default() };
    let frame_bytes_max = broker.config().max_request_bytes;
    let inflight_max = broker.config().max_inflight_requests_per_connection;
    let mut buffer = BytesMut::with_capacity(READ_BUFFER_BYTES);
    let mut inflight: FuturesOrdered<ResponseFuture> = FuturesOrdered::new();
    let mut read_closed = false;
    loop {
        // Over a quota: take no new request until the throttle time has passed (KIP-219).
        let muted = session.throttle.remaining(broker.quotas.now_ms());
        // Turn buffered bytes into requests while there is room in flight.
        let mut blocked_on_memory = false;
        while muted.is_none() && inflight.len() < inflight_max {
            let frame = match decode_frame(&mut buffer, frame_bytes_max) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(%peer, %error, "closing connection: bad frame");
                    return;
                }
            };
            let permit = match reserve_produce_memory(&broker, &frame, inflight.is_empty()).await {
                Ok(permit) => permit,
                Err(()) => {
                    // Other requests of ours hold the memory: finish them first.
                    buffer = rejoin(frame, buffer);
                    blocked_on_memory = true;
                    break;
                }
            };
            let request = match parse_request(frame) {
                Ok(request) => request,
                Err(error) => match reject(error, &peer) {
                    Some(response) => {
                        inflight.push_back(response);
                        continue;
                    }
                    None => return,
                },
            };
            let sasl_step = matches!(request.body, RequestKind::SaslHandshake(_) | RequestKind::SaslAuthenticate(_));
            if !sasl_step && authenticator.session_expired() {
                tracing::info!(%peer, "closing connection: SASL session expired without re-authentication (KIP-368)");
                return;
            }
            if !sasl_step && (authenticator.user().is_some() || request.api_key == ApiKey::ApiVersions) {
                if session.principal.is_empty() {
                    if let Some(user) = authenticator.user() {
                        session.principal = Arc::from(format!("User:{user}"));
                    }
                }
                inflight.push_back(handlers::dispatch(&broker, request, permit, &session));
                continue;
            }
            match authenticate(&broker, &mut authenticator, request, &peer) {
                None => return,
                Some((response, Next::Continue)) => inflight.push_back(response),
                Some((response, Next::Close)) => {
                    // Answer, then close: nothing more is read from this client.
                    inflight.push_back(response);
                    read_closed = true;
                    buffer.clear();
                    break;
                }
            }
        }
        let can_read = !read_closed && !blocked_on_memory && muted.is_none() && inflight.len() < inflight_max;
        if inflight.is_empty() && !can_read && muted.is_none() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(muted.unwrap_or_default()), if muted.is_some() => {}
            Some(response) = inflight.next(), if !inflight.is_empty() => {
                if let Some(chunks) = response {
                    if let Err(error) = write_chunks(&mut writer, chunks).await {
                        tracing::debug!(%peer, %error, "write failed");
                        return;
                    }
                }
            }
            read = reader.read_buf(&mut buffer), if can_read => match read {
                Ok(0) => read_closed = true,
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%peer, %error, "read failed");
                    return;
                }
            },
        }
    }
}

/// Answers a SASL request, or refuses (`None`: close the connection) any other request
/// of a client that has not authenticated.
fn authenticate(
    broker: &Broker,
    authenticator: &mut Authenticator,
    request: Request,
    peer: &SocketAddr,
) -> Option<(ResponseFuture, Next)> {
    let Request { api_key, api_version, correlation_id, body, .. } = request;
    let (body, next) = match body {
        RequestKind::SaslHandshake(request) => {
            let (response, next) = authenticator.handshake(broker, request);
            (ResponseKind::SaslHandshake(response), next)
        }
        RequestKind::SaslAuthenticate(request) => {
            let (response, next) = authenticator.authenticate(broker, request);
            (ResponseKind::SaslAuthenticate(response), next)
        }
        _ => {
            tracing::info!(%peer, ?api_key, "closing connection: request before SASL authentication");
            return None;
        }
    };
    let bytes = match encode_response(api_key, api_version, correlation_id, &body) {
        Ok(bytes) => Some(bytes),
        Err(error) => {
            tracing::error!(?api_key, %error, "failed to encode a SASL response");
            None
        }
    };
    Some((Box::pin(async move { bytes }), next))
}

/// Produce frames take permits from the broker-wide produce memory budget for as long
/// as the request is in flight. Waits only when this connection has nothing in flight
/// (otherwise its own requests could hold what it waits for).
async fn reserve_produce_memory(
    broker: &Arc<Broker>,
    frame: &bytes::Bytes,
    may_wait: bool,
) -> Result<Option<OwnedSemaphorePermit>, ()> {
    let is_produce = frame.len() >= 2 && i16::from_be_bytes([frame[0], frame[1]]) == ApiKey::Produce as i16;
    if !is_produce {
        return Ok(None);
    }
    let wanted = (frame.len().min(broker.config().produce_memory_bytes)) as u32;
    let memory = broker.produce_memory.clone();
    match memory.clone().try_acquire_many_owned(wanted) {
        Ok(permit) => Ok(Some(permit)),
        Err(_) if may_wait => Ok(memory.acquire_many_owned(wanted).await.ok()),
        Err(_) => Err(()),
    }
}

/// Writes all chunks of a response with vectored writes (record batches of a fetch are
/// separate chunks, sent without another copy).
async fn write_chunks(writer: &mut (impl AsyncWrite + Unpin), mut chunks: Vec<bytes::Bytes>) -> std::io::Result<()> {
    use bytes::Buf;
    let mut first = 0;
    while first < chunks.len() {
        let slices: Vec<std::io::IoSlice<'_>> = chunks[first..].iter().map(|c| std::io::IoSlice::new(c)).collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let chunk = &mut chunks[first];
            let step = written.min(chunk.len());
            chunk.advance(step);
            written -= step;
            if chunk.is_empty() {
                first += 1;
            }
        }
    }
    Ok(())
}

/// Puts a frame back in front of the unread bytes (rare: only when memory is short).
fn rejoin(frame: bytes::Bytes, rest: BytesMut) -> BytesMut {
    let mut joined = BytesMut::with_capacity(4 + frame.len() + rest.len());
    joined.extend_from_slice(&(frame.len() as i32).to_be_bytes());
    joined.extend_from_slice(&frame);
    joined.extend_from_slice(&rest);
    joined
}

/// What to do with a request that could not be decoded: an answer for ApiVersions at an
/// unsupported version, otherwise `None` (close the connection).
fn reject(error: RequestError, peer: &SocketAddr) -> Option<ResponseFuture> {
    if let RequestError::UnsupportedVersion { api_key: ApiKey::ApiVersions, api_version, correlation_id } = error {
        tracing::info!(%peer, api_version, "ApiVersions at an unsupported version: answering with our ranges");
        let body = ResponseKind::ApiVersions(api_versions_response(ResponseError::UnsupportedVersion.code()));
        let bytes = encode_response(ApiKey::ApiVersions, 0, correlation_id, &body).ok();
        return Some(Box::pin(async move { bytes }));
    }
    tracing::warn!(%peer, %error, "closing connection: bad request");
    None
}
