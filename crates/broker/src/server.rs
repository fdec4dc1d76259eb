//! The TCP listener: accepts connections up to `max_connections`, runs periodic upkeep,
//! and shuts down cleanly (stop accepting, seal every log) when asked.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::Broker;

/// Upkeep (flush.ms checks, retention) runs at least this often.
const UPKEEP_INTERVAL_MS_MAX: u64 = 1000;

/// Serves clients until `shutdown` resolves, then closes the logs.
/// `metrics` (if any) serves `/metrics`, `/healthz` and `/readyz` alongside.
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let connections = Arc::new(Semaphore::new(broker.config().max_connections));
    let metrics_server = match metrics {
        None => None,
        Some(metrics_listener) => {
            let address = metrics_listener.local_addr()?;
            tracing::info!(%address, "metrics at http://{address}/metrics (and /healthz, /readyz)");
            Some(tokio::spawn(crate::metrics::serve(broker.clone(), metrics_listener)))
        }
    };
    let upkeep = tokio::spawn(upkeep_loop(broker.clone()));
    tracing::info!(address = %listener.local_addr()?, node_id = broker.node_id(), "sluice broker listening");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, limit = broker.config().max_connections, "connection limit reached; closing new connection");
                    continue;
                };
                let broker = broker.clone();
                broker.metrics.connection_opened();
                let counted = crate::metrics::ConnectionGuard(broker.clone());
                tokio::spawn(async move {
                    crate::connection::run(broker, stream, peer).await;
                    drop(counted);
                    drop(permit);
                });
            }
            () = &mut shutdown => break,
        }
    }
    tracing::info!("shutting down: sealing logs");
    upkeep.abort();
    if let Some(metrics_server) = metrics_server {
        metrics_server.abort();
    }
    drop(listener);
    let closing = broker.clone();
    tokio::task::spawn_blocking(move || closing.close()).await.map_err(io::Error::other)?;
    tracing::info!("shutdown complete");
    Ok(())
}

async fn upkeep_loop(broker: Arc<Broker>) {
    let period = broker.config().log_retention_check_interval_ms.clamp(10, UPKEEP_INTERVAL_MS_MAX);
    let mut interval = tokio::time::interval(Duration::from_millis(period));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        crate::handlers::create_offsets_topic_once_formed(&broker);
        let broker = broker.clone();
        if tokio::task::spawn_blocking(move || broker.tick()).await.is_err() {
            tracing::error!("upkeep task panicked");
        }
    }
}
