//! The REST API: Confluent's Schema Registry paths, bodies, content types and error
//! bodies (`{"error_code": 40401, "message": ...}`), as its clients call them.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, MatchedPath, Path, Query, State as Shared};
pub use axum::http::HeaderMap;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{RequestExt, Router};
use serde_json::{json, Value};
use sluice_http::ClientAddress;
use tokio_rustls::TlsConnector;

use crate::authorization::{required, Access, Caller, Target};
use crate::compatibility::Level;
use crate::error::RegistryError;
use crate::forward::Forwarder;
use crate::limits::{REQUEST_BYTES_MAX, REQUEST_TIMEOUT};
use crate::registry::{find_version, referenced_by, Registry, SchemaRequest, VersionAnswer, VersionSpec};
use crate::schema::{Parsed, SchemaType, SUPPORTED_TYPES};
use crate::setting::Setting;
use crate::state::Mode;

/// The media type of every answer.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// Request media types accepted (a missing one too, as Confluent's registry does).
const ACCEPTED_TYPES: [&str; 4] = [
    "application/vnd.schemaregistry.v1+json",
    "application/vnd.schemaregistry+json",
    "application/json",
    "application/octet-stream",
];

/// Who may call the API, and what each caller may do.
pub trait Gate: Send + Sync + 'static {
    /// Checks the request's credentials (its `Authorization` header) for a call from
    /// `host`: the caller, or why it is refused (401).
    fn authenticate(&self, headers: HeaderMap, host: IpAddr) -> crate::LogFuture<'_, Caller>;
    /// Whether `caller` may have `access` to `target`.
    fn allows(&self, caller: &Caller, access: Access, target: &Target) -> bool;
}

/// What the caller of one request may do: everything when the registry has no gate.
#[derive(Clone)]
struct Permissions(Option<(Arc<dyn Gate>, Caller)>);

impl Permissions {
    fn allow(&self, access: Access, target: &Target) -> bool {
        self.0.as_ref().is_none_or(|(gate, caller)| gate.allows(caller, access, target))
    }

    fn check(&self, access: Access, target: &Target) -> Result<(), RegistryError> {
        match (self.allow(access, target), &self.0) {
            (false, Some((_, caller))) => Err(RegistryError::Forbidden(format!(
                "User is denied operation {} on {target}: {} from {}",
                access.name(),
                caller.principal,
                caller.host
            ))),
            _ => Ok(()),
        }
    }

    fn may_read(&self, subject: &str) -> bool {
        self.allow(Access::Read, &Target::Subject(subject.to_string()))
    }

    /// Refuses a call about schema `id` unless the caller may read a subject that uses it.
    fn check_schema(&self, state: &crate::state::State, id: i32) -> Result<(), RegistryError> {
        match state.uses_of(id).any(|(subject, _)| self.may_read(subject)) {
            true => Ok(()),
            false => Err(RegistryError::Forbidden(format!("no subject of schema {id} may be read by this user"))),
        }
    }
}

#[derive(Clone)]
struct Api {
    registry: Arc<Registry>,
    gate: Option<Arc<dyn Gate>>,
}

type Answer = Result<Response, RegistryError>;
type Params = Query<HashMap<String, String>>;

impl IntoResponse for RegistryError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = json!({"error_code": self.code(), "message": self.to_string()});
        let mut response = (status, body.to_string()).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        response
    }
}

fn ok(body: impl serde::Serialize) -> Answer {
    let mut response = serde_json::to_string(&body).expect("answers serialize").into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    Ok(response)
}

