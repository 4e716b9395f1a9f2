//! Benchmark shapes: the one list (`bench/shapes.json`) that `attnforge bench` and the peers'
//! script (`bench/peers.py`) both run, and the one FLOP and byte formula both report with.
//!
//! `attnforge bench --print-shapes` writes the resolved list (each shape plus `flops` and
//! `bytes`) that the peers' script reads, so no formula exists twice.
//!
//! Three kinds of shape: prefill over ragged K/V (the `prefill` list), and in the `paged` list
//! attention over a paged cache (batch decode, paged prefill) and the append of new tokens'
//! K/V into a paged cache (`append: true`, [`append_bytes`]).

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
    /// Paged shapes only: the shape is the append of each request's `qo_lens` new tokens' K and
    /// V (of `dtype`) into its pages, `kv_lens` being its length after the append, rather than
    /// attention (no queries: `num_qo_heads` equals `num_kv_heads`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub append: bool,
}

fn default_accum() -> String {
    "f32".into()
}

/// The file's layout.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShapeFile {
    /// Prefill shapes (ragged K/V).
    pub prefill: Vec<PrefillShape>,
    /// Paged shapes, each with a `page_size`: batch decode (every `qo_len` 1), paged prefill,
    /// and appends (`append`).
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
    /// Floating-point operations (see [`prefill_flops`]; none for an append).
    pub flops: f64,
    /// Bytes of Q, K, V read and O written ([`prefill_bytes`]); for an append, the new K/V
    /// read, the cache written and the index entries read ([`append_bytes`]).
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
        if self.append {
            self.check_append(&p)?;
        }
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
        let (flops, bytes) = match (self.append, self.page_size) {
            (true, Some(page_size)) => (0.0, append_bytes(&p, kv_bytes, page_size)),
            _ => (prefill_flops(&p), prefill_bytes(&p, kv_bytes)),
        };
        Ok(ResolvedShape {
            shape: self.clone(),
            flops,
            bytes,
            pages,
        })
    }

    /// What an append shape must be beyond a problem: paged, one head count (no queries), no
    /// mask or variant, and every request's new tokens within its length.
    fn check_append(&self, p: &AttentionProblem) -> Result<(), InvalidProblem> {
        let bad = |what: &str, why: String| {
            Err(InvalidProblem::new(
                format!("shape {} {what}", self.name),
                why,
            ))
        };
        if self.page_size.is_none() {
            return bad(
                "append",
                "is for paged shapes (with a page_size) only".into(),
            );
        }
        if self.num_qo_heads != self.num_kv_heads {
            return bad(
                "num_qo_heads",
                format!(
                    "is {} but an append has no queries: give num_kv_heads ({})",
                    self.num_qo_heads, self.num_kv_heads
                ),
            );
        }
        if self.causal || self.soft_cap.is_some() {
            return bad("append", "takes no mask and no soft-cap".into());
        }
        if let Some(r) = p.batch.lens().iter().position(|&(new, len)| new > len) {
            return bad(
                "qo_lens",
                format!(
                    "request {r} appends {} tokens but kv_lens gives it {}",
                    self.qo_lens[r], self.kv_lens[r]
                ),
            );
        }
        Ok(())
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

/// Bytes an append must move at least: the new tokens' K and V rows read (`qo` tokens per
/// request, of the input dtype), the same elements written into the cache (`kv_bytes` bytes
/// each when given, an fp8 cache: 1, else the input dtype), and the 4-byte index entries read:
/// the new-token and page indptrs, each request's length, and the page ids of the pages that
/// receive new tokens.
pub fn append_bytes(p: &AttentionProblem, kv_bytes: Option<usize>, page_size: usize) -> f64 {
    let lens = p.batch.lens();
    let elements =
        (p.batch.total_qo() * p.num_kv_heads) as f64 * (p.head_dims.qk() + p.head_dims.vo()) as f64;
    let input = p.input_dtype.size_bytes() as f64;
    let cache = kv_bytes.map_or(input, |b| b as f64);
    let ps = page_size.max(1);
    let pages_written: usize = lens
        .iter()
        .filter(|&&(new, _)| new > 0)
        .map(|&(new, len)| len.div_ceil(ps) - (len - new.min(len)) / ps)
        .sum();
    let indices = 3 * lens.len() + 2 + pages_written;
    (input + cache) * elements + 4.0 * indices as f64
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
            append: false,
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

    fn append_shape(news: &[usize], lens: &[usize], kv_dtype: Option<&str>) -> PrefillShape {
        PrefillShape {
            qo_lens: news.to_vec(),
            kv_lens: lens.to_vec(),
            num_qo_heads: 8,
            page_size: Some(16),
            kv_dtype: kv_dtype.map(Into::into),
            append: true,
            ..shape(false, 1, 1)
        }
    }

    #[test]
    fn an_append_moves_its_rows_twice_and_reads_its_indices() {
        // Request 0: 1 new token at position 20 (page 1); request 1: 20 new tokens at 12..32
        // (pages 0 and 1).
        let r = append_shape(&[1, 20], &[21, 32], None).resolve().unwrap();
        let elements = 21.0 * 8.0 * 256.0;
        let indices = 4.0 * (3.0 * 2.0 + 2.0 + 1.0 + 2.0);
        assert_eq!(r.flops, 0.0);
        assert_eq!(r.bytes, 4.0 * elements + indices);
        let fp8 = append_shape(&[1, 20], &[21, 32], Some("e4m3"))
            .resolve()
            .unwrap();
        assert_eq!(fp8.bytes, 3.0 * elements + indices);
        assert!(fp8.pages.is_some());
    }

    #[test]
    fn an_append_shape_that_is_not_one_is_refused() {
        assert!(append_shape(&[5], &[4], None).resolve().is_err());
        let mut queries = append_shape(&[1], &[4], None);
        queries.num_qo_heads = 32;
        assert!(queries.resolve().is_err());
        let mut ragged = append_shape(&[1], &[4], None);
        ragged.page_size = None;
        assert!(ragged.resolve().is_err());
        let mut masked = append_shape(&[1], &[4], None);
        masked.causal = true;
        assert!(masked.resolve().is_err());
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
