//! `sluice cluster quorum`: the controller quorum (DescribeQuorum, as
//! `kafka-metadata-quorum.sh describe --replication` shows it): the active controller, its
//! epoch and high watermark, and each voter's and observer's progress through the log.

use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
use kafka_protocol::messages::describe_quorum_response::ReplicaState;
use kafka_protocol::messages::{DescribeQuorumRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;
use sluice_client::check;

use crate::kafka_connection::Cluster;
use crate::output::{Format, TextTable};

/// DescribeQuorum v2 (directory ids and voter endpoints).
const DESCRIBE_QUORUM_VERSION: i16 = 2;
/// The name Kafka gives the controller quorum's log.
const METADATA_TOPIC: &str = "__cluster_metadata";

#[derive(Serialize)]
struct ReplicaView {
    node: i32,
    role: &'static str,
    directory_id: String,
    log_end_offset: i64,
    lag: i64,
    last_fetch_ms_ago: Option<i64>,
    last_caught_up_ms_ago: Option<i64>,
}

#[derive(Serialize)]
struct QuorumView {
    leader: i32,
    leader_epoch: i32,
    high_watermark: i64,
    replicas: Vec<ReplicaView>,
}

pub(crate) fn quorum(cluster: &mut Cluster, format: Format) -> anyhow::Result<()> {
    let view = describe(cluster)?;
    if format.document(&view)? {
        return Ok(());
    }
    println!("leader {}, epoch {}, high watermark {}", view.leader, view.leader_epoch, view.high_watermark);
    let mut table = TextTable::new(&["NODE", "ROLE", "DIRECTORY-ID", "LOG-END", "LAG", "LAST-FETCH", "CAUGHT-UP"])
        .numeric(&["NODE", "LOG-END", "LAG"]);
    let ago = |ms: Option<i64>| ms.map_or("-".to_string(), |ms| format!("{ms} ms ago"));
    for replica in &view.replicas {
        table.row([
            replica.node.to_string(),
            replica.role.to_string(),
            replica.directory_id.clone(),
            replica.log_end_offset.to_string(),
            replica.lag.to_string(),
            ago(replica.last_fetch_ms_ago),
            ago(replica.last_caught_up_ms_ago),
        ]);
    }
    table.print();
    Ok(())
}

fn describe(cluster: &mut Cluster) -> anyhow::Result<QuorumView> {
    let partition = PartitionData::default().with_partition_index(0);
    let topic = TopicData::default()
        .with_topic_name(TopicName(StrBytes::from_static_str(METADATA_TOPIC)))
        .with_partitions(vec![partition]);
    let request = DescribeQuorumRequest::default().with_topics(vec![topic]);
    let response = cluster.bootstrap.send(DESCRIBE_QUORUM_VERSION, request)?;
    check(response.error_code, response.error_message.as_ref().map(|m| m.as_str()), "the controller quorum")?;
    let partition = response
        .topics
        .first()
        .and_then(|topic| topic.partitions.first())
        .ok_or_else(|| anyhow::anyhow!("the broker described no quorum"))?;
    check(partition.error_code, partition.error_message.as_ref().map(|m| m.as_str()), "the controller quorum")?;
    let leader = partition.leader_id.0;
    let leader_end = partition.current_voters.iter().find(|v| v.replica_id.0 == leader).map_or(0, |v| v.log_end_offset);
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    let view = |replica: &ReplicaState, role: &'static str| ReplicaView {
        node: replica.replica_id.0,
        role: if replica.replica_id.0 == leader { "leader" } else { role },
        directory_id: sluice_meta::meta_properties::kafka_uuid(replica.replica_directory_id),
        log_end_offset: replica.log_end_offset,
        lag: (leader_end - replica.log_end_offset).max(0),
        last_fetch_ms_ago: (replica.last_fetch_timestamp >= 0).then(|| now_ms - replica.last_fetch_timestamp),
        last_caught_up_ms_ago: (replica.last_caught_up_timestamp >= 0)
            .then(|| now_ms - replica.last_caught_up_timestamp),
    };
    let voters = partition.current_voters.iter().map(|replica| view(replica, "voter"));
    let observers = partition.observers.iter().map(|replica| view(replica, "observer"));
    Ok(QuorumView {
        leader,
        leader_epoch: partition.leader_epoch,
        high_watermark: partition.high_watermark,
        replicas: voters.chain(observers).collect(),
    })
}
