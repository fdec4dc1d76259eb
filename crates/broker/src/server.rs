//! The TCP listener: accepts connections within `max.connections` and
//! `max.connections.per.ip` (connection_limits.rs), runs periodic upkeep, and shuts down
//! cleanly (stop accepting, seal every log) when asked.
//!
//! The client listeners are bound at start but accept nothing until the node is ready
//! ([`Broker::not_ready`], the notion `/readyz` answers too): a cluster node that took
//! clients before it was registered and unfenced would refuse what needs every node (a
//! topic with one replica per node). Nothing this node needs to become ready goes through
//! them: registration and heartbeats use the controller's own port.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::connection_limits::ConnectionRefusal;
use crate::Broker;

/// Makes every panic in this process stop it: the panic is logged (message, thread,
/// backtrace), then the process aborts.
///
/// Why not close only the panicking connection, as a task's panic would: a panic means an
/// invariant failed, possibly halfway through changing a partition's state in memory, and
/// the storage locks (`parking_lot`) do not poison, so the next request would act on that
/// state: assign an offset twice, or acknowledge what the WAL will replay differently.
/// Stopping loses nothing acknowledged: every acknowledged write is durable first, and a
/// restart rebuilds memory from the WAL and the segments (the `kill -9` path the crash
/// tests prove). This is the fail-stop of TigerBeetle and Redpanda; a supervisor restarts
/// the broker. Request decoding returns errors rather than panicking, so a malformed frame
/// still only closes its connection.
pub fn stop_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let backtrace = std::backtrace::Backtrace::force_capture();
        tracing::error!(
            thread = thread.name().unwrap_or("unnamed"),
            "{info}; stopping the broker: its memory may no longer match its disk, and a restart recovers from the disk\n{backtrace}"
        );
        std::process::abort();
    }));
}

/// Upkeep (flush.ms checks, retention) runs at least this often.
const UPKEEP_INTERVAL_MS_MAX: u64 = 1000;

/// The bound sockets of the broker's HTTP services (each off when `None`).
#[derive(Default)]
pub struct HttpListeners {
    /// `/metrics`, `/healthz` and `/readyz`.
    pub metrics: Option<TcpListener>,
    /// The Schema Registry's REST API.
    pub schema_registry: Option<TcpListener>,
    /// The web console.
    pub console: Option<TcpListener>,
    /// AMQP 0-9-1 ports (not HTTP, but bound and served the same way): each socket, and
    /// whether it takes TLS (AMQPS).
    pub amqp: Vec<(TcpListener, bool)>,
}

