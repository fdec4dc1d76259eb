//! The controller quorum's membership as Kafka's KIP-853 exposes it: who votes, who only
//! follows the log (observers), how far each is, and the checks a voter change must pass.
//!
//! A node that is not among the configured initial voters starts as an *observer*: it
//! heartbeats the voters with its controller address, and the active controller adds it to
//! the raft membership as a learner, so it receives the log and serves as a broker. An
//! observer becomes a voter only by an explicit AddRaftVoter, and a voter stops voting only
//! by RemoveRaftVoter; both are raft joint-consensus membership changes (openraft's
//! `change_membership`), so the quorum never has two majorities. A removed voter becomes an
//! observer again (the active controller re-adds it as it re-adds any node that heartbeats):
//! it is still a broker and needs the metadata.
//!
//! Why the checks here: adding a voter that has not caught up with the log would stall
//! commits (a majority that includes it cannot ack new entries until it has the old ones),
//! and a voter key whose directory id differs from the node's is a node that lost its disk
//! (or another node under the same id): it must not vote as if it had the log.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// How many log entries an observer may be behind the leader and still be added as a voter.
pub const VOTER_CATCH_UP_LAG_ENTRIES_MAX: u64 = 100;

/// One replica of the controller log as the active controller sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumReplica {
    /// The node id.
    pub node_id: i32,
    /// The id of the node's controller directory; nil when not known yet.
    pub directory_id: Uuid,
    /// The index after the last entry the node holds (Kafka's log end offset); -1 unknown.
    pub log_end_offset: i64,
    /// When the node was last heard from (ms since the epoch); -1 never.
    pub last_fetch_timestamp_ms: i64,
    /// When the node last held every entry the leader had (ms since the epoch); -1 never.
    pub last_caught_up_timestamp_ms: i64,
    /// Its controller RPC address (`host:port`), if known.
    pub controller_address: Option<String>,
}

/// The quorum, as described by its active controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumDescription {
    /// The active controller.
    pub leader_id: i32,
    /// The raft term (Kafka's leader epoch of the metadata log).
    pub leader_epoch: i32,
    /// The index after the last committed entry.
    pub high_watermark: i64,
    /// The voters, by node id.
    pub voters: Vec<QuorumReplica>,
    /// The nodes that receive the log without voting, by node id.
    pub observers: Vec<QuorumReplica>,
}

/// A change to the set of voters (Kafka's AddRaftVoter / RemoveRaftVoter).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VoterChange {
    /// Make an observer a voter.
    Add {
        /// The observer's node id.
        node_id: i32,
        /// Its directory id; nil = whatever it is.
        directory_id: Uuid,
    },
    /// Make a voter an observer.
    Remove {
        /// The voter's node id.
        node_id: i32,
        /// Its directory id; nil = whatever it is.
        directory_id: Uuid,
    },
}

/// Why a voter change was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum VoterChangeError {
    /// The node already votes.
    #[error("node {0} is already a voter")]
    DuplicateVoter(i32),
    /// The node does not vote.
    #[error("node {0} is not a voter")]
    VoterNotFound(i32),
    /// The node does not follow the log (never started, or unknown to this cluster).
    #[error("node {0} is not an observer of the quorum: start it first, with this cluster's voters")]
    NotAnObserver(i32),
    /// The directory id named is not the node's.
    #[error("node {node_id} has directory id {actual}, not {named}")]
    DirectoryMismatch {
        /// The node.
        node_id: i32,
        /// The id the request named.
        named: Uuid,
        /// The node's own.
        actual: Uuid,
    },
    /// The observer is too far behind the log to vote yet.
    #[error("node {node_id} is {behind} entries behind the log (at most {VOTER_CATCH_UP_LAG_ENTRIES_MAX}): retry once it caught up")]
    NotCaughtUp {
        /// The node.
        node_id: i32,
        /// Entries behind; `u64::MAX` when it has none.
        behind: u64,
    },
    /// The quorum would exceed its size limit.
    #[error("the quorum already has {0} voters, the most it may have")]
    TooManyVoters(usize),
    /// The quorum would have no voter.
    #[error("node {0} is the only voter")]
    LastVoter(i32),
    /// Raft refused (another membership change in progress, leadership lost...).
    #[error("membership change failed: {0}")]
    Raft(String),
}

impl VoterChangeError {
    /// The Kafka error code the broker answers with.
    pub fn kafka_error_code(&self) -> i16 {
        match self {
            Self::DuplicateVoter(_) => 126,
            Self::VoterNotFound(_) => 127,
            Self::DirectoryMismatch { .. } => 125,
            Self::NotCaughtUp { .. } => 7,
            Self::NotAnObserver(_) | Self::TooManyVoters(_) | Self::LastVoter(_) => 42,
            Self::Raft(_) => 41,
        }
    }
}

