//! What a registered schema is: its type, text and references, parsed so that two
//! registrations of the same schema are recognised (by a canonical form) and a new
//! version can be checked against older ones (see `compatibility`).
//!
//! Avro is parsed by `apache-avro` (references resolved as named types); JSON Schema is
//! parsed as JSON and must be an object or a boolean, its canonical form being the JSON
//! re-serialized with sorted keys. Protobuf comes as `.proto` text (parsed by
//! `protox-parse`) or, as confluent-kafka's serializers send it, as a base64
//! `FileDescriptorProto`; either becomes a descriptor, whose encoding is its identity.

use base64::Engine;
use prost::Message;
use serde::{Deserialize, Serialize};

/// The schema languages this registry answers for, in `/schemas/types` order.
pub const SUPPORTED_TYPES: [SchemaType; 3] = [SchemaType::Json, SchemaType::Protobuf, SchemaType::Avro];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum SchemaType {
    #[default]
    #[serde(rename = "AVRO")]
    Avro,
    #[serde(rename = "JSON")]
    Json,
    #[serde(rename = "PROTOBUF")]
    Protobuf,
}

impl SchemaType {
    pub fn parse(name: &str) -> Option<SchemaType> {
        match name.to_ascii_uppercase().as_str() {
            "AVRO" => Some(SchemaType::Avro),
            "JSON" => Some(SchemaType::Json),
            "PROTOBUF" => Some(SchemaType::Protobuf),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SchemaType::Avro => "AVRO",
            SchemaType::Json => "JSON",
            SchemaType::Protobuf => "PROTOBUF",
        }
    }

    pub fn is_avro(&self) -> bool {
        *self == SchemaType::Avro
    }
}

/// A reference from one schema to a version of another subject's, by the name the
/// referring schema uses for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Reference {
    pub name: String,
    pub subject: String,
    pub version: i32,
}

/// A schema parsed: what compatibility checks read.
#[derive(Debug, Clone)]
pub enum Parsed {
    Avro(apache_avro::Schema),
    Json(serde_json::Value),
    Protobuf(Box<prost_types::FileDescriptorProto>),
}

impl Parsed {
    /// Parses `text` of `schema_type`; `referenced` are the texts of the schemas its
    /// references name, in order. The error says what is wrong, for the client.
    pub fn parse(schema_type: SchemaType, text: &str, referenced: &[String]) -> Result<Parsed, String> {
        match schema_type {
            SchemaType::Avro => {
                let schema = if referenced.is_empty() {
                    apache_avro::Schema::parse_str(text)
                } else {
                    apache_avro::Schema::parse_str_with_list(text, referenced).map(|(schema, _)| schema)
                };
                schema.map(Parsed::Avro).map_err(|error| error.to_string())
            }
            SchemaType::Json => {
                let value: serde_json::Value = serde_json::from_str(text).map_err(|error| error.to_string())?;
                if !(value.is_object() || value.is_boolean()) {
                    return Err("a JSON schema must be an object or a boolean".to_string());
                }
                check_json_schema_shape(&value)?;
                Ok(Parsed::Json(value))
            }
            SchemaType::Protobuf => parse_protobuf(text).map(|descriptor| Parsed::Protobuf(Box::new(descriptor))),
        }
    }

    /// The schema as `?format=serialized` answers it: a Protobuf schema as a base64
    /// `FileDescriptorProto` (what confluent-kafka's deserializers read); `None` for the
    /// other types, whose text is their only form.
    pub fn serialized(&self) -> Option<String> {
        match self {
            Parsed::Protobuf(descriptor) => {
                Some(base64::engine::general_purpose::STANDARD.encode(descriptor.encode_to_vec()))
            }
            _ => None,
        }
    }

    /// The form two registrations of one schema share: the schema as its parser
    /// understood it, re-serialized with a fixed key order and no whitespace. Not Avro's
    /// Parsing Canonical Form: that drops defaults, docs and logical types, and two schemas
    /// differing in a default are different versions to a registry.
    pub fn canonical(&self) -> String {
        match self {
            Parsed::Avro(schema) => {
                sorted_json(&serde_json::to_value(schema).expect("Avro schemas serialize")).to_string()
            }
            Parsed::Json(value) => sorted_json(value).to_string(),
            Parsed::Protobuf(_) => self.serialized().expect("a Protobuf schema has a serialized form"),
        }
    }
}

/// A `.proto` file's text, or a base64 `FileDescriptorProto`, as a descriptor without
/// source positions (so formatting does not change its identity).
fn parse_protobuf(text: &str) -> Result<prost_types::FileDescriptorProto, String> {
    let decoded = base64::engine::general_purpose::STANDARD.decode(text.trim()).ok();
    let mut descriptor = match decoded.and_then(|bytes| prost_types::FileDescriptorProto::decode(bytes.as_slice()).ok())
    {
        Some(descriptor) => descriptor,
        None => protox_parse::parse(PROTO_FILE_NAME, text).map_err(|error| error.to_string())?,
    };
    descriptor.source_code_info = None;
    if descriptor.message_type.is_empty() && descriptor.enum_type.is_empty() && descriptor.service.is_empty() {
        return Err("a Protobuf schema must define a message, an enum or a service".to_string());
    }
    Ok(descriptor)
}

