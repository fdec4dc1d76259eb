//! One consumer group's classic-protocol state machine (Kafka's `GroupMetadata` plus the
//! join/sync/heartbeat logic of its `GroupCoordinator`), kept free of I/O and clocks so it
//! can be tested deterministically: time comes in as `now_ms`, and a request that must
//! wait (JoinGroup until every member has rejoined, SyncGroup until the leader has sent
//! the assignment) gets a `oneshot::Receiver` that a later call completes.
//!
//! States: `Empty` -> `PreparingRebalance` (members rejoin) -> `CompletingRebalance`
//! (generation bumped, leader assigns) -> `Stable`, and back to `PreparingRebalance` on any
//! membership or subscription change. A group is `Dead` only once deleted.
//!
//! ```text
//! let reply = group.join(request, now_ms, &timing);   // Reply::Wait(receiver)
//! group.tick(now_ms + 100);                            // deadlines and session expiry
//! ```

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::group::error::GroupError;
use crate::group::{
    GROUP_MEMBERS_MAX, MEMBER_ASSIGNMENT_BYTES_MAX, MEMBER_METADATA_BYTES_MAX, MEMBER_PROTOCOLS_MAX,
    REBALANCE_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN,
};

/// The states of Kafka's classic group, with Kafka's names (ListGroups and DescribeGroups
/// report them verbatim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// Broker-wide timing settings the state machine needs.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of an empty group
    /// waits for more members (extended per new member, up to the rebalance timeout).
    pub initial_rebalance_delay_ms: i64,
    /// `group.consumer.heartbeat.interval.ms`, told to consumer-protocol members.
    pub consumer_heartbeat_interval_ms: i32,
    /// `group.consumer.session.timeout.ms` of consumer-protocol members.
    pub consumer_session_timeout_ms: i64,
}

/// One assignor a member supports, with its opaque (client-defined) metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocol {
    pub name: String,
    pub metadata: Bytes,
}

/// A JoinGroup request, decoded.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<Protocol>,
    /// KIP-394 (JoinGroup v4+): a member without an id first gets MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
}

/// A member as the leader sees it in the JoinGroup response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub metadata: Bytes,
}

/// The JoinGroup answer (an error still carries the member id, for MEMBER_ID_REQUIRED).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinResponse {
    pub error: Option<GroupError>,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader_id: String,
    pub member_id: String,
    pub skip_assignment: bool,
    pub members: Vec<JoinedMember>,
}

impl JoinResponse {
    pub fn failed(error: GroupError, member_id: &str) -> JoinResponse {
        JoinResponse {
            error: Some(error),
            generation_id: -1,
            protocol_type: None,
            protocol_name: None,
            leader_id: String::new(),
            member_id: member_id.to_string(),
            skip_assignment: false,
            members: Vec::new(),
        }
    }
}

/// A SyncGroup request, decoded. `assignments` is only read from the leader.
#[derive(Debug, Clone)]
pub struct SyncRequest {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignments: Vec<(String, Bytes)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncResponse {
    pub error: Option<GroupError>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncResponse {
    pub fn failed(error: GroupError) -> SyncResponse {
        SyncResponse { error: Some(error), protocol_type: None, protocol_name: None, assignment: Bytes::new() }
    }
}

/// An answer available now, or one that a later event (another member's join, the
/// leader's sync, a deadline in [`Group::tick`]) will send.
#[derive(Debug)]
pub enum Reply<T> {
    Ready(T),
    Wait(oneshot::Receiver<T>),
}

/// What DescribeGroups shows of a member.
#[derive(Debug, Clone)]
pub struct MemberDescription {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

#[derive(Debug)]
struct Member {
    member_id: String,
    group_instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: i32,
    rebalance_timeout_ms: i32,
    protocols: Vec<Protocol>,
    assignment: Bytes,
    awaiting_join: Option<oneshot::Sender<JoinResponse>>,
    awaiting_sync: Option<oneshot::Sender<SyncResponse>>,
    last_heartbeat_ms: i64,
    /// Order of arrival; the earliest joined member becomes leader when one is needed.
    joined_seq: u64,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|p| p.name == protocol).map(|p| p.metadata.clone()).unwrap_or_default()
    }

