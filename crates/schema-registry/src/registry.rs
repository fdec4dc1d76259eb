//! The registry's operations: what each REST call reads or writes.
//!
//! Reads answer from the `State` after catching up with the local `_schemas` log. Writes
//! run one at a time on this node: validated against the caught-up state, appended to
//! the log as one batch through the [`SchemaLog`] (which acknowledges once the batch is
//! durable at the topic's promise), then applied from the log like any other record, so
//! what a client is told was registered is what every node replays.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use bytes::Bytes;

use crate::compatibility;
use crate::error::RegistryError;
use crate::records::{Change, IdAllocationValue, Key, SchemaValue};
use crate::schema::{Parsed, Reference, SchemaType};
use crate::setting::Setting;
use crate::state::{Mode, State};

/// The longest subject name accepted.
pub const SUBJECT_BYTES_MAX: usize = 4096;
/// How deep references may nest (a cycle is refused by this bound).
pub const REFERENCE_DEPTH_MAX: usize = 32;
/// How long a write waits for the local log to be wholly committed before it decides.
const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);
/// How often that wait looks again.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// A record read back from the log: (offset, key, value).
pub type LogRecord = (i64, Option<Bytes>, Option<Bytes>);

/// A future the log host returns.
pub type LogFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, RegistryError>> + Send + 'a>>;

/// The `_schemas` partition as the broker hosts it.
pub trait SchemaLog: Send + Sync + 'static {
    /// The committed records (below the high watermark) from `offset` on, in order, at
    /// most a few MiB per call; empty when there are none. An error when this node does
    /// not host the partition.
    fn read(&self, offset: i64) -> Result<Vec<LogRecord>, RegistryError>;
    /// Appends the records as one batch; resolves with the offset after it once it is
    /// durable (refused where this node does not lead the partition).
    fn append(&self, records: Vec<(Bytes, Option<Bytes>)>) -> LogFuture<'_, i64>;
    /// Where this node's writes go: `Local` when it leads the partition (or nothing leads
    /// it yet, and the first write will create it), else the registry address
    /// (`host:port`) of the node that leads it.
    fn writer(&self) -> LogFuture<'_, Writer>;
    /// The offset up to which this node's replica is committed (its high watermark).
    fn committed_end(&self) -> i64;
    /// The offset after the last record of this node's replica, committed or not.
    fn log_end(&self) -> i64;
    /// Whether this node answers reads from its own replica: it holds an in-sync one, or
    /// the partition does not exist yet (so the registry is empty everywhere). Otherwise
    /// reads go to the leader.
    fn answers_reads(&self) -> bool;
}

/// Which node takes this node's writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Writer {
    Local,
    Remote(String),
}

/// A registration or lookup request's schema.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct SchemaRequest {
    pub schema: String,
    #[serde(rename = "schemaType", default)]
    pub schema_type: Option<String>,
    #[serde(default)]
    pub references: Vec<Reference>,
    /// IMPORT mode: the id and version to register with.
    #[serde(default)]
    pub id: Option<i32>,
    #[serde(default)]
    pub version: Option<i32>,
}

/// A version as the REST API answers it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VersionAnswer {
    pub subject: String,
    pub id: i32,
    pub version: i32,
    #[serde(rename = "schemaType", skip_serializing_if = "SchemaType::is_avro")]
    pub schema_type: SchemaType,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<Reference>,
    pub schema: String,
}

impl From<&SchemaValue> for VersionAnswer {
    fn from(value: &SchemaValue) -> VersionAnswer {
        VersionAnswer {
            subject: value.subject.clone(),
            id: value.id,
            version: value.version,
            schema_type: value.schema_type,
            references: value.references.clone(),
            schema: value.schema.clone(),
        }
    }
}

/// Which version a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionSpec {
    Latest,
    Number(i32),
}

