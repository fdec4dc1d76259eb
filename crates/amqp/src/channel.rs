//! One channel: its methods in order, its publishes in batches, its consumers and
//! delivery tags, confirm and transaction modes.
//!
//! Publishes that arrive while a produce is under way wait and go together in the next
//! one (one produce in flight per channel keeps their order), and their confirms follow
//! its answer. A soft error closes the channel with channel.close and the code RabbitMQ
//! sends; its consumers stop and what it held unacknowledged is released (requeued).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{access, basic, channel, confirm, exchange, queue, tx, AMQPClass};
use rand::distr::{Alphanumeric, SampleString};
use tokio::sync::{mpsc, oneshot};

use crate::consumer::{self, ConsumerSpec, Deliveries, Outlet, ReaderCommand, ReaderHandle, Settlement, Unacked};
use crate::dead_letter::QueuePolicy;
use crate::frames::{encode, reply};
use crate::gateway::Session;
use crate::messages::{Delivered, Message};
use crate::publish::{self, Outcome, Partitioner};
use crate::queues;
use crate::topology::{arguments_text, Binding, Destination, Exchange, ExchangeKind, Queue, Refused};
use crate::Server;

/// Publishes one produce carries at most.
const PUBLISH_BATCH_MAX: usize = 1000;

/// A message whose content is complete.
pub struct Published {
    pub message: Message,
    pub mandatory: bool,
}

/// The publishes and settlements of an open transaction, applied at commit.
#[derive(Default)]
struct Transaction {
    publishes: Vec<Published>,
    settlements: Vec<(Unacked, Settlement)>,
}

/// What the connection hands a channel.
pub enum ChannelInput {
    Method(AMQPClass),
    Publish(Box<Published>),
    /// Close the channel with this soft error: (code, text, class id, method id).
    Refuse(u16, String, u16, u16),
    /// The client closed the channel: release, answer close-ok, end.
    Close,
    /// The connection is going (or the client confirmed our close): release and end.
    Stop,
}

pub struct Channel {
    id: u16,
    server: Arc<Server>,
    session: Session,
    connection: u64,
    outlet: Outlet,
    closing: Arc<AtomicBool>,
    deliveries: Arc<Deliveries>,
    consumers: HashMap<String, ReaderHandle>,
    /// Readers of cancelled consumers, until the client settled what they handed out.
    cancelled: HashMap<u64, ReaderHandle>,
    /// One reader per queue for `basic.get`.
    getters: HashMap<String, ReaderHandle>,
    /// `basic.qos` prefetch for consumers started after it (0: no limit).
    prefetch: u32,
    /// The last queue declared on this channel (an empty queue name means it).
    last_queue: Option<String>,
    confirm: bool,
    /// The delivery tag of the last publish (confirm mode counts them).
    published: u64,
    /// In transaction mode: the open transaction.
    transaction: Option<Transaction>,
    partitioner: Partitioner,
    pending: VecDeque<ChannelInput>,
}

impl Channel {
    pub fn new(
        id: u16,
        server: Arc<Server>,
        session: Session,
        connection: u64,
        outbox: mpsc::Sender<Vec<u8>>,
        frame_max: u32,
        closing: Arc<AtomicBool>,
    ) -> Channel {
        Channel {
            id,
            server,
            session,
            connection,
            outlet: Outlet { outbox, channel: id, frame_max },
            closing,
            deliveries: Arc::new(Deliveries::default()),
            consumers: HashMap::new(),
            cancelled: HashMap::new(),
            getters: HashMap::new(),
            prefetch: 0,
            last_queue: None,
            confirm: false,
            published: 0,
            transaction: None,
            partitioner: Partitioner::default(),
            pending: VecDeque::new(),
        }
    }

    async fn send(&self, method: AMQPClass) {
        let _ = self.outlet.outbox.send(encode(&AMQPFrame::Method(self.id, method))).await;
    }

