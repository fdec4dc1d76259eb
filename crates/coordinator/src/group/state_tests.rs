//! State-machine tests: each drives a [`Group`] through join, sync, heartbeat, leave and
//! ticks with explicit times, and checks what members are told.

use bytes::Bytes;
use tokio::sync::oneshot;

use super::*;

const T0: i64 = 1_000_000;
const SESSION_MS: i32 = 10_000;
const REBALANCE_MS: i32 = 20_000;
const NO_DELAY: Timing = Timing {
    initial_rebalance_delay_ms: 0,
    consumer_heartbeat_interval_ms: 5_000,
    consumer_session_timeout_ms: 45_000,
};

fn protocols(names: &[&str]) -> Vec<Protocol> {
    names.iter().map(|n| Protocol { name: n.to_string(), metadata: Bytes::from(format!("meta-{n}")) }).collect()
}

fn request(member_id: &str, instance: Option<&str>, names: &[&str]) -> JoinRequest {
    JoinRequest {
        member_id: member_id.to_string(),
        group_instance_id: instance.map(String::from),
        client_id: "client".to_string(),
        client_host: "/127.0.0.1".to_string(),
        session_timeout_ms: SESSION_MS,
        rebalance_timeout_ms: REBALANCE_MS,
        protocol_type: "consumer".to_string(),
        protocols: protocols(names),
        require_known_member_id: true,
    }
}

fn sync_request(member_id: &str, generation_id: i32, assignments: &[(&str, &str)]) -> SyncRequest {
    SyncRequest {
        member_id: member_id.to_string(),
        group_instance_id: None,
        generation_id,
        protocol_type: Some("consumer".to_string()),
        protocol_name: None,
        assignments: assignments.iter().map(|(m, a)| (m.to_string(), Bytes::from(a.to_string()))).collect(),
    }
}

fn ready<T: std::fmt::Debug>(reply: Reply<T>) -> T {
    match reply {
        Reply::Ready(value) => value,
        Reply::Wait(_) => panic!("expected an immediate answer"),
    }
}

fn waiting<T>(reply: Reply<T>) -> oneshot::Receiver<T> {
    match reply {
        Reply::Wait(receiver) => receiver,
        Reply::Ready(_) => panic!("expected to wait"),
    }
}

fn answered<T>(receiver: &mut oneshot::Receiver<T>) -> Option<T> {
    receiver.try_recv().ok()
}

/// Joins a dynamic member through the KIP-394 round trip; returns its id and its wait.
fn join_dynamic(group: &mut Group, names: &[&str], now_ms: i64) -> (String, oneshot::Receiver<JoinResponse>) {
    let first = ready(group.join(request("", None, names), now_ms, &NO_DELAY));
    assert_eq!(first.error, Some(GroupError::MemberIdRequired));
    assert!(!first.member_id.is_empty());
    let receiver = waiting(group.join(request(&first.member_id, None, names), now_ms, &NO_DELAY));
    (first.member_id, receiver)
}

/// A one-member Stable group; returns the member id.
fn stable_single(group: &mut Group) -> String {
    let (member, mut join) = join_dynamic(group, &["range"], T0);
    group.tick(T0, &NO_DELAY);
    let joined = answered(&mut join).expect("a single member's first generation forms at the next tick");
    assert_eq!(joined.generation_id, 1);
    let mut sync = waiting(group.sync(sync_request(&member, 1, &[(&member, "all")]), T0));
    assert_eq!(answered(&mut sync).unwrap().assignment, Bytes::from("all"));
    assert_eq!(group.state(), GroupState::Stable);
    member
}

#[test]
fn first_member_needs_a_member_id_then_leads_a_stable_group() {
    let mut group = Group::new("g");
    let (member, mut join) = join_dynamic(&mut group, &["range"], T0);
    assert!(answered(&mut join).is_none(), "a new group's first generation forms at a tick");
    group.tick(T0, &NO_DELAY);
    let response = answered(&mut join).unwrap();
    assert_eq!(response.error, None);
    assert_eq!(response.leader_id, member);
    assert_eq!(response.protocol_name.as_deref(), Some("range"));
    assert_eq!(response.members.len(), 1);
    assert_eq!(response.members[0].metadata, Bytes::from("meta-range"));
    assert_eq!(group.state(), GroupState::CompletingRebalance);
    assert_eq!(group.heartbeat(&member, None, 1, T0), Ok(()));
    let mut sync = waiting(group.sync(sync_request(&member, 1, &[(&member, "p0")]), T0));
    assert_eq!(answered(&mut sync).unwrap().assignment, Bytes::from("p0"));
    assert_eq!(group.state(), GroupState::Stable);
    assert_eq!(group.leader_id(), Some(member.as_str()));
}