/// Serves clients until `shutdown` resolves, then closes the logs. `listeners` are bound
/// sockets for [`Broker::listeners`], in the same order; `http` serves the HTTP services
/// alongside.
pub async fn serve(
    broker: Arc<Broker>,
    listeners: Vec<TcpListener>,
    http: HttpListeners,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    assert_eq!(listeners.len(), broker.listeners().len(), "one socket per configured listener");
    let tls = sluice_security::tls::acceptor(broker.listeners(), &broker.config().tls_settings())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut http_servers = Vec::new();
    if let Some(metrics_listener) = http.metrics {
        let address = metrics_listener.local_addr()?;
        tracing::info!(%address, "metrics at http://{address}/metrics (and /healthz, /readyz)");
        http_servers.push(tokio::spawn(crate::metrics::serve(broker.clone(), metrics_listener)));
    }
    // One registry state for the REST API and the console's decoding of framed messages.
    let schema_registry = crate::schema_host::registry(&broker);
    if let Some(registry_listener) = http.schema_registry {
        let address = registry_listener.local_addr()?;
        let registry_tls =
            crate::schema_host::tls(&broker).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let scheme = if registry_tls.is_some() { "https" } else { "http" };
        tracing::info!(%address, "schema registry at {scheme}://{address}/");
        http_servers.push(tokio::spawn(crate::schema_host::serve(
            broker.clone(),
            schema_registry.clone(),
            registry_listener,
            registry_tls,
        )));
    }
    if let Some(console_listener) = http.console {
        let address = console_listener.local_addr()?;
        let config = crate::console_host::config(&broker, schema_registry.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        tracing::info!(%address, "console at http://{address}/");
        http_servers.push(tokio::spawn(crate::console_host::serve(config, console_listener)));
    }
    if !http.amqp.is_empty() {
        let server = crate::amqp_host::server(&broker)?;
        // A node sees only the uses of a queue made through it; in a cluster another node's
        // consumers and declarations would not keep the queue, so none is expired there.
        if broker.cluster.is_none() {
            http_servers.push(tokio::spawn(sluice_amqp::expire_unused_queues(server.clone())));
        }
        for (amqp_listener, uses_tls) in http.amqp {
            let address = amqp_listener.local_addr()?;
            let tls = match uses_tls {
                false => None,
                true => Some(
                    sluice_security::tls::server_acceptor(&broker.config().tls_settings())
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("AMQPS listener: {e}")))?,
                ),
            };
            let scheme = if uses_tls { "amqps" } else { "amqp" };
            tracing::info!(%address, "AMQP 0-9-1 at {scheme}://{address}/");
            http_servers.push(tokio::spawn(sluice_amqp::serve(amqp_listener, server.clone(), tls)));
        }
    }
    let upkeep = tokio::spawn(upkeep_loop(broker.clone()));
    let transactions_upkeep = tokio::spawn(transactions_upkeep_loop(broker.clone()));
    let shares_upkeep = tokio::spawn(shares_upkeep_loop(broker.clone()));
    let tiering = broker.tiered.clone().map(|tiered| tokio::spawn(tiered.run(broker.clone())));
    let shares_writer = {
        let broker = broker.clone();
        tokio::spawn(async move { broker.shares.run_background_writes(&*broker).await })
    };
    let mut accept_loops = Vec::with_capacity(listeners.len());
    for (index, listener) in listeners.into_iter().enumerate() {
        let configured = &broker.listeners()[index];
        let tls = if configured.protocol.uses_tls() { tls.clone() } else { None };
        assert_eq!(tls.is_some(), configured.protocol.uses_tls());
        tracing::info!(
            address = %listener.local_addr()?,
            listener = %configured.name,
            protocol = ?configured.protocol,
            node_id = broker.node_id(),
            "sluice broker listening"
        );
        // Bound now (the port is this node's from the start), accepting only once ready:
        // connections made before wait in the kernel's backlog, unanswered.
        let broker = broker.clone();
        accept_loops.push(tokio::spawn(async move {
            broker.wait_ready().await;
            accept_loop(broker, listener, index, tls).await
        }));
    }
    accept_loops.push(tokio::spawn(announce_ready(broker.clone())));
    shutdown.await;
    tracing::info!("shutting down: sealing logs");
    for accept_loop in accept_loops {
        accept_loop.abort();
    }
    upkeep.abort();
    transactions_upkeep.abort();
    shares_upkeep.abort();
    shares_writer.abort();
    if let Some(tiering) = tiering {
        tiering.abort();
    }
    for server in http_servers {
        server.abort();
    }
    let closing = broker.clone();
    tokio::task::spawn_blocking(move || closing.close()).await.map_err(io::Error::other)?;
    tracing::info!("shutdown complete");
    Ok(())
}

/// Logs when the listeners start serving clients, and why they wait until then.
async fn announce_ready(broker: Arc<Broker>) {
    if let Some(reason) = broker.not_ready() {
        tracing::info!(node_id = broker.node_id(), reason, "clients are served once this node is ready");
    }
    broker.wait_ready().await;
    tracing::info!(node_id = broker.node_id(), "ready: serving clients");
}

