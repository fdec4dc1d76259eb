//! `sluice dev-cluster`: N cluster nodes as separate `sluice serve` processes on
//! 127.0.0.1, for development and tests. Node i (1-based) serves Kafka on
//! `base_port + i - 1` and its controller on `base_port + CONTROLLER_PORT_OFFSET + i - 1`,
//! with data in `<data_dir>/node-<i>`.
//!
//! Start-up fails fast: if a node exits before its Kafka port accepts connections (a port in
//! use, a bad flag), the others are stopped and dev-cluster exits with an error. Once every
//! node answers Kafka requests (each does only once registered and unfenced) it prints
//! `ready <bootstrap list>`: scripts wait for that line. The nodes log to dev-cluster's
//! stderr, never to its stdout. Once all are up, a node that dies is reported and left dead
//! (the others go on: this is a tool for trying failures). Ctrl-C or SIGTERM stops them all
//! cleanly, and the nodes never outlive dev-cluster: each asks the kernel for SIGTERM when
//! its parent dies (`PR_SET_PDEATHSIG`), so even a SIGKILLed dev-cluster leaves no node
//! behind.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};

/// Controller ports sit this far above the Kafka ports.
pub const CONTROLLER_PORT_OFFSET: u16 = 100;
pub const DEV_CLUSTER_NODES_MAX: u16 = 9;
/// How long nodes get to shut down cleanly before they are killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long every node gets to accept Kafka connections before start-up counts as failed.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the nodes get to become ready (register, be unfenced) before dev-cluster says
/// which are not.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one readiness probe waits for a node's answer.
const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between two probes of a node that did not answer.
const READY_PROBE_INTERVAL: Duration = Duration::from_millis(50);

#[derive(Debug, clap::Args)]
pub struct DevClusterArgs {
    /// Number of nodes (all of them controller voters).
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// Kafka port of node 1; node i listens on base-port + i - 1.
    #[arg(long, default_value_t = 9092)]
    base_port: u16,
    /// Console port of node 1 (node i serves its web console on console-port + i - 1);
    /// 0: no console.
    #[arg(long, default_value_t = 8080)]
    console_port: u16,
    /// Parent of the nodes' data dirs.
    #[arg(long, default_value = "./sluice-dev-cluster")]
    data_dir: PathBuf,
    /// Extra arguments passed to every `sluice serve` (after `--`).
    #[arg(last = true)]
    serve_args: Vec<String>,
}

pub fn run(args: DevClusterArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=DEV_CLUSTER_NODES_MAX).contains(&args.nodes),
        "--nodes must be in 1..={DEV_CLUSTER_NODES_MAX}"
    );
    let last_port = u32::from(args.base_port) + u32::from(CONTROLLER_PORT_OFFSET) + u32::from(args.nodes);
    anyhow::ensure!(last_port <= u32::from(u16::MAX), "--base-port too high for {} nodes", args.nodes);
    let last_console_port = u32::from(args.console_port) + u32::from(args.nodes);
    anyhow::ensure!(last_console_port <= u32::from(u16::MAX), "--console-port too high for {} nodes", args.nodes);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(run_nodes(args))
}

async fn run_nodes(args: DevClusterArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locating the sluice binary")?;
    let ids: Vec<u16> = (1..=args.nodes).collect();
    let kafka_port = |id: u16| args.base_port + id - 1;
    let controller_port = |id: u16| args.base_port + CONTROLLER_PORT_OFFSET + id - 1;
    let console_port = |id: u16| (args.console_port > 0).then(|| args.console_port + id - 1);
    let voters: Vec<String> = ids.iter().map(|&id| format!("{id}@127.0.0.1:{}", controller_port(id))).collect();
    let voters = voters.join(",");
    // A port taken by another process would let a node fail after its data dir is open,
    // or make another program look like our node: refuse before starting anything.
    for &id in &ids {
        for port in [Some(kafka_port(id)), Some(controller_port(id)), console_port(id)].into_iter().flatten() {
            std::net::TcpListener::bind(("127.0.0.1", port))
                .with_context(|| format!("port {port} (node {id}) is not free; pick another --base-port"))?;
        }
    }
    let secret_file = cluster_secret_file(&args.data_dir)?;
    let mut children: Vec<(u16, Option<Child>)> = Vec::new();
    for &id in &ids {
        let data_dir = args.data_dir.join(format!("node-{id}"));
        std::fs::create_dir_all(&data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
        let mut command = Command::new(&exe);
        let parent = std::process::id();
        // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before the prctl: then nobody would signal us.
                if libc::getppid() as u32 != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = command
            .arg("serve")
            .args(["--node-id", &id.to_string()])
            .args(["--listen", &format!("127.0.0.1:{}", kafka_port(id))])
            .args(["--controller-listen", &format!("127.0.0.1:{}", controller_port(id))])
            .args(["--cluster-voters", &voters])
            .arg("--cluster-rpc-secret-file")
            .arg(&secret_file)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(console_port(id).map(|port| format!("--console-listen=127.0.0.1:{port}")))
            .args(&args.serve_args)
            .stdin(Stdio::null())
            // dev-cluster's stdout carries only its own lines, which scripts read up to
            // `ready` and then may stop reading: a node logging into that pipe would block
            // on it once it is full, and stop serving.
            .stdout(std::io::stderr())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting node {id}"))?;
        children.push((id, Some(child)));
    }
    if let Err(error) = wait_until_listening(&mut children, &kafka_port).await {
        stop_all(&mut children).await?;
        return Err(error);
    }
    let bootstrap: Vec<String> = ids.iter().map(|&id| format!("127.0.0.1:{}", kafka_port(id))).collect();
    println!("bootstrap: {}", bootstrap.join(","));
    for &id in &ids {
        let console = console_port(id).map(|port| format!(" console http://127.0.0.1:{port}/")).unwrap_or_default();
        println!(
            "node {id}: pid {} kafka 127.0.0.1:{} controller 127.0.0.1:{}{console}",
            pid_of(&children, id),
            kafka_port(id),
            controller_port(id)
        );
    }
    let ready = tokio::spawn(announce_ready(bootstrap));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            () = tokio::time::sleep(Duration::from_millis(200)) => {
                for (id, slot) in children.iter_mut() {
                    if let Some(child) = slot {
                        if let Some(status) = child.try_wait()? {
                            eprintln!("node {id} exited: {status}; the others keep running");
                            *slot = None;
                        }
                    }
                }
            }
        }
    }
    ready.abort();
    stop_all(&mut children).await
}

