//! An AMQP message as a Kafka record and back, so one queue serves both kinds of client.
//!
//! The mapping (docs/amqp.md shows it to users):
//! - body = record value; routing key = record key (none when empty);
//! - each basic property = a record header `amqp-<property>` holding its text (delivery
//!   mode, priority and timestamp as decimal numbers);
//! - each entry of the `headers` table with a string value = a record header of the same
//!   name; entries of other types (numbers, booleans, tables, ...) travel together in one
//!   record header `amqp-headers`, in AMQP's own table encoding, so they come back typed;
//! - the exchange the message was published to = `amqp-exchange`.
//!
//! A record a Kafka producer wrote comes out with its headers as string-valued entries
//! of the AMQP `headers` table, and its key as the routing key.

use amq_protocol::protocol::basic::AMQPProperties;
use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use bytes::Bytes;
use indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Record;

/// The record header that holds the non-string entries of the `headers` table.
const TYPED_HEADERS: &str = "amqp-headers";
/// The record header naming the exchange a message was published to.
const EXCHANGE_HEADER: &str = "amqp-exchange";
/// Record headers that are not entries of the AMQP `headers` table.
const RESERVED_PREFIX: &str = "amqp-";

/// A published message, whole.
#[derive(Clone, Debug)]
pub struct Message {
    pub exchange: String,
    pub routing_key: String,
    pub properties: AMQPProperties,
    pub body: Bytes,
}

/// A message as it comes out of a queue.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub exchange: String,
    pub routing_key: String,
    pub properties: AMQPProperties,
    pub body: Vec<u8>,
}

/// The record `message` is stored as.
pub fn to_record(message: &Message, timestamp_ms: i64) -> Record {
    let mut headers: IndexMap<StrBytes, Option<Bytes>> = IndexMap::new();
    let mut put = |name: &str, value: Vec<u8>| {
        headers.insert(StrBytes::from_string(name.to_string()), Some(Bytes::from(value)));
    };
    put(EXCHANGE_HEADER, message.exchange.as_bytes().to_vec());
    for (name, value) in property_texts(&message.properties) {
        put(&format!("{RESERVED_PREFIX}{name}"), value.into_bytes());
    }
    let mut typed = FieldTable::default();
    if let Some(table) = message.properties.headers() {
        for (name, value) in table.inner() {
            match value {
                AMQPValue::LongString(text) if !name.as_str().starts_with(RESERVED_PREFIX) => {
                    put(name.as_str(), text.as_bytes().to_vec())
                }
                AMQPValue::ShortString(text) if !name.as_str().starts_with(RESERVED_PREFIX) => {
                    put(name.as_str(), text.as_str().as_bytes().to_vec())
                }
                other => {
                    typed.insert(name.clone(), other.clone());
                }
            }
        }
    }
    if !typed.inner().is_empty() {
        put(TYPED_HEADERS, encode_table(&typed));
    }
    let key = (!message.routing_key.is_empty()).then(|| Bytes::from(message.routing_key.clone().into_bytes()));
    sluice_protocol::new_record(key, Some(message.body.clone()), headers, timestamp_ms)
}

/// The message a record stands for (one written by a Kafka producer too).
pub fn from_record(record: &Record) -> Delivered {
    let mut properties = AMQPProperties::default();
    let mut table = FieldTable::default();
    let mut exchange = String::new();
    for (name, value) in &record.headers {
        let value = value.as_deref().unwrap_or_default();
        let text = || String::from_utf8_lossy(value).into_owned();
        match name.as_str() {
            EXCHANGE_HEADER => exchange = text(),
            TYPED_HEADERS => {
                if let Some(typed) = decode_table(value) {
                    for (k, v) in typed.inner() {
                        table.insert(k.clone(), v.clone());
                    }
                }
            }
            other => match other.strip_prefix(RESERVED_PREFIX) {
                Some(property) => properties = with_property(properties, property, &text()),
                None => {
                    table.insert(
                        ShortString::from(other.to_string()),
                        AMQPValue::LongString(LongString::from(value.to_vec())),
                    );
                }
            },
        }
    }
    if !table.inner().is_empty() {
        properties = properties.with_headers(table);
    }
    let routing_key = record.key.as_deref().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default();
    Delivered { exchange, routing_key, properties, body: record.value.as_deref().unwrap_or_default().to_vec() }
}

