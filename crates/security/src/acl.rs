//! Authorization with Kafka's ACL semantics (KIP-11, KIP-290 prefixed patterns), as
//! Kafka's StandardAuthorizer decides:
//! - an ACL applies to a request when its resource type matches, its pattern matches the
//!   resource name (LITERAL: equal or `*`; PREFIXED: a prefix of the name), its principal
//!   is the client's or `User:*`, and its host is the client's IP or `*`;
//! - a DENY that applies wins over every ALLOW; DENY ALL denies every operation;
//! - an ALLOW of READ, WRITE, DELETE or ALTER also allows DESCRIBE, and ALLOW
//!   ALTER_CONFIGS allows DESCRIBE_CONFIGS; ALLOW ALL allows everything;
//! - with no ACL at all on the resource, `allow.everyone.if.no.acl.found` decides;
//! - `super.users` are always allowed. Without `authorizer.class.name` nothing is checked.

use std::collections::BTreeSet;
use std::net::IpAddr;

use sluice_cluster::AclBinding;

use crate::settings::SecuritySettings;

pub const RESOURCE_ANY: i8 = 1;
pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_GROUP: i8 = 3;
pub const RESOURCE_CLUSTER: i8 = 4;
pub const RESOURCE_TRANSACTIONAL_ID: i8 = 5;
pub const RESOURCE_DELEGATION_TOKEN: i8 = 6;
pub const RESOURCE_USER: i8 = 7;

pub const PATTERN_ANY: i8 = 1;
pub const PATTERN_MATCH: i8 = 2;
pub const PATTERN_LITERAL: i8 = 3;
pub const PATTERN_PREFIXED: i8 = 4;

pub const OP_ANY: i8 = 1;
pub const OP_ALL: i8 = 2;
pub const OP_READ: i8 = 3;
pub const OP_WRITE: i8 = 4;
pub const OP_CREATE: i8 = 5;
pub const OP_DELETE: i8 = 6;
pub const OP_ALTER: i8 = 7;
pub const OP_DESCRIBE: i8 = 8;
pub const OP_CLUSTER_ACTION: i8 = 9;
pub const OP_DESCRIBE_CONFIGS: i8 = 10;
pub const OP_ALTER_CONFIGS: i8 = 11;
pub const OP_IDEMPOTENT_WRITE: i8 = 12;
pub const OP_DESCRIBE_TOKENS: i8 = 14;

pub const PERMISSION_ANY: i8 = 1;
pub const PERMISSION_DENY: i8 = 2;
pub const PERMISSION_ALLOW: i8 = 3;

/// The name of the one CLUSTER resource, as in Kafka.
pub const CLUSTER_RESOURCE_NAME: &str = "kafka-cluster";
/// The wildcard of literal resource names, principals and hosts.
pub const WILDCARD: &str = "*";

fn pattern_matches(acl: &AclBinding, resource_type: i8, name: &str) -> bool {
    acl.resource_type == resource_type
        && match acl.pattern_type {
            PATTERN_LITERAL => acl.resource_name == name || acl.resource_name == WILDCARD,
            PATTERN_PREFIXED => name.starts_with(acl.resource_name.as_str()),
            _ => false,
        }
}

fn operation_matches(acl: &AclBinding, operation: i8) -> bool {
    if acl.operation == OP_ALL || acl.operation == operation {
        return true;
    }
    acl.permission_type == PERMISSION_ALLOW
        && match operation {
            OP_DESCRIBE => matches!(acl.operation, OP_READ | OP_WRITE | OP_DELETE | OP_ALTER),
            OP_DESCRIBE_CONFIGS => acl.operation == OP_ALTER_CONFIGS,
            _ => false,
        }
}

/// The decision for `principal` at `host` doing `operation` on a resource.
fn decide(
    acls: &BTreeSet<AclBinding>,
    principal: &str,
    host: &str,
    operation: i8,
    resource_type: i8,
    name: &str,
    allow_if_no_acl: bool,
) -> bool {
    let mut any_on_resource = false;
    let mut allowed = false;
    for acl in acls.iter().filter(|acl| pattern_matches(acl, resource_type, name)) {
        any_on_resource = true;
        let applies = (acl.principal == principal || acl.principal == "User:*")
            && (acl.host == host || acl.host == WILDCARD)
            && operation_matches(acl, operation);
        if !applies {
            continue;
        }
        match acl.permission_type {
            PERMISSION_DENY => return false,
            PERMISSION_ALLOW => allowed = true,
            _ => {}
        }
    }
    allowed || (!any_on_resource && allow_if_no_acl)
}

