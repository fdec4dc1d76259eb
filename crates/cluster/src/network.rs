//! openraft's `RaftNetworkFactory`/`RaftNetwork` over the controller RPC ([`crate::rpc`]).
//!
//! One [`PeerClient`] per peer address is shared by raft replication, heartbeats and write
//! forwarding ([`Peers`]), so all of them reuse the same pooled connections.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;

use crate::rpc::{Identity, PeerClient, Request, Response, RpcError};
use crate::types::TypeConfig;

type NodeId = u64;

/// Pause between replication attempts to an unreachable voter (openraft's default is
/// 500 ms). A restarted voter must hear the leader before its first election timeout
/// (300 ms at least); one that does not starts an election with a higher term and
/// deposes the leader, which costs the cluster another election.
const UNREACHABLE_BACKOFF: Duration = Duration::from_millis(100);
type RaftRpcError<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

/// The clients of all peers, by address.
#[derive(Clone)]
pub(crate) struct Peers {
    clients: Arc<Mutex<HashMap<String, Arc<PeerClient>>>>,
    /// Local address of every outgoing connection (`ControllerConfig::source_address`).
    source_address: Option<IpAddr>,
    /// The cluster id sent with every request and the rpc secret.
    identity: Identity,
}

impl Peers {
    pub(crate) fn new(source_address: Option<IpAddr>, identity: Identity) -> Peers {
        Peers { clients: Arc::default(), source_address, identity }
    }

    pub(crate) fn client(&self, address: &str) -> Arc<PeerClient> {
        let mut clients = self.clients.lock().expect("peers lock poisoned");
        clients
            .entry(address.to_string())
            .or_insert_with(|| {
                Arc::new(PeerClient::new(address.to_string(), self.source_address, self.identity.clone()))
            })
            .clone()
    }
}

/// The factory openraft asks for a connection to each target.
pub(crate) struct NetworkFactory {
    pub(crate) peers: Peers,
}

/// openraft's handle on one target.
pub(crate) struct PeerNetwork {
    target: NodeId,
    client: Arc<PeerClient>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerNetwork {
        PeerNetwork { target, client: self.peers.client(&node.addr) }
    }
}

impl PeerNetwork {
    async fn call<E: std::error::Error>(
        &self,
        request: Request,
        option: &RPCOption,
    ) -> Result<Response, RaftRpcError<E>> {
        self.client.call(&request, option.hard_ttl()).await.map_err(|error| match &error {
            RpcError::Connect(..) => RPCError::Unreachable(Unreachable::new(&error)),
            RpcError::Io(_) | RpcError::Timeout => RPCError::Network(NetworkError::new(&error)),
        })
    }

    fn remote<E: std::error::Error>(&self, error: RaftError<NodeId, E>) -> RaftRpcError<E> {
        RPCError::RemoteError(RemoteError::new(self.target, error))
    }
}

fn mismatched<E: std::error::Error>(response: &Response) -> RaftRpcError<E> {
    let error = std::io::Error::other(format!("mismatched rpc response {response:?}"));
    RPCError::Network(NetworkError::new(&error))
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(UNREACHABLE_BACKOFF))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RaftRpcError> {
        match self.call(Request::AppendEntries(rpc), &option).await? {
            Response::AppendEntries(result) => result.map_err(|error| self.remote(error)),
            other => Err(mismatched(&other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RaftRpcError<InstallSnapshotError>> {
        match self.call(Request::InstallSnapshot(rpc), &option).await? {
            Response::InstallSnapshot(result) => result.map_err(|error| self.remote(error)),
            other => Err(mismatched(&other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RaftRpcError> {
        match self.call(Request::Vote(rpc), &option).await? {
            Response::Vote(result) => result.map_err(|error| self.remote(error)),
            other => Err(mismatched(&other)),
        }
    }
}