/// Prints `ready <bootstrap list>` once every node answers a Kafka request: a node serves
/// clients only once it is registered and unfenced (`Broker::not_ready`), so from then on a
/// topic can be placed on every node. After [`READY_TIMEOUT`] it says which nodes do not
/// answer yet instead (and the nodes keep running).
async fn announce_ready(bootstrap: Vec<String>) {
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    let mut waiting = bootstrap.clone();
    while !waiting.is_empty() {
        let address = waiting[0].clone();
        let answered = tokio::task::spawn_blocking(move || answers_api_versions(&address)).await.unwrap_or(false);
        if answered {
            waiting.remove(0);
            continue;
        }
        if tokio::time::Instant::now() >= deadline {
            eprintln!("not ready after {READY_TIMEOUT:?}: no answer yet from {}", waiting.join(", "));
            return;
        }
        tokio::time::sleep(READY_PROBE_INTERVAL).await;
    }
    println!("ready {}", bootstrap.join(","));
}

/// True when the broker at `address` answers ApiVersions within [`READY_PROBE_TIMEOUT`].
fn answers_api_versions(address: &str) -> bool {
    use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, RequestKind, ResponseKind};
    let Ok(mut connector) = sluice_client::Connector::new(&sluice_client::Settings::default()) else { return false };
    connector.limit_timeouts(READY_PROBE_TIMEOUT);
    let request = RequestKind::ApiVersions(ApiVersionsRequest::default());
    matches!(connector.call(address, ApiKey::ApiVersions, 0, request), Ok(ResponseKind::ApiVersions(r)) if r.error_code == 0)
}

/// Waits until every node accepts connections on its Kafka port; fails as soon as one exits.
async fn wait_until_listening(
    children: &mut [(u16, Option<Child>)],
    kafka_port: &impl Fn(u16) -> u16,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    for (id, slot) in children.iter_mut() {
        let child = slot.as_mut().expect("every node was started");
        loop {
            if let Some(status) = child.try_wait()? {
                *slot = None;
                anyhow::bail!("node {id} exited during start-up ({status}); stopping the others");
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", kafka_port(*id))).await.is_ok() {
                break;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "node {id} did not listen on port {} within {START_TIMEOUT:?}",
                kafka_port(*id)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// SIGTERM to every live node, then waits for each (killing those that take too long).
async fn stop_all(children: &mut [(u16, Option<Child>)]) -> anyhow::Result<()> {
    eprintln!("stopping {} nodes", children.iter().filter(|(_, c)| c.is_some()).count());
    for (_, child) in children.iter().filter_map(|(id, c)| c.as_ref().map(|c| (id, c))) {
        if let Some(pid) = child.id() {
            // SAFETY: kill(2) on a child pid we own.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
    for (id, slot) in children.iter_mut() {
        if let Some(child) = slot {
            match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
                Ok(status) => eprintln!("node {id} stopped: {}", status?),
                Err(_) => {
                    eprintln!("node {id} did not stop in {STOP_TIMEOUT:?}; killing it");
                    child.kill().await?;
                }
            }
        }
    }
    Ok(())
}

fn pid_of(children: &[(u16, Option<Child>)], id: u16) -> u32 {
    children.iter().find(|(i, _)| *i == id).and_then(|(_, c)| c.as_ref()?.id()).unwrap_or(0)
}

/// The secret the nodes authenticate their controller RPCs with: `<data_dir>/cluster.secret`,
/// made (readable by its owner only; written new, fsynced, renamed) on the first start and
/// kept with the nodes' data.
fn cluster_secret_file(data_dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join("cluster.secret");
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    let tmp = data_dir.join("cluster.secret.tmp");
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    let secret: [u8; 32] = rand::random();
    let hex: String = secret.iter().map(|byte| format!("{byte:02x}")).collect();
    file.write_all(hex.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    Ok(path)
}
