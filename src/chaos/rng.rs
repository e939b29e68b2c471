//! The campaign's only source of randomness: SplitMix64 (Steele, Lea and Flood, "Fast
//! splittable pseudorandom number generators", 2014), seeded by the schedule's seed. Small,
//! fast, and the same sequence on every platform and build, which is all a reproducible
//! schedule needs (it is not for cryptography).

/// A SplitMix64 generator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The generator of `seed`: equal seeds give equal sequences.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`, without modulo bias (values in the incomplete last stretch of the
    /// 64-bit range are drawn again). `n` = 0 gives 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// Uniform in `lo..=hi` (`lo` when `hi < lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below(hi - lo + 1)
    }

    /// `true` with a probability of `percent` in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items`, uniformly.
    ///
    /// # Panics
    /// If `items` is empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        assert!(!items.is_empty(), "picking from nothing");
        &items[self.below(items.len() as u64) as usize]
    }

    /// 128 random bits (an operation's uuid).
    pub fn next_u128(&mut self) -> u128 {
        (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // The reference implementation's first outputs for seed 0 and seed 1234567.
        let mut g = SplitMix64::new(0);
        assert_eq!(g.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(g.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let mut g = SplitMix64::new(1_234_567);
        assert_eq!(g.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(g.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn same_seed_same_sequence_other_seed_other_sequence() {
        let draw = |seed| {
            let mut g = SplitMix64::new(seed);
            (0..32).map(|_| g.below(1000)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn bounded_draws_stay_in_bounds_and_cover_them() {
        let mut g = SplitMix64::new(42);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let x = g.range(3, 9);
            assert!((3..=9).contains(&x));
            seen[(x - 3) as usize] = true;
            assert!(g.below(5) < 5);
        }
        assert!(seen.iter().all(|s| *s), "{seen:?}");
        assert_eq!(g.below(0), 0);
        assert_eq!(g.range(4, 4), 4);
        assert_eq!(g.range(5, 1), 5);
        assert!(!(0..100).any(|_| g.chance(0)));
        assert!((0..100).all(|_| g.chance(100)));
        assert_eq!(*g.pick(&[9]), 9);
    }
}
