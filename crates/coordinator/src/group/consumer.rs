//! One consumer-protocol group (KIP-848, `group.protocol=consumer`): membership driven by
//! ConsumerGroupHeartbeat, a target assignment computed on the broker by a server-side
//! assignor, and incremental reconciliation of every member towards it.
//!
//! Why it is separate from the classic state machine (`state.rs`): the two protocols share
//! nothing but the group id space and the committed offsets. Here there is no join or sync
//! barrier and no long-poll: every heartbeat is answered at once with the member's current
//! assignment, and the group converges over several heartbeats.
//!
//! Three epochs (as in Kafka's `GroupMetadataManager`):
//! - the *group epoch* moves whenever the assignment inputs change (members, their
//!   subscriptions or assignor, the partition counts of subscribed topics);
//! - the *assignment epoch* is the group epoch the target assignment was computed for;
//! - each *member epoch* is the assignment epoch the member has reconciled to.
//!
//! Incremental revocation (Kafka's `CurrentAssignmentBuilder`): a member first keeps the
//! intersection of what it has and its target; partitions it must give up stay *pending
//! revocation* (still owned) until a heartbeat lists its owned partitions without them.
//! Only then does it advance to the target epoch, and a partition that another member
//! still owns is handed over only once that member released it (*unreleased*). So no
//! partition is ever owned by two members: [`ConsumerGroup::owners`] maps each owned
//! partition to its single owner, and nothing is granted while another owner exists.
//!
//! Regular-expression subscriptions (`subscribed_topic_regex`, KIP-848's broker-side
//! patterns): a member's topics are its names plus every topic whose whole name the pattern
//! matches (RE2 syntax, as Kafka's RE2/J), internal topics such as `__consumer_offsets`
//! included, as Kafka 4.3's coordinator resolves them over every topic of its metadata;
//! resolved again whenever the topic catalog changes, so a topic created later joins the
//! assignment at the next heartbeat.
//!
//! I/O-free and clock-free like `state.rs`: time comes in as `now_ms`, topic metadata as a
//! [`TopicCatalog`] snapshot.
//!
//! ```text
//! let answer = group.heartbeat(request, &catalog, now_ms, &timing)?;  // epoch, assignment
//! group.tick(now_ms, &timing);                                        // session expiry
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};

use uuid::Uuid;

use crate::group::assignor::{self, partitions_of, Assignment, Assignor, Subscriber, ASSIGNORS};
use crate::group::error::{GroupError, GroupRefusal};
use crate::group::state::Timing;
use crate::group::GROUP_MEMBERS_MAX;
use sluice_meta::topics::TopicCatalog;

/// Member epochs with a meaning of their own (Kafka's `ConsumerGroupHeartbeatRequest`).
pub const JOIN_GROUP_MEMBER_EPOCH: i32 = 0;
pub const LEAVE_GROUP_MEMBER_EPOCH: i32 = -1;
pub const LEAVE_GROUP_STATIC_MEMBER_EPOCH: i32 = -2;
/// From ConsumerGroupHeartbeat v1 the client generates its member id (KIP-1082).
pub const CLIENT_MEMBER_ID_VERSION: i16 = 1;
/// OffsetCommit v9 and OffsetFetch v9 carry the member epoch of consumer-protocol members.
pub const OFFSETS_MEMBER_EPOCH_VERSION: i16 = 9;
/// Member and instance ids longer than this are refused (Kafka's are 22-36 characters).
pub const MEMBER_ID_BYTES_MAX: usize = 256;
/// Topic names one member may subscribe to.
pub const SUBSCRIBED_TOPICS_MAX: usize = 10_000;
/// Longest subscription pattern accepted (bytes of its source).
pub const SUBSCRIBED_TOPIC_REGEX_BYTES_MAX: usize = 4096;
/// Memory one compiled subscription pattern may take (the `regex` crate's size limit).
const SUBSCRIBED_TOPIC_REGEX_COMPILED_BYTES_MAX: usize = 1 << 20;

/// A subscription pattern: its source as the client sent it and its compiled form, which
/// matches whole topic names only (Kafka's `Pattern.matcher(topic).matches()`).
#[derive(Debug, Clone)]
struct TopicRegex {
    source: String,
    compiled: regex::Regex,
}

