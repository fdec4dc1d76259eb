//! The Security pages: SCRAM users (`users`), ACL bindings (`acls`) and client quotas
//! (`quotas`), each listed and changed with the protocol's own requests as the session's
//! user. The broker decides who may see or change them (DESCRIBE / ALTER on the cluster for
//! users and ACLs, DESCRIBE_CONFIGS / ALTER_CONFIGS for quotas), and a page that is refused
//! says so with Kafka's error instead of showing an empty table.
//!
//! A form that changes something returns its page with what the broker answered atop it.
//! Passwords go from the form into the salted credential and are never written into a page.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sluice_security::ScramMechanism;

use crate::acls::{self, code_of, name_of, AclBinding, OPERATIONS, PATTERN_TYPES, PERMISSIONS, RESOURCE_TYPES};
use crate::pages::{render, session_of, Chrome, Outcome};
use crate::quotas::{self, EntityPart, QuotaEntry, ENTITY_CLIENT_ID, ENTITY_USER, QUOTA_KEYS};
use crate::session::Session;
use crate::users::{self, CredentialRow};
use crate::Console;

/// Credentials listed on the users page.
pub const CREDENTIALS_SHOWN_MAX: usize = 1_000;
/// ACL bindings listed on the ACLs page; a filter narrows the rest down.
pub const ACLS_SHOWN_MAX: usize = 1_000;
/// Quota entities listed on the quotas page.
pub const QUOTAS_SHOWN_MAX: usize = 1_000;
/// The resource name of the cluster, the only one a CLUSTER binding may name.
const CLUSTER_RESOURCE_NAME: &str = "kafka-cluster";
/// The host a binding applies to when the form leaves it empty: every host.
const ANY_HOST: &str = "*";
/// An entity component the quota form leaves out, names, or sets for the type's default.
const MATCH_NAMED: &str = "named";
const MATCH_DEFAULT: &str = "default";

/// What the change did, split for a page's two messages, and the page's status.
fn outcome_parts(outcome: Outcome) -> (Option<String>, Option<String>, StatusCode) {
    match outcome {
        Outcome::None => (None, None, StatusCode::OK),
        Outcome::Done(text) => (Some(text), None, StatusCode::OK),
        Outcome::Refused(text) => (None, Some(text), StatusCode::UNPROCESSABLE_ENTITY),
    }
}

fn outcome_of(result: Result<String, String>) -> Outcome {
    match result {
        Ok(done) => Outcome::Done(done),
        Err(why) => Outcome::Refused(why),
    }
}

fn mechanism_named(name: &str) -> Result<ScramMechanism, String> {
    ScramMechanism::from_name(name.trim())
        .ok_or_else(|| format!("unknown mechanism {name:?}: choose SCRAM-SHA-256 or SCRAM-SHA-512"))
}

// --- Users ---------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "users.html")]
struct UsersPage {
    chrome: Chrome,
    credentials: Vec<CredentialRow>,
    /// Credentials beyond what the page lists.
    hidden: usize,
    listing_refused: Option<String>,
    mechanisms: Vec<&'static str>,
    iterations: i32,
    done: Option<String>,
    refused: Option<String>,
}

async fn users_page(session: &Session, outcome: Outcome) -> Response {
    let (mut credentials, listing_refused) = match users::credentials(&session.cluster).await {
        Ok(rows) => (rows, None),
        Err(error) => (Vec::new(), Some(format!("{error:#}"))),
    };
    let hidden = credentials.len().saturating_sub(CREDENTIALS_SHOWN_MAX);
    credentials.truncate(CREDENTIALS_SHOWN_MAX);
    let (done, refused, status) = outcome_parts(outcome);
    let page = UsersPage {
        chrome: Chrome::of(session),
        credentials,
        hidden,
        listing_refused,
        mechanisms: ScramMechanism::ALL.iter().map(|m| m.name()).collect(),
        iterations: users::ITERATIONS,
        done,
        refused,
    };
    (status, render(page)).into_response()
}

pub async fn users(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    match session_of(&console, &headers).await {
        Ok(session) => users_page(&session, Outcome::None).await,
        Err(response) => response,
    }
}

#[derive(Deserialize)]
pub struct PasswordForm {
    #[serde(default)]
    user: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    mechanism: String,
}

