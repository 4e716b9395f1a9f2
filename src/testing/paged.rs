//! Paged cases of the shared suite: the same problems with K and V in a paged cache.
//!
//! A paged case is an ordinary [`Case`] (its problem, seed and ragged inputs) plus a
//! [`PagedCase`] saying how the keys and values sit in the cache: page size, NHD or HND order,
//! separate or combined buffers, and how a GPU runs it ([`PagedRun`]: directly, through a replayed
//! CUDA graph, or over a cache it filled itself with its append kernel). The
//! cache is built from the case's ragged K/V ([`Case::paged_inputs`]): every page starts as NaN,
//! the pages are a seeded shuffle with spare pages left over (still NaN, so reading a page that is
//! not the request's shows), and the tokens are written with
//! [`append_paged_kv`](crate::paged::append_paged_kv). The expected output is the reference on the
//! ragged K/V, so a paged backend is judged against the same numbers as a ragged one.
//!
//! The list ([`paged_cases`]): every mask x variant pair once over the quick batches (dtypes and
//! head dims rotating, page sizes 1, 16, 64 rotating with the orders and storages); batch decode
//! (one query per request) at batch 1, 7, 64, 256 and a skewed batch of 128 requests with KV
//! lengths up to 32768, GQA groups 1, 4, 8, every variant; paged prefill (chunked prefill over a
//! cache); and, where the backend has the device paths, a decode and a paged prefill case replayed
//! from a CUDA graph and two cases whose cache the GPU fills with its own append. Then fp8 copies
//! ([`Fp8Case`]): the cache quantised by the append to e4m3 or e5m2 with scales per tensor or per
//! KV head drawn from the case's K/V range, judged against the reference on the dequantised K/V
//! ([`PagedInputs::dequantized`]); two of them with scales that saturate the largest values.

use super::grid::{grid_variants, mask_variant_pairs, DtypeConfig, MaskSpec, Point, VariantSpec};
use super::rng::SplitMix64;
use super::{BackendCaps, Case, Suite};
use crate::dtype::fp8::{Fp8Format, Fp8Tensor};
use crate::dtype::DType;
use crate::paged::{
    append_paged_kv, append_paged_kv_fp8, gather_dequantized, gather_exact, Fp8Kv, KvOrder,
    KvScales, KvStorage, PageTable, PagedAttention, PagedCache, PagedKv, PagedKvLayout, PagedKvMut,
};
use crate::problem::{HeadDims, InvalidProblem, QkAccum};
use crate::tensor::HostTensor;

/// How a case's keys and values sit in a paged cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedCase {
    /// Tokens per page.
    pub page_size: usize,
    /// NHD or HND.
    pub order: KvOrder,
    /// Separate or combined K/V buffers.
    pub storage: KvStorage,
    /// How the backend runs it.
    pub run: PagedRun,
    /// An fp8 cache (quantised by the append), or `None` for pages of the problem's dtype.
    pub fp8: Option<Fp8Case>,
}

/// The fp8 form of a paged case's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Case {
    /// The element format.
    pub format: Fp8Format,
    /// One scale per KV head (else one per tensor).
    pub per_head: bool,
    /// Scales that put the case's largest magnitudes beyond the format's range, so that the
    /// append saturates them.
    pub saturate: bool,
}

impl Fp8Case {
    /// Name fragment, e.g. `e4m3`, `e5m2-head`, `e4m3-sat`.
    pub fn name(&self) -> String {
        format!(
            "{}{}{}",
            self.format.name(),
            if self.per_head { "-head" } else { "" },
            if self.saturate { "-sat" } else { "" }
        )
    }
}

/// How a backend runs a paged case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PagedRun {
    /// Upload the cache, run once.
    Direct,
    /// Capture the run in a CUDA graph over decoy contents, write the real ones into the same
    /// buffers, replay (GPU only).
    GraphReplay,
    /// Fill an all-NaN cache on the device with the append kernel from the ragged K/V, then run
    /// (GPU only).
    DeviceAppend,
    /// Run with the split the planner would not choose (unsplit when it splits, split when it
    /// does not). The verify suite runs such a case twice, directly too, and judges both runs
    /// against the reference and against each other: split and unsplit plans must agree
    /// within rounding (GPU only).
    OppositeSplit,
}

