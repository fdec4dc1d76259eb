//! Decoding a key or value that Confluent's serializers wrote, by the schema it names, to
//! pretty JSON: what the console shows instead of the bytes.
//!
//! Why here: the registry already holds every schema by id and parses them (references
//! resolved as `GET /schemas/ids/{id}` gives them to a client), so a reader of the topics
//! needs no registry client of its own. The framing is Confluent's: byte 0 is 0, bytes 1..5
//! the schema id (big-endian), then for Protobuf the message indexes (a zigzag varint
//! count, then that many zigzag varints; a count of 0 means the first message of the
//! file), then the payload: an Avro binary datum, a Protobuf message or JSON text.
//!
//! Bytes that are not so framed, or name an id the registry does not know, are not
//! decoded (`None`): plenty of plain values start with a 0 byte. A known schema whose
//! payload does not decode is an error the reader is shown. The bytes come from any
//! producer, so nothing here may panic, recurse without bound or allocate by a length the
//! bytes claim: Avro lengths are bounded ([`AVRO_ALLOCATION_BYTES_MAX`]), recursive Avro
//! schemas are not decoded (their depth would follow the bytes), Protobuf nesting is
//! bounded by `prost`'s recursion limit and JSON by `serde_json`'s.
//!
//! Parsed schemas are cached by id ([`SCHEMAS_CACHED_MAX`]): a page of messages parses
//! each schema once. A schema id is never given to another schema, so an entry never goes
//! stale. An id the state does not know makes the registry catch up with its log, at most
//! once per [`CATCH_UP_INTERVAL`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apache_avro::schema::{Name, NamesRef, Namespace, ResolvedSchema};
use apache_avro::types::Value as AvroValue;
use apache_avro::Schema as AvroSchema;
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use crate::records::SchemaValue;
use crate::registry::{referenced_texts, Registry, REFERENCE_DEPTH_MAX};
use crate::schema::{Parsed, SchemaType};
use crate::state::State;

/// Parsed schemas kept at most; past it an arbitrary one is dropped.
pub const SCHEMAS_CACHED_MAX: usize = 1_000;
/// How often an unknown id may make the registry read its log again.
pub const CATCH_UP_INTERVAL: Duration = Duration::from_secs(1);
/// The longest length (of bytes, a string, an array or map block) an Avro datum may
/// claim. `apache-avro` allocates what a length says before reading it; this process
/// decodes Avro only here, so its process-wide bound is set to this.
pub const AVRO_ALLOCATION_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Protobuf message indexes read at most (a message nested deeper is not decoded).
pub const MESSAGE_INDEXES_MAX: usize = 32;
/// Steps of the walk that looks for recursion in an Avro schema; a schema that needs
/// more is treated as recursive (not decoded).
const AVRO_WALK_STEPS_MAX: usize = 100_000;

/// The magic byte of Confluent's framing.
const MAGIC: u8 = 0;
/// The magic byte and the schema id.
const HEADER_BYTES: usize = 5;

/// A key or value decoded by its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub schema_type: SchemaType,
    pub schema_id: i32,
    /// The value as pretty-printed JSON.
    pub json: String,
}

/// A schema ready to decode with.
enum Compiled {
    Avro { schema: AvroSchema, referenced: Vec<AvroSchema> },
    Protobuf { pool: DescriptorPool, file: Box<prost_types::FileDescriptorProto> },
    Json,
}

/// What the cache holds for an id: the compiled schema, or why it cannot decode.
type Entry = Arc<Result<Compiled, String>>;

/// Decodes framed keys and values with the schemas of `registry`.
pub struct Decoder {
    registry: Arc<Registry>,
    cache: Mutex<HashMap<i32, Entry>>,
    caught_up_at: Mutex<Option<Instant>>,
}

impl Decoder {
    pub fn new(registry: Arc<Registry>) -> Decoder {
        let bound = apache_avro::util::max_allocation_bytes(AVRO_ALLOCATION_BYTES_MAX);
        if bound != AVRO_ALLOCATION_BYTES_MAX {
            tracing::warn!(bound, "apache-avro's allocation bound was set elsewhere");
        }
        Decoder { registry, cache: Mutex::new(HashMap::new()), caught_up_at: Mutex::new(None) }
    }

