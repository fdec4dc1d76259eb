//! Named listeners as Kafka configures them: `listeners`, `advertised.listeners` and
//! `listener.security.protocol.map`, each listener with its own security protocol.
//!
//! Without `listeners`, the broker has one PLAINTEXT listener of its own making.
//!
//! `listeners` may also name AMQP 0-9-1 ports, as RabbitMQ users write them: `AMQP://:5672`
//! and `AMQPS://:5671` (TLS with the broker's `ssl.keystore.*`), or any name the protocol map
//! maps to `AMQP` or `AMQPS`. They are not Kafka listeners: [`parse_listeners`] leaves them
//! out and [`parse_amqp_listeners`] gives them.

use std::net::{SocketAddr, ToSocketAddrs};

/// Kafka's default `listener.security.protocol.map`: each protocol's name maps to itself.
pub const SECURITY_PROTOCOL_MAP_DEFAULT: &str =
    "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL";
/// Listeners a broker may have (each is a socket and an accept loop).
pub const LISTENERS_MAX: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    fn parse(name: &str) -> Result<SecurityProtocol, String> {
        match name.to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Ok(SecurityProtocol::Plaintext),
            "SSL" => Ok(SecurityProtocol::Ssl),
            "SASL_PLAINTEXT" => Ok(SecurityProtocol::SaslPlaintext),
            "SASL_SSL" => Ok(SecurityProtocol::SaslSsl),
            other => Err(format!("unknown security protocol {other:?} (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)")),
        }
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }
}

/// How a listener's clients speak: Kafka with a security protocol, or AMQP 0-9-1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Kafka(SecurityProtocol),
    Amqp { tls: bool },
}

impl Protocol {
    fn parse(name: &str) -> Result<Protocol, String> {
        match name.to_ascii_uppercase().as_str() {
            "AMQP" => Ok(Protocol::Amqp { tls: false }),
            "AMQPS" => Ok(Protocol::Amqp { tls: true }),
            other => SecurityProtocol::parse(other)
                .map(Protocol::Kafka)
                .map_err(|error| format!("{error}, or AMQP, AMQPS for AMQP 0-9-1")),
        }
    }
}

/// An AMQP 0-9-1 listener: where it binds, and whether it takes TLS (AMQPS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpListener {
    pub name: String,
    pub bind: SocketAddr,
    pub tls: bool,
}

/// One listener: where it binds, what it tells clients, how connections authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Its name, upper case (`PLAINTEXT`, `SSL`, `CLIENT`, ...).
    pub name: String,
    pub protocol: SecurityProtocol,
    pub bind: SocketAddr,
    /// (host, port) given to clients that connected to this listener.
    pub advertised: (String, i32),
}

/// `NAME://host:port` entries of `listeners` or `advertised.listeners`.
fn parse_endpoints(key: &str, text: &str) -> Result<Vec<(String, String, u16)>, String> {
    let mut endpoints: Vec<(String, String, u16)> = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, address) =
            entry.split_once("://").ok_or_else(|| format!("{key} entry {entry:?} is not NAME://host:port"))?;
        let name = name.trim().to_ascii_uppercase();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(format!("{key} entry {entry:?} has a bad listener name"));
        }
        let (host, port) = address.rsplit_once(':').ok_or_else(|| format!("{key} entry {entry:?} has no port"))?;
        let port: u16 = port.parse().map_err(|_| format!("{key} entry {entry:?} has a bad port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        if endpoints.iter().any(|(other, _, _)| *other == name) {
            return Err(format!("{key} names listener {name} twice"));
        }
        endpoints.push((name, host, port));
    }
    Ok(endpoints)
}

fn parse_protocol_map(text: &str) -> Result<Vec<(String, Protocol)>, String> {
    let mut map = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, protocol) = entry
            .split_once(':')
            .ok_or_else(|| format!("listener.security.protocol.map entry {entry:?} is not NAME:PROTOCOL"))?;
        map.push((name.trim().to_ascii_uppercase(), Protocol::parse(protocol.trim())?));
    }
    Ok(map)
}

