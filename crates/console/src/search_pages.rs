//! The search form of the messages page (POST starts a search on the broker) and the page of
//! one search, which redraws its progress and matches every second while it runs.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use crate::display::{self, parse_time};
use crate::messages::Start;
use crate::pages::{failure, render, session_of, topic_row, Chrome, MessageLine};
use crate::search::{parse_json_path, Criteria, Field, Progress, SearchRequest, State as SearchState};
use crate::Console;

/// The longest text a search looks for.
const SEARCH_TEXT_BYTES_MAX: usize = 1024;

#[derive(Deserialize)]
pub struct SearchForm {
    #[serde(default)]
    partition: String,
    #[serde(default)]
    text: String,
    /// `any`, `key`, `value` or `headers`.
    #[serde(default)]
    field: String,
    /// `path=value` of a JSON value.
    #[serde(default)]
    json: String,
    #[serde(default)]
    from: String,
    #[serde(default)]
    until: String,
}

impl SearchForm {
    fn criteria(&self) -> Result<Criteria, String> {
        let field = match self.field.as_str() {
            "" | "any" => Field::Any,
            "key" => Field::Key,
            "value" => Field::Value,
            "headers" => Field::Headers,
            other => return Err(format!("unknown field {other:?}: any, key, value or headers")),
        };
        if self.text.len() > SEARCH_TEXT_BYTES_MAX {
            return Err(format!("the text to look for is at most {SEARCH_TEXT_BYTES_MAX} bytes"));
        }
        let time = |text: &str| match text.trim() {
            "" => Ok(None),
            text => parse_time(text).map(Some).ok_or_else(|| display::TIME_FORMS.to_string()),
        };
        let criteria = Criteria {
            text: self.text.trim().to_string(),
            field,
            json_path: parse_json_path(&self.json)?,
            from_ms: time(&self.from)?,
            until_ms: time(&self.until)?,
        };
        if criteria.text.is_empty() && criteria.json_path.is_none() {
            return Err("say what to look for: a text, or a JSON field's value".to_string());
        }
        Ok(criteria)
    }

    fn described(&self) -> String {
        let mut parts = Vec::new();
        if !self.text.trim().is_empty() {
            parts.push(format!(
                "\"{}\" in {}",
                self.text.trim(),
                if self.field.is_empty() { "any" } else { &self.field }
            ));
        }
        if !self.json.trim().is_empty() {
            parts.push(format!("JSON {}", self.json.trim()));
        }
        if !self.from.trim().is_empty() {
            parts.push(format!("from {}", self.from.trim()));
        }
        if !self.until.trim().is_empty() {
            parts.push(format!("until {}", self.until.trim()));
        }
        parts.push(match self.partition.trim() {
            "" => "every partition".to_string(),
            p => format!("partition {p}"),
        });
        parts.join(", ")
    }
}

pub async fn start_search(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<SearchForm>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let criteria = match form.criteria() {
        Ok(criteria) => criteria,
        Err(why) => return (StatusCode::UNPROCESSABLE_ENTITY, failure(&why)).into_response(),
    };
    let (metadata, row) = match topic_row(&session, &name).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let partitions: Vec<_> = match form.partition.trim().parse::<i32>() {
        Ok(id) => row.partitions.iter().filter(|p| p.id == id).cloned().collect(),
        Err(_) => row.partitions.clone(),
    };
    let start = criteria.from_ms.map_or(Start::Offset(0), Start::Timestamp);
    let described = form.described();
    let decoder = console.schema_decoder.clone();
    let asked = SearchRequest { topic: name.clone(), partitions, start, criteria, described, decoder };
    let id = console.searches.start(session.cluster.clone(), metadata, asked, session.user.clone());
    Redirect::to(&format!("/topics/{name}/search/{id}")).into_response()
}

#[derive(Template)]
#[template(path = "search.html")]
struct SearchPage {
    chrome: Chrome,
    name: String,
    id: String,
    described: String,
    running: bool,
    state: String,
    scanned: u64,
    total: u64,
    rows: Vec<MessageLine>,
}

pub async fn search_page(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let Some(search) = console.searches.find(&id, &session.user).filter(|s| s.topic == name) else {
        return (StatusCode::NOT_FOUND, failure("no such search: it ended a while ago, or is someone else's"))
            .into_response();
    };
    let Progress { state, scanned, total, matches } = search.progress();
    let (running, state) = match state {
        SearchState::Running => (true, "searching".to_string()),
        SearchState::Done => (false, "done: every record read".to_string()),
        SearchState::Capped(why) => (false, why),
        SearchState::Cancelled => (false, "cancelled".to_string()),
        SearchState::Failed(why) => (false, format!("failed: {why}")),
    };
    let rows = matches.into_iter().map(MessageLine::from).collect();
    let chrome = Chrome::of(&session);
    render(SearchPage { chrome, name, id, described: search.described.clone(), running, state, scanned, total, rows })
}

pub async fn cancel_search(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    if let Some(search) = console.searches.find(&id, &session.user) {
        search.cancel();
    }
    Redirect::to(&format!("/topics/{name}/search/{id}")).into_response()
}
