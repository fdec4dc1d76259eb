//! The forms that change the cluster (POST): create a topic, add partitions, delete a topic
//! (its name typed again), set or remove a config, produce a record. Each is one request as
//! the session's user (`admin`); the page that follows says what the broker answered, its
//! refusal included.
//!
//! Cross-site requests are refused (`same_origin`): the session cookie is `SameSite=Strict`,
//! and a console without logins has no cookie at all, so the browser's `Origin` is checked.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Form, Path, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use bytes::Bytes;
use serde::Deserialize;

use crate::admin::{self, NewRecord};
use crate::history::Window;
use crate::pages::{render, session_of, topic_page, Chrome, Outcome};
use crate::Console;

/// Partitions a topic may be created or grown to from the console.
pub const PARTITIONS_MAX: i32 = 10_000;
/// Headers one produced record may carry.
pub const HEADERS_MAX: usize = 64;

/// Refuses a request that changes something unless it comes from the console's own pages:
/// its `Origin` (sent by browsers with every POST) names the host it was sent to.
pub async fn same_origin(request: Request, next: Next) -> Response {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let headers = request.headers();
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
        let same = match origin {
            None => true,
            Some(origin) => origin.split_once("://").is_some_and(|(_, authority)| authority == host),
        };
        if !same {
            return (StatusCode::FORBIDDEN, "cross-site request refused").into_response();
        }
    }
    next.run(request).await
}

#[derive(Template)]
#[template(path = "create_topic.html")]
struct CreateTopicPage {
    chrome: Chrome,
    form: NewTopicForm,
    refused: Option<String>,
}

#[derive(Deserialize, Default)]
pub struct NewTopicForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    partitions: String,
    #[serde(default)]
    replication: String,
    /// `name=value` lines.
    #[serde(default)]
    configs: String,
}

/// A new topic's partitions, replication factor (-1: the default) and config overrides.
struct NewTopicSpec {
    partitions: i32,
    replication: i16,
    configs: Vec<(String, String)>,
}

