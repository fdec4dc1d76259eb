//! The share-group APIs (KIP-932) over `sluice_coordinator::share`: ShareGroupHeartbeat,
//! ShareGroupDescribe, ShareFetch (acquire records, with acknowledgements piggybacked) and
//! ShareAcknowledge.
//!
//! A ShareFetch reads each session partition from the share-partition's next offset (the
//! first record available again, else the first never handed out), acquires what it read
//! for the member, and answers the stored batches holding the acquired offsets with their
//! ranges and delivery counts. With nothing acquired it long-polls (`max_wait_ms`) on the
//! partitions' high watermarks and on released records. Reads run on the blocking pool:
//! never a disk wait on an async thread.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::read_share_group_state_response as read_state_response;
use kafka_protocol::messages::read_share_group_state_summary_response as summary_response;
use kafka_protocol::messages::share_acknowledge_response::{self as ack_response, ShareAcknowledgeTopicResponse};
use kafka_protocol::messages::share_fetch_response::{AcquiredRecords, PartitionData, ShareFetchableTopicResponse};
use kafka_protocol::messages::share_group_describe_response::{self as describe_response, DescribedGroup};
use kafka_protocol::messages::share_group_heartbeat_response::{self as heartbeat_response};
use kafka_protocol::messages::write_share_group_state_response as write_state_response;
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse, DeleteShareGroupStateRequest, DeleteShareGroupStateResponse,
    InitializeShareGroupStateRequest, InitializeShareGroupStateResponse, ReadShareGroupStateRequest,
    ReadShareGroupStateResponse, ReadShareGroupStateSummaryRequest, ReadShareGroupStateSummaryResponse,
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest, ShareFetchResponse,
    ShareGroupDescribeRequest, ShareGroupDescribeResponse, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse,
    TopicName, WriteShareGroupStateRequest, WriteShareGroupStateResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_security::acl;
use sluice_storage::{ReadLimit, ReadMode};
use tokio::time::Instant;
use uuid::Uuid;

use super::{str_bytes, ClientSession};
use crate::Broker;
use sluice_config::FETCH_WAIT_MS_MAX;
use sluice_coordinator::share::store::AdminChange;
use sluice_coordinator::share::{batch_spans, PartitionKey, RecordLimit, ShareSessionStep};
use sluice_protocol::{share_fetch_options, ShareAcquireMode, ShareFetchOptions};

/// Bytes read per share-partition per fetch pass at most.
const SHARE_PARTITION_READ_BYTES_MAX: usize = 1024 * 1024;

pub(super) fn heartbeat(
    broker: &Arc<Broker>,
    request: ShareGroupHeartbeatRequest,
    client_id: Option<StrBytes>,
    client_host: String,
) -> ShareGroupHeartbeatResponse {
    let mut response = ShareGroupHeartbeatResponse::default();
    if let Err(error) = broker.groups.serving(request.group_id.as_str()) {
        response.error_code = error.response_error().code();
        response.error_message = Some(str_bytes("this broker is not the share group's coordinator"));
        return response;
    }
    let catalog = broker.topics.catalog();
    let subscribed = request.subscribed_topic_names.map(|names| names.iter().map(|n| n.to_string()).collect());
    let answer = broker.shares.heartbeat(
        request.group_id.as_str(),
        request.member_id.as_str(),
        request.member_epoch,
        request.rack_id.map(|r| r.to_string()),
        subscribed,
        (client_id.as_deref().unwrap_or(""), &client_host),
        &catalog,
        sluice_storage::now_ms(),
    );
    match answer {
        Ok(answer) => {
            if let Some(topics) = answer.unregistered {
                let (broker, group_id) = (broker.clone(), request.group_id.to_string());
                tokio::spawn(async move {
                    let _ = broker.shares.register_group(&*broker, &group_id, Some(topics)).await;
                });
            }
            response.member_id = Some(request.member_id.clone());
            response.member_epoch = answer.member_epoch;
            response.heartbeat_interval_ms = answer.heartbeat_interval_ms;
            response.assignment = answer.assignment.map(|assignment| {
                let mut wire = heartbeat_response::Assignment::default();
                wire.topic_partitions = assignment
                    .into_iter()
                    .filter_map(|(topic, partitions)| {
                        let (topic_id, _) = catalog.get(&topic)?;
                        let mut entry = heartbeat_response::TopicPartitions::default();
                        entry.topic_id = topic_id;
                        entry.partitions = partitions;
                        Some(entry)
                    })
                    .collect();
                wire
            });
        }
        Err((error, message)) => {
            response.error_code = error.code();
            response.error_message = Some(str_bytes(&message));
        }
    }
    response
}

pub(super) fn describe(broker: &Arc<Broker>, request: ShareGroupDescribeRequest) -> ShareGroupDescribeResponse {
    let catalog = broker.topics.catalog();
    let mut response = ShareGroupDescribeResponse::default();
    for group_id in request.group_ids {
        let mut described = DescribedGroup::default();
        described.group_id = group_id.clone();
        described.authorized_operations = i32::MIN;
        if let Err(error) = broker.groups.serving(group_id.as_str()) {
            described.error_code = error.response_error().code();
            described.error_message = Some(str_bytes("this broker is not the share group's coordinator"));
            response.groups.push(described);
            continue;
        }
        match broker.shares.describe(group_id.as_str()) {
            None => {
                described.error_code = ResponseError::GroupIdNotFound.code();
                described.error_message = Some(str_bytes(&format!("share group {} does not exist", group_id.as_str())));
                described.group_state = str_bytes("Dead");
            }
            Some(group) => {
                described.group_state = str_bytes(if group.members.is_empty() { "Empty" } else { "Stable" });
                described.group_epoch = group.epoch;
                described.assignment_epoch = group.epoch;
                described.assignor_name = str_bytes("simple");
                described.members = group
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut member = describe_response::Member::default();
                        member.member_id = str_bytes(&m.member_id);
                        member.rack_id = m.rack.as_deref().map(str_bytes);
                        member.member_epoch = m.member_epoch;
                        member.client_id = str_bytes(&m.client_id);
                        member.client_host = str_bytes(&m.client_host);
                        member.subscribed_topic_names = m.subscribed.iter().map(|t| TopicName(str_bytes(t))).collect();
                        member.assignment.topic_partitions = m
                            .assignment
                            .into_iter()
                            .filter_map(|(topic, partitions)| {
                                let (topic_id, _) = catalog.get(&topic)?;
                                let mut entry = describe_response::TopicPartitions::default();
                                entry.topic_id = topic_id;
                                entry.topic_name = TopicName(str_bytes(&topic));
                                entry.partitions = partitions;
                                Some(entry)
                            })
                            .collect();
                        member
                    })
                    .collect();
            }
        }
        response.groups.push(described);
    }
    response
}