/// The file name a `.proto` text is parsed under (it names no file of its own).
const PROTO_FILE_NAME: &str = "schema.proto";

/// `value` with every object's keys in sorted order (whatever order the map type keeps).
fn sorted_json(value: &serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(object) => {
            let mut entries: Vec<(&String, &serde_json::Value)> = object.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k.clone(), sorted_json(v))).collect())
        }
        serde_json::Value::Array(items) => serde_json::Value::Array(items.iter().map(sorted_json).collect()),
        other => other.clone(),
    }
}

/// The keywords whose values must have a given JSON type, checked so that a schema a
/// validator would reject is refused at registration rather than by every consumer.
fn check_json_schema_shape(value: &serde_json::Value) -> Result<(), String> {
    let Some(object) = value.as_object() else { return Ok(()) };
    if let Some(kind) = object.get("type") {
        let valid = |name: &serde_json::Value| {
            matches!(name.as_str(), Some("object" | "array" | "string" | "number" | "integer" | "boolean" | "null"))
        };
        let ok = match kind {
            serde_json::Value::Array(names) => names.iter().all(valid),
            name => valid(name),
        };
        if !ok {
            return Err(format!("invalid \"type\": {kind}"));
        }
    }
    if let Some(properties) = object.get("properties") {
        let properties = properties.as_object().ok_or("\"properties\" must be an object")?;
        for (name, schema) in properties {
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(format!("property {name:?} must be a schema"));
            }
            check_json_schema_shape(schema)?;
        }
    }
    if let Some(required) = object.get("required") {
        let names = required.as_array().ok_or("\"required\" must be an array")?;
        if !names.iter().all(|name| name.is_string()) {
            return Err("\"required\" must list property names".to_string());
        }
    }
    if let Some(items) = object.get("items") {
        check_json_schema_shape(items)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avro_canonical_form_ignores_formatting_and_key_order() {
        let a = Parsed::parse(
            SchemaType::Avro,
            r#"{"type":"record","name":"r","fields":[{"name":"a","type":"int"}]}"#,
            &[],
        )
        .unwrap();
        let b = Parsed::parse(
            SchemaType::Avro,
            r#"{ "name": "r", "type": "record", "fields": [ {"type": "int", "name": "a"} ] }"#,
            &[],
        )
        .unwrap();
        assert_eq!(a.canonical(), b.canonical());
    }

    #[test]
    fn a_changed_default_is_a_different_schema() {
        let plain = r#"{"type":"record","name":"r","fields":[{"name":"a","type":"int"}]}"#;
        let with_default = r#"{"type":"record","name":"r","fields":[{"name":"a","type":"int","default":0}]}"#;
        let plain = Parsed::parse(SchemaType::Avro, plain, &[]).unwrap();
        let with_default = Parsed::parse(SchemaType::Avro, with_default, &[]).unwrap();
        assert_ne!(plain.canonical(), with_default.canonical());
    }

    #[test]
    fn invalid_schemas_are_refused_with_a_reason() {
        assert!(Parsed::parse(SchemaType::Avro, r#"{"type":"recrd"}"#, &[]).is_err());
        assert!(Parsed::parse(SchemaType::Avro, "not json", &[]).is_err());
        assert!(Parsed::parse(SchemaType::Json, "[1]", &[]).is_err());
        assert!(Parsed::parse(SchemaType::Json, r#"{"type":"objet"}"#, &[]).is_err());
        assert!(Parsed::parse(SchemaType::Json, r#"{"required":"a"}"#, &[]).is_err());
        assert!(Parsed::parse(SchemaType::Protobuf, "syntax = \"proto3\";", &[]).is_err());
        assert!(Parsed::parse(SchemaType::Protobuf, "message M { int32 a = ; }", &[]).is_err());
    }

    #[test]
    fn protobuf_text_and_its_descriptor_are_one_schema() {
        let text = "syntax = \"proto3\";\npackage p;\nmessage M {\n  int32 a = 1;\n  string b = 2;\n}\n";
        let parsed = Parsed::parse(SchemaType::Protobuf, text, &[]).unwrap();
        let serialized = parsed.serialized().unwrap();
        let again = Parsed::parse(SchemaType::Protobuf, &serialized, &[]).unwrap();
        assert_eq!(parsed.canonical(), again.canonical());
        let reformatted = "syntax = \"proto3\"; package p; message M { int32 a = 1; string b = 2; }";
        assert_eq!(Parsed::parse(SchemaType::Protobuf, reformatted, &[]).unwrap().canonical(), parsed.canonical());
    }

    #[test]
    fn avro_references_resolve_named_types() {
        let address = r#"{"type":"record","name":"Address","fields":[{"name":"city","type":"string"}]}"#.to_string();
        let person = r#"{"type":"record","name":"Person","fields":[{"name":"home","type":"Address"}]}"#;
        assert!(Parsed::parse(SchemaType::Avro, person, &[]).is_err());
        assert!(Parsed::parse(SchemaType::Avro, person, &[address]).is_ok());
    }
}
