//! The registry as the `_schemas` log describes it: subjects and their versions, the
//! schemas by id, compatibility levels and modes, the next id. Built only by applying the
//! log's records in order, on every node alike, so a node that replays the same log
//! answers the same; a write becomes visible here once it was applied from the log.

use std::collections::{BTreeMap, BTreeSet};

use crate::compatibility::Level;
use crate::records::{Change, ConfigValue, IdAllocationValue, Key, ModeValue, SchemaValue};

/// The first id given to a schema.
pub const FIRST_SCHEMA_ID: i32 = 1;

/// What writes a subject (or the whole registry) accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    ReadWrite,
    ReadOnly,
    /// Registrations carry their own ids and versions (a migration from another registry);
    /// compatibility is not checked.
    Import,
}

impl Mode {
    pub fn parse(name: &str) -> Option<Mode> {
        match name.to_ascii_uppercase().as_str() {
            "READWRITE" => Some(Mode::ReadWrite),
            "READONLY" => Some(Mode::ReadOnly),
            "IMPORT" => Some(Mode::Import),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::ReadWrite => "READWRITE",
            Mode::ReadOnly => "READONLY",
            Mode::Import => "IMPORT",
        }
    }
}

#[derive(Debug, Default)]
pub struct State {
    /// subject -> version -> the version's record (soft-deleted ones included).
    subjects: BTreeMap<String, BTreeMap<i32, SchemaValue>>,
    /// id -> the (subject, version) pairs registered with it.
    by_id: BTreeMap<i32, BTreeSet<(String, i32)>>,
    /// `None`: the registry's default.
    configs: BTreeMap<Option<String>, Level>,
    modes: BTreeMap<Option<String>, Mode>,
    /// The highest id any record allocated, plus one.
    next_id: i32,
    /// The log offset of the next record to apply.
    pub(crate) applied_to: i64,
}

impl State {
    pub fn new() -> State {
        State { next_id: FIRST_SCHEMA_ID, ..State::default() }
    }

    /// Applies one record at `offset`. A record that cannot be read is skipped with a
    /// warning (the log is the registry's, but a hand-produced record must not stop it).
    pub fn apply(&mut self, offset: i64, change: Change) {
        debug_assert!(offset >= self.applied_to, "records apply in log order");
        self.applied_to = offset + 1;
        if let Err(error) = self.apply_change(change) {
            tracing::warn!(offset, %error, "skipping an unreadable _schemas record");
        }
    }

    fn apply_change(&mut self, change: Change) -> Result<(), serde_json::Error> {
        match change.key {
            Key::Schema { subject, version, .. } => {
                self.remove_version(&subject, version);
                if let Some(value) = change.value {
                    let value: SchemaValue = serde_json::from_value(value)?;
                    self.next_id = self.next_id.max(value.id + 1);
                    self.by_id.entry(value.id).or_default().insert((subject.clone(), version));
                    self.subjects.entry(subject).or_default().insert(version, value);
                }
            }
            Key::Config { subject, .. } => match change.value {
                None => drop(self.configs.remove(&subject)),
                Some(value) => {
                    let value: ConfigValue = serde_json::from_value(value)?;
                    if let Some(level) = Level::parse(&value.compatibility_level) {
                        self.configs.insert(subject, level);
                    }
                }
            },
            Key::Mode { subject, .. } => match change.value {
                None => drop(self.modes.remove(&subject)),
                Some(value) => {
                    let value: ModeValue = serde_json::from_value(value)?;
                    if let Some(mode) = Mode::parse(&value.mode) {
                        self.modes.insert(subject, mode);
                    }
                }
            },
            Key::IdAllocation { .. } => {
                if let Some(value) = change.value {
                    let value: IdAllocationValue = serde_json::from_value(value)?;
                    self.next_id = self.next_id.max(value.next_id);
                }
            }
            Key::DeleteSubject { subject, .. } => {
                for version in self.subjects.get_mut(&subject).into_iter().flat_map(|v| v.values_mut()) {
                    version.deleted = true;
                }
            }
            Key::ClearSubject { subject, .. } => {
                let versions: Vec<i32> =
                    self.subjects.get(&subject).map(|v| v.keys().copied().collect()).unwrap_or_default();
                for version in versions {
                    self.remove_version(&subject, version);
                }
            }
            Key::Noop { .. } => {}
        }
        Ok(())
    }

    fn remove_version(&mut self, subject: &str, version: i32) {
        let Some(versions) = self.subjects.get_mut(subject) else { return };
        if let Some(old) = versions.remove(&version) {
            if let Some(pairs) = self.by_id.get_mut(&old.id) {
                pairs.remove(&(subject.to_string(), version));
                if pairs.is_empty() {
                    self.by_id.remove(&old.id);
                }
            }
        }
        if versions.is_empty() {
            self.subjects.remove(subject);
        }
    }

