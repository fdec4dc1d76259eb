//! Request handlers, one module per concern. [`dispatch`] runs the synchronous part of a
//! request (for Produce: validating and appending, in arrival order) before returning a
//! future for the rest (waiting for durability or for data).

mod acls;
mod admin;
mod authorize;
mod configs;
mod consumer_groups;
mod fetch;
mod groups;
mod offsets;
mod produce;
mod quotas;
mod reassignments;
mod share;
mod transactions;
mod users;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::{RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use sluice_protocol::{api_versions_response, encode_response, FileChunk, Request, ResponseChunk};

use crate::Broker;

pub(crate) use crate::blocking::on_blocking_pool;
pub(crate) use crate::metadata_writes::Failure;
pub(crate) use groups::create_internal_topics_once_formed;

/// The encoded response frame (as chunks for a vectored write), or `None` when the request gets no response (acks=0).
pub(crate) type ResponseFuture = Pin<Box<dyn Future<Output = Option<Vec<ResponseChunk>>> + Send>>;

/// Where a fetch handler leaves the file chunks its response's placeholders stand for.
type FileChunks = Arc<parking_lot::Mutex<Vec<FileChunk>>>;

/// How Kafka shows a client's address in DescribeGroups (`InetAddress.toString()` of an
/// address without a host name): "/127.0.0.1".
fn client_host(peer: &SocketAddr) -> String {
    format!("/{}", peer.ip())
}

/// A client connection's authenticated session: who sent a request, from where, over
/// which listener.
#[derive(Clone)]
pub(crate) struct ClientSession {
    pub(crate) peer: SocketAddr,
    /// Index in [`Broker::listeners`].
    pub(crate) listener: usize,
    /// Kafka principal: `User:<name>` once SASL authenticated, else `User:ANONYMOUS`.
    pub(crate) principal: Arc<str>,
    /// Until when the connection is muted for exceeding a quota.
    pub(crate) throttle: Arc<sluice_security::quota::ConnectionThrottle>,
}

/// What [`respond`] needs besides the handler's answer.
struct Exchange {
    api_key: kafka_protocol::messages::ApiKey,
    api_version: i16,
    correlation_id: i32,
    arrived: std::time::Instant,
    client_id: Option<StrBytes>,
    /// Produce: the record bytes the request carried (charged to the producer quota).
    produce_bytes: u64,
    /// Fetch from a client, not a replica (charged to the consumer quota).
    consumer_fetch: bool,
    /// Which `authorized_operations` the request asked for (KIP-430).
    authorized_operations: authorize::OperationsWanted,
}

/// Runs one request of an authenticated client. The memory the request was charged
/// (connection.rs) is held by the connection until the response is written.
pub(crate) fn dispatch(broker: &Arc<Broker>, request: Request, session: &ClientSession) -> ResponseFuture {
    let peer = &session.peer;
    let Request { api_key, api_version, correlation_id, body, client_id } = request;
    let arrived = std::time::Instant::now();
    let broker = broker.clone();
    let metered = broker.clone();
    let produce_bytes = match &body {
        RequestKind::Produce(request) => request
            .topic_data
            .iter()
            .flat_map(|t| &t.partition_data)
            .map(|p| p.records.as_ref().map_or(0, |r| r.len() as u64))
            .sum(),
        _ => 0,
    };
    let consumer_fetch = match &body {
        RequestKind::Fetch(request) => request.replica_id.0 < 0 && request.replica_state.replica_id.0 < 0,
        _ => false,
    };
    let exchange = Exchange {
        api_key,
        api_version,
        correlation_id,
        arrived,
        client_id: client_id.clone(),
        produce_bytes,
        consumer_fetch,
        authorized_operations: authorize::OperationsWanted::of(&body),
    };
    let (body, denied) = match authorize::before(&broker, session, api_key, body) {
        Ok(checked) => checked,
        Err(refused) => {
            return respond(metered, session.clone(), exchange, ready(*refused), authorize::Denied::default(), None);
        }
    };
    let mut file_chunks: Option<FileChunks> = None;
    let response: Pin<Box<dyn Future<Output = Option<ResponseKind>> + Send>> = match body {
        RequestKind::ApiVersions(_) => ready(ResponseKind::ApiVersions(api_versions_response(0))),
        RequestKind::Produce(request) => {
            let pending = produce::append(&broker, request, session);
            Box::pin(async move { pending.await.map(ResponseKind::Produce) })
        }
        RequestKind::Fetch(request) => {
            let session = session.clone();
            let files = file_chunks.insert(FileChunks::default()).clone();
            Box::pin(async move {
                let (response, chunks) = fetch::handle(&broker, request, api_version, &session).await;
                *files.lock() = chunks;
                Some(ResponseKind::Fetch(response))
            })
        }
        RequestKind::ListOffsets(request) => Box::pin(async move {
            Some(ResponseKind::ListOffsets(offsets::list_offsets(&broker, request, api_version).await))
        }),
        RequestKind::DeleteRecords(request) => {
            Box::pin(async move { Some(ResponseKind::DeleteRecords(offsets::delete_records(&broker, request).await)) })
        }
        RequestKind::Metadata(request) if admin::may_create_logs(&broker, &request) => {
            let listener = session.listener;
            Box::pin(on_blocking_pool(move || ResponseKind::Metadata(admin::metadata(&broker, request, listener))))
        }
        RequestKind::Metadata(request) => {
            ready(ResponseKind::Metadata(admin::metadata(&broker, request, session.listener)))
        }
        RequestKind::CreateTopics(request) => Box::pin(async move {
            Some(ResponseKind::CreateTopics(admin::create_topics(broker, request, api_version).await))
        }),
        RequestKind::DeleteTopics(request) => {
            Box::pin(async move { Some(ResponseKind::DeleteTopics(admin::delete_topics(broker, request).await)) })
        }
        RequestKind::CreatePartitions(request) => {
            Box::pin(
                async move { Some(ResponseKind::CreatePartitions(admin::create_partitions(broker, request).await)) },
            )
        }
        RequestKind::AlterPartitionReassignments(request) => Box::pin(async move {
            Some(ResponseKind::AlterPartitionReassignments(reassignments::alter(broker, request).await))
        }),
        RequestKind::DescribeLogDirs(request) => {
            ready(ResponseKind::DescribeLogDirs(admin::describe_log_dirs(&broker, request)))
        }
        RequestKind::ListPartitionReassignments(request) => {
            ready(ResponseKind::ListPartitionReassignments(reassignments::list(&broker, request)))
        }
        RequestKind::DescribeCluster(request) => {
            ready(ResponseKind::DescribeCluster(admin::describe_cluster(&broker, request, session.listener)))
        }
        RequestKind::InitProducerId(request) if request.transactional_id.is_some() => {
            let session = session.clone();
            Box::pin(async move {
                Some(ResponseKind::InitProducerId(transactions::init_producer_id(&broker, &session, request).await))
            })
        }
        RequestKind::InitProducerId(request) => {
            ready(ResponseKind::InitProducerId(admin::init_producer_id(&broker, request)))
        }
        RequestKind::AddPartitionsToTxn(request) => {
            let session = session.clone();
            Box::pin(async move {
                Some(ResponseKind::AddPartitionsToTxn(transactions::add_partitions(&broker, &session, request).await))
            })
        }
        RequestKind::AddOffsetsToTxn(request) => {
            let session = session.clone();
            Box::pin(async move {
                Some(ResponseKind::AddOffsetsToTxn(transactions::add_offsets(&broker, &session, request).await))
            })
        }
        RequestKind::TxnOffsetCommit(request) => {
            let session = session.clone();
            Box::pin(async move {
                let response = transactions::txn_offset_commit(&broker, &session, request, api_version).await;
                Some(ResponseKind::TxnOffsetCommit(response))
            })
        }
        RequestKind::EndTxn(request) => {
            let session = session.clone();
            Box::pin(async move { Some(ResponseKind::EndTxn(transactions::end(&broker, &session, request).await)) })
        }
        RequestKind::ListTransactions(request) => {
            ready(ResponseKind::ListTransactions(transactions::list(&broker, session, request)))
        }
        RequestKind::DescribeTransactions(request) => {
            ready(ResponseKind::DescribeTransactions(transactions::describe(&broker, session, request)))
        }
        RequestKind::DescribeProducers(request) => {
            ready(ResponseKind::DescribeProducers(transactions::describe_producers(&broker, session, request)))
        }
        RequestKind::WriteTxnMarkers(request) => {
            Box::pin(
                async move { Some(ResponseKind::WriteTxnMarkers(transactions::write_markers(&broker, request).await)) },
            )
        }
        RequestKind::DescribeConfigs(request) => {
            ready(ResponseKind::DescribeConfigs(configs::describe(&broker, request, api_version)))
        }
        RequestKind::AlterConfigs(request) => {
            Box::pin(async move { Some(ResponseKind::AlterConfigs(configs::alter(&broker, request).await)) })
        }
        RequestKind::IncrementalAlterConfigs(request) => Box::pin(async move {
            Some(ResponseKind::IncrementalAlterConfigs(configs::incremental_alter(&broker, request).await))
        }),
        RequestKind::FindCoordinator(request) => ready(ResponseKind::FindCoordinator(groups::find_coordinator(
            &broker,
            request,
            api_version,
            session.listener,
        ))),
        RequestKind::JoinGroup(request) => {
            let pending = groups::join_group(&broker, request, api_version, client_id, client_host(peer));
            Box::pin(async move { Some(ResponseKind::JoinGroup(pending.await)) })
        }
        RequestKind::SyncGroup(request) => {
            let pending = groups::sync_group(&broker, request);
            Box::pin(async move { Some(ResponseKind::SyncGroup(pending.await)) })
        }
        RequestKind::Heartbeat(request) => ready(ResponseKind::Heartbeat(groups::heartbeat(&broker, request))),
        RequestKind::LeaveGroup(request) => {
            ready(ResponseKind::LeaveGroup(groups::leave_group(&broker, request, api_version)))
        }
        RequestKind::OffsetCommit(request) => {
            let pending = groups::offset_commit(&broker, request, api_version);
            Box::pin(async move { Some(ResponseKind::OffsetCommit(pending.await)) })
        }
        RequestKind::OffsetFetch(request) => {
            ready(ResponseKind::OffsetFetch(groups::offset_fetch(&broker, request, api_version)))
        }
        RequestKind::OffsetDelete(request) => {
            let pending = groups::offset_delete(&broker, request);
            Box::pin(async move { Some(ResponseKind::OffsetDelete(pending.await)) })
        }
        RequestKind::ListGroups(request) => ready(ResponseKind::ListGroups(groups::list_groups(&broker, request))),
        RequestKind::DescribeGroups(request) => {
            ready(ResponseKind::DescribeGroups(groups::describe_groups(&broker, request)))
        }
        RequestKind::ConsumerGroupHeartbeat(request) => ready(ResponseKind::ConsumerGroupHeartbeat(
            consumer_groups::heartbeat(&broker, request, api_version, client_id, client_host(peer)),
        )),
        RequestKind::ShareGroupHeartbeat(request) => {
            ready(ResponseKind::ShareGroupHeartbeat(share::heartbeat(&broker, request, client_id, client_host(peer))))
        }
        RequestKind::ShareGroupDescribe(request) => {
            ready(ResponseKind::ShareGroupDescribe(share::describe(&broker, request)))
        }
        RequestKind::DescribeShareGroupOffsets(request) => Box::pin(async move {
            Some(ResponseKind::DescribeShareGroupOffsets(share::describe_offsets(&broker, request).await))
        }),
        RequestKind::ReadShareGroupState(request) => {
            let session = session.clone();
            Box::pin(async move {
                Some(ResponseKind::ReadShareGroupState(share::read_state(&broker, &session, request).await))
            })
        }
        RequestKind::WriteShareGroupState(request) => {
            let session = session.clone();
            Box::pin(async move {
                Some(ResponseKind::WriteShareGroupState(share::write_state(&broker, &session, request).await))
            })
        }
        RequestKind::AlterShareGroupOffsets(request) => {
            Box::pin(
                async move { Some(ResponseKind::AlterShareGroupOffsets(share::alter_offsets(&broker, request).await)) },
            )
        }
        RequestKind::DeleteShareGroupOffsets(request) => Box::pin(async move {
            Some(ResponseKind::DeleteShareGroupOffsets(share::delete_offsets(&broker, request).await))
        }),
        RequestKind::InitializeShareGroupState(request) => {
            let session = session.clone();
            Box::pin(async move {
                use kafka_protocol::messages::initialize_share_group_state_response::{
                    InitializeStateResult, PartitionResult,
                };
                let changes = request
                    .topics
                    .into_iter()
                    .map(|t| {
                        let partitions = t
                            .partitions
                            .into_iter()
                            .map(|p| {
                                (p.partition, sluice_coordinator::share::store::AdminChange::Start(p.start_offset))
                            })
                            .collect();
                        (t.topic_id, partitions)
                    })
                    .collect();
                let results = share::administer_state(&broker, &session, &request.group_id, changes).await;
                let mut response = kafka_protocol::messages::InitializeShareGroupStateResponse::default();
                response.results = results
                    .into_iter()
                    .map(|(topic_id, codes)| {
                        let mut result = InitializeStateResult::default();
                        result.topic_id = topic_id;
                        result.partitions = codes
                            .into_iter()
                            .map(|(partition, code)| {
                                PartitionResult::default().with_partition(partition).with_error_code(code)
                            })
                            .collect();
                        result
                    })
                    .collect();
                Some(ResponseKind::InitializeShareGroupState(response))
            })
        }
        RequestKind::DeleteShareGroupState(request) => {
            let session = session.clone();
            Box::pin(async move {
                use kafka_protocol::messages::delete_share_group_state_response::{DeleteStateResult, PartitionResult};
                let changes = request
                    .topics
                    .into_iter()
                    .map(|t| {
                        let partitions = t
                            .partitions
                            .into_iter()
                            .map(|p| (p.partition, sluice_coordinator::share::store::AdminChange::Delete))
                            .collect();
                        (t.topic_id, partitions)
                    })
                    .collect();
                let results = share::administer_state(&broker, &session, &request.group_id, changes).await;
                let mut response = kafka_protocol::messages::DeleteShareGroupStateResponse::default();
                response.results = results
                    .into_iter()
                    .map(|(topic_id, codes)| {
                        let mut result = DeleteStateResult::default();
                        result.topic_id = topic_id;
                        result.partitions = codes
                            .into_iter()
                            .map(|(partition, code)| {
                                PartitionResult::default().with_partition(partition).with_error_code(code)
                            })
                            .collect();
                        result
                    })
                    .collect();
                Some(ResponseKind::DeleteShareGroupState(response))
            })
        }
        RequestKind::ReadShareGroupStateSummary(request) => {
            ready(ResponseKind::ReadShareGroupStateSummary(share::read_state_summary(&broker, session, request)))
        }
        RequestKind::ShareFetch(request) => {
            let session = session.clone();
            Box::pin(async move { Some(ResponseKind::ShareFetch(share::fetch(&broker, &session, request).await)) })
        }
        RequestKind::ShareAcknowledge(request) => {
            Box::pin(
                async move { Some(ResponseKind::ShareAcknowledge(share::acknowledge_request(&broker, request).await)) },
            )
        }
        RequestKind::ConsumerGroupDescribe(request) => {
            ready(ResponseKind::ConsumerGroupDescribe(consumer_groups::describe(&broker, request, api_version)))
        }
        RequestKind::DeleteGroups(request) => {
            let pending = groups::delete_groups(&broker, request);
            Box::pin(async move { Some(ResponseKind::DeleteGroups(pending.await)) })
        }
        RequestKind::CreateAcls(request) => {
            let session = session.clone();
            Box::pin(async move { Some(ResponseKind::CreateAcls(acls::create(&broker, &session, request).await)) })
        }
        RequestKind::DescribeAcls(request) => {
            ready(ResponseKind::DescribeAcls(acls::describe(&broker, session, request)))
        }
        RequestKind::DeleteAcls(request) => {
            let session = session.clone();
            Box::pin(async move { Some(ResponseKind::DeleteAcls(acls::delete(&broker, &session, request).await)) })
        }
        RequestKind::DescribeClientQuotas(request) => {
            ready(ResponseKind::DescribeClientQuotas(quotas::describe(&broker, session, request)))
        }
        RequestKind::AlterClientQuotas(request) => {
            let session = session.clone();
            Box::pin(
                async move { Some(ResponseKind::AlterClientQuotas(quotas::alter(&broker, &session, request).await)) },
            )
        }
        RequestKind::DescribeUserScramCredentials(request) => {
            ready(ResponseKind::DescribeUserScramCredentials(users::describe(&broker, request)))
        }
        RequestKind::AlterUserScramCredentials(request) => {
            Box::pin(async move { Some(ResponseKind::AlterUserScramCredentials(users::alter(&broker, request).await)) })
        }
        other => {
            // parse_request only lets advertised APIs through; this is a bug, not bad input.
            tracing::error!(?api_key, "no handler for advertised api: {:?}", std::mem::discriminant(&other));
            Box::pin(async { None })
        }
    };
    respond(metered, session.clone(), exchange, response, denied, file_chunks)
}

/// Awaits a handler's response, completes its authorization masks, charges quotas, meters
/// and encodes it.
fn respond(
    broker: Arc<Broker>,
    session: ClientSession,
    exchange: Exchange,
    response: Pin<Box<dyn Future<Output = Option<ResponseKind>> + Send>>,
    denied: authorize::Denied,
    file_chunks: Option<FileChunks>,
) -> ResponseFuture {
    let Exchange { api_key, api_version, correlation_id, arrived, .. } = exchange;
    // Many handlers do their work in `dispatch`, before their future is first polled.
    let timed = broker.quotas.requests_configured();
    let dispatched = if timed { arrived.elapsed() } else { Duration::ZERO };
    Box::pin(async move {
        let mut timed = PollTimed { inner: response, timed, busy: dispatched };
        let body = (&mut timed).await;
        broker.metrics.request_done(api_key as i16, arrived.elapsed());
        let mut body = body?;
        authorize::after(&broker, &session, api_key, denied, &mut body);
        authorize::fill_operations(&broker, &session, exchange.authorized_operations, &mut body);
        charge_quota(&broker, &session, &exchange, &mut body, timed.busy);
        let files = file_chunks.map(|files| std::mem::take(&mut *files.lock())).unwrap_or_default();
        match encode_response(api_key, api_version, correlation_id, &body, files) {
            Ok(chunks) => Some(chunks),
            Err(error) => {
                tracing::error!(?api_key, api_version, %error, "failed to encode response");
                None
            }
        }
    })
}

/// A handler's future, with the time spent polling it (when `timed`) added to the time
/// `dispatch` took: the broker's own time on the request, without the waits for fsync,
/// replication or a long poll. It is what `request_percentage` quotas charge.
struct PollTimed {
    inner: Pin<Box<dyn Future<Output = Option<ResponseKind>> + Send>>,
    timed: bool,
    busy: Duration,
}

impl Future for PollTimed {
    type Output = Option<ResponseKind>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        if !self.timed {
            return self.inner.as_mut().poll(cx);
        }
        let started = std::time::Instant::now();
        let result = self.inner.as_mut().poll(cx);
        self.busy += started.elapsed();
        result
    }
}

