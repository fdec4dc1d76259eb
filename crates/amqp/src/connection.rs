//! One AMQP connection: the handshake (protocol header, start/tune/open, a login against
//! the broker's users), heartbeats, and the frames of each channel handed to its task,
//! with a message's content frames assembled first.
//!
//! Why channels run as tasks of their own: a channel waiting for a produce to be durable
//! must not hold up the others, while the methods of one channel stay in order. A hard
//! error (a bad frame, a protocol violation) closes the whole connection with the code
//! RabbitMQ sends; a soft error closes only its channel ([`crate::channel`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{basic, channel, connection, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable, LongString};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::channel::{ChannelInput, Published};
use crate::frames::{encode, reply, FrameError, FrameReader, PROTOCOL_HEADER};
use crate::gateway::Session;
use crate::messages::Message;
use crate::{Server, CHANNEL_MAX, FRAME_MAX_BYTES, HEARTBEAT_S, MESSAGE_BYTES_MAX};

/// How long a client has to complete the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Encoded frames queued for the socket at most (then channels wait: back-pressure).
const OUTBOX_FRAMES: usize = 1024;
/// Inputs queued for one channel at most (then the connection stops reading the socket).
const CHANNEL_INBOX: usize = 256;
/// How long the connection waits for its channels to release what they hold at close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// What the handshake settled.
pub struct Negotiated {
    pub session: Session,
    pub frame_max: u32,
    pub channel_max: u16,
    pub heartbeat: u16,
    pub id: u64,
}

/// A connection-level error: the connection closes with this code and text.
struct HardError(u16, String);

/// A connection's byte streams, whatever carries them (TCP, or TLS over TCP).
pub type ReadStream = Box<dyn AsyncRead + Send + Unpin>;
pub type WriteStream = Box<dyn AsyncWrite + Send + Unpin>;

/// Who is at the other end, as the transport knows it.
struct Peer {
    address: SocketAddr,
    /// The user its verified TLS client certificate names (AMQPS only).
    certificate_user: Option<String>,
}

/// Serves one connection, read from `read` and written to `write`, until it ends.
/// `certificate_user`: the user a verified TLS client certificate names, for `EXTERNAL`.
pub async fn run(
    read: ReadStream,
    mut write: WriteStream,
    peer: SocketAddr,
    certificate_user: Option<String>,
    server: Arc<Server>,
) {
    let mut reader = FrameReader::new(read, FRAME_MAX_BYTES);
    let from = Peer { address: peer, certificate_user };
    let negotiated =
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut reader, &mut write, &from, &server)).await {
            Ok(Ok(negotiated)) => negotiated,
            Ok(Err(Some(HardError(code, text)))) => {
                tracing::debug!(%peer, code, %text, "AMQP handshake refused");
                let _ = write.write_all(&close_frame(code, &text, 0, 0)).await;
                return;
            }
            Ok(Err(None)) | Err(_) => return,
        };
    let (outbox, outgoing) = mpsc::channel(OUTBOX_FRAMES);
    let writer = tokio::spawn(write_frames(write, outgoing, negotiated.heartbeat));
    let mut connection = Connection { server, negotiated, outbox, channels: HashMap::new() };
    let ended = connection.serve(&mut reader).await;
    if let Err(HardError(code, text)) = &ended {
        tracing::debug!(%peer, code, %text, "AMQP connection closed by the server");
        let _ = connection.outbox.send(close_frame(*code, text, 0, 0)).await;
    }
    connection.close_channels().await;
    drop(connection.outbox);
    let _ = writer.await;
}

/// Writes queued frames; sends a heartbeat when nothing was written for half the interval.
async fn write_frames(mut write: WriteStream, mut outgoing: mpsc::Receiver<Vec<u8>>, heartbeat: u16) {
    let idle =
        if heartbeat == 0 { Duration::from_secs(3600) } else { Duration::from_millis(u64::from(heartbeat) * 500) };
    loop {
        let bytes = match tokio::time::timeout(idle, outgoing.recv()).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => break,
            Err(_) if heartbeat > 0 => encode(&AMQPFrame::Heartbeat),
            Err(_) => continue,
        };
        if write.write_all(&bytes).await.is_err() {
            break;
        }
    }
    let _ = write.shutdown().await;
}