/// Acknowledgement batches as the wire carries them: (first, last, types).
type AckBatches = Vec<(i64, i64, Vec<i8>)>;

/// Applies one partition's acknowledgements and waits until they are durable. `renewing`:
/// the request announced RENEW acknowledgements (KIP-1222's `IsRenewAck`).
async fn acknowledge(
    broker: &Broker,
    (group_id, member_id): (&str, &str),
    (topic, partition): (Option<&str>, i32),
    batches: &AckBatches,
    renewing: bool,
) -> Result<(), ResponseError> {
    let Some(topic) = topic else { return Err(ResponseError::UnknownTopicId) };
    // As Kafka: a partition the topic does not have is unknown, not a record-state error.
    if !broker.topics.catalog().get(topic).is_some_and(|(_, count)| (0..count).contains(&partition)) {
        return Err(ResponseError::UnknownTopicOrPartition);
    }
    if sluice_coordinator::share::leader_epoch(broker, topic, partition).is_none() {
        return Err(ResponseError::NotLeaderOrFollower);
    }
    let now_ms = sluice_storage::now_ms();
    let write = broker.shares.acknowledge(group_id, member_id, (topic, partition), batches, renewing, now_ms)?;
    broker.shares.persist(broker, write).await.map_err(|error| match error {
        ResponseError::FencedLeaderEpoch => ResponseError::NotLeaderOrFollower,
        other => other,
    })
}

/// The group and member ids of a ShareFetch or ShareAcknowledge; `None` (Kafka's
/// INVALID_REQUEST) when either is missing or the member id is empty.
fn group_and_member(group_id: Option<&StrBytes>, member_id: Option<&StrBytes>) -> Option<(String, String)> {
    match (group_id, member_id) {
        (Some(group_id), Some(member_id)) if !member_id.is_empty() => {
            Some((group_id.to_string(), member_id.to_string()))
        }
        _ => None,
    }
}

/// A final request (epoch -1) of a member with no share session is refused before any of
/// its acknowledgements is applied, as Kafka does (SHARE_SESSION_NOT_FOUND).
fn final_request_has_session(
    broker: &Broker,
    closing: bool,
    group_id: &str,
    member_id: &str,
) -> Result<(), ResponseError> {
    if closing && !broker.shares.has_session(group_id, member_id) {
        return Err(ResponseError::ShareSessionNotFound);
    }
    Ok(())
}

/// What one share-partition answered in a fetch pass.
#[derive(Default)]
struct Fetched {
    records: Bytes,
    acquired: Vec<AcquiredRecords>,
    error: Option<ResponseError>,
}

/// What one share-partition answers in a ShareFetch: what was fetched, and the code of its
/// acknowledgements when it had some.
type Answers = BTreeMap<(Uuid, i32), (Fetched, Option<i16>)>;

/// The catalog of topics a ShareFetch resolves its topic ids in.
type Catalog = sluice_meta::topics::TopicCatalog;

pub(super) async fn fetch(
    broker: &Arc<Broker>,
    client: &ClientSession,
    request: ShareFetchRequest,
) -> ShareFetchResponse {
    let mut response = ShareFetchResponse::default();
    let Some((group_id, member_id)) = group_and_member(request.group_id.as_deref(), request.member_id.as_ref()) else {
        response.error_code = ResponseError::InvalidRequest.code();
        return response;
    };
    let options = match renewal_fetch_checked(&request) {
        Ok(options) => options,
        Err(message) => {
            response.error_code = ResponseError::InvalidRequest.code();
            response.error_message = Some(str_bytes(&message));
            return response;
        }
    };
    let catalog = broker.topics.catalog();
    let acks = acknowledgements(&request);
    if request.share_session_epoch == 0 && !acks.is_empty() {
        response.error_code = ResponseError::InvalidRequest.code();
        return response;
    }
    // A final request (-1) closes the session after its acknowledgements.
    let closing = request.share_session_epoch == -1;
    if let Err(error) = final_request_has_session(broker, closing, &group_id, &member_id) {
        response.error_code = error.code();
        return response;
    }
    let fetching = match session_partitions(broker, &request, &group_id, &member_id, closing) {
        Ok(fetching) => fetching,
        Err(error) => {
            response.error_code = error.code();
            return response;
        }
    };
    let full = request.share_session_epoch == 0;
    response.acquisition_lock_timeout_ms = broker.shares.group_lock_duration_ms(&group_id) as i32;
    let mut answers = Answers::new();
    for ((topic_id, partition), batches) in &acks {
        let topic = catalog.name_for_id(topic_id);
        let member = (group_id.as_str(), member_id.as_str());
        let code = match acknowledge(broker, member, (topic, *partition), batches, options.is_renew_ack).await {
            Ok(()) => 0,
            Err(error) => error.code(),
        };
        answers.entry((*topic_id, *partition)).or_default().1 = Some(code);
    }
    if closing {
        if let Err(error) = broker.shares.session_step(&group_id, &member_id, -1, &[], &[], true) {
            response.error_code = error.code();
        }
    }
    // A renewal fetches nothing: the member is still working on what it holds.
    if !fetching.is_empty() && !options.is_renew_ack {
        let member = (group_id.as_str(), member_id.as_str());
        let exact = options.acquire_mode == ShareAcquireMode::RecordLimit;
        acquire_records(broker, client, &catalog, member, (&request, exact), &fetching, &mut answers).await;
        if full {
            for key in &fetching {
                answers.entry(*key).or_default();
            }
        }
    }
    response.responses = topic_responses(answers, full);
    count_fetched_bytes(broker, &catalog, &response);
    response
}

