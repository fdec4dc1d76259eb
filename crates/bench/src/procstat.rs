//! Broker CPU time and memory from `/proc`.
//!
//! CPU seconds are `utime + stime` of `/proc/PID/stat` (the process and all its
//! threads) at the end minus at the start of the measured phase. Peak RSS is `VmHWM`
//! from `/proc/PID/status`, the kernel's high-water mark since the process started,
//! which is the figure for a broker started fresh for the run. Disk reads are `read_bytes`
//! of `/proc/PID/io` (what reached the block layer, so page-cache hits are not counted),
//! which tells a cold catch-up read from a cached one.

use std::sync::atomic::{AtomicU64, Ordering};

/// Resource use over a measured phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// CPU seconds (user + system).
    pub cpu_seconds: Option<f64>,
    /// Peak resident set size in bytes.
    pub peak_rss_bytes: Option<u64>,
}

/// Samples the broker's processes (one per node) from the start of a phase to its end;
/// CPU seconds and peak RSS are summed over them.
#[derive(Debug)]
pub struct ProcessSampler {
    pids: Vec<u32>,
    cpu_ticks_start: Vec<Option<u64>>,
    rss_bytes_max: Vec<AtomicU64>,
}

impl ProcessSampler {
    /// Starts measuring `pids`.
    pub fn start(pids: &[u32]) -> Self {
        Self {
            pids: pids.to_vec(),
            cpu_ticks_start: pids.iter().map(|&pid| cpu_ticks(pid)).collect(),
            rss_bytes_max: pids.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Notes the current RSS (in case VmHWM is unavailable).
    pub fn tick(&self) {
        for (pid, max) in self.pids.iter().zip(&self.rss_bytes_max) {
            if let Some(rss) = status_kib(*pid, "VmRSS:") {
                max.fetch_max(rss * 1024, Ordering::Relaxed);
            }
        }
    }

    /// Ends the measurement; a figure is `None` unless every process could be measured.
    pub fn finish(self) -> Usage {
        let ticks_per_second = ticks_per_second();
        let mut usage = Usage { cpu_seconds: Some(0.0), peak_rss_bytes: Some(0) };
        for ((pid, start), sampled) in self.pids.iter().zip(&self.cpu_ticks_start).zip(&self.rss_bytes_max) {
            let cpu = match (start, cpu_ticks(*pid)) {
                (Some(start), Some(end)) => Some(end.saturating_sub(*start) as f64 / ticks_per_second),
                _ => None,
            };
            let sampled = sampled.load(Ordering::Relaxed);
            let rss = status_kib(*pid, "VmHWM:").map(|kib| kib * 1024).or((sampled > 0).then_some(sampled));
            usage.cpu_seconds = usage.cpu_seconds.zip(cpu).map(|(a, b)| a + b);
            usage.peak_rss_bytes = usage.peak_rss_bytes.zip(rss).map(|(a, b)| a + b);
        }
        if self.pids.is_empty() {
            return Usage::default();
        }
        usage
    }
}

/// Total CPU seconds used so far by `pid`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    cpu_ticks(pid).map(|ticks| ticks as f64 / ticks_per_second())
}

/// Peak RSS so far of `pid`.
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:").map(|kib| kib * 1024)
}

/// Bytes `pids` have read from the block layer so far (`read_bytes` of `/proc/PID/io`,
/// all threads), summed; `None` unless every process could be read (it needs the same
/// user or root).
pub fn io_read_bytes(pids: &[u32]) -> Option<u64> {
    pids.iter().map(|pid| io_field(*pid, "read_bytes:")).sum()
}

fn io_field(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let line = text.lines().find(|line| line.starts_with(key))?;
    line[key.len()..].trim().parse().ok()
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

fn cpu_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_ticks(&text)
}

/// utime + stime from a `/proc/PID/stat` line. The command name (field 2) may hold
/// spaces and parentheses, so fields are counted after its closing parenthesis.
fn parse_stat_ticks(text: &str) -> Option<u64> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|line| line.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line_with_odd_name() {
        let line = "1234 (java (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0";
        assert_eq!(parse_stat_ticks(line), Some(300));
    }

    #[test]
    fn own_disk_reads_are_readable() {
        let pid = std::process::id();
        assert!(io_read_bytes(&[pid]).is_some());
        assert_eq!(io_read_bytes(&[]), Some(0));
        assert_eq!(io_read_bytes(&[pid, u32::MAX]), None, "a missing process spoils the sum");
    }

    #[test]
    fn own_process_is_measurable() {
        let pid = std::process::id();
        let sampler = ProcessSampler::start(&[pid]);
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        sampler.tick();
        let usage = sampler.finish();
        assert!(usage.cpu_seconds.is_some());
        assert!(usage.peak_rss_bytes.unwrap() > 1024 * 1024);
    }
}