fn close_frame(code: u16, text: &str, class_id: u16, method_id: u16) -> Vec<u8> {
    let text: String = text.chars().take(250).collect();
    encode(&AMQPFrame::Method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
            reply_code: code,
            reply_text: text.into(),
            class_id,
            method_id,
        })),
    ))
}

async fn next_method(reader: &mut FrameReader<ReadStream>) -> Result<AMQPClass, Option<HardError>> {
    loop {
        match reader.next().await {
            Ok(AMQPFrame::Method(0, method)) => return Ok(method),
            Ok(AMQPFrame::Heartbeat) => continue,
            Ok(_) => return Err(Some(HardError(reply::UNEXPECTED_FRAME, "expected a connection method".into()))),
            Err(FrameError::Invalid(code, text)) => return Err(Some(HardError(code, text))),
            Err(FrameError::Closed(_)) => return Err(None),
        }
    }
}

fn server_properties() -> FieldTable {
    let mut capabilities = FieldTable::default();
    for name in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "authentication_failure_close",
        "per_consumer_qos",
    ] {
        capabilities.insert(name.into(), AMQPValue::Boolean(true));
    }
    let mut properties = FieldTable::default();
    properties.insert("product".into(), AMQPValue::LongString("Sluice".into()));
    properties.insert("version".into(), AMQPValue::LongString(env!("CARGO_PKG_VERSION").into()));
    properties.insert("platform".into(), AMQPValue::LongString("Rust".into()));
    properties.insert("capabilities".into(), AMQPValue::FieldTable(capabilities));
    properties
}

async fn handshake(
    reader: &mut FrameReader<ReadStream>,
    write: &mut WriteStream,
    peer: &Peer,
    server: &Server,
) -> Result<Negotiated, Option<HardError>> {
    let header = reader.protocol_header().await.map_err(|_| None)?;
    if header != PROTOCOL_HEADER {
        // The spec's answer to a protocol it does not speak: the one it does, then close.
        let _ = write.write_all(&PROTOCOL_HEADER).await;
        return Err(None);
    }
    let start = connection::Start {
        version_major: 0,
        version_minor: 9,
        server_properties: server_properties(),
        // EXTERNAL (the TLS client certificate's user) only to a client that presented one.
        mechanisms: if peer.certificate_user.is_some() { "EXTERNAL PLAIN AMQPLAIN" } else { "PLAIN AMQPLAIN" }.into(),
        locales: "en_US".into(),
    };
    let frame = AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::Start(start)));
    write.write_all(&encode(&frame)).await.map_err(|_| None)?;
    let AMQPClass::Connection(connection::AMQPMethod::StartOk(start_ok)) = next_method(reader).await? else {
        return Err(Some(HardError(reply::COMMAND_INVALID, "expected connection.start-ok".into())));
    };
    let session = login(server, &start_ok, peer).await?;
    let tune = connection::Tune { channel_max: CHANNEL_MAX, frame_max: FRAME_MAX_BYTES, heartbeat: HEARTBEAT_S };
    let frame = AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::Tune(tune)));
    write.write_all(&encode(&frame)).await.map_err(|_| None)?;
    let AMQPClass::Connection(connection::AMQPMethod::TuneOk(tune_ok)) = next_method(reader).await? else {
        return Err(Some(HardError(reply::COMMAND_INVALID, "expected connection.tune-ok".into())));
    };
    let frame_max = match tune_ok.frame_max {
        0 => FRAME_MAX_BYTES,
        n if n < amq_protocol::protocol::constants::FRAME_MIN_SIZE => {
            return Err(Some(HardError(reply::NOT_ALLOWED, format!("frame_max {n} below the minimum 4096"))));
        }
        n => n.min(FRAME_MAX_BYTES),
    };
    reader.set_frame_max(frame_max);
    let channel_max = match tune_ok.channel_max {
        0 => CHANNEL_MAX,
        n => n.min(CHANNEL_MAX),
    };
    let AMQPClass::Connection(connection::AMQPMethod::Open(open)) = next_method(reader).await? else {
        return Err(Some(HardError(reply::COMMAND_INVALID, "expected connection.open".into())));
    };
    if open.virtual_host.as_str() != "/" {
        let text = format!("vhost '{}' not found (this server has the vhost '/')", open.virtual_host.as_str());
        return Err(Some(HardError(reply::NOT_ALLOWED, text)));
    }
    let frame = AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})));
    write.write_all(&encode(&frame)).await.map_err(|_| None)?;
    let id = NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed);
    Ok(Negotiated { session, frame_max, channel_max, heartbeat: tune_ok.heartbeat, id })
}