    pub fn next_id(&self) -> i32 {
        self.next_id
    }

    /// The versions of `subject`, oldest first (soft-deleted ones only if `deleted`).
    pub fn versions(&self, subject: &str, deleted: bool) -> Vec<&SchemaValue> {
        self.subjects
            .get(subject)
            .into_iter()
            .flat_map(|versions| versions.values())
            .filter(|v| deleted || !v.deleted)
            .collect()
    }

    /// Whether `subject` has any version, soft-deleted or not.
    pub fn knows_subject(&self, subject: &str) -> bool {
        self.subjects.contains_key(subject)
    }

    /// Subjects with a live version (or any version, if `deleted`), sorted.
    pub fn subjects(&self, deleted: bool) -> Vec<&str> {
        self.subjects
            .iter()
            .filter(|(_, versions)| deleted || versions.values().any(|v| !v.deleted))
            .map(|(subject, _)| subject.as_str())
            .collect()
    }

    pub fn version(&self, subject: &str, version: i32) -> Option<&SchemaValue> {
        self.subjects.get(subject)?.get(&version)
    }

    /// The highest version number `subject` ever had that is still in the log.
    pub fn max_version(&self, subject: &str) -> i32 {
        self.subjects.get(subject).and_then(|v| v.keys().next_back().copied()).unwrap_or(0)
    }

    /// A record registered with `id` (any of its subjects), soft-deleted ones included.
    pub fn by_id(&self, id: i32) -> Option<&SchemaValue> {
        let (subject, version) = self.by_id.get(&id)?.iter().next()?;
        self.version(subject, *version)
    }

    /// The (subject, version) pairs registered with `id`.
    pub fn uses_of(&self, id: i32) -> impl Iterator<Item = &(String, i32)> {
        self.by_id.get(&id).into_iter().flatten()
    }

    /// Every live version, for lookups across subjects.
    pub fn all_versions(&self) -> impl Iterator<Item = &SchemaValue> {
        self.subjects.values().flat_map(|versions| versions.values())
    }

    /// The level stored for `subject` (`None`: the registry's), if any.
    pub fn level(&self, subject: Option<&str>) -> Option<Level> {
        self.configs.get(&subject.map(str::to_string)).copied()
    }

    /// The level `subject`'s registrations are checked at: its own, else the registry's.
    pub fn level_for(&self, subject: &str) -> Level {
        self.level(Some(subject)).or_else(|| self.level(None)).unwrap_or_default()
    }

    /// The mode stored for `subject` (`None`: the registry's), if any.
    pub fn mode(&self, subject: Option<&str>) -> Option<Mode> {
        self.modes.get(&subject.map(str::to_string)).copied()
    }

    /// The mode `subject`'s writes are under: its own, else the registry's.
    pub fn mode_for(&self, subject: &str) -> Mode {
        self.mode(Some(subject)).or_else(|| self.mode(None)).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::SchemaType;

    fn version(subject: &str, version: i32, id: i32) -> Change {
        let value = SchemaValue {
            subject: subject.into(),
            version,
            id,
            schema_type: SchemaType::Avro,
            references: vec![],
            schema: "\"string\"".into(),
            deleted: false,
        };
        Change::put(Key::schema(subject, version), value)
    }

    #[test]
    fn ids_are_never_given_twice_even_after_every_schema_is_hard_deleted() {
        let mut state = State::new();
        state.apply(0, version("s", 1, 1));
        state.apply(1, Change::put(Key::id_allocation(), IdAllocationValue { next_id: 2 }));
        state.apply(2, Change::remove(Key::schema("s", 1)));
        assert!(state.by_id(1).is_none());
        assert!(!state.knows_subject("s"));
        assert_eq!(state.next_id(), 2);
    }

    #[test]
    fn levels_and_modes_fall_back_to_the_registry_default() {
        let mut state = State::new();
        assert_eq!(state.level_for("s"), Level::Backward);
        state.apply(0, Change::put(Key::config(None), ConfigValue { compatibility_level: "FULL".into() }));
        state.apply(1, Change::put(Key::config(Some("s")), ConfigValue { compatibility_level: "NONE".into() }));
        assert_eq!(state.level_for("s"), Level::None);
        assert_eq!(state.level_for("t"), Level::Full);
        state.apply(2, Change::remove(Key::config(Some("s"))));
        assert_eq!(state.level_for("s"), Level::Full);
        state.apply(3, Change::put(Key::mode(None), ModeValue { mode: "READONLY".into() }));
        assert_eq!(state.mode_for("s"), Mode::ReadOnly);
    }
}
