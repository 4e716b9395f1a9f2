//! The axes of the test grid — masks, variants, dtype configurations, GQA groups, batches — and
//! how one point of the grid becomes an [`AttentionProblem`].
//!
//! Each axis value knows its short name, so a case name is the path through the grid
//! (`f16/qk16/d128/causal/softcap50/g4kv2/b3[1x17,17x129,..]`).

use super::rng::SplitMix64;
use super::sample_custom_variant;
use crate::dtype::DType;
use crate::problem::{
    AttentionProblem, CustomMask, CustomVariant, HeadDims, LogitSite, Mask, QkAccum, RaggedBatch,
    Variant,
};
use std::sync::Arc;

/// Density of the random custom masks.
const CUSTOM_MASK_DENSITY: f64 = 0.7;
/// Fraction of custom-mask rows that are hidden entirely.
const CUSTOM_MASK_EMPTY_ROWS: f64 = 0.1;
/// Range of the sampled sink logits (around the O(1) logits of random inputs).
const SINK_RANGE: (f64, f64) = (-2.0, 3.0);
/// ALiBi's standard slope exponent: slope_h = 2^(-ALIBI_SPAN * (h + 1) / H).
const ALIBI_SPAN: f64 = 8.0;
/// The floor of the CPU-only custom transform.
const CPU_ONLY_FLOOR: f32 = -2.0;

/// A mask axis value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MaskSpec {
    /// [`Mask::None`].
    None,
    /// [`Mask::Causal`].
    Causal,
    /// [`Mask::SlidingWindow`] with this `window_left`.
    Window(i64),
    /// A random [`Mask::Custom`] (density 0.7, some rows fully hidden).
    Custom,
}

/// Every mask of the grid: window 0, a small and a larger-than-any-request window included.
pub const MASKS: [MaskSpec; 6] = [
    MaskSpec::None,
    MaskSpec::Causal,
    MaskSpec::Window(0),
    MaskSpec::Window(5),
    MaskSpec::Window(4096),
    MaskSpec::Custom,
];

impl MaskSpec {
    /// Short name.
    pub fn name(self) -> String {
        match self {
            MaskSpec::None => "none".into(),
            MaskSpec::Causal => "causal".into(),
            MaskSpec::Window(w) => format!("window{w}"),
            MaskSpec::Custom => "custommask".into(),
        }
    }

    /// The mask for `lens`, random parts drawn from `rng`.
    pub fn build(self, lens: &[(usize, usize)], rng: &mut SplitMix64) -> Mask {
        match self {
            MaskSpec::None => Mask::None,
            MaskSpec::Causal => Mask::Causal,
            MaskSpec::Window(w) => Mask::SlidingWindow { window_left: w },
            MaskSpec::Custom => {
                let masks: Vec<Vec<bool>> = lens
                    .iter()
                    .map(|&(qo, kv)| {
                        let mut bits = Vec::with_capacity(qo * kv);
                        for _ in 0..qo {
                            let hidden = rng.bernoulli(CUSTOM_MASK_EMPTY_ROWS);
                            bits.extend(
                                (0..kv).map(|_| !hidden && rng.bernoulli(CUSTOM_MASK_DENSITY)),
                            );
                        }
                        bits
                    })
                    .collect();
                Mask::Custom(CustomMask::pack(&masks))
            }
        }
    }
}

/// A variant axis value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum VariantSpec {
    /// [`Variant::None`].
    None,
    /// [`Variant::SoftCap`] with this cap.
    SoftCap(f32),
    /// [`Variant::Alibi`] with the standard slopes.
    Alibi,
    /// [`Variant::Sinks`] with random sinks.
    Sinks,
    /// The sample custom variant (Rust and CUDA sides, with a mask).
    Custom,
    /// A custom variant with a Rust side only (for backends that run closures).
    CustomCpuOnly,
}

/// The soft-caps the grid rotates through: Gemma 2's, one that bends O(1) logits, and one much
/// smaller than the logits.
pub const SOFT_CAPS: [f32; 3] = [50.0, 2.0, 0.05];

/// The variants of the grids at turn `turn` of [`SOFT_CAPS`]: none, the soft-cap with cap
/// `SOFT_CAPS[turn % 3]`, ALiBi, sinks and the custom variant.
pub fn grid_variants(turn: usize) -> [VariantSpec; 5] {
    [
        VariantSpec::None,
        VariantSpec::SoftCap(SOFT_CAPS[turn % SOFT_CAPS.len()]),
        VariantSpec::Alibi,
        VariantSpec::Sinks,
        VariantSpec::Custom,
    ]
}