/// The (user, password) of a PLAIN or AMQPLAIN response.
fn credentials(mechanism: &str, response: &LongString) -> Option<(String, String)> {
    let bytes = response.as_bytes();
    match mechanism {
        "PLAIN" => {
            let mut parts = bytes.split(|&b| b == 0);
            let _authorization_id = parts.next()?;
            let user = String::from_utf8(parts.next()?.to_vec()).ok()?;
            let password = String::from_utf8(parts.next()?.to_vec()).ok()?;
            Some((user, password))
        }
        "AMQPLAIN" => {
            // A field table without its length prefix.
            let mut table = (bytes.len() as u32).to_be_bytes().to_vec();
            table.extend_from_slice(bytes);
            let (_, table) = amq_protocol::types::parsing::parse_field_table(&table[..]).ok()?;
            let text = |key: &str| table.inner().get(key).map(crate::topology::value_text);
            Some((text("LOGIN")?, text("PASSWORD")?))
        }
        _ => None,
    }
}

/// Who the connection runs as. `EXTERNAL` is the TLS client certificate's user; without
/// logins (no SASL users) a certificate still names its user, as on a Kafka SSL listener, and
/// anyone else is anonymous; with logins PLAIN and AMQPLAIN check a password.
async fn login(server: &Server, start_ok: &connection::StartOk, peer: &Peer) -> Result<Session, Option<HardError>> {
    let mechanism = start_ok.mechanism.as_str();
    let refused = |why: &str| {
        Some(HardError(
            reply::ACCESS_REFUSED,
            format!("ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}: {why}"),
        ))
    };
    let session = |user: &str| Session { principal: format!("User:{user}"), peer: peer.address };
    if mechanism == "EXTERNAL" {
        return match &peer.certificate_user {
            Some(user) => Ok(session(user)),
            None => Err(refused("no verified TLS client certificate")),
        };
    }
    if !server.gateway.login_required() {
        return Ok(session(peer.certificate_user.as_deref().unwrap_or("ANONYMOUS")));
    }
    let Some((user, password)) = credentials(mechanism, &start_ok.response) else {
        return Err(refused("unsupported mechanism or malformed response (PLAIN and AMQPLAIN are supported)"));
    };
    if !server.gateway.authenticate(user.clone(), password).await {
        return Err(refused("invalid username or password"));
    }
    Ok(session(&user))
}

/// The content of a message being received on a channel.
struct Assembling {
    publish: basic::Publish,
    properties: Option<basic::AMQPProperties>,
    size: u64,
    body: Vec<u8>,
    /// Too large: its frames are read and dropped, and the channel closed.
    discard: bool,
}

struct OpenChannel {
    inbox: mpsc::Sender<ChannelInput>,
    /// Set by the channel once it sent channel.close: frames until close-ok are dropped.
    closing: Arc<AtomicBool>,
    content: Option<Assembling>,
    task: tokio::task::JoinHandle<()>,
}

struct Connection {
    server: Arc<Server>,
    negotiated: Negotiated,
    outbox: mpsc::Sender<Vec<u8>>,
    channels: HashMap<u16, OpenChannel>,
}

