//! The transaction APIs (KIP-98, KIP-447, KIP-664): InitProducerId with a
//! `transactional.id`, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn,
//! ListTransactions and DescribeTransactions, over the coordinator in `txn.rs`.

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
    DescribeTransactionsRequest, DescribeTransactionsResponse, EndTxnRequest, EndTxnResponse, InitProducerIdRequest,
    InitProducerIdResponse, ListTransactionsRequest, ListTransactionsResponse, ProducerId, TopicName, TransactionalId,
    TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use kafka_protocol::ResponseError;

use super::{str_bytes, Session};
use crate::security::acl;
use crate::txn::{PendingOffset, TransactionCoordinator};
use crate::Broker;

/// Kafka's ACL rule for transactions: WRITE on the transactional id (and on the topics,
/// READ on the group, where the request names them).
fn may_write_transaction(broker: &Broker, session: &Session, transactional_id: &str) -> Result<(), ResponseError> {
    if broker.authorized(session, acl::OP_WRITE, acl::RESOURCE_TRANSACTIONAL_ID, transactional_id) {
        Ok(())
    } else {
        Err(ResponseError::TransactionalIdAuthorizationFailed)
    }
}

fn may_read_group(broker: &Broker, session: &Session, group_id: &str) -> Result<(), ResponseError> {
    if broker.authorized(session, acl::OP_READ, acl::RESOURCE_GROUP, group_id) {
        Ok(())
    } else {
        Err(ResponseError::GroupAuthorizationFailed)
    }
}

/// The coordinator, or the error a cluster node answers (transactions are single-node for now).
fn coordinator(broker: &Broker) -> Result<&Arc<TransactionCoordinator>, ResponseError> {
    broker.transactions.as_ref().ok_or(ResponseError::CoordinatorNotAvailable)
}

pub(super) async fn init_producer_id(
    broker: &Arc<Broker>,
    session: &Session,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    let transactional_id = request.transactional_id.as_ref().map(|id| id.to_string()).unwrap_or_default();
    let result =
        match coordinator(broker).and_then(|c| may_write_transaction(broker, session, &transactional_id).map(|()| c)) {
            Ok(coordinator) => {
                coordinator.init_producer_id(broker, &transactional_id, request.transaction_timeout_ms).await
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

pub(super) fn add_partitions(
    broker: &Arc<Broker>,
    session: &Session,
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
    let result = may_write_transaction(broker, session, request.v3_and_below_transactional_id.as_str())
        .and(if topics_writable { Ok(()) } else { Err(ResponseError::TopicAuthorizationFailed) })
        .and_then(|()| coordinator(broker))
        .and_then(|coordinator| {
            coordinator.add_partitions(
                broker,
                request.v3_and_below_transactional_id.as_str(),
                request.v3_and_below_producer_id.0,
                request.v3_and_below_producer_epoch,
                &partitions,
            )
        });
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

pub(super) fn add_offsets(
    broker: &Arc<Broker>,
    session: &Session,
    request: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let result = crate::group::validate_group_id(request.group_id.as_str())
        .map_err(|_| ResponseError::InvalidGroupId)
        .and_then(|()| may_write_transaction(broker, session, request.transactional_id.as_str()))
        .and_then(|()| may_read_group(broker, session, request.group_id.as_str()))
        .and_then(|()| coordinator(broker))
        .and_then(|coordinator| {
            coordinator.add_offsets(
                request.transactional_id.as_str(),
                request.producer_id.0,
                request.producer_epoch,
                request.group_id.as_str(),
            )
        });
    let mut response = AddOffsetsToTxnResponse::default();
    if let Err(error) = result {
        response.error_code = error.code();
    }
    response
}

pub(super) fn txn_offset_commit(
    broker: &Arc<Broker>,
    session: &Session,
    request: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let offsets: Vec<PendingOffset> = request
        .topics
        .iter()
        .flat_map(|topic| {
            topic.partitions.iter().map(|partition| PendingOffset {
                topic: topic.name.to_string(),
                partition: partition.partition_index,
                offset: partition.committed_offset,
                leader_epoch: partition.committed_leader_epoch,
                metadata: partition.committed_metadata.as_ref().map(|m| m.to_string()),
            })
        })
        .collect();
    let result = may_write_transaction(broker, session, request.transactional_id.as_str())
        .and_then(|()| may_read_group(broker, session, request.group_id.as_str()))
        .and_then(|()| coordinator(broker))
        .and_then(|coordinator| {
            coordinator.commit_offsets(
                request.transactional_id.as_str(),
                request.producer_id.0,
                request.producer_epoch,
                request.group_id.as_str(),
                offsets,
            )
        });
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

pub(super) async fn end(broker: &Arc<Broker>, session: &Session, request: EndTxnRequest) -> EndTxnResponse {
    let allowed = may_write_transaction(broker, session, request.transactional_id.as_str());
    let result = match allowed.and_then(|()| coordinator(broker)) {
        Ok(coordinator) => {
            coordinator
                .end(
                    broker,
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
    session: &Session,
    request: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let mut response = ListTransactionsResponse::default();
    let Ok(coordinator) = coordinator(broker) else { return response };
    let known = ["Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort"];
    response.unknown_state_filters =
        request.state_filters.iter().filter(|f| !known.contains(&f.as_str())).cloned().collect();
    let now_ms = sluice_storage::now_ms();
    for (id, meta) in coordinator.list() {
        let state_ok = request.state_filters.is_empty() || request.state_filters.iter().any(|f| f == meta.state.name());
        let producer_ok = request.producer_id_filters.is_empty()
            || request.producer_id_filters.iter().any(|p| p.0 == meta.producer_id);
        let long_enough = request.duration_filter < 0
            || (meta.state == crate::txn::TxnState::Ongoing && now_ms - meta.started_ms >= request.duration_filter);
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
    session: &Session,
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
            coordinator(broker).map(|coordinator| coordinator.describe(id.as_str()))
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
