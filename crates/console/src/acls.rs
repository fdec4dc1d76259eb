//! The cluster's ACL bindings: DescribeAcls lists them, CreateAcls adds one, DeleteAcls
//! removes one with a filter that matches that binding exactly (every field given, none
//! ANY), so a remove button never takes other bindings with it.
//!
//! The protocol's codes are shown and read by the names Kafka's tools use (`READ`, `TOPIC`,
//! `PREFIXED`, `ALLOW`), from the tables below.

use std::sync::Arc;

use anyhow::anyhow;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest};
use kafka_protocol::protocol::StrBytes;

use crate::admin::checked;
use crate::cluster::{versions, ClusterClient};

/// The code that matches any value in a DescribeAcls filter (resource type, pattern type,
/// operation, permission).
const ANY: i8 = 1;

/// Resource types a binding may name.
pub const RESOURCE_TYPES: [(&str, i8); 6] =
    [("TOPIC", 2), ("GROUP", 3), ("CLUSTER", 4), ("TRANSACTIONAL_ID", 5), ("DELEGATION_TOKEN", 6), ("USER", 7)];
/// How a binding's resource name matches.
pub const PATTERN_TYPES: [(&str, i8); 2] = [("LITERAL", 3), ("PREFIXED", 4)];
/// Operations a binding may allow or deny.
pub const OPERATIONS: [(&str, i8); 13] = [
    ("ALL", 2),
    ("READ", 3),
    ("WRITE", 4),
    ("CREATE", 5),
    ("DELETE", 6),
    ("ALTER", 7),
    ("DESCRIBE", 8),
    ("CLUSTER_ACTION", 9),
    ("DESCRIBE_CONFIGS", 10),
    ("ALTER_CONFIGS", 11),
    ("IDEMPOTENT_WRITE", 12),
    ("CREATE_TOKENS", 13),
    ("DESCRIBE_TOKENS", 14),
];
/// Whether a binding allows or denies.
pub const PERMISSIONS: [(&str, i8); 2] = [("ALLOW", 3), ("DENY", 2)];

/// The name of `code` in `table`, or the number when Kafka sent one this console does not
/// know.
pub fn name_of(table: &[(&'static str, i8)], code: i8) -> String {
    table.iter().find(|(_, c)| *c == code).map_or_else(|| code.to_string(), |(name, _)| name.to_string())
}

/// The code of `name` in `table`.
pub fn code_of(table: &[(&'static str, i8)], name: &str) -> Option<i8> {
    table.iter().find(|(n, _)| *n == name).map(|(_, code)| *code)
}

/// One ACL binding: who (principal, host) may or may not do what on which resources.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AclBinding {
    pub principal: String,
    pub host: String,
    pub operation: i8,
    pub permission: i8,
    pub resource_type: i8,
    pub pattern_type: i8,
    pub resource_name: String,
}

fn text(value: &str) -> StrBytes {
    StrBytes::from_string(value.to_string())
}

/// Every binding the cluster has, sorted by principal.
pub async fn bindings(client: &Arc<ClusterClient>) -> anyhow::Result<Vec<AclBinding>> {
    let mut request = DescribeAclsRequest::default();
    request.resource_type_filter = ANY;
    request.resource_name_filter = None;
    request.pattern_type_filter = ANY;
    request.principal_filter = None;
    request.host_filter = None;
    request.operation = ANY;
    request.permission_type = ANY;
    let bootstrap = client.bootstrap().to_string();
    let answer = client.send(&bootstrap, versions::DESCRIBE_ACLS, request).await?;
    checked(answer.error_code, answer.error_message)?;
    let mut found: Vec<AclBinding> = answer
        .resources
        .into_iter()
        .flat_map(|resource| {
            resource.acls.into_iter().map(move |acl| AclBinding {
                principal: acl.principal.to_string(),
                host: acl.host.to_string(),
                operation: acl.operation,
                permission: acl.permission_type,
                resource_type: resource.resource_type,
                pattern_type: resource.pattern_type,
                resource_name: resource.resource_name.to_string(),
            })
        })
        .collect();
    found.sort();
    Ok(found)
}

/// Adds `binding`.
pub async fn create(client: &Arc<ClusterClient>, binding: &AclBinding) -> anyhow::Result<()> {
    let mut creation = AclCreation::default();
    creation.resource_type = binding.resource_type;
    creation.resource_name = text(&binding.resource_name);
    creation.resource_pattern_type = binding.pattern_type;
    creation.principal = text(&binding.principal);
    creation.host = text(&binding.host);
    creation.operation = binding.operation;
    creation.permission_type = binding.permission;
    let mut request = CreateAclsRequest::default();
    request.creations = vec![creation];
    let bootstrap = client.bootstrap().to_string();
    let answer = client.send(&bootstrap, versions::CREATE_ACLS, request).await?;
    let result = answer.results.into_iter().next().ok_or_else(|| anyhow!("no CreateAcls result"))?;
    checked(result.error_code, result.error_message)
}

/// Removes exactly `binding`; whether the cluster had it.
pub async fn delete(client: &Arc<ClusterClient>, binding: &AclBinding) -> anyhow::Result<bool> {
    let mut filter = DeleteAclsFilter::default();
    filter.resource_type_filter = binding.resource_type;
    filter.resource_name_filter = Some(text(&binding.resource_name));
    filter.pattern_type_filter = binding.pattern_type;
    filter.principal_filter = Some(text(&binding.principal));
    filter.host_filter = Some(text(&binding.host));
    filter.operation = binding.operation;
    filter.permission_type = binding.permission;
    let mut request = DeleteAclsRequest::default();
    request.filters = vec![filter];
    let bootstrap = client.bootstrap().to_string();
    let answer = client.send(&bootstrap, versions::DELETE_ACLS, request).await?;
    let result = answer.filter_results.into_iter().next().ok_or_else(|| anyhow!("no DeleteAcls result"))?;
    checked(result.error_code, result.error_message)?;
    for matched in &result.matching_acls {
        checked(matched.error_code, matched.error_message.clone())?;
    }
    Ok(!result.matching_acls.is_empty())
}
