//! The shared correctness suite: one input generator and one case list for every backend.
//!
//! The CPU backend's tests, `attnforge verify` and the GPU suite all take their problems from
//! [`cases`] and their inputs from [`Case::inputs`] (built on [`random_inputs`]), and judge the
//! result with [`crate::compare`] against [`crate::reference`]. A backend states what it can run
//! in a [`BackendCaps`]; the list leaves out what it cannot (dtypes, f16 accumulation, CPU-only
//! custom variants) and shrinks cases above its size limit, so a skipped combination is a stated
//! capability, never a silent failure.
//!
//! The grid ([`grid`]): every mask (none, causal, sliding windows 0, 5 and 4096, a random custom
//! mask with fully hidden rows) × every variant (none, soft-cap 50 / 2 / 0.05 in rotation, ALiBi
//! with the standard slopes, sinks, the sample custom variant) — and, in the full suite, × every
//! dtype configuration (f16 with f32 and f16 QK accumulation, bf16, f32) × every head-dim pair —
//! with GQA groups 1, 4, 7, 8 and ragged batches rotating so that each value meets each other
//! axis. Targeted cases follow: logits near the f16 range under f16 accumulation, soft-cap with
//! logits 100x the cap, `sm_scale = 1`, empty rows with sinks, empty requests, fused and padded
//! strided views, and a CPU-only custom variant. Then the paged cases (`paged.rs`) and the
//! widest-tile cases (`widest.rs`: the kernels of long prefills, which a GPU backend runs on
//! small problems when asked by [`TileRequest::WidestRows`]).

mod custom;
pub mod grid;
mod inputs;
mod merge;
mod paged;
pub mod rng;
mod widest;

pub use custom::sample_custom_variant;
pub use inputs::{extent, random_inputs, random_inputs_scaled};
pub use merge::{merge_cases, merge_expected, MergeCase};
pub use paged::{CacheBuffers, Fp8Case, PagedCase, PagedInputs, PagedRun};
pub use widest::TileRequest;

use crate::compare::Tolerance;
use crate::dtype::DType;
use crate::problem::{AttentionProblem, HeadDims, Mask, QkAccum, RaggedBatch, TensorView};
use crate::tensor::HostTensor;
use grid::{
    batch_name, full_batches, heads, mask_variant_pairs, quick_batches, work, DtypeConfig,
    MaskSpec, Point, VariantSpec, DTYPE_CONFIGS, GROUPS, SOFT_CAPS,
};
use rng::SplitMix64;

/// Which case list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// Every mask × variant pair once, the other axes rotating; small problems.
    Quick,
    /// Every mask × variant × dtype configuration × head dims; larger batches.
    Full,
}

/// One test case: a named problem and the seed of its inputs.
#[derive(Clone, Debug)]
pub struct Case {
    /// The path through the grid, e.g. `f16/qk16/d128/causal/softcap50/g4kv2/b3[1x17,17x129,..]`.
    pub name: String,
    /// The problem.
    pub problem: AttentionProblem,
    /// The seed of the inputs (and of the problem's random parts).
    pub seed: u64,
    /// Standard deviation of Q and K (1 except in the large-logit cases).
    pub qk_scale: f64,
    /// For a paged case, how K and V sit in the cache ([`Case::paged_inputs`]).
    pub paged: Option<PagedCase>,
    /// The tile a GPU backend computes it with.
    pub tile: TileRequest,
}

impl Case {
    /// The case's inputs: [`random_inputs_scaled`] with its seed and Q/K scale (V is standard
    /// normal).
    pub fn inputs(&self) -> (HostTensor, HostTensor, HostTensor) {
        random_inputs_scaled(&self.problem, self.seed, self.qk_scale, 1.0)
    }

    /// The tolerance of the case's dtypes.
    pub fn tolerance(&self) -> Tolerance {
        Tolerance::for_problem(&self.problem)
    }
}

/// What a backend can run; [`cases`] lists only cases inside it.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendCaps {
    /// Input dtypes the backend takes.
    pub dtypes: Vec<DType>,
    /// Whether it runs f16 QK accumulation.
    pub f16_qk_accum: bool,
    /// Whether a custom variant needs a CUDA side (GPU backends); if so, CPU-only custom
    /// variants are left out.
    pub custom_needs_cuda: bool,
    /// Alignment, in elements, that view offsets and strides must have (the GPU kernels load
    /// rows with 16-byte copies); the padded-view case pads to a multiple of it.
    pub view_alignment: usize,
    /// Largest problem, in reference multiply-adds (`sum qo * kv * hq * (dqk + dvo)`); bigger
    /// cases get the largest batch of the list that fits.
    pub max_work: usize,
    /// Whether it runs the GPU-only paged paths (CUDA graph replay, the cache filled by the
    /// device's append kernel).
    pub device_runs: bool,
}

