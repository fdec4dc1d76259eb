//! Broker CPU time and memory from `/proc`.
//!
//! CPU seconds are `utime + stime` of `/proc/PID/stat` (the process and all its
//! threads) at the end minus at the start of the measured phase; `stime` alone is the
//! kernel's share (syscalls, TCP, block I/O, page faults): mostly the cost of moving the
//! bytes, which bounds how far a broker's CPU per byte can fall. Peak RSS is `VmHWM`
//! from `/proc/PID/status`, the kernel's high-water mark since the process started,
//! which is the figure for a broker started fresh for the run. Disk reads are `read_bytes`
//! of `/proc/PID/io` (what reached the block layer, so page-cache hits are not counted),
//! which tells a cold catch-up read from a cached one.
//!
//! The clients' CPU (the bench process's own) and the whole machine's busy time (`/proc/stat`)
//! say whether a figure is the broker's or the machine's: on a small machine the clients of
//! a many-partition workload can take most of the cores themselves.

use std::sync::atomic::{AtomicU64, Ordering};

/// Resource use over a measured phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// CPU seconds (user + system).
    pub cpu_seconds: Option<f64>,
    /// CPU seconds in the kernel (system), part of `cpu_seconds`.
    pub kernel_cpu_seconds: Option<f64>,
    /// Peak resident set size in bytes.
    pub peak_rss_bytes: Option<u64>,
}

/// Samples the broker's processes (one per node) from the start of a phase to its end;
/// CPU seconds and peak RSS are summed over them.
#[derive(Debug)]
pub struct ProcessSampler {
    pids: Vec<u32>,
    cpu_ticks_start: Vec<Option<CpuTicks>>,
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
        let mut usage = Usage { cpu_seconds: Some(0.0), kernel_cpu_seconds: Some(0.0), peak_rss_bytes: Some(0) };
        for ((pid, start), sampled) in self.pids.iter().zip(&self.cpu_ticks_start).zip(&self.rss_bytes_max) {
            let used = start.zip(cpu_ticks(*pid)).map(|(start, end)| end.since(start));
            let cpu = used.map(|ticks| ticks.total() as f64 / ticks_per_second);
            let kernel = used.map(|ticks| ticks.system as f64 / ticks_per_second);
            let sampled = sampled.load(Ordering::Relaxed);
            let rss = status_kib(*pid, "VmHWM:").map(|kib| kib * 1024).or((sampled > 0).then_some(sampled));
            usage.cpu_seconds = usage.cpu_seconds.zip(cpu).map(|(a, b)| a + b);
            usage.kernel_cpu_seconds = usage.kernel_cpu_seconds.zip(kernel).map(|(a, b)| a + b);
            usage.peak_rss_bytes = usage.peak_rss_bytes.zip(rss).map(|(a, b)| a + b);
        }
        if self.pids.is_empty() {
            return Usage::default();
        }
        usage
    }
}

/// The bench process's CPU and the machine's busy time over a measured phase.
#[derive(Debug)]
pub struct MachineSampler {
    own_ticks_start: Option<CpuTicks>,
    machine_start: Option<MachineTicks>,
    started: std::time::Instant,
}

/// What [`MachineSampler`] measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MachineUsage {
    /// CPU seconds of this process (the clients).
    pub own_cpu_seconds: Option<f64>,
    /// Cores busy on average, all processes.
    pub busy_cores: Option<f64>,
    /// Cores the hypervisor took from this virtual machine on average (steal time): the
    /// host's other guests. Included in `busy_cores`; a round with much of it was noisy.
    pub steal_cores: Option<f64>,
    /// The machine's online cores.
    pub cores: Option<u32>,
}

impl MachineSampler {
    /// Starts measuring.
    pub fn start() -> Self {
        Self {
            own_ticks_start: cpu_ticks(std::process::id()),
            machine_start: machine_ticks(),
            started: std::time::Instant::now(),
        }
    }

    /// Ends the measurement.
    pub fn finish(self) -> MachineUsage {
        let elapsed = self.started.elapsed().as_secs_f64();
        let own = self.own_ticks_start.zip(cpu_ticks(std::process::id()));
        let machine = self.machine_start.zip(machine_ticks()).filter(|_| elapsed > 0.0);
        let cores_of = |ticks: u64| ticks as f64 / ticks_per_second() / elapsed;
        MachineUsage {
            own_cpu_seconds: own.map(|(start, end)| end.since(start).total() as f64 / ticks_per_second()),
            busy_cores: machine.map(|(start, end)| cores_of(end.busy.saturating_sub(start.busy))),
            steal_cores: machine.map(|(start, end)| cores_of(end.steal.saturating_sub(start.steal))),
            cores: std::thread::available_parallelism().ok().and_then(|n| u32::try_from(n.get()).ok()),
        }
    }
}

