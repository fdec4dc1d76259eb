//! Searching a topic on the broker: the console reads the chosen partitions from their
//! leaders (as the user, so the broker authorizes READ) and keeps only the records that
//! match, so the browser gets the matches and a progress figure, never the log.
//!
//! A search runs as a task of its own while its page polls it; it stops at the end offsets
//! it saw when it started, after [`SEARCH_RECORDS_MAX`] records or [`SEARCH_MATCHES_MAX`]
//! matches (saying so), or when cancelled. At most [`SEARCHES_MAX`] are kept; a finished one
//! is forgotten after [`SEARCH_KEPT`], and a new one past the bound ends the oldest.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::records::{Record, RecordBatchDecoder};
use parking_lot::Mutex;

use crate::cluster::{versions, ClusterClient, ClusterMetadata};
use crate::display::SchemaDecoder;
use crate::messages::{fetch_request, starting_offsets, MessageRow, Start};
use crate::topics::{error_name, PartitionRow};

/// Records one search reads at most.
pub const SEARCH_RECORDS_MAX: u64 = 5_000_000;
/// Matches one search keeps at most.
pub const SEARCH_MATCHES_MAX: usize = 500;
/// Searches kept at once, running or finished.
pub const SEARCHES_MAX: usize = 32;
/// How long a finished search's results stay.
pub const SEARCH_KEPT: Duration = Duration::from_secs(600);

/// Which part of a record the text is looked for in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Any,
    Key,
    Value,
    Headers,
}

/// What a record must have to match.
#[derive(Debug, Clone)]
pub struct Criteria {
    /// Looked for case-insensitively in `field`; empty matches every record.
    pub text: String,
    pub field: Field,
    /// A JSON value's field (`a.b.c`) and the text it must equal, when given.
    pub json_path: Option<(Vec<String>, String)>,
    /// Records with a timestamp before or after these (ms) do not match.
    pub from_ms: Option<i64>,
    pub until_ms: Option<i64>,
}

/// The JSON a key or value framed with a schema id decodes to, if `decoder` knows it.
fn decoded_json(decoder: Option<&dyn SchemaDecoder>, bytes: &[u8]) -> Option<String> {
    decoder?.decode(bytes)?.ok().map(|decoded| decoded.json)
}

impl Criteria {
    /// Whether `record` matches: its key and value as bytes, or as `decoder` decodes them.
    pub fn matches(&self, record: &Record, decoder: Option<&dyn SchemaDecoder>) -> bool {
        let in_time = self.from_ms.is_none_or(|from| record.timestamp >= from)
            && self.until_ms.is_none_or(|until| record.timestamp <= until);
        in_time && self.text_matches(record, decoder) && self.json_matches(record, decoder)
    }

    fn text_matches(&self, record: &Record, decoder: Option<&dyn SchemaDecoder>) -> bool {
        if self.text.is_empty() {
            return true;
        }
        let needle = self.text.to_lowercase();
        let has = |bytes: Option<&[u8]>| {
            bytes.is_some_and(|bytes| {
                String::from_utf8_lossy(bytes).to_lowercase().contains(&needle)
                    || decoded_json(decoder, bytes).is_some_and(|json| json.to_lowercase().contains(&needle))
            })
        };
        let in_headers = || {
            record.headers.iter().any(|(name, value)| {
                let text = |bytes: Option<&[u8]>| {
                    bytes.is_some_and(|bytes| String::from_utf8_lossy(bytes).to_lowercase().contains(&needle))
                };
                text(Some(name.as_bytes())) || text(value.as_deref())
            })
        };
        match self.field {
            Field::Key => has(record.key.as_deref()),
            Field::Value => has(record.value.as_deref()),
            Field::Headers => in_headers(),
            Field::Any => has(record.key.as_deref()) || has(record.value.as_deref()) || in_headers(),
        }
    }

    fn json_matches(&self, record: &Record, decoder: Option<&dyn SchemaDecoder>) -> bool {
        let Some((path, wanted)) = &self.json_path else { return true };
        let Some(value) = record.value.as_deref() else { return false };
        let parsed = serde_json::from_slice::<serde_json::Value>(value).ok().or_else(|| {
            decoded_json(decoder, value).and_then(|json| serde_json::from_str::<serde_json::Value>(&json).ok())
        });
        let Some(mut found) = parsed else { return false };
        for step in path {
            found = match found {
                serde_json::Value::Object(mut fields) => match fields.remove(step) {
                    Some(inner) => inner,
                    None => return false,
                },
                serde_json::Value::Array(mut items) => match step.parse::<usize>() {
                    Ok(index) if index < items.len() => items.swap_remove(index),
                    _ => return false,
                },
                _ => return false,
            };
        }
        match found {
            serde_json::Value::String(text) => text == *wanted,
            // A number, boolean or null equals the same JSON written in the form.
            other => serde_json::from_str::<serde_json::Value>(wanted).is_ok_and(|wanted| wanted == other),
        }
    }
}

