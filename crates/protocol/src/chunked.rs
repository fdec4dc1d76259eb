//! An encoding buffer that references large payloads instead of copying them.
//!
//! A Fetch response is mostly record batches read from the log. Encoding it into one
//! `BytesMut` would copy every batch a second time (after the `pread`). [`ChunkedBuf`]
//! implements the codec's buffer trait: small fields are copied into the current chunk,
//! while a `put_slice` of a registered payload (same pointer and length) closes the chunk
//! and appends the payload's `Bytes` itself. The chunks then go to the socket with a
//! vectored write.
//!
//! Records that are not one buffer are spliced in: records to be sent straight from a
//! segment file (`sendfile`, plaintext connections) are not in memory at all, and records
//! read across several tail chunks are in several buffers. The response carries a
//! placeholder of their length ([`records_placeholder`], bytes that are never read) and the
//! encoder swaps it for what it stands for ([`Spliced`]): a [`ResponseChunk::File`], or the
//! buffers as [`ResponseChunk::Bytes`] one after the other. The codec only sees a slice of
//! the right length.

use std::fs::File;
use std::sync::Arc;

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::buf::ByteBufMut;

/// Payloads smaller than this are copied: a separate chunk would cost more than the copy.
pub const ZERO_COPY_BYTES_MIN: usize = 4096;
const CHUNK_CAPACITY_BYTES: usize = 4096;

/// Placeholders one response may carry (they are told apart by their address).
pub const PLACEHOLDERS_MAX: usize = 4096;
/// The longest placeholder: a read never returns more (the storage's `READ_BYTES_MAX`).
pub const PLACEHOLDER_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Placeholders are slices of this: placeholder `i` starts at byte `i`. It is never read
/// (the encoder recognises placeholders by address), so its pages are never touched.
///
/// Why in a cell: an immutable static of zeros is placed in `.rodata`, whose bytes are
/// written out in the binary (64 MiB of its 97 MiB, stripped); a static with interior
/// mutability is placed in `.bss`, which takes no room in the file and, untouched, no
/// memory either.
static PLACEHOLDERS: Placeholders = Placeholders(std::cell::UnsafeCell::new([0; PLACEHOLDERS_BYTES]));
const PLACEHOLDERS_BYTES: usize = PLACEHOLDERS_MAX + PLACEHOLDER_BYTES_MAX;

struct Placeholders(std::cell::UnsafeCell<[u8; PLACEHOLDERS_BYTES]>);

// SAFETY: nothing ever writes the bytes (no `&mut` to them is ever made), so shared
// references from any thread only ever see the zeros they start as.
unsafe impl Sync for Placeholders {}

