//! The pages: each handler asks the cluster as the session's user, shapes what it got into
//! lines of text (`*Line`), and renders a template (`templates/`). Every page is a plain
//! HTML page that works without scripts; htmx only swaps parts in place (the topic filter,
//! the live tail).

use std::sync::Arc;

use askama::Template;
use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;

use crate::display::{self, parse_time, Shown};
use crate::group_changes::PlannedOffset;
use crate::groups::{group_detail, group_rows, GroupRow, MemberRow};
use crate::history::Window;
use crate::messages::{browse, Decoding, MessageRow, Start, MESSAGES_MAX};
use crate::over_time::{self, WindowQuery};
use crate::session::{cleared_cookie, cookie, Session};
use crate::topics::{configs, topic_rows, TopicRow};
use crate::Console;

/// Topics listed on one page of the topics list.
pub const TOPICS_PER_PAGE: usize = 100;
/// Messages shown when the form does not say.
const MESSAGES_DEFAULT: usize = 50;

/// What every page's frame shows: who is logged in.
pub struct Chrome {
    pub user: Option<String>,
}

impl Chrome {
    pub fn of(session: &Session) -> Chrome {
        Chrome { user: session.user.clone() }
    }

    /// The frame of a page shown before login (or without a session).
    fn nobody() -> Chrome {
        Chrome { user: None }
    }
}

pub fn render(page: impl Template) -> Response {
    match page.render() {
        Ok(html) => Html(html).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("rendering failed: {error}")).into_response(),
    }
}

/// The session of a request, or the answer that sends the browser to log in.
pub async fn session_of(console: &Console, headers: &HeaderMap) -> Result<Arc<Session>, Response> {
    match console.sessions.find(headers).await {
        Ok(Some(session)) => Ok(session),
        Ok(None) => Err(Redirect::to("/login").into_response()),
        Err(error) => Err(failure(&format!("cannot reach the cluster: {error:#}"))),
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    chrome: Chrome,
    message: String,
}

pub fn failure(message: &str) -> Response {
    let page = ErrorPage { chrome: Chrome::nobody(), message: message.to_string() };
    (StatusCode::BAD_GATEWAY, render(page)).into_response()
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    chrome: Chrome,
    error: Option<String>,
}

pub async fn login_form() -> Response {
    render(LoginPage { chrome: Chrome::nobody(), error: None })
}

#[derive(Deserialize)]
pub struct Credentials {
    user: String,
    password: String,
}

pub async fn login(State(console): State<Arc<Console>>, Form(credentials): Form<Credentials>) -> Response {
    match console.sessions.login(&credentials.user, &credentials.password).await {
        Ok(token) => {
            let mut response = Redirect::to("/").into_response();
            let value = HeaderValue::from_str(&cookie(&token, console.https)).expect("a token is ASCII");
            response.headers_mut().insert(header::SET_COOKIE, value);
            response
        }
        Err(error) => {
            tracing::info!(user = %credentials.user, error = %format!("{error:#}"), "console login refused");
            let error = Some("Login failed: wrong user name or password.".to_string());
            let page = LoginPage { chrome: Chrome::nobody(), error };
            (StatusCode::UNAUTHORIZED, render(page)).into_response()
        }
    }
}

pub async fn logout(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    console.sessions.logout(&headers);
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&cleared_cookie()).expect("ASCII"));
    response
}

pub struct NodeLine {
    pub id: i32,
    pub address: String,
    pub rack: String,
    pub controller: bool,
    pub leads: usize,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    chrome: Chrome,
    cluster_id: String,
    nodes: Vec<NodeLine>,
    topics: usize,
    partitions: usize,
    under_replicated: usize,
    offline: usize,
    messages: String,
    size: String,
    /// Messages per second into the topics the user sees, over time (`over_time`).
    rate_chart: String,
    /// This node's bytes per second and request latency, for a user who may describe the
    /// cluster; empty otherwise.
    node_charts: String,
}

