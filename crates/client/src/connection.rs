//! One Kafka-protocol connection: TCP, then TLS, then SASL (Kafka's SaslHandshake v1 then
//! SaslAuthenticate v2 rounds; SCRAM is `sluice-security`'s client), then requests one at
//! a time. Synchronous (a std `TcpStream`): its users send a handful of requests, one after
//! the other (the tools), or run it on a blocking pool (the console).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind, SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use sluice_security::ScramClient;

use crate::exchange::Exchange;
use crate::settings::{SaslMechanism, Settings};
use crate::tls::tls_config;

/// How long a connection may take to open unless `socket.connection.setup.timeout.ms` says:
/// a broker that is down is reported within seconds, not after a minute of silence.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// How long an answer may take unless `socket.timeout.ms` says.
pub const IO_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Largest answer read (a DescribeAcls of many ACLs, a Fetch of a few MiB stay far below).
const RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;
const SASL_HANDSHAKE_VERSION: i16 = 1;
const SASL_AUTHENTICATE_VERSION: i16 = 2;
/// The `client.id` unless [`Connector::with_client_id`] names another.
const DEFAULT_CLIENT_ID: &str = "sluice";

/// Who to authenticate as, once the TLS (if any) is up.
struct Sasl {
    mechanism: SaslMechanism,
    username: String,
    password: String,
}

impl Sasl {
    fn from_settings(settings: &Settings) -> anyhow::Result<Sasl> {
        let mechanism =
            settings.mechanism.context("a SASL listener needs -X sasl.mechanism=PLAIN|SCRAM-SHA-256|SCRAM-SHA-512")?;
        let username = settings.username.clone().context("a SASL listener needs -X sasl.username=NAME")?;
        let password =
            settings.password.clone().with_context(|| format!("no password for sasl.username {username}"))?;
        Ok(Sasl { mechanism, username, password })
    }
}

/// Opens connections as the settings say: TCP, then TLS, then SASL.
pub struct Connector {
    tls: Option<Arc<ClientConfig>>,
    sasl: Option<Sasl>,
    /// The `client.id` of every request (brokers log it and quotas may name it).
    client_id: String,
    connect_timeout: Duration,
    io_timeout: Duration,
}

impl Connector {
    /// Checks the settings and reads the TLS files: every mistake in them is reported
    /// before any connection is made.
    pub fn new(settings: &Settings) -> anyhow::Result<Connector> {
        let protocol = settings.protocol();
        let tls = if protocol.uses_tls() { Some(Arc::new(tls_config(settings)?)) } else { None };
        let sasl = if protocol.uses_sasl() { Some(Sasl::from_settings(settings)?) } else { None };
        Ok(Connector {
            tls,
            sasl,
            client_id: DEFAULT_CLIENT_ID.to_string(),
            connect_timeout: settings.connect_timeout.unwrap_or(CONNECT_TIMEOUT_DEFAULT),
            io_timeout: settings.io_timeout.unwrap_or(IO_TIMEOUT_DEFAULT),
        })
    }

    /// The same, sending `client_id` as each request's `client.id`.
    pub fn with_client_id(mut self, client_id: &str) -> Connector {
        self.client_id = client_id.to_string();
        self
    }

    /// From now on, sets each connection up and awaits each answer for at most `limit` (a
    /// caller that must give up by a deadline).
    pub fn limit_timeouts(&mut self, limit: Duration) {
        self.connect_timeout = self.connect_timeout.min(limit);
        self.io_timeout = self.io_timeout.min(limit);
    }

    /// The SASL user connections authenticate as, if any.
    pub fn user(&self) -> Option<&str> {
        self.sasl.as_ref().map(|sasl| sasl.username.as_str())
    }

    /// A connection to `address` (host:port), authenticated.
    pub fn connect(&self, address: &str) -> anyhow::Result<KafkaConnection> {
        let tcp = connect_tcp(address, self.connect_timeout, self.io_timeout)?;
        let stream: Box<dyn Stream> = match &self.tls {
            None => Box::new(tcp),
            Some(config) => Box::new(handshake_tls(address, tcp, config.clone())?),
        };
        let mut connection = KafkaConnection {
            address: address.to_string(),
            stream,
            correlation_id: 0,
            client_id: self.client_id.clone(),
            io_timeout: self.io_timeout,
        };
        if let Some(sasl) = &self.sasl {
            connection.authenticate(sasl).map_err(|error| {
                anyhow!("authentication to {address} as {} ({}) failed: {error}", sasl.username, sasl.mechanism.name())
            })?;
        }
        Ok(connection)
    }

