//! Who may do what: each REST call needs one [`Access`] to one [`Target`], decided by the
//! host's [`Gate`](crate::http::Gate) (the broker maps them onto Kafka ACLs).
//!
//! One table ([`required`]) names what every route needs, checked before the request runs
//! (and before it is forwarded to the leader of `_schemas`). Calls that span subjects
//! (`GET /subjects`, the `/schemas/ids/{id}` family) are not in the table: they answer
//! only what the caller may read, filtered where the answer is built.

use std::net::IpAddr;

use axum::http::Method;

/// What a call does to its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read a subject's versions, look a schema up, test compatibility.
    Read,
    /// Register a new version.
    Write,
    /// Delete versions, soft or permanently.
    Delete,
    /// Read the compatibility level or mode.
    ReadConfig,
    /// Set or remove the compatibility level or mode.
    WriteConfig,
}

impl Access {
    pub fn name(self) -> &'static str {
        match self {
            Access::Read => "Read",
            Access::Write => "Write",
            Access::Delete => "Delete",
            Access::ReadConfig => "ReadConfig",
            Access::WriteConfig => "WriteConfig",
        }
    }
}

/// What a call acts on: one subject, or the registry's global settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Subject(String),
    Global,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Subject(subject) => write!(f, "subject {subject:?}"),
            Target::Global => f.write_str("the global settings"),
        }
    }
}

/// An authenticated caller: its principal (`User:name`) and the address it called from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub principal: String,
    pub host: IpAddr,
}

/// The topic a subject belongs to under the naming every serializer uses by default
/// (`<topic>-key`, `<topic>-value`); any other subject (record-name strategies, the files
/// Protobuf schemas import) is its own name.
pub fn subject_topic(subject: &str) -> &str {
    subject.strip_suffix("-value").or_else(|| subject.strip_suffix("-key")).unwrap_or(subject)
}

/// What the route `path` (as matched, e.g. `/subjects/{subject}`) called with `method`
/// needs; `subject` is the path's `{subject}`. `None`: nothing beyond authentication
/// (the types list) or checked per subject in the answer (see the module doc).
pub fn required(method: &Method, path: &str, subject: Option<&str>) -> Option<(Access, Target)> {
    let on_subject = |access: Access| Some((access, Target::Subject(subject?.to_string())));
    let is = |m: Method| *method == m;
    match path {
        "/config" | "/mode" => match is(Method::GET) {
            true => Some((Access::ReadConfig, Target::Global)),
            false => Some((Access::WriteConfig, Target::Global)),
        },
        "/config/{subject}" | "/mode/{subject}" => match is(Method::GET) {
            true => on_subject(Access::ReadConfig),
            false => on_subject(Access::WriteConfig),
        },
        "/subjects/{subject}/versions" if is(Method::POST) => on_subject(Access::Write),
        "/subjects/{subject}" | "/subjects/{subject}/versions/{version}" if is(Method::DELETE) => {
            on_subject(Access::Delete)
        }
        "/subjects/{subject}"
        | "/subjects/{subject}/versions"
        | "/subjects/{subject}/versions/{version}"
        | "/subjects/{subject}/versions/{version}/schema"
        | "/subjects/{subject}/versions/{version}/referencedby"
        | "/compatibility/subjects/{subject}/versions"
        | "/compatibility/subjects/{subject}/versions/{version}" => on_subject(Access::Read),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_belong_to_the_topic_their_name_strategy_names() {
        assert_eq!(subject_topic("orders-value"), "orders");
        assert_eq!(subject_topic("orders-key"), "orders");
        assert_eq!(subject_topic("com.acme.Order"), "com.acme.Order");
        assert_eq!(subject_topic("google/protobuf/timestamp.proto"), "google/protobuf/timestamp.proto");
    }

    #[test]
    fn every_subject_route_needs_an_access_to_its_subject() {
        let needs = |method: Method, path: &str| required(&method, path, Some("s-value")).map(|(access, _)| access);
        assert_eq!(needs(Method::POST, "/subjects/{subject}/versions"), Some(Access::Write));
        assert_eq!(needs(Method::GET, "/subjects/{subject}/versions"), Some(Access::Read));
        assert_eq!(needs(Method::POST, "/subjects/{subject}"), Some(Access::Read));
        assert_eq!(needs(Method::DELETE, "/subjects/{subject}"), Some(Access::Delete));
        assert_eq!(needs(Method::DELETE, "/subjects/{subject}/versions/{version}"), Some(Access::Delete));
        assert_eq!(needs(Method::PUT, "/config/{subject}"), Some(Access::WriteConfig));
        assert_eq!(needs(Method::DELETE, "/mode/{subject}"), Some(Access::WriteConfig));
        assert_eq!(needs(Method::GET, "/config/{subject}"), Some(Access::ReadConfig));
        assert_eq!(required(&Method::PUT, "/config", None), Some((Access::WriteConfig, Target::Global)));
        assert_eq!(required(&Method::GET, "/subjects", None), None);
    }
}
