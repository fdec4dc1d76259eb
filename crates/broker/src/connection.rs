//! One client connection: read frames, dispatch requests in arrival order, write responses
//! in the same order, with at most `max_inflight_requests_per_connection` outstanding.
//!
//! Bad input closes only this connection (as Kafka does): oversized or negative frame
//! sizes, undecodable headers or bodies, unknown APIs and unsupported versions. The one
//! exception is ApiVersions at an unsupported version, answered with UNSUPPORTED_VERSION.
//!
//! Memory (Kafka's `queued.max.request.bytes`): as soon as the size prefix and API key of
//! the next frame are read, the request is charged its size in the broker-wide
//! [`RequestMemory`] budget and in this connection's `queued_max_request_bytes_per_connection`,
//! before its body is read; the charge is held until its response is written (or the
//! connection closes). A connection that cannot be charged reads nothing more from its
//! socket (TCP pushes back on the client). It waits for the broker-wide budget only when
//! none of its own requests are in flight; otherwise it first lets them finish, since
//! they may hold what it waits for. Unread bytes are bounded by `READ_BUFFER_BYTES`.
//!
//! Before authentication (on a SASL listener; other listeners authenticate at once) a
//! frame may be at most `sasl.server.max.receive.size` and is charged to its connection
//! only, never to the shared budget: clients that have proved nothing cannot take the memory
//! of those that have. A larger one closes the connection (logged at a rate limit).
//!
//! Time: a request whose size prefix arrived must arrive whole within
//! `request_read_timeout_ms`, and a connection with nothing in flight that sends nothing
//! for `connections.max.idle.ms` is closed; either way its charges are released, so a
//! slow or silent client holds neither memory nor a connection slot for ever. A failed
//! SASL authentication is answered after `connection.failed.authentication.delay.ms` (a
//! timer, no thread held), then the connection closes.
//!
//! The stream is a TCP socket or a TLS session over one. On a SASL listener only
//! ApiVersions and the SASL exchange are served until the client authenticated
//! (`sluice_security::Authenticator`); any other request before that closes the
//! connection, as in Kafka.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use futures::stream::{FuturesOrdered, StreamExt};
use futures::FutureExt;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use kafka_protocol::ResponseError;
use sluice_protocol::{
    api_versions_response, decode_frame, encode_response, parse_request, peek_frame, FileChunk, FrameError, FrameHead,
    Request, RequestError, ResponseChunk, FRAME_SIZE_PREFIX_BYTES,
};
use sluice_security::{Authenticator, Next};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Duration, Instant};

use crate::handlers::{self, ClientSession, ResponseFuture};
use crate::Broker;

/// Bytes read from a socket beyond the frame being admitted: enough for the size prefix and
/// header of the next frame and many small pipelined requests. Not charged to the budget;
/// bounded per connection (with `max_connections`).
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Responses written with one vectored write at most, when several are complete at once.
const RESPONSES_PER_WRITE_MAX: usize = 16;
const _: () = assert!(RESPONSES_PER_WRITE_MAX >= 1);

/// Bytes of a response handed to the socket by one write (`writev` or `sendfile`), after
/// which the connection yields to the runtime before the next piece. A catch-up fetch
/// answers up to `fetch.max.bytes` (50 MiB) at once; copied in one call (on loopback the
/// receiver's TCP processing runs inside that call too) it would hold the I/O thread for
/// milliseconds while other connections' produce requests wait.
const RESPONSE_WRITE_PIECE_BYTES: usize = 256 * 1024;
const _: () = assert!(RESPONSE_WRITE_PIECE_BYTES >= 64 * 1024);

