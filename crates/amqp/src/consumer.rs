//! Reading a queue: one share-group member per AMQP consumer (and one per channel and
//! queue for `basic.get`), and the channel's delivery tags.
//!
//! Why a member per consumer: the share group then does what RabbitMQ does for a queue's
//! consumers — hands each record to one of them, takes it back when its lock runs out or
//! its consumer goes (a requeue), counts deliveries (the `redelivered` flag) and
//! dead-letters past `share.delivery.count.limit` — and Kafka share consumers of the same
//! queue take part on equal terms. A member only asks for as many records as its
//! consumer's prefetch leaves room for, so records it holds are records its client has.
//!
//! Acknowledgements travel with the member's next fetch (at most `LONG_POLL_MS` later),
//! or alone in a ShareAcknowledge when the consumer has no room for more.
//!
//! RabbitMQ lets a consumer hold an unacknowledged message as long as its channel lives (up
//! to `consumer_timeout`, 30 minutes by default); a share group takes a record back when its
//! acquisition lock runs out. So a reader renews the locks of what its client holds (KIP-1222's
//! RENEW) every third of the lock duration, for at most [`HOLD_MAX`] per message.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use amq_protocol::frame::{AMQPContentHeader, AMQPFrame};
use amq_protocol::protocol::{basic, AMQPClass};
use bytes::Bytes;
use kafka_protocol::messages::share_acknowledge_request::{AcknowledgePartition, AcknowledgeTopic};
use kafka_protocol::messages::share_fetch_request::{AcknowledgementBatch, FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::{
    GroupId, RequestKind, ResponseKind, ShareAcknowledgeRequest, ShareFetchRequest, ShareGroupHeartbeatRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use kafka_protocol::ResponseError;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;
use uuid::Uuid;

use crate::dead_letter::{self, QueuePolicy, Reason};
use crate::frames::{encode, reply};
use crate::gateway::{versions, Gateway, Session};
use crate::messages::{from_record, Delivered};
use crate::publish::{self, Partitioner};
use crate::queues::UNKNOWN_TOPIC_WAIT;
use crate::topology::Refused;
use crate::Server;

/// How long a member's fetch waits for records when it has nothing to acknowledge.
const LONG_POLL_MS: i32 = 500;
/// Records one fetch asks for at most (a consumer with no prefetch limit).
const FETCH_RECORDS_MAX: u32 = 500;
/// Bytes one fetch asks for at most.
const FETCH_BYTES_MAX: i32 = 8 * 1024 * 1024;
/// How long a `basic.get` waits for its member to be given the queue's partitions.
const GET_JOIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Fetches one `basic.get` makes at most (records the queue gives up on are skipped).
const GET_FETCHES_MAX: usize = 100;
/// How long a client may hold a message unacknowledged before its lock is no longer renewed
/// and the queue hands it to another consumer (RabbitMQ's default `consumer_timeout`).
const HOLD_MAX: Duration = Duration::from_secs(30 * 60);
/// Locks are renewed when this fraction of their duration has passed.
const RENEWALS_PER_LOCK: u32 = 3;
/// The lock duration assumed until the broker has said it (Kafka's default).
const LOCK_DURATION_DEFAULT: Duration = Duration::from_secs(30);

/// The pause before a member tries again after the broker could not serve it.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Kafka's acknowledgement types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settlement {
    Accept = 1,
    Release = 2,
    Reject = 3,
    /// Not a client's settlement: the client still holds it (its lock is extended).
    Renew = 4,
}

/// A record handed to a client and not yet settled.
#[derive(Clone, Copy, Debug)]
pub struct Unacked {
    /// The reader that fetched it.
    pub reader: u64,
    pub topic_id: Uuid,
    pub partition: i32,
    pub offset: i64,
}

/// One channel's delivery tags and prefetch limits, shared by its readers.
#[derive(Default)]
pub struct Deliveries {
    state: Mutex<DeliveriesState>,
    /// Signalled when unacked records are settled (room for more).
    pub settled: Notify,
}

#[derive(Default)]
struct DeliveriesState {
    next_tag: u64,
    unacked: BTreeMap<u64, Unacked>,
    by_reader: HashMap<u64, usize>,
    /// `basic.qos` with global=true: unacked records on the whole channel at most (0: none).
    channel_prefetch: u32,
}

impl Deliveries {
    pub fn set_channel_prefetch(&self, prefetch: u32) {
        self.state.lock().channel_prefetch = prefetch;
        self.settled.notify_waiters();
    }

    /// Gives `unacked` the channel's next delivery tag.
    fn record(&self, unacked: Unacked) -> u64 {
        let mut state = self.state.lock();
        state.next_tag += 1;
        let tag = state.next_tag;
        state.unacked.insert(tag, unacked);
        *state.by_reader.entry(unacked.reader).or_default() += 1;
        tag
    }

    /// How many more records `reader` may hand out under `prefetch` (0: no limit).
    fn room(&self, reader: u64, prefetch: u32) -> u32 {
        let state = self.state.lock();
        let held = *state.by_reader.get(&reader).unwrap_or(&0) as u32;
        let own = if prefetch == 0 { FETCH_RECORDS_MAX } else { prefetch.saturating_sub(held) };
        let channel = match state.channel_prefetch {
            0 => FETCH_RECORDS_MAX,
            limit => limit.saturating_sub(state.unacked.len() as u32),
        };
        own.min(channel).min(FETCH_RECORDS_MAX)
    }

    pub fn held_by(&self, reader: u64) -> usize {
        *self.state.lock().by_reader.get(&reader).unwrap_or(&0)
    }

    /// Takes the records `tag` names (and, with `multiple`, every one before it; tag 0 with
    /// `multiple` is all of them); `None` if `tag` is not an unacked delivery tag.
    pub fn take(&self, tag: u64, multiple: bool) -> Option<Vec<(u64, Unacked)>> {
        let mut state = self.state.lock();
        let taken: Vec<(u64, Unacked)> = if multiple {
            if tag != 0 && !state.unacked.contains_key(&tag) {
                return None;
            }
            let upto = if tag == 0 { u64::MAX } else { tag };
            let tags: Vec<u64> = state.unacked.range(..=upto).map(|(t, _)| *t).collect();
            tags.into_iter().map(|t| (t, state.unacked.remove(&t).expect("listed"))).collect()
        } else {
            vec![(tag, state.unacked.remove(&tag)?)]
        };
        for (_, unacked) in &taken {
            if let Some(count) = state.by_reader.get_mut(&unacked.reader) {
                *count -= 1;
            }
        }
        drop(state);
        self.settled.notify_waiters();
        Some(taken)
    }

    /// Takes the unacked records `reader` handed out.
    fn take_reader(&self, reader: u64) -> Vec<Unacked> {
        let mut state = self.state.lock();
        let tags: Vec<u64> = state.unacked.iter().filter(|(_, u)| u.reader == reader).map(|(t, _)| *t).collect();
        state.by_reader.remove(&reader);
        tags.into_iter().filter_map(|t| state.unacked.remove(&t)).collect()
    }

    /// A delivery tag for a record that is settled as it is handed out (no-ack).
    fn unrecorded_tag(&self) -> u64 {
        let mut state = self.state.lock();
        state.next_tag += 1;
        state.next_tag
    }

    /// Takes every unacked record (a recover, or the channel closing).
    pub fn take_all(&self) -> Vec<(u64, Unacked)> {
        self.take(0, true).unwrap_or_default()
    }
}

/// What a reader is told by its channel.
pub enum ReaderCommand {
    /// Settle these records (all fetched by this reader).
    Settle(Vec<(Unacked, Settlement)>),
    /// `basic.get`: one record, or none.
    Get { reply: oneshot::Sender<Result<Option<Got>, Refused>>, no_ack: bool },
    /// The consumer was cancelled: fetch no more, end once what it handed out is settled.
    Cancel,
    /// Release what is unsettled, leave the group, end.
    Stop,
}

/// Where a `basic.get` wants its answer, and whether it acknowledges on receipt.
type GetRequest = (oneshot::Sender<Result<Option<Got>, Refused>>, bool);

/// A record `basic.get` took.
pub struct Got {
    pub delivery_tag: u64,
    pub redelivered: bool,
    pub message: Delivered,
}

pub struct ReaderHandle {
    pub id: u64,
    pub queue: String,
    pub commands: mpsc::UnboundedSender<ReaderCommand>,
}

static NEXT_READER: AtomicU64 = AtomicU64::new(1);

/// Where a reader's deliveries go: the connection's writer, on `channel`.
#[derive(Clone)]
pub struct Outlet {
    pub outbox: mpsc::Sender<Vec<u8>>,
    pub channel: u16,
    pub frame_max: u32,
}

/// The frames of one delivered message (method, content header, bodies).
pub fn content_frames(outlet: &Outlet, method: AMQPClass, message: &Delivered) -> Vec<u8> {
    let mut bytes = encode(&AMQPFrame::Method(outlet.channel, method));
    let header = AMQPContentHeader {
        class_id: 60,
        body_size: message.body.len() as u64,
        properties: message.properties.clone(),
    };
    bytes.extend(encode(&AMQPFrame::Header(outlet.channel, header)));
    for chunk in message.body.chunks(outlet.frame_max as usize - 8) {
        bytes.extend(encode(&AMQPFrame::Body(outlet.channel, chunk.to_vec())));
    }
    bytes
}

/// What a consumer reader needs besides its member.
pub struct ConsumerSpec {
    pub tag: String,
    pub no_ack: bool,
    pub prefetch: u32,
}

/// How a consumer's reader starts: it joins the share group, says whether it could
/// (`joined`: a refusal is the consumer's error), then waits for `go` — sent once the
/// client has its consume-ok — before it delivers anything.
pub struct Start {
    pub joined: oneshot::Sender<Result<(), Refused>>,
    pub go: oneshot::Receiver<()>,
}

/// Starts a reader of `queue` (which gives up on messages as `policy` says) for `consumer`
/// (None: one that serves `basic.get`).
pub fn start(
    server: Arc<Server>,
    session: Session,
    queue: String,
    policy: QueuePolicy,
    deliveries: Arc<Deliveries>,
    outlet: Outlet,
    consumer: Option<(ConsumerSpec, Start)>,
) -> ReaderHandle {
    let id = NEXT_READER.fetch_add(1, Ordering::Relaxed);
    let (commands, inbox) = mpsc::unbounded_channel();
    let member = Member::new(server.gateway.clone(), session, &queue);
    let reader = Reader {
        id,
        member,
        server,
        policy,
        partitioner: Partitioner::default(),
        held: HashMap::new(),
        doomed: Vec::new(),
        deliveries,
        outlet,
        inbox,
        acks: Vec::new(),
        next_renewal: Instant::now() + LOCK_DURATION_DEFAULT / RENEWALS_PER_LOCK,
        stopping: false,
        cancelled: false,
    };
    tokio::spawn(async move {
        match consumer {
            Some((spec, start)) => reader.consume(spec, start).await,
            None => reader.serve_gets().await,
        }
    });
    ReaderHandle { id, queue, commands }
}

struct Reader {
    id: u64,
    member: Member,
    server: Arc<Server>,
    policy: QueuePolicy,
    /// Spreads dead letters over the partitions of their queues.
    partitioner: Partitioner,
    /// What the client holds unacknowledged, by record: a reject or a return past the
    /// delivery limit is a dead letter.
    held: HashMap<(Uuid, i32, i64), Held>,
    /// Records settled by the client that the queue gives up on, to dead-letter before
    /// they are accepted.
    doomed: Vec<Doomed>,
    deliveries: Arc<Deliveries>,
    outlet: Outlet,
    inbox: mpsc::UnboundedReceiver<ReaderCommand>,
    /// Settlements not yet sent.
    acks: Vec<(Unacked, Settlement)>,
    /// When the locks of held records are renewed next.
    next_renewal: Instant,
    stopping: bool,
    cancelled: bool,
}

impl Reader {
    fn apply(&mut self, command: ReaderCommand) -> Option<GetRequest> {
        match command {
            ReaderCommand::Settle(settled) => {
                for (unacked, settlement) in settled {
                    let held = self.held.remove(&(unacked.topic_id, unacked.partition, unacked.offset));
                    match held.and_then(|held| self.settled_reason(&held, settlement).map(|r| (held.message, r))) {
                        Some((message, reason)) => self.doomed.push((unacked, message, reason)),
                        None => self.acks.push((unacked, settlement)),
                    }
                }
            }
            ReaderCommand::Stop => self.stopping = true,
            ReaderCommand::Cancel => self.cancelled = true,
            ReaderCommand::Get { reply, no_ack } => return Some((reply, no_ack)),
        }
        None
    }

    async fn consume(mut self, spec: ConsumerSpec, start: Start) {
        let joined = self.member.heartbeat().await;
        let refused = joined.is_err();
        let _ = start.joined.send(joined);
        if refused || start.go.await.is_err() {
            self.member.leave().await;
            return;
        }
        loop {
            while let Ok(command) = self.inbox.try_recv() {
                self.apply(command);
            }
            self.give_up_settled().await;
            let settled = self.acks.is_empty() && self.deliveries.held_by(self.id) == 0;
            if self.stopping || (self.cancelled && settled) {
                break;
            }
            if let Err(error) = self.member.keep_alive().await {
                self.cancelled(&spec, &error).await;
                break;
            }
            self.renew_locks().await;
            let room = if self.cancelled { 0 } else { self.deliveries.room(self.id, spec.prefetch) };
            if !self.member.assigned() || room == 0 {
                if !self.acks.is_empty() && self.member.has_session() {
                    let acks = std::mem::take(&mut self.acks);
                    let _ = self.member.acknowledge(&acks).await;
                    continue;
                }
                let pause =
                    self.member.until_heartbeat().min(self.next_renewal.saturating_duration_since(Instant::now()));
                tokio::select! {
                    command = self.inbox.recv() => match command {
                        Some(command) => { self.apply(command); }
                        None => break,
                    },
                    () = self.deliveries.settled.notified() => {}
                    () = tokio::time::sleep(pause) => {}
                }
                continue;
            }
            let acks = std::mem::take(&mut self.acks);
            let wait = if acks.is_empty() { LONG_POLL_MS } else { 0 };
            match self.member.fetch(&acks, room, wait).await {
                Ok(fetched) => {
                    // A cancel or close that came during the fetch: what it took goes back
                    // unseen, nothing is delivered after the client's cancel-ok.
                    while let Ok(command) = self.inbox.try_recv() {
                        self.apply(command);
                    }
                    if let Err(refused) = self.cover(&fetched).await {
                        tracing::warn!(queue = %self.member.topic, text = %refused.1, "AMQP deliveries held back");
                        self.acks.extend(fetched.iter().map(|r| (r.unacked(self.id), Settlement::Release)));
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue;
                    }
                    let mut given_up = Vec::new();
                    for record in fetched {
                        if self.cancelled || self.stopping {
                            self.acks.push((record.unacked(self.id), Settlement::Release));
                        } else if let Some(doomed) = self.verdict(&record) {
                            given_up.push(doomed);
                        } else {
                            self.deliver(&spec, record).await;
                        }
                    }
                    self.give_up(given_up).await;
                }
                Err(error) if matches!(error.0, reply::NOT_FOUND | reply::ACCESS_REFUSED) => {
                    self.cancelled(&spec, &error).await;
                    break;
                }
                Err(error) => {
                    tracing::debug!(queue = %self.member.topic, error = %error.1, "AMQP consumer fetch failed");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
        self.finish().await;
    }

    /// Renews the locks of the records the client holds, when due (see the module docs).
    async fn renew_locks(&mut self) {
        let now = Instant::now();
        if now < self.next_renewal {
            return;
        }
        self.next_renewal = now + self.member.lock_duration / RENEWALS_PER_LOCK;
        let renewals: Vec<(Unacked, Settlement)> = self
            .held
            .iter()
            .filter(|(_, held)| now.duration_since(held.since) < HOLD_MAX)
            .map(|(&(topic_id, partition, offset), _)| {
                (Unacked { reader: self.id, topic_id, partition, offset }, Settlement::Renew)
            })
            .collect();
        if let Err(error) = self.member.acknowledge_as(&renewals, true).await {
            tracing::debug!(queue = %self.member.topic, error = %error.1, "AMQP lock renewal failed");
        }
    }

    /// Makes sure a crash cannot hide that `records` were handed out (the `redelivered`
    /// flag after a restart).
    async fn cover(&self, records: &[Acquired]) -> Result<(), Refused> {
        let mut highest: BTreeMap<i32, i64> = BTreeMap::new();
        for record in records {
            let entry = highest.entry(record.partition).or_insert(record.offset);
            *entry = (*entry).max(record.offset);
        }
        for (partition, offset) in highest {
            self.server.delivered.cover(&self.member.topic, partition, offset).await.map_err(|error| {
                Refused(reply::INTERNAL_ERROR, format!("could not record what is delivered: {error}"))
            })?;
        }
        Ok(())
    }

    /// Whether `record`, handed out now, may have been delivered before: acquired before,
    /// or handed out by this node before its partition's leader changed or before the node
    /// started (both forget acquisitions). Called once per delivery.
    fn redelivered(&self, record: &Acquired) -> bool {
        let (queue, delivered) = (&self.member.topic, &self.server.delivered);
        let again = delivered.note_handed_out(record.topic_id, record.partition, record.offset);
        record.delivery_count > 1 || again || delivered.before_start(queue, record.partition, record.offset)
    }

    /// Why the queue gives up on a record the client settled this way: rejected (with a
    /// dead-letter exchange), or returned once more than its delivery limit allows.
    fn settled_reason(&self, held: &Held, settlement: Settlement) -> Option<Reason> {
        match settlement {
            Settlement::Reject if self.policy.keeps_rejected() => Some(Reason::Rejected),
            Settlement::Release if u32::try_from(held.delivery_count).unwrap_or(0) > self.policy.delivery_limit => {
                Some(Reason::DeliveryLimit)
            }
            _ => None,
        }
    }

    /// The record with its message and why the queue gives up on it, if it does.
    fn verdict(&self, record: &Acquired) -> Option<Doomed> {
        let message = from_record(&record.record);
        let reason = self.policy.verdict(&message, record.record.timestamp, record.delivery_count, now_ms())?;
        Some((record.unacked(self.id), Some(message), reason))
    }

    /// Dead-letters `doomed` (or drops it, with no dead-letter exchange), then accepts it in
    /// its queue; if the dead letters could not be stored, it goes back to the queue.
    async fn give_up(&mut self, doomed: Vec<Doomed>) {
        if doomed.is_empty() {
            return;
        }
        let now = now_ms();
        let queue = &self.member.topic;
        let letters: Vec<_> = doomed
            .iter()
            .filter_map(|(_, message, reason)| self.policy.dead_letter(queue, message.clone()?, *reason, now))
            .collect();
        let settlement = match publish::store_dead_letters(&self.server, &mut self.partitioner, &letters).await {
            Ok(()) => Settlement::Accept,
            Err(Refused(_, text)) => {
                tracing::warn!(queue = %self.member.topic, %text, "dead letters not stored: their messages go back");
                Settlement::Release
            }
        };
        self.acks.extend(doomed.into_iter().map(|(unacked, _, _)| (unacked, settlement)));
    }

    async fn give_up_settled(&mut self) {
        let doomed = std::mem::take(&mut self.doomed);
        self.give_up(doomed).await;
    }

    /// The delivery tag of `record`, handed to the client: with no_ack it is accepted at
    /// once; otherwise it is the client's to settle (and held: how it is settled may make it
    /// a dead letter, which needs the message only when there is a dead-letter exchange).
    fn hand_out(&mut self, record: &Acquired, message: &Delivered, no_ack: bool) -> u64 {
        let unacked = record.unacked(self.id);
        if no_ack {
            self.acks.push((unacked, Settlement::Accept));
            return self.deliveries.unrecorded_tag();
        }
        let held = Held {
            since: Instant::now(),
            delivery_count: record.delivery_count,
            message: self.policy.keeps_rejected().then(|| message.clone()),
        };
        self.held.insert((record.topic_id, record.partition, record.offset), held);
        let renewal = Instant::now() + self.member.lock_duration / RENEWALS_PER_LOCK;
        self.next_renewal = self.next_renewal.min(renewal);
        self.deliveries.record(unacked)
    }

    /// Hands `record` to the consumer.
    async fn deliver(&mut self, spec: &ConsumerSpec, record: Acquired) {
        let message = from_record(&record.record);
        let delivery_tag = self.hand_out(&record, &message, spec.no_ack);
        let message = dead_letter::with_delivery_count(message, record.delivery_count);
        let method = AMQPClass::Basic(basic::AMQPMethod::Deliver(basic::Deliver {
            consumer_tag: spec.tag.clone().into(),
            delivery_tag,
            redelivered: self.redelivered(&record),
            exchange: message.exchange.clone().into(),
            routing_key: message.routing_key.clone().into(),
        }));
        let _ = self.outlet.outbox.send(content_frames(&self.outlet, method, &message)).await;
    }

    /// The queue went away under the consumer: the client is told (basic.cancel).
    async fn cancelled(&mut self, spec: &ConsumerSpec, why: &Refused) {
        tracing::debug!(queue = %self.member.topic, why = %why.1, "AMQP consumer cancelled by the server");
        let cancel = AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
            consumer_tag: spec.tag.clone().into(),
            nowait: true,
        }));
        let _ = self.outlet.outbox.send(encode(&AMQPFrame::Method(self.outlet.channel, cancel))).await;
    }

    /// Sends the acknowledgements gathered so far, if the member has a share session.
    async fn send_acks(&mut self) {
        if !self.acks.is_empty() && self.member.has_session() {
            let acks = std::mem::take(&mut self.acks);
            let _ = self.member.acknowledge(&acks).await;
        }
    }

    async fn serve_gets(mut self) {
        while let Some(command) = self.inbox.recv().await {
            if let Some((reply, no_ack)) = self.apply(command) {
                let got = self.get(no_ack).await;
                // A message acknowledged on receipt is settled before the answer.
                self.send_acks().await;
                let _ = reply.send(got);
            }
            if self.stopping {
                break;
            }
            self.give_up_settled().await;
            self.send_acks().await;
        }
        self.finish().await;
    }

    async fn get(&mut self, no_ack: bool) -> Result<Option<Got>, Refused> {
        let deadline = Instant::now() + GET_JOIN_TIMEOUT;
        self.member.keep_alive().await?;
        while !self.member.assigned() && Instant::now() < deadline {
            tokio::time::sleep(RETRY_PAUSE).await;
            self.member.heartbeat().await?;
        }
        // A new session's first fetch loads the share-partitions' state: one more try. A
        // record the queue gives up on (expired, delivered too often) does not count.
        let mut empty_fetches = 0;
        let mut fetches = 0;
        let give_up_at = Instant::now() + GET_JOIN_TIMEOUT;
        while fetches < GET_FETCHES_MAX {
            fetches += 1;
            let acks = std::mem::take(&mut self.acks);
            let mut fetched = self.member.fetch(&acks, 1, 0).await?.into_iter();
            let Some(first) = fetched.next() else {
                empty_fetches += 1;
                if empty_fetches < 2 {
                    continue;
                }
                // Empty twice: the queue is empty, unless its leader is still loading the
                // share-partition's state (another node's, in a cluster) or moving.
                let declared = self.server.topology.queue(&self.member.topic);
                let partitions = declared.map_or(Ok(1), |q| crate::queues::partitions(&q.arguments)).unwrap_or(1);
                if Instant::now() >= give_up_at || !self.member.may_have_ready(partitions).await {
                    break;
                }
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            };
            self.acks.extend(fetched.map(|r| (r.unacked(self.id), Settlement::Release)));
            if let Some(doomed) = self.verdict(&first) {
                self.give_up(vec![doomed]).await;
                continue;
            }
            if let Err(refused) = self.cover(std::slice::from_ref(&first)).await {
                self.acks.push((first.unacked(self.id), Settlement::Release));
                return Err(refused);
            }
            let message = from_record(&first.record);
            let delivery_tag = self.hand_out(&first, &message, no_ack);
            let redelivered = self.redelivered(&first);
            let message = dead_letter::with_delivery_count(message, first.delivery_count);
            return Ok(Some(Got { delivery_tag, redelivered, message }));
        }
        Ok(None)
    }

    /// Releases what the client still holds of this reader and leaves the group.
    async fn finish(mut self) {
        while let Ok(command) = self.inbox.try_recv() {
            self.apply(command);
        }
        self.give_up_settled().await;
        let held = self.deliveries.take_reader(self.id);
        self.acks.extend(held.into_iter().map(|u| (u, Settlement::Release)));
        if self.member.has_session() && !self.acks.is_empty() {
            let acks = std::mem::take(&mut self.acks);
            let _ = self.member.acknowledge(&acks).await;
        }
        self.member.leave().await;
    }
}

/// A record the client holds unacknowledged.
struct Held {
    /// When the client was given it.
    since: Instant,
    /// Its acquisitions so far, this one included.
    delivery_count: i16,
    /// The message, when a dead letter may need it.
    message: Option<Delivered>,
}

/// A record the queue gives up on: its message (None: dropped whatever the queue's dead-letter
/// exchange) and why.
type Doomed = (Unacked, Option<Delivered>, Reason);

/// A record a member acquired.
struct Acquired {
    topic_id: Uuid,
    partition: i32,
    offset: i64,
    delivery_count: i16,
    record: kafka_protocol::records::Record,
}

impl Acquired {
    fn unacked(&self, reader: u64) -> Unacked {
        Unacked { reader, topic_id: self.topic_id, partition: self.partition, offset: self.offset }
    }
}

/// A share-group member, through Kafka's share-group requests.
struct Member {
    gateway: Arc<dyn Gateway>,
    session: Session,
    /// The queue: its topic and its share group.
    topic: String,
    member_id: String,
    member_epoch: i32,
    /// The share session's next epoch (0: none open).
    session_epoch: i32,
    assignment: Vec<(Uuid, Vec<i32>)>,
    /// What the share session fetches (to tell it what it no longer should).
    fetching: Vec<(Uuid, Vec<i32>)>,
    heartbeat_interval: Duration,
    next_heartbeat: Instant,
    /// The share group's acquisition lock duration, as its last fetch answered.
    lock_duration: Duration,
    /// Since when the leaders fetched from have not known the queue's topic (none: they
    /// knew it at the last fetch).
    unknown_topic_since: Option<Instant>,
}

impl Member {
    /// Whether the queue holds records its share group has not settled (ready, or held by
    /// a consumer).
    async fn may_have_ready(&self, partitions: i32) -> bool {
        crate::queues::message_count(&*self.gateway, &self.session, &self.topic, partitions).await > 0
    }

    fn new(gateway: Arc<dyn Gateway>, session: Session, queue: &str) -> Member {
        Member {
            gateway,
            session,
            topic: queue.to_string(),
            member_id: Uuid::new_v4().to_string(),
            member_epoch: 0,
            session_epoch: 0,
            assignment: Vec::new(),
            fetching: Vec::new(),
            heartbeat_interval: Duration::from_secs(1),
            next_heartbeat: Instant::now(),
            lock_duration: LOCK_DURATION_DEFAULT,
            unknown_topic_since: None,
        }
    }

    fn assigned(&self) -> bool {
        self.assignment.iter().any(|(_, partitions)| !partitions.is_empty())
    }

    fn has_session(&self) -> bool {
        self.session_epoch > 0
    }

    fn until_heartbeat(&self) -> Duration {
        self.next_heartbeat.saturating_duration_since(Instant::now())
    }

    async fn call(&self, version: i16, request: RequestKind) -> Result<ResponseKind, Refused> {
        self.gateway
            .call(&self.session, version, request)
            .await
            .ok_or_else(|| Refused(reply::INTERNAL_ERROR, "the broker gave no answer".into()))
    }

    fn refused(&self, error: ResponseError, message: Option<&StrBytes>) -> Refused {
        crate::queues::refusal(error, &self.topic, message)
    }

    /// Heartbeats when one is due.
    async fn keep_alive(&mut self) -> Result<(), Refused> {
        if Instant::now() >= self.next_heartbeat {
            self.heartbeat().await?;
        }
        Ok(())
    }

    async fn heartbeat(&mut self) -> Result<(), Refused> {
        let mut request = ShareGroupHeartbeatRequest::default();
        request.group_id = GroupId(StrBytes::from_string(self.topic.clone()));
        request.member_id = StrBytes::from_string(self.member_id.clone());
        request.member_epoch = self.member_epoch;
        if self.member_epoch == 0 {
            request.subscribed_topic_names = Some(vec![TopicName(StrBytes::from_string(self.topic.clone()))]);
        }
        let ResponseKind::ShareGroupHeartbeat(response) =
            self.call(versions::SHARE_GROUP_HEARTBEAT, RequestKind::ShareGroupHeartbeat(request)).await?
        else {
            return Err(Refused(reply::INTERNAL_ERROR, "unexpected answer to ShareGroupHeartbeat".into()));
        };
        self.next_heartbeat = Instant::now() + self.heartbeat_interval;
        match ResponseError::try_from_code(response.error_code) {
            None => {}
            Some(ResponseError::FencedMemberEpoch | ResponseError::UnknownMemberId) => {
                self.member_epoch = 0;
                self.session_epoch = 0;
                self.next_heartbeat = Instant::now();
                return Ok(());
            }
            Some(
                error @ (ResponseError::CoordinatorNotAvailable
                | ResponseError::NotCoordinator
                | ResponseError::CoordinatorLoadInProgress),
            ) => {
                tracing::debug!(queue = %self.topic, %error, "share group coordinator not here yet");
                self.next_heartbeat = Instant::now() + RETRY_PAUSE;
                return Ok(());
            }
            Some(error) => return Err(self.refused(error, response.error_message.as_ref())),
        }
        self.member_epoch = response.member_epoch;
        if response.heartbeat_interval_ms > 0 {
            self.heartbeat_interval = Duration::from_millis(response.heartbeat_interval_ms as u64);
            self.next_heartbeat = Instant::now() + self.heartbeat_interval;
        }
        if let Some(assignment) = response.assignment {
            self.assignment = assignment.topic_partitions.into_iter().map(|t| (t.topic_id, t.partitions)).collect();
        }
        Ok(())
    }

    /// Settlements as acknowledgement batches of each (topic id, partition), one offset each.
    fn batches(acks: &[(Unacked, Settlement)]) -> BTreeMap<(Uuid, i32), Vec<AcknowledgementBatch>> {
        let mut by_partition: BTreeMap<(Uuid, i32), Vec<(i64, Settlement)>> = BTreeMap::new();
        for (unacked, settlement) in acks {
            by_partition.entry((unacked.topic_id, unacked.partition)).or_default().push((unacked.offset, *settlement));
        }
        by_partition
            .into_iter()
            .map(|(key, mut offsets)| {
                offsets.sort_by_key(|(offset, _)| *offset);
                let batches = offsets
                    .into_iter()
                    .map(|(offset, settlement)| {
                        let mut batch = AcknowledgementBatch::default();
                        batch.first_offset = offset;
                        batch.last_offset = offset;
                        batch.acknowledge_types = vec![settlement as i8];
                        batch
                    })
                    .collect();
                (key, batches)
            })
            .collect()
    }

    /// Fetches up to `max_records` records, settling `acks` first.
    async fn fetch(
        &mut self,
        acks: &[(Unacked, Settlement)],
        max_records: u32,
        max_wait_ms: i32,
    ) -> Result<Vec<Acquired>, Refused> {
        let mut acks_by_partition = Self::batches(acks);
        if self.session_epoch == 0 && !acks_by_partition.is_empty() {
            // Acknowledgements need an open session; a new one starts without them, and
            // what they settled is released when its lock runs out.
            acks_by_partition.clear();
        }
        let mut request = ShareFetchRequest::default();
        request.group_id = Some(GroupId(StrBytes::from_string(self.topic.clone())));
        request.member_id = Some(StrBytes::from_string(self.member_id.clone()));
        request.share_session_epoch = self.session_epoch;
        request.max_wait_ms = max_wait_ms;
        request.min_bytes = 1;
        request.max_bytes = FETCH_BYTES_MAX;
        request.max_records = max_records as i32;
        request.batch_size = max_records as i32;
        request.topics = self
            .assignment
            .iter()
            .map(|(topic_id, partitions)| {
                let mut topic = FetchTopic::default();
                topic.topic_id = *topic_id;
                topic.partitions = partitions
                    .iter()
                    .map(|&p| {
                        let mut partition = FetchPartition::default();
                        partition.partition_index = p;
                        partition.partition_max_bytes = FETCH_BYTES_MAX;
                        partition.acknowledgement_batches =
                            acks_by_partition.remove(&(*topic_id, p)).unwrap_or_default();
                        partition
                    })
                    .collect();
                topic
            })
            .collect();
        request.forgotten_topics_data = self.forgotten();
        let ResponseKind::ShareFetch(response) =
            self.call(versions::SHARE_FETCH, RequestKind::ShareFetch(request)).await?
        else {
            return Err(Refused(reply::INTERNAL_ERROR, "unexpected answer to ShareFetch".into()));
        };
        if let Some(error) = ResponseError::try_from_code(response.error_code) {
            self.session_epoch = 0;
            return Err(self.refused(error, response.error_message.as_ref()));
        }
        self.session_epoch += 1;
        self.fetching = self.assignment.clone();
        if response.acquisition_lock_timeout_ms > 0 {
            self.lock_duration = Duration::from_millis(response.acquisition_lock_timeout_ms as u64);
        }
        let mut acquired = Vec::new();
        let (mut answered, mut failed) = (0, 0);
        for topic in response.responses {
            for partition in topic.partitions {
                answered += 1;
                if let Some(error) = ResponseError::try_from_code(partition.error_code) {
                    if self.topic_gone(error) {
                        return Err(self.refused(error, partition.error_message.as_ref()));
                    }
                    tracing::debug!(queue = %self.topic, %error, "share fetch partition error");
                    failed += 1;
                    continue;
                }
                self.unknown_topic_since = None;
                let Some(records) = partition.records else { continue };
                collect_acquired(
                    topic.topic_id,
                    partition.partition_index,
                    records,
                    &partition.acquired_records,
                    &mut acquired,
                );
            }
        }
        if answered > 0 && failed == answered {
            // Every partition's leader is moving (an answer without waiting): ask again
            // after a pause, not at once.
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        Ok(acquired)
    }

    /// Whether a fetch's partition `error` means the queue's topic is gone. A leader that
    /// does not know the topic may only not have applied its creation yet (a queue just
    /// declared through another node): that is taken as gone only once it has lasted
    /// [`UNKNOWN_TOPIC_WAIT`].
    fn topic_gone(&mut self, error: ResponseError) -> bool {
        if !matches!(error, ResponseError::UnknownTopicOrPartition | ResponseError::UnknownTopicId) {
            return false;
        }
        let since = *self.unknown_topic_since.get_or_insert_with(Instant::now);
        since.elapsed() >= UNKNOWN_TOPIC_WAIT
    }

    /// The partitions the session fetched that the member is no longer assigned.
    fn forgotten(&self) -> Vec<ForgottenTopic> {
        self.fetching
            .iter()
            .filter_map(|(topic_id, partitions)| {
                let kept =
                    self.assignment.iter().find(|(t, _)| t == topic_id).map(|(_, p)| p.clone()).unwrap_or_default();
                let gone: Vec<i32> = partitions.iter().copied().filter(|p| !kept.contains(p)).collect();
                (!gone.is_empty()).then(|| {
                    let mut forgotten = ForgottenTopic::default();
                    forgotten.topic_id = *topic_id;
                    forgotten.partitions = gone;
                    forgotten
                })
            })
            .collect()
    }

    async fn acknowledge(&mut self, acks: &[(Unacked, Settlement)]) -> Result<(), Refused> {
        self.acknowledge_as(acks, false).await
    }

    /// A ShareAcknowledge of `acks`; `renewing`: they include RENEW (the request says so).
    async fn acknowledge_as(&mut self, acks: &[(Unacked, Settlement)], renewing: bool) -> Result<(), Refused> {
        if !self.has_session() || acks.is_empty() {
            return Ok(());
        }
        let mut request = ShareAcknowledgeRequest::default();
        sluice_protocol::set_share_acknowledge_renew(&mut request, renewing);
        request.group_id = Some(GroupId(StrBytes::from_string(self.topic.clone())));
        request.member_id = Some(StrBytes::from_string(self.member_id.clone()));
        request.share_session_epoch = self.session_epoch;
        let mut topics: BTreeMap<Uuid, AcknowledgeTopic> = BTreeMap::new();
        for ((topic_id, partition), batches) in Self::batches(acks) {
            let topic = topics.entry(topic_id).or_insert_with(|| {
                let mut topic = AcknowledgeTopic::default();
                topic.topic_id = topic_id;
                topic
            });
            let mut entry = AcknowledgePartition::default();
            entry.partition_index = partition;
            entry.acknowledgement_batches = batches
                .into_iter()
                .map(|b| {
                    let mut batch =
                        kafka_protocol::messages::share_acknowledge_request::AcknowledgementBatch::default();
                    batch.first_offset = b.first_offset;
                    batch.last_offset = b.last_offset;
                    batch.acknowledge_types = b.acknowledge_types;
                    batch
                })
                .collect();
            topic.partitions.push(entry);
        }
        request.topics = topics.into_values().collect();
        let answer = self.call(versions::SHARE_ACKNOWLEDGE, RequestKind::ShareAcknowledge(request)).await?;
        self.session_epoch += 1;
        if let ResponseKind::ShareAcknowledge(response) = answer {
            if let Some(error) = ResponseError::try_from_code(response.error_code) {
                self.session_epoch = 0;
                return Err(self.refused(error, response.error_message.as_ref()));
            }
        }
        Ok(())
    }

    /// Closes the share session and leaves the group.
    async fn leave(&mut self) {
        if self.member_epoch == 0 {
            return;
        }
        let mut request = ShareGroupHeartbeatRequest::default();
        request.group_id = GroupId(StrBytes::from_string(self.topic.clone()));
        request.member_id = StrBytes::from_string(self.member_id.clone());
        request.member_epoch = -1;
        let _ = self.call(versions::SHARE_GROUP_HEARTBEAT, RequestKind::ShareGroupHeartbeat(request)).await;
        self.member_epoch = 0;
    }
}

/// The records of `records` (stored batches) inside the `acquired` ranges.
fn collect_acquired(
    topic_id: Uuid,
    partition: i32,
    mut records: Bytes,
    acquired: &[kafka_protocol::messages::share_fetch_response::AcquiredRecords],
    out: &mut Vec<Acquired>,
) {
    let sets = match RecordBatchDecoder::decode_all(&mut records) {
        Ok(sets) => sets,
        Err(error) => {
            tracing::warn!(%error, "undecodable records in a share fetch");
            return;
        }
    };
    for record in sets.into_iter().flat_map(|set| set.records) {
        if record.control {
            continue;
        }
        let Some(range) = acquired.iter().find(|a| a.first_offset <= record.offset && record.offset <= a.last_offset)
        else {
            continue;
        };
        out.push(Acquired { topic_id, partition, offset: record.offset, delivery_count: range.delivery_count, record });
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    use kafka_protocol::messages::share_fetch_response::{PartitionData, ShareFetchableTopicResponse};
    use kafka_protocol::messages::ShareFetchResponse;

    use crate::test_gateway::{Answers, TestGateway};

    /// A leader whose share fetches answer every partition with UNKNOWN_TOPIC_OR_PARTITION.
    #[derive(Default)]
    struct Unaware {
        fetches: AtomicUsize,
    }

    impl Answers for Unaware {
        fn answer(&self, request: &RequestKind) -> Option<ResponseKind> {
            let RequestKind::ShareFetch(request) = request else { return None };
            self.fetches.fetch_add(1, Ordering::SeqCst);
            let mut response = ShareFetchResponse::default();
            for topic in &request.topics {
                let mut answered = ShareFetchableTopicResponse::default();
                answered.topic_id = topic.topic_id;
                for partition in &topic.partitions {
                    let mut part = PartitionData::default();
                    part.partition_index = partition.partition_index;
                    part.error_code = ResponseError::UnknownTopicOrPartition.code();
                    answered.partitions.push(part);
                }
                response.responses.push(answered);
            }
            Some(ResponseKind::ShareFetch(response))
        }
    }

    /// A member of queue "q" assigned its partition 0, fetching from `gateway`.
    fn assigned_member(gateway: Arc<TestGateway<Unaware>>) -> Member {
        let session = Session { principal: "User:ANONYMOUS".into(), peer: "127.0.0.1:5672".parse().unwrap() };
        let mut member = Member::new(gateway, session, "q");
        member.assignment = vec![(Uuid::new_v4(), vec![0])];
        member
    }

    #[tokio::test]
    async fn a_leader_that_does_not_know_the_queue_yet_is_asked_again_not_taken_as_gone() {
        let gateway = Arc::new(TestGateway(Unaware::default()));
        let mut member = assigned_member(gateway.clone());
        for _ in 0..2 {
            let fetched = member.fetch(&[], 1, 0).await.map_err(|refused| refused.1);
            assert_eq!(fetched.map(|records| records.len()), Ok(0));
        }
        assert_eq!(gateway.0.fetches.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_topic_unknown_for_longer_than_the_wait_is_gone() {
        let mut member = assigned_member(Arc::new(TestGateway(Unaware::default())));
        member.unknown_topic_since = Instant::now().checked_sub(UNKNOWN_TOPIC_WAIT);
        let refused = member.fetch(&[], 1, 0).await.err().expect("the queue is gone");
        assert_eq!(refused.0, reply::NOT_FOUND);
    }
}
