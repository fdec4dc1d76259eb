//! Three controllers in one process, on real TCP (127.0.0.1) and real disk (tempdirs):
//! bootstrap, forwarded writes, leader failover, fencing and the election rules, restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_cluster::{ClusterMetadata, Controller, ControllerConfig, ControllerError, MetadataError, NO_LEADER};
use tempfile::TempDir;

/// The controller-RPC secret every node of a test cluster shares.
const TEST_RPC_SECRET: &[u8] = b"quorum-test-cluster-secret";
const HEARTBEAT_INTERVAL_MS: u64 = 100;
const SESSION_TIMEOUT_MS: u64 = 1_000;
/// Scheduling slack on a loaded 2-core machine running several clusters at once.
const SLACK: Duration = Duration::from_secs(4);
/// Small, so that the tests snapshot, purge and install snapshots on lagging nodes.
const SNAPSHOT_INTERVAL_ENTRIES: u64 = 20;
const READY: Duration = Duration::from_secs(20);

struct Cluster {
    /// `Some(interval)` turns on the automatic preferred leader election.
    auto_rebalance_ms: Option<u64>,
    /// The initial voters' addresses, as every node is configured.
    voters: BTreeMap<i32, String>,
    /// Every node's controller address, observers' included.
    addresses: BTreeMap<i32, String>,
    dirs: BTreeMap<i32, TempDir>,
    nodes: BTreeMap<i32, Arc<Controller>>,
}

/// `count` distinct free ports: all are held bound until every one is chosen, so none
/// is handed out twice.
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..count).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

/// Starts a stopped node again on its old port. The tests take ports from the ephemeral
/// range, so while the node was down another test's outgoing connection may have been
/// given its port for a moment (CI saw AddrInUse once): retry for `SLACK`, like an
/// operator would.
async fn restart_on_same_port(config: ControllerConfig) -> Arc<Controller> {
    let deadline = Instant::now() + SLACK;
    loop {
        match Controller::start(config.clone()).await {
            Err(ControllerError::Io(error))
                if error.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            started => return started.unwrap(),
        }
    }
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()))
        .try_init();
}

impl Cluster {
    async fn start(count: i32) -> Cluster {
        Cluster::start_with(count, None).await
    }

    async fn start_with(count: i32, auto_rebalance_ms: Option<u64>) -> Cluster {
        init_tracing();
        let ports = free_ports(count as usize);
        let voters: BTreeMap<i32, String> =
            (1..=count).zip(ports).map(|(id, port)| (id, format!("127.0.0.1:{port}"))).collect();
        let dirs = (1..=count).map(|id| (id, tempfile::tempdir().unwrap())).collect();
        let addresses = voters.clone();
        let mut cluster = Cluster { auto_rebalance_ms, voters, addresses, dirs, nodes: BTreeMap::new() };
        let starts: Vec<_> = (1..=count).map(|id| Controller::start(cluster.config(id))).collect();
        for (id, started) in (1..=count).zip(futures_join_all(starts).await) {
            cluster.nodes.insert(id, started.unwrap());
        }
        for node in cluster.nodes.values() {
            node.wait_ready(READY).await.unwrap();
        }
        cluster
    }

    fn config(&self, id: i32) -> ControllerConfig {
        let mut config = ControllerConfig::new(
            id,
            self.addresses[&id].parse().unwrap(),
            self.voters.clone(),
            self.dirs[&id].path().to_path_buf(),
            "127.0.0.1".to_string(),
            9000 + id as u16,
            TEST_RPC_SECRET.to_vec(),
        );
        config.heartbeat_interval_ms = HEARTBEAT_INTERVAL_MS;
        config.session_timeout_ms = SESSION_TIMEOUT_MS;
        config.election_timeout_min_ms = 300;
        config.election_timeout_max_ms = 600;
        config.auto_leader_rebalance_enable = self.auto_rebalance_ms.is_some();
        config.leader_rebalance_interval_ms = self.auto_rebalance_ms.unwrap_or(1);
        config.write_timeout_ms = 15_000;
        config.snapshot_interval_entries = SNAPSHOT_INTERVAL_ENTRIES;
        config
    }

