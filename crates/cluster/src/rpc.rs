//! The controller RPC: raft messages, heartbeats and forwarded writes between controllers,
//! over plain TCP on each node's controller address.
//!
//! Framing: `[length u32 BE][JSON body]`, one request then one response per exchange on a
//! connection. A request travels in an [`Envelope`] with the sender's cluster id; a server
//! closes the connection, unanswered, on a request from another cluster (Kafka's
//! INCONSISTENT_CLUSTER_ID), so nodes of two clusters never vote for or replicate to each
//! other whatever addresses they share; a connection carries one exchange at a time and is returned to a small
//! per-peer pool afterwards (reuse without multiplexing). A length above
//! [`FRAME_BYTES_MAX`] closes the connection before anything is buffered.
//!
//! Why JSON: every message is a serde type from openraft or this crate, JSON handles all of
//! them (including enums and maps openraft derives serde for) without a schema, it is
//! readable in a packet capture, and the controller's traffic is small (metadata changes,
//! 4 heartbeats per second per node), so its cost does not matter. Compact binary formats
//! without `deserialize_any` (postcard, bincode) would tie us to details of openraft's serde
//! derives; switching later changes only [`encode`] and [`decode`].
//!
//! Timeouts: connecting is bounded by [`CONNECT_TIMEOUT_MS`] and a whole exchange by the
//! caller's deadline; a timed-out connection is dropped, never reused (a late answer would
//! be read as the next one's).

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::metadata::Endpoint;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::metadata::CommandResult;
use crate::types::{Proposal, TypeConfig};

/// Largest frame either side accepts (openraft chunks snapshots well below this).
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// Connections a controller serves at once; more are closed on accept.
pub(crate) const SERVER_CONNECTIONS_MAX: usize = 256;
/// Idle connections kept per peer for reuse.
pub(crate) const IDLE_CONNECTIONS_PER_PEER_MAX: usize = 4;
/// Bound on establishing a TCP connection to a peer.
pub(crate) const CONNECT_TIMEOUT_MS: u64 = 500;
/// Requests from another cluster are logged at most once per this period (they repeat
/// every few milliseconds while the other cluster retries).
const FOREIGN_CLUSTER_WARNING_INTERVAL: Duration = Duration::from_secs(60);
/// Bound on writing a response back.
const RESPONSE_WRITE_TIMEOUT_MS: u64 = 5_000;

const _: () = assert!(FRAME_BYTES_MAX <= u32::MAX as usize);

/// A broker's liveness report to the active controller.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Heartbeat {
    pub(crate) node_id: i32,
    pub(crate) incarnation: u64,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) rack: Option<String>,
    #[serde(default)]
    pub(crate) endpoints: Vec<Endpoint>,
    /// The newest metadata.version the sender understands (0 from old nodes).
    #[serde(default)]
    pub(crate) metadata_version_max: u16,
}

/// Everything one controller asks another.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<u64>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    Heartbeat(Heartbeat),
    /// A write made on a follower, for the raft leader to propose.
    Write(Proposal),
}

/// A request with the cluster id of its sender.
#[derive(Serialize)]
struct Envelope<'a> {
    cluster_id: &'a str,
    request: &'a Request,
}

#[derive(Deserialize)]
struct ReceivedEnvelope {
    cluster_id: String,
    request: Request,
}

/// The answers, one variant per request kind.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Response {
    AppendEntries(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    InstallSnapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    Heartbeat(Redirect),
    Write(WriteReply),
}

/// Answer to a heartbeat.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Redirect {
    Accepted,
    /// This node is not the raft leader; the leader it knows of, if any.
    NotLeader(Option<i32>),
}

/// Answer to a forwarded write.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum WriteReply {
    /// Committed at `log_index` with this result.
    Committed { log_index: u64, result: CommandResult },
    /// Not proposed: this node is not the leader.
    NotLeader(Option<i32>),
    /// Proposed but the outcome is unknown (leadership lost meanwhile) or the core failed.
    Failed(String),
}

/// Transport failures.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RpcError {
    #[error("connect to {0}: {1}")]
    Connect(String, io::Error),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("timed out")]
    Timeout,
}

fn encode<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    let body = serde_json::to_vec(value).map_err(io::Error::other)?;
    if body.len() > FRAME_BYTES_MAX {
        return Err(io::Error::other(format!("frame of {} bytes exceeds {FRAME_BYTES_MAX}", body.len())));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&u32::try_from(body.len()).expect("bounded above").to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    serde_json::from_slice(body).map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
}

