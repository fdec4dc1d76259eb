//! One Kafka-protocol connection for the tools that speak the protocol themselves
//! (`sluice acl`, `sluice user`, `sluice share`): librdkafka has no API for what they do,
//! and the librdkafka built into `sluice` has no TLS, so they cannot borrow its connection.
//!
//! The connection is configured with librdkafka's property names, given as `-X key=value`
//! like the other client subcommands take them, so one set of flags reaches the same
//! listener from every tool:
//!
//! ```text
//! sluice user -b broker:9094 -X security.protocol=SASL_SSL -X sasl.mechanism=SCRAM-SHA-512 \
//!     -X sasl.username=admin -X ssl.ca.location=ca.pem list      # password: SLUICE_SASL_PASSWORD
//! ```
//!
//! It is synchronous (a std `TcpStream`, wrapped in rustls for SSL listeners): a tool sends
//! a handful of requests, one after the other. SASL is Kafka's SaslHandshake v1 then
//! SaslAuthenticate v2 rounds; SCRAM is the broker crate's client.

use std::io::{IsTerminal, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind, SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme, StreamOwned};
use sluice_security::{ScramClient, ScramMechanism};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer read (a DescribeAcls of many ACLs stays far below).
const RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;
const SASL_HANDSHAKE_VERSION: i16 = 1;
const SASL_AUTHENTICATE_VERSION: i16 = 2;
const CLIENT_ID: &str = "sluice-cli";
/// Where the password of `sasl.username` is read when `-X sasl.password` is not given.
pub const SASL_PASSWORD_ENV: &str = "SLUICE_SASL_PASSWORD";

/// The `-X` keys these tools understand (librdkafka's names and meanings).
const KNOWN_SETTINGS: &[&str] = &[
    "security.protocol",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "enable.ssl.certificate.verification",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
];

/// `-b` and `-X`, shared by `sluice acl`, `sluice user` and `sluice share`; both may be
/// given before or after the subcommand.
#[derive(Debug, clap::Args)]
pub struct ConnectionArgs {
    /// Broker to bootstrap from: any listener, reached as -X security.protocol says.
    #[arg(long, short = 'b', env = "SLUICE_BOOTSTRAP", default_value = "127.0.0.1:9092", global = true)]
    bootstrap: String,
    /// Connection settings, repeatable, librdkafka names: -X security.protocol=SASL_SSL
    /// -X sasl.mechanism=SCRAM-SHA-512 -X sasl.username=admin -X ssl.ca.location=ca.pem
    /// (sasl.password defaults to $SLUICE_SASL_PASSWORD, else a prompt).
    #[arg(short = 'X', value_name = "KEY=VALUE", global = true)]
    settings: Vec<String>,
}

impl ConnectionArgs {
    /// The first bootstrap address (the tools ask one broker; it names the others).
    pub fn bootstrap(&self) -> &str {
        self.bootstrap.split(',').next().unwrap_or(&self.bootstrap).trim()
    }

    /// Reads the settings, the TLS files and the SASL password: every mistake in them is
    /// reported before any connection is made.
    pub fn connector(&self) -> anyhow::Result<Connector> {
        Connector::new(&Settings::parse(&self.settings)?)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    fn parse(value: &str) -> anyhow::Result<SecurityProtocol> {
        match value.to_ascii_lowercase().as_str() {
            "plaintext" => Ok(SecurityProtocol::Plaintext),
            "ssl" => Ok(SecurityProtocol::Ssl),
            "sasl_plaintext" => Ok(SecurityProtocol::SaslPlaintext),
            "sasl_ssl" => Ok(SecurityProtocol::SaslSsl),
            _ => bail!("security.protocol {value:?} must be plaintext, ssl, sasl_plaintext or sasl_ssl"),
        }
    }

    fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    fn uses_sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SaslMechanism {
    Plain,
    Scram(ScramMechanism),
}

impl SaslMechanism {
    fn parse(value: &str) -> anyhow::Result<SaslMechanism> {
        let upper = value.to_ascii_uppercase();
        if upper == "PLAIN" {
            return Ok(SaslMechanism::Plain);
        }
        ScramMechanism::from_name(&upper)
            .map(SaslMechanism::Scram)
            .with_context(|| format!("sasl.mechanism {value:?} must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"))
    }

    fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::Scram(scram) => scram.name(),
        }
    }
}

