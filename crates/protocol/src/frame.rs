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

/// Takes one complete frame (without its size prefix) off the front of `buffer`, or
/// returns `Ok(None)` when more bytes are needed. The size is checked against
/// `frame_bytes_max` before anything is buffered for it.
pub fn decode_frame(buffer: &mut BytesMut, frame_bytes_max: usize) -> Result<Option<Bytes>, FrameError> {
    if buffer.len() < FRAME_SIZE_PREFIX_BYTES {
        return Ok(None);
    }
    let size = i32::from_be_bytes(buffer[..4].try_into().expect("4 bytes"));
    if size < 0 {
        return Err(FrameError::Negative(size));
    }
    let size = size as usize;
    if size > frame_bytes_max {
        return Err(FrameError::TooLarge { size: size as i64, limit: frame_bytes_max });
    }
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
}
