//! Three controllers as separate OS processes (`sluice-controller-test-node`), killed with
//! SIGKILL and restarted from their data directories: what survives a crash is what was
//! fsynced before it was acknowledged.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use sluice_cluster::ClusterMetadata;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const NODE_BIN: &str = env!("CARGO_BIN_EXE_sluice-controller-test-node");
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

struct Node {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Node {
    fn spawn(id: i32, voters: &str, dir: &Path) -> Node {
        let mut child = Command::new(NODE_BIN)
            .args([id.to_string(), voters.to_string(), dir.display().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Node { child, stdin, stdout }
    }

    async fn line(&mut self) -> String {
        let line = tokio::time::timeout(ANSWER_TIMEOUT, self.stdout.next_line()).await.expect("node answers in time");
        line.unwrap().expect("node exited")
    }

    async fn ready(&mut self) {
        assert_eq!(self.line().await, "READY");
    }

    async fn ask(&mut self, command: &str) -> String {
        self.stdin.write_all(format!("{command}\n").as_bytes()).await.unwrap();
        self.line().await
    }

    async fn metadata(&mut self) -> ClusterMetadata {
        let answer = self.ask("metadata").await;
        serde_json::from_str(answer.strip_prefix("METADATA ").unwrap()).unwrap()
    }

    async fn leader(&mut self) -> i32 {
        let answer = self.ask("leader").await;
        answer.strip_prefix("LEADER ").unwrap().parse().unwrap()
    }

    /// SIGKILL: no shutdown, no flush beyond what was already fsynced.
    async fn kill9(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }
}

async fn spawn_all(voters: &str, dirs: &BTreeMap<i32, tempfile::TempDir>) -> BTreeMap<i32, Node> {
    let mut nodes: BTreeMap<i32, Node> =
        dirs.iter().map(|(&id, dir)| (id, Node::spawn(id, voters, dir.path()))).collect();
    for node in nodes.values_mut() {
        node.ready().await;
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_processes_come_back_with_their_log() {
    // All three held bound until each is chosen, so no port is handed out twice.
    let listeners: Vec<_> = (0..3).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let voters = (1..=3)
        .zip(&listeners)
        .map(|(id, listener)| format!("{id}=127.0.0.1:{}", listener.local_addr().unwrap().port()))
        .collect::<Vec<_>>()
        .join(",");
    drop(listeners);
    let dirs: BTreeMap<i32, tempfile::TempDir> = (1..=3).map(|id| (id, tempfile::tempdir().unwrap())).collect();
    let mut nodes = spawn_all(&voters, &dirs).await;
    assert_eq!(nodes.get_mut(&2).unwrap().ask("create a 3 3").await, "OK");

    // kill -9 the active controller: the others elect a leader, fence its broker, take writes.
    let leader = nodes.get_mut(&1).unwrap().leader().await;
    assert!(leader > 0);
    nodes.remove(&leader).unwrap().kill9().await;
    let survivor = *nodes.keys().next().unwrap();
    let start = Instant::now();
    loop {
        let metadata = nodes.get_mut(&survivor).unwrap().metadata().await;
        if metadata.brokers[&leader].fenced {
            let partitions = &metadata.topics["a"].partitions;
            assert!(partitions.iter().all(|partition| partition.leader != leader && partition.leader >= 0));
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "killed leader never fenced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(nodes.get_mut(&survivor).unwrap().ask("create b 2 2").await, "OK");

    // It restarts from its data dir, catches up and is unfenced.
    let mut restarted = Node::spawn(leader, &voters, dirs[&leader].path());
    restarted.ready().await;
    let metadata = restarted.metadata().await;
    assert!(metadata.topics.contains_key("a") && metadata.topics.contains_key("b"));
    assert!(!metadata.brokers[&leader].fenced);
    nodes.insert(leader, restarted);

    // kill -9 everyone at once; every node comes back with the committed metadata.
    for (_, node) in std::mem::take(&mut nodes) {
        node.kill9().await;
    }
    let mut nodes = spawn_all(&voters, &dirs).await;
    for node in nodes.values_mut() {
        let metadata = node.metadata().await;
        assert!(metadata.topics.contains_key("a") && metadata.topics.contains_key("b"), "{metadata:?}");
    }
    for (_, node) in nodes {
        node.kill9().await;
    }
}