/// A ShareFetch's v2 options, checked as Kafka does: a request carrying RENEW
/// acknowledgements must ask for nothing to be fetched (zero wait, bytes and records).
fn renewal_fetch_checked(request: &ShareFetchRequest) -> Result<ShareFetchOptions, String> {
    let options = share_fetch_options(request)?;
    let asks_to_fetch =
        request.max_wait_ms != 0 || request.min_bytes != 0 || request.max_bytes != 0 || request.max_records != 0;
    if options.is_renew_ack && asks_to_fetch {
        return Err("maxWaitMs, minBytes, maxBytes and maxRecords must be 0 if isRenewAck is true".into());
    }
    Ok(options)
}

/// The acknowledgement batches of each partition of a ShareFetch.
fn acknowledgements(request: &ShareFetchRequest) -> Vec<((Uuid, i32), AckBatches)> {
    request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().filter(|p| !p.acknowledgement_batches.is_empty()).map(move |p| {
                let batches = p
                    .acknowledgement_batches
                    .iter()
                    .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone()))
                    .collect();
                ((t.topic_id, p.partition_index), batches)
            })
        })
        .collect()
}

/// The partitions the member's share session fetches after this request's additions and
/// removals (none when the request closes it).
fn session_partitions(
    broker: &Broker,
    request: &ShareFetchRequest,
    group_id: &str,
    member_id: &str,
    closing: bool,
) -> Result<Vec<(Uuid, i32)>, ResponseError> {
    if closing {
        return Ok(Vec::new());
    }
    let added: Vec<(Uuid, i32)> =
        request.topics.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, p.partition_index))).collect();
    let forgotten: Vec<(Uuid, i32)> =
        request.forgotten_topics_data.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p))).collect();
    let epoch = request.share_session_epoch;
    match broker.shares.session_step(group_id, member_id, epoch, &added, &forgotten, true) {
        Ok(ShareSessionStep::Open(partitions)) => Ok(partitions),
        Ok(ShareSessionStep::Closed) => Ok(Vec::new()),
        Err(error) => {
            tracing::debug!(member = %member_id, epoch, ?error, "share fetch session step refused");
            Err(error)
        }
    }
}

