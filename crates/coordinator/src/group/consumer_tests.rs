//! Consumer-protocol state-machine tests: simulated clients heartbeat a [`ConsumerGroup`]
//! with explicit times, apply every assignment they are sent (revoking what is gone,
//! taking what is new) and report what they own, as the Java client does. After every
//! step the test checks that no partition is held by two clients at once.

use super::*;
use crate::group::assignor::partition_count;

const T0: i64 = 1_000_000;
const SESSION_MS: i64 = 10_000;
const REBALANCE_MS: i32 = 30_000;
const TIMING: Timing = Timing {
    initial_rebalance_delay_ms: 0,
    consumer_heartbeat_interval_ms: 1_000,
    consumer_session_timeout_ms: SESSION_MS,
};

fn topic_id() -> Uuid {
    Uuid::from_u128(0x5eed)
}

fn catalog(partitions: i32) -> TopicCatalog {
    TopicCatalog::from_topics([("t".to_string(), topic_id(), partitions)])
}

fn parts(partitions: &[i32]) -> Assignment {
    if partitions.is_empty() {
        return Assignment::new();
    }
    Assignment::from([(topic_id(), partitions.iter().copied().collect())])
}

fn list(assignment: &Assignment) -> Vec<i32> {
    assignment.get(&topic_id()).map(|p| p.iter().copied().collect()).unwrap_or_default()
}

/// A client of the group: what it owns and the epoch it heartbeats with.
#[derive(Debug)]
struct Client {
    member_id: String,
    instance_id: Option<String>,
    epoch: i32,
    owned: Assignment,
    /// Every partition it was told to give up, in order.
    revoked: Vec<i32>,
}

impl Client {
    fn new(member_id: &str) -> Client {
        Client {
            member_id: member_id.to_string(),
            instance_id: None,
            epoch: 0,
            owned: Assignment::new(),
            revoked: vec![],
        }
    }

    fn request(&self) -> Heartbeat {
        let joining = self.epoch == JOIN_GROUP_MEMBER_EPOCH;
        Heartbeat {
            member_id: self.member_id.clone(),
            member_epoch: self.epoch,
            instance_id: self.instance_id.clone(),
            rebalance_timeout_ms: if joining { REBALANCE_MS } else { -1 },
            subscribed_topic_names: joining.then(|| vec!["t".to_string()]),
            owned: Some(self.owned.clone()),
            client_id: "client".to_string(),
            client_host: "/127.0.0.1".to_string(),
            ..Heartbeat::default()
        }
    }

    /// One heartbeat; the client applies the answer as a real one would.
    fn beat(&mut self, group: &mut ConsumerGroup, catalog: &TopicCatalog, now_ms: i64) -> HeartbeatAnswer {
        let answer = group.heartbeat(self.request(), catalog, now_ms, &TIMING).expect("heartbeat accepted");
        self.epoch = answer.member_epoch;
        if let Some(assignment) = &answer.assignment {
            let gone = split(&self.owned, assignment, false);
            self.revoked.extend(list(&gone));
            self.owned = assignment.clone();
        }
        answer
    }
}

/// The heart of the protocol: no partition is owned by two clients at any moment, and the
/// broker's bookkeeping agrees with itself.
fn check_exclusive(group: &ConsumerGroup, clients: &[Client]) {
    group.check_invariants();
    let mut seen = BTreeMap::new();
    for client in clients {
        for partition in list(&client.owned) {
            if let Some(other) = seen.insert(partition, &client.member_id) {
                panic!("partition {partition} owned by {other} and {}", client.member_id);
            }
        }
    }
}

/// Heartbeats every client in turn until nothing changes any more; returns the rounds.
fn converge(group: &mut ConsumerGroup, clients: &mut [Client], catalog: &TopicCatalog, now_ms: i64) -> usize {
    for round in 1..=20 {
        let mut changed = false;
        for index in 0..clients.len() {
            let before = (clients[index].epoch, clients[index].owned.clone());
            clients[index].beat(group, catalog, now_ms);
            changed |= before != (clients[index].epoch, clients[index].owned.clone());
            check_exclusive(group, clients);
        }
        if !changed && group.state() == ConsumerGroupState::Stable {
            return round;
        }
    }
    panic!("group did not converge: {group:?}");
}