/// The basic properties set on `properties` as (name, text), `headers` aside.
fn property_texts(properties: &AMQPProperties) -> Vec<(&'static str, String)> {
    let short = |v: &Option<ShortString>| v.as_ref().map(|s| s.as_str().to_string());
    let fields = [
        ("content-type", short(properties.content_type())),
        ("content-encoding", short(properties.content_encoding())),
        ("delivery-mode", properties.delivery_mode().map(|m| m.to_string())),
        ("priority", properties.priority().map(|p| p.to_string())),
        ("correlation-id", short(properties.correlation_id())),
        ("reply-to", short(properties.reply_to())),
        ("expiration", short(properties.expiration())),
        ("message-id", short(properties.message_id())),
        ("timestamp", properties.timestamp().map(|t| t.to_string())),
        ("type", short(properties.kind())),
        ("user-id", short(properties.user_id())),
        ("app-id", short(properties.app_id())),
        ("cluster-id", short(properties.cluster_id())),
    ];
    fields.into_iter().filter_map(|(name, value)| value.map(|v| (name, v))).collect()
}

/// `properties` without its `expiration` (a dead letter must not expire again for the same
/// reason; `x-death` keeps the original).
pub fn without_expiration(properties: &AMQPProperties) -> AMQPProperties {
    let mut kept = AMQPProperties::default();
    for (name, text) in property_texts(properties).into_iter().filter(|(name, _)| *name != "expiration") {
        kept = with_property(kept, name, &text);
    }
    match properties.headers() {
        Some(headers) => kept.with_headers(headers.clone()),
        None => kept,
    }
}

/// `properties` with the property `name` set from its text (an unknown name or an
/// unreadable number is left out).
fn with_property(properties: AMQPProperties, name: &str, text: &str) -> AMQPProperties {
    let short = || ShortString::from(text.to_string());
    match name {
        "content-type" => properties.with_content_type(short()),
        "content-encoding" => properties.with_content_encoding(short()),
        "delivery-mode" => match text.parse() {
            Ok(mode) => properties.with_delivery_mode(mode),
            Err(_) => properties,
        },
        "priority" => match text.parse() {
            Ok(priority) => properties.with_priority(priority),
            Err(_) => properties,
        },
        "correlation-id" => properties.with_correlation_id(short()),
        "reply-to" => properties.with_reply_to(short()),
        "expiration" => properties.with_expiration(short()),
        "message-id" => properties.with_message_id(short()),
        "timestamp" => match text.parse() {
            Ok(timestamp) => properties.with_timestamp(timestamp),
            Err(_) => properties,
        },
        "type" => properties.with_type(short()),
        "user-id" => properties.with_user_id(short()),
        "app-id" => properties.with_app_id(short()),
        "cluster-id" => properties.with_cluster_id(short()),
        _ => properties,
    }
}

fn encode_table(table: &FieldTable) -> Vec<u8> {
    let (bytes, _) = cookie_factory::gen(amq_protocol::types::generation::gen_field_table(table), Vec::new())
        .expect("a table serializes into a growable buffer");
    bytes
}

fn decode_table(bytes: &[u8]) -> Option<FieldTable> {
    amq_protocol::types::parsing::parse_field_table(bytes).ok().map(|(_, table)| table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_and_headers_survive_the_trip_through_a_record() {
        let mut headers = FieldTable::default();
        headers.insert("trace".into(), AMQPValue::LongString("abc".into()));
        headers.insert("attempt".into(), AMQPValue::LongInt(3));
        headers.insert("urgent".into(), AMQPValue::Boolean(true));
        let properties = AMQPProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_priority(4)
            .with_correlation_id("c-1".into())
            .with_reply_to("amq.gen-x".into())
            .with_timestamp(1_700_000_000)
            .with_headers(headers);
        let message = Message {
            exchange: "orders".into(),
            routing_key: "eu.new".into(),
            properties: properties.clone(),
            body: Bytes::from_static(b"{}"),
        };
        let record = to_record(&message, 5);
        assert_eq!(record.key.as_deref(), Some(&b"eu.new"[..]));
        assert_eq!(
            record.headers.get(&b"amqp-content-type"[..]).cloned().flatten().as_deref(),
            Some(&b"application/json"[..])
        );
        assert_eq!(record.headers.get(&b"trace"[..]).cloned().flatten().as_deref(), Some(&b"abc"[..]));
        let back = from_record(&record);
        assert_eq!((back.exchange.as_str(), back.routing_key.as_str()), ("orders", "eu.new"));
        assert_eq!(back.properties, properties);
        assert_eq!(back.body, b"{}");
    }

    #[test]
    fn a_kafka_record_becomes_a_message_with_string_headers() {
        let mut headers = IndexMap::new();
        headers.insert(StrBytes::from_static_str("source"), Some(Bytes::from_static(b"kafka")));
        let record = Record {
            headers,
            key: None,
            ..to_record(
                &Message {
                    exchange: String::new(),
                    routing_key: String::new(),
                    properties: AMQPProperties::default(),
                    body: Bytes::from_static(b"v"),
                },
                0,
            )
        };
        let delivered = from_record(&record);
        let table = delivered.properties.headers().clone().unwrap();
        assert_eq!(table.inner().get("source"), Some(&AMQPValue::LongString("kafka".into())));
        assert_eq!(delivered.routing_key, "");
    }
}
