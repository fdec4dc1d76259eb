//! The topic registry: names, ids, partition counts and config overrides, plus the
//! cluster id and producer-id allocation, persisted atomically in `meta/cluster.json`.
//!
//! Every change is written (tmp file, fsync, rename) before it is acknowledged, so a
//! topic that a client saw created survives any crash.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

const META_FILE: &str = "cluster.json";
const META_VERSION: u32 = 1;
/// Producer ids are reserved on disk this many at a time, so a restart never reuses one.
pub const PRODUCER_ID_BLOCK: i64 = 1000;
pub const TOPIC_NAME_BYTES_MAX: usize = 249;
/// Bits of a producer id below the node id in cluster mode (2^40 ids per node).
pub const PRODUCER_ID_NODE_SHIFT: u32 = 40;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    pub name: String,
    pub id: Uuid,
    pub partitions: i32,
    pub configs: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
struct MetaFile {
    version: u32,
    cluster_id: String,
    next_producer_id_block: i64,
    topics: Vec<TopicMeta>,
}

struct State {
    cluster_id: String,
    topics: BTreeMap<String, TopicMeta>,
    names_by_id: HashMap<Uuid, String>,
    next_producer_id: i64,
    producer_id_block_end: i64,
}

pub struct TopicRegistry {
    path: PathBuf,
    state: Mutex<State>,
    /// An immutable copy of names, ids and partition counts, replaced after every change.
    /// The group coordinator reads it on every consumer-group heartbeat; it has its own
    /// lock so that a reader never waits behind the fsync of a topic change.
    catalog: Mutex<Arc<TopicCatalog>>,
}

/// Topic names, ids and partition counts at one moment (what group assignors need).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TopicCatalog {
    by_name: HashMap<String, (Uuid, i32)>,
    names_by_id: HashMap<Uuid, String>,
    /// Tells catalogs apart: every catalog built gets a new one (never 0).
    generation: u64,
}

/// The last catalog generation handed out.
static CATALOG_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn next_catalog_generation() -> u64 {
    CATALOG_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

impl TopicCatalog {
    fn of(topics: &BTreeMap<String, TopicMeta>) -> TopicCatalog {
        TopicCatalog {
            by_name: topics.values().map(|t| (t.name.clone(), (t.id, t.partitions))).collect(),
            names_by_id: topics.values().map(|t| (t.id, t.name.clone())).collect(),
            generation: next_catalog_generation(),
        }
    }

    /// A catalog from (name, id, partitions) triples, for tests.
    pub fn from_topics(topics: impl IntoIterator<Item = (String, Uuid, i32)>) -> TopicCatalog {
        let mut catalog = TopicCatalog { generation: next_catalog_generation(), ..TopicCatalog::default() };
        for (name, id, partitions) in topics {
            catalog.names_by_id.insert(id, name.clone());
            catalog.by_name.insert(name, (id, partitions));
        }
        catalog
    }

    /// The id and partition count of the topic called `name`.
    pub fn get(&self, name: &str) -> Option<(Uuid, i32)> {
        self.by_name.get(name).copied()
    }

    pub fn name_for_id(&self, id: &Uuid) -> Option<&str> {
        self.names_by_id.get(id).map(String::as_str)
    }

    /// Every topic's name, in no order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// Differs between any two catalogs built (the topics may have changed).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// Whether `name` is a topic of the broker's own (clients see it flagged internal).
pub fn is_internal(name: &str) -> bool {
    crate::internal::INTERNAL_TOPICS.contains(&name)
}

/// Kafka's rules for topic names.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("topic name is empty".into());
    }
    if name == "." || name == ".." {
        return Err(format!("topic name {name:?} is not allowed"));
    }
    if is_internal(name) {
        return Err(format!("topic name {name:?} is reserved for the broker's own state"));
    }
    if name.len() > TOPIC_NAME_BYTES_MAX {
        return Err(format!("topic name is longer than {TOPIC_NAME_BYTES_MAX} characters"));
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!("topic name {name:?} contains {bad:?}; legal characters are [a-zA-Z0-9._-]"));
    }
    Ok(())
}

