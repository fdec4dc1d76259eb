//! The broker's side of the web console: which of this broker's own listeners the console
//! connects to as a Kafka client, and how.
//!
//! When any listener takes SASL, visitors log in and the console connects to the first SASL
//! listener with their credentials (SCRAM first, then PLAIN, as enabled), so they see what
//! their ACLs allow. Otherwise it connects to the first listener, anonymous as every client
//! there. Over TLS it checks the broker's certificate against `ssl.truststore.location`;
//! without a truststore it takes the certificate it is shown (the link is to this broker's
//! own port, and a SCRAM login proves both sides anyway).
//!
//! Keys and values framed with a schema id are decoded by the schemas of this node's
//! replica of `_schemas` (the registry state the REST API answers from): a node that
//! holds no replica decodes nothing and shows the bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use sluice_console::{ConsoleConfig, Login, NodeTotalsSource, SaslMechanism, SchemaDecoded, SchemaDecoder, Settings};
use sluice_schema_registry::decode::Decoder;
use sluice_schema_registry::schema::SchemaType;
use sluice_schema_registry::Registry;
use sluice_security::{SecurityProtocol, INTER_BROKER_USER};

use crate::Broker;

/// The console's own bound on its history interval is the one the config validates.
const _: () =
    assert!(sluice_config::CONSOLE_HISTORY_INTERVAL_MS_MIN as u128 == sluice_console::HISTORY_INTERVAL_MIN.as_millis());

/// SASL mechanisms the console logs in with, in the order tried.
const LOGIN_MECHANISMS: [&str; 3] = ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"];

/// This node's own totals, read at each of the console's samples.
fn node_totals(broker: Arc<Broker>) -> NodeTotalsSource {
    Arc::new(move || broker.metrics.load_totals())
}

/// How `broker`'s console reaches it; `registry` decodes framed keys and values.
pub fn config(broker: &Arc<Broker>, registry: Arc<Registry>) -> Result<ConsoleConfig, String> {
    let listeners = broker.listeners();
    let chosen = listeners
        .iter()
        .find(|l| l.protocol.uses_sasl())
        .or_else(|| listeners.first())
        .ok_or("the console needs a Kafka listener to connect to")?;
    let mut settings = Settings::default();
    let protocol = match chosen.protocol {
        SecurityProtocol::Plaintext => "PLAINTEXT",
        SecurityProtocol::Ssl => "SSL",
        SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
        SecurityProtocol::SaslSsl => "SASL_SSL",
    };
    let configured = |e: anyhow::Error| format!("console: {e:#}");
    settings.set("security.protocol", protocol).map_err(configured)?;
    if chosen.protocol.uses_tls() {
        match &broker.config().ssl_truststore_location {
            Some(truststore) => settings.set("ssl.ca.location", &truststore.to_string_lossy()),
            None => settings.set("enable.ssl.certificate.verification", "false"),
        }
        .map_err(configured)?;
    }
    let login = match chosen.protocol.uses_sasl() {
        false => Login::Anonymous,
        true => {
            let enabled = broker.config().sasl_enabled_mechanisms.to_ascii_uppercase();
            let enabled: Vec<&str> = enabled.split(',').map(str::trim).collect();
            let mechanisms: Vec<SaslMechanism> = LOGIN_MECHANISMS
                .iter()
                .filter(|name| enabled.contains(name))
                .filter_map(|name| SaslMechanism::parse(name).ok())
                .collect();
            if mechanisms.is_empty() {
                return Err("the console logs in with SCRAM or PLAIN; sasl.enabled.mechanisms has neither".into());
            }
            Login::Sasl(mechanisms)
        }
    };
    // With logins, the history sampler is the brokers' own user (a super user whose
    // password comes from the cluster's shared secret); without, it is anonymous as any visitor.
    let history_login =
        broker.inter_broker.password().map(|password| (INTER_BROKER_USER.to_string(), password.to_string()));
    Ok(ConsoleConfig {
        bootstrap: reachable(chosen.bind).to_string(),
        settings,
        login,
        tls: https(broker)?,
        history_interval: Duration::from_millis(broker.config().console_history_interval_ms),
        history_login,
        bench_dir: broker.config().console_bench_dir.clone(),
        node_totals: Some(node_totals(broker.clone())),
        schema_decoder: Some(Arc::new(RegistryDecoder(Decoder::new(registry)))),
    })
}

/// The console's decoding by the registry's schemas.
struct RegistryDecoder(Decoder);

impl SchemaDecoder for RegistryDecoder {
    fn decode(&self, bytes: &[u8]) -> Option<Result<SchemaDecoded, String>> {
        let decoded = self.0.decode(bytes)?;
        Some(decoded.map(|decoded| SchemaDecoded {
            kind: match decoded.schema_type {
                SchemaType::Avro => "avro",
                SchemaType::Protobuf => "protobuf",
                SchemaType::Json => "json-schema",
            },
            schema_id: decoded.schema_id,
            json: decoded.json,
        }))
    }
}

/// The console's HTTPS, when `console_tls` is on: the broker's own certificate.
fn https(broker: &Broker) -> Result<Option<tokio_rustls::TlsAcceptor>, String> {
    if !broker.config().console_tls {
        return Ok(None);
    }
    let acceptor = sluice_security::tls::server_acceptor(&broker.config().tls_settings());
    acceptor.map(Some).map_err(|error| format!("console TLS: {error}"))
}

/// `bind` as an address to connect to: a wildcard bind is reached on loopback.
fn reachable(bind: SocketAddr) -> SocketAddr {
    let ip = match bind.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, bind.port())
}

/// Serves the console on `listener` for as long as the broker runs.
pub async fn serve(config: ConsoleConfig, listener: tokio::net::TcpListener) {
    sluice_console::serve(listener, config).await
}
