//! The registry's listener: HTTP/1.1, or HTTPS with the broker's certificate, with the
//! bounds every broker port has, so that nobody stalls it without credentials: at most
//! `CONNECTIONS_MAX` connections (a new one closes the oldest), request headers within
//! `HEADER_READ_TIMEOUT`, a TLS handshake within `TLS_HANDSHAKE_TIMEOUT`, a whole request
//! within `REQUEST_TIMEOUT`, a body of at most `REQUEST_BYTES_MAX` (`limits.rs`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use tower::ServiceExt;

use crate::authorization::ClientAddress;
use crate::http::{router, Gate};
use crate::limits::{CONNECTIONS_MAX, HEADER_READ_TIMEOUT, TLS_HANDSHAKE_TIMEOUT};
use crate::registry::Registry;

/// HTTPS: this node's side, and its side as a client of other nodes' registries.
pub struct RegistryTls {
    pub acceptor: TlsAcceptor,
    /// Forwards to other nodes (`None` on a node that has none to forward to).
    pub peers: Option<TlsConnector>,
}

/// Serves the REST API on `listener` (over TLS with `tls`) until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    gate: Option<Arc<dyn Gate>>,
    tls: Option<RegistryTls>,
) -> std::io::Result<()> {
    let (tls, peers_tls) = match tls {
        None => (None, None),
        Some(RegistryTls { acceptor, peers }) => (Some(acceptor), peers),
    };
    let app = router(registry, gate, peers_tls);
    // Served connections, oldest first.
    let mut open: VecDeque<tokio::task::AbortHandle> = VecDeque::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok((stream, peer)) => (stream, peer),
            Err(error) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(%error, "schema registry accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        open.retain(|connection| !connection.is_finished());
        if open.len() >= CONNECTIONS_MAX {
            open.pop_front().expect("full").abort();
        }
        assert!(open.len() < CONNECTIONS_MAX);
        let address = ClientAddress(peer.ip());
        let app = app.clone().map_request(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(address);
            request
        });
        let tls = tls.clone();
        let served = tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, app).await,
                Some(acceptor) => {
                    if let Ok(Ok(stream)) = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        serve_connection(stream, app).await;
                    }
                }
            }
        });
        open.push_back(served.abort_handle());
    }
}

async fn serve_connection<S>(stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static, app: S)
where
    S: tower::Service<hyper::Request<hyper::body::Incoming>, Response = axum::response::Response>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app))
        .await;
}