pub async fn overview(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Query(query): Query<WindowQuery>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let metadata = match session.cluster.metadata(None).await {
        Ok(metadata) => metadata,
        Err(error) => return failure(&format!("{error:#}")),
    };
    let rows = match topic_rows(&session.cluster, &metadata).await {
        Ok(rows) => rows,
        Err(error) => return failure(&format!("{error:#}")),
    };
    let leads = |id: i32| rows.iter().flat_map(|t| &t.partitions).filter(|p| p.leader == id).count();
    let nodes = metadata
        .brokers
        .iter()
        .map(|(id, (address, rack))| NodeLine {
            id: *id,
            address: address.clone(),
            rack: rack.clone().unwrap_or_default(),
            controller: *id == metadata.controller,
            leads: leads(*id),
        })
        .collect();
    let rate_chart = over_time::cluster_rate(&console.history, &over_time::visible_topics(&metadata), query.window());
    let node_charts = match session.cluster.may_describe_cluster().await {
        true => {
            over_time::node_traffic(&console.history, query.window())
                + &over_time::node_latency(&console.history, query.window())
        }
        false => String::new(),
    };
    render(OverviewPage {
        chrome: Chrome::of(&session),
        rate_chart,
        node_charts,
        cluster_id: metadata.cluster_id.clone(),
        nodes,
        topics: rows.len(),
        partitions: rows.iter().map(|t| t.partitions.len()).sum(),
        under_replicated: rows.iter().map(TopicRow::under_replicated).sum(),
        offline: rows.iter().map(TopicRow::offline).sum(),
        messages: rows.iter().map(TopicRow::messages).sum::<i64>().to_string(),
        size: display::size(rows.iter().map(TopicRow::size).sum()),
    })
}

pub struct TopicLine {
    pub name: String,
    pub internal: bool,
    pub partitions: usize,
    pub replication: usize,
    pub messages: i64,
    pub size: String,
    pub under_replicated: usize,
}

#[derive(Template)]
#[template(path = "topics.html")]
struct TopicsPage {
    chrome: Chrome,
    query: String,
    sort: String,
    lines: Vec<TopicLine>,
    matching: usize,
    page: usize,
    pages: usize,
}

#[derive(Deserialize, Default)]
pub struct TopicsQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    sort: String,
    #[serde(default)]
    page: usize,
}

pub async fn topics(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Query(query): Query<TopicsQuery>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let rows = match async {
        let metadata = session.cluster.metadata(None).await?;
        topic_rows(&session.cluster, &metadata).await
    }
    .await
    {
        Ok(rows) => rows,
        Err(error) => return failure(&format!("{error:#}")),
    };
    let needle = query.q.trim().to_lowercase();
    let mut matching: Vec<&TopicRow> = rows.iter().filter(|t| t.name.to_lowercase().contains(&needle)).collect();
    match query.sort.as_str() {
        "partitions" => matching.sort_by_key(|t| std::cmp::Reverse(t.partitions.len())),
        "messages" => matching.sort_by_key(|t| std::cmp::Reverse(t.messages())),
        "size" => matching.sort_by_key(|t| std::cmp::Reverse(t.size())),
        _ => {}
    }
    let pages = matching.len().div_ceil(TOPICS_PER_PAGE).max(1);
    let page = query.page.min(pages - 1);
    let lines = matching
        .iter()
        .skip(page * TOPICS_PER_PAGE)
        .take(TOPICS_PER_PAGE)
        .map(|t| TopicLine {
            name: t.name.clone(),
            internal: t.internal,
            partitions: t.partitions.len(),
            replication: t.replication(),
            messages: t.messages(),
            size: display::size(t.size()),
            under_replicated: t.under_replicated(),
        })
        .collect();
    render(TopicsPage {
        chrome: Chrome::of(&session),
        query: query.q.clone(),
        sort: query.sort.clone(),
        lines,
        matching: matching.len(),
        page,
        pages,
    })
}

pub struct PartitionLine {
    pub id: i32,
    pub leader: i32,
    pub replicas: String,
    pub isr: String,
    pub start: i64,
    pub end: i64,
    pub size: String,
    pub under_replicated: bool,
}

pub struct ConfigLine {
    pub name: String,
    pub value: String,
    pub source: &'static str,
}

#[derive(Template)]
#[template(path = "topic.html")]
struct TopicPage {
    chrome: Chrome,
    name: String,
    partitions: Vec<PartitionLine>,
    configs: Vec<ConfigLine>,
    configs_error: Option<String>,
    done: Option<String>,
    refused: Option<String>,
    /// Messages per second over time (`over_time`).
    rate_chart: String,
}

fn ids(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")
}

/// The row of `topic` as the user sees it, or the page that says why there is none.
pub async fn topic_row(
    session: &Session,
    topic: &str,
) -> Result<(crate::cluster::ClusterMetadata, TopicRow), Response> {
    let metadata = session.cluster.metadata(Some(&[topic.to_string()])).await;
    let metadata = metadata.map_err(|error| failure(&format!("{error:#}")))?;
    let found = metadata.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == topic));
    match found.map(|t| t.error_code) {
        Some(0) => {}
        Some(code) => return Err(failure(&format!("topic {topic}: {}", crate::topics::error_name(code)))),
        None => return Err(failure(&format!("topic {topic}: not found"))),
    }
    let rows = topic_rows(&session.cluster, &metadata).await.map_err(|error| failure(&format!("{error:#}")))?;
    let row = rows.into_iter().find(|t| t.name == topic);
    let row = row.ok_or_else(|| failure(&format!("topic {topic}: not found")))?;
    Ok((metadata, row))
}