#[test]
fn members_that_join_together_share_the_first_generation_without_an_initial_delay() {
    let mut group = Group::new("g");
    let (first, mut first_join) = join_dynamic(&mut group, &["range"], T0);
    // The second member's KIP-394 round trip begins after the first's has ended, before
    // the tick: it takes part in the first generation.
    let (second, mut second_join) = join_dynamic(&mut group, &["range"], T0 + 5);
    group.tick(T0 + 10, &NO_DELAY);
    let leader_view = answered(&mut first_join).unwrap();
    let follower_view = answered(&mut second_join).unwrap();
    assert_eq!((leader_view.generation_id, follower_view.generation_id), (1, 1));
    assert_eq!(leader_view.members.len(), 2);
    assert_eq!(leader_view.leader_id, first);
    assert_eq!(follower_view.member_id, second);
}

#[test]
fn a_second_member_triggers_a_rebalance_and_every_member_gets_its_assignment() {
    let mut group = Group::new("g");
    let first = stable_single(&mut group);
    let (second, mut second_join) = join_dynamic(&mut group, &["range"], T0 + 1);
    assert_eq!(group.state(), GroupState::PreparingRebalance);
    assert!(answered(&mut second_join).is_none(), "waits for the first member to rejoin");
    assert_eq!(group.heartbeat(&first, None, 1, T0 + 2), Err(GroupError::RebalanceInProgress));
    let mut first_join = waiting(group.join(request(&first, None, &["range"]), T0 + 3, &NO_DELAY));
    let leader_view = answered(&mut first_join).unwrap();
    let follower_view = answered(&mut second_join).unwrap();
    assert_eq!((leader_view.generation_id, follower_view.generation_id), (2, 2));
    assert_eq!(leader_view.leader_id, first);
    assert_eq!(leader_view.members.len(), 2);
    assert!(follower_view.members.is_empty());
    let mut follower_sync = waiting(group.sync(sync_request(&second, 2, &[]), T0 + 4));
    assert!(answered(&mut follower_sync).is_none(), "waits for the leader");
    let assignments = [(first.as_str(), "a"), (second.as_str(), "b")];
    let mut leader_sync = waiting(group.sync(sync_request(&first, 2, &assignments), T0 + 5));
    assert_eq!(answered(&mut leader_sync).unwrap().assignment, Bytes::from("a"));
    assert_eq!(answered(&mut follower_sync).unwrap().assignment, Bytes::from("b"));
    assert_eq!(group.state(), GroupState::Stable);
}

#[test]
fn stale_and_unknown_members_are_fenced() {
    let mut group = Group::new("g");
    let member = stable_single(&mut group);
    assert_eq!(group.heartbeat(&member, None, 0, T0), Err(GroupError::IllegalGeneration));
    assert_eq!(group.heartbeat("stranger", None, 1, T0), Err(GroupError::UnknownMemberId));
    let stale = ready(group.sync(sync_request(&member, 7, &[]), T0));
    assert_eq!(stale.error, Some(GroupError::IllegalGeneration));
    assert_eq!(group.validate_commit(&member, None, 1, false, T0), Ok(()));
    assert_eq!(group.validate_commit(&member, None, 5, false, T0), Err(GroupError::IllegalGeneration));
    assert_eq!(group.validate_commit(&member, None, 1, true, T0), Ok(()));
    let stale_transactional = group.validate_commit(&member, None, 5, true, T0);
    assert_eq!(stale_transactional, Err(GroupError::IllegalGeneration), "KIP-447: a zombie's TxnOffsetCommit");
    assert_eq!(group.validate_commit("", None, -1, false, T0), Err(GroupError::UnknownMemberId));
    let unknown = ready(group.join(request("stranger", None, &["range"]), T0, &NO_DELAY));
    assert_eq!(unknown.error, Some(GroupError::UnknownMemberId));
    let timing = NO_DELAY;
    assert_eq!(group.leave(&member, None, T0, &timing), Ok(()));
    assert_eq!(group.state(), GroupState::Empty);
    assert_eq!(group.validate_commit("", None, -1, false, T0), Ok(()), "simple consumers commit to empty groups");
    assert_eq!(group.leave(&member, None, T0, &timing), Err(GroupError::UnknownMemberId));
}

