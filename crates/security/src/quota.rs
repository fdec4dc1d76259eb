//! Client quotas with Kafka's semantics (KIP-13, KIP-55, KIP-219): `producer_byte_rate`
//! and `consumer_byte_rate` per user, client id, or both, with `<default>` entities and
//! Kafka's order of precedence. A client over its quota gets its answer at once with
//! `throttle_time_ms` (the client then waits, as KIP-219 clients do), and the broker reads
//! nothing more from that connection until the throttle time has passed, so a client that
//! ignores it gains nothing.
//!
//! `request_percentage` (KIP-124) bounds the time the broker spends on a client's requests:
//! 100 is one thread's whole time. Kafka counts time on its I/O and network threads; Sluice
//! counts the time a request's handler runs (polled, not waiting for fsync, replication or
//! a long poll) and its answer's encoding. Brokers' own requests are exempt, as in Kafka.
//!
//! A rate is measured over [`QUOTA_WINDOW_SAMPLES`] samples of [`QUOTA_SAMPLE_MS`] (Kafka's
//! `quota.window.num` and `quota.window.size.seconds` defaults), and the throttle time is
//! Kafka's: (rate - quota) / quota x window.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_cluster::{QuotaEntity, QuotaEntityName};

/// entity -> quota name -> value.
pub type ClientQuotas = std::collections::BTreeMap<QuotaEntity, std::collections::BTreeMap<String, u64>>;

pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
/// Nanoseconds per second of one thread's time, per percent of `request_percentage`.
const REQUEST_NANOS_PER_PERCENT: u64 = 10_000_000;
/// Kafka's `quota.window.num` default.
pub const QUOTA_WINDOW_SAMPLES: u64 = 11;
/// Kafka's `quota.window.size.seconds` default, in ms.
pub const QUOTA_SAMPLE_MS: u64 = 1_000;
/// Rate sensors kept (one per quota'd user/client id and kind); idle ones go first.
pub const QUOTA_SENSORS_MAX: usize = 100_000;
/// Longest throttle given (Kafka does not bound produce/fetch throttles; this only keeps
/// a quota of a few bytes from muting a connection for hours).
const THROTTLE_MS_MAX: u64 = 300_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaKind {
    /// Produce bytes.
    Produce,
    /// Consumer fetch bytes.
    Fetch,
    /// Nanoseconds spent on the client's requests.
    Request,
}

impl QuotaKind {
    fn key(self) -> &'static str {
        match self {
            QuotaKind::Produce => PRODUCER_BYTE_RATE,
            QuotaKind::Fetch => CONSUMER_BYTE_RATE,
            QuotaKind::Request => REQUEST_PERCENTAGE,
        }
    }

    /// Kafka bounds request-time throttles by one sample (ClientRequestQuotaManager), so a
    /// client over its request quota is slowed, never muted for long; byte-rate throttles
    /// are bounded only by [`THROTTLE_MS_MAX`].
    fn bound_throttle(self, throttle_ms: u64) -> u64 {
        match self {
            QuotaKind::Produce | QuotaKind::Fetch => throttle_ms,
            QuotaKind::Request => throttle_ms.min(QUOTA_SAMPLE_MS),
        }
    }

    /// The quota as a rate of what this kind records (bytes or nanoseconds per second).
    fn rate_per_second(self, quota: u64) -> u64 {
        match self {
            QuotaKind::Produce | QuotaKind::Fetch => quota,
            QuotaKind::Request => quota.saturating_mul(REQUEST_NANOS_PER_PERCENT),
        }
    }
}

/// The quota that applies to (user, client id) for `key`, in Kafka's order of precedence,
/// with the entity it was found on.
fn resolve<'a>(quotas: &'a ClientQuotas, user: &str, client_id: &str, key: &str) -> Option<(&'a QuotaEntity, u64)> {
    use QuotaEntityName::{Default, Named};
    let named = |name: &str| Some(Named(name.to_string()));
    let candidates = [
        (named(user), named(client_id)),
        (named(user), Some(Default)),
        (named(user), None),
        (Some(Default), named(client_id)),
        (Some(Default), Some(Default)),
        (Some(Default), None),
        (None, named(client_id)),
        (None, Some(Default)),
    ];
    candidates.into_iter().find_map(|(user, client_id)| {
        let (entity, values) = quotas.get_key_value(&QuotaEntity { user, client_id })?;
        values.get(key).map(|value| (entity, *value))
    })
}

/// Bytes per sample over the last window.
struct Sensor {
    samples: VecDeque<(u64, u64)>,
    last_ms: u64,
}

