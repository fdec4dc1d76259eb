//! The broker as the host of the coordinators (`sluice_coordinator`): the coordinator crate
//! sits below the broker and reaches the broker's logs only through this.

use sluice_coordinator::CoordinatorHost;
use sluice_storage::Syncer;

use crate::Broker;

impl CoordinatorHost for Broker {
    fn syncer(&self) -> &Syncer {
        self.logs.syncer()
    }
}