impl Connection {
    /// Reads and dispatches frames until the connection ends; an error closes it with a code.
    async fn serve(&mut self, reader: &mut FrameReader<ReadStream>) -> Result<(), HardError> {
        let timeout = match self.negotiated.heartbeat {
            0 => Duration::from_secs(u64::MAX / 4),
            beat => Duration::from_secs(u64::from(beat) * 2),
        };
        loop {
            let frame = match tokio::time::timeout(timeout, reader.next()).await {
                Err(_) => {
                    tracing::debug!(peer = %self.negotiated.session.peer, "AMQP heartbeats missed: closing");
                    return Ok(());
                }
                Ok(Err(FrameError::Closed(_))) => return Ok(()),
                Ok(Err(FrameError::Invalid(code, text))) => return Err(HardError(code, text)),
                Ok(Ok(frame)) => frame,
            };
            match frame {
                AMQPFrame::Heartbeat => {}
                AMQPFrame::ProtocolHeader(_) | AMQPFrame::InvalidHeartbeat(_) => {
                    return Err(HardError(reply::FRAME_ERROR, "unexpected frame".into()))
                }
                AMQPFrame::Method(0, method) => {
                    if self.connection_method(method).await? {
                        return Ok(());
                    }
                }
                AMQPFrame::Method(id, method) => self.channel_method(id, method).await?,
                AMQPFrame::Header(id, header) => self.content_header(id, header).await?,
                AMQPFrame::Body(id, body) => self.content_body(id, body).await?,
            }
        }
    }