pub async fn set_password(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<PasswordForm>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let result = async {
        let user = form.user.trim();
        if user.is_empty() {
            return Err("the user name is empty".to_string());
        }
        if form.password.is_empty() {
            return Err("the password is empty".to_string());
        }
        let mechanism = mechanism_named(&form.mechanism)?;
        users::set_password(&session.cluster, user, mechanism, &form.password).await.map_err(|e| format!("{e:#}"))?;
        Ok(format!("{} password set for {user}", mechanism.name()))
    };
    let outcome = outcome_of(result.await);
    users_page(&session, outcome).await
}

#[derive(Deserialize)]
pub struct DeleteCredentialForm {
    user: String,
    mechanism: String,
    #[serde(default)]
    confirm: String,
}

pub async fn delete_credential(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<DeleteCredentialForm>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let result = async {
        let mechanism = mechanism_named(&form.mechanism)?;
        if form.confirm.trim() != form.user {
            return Err(format!("not deleted: type the user's name ({}) to confirm", form.user));
        }
        let deleted = users::delete_credential(&session.cluster, &form.user, mechanism).await;
        deleted.map_err(|e| format!("{e:#}"))?;
        Ok(format!("{} credential of {} deleted", mechanism.name(), form.user))
    };
    let outcome = outcome_of(result.await);
    users_page(&session, outcome).await
}

// --- ACLs ----------------------------------------------------------------------------

/// One binding as the ACLs page shows it (and its remove button posts back).
pub struct AclLine {
    pub principal: String,
    pub host: String,
    pub operation: String,
    pub permission: String,
    pub resource_type: String,
    pub pattern_type: String,
    pub resource_name: String,
}

impl AclLine {
    fn of(binding: AclBinding) -> AclLine {
        AclLine {
            principal: binding.principal,
            host: binding.host,
            operation: name_of(&OPERATIONS, binding.operation),
            permission: name_of(&PERMISSIONS, binding.permission),
            resource_type: name_of(&RESOURCE_TYPES, binding.resource_type),
            pattern_type: name_of(&PATTERN_TYPES, binding.pattern_type),
            resource_name: binding.resource_name,
        }
    }
}