    /// A member stays alive while it waits in a join or sync: the coordinator, not the
    /// member, is the one holding things up.
    fn session_expired(&self, now_ms: i64) -> bool {
        self.awaiting_join.is_none()
            && self.awaiting_sync.is_none()
            && now_ms >= self.last_heartbeat_ms + i64::from(self.session_timeout_ms)
    }

    fn fail_waiters(&mut self, error: GroupError) {
        if let Some(sender) = self.awaiting_join.take() {
            let _ = sender.send(JoinResponse::failed(error, &self.member_id));
        }
        if let Some(sender) = self.awaiting_sync.take() {
            let _ = sender.send(SyncResponse::failed(error));
        }
    }
}

/// One classic consumer group.
#[derive(Debug)]
pub struct Group {
    group_id: String,
    state: GroupState,
    protocol_type: Option<String>,
    protocol_name: Option<String>,
    generation_id: i32,
    leader_id: Option<String>,
    members: BTreeMap<String, Member>,
    /// group.instance.id -> current member id (KIP-345).
    static_members: HashMap<String, String>,
    /// KIP-394 member ids handed out with MEMBER_ID_REQUIRED, with their expiry.
    pending_members: HashMap<String, i64>,
    /// PreparingRebalance: when the join phase ends even if members are missing.
    join_deadline_ms: i64,
    /// Set while the initial rebalance delay of a formerly empty group runs: the latest
    /// the delay may be extended to.
    initial_delay_cap_ms: Option<i64>,
    /// CompletingRebalance: when to give up waiting for SyncGroup.
    sync_deadline_ms: i64,
    next_seq: u64,
}

impl Group {
    pub fn new(group_id: &str) -> Group {
        Group {
            group_id: group_id.to_string(),
            state: GroupState::Empty,
            protocol_type: None,
            protocol_name: None,
            generation_id: 0,
            leader_id: None,
            members: BTreeMap::new(),
            static_members: HashMap::new(),
            pending_members: HashMap::new(),
            join_deadline_ms: 0,
            initial_delay_cap_ms: None,
            sync_deadline_ms: 0,
            next_seq: 0,
        }
    }

    pub fn state(&self) -> GroupState {
        self.state
    }

    #[cfg(test)]
    pub fn generation_id(&self) -> i32 {
        self.generation_id
    }

    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }

    pub fn protocol_name(&self) -> Option<&str> {
        self.protocol_name.as_deref()
    }

    #[cfg(test)]
    pub fn leader_id(&self) -> Option<&str> {
        self.leader_id.as_deref()
    }

    /// True when nothing but committed offsets (kept elsewhere) would be lost by
    /// forgetting this group: no members, and no KIP-394 newcomer about to rejoin.
    pub fn is_idle(&self) -> bool {
        self.state == GroupState::Empty && self.members.is_empty() && self.pending_members.is_empty()
    }

    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    #[cfg(test)]
    pub fn has_member(&self, member_id: &str) -> bool {
        self.members.contains_key(member_id)
    }

    /// Metadata of every member for the selected protocol (to find subscribed topics).
    pub fn member_metadata(&self) -> Vec<Bytes> {
        let protocol = self.protocol_name.as_deref().unwrap_or_default();
        self.members.values().map(|m| m.metadata_for(protocol)).collect()
    }

    /// DescribeGroups' view: metadata and assignments only once the group is Stable.
    pub fn describe_members(&self) -> Vec<MemberDescription> {
        let stable = self.state == GroupState::Stable;
        let protocol = self.protocol_name.as_deref().unwrap_or_default();
        self.members
            .values()
            .map(|m| MemberDescription {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: if stable { m.metadata_for(protocol) } else { Bytes::new() },
                assignment: if stable { m.assignment.clone() } else { Bytes::new() },
            })
            .collect()
    }

    /// Marks the group deleted: every waiter learns it must find the coordinator again.
    pub fn mark_dead(&mut self) {
        assert!(self.members.is_empty(), "only an empty group may be deleted");
        self.state = GroupState::Dead;
    }