/// Serves one connection of listener `listener` (index in [`Broker::listeners`]) until
/// the client closes it or sends something that closes it. `certificate_user`: the
/// subject of the client's TLS certificate, its principal on an SSL listener.
pub(crate) async fn run(
    broker: Arc<Broker>,
    mut reader: impl AsyncRead + Unpin,
    mut writer: impl ResponseWriter,
    peer: SocketAddr,
    listener: usize,
    certificate_user: Option<String>,
) {
    let mut intake = Intake::new(&broker, peer, listener, certificate_user);
    let inflight_max = intake.inflight_max;
    let mut deadlines = Deadlines::new(broker.config(), Instant::now());
    // Armed for the nearest deadline; reset only when that moves (not at every read).
    let timer = tokio::time::sleep_until(deadlines.idle_due);
    tokio::pin!(timer);
    loop {
        // Over a quota: take no new request until the throttle time has passed (KIP-219).
        let muted = intake.session.throttle.remaining(broker.quotas.now_ms());
        let Some(Admitted { blocked_on_memory, frame_progress }) = intake.admit(&broker, muted.is_some()).await else {
            return;
        };
        let Intake { buffer, inflight, charges, connection_bytes, head, read_closed, .. } = &mut intake;
        // Read at most the rest of the admitted frame and READ_BUFFER_BYTES beyond it.
        let admitted = head.as_ref().map_or(0, |charge| FRAME_SIZE_PREFIX_BYTES + charge.bytes);
        let read_max = (admitted + READ_BUFFER_BYTES).saturating_sub(buffer.len());
        let can_read =
            !*read_closed && !blocked_on_memory && muted.is_none() && inflight.len() < inflight_max && read_max > 0;
        if inflight.is_empty() && !can_read && muted.is_none() {
            return;
        }
        let budgeted = head.as_ref().is_some_and(Charge::budgeted);
        if can_read && admitted > buffer.len() && budgeted {
            // Room for the admitted frame, allocated only now that it is charged. (Other
            // reads, and unauthenticated frames, go to the buffer's spare capacity, as
            // BytesMut grows it: memory only for bytes that arrived.)
            buffer.reserve(admitted - buffer.len());
        }
        deadlines.frame_read(frame_progress, can_read && !buffer.is_empty(), Instant::now);
        let deadline = deadlines.next(inflight.is_empty() && muted.is_none());
        if let Some((at, _)) = deadline.filter(|(at, _)| *at != timer.deadline()) {
            timer.as_mut().reset(at);
        }
        let mut limited = (&mut reader).take(read_max as u64);
        tokio::select! {
            () = &mut timer, if deadline.is_some() => {
                let reason = deadline.expect("a deadline is set").1;
                if deadlines.expired(reason, Instant::now()) {
                    close_for(&broker, &peer, reason, &deadlines);
                    return;
                }
            }
            () = tokio::time::sleep(muted.unwrap_or_default()), if muted.is_some() => {}
            Some(response) = inflight.next(), if !inflight.is_empty() => {
                // The responses already complete behind this one go out in the same write:
                // one syscall and one wake-up of the client for, e.g., the acknowledgements
                // of one group-commit round.
                let mut chunks = response.unwrap_or_default();
                let mut answered = 1;
                while answered < RESPONSES_PER_WRITE_MAX {
                    match inflight.next().now_or_never() {
                        Some(Some(response)) => {
                            chunks.extend(response.unwrap_or_default());
                            answered += 1;
                        }
                        _ => break,
                    }
                }
                if !chunks.is_empty() {
                    if let Err(error) = write_chunks(&mut writer, chunks, &broker).await {
                        tracing::debug!(%peer, %error, "write failed");
                        return;
                    }
                    deadlines.active(Instant::now());
                }
                // Answered: their memory goes back to the budgets.
                for _ in 0..answered {
                    let charge = charges.pop_front().expect("one charge per request in flight");
                    *connection_bytes -= charge.bytes;
                }
            }
            read = limited.read_buf(buffer), if can_read => match read {
                Ok(0) => *read_closed = true,
                Ok(_) => deadlines.active(Instant::now()),
                Err(error) => {
                    tracing::debug!(%peer, %error, "read failed");
                    return;
                }
            },
        }
    }
}

/// A connection's side that turns the bytes read into requests in flight: the buffer of
/// unread bytes, the requests dispatched and the memory charged for them, and who the
/// client is.
struct Intake {
    peer: SocketAddr,
    authenticator: Authenticator,
    session: ClientSession,
    buffer: BytesMut,
    inflight: FuturesOrdered<ResponseFuture>,
    /// The memory charged for each request in `inflight`, in the same order.
    charges: VecDeque<Charge>,
    /// Bytes charged to this connection: `charges` and `head`.
    connection_bytes: usize,
    /// The charge of the frame at the front of `buffer`, admitted but not yet whole.
    head: Option<Charge>,
    read_closed: bool,
    frame_bytes_max: usize,
    /// Before SASL authentication, Kafka's sasl.server.max.receive.size.
    unauthenticated_frame_bytes_max: usize,
    inflight_max: usize,
    connection_bytes_max: usize,
}

