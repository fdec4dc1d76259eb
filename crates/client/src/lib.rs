//! A Kafka-protocol client for Sluice's own tools and console: the requests librdkafka has
//! no API for (ACLs, SCRAM users, share groups, every admin view a console shows), over any
//! listener (TLS, SASL PLAIN and SCRAM), by `kafka-protocol`'s request and response types.
//!
//! Settings take librdkafka's property names, so one set of `-X key=value` flags reaches a
//! listener from every tool:
//!
//! ```text
//! sluice user -b broker:9094 -X security.protocol=SASL_SSL -X sasl.mechanism=SCRAM-SHA-512 \
//!     -X sasl.username=admin -X ssl.ca.location=ca.pem list
//! ```

pub mod connection;
pub mod errors;
pub mod exchange;
pub mod settings;
mod tls;

pub use connection::{Connector, KafkaConnection};
pub use errors::{broker_error, check};
pub use exchange::Exchange;
pub use settings::{SaslMechanism, SecurityProtocol, Settings, KNOWN_SETTINGS};
pub use sluice_protocol::new_record;
