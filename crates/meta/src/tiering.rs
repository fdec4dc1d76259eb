//! Whether a topic keeps its history in the object store (Kafka's `remote.storage.enable`).

use std::collections::BTreeMap;

use crate::topics::TopicMeta;

/// Kafka's topic config that tiers a topic.
pub const REMOTE_STORAGE_ENABLE: &str = "remote.storage.enable";

/// Whether these config overrides tier a topic (`remote.storage.enable=true`).
pub fn tiers(configs: &BTreeMap<String, String>) -> bool {
    configs.get(REMOTE_STORAGE_ENABLE).is_some_and(|v| v.trim() == "true")
}

/// Whether a topic's overrides make it tiered.
pub fn is_tiered(topic: &TopicMeta) -> bool {
    tiers(&topic.configs)
}
