//! Benchmark shapes: the one list (`bench/shapes.json`) that `attnforge bench` and the peers'
//! script (`bench/peers.py`) both run, and the one FLOP and byte formula both report with.
//!
//! `attnforge bench --print-shapes` writes the resolved list (each shape plus `flops` and
//! `bytes`) that the peers' script reads, so no formula exists twice.

use crate::dtype::DType;
use crate::problem::{
    AttentionProblem, HeadDims, InvalidProblem, Mask, QkAccum, RaggedBatch, Variant,
};
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
}

fn default_accum() -> String {
    "f32".into()
}

/// The file's layout.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShapeFile {
    /// Prefill shapes.
    pub prefill: Vec<PrefillShape>,
}

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
            RaggedBatch::from_lens(&lens),
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

    /// The shape with its FLOP and byte counts.
    pub fn resolve(&self) -> Result<ResolvedShape, InvalidProblem> {
        let p = self.problem()?;
        Ok(ResolvedShape {
            shape: self.clone(),
            flops: prefill_flops(&p),
            bytes: prefill_bytes(&p),
        })
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

/// Bytes a prefill must move at least: Q, K and V read once, O written once.
pub fn prefill_bytes(p: &AttentionProblem) -> f64 {
    let (qo, kv) = (p.batch.total_qo() as f64, p.batch.total_kv() as f64);
    let (dqk, dvo) = (p.head_dims.qk() as f64, p.head_dims.vo() as f64);
    let (hq, hkv) = (p.num_qo_heads as f64, p.num_kv_heads as f64);
    let input = p.input_dtype.size_bytes() as f64;
    let output = p.output_dtype.size_bytes() as f64;
    input * (qo * hq * dqk + kv * hkv * (dqk + dvo)) + output * qo * hq * dvo
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
        assert!(!file.prefill.is_empty());
        for s in &file.prefill {
            s.resolve().unwrap_or_else(|e| panic!("{}: {e}", s.name));
        }
    }
}