/// Forgets what the clients revoked so far (the initial rebalances).
fn forget_revocations(clients: &mut [Client]) {
    for client in clients {
        client.revoked.clear();
    }
}

fn counts(clients: &[Client]) -> Vec<usize> {
    clients.iter().map(|c| partition_count(&c.owned)).collect()
}

#[test]
fn three_members_share_twelve_partitions() {
    let catalog = catalog(12);
    let mut group = ConsumerGroup::new("g");
    let mut clients: Vec<Client> = ["a", "b", "c"].iter().map(|m| Client::new(m)).collect();
    converge(&mut group, &mut clients, &catalog, T0);
    assert_eq!(counts(&clients), vec![4, 4, 4]);
    assert!(clients.iter().all(|c| c.epoch == group.group_epoch()), "everyone reached the group epoch");
    let description = group.describe();
    assert_eq!(description.state, ConsumerGroupState::Stable);
    assert_eq!(description.assignor, "uniform");
}

#[test]
fn a_newcomer_waits_until_the_owners_revoked_and_nothing_else_moves() {
    let catalog = catalog(12);
    let mut group = ConsumerGroup::new("g");
    let mut clients = vec![Client::new("a"), Client::new("b")];
    converge(&mut group, &mut clients, &catalog, T0);
    assert_eq!(counts(&clients), vec![6, 6]);
    forget_revocations(&mut clients);
    let before: Vec<Assignment> = clients.iter().map(|c| c.owned.clone()).collect();

    clients.push(Client::new("c"));
    let joined = clients[2].beat(&mut group, &catalog, T0);
    assert_eq!(joined.assignment, Some(Assignment::new()), "nothing is free yet");
    assert_eq!(group.state(), ConsumerGroupState::Reconciling);
    // a is told to give up two partitions, and keeps its epoch until it has.
    let old_epoch = clients[0].epoch;
    let answer = clients[0].beat(&mut group, &catalog, T0);
    assert_eq!(answer.member_epoch, old_epoch);
    assert_eq!(partition_count(&clients[0].owned), 4);
    check_exclusive(&group, &clients);
    // c still gets nothing that b holds.
    clients[2].beat(&mut group, &catalog, T0);
    check_exclusive(&group, &clients);
    converge(&mut group, &mut clients, &catalog, T0);
    assert_eq!(counts(&clients), vec![4, 4, 4]);
    for (index, client) in clients[..2].iter().enumerate() {
        assert!(is_subset(&client.owned, &before[index]), "{} gained a partition", client.member_id);
        let kept = list(&client.owned);
        assert!(client.revoked.iter().all(|p| !kept.contains(p)), "a partition that stayed was revoked");
        assert_eq!(client.revoked.len(), 2);
    }
}

#[test]
fn partitions_of_a_leaving_member_go_to_the_others() {
    let catalog = catalog(12);
    let mut group = ConsumerGroup::new("g");
    let mut clients: Vec<Client> = ["a", "b", "c"].iter().map(|m| Client::new(m)).collect();
    converge(&mut group, &mut clients, &catalog, T0);
    forget_revocations(&mut clients);
    let leaving = clients.pop().unwrap();
    let mut request = leaving.request();
    request.member_epoch = LEAVE_GROUP_MEMBER_EPOCH;
    let answer = group.heartbeat(request, &catalog, T0, &TIMING).unwrap();
    assert_eq!(answer.member_epoch, LEAVE_GROUP_MEMBER_EPOCH);
    converge(&mut group, &mut clients, &catalog, T0);
    assert_eq!(counts(&clients), vec![6, 6]);
    assert!(clients.iter().all(|c| c.revoked.is_empty()), "the stayers revoked nothing");
}

#[test]
fn an_expired_session_frees_the_partitions() {
    let catalog = catalog(4);
    let mut group = ConsumerGroup::new("g");
    let mut clients = vec![Client::new("a"), Client::new("b")];
    converge(&mut group, &mut clients, &catalog, T0);
    group.tick(T0 + SESSION_MS - 1, &TIMING);
    assert_eq!(group.describe().members.len(), 2);
    clients[0].beat(&mut group, &catalog, T0 + SESSION_MS - 1);
    group.tick(T0 + SESSION_MS, &TIMING);
    assert_eq!(group.describe().members.len(), 1, "b never heartbeated again");
    clients.pop();
    converge(&mut group, &mut clients, &catalog, T0 + SESSION_MS);
    assert_eq!(counts(&clients), vec![4]);
}