/// Reads one frame's body; `Ok(None)` on a clean end of stream before a frame starts.
async fn read_frame(stream: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut length = [0u8; 4];
    match stream.read_exact(&mut length).await {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    let length = u32::from_be_bytes(length) as usize;
    if length > FRAME_BYTES_MAX {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {length} bytes")));
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await?;
    Ok(Some(body))
}

/// The client side for one peer: a pool of idle connections.
pub(crate) struct PeerClient {
    address: String,
    /// Local address every connection is bound to (`ControllerConfig::source_address`).
    source_address: Option<IpAddr>,
    cluster_id: Arc<str>,
    idle: Mutex<Vec<TcpStream>>,
    /// The last call got an answer: a change is logged once, not every retry.
    reachable: AtomicBool,
}

impl PeerClient {
    pub(crate) fn new(address: String, source_address: Option<IpAddr>, cluster_id: Arc<str>) -> PeerClient {
        PeerClient {
            address,
            source_address,
            cluster_id,
            idle: Mutex::new(Vec::new()),
            reachable: AtomicBool::new(true),
        }
    }

    /// Sends `request` and waits for the answer, within `timeout` overall.
    pub(crate) async fn call(&self, request: &Request, timeout: Duration) -> Result<Response, RpcError> {
        let frame = encode(&Envelope { cluster_id: &self.cluster_id, request })?;
        let result = tokio::time::timeout(timeout, self.exchange(&frame)).await.map_err(|_| RpcError::Timeout)?;
        match &result {
            Ok(_) if !self.reachable.swap(true, Ordering::Relaxed) => {
                tracing::info!(peer = %self.address, "controller peer reachable again");
            }
            Err(error) if self.reachable.swap(false, Ordering::Relaxed) => {
                tracing::warn!(peer = %self.address, %error, "controller peer unreachable; retrying quietly until it answers");
            }
            _ => {}
        }
        result
    }

    async fn exchange(&self, frame: &[u8]) -> Result<Response, RpcError> {
        let mut stream = match self.take_idle() {
            Some(stream) => stream,
            None => self.connect().await?,
        };
        match exchange_on(&mut stream, frame).await? {
            Some(response) => {
                self.give_back(stream);
                Ok(response)
            }
            None => Err(RpcError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed the connection"))),
        }
    }

    /// An idle connection that still looks open: the peer may have closed it (restart), which
    /// shows as a readable end of stream. Checking before use means a request is never sent on
    /// a dead connection and then retried, which could apply a forwarded write twice.
    fn take_idle(&self) -> Option<TcpStream> {
        let mut idle = self.idle.lock().expect("pool lock poisoned");
        while let Some(stream) = idle.pop() {
            let mut probe = [0u8; 1];
            if matches!(stream.try_read(&mut probe), Err(error) if error.kind() == io::ErrorKind::WouldBlock) {
                return Some(stream);
            }
        }
        None
    }

    async fn connect(&self) -> Result<TcpStream, RpcError> {
        let connect = crate::net::connect_from(&self.address, self.source_address);
        let stream = tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS), connect)
            .await
            .map_err(|_| RpcError::Connect(self.address.clone(), io::ErrorKind::TimedOut.into()))?
            .map_err(|error| RpcError::Connect(self.address.clone(), error))?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    fn give_back(&self, stream: TcpStream) {
        let mut idle = self.idle.lock().expect("pool lock poisoned");
        if idle.len() < IDLE_CONNECTIONS_PER_PEER_MAX {
            idle.push(stream);
        }
    }
}

async fn exchange_on(stream: &mut TcpStream, frame: &[u8]) -> io::Result<Option<Response>> {
    stream.write_all(frame).await?;
    match read_frame(stream).await? {
        Some(body) => decode(&body).map(Some),
        None => Ok(None),
    }
}

/// What the server calls for each request.
pub(crate) type Handler = Arc<dyn Fn(Request) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

/// Serves requests from nodes of `cluster_id` until the task is aborted; aborting it closes
/// every connection.
pub(crate) async fn serve(listener: TcpListener, handler: Handler, cluster_id: String) {
    let cluster_id: Arc<str> = cluster_id.into();
    let permits = Arc::new(Semaphore::new(SERVER_CONNECTIONS_MAX));
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "controller rpc accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "controller rpc connection limit reached, closing");
            continue;
        };
        let handler = handler.clone();
        let cluster_id = cluster_id.clone();
        connections.spawn(async move {
            let _permit = permit;
            if let Err(error) = serve_connection(stream, handler, &cluster_id).await {
                tracing::debug!(%peer, %error, "controller rpc connection closed");
            }
        });
    }
}

/// True (and remembers now) when no foreign-cluster warning was logged within the interval.
fn foreign_cluster_warning_due() -> bool {
    static LAST: Mutex<Option<std::time::Instant>> = Mutex::new(None);
    let mut last = LAST.lock().expect("warning lock poisoned");
    let now = std::time::Instant::now();
    if last.is_some_and(|at| now - at < FOREIGN_CLUSTER_WARNING_INTERVAL) {
        return false;
    }
    *last = Some(now);
    true
}

async fn serve_connection(mut stream: TcpStream, handler: Handler, cluster_id: &str) -> io::Result<()> {
    stream.set_nodelay(true)?;
    while let Some(body) = read_frame(&mut stream).await? {
        let envelope: ReceivedEnvelope = decode(&body)?;
        if envelope.cluster_id != cluster_id {
            if !foreign_cluster_warning_due() {
                return Ok(());
            }
            let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::warn!(
                %peer,
                theirs = envelope.cluster_id,
                ours = cluster_id,
                "refusing controller RPC from another cluster (INCONSISTENT_CLUSTER_ID)"
            );
            return Ok(());
        }
        let response = handler(envelope.request).await;
        let frame = encode(&response)?;
        tokio::time::timeout(Duration::from_millis(RESPONSE_WRITE_TIMEOUT_MS), stream.write_all(&frame))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    }
    Ok(())
}
