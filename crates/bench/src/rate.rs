//! Send pacing and rate discovery.
//!
//! [`RateLimiter`] hands each send its *intended* time, `start + i / rate`, the way
//! OMB's uniform limiter does. The sender waits until that time and the publish delay
//! (actual send minus intended send) is recorded, so a stall shows up as latency
//! instead of silently lowering the offered load (no coordinated omission).
//!
//! [`RateController`] is OMB's current rate discovery for `producerRate: 0`: every
//! control period, if consumers fall more than a limit behind, or producers fall more
//! than a limit behind the target, the ramp factor halves and the rate drops to what
//! was achieved; otherwise the ramp factor doubles (up to 1) and the rate grows by it.

/// Nanoseconds per second.
pub const NANOS_PER_SECOND: f64 = 1e9;

/// Gives each send its intended time at a fixed rate.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    start_ns: u64,
    interval_ns: f64,
    sends_count: u64,
    rate_per_second: f64,
}

impl RateLimiter {
    /// A limiter at `rate_per_second` whose first send is intended at `start_ns`.
    pub fn new(rate_per_second: f64, start_ns: u64) -> Self {
        assert!(rate_per_second > 0.0, "rate must be positive");
        Self { start_ns, interval_ns: NANOS_PER_SECOND / rate_per_second, sends_count: 0, rate_per_second }
    }

    /// The current rate.
    pub fn rate_per_second(&self) -> f64 {
        self.rate_per_second
    }

    /// Restarts the schedule at `now_ns` with a new rate (as OMB does on a rate change).
    pub fn set_rate(&mut self, rate_per_second: f64, now_ns: u64) {
        assert!(rate_per_second > 0.0, "rate must be positive");
        *self = Self::new(rate_per_second, now_ns);
    }

    /// The intended time of the next send, in monotonic nanoseconds.
    pub fn acquire(&mut self) -> u64 {
        let intended_ns = self.start_ns + (self.sends_count as f64 * self.interval_ns) as u64;
        self.sends_count += 1;
        intended_ns
    }
}

/// Bounds of the discovery controller (OMB's defaults).
#[derive(Debug, Clone, Copy)]
pub struct RateControllerConfig {
    /// Allowed shortfall of sends against the target in one period.
    pub publish_backlog_limit: i64,
    /// Allowed unconsumed messages.
    pub receive_backlog_limit: i64,
    /// Smallest ramp factor.
    pub ramping_factor_min: f64,
    /// Largest ramp factor.
    pub ramping_factor_max: f64,
}

impl Default for RateControllerConfig {
    fn default() -> Self {
        Self {
            publish_backlog_limit: 1_000,
            receive_backlog_limit: 1_000,
            ramping_factor_min: 0.01,
            ramping_factor_max: 1.0,
        }
    }
}

/// OMB's rate discovery: see the module docs.
#[derive(Debug, Clone)]
pub struct RateController {
    config: RateControllerConfig,
    ramping_factor: f64,
    published_total_previous: i64,
    received_total_previous: i64,
}

impl RateController {
    /// A controller with `config`, starting at the largest ramp factor.
    pub fn new(config: RateControllerConfig) -> Self {
        assert!(config.ramping_factor_min <= config.ramping_factor_max);
        Self {
            config,
            ramping_factor: config.ramping_factor_max,
            published_total_previous: 0,
            received_total_previous: 0,
        }
    }

    /// The rate for the next period. `received_total` counts every subscription's copy,
    /// `subscriptions` is the copies each published message should produce.
    pub fn next_rate(
        &mut self,
        rate: f64,
        period_ns: u64,
        published_total: i64,
        received_total: i64,
        subscriptions: i64,
    ) -> f64 {
        assert!(period_ns > 0);
        let expected = (rate / NANOS_PER_SECOND * period_ns as f64) as i64;
        let published = published_total - self.published_total_previous;
        let received = received_total - self.received_total_previous;
        self.published_total_previous = published_total;
        self.received_total_previous = received_total;

        let receive_backlog = subscriptions * published_total - received_total;
        if receive_backlog > self.config.receive_backlog_limit {
            return self.slow_down(period_ns, received / subscriptions.max(1), expected, receive_backlog);
        }
        let publish_backlog = expected - published;
        if publish_backlog > self.config.publish_backlog_limit {
            return self.slow_down(period_ns, published, expected, publish_backlog);
        }
        self.ramping_factor = (self.ramping_factor * 2.0).min(self.config.ramping_factor_max);
        rate + rate * self.ramping_factor
    }

    fn slow_down(&mut self, period_ns: u64, actual: i64, expected: i64, backlog: i64) -> f64 {
        self.ramping_factor = (self.ramping_factor / 2.0).max(self.config.ramping_factor_min);
        let next_expected = (expected - backlog).max(0);
        let per_second = |count: i64| count as f64 / period_ns as f64 * NANOS_PER_SECOND;
        // Never drop to zero: a stalled period would otherwise end the run's load.
        per_second(actual).min(per_second(next_expected)).max(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intended_times_are_uniform_from_start() {
        let mut limiter = RateLimiter::new(1_000.0, 5_000);
        let times: Vec<u64> = (0..4).map(|_| limiter.acquire()).collect();
        assert_eq!(times, vec![5_000, 1_005_000, 2_005_000, 3_005_000]);
    }

    #[test]
    fn intended_times_do_not_depend_on_when_acquired() {
        // A sender that stalls still gets the schedule's times, so the stall becomes
        // publish delay instead of a lower offered rate.
        let mut limiter = RateLimiter::new(3.0, 0);
        let first = limiter.acquire();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let second = limiter.acquire();
        assert_eq!(first, 0);
        assert_eq!(second, 333_333_333);
    }

    #[test]
    fn rate_change_restarts_schedule() {
        let mut limiter = RateLimiter::new(10.0, 0);
        limiter.acquire();
        limiter.acquire();
        limiter.set_rate(100.0, 1_000_000_000);
        assert_eq!(limiter.acquire(), 1_000_000_000);
        assert_eq!(limiter.acquire(), 1_010_000_000);
        assert_eq!(limiter.rate_per_second(), 100.0);
    }

    #[test]
    fn controller_ramps_up_then_backs_off() {
        let mut controller = RateController::new(RateControllerConfig::default());
        let second = 1_000_000_000;
        // Kept up: grows by the ramp factor (1.0 at first).
        let rate = controller.next_rate(10_000.0, second, 10_000, 10_000, 1);
        assert_eq!(rate, 20_000.0);
        // Consumers 5,000 behind: drop to what was received, halve the factor.
        let rate = controller.next_rate(rate, second, 30_000, 25_000, 1);
        assert_eq!(rate, 15_000.0);
        // Caught up again: grows by the (doubled back) factor 1.0.
        let rate = controller.next_rate(rate, second, 45_000, 45_000, 1);
        assert_eq!(rate, 30_000.0);
    }
}
