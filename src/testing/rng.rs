//! A tiny deterministic random number generator (SplitMix64) for test inputs and case grids.
//!
//! Test cases are named by their seed, so the stream behind a seed must never change with a
//! dependency upgrade; SplitMix64 is fully specified by the dozen lines below.

/// SplitMix64's increment (the golden-ratio constant).
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
/// SplitMix64's first mixing multiplier.
const MIX_1: u64 = 0xbf58_476d_1ce4_e5b9;
/// SplitMix64's second mixing multiplier.
const MIX_2: u64 = 0x94d0_49bb_1331_11eb;
/// 2^-53: turns the top 53 bits of a draw into a uniform f64 in [0, 1).
const UNIT_F64: f64 = 1.0 / (1u64 << 53) as f64;

/// SplitMix64: a seeded stream of 64-bit values.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A stream for `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// A stream for `seed` and a `salt` that separates independent uses of one seed.
    pub fn with_salt(seed: u64, salt: u64) -> SplitMix64 {
        let mut mixer = SplitMix64::new(seed ^ salt.wrapping_mul(MIX_1));
        SplitMix64::new(mixer.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(MIX_1);
        z = (z ^ (z >> 27)).wrapping_mul(MIX_2);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * UNIT_F64
    }

    /// Uniform in [lo, hi).
    pub fn range_f64(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform integer in [lo, hi] (inclusive; `lo <= hi`).
    pub fn range_usize(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// `true` with probability `p`.
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.uniform() < p
    }

    /// A standard normal draw (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        // 1 - u is in (0, 1], so the log is finite.
        let radius = (-2.0 * (1.0 - self.uniform()).ln()).sqrt();
        radius * (std::f64::consts::TAU * self.uniform()).cos()
    }
}
