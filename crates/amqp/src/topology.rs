//! Exchanges, queues and bindings of the default virtual host, and routing through them.
//!
//! Exchanges and bindings have no Kafka counterpart; they are entries of a
//! [`StateStore`]: one file on a single node, the replicated cluster metadata in a cluster,
//! so every node routes alike. A declaration is answered only once stored durably. The
//! queues themselves are topics; what is kept here is what AMQP knows of them (durable,
//! exclusive, auto-delete, arguments) and the bindings that lead to them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use amq_protocol::types::{AMQPValue, FieldTable};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::state_store::{Entries, StateStore, StoreError};

/// Exchanges and queues at most, each (a declaration beyond it is refused).
pub const ENTITIES_MAX: usize = 100_000;
/// Exchange-to-exchange hops a message follows at most.
const ROUTE_DEPTH_MAX: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    Headers,
}

impl ExchangeKind {
    pub fn parse(kind: &str) -> Option<ExchangeKind> {
        match kind {
            "direct" => Some(ExchangeKind::Direct),
            "fanout" => Some(ExchangeKind::Fanout),
            "topic" => Some(ExchangeKind::Topic),
            "headers" => Some(ExchangeKind::Headers),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    pub kind: ExchangeKind,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Queue {
    pub durable: bool,
    pub exclusive: bool,
    pub auto_delete: bool,
    /// The arguments it was declared with, as text (a redeclaration must match).
    pub arguments: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Destination {
    Queue(String),
    Exchange(String),
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Binding {
    pub source: String,
    pub destination: Destination,
    pub routing_key: String,
    /// Binding arguments as text (a headers exchange matches on them).
    pub arguments: BTreeMap<String, String>,
}

impl Binding {
    /// The binding a `bind` or `unbind` method names.
    pub fn new(source: &str, destination: Destination, routing_key: &str, arguments: &FieldTable) -> Binding {
        Binding {
            source: source.to_string(),
            destination,
            routing_key: routing_key.to_string(),
            arguments: arguments_text(arguments),
        }
    }
}

/// Why a topology change was refused: an AMQP reply code and text.
#[derive(Debug, PartialEq)]
pub struct Refused(pub u16, pub String);

#[derive(Clone, Default)]
struct State {
    exchanges: BTreeMap<String, Exchange>,
    queues: BTreeMap<String, Queue>,
    bindings: BTreeSet<Binding>,
}

/// Entry keys: one per exchange, queue and binding.
const EXCHANGE_KEY: &str = "exchange/";
const QUEUE_KEY: &str = "queue/";
const BINDING_KEY: &str = "binding/";
/// Changes computed again at most after another node changed the state first.
const CHANGE_ATTEMPTS_MAX: usize = 16;

impl State {
    /// The state the entries describe, with the predeclared exchanges; bindings whose ends
    /// are gone are left out.
    fn of(entries: &Entries) -> State {
        let mut state = State::default();
        for (key, value) in entries {
            if let Some(name) = key.strip_prefix(EXCHANGE_KEY) {
                if let Ok(exchange) = serde_json::from_str(value) {
                    state.exchanges.insert(name.to_string(), exchange);
                }
            } else if let Some(name) = key.strip_prefix(QUEUE_KEY) {
                if let Ok(queue) = serde_json::from_str(value) {
                    state.queues.insert(name.to_string(), queue);
                }
            } else if let Some(binding) = key.strip_prefix(BINDING_KEY) {
                if let Ok(binding) = serde_json::from_str(binding) {
                    state.bindings.insert(binding);
                }
            }
        }
        state.exchanges.extend(predeclared());
        let queues: BTreeSet<String> = state.queues.keys().cloned().collect();
        let exchanges: BTreeSet<String> = state.exchanges.keys().cloned().collect();
        state.bindings.retain(|b| {
            exchanges.contains(&b.source)
                && match &b.destination {
                    Destination::Queue(q) => queues.contains(q),
                    Destination::Exchange(e) => exchanges.contains(e),
                }
        });
        state
    }

    /// The entries that describe this state (the predeclared exchanges are not stored).
    fn entries(&self) -> Entries {
        let predeclared = predeclared();
        let exchanges = self.exchanges.iter().filter(|(name, _)| !predeclared.contains_key(*name)).map(|(name, e)| {
            (format!("{EXCHANGE_KEY}{name}"), serde_json::to_string(e).expect("an exchange serializes"))
        });
        let queues = self
            .queues
            .iter()
            .map(|(name, q)| (format!("{QUEUE_KEY}{name}"), serde_json::to_string(q).expect("a queue serializes")));
        let bindings = self.bindings.iter().map(|b| {
            (format!("{BINDING_KEY}{}", serde_json::to_string(b).expect("a binding serializes")), String::new())
        });
        exchanges.chain(queues).chain(bindings).collect()
    }
}

/// What turns `from` into `to`: the entries to put and the keys to delete.
fn difference(from: &Entries, to: &Entries) -> (Entries, Vec<String>) {
    let puts = to.iter().filter(|(k, v)| from.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect();
    let deletes = from.keys().filter(|k| !to.contains_key(*k)).cloned().collect();
    (puts, deletes)
}

pub struct Topology {
    store: Arc<dyn StateStore>,
    /// The state as last read from the store, with the store version it was read at.
    view: Mutex<(u64, Arc<State>)>,
    /// One change at a time from this node.
    writer: tokio::sync::Mutex<()>,
}

/// The exchanges every virtual host has (RabbitMQ's names).
fn predeclared() -> BTreeMap<String, Exchange> {
    let exchange = |kind| Exchange { kind, durable: true, auto_delete: false, internal: false };
    [
        ("", ExchangeKind::Direct),
        ("amq.direct", ExchangeKind::Direct),
        ("amq.fanout", ExchangeKind::Fanout),
        ("amq.topic", ExchangeKind::Topic),
        ("amq.headers", ExchangeKind::Headers),
        ("amq.match", ExchangeKind::Headers),
    ]
    .into_iter()
    .map(|(name, kind)| (name.to_string(), exchange(kind)))
    .collect()
}

/// Field-table arguments as text, for comparison and matching.
pub fn arguments_text(arguments: &FieldTable) -> BTreeMap<String, String> {
    arguments.inner().iter().map(|(k, v)| (k.as_str().to_string(), value_text(v))).collect()
}

/// A field value as text: strings as they are, numbers and booleans in decimal.
pub fn value_text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_string(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        AMQPValue::Float(n) => n.to_string(),
        AMQPValue::Double(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

impl Topology {
    /// The topology `store` holds (the predeclared exchanges when it holds none).
    pub fn new(store: Arc<dyn StateStore>) -> Topology {
        let (version, entries) = store.snapshot();
        let state = State::of(&entries);
        Topology { store, view: Mutex::new((version, Arc::new(state))), writer: tokio::sync::Mutex::new(()) }
    }

    /// The current state: read again from the store when it changed.
    fn state(&self) -> Arc<State> {
        let version = self.store.version();
        let mut view = self.view.lock();
        if view.0 != version {
            let (version, entries) = self.store.snapshot();
            *view = (version, Arc::new(State::of(&entries)));
        }
        view.1.clone()
    }

    /// Applies `change` to the current state and stores the result; `change` says whether
    /// it changed anything. A change refused because another node changed the state first
    /// is computed again on the newer state.
    async fn change(&self, change: impl Fn(&mut State) -> Result<bool, Refused>) -> Result<(), Refused> {
        let _writing = self.writer.lock().await;
        for _ in 0..CHANGE_ATTEMPTS_MAX {
            let (version, stored) = self.store.snapshot();
            let mut next = State::of(&stored);
            if !change(&mut next)? {
                return Ok(());
            }
            let (puts, deletes) = difference(&stored, &next.entries());
            match self.store.commit(version, puts, deletes).await {
                Ok(()) => return Ok(()),
                Err(StoreError::Conflict) => continue,
                Err(StoreError::Failed(error)) => {
                    tracing::error!(%error, "could not store the AMQP topology");
                    return Err(Refused(
                        crate::frames::reply::INTERNAL_ERROR,
                        format!("could not store the topology: {error}"),
                    ));
                }
            }
        }
        Err(Refused(crate::frames::reply::INTERNAL_ERROR, "the topology kept changing; try again".into()))
    }

    pub fn exchange(&self, name: &str) -> Option<Exchange> {
        self.state().exchanges.get(name).cloned()
    }

    pub fn queue(&self, name: &str) -> Option<Queue> {
        self.state().queues.get(name).cloned()
    }

    /// The queues declared with `x-expires`.
    pub fn expiring_queues(&self) -> Vec<(String, Queue)> {
        let state = self.state();
        state
            .queues
            .iter()
            .filter(|(_, q)| q.arguments.contains_key("x-expires"))
            .map(|(n, q)| (n.clone(), q.clone()))
            .collect()
    }

    /// Declares `name` as `exchange`; an existing one must be the same kind and durability.
    pub async fn declare_exchange(&self, name: &str, exchange: Exchange) -> Result<(), Refused> {
        self.change(|state| {
            if let Some(existing) = state.exchanges.get(name) {
                if existing.kind != exchange.kind || existing.durable != exchange.durable {
                    return Err(Refused(
                        crate::frames::reply::PRECONDITION_FAILED,
                        format!("inequivalent arg 'type' or 'durable' for exchange '{name}' in vhost '/'"),
                    ));
                }
                return Ok(false);
            }
            if name.starts_with("amq.") {
                return Err(Refused(
                    crate::frames::reply::ACCESS_REFUSED,
                    format!("exchange name '{name}' contains reserved prefix 'amq.*'"),
                ));
            }
            check_room(state.exchanges.len())?;
            state.exchanges.insert(name.to_string(), exchange.clone());
            Ok(true)
        })
        .await
    }

    /// Deletes exchange `name` and its bindings (`if_unused`: only if it has none as source).
    pub async fn delete_exchange(&self, name: &str, if_unused: bool) -> Result<(), Refused> {
        if name.is_empty() || name.starts_with("amq.") {
            return Err(Refused(crate::frames::reply::ACCESS_REFUSED, format!("cannot delete exchange '{name}'")));
        }
        self.change(|state| {
            if !state.exchanges.contains_key(name) {
                return Ok(false);
            }
            if if_unused && state.bindings.iter().any(|b| b.source == name) {
                return Err(Refused(crate::frames::reply::PRECONDITION_FAILED, format!("exchange '{name}' in use")));
            }
            state.exchanges.remove(name);
            let gone = Destination::Exchange(name.to_string());
            state.bindings.retain(|b| b.source != name && b.destination != gone);
            Ok(true)
        })
        .await
    }

    /// Records queue `name`; an existing one must be declared the same way.
    pub async fn declare_queue(&self, name: &str, queue: Queue) -> Result<(), Refused> {
        self.change(|state| {
            if let Some(existing) = state.queues.get(name) {
                if existing.durable != queue.durable || existing.arguments != queue.arguments {
                    return Err(Refused(
                        crate::frames::reply::PRECONDITION_FAILED,
                        format!("inequivalent arg 'durable' or arguments for queue '{name}' in vhost '/'"),
                    ));
                }
                return Ok(false);
            }
            check_room(state.queues.len())?;
            state.queues.insert(name.to_string(), queue.clone());
            Ok(true)
        })
        .await
    }

    /// Forgets queue `name` and the bindings to it.
    pub async fn forget_queue(&self, name: &str) -> Result<(), Refused> {
        self.change(|state| {
            if state.queues.remove(name).is_none() {
                return Ok(false);
            }
            let gone = Destination::Queue(name.to_string());
            state.bindings.retain(|b| b.destination != gone);
            Ok(true)
        })
        .await
    }

    pub async fn bind(&self, binding: Binding) -> Result<(), Refused> {
        self.change(|state| {
            check_ends(state, &binding)?;
            if state.bindings.contains(&binding) {
                return Ok(false);
            }
            check_room(state.bindings.len())?;
            state.bindings.insert(binding.clone());
            Ok(true)
        })
        .await
    }

    pub async fn unbind(&self, binding: &Binding) -> Result<(), Refused> {
        self.change(|state| {
            check_ends(state, binding)?;
            Ok(state.bindings.remove(binding))
        })
        .await
    }

    /// The queues a message published to `exchange` with `routing_key` and `headers` goes
    /// to; `None` when the exchange does not exist.
    pub fn route(&self, exchange: &str, routing_key: &str, headers: Option<&FieldTable>) -> Option<BTreeSet<String>> {
        let state = self.state();
        state.exchanges.get(exchange)?;
        let mut queues = BTreeSet::new();
        if exchange.is_empty() {
            if state.queues.contains_key(routing_key) {
                queues.insert(routing_key.to_string());
            }
            return Some(queues);
        }
        let headers: BTreeMap<String, String> = headers.map(arguments_text).unwrap_or_default();
        let mut visited = BTreeSet::new();
        let mut frontier = vec![exchange.to_string()];
        for _ in 0..ROUTE_DEPTH_MAX {
            let mut next = Vec::new();
            for source in frontier.drain(..) {
                if !visited.insert(source.clone()) {
                    continue;
                }
                let Some(kind) = state.exchanges.get(&source).map(|e| e.kind) else { continue };
                let bound = state.bindings.range(first_binding_of(&source)..).take_while(|b| b.source == source);
                for binding in bound.filter(|b| matches(kind, b, routing_key, &headers)) {
                    match &binding.destination {
                        Destination::Queue(q) => {
                            queues.insert(q.clone());
                        }
                        Destination::Exchange(e) => next.push(e.clone()),
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            frontier = next;
        }
        Some(queues)
    }
}

fn check_ends(state: &State, binding: &Binding) -> Result<(), Refused> {
    let not_found = |what: &str, name: &str| {
        Err(Refused(crate::frames::reply::NOT_FOUND, format!("no {what} '{name}' in vhost '/'")))
    };
    if binding.source.is_empty() {
        return Err(Refused(
            crate::frames::reply::ACCESS_REFUSED,
            "operation not permitted on the default exchange".into(),
        ));
    }
    if !state.exchanges.contains_key(&binding.source) {
        return not_found("exchange", &binding.source);
    }
    match &binding.destination {
        Destination::Queue(q) if !state.queues.contains_key(q) => not_found("queue", q),
        Destination::Exchange(e) if !state.exchanges.contains_key(e) => not_found("exchange", e),
        _ => Ok(()),
    }
}

/// The single file in which a node kept its topology before the state store (one JSON
/// document); read when no state file exists yet, so an upgraded node keeps its topology.
const LEGACY_TOPOLOGY_FILE: &str = "amqp-topology.json";

/// The entries of the topology file `dir` holds from before the state store, if any.
pub fn legacy_entries(dir: &std::path::Path) -> std::io::Result<Option<Entries>> {
    #[derive(Deserialize)]
    struct Legacy {
        exchanges: BTreeMap<String, Exchange>,
        queues: BTreeMap<String, Queue>,
        bindings: BTreeSet<Binding>,
    }
    let path = dir.join(LEGACY_TOPOLOGY_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let legacy: Legacy = serde_json::from_slice(&bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
    let state = State { exchanges: legacy.exchanges, queues: legacy.queues, bindings: legacy.bindings };
    Ok(Some(state.entries()))
}

/// Whether a stored entry lives only as long as a connection or a process (a transient
/// exchange, an exclusive or transient queue): a single node forgets it when it restarts.
pub fn transient_entry(key: &str, value: &str) -> bool {
    if key.starts_with(EXCHANGE_KEY) {
        return serde_json::from_str::<Exchange>(value).is_ok_and(|e| !e.durable);
    }
    if key.starts_with(QUEUE_KEY) {
        return serde_json::from_str::<Queue>(value).is_ok_and(|q| !q.durable || q.exclusive);
    }
    false
}

fn check_room(count: usize) -> Result<(), Refused> {
    if count >= ENTITIES_MAX {
        return Err(Refused(crate::frames::reply::RESOURCE_ERROR, format!("{ENTITIES_MAX} already declared")));
    }
    Ok(())
}

/// The smallest binding whose source is `source` (bindings sort by source first).
fn first_binding_of(source: &str) -> Binding {
    Binding {
        source: source.to_string(),
        destination: Destination::Queue(String::new()),
        routing_key: String::new(),
        arguments: BTreeMap::new(),
    }
}

fn matches(kind: ExchangeKind, binding: &Binding, routing_key: &str, headers: &BTreeMap<String, String>) -> bool {
    match kind {
        ExchangeKind::Direct => binding.routing_key == routing_key,
        ExchangeKind::Fanout => true,
        ExchangeKind::Topic => topic_matches(&binding.routing_key, routing_key),
        ExchangeKind::Headers => headers_match(&binding.arguments, headers),
    }
}

/// AMQP topic matching: words split on '.', `*` is exactly one word, `#` zero or more.
pub fn topic_matches(pattern: &str, routing_key: &str) -> bool {
    fn walk(pattern: &[&str], key: &[&str]) -> bool {
        match pattern.split_first() {
            None => key.is_empty(),
            Some((&"#", rest)) => (0..=key.len()).any(|skip| walk(rest, &key[skip..])),
            Some((&"*", rest)) => !key.is_empty() && walk(rest, &key[1..]),
            Some((word, rest)) => key.first() == Some(word) && walk(rest, &key[1..]),
        }
    }
    let pattern: Vec<&str> = pattern.split('.').collect();
    let key: Vec<&str> = if routing_key.is_empty() { Vec::new() } else { routing_key.split('.').collect() };
    walk(&pattern, &key)
}

/// A headers exchange's rule: `x-match` is `all` (default) or `any`, with `-with-x` to
/// count `x-` arguments too; an argument matches a header of equal value, or any value of
/// that name when the argument has no value.
fn headers_match(arguments: &BTreeMap<String, String>, headers: &BTreeMap<String, String>) -> bool {
    let mode = arguments.get("x-match").map(String::as_str).unwrap_or("all");
    let with_x = mode.ends_with("-with-x");
    let mut pairs = arguments.iter().filter(|(k, _)| *k != "x-match" && (with_x || !k.starts_with("x-"))).peekable();
    if pairs.peek().is_none() {
        return true;
    }
    let hit = |(k, v): (&String, &String)| headers.get(k).is_some_and(|h| v == "Void" || h == v);
    if mode.starts_with("any") {
        pairs.any(hit)
    } else {
        pairs.all(hit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_patterns_match_as_rabbitmq_does() {
        assert!(topic_matches("*.orange.*", "quick.orange.rabbit"));
        assert!(!topic_matches("*.orange.*", "quick.orange.male.rabbit"));
        assert!(topic_matches("lazy.#", "lazy"));
        assert!(topic_matches("lazy.#", "lazy.pink.rabbit"));
        assert!(topic_matches("#", ""));
        assert!(topic_matches("#.rabbit", "rabbit"));
        assert!(!topic_matches("*", ""));
        assert!(!topic_matches("a.b", "a.b.c"));
    }

    fn queue() -> Queue {
        Queue { durable: true, exclusive: false, auto_delete: false, arguments: BTreeMap::new() }
    }

    fn binding(source: &str, queue: &str, key: &str) -> Binding {
        Binding {
            source: source.into(),
            destination: Destination::Queue(queue.into()),
            routing_key: key.into(),
            arguments: BTreeMap::new(),
        }
    }

    fn store(dir: &std::path::Path) -> Arc<dyn StateStore> {
        Arc::new(crate::state_store::FileStore::open(dir, transient_entry, legacy_entries).unwrap())
    }

    #[tokio::test]
    async fn a_topology_file_from_before_the_state_store_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = r#"{"exchanges":{"logs":{"kind":"topic","durable":true,"auto_delete":false,"internal":false}},
            "queues":{"errors":{"durable":true,"exclusive":false,"auto_delete":false,"arguments":{}}},
            "bindings":[{"source":"logs","destination":{"Queue":"errors"},"routing_key":"*.error","arguments":{}}]}"#;
        std::fs::write(dir.path().join(LEGACY_TOPOLOGY_FILE), legacy).unwrap();
        let topology = Topology::new(store(dir.path()));
        assert_eq!(topology.route("logs", "kern.error", None).unwrap(), BTreeSet::from(["errors".to_string()]));
        topology.declare_queue("more", queue()).await.unwrap();
        drop(topology);
        let topology = Topology::new(store(dir.path()));
        assert!(topology.queue("errors").is_some() && topology.queue("more").is_some());
    }

    #[tokio::test]
    async fn declarations_survive_a_reopen_and_route() {
        let dir = tempfile::tempdir().unwrap();
        let topology = Topology::new(store(dir.path()));
        let logs = Exchange { kind: ExchangeKind::Topic, durable: true, auto_delete: false, internal: false };
        topology.declare_exchange("logs", logs.clone()).await.unwrap();
        topology.declare_queue("errors", queue()).await.unwrap();
        topology.bind(binding("logs", "errors", "*.error")).await.unwrap();
        let transient = Exchange { durable: false, ..logs.clone() };
        topology.declare_exchange("scratch", transient).await.unwrap();
        topology.bind(binding("scratch", "errors", "")).await.unwrap();
        assert!(topology.exchange("scratch").is_some(), "a transient exchange lives as long as the node");
        drop(topology);
        let topology = Topology::new(store(dir.path()));
        assert_eq!(topology.route("logs", "kern.error", None).unwrap(), BTreeSet::from(["errors".to_string()]));
        assert!(topology.route("logs", "kern.info", None).unwrap().is_empty());
        assert!(topology.exchange("scratch").is_none(), "a transient exchange is gone after a restart");
        assert_eq!(topology.route("", "errors", None).unwrap().len(), 1);
        let other = Exchange { kind: ExchangeKind::Fanout, ..logs };
        let refused = topology.declare_exchange("logs", other).await.unwrap_err();
        assert_eq!(refused.0, crate::frames::reply::PRECONDITION_FAILED);
    }

    #[tokio::test]
    async fn a_change_computed_on_an_older_state_is_computed_again() {
        let dir = tempfile::tempdir().unwrap();
        let shared = store(dir.path());
        let (here, there) = (Topology::new(shared.clone()), Topology::new(shared));
        let fanout = Exchange { kind: ExchangeKind::Fanout, durable: true, auto_delete: false, internal: false };
        here.declare_exchange("a", fanout.clone()).await.unwrap();
        there.declare_exchange("b", fanout).await.unwrap();
        assert!(here.exchange("b").is_some() && there.exchange("a").is_some(), "neither change is lost");
    }

    #[tokio::test]
    async fn exchange_to_exchange_bindings_route_once_even_in_a_cycle() {
        let dir = tempfile::tempdir().unwrap();
        let topology = Topology::new(store(dir.path()));
        let fanout = Exchange { kind: ExchangeKind::Fanout, durable: true, auto_delete: false, internal: false };
        topology.declare_exchange("a", fanout.clone()).await.unwrap();
        topology.declare_exchange("b", fanout).await.unwrap();
        topology.declare_queue("q", queue()).await.unwrap();
        let e2e = |s: &str, d: &str| Binding {
            source: s.into(),
            destination: Destination::Exchange(d.into()),
            routing_key: String::new(),
            arguments: BTreeMap::new(),
        };
        topology.bind(e2e("a", "b")).await.unwrap();
        topology.bind(e2e("b", "a")).await.unwrap();
        topology.bind(binding("b", "q", "")).await.unwrap();
        assert_eq!(topology.route("a", "x", None).unwrap(), BTreeSet::from(["q".to_string()]));
    }

    #[test]
    fn headers_bindings_match_all_or_any() {
        let arguments = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let headers = arguments(&[("format", "pdf"), ("type", "report")]);
        assert!(headers_match(&arguments(&[("format", "pdf"), ("type", "report")]), &headers));
        assert!(!headers_match(&arguments(&[("format", "pdf"), ("type", "log")]), &headers));
        assert!(headers_match(&arguments(&[("x-match", "any"), ("format", "pdf"), ("type", "log")]), &headers));
    }
}
