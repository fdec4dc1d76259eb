//! The coordinators: the group coordinator (classic and consumer-protocol groups, committed
//! offsets) and the keyed state log coordinators keep in an internal topic.
//!
//! They sit below the broker, above storage, meta and replication, so that their state
//! machines and durable logs are built and tested without the request handlers; the broker
//! reaches into them through their APIs and they reach back only through [`CoordinatorHost`].

pub mod group;
pub mod state_log;

use sluice_storage::Syncer;

/// What a coordinator needs from the broker that hosts it.
pub trait CoordinatorHost: Send + Sync + 'static {
    /// The group-commit syncer that makes the broker's log appends durable.
    fn syncer(&self) -> &Syncer;
}