fn flag(params: &Params, name: &str) -> bool {
    params.get(name).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The router of the whole API over `registry`; `gate` checks every call; `peers_tls`
/// reaches other nodes' registries when they serve HTTPS.
pub fn router(registry: Arc<Registry>, gate: Option<Arc<dyn Gate>>, peers_tls: Option<TlsConnector>) -> Router {
    let forwarder = Forwarder { registry: registry.clone(), peers_tls };
    Router::new()
        .route("/", get(|| async { ok(json!({})) }))
        .route("/schemas/types", get(|| async { ok(SUPPORTED_TYPES.map(|t| t.name())) }))
        .route("/schemas/ids/{id}", get(schema_by_id))
        .route("/schemas/ids/{id}/schema", get(raw_schema_by_id))
        .route("/schemas/ids/{id}/subjects", get(subjects_of_id))
        .route("/schemas/ids/{id}/versions", get(versions_of_id))
        .route("/subjects", get(subjects))
        .route("/subjects/{subject}", post(lookup).delete(delete_subject))
        .route("/subjects/{subject}/versions", get(versions).post(register))
        .route("/subjects/{subject}/versions/{version}", get(version).delete(delete_version))
        .route("/subjects/{subject}/versions/{version}/schema", get(raw_version))
        .route("/subjects/{subject}/versions/{version}/referencedby", get(version_referenced_by))
        .route("/config", get(show_global::<Level>).put(set_global::<Level>))
        .route(
            "/config/{subject}",
            get(show_subject::<Level>).put(set_subject::<Level>).delete(remove_subject::<Level>),
        )
        .route("/mode", get(show_global::<Mode>).put(set_global::<Mode>))
        .route("/mode/{subject}", get(show_subject::<Mode>).put(set_subject::<Mode>).delete(remove_subject::<Mode>))
        .route("/compatibility/subjects/{subject}/versions", post(compatible_with_all))
        .route("/compatibility/subjects/{subject}/versions/{version}", post(compatible_with_version))
        .fallback(|| async { RegistryError::NotFound("HTTP 404 Not Found".to_string()) })
        .layer(axum::extract::DefaultBodyLimit::max(REQUEST_BYTES_MAX))
        .layer(axum::middleware::from_fn_with_state(forwarder, route))
        .layer(axum::middleware::from_fn_with_state(Api { registry: registry.clone(), gate: gate.clone() }, guard))
        .with_state(Api { registry, gate })
}

/// Authenticates every request and checks what its route needs (see `authorization`)
/// before it runs here or is forwarded.
async fn guard(
    Shared(api): Shared<Api>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let permissions = match &api.gate {
        None => Permissions(None),
        Some(gate) => {
            let host = request.extensions().get::<ClientAddress>().map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.0);
            match gate.authenticate(request.headers().clone(), host).await {
                Ok(caller) => Permissions(Some((gate.clone(), caller))),
                Err(refused) => {
                    let mut response = refused.into_response();
                    let challenge = HeaderValue::from_static("Basic realm=\"sluice\"");
                    response.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
                    return response;
                }
            }
        }
    };
    let route = request.extensions().get::<MatchedPath>().map(|path| path.as_str().to_string());
    let params = request.extract_parts::<Path<HashMap<String, String>>>().await.ok();
    let subject = params.as_ref().and_then(|Path(params)| params.get("subject")).map(String::as_str);
    if let Some((access, target)) = route.and_then(|route| required(request.method(), &route, subject)) {
        if let Err(refused) = permissions.check(access, &target) {
            return refused.into_response();
        }
    }
    request.extensions_mut().insert(permissions);
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => RegistryError::Timeout.into_response(),
    }
}

/// Runs a request here or at the leader of `_schemas` (see `forward`).
async fn route(
    Shared(forwarder): Shared<Forwarder>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    crate::forward::route(&forwarder, request, next).await
}

/// The JSON body of a write, checked for media type and size.
fn body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, RegistryError> {
    if let Some(kind) = headers.get(header::CONTENT_TYPE) {
        let kind = kind.to_str().unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if !ACCEPTED_TYPES.contains(&kind.as_str()) {
            return Err(RegistryError::UnsupportedMediaType(format!("HTTP 415 Unsupported Media Type: {kind}")));
        }
    }
    let bytes = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => {
            RegistryError::PayloadTooLarge(format!("request body larger than {REQUEST_BYTES_MAX} bytes"))
        }
        _ => RegistryError::BadRequest(rejection.body_text()),
    })?;
    serde_json::from_slice(&bytes).map_err(|error| RegistryError::UnprocessableBody(error.to_string()))
}

fn parse_id(id: &str) -> Result<i32, RegistryError> {
    id.parse().map_err(|_| RegistryError::SchemaNotFound(String::new()))
}

/// The schema text to answer with: as registered, or in `?format=serialized` the form
/// that names (a Protobuf schema as a base64 descriptor).
fn formatted(params: &Params, schema_type: SchemaType, text: &str) -> String {
    let serialized = params.get("format").is_some_and(|f| f == "serialized");
    let converted = match serialized {
        true => Parsed::parse(schema_type, text, &[]).ok().and_then(|parsed| parsed.serialized()),
        false => None,
    };
    converted.unwrap_or_else(|| text.to_string())
}

fn schema_answer(value: &crate::records::SchemaValue, params: &Params) -> Value {
    let mut answer = json!({"schema": formatted(params, value.schema_type, &value.schema)});
    if !value.schema_type.is_avro() {
        answer["schemaType"] = json!(value.schema_type.name());
    }
    if !value.references.is_empty() {
        answer["references"] = json!(value.references);
    }
    answer
}

/// Schema `id` as stored, once the caller may read it.
fn readable_schema(
    api: &Api,
    permissions: &Permissions,
    id: &str,
) -> Result<crate::records::SchemaValue, RegistryError> {
    let id = parse_id(id)?;
    api.registry.read(|state| {
        let value = state.by_id(id).ok_or_else(|| RegistryError::SchemaNotFound(String::new()))?;
        permissions.check_schema(state, id)?;
        Ok(value.clone())
    })
}

