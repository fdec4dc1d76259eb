//! The controller RPC: raft messages, heartbeats and forwarded writes between controllers,
//! over plain TCP on each node's controller address.
//!
//! Protection (always; `ControllerConfig::rpc_secret`, a secret every node shares): on
//! accept the server first sends a random nonce; every frame is then encrypted and
//! authenticated with keys derived from the secret and that nonce, for its direction and
//! its sequence number on the connection ([`crate::rpc_protection`]). A frame that does not
//! open closes the connection unanswered, so a process without the secret cannot read
//! controller traffic, vote, replicate, heartbeat or propose writes, and a recorded frame
//! cannot be replayed (another connection has another nonce; the same one, another
//! sequence). A peer that speaks only the older signed framing is answered in it, and
//! spoken to in it for [`SIGNED_FRAMES_FOR`] after it closed an encrypted first frame.
//!
//! Until its first frame verifies, a connection is a stranger's, and strangers get little:
//! at most [`STRANGER_CONNECTIONS_MAX`] of them at once (a new one pushes out the oldest, so
//! idle connections held by someone without the secret never keep a peer out), a first
//! frame of at most [`FIRST_FRAME_BYTES_MAX`] that must arrive within
//! [`FIRST_FRAME_TIMEOUT`], and memory only as its bytes arrive (an announced length
//! reserves nothing). A peer's connection idle for [`SERVER_IDLE_TIMEOUT`] is closed; its
//! client stops reusing a connection well before that ([`CLIENT_IDLE_REUSE_MAX`]).
//!
//! TLS (optional, `ControllerConfig::rpc_tls`): connections run over TLS as well; the
//! client checks the server's certificate and name (the voter address's host). Who may talk
//! is still decided by the shared secret, so TLS here needs no client certificates.
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
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::metadata::CommandResult;
use crate::quorum::{QuorumDescription, VoterChange, VoterChangeError};
use crate::rpc_protection::{Direction, FrameCipher, Protection, NONCE_BYTES};
use crate::types::{Proposal, TypeConfig};

/// Largest frame either side accepts (openraft chunks snapshots well below this).
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// Largest first frame of a connection, before anything on it has been authenticated: a
/// peer's first request on a new connection is a vote, a heartbeat, a forwarded write, an
/// append of at most openraft's entries per payload, or a snapshot chunk (3 MiB), all
/// below this.
pub(crate) const FIRST_FRAME_BYTES_MAX: usize = 8 << 20;
/// How long a new connection may take to deliver its first whole frame.
pub(crate) const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections whose first frame has not verified yet, at most, at once.
pub(crate) const STRANGER_CONNECTIONS_MAX: usize = 32;
/// How long a frame whose length has arrived may take to arrive whole.
const FRAME_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A server closes a connection that carried no request for this long.
pub(crate) const SERVER_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// A client reuses a pooled connection only if it was idle for less than this, well below
/// [`SERVER_IDLE_TIMEOUT`], so that it never sends on a connection the server is closing.
pub(crate) const CLIENT_IDLE_REUSE_MAX: Duration = Duration::from_secs(30);
const _: () = assert!(FIRST_FRAME_BYTES_MAX <= FRAME_BYTES_MAX);
const _: () = assert!(CLIENT_IDLE_REUSE_MAX.as_secs() * 2 <= SERVER_IDLE_TIMEOUT.as_secs());
/// How long a client speaks signed frames to a peer that closed an encrypted first frame
/// unanswered (a node that knows only those), before it tries encrypted frames again.
pub(crate) const SIGNED_FRAMES_FOR: Duration = Duration::from_secs(60);
/// Connections a controller serves at once; more are closed on accept.
pub(crate) const SERVER_CONNECTIONS_MAX: usize = 256;
/// Idle connections kept per peer for reuse.
pub(crate) const IDLE_CONNECTIONS_PER_PEER_MAX: usize = 4;
/// Bound on establishing a TCP connection to a peer.
pub(crate) const CONNECT_TIMEOUT_MS: u64 = 500;
/// Requests from another cluster are logged at most once per this period (they repeat
/// every few milliseconds while the other cluster retries).
const FOREIGN_CLUSTER_WARNING_INTERVAL: Duration = Duration::from_secs(60);
/// Bound on a server's TLS handshake with a connecting peer.
const RPC_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on writing a response back.
const RESPONSE_WRITE_TIMEOUT_MS: u64 = 5_000;

