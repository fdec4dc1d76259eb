//! A queue's length limit (`x-max-length`, with RabbitMQ's `x-overflow`): how many ready
//! messages it holds at most, and what one more does. `drop-head` (the default) stores it and
//! then drops the oldest ready messages; `reject-publish` refuses it (a `basic.nack` under
//! publisher confirms; a message routed to several queues still goes to the others). Only
//! ready messages count, as in RabbitMQ: unacknowledged ones are held by consumers.
//!
//! Why dropping goes through the share group: a queue is a topic that Kafka clients may read
//! as a stream too, so its head is archived for the queue's consumers (the records stay in the
//! log until retention) rather than deleted from the log.

use std::collections::BTreeMap;

use kafka_protocol::records::{Record, RecordBatchDecoder};

use crate::dead_letter::{QueuePolicy, Reason};
use crate::frames::reply;
use crate::gateway::{Gateway, QueueDepth};
use crate::messages::{from_record, Message};
use crate::topology::Refused;

/// The most one read of dropped records (to dead-letter them) asks for.
const READ_BYTES_MAX: usize = 16 * 1024 * 1024;

pub const ARG_MAX_LENGTH: &str = "x-max-length";
pub const ARG_MAX_LENGTH_BYTES: &str = "x-max-length-bytes";
pub const ARG_OVERFLOW: &str = "x-overflow";

/// What a queue at its limit does with one more message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    DropHead,
    RejectPublish,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LengthLimit {
    pub max_ready: u64,
    pub overflow: Overflow,
}

impl LengthLimit {
    /// The limit a queue's arguments set, if any; refused (406) as RabbitMQ refuses what it
    /// cannot take, and `x-max-length-bytes` and `reject-publish-dlx`, which are not served.
    pub fn parse(arguments: &BTreeMap<String, String>) -> Result<Option<LengthLimit>, Refused> {
        let refused = |text: String| Err(Refused(reply::PRECONDITION_FAILED, text));
        if arguments.contains_key(ARG_MAX_LENGTH_BYTES) {
            return refused(format!("{ARG_MAX_LENGTH_BYTES} is not supported: limit the queue with {ARG_MAX_LENGTH}"));
        }
        let overflow = match arguments.get(ARG_OVERFLOW).map(String::as_str) {
            None | Some("drop-head") => Overflow::DropHead,
            Some("reject-publish") => Overflow::RejectPublish,
            Some("reject-publish-dlx") => {
                return refused(format!(
                    "{ARG_OVERFLOW} reject-publish-dlx is not supported: drop-head or reject-publish"
                ));
            }
            Some(other) => {
                return refused(format!("invalid arg '{ARG_OVERFLOW}': {other} (drop-head, reject-publish)"))
            }
        };
        let Some(text) = arguments.get(ARG_MAX_LENGTH) else { return Ok(None) };
        match text.parse::<u64>() {
            Ok(max_ready) => Ok(Some(LengthLimit { max_ready, overflow })),
            Err(_) => refused(format!("invalid arg '{ARG_MAX_LENGTH}': {text} is not a whole number from 0")),
        }
    }
}

/// The ready and unacknowledged messages of queue `name` over its `partitions`; `None`
/// unless this node leads every partition.
pub async fn depth(gateway: &dyn Gateway, name: &str, partitions: i32) -> Option<QueueDepth> {
    let mut total = QueueDepth::default();
    for partition in 0..partitions {
        let depth = gateway.queue_depth(name, partition).await?;
        total.ready += depth.ready;
        total.unacknowledged += depth.unacknowledged;
    }
    Some(total)
}

/// How many more messages queue `name` takes now under `limit` (`None`: unknown here, so
/// not enforced).
pub async fn room(gateway: &dyn Gateway, name: &str, partitions: i32, limit: LengthLimit) -> Option<u64> {
    let depth = depth(gateway, name, partitions).await?;
    Some(limit.max_ready.saturating_sub(depth.ready))
}

