//! The raft state machine (openraft's `RaftStateMachine`): applies committed [`Command`]s to
//! [`ClusterMetadata`] and publishes each new state on a `watch` channel.
//!
//! Durability contract: the state machine itself lives in memory; what is durable is the
//! snapshot (`<data_dir>/controller/snapshot-v1.bin`, replaced atomically) plus the log after
//! it. At startup the state is loaded from the snapshot and openraft re-applies the committed
//! entries that follow (the log store remembers the committed index), so the restarted node
//! serves the same metadata it had before the crash.
//!
//! Snapshot file: `[magic "SLSNAP01"][meta length u32 LE][meta JSON][data][crc32c u32 LE]`,
//! where data is the JSON of [`ClusterMetadata`] plus the remembered requests (the same
//! bytes sent to a lagging follower).
//!
//! Exactly-once writes: the results of the last [`REMEMBERED_REQUESTS_MAX`] proposals are
//! kept by request id, so a retried proposal (same id) returns the first result and changes
//! nothing. They are part of the replicated state (in the snapshot), since whether a
//! duplicate applies changes the metadata and every node must decide it the same way.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, StorageError, StorageIOError,
    StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use uuid::Uuid;

use crate::log_store::write_atomic;
use crate::metadata::{ClusterMetadata, Command, CommandOutput, CommandResult, MetadataError};
use crate::types::{Proposal, TypeConfig};

const SNAPSHOT_FILE: &str = "snapshot-v1.bin";
const SNAPSHOT_MAGIC: &[u8; 8] = b"SLSNAP01";
/// Largest snapshot accepted from disk or a peer.
pub(crate) const SNAPSHOT_BYTES_MAX: usize = 256 << 20;
/// Proposals whose results are remembered for retries (oldest forgotten first).
pub(crate) const REMEMBERED_REQUESTS_MAX: usize = 4_096;

type NodeId = u64;
type StorageResult<T> = Result<T, StorageError<NodeId>>;
type Meta = SnapshotMeta<NodeId, BasicNode>;

/// A remembered result, kept small: a topic is named, not copied, and read back when asked.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Remembered {
    Output(CommandOutput),
    Topic(String),
    Refused(MetadataError),
}

/// Results of recent proposals by request id, in application order.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct RecentRequests {
    order: VecDeque<Uuid>,
    results: BTreeMap<Uuid, Remembered>,
}

impl RecentRequests {
    fn get(&self, request_id: &Uuid, metadata: &ClusterMetadata) -> Option<CommandResult> {
        Some(match self.results.get(request_id)? {
            Remembered::Output(output) => Ok(output.clone()),
            Remembered::Topic(name) => match metadata.topics.get(name) {
                Some(topic) => Ok(CommandOutput::Topic(topic.clone())),
                None => Err(MetadataError::UnknownTopic(name.clone())),
            },
            Remembered::Refused(error) => Err(error.clone()),
        })
    }

    fn remember(&mut self, request_id: Uuid, result: &CommandResult) {
        let remembered = match result {
            Ok(CommandOutput::Topic(_)) => return, // replaced below by the caller's name
            Ok(output) => Remembered::Output(output.clone()),
            Err(error) => Remembered::Refused(error.clone()),
        };
        self.insert(request_id, remembered);
    }

    fn insert(&mut self, request_id: Uuid, remembered: Remembered) {
        assert!(self.results.insert(request_id, remembered).is_none(), "a request id is applied once");
        self.order.push_back(request_id);
        while self.order.len() > REMEMBERED_REQUESTS_MAX {
            let oldest = self.order.pop_front().expect("not empty");
            self.results.remove(&oldest);
        }
        assert_eq!(self.order.len(), self.results.len());
    }
}

/// What a snapshot holds.
#[derive(Serialize, Deserialize)]
struct SnapshotState {
    metadata: ClusterMetadata,
    recent: RecentRequests,
}

#[derive(Clone)]
struct StoredSnapshot {
    meta: Meta,
    data: Vec<u8>,
}

/// The state machine handed to openraft.
pub(crate) struct StateMachine {
    dir: PathBuf,
    metadata: ClusterMetadata,
    recent: RecentRequests,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    current_snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
    publish: watch::Sender<Arc<ClusterMetadata>>,
}

/// Builds a snapshot of the state as of the moment it was created.
pub(crate) struct SnapshotBuilder {
    dir: PathBuf,
    metadata: Arc<ClusterMetadata>,
    recent: RecentRequests,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    current_snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
}

impl StateMachine {
    /// Loads the last snapshot under `dir` (if any); publishes the state on the returned channel.
    pub(crate) fn open(dir: &Path) -> io::Result<(StateMachine, watch::Receiver<Arc<ClusterMetadata>>)> {
        let stored = read_snapshot(&dir.join(SNAPSHOT_FILE))?;
        let (state, last_applied, membership) = match &stored {
            Some(snapshot) => {
                (decode_state(&snapshot.data)?, snapshot.meta.last_log_id, snapshot.meta.last_membership.clone())
            }
            None => (
                SnapshotState { metadata: ClusterMetadata::default(), recent: RecentRequests::default() },
                None,
                StoredMembership::default(),
            ),
        };
        let SnapshotState { metadata, recent } = state;
        assert_eq!(metadata.version, last_applied.map_or(0, |log_id| log_id.index));
        let (publish, receiver) = watch::channel(Arc::new(metadata.clone()));
        let machine = StateMachine {
            dir: dir.to_path_buf(),
            metadata,
            recent,
            last_applied,
            membership,
            current_snapshot: Arc::new(Mutex::new(stored)),
            publish,
        };
        Ok((machine, receiver))
    }