/// Acquires records of the `fetching` partitions for `member` (group id, member id) into
/// `answers`: at once when any partition has some, else when records arrive or are released,
/// or at the request's deadline.
async fn acquire_records(
    broker: &Arc<Broker>,
    client: &ClientSession,
    catalog: &Catalog,
    member: (&str, &str),
    (request, exact): (&ShareFetchRequest, bool),
    fetching: &[(Uuid, i32)],
    answers: &mut Answers,
) {
    let deadline = Instant::now() + Duration::from_millis(request.max_wait_ms.clamp(0, FETCH_WAIT_MS_MAX) as u64);
    let max_records = if request.max_records <= 0 { usize::MAX } else { request.max_records as usize };
    let max_records = RecordLimit { records: max_records, exact };
    let max_bytes = if request.max_bytes <= 0 { i32::MAX as usize } else { request.max_bytes as usize };
    // A new session's first pass loads each share-partition's state from the store.
    let mut reload = request.share_session_epoch == 0;
    loop {
        let released = broker.shares.released();
        let mut receivers = Vec::new();
        let mut targets = Vec::new();
        for &(topic_id, partition) in fetching {
            let target = share_target(broker, client, catalog, member.0, (topic_id, partition), reload).await;
            if let Ok((log, _)) = &target.2 {
                receivers.push(log.subscribe());
            }
            targets.push(target);
        }
        reload = false;
        let pass = {
            let broker = broker.clone();
            let (group_id, member_id) = (member.0.to_string(), member.1.to_string());
            tokio::task::spawn_blocking(move || {
                acquire_pass(&broker, (&group_id, &member_id), targets, max_records, max_bytes)
            })
            .await
            .expect("share fetch pass panicked")
        };
        let acquired_any = pass.iter().any(|(_, fetched)| !fetched.acquired.is_empty());
        let errors = pass.iter().any(|(_, fetched)| fetched.error.is_some());
        if acquired_any || errors || Instant::now() >= deadline || receivers.is_empty() {
            for (key, fetched) in pass {
                answers.entry(key).or_default().0 = fetched;
            }
            return;
        }
        let any_changed = futures::future::select_all(receivers.iter_mut().map(|r| Box::pin(r.changed())));
        tokio::select! {
            _ = any_changed => {}
            () = released => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// The log of a fetched share-partition here with its leader epoch, its share-partition
/// state loaded (`reload`: from the store), or why it cannot be fetched.
async fn share_target(
    broker: &Arc<Broker>,
    client: &ClientSession,
    catalog: &Catalog,
    group_id: &str,
    (topic_id, partition): (Uuid, i32),
    reload: bool,
) -> Target {
    let name = catalog.name_for_id(&topic_id).map(str::to_string);
    let log = match &name {
        None => Err(ResponseError::UnknownTopicId),
        Some(name) if !broker.authorized(client, acl::OP_READ, acl::RESOURCE_TOPIC, name) => {
            Err(ResponseError::TopicAuthorizationFailed)
        }
        Some(name) => {
            match (
                broker.partition(name, partition),
                sluice_coordinator::share::leader_epoch(&**broker, name, partition),
            ) {
                (Some(log), Some(epoch)) => Ok((log, epoch)),
                _ if catalog.get(name).is_some_and(|(_, count)| partition < count) => {
                    Err(ResponseError::NotLeaderOrFollower)
                }
                _ => Err(ResponseError::UnknownTopicOrPartition),
            }
        }
    };
    if let (Ok((log, epoch)), Some(name)) = (&log, &name) {
        let offsets = log.offsets();
        let key = (group_id.to_string(), name.clone(), partition);
        let bounds = (offsets.log_start_offset, offsets.high_watermark);
        match broker.shares.ensure_loaded(&**broker, &key, topic_id, *epoch, bounds, reload).await {
            Ok(()) => {}
            Err(ResponseError::FencedLeaderEpoch) => {
                return ((topic_id, partition), name.clone().into(), Err(ResponseError::NotLeaderOrFollower))
            }
            // The state store is moving (a failover): nothing to hand out from this
            // partition until it answers.
            Err(error) => tracing::debug!(?error, topic = %name, partition, "share-partition state not available yet"),
        }
    }
    ((topic_id, partition), name, log)
}

/// The answers by topic; an incremental fetch leaves out the partitions with nothing to say.
fn topic_responses(answers: Answers, full: bool) -> Vec<ShareFetchableTopicResponse> {
    let mut by_topic: BTreeMap<Uuid, Vec<PartitionData>> = BTreeMap::new();
    for ((topic_id, partition), (fetched, ack_code)) in answers {
        if !full && fetched.acquired.is_empty() && fetched.error.is_none() && ack_code.is_none() {
            continue;
        }
        let mut data = PartitionData::default();
        data.partition_index = partition;
        data.error_code = fetched.error.map_or(0, |e| e.code());
        data.acknowledge_error_code = ack_code.unwrap_or(0);
        data.current_leader.leader_id = -1;
        data.current_leader.leader_epoch = -1;
        data.records = Some(fetched.records);
        data.acquired_records = fetched.acquired;
        by_topic.entry(topic_id).or_default().push(data);
    }
    by_topic
        .into_iter()
        .map(|(topic_id, partitions)| {
            let mut topic = ShareFetchableTopicResponse::default();
            topic.topic_id = topic_id;
            topic.partitions = partitions;
            topic
        })
        .collect()
}

type Target = ((Uuid, i32), Option<String>, Result<(Arc<sluice_storage::Partition>, i32), ResponseError>);

/// One pass over the session's partitions (on the blocking pool): read from each
/// share-partition's next offset and acquire what was read, within the request's record
/// and byte budgets.
fn acquire_pass(
    broker: &Broker,
    (group_id, member_id): (&str, &str),
    targets: Vec<Target>,
    limit: RecordLimit,
    max_bytes: usize,
) -> Vec<((Uuid, i32), Fetched)> {
    let mut records_left = limit.records;
    let mut bytes_left = max_bytes;
    let mut answers = Vec::with_capacity(targets.len());
    let now_ms = sluice_storage::now_ms();
    for (key, name, log) in targets {
        let (name, log, leader_epoch) = match (name, log) {
            (Some(name), Ok((log, leader_epoch))) => (name, log, leader_epoch),
            (_, Err(error)) => {
                answers.push((key, Fetched { error: Some(error), ..Fetched::default() }));
                continue;
            }
            (None, Ok(_)) => unreachable!("a log is found only by name"),
        };
        if records_left == 0 || bytes_left == 0 {
            answers.push((key, Fetched::default()));
            continue;
        }
        let offsets = log.offsets();
        let share_key = (group_id.to_string(), name, key.1);
        let plan = broker.shares.plan_fetch(&share_key, member_id, leader_epoch, offsets.log_start_offset);
        let Some(plan) = plan else {
            answers.push((key, Fetched::default()));
            continue;
        };
        if plan.offset >= offsets.high_watermark {
            answers.push((key, Fetched::default()));
            continue;
        }
        let budget = bytes_left.min(SHARE_PARTITION_READ_BYTES_MAX);
        let read = log.read_until(plan.offset, budget, true, ReadLimit::HighWatermark, ReadMode::MayBlock);
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::debug!(%error, "share fetch read failed");
                answers.push((key, Fetched { error: Some(ResponseError::UnknownServerError), ..Fetched::default() }));
                continue;
            }
        };
        let spans = batch_spans(&bytes);
        let batches: Vec<_> = spans.iter().map(|(span, _)| *span).collect();
        let left = RecordLimit { records: records_left, ..limit };
        let (ranges, used) = broker.shares.acquire(&share_key, member_id, &batches, left, now_ms);
        let acquired: usize = ranges.iter().map(|r| (r.last_offset - r.first_offset + 1) as usize).sum();
        records_left = records_left.saturating_sub(acquired);
        let records = match (used.first(), used.last()) {
            (Some(&first), Some(&last)) => bytes.slice(spans[first].1.start..spans[last].1.end),
            _ => Bytes::new(),
        };
        bytes_left = bytes_left.saturating_sub(records.len());
        let acquired = ranges
            .into_iter()
            .map(|r| {
                let mut wire = AcquiredRecords::default();
                wire.first_offset = r.first_offset;
                wire.last_offset = r.last_offset;
                wire.delivery_count = r.delivery_count;
                wire
            })
            .collect();
        answers.push((key, Fetched { records, acquired, error: None }));
    }
    answers
}

fn count_fetched_bytes(broker: &Broker, catalog: &sluice_meta::topics::TopicCatalog, response: &ShareFetchResponse) {
    for topic in &response.responses {
        let Some(name) = catalog.name_for_id(&topic.topic_id) else { continue };
        let bytes: usize = topic.partitions.iter().map(|p| p.records.as_ref().map_or(0, Bytes::len)).sum();
        if bytes > 0 {
            broker.metrics.fetched(name, bytes as u64);
        }
    }
}

pub(super) async fn acknowledge_request(
    broker: &Arc<Broker>,
    request: ShareAcknowledgeRequest,
) -> ShareAcknowledgeResponse {
    if let Some(count) = sluice_protocol::discard_ready_asked(&request) {
        return discard_ready(broker, request, count).await;
    }
    let mut response = ShareAcknowledgeResponse::default();
    let Some((group_id, member_id)) = group_and_member(request.group_id.as_deref(), request.member_id.as_ref()) else {
        response.error_code = ResponseError::InvalidRequest.code();
        return response;
    };
    let lock_duration_ms = broker.shares.group_lock_duration_ms(&group_id) as i32;
    sluice_protocol::set_acknowledge_lock_timeout_ms(&mut response, lock_duration_ms);
    let renewing = sluice_protocol::share_acknowledge_is_renew(&request);
    let catalog = broker.topics.catalog();
    // Acknowledgements first: a final request (-1) closes the session after them.
    let closing = request.share_session_epoch == -1;
    if let Err(error) = final_request_has_session(broker, closing, &group_id, &member_id) {
        response.error_code = error.code();
        return response;
    }
    let epoch = if closing { -1 } else { request.share_session_epoch };
    if !closing {
        if let Err(error) = broker.shares.session_step(&group_id, &member_id, epoch, &[], &[], false) {
            tracing::debug!(member = %member_id, epoch, ?error, "share acknowledge session step refused");
            response.error_code = error.code();
            return response;
        }
    }
    for topic in &request.topics {
        let name = catalog.name_for_id(&topic.topic_id);
        let mut partitions = Vec::new();
        for partition in &topic.partitions {
            let batches: AckBatches = partition
                .acknowledgement_batches
                .iter()
                .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone()))
                .collect();
            let member = (group_id.as_str(), member_id.as_str());
            let result = acknowledge(broker, member, (name, partition.partition_index), &batches, renewing).await;
            let mut data = ack_response::PartitionData::default();
            data.partition_index = partition.partition_index;
            data.error_code = result.err().map_or(0, |e| e.code());
            data.current_leader.leader_id = -1;
            data.current_leader.leader_epoch = -1;
            partitions.push(data);
        }
        let mut answer = ShareAcknowledgeTopicResponse::default();
        answer.topic_id = topic.topic_id;
        answer.partitions = partitions;
        response.responses.push(answer);
    }
    if closing {
        if let Err(error) = broker.shares.session_step(&group_id, &member_id, -1, &[], &[], false) {
            response.error_code = error.code();
        }
    }
    response
}

