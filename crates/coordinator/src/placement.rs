//! Which `__consumer_offsets` partition holds a group, exactly as Kafka computes it
//! (`Utils.abs(groupId.hashCode) % offsets.topic.num.partitions`), so that a group keeps
//! its partition (and its coordinator's placement rule) across Kafka and Sluice.
//!
//! ```text
//! assert_eq!(partition_for("hello", 50), 99162322 % 50);
//! ```

/// Java's `String.hashCode`: `s[0]*31^(n-1) + ... + s[n-1]` over UTF-16 code units,
/// wrapping in 32 bits.
pub fn java_string_hash(text: &str) -> i32 {
    text.encode_utf16().fold(0i32, |hash, unit| hash.wrapping_mul(31).wrapping_add(i32::from(unit)))
}

/// Kafka's `Utils.abs`: `Integer.MIN_VALUE` maps to 0 rather than staying negative.
fn kafka_abs(value: i32) -> i32 {
    if value == i32::MIN {
        0
    } else {
        value.abs()
    }
}

/// The offsets partition of `group_id` among `partitions` (at least 1).
pub fn partition_for(group_id: &str, partitions: i32) -> i32 {
    assert!(partitions > 0, "the offsets topic has at least one partition");
    let partition = kafka_abs(java_string_hash(group_id)) % partitions;
    assert!((0..partitions).contains(&partition));
    partition
}

/// The partitions of an internal topic (`__consumer_offsets`, `__transaction_state`,
/// `__share_group_state`) that the metadata being applied names this node leader of, told
/// to their coordinator before the apply reaches them. Applying a version opens every
/// replica's log first, which takes seconds on a node of many partitions; meanwhile another
/// node, already past that version, names this one in FindCoordinator. A request for such a
/// partition is answered COORDINATOR_LOAD_IN_PROGRESS, which every client retries at the
/// same node, not NOT_COORDINATOR, which librdkafka's synchronous commit reports to the
/// application. Cleared when the coordinator takes the leaderships themselves.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IncomingLeaderships {
    /// Partitions of the topic in that metadata (0: none announced).
    partition_count: i32,
    partitions: std::collections::BTreeSet<i32>,
}

impl IncomingLeaderships {
    pub fn new(partition_count: i32, partitions: std::collections::BTreeSet<i32>) -> IncomingLeaderships {
        assert!(partitions.iter().all(|p| (0..partition_count).contains(p)), "led partitions exist");
        IncomingLeaderships { partition_count, partitions }
    }

    /// Whether the partition of `key` (a group or transactional id, a share-state key) is
    /// about to be led here.
    pub fn holds(&self, key: &str) -> bool {
        self.partition_count > 0 && self.partitions.contains(&partition_for(key, self.partition_count))
    }

    /// Whether partition `partition` is about to be led here.
    pub fn holds_partition(&self, partition: i32) -> bool {
        self.partitions.contains(&partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incoming_leaderships_hold_the_keys_of_their_partitions() {
        let none = IncomingLeaderships::default();
        assert!(!none.holds("hello") && !none.holds_partition(0));
        let incoming = IncomingLeaderships::new(50, [partition_for("hello", 50)].into());
        assert!(incoming.holds("hello"));
        assert!(incoming.holds_partition(partition_for("hello", 50)));
        let elsewhere = (0..).map(|i| format!("g{i}")).find(|g| partition_for(g, 50) != partition_for("hello", 50));
        assert!(!incoming.holds(&elsewhere.unwrap()));
    }

    fn check(group_id: &str, partitions: i32, expected: i32) {
        assert_eq!(partition_for(group_id, partitions), expected, "{group_id:?} over {partitions}");
    }

    #[test]
    fn hashes_like_java() {
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        // The classic collision pair, and a string past the BMP (two UTF-16 units).
        assert_eq!(java_string_hash("Aa"), java_string_hash("BB"));
        assert_eq!(java_string_hash("Aa"), 2112);
        assert_eq!(java_string_hash("\u{1F600}"), 0xD83D * 31 + 0xDE00);
        // "polygenelubricants".hashCode() is Integer.MIN_VALUE: Utils.abs makes it 0.
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
    }

    #[test]
    fn places_groups_like_kafka() {
        check("hello", 50, 99_162_322 % 50);
        check("polygenelubricants", 50, 0);
        check("anything", 1, 0);
        let long = "my-consumer-group-with-a-long-name";
        check(long, 50, 754_636_653 % 50);
    }
}
