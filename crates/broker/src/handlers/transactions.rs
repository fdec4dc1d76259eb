//! The transaction APIs (KIP-98, KIP-447, KIP-664): InitProducerId with a
//! `transactional.id`, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn,
//! ListTransactions and DescribeTransactions, over the coordinator in `sluice_coordinator::txn`; and the
//! partition leader's side: DescribeProducers and WriteTxnMarkers.

use std::sync::Arc;

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{self, TopicData};
use kafka_protocol::messages::list_transactions_response;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse,
    DescribeProducersRequest, DescribeProducersResponse, DescribeTransactionsRequest, DescribeTransactionsResponse,
    EndTxnRequest, EndTxnResponse, InitProducerIdRequest, InitProducerIdResponse, ListTransactionsRequest,
    ListTransactionsResponse, ProducerId, TopicName, TransactionalId, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
    WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use kafka_protocol::ResponseError;
use sluice_security::acl;

use super::{str_bytes, ClientSession};
use crate::Broker;
use sluice_coordinator::group::error::GroupError;
use sluice_coordinator::group::offsets::CommittedOffset;
use sluice_coordinator::txn::markers::{write_local, Marker, MarkerTarget};

/// Kafka's ACL rule for transactions: WRITE on the transactional id (and on the topics,
/// READ on the group, where the request names them).
fn may_write_transaction(
    broker: &Broker,
    session: &ClientSession,
    transactional_id: &str,
) -> Result<(), ResponseError> {
    if broker.authorized(session, acl::OP_WRITE, acl::RESOURCE_TRANSACTIONAL_ID, transactional_id) {
        Ok(())
    } else {
        Err(ResponseError::TransactionalIdAuthorizationFailed)
    }
}

fn may_read_group(broker: &Broker, session: &ClientSession, group_id: &str) -> Result<(), ResponseError> {
    if broker.authorized(session, acl::OP_READ, acl::RESOURCE_GROUP, group_id) {
        Ok(())
    } else {
        Err(ResponseError::GroupAuthorizationFailed)
    }
}

pub(super) async fn init_producer_id(
    broker: &Arc<Broker>,
    session: &ClientSession,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    let transactional_id = request.transactional_id.as_ref().map(|id| id.to_string()).unwrap_or_default();
    let result = match may_write_transaction(broker, session, &transactional_id) {
        Ok(()) => {
            broker.transactions.init_producer_id(&**broker, &transactional_id, request.transaction_timeout_ms).await
        }
        Err(error) => Err(error),
    };
    match result {
        Ok((producer_id, producer_epoch)) => {
            response.producer_id = ProducerId(producer_id);
            response.producer_epoch = producer_epoch;
        }
        Err(error) => response.error_code = error.code(),
    }
    response
}

pub(super) async fn add_partitions(
    broker: &Arc<Broker>,
    session: &ClientSession,
    request: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let partitions: Vec<(String, i32)> = request
        .v3_and_below_topics
        .iter()
        .flat_map(|topic| topic.partitions.iter().map(|&p| (topic.name.to_string(), p)))
        .collect();
    let topics_writable = request
        .v3_and_below_topics
        .iter()
        .all(|topic| broker.authorized(session, acl::OP_WRITE, acl::RESOURCE_TOPIC, &topic.name));
    let checked = may_write_transaction(broker, session, request.v3_and_below_transactional_id.as_str())
        .and(if topics_writable { Ok(()) } else { Err(ResponseError::TopicAuthorizationFailed) });
    let result = match checked {
        Ok(()) => {
            broker
                .transactions
                .add_partitions(
                    &**broker,
                    request.v3_and_below_transactional_id.as_str(),
                    request.v3_and_below_producer_id.0,
                    request.v3_and_below_producer_epoch,
                    &partitions,
                )
                .await
        }
        Err(error) => Err(error),
    };
    let code = match result {
        Ok(()) => 0,
        Err(error) => error.code(),
    };
    let mut response = AddPartitionsToTxnResponse::default();
    response.results_by_topic_v3_and_below = request
        .v3_and_below_topics
        .iter()
        .map(|topic| {
            let mut result = AddPartitionsToTxnTopicResult::default();
            result.name = topic.name.clone();
            result.results_by_partition = topic
                .partitions
                .iter()
                .map(|&partition| {
                    let mut partition_result = AddPartitionsToTxnPartitionResult::default();
                    partition_result.partition_index = partition;
                    partition_result.partition_error_code = code;
                    partition_result
                })
                .collect();
            result
        })
        .collect();
    response
}