/// DescribeShareGroupOffsets (`kafka-share-groups --describe`), at the group's
/// coordinator: each share-partition's start offset (Kafka's SPSO) from the state store,
/// -1 for a partition the group never fetched. Without topics: every partition of the
/// topics the group consumes.
pub(super) async fn describe_offsets(
    broker: &Arc<Broker>,
    request: kafka_protocol::messages::DescribeShareGroupOffsetsRequest,
) -> kafka_protocol::messages::DescribeShareGroupOffsetsResponse {
    use kafka_protocol::messages::describe_share_group_offsets_response::{
        DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
        DescribeShareGroupOffsetsResponseTopic,
    };
    if sluice_protocol::asks_for_queue_depth(&request) {
        return queue_depths(broker, request).await;
    }
    let catalog = broker.topics.catalog();
    let mut response = kafka_protocol::messages::DescribeShareGroupOffsetsResponse::default();
    for group in request.groups {
        let group_id = group.group_id.to_string();
        let mut answer = DescribeShareGroupOffsetsResponseGroup::default();
        answer.group_id = group.group_id;
        if let Err(error) = broker.groups.serving(&group_id) {
            answer.error_code = error.response_error().code();
            answer.error_message = Some(str_bytes("this broker is not the share group's coordinator"));
            response.groups.push(answer);
            continue;
        }
        let wanted: Vec<(String, Vec<i32>)> = match group.topics {
            Some(topics) => topics.into_iter().map(|t| (t.topic_name.to_string(), t.partitions)).collect(),
            None => broker
                .shares
                .group_topics(&group_id)
                .into_iter()
                .filter_map(|topic| catalog.get(&topic).map(|(_, count)| (topic, (0..count).collect())))
                .collect(),
        };
        for (topic, partitions) in wanted {
            let mut entry = DescribeShareGroupOffsetsResponseTopic::default();
            entry.topic_name = TopicName(str_bytes(&topic));
            let topic_id = catalog.get(&topic).map(|(id, _)| id);
            entry.topic_id = topic_id.unwrap_or_else(Uuid::nil);
            for partition in partitions {
                let mut data = DescribeShareGroupOffsetsResponsePartition::default();
                data.partition_index = partition;
                data.leader_epoch = crate::LEADER_EPOCH;
                data.start_offset = -1;
                match topic_id {
                    None => data.error_code = ResponseError::UnknownTopicOrPartition.code(),
                    Some(topic_id) => {
                        let key = (group_id.clone(), topic.clone(), partition);
                        match broker.shares.store.summary(&**broker, &key, topic_id).await {
                            Ok(summary) => {
                                data.start_offset = summary.map_or(-1, |s| s.start);
                                let lag = share_partition_lag(broker, (&topic, partition), summary.as_ref());
                                sluice_protocol::set_described_lag(&mut data, lag);
                            }
                            Err(error) => data.error_code = error.code(),
                        }
                    }
                }
                entry.partitions.push(data);
            }
            answer.topics.push(entry);
        }
        response.groups.push(answer);
    }
    response
}

/// A broker's ShareAcknowledge asking the leader of a queue's partition to archive `count`
/// of its oldest ready records (the AMQP front door of another node: a queue over its
/// `x-max-length`); the answer carries their offsets, or NOT_LEADER_OR_FOLLOWER. A queue's
/// share group and topic share its name.
async fn discard_ready(broker: &Arc<Broker>, request: ShareAcknowledgeRequest, count: u64) -> ShareAcknowledgeResponse {
    let mut response = ShareAcknowledgeResponse::default();
    let queue = request.group_id.as_deref().map(|g| g.to_string()).unwrap_or_default();
    let partition = request.topics.first().and_then(|t| t.partitions.first()).map(|p| p.partition_index);
    let Some(partition) = partition else {
        response.error_code = ResponseError::InvalidRequest.code();
        return response;
    };
    match crate::amqp_host::discard_ready_here(broker, &queue, partition, count).await {
        Some(offsets) => sluice_protocol::set_discarded(&mut response, &offsets),
        None => response.error_code = ResponseError::NotLeaderOrFollower.code(),
    }
    response
}

