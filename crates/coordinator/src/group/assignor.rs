//! Server-side partition assignors of consumer-protocol (KIP-848) groups: `uniform` (the
//! default) and `range`, chosen per group with the heartbeat's `server_assignor` field.
//!
//! Why on the broker: in the consumer protocol the coordinator, not a group leader,
//! computes the *target assignment* whenever the group epoch moves (a member joins or
//! leaves, a subscription changes, a subscribed topic gains partitions). Assignors are pure
//! functions of the members' subscriptions, the topics' partition counts and the previous
//! target, so they are tested without a broker.
//!
//! ```text
//! let target = assign(Assignor::Uniform, &subscribers, &partitions_by_topic);
//! ```

use std::collections::{BTreeMap, BTreeSet, HashSet};

use uuid::Uuid;

/// Partitions by topic id: a member's assignment (current or target).
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// The assignors a member may ask for, with Kafka's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Assignor {
    /// Balanced and sticky: members keep what they had as long as the spread stays at most
    /// one partition (Kafka's `UniformAssignor`).
    Uniform,
    /// Per topic, contiguous ranges of partitions in member-id order, so co-partitioned
    /// topics land together (Kafka's `RangeAssignor`; not sticky here).
    Range,
}

/// Kafka's `group.consumer.assignors` default: the first one is the default.
pub const ASSIGNORS: [Assignor; 2] = [Assignor::Uniform, Assignor::Range];

impl Assignor {
    pub fn name(self) -> &'static str {
        match self {
            Assignor::Uniform => "uniform",
            Assignor::Range => "range",
        }
    }

    pub fn from_name(name: &str) -> Option<Assignor> {
        ASSIGNORS.into_iter().find(|assignor| assignor.name() == name)
    }
}

/// One member as an assignor sees it.
#[derive(Debug, Clone)]
pub struct Subscriber<'a> {
    pub member_id: &'a str,
    /// Ids of the subscribed topics that exist.
    pub topics: BTreeSet<Uuid>,
    /// The member's previous target assignment (for stickiness).
    pub previous: Option<&'a Assignment>,
}

/// The target assignment of every subscriber (members with nothing get an empty entry).
/// Every partition of a topic with at least one subscriber goes to exactly one subscriber
/// of that topic.
pub fn assign(
    assignor: Assignor,
    subscribers: &[Subscriber<'_>],
    partitions_by_topic: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let target = match assignor {
        Assignor::Uniform => assign_uniform(subscribers, partitions_by_topic),
        Assignor::Range => assign_range(subscribers, partitions_by_topic),
    };
    debug_assert!(each_partition_once(&target), "a partition was assigned twice");
    target
}

fn each_partition_once(target: &BTreeMap<String, Assignment>) -> bool {
    let mut seen = HashSet::new();
    target.values().flat_map(partitions_of).all(|partition| seen.insert(partition))
}

/// Every (topic, partition) of an assignment.
pub fn partitions_of(assignment: &Assignment) -> impl Iterator<Item = (Uuid, i32)> + '_ {
    assignment.iter().flat_map(|(topic, partitions)| partitions.iter().map(move |p| (*topic, *p)))
}

/// Number of partitions in an assignment.
#[cfg(test)]
pub fn partition_count(assignment: &Assignment) -> usize {
    assignment.values().map(BTreeSet::len).sum()
}

fn add(assignment: &mut Assignment, (topic, partition): (Uuid, i32)) {
    assignment.entry(topic).or_default().insert(partition);
}

fn remove(assignment: &mut Assignment, (topic, partition): (Uuid, i32)) {
    if let Some(partitions) = assignment.get_mut(&topic) {
        partitions.remove(&partition);
        if partitions.is_empty() {
            assignment.remove(&topic);
        }
    }
}

fn exists(partitions_by_topic: &BTreeMap<Uuid, i32>, (topic, partition): (Uuid, i32)) -> bool {
    partitions_by_topic.get(&topic).is_some_and(|count| (0..*count).contains(&partition))
}