    pub fn join(&mut self, request: JoinRequest, now_ms: i64, timing: &Timing) -> Reply<JoinResponse> {
        if let Err(error) = self.validate_join(&request) {
            return Reply::Ready(JoinResponse::failed(error, &request.member_id));
        }
        if request.member_id.is_empty() {
            self.join_new_member(request, now_ms, timing)
        } else {
            self.join_known_member(request, now_ms, timing)
        }
    }

    fn validate_join(&self, request: &JoinRequest) -> Result<(), GroupError> {
        if self.state == GroupState::Dead {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        if request.protocol_type.is_empty() || request.protocols.is_empty() {
            return Err(GroupError::InconsistentGroupProtocol);
        }
        if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&request.session_timeout_ms) {
            return Err(GroupError::InvalidSessionTimeout);
        }
        let metadata_bytes: usize = request.protocols.iter().map(|p| p.metadata.len() + p.name.len()).sum();
        if metadata_bytes > MEMBER_METADATA_BYTES_MAX || request.protocols.len() > MEMBER_PROTOCOLS_MAX {
            return Err(GroupError::MetadataTooLarge);
        }
        let others: Vec<&Member> = self.members.values().filter(|m| m.member_id != request.member_id).collect();
        if others.is_empty() {
            return Ok(());
        }
        if self.protocol_type.as_deref() != Some(request.protocol_type.as_str()) {
            return Err(GroupError::InconsistentGroupProtocol);
        }
        let supported_by_all = |name: &str| others.iter().all(|member| member.protocols.iter().any(|p| p.name == name));
        if !request.protocols.iter().any(|p| supported_by_all(&p.name)) {
            return Err(GroupError::InconsistentGroupProtocol);
        }
        Ok(())
    }

    fn new_member_id(&self, prefix: &str) -> String {
        let prefix = if prefix.is_empty() { "member" } else { prefix };
        format!("{prefix}-{}", uuid::Uuid::new_v4())
    }

    fn join_new_member(&mut self, request: JoinRequest, now_ms: i64, timing: &Timing) -> Reply<JoinResponse> {
        if let Some(instance_id) = request.group_instance_id.clone() {
            if let Some(old_member_id) = self.static_members.get(&instance_id).cloned() {
                return self.replace_static_member(&old_member_id, request, now_ms, timing);
            }
        }
        if self.members.len() + self.pending_members.len() >= GROUP_MEMBERS_MAX {
            return Reply::Ready(JoinResponse::failed(GroupError::GroupMaxSizeReached, ""));
        }
        let prefix = request.group_instance_id.clone().unwrap_or_else(|| request.client_id.clone());
        let member_id = self.new_member_id(&prefix);
        if request.require_known_member_id && request.group_instance_id.is_none() {
            // The member must come back with this id; until then it only holds a seat.
            self.pending_members.insert(member_id.clone(), now_ms + i64::from(request.session_timeout_ms));
            return Reply::Ready(JoinResponse::failed(GroupError::MemberIdRequired, &member_id));
        }
        self.add_member(member_id, request, now_ms, timing)
    }

    fn join_known_member(&mut self, request: JoinRequest, now_ms: i64, timing: &Timing) -> Reply<JoinResponse> {
        let member_id = request.member_id.clone();
        if self.pending_members.contains_key(&member_id) {
            return self.add_member(member_id, request, now_ms, timing);
        }
        if let Err(error) = self.check_member(&member_id, request.group_instance_id.as_deref()) {
            return Reply::Ready(JoinResponse::failed(error, &member_id));
        }
        let member = self.members.get_mut(&member_id).expect("checked above");
        member.last_heartbeat_ms = now_ms;
        let unchanged = member.protocols == request.protocols;
        match self.state {
            GroupState::PreparingRebalance => {
                let receiver = self.update_member(&request, now_ms);
                self.maybe_complete_join(now_ms);
                Reply::Wait(receiver)
            }
            GroupState::CompletingRebalance | GroupState::Stable
                if unchanged && !(self.state == GroupState::Stable && self.is_leader(&member_id)) =>
            {
                // The member missed our answer (or rejoins for nothing): repeat it.
                Reply::Ready(self.join_response_for(&member_id))
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                let receiver = self.update_member(&request, now_ms);
                self.prepare_rebalance(now_ms, timing);
                self.maybe_complete_join(now_ms);
                Reply::Wait(receiver)
            }
            GroupState::Empty | GroupState::Dead => {
                Reply::Ready(JoinResponse::failed(GroupError::UnknownMemberId, &member_id))
            }
        }
    }

