//! Request handlers, one module per concern. [`dispatch`] runs the synchronous part of a
//! request (for Produce: validating and appending, in arrival order) before returning a
//! future for the rest (waiting for durability or for data).

mod acls;
mod admin;
mod authorize;
mod configs;
mod consumer_groups;
pub(crate) mod envelope;
mod fetch;
mod groups;
mod offsets;
mod produce;
mod quorum;
mod quotas;
mod reassignments;
mod share;
mod topic_partitions;
mod transactions;
mod users;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::{RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use sluice_protocol::{api_versions_response, encode_response, Request, ResponseChunk, Spliced};

use crate::Broker;

pub(crate) use crate::blocking::on_blocking_pool;
pub(crate) use crate::metadata_writes::Failure;
pub(crate) use groups::create_internal_topics_once_formed;

/// The encoded response frame (as chunks for a vectored write), or `None` when the request gets no response (acks=0).
pub(crate) type ResponseFuture = Pin<Box<dyn Future<Output = Option<Vec<ResponseChunk>>> + Send>>;

/// Where a fetch handler leaves the file chunks its response's placeholders stand for.
type SplicedRecords = Arc<parking_lot::Mutex<Vec<Spliced>>>;

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

impl Exchange {
    fn of(request: &Request) -> Exchange {
        let produce_bytes = match &request.body {
            RequestKind::Produce(request) => request
                .topic_data
                .iter()
                .flat_map(|t| &t.partition_data)
                .map(|p| p.records.as_ref().map_or(0, |r| r.len() as u64))
                .sum(),
            _ => 0,
        };
        let consumer_fetch = match &request.body {
            RequestKind::Fetch(request) => request.replica_id.0 < 0 && request.replica_state.replica_id.0 < 0,
            _ => false,
        };
        Exchange {
            api_key: request.api_key,
            api_version: request.api_version,
            correlation_id: request.correlation_id,
            arrived: std::time::Instant::now(),
            client_id: request.client_id.clone(),
            produce_bytes,
            consumer_fetch,
            authorized_operations: authorize::OperationsWanted::of(&request.body),
        }
    }
}

/// Runs one request of an authenticated client: authorization (the rules of
/// `authorize::rule`, by API), the handler ([`route`]), then [`respond`]. The memory the
/// request was charged (connection.rs) is held by the connection until the response is
/// written.
pub(crate) fn dispatch(broker: &Arc<Broker>, request: Request, session: &ClientSession) -> ResponseFuture {
    let exchange = Exchange::of(&request);
    let Request { api_key, api_version, body, client_id, .. } = request;
    let (body, denied) = match authorize::before(broker, session, api_key, body) {
        Ok(checked) => checked,
        Err(refused) => {
            let denied = authorize::Denied::default();
            return respond(broker.clone(), session.clone(), exchange, now(*refused), denied, None);
        }
    };
    let call = Call { broker: broker.clone(), session: session.clone(), api_version, client_id };
    let mut spliced = None;
    let answer = route(&call, body, &mut spliced);
    respond(call.broker, call.session, exchange, answer, denied, spliced)
}

/// Runs one request for a front door of the broker's own (AMQP): authorized as `session`,
/// answered as a `ResponseKind`, not encoded. Not for Fetch, whose records travel as file
/// chunks beside its response.
pub(crate) fn answer_in_process(
    broker: &Arc<Broker>,
    session: &ClientSession,
    api_key: kafka_protocol::messages::ApiKey,
    api_version: i16,
    body: RequestKind,
) -> Pin<Box<dyn Future<Output = Option<ResponseKind>> + Send>> {
    assert!(api_key != kafka_protocol::messages::ApiKey::Fetch, "a fetch's records are file chunks");
    let (body, denied) = match authorize::before(broker, session, api_key, body) {
        Ok(checked) => checked,
        Err(refused) => return now(*refused),
    };
    let call = Call { broker: broker.clone(), session: session.clone(), api_version, client_id: None };
    let answer = route(&call, body, &mut None);
    let (broker, session) = (broker.clone(), session.clone());
    Box::pin(async move {
        let mut body = answer.await?;
        authorize::after(&broker, &session, api_key, denied, &mut body);
        Some(body)
    })
}

/// What a handler may take besides its request; owned, since its future outlives
/// [`dispatch`].
#[derive(Clone)]
struct Call {
    broker: Arc<Broker>,
    session: ClientSession,
    api_version: i16,
    client_id: Option<StrBytes>,
}

/// A handler's answer to come: `None` when the request gets no response (acks=0).
type Answer = Pin<Box<dyn Future<Output = Option<ResponseKind>> + Send>>;

/// A handler that answers at once.
fn now(response: ResponseKind) -> Answer {
    Box::pin(std::future::ready(Some(response)))
}

/// A handler that did its synchronous part already and returned the rest as `pending`.
fn pending<R: Send + 'static>(
    pending: impl Future<Output = R> + Send + 'static,
    kind: fn(R) -> ResponseKind,
) -> Answer {
    Box::pin(async move { Some(kind(pending.await)) })
}