    /// One request and its answer on a fresh connection to `address`.
    pub fn call(
        &self,
        address: &str,
        api_key: ApiKey,
        version: i16,
        body: RequestKind,
    ) -> anyhow::Result<ResponseKind> {
        self.connect(address)?.call(api_key, version, body)
    }
}

fn connect_tcp(address: &str, connect_timeout: Duration, io_timeout: Duration) -> anyhow::Result<TcpStream> {
    let resolved: Vec<_> = address
        .to_socket_addrs()
        .map_err(|error| anyhow!("cannot reach {address}: cannot resolve it ({})", io_reason(&error, connect_timeout)))?
        .collect();
    let mut last_error = None;
    for socket_address in resolved {
        match TcpStream::connect_timeout(&socket_address, connect_timeout) {
            Ok(stream) => {
                stream.set_read_timeout(Some(io_timeout))?;
                stream.set_write_timeout(Some(io_timeout))?;
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(error) => last_error = Some(error),
        }
    }
    match last_error {
        Some(error) => bail!("cannot reach {address}: {}", io_reason(&error, connect_timeout)),
        None => bail!("cannot reach {address}: it resolves to no address"),
    }
}

/// Why a socket operation failed, in words: "connection refused", not
/// "Connection refused (os error 111)".
pub fn io_reason(error: &std::io::Error, timeout: Duration) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::ConnectionRefused => "connection refused".to_string(),
        ErrorKind::TimedOut | ErrorKind::WouldBlock => {
            format!("no answer within {} ms", timeout.as_millis())
        }
        ErrorKind::HostUnreachable => "host unreachable".to_string(),
        ErrorKind::NetworkUnreachable => "network unreachable".to_string(),
        ErrorKind::ConnectionReset => "connection reset".to_string(),
        _ => {
            let text = error.to_string();
            let text = text.split(" (os error").next().unwrap_or(&text);
            let mut chars = text.chars();
            chars.next().map_or(String::new(), |first| first.to_lowercase().chain(chars).collect())
        }
    }
}

/// A byte stream to a broker, with or without TLS.
trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// Completes the TLS handshake now, so that a refused certificate is reported as such
/// rather than as a failed first request.
fn handshake_tls(
    address: &str,
    mut tcp: TcpStream,
    config: Arc<ClientConfig>,
) -> anyhow::Result<StreamOwned<ClientConnection, TcpStream>> {
    let host = host_of(address);
    let name =
        ServerName::try_from(host.to_string()).map_err(|error| anyhow!("TLS: bad host name {host:?}: {error}"))?;
    let mut tls = ClientConnection::new(config, name).map_err(|error| anyhow!("TLS setup for {address}: {error}"))?;
    while tls.is_handshaking() {
        tls.complete_io(&mut tcp).map_err(|error| anyhow!("TLS handshake with {address} failed: {error}"))?;
    }
    Ok(StreamOwned::new(tls, tcp))
}

/// `host` of `host:port` or `[v6]:port`.
pub(crate) fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// An open, authenticated connection to one broker.
pub struct KafkaConnection {
    address: String,
    stream: Box<dyn Stream>,
    correlation_id: i32,
    client_id: String,
    io_timeout: Duration,
}

impl KafkaConnection {
    /// The broker this connection reaches (`host:port`).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sends `request` as API version `version` and reads its answer, typed.
    pub fn send<R: Exchange>(&mut self, version: i16, request: R) -> anyhow::Result<R::Answer> {
        let answer = self.call(R::API, version, request.into())?;
        R::answer(answer).with_context(|| format!("{} answered {:?} in another kind", self.address, R::API))
    }

    /// Sends one request and reads its answer.
    pub fn call(&mut self, api_key: ApiKey, version: i16, body: RequestKind) -> anyhow::Result<ResponseKind> {
        self.send_only(api_key, version, body)?;
        let answer = self.read_frame()?;
        let address = &self.address;
        let (correlation_id, response) = sluice_protocol::decode_response(api_key, version, answer)
            .map_err(|error| anyhow!("{address} answered {api_key:?} with what is not one: {error}"))?;
        if correlation_id != self.correlation_id {
            bail!("{address} answered request {} with correlation id {correlation_id}", self.correlation_id);
        }
        Ok(response)
    }

