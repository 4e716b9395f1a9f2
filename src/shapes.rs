//! Benchmark shapes: the one list (`bench/shapes.json`) that `attnforge bench` and the peers'
//! script (`bench/peers.py`) both run, and the one FLOP and byte formula both report with.
//!
//! `attnforge bench --print-shapes` writes the resolved list (each shape plus `flops` and
//! `bytes`) that the peers' script reads, so no formula exists twice.

use crate::dtype::fp8::Fp8Format;
use crate::dtype::DType;
use crate::paged::{KvOrder, KvStorage, PageTable, PagedAttention, PagedKvLayout};
use crate::problem::{
    AttentionProblem, HeadDims, InvalidProblem, Mask, QkAccum, RaggedBatch, Variant,
};
use crate::testing::rng::SplitMix64;
use serde::{Deserialize, Serialize};

/// One prefill benchmark shape, as `bench/shapes.json` writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefillShape {
    /// Readable, unique name.
    pub name: String,
    /// Whether the default selection runs it.
    #[serde(default)]
    pub default: bool,
    /// Query lengths, one per request (one entry: single prefill).
    pub qo_lens: Vec<usize>,
    /// Key/value lengths, one per request.
    pub kv_lens: Vec<usize>,
    /// Query heads.
    pub num_qo_heads: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Head dim (qk = vo) unless the pair below is given.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Head dim of q and k, with `head_dim_vo`.
    #[serde(default)]
    pub head_dim_qk: Option<usize>,
    /// Head dim of v and o.
    #[serde(default)]
    pub head_dim_vo: Option<usize>,
    /// Causal mask.
    pub causal: bool,
    /// `f16` or `bf16`.
    pub dtype: String,
    /// Soft-cap, if any.
    #[serde(default)]
    pub soft_cap: Option<f32>,
    /// `f32` or `f16`.
    #[serde(default = "default_accum")]
    pub qk_accum: String,
    /// Paged shapes only: tokens per page of the cache (NHD, separate K and V).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<usize>,
    /// Paged shapes only: an fp8 cache (`e4m3`, `e5m2`) instead of one of `dtype`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_dtype: Option<String>,
}

fn default_accum() -> String {
    "f32".into()
}

/// The file's layout.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShapeFile {
    /// Prefill shapes (ragged K/V).
    pub prefill: Vec<PrefillShape>,
    /// Paged shapes: batch decode (every `qo_len` 1) and paged prefill, each with a `page_size`.
    #[serde(default)]
    pub paged: Vec<PrefillShape>,
}

/// The page table of a paged shape, as the peers take it (FlashInfer's `paged_kv_indptr`,
/// `paged_kv_indices`, `paged_kv_last_page_len`) and the cache size.
#[derive(Clone, Debug, Serialize)]
pub struct ResolvedPages {
    /// Pages in the cache.
    pub num_pages: usize,
    /// Pages per request, prefix sums.
    pub kv_page_indptr: Vec<i32>,
    /// Page ids (a seeded shuffle of `0..num_pages`).
    pub kv_page_indices: Vec<i32>,
    /// Tokens in each request's last page.
    pub kv_last_page_len: Vec<i32>,
}

/// Seed of the page shuffle of paged shapes: both sides read the table from the resolved list.
const PAGE_SHUFFLE_SEED: u64 = 0x9a6e_5eed;

/// A shape with its work figures.
#[derive(Clone, Debug, Serialize)]
pub struct ResolvedShape {
    /// The shape.
    #[serde(flatten)]
    pub shape: PrefillShape,
    /// Floating-point operations (see [`prefill_flops`]).
    pub flops: f64,
    /// Bytes of Q, K, V read and O written.
    pub bytes: f64,
    /// Paged shapes: the page table.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub pages: Option<ResolvedPages>,
}

impl PrefillShape {
    /// The head dims.
    pub fn head_dims(&self) -> Result<HeadDims, InvalidProblem> {
        match (self.head_dim, self.head_dim_qk, self.head_dim_vo) {
            (Some(d), None, None) => HeadDims::equal(d),
            (None, Some(qk), Some(vo)) => HeadDims::new(qk, vo),
            _ => Err(InvalidProblem::new(
                format!("shape {} head dims", self.name),
                "give either head_dim or both head_dim_qk and head_dim_vo",
            )),
        }
    }

