//! The group page's forms (POST): move the group's positions (a plan first, applied when
//! confirmed), delete its positions in one topic, delete the group (its id typed again).
//! Each is the session user's own request (`group_changes`); the page that follows says
//! what the broker answered, its refusal included.

use std::sync::Arc;

use axum::extract::{Form, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use crate::group_changes::{self, parse_target};
use crate::groups::group_detail;
use crate::history::Window;
use crate::pages::{group_page, session_of, Outcome, ResetPlan};
use crate::Console;

/// A topic field's value meaning every topic the group has positions in.
const ALL_TOPICS: &str = "";

#[derive(Deserialize)]
pub struct ResetForm {
    #[serde(default)]
    topic: String,
    /// `earliest`, `latest`, `offset`, `time` or `shift`.
    to: String,
    #[serde(default)]
    value: String,
    /// Present when the plan shown is confirmed.
    #[serde(default)]
    apply: Option<String>,
}

pub async fn reset_offsets(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<ResetForm>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let refused = |why: String| Outcome::Refused(why);
    let target = match parse_target(&form.to, &form.value) {
        Ok(target) => target,
        Err(why) => return group_page(&console, &session, id, refused(why), None, Window::Recent).await,
    };
    let client = &session.cluster;
    let detail = match group_detail(client, &id).await {
        Ok(detail) => detail,
        Err(error) => {
            return group_page(&console, &session, id, refused(format!("{error:#}")), None, Window::Recent).await
        }
    };
    let topic = (form.topic.trim() != ALL_TOPICS).then(|| form.topic.trim());
    let plan = match group_changes::plan_reset(client, &detail, topic, target).await {
        Ok(plan) => plan,
        Err(error) => {
            return group_page(&console, &session, id, refused(format!("{error:#}")), None, Window::Recent).await
        }
    };
    if form.apply.is_none() {
        // The plan, and why it cannot be applied now when the group has members.
        let outcome = match group_changes::ensure_without_members(&detail) {
            Ok(()) => Outcome::None,
            Err(why) => refused(format!("{why:#}")),
        };
        let plan = ResetPlan { lines: plan, topic: form.topic, to: form.to, value: form.value };
        return group_page(&console, &session, id, outcome, Some(plan), Window::Recent).await;
    }
    let outcome = match group_changes::apply_reset(client, &detail, &plan).await {
        Ok(()) => Outcome::Done(format!("moved {} positions of group {id}", plan.len())),
        Err(error) => refused(format!("{error:#}")),
    };
    group_page(&console, &session, id, outcome, None, Window::Recent).await
}

#[derive(Deserialize)]
pub struct DeleteOffsetsForm {
    topic: String,
}

pub async fn delete_offsets(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<DeleteOffsetsForm>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let topic = form.topic.trim();
    let deleted = match group_detail(&session.cluster, &id).await {
        Ok(detail) => group_changes::delete_topic_offsets(&session.cluster, &detail, topic).await,
        Err(error) => Err(error),
    };
    let outcome = match deleted {
        Ok(()) => Outcome::Done(format!("deleted the positions of group {id} in {topic}")),
        Err(error) => Outcome::Refused(format!("{error:#}")),
    };
    group_page(&console, &session, id, outcome, None, Window::Recent).await
}

#[derive(Deserialize)]
pub struct DeleteGroupForm {
    confirm: String,
}

pub async fn delete_group(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<DeleteGroupForm>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    if form.confirm.trim() != id {
        let why = format!("not deleted: type the group's id ({id}) to confirm");
        return group_page(&console, &session, id, Outcome::Refused(why), None, Window::Recent).await;
    }
    match group_changes::delete_group(&session.cluster, &id).await {
        Ok(()) => Redirect::to("/groups").into_response(),
        Err(error) => {
            group_page(&console, &session, id, Outcome::Refused(format!("{error:#}")), None, Window::Recent).await
        }
    }
}
