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

use crate::frames::reply;
use crate::gateway::{Gateway, QueueDepth};
use crate::topology::Refused;

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
                return refused(format!("{ARG_OVERFLOW} reject-publish-dlx is not supported: drop-head or reject-publish"));
            }
            Some(other) => return refused(format!("invalid arg '{ARG_OVERFLOW}': {other} (drop-head, reject-publish)")),
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
/// partition, from the first partition on.
pub async fn trim(gateway: &dyn Gateway, name: &str, partitions: i32, limit: LengthLimit) {
    debug_assert_eq!(limit.overflow, Overflow::DropHead);
    for partition in 0..partitions {
        let Some(total) = depth(gateway, name, partitions).await else { return };
        let excess = total.ready.saturating_sub(limit.max_ready);
        if excess == 0 {
            return;
        }
        let Some(here) = gateway.queue_depth(name, partition).await else { return };
        let count = excess.min(here.ready);
        if count > 0 && gateway.drop_ready(name, partition, count).await.is_none() {
            tracing::warn!(queue = name, partition, "could not drop messages over the queue's x-max-length");
            return;
        }
    }
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