/// What one [`Intake::admit`] left for the reads.
struct Admitted {
    /// The next frame waits for memory this connection's own requests hold.
    blocked_on_memory: bool,
    /// A frame completed or was admitted: the next one gets a fresh read deadline.
    frame_progress: bool,
}

impl Intake {
    fn new(broker: &Broker, peer: SocketAddr, listener: usize, certificate_user: Option<String>) -> Intake {
        let config = broker.config();
        let authenticator = Authenticator::new(broker.listeners()[listener].protocol.uses_sasl(), certificate_user);
        Intake {
            peer,
            authenticator,
            session: ClientSession { peer, listener, principal: Arc::from(""), throttle: Default::default() },
            buffer: BytesMut::with_capacity(READ_BUFFER_BYTES),
            inflight: FuturesOrdered::new(),
            charges: VecDeque::new(),
            connection_bytes: 0,
            head: None,
            read_closed: false,
            frame_bytes_max: config.max_request_bytes,
            unauthenticated_frame_bytes_max: config.max_request_bytes.min(config.sasl_server_max_receive_size),
            inflight_max: config.max_inflight_requests_per_connection,
            connection_bytes_max: config.queued_max_request_bytes_per_connection,
        }
    }

    /// Turns buffered bytes into requests in flight while there is room (none while
    /// `muted`); `None` when the connection is to close.
    async fn admit(&mut self, broker: &Arc<Broker>, muted: bool) -> Option<Admitted> {
        let mut admitted = Admitted { blocked_on_memory: false, frame_progress: false };
        while !muted && self.inflight.len() < self.inflight_max {
            let charge = match self.head.take() {
                Some(charge) => charge,
                None => match self.charge_next(broker, &mut admitted).await? {
                    Some(charge) => charge,
                    None => break,
                },
            };
            if self.buffer.len() < FRAME_SIZE_PREFIX_BYTES + charge.bytes {
                self.head = Some(charge);
                break;
            }
            let frame =
                decode_frame(&mut self.buffer, self.frame_bytes_max).ok().flatten().expect("a whole checked frame");
            self.charges.push_back(charge);
            admitted.frame_progress = true;
            let request = match parse_request(frame) {
                Ok(request) => request,
                Err(error) => {
                    self.inflight.push_back(reject(error, &self.peer)?);
                    continue;
                }
            };
            if !self.take(broker, request).await? {
                break;
            }
        }
        Some(admitted)
    }

    /// Charges the frame at the front of the buffer: `Some(None)` when there is none yet or
    /// it waits for memory, `None` when it closes the connection.
    async fn charge_next(&mut self, broker: &Broker, admitted: &mut Admitted) -> Option<Option<Charge>> {
        let authenticated = self.authenticator.user().is_some();
        let limit = if authenticated { self.frame_bytes_max } else { self.unauthenticated_frame_bytes_max };
        let next = match peek_frame(&self.buffer, limit) {
            Ok(Some(next)) => next,
            Ok(None) => return Some(None),
            Err(error) => {
                refuse_frame(broker, &self.peer, &error, authenticated);
                return None;
            }
        };
        if !authenticated {
            // Bounded by sasl.server.max.receive.size; not the shared budget's.
            self.connection_bytes += next.size;
            return Some(Some(Charge::unbudgeted(next.size)));
        }
        // Alone, a connection may take any request up to max_request_bytes.
        let over_connection = self.connection_bytes + next.size > self.connection_bytes_max;
        let now = match over_connection && !self.inflight.is_empty() {
            true => None,
            false => broker.request_memory.try_charge(next),
        };
        let charged = match now {
            Some(charge) => charge,
            None if self.inflight.is_empty() => {
                admitted.frame_progress = true;
                broker.request_memory.charge(next).await
            }
            None => {
                // Our own requests hold memory: let them finish first.
                admitted.blocked_on_memory = true;
                return Some(None);
            }
        };
        self.connection_bytes += charged.bytes;
        Some(Some(charged))
    }

