//! The fp8 paged KV cache: pages of e4m3 or e5m2 codes ([`Fp8Tensor`]) with f32 scales per
//! tensor or per KV head ([`KvScales`]), and its exact dequantisation.
//!
//! The dequantised element of code `c` in KV head `h` is `T(f32(decode(c)) * scale[h])`: the code
//! decoded exactly, multiplied by the head's K or V scale as an f32 product (rounded to nearest
//! even), then rounded to nearest even to the problem's dtype `T` (the layout's `dtype`: f16 or
//! bf16 on the GPU, f32 too on the CPU). The reference dequantises the whole cache
//! ([`dequantize`]) and runs the plain paged path; the CPU backend dequantises the tokens it
//! gathers ([`gather_dequantized`]); GPU kernels write the same values into their tiles. The
//! definitions are in `docs/semantics.md` ("fp8 KV cache").

use super::layout::{KvStorage, PagedKv, PagedKvLayout};
use super::table::PageTable;
use crate::dtype::fp8::{Fp8Format, Fp8Tensor};
use crate::dtype::DType;
use crate::problem::{InvalidProblem, Validation};
use crate::tensor::HostTensor;
use half::{bf16, f16};
use rayon::prelude::*;

/// The dequantisation scales of an fp8 cache: one f32 for all of K (and one for V), or one per
/// KV head.
#[derive(Clone, Debug, PartialEq)]
pub struct KvScales {
    /// K scales: one entry (per tensor) or `num_kv_heads` entries (per head).
    pub k: Vec<f32>,
    /// V scales, counted as `k` is.
    pub v: Vec<f32>,
}

impl KvScales {
    /// One scale for all of K and one for all of V (FlashInfer's `k_scale`, `v_scale`).
    pub fn per_tensor(k: f32, v: f32) -> KvScales {
        KvScales {
            k: vec![k],
            v: vec![v],
        }
    }

    /// One K scale and one V scale per KV head.
    pub fn per_head(k: Vec<f32>, v: Vec<f32>) -> KvScales {
        KvScales { k, v }
    }

    /// Whether there is one scale per KV head (else one per tensor).
    pub fn is_per_head(&self) -> bool {
        self.k.len() > 1
    }

    /// The K (`is_k`) or V scale of KV head `head`.
    pub fn scale(&self, is_k: bool, head: usize) -> f32 {
        let s = if is_k { &self.k } else { &self.v };
        if s.len() == 1 {
            s[0]
        } else {
            s[head]
        }
    }