/// Whether `acl` is selected by a DescribeAcls/DeleteAcls filter (null fields match all).
pub fn filter_matches(acl: &AclBinding, filter: &AclFilter) -> bool {
    let type_ok = filter.resource_type == RESOURCE_ANY || filter.resource_type == acl.resource_type;
    let name_ok = match (&filter.resource_name, filter.pattern_type) {
        (None, PATTERN_ANY | PATTERN_MATCH) => true,
        (None, pattern) => pattern == acl.pattern_type,
        (Some(name), PATTERN_ANY) => *name == acl.resource_name,
        (Some(name), PATTERN_MATCH) => pattern_matches(acl, acl.resource_type, name),
        (Some(name), pattern) => pattern == acl.pattern_type && *name == acl.resource_name,
    };
    let principal_ok = filter.principal.as_ref().is_none_or(|p| *p == acl.principal);
    let host_ok = filter.host.as_ref().is_none_or(|h| *h == acl.host);
    let operation_ok = filter.operation == OP_ANY || filter.operation == acl.operation;
    let permission_ok = filter.permission_type == PERMISSION_ANY || filter.permission_type == acl.permission_type;
    type_ok && name_ok && principal_ok && host_ok && operation_ok && permission_ok
}

/// A DescribeAcls / DeleteAcls filter.
pub struct AclFilter {
    pub resource_type: i8,
    pub resource_name: Option<String>,
    pub pattern_type: i8,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: i8,
    pub permission_type: i8,
}

/// Checks a new ACL as Kafka does; the error text says what is wrong.
pub fn validate(acl: &AclBinding) -> Result<(), String> {
    if !matches!(
        acl.resource_type,
        RESOURCE_TOPIC
            | RESOURCE_GROUP
            | RESOURCE_CLUSTER
            | RESOURCE_TRANSACTIONAL_ID
            | RESOURCE_DELEGATION_TOKEN
            | RESOURCE_USER
    ) {
        return Err(format!("Invalid resource type {}", acl.resource_type));
    }
    if !matches!(acl.pattern_type, PATTERN_LITERAL | PATTERN_PREFIXED) {
        return Err(format!("Invalid pattern type {}: ACLs are LITERAL or PREFIXED", acl.pattern_type));
    }
    if acl.resource_name.is_empty() {
        return Err("Resource name must not be empty".into());
    }
    if acl.resource_type == RESOURCE_CLUSTER && acl.resource_name != CLUSTER_RESOURCE_NAME {
        return Err(format!("The only valid name for the CLUSTER resource is {CLUSTER_RESOURCE_NAME}"));
    }
    match acl.principal.split_once(':') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
        _ => return Err(format!("Could not parse principal from `{}` (no colon is found)", acl.principal)),
    }
    if acl.host.is_empty() {
        return Err("Host must not be empty (use * for any host)".into());
    }
    if !(OP_ALL..=OP_DESCRIBE_TOKENS).contains(&acl.operation) {
        return Err(format!("Invalid operation {}", acl.operation));
    }
    if !matches!(acl.permission_type, PERMISSION_ALLOW | PERMISSION_DENY) {
        return Err(format!("Invalid permission type {}", acl.permission_type));
    }
    Ok(())
}

/// Where the ACLs in force are read: the broker's security store, local or replicated.
pub trait AclSource {
    /// Runs `read` on the current ACLs.
    fn with_acls<T>(&self, read: impl FnOnce(&BTreeSet<AclBinding>) -> T) -> T;
}

/// The authorizer's settings (`authorizer.class.name` set).
pub struct Authorizer {
    super_users: BTreeSet<String>,
    allow_if_no_acl: bool,
}

impl Authorizer {
    /// The authorizer, when `authorizer.class.name` is set; `None`: nothing is checked.
    pub fn new(settings: &SecuritySettings) -> Option<Authorizer> {
        settings.authorizer_class_name.as_ref().filter(|name| !name.trim().is_empty())?;
        let super_users = settings.super_users.split(';').map(str::trim).filter(|u| !u.is_empty()).map(String::from);
        let super_users = super_users.chain([crate::inter_broker::INTER_BROKER_PRINCIPAL.to_string()]);
        Some(Authorizer {
            super_users: super_users.collect(),
            allow_if_no_acl: settings.allow_everyone_if_no_acl_found,
        })
    }

    /// Whether `principal`, connected from `host`, may do `operation` on the resource.
    pub fn allows(
        &self,
        acls: &impl AclSource,
        principal: &str,
        host: IpAddr,
        operation: i8,
        resource_type: i8,
        name: &str,
    ) -> bool {
        if self.super_users.contains(principal) {
            return true;
        }
        let host = host.to_string();
        acls.with_acls(|acls| decide(acls, principal, &host, operation, resource_type, name, self.allow_if_no_acl))
    }

