//! Length-prefixed framing: `int32 size` then `size` bytes.

use bytes::{Buf, Bytes, BytesMut};

pub const FRAME_SIZE_PREFIX_BYTES: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: i64, limit: usize },
    #[error("negative frame size {0}")]
    Negative(i32),
}

/// Bytes of a frame body that carry its request's API key (the first field of the header).
pub const FRAME_API_KEY_BYTES: usize = 2;

/// What the first bytes of a frame tell before its body is read: what a connection needs
/// to charge the request to a memory budget before buffering it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    /// Body bytes (the size prefix excluded), at most the limit given to [`peek_frame`].
    pub size: usize,
    /// The request's API key; `None` for a frame too short to hold one (it cannot decode).
    pub api_key: Option<i16>,
}

/// Reads the size prefix (checked against `frame_bytes_max`, as [`decode_frame`] does) and
/// the API key of the frame at the front of `buffer` without taking anything off it.
/// `Ok(None)`: fewer than the 4 + 2 bytes needed are buffered.
pub fn peek_frame(buffer: &[u8], frame_bytes_max: usize) -> Result<Option<FrameHead>, FrameError> {
    let Some(size) = frame_size(buffer, frame_bytes_max)? else {
        return Ok(None);
    };
    if size < FRAME_API_KEY_BYTES {
        return Ok(Some(FrameHead { size, api_key: None }));
    }
    let Some(key) = buffer.get(FRAME_SIZE_PREFIX_BYTES..FRAME_SIZE_PREFIX_BYTES + FRAME_API_KEY_BYTES) else {
        return Ok(None);
    };
    Ok(Some(FrameHead { size, api_key: Some(i16::from_be_bytes([key[0], key[1]])) }))
}

/// The checked size prefix of the frame at the front of `buffer`, if buffered.
fn frame_size(buffer: &[u8], frame_bytes_max: usize) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buffer.get(..FRAME_SIZE_PREFIX_BYTES) else {
        return Ok(None);
    };
    let size = i32::from_be_bytes(prefix.try_into().expect("4 bytes"));
    if size < 0 {
        return Err(FrameError::Negative(size));
    }
    let size = size as usize;
    if size > frame_bytes_max {
        return Err(FrameError::TooLarge { size: size as i64, limit: frame_bytes_max });
    }
    Ok(Some(size))
}

/// Takes one complete frame (without its size prefix) off the front of `buffer`, or
/// returns `Ok(None)` when more bytes are needed. The size is checked against
/// `frame_bytes_max` before anything is buffered for it; room for the rest of the frame
/// is then reserved in `buffer` (broker connections charge a memory budget first:
/// they call this only once the whole frame is buffered).
pub fn decode_frame(buffer: &mut BytesMut, frame_bytes_max: usize) -> Result<Option<Bytes>, FrameError> {
    let Some(size) = frame_size(buffer, frame_bytes_max)? else {
        return Ok(None);
    };
    if buffer.len() < FRAME_SIZE_PREFIX_BYTES + size {
        buffer.reserve(FRAME_SIZE_PREFIX_BYTES + size - buffer.len());
        return Ok(None);
    }
    buffer.advance(FRAME_SIZE_PREFIX_BYTES);
    Ok(Some(buffer.split_to(size).freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_split_and_limits_enforced() {
        let mut buffer = BytesMut::from(&[0u8, 0, 0, 3, 1, 2, 3, 0, 0][..]);
        assert_eq!(decode_frame(&mut buffer, 10).unwrap().unwrap().as_ref(), &[1, 2, 3]);
        assert_eq!(decode_frame(&mut buffer, 10).unwrap(), None);
        let mut huge = BytesMut::from(&200_000_000i32.to_be_bytes()[..]);
        assert!(matches!(decode_frame(&mut huge, 100), Err(FrameError::TooLarge { .. })));
        let mut negative = BytesMut::from(&(-1i32).to_be_bytes()[..]);
        assert_eq!(decode_frame(&mut negative, 100), Err(FrameError::Negative(-1)));
    }

    #[test]
    fn frame_heads_are_read_without_consuming() {
        // Size prefix only: the API key is still missing.
        assert_eq!(peek_frame(&[0, 0, 0, 10], 100), Ok(None));
        assert_eq!(peek_frame(&[0, 0, 0, 10, 0], 100), Ok(None));
        let head = [0u8, 0, 0x10, 0, 0, 18, 0, 4];
        assert_eq!(peek_frame(&head, 1 << 20), Ok(Some(FrameHead { size: 0x1000, api_key: Some(18) })));
        // Frames too short for an API key are told at once (they fail to decode later).
        assert_eq!(peek_frame(&[0, 0, 0, 1], 100), Ok(Some(FrameHead { size: 1, api_key: None })));
        assert_eq!(peek_frame(&[0, 0, 0, 0], 100), Ok(Some(FrameHead { size: 0, api_key: None })));
        // The limits are those of decode_frame, checked on the prefix alone.
        assert!(matches!(peek_frame(&[0, 0x10, 0, 0], 1000), Err(FrameError::TooLarge { size: 0x100000, .. })));
        assert_eq!(peek_frame(&(-5i32).to_be_bytes(), 100), Err(FrameError::Negative(-5)));
        assert_eq!(peek_frame(&[], 100), Ok(None));
        // Peeking leaves the frame for decode_frame.
        let mut buffer = BytesMut::from(&[0u8, 0, 0, 3, 0, 7, 9, 0, 0][..]);
        assert_eq!(peek_frame(&buffer, 10), Ok(Some(FrameHead { size: 3, api_key: Some(7) })));
        assert_eq!(decode_frame(&mut buffer, 10).unwrap().unwrap().as_ref(), &[0, 7, 9]);
        assert_eq!(peek_frame(&buffer, 10), Ok(None));
    }
}
