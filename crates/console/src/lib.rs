//! The web console served by the broker (`--console-listen`): the cluster's nodes, topics,
//! messages, groups, users, ACLs and quotas in a browser, from a phone or a laptop.
//!
//! Why a Kafka client inside the broker: the console asks the cluster with the protocol's
//! own requests, authenticated as the user who logged in (`session`), so each page shows
//! exactly what that principal's ACLs allow, decided by the same authorizer as any client,
//! and any node's console sees the whole cluster (each request goes to the broker that
//! answers it: offsets and messages from the partition's leader). Reads that could be large
//! (message browsing and filtering) run on the broker and send the browser one page.
//!
//! Pages are rendered on the server (`askama` templates in `templates/`) and work without
//! scripts; `htmx` (from npm, embedded: `assets/`) swaps parts of a page in place. No CDN.

mod acls;
mod admin;
mod assets;
mod bench_pages;
mod bench_runs;
mod changes;
mod chart;
mod chart_routes;
mod cluster;
mod display;
mod group_changes;
mod group_forms;
mod groups;
mod history;
mod messages;
mod node_load;
mod over_time;
mod pages;
mod quotas;
mod search;
mod search_pages;
mod security_pages;
mod session;
mod topics;
mod users;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderValue};
use axum::routing::{get, post};
use axum::Router;
use sluice_http::HttpLimits;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub use display::{SchemaDecoded, SchemaDecoder};
pub use session::Login;
pub use sluice_client::{SaslMechanism, Settings};

use crate::history::History;
use crate::search::Searches;
use crate::session::Sessions;

pub use history::HISTORY_INTERVAL_MIN;
pub use node_load::{ApiLatency, NodeTotals, NodeTotalsSource};

/// Connections served at once; the oldest is closed to admit a new one.
const CONNECTIONS_MAX: usize = 256;
/// How long a browser may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a browser may take to finish a TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request body (a login form, a produce form).
const REQUEST_BYTES_MAX: usize = 1024 * 1024;
/// What the pages may load: their own scripts and styles only.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'";

/// How the console reaches the cluster and serves browsers.
pub struct ConsoleConfig {
    /// A listener of this broker (`host:port`) the console connects to.
    pub bootstrap: String,
    /// How to connect to it (protocol and TLS; the SASL user comes from the login).
    pub settings: Settings,
    /// Whether visitors log in, and how.
    pub login: Login,
    /// Serve HTTPS with this acceptor.
    pub tls: Option<TlsAcceptor>,
    /// How often lag and rates are sampled for the charts.
    pub history_interval: Duration,
    /// Where `sluice bench` runs are kept, for the benchmarks pages.
    pub bench_dir: Option<std::path::PathBuf>,
    /// Who samples them when visitors log in (a user allowed to describe every group and
    /// topic, e.g. the brokers' own); `None`: no history on a console with logins.
    pub history_login: Option<(String, String)>,
    /// This node's own byte and latency totals, for its load charts.
    pub node_totals: Option<NodeTotalsSource>,
    /// Decodes keys and values framed with a schema id (the broker's schema registry);
    /// `None`: they are shown as bytes.
    pub schema_decoder: Option<Arc<dyn SchemaDecoder>>,
}

/// A running console's state.
pub struct Console {
    sessions: Sessions,
    history: Arc<History>,
    searches: Searches,
    bench_dir: Option<std::path::PathBuf>,
    schema_decoder: Option<Arc<dyn SchemaDecoder>>,
    /// Served over HTTPS (cookies are `Secure`).
    https: bool,
}

/// The console's routes.
pub fn router(console: Arc<Console>) -> Router {
    let security_headers = |mut response: axum::response::Response| async move {
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
        headers.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
        response
    };
    Router::new()
        .route("/", get(pages::overview))
        .route("/login", get(pages::login_form).post(pages::login))
        .route("/logout", post(pages::logout))
        .route("/topics", get(pages::topics))
        .route("/create-topic", get(changes::create_topic_form).post(changes::create_topic))
        .route("/topics/{name}", get(pages::topic))
        .route("/topics/{name}/messages", get(pages::messages))
        .route("/topics/{name}/search", post(search_pages::start_search))
        .route("/topics/{name}/search/{id}", get(search_pages::search_page))
        .route("/topics/{name}/search/{id}/cancel", post(search_pages::cancel_search))
        .route("/topics/{name}/partitions", post(changes::add_partitions))
        .route("/topics/{name}/configs", post(changes::alter_config))
        .route("/topics/{name}/delete", post(changes::delete_topic))
        .route("/topics/{name}/produce", post(changes::produce))
        .route("/groups", get(pages::groups))
        .route("/rate-chart", get(chart_routes::cluster_rate_chart))
        .route("/node-traffic-chart", get(chart_routes::node_traffic_chart))
        .route("/node-latency-chart", get(chart_routes::node_latency_chart))
        .route("/topics/{name}/rate-chart", get(chart_routes::topic_rate_chart))
        .route("/groups/{id}", get(pages::group))
        .route("/groups/{id}/lag-chart", get(chart_routes::group_lag_chart))
        .route("/groups/{id}/reset", post(group_forms::reset_offsets))
        .route("/groups/{id}/delete-offsets", post(group_forms::delete_offsets))
        .route("/groups/{id}/delete", post(group_forms::delete_group))
        .route("/security", get(|| async { axum::response::Redirect::to("/security/users") }))
        .route("/security/users", get(security_pages::users).post(security_pages::set_password))
        .route("/security/users/delete", post(security_pages::delete_credential))
        .route("/security/acls", get(security_pages::acls).post(security_pages::add_acl))
        .route("/security/acls/delete", post(security_pages::remove_acl))
        .route("/security/quotas", get(security_pages::quotas).post(security_pages::set_quota))
        .route("/security/quotas/delete", post(security_pages::remove_quota))
        .route("/benchmarks", get(bench_pages::benchmarks))
        .route("/benchmarks/run", get(bench_pages::bench_run))
        .route("/assets/{file}", get(assets::serve))
        .layer(axum::extract::DefaultBodyLimit::max(REQUEST_BYTES_MAX))
        .layer(axum::middleware::from_fn(changes::same_origin))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(console)
}

/// Serves the console on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, config: ConsoleConfig) {
    assert!(config.history_interval >= HISTORY_INTERVAL_MIN, "validated with the broker's config");
    let sessions = Sessions::new(config.bootstrap, config.settings, config.login);
    let history = Arc::new(History::new(config.history_interval));
    let sampler = sessions.history_client(config.history_login);
    tokio::spawn(history::run(history.clone(), sampler, config.node_totals));
    let console = Arc::new(Console {
        sessions,
        history,
        searches: Searches::default(),
        bench_dir: config.bench_dir,
        schema_decoder: config.schema_decoder,
        https: config.tls.is_some(),
    });
    let limits = HttpLimits {
        connections_max: CONNECTIONS_MAX,
        header_read_timeout: HEADER_READ_TIMEOUT,
        tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
    };
    sluice_http::serve(listener, router(console), config.tls, limits, "console").await
}