    /// The attention problem this shape describes.
    pub fn problem(&self) -> Result<AttentionProblem, InvalidProblem> {
        if self.qo_lens.len() != self.kv_lens.len() {
            return Err(InvalidProblem::new(
                format!("shape {} kv_lens", self.name),
                format!(
                    "{} entries but qo_lens has {}",
                    self.kv_lens.len(),
                    self.qo_lens.len()
                ),
            ));
        }
        let dtype = DType::parse(&self.dtype).ok_or_else(|| {
            InvalidProblem::new(
                format!("shape {} dtype", self.name),
                format!("{:?}", self.dtype),
            )
        })?;
        let accum = match self.qk_accum.as_str() {
            "f32" => QkAccum::F32,
            "f16" => QkAccum::F16,
            other => {
                return Err(InvalidProblem::new(
                    format!("shape {} qk_accum", self.name),
                    format!("{other:?}"),
                ))
            }
        };
        let lens: Vec<(usize, usize)> = self
            .qo_lens
            .iter()
            .copied()
            .zip(self.kv_lens.iter().copied())
            .collect();
        let mut p = AttentionProblem::new(
            RaggedBatch::from_lens(&lens)
                .map_err(|e| InvalidProblem::new(format!("shape {}", self.name), e.to_string()))?,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dims()?,
            dtype,
        )
        .with_qk_accum(accum)
        .with_mask(if self.causal {
            Mask::Causal
        } else {
            Mask::None
        });
        if let Some(cap) = self.soft_cap {
            p = p.with_variant(Variant::SoftCap { cap });
        }
        p.validate()?;
        Ok(p)
    }

    /// The fp8 format of a paged shape's cache (`None`: the cache holds `dtype`); an error for
    /// an unknown name or a shape that is not paged.
    pub fn kv_fp8(&self) -> Result<Option<Fp8Format>, InvalidProblem> {
        let Some(name) = &self.kv_dtype else {
            return Ok(None);
        };
        if self.page_size.is_none() {
            return Err(InvalidProblem::new(
                format!("shape {} kv_dtype", self.name),
                "is for paged shapes (with a page_size) only",
            ));
        }
        Fp8Format::parse(name).map(Some).ok_or_else(|| {
            InvalidProblem::new(
                format!("shape {} kv_dtype", self.name),
                format!("{name:?} is not an fp8 format (e4m3, e5m2)"),
            )
        })
    }

    /// The shape with its FLOP and byte counts (and its page table when paged).
    pub fn resolve(&self) -> Result<ResolvedShape, InvalidProblem> {
        let p = self.problem()?;
        let kv_bytes = self.kv_fp8()?.map(|_| 1);
        let pages = match self.page_size {
            Some(_) => {
                let paged = self.paged_problem()?;
                let t = paged.table();
                Some(ResolvedPages {
                    num_pages: paged.layout().num_pages,
                    kv_page_indptr: t.kv_page_indptr.clone(),
                    kv_page_indices: t.kv_page_indices.clone(),
                    kv_last_page_len: t.kv_last_page_len.clone(),
                })
            }
            None => None,
        };
        Ok(ResolvedShape {
            shape: self.clone(),
            flops: prefill_flops(&p),
            bytes: prefill_bytes(&p, kv_bytes),
            pages,
        })
    }

    /// The paged problem of a paged shape: the cache holds exactly the batch's pages (NHD,
    /// separate K and V), in a seeded shuffle.
    pub fn paged_problem(&self) -> Result<PagedAttention, InvalidProblem> {
        let page_size = self.page_size.ok_or_else(|| {
            InvalidProblem::new(
                format!("shape {} page_size", self.name),
                "is missing: not a paged shape",
            )
        })?;
        let p = self.problem()?;
        let kv_lens: Vec<usize> = p.batch.lens().iter().map(|l| l.1).collect();
        let num_pages: usize = kv_lens.iter().map(|l| l.div_ceil(page_size.max(1))).sum();
        let mut ids: Vec<i32> = (0..num_pages as i32).collect();
        let mut rng = SplitMix64::new(PAGE_SHUFFLE_SEED);
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.range_usize(0, i));
        }
        let table = PageTable::from_kv_lens(&kv_lens, page_size, &ids)?;
        let layout = PagedKvLayout {
            num_pages,
            page_size,
            num_kv_heads: p.num_kv_heads,
            head_dims: p.head_dims,
            order: KvOrder::Nhd,
            storage: KvStorage::Separate,
            dtype: p.input_dtype,
        };
        PagedAttention::new(p, layout, table)
    }
}

