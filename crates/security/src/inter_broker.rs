//! How nodes prove to each other who they are on the inter-broker listener (replica
//! fetches), whatever its security protocol: TLS checks the leader's certificate (and
//! shows the follower's), SASL authenticates the follower as the brokers' own user.
//!
//! The brokers' user needs no credential made by an operator: its password is derived
//! from the cluster's shared controller-RPC secret (`[cluster] rpc_secret_file`), which
//! every node already holds, so a SASL inter-broker listener works from the first start
//! and a process without the secret cannot pass for a broker. Its principal,
//! [`INTER_BROKER_PRINCIPAL`], is a super user. The name is reserved ([`is_reserved_user`]):
//! no SCRAM credential can be made for it and no OAUTHBEARER token can name it, so the only
//! way to be that principal is to prove the secret. A node outside a cluster makes a random
//! secret at start and keeps it in memory only, so that its own parts (the console's history
//! sampler) can act as that user and nothing outside the process can.

use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use sluice_cluster::ScramCredential;
use tokio_rustls::TlsConnector;

use crate::sasl::Mechanism;
use crate::scram::{Mechanism as ScramMechanism, ITERATIONS_MIN};
use crate::settings::SecuritySettings;

pub use crate::reserved_users::{is_reserved_user, INTER_BROKER_PRINCIPAL, INTER_BROKER_USER};

/// Random bytes of the secret a node outside a cluster makes at start and keeps in memory.
const LOCAL_SECRET_BYTES: usize = 32;

/// The shared controller-RPC secret in `path`, surrounding whitespace removed.
pub fn read_rpc_secret(path: &Path) -> Result<Vec<u8>, String> {
    let text = std::fs::read(path).map_err(|error| error.to_string())?;
    let secret = text.trim_ascii().to_vec();
    if secret.len() < sluice_cluster::RPC_SECRET_BYTES_MIN {
        return Err(format!("the secret must be at least {} bytes", sluice_cluster::RPC_SECRET_BYTES_MIN));
    }
    Ok(secret)
}

/// The brokers' own SCRAM credentials, derived from the shared secret.
pub(crate) struct BrokerCredentials {
    password: String,
    sha256: ScramCredential,
    sha512: ScramCredential,
}

fn derive(secret: &[u8], label: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(label);
    mac.finalize().into_bytes().into()
}

impl BrokerCredentials {
    pub(crate) fn from_secret(secret: &[u8]) -> BrokerCredentials {
        let password: String =
            derive(secret, b"sluice inter-broker password").iter().map(|b| format!("{b:02x}")).collect();
        let salt = derive(secret, b"sluice inter-broker salt")[..16].to_vec();
        let credential = |mechanism: ScramMechanism| {
            let salted = mechanism.salted_password(password.as_bytes(), &salt, ITERATIONS_MIN);
            mechanism.credential(salt.clone(), &salted, ITERATIONS_MIN)
        };
        BrokerCredentials {
            sha256: credential(ScramMechanism::Sha256),
            sha512: credential(ScramMechanism::Sha512),
            password,
        }
    }

    pub(crate) fn credential(&self, mechanism: &str) -> Option<ScramCredential> {
        match ScramMechanism::from_name(mechanism)? {
            ScramMechanism::Sha256 => Some(self.sha256.clone()),
            ScramMechanism::Sha512 => Some(self.sha512.clone()),
        }
    }
}

/// This node's side of the inter-broker listener: the server's view of the brokers'
/// credential, and how to connect to another node's inter-broker listener.
pub struct InterBroker {
    /// `None` in a cluster without a shared secret.
    credentials: Option<BrokerCredentials>,
    /// For TLS inter-broker listeners.
    pub tls: Option<TlsConnector>,
    /// For SASL inter-broker listeners: `sasl.mechanism.inter.broker.protocol`.
    pub sasl: Option<Mechanism>,
}

/// The mechanism a follower uses: `sasl.mechanism.inter.broker.protocol` if set (it must be
/// enabled), else the strongest enabled one.
fn mechanism(settings: &SecuritySettings, enabled: &[Mechanism]) -> Result<Mechanism, String> {
    match &settings.sasl_mechanism_inter_broker_protocol {
        Some(name) => Mechanism::from_name(&name.trim().to_ascii_uppercase())
            .filter(|m| enabled.contains(m) && *m != Mechanism::OauthBearer)
            .ok_or_else(|| {
                format!("sasl.mechanism.inter.broker.protocol {name:?} must be an enabled PLAIN or SCRAM mechanism")
            }),
        None => [ScramMechanism::Sha512, ScramMechanism::Sha256]
            .map(Mechanism::Scram)
            .into_iter()
            .chain([Mechanism::Plain])
            .find(|m| enabled.contains(m))
            .ok_or_else(|| "a SASL inter-broker listener needs a mechanism in sasl.enabled.mechanisms".to_string()),
    }
}

impl InterBroker {
    pub fn new(settings: &SecuritySettings) -> Result<InterBroker, String> {
        let protocol = settings.listeners[settings.inter_broker_listener].protocol;
        let in_cluster = settings.cluster.is_some();
        let secret = match settings.cluster.as_ref().and_then(|cluster| cluster.rpc_secret_file.as_deref()) {
            Some(path) => Some(read_rpc_secret(path)?),
            // Outside a cluster nobody else needs it: a secret of this process alone.
            None if !in_cluster => Some(rand::random::<[u8; LOCAL_SECRET_BYTES]>().to_vec()),
            None => None,
        };
        if in_cluster && protocol.uses_sasl() && secret.is_none() {
            return Err(format!(
                "the inter-broker listener is {protocol:?}: set [cluster] rpc_secret_file; brokers authenticate to \
                 each other with a credential derived from that shared secret"
            ));
        }
        let tls = if in_cluster && protocol.uses_tls() { Some(crate::tls::connector(&settings.tls)?) } else { None };
        let sasl = if protocol.uses_sasl() {
            Some(mechanism(settings, &crate::sasl_mechanisms(&settings.sasl_enabled_mechanisms)?)?)
        } else {
            None
        };
        Ok(InterBroker { credentials: secret.as_deref().map(BrokerCredentials::from_secret), tls, sasl })
    }

    /// The brokers' own credential for a SCRAM mechanism, when there is a shared secret.
    pub fn credential(&self, mechanism: &str) -> Option<ScramCredential> {
        self.credentials.as_ref().and_then(|c| c.credential(mechanism))
    }

    /// The password a follower gives (SASL), when there is a shared secret.
    pub fn password(&self) -> Option<&str> {
        self.credentials.as_ref().map(|c| c.password.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_derived_password_matches_the_derived_credential_and_depends_on_the_secret() {
        let ours = BrokerCredentials::from_secret(b"correct-horse-battery-staple");
        let theirs = BrokerCredentials::from_secret(b"another-secret-entirely-0000");
        for mechanism in ScramMechanism::ALL {
            let credential = ours.credential(mechanism.name()).unwrap();
            assert!(mechanism.password_matches(&credential, ours.password.as_bytes()));
            assert!(!mechanism.password_matches(&credential, theirs.password.as_bytes()));
        }
        assert!(ours.credential("PLAIN").is_none());
    }

    #[test]
    fn the_brokers_user_is_reserved_and_its_principal_names_it() {
        assert!(is_reserved_user(INTER_BROKER_USER));
        assert!(!is_reserved_user("alice"));
        assert!(!is_reserved_user(&INTER_BROKER_USER.to_uppercase()), "names are compared exactly");
        assert_eq!(INTER_BROKER_PRINCIPAL.strip_prefix("User:"), Some(INTER_BROKER_USER));
    }
}
