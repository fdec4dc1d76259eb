//! Arbitrary socket bytes through framing and request decoding: must never panic.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: sluice_protocol::GuardedAllocator = sluice_protocol::GuardedAllocator;

fuzz_target!(|data: &[u8]| {
    let mut buffer = BytesMut::from(data);
    while let Ok(Some(frame)) = sluice_protocol::decode_frame(&mut buffer, 1 << 20) {
        let _ = sluice_protocol::parse_request(frame);
    }
    let _ = sluice_protocol::parse_request(bytes::Bytes::copy_from_slice(data));
});