    /// Dispatches `request`, or runs its step of SASL authentication: `Some(true)` to take
    /// the next, `Some(false)` when nothing more is read from this client, `None` when the
    /// connection closes at once.
    async fn take(&mut self, broker: &Arc<Broker>, request: Request) -> Option<bool> {
        let peer = self.peer;
        let sasl_step = matches!(request.body, RequestKind::SaslHandshake(_) | RequestKind::SaslAuthenticate(_));
        if !sasl_step && self.authenticator.session_expired() {
            tracing::info!(%peer, "closing connection: SASL session expired without re-authentication (KIP-368)");
            return None;
        }
        if !sasl_step && (self.authenticator.user().is_some() || request.api_key == ApiKey::ApiVersions) {
            if self.session.principal.is_empty() {
                if let Some(user) = self.authenticator.user() {
                    self.session.principal = Arc::from(format!("User:{user}"));
                }
            }
            self.inflight.push_back(handlers::dispatch(broker, request, &self.session));
            return Some(true);
        }
        match authenticate(broker, &mut self.authenticator, request, &peer).await? {
            (response, Next::Continue) => {
                self.inflight.push_back(response);
                Some(true)
            }
            (response, Next::Close) => {
                // Answer, then close: nothing more is read from this client.
                self.inflight.push_back(response);
                self.read_closed = true;
                self.buffer.clear();
                Some(false)
            }
        }
    }
}

/// The broker-wide budget of request bytes (`queued_max_request_bytes`, Kafka's
/// `queued.max.request.bytes`), charged by every request from when its size is read until
/// its response is written. Produce requests, held while awaiting durability or
/// replication, may take only part of it (`QUEUED_REQUEST_BYTES_NON_PRODUCE_SHARE`): the
/// rest stays for the fetches (of followers, of consumers) that let them complete.
pub(crate) struct RequestMemory {
    all: Arc<Semaphore>,
    all_bytes: usize,
    produce: Arc<Semaphore>,
    produce_bytes: usize,
}

/// Memory charged for one request; given back when dropped.
pub(crate) struct Charge {
    /// The request's size (frame body bytes), as charged to its connection.
    bytes: usize,
    /// `None` for a request before authentication, which the shared budget never holds.
    all: Option<OwnedSemaphorePermit>,
    _produce: Option<OwnedSemaphorePermit>,
}

impl Charge {
    /// A request before authentication (at most `sasl.server.max.receive.size`): charged
    /// to its connection only.
    fn unbudgeted(bytes: usize) -> Charge {
        Charge { bytes, all: None, _produce: None }
    }

    /// Whether the shared budget holds this request's bytes.
    fn budgeted(&self) -> bool {
        self.all.is_some()
    }
}

impl RequestMemory {
    pub(crate) fn new(all_bytes: usize) -> RequestMemory {
        let produce_bytes = all_bytes - all_bytes / sluice_config::QUEUED_REQUEST_BYTES_NON_PRODUCE_SHARE;
        RequestMemory {
            all: Arc::new(Semaphore::new(all_bytes)),
            all_bytes,
            produce: Arc::new(Semaphore::new(produce_bytes)),
            produce_bytes,
        }
    }

    /// Bytes charged by requests in flight: (all requests, produce requests).
    pub(crate) fn held(&self) -> (usize, usize) {
        (
            self.all_bytes.saturating_sub(self.all.available_permits()),
            self.produce_bytes.saturating_sub(self.produce.available_permits()),
        )
    }

    /// Permits a request of `size` bytes takes from a budget of `budget`: its size, or the
    /// whole budget for a request larger than it (which then runs alone rather than never).
    fn permits(size: usize, budget: usize) -> u32 {
        // max_request_bytes <= i32::MAX (config validation).
        size.min(budget) as u32
    }

    /// Charges the request now, or returns `None` when the budget is short.
    fn try_charge(&self, head: FrameHead) -> Option<Charge> {
        let produce = match head.api_key == Some(ApiKey::Produce as i16) {
            true => {
                let permits = Self::permits(head.size, self.produce_bytes);
                Some(self.produce.clone().try_acquire_many_owned(permits).ok()?)
            }
            false => None,
        };
        let all = self.all.clone().try_acquire_many_owned(Self::permits(head.size, self.all_bytes)).ok()?;
        Some(Charge { bytes: head.size, all: Some(all), _produce: produce })
    }

    /// Charges the request, waiting (in arrival order) for memory to be given back. The
    /// produce share is taken first: a produce request waiting for it holds nothing the
    /// other requests need.
    async fn charge(&self, head: FrameHead) -> Charge {
        let produce = match head.api_key == Some(ApiKey::Produce as i16) {
            true => {
                let permits = Self::permits(head.size, self.produce_bytes);
                Some(self.produce.clone().acquire_many_owned(permits).await.expect("never closed"))
            }
            false => None,
        };
        let permits = Self::permits(head.size, self.all_bytes);
        let all = self.all.clone().acquire_many_owned(permits).await.expect("never closed");
        Charge { bytes: head.size, all: Some(all), _produce: produce }
    }
}

