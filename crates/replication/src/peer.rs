//! A Kafka-protocol connection from this broker to another one (a follower to its
//! leader): one request at a time, every step bounded by a timeout. On a TLS
//! inter-broker listener it runs over TLS; on a SASL one it authenticates first as the
//! brokers' own user (`sluice_security::InterBroker`).

use std::net::IpAddr;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use sluice_protocol::{decode_frame, decode_response, encode_request};
use sluice_security::scram::ScramClient;
use sluice_security::SaslMechanism as Mechanism;
use sluice_security::{InterBroker, INTER_BROKER_USER};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest response accepted from a peer.
pub const PEER_RESPONSE_BYTES_MAX: usize = 128 * 1024 * 1024;
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Bound on the TLS handshake and on each SASL step.
pub const PEER_AUTHENTICATE_TIMEOUT_MS: u64 = 10_000;
const SASL_HANDSHAKE_VERSION: i16 = 1;
const SASL_AUTHENTICATE_VERSION: i16 = 2;

/// A plain or TLS socket.
trait PeerStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> PeerStream for T {}

pub struct PeerConnection {
    stream: Box<dyn PeerStream>,
    buffer: BytesMut,
    next_correlation_id: i32,
    client_id: String,
}

impl PeerConnection {
    /// Connects to `address`, from `source_address` when set (`[cluster] source_address`),
    /// with the inter-broker listener's security.
    pub async fn connect(
        address: &str,
        source_address: Option<IpAddr>,
        client_id: String,
        security: &InterBroker,
    ) -> anyhow::Result<PeerConnection> {
        let connect = sluice_cluster::net::connect_from(address, source_address);
        let tcp = tokio::time::timeout(Duration::from_millis(PEER_CONNECT_TIMEOUT_MS), connect).await??;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn PeerStream> = match &security.tls {
            None => Box::new(tcp),
            Some(connector) => {
                let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
                let name = rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())?;
                let handshake = connector.connect(name, tcp);
                let timeout = Duration::from_millis(PEER_AUTHENTICATE_TIMEOUT_MS);
                Box::new(tokio::time::timeout(timeout, handshake).await.map_err(|_| anyhow::anyhow!("TLS timeout"))??)
            }
        };
        let mut connection =
            PeerConnection { stream, buffer: BytesMut::with_capacity(64 * 1024), next_correlation_id: 1, client_id };
        if let Some(mechanism) = security.sasl {
            let password = security.password().ok_or_else(|| anyhow::anyhow!("no shared secret for SASL"))?;
            connection.authenticate(mechanism, password).await?;
        }
        Ok(connection)
    }

    /// SASL as the brokers' own user: SaslHandshake, then the mechanism's SaslAuthenticate rounds.
    async fn authenticate(&mut self, mechanism: Mechanism, password: &str) -> anyhow::Result<()> {
        let timeout = Duration::from_millis(PEER_AUTHENTICATE_TIMEOUT_MS);
        let mut handshake = SaslHandshakeRequest::default();
        handshake.mechanism = StrBytes::from_static_str(mechanism.name());
        let request = RequestKind::SaslHandshake(handshake);
        let ResponseKind::SaslHandshake(answer) =
            self.call(ApiKey::SaslHandshake, SASL_HANDSHAKE_VERSION, &request, timeout).await?
        else {
            anyhow::bail!("unexpected answer to SaslHandshake");
        };
        anyhow::ensure!(answer.error_code == 0, "SaslHandshake {}: error {}", mechanism.name(), answer.error_code);
        match mechanism {
            Mechanism::Plain => {
                self.sasl_round(format!("\0{INTER_BROKER_USER}\0{password}").into_bytes(), timeout).await?;
            }
            Mechanism::Scram(scram) => {
                let (mut client, client_first) = ScramClient::start(scram, INTER_BROKER_USER, password.as_bytes());
                let server_first = self.sasl_round(client_first, timeout).await?;
                let client_final = client.respond(&server_first).map_err(|e| anyhow::anyhow!("SCRAM: {e:?}"))?;
                let server_final = self.sasl_round(client_final, timeout).await?;
                client
                    .verify(&server_final)
                    .map_err(|e| anyhow::anyhow!("SCRAM: the leader failed its proof: {e:?}"))?;
            }
            Mechanism::OauthBearer => unreachable!("inter_broker::mechanism never picks OAUTHBEARER"),
        }
        Ok(())
    }

    /// One SaslAuthenticate exchange: our token out, the server's back.
    async fn sasl_round(&mut self, token: Vec<u8>, timeout: Duration) -> anyhow::Result<bytes::Bytes> {
        let mut request = SaslAuthenticateRequest::default();
        request.auth_bytes = token.into();
        let request = RequestKind::SaslAuthenticate(request);
        let ResponseKind::SaslAuthenticate(answer) =
            self.call(ApiKey::SaslAuthenticate, SASL_AUTHENTICATE_VERSION, &request, timeout).await?
        else {
            anyhow::bail!("unexpected answer to SaslAuthenticate");
        };
        anyhow::ensure!(
            answer.error_code == 0,
            "SASL authentication as {INTER_BROKER_USER} failed: {}",
            answer.error_message.as_deref().unwrap_or("(no message)")
        );
        Ok(answer.auth_bytes)
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
