//! Where each request of the AMQP front door is answered, in a cluster.
//!
//! An AMQP client may connect to any node, and its queues may be led by others. The front
//! door builds the Kafka requests a Kafka client would; this module sends each part of one
//! to the node that serves it, as a Kafka client would after a metadata lookup: a partition's
//! records to its leader (Produce, ShareFetch, ShareAcknowledge, ListOffsets,
//! DeleteRecords), a share group's membership to its coordinator (ShareGroupHeartbeat,
//! DescribeShareGroupOffsets). Parts for another node travel in an Envelope with the AMQP
//! user's principal (`handlers/envelope.rs`), so that node authorizes them as the user.
//! Everything else (Metadata, topic administration, configs) is answered here; this node
//! forwards administration to the controller itself.
//!
//! A part whose node cannot be reached, or whose leader is unknown, is answered here: this
//! node then says NOT_LEADER_OR_FOLLOWER or NOT_COORDINATOR, which the front door treats as
//! a Kafka client does (it retries after a pause). A publish retries
//! UNKNOWN_TOPIC_OR_PARTITION too, for a while: each node applies the cluster metadata at its
//! own pace, so the leader this node names may not have applied the creation of a queue's
//! topic yet.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use sluice_cluster::{ClusterMetadata, NO_LEADER};
use sluice_coordinator::txn::markers::PeerPool;
use uuid::Uuid;

use crate::handlers::envelope;
use crate::Broker;

/// How long a forwarded request may take, beyond the wait it asks for itself (a produce's
/// timeout, a share fetch's `max_wait_ms`).
const FORWARD_TIMEOUT_MARGIN: Duration = Duration::from_secs(15);

/// Which node answers a part of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Target {
    Here,
    Node(i32),
}

/// A request cut into the parts each node answers.
pub(crate) type Parts = BTreeMap<Target, RequestKind>;

/// Sends parts to other nodes over pooled inter-broker connections.
#[derive(Default)]
pub(crate) struct Forwarder {
    peers: PeerPool,
}

impl Forwarder {
    /// `request` answered by `node` as `principal`; `None` if that node could not be asked.
    pub(crate) async fn forward(
        &self,
        broker: &Arc<Broker>,
        node: i32,
        (principal, peer): (&str, SocketAddr),
        (api_key, api_version): (ApiKey, i16),
        request: RequestKind,
    ) -> Option<ResponseKind> {
        let timeout = own_wait(&request) + FORWARD_TIMEOUT_MARGIN;
        let wrapped = envelope::wrap(principal, peer, api_key, api_version, &request)
            .map_err(|error| tracing::warn!(%error, ?api_key, "a request for another node does not encode"))
            .ok()?;
        let host: &dyn sluice_coordinator::CoordinatorHost = &**broker;
        let answer = self
            .peers
            .call(host, node, ApiKey::Envelope, envelope::ENVELOPE_VERSION, &wrapped, timeout)
            .await
            .map_err(|error| tracing::debug!(node, %error, ?api_key, "a forwarded request failed"))
            .ok()?;
        envelope::unwrap(api_key, api_version, answer)
            .map_err(|error| tracing::debug!(node, %error, ?api_key, "a forwarded request was not answered"))
            .ok()
    }
}

/// How long `request` may wait at its node by its own terms.
fn own_wait(request: &RequestKind) -> Duration {
    let millis = match request {
        RequestKind::Produce(r) => r.timeout_ms,
        RequestKind::ShareFetch(r) => r.max_wait_ms,
        _ => 0,
    };
    Duration::from_millis(u64::try_from(millis).unwrap_or(0))
}

/// Where a partition's requests go: its leader, or here when it has none or is led here.
pub(crate) fn leader(metadata: &ClusterMetadata, here: i32, topic: &str, partition: i32) -> Target {
    let leader = metadata
        .topics
        .get(topic)
        .and_then(|info| info.partitions.get(usize::try_from(partition).ok()?))
        .map_or(NO_LEADER, |info| info.leader);
    if leader == NO_LEADER || leader == here {
        Target::Here
    } else {
        Target::Node(leader)
    }
}

fn topic_name(metadata: &ClusterMetadata, topic_id: Uuid) -> Option<&str> {
    metadata.topics.iter().find(|(_, info)| info.topic_id == topic_id).map(|(name, _)| name.as_str())
}