impl BackendCaps {
    /// The CPU backends: every dtype, both accumulations, closures only, no size limit.
    pub fn cpu() -> BackendCaps {
        BackendCaps {
            dtypes: vec![DType::F16, DType::Bf16, DType::F32],
            f16_qk_accum: true,
            custom_needs_cuda: false,
            view_alignment: 1,
            max_work: usize::MAX,
            device_runs: false,
        }
    }

    /// The CUDA backends: f16 and bf16, both accumulations, custom variants need CUDA code.
    pub fn cuda() -> BackendCaps {
        BackendCaps {
            dtypes: vec![DType::F16, DType::Bf16],
            f16_qk_accum: true,
            custom_needs_cuda: true,
            view_alignment: CUDA_VIEW_ALIGNMENT,
            max_work: usize::MAX,
            device_runs: true,
        }
    }

    fn supports(&self, config: DtypeConfig) -> bool {
        self.dtypes.contains(&config.dtype) && (config.accum == QkAccum::F32 || self.f16_qk_accum)
    }
}

/// Salt of the stream that draws the random batches of a suite.
const SALT_BATCHES: u64 = 0xba7c;
/// Salt base of the paged cases' seeds.
const SALT_PAGED: u64 = 0x9a6e_0000;
/// Salt base of the widest-tile cases' seeds.
const SALT_WIDEST: u64 = 0x3d1e_0000;
/// Name tag of the widest-tile cases.
const WIDEST_TAG: &str = "widest-tile";
/// Standard deviation of Q and K that puts f16 accumulators near the f16 maximum (65504): with
/// head dim 128 (prescale 2^-4) an accumulator then has a standard deviation of about 28000.
const NEAR_F16_MAX_QK_SCALE: f64 = 200.0;
/// Standard deviation of Q and K that makes logits about 5000: 100x Gemma 2's cap of 50.
const FAR_ABOVE_CAP_QK_SCALE: f64 = 71.0;
/// A small cap and the Q/K scale that makes logits about 36, over 100x the cap.
const SMALL_CAP: f32 = 0.3;
const FAR_ABOVE_SMALL_CAP_QK_SCALE: f64 = 6.0;
/// Elements of 16 bits in the 16 bytes the GPU kernels copy at once.
const CUDA_VIEW_ALIGNMENT: usize = 8;
/// Padding (in elements) of the padded-view case.
const VIEW_PAD: usize = 8;

/// The case list of `suite` for a backend with `caps`, deterministic in `base_seed`.
pub fn cases(suite: Suite, base_seed: u64, caps: &BackendCaps) -> Vec<Case> {
    let mut batch_rng = SplitMix64::with_salt(base_seed, SALT_BATCHES);
    let batches = match suite {
        Suite::Quick => quick_batches(&mut batch_rng),
        Suite::Full => full_batches(&mut batch_rng),
    };
    let configs: Vec<DtypeConfig> = DTYPE_CONFIGS
        .into_iter()
        .filter(|&c| caps.supports(c))
        .collect();
    let dims: Vec<HeadDims> = HeadDims::all().collect();
    let mut points = Vec::new();
    if !configs.is_empty() {
        grid_points(suite, &configs, &dims, &batches, &mut points);
    }
    let mut cases: Vec<Case> = points
        .into_iter()
        .filter_map(|p| fit(p, &batches, caps))
        .map(|p| (p, 1.0, None))
        .chain(
            targeted(caps, suite == Suite::Full)
                .into_iter()
                .filter(|(p, _, _)| work(&p.lens, p.heads.0, p.head_dims) <= caps.max_work)
                .map(|(p, scale, tag)| (p, scale, Some(tag))),
        )
        .enumerate()
        .map(|(i, (point, qk_scale, tag))| {
            let seed = SplitMix64::with_salt(base_seed, i as u64).next_u64();
            let name = match tag {
                Some(tag) => format!("{}/{tag}", point.name()),
                None => point.name(),
            };
            Case {
                name,
                problem: point.problem(seed),
                seed,
                qk_scale,
                paged: None,
                tile: TileRequest::Planned,
            }
        })
        .collect();
    cases.extend(view_cases(base_seed, caps));
    let paged = paged::paged_cases(suite, base_seed, caps, &quick_batches(&mut batch_rng));
    cases.extend(
        paged
            .into_iter()
            .filter(|(p, _, _)| work(&p.lens, p.heads.0, p.head_dims) <= caps.max_work)
            .enumerate()
            .map(|(i, (point, layout, tag))| {
                let seed = SplitMix64::with_salt(base_seed, SALT_PAGED + i as u64).next_u64();
                Case {
                    name: paged::paged_case_name(&point, &layout, tag),
                    problem: point.problem(seed),
                    seed,
                    qk_scale: 1.0,
                    paged: Some(layout),
                    tile: TileRequest::Planned,
                }
            }),
    );
    let widest = widest::widest_tile_points(suite, caps);
    cases.extend(
        widest
            .into_iter()
            .filter(|(p, _)| work(&p.lens, p.heads.0, p.head_dims) <= caps.max_work)
            .enumerate()
            .map(|(i, (point, paged))| {
                let seed = SplitMix64::with_salt(base_seed, SALT_WIDEST + i as u64).next_u64();
                let name = match &paged {
                    Some(layout) => paged::paged_case_name(&point, layout, WIDEST_TAG),
                    None => format!("{}/{WIDEST_TAG}", point.name()),
                };
                Case {
                    name,
                    problem: point.problem(seed),
                    seed,
                    qk_scale: 1.0,
                    paged,
                    tile: TileRequest::WidestRows,
                }
            }),
    );
    cases
}