/// A broker's DescribeShareGroupOffsets asking, at the partitions' leader, how many records
/// of each are ready and how many handed out and unacknowledged (the AMQP front door of
/// another node: a queue's `message_count` and `x-max-length`). NOT_LEADER_OR_FOLLOWER for a
/// partition not led here.
async fn queue_depths(
    broker: &Arc<Broker>,
    request: kafka_protocol::messages::DescribeShareGroupOffsetsRequest,
) -> kafka_protocol::messages::DescribeShareGroupOffsetsResponse {
    use kafka_protocol::messages::describe_share_group_offsets_response::{
        DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
        DescribeShareGroupOffsetsResponseTopic,
    };
    let mut response = kafka_protocol::messages::DescribeShareGroupOffsetsResponse::default();
    for group in request.groups {
        let mut answer = DescribeShareGroupOffsetsResponseGroup::default();
        for topic in group.topics.unwrap_or_default() {
            let mut entry = DescribeShareGroupOffsetsResponseTopic::default();
            for partition in &topic.partitions {
                let mut data = DescribeShareGroupOffsetsResponsePartition::default();
                data.partition_index = *partition;
                let depth = crate::amqp_host::local_depth(
                    broker,
                    group.group_id.as_str(),
                    topic.topic_name.as_str(),
                    *partition,
                );
                match depth.await {
                    Some((ready, unacknowledged)) => sluice_protocol::set_queue_depth(&mut data, ready, unacknowledged),
                    None => data.error_code = ResponseError::NotLeaderOrFollower.code(),
                }
                entry.partitions.push(data);
            }
            entry.topic_name = topic.topic_name;
            answer.topics.push(entry);
        }
        answer.group_id = group.group_id;
        response.groups.push(answer);
    }
    response
}

/// KIP-1226's lag of a share-partition: records up to the high watermark not yet delivered
/// to completion (past the start offset, less those acknowledged or archived out of order);
/// -1 (unknown) when the group never fetched it, when this node has no replica of the
/// partition, or when its state lives on another node.
fn share_partition_lag(
    broker: &Broker,
    (topic, partition): (&str, i32),
    summary: Option<&sluice_coordinator::share::store::Summary>,
) -> i64 {
    let Some(log) = broker.partition(topic, partition) else { return -1 };
    let offsets = log.offsets();
    match summary {
        Some(summary) => match summary.delivery_complete {
            Some(done) => (offsets.high_watermark - summary.start.max(offsets.log_start_offset) - done).max(0),
            None => -1,
        },
        None => -1,
    }
}

/// The share-partition a broker-to-broker share state request names, by topic id.
fn state_key(
    catalog: &sluice_meta::topics::TopicCatalog,
    group: &str,
    topic_id: &Uuid,
    partition: i32,
) -> Option<PartitionKey> {
    catalog.name_for_id(topic_id).map(|topic| (group.to_string(), topic.to_string(), partition))
}

/// ReadShareGroupState (broker to broker; CLUSTER_ACTION): a data partition's new leader
/// loads a share-partition's state from the state partition led here.
pub(super) async fn read_state(
    broker: &Arc<Broker>,
    client: &ClientSession,
    request: ReadShareGroupStateRequest,
) -> ReadShareGroupStateResponse {
    let allowed = broker.may_replicate(client);
    let catalog = broker.topics.catalog();
    let mut response = ReadShareGroupStateResponse::default();
    for topic in request.topics {
        let mut result = read_state_response::ReadStateResult::default();
        result.topic_id = topic.topic_id;
        for partition in topic.partitions {
            let mut answer = read_state_response::PartitionResult::default();
            answer.partition = partition.partition;
            let read = match state_key(&catalog, &request.group_id, &topic.topic_id, partition.partition) {
                _ if !allowed => Err(ResponseError::ClusterAuthorizationFailed),
                None => Err(ResponseError::UnknownTopicOrPartition),
                Some(key) => broker.shares.store.read_here(&**broker, &key, partition.leader_epoch).await,
            };
            match read {
                Ok((state_epoch, start_offset, batches)) => {
                    answer.state_epoch = state_epoch;
                    answer.start_offset = start_offset;
                    answer.state_batches = batches
                        .into_iter()
                        .map(|(first, last, delivery_state, count)| {
                            let mut batch = read_state_response::StateBatch::default();
                            batch.first_offset = first;
                            batch.last_offset = last;
                            batch.delivery_state = delivery_state;
                            batch.delivery_count = count;
                            batch
                        })
                        .collect();
                }
                Err(error) => answer.error_code = error.code(),
            }
            result.partitions.push(answer);
        }
        response.results.push(result);
    }
    response
}

/// WriteShareGroupState (broker to broker; CLUSTER_ACTION): a data partition's leader
/// stores a share-partition's new state here; answered once durable.
pub(super) async fn write_state(
    broker: &Arc<Broker>,
    client: &ClientSession,
    request: WriteShareGroupStateRequest,
) -> WriteShareGroupStateResponse {
    let allowed = broker.may_replicate(client);
    let catalog = broker.topics.catalog();
    let mut response = WriteShareGroupStateResponse::default();
    for topic in request.topics {
        let mut result = write_state_response::WriteStateResult::default();
        result.topic_id = topic.topic_id;
        for partition in topic.partitions {
            let mut answer = write_state_response::PartitionResult::default();
            answer.partition = partition.partition;
            let written = match state_key(&catalog, &request.group_id, &topic.topic_id, partition.partition) {
                _ if !allowed => Err(ResponseError::ClusterAuthorizationFailed),
                None => Err(ResponseError::UnknownTopicOrPartition),
                Some(key) => {
                    let header = (partition.state_epoch, partition.leader_epoch, partition.start_offset);
                    let batches = partition
                        .state_batches
                        .iter()
                        .map(|b| (b.first_offset, b.last_offset, b.delivery_state, b.delivery_count));
                    broker.shares.store.write_here(&**broker, &key, header, batches).await
                }
            };
            answer.error_code = written.err().map_or(0, |e| e.code());
            result.partitions.push(answer);
        }
        response.results.push(result);
    }
    response
}