    /// Unknown member id -> UNKNOWN_MEMBER_ID; a static member whose instance id now
    /// belongs to another member id -> FENCED_INSTANCE_ID.
    fn check_member(&self, member_id: &str, group_instance_id: Option<&str>) -> Result<(), GroupError> {
        if let Some(instance_id) = group_instance_id {
            match self.static_members.get(instance_id) {
                Some(current) if current == member_id => {}
                Some(_) => return Err(GroupError::FencedInstanceId),
                None => return Err(GroupError::UnknownMemberId),
            }
        }
        if !self.members.contains_key(member_id) {
            return Err(GroupError::UnknownMemberId);
        }
        Ok(())
    }

    fn is_leader(&self, member_id: &str) -> bool {
        self.leader_id.as_deref() == Some(member_id)
    }

    fn add_member(
        &mut self,
        member_id: String,
        request: JoinRequest,
        now_ms: i64,
        timing: &Timing,
    ) -> Reply<JoinResponse> {
        assert!(!self.members.contains_key(&member_id), "member {member_id} added twice");
        self.pending_members.remove(&member_id);
        if self.members.is_empty() {
            self.protocol_type = Some(request.protocol_type.clone());
        }
        let (sender, receiver) = oneshot::channel();
        self.next_seq += 1;
        let member = Member {
            member_id: member_id.clone(),
            group_instance_id: request.group_instance_id.clone(),
            client_id: request.client_id,
            client_host: request.client_host,
            session_timeout_ms: request.session_timeout_ms,
            rebalance_timeout_ms: request.rebalance_timeout_ms.clamp(0, REBALANCE_TIMEOUT_MS_MAX),
            protocols: request.protocols,
            assignment: Bytes::new(),
            awaiting_join: Some(sender),
            awaiting_sync: None,
            last_heartbeat_ms: now_ms,
            joined_seq: self.next_seq,
        };
        if let Some(instance_id) = &member.group_instance_id {
            self.static_members.insert(instance_id.clone(), member_id.clone());
        }
        self.members.insert(member_id, member);
        if self.state == GroupState::PreparingRebalance {
            if let Some(cap) = self.initial_delay_cap_ms {
                // Kafka's InitialDelayedJoin: each newcomer buys the others one more delay.
                self.join_deadline_ms = (now_ms + timing.initial_rebalance_delay_ms).min(cap);
            }
        }
        self.prepare_rebalance(now_ms, timing);
        self.maybe_complete_join(now_ms);
        Reply::Wait(receiver)
    }

    /// Stores the member's new protocols and timeouts and parks its join.
    fn update_member(&mut self, request: &JoinRequest, now_ms: i64) -> oneshot::Receiver<JoinResponse> {
        let member = self.members.get_mut(&request.member_id).expect("known member");
        let (sender, receiver) = oneshot::channel();
        if let Some(previous) = member.awaiting_join.replace(sender) {
            // A duplicate join on another connection: the older request loses.
            let _ = previous.send(JoinResponse::failed(GroupError::RebalanceInProgress, &request.member_id));
        }
        member.protocols = request.protocols.clone();
        member.session_timeout_ms = request.session_timeout_ms;
        member.rebalance_timeout_ms = request.rebalance_timeout_ms.clamp(0, REBALANCE_TIMEOUT_MS_MAX);
        member.client_id = request.client_id.clone();
        member.client_host = request.client_host.clone();
        member.last_heartbeat_ms = now_ms;
        receiver
    }