/// The grid of `suite` (see the module doc).
fn grid_points(
    suite: Suite,
    configs: &[DtypeConfig],
    dims: &[HeadDims],
    batches: &[Vec<(usize, usize)>],
    out: &mut Vec<Point>,
) {
    let mut counter = 0usize;
    for (pair, mask, variant) in mask_variant_pairs() {
        let combos: Vec<(usize, usize)> = match suite {
            // One combination per pair, rotating through configs and head dims.
            Suite::Quick => vec![(pair % configs.len(), (pair + pair / 4) % dims.len())],
            Suite::Full => (0..configs.len())
                .flat_map(|c| (0..dims.len()).map(move |d| (c, d)))
                .collect(),
        };
        for (ci, di) in combos {
            let group = GROUPS[(pair + ci + di) % GROUPS.len()];
            let lens = batches[counter % batches.len()].clone();
            counter += 1;
            out.push(Point {
                config: configs[ci],
                head_dims: dims[di],
                mask,
                variant,
                heads: heads(group, counter),
                lens,
            });
        }
    }
}

/// The point itself if within `caps.max_work`, else with the largest batch that fits, else none.
fn fit(mut point: Point, batches: &[Vec<(usize, usize)>], caps: &BackendCaps) -> Option<Point> {
    let cost = |lens: &[(usize, usize)]| work(lens, point.heads.0, point.head_dims);
    if cost(&point.lens) <= caps.max_work {
        return Some(point);
    }
    let best = batches
        .iter()
        .filter(|b| cost(b) <= caps.max_work)
        .max_by_key(|b| cost(b))?
        .clone();
    point.lens = best;
    Some(point)
}

/// A supported head-dim pair by value (`None` if the model ever drops it; the case then goes).
fn dims(qk: usize, vo: usize) -> Option<HeadDims> {
    HeadDims::new(qk, vo).ok()
}