/// The `-X` settings, checked: known keys, valid values. No `Debug`: it holds a password.
#[derive(Default)]
struct Settings {
    protocol: Option<SecurityProtocol>,
    ca_location: Option<PathBuf>,
    certificate_location: Option<PathBuf>,
    key_location: Option<PathBuf>,
    verify_certificate: Option<bool>,
    mechanism: Option<SaslMechanism>,
    username: Option<String>,
    password: Option<String>,
}

impl Settings {
    fn parse(pairs: &[String]) -> anyhow::Result<Settings> {
        let mut settings = Settings::default();
        for pair in pairs {
            let (key, value) = pair.split_once('=').with_context(|| format!("-X {pair:?} is not KEY=VALUE"))?;
            settings.set(key.trim(), value.trim())?;
        }
        Ok(settings)
    }

    fn set(&mut self, key: &str, value: &str) -> anyhow::Result<()> {
        match key {
            "security.protocol" => self.protocol = Some(SecurityProtocol::parse(value)?),
            "ssl.ca.location" => self.ca_location = Some(value.into()),
            "ssl.certificate.location" => self.certificate_location = Some(value.into()),
            "ssl.key.location" => self.key_location = Some(value.into()),
            "enable.ssl.certificate.verification" => self.verify_certificate = Some(parse_bool(key, value)?),
            "sasl.mechanism" => self.mechanism = Some(SaslMechanism::parse(value)?),
            "sasl.username" => self.username = Some(value.to_string()),
            "sasl.password" => self.password = Some(value.to_string()),
            _ => bail!("-X {key}: unknown setting; known: {}", KNOWN_SETTINGS.join(", ")),
        }
        Ok(())
    }
}

fn parse_bool(key: &str, value: &str) -> anyhow::Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => bail!("-X {key}={value}: must be true or false"),
    }
}

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
        let password = match (&settings.password, std::env::var(SASL_PASSWORD_ENV)) {
            (Some(password), _) => password.clone(),
            (None, Ok(password)) if !password.is_empty() => password,
            _ if std::io::stdin().is_terminal() => rpassword::prompt_password(format!("Password of {username}: "))?,
            _ => bail!("no password for sasl.username {username}: set {SASL_PASSWORD_ENV} or -X sasl.password"),
        };
        Ok(Sasl { mechanism, username, password })
    }
}

/// Opens connections as the settings say: TCP, then TLS, then SASL.
pub struct Connector {
    tls: Option<Arc<ClientConfig>>,
    sasl: Option<Sasl>,
}

impl Connector {
    fn new(settings: &Settings) -> anyhow::Result<Connector> {
        let protocol = settings.protocol.unwrap_or(SecurityProtocol::Plaintext);
        let tls = if protocol.uses_tls() { Some(Arc::new(tls_config(settings)?)) } else { None };
        let sasl = if protocol.uses_sasl() { Some(Sasl::from_settings(settings)?) } else { None };
        Ok(Connector { tls, sasl })
    }

    /// A connection to `address` (host:port), authenticated.
    pub fn connect(&self, address: &str) -> anyhow::Result<KafkaConnection> {
        let tcp = connect_tcp(address)?;
        let stream: Box<dyn Stream> = match &self.tls {
            None => Box::new(tcp),
            Some(config) => Box::new(handshake_tls(address, tcp, config.clone())?),
        };
        let mut connection = KafkaConnection { address: address.to_string(), stream, correlation_id: 0 };
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

fn connect_tcp(address: &str) -> anyhow::Result<TcpStream> {
    let resolved: Vec<_> =
        address.to_socket_addrs().map_err(|error| anyhow!("cannot resolve {address}: {error}"))?.collect();
    let mut last_error = None;
    for socket_address in resolved {
        match TcpStream::connect_timeout(&socket_address, CONNECT_TIMEOUT) {
            Ok(stream) => {
                stream.set_read_timeout(Some(IO_TIMEOUT))?;
                stream.set_write_timeout(Some(IO_TIMEOUT))?;
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(error) => last_error = Some(error),
        }
    }
    match last_error {
        Some(error) => bail!("cannot connect to {address}: {error}"),
        None => bail!("cannot connect to {address}: it resolves to no address"),
    }
}

/// A byte stream to a broker, with or without TLS.
trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

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
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

fn tls_config(settings: &Settings) -> anyhow::Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| anyhow!("TLS setup: {error}"))?;
    let builder = if settings.verify_certificate == Some(false) {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
    } else {
        builder.with_root_certificates(trusted_roots(settings.ca_location.as_ref())?)
    };
    match (&settings.certificate_location, &settings.key_location) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(certificate), Some(key)) => {
            let chain = read_certificates("ssl.certificate.location", certificate)?;
            let key = std::fs::read(key).map_err(|error| anyhow!("ssl.key.location {}: {error}", key.display()))?;
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|error| anyhow!("ssl.key.location: no unencrypted PEM private key: {error}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| anyhow!("ssl.key.location does not fit ssl.certificate.location: {error}"))
        }
        _ => bail!("a client certificate needs both ssl.certificate.location and ssl.key.location"),
    }
}

