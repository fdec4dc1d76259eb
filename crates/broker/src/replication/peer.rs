//! A Kafka-protocol connection from this broker to another one (a follower to its
//! leader): one request at a time, every step bounded by a timeout.

use std::net::IpAddr;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use sluice_protocol::{decode_frame, decode_response, encode_request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response accepted from a peer.
pub const PEER_RESPONSE_BYTES_MAX: usize = 128 * 1024 * 1024;
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 2_000;

pub struct PeerConnection {
    stream: TcpStream,
    buffer: BytesMut,
    next_correlation_id: i32,
    client_id: String,
}

impl PeerConnection {
    /// Connects to `address`, from `source_address` when set (`[cluster] source_address`).
    pub async fn connect(
        address: &str,
        source_address: Option<IpAddr>,
        client_id: String,
    ) -> anyhow::Result<PeerConnection> {
        let connect = sluice_cluster::net::connect_from(address, source_address);
        let stream = tokio::time::timeout(Duration::from_millis(PEER_CONNECT_TIMEOUT_MS), connect).await??;
        stream.set_nodelay(true)?;
        Ok(PeerConnection { stream, buffer: BytesMut::with_capacity(64 * 1024), next_correlation_id: 1, client_id })
    }

    /// Sends one request and waits (at most `timeout`) for its response.
    pub async fn call(
        &mut self,
        api_key: ApiKey,
        version: i16,
        body: &RequestKind,
        timeout: Duration,
    ) -> anyhow::Result<ResponseKind> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let frame = encode_request(api_key, version, correlation_id, &self.client_id, body)?;
        tokio::time::timeout(timeout, async {
            self.stream.write_all(&frame).await?;
            loop {
                if let Some(frame) = decode_frame(&mut self.buffer, PEER_RESPONSE_BYTES_MAX)? {
                    let (got, response) = decode_response(api_key, version, frame)?;
                    anyhow::ensure!(got == correlation_id, "correlation id {got}, expected {correlation_id}");
                    return Ok(response);
                }
                if self.stream.read_buf(&mut self.buffer).await? == 0 {
                    anyhow::bail!("peer closed the connection");
                }
            }
        })
        .await
        .map_err(|_| anyhow::anyhow!("peer did not answer within {timeout:?}"))?
    }
}
