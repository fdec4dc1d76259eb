//! Local brokers started fresh for a run: `sluice serve` and Apache Kafka (KRaft).
//!
//! Each broker gets a new data directory and free loopback ports, is ready when it
//! answers ApiVersions, and is stopped with SIGTERM (then SIGKILL after a grace period)
//! when its handle drops. Kafka is installed on first use from Maven Central into a
//! cache folder with `mvn dependency:copy-dependencies` (see `shared/PEERS.md`); the
//! bench needs `java` and `mvn` on the PATH for that, nothing else.

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use crate::kafka::broker_api_keys;
use crate::memcap::{BrokerMemoryLimit, MemoryCap, MemoryCgroup, MemoryFigures};

/// Kafka release installed by default (the newest complete one on Maven Central).
pub const KAFKA_VERSION_DEFAULT: &str = "4.3.1";
/// The log4j binding that makes the broker log.
const LOG4J_SLF4J_VERSION: &str = "2.25.4";
/// How long a broker may take to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a broker may take to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// Where the kernel's ephemeral (bind 0, outgoing connection) ports begin.
const EPHEMERAL_PORTS: &str = "/proc/sys/net/ipv4/ip_local_port_range";
/// Listen ports are picked from this many ports below the ephemeral range, below the
/// span the Python tests pick from (12,000), so a bench run inside a test does not
/// collide with the test's own brokers.
const LISTEN_PORTS_BELOW_EPHEMERAL: (u16, u16) = (24_000, 12_000);
/// The next listen port to try, shared by every broker this process starts, so no
/// port is handed out twice; 0 until the first pick.
static NEXT_LISTEN_PORT: std::sync::Mutex<u16> = std::sync::Mutex::new(0);

/// `count` distinct free TCP ports on 127.0.0.1 for brokers to listen on (each free
/// when asked; the broker binds it right after). They lie below the ephemeral range: a
/// port the kernel hands out for bind 0 can be taken by any outgoing connection before
/// the broker binds it. None is handed out twice in one process, as ports picked
/// together (a cluster's client and controller ports) are bound only later.
pub fn free_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    let ephemeral_low = std::fs::read_to_string(EPHEMERAL_PORTS)
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let low = ephemeral_low.saturating_sub(LISTEN_PORTS_BELOW_EPHEMERAL.0).max(1024);
    let high = ephemeral_low.saturating_sub(LISTEN_PORTS_BELOW_EPHEMERAL.1).max(low + 1);
    let span = high - low;
    let mut next = NEXT_LISTEN_PORT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if *next == 0 {
        // Processes started together begin at different places.
        *next = low + (std::process::id() % u32::from(span)) as u16;
    }
    let mut ports = Vec::with_capacity(count);
    for _ in 0..span {
        if ports.len() == count {
            break;
        }
        let port = *next;
        *next = if port + 1 >= high { low } else { port + 1 };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    anyhow::ensure!(ports.len() == count, "fewer than {count} free ports in [{low}, {high})");
    Ok(ports)
}

/// Makes `command`'s process receive SIGTERM when the bench dies, so an interrupted
/// run leaves no broker behind.
pub(crate) fn die_with_parent(command: &mut Command) -> &mut Command {
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        })
    }
}

/// A fresh folder under the system temp dir, named `{prefix}-{pid}-{ns}`. The folders
/// of earlier runs that were killed before they could remove theirs (their process is
/// gone) are removed first: a broker's data dir holds gigabytes after a catch-up run.
/// A new file, its owner's only, holding a random secret for a cluster's nodes to share.
fn cluster_secret_file() -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = fresh_dir("sluice-bench-cluster-secret")?.join("cluster.secret");
    let secret = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    file.write_all(secret.as_bytes())?;
    Ok(path)
}

