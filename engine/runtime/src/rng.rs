//! A small seedable RNG (xoshiro256** seeded by SplitMix64). The executor derives a fresh stream
//! from (seed, purpose, step) for every use, so a resumed run needs no saved RNG state to repeat
//! an uninterrupted one exactly, and no external crate's algorithm change can alter old runs.

#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a (64-bit): a hash that is the same in every process, build and version (std's is
/// not), for seeds, message keys, routing and prefix statistics. Bytes and token ids are folded in
/// one at a time (a token id as one value, not its bytes). The language crates keep their own
/// (engine/compiler/src/fs.rs): they do not depend on the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a(pub u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    pub fn value(self, x: u64) -> Fnv1a {
        Fnv1a((self.0 ^ x).wrapping_mul(0x0100_0000_01b3))
    }

    pub fn bytes<'b>(self, bytes: impl IntoIterator<Item = &'b u8>) -> Fnv1a {
        bytes.into_iter().fold(self, |h, &b| h.value(b as u64))
    }

    pub fn tokens<'t>(self, tokens: impl IntoIterator<Item = &'t crate::token::TokenId>) -> Fnv1a {
        tokens.into_iter().fold(self, |h, &t| h.value(t as u64))
    }
}

/// FNV-1a of a purpose label, mixed into derived seeds so streams for different purposes differ.
fn label_hash(label: &str) -> u64 {
    Fnv1a::default().bytes(label.as_bytes()).0
}

/// The seed of the stream for `purpose` at `index` (e.g. a step) under master seed `seed`.
pub fn derive_seed(seed: u64, purpose: &str, index: u64) -> u64 {
    let mut x = seed ^ label_hash(purpose).rotate_left(17);
    let a = splitmix(&mut x);
    let mut y = a ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    splitmix(&mut y)
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let s = [splitmix(&mut x), splitmix(&mut x), splitmix(&mut x), splitmix(&mut x)];
        Rng { s }
    }

    pub fn derived(seed: u64, purpose: &str, index: u64) -> Rng {
        Rng::new(derive_seed(seed, purpose, index))
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in 0..n without modulo bias; 0 when n is 0 (callers never ask, and a panic
    /// must not reach a user).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// Standard normal (Box-Muller; one value per call keeps the stream simple to reason about).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fnv1a_is_the_reference_hash() {
        // The published FNV-1a 64 test vectors: "", "a" and "foobar".
        assert_eq!(Fnv1a::default().0, 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv1a::default().bytes(b"a").0, 0xaf63_dc4c_8601_ec8c);
        assert_eq!(Fnv1a::default().bytes(b"foobar").0, 0x8594_4171_f739_67e8);
        // A token id is one value: 97 as a token folds like the byte b'a'.
        assert_eq!(Fnv1a::default().tokens(&[97]).0, Fnv1a::default().bytes(b"a").0);
    }
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| Rng::derived(7, "x", 3).next_u64()).collect();
        assert!(a.iter().all(|v| *v == a[0]));
        assert_ne!(Rng::derived(7, "x", 3).next_u64(), Rng::derived(7, "x", 4).next_u64());
        assert_ne!(Rng::derived(7, "x", 3).next_u64(), Rng::derived(7, "y", 3).next_u64());
        let mut r = Rng::new(1);
        let m: f64 = (0..20000).map(|_| r.normal()).sum::<f64>() / 20000.0;
        assert!(m.abs() < 0.05);
        for _ in 0..1000 {
            assert!(r.below(7) < 7);
        }
    }
}
