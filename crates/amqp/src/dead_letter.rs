//! Dead letters and expiry: what a queue does with a message it gives up on, as RabbitMQ.
//!
//! A queue's arguments say when it gives up — the message was rejected without requeue
//! (`basic.reject`, `basic.nack`), is older than its time to live (`x-message-ttl`, or the
//! message's own `expiration`), or was delivered more often than `x-delivery-limit` allows
//! — and where the message goes: republished to `x-dead-letter-exchange` (with
//! `x-dead-letter-routing-key`, or its own routing key) carrying an `x-death` header that
//! says why, or dropped when the queue has no dead-letter exchange.
//!
//! Why the queue's reader decides: a share group hands out records without looking inside
//! them, and the reader that fetched a record is the first to see it and the one that
//! settles it. A dead letter is stored (a Produce with acks=all, as a publish) before the
//! record is accepted in its own queue, so a crash between the two dead-letters a message
//! twice, never zero times.

use std::collections::BTreeMap;

use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};

use crate::frames::reply;
use crate::messages::{without_expiration, Delivered, Message};
use crate::topology::Refused;

/// The queue argument naming the exchange dead letters are republished to.
pub const ARG_DEAD_LETTER_EXCHANGE: &str = "x-dead-letter-exchange";
/// The queue argument replacing a dead letter's routing key.
pub const ARG_DEAD_LETTER_ROUTING_KEY: &str = "x-dead-letter-routing-key";
/// The queue argument bounding how long a message waits in the queue, in milliseconds.
pub const ARG_MESSAGE_TTL: &str = "x-message-ttl";
/// The queue argument bounding how often a message is returned to the queue.
pub const ARG_DELIVERY_LIMIT: &str = "x-delivery-limit";
/// The header that counts a message's earlier returns on redelivery (RabbitMQ's quorum
/// queues add it).
const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// The most returns `x-delivery-limit` can allow: a share group acquires a record at most
/// 10 times (`share.delivery.count.limit`), and the reader must see the acquisition after
/// the last allowed return to dead-letter it, so limit + 2 acquisitions must fit.
pub const DELIVERY_LIMIT_MAX: u32 = 8;
/// Acquisitions a share group allows at most (Kafka's bound on `share.delivery.count.limit`).
const SHARE_ACQUISITIONS_MAX: u32 = 10;
/// The longest time to live accepted (RabbitMQ's bound: 2^32 - 1 ms).
const TTL_MS_MAX: u64 = u32::MAX as u64;

const _: () = assert!(DELIVERY_LIMIT_MAX + 2 <= SHARE_ACQUISITIONS_MAX);

/// Why a message was dead-lettered (the `reason` of its `x-death` entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Rejected,
    Expired,
    DeliveryLimit,
    /// Dropped from the head of a queue at its `x-max-length`.
    MaxLength,
}

impl Reason {
    fn text(self) -> &'static str {
        match self {
            Reason::Rejected => "rejected",
            Reason::Expired => "expired",
            Reason::DeliveryLimit => "delivery_limit",
            Reason::MaxLength => "maxlen",
        }
    }
}

/// What a queue's arguments say about giving up on messages.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueuePolicy {
    pub dead_letter_exchange: Option<String>,
    pub dead_letter_routing_key: Option<String>,
    pub message_ttl_ms: Option<u64>,
    /// Returns to the queue allowed (`x-delivery-limit`, at most [`DELIVERY_LIMIT_MAX`]).
    pub delivery_limit: u32,
}

fn precondition(text: String) -> Refused {
    Refused(reply::PRECONDITION_FAILED, text)
}

fn number_argument(arguments: &BTreeMap<String, String>, name: &str, max: u64) -> Result<Option<u64>, Refused> {
    let Some(text) = arguments.get(name) else { return Ok(None) };
    match text.parse::<u64>() {
        Ok(n) if n <= max => Ok(Some(n)),
        _ => Err(precondition(format!("invalid arg '{name}': {text} is not a whole number from 0 to {max}"))),
    }
}

impl QueuePolicy {
    /// The policy of a queue declared with `arguments` (as text); a refusal (406) names the
    /// argument that is wrong.
    pub fn parse(arguments: &BTreeMap<String, String>) -> Result<QueuePolicy, Refused> {
        let dead_letter_exchange = arguments.get(ARG_DEAD_LETTER_EXCHANGE).cloned();
        let dead_letter_routing_key = arguments.get(ARG_DEAD_LETTER_ROUTING_KEY).cloned();
        if dead_letter_routing_key.is_some() && dead_letter_exchange.is_none() {
            return Err(precondition(format!(
                "invalid arg '{ARG_DEAD_LETTER_ROUTING_KEY}': it needs '{ARG_DEAD_LETTER_EXCHANGE}'"
            )));
        }
        let message_ttl_ms = number_argument(arguments, ARG_MESSAGE_TTL, TTL_MS_MAX)?;
        let delivery_limit = number_argument(arguments, ARG_DELIVERY_LIMIT, u64::from(u32::MAX))?
            .map_or(DELIVERY_LIMIT_MAX, |n| (n as u32).min(DELIVERY_LIMIT_MAX));
        Ok(QueuePolicy { dead_letter_exchange, dead_letter_routing_key, message_ttl_ms, delivery_limit })
    }