impl VersionSpec {
    pub fn parse(text: &str) -> Result<VersionSpec, RegistryError> {
        if text == "latest" || text == "-1" {
            return Ok(VersionSpec::Latest);
        }
        match text.parse::<i32>() {
            Ok(number) if number >= 1 => Ok(VersionSpec::Number(number)),
            _ => Err(RegistryError::InvalidVersion(text.to_string())),
        }
    }
}

/// The identity of a schema across subjects: same type, canonical form and references.
type Identity = (SchemaType, String, Vec<Reference>);

pub struct Registry {
    log: Arc<dyn SchemaLog>,
    state: RwLock<State>,
    /// Ids by schema identity, for giving an identical schema its existing id.
    ids: RwLock<HashMap<Identity, i32>>,
    writes: tokio::sync::Mutex<()>,
}

impl Registry {
    pub fn new(log: Arc<dyn SchemaLog>) -> Registry {
        Registry {
            log,
            state: RwLock::new(State::new()),
            ids: RwLock::new(HashMap::new()),
            writes: tokio::sync::Mutex::new(()),
        }
    }

    /// Applies what the local log committed since the last call.
    pub fn catch_up(&self) -> Result<(), RegistryError> {
        loop {
            let from = self.state.read().expect("state lock").applied_to;
            let records = self.log.read(from)?;
            if records.is_empty() {
                return Ok(());
            }
            let mut state = self.state.write().expect("state lock");
            for (offset, key, value) in records {
                if offset < state.applied_to {
                    continue;
                }
                let Some(key) = key else {
                    state.applied_to = offset + 1;
                    continue;
                };
                match Change::decode(&key, value.as_deref()) {
                    Some(Ok(change)) => {
                        let identity = schema_identity(&state, &change);
                        state.apply(offset, change);
                        if let Some((identity, id)) = identity {
                            self.ids.write().expect("ids lock").insert(identity, id);
                        }
                    }
                    Some(Err(error)) => {
                        tracing::warn!(offset, %error, "skipping an unreadable _schemas record");
                        state.applied_to = offset + 1;
                    }
                    None => state.applied_to = offset + 1,
                }
            }
        }
    }

    pub fn log(&self) -> &Arc<dyn SchemaLog> {
        &self.log
    }

    /// The offset of the next record this node's state will apply.
    pub fn applied_to(&self) -> i64 {
        self.state.read().expect("state lock").applied_to
    }

    /// Runs `read` over the caught-up state.
    pub fn read<T>(&self, read: impl FnOnce(&State) -> Result<T, RegistryError>) -> Result<T, RegistryError> {
        self.catch_up()?;
        read(&self.state.read().expect("state lock"))
    }

    /// Runs `read` over the state as last caught up, without reading the log (for lookups
    /// frequent enough that each cannot replay it; see `decode`).
    pub fn read_applied<T>(&self, read: impl FnOnce(&State) -> T) -> T {
        read(&self.state.read().expect("state lock"))
    }

