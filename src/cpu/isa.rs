//! Instruction sets the CPU backend compiles its block kernel for, and the runtime choice among
//! them.
//!
//! The crate is built for the baseline of its target (SSE2 on x86_64), which would leave the
//! kernels 4 lanes wide and without FMA. So `block::attend` is instantiated inside functions
//! compiled with `#[target_feature]` (AVX-512, AVX2+FMA) and one is picked at run time with
//! `is_x86_feature_detected!`; the portable instantiation serves every other machine.

use super::block::{self, Block, BlockOut, Ctx, KvPanels, Scratch};
use super::tile::Widen;

/// Register-block width (f32 lanes) of the AVX-512 kernels: two 16-lane registers.
const AVX512_LANES: usize = 32;
/// Register-block width of the AVX2 kernels: two 8-lane registers.
const AVX2_LANES: usize = 16;
/// Register-block width of the portable kernels.
const PORTABLE_LANES: usize = 8;

/// A compiled flavour of the CPU kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// x86_64 with AVX-512F/VL, AVX2, FMA and F16C: 32-lane register blocks.
    Avx512,
    /// x86_64 with AVX2, FMA and F16C: 16-lane register blocks.
    Avx2,
    /// Any target, baseline instructions only: 8-lane register blocks, no fused multiply-add.
    Portable,
}

impl Isa {
    /// Every flavour, best first.
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Portable];

    /// The best flavour this machine runs.
    pub fn detect() -> Isa {
        Isa::ALL
            .into_iter()
            .find(|isa| isa.is_available())
            .unwrap_or(Isa::Portable)
    }

    /// Whether this machine runs the flavour.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
        }
    }

    /// Width in f32 lanes of the micro-kernel's register blocks (the B panels' width).
    pub(super) fn lanes(self) -> usize {
        match self {
            Isa::Avx512 => AVX512_LANES,
            Isa::Avx2 => AVX2_LANES,
            Isa::Portable => PORTABLE_LANES,
        }
    }

    /// Short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }
}

/// Runs one block with the kernels of `isa`. The caller has checked `isa.is_available()`.
pub(super) fn attend<T: Widen>(
    isa: Isa,
    ctx: &Ctx<'_, T>,
    kv: &KvPanels,
    block: Block,
    scratch: &mut Scratch,
) -> BlockOut {
    match isa {
        // SAFETY: the caller checked `is_available`, i.e. that the CPU has these features.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::attend_avx512(ctx, kv, block, scratch) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::attend_avx2(ctx, kv, block, scratch) },
        // Off x86_64 `is_available` is false for these, so the caller never gets here with them.
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx512 | Isa::Avx2 => {
            block::attend::<T, PORTABLE_LANES, false>(ctx, kv, block, scratch)
        }
        Isa::Portable => block::attend::<T, PORTABLE_LANES, false>(ctx, kv, block, scratch),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;

    /// # Safety
    /// The CPU must support AVX-512F, AVX-512VL, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn attend_avx512<T: Widen>(
        ctx: &Ctx<'_, T>,
        kv: &KvPanels,
        block: Block,
        scratch: &mut Scratch,
    ) -> BlockOut {
        block::attend::<T, AVX512_LANES, true>(ctx, kv, block, scratch)
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_avx2<T: Widen>(
        ctx: &Ctx<'_, T>,
        kv: &KvPanels,
        block: Block,
        scratch: &mut Scratch,
    ) -> BlockOut {
        block::attend::<T, AVX2_LANES, true>(ctx, kv, block, scratch)
    }
}