pub async fn topic(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(query): Query<WindowQuery>,
) -> Response {
    match session_of(&console, &headers).await {
        Ok(session) => topic_page(&console, &session, name, Outcome::None, query.window()).await,
        Err(response) => response,
    }
}

/// What a form that changed something did, shown atop the page it returns to.
pub enum Outcome {
    None,
    Done(String),
    Refused(String),
}

impl Outcome {
    /// (what was done, what was refused), for a page's two message lines.
    fn split(self) -> (Option<String>, Option<String>) {
        match self {
            Outcome::None => (None, None),
            Outcome::Done(text) => (Some(text), None),
            Outcome::Refused(text) => (None, Some(text)),
        }
    }
}

/// The topic page, with the outcome of the change that led to it.
pub async fn topic_page(
    console: &Console,
    session: &Session,
    name: String,
    outcome: Outcome,
    window: Window,
) -> Response {
    let (_, row) = match topic_row(session, &name).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let (configs, configs_error) = match configs(&session.cluster, &name).await {
        Ok(rows) => (rows, None),
        Err(error) => (Vec::new(), Some(format!("{error:#}"))),
    };
    let partitions = row
        .partitions
        .iter()
        .map(|p| PartitionLine {
            id: p.id,
            leader: p.leader,
            replicas: ids(&p.replicas),
            isr: ids(&p.isr),
            start: p.start,
            end: p.end,
            size: p.size.map(display::size).unwrap_or_default(),
            under_replicated: p.under_replicated(),
        })
        .collect();
    let configs = configs
        .into_iter()
        .map(|c| ConfigLine {
            name: c.name,
            value: if c.sensitive { "(sensitive)".to_string() } else { c.value },
            source: c.source,
        })
        .collect();
    let (done, refused) = outcome.split();
    let status = if refused.is_some() { StatusCode::UNPROCESSABLE_ENTITY } else { StatusCode::OK };
    let rate_chart = over_time::topic_rate(&console.history, &name, window);
    let page =
        TopicPage { chrome: Chrome::of(session), name, partitions, configs, configs_error, done, refused, rate_chart };
    (status, render(page)).into_response()
}

pub struct MessageLine {
    pub partition: i32,
    pub offset: i64,
    pub time: String,
    pub key: Shown,
    pub value: Shown,
    pub headers: Vec<(String, Shown)>,
}

impl From<MessageRow> for MessageLine {
    fn from(row: MessageRow) -> MessageLine {
        MessageLine {
            partition: row.partition,
            offset: row.offset,
            time: display::timestamp(row.timestamp),
            key: row.key,
            value: row.value,
            headers: row.headers,
        }
    }
}

#[derive(Template)]
#[template(path = "messages.html")]
struct MessagesPage {
    chrome: Chrome,
    name: String,
    partitions: Vec<i32>,
    form: MessagesQuery,
    rows: Vec<MessageLine>,
    error: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
pub struct MessagesQuery {
    /// One partition, or empty for all.
    #[serde(default)]
    partition: String,
    /// `end` (the default), `offset` or `time`.
    #[serde(default)]
    from: String,
    #[serde(default)]
    offset: String,
    #[serde(default)]
    time: String,
    #[serde(default)]
    max: Option<usize>,
    /// Keeps only messages whose key, value or a header contains this text.
    #[serde(default)]
    filter: String,
    /// `on`: the page reloads its messages every few seconds (a live tail).
    #[serde(default)]
    live: String,
    /// `raw`: keys and values framed with a schema id shown as their bytes (hex), not
    /// decoded.
    #[serde(default)]
    decode: String,
}

impl MessagesQuery {
    fn start(&self) -> Result<Start, String> {
        match self.from.as_str() {
            "" | "end" => Ok(Start::End),
            "offset" => self.offset.trim().parse().map(Start::Offset).map_err(|_| "the offset must be a number".into()),
            "time" => parse_time(&self.time).map(Start::Timestamp).ok_or_else(|| display::TIME_FORMS.to_string()),
            other => Err(format!("unknown start {other:?}")),
        }
    }