impl Sensor {
    /// Records `bytes`; returns the rate (bytes/s) and the window it was measured over (ms).
    fn record(&mut self, now_ms: u64, bytes: u64) -> (f64, u64) {
        match self.samples.back_mut() {
            Some((start, total)) if now_ms < *start + QUOTA_SAMPLE_MS => *total += bytes,
            _ => self.samples.push_back((now_ms, bytes)),
        }
        let horizon = now_ms.saturating_sub(QUOTA_WINDOW_SAMPLES * QUOTA_SAMPLE_MS);
        while self.samples.len() as u64 > QUOTA_WINDOW_SAMPLES || self.samples.front().is_some_and(|s| s.0 < horizon) {
            self.samples.pop_front();
        }
        self.last_ms = now_ms;
        let oldest = self.samples.front().map_or(now_ms, |s| s.0);
        // Kafka's Rate.windowSize: whole samples missing below (samples - 1) are added, so a
        // new client's first burst is not measured over a few milliseconds, and the part
        // of a sample already elapsed still counts.
        let elapsed_ms = now_ms - oldest;
        let full_samples = elapsed_ms / QUOTA_SAMPLE_MS;
        let window_ms = elapsed_ms + (QUOTA_WINDOW_SAMPLES - 1).saturating_sub(full_samples) * QUOTA_SAMPLE_MS;
        let total: u64 = self.samples.iter().map(|s| s.1).sum();
        (total as f64 * 1000.0 / window_ms as f64, window_ms)
    }
}

pub struct QuotaManager {
    /// Whether any quota is configured: without one, produce and fetch skip quota work.
    configured: std::sync::atomic::AtomicBool,
    /// Whether some entity has a `request_percentage`: only then are handlers timed.
    requests_configured: std::sync::atomic::AtomicBool,
    epoch: Instant,
    sensors: Mutex<HashMap<(QuotaKind, String, String), Sensor>>,
}

impl Default for QuotaManager {
    fn default() -> QuotaManager {
        QuotaManager {
            configured: std::sync::atomic::AtomicBool::new(false),
            requests_configured: std::sync::atomic::AtomicBool::new(false),
            epoch: Instant::now(),
            sensors: Mutex::new(HashMap::new()),
        }
    }
}

impl QuotaManager {
    /// Called whenever the quotas change (locally or in applied cluster metadata).
    pub fn set_configured(&self, quotas: &ClientQuotas) {
        self.configured.store(!quotas.is_empty(), Ordering::Relaxed);
        let requests = quotas.values().any(|values| values.contains_key(REQUEST_PERCENTAGE));
        self.requests_configured.store(requests, Ordering::Relaxed);
    }

    pub fn configured(&self) -> bool {
        self.configured.load(Ordering::Relaxed)
    }

    pub fn requests_configured(&self) -> bool {
        self.requests_configured.load(Ordering::Relaxed)
    }

    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Records `amount` (bytes, or nanoseconds for [`QuotaKind::Request`]) for the client
    /// and returns how long it must wait (0: within quota).
    pub fn record(&self, quotas: &ClientQuotas, kind: QuotaKind, user: &str, client_id: &str, amount: u64) -> u64 {
        if quotas.is_empty() {
            return 0;
        }
        let Some((entity, quota)) = resolve(quotas, user, client_id, kind.key()) else { return 0 };
        // One sensor per matched level: a `<default>` user quota still gives each user its own.
        let sensor_user = if entity.user.is_some() { user } else { "" };
        let sensor_client = if entity.client_id.is_some() { client_id } else { "" };
        let now_ms = self.now_ms();
        let mut sensors = self.sensors.lock();
        if sensors.len() >= QUOTA_SENSORS_MAX {
            let idle_before = now_ms.saturating_sub(QUOTA_WINDOW_SAMPLES * QUOTA_SAMPLE_MS);
            sensors.retain(|_, sensor| sensor.last_ms >= idle_before);
        }
        let sensor = sensors
            .entry((kind, sensor_user.to_string(), sensor_client.to_string()))
            .or_insert_with(|| Sensor { samples: VecDeque::new(), last_ms: now_ms });
        let (rate, window_ms) = sensor.record(now_ms, amount);
        let throttle = throttle_ms(rate, kind.rate_per_second(quota), window_ms);
        kind.bound_throttle(throttle)
    }
}

/// Kafka's throttle time (QuotaUtils.throttleTime) for a measured `rate` against `quota`
/// (per second), `window_ms` being the precise window the rate was measured over: waiting
/// that long brings the rate back to the quota exactly. (The whole window, samples x
/// sample length, would over-throttle by up to one sample in eleven.)
fn throttle_ms(rate: f64, quota: u64, window_ms: u64) -> u64 {
    if quota == 0 {
        return THROTTLE_MS_MAX;
    }
    let quota = quota as f64;
    if rate <= quota {
        return 0;
    }
    (((rate - quota) / quota) * window_ms as f64).min(THROTTLE_MS_MAX as f64) as u64
}

