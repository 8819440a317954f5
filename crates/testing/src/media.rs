//! Test media: bytes that look like an image to a compressor (none of them
//! repeat), so sizes on disk and on the wire are those of real media.

/// `len` pseudo-random bytes (xorshift), the same for the same `seed` and
/// different for different ones.
pub fn media_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_exact_and_seeds_differ() {
        assert_eq!(media_bytes(1_001, 1).len(), 1_001);
        assert_eq!(media_bytes(64, 1), media_bytes(64, 1));
        assert_ne!(media_bytes(64, 1), media_bytes(64, 2));
    }
}