impl TopicRegex {
    fn compile(source: &str) -> Result<TopicRegex, GroupRefusal> {
        let invalid = |why: String| GroupError::InvalidRegularExpression.because(why);
        if source.len() > SUBSCRIBED_TOPIC_REGEX_BYTES_MAX {
            return Err(invalid(format!(
                "SubscribedTopicRegex is longer than {SUBSCRIBED_TOPIC_REGEX_BYTES_MAX} bytes."
            )));
        }
        let compiled = regex::RegexBuilder::new(&format!("^(?:{source})$"))
            .size_limit(SUBSCRIBED_TOPIC_REGEX_COMPILED_BYTES_MAX)
            .build()
            .map_err(|e| invalid(format!("SubscribedTopicRegex {source:?} is invalid: {e}")))?;
        Ok(TopicRegex { source: source.to_string(), compiled })
    }

    /// Topics of `catalog` the pattern matches, internal ones included (Kafka's rule).
    fn resolve(&self, catalog: &TopicCatalog) -> BTreeSet<String> {
        catalog.names().filter(|name| self.compiled.is_match(name)).map(str::to_string).collect()
    }
}

/// Kafka's consumer-group states (ListGroups and ConsumerGroupDescribe show the names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerGroupState {
    Empty,
    Assigning,
    Reconciling,
    Stable,
}

impl ConsumerGroupState {
    pub fn name(self) -> &'static str {
        match self {
            ConsumerGroupState::Empty => "Empty",
            ConsumerGroupState::Assigning => "Assigning",
            ConsumerGroupState::Reconciling => "Reconciling",
            ConsumerGroupState::Stable => "Stable",
        }
    }
}

/// Where a member is on its way to its target assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// At the assignment epoch with everything it was assigned.
    Stable,
    /// Must first give up `pending_revocation`; its epoch has not moved yet.
    UnrevokedPartitions,
    /// At the assignment epoch, waiting for partitions other members still own.
    UnreleasedPartitions,
}

/// A ConsumerGroupHeartbeat, decoded. `None` fields were not sent (unchanged).
#[derive(Debug, Clone, Default)]
pub struct Heartbeat {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1 when not sent.
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// The partitions the member owns now (sent on join and after each reconciliation).
    pub owned: Option<Assignment>,
    pub client_id: String,
    pub client_host: String,
}

/// The answer to a heartbeat. `assignment` is `None` when unchanged, as in Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatAnswer {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    pub assignment: Option<Assignment>,
}

/// A member as ConsumerGroupDescribe shows it.
#[derive(Debug, Clone)]
pub struct MemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub assignment: Assignment,
    pub target_assignment: Assignment,
}

/// A group as ConsumerGroupDescribe shows it.
#[derive(Debug, Clone)]
pub struct GroupDescription {
    pub state: ConsumerGroupState,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub assignor: &'static str,
    pub members: Vec<MemberDescription>,
}

#[derive(Debug)]
struct Member {
    member_id: String,
    instance_id: Option<String>,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    rebalance_timeout_ms: i32,
    /// Topics subscribed by name.
    subscribed_topic_names: BTreeSet<String>,
    /// The subscription pattern, if any, and the topics it matched at `regex_catalog`.
    subscribed_topic_regex: Option<TopicRegex>,
    regex_topics: BTreeSet<String>,
    regex_catalog: Option<u64>,
    server_assignor: Option<Assignor>,
    member_epoch: i32,
    previous_member_epoch: i32,
    state: MemberState,
    /// What the member was told it owns.
    assigned: Assignment,
    /// What it must give up; still owned until acknowledged.
    pending_revocation: Assignment,
    last_heartbeat_ms: i64,
    /// Set while partitions are pending revocation: the member is removed if it has not
    /// revoked them by then (its rebalance timeout, as in Kafka).
    revocation_deadline_ms: Option<i64>,
    /// A static member that left with epoch -2: it keeps its partitions for a session
    /// timeout so that its replacement (same instance id) gets them back.
    left_static: bool,
}

impl Member {
    /// Every topic the member subscribes to: by name or through its pattern.
    fn topics(&self) -> BTreeSet<String> {
        self.subscribed_topic_names.union(&self.regex_topics).cloned().collect()
    }

    /// Matches the pattern against `catalog` unless it already did; true if its topics changed.
    fn resolve_regex(&mut self, catalog: &TopicCatalog) -> bool {
        let Some(regex) = &self.subscribed_topic_regex else { return false };
        if self.regex_catalog == Some(catalog.generation()) {
            return false;
        }
        self.regex_catalog = Some(catalog.generation());
        let matched = regex.resolve(catalog);
        let changed = matched != self.regex_topics;
        self.regex_topics = matched;
        changed
    }
}

