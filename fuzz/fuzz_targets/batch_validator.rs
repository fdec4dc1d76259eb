//! Arbitrary bytes through the record batch validator and iterator: must never panic, and
//! whatever validates must describe itself consistently.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_storage::batch::{validate_batch, BatchIter};

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = validate_batch(data) {
        assert_eq!(header.total_bytes(), data.len());
        assert!(header.last_offset() >= header.base_offset);
    }
    for item in BatchIter::new(data) {
        if let Ok((header, range)) = item {
            assert_eq!(range.len(), header.total_bytes());
        }
    }
});