/// Sticky uniform assignment in three steps: (1) members keep the partitions of their
/// previous target that still exist and that they still subscribe to; (2) every other
/// partition goes to its least-loaded subscriber; (3) partitions move from the most to the
/// least loaded eligible member while the gap is two or more. Each move lowers the sum of
/// squared loads, so (3) ends; with identical subscriptions the spread ends at most one.
fn assign_uniform(
    subscribers: &[Subscriber<'_>],
    partitions_by_topic: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let mut target: BTreeMap<&str, Assignment> = subscribers.iter().map(|s| (s.member_id, Assignment::new())).collect();
    let mut load: BTreeMap<&str, usize> = subscribers.iter().map(|s| (s.member_id, 0)).collect();
    let mut taken: HashSet<(Uuid, i32)> = HashSet::new();
    for subscriber in subscribers {
        let Some(previous) = subscriber.previous else { continue };
        for partition in partitions_of(previous) {
            let eligible = subscriber.topics.contains(&partition.0) && exists(partitions_by_topic, partition);
            if eligible && taken.insert(partition) {
                add(target.get_mut(subscriber.member_id).expect("every subscriber has an entry"), partition);
                *load.get_mut(subscriber.member_id).expect("every subscriber has a load") += 1;
            }
        }
    }
    let eligible_for = |topic: &Uuid| -> Vec<&str> {
        subscribers.iter().filter(|s| s.topics.contains(topic)).map(|s| s.member_id).collect()
    };
    for (topic, count) in partitions_by_topic {
        let eligible = eligible_for(topic);
        if eligible.is_empty() {
            continue;
        }
        for partition in (0..*count).map(|p| (*topic, p)) {
            if taken.contains(&partition) {
                continue;
            }
            let least = *eligible.iter().min_by_key(|m| (load[*m], **m)).expect("eligible is not empty");
            add(target.get_mut(least).expect("eligible members are subscribers"), partition);
            *load.get_mut(least).expect("eligible members have a load") += 1;
            taken.insert(partition);
        }
    }
    balance(&mut target, &mut load, subscribers);
    target.into_iter().map(|(member, assignment)| (member.to_string(), assignment)).collect()
}

/// Step (3) of [`assign_uniform`]: one move at a time, always from the most loaded member
/// that can give (so a newcomer takes evenly from everyone instead of draining one member).
fn balance<'a>(
    target: &mut BTreeMap<&'a str, Assignment>,
    load: &mut BTreeMap<&'a str, usize>,
    subscribers: &[Subscriber<'a>],
) {
    let topics_of: BTreeMap<&str, &BTreeSet<Uuid>> = subscribers.iter().map(|s| (s.member_id, &s.topics)).collect();
    while let Some((over, under, partition)) = next_move(target, load, &topics_of) {
        remove(target.get_mut(over).expect("member has an entry"), partition);
        add(target.get_mut(under).expect("member has an entry"), partition);
        *load.get_mut(over).expect("member has a load") -= 1;
        *load.get_mut(under).expect("member has a load") += 1;
    }
}

/// The partition to move next (from, to, partition), if any gap of two or more can shrink.
fn next_move<'a>(
    target: &BTreeMap<&'a str, Assignment>,
    load: &BTreeMap<&'a str, usize>,
    topics_of: &BTreeMap<&'a str, &BTreeSet<Uuid>>,
) -> Option<(&'a str, &'a str, (Uuid, i32))> {
    let mut by_load: Vec<&str> = load.keys().copied().collect();
    by_load.sort_by_key(|m| (std::cmp::Reverse(load[m]), *m));
    for over in by_load {
        // The highest partitions move first: the lowest stay where they were longest.
        for partition in partitions_of(&target[over]).collect::<Vec<_>>().into_iter().rev() {
            let under = topics_of
                .iter()
                .filter(|(member, topics)| **member != over && topics.contains(&partition.0))
                .map(|(member, _)| *member)
                .min_by_key(|m| (load[m], *m));
            if let Some(under) = under.filter(|under| load[over] >= load[under] + 2) {
                return Some((over, under, partition));
            }
        }
    }
    None
}

