//! Publishing: a batch of messages routed through the exchanges and written to their
//! queues' topics with one Produce (acks=all), so a confirm means what a Kafka producer's
//! acknowledgement means: the message is as durable as its topic promises.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use amq_protocol::types::{AMQPValue, FieldTable};

use bytes::BytesMut;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, RequestKind, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};
use kafka_protocol::ResponseError;

use crate::dead_letter::QueuePolicy;
use crate::frames::reply;
use crate::gateway::{versions, Session};
use crate::length_limit::{self, LengthLimit, Overflow};
use crate::messages::{to_record, Message};
use crate::queues::UNKNOWN_TOPIC_WAIT;
use crate::topology::Refused;
use crate::Server;

/// How long a produce may wait for replication before the broker answers.
const PRODUCE_TIMEOUT_MS: i32 = 30_000;

/// How long a publish waits before it asks again a partition whose leader is moving.
const PRODUCE_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// How long a publish keeps asking again a partition whose leader is moving or catching up
/// before the publisher gets a nack.
const LEADER_MOVE_WAIT: Duration = Duration::from_millis(PRODUCE_TIMEOUT_MS as u64);

/// A (queue, partition) of a publish.
type QueuePartition = (String, i32);

/// How long after its first attempt a produce refused with `error` is sent again; `None`
/// when it is not (the refusal is final, or the records may have been written). Each
/// attempt is routed afresh, to the partition's leader as this node then knows it.
fn retry_window(error: ResponseError) -> Option<Duration> {
    match error {
        // The records were not written: the leader moved, or is not there yet.
        ResponseError::NotLeaderOrFollower
        | ResponseError::LeaderNotAvailable
        | ResponseError::NotEnoughReplicas
        | ResponseError::FencedLeaderEpoch
        | ResponseError::UnknownLeaderEpoch => Some(LEADER_MOVE_WAIT),
        ResponseError::UnknownTopicOrPartition => Some(UNKNOWN_TOPIC_WAIT),
        _ => None,
    }
}

/// One Produce (acks=all) of `batches`; the partitions it failed for, with their errors.
async fn produce_once(
    server: &Server,
    session: Option<&Session>,
    batches: &BTreeMap<QueuePartition, bytes::Bytes>,
) -> Result<Vec<(QueuePartition, ResponseError)>, Refused> {
    let mut topics: BTreeMap<String, TopicProduceData> = BTreeMap::new();
    for ((queue, partition), batch) in batches {
        let topic = topics.entry(queue.clone()).or_insert_with(|| {
            let mut topic = TopicProduceData::default();
            topic.name = TopicName(StrBytes::from_string(queue.clone()));
            topic
        });
        let mut data = PartitionProduceData::default();
        data.index = *partition;
        data.records = Some(batch.clone());
        topic.partition_data.push(data);
    }
    let mut request = ProduceRequest::default();
    request.acks = -1;
    request.timeout_ms = PRODUCE_TIMEOUT_MS;
    request.topic_data = topics.into_values().collect();
    let answer = match session {
        Some(session) => server.gateway.call(session, versions::PRODUCE, RequestKind::Produce(request)).await,
        None => server.gateway.call_internal(versions::PRODUCE, RequestKind::Produce(request)).await,
    };
    let Some(ResponseKind::Produce(response)) = answer else {
        return Err(Refused(reply::INTERNAL_ERROR, "the broker gave no answer to a produce".into()));
    };
    let mut failed = Vec::new();
    for topic in &response.responses {
        for partition in &topic.partition_responses {
            let Some(error) = ResponseError::try_from_code(partition.error_code) else { continue };
            let queue = topic.name.0.to_string();
            if error == ResponseError::TopicAuthorizationFailed {
                return Err(Refused(
                    reply::ACCESS_REFUSED,
                    format!("write access to queue '{queue}' in vhost '/' refused"),
                ));
            }
            failed.push(((queue, partition.index), error));
        }
    }
    Ok(failed)
}

/// What became of one published message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// In every queue it was routed to.
    Stored,
    /// Routed nowhere.
    Unroutable,
    /// A queue's topic refused it (the publisher gets a nack).
    Failed,
    /// A queue at its `x-max-length` with `reject-publish` refused it (the publisher gets a
    /// nack); the other queues it was routed to took it.
    Rejected,
}

/// Picks partitions of multi-partition queues in turn.
#[derive(Default)]
pub struct Partitioner {
    next: HashMap<String, u32>,
}

impl Partitioner {
    fn pick(&mut self, queue: &str, partitions: i32) -> i32 {
        let next = self.next.entry(queue.to_string()).or_default();
        let partition = (*next % partitions.max(1) as u32) as i32;
        *next = next.wrapping_add(1);
        partition
    }
}

