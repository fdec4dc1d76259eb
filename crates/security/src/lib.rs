//! Who may connect to a Sluice broker, as whom, and what they may do: named listeners with
//! their security protocols, TLS (rustls), SASL authentication (PLAIN, SCRAM-SHA-256/512,
//! OAUTHBEARER), the SCRAM credentials that back PLAIN and SCRAM, how nodes authenticate to
//! each other, certificate principal mapping, ACL authorization and client quotas.
//!
//! This crate holds the security model and its checks, apart from the broker that serves
//! requests: it reads no broker configuration (the broker gives it [`SecuritySettings`]) and
//! knows nothing of the broker's state. What it needs from the broker comes through narrow
//! traits the broker implements: [`SaslServer`] (enabled mechanisms, credential lookup,
//! token validation), [`AclSource`] (the ACLs in force) and [`SecurityController`] (the
//! cluster metadata that replicates security records, and writing them through the
//! controller). Which request needs which permission stays in the broker.

pub mod acl;
mod inter_broker;
mod listeners;
mod oauth;
mod principal_mapping;
pub mod quota;
mod reserved_users;
mod sasl;
pub mod scram;
mod settings;
mod store;
pub mod tls;

pub use acl::{AclSource, Authorizer};
pub use inter_broker::{is_reserved_user, read_rpc_secret, InterBroker, INTER_BROKER_PRINCIPAL, INTER_BROKER_USER};
pub use listeners::{
    inter_broker_listener, parse_amqp_listeners, parse_listeners, AmqpListener, Listener, SecurityProtocol,
};
pub use oauth::OauthValidator;
pub use principal_mapping::PrincipalMappingRules;
pub use sasl::{password_matches, Authenticator, Mechanism as SaslMechanism, Next, SaslServer};
/// The client side of SCRAM, for tools that authenticate to a SASL listener
/// (`sluice acl`, `sluice user`) and for replica fetches between nodes.
pub use scram::{Mechanism as ScramMechanism, ScramClient};
pub use settings::{ClusterSecuritySettings, OauthSettings, SecuritySettings, TlsSettings};
pub use store::{ClientQuotas, Failure, SecurityController, SecurityStore, Upsertion, UserCredentials};

/// Mechanisms a SASL listener offers unless `sasl.enabled.mechanisms` says otherwise
/// (Kafka's default is GSSAPI, which Sluice does not offer).
pub const SASL_MECHANISMS_DEFAULT: &str = "SCRAM-SHA-256,SCRAM-SHA-512";

/// The mechanisms of `sasl.enabled.mechanisms` (comma-separated names), in the order given.
pub fn sasl_mechanisms(enabled: &str) -> Result<Vec<sasl::Mechanism>, String> {
    let mut mechanisms = Vec::new();
    for name in enabled.split(',').map(str::trim).filter(|n| !n.is_empty()) {
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

/// The OAUTHBEARER token validator, when `sasl.enabled.mechanisms` offers OAUTHBEARER (it
/// then needs a key set).
pub fn oauth_validator(settings: &SecuritySettings) -> Result<Option<OauthValidator>, String> {
    let enabled = sasl_mechanisms(&settings.sasl_enabled_mechanisms)?.contains(&sasl::Mechanism::OauthBearer);
    enabled.then(|| OauthValidator::new(&settings.oauth)).transpose()
}

/// Checks the security settings: listeners, TLS files (read now, so a bad certificate
/// stops the start instead of the first client), SASL mechanisms.
pub fn validate(settings: &SecuritySettings) -> Result<(), String> {
    let mechanisms = sasl_mechanisms(&settings.sasl_enabled_mechanisms)?;
    if settings.listeners.iter().any(|l| l.protocol.uses_sasl()) && mechanisms.is_empty() {
        return Err("a SASL listener needs at least one of sasl.enabled.mechanisms".into());
    }
    tls::acceptor(&settings.listeners, &settings.tls)?;
    InterBroker::new(settings)?;
    oauth_validator(settings)?;
    if settings.cluster.as_ref().is_some_and(|cluster| cluster.rpc_tls) {
        tls::rpc_tls(&settings.tls).map_err(|error| format!("cluster.rpc_tls: {error}"))?;
    }
    for user in settings.super_users.split(';').map(str::trim).filter(|u| !u.is_empty()) {
        if !user.contains(':') {
            return Err(format!("super.users entry {user:?} is not a principal like User:admin"));
        }
    }
    Ok(())
}