/// An async handler run on the call's own broker and session (bound to the two patterns),
/// its answer as `ResponseKind::$kind`.
macro_rules! later {
    ($call:expr, $kind:ident, |$broker:pat_param, $session:pat_param| $handler:expr) => {{
        let Call { broker: $broker, session: $session, .. } = $call.clone();
        Box::pin(async move { Some(ResponseKind::$kind($handler.await)) }) as Answer
    }};
}

/// The handler of each request kind: one row per API (authorization is declared per API in
/// `authorize::rule`). A fetch leaves what its response's placeholders stand for in `spliced`.
fn route(call: &Call, body: RequestKind, spliced: &mut Option<SplicedRecords>) -> Answer {
    use RequestKind as Rq;
    use ResponseKind as Rs;
    let (broker, session, version) = (&call.broker, &call.session, call.api_version);
    let (client_id, listener) = (call.client_id.clone(), session.listener);
    match body {
        Rq::ApiVersions(_) => now(Rs::ApiVersions(api_versions_response(0))),
        Rq::Produce(r) => {
            let appended = produce::append(broker, r, session);
            Box::pin(async move { appended.await.map(Rs::Produce) })
        }
        Rq::Fetch(r) => fetch_answer(call, r, spliced.insert(SplicedRecords::default()).clone()),
        Rq::ListOffsets(r) => later!(call, ListOffsets, |b, _| offsets::list_offsets(&b, r, version)),
        Rq::DeleteRecords(r) => later!(call, DeleteRecords, |b, _| offsets::delete_records(&b, r)),
        Rq::Metadata(r) if admin::may_create_logs(broker, &r) => {
            let broker = broker.clone();
            Box::pin(on_blocking_pool(move || Rs::Metadata(admin::metadata(&broker, r, listener))))
        }
        Rq::Metadata(r) => now(Rs::Metadata(admin::metadata(broker, r, listener))),
        Rq::CreateTopics(r) => later!(call, CreateTopics, |b, _| admin::create_topics(b, r, version)),
        Rq::DeleteTopics(r) => later!(call, DeleteTopics, |b, _| admin::delete_topics(b, r)),
        Rq::CreatePartitions(r) => later!(call, CreatePartitions, |b, _| admin::create_partitions(b, r)),
        Rq::AlterPartitionReassignments(r) => {
            later!(call, AlterPartitionReassignments, |b, _| reassignments::alter(b, r))
        }
        Rq::DescribeQuorum(r) => later!(call, DescribeQuorum, |b, _| quorum::describe(b, r)),
        Rq::AddRaftVoter(r) => later!(call, AddRaftVoter, |b, _| quorum::add_voter(b, r)),
        Rq::RemoveRaftVoter(r) => later!(call, RemoveRaftVoter, |b, _| quorum::remove_voter(b, r)),
        Rq::ListPartitionReassignments(r) => now(Rs::ListPartitionReassignments(reassignments::list(broker, r))),
        Rq::DescribeLogDirs(r) => now(Rs::DescribeLogDirs(admin::describe_log_dirs(broker, r))),
        Rq::DescribeCluster(r) => now(Rs::DescribeCluster(admin::describe_cluster(broker, r, listener))),
        Rq::DescribeTopicPartitions(r) => {
            now(Rs::DescribeTopicPartitions(topic_partitions::describe(broker, session, r)))
        }
        Rq::InitProducerId(r) if r.transactional_id.is_some() => {
            later!(call, InitProducerId, |b, s| transactions::init_producer_id(&b, &s, r))
        }
        Rq::InitProducerId(r) => now(Rs::InitProducerId(admin::init_producer_id(broker, r))),
        Rq::AddPartitionsToTxn(r) => later!(call, AddPartitionsToTxn, |b, s| transactions::add_partitions(&b, &s, r)),
        Rq::AddOffsetsToTxn(r) => later!(call, AddOffsetsToTxn, |b, s| transactions::add_offsets(&b, &s, r)),
        Rq::TxnOffsetCommit(r) => {
            later!(call, TxnOffsetCommit, |b, s| transactions::txn_offset_commit(&b, &s, r, version))
        }
        Rq::EndTxn(r) => later!(call, EndTxn, |b, s| transactions::end(&b, &s, r)),
        Rq::WriteTxnMarkers(r) => later!(call, WriteTxnMarkers, |b, _| transactions::write_markers(&b, r)),
        Rq::Envelope(r) => envelope::answer(call, r),
        Rq::ListTransactions(r) => now(Rs::ListTransactions(transactions::list(broker, session, r))),
        Rq::DescribeTransactions(r) => now(Rs::DescribeTransactions(transactions::describe(broker, session, r))),
        Rq::DescribeProducers(r) => now(Rs::DescribeProducers(transactions::describe_producers(broker, session, r))),
        Rq::DescribeConfigs(r) => now(Rs::DescribeConfigs(configs::describe(broker, r, version))),
        Rq::AlterConfigs(r) => later!(call, AlterConfigs, |b, _| configs::alter(&b, r)),
        Rq::IncrementalAlterConfigs(r) => {
            later!(call, IncrementalAlterConfigs, |b, _| configs::incremental_alter(&b, r))
        }
        Rq::FindCoordinator(r) => now(Rs::FindCoordinator(groups::find_coordinator(broker, r, version, listener))),
        Rq::JoinGroup(r) => {
            let host = client_host(&session.peer);
            pending(groups::join_group(broker, r, version, client_id, host), Rs::JoinGroup)
        }
        Rq::SyncGroup(r) => pending(groups::sync_group(broker, r), Rs::SyncGroup),
        Rq::Heartbeat(r) => now(Rs::Heartbeat(groups::heartbeat(broker, r))),
        Rq::LeaveGroup(r) => now(Rs::LeaveGroup(groups::leave_group(broker, r, version))),
        Rq::OffsetCommit(r) => pending(groups::offset_commit(broker, r, version), Rs::OffsetCommit),
        Rq::OffsetFetch(r) => now(Rs::OffsetFetch(groups::offset_fetch(broker, r, version))),
        Rq::OffsetDelete(r) => pending(groups::offset_delete(broker, r), Rs::OffsetDelete),
        Rq::ListGroups(r) => now(Rs::ListGroups(groups::list_groups(broker, r))),
        Rq::DescribeGroups(r) => now(Rs::DescribeGroups(groups::describe_groups(broker, r))),
        Rq::DeleteGroups(r) => pending(groups::delete_groups(broker, r), Rs::DeleteGroups),
        Rq::ConsumerGroupHeartbeat(r) => {
            let host = client_host(&session.peer);
            now(Rs::ConsumerGroupHeartbeat(consumer_groups::heartbeat(broker, r, version, client_id, host)))
        }
        Rq::ConsumerGroupDescribe(r) => now(Rs::ConsumerGroupDescribe(consumer_groups::describe(broker, r, version))),
        Rq::ShareGroupHeartbeat(r) => {
            now(Rs::ShareGroupHeartbeat(share::heartbeat(broker, r, client_id, client_host(&session.peer))))
        }
        Rq::ShareGroupDescribe(r) => now(Rs::ShareGroupDescribe(share::describe(broker, r))),
        Rq::ShareFetch(r) => later!(call, ShareFetch, |b, s| share::fetch(&b, &s, r)),
        Rq::ShareAcknowledge(r) => later!(call, ShareAcknowledge, |b, _| share::acknowledge_request(&b, r)),
        Rq::DescribeShareGroupOffsets(r) => {
            later!(call, DescribeShareGroupOffsets, |b, _| share::describe_offsets(&b, r))
        }
        Rq::AlterShareGroupOffsets(r) => later!(call, AlterShareGroupOffsets, |b, _| share::alter_offsets(&b, r)),
        Rq::DeleteShareGroupOffsets(r) => later!(call, DeleteShareGroupOffsets, |b, _| share::delete_offsets(&b, r)),
        Rq::InitializeShareGroupState(r) => {
            later!(call, InitializeShareGroupState, |b, s| share::initialize_state(&b, &s, r))
        }
        Rq::ReadShareGroupState(r) => later!(call, ReadShareGroupState, |b, s| share::read_state(&b, &s, r)),
        Rq::WriteShareGroupState(r) => later!(call, WriteShareGroupState, |b, s| share::write_state(&b, &s, r)),
        Rq::DeleteShareGroupState(r) => later!(call, DeleteShareGroupState, |b, s| share::delete_state(&b, &s, r)),
        Rq::ReadShareGroupStateSummary(r) => {
            now(Rs::ReadShareGroupStateSummary(share::read_state_summary(broker, session, r)))
        }
        Rq::CreateAcls(r) => later!(call, CreateAcls, |b, s| acls::create(&b, &s, r)),
        Rq::DescribeAcls(r) => now(Rs::DescribeAcls(acls::describe(broker, session, r))),
        Rq::DeleteAcls(r) => later!(call, DeleteAcls, |b, s| acls::delete(&b, &s, r)),
        Rq::DescribeClientQuotas(r) => now(Rs::DescribeClientQuotas(quotas::describe(broker, session, r))),
        Rq::AlterClientQuotas(r) => later!(call, AlterClientQuotas, |b, s| quotas::alter(&b, &s, r)),
        Rq::DescribeUserScramCredentials(r) => now(Rs::DescribeUserScramCredentials(users::describe(broker, r))),
        Rq::AlterUserScramCredentials(r) => later!(call, AlterUserScramCredentials, |b, _| users::alter(&b, r)),
        other => {
            // parse_request only lets advertised APIs through; this is a bug, not bad input.
            tracing::error!("no handler for an advertised api: {:?}", std::mem::discriminant(&other));
            Box::pin(async { None })
        }
    }
}

/// A Fetch's answer; what its response's placeholders stand for goes to `spliced`.
fn fetch_answer(call: &Call, request: kafka_protocol::messages::FetchRequest, spliced: SplicedRecords) -> Answer {
    let Call { broker, session, api_version, .. } = call.clone();
    Box::pin(async move {
        let (response, records) = fetch::handle(&broker, request, api_version, &session).await;
        *spliced.lock() = records;
        Some(ResponseKind::Fetch(response))
    })
}

/// Awaits a handler's response, completes its authorization masks, charges quotas, meters
/// and encodes it.
fn respond(
    broker: Arc<Broker>,
    session: ClientSession,
    exchange: Exchange,
    response: Pin<Box<dyn Future<Output = Option<ResponseKind>> + Send>>,
    denied: authorize::Denied,
    spliced: Option<SplicedRecords>,
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
        let spliced = spliced.map(|spliced| std::mem::take(&mut *spliced.lock())).unwrap_or_default();
        match encode_response(api_key, api_version, correlation_id, &body, spliced) {
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
        DescribeTopicPartitions,
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

pub(crate) fn str_bytes(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn message(text: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(text.into()))
}
