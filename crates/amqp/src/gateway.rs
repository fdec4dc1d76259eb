//! The one way this crate reaches the broker: Kafka requests run as a user.
//!
//! Why a trait: the broker implements it with its own request handlers (authorization
//! included), and this crate stays a client of the Kafka API, below the broker in the
//! workspace.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use kafka_protocol::messages::{RequestKind, ResponseKind};

pub type GatewayFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Who an AMQP connection runs its requests as.
#[derive(Clone, Debug)]
pub struct Session {
    /// The Kafka principal, `User:<name>` (`User:ANONYMOUS` when the broker takes no logins).
    pub principal: String,
    pub peer: SocketAddr,
}

pub trait Gateway: Send + Sync + 'static {
    /// Whether connections must log in (the broker has SASL users): then a login is checked
    /// against their SCRAM credentials; otherwise every connection is anonymous, as a Kafka
    /// client on a PLAINTEXT listener.
    fn login_required(&self) -> bool;

    /// Whether `password` is `user`'s.
    fn authenticate(&self, user: String, password: String) -> GatewayFuture<'static, bool>;

    /// The user a verified TLS client certificate (DER) names, by the broker's
    /// `ssl.principal.mapping.rules` as on its Kafka SSL listeners; `None` when no rule applies.
    fn certificate_user(&self, certificate: &[u8]) -> Option<String>;

    /// Runs one Kafka request at `api_version` as `session`; `None` if the broker gave no
    /// answer (a bug, or shutdown).
    fn call(
        &self,
        session: &Session,
        api_version: i16,
        request: RequestKind,
    ) -> GatewayFuture<'static, Option<ResponseKind>>;

    /// Whether `session` may declare or delete exchanges and bindings: routing is shared by
    /// every publisher, so it takes what creating any topic takes, CREATE on the cluster.
    /// True when the broker has no authorizer.
    fn may_configure_routing(&self, session: &Session) -> bool;

    /// Runs one Kafka request as the broker itself: only for what a request a user was
    /// allowed already implies (a queue's share group starting at its first record, the
    /// deletion of an exclusive queue when its connection ends).
    fn call_internal(&self, api_version: i16, request: RequestKind) -> GatewayFuture<'static, Option<ResponseKind>>;

    /// The log end offset of this node's replica of `topic`'s `partition`, if it has one.
    fn local_log_end(&self, topic: &str, partition: i32) -> Option<i64>;

    /// How many records of `queue`'s `partition` its share group (of the same name) has ready
    /// and how many handed out and unacknowledged, when this node leads the partition.
    fn queue_depth(&self, queue: &str, partition: i32) -> GatewayFuture<'static, Option<QueueDepth>>;

    /// Archives up to `count` of the oldest ready records of `queue`'s `partition` (a queue
    /// over its `x-max-length`), durably; their offsets. `None` when this node does not lead it.
    fn drop_ready(&self, queue: &str, partition: i32, count: u64) -> GatewayFuture<'static, Option<Vec<i64>>>;

    /// Stored batches of this node's replica of `topic`'s `partition`, from the one holding
    /// `offset`, up to about `max_bytes`, below the high watermark (a Fetch's records travel
    /// beside its response, so the front door reads the log through this instead).
    fn read_batches(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: usize,
    ) -> GatewayFuture<'static, Option<bytes::Bytes>>;
}

/// A queue partition's records: ready, and handed out but not acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueDepth {
    pub ready: u64,
    pub unacknowledged: u64,
}

/// The API versions this crate builds its requests for (ones the broker serves).
pub mod versions {
    pub const PRODUCE: i16 = 11;
    pub const METADATA: i16 = 12;
    pub const LIST_OFFSETS: i16 = 8;
    pub const CREATE_TOPICS: i16 = 7;
    pub const DELETE_TOPICS: i16 = 6;
    pub const INCREMENTAL_ALTER_CONFIGS: i16 = 1;
    pub const SHARE_GROUP_HEARTBEAT: i16 = 1;
    pub const SHARE_FETCH: i16 = 1;
    pub const SHARE_ACKNOWLEDGE: i16 = 1;
    pub const DESCRIBE_SHARE_GROUP_OFFSETS: i16 = 0;
}