/// One consumer-protocol group.
#[derive(Debug)]
pub struct ConsumerGroup {
    group_id: String,
    group_epoch: i32,
    assignment_epoch: i32,
    members: BTreeMap<String, Member>,
    /// instance id -> member id (static members).
    static_members: HashMap<String, String>,
    /// The target assignment of every member, computed for `assignment_epoch`.
    target: BTreeMap<String, Assignment>,
    /// The single owner of every owned partition (assigned or pending revocation).
    owners: HashMap<(Uuid, i32), String>,
    /// Subscribers per subscribed topic name, so metadata checks visit each name once.
    subscription_counts: BTreeMap<String, usize>,
    /// Id and partition count of every subscribed topic that exists, as the target
    /// assignment last saw them; a difference with the catalog moves the group epoch.
    subscribed_metadata: BTreeMap<String, (Uuid, i32)>,
    assignor: Assignor,
}

fn intersects(a: &Assignment, b: &Assignment) -> bool {
    a.iter().any(|(topic, partitions)| b.get(topic).is_some_and(|other| !partitions.is_disjoint(other)))
}

fn is_subset(a: &Assignment, b: &Assignment) -> bool {
    a.iter().all(|(topic, partitions)| partitions.is_empty() || b.get(topic).is_some_and(|o| partitions.is_subset(o)))
}

/// `a` minus `b`, or `a` and `b` with `keep_common`.
fn split(a: &Assignment, b: &Assignment, keep_common: bool) -> Assignment {
    let mut out = Assignment::new();
    for (topic, partition) in partitions_of(a) {
        if b.get(&topic).is_some_and(|p| p.contains(&partition)) == keep_common {
            out.entry(topic).or_default().insert(partition);
        }
    }
    out
}

/// Checks what needs no group state, as Kafka's `throwIfConsumerGroupHeartbeatRequestIsInvalid`.
pub fn validate_heartbeat(request: &Heartbeat, version: i16) -> Result<(), GroupRefusal> {
    let invalid = |message: &str| Err(GroupError::InvalidRequest.because(message));
    let epoch = request.member_epoch;
    if (version >= CLIENT_MEMBER_ID_VERSION || epoch > 0 || epoch == LEAVE_GROUP_MEMBER_EPOCH)
        && request.member_id.is_empty()
    {
        return invalid("MemberId can't be empty.");
    }
    let too_long = |s: &Option<String>| s.as_ref().is_some_and(|s| s.len() > MEMBER_ID_BYTES_MAX);
    if request.member_id.len() > MEMBER_ID_BYTES_MAX || too_long(&request.instance_id) || too_long(&request.rack_id) {
        return invalid("MemberId, InstanceId or RackId is too long.");
    }
    if request.instance_id.as_deref() == Some("") {
        return invalid("InstanceId can't be empty.");
    }
    if request.rack_id.as_deref() == Some("") {
        return invalid("RackId can't be empty.");
    }
    if request.subscribed_topic_names.as_ref().is_some_and(|names| names.len() > SUBSCRIBED_TOPICS_MAX) {
        return invalid("SubscribedTopicNames has too many topics.");
    }
    // An empty regex subscribes to nothing (librdkafka sends one along with topic names).
    if let Some(regex) = request.subscribed_topic_regex.as_deref().filter(|regex| !regex.is_empty()) {
        TopicRegex::compile(regex)?;
    }
    if epoch == JOIN_GROUP_MEMBER_EPOCH {
        if request.rebalance_timeout_ms == -1 {
            return invalid("RebalanceTimeoutMs must be provided in first request.");
        }
        if request.owned.as_ref().is_none_or(|owned| !owned.is_empty()) {
            return invalid("TopicPartitions must be empty when (re-)joining.");
        }
        if request.subscribed_topic_names.is_none() && request.subscribed_topic_regex.is_none() {
            return invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.");
        }
    } else if epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH && request.instance_id.is_none() {
        return invalid("InstanceId can't be null.");
    } else if epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH {
        return invalid("MemberEpoch is invalid.");
    }
    if let Some(name) = &request.server_assignor {
        if Assignor::from_name(name).is_none() {
            let supported: Vec<&str> = ASSIGNORS.iter().map(|a| a.name()).collect();
            let message =
                format!("ServerAssignor {name} is not supported. Supported assignors: {}.", supported.join(", "));
            return Err(GroupError::UnsupportedAssignor.because(message));
        }
    }
    Ok(())
}

