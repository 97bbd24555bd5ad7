//! CRC-32C (Castagnoli), the checksum of every frame and of the file header.
//!
//! Reflected polynomial `0x82F63B78`, initial value and final XOR `0xFFFFFFFF`: the CRC of
//! iSCSI (RFC 3720), ext4 and SSE4.2's `crc32` instruction. Computed by the `crc32c` crate,
//! which uses the SSE4.2 / ARMv8 CRC instructions where the CPU has them and a table-driven
//! fallback elsewhere; the values are the same everywhere and pinned by the vectors below.

/// A running CRC-32C over bytes fed in pieces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Crc32c(u32);

impl Crc32c {
    /// A CRC over no bytes yet.
    pub(crate) const fn new() -> Self {
        Self(0)
    }

    /// Feeds `bytes`.
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0 = ::crc32c::crc32c_append(self.0, bytes);
    }

    /// The CRC of everything fed so far.
    pub(crate) const fn finish(self) -> u32 {
        self.0
    }
}

/// The CRC-32C of `bytes`.
pub(crate) fn crc32c(bytes: &[u8]) -> u32 {
    ::crc32c::crc32c(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reflected Castagnoli polynomial.
    const POLY: u32 = 0x82F6_3B78;

    /// The bit-at-a-time definition, to check the crate against.
    fn reference(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in bytes {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ POLY
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn known_vectors() {
        // The catalogue "check" value of CRC-32/ISCSI.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(b"a"), 0xC1D0_4330);
        // RFC 3720, appendix B.4.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
        let descending: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(crc32c(&descending), 0x113F_DB5C);
        // Fed in pieces, the same value.
        let mut crc = Crc32c::new();
        crc.update(b"1234");
        crc.update(b"");
        crc.update(b"56789");
        assert_eq!(crc.finish(), 0xE306_9283);
    }

    proptest::proptest! {
        #[test]
        fn crate_matches_bitwise_and_pieces_match_whole(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
            cut in 0usize..600,
        ) {
            let cut = cut.min(bytes.len());
            let mut crc = Crc32c::new();
            crc.update(&bytes[..cut]);
            crc.update(&bytes[cut..]);
            proptest::prop_assert_eq!(crc.finish(), reference(&bytes));
            proptest::prop_assert_eq!(crc32c(&bytes), reference(&bytes));
        }
    }
}