    /// Sends one request that is not answered (a Produce with acks=0).
    pub fn send_only(&mut self, api_key: ApiKey, version: i16, body: RequestKind) -> anyhow::Result<()> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let frame = sluice_protocol::encode_request(api_key, version, self.correlation_id, &self.client_id, &body)?;
        let sent = self.stream.write_all(&frame).and_then(|()| self.stream.flush());
        sent.map_err(|error| anyhow!("sending to {}: {}", self.address, io_reason(&error, self.io_timeout)))
    }

    fn read_frame(&mut self) -> anyhow::Result<Bytes> {
        let address = &self.address;
        let hint = "(is -X security.protocol that of this listener?)";
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(|error| match error.kind() {
            std::io::ErrorKind::UnexpectedEof => anyhow!("{address} closed the connection without answering {hint}"),
            _ => anyhow!("reading the answer of {address}: {} {hint}", io_reason(&error, self.io_timeout)),
        })?;
        if &size == b"HTTP" {
            bail!("{address} answered in HTTP: it is not a Kafka listener");
        }
        let size = usize::try_from(i32::from_be_bytes(size)).map_err(|_| anyhow!("{address}: negative answer size"))?;
        if size > RESPONSE_BYTES_MAX {
            bail!("{address} sent an answer of {size} bytes, more than {RESPONSE_BYTES_MAX} {hint}");
        }
        let mut answer = vec![0u8; size];
        self.stream.read_exact(&mut answer).map_err(|error| anyhow!("reading the answer of {address}: {error}"))?;
        Ok(Bytes::from(answer))
    }

    /// SaslHandshake, then the mechanism's SaslAuthenticate rounds.
    fn authenticate(&mut self, sasl: &Sasl) -> anyhow::Result<()> {
        let mut handshake = SaslHandshakeRequest::default();
        handshake.mechanism = StrBytes::from_static_str(sasl.mechanism.name());
        let answer = self.call(ApiKey::SaslHandshake, SASL_HANDSHAKE_VERSION, RequestKind::SaslHandshake(handshake))?;
        let ResponseKind::SaslHandshake(answer) = answer else { bail!("SaslHandshake answered in another kind") };
        if answer.error_code != 0 {
            let offered: Vec<&str> = answer.mechanisms.iter().map(|m| m.as_str()).collect();
            bail!("the listener does not offer {} (it offers {})", sasl.mechanism.name(), offered.join(", "));
        }
        match sasl.mechanism {
            SaslMechanism::Plain => {
                self.sasl_round(format!("\0{}\0{}", sasl.username, sasl.password).into_bytes())?;
            }
            SaslMechanism::Scram(scram) => {
                let (mut client, client_first) = ScramClient::start(scram, &sasl.username, sasl.password.as_bytes());
                let server_first = self.sasl_round(client_first)?;
                let client_final = client.respond(&server_first).map_err(|error| anyhow!("SCRAM: {error}"))?;
                let server_final = self.sasl_round(client_final)?;
                client.verify(&server_final).map_err(|error| anyhow!("the broker failed its SCRAM proof: {error}"))?;
            }
        }
        Ok(())
    }

    /// One SaslAuthenticate exchange: our token out, the broker's back.
    fn sasl_round(&mut self, token: Vec<u8>) -> anyhow::Result<Bytes> {
        let mut request = SaslAuthenticateRequest::default();
        request.auth_bytes = token.into();
        let answer =
            self.call(ApiKey::SaslAuthenticate, SASL_AUTHENTICATE_VERSION, RequestKind::SaslAuthenticate(request))?;
        let ResponseKind::SaslAuthenticate(answer) = answer else { bail!("SaslAuthenticate answered in another kind") };
        if answer.error_code != 0 {
            bail!("{}", answer.error_message.as_deref().unwrap_or("the broker refused the credentials"));
        }
        Ok(answer.auth_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_strips_port_and_brackets() {
        assert_eq!(host_of("127.0.0.1:9092"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9092"), "::1");
        assert_eq!(host_of("broker.example"), "broker.example");
    }
}