/// Sender-selected distribution's headers (RabbitMQ): more routing keys for the message.
const HEADER_CC: &str = "CC";
const HEADER_BCC: &str = "BCC";

/// How many rounds of dead letters one publish stores at most: messages dropped at a
/// queue's length limit go to its dead-letter exchange, whose queues may drop more, and a
/// dead-letter exchange may route back to the queue.
const DEAD_LETTER_ROUNDS_MAX: usize = 8;

/// Routes and stores `messages` as `session` (None: as the broker, for dead letters); an
/// unknown exchange is a channel error (404), as in RabbitMQ, and refuses the whole batch.
/// Then the dead letters of what queues dropped at their length limit are stored, each on
/// its own, as the broker (an exchange deleted since drops its letter, as in RabbitMQ).
pub async fn publish(
    server: &Server,
    session: Option<&Session>,
    partitioner: &mut Partitioner,
    messages: &[Message],
) -> Result<Vec<Outcome>, Refused> {
    let (outcomes, mut letters) = publish_once(server, session, partitioner, messages).await?;
    for _ in 0..DEAD_LETTER_ROUNDS_MAX {
        if letters.is_empty() {
            break;
        }
        let mut next = Vec::new();
        for letter in &letters {
            match publish_once(server, None, partitioner, std::slice::from_ref(letter)).await {
                Ok((stored, more)) if stored.iter().all(|o| *o != Outcome::Failed) => next.extend(more),
                Ok((_, more)) => {
                    tracing::warn!(exchange = %letter.exchange, "a dead letter of a message dropped at a queue's x-max-length was not stored");
                    next.extend(more);
                }
                Err(Refused(_, text)) => tracing::debug!(%text, "dead letter dropped"),
            }
        }
        letters = next;
    }
    Ok(outcomes)
}

/// Stores `letters` (already routed to their dead-letter exchanges) as the broker: a
/// dead-letter exchange was allowed when the queue was declared. An exchange that no longer
/// exists or routes nowhere drops the letter, as in RabbitMQ.
pub async fn store_dead_letters(
    server: &Server,
    partitioner: &mut Partitioner,
    letters: &[Message],
) -> Result<(), Refused> {
    let mut failed = false;
    for letter in letters {
        // One at a time: an exchange deleted since the queue was declared refuses only its letter.
        match publish(server, None, partitioner, std::slice::from_ref(letter)).await {
            Ok(outcomes) => failed |= outcomes.contains(&Outcome::Failed),
            Err(Refused(reply::NOT_FOUND, text)) => tracing::debug!(%text, "dead letter dropped"),
            Err(refused) => return Err(refused),
        }
    }
    if failed {
        return Err(Refused(reply::INTERNAL_ERROR, "a dead-letter queue did not store a dead letter".into()));
    }
    Ok(())
}

/// One round of [`publish`]: the outcomes, and the dead letters of what queues dropped.
async fn publish_once(
    server: &Server,
    session: Option<&Session>,
    partitioner: &mut Partitioner,
    messages: &[Message],
) -> Result<(Vec<Outcome>, Vec<Message>), Refused> {
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let mut outcomes = vec![Outcome::Stored; messages.len()];
    // (queue, partition) -> (records, indexes of their messages)
    let mut writes: BTreeMap<(String, i32), (Vec<kafka_protocol::records::Record>, Vec<usize>)> = BTreeMap::new();
    // What each queue takes, looked up once per batch.
    let mut shapes: HashMap<String, QueueShape> = HashMap::new();
    for (index, message) in messages.iter().enumerate() {
        let headers = message.properties.headers().as_ref();
        let unknown = || Refused(reply::NOT_FOUND, format!("no exchange '{}' in vhost '/'", message.exchange));
        let mut queues = server.topology.route(&message.exchange, &message.routing_key, headers).ok_or_else(unknown)?;
        for key in sender_selected_keys(message) {
            queues.extend(server.topology.route(&message.exchange, &key, headers).ok_or_else(unknown)?);
        }
        if queues.is_empty() {
            outcomes[index] = Outcome::Unroutable;
            continue;
        }
        let record = to_record(&without_bcc(message), now_ms);
        for queue in queues {
            if !shapes.contains_key(&queue) {
                let shape = QueueShape::of(server, &queue).await?;
                shapes.insert(queue.clone(), shape);
            }
            let shape = shapes.get_mut(&queue).expect("inserted above");
            if let Some(room) = &mut shape.room {
                // reject-publish: this queue refuses it; the others still take it.
                if *room == 0 {
                    outcomes[index] = Outcome::Rejected;
                    continue;
                }
                *room -= 1;
            }
            let partitions = shape.partitions;
            let partition = partitioner.pick(&queue, partitions);
            let entry = writes.entry((queue, partition)).or_default();
            entry.0.push(record.clone());
            entry.1.push(index);
        }
    }
    if writes.is_empty() {
        return Ok((outcomes, Vec::new()));
    }
    let mut batches = BTreeMap::new();
    for (key, (records, _)) in &mut writes {
        batches.insert(key.clone(), one_batch(records)?);
    }
    let started = tokio::time::Instant::now();
    loop {
        let failed = produce_once(server, session, &batches).await?;
        let mut retry = BTreeMap::new();
        for (key, error) in failed {
            if retry_window(error).is_some_and(|window| started.elapsed() < window) {
                tracing::debug!(queue = %key.0, partition = key.1, %error, "AMQP publish asks again");
                retry.insert(key.clone(), batches[&key].clone());
                continue;
            }
            tracing::debug!(queue = %key.0, partition = key.1, %error, "AMQP publish not stored");
            for &index in &writes[&key].1 {
                outcomes[index] = Outcome::Failed;
            }
        }
        if retry.is_empty() {
            break;
        }
        // As a Kafka producer: the partition's leader is moving, or has not learned of its
        // topic yet; ask again once it has.
        tokio::time::sleep(PRODUCE_RETRY_PAUSE).await;
        batches = retry;
    }
    let mut letters = Vec::new();
    for (queue, shape) in &shapes {
        if let Some(limit) = shape.limit.filter(|l| l.overflow == Overflow::DropHead) {
            letters.extend(length_limit::trim(&*server.gateway, queue, shape.partitions, (limit, &shape.policy)).await);
        }
    }
    Ok((outcomes, letters))
}

