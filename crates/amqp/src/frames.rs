//! Frames on the socket: bounded reads, `amq-protocol`'s parser and generator.
//!
//! Why the reader checks the frame header itself before parsing: a peer's size field
//! decides how much is buffered, so it is held to the negotiated `frame_max` first, and
//! a bad frame end or an unknown method gets the error code RabbitMQ sends (501, 540)
//! instead of a generic parse failure.

use std::io;

use amq_protocol::frame::{parse_frame, AMQPFrame};
use amq_protocol::protocol::constants::FRAME_END;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The bytes before a frame's payload: type, channel, size.
const FRAME_HEADER_BYTES: usize = 7;
/// The protocol header a 0-9-1 client opens with.
pub const PROTOCOL_HEADER: [u8; 8] = *b"AMQP\x00\x00\x09\x01";

/// AMQP's reply codes this server sends.
pub mod reply {
    pub const SUCCESS: u16 = 200;
    pub const CONTENT_TOO_LARGE: u16 = 311;
    pub const NO_ROUTE: u16 = 312;
    pub const ACCESS_REFUSED: u16 = 403;
    pub const NOT_FOUND: u16 = 404;
    pub const RESOURCE_LOCKED: u16 = 405;
    pub const PRECONDITION_FAILED: u16 = 406;
    pub const CONNECTION_FORCED: u16 = 320;
    pub const FRAME_ERROR: u16 = 501;
    pub const SYNTAX_ERROR: u16 = 502;
    pub const COMMAND_INVALID: u16 = 503;
    pub const CHANNEL_ERROR: u16 = 504;
    pub const UNEXPECTED_FRAME: u16 = 505;
    pub const RESOURCE_ERROR: u16 = 506;
    pub const NOT_ALLOWED: u16 = 530;
    pub const NOT_IMPLEMENTED: u16 = 540;
    pub const INTERNAL_ERROR: u16 = 541;
}

/// Why no frame could be read: the connection ends, with a connection.close carrying
/// `code` where there is one.
#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the socket (or it failed).
    Closed(io::Error),
    /// A frame the peer sent is wrong: (reply code, text).
    Invalid(u16, String),
}

pub struct FrameReader<R> {
    reader: R,
    frame_max: u32,
    buffer: Vec<u8>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(reader: R, frame_max: u32) -> FrameReader<R> {
        FrameReader { reader, frame_max, buffer: Vec::new() }
    }

    /// Frames larger than `frame_max` (header and end included) are refused from now on.
    pub fn set_frame_max(&mut self, frame_max: u32) {
        assert!(frame_max >= amq_protocol::protocol::constants::FRAME_MIN_SIZE);
        self.frame_max = frame_max;
    }

    pub async fn protocol_header(&mut self) -> io::Result<[u8; 8]> {
        let mut header = [0u8; 8];
        self.reader.read_exact(&mut header).await?;
        Ok(header)
    }

    pub async fn next(&mut self) -> Result<AMQPFrame, FrameError> {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        self.reader.read_exact(&mut header).await.map_err(FrameError::Closed)?;
        let size = u32::from_be_bytes(header[3..7].try_into().expect("4 bytes"));
        let whole = FRAME_HEADER_BYTES as u64 + u64::from(size) + 1;
        if whole > u64::from(self.frame_max) {
            let text = format!("frame size {whole} exceeds frame_max {}", self.frame_max);
            return Err(FrameError::Invalid(reply::FRAME_ERROR, text));
        }
        self.buffer.clear();
        self.buffer.extend_from_slice(&header);
        self.buffer.resize(whole as usize, 0);
        self.reader.read_exact(&mut self.buffer[FRAME_HEADER_BYTES..]).await.map_err(FrameError::Closed)?;
        if self.buffer[whole as usize - 1] != FRAME_END {
            return Err(FrameError::Invalid(reply::FRAME_ERROR, "frame does not end with 0xCE".into()));
        }
        match parse_frame(&self.buffer[..]) {
            Ok((_, frame)) => Ok(frame),
            Err(_) => Err(unparsable(header[0], &self.buffer[FRAME_HEADER_BYTES..whole as usize - 1])),
        }
    }
}