    pub async fn run(mut self, mut inputs: mpsc::Receiver<ChannelInput>) {
        self.send(AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {}))).await;
        loop {
            let input = match self.pending.pop_front() {
                Some(input) => input,
                None => match inputs.recv().await {
                    Some(input) => input,
                    None => break,
                },
            };
            let outcome = match input {
                ChannelInput::Publish(first) => {
                    let batch = self.gather_publishes(*first, &mut inputs);
                    self.publish(batch).await
                }
                ChannelInput::Method(method) => self.method(method).await,
                ChannelInput::Refuse(code, text, class_id, method_id) => {
                    Err((Refused(code, text), class_id, method_id))
                }
                ChannelInput::Close => {
                    self.release().await;
                    self.send(AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {}))).await;
                    return;
                }
                ChannelInput::Stop => break,
            };
            match outcome {
                Ok(()) => {}
                Err((Refused(code, text), class_id, method_id)) => {
                    self.refuse(code, &text, class_id, method_id).await;
                    // Frames until close-ok are dropped by the connection; wait for its word.
                    while let Some(input) = inputs.recv().await {
                        if matches!(input, ChannelInput::Stop | ChannelInput::Close) {
                            break;
                        }
                    }
                    return;
                }
            }
        }
        self.release().await;
    }

    /// Closes the channel from this side with a soft error.
    async fn refuse(&mut self, code: u16, text: &str, class_id: u16, method_id: u16) {
        tracing::debug!(channel = self.id, code, %text, "AMQP channel closed by the server");
        self.closing.store(true, Ordering::Release);
        self.release().await;
        let text: String = text.chars().take(250).collect();
        let close = channel::Close { reply_code: code, reply_text: text.into(), class_id, method_id };
        self.send(AMQPClass::Channel(channel::AMQPMethod::Close(close))).await;
    }

    /// Stops every reader (what they handed out and was not acknowledged goes back).
    async fn release(&mut self) {
        let held = self.deliveries.take_all();
        self.settle(held.into_iter().map(|(_, u)| (u, Settlement::Release)).collect());
        let consumers: Vec<ReaderHandle> = self.consumers.drain().map(|(_, r)| r).collect();
        for reader in self.getters.drain().map(|(_, r)| r).chain(self.cancelled.drain().map(|(_, r)| r)) {
            let _ = reader.commands.send(ReaderCommand::Stop);
        }
        for reader in consumers {
            let _ = reader.commands.send(ReaderCommand::Stop);
            let left = self.server.queues.consumer_removed(&reader.queue);
            self.auto_delete(&reader.queue, left).await;
        }
    }

    /// The first publish and those queued right behind it, up to a batch; any other input
    /// met on the way waits its turn.
    fn gather_publishes(&mut self, first: Published, inputs: &mut mpsc::Receiver<ChannelInput>) -> Vec<Published> {
        let mut batch = vec![first];
        while batch.len() < PUBLISH_BATCH_MAX {
            match inputs.try_recv() {
                Ok(ChannelInput::Publish(next)) => batch.push(*next),
                Ok(other) => {
                    self.pending.push_back(other);
                    break;
                }
                Err(_) => break,
            }
        }
        batch
    }

    async fn publish(&mut self, batch: Vec<Published>) -> Result<(), (Refused, u16, u16)> {
        let first_tag = self.published + 1;
        if self.confirm {
            self.published += batch.len() as u64;
        }
        if let Some(transaction) = self.transaction.as_mut() {
            transaction.publishes.extend(batch);
            return Ok(());
        }
        let messages: Vec<Message> = batch.iter().map(|p| p.message.clone()).collect();
        let outcomes = publish::publish(&self.server, Some(&self.session), &mut self.partitioner, &messages)
            .await
            .map_err(|refused| (refused, 60, 40))?;
        for (published, outcome) in batch.iter().zip(&outcomes) {
            if *outcome == Outcome::Unroutable && published.mandatory {
                self.return_unroutable(&published.message).await;
            }
        }
        if self.confirm {
            self.confirm_batch(first_tag, &outcomes).await;
        }
        Ok(())
    }

    async fn return_unroutable(&self, message: &Message) {
        let method = AMQPClass::Basic(basic::AMQPMethod::Return(basic::Return {
            reply_code: reply::NO_ROUTE,
            reply_text: "NO_ROUTE".into(),
            exchange: message.exchange.clone().into(),
            routing_key: message.routing_key.clone().into(),
        }));
        let delivered = Delivered {
            exchange: message.exchange.clone(),
            routing_key: message.routing_key.clone(),
            properties: message.properties.clone(),
            body: message.body.to_vec(),
        };
        let _ = self.outlet.outbox.send(consumer::content_frames(&self.outlet, method, &delivered)).await;
    }

    /// Acks (or nacks) the publishes tagged from `first_tag` on: one ack for all when all
    /// were stored.
    async fn confirm_batch(&self, first_tag: u64, outcomes: &[Outcome]) {
        let last_tag = first_tag + outcomes.len() as u64 - 1;
        let mut frames = Vec::new();
        if outcomes.iter().all(|o| !matches!(o, Outcome::Failed | Outcome::Rejected)) {
            let ack = basic::Ack { delivery_tag: last_tag, multiple: true };
            frames.extend(encode(&AMQPFrame::Method(self.id, AMQPClass::Basic(basic::AMQPMethod::Ack(ack)))));
        } else {
            for (i, outcome) in outcomes.iter().enumerate() {
                let delivery_tag = first_tag + i as u64;
                let method = match outcome {
                    Outcome::Failed | Outcome::Rejected => {
                        basic::AMQPMethod::Nack(basic::Nack { delivery_tag, multiple: false, requeue: false })
                    }
                    _ => basic::AMQPMethod::Ack(basic::Ack { delivery_tag, multiple: false }),
                };
                frames.extend(encode(&AMQPFrame::Method(self.id, AMQPClass::Basic(method))));
            }
        }
        let _ = self.outlet.outbox.send(frames).await;
    }

    /// Sends each settlement to the reader that fetched the record.
    fn settle(&self, settlements: Vec<(Unacked, Settlement)>) {
        let mut by_reader: HashMap<u64, Vec<(Unacked, Settlement)>> = HashMap::new();
        for (unacked, settlement) in settlements {
            by_reader.entry(unacked.reader).or_default().push((unacked, settlement));
        }
        for (reader, settled) in by_reader {
            let mut readers = self.consumers.values().chain(self.getters.values()).chain(self.cancelled.values());
            if let Some(handle) = readers.find(|r| r.id == reader) {
                let _ = handle.commands.send(ReaderCommand::Settle(settled));
            }
        }
    }

    /// Runs one method; a refusal closes the channel with its code.
    async fn method(&mut self, method: AMQPClass) -> Result<(), (Refused, u16, u16)> {
        let (class_id, method_id) = (method.get_amqp_class_id(), method.get_amqp_method_id());
        let at = |refused: Refused| (refused, class_id, method_id);
        match method {
            AMQPClass::Exchange(method) => self.exchange_method(method).await.map_err(at)?,
            AMQPClass::Queue(method) => self.queue_method(method).await.map_err(at)?,
            AMQPClass::Basic(method) => self.basic_method(method).await.map_err(at)?,
            AMQPClass::Confirm(confirm::AMQPMethod::Select(select)) => {
                if self.transaction.is_some() {
                    return Err(at(Refused(
                        reply::PRECONDITION_FAILED,
                        "cannot switch from tx to confirm mode".into(),
                    )));
                }
                self.confirm = true;
                if !select.nowait {
                    self.send(AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {}))).await;
                }
            }
            AMQPClass::Tx(method) => self.tx_method(method).await.map_err(at)?,
            AMQPClass::Channel(channel::AMQPMethod::Flow(flow)) => {
                let ok = channel::FlowOk { active: flow.active };
                self.send(AMQPClass::Channel(channel::AMQPMethod::FlowOk(ok))).await;
            }
            AMQPClass::Channel(channel::AMQPMethod::FlowOk(_)) => {}
            AMQPClass::Access(access::AMQPMethod::Request(_)) => {
                self.send(AMQPClass::Access(access::AMQPMethod::RequestOk(access::RequestOk {}))).await;
            }
            _ => {
                return Err(at(Refused(
                    reply::COMMAND_INVALID,
                    format!("method {class_id}.{method_id} not valid here"),
                )));
            }
        }
        Ok(())
    }

    fn check_routing_allowed(&self) -> Result<(), Refused> {
        if !self.server.gateway.may_configure_routing(&self.session) {
            return Err(Refused(
                reply::ACCESS_REFUSED,
                format!(
                    "access to exchanges and bindings refused for {} (needs CREATE on the cluster)",
                    self.session.principal
                ),
            ));
        }
        Ok(())
    }

    async fn exchange_method(&mut self, method: exchange::AMQPMethod) -> Result<(), Refused> {
        let topology = &self.server.topology;
        match method {
            exchange::AMQPMethod::Declare(declare) => {
                let name = declare.exchange.as_str();
                if declare.passive {
                    if topology.exchange(name).is_none() {
                        return Err(Refused(reply::NOT_FOUND, format!("no exchange '{name}' in vhost '/'")));
                    }
                } else {
                    let Some(kind) = ExchangeKind::parse(declare.kind.as_str()) else {
                        return Err(Refused(
                            reply::COMMAND_INVALID,
                            format!(
                                "invalid exchange type '{}' (direct, fanout, topic, headers)",
                                declare.kind.as_str()
                            ),
                        ));
                    };
                    if topology.exchange(name).is_none() {
                        self.check_routing_allowed()?;
                    }
                    let exchange = Exchange {
                        kind,
                        durable: declare.durable,
                        auto_delete: declare.auto_delete,
                        internal: declare.internal,
                    };
                    topology.declare_exchange(name, exchange).await?;
                }
                if !declare.nowait {
                    self.send(AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(exchange::DeclareOk {}))).await;
                }
            }
            exchange::AMQPMethod::Delete(delete) => {
                self.check_routing_allowed()?;
                topology.delete_exchange(delete.exchange.as_str(), delete.if_unused).await?;
                if !delete.nowait {
                    self.send(AMQPClass::Exchange(exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {}))).await;
                }
            }
            exchange::AMQPMethod::Bind(bind) => {
                self.check_routing_allowed()?;
                let binding = Binding::new(
                    bind.source.as_str(),
                    Destination::Exchange(bind.destination.as_str().to_string()),
                    bind.routing_key.as_str(),
                    &bind.arguments,
                );
                topology.bind(binding).await?;
                if !bind.nowait {
                    self.send(AMQPClass::Exchange(exchange::AMQPMethod::BindOk(exchange::BindOk {}))).await;
                }
            }
            exchange::AMQPMethod::Unbind(unbind) => {
                self.check_routing_allowed()?;
                let binding = Binding::new(
                    unbind.source.as_str(),
                    Destination::Exchange(unbind.destination.as_str().to_string()),
                    unbind.routing_key.as_str(),
                    &unbind.arguments,
                );
                topology.unbind(&binding).await?;
                if !unbind.nowait {
                    self.send(AMQPClass::Exchange(exchange::AMQPMethod::UnbindOk(exchange::UnbindOk {}))).await;
                }
            }
            _ => return Err(Refused(reply::COMMAND_INVALID, "a server method sent by the client".into())),
        }
        Ok(())
    }

    /// The queue a method names: an empty name is the last one declared on this channel.
    fn queue_name(&self, name: &str) -> Result<String, Refused> {
        if !name.is_empty() {
            return Ok(name.to_string());
        }
        self.last_queue
            .clone()
            .ok_or_else(|| Refused(reply::NOT_FOUND, "no previously declared queue on this channel".into()))
    }

    /// A queue this connection may use: declared and not another connection's exclusive one.
    fn existing_queue(&self, name: &str) -> Result<Queue, Refused> {
        let queue = self
            .server
            .topology
            .queue(name)
            .ok_or_else(|| Refused(reply::NOT_FOUND, format!("no queue '{name}' in vhost '/'")))?;
        self.server.queues.check_access(name, self.connection)?;
        Ok(queue)
    }

    async fn queue_method(&mut self, method: queue::AMQPMethod) -> Result<(), Refused> {
        match method {
            queue::AMQPMethod::Declare(declare) => self.declare_queue(declare).await?,
            queue::AMQPMethod::Bind(bind) => {
                self.check_routing_allowed()?;
                let name = self.queue_name(bind.queue.as_str())?;
                self.existing_queue(&name)?;
                let binding = Binding::new(
                    bind.exchange.as_str(),
                    Destination::Queue(name),
                    bind.routing_key.as_str(),
                    &bind.arguments,
                );
                self.server.topology.bind(binding).await?;
                if !bind.nowait {
                    self.send(AMQPClass::Queue(queue::AMQPMethod::BindOk(queue::BindOk {}))).await;
                }
            }
            queue::AMQPMethod::Unbind(unbind) => {
                self.check_routing_allowed()?;
                let name = self.queue_name(unbind.queue.as_str())?;
                let binding = Binding::new(
                    unbind.exchange.as_str(),
                    Destination::Queue(name),
                    unbind.routing_key.as_str(),
                    &unbind.arguments,
                );
                self.server.topology.unbind(&binding).await?;
                self.send(AMQPClass::Queue(queue::AMQPMethod::UnbindOk(queue::UnbindOk {}))).await;
            }
            queue::AMQPMethod::Purge(purge) => {
                let name = self.queue_name(purge.queue.as_str())?;
                let queue = self.existing_queue(&name)?;
                let partitions = queues::partitions(&queue.arguments)?;
                let purged = queues::purge(&*self.server.gateway, &self.session, &name, partitions).await?;
                if !purge.nowait {
                    let ok = queue::PurgeOk { message_count: purged.min(u32::MAX as u64) as u32 };
                    self.send(AMQPClass::Queue(queue::AMQPMethod::PurgeOk(ok))).await;
                }
            }
            queue::AMQPMethod::Delete(delete) => {
                let name = self.queue_name(delete.queue.as_str())?;
                let mut deleted_messages = 0;
                if let Some(queue) = self.server.topology.queue(&name) {
                    self.server.queues.check_access(&name, self.connection)?;
                    if delete.if_unused && self.server.queues.consumers(&name) > 0 {
                        return Err(Refused(reply::PRECONDITION_FAILED, format!("queue '{name}' in vhost '/' in use")));
                    }
                    let partitions = queues::partitions(&queue.arguments)?;
                    deleted_messages =
                        queues::message_count(&*self.server.gateway, &self.session, &name, partitions).await;
                    queues::delete_topic(&*self.server.gateway, Some(&self.session), &name).await?;
                    self.server.topology.forget_queue(&name).await?;
                    self.server.queues.forget(&name);
                    self.server.delivered.forget(&name);
                }
                if !delete.nowait {
                    let ok = queue::DeleteOk { message_count: deleted_messages };
                    self.send(AMQPClass::Queue(queue::AMQPMethod::DeleteOk(ok))).await;
                }
            }
            _ => return Err(Refused(reply::COMMAND_INVALID, "a server method sent by the client".into())),
        }
        Ok(())
    }

    async fn declare_queue(&mut self, declare: queue::Declare) -> Result<(), Refused> {
        let name = match declare.queue.as_str() {
            "" => format!("amq.gen-{}", Alphanumeric.sample_string(&mut rand::rng(), 22)),
            name if name.starts_with("amq.") && !declare.passive => {
                return Err(Refused(
                    reply::ACCESS_REFUSED,
                    format!("queue name '{name}' contains reserved prefix 'amq.*'"),
                ));
            }
            name => name.to_string(),
        };
        if declare.passive {
            self.existing_queue(&name)?;
        } else {
            queues::check_name(&name)?;
            self.server.queues.check_access(&name, self.connection)?;
            let arguments = arguments_text(&declare.arguments);
            let partitions = queues::partitions(&arguments)?;
            queues::expires_ms(&arguments)?;
            crate::length_limit::LengthLimit::parse(&arguments)?;
            let policy = QueuePolicy::parse(&arguments)?;
            if policy.dead_letter_exchange.is_some() {
                // Dead letters are republished by the broker: naming where they go is routing.
                self.check_routing_allowed()?;
            }
            let known = self.server.topology.queue(&name).is_some();
            let created = queues::create_topic(&*self.server.gateway, &self.session, &name, partitions).await?;
            if created || !known {
                queues::configure_share_group(&*self.server.gateway, &name, policy.share_delivery_count_limit())
                    .await?;
            }
            let queue = Queue {
                durable: declare.durable,
                exclusive: declare.exclusive,
                auto_delete: declare.auto_delete,
                arguments,
            };
            self.server.topology.declare_queue(&name, queue).await?;
            if declare.exclusive {
                self.server.queues.claim(&name, self.connection);
            }
        }
        self.last_queue = Some(name.clone());
        self.server.queues.touch(&name);
        if !declare.nowait {
            let consumer_count = self.server.queues.consumers(&name) as u32;
            let partitions = self.server.topology.queue(&name).map_or(Ok(1), |q| queues::partitions(&q.arguments))?;
            let message_count = queues::message_count(&*self.server.gateway, &self.session, &name, partitions).await;
            let ok = queue::DeclareOk { queue: name.into(), message_count, consumer_count };
            self.send(AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok))).await;
        }
        Ok(())
    }

    async fn basic_method(&mut self, method: basic::AMQPMethod) -> Result<(), Refused> {
        match method {
            basic::AMQPMethod::Qos(qos) => {
                if qos.global {
                    self.deliveries.set_channel_prefetch(u32::from(qos.prefetch_count));
                } else {
                    self.prefetch = u32::from(qos.prefetch_count);
                }
                self.send(AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {}))).await;
            }
            basic::AMQPMethod::Consume(consume) => self.consume(consume).await?,
            basic::AMQPMethod::Cancel(cancel) => {
                let tag = cancel.consumer_tag.as_str().to_string();
                if let Some(reader) = self.consumers.remove(&tag) {
                    let _ = reader.commands.send(ReaderCommand::Cancel);
                    let left = self.server.queues.consumer_removed(&reader.queue);
                    let queue = reader.queue.clone();
                    self.cancelled.insert(reader.id, reader);
                    self.auto_delete(&queue, left).await;
                }
                if !cancel.nowait {
                    let ok = basic::CancelOk { consumer_tag: tag.into() };
                    self.send(AMQPClass::Basic(basic::AMQPMethod::CancelOk(ok))).await;
                }
            }
            basic::AMQPMethod::Get(get) => self.get(get).await?,
            basic::AMQPMethod::Ack(ack) => self.settle_tags(ack.delivery_tag, ack.multiple, Settlement::Accept)?,
            basic::AMQPMethod::Nack(nack) => {
                let settlement = if nack.requeue { Settlement::Release } else { Settlement::Reject };
                self.settle_tags(nack.delivery_tag, nack.multiple, settlement)?;
            }
            basic::AMQPMethod::Reject(reject) => {
                let settlement = if reject.requeue { Settlement::Release } else { Settlement::Reject };
                self.settle_tags(reject.delivery_tag, false, settlement)?;
            }
            basic::AMQPMethod::Recover(_) => {
                self.release_held();
                self.send(AMQPClass::Basic(basic::AMQPMethod::RecoverOk(basic::RecoverOk {}))).await;
            }
            basic::AMQPMethod::RecoverAsync(_) => self.release_held(),
            _ => return Err(Refused(reply::COMMAND_INVALID, "a server method sent by the client".into())),
        }
        Ok(())
    }

    /// Requeues everything the client holds unacknowledged on this channel.
    fn release_held(&self) {
        let held = self.deliveries.take_all();
        self.settle(held.into_iter().map(|(_, u)| (u, Settlement::Release)).collect());
    }

    fn settle_tags(&mut self, tag: u64, multiple: bool, settlement: Settlement) -> Result<(), Refused> {
        let taken = self
            .deliveries
            .take(tag, multiple)
            .ok_or_else(|| Refused(reply::PRECONDITION_FAILED, format!("unknown delivery tag {tag}")))?;
        let settled = taken.into_iter().map(|(_, u)| (u, settlement));
        match self.transaction.as_mut() {
            Some(transaction) => transaction.settlements.extend(settled),
            None => self.settle(settled.collect()),
        }
        Ok(())
    }

    async fn consume(&mut self, consume: basic::Consume) -> Result<(), Refused> {
        let name = self.queue_name(consume.queue.as_str())?;
        let policy = QueuePolicy::parse(&self.existing_queue(&name)?.arguments)?;
        let tag = match consume.consumer_tag.as_str() {
            "" => format!("amq.ctag-{}", Alphanumeric.sample_string(&mut rand::rng(), 22)),
            tag => tag.to_string(),
        };
        if self.consumers.contains_key(&tag) {
            return Err(Refused(reply::NOT_ALLOWED, format!("attempt to reuse consumer tag '{tag}'")));
        }
        self.server.queues.consumer_added(&name, consume.exclusive)?;
        let spec = ConsumerSpec { tag: tag.clone(), no_ack: consume.no_ack, prefetch: self.prefetch };
        let (joined, joined_answer) = oneshot::channel();
        let (go, go_answer) = oneshot::channel();
        let reader = consumer::start(
            self.server.clone(),
            self.session.clone(),
            name.clone(),
            policy,
            self.deliveries.clone(),
            self.outlet.clone(),
            Some((spec, consumer::Start { joined, go: go_answer })),
        );
        let joined = joined_answer
            .await
            .unwrap_or_else(|_| Err(Refused(reply::INTERNAL_ERROR, "the queue reader stopped".into())));
        if let Err(refused) = joined {
            self.server.queues.consumer_removed(&name);
            return Err(refused);
        }
        if !consume.nowait {
            let ok = basic::ConsumeOk { consumer_tag: tag.clone().into() };
            self.send(AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(ok))).await;
        }
        let _ = go.send(());
        self.consumers.insert(tag, reader);
        Ok(())
    }

    async fn get(&mut self, get: basic::Get) -> Result<(), Refused> {
        let name = self.queue_name(get.queue.as_str())?;
        let arguments = self.existing_queue(&name)?.arguments;
        let policy = QueuePolicy::parse(&arguments)?;
        let partitions = queues::partitions(&arguments)?;
        self.server.queues.touch(&name);
        let reader = self.getters.entry(name.clone()).or_insert_with(|| {
            consumer::start(
                self.server.clone(),
                self.session.clone(),
                name.clone(),
                policy,
                self.deliveries.clone(),
                self.outlet.clone(),
                None,
            )
        });
        let (reply, answer) = oneshot::channel();
        let _ = reader.commands.send(ReaderCommand::Get { reply, no_ack: get.no_ack });
        let got = answer.await.map_err(|_| Refused(reply::INTERNAL_ERROR, "the queue reader stopped".into()))??;
        match got {
            None => self.send(AMQPClass::Basic(basic::AMQPMethod::GetEmpty(basic::GetEmpty {}))).await,
            Some(got) => {
                // Those left: the ready ones (this one is not, whether held or acknowledged on
                // receipt); where only the unsettled ones are known, those but this one unless
                // acknowledged on receipt (the reader settles those before it answers).
                let gateway = &*self.server.gateway;
                let left = match queues::ready_count(gateway, &name, partitions).await {
                    Some(ready) => ready,
                    None => {
                        let unsettled = queues::message_count(gateway, &self.session, &name, partitions).await;
                        if get.no_ack {
                            unsettled
                        } else {
                            unsettled.saturating_sub(1)
                        }
                    }
                };
                let method = AMQPClass::Basic(basic::AMQPMethod::GetOk(basic::GetOk {
                    delivery_tag: got.delivery_tag,
                    redelivered: got.redelivered,
                    exchange: got.message.exchange.clone().into(),
                    routing_key: got.message.routing_key.clone().into(),
                    message_count: left,
                }));
                let _ = self.outlet.outbox.send(consumer::content_frames(&self.outlet, method, &got.message)).await;
            }
        }
        Ok(())
    }

    async fn tx_method(&mut self, method: tx::AMQPMethod) -> Result<(), Refused> {
        match method {
            tx::AMQPMethod::Select(_) => {
                if self.confirm {
                    return Err(Refused(reply::PRECONDITION_FAILED, "cannot switch from confirm to tx mode".into()));
                }
                self.transaction.get_or_insert_with(Transaction::default);
                self.send(AMQPClass::Tx(tx::AMQPMethod::SelectOk(tx::SelectOk {}))).await;
            }
            tx::AMQPMethod::Commit(_) => {
                let Some(transaction) = self.transaction.replace(Transaction::default()) else {
                    return Err(Refused(reply::PRECONDITION_FAILED, "channel is not transactional".into()));
                };
                self.commit(transaction).await?;
                self.send(AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {}))).await;
            }
            tx::AMQPMethod::Rollback(_) => {
                if self.transaction.replace(Transaction::default()).is_none() {
                    return Err(Refused(reply::PRECONDITION_FAILED, "channel is not transactional".into()));
                }
                self.send(AMQPClass::Tx(tx::AMQPMethod::RollbackOk(tx::RollbackOk {}))).await;
            }
            _ => return Err(Refused(reply::COMMAND_INVALID, "a server method sent by the client".into())),
        }
        Ok(())
    }

    /// A transaction's publishes, stored together, then its settlements.
    async fn commit(&mut self, transaction: Transaction) -> Result<(), Refused> {
        for chunk in transaction.publishes.chunks(PUBLISH_BATCH_MAX) {
            let messages: Vec<Message> = chunk.iter().map(|p| p.message.clone()).collect();
            let outcomes =
                publish::publish(&self.server, Some(&self.session), &mut self.partitioner, &messages).await?;
            if outcomes.contains(&Outcome::Failed) {
                return Err(Refused(reply::INTERNAL_ERROR, "a queue refused a message of the transaction".into()));
            }
            for (published, outcome) in chunk.iter().zip(&outcomes) {
                if *outcome == Outcome::Unroutable && published.mandatory {
                    self.return_unroutable(&published.message).await;
                }
            }
        }
        self.settle(transaction.settlements);
        Ok(())
    }

    /// Deletes an auto-delete queue whose last consumer went.
    async fn auto_delete(&self, queue: &str, consumers_left: usize) {
        self.server.queues.touch(queue);
        if consumers_left > 0 {
            return;
        }
        if self.server.topology.queue(queue).is_some_and(|q| q.auto_delete) {
            delete_lapsed_queue(&self.server, queue).await;
        }
    }
}

/// Deletes a queue that goes by itself — with its connection (exclusive), its last consumer
/// (auto-delete) or unused past its `x-expires` — as the broker: its declaration was allowed.
pub async fn delete_lapsed_queue(server: &Server, queue: &str) {
    if let Err(Refused(_, text)) = queues::delete_topic(&*server.gateway, None, queue).await {
        tracing::warn!(%queue, %text, "could not delete the topic of a queue that ended with its connection");
    }
    let _ = server.topology.forget_queue(queue).await;
    server.queues.forget(queue);
    server.delivered.forget(queue);
}