#[test]
fn a_member_that_does_not_revoke_in_time_is_removed() {
    let catalog = catalog(4);
    let mut group = ConsumerGroup::new("g");
    let mut clients = vec![Client::new("a")];
    converge(&mut group, &mut clients, &catalog, T0);
    let mut newcomer = Client::new("b");
    newcomer.beat(&mut group, &catalog, T0);
    // a hears it must revoke but keeps claiming everything.
    let mut stubborn = clients[0].request();
    stubborn.owned = Some(parts(&[0, 1, 2, 3]));
    group.heartbeat(stubborn.clone(), &catalog, T0 + 1, &TIMING).unwrap();
    group.heartbeat(stubborn, &catalog, T0 + 2, &TIMING).unwrap();
    newcomer.beat(&mut group, &catalog, T0 + 3);
    assert!(newcomer.owned.is_empty(), "nothing moves before a revoked");
    // Both sessions stay alive; the revocation deadline (rebalance timeout) still fires.
    let deadline = T0 + 1 + i64::from(REBALANCE_MS);
    let mut stubborn = clients[0].request();
    stubborn.owned = Some(parts(&[0, 1, 2, 3]));
    for now_ms in (T0..deadline).step_by(SESSION_MS as usize / 2).skip(1) {
        group.heartbeat(stubborn.clone(), &catalog, now_ms, &TIMING).unwrap();
        newcomer.beat(&mut group, &catalog, now_ms);
    }
    group.tick(deadline, &TIMING);
    assert_eq!(group.describe().members.len(), 1);
    let mut rest = vec![newcomer];
    converge(&mut group, &mut rest, &catalog, deadline);
    assert_eq!(counts(&rest), vec![4]);
}

#[test]
fn epochs_are_fenced_like_kafka() {
    let catalog = catalog(4);
    let mut group = ConsumerGroup::new("g");
    let mut clients = vec![Client::new("a"), Client::new("b")];
    converge(&mut group, &mut clients, &catalog, T0);
    let epoch = clients[0].epoch;
    assert!(epoch >= 2);
    let refusal = |request: Heartbeat, group: &mut ConsumerGroup| {
        group.heartbeat(request, &catalog, T0, &TIMING).unwrap_err().error
    };

    let mut ahead = clients[0].request();
    ahead.member_epoch = epoch + 1;
    assert_eq!(refusal(ahead, &mut group), GroupError::FencedMemberEpoch);
    let mut behind = clients[0].request();
    behind.member_epoch = epoch - 1;
    behind.owned = Some(parts(&[0, 1, 2, 3]));
    assert_eq!(refusal(behind, &mut group), GroupError::FencedMemberEpoch, "previous epoch, owns too much");
    let mut stranger = clients[0].request();
    stranger.member_id = "nobody".to_string();
    assert_eq!(refusal(stranger, &mut group), GroupError::UnknownMemberId);

    // The previous epoch with owned partitions within the assignment is accepted: the
    // response that moved the member on may have been lost.
    clients.push(Client::new("c"));
    converge(&mut group, &mut clients, &catalog, T0);
    let current = clients[0].epoch;
    assert!(current > epoch);
    let mut lost_response = clients[0].request();
    lost_response.member_epoch = epoch;
    let answer = group.heartbeat(lost_response.clone(), &catalog, T0, &TIMING).unwrap();
    assert_eq!(answer.member_epoch, current);
    lost_response.owned = Some(parts(&[0, 1, 2, 3]));
    assert!(list(&clients[0].owned).len() < 4);
    assert_eq!(refusal(lost_response, &mut group), GroupError::FencedMemberEpoch, "owns more than assigned");
}