/// Where a group's membership requests go: its coordinator (the leader of its partition of
/// the offsets topic), or here.
fn coordinator(metadata: &ClusterMetadata, here: i32, group: &str) -> Target {
    let topic = sluice_coordinator::group::OFFSETS_TOPIC;
    let Some(info) = metadata.topics.get(topic) else { return Target::Here };
    let Ok(count) = i32::try_from(info.partitions.len()) else { return Target::Here };
    if count == 0 {
        return Target::Here;
    }
    leader(metadata, here, topic, sluice_coordinator::placement::partition_for(group, count))
}

/// Groups `items` by the target `of` each; the order within a target is kept.
fn group_by<T>(items: Vec<T>, mut of: impl FnMut(&T) -> Target) -> BTreeMap<Target, Vec<T>> {
    let mut groups: BTreeMap<Target, Vec<T>> = BTreeMap::new();
    for item in items {
        groups.entry(of(&item)).or_default().push(item);
    }
    groups
}

/// Splits the partitions of each topic of `topics` by target, keeping each topic's other
/// fields: `partitions` takes a topic's partitions out, `target` places one, `rebuild` puts a
/// topic back together with some of them.
fn split_topics<T: Clone, P>(
    topics: Vec<T>,
    partitions: impl Fn(&mut T) -> Vec<P>,
    target: impl Fn(&T, &P) -> Target,
    rebuild: impl Fn(&T, Vec<P>) -> T,
) -> BTreeMap<Target, Vec<T>> {
    let mut by_target: BTreeMap<Target, Vec<T>> = BTreeMap::new();
    for mut topic in topics {
        let taken = partitions(&mut topic);
        for (place, some) in group_by(taken, |partition| target(&topic, partition)) {
            by_target.entry(place).or_default().push(rebuild(&topic, some));
        }
    }
    by_target
}

/// Splits `topics` by the target of each partition: `$field` holds a topic's partitions and
/// `$target` places one (see [`split_topics`]).
macro_rules! split_by {
    ($topics:expr, $field:ident, $target:expr) => {
        split_topics(
            $topics,
            |t| std::mem::take(&mut t.$field),
            $target,
            |t, ps| {
                let mut topic = t.clone();
                topic.$field = ps;
                topic
            },
        )
    };
}

/// `request` cut into the parts each node answers (one part, `Here`, for anything not
/// routed).
pub(crate) fn parts(metadata: &ClusterMetadata, here: i32, request: RequestKind) -> Parts {
    let lead = |topic: &str, partition: i32| leader(metadata, here, topic, partition);
    let lead_id = |topic_id: Uuid, partition: i32| match topic_name(metadata, topic_id) {
        Some(name) => leader(metadata, here, name, partition),
        None => Target::Here,
    };
    match request {
        RequestKind::Produce(mut r) => {
            let topics = std::mem::take(&mut r.topic_data);
            let split = split_by!(topics, partition_data, |t, p| lead(t.name.as_str(), p.index));
            rebuild_each(split, |topics| RequestKind::Produce(r.clone().with_topic_data(topics)))
        }
        RequestKind::ShareFetch(mut r) => {
            let topics = std::mem::take(&mut r.topics);
            let forgotten = std::mem::take(&mut r.forgotten_topics_data);
            let mut split = split_by!(topics, partitions, |t, p| lead_id(t.topic_id, p.partition_index));
            let mut forgotten = split_by!(forgotten, partitions, |t, p| lead_id(t.topic_id, *p));
            for target in forgotten.keys() {
                split.entry(*target).or_default();
            }
            if split.is_empty() {
                split.insert(Target::Here, Vec::new());
            }
            split
                .into_iter()
                .map(|(target, topics)| {
                    let mut part = r.clone();
                    part.topics = topics;
                    part.forgotten_topics_data = forgotten.remove(&target).unwrap_or_default();
                    (target, RequestKind::ShareFetch(part))
                })
                .collect()
        }
        RequestKind::ShareAcknowledge(mut r) => {
            let topics = std::mem::take(&mut r.topics);
            let split = split_by!(topics, partitions, |t, p| lead_id(t.topic_id, p.partition_index));
            rebuild_each(split, |topics| {
                let mut part = r.clone();
                part.topics = topics;
                RequestKind::ShareAcknowledge(part)
            })
        }
        RequestKind::ListOffsets(mut r) => {
            let topics = std::mem::take(&mut r.topics);
            let split = split_by!(topics, partitions, |t, p| lead(t.name.as_str(), p.partition_index));
            rebuild_each(split, |topics| RequestKind::ListOffsets(r.clone().with_topics(topics)))
        }
        RequestKind::DeleteRecords(mut r) => {
            let topics = std::mem::take(&mut r.topics);
            let split = split_by!(topics, partitions, |t, p| lead(t.name.as_str(), p.partition_index));
            rebuild_each(split, |topics| RequestKind::DeleteRecords(r.clone().with_topics(topics)))
        }
        RequestKind::ShareGroupHeartbeat(r) => {
            BTreeMap::from([(coordinator(metadata, here, r.group_id.as_str()), RequestKind::ShareGroupHeartbeat(r))])
        }
        RequestKind::DescribeShareGroupOffsets(r) => {
            let target = match r.groups.as_slice() {
                [group] => coordinator(metadata, here, group.group_id.as_str()),
                _ => Target::Here,
            };
            BTreeMap::from([(target, RequestKind::DescribeShareGroupOffsets(r))])
        }
        other => BTreeMap::from([(Target::Here, other)]),
    }
}