/// Charges produce and consumer-fetch bytes and the request's handling time to the
/// client's quotas; over one, the answer carries `throttle_time_ms` and the connection
/// stops reading for that long.
fn charge_quota(
    broker: &Broker,
    session: &ClientSession,
    exchange: &Exchange,
    body: &mut ResponseKind,
    busy: Duration,
) {
    use sluice_security::quota::QuotaKind;
    if !broker.quotas.configured() {
        return;
    }
    let bytes = match body {
        ResponseKind::Produce(_) => Some((QuotaKind::Produce, exchange.produce_bytes)),
        ResponseKind::Fetch(response) if exchange.consumer_fetch => {
            let bytes = response
                .responses
                .iter()
                .flat_map(|t| &t.partitions)
                .map(|p| p.records.as_ref().map_or(0, |r| r.len() as u64))
                .sum();
            Some((QuotaKind::Fetch, bytes))
        }
        _ => None,
    };
    // Brokers' own requests (replica fetches) are exempt from request quotas, as in Kafka.
    let replica_fetch = matches!(body, ResponseKind::Fetch(_)) && !exchange.consumer_fetch;
    let exempt = replica_fetch || *session.principal == *sluice_security::INTER_BROKER_PRINCIPAL;
    let time = (broker.quotas.requests_configured() && !exempt)
        .then(|| (QuotaKind::Request, u64::try_from(busy.as_nanos()).unwrap_or(u64::MAX)));
    let user = session.principal.strip_prefix("User:").unwrap_or(&session.principal);
    let client_id = exchange.client_id.as_deref().unwrap_or("");
    let mut throttle_ms = 0;
    for (kind, amount) in bytes.into_iter().chain(time) {
        let throttle = broker.with_client_quotas(|quotas| broker.quotas.record(quotas, kind, user, client_id, amount));
        if throttle > 0 {
            broker.metrics.throttled(kind);
            throttle_ms = throttle_ms.max(throttle);
        }
    }
    if throttle_ms > 0 {
        if let Some(field) = throttle_time_field(body) {
            *field = i32::try_from(throttle_ms).unwrap_or(i32::MAX);
        }
        session.throttle.extend(broker.quotas.now_ms() + throttle_ms);
    }
}