#[test]
fn a_static_member_gets_its_partitions_back_without_a_new_epoch() {
    let catalog = catalog(6);
    let mut group = ConsumerGroup::new("g");
    let mut clients = vec![Client::new("a"), Client::new("b")];
    clients[0].instance_id = Some("instance-a".to_string());
    converge(&mut group, &mut clients, &catalog, T0);
    let (epoch, owned) = (group.group_epoch(), clients[0].owned.clone());

    // Another process with the same instance id while a is alive: refused.
    let mut impostor = Client::new("a2");
    impostor.instance_id = Some("instance-a".to_string());
    let refusal = group.heartbeat(impostor.request(), &catalog, T0, &TIMING).unwrap_err();
    assert_eq!(refusal.error, GroupError::UnreleasedInstanceId);

    let mut leave = clients[0].request();
    leave.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH;
    assert_eq!(group.heartbeat(leave, &catalog, T0, &TIMING).unwrap().member_epoch, LEAVE_GROUP_STATIC_MEMBER_EPOCH);
    clients[1].beat(&mut group, &catalog, T0 + 1);
    assert_eq!(partition_count(&clients[1].owned), 3, "b does not get a's partitions meanwhile");

    let answer = impostor.beat(&mut group, &catalog, T0 + 2);
    assert_eq!(answer.member_id, "a2");
    assert_eq!(impostor.owned, owned, "the new incarnation gets the same partitions");
    assert_eq!(group.group_epoch(), epoch, "no rebalance");
    clients[0] = impostor;
    assert_eq!(converge(&mut group, &mut clients, &catalog, T0 + 3), 1);
}

#[test]
fn new_partitions_start_a_new_epoch() {
    let mut group = ConsumerGroup::new("g");
    let mut clients = vec![Client::new("a"), Client::new("b")];
    converge(&mut group, &mut clients, &catalog(4), T0);
    forget_revocations(&mut clients);
    let epoch = group.group_epoch();
    converge(&mut group, &mut clients, &catalog(8), T0);
    assert_eq!(group.group_epoch(), epoch + 1);
    assert_eq!(counts(&clients), vec![4, 4]);
    assert!(clients.iter().all(|c| c.revoked.is_empty()), "growing a topic revokes nothing");
    // The topic is deleted: everything is revoked.
    converge(&mut group, &mut clients, &TopicCatalog::default(), T0);
    assert_eq!(counts(&clients), vec![0, 0]);
}

#[test]
fn range_assignor_is_used_when_members_ask_for_it() {
    let catalog = catalog(5);
    let mut group = ConsumerGroup::new("g");
    let mut client = Client::new("a");
    let mut request = client.request();
    request.server_assignor = Some("range".to_string());
    let answer = group.heartbeat(request, &catalog, T0, &TIMING).unwrap();
    client.epoch = answer.member_epoch;
    assert_eq!(group.describe().assignor, "range");
    assert_eq!(answer.assignment.map(|a| list(&a)), Some(vec![0, 1, 2, 3, 4]));
}

#[test]
fn invalid_heartbeats_are_refused_with_kafka_errors() {
    let check = |edit: fn(&mut Heartbeat), version: i16, expected: GroupError| {
        let mut request = Client::new("m").request();
        edit(&mut request);
        let result = validate_heartbeat(&request, version);
        assert_eq!(result.map_err(|r| r.error), Err(expected), "{request:?}");
    };
    check(|r| r.server_assignor = Some("sticky".into()), 1, GroupError::UnsupportedAssignor);
    check(|r| r.member_id.clear(), 1, GroupError::InvalidRequest);
    check(|r| r.subscribed_topic_regex = Some("t(".into()), 1, GroupError::InvalidRegularExpression);
    check(|r| r.subscribed_topic_regex = Some("x".repeat(5000)), 1, GroupError::InvalidRegularExpression);
    check(
        |r| {
            r.subscribed_topic_names = None;
            r.subscribed_topic_regex = None;
        },
        1,
        GroupError::InvalidRequest,
    );
    check(|r| r.rebalance_timeout_ms = -1, 1, GroupError::InvalidRequest);
    check(|r| r.owned = Some(parts(&[1])), 1, GroupError::InvalidRequest);
    check(|r| r.member_epoch = -2, 1, GroupError::InvalidRequest);
    check(|r| r.member_epoch = -3, 1, GroupError::InvalidRequest);
    check(|r| r.instance_id = Some(String::new()), 1, GroupError::InvalidRequest);
    assert!(validate_heartbeat(
        &Heartbeat { subscribed_topic_regex: Some(String::new()), ..Client::new("m").request() },
        1
    )
    .is_ok());
    assert!(validate_heartbeat(&Heartbeat { member_id: String::new(), ..Client::new("m").request() }, 0).is_ok());
    let by_pattern = Heartbeat {
        subscribed_topic_names: None,
        subscribed_topic_regex: Some("t.*".into()),
        ..Client::new("m").request()
    };
    assert!(validate_heartbeat(&by_pattern, 1).is_ok());
}

