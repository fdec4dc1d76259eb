//! The broker's HTTP ports (metrics, the schema registry): one accept loop with the bounds
//! every broker port has, so that nobody stalls one without credentials.
//!
//! Why a crate of its own: each HTTP front door (the metrics endpoint, the schema registry,
//! the console) needs the same defences, and they are easy to get subtly wrong in a copy: at
//! most [`HttpLimits::connections_max`] connections (a new one closes the oldest: a scrape,
//! probe or client waiting for its answer is more likely the newest than an idle one),
//! request headers within a deadline, a TLS handshake within a deadline. Each request
//! carries the address it came from ([`ClientAddress`]), for authorization by host.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// The address a connection came from, in each request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddress(pub IpAddr);

/// A port's bounds.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Connections served at once; the oldest is closed to admit a new one.
    pub connections_max: usize,
    /// How long a client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// How long a client may take to finish a TLS handshake.
    pub tls_handshake_timeout: Duration,
}

/// What a port serves: a cloneable service answering hyper's requests.
pub trait HttpService<B>:
    tower::Service<
        hyper::Request<Incoming>,
        Response = hyper::Response<B>,
        Future: Send + 'static,
        Error: std::error::Error + Send + Sync + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S, B> HttpService<B> for S where
    S: tower::Service<
            hyper::Request<Incoming>,
            Response = hyper::Response<B>,
            Future: Send + 'static,
            Error: std::error::Error + Send + Sync + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// What an answer's body must be to be written.
pub trait HttpBody:
    http_body::Body<Data: Send, Error: std::error::Error + Send + Sync + 'static> + Send + 'static
{
}

impl<B> HttpBody for B where
    B: http_body::Body<Data: Send, Error: std::error::Error + Send + Sync + 'static> + Send + 'static
{
}

/// How long the loop waits after a failed accept (EMFILE and friends) instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `service` on `listener` (over TLS with `tls`) within `limits`, until the task is
/// dropped. `name` names the port in logs.
pub async fn serve<S, B>(listener: TcpListener, service: S, tls: Option<TlsAcceptor>, limits: HttpLimits, name: &str)
where
    S: HttpService<B>,
    B: HttpBody,
{
    assert!(limits.connections_max > 0, "a port serves at least one connection");
    // Served connections, oldest first.
    let mut open: VecDeque<tokio::task::AbortHandle> = VecDeque::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, port = name, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        open.retain(|connection| !connection.is_finished());
        if open.len() >= limits.connections_max {
            open.pop_front().expect("full").abort();
        }
        assert!(open.len() < limits.connections_max);
        let address = ClientAddress(peer.ip());
        let service = service.clone().map_request(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(address);
            request
        });
        let tls = tls.clone();
        let served = tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, service, limits).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(stream));
                    if let Ok(Ok(stream)) = handshake.await {
                        serve_connection(stream, service, limits).await;
                    }
                }
            }
        });
        open.push_back(served.abort_handle());
    }
}

async fn serve_connection<S, B>(
    stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
    service: S,
    limits: HttpLimits,
) where
    S: tower::Service<hyper::Request<Incoming>, Response = hyper::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
        .await;
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::Full;
    use hyper::body::Bytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Answers each request with the address it came from.
    async fn echo_address(request: hyper::Request<Incoming>) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
        let address = request.extensions().get::<ClientAddress>().map(|a| a.0.to_string()).unwrap_or_default();
        Ok(hyper::Response::new(Full::new(Bytes::from(address))))
    }

    #[tokio::test]
    async fn requests_carry_their_address_and_a_new_connection_beyond_the_limit_closes_the_oldest() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let limits = HttpLimits {
            connections_max: 2,
            header_read_timeout: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
        };
        tokio::spawn(serve(listener, tower::service_fn(echo_address), None, limits, "test"));
        let mut idle = Vec::new();
        for _ in 0..2 {
            let mut connection = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            connection.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
            idle.push(connection);
        }
        let mut client = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("127.0.0.1"), "{answer}");
        let mut closed = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), idle[0].read(&mut closed)).await.unwrap();
        assert_eq!(read.unwrap(), 0, "the oldest connection was closed");
    }
}