const _: () = assert!(FRAME_BYTES_MAX <= u32::MAX as usize);
/// Shortest accepted shared secret.
pub const RPC_SECRET_BYTES_MIN: usize = 16;
/// Frames that fail authentication are logged at most once per this period.
const UNAUTHENTICATED_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// Who a node is to its peers: its cluster, the secret its frames are authenticated with
/// and, when set, the TLS its connections run over.
#[derive(Clone)]
pub(crate) struct Identity {
    pub(crate) cluster_id: Arc<str>,
    pub(crate) secret: Arc<[u8]>,
    pub(crate) tls: Option<RpcTls>,
}

/// TLS for controller RPC: the server side (this node's certificate) and the client side
/// (the CAs that peers' certificates must chain to).
#[derive(Clone)]
pub struct RpcTls {
    /// Accepts peers' connections with this node's certificate.
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Connects to peers, checking their certificates and names.
    pub connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for RpcTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RpcTls")
    }
}

/// A connection's byte stream: plain TCP or TLS over it.
trait RpcStream: AsyncRead + AsyncWrite + Unpin + Send {
    /// Whether an idle connection was closed (or sent something unasked) by the peer.
    fn closed_while_idle(&self) -> bool;
}

/// An idle socket with something to read was closed by the peer (or broke protocol):
/// either way it must not carry another request.
fn tcp_closed_while_idle(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    !matches!(stream.try_read(&mut probe), Err(error) if error.kind() == io::ErrorKind::WouldBlock)
}

impl RpcStream for TcpStream {
    fn closed_while_idle(&self) -> bool {
        tcp_closed_while_idle(self)
    }
}

impl RpcStream for tokio_rustls::client::TlsStream<TcpStream> {
    fn closed_while_idle(&self) -> bool {
        tcp_closed_while_idle(self.get_ref().0)
    }
}

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
    /// The sender's controller RPC address, by which the active controller adds a node that
    /// is not a voter to the quorum as an observer (absent from old nodes, all voters).
    #[serde(default)]
    pub(crate) controller_address: Option<String>,
    /// The id of the sender's controller directory (absent from old nodes).
    #[serde(default)]
    pub(crate) directory_id: Option<uuid::Uuid>,
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
    /// Kafka's DescribeQuorum, for the raft leader to answer.
    DescribeQuorum,
    /// Kafka's AddRaftVoter / RemoveRaftVoter, for the raft leader to make.
    ChangeVoters(VoterChange),
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
    DescribeQuorum(Result<QuorumDescription, Redirect>),
    ChangeVoters(VoterChangeReply),
}

/// Answer to a voter change.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum VoterChangeReply {
    /// The new voter set is committed.
    Done,
    /// This node is not the raft leader; the leader it knows of, if any.
    NotLeader(Option<i32>),
    /// Refused, and why.
    Refused(VoterChangeError),
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

/// Reads one frame's body of at most `bytes_max`, its length within `wait`; `Ok(None)` on a
/// clean end of stream before a frame starts. The body's memory grows as its bytes arrive,
/// whatever length was announced, and once the length has arrived the rest must within
/// [`FRAME_READ_TIMEOUT`].
async fn read_frame(
    stream: &mut (impl AsyncRead + Unpin),
    bytes_max: usize,
    wait: Duration,
) -> io::Result<Option<Vec<u8>>> {
    assert!(bytes_max <= FRAME_BYTES_MAX);
    let mut length = [0u8; 4];
    match tokio::time::timeout(wait, stream.read_exact(&mut length)).await {
        Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        Ok(Ok(_)) => {}
        Ok(Err(error)) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Ok(Err(error)) => return Err(error),
    }
    let length = u32::from_be_bytes(length) as usize;
    if length > bytes_max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {length} bytes (at most {bytes_max})"),
        ));
    }
    let mut body = Vec::new();
    let mut limited = (&mut *stream).take(length as u64);
    let read = limited.read_to_end(&mut body);
    tokio::time::timeout(FRAME_READ_TIMEOUT, read).await.map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    if body.len() < length {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some(body))
}

