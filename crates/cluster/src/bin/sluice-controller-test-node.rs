//! One controller in its own process, driven over stdin/stdout by the multi-process test
//! (`tests/processes.rs`), so that it can be `kill -9`ed. Not a product binary.
//!
//! Usage: `sluice-controller-test-node NODE_ID VOTERS DATA_DIR` where VOTERS is
//! `1=127.0.0.1:7001,2=127.0.0.1:7002,...`. Prints `READY` once registered, then answers one
//! line per command line: `create NAME PARTITIONS RF` -> `OK` | `ERR message`;
//! `metadata` -> `METADATA {json}`; `leader` -> `LEADER id` (-1 when none).

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_cluster::{Controller, ControllerConfig};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The controller-RPC secret every node this binary starts shares (a test binary).
const TEST_RPC_SECRET: &[u8] = b"processes-test-cluster-secret";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert_eq!(args.len(), 4, "usage: NODE_ID VOTERS DATA_DIR");
    let node_id: i32 = args[1].parse().expect("node id");
    let voters: BTreeMap<i32, String> = args[2]
        .split(',')
        .map(|pair| {
            let (id, address) = pair.split_once('=').expect("id=host:port");
            (id.parse().expect("voter id"), address.to_string())
        })
        .collect();
    let listen = voters[&node_id].parse().expect("listen address");
    let kafka_port = 9000 + u16::try_from(node_id).expect("small node id");
    let secret = TEST_RPC_SECRET.to_vec();
    let mut config =
        ControllerConfig::new(node_id, listen, voters, args[3].clone().into(), "127.0.0.1".into(), kafka_port, secret);
    config.heartbeat_interval_ms = 100;
    config.session_timeout_ms = 1_000;
    config.auto_leader_rebalance_enable = false;
    let controller = Controller::start(config).await.expect("controller start");
    controller.wait_ready(Duration::from_secs(30)).await.expect("controller ready");
    let mut stdout = tokio::io::stdout();
    stdout.write_all(b"READY\n").await.expect("stdout");
    stdout.flush().await.expect("stdout");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await.expect("stdin") {
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["create", name, partitions, factor] => {
                let created = controller
                    .create_topic(
                        name,
                        partitions.parse().expect("partitions"),
                        factor.parse().expect("rf"),
                        BTreeMap::new(),
                    )
                    .await;
                match created {
                    Ok(_) => "OK".to_string(),
                    Err(error) => format!("ERR {error}"),
                }
            }
            ["metadata"] => {
                let metadata = controller.metadata().borrow().clone();
                format!("METADATA {}", serde_json::to_string(&*metadata).expect("json"))
            }
            ["leader"] => format!("LEADER {}", controller.active_controller().unwrap_or(-1)),
            _ => format!("ERR unknown command {line:?}"),
        };
        stdout.write_all(format!("{answer}\n").as_bytes()).await.expect("stdout");
        stdout.flush().await.expect("stdout");
    }
    controller.shutdown().await;
}