/// Pages of the cache beyond those the batch uses (left NaN).
const SPARE_PAGES: usize = 3;
/// Salt of the page shuffle.
const SALT_PAGES: u64 = 0x9a9e;

impl PagedCase {
    /// Name fragment, e.g. `paged16-nhd-separate` (`-graph` when replayed from a graph,
    /// `-append` when the GPU fills the cache, `-e4m3`... for an fp8 cache).
    pub fn name(&self) -> String {
        format!(
            "paged{}-{}-{}{}{}",
            self.page_size,
            self.order.name().to_lowercase(),
            self.storage.name(),
            match self.run {
                PagedRun::Direct => "",
                PagedRun::GraphReplay => "-graph",
                PagedRun::DeviceAppend => "-append",
                PagedRun::OppositeSplit => "-splitpair",
            },
            self.fp8.map_or(String::new(), |f| format!("-{}", f.name()))
        )
    }
}

/// The cache buffers of a paged case: one (combined) or two (K, V), of the problem's dtype or
/// fp8 codes with their scales.
#[derive(Clone, Debug)]
pub enum CacheBuffers {
    /// Pages of the problem's dtype.
    Plain(Vec<HostTensor>),
    /// Pages of fp8 codes.
    Fp8 {
        /// The code buffers.
        pages: Vec<Fp8Tensor>,
        /// The dequantisation scales.
        scales: KvScales,
    },
}

/// The cache of a paged case and what it holds.
#[derive(Clone, Debug)]
pub struct PagedInputs {
    /// The validated paged problem.
    pub paged: PagedAttention,
    /// The cache buffers.
    pub buffers: CacheBuffers,
    /// For an fp8 cache, the ragged K and V as its readers see them (dequantised): what the
    /// expected output is computed from. `None` for a plain cache, which holds the case's K/V
    /// exactly.
    pub dequantized: Option<(HostTensor, HostTensor)>,
    /// For an fp8 cache read with f32 QK accumulation, the ragged K and V as exact values
    /// (`decode(code) * scale`, docs/semantics.md): what the expected output is computed from
    /// instead of `dequantized`.
    pub exact: Option<(Vec<f64>, Vec<f64>)>,
}

impl PagedInputs {
    /// The cache as the backends take it.
    pub fn cache(&self) -> PagedCache<'_> {
        match &self.buffers {
            CacheBuffers::Plain(b) => PagedCache::Plain(pages_of(b)),
            CacheBuffers::Fp8 { pages, scales } => PagedCache::Fp8(Fp8Kv {
                pages: pages_of(pages),
                scales,
            }),
        }
    }
}

fn pages_of<B>(buffers: &[B]) -> PagedKv<'_, B> {
    match buffers {
        [k, v] => PagedKv::Separate { k, v },
        [kv] => PagedKv::Combined(kv),
        _ => unreachable!("a cache has one or two buffers"),
    }
}

fn pages_mut_of<B>(buffers: &mut [B]) -> PagedKvMut<'_, B> {
    match buffers {
        [kb, vb] => PagedKvMut::Separate { k: kb, v: vb },
        [kv] => PagedKvMut::Combined(kv),
        _ => unreachable!("a cache has one or two buffers"),
    }
}

impl Case {
    /// The paged form of the case's K/V `k`, `v` (from [`Case::inputs`]): the cache and the
    /// problem over it (see the module docs); `None` when the case is not paged.
    pub fn paged_inputs(
        &self,
        k: &HostTensor,
        v: &HostTensor,
    ) -> Option<Result<PagedInputs, InvalidProblem>> {
        let spec = self.paged?;
        Some(build_cache(self, spec, k, v))
    }
}