/// RabbitMQ's sender-selected distribution: the routing keys in the `CC` and `BCC` headers
/// (arrays of strings) route the message too, on the same exchange.
fn sender_selected_keys(message: &Message) -> Vec<String> {
    let Some(headers) = message.properties.headers() else { return Vec::new() };
    let mut keys = Vec::new();
    for name in [HEADER_CC, HEADER_BCC] {
        if let Some(AMQPValue::FieldArray(values)) = headers.inner().get(name) {
            keys.extend(values.as_slice().iter().filter_map(|value| match value {
                AMQPValue::LongString(key) => Some(key.to_string()),
                AMQPValue::ShortString(key) => Some(key.to_string()),
                _ => None,
            }));
        }
    }
    keys
}

/// `message` without its `BCC` header, which no consumer sees (RabbitMQ's rule).
fn without_bcc(message: &Message) -> Cow<'_, Message> {
    let Some(headers) = message.properties.headers() else { return Cow::Borrowed(message) };
    if !headers.inner().contains_key(HEADER_BCC) {
        return Cow::Borrowed(message);
    }
    let mut kept = headers.inner().clone();
    kept.remove(HEADER_BCC);
    let mut stripped = message.clone();
    stripped.properties = stripped.properties.with_headers(FieldTable::from(kept));
    Cow::Owned(stripped)
}

/// What a queue takes: its partitions, its length limit, and under `reject-publish` how
/// many more messages it has room for now.
struct QueueShape {
    partitions: i32,
    limit: Option<LengthLimit>,
    room: Option<u64>,
    /// Where messages dropped at the limit are dead-lettered.
    policy: QueuePolicy,
}

impl QueueShape {
    async fn of(server: &Server, queue: &str) -> Result<QueueShape, Refused> {
        let Some(declared) = server.topology.queue(queue) else {
            return Ok(QueueShape { partitions: 1, limit: None, room: None, policy: QueuePolicy::default() });
        };
        let partitions = crate::queues::partitions(&declared.arguments)?;
        let limit = LengthLimit::parse(&declared.arguments)?;
        let room = match limit {
            Some(limit) if limit.overflow == Overflow::RejectPublish => {
                length_limit::room(&*server.gateway, queue, partitions, limit).await
            }
            _ => None,
        };
        let policy = if limit.is_some() { QueuePolicy::parse(&declared.arguments)? } else { QueuePolicy::default() };
        Ok(QueueShape { partitions, limit, room, policy })
    }
}