/// FLOPs of a prefill problem: `2 * (head_dim_qk + head_dim_vo) * heads` per (query, key) pair
/// (`4 * D * heads` when qk = vo), over `qo * kv` pairs per request; for a causal mask, half of
/// that when `qo = kv` (the convention peers report with) and the exact count of visible pairs
/// otherwise.
pub fn prefill_flops(p: &AttentionProblem) -> f64 {
    let per_pair = 2.0 * (p.head_dims.qk() + p.head_dims.vo()) as f64 * p.num_qo_heads as f64;
    let pairs: f64 = p
        .batch
        .lens()
        .iter()
        .map(|&(qo, kv)| match p.mask {
            Mask::Causal if qo == kv => (qo * kv) as f64 / 2.0,
            Mask::Causal => {
                let d = kv as i64 - qo as i64;
                (0..qo as i64)
                    .map(|i| (i + d + 1).clamp(0, kv as i64) as f64)
                    .sum()
            }
            _ => (qo * kv) as f64,
        })
        .sum();
    per_pair * pairs
}

/// Bytes a prefill must move at least: Q, K and V read once, O written once; K and V elements
/// of `kv_bytes` bytes each when given (an fp8 cache: 1), else of the input dtype.
pub fn prefill_bytes(p: &AttentionProblem, kv_bytes: Option<usize>) -> f64 {
    let (qo, kv) = (p.batch.total_qo() as f64, p.batch.total_kv() as f64);
    let (dqk, dvo) = (p.head_dims.qk() as f64, p.head_dims.vo() as f64);
    let (hq, hkv) = (p.num_qo_heads as f64, p.num_kv_heads as f64);
    let input = p.input_dtype.size_bytes() as f64;
    let kv_elem = kv_bytes.map_or(input, |b| b as f64);
    let output = p.output_dtype.size_bytes() as f64;
    input * qo * hq * dqk + kv_elem * kv * hkv * (dqk + dvo) + output * qo * hq * dvo
}

/// Parses a shape file.
pub fn parse(text: &str) -> Result<ShapeFile, InvalidProblem> {
    serde_json::from_str(text).map_err(|e| InvalidProblem::new("shape file", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(causal: bool, qo: usize, kv: usize) -> PrefillShape {
        PrefillShape {
            name: "t".into(),
            default: true,
            qo_lens: vec![qo],
            kv_lens: vec![kv],
            num_qo_heads: 32,
            num_kv_heads: 8,
            head_dim: Some(128),
            head_dim_qk: None,
            head_dim_vo: None,
            causal,
            dtype: "f16".into(),
            soft_cap: None,
            qk_accum: "f32".into(),
            page_size: None,
            kv_dtype: None,
        }
    }

    #[test]
    fn flops_follow_the_published_convention() {
        let full = shape(false, 4096, 4096).resolve().unwrap().flops;
        assert_eq!(full, 4.0 * 4096.0 * 4096.0 * 32.0 * 128.0);
        let causal = shape(true, 4096, 4096).resolve().unwrap().flops;
        assert_eq!(causal, full / 2.0);
        // qo < kv causal: query i sees i + d + 1 keys.
        let append = shape(true, 2, 5).resolve().unwrap().flops;
        assert_eq!(append, 4.0 * 32.0 * 128.0 * (4.0 + 5.0));
    }

    #[test]
    fn bytes_count_each_tensor_once() {
        let b = shape(false, 10, 20).resolve().unwrap().bytes;
        assert_eq!(
            b,
            2.0 * (10.0 * 32.0 * 128.0 * 2.0 + 20.0 * 8.0 * 128.0 * 2.0)
        );
    }

    #[test]
    fn the_repository_shape_file_parses_and_resolves() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/shapes.json"))
                .expect("bench/shapes.json is part of the repository");
        let file = parse(&text).unwrap();
        assert!(!file.prefill.is_empty() && !file.paged.is_empty());
        for s in &file.prefill {
            assert!(
                s.page_size.is_none(),
                "{}: prefill shapes are ragged",
                s.name
            );
            s.resolve().unwrap_or_else(|e| panic!("{}: {e}", s.name));
        }
        for s in &file.paged {
            let r = s.resolve().unwrap_or_else(|e| panic!("{}: {e}", s.name));
            let pages = r.pages.expect("paged shapes resolve a page table");
            let mut ids = pages.kv_page_indices.clone();
            ids.sort();
            assert!(
                ids.iter().copied().eq(0..pages.num_pages as i32),
                "{}",
                s.name
            );
        }
    }
}
