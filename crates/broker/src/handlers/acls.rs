//! CreateAcls, DescribeAcls and DeleteAcls (what `kafka-acls.sh` sends). Creating and
//! deleting needs ALTER on the cluster, describing needs DESCRIBE on the cluster; the
//! checks themselves live in `sluice_security::acl`.

use std::collections::BTreeMap;

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest,
    DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_cluster::AclBinding;
use sluice_security::acl::{self, AclFilter};

use super::{message, ClientSession};
use crate::Broker;

const NOT_AUTHORIZED: &str = "Cluster authorization failed.";

pub(super) async fn create(broker: &Broker, session: &ClientSession, request: CreateAclsRequest) -> CreateAclsResponse {
    let mut response = CreateAclsResponse::default();
    let allowed = broker.authorized_on_cluster(session, acl::OP_ALTER);
    let mut valid = Vec::new();
    let mut results: Vec<AclCreationResult> = Vec::with_capacity(request.creations.len());
    for creation in request.creations {
        let binding = AclBinding {
            resource_type: creation.resource_type,
            resource_name: creation.resource_name.to_string(),
            pattern_type: creation.resource_pattern_type,
            principal: creation.principal.to_string(),
            host: creation.host.to_string(),
            operation: creation.operation,
            permission_type: creation.permission_type,
        };
        let mut result = AclCreationResult::default();
        if !allowed {
            result.error_code = ResponseError::ClusterAuthorizationFailed.code();
            result.error_message = message(NOT_AUTHORIZED);
        } else if let Err(text) = acl::validate(&binding) {
            result.error_code = ResponseError::InvalidRequest.code();
            result.error_message = message(text);
        } else {
            valid.push((results.len(), binding));
        }
        results.push(result);
    }
    if !valid.is_empty() {
        let bindings = valid.iter().map(|(_, binding)| binding.clone()).collect();
        if let Err((error, text)) = broker.alter_acls(bindings, Vec::new()).await {
            for (index, _) in &valid {
                results[*index].error_code = error.code();
                results[*index].error_message = message(text.clone());
            }
        } else {
            tracing::info!(acls = ?valid.iter().map(|(_, b)| b).collect::<Vec<_>>(), "created ACLs");
        }
    }
    response.results = results;
    response
}

fn filter(
    resource_type: i8,
    resource_name: Option<StrBytes>,
    pattern_type: i8,
    principal: Option<StrBytes>,
    host: Option<StrBytes>,
    operation: i8,
    permission_type: i8,
) -> AclFilter {
    AclFilter {
        resource_type,
        resource_name: resource_name.map(|name| name.to_string()),
        pattern_type,
        principal: principal.map(|p| p.to_string()),
        host: host.map(|h| h.to_string()),
        operation,
        permission_type,
    }
}

pub(super) fn describe(broker: &Broker, session: &ClientSession, request: DescribeAclsRequest) -> DescribeAclsResponse {
    let mut response = DescribeAclsResponse::default();
    if !broker.authorized_on_cluster(session, acl::OP_DESCRIBE) {
        response.error_code = ResponseError::ClusterAuthorizationFailed.code();
        response.error_message = message(NOT_AUTHORIZED);
        return response;
    }
    let wanted = filter(
        request.resource_type_filter,
        request.resource_name_filter,
        request.pattern_type_filter,
        request.principal_filter,
        request.host_filter,
        request.operation,
        request.permission_type,
    );
    let mut by_resource: BTreeMap<(i8, String, i8), Vec<AclDescription>> = BTreeMap::new();
    broker.with_acls(|acls| {
        for binding in acls.iter().filter(|binding| acl::filter_matches(binding, &wanted)) {
            let mut description = AclDescription::default();
            description.principal = StrBytes::from_string(binding.principal.clone());
            description.host = StrBytes::from_string(binding.host.clone());
            description.operation = binding.operation;
            description.permission_type = binding.permission_type;
            let key = (binding.resource_type, binding.resource_name.clone(), binding.pattern_type);
            by_resource.entry(key).or_default().push(description);
        }
    });
    for ((resource_type, name, pattern_type), acls) in by_resource {
        let mut resource = DescribeAclsResource::default();
        resource.resource_type = resource_type;
        resource.resource_name = StrBytes::from_string(name);
        resource.pattern_type = pattern_type;
        resource.acls = acls;
        response.resources.push(resource);
    }
    response
}

pub(super) async fn delete(broker: &Broker, session: &ClientSession, request: DeleteAclsRequest) -> DeleteAclsResponse {
    let mut response = DeleteAclsResponse::default();
    if !broker.authorized_on_cluster(session, acl::OP_ALTER) {
        for _ in &request.filters {
            let mut result = DeleteAclsFilterResult::default();
            result.error_code = ResponseError::ClusterAuthorizationFailed.code();
            result.error_message = message(NOT_AUTHORIZED);
            response.filter_results.push(result);
        }
        return response;
    }
    let filters: Vec<AclFilter> = request
        .filters
        .into_iter()
        .map(|f| {
            filter(
                f.resource_type_filter,
                f.resource_name_filter,
                f.pattern_type_filter,
                f.principal_filter,
                f.host_filter,
                f.operation,
                f.permission_type,
            )
        })
        .collect();
    let matched: Vec<Vec<AclBinding>> = broker.with_acls(|acls| {
        filters
            .iter()
            .map(|f| acls.iter().filter(|binding| acl::filter_matches(binding, f)).cloned().collect())
            .collect()
    });
    let doomed: Vec<AclBinding> = matched.iter().flatten().cloned().collect();
    let outcome = if doomed.is_empty() { Ok(()) } else { broker.alter_acls(Vec::new(), doomed).await };
    for bindings in matched {
        let mut result = DeleteAclsFilterResult::default();
        match &outcome {
            Err((error, text)) => {
                result.error_code = error.code();
                result.error_message = message(text.clone());
            }
            Ok(()) => {
                for binding in bindings {
                    let mut matching = DeleteAclsMatchingAcl::default();
                    matching.resource_type = binding.resource_type;
                    matching.resource_name = StrBytes::from_string(binding.resource_name);
                    matching.pattern_type = binding.pattern_type;
                    matching.principal = StrBytes::from_string(binding.principal);
                    matching.host = StrBytes::from_string(binding.host);
                    matching.operation = binding.operation;
                    matching.permission_type = binding.permission_type;
                    result.matching_acls.push(matching);
                }
            }
        }
        response.filter_results.push(result);
    }
    response
}