/// What the leader knows of the membership and its progress, for [`check_voter_change`].
pub(crate) struct Membership {
    pub(crate) voters: BTreeSet<i32>,
    pub(crate) learners: BTreeSet<i32>,
    /// Directory ids reported by each node.
    pub(crate) directories: BTreeMap<i32, Uuid>,
    /// The last index each node holds, as replication reports it.
    pub(crate) matched: BTreeMap<i32, u64>,
    /// The leader's last index.
    pub(crate) last_index: u64,
}

/// Checks `change` against the membership; `Ok` means raft may be asked to make it.
pub(crate) fn check_voter_change(
    change: &VoterChange,
    membership: &Membership,
    voters_max: usize,
) -> Result<(), VoterChangeError> {
    match *change {
        VoterChange::Add { node_id, directory_id } => {
            if membership.voters.contains(&node_id) {
                return Err(VoterChangeError::DuplicateVoter(node_id));
            }
            if !membership.learners.contains(&node_id) {
                return Err(VoterChangeError::NotAnObserver(node_id));
            }
            check_directory(node_id, directory_id, membership)?;
            if membership.voters.len() >= voters_max {
                return Err(VoterChangeError::TooManyVoters(membership.voters.len()));
            }
            let behind = membership
                .matched
                .get(&node_id)
                .map_or(u64::MAX, |&matched| membership.last_index.saturating_sub(matched));
            if behind > VOTER_CATCH_UP_LAG_ENTRIES_MAX {
                return Err(VoterChangeError::NotCaughtUp { node_id, behind });
            }
            Ok(())
        }
        VoterChange::Remove { node_id, directory_id } => {
            if !membership.voters.contains(&node_id) {
                return Err(VoterChangeError::VoterNotFound(node_id));
            }
            check_directory(node_id, directory_id, membership)?;
            if membership.voters.len() == 1 {
                return Err(VoterChangeError::LastVoter(node_id));
            }
            Ok(())
        }
    }
}

fn check_directory(node_id: i32, named: Uuid, membership: &Membership) -> Result<(), VoterChangeError> {
    match membership.directories.get(&node_id) {
        Some(&actual) if !named.is_nil() && actual != named => {
            Err(VoterChangeError::DirectoryMismatch { node_id, named, actual })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn membership() -> Membership {
        Membership {
            voters: BTreeSet::from([1, 2, 3]),
            learners: BTreeSet::from([4]),
            directories: BTreeMap::from([(4, Uuid::from_u128(44)), (3, Uuid::from_u128(33))]),
            matched: BTreeMap::from([(1, 500), (2, 500), (3, 499), (4, 450)]),
            last_index: 500,
        }
    }

    fn add(node_id: i32, directory_id: u128) -> VoterChange {
        VoterChange::Add { node_id, directory_id: Uuid::from_u128(directory_id) }
    }

    fn remove(node_id: i32, directory_id: u128) -> VoterChange {
        VoterChange::Remove { node_id, directory_id: Uuid::from_u128(directory_id) }
    }

    #[test]
    fn an_observer_that_caught_up_may_become_a_voter() {
        assert_eq!(check_voter_change(&add(4, 44), &membership(), 7), Ok(()));
        assert_eq!(check_voter_change(&add(4, 0), &membership(), 7), Ok(()), "nil: any directory");
    }

    #[test]
    fn voter_additions_are_refused_with_kafkas_reasons() {
        let refused = |change, membership: &Membership, max| check_voter_change(&change, membership, max).unwrap_err();
        assert_eq!(refused(add(2, 0), &membership(), 7), VoterChangeError::DuplicateVoter(2));
        assert_eq!(refused(add(9, 0), &membership(), 7), VoterChangeError::NotAnObserver(9));
        assert!(matches!(refused(add(4, 45), &membership(), 7), VoterChangeError::DirectoryMismatch { .. }));
        assert_eq!(refused(add(4, 44), &membership(), 3), VoterChangeError::TooManyVoters(3));
        let mut behind = membership();
        behind.matched.insert(4, 500 - VOTER_CATCH_UP_LAG_ENTRIES_MAX - 1);
        assert!(matches!(refused(add(4, 44), &behind, 7), VoterChangeError::NotCaughtUp { node_id: 4, .. }));
        behind.matched.remove(&4);
        assert!(matches!(refused(add(4, 44), &behind, 7), VoterChangeError::NotCaughtUp { behind: u64::MAX, .. }));
    }

    #[test]
    fn voter_removals_are_refused_with_kafkas_reasons() {
        assert_eq!(check_voter_change(&remove(3, 33), &membership(), 7), Ok(()));
        let refused = |change, membership: &Membership| check_voter_change(&change, membership, 7).unwrap_err();
        assert_eq!(refused(remove(4, 0), &membership()), VoterChangeError::VoterNotFound(4));
        assert!(matches!(refused(remove(3, 34), &membership()), VoterChangeError::DirectoryMismatch { .. }));
        let mut alone = membership();
        alone.voters = BTreeSet::from([1]);
        assert_eq!(refused(remove(1, 0), &alone), VoterChangeError::LastVoter(1));
    }
}
