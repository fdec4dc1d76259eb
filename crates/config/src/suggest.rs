//! A configuration key that does not exist is named with the closest keys that do, not
//! with the full list of fields: an operator who typed Kafka's `num.partitions` wants to
//! read `num_partitions`, not two thousand characters of field names.

/// Keys proposed for an unknown one, at most.
pub const SUGGESTIONS_MAX: usize = 3;
/// A known key is proposed when its edit distance to the unknown one is at most this
/// share of the unknown key's length (plus one).
const DISTANCE_SHARE: usize = 3;

/// `message` (a deserializer's "unknown field `x`, expected one of `a`, `b`, ...") as
/// "unknown configuration key x (did you mean a?)", or `None` when it is another error.
pub fn explain_unknown_key(message: &str) -> Option<String> {
    let rest = message.split_once("unknown field `")?.1;
    let (unknown, rest) = rest.split_once('`')?;
    let known: Vec<&str> = rest
        .split_once("expected one of ")
        .map(|(_, list)| list.split(", ").filter_map(|k| k.trim().split('`').nth(1)).collect())
        .unwrap_or_default();
    let section = message.split_once("\nin `").and_then(|(_, s)| s.split('`').next()).filter(|s| !s.is_empty());
    let unknown_key = section.map_or(unknown.to_string(), |section| format!("{section}.{unknown}"));
    let suggestions = closest(unknown, &known);
    Some(match suggestions.as_slice() {
        [] => format!("unknown configuration key {unknown_key}"),
        keys => {
            let keys: Vec<String> =
                keys.iter().map(|k| section.map_or(k.to_string(), |section| format!("{section}.{k}"))).collect();
            format!("unknown configuration key {unknown_key} (did you mean {}?)", keys.join(", "))
        }
    })
}

/// The known keys closest to `unknown`, best first: Kafka's dotted names and Sluice's
/// underscored ones count as the same.
pub fn closest<'a>(unknown: &str, known: &[&'a str]) -> Vec<&'a str> {
    let normalized = |key: &str| key.to_ascii_lowercase().replace(['.', '-'], "_");
    let wanted = normalized(unknown);
    let limit = wanted.len() / DISTANCE_SHARE + 1;
    let mut ranked: Vec<(usize, &str)> = known
        .iter()
        .map(|&key| (strsim::levenshtein(&wanted, &normalized(key)), key))
        .filter(|(distance, _)| *distance <= limit)
        .collect();
    ranked.sort();
    ranked.dedup_by_key(|(_, key)| normalized(key));
    ranked.into_iter().take(SUGGESTIONS_MAX).map(|(_, key)| key).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_names_find_their_sluice_names() {
        let message = "unknown field `num.partitions`, expected one of `node_id`, `listen`, `num_partitions`, \
                       `max.connections`, `max_connections`";
        assert_eq!(
            explain_unknown_key(message).unwrap(),
            "unknown configuration key num.partitions (did you mean num_partitions?)"
        );
        let message = "unknown field `max_conections`, expected one of `max.connections`, `max_connections`";
        assert_eq!(
            explain_unknown_key(message).unwrap(),
            "unknown configuration key max_conections (did you mean max.connections?)"
        );
        let nested = "unknown field `voter`, expected one of `controller_listen`, `voters`\nin `cluster`\n";
        assert_eq!(
            explain_unknown_key(nested).unwrap(),
            "unknown configuration key cluster.voter (did you mean cluster.voters?)"
        );
        assert_eq!(
            explain_unknown_key("unknown field `zzz`, expected one of `node_id`").unwrap(),
            "unknown configuration key zzz"
        );
        assert_eq!(explain_unknown_key("invalid type: string, expected i32"), None);
    }
}