/// The `throttle_time_ms` of an answer (every API Sluice serves that has one).
fn throttle_time_field(body: &mut ResponseKind) -> Option<&mut i32> {
    macro_rules! field {
        ($($variant:ident),* $(,)?) => {
            match body {
                $(ResponseKind::$variant(response) => Some(&mut response.throttle_time_ms),)*
                _ => None,
            }
        };
    }
    field!(
        Produce,
        Fetch,
        ListOffsets,
        Metadata,
        OffsetCommit,
        OffsetFetch,
        FindCoordinator,
        JoinGroup,
        Heartbeat,
        LeaveGroup,
        SyncGroup,
        DescribeGroups,
        ListGroups,
        ApiVersions,
        CreateTopics,
        DeleteTopics,
        DeleteRecords,
        InitProducerId,
        DescribeAcls,
        CreateAcls,
        DeleteAcls,
        DescribeConfigs,
        AlterConfigs,
        CreatePartitions,
        DeleteGroups,
        IncrementalAlterConfigs,
        AlterPartitionReassignments,
        ListPartitionReassignments,
        OffsetDelete,
        DescribeClientQuotas,
        AlterClientQuotas,
        DescribeUserScramCredentials,
        AlterUserScramCredentials,
        DescribeCluster,
        ConsumerGroupHeartbeat,
        ConsumerGroupDescribe,
        ShareGroupHeartbeat,
        ShareGroupDescribe,
        ShareFetch,
        ShareAcknowledge,
        DescribeShareGroupOffsets,
        AlterShareGroupOffsets,
        DeleteShareGroupOffsets,
        DescribeLogDirs,
        AddPartitionsToTxn,
        AddOffsetsToTxn,
        TxnOffsetCommit,
        EndTxn,
        ListTransactions,
        DescribeTransactions,
        DescribeProducers,
    )
}

fn ready(response: ResponseKind) -> Pin<Box<dyn Future<Output = Option<ResponseKind>> + Send>> {
    Box::pin(std::future::ready(Some(response)))
}

pub(crate) fn str_bytes(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn message(text: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(text.into()))
}
