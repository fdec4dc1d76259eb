//! CRC32C (Castagnoli): the checksum of Kafka's record batches and of the broker's own
//! files (WAL records, indexes, snapshots). Every byte a producer sends is checksummed on
//! the produce path twice (the batch's CRC checked, the WAL record's computed), so its speed
//! is a part of the CPU per byte at the peak. `crc-fast` folds with carry-less multiplies
//! (VPCLMULQDQ where the CPU has it, chosen at run time) and checksums cached bytes several
//! times faster than the SSE4.2 instruction alone; its CRC-32/ISCSI is the standard CRC32C.

use crc_fast::{CrcAlgorithm, Digest};

/// The CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

/// The CRC32C of the bytes whose CRC32C is `crc` followed by `bytes`.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    // The digest's state is the register before the final inversion.
    let mut digest = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    digest.update(bytes);
    digest.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_check_value_whole_and_in_pieces() {
        // CRC-32/ISCSI's check value, the CRC of the nine digits.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        for split in 0..=9 {
            let (head, tail) = b"123456789".split_at(split);
            assert_eq!(crc32c_append(crc32c(head), tail), 0xe306_9283, "split at {split}");
        }
        // Long enough for the folding paths, in uneven pieces.
        let long: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let whole = crc32c(&long);
        let pieces = long.chunks(4093).fold(0, crc32c_append);
        assert_eq!(pieces, whole);
    }
}
