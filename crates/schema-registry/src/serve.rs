//! The registry's listener: HTTP/1.1, or HTTPS with the broker's certificate, on the
//! broker's bounded HTTP port (`sluice-http`): at most `CONNECTIONS_MAX` connections (a new
//! one closes the oldest), request headers within `HEADER_READ_TIMEOUT`, a TLS handshake
//! within `TLS_HANDSHAKE_TIMEOUT`; the router adds a whole request within `REQUEST_TIMEOUT`
//! and a body of at most `REQUEST_BYTES_MAX` (`limits.rs`).

use std::sync::Arc;

use sluice_http::HttpLimits;
use tokio::net::TcpListener;
use tokio_rustls::{TlsAcceptor, TlsConnector};

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
) {
    let (tls, peers_tls) = match tls {
        None => (None, None),
        Some(RegistryTls { acceptor, peers }) => (Some(acceptor), peers),
    };
    let limits = HttpLimits {
        connections_max: CONNECTIONS_MAX,
        header_read_timeout: HEADER_READ_TIMEOUT,
        tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
    };
    sluice_http::serve(listener, router(registry, gate, peers_tls), tls, limits, "schema registry").await
}