#[test]
fn a_pattern_subscribes_to_every_matching_topic_including_ones_created_later() {
    let (orders_eu, orders_us, payments, later) =
        (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3), Uuid::from_u128(4));
    let before = TopicCatalog::from_topics([
        ("orders.eu".to_string(), orders_eu, 2),
        ("orders.us".to_string(), orders_us, 1),
        ("payments".to_string(), payments, 2),
        ("x.orders.eu".to_string(), Uuid::from_u128(5), 1),
        (crate::group::OFFSETS_TOPIC.to_string(), Uuid::from_u128(6), 3),
    ]);
    let mut group = ConsumerGroup::new("g");
    let join = |member: &str| Heartbeat {
        subscribed_topic_names: None,
        subscribed_topic_regex: Some("orders\\..*|__.*".into()),
        ..Client::new(member).request()
    };
    let answer = group.heartbeat(join("m"), &before, T0, &TIMING).unwrap();
    let topics = |answer: &HeartbeatAnswer| -> BTreeMap<Uuid, usize> {
        answer.assignment.as_ref().unwrap().iter().map(|(id, p)| (*id, p.len())).collect()
    };
    // Whole names only ("x.orders.eu" does not match), internal topics too (as Kafka 4.3).
    let offsets = Uuid::from_u128(6);
    assert_eq!(topics(&answer), BTreeMap::from([(orders_eu, 2), (orders_us, 1), (offsets, 3)]));
    assert_eq!(group.describe().members[0].subscribed_topic_regex.as_deref(), Some("orders\\..*|__.*"));
    let epoch = group.group_epoch();

    // A topic created later joins at the next heartbeat, and the group epoch moves.
    let after = TopicCatalog::from_topics([
        ("orders.eu".to_string(), orders_eu, 2),
        ("orders.us".to_string(), orders_us, 1),
        ("orders.apac".to_string(), later, 4),
        ("payments".to_string(), payments, 2),
        (crate::group::OFFSETS_TOPIC.to_string(), offsets, 3),
    ]);
    let next = Heartbeat {
        member_epoch: answer.member_epoch,
        owned: answer.assignment.clone(),
        subscribed_topic_regex: None,
        ..Client::new("m").request()
    };
    let next = Heartbeat { subscribed_topic_names: None, rebalance_timeout_ms: -1, ..next };
    let answer = group.heartbeat(next, &after, T0 + 1, &TIMING).unwrap();
    assert!(group.group_epoch() > epoch);
    assert_eq!(topics(&answer), BTreeMap::from([(orders_eu, 2), (orders_us, 1), (later, 4), (offsets, 3)]));
    let subscribed = [crate::group::OFFSETS_TOPIC, "orders.apac", "orders.eu", "orders.us"];
    assert_eq!(group.subscribed_topic_names(), subscribed);

    // Clearing the pattern (an empty one) unsubscribes from all of them.
    let clear = Heartbeat {
        member_epoch: answer.member_epoch,
        owned: answer.assignment.clone(),
        subscribed_topic_names: None,
        subscribed_topic_regex: Some(String::new()),
        rebalance_timeout_ms: -1,
        ..Client::new("m").request()
    };
    group.heartbeat(clear, &after, T0 + 2, &TIMING).unwrap();
    assert!(group.subscribed_topic_names().is_empty());
}

