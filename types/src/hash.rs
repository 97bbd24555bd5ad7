//! FNV-1a, the one small hash the workspace uses where a value must be the same on every
//! machine and in every Rust version (call ids, the freshener's jitter, a listing's
//! connection fingerprint, an advisory-lock key). Not for anything an adversary chooses
//! to collide.

/// FNV-1a (64 bits) of `bytes`, its offset basis mixed with `salt` (0 for the plain hash;
/// a previous hash to chain).
pub fn fnv1a(bytes: &[u8], salt: u64) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64 ^ salt;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    #[test]
    fn fnv1a_is_the_published_function() {
        // The reference values of FNV-1a 64 (Fowler, Noll, Vo).
        assert_eq!(super::fnv1a(b"", 0), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::fnv1a(b"a", 0), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(super::fnv1a(b"foobar", 0), 0x8594_4171_f739_67e8);
    }
}
