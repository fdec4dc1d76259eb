//! Typed requests: [`KafkaConnection::send`](crate::KafkaConnection::send) takes a
//! `kafka-protocol` request and returns its own response type, so callers never match on
//! `ResponseKind`.

use kafka_protocol::messages::*;

/// A request and the response it is answered with.
pub trait Exchange: Into<RequestKind> {
    /// The API it belongs to.
    const API: ApiKey;
    /// The answer's type.
    type Answer;
    /// The answer, when `kind` is of this API.
    fn answer(kind: ResponseKind) -> Option<Self::Answer>;
}

macro_rules! exchanges {
    ($($api:ident: $request:ident => $response:ident),* $(,)?) => {
        $(
            impl Exchange for $request {
                const API: ApiKey = ApiKey::$api;
                type Answer = $response;
                fn answer(kind: ResponseKind) -> Option<$response> {
                    match kind {
                        ResponseKind::$api(answer) => Some(answer),
                        _ => None,
                    }
                }
            }
        )*
    };
}

exchanges! {
    Metadata: MetadataRequest => MetadataResponse,
    DescribeCluster: DescribeClusterRequest => DescribeClusterResponse,
    ListOffsets: ListOffsetsRequest => ListOffsetsResponse,
    DescribeLogDirs: DescribeLogDirsRequest => DescribeLogDirsResponse,
    DescribeConfigs: DescribeConfigsRequest => DescribeConfigsResponse,
    IncrementalAlterConfigs: IncrementalAlterConfigsRequest => IncrementalAlterConfigsResponse,
    CreateTopics: CreateTopicsRequest => CreateTopicsResponse,
    DeleteTopics: DeleteTopicsRequest => DeleteTopicsResponse,
    CreatePartitions: CreatePartitionsRequest => CreatePartitionsResponse,
    Fetch: FetchRequest => FetchResponse,
    Produce: ProduceRequest => ProduceResponse,
    FindCoordinator: FindCoordinatorRequest => FindCoordinatorResponse,
    ListGroups: ListGroupsRequest => ListGroupsResponse,
    DescribeGroups: DescribeGroupsRequest => DescribeGroupsResponse,
    ConsumerGroupDescribe: ConsumerGroupDescribeRequest => ConsumerGroupDescribeResponse,
    ShareGroupDescribe: ShareGroupDescribeRequest => ShareGroupDescribeResponse,
    OffsetFetch: OffsetFetchRequest => OffsetFetchResponse,
    DescribeShareGroupOffsets: DescribeShareGroupOffsetsRequest => DescribeShareGroupOffsetsResponse,
    DescribeAcls: DescribeAclsRequest => DescribeAclsResponse,
    DescribeUserScramCredentials: DescribeUserScramCredentialsRequest => DescribeUserScramCredentialsResponse,
    CreateAcls: CreateAclsRequest => CreateAclsResponse,
    DeleteAcls: DeleteAclsRequest => DeleteAclsResponse,
    AlterUserScramCredentials: AlterUserScramCredentialsRequest => AlterUserScramCredentialsResponse,
    DescribeClientQuotas: DescribeClientQuotasRequest => DescribeClientQuotasResponse,
    AlterClientQuotas: AlterClientQuotasRequest => AlterClientQuotasResponse,
    OffsetCommit: OffsetCommitRequest => OffsetCommitResponse,
    DeleteGroups: DeleteGroupsRequest => DeleteGroupsResponse,
    DeleteRecords: DeleteRecordsRequest => DeleteRecordsResponse,
    OffsetDelete: OffsetDeleteRequest => OffsetDeleteResponse,
    AlterShareGroupOffsets: AlterShareGroupOffsetsRequest => AlterShareGroupOffsetsResponse,
    DeleteShareGroupOffsets: DeleteShareGroupOffsetsRequest => DeleteShareGroupOffsetsResponse,
    ApiVersions: ApiVersionsRequest => ApiVersionsResponse,
    DescribeQuorum: DescribeQuorumRequest => DescribeQuorumResponse,
}