/// One request per target from its share of the topics (at least one part: `Here`, empty).
fn rebuild_each<T>(split: BTreeMap<Target, Vec<T>>, build: impl Fn(Vec<T>) -> RequestKind) -> Parts {
    if split.is_empty() {
        return BTreeMap::from([(Target::Here, build(Vec::new()))]);
    }
    split.into_iter().map(|(target, topics)| (target, build(topics))).collect()
}

/// The answers of a request's parts as one answer, as the whole request would have had.
pub(crate) fn merge(answers: Vec<ResponseKind>) -> Option<ResponseKind> {
    let mut answers = answers.into_iter();
    let mut whole = answers.next()?;
    for part in answers {
        match (&mut whole, part) {
            (ResponseKind::Produce(whole), ResponseKind::Produce(part)) => whole.responses.extend(part.responses),
            (ResponseKind::ShareFetch(whole), ResponseKind::ShareFetch(part)) => {
                if whole.error_code == 0 {
                    whole.error_code = part.error_code;
                    whole.error_message = part.error_message;
                }
                whole.acquisition_lock_timeout_ms =
                    whole.acquisition_lock_timeout_ms.max(part.acquisition_lock_timeout_ms);
                whole.responses.extend(part.responses);
                whole.node_endpoints.extend(part.node_endpoints);
            }
            (ResponseKind::ShareAcknowledge(whole), ResponseKind::ShareAcknowledge(part)) => {
                if whole.error_code == 0 {
                    whole.error_code = part.error_code;
                    whole.error_message = part.error_message;
                }
                whole.responses.extend(part.responses);
                whole.node_endpoints.extend(part.node_endpoints);
            }
            (ResponseKind::ListOffsets(whole), ResponseKind::ListOffsets(part)) => whole.topics.extend(part.topics),
            (ResponseKind::DeleteRecords(whole), ResponseKind::DeleteRecords(part)) => whole.topics.extend(part.topics),
            _ => {
                tracing::error!("the parts of an AMQP request were answered with different kinds");
                return None;
            }
        }
    }
    Some(whole)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    use sluice_cluster::metadata::{PartitionInfo, TopicInfo};

    fn metadata(leaders: &[i32]) -> ClusterMetadata {
        let partitions = leaders
            .iter()
            .map(|&leader| PartitionInfo {
                replicas: vec![1, 2, 3],
                leader,
                leader_epoch: 1,
                isr: vec![1, 2, 3],
                partition_epoch: 1,
                elr: Vec::new(),
                last_known_elr: Vec::new(),
            })
            .collect();
        let mut metadata = ClusterMetadata::default();
        metadata
            .topics
            .insert("q".into(), TopicInfo { topic_id: Uuid::from_u128(7), configs: BTreeMap::new(), partitions });
        metadata
    }

    #[test]
    fn a_produce_goes_to_each_partitions_leader_and_unknown_ones_stay_here() {
        let mut topic = TopicProduceData::default();
        topic.name = TopicName(StrBytes::from_static_str("q"));
        topic.partition_data = (0..4).map(|index| PartitionProduceData::default().with_index(index)).collect();
        let request = RequestKind::Produce(ProduceRequest::default().with_topic_data(vec![topic]));
        let parts = parts(&metadata(&[1, 2, 2, NO_LEADER]), 1, request);
        let indexes = |target: Target| match &parts[&target] {
            RequestKind::Produce(r) => r.topic_data[0].partition_data.iter().map(|p| p.index).collect::<Vec<_>>(),
            _ => panic!("not a produce"),
        };
        assert_eq!(parts.len(), 2);
        assert_eq!(indexes(Target::Here), vec![0, 3]);
        assert_eq!(indexes(Target::Node(2)), vec![1, 2]);
    }
}
