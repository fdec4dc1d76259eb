//! What the cluster knows about its topics, below everything that serves them: the topic
//! registry and catalog, topic configs and their validation, the durability a topic promises,
//! the names of the internal topics, and a data dir's identity.
//!
//! It is its own crate so that storage users (replication, the coordinators, tiered storage)
//! and the broker's handlers read one definition of a topic without importing each other.

pub mod durability;
pub mod internal;
pub mod meta_properties;
pub mod tiering;
pub mod topic_config;
pub mod topics;

pub use topics::{is_internal, validate_topic_name, TopicCatalog, TopicMeta, TopicRegistry};

/// Leader epoch of every partition on a single node (in a cluster, the controller's epochs).
pub const LEADER_EPOCH: i32 = 0;