/// The client side for one peer: a pool of idle connections.
pub(crate) struct PeerClient {
    address: String,
    /// Local address every connection is bound to (`ControllerConfig::source_address`).
    source_address: Option<IpAddr>,
    identity: Identity,
    idle: Mutex<Vec<Connection>>,
    /// The last call got an answer: a change is logged once, not every retry.
    reachable: AtomicBool,
    /// Until when new connections to this peer use signed frames ([`SIGNED_FRAMES_FOR`]).
    signed_until: Mutex<Option<std::time::Instant>>,
}

impl PeerClient {
    pub(crate) fn new(address: String, source_address: Option<IpAddr>, identity: Identity) -> PeerClient {
        PeerClient {
            address,
            source_address,
            identity,
            idle: Mutex::new(Vec::new()),
            reachable: AtomicBool::new(true),
            signed_until: Mutex::new(None),
        }
    }

    /// Sends `request` and waits for the answer, within `timeout` overall.
    pub(crate) async fn call(&self, request: &Request, timeout: Duration) -> Result<Response, RpcError> {
        let frame = encode(&Envelope { cluster_id: &self.identity.cluster_id, request })?;
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
        let (connection, fresh) = match self.take_idle() {
            Some(connection) => (connection, false),
            None => (self.connect().await?, true),
        };
        let encrypted = connection.session.protection == Protection::Encrypted;
        match self.exchange_on(connection, frame).await {
            // A peer that closes a new connection's encrypted first frame unanswered knows
            // only signed frames (it applied nothing: the frame did not verify there).
            Err(RpcError::Io(error)) if fresh && encrypted && error.kind() == io::ErrorKind::UnexpectedEof => {
                *self.signed_until.lock().expect("lock poisoned") = Some(std::time::Instant::now() + SIGNED_FRAMES_FOR);
                tracing::info!(peer = %self.address, "controller peer speaks signed frames only; using them for a while");
                let connection = self.connect().await?;
                self.exchange_on(connection, frame).await
            }
            result => result,
        }
    }

    async fn exchange_on(&self, mut connection: Connection, frame: &[u8]) -> Result<Response, RpcError> {
        let sealed = connection.session.seal(Direction::Request, frame.to_vec())?;
        connection.stream.write_all(&sealed).await?;
        let Some(body) = read_frame(&mut connection.stream, FRAME_BYTES_MAX, FRAME_READ_TIMEOUT).await? else {
            return Err(RpcError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed the connection")));
        };
        let body = connection.session.open(Direction::Response, body)?;
        let response = decode(&body)?;
        connection.session.sequence += 1;
        self.give_back(connection);
        Ok(response)
    }

    /// How this client's new connections to the peer protect their frames.
    fn protection(&self) -> Protection {
        let signed_until = *self.signed_until.lock().expect("lock poisoned");
        match signed_until {
            Some(until) if std::time::Instant::now() < until => Protection::Signed,
            _ => Protection::Encrypted,
        }
    }

    /// An idle connection that still looks open: the peer may have closed it (restart), which
    /// shows as a readable end of stream. Checking before use means a request is never sent on
    /// a dead connection and then retried, which could apply a forwarded write twice. One
    /// idle for [`CLIENT_IDLE_REUSE_MAX`] is dropped: its server may be about to close it.
    fn take_idle(&self) -> Option<Connection> {
        let mut idle = self.idle.lock().expect("pool lock poisoned");
        while let Some(connection) = idle.pop() {
            if connection.idle_since.elapsed() < CLIENT_IDLE_REUSE_MAX && !connection.stream.closed_while_idle() {
                return Some(connection);
            }
        }
        None
    }

    async fn connect(&self) -> Result<Connection, RpcError> {
        let failed = |error: io::Error| RpcError::Connect(self.address.clone(), error);
        let connect = async {
            let tcp = crate::net::connect_from(&self.address, self.source_address).await?;
            tcp.set_nodelay(true)?;
            let mut stream: Box<dyn RpcStream> = match &self.identity.tls {
                None => Box::new(tcp),
                Some(tls) => {
                    let host = self.address.rsplit_once(':').map_or(self.address.as_str(), |(host, _)| host);
                    let name = rustls_pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
                    Box::new(tls.connector.connect(name, tcp).await?)
                }
            };
            // The server speaks first, with this connection's nonce.
            let nonce =
                read_frame(&mut stream, NONCE_BYTES, FRAME_READ_TIMEOUT).await?.ok_or(io::ErrorKind::UnexpectedEof)?;
            let nonce: [u8; NONCE_BYTES] = nonce
                .try_into()
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "no rpc nonce from the peer"))?;
            let session = FrameCipher::new(self.identity.secret.clone(), nonce, self.protection());
            Ok::<_, io::Error>(Connection { stream, session, idle_since: std::time::Instant::now() })
        };
        tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS), connect)
            .await
            .map_err(|_| failed(io::ErrorKind::TimedOut.into()))?
            .map_err(failed)
    }

    fn give_back(&self, mut connection: Connection) {
        connection.idle_since = std::time::Instant::now();
        let mut idle = self.idle.lock().expect("pool lock poisoned");
        if idle.len() < IDLE_CONNECTIONS_PER_PEER_MAX {
            idle.push(connection);
        }
    }
}

