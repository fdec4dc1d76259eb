//! Memory caps for the brokers the bench starts: one memory cgroup per broker process.
//!
//! Why: a catch-up test is only a test of reading from disk if the backlog does not fit in
//! the page cache. On a machine with 24 GiB of RAM a few GiB of backlog stay cached, so
//! "catch-up" would be a memory copy. A memory cgroup charges the page cache a process
//! fills (its writes and reads) to that cgroup, and when the cgroup reaches its limit the
//! kernel reclaims within it, oldest pages first, so a backlog several times the cap is
//! truly cold when the consumers come back to it.
//!
//! The same rule for both brokers (`--broker-memory-limit BUDGET`): BUDGET is the page
//! cache each broker node may use; the cgroup limit is BUDGET plus the broker's own
//! resident need, so both get the same page cache and neither loses its cache to its own
//! heap:
//!
//! - Sluice: BUDGET + [`SLUICE_RESIDENT_ALLOWANCE`].
//! - Kafka: BUDGET + its JVM heap (`--kafka-heap`, pre-touched under a cap so it is resident
//!   from the start, as the allowance assumes) + [`JVM_NON_HEAP_ALLOWANCE`] (metaspace, code
//!   cache, thread stacks, GC structures).
//!
//! The result records the limit and the cgroup's peak usage and limit hits, and the
//! broker's peak RSS, so what was left for the page cache can be checked after the fact.
//!
//! The cgroup is created per broker process under the bench's own memory cgroup (so a
//! bench running inside a container or a systemd unit stays within its limits), the
//! broker is spawned inside it (it writes itself into `cgroup.procs` between fork and
//! exec, so every page it ever touches is charged there, the JVM's heap included), and the
//! cgroup is removed after the broker stopped. cgroup v1 (`memory` hierarchy) and cgroup
//! v2 (a hierarchy whose `cgroup.controllers` lists `memory`) are supported; it needs
//! root (or a delegated cgroup). Without either the bench stops with an error rather than
//! run uncapped.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

const MIB: u64 = 1024 * 1024;
/// What Sluice may keep resident besides the page cache: its RSS is tens of MiB at the
/// local workloads' rates, but a catch-up read holds fetch responses in memory (Kafka
/// sends them from the page cache with sendfile); the 2 GiB catch-up workload peaked at
/// 289 MiB RSS under a 512 MiB budget.
pub const SLUICE_RESIDENT_ALLOWANCE: u64 = 320 * MIB;
/// What a Kafka JVM keeps resident besides its heap (metaspace, code cache, thread stacks,
/// G1's remembered sets, mapped index files): Kafka 4.3.1 with a pre-touched 1 GiB heap
/// peaked at 1,515 MiB RSS in the 2 GiB catch-up workload.
pub const JVM_NON_HEAP_ALLOWANCE: u64 = 512 * MIB;
/// Smallest page-cache budget accepted (below it a broker would thrash on its own
/// index files, which is not what a catch-up test measures).
pub const PAGE_CACHE_BUDGET_MIN: u64 = 16 * MIB;
/// How long removing a cgroup may be retried after its last process exited (the kernel
/// finishes the exit asynchronously).
const REMOVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Prefix of the cgroups the bench creates.
const CGROUP_PREFIX: &str = "sluice-bench";

/// Parses a size: bytes, or a number with a binary suffix `k`, `m`, `g`, `t` (also
/// `KiB`, `MB`, ... all read as powers of 1024, as the JVM's `-Xmx`). Fractions are
/// allowed (`1.5g`).
pub fn parse_size(text: &str) -> anyhow::Result<u64> {
    let trimmed = text.trim();
    let lower = trimmed.to_ascii_lowercase();
    let digits_end = lower.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(lower.len());
    let (number, unit) = lower.split_at(digits_end);
    let unit = unit.trim().trim_end_matches("ib").trim_end_matches('b');
    let multiplier: u64 = match unit {
        "" => 1,
        "k" => 1024,
        "m" => MIB,
        "g" => 1024 * MIB,
        "t" => 1024 * 1024 * MIB,
        _ => bail!("size {trimmed:?}: unknown unit (use k, m, g or t)"),
    };
    let value: f64 = number.parse().with_context(|| format!("size {trimmed:?} is not a number with a unit"))?;
    if !value.is_finite() || value < 0.0 {
        bail!("size {trimmed:?} must be a positive number");
    }
    Ok((value * multiplier as f64).round() as u64)
}

