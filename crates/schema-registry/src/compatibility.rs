//! Whether a new version of a subject may follow the ones before it, as Confluent's
//! compatibility levels define it: BACKWARD (the new schema reads data written with the
//! previous one; the default), FORWARD (the previous schema reads data written with the
//! new one), FULL (both), each against the latest version only or, `_TRANSITIVE`, against
//! every version; NONE checks nothing.
//!
//! Avro uses `apache-avro`'s schema resolution check. Protobuf checks, per message both
//! define, that a field number keeps its kind (within Protobuf's wire-compatible groups,
//! e.g. int32/int64/uint32/uint64/bool) and its cardinality, that no message the writer has
//! is missing for the reader, and that the reader requires no field the writer lacks.
//! JSON Schema uses the subset of
//! Confluent's JSON rules that decides most real evolutions: types may only widen for the
//! reader (integer to number), an enum may only grow, a property the writer may send must
//! be allowed by the reader (a closed content model refuses additions), and a property the
//! reader requires must be required by the writer.

use serde_json::Value;

use crate::schema::Parsed;

/// A subject's (or the registry's default) compatibility level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Level {
    #[default]
    Backward,
    BackwardTransitive,
    Forward,
    ForwardTransitive,
    Full,
    FullTransitive,
    None,
}

impl Level {
    pub fn parse(name: &str) -> Option<Level> {
        Some(match name.to_ascii_uppercase().as_str() {
            "BACKWARD" => Level::Backward,
            "BACKWARD_TRANSITIVE" => Level::BackwardTransitive,
            "FORWARD" => Level::Forward,
            "FORWARD_TRANSITIVE" => Level::ForwardTransitive,
            "FULL" => Level::Full,
            "FULL_TRANSITIVE" => Level::FullTransitive,
            "NONE" => Level::None,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Backward => "BACKWARD",
            Level::BackwardTransitive => "BACKWARD_TRANSITIVE",
            Level::Forward => "FORWARD",
            Level::ForwardTransitive => "FORWARD_TRANSITIVE",
            Level::Full => "FULL",
            Level::FullTransitive => "FULL_TRANSITIVE",
            Level::None => "NONE",
        }
    }

    fn transitive(self) -> bool {
        matches!(self, Level::BackwardTransitive | Level::ForwardTransitive | Level::FullTransitive)
    }

    fn backward(self) -> bool {
        matches!(self, Level::Backward | Level::BackwardTransitive | Level::Full | Level::FullTransitive)
    }

    fn forward(self) -> bool {
        matches!(self, Level::Forward | Level::ForwardTransitive | Level::Full | Level::FullTransitive)
    }
}

/// Checks `new` against `previous` (oldest first) at `level`: the reasons it may not
/// follow them, empty when it may.
pub fn check(level: Level, new: &Parsed, previous: &[Parsed]) -> Vec<String> {
    let against: &[Parsed] = match (level, previous.split_last()) {
        (Level::None, _) | (_, None) => return Vec::new(),
        (level, Some((_, _))) if level.transitive() => previous,
        (_, Some(_)) => &previous[previous.len() - 1..],
    };
    let mut reasons = Vec::new();
    for old in against.iter().rev() {
        if level.backward() {
            reasons.extend(
                can_read(old, new)
                    .err()
                    .map(|why| format!("the new schema cannot read data written with an older one: {why}")),
            );
        }
        if level.forward() {
            reasons.extend(
                can_read(new, old)
                    .err()
                    .map(|why| format!("an older schema cannot read data written with the new one: {why}")),
            );
        }
    }
    reasons
}

/// Whether data written with `writer` can be read with `reader`.
fn can_read(writer: &Parsed, reader: &Parsed) -> Result<(), String> {
    match (writer, reader) {
        (Parsed::Avro(writer), Parsed::Avro(reader)) => {
            apache_avro::schema_compatibility::SchemaCompatibility::can_read(writer, reader)
                .map_err(|error| error.to_string())
        }
        (Parsed::Json(writer), Parsed::Json(reader)) => json_reader_accepts(writer, reader, "#"),
        (Parsed::Protobuf(writer), Parsed::Protobuf(reader)) => protobuf_reader_accepts(writer, reader),
        _ => Err("the schema type changed".to_string()),
    }
}

/// Whether messages written with `writer`'s types parse with `reader`'s.
fn protobuf_reader_accepts(
    writer: &prost_types::FileDescriptorProto,
    reader: &prost_types::FileDescriptorProto,
) -> Result<(), String> {
    let read = messages_of(reader);
    for (name, written) in messages_of(writer) {
        let Some(read) = read.get(&name) else { return Err(format!("message {name} was removed")) };
        for field in &written.field {
            if let Some(other) = read.field.iter().find(|f| f.number == field.number) {
                check_field(&name, field, other)?;
            }
        }
        for field in &read.field {
            let required = field.label == Some(prost_types::field_descriptor_proto::Label::Required as i32);
            if required && !written.field.iter().any(|f| f.number == field.number) {
                return Err(format!("{name}: required field {} was added", field.name()));
            }
        }
    }
    Ok(())
}

/// Every message of a file, nested ones included, by its name within the file.
fn messages_of(
    file: &prost_types::FileDescriptorProto,
) -> std::collections::BTreeMap<String, &prost_types::DescriptorProto> {
    fn add<'a>(
        prefix: &str,
        messages: &'a [prost_types::DescriptorProto],
        into: &mut std::collections::BTreeMap<String, &'a prost_types::DescriptorProto>,
    ) {
        for message in messages {
            let name = format!("{prefix}{}", message.name());
            add(&format!("{name}."), &message.nested_type, into);
            into.insert(name, message);
        }
    }
    let mut into = std::collections::BTreeMap::new();
    add("", &file.message_type, &mut into);
    into
}