/// Every mask x variant pair of the grids, in order, with its index: each mask of [`MASKS`]
/// with [`grid_variants`] of its own turn.
pub fn mask_variant_pairs() -> impl Iterator<Item = (usize, MaskSpec, VariantSpec)> {
    MASKS
        .iter()
        .enumerate()
        .flat_map(|(mi, &mask)| {
            grid_variants(mi)
                .into_iter()
                .map(move |variant| (mask, variant))
        })
        .enumerate()
        .map(|(pair, (mask, variant))| (pair, mask, variant))
}

impl VariantSpec {
    /// Short name.
    pub fn name(self) -> String {
        match self {
            VariantSpec::None => "none".into(),
            VariantSpec::SoftCap(c) => format!("softcap{c}"),
            VariantSpec::Alibi => "alibi".into(),
            VariantSpec::Sinks => "sinks".into(),
            VariantSpec::Custom => "custom".into(),
            VariantSpec::CustomCpuOnly => "customcpu".into(),
        }
    }

    /// The variant for `num_qo_heads` heads, random parts drawn from `rng`.
    pub fn build(self, num_qo_heads: usize, rng: &mut SplitMix64) -> Variant {
        match self {
            VariantSpec::None => Variant::None,
            VariantSpec::SoftCap(cap) => Variant::SoftCap { cap },
            VariantSpec::Alibi => Variant::Alibi {
                slopes: alibi_slopes(num_qo_heads),
            },
            VariantSpec::Sinks => Variant::Sinks {
                sinks: (0..num_qo_heads)
                    .map(|_| rng.range_f64(SINK_RANGE.0, SINK_RANGE.1) as f32)
                    .collect(),
            },
            VariantSpec::Custom => {
                Variant::Custom(sample_custom_variant(num_qo_heads, rng.next_u64()))
            }
            VariantSpec::CustomCpuOnly => Variant::Custom(cpu_only_variant()),
        }
    }
}

/// The standard ALiBi slopes `2^(-8 (h + 1) / H)` for `H` heads.
pub fn alibi_slopes(num_heads: usize) -> Vec<f32> {
    (0..num_heads)
        .map(|h| (-ALIBI_SPAN * (h + 1) as f64 / num_heads as f64).exp2() as f32)
        .collect()
}

/// A custom variant with no CUDA side: logits floored at -2, keys of odd heads' last query hidden.
fn cpu_only_variant() -> CustomVariant {
    CustomVariant {
        name: "floor_cpu".into(),
        cpu_transform: Arc::new(|s: f32, _site: &LogitSite| s.max(CPU_ONLY_FLOOR)),
        cpu_mask: Some(Arc::new(|site: &LogitSite| {
            !(site.qo_head % 2 == 1 && site.qo_idx + 1 == site.qo_len && site.kv_idx % 2 == 0)
        })),
        cuda: None,
        param_values: Vec::new(),
    }
}

/// The input dtype and QK accumulation of a case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DtypeConfig {
    /// Input (and output) dtype.
    pub dtype: DType,
    /// QK accumulation.
    pub accum: QkAccum,
}

/// Every dtype configuration: f16 with both accumulations, bf16, f32.
pub const DTYPE_CONFIGS: [DtypeConfig; 4] = [
    DtypeConfig {
        dtype: DType::F16,
        accum: QkAccum::F32,
    },
    DtypeConfig {
        dtype: DType::F16,
        accum: QkAccum::F16,
    },
    DtypeConfig {
        dtype: DType::Bf16,
        accum: QkAccum::F32,
    },
    DtypeConfig {
        dtype: DType::F32,
        accum: QkAccum::F32,
    },
];

impl DtypeConfig {
    /// Short name, e.g. `f16/qk16`.
    pub fn name(self) -> String {
        let accum = match self.accum {
            QkAccum::F32 => "qk32",
            QkAccum::F16 => "qk16",
        };
        format!("{}/{accum}", self.dtype)
    }
}

/// The GQA group sizes of the grid.
pub const GROUPS: [usize; 4] = [1, 4, 7, 8];

/// `(num_qo_heads, num_kv_heads)` for group `g`, varied by `parity`.
pub fn heads(group: usize, parity: usize) -> (usize, usize) {
    let kv = if group == 1 {
        2 + parity % 2
    } else {
        1 + parity % 2
    };
    (group * kv, kv)
}