/// `--broker-memory-limit`: the page cache each broker node may use (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryCap {
    /// Page cache each node may use, bytes.
    pub page_cache_budget: u64,
}

impl std::str::FromStr for MemoryCap {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Self> {
        let page_cache_budget = parse_size(text)?;
        if page_cache_budget < PAGE_CACHE_BUDGET_MIN {
            bail!("--broker-memory-limit {text}: at least {} MiB", PAGE_CACHE_BUDGET_MIN / MIB);
        }
        Ok(MemoryCap { page_cache_budget })
    }
}

impl MemoryCap {
    /// Sluice's resident allowance and cgroup limit.
    pub fn for_sluice(&self) -> BrokerMemoryLimit {
        BrokerMemoryLimit { page_cache_budget: self.page_cache_budget, resident_allowance: SLUICE_RESIDENT_ALLOWANCE }
    }

    /// Kafka's: its heap plus the JVM's non-heap allowance.
    pub fn for_kafka(&self, heap: &str) -> anyhow::Result<BrokerMemoryLimit> {
        let heap_bytes = parse_size(heap).with_context(|| format!("--kafka-heap {heap}"))?;
        Ok(BrokerMemoryLimit {
            page_cache_budget: self.page_cache_budget,
            resident_allowance: heap_bytes + JVM_NON_HEAP_ALLOWANCE,
        })
    }
}

/// One broker node's cap: what its cgroup limit is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerMemoryLimit {
    /// Page cache the node may use.
    pub page_cache_budget: u64,
    /// The broker's own resident need (heap, buffers).
    pub resident_allowance: u64,
}

impl BrokerMemoryLimit {
    /// The cgroup limit: budget + allowance.
    pub fn limit(&self) -> u64 {
        self.page_cache_budget + self.resident_allowance
    }
}

/// What a capped run records (`sluice.brokerMemory` in the result).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryFigures {
    /// `v1` or `v2`.
    pub cgroup_version: String,
    /// Cgroup limit of each node, bytes (budget + allowance).
    pub limit_bytes: u64,
    /// Page cache each node may use, bytes (`--broker-memory-limit`).
    pub page_cache_budget_bytes: u64,
    /// The broker's resident allowance within the limit, bytes.
    pub resident_allowance_bytes: u64,
    /// Highest usage of any node's cgroup (page cache included), bytes.
    pub peak_usage_bytes: Option<u64>,
    /// Times a node's cgroup hit its limit (v1 `memory.failcnt`, v2 `memory.events` max),
    /// summed over nodes: above zero means the kernel reclaimed within the cap.
    pub limit_hits: Option<u64>,
    /// Page cache charged to the cgroups at the end of the run, bytes, summed over nodes.
    pub page_cache_bytes_at_end: Option<u64>,
}

/// Which cgroup interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The legacy `memory` hierarchy.
    V1,
    /// The unified hierarchy.
    V2,
}

impl CgroupVersion {
    fn as_str(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        }
    }
}

/// Where new memory cgroups go: the bench's own memory cgroup, and the interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupParent {
    /// Folder of the bench's own cgroup.
    pub dir: PathBuf,
    /// Interface.
    pub version: CgroupVersion,
}

/// Finds the bench's memory cgroup from `/proc/self/mounts` and `/proc/self/cgroup`.
pub fn memory_cgroup_parent() -> anyhow::Result<CgroupParent> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    let own = std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    let controllers_of = |mount: &Path| std::fs::read_to_string(mount.join("cgroup.controllers")).ok();
    find_memory_parent(&mounts, &own, controllers_of).ok_or_else(|| {
        anyhow::anyhow!(
            "no memory cgroup to cap the broker with: neither a cgroup v1 `memory` hierarchy nor a cgroup v2 \
             hierarchy with the memory controller is mounted (see /proc/self/mounts); run without \
             --broker-memory-limit or on a host with memory cgroups"
        )
    })
}

