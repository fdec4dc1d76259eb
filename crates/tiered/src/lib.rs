//! Tiered storage (KIP-405): sealed segments of topics with `remote.storage.enable=true` are
//! copied to an object store (S3 and compatible servers, or a local directory, through the
//! `object_store` crate), leave the local disk by `local.retention.ms` / `local.retention.bytes`
//! once copied, and are read back from there by fetches below the local log start.
//!
//! The flow, one background task per node ([`TieredStorage::run`]), every
//! `tiered_storage.task_interval_ms`, for each tiered partition this node leads:
//! 1. copy: the oldest sealed segment not yet remote and wholly committed
//!    ([`Partition::next_segment_to_upload`]) is copied, its data streamed in parts from the
//!    file (read without polluting the page cache), then its index, leader epochs, aborted
//!    transactions and producer snapshot; only then is it listed in the remote log metadata
//!    (`metadata.rs`, made durable) and the log told its new remote range, which lets local
//!    retention delete it. One copy at a time per node: the copy path never competes with
//!    producers for more than one segment's reads.
//! 2. expire: `retention.ms` / `retention.bytes` (the whole log's) and DeleteRecords remove
//!    remote segments: unlisted first, objects deleted after.
//!
//! Reads (`read.rs`) go through a bounded cache of fixed-size chunks with read-ahead.
//! Faults of the object store never reach producers: copies retry with backoff (the
//! local log keeps the segments meanwhile), and fetches of remote data are answered with a
//! retriable error.
//!
//! The remote log metadata (`metadata.rs`) is the controller's replicated metadata in a
//! cluster, where only a partition's leader at its current epoch may change it, and a file
//! on a single node. Followers never copy; they apply the metadata as it comes
//! (the broker's `cluster_link.rs`), so their local retention also keeps only what is not
//! yet remote, and a new replica (a reassignment, a replaced broker) copies only the
//! leader's local tail: it asks for offset 0, is told to start at the leader's local log
//! start (the broker's `handlers/fetch.rs`), and reads older offsets from the object store
//! like any reader.
//!
//! Why a crate of its own: tiered storage is the one part of the broker that talks to an
//! object store, and it needs little of the rest. It reads no broker configuration (the
//! broker hands it a [`TieredStorageConfig`]), counts into [`TieredMetrics`] the broker
//! registers, and what it asks of the broker comes through two narrow traits the broker
//! implements: [`TieredHost`] (the topics, and which partitions this node leads at which
//! epoch) and [`RemoteLogController`] (in a cluster, the controller's replicated metadata
//! that holds the remote log metadata).

mod config;
mod host;
mod metadata;
mod metrics;
mod read;

use std::collections::HashMap;
use std::io;
use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, PutMultipartOptions, PutOptions, PutPayload, WriteMultipart};
use parking_lot::Mutex;
use sluice_storage::{Partition, ReadMode, SealedSegment};
use uuid::Uuid;

pub use self::config::{store_url, TieredStorageConfig, READ_CACHE_BYTES_MIN};
pub use self::host::{RemoteLogController, TieredHost};
pub use self::metadata::{RemotePartition, RemoteSegment};
pub use self::metrics::TieredMetrics;
pub use self::read::{RemoteRead, RemoteReadError, READ_CHUNK_BYTES};
use sluice_meta::topics::TopicMeta;

/// Segment data is copied in parts of this size (S3's minimum part is 5 MiB).
const UPLOAD_PART_BYTES: usize = 8 * 1024 * 1024;
/// Parts of one copy in flight at once.
const UPLOAD_PARTS_IN_FLIGHT: usize = 2;
/// A partition whose copy failed waits this long before the next try, doubling per
/// failure up to [`UPLOAD_BACKOFF_MAX`].
const UPLOAD_BACKOFF_MIN: Duration = Duration::from_secs(1);
const UPLOAD_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// An object no listed segment names, older than this, is left from a copy that was never
/// committed (a crash between copy and commit, a deposed leader's late copy) and is deleted.
/// Far longer than any copy takes, so a copy in flight is never mistaken for one.
const ORPHAN_AGE_MS: i64 = 3_600_000;
/// How often leaders look for such objects (and once at startup).
const ORPHAN_SWEEP_INTERVAL: Duration = Duration::from_secs(600);