/// Salt of an fp8 case's scales.
const SALT_SCALES: u64 = 0x5ca1e;

/// The scales of an fp8 case: `max|x| / largest finite` of K and of V (per head or over all
/// heads), times a seeded factor in 0.5..1.5 (so some values saturate slightly at most), or
/// times 1/16 for a saturation case (the largest values land far beyond the range).
fn fp8_scales(case: &Case, f: Fp8Case, k: &HostTensor, v: &HostTensor) -> KvScales {
    let p = &case.problem;
    let heads = p.num_kv_heads;
    let mut rng = SplitMix64::with_salt(case.seed, SALT_SCALES);
    let mut per = |t: &HostTensor, dim: usize| -> Vec<f32> {
        let mut max = vec![0f32; heads];
        for (i, x) in t.to_f32_vec().into_iter().enumerate() {
            let h = i / dim % heads;
            max[h] = max[h].max(x.abs());
        }
        if !f.per_head {
            max = vec![max.iter().copied().fold(0f32, f32::max)];
        }
        max.into_iter()
            .map(|m| {
                let factor = if f.saturate {
                    1.0 / 16.0
                } else {
                    0.5 + rng.uniform() as f32
                };
                (m.max(1e-3) / f.format.max_finite() * factor).max(f32::MIN_POSITIVE)
            })
            .collect()
    };
    let ks = per(k, p.head_dims.qk());
    let vs = per(v, p.head_dims.vo());
    KvScales::per_head(ks, vs)
}

fn build_cache(
    case: &Case,
    spec: PagedCase,
    k: &HostTensor,
    v: &HostTensor,
) -> Result<PagedInputs, InvalidProblem> {
    let p = &case.problem;
    let kv_lens: Vec<usize> = p.batch.lens().iter().map(|l| l.1).collect();
    let used: usize = kv_lens.iter().map(|l| l.div_ceil(spec.page_size)).sum();
    let num_pages = used + SPARE_PAGES;
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    let mut rng = SplitMix64::with_salt(case.seed, SALT_PAGES);
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.range_usize(0, i));
    }
    let table = PageTable::from_kv_lens(&kv_lens, spec.page_size, &ids)?;
    let layout = PagedKvLayout {
        num_pages,
        page_size: spec.page_size,
        num_kv_heads: p.num_kv_heads,
        head_dims: p.head_dims,
        order: spec.order,
        storage: spec.storage,
        dtype: p.input_dtype,
    };
    layout.validate()?;
    let lens = |make: &dyn Fn(usize) -> usize| match spec.storage {
        KvStorage::Separate => vec![make(layout.k_buffer_len()), make(layout.v_buffer_len())],
        KvStorage::Combined => vec![make(layout.k_buffer_len())],
    };
    let (buffers, dequantized, exact) = match spec.fp8 {
        None => {
            let mut buffers: Vec<HostTensor> = lens(&|n| n)
                .into_iter()
                .map(|n| HostTensor::nan(p.input_dtype, n))
                .collect();
            append_paged_kv(
                &layout,
                &table,
                &p.batch.kv_indptr,
                k,
                v,
                pages_mut_of(&mut buffers),
            )?;
            (CacheBuffers::Plain(buffers), None, None)
        }
        Some(f) => {
            let scales = fp8_scales(case, f, k, v);
            let mut pages: Vec<Fp8Tensor> = lens(&|n| n)
                .into_iter()
                .map(|n| Fp8Tensor::nan(f.format, n))
                .collect();
            append_paged_kv_fp8(
                &layout,
                &table,
                &p.batch.kv_indptr,
                (k, v),
                pages_mut_of(&mut pages),
                &scales,
            )?;
            let cache = Fp8Kv {
                pages: pages_of(&pages),
                scales: &scales,
            };
            let tokens = gather_dequantized(&layout, &table, cache)?;
            let exact = match p.qk_accum {
                QkAccum::F32 => Some(gather_exact(&layout, &table, cache)?),
                QkAccum::F16 => None,
            };
            (CacheBuffers::Fp8 { pages, scales }, Some(tokens), exact)
        }
    };
    let paged = PagedAttention::new(p.clone(), layout, table)?;
    Ok(PagedInputs {
        paged,
        buffers,
        dequantized,
        exact,
    })
}