pub(super) async fn add_offsets(
    broker: &Arc<Broker>,
    session: &ClientSession,
    request: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let result = sluice_coordinator::group::validate_group_id(request.group_id.as_str())
        .map_err(|_| ResponseError::InvalidGroupId)
        .and_then(|()| may_write_transaction(broker, session, request.transactional_id.as_str()))
        .and_then(|()| may_read_group(broker, session, request.group_id.as_str()));
    let result = match result {
        Ok(()) => {
            broker
                .transactions
                .add_offsets(
                    &**broker,
                    request.transactional_id.as_str(),
                    request.producer_id.0,
                    request.producer_epoch,
                    request.group_id.as_str(),
                )
                .await
        }
        Err(error) => Err(error),
    };
    let mut response = AddOffsetsToTxnResponse::default();
    if let Err(error) = result {
        response.error_code = error.code();
    }
    response
}

/// TxnOffsetCommit, at the group's coordinator: the offsets wait there, pending on the
/// producer's transaction, until the transaction coordinator's marker commits or drops
/// them (`sluice_coordinator::group::offsets`).
pub(super) async fn txn_offset_commit(
    broker: &Arc<Broker>,
    session: &ClientSession,
    request: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
    let now_ms = sluice_storage::now_ms();
    let offsets: Vec<(String, i32, CommittedOffset)> = request
        .topics
        .iter()
        .flat_map(|topic| {
            topic.partitions.iter().map(move |partition| {
                let value = CommittedOffset {
                    offset: partition.committed_offset,
                    leader_epoch: partition.committed_leader_epoch,
                    metadata: partition.committed_metadata.as_ref().map(|m| m.to_string()),
                    commit_timestamp_ms: now_ms,
                };
                (topic.name.to_string(), partition.partition_index, value)
            })
        })
        .collect();
    let committer = sluice_coordinator::group::Committer {
        member_id: request.member_id.as_str(),
        group_instance_id: request.group_instance_id.as_deref(),
        generation_id: request.generation_id,
        version,
    };
    let allowed = may_write_transaction(broker, session, request.transactional_id.as_str())
        .and_then(|()| may_read_group(broker, session, request.group_id.as_str()));
    let write = allowed.and_then(|()| {
        super::groups::coordinator(broker)
            .commit_transactional_offsets(
                request.group_id.as_str(),
                committer,
                request.producer_id.0,
                request.producer_epoch,
                offsets,
                broker.logs.syncer(),
            )
            .map_err(GroupError::response_error)
    });
    let result = match write {
        Ok(write) => write.await.map_err(GroupError::response_error),
        Err(error) => Err(error),
    };
    let code = match result {
        Ok(()) => 0,
        Err(error) => error.code(),
    };
    let mut response = TxnOffsetCommitResponse::default();
    response.topics = request
        .topics
        .iter()
        .map(|topic| {
            let mut result = TxnOffsetCommitResponseTopic::default();
            result.name = topic.name.clone();
            result.partitions = topic
                .partitions
                .iter()
                .map(|partition| {
                    let mut partition_result = TxnOffsetCommitResponsePartition::default();
                    partition_result.partition_index = partition.partition_index;
                    partition_result.error_code = code;
                    partition_result
                })
                .collect();
            result
        })
        .collect();
    response
}