    /// Checks the counts (1, or `num_kv_heads` for both K and V), that every scale is finite and
    /// positive, and that the largest finite code of `format` times every scale stays finite in
    /// `dtype` (so a finite code never dequantises to an infinity).
    pub fn validate(&self, num_kv_heads: usize, format: Fp8Format, dtype: DType) -> Validation {
        if self.k.len() != self.v.len() {
            return Err(InvalidProblem::new(
                "v_scale",
                format!(
                    "has {} entries but k_scale has {}; both are per tensor (1) or per head ({num_kv_heads})",
                    self.v.len(),
                    self.k.len()
                ),
            ));
        }
        let limit = f64::from(match dtype {
            DType::F16 => f16::MAX.to_f32(),
            DType::Bf16 => bf16::MAX.to_f32(),
            DType::F32 => f32::MAX,
        });
        for (name, s) in [("k_scale", &self.k), ("v_scale", &self.v)] {
            if s.len() != 1 && s.len() != num_kv_heads {
                return Err(InvalidProblem::new(
                    name,
                    format!(
                        "has {} entries; it needs 1 (per tensor) or {num_kv_heads} (one per KV head)",
                        s.len()
                    ),
                ));
            }
            for (h, &x) in s.iter().enumerate() {
                if !x.is_finite() || x <= 0.0 {
                    return Err(InvalidProblem::new(
                        format!("{name}[{h}]"),
                        format!("is {x}; a scale must be finite and positive"),
                    ));
                }
                let top = f64::from(format.max_finite() * x);
                if top > limit {
                    return Err(InvalidProblem::new(
                        format!("{name}[{h}]"),
                        format!(
                            "is {x}: the largest {format} value {} times it is {top:e}, beyond the largest finite {dtype}",
                            format.max_finite()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// An fp8 cache to read: its pages and scales.
#[derive(Clone, Copy, Debug)]
pub struct Fp8Kv<'a> {
    /// The pages of codes, stored as the layout says.
    pub pages: PagedKv<'a, Fp8Tensor>,
    /// The dequantisation scales.
    pub scales: &'a KvScales,
}

impl Fp8Kv<'_> {
    /// The format of the K buffer (the V buffer must have the same, see
    /// [`validate`](Self::validate)).
    pub fn format(&self) -> Fp8Format {
        self.pages.k_and_v().0.format
    }

    /// Checks the buffers against the layout (storage, sizes, one format for K and V) and the
    /// scales against the layout's heads and dtype.
    pub fn validate(&self, layout: &PagedKvLayout) -> Validation {
        let format = self.format();
        layout.validate_buffers_of(self.pages, format.name())?;
        self.scales
            .validate(layout.num_kv_heads, format, layout.dtype)
    }
}

/// A paged cache of either kind, as the backends take it.
#[derive(Clone, Copy, Debug)]
pub enum PagedCache<'a> {
    /// Pages of the problem's dtype.
    Plain(PagedKv<'a>),
    /// Pages of fp8 codes with scales.
    Fp8(Fp8Kv<'a>),
}

impl<'a> From<PagedKv<'a>> for PagedCache<'a> {
    fn from(pages: PagedKv<'a>) -> Self {
        PagedCache::Plain(pages)
    }
}

impl<'a> From<Fp8Kv<'a>> for PagedCache<'a> {
    fn from(cache: Fp8Kv<'a>) -> Self {
        PagedCache::Fp8(cache)
    }
}

impl PagedCache<'_> {
    /// The fp8 format of the pages, `None` for a plain cache.
    pub fn fp8_format(&self) -> Option<Fp8Format> {
        match self {
            PagedCache::Plain(_) => None,
            PagedCache::Fp8(c) => Some(c.format()),
        }
    }
}

/// The whole fp8 cache dequantised to the layout's dtype, in the same layout (one buffer for
/// combined storage, else K then V); every code is dequantised, NaN codes of unwritten pages
/// included. Validates the cache first.
pub fn dequantize(layout: &PagedKvLayout, cache: Fp8Kv<'_>) -> Validation<Vec<HostTensor>> {
    cache.validate(layout)?;
    let scales = cache.scales;
    let (k, v) = cache.pages.k_and_v();
    let heads = layout.num_kv_heads;
    let (dqk, dvo) = (layout.head_dims.qk(), layout.head_dims.vo());
    // Which K/V head every element of a buffer belongs to, from the layout's own addresses.
    let mut k_vals: Vec<f32> = vec![f32::NAN; layout.k_buffer_len()];
    let mut v_vals: Vec<f32> = match layout.storage {
        KvStorage::Separate => vec![f32::NAN; layout.v_buffer_len()],
        KvStorage::Combined => Vec::new(),
    };
    for page in 0..layout.num_pages {
        for slot in 0..layout.page_size {
            for h in 0..heads {
                let at = layout.k_index(page, slot, h, 0);
                let ks = scales.scale(true, h);
                for (d, &c) in k_vals[at..at + dqk].iter_mut().zip(&k.codes[at..at + dqk]) {
                    *d = dequantize_code(k.format, c, ks);
                }
                let at = layout.v_index(page, slot, h, 0);
                let dst = match layout.storage {
                    KvStorage::Separate => &mut v_vals,
                    KvStorage::Combined => &mut k_vals,
                };
                let vs = scales.scale(false, h);
                for (d, &c) in dst[at..at + dvo].iter_mut().zip(&v.codes[at..at + dvo]) {
                    *d = dequantize_code(v.format, c, vs);
                }
            }
        }
    }
    let mut out = vec![HostTensor::from_f32(layout.dtype, &k_vals)];
    if layout.storage == KvStorage::Separate {
        out.push(HostTensor::from_f32(layout.dtype, &v_vals));
    }
    Ok(out)
}

/// The keys and values of every request of `table`, dequantised to the layout's dtype, as
/// contiguous ragged tensors (what [`super::gather`] gives for a plain cache). Validates the
/// cache and the table first.
pub fn gather_dequantized(
    layout: &PagedKvLayout,
    table: &PageTable,
    cache: Fp8Kv<'_>,
) -> Validation<(HostTensor, HostTensor)> {
    let (k, v) = gather_values(layout, table, cache, dequantize_code)?;
    Ok((
        HostTensor::from_f32(layout.dtype, &k),
        HostTensor::from_f32(layout.dtype, &v),
    ))
}

/// The keys and values of every request of `table` as exact values, `decode(code) * scale` in
/// f64 (exact: a code has at most 4 significant bits, a scale 24), in the ragged layout of
/// [`gather_dequantized`]: what the f32-QK kernels compute with. Validates the cache and the
/// table first.
pub fn gather_exact(
    layout: &PagedKvLayout,
    table: &PageTable,
    cache: Fp8Kv<'_>,
) -> Validation<(Vec<f64>, Vec<f64>)> {
    gather_values(layout, table, cache, |format, code, scale| {
        f64::from(format.decode(code)) * f64::from(scale)
    })
}

/// Every request's K and V rows, in request order, each element `value(format, code, scale)`.
fn gather_values<X: Copy + Default + Send>(
    layout: &PagedKvLayout,
    table: &PageTable,
    cache: Fp8Kv<'_>,
    value: impl Fn(Fp8Format, u8, f32) -> X + Sync,
) -> Validation<(Vec<X>, Vec<X>)> {
    cache.validate(layout)?;
    table.validate(layout.page_size, layout.num_pages)?;
    let (k_src, v_src) = cache.pages.k_and_v();
    let ps = layout.page_size;
    let heads = layout.num_kv_heads;
    let (dqk, dvo) = (layout.head_dims.qk(), layout.head_dims.vo());
    // Every token's (page, slot) in request order, then the rows in parallel (a benchmark's cache
    // is gigabytes).
    let slots: Vec<(usize, usize)> = (0..table.batch_size())
        .flat_map(|r| (0..table.kv_len(r, ps)).map(move |j| table.locate(r, j, ps)))
        .collect();
    let rows = |codes: &Fp8Tensor, is_k: bool, dim: usize| -> Vec<X> {
        let mut out = vec![X::default(); slots.len() * heads * dim];
        out.par_chunks_mut(heads * dim)
            .zip(&slots)
            .for_each(|(token, &(page, slot))| {
                for (h, row) in token.chunks_mut(dim).enumerate() {
                    let at = if is_k {
                        layout.k_index(page, slot, h, 0)
                    } else {
                        layout.v_index(page, slot, h, 0)
                    };
                    let scale = cache.scales.scale(is_k, h);
                    for (d, &c) in row.iter_mut().zip(&codes.codes[at..at + dim]) {
                        *d = value(codes.format, c, scale);
                    }
                }
            });
        out
    };
    Ok((rows(k_src, true, dqk), rows(v_src, false, dvo)))
}

/// `f32(decode(code)) * scale`, one f32 rounding; the caller rounds it to the problem's dtype.
pub fn dequantize_code(format: Fp8Format, code: u8, scale: f32) -> f32 {
    format.decode(code) * scale
}

/// The code that the quantising append stores for `x` with `scale`: `encode(x / scale)`, the
/// division an f32 one (nearest even), the encoding nearest even with saturation.
pub fn quantize_value(format: Fp8Format, x: f32, scale: f32) -> u8 {
    format.encode(x / scale)
}