/// The v1 `memory` hierarchy if mounted, else a v2 hierarchy listing `memory`; joined with
/// this process's path in it.
fn find_memory_parent(
    mounts: &str,
    own_cgroups: &str,
    controllers_of: impl Fn(&Path) -> Option<String>,
) -> Option<CgroupParent> {
    let mut v2_mount = None;
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, mount_point, fs_type, options, ..] = fields[..] else {
            continue;
        };
        let mount_point = PathBuf::from(mount_point.replace("\\040", " "));
        if fs_type == "cgroup" && options.split(',').any(|option| option == "memory") {
            let own = own_cgroups.lines().find_map(|line| {
                let mut parts = line.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers.split(',').any(|c| c == "memory").then(|| path.to_string())
            })?;
            return Some(CgroupParent { dir: join_cgroup(&mount_point, &own), version: CgroupVersion::V1 });
        }
        if fs_type == "cgroup2"
            && v2_mount.is_none()
            && controllers_of(&mount_point).is_some_and(|text| text.split_whitespace().any(|c| c == "memory"))
        {
            v2_mount = Some(mount_point);
        }
    }
    let mount = v2_mount?;
    let own = own_cgroups.lines().find_map(|line| line.strip_prefix("0::"))?;
    Some(CgroupParent { dir: join_cgroup(&mount, own), version: CgroupVersion::V2 })
}

fn join_cgroup(mount: &Path, path: &str) -> PathBuf {
    mount.join(path.trim_start_matches('/'))
}

/// A memory cgroup holding one broker process; removed on drop.
#[derive(Debug)]
pub struct MemoryCgroup {
    dir: PathBuf,
    version: CgroupVersion,
    limit: BrokerMemoryLimit,
    procs: CString,
}

impl MemoryCgroup {
    /// Creates `<parent>/sluice-bench-<pid>-<n>-<name>` with the limit.
    pub fn create(name: &str, limit: BrokerMemoryLimit) -> anyhow::Result<MemoryCgroup> {
        let parent = memory_cgroup_parent()?;
        Self::create_in(&parent, name, limit)
    }

