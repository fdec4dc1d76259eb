//! Who may connect and as whom: named listeners with their security protocols, TLS
//! (rustls), SASL authentication (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER), the SCRAM
//! credentials that back PLAIN and SCRAM, and how nodes authenticate to each other.

pub mod acl;
pub(crate) mod inter_broker;
pub mod listeners;
pub(crate) mod oauth;
pub mod principal_mapping;
pub(crate) mod quota;
pub(crate) mod sasl;
pub(crate) mod scram;
pub(crate) mod store;
pub(crate) mod tls;

pub use listeners::{Listener, SecurityProtocol};
/// The client side of SCRAM, for tools that authenticate to a SASL listener
/// (`sluice acl`, `sluice user`); the server side stays inside the broker.
pub use scram::{Mechanism as ScramMechanism, ScramClient, ScramError};

use crate::config::BrokerConfig;
use crate::Broker;

/// Mechanisms a SASL listener offers unless `sasl.enabled.mechanisms` says otherwise
/// (Kafka's default is GSSAPI, which Sluice does not offer).
pub const SASL_MECHANISMS_DEFAULT: &str = "SCRAM-SHA-256,SCRAM-SHA-512";

fn sasl_mechanisms(config: &BrokerConfig) -> Result<Vec<sasl::Mechanism>, String> {
    let mut mechanisms = Vec::new();
    for name in config.sasl_enabled_mechanisms.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let mechanism = sasl::Mechanism::from_name(&name.to_ascii_uppercase()).ok_or_else(|| {
            format!(
                "sasl.enabled.mechanisms: {name:?} is not supported (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER)"
            )
        })?;
        if !mechanisms.contains(&mechanism) {
            mechanisms.push(mechanism);
        }
    }
    Ok(mechanisms)
}

/// Checks the security settings: listeners, TLS files (read now, so a bad certificate
/// stops the start instead of the first client), SASL mechanisms.
pub(crate) fn validate(config: &BrokerConfig) -> Result<(), String> {
    let listeners = config.listeners()?;
    let mechanisms = sasl_mechanisms(config)?;
    if listeners.iter().any(|l| l.protocol.uses_sasl()) && mechanisms.is_empty() {
        return Err("a SASL listener needs at least one of sasl.enabled.mechanisms".into());
    }
    tls::acceptor(config)?;
    inter_broker::InterBroker::from_config(config)?;
    oauth::OauthValidator::from_config(config)?;
    if config.cluster.as_ref().is_some_and(|cluster| cluster.rpc_tls) {
        tls::rpc_tls(config).map_err(|error| format!("cluster.rpc_tls: {error}"))?;
    }
    for user in config.super_users.split(';').map(str::trim).filter(|u| !u.is_empty()) {
        if !user.contains(':') {
            return Err(format!("super.users entry {user:?} is not a principal like User:admin"));
        }
    }
    Ok(())
}

impl Broker {
    pub(crate) fn sasl_mechanisms(&self) -> Vec<sasl::Mechanism> {
        sasl_mechanisms(&self.config).expect("validated at startup")
    }
}