/// The targeted cases, their Q/K scales and name tags; `long_prefills` adds the long ones.
fn targeted(caps: &BackendCaps, long_prefills: bool) -> Vec<(Point, f64, &'static str)> {
    let f16_qk16 = DtypeConfig {
        dtype: DType::F16,
        accum: QkAccum::F16,
    };
    let f16 = DtypeConfig {
        dtype: DType::F16,
        accum: QkAccum::F32,
    };
    let bf16 = DtypeConfig {
        dtype: DType::Bf16,
        accum: QkAccum::F32,
    };
    let f32 = DtypeConfig {
        dtype: DType::F32,
        accum: QkAccum::F32,
    };
    let point =
        |config, head_dims: Option<HeadDims>, mask, variant, heads, lens: &[(usize, usize)]| {
            head_dims.map(|head_dims| Point {
                config,
                head_dims,
                mask,
                variant,
                heads,
                lens: lens.to_vec(),
            })
        };
    let mut list = vec![
        // f16 accumulation with accumulators near (and sometimes past) the f16 maximum.
        (
            point(
                f16_qk16,
                dims(128, 128),
                MaskSpec::Causal,
                VariantSpec::None,
                (4, 1),
                &[(17, 129)],
            ),
            NEAR_F16_MAX_QK_SCALE,
            "logits-near-f16-max",
        ),
        (
            point(
                f16_qk16,
                dims(256, 256),
                MaskSpec::None,
                VariantSpec::None,
                (2, 2),
                &[(1, 64), (9, 40)],
            ),
            NEAR_F16_MAX_QK_SCALE,
            "logits-near-f16-max",
        ),
        // Soft-cap with raw logits about 100x the cap.
        (
            point(
                f16,
                dims(128, 128),
                MaskSpec::Causal,
                VariantSpec::SoftCap(50.0),
                (8, 2),
                &[(33, 65)],
            ),
            FAR_ABOVE_CAP_QK_SCALE,
            "logits-100x-cap",
        ),
        (
            point(
                bf16,
                dims(64, 64),
                MaskSpec::None,
                VariantSpec::SoftCap(SMALL_CAP),
                (2, 2),
                &[(17, 129)],
            ),
            FAR_ABOVE_SMALL_CAP_QK_SCALE,
            "logits-100x-cap",
        ),
        // Rows with no visible key (qo_len > kv_len under causal; kv_len = 0), with sinks.
        (
            point(
                f32,
                dims(128, 128),
                MaskSpec::Causal,
                VariantSpec::Sinks,
                (4, 1),
                &[(5, 3), (4, 0)],
            ),
            1.0,
            "empty-rows-with-sinks",
        ),
        (
            point(
                bf16,
                dims(128, 128),
                MaskSpec::Causal,
                VariantSpec::Sinks,
                (4, 1),
                &[(5, 3), (4, 0)],
            ),
            1.0,
            "empty-rows-with-sinks",
        ),
        // Requests with no query and with no key.
        (
            point(
                f16,
                dims(64, 64),
                MaskSpec::None,
                VariantSpec::None,
                (3, 3),
                &[(0, 5), (3, 0), (2, 2), (1, 1)],
            ),
            1.0,
            "empty-requests",
        ),
        // Short queries over long keys (chunked prefill, append): GPU plans split the KV range
        // across CTAs and merge; sinks then join only in the merge.
        (
            point(
                f16,
                dims(128, 128),
                MaskSpec::Causal,
                VariantSpec::Sinks,
                (8, 2),
                &[(17, 4096)],
            ),
            1.0,
            "short-queries-long-keys",
        ),
        (
            point(
                bf16,
                dims(256, 256),
                MaskSpec::None,
                VariantSpec::SoftCap(50.0),
                (4, 4),
                &[(1, 1000), (5, 4096), (3, 129)],
            ),
            1.0,
            "short-queries-long-keys",
        ),
        (
            point(
                f16_qk16,
                dims(192, 128),
                MaskSpec::Window(700),
                VariantSpec::Alibi,
                (7, 1),
                &[(1, 4096), (64, 1000)],
            ),
            1.0,
            "short-queries-long-keys",
        ),
        (
            point(
                f16,
                dims(64, 64),
                MaskSpec::Custom,
                VariantSpec::Custom,
                (4, 1),
                &[(9, 2048), (0, 300)],
            ),
            1.0,
            "short-queries-long-keys",
        ),
    ];
    if long_prefills {
        // Long prefills (compared on sampled rows): lengths 1000 and 4096 with GQA.
        list.push((
            point(
                f16,
                dims(128, 128),
                MaskSpec::Causal,
                VariantSpec::None,
                (32, 8),
                &[(1000, 1000), (129, 4096)],
            ),
            1.0,
            "long-prefill",
        ));
        list.push((
            point(
                bf16,
                dims(64, 64),
                MaskSpec::None,
                VariantSpec::SoftCap(50.0),
                (8, 1),
                &[(4096, 4096)],
            ),
            1.0,
            "long-prefill",
        ));
    }
    if !caps.custom_needs_cuda {
        list.push((
            point(
                f32,
                dims(64, 64),
                MaskSpec::Causal,
                VariantSpec::CustomCpuOnly,
                (4, 1),
                &[(17, 17), (3, 9)],
            ),
            1.0,
            "cpu-only-custom",
        ));
        list.push((
            point(
                f16,
                dims(128, 128),
                MaskSpec::None,
                VariantSpec::CustomCpuOnly,
                (2, 2),
                &[(1, 33)],
            ),
            1.0,
            "cpu-only-custom",
        ));
    }
    list.into_iter()
        .filter_map(|(p, scale, tag)| Some((p?, scale, tag)))
        .filter(|(p, _, _)| caps.supports(p.config))
        .collect()
}

