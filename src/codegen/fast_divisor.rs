//! Division by a divisor fixed for a whole launch (the GQA group size) as a multiply-high, an add
//! and a shift on the GPU: the host computes the multiplier and shift once per plan, the kernel's
//! `FastDivisor` (`kernels/common.cuh`) applies them. A runtime `int` division costs about twenty
//! instructions, and the prefill kernel's prologue and epilogue divide every row they touch.

/// Multiplier and shift such that `n / d == (umulhi(n, magic) + n) >> shift` for every
/// `0 <= n < 2^31` (the round-up method: `shift = ceil(log2 d)`,
/// `magic = floor(2^32 (2^shift - d) / d) + 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastDivisor {
    /// The 32-bit multiplier.
    pub magic: u32,
    /// The right shift after the add.
    pub shift: u32,
}

impl FastDivisor {
    /// The multiplier and shift for divisor `d` (`d >= 1`; 0 is taken as 1, which no plan
    /// passes: the group size is at least 1).
    pub fn new(d: u32) -> FastDivisor {
        let d = d.max(1) as u64;
        let shift = 64 - (d - 1).leading_zeros();
        let magic = ((1u64 << 32) * ((1u64 << shift) - d) / d + 1) as u32;
        FastDivisor { magic, shift }
    }

    /// `n / d` as the kernel computes it, for `0 <= n < 2^31`.
    pub fn divide(self, n: u32) -> u32 {
        let high = ((n as u64 * self.magic as u64) >> 32) as u32;
        ((high as u64 + n as u64) >> self.shift) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divides_like_integer_division_for_every_group_size() {
        let mut large = 0x9e37_79b9u32;
        for d in 1..=256u32 {
            let f = FastDivisor::new(d);
            for n in (0..1 << 16).chain([(1 << 31) - 1, (1 << 31) - 2, (1 << 31) - d]) {
                assert_eq!(f.divide(n), n / d, "{n} / {d}");
            }
            for _ in 0..2000 {
                large ^= large << 13;
                large ^= large >> 17;
                large ^= large << 5;
                let n = large >> 1;
                assert_eq!(f.divide(n), n / d, "{n} / {d}");
            }
        }
    }

    #[test]
    fn powers_of_two_shift_and_one_is_the_identity() {
        assert_eq!(FastDivisor::new(1), FastDivisor { magic: 1, shift: 0 });
        assert_eq!(FastDivisor::new(8), FastDivisor { magic: 1, shift: 3 });
        assert_eq!(FastDivisor::new(7).shift, 3);
    }
}
