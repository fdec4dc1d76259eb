//! Which `__consumer_offsets` partition holds a group, exactly as Kafka computes it
//! (`Utils.abs(groupId.hashCode) % offsets.topic.num.partitions`), so that a group keeps
//! its partition (and its coordinator's placement rule) across Kafka and Sluice.
//!
//! ```text
//! assert_eq!(partition_for("hello", 50), 99162322 % 50);
//! ```

/// Java's `String.hashCode`: `s[0]*31^(n-1) + ... + s[n-1]` over UTF-16 code units,
/// wrapping in 32 bits.
pub(crate) fn java_string_hash(text: &str) -> i32 {
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
pub(crate) fn partition_for(group_id: &str, partitions: i32) -> i32 {
    assert!(partitions > 0, "the offsets topic has at least one partition");
    let partition = kafka_abs(java_string_hash(group_id)) % partitions;
    assert!((0..partitions).contains(&partition));
    partition
}

#[cfg(test)]
mod tests {
    use super::*;

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
