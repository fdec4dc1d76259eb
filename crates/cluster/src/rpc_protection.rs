//! How controller RPC frames are protected with the secret the controllers share, so that
//! nobody without it can read, forge, alter or replay them.
//!
//! Each connection starts with a random nonce from the server. Its frames are then
//! **encrypted**: ChaCha20-Poly1305 under a key derived from the secret and that nonce
//! (HMAC-SHA256(secret, label | nonce)), the AEAD nonce being the frame's direction and its
//! sequence number on the connection, so no key and nonce pair is ever used twice and a
//! frame replayed, reordered or sent back the other way does not open.
//!
//! The older framing, **signed** frames (HMAC-SHA256 over direction, nonce, sequence and the
//! body, in clear), is still spoken with nodes that know no other: a server takes a first
//! frame that does not decrypt but verifies as signed, and answers in kind; a client whose
//! encrypted first frame is closed unanswered speaks signed frames to that peer for a while
//! ([`crate::rpc`]). Either way a frame without the secret is refused.

use std::io;

use ring::aead::{LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};

/// Bytes of the nonce a server sends first.
pub(crate) const NONCE_BYTES: usize = 16;
/// Bytes of a signed frame's MAC (HMAC-SHA256).
const MAC_BYTES: usize = 32;
/// Bytes of an encrypted frame's tag.
const TAG_BYTES: usize = 16;

/// Which way a frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    Request,
    Response,
}

impl Direction {
    /// What signed frames' MACs begin with.
    fn label(self) -> &'static [u8] {
        match self {
            Direction::Request => b"sluice-rpc-request",
            Direction::Response => b"sluice-rpc-response",
        }
    }

    /// The first byte of an encrypted frame's AEAD nonce.
    fn nonce_byte(self) -> u8 {
        match self {
            Direction::Request => 1,
            Direction::Response => 2,
        }
    }
}

/// How a connection's frames are protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protection {
    Encrypted,
    Signed,
}

/// One connection's protection: the server's nonce, the next exchange's sequence number,
/// and the keys derived for it.
pub(crate) struct FrameCipher {
    nonce: [u8; NONCE_BYTES],
    pub(crate) sequence: u64,
    pub(crate) protection: Protection,
    secret: std::sync::Arc<[u8]>,
    key: LessSafeKey,
}