pub(super) async fn end(broker: &Arc<Broker>, session: &ClientSession, request: EndTxnRequest) -> EndTxnResponse {
    let allowed = may_write_transaction(broker, session, request.transactional_id.as_str());
    let result = match allowed {
        Ok(()) => {
            broker
                .transactions
                .end(
                    &**broker,
                    request.transactional_id.as_str(),
                    request.producer_id.0,
                    request.producer_epoch,
                    request.committed,
                )
                .await
        }
        Err(error) => Err(error),
    };
    let mut response = EndTxnResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    if let Err(error) = result {
        response.error_code = error.code();
    }
    response
}

pub(super) fn list(
    broker: &Arc<Broker>,
    session: &ClientSession,
    request: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let mut response = ListTransactionsResponse::default();
    let coordinator = &broker.transactions;
    let known = ["Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort"];
    response.unknown_state_filters =
        request.state_filters.iter().filter(|f| !known.contains(&f.as_str())).cloned().collect();
    let now_ms = sluice_storage::now_ms();
    for (id, meta) in coordinator.list() {
        let state_ok = request.state_filters.is_empty() || request.state_filters.iter().any(|f| f == meta.state.name());
        let producer_ok = request.producer_id_filters.is_empty()
            || request.producer_id_filters.iter().any(|p| p.0 == meta.producer_id);
        let long_enough = request.duration_filter < 0
            || (meta.state == sluice_coordinator::txn::TxnState::Ongoing
                && now_ms - meta.started_ms >= request.duration_filter);
        let visible = broker.authorized(session, acl::OP_DESCRIBE, acl::RESOURCE_TRANSACTIONAL_ID, &id);
        if state_ok && producer_ok && long_enough && visible {
            let mut state = list_transactions_response::TransactionState::default();
            state.transactional_id = TransactionalId(str_bytes(&id));
            state.producer_id = ProducerId(meta.producer_id);
            state.transaction_state = str_bytes(meta.state.name());
            response.transaction_states.push(state);
        }
    }
    response
}

pub(super) fn describe(
    broker: &Arc<Broker>,
    session: &ClientSession,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut response = DescribeTransactionsResponse::default();
    for id in request.transactional_ids {
        let mut state = describe_transactions_response::TransactionState::default();
        state.transactional_id = id.clone();
        state.producer_id = ProducerId(-1);
        state.producer_epoch = -1;
        state.transaction_start_time_ms = -1;
        state.transaction_state = str_bytes("");
        let described = if broker.authorized(session, acl::OP_DESCRIBE, acl::RESOURCE_TRANSACTIONAL_ID, &id) {
            broker.transactions.describe(id.as_str())
        } else {
            Err(ResponseError::TransactionalIdAuthorizationFailed)
        };
        match described {
            Err(error) => state.error_code = error.code(),
            Ok(None) => state.error_code = ResponseError::TransactionalIdNotFound.code(),
            Ok(Some(meta)) => {
                state.transaction_state = str_bytes(meta.state.name());
                state.transaction_timeout_ms = meta.timeout_ms;
                state.transaction_start_time_ms = meta.started_ms;
                state.producer_id = ProducerId(meta.producer_id);
                state.producer_epoch = meta.producer_epoch;
                let mut topics: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
                for (topic, partition) in &meta.partitions {
                    topics.entry(topic.clone()).or_default().push(*partition);
                }
                state.topics = topics
                    .into_iter()
                    .map(|(topic, partitions)| {
                        let mut data = TopicData::default();
                        data.topic = TopicName(str_bytes(&topic));
                        data.partitions = partitions;
                        data
                    })
                    .collect();
            }
        }
        response.transaction_states.push(state);
    }
    response
}

