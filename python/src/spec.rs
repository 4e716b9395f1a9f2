//! Attention options from Python into an [`AttentionProblem`].
//!
//! The Python layer has already mapped FlashInfer's arguments (and refused the ones attnforge does
//! not run); what arrives is a dict of the options below, named as in the Rust problem model.

use crate::errors::{invalid, unsupported, IntoPy};
use attnforge::problem::{CustomMask, QkAccum};
use attnforge::{AttentionProblem, DType, HeadDims, Mask, RaggedBatch, Variant};
use pyo3::prelude::*;

/// The options of one attention problem, from a Python dict.
#[derive(Clone, Debug, FromPyObject)]
#[pyo3(from_item_all)]
pub struct AttnSpec {
    /// Query heads.
    pub num_qo_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Head dim of q and k.
    pub head_dim_qk: usize,
    /// Head dim of v and o.
    pub head_dim_vo: usize,
    /// `f16`, `bf16` or `f32`.
    pub dtype: String,
    /// Causal mask (bottom-right aligned).
    pub causal: bool,
    /// Keys left of the diagonal that stay visible; -1 for no window.
    pub window_left: i64,
    /// Logit soft cap, if any.
    pub soft_cap: Option<f32>,
    /// ALiBi slopes, one per query head, if any (never together with a soft cap or sinks).
    pub alibi_slopes: Option<Vec<f32>>,
    /// Attention-sink logits, one per query head, if any (never with a soft cap or ALiBi).
    #[pyo3(default)]
    pub sinks: Option<Vec<f32>>,
    /// Scale of the dot product.
    pub sm_scale: f32,
    /// f16 QK accumulation.
    pub f16_qk: bool,
    /// A custom mask: packed bits (little-endian bit order) and byte offsets per request.
    pub packed_mask: Option<(Vec<u8>, Vec<usize>)>,
}

impl AttnSpec {
    /// The element type.
    pub fn dtype(&self) -> PyResult<DType> {
        DType::parse(&self.dtype)
            .ok_or_else(|| invalid("dtype", format!("{} is not f16, bf16 or f32", self.dtype)))
    }

    /// The head dims.
    pub fn head_dims(&self) -> PyResult<HeadDims> {
        HeadDims::new(self.head_dim_qk, self.head_dim_vo).py()
    }

    fn mask(&self) -> PyResult<Mask> {
        if let Some((packed, mask_indptr)) = &self.packed_mask {
            return Ok(Mask::Custom(CustomMask {
                packed: packed.clone(),
                mask_indptr: mask_indptr.clone(),
            }));
        }
        Ok(match (self.causal, self.window_left) {
            (_, w) if w < -1 => {
                return Err(invalid(
                    "window_left",
                    format!("is {w}; expected -1 or >= 0"),
                ))
            }
            (true, -1) => Mask::Causal,
            (true, w) => Mask::SlidingWindow { window_left: w },
            (false, -1) => Mask::None,
            (false, _) => {
                return Err(unsupported(
                    "window_left >= 0 without causal=True: attnforge's sliding window is causal",
                ))
            }
        })
    }

    fn variant(&self) -> PyResult<Variant> {
        let given = [
            self.soft_cap.is_some(),
            self.alibi_slopes.is_some(),
            self.sinks.is_some(),
        ];
        if given.iter().filter(|&&g| g).count() > 1 {
            return Err(unsupported(
                "more than one of logits_soft_cap, ALiBi and sinks: a problem has one logits \
                 transform (attnforge's variants)",
            ));
        }
        Ok(match (self.soft_cap, &self.alibi_slopes, &self.sinks) {
            (Some(cap), _, _) => Variant::SoftCap { cap },
            (_, Some(slopes), _) => Variant::Alibi {
                slopes: slopes.clone(),
            },
            (_, _, Some(sinks)) => Variant::Sinks {
                sinks: sinks.clone(),
            },
            (None, None, None) => Variant::None,
        })
    }

    /// Sets mask, variant, scale and accumulation on `p`.
    pub fn apply(&self, p: AttentionProblem) -> PyResult<AttentionProblem> {
        let accum = if self.f16_qk {
            QkAccum::F16
        } else {
            QkAccum::F32
        };
        Ok(p.with_mask(self.mask()?)
            .with_variant(self.variant()?)
            .with_sm_scale(self.sm_scale)
            .with_qk_accum(accum))
    }

    /// The ragged problem over `qo_indptr` and `kv_indptr` (contiguous views).
    pub fn ragged_problem(
        &self,
        qo_indptr: Vec<i32>,
        kv_indptr: Vec<i32>,
    ) -> PyResult<AttentionProblem> {
        let batch = RaggedBatch {
            qo_indptr,
            kv_indptr,
        };
        let p = AttentionProblem::new(
            batch,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dims()?,
            self.dtype()?,
        );
        let p = self.apply(p)?;
        p.validate().py()?;
        Ok(p)
    }
}