    /// Handles a method on channel 0; true when the connection is to end.
    async fn connection_method(&mut self, method: AMQPClass) -> Result<bool, HardError> {
        match method {
            AMQPClass::Connection(connection::AMQPMethod::Close(_)) => {
                self.close_channels().await;
                let ok = AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {}));
                let _ = self.outbox.send(encode(&AMQPFrame::Method(0, ok))).await;
                Ok(true)
            }
            AMQPClass::Connection(connection::AMQPMethod::CloseOk(_)) => Ok(true),
            AMQPClass::Connection(connection::AMQPMethod::UpdateSecret(_)) => {
                let ok = AMQPClass::Connection(connection::AMQPMethod::UpdateSecretOk(connection::UpdateSecretOk {}));
                let _ = self.outbox.send(encode(&AMQPFrame::Method(0, ok))).await;
                Ok(false)
            }
            AMQPClass::Connection(connection::AMQPMethod::Blocked(_) | connection::AMQPMethod::Unblocked(_)) => {
                Ok(false)
            }
            _ => Err(HardError(reply::COMMAND_INVALID, "unexpected method on channel 0".into())),
        }
    }

    async fn channel_method(&mut self, id: u16, method: AMQPClass) -> Result<(), HardError> {
        if id > self.negotiated.channel_max {
            return Err(HardError(
                reply::CHANNEL_ERROR,
                format!("channel {id} above channel_max {}", self.negotiated.channel_max),
            ));
        }
        if let AMQPClass::Channel(channel::AMQPMethod::Open(_)) = method {
            if self.channels.contains_key(&id) {
                return Err(HardError(reply::CHANNEL_ERROR, format!("second 'channel.open' seen on channel {id}")));
            }
            self.open_channel(id);
            return Ok(());
        }
        let Some(open) = self.channels.get_mut(&id) else {
            return Err(HardError(reply::CHANNEL_ERROR, format!("expected 'channel.open' on channel {id}")));
        };
        if open.content.is_some() {
            return Err(HardError(reply::UNEXPECTED_FRAME, format!("expected content on channel {id}")));
        }
        let closing = open.closing.load(Ordering::Acquire);
        match method {
            AMQPClass::Channel(channel::AMQPMethod::CloseOk(_)) if closing => {
                let open = self.channels.remove(&id).expect("looked up");
                let _ = open.inbox.send(ChannelInput::Stop).await;
                Ok(())
            }
            AMQPClass::Channel(channel::AMQPMethod::Close(_)) => {
                let open = self.channels.remove(&id).expect("looked up");
                let _ = open.inbox.send(ChannelInput::Close).await;
                // The channel answers close-ok once it released what it held; a new
                // channel.open for this id waits behind it.
                let _ = open.task.await;
                Ok(())
            }
            _ if closing => Ok(()),
            AMQPClass::Basic(basic::AMQPMethod::Publish(publish)) => {
                open.content =
                    Some(Assembling { publish, properties: None, size: 0, body: Vec::new(), discard: false });
                Ok(())
            }
            method => {
                let _ = open.inbox.send(ChannelInput::Method(method)).await;
                Ok(())
            }
        }
    }

    fn open_channel(&mut self, id: u16) {
        let closing = Arc::new(AtomicBool::new(false));
        let (inbox, inputs) = mpsc::channel(CHANNEL_INBOX);
        let channel = crate::channel::Channel::new(
            id,
            self.server.clone(),
            self.negotiated.session.clone(),
            self.negotiated.id,
            self.outbox.clone(),
            self.negotiated.frame_max,
            closing.clone(),
        );
        let task = tokio::spawn(channel.run(inputs));
        self.channels.insert(id, OpenChannel { inbox, closing, content: None, task });
    }

    async fn content_header(
        &mut self,
        id: u16,
        header: amq_protocol::frame::AMQPContentHeader,
    ) -> Result<(), HardError> {
        let Some(open) = self.channels.get_mut(&id) else {
            return Err(HardError(reply::CHANNEL_ERROR, format!("expected 'channel.open' on channel {id}")));
        };
        let Some(content) = open.content.as_mut().filter(|c| c.properties.is_none()) else {
            if open.closing.load(Ordering::Acquire) {
                return Ok(());
            }
            return Err(HardError(reply::UNEXPECTED_FRAME, format!("unexpected content header on channel {id}")));
        };
        content.size = header.body_size;
        content.properties = Some(header.properties);
        if header.body_size > MESSAGE_BYTES_MAX {
            content.discard = true;
            let text =
                format!("message size {} is larger than configured max size {MESSAGE_BYTES_MAX}", header.body_size);
            let _ = open.inbox.send(ChannelInput::Refuse(reply::PRECONDITION_FAILED, text, 60, 40)).await;
        } else {
            content.body.reserve(header.body_size as usize);
        }
        self.finish_content(id).await;
        Ok(())
    }

    async fn content_body(&mut self, id: u16, body: Vec<u8>) -> Result<(), HardError> {
        let Some(open) = self.channels.get_mut(&id) else {
            return Err(HardError(reply::CHANNEL_ERROR, format!("expected 'channel.open' on channel {id}")));
        };
        let Some(content) = open.content.as_mut().filter(|c| c.properties.is_some()) else {
            if open.closing.load(Ordering::Acquire) {
                return Ok(());
            }
            return Err(HardError(reply::UNEXPECTED_FRAME, format!("unexpected content body on channel {id}")));
        };
        let received = content.body.len() as u64 + body.len() as u64;
        if content.discard {
            content.size = content.size.saturating_sub(body.len() as u64);
        } else if received > content.size {
            return Err(HardError(
                reply::FRAME_ERROR,
                format!("content body longer than its header's {} bytes", content.size),
            ));
        } else {
            content.body.extend_from_slice(&body);
        }
        self.finish_content(id).await;
        Ok(())
    }

    /// Hands a message whose content is complete to its channel.
    async fn finish_content(&mut self, id: u16) {
        let open = self.channels.get_mut(&id).expect("content of an open channel");
        let complete = open.content.as_ref().is_some_and(|c| {
            c.properties.is_some() && if c.discard { c.size == 0 } else { c.body.len() as u64 == c.size }
        });
        if !complete {
            return;
        }
        let content = open.content.take().expect("checked");
        if content.discard {
            return;
        }
        let message = Message {
            exchange: content.publish.exchange.as_str().to_string(),
            routing_key: content.publish.routing_key.as_str().to_string(),
            properties: content.properties.expect("checked"),
            body: content.body.into(),
        };
        let published = Published { message, mandatory: content.publish.mandatory };
        let _ = open.inbox.send(ChannelInput::Publish(Box::new(published))).await;
    }

    /// Closes every channel (what they hold is released) and deletes the exclusive queues
    /// this connection declared.
    async fn close_channels(&mut self) {
        let channels: Vec<OpenChannel> = self.channels.drain().map(|(_, c)| c).collect();
        for open in &channels {
            let _ = open.inbox.send(ChannelInput::Stop).await;
        }
        for open in channels {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, open.task).await;
        }
        for queue in self.server.queues.release_owner(self.negotiated.id) {
            crate::channel::delete_lapsed_queue(&self.server, &queue).await;
        }
    }
}
