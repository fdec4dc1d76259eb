//! The APIs and versions Sluice advertises. Only what works end to end is listed.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

/// Produce v0-v2 are advertised (librdkafka only compresses when it sees Produce v0, and
/// Kafka does the same) but refused: the connection is closed, as Kafka does.
pub const PRODUCE_MIN_ACCEPTED_VERSION: i16 = 3;

/// (api, min version, max version) advertised in ApiVersions.
pub const ADVERTISED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 0, 11),
    (ApiKey::Fetch, 4, 16),
    (ApiKey::ListOffsets, 1, 9),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DescribeCluster, 0, 2),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    // The controller quorum (KIP-853), forwarded to the active controller.
    (ApiKey::DescribeQuorum, 0, 2),
    (ApiKey::AddRaftVoter, 0, 0),
    (ApiKey::RemoveRaftVoter, 0, 0),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    // Share groups (KIP-932): v1 is the first GA version (4.1+ clients).
    (ApiKey::ShareGroupHeartbeat, 1, 1),
    (ApiKey::ShareGroupDescribe, 1, 1),
    // v2 (KIP-1206 acquire modes, KIP-1222 RENEW) is converted to the codec's v1 in
    // `share_wire.rs`.
    (ApiKey::ShareFetch, 1, 2),
    (ApiKey::ShareAcknowledge, 1, 2),
    (ApiKey::DescribeShareGroupOffsets, 0, 1),
    (ApiKey::AlterShareGroupOffsets, 0, 0),
    (ApiKey::DeleteShareGroupOffsets, 0, 0),
    // SaslHandshake v0 (raw SASL tokens after the handshake) is not served.
    (ApiKey::SaslHandshake, 1, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    // Transactions as clients drive them before KIP-890's transaction.version 2 (which
    // Sluice does not advertise): AddPartitionsToTxn v4+ is broker-to-broker only.
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::EndTxn, 0, 4),
    (ApiKey::ListTransactions, 0, 1),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::DescribeProducers, 0, 0),
    // Broker to broker (and `kafka-transactions.sh abort`); needs CLUSTER_ACTION.
    (ApiKey::WriteTxnMarkers, 1, 1),
    // Broker to broker: the share-partition state store (`__share_group_state`).
    (ApiKey::ReadShareGroupState, 0, 0),
    (ApiKey::WriteShareGroupState, 0, 0),
    (ApiKey::ReadShareGroupStateSummary, 0, 0),
    (ApiKey::InitializeShareGroupState, 0, 0),
    (ApiKey::DeleteShareGroupState, 0, 0),
    // Broker to broker: a client's request forwarded with its principal (the AMQP front
    // door of a node serving a queue another node leads); needs CLUSTER_ACTION.
    (ApiKey::Envelope, 0, 0),
];

/// The advertised (min, max) for `api_key`, if we serve it at all. Produce v0-v2 are
/// advertised but not in this range.
pub fn supported_range(api_key: ApiKey) -> Option<(i16, i16)> {
    ADVERTISED_APIS.iter().find(|(key, _, _)| *key == api_key).map(|(key, min, max)| {
        let min = if *key == ApiKey::Produce { PRODUCE_MIN_ACCEPTED_VERSION } else { *min };
        (min, *max)
    })
}

/// The ApiVersions response body listing [`ADVERTISED_APIS`].
pub fn api_versions_response(error_code: i16) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.error_code = error_code;
    response.api_keys = ADVERTISED_APIS
        .iter()
        .map(|(key, min, max)| {
            let mut version = ApiVersion::default();
            version.api_key = *key as i16;
            version.min_version = *min;
            version.max_version = *max;
            version
        })
        .collect();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of [`ADVERTISED_APIS`] that `docs/kafka-apis.md` shows (Markdown), so the page
    /// cannot drift from what ApiVersions says: a test compares the two.
    fn advertised_apis_markdown() -> String {
        let mut table = String::from("| API | key | versions |\n|---|---|---|\n");
        for (key, min, max) in ADVERTISED_APIS {
            let versions = match (*key, supported_range(*key)) {
                (ApiKey::Produce, Some((accepted, _))) => {
                    format!("{accepted}-{max} ({min}-{} advertised, refused as Kafka does)", accepted - 1)
                }
                _ if min == max => min.to_string(),
                _ => format!("{min}-{max}"),
            };
            table.push_str(&format!("| {key:?} | {} | {versions} |\n", *key as i16));
        }
        table
    }

    /// Where the generated table sits in the page.
    const DOCS_PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/kafka-apis.md");
    const TABLE_START: &str = "<!-- advertised-apis: generated from crates/protocol/src/versions.rs -->\n";
    const TABLE_END: &str = "<!-- end advertised-apis -->";

    #[test]
    fn the_docs_list_exactly_the_advertised_versions() {
        let page = std::fs::read_to_string(DOCS_PAGE).expect("docs/kafka-apis.md");
        let start = page.find(TABLE_START).expect("the page has the table's start marker") + TABLE_START.len();
        let end = page[start..].find(TABLE_END).expect("the page has the table's end marker") + start;
        let wanted = advertised_apis_markdown();
        if page[start..end] == wanted {
            return;
        }
        if std::env::var_os("SLUICE_UPDATE_DOCS").is_some() {
            let updated = format!("{}{wanted}{}", &page[..start], &page[end..]);
            std::fs::write(DOCS_PAGE, updated).expect("write docs/kafka-apis.md");
            return;
        }
        panic!("docs/kafka-apis.md lists other versions than ApiVersions advertises: run `SLUICE_UPDATE_DOCS=1 cargo test -p sluice-protocol` and commit the page");
    }

    #[test]
    fn advertised_versions_are_within_the_codec() {
        for (key, min, max) in ADVERTISED_APIS {
            let codec = key.valid_versions();
            assert!(min <= max, "{key:?}");
            let decodable = crate::share_wire::version_max(*key);
            assert!(*max <= decodable, "{key:?} max {max} beyond codec {decodable}");
            let (accepted_min, _) = supported_range(*key).unwrap();
            assert!(accepted_min >= codec.min, "{key:?} accepted min below codec");
        }
    }
}