    /// `bytes` decoded: `None` when they are not framed or name an unknown schema id,
    /// else the JSON or why the payload does not decode by its schema.
    pub fn decode(&self, bytes: &[u8]) -> Option<Result<Decoded, String>> {
        let (schema_id, payload) = framed(bytes)?;
        let entry = self.compiled(schema_id)?;
        let (schema_type, json) = match &*entry {
            Ok(compiled) => (compiled.schema_type(), compiled.decode(payload)),
            Err(why) => return Some(Err(format!("schema {schema_id}: {why}"))),
        };
        Some(json.map(|json| Decoded { schema_type, schema_id, json }))
    }

    /// The compiled schema `id`, from the cache or the registry's state (caught up when it
    /// does not know the id, at most once per interval).
    fn compiled(&self, id: i32) -> Option<Entry> {
        if let Some(entry) = self.cache.lock().ok()?.get(&id) {
            return Some(entry.clone());
        }
        let mut found = self.registry.read_applied(|state| compile(state, id));
        if found.is_none() && self.may_catch_up() {
            if let Err(error) = self.registry.catch_up() {
                tracing::debug!(%error, "the schema registry could not catch up to decode a message");
            }
            found = self.registry.read_applied(|state| compile(state, id));
        }
        let entry = Arc::new(found?);
        let mut cache = self.cache.lock().ok()?;
        if cache.len() >= SCHEMAS_CACHED_MAX {
            if let Some(dropped) = cache.keys().next().copied() {
                cache.remove(&dropped);
            }
        }
        cache.insert(id, entry.clone());
        Some(entry)
    }

    fn may_catch_up(&self) -> bool {
        let Ok(mut at) = self.caught_up_at.lock() else { return false };
        if at.is_some_and(|at| at.elapsed() < CATCH_UP_INTERVAL) {
            return false;
        }
        *at = Some(Instant::now());
        true
    }
}

/// The schema id and the rest of Confluent-framed bytes.
fn framed(bytes: &[u8]) -> Option<(i32, &[u8])> {
    if bytes.len() < HEADER_BYTES || bytes[0] != MAGIC {
        return None;
    }
    let id = i32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    Some((id, &bytes[HEADER_BYTES..]))
}

/// Schema `id` compiled; `None` when the state does not know it.
fn compile(state: &State, id: i32) -> Option<Result<Compiled, String>> {
    let value = state.by_id(id)?;
    Some(match value.schema_type {
        SchemaType::Avro => compile_avro(state, value),
        SchemaType::Protobuf => compile_protobuf(state, value),
        SchemaType::Json => Ok(Compiled::Json),
    })
}

fn compile_avro(state: &State, value: &SchemaValue) -> Result<Compiled, String> {
    let texts = referenced_texts(state, &value.references, 0).map_err(|error| error.to_string())?;
    let (schema, referenced) = if texts.is_empty() {
        (AvroSchema::parse_str(&value.schema).map_err(|error| error.to_string())?, Vec::new())
    } else {
        AvroSchema::parse_str_with_list(&value.schema, &texts).map_err(|error| error.to_string())?
    };
    let all: Vec<&AvroSchema> = referenced.iter().chain([&schema]).collect();
    let resolved = ResolvedSchema::try_from(all).map_err(|error| error.to_string())?;
    let mut steps = 0;
    if recursive(&schema, resolved.get_names(), &None, &mut Vec::new(), &mut steps) {
        return Err("a recursive Avro schema, or one with an array of items that take no bytes, is not decoded \
                    (its size would be bounded by nothing but the message's claims)"
            .to_string());
    }
    Ok(Compiled::Avro { schema, referenced })
}