/// Accepts the connections of one listener (TLS ones finish their handshake in their own
/// task), within the broker's connection limits.
async fn accept_loop(broker: Arc<Broker>, listener: TcpListener, index: usize, tls: Option<TlsAcceptor>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(pair) => pair,
            Err(error) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let admission = match broker.connection_limits.admit(peer.ip()) {
            Ok(admission) => admission,
            Err(refusal) => {
                refuse(&broker, peer, refusal);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let broker = broker.clone();
        broker.metrics.connection_opened();
        let counted = crate::metrics::ConnectionGuard(broker.clone());
        let tls = tls.clone();
        tokio::spawn(async move {
            serve_connection(broker, stream, peer, index, tls).await;
            drop(counted);
            drop(admission);
        });
    }
}

/// Closes a connection refused at accept: counted, and logged at a rate limit (a flood
/// of them must not flood the log).
fn refuse(broker: &Broker, peer: SocketAddr, refusal: ConnectionRefusal) {
    broker.metrics.connection_refused(refusal.reason());
    if let Some(suppressed) = broker.connection_limits.refusals_log.admit_now() {
        let (setting, limit) = match refusal {
            ConnectionRefusal::Broker { limit } => ("max.connections", limit),
            ConnectionRefusal::PerIp { limit } => ("max.connections.per.ip", limit),
        };
        tracing::warn!(%peer, setting, limit, refused_unlogged = suppressed, "connection limit reached; closing new connection");
    }
}

/// Serves one accepted connection, after its TLS handshake on a TLS listener.
async fn serve_connection(
    broker: Arc<Broker>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    index: usize,
    tls: Option<TlsAcceptor>,
) {
    let Some(acceptor) = tls else {
        let (reader, writer) = stream.into_split();
        return crate::connection::run(broker, reader, writer, peer, index, None).await;
    };
    let timeout = Duration::from_millis(sluice_security::tls::TLS_HANDSHAKE_TIMEOUT_MS);
    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(session)) => {
            let subject = session
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(sluice_security::tls::certificate_user);
            let certificate_user = match subject {
                None => None,
                Some(subject) => match broker.config().ssl_principal_mapping_rules.apply(&subject) {
                    Some(user) => Some(user),
                    None => {
                        tracing::warn!(%peer, subject, "no ssl.principal.mapping.rules rule applies to the client certificate; closing");
                        return;
                    }
                },
            };
            let (reader, writer) = tokio::io::split(session);
            crate::connection::run(broker, reader, writer, peer, index, certificate_user).await;
        }
        Ok(Err(error)) => tracing::info!(%peer, %error, "TLS handshake failed"),
        Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
    }
}

/// Aborts transactions past their timeout and completes prepared ones (`sluice_coordinator::txn`), as often
/// as the log upkeep runs and at least every second.
async fn transactions_upkeep_loop(broker: Arc<Broker>) {
    let transactions = broker.transactions.clone();
    let period = broker.config().log_retention_check_interval_ms.clamp(10, 1_000);
    let mut interval = tokio::time::interval(Duration::from_millis(period));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        transactions.upkeep(&*broker).await;
    }
}

/// Share groups: member session timeouts, expired record locks, state log snapshots.
async fn shares_upkeep_loop(broker: Arc<Broker>) {
    let mut interval = tokio::time::interval(Duration::from_millis(SHARE_UPKEEP_INTERVAL_MS));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        broker.shares.upkeep(&broker, sluice_storage::now_ms()).await;
    }
}

/// How often expired share-record locks are released (a lock lasts at least 1 s).
const SHARE_UPKEEP_INTERVAL_MS: u64 = 100;

async fn upkeep_loop(broker: Arc<Broker>) {
    let period = broker.config().log_retention_check_interval_ms.clamp(10, UPKEEP_INTERVAL_MS_MAX);
    let mut interval = tokio::time::interval(Duration::from_millis(period));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        crate::handlers::create_internal_topics_once_formed(&broker);
        let broker = broker.clone();
        if tokio::task::spawn_blocking(move || broker.tick()).await.is_err() {
            tracing::error!("upkeep task panicked");
        }
    }
}
