//! Why a group request was refused, as one typed enum shared by the state machine, the
//! offsets store and the handlers; each variant maps to exactly one Kafka error code.

use kafka_protocol::ResponseError;

/// A group-coordinator error. The handlers turn it into the wire error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error("unknown member id")]
    UnknownMemberId,
    #[error("illegal generation")]
    IllegalGeneration,
    #[error("rebalance in progress")]
    RebalanceInProgress,
    #[error("static member fenced by a newer member with the same group.instance.id")]
    FencedInstanceId,
    #[error("member protocols are empty or incompatible with the group")]
    InconsistentGroupProtocol,
    #[error("member id required (KIP-394): rejoin with the member id handed out")]
    MemberIdRequired,
    #[error("session timeout outside the allowed range")]
    InvalidSessionTimeout,
    #[error("group has reached its maximum size")]
    GroupMaxSizeReached,
    #[error("member metadata or assignment too large")]
    MetadataTooLarge,
    #[error("invalid group id")]
    InvalidGroupId,
    #[error("group id not found")]
    GroupIdNotFound,
    #[error("group is not empty")]
    NonEmptyGroup,
    #[error("group is subscribed to the topic")]
    GroupSubscribedToTopic,
    #[error("coordinator not available")]
    CoordinatorNotAvailable,
    #[error("this node is not the group's coordinator")]
    NotCoordinator,
    #[error("the group's coordinator is loading its offsets partition")]
    CoordinatorLoadInProgress,
    #[error("too many groups on this broker")]
    TooManyGroups,
    #[error("commit too large for one offsets log batch")]
    CommitTooLarge,
    #[error("offsets log write failed")]
    Storage,
    #[error("offsets log write timed out")]
    Timeout,
    #[error("member epoch fenced: abandon all partitions and rejoin")]
    FencedMemberEpoch,
    #[error("member epoch is stale")]
    StaleMemberEpoch,
    #[error("server assignor not supported")]
    UnsupportedAssignor,
    #[error("instance id still used by another member")]
    UnreleasedInstanceId,
    #[error("invalid request")]
    InvalidRequest,
    #[error("invalid regular expression")]
    InvalidRegularExpression,
    #[error("api version not supported by this group")]
    UnsupportedVersion,
    #[error("the transactional producer was fenced by a newer epoch")]
    ProducerFenced,
}

impl GroupError {
    /// The Kafka error this maps to.
    pub fn response_error(self) -> ResponseError {
        match self {
            GroupError::UnknownMemberId => ResponseError::UnknownMemberId,
            GroupError::IllegalGeneration => ResponseError::IllegalGeneration,
            GroupError::RebalanceInProgress => ResponseError::RebalanceInProgress,
            GroupError::FencedInstanceId => ResponseError::FencedInstanceId,
            GroupError::InconsistentGroupProtocol => ResponseError::InconsistentGroupProtocol,
            GroupError::MemberIdRequired => ResponseError::MemberIdRequired,
            GroupError::InvalidSessionTimeout => ResponseError::InvalidSessionTimeout,
            GroupError::GroupMaxSizeReached => ResponseError::GroupMaxSizeReached,
            GroupError::MetadataTooLarge => ResponseError::MessageTooLarge,
            GroupError::InvalidGroupId => ResponseError::InvalidGroupId,
            GroupError::GroupIdNotFound => ResponseError::GroupIdNotFound,
            GroupError::NonEmptyGroup => ResponseError::NonEmptyGroup,
            GroupError::GroupSubscribedToTopic => ResponseError::GroupSubscribedToTopic,
            // Kafka's answer when a coordinator cannot take more state is to be unavailable.
            GroupError::CoordinatorNotAvailable | GroupError::TooManyGroups => ResponseError::CoordinatorNotAvailable,
            GroupError::NotCoordinator => ResponseError::NotCoordinator,
            GroupError::CoordinatorLoadInProgress => ResponseError::CoordinatorLoadInProgress,
            GroupError::CommitTooLarge => ResponseError::InvalidCommitOffsetSize,
            GroupError::Storage => ResponseError::KafkaStorageError,
            GroupError::Timeout => ResponseError::RequestTimedOut,
            GroupError::FencedMemberEpoch => ResponseError::FencedMemberEpoch,
            GroupError::StaleMemberEpoch => ResponseError::StaleMemberEpoch,
            GroupError::UnsupportedAssignor => ResponseError::UnsupportedAssignor,
            GroupError::UnreleasedInstanceId => ResponseError::UnreleasedInstanceId,
            GroupError::InvalidRequest => ResponseError::InvalidRequest,
            GroupError::InvalidRegularExpression => ResponseError::InvalidRegularExpression,
            GroupError::UnsupportedVersion => ResponseError::UnsupportedVersion,
            GroupError::ProducerFenced => ResponseError::ProducerFenced,
        }
    }

    pub fn code(self) -> i16 {
        self.response_error().code()
    }

    /// This error with a message for the client (APIs with an `error_message` field).
    pub fn because(self, message: impl Into<String>) -> GroupRefusal {
        GroupRefusal { error: self, message: message.into() }
    }
}

/// An error with the message Kafka would send along (ConsumerGroupHeartbeat and
/// ConsumerGroupDescribe carry one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRefusal {
    pub error: GroupError,
    pub message: String,
}

impl From<GroupError> for GroupRefusal {
    fn from(error: GroupError) -> GroupRefusal {
        GroupRefusal { error, message: error.to_string() }
    }
}