#[test]
fn offset_commits_and_fetches_need_the_current_member_epoch() {
    let catalog = catalog(2);
    let mut group = ConsumerGroup::new("g");
    let mut clients = vec![Client::new("a")];
    converge(&mut group, &mut clients, &catalog, T0);
    let epoch = clients[0].epoch;
    assert_eq!(group.validate_commit("a", epoch, 9), Ok(()));
    assert_eq!(group.validate_commit("a", epoch - 1, 9), Err(GroupError::StaleMemberEpoch));
    assert_eq!(group.validate_commit("a", epoch, 8), Err(GroupError::UnsupportedVersion));
    assert_eq!(group.validate_commit("x", epoch, 9), Err(GroupError::UnknownMemberId));
    assert_eq!(group.validate_commit("", -1, 9), Err(GroupError::UnknownMemberId), "the group is not empty");
    assert_eq!(group.validate_fetch(Some("a"), epoch + 1), Err(GroupError::StaleMemberEpoch));
    assert_eq!(group.validate_fetch(None, -1), Ok(()));
}

/// A tiny deterministic generator (xorshift64*) so a failing seed replays exactly.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// A client that, like the Java client, keeps owning what it was told to give up until
/// its revocation callback has run (`unapplied`), and only then reports the new set.
struct LazyClient {
    client: Client,
    unapplied: Option<Assignment>,
}

impl LazyClient {
    fn beat(&mut self, group: &mut ConsumerGroup, catalog: &TopicCatalog, now_ms: i64, rng: &mut Rng) {
        if rng.below(2) == 0 {
            if let Some(assignment) = self.unapplied.take() {
                self.client.owned = assignment;
            }
        }
        match group.heartbeat(self.client.request(), catalog, now_ms, &TIMING) {
            Ok(answer) => {
                self.client.epoch = answer.member_epoch;
                if answer.assignment.is_some() {
                    self.unapplied = answer.assignment;
                }
            }
            // Fenced or removed (e.g. too slow to revoke): drop everything and rejoin.
            Err(_) => {
                self.client = Client::new(&self.client.member_id.clone());
                self.unapplied = None;
            }
        }
    }
}

fn check_lazy(group: &ConsumerGroup, clients: &[LazyClient]) {
    let owned: Vec<Client> =
        clients.iter().map(|c| Client { owned: c.client.owned.clone(), ..Client::new(&c.client.member_id) }).collect();
    check_exclusive(group, &owned);
}

#[test]
fn random_joins_leaves_crashes_and_slow_revocations_never_share_a_partition() {
    for seed in 1..=40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let catalog = catalog(12);
        let mut group = ConsumerGroup::new("g");
        let mut clients: Vec<LazyClient> = Vec::new();
        let mut now_ms = T0;
        let mut next_id = 0;
        for _ in 0..400 {
            now_ms += 100;
            match rng.below(10) {
                0 if clients.len() < 6 => {
                    next_id += 1;
                    clients.push(LazyClient { client: Client::new(&format!("m{next_id}")), unapplied: None });
                }
                1 if !clients.is_empty() => {
                    let leaving = clients.remove(rng.below(clients.len()));
                    let mut request = leaving.client.request();
                    request.member_epoch = LEAVE_GROUP_MEMBER_EPOCH;
                    let _ = group.heartbeat(request, &catalog, now_ms, &TIMING);
                }
                2 if !clients.is_empty() => {
                    // A crash: the client is gone; the broker notices when its session expires.
                    clients.remove(rng.below(clients.len()));
                }
                _ if !clients.is_empty() => {
                    let index = rng.below(clients.len());
                    clients[index].beat(&mut group, &catalog, now_ms, &mut rng);
                }
                _ => {}
            }
            group.tick(now_ms, &TIMING);
            check_lazy(&group, &clients);
        }
        // Then everyone left heartbeats regularly: crashed members expire and the group settles.
        for _ in 0..40 {
            now_ms += TIMING.consumer_heartbeat_interval_ms as i64;
            for index in 0..clients.len() {
                clients[index].beat(&mut group, &catalog, now_ms, &mut rng);
                check_lazy(&group, &clients);
            }
            group.tick(now_ms, &TIMING);
        }
        if !clients.is_empty() {
            for client in &mut clients {
                if let Some(assignment) = client.unapplied.take() {
                    client.client.owned = assignment;
                }
            }
            let mut settled: Vec<Client> = clients.into_iter().map(|c| c.client).collect();
            converge(&mut group, &mut settled, &catalog, now_ms);
            assert_eq!(counts(&settled).iter().sum::<usize>(), 12, "seed {seed}: every partition ends up owned");
        }
    }
}