/// The machine's CPU time so far, in ticks, from the `cpu` line of `/proc/stat`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct MachineTicks {
    /// user, nice, system, irq, softirq and steal: all but idle and iowait.
    busy: u64,
    /// steal: time the hypervisor ran something else while this machine wanted a core.
    steal: u64,
}

fn machine_ticks() -> Option<MachineTicks> {
    parse_machine_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_machine_ticks(text: &str) -> Option<MachineTicks> {
    let line = text.lines().find(|line| line.starts_with("cpu "))?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).map(|t| t.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice, already in user and nice]
    let field = |i: usize| ticks.get(i).copied().unwrap_or(0);
    if ticks.len() < 4 {
        return None;
    }
    Some(MachineTicks { busy: field(0) + field(1) + field(2) + field(5) + field(6) + field(7), steal: field(7) })
}

/// Total CPU seconds used so far by `pid`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    cpu_ticks(pid).map(|ticks| ticks.total() as f64 / ticks_per_second())
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

/// A process's CPU time so far, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CpuTicks {
    /// utime: in user space.
    user: u64,
    /// stime: in the kernel on the process's behalf.
    system: u64,
}

impl CpuTicks {
    fn total(self) -> u64 {
        self.user + self.system
    }

    /// The ticks used between `start` and `self`.
    fn since(self, start: CpuTicks) -> CpuTicks {
        CpuTicks { user: self.user.saturating_sub(start.user), system: self.system.saturating_sub(start.system) }
    }
}

fn cpu_ticks(pid: u32) -> Option<CpuTicks> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_ticks(&text)
}

/// utime and stime from a `/proc/PID/stat` line. The command name (field 2) may hold
/// spaces and parentheses, so fields are counted after its closing parenthesis.
fn parse_stat_ticks(text: &str) -> Option<CpuTicks> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(CpuTicks { user, system })
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
        assert_eq!(parse_stat_ticks(line), Some(CpuTicks { user: 250, system: 50 }));
        assert_eq!(parse_stat_ticks(line).unwrap().total(), 300);
    }

    #[test]
    fn machine_busy_time_leaves_out_idle_iowait_and_guests() {
        let text = "cpu  100 5 20 900 40 3 2 1 7 0\ncpu0 50 2 10 450 20 1 1 0 0 0\n";
        assert_eq!(parse_machine_ticks(text), Some(MachineTicks { busy: 100 + 5 + 20 + 3 + 2 + 1, steal: 1 }));
        assert_eq!(parse_machine_ticks("cpu0 1 2 3 4\n"), None);
    }

    /// CPU time this thread has used.
    fn thread_cpu_seconds() -> f64 {
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `now` is a valid timespec the call writes.
        assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) }, 0);
        now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
    }

    #[test]
    fn own_cpu_and_machine_busy_time_are_measured() {
        let sampler = MachineSampler::start();
        // Busy for 300 ms of this thread's own CPU time, not of the clock: on a loaded
        // machine a 300 ms wall-clock loop may get a fraction of that.
        let mut x = 0u64;
        while thread_cpu_seconds() < 0.3 {
            for _ in 0..10_000 {
                x = x.wrapping_add(std::hint::black_box(x) | 1);
            }
        }
        assert!(x > 0);
        let usage = sampler.finish();
        let own = usage.own_cpu_seconds.unwrap();
        assert!(own >= 0.1, "a 300 ms busy loop used {own} CPU s");
        assert!(usage.busy_cores.unwrap() >= 0.3, "{usage:?}");
        assert!((0.0..=usage.busy_cores.unwrap()).contains(&usage.steal_cores.unwrap()), "{usage:?}");
        assert!(usage.cores.unwrap() >= 1);
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
        let (cpu, kernel) = (usage.cpu_seconds.unwrap(), usage.kernel_cpu_seconds.unwrap());
        assert!((0.0..=cpu).contains(&kernel), "kernel {kernel} s of {cpu} s");
        assert!(usage.peak_rss_bytes.unwrap() > 1024 * 1024);
    }
}