/// Range: for each topic, its subscribers in member-id order get contiguous ranges, the
/// first `partitions % subscribers` of them one partition more.
fn assign_range(
    subscribers: &[Subscriber<'_>],
    partitions_by_topic: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let mut target: BTreeMap<String, Assignment> =
        subscribers.iter().map(|s| (s.member_id.to_string(), Assignment::new())).collect();
    for (topic, count) in partitions_by_topic {
        let mut eligible: Vec<&str> =
            subscribers.iter().filter(|s| s.topics.contains(topic)).map(|s| s.member_id).collect();
        if eligible.is_empty() {
            continue;
        }
        eligible.sort_unstable();
        let count = usize::try_from(*count).unwrap_or_default();
        let (quota, extra) = (count / eligible.len(), count % eligible.len());
        let mut next = 0usize;
        for (index, member) in eligible.iter().enumerate() {
            let size = quota + usize::from(index < extra);
            let assignment = target.get_mut(*member).expect("eligible members are subscribers");
            for partition in next..next + size {
                add(assignment, (*topic, i32::try_from(partition).expect("partition counts are i32")));
            }
            next += size;
        }
        assert_eq!(next, count, "range covers every partition");
    }
    target
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn parts(topic_id: Uuid, partitions: &[i32]) -> Assignment {
        Assignment::from([(topic_id, partitions.iter().copied().collect())])
    }

    /// Runs an assignor and checks what every assignment must satisfy: each partition of a
    /// subscribed topic exactly once, and only to a subscriber of its topic.
    fn check(
        assignor: Assignor,
        subscribers: &[Subscriber<'_>],
        partitions_by_topic: &BTreeMap<Uuid, i32>,
    ) -> BTreeMap<String, Assignment> {
        let target = assign(assignor, subscribers, partitions_by_topic);
        assert!(each_partition_once(&target));
        for subscriber in subscribers {
            for (topic_id, _) in partitions_of(&target[subscriber.member_id]) {
                assert!(subscriber.topics.contains(&topic_id), "{} got an unsubscribed topic", subscriber.member_id);
            }
        }
        for (topic_id, count) in partitions_by_topic {
            if subscribers.iter().any(|s| s.topics.contains(topic_id)) {
                let assigned = target.values().map(|a| a.get(topic_id).map_or(0, BTreeSet::len)).sum::<usize>();
                assert_eq!(assigned, *count as usize, "every partition of {topic_id} is assigned");
            }
        }
        target
    }

    fn loads(target: &BTreeMap<String, Assignment>) -> Vec<usize> {
        target.values().map(partition_count).collect()
    }

    #[test]
    fn uniform_spreads_twelve_partitions_over_three_members_and_stays_sticky() {
        let t = topic(1);
        let topics = BTreeMap::from([(t, 12)]);
        let all = BTreeSet::from([t]);
        let members = ["a", "b", "c"];
        let first: Vec<Subscriber<'_>> =
            members.iter().map(|m| Subscriber { member_id: m, topics: all.clone(), previous: None }).collect();
        let target = check(Assignor::Uniform, &first, &topics);
        assert_eq!(loads(&target), vec![4, 4, 4]);

        // "c" leaves: a and b keep all they had and split c's four.
        let second: Vec<Subscriber<'_>> = ["a", "b"]
            .iter()
            .map(|m| Subscriber { member_id: m, topics: all.clone(), previous: target.get(*m) })
            .collect();
        let after_leave = check(Assignor::Uniform, &second, &topics);
        assert_eq!(loads(&after_leave), vec![6, 6]);
        for member in ["a", "b"] {
            assert!(target[member][&t].is_subset(&after_leave[member][&t]), "{member} lost a partition");
        }

        // "d" joins: it takes two from each, nobody else moves anything.
        let third: Vec<Subscriber<'_>> = ["a", "b", "d"]
            .iter()
            .map(|m| Subscriber { member_id: m, topics: all.clone(), previous: after_leave.get(*m) })
            .collect();
        let after_join = check(Assignor::Uniform, &third, &topics);
        assert_eq!(loads(&after_join), vec![4, 4, 4]);
        for member in ["a", "b"] {
            assert!(after_join[member][&t].is_subset(&after_leave[member][&t]), "{member} gained while d waits");
        }
    }

    #[test]
    fn uniform_with_different_subscriptions_only_assigns_subscribed_topics() {
        let (x, y) = (topic(1), topic(2));
        let topics = BTreeMap::from([(x, 4), (y, 2), (topic(3), 5)]);
        let subscribers = [
            Subscriber { member_id: "a", topics: BTreeSet::from([x]), previous: None },
            Subscriber { member_id: "b", topics: BTreeSet::from([x, y]), previous: None },
            Subscriber { member_id: "c", topics: BTreeSet::from([y]), previous: None },
        ];
        let target = check(Assignor::Uniform, &subscribers, &topics);
        assert_eq!(loads(&target), vec![2, 2, 2]);
        assert!(target.values().all(|a| !a.contains_key(&topic(3))), "nobody subscribes to topic 3");
    }

    #[test]
    fn uniform_drops_vanished_partitions_and_assigns_new_ones() {
        let (x, y) = (topic(1), topic(2));
        let all = BTreeSet::from([x, y]);
        let previous_a = parts(x, &[0, 1, 2, 3, 9]);
        let subscribers = [
            Subscriber { member_id: "a", topics: all.clone(), previous: Some(&previous_a) },
            Subscriber { member_id: "b", topics: all, previous: None },
        ];
        // Partition 9 no longer exists; topic y is new.
        let target = check(Assignor::Uniform, &subscribers, &BTreeMap::from([(x, 4), (y, 4)]));
        assert_eq!(loads(&target), vec![4, 4]);
        assert_eq!(target["a"][&x], BTreeSet::from([0, 1, 2, 3]), "a keeps what still exists");
    }

    #[test]
    fn range_gives_contiguous_ranges_per_topic_in_member_order() {
        let (x, y) = (topic(1), topic(2));
        let all = BTreeSet::from([x, y]);
        let subscribers = [
            Subscriber { member_id: "b", topics: all.clone(), previous: None },
            Subscriber { member_id: "a", topics: all.clone(), previous: None },
            Subscriber { member_id: "c", topics: all, previous: None },
        ];
        let target = check(Assignor::Range, &subscribers, &BTreeMap::from([(x, 7), (y, 3)]));
        assert_eq!(target["a"][&x], BTreeSet::from([0, 1, 2]));
        assert_eq!(target["b"][&x], BTreeSet::from([3, 4]));
        assert_eq!(target["c"][&x], BTreeSet::from([5, 6]));
        for (member, partition) in [("a", 0), ("b", 1), ("c", 2)] {
            assert_eq!(target[member][&y], BTreeSet::from([partition]));
        }
    }

    #[test]
    fn assignors_are_named_as_in_kafka() {
        assert_eq!(Assignor::from_name("uniform"), Some(Assignor::Uniform));
        assert_eq!(Assignor::from_name("range"), Some(Assignor::Range));
        assert_eq!(Assignor::from_name("sticky"), None);
        assert_eq!(ASSIGNORS[0], Assignor::Uniform, "uniform is the default");
    }

    #[test]
    fn members_without_subscribed_topics_get_an_empty_assignment() {
        let subscribers = [Subscriber { member_id: "a", topics: BTreeSet::new(), previous: None }];
        for assignor in ASSIGNORS {
            let target = check(assignor, &subscribers, &BTreeMap::from([(topic(1), 3)]));
            assert_eq!(target["a"], Assignment::new());
        }
    }
}