/// `records` as the one batch a Produce takes per partition: the encoder writes offsets as
/// deltas, which must rise, and keeps records in one batch while offset minus sequence
/// stays the same (the batch's base sequence is then -1: no producer id).
fn one_batch(records: &mut [kafka_protocol::records::Record]) -> Result<bytes::Bytes, Refused> {
    for (index, record) in records.iter_mut().enumerate() {
        record.offset = index as i64;
        record.sequence = index as i32 - 1;
    }
    let mut buffer = BytesMut::new();
    let options = RecordEncodeOptions { version: 2, compression: Compression::None };
    RecordBatchEncoder::encode(&mut buffer, &*records, &options)
        .map_err(|e| Refused(reply::INTERNAL_ERROR, format!("could not encode records: {e}")))?;
    Ok(buffer.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
    use kafka_protocol::messages::ProduceResponse;

    use crate::test_gateway::{Answers, TestGateway};
    use crate::topology::Queue;

    /// A broker whose produces are refused with `refusal` the first `refusals` times, then
    /// taken.
    struct Refusing {
        refusal: ResponseError,
        refusals: usize,
        produces: AtomicUsize,
    }

    impl Answers for Refusing {
        fn answer(&self, request: &RequestKind) -> Option<ResponseKind> {
            let RequestKind::Produce(request) = request else { return None };
            let refused = self.produces.fetch_add(1, Ordering::SeqCst) < self.refusals;
            let error_code = if refused { self.refusal.code() } else { 0 };
            let mut response = ProduceResponse::default();
            for topic in &request.topic_data {
                let mut answered = TopicProduceResponse::default();
                answered.name = topic.name.clone();
                for partition in &topic.partition_data {
                    let mut part = PartitionProduceResponse::default();
                    part.index = partition.index;
                    part.error_code = error_code;
                    answered.partition_responses.push(part);
                }
                response.responses.push(answered);
            }
            Some(ResponseKind::Produce(response))
        }
    }

    /// The outcome of publishing one message to queue "q" through `gateway`, and how many
    /// produces it took.
    async fn publish_through(gateway: Refusing) -> (Outcome, usize) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::state_store::FileStore::open(dir.path(), |_, _| false, |_| Ok(None)).unwrap());
        let gateway = Arc::new(TestGateway(gateway));
        let config = crate::AmqpConfig { state_dir: dir.path().to_path_buf() };
        let server = Server::new(gateway.clone(), &config, store).unwrap();
        let queue = Queue { durable: true, exclusive: false, auto_delete: false, arguments: BTreeMap::new() };
        server.topology.declare_queue("q", queue).await.unwrap();
        let message = Message {
            exchange: String::new(),
            routing_key: "q".into(),
            properties: Default::default(),
            body: bytes::Bytes::from_static(b"x"),
        };
        let outcomes = publish(&server, None, &mut Partitioner::default(), &[message]).await.unwrap();
        (outcomes[0], gateway.0.produces.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn a_topic_its_leader_does_not_know_yet_is_asked_again_before_a_nack() {
        let gateway =
            Refusing { refusal: ResponseError::UnknownTopicOrPartition, refusals: 2, produces: AtomicUsize::new(0) };
        assert_eq!(publish_through(gateway).await, (Outcome::Stored, 3));
    }

    #[tokio::test]
    async fn a_moving_leader_is_asked_again_before_a_nack() {
        let gateway =
            Refusing { refusal: ResponseError::NotLeaderOrFollower, refusals: 1, produces: AtomicUsize::new(0) };
        assert_eq!(publish_through(gateway).await, (Outcome::Stored, 2));
    }

    #[tokio::test]
    async fn a_final_refusal_is_nacked_at_once() {
        let gateway = Refusing { refusal: ResponseError::CorruptMessage, refusals: 1, produces: AtomicUsize::new(0) };
        assert_eq!(publish_through(gateway).await, (Outcome::Failed, 1));
    }

    #[test]
    fn a_topic_unknown_for_good_is_given_up_on_sooner_than_a_moving_leader() {
        assert_eq!(retry_window(ResponseError::UnknownTopicOrPartition), Some(UNKNOWN_TOPIC_WAIT));
        assert!(UNKNOWN_TOPIC_WAIT < LEADER_MOVE_WAIT);
        // Maybe written: asking again could store the message twice.
        assert_eq!(retry_window(ResponseError::NotEnoughReplicasAfterAppend), None);
        assert_eq!(retry_window(ResponseError::RequestTimedOut), None);
    }

    #[test]
    fn the_records_of_one_partition_encode_as_one_batch() {
        let message = Message {
            exchange: String::new(),
            routing_key: "q".into(),
            properties: Default::default(),
            body: bytes::Bytes::from_static(b"x"),
        };
        let mut records: Vec<_> = (0..3).map(|_| to_record(&message, 0)).collect();
        let mut bytes = one_batch(&mut records).unwrap();
        let sets = kafka_protocol::records::RecordBatchDecoder::decode_all(&mut bytes).unwrap();
        assert_eq!(sets.len(), 1, "one batch");
        assert_eq!(sets[0].records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(sets[0].records[0].sequence, -1);
    }
}