    /// As [`MemoryCgroup::create`], under `parent`.
    pub fn create_in(parent: &CgroupParent, name: &str, limit: BrokerMemoryLimit) -> anyhow::Result<MemoryCgroup> {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        let sequence = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let dir = parent.dir.join(format!("{CGROUP_PREFIX}-{}-{sequence}-{name}", std::process::id()));
        if parent.version == CgroupVersion::V2 {
            enable_v2_memory(&parent.dir)?;
        }
        std::fs::create_dir(&dir).with_context(|| {
            format!("creating memory cgroup {} (--broker-memory-limit needs root or a delegated cgroup)", dir.display())
        })?;
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())?;
        let cgroup = MemoryCgroup { dir, version: parent.version, limit, procs };
        cgroup.write_limit().inspect_err(|_| cgroup.remove())?;
        Ok(cgroup)
    }

    fn write_limit(&self) -> anyhow::Result<()> {
        let bytes = self.limit.limit().to_string();
        match self.version {
            CgroupVersion::V1 => {
                self.write("memory.limit_in_bytes", &bytes)?;
                // With swap, anonymous memory could be swapped out instead of the page cache
                // being reclaimed; hold memory+swap to the same limit where the kernel has
                // it. Only with swap: a memsw limit makes the kernel stop counting limit hits
                // in `memory.failcnt`.
                if swap_present() && self.dir.join("memory.memsw.limit_in_bytes").exists() {
                    self.write("memory.memsw.limit_in_bytes", &bytes)?;
                }
            }
            CgroupVersion::V2 => {
                self.write("memory.max", &bytes)?;
                if self.dir.join("memory.swap.max").exists() {
                    self.write("memory.swap.max", "0")?;
                }
            }
        }
        Ok(())
    }

    fn write(&self, file: &str, value: &str) -> anyhow::Result<()> {
        let path = self.dir.join(file);
        std::fs::write(&path, value).with_context(|| format!("writing {value} to {}", path.display()))
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(file)).ok()
    }

    /// The cgroup's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The limit it was created with.
    pub fn limit(&self) -> BrokerMemoryLimit {
        self.limit
    }

    /// Makes `command`'s process enter this cgroup before it executes, so everything it
    /// allocates or caches is charged here.
    pub fn enter_on_spawn<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        let procs = self.procs.clone();
        // SAFETY: the closure runs between fork and exec and only calls open(2), write(2)
        // and close(2), which are async-signal-safe, on memory allocated before the fork.
        unsafe {
            command.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0" is the writing process itself, in v1 and v2.
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let error = std::io::Error::last_os_error();
                libc::close(fd);
                if written != 1 {
                    return Err(error);
                }
                Ok(())
            })
        }
    }

    /// Pids in the cgroup.
    pub fn pids(&self) -> Vec<u32> {
        self.read("cgroup.procs")
            .map(|text| text.lines().filter_map(|line| line.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Peak usage, limit hits and page cache now.
    pub fn figures(&self) -> MemoryFigures {
        let number = |text: Option<String>| text.and_then(|t| t.trim().parse::<u64>().ok());
        let stat = self.read("memory.stat").unwrap_or_default();
        let (peak_usage_bytes, limit_hits, cache_key) = match self.version {
            CgroupVersion::V1 => {
                (number(self.read("memory.max_usage_in_bytes")), number(self.read("memory.failcnt")), "total_cache")
            }
            CgroupVersion::V2 => {
                let events = self.read("memory.events").unwrap_or_default();
                (number(self.read("memory.peak")), stat_value(&events, "max"), "file")
            }
        };
        MemoryFigures {
            cgroup_version: self.version.as_str().to_string(),
            limit_bytes: self.limit.limit(),
            page_cache_budget_bytes: self.limit.page_cache_budget,
            resident_allowance_bytes: self.limit.resident_allowance,
            peak_usage_bytes,
            limit_hits,
            page_cache_bytes_at_end: stat_value(&stat, cache_key),
        }
    }

    fn remove(&self) {
        let started = Instant::now();
        loop {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return,
                // Busy until the last process's exit completes.
                Err(error) if started.elapsed() > REMOVE_TIMEOUT => {
                    eprintln!("warning: could not remove memory cgroup {}: {error}", self.dir.display());
                    return;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Sums the figures of a cluster's nodes: the limit is per node, usage the highest node's.
pub fn sum_figures(figures: &[MemoryFigures]) -> Option<MemoryFigures> {
    let first = figures.first()?.clone();
    let sum = |pick: fn(&MemoryFigures) -> Option<u64>| figures.iter().map(pick).sum::<Option<u64>>();
    Some(MemoryFigures {
        peak_usage_bytes: figures.iter().map(|f| f.peak_usage_bytes).max().flatten(),
        limit_hits: sum(|f| f.limit_hits),
        page_cache_bytes_at_end: sum(|f| f.page_cache_bytes_at_end),
        ..first
    })
}

/// Whether the machine has swap (`SwapTotal` above zero).
fn swap_present() -> bool {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix("SwapTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .is_some_and(|kib| kib > 0)
}

/// `key value` lines (`memory.stat`, `memory.events`).
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next()? == key).then(|| parts.next()?.parse().ok()).flatten()
    })
}

/// cgroup v2: children get the memory controller only when their parent delegates it.
fn enable_v2_memory(parent: &Path) -> anyhow::Result<()> {
    let control = parent.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&control).unwrap_or_default();
    if enabled.split_whitespace().any(|c| c == "memory") {
        return Ok(());
    }
    std::fs::write(&control, "+memory").with_context(|| {
        format!(
            "enabling the memory controller in {} (cgroup v2 lets a cgroup that holds processes delegate no \
             controller: run the bench in its own cgroup, e.g. `systemd-run --scope -p Delegate=yes sluice bench ...`)",
            control.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("2MB").unwrap(), 2 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("1x").is_err());
        assert!(parse_size("g").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn limits_follow_the_rule() {
        let cap: MemoryCap = "512m".parse().unwrap();
        assert_eq!(cap.for_sluice().limit(), 512 * MIB + SLUICE_RESIDENT_ALLOWANCE);
        let kafka = cap.for_kafka("1g").unwrap();
        assert_eq!(kafka.page_cache_budget, cap.for_sluice().page_cache_budget);
        assert_eq!(kafka.limit(), 512 * MIB + 1024 * MIB + JVM_NON_HEAP_ALLOWANCE);
        assert!("1m".parse::<MemoryCap>().is_err(), "below the minimum budget");
        assert!(cap.for_kafka("lots").is_err());
    }

    const MOUNTS_V1: &str = "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n\
        cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
        cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
        cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
    const OWN_V1: &str = "4:memory:/process_api/abc\n1:cpu:/\n0::/\n";

    #[test]
    fn finds_the_v1_memory_hierarchy_and_our_place_in_it() {
        let parent = find_memory_parent(MOUNTS_V1, OWN_V1, |_| Some("hugetlb\n".into())).unwrap();
        assert_eq!(
            parent,
            CgroupParent { dir: "/sys/fs/cgroup/memory/process_api/abc".into(), version: CgroupVersion::V1 }
        );
    }

    #[test]
    fn finds_v2_only_when_it_has_the_memory_controller() {
        let mounts = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        let own = "0::/user.slice/bench.scope\n";
        let parent = find_memory_parent(mounts, own, |_| Some("cpu io memory pids\n".into())).unwrap();
        assert_eq!(
            parent,
            CgroupParent { dir: "/sys/fs/cgroup/user.slice/bench.scope".into(), version: CgroupVersion::V2 }
        );
        assert_eq!(find_memory_parent(mounts, own, |_| Some("cpu io pids\n".into())), None);
        // The hybrid layout's unified hierarchy without memory, no v1 memory: nothing.
        let hybrid = "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        assert_eq!(find_memory_parent(hybrid, OWN_V1, |_| Some("hugetlb".into())), None);
    }

    #[test]
    fn stat_values_and_sums() {
        assert_eq!(stat_value("cache 10\nrss 5\ntotal_cache 12\n", "total_cache"), Some(12));
        assert_eq!(stat_value("low 0\nhigh 0\nmax 7\noom 0\n", "max"), Some(7));
        assert_eq!(stat_value("cache 10\n", "file"), None);
        let node = |peak, hits| MemoryFigures {
            cgroup_version: "v1".into(),
            limit_bytes: 100,
            peak_usage_bytes: Some(peak),
            limit_hits: Some(hits),
            page_cache_bytes_at_end: Some(10),
            ..MemoryFigures::default()
        };
        let total = sum_figures(&[node(90, 1), node(99, 2)]).unwrap();
        assert_eq!((total.limit_bytes, total.peak_usage_bytes, total.limit_hits), (100, Some(99), Some(3)));
        assert_eq!(total.page_cache_bytes_at_end, Some(20));
        assert_eq!(sum_figures(&[]), None);
    }

    /// As root on a host with memory cgroups (CI here): a child spawned into a capped
    /// cgroup runs in it under the limit, and the cgroup is gone after drop. Skipped
    /// (with a message) elsewhere.
    #[test]
    fn a_spawned_process_runs_inside_the_capped_cgroup() {
        let Ok(parent) = memory_cgroup_parent() else {
            eprintln!("SKIPPED: no memory cgroup hierarchy");
            return;
        };
        let limit = BrokerMemoryLimit { page_cache_budget: 32 * MIB, resident_allowance: 16 * MIB };
        let cgroup = match MemoryCgroup::create_in(&parent, "unit-test", limit) {
            Ok(cgroup) => cgroup,
            Err(error) => {
                eprintln!("SKIPPED: cannot create a memory cgroup here: {error:#}");
                return;
            }
        };
        let dir = cgroup.dir().to_path_buf();
        let limit_file = if parent.version == CgroupVersion::V1 { "memory.limit_in_bytes" } else { "memory.max" };
        let written: u64 = std::fs::read_to_string(dir.join(limit_file)).unwrap().trim().parse().unwrap();
        assert_eq!(written, 48 * MIB);
        let mut child = cgroup.enter_on_spawn(Command::new("sleep").arg("30")).spawn().unwrap();
        assert_eq!(cgroup.pids(), vec![child.id()]);
        let own = std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(own.contains(&name), "{own}");
        let figures = cgroup.figures();
        assert_eq!(figures.limit_bytes, 48 * MIB);
        assert!(figures.peak_usage_bytes.is_some_and(|peak| peak > 0 && peak <= 48 * MIB), "{figures:?}");
        child.kill().unwrap();
        child.wait().unwrap();
        // Page cache is charged to the cgroup and reclaimed within it: writing twice the
        // limit to a file hits the limit and stays under it.
        let file = tempfile::NamedTempFile::new().unwrap();
        let status = cgroup
            .enter_on_spawn(Command::new("dd").arg("if=/dev/zero").arg(format!("of={}", file.path().display())))
            .args(["bs=1M", "count=96", "status=none"])
            .status()
            .unwrap();
        assert!(status.success());
        let figures = cgroup.figures();
        assert!(figures.limit_hits.is_some_and(|hits| hits > 0), "{figures:?}");
        assert!(figures.peak_usage_bytes.is_some_and(|peak| peak <= 48 * MIB), "{figures:?}");
        assert!(figures.page_cache_bytes_at_end.is_some_and(|cache| cache > 0 && cache <= 48 * MIB), "{figures:?}");
        drop(cgroup);
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