#[test]
fn bad_joins_get_clear_errors() {
    let mut group = Group::new("g");
    let check = |group: &mut Group, request: JoinRequest, expected: GroupError| {
        assert_eq!(ready(group.join(request, T0, &NO_DELAY)).error, Some(expected));
    };
    check(&mut group, request("", None, &[]), GroupError::InconsistentGroupProtocol);
    let mut huge = request("", None, &["range"]);
    huge.protocols[0].metadata = Bytes::from(vec![0u8; MEMBER_METADATA_BYTES_MAX + 1]);
    check(&mut group, huge, GroupError::MetadataTooLarge);
    let mut short_session = request("", None, &["range"]);
    short_session.session_timeout_ms = SESSION_TIMEOUT_MS_MIN - 1;
    check(&mut group, short_session, GroupError::InvalidSessionTimeout);
    let mut no_type = request("", None, &["range"]);
    no_type.protocol_type.clear();
    check(&mut group, no_type, GroupError::InconsistentGroupProtocol);
    stable_single(&mut group);
    check(&mut group, request("", None, &["roundrobin"]), GroupError::InconsistentGroupProtocol);
    assert_eq!(group.member_count(), 1, "nothing changed by refused joins");
}

#[test]
fn expired_sessions_remove_members_and_rebalance_the_rest() {
    let mut group = Group::new("g");
    let first = stable_single(&mut group);
    let (second, mut second_join) = join_dynamic(&mut group, &["range"], T0);
    let mut first_join = waiting(group.join(request(&first, None, &["range"]), T0, &NO_DELAY));
    answered(&mut first_join).unwrap();
    answered(&mut second_join).unwrap();
    let mut follower_sync = waiting(group.sync(sync_request(&second, 2, &[]), T0));
    let _leader_sync = waiting(group.sync(sync_request(&first, 2, &[(&first, "a"), (&second, "b")]), T0));
    answered(&mut follower_sync).unwrap();
    // Only the second member keeps heartbeating.
    let later = T0 + i64::from(SESSION_MS) - 1;
    assert_eq!(group.heartbeat(&second, None, 2, later), Ok(()));
    group.tick(T0 + i64::from(SESSION_MS), &NO_DELAY);
    assert!(!group.has_member(&first));
    assert_eq!(group.state(), GroupState::PreparingRebalance);
    let mut rejoin = waiting(group.join(request(&second, None, &["range"]), later + 2, &NO_DELAY));
    let response = answered(&mut rejoin).unwrap();
    assert_eq!((response.generation_id, response.leader_id.as_str()), (3, second.as_str()));
    assert_eq!(response.members.len(), 1);
}

#[test]
fn members_that_miss_the_rebalance_timeout_are_dropped() {
    let mut group = Group::new("g");
    let first = stable_single(&mut group);
    let (_second, mut second_join) = join_dynamic(&mut group, &["range"], T0);
    // The first member heartbeats (and learns of the rebalance) but never rejoins.
    for at in [T0 + 5_000, T0 + 14_000] {
        assert_eq!(group.heartbeat(&first, None, 1, at), Err(GroupError::RebalanceInProgress));
    }
    group.tick(T0 + i64::from(REBALANCE_MS) - 1, &NO_DELAY);
    assert!(answered(&mut second_join).is_none());
    group.tick(T0 + i64::from(REBALANCE_MS), &NO_DELAY);
    let response = answered(&mut second_join).unwrap();
    assert_eq!((response.generation_id, response.members.len()), (2, 1));
    assert!(!group.has_member(&first));
}

