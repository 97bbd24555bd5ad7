//! CRC-32C (Castagnoli), the checksum of every frame and of the file header.
//!
//! Reflected polynomial `0x82F63B78`, initial value and final XOR `0xFFFFFFFF`: the CRC of
//! iSCSI (RFC 3720), ext4 and SSE4.2's `crc32` instruction. Table-driven, slicing by eight
//! (about a byte per cycle per table lookup), written here rather than taken as a dependency
//! since it is forty lines and must never change.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// Eight 256-entry tables: `TABLES[0]` is the classic byte table, `TABLES[k][b]` the CRC of
/// byte `b` followed by `k` zero bytes.
static TABLES: [[u32; 256]; 8] = make_tables();

const fn make_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][i] = crc;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = tables[k - 1][i];
            tables[k][i] = (prev >> 8) ^ tables[0][(prev & 0xFF) as usize];
            i += 1;
        }
        k += 1;
    }
    tables
}

/// A running CRC-32C over bytes fed in pieces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Crc32c(u32);

impl Crc32c {
    /// A CRC over no bytes yet.
    pub(crate) const fn new() -> Self {
        Self(!0)
    }

    /// Feeds `bytes`.
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        let mut crc = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let lo = crc ^ u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            crc = TABLES[7][(lo & 0xFF) as usize]
                ^ TABLES[6][((lo >> 8) & 0xFF) as usize]
                ^ TABLES[5][((lo >> 16) & 0xFF) as usize]
                ^ TABLES[4][(lo >> 24) as usize]
                ^ TABLES[3][usize::from(chunk[4])]
                ^ TABLES[2][usize::from(chunk[5])]
                ^ TABLES[1][usize::from(chunk[6])]
                ^ TABLES[0][usize::from(chunk[7])];
        }
        for &byte in chunks.remainder() {
            crc = (crc >> 8) ^ TABLES[0][((crc ^ u32::from(byte)) & 0xFF) as usize];
        }
        self.0 = crc;
    }

    /// The CRC of everything fed so far.
    pub(crate) const fn finish(self) -> u32 {
        !self.0
    }
}

/// The CRC-32C of `bytes`.
pub(crate) fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = Crc32c::new();
    crc.update(bytes);
    crc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bit-at-a-time definition, to check the sliced tables against.
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
    }

    proptest::proptest! {
        #[test]
        fn sliced_matches_bitwise_and_pieces_match_whole(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
            cut in 0usize..200,
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
