//! The registry's records in the `_schemas` topic: keys and values as JSON, in the shape
//! Confluent's registry writes them (`{"keytype":"SCHEMA","subject":..,"version":..,
//! "magic":1}` and so on), so the topic reads the same to a tool that knows that format.
//! A tombstone (no value) removes the key's state: a hard-deleted version, a removed
//! subject config or mode.
//!
//! One record type is Sluice's own: `ID_ALLOCATION` holds the next schema id. Written in
//! the same batch as the schema that took an id, it survives compaction and the hard
//! deletion of every schema, so an id is never given out twice.

use serde::{Deserialize, Serialize};

use crate::schema::{Reference, SchemaType};

/// The key of a record in `_schemas`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "keytype", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Key {
    Schema {
        subject: String,
        version: i32,
        magic: i32,
    },
    Config {
        subject: Option<String>,
        magic: i32,
    },
    Mode {
        subject: Option<String>,
        magic: i32,
    },
    IdAllocation {
        magic: i32,
    },
    /// Written by other registries; carries nothing Sluice needs.
    Noop {
        magic: i32,
    },
    DeleteSubject {
        subject: String,
        magic: i32,
    },
    ClearSubject {
        subject: String,
        magic: i32,
    },
}

impl Key {
    pub fn schema(subject: &str, version: i32) -> Key {
        Key::Schema { subject: subject.to_string(), version, magic: 1 }
    }

    pub fn config(subject: Option<&str>) -> Key {
        Key::Config { subject: subject.map(str::to_string), magic: 0 }
    }

    pub fn mode(subject: Option<&str>) -> Key {
        Key::Mode { subject: subject.map(str::to_string), magic: 0 }
    }

    pub fn id_allocation() -> Key {
        Key::IdAllocation { magic: 0 }
    }
}

/// A version of a subject: the schema, its id, whether it is soft-deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaValue {
    pub subject: String,
    pub version: i32,
    pub id: i32,
    #[serde(rename = "schemaType", default, skip_serializing_if = "SchemaType::is_avro")]
    pub schema_type: SchemaType,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<Reference>,
    pub schema: String,
    #[serde(default)]
    pub deleted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigValue {
    #[serde(rename = "compatibilityLevel")]
    pub compatibility_level: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModeValue {
    pub mode: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdAllocationValue {
    pub next_id: i32,
}

/// A change to write: a key and its new value (`None`: a tombstone).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub key: Key,
    pub value: Option<serde_json::Value>,
}

impl Change {
    pub fn put(key: Key, value: impl Serialize) -> Change {
        Change { key, value: Some(serde_json::to_value(value).expect("registry values serialize")) }
    }

    pub fn remove(key: Key) -> Change {
        Change { key, value: None }
    }

    /// The record's key and value bytes.
    pub fn encode(&self) -> (bytes::Bytes, Option<bytes::Bytes>) {
        let key = serde_json::to_vec(&self.key).expect("registry keys serialize");
        let value = self.value.as_ref().map(|v| bytes::Bytes::from(v.to_string()));
        (bytes::Bytes::from(key), value)
    }

    /// Decodes a record of `_schemas`; `None` for a key this registry does not know (it
    /// is skipped, as a newer writer's record type would be).
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Option<Result<Change, String>> {
        let key: Key = match serde_json::from_slice(key) {
            Ok(key) => key,
            Err(_) => return None,
        };
        let value = match value.map(serde_json::from_slice::<serde_json::Value>) {
            None => None,
            Some(Ok(value)) => Some(value),
            Some(Err(error)) => return Some(Err(format!("value of {key:?}: {error}"))),
        };
        Some(Ok(Change { key, value }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_confluents_shape() {
        let key = serde_json::to_value(Key::schema("s", 3)).unwrap();
        assert_eq!(key, serde_json::json!({"keytype":"SCHEMA","subject":"s","version":3,"magic":1}));
        let key = serde_json::to_value(Key::config(None)).unwrap();
        assert_eq!(key, serde_json::json!({"keytype":"CONFIG","subject":null,"magic":0}));
    }

    #[test]
    fn records_round_trip_and_unknown_keys_are_skipped() {
        let value = SchemaValue {
            subject: "s".into(),
            version: 1,
            id: 7,
            schema_type: SchemaType::Json,
            references: vec![],
            schema: "{}".into(),
            deleted: false,
        };
        let change = Change::put(Key::schema("s", 1), &value);
        let (key, bytes) = change.encode();
        assert_eq!(Change::decode(&key, bytes.as_deref()).unwrap().unwrap(), change);
        assert!(Change::decode(br#"{"keytype":"SOMETHING_NEW"}"#, None).is_none());
        assert!(Change::decode(br#"{"keytype":"SCHEMA","subject":"s","version":1,"magic":1}"#, Some(b"{"))
            .unwrap()
            .is_err());
    }
}
