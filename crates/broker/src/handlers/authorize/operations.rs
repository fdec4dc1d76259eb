//! KIP-430's `include_*_authorized_operations`: the operations the client may perform on
//! each topic, group or the cluster, as a bit per ACL operation code (all of a resource's
//! operations when no authorizer is configured, as Kafka does).

use kafka_protocol::messages::{RequestKind, ResponseKind};
use sluice_security::acl::{self, RESOURCE_CLUSTER, RESOURCE_GROUP, RESOURCE_TOPIC};

use crate::handlers::ClientSession;
use crate::Broker;

/// Operations Kafka reports per resource type (AclEntry.supportedOperations), without the
/// delegation-token ones Sluice does not issue.
const TOPIC_OPERATIONS: [i8; 8] = [
    acl::OP_READ,
    acl::OP_WRITE,
    acl::OP_CREATE,
    acl::OP_DELETE,
    acl::OP_ALTER,
    acl::OP_DESCRIBE,
    acl::OP_DESCRIBE_CONFIGS,
    acl::OP_ALTER_CONFIGS,
];
const GROUP_OPERATIONS: [i8; 3] = [acl::OP_READ, acl::OP_DELETE, acl::OP_DESCRIBE];
pub(super) const CLUSTER_OPERATIONS: [i8; 7] = [
    acl::OP_CREATE,
    acl::OP_ALTER,
    acl::OP_DESCRIBE,
    acl::OP_CLUSTER_ACTION,
    acl::OP_DESCRIBE_CONFIGS,
    acl::OP_ALTER_CONFIGS,
    acl::OP_IDEMPOTENT_WRITE,
];

/// The `authorized_operations` a request asked for.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OperationsWanted {
    topics: bool,
    groups: bool,
    cluster: bool,
}

impl OperationsWanted {
    pub(crate) fn of(request: &RequestKind) -> OperationsWanted {
        match request {
            RequestKind::Metadata(r) => OperationsWanted {
                topics: r.include_topic_authorized_operations,
                cluster: r.include_cluster_authorized_operations,
                ..Default::default()
            },
            // Always answered, as Kafka does.
            RequestKind::DescribeTopicPartitions(_) => OperationsWanted { topics: true, ..Default::default() },
            RequestKind::DescribeCluster(r) => {
                OperationsWanted { cluster: r.include_cluster_authorized_operations, ..Default::default() }
            }
            RequestKind::DescribeGroups(r) => {
                OperationsWanted { groups: r.include_authorized_operations, ..Default::default() }
            }
            RequestKind::ConsumerGroupDescribe(r) => {
                OperationsWanted { groups: r.include_authorized_operations, ..Default::default() }
            }
            RequestKind::ShareGroupDescribe(r) => {
                OperationsWanted { groups: r.include_authorized_operations, ..Default::default() }
            }
            _ => OperationsWanted::default(),
        }
    }
}

/// The operations of `supported` the client may perform on the resource, one bit each.
fn operations(broker: &Broker, session: &ClientSession, resource_type: i8, name: &str, supported: &[i8]) -> i32 {
    supported
        .iter()
        .filter(|&&operation| broker.authorized(session, operation, resource_type, name))
        .fold(0, |bits, &operation| bits | (1 << operation))
}

/// Fills the `authorized_operations` fields the request asked for (fields not asked for
/// keep Kafka's "omitted", i32::MIN).
pub(crate) fn fill_operations(
    broker: &Broker,
    session: &ClientSession,
    wanted: OperationsWanted,
    response: &mut ResponseKind,
) {
    let cluster = || operations(broker, session, RESOURCE_CLUSTER, acl::CLUSTER_RESOURCE_NAME, &CLUSTER_OPERATIONS);
    match response {
        ResponseKind::Metadata(response) => {
            if wanted.topics {
                for t in response.topics.iter_mut().filter(|t| t.error_code == 0) {
                    let name = t.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                    t.topic_authorized_operations =
                        operations(broker, session, RESOURCE_TOPIC, &name, &TOPIC_OPERATIONS);
                }
            }
            if wanted.cluster {
                response.cluster_authorized_operations = cluster();
            }
        }
        ResponseKind::DescribeTopicPartitions(response) if wanted.topics => {
            for t in response.topics.iter_mut().filter(|t| t.error_code == 0) {
                let name = t.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                t.topic_authorized_operations = operations(broker, session, RESOURCE_TOPIC, &name, &TOPIC_OPERATIONS);
            }
        }
        ResponseKind::DescribeCluster(response) if wanted.cluster && response.error_code == 0 => {
            response.cluster_authorized_operations = cluster();
        }
        ResponseKind::DescribeGroups(response) if wanted.groups => {
            for g in response.groups.iter_mut().filter(|g| g.error_code == 0) {
                g.authorized_operations = operations(broker, session, RESOURCE_GROUP, &g.group_id, &GROUP_OPERATIONS);
            }
        }
        ResponseKind::ConsumerGroupDescribe(response) if wanted.groups => {
            for g in response.groups.iter_mut().filter(|g| g.error_code == 0) {
                g.authorized_operations = operations(broker, session, RESOURCE_GROUP, &g.group_id, &GROUP_OPERATIONS);
            }
        }
        ResponseKind::ShareGroupDescribe(response) if wanted.groups => {
            for g in response.groups.iter_mut().filter(|g| g.error_code == 0) {
                g.authorized_operations = operations(broker, session, RESOURCE_GROUP, &g.group_id, &GROUP_OPERATIONS);
            }
        }
        _ => {}
    }
}