/// Where a node's tiered partitions keep their remote segments, and what it knows of them.
pub struct TieredStorage {
    store: Arc<dyn ObjectStore>,
    /// Every key starts with this (the URL's path).
    root: Path,
    metadata: metadata::RemoteLogMetadata,
    reader: read::RemoteReader,
    settings: TieredStorageConfig,
    /// Partitions whose last copy failed: (failures in a row, next try).
    backoff: Mutex<HashMap<(Uuid, i32), (u32, tokio::time::Instant)>>,
    /// When the node's next copied part may start (`copy_max_bytes_per_second`).
    copy_pace: Mutex<tokio::time::Instant>,
    metrics: TieredMetrics,
}

pub use sluice_meta::tiering::is_tiered;

impl TieredStorage {
    /// Opens the object store of `settings` (a directory under `data_dir` by default) and
    /// this node's remote log metadata: in `cluster`'s replicated metadata when given, else
    /// in a file under `data_dir`.
    pub fn open(
        settings: &TieredStorageConfig,
        data_dir: &FsPath,
        cluster: Option<Arc<dyn RemoteLogController>>,
        metrics: TieredMetrics,
    ) -> io::Result<TieredStorage> {
        let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidInput, format!("tiered_storage: {e}"));
        let url = match &settings.url {
            Some(url) => store_url(url).map_err(invalid)?,
            None => {
                let dir = data_dir.join("remote-store");
                sluice_storage::durable::create_dir_all(&dir)?;
                let dir = dir.canonicalize()?;
                url::Url::from_directory_path(&dir).map_err(|()| invalid(format!("bad directory {dir:?}")))?
            }
        };
        let mut options: Vec<(String, String)> = Vec::new();
        if url.scheme() == "s3" {
            // The standard AWS_* variables first, explicit settings after (the last wins).
            for (variable, option) in [
                ("AWS_ACCESS_KEY_ID", "aws_access_key_id"),
                ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
                ("AWS_SESSION_TOKEN", "aws_session_token"),
                ("AWS_ENDPOINT_URL", "aws_endpoint"),
            ] {
                if let Ok(value) = std::env::var(variable) {
                    options.push((option.into(), value));
                }
            }
            let region = settings.region.clone().or_else(|| std::env::var("AWS_REGION").ok());
            options.push(("aws_region".into(), region.unwrap_or_else(|| "us-east-1".into())));
            if let Some(endpoint) = &settings.endpoint {
                options.push(("aws_endpoint".into(), endpoint.clone()));
                // Compatible servers are addressed by path (http://host/bucket/key).
                options.push(("aws_virtual_hosted_style_request".into(), "false".into()));
            }
            if let Some(key) = &settings.access_key_id {
                options.push(("aws_access_key_id".into(), key.clone()));
            }
            if let Some(secret) = &settings.secret_access_key {
                options.push(("aws_secret_access_key".into(), secret.clone()));
            }
            options.push(("aws_allow_http".into(), settings.allow_http.to_string()));
        }
        // reqwest's rustls comes without a crypto provider (Cargo.toml): the process default is
        // ring's, as the listeners' (`sluice_security::tls`). Already installed is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (store, root) = object_store::parse_url_opts(&url, options).map_err(|e| invalid(format!("{url}: {e}")))?;
        let store: Arc<dyn ObjectStore> = Arc::from(store);
        Ok(TieredStorage {
            reader: read::RemoteReader::new(store.clone(), settings.read_cache_bytes),
            store,
            root,
            metadata: match cluster {
                None => metadata::RemoteLogMetadata::open_local(data_dir)?,
                Some(controller) => metadata::RemoteLogMetadata::replicated(controller),
            },
            settings: settings.clone(),
            backoff: Mutex::new(HashMap::new()),
            copy_pace: Mutex::new(tokio::time::Instant::now()),
            metrics,
        })
    }

    /// Tells every tiered log this node hosts its remote range (at startup, before clients
    /// are served, so the first ListOffsets already sees the remote part).
    pub fn attach(&self, topic: &TopicMeta, log: &Partition, partition: i32) {
        log.set_remote_tier(self.metadata.partition(topic.id, partition).range());
    }

    /// The background task: copies and expires remote segments of the tiered partitions
    /// `host` leads, every `task_interval_ms`, until the broker stops.
    pub async fn run(self: Arc<Self>, host: Arc<impl TieredHost>) {
        let mut interval = tokio::time::interval(Duration::from_millis(self.settings.task_interval_ms));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_sweep = tokio::time::Instant::now();
        loop {
            interval.tick().await;
            let sweep = tokio::time::Instant::now() >= next_sweep;
            if sweep {
                next_sweep = tokio::time::Instant::now() + ORPHAN_SWEEP_INTERVAL;
            }
            for topic in host.topics().into_iter().filter(is_tiered) {
                for p in 0..topic.partitions {
                    let Some((log, epoch)) = host.led_log(&topic.name, p) else { continue };
                    if sweep {
                        if let Err(error) = self.sweep_orphans(&topic, p).await {
                            tracing::warn!(topic = %topic.name, partition = p, %error, "looking for orphaned objects failed");
                        }
                    }
                    self.attach(&topic, &log, p);
                    self.copy_segments(&topic, p, epoch, &log).await;
                    if let Err(error) = self.expire(&topic, p, epoch, &log).await {
                        tracing::warn!(topic = %topic.name, partition = p, %error, "remote retention failed; retrying");
                    }
                }
            }
        }
    }

    /// Copies every sealed segment of the partition that is due, oldest first, stopping at
    /// the first failure (the next pass retries after a backoff).
    async fn copy_segments(&self, topic: &TopicMeta, partition: i32, epoch: i32, log: &Arc<Partition>) {
        let key = (topic.id, partition);
        if self.backoff.lock().get(&key).is_some_and(|&(_, next)| tokio::time::Instant::now() < next) {
            return;
        }
        while let Some(segment) = log.next_segment_to_upload() {
            match self.copy_segment(topic, partition, epoch, segment).await {
                Ok(copied) => {
                    self.metrics.copied_segments.inc();
                    self.backoff.lock().remove(&key);
                    log.set_remote_tier(copied);
                }
                Err(error) => {
                    self.metrics.copy_failures.inc();
                    let mut backoff = self.backoff.lock();
                    let failures = backoff.get(&key).map_or(0, |&(n, _)| n) + 1;
                    let wait = UPLOAD_BACKOFF_MIN.saturating_mul(1 << failures.min(5)).min(UPLOAD_BACKOFF_MAX);
                    backoff.insert(key, (failures, tokio::time::Instant::now() + wait));
                    tracing::warn!(topic = %topic.name, partition, %error, retry_in_ms = wait.as_millis() as u64,
                        "copying a segment to the object store failed");
                    return;
                }
            }
        }
    }

    /// Copies one segment and commits it; returns the partition's remote range after.
    async fn copy_segment(
        &self,
        topic: &TopicMeta,
        partition: i32,
        epoch: i32,
        segment: SealedSegment,
    ) -> io::Result<Option<(i64, i64)>> {
        let started = std::time::Instant::now();
        let remote = RemoteSegment {
            id: Uuid::new_v4(),
            base_offset: segment.base_offset,
            end_offset: segment.end_offset,
            max_timestamp: segment.max_timestamp,
            size_bytes: segment.size_bytes,
            leader_epochs: segment.leader_epochs.clone(),
            has_producer_snapshot: segment.producer_snapshot.is_some(),
            has_aborted_transactions: !segment.aborted.is_empty(),
        };
        let keys = SegmentKeys::new(&self.root, topic, partition, &remote);
        self.copy_data(&keys.data, &segment).await?;
        self.put(&keys.index, segment.index.clone().into()).await?;
        let epochs = serde_json::to_vec(&segment.leader_epochs).map_err(io::Error::other)?;
        self.put(&keys.leader_epochs, epochs.into()).await?;
        if !segment.aborted.is_empty() {
            let aborted = serde_json::to_vec(&segment.aborted).map_err(io::Error::other)?;
            self.put(&keys.aborted_transactions, aborted.into()).await?;
        }
        if let Some(snapshot) = segment.producer_snapshot {
            self.put(&keys.producer_snapshot, snapshot.into()).await?;
        }
        let ((), range) = self
            .metadata
            .commit(topic, partition, epoch, |entry| {
                if entry.segments.is_empty() {
                    entry.start_offset = entry.start_offset.max(remote.base_offset);
                }
                entry.segments.insert(remote.base_offset, remote.clone());
            })
            .await?;
        tracing::debug!(topic = %topic.name, partition, base = remote.base_offset, end = remote.end_offset,
            bytes = remote.size_bytes, elapsed_ms = started.elapsed().as_millis() as u64, "segment copied to the object store");
        Ok(range)
    }

    /// Streams a segment's data to the store in parts, read from the file on the blocking
    /// pool without leaving what came from disk in the page cache.
    async fn copy_data(&self, key: &Path, segment: &SealedSegment) -> io::Result<()> {
        let upload = self.store.put_multipart_opts(key, PutMultipartOptions::default()).await.map_err(store_error)?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, UPLOAD_PART_BYTES);
        let mut position = 0u64;
        let rate = self.settings.copy_max_bytes_per_second;
        while position < segment.size_bytes {
            let length = (segment.size_bytes - position).min(UPLOAD_PART_BYTES as u64) as usize;
            // copy_max_bytes_per_second: each part waits for its turn on the node's pace.
            if rate != u64::MAX {
                let turn = {
                    let mut next = self.copy_pace.lock();
                    let turn = (*next).max(tokio::time::Instant::now());
                    *next = turn + Duration::from_secs_f64(length as f64 / rate as f64);
                    turn
                };
                tokio::time::sleep_until(turn).await;
            }
            let file = segment.file.clone();
            let part = tokio::task::spawn_blocking(move || {
                sluice_storage::Segment::read_at(&file, position, length, ReadMode::MayBlock, false)
            })
            .await
            .map_err(io::Error::other)??;
            if let Err(error) = writer.wait_for_capacity(UPLOAD_PARTS_IN_FLIGHT).await {
                return Err(store_error(error));
            }
            writer.put(part);
            position += length as u64;
            self.metrics.copied_bytes.inc_by(length as u64);
        }
        writer.finish().await.map_err(store_error)?;
        Ok(())
    }

    async fn put(&self, key: &Path, payload: PutPayload) -> io::Result<()> {
        self.store.put_opts(key, payload, PutOptions::default()).await.map_err(store_error)?;
        Ok(())
    }

    /// Applies the whole log's `retention.ms` / `retention.bytes` to the remote part, and
    /// deletes remote segments wholly below the remote start (DeleteRecords).
    async fn expire(&self, topic: &TopicMeta, partition: i32, epoch: i32, log: &Arc<Partition>) -> io::Result<()> {
        let config = log.config();
        let remote = self.metadata.partition(topic.id, partition);
        if remote.segments.is_empty() {
            return Ok(());
        }
        let now = sluice_storage::now_ms();
        let remote_end = remote.range().map_or(0, |(_, end)| end);
        // The whole log: remote segments plus what is only local.
        let mut total = remote.size_bytes() + log.size_bytes_from(remote_end);
        let mut expired = Vec::new();
        for segment in remote.segments.values() {
            let below_start = segment.end_offset <= remote.start_offset;
            let too_old = config.cleanup_delete
                && config.retention_ms >= 0
                && segment.max_timestamp < now.saturating_sub(config.retention_ms);
            let too_big = config.cleanup_delete
                && config.retention_bytes >= 0
                && total.saturating_sub(segment.size_bytes) >= config.retention_bytes as u64;
            if !(below_start || too_old || too_big) {
                break;
            }
            total -= segment.size_bytes;
            expired.push(segment.clone());
        }
        if expired.is_empty() {
            return Ok(());
        }
        self.delete_remote(topic, partition, epoch, log, expired).await
    }

    /// Unlists `segments` (the oldest of the partition), moving the remote start past
    /// them, then deletes their objects.
    async fn delete_remote(
        &self,
        topic: &TopicMeta,
        partition: i32,
        epoch: i32,
        log: &Arc<Partition>,
        segments: Vec<RemoteSegment>,
    ) -> io::Result<()> {
        let ((), range) = self
            .metadata
            .commit(topic, partition, epoch, |entry| {
                for segment in &segments {
                    entry.segments.remove(&segment.base_offset);
                    entry.start_offset = entry.start_offset.max(segment.end_offset);
                }
            })
            .await?;
        log.set_remote_tier(range);
        for segment in &segments {
            self.reader.forget(segment.id);
            let keys = SegmentKeys::new(&self.root, topic, partition, segment).all();
            let mut deleted = self.store.delete_stream(futures::stream::iter(keys.map(Ok)).boxed());
            while let Some(result) = deleted.next().await {
                match result {
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(error) => tracing::warn!(%error, "deleting an expired remote object failed; it stays unlisted"),
                }
            }
        }
        self.metrics.expired_segments.inc_by(segments.len() as u64);
        tracing::info!(topic = %topic.name, partition, segments = segments.len(), "remote segments expired");
        Ok(())
    }

    /// Deletes the partition's objects that no listed segment names and that are older than
    /// [`ORPHAN_AGE_MS`]. Returns how many were deleted.
    async fn sweep_orphans(&self, topic: &TopicMeta, partition: i32) -> io::Result<usize> {
        let prefix = topic_prefix(&self.root, topic).join(partition.to_string());
        let listed: std::collections::HashSet<String> =
            self.metadata.partition(topic.id, partition).segments.values().map(|s| s.id.simple().to_string()).collect();
        let now_ms = sluice_storage::now_ms();
        let mut orphans = Vec::new();
        let mut objects = self.store.list(Some(&prefix));
        while let Some(object) = objects.next().await {
            let object = object.map_err(store_error)?;
            let id = object.location.filename().and_then(|name| name.split_once('-')?.1.split('.').next());
            let old = now_ms - object.last_modified.timestamp_millis() > ORPHAN_AGE_MS;
            if old && id.is_some_and(|id| !listed.contains(id)) {
                orphans.push(object.location);
            }
        }
        let count = orphans.len();
        if count > 0 {
            let mut deleted = self.store.delete_stream(futures::stream::iter(orphans.into_iter().map(Ok)).boxed());
            while let Some(result) = deleted.next().await {
                result.map_err(store_error)?;
            }
            tracing::info!(topic = %topic.name, partition, objects = count, "deleted objects of copies never committed");
        }
        Ok(count)
    }

    /// DeleteRecords below the local log start: moves the remote start to `offset`
    /// (durably) and lets the next pass delete the segments wholly below it. Returns the
    /// partition's first readable offset after.
    pub async fn delete_records_before(
        &self,
        topic: &TopicMeta,
        partition: i32,
        epoch: i32,
        log: &Partition,
        offset: i64,
    ) -> io::Result<i64> {
        let ((), range) = self
            .metadata
            .commit(topic, partition, epoch, |entry| entry.start_offset = entry.start_offset.max(offset))
            .await?;
        log.set_remote_tier(range);
        Ok(log.first_readable_offset())
    }

    /// Reads whole batches from the remote part of a partition, from the batch holding
    /// `offset`, up to `max_bytes` (at least one batch when `min_one_batch`).
    pub async fn read(
        &self,
        topic: &TopicMeta,
        partition: i32,
        offset: i64,
        max_bytes: usize,
        min_one_batch: bool,
    ) -> Result<RemoteRead, read::RemoteReadError> {
        let Some(segment) = self.metadata.segment_for(topic.id, partition, offset) else {
            return Err(read::RemoteReadError::NotRemote);
        };
        let keys = SegmentKeys::new(&self.root, topic, partition, &segment);
        let read = self.reader.read(&keys, &segment, offset, max_bytes, min_one_batch).await;
        match &read {
            Ok(read) => {
                self.metrics.fetched_bytes.inc_by(read.records.len() as u64);
            }
            Err(_) => {
                self.metrics.fetch_failures.inc();
            }
        }
        read
    }

    /// Bytes in the object store of the tiered partitions `host` leads (`/metrics`).
    pub fn led_remote_bytes(&self, host: &impl TieredHost) -> u64 {
        let mut total = 0;
        for topic in host.topics().into_iter().filter(is_tiered) {
            for p in 0..topic.partitions {
                if host.led_log(&topic.name, p).is_some() {
                    total += self.metadata.partition(topic.id, p).size_bytes();
                }
            }
        }
        total
    }

    /// The first batch with a record at or after `timestamp` in the remote part, for
    /// ListOffsets; `None` when the remote part has none.
    pub async fn batch_for_timestamp(
        &self,
        topic: &TopicMeta,
        partition: i32,
        timestamp: i64,
    ) -> Result<Option<Bytes>, read::RemoteReadError> {
        let Some(segment) = self.metadata.segment_for_timestamp(topic.id, partition, timestamp) else {
            return Ok(None);
        };
        let keys = SegmentKeys::new(&self.root, topic, partition, &segment);
        self.reader.batch_for_timestamp(&keys, &segment, timestamp).await
    }

    /// A deleted topic's remote part: unlisted, then its objects deleted (in the background).
    pub fn forget_topic(self: &Arc<Self>, topic: TopicMeta) {
        let tiered = self.clone();
        tokio::spawn(async move {
            if let Err(error) = tiered.metadata.forget_topic(topic.id).await {
                tracing::warn!(topic = %topic.name, %error, "could not unlist a deleted topic's remote segments");
                return;
            }
            let prefix = topic_prefix(&tiered.root, &topic);
            let locations = tiered.store.list(Some(&prefix)).map(|meta| meta.map(|m| m.location));
            let mut deleted = tiered.store.delete_stream(locations.boxed());
            while let Some(result) = deleted.next().await {
                if let Err(error) = result {
                    tracing::warn!(topic = %topic.name, %error, "deleting a deleted topic's remote object failed");
                }
            }
        });
    }
}