    async fn restart(&mut self, id: i32) {
        let controller = restart_on_same_port(self.config(id)).await;
        controller.wait_ready(READY).await.unwrap();
        self.nodes.insert(id, controller);
    }

    /// Starts node `id`, not among the configured voters: it joins as an observer.
    async fn start_observer(&mut self, id: i32) {
        let port = free_ports(1)[0];
        self.addresses.insert(id, format!("127.0.0.1:{port}"));
        self.dirs.insert(id, tempfile::tempdir().unwrap());
        let controller = Controller::start(self.config(id)).await.unwrap();
        controller.wait_ready(READY).await.unwrap();
        self.nodes.insert(id, controller);
    }

    async fn stop(&mut self, id: i32) {
        self.nodes.remove(&id).unwrap().shutdown().await;
    }

    /// The leader all running nodes agree on.
    async fn leader(&self) -> i32 {
        wait_until("one agreed leader", READY, || {
            let seen: BTreeSet<Option<i32>> = self.nodes.values().map(|node| node.active_controller()).collect();
            seen.len() == 1 && seen.iter().next().unwrap().is_some_and(|leader| self.nodes.contains_key(&leader))
        })
        .await;
        self.nodes.values().next().unwrap().active_controller().unwrap()
    }

    async fn follower(&self) -> i32 {
        let leader = self.leader().await;
        *self.nodes.keys().find(|&&id| id != leader).unwrap()
    }

    fn metadata(&self, id: i32) -> Arc<ClusterMetadata> {
        self.nodes[&id].metadata().borrow().clone()
    }

    async fn shutdown(self) {
        for node in self.nodes.values() {
            node.shutdown().await;
        }
    }
}

async fn futures_join_all<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut outputs = Vec::new();
    for handle in handles {
        outputs.push(handle.await.unwrap());
    }
    outputs
}

async fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_create_topic_and_forward_writes() {
    let cluster = Cluster::start(3).await;
    let follower = cluster.follower().await;
    let node = &cluster.nodes[&follower];
    let topic = node.create_topic("orders", 6, 3, BTreeMap::new()).await.unwrap();
    // The write returned only once applied on the calling (follower) node.
    assert_eq!(cluster.metadata(follower).topics["orders"], topic);
    let mut leaders = BTreeMap::<i32, usize>::new();
    for partition in &topic.partitions {
        assert_eq!(partition.replicas.iter().collect::<BTreeSet<_>>().len(), 3);
        assert_eq!(
            (partition.leader, &partition.isr, partition.leader_epoch),
            (partition.replicas[0], &partition.replicas, 0)
        );
        *leaders.entry(partition.leader).or_default() += 1;
    }
    assert_eq!(leaders, BTreeMap::from([(1, 2), (2, 2), (3, 2)]), "leaders spread evenly");
    let brokers = &cluster.metadata(follower).brokers;
    assert_eq!(brokers.len(), 3);
    assert!(brokers.values().all(|broker| !broker.fenced && broker.host == "127.0.0.1"));

    assert!(matches!(
        node.create_topic("orders", 1, 1, BTreeMap::new()).await,
        Err(ControllerError::Refused(MetadataError::TopicAlreadyExists(_)))
    ));
    let error = node.create_topic("wide", 1, 4, BTreeMap::new()).await.unwrap_err();
    assert!(matches!(error, ControllerError::Refused(MetadataError::InvalidReplicationFactor(_))), "{error}");
    assert_eq!(error.kafka_error_code(), 38);
    assert!(matches!(node.delete_topic("nope").await, Err(ControllerError::Refused(MetadataError::UnknownTopic(_)))));

    // Producer-id blocks from different nodes never overlap.
    let mut firsts = Vec::new();
    for node in cluster.nodes.values() {
        firsts.push(node.allocate_producer_ids(1000).await.unwrap());
    }
    firsts.sort_unstable();
    assert!(firsts.windows(2).all(|pair| pair[1] - pair[0] >= 1000), "{firsts:?}");

    node.create_partitions("orders", 9, None).await.unwrap();
    let configs = BTreeMap::from([("retention.ms".to_string(), "1000".to_string())]);
    node.alter_topic_configs("orders", configs.clone(), None).await.unwrap();
    let orders = &cluster.metadata(follower).topics["orders"];
    assert_eq!((orders.partitions.len(), &orders.configs), (9, &configs));
    node.delete_topic("orders").await.unwrap();
    assert!(cluster.metadata(follower).topics.is_empty());
    // Every node converges on the same state.
    let version = cluster.metadata(follower).version;
    wait_until("replicas converge", SLACK, || cluster.nodes.keys().all(|&id| cluster.metadata(id).version >= version))
        .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_shutdown_elects_a_new_leader_and_moves_its_partitions() {
    let mut cluster = Cluster::start(3).await;
    let old_leader = cluster.leader().await;
    let follower = cluster.follower().await;
    let topic = cluster.nodes[&follower].create_topic("t", 3, 3, BTreeMap::new()).await.unwrap();
    cluster.stop(old_leader).await;
    let stopped = Instant::now();
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, old_leader);
    // Writes still work, from both survivors.
    for node in cluster.nodes.values() {
        node.allocate_producer_ids(10).await.unwrap();
    }
    // The survivors heard the dead node's heartbeats too, so the new leader fences it one
    // session after the last of them, not a session after its own election.
    let limit = Duration::from_millis(SESSION_TIMEOUT_MS) + SLACK;
    let remaining = limit.saturating_sub(stopped.elapsed());
    wait_until("old leader fenced", remaining, || cluster.metadata(new_leader).brokers[&old_leader].fenced).await;
    let metadata = cluster.metadata(new_leader);
    for (index, before) in topic.partitions.iter().enumerate() {
        let after = &metadata.topics["t"].partitions[index];
        assert!(!after.isr.contains(&old_leader));
        if before.leader == old_leader {
            assert_ne!(after.leader, NO_LEADER);
            assert!(before.isr.contains(&after.leader));
            assert_eq!(after.leader_epoch, before.leader_epoch + 1);
        } else {
            assert_eq!((after.leader, after.leader_epoch), (before.leader, before.leader_epoch));
        }
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_broker_is_fenced_and_its_partitions_get_new_leaders() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let silent = cluster.follower().await;
    let topic = cluster.nodes[&leader].create_topic("t", 6, 3, BTreeMap::new()).await.unwrap();
    cluster.nodes[&silent].set_heartbeats_paused(true);
    let elapsed = wait_until("silent broker fenced", Duration::from_millis(SESSION_TIMEOUT_MS) + SLACK, || {
        cluster.metadata(leader).brokers[&silent].fenced
    })
    .await;
    assert!(
        elapsed >= Duration::from_millis(SESSION_TIMEOUT_MS - HEARTBEAT_INTERVAL_MS),
        "fenced too early: {elapsed:?}"
    );
    let metadata = cluster.metadata(leader);
    for (index, before) in topic.partitions.iter().enumerate() {
        let after = &metadata.topics["t"].partitions[index];
        assert!(!after.isr.contains(&silent), "fenced broker left the isr");
        assert!(after.partition_epoch > before.partition_epoch);
        if before.leader == silent {
            // The next replica in preference order that is in sync.
            let expected = *before.replicas.iter().find(|&&replica| replica != silent).unwrap();
            assert_eq!((after.leader, after.leader_epoch), (expected, before.leader_epoch + 1));
        }
    }
    // Heartbeats resume: unfenced (it stays out of the ISRs until its leaders add it back).
    cluster.nodes[&silent].set_heartbeats_paused(false);
    wait_until("broker unfenced", SLACK, || !cluster.metadata(leader).brokers[&silent].fenced).await;
    assert_eq!(cluster.nodes[&leader].elect_preferred_leaders().await.unwrap(), 0, "not in sync, not preferred");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_isr_member_goes_leaderless_and_recovers_after_restart() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let victim = cluster.follower().await;
    // RF 1 over 3 brokers and 3 partitions: the victim leads exactly one, as its only replica.
    let topic = cluster.nodes[&leader].create_topic("single", 3, 1, BTreeMap::new()).await.unwrap();
    let index = topic.partitions.iter().position(|partition| partition.leader == victim).unwrap();
    cluster.stop(victim).await;
    let limit = Duration::from_millis(SESSION_TIMEOUT_MS) + SLACK;
    wait_until("victim fenced", limit, || cluster.metadata(leader).brokers[&victim].fenced).await;
    let partition = cluster.metadata(leader).topics["single"].partitions[index].clone();
    // It left the ISR for the eligible leader replicas: the partition's one candidate.
    let state = (partition.leader, partition.leader_epoch, partition.isr.as_slice(), partition.elr.as_slice());
    assert_eq!(state, (NO_LEADER, 1, &[][..], &[victim][..]));
    // A write while it is down, that it must catch up with after the restart.
    cluster.nodes[&leader].create_topic("later", 1, 2, BTreeMap::new()).await.unwrap();
    cluster.restart(victim).await;
    let restarted = cluster.nodes[&victim].clone();
    wait_until("victim leads again", SLACK, || {
        restarted.metadata().borrow().topics["single"].partitions[index].leader == victim
    })
    .await;
    let metadata = cluster.metadata(victim);
    assert!(metadata.topics.contains_key("later"), "restarted node caught up");
    assert_eq!(metadata.topics["single"].partitions[index].leader_epoch, 2);
    assert_eq!(metadata.brokers[&victim].incarnation, restarted.incarnation());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alter_partition_refuses_stale_epochs() {
    let cluster = Cluster::start(3).await;
    let topic = cluster.nodes[&1].create_topic("t", 3, 3, BTreeMap::new()).await.unwrap();
    let partition = &topic.partitions[0];
    let owner = &cluster.nodes[&partition.leader];
    let shrunk = owner
        .alter_partition("t", 0, partition.leader_epoch, partition.partition_epoch, vec![partition.leader])
        .await
        .unwrap();
    assert_eq!((shrunk.isr.clone(), shrunk.partition_epoch), (vec![partition.leader], partition.partition_epoch + 1));
    let stale =
        owner.alter_partition("t", 0, partition.leader_epoch, partition.partition_epoch, partition.isr.clone()).await;
    assert!(
        matches!(stale, Err(ControllerError::Refused(MetadataError::InvalidUpdateVersion { given: 0, current: 1 }))),
        "{stale:?}"
    );
    let stale =
        owner.alter_partition("t", 0, partition.leader_epoch - 1, shrunk.partition_epoch, partition.isr.clone()).await;
    assert!(matches!(stale, Err(ControllerError::Refused(MetadataError::StaleEpoch { .. }))), "{stale:?}");
    let other = cluster.nodes.keys().find(|&&id| id != partition.leader).unwrap();
    let refused = cluster.nodes[other].alter_partition("t", 0, 0, 1, partition.isr.clone()).await;
    assert!(matches!(refused, Err(ControllerError::Refused(MetadataError::NotLeader { .. }))), "{refused:?}");
    let grown = owner.alter_partition("t", 0, 0, shrunk.partition_epoch, partition.isr.clone()).await.unwrap();
    assert_eq!(grown.isr, partition.isr);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restart_keeps_the_metadata() {
    let mut cluster = Cluster::start(3).await;
    cluster.nodes[&2].create_topic("kept", 4, 2, BTreeMap::new()).await.unwrap();
    let first_block = cluster.nodes[&3].allocate_producer_ids(100).await.unwrap();
    let before = cluster.metadata(2).topics.clone();
    for id in 1..=3 {
        cluster.stop(id).await;
    }
    let restarts: Vec<_> = (1..=3).map(|id| restart_on_same_port(cluster.config(id))).collect();
    for (id, started) in (1..=3).zip(futures_join_all(restarts).await) {
        cluster.nodes.insert(id, started);
    }
    for node in cluster.nodes.values() {
        node.wait_ready(READY).await.unwrap();
    }
    for id in 1..=3 {
        assert_eq!(cluster.metadata(id).topics.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());
    }
    assert_eq!(cluster.metadata(1).topics["kept"].topic_id, before["kept"].topic_id);
    let next_block = cluster.nodes[&1].allocate_producer_ids(100).await.unwrap();
    assert!(next_block >= first_block + 100, "producer ids are never reused");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_node_catches_up_from_a_snapshot() {
    let mut cluster = Cluster::start(3).await;
    let lagging = cluster.follower().await;
    cluster.stop(lagging).await;
    let writer = cluster.leader().await;
    for _ in 0..3 * SNAPSHOT_INTERVAL_ENTRIES {
        cluster.nodes[&writer].allocate_producer_ids(1).await.unwrap();
    }
    cluster.nodes[&writer].create_topic("after", 2, 2, BTreeMap::new()).await.unwrap();
    let snapshot = cluster.dirs[&writer].path().join("controller/snapshot-v1.bin");
    wait_until("leader snapshot", SLACK, || snapshot.exists()).await;
    // The leader purged the entries the lagging node misses: it must install the snapshot.
    cluster.restart(lagging).await;
    let expected = cluster.metadata(writer).next_producer_id;
    wait_until("lagging node caught up", SLACK, || {
        let metadata = cluster.metadata(lagging);
        metadata.next_producer_id >= expected && metadata.topics.contains_key("after")
    })
    .await;
    assert!(cluster.dirs[&lagging].path().join("controller/snapshot-v1.bin").exists());
    // And a restart from its own snapshot plus log keeps it.
    cluster.stop(lagging).await;
    cluster.restart(lagging).await;
    assert!(cluster.metadata(lagging).next_producer_id >= expected);
    assert!(cluster.metadata(lagging).topics.contains_key("after"));
    cluster.shutdown().await;
}

/// Every partition leader of `topic` adds `node` back to its ISR (re-reading its metadata
/// while its view lags behind the latest fencing changes); returns how many partitions prefer
/// `node` as leader.
async fn rejoin_isrs(cluster: &Cluster, topic: &str, node: i32) -> usize {
    let count = cluster.metadata(node).topics[topic].partitions.len();
    let mut preferred_by_node = 0;
    for index in 0..count {
        let start = Instant::now();
        loop {
            let partition = cluster.metadata(node).topics[topic].partitions[index].clone();
            let mut isr = partition.isr.clone();
            isr.push(node);
            let owner = &cluster.nodes[&partition.leader];
            let result = owner
                .alter_partition(topic, index as i32, partition.leader_epoch, partition.partition_epoch, isr)
                .await;
            match result {
                Ok(_) => {
                    preferred_by_node += usize::from(partition.replicas[0] == node);
                    break;
                }
                Err(error) => assert!(start.elapsed() < SLACK, "alter partition keeps failing: {error}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    preferred_by_node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_preferred_election_restores_leaders() {
    let cluster = Cluster::start_with(3, Some(300)).await;
    let leader = cluster.leader().await;
    let silent = cluster.follower().await;
    cluster.nodes[&leader].create_topic("t", 6, 3, BTreeMap::new()).await.unwrap();
    cluster.nodes[&silent].set_heartbeats_paused(true);
    let limit = Duration::from_millis(SESSION_TIMEOUT_MS) + SLACK;
    wait_until("silent broker fenced", limit, || cluster.metadata(leader).brokers[&silent].fenced).await;
    cluster.nodes[&silent].set_heartbeats_paused(false);
    wait_until("broker unfenced", SLACK, || !cluster.metadata(silent).brokers[&silent].fenced).await;
    assert_eq!(rejoin_isrs(&cluster, "t", silent).await, 2);
    wait_until("preferred leaders restored", SLACK, || {
        let metadata = cluster.metadata(leader);
        metadata.topics["t"].partitions.iter().all(|partition| partition.leader == partition.replicas[0])
    })
    .await;
    cluster.shutdown().await;
}

/// The voter and observer ids of a quorum description.
fn quorum_ids(quorum: &sluice_cluster::QuorumDescription) -> (Vec<i32>, Vec<i32>) {
    let ids = |replicas: &[sluice_cluster::QuorumReplica]| replicas.iter().map(|replica| replica.node_id).collect();
    (ids(&quorum.voters), ids(&quorum.observers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_becomes_a_voter_and_a_voter_leaves_while_writes_go_on() {
    use sluice_cluster::{VoterChange, VoterChangeError};
    let mut cluster = Cluster::start(3).await;
    cluster.start_observer(4).await;
    let observer = cluster.nodes[&4].clone();
    let quorum = observer.describe_quorum().await.unwrap();
    assert_eq!(quorum_ids(&quorum), (vec![1, 2, 3], vec![4]));
    assert!(quorum.observers[0].log_end_offset > 0, "the observer receives the log: {quorum:?}");
    assert_eq!(quorum.observers[0].directory_id, observer.directory_id());
    // The observer is a broker: its writes are forwarded and applied on it.
    observer.create_topic("before", 1, 3, BTreeMap::new()).await.unwrap();

    let wrong_directory = VoterChange::Add { node_id: 4, directory_id: uuid::Uuid::from_u128(1) };
    assert!(matches!(
        observer.change_voters(wrong_directory).await.unwrap(),
        Err(VoterChangeError::DirectoryMismatch { .. })
    ));
    let add = VoterChange::Add { node_id: 4, directory_id: observer.directory_id() };
    observer.change_voters(add.clone()).await.unwrap().unwrap();
    assert_eq!(observer.change_voters(add).await.unwrap(), Err(VoterChangeError::DuplicateVoter(4)));
    assert_eq!(quorum_ids(&observer.describe_quorum().await.unwrap()), (vec![1, 2, 3, 4], vec![]));

    // The leader leaves the voters; the others elect a new one and it stays an observer.
    let leader = cluster.leader().await;
    let remove = VoterChange::Remove { node_id: leader, directory_id: uuid::Uuid::nil() };
    cluster.nodes[&4].change_voters(remove).await.unwrap().unwrap();
    // It steps down once the new voter set is applied, and the others elect a leader.
    let deadline = Instant::now() + READY;
    let quorum = loop {
        let quorum = observer.describe_quorum().await.unwrap();
        if (quorum.leader_id != leader && !quorum.observers.is_empty()) || Instant::now() > deadline {
            break quorum;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_ne!(quorum.leader_id, leader, "the removed voter no longer leads");
    let voters: Vec<i32> = [1, 2, 3, 4].into_iter().filter(|&id| id != leader).collect();
    assert_eq!(quorum_ids(&quorum), (voters, vec![leader]));
    cluster.nodes[&leader].create_topic("after", 1, 3, BTreeMap::new()).await.unwrap();

    // The new voter set is in the log: node 4 votes after a restart though not configured as a voter.
    cluster.stop(4).await;
    cluster.restart(4).await;
    let quorum = cluster.nodes[&4].describe_quorum().await.unwrap();
    assert!(quorum_ids(&quorum).0.contains(&4), "{quorum:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_accepts_its_newest_commands_as_soon_as_it_is_ready() {
    // A brand-new cluster finalizes its metadata.version once every member registered,
    // moments after it is ready: a command that needs the newest version, sent at once,
    // waits for that instead of being refused as if a node ran an older binary.
    let cluster = Cluster::start(3).await;
    let node = &cluster.nodes[&cluster.follower().await];
    let puts = BTreeMap::from([("queue//first".to_string(), "{}".to_string())]);
    node.alter_amqp_state(None, puts, Vec::new()).await.unwrap();
    assert_eq!(node.metadata().borrow().metadata_version(), sluice_cluster::METADATA_VERSION_LATEST);
    cluster.shutdown().await;
}