async fn schema_by_id(
    Shared(api): Shared<Api>,
    Extension(permissions): Extension<Permissions>,
    Path(id): Path<String>,
    params: Params,
) -> Answer {
    ok(schema_answer(&readable_schema(&api, &permissions, &id)?, &params))
}

async fn raw_schema_by_id(
    Shared(api): Shared<Api>,
    Extension(permissions): Extension<Permissions>,
    Path(id): Path<String>,
) -> Answer {
    raw(readable_schema(&api, &permissions, &id)?.schema)
}

/// A schema's own text as the body (what `/schema` paths answer).
fn raw(text: String) -> Answer {
    let mut response = text.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    Ok(response)
}

/// The (subject, version) pairs that use schema `id` and the caller may read (soft-deleted
/// ones with `deleted`).
fn uses_of_id(
    api: &Api,
    permissions: &Permissions,
    id: &str,
    deleted: bool,
) -> Result<Vec<(String, i32)>, RegistryError> {
    let id = parse_id(id)?;
    api.registry.read(|state| {
        if state.by_id(id).is_none() {
            return Err(RegistryError::SchemaNotFound(String::new()));
        }
        permissions.check_schema(state, id)?;
        Ok(state
            .uses_of(id)
            .filter(|(s, v)| deleted || state.version(s, *v).is_some_and(|v| !v.deleted))
            .filter(|(s, _)| permissions.may_read(s))
            .cloned()
            .collect())
    })
}

async fn subjects_of_id(
    Shared(api): Shared<Api>,
    Extension(permissions): Extension<Permissions>,
    Path(id): Path<String>,
    params: Params,
) -> Answer {
    let mut subjects: Vec<String> =
        uses_of_id(&api, &permissions, &id, flag(&params, "deleted"))?.into_iter().map(|(s, _)| s).collect();
    subjects.dedup();
    ok(subjects)
}

async fn versions_of_id(
    Shared(api): Shared<Api>,
    Extension(permissions): Extension<Permissions>,
    Path(id): Path<String>,
    params: Params,
) -> Answer {
    let pairs = uses_of_id(&api, &permissions, &id, flag(&params, "deleted"))?;
    ok(pairs.into_iter().map(|(subject, version)| json!({"subject": subject, "version": version})).collect::<Vec<_>>())
}

async fn subjects(Shared(api): Shared<Api>, Extension(permissions): Extension<Permissions>, params: Params) -> Answer {
    let deleted = flag(&params, "deleted");
    let prefix = params.get("subjectPrefix").cloned().unwrap_or_default();
    let subjects = api.registry.read(|state| {
        Ok(state
            .subjects(deleted)
            .into_iter()
            .filter(|s| s.starts_with(&prefix) && permissions.may_read(s))
            .map(str::to_string)
            .collect::<Vec<_>>())
    })?;
    ok(subjects)
}

async fn versions(Shared(api): Shared<Api>, Path(subject): Path<String>, params: Params) -> Answer {
    let deleted = flag(&params, "deleted");
    let versions = api.registry.read(|state| {
        let versions: Vec<i32> = state.versions(&subject, deleted).iter().map(|v| v.version).collect();
        if versions.is_empty() {
            return Err(RegistryError::SubjectNotFound(subject.clone()));
        }
        Ok(versions)
    })?;
    ok(versions)
}

async fn register(
    Shared(api): Shared<Api>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    payload: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: SchemaRequest = body(&headers, payload)?;
    let id = api.registry.register(&subject, request).await?;
    ok(json!({"id": id}))
}

/// The version `version` of `subject` names (soft-deleted ones with `deleted`).
fn resolve(api: &Api, subject: &str, version: &str, deleted: bool) -> Result<VersionAnswer, RegistryError> {
    let spec = VersionSpec::parse(version)?;
    api.registry.read(|state| {
        if !state.knows_subject(subject) || (!deleted && state.versions(subject, false).is_empty()) {
            return Err(RegistryError::SubjectNotFound(subject.to_string()));
        }
        find_version(state, subject, spec, deleted).map(VersionAnswer::from)
    })
}

async fn version(Shared(api): Shared<Api>, Path((subject, version)): Path<(String, String)>, params: Params) -> Answer {
    let mut answer = resolve(&api, &subject, &version, flag(&params, "deleted"))?;
    answer.schema = formatted(&params, answer.schema_type, &answer.schema);
    ok(answer)
}

async fn raw_version(
    Shared(api): Shared<Api>,
    Path((subject, version)): Path<(String, String)>,
    params: Params,
) -> Answer {
    raw(resolve(&api, &subject, &version, flag(&params, "deleted"))?.schema)
}