fn store_error(error: object_store::Error) -> io::Error {
    io::Error::other(format!("object store: {error}"))
}

/// `<root>/<topic id>/`: a topic deleted and created again under the same name never
/// shares objects with the old one. Names are left out of keys to keep them short (some
/// S3-compatible servers map a key to a file name of at most 255 bytes).
fn topic_prefix(root: &Path, topic: &TopicMeta) -> Path {
    root.clone().join(topic.id.simple().to_string())
}

/// The objects of one remote segment: `<topic prefix>/<partition>/<base offset>-<id>.<kind>`,
/// no key a prefix of another (S3-compatible servers that store keys as files need that).
struct SegmentKeys {
    data: Path,
    index: Path,
    leader_epochs: Path,
    aborted_transactions: Path,
    producer_snapshot: Path,
    id: Uuid,
}

impl SegmentKeys {
    fn new(root: &Path, topic: &TopicMeta, partition: i32, segment: &RemoteSegment) -> SegmentKeys {
        let dir = topic_prefix(root, topic).join(partition.to_string());
        let name = |kind: &str| dir.clone().join(format!("{:020}-{}.{kind}", segment.base_offset, segment.id.simple()));
        SegmentKeys {
            data: name("log"),
            index: name("index"),
            leader_epochs: name("leader-epochs"),
            aborted_transactions: name("aborted-transactions"),
            producer_snapshot: name("snapshot"),
            id: segment.id,
        }
    }

    fn all(self) -> [Path; 5] {
        [self.data, self.index, self.leader_epochs, self.aborted_transactions, self.producer_snapshot]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An S3 store over TLS builds its HTTP client at open: that client's rustls has no
    /// crypto provider of its own (Cargo.toml), so without ring's as the default it panics.
    #[test]
    fn an_s3_store_over_https_opens() {
        let dir = tempfile::tempdir().unwrap();
        let settings = TieredStorageConfig {
            url: Some("s3://bucket/prefix".into()),
            endpoint: Some("https://127.0.0.1:1".into()),
            access_key_id: Some("key".into()),
            secret_access_key: Some("secret".into()),
            ..TieredStorageConfig::default()
        };
        let tiered = TieredStorage::open(&settings, dir.path(), None, TieredMetrics::default()).unwrap();
        assert_eq!(tiered.root, Path::from("prefix"));
    }
}
