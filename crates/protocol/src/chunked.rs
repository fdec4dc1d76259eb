//! An encoding buffer that references large payloads instead of copying them.
//!
//! A Fetch response is mostly record batches read from the log. Encoding it into one
//! `BytesMut` would copy every batch a second time (after the `pread`). [`ChunkedBuf`]
//! implements the codec's buffer trait: small fields are copied into the current chunk,
//! while a `put_slice` of a registered payload (same pointer and length) closes the chunk
//! and appends the payload's `Bytes` itself. The chunks then go to the socket with a
//! vectored write.

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::buf::ByteBufMut;

/// Payloads smaller than this are copied: a separate chunk would cost more than the copy.
pub const ZERO_COPY_BYTES_MIN: usize = 4096;
const CHUNK_CAPACITY_BYTES: usize = 4096;

pub struct ChunkedBuf {
    done: Vec<Bytes>,
    current: BytesMut,
    /// Payloads that may be referenced rather than copied.
    payloads: Vec<Bytes>,
    length: usize,
}

impl ChunkedBuf {
    pub fn new(payloads: Vec<Bytes>) -> ChunkedBuf {
        ChunkedBuf { done: Vec::new(), current: BytesMut::with_capacity(CHUNK_CAPACITY_BYTES), payloads, length: 0 }
    }

    pub fn len(&self) -> usize {
        self.length
    }

    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    pub fn into_chunks(mut self) -> Vec<Bytes> {
        self.close_chunk();
        self.done
    }

    fn close_chunk(&mut self) {
        if !self.current.is_empty() {
            self.done.push(self.current.split().freeze());
        }
    }

    fn registered(&self, src: &[u8]) -> Option<Bytes> {
        if src.len() < ZERO_COPY_BYTES_MIN {
            return None;
        }
        self.payloads.iter().find(|p| p.as_ptr() == src.as_ptr() && p.len() == src.len()).cloned()
    }
}

// SAFETY: every method delegates to the inner BytesMut, whose chunk_mut/advance_mut contract
// holds; `length` only mirrors how many bytes were committed.
unsafe impl BufMut for ChunkedBuf {
    fn remaining_mut(&self) -> usize {
        usize::MAX - self.length
    }

    unsafe fn advance_mut(&mut self, count: usize) {
        unsafe { self.current.advance_mut(count) };
        self.length += count;
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        if self.current.capacity() == self.current.len() {
            self.current.reserve(CHUNK_CAPACITY_BYTES);
        }
        self.current.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        if let Some(payload) = self.registered(src) {
            self.close_chunk();
            self.done.push(payload);
        } else {
            self.current.extend_from_slice(src);
        }
        self.length += src.len();
    }
}

impl ByteBufMut for ChunkedBuf {
    fn offset(&self) -> usize {
        self.length
    }

    /// Gaps are only ever filled within the current chunk (message encoders do not use
    /// them; record encoders write into their own buffers).
    fn seek(&mut self, offset: usize) {
        let chunk_start = self.length - self.current.len();
        assert!(offset >= chunk_start, "seek before the current chunk");
        self.current.resize(offset - chunk_start, 0);
        self.length = offset;
    }

    fn range(&mut self, r: std::ops::Range<usize>) -> &mut [u8] {
        let chunk_start = self.length - self.current.len();
        assert!(r.start >= chunk_start, "range before the current chunk");
        &mut self.current[r.start - chunk_start..r.end - chunk_start]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_payloads_are_referenced_and_the_rest_copied() {
        let payload = Bytes::from(vec![7u8; 10_000]);
        let mut buf = ChunkedBuf::new(vec![payload.clone()]);
        buf.put_u32(1);
        buf.put_slice(&payload);
        buf.put_slice(&vec![1u8; 5000]);
        buf.put_u8(9);
        assert_eq!(buf.len(), 4 + 10_000 + 5000 + 1);
        let chunks = buf.into_chunks();
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[1].as_ptr(), payload.as_ptr(), "payload not copied");
        let joined: Vec<u8> = chunks.concat();
        assert_eq!(joined.len(), 15_005);
        assert_eq!(&joined[..4], &[0, 0, 0, 1]);
        assert_eq!(joined[15_004], 9);
    }
}