/// Until when a connection is muted, in [`QuotaManager::now_ms`] time.
#[derive(Default)]
pub struct ConnectionThrottle(AtomicU64);

impl ConnectionThrottle {
    pub fn extend(&self, until_ms: u64) {
        self.0.fetch_max(until_ms, Ordering::Relaxed);
    }

    /// How long reads must still wait.
    pub fn remaining(&self, now_ms: u64) -> Option<Duration> {
        let until = self.0.load(Ordering::Relaxed);
        (until > now_ms).then(|| Duration::from_millis(until - now_ms))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn entity(user: Option<QuotaEntityName>, client_id: Option<QuotaEntityName>) -> QuotaEntity {
        QuotaEntity { user, client_id }
    }

    #[test]
    fn precedence_is_kafkas() {
        use QuotaEntityName::{Default, Named};
        let mut quotas = ClientQuotas::new();
        let mut set = |e: QuotaEntity, v: u64| {
            quotas.insert(e, BTreeMap::from([(PRODUCER_BYTE_RATE.to_string(), v)]));
        };
        set(entity(None, Some(Default)), 1);
        set(entity(None, Some(Named("app".into()))), 2);
        set(entity(Some(Default), None), 3);
        set(entity(Some(Named("alice".into())), None), 4);
        set(entity(Some(Named("alice".into())), Some(Named("app".into()))), 5);
        let quota = |user: &str, client: &str| resolve(&quotas, user, client, PRODUCER_BYTE_RATE).map(|(_, v)| v);
        assert_eq!(quota("alice", "app"), Some(5));
        assert_eq!(quota("alice", "other"), Some(4));
        assert_eq!(quota("bob", "app"), Some(3), "/users/<default> comes before /clients/app");
        assert_eq!(resolve(&quotas, "bob", "app", CONSUMER_BYTE_RATE), None);
    }

    #[test]
    fn throttle_follows_the_overshoot() {
        assert_eq!(throttle_ms(1000.0, 1000, 10_000), 0);
        assert_eq!(throttle_ms(1500.0, 1000, 10_000), 5_000);
        assert_eq!(throttle_ms(1e9, 1000, 10_000), THROTTLE_MS_MAX);
    }

    #[test]
    fn request_throttles_are_bounded_by_one_sample() {
        let manager = QuotaManager::default();
        let mut quotas = ClientQuotas::new();
        quotas.insert(
            entity(None, Some(QuotaEntityName::Named("busy".into()))),
            BTreeMap::from([(REQUEST_PERCENTAGE.to_string(), 1), (PRODUCER_BYTE_RATE.to_string(), 1)]),
        );
        // 5 s of handler time against 10 ms/s; 5 MB against 1 B/s.
        assert_eq!(manager.record(&quotas, QuotaKind::Request, "", "busy", 5_000_000_000), QUOTA_SAMPLE_MS);
        assert_eq!(manager.record(&quotas, QuotaKind::Produce, "", "busy", 5_000_000), THROTTLE_MS_MAX);
        assert_eq!(manager.record(&quotas, QuotaKind::Request, "", "other", 5_000_000_000), 0);
    }

    #[test]
    fn rate_is_measured_over_the_window() {
        let mut sensor = Sensor { samples: VecDeque::new(), last_ms: 0 };
        // 10 KB/s for 20 s: the measured rate settles at 10 KB/s.
        let mut rate = 0.0;
        for second in 0..20u64 {
            rate = sensor.record(second * 1000, 10_000).0;
        }
        assert!((rate - 10_000.0).abs() < 1_500.0, "{rate}");
    }

    #[test]
    fn a_client_that_honours_its_throttles_runs_at_its_quota() {
        // A client sends requests back to back (1 ms apart) and waits out each throttle, as
        // librdkafka and the Java client do; over two minutes its rate must be the quota, not
        // less (over-throttling) nor more. (Kafka's window accounting lets it run a few
        // percent over: a throttle ignores samples that expire while it lasts.)
        let quota = 200_000u64;
        for request_bytes in [4_000u64, 32_768, 150_000] {
            let mut sensor = Sensor { samples: VecDeque::new(), last_ms: 0 };
            let (mut now_ms, mut sent, mut sent_at_20s) = (0u64, 0u64, 0u64);
            while now_ms < 140_000 {
                if now_ms >= 20_000 && sent_at_20s == 0 {
                    sent_at_20s = sent;
                }
                let (rate, window_ms) = sensor.record(now_ms, request_bytes);
                sent += request_bytes;
                now_ms += 1 + throttle_ms(rate, quota, window_ms);
            }
            let rate = (sent - sent_at_20s) as f64 / 120.0;
            assert!(
                (rate - quota as f64).abs() < 0.05 * quota as f64,
                "{request_bytes} B requests ran at {rate:.0} B/s"
            );
        }
    }
}