/// Drops the ready messages of queue `name` beyond `limit`, oldest first within each
/// partition, from the first partition on. Returns, when `policy` has a dead-letter
/// exchange, the dead letters (reason `maxlen`) of what it dropped, for the caller to store:
/// at most once, as RabbitMQ's default dead-lettering.
pub async fn trim(
    gateway: &dyn Gateway,
    name: &str,
    partitions: i32,
    (limit, policy): (LengthLimit, &QueuePolicy),
) -> Vec<Message> {
    debug_assert_eq!(limit.overflow, Overflow::DropHead);
    let mut letters = Vec::new();
    let Some(total) = depth(gateway, name, partitions).await else { return letters };
    let mut excess = total.ready.saturating_sub(limit.max_ready);
    for partition in 0..partitions {
        if excess == 0 {
            break;
        }
        let Some(here) = gateway.queue_depth(name, partition).await else { break };
        let count = excess.min(here.ready);
        if count == 0 {
            continue;
        }
        let Some(dropped) = gateway.drop_ready(name, partition, count).await else {
            tracing::warn!(queue = name, partition, "could not drop messages over the queue's x-max-length");
            break;
        };
        excess = excess.saturating_sub(dropped.len() as u64);
        if policy.dead_letter_exchange.is_some() {
            let now_ms =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
            let records = read_records(gateway, name, partition, &dropped).await;
            letters.extend(
                records
                    .iter()
                    .filter_map(|record| policy.dead_letter(name, from_record(record), Reason::MaxLength, now_ms)),
            );
        }
    }
    letters
}

/// The records of `queue`'s `partition` at `offsets` (ascending), read from this node's log.
async fn read_records(gateway: &dyn Gateway, queue: &str, partition: i32, offsets: &[i64]) -> Vec<Record> {
    let mut found = Vec::with_capacity(offsets.len());
    let mut next = 0;
    while let Some(&from) = offsets.get(next) {
        let Some(mut bytes) = gateway.read_batches(queue, partition, from, READ_BYTES_MAX).await else { break };
        let Ok(sets) = RecordBatchDecoder::decode_all(&mut bytes) else { break };
        let before = next;
        for record in sets.into_iter().flat_map(|set| set.records) {
            while offsets.get(next).is_some_and(|&offset| offset < record.offset) {
                next += 1;
            }
            if offsets.get(next) == Some(&record.offset) {
                next += 1;
                if !record.control {
                    found.push(record);
                }
            }
        }
        if next == before {
            // Nothing at the next offset any more (retention deleted it): past it.
            next += 1;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arguments(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn arguments_set_the_limit_and_what_is_not_served_is_refused() {
        assert_eq!(LengthLimit::parse(&arguments(&[])).unwrap(), None);
        let drop_head = LengthLimit { max_ready: 3, overflow: Overflow::DropHead };
        assert_eq!(LengthLimit::parse(&arguments(&[(ARG_MAX_LENGTH, "3")])).unwrap(), Some(drop_head));
        let reject = arguments(&[(ARG_MAX_LENGTH, "0"), (ARG_OVERFLOW, "reject-publish")]);
        assert_eq!(LengthLimit::parse(&reject).unwrap().unwrap().overflow, Overflow::RejectPublish);
        for bad in [
            arguments(&[(ARG_MAX_LENGTH, "-1")]),
            arguments(&[(ARG_MAX_LENGTH, "many")]),
            arguments(&[(ARG_MAX_LENGTH, "3"), (ARG_OVERFLOW, "drop-tail")]),
            arguments(&[(ARG_MAX_LENGTH, "3"), (ARG_OVERFLOW, "reject-publish-dlx")]),
            arguments(&[(ARG_MAX_LENGTH_BYTES, "1024")]),
        ] {
            let Err(Refused(code, _)) = LengthLimit::parse(&bad) else { panic!("{bad:?} accepted") };
            assert_eq!(code, reply::PRECONDITION_FAILED);
        }
    }
}