    fn max(&self) -> usize {
        self.max.unwrap_or(MESSAGES_DEFAULT).clamp(1, MESSAGES_MAX)
    }
}

pub async fn messages(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(form): Query<MessagesQuery>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let (metadata, row) = match topic_row(&session, &name).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let chosen: Vec<_> = match form.partition.trim().parse::<i32>() {
        Ok(id) => row.partitions.iter().filter(|p| p.id == id).cloned().collect(),
        Err(_) => row.partitions.clone(),
    };
    let decoding = Decoding { decoder: console.schema_decoder.clone(), raw: form.decode == "raw" };
    let read = match form.start() {
        Ok(start) => browse(&session.cluster, &metadata, &name, &chosen, start, form.max(), &decoding)
            .await
            .map_err(|e| format!("{e:#}")),
        Err(why) => Err(why),
    };
    let (rows, error) = match read {
        Ok(rows) => (rows, None),
        Err(why) => (Vec::new(), Some(why)),
    };
    let filter = form.filter.trim();
    let keep = |row: &MessageRow| {
        filter.is_empty()
            || row.key.contains(filter)
            || row.value.contains(filter)
            || row.headers.iter().any(|(k, v)| k.contains(filter) || v.contains(filter))
    };
    let rows = rows.into_iter().filter(keep).map(MessageLine::from).collect();
    render(MessagesPage {
        chrome: Chrome::of(&session),
        name,
        partitions: row.partitions.iter().map(|p| p.id).collect(),
        form,
        rows,
        error,
    })
}

#[derive(Template)]
#[template(path = "groups.html")]
struct GroupsPage {
    chrome: Chrome,
    groups: Vec<GroupRow>,
}

pub async fn groups(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let found = async {
        let metadata = session.cluster.metadata(Some(&[])).await?;
        group_rows(&session.cluster, &metadata).await
    };
    match found.await {
        Ok(groups) => render(GroupsPage { chrome: Chrome::of(&session), groups }),
        Err(error) => failure(&format!("{error:#}")),
    }
}

pub struct PositionLine {
    pub topic: String,
    pub partition: i32,
    pub committed: String,
    pub end: String,
    pub lag: String,
}

#[derive(Template)]
#[template(path = "group.html")]
struct GroupPage {
    chrome: Chrome,
    group: GroupRow,
    coordinator: i32,
    members: Vec<MemberRow>,
    positions: Vec<PositionLine>,
    lag: i64,
    /// The topics the group has positions in (the forms' choices).
    topics: Vec<String>,
    done: Option<String>,
    refused: Option<String>,
    /// A reset shown before it is applied, with the form that applies it.
    plan: Option<ResetPlan>,
    /// Lag over time (`over_time`).
    lag_chart: String,
}

/// A reset's plan as the group page shows it: each partition's move, and the form's fields
/// to send again to apply it.
pub struct ResetPlan {
    pub lines: Vec<PlannedOffset>,
    pub topic: String,
    pub to: String,
    pub value: String,
}

pub async fn group(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(query): Query<WindowQuery>,
) -> Response {
    match session_of(&console, &headers).await {
        Ok(session) => group_page(&console, &session, id, Outcome::None, None, query.window()).await,
        Err(response) => response,
    }
}

/// The group page, with the outcome of the change that led to it and a reset's plan.
pub async fn group_page(
    console: &Console,
    session: &Session,
    id: String,
    outcome: Outcome,
    plan: Option<ResetPlan>,
    window: Window,
) -> Response {
    let detail = match group_detail(&session.cluster, &id).await {
        Ok(detail) => detail,
        Err(error) => return failure(&format!("{error:#}")),
    };
    let shown = |value: Option<i64>| value.map_or_else(|| "-".to_string(), |v| v.to_string());
    let positions = detail
        .offsets
        .iter()
        .map(|row| PositionLine {
            topic: row.topic.clone(),
            partition: row.partition,
            committed: shown(row.committed),
            end: shown(row.end),
            lag: shown(row.lag()),
        })
        .collect();
    let mut topics: Vec<String> = detail.offsets.iter().map(|row| row.topic.clone()).collect();
    topics.dedup();
    let (done, refused) = outcome.split();
    let status = if refused.is_some() { StatusCode::UNPROCESSABLE_ENTITY } else { StatusCode::OK };
    let page = GroupPage {
        lag_chart: over_time::group_lag(&console.history, &id, window),
        chrome: Chrome::of(session),
        lag: detail.lag(),
        group: detail.row,
        coordinator: detail.coordinator,
        members: detail.members,
        positions,
        topics,
        done,
        refused,
        plan,
    };
    (status, render(page)).into_response()
}