fn bind_address(name: &str, host: &str, port: u16) -> Result<SocketAddr, String> {
    if host.is_empty() {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|error| format!("listener {name}: cannot resolve {host:?}: {error}"))?
        .next()
        .ok_or_else(|| format!("listener {name}: {host:?} resolves to no address"))
}

/// The listeners `listeners` names (`NAME://host:port,...`), in that order (the first is
/// the one other nodes use in a cluster unless `inter.broker.listener.name` says
/// otherwise), each with its protocol from `listener.security.protocol.map` (Kafka's
/// default when `None`) and what clients are told from `advertised.listeners`. AMQP
/// listeners are left out ([`parse_amqp_listeners`]).
pub fn parse_listeners(
    listeners: &str,
    advertised_listeners: Option<&str>,
    protocol_map: Option<&str>,
) -> Result<Vec<Listener>, String> {
    parse_all(listeners, advertised_listeners, protocol_map).map(|(kafka, _)| kafka)
}

/// The AMQP listeners `listeners` names (the whole value is checked, as [`parse_listeners`]
/// checks it).
pub fn parse_amqp_listeners(
    listeners: &str,
    advertised_listeners: Option<&str>,
    protocol_map: Option<&str>,
) -> Result<Vec<AmqpListener>, String> {
    parse_all(listeners, advertised_listeners, protocol_map).map(|(_, amqp)| amqp)
}

/// `name`'s protocol: the map's entry, else AMQP for the names `AMQP` and `AMQPS`.
fn protocol_of(name: &str, protocols: &[(String, Protocol)]) -> Result<Protocol, String> {
    if let Some((_, protocol)) = protocols.iter().find(|(mapped, _)| mapped == name) {
        return Ok(*protocol);
    }
    match name {
        "AMQP" => Ok(Protocol::Amqp { tls: false }),
        "AMQPS" => Ok(Protocol::Amqp { tls: true }),
        _ => Err(format!("listener {name} has no entry in listener.security.protocol.map")),
    }
}

fn parse_all(
    listeners: &str,
    advertised_listeners: Option<&str>,
    protocol_map: Option<&str>,
) -> Result<(Vec<Listener>, Vec<AmqpListener>), String> {
    let protocols = parse_protocol_map(protocol_map.unwrap_or(SECURITY_PROTOCOL_MAP_DEFAULT))?;
    let endpoints = parse_endpoints("listeners", listeners)?;
    let advertised = parse_endpoints("advertised.listeners", advertised_listeners.unwrap_or(""))?;
    if let Some((name, _, _)) = advertised.iter().find(|(name, _, _)| !endpoints.iter().any(|(n, _, _)| n == name)) {
        return Err(format!("advertised.listeners names {name}, which is not among listeners"));
    }
    let mut result = Vec::with_capacity(endpoints.len());
    let mut amqp: Vec<AmqpListener> = Vec::new();
    for (name, host, port) in endpoints {
        let protocol = protocol_of(&name, &protocols)?;
        let bind = bind_address(&name, &host, port)?;
        if result.iter().any(|other: &Listener| other.bind == bind) || amqp.iter().any(|other| other.bind == bind) {
            return Err(format!("listener {name} binds {bind}, as another listener does"));
        }
        let protocol = match protocol {
            Protocol::Kafka(protocol) => protocol,
            Protocol::Amqp { tls } => {
                amqp.push(AmqpListener { name, bind, tls });
                continue;
            }
        };
        let advertised = match advertised.iter().find(|(n, _, _)| *n == name) {
            Some((_, host, port)) if !host.is_empty() => (host.clone(), i32::from(*port)),
            Some(_) => return Err(format!("advertised.listeners entry {name} needs a host")),
            None if host.is_empty() || bind.ip().is_unspecified() => ("127.0.0.1".to_string(), i32::from(port)),
            None => (host, i32::from(port)),
        };
        result.push(Listener { name, protocol, bind, advertised });
    }
    if result.is_empty() || result.len() > LISTENERS_MAX || amqp.len() > LISTENERS_MAX {
        return Err(format!(
            "listeners must name 1 to {LISTENERS_MAX} Kafka listeners (and at most as many AMQP ones)"
        ));
    }
    Ok((result, amqp))
}

