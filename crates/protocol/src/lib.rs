//! The Kafka wire protocol as Sluice speaks it: framing, request decoding, response
//! encoding and the table of API versions we advertise.
//!
//! Only this crate turns socket bytes into requests. Message codecs come from the
//! `kafka-protocol` crate; this crate adds the parts a broker needs around them: size
//! limits on frames, header versions per API, the distinction between an unknown API, an
//! unsupported version and a malformed body (each answered differently), and the
//! ApiVersions rule that its response header is always v0.

mod alloc_guard;
mod chunked;
mod client;
mod frame;
mod records;
mod request;
mod share_wire;
mod versions;

pub use crate::alloc_guard::{GuardedAllocator, LAZY_ALLOCATION_BYTES_MIN};
pub use crate::chunked::{
    records_placeholder, ChunkedBuf, FileChunk, ResponseChunk, Spliced, PLACEHOLDERS_MAX, PLACEHOLDER_BYTES_MAX,
    ZERO_COPY_BYTES_MIN,
};
pub use crate::client::{decode_response, encode_request};
pub use crate::frame::{decode_frame, peek_frame, FrameError, FrameHead, FRAME_API_KEY_BYTES, FRAME_SIZE_PREFIX_BYTES};
pub use crate::records::new_record;
pub use crate::request::{encode_response, parse_forwarded_request, parse_request, Request, RequestError};
pub use crate::share_wire::{
    ask_for_queue_depth, ask_to_discard_ready, asks_for_queue_depth, discard_ready_asked, discarded, queue_depth,
    set_acknowledge_lock_timeout_ms, set_described_lag, set_discarded, set_queue_depth, set_share_acknowledge_renew,
    set_share_fetch_options, share_acknowledge_is_renew, share_fetch_options, ShareAcquireMode, ShareFetchOptions,
};
pub use crate::versions::{api_versions_response, supported_range, ADVERTISED_APIS, PRODUCE_MIN_ACCEPTED_VERSION};
pub use kafka_protocol;

#[cfg(test)]
#[global_allocator]
static ALLOCATOR: GuardedAllocator = GuardedAllocator;