    /// Takes this node's one write slot once its state holds every record of the local log.
    /// A node that has just become the leader may hold records its predecessor committed
    /// above its own high watermark (it learns they are committed when its followers fetch):
    /// a write decided without them could give an id out again.
    async fn write_slot(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, RegistryError> {
        let slot = self.writes.lock().await;
        let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
        while self.log.committed_end() < self.log.log_end() {
            if tokio::time::Instant::now() >= deadline {
                return Err(RegistryError::Timeout);
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
        self.catch_up()?;
        Ok(slot)
    }

    /// Appends `changes` and applies them: the write path of every change.
    async fn write(&self, changes: Vec<Change>) -> Result<(), RegistryError> {
        let records = changes.iter().map(Change::encode).collect();
        let end = self.log.append(records).await?;
        self.catch_up()?;
        let applied = self.state.read().expect("state lock").applied_to;
        assert!(applied >= end, "a durable write is committed in the local log: applied {applied} < {end}");
        Ok(())
    }

    /// Registers `request` under `subject`: its id (an identical live version's, or an
    /// identical schema's from another subject, or a new one).
    pub async fn register(&self, subject: &str, request: SchemaRequest) -> Result<i32, RegistryError> {
        check_subject(subject)?;
        let _one_writer = self.write_slot().await?;
        let (changes, id) = {
            let state = self.state.read().expect("state lock");
            let mode = state.mode_for(subject);
            if mode == Mode::ReadOnly {
                return Err(RegistryError::OperationNotPermitted(subject.to_string()));
            }
            let (schema_type, parsed) = parse_request(&state, &request)?;
            let identity: Identity = (schema_type, parsed.canonical(), sorted(&request.references));
            if let Some(existing) = self.live_version_with(&state, subject, &identity) {
                return Ok(existing.id);
            }
            if mode != Mode::Import {
                if request.id.is_some() {
                    return Err(RegistryError::OperationNotPermitted(subject.to_string()));
                }
                let previous = live_parsed(&state, subject)?;
                let reasons = compatibility::check(state.level_for(subject), &parsed, &previous);
                if !reasons.is_empty() {
                    return Err(RegistryError::Incompatible(format!(
                        "Schema being registered is incompatible with an earlier schema for subject \"{subject}\", details: {reasons:?}"
                    )));
                }
            }
            let id = self.id_for(&state, &identity, mode, request.id)?;
            let version = match (mode, request.version) {
                (Mode::Import, Some(version)) if version >= 1 => version,
                _ => state.max_version(subject) + 1,
            };
            let value = SchemaValue {
                subject: subject.to_string(),
                version,
                id,
                schema_type,
                references: request.references.clone(),
                schema: request.schema.clone(),
                deleted: false,
            };
            let mut changes = vec![Change::put(Key::schema(subject, version), value)];
            if id >= state.next_id() {
                changes.push(Change::put(Key::id_allocation(), IdAllocationValue { next_id: id + 1 }));
            }
            (changes, id)
        };
        self.write(changes).await?;
        Ok(id)
    }

    fn live_version_with<'s>(&self, state: &'s State, subject: &str, identity: &Identity) -> Option<&'s SchemaValue> {
        let id = *self.ids.read().expect("ids lock").get(identity)?;
        state.versions(subject, false).into_iter().find(|v| v.id == id)
    }

    /// The id a new version takes: the identical schema's, or the one IMPORT gives (not
    /// taken by another schema), or the next.
    fn id_for(&self, state: &State, identity: &Identity, mode: Mode, given: Option<i32>) -> Result<i32, RegistryError> {
        let known = self.ids.read().expect("ids lock").get(identity).copied().filter(|id| state.by_id(*id).is_some());
        match (mode, given) {
            (Mode::Import, Some(id)) => match state.by_id(id) {
                Some(_) if known != Some(id) => Err(RegistryError::OperationNotPermitted(format!(
                    "{}: id {id} is taken by another schema",
                    state.uses_of(id).next().map_or("", |(s, _)| s.as_str())
                ))),
                _ if id < 1 => Err(RegistryError::BadRequest(format!("invalid schema id {id}"))),
                _ => Ok(id),
            },
            (Mode::Import, None) => Err(RegistryError::BadRequest("IMPORT mode registrations carry an id".into())),
            _ => Ok(known.unwrap_or_else(|| state.next_id())),
        }
    }

    /// The live version of `subject` with the same schema as `request`.
    pub fn lookup(
        &self,
        subject: &str,
        request: &SchemaRequest,
        deleted: bool,
    ) -> Result<VersionAnswer, RegistryError> {
        self.read(|state| {
            if !state.knows_subject(subject) {
                return Err(RegistryError::SubjectNotFound(subject.to_string()));
            }
            let (schema_type, parsed) = parse_request(state, request)?;
            let identity: Identity = (schema_type, parsed.canonical(), sorted(&request.references));
            let id = self.ids.read().expect("ids lock").get(&identity).copied();
            state
                .versions(subject, deleted)
                .into_iter()
                .find(|v| Some(v.id) == id)
                .map(VersionAnswer::from)
                .ok_or_else(|| RegistryError::SchemaNotFound(String::new()))
        })
    }

    /// Whether `request` may follow `subject`'s versions (`version`: against that one
    /// only; `None`: as registering it would check). The reasons when it may not.
    pub fn test_compatibility(
        &self,
        subject: &str,
        version: Option<VersionSpec>,
        request: &SchemaRequest,
    ) -> Result<Vec<String>, RegistryError> {
        self.read(|state| {
            let (_, parsed) = parse_request(state, request)?;
            let level = state.level_for(subject);
            let previous = match version {
                None => live_parsed(state, subject)?,
                Some(spec) => {
                    if !state.knows_subject(subject) {
                        return Err(RegistryError::SubjectNotFound(subject.to_string()));
                    }
                    let value = find_version(state, subject, spec, false)?;
                    vec![parse_stored(state, value)?]
                }
            };
            Ok(compatibility::check(level, &parsed, &previous))
        })
    }

    /// Soft-deletes every live version of `subject` (or, `permanent`, removes the
    /// soft-deleted ones): the versions deleted.
    pub async fn delete_subject(&self, subject: &str, permanent: bool) -> Result<Vec<i32>, RegistryError> {
        let _one_writer = self.write_slot().await?;
        let (changes, versions) = self.read(|state| {
            if state.mode_for(subject) == Mode::ReadOnly {
                return Err(RegistryError::OperationNotPermitted(subject.to_string()));
            }
            let all = state.versions(subject, true);
            if all.is_empty() {
                return Err(RegistryError::SubjectNotFound(subject.to_string()));
            }
            let live: Vec<&SchemaValue> = all.iter().copied().filter(|v| !v.deleted).collect();
            if permanent && !live.is_empty() {
                return Err(RegistryError::SubjectNotSoftDeleted(subject.to_string()));
            }
            if !permanent && live.is_empty() {
                return Err(RegistryError::SubjectSoftDeleted(subject.to_string()));
            }
            let targets = if permanent { all } else { live };
            for value in &targets {
                check_unreferenced(state, value)?;
            }
            let changes = targets.iter().map(|value| delete_change(value, permanent)).collect();
            Ok((changes, targets.iter().map(|v| v.version).collect::<Vec<_>>()))
        })?;
        self.write(changes).await?;
        Ok(versions)
    }

    /// Soft-deletes (or, `permanent`, removes a soft-deleted) version of `subject`.
    pub async fn delete_version(
        &self,
        subject: &str,
        spec: VersionSpec,
        permanent: bool,
    ) -> Result<i32, RegistryError> {
        let _one_writer = self.write_slot().await?;
        let (change, version) = self.read(|state| {
            if state.mode_for(subject) == Mode::ReadOnly {
                return Err(RegistryError::OperationNotPermitted(subject.to_string()));
            }
            if !state.knows_subject(subject) {
                return Err(RegistryError::SubjectNotFound(subject.to_string()));
            }
            let value = find_version(state, subject, spec, permanent)?;
            if permanent && !value.deleted {
                return Err(RegistryError::VersionNotSoftDeleted {
                    subject: subject.to_string(),
                    version: value.version,
                });
            }
            if !permanent && value.deleted {
                return Err(RegistryError::VersionNotFound(value.version.to_string()));
            }
            check_unreferenced(state, value)?;
            Ok((delete_change(value, permanent), value.version))
        })?;
        self.write(vec![change]).await?;
        Ok(version)
    }

    /// Sets a setting of `subject` (`None`: the registry's).
    pub async fn set<S: Setting>(&self, subject: Option<&str>, value: S) -> Result<(), RegistryError> {
        let _one_writer = self.write_slot().await?;
        self.write(vec![Change { key: S::key(subject), value: Some(value.record()) }]).await
    }

    /// Removes `subject`'s own setting: the value it had.
    pub async fn remove<S: Setting>(&self, subject: &str) -> Result<S, RegistryError> {
        let _one_writer = self.write_slot().await?;
        let previous = self.read(|state| S::stored(state, Some(subject)).ok_or_else(|| S::not_set(subject)))?;
        self.write(vec![Change::remove(S::key(Some(subject)))]).await?;
        Ok(previous)
    }
}

fn check_subject(subject: &str) -> Result<(), RegistryError> {
    if subject.is_empty() || subject.len() > SUBJECT_BYTES_MAX || subject.chars().any(char::is_control) {
        return Err(RegistryError::BadRequest(format!(
            "invalid subject: 1 to {SUBJECT_BYTES_MAX} bytes without control characters"
        )));
    }
    Ok(())
}

fn sorted(references: &[Reference]) -> Vec<Reference> {
    let mut references = references.to_vec();
    references.sort();
    references
}

/// The schema a registration or lookup carries, parsed with its references.
fn parse_request(state: &State, request: &SchemaRequest) -> Result<(SchemaType, Parsed), RegistryError> {
    let schema_type = match &request.schema_type {
        None => SchemaType::Avro,
        Some(name) => SchemaType::parse(name)
            .ok_or_else(|| RegistryError::InvalidSchema(format!("unknown schema type {name:?}")))?,
    };
    let referenced = referenced_texts(state, &request.references, 0)?;
    let parsed = Parsed::parse(schema_type, &request.schema, &referenced).map_err(RegistryError::InvalidSchema)?;
    Ok((schema_type, parsed))
}

/// The texts of the schemas `references` name, and of theirs, dependencies first.
pub(crate) fn referenced_texts(
    state: &State,
    references: &[Reference],
    depth: usize,
) -> Result<Vec<String>, RegistryError> {
    if depth > REFERENCE_DEPTH_MAX {
        return Err(RegistryError::InvalidSchema(format!("references nest deeper than {REFERENCE_DEPTH_MAX}")));
    }
    let mut texts = Vec::new();
    for reference in references {
        let value = state.version(&reference.subject, reference.version).ok_or_else(|| {
            RegistryError::InvalidSchema(format!(
                "reference {} names subject {:?} version {}, which does not exist",
                reference.name, reference.subject, reference.version
            ))
        })?;
        for text in referenced_texts(state, &value.references, depth + 1)? {
            if !texts.contains(&text) {
                texts.push(text);
            }
        }
        if !texts.contains(&value.schema) {
            texts.push(value.schema.clone());
        }
    }
    Ok(texts)
}

/// A stored version parsed (it was valid when registered).
fn parse_stored(state: &State, value: &SchemaValue) -> Result<Parsed, RegistryError> {
    let referenced = referenced_texts(state, &value.references, 0)?;
    Parsed::parse(value.schema_type, &value.schema, &referenced)
        .map_err(|why| RegistryError::Store(format!("stored schema {} does not parse: {why}", value.id)))
}

/// The live versions of `subject` parsed, oldest first.
fn live_parsed(state: &State, subject: &str) -> Result<Vec<Parsed>, RegistryError> {
    state.versions(subject, false).into_iter().map(|value| parse_stored(state, value)).collect()
}

/// The identity of the schema a record registers, for the id index.
fn schema_identity(state: &State, change: &Change) -> Option<(Identity, i32)> {
    let value: SchemaValue = serde_json::from_value(change.value.clone()?).ok()?;
    let parsed = parse_stored(state, &value).ok()?;
    Some(((value.schema_type, parsed.canonical(), sorted(&value.references)), value.id))
}

pub(crate) fn find_version<'s>(
    state: &'s State,
    subject: &str,
    spec: VersionSpec,
    deleted: bool,
) -> Result<&'s SchemaValue, RegistryError> {
    let found = match spec {
        VersionSpec::Latest => state.versions(subject, deleted).last().copied(),
        VersionSpec::Number(number) => state.version(subject, number).filter(|v| deleted || !v.deleted),
    };
    found.ok_or_else(|| {
        RegistryError::VersionNotFound(match spec {
            VersionSpec::Latest => "latest".to_string(),
            VersionSpec::Number(number) => number.to_string(),
        })
    })
}

