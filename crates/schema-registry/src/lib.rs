//! A Schema Registry served by the broker, compatible with Confluent's REST API as
//! serializers and tools call it (Avro, JSON Schema, Protobuf), whose whole state is the
//! compacted `_schemas` topic.
//!
//! Why inside the broker: a Kafka workload that carries Avro or JSON Schema payloads needs
//! a registry, and the broker already has what one needs to be correct, a replicated,
//! fsynced log with a single leader. The registry adds no storage of its own: every node
//! rebuilds its state by replaying `_schemas` (`state`), and writes go through the
//! partition's leader (`registry`), which serializes them, so ids come from one writer
//! and the next id is itself a record (`records`): unique and never reused.
//!
//! The crate knows nothing of the broker: the broker hosts the log through
//! [`SchemaLog`] and authenticates and authorizes callers through [`http::Gate`].

pub mod authorization;
pub mod compatibility;
pub mod decode;
pub mod error;
mod forward;
pub mod http;
pub mod limits;
pub mod records;
pub mod registry;
pub mod schema;
pub mod serve;
pub mod setting;
pub mod state;

pub use error::RegistryError;
pub use registry::{LogFuture, LogRecord, Registry, SchemaLog, Writer};
pub use serve::{serve, RegistryTls};

/// The internal topic that holds the registry (Confluent's default `kafkastore.topic`).
pub const SCHEMAS_TOPIC: &str = "_schemas";

/// The name of the registration endpoint that carries a node's registry address, where
/// other nodes forward writes (lower case with a dot: no Kafka listener has this name).
pub const REGISTRY_ENDPOINT: &str = "sluice.schema-registry";
