//! Reads of remote segments: whole batches from the one holding a fetch offset, located by
//! the segment's copied index, through a bounded cache of fixed-size chunks.
//!
//! Why chunks: a catch-up consumer reads a segment front to back in fetch-sized steps;
//! fetching [`READ_CHUNK_BYTES`] at a time (and the next [`READ_AHEAD_CHUNKS`] ahead, in the
//! background) turns that into a few large ranged GETs that stream at the store's
//! bandwidth, and two readers of the same chunk share one GET. The cache holds at most
//! `tiered_storage.read_cache_bytes` of chunks (least recently used go first); indexes and
//! aborted-transaction lists of recently read segments are kept beside it.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, FutureExt, Shared};
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore};
use parking_lot::Mutex;
use sluice_storage::batch::BatchIter;
use sluice_storage::{AbortedTransaction, SegmentIndex};
use uuid::Uuid;

use super::{RemoteSegment, SegmentKeys};

/// Remote segment data is fetched and cached in chunks of this size.
pub const READ_CHUNK_BYTES: usize = 4 * 1024 * 1024;
/// Chunks fetched ahead of a read, in the background.
const READ_AHEAD_CHUNKS: u64 = 2;
/// Segment indexes (and aborted-transaction lists) kept decoded.
const SEGMENT_SIDE_FILES_CACHED: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum RemoteReadError {
    /// The remote part does not hold the offset (any more).
    #[error("offset not in the remote tier")]
    NotRemote,
    #[error("remote tier: {0}")]
    Store(String),
}

/// Batches read from the remote tier.
pub struct RemoteRead {
    pub records: Bytes,
    /// Aborted transactions whose records may lie in the segment read (read_committed).
    pub aborted: Vec<AbortedTransaction>,
}

type Loading = Shared<BoxFuture<'static, Result<Bytes, Arc<String>>>>;

enum Chunk {
    Loading(Loading),
    /// The bytes and when they were last used (the cache's clock).
    Ready(Bytes, u64),
}

#[derive(Default)]
struct Chunks {
    entries: HashMap<(Uuid, u64), Chunk>,
    ready_bytes: usize,
    clock: u64,
}

struct Inner {
    store: Arc<dyn ObjectStore>,
    cache_bytes_max: usize,
    chunks: Mutex<Chunks>,
    indexes: Mutex<HashMap<Uuid, Arc<SegmentIndex>>>,
    aborted: Mutex<HashMap<Uuid, Arc<Vec<AbortedTransaction>>>>,
}

#[derive(Clone)]
pub(super) struct RemoteReader {
    inner: Arc<Inner>,
}

