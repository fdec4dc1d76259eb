//! The routes that redraw a chart in place (htmx polls them every sample interval).
//!
//! A chart shows what `history` kept, but only to a user the broker lets see the group or
//! topic: each route first asks the broker as that user (FindCoordinator for a group, which
//! needs DESCRIBE on it; Metadata for topics, which lists only what the user may describe;
//! DescribeCluster for this node's own load, shown to a user with DESCRIBE on the cluster).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};

use crate::groups::coordinator_of;
use crate::over_time::{cluster_rate, group_lag, node_latency, node_traffic, topic_rate, visible_topics, WindowQuery};
use crate::pages::session_of;
use crate::Console;

pub async fn group_lag_chart(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(query): Query<WindowQuery>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    match coordinator_of(&session.cluster, &id).await {
        Ok(_) => Html(group_lag(&console.history, &id, query.window())).into_response(),
        Err(error) => (StatusCode::FORBIDDEN, format!("{error:#}")).into_response(),
    }
}

pub async fn topic_rate_chart(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(topic): Path<String>,
    Query(query): Query<WindowQuery>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let visible = match session.cluster.metadata(Some(std::slice::from_ref(&topic))).await {
        Ok(metadata) => metadata.topics.iter().any(|t| t.error_code == 0),
        Err(_) => false,
    };
    match visible {
        true => Html(topic_rate(&console.history, &topic, query.window())).into_response(),
        false => (StatusCode::FORBIDDEN, format!("topic {topic} cannot be described")).into_response(),
    }
}

pub async fn cluster_rate_chart(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Query(query): Query<WindowQuery>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    match session.cluster.metadata(None).await {
        Ok(metadata) => {
            let topics = visible_topics(&metadata);
            Html(cluster_rate(&console.history, &topics, query.window())).into_response()
        }
        Err(error) => (StatusCode::BAD_GATEWAY, format!("{error:#}")).into_response(),
    }
}

pub async fn node_traffic_chart(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Query(query): Query<WindowQuery>,
) -> Response {
    node_chart(&console, &headers, || node_traffic(&console.history, query.window())).await
}

pub async fn node_latency_chart(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Query(query): Query<WindowQuery>,
) -> Response {
    node_chart(&console, &headers, || node_latency(&console.history, query.window())).await
}

async fn node_chart(console: &Arc<Console>, headers: &HeaderMap, chart: impl FnOnce() -> String) -> Response {
    let session = match session_of(console, headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    match session.cluster.may_describe_cluster().await {
        true => Html(chart()).into_response(),
        false => (StatusCode::FORBIDDEN, "this node's load needs DESCRIBE on the cluster").into_response(),
    }
}
