//! What each API needs from the authorizer, declared in one table, [`rule`], that the
//! dispatcher enforces for every request, with Kafka's rules (KafkaApis and AuthHelper of
//! Apache Kafka 4.x). The table is a `match` over every [`ApiKey`] without a catch-all
//! arm, so an API cannot be added without deciding its rule, and a test checks that every
//! API advertised in ApiVersions has one.
//!
//! A rule is one of:
//! - [`Rule::Open`]: Kafka checks no ACL (ApiVersions, the SASL exchange, DescribeCluster);
//! - [`Rule::Cluster`]: one of some operations on the cluster, or the whole request is
//!   refused with CLUSTER_AUTHORIZATION_FAILED;
//! - [`Rule::Resources`]: per named resource, by a pair of checks: the first refuses a
//!   request outright (its group may not be used) or takes the resources the client may not
//!   touch out of it; the second puts those back into the response with Kafka's errors and
//!   masks what a read-only request may not see;
//! - [`Rule::InHandler`]: per resource inside the handler, which alone knows what the
//!   request touches (Produce and Fetch per topic on the hot path, the transaction, ACL,
//!   quota and share-state APIs);
//! - [`Rule::NotServed`]: not advertised, so never dispatched.
//!
//! CLUSTER_ACTION, what brokers need of each other (replica fetches, transaction markers,
//! share-group state), comes from ACLs or `super.users` only; the brokers' own user
//! (`sluice_security::INTER_BROKER_USER`) is always a super user, and only a connection
//! that proved the cluster's secret can be that user. With no authorizer configured nothing is checked.
//!
//! [`fill_operations`] answers KIP-430's `include_*_authorized_operations`.

mod operations;
mod requests;
mod responses;

use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_security::acl::{self, RESOURCE_GROUP, RESOURCE_TOPIC, RESOURCE_TRANSACTIONAL_ID};

use super::ClientSession;
use crate::Broker;

pub(super) use operations::{fill_operations, OperationsWanted};

/// Config resource types (DescribeConfigs, AlterConfigs).
const CONFIG_RESOURCE_TOPIC: i8 = 2;