/// Short name of a batch: `b<n>[qo x kv,..]`, at most four requests spelled out.
pub fn batch_name(lens: &[(usize, usize)]) -> String {
    const SHOWN: usize = 4;
    let mut parts: Vec<String> = lens
        .iter()
        .take(SHOWN)
        .map(|(q, k)| format!("{q}x{k}"))
        .collect();
    if lens.len() > SHOWN {
        parts.push("..".into());
    }
    format!("b{}[{}]", lens.len(), parts.join(","))
}

/// Short name of head dims: `d128`, or `d192v128` when qk and vo differ.
pub fn head_dims_name(d: HeadDims) -> String {
    if d.qk() == d.vo() {
        format!("d{}", d.qk())
    } else {
        format!("d{}v{}", d.qk(), d.vo())
    }
}

/// `n` requests with random small lengths, `qo_len <= kv_len`.
pub fn many_requests(
    n: usize,
    max_qo: usize,
    max_extra_kv: usize,
    rng: &mut SplitMix64,
) -> Vec<(usize, usize)> {
    (0..n)
        .map(|_| {
            let qo = rng.range_usize(1, max_qo);
            (qo, qo + rng.range_usize(0, max_extra_kv))
        })
        .collect()
}

/// The batches of the quick suite (lengths 1, 17, 127, 128, 129, qo < kv, qo > kv, 64 requests).
pub fn quick_batches(rng: &mut SplitMix64) -> Vec<Vec<(usize, usize)>> {
    vec![
        vec![(1, 1)],
        vec![(17, 17)],
        vec![(1, 129)],
        vec![(17, 128)],
        vec![(3, 5), (1, 1), (17, 33)],
        vec![(5, 3), (2, 7)],
        many_requests(64, 3, 4, rng),
        vec![(127, 127)],
        vec![(1, 17), (17, 129), (2, 128)],
        vec![(129, 129)],
    ]
}

/// The batches of the full suite: the quick ones and larger, longer and more ragged ones.
pub fn full_batches(rng: &mut SplitMix64) -> Vec<Vec<(usize, usize)>> {
    let mut batches = quick_batches(rng);
    batches.extend([
        vec![(128, 128)],
        vec![(1, 17), (17, 129), (127, 128), (128, 129)],
        vec![(129, 257)],
        many_requests(64, 17, 20, rng),
        vec![(16, 1024)],
        vec![(0, 5), (3, 0), (2, 2), (33, 40)],
        vec![(64, 64), (1, 300)],
    ]);
    batches
}

/// Work of a problem in multiply-adds of the reference: sum over requests of
/// `qo * kv * hq * (dqk + dvo)`.
pub fn work(lens: &[(usize, usize)], num_qo_heads: usize, head_dims: HeadDims) -> usize {
    lens.iter()
        .map(|&(q, k)| q * k * num_qo_heads * (head_dims.qk() + head_dims.vo()))
        .sum()
}

/// One grid point before it becomes a problem.
#[derive(Clone, Debug)]
pub struct Point {
    /// Dtypes.
    pub config: DtypeConfig,
    /// Head dims.
    pub head_dims: HeadDims,
    /// The mask.
    pub mask: MaskSpec,
    /// The variant.
    pub variant: VariantSpec,
    /// `(num_qo_heads, num_kv_heads)`.
    pub heads: (usize, usize),
    /// Request lengths.
    pub lens: Vec<(usize, usize)>,
}

impl Point {
    /// The case name: the path through the grid.
    pub fn name(&self) -> String {
        let (hq, hkv) = self.heads;
        format!(
            "{}/{}/{}/{}/g{}kv{}/{}",
            self.config.name(),
            head_dims_name(self.head_dims),
            self.mask.name(),
            self.variant.name(),
            hq / hkv,
            hkv,
            batch_name(&self.lens)
        )
    }

    /// The problem, random parts (custom mask, sinks, custom parameters) drawn from `seed`.
    pub fn problem(&self, seed: u64) -> AttentionProblem {
        let mut rng = SplitMix64::with_salt(seed, 0x6a1d);
        let (hq, hkv) = self.heads;
        AttentionProblem::new(
            // The grid's batches are a few thousand tokens: far inside 32-bit indices.
            RaggedBatch::from_lens(&self.lens).expect("grid batches fit 32-bit token indices"),
            hq,
            hkv,
            self.head_dims,
            self.config.dtype,
        )
        .with_qk_accum(self.config.accum)
        .with_mask(self.mask.build(&self.lens, &mut rng))
        .with_variant(self.variant.build(hq, &mut rng))
    }
}
