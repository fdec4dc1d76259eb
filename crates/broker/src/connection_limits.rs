//! What connections may hold before they have done any work: how many may be open
//! (`max.connections`, and `max.connections.per.ip` with its overrides, checked at
//! accept), and how many SASL steps may check a password at once.
//!
//! Why: every open connection costs a read buffer and, before it authenticates, up to
//! `sasl.server.max.receive.size` (connection.rs); without a bound per address one host
//! could open enough connections to exhaust the broker's file descriptors or memory, and
//! without a bound on password checks (PBKDF2, milliseconds each) a password guesser could
//! take every core. A connection refused at accept is closed at once, counted in
//! `sluice_connections_refused_total` and logged at most once per [`REFUSAL_LOG_INTERVAL_MS`].
//!
//! ```text
//! accept ─▶ ConnectionLimits::admit(ip) ─▶ Admission (held for the connection's life)
//!                                      └─▶ ConnectionRefusal (close; counted; logged at a rate limit)
//! ```

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Semaphore;

use sluice_config::BrokerConfig;

/// A refusal (or another event that closes connections by the thousand under attack) is
/// logged at most once per this interval, with the count of those not logged since.
pub(crate) const REFUSAL_LOG_INTERVAL_MS: u64 = 10_000;

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectionRefusal {
    /// `max.connections` connections are open.
    Broker { limit: usize },
    /// `max.connections.per.ip` (or its override) connections are open from this address.
    PerIp { limit: usize },
}

impl ConnectionRefusal {
    /// The `reason` label of `sluice_connections_refused_total`.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            ConnectionRefusal::Broker { .. } => "max_connections",
            ConnectionRefusal::PerIp { .. } => "max_connections_per_ip",
        }
    }
}

/// The broker's connection counts, by address and in all.
pub(crate) struct ConnectionLimits {
    connections_max: usize,
    per_ip_max: usize,
    per_ip_overrides: HashMap<IpAddr, usize>,
    /// Open connections: in all, and by address (an address with none is removed).
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
    /// SASL steps (password checks) running on the blocking pool at once.
    sasl_steps: Arc<Semaphore>,
    pub(crate) refusals_log: RateLimitedLog,
    pub(crate) oversized_unauthenticated_frames_log: RateLimitedLog,
}

/// One admitted connection: counted until dropped.
pub(crate) struct Admission {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
}

impl ConnectionLimits {
    pub(crate) fn new(config: &BrokerConfig) -> ConnectionLimits {
        let per_ip_overrides = config.connections_per_ip_overrides().expect("validated at startup");
        assert!(config.max_connections > 0);
        ConnectionLimits {
            connections_max: config.max_connections,
            per_ip_max: config.max_connections_per_ip,
            per_ip_overrides,
            open: Mutex::new((0, HashMap::new())),
            sasl_steps: Arc::new(Semaphore::new(sasl_steps_max())),
            refusals_log: RateLimitedLog::default(),
            oversized_unauthenticated_frames_log: RateLimitedLog::default(),
        }
    }

    /// Counts a new connection from `ip`, or says which limit refuses it.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Admission, ConnectionRefusal> {
        let per_ip_max = self.per_ip_overrides.get(&ip).copied().unwrap_or(self.per_ip_max);
        let mut open = self.open.lock();
        let (all, by_ip) = &mut *open;
        if *all >= self.connections_max {
            return Err(ConnectionRefusal::Broker { limit: self.connections_max });
        }
        let from_ip = by_ip.entry(ip).or_insert(0);
        if *from_ip >= per_ip_max {
            if *from_ip == 0 {
                by_ip.remove(&ip);
            }
            return Err(ConnectionRefusal::PerIp { limit: per_ip_max });
        }
        *from_ip += 1;
        *all += 1;
        assert!(*all <= self.connections_max);
        Ok(Admission { limits: self.clone(), ip })
    }

    /// Waits for a turn to run a SASL step (a password check) on the blocking pool.
    pub(crate) async fn sasl_step_turn(&self) -> tokio::sync::OwnedSemaphorePermit {
        self.sasl_steps.clone().acquire_owned().await.expect("never closed")
    }

    /// Connections open: (in all, from `ip`).
    #[cfg(test)]
    fn open(&self, ip: IpAddr) -> (usize, usize) {
        let open = self.open.lock();
        (open.0, open.1.get(&ip).copied().unwrap_or(0))
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock();
        let (all, by_ip) = &mut *open;
        let from_ip = by_ip.get_mut(&self.ip).expect("an admitted address is counted");
        assert!(*from_ip > 0 && *all > 0);
        *from_ip -= 1;
        *all -= 1;
        if *from_ip == 0 {
            by_ip.remove(&self.ip);
        }
    }
}