/// Checks a request before its handler: the request to serve (maybe trimmed), or the answer.
type Before = fn(&Access<'_>, RequestKind, &mut Denied) -> Result<RequestKind, Box<ResponseKind>>;
/// Completes a response: puts back what [`Before`] took out, masks what may not be seen.
type After = fn(&Access<'_>, &Denied, &mut ResponseKind);
/// The whole answer to a request refused for want of a cluster operation.
type RefusalAnswer = fn(RequestKind, ResponseError) -> ResponseKind;

/// What one API needs from the authorizer, and where that is checked.
#[derive(Clone, Copy)]
pub(super) enum Rule {
    /// No ACL is needed.
    Open,
    /// Any one of these operations on the cluster resource.
    Cluster { any_of: &'static [i8], refuse: RefusalAnswer },
    /// Per named resource, by this module, before and after the handler.
    Resources { before: Before, after: After },
    /// Per resource, inside the handler.
    InHandler,
    /// Not advertised in ApiVersions.
    NotServed,
}

/// The rule of every Kafka API (what KafkaApis requires is in each arm's comment).
pub(super) const fn rule(api: ApiKey) -> Rule {
    use requests as rq;
    use responses as rs;
    const fn checks(before: Before, after: After) -> Rule {
        Rule::Resources { before, after }
    }
    const fn cluster(any_of: &'static [i8], refuse: RefusalAnswer) -> Rule {
        Rule::Cluster { any_of, refuse }
    }
    match api {
        // WRITE on each topic (in the handler); WRITE on the TRANSACTIONAL_ID of
        // transactional records.
        ApiKey::Produce => checks(rq::produce, rs::unchanged),
        // Followers: CLUSTER_ACTION; consumers: READ on each topic.
        ApiKey::Fetch => Rule::InHandler,
        // DESCRIBE on each topic.
        ApiKey::ListOffsets => checks(rq::unchanged, rs::list_offsets),
        // DESCRIBE on each topic (others left out or refused); CREATE to auto-create.
        ApiKey::Metadata => checks(rq::metadata, rs::metadata),
        // READ on the group, READ on each topic.
        ApiKey::OffsetCommit => checks(rq::offset_commit, rs::offset_commit),
        // DESCRIBE on each group, DESCRIBE on each topic.
        ApiKey::OffsetFetch => checks(rq::offset_fetch, rs::offset_fetch),
        // DESCRIBE on the GROUP or TRANSACTIONAL_ID named.
        ApiKey::FindCoordinator => checks(rq::find_coordinator, rs::find_coordinator),
        // READ on the group.
        ApiKey::JoinGroup | ApiKey::SyncGroup | ApiKey::Heartbeat | ApiKey::LeaveGroup => {
            checks(rq::classic_group, rs::unchanged)
        }
        // DESCRIBE on each group.
        ApiKey::DescribeGroups => checks(rq::unchanged, rs::describe_groups),
        // DESCRIBE on the cluster, else the groups the client may describe.
        ApiKey::ListGroups => checks(rq::unchanged, rs::list_groups),
        ApiKey::SaslHandshake | ApiKey::SaslAuthenticate | ApiKey::ApiVersions => Rule::Open,
        // CREATE on the cluster or on each topic.
        ApiKey::CreateTopics => checks(rq::create_topics, rs::create_topics),
        // DELETE on each topic.
        ApiKey::DeleteTopics => checks(rq::delete_topics, rs::delete_topics),
        // DELETE on each topic.
        ApiKey::DeleteRecords => checks(rq::delete_records, rs::delete_records),
        // WRITE on the TRANSACTIONAL_ID (in the handler); without one IDEMPOTENT_WRITE on
        // the cluster or WRITE on some topic.
        ApiKey::InitProducerId => checks(rq::init_producer_id, rs::unchanged),
        // WRITE on the TRANSACTIONAL_ID, and on each topic / READ on the group.
        ApiKey::AddPartitionsToTxn | ApiKey::AddOffsetsToTxn | ApiKey::EndTxn | ApiKey::TxnOffsetCommit => {
            Rule::InHandler
        }
        // ALTER or CLUSTER_ACTION on the cluster: only brokers and administrators end
        // another producer's transaction.
        ApiKey::WriteTxnMarkers => cluster(&[acl::OP_ALTER, acl::OP_CLUSTER_ACTION], rq::refuse_write_txn_markers),
        // Brokers only: a client's request forwarded with its principal (`envelope.rs`).
        ApiKey::Envelope => cluster(&[acl::OP_CLUSTER_ACTION], rq::refuse_envelope),
        // DESCRIBE (DescribeAcls) or ALTER (CreateAcls, DeleteAcls) on the cluster.
        ApiKey::DescribeAcls | ApiKey::CreateAcls | ApiKey::DeleteAcls => Rule::InHandler,
        // DESCRIBE_CONFIGS on each resource.
        ApiKey::DescribeConfigs => checks(rq::unchanged, rs::describe_configs),
        // ALTER_CONFIGS on each resource; WRITE on a share group's dead-letter topic.
        ApiKey::AlterConfigs => checks(rq::alter_configs, rs::alter_configs),
        ApiKey::IncrementalAlterConfigs => checks(rq::incremental_alter_configs, rs::incremental_alter_configs),
        // DESCRIBE on the cluster.
        ApiKey::DescribeLogDirs => cluster(&[acl::OP_DESCRIBE], rq::refuse_describe_log_dirs),
        // ALTER on each topic.
        ApiKey::CreatePartitions => checks(rq::create_partitions, rs::create_partitions),
        // DELETE on each group.
        ApiKey::DeleteGroups => checks(rq::delete_groups, rs::delete_groups),
        ApiKey::AlterPartitionReassignments => cluster(&[acl::OP_ALTER], rq::refuse_alter_reassignments),
        ApiKey::ListPartitionReassignments => cluster(&[acl::OP_DESCRIBE], rq::refuse_list_reassignments),
        // The controller quorum: DESCRIBE to see it, ALTER to change its voters.
        ApiKey::DescribeQuorum => cluster(&[acl::OP_DESCRIBE], rq::refuse_describe_quorum),
        ApiKey::AddRaftVoter => cluster(&[acl::OP_ALTER], rq::refuse_add_raft_voter),
        ApiKey::RemoveRaftVoter => cluster(&[acl::OP_ALTER], rq::refuse_remove_raft_voter),
        // DELETE on the group, READ on each topic.
        ApiKey::OffsetDelete => checks(rq::offset_delete, rs::offset_delete),
        // DESCRIBE_CONFIGS / ALTER_CONFIGS on the cluster.
        ApiKey::DescribeClientQuotas | ApiKey::AlterClientQuotas => Rule::InHandler,
        ApiKey::DescribeUserScramCredentials => cluster(&[acl::OP_DESCRIBE], rq::refuse_describe_scram),
        ApiKey::AlterUserScramCredentials => cluster(&[acl::OP_ALTER], rq::refuse_alter_scram),
        // No ACL; the cluster's authorized operations when asked for.
        ApiKey::DescribeCluster => Rule::Open,
        // DESCRIBE on each topic: a named one is answered with an error, the others of
        // "all topics" are left out (in the handler, which pages through them).
        ApiKey::DescribeTopicPartitions => Rule::InHandler,
        // READ on each topic.
        ApiKey::DescribeProducers => Rule::InHandler,
        // DESCRIBE on each TRANSACTIONAL_ID (others left out or refused).
        ApiKey::DescribeTransactions | ApiKey::ListTransactions => Rule::InHandler,
        // READ on the group, DESCRIBE on each subscribed topic.
        ApiKey::ConsumerGroupHeartbeat => checks(rq::consumer_group_heartbeat, rs::unchanged),
        // DESCRIBE on each group and on every topic its members use.
        ApiKey::ConsumerGroupDescribe => checks(rq::unchanged, rs::consumer_group_describe),
        ApiKey::ShareGroupHeartbeat => checks(rq::share_group_heartbeat, rs::unchanged),
        ApiKey::ShareGroupDescribe => checks(rq::share_group_describe, rs::share_group_describe),
        // READ on the group (READ on each topic in the handler).
        ApiKey::ShareFetch => checks(rq::share_fetch, rs::unchanged),
        ApiKey::ShareAcknowledge => checks(rq::share_acknowledge, rs::unchanged),
        // CLUSTER_ACTION: brokers only.
        ApiKey::InitializeShareGroupState
        | ApiKey::ReadShareGroupState
        | ApiKey::WriteShareGroupState
        | ApiKey::DeleteShareGroupState
        | ApiKey::ReadShareGroupStateSummary => Rule::InHandler,
        // DESCRIBE on each group and each topic.
        ApiKey::DescribeShareGroupOffsets => checks(rq::describe_share_group_offsets, rs::describe_share_group_offsets),
        // READ on the group and each topic.
        ApiKey::AlterShareGroupOffsets => checks(rq::alter_share_group_offsets, rs::alter_share_group_offsets),
        // DELETE on the group, READ on each topic.
        ApiKey::DeleteShareGroupOffsets => checks(rq::delete_share_group_offsets, rs::delete_share_group_offsets),
        ApiKey::OffsetForLeaderEpoch
        | ApiKey::AlterReplicaLogDirs
        | ApiKey::CreateDelegationToken
        | ApiKey::RenewDelegationToken
        | ApiKey::ExpireDelegationToken
        | ApiKey::DescribeDelegationToken
        | ApiKey::ElectLeaders
        | ApiKey::Vote
        | ApiKey::BeginQuorumEpoch
        | ApiKey::EndQuorumEpoch
        | ApiKey::AlterPartition
        | ApiKey::UpdateFeatures
        | ApiKey::FetchSnapshot
        | ApiKey::BrokerRegistration
        | ApiKey::BrokerHeartbeat
        | ApiKey::UnregisterBroker
        | ApiKey::AllocateProducerIds
        | ApiKey::ControllerRegistration
        | ApiKey::GetTelemetrySubscriptions
        | ApiKey::PushTelemetry
        | ApiKey::AssignReplicasToDirs
        | ApiKey::ListConfigResources
        | ApiKey::UpdateRaftVoter => Rule::NotServed,
    }
}

/// What a [`Rule::Resources`] check took out of a request, and what the response must mask.
#[derive(Default)]
pub(super) struct Denied {
    /// Topics removed, with the partitions the request named.
    topics: Vec<(String, Vec<i32>)>,
    /// Groups removed.
    groups: Vec<String>,
    /// Config resources removed: (type, name, error).
    resources: Vec<(i8, String, ResponseError)>,
    /// The request asked for all topics (answers leave out what may not be described).
    all_topics: bool,
    /// Groups whose topics were not named (answers leave out what may not be described).
    all_topics_groups: Vec<String>,
    /// FindCoordinator's key type.
    key_type: i8,
}

/// The client of one request, as the checks ask about it.
pub(super) struct Access<'a> {
    broker: &'a Broker,
    session: &'a ClientSession,
}

impl Access<'_> {
    fn topic(&self, operation: i8, name: &str) -> bool {
        self.broker.authorized(self.session, operation, RESOURCE_TOPIC, name)
    }

    fn group(&self, operation: i8, name: &str) -> bool {
        self.broker.authorized(self.session, operation, RESOURCE_GROUP, name)
    }

    fn transactional_id(&self, operation: i8, id: &str) -> bool {
        self.broker.authorized(self.session, operation, RESOURCE_TRANSACTIONAL_ID, id)
    }

    fn cluster(&self, operation: i8) -> bool {
        self.broker.authorized_on_cluster(self.session, operation)
    }
}

fn error_message(error: ResponseError) -> Option<StrBytes> {
    let text = match error {
        ResponseError::TopicAuthorizationFailed => "Topic authorization failed.",
        ResponseError::GroupAuthorizationFailed => "Group authorization failed.",
        ResponseError::TransactionalIdAuthorizationFailed => "Transactional Id authorization failed.",
        _ => "Cluster authorization failed.",
    };
    Some(StrBytes::from_static_str(text))
}

/// Checks a request against its API's rule before it is served: `Err` is the whole answer.
pub(super) fn before(
    broker: &Broker,
    session: &ClientSession,
    api: ApiKey,
    body: RequestKind,
) -> Result<(RequestKind, Denied), Box<ResponseKind>> {
    let mut denied = Denied::default();
    if broker.authorizer.is_none() {
        return Ok((body, denied));
    }
    let access = Access { broker, session };
    match rule(api) {
        Rule::Open | Rule::InHandler | Rule::NotServed => Ok((body, denied)),
        Rule::Cluster { any_of, refuse } => {
            assert!(!any_of.is_empty(), "a cluster rule names an operation");
            if any_of.iter().any(|&operation| access.cluster(operation)) {
                Ok((body, denied))
            } else {
                Err(Box::new(refuse(body, ResponseError::ClusterAuthorizationFailed)))
            }
        }
        Rule::Resources { before, .. } => before(&access, body, &mut denied).map(|body| (body, denied)),
    }
}

/// Completes a response as its API's rule says: refused resources back in, the rest masked.
pub(super) fn after(
    broker: &Broker,
    session: &ClientSession,
    api: ApiKey,
    denied: Denied,
    response: &mut ResponseKind,
) {
    if broker.authorizer.is_none() {
        return;
    }
    if let Rule::Resources { after, .. } = rule(api) {
        after(&Access { broker, session }, &denied, response);
    }
}

/// Whether the client may do `operation` on a config resource; the error if not.
fn config_access(access: &Access<'_>, operation: i8, resource_type: i8, name: &str) -> Result<(), ResponseError> {
    let allowed = if resource_type == CONFIG_RESOURCE_TOPIC {
        access.topic(operation, name).then_some(()).ok_or(ResponseError::TopicAuthorizationFailed)
    } else if resource_type == super::configs::RESOURCE_GROUP {
        access.group(operation, name).then_some(()).ok_or(ResponseError::GroupAuthorizationFailed)
    } else {
        access.cluster(operation).then_some(()).ok_or(ResponseError::ClusterAuthorizationFailed)
    };
    debug_assert!(allowed.is_ok() || access.broker.authorizer.is_some(), "no authorizer allows everything");
    allowed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_advertised_api_has_a_rule() {
        for advertised in sluice_protocol::api_versions_response(0).api_keys {
            let api = ApiKey::try_from(advertised.api_key).expect("an advertised key is a Kafka API");
            assert!(!matches!(rule(api), Rule::NotServed), "{api:?} is advertised but has no rule");
        }
    }

    #[test]
    fn apis_not_advertised_are_not_served() {
        let advertised: Vec<i16> =
            sluice_protocol::api_versions_response(0).api_keys.iter().map(|k| k.api_key).collect();
        for key in 0..=i16::from(u8::MAX) {
            let Ok(api) = ApiKey::try_from(key) else { continue };
            let served = !matches!(rule(api), Rule::NotServed);
            assert_eq!(served, advertised.contains(&key), "{api:?}: the rule table and ApiVersions disagree");
        }
    }

    #[test]
    fn cluster_rules_name_operations_on_the_cluster() {
        for advertised in sluice_protocol::api_versions_response(0).api_keys {
            let api = ApiKey::try_from(advertised.api_key).unwrap();
            if let Rule::Cluster { any_of, .. } = rule(api) {
                assert!(!any_of.is_empty(), "{api:?}");
                assert!(
                    any_of.iter().all(|op| operations::CLUSTER_OPERATIONS.contains(op)),
                    "{api:?} needs an operation the cluster resource does not have"
                );
            }
        }
    }
}
