//! Writes that reach a node not leading `_schemas` go to the node that does, over HTTP or
//! HTTPS as the registries serve, as Confluent's followers forward to their leader: the
//! client may call any node. So do reads that reach a node holding no replica of `_schemas`
//! (a cluster larger than the topic's replication factor), which has no state to answer from.
//!
//! The leader stamps every answer with the `_schemas` offset its state has applied
//! ([`APPLIED_HEADER`]); the forwarding node waits (within [`CATCH_UP_WAIT`]) until its own
//! replica has committed up to there, so a client that registers through it and reads back
//! through it sees its write.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use crate::error::RegistryError;
use crate::limits::REQUEST_BYTES_MAX;
use crate::registry::{Registry, Writer};

/// Marks a forwarded request: its receiver never forwards it again.
pub const FORWARDED_HEADER: &str = "x-sluice-forwarded";
/// The `_schemas` offset the answering node's state has applied.
pub const APPLIED_HEADER: &str = "x-sluice-schemas-applied";
/// How long a forwarded request may take at the leader.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(35);
/// How long the forwarding node waits for its replica to reach the leader's write.
const CATCH_UP_WAIT: Duration = Duration::from_secs(5);

/// Whether a request changes the registry (lookups and compatibility checks are POSTs
/// that only read).
pub fn is_write(request: &Request) -> bool {
    let path = request.uri().path();
    match *request.method() {
        Method::PUT | Method::DELETE => true,
        Method::POST => path.starts_with("/subjects/") && path.trim_end_matches('/').ends_with("/versions"),
        _ => false,
    }
}

/// What forwarding needs: the registry (its log says who leads) and, when the registries
/// serve HTTPS, how to reach another node's.
#[derive(Clone)]
pub struct Forwarder {
    pub registry: Arc<Registry>,
    /// Connects to other nodes' registries over TLS (`None`: they serve plain HTTP).
    pub peers_tls: Option<TlsConnector>,
}

/// Runs `request` where it must run: here, or at the leader of `_schemas` when it is a
/// write this node cannot make, or a read on a node that holds no replica to answer from.
pub async fn route(forwarder: &Forwarder, request: Request, next: axum::middleware::Next) -> Response {
    let registry = &forwarder.registry;
    let forwarded = request.headers().get(FORWARDED_HEADER).is_some();
    if !forwarded && (is_write(&request) || !registry.log().answers_reads()) {
        match registry.log().writer().await {
            Err(error) => return error.into_response(),
            Ok(Writer::Remote(address)) => {
                return forward(forwarder, address, request).await.unwrap_or_else(|e| e.into_response())
            }
            Ok(Writer::Local) => {}
        }
    }
    let mut response = next.run(request).await;
    let applied = HeaderValue::from(registry.applied_to());
    response.headers_mut().insert(APPLIED_HEADER, applied);
    response
}

/// Sends `request` to the registry at `address` and relays its answer.
async fn forward(forwarder: &Forwarder, address: String, request: Request) -> Result<Response, RegistryError> {
    let unreachable = |why: String| RegistryError::NotLeader(format!("{address}: {why}"));
    let (mut parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, REQUEST_BYTES_MAX)
        .await
        .map_err(|_| RegistryError::PayloadTooLarge(format!("request body larger than {REQUEST_BYTES_MAX} bytes")))?;
    parts.headers.insert(FORWARDED_HEADER, HeaderValue::from_static("1"));
    parts
        .headers
        .insert(axum::http::header::HOST, HeaderValue::from_str(&address).map_err(|e| unreachable(e.to_string()))?);
    let outbound = hyper::Request::from_parts(parts, http_body_util::Full::new(body));
    let answer = tokio::time::timeout(FORWARD_TIMEOUT, async {
        let stream = tokio::net::TcpStream::connect(&address).await.map_err(|e| unreachable(e.to_string()))?;
        match &forwarder.peers_tls {
            None => exchange(stream, outbound).await,
            Some(connector) => {
                let host = address.rsplit_once(':').map_or(address.as_str(), |(host, _)| host);
                let name = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                    .map_err(|e| unreachable(e.to_string()))?;
                let stream = connector.connect(name, stream).await.map_err(|e| unreachable(e.to_string()))?;
                exchange(stream, outbound).await
            }
        }
        .map_err(|e| unreachable(e.to_string()))
    })
    .await
    .map_err(|_| unreachable("no answer in time".to_string()))??;
    let (parts, body) = answer;
    let applied = parts.headers.get(APPLIED_HEADER).and_then(|v| v.to_str().ok()?.parse::<i64>().ok());
    if let Some(applied) = applied.filter(|_| forwarder.registry.log().answers_reads()) {
        wait_committed(&forwarder.registry, applied).await;
    }
    Ok(Response::from_parts(parts, Body::from(body)))
}

/// One HTTP/1.1 request and its whole answer over `stream`.
async fn exchange(
    stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
    outbound: hyper::Request<http_body_util::Full<Bytes>>,
) -> Result<(axum::http::response::Parts, Bytes), hyper::Error> {
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let (parts, body) = sender.send_request(outbound).await?.into_parts();
    Ok((parts, body.collect().await?.to_bytes()))
}

/// Waits until this node's replica committed up to `offset` (or [`CATCH_UP_WAIT`] passed).
async fn wait_committed(registry: &Arc<Registry>, offset: i64) {
    let deadline = tokio::time::Instant::now() + CATCH_UP_WAIT;
    while registry.log().committed_end() < offset && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