/// Cases with non-contiguous views: Q, K, V as slices of one fused QKV row layout, and padded
/// head and token strides with an offset; plus `sm_scale = 1` under f16 accumulation.
fn view_cases(base_seed: u64, caps: &BackendCaps) -> Vec<Case> {
    let mut out = Vec::new();
    let seed = |salt: u64| SplitMix64::with_salt(base_seed, salt).next_u64();
    let lens = [(17usize, 33usize), (1, 5)];
    let mut rng = SplitMix64::new(seed(0x71e1));

    // Fused QKV: every token row holds hq + 2 hkv heads of 128.
    let (hq, hkv, d) = (8usize, 2usize, 128usize);
    let fused_dtype = [DType::F16, DType::Bf16, DType::F32]
        .into_iter()
        .find(|d| caps.dtypes.contains(d));
    if let (Some(dt), Some(hd)) = (fused_dtype, dims(d, d)) {
        let row = (hq + 2 * hkv) * d;
        let mut p = AttentionProblem::new(
            RaggedBatch::from_lens(&lens).expect("targeted cases are small"),
            hq,
            hkv,
            hd,
            dt,
        )
        .with_mask(MaskSpec::Causal.build(&lens, &mut rng))
        .with_variant(VariantSpec::Alibi.build(hq, &mut rng));
        p.q_view = TensorView {
            offset: 0,
            token_stride: row,
            head_stride: d,
        };
        p.k_view = TensorView {
            offset: hq * d,
            token_stride: row,
            head_stride: d,
        };
        p.v_view = TensorView {
            offset: (hq + hkv) * d,
            token_stride: row,
            head_stride: d,
        };
        let s = seed(0xf05e);
        out.push(Case {
            name: format!(
                "{dt}/qk32/d128/causal/alibi/g4kv2/{}/fused-qkv-views",
                batch_name(&lens)
            ),
            problem: p,
            seed: s,
            qk_scale: 1.0,
            paged: None,
            tile: TileRequest::Planned,
        });
    }

    // Padded strides and offsets, different per tensor, with (192, 128) head dims.
    if let (true, Some(hd)) = (caps.dtypes.contains(&DType::Bf16), dims(192, 128)) {
        let (hq, hkv) = (7usize, 1usize);
        let padded = |heads: usize, dim: usize, offset: usize| TensorView {
            offset,
            token_stride: heads * (dim + VIEW_PAD) + VIEW_PAD,
            head_stride: dim + VIEW_PAD,
        };
        let mut p = AttentionProblem::new(
            RaggedBatch::from_lens(&lens).expect("targeted cases are small"),
            hq,
            hkv,
            hd,
            DType::Bf16,
        )
        .with_mask(MaskSpec::Window(5).build(&lens, &mut rng));
        // Odd offsets where the backend allows them, the smallest aligned ones otherwise.
        let align = caps.view_alignment;
        p.q_view = padded(hq, hd.qk(), 3 * align);
        p.k_view = padded(hkv, hd.qk(), 5 * align);
        p.v_view = padded(hkv, hd.vo(), 7 * align);
        out.push(Case {
            name: format!(
                "bf16/qk32/d192v128/window5/none/g7kv1/{}/padded-views",
                batch_name(&lens)
            ),
            problem: p,
            seed: seed(0x9add),
            qk_scale: 1.0,
            paged: None,
            tile: TileRequest::Planned,
        });
    }

    // sm_scale = 1 under f16 accumulation: prescale 1, post-scale 1.
    let f16_qk16 = DtypeConfig {
        dtype: DType::F16,
        accum: QkAccum::F16,
    };
    if let (true, Some(hd)) = (caps.supports(f16_qk16), dims(64, 64)) {
        let lens = [(9usize, 40usize)];
        let p = AttentionProblem::new(
            RaggedBatch::from_lens(&lens).expect("targeted cases are small"),
            8,
            1,
            hd,
            DType::F16,
        )
        .with_qk_accum(QkAccum::F16)
        .with_sm_scale(1.0)
        .with_mask(Mask::Causal)
        .with_variant(VariantSpec::SoftCap(SOFT_CAPS[1]).build(8, &mut rng));
        out.push(Case {
            name: format!(
                "f16/qk16/d64/causal/softcap2/g8kv1/{}/sm-scale-1",
                batch_name(&lens)
            ),
            problem: p,
            seed: seed(0x5ca1),
            qk_scale: 1.0,
            paged: None,
            tile: TileRequest::Planned,
        });
    }
    out.retain(|c| {
        work(
            &c.problem.batch.lens(),
            c.problem.num_qo_heads,
            c.problem.head_dims,
        ) <= caps.max_work
    });
    out
}
