//! HTTP basic authentication for the broker's HTTP APIs (the Schema Registry), against
//! the SASL users' SCRAM credentials: the users and passwords Kafka clients log in with,
//! and authorization against the same ACLs.
//!
//! Required whenever a Kafka listener requires SASL (a broker with users); off otherwise,
//! like the PLAINTEXT listener. A password check costs two PBKDF2 derivations, so it runs
//! on the blocking pool, and a verified (user, password) pair is remembered briefly:
//! serializers send the header with every request.
//!
//! A subject is authorized as the topic it belongs to (`orders-value` as `orders`), so the
//! ACLs that let a client produce to or consume a topic also let its serializer register or
//! read the topic's schemas: reading needs DESCRIBE (which READ and WRITE imply), registering
//! WRITE, deleting DELETE; a subject's compatibility level and mode need DESCRIBE_CONFIGS /
//! ALTER_CONFIGS on the topic, the global ones on the cluster.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use sha2::{Digest, Sha256};
use sluice_schema_registry::authorization::{subject_topic, Access, Caller, Target};
use sluice_schema_registry::http::{Gate, HeaderMap};
use sluice_schema_registry::{LogFuture, RegistryError};
use sluice_security::acl::{
    CLUSTER_RESOURCE_NAME, OP_ALTER_CONFIGS, OP_DELETE, OP_DESCRIBE, OP_DESCRIBE_CONFIGS, OP_WRITE, RESOURCE_CLUSTER,
    RESOURCE_TOPIC,
};

use crate::Broker;

/// How long a verified pair is trusted without checking it again.
const VERIFIED_TTL: Duration = Duration::from_secs(60);
/// Verified pairs remembered at most (the oldest are dropped first).
const VERIFIED_MAX: usize = 1024;
/// The longest `Authorization` header value read.
const HEADER_BYTES_MAX: usize = 4096;

pub struct BasicAuth {
    broker: Arc<Broker>,
    /// SHA-256 of `user:password` -> (user, when verified).
    verified: parking_lot::Mutex<HashMap<[u8; 32], (String, Instant)>>,
}

impl BasicAuth {
    /// The gate for `broker`'s HTTP APIs; `None` when no listener requires SASL.
    pub fn for_broker(broker: &Arc<Broker>) -> Option<Arc<dyn Gate>> {
        let required = broker.listeners().iter().any(|listener| listener.protocol.uses_sasl());
        required.then(|| {
            Arc::new(BasicAuth { broker: broker.clone(), verified: parking_lot::Mutex::new(HashMap::new()) })
                as Arc<dyn Gate>
        })
    }

    fn remembered(&self, digest: &[u8; 32]) -> Option<String> {
        let verified = self.verified.lock();
        let (user, at) = verified.get(digest)?;
        (at.elapsed() < VERIFIED_TTL).then(|| user.clone())
    }

    fn remember(&self, digest: [u8; 32], user: String) {
        let mut verified = self.verified.lock();
        verified.retain(|_, (_, at)| at.elapsed() < VERIFIED_TTL);
        if verified.len() >= VERIFIED_MAX {
            let oldest = verified.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| *k);
            oldest.map(|k| verified.remove(&k));
        }
        verified.insert(digest, (user, Instant::now()));
    }
}

fn unauthorized(why: &str) -> RegistryError {
    RegistryError::Unauthorized(format!("Unauthorized: {why}"))
}

/// The (user, password) of a `Basic` authorization header.
fn credentials(headers: &HeaderMap) -> Result<(String, String), RegistryError> {
    let value = headers.get("authorization").ok_or_else(|| unauthorized("credentials required"))?;
    let value = value.to_str().map_err(|_| unauthorized("malformed Authorization header"))?;
    if value.len() > HEADER_BYTES_MAX {
        return Err(unauthorized("Authorization header too long"));
    }
    let encoded = value.strip_prefix("Basic ").ok_or_else(|| unauthorized("only Basic authentication is accepted"))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| unauthorized("malformed Basic credentials"))?;
    let text = String::from_utf8(decoded).map_err(|_| unauthorized("malformed Basic credentials"))?;
    let (user, password) = text.split_once(':').ok_or_else(|| unauthorized("malformed Basic credentials"))?;
    Ok((user.to_string(), password.to_string()))
}

/// The Kafka operation and resource (type, name) an access to a target is authorized as.
fn acl_check(access: Access, target: &Target) -> (i8, i8, &str) {
    let operation = match access {
        Access::Read => OP_DESCRIBE,
        Access::Write => OP_WRITE,
        Access::Delete => OP_DELETE,
        Access::ReadConfig => OP_DESCRIBE_CONFIGS,
        Access::WriteConfig => OP_ALTER_CONFIGS,
    };
    match target {
        Target::Subject(subject) => (operation, RESOURCE_TOPIC, subject_topic(subject)),
        Target::Global => (operation, RESOURCE_CLUSTER, CLUSTER_RESOURCE_NAME),
    }
}

impl Gate for BasicAuth {
    fn allows(&self, caller: &Caller, access: Access, target: &Target) -> bool {
        let Some(authorizer) = &self.broker.authorizer else { return true };
        let (operation, resource_type, name) = acl_check(access, target);
        authorizer.allows(&*self.broker, &caller.principal, caller.host, operation, resource_type, name)
    }

    fn authenticate(&self, headers: HeaderMap, host: IpAddr) -> LogFuture<'_, Caller> {
        Box::pin(async move {
            let caller = |user: String| Caller { principal: format!("User:{user}"), host };
            let (user, password) = credentials(&headers)?;
            let digest: [u8; 32] = Sha256::digest(format!("{user}:{password}")).into();
            if let Some(user) = self.remembered(&digest) {
                return Ok(caller(user));
            }
            let broker = self.broker.clone();
            let checked = user.clone();
            let matches =
                tokio::task::spawn_blocking(move || sluice_security::password_matches(&*broker, &checked, &password))
                    .await
                    .unwrap_or(false);
            if !matches {
                return Err(unauthorized("invalid username or password"));
            }
            self.remember(digest, user.clone());
            Ok(caller(user))
        })
    }
}
