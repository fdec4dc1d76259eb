//! The settings of tiered storage, as the broker's `[tiered_storage]` table gives them, and
//! their checks. Here rather than in the broker's configuration because their bounds come
//! from this crate (the read cache must hold a few [`READ_CHUNK_BYTES`] chunks; only the
//! object stores [`store_url`] accepts can be opened).

use serde::Deserialize;

use crate::READ_CHUNK_BYTES;

/// The smallest `tiered_storage.read_cache_bytes`: a few of the chunks remote reads fetch.
pub const READ_CACHE_BYTES_MIN: usize = 4 * READ_CHUNK_BYTES;

/// `[tiered_storage]`: where tiered topics (`remote.storage.enable=true`, KIP-405) keep
/// their sealed segments, and the budgets of the copy and read paths.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TieredStorageConfig {
    /// Kafka's `remote.log.storage.system.enable`: topics may be tiered.
    pub enabled: bool,
    /// The object store, as a URL: `s3://bucket/prefix` (S3 and compatible servers) or
    /// `file:///dir`. Unset: `<data_dir>/remote-store`, a local directory.
    pub url: Option<String>,
    /// S3: the endpoint of a compatible server (e.g. `http://127.0.0.1:9000`); unset = AWS.
    pub endpoint: Option<String>,
    /// S3: the region (`us-east-1` when unset and not in `AWS_REGION`).
    pub region: Option<String>,
    /// S3 credentials; unset = the standard `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`
    /// environment variables (or the instance's role).
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// S3: allow a plain `http://` endpoint.
    pub allow_http: bool,
    /// Kafka's `remote.log.manager.task.interval.ms`: how often leaders look for segments
    /// to copy and remote segments to expire.
    pub task_interval_ms: u64,
    /// Bytes of remote segment data kept in memory for reads and read-ahead.
    pub read_cache_bytes: usize,
    /// Kafka's `remote.fetch.max.wait.ms`: a fetch waits at most this long for remote data
    /// before it is answered without it (the client fetches again).
    pub fetch_max_wait_ms: u64,
    /// Kafka's `remote.log.manager.copy.max.bytes.per.second`: the node's copies to the
    /// object store never go faster (they read the local disk producers write to).
    pub copy_max_bytes_per_second: u64,
}

impl Default for TieredStorageConfig {
    fn default() -> Self {
        TieredStorageConfig {
            enabled: true,
            url: None,
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            allow_http: false,
            task_interval_ms: 1_000,
            read_cache_bytes: 256 * 1024 * 1024,
            fetch_max_wait_ms: 500,
            copy_max_bytes_per_second: u64::MAX,
        }
    }
}

impl TieredStorageConfig {
    /// Checks the settings (at config validation, before anything is opened).
    pub fn validate(&self) -> Result<(), String> {
        if self.task_interval_ms == 0 || self.fetch_max_wait_ms == 0 || self.copy_max_bytes_per_second == 0 {
            return Err(
                "tiered_storage.task_interval_ms, fetch_max_wait_ms and copy_max_bytes_per_second must be > 0".into()
            );
        }
        if self.read_cache_bytes < READ_CACHE_BYTES_MIN {
            return Err(format!("tiered_storage.read_cache_bytes must be at least {READ_CACHE_BYTES_MIN}"));
        }
        if let Some(url) = &self.url {
            store_url(url).map_err(|e| format!("tiered_storage.url: {e}"))?;
        }
        Ok(())
    }
}

/// The object store a `tiered_storage.url` names (checked at config validation).
pub fn store_url(url: &str) -> Result<url::Url, String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match parsed.scheme() {
        "s3" | "file" => Ok(parsed),
        other => Err(format!("{url:?}: unsupported scheme {other:?} (s3:// or file://)")),
    }
}