/// A pooled connection to a peer and its authentication state.
struct Connection {
    stream: Box<dyn RpcStream>,
    session: FrameCipher,
    /// When its last exchange ended.
    idle_since: std::time::Instant,
}

/// What the server calls for each request.
pub(crate) type Handler = Arc<dyn Fn(Request) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

/// The connections whose first frame has not verified yet, oldest first.
#[derive(Default)]
struct Strangers {
    next_id: u64,
    waiting: std::collections::VecDeque<(u64, tokio::task::AbortHandle)>,
}

/// A connection's place among the [`Strangers`] until it is admitted or ends.
struct StrangerSlot {
    strangers: Arc<Mutex<Strangers>>,
    id: u64,
}

impl StrangerSlot {
    /// The connection's first frame verified: it is a peer's and no longer pushed out.
    fn admit(&self) {
        self.strangers.lock().expect("strangers lock poisoned").waiting.retain(|(id, _)| *id != self.id);
    }
}

impl Drop for StrangerSlot {
    fn drop(&mut self) {
        self.admit();
    }
}

/// Serves requests from nodes of `cluster_id` until the task is aborted; aborting it closes
/// every connection.
pub(crate) async fn serve(listener: TcpListener, handler: Handler, identity: Identity) {
    let permits = Arc::new(Semaphore::new(SERVER_CONNECTIONS_MAX));
    let strangers = Arc::new(Mutex::new(Strangers::default()));
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
        let _ = stream.set_nodelay(true);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "controller rpc connection limit reached, closing");
            continue;
        };
        let handler = handler.clone();
        let identity = identity.clone();
        // Spawned under the lock, so that the slot is listed before the connection can
        // admit itself.
        let mut waiting = strangers.lock().expect("strangers lock poisoned");
        let id = waiting.next_id;
        waiting.next_id += 1;
        let slot = StrangerSlot { strangers: strangers.clone(), id };
        let task = connections.spawn(async move {
            let _permit = permit;
            report(peer, serve_stream(stream, peer, handler, &identity, slot).await);
        });
        waiting.waiting.push_back((id, task));
        if waiting.waiting.len() > STRANGER_CONNECTIONS_MAX {
            let (_, oldest) = waiting.waiting.pop_front().expect("over the limit");
            oldest.abort();
            if warning_due(&STRANGERS_WARNING_LAST, UNAUTHENTICATED_WARNING_INTERVAL) {
                tracing::warn!(
                    %peer,
                    limit = STRANGER_CONNECTIONS_MAX,
                    "controller rpc: too many connections that have not authenticated; closing the oldest"
                );
            }
        }
    }
}

/// One accepted connection, over TLS when configured.
async fn serve_stream(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    handler: Handler,
    identity: &Identity,
    slot: StrangerSlot,
) -> io::Result<()> {
    match &identity.tls {
        None => serve_connection(stream, peer, handler, identity, slot).await,
        Some(tls) => match tokio::time::timeout(RPC_TLS_HANDSHAKE_TIMEOUT, tls.acceptor.accept(stream)).await {
            Ok(Ok(stream)) => serve_connection(stream, peer, handler, identity, slot).await,
            Ok(Err(error)) => Err(error),
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")),
        },
    }
}