fn fresh_dir(prefix: &str) -> anyhow::Result<PathBuf> {
    let parent = std::env::temp_dir();
    remove_abandoned_dirs(&parent, prefix);
    let dir = parent.join(format!("{prefix}-{}-{}", std::process::id(), crate::kafka::monotonic_ns()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Removes `parent`'s `{prefix}-{pid}-{ns}` folders whose process no longer runs (best
/// effort: a folder that cannot be removed is left; a pid reused since is taken as alive).
fn remove_abandoned_dirs(parent: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)).and_then(|r| r.strip_prefix('-')) else {
            continue;
        };
        let Some((pid, ns)) = rest.split_once('-') else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if ns.is_empty() || !ns.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => eprintln!("removed {} (left by an interrupted run)", entry.path().display()),
                Err(error) => eprintln!("could not remove {}: {error}", entry.path().display()),
            }
        }
    }
}

/// A broker process we started; stopped on drop.
#[derive(Debug)]
pub struct BrokerProcess {
    child: Option<Child>,
    name: &'static str,
    bootstrap: String,
    /// The SSL listener clients use, when the run is over TLS (`bootstrap` stays the
    /// PLAINTEXT listener the bench checks readiness on).
    tls_bootstrap: Option<String>,
    data_dir: PathBuf,
    log_path: PathBuf,
    keep_data: bool,
    /// Where the log is copied once the process has stopped (before its folder is
    /// removed), when the run keeps logs with its results.
    log_copy: Option<PathBuf>,
    /// The memory cgroup the process runs in (`--broker-memory-limit`); removed after the
    /// process stopped (fields drop after [`BrokerProcess::stop`] ran).
    cgroup: Option<MemoryCgroup>,
}

impl BrokerProcess {
    /// `host:port` to bootstrap from.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// The broker's name (`sluice`, `kafka`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The broker's log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The memory cgroup the broker runs in, when capped.
    pub fn memory_cgroup(&self) -> Option<&MemoryCgroup> {
        self.cgroup.as_ref()
    }