    fn apply_entry(&mut self, entry: Entry<TypeConfig>) -> CommandResult {
        assert!(self.last_applied.is_none_or(|applied| applied.index < entry.log_id.index), "apply goes forward");
        let result = match entry.payload {
            EntryPayload::Blank => Ok(crate::metadata::CommandOutput::Done),
            EntryPayload::Normal(proposal) => self.apply_proposal(proposal, entry.log_id),
            EntryPayload::Membership(membership) => {
                self.membership = StoredMembership::new(Some(entry.log_id), membership);
                Ok(crate::metadata::CommandOutput::Done)
            }
        };
        self.last_applied = Some(entry.log_id);
        self.metadata.version = entry.log_id.index;
        result
    }

    fn apply_proposal(&mut self, proposal: Proposal, log_id: LogId<NodeId>) -> CommandResult {
        let Proposal { request_id, command } = proposal;
        if let Some(result) = self.recent.get(&request_id, &self.metadata) {
            tracing::debug!(index = log_id.index, %request_id, "duplicate proposal, first result returned");
            return result;
        }
        let topic = topic_of(&command);
        let result = self.metadata.apply(command);
        match (&result, topic) {
            (Ok(CommandOutput::Topic(_)), Some(name)) => self.recent.insert(request_id, Remembered::Topic(name)),
            _ => self.recent.remember(request_id, &result),
        }
        if let Err(error) = &result {
            tracing::debug!(index = log_id.index, %error, "command refused");
        }
        result
    }
}