/// Whether `schema` (in `namespace`, inside the named types of `path`) names one of its
/// own enclosing types, so a datum's depth is bounded only by its bytes, or has an array of
/// items that take no bytes; also true when a name does not resolve or the walk takes too
/// long (either way: not decoded).
fn recursive(
    schema: &AvroSchema,
    names: &NamesRef<'_>,
    namespace: &Namespace,
    path: &mut Vec<Name>,
    steps: &mut usize,
) -> bool {
    *steps += 1;
    if *steps > AVRO_WALK_STEPS_MAX {
        return true;
    }
    match schema {
        AvroSchema::Array(array) => {
            takes_no_bytes(&array.items, names, namespace, steps)
                || recursive(&array.items, names, namespace, path, steps)
        }
        AvroSchema::Map(map) => recursive(&map.types, names, namespace, path, steps),
        AvroSchema::Union(union) => union.variants().iter().any(|v| recursive(v, names, namespace, path, steps)),
        AvroSchema::Decimal(decimal) => recursive(&decimal.inner, names, namespace, path, steps),
        AvroSchema::Record(record) => {
            let name = record.name.fully_qualified_name(namespace);
            if path.contains(&name) {
                return true;
            }
            let inner = name.namespace.clone();
            path.push(name);
            let found = record.fields.iter().any(|field| recursive(&field.schema, names, &inner, path, steps));
            path.pop();
            found
        }
        AvroSchema::Ref { name } => {
            let name = name.fully_qualified_name(namespace);
            if path.contains(&name) {
                return true;
            }
            match names.get(&name) {
                Some(named) => recursive(named, names, &name.namespace, path, steps),
                None => true,
            }
        }
        _ => false,
    }
}

/// Whether a value of `schema` may take no bytes at all (a null, a record of nulls, an empty
/// fixed): an array of such items is as long as its block counts say, without bytes to
/// bound it. Called on schemas the walk has not yet found recursive, so bounded by `steps`.
fn takes_no_bytes(schema: &AvroSchema, names: &NamesRef<'_>, namespace: &Namespace, steps: &mut usize) -> bool {
    *steps += 1;
    if *steps > AVRO_WALK_STEPS_MAX {
        return true;
    }
    match schema {
        AvroSchema::Null => true,
        AvroSchema::Fixed(fixed) => fixed.size == 0,
        AvroSchema::Decimal(decimal) => takes_no_bytes(&decimal.inner, names, namespace, steps),
        AvroSchema::Record(record) => {
            let inner = record.name.fully_qualified_name(namespace).namespace;
            record.fields.iter().all(|field| takes_no_bytes(&field.schema, names, &inner, steps))
        }
        AvroSchema::Ref { name } => {
            let name = name.fully_qualified_name(namespace);
            names.get(&name).is_none_or(|named| takes_no_bytes(named, names, &name.namespace, steps))
        }
        _ => false,
    }
}

fn compile_protobuf(state: &State, value: &SchemaValue) -> Result<Compiled, String> {
    let mut files = Vec::new();
    referenced_files(state, value, 0, &mut files)?;
    let Parsed::Protobuf(file) = Parsed::parse(SchemaType::Protobuf, &value.schema, &[])? else {
        return Err("not a Protobuf schema".to_string());
    };
    let mut pool = DescriptorPool::global();
    for dependency in files {
        if pool.get_file_by_name(dependency.name()).is_none() {
            pool.add_file_descriptor_proto(dependency).map_err(|error| error.to_string())?;
        }
    }
    pool.add_file_descriptor_proto((*file).clone()).map_err(|error| error.to_string())?;
    Ok(Compiled::Protobuf { pool, file })
}

/// The files `value` imports through its references, each under the name it imports it
/// by, dependencies first.
fn referenced_files(
    state: &State,
    value: &SchemaValue,
    depth: usize,
    files: &mut Vec<prost_types::FileDescriptorProto>,
) -> Result<(), String> {
    if depth > REFERENCE_DEPTH_MAX {
        return Err(format!("references nest deeper than {REFERENCE_DEPTH_MAX}"));
    }
    for reference in &value.references {
        let referenced = state
            .version(&reference.subject, reference.version)
            .ok_or_else(|| format!("reference {} names a version that does not exist", reference.name))?;
        referenced_files(state, referenced, depth + 1, files)?;
        if files.iter().any(|file| file.name() == reference.name) {
            continue;
        }
        let Parsed::Protobuf(mut file) = Parsed::parse(SchemaType::Protobuf, &referenced.schema, &[])? else {
            return Err(format!("reference {} is not a Protobuf schema", reference.name));
        };
        file.name = Some(reference.name.clone());
        files.push(*file);
    }
    Ok(())
}