/// Index of the listener other nodes fetch from: `inter.broker.listener.name` (`name`), else
/// the first PLAINTEXT listener, else the first one (inter_broker.rs says how nodes
/// authenticate on it).
pub fn inter_broker_listener(listeners: &[Listener], name: Option<&str>) -> Result<usize, String> {
    let index = match name {
        Some(name) => listeners
            .iter()
            .position(|l| l.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| format!("inter.broker.listener.name {name} is not among listeners"))?,
        None => listeners.iter().position(|l| l.protocol == SecurityProtocol::Plaintext).unwrap_or(0),
    };
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(listeners: &str, advertised: Option<&str>) -> Result<Vec<Listener>, String> {
        parse_listeners(listeners, advertised, None)
    }

    #[test]
    fn named_listeners_with_protocols_and_advertised_addresses() {
        let listeners = parse(
            "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093,sasl_ssl://:9094",
            Some("SASL_SSL://broker.example:19094"),
        )
        .unwrap();
        let found: Vec<_> = listeners.iter().map(|l| (l.name.as_str(), l.protocol, l.advertised.1)).collect();
        assert_eq!(
            found,
            [
                ("PLAINTEXT", SecurityProtocol::Plaintext, 9092),
                ("SSL", SecurityProtocol::Ssl, 9093),
                ("SASL_SSL", SecurityProtocol::SaslSsl, 19094)
            ]
        );
        assert_eq!(listeners[2].bind, "0.0.0.0:9094".parse().unwrap());
        assert_eq!(listeners[2].advertised.0, "broker.example");
    }

    #[test]
    fn amqp_ports_are_named_in_listeners_and_left_out_of_kafkas() {
        let all = "PLAINTEXT://127.0.0.1:9092,AMQP://127.0.0.1:5672,amqps://:5671,RABBIT://127.0.0.1:5673";
        let map = Some("PLAINTEXT:PLAINTEXT,RABBIT:AMQP");
        let kafka = parse_listeners(all, None, map).unwrap();
        assert_eq!(kafka.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["PLAINTEXT"]);
        let amqp = parse_amqp_listeners(all, None, map).unwrap();
        let found: Vec<_> = amqp.iter().map(|l| (l.name.as_str(), l.bind.port(), l.tls)).collect();
        assert_eq!(found, [("AMQP", 5672, false), ("AMQPS", 5671, true), ("RABBIT", 5673, false)]);
        let clash = parse_amqp_listeners("PLAINTEXT://127.0.0.1:9092,AMQP://127.0.0.1:9092", None, None);
        assert!(clash.unwrap_err().contains("as another listener"));
    }

    #[test]
    fn custom_names_need_the_protocol_map() {
        assert!(parse("CLIENT://127.0.0.1:9092", None).unwrap_err().contains("CLIENT has no entry"));
        let named = parse_listeners("CLIENT://127.0.0.1:9092", None, Some("CLIENT:SASL_SSL")).unwrap();
        assert_eq!(named[0].protocol, SecurityProtocol::SaslSsl);
    }

    #[test]
    fn bad_listeners_are_refused_with_the_reason() {
        for (listeners, advertised, expected) in [
            ("PLAINTEXT://127.0.0.1", None, "no port"),
            ("127.0.0.1:9092", None, "NAME://host:port"),
            ("PLAINTEXT://127.0.0.1:9092,PLAINTEXT://127.0.0.1:9093", None, "twice"),
            ("PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9092", None, "as another listener"),
            ("PLAINTEXT://127.0.0.1:9092", Some("SSL://h:1"), "not among listeners"),
            ("PLAINTEXT://127.0.0.1:99999", None, "bad port"),
            ("", None, "1 to"),
        ] {
            let error = parse(listeners, advertised).unwrap_err();
            assert!(error.contains(expected), "{listeners}: {error}");
        }
        assert!(parse("AMQP://127.0.0.1:5672", None).unwrap_err().contains("Kafka listeners"));
        let bad_map = parse_listeners("PLAINTEXT://:9092", None, Some("PLAINTEXT:TLS"));
        assert!(bad_map.unwrap_err().contains("unknown security protocol"));
    }
}