/// Logs how a connection ended: refusals at a rate limit, the rest at debug.
fn report(peer: std::net::SocketAddr, served: io::Result<()>) {
    match served {
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
            if warning_due(&UNAUTHENTICATED_WARNING_LAST, UNAUTHENTICATED_WARNING_INTERVAL) {
                tracing::warn!(%peer, %error, "refusing an unauthenticated controller RPC");
            }
        }
        Err(error) => tracing::debug!(%peer, %error, "controller rpc connection closed"),
        Ok(()) => {}
    }
}

static FOREIGN_CLUSTER_WARNING_LAST: Mutex<Option<std::time::Instant>> = Mutex::new(None);
static UNAUTHENTICATED_WARNING_LAST: Mutex<Option<std::time::Instant>> = Mutex::new(None);
static STRANGERS_WARNING_LAST: Mutex<Option<std::time::Instant>> = Mutex::new(None);

/// True (and remembers now) when no such warning was logged within `interval`.
fn warning_due(last: &Mutex<Option<std::time::Instant>>, interval: Duration) -> bool {
    let mut last = last.lock().expect("warning lock poisoned");
    let now = std::time::Instant::now();
    if last.is_some_and(|at| now - at < interval) {
        return false;
    }
    *last = Some(now);
    true
}

async fn serve_connection(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    peer: std::net::SocketAddr,
    handler: Handler,
    identity: &Identity,
    slot: StrangerSlot,
) -> io::Result<()> {
    let cluster_id = &*identity.cluster_id;
    let nonce: [u8; NONCE_BYTES] = rand::random();
    stream.write_all(&(NONCE_BYTES as u32).to_be_bytes()).await?;
    stream.write_all(&nonce).await?;
    let mut session = FrameCipher::new(identity.secret.clone(), nonce, Protection::Encrypted);
    loop {
        let admitted = session.sequence > 0;
        let read = match admitted {
            true => read_frame(&mut stream, FRAME_BYTES_MAX, SERVER_IDLE_TIMEOUT).await,
            false => read_frame(&mut stream, FIRST_FRAME_BYTES_MAX, FIRST_FRAME_TIMEOUT).await,
        };
        let body = match read {
            Ok(Some(body)) => body,
            Ok(None) => return Ok(()),
            Err(error) if admitted && error.kind() == io::ErrorKind::TimedOut => return Ok(()),
            Err(error) => return Err(error),
        };
        let body = match admitted {
            true => session.open(Direction::Request, body)?,
            false => session.open_first(body)?,
        };
        slot.admit();
        let envelope: ReceivedEnvelope = decode(&body)?;
        if envelope.cluster_id != cluster_id {
            if !warning_due(&FOREIGN_CLUSTER_WARNING_LAST, FOREIGN_CLUSTER_WARNING_INTERVAL) {
                return Ok(());
            }
            tracing::warn!(
                %peer,
                theirs = envelope.cluster_id,
                ours = cluster_id,
                "refusing controller RPC from another cluster (INCONSISTENT_CLUSTER_ID)"
            );
            return Ok(());
        }
        let response = handler(envelope.request).await;
        let frame = session.seal(Direction::Response, encode(&response)?)?;
        session.sequence += 1;
        tokio::time::timeout(Duration::from_millis(RESPONSE_WRITE_TIMEOUT_MS), stream.write_all(&frame))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a-secret-the-test-nodes-share";

    fn identity(secret: &[u8]) -> Identity {
        Identity { cluster_id: "rpc-test".into(), secret: Arc::from(secret), tls: None }
    }

    /// A server answering every heartbeat with `Accepted`; its address.
    async fn start_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let handler: Handler = Arc::new(|_| Box::pin(async { Response::Heartbeat(Redirect::Accepted) }));
        tokio::spawn(serve(listener, handler, identity(SECRET)));
        address
    }

    fn heartbeat() -> Request {
        Request::Heartbeat(Heartbeat {
            node_id: 1,
            incarnation: 1,
            host: "h".into(),
            port: 1,
            rack: None,
            endpoints: Vec::new(),
            metadata_version_max: 0,
            controller_address: None,
            directory_id: None,
        })
    }

    /// Reads until the server closes the connection; what it sent.
    async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
        let mut received = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut received))
            .await
            .expect("the server closes the connection")
            .unwrap();
        received
    }

    #[tokio::test]
    async fn a_peer_with_the_secret_is_answered_and_one_without_it_is_not() {
        let address = start_server().await;
        let ours = PeerClient::new(address.clone(), None, identity(SECRET));
        assert!(matches!(ours.call(&heartbeat(), Duration::from_secs(5)).await, Ok(Response::Heartbeat(_))));
        let theirs = PeerClient::new(address.clone(), None, identity(b"another-secret-of-enough-bytes"));
        assert!(theirs.call(&heartbeat(), Duration::from_secs(5)).await.is_err());
        // A frame without a MAC, as a forger without the secret writes it: only the nonce
        // comes back before the connection closes.
        let mut forger = TcpStream::connect(&address).await.unwrap();
        let frame = encode(&Envelope { cluster_id: "rpc-test", request: &heartbeat() }).unwrap();
        forger.write_all(&frame).await.unwrap();
        assert_eq!(read_until_closed(&mut forger).await.len(), 4 + NONCE_BYTES);
    }

    #[tokio::test]
    async fn a_first_frame_announcing_more_than_a_stranger_may_send_is_refused_at_once() {
        let address = start_server().await;
        let mut stranger = TcpStream::connect(&address).await.unwrap();
        let announced = u32::try_from(FIRST_FRAME_BYTES_MAX + 1).unwrap();
        stranger.write_all(&announced.to_be_bytes()).await.unwrap();
        assert_eq!(read_until_closed(&mut stranger).await.len(), 4 + NONCE_BYTES);
    }

    /// A server that knows only signed frames: it closes a connection whose frame does not
    /// verify as signed, and answers one that does.
    async fn start_signed_only_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let nonce: [u8; NONCE_BYTES] = rand::random();
                    stream.write_all(&(NONCE_BYTES as u32).to_be_bytes()).await.unwrap();
                    stream.write_all(&nonce).await.unwrap();
                    let mut session = FrameCipher::new(Arc::from(SECRET), nonce, Protection::Signed);
                    while let Ok(Some(body)) = read_frame(&mut stream, FRAME_BYTES_MAX, FRAME_READ_TIMEOUT).await {
                        if session.open(Direction::Request, body).is_err() {
                            return;
                        }
                        let answer = session
                            .seal(Direction::Response, encode(&Response::Heartbeat(Redirect::Accepted)).unwrap());
                        stream.write_all(&answer.unwrap()).await.unwrap();
                        session.sequence += 1;
                    }
                });
            }
        });
        address
    }

    #[tokio::test]
    async fn a_peer_that_knows_only_signed_frames_is_spoken_to_in_them() {
        let client = PeerClient::new(start_signed_only_server().await, None, identity(SECRET));
        for _ in 0..3 {
            let answer = client.call(&heartbeat(), Duration::from_secs(5)).await;
            assert!(matches!(answer, Ok(Response::Heartbeat(_))), "{answer:?}");
        }
        assert_eq!(client.protection(), Protection::Signed);
        // And a server answers such a client in kind.
        let server = start_server().await;
        let signed = PeerClient::new(server, None, identity(SECRET));
        *signed.signed_until.lock().unwrap() = Some(std::time::Instant::now() + SIGNED_FRAMES_FOR);
        assert!(matches!(signed.call(&heartbeat(), Duration::from_secs(5)).await, Ok(Response::Heartbeat(_))));
    }

    #[tokio::test]
    async fn idle_connections_of_strangers_never_keep_a_peer_out() {
        let address = start_server().await;
        // More than the server serves at once, all silent.
        let mut idle = Vec::new();
        for _ in 0..SERVER_CONNECTIONS_MAX + 8 {
            idle.push(TcpStream::connect(&address).await.unwrap());
        }
        let ours = PeerClient::new(address, None, identity(SECRET));
        let answer = ours.call(&heartbeat(), Duration::from_secs(5)).await;
        assert!(matches!(answer, Ok(Response::Heartbeat(_))), "{answer:?}");
    }
}