/// Page sizes, orders and storages the grid rotates through.
const PAGE_SIZES: [usize; 3] = [1, 16, 64];
const ORDERS: [KvOrder; 2] = [KvOrder::Nhd, KvOrder::Hnd];
const STORAGES: [KvStorage; 2] = [KvStorage::Separate, KvStorage::Combined];

/// The layout of the `i`th case of a rotation: page size, order and storage each rotating.
pub(super) fn layout_at(i: usize, run: PagedRun) -> PagedCase {
    PagedCase {
        page_size: PAGE_SIZES[i % PAGE_SIZES.len()],
        order: ORDERS[(i / PAGE_SIZES.len()) % ORDERS.len()],
        storage: STORAGES[(i / 2) % STORAGES.len()],
        run,
        fp8: None,
    }
}

/// A Zipf-like skewed batch of decode requests: request `r` has about `max_kv / (r + 1)^0.8`
/// keys, at least `min_kv`, shuffled.
fn skewed_decode(
    n: usize,
    min_kv: usize,
    max_kv: usize,
    rng: &mut SplitMix64,
) -> Vec<(usize, usize)> {
    let mut lens: Vec<(usize, usize)> = (0..n)
        .map(|r| {
            let kv = (max_kv as f64 / ((r + 1) as f64).powf(0.8)) as usize;
            (1, kv.max(min_kv))
        })
        .collect();
    for i in (1..lens.len()).rev() {
        lens.swap(i, rng.range_usize(0, i));
    }
    lens
}