/// A field's wire kind: scalars in groups Protobuf reads interchangeably, named types by
/// their last name (a `.proto` text names them as written, a descriptor fully qualified).
fn field_kind(field: &prost_types::FieldDescriptorProto) -> String {
    use prost_types::field_descriptor_proto::Type;
    if !field.type_name().is_empty() {
        return field.type_name().rsplit('.').next().unwrap_or_default().to_string();
    }
    let group = match field.r#type() {
        Type::Int32 | Type::Int64 | Type::Uint32 | Type::Uint64 | Type::Bool => "varint",
        Type::Sint32 | Type::Sint64 => "zigzag",
        Type::Fixed32 | Type::Sfixed32 => "fixed32",
        Type::Fixed64 | Type::Sfixed64 => "fixed64",
        Type::String | Type::Bytes => "length-delimited",
        other => return format!("{other:?}"),
    };
    group.to_string()
}

fn check_field(
    message: &str,
    writer: &prost_types::FieldDescriptorProto,
    reader: &prost_types::FieldDescriptorProto,
) -> Result<(), String> {
    use prost_types::field_descriptor_proto::Label;
    let (written, read) = (field_kind(writer), field_kind(reader));
    if written != read {
        return Err(format!("{message}: field {} changed from {written} to {read}", writer.number()));
    }
    let repeated = |f: &prost_types::FieldDescriptorProto| f.label == Some(Label::Repeated as i32);
    if repeated(writer) != repeated(reader) {
        return Err(format!("{message}: field {} changed between repeated and single", writer.number()));
    }
    Ok(())
}

/// Whether every document `writer` accepts is accepted by `reader` (the checked subset).
fn json_reader_accepts(writer: &Value, reader: &Value, at: &str) -> Result<(), String> {
    match (writer, reader) {
        (_, Value::Bool(true)) => return Ok(()),
        (Value::Bool(false), _) => return Ok(()),
        (_, Value::Bool(false)) => return Err(format!("{at}: the reader accepts nothing")),
        (Value::Bool(true), _) => return Err(format!("{at}: the writer accepts anything, the reader does not")),
        _ => {}
    }
    check_types(writer, reader, at)?;
    check_enum(writer, reader, at)?;
    check_properties(writer, reader, at)?;
    if let (Some(w), Some(r)) = (writer.get("items"), reader.get("items")) {
        json_reader_accepts(w, r, &format!("{at}/items"))?;
    }
    Ok(())
}