impl ConsumerGroup {
    pub fn new(group_id: &str) -> ConsumerGroup {
        ConsumerGroup {
            group_id: group_id.to_string(),
            group_epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            static_members: HashMap::new(),
            target: BTreeMap::new(),
            owners: HashMap::new(),
            subscription_counts: BTreeMap::new(),
            subscribed_metadata: BTreeMap::new(),
            assignor: ASSIGNORS[0],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    #[cfg(test)]
    pub fn group_epoch(&self) -> i32 {
        self.group_epoch
    }

    /// Topic names any member subscribes to (OffsetDelete refuses to delete those).
    pub fn subscribed_topic_names(&self) -> Vec<String> {
        self.subscription_counts.keys().cloned().collect()
    }

    pub fn state(&self) -> ConsumerGroupState {
        if self.members.is_empty() {
            return ConsumerGroupState::Empty;
        }
        if self.group_epoch > self.assignment_epoch {
            return ConsumerGroupState::Assigning;
        }
        let reconciled =
            |m: &Member| m.left_static || (m.state == MemberState::Stable && m.member_epoch == self.assignment_epoch);
        if self.members.values().all(reconciled) {
            ConsumerGroupState::Stable
        } else {
            ConsumerGroupState::Reconciling
        }
    }

    /// One heartbeat: join, leave, or report and get the current assignment.
    pub fn heartbeat(
        &mut self,
        request: Heartbeat,
        catalog: &TopicCatalog,
        now_ms: i64,
        timing: &Timing,
    ) -> Result<HeartbeatAnswer, GroupRefusal> {
        match request.member_epoch {
            LEAVE_GROUP_MEMBER_EPOCH => self.leave(&request),
            LEAVE_GROUP_STATIC_MEMBER_EPOCH => self.leave_static(&request),
            JOIN_GROUP_MEMBER_EPOCH => {
                let (member_id, joined) = self.join(&request, now_ms)?;
                self.update_and_reconcile(&member_id, request, joined, catalog, now_ms, timing)
            }
            _ => {
                let member_id = self.check_member(&request)?;
                self.update_and_reconcile(&member_id, request, false, catalog, now_ms, timing)
            }
        }
    }

    /// The member a static member's request refers to; Kafka's checks for static members.
    fn static_member_id(&self, instance_id: &str, member_id: &str) -> Result<String, GroupRefusal> {
        let Some(current) = self.static_members.get(instance_id) else {
            return Err(GroupError::UnknownMemberId.because(format!("Instance id {instance_id} is unknown.")));
        };
        if current != member_id {
            let message =
                format!("The static member {member_id} with instance id {instance_id} was fenced by member {current}.");
            return Err(GroupError::FencedInstanceId.because(message));
        }
        Ok(current.clone())
    }

    fn known_member_id(&self, request: &Heartbeat) -> Result<String, GroupRefusal> {
        if let Some(instance_id) = &request.instance_id {
            return self.static_member_id(instance_id, &request.member_id);
        }
        if !self.members.contains_key(&request.member_id) {
            let message = format!("Member {} is not a member of group {}.", request.member_id, self.group_id);
            return Err(GroupError::UnknownMemberId.because(message));
        }
        Ok(request.member_id.clone())
    }

    /// Fencing of a heartbeat with a positive epoch (Kafka's `throwIfMemberEpochIsInvalid`):
    /// a newer epoch than ours, or an older one other than the previous epoch with owned
    /// partitions within the assignment (the response that bumped it may have been lost).
    fn check_member(&self, request: &Heartbeat) -> Result<String, GroupRefusal> {
        let member_id = self.known_member_id(request)?;
        let member = &self.members[&member_id];
        let received = request.member_epoch;
        let fenced = |relation: &str| {
            let message = format!(
                "The consumer group member has a {relation} member epoch ({received}) than the one known by the group \
                 coordinator ({}). The member must abandon all its partitions and rejoin.",
                member.member_epoch
            );
            Err(GroupError::FencedMemberEpoch.because(message))
        };
        if member.left_static || received > member.member_epoch {
            return fenced("greater");
        }
        if received < member.member_epoch {
            let owned_within = request.owned.as_ref().is_some_and(|owned| is_subset(owned, &member.assigned));
            if received != member.previous_member_epoch || !owned_within {
                return fenced("smaller");
            }
        }
        Ok(member_id)
    }

    /// Epoch 0: a new member, a known member rejoining, or a static member replacing its
    /// departed predecessor. Returns the member id and whether the member is new.
    fn join(&mut self, request: &Heartbeat, now_ms: i64) -> Result<(String, bool), GroupRefusal> {
        let member_id = &request.member_id;
        if let Some(instance_id) = &request.instance_id {
            if let Some(previous_id) = self.static_members.get(instance_id).cloned() {
                if previous_id != *member_id {
                    if !self.members[&previous_id].left_static {
                        let message =
                            format!("Static member {previous_id} with instance id {instance_id} is not released yet.");
                        return Err(GroupError::UnreleasedInstanceId.because(message));
                    }
                    self.replace_static_member(&previous_id, member_id);
                    return Ok((member_id.clone(), false));
                }
            }
        }
        if let Some(member) = self.members.get_mut(member_id) {
            member.left_static = false;
            return Ok((member_id.clone(), false));
        }
        if self.members.len() >= GROUP_MEMBERS_MAX {
            return Err(GroupError::GroupMaxSizeReached.because("The consumer group has reached its maximum capacity."));
        }
        let member = Member {
            member_id: member_id.clone(),
            instance_id: request.instance_id.clone(),
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            rebalance_timeout_ms: request.rebalance_timeout_ms,
            subscribed_topic_names: BTreeSet::new(),
            subscribed_topic_regex: None,
            regex_topics: BTreeSet::new(),
            regex_catalog: None,
            server_assignor: None,
            member_epoch: JOIN_GROUP_MEMBER_EPOCH,
            previous_member_epoch: JOIN_GROUP_MEMBER_EPOCH,
            state: MemberState::Stable,
            assigned: Assignment::new(),
            pending_revocation: Assignment::new(),
            last_heartbeat_ms: now_ms,
            revocation_deadline_ms: None,
            left_static: false,
        };
        if let Some(instance_id) = &request.instance_id {
            self.static_members.insert(instance_id.clone(), member_id.clone());
        }
        self.members.insert(member_id.clone(), member);
        tracing::info!(group = %self.group_id, member = %member_id, "consumer-protocol member joined");
        Ok((member_id.clone(), true))
    }

    /// A static member's new incarnation takes over its predecessor's epoch, partitions and
    /// target, so the group does not rebalance (KIP-345 for the consumer protocol).
    fn replace_static_member(&mut self, previous_id: &str, member_id: &str) {
        let mut member = self.members.remove(previous_id).expect("static members are members");
        member.member_id = member_id.to_string();
        member.left_static = false;
        for partition in partitions_of(&member.assigned) {
            self.owners.insert(partition, member_id.to_string());
        }
        if let Some(target) = self.target.remove(previous_id) {
            self.target.insert(member_id.to_string(), target);
        }
        let instance_id = member.instance_id.clone().expect("static members have an instance id");
        self.static_members.insert(instance_id, member_id.to_string());
        self.members.insert(member_id.to_string(), member);
        tracing::info!(group = %self.group_id, previous = previous_id, member = member_id, "static member replaced");
    }

    /// Applies what the heartbeat changed, moves the group epoch if the assignment inputs
    /// changed, recomputes the target if needed and reconciles this member.
    fn update_and_reconcile(
        &mut self,
        member_id: &str,
        request: Heartbeat,
        joined: bool,
        catalog: &TopicCatalog,
        now_ms: i64,
        timing: &Timing,
    ) -> Result<HeartbeatAnswer, GroupRefusal> {
        let mut inputs_changed = joined;
        // A new pattern is compiled before anything changes, so a refusal leaves no trace.
        let current_regex = self.members[member_id].subscribed_topic_regex.as_ref().map(|r| r.source.as_str());
        let new_regex = match request.subscribed_topic_regex.as_deref() {
            Some(source) if source != current_regex.unwrap_or("") => {
                Some(if source.is_empty() { None } else { Some(TopicRegex::compile(source)?) })
            }
            _ => None,
        };
        let member = self.members.get_mut(member_id).expect("joined or checked by the caller");
        member.last_heartbeat_ms = now_ms;
        member.client_id = request.client_id;
        member.client_host = request.client_host;
        if request.rack_id.is_some() {
            member.rack_id = request.rack_id;
        }
        if request.rebalance_timeout_ms > 0 {
            member.rebalance_timeout_ms = request.rebalance_timeout_ms;
        }
        if let Some(name) = request.server_assignor {
            let assignor = Assignor::from_name(&name);
            inputs_changed |= assignor != member.server_assignor;
            member.server_assignor = assignor;
        }
        let before = member.topics();
        if let Some(names) = request.subscribed_topic_names {
            member.subscribed_topic_names = names.into_iter().collect();
        }
        if let Some(regex) = new_regex {
            member.subscribed_topic_regex = regex;
            member.regex_topics.clear();
            member.regex_catalog = None;
        }
        member.resolve_regex(catalog);
        let after = member.topics();
        let removed_names: BTreeSet<String> = before.difference(&after).cloned().collect();
        let added_names: BTreeSet<String> = after.difference(&before).cloned().collect();
        inputs_changed |= !removed_names.is_empty() || !added_names.is_empty();
        self.count_subscriptions(&removed_names, &added_names);
        inputs_changed |= self.resolve_regexes(catalog);
        inputs_changed |= self.refresh_metadata(catalog);
        if inputs_changed {
            self.group_epoch += 1;
        }
        self.compute_target_if_needed();
        let before = self.members[member_id].assigned.clone();
        self.reconcile(member_id, request.owned.as_ref(), now_ms);
        let member = &self.members[member_id];
        let changed = member.assigned != before;
        let unacknowledged = request.owned.as_ref().is_some_and(|owned| *owned != member.assigned);
        let send = request.member_epoch == JOIN_GROUP_MEMBER_EPOCH || changed || unacknowledged;
        Ok(HeartbeatAnswer {
            member_id: member_id.to_string(),
            member_epoch: member.member_epoch,
            heartbeat_interval_ms: timing.consumer_heartbeat_interval_ms,
            assignment: send.then(|| member.assigned.clone()),
        })
    }

    fn count_subscriptions(&mut self, removed: &BTreeSet<String>, added: &BTreeSet<String>) {
        for name in added {
            *self.subscription_counts.entry(name.clone()).or_default() += 1;
        }
        for name in removed {
            let count = self.subscription_counts.get_mut(name).expect("a removed name was counted");
            *count -= 1;
            if *count == 0 {
                self.subscription_counts.remove(name);
            }
        }
        let counts = &self.subscription_counts;
        self.subscribed_metadata.retain(|name, _| counts.contains_key(name));
    }

    /// Matches every member's pattern against a changed catalog; true if any member's topics
    /// changed (a created or deleted topic the pattern matches).
    fn resolve_regexes(&mut self, catalog: &TopicCatalog) -> bool {
        let mut changes = Vec::new();
        for member in self.members.values_mut() {
            let before = member.topics();
            if member.resolve_regex(catalog) {
                changes.push((before, member.topics()));
            }
        }
        for (before, after) in &changes {
            let removed = before.difference(after).cloned().collect();
            let added = after.difference(before).cloned().collect();
            self.count_subscriptions(&removed, &added);
        }
        !changes.is_empty()
    }

    /// Compares the subscribed topics with the catalog; true if ids or counts changed.
    fn refresh_metadata(&mut self, catalog: &TopicCatalog) -> bool {
        let fresh: BTreeMap<String, (Uuid, i32)> = self
            .subscription_counts
            .keys()
            .filter_map(|name| catalog.get(name).map(|metadata| (name.clone(), metadata)))
            .collect();
        if fresh == self.subscribed_metadata {
            return false;
        }
        tracing::info!(group = %self.group_id, "subscribed topic metadata changed");
        self.subscribed_metadata = fresh;
        true
    }

    /// The assignor most members ask for; the default when none asks.
    fn select_assignor(&self) -> Assignor {
        let mut votes: BTreeMap<Assignor, usize> = BTreeMap::new();
        for assignor in self.members.values().filter_map(|m| m.server_assignor) {
            *votes.entry(assignor).or_default() += 1;
        }
        let most = votes.values().copied().max().unwrap_or_default();
        ASSIGNORS.into_iter().find(|a| most > 0 && votes.get(a) == Some(&most)).unwrap_or(ASSIGNORS[0])
    }

    /// Computes the target assignment for the current group epoch (once per epoch).
    fn compute_target_if_needed(&mut self) {
        if self.group_epoch <= self.assignment_epoch {
            return;
        }
        let assignor = self.select_assignor();
        let partitions_by_topic: BTreeMap<Uuid, i32> = self.subscribed_metadata.values().copied().collect();
        let subscribers: Vec<Subscriber<'_>> = self
            .members
            .values()
            .map(|m| Subscriber {
                member_id: &m.member_id,
                topics: m.topics().iter().filter_map(|n| self.subscribed_metadata.get(n)).map(|(id, _)| *id).collect(),
                previous: self.target.get(&m.member_id),
            })
            .collect();
        let target = assignor::assign(assignor, &subscribers, &partitions_by_topic);
        assert_eq!(target.len(), self.members.len(), "every member has a target");
        self.target = target;
        self.assignor = assignor;
        self.assignment_epoch = self.group_epoch;
        tracing::info!(
            group = %self.group_id,
            epoch = self.group_epoch,
            members = self.members.len(),
            assignor = assignor.name(),
            "consumer group: new target assignment"
        );
    }

    /// Moves one member towards its target (Kafka's `CurrentAssignmentBuilder`).
    fn reconcile(&mut self, member_id: &str, owned: Option<&Assignment>, now_ms: i64) {
        let member = self.members.get_mut(member_id).expect("reconciled members exist");
        match member.state {
            MemberState::Stable if member.member_epoch == self.assignment_epoch => return,
            MemberState::UnrevokedPartitions => {
                // Still holding revoked partitions (or not saying): wait for the next heartbeat.
                if owned.is_none_or(|owned| intersects(owned, &member.pending_revocation)) {
                    return;
                }
                let revoked = std::mem::take(&mut member.pending_revocation);
                member.revocation_deadline_ms = None;
                self.release(member_id, &revoked);
            }
            MemberState::Stable | MemberState::UnreleasedPartitions => {}
        }
        self.next_assignment(member_id, owned, now_ms);
    }

    /// Forgets the ownership of `partitions` by `member_id`.
    fn release(&mut self, member_id: &str, partitions: &Assignment) {
        for partition in partitions_of(partitions) {
            if self.owners.get(&partition).is_some_and(|owner| owner == member_id) {
                self.owners.remove(&partition);
            }
        }
    }

    fn next_assignment(&mut self, member_id: &str, owned: Option<&Assignment>, now_ms: i64) {
        let target = self.target.get(member_id).cloned().unwrap_or_default();
        let member = self.members.get_mut(member_id).expect("reconciled members exist");
        let keep = split(&member.assigned, &target, true);
        let revoke = split(&member.assigned, &target, false);
        if !revoke.is_empty() && owned.is_none_or(|owned| intersects(owned, &revoke)) {
            member.assigned = keep;
            member.pending_revocation = revoke;
            member.state = MemberState::UnrevokedPartitions;
            member.revocation_deadline_ms = Some(now_ms + i64::from(member.rebalance_timeout_ms.max(0)));
            return;
        }
        let wanted = split(&target, &member.assigned, false);
        self.release(member_id, &revoke);
        let mut assigned = keep;
        let mut unreleased = false;
        for partition in partitions_of(&wanted) {
            match self.owners.get(&partition) {
                Some(owner) if owner != member_id => unreleased = true,
                _ => {
                    self.owners.insert(partition, member_id.to_string());
                    assigned.entry(partition.0).or_default().insert(partition.1);
                }
            }
        }
        let member = self.members.get_mut(member_id).expect("reconciled members exist");
        member.assigned = assigned;
        member.pending_revocation.clear();
        member.revocation_deadline_ms = None;
        if member.member_epoch != self.assignment_epoch {
            member.previous_member_epoch = member.member_epoch;
            member.member_epoch = self.assignment_epoch;
        }
        member.state = if unreleased { MemberState::UnreleasedPartitions } else { MemberState::Stable };
    }

    /// Epoch -1: the member leaves and its partitions go to the others.
    fn leave(&mut self, request: &Heartbeat) -> Result<HeartbeatAnswer, GroupRefusal> {
        let member_id = self.known_member_id(request)?;
        tracing::info!(group = %self.group_id, member = %member_id, "consumer-protocol member left");
        self.remove_member(&member_id);
        Ok(HeartbeatAnswer {
            member_id,
            member_epoch: LEAVE_GROUP_MEMBER_EPOCH,
            heartbeat_interval_ms: 0,
            assignment: None,
        })
    }

    /// Epoch -2: a static member leaves for now; it keeps its partitions (unconsumed) for
    /// a session timeout, and what it was revoking is released at once.
    fn leave_static(&mut self, request: &Heartbeat) -> Result<HeartbeatAnswer, GroupRefusal> {
        let instance_id = request.instance_id.as_deref().expect("validated: epoch -2 carries an instance id");
        let member_id = self.static_member_id(instance_id, &request.member_id)?;
        let member = self.members.get_mut(&member_id).expect("static members are members");
        member.left_static = true;
        let revoked = std::mem::take(&mut member.pending_revocation);
        member.revocation_deadline_ms = None;
        member.state = MemberState::Stable;
        self.release(&member_id, &revoked);
        tracing::info!(group = %self.group_id, member = %member_id, instance = instance_id, "static member left for now");
        Ok(HeartbeatAnswer {
            member_id,
            member_epoch: LEAVE_GROUP_STATIC_MEMBER_EPOCH,
            heartbeat_interval_ms: 0,
            assignment: None,
        })
    }

    fn remove_member(&mut self, member_id: &str) {
        let Some(member) = self.members.remove(member_id) else { return };
        self.release(member_id, &member.assigned);
        self.release(member_id, &member.pending_revocation);
        if let Some(instance_id) = &member.instance_id {
            if self.static_members.get(instance_id).is_some_and(|current| current == member_id) {
                self.static_members.remove(instance_id);
            }
        }
        self.target.remove(member_id);
        self.count_subscriptions(&member.topics(), &BTreeSet::new());
        self.group_epoch += 1;
        self.compute_target_if_needed();
    }

    /// Removes members whose session expired or who did not revoke in time.
    pub fn tick(&mut self, now_ms: i64, timing: &Timing) {
        let expired: Vec<(String, &'static str)> = self
            .members
            .values()
            .filter_map(|m| {
                if now_ms >= m.last_heartbeat_ms + timing.consumer_session_timeout_ms {
                    Some((m.member_id.clone(), "session expired"))
                } else if m.revocation_deadline_ms.is_some_and(|deadline| now_ms >= deadline) {
                    Some((m.member_id.clone(), "did not revoke partitions within its rebalance timeout"))
                } else {
                    None
                }
            })
            .collect();
        for (member_id, reason) in expired {
            tracing::info!(group = %self.group_id, member = %member_id, reason, "consumer-protocol member removed");
            self.remove_member(&member_id);
        }
    }

    /// OffsetCommit from this member at this epoch (Kafka's `ConsumerGroup.validateOffsetCommit`).
    /// A negative epoch from outside the group (admin tools, manual assignment) is allowed
    /// only while the group has no members.
    pub fn validate_commit(&self, member_id: &str, member_epoch: i32, version: i16) -> Result<(), GroupError> {
        if member_epoch < 0 && self.members.is_empty() {
            return Ok(());
        }
        let member = self.members.get(member_id).ok_or(GroupError::UnknownMemberId)?;
        if version < OFFSETS_MEMBER_EPOCH_VERSION {
            return Err(GroupError::UnsupportedVersion);
        }
        if member_epoch != member.member_epoch {
            return Err(GroupError::StaleMemberEpoch);
        }
        Ok(())
    }

    /// TxnOffsetCommit from a member (KIP-447): its member epoch must be current; TxnOffsetCommit
    /// has no STALE_MEMBER_EPOCH, so a stale one is ILLEGAL_GENERATION.
    pub fn validate_transactional_commit(&self, member_id: &str, member_epoch: i32) -> Result<(), GroupError> {
        if member_epoch < 0 && self.members.is_empty() {
            return Ok(());
        }
        let member = self.members.get(member_id).ok_or(GroupError::UnknownMemberId)?;
        if member_epoch != member.member_epoch {
            return Err(GroupError::IllegalGeneration);
        }
        Ok(())
    }

    /// OffsetFetch v9 from a member (Kafka's `ConsumerGroup.validateOffsetFetch`); requests
    /// without a member id and epoch (admin tools) are always allowed.
    pub fn validate_fetch(&self, member_id: Option<&str>, member_epoch: i32) -> Result<(), GroupError> {
        let Some(member_id) = member_id.filter(|_| member_epoch >= 0) else { return Ok(()) };
        let member = self.members.get(member_id).ok_or(GroupError::UnknownMemberId)?;
        if member_epoch != member.member_epoch {
            return Err(GroupError::StaleMemberEpoch);
        }
        Ok(())
    }

    pub fn describe(&self) -> GroupDescription {
        let members = self
            .members
            .values()
            .map(|m| MemberDescription {
                member_id: m.member_id.clone(),
                instance_id: m.instance_id.clone(),
                rack_id: m.rack_id.clone(),
                member_epoch: if m.left_static { LEAVE_GROUP_STATIC_MEMBER_EPOCH } else { m.member_epoch },
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                subscribed_topic_names: m.subscribed_topic_names.iter().cloned().collect(),
                subscribed_topic_regex: m.subscribed_topic_regex.as_ref().map(|r| r.source.clone()),
                assignment: m.assigned.clone(),
                target_assignment: self.target.get(&m.member_id).cloned().unwrap_or_default(),
            })
            .collect();
        GroupDescription {
            state: self.state(),
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor: self.assignor.name(),
            members,
        }
    }

    /// Checks the ownership invariant against the members' state (tests and debug builds).
    #[cfg(test)]
    pub fn check_invariants(&self) {
        let mut seen: HashMap<(Uuid, i32), &str> = HashMap::new();
        for member in self.members.values() {
            for partition in partitions_of(&member.assigned).chain(partitions_of(&member.pending_revocation)) {
                if let Some(other) = seen.insert(partition, &member.member_id) {
                    panic!("{partition:?} owned by {other} and {}", member.member_id);
                }
                assert_eq!(self.owners.get(&partition).map(String::as_str), Some(member.member_id.as_str()));
            }
        }
        assert_eq!(seen.len(), self.owners.len(), "owners lists only what members hold");
    }
}

#[cfg(test)]
#[path = "consumer_tests.rs"]
mod tests;
