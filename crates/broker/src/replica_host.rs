//! The broker as the host of the follower fetch loops (`sluice_replication::spawn_supervisor`):
//! the replication crate sits below the broker and reaches the broker's replicas, logs,
//! cluster id and inter-broker security only through this.

use std::net::IpAddr;
use std::sync::Arc;

use sluice_replication::{ReplicaHost, ReplicaManager};
use sluice_security::InterBroker;
use sluice_storage::LogManager;

use crate::Broker;

impl ReplicaHost for Broker {
    fn replicas(&self) -> Option<Arc<ReplicaManager>> {
        self.replicas.clone()
    }

    fn source_address(&self) -> Option<IpAddr> {
        self.config.cluster.as_ref().and_then(|cluster| cluster.source_address)
    }

    fn inter_broker(&self) -> &InterBroker {
        &self.inter_broker
    }

    fn cluster_id(&self) -> String {
        self.topics.cluster_id()
    }

    fn logs(&self) -> &LogManager {
        &self.logs
    }
}