/// The topic a command's `Topic` output describes.
fn topic_of(command: &Command) -> Option<String> {
    match command {
        Command::CreateTopic { name, .. }
        | Command::CreatePartitions { name, .. }
        | Command::AlterTopicConfigs { name, .. } => Some(name.clone()),
        _ => None,
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>)> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<CommandResult>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let results: Vec<CommandResult> = entries.into_iter().map(|entry| self.apply_entry(entry)).collect();
        if !results.is_empty() {
            self.publish.send_replace(Arc::new(self.metadata.clone()));
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            dir: self.dir.clone(),
            metadata: Arc::new(self.metadata.clone()),
            recent: self.recent.clone(),
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            current_snapshot: self.current_snapshot.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(&mut self, meta: &Meta, snapshot: Box<Cursor<Vec<u8>>>) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let signature = Some(meta.signature());
        let SnapshotState { mut metadata, recent } =
            decode_state(&data).map_err(|error| StorageIOError::read_snapshot(signature.clone(), &error))?;
        metadata.version = meta.last_log_id.map_or(0, |log_id| log_id.index);
        let stored = StoredSnapshot { meta: meta.clone(), data };
        persist_snapshot(&self.dir, &stored).map_err(|error| StorageIOError::write_snapshot(signature, &error))?;
        self.metadata = metadata;
        self.recent = recent;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        *self.current_snapshot.lock().expect("snapshot lock poisoned") = Some(stored);
        self.publish.send_replace(Arc::new(self.metadata.clone()));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let stored = self.current_snapshot.lock().expect("snapshot lock poisoned").clone();
        Ok(stored.map(|stored| Snapshot { meta: stored.meta, snapshot: Box::new(Cursor::new(stored.data)) }))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let state = SnapshotState { metadata: (*self.metadata).clone(), recent: self.recent.clone() };
        let data = serde_json::to_vec(&state).map_err(|error| StorageIOError::read_state_machine(&error))?;
        let snapshot_id = match self.last_applied {
            Some(log_id) => format!("{}-{}", log_id.leader_id.term, log_id.index),
            None => "0-0".to_string(),
        };
        let meta = Meta { last_log_id: self.last_applied, last_membership: self.membership.clone(), snapshot_id };
        let stored = StoredSnapshot { meta: meta.clone(), data: data.clone() };
        persist_snapshot(&self.dir, &stored)
            .map_err(|error| StorageIOError::write_snapshot(Some(meta.signature()), &error))?;
        let mut current = self.current_snapshot.lock().expect("snapshot lock poisoned");
        // Two builders may race; never replace a newer snapshot with an older one.
        if current.as_ref().is_none_or(|existing| existing.meta.last_log_id <= meta.last_log_id) {
            *current = Some(stored);
        }
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

fn decode_state(data: &[u8]) -> io::Result<SnapshotState> {
    serde_json::from_slice(data).map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
}

fn persist_snapshot(dir: &Path, snapshot: &StoredSnapshot) -> io::Result<()> {
    let meta = serde_json::to_vec(&snapshot.meta).map_err(io::Error::other)?;
    let mut bytes = Vec::with_capacity(SNAPSHOT_MAGIC.len() + 8 + meta.len() + snapshot.data.len());
    bytes.extend_from_slice(SNAPSHOT_MAGIC);
    bytes.extend_from_slice(&u32::try_from(meta.len()).map_err(io::Error::other)?.to_le_bytes());
    bytes.extend_from_slice(&meta);
    bytes.extend_from_slice(&snapshot.data);
    bytes.extend_from_slice(&crc_fast::crc32_iscsi(&bytes).to_le_bytes());
    if bytes.len() > SNAPSHOT_BYTES_MAX {
        return Err(io::Error::other(format!("snapshot of {} bytes exceeds the limit", bytes.len())));
    }
    write_atomic(dir, SNAPSHOT_FILE, &bytes)
}

fn read_snapshot(path: &Path) -> io::Result<Option<StoredSnapshot>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {why}", path.display()));
    let header = SNAPSHOT_MAGIC.len() + 4;
    if bytes.len() < header + 4 || &bytes[..SNAPSHOT_MAGIC.len()] != SNAPSHOT_MAGIC {
        return Err(invalid("not a snapshot file"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc_fast::crc32_iscsi(body).to_le_bytes() != crc {
        return Err(invalid("checksum mismatch"));
    }
    let meta_length = u32::from_le_bytes(body[SNAPSHOT_MAGIC.len()..header].try_into().expect("4 bytes")) as usize;
    let meta_bytes = body.get(header..header + meta_length).ok_or_else(|| invalid("truncated meta"))?;
    let meta: Meta = serde_json::from_slice(meta_bytes).map_err(|_| invalid("undecodable meta"))?;
    Ok(Some(StoredSnapshot { meta, data: body[header + meta_length..].to_vec() }))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use openraft::{CommittedLeaderId, Membership};

    use super::*;
    use crate::metadata::{BrokerInfo, Command};

    fn entry(index: u64, proposal: &Proposal) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(proposal.clone()),
        }
    }

    fn create_topic() -> Proposal {
        Proposal::new(Command::CreateTopic {
            name: "t".into(),
            topic_id: Uuid::new_v4(),
            partitions: 2,
            replication_factor: 1,
            configs: BTreeMap::new(),
            placement_seed: 0,
            assignment: None,
        })
    }

    #[test]
    fn a_retried_proposal_returns_the_first_result_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (mut machine, _) = StateMachine::open(dir.path()).unwrap();
        let broker = BrokerInfo {
            node_id: 1,
            host: "h".into(),
            port: 1,
            rack: None,
            incarnation: 1,
            fenced: false,
            endpoints: vec![],
            metadata_version_max: 2,
        };
        machine.apply_entry(entry(1, &Proposal::new(Command::RegisterBroker(broker)))).unwrap();
        let allocate = Proposal::new(Command::AllocateProducerIds { count: 10 });
        assert_eq!(machine.apply_entry(entry(2, &allocate)), Ok(CommandOutput::ProducerIds { first: 0 }));
        assert_eq!(machine.apply_entry(entry(3, &allocate)), Ok(CommandOutput::ProducerIds { first: 0 }));
        assert_eq!(machine.metadata.next_producer_id, 10);
        let create = create_topic();
        let first = machine.apply_entry(entry(4, &create));
        assert!(matches!(first, Ok(CommandOutput::Topic(_))));
        assert_eq!(machine.apply_entry(entry(5, &create)), first, "not TopicAlreadyExists");
        // A different proposal of the same command is a new write.
        assert!(matches!(machine.apply_entry(entry(6, &create_topic())), Err(MetadataError::TopicAlreadyExists(_))));
        assert_eq!(machine.metadata.version, 6);
    }

    #[tokio::test]
    async fn snapshots_carry_metadata_and_remembered_requests() {
        let dir = tempfile::tempdir().unwrap();
        let (mut machine, _) = StateMachine::open(dir.path()).unwrap();
        let membership = Membership::new(vec![BTreeSet::from([1])], None);
        machine
            .apply_entry(Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
                payload: EntryPayload::Membership(membership),
            })
            .unwrap();
        let allocate = Proposal::new(Command::AllocateProducerIds { count: 5 });
        machine.apply_entry(entry(2, &allocate)).unwrap();
        let snapshot = machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
        // A restart from the snapshot file, and a peer installing the sent bytes, agree.
        let (mut restarted, metadata) = StateMachine::open(dir.path()).unwrap();
        assert_eq!((metadata.borrow().version, metadata.borrow().next_producer_id), (2, 5));
        let other = tempfile::tempdir().unwrap();
        let (mut installed, metadata) = StateMachine::open(other.path()).unwrap();
        installed.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
        assert_eq!(*metadata.borrow().as_ref(), machine.metadata);
        for machine in [&mut restarted, &mut installed] {
            assert_eq!(machine.apply_entry(entry(3, &allocate)), Ok(CommandOutput::ProducerIds { first: 0 }));
            assert_eq!(machine.metadata.next_producer_id, 5);
            assert!(machine.membership.log_id().is_some());
        }
    }
}