/// The error for a frame `amq-protocol` could not parse: an unknown frame type or method
/// is not implemented (540), anything else a syntax error (502).
fn unparsable(frame_type: u8, payload: &[u8]) -> FrameError {
    if !matches!(frame_type, 1 | 2 | 3 | 8) {
        return FrameError::Invalid(reply::FRAME_ERROR, format!("unknown frame type {frame_type}"));
    }
    if frame_type == 1 && payload.len() >= 4 {
        let class = u16::from_be_bytes([payload[0], payload[1]]);
        let method = u16::from_be_bytes([payload[2], payload[3]]);
        if !known_method(class, method) {
            return FrameError::Invalid(reply::NOT_IMPLEMENTED, format!("unknown method {class}.{method}"));
        }
        return FrameError::Invalid(reply::SYNTAX_ERROR, format!("malformed arguments of method {class}.{method}"));
    }
    FrameError::Invalid(reply::SYNTAX_ERROR, format!("malformed frame of type {frame_type}"))
}

/// The (class, method) ids of AMQP 0-9-1 with RabbitMQ's extensions.
fn known_method(class: u16, method: u16) -> bool {
    let methods: &[u16] = match class {
        10 => &[10, 11, 20, 21, 30, 31, 40, 41, 50, 51, 60, 61, 70, 71],
        20 => &[10, 11, 20, 21, 40, 41],
        30 => &[10, 11],
        40 => &[10, 11, 20, 21, 30, 31, 40, 51],
        50 => &[10, 11, 20, 21, 30, 31, 40, 41, 50, 51],
        60 => &[10, 11, 20, 21, 30, 31, 40, 50, 60, 70, 71, 72, 80, 90, 100, 110, 111, 120],
        85 => &[10, 11],
        90 => &[10, 11, 20, 21, 30, 31],
        _ => &[],
    };
    methods.contains(&method)
}

/// A frame's bytes on the wire.
pub fn encode(frame: &AMQPFrame) -> Vec<u8> {
    let (bytes, _) = cookie_factory::gen(amq_protocol::frame::gen_frame(frame), Vec::new())
        .expect("a frame serializes into a growable buffer");
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::protocol::{basic, AMQPClass};

    async fn read(bytes: Vec<u8>, frame_max: u32) -> Result<AMQPFrame, FrameError> {
        FrameReader::new(&bytes[..], frame_max).next().await
    }

    #[tokio::test]
    async fn a_frame_reads_back_as_written() {
        let frame = AMQPFrame::Method(
            3,
            AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack { delivery_tag: 7, multiple: true })),
        );
        assert_eq!(read(encode(&frame), 8192).await.unwrap(), frame);
    }

    #[tokio::test]
    async fn oversized_frames_bad_ends_and_unknown_methods_get_their_codes() {
        let body = AMQPFrame::Body(1, vec![0; 9000]);
        assert!(matches!(read(encode(&body), 8192).await, Err(FrameError::Invalid(reply::FRAME_ERROR, _))));
        let mut bad_end = encode(&AMQPFrame::Heartbeat);
        *bad_end.last_mut().unwrap() = 0;
        assert!(matches!(read(bad_end, 8192).await, Err(FrameError::Invalid(reply::FRAME_ERROR, _))));
        let unknown = vec![1, 0, 1, 0, 0, 0, 4, 0, 99, 0, 1, FRAME_END];
        assert!(matches!(read(unknown, 8192).await, Err(FrameError::Invalid(reply::NOT_IMPLEMENTED, _))));
        let truncated_args = vec![1, 0, 1, 0, 0, 0, 5, 0, 60, 0, 80, 1, FRAME_END];
        assert!(matches!(read(truncated_args, 8192).await, Err(FrameError::Invalid(reply::SYNTAX_ERROR, _))));
    }
}