    /// KIP-345: a known group.instance.id rejoining without a member id takes over the old
    /// member's place. In a Stable group with unchanged metadata this costs no rebalance.
    fn replace_static_member(
        &mut self,
        old_member_id: &str,
        request: JoinRequest,
        now_ms: i64,
        timing: &Timing,
    ) -> Reply<JoinResponse> {
        let instance_id = request.group_instance_id.clone().expect("static member");
        let mut member = self.members.remove(old_member_id).expect("static member is a member");
        member.fail_waiters(GroupError::FencedInstanceId);
        let new_member_id = self.new_member_id(&instance_id);
        let previous_leader = self.leader_id.clone().unwrap_or_default();
        if self.is_leader(old_member_id) {
            self.leader_id = Some(new_member_id.clone());
        }
        let unchanged = member.protocols == request.protocols;
        member.member_id = new_member_id.clone();
        member.client_id = request.client_id.clone();
        member.client_host = request.client_host.clone();
        member.session_timeout_ms = request.session_timeout_ms;
        member.rebalance_timeout_ms = request.rebalance_timeout_ms.clamp(0, REBALANCE_TIMEOUT_MS_MAX);
        member.last_heartbeat_ms = now_ms;
        self.static_members.insert(instance_id, new_member_id.clone());
        self.members.insert(new_member_id.clone(), member);
        if self.state == GroupState::Stable && unchanged {
            // Answer with the old leader id so that even the leader does not reassign: the
            // assignment it would send could not be broadcast by a Stable group.
            let mut response = self.join_response_for(&new_member_id);
            response.leader_id = previous_leader;
            response.skip_assignment = true;
            return Reply::Ready(response);
        }
        let mut request = request;
        request.member_id = new_member_id;
        let receiver = self.update_member(&request, now_ms);
        if self.state != GroupState::PreparingRebalance {
            self.prepare_rebalance(now_ms, timing);
        }
        self.maybe_complete_join(now_ms);
        Reply::Wait(receiver)
    }

    /// The current generation's join answer for `member_id` (the leader also gets every
    /// member's metadata).
    fn join_response_for(&self, member_id: &str) -> JoinResponse {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        let members = if self.is_leader(member_id) {
            let mut ordered: Vec<&Member> = self.members.values().collect();
            ordered.sort_by_key(|m| m.joined_seq);
            ordered
                .into_iter()
                .map(|m| JoinedMember {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    metadata: m.metadata_for(&protocol),
                })
                .collect()
        } else {
            Vec::new()
        };
        JoinResponse {
            error: None,
            generation_id: self.generation_id,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader_id: self.leader_id.clone().unwrap_or_default(),
            member_id: member_id.to_string(),
            skip_assignment: false,
            members,
        }
    }

    /// Enters PreparingRebalance (from any state but Dead); a pending sync is aborted.
    fn prepare_rebalance(&mut self, now_ms: i64, timing: &Timing) {
        match self.state {
            GroupState::PreparingRebalance | GroupState::Dead => return,
            GroupState::CompletingRebalance => {
                for member in self.members.values_mut() {
                    if let Some(sender) = member.awaiting_sync.take() {
                        let _ = sender.send(SyncResponse::failed(GroupError::RebalanceInProgress));
                    }
                    member.assignment = Bytes::new();
                }
            }
            GroupState::Empty | GroupState::Stable => {}
        }
        let rebalance_timeout_ms =
            self.members.values().map(|m| i64::from(m.rebalance_timeout_ms)).max().unwrap_or_default();
        // A new group's first generation forms at a tick once the initial delay has passed,
        // a delay of 0 included (as Kafka's, which completes it from its timer): consumers
        // started together, each through its KIP-394 round trip, then share the first
        // generation. Formed at the first member's join, it held every partition until the
        // others' join forced a rebalance a heartbeat later, and they read again from the
        // last committed offsets what it had read meanwhile.
        let initial = self.state == GroupState::Empty;
        self.state = GroupState::PreparingRebalance;
        if initial {
            self.initial_delay_cap_ms = Some(now_ms + rebalance_timeout_ms);
            self.join_deadline_ms = now_ms + timing.initial_rebalance_delay_ms.min(rebalance_timeout_ms);
        } else {
            self.initial_delay_cap_ms = None;
            self.join_deadline_ms = now_ms + rebalance_timeout_ms;
        }
        tracing::debug!(group = %self.group_id, generation = self.generation_id, "preparing rebalance");
    }