impl Compiled {
    fn schema_type(&self) -> SchemaType {
        match self {
            Compiled::Avro { .. } => SchemaType::Avro,
            Compiled::Protobuf { .. } => SchemaType::Protobuf,
            Compiled::Json => SchemaType::Json,
        }
    }

    /// `payload` (the bytes after the schema id) as pretty JSON.
    fn decode(&self, payload: &[u8]) -> Result<String, String> {
        match self {
            Compiled::Avro { schema, referenced } => {
                let mut reader = payload;
                let all: Vec<&AvroSchema> = referenced.iter().chain([schema]).collect();
                let datum = apache_avro::from_avro_datum_schemata(schema, all, &mut reader, None)
                    .map_err(|error| format!("not an Avro datum of its schema: {error}"))?;
                if !reader.is_empty() {
                    return Err(format!("{} bytes left after the Avro datum", reader.len()));
                }
                pretty(&AvroJson(&datum))
            }
            Compiled::Protobuf { pool, file } => {
                let (indexes, message) = message_indexes(payload)?;
                let name = message_name(file, &indexes)?;
                let descriptor =
                    pool.get_message_by_name(&name).ok_or_else(|| format!("no message {name} in the schema"))?;
                let decoded = DynamicMessage::decode(descriptor, message)
                    .map_err(|error| format!("not a {name} message: {error}"))?;
                let options = SerializeOptions::new().skip_default_fields(false).use_proto_field_name(true);
                let mut out = Vec::new();
                let mut serializer = serde_json::Serializer::pretty(&mut out);
                decoded.serialize_with_options(&mut serializer, &options).map_err(|error| error.to_string())?;
                String::from_utf8(out).map_err(|error| error.to_string())
            }
            Compiled::Json => {
                let value: serde_json::Value =
                    serde_json::from_slice(payload).map_err(|error| format!("not JSON: {error}"))?;
                pretty(&value)
            }
        }
    }
}

fn pretty(value: &impl Serialize) -> Result<String, String> {
    serde_json::to_string_pretty(value).map_err(|error| error.to_string())
}

/// The message indexes at the start of a Protobuf payload, and the message after them.
fn message_indexes(payload: &[u8]) -> Result<(Vec<i32>, &[u8]), String> {
    let mut rest = payload;
    let count = zigzag_varint(&mut rest)?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    if count < 0 || count as usize > MESSAGE_INDEXES_MAX {
        return Err(format!("{count} message indexes (at most {MESSAGE_INDEXES_MAX} are read)"));
    }
    let indexes = (0..count).map(|_| zigzag_varint(&mut rest)).collect::<Result<Vec<_>, _>>()?;
    Ok((indexes, rest))
}

/// One zigzag-encoded varint (at most 32 bits) taken from the front of `bytes`.
fn zigzag_varint(bytes: &mut &[u8]) -> Result<i32, String> {
    let mut value: u32 = 0;
    for shift in (0..35).step_by(7) {
        let (&byte, rest) = bytes.split_first().ok_or("the message indexes are cut short")?;
        *bytes = rest;
        value |= u32::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
        if byte & 0x80 == 0 {
            return Ok((value >> 1) as i32 ^ -((value & 1) as i32));
        }
    }
    Err("a message index is not a 32-bit varint".to_string())
}

/// The full name of the message `indexes` point at in `file`: a top-level message, then
/// messages nested in it.
fn message_name(file: &prost_types::FileDescriptorProto, indexes: &[i32]) -> Result<String, String> {
    let missing = || format!("no message at indexes {indexes:?} in the schema");
    let (first, nested) = indexes.split_first().ok_or_else(missing)?;
    let mut message = usize::try_from(*first).ok().and_then(|i| file.message_type.get(i)).ok_or_else(missing)?;
    let mut name = match file.package() {
        "" => message.name().to_string(),
        package => format!("{package}.{}", message.name()),
    };
    for index in nested {
        message = usize::try_from(*index).ok().and_then(|i| message.nested_type.get(i)).ok_or_else(missing)?;
        name = format!("{name}.{}", message.name());
    }
    Ok(name)
}