async fn version_referenced_by(Shared(api): Shared<Api>, Path((subject, version)): Path<(String, String)>) -> Answer {
    let found = resolve(&api, &subject, &version, true)?;
    ok(api.registry.read(|state| Ok(referenced_by(state, &subject, found.version)))?)
}

async fn delete_version(
    Shared(api): Shared<Api>,
    Path((subject, version)): Path<(String, String)>,
    params: Params,
) -> Answer {
    let spec = VersionSpec::parse(&version)?;
    ok(api.registry.delete_version(&subject, spec, flag(&params, "permanent")).await?)
}

async fn lookup(
    Shared(api): Shared<Api>,
    Path(subject): Path<String>,
    params: Params,
    headers: HeaderMap,
    payload: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: SchemaRequest = body(&headers, payload)?;
    ok(api.registry.lookup(&subject, &request, flag(&params, "deleted"))?)
}

async fn delete_subject(Shared(api): Shared<Api>, Path(subject): Path<String>, params: Params) -> Answer {
    ok(api.registry.delete_subject(&subject, flag(&params, "permanent")).await?)
}

/// `{field: value}`.
fn field(name: &str, value: &str) -> Value {
    Value::Object(serde_json::Map::from_iter([(name.to_string(), Value::from(value))]))
}

/// The value of a setting a PUT body carries in its `S::UPDATE_FIELD`.
fn update<S: Setting>(headers: &HeaderMap, payload: Result<Bytes, BytesRejection>) -> Result<S, RegistryError> {
    let body: HashMap<String, Value> = body(headers, payload)?;
    let name = body
        .get(S::UPDATE_FIELD)
        .and_then(Value::as_str)
        .ok_or_else(|| RegistryError::UnprocessableBody(format!("expected {{\"{}\": ...}}", S::UPDATE_FIELD)))?;
    S::parse(name).ok_or_else(S::invalid)
}

async fn show_global<S: Setting>(Shared(api): Shared<Api>) -> Answer {
    let value = api.registry.read(|state| Ok(S::stored(state, None).unwrap_or_default()))?;
    ok(field(S::SHOW_FIELD, value.name()))
}

async fn set_global<S: Setting>(
    Shared(api): Shared<Api>,
    headers: HeaderMap,
    payload: Result<Bytes, BytesRejection>,
) -> Answer {
    let value: S = update(&headers, payload)?;
    api.registry.set(None, value).await?;
    ok(field(S::UPDATE_FIELD, value.name()))
}

async fn show_subject<S: Setting>(Shared(api): Shared<Api>, Path(subject): Path<String>, params: Params) -> Answer {
    let default_to_global = flag(&params, "defaultToGlobal");
    let value = api.registry.read(|state| match S::stored(state, Some(&subject)) {
        Some(value) => Ok(value),
        None if default_to_global => Ok(S::stored(state, None).unwrap_or_default()),
        None => Err(S::not_set(&subject)),
    })?;
    ok(field(S::SHOW_FIELD, value.name()))
}

async fn set_subject<S: Setting>(
    Shared(api): Shared<Api>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    payload: Result<Bytes, BytesRejection>,
) -> Answer {
    let value: S = update(&headers, payload)?;
    api.registry.set(Some(&subject), value).await?;
    ok(field(S::UPDATE_FIELD, value.name()))
}

async fn remove_subject<S: Setting>(Shared(api): Shared<Api>, Path(subject): Path<String>) -> Answer {
    let previous: S = api.registry.remove(&subject).await?;
    ok(field(S::SHOW_FIELD, previous.name()))
}

fn compatibility_answer(reasons: Vec<String>, verbose: bool) -> Answer {
    let mut answer = json!({"is_compatible": reasons.is_empty()});
    if verbose {
        answer["messages"] = json!(reasons);
    }
    ok(answer)
}

async fn compatible_with_all(
    Shared(api): Shared<Api>,
    Path(subject): Path<String>,
    params: Params,
    headers: HeaderMap,
    payload: Result<Bytes, BytesRejection>,
) -> Answer {
    let request: SchemaRequest = body(&headers, payload)?;
    let reasons = api.registry.test_compatibility(&subject, None, &request)?;
    compatibility_answer(reasons, flag(&params, "verbose"))
}

async fn compatible_with_version(
    Shared(api): Shared<Api>,
    Path((subject, version)): Path<(String, String)>,
    params: Params,
    headers: HeaderMap,
    payload: Result<Bytes, BytesRejection>,
) -> Answer {
    let spec = VersionSpec::parse(&version)?;
    let request: SchemaRequest = body(&headers, payload)?;
    let reasons = api.registry.test_compatibility(&subject, Some(spec), &request)?;
    compatibility_answer(reasons, flag(&params, "verbose"))
}
