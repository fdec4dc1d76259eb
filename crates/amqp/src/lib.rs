//! The AMQP 0-9-1 front door: RabbitMQ's own clients (pika, the Java `amqp-client`, Spring
//! AMQP, Celery, ...) publish to and consume from Sluice unchanged.
//!
//! Why it is built on Kafka requests: a queue is a topic and its consumers are one share
//! group of the same name, so everything an AMQP client does is something a Kafka client
//! could do — a publish is a Produce (acks=all: a confirm goes out only once the broker
//! made the message as durable as a Kafka produce), a consumer is a share-group member
//! (ShareGroupHeartbeat, ShareFetch, ShareAcknowledge), a queue declaration is a
//! CreateTopics. This crate turns AMQP's methods into those requests and hands them to a
//! [`Gateway`], which the broker implements by running its own request handlers in
//! process, authorized as the AMQP user: ACLs, durability levels, quotas of the topic and
//! the share group apply to both kinds of client alike, and the same queue can be read as a
//! stream by Kafka consumers.
//!
//! What AMQP has and Kafka does not — exchanges and bindings — lives here ([`topology`]),
//! stored in the node's data directory.
//!
//! Modules: [`frames`] reads and writes frames (the codec is `amq-protocol`'s);
//! [`connection`] negotiates and multiplexes channels; [`channel`] runs one channel's
//! methods; [`publish`] routes and produces; [`consumer`] is one share-group member that
//! feeds one AMQP consumer; [`dead_letter`] gives up on messages as RabbitMQ does
//! (rejected, expired, delivered too often); [`delivered`] remembers what may have been
//! delivered before a crash; [`messages`] maps AMQP messages to Kafka records and back;
//! [`queues`] declares and deletes the topics behind queues.

pub mod channel;
pub mod connection;
pub mod consumer;
pub mod dead_letter;
pub mod delivered;
pub mod frames;
pub mod gateway;
pub mod length_limit;
pub mod messages;
pub mod publish;
pub mod queues;
pub mod state_store;
#[cfg(test)]
mod test_gateway;
pub mod topology;

use std::path::PathBuf;
use std::sync::Arc;

pub use gateway::{Gateway, GatewayFuture, QueueDepth, Session};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The largest frame this server accepts or sends (RabbitMQ's default).
pub const FRAME_MAX_BYTES: u32 = 128 * 1024;
/// The most channels one connection may open (RabbitMQ's default).
pub const CHANNEL_MAX: u16 = 2047;
/// The heartbeat interval the server proposes, in seconds (RabbitMQ's default).
pub const HEARTBEAT_S: u16 = 60;
/// The largest message body accepted; a larger one closes its channel (406).
pub const MESSAGE_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// Concurrent AMQP connections at most; beyond it a new one is refused.
pub const CONNECTIONS_MAX: usize = 4096;

/// How the AMQP front door runs.
#[derive(Clone, Debug)]
pub struct AmqpConfig {
    /// Where exchanges, bindings and queues are kept (files in this directory, each written
    /// new, fsynced, renamed and the directory fsynced). The caller creates it durably (its
    /// entry in its parent fsynced), as the broker does its data dir's other directories.
    pub state_dir: PathBuf,
}

/// The front door's shared state: the gateway into the broker, the exchanges and bindings,
/// the queues of this node's open connections.
pub struct Server {
    pub gateway: Arc<dyn Gateway>,
    pub topology: topology::Topology,
    pub queues: queues::LocalQueues,
    /// What may have been delivered before a restart (the `redelivered` flag).
    pub delivered: delivered::DeliveredMarks,
    connections: Arc<tokio::sync::Semaphore>,
}

impl Server {
    /// The front door of `gateway`'s broker, its topology in `store`.
    pub fn new(
        gateway: Arc<dyn Gateway>,
        config: &AmqpConfig,
        store: Arc<dyn state_store::StateStore>,
    ) -> std::io::Result<Arc<Server>> {
        let topology = topology::Topology::new(store);
        let delivered = delivered::DeliveredMarks::open(&config.state_dir, |queue, partition| {
            gateway.local_log_end(queue, partition)
        })?;
        Ok(Arc::new(Server {
            gateway,
            topology,
            delivered,
            queues: queues::LocalQueues::default(),
            connections: Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX)),
        }))
    }
}

/// How often queues declared with `x-expires` are checked for having gone unused.
const EXPIRY_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// Deletes queues that went unused (no consumer here, not declared or read) for longer than
/// their `x-expires`, for as long as the broker runs.
pub async fn expire_unused_queues(server: Arc<Server>) {
    loop {
        tokio::time::sleep(EXPIRY_CHECK_INTERVAL).await;
        for (queue, declared) in server.topology.expiring_queues() {
            let Ok(Some(expires_ms)) = queues::expires_ms(&declared.arguments) else { continue };
            let unused = server.queues.unused_for(&queue);
            if server.queues.consumers(&queue) == 0 && unused.as_millis() >= u128::from(expires_ms) {
                tracing::info!(%queue, expires_ms, "AMQP queue unused for longer than its x-expires: deleted");
                channel::delete_lapsed_queue(&server, &queue).await;
            }
        }
    }
}

/// How long a client has to finish its TLS handshake on an AMQPS port.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Accepts AMQP connections on `listener` for as long as the broker runs; over TLS (AMQPS)
/// when `tls` is given.
pub async fn serve(listener: TcpListener, server: Arc<Server>, tls: Option<TlsAcceptor>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(pair) => pair,
            Err(error) => {
                tracing::warn!(%error, "AMQP accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = server.connections.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "AMQP connection refused: {CONNECTIONS_MAX} connections open");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let server = server.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => {
                    let (read, write) = stream.into_split();
                    connection::run(Box::new(read), Box::new(write), peer, None, server).await;
                }
                Some(tls) => match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let certificate = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first());
                        let certificate_user = match certificate {
                            None => None,
                            Some(certificate) => match server.gateway.certificate_user(certificate.as_ref()) {
                                Some(user) => Some(user),
                                None => {
                                    // As the Kafka SSL listeners: a certificate that names nobody
                                    // gets no connection, not an anonymous one.
                                    tracing::warn!(%peer, "no ssl.principal.mapping.rules rule applies to the AMQPS client certificate; closing");
                                    drop(permit);
                                    return;
                                }
                            },
                        };
                        let (read, write) = tokio::io::split(stream);
                        connection::run(Box::new(read), Box::new(write), peer, certificate_user, server).await;
                    }
                    Ok(Err(error)) => tracing::debug!(%peer, %error, "AMQPS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "AMQPS handshake timed out"),
                },
            }
            drop(permit);
        });
    }
}