impl RemoteReader {
    pub(super) fn new(store: Arc<dyn ObjectStore>, cache_bytes_max: usize) -> RemoteReader {
        assert!(cache_bytes_max >= READ_CHUNK_BYTES, "the read cache holds at least one chunk");
        RemoteReader {
            inner: Arc::new(Inner {
                store,
                cache_bytes_max,
                chunks: Mutex::new(Chunks::default()),
                indexes: Mutex::new(HashMap::new()),
                aborted: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Drops what is cached of a segment (it was deleted).
    pub(super) fn forget(&self, id: Uuid) {
        let mut chunks = self.inner.chunks.lock();
        let forgotten: usize = chunks
            .entries
            .iter()
            .filter(|((segment, _), _)| *segment == id)
            .map(|(_, chunk)| if let Chunk::Ready(bytes, _) = chunk { bytes.len() } else { 0 })
            .sum();
        chunks.entries.retain(|(segment, _), _| *segment != id);
        chunks.ready_bytes -= forgotten;
        self.inner.indexes.lock().remove(&id);
        self.inner.aborted.lock().remove(&id);
    }

    pub(super) async fn read(
        &self,
        keys: &SegmentKeys,
        segment: &RemoteSegment,
        offset: i64,
        max_bytes: usize,
        min_one_batch: bool,
    ) -> Result<RemoteRead, RemoteReadError> {
        let index = self.index(keys, segment).await?;
        let start = index.position_at_or_before(segment.base_offset, offset);
        let mut data = BytesMut::new();
        let mut loaded_to = start;
        // (first, end) of the batches chosen, as positions in `data`.
        let (mut first, mut end) = (None, 0usize);
        'load: while loaded_to < segment.size_bytes {
            loaded_to = self.append_chunk(keys, segment, loaded_to, &mut data).await?;
            let base = end;
            for batch in BatchIter::new(&data[base..]) {
                let (header, range) =
                    batch.map_err(|e| RemoteReadError::Store(format!("corrupt remote batch: {e}")))?;
                let range = base + range.start..base + range.end;
                if header.base_offset >= segment.end_offset {
                    break 'load;
                }
                if header.last_offset() < offset {
                    end = range.end;
                    continue;
                }
                let chosen_from = *first.get_or_insert(range.start);
                let fits = range.end - chosen_from <= max_bytes;
                let first_of_read = min_one_batch && chosen_from == range.start;
                if !(fits || first_of_read) {
                    break 'load;
                }
                end = range.end;
                if range.end - chosen_from >= max_bytes {
                    break 'load;
                }
            }
            debug_assert!(end <= data.len());
        }
        self.read_ahead(keys, segment, loaded_to);
        let data = data.freeze();
        let records = match first {
            Some(first) if end > first => data.slice(first..end),
            _ => Bytes::new(),
        };
        let aborted = if segment.has_aborted_transactions {
            self.aborted_transactions(keys, segment).await?.as_ref().clone()
        } else {
            Vec::new()
        };
        Ok(RemoteRead { records, aborted })
    }

    /// The first batch of the segment with a record at or after `timestamp`.
    pub(super) async fn batch_for_timestamp(
        &self,
        keys: &SegmentKeys,
        segment: &RemoteSegment,
        timestamp: i64,
    ) -> Result<Option<Bytes>, RemoteReadError> {
        let index = self.index(keys, segment).await?;
        let mut loaded_to = index.position_for_timestamp(timestamp);
        let mut data = BytesMut::new();
        let mut parsed_to = 0usize;
        while loaded_to < segment.size_bytes {
            loaded_to = self.append_chunk(keys, segment, loaded_to, &mut data).await?;
            let base = parsed_to;
            for batch in BatchIter::new(&data[base..]) {
                let (header, range) =
                    batch.map_err(|e| RemoteReadError::Store(format!("corrupt remote batch: {e}")))?;
                let range = base + range.start..base + range.end;
                if header.max_timestamp >= timestamp {
                    return Ok(Some(Bytes::copy_from_slice(&data[range])));
                }
                parsed_to = range.end;
            }
        }
        Ok(None)
    }

    /// Appends the segment's bytes from `position` to the end of the chunk holding it;
    /// returns the position after them.
    async fn append_chunk(
        &self,
        keys: &SegmentKeys,
        segment: &RemoteSegment,
        position: u64,
        data: &mut BytesMut,
    ) -> Result<u64, RemoteReadError> {
        let chunk_index = position / READ_CHUNK_BYTES as u64;
        let chunk_start = chunk_index * READ_CHUNK_BYTES as u64;
        let chunk = self.chunk(&keys.data, segment, chunk_index).await?;
        data.extend_from_slice(&chunk[(position - chunk_start) as usize..]);
        Ok(chunk_start + chunk.len() as u64)
    }

    /// Starts fetching the chunks after `position` that are not cached yet.
    fn read_ahead(&self, keys: &SegmentKeys, segment: &RemoteSegment, position: u64) {
        let next = position.div_ceil(READ_CHUNK_BYTES as u64);
        for chunk_index in next..next + READ_AHEAD_CHUNKS {
            if chunk_index * READ_CHUNK_BYTES as u64 >= segment.size_bytes
                || self.inner.chunks.lock().entries.contains_key(&(segment.id, chunk_index))
            {
                continue;
            }
            let (reader, key, segment) = (self.clone(), keys.data.clone(), segment.clone());
            tokio::spawn(async move {
                if let Err(error) = reader.chunk(&key, &segment, chunk_index).await {
                    tracing::debug!(%error, "remote read-ahead failed");
                }
            });
        }
    }

    /// One chunk of a segment's data, from the cache or the store (one GET however many
    /// readers wait for it).
    async fn chunk(&self, key: &Path, segment: &RemoteSegment, chunk_index: u64) -> Result<Bytes, RemoteReadError> {
        let cache_key = (segment.id, chunk_index);
        let loading = {
            let mut chunks = self.inner.chunks.lock();
            chunks.clock += 1;
            let now = chunks.clock;
            match chunks.entries.get_mut(&cache_key) {
                Some(Chunk::Ready(bytes, used)) => {
                    *used = now;
                    return Ok(bytes.clone());
                }
                Some(Chunk::Loading(loading)) => loading.clone(),
                None => {
                    let start = chunk_index * READ_CHUNK_BYTES as u64;
                    let range = start..(start + READ_CHUNK_BYTES as u64).min(segment.size_bytes);
                    let (store, key) = (self.inner.store.clone(), key.clone());
                    let loading = async move {
                        let got = store
                            .get_opts(&key, GetOptions::new().with_range(Some(range.clone())))
                            .await
                            .map_err(|e| Arc::new(e.to_string()))?;
                        let bytes = got.bytes().await.map_err(|e| Arc::new(e.to_string()))?;
                        if bytes.len() as u64 != range.end - range.start {
                            return Err(Arc::new(format!("short read of {key}: {} bytes", bytes.len())));
                        }
                        Ok(bytes)
                    }
                    .boxed()
                    .shared();
                    chunks.entries.insert(cache_key, Chunk::Loading(loading.clone()));
                    loading
                }
            }
        };
        let result = loading.await;
        let mut chunks = self.inner.chunks.lock();
        let still_loading = matches!(chunks.entries.get(&cache_key), Some(Chunk::Loading(_)));
        match result {
            Ok(bytes) => {
                if still_loading {
                    chunks.clock += 1;
                    let now = chunks.clock;
                    chunks.ready_bytes += bytes.len();
                    chunks.entries.insert(cache_key, Chunk::Ready(bytes.clone(), now));
                    evict(&mut chunks, self.inner.cache_bytes_max);
                }
                Ok(bytes)
            }
            Err(error) => {
                if still_loading {
                    chunks.entries.remove(&cache_key);
                }
                Err(RemoteReadError::Store(error.to_string()))
            }
        }
    }

    async fn index(&self, keys: &SegmentKeys, segment: &RemoteSegment) -> Result<Arc<SegmentIndex>, RemoteReadError> {
        if let Some(index) = self.inner.indexes.lock().get(&segment.id) {
            return Ok(index.clone());
        }
        let bytes = self.get_whole(&keys.index).await?;
        let index = SegmentIndex::parse(&bytes).map_err(|e| RemoteReadError::Store(format!("{}: {e}", keys.index)))?;
        if index.covered_bytes != segment.size_bytes {
            return Err(RemoteReadError::Store(format!(
                "{}: covers {} bytes, not {}",
                keys.index, index.covered_bytes, segment.size_bytes
            )));
        }
        let index = Arc::new(index);
        let mut indexes = self.inner.indexes.lock();
        if indexes.len() >= SEGMENT_SIDE_FILES_CACHED {
            indexes.clear();
        }
        indexes.insert(keys.id, index.clone());
        Ok(index)
    }

    async fn aborted_transactions(
        &self,
        keys: &SegmentKeys,
        segment: &RemoteSegment,
    ) -> Result<Arc<Vec<AbortedTransaction>>, RemoteReadError> {
        if let Some(aborted) = self.inner.aborted.lock().get(&segment.id) {
            return Ok(aborted.clone());
        }
        let bytes = self.get_whole(&keys.aborted_transactions).await?;
        let aborted: Vec<AbortedTransaction> = serde_json::from_slice(&bytes)
            .map_err(|e| RemoteReadError::Store(format!("{}: {e}", keys.aborted_transactions)))?;
        let aborted = Arc::new(aborted);
        let mut cached = self.inner.aborted.lock();
        if cached.len() >= SEGMENT_SIDE_FILES_CACHED {
            cached.clear();
        }
        cached.insert(segment.id, aborted.clone());
        Ok(aborted)
    }

    async fn get_whole(&self, key: &Path) -> Result<Bytes, RemoteReadError> {
        let got = self
            .inner
            .store
            .get_opts(key, GetOptions::new())
            .await
            .map_err(|e| RemoteReadError::Store(e.to_string()))?;
        got.bytes().await.map_err(|e| RemoteReadError::Store(e.to_string()))
    }
}

/// Drops the least recently used ready chunks until the cache fits its budget.
fn evict(chunks: &mut Chunks, cache_bytes_max: usize) {
    while chunks.ready_bytes > cache_bytes_max {
        let oldest = chunks
            .entries
            .iter()
            .filter_map(|(key, chunk)| match chunk {
                Chunk::Ready(_, used) => Some((*used, *key)),
                Chunk::Loading(_) => None,
            })
            .min();
        let Some((_, key)) = oldest else { break };
        if let Some(Chunk::Ready(bytes, _)) = chunks.entries.remove(&key) {
            chunks.ready_bytes -= bytes.len();
        }
    }
}
