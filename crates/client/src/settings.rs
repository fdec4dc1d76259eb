//! A connection's settings, by librdkafka's property names and meanings, so one set of
//! `key=value` pairs reaches the same listener from every tool (and the console).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use sluice_security::ScramMechanism;

/// The keys understood (librdkafka's names and meanings).
pub const KNOWN_SETTINGS: &[&str] = &[
    "security.protocol",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "enable.ssl.certificate.verification",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
    "socket.connection.setup.timeout.ms",
    "socket.timeout.ms",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn parse(value: &str) -> anyhow::Result<SecurityProtocol> {
        match value.to_ascii_lowercase().as_str() {
            "plaintext" => Ok(SecurityProtocol::Plaintext),
            "ssl" => Ok(SecurityProtocol::Ssl),
            "sasl_plaintext" => Ok(SecurityProtocol::SaslPlaintext),
            "sasl_ssl" => Ok(SecurityProtocol::SaslSsl),
            _ => bail!("security.protocol {value:?} must be plaintext, ssl, sasl_plaintext or sasl_ssl"),
        }
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    Scram(ScramMechanism),
}

impl SaslMechanism {
    pub fn parse(value: &str) -> anyhow::Result<SaslMechanism> {
        let upper = value.to_ascii_uppercase();
        if upper == "PLAIN" {
            return Ok(SaslMechanism::Plain);
        }
        ScramMechanism::from_name(&upper)
            .map(SaslMechanism::Scram)
            .with_context(|| format!("sasl.mechanism {value:?} must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"))
    }

    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::Scram(scram) => scram.name(),
        }
    }
}

/// A connection's settings, checked: known keys, valid values. No `Debug`: it holds a
/// password.
#[derive(Default, Clone)]
pub struct Settings {
    pub(crate) protocol: Option<SecurityProtocol>,
    pub(crate) ca_location: Option<PathBuf>,
    pub(crate) certificate_location: Option<PathBuf>,
    pub(crate) key_location: Option<PathBuf>,
    pub(crate) verify_certificate: Option<bool>,
    pub(crate) mechanism: Option<SaslMechanism>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// How long a connection (TCP, TLS and SASL) may take to be set up.
    pub(crate) connect_timeout: Option<Duration>,
    /// How long an answer may take.
    pub(crate) io_timeout: Option<Duration>,
}

impl Settings {
    /// Settings from `key=value` pairs.
    pub fn parse(pairs: &[String]) -> anyhow::Result<Settings> {
        let mut settings = Settings::default();
        for pair in pairs {
            let (key, value) = pair.split_once('=').with_context(|| format!("-X {pair:?} is not KEY=VALUE"))?;
            settings.set(key.trim(), value.trim())?;
        }
        Ok(settings)
    }

    /// Sets one key (a librdkafka property name).
    pub fn set(&mut self, key: &str, value: &str) -> anyhow::Result<()> {
        match key {
            "security.protocol" => self.protocol = Some(SecurityProtocol::parse(value)?),
            "ssl.ca.location" => self.ca_location = Some(value.into()),
            "ssl.certificate.location" => self.certificate_location = Some(value.into()),
            "ssl.key.location" => self.key_location = Some(value.into()),
            "enable.ssl.certificate.verification" => self.verify_certificate = Some(parse_bool(key, value)?),
            "sasl.mechanism" => self.mechanism = Some(SaslMechanism::parse(value)?),
            "sasl.username" => self.username = Some(value.to_string()),
            "sasl.password" => self.password = Some(value.to_string()),
            "socket.connection.setup.timeout.ms" => self.connect_timeout = Some(parse_millis(key, value)?),
            "socket.timeout.ms" => self.io_timeout = Some(parse_millis(key, value)?),
            _ => bail!("-X {key}: unknown setting; known: {}", KNOWN_SETTINGS.join(", ")),
        }
        Ok(())
    }

    /// The protocol the listener speaks (PLAINTEXT unless set).
    pub fn protocol(&self) -> SecurityProtocol {
        self.protocol.unwrap_or(SecurityProtocol::Plaintext)
    }

    /// The SASL user whose password is not set yet, when the protocol uses SASL.
    pub fn missing_password(&self) -> Option<&str> {
        let needed = self.protocol().uses_sasl() && self.password.is_none();
        needed.then_some(self.username.as_deref()).flatten()
    }
}

fn parse_millis(key: &str, value: &str) -> anyhow::Result<Duration> {
    match value.parse::<u64>() {
        Ok(millis) if millis > 0 => Ok(Duration::from_millis(millis)),
        _ => bail!("-X {key}={value}: must be a number of milliseconds above 0"),
    }
}

fn parse_bool(key: &str, value: &str) -> anyhow::Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => bail!("-X {key}={value}: must be true or false"),
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
        check(&["socket.connection.setup.timeout.ms=2500"], None);
        check(&["socket.connection.setup.timeout.ms=soon"], Some("must be a number of milliseconds"));
    }
}