/// ReadShareGroupStateSummary (broker to broker; CLUSTER_ACTION): a share-partition's
/// start offset, for DescribeShareGroupOffsets at the group's coordinator.
pub(super) fn read_state_summary(
    broker: &Arc<Broker>,
    client: &ClientSession,
    request: ReadShareGroupStateSummaryRequest,
) -> ReadShareGroupStateSummaryResponse {
    let allowed = broker.may_replicate(client);
    let catalog = broker.topics.catalog();
    let mut response = ReadShareGroupStateSummaryResponse::default();
    for topic in request.topics {
        let mut result = summary_response::ReadStateSummaryResult::default();
        result.topic_id = topic.topic_id;
        for partition in topic.partitions {
            let mut answer = summary_response::PartitionResult::default();
            answer.partition = partition.partition;
            let summary = match state_key(&catalog, &request.group_id, &topic.topic_id, partition.partition) {
                _ if !allowed => Err(ResponseError::ClusterAuthorizationFailed),
                None => Err(ResponseError::UnknownTopicOrPartition),
                Some(key) => broker.shares.store.summary_here(&**broker, &key),
            };
            match summary {
                Ok(Some(summary)) => {
                    answer.state_epoch = summary.version;
                    answer.leader_epoch = summary.leader_epoch;
                    answer.start_offset = summary.start;
                }
                Ok(None) => (answer.state_epoch, answer.leader_epoch, answer.start_offset) = (-1, -1, -1),
                Err(error) => answer.error_code = error.code(),
            }
            result.partitions.push(answer);
        }
        response.results.push(result);
    }
    response
}

/// InitializeShareGroupState (broker to broker): each named share-partition starts at the
/// given offset.
pub(super) async fn initialize_state(
    broker: &Arc<Broker>,
    client: &ClientSession,
    request: InitializeShareGroupStateRequest,
) -> InitializeShareGroupStateResponse {
    use kafka_protocol::messages::initialize_share_group_state_response::{InitializeStateResult, PartitionResult};
    let changes = request
        .topics
        .into_iter()
        .map(|t| {
            (t.topic_id, t.partitions.into_iter().map(|p| (p.partition, AdminChange::Start(p.start_offset))).collect())
        })
        .collect();
    let mut response = InitializeShareGroupStateResponse::default();
    for (topic_id, codes) in administer_state(broker, client, &request.group_id, changes).await {
        let mut result = InitializeStateResult::default();
        result.topic_id = topic_id;
        result.partitions = codes
            .into_iter()
            .map(|(partition, code)| PartitionResult::default().with_partition(partition).with_error_code(code))
            .collect();
        response.results.push(result);
    }
    response
}

/// DeleteShareGroupState (broker to broker): the named share-partitions' state is deleted.
pub(super) async fn delete_state(
    broker: &Arc<Broker>,
    client: &ClientSession,
    request: DeleteShareGroupStateRequest,
) -> DeleteShareGroupStateResponse {
    use kafka_protocol::messages::delete_share_group_state_response::{DeleteStateResult, PartitionResult};
    let changes = request
        .topics
        .into_iter()
        .map(|t| (t.topic_id, t.partitions.into_iter().map(|p| (p.partition, AdminChange::Delete)).collect()))
        .collect();
    let mut response = DeleteShareGroupStateResponse::default();
    for (topic_id, codes) in administer_state(broker, client, &request.group_id, changes).await {
        let mut result = DeleteStateResult::default();
        result.topic_id = topic_id;
        result.partitions = codes
            .into_iter()
            .map(|(partition, code)| PartitionResult::default().with_partition(partition).with_error_code(code))
            .collect();
        response.results.push(result);
    }
    response
}

/// A group coordinator's administrative change of share-partitions stored here
/// (InitializeShareGroupState, DeleteShareGroupState; CLUSTER_ACTION).
async fn administer_state(
    broker: &Arc<Broker>,
    client: &ClientSession,
    group_id: &str,
    changes: Vec<(Uuid, Vec<(i32, AdminChange)>)>,
) -> Vec<(Uuid, Vec<(i32, i16)>)> {
    let allowed = broker.may_replicate(client);
    let catalog = broker.topics.catalog();
    let mut results = Vec::new();
    for (topic_id, partitions) in changes {
        let mut codes = Vec::new();
        for (partition, change) in partitions {
            let done = match state_key(&catalog, group_id, &topic_id, partition) {
                _ if !allowed => Err(ResponseError::ClusterAuthorizationFailed),
                None => Err(ResponseError::UnknownTopicOrPartition),
                Some(key) => broker.shares.store.administer_here(&**broker, &key, change).await,
            };
            codes.push((partition, done.err().map_or(0, |e| e.code())));
        }
        results.push((topic_id, codes));
    }
    results
}

/// Share-partition changes an administrator may make only while the group has no members
/// (Kafka's rule): checked at the group's coordinator.
fn check_administrable(broker: &Broker, group_id: &str) -> Result<(), (ResponseError, String)> {
    if let Err(error) = broker.groups.serving(group_id) {
        return Err((error.response_error(), "this broker is not the share group's coordinator".to_string()));
    }
    if broker.shares.has_members(group_id) {
        return Err((ResponseError::NonEmptyGroup, format!("share group {group_id} has active members")));
    }
    Ok(())
}

