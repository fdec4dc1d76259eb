//! Exchanges, queues and bindings of the default virtual host, and routing through them.
//!
//! Why here and not in Kafka's metadata: exchanges and bindings have no Kafka counterpart.
//! They are kept in one file of the node's data directory, written new, fsynced, renamed
//! and the directory fsynced on every change, so a declaration that was answered survives
//! a crash. The queues themselves are topics; what is kept here is what AMQP knows of
//! them (durable, exclusive, auto-delete, arguments) and the bindings that lead to them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use amq_protocol::types::{AMQPValue, FieldTable};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// The topology file in the state directory.
const TOPOLOGY_FILE: &str = "amqp-topology.json";
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

#[derive(Default, Serialize, Deserialize)]
struct State {
    exchanges: BTreeMap<String, Exchange>,
    queues: BTreeMap<String, Queue>,
    bindings: BTreeSet<Binding>,
}

pub struct Topology {
    path: PathBuf,
    state: Mutex<State>,
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
    /// The topology stored in `dir` (the predeclared exchanges when there is none).
    pub fn open(dir: &Path) -> io::Result<Topology> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(TOPOLOGY_FILE);
        let mut state: State = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?,
            Err(error) if error.kind() == io::ErrorKind::NotFound => State::default(),
            Err(error) => return Err(error),
        };
        // What only lived as long as a connection or a process is gone after a restart.
        state.queues.retain(|_, q| q.durable && !q.exclusive);
        state.exchanges.retain(|_, e| e.durable);
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
        Ok(Topology { path, state: Mutex::new(state) })
    }

    pub fn exchange(&self, name: &str) -> Option<Exchange> {
        self.state.lock().exchanges.get(name).cloned()
    }

    pub fn queue(&self, name: &str) -> Option<Queue> {
        self.state.lock().queues.get(name).cloned()
    }

    /// The queues declared with `x-expires`.
    pub fn expiring_queues(&self) -> Vec<(String, Queue)> {
        let state = self.state.lock();
        state
            .queues
            .iter()
            .filter(|(_, q)| q.arguments.contains_key("x-expires"))
            .map(|(n, q)| (n.clone(), q.clone()))
            .collect()
    }

    /// Declares `name` as `exchange`; an existing one must be the same kind and durability.
    pub fn declare_exchange(&self, name: &str, exchange: Exchange) -> Result<(), Refused> {
        let mut state = self.state.lock();
        if let Some(existing) = state.exchanges.get(name) {
            if existing.kind != exchange.kind || existing.durable != exchange.durable {
                return Err(Refused(
                    crate::frames::reply::PRECONDITION_FAILED,
                    format!("inequivalent arg 'type' or 'durable' for exchange '{name}' in vhost '/'"),
                ));
            }
            return Ok(());
        }
        if name.starts_with("amq.") {
            return Err(Refused(
                crate::frames::reply::ACCESS_REFUSED,
                format!("exchange name '{name}' contains reserved prefix 'amq.*'"),
            ));
        }
        check_room(state.exchanges.len())?;
        state.exchanges.insert(name.to_string(), exchange);
        self.store(&state)
    }

    /// Deletes exchange `name` and its bindings (`if_unused`: only if it has none as source).
    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> Result<(), Refused> {
        let mut state = self.state.lock();
        if name.is_empty() || name.starts_with("amq.") {
            return Err(Refused(crate::frames::reply::ACCESS_REFUSED, format!("cannot delete exchange '{name}'")));
        }
        if !state.exchanges.contains_key(name) {
            return Ok(());
        }
        if if_unused && state.bindings.iter().any(|b| b.source == name) {
            return Err(Refused(crate::frames::reply::PRECONDITION_FAILED, format!("exchange '{name}' in use")));
        }
        state.exchanges.remove(name);
        let gone = Destination::Exchange(name.to_string());
        state.bindings.retain(|b| b.source != name && b.destination != gone);
        self.store(&state)
    }

    /// Records queue `name`; an existing one must be declared the same way.
    pub fn declare_queue(&self, name: &str, queue: Queue) -> Result<(), Refused> {
        let mut state = self.state.lock();
        if let Some(existing) = state.queues.get(name) {
            if existing.durable != queue.durable || existing.arguments != queue.arguments {
                return Err(Refused(
                    crate::frames::reply::PRECONDITION_FAILED,
                    format!("inequivalent arg 'durable' or arguments for queue '{name}' in vhost '/'"),
                ));
            }
            return Ok(());
        }
        check_room(state.queues.len())?;
        state.queues.insert(name.to_string(), queue);
        self.store(&state)
    }

    /// Forgets queue `name` and the bindings to it.
    pub fn forget_queue(&self, name: &str) -> Result<(), Refused> {
        let mut state = self.state.lock();
        if state.queues.remove(name).is_none() {
            return Ok(());
        }
        let gone = Destination::Queue(name.to_string());
        state.bindings.retain(|b| b.destination != gone);
        self.store(&state)
    }

    pub fn bind(&self, binding: Binding) -> Result<(), Refused> {
        let mut state = self.state.lock();
        self.check_ends(&state, &binding)?;
        if state.bindings.contains(&binding) {
            return Ok(());
        }
        check_room(state.bindings.len())?;
        state.bindings.insert(binding);
        self.store(&state)
    }

    pub fn unbind(&self, binding: &Binding) -> Result<(), Refused> {
        let mut state = self.state.lock();
        self.check_ends(&state, binding)?;
        if state.bindings.remove(binding) {
            self.store(&state)?;
        }
        Ok(())
    }

    fn check_ends(&self, state: &State, binding: &Binding) -> Result<(), Refused> {
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

    /// The queues a message published to `exchange` with `routing_key` and `headers` goes
    /// to; `None` when the exchange does not exist.
    pub fn route(&self, exchange: &str, routing_key: &str, headers: Option<&FieldTable>) -> Option<BTreeSet<String>> {
        let state = self.state.lock();
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

    fn store(&self, state: &State) -> Result<(), Refused> {
        let durable = State {
            exchanges: state.exchanges.iter().filter(|(_, e)| e.durable).map(|(k, e)| (k.clone(), e.clone())).collect(),
            queues: state.queues.clone(),
            bindings: state.bindings.clone(),
        };
        write_atomically(&self.path, &serde_json::to_vec(&durable).expect("topology serializes")).map_err(|error| {
            tracing::error!(path = %self.path.display(), %error, "could not store the AMQP topology");
            Refused(crate::frames::reply::INTERNAL_ERROR, format!("could not store the topology: {error}"))
        })
    }
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

/// Replaces `path` with `bytes`: written new, fsynced, renamed, the directory fsynced.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let staged = path.with_extension("json.new");
    let mut file = std::fs::File::create(&staged)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&staged, path)?;
    std::fs::File::open(path.parent().expect("a file in a directory"))?.sync_all()
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

    #[test]
    fn declarations_survive_a_reopen_and_route() {
        let dir = tempfile::tempdir().unwrap();
        let topology = Topology::open(dir.path()).unwrap();
        let logs = Exchange { kind: ExchangeKind::Topic, durable: true, auto_delete: false, internal: false };
        topology.declare_exchange("logs", logs.clone()).unwrap();
        topology.declare_queue("errors", queue()).unwrap();
        topology.bind(binding("logs", "errors", "*.error")).unwrap();
        let transient = Exchange { durable: false, ..logs.clone() };
        topology.declare_exchange("scratch", transient).unwrap();
        drop(topology);
        let topology = Topology::open(dir.path()).unwrap();
        assert_eq!(topology.route("logs", "kern.error", None).unwrap(), BTreeSet::from(["errors".to_string()]));
        assert!(topology.route("logs", "kern.info", None).unwrap().is_empty());
        assert!(topology.exchange("scratch").is_none(), "a transient exchange is gone after a restart");
        assert_eq!(topology.route("", "errors", None).unwrap().len(), 1);
        let other = Exchange { kind: ExchangeKind::Fanout, ..logs };
        assert_eq!(topology.declare_exchange("logs", other).unwrap_err().0, crate::frames::reply::PRECONDITION_FAILED);
    }

    #[test]
    fn exchange_to_exchange_bindings_route_once_even_in_a_cycle() {
        let dir = tempfile::tempdir().unwrap();
        let topology = Topology::open(dir.path()).unwrap();
        let fanout = Exchange { kind: ExchangeKind::Fanout, durable: true, auto_delete: false, internal: false };
        topology.declare_exchange("a", fanout.clone()).unwrap();
        topology.declare_exchange("b", fanout).unwrap();
        topology.declare_queue("q", queue()).unwrap();
        let e2e = |s: &str, d: &str| Binding {
            source: s.into(),
            destination: Destination::Exchange(d.into()),
            routing_key: String::new(),
            arguments: BTreeMap::new(),
        };
        topology.bind(e2e("a", "b")).unwrap();
        topology.bind(e2e("b", "a")).unwrap();
        topology.bind(binding("b", "q", "")).unwrap();
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