/// Answers a SASL request, or refuses (`None`: close the connection) any other request
/// of a client that has not authenticated. A failure is answered after
/// `connection.failed.authentication.delay.ms`, then the connection closes.
async fn authenticate(
    broker: &Arc<Broker>,
    authenticator: &mut Authenticator,
    request: Request,
    peer: &SocketAddr,
) -> Option<(ResponseFuture, Next)> {
    let Request { api_key, api_version, correlation_id, body, .. } = request;
    let (body, next) = match body {
        RequestKind::SaslHandshake(request) => {
            let (response, next) = authenticator.handshake(&**broker, request);
            (ResponseKind::SaslHandshake(response), next)
        }
        RequestKind::SaslAuthenticate(request) => {
            // A few SASL steps at once broker-wide: PBKDF2 takes milliseconds of CPU.
            let _turn = broker.connection_limits.sasl_step_turn().await;
            let (response, next) = authenticator.authenticate_off_io_thread(broker, request).await;
            (ResponseKind::SaslAuthenticate(response), next)
        }
        _ => {
            tracing::info!(%peer, ?api_key, "closing connection: request before SASL authentication");
            return None;
        }
    };
    let bytes = match encode_response(api_key, api_version, correlation_id, &body, Vec::new()) {
        Ok(bytes) => Some(bytes),
        Err(error) => {
            tracing::error!(?api_key, %error, "failed to encode a SASL response");
            None
        }
    };
    let delay = match next {
        Next::Continue => Duration::ZERO,
        Next::Close => {
            broker.metrics.connection_closed_for("failed_authentication");
            Duration::from_millis(broker.config().connection_failed_authentication_delay_ms)
        }
    };
    let answer = async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        bytes
    };
    Some((Box::pin(answer), next))
}

/// Why the broker closes a connection on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CloseReason {
    /// Nothing in flight and nothing received for `connections.max.idle.ms`.
    Idle,
    /// A request begun and not whole within `request_read_timeout_ms`.
    RequestReadTimeout,
}

/// The times at which a connection is closed for what its client does not send.
struct Deadlines {
    idle: Duration,
    request_read: Duration,
    /// When bytes last moved either way.
    active_at: Instant,
    /// When the connection is next checked for being idle: `active_at + idle` as it was
    /// when last checked (moved on lazily, so a busy connection never resets its timer).
    idle_due: Instant,
    /// When the request at the front of the buffer, begun, must be whole.
    frame_due: Option<Instant>,
}

impl Deadlines {
    fn new(config: &crate::BrokerConfig, now: Instant) -> Deadlines {
        let idle = Duration::from_millis(config.connections_max_idle_ms);
        let request_read = Duration::from_millis(config.request_read_timeout_ms);
        assert!(!idle.is_zero() && !request_read.is_zero(), "validated at startup");
        Deadlines { idle, request_read, active_at: now, idle_due: now + idle, frame_due: None }
    }

    fn active(&mut self, now: Instant) {
        self.active_at = now;
    }

    /// `progress`: a request was read whole or admitted since the last call. `waiting`:
    /// part of a request is buffered and the connection reads the rest.
    fn frame_read(&mut self, progress: bool, waiting: bool, now: impl FnOnce() -> Instant) {
        if progress || !waiting {
            self.frame_due = None;
        }
        if waiting && self.frame_due.is_none() {
            self.frame_due = Some(now() + self.request_read);
        }
    }

    /// The earliest deadline and why; the idle one only when `idle_applies` (nothing in
    /// flight or throttled).
    fn next(&self, idle_applies: bool) -> Option<(Instant, CloseReason)> {
        let idle = idle_applies.then_some((self.idle_due, CloseReason::Idle));
        let read = self.frame_due.map(|due| (due, CloseReason::RequestReadTimeout));
        match (idle, read) {
            (Some(idle), Some(read)) => Some(if read.0 <= idle.0 { read } else { idle }),
            (idle, read) => idle.or(read),
        }
    }

    /// The deadline for `reason` passed: whether the connection must close (no: bytes
    /// moved since the idle check was set, and it is set again from then).
    fn expired(&mut self, reason: CloseReason, now: Instant) -> bool {
        match reason {
            CloseReason::RequestReadTimeout => true,
            CloseReason::Idle => {
                let due = self.active_at + self.idle;
                if due <= now {
                    return true;
                }
                assert!(due > self.idle_due, "activity only moves the idle deadline later");
                self.idle_due = due;
                false
            }
        }
    }
}

