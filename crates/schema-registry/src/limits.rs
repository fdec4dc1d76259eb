//! The registry port's limits, so that nobody stalls it without credentials (see
//! `serve.rs` and `http.rs`, which apply them).

use std::time::Duration;

/// The largest request body accepted (a schema with its references).
pub const REQUEST_BYTES_MAX: usize = 16 * 1024 * 1024;
/// How long one request may take, its body included (a write's durable wait is within it).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served at once; the oldest is closed to admit a new one.
pub const CONNECTIONS_MAX: usize = 128;
/// How long a client may take to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to finish a TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
