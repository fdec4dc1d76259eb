//! The names of the internal topics, as Kafka names them: the coordinators write their
//! state there, clients may read them, and no client may produce to them.

/// Consumer groups' committed offsets and membership (the group coordinator).
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// Transactions' state (the transaction coordinator).
pub const TXN_STATE_TOPIC: &str = "__transaction_state";
/// Share groups' delivery state (the share coordinator).
pub const SHARE_STATE_TOPIC: &str = "__share_group_state";

/// Every internal topic.
pub const INTERNAL_TOPICS: [&str; 3] = [OFFSETS_TOPIC, TXN_STATE_TOPIC, SHARE_STATE_TOPIC];