    /// The queue's share group's `share.delivery.count.limit`: one acquisition past the last
    /// allowed return, so the reader sees the record and dead-letters it itself.
    pub fn share_delivery_count_limit(&self) -> i16 {
        (self.delivery_limit + 2) as i16
    }

    /// Whether the reader must keep what it hands out, to dead-letter it on a reject.
    pub fn keeps_rejected(&self) -> bool {
        self.dead_letter_exchange.is_some()
    }

    /// Why a record acquired for the `delivery_count`-th time, stored at `stored_ms`, must
    /// not be delivered (None: deliver it).
    pub fn verdict(&self, message: &Delivered, stored_ms: i64, delivery_count: i16, now_ms: i64) -> Option<Reason> {
        let returns = u32::try_from(delivery_count - 1).unwrap_or(0);
        if returns > self.delivery_limit {
            return Some(Reason::DeliveryLimit);
        }
        let own_ttl = message.properties.expiration().as_ref().and_then(|e| e.as_str().parse::<u64>().ok());
        let ttl = match (self.message_ttl_ms, own_ttl) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        (now_ms.saturating_sub(stored_ms) >= ttl as i64).then_some(Reason::Expired)
    }

    /// The message a dead letter of `queue` is republished as; None when the queue has no
    /// dead-letter exchange (the message is dropped).
    pub fn dead_letter(&self, queue: &str, message: Delivered, reason: Reason, now_ms: i64) -> Option<Message> {
        let exchange = self.dead_letter_exchange.clone()?;
        let routing_key = self.dead_letter_routing_key.clone().unwrap_or_else(|| message.routing_key.clone());
        let mut headers: BTreeMap<ShortString, AMQPValue> =
            message.properties.headers().as_ref().map(|h| h.inner().clone()).unwrap_or_default();
        record_death(&mut headers, queue, &message, reason, now_ms);
        let properties = without_expiration(&message.properties).with_headers(FieldTable::from(headers));
        Some(Message { exchange, routing_key, properties, body: message.body.into() })
    }
}

fn text_value(text: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(text.as_bytes().to_vec()))
}

fn as_text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

/// Adds this death to `headers` as RabbitMQ does: `x-death` holds one table per (queue,
/// reason), newest first, each with a `count`; `x-first-death-*` name the first,
/// `x-last-death-*` the latest.
fn record_death(
    headers: &mut BTreeMap<ShortString, AMQPValue>,
    queue: &str,
    message: &Delivered,
    reason: Reason,
    now_ms: i64,
) {
    let mut deaths: Vec<AMQPValue> = match headers.get("x-death") {
        Some(AMQPValue::FieldArray(array)) => array.as_slice().to_vec(),
        _ => Vec::new(),
    };
    let same = |death: &AMQPValue| match death {
        AMQPValue::FieldTable(table) => {
            table.inner().get("queue").and_then(as_text).as_deref() == Some(queue)
                && table.inner().get("reason").and_then(as_text).as_deref() == Some(reason.text())
        }
        _ => false,
    };
    let earlier = deaths.iter().position(same).map(|i| deaths.remove(i));
    let count = match &earlier {
        Some(AMQPValue::FieldTable(table)) => match table.inner().get("count") {
            Some(AMQPValue::LongLongInt(n)) => n + 1,
            _ => 1,
        },
        _ => 1,
    };
    let mut death = FieldTable::default();
    death.insert("count".into(), AMQPValue::LongLongInt(count));
    death.insert("reason".into(), text_value(reason.text()));
    death.insert("queue".into(), text_value(queue));
    death.insert("time".into(), AMQPValue::Timestamp((now_ms.max(0) / 1000) as u64));
    death.insert("exchange".into(), text_value(&message.exchange));
    let routing_keys = FieldArray::from(vec![text_value(&message.routing_key)]);
    death.insert("routing-keys".into(), AMQPValue::FieldArray(routing_keys));
    if let Some(expiration) = message.properties.expiration() {
        death.insert("original-expiration".into(), text_value(expiration.as_str()));
    }
    deaths.insert(0, AMQPValue::FieldTable(death));
    headers.insert("x-death".into(), AMQPValue::FieldArray(FieldArray::from(deaths)));
    for (prefix, overwrite) in [("x-first-death", false), ("x-last-death", true)] {
        let reason_key = ShortString::from(format!("{prefix}-reason"));
        if !overwrite && headers.contains_key(&reason_key) {
            continue;
        }
        headers.insert(reason_key, text_value(reason.text()));
        headers.insert(format!("{prefix}-queue").into(), text_value(queue));
        headers.insert(format!("{prefix}-exchange").into(), text_value(&message.exchange));
    }
    headers.remove(DELIVERY_COUNT_HEADER);
}