/// Logs (and counts) a connection closed for `reason`.
fn close_for(broker: &Broker, peer: &SocketAddr, reason: CloseReason, deadlines: &Deadlines) {
    let (label, setting, limit) = match reason {
        CloseReason::Idle => ("idle", "connections.max.idle.ms", deadlines.idle),
        CloseReason::RequestReadTimeout => ("request_read_timeout", "request_read_timeout_ms", deadlines.request_read),
    };
    broker.metrics.connection_closed_for(label);
    tracing::debug!(%peer, setting, limit_ms = limit.as_millis() as u64, "closing connection: {label}");
}

/// Logs a frame that closes its connection; one before authentication larger than
/// `sasl.server.max.receive.size` at a rate limit (many clients may send them at once).
fn refuse_frame(broker: &Broker, peer: &SocketAddr, error: &FrameError, authenticated: bool) {
    if authenticated || !matches!(error, FrameError::TooLarge { .. }) {
        tracing::warn!(%peer, %error, "closing connection: bad frame");
        return;
    }
    broker.metrics.connection_closed_for("unauthenticated_frame_too_large");
    if let Some(unlogged) = broker.connection_limits.oversized_unauthenticated_frames_log.admit_now() {
        tracing::warn!(
            %peer,
            %error,
            refused_unlogged = unlogged,
            "closing connection: a request before authentication is larger than sasl.server.max.receive.size"
        );
    }
}

/// The writing half of a connection: a TCP socket can also send file ranges with
/// `sendfile`; a TLS session cannot (it must encrypt the bytes).
pub(crate) trait ResponseWriter: AsyncWrite + Unpin {
    fn socket(&self) -> Option<&tokio::net::TcpStream> {
        None
    }
}

impl ResponseWriter for tokio::net::tcp::OwnedWriteHalf {
    fn socket(&self) -> Option<&tokio::net::TcpStream> {
        Some(self.as_ref())
    }
}

impl<T: AsyncRead + AsyncWrite> ResponseWriter for tokio::io::WriteHalf<T> {}

/// Writes all chunks of a response: runs of bytes with vectored writes (record batches of a
/// fetch are separate chunks, sent without another copy), file ranges with `sendfile`.
async fn write_chunks(
    writer: &mut impl ResponseWriter,
    chunks: Vec<ResponseChunk>,
    broker: &Broker,
) -> std::io::Result<()> {
    let mut run: Vec<bytes::Bytes> = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        match chunk {
            ResponseChunk::Bytes(bytes) => run.push(bytes),
            ResponseChunk::File(file) => {
                write_all_vectored(writer, std::mem::take(&mut run)).await?;
                send_file(writer, &file).await?;
                broker.metrics.sendfile_bytes.inc_by(file.length as u64);
            }
        }
    }
    write_all_vectored(writer, run).await
}