/// Refuses deleting a version another live version references.
fn check_unreferenced(state: &State, value: &SchemaValue) -> Result<(), RegistryError> {
    let referenced = state.all_versions().any(|other| {
        !other.deleted && other.references.iter().any(|r| r.subject == value.subject && r.version == value.version)
    });
    if referenced {
        return Err(RegistryError::ReferenceExists { subject: value.subject.clone(), version: value.version });
    }
    Ok(())
}

fn delete_change(value: &SchemaValue, permanent: bool) -> Change {
    let key = Key::schema(&value.subject, value.version);
    if permanent {
        Change::remove(key)
    } else {
        Change::put(key, SchemaValue { deleted: true, ..value.clone() })
    }
}

/// The versions referencing `subject` version `version`: their ids.
pub fn referenced_by(state: &State, subject: &str, version: i32) -> Vec<i32> {
    let mut ids: Vec<i32> = state
        .all_versions()
        .filter(|other| !other.deleted && other.references.iter().any(|r| r.subject == subject && r.version == version))
        .map(|other| other.id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Mutex;

    use super::*;

    /// A replica of `_schemas` in memory whose high watermark the test moves.
    #[derive(Default)]
    pub(crate) struct MemoryLog {
        records: Mutex<Vec<(Bytes, Option<Bytes>)>>,
        committed: AtomicI64,
    }

    impl SchemaLog for MemoryLog {
        fn read(&self, offset: i64) -> Result<Vec<LogRecord>, RegistryError> {
            let records = self.records.lock().unwrap();
            let committed = self.committed.load(Ordering::SeqCst);
            Ok((offset..committed)
                .map(|o| (o, Some(records[o as usize].0.clone()), records[o as usize].1.clone()))
                .collect())
        }

        fn append(&self, records: Vec<(Bytes, Option<Bytes>)>) -> LogFuture<'_, i64> {
            Box::pin(async move {
                let mut log = self.records.lock().unwrap();
                log.extend(records);
                self.committed.store(log.len() as i64, Ordering::SeqCst);
                Ok(log.len() as i64)
            })
        }

        fn writer(&self) -> LogFuture<'_, Writer> {
            Box::pin(async { Ok(Writer::Local) })
        }

        fn committed_end(&self) -> i64 {
            self.committed.load(Ordering::SeqCst)
        }

        fn log_end(&self) -> i64 {
            self.records.lock().unwrap().len() as i64
        }

        fn answers_reads(&self) -> bool {
            true
        }
    }

    fn avro_request(field: &str) -> SchemaRequest {
        let schema = format!(r#"{{"type":"record","name":"R","fields":[{{"name":"{field}","type":"int"}}]}}"#);
        SchemaRequest { schema, ..SchemaRequest::default() }
    }

    #[tokio::test]
    async fn a_new_leader_gives_no_id_its_predecessor_gave_while_its_high_watermark_lags() {
        let previous = Registry::new(Arc::new(MemoryLog::default()));
        assert_eq!(previous.register("a-value", avro_request("a")).await.unwrap(), 1);
        // The new leader holds the predecessor's records, committed but above its own high
        // watermark until its followers fetch.
        let handed_over = Arc::new(MemoryLog::default());
        *handed_over.records.lock().unwrap() =
            previous.log.read(0).unwrap().into_iter().map(|(_, k, v)| (k.unwrap(), v)).collect();
        let leader = Registry::new(handed_over.clone());
        let end = handed_over.log_end();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            handed_over.committed.store(end, Ordering::SeqCst);
        });
        assert_eq!(leader.register("b-value", avro_request("b")).await.unwrap(), 2);
    }
}