/// `a.b=value` as a JSON path and the text its value must equal.
pub fn parse_json_path(text: &str) -> Result<Option<(Vec<String>, String)>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let (path, wanted) = text.split_once('=').ok_or("a JSON field is path=value, e.g. customer.id=42")?;
    let path: Vec<String> = path.trim().trim_start_matches("$.").split('.').map(str::to_string).collect();
    if path.iter().any(String::is_empty) {
        return Err(format!("{text:?}: the JSON path has an empty step"));
    }
    Ok(Some((path, wanted.trim().to_string())))
}

/// What to search: which partitions of which topic, from where, for what.
pub struct SearchRequest {
    pub topic: String,
    pub partitions: Vec<PartitionRow>,
    pub start: Start,
    pub criteria: Criteria,
    /// The criteria in words, for the search's page.
    pub described: String,
    /// Decodes keys and values framed with a schema id, to match and show.
    pub decoder: Option<Arc<dyn SchemaDecoder>>,
}

/// How a search stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Running,
    /// Every record up to the end offsets seen at the start was read.
    Done,
    /// Stopped at a bound; the text says which.
    Capped(String),
    Cancelled,
    Failed(String),
}

/// What a search has found so far.
#[derive(Debug, Clone)]
pub struct Progress {
    pub state: State,
    /// Records read so far, of about `total`.
    pub scanned: u64,
    pub total: u64,
    pub matches: Vec<MessageRow>,
}

/// One search: whose it is, what it looks for, how far it got.
pub struct Search {
    /// The user who started it (`None`: the anonymous console); only they see it.
    pub owner: Option<String>,
    pub topic: String,
    /// The criteria in words, for its page.
    pub described: String,
    progress: Mutex<Progress>,
    cancelled: AtomicBool,
    finished_at: Mutex<Option<Instant>>,
}

impl Search {
    pub fn progress(&self) -> Progress {
        self.progress.lock().clone()
    }

    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    fn finish(&self, state: State) {
        self.progress.lock().state = state;
        *self.finished_at.lock() = Some(Instant::now());
    }
}

/// The searches of one console, by id.
#[derive(Default)]
pub struct Searches {
    kept: Mutex<HashMap<String, Arc<Search>>>,
}

impl Searches {
    /// Starts `asked` as `client` on behalf of `owner`; returns its id.
    pub fn start(
        &self,
        client: Arc<ClusterClient>,
        metadata: ClusterMetadata,
        asked: SearchRequest,
        owner: Option<String>,
    ) -> String {
        let total = asked.partitions.iter().map(|p| (p.end - p.start).max(0) as u64).sum();
        let search = Arc::new(Search {
            owner,
            topic: asked.topic.clone(),
            described: asked.described.clone(),
            progress: Mutex::new(Progress { state: State::Running, scanned: 0, total, matches: Vec::new() }),
            cancelled: AtomicBool::new(false),
            finished_at: Mutex::new(None),
        });
        let id = new_id();
        self.keep(id.clone(), search.clone());
        tokio::spawn(async move {
            let outcome = scan(&client, &metadata, &asked, &search).await;
            search.finish(match outcome {
                Ok(state) => state,
                Err(error) => State::Failed(format!("{error:#}")),
            });
        });
        id
    }

    fn keep(&self, id: String, search: Arc<Search>) {
        let mut kept = self.kept.lock();
        kept.retain(|_, s| s.finished_at.lock().is_none_or(|at| at.elapsed() < SEARCH_KEPT));
        if kept.len() >= SEARCHES_MAX {
            // The oldest goes: finished ones first, else the longest running (cancelled).
            let oldest = kept
                .iter()
                .min_by_key(|(_, s)| (s.finished_at.lock().is_none(), s.finished_at.lock().map(|at| at.elapsed())))
                .map(|(id, s)| (id.clone(), s.clone()));
            if let Some((id, search)) = oldest {
                search.cancel();
                kept.remove(&id);
            }
        }
        kept.insert(id, search);
        assert!(kept.len() <= SEARCHES_MAX);
    }

    /// The search `id` if `user` started it.
    pub fn find(&self, id: &str, user: &Option<String>) -> Option<Arc<Search>> {
        self.kept.lock().get(id).filter(|s| &s.owner == user).cloned()
    }
}

