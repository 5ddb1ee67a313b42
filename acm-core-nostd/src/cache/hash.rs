//! A small, fast, non-allocating keyed hash for the cache maps.
//!
//! A folded-multiply mixer in the style of wyhash / foldhash: each 64-bit chunk is XORed into the
//! state and the 128-bit product with an odd constant is folded back to 64 bits. It is not a
//! cryptographic hash; the caller-chosen `seed` makes bucket placement unpredictable to a remote
//! party, and the maps bound chain length anyway (see `map::MAX_CHAIN`).

const MUL: u64 = 0x9E37_79B9_7F4A_7C15;
const MUL2: u64 = 0xD6E8_FEB8_6659_FD93;

/// Folded multiply: the high and low halves of the 128-bit product, XORed.
#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = (a as u128).wrapping_mul(b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

/// Hashes a slice of 32-bit words with `seed`.
#[inline]
pub fn hash_words(seed: u64, words: &[u32]) -> u64 {
    let mut h = seed ^ MUL2;
    // Plain index loop: keeps debug builds (tests) fast too.
    let mut i = 0;
    while i + 1 < words.len() {
        let w = (words[i] as u64) | ((words[i + 1] as u64) << 32);
        h = fold_mul(h ^ w, MUL);
        i += 2;
    }
    if i < words.len() {
        h = fold_mul(h ^ (words[i] as u64), MUL);
    }
    fold_mul(h ^ (words.len() as u64), MUL2)
}

const K: [u64; 6] = [
    0xA076_1D64_78BD_642F,
    0xE703_7ED1_A0B4_28DB,
    0x8EBC_6AF0_9C88_C6E3,
    0x5899_65CC_7537_4CC3,
    0x1D8E_4E27_C47D_124F,
    0x2D35_8DCC_AA6C_78A5,
];

/// Hashes a packed cache key in one pass: the words are taken as 64-bit chunks, each pair of
/// chunks is multiplied (folded) with seed-dependent secrets independently of the others
/// (wyhash style, so the multiplies overlap instead of forming a chain), and the products are
/// folded once more. A 10-word `PathKey` costs 3 + 1 multiplies.
#[inline(always)]
pub fn hash_key<const N: usize>(seed: u64, words: &[u32; N]) -> u64 {
    let chunk = |i: usize| -> u64 {
        let lo = if 2 * i < N { words[2 * i] as u64 } else { 0 };
        let hi = if 2 * i + 1 < N {
            words[2 * i + 1] as u64
        } else {
            0
        };
        lo | (hi << 32)
    };
    let chunks = N.div_ceil(2);
    let s2 = seed.rotate_left(23);
    let mut acc = seed ^ (N as u64).wrapping_mul(MUL2);
    let mut i = 0;
    while i < chunks {
        let a = chunk(i) ^ seed ^ K[i % 6];
        let b = chunk(i + 1) ^ s2 ^ K[(i + 1) % 6];
        acc ^= fold_mul(a, b);
        i += 2;
    }
    fold_mul(acc ^ MUL, MUL2 ^ seed)
}

/// A second, independent-looking 64-bit value from a hash (slot position and tag bits).
#[inline(always)]
pub fn mix(h: u64) -> u64 {
    fold_mul(h ^ 0x2D35_8DCC_AA6C_78A5, MUL)
}

/// Maps a hash to `0..n` without division (Lemire's multiply-shift on the high 32 bits).
#[inline(always)]
pub fn reduce(hash: u64, n: usize) -> usize {
    (((hash >> 32) * n as u64) >> 32) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_stays_in_range() {
        for n in [1usize, 2, 3, 1000, 1 << 20, u32::MAX as usize] {
            for h in [0u64, 1, u64::MAX, 0x8000_0000_0000_0000, 12345678901234567] {
                assert!(reduce(h, n) < n);
            }
        }
    }

    #[test]
    fn seed_and_content_change_the_hash() {
        let a = hash_words(1, &[1, 2, 3]);
        assert_ne!(a, hash_words(2, &[1, 2, 3]));
        assert_ne!(a, hash_words(1, &[1, 2, 4]));
        assert_ne!(a, hash_words(1, &[1, 2, 3, 0]));
        assert_eq!(a, hash_words(1, &[1, 2, 3]));
        let b = hash_key(1, &[1, 2, 3]);
        assert_ne!(b, hash_key(2, &[1, 2, 3]));
        assert_ne!(b, hash_key(1, &[1, 2, 4]));
        assert_ne!(b, hash_key(1, &[1, 2, 3, 0]));
        assert_ne!(hash_key(1, &[1, 0, 0, 0]), hash_key(1, &[0, 0, 1, 0]));
        assert_eq!(b, hash_key(1, &[1, 2, 3]));
    }

    #[test]
    fn sequential_lids_spread_over_buckets() {
        // 4096 consecutive LIDs into 4096 buckets: a decent hash leaves ~1/e buckets empty and
        // keeps the longest chain short.
        let n = 4096;
        let mut counts = [0u8; 4096];
        for lid in 0..n as u32 {
            let b = reduce(hash_words(7, &[1, lid, 0, 0, 0]), n);
            counts[b] = counts[b].saturating_add(1);
        }
        let empty = counts.iter().filter(|&&c| c == 0).count();
        let max = counts.iter().copied().max().unwrap_or(0);
        assert!(empty > 1200 && empty < 1800, "empty buckets {empty}");
        assert!(max <= 10, "longest chain {max}");
    }
}