/// The paged cases of `suite` for a backend with `caps` (see the module docs); their points
/// and seeds follow the same rules as the ragged list's.
pub fn paged_cases(
    suite: Suite,
    base_seed: u64,
    caps: &BackendCaps,
    batches: &[Vec<(usize, usize)>],
) -> Vec<(Point, PagedCase, &'static str)> {
    let cfg = |dtype, accum| DtypeConfig { dtype, accum };
    let configs: Vec<DtypeConfig> = [
        cfg(DType::F16, QkAccum::F32),
        cfg(DType::Bf16, QkAccum::F32),
        cfg(DType::F16, QkAccum::F16),
    ]
    .into_iter()
    .filter(|&c| caps.supports(c))
    .collect();
    let dims: Vec<HeadDims> = HeadDims::all().collect();
    let mut out = Vec::new();
    if configs.is_empty() {
        return out;
    }
    let mut rng = SplitMix64::with_salt(base_seed, 0xdec0);
    // Every mask x variant pair once over the quick batches.
    for (i, mask, variant) in mask_variant_pairs() {
        let group = [1, 4, 8][i % 3];
        let kv_heads = 1 + i % 2;
        out.push((
            Point {
                config: configs[i % configs.len()],
                head_dims: dims[(i + i / 4) % dims.len()],
                mask,
                variant,
                heads: (group * kv_heads, kv_heads),
                lens: batches[i % batches.len()].clone(),
            },
            layout_at(i, PagedRun::Direct),
            "paged",
        ));
    }
    // Batch decode: one query per request.
    let decode_batches: Vec<Vec<(usize, usize)>> = {
        let mut b = vec![
            vec![(1, 32768)],
            skewed_decode(7, 1, 4096, &mut rng),
            (0..64)
                .map(|_| (1, rng.range_usize(1, 2048)))
                .collect::<Vec<_>>(),
            vec![(1, 512); 256],
        ];
        if suite == Suite::Full {
            b.push(skewed_decode(128, 64, 32768, &mut rng));
            b.push(vec![(1, 4096); 64]);
        }
        b
    };
    let mut j = 0;
    for lens in &decode_batches {
        let reps = if suite == Suite::Full { 5 } else { 2 };
        for r in 0..reps {
            let group = [4, 8, 1][(j + r) % 3];
            let kv_heads = if lens.len() >= 64 { 2 } else { 4 };
            out.push((
                Point {
                    config: configs[j % configs.len()],
                    head_dims: dims[[1, 0, 3, 2][j % 4] % dims.len()],
                    mask: [MaskSpec::None, MaskSpec::Window(100), MaskSpec::Causal][j % 3],
                    variant: grid_variants(j)[j % 5],
                    heads: (group * kv_heads, kv_heads),
                    lens: lens.clone(),
                },
                PagedCase {
                    page_size: [16, 1, 64][j % 3],
                    ..layout_at(j, PagedRun::Direct)
                },
                "decode",
            ));
            j += 1;
        }
    }
    // Paged prefill: chunks of new tokens over cached ones.
    let prefill: Vec<(usize, usize)> = (0..16)
        .map(|r| {
            let new = rng.range_usize(1, 200);
            (new, new + rng.range_usize(0, 600) + 64 * (r % 3))
        })
        .collect();
    for (n, mask) in [MaskSpec::Causal, MaskSpec::Window(128)]
        .into_iter()
        .enumerate()
    {
        out.push((
            Point {
                config: configs[n % configs.len()],
                head_dims: dims[1 % dims.len()],
                mask,
                variant: [VariantSpec::None, VariantSpec::SoftCap(50.0)][n],
                heads: (32, 8),
                lens: prefill.clone(),
            },
            PagedCase {
                page_size: 16,
                ..layout_at(n + 1, PagedRun::Direct)
            },
            "paged-prefill",
        ));
    }
    if caps.device_runs {
        out.push((
            Point {
                config: configs[0],
                head_dims: dims[1 % dims.len()],
                mask: MaskSpec::None,
                variant: VariantSpec::None,
                heads: (32, 8),
                lens: (0..48).map(|r| (1, 100 + 61 * r)).collect(),
            },
            layout_at(1, PagedRun::GraphReplay),
            "decode",
        ));
        out.push((
            Point {
                config: configs[configs.len() - 1],
                head_dims: dims[0],
                mask: MaskSpec::Causal,
                variant: VariantSpec::Sinks,
                heads: (8, 2),
                lens: vec![(33, 300), (1, 77), (64, 64)],
            },
            layout_at(4, PagedRun::GraphReplay),
            "paged-prefill",
        ));
    }
    if caps.device_runs {
        // The GPU fills the cache with its own append kernel: a decode batch with GQA in
        // combined HND pages, and a paged prefill with unequal head dims in page size 1.
        out.push((
            Point {
                config: configs[0],
                head_dims: dims[1 % dims.len()],
                mask: MaskSpec::None,
                variant: VariantSpec::SoftCap(50.0),
                heads: (16, 4),
                lens: (0..9).map(|r| (1, 1 + 97 * r)).collect(),
            },
            PagedCase {
                page_size: 16,
                order: KvOrder::Hnd,
                storage: KvStorage::Combined,
                run: PagedRun::DeviceAppend,
                fp8: None,
            },
            "decode",
        ));
        out.push((
            Point {
                config: configs[configs.len() - 1],
                head_dims: dims[dims.len() - 1],
                mask: MaskSpec::Causal,
                variant: VariantSpec::Alibi,
                heads: (7, 1),
                lens: vec![(20, 45), (1, 1), (64, 300)],
            },
            PagedCase {
                page_size: 1,
                order: KvOrder::Nhd,
                storage: KvStorage::Separate,
                run: PagedRun::DeviceAppend,
                fp8: None,
            },
            "paged-prefill",
        ));
    }
    if caps.device_runs {
        // Split pairs: each runs with the planner's split and with the opposite one. A 32k
        // decode that the planner splits (with sinks, which join once after the merge), 256
        // short decodes that it does not (forced into chunks), and the chunked prefill.
        let pairs = [
            (
                vec![(1, 32768)],
                MaskSpec::None,
                VariantSpec::Sinks,
                (8, 2),
                "decode",
            ),
            (
                vec![(1, 512); 256],
                MaskSpec::None,
                VariantSpec::SoftCap(30.0),
                (8, 2),
                "decode",
            ),
            (
                prefill.clone(),
                MaskSpec::Causal,
                VariantSpec::Alibi,
                (32, 8),
                "paged-prefill",
            ),
        ];
        for (n, (lens, mask, variant, heads, tag)) in pairs.into_iter().enumerate() {
            out.push((
                Point {
                    config: configs[n % configs.len()],
                    head_dims: dims[1 % dims.len()],
                    mask,
                    variant,
                    heads,
                    lens,
                },
                PagedCase {
                    page_size: 16,
                    ..layout_at(n, PagedRun::OppositeSplit)
                },
                tag,
            ));
        }
    }
    // Page sizes that are not powers of two (the CUDA kernels read them as one-token pages): a
    // decode batch in combined HND pages of 5, and a paged prefill in NHD pages of 12 that the
    // GPU fills with its own append kernel.
    out.push((
        Point {
            config: configs[0],
            head_dims: dims[1 % dims.len()],
            mask: MaskSpec::Window(100),
            variant: VariantSpec::None,
            heads: (16, 4),
            lens: (0..9).map(|r| (1, 1 + 61 * r)).collect(),
        },
        PagedCase {
            page_size: 5,
            order: KvOrder::Hnd,
            storage: KvStorage::Combined,
            run: PagedRun::Direct,
            fp8: None,
        },
        "decode",
    ));
    out.push((
        Point {
            config: configs[configs.len() - 1],
            head_dims: dims[0],
            mask: MaskSpec::Causal,
            variant: VariantSpec::SoftCap(30.0),
            heads: (8, 2),
            lens: vec![(33, 300), (1, 77), (64, 64)],
        },
        PagedCase {
            page_size: 12,
            order: KvOrder::Nhd,
            storage: KvStorage::Separate,
            run: if caps.device_runs {
                PagedRun::DeviceAppend
            } else {
                PagedRun::Direct
            },
            fp8: None,
        },
        "paged-prefill",
    ));
    out.extend(fp8_copies(&out));
    // A combined buffer needs equal K and V head dims.
    for (point, layout, _) in &mut out {
        if point.head_dims.qk() != point.head_dims.vo() {
            layout.storage = KvStorage::Separate;
        }
    }
    out
}