impl FrameCipher {
    pub(crate) fn new(secret: std::sync::Arc<[u8]>, nonce: [u8; NONCE_BYTES], protection: Protection) -> FrameCipher {
        let key_bytes = hmac(&secret, &[b"sluice-rpc-encryption-key", &nonce]);
        let key = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key_bytes).expect("a 32-byte key"));
        FrameCipher { nonce, sequence: 0, protection, secret, key }
    }

    /// `[length][body]` as it goes on the wire.
    pub(crate) fn seal(&self, direction: Direction, frame: Vec<u8>) -> io::Result<Vec<u8>> {
        let mut body = frame;
        body.drain(..4);
        let sealed = match self.protection {
            Protection::Signed => {
                let mut sealed = self.mac(direction, &body).to_vec();
                sealed.extend_from_slice(&body);
                sealed
            }
            Protection::Encrypted => {
                self.key
                    .seal_in_place_append_tag(self.aead_nonce(direction), ring::aead::Aad::empty(), &mut body)
                    .map_err(|_| io::Error::other("encrypting a frame failed"))?;
                body
            }
        };
        let length = u32::try_from(sealed.len()).map_err(io::Error::other)?;
        let mut framed = Vec::with_capacity(4 + sealed.len());
        framed.extend_from_slice(&length.to_be_bytes());
        framed.extend_from_slice(&sealed);
        Ok(framed)
    }

    /// The body of a received frame, decrypted or its MAC checked; `PermissionDenied` when
    /// it was not made with the secret for this connection, direction and sequence.
    pub(crate) fn open(&self, direction: Direction, frame: Vec<u8>) -> io::Result<Vec<u8>> {
        match self.protection {
            Protection::Signed => self.verify(direction, frame),
            Protection::Encrypted => {
                let mut frame = frame;
                let opened = self
                    .key
                    .open_in_place(self.aead_nonce(direction), ring::aead::Aad::empty(), &mut frame)
                    .map_err(|_| denied("frame does not decrypt (wrong rpc secret?)"))?;
                let length = opened.len();
                frame.truncate(length);
                Ok(frame)
            }
        }
    }

    /// A server's first frame from a client: encrypted, or else signed (a node that speaks
    /// only signed frames), which then becomes the connection's protection.
    pub(crate) fn open_first(&mut self, frame: Vec<u8>) -> io::Result<Vec<u8>> {
        assert_eq!(self.sequence, 0, "the first frame of a connection");
        if frame.len() >= TAG_BYTES {
            if let Ok(body) = self.open(Direction::Request, frame.clone()) {
                return Ok(body);
            }
        }
        let body = self.verify(Direction::Request, frame)?;
        self.protection = Protection::Signed;
        Ok(body)
    }

    fn verify(&self, direction: Direction, frame: Vec<u8>) -> io::Result<Vec<u8>> {
        if frame.len() < MAC_BYTES {
            return Err(denied("frame without a MAC"));
        }
        let (received, body) = frame.split_at(MAC_BYTES);
        let expected = self.mac(direction, body);
        let same = received.iter().zip(expected.iter()).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0;
        if !same {
            return Err(denied("frame MAC does not verify (wrong rpc secret?)"));
        }
        Ok(body.to_vec())
    }

    fn mac(&self, direction: Direction, body: &[u8]) -> [u8; MAC_BYTES] {
        hmac(&self.secret, &[direction.label(), &self.nonce, &self.sequence.to_be_bytes(), body])
    }

    fn aead_nonce(&self, direction: Direction) -> Nonce {
        let mut nonce = [0u8; 12];
        nonce[0] = direction.nonce_byte();
        nonce[4..].copy_from_slice(&self.sequence.to_be_bytes());
        Nonce::assume_unique_for_key(nonce)
    }
}

fn hmac(secret: &[u8], parts: &[&[u8]]) -> [u8; MAC_BYTES] {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

fn denied(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(secret: &[u8], protection: Protection) -> FrameCipher {
        FrameCipher::new(std::sync::Arc::from(secret), [7; NONCE_BYTES], protection)
    }

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        frame
    }

    #[test]
    fn encrypted_frames_hide_their_body_and_open_only_as_sent() {
        let ours = session(b"a-secret-of-enough-bytes", Protection::Encrypted);
        let sealed = ours.seal(Direction::Request, frame(b"{\"visible\":true}")).unwrap();
        assert!(!sealed.windows(7).any(|window| window == b"visible"), "the body is in clear");
        let body = sealed[4..].to_vec();
        assert_eq!(ours.open(Direction::Request, body.clone()).unwrap(), b"{\"visible\":true}");
        // Sent back the other way, replayed at another sequence, or under another secret.
        assert!(ours.open(Direction::Response, body.clone()).is_err());
        let mut later = session(b"a-secret-of-enough-bytes", Protection::Encrypted);
        later.sequence = 1;
        assert!(later.open(Direction::Request, body.clone()).is_err());
        let theirs = session(b"another-secret-of-enough", Protection::Encrypted);
        assert_eq!(theirs.open(Direction::Request, body).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn a_server_takes_a_signed_first_frame_and_answers_signed() {
        let client = session(b"a-secret-of-enough-bytes", Protection::Signed);
        let sealed = client.seal(Direction::Request, frame(b"hello")).unwrap();
        let mut server = session(b"a-secret-of-enough-bytes", Protection::Encrypted);
        assert_eq!(server.open_first(sealed[4..].to_vec()).unwrap(), b"hello");
        assert_eq!(server.protection, Protection::Signed);
        let answer = server.seal(Direction::Response, frame(b"hi")).unwrap();
        assert_eq!(client.open(Direction::Response, answer[4..].to_vec()).unwrap(), b"hi");
        // A frame in clear, as a forger writes one, is neither.
        let mut server = session(b"a-secret-of-enough-bytes", Protection::Encrypted);
        let forged = [[0u8; MAC_BYTES].as_slice(), b"{\"Write\":{}}"].concat();
        assert_eq!(server.open_first(forged).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
    }
}