    fn wait_ready(&mut self, log_marker: Option<&str>) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "{} exited during start-up ({status}); log: {}\n{}",
                        self.name,
                        self.log_path.display(),
                        tail_of(&self.log_path)
                    );
                }
            }
            let answers = broker_api_keys(&self.bootstrap).is_ok();
            let logged = match log_marker {
                Some(marker) => {
                    std::fs::read_to_string(&self.log_path).map(|text| text.contains(marker)).unwrap_or(false)
                }
                None => true,
            };
            // The log line is the real signal for Kafka; fall back on ApiVersions alone
            // after a while in case logging is configured differently.
            if answers && (logged || started.elapsed() > Duration::from_secs(20)) {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                bail!(
                    "{} not ready after {:?}; log: {}\n{}",
                    self.name,
                    READY_TIMEOUT,
                    self.log_path.display(),
                    tail_of(&self.log_path)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops the broker (SIGTERM, then SIGKILL after a grace period).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: plain kill(2) on the pid of a child we own and have not reaped.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let started = Instant::now();
        while started.elapsed() < STOP_GRACE {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Ok(None) = child.try_wait() {
            let _ = child.kill();
        }
        let _ = child.wait();
        if let Some(copy) = self.log_copy.take() {
            match copy_log_end(&self.log_path, &copy) {
                Ok(()) => println!("Kept {}'s log as {}", self.name, copy.display()),
                Err(error) => println!("warning: cannot keep {}'s log as {}: {error:#}", self.name, copy.display()),
            }
        }
        if !self.keep_data {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The broker processes of one run: one node, or the nodes of a cluster.
#[derive(Debug)]
pub struct BrokerSet {
    nodes: Vec<BrokerProcess>,
}

impl BrokerSet {
    /// Where the workload's clients connect: the SSL listeners in a TLS run, else
    /// [`BrokerSet::bootstrap`].
    pub fn client_bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|node| node.tls_bootstrap.clone().unwrap_or_else(|| node.bootstrap()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The bootstrap list (every node, comma-separated).
    pub fn bootstrap(&self) -> String {
        self.nodes.iter().map(BrokerProcess::bootstrap).collect::<Vec<_>>().join(",")
    }

    /// The nodes' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(BrokerProcess::pid).collect()
    }

    /// Keeps each node's log once the run stops it: copied into `dir` as
    /// `STEM.log` (one node) or `STEM-nodeN.log`, at most its last [`KEPT_LOG_BYTES_MAX`].
    pub fn keep_logs_in(&mut self, dir: &Path, stem: &str) {
        let single = self.nodes.len() == 1;
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let name = if single { format!("{stem}.log") } else { format!("{stem}-node{}.log", i + 1) };
            node.log_copy = Some(dir.join(name));
        }
    }

    /// The memory cap's figures (limit, peak usage, limit hits) over the nodes, when capped.
    pub fn memory_figures(&self) -> Option<MemoryFigures> {
        let figures: Vec<MemoryFigures> =
            self.nodes.iter().filter_map(|node| node.cgroup.as_ref().map(MemoryCgroup::figures)).collect();
        crate::memcap::sum_figures(&figures)
    }

    /// Waits until metadata lists every node (a cluster has formed and registered them).
    fn wait_registered(&self) -> anyhow::Result<()> {
        let mut config = rdkafka::ClientConfig::new();
        config.set("bootstrap.servers", self.bootstrap());
        let admin = crate::kafka::Admin::connect(&config)?;
        let started = Instant::now();
        loop {
            match admin.metadata() {
                Ok((brokers, _)) if brokers == self.nodes.len() => return Ok(()),
                Ok(_) | Err(_) if started.elapsed() < READY_TIMEOUT => std::thread::sleep(Duration::from_millis(250)),
                Ok((brokers, _)) => {
                    bail!("only {brokers} of {} nodes registered after {READY_TIMEOUT:?}", self.nodes.len())
                }
                Err(error) => return Err(error.context("waiting for the cluster's metadata")),
            }
        }
    }
}

impl From<BrokerProcess> for BrokerSet {
    fn from(node: BrokerProcess) -> Self {
        BrokerSet { nodes: vec![node] }
    }
}

/// `, memory cgroup ... limit N MiB` when the broker is capped.
fn cap_note(broker: &BrokerProcess) -> String {
    match &broker.cgroup {
        Some(cgroup) => {
            let limit = cgroup.limit();
            format!(
                " in memory cgroup {} (limit {} MiB = page-cache budget {} MiB + resident allowance {} MiB)",
                cgroup.dir().display(),
                limit.limit() >> 20,
                limit.page_cache_budget >> 20,
                limit.resident_allowance >> 20
            )
        }
        None => String::new(),
    }
}

/// The most of a broker's log a run keeps with its results (its end, where a failure is).
pub const KEPT_LOG_BYTES_MAX: u64 = 16 << 20;

/// Copies the last [`KEPT_LOG_BYTES_MAX`] bytes of `log` to `copy`.
fn copy_log_end(log: &Path, copy: &Path) -> anyhow::Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut source = std::fs::File::open(log).with_context(|| format!("opening {}", log.display()))?;
    let length = source.metadata()?.len();
    source.seek(SeekFrom::Start(length.saturating_sub(KEPT_LOG_BYTES_MAX)))?;
    let mut target = std::fs::File::create(copy).with_context(|| format!("creating {}", copy.display()))?;
    std::io::copy(&mut source, &mut target)?;
    Ok(())
}

fn tail_of(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        let _ = file.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// `sluice serve`, started fresh.
pub struct SluiceBroker;

impl SluiceBroker {
    /// Starts `bin serve --listen 127.0.0.1:PORT --data-dir DIR` and waits until it answers.
    pub fn start(bin: &Path) -> anyhow::Result<BrokerProcess> {
        Self::start_with_args(bin, &[])
    }

    /// As [`SluiceBroker::start`], with extra `serve` arguments.
    pub fn start_with_args(bin: &Path, extra: &[String]) -> anyhow::Result<BrokerProcess> {
        let ports = free_ports(1)?;
        Self::start_node(bin, ports[0], None, "sluice-bench-sluice", extra, None, None)
    }

    /// `nodes` `sluice serve` processes forming one cluster (controller quorum of all of
    /// them, as `sluice dev-cluster`), each with `extra`; one node is a plain broker.
    /// With `tls`, each node also has an SSL listener, which the clients use. With
    /// `memory`, each node runs in its own memory cgroup (see [`crate::memcap`]).
    pub fn start_cluster(
        bin: &Path,
        nodes: usize,
        extra: &[String],
        tls: Option<&crate::tls::BenchTls>,
        memory: Option<MemoryCap>,
    ) -> anyhow::Result<BrokerSet> {
        let memory = memory.map(|cap| cap.for_sluice());
        // Per node: client, TLS and controller ports, all distinct.
        let all_ports = free_ports(3 * nodes.max(1))?;
        let (ports, rest) = all_ports.split_at(nodes.max(1));
        let (tls_ports, controller_ports) = rest.split_at(nodes.max(1));
        let tls_port = |i: usize| tls.map(|_| tls_ports[i]);
        if nodes <= 1 {
            return Ok(Self::start_node(bin, ports[0], tls_port(0), "sluice-bench-sluice", extra, tls, memory)?.into());
        }
        let voters = (0..nodes).map(|i| format!("{}@127.0.0.1:{}", i + 1, controller_ports[i])).collect::<Vec<_>>();
        let voters = voters.join(",");
        let secret_file = cluster_secret_file()?;
        let mut started = Vec::with_capacity(nodes);
        for i in 0..nodes {
            let mut args = vec![
                format!("--node-id={}", i + 1),
                format!("--controller-listen=127.0.0.1:{}", controller_ports[i]),
                format!("--cluster-voters={voters}"),
                format!("--cluster-rpc-secret-file={}", secret_file.display()),
            ];
            args.extend(extra.iter().cloned());
            let prefix = format!("sluice-bench-sluice-node{}", i + 1);
            started.push(Self::spawn_node(bin, ports[i], tls_port(i), &prefix, &args, tls, memory)?);
        }
        // A node answers clients only once the quorum has registered it, so every node is
        // started before any is waited for (as Kafka's combined-mode nodes).
        for node in &mut started {
            node.wait_ready(None)?;
            println!("Started sluice (pid {}) on {}{}", node.pid(), node.bootstrap, cap_note(node));
        }
        let set = BrokerSet { nodes: started };
        set.wait_registered()?;
        Ok(set)
    }

    fn start_node(
        bin: &Path,
        port: u16,
        tls_port: Option<u16>,
        dir_prefix: &str,
        extra: &[String],
        tls: Option<&crate::tls::BenchTls>,
        memory: Option<BrokerMemoryLimit>,
    ) -> anyhow::Result<BrokerProcess> {
        let mut broker = Self::spawn_node(bin, port, tls_port, dir_prefix, extra, tls, memory)?;
        broker.wait_ready(None)?;
        println!("Started sluice (pid {}) on {}{}", broker.pid(), broker.bootstrap, cap_note(&broker));
        Ok(broker)
    }

    /// A `sluice serve` process, started, not yet waited for.
    fn spawn_node(
        bin: &Path,
        port: u16,
        tls_port: Option<u16>,
        dir_prefix: &str,
        extra: &[String],
        tls: Option<&crate::tls::BenchTls>,
        memory: Option<BrokerMemoryLimit>,
    ) -> anyhow::Result<BrokerProcess> {
        let dir = fresh_dir(dir_prefix)?;
        let data_dir = dir.join("data");
        std::fs::create_dir_all(&data_dir)?;
        let log_path = dir.join("sluice.log");
        let log = std::fs::File::create(&log_path)?;
        let listen = format!("127.0.0.1:{port}");
        let (listen_args, tls_bootstrap) = match tls {
            None => (vec!["--listen".to_string(), listen.clone()], None),
            Some(tls) => {
                let tls_port = tls_port.context("a TLS listener needs a port")?;
                let tls_listen = format!("127.0.0.1:{tls_port}");
                let args = vec![
                    "--override".to_string(),
                    format!("listeners=PLAINTEXT://{listen},SSL://{tls_listen}"),
                    "--override".to_string(),
                    format!("ssl.keystore.location={}", tls.server_pem.display()),
                ];
                (args, Some(tls_listen))
            }
        };
        let cgroup = memory.map(|limit| MemoryCgroup::create("sluice", limit)).transpose()?;
        let mut command = Command::new(bin);
        if let Some(cgroup) = &cgroup {
            cgroup.enter_on_spawn(&mut command);
        }
        // As Kafka's nodes here (`kafka_properties`): a new group's first rebalance does not
        // wait the 3 s default, which at a peak trial's rate left the consumers a backlog
        // to read from the disk before the measured phase began.
        let same_group_delay_as_kafka =
            (!extra.iter().any(|arg| arg.starts_with("--group-initial-rebalance-delay-ms")))
                .then_some(["--group-initial-rebalance-delay-ms", "0"])
                .into_iter()
                .flatten();
        let child = die_with_parent(&mut command)
            .arg("serve")
            .args(&listen_args)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(same_group_delay_as_kafka)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} serve", bin.display()))?;
        Ok(BrokerProcess {
            child: Some(child),
            name: "sluice",
            bootstrap: listen,
            tls_bootstrap,
            data_dir: dir,
            log_path,
            keep_data: false,
            log_copy: None,
            cgroup,
        })
    }
}

/// An Apache Kafka installation from Maven Central.
#[derive(Debug, Clone)]
pub struct KafkaInstall {
    /// Folder holding `lib/*.jar`.
    pub home: PathBuf,
    /// Kafka version.
    pub version: String,
}

/// The default cache folder: `$SLUICE_BENCH_CACHE`, else `$XDG_CACHE_HOME/sluice-bench`,
/// else `~/.cache/sluice-bench`.
pub fn cache_dir_default() -> PathBuf {
    if let Some(dir) = std::env::var_os("SLUICE_BENCH_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("sluice-bench");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("sluice-bench")
}

impl KafkaInstall {
    /// Installs Kafka `version` into `cache_dir/kafka-VERSION` unless already there.
    pub fn ensure(cache_dir: &Path, version: &str) -> anyhow::Result<KafkaInstall> {
        let home = cache_dir.join(format!("kafka-{version}"));
        let marker = home.join(".installed");
        let install = KafkaInstall { home: home.clone(), version: version.to_string() };
        if marker.is_file() {
            return Ok(install);
        }
        std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
        std::fs::write(home.join("pom.xml"), kafka_pom(version))?;
        println!("Installing Apache Kafka {version} from Maven Central into {}", home.display());
        let status = Command::new("mvn")
            .args([
                "-q",
                "-B",
                "--no-transfer-progress",
                "-Dstyle.color=never",
                "dependency:copy-dependencies",
                "-DoutputDirectory=lib",
                "-DincludeScope=runtime",
            ])
            .current_dir(&home)
            .status()
            .context("running mvn (is Maven installed?)")?;
        if !status.success() {
            bail!("mvn dependency:copy-dependencies failed ({status})");
        }
        let jars = std::fs::read_dir(home.join("lib"))?
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "jar"))
            .count();
        if jars < 10 {
            bail!("Kafka install has only {jars} jars");
        }
        std::fs::write(&marker, format!("{jars} jars\n"))?;
        println!("Installed {jars} jars");
        Ok(install)
    }

    fn classpath(&self) -> String {
        format!("{}/lib/*", self.home.display())
    }

    /// Starts a fresh single-node KRaft broker on loopback.
    pub fn start(&self, heap: &str) -> anyhow::Result<BrokerProcess> {
        let mut set = self.start_cluster(heap, 1, None, None)?;
        Ok(set.nodes.remove(0))
    }

    /// Starts `nodes` fresh KRaft nodes on loopback, each broker and controller (combined
    /// mode), all voters of one quorum.
    /// With `tls`, each node also has an SSL listener (PEM keystore), which clients use.
    /// With `memory`, each JVM runs in its own memory cgroup whose limit includes the heap,
    /// which is then pre-touched (see [`crate::memcap`]).
    pub fn start_cluster(
        &self,
        heap: &str,
        nodes: usize,
        tls: Option<&crate::tls::BenchTls>,
        memory: Option<MemoryCap>,
    ) -> anyhow::Result<BrokerSet> {
        let nodes = nodes.max(1);
        let memory = memory.map(|cap| cap.for_kafka(heap)).transpose()?;
        // Per node: client, TLS and controller ports, all distinct.
        let all_ports = free_ports(3 * nodes)?;
        let ports = all_ports[..nodes].to_vec();
        let tls_ports = tls.map(|_| all_ports[nodes..2 * nodes].to_vec());
        let controller_ports = all_ports[2 * nodes..].to_vec();
        let cluster_id = self.storage_tool(&["random-uuid"])?.trim().to_string();
        let mut dirs = Vec::with_capacity(nodes);
        for i in 0..nodes {
            let dir = fresh_dir("sluice-bench-kafka")?;
            let data_dir = dir.join("data");
            std::fs::create_dir_all(&data_dir)?;
            let properties = dir.join("server.properties");
            let mut text = kafka_properties(i + 1, &ports, &controller_ports, &data_dir);
            if let (Some(tls), Some(tls_ports)) = (tls, &tls_ports) {
                text = with_tls_listener(&text, ports[i], tls_ports[i], controller_ports[i], tls);
            }
            std::fs::write(&properties, text)?;
            std::fs::write(dir.join("log4j2.properties"), LOG4J2_PROPERTIES)?;
            self.storage_tool(&["format", "-t", &cluster_id, "-c", &properties.display().to_string()])?;
            dirs.push(dir);
        }
        let mut started = Vec::with_capacity(nodes);
        for (i, dir) in dirs.into_iter().enumerate() {
            let log_path = dir.join("kafka.log");
            let log = std::fs::File::create(&log_path)?;
            let cgroup = memory.map(|limit| MemoryCgroup::create("kafka", limit)).transpose()?;
            let mut command = Command::new("java");
            if let Some(cgroup) = &cgroup {
                cgroup.enter_on_spawn(&mut command);
                // The allowance counts the whole heap as resident: make it so from the start.
                command.arg("-XX:+AlwaysPreTouch");
            }
            let child = die_with_parent(&mut command)
                .arg(format!("-Xms{heap}"))
                .arg(format!("-Xmx{heap}"))
                .arg("-XX:+UseG1GC")
                .arg(format!("-Dlog4j2.configurationFile={}", dir.join("log4j2.properties").display()))
                .arg("-cp")
                .arg(self.classpath())
                .arg("kafka.Kafka")
                .arg(dir.join("server.properties"))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting java (is a JDK installed?)")?;
            started.push(BrokerProcess {
                child: Some(child),
                name: "kafka",
                bootstrap: format!("127.0.0.1:{}", ports[i]),
                tls_bootstrap: tls_ports.as_ref().map(|tls_ports| format!("127.0.0.1:{}", tls_ports[i])),
                data_dir: dir,
                log_path,
                keep_data: false,
                log_copy: None,
                cgroup,
            });
        }
        // A combined-mode node finishes starting only once its quorum has a leader, so
        // every node is started before any is waited for.
        for broker in &mut started {
            broker.wait_ready(Some("Kafka Server started"))?;
            println!(
                "Started Kafka {} (pid {}) on {}{}",
                self.version,
                broker.pid(),
                broker.bootstrap,
                cap_note(broker)
            );
        }
        let set = BrokerSet { nodes: started };
        set.wait_registered()?;
        Ok(set)
    }

    fn storage_tool(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = Command::new("java")
            .arg("-cp")
            .arg(self.classpath())
            .arg("kafka.tools.StorageTool")
            .args(args)
            .output()
            .context("running kafka.tools.StorageTool")?;
        if !output.status.success() {
            return Err(anyhow!("StorageTool {args:?} failed: {}", String::from_utf8_lossy(&output.stderr)));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

fn kafka_pom(version: &str) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by sluice bench: resolves Apache Kafka's runtime jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.sluice.bench</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{version}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{version}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{LOG4J_SLF4J_VERSION}</version></dependency>
  </dependencies>
</project>
"#
    )
}

/// One KRaft node (broker and controller) of a loopback quorum, with Kafka's defaults
/// otherwise (the durability the run asks for is in the driver's topic config:
/// `flush.messages=1` or nothing). Internal topics are replicated as far as the node
/// count allows.
///
/// Share groups (the queue workload): Kafka 4.3.1 needs no switch for them, as a cluster
/// formatted by its StorageTool gets the `share.version` feature at its latest production
/// level (1); the share coordinator's state topic (`__share_group_state`) only needs a
/// replication factor and min ISR the node count allows. The group config
/// `share.auto.offset.reset=earliest` is set per group by the bench (IncrementalAlterConfigs).
fn kafka_properties(node_id: usize, ports: &[u16], controller_ports: &[u16], data_dir: &Path) -> String {
    let voters: Vec<String> =
        controller_ports.iter().enumerate().map(|(i, port)| format!("{}@127.0.0.1:{port}", i + 1)).collect();
    let port = ports[node_id - 1];
    let controller_port = controller_ports[node_id - 1];
    let internal_rf = ports.len().min(3);
    let internal_min_isr = ports.len().min(2);
    format!(
        "process.roles=broker,controller\n\
         node.id={node_id}\n\
         controller.quorum.voters={}\n\
         listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}\n\
         advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
         controller.listener.names=CONTROLLER\n\
         inter.broker.listener.name=PLAINTEXT\n\
         log.dirs={}\n\
         offsets.topic.replication.factor={internal_rf}\n\
         transaction.state.log.replication.factor={internal_rf}\n\
         transaction.state.log.min.isr={internal_min_isr}\n\
         share.coordinator.state.topic.replication.factor={internal_rf}\n\
         share.coordinator.state.topic.min.isr={internal_min_isr}\n\
         group.initial.rebalance.delay.ms=0\n",
        voters.join(","),
        data_dir.display()
    )
}

/// Adds an SSL listener (PEM keystore) beside the PLAINTEXT one, which stays the
/// inter-broker listener.
fn with_tls_listener(
    properties: &str,
    port: u16,
    tls_port: u16,
    controller_port: u16,
    tls: &crate::tls::BenchTls,
) -> String {
    let listeners = format!("listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}");
    let advertised = format!("advertised.listeners=PLAINTEXT://127.0.0.1:{port}");
    properties
        .replace(
            &listeners,
            &format!(
                "listeners=PLAINTEXT://127.0.0.1:{port},SSL://127.0.0.1:{tls_port},CONTROLLER://127.0.0.1:{controller_port}"
            ),
        )
        .replace(&advertised, &format!("{advertised},SSL://127.0.0.1:{tls_port}"))
        + &format!(
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,CONTROLLER:PLAINTEXT\n\
             ssl.keystore.type=PEM\n\
             ssl.keystore.location={}\n",
            tls.server_pem.display()
        )
}

const LOG4J2_PROPERTIES: &str = "status = warn\n\
appender.out.type = Console\n\
appender.out.name = out\n\
appender.out.layout.type = PatternLayout\n\
appender.out.layout.pattern = [%d] %p %m (%c)%n\n\
rootLogger.level = info\n\
rootLogger.appenderRef.out.ref = out\n\
logger.kafka.name = kafka\n\
logger.kafka.level = info\n\
logger.apache.name = org.apache.kafka\n\
logger.apache.level = warn\n";

/// Drops the page cache (root only) so no broker reads what the previous one cached.
pub fn drop_caches() -> bool {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_of_runs_whose_process_is_gone_are_removed() {
        let parent = tempfile::tempdir().unwrap();
        // A process that ran and was reaped: its pid names no process now.
        let mut child = Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        let gone = child.id();
        let alive = std::process::id();
        let prefix = "sluice-bench-kafka";
        let abandoned = parent.path().join(format!("{prefix}-{gone}-123"));
        let running = parent.path().join(format!("{prefix}-{alive}-456"));
        let other_prefix = parent.path().join(format!("sluice-bench-sluice-{gone}-789"));
        let not_ours = parent.path().join(format!("{prefix}-{gone}-notes"));
        for dir in [&abandoned, &running, &other_prefix, &not_ours] {
            std::fs::create_dir_all(dir.join("data")).unwrap();
        }
        remove_abandoned_dirs(parent.path(), prefix);
        assert!(!abandoned.exists(), "the folder of a run whose process is gone");
        assert!(running.exists(), "a running process's folder is kept");
        assert!(other_prefix.exists(), "another prefix's folder is kept");
        assert!(not_ours.exists(), "a name not of the form prefix-pid-ns is kept");
    }
}