impl TopicRegistry {
    /// Loads `meta/cluster.json` under `data_dir`, creating it (with a new cluster id) if absent.
    pub fn open(data_dir: &Path) -> io::Result<TopicRegistry> {
        let dir = data_dir.join("meta");
        // Durable in its parent: a registry file in a directory a power cut takes back would
        // go with it (every topic, and the cluster id).
        sluice_storage::durable::create_dir_all(&dir)?;
        let path = dir.join(META_FILE);
        let file: MetaFile = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => MetaFile {
                version: META_VERSION,
                cluster_id: base64_cluster_id(Uuid::new_v4()),
                next_producer_id_block: 0,
                topics: Vec::new(),
            },
            Err(e) => return Err(e),
        };
        if file.version != META_VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unsupported metadata version {}", file.version),
            ));
        }
        let names_by_id = file.topics.iter().map(|t| (t.id, t.name.clone())).collect();
        let state = State {
            cluster_id: file.cluster_id,
            topics: file.topics.into_iter().map(|t| (t.name.clone(), t)).collect(),
            names_by_id,
            // Skip the rest of the block the previous run may have handed out.
            next_producer_id: file.next_producer_id_block,
            producer_id_block_end: file.next_producer_id_block,
        };
        let catalog = Mutex::new(Arc::new(TopicCatalog::of(&state.topics)));
        let registry = TopicRegistry { path, state: Mutex::new(state), catalog };
        registry.persist(&registry.state.lock())?;
        Ok(registry)
    }

    fn persist(&self, state: &State) -> io::Result<()> {
        let file = MetaFile {
            version: META_VERSION,
            cluster_id: state.cluster_id.clone(),
            next_producer_id_block: state.producer_id_block_end,
            // Internal topics are the coordinators' own; they are registered at every start.
            topics: state.topics.values().filter(|t| !is_internal(&t.name)).cloned().collect(),
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(io::Error::other)?;
        sluice_storage::write_file_atomically(&self.path, &bytes)
    }

    /// The current catalog (a cheap `Arc` clone; never waits on disk I/O).
    pub fn catalog(&self) -> Arc<TopicCatalog> {
        self.catalog.lock().clone()
    }

    /// Publishes a new catalog after a change; called with the state lock held so that
    /// catalogs are published in the order of the changes.
    fn publish_catalog(&self, state: &State) {
        *self.catalog.lock() = Arc::new(TopicCatalog::of(&state.topics));
    }

    pub fn cluster_id(&self) -> String {
        self.state.lock().cluster_id.clone()
    }

    pub fn get(&self, name: &str) -> Option<TopicMeta> {
        self.state.lock().topics.get(name).cloned()
    }

    pub fn name_for_id(&self, id: &Uuid) -> Option<String> {
        self.state.lock().names_by_id.get(id).cloned()
    }

    pub fn all(&self) -> Vec<TopicMeta> {
        self.state.lock().topics.values().cloned().collect()
    }

    /// Single node: lists the group coordinator's local offsets partition as the internal
    /// topic `__consumer_offsets` (one partition, compacted), as a cluster lists its
    /// replicated one, so clients see the same metadata either way. Kept in memory only;
    /// its id is derived from the cluster id, so it is the same at every start.
    pub fn register_local_offsets_topic(&self, segment_bytes: u64) {
        let mut state = self.state.lock();
        let digest = <sha2::Sha256 as sha2::Digest>::digest(
            format!("{}/{}", state.cluster_id, crate::internal::OFFSETS_TOPIC).as_bytes(),
        );
        let id = Uuid::from_slice(&digest[..16]).expect("16 bytes");
        let configs = BTreeMap::from([
            ("cleanup.policy".to_string(), "compact".to_string()),
            ("segment.bytes".to_string(), segment_bytes.to_string()),
        ]);
        let topic = TopicMeta { name: crate::internal::OFFSETS_TOPIC.to_string(), id, partitions: 1, configs };
        state.names_by_id.insert(id, topic.name.clone());
        state.topics.insert(topic.name.clone(), topic);
        self.publish_catalog(&state);
    }

    /// Adds a topic. Fails with `AlreadyExists` if the name is taken.
    pub fn insert(&self, topic: TopicMeta) -> io::Result<()> {
        let mut state = self.state.lock();
        if state.topics.contains_key(&topic.name) {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        state.names_by_id.insert(topic.id, topic.name.clone());
        state.topics.insert(topic.name.clone(), topic);
        let persisted = self.persist(&state);
        self.publish_catalog(&state);
        persisted
    }

    pub fn remove(&self, name: &str) -> io::Result<Option<TopicMeta>> {
        let mut state = self.state.lock();
        let Some(topic) = state.topics.remove(name) else { return Ok(None) };
        state.names_by_id.remove(&topic.id);
        let persisted = self.persist(&state);
        self.publish_catalog(&state);
        persisted?;
        Ok(Some(topic))
    }

    /// Replaces a topic's partition count or configs.
    pub fn update(&self, name: &str, change: impl FnOnce(&mut TopicMeta)) -> io::Result<Option<TopicMeta>> {
        let mut state = self.state.lock();
        let Some(topic) = state.topics.get_mut(name) else { return Ok(None) };
        change(topic);
        let updated = topic.clone();
        let persisted = self.persist(&state);
        self.publish_catalog(&state);
        persisted?;
        Ok(Some(updated))
    }

    /// Cluster mode: the controller owns the topics; this registry becomes a cache of
    /// them (kept in memory, not persisted) and takes the cluster's id.
    pub fn replace_all(&self, topics: Vec<TopicMeta>) {
        let mut state = self.state.lock();
        state.names_by_id = topics.iter().map(|t| (t.id, t.name.clone())).collect();
        state.topics = topics.into_iter().map(|t| (t.name.clone(), t)).collect();
        self.publish_catalog(&state);
    }

    pub fn set_cluster_id(&self, cluster_id: String) {
        self.state.lock().cluster_id = cluster_id;
    }

    /// Cluster mode: producer ids of node N start at N << [`PRODUCER_ID_NODE_SHIFT`], so
    /// nodes never hand out the same id (each node's counter is persisted as before).
    pub fn use_node_producer_ids(&self, node_id: i32) {
        let floor = i64::from(node_id) << PRODUCER_ID_NODE_SHIFT;
        let mut state = self.state.lock();
        if state.next_producer_id < floor {
            state.next_producer_id = floor;
            state.producer_id_block_end = floor;
        }
    }

    /// A producer id never handed out before, even across restarts.
    pub fn allocate_producer_id(&self) -> io::Result<i64> {
        let mut state = self.state.lock();
        if state.next_producer_id >= state.producer_id_block_end {
            state.producer_id_block_end = state.next_producer_id + PRODUCER_ID_BLOCK;
            self.persist(&state)?;
        }
        let id = state.next_producer_id;
        state.next_producer_id += 1;
        assert!(id < state.producer_id_block_end);
        Ok(id)
    }
}

/// Kafka cluster ids are 22-character URL-safe base64 UUIDs.
pub fn base64_cluster_id(id: Uuid) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bits = id.as_u128();
    (0..22).map(|i| ALPHABET[((bits >> (122 - 6 * i).max(0)) & 63) as usize] as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(validate_topic_name("orders.v1_a-b").is_ok());
        for bad in ["", ".", "..", "bad/name", "sp ace", &"x".repeat(250), "__consumer_offsets"] {
            assert!(validate_topic_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn registry_survives_reopen_and_never_reuses_producer_ids() {
        let dir = tempfile::tempdir().unwrap();
        let registry = TopicRegistry::open(dir.path()).unwrap();
        let topic = TopicMeta { name: "a".into(), id: Uuid::new_v4(), partitions: 3, configs: BTreeMap::new() };
        registry.insert(topic.clone()).unwrap();
        assert_eq!(registry.insert(topic.clone()).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        let first = registry.allocate_producer_id().unwrap();
        let cluster_id = registry.cluster_id();
        assert_eq!(cluster_id.len(), 22);
        drop(registry);
        let registry = TopicRegistry::open(dir.path()).unwrap();
        assert_eq!(registry.get("a"), Some(topic.clone()));
        assert_eq!(registry.name_for_id(&topic.id).as_deref(), Some("a"));
        assert_eq!(registry.cluster_id(), cluster_id);
        assert!(registry.allocate_producer_id().unwrap() > first);
    }

    #[test]
    fn the_catalog_follows_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let registry = TopicRegistry::open(dir.path()).unwrap();
        let id = Uuid::new_v4();
        let before = registry.catalog();
        registry.insert(TopicMeta { name: "a".into(), id, partitions: 3, configs: BTreeMap::new() }).unwrap();
        assert_eq!(before.get("a"), None, "a published catalog never changes");
        assert_eq!(registry.catalog().get("a"), Some((id, 3)));
        assert_eq!(registry.catalog().name_for_id(&id), Some("a"));
        registry.update("a", |topic| topic.partitions = 5).unwrap();
        assert_eq!(registry.catalog().get("a"), Some((id, 5)));
        registry.remove("a").unwrap();
        assert_eq!(registry.catalog().get("a"), None);
        assert_eq!(registry.catalog().name_for_id(&id), None);
    }
}