    /// Whether some ACL lets the client write some topic (what an idempotent producer
    /// needs instead of IDEMPOTENT_WRITE on the cluster, since Kafka 3.0).
    pub fn may_write_some_topic(&self, acls: &impl AclSource, principal: &str, host: IpAddr) -> bool {
        if self.super_users.contains(principal) {
            return true;
        }
        let host = host.to_string();
        acls.with_acls(|acls| {
            acls.iter().any(|acl| {
                acl.resource_type == RESOURCE_TOPIC
                    && acl.permission_type == PERMISSION_ALLOW
                    && matches!(acl.operation, OP_WRITE | OP_ALL)
                    && (acl.principal == principal || acl.principal == "User:*")
                    && (acl.host == host || acl.host == WILDCARD)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(resource_type: i8, name: &str, pattern: i8, principal: &str, operation: i8, permission: i8) -> AclBinding {
        AclBinding {
            resource_type,
            resource_name: name.into(),
            pattern_type: pattern,
            principal: principal.into(),
            host: WILDCARD.into(),
            operation,
            permission_type: permission,
        }
    }

    fn allowed(acls: &[AclBinding], principal: &str, operation: i8, name: &str) -> bool {
        let acls: BTreeSet<_> = acls.iter().cloned().collect();
        decide(&acls, principal, "127.0.0.1", operation, RESOURCE_TOPIC, name, false)
    }

    #[test]
    fn literal_prefixed_and_wildcard_patterns() {
        let acls = [
            acl(RESOURCE_TOPIC, "orders", PATTERN_LITERAL, "User:alice", OP_READ, PERMISSION_ALLOW),
            acl(RESOURCE_TOPIC, "logs-", PATTERN_PREFIXED, "User:bob", OP_WRITE, PERMISSION_ALLOW),
            acl(RESOURCE_TOPIC, "*", PATTERN_LITERAL, "User:carol", OP_ALL, PERMISSION_ALLOW),
        ];
        assert!(allowed(&acls, "User:alice", OP_READ, "orders"));
        assert!(!allowed(&acls, "User:alice", OP_READ, "orders2"));
        assert!(!allowed(&acls, "User:alice", OP_WRITE, "orders"));
        assert!(allowed(&acls, "User:bob", OP_WRITE, "logs-app"));
        assert!(!allowed(&acls, "User:bob", OP_WRITE, "log"));
        assert!(allowed(&acls, "User:carol", OP_DELETE, "anything"));
        assert!(!allowed(&acls, "User:mallory", OP_READ, "orders"));
    }

    #[test]
    fn deny_wins_and_implied_describe() {
        let acls = [
            acl(RESOURCE_TOPIC, "*", PATTERN_LITERAL, "User:*", OP_READ, PERMISSION_ALLOW),
            acl(RESOURCE_TOPIC, "secret", PATTERN_LITERAL, "User:alice", OP_READ, PERMISSION_DENY),
        ];
        assert!(allowed(&acls, "User:alice", OP_READ, "public"));
        assert!(allowed(&acls, "User:alice", OP_DESCRIBE, "public"), "READ implies DESCRIBE");
        assert!(!allowed(&acls, "User:alice", OP_READ, "secret"));
        assert!(allowed(&acls, "User:alice", OP_DESCRIBE, "secret"), "a DENY READ does not deny DESCRIBE");
        assert!(allowed(&acls, "User:bob", OP_READ, "secret"));
        let configs = [acl(RESOURCE_TOPIC, "t", PATTERN_LITERAL, "User:a", OP_ALTER_CONFIGS, PERMISSION_ALLOW)];
        assert!(allowed(&configs, "User:a", OP_DESCRIBE_CONFIGS, "t"));
    }

    #[test]
    fn no_acl_on_the_resource_follows_allow_everyone() {
        let acls: BTreeSet<_> =
            [acl(RESOURCE_TOPIC, "other", PATTERN_LITERAL, "User:a", OP_READ, PERMISSION_ALLOW)].into();
        assert!(!decide(&acls, "User:b", "h", OP_READ, RESOURCE_TOPIC, "free", false));
        assert!(decide(&acls, "User:b", "h", OP_READ, RESOURCE_TOPIC, "free", true));
        assert!(!decide(&acls, "User:b", "h", OP_READ, RESOURCE_TOPIC, "other", true), "ACLs exist on it");
    }

    #[test]
    fn bad_acls_are_refused() {
        let good = acl(RESOURCE_TOPIC, "t", PATTERN_LITERAL, "User:a", OP_READ, PERMISSION_ALLOW);
        assert!(validate(&good).is_ok());
        for bad in [
            AclBinding { resource_type: RESOURCE_ANY, ..good.clone() },
            AclBinding { pattern_type: PATTERN_MATCH, ..good.clone() },
            AclBinding { principal: "alice".into(), ..good.clone() },
            AclBinding { operation: OP_ANY, ..good.clone() },
            AclBinding { permission_type: PERMISSION_ANY, ..good.clone() },
            AclBinding { resource_type: RESOURCE_CLUSTER, resource_name: "c".into(), ..good.clone() },
        ] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
    }
}
