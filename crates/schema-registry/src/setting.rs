//! The two settings a subject, or the whole registry, has: its compatibility level and its
//! mode. Both are stored under their own key in `_schemas`, fall back from the subject to
//! the registry, and are shown, set and removed through the same REST shape (`/config`
//! and `/mode`), so one generic path serves both.

use serde_json::Value;

use crate::compatibility::Level;
use crate::error::RegistryError;
use crate::records::{ConfigValue, Key, ModeValue};
use crate::state::{Mode, State};

pub trait Setting: Copy + Default + Send + Sync + 'static {
    /// The field of a PUT body and of its answer (`compatibility`, `mode`).
    const UPDATE_FIELD: &'static str;
    /// The field of a GET answer (`compatibilityLevel`, `mode`).
    const SHOW_FIELD: &'static str;
    fn parse(name: &str) -> Option<Self>;
    fn name(self) -> &'static str;
    /// The refusal of a value `parse` does not know.
    fn invalid() -> RegistryError;
    /// The answer when `subject` has no setting of its own.
    fn not_set(subject: &str) -> RegistryError;
    /// The record key of the setting of `subject` (`None`: the registry's).
    fn key(subject: Option<&str>) -> Key;
    /// The record value that stores `self`.
    fn record(self) -> Value;
    /// The setting stored for `subject` (`None`: the registry's), if any.
    fn stored(state: &State, subject: Option<&str>) -> Option<Self>;
}

impl Setting for Level {
    const UPDATE_FIELD: &'static str = "compatibility";
    const SHOW_FIELD: &'static str = "compatibilityLevel";

    fn parse(name: &str) -> Option<Level> {
        Level::parse(name)
    }

    fn name(self) -> &'static str {
        Level::name(self)
    }

    fn invalid() -> RegistryError {
        RegistryError::InvalidCompatibilityLevel
    }

    fn not_set(subject: &str) -> RegistryError {
        RegistryError::SubjectConfigNotFound(subject.to_string())
    }

    fn key(subject: Option<&str>) -> Key {
        Key::config(subject)
    }

    fn record(self) -> Value {
        serde_json::to_value(ConfigValue { compatibility_level: self.name().to_string() }).expect("serializes")
    }

    fn stored(state: &State, subject: Option<&str>) -> Option<Level> {
        state.level(subject)
    }
}

impl Setting for Mode {
    const UPDATE_FIELD: &'static str = "mode";
    const SHOW_FIELD: &'static str = "mode";

    fn parse(name: &str) -> Option<Mode> {
        Mode::parse(name)
    }

    fn name(self) -> &'static str {
        Mode::name(self)
    }

    fn invalid() -> RegistryError {
        RegistryError::InvalidMode
    }

    fn not_set(subject: &str) -> RegistryError {
        RegistryError::SubjectModeNotFound(subject.to_string())
    }

    fn key(subject: Option<&str>) -> Key {
        Key::mode(subject)
    }

    fn record(self) -> Value {
        serde_json::to_value(ModeValue { mode: self.name().to_string() }).expect("serializes")
    }

    fn stored(state: &State, subject: Option<&str>) -> Option<Mode> {
        state.mode(subject)
    }
}