#[test]
fn a_static_member_rejoining_with_unchanged_metadata_causes_no_rebalance() {
    let mut group = Group::new("g");
    let mut join = waiting(group.join(request("", Some("instance-1"), &["range"]), T0, &NO_DELAY));
    group.tick(T0, &NO_DELAY);
    let old = answered(&mut join).unwrap();
    assert_eq!(old.error, None, "static members skip MEMBER_ID_REQUIRED");
    let mut sync = waiting(group.sync(sync_request(&old.member_id, 1, &[(&old.member_id, "p0-p3")]), T0));
    answered(&mut sync).unwrap();
    let rejoined = ready(group.join(request("", Some("instance-1"), &["range"]), T0 + 100, &NO_DELAY));
    assert_eq!(rejoined.error, None);
    assert_ne!(rejoined.member_id, old.member_id);
    assert_eq!(rejoined.generation_id, 1, "same generation: no rebalance");
    assert!(rejoined.skip_assignment);
    assert_eq!(rejoined.leader_id, old.member_id, "the old leader id, so nobody reassigns");
    assert_eq!(group.state(), GroupState::Stable);
    let same = ready(group.sync(sync_request(&rejoined.member_id, 1, &[]), T0 + 101));
    assert_eq!(same.assignment, Bytes::from("p0-p3"));
    assert_eq!(group.heartbeat(&old.member_id, Some("instance-1"), 1, T0), Err(GroupError::FencedInstanceId));
    assert_eq!(group.heartbeat(&old.member_id, None, 1, T0), Err(GroupError::UnknownMemberId));
    // Changed metadata does rebalance.
    let mut changed = waiting(group.join(request("", Some("instance-1"), &["range", "roundrobin"]), T0, &NO_DELAY));
    assert_eq!(answered(&mut changed).unwrap().generation_id, 2);
}

#[test]
fn the_initial_delay_waits_for_more_members() {
    let timing = Timing { initial_rebalance_delay_ms: 1_000, ..NO_DELAY };
    let mut group = Group::new("g");
    let mut first_request = request("", None, &["range"]);
    first_request.require_known_member_id = false;
    let mut first = waiting(group.join(first_request.clone(), T0, &timing));
    let mut second = waiting(group.join(first_request, T0 + 600, &timing));
    group.tick(T0 + 1_000, &timing);
    assert!(answered(&mut first).is_none(), "the newcomer extended the delay");
    group.tick(T0 + 1_600, &timing);
    let leader = answered(&mut first).unwrap();
    assert_eq!((leader.generation_id, leader.members.len()), (1, 2));
    assert_eq!(answered(&mut second).unwrap().generation_id, 1);
}

#[test]
fn the_protocol_is_chosen_by_vote_among_common_ones() {
    let mut group = Group::new("g");
    let timing = Timing { initial_rebalance_delay_ms: 10, ..NO_DELAY };
    let mut joins = Vec::new();
    for names in [&["range", "roundrobin"][..], &["roundrobin", "range"], &["roundrobin", "sticky", "range"]] {
        let mut join = request("", None, names);
        join.require_known_member_id = false;
        joins.push(waiting(group.join(join, T0, &timing)));
    }
    group.tick(T0 + 10, &timing);
    for join in &mut joins {
        assert_eq!(answered(join).unwrap().protocol_name.as_deref(), Some("roundrobin"));
    }
}

#[test]
fn leaving_during_sync_restarts_the_rebalance_without_looping() {
    let mut group = Group::new("g");
    let first = stable_single(&mut group);
    let (second, mut second_join) = join_dynamic(&mut group, &["range"], T0);
    let mut first_join = waiting(group.join(request(&first, None, &["range"]), T0, &NO_DELAY));
    answered(&mut first_join).unwrap();
    answered(&mut second_join).unwrap();
    let mut follower_sync = waiting(group.sync(sync_request(&second, 2, &[]), T0));
    assert_eq!(group.leave(&first, None, T0 + 1, &NO_DELAY), Ok(()));
    let aborted = answered(&mut follower_sync).unwrap();
    assert_eq!(aborted.error, Some(GroupError::RebalanceInProgress));
    let mut rejoin = waiting(group.join(request(&second, None, &["range"]), T0 + 2, &NO_DELAY));
    let response = answered(&mut rejoin).unwrap();
    assert_eq!((response.generation_id, response.leader_id.as_str()), (3, second.as_str()));
    assert_eq!(group.generation_id(), 3);
}
