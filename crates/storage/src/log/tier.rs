//! The tiering hooks: what the tiering layer (KIP-405; the broker's `tiered` module) copies
//! from this log to the object store, and the remote range it reports back.
//!
//! Why a module: a tiered log's local retention depends on what the remote tier holds, so
//! the two meet here and nowhere else. Only sealed segments wholly below the high watermark
//! and the last stable offset are handed out (nothing a failover or an abort can still take
//! back), oldest first, one at a time.
//!
//! Durability contract: nothing here writes to the log's directory. The tiering layer
//! reports a remote range ([`Partition::set_remote_tier`]) only once the copy and its
//! metadata are durable; from then on local retention may delete segments below its end
//! (`retention.rs`), and reads below the local log start are answered with
//! [`ReadError::InRemoteTier`](super::ReadError::InRemoteTier).

use std::fs::File;
use std::sync::Arc;

use super::append::first_unsealed_base;
use super::{first_readable_offset, last_stable_offset, AbortedTransaction, Partition};

/// A sealed segment to copy to the remote tier, with what a reader of the copy needs.
pub struct SealedSegment {
    pub base_offset: i64,
    /// The next segment's base offset: the segment covers `[base_offset, end_offset)`.
    pub end_offset: i64,
    pub size_bytes: u64,
    pub max_timestamp: i64,
    pub file: Arc<File>,
    /// The segment's offset and time index, in the local index file's format
    /// ([`crate::segment::SegmentIndex::parse`]).
    pub index: Vec<u8>,
    /// (leader epoch, first offset) of every epoch with records in the segment, and the
    /// one in force at its start.
    pub leader_epochs: Vec<(i32, i64)>,
    /// Aborted transactions whose records may lie in the segment (for read_committed reads).
    pub aborted: Vec<AbortedTransaction>,
    /// The producer snapshot at `end_offset`, when one is still on disk.
    pub producer_snapshot: Option<Vec<u8>>,
}

impl Partition {
    /// The oldest sealed segment not yet wholly in the remote tier and wholly below the
    /// high watermark and the last stable offset, if any.
    pub fn next_segment_to_upload(&self) -> Option<SealedSegment> {
        let state = self.state.lock();
        if state.failed || state.retired {
            return None;
        }
        let uploaded_end = state.remote_tier.map_or(i64::MIN, |(_, end)| end);
        let committed = last_stable_offset(&state).min(state.high_watermark);
        let mut bases = state.segments.keys().copied();
        let mut base = bases.next()?;
        let unsealed = first_unsealed_base(&state);
        for end in bases {
            if end > committed || base >= unsealed {
                return None;
            }
            if end > uploaded_end {
                let segment = &state.segments[&base];
                let epochs = &state.epochs;
                let first = epochs.partition_point(|&(_, start)| start <= base).saturating_sub(1);
                let leader_epochs =
                    epochs[first..].iter().copied().take_while(|&(_, start)| start < end).collect::<Vec<_>>();
                let aborted =
                    state.aborted.iter().filter(|a| a.last_offset >= base && a.first_offset < end).copied().collect();
                let producer_snapshot = std::fs::read(self.dir.join(super::recovery::snapshot_file_name(end))).ok();
                return Some(SealedSegment {
                    base_offset: base,
                    end_offset: end,
                    size_bytes: segment.size_bytes(),
                    max_timestamp: segment.max_timestamp(),
                    file: match segment.file() {
                        Ok(file) => file,
                        Err(error) => {
                            tracing::warn!(dir = %self.dir.display(), base, %error, "cannot open a sealed segment to upload it");
                            return None;
                        }
                    },
                    index: segment.index_image(),
                    leader_epochs,
                    aborted,
                    producer_snapshot,
                });
            }
            base = end;
        }
        None
    }

    /// Records that the remote tier holds `[start, end)` (committed by the tiering layer):
    /// local segments below `end` may now leave the disk by local retention, and reads in
    /// `[start, local log start)` go to the remote tier. `None`: nothing is remote.
    pub fn set_remote_tier(&self, tier: Option<(i64, i64)>) {
        let mut state = self.state.lock();
        if state.remote_tier != tier {
            state.remote_tier = tier;
            self.publish(&state);
        }
    }

    /// The remote range last set with [`Partition::set_remote_tier`].
    pub fn remote_tier(&self) -> Option<(i64, i64)> {
        self.state.lock().remote_tier
    }

    /// Bytes of the local segments from the one holding `offset` on (what is only local,
    /// for the whole log's `retention.bytes`).
    pub fn size_bytes_from(&self, offset: i64) -> u64 {
        let state = self.state.lock();
        let first = state.segments.range(..=offset).next_back().map_or(i64::MIN, |(&base, _)| base);
        state.segments.range(first..).map(|(_, s)| s.size_bytes()).sum()
    }

    /// The first offset readers can have, remote tier included.
    pub fn first_readable_offset(&self) -> i64 {
        first_readable_offset(&self.state.lock())
    }
}