/// The JSON types a schema allows (`None`: any).
fn types_of(schema: &Value) -> Option<Vec<&str>> {
    match schema.get("type")? {
        Value::String(name) => Some(vec![name.as_str()]),
        Value::Array(names) => Some(names.iter().filter_map(Value::as_str).collect()),
        _ => None,
    }
}

fn check_types(writer: &Value, reader: &Value, at: &str) -> Result<(), String> {
    let Some(allowed) = types_of(reader) else { return Ok(()) };
    let Some(written) = types_of(writer) else {
        return Err(format!("{at}: the reader narrows an unrestricted type to {allowed:?}"));
    };
    for kind in written {
        let accepted = allowed.contains(&kind) || (kind == "integer" && allowed.contains(&"number"));
        if !accepted {
            return Err(format!("{at}: type {kind} is not accepted by the reader (it allows {allowed:?})"));
        }
    }
    Ok(())
}

fn check_enum(writer: &Value, reader: &Value, at: &str) -> Result<(), String> {
    let Some(Value::Array(allowed)) = reader.get("enum") else { return Ok(()) };
    let Some(Value::Array(written)) = writer.get("enum") else {
        return Err(format!("{at}: the reader restricts values to an enum the writer does not have"));
    };
    match written.iter().find(|value| !allowed.contains(value)) {
        Some(value) => Err(format!("{at}: enum value {value} was removed")),
        None => Ok(()),
    }
}