/// 16 random bytes, hex.
fn new_id() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads each partition in turn from its starting offset to the end it had when the search
/// started, keeping the matches in `search`'s progress.
async fn scan(
    client: &Arc<ClusterClient>,
    metadata: &ClusterMetadata,
    asked: &SearchRequest,
    search: &Search,
) -> anyhow::Result<State> {
    let (topic, criteria) = (asked.topic.as_str(), &asked.criteria);
    let from = starting_offsets(client, metadata, topic, &asked.partitions, asked.start, 0).await?;
    for partition in asked.partitions.iter().filter(|p| p.leader >= 0) {
        let address = metadata.address(partition.leader)?.to_string();
        let mut offset = from.iter().find(|(id, _)| *id == partition.id).map_or(partition.start, |(_, at)| *at);
        // Records before the starting offset count as passed, for the progress figure.
        search.progress.lock().scanned += (offset - partition.start).max(0) as u64;
        while offset < partition.end {
            if search.cancelled.load(Ordering::Relaxed) {
                return Ok(State::Cancelled);
            }
            let answer = client.send(&address, versions::FETCH, fetch_request(topic, partition.id, offset)).await?;
            let Some(data) = answer.responses.into_iter().flat_map(|t| t.partitions).next() else { break };
            if data.error_code != 0 {
                anyhow::bail!("partition {}: {}", partition.id, error_name(data.error_code));
            }
            let mut bytes = data.records.unwrap_or_default();
            if bytes.is_empty() {
                break;
            }
            let before = offset;
            for record in RecordBatchDecoder::decode_all(&mut bytes)?.into_iter().flat_map(|set| set.records) {
                if record.offset < before || record.offset >= partition.end {
                    continue;
                }
                offset = offset.max(record.offset + 1);
                if let Some(capped) = take(search, partition.id, &record, criteria, asked.decoder.as_deref()) {
                    return Ok(capped);
                }
            }
            if offset == before {
                break;
            }
        }
    }
    Ok(State::Done)
}

/// Counts `record` and keeps it when it matches; the bound reached, if one is.
fn take(
    search: &Search,
    partition: i32,
    record: &Record,
    criteria: &Criteria,
    decoder: Option<&dyn SchemaDecoder>,
) -> Option<State> {
    let matched = !record.control && criteria.matches(record, decoder);
    let row = matched.then(|| MessageRow::of(partition, record, decoder, false));
    let mut progress = search.progress.lock();
    progress.scanned += 1;
    if let Some(row) = row {
        progress.matches.push(row);
        if progress.matches.len() >= SEARCH_MATCHES_MAX {
            return Some(State::Capped(format!("stopped at {SEARCH_MATCHES_MAX} matches: narrow the search")));
        }
    }
    (progress.scanned >= SEARCH_RECORDS_MAX)
        .then(|| State::Capped(format!("stopped after reading {SEARCH_RECORDS_MAX} records: narrow the search")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use indexmap::IndexMap;
    use kafka_protocol::protocol::StrBytes;

    fn record(key: &str, value: &str, timestamp: i64) -> Record {
        let mut headers = IndexMap::new();
        headers.insert(StrBytes::from_static_str("origin"), Some(Bytes::from_static(b"web")));
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: kafka_protocol::records::TimestampType::Creation,
            offset: 0,
            sequence: -1,
            timestamp,
            key: Some(Bytes::from(key.to_string())),
            value: Some(Bytes::from(value.to_string())),
            headers,
        }
    }

    fn criteria(text: &str, field: Field, json: &str) -> Criteria {
        Criteria { text: text.into(), field, json_path: parse_json_path(json).unwrap(), from_ms: None, until_ms: None }
    }

    #[test]
    fn text_is_found_in_the_chosen_field_whatever_its_case() {
        let order = record("order-7", r#"{"customer": {"id": 42}, "items": ["tea"]}"#, 1000);
        assert!(criteria("ORDER-7", Field::Key, "").matches(&order, None));
        assert!(!criteria("order-7", Field::Value, "").matches(&order, None));
        assert!(criteria("web", Field::Headers, "").matches(&order, None));
        assert!(criteria("tea", Field::Any, "").matches(&order, None));
        assert!(criteria("", Field::Any, "customer.id=42").matches(&order, None));
        assert!(criteria("", Field::Any, "$.items.0=tea").matches(&order, None));
        assert!(!criteria("", Field::Any, "customer.id=43").matches(&order, None));
        let mut late = criteria("", Field::Any, "");
        late.from_ms = Some(2000);
        assert!(!late.matches(&order, None));
        assert!(parse_json_path("customer..id=1").is_err());
        // A value framed with a schema id matches by what it decodes to.
        struct Shouting;
        impl SchemaDecoder for Shouting {
            fn decode(&self, bytes: &[u8]) -> Option<Result<crate::display::SchemaDecoded, String>> {
                let rest = bytes.strip_prefix(&[0, 0, 0, 0, 1])?;
                let json = format!(r#"{{"city": "{}"}}"#, String::from_utf8_lossy(rest).to_uppercase());
                Some(Ok(crate::display::SchemaDecoded { kind: "avro", schema_id: 1, json }))
            }
        }
        let mut framed = record("k", "", 1000);
        framed.value = Some(Bytes::from_static(b"\0\0\0\0\x01oslo"));
        assert!(criteria("\"OSLO\"", Field::Value, "").matches(&framed, Some(&Shouting)));
        assert!(!criteria("\"OSLO\"", Field::Value, "").matches(&framed, None));
        assert!(criteria("", Field::Any, "city=OSLO").matches(&framed, Some(&Shouting)));
        assert!(parse_json_path("no equals sign").is_err());
    }
}