/// The CAs of `ssl.ca.location`, else the system's (as librdkafka does).
fn trusted_roots(ca_location: Option<&PathBuf>) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    let Some(path) = ca_location else {
        let native = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(native.certs);
        if added == 0 {
            bail!("no system CA certificates found: give -X ssl.ca.location=CA.pem");
        }
        return Ok(roots);
    };
    for certificate in read_certificates("ssl.ca.location", path)? {
        roots.add(certificate).map_err(|error| anyhow!("ssl.ca.location {}: {error}", path.display()))?;
    }
    Ok(roots)
}

fn read_certificates(key: &str, path: &PathBuf) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).map_err(|error| anyhow!("{key} {}: {error}", path.display()))?;
    let certificates: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|error| anyhow!("{key} {}: bad PEM certificate: {error}", path.display()))?;
    if certificates.is_empty() {
        bail!("{key} {} holds no PEM certificate", path.display());
    }
    Ok(certificates)
}

/// `enable.ssl.certificate.verification=false`: any certificate is taken, as librdkafka
/// does then (the handshake's signatures are still checked, so the link stays encrypted to
/// whoever holds the key of the certificate shown).
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            certificate,
            signature,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            certificate,
            signature,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// An open, authenticated connection to one broker.
pub struct KafkaConnection {
    address: String,
    stream: Box<dyn Stream>,
    correlation_id: i32,
}

impl KafkaConnection {
    /// Sends one request and reads its answer.
    pub fn call(&mut self, api_key: ApiKey, version: i16, body: RequestKind) -> anyhow::Result<ResponseKind> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let frame = sluice_protocol::encode_request(api_key, version, self.correlation_id, CLIENT_ID, &body)?;
        let sent = self.stream.write_all(&frame).and_then(|()| self.stream.flush());
        sent.map_err(|error| anyhow!("sending to {}: {error}", self.address))?;
        let answer = self.read_frame()?;
        let address = &self.address;
        let (correlation_id, response) = sluice_protocol::decode_response(api_key, version, answer)
            .map_err(|error| anyhow!("{address} answered {api_key:?} with what is not one: {error}"))?;
        if correlation_id != self.correlation_id {
            bail!("{address} answered request {} with correlation id {correlation_id}", self.correlation_id);
        }
        Ok(response)
    }

    fn read_frame(&mut self) -> anyhow::Result<Bytes> {
        let address = &self.address;
        let hint = "(is -X security.protocol that of this listener?)";
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(|error| match error.kind() {
            std::io::ErrorKind::UnexpectedEof => anyhow!("{address} closed the connection without answering {hint}"),
            _ => anyhow!("reading the answer of {address}: {error} {hint}"),
        })?;
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

    fn check(pairs: &[&str], expected_error: Option<&str>) {
        let pairs: Vec<String> = pairs.iter().map(|p| p.to_string()).collect();
        match (Settings::parse(&pairs), expected_error) {
            (Ok(_), None) => {}
            (Err(error), Some(expected)) => assert!(error.to_string().contains(expected), "{error}"),
            (Ok(_), Some(expected)) => panic!("{pairs:?}: accepted, expected error {expected:?}"),
            (Err(error), None) => panic!("{pairs:?}: {error}"),
        }
    }

    #[test]
    fn settings_take_librdkafka_names() {
        check(&["security.protocol=SASL_SSL", "sasl.mechanism=scram-sha-512", "sasl.username=admin"], None);
        check(&["security.protocol=ssl", "enable.ssl.certificate.verification=false"], None);
        check(&["bootstrap.servers=x"], Some("unknown setting; known: security.protocol, ssl.ca.location"));
        check(&["security.protocol=tls"], Some("must be plaintext, ssl, sasl_plaintext or sasl_ssl"));
        check(&["sasl.mechanism=GSSAPI"], Some("must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"));
        check(&["security.protocol"], Some("is not KEY=VALUE"));
        check(&["enable.ssl.certificate.verification=no"], Some("must be true or false"));
    }

    #[test]
    fn host_of_strips_port_and_brackets() {
        assert_eq!(host_of("127.0.0.1:9092"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9092"), "::1");
        assert_eq!(host_of("broker.example"), "broker.example");
    }
}