/// fp8 copies of the plain cases (see the module docs): every mask x variant pair, every other
/// decode case, every paged prefill and device-path case, with both formats and per-tensor and
/// per-head scales rotating; the first decode and the first paged prefill copy saturate.
fn fp8_copies(plain: &[(Point, PagedCase, &'static str)]) -> Vec<(Point, PagedCase, &'static str)> {
    let mut out: Vec<(Point, PagedCase, &'static str)> = Vec::new();
    let mut decode = 0;
    for (point, layout, tag) in plain {
        if *tag == "decode" && layout.run == PagedRun::Direct {
            decode += 1;
            if decode % 2 == 0 {
                continue;
            }
        }
        let n = out.len();
        let saturate = match *tag {
            "decode" | "paged-prefill" => !out.iter().any(|(_, _, t)| t == tag),
            _ => false,
        };
        let fp8 = Fp8Case {
            format: Fp8Format::ALL[n % 2],
            per_head: (n / 2) % 2 == 1,
            saturate,
        };
        out.push((
            point.clone(),
            PagedCase {
                fp8: Some(fp8),
                ..*layout
            },
            tag,
        ));
    }
    out
}

/// The case name of a paged point.
pub fn paged_case_name(point: &Point, paged: &PagedCase, tag: &str) -> String {
    format!("{}/{}/{tag}", point.name(), paged.name())
}