/// Writes `chunks` in pieces of [`RESPONSE_WRITE_PIECE_BYTES`] at most, yielding between
/// pieces.
async fn write_all_vectored(writer: &mut impl ResponseWriter, mut chunks: Vec<bytes::Bytes>) -> std::io::Result<()> {
    use bytes::Buf;
    let mut first = 0;
    while first < chunks.len() {
        let mut room = RESPONSE_WRITE_PIECE_BYTES;
        let slices: Vec<std::io::IoSlice<'_>> = chunks[first..]
            .iter()
            .map_while(|chunk| {
                (room > 0).then(|| {
                    let take = chunk.len().min(room);
                    room -= take;
                    std::io::IoSlice::new(&chunk[..take])
                })
            })
            .collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let chunk = &mut chunks[first];
            let step = written.min(chunk.len());
            chunk.advance(step);
            written -= step;
            if chunk.is_empty() {
                first += 1;
            }
        }
        if first < chunks.len() {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// Sends a file range: from the page cache straight to the socket on TCP (in pieces of
/// [`RESPONSE_WRITE_PIECE_BYTES`], yielding between them), through memory otherwise. A file
/// shorter than the range (it never is: the range is below the high watermark) fails the
/// write, which closes the connection rather than send a short frame.
async fn send_file(writer: &mut impl ResponseWriter, chunk: &FileChunk) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let Some(socket) = writer.socket() else {
        let bytes = sluice_storage::read_file_range(&chunk.file, chunk.position, chunk.length)?;
        return writer.write_all(&bytes).await;
    };
    let mut offset = libc::off_t::try_from(chunk.position).map_err(std::io::Error::other)?;
    let mut left = chunk.length;
    while left > 0 {
        let sent = socket
            .async_io(tokio::io::Interest::WRITABLE, || {
                // SAFETY: both descriptors are open for the call; `offset` is a live local.
                let piece = left.min(RESPONSE_WRITE_PIECE_BYTES);
                let sent = unsafe { libc::sendfile(socket.as_raw_fd(), chunk.file.as_raw_fd(), &mut offset, piece) };
                usize::try_from(sent).map_err(|_| std::io::Error::last_os_error())
            })
            .await;
        let sent = match sent {
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            sent => sent?,
        };
        if sent == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "a segment file is shorter than its range",
            ));
        }
        left -= sent;
        if left > 0 {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// What to do with a request that could not be decoded: an answer for ApiVersions at an
/// unsupported version, otherwise `None` (close the connection).
fn reject(error: RequestError, peer: &SocketAddr) -> Option<ResponseFuture> {
    if let RequestError::UnsupportedVersion { api_key: ApiKey::ApiVersions, api_version, correlation_id } = error {
        tracing::info!(%peer, api_version, "ApiVersions at an unsupported version: answering with our ranges");
        let body = ResponseKind::ApiVersions(api_versions_response(ResponseError::UnsupportedVersion.code()));
        let bytes = encode_response(ApiKey::ApiVersions, 0, correlation_id, &body, Vec::new()).ok();
        return Some(Box::pin(async move { bytes }));
    }
    tracing::warn!(%peer, %error, "closing connection: bad request");
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(size: usize, api_key: ApiKey) -> FrameHead {
        FrameHead { size, api_key: Some(api_key as i16) }
    }

    #[test]
    fn idle_connections_and_slow_requests_reach_their_deadlines() {
        use CloseReason::{Idle, RequestReadTimeout};
        let ms = Duration::from_millis;
        let config =
            crate::BrokerConfig { connections_max_idle_ms: 1_000, request_read_timeout_ms: 300, ..Default::default() };
        let start = Instant::now();
        let mut deadlines = Deadlines::new(&config, start);
        assert_eq!(deadlines.next(false), None, "a connection with requests in flight is not idle");
        assert_eq!(deadlines.next(true), Some((start + ms(1_000), Idle)));
        // A begun request must be whole sooner; trickling bytes do not move its deadline.
        deadlines.frame_read(false, true, || start);
        assert_eq!(deadlines.next(true), Some((start + ms(300), RequestReadTimeout)));
        deadlines.active(start + ms(200));
        deadlines.frame_read(false, true, || start + ms(200));
        assert_eq!(deadlines.next(true), Some((start + ms(300), RequestReadTimeout)));
        assert!(deadlines.expired(RequestReadTimeout, start + ms(300)));
        // Once it is whole, the next one starts afresh.
        deadlines.frame_read(true, true, || start + ms(250));
        assert_eq!(deadlines.next(false), Some((start + ms(550), RequestReadTimeout)));
        deadlines.frame_read(false, false, || unreachable!("not waiting"));
        assert_eq!(deadlines.next(false), None);
        // The idle check comes due, but bytes moved since: it is set again from them.
        assert!(!deadlines.expired(Idle, start + ms(1_000)));
        assert_eq!(deadlines.next(true), Some((start + ms(1_200), Idle)));
        assert!(deadlines.expired(Idle, start + ms(1_200)));
    }

    #[tokio::test]
    async fn requests_are_charged_and_produce_leaves_room_for_the_others() {
        let memory = RequestMemory::new(8 << 20);
        // Produce requests take at most 7/8 of the budget...
        let first = memory.try_charge(head(4 << 20, ApiKey::Produce)).expect("room");
        assert!(memory.try_charge(head((3 << 20) + 1, ApiKey::Produce)).is_none(), "over the produce share");
        assert_eq!(memory.held(), (4 << 20, 4 << 20));
        // ...the rest is for the fetches that complete them; every kind is charged.
        let fetch = memory.try_charge(head(3 << 20, ApiKey::Fetch)).expect("room for fetches");
        let small = memory.try_charge(head(1 << 20, ApiKey::Metadata)).expect("room");
        assert_eq!(memory.held(), (8 << 20, 4 << 20));
        assert!(memory.try_charge(head(1, ApiKey::ApiVersions)).is_none(), "budget spent");
        drop((fetch, small));
        assert_eq!(memory.held(), (4 << 20, 4 << 20));
        // A request larger than the budget is charged the whole of it: it waits for all the
        // memory, then runs alone.
        let waiting = tokio::spawn(async move {
            let big = memory.charge(head(100 << 20, ApiKey::Metadata)).await;
            assert_eq!(big.bytes, 100 << 20);
            assert_eq!(memory.held(), (8 << 20, 0));
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "charged while the budget is held");
        drop(first);
        waiting.await.unwrap();
    }

    /// Records every write a connection makes, and the bytes.
    #[derive(Clone, Default)]
    struct RecordingWriter(Arc<std::sync::Mutex<(usize, Vec<u8>)>>);

    impl AsyncWrite for RecordingWriter {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.poll_write_vectored_inner(&[std::io::IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.poll_write_vectored_inner(bufs)
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    impl RecordingWriter {
        fn poll_write_vectored_inner(&self, bufs: &[std::io::IoSlice<'_>]) -> std::task::Poll<std::io::Result<usize>> {
            let mut recorded = self.0.lock().unwrap();
            recorded.0 += 1;
            let before = recorded.1.len();
            for buf in bufs {
                recorded.1.extend_from_slice(buf);
            }
            std::task::Poll::Ready(Ok(recorded.1.len() - before))
        }
    }

    impl ResponseWriter for RecordingWriter {}

    #[tokio::test]
    async fn a_large_response_goes_out_in_pieces_with_other_tasks_run_between_them() {
        let chunks: Vec<bytes::Bytes> = (0..10u8).map(|i| bytes::Bytes::from(vec![i; 100_000])).collect();
        let expected: Vec<u8> = chunks.iter().flat_map(|chunk| chunk.iter().copied()).collect();
        let writer = RecordingWriter::default();
        // Another connection's task on the same (current-thread) runtime: notes how many
        // pieces had gone out each time it ran.
        let seen = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
        let other = tokio::spawn({
            let (writer, seen) = (writer.clone(), seen.clone());
            async move {
                loop {
                    let writes = writer.0.lock().unwrap().0;
                    seen.lock().unwrap().insert(writes);
                    tokio::task::yield_now().await;
                }
            }
        });
        write_all_vectored(&mut writer.clone(), chunks).await.unwrap();
        other.abort();
        let (writes, bytes) = writer.0.lock().unwrap().clone();
        assert!(bytes == expected, "the response arrives whole and in order");
        assert_eq!(writes, expected.len().div_ceil(RESPONSE_WRITE_PIECE_BYTES), "one write per piece");
        let seen = seen.lock().unwrap();
        assert!((1..writes).all(|w| seen.contains(&w)), "the other task ran between pieces: {seen:?}");
    }

    #[tokio::test]
    async fn pipelined_requests_answered_at_once_go_out_in_order_in_one_write() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::BrokerConfig { data_dir: dir.path().to_path_buf(), ..Default::default() };
        let broker = Broker::open(config).unwrap();
        let mut pipelined = Vec::new();
        for correlation_id in 1..=3 {
            let body = RequestKind::ApiVersions(Default::default());
            let frame = sluice_protocol::encode_request(ApiKey::ApiVersions, 3, correlation_id, "test", &body).unwrap();
            pipelined.extend_from_slice(&frame);
        }
        let writer = RecordingWriter::default();
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        // The client sends its three requests and closes its side: the connection answers
        // all three, then ends.
        run(broker, &pipelined[..], writer.clone(), peer, 0, None).await;

        let (writes, bytes) = writer.0.lock().unwrap().clone();
        let mut rest = &bytes[..];
        let mut correlation_ids = Vec::new();
        while !rest.is_empty() {
            let size = i32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
            let (frame, after) = rest[4..].split_at(size);
            let (correlation_id, body) =
                sluice_protocol::decode_response(ApiKey::ApiVersions, 3, bytes::Bytes::copy_from_slice(frame)).unwrap();
            let ResponseKind::ApiVersions(versions) = body else { panic!("not an ApiVersions response") };
            assert_eq!(versions.error_code, 0);
            correlation_ids.push(correlation_id);
            rest = after;
        }
        assert_eq!(correlation_ids, [1, 2, 3], "every request answered, in order");
        assert_eq!(writes, 1, "the three responses, complete together, go out in one write");
    }
}