impl Placeholders {
    fn bytes(&'static self) -> &'static [u8; PLACEHOLDERS_BYTES] {
        // SAFETY: see `impl Sync`: the cell's contents are never mutated, so a shared
        // reference to them is valid for the program's life.
        unsafe { &*self.0.get() }
    }
}

/// A piece of an encoded response.
#[derive(Debug, Clone)]
pub enum ResponseChunk {
    Bytes(Bytes),
    /// `length` bytes of `file` from `position`, sent from the page cache.
    File(FileChunk),
}

impl ResponseChunk {
    pub fn len(&self) -> usize {
        match self {
            ResponseChunk::Bytes(bytes) => bytes.len(),
            ResponseChunk::File(file) => file.length,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Bytes of a file that go into a response as they are.
#[derive(Debug, Clone)]
pub struct FileChunk {
    pub file: Arc<File>,
    pub position: u64,
    pub length: usize,
}

/// What a placeholder in a response's records stands for.
#[derive(Debug, Clone)]
pub enum Spliced {
    File(FileChunk),
    /// Buffers sent one after the other.
    Parts(Vec<Bytes>),
}

impl Spliced {
    pub fn len(&self) -> usize {
        match self {
            Spliced::File(file) => file.length,
            Spliced::Parts(parts) => parts.iter().map(Bytes::len).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The placeholder that stands for spliced records `index` (of `length` bytes) in a
/// response's records; `None` beyond [`PLACEHOLDERS_MAX`] of them or
/// [`PLACEHOLDER_BYTES_MAX`] bytes.
pub fn records_placeholder(index: usize, length: usize) -> Option<Bytes> {
    (index < PLACEHOLDERS_MAX && length <= PLACEHOLDER_BYTES_MAX)
        .then(|| Bytes::from_static(&PLACEHOLDERS.bytes()[index..index + length]))
}

/// Which spliced records `src` stands for, if it is a placeholder.
fn placeholder_index(src: &[u8]) -> Option<usize> {
    let base = PLACEHOLDERS.bytes().as_ptr() as usize;
    let at = (src.as_ptr() as usize).checked_sub(base)?;
    (at < PLACEHOLDERS_MAX && !src.is_empty()).then_some(at)
}

pub struct ChunkedBuf {
    done: Vec<ResponseChunk>,
    current: BytesMut,
    /// Payloads that may be referenced rather than copied.
    payloads: Vec<Bytes>,
    /// What placeholders stand for, by index.
    spliced: Vec<Spliced>,
    length: usize,
}

impl ChunkedBuf {
    pub fn new(payloads: Vec<Bytes>, spliced: Vec<Spliced>) -> ChunkedBuf {
        assert!(spliced.len() <= PLACEHOLDERS_MAX);
        ChunkedBuf {
            done: Vec::new(),
            current: BytesMut::with_capacity(CHUNK_CAPACITY_BYTES),
            payloads,
            spliced,
            length: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.length
    }

    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    pub fn into_chunks(mut self) -> Vec<ResponseChunk> {
        self.close_chunk();
        self.done
    }

    fn close_chunk(&mut self) {
        if !self.current.is_empty() {
            self.done.push(ResponseChunk::Bytes(self.current.split().freeze()));
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
        if let Some(index) = placeholder_index(src) {
            let spliced = self.spliced.get(index).expect("a placeholder stands for registered records").clone();
            assert_eq!(spliced.len(), src.len(), "a placeholder has its records' length");
            self.close_chunk();
            match spliced {
                Spliced::File(file) => self.done.push(ResponseChunk::File(file)),
                Spliced::Parts(parts) => self.done.extend(parts.into_iter().map(ResponseChunk::Bytes)),
            }
        } else if let Some(payload) = self.registered(src) {
            self.close_chunk();
            self.done.push(ResponseChunk::Bytes(payload));
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
        let mut buf = ChunkedBuf::new(vec![payload.clone()], Vec::new());
        buf.put_u32(1);
        buf.put_slice(&payload);
        buf.put_slice(&vec![1u8; 5000]);
        buf.put_u8(9);
        assert_eq!(buf.len(), 4 + 10_000 + 5000 + 1);
        let chunks: Vec<Bytes> = buf
            .into_chunks()
            .into_iter()
            .map(|chunk| match chunk {
                ResponseChunk::Bytes(bytes) => bytes,
                ResponseChunk::File(_) => panic!("no file chunk was registered"),
            })
            .collect();
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[1].as_ptr(), payload.as_ptr(), "payload not copied");
        let joined: Vec<u8> = chunks.concat();
        assert_eq!(joined.len(), 15_005);
        assert_eq!(&joined[..4], &[0, 0, 0, 1]);
        assert_eq!(joined[15_004], 9);
    }

    #[test]
    fn placeholders_become_their_file_chunks() {
        let file = Arc::new(tempfile_with(b"0123456789"));
        let chunk = |position, length| Spliced::File(FileChunk { file: file.clone(), position, length });
        let spliced = vec![chunk(0, 70_000), chunk(5, 70_000)];
        let (first, second) = (records_placeholder(0, 70_000).unwrap(), records_placeholder(1, 70_000).unwrap());
        let mut buf = ChunkedBuf::new(vec![first.clone(), second.clone()], spliced);
        buf.put_u8(1);
        buf.put_slice(&second);
        buf.put_slice(&first);
        assert_eq!(buf.len(), 1 + 140_000);
        let chunks = buf.into_chunks();
        let positions: Vec<Option<u64>> = chunks
            .iter()
            .map(|chunk| match chunk {
                ResponseChunk::File(file) => Some(file.position),
                ResponseChunk::Bytes(_) => None,
            })
            .collect();
        assert_eq!(positions, [None, Some(5), Some(0)]);
        assert!(records_placeholder(PLACEHOLDERS_MAX, 1).is_none());
        assert!(records_placeholder(0, PLACEHOLDER_BYTES_MAX + 1).is_none());
    }

    #[test]
    fn a_placeholder_of_parts_becomes_the_parts_themselves() {
        let parts = vec![Bytes::from(vec![1u8; 6000]), Bytes::from(vec![2u8; 100]), Bytes::from(vec![3u8; 9000])];
        let placeholder = records_placeholder(0, 15_100).unwrap();
        let mut buf = ChunkedBuf::new(vec![placeholder.clone()], vec![Spliced::Parts(parts.clone())]);
        buf.put_u8(1);
        buf.put_slice(&placeholder);
        buf.put_u8(9);
        let chunks: Vec<Bytes> = buf
            .into_chunks()
            .into_iter()
            .map(|chunk| match chunk {
                ResponseChunk::Bytes(bytes) => bytes,
                ResponseChunk::File(_) => panic!("no file was registered"),
            })
            .collect();
        assert_eq!(chunks.len(), 5);
        for (chunk, part) in chunks[1..4].iter().zip(&parts) {
            assert_eq!((chunk.as_ptr(), chunk.len()), (part.as_ptr(), part.len()), "parts are not copied");
        }
        assert_eq!((&chunks[0][..], &chunks[4][..]), (&[1u8][..], &[9u8][..]));
    }

    fn tempfile_with(content: &[u8]) -> File {
        let path = std::env::temp_dir().join(format!("sluice-chunked-{}", std::process::id()));
        std::fs::write(&path, content).unwrap();
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }
}