    /// Completes the join phase once every member (and no KIP-394 newcomer) is waiting.
    fn maybe_complete_join(&mut self, now_ms: i64) {
        if self.state != GroupState::PreparingRebalance || self.initial_delay_cap_ms.is_some() {
            return;
        }
        let all_joined = self.members.values().all(|m| m.awaiting_join.is_some());
        if all_joined && self.pending_members.is_empty() {
            self.complete_join(now_ms);
        }
    }

    /// Ends the join phase: members that did not rejoin are dropped, the generation moves
    /// on, a protocol is chosen, and every waiting member gets its answer.
    fn complete_join(&mut self, now_ms: i64) {
        assert_eq!(self.state, GroupState::PreparingRebalance);
        let missing: Vec<String> =
            self.members.values().filter(|m| m.awaiting_join.is_none()).map(|m| m.member_id.clone()).collect();
        for member_id in missing {
            tracing::info!(group = %self.group_id, member = %member_id, "member did not rejoin in time; removed");
            self.forget_member(&member_id);
        }
        self.pending_members.clear();
        self.initial_delay_cap_ms = None;
        self.generation_id += 1;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol_name = None;
            self.leader_id = None;
            tracing::info!(group = %self.group_id, generation = self.generation_id, "group is empty");
            return;
        }
        self.protocol_name = Some(self.select_protocol());
        if !self.leader_id.as_ref().is_some_and(|leader| self.members.contains_key(leader)) {
            self.leader_id = self.members.values().min_by_key(|m| m.joined_seq).map(|m| m.member_id.clone());
        }
        self.state = GroupState::CompletingRebalance;
        let rebalance_timeout_ms =
            self.members.values().map(|m| i64::from(m.rebalance_timeout_ms)).max().unwrap_or_default();
        self.sync_deadline_ms = now_ms + rebalance_timeout_ms;
        let member_ids: Vec<String> = self.members.keys().cloned().collect();
        for member_id in member_ids {
            let response = self.join_response_for(&member_id);
            let member = self.members.get_mut(&member_id).expect("listed above");
            member.last_heartbeat_ms = now_ms;
            if let Some(sender) = member.awaiting_join.take() {
                let _ = sender.send(response);
            }
        }
        tracing::info!(
            group = %self.group_id,
            generation = self.generation_id,
            members = self.members.len(),
            protocol = self.protocol_name.as_deref().unwrap_or_default(),
            "rebalance: join phase complete"
        );
    }

    /// The protocol every member supports that most members prefer (Kafka's vote).
    fn select_protocol(&self) -> String {
        let supported_by_all =
            |name: &str| self.members.values().all(|member| member.protocols.iter().any(|p| p.name == name));
        let mut votes: Vec<(String, usize)> = Vec::new();
        let mut ordered: Vec<&Member> = self.members.values().collect();
        ordered.sort_by_key(|m| m.joined_seq);
        for member in ordered {
            let Some(choice) = member.protocols.iter().find(|p| supported_by_all(&p.name)) else { continue };
            match votes.iter_mut().find(|(name, _)| *name == choice.name) {
                Some((_, count)) => *count += 1,
                None => votes.push((choice.name.clone(), 1)),
            }
        }
        // Joins are validated against the other members, so a common protocol exists.
        let best = votes.iter().map(|(_, count)| *count).max().expect("members share a protocol");
        votes.into_iter().find(|(_, count)| *count == best).map(|(name, _)| name).expect("a winner")
    }

    /// Removes a member without touching the group state (the caller decides what next).
    fn forget_member(&mut self, member_id: &str) -> Option<Member> {
        let mut member = self.members.remove(member_id)?;
        member.fail_waiters(GroupError::UnknownMemberId);
        if let Some(instance_id) = &member.group_instance_id {
            if self.static_members.get(instance_id).map(String::as_str) == Some(member_id) {
                self.static_members.remove(instance_id);
            }
        }
        if self.is_leader(member_id) {
            self.leader_id = None;
        }
        Some(member)
    }

    /// Removes a member (leave or expiry) and rebalances the rest.
    fn remove_member(&mut self, member_id: &str, now_ms: i64, timing: &Timing) {
        if self.forget_member(member_id).is_none() {
            return;
        }
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => self.prepare_rebalance(now_ms, timing),
            GroupState::PreparingRebalance | GroupState::Empty | GroupState::Dead => {}
        }
        self.maybe_complete_join(now_ms);
    }

    pub fn sync(&mut self, request: SyncRequest, now_ms: i64) -> Reply<SyncResponse> {
        let failed = |error| Reply::Ready(SyncResponse::failed(error));
        if self.state == GroupState::Dead {
            return failed(GroupError::CoordinatorNotAvailable);
        }
        if let Err(error) = self.check_member(&request.member_id, request.group_instance_id.as_deref()) {
            return failed(error);
        }
        if request.generation_id != self.generation_id {
            return failed(GroupError::IllegalGeneration);
        }
        let mismatched = |asked: &Option<String>, ours: &Option<String>| asked.is_some() && asked != ours;
        if mismatched(&request.protocol_type, &self.protocol_type)
            || mismatched(&request.protocol_name, &self.protocol_name)
        {
            return failed(GroupError::InconsistentGroupProtocol);
        }
        match self.state {
            GroupState::Empty | GroupState::Dead => failed(GroupError::UnknownMemberId),
            GroupState::PreparingRebalance => failed(GroupError::RebalanceInProgress),
            GroupState::Stable => {
                let member = self.members.get_mut(&request.member_id).expect("checked above");
                member.last_heartbeat_ms = now_ms;
                Reply::Ready(self.sync_response(&request.member_id))
            }
            GroupState::CompletingRebalance => self.sync_completing(request, now_ms),
        }
    }

    fn sync_completing(&mut self, request: SyncRequest, now_ms: i64) -> Reply<SyncResponse> {
        if self.is_leader(&request.member_id)
            && request.assignments.iter().any(|(_, assignment)| assignment.len() > MEMBER_ASSIGNMENT_BYTES_MAX)
        {
            return Reply::Ready(SyncResponse::failed(GroupError::MetadataTooLarge));
        }
        let (sender, receiver) = oneshot::channel();
        let member = self.members.get_mut(&request.member_id).expect("checked by caller");
        member.last_heartbeat_ms = now_ms;
        if let Some(previous) = member.awaiting_sync.replace(sender) {
            let _ = previous.send(SyncResponse::failed(GroupError::RebalanceInProgress));
        }
        if !self.is_leader(&request.member_id) {
            return Reply::Wait(receiver);
        }
        let mut assignments: HashMap<String, Bytes> = request.assignments.into_iter().collect();
        for member in self.members.values_mut() {
            member.assignment = assignments.remove(&member.member_id).unwrap_or_default();
        }
        self.state = GroupState::Stable;
        let member_ids: Vec<String> = self.members.keys().cloned().collect();
        for member_id in member_ids {
            let response = self.sync_response(&member_id);
            if let Some(sender) = self.members.get_mut(&member_id).and_then(|m| m.awaiting_sync.take()) {
                let _ = sender.send(response);
            }
        }
        tracing::info!(group = %self.group_id, generation = self.generation_id, "rebalance complete: group stable");
        Reply::Wait(receiver)
    }

    fn sync_response(&self, member_id: &str) -> SyncResponse {
        SyncResponse {
            error: None,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            assignment: self.members.get(member_id).map(|m| m.assignment.clone()).unwrap_or_default(),
        }
    }

    pub fn heartbeat(
        &mut self,
        member_id: &str,
        group_instance_id: Option<&str>,
        generation_id: i32,
        now_ms: i64,
    ) -> Result<(), GroupError> {
        if self.state == GroupState::Dead {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        self.check_member(member_id, group_instance_id)?;
        if generation_id != self.generation_id {
            return Err(GroupError::IllegalGeneration);
        }
        self.members.get_mut(member_id).expect("checked above").last_heartbeat_ms = now_ms;
        match self.state {
            GroupState::PreparingRebalance => Err(GroupError::RebalanceInProgress),
            GroupState::CompletingRebalance | GroupState::Stable => Ok(()),
            GroupState::Empty | GroupState::Dead => Err(GroupError::UnknownMemberId),
        }
    }

    /// LeaveGroup for one member: by member id, or (static members, v3+) by instance id.
    pub fn leave(
        &mut self,
        member_id: &str,
        group_instance_id: Option<&str>,
        now_ms: i64,
        timing: &Timing,
    ) -> Result<(), GroupError> {
        if self.state == GroupState::Dead {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        let target = match group_instance_id {
            Some(instance_id) => match self.static_members.get(instance_id) {
                Some(current) if member_id.is_empty() || member_id == current => current.clone(),
                Some(_) => return Err(GroupError::FencedInstanceId),
                None => return Err(GroupError::UnknownMemberId),
            },
            None => member_id.to_string(),
        };
        if self.pending_members.remove(&target).is_some() {
            self.maybe_complete_join(now_ms);
            return Ok(());
        }
        if !self.members.contains_key(&target) {
            return Err(GroupError::UnknownMemberId);
        }
        tracing::info!(group = %self.group_id, member = %target, "member left");
        self.remove_member(&target, now_ms, timing);
        Ok(())
    }

    /// Whether an OffsetCommit from this member at this generation may be stored. A
    /// generation of -1 from a non-member is a "simple" consumer, allowed while the group
    /// has no members. A `transactional` commit (TxnOffsetCommit, KIP-447) is not refused
    /// while the group completes a rebalance: its offsets apply only when the transaction
    /// commits.
    pub fn validate_commit(
        &mut self,
        member_id: &str,
        group_instance_id: Option<&str>,
        generation_id: i32,
        transactional: bool,
        now_ms: i64,
    ) -> Result<(), GroupError> {
        if self.state == GroupState::Dead {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        if let Some(instance_id) = group_instance_id {
            if self.static_members.get(instance_id).is_some_and(|current| current != member_id) {
                return Err(GroupError::FencedInstanceId);
            }
        }
        if generation_id < 0 && self.state == GroupState::Empty {
            return Ok(());
        }
        if !transactional && self.state == GroupState::CompletingRebalance {
            return Err(GroupError::RebalanceInProgress);
        }
        let Some(member) = self.members.get_mut(member_id) else { return Err(GroupError::UnknownMemberId) };
        if generation_id != self.generation_id {
            return Err(GroupError::IllegalGeneration);
        }
        member.last_heartbeat_ms = now_ms;
        Ok(())
    }

    /// Deadlines: KIP-394 seats and sessions expire, a join phase or a sync wait ends.
    pub fn tick(&mut self, now_ms: i64, timing: &Timing) {
        if self.state == GroupState::Dead {
            return;
        }
        let pending_before = self.pending_members.len();
        self.pending_members.retain(|_, expiry_ms| *expiry_ms > now_ms);
        if self.pending_members.len() != pending_before {
            self.maybe_complete_join(now_ms);
        }
        let expired: Vec<String> =
            self.members.values().filter(|m| m.session_expired(now_ms)).map(|m| m.member_id.clone()).collect();
        for member_id in expired {
            tracing::info!(group = %self.group_id, member = %member_id, "session expired; member removed");
            self.remove_member(&member_id, now_ms, timing);
        }
        match self.state {
            GroupState::PreparingRebalance if now_ms >= self.join_deadline_ms => {
                if let Some(cap) = self.initial_delay_cap_ms.take() {
                    // The initial delay is over: from now on the usual rule applies.
                    self.join_deadline_ms = cap;
                    self.maybe_complete_join(now_ms);
                } else {
                    self.complete_join(now_ms);
                }
            }
            GroupState::CompletingRebalance if now_ms >= self.sync_deadline_ms => {
                let silent: Vec<String> =
                    self.members.values().filter(|m| m.awaiting_sync.is_none()).map(|m| m.member_id.clone()).collect();
                tracing::info!(group = %self.group_id, missing = silent.len(), "sync timed out; rebalancing");
                for member_id in silent {
                    self.forget_member(&member_id);
                }
                self.prepare_rebalance(now_ms, timing);
                self.maybe_complete_join(now_ms);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