/// An Avro value as JSON: records keep their field order, unions show the value they
/// hold, bytes and fixed (and decimals, which are bytes) are strings whose characters are
/// the bytes (Avro's own JSON encoding), non-finite floats are strings.
struct AvroJson<'a>(&'a AvroValue);

impl Serialize for AvroJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let bytes_text = |bytes: &[u8]| bytes.iter().map(|&b| char::from(b)).collect::<String>();
        let float = |value: f64, serializer: S| match value.is_finite() {
            true => serializer.serialize_f64(value),
            false => serializer.serialize_str(&value.to_string()),
        };
        match self.0 {
            AvroValue::Null => serializer.serialize_unit(),
            AvroValue::Boolean(b) => serializer.serialize_bool(*b),
            AvroValue::Int(n) | AvroValue::Date(n) | AvroValue::TimeMillis(n) => serializer.serialize_i32(*n),
            AvroValue::Long(n)
            | AvroValue::TimeMicros(n)
            | AvroValue::TimestampMillis(n)
            | AvroValue::TimestampMicros(n)
            | AvroValue::TimestampNanos(n)
            | AvroValue::LocalTimestampMillis(n)
            | AvroValue::LocalTimestampMicros(n)
            | AvroValue::LocalTimestampNanos(n) => serializer.serialize_i64(*n),
            AvroValue::Float(x) => float(f64::from(*x), serializer),
            AvroValue::Double(x) => float(*x, serializer),
            AvroValue::Bytes(bytes) | AvroValue::Fixed(_, bytes) => serializer.serialize_str(&bytes_text(bytes)),
            AvroValue::Decimal(decimal) => match <Vec<u8>>::try_from(decimal) {
                Ok(bytes) => serializer.serialize_str(&bytes_text(&bytes)),
                Err(error) => serializer.serialize_str(&error.to_string()),
            },
            AvroValue::BigDecimal(decimal) => serializer.serialize_str(&decimal.to_string()),
            AvroValue::String(text) | AvroValue::Enum(_, text) => serializer.serialize_str(text),
            AvroValue::Uuid(uuid) => serializer.serialize_str(&uuid.to_string()),
            AvroValue::Union(_, inner) => AvroJson(inner).serialize(serializer),
            AvroValue::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&AvroJson(item))?;
                }
                seq.end()
            }
            AvroValue::Map(entries) => {
                let mut sorted: Vec<_> = entries.iter().collect();
                sorted.sort_by(|a, b| a.0.cmp(b.0));
                let mut map = serializer.serialize_map(Some(sorted.len()))?;
                for (key, value) in sorted {
                    map.serialize_entry(key, &AvroJson(value))?;
                }
                map.end()
            }
            AvroValue::Record(fields) => {
                let mut map = serializer.serialize_map(Some(fields.len()))?;
                for (name, value) in fields {
                    map.serialize_entry(name, &AvroJson(value))?;
                }
                map.end()
            }
            AvroValue::Duration(duration) => {
                let mut map = serializer.serialize_map(Some(3))?;
                map.serialize_entry("months", &u32::from(duration.months()))?;
                map.serialize_entry("days", &u32::from(duration.days()))?;
                map.serialize_entry("millis", &u32::from(duration.millis()))?;
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use apache_avro::types::Value;

    use super::*;
    use crate::registry::tests::MemoryLog;
    use crate::registry::SchemaRequest;
    use crate::schema::Reference;

    const ORDER_AVRO: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
        {"name":"id","type":"long"},
        {"name":"customer","type":"string"},
        {"name":"tags","type":{"type":"array","items":"string"}},
        {"name":"note","type":["null","string"]},
        {"name":"digest","type":{"type":"fixed","name":"Digest","size":2}},
        {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":6,"scale":2}},
        {"name":"score","type":"double"}]}"#;

    const SHOP_PROTO: &str = r#"syntax = "proto3";
        package shop;
        message Order {
          int64 id = 1;
          string customer = 2;
          message Line { string sku = 1; int32 qty = 2; }
          repeated Line lines = 3;
        }
        message Refund { int64 order = 1; }
        message Chain { Chain next = 1; }"#;

    async fn register(registry: &Registry, subject: &str, kind: &str, schema: &str, references: Vec<Reference>) -> i32 {
        let request = SchemaRequest {
            schema: schema.to_string(),
            schema_type: Some(kind.to_string()),
            references,
            ..SchemaRequest::default()
        };
        registry.register(subject, request).await.unwrap()
    }

    fn framed_bytes(id: i32, rest: &[u8]) -> Vec<u8> {
        let mut bytes = vec![MAGIC];
        bytes.extend(id.to_be_bytes());
        bytes.extend(rest);
        bytes
    }

    fn decoded(decoder: &Decoder, bytes: &[u8]) -> String {
        decoder.decode(bytes).expect("a known schema").expect("a payload of its schema").json
    }

    fn order_datum(schema: &AvroSchema) -> Vec<u8> {
        let value = Value::Record(vec![
            ("id".into(), Value::Long(7)),
            ("customer".into(), Value::String("ada".into())),
            ("tags".into(), Value::Array(vec![Value::String("tea".into())])),
            ("note".into(), Value::Union(1, Box::new(Value::String("fragile".into())))),
            ("digest".into(), Value::Fixed(2, vec![0, 255])),
            ("price".into(), Value::Decimal(apache_avro::Decimal::from(vec![0x30, 0x39]))),
            ("score".into(), Value::Double(f64::NAN)),
        ]);
        apache_avro::to_avro_datum(schema, value).unwrap()
    }

    #[tokio::test]
    async fn an_avro_record_reads_as_json_in_field_order() {
        let registry = Arc::new(Registry::new(Arc::new(MemoryLog::default())));
        let id = register(&registry, "orders-value", "AVRO", ORDER_AVRO, vec![]).await;
        let decoder = Decoder::new(registry);
        let datum = order_datum(&AvroSchema::parse_str(ORDER_AVRO).unwrap());
        let found = decoder.decode(&framed_bytes(id, &datum)).unwrap().unwrap();
        assert_eq!((found.schema_type, found.schema_id), (SchemaType::Avro, id));
        let json: serde_json::Value = serde_json::from_str(&found.json).unwrap();
        assert_eq!(json["id"], 7);
        assert_eq!(json["customer"], "ada");
        assert_eq!(json["tags"][0], "tea");
        assert_eq!(json["note"], "fragile");
        assert_eq!(json["digest"], "\u{0}\u{ff}");
        assert_eq!(json["score"], "NaN");
        assert!(found.json.find("\"id\"").unwrap() < found.json.find("\"customer\"").unwrap(), "{}", found.json);
    }

    #[tokio::test]
    async fn avro_references_resolve_and_recursive_schemas_are_refused() {
        let registry = Arc::new(Registry::new(Arc::new(MemoryLog::default())));
        let address = r#"{"type":"record","name":"Address","fields":[{"name":"city","type":"string"}]}"#;
        register(&registry, "address", "AVRO", address, vec![]).await;
        let person = r#"{"type":"record","name":"Person","fields":[{"name":"home","type":"Address"}]}"#;
        let reference = Reference { name: "Address".into(), subject: "address".into(), version: 1 };
        let id = register(&registry, "people-value", "AVRO", person, vec![reference]).await;
        let list = r#"{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"]}]}"#;
        let list_id = register(&registry, "list-value", "AVRO", list, vec![]).await;
        let nulls =
            r#"{"type":"record","name":"Nulls","fields":[{"name":"n","type":{"type":"array","items":"null"}}]}"#;
        let nulls_id = register(&registry, "nulls-value", "AVRO", nulls, vec![]).await;
        let decoder = Decoder::new(registry);
        let json = decoded(&decoder, &framed_bytes(id, &[8, b'O', b's', b'l', b'o']));
        assert_eq!(serde_json::from_str::<serde_json::Value>(&json).unwrap()["home"]["city"], "Oslo");
        let deep: Vec<u8> = std::iter::repeat_n(2, 100_000).chain([0]).collect();
        let refused = decoder.decode(&framed_bytes(list_id, &deep)).unwrap().unwrap_err();
        assert!(refused.contains("recursive"), "{refused}");
        // Blocks of 4 million nulls each, in 4 bytes a block.
        let endless: Vec<u8> = [0x80, 0x80, 0x80, 0x04].repeat(1000);
        let refused = decoder.decode(&framed_bytes(nulls_id, &endless)).unwrap().unwrap_err();
        assert!(refused.contains("no bytes"), "{refused}");
    }

    #[tokio::test]
    async fn protobuf_messages_are_found_by_their_indexes() {
        let registry = Arc::new(Registry::new(Arc::new(MemoryLog::default())));
        let id = register(&registry, "shop-value", "PROTOBUF", SHOP_PROTO, vec![]).await;
        let decoder = Decoder::new(registry);
        // The first message: the single index byte 0.
        let order = decoded(&decoder, &framed_bytes(id, &[0, 0x08, 7, 0x12, 3, b'a', b'd', b'a']));
        let order: serde_json::Value = serde_json::from_str(&order).unwrap();
        assert_eq!((order["id"].as_str(), order["customer"].as_str()), (Some("7"), Some("ada")));
        // The second top-level message: one index, 1 (zigzag: 2, 2).
        let refund = decoded(&decoder, &framed_bytes(id, &[2, 2, 0x08, 9]));
        assert_eq!(serde_json::from_str::<serde_json::Value>(&refund).unwrap()["order"], "9");
        // A nested message: indexes [0, 0], Order.Line.
        let line = decoded(&decoder, &framed_bytes(id, &[4, 0, 0, 0x0a, 1, b'x', 0x10, 2]));
        let line: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!((line["sku"].as_str(), line["qty"].as_i64()), (Some("x"), Some(2)));
        let missing = decoder.decode(&framed_bytes(id, &[2, 20, 0x08, 9])).unwrap().unwrap_err();
        assert!(missing.contains("no message"), "{missing}");
    }

    #[tokio::test]
    async fn protobuf_imports_resolve_by_reference_and_well_known_types() {
        let registry = Arc::new(Registry::new(Arc::new(MemoryLog::default())));
        let money = "syntax = \"proto3\"; package common; message Money { string currency = 1; int64 cents = 2; }";
        register(&registry, "money.proto", "PROTOBUF", money, vec![]).await;
        let invoice = r#"syntax = "proto3";
            import "money.proto";
            import "google/protobuf/timestamp.proto";
            message Invoice { common.Money total = 1; google.protobuf.Timestamp at = 2; }"#;
        let reference = Reference { name: "money.proto".into(), subject: "money.proto".into(), version: 1 };
        let id = register(&registry, "invoices-value", "PROTOBUF", invoice, vec![reference]).await;
        let decoder = Decoder::new(registry);
        let payload = [0, 0x0a, 7, 0x0a, 3, b'E', b'U', b'R', 0x10, 5, 0x12, 2, 0x08, 1];
        let json: serde_json::Value = serde_json::from_str(&decoded(&decoder, &framed_bytes(id, &payload))).unwrap();
        assert_eq!(json["total"]["currency"], "EUR");
        assert_eq!(json["at"], "1970-01-01T00:00:01Z");
    }

    #[tokio::test]
    async fn json_schema_payloads_are_pretty_printed() {
        let registry = Arc::new(Registry::new(Arc::new(MemoryLog::default())));
        let id = register(&registry, "events-value", "JSON", r#"{"type":"object"}"#, vec![]).await;
        let decoder = Decoder::new(registry);
        let found = decoder.decode(&framed_bytes(id, br#"{"kind":"click","n":3}"#)).unwrap().unwrap();
        assert_eq!(found.schema_type, SchemaType::Json);
        assert_eq!(found.json, "{\n  \"kind\": \"click\",\n  \"n\": 3\n}");
        assert!(decoder.decode(&framed_bytes(id, b"{\"kind\":")).unwrap().is_err());
    }

    #[tokio::test]
    async fn plain_bytes_and_unknown_ids_are_not_decoded() {
        let registry = Arc::new(Registry::new(Arc::new(MemoryLog::default())));
        let id = register(&registry, "events-value", "JSON", r#"{"type":"object"}"#, vec![]).await;
        let decoder = Decoder::new(registry);
        assert_eq!(decoder.decode(b""), None);
        assert_eq!(decoder.decode(&[0, 0, 0]), None);
        assert_eq!(decoder.decode(b"hello world"), None);
        assert_eq!(decoder.decode(&framed_bytes(id + 100, b"{}")), None);
        assert_eq!(decoder.decode(&framed_bytes(-1, b"{}")), None);
        assert!(decoder.decode(&framed_bytes(id, b"{}")).is_some());
    }

    #[tokio::test]
    async fn a_schema_registered_elsewhere_is_found_by_catching_up() {
        let log = Arc::new(MemoryLog::default());
        let writer = Registry::new(log.clone());
        let decoder = Decoder::new(Arc::new(Registry::new(log)));
        assert_eq!(decoder.decode(&framed_bytes(1, b"{}")), None);
        let id = register(&writer, "events-value", "JSON", r#"{"type":"object"}"#, vec![]).await;
        // Within the interval the unknown id does not replay the log again.
        assert_eq!(decoder.decode(&framed_bytes(id, b"{}")), None);
        *decoder.caught_up_at.lock().unwrap() = None;
        assert_eq!(decoded(&decoder, &framed_bytes(id, b"{}")), "{}");
    }

    /// Every truncation and many corruptions of valid payloads, and random bytes, under
    /// each schema: an answer, never a panic.
    #[tokio::test]
    async fn hostile_payloads_are_errors_not_crashes() {
        let registry = Arc::new(Registry::new(Arc::new(MemoryLog::default())));
        let avro = register(&registry, "orders-value", "AVRO", ORDER_AVRO, vec![]).await;
        let proto = register(&registry, "shop-value", "PROTOBUF", SHOP_PROTO, vec![]).await;
        let json = register(&registry, "events-value", "JSON", r#"{"type":"object"}"#, vec![]).await;
        let decoder = Decoder::new(registry);
        let valid = [
            framed_bytes(avro, &order_datum(&AvroSchema::parse_str(ORDER_AVRO).unwrap())),
            framed_bytes(proto, &[0, 0x08, 7, 0x12, 3, b'a', b'd', b'a', 0x1a, 3, 0x0a, 1, b'x']),
            framed_bytes(json, br#"{"a":[1,2,{"b":null}]}"#),
        ];
        for bytes in &valid {
            assert!(decoder.decode(bytes).unwrap().is_ok());
            for end in 0..bytes.len() {
                let _ = decoder.decode(&bytes[..end]);
            }
            for at in HEADER_BYTES..bytes.len() {
                for flip in [0x01, 0x80, 0xff] {
                    let mut corrupt = bytes.clone();
                    corrupt[at] ^= flip;
                    let _ = decoder.decode(&corrupt);
                }
            }
        }
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        for round in 0..3_000 {
            let mut noise = Vec::new();
            for _ in 0..(round % 64) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                noise.push(seed as u8);
            }
            for id in [avro, proto, json] {
                let _ = decoder.decode(&framed_bytes(id, &noise));
            }
        }
        // Lengths that claim far more than the bytes hold.
        let huge_array = [0x0e, 0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(decoder.decode(&framed_bytes(avro, &huge_array)).unwrap().is_err());
        assert!(decoder.decode(&framed_bytes(proto, &[0, 0x12, 0xff, 0xff, 0xff, 0xff, 0x0f])).unwrap().is_err());
        assert!(decoder.decode(&framed_bytes(proto, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff])).unwrap().is_err());
        // Nesting far past any recursion limit.
        let mut chain: Vec<u8> = Vec::new();
        for _ in 0..2_000 {
            let mut outer = vec![0x0a];
            let mut length = chain.len();
            while length >= 0x80 {
                outer.push((length as u8) | 0x80);
                length >>= 7;
            }
            outer.push(length as u8);
            outer.extend(&chain);
            chain = outer;
        }
        let chain_message = [&[2u8, 4][..], &chain].concat();
        assert!(decoder.decode(&framed_bytes(proto, &chain_message)).unwrap().is_err());
        let deep_json = "[".repeat(100_000);
        assert!(decoder.decode(&framed_bytes(json, deep_json.as_bytes())).unwrap().is_err());
    }
}