/// DescribeProducers (KIP-664): the producers a partition this node leads knows, with
/// their open transaction's first offset (`kafka-transactions.sh describe-producers`,
/// `find-hanging`, and `abort --start-offset`).
pub(super) fn describe_producers(
    broker: &Arc<Broker>,
    session: &ClientSession,
    request: DescribeProducersRequest,
) -> DescribeProducersResponse {
    use kafka_protocol::messages::describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
    let mut response = DescribeProducersResponse::default();
    for topic in request.topics {
        let readable = broker.authorized(session, acl::OP_READ, acl::RESOURCE_TOPIC, &topic.name);
        let mut result = TopicResponse::default();
        result.name = topic.name.clone();
        for index in topic.partition_indexes {
            let mut partition = PartitionResponse::default();
            partition.partition_index = index;
            let log = if !readable {
                Err(ResponseError::TopicAuthorizationFailed)
            } else {
                broker.partition(&topic.name, index).ok_or_else(|| match &broker.replicas {
                    Some(_) => broker
                        .hosted_replica(&topic.name, index, ResponseError::UnknownTopicOrPartition)
                        .map_or_else(|error| error, |_| ResponseError::NotLeaderOrFollower),
                    None => ResponseError::UnknownTopicOrPartition,
                })
            };
            match log {
                Err(error) => partition.error_code = error.code(),
                Ok(log) => {
                    partition.active_producers = log
                        .producers()
                        .into_iter()
                        .map(|summary| {
                            let mut state = ProducerState::default();
                            state.producer_id = ProducerId(summary.producer_id);
                            state.producer_epoch = i32::from(summary.producer_epoch);
                            state.last_sequence = summary.last_sequence;
                            state.last_timestamp = summary.last_timestamp;
                            // Not tracked per partition: Kafka's tools then use 0.
                            state.coordinator_epoch = -1;
                            state.current_txn_start_offset = summary.open_transaction.unwrap_or(-1);
                            state
                        })
                        .collect();
                }
            }
            result.partitions.push(partition);
        }
        response.topics.push(result);
    }
    response
}

/// WriteTxnMarkers: writes commit or abort markers to partitions this node leads and
/// answers once they are durable. Brokers send it for transactions coordinated elsewhere;
/// an administrator sends it to end a hanging transaction (`kafka-transactions.sh
/// abort`). Its rule (handlers/authorize.rs) admits only ALTER or CLUSTER_ACTION on the
/// cluster, as in Kafka.
pub(super) async fn write_markers(broker: &Arc<Broker>, request: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse {
    use kafka_protocol::messages::write_txn_markers_response::{
        WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    };
    let now_ms = sluice_storage::now_ms();
    let mut response = WriteTxnMarkersResponse::default();
    for request_marker in request.markers {
        let marker = Marker {
            producer_id: request_marker.producer_id.0,
            producer_epoch: request_marker.producer_epoch,
            commit: request_marker.transaction_result,
            coordinator_epoch: request_marker.coordinator_epoch,
        };
        let mut written = Vec::new();
        let mut results = Vec::new();
        for topic in &request_marker.topics {
            for &index in &topic.partition_indexes {
                let target = MarkerTarget::from_wire(&topic.name, index);
                let outcome = if matches!(&target, MarkerTarget::Partition(name, _) if sluice_meta::topics::is_internal(name))
                {
                    Err(ResponseError::InvalidTopicException)
                } else {
                    write_local(&**broker, &target, marker, now_ms)
                };
                match outcome {
                    Ok(wait) => written.push((topic.name.clone(), index, wait)),
                    Err(error) => results.push((topic.name.clone(), index, error.code())),
                }
            }
        }
        for (topic, index, wait) in written {
            let code = match wait {
                Some(wait) => wait.await.map_or_else(|error| error.code(), |()| 0),
                None => 0,
            };
            results.push((topic, index, code));
        }
        let mut by_topic: std::collections::BTreeMap<TopicName, Vec<WritableTxnMarkerPartitionResult>> =
            Default::default();
        for (topic, index, code) in results {
            let mut partition = WritableTxnMarkerPartitionResult::default();
            partition.partition_index = index;
            partition.error_code = code;
            by_topic.entry(topic).or_default().push(partition);
        }
        let mut result = WritableTxnMarkerResult::default();
        result.producer_id = request_marker.producer_id;
        result.topics = by_topic
            .into_iter()
            .map(|(name, partitions)| {
                let mut topic = WritableTxnMarkerTopicResult::default();
                topic.name = name;
                topic.partitions = partitions;
                topic
            })
            .collect();
        response.markers.push(result);
    }
    response
}