/// Applies `change` to each partition, a few at a time; the first error of each.
async fn administer_all(
    broker: &Broker,
    group_id: &str,
    targets: Vec<(String, Uuid, i32, AdminChange)>,
) -> Vec<(String, i32, Result<(), ResponseError>)> {
    use futures::StreamExt;
    futures::stream::iter(targets)
        .map(|(topic, topic_id, partition, change)| async move {
            let key = (group_id.to_string(), topic.clone(), partition);
            let done = broker.shares.store.administer(broker, &key, topic_id, change).await;
            if done.is_ok() {
                broker.shares.drop_served(&key);
            }
            (topic, partition, done)
        })
        .buffered(ADMIN_CHANGES_IN_FLIGHT)
        .collect()
        .await
}

/// Share-partition changes of one administrative request in flight at once.
const ADMIN_CHANGES_IN_FLIGHT: usize = 16;

/// AlterShareGroupOffsets (`kafka-share-groups --reset-offsets`): each named
/// share-partition starts again at the given offset, nothing in flight.
pub(super) async fn alter_offsets(
    broker: &Arc<Broker>,
    request: AlterShareGroupOffsetsRequest,
) -> AlterShareGroupOffsetsResponse {
    use kafka_protocol::messages::alter_share_group_offsets_response::{
        AlterShareGroupOffsetsResponsePartition, AlterShareGroupOffsetsResponseTopic,
    };
    let mut response = AlterShareGroupOffsetsResponse::default();
    let group_id = request.group_id.to_string();
    if let Err((error, message)) = check_administrable(broker, &group_id) {
        response.error_code = error.code();
        response.error_message = Some(str_bytes(&message));
        return response;
    }
    let catalog = broker.topics.catalog();
    let mut targets = Vec::new();
    let mut refused = Vec::new();
    for topic in &request.topics {
        let name = topic.topic_name.to_string();
        for partition in &topic.partitions {
            match catalog.get(&name) {
                Some((topic_id, count))
                    if (0..count).contains(&partition.partition_index) && partition.start_offset >= 0 =>
                {
                    targets.push((
                        name.clone(),
                        topic_id,
                        partition.partition_index,
                        AdminChange::Start(partition.start_offset),
                    ));
                }
                Some(_) if partition.start_offset < 0 => {
                    refused.push((name.clone(), partition.partition_index, Err(ResponseError::InvalidRequest)));
                }
                _ => {
                    refused.push((name.clone(), partition.partition_index, Err(ResponseError::UnknownTopicOrPartition)))
                }
            }
        }
    }
    let mut by_topic: BTreeMap<String, Vec<AlterShareGroupOffsetsResponsePartition>> = BTreeMap::new();
    for (topic, partition, done) in administer_all(broker, &group_id, targets).await.into_iter().chain(refused) {
        let mut answer = AlterShareGroupOffsetsResponsePartition::default();
        answer.partition_index = partition;
        answer.error_code = done.err().map_or(0, |e| e.code());
        by_topic.entry(topic).or_default().push(answer);
    }
    response.responses = by_topic
        .into_iter()
        .map(|(topic, partitions)| {
            let mut answer = AlterShareGroupOffsetsResponseTopic::default();
            answer.topic_id = catalog.get(&topic).map_or(Uuid::nil(), |(id, _)| id);
            answer.topic_name = TopicName(str_bytes(&topic));
            answer.partitions = partitions;
            answer
        })
        .collect();
    response
}

/// DeleteShareGroupOffsets (`kafka-share-groups --delete-offsets`): forgets the group's
/// share-partitions of the named topics.
pub(super) async fn delete_offsets(
    broker: &Arc<Broker>,
    request: DeleteShareGroupOffsetsRequest,
) -> DeleteShareGroupOffsetsResponse {
    use kafka_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic;
    let mut response = DeleteShareGroupOffsetsResponse::default();
    let group_id = request.group_id.to_string();
    if let Err((error, message)) = check_administrable(broker, &group_id) {
        response.error_code = error.code();
        response.error_message = Some(str_bytes(&message));
        return response;
    }
    let catalog = broker.topics.catalog();
    for topic in &request.topics {
        let name = topic.topic_name.to_string();
        let mut answer = DeleteShareGroupOffsetsResponseTopic::default();
        answer.topic_name = topic.topic_name.clone();
        match catalog.get(&name) {
            None => answer.error_code = ResponseError::UnknownTopicOrPartition.code(),
            Some((topic_id, count)) => {
                answer.topic_id = topic_id;
                let targets = (0..count).map(|p| (name.clone(), topic_id, p, AdminChange::Delete)).collect();
                let failed = administer_all(broker, &group_id, targets).await.into_iter().find_map(|(_, _, d)| d.err());
                answer.error_code = failed.map_or(0, |e| e.code());
            }
        }
        response.responses.push(answer);
    }
    response
}

/// DeleteGroups of a share group (`kafka-share-groups --delete`): refused while it has
/// members; else every share-partition of the group (of the topics it registered) and its
/// registration are forgotten.
pub(super) async fn delete_group(broker: &Arc<Broker>, group_id: &str) -> Result<(), ResponseError> {
    check_administrable(broker, group_id).map_err(|(error, _)| error)?;
    let catalog = broker.topics.catalog();
    let targets = broker
        .shares
        .group_topics(group_id)
        .into_iter()
        .filter_map(|topic| catalog.get(&topic).map(|(id, count)| (topic, id, count)))
        .flat_map(|(topic, id, count)| (0..count).map(move |p| (topic.clone(), id, p, AdminChange::Delete)))
        .collect();
    if let Some(error) = administer_all(broker, group_id, targets).await.into_iter().find_map(|(_, _, d)| d.err()) {
        return Err(error);
    }
    broker.shares.register_group(&**broker, group_id, None).await?;
    broker.shares.forget_group(group_id);
    Ok(())
}