/// The names a form's select offers.
fn names(table: &[(&'static str, i8)]) -> Vec<&'static str> {
    table.iter().map(|(name, _)| *name).collect()
}

#[derive(Template)]
#[template(path = "acls.html")]
struct AclsPage {
    chrome: Chrome,
    query: AclQuery,
    lines: Vec<AclLine>,
    /// Bindings that pass the filter, listed or not.
    matching: usize,
    limit: usize,
    listing_refused: Option<String>,
    form: AclForm,
    operations: Vec<&'static str>,
    permissions: Vec<&'static str>,
    resource_types: Vec<&'static str>,
    pattern_types: Vec<&'static str>,
    done: Option<String>,
    refused: Option<String>,
}

/// The ACLs page's filter: text in the principal and in the resource name.
#[derive(Deserialize, Default)]
pub struct AclQuery {
    #[serde(default)]
    principal: String,
    #[serde(default)]
    resource: String,
}

impl AclQuery {
    fn keeps(&self, binding: &AclBinding) -> bool {
        binding.principal.contains(self.principal.trim()) && binding.resource_name.contains(self.resource.trim())
    }
}

/// One binding as a form names it (the add form, and each row's remove button).
#[derive(Deserialize, Default)]
pub struct AclForm {
    #[serde(default)]
    principal: String,
    #[serde(default)]
    host: String,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    permission: String,
    #[serde(default)]
    resource_type: String,
    #[serde(default)]
    pattern_type: String,
    #[serde(default)]
    resource_name: String,
}

impl AclForm {
    fn binding(&self) -> Result<AclBinding, String> {
        let chosen = |table: &[(&'static str, i8)], value: &str, what: &str| {
            code_of(table, value.trim()).ok_or_else(|| format!("unknown {what} {value:?}"))
        };
        let principal = self.principal.trim();
        if !principal.contains(':') || principal.starts_with(':') || principal.ends_with(':') {
            return Err(format!("the principal {principal:?} is not TYPE:NAME (User:alice)"));
        }
        let resource_type = chosen(&RESOURCE_TYPES, &self.resource_type, "resource type")?;
        let resource_name = match self.resource_name.trim() {
            "" if self.resource_type.trim() == "CLUSTER" => CLUSTER_RESOURCE_NAME,
            "" => return Err("the resource name is empty (* for every resource)".to_string()),
            name => name,
        };
        let host = match self.host.trim() {
            "" => ANY_HOST,
            host => host,
        };
        Ok(AclBinding {
            principal: principal.to_string(),
            host: host.to_string(),
            operation: chosen(&OPERATIONS, &self.operation, "operation")?,
            permission: chosen(&PERMISSIONS, &self.permission, "permission")?,
            resource_type,
            pattern_type: chosen(&PATTERN_TYPES, &self.pattern_type, "pattern type")?,
            resource_name: resource_name.to_string(),
        })
    }
}

async fn acls_page(session: &Session, query: AclQuery, form: AclForm, outcome: Outcome) -> Response {
    let (lines, matching, listing_refused) = match acls::bindings(&session.cluster).await {
        Ok(bindings) => {
            let kept: Vec<AclBinding> = bindings.into_iter().filter(|b| query.keeps(b)).collect();
            let matching = kept.len();
            (kept.into_iter().take(ACLS_SHOWN_MAX).map(AclLine::of).collect(), matching, None)
        }
        Err(error) => (Vec::new(), 0, Some(format!("{error:#}"))),
    };
    let (done, refused, status) = outcome_parts(outcome);
    let page = AclsPage {
        chrome: Chrome::of(session),
        query,
        lines,
        matching,
        limit: ACLS_SHOWN_MAX,
        listing_refused,
        form,
        operations: names(&OPERATIONS),
        permissions: names(&PERMISSIONS),
        resource_types: names(&RESOURCE_TYPES),
        pattern_types: names(&PATTERN_TYPES),
        done,
        refused,
    };
    (status, render(page)).into_response()
}

pub async fn acls(State(console): State<Arc<Console>>, headers: HeaderMap, Query(query): Query<AclQuery>) -> Response {
    match session_of(&console, &headers).await {
        Ok(session) => acls_page(&session, query, AclForm::default(), Outcome::None).await,
        Err(response) => response,
    }
}

/// A binding in words: `ALLOW User:alice from * READ on TOPIC LITERAL orders`.
fn described(binding: &AclBinding) -> String {
    format!(
        "{} {} from {} {} on {} {} {}",
        name_of(&PERMISSIONS, binding.permission),
        binding.principal,
        binding.host,
        name_of(&OPERATIONS, binding.operation),
        name_of(&RESOURCE_TYPES, binding.resource_type),
        name_of(&PATTERN_TYPES, binding.pattern_type),
        binding.resource_name
    )
}

pub async fn add_acl(State(console): State<Arc<Console>>, headers: HeaderMap, Form(form): Form<AclForm>) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let result = async {
        let binding = form.binding()?;
        acls::create(&session.cluster, &binding).await.map_err(|e| format!("{e:#}"))?;
        Ok(format!("added: {}", described(&binding)))
    };
    let outcome = outcome_of(result.await);
    // A refused form keeps what was typed; an added binding clears it.
    let form = if matches!(outcome, Outcome::Refused(_)) { form } else { AclForm::default() };
    acls_page(&session, AclQuery::default(), form, outcome).await
}

pub async fn remove_acl(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<AclForm>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let result = async {
        let binding = form.binding()?;
        match acls::delete(&session.cluster, &binding).await.map_err(|e| format!("{e:#}"))? {
            true => Ok(format!("removed: {}", described(&binding))),
            false => Err(format!("not found (removed already?): {}", described(&binding))),
        }
    };
    let outcome = outcome_of(result.await);
    acls_page(&session, AclQuery::default(), AclForm::default(), outcome).await
}

// --- Quotas --------------------------------------------------------------------------

/// One entity's quotas as the quotas page shows them, with the fields its remove button
/// posts back.
pub struct QuotaLine {
    pub entity: String,
    pub user_match: &'static str,
    pub user: String,
    pub client_match: &'static str,
    pub client_id: String,
    /// The value of each of `QUOTA_KEYS`, empty when not set.
    pub known: Vec<String>,
    /// Values under other keys, `key=value`.
    pub other: String,
    /// Every key set, space-separated (what the remove button removes).
    pub keys: String,
}

/// A quota as a person reads it: a whole number without `.0`.
fn quota_value(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        value.to_string()
    }
}

/// How the quota form names an entity component: (match, name).
fn part_fields(entity: &[EntityPart], entity_type: &str) -> (&'static str, String) {
    match entity.iter().find(|part| part.entity_type == entity_type) {
        None => ("", String::new()),
        Some(EntityPart { name: None, .. }) => (MATCH_DEFAULT, String::new()),
        Some(EntityPart { name: Some(name), .. }) => (MATCH_NAMED, name.clone()),
    }
}

impl QuotaLine {
    fn of(entry: QuotaEntry) -> QuotaLine {
        let entity = entry
            .entity
            .iter()
            .map(|part| match &part.name {
                Some(name) => format!("{} {name}", part.entity_type),
                None => format!("{} (default)", part.entity_type),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let value_of = |key: &str| entry.values.iter().find(|(k, _)| k == key).map(|(_, v)| quota_value(*v));
        let known = QUOTA_KEYS.iter().map(|key| value_of(key).unwrap_or_default()).collect();
        let other = entry
            .values
            .iter()
            .filter(|(key, _)| !QUOTA_KEYS.contains(&key.as_str()))
            .map(|(key, value)| format!("{key}={}", quota_value(*value)))
            .collect::<Vec<_>>()
            .join(" ");
        let keys = entry.values.iter().map(|(key, _)| key.as_str()).collect::<Vec<_>>().join(" ");
        let (user_match, user) = part_fields(&entry.entity, ENTITY_USER);
        let (client_match, client_id) = part_fields(&entry.entity, ENTITY_CLIENT_ID);
        QuotaLine { entity, user_match, user, client_match, client_id, known, other, keys }
    }
}

#[derive(Template)]
#[template(path = "quotas.html")]
struct QuotasPage {
    chrome: Chrome,
    lines: Vec<QuotaLine>,
    /// Entities beyond what the page lists.
    hidden: usize,
    listing_refused: Option<String>,
    keys: Vec<&'static str>,
    form: QuotaForm,
    done: Option<String>,
    refused: Option<String>,
}

/// An entity (each component left out, named, or its type's default) and, to set a quota,
/// a key and value; to remove, the keys.
#[derive(Deserialize, Default)]
pub struct QuotaForm {
    #[serde(default)]
    user_match: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    client_match: String,
    #[serde(default)]
    client_id: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    /// Space-separated keys to remove.
    #[serde(default)]
    keys: String,
}

/// One entity component from a form's match and name; `None` when left out.
fn entity_part(entity_type: &str, matching: &str, name: &str) -> Result<Option<EntityPart>, String> {
    let entity_type = entity_type.to_string();
    match matching {
        "" => Ok(None),
        MATCH_DEFAULT => Ok(Some(EntityPart { entity_type, name: None })),
        MATCH_NAMED if name.trim().is_empty() => Err(format!("the {entity_type} name is empty")),
        MATCH_NAMED => Ok(Some(EntityPart { entity_type, name: Some(name.trim().to_string()) })),
        other => Err(format!("unknown {entity_type} choice {other:?}")),
    }
}

impl QuotaForm {
    fn entity(&self) -> Result<Vec<EntityPart>, String> {
        let user = entity_part(ENTITY_USER, &self.user_match, &self.user)?;
        let client = entity_part(ENTITY_CLIENT_ID, &self.client_match, &self.client_id)?;
        let entity: Vec<EntityPart> = user.into_iter().chain(client).collect();
        if entity.is_empty() {
            return Err("choose a user, a client id or a default".to_string());
        }
        Ok(entity)
    }

    fn setting(&self) -> Result<(String, f64), String> {
        let key = self.key.trim();
        if !QUOTA_KEYS.contains(&key) {
            return Err(format!("unknown quota {key:?}: one of {}", QUOTA_KEYS.join(", ")));
        }
        let value = self.value.trim();
        match value.parse::<f64>() {
            Ok(number) if number.is_finite() && number >= 0.0 => Ok((key.to_string(), number)),
            _ => Err(format!("the {key} value {value:?} is not a number of at least 0")),
        }
    }
}

fn entity_named(entity: &[EntityPart]) -> String {
    let line = QuotaLine::of(QuotaEntry { entity: entity.to_vec(), values: Vec::new() });
    line.entity
}

async fn quotas_page(session: &Session, form: QuotaForm, outcome: Outcome) -> Response {
    let (mut lines, listing_refused) = match quotas::entries(&session.cluster).await {
        Ok(entries) => (entries.into_iter().map(QuotaLine::of).collect::<Vec<_>>(), None),
        Err(error) => (Vec::new(), Some(format!("{error:#}"))),
    };
    let hidden = lines.len().saturating_sub(QUOTAS_SHOWN_MAX);
    lines.truncate(QUOTAS_SHOWN_MAX);
    let (done, refused, status) = outcome_parts(outcome);
    let page = QuotasPage {
        chrome: Chrome::of(session),
        lines,
        hidden,
        listing_refused,
        keys: QUOTA_KEYS.to_vec(),
        form,
        done,
        refused,
    };
    (status, render(page)).into_response()
}

pub async fn quotas(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    match session_of(&console, &headers).await {
        Ok(session) => quotas_page(&session, QuotaForm::default(), Outcome::None).await,
        Err(response) => response,
    }
}

pub async fn set_quota(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<QuotaForm>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let result = async {
        let entity = form.entity()?;
        let (key, value) = form.setting()?;
        let shown = quota_value(value);
        quotas::alter(&session.cluster, &entity, &[(key.clone(), Some(value))]).await.map_err(|e| format!("{e:#}"))?;
        Ok(format!("{key} = {shown} for {}", entity_named(&entity)))
    };
    let outcome = outcome_of(result.await);
    let form = if matches!(outcome, Outcome::Refused(_)) { form } else { QuotaForm::default() };
    quotas_page(&session, form, outcome).await
}

pub async fn remove_quota(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<QuotaForm>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let result = async {
        let entity = form.entity()?;
        let removed: Vec<(String, Option<f64>)> = form.keys.split_whitespace().map(|k| (k.to_string(), None)).collect();
        if removed.is_empty() {
            return Err("no quota to remove".to_string());
        }
        quotas::alter(&session.cluster, &entity, &removed).await.map_err(|e| format!("{e:#}"))?;
        Ok(format!("quotas of {} removed", entity_named(&entity)))
    };
    let outcome = outcome_of(result.await);
    quotas_page(&session, QuotaForm::default(), outcome).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl_form(principal: &str, resource_type: &str, resource_name: &str) -> AclForm {
        AclForm {
            principal: principal.into(),
            host: String::new(),
            operation: "READ".into(),
            permission: "ALLOW".into(),
            resource_type: resource_type.into(),
            pattern_type: "LITERAL".into(),
            resource_name: resource_name.into(),
        }
    }

    #[test]
    fn an_acl_form_becomes_a_binding_or_says_what_is_wrong() {
        let binding = acl_form("User:bob", "TOPIC", "orders").binding().unwrap();
        assert_eq!((binding.host.as_str(), binding.operation, binding.resource_type), ("*", 3, 2));
        assert_eq!(described(&binding), "ALLOW User:bob from * READ on TOPIC LITERAL orders");
        let cluster = acl_form("User:bob", "CLUSTER", "").binding().unwrap();
        assert_eq!(cluster.resource_name, CLUSTER_RESOURCE_NAME);
        assert!(acl_form("bob", "TOPIC", "orders").binding().unwrap_err().contains("TYPE:NAME"));
        assert!(acl_form("User:bob", "TOPIC", " ").binding().unwrap_err().contains("resource name is empty"));
        assert!(acl_form("User:bob", "BROKER", "x").binding().unwrap_err().contains("unknown resource type"));
    }

    fn quota_form(user_match: &str, user: &str, key: &str, value: &str) -> QuotaForm {
        QuotaForm {
            user_match: user_match.into(),
            user: user.into(),
            key: key.into(),
            value: value.into(),
            ..QuotaForm::default()
        }
    }

    #[test]
    fn a_quota_form_names_an_entity_and_a_number() {
        let form = quota_form("named", "alice", "producer_byte_rate", "1048576");
        assert_eq!(entity_named(&form.entity().unwrap()), "user alice");
        assert_eq!(form.setting().unwrap(), ("producer_byte_rate".to_string(), 1_048_576.0));
        let default = quota_form("default", "", "request_percentage", "12.5");
        assert_eq!(entity_named(&default.entity().unwrap()), "user (default)");
        assert_eq!(quota_value(default.setting().unwrap().1), "12.5");
        assert!(quota_form("", "", "producer_byte_rate", "1").entity().unwrap_err().contains("choose"));
        assert!(quota_form("named", " ", "producer_byte_rate", "1").entity().unwrap_err().contains("name is empty"));
        let errors = [("producer_byte_rate", "fast"), ("producer_byte_rate", "-1"), ("io_rate", "1")];
        for (key, value) in errors {
            assert!(quota_form("named", "alice", key, value).setting().is_err(), "{key}={value}");
        }
    }

    #[test]
    fn a_mechanism_is_one_kafka_names() {
        assert_eq!(mechanism_named("SCRAM-SHA-512"), Ok(ScramMechanism::Sha512));
        assert!(mechanism_named("SCRAM-SHA-1").unwrap_err().contains("SCRAM-SHA-256 or SCRAM-SHA-512"));
    }
}