/// SASL steps that check passwords at once: half the cores, at least one, so a password
/// guesser cannot take the cores the I/O threads need (each PLAIN check derives PBKDF2).
fn sasl_steps_max() -> usize {
    sluice_config::io_threads_auto()
}

/// Lets an event be logged at most once per [`REFUSAL_LOG_INTERVAL_MS`]; counts the rest.
#[derive(Default)]
pub(crate) struct RateLimitedLog {
    /// When the next event may be logged (ms since the epoch).
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimitedLog {
    /// [`RateLimitedLog::admit`] at the current time.
    pub(crate) fn admit_now(&self) -> Option<u64> {
        self.admit(u64::try_from(sluice_storage::now_ms()).unwrap_or(0))
    }

    /// `Some(events not logged since the last one logged)` if this one may be logged now.
    fn admit(&self, now_ms: u64) -> Option<u64> {
        let next_ms = self.next_ms.load(Ordering::Relaxed);
        let turn = now_ms >= next_ms
            && self
                .next_ms
                .compare_exchange(next_ms, now_ms + REFUSAL_LOG_INTERVAL_MS, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if !turn {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_ip: usize, overrides: &str, all: usize) -> Arc<ConnectionLimits> {
        let config = BrokerConfig {
            max_connections: all,
            max_connections_per_ip: per_ip,
            max_connections_per_ip_overrides: overrides.to_string(),
            ..BrokerConfig::default()
        };
        config.validate().unwrap();
        Arc::new(ConnectionLimits::new(&config))
    }

    #[test]
    fn connections_are_limited_per_address_and_in_all() {
        let (a, b, c): (IpAddr, IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap(), "::1".parse().unwrap());
        let limits = limits(2, "10.0.0.2:3, [::1]:0", 5);
        let first: Vec<Admission> = (0..2).map(|_| limits.admit(a).unwrap()).collect();
        assert_eq!(limits.admit(a).err(), Some(ConnectionRefusal::PerIp { limit: 2 }));
        let second: Vec<Admission> = (0..3).map(|_| limits.admit(b).unwrap()).collect();
        assert_eq!(limits.admit(c).err(), Some(ConnectionRefusal::Broker { limit: 5 }));
        drop(second);
        assert_eq!(limits.admit(c).err(), Some(ConnectionRefusal::PerIp { limit: 0 }), "an override of 0 refuses all");
        assert_eq!(limits.open(c), (2, 0));
        drop(first);
        assert_eq!(limits.open(a), (0, 0));
        assert!(limits.admit(a).is_ok(), "freed slots are given again");
    }

    #[test]
    fn bad_overrides_are_refused_with_the_entry() {
        for (overrides, expected) in [
            ("localhost:3", "not an IP address"),
            ("10.0.0.1", "not address:count"),
            ("10.0.0.1:x", "not address:count"),
            ("10.0.0.1:1,10.0.0.1:2", "twice"),
        ] {
            let config = BrokerConfig { max_connections_per_ip_overrides: overrides.into(), ..BrokerConfig::default() };
            let error = config.validate().unwrap_err();
            assert!(error.contains(expected), "{overrides}: {error}");
        }
        let config = BrokerConfig { max_connections_per_ip: 0, ..BrokerConfig::default() };
        assert!(config.validate().unwrap_err().contains("max.connections.per.ip"));
    }

    #[test]
    fn a_rate_limited_log_lets_one_event_through_per_interval_and_counts_the_rest() {
        let log = RateLimitedLog::default();
        assert_eq!(log.admit(1_000), Some(0));
        assert_eq!(log.admit(1_001), None);
        assert_eq!(log.admit(1_000 + REFUSAL_LOG_INTERVAL_MS - 1), None);
        assert_eq!(log.admit(1_000 + REFUSAL_LOG_INTERVAL_MS), Some(2));
    }
}