/// `message` as its consumer sees it on its `delivery_count`-th delivery: past the first,
/// with `x-delivery-count` (the returns before this one), as RabbitMQ's quorum queues.
pub fn with_delivery_count(mut message: Delivered, delivery_count: i16) -> Delivered {
    if delivery_count > 1 {
        let mut headers = message.properties.headers().clone().unwrap_or_default();
        headers.insert(DELIVERY_COUNT_HEADER.into(), AMQPValue::LongLongInt(i64::from(delivery_count - 1)));
        message.properties = message.properties.with_headers(headers);
    }
    message
}

#[cfg(test)]
mod tests {
    use amq_protocol::protocol::basic::AMQPProperties;

    use super::*;

    fn arguments(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn message(expiration: Option<&str>) -> Delivered {
        let mut properties = AMQPProperties::default();
        if let Some(expiration) = expiration {
            properties = properties.with_expiration(expiration.to_string().into());
        }
        Delivered { exchange: "orders-x".into(), routing_key: "eu".into(), properties, body: b"b".to_vec() }
    }

    #[test]
    fn arguments_are_checked_as_rabbitmq_checks_them() {
        let only_key = arguments(&[(ARG_DEAD_LETTER_ROUTING_KEY, "k")]);
        assert_eq!(QueuePolicy::parse(&only_key).unwrap_err().0, reply::PRECONDITION_FAILED);
        let negative = arguments(&[(ARG_MESSAGE_TTL, "-1")]);
        assert_eq!(QueuePolicy::parse(&negative).unwrap_err().0, reply::PRECONDITION_FAILED);
        let policy = QueuePolicy::parse(&arguments(&[(ARG_DELIVERY_LIMIT, "20")])).unwrap();
        assert_eq!(policy.delivery_limit, DELIVERY_LIMIT_MAX);
        assert_eq!(policy.share_delivery_count_limit(), SHARE_ACQUISITIONS_MAX as i16);
    }

    #[test]
    fn the_shorter_of_the_queue_and_message_ttl_applies() {
        let policy = QueuePolicy::parse(&arguments(&[(ARG_MESSAGE_TTL, "1000")])).unwrap();
        assert_eq!(policy.verdict(&message(None), 0, 1, 999), None);
        assert_eq!(policy.verdict(&message(None), 0, 1, 1000), Some(Reason::Expired));
        assert_eq!(policy.verdict(&message(Some("10")), 0, 1, 10), Some(Reason::Expired));
        assert_eq!(QueuePolicy::default().verdict(&message(Some("10")), 0, 1, 9), None);
    }

    #[test]
    fn a_record_acquired_past_its_last_allowed_return_is_given_up() {
        let policy = QueuePolicy::parse(&arguments(&[(ARG_DELIVERY_LIMIT, "2")])).unwrap();
        assert_eq!(policy.verdict(&message(None), 0, 3, 0), None);
        assert_eq!(policy.verdict(&message(None), 0, 4, 0), Some(Reason::DeliveryLimit));
    }

    #[test]
    fn a_dead_letter_counts_its_deaths_and_loses_its_expiration() {
        let policy = QueuePolicy::parse(&arguments(&[(ARG_DEAD_LETTER_EXCHANGE, "dlx")])).unwrap();
        let first = policy.dead_letter("q", message(Some("5")), Reason::Expired, 2_000).unwrap();
        assert_eq!(first.exchange, "dlx");
        assert_eq!(first.routing_key, "eu");
        assert!(first.properties.expiration().is_none());
        let again = Delivered {
            exchange: "dlx".into(),
            routing_key: "eu".into(),
            properties: first.properties.clone(),
            body: first.body.to_vec(),
        };
        let second = policy.dead_letter("q", again, Reason::Expired, 3_000).unwrap();
        let headers = second.properties.headers().clone().unwrap();
        let Some(AMQPValue::FieldArray(deaths)) = headers.inner().get("x-death") else { panic!("no x-death") };
        assert_eq!(deaths.as_slice().len(), 1);
        let AMQPValue::FieldTable(death) = &deaths.as_slice()[0] else { panic!("not a table") };
        assert_eq!(death.inner().get("count"), Some(&AMQPValue::LongLongInt(2)));
        assert_eq!(headers.inner().get("x-first-death-exchange").and_then(as_text).as_deref(), Some("orders-x"));
        assert_eq!(headers.inner().get("x-last-death-exchange").and_then(as_text).as_deref(), Some("dlx"));
        assert!(QueuePolicy::default().dead_letter("q", message(None), Reason::Rejected, 0).is_none());
    }
}