impl NewTopicForm {
    fn parsed(&self) -> Result<NewTopicSpec, String> {
        let partitions = match self.partitions.trim() {
            "" => 1,
            text => text.parse::<i32>().map_err(|_| "partitions must be a number".to_string())?,
        };
        if !(1..=PARTITIONS_MAX).contains(&partitions) {
            return Err(format!("partitions must be between 1 and {PARTITIONS_MAX}"));
        }
        let replication = match self.replication.trim() {
            "" => -1,
            text => text.parse::<i16>().map_err(|_| "the replication factor must be a number".to_string())?,
        };
        let configs = self
            .configs
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .map(|line| match line.split_once('=') {
                Some((key, value)) => Ok((key.trim().to_string(), value.trim().to_string())),
                None => Err(format!("config line {line:?} is not name=value")),
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(NewTopicSpec { partitions, replication, configs })
    }
}

pub async fn create_topic_form(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    match session_of(&console, &headers).await {
        Ok(session) => {
            render(CreateTopicPage { chrome: Chrome::of(&session), form: NewTopicForm::default(), refused: None })
        }
        Err(response) => response,
    }
}

pub async fn create_topic(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<NewTopicForm>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let name = form.name.trim().to_string();
    let created = match form.parsed() {
        Ok(spec) => admin::create_topic(&session.cluster, &name, spec.partitions, spec.replication, spec.configs)
            .await
            .map_err(|error| format!("{error:#}")),
        Err(why) => Err(why),
    };
    match created {
        Ok(()) => Redirect::to(&format!("/topics/{name}")).into_response(),
        Err(why) => {
            let page = CreateTopicPage { chrome: Chrome::of(&session), form, refused: Some(why) };
            (StatusCode::UNPROCESSABLE_ENTITY, render(page)).into_response()
        }
    }
}

/// Runs `change` as the session's user and shows the topic page with what it did.
async fn on_topic<F, Fut>(console: &Console, headers: &HeaderMap, name: String, change: F) -> Response
where
    F: FnOnce(Arc<crate::session::Session>) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let session = match session_of(console, headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let outcome = match change(session.clone()).await {
        Ok(done) => Outcome::Done(done),
        Err(why) => Outcome::Refused(why),
    };
    topic_page(console, &session, name, outcome, Window::Recent).await
}

#[derive(Deserialize)]
pub struct PartitionsForm {
    count: String,
}

pub async fn add_partitions(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<PartitionsForm>,
) -> Response {
    let topic = name.clone();
    on_topic(&console, &headers, name, |session| async move {
        let count = form.count.trim().parse::<i32>().map_err(|_| "the partition count must be a number".to_string())?;
        if !(1..=PARTITIONS_MAX).contains(&count) {
            return Err(format!("the partition count must be between 1 and {PARTITIONS_MAX}"));
        }
        admin::add_partitions(&session.cluster, &topic, count).await.map_err(|e| format!("{e:#}"))?;
        Ok(format!("{topic} now has {count} partitions"))
    })
    .await
}

#[derive(Deserialize)]
pub struct ConfigForm {
    key: String,
    #[serde(default)]
    value: String,
    /// `set` or `remove`.
    action: String,
}

pub async fn alter_config(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<ConfigForm>,
) -> Response {
    let topic = name.clone();
    on_topic(&console, &headers, name, |session| async move {
        let key = form.key.trim();
        let value = match form.action.as_str() {
            "remove" => None,
            _ => Some(form.value.trim()),
        };
        admin::alter_config(&session.cluster, &topic, key, value).await.map_err(|e| format!("{e:#}"))?;
        Ok(match value {
            Some(value) => format!("{key} set to {value}"),
            None => format!("{key} back to its default"),
        })
    })
    .await
}

#[derive(Deserialize)]
pub struct DeleteForm {
    confirm: String,
}

pub async fn delete_topic(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<DeleteForm>,
) -> Response {
    if form.confirm.trim() != name {
        let topic = name.clone();
        return on_topic(&console, &headers, name, |_| async move {
            Err(format!("not deleted: type the topic's name ({topic}) to confirm"))
        })
        .await;
    }
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    match admin::delete_topic(&session.cluster, &name).await {
        Ok(()) => Redirect::to("/topics").into_response(),
        Err(error) => {
            topic_page(&console, &session, name, Outcome::Refused(format!("{error:#}")), Window::Recent).await
        }
    }
}

#[derive(Deserialize)]
pub struct ProduceForm {
    #[serde(default)]
    partition: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    /// `name: value` lines.
    #[serde(default)]
    headers: String,
}

impl ProduceForm {
    fn record(&self) -> Result<NewRecord, String> {
        let partition = match self.partition.trim() {
            "" => 0,
            text => text.parse().map_err(|_| "the partition must be a number".to_string())?,
        };
        let headers = self
            .headers
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| match line.split_once(':') {
                Some((name, value)) => Ok((name.trim().to_string(), Bytes::from(value.trim().to_string()))),
                None => Err(format!("header line {line:?} is not name: value")),
            })
            .collect::<Result<Vec<_>, String>>()?;
        if headers.len() > HEADERS_MAX {
            return Err(format!("at most {HEADERS_MAX} headers"));
        }
        let key = (!self.key.is_empty()).then(|| Bytes::from(self.key.clone()));
        Ok(NewRecord { partition, key, value: Some(Bytes::from(self.value.clone())), headers })
    }
}

pub async fn produce(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<ProduceForm>,
) -> Response {
    let topic = name.clone();
    on_topic(&console, &headers, name, |session| async move {
        let record = form.record()?;
        let partition = record.partition;
        let offset = admin::produce(&session.cluster, &topic, record).await.map_err(|e| format!("{e:#}"))?;
        Ok(format!("produced to partition {partition} at offset {offset}"))
    })
    .await
}