fn check_properties(writer: &Value, reader: &Value, at: &str) -> Result<(), String> {
    let empty = serde_json::Map::new();
    let written = writer.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let read = reader.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let writer_open = writer.get("additionalProperties") != Some(&Value::Bool(false));
    let reader_open = reader.get("additionalProperties") != Some(&Value::Bool(false));
    for (name, w) in written {
        match read.get(name) {
            Some(r) => json_reader_accepts(w, r, &format!("{at}/properties/{name}"))?,
            None if !reader_open => {
                return Err(format!("{at}: property {name:?} was removed from a closed content model"))
            }
            None => {}
        }
    }
    for (name, r) in read {
        if !written.contains_key(name) && writer_open && r != &Value::Bool(true) && r != &Value::Object(empty.clone()) {
            return Err(format!("{at}: property {name:?} was added to an open content model"));
        }
    }
    let required = |schema: &Value| -> Vec<String> {
        schema
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(|n| n.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    let writer_required = required(writer);
    match required(reader).into_iter().find(|name| !writer_required.contains(name)) {
        Some(name) => Err(format!("{at}: property {name:?} is required by the reader but not by the writer")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::SchemaType;

    fn avro(text: &str) -> Parsed {
        Parsed::parse(SchemaType::Avro, text, &[]).unwrap()
    }

    fn record(fields: &str) -> Parsed {
        avro(&format!(r#"{{"type":"record","name":"r","fields":[{fields}]}}"#))
    }

    #[test]
    fn avro_levels_decide_as_confluent_documents() {
        let v1 = record(r#"{"name":"a","type":"int"}"#);
        let added_with_default = record(r#"{"name":"a","type":"int"},{"name":"b","type":"string","default":""}"#);
        let added_without_default = record(r#"{"name":"a","type":"int"},{"name":"b","type":"string"}"#);
        let removed = record(r#"{"name":"b","type":"string","default":""}"#);
        // A field added with a default: readable both ways.
        assert!(check(Level::Full, &added_with_default, std::slice::from_ref(&v1)).is_empty());
        // Added without a default: new readers cannot read old data; old readers ignore it.
        assert!(!check(Level::Backward, &added_without_default, std::slice::from_ref(&v1)).is_empty());
        assert!(check(Level::Forward, &added_without_default, std::slice::from_ref(&v1)).is_empty());
        // A field without a default removed: old readers cannot read new data.
        assert!(check(Level::Backward, &removed, std::slice::from_ref(&added_with_default)).is_empty());
        assert!(!check(Level::Forward, &removed, std::slice::from_ref(&v1)).is_empty());
        assert!(check(Level::None, &avro(r#""string""#), std::slice::from_ref(&v1)).is_empty());
    }

    #[test]
    fn transitive_levels_check_every_version_others_only_the_latest() {
        let v1 = record(r#"{"name":"a","type":"int"}"#);
        let v2 = record(r#"{"name":"a","type":"int","default":0}"#);
        let v3 = record(r#"{"name":"c","type":"int","default":0}"#);
        // v3 drops `a`: v2 reads v3 data (a has a default there), v1 cannot.
        assert!(check(Level::Forward, &v3, &[v1.clone(), v2.clone()]).is_empty());
        assert_eq!(check(Level::ForwardTransitive, &v3, &[v1.clone(), v2.clone()]).len(), 1);
        let v2b = record(r#"{"name":"a","type":"int"},{"name":"b","type":"int","default":1}"#);
        let v3b = record(r#"{"name":"b","type":"int","default":1}"#);
        assert!(check(Level::Backward, &v3b, &[v1.clone(), v2b.clone()]).is_empty());
        let v4 = record(r#"{"name":"b","type":"int","default":1},{"name":"z","type":"int"}"#);
        assert!(!check(Level::BackwardTransitive, &v4, &[v1, v2b, v3b]).is_empty());
    }

    fn json(text: &str) -> Parsed {
        Parsed::parse(SchemaType::Json, text, &[]).unwrap()
    }

    fn proto(text: &str) -> Parsed {
        Parsed::parse(SchemaType::Protobuf, text, &[]).unwrap()
    }

    #[test]
    fn protobuf_rules() {
        let v1 = proto("syntax = \"proto3\"; message M { int32 a = 1; string b = 2; }");
        let added = proto("syntax = \"proto3\"; message M { int32 a = 1; string b = 2; int64 c = 3; }");
        let widened = proto("syntax = \"proto3\"; message M { int64 a = 1; string b = 2; }");
        let retyped = proto("syntax = \"proto3\"; message M { string a = 1; string b = 2; }");
        let repeated = proto("syntax = \"proto3\"; message M { repeated int32 a = 1; string b = 2; }");
        let renamed = proto("syntax = \"proto3\"; message N { int32 a = 1; string b = 2; }");
        assert!(check(Level::Full, &added, std::slice::from_ref(&v1)).is_empty());
        assert!(check(Level::Full, &widened, std::slice::from_ref(&v1)).is_empty());
        assert!(!check(Level::Backward, &retyped, std::slice::from_ref(&v1)).is_empty());
        assert!(!check(Level::Backward, &repeated, std::slice::from_ref(&v1)).is_empty());
        assert!(!check(Level::Backward, &renamed, std::slice::from_ref(&v1)).is_empty());
        let required = Parsed::parse(
            SchemaType::Protobuf,
            "syntax = \"proto2\"; message M { optional int32 a = 1; required int32 z = 9; }",
            &[],
        )
        .unwrap();
        let old2 = Parsed::parse(SchemaType::Protobuf, "syntax = \"proto2\"; message M { optional int32 a = 1; }", &[])
            .unwrap();
        assert!(!check(Level::Backward, &required, std::slice::from_ref(&old2)).is_empty());
    }

    #[test]
    fn json_rules() {
        let open = json(r#"{"type":"object","properties":{"a":{"type":"integer"}}}"#);
        let closed = json(r#"{"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false}"#);
        let closed_added = json(
            r#"{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"additionalProperties":false}"#,
        );
        let widened = json(r#"{"type":"object","properties":{"a":{"type":"number"}}}"#);
        let required = json(r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}"#);
        assert!(check(Level::Backward, &widened, std::slice::from_ref(&open)).is_empty());
        assert!(!check(Level::Forward, &widened, std::slice::from_ref(&open)).is_empty());
        assert!(check(Level::Backward, &closed_added, std::slice::from_ref(&closed)).is_empty());
        assert!(!check(Level::Forward, &closed_added, std::slice::from_ref(&closed)).is_empty());
        assert!(!check(Level::Backward, &required, std::slice::from_ref(&open)).is_empty());
        assert!(check(Level::Forward, &required, std::slice::from_ref(&open)).is_empty());
    }
}
