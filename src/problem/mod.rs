//! The attention problem model: what a caller asks attnforge to compute.
//!
//! An [`AttentionProblem`] describes a ragged batch of requests (queries, keys and values laid end
//! to end, [`RaggedBatch`]), the heads (GQA: `num_qo_heads % num_kv_heads == 0`), head dims,
//! dtypes, the QK accumulation type, the scale, a [`Mask`] and a [`Variant`]. Every backend takes
//! the same problem and calls [`AttentionProblem::validate`] (and, for host buffers,
//! [`AttentionProblem::validate_inputs`]) before any work, so bad input is a typed
//! [`InvalidProblem`] naming the argument, never a panic. `docs/semantics.md` defines every
//! formula; the exact reference (`crate::reference`) is its executable form.

mod batch;
mod error;
mod head_dims;
mod layout;
mod mask;
mod variant;

pub use batch::RaggedBatch;
pub use error::{InvalidProblem, Validation};
pub use head_dims::{HeadDims, SUPPORTED_HEAD_DIMS};
pub use layout::TensorView;
pub use mask::{CustomMask, Mask, MaskKind};
pub use variant::{
    CpuMask, CpuTransform, CudaVariantSource, CustomVariant, LogitSite, ParamType, ParamValue,
    Variant, VariantKind,
};

use crate::dtype::DType;
use crate::tensor::HostTensor;

/// The type the Q·K dot product accumulates in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum QkAccum {
    /// f32 accumulation (default).
    #[default]
    F32,
    /// f16 accumulation, as `mma.m16n8k16` with f16 accumulators does it: each 16-wide chunk of
    /// the dot product is added to an f16 accumulator, rounding to f16 after each chunk. f16
    /// inputs only. See [`QkScaling`] for how overflow is kept out.
    F16,
}

impl QkAccum {
    /// Short name used in kernel names and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            QkAccum::F32 => "f32",
            QkAccum::F16 => "f16",
        }
    }
}

/// Width of one chunk of the dot product that the tensor cores sum before rounding to the f16
/// accumulator (the K of `mma.m16n8k16`).
pub const F16_ACCUM_CHUNK: usize = 16;

/// How the scale is split around an f16-accumulated dot product.
///
/// With f16 accumulation, q is first multiplied by `prescale`, an exact power of two no larger
/// than 1 (the power-of-two part of `sm_scale`, clamped at 1), so partial sums keep headroom in
/// f16's range; the accumulated value, widened to f32, is then multiplied by `post_scale`
/// (`sm_scale / prescale`, in `[1, 2)` when `sm_scale <= 1`). If a partial sum still leaves the
/// f16 range (the accumulator becomes ±inf or NaN), that logit is recomputed with f32
/// accumulation: overflow never reaches the softmax as inf or NaN.
/// With f32 accumulation, `prescale = 1` and `post_scale = sm_scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkScaling {
    /// Exact power of two applied to q before the dot product.
    pub prescale: f32,
    /// Factor applied in f32 to the accumulated dot product.
    pub post_scale: f32,
}

impl QkScaling {
    /// The split for `sm_scale` under `accum`.
    pub fn new(sm_scale: f32, accum: QkAccum) -> QkScaling {
        match accum {
            QkAccum::F32 => QkScaling {
                prescale: 1.0,
                post_scale: sm_scale,
            },
            QkAccum::F16 => {
                // floor(log2(sm_scale)) from the f32 exponent bits; sm_scale is finite and > 0.
                let exponent = ((sm_scale.to_bits() >> 23) & 0xff) as i32 - 127;
                let prescale = 2f32.powi(exponent.clamp(-14, 0));
                QkScaling {
                    prescale,
                    post_scale: sm_scale / prescale,
                }
            }
        }
    }
}

/// One attention problem: shapes, types, scale, mask and variant.
#[derive(Clone, Debug)]
pub struct AttentionProblem {
    /// Request boundaries.
    pub batch: RaggedBatch,
    /// Query (and output) heads.
    pub num_qo_heads: usize,
    /// Key/value heads; divides `num_qo_heads`.
    pub num_kv_heads: usize,
    /// Head dims of qk and vo.
    pub head_dims: HeadDims,
    /// Element type of Q, K and V.
    pub input_dtype: DType,
    /// Element type of O (default: the input dtype).
    pub output_dtype: DType,
    /// QK accumulation type.
    pub qk_accum: QkAccum,
    /// The scale `s = sm_scale * dot(q, k)`; default `1 / sqrt(head_dim_qk)`.
    pub sm_scale: f32,
    /// The mask.
    pub mask: Mask,
    /// The logits transform.
    pub variant: Variant,
    /// Where Q lives in its buffer.
    pub q_view: TensorView,
    /// Where K lives in its buffer.
    pub k_view: TensorView,
    /// Where V lives in its buffer.
    pub v_view: TensorView,
    /// Whether the LSE is returned.
    pub return_lse: bool,
}

impl AttentionProblem {
    /// A problem with defaults: contiguous tensors, output in the input dtype, `sm_scale =
    /// 1/sqrt(head_dim_qk)`, no mask, no variant, f32 accumulation, LSE returned.
    pub fn new(
        batch: RaggedBatch,
        num_qo_heads: usize,
        num_kv_heads: usize,
        head_dims: HeadDims,
        dtype: DType,
    ) -> AttentionProblem {
        AttentionProblem {
            batch,
            num_qo_heads,
            num_kv_heads,
            head_dims,
            input_dtype: dtype,
            output_dtype: dtype,
            qk_accum: QkAccum::F32,
            sm_scale: 1.0 / (head_dims.qk() as f32).sqrt(),
            mask: Mask::None,
            variant: Variant::None,
            q_view: TensorView::contiguous(num_qo_heads, head_dims.qk()),
            k_view: TensorView::contiguous(num_kv_heads, head_dims.qk()),
            v_view: TensorView::contiguous(num_kv_heads, head_dims.vo()),
            return_lse: true,
        }
    }

    /// Sets the mask.
    pub fn with_mask(mut self, mask: Mask) -> Self {
        self.mask = mask;
        self
    }

    /// Sets the variant.
    pub fn with_variant(mut self, variant: Variant) -> Self {
        self.variant = variant;
        self
    }

    /// Sets the QK accumulation type.
    pub fn with_qk_accum(mut self, accum: QkAccum) -> Self {
        self.qk_accum = accum;
        self
    }

    /// Sets the scale.
    pub fn with_sm_scale(mut self, sm_scale: f32) -> Self {
        self.sm_scale = sm_scale;
        self
    }

    /// Query heads per KV head.
    pub fn group_size(&self) -> usize {
        self.num_qo_heads / self.num_kv_heads.max(1)
    }

    /// The KV head that serves query head `qo_head`.
    pub fn kv_head_of(&self, qo_head: usize) -> usize {
        qo_head / self.group_size()
    }

    /// The scale split used by the QK accumulation type.
    pub fn qk_scaling(&self) -> QkScaling {
        QkScaling::new(self.sm_scale, self.qk_accum)
    }

    /// Elements of the contiguous output `[total_qo, num_qo_heads, head_dim_vo]`.
    pub fn output_len(&self) -> usize {
        self.batch.total_qo() * self.num_qo_heads * self.head_dims.vo()
    }

    /// Checks everything that does not depend on the buffers.
    pub fn validate(&self) -> Validation {
        self.batch.validate()?;
        if self.num_qo_heads == 0 {
            return Err(InvalidProblem::new("num_qo_heads", "is 0"));
        }
        if self.num_kv_heads == 0 {
            return Err(InvalidProblem::new("num_kv_heads", "is 0"));
        }
        if self.num_qo_heads % self.num_kv_heads != 0 {
            return Err(InvalidProblem::new(
                "num_kv_heads",
                format!(
                    "{} does not divide num_qo_heads = {}",
                    self.num_kv_heads, self.num_qo_heads
                ),
            ));
        }
        // Re-check the head dims: the fields are public, so a caller could have built a problem
        // by hand from a HeadDims made for another purpose.
        HeadDims::new(self.head_dims.qk(), self.head_dims.vo())?;
        if self.output_dtype == DType::F32 && self.input_dtype != DType::F32 {
            return Err(InvalidProblem::new(
                "output_dtype",
                format!(
                    "f32 output needs f32 inputs (inputs are {})",
                    self.input_dtype
                ),
            ));
        }
        if self.qk_accum == QkAccum::F16 && self.input_dtype != DType::F16 {
            return Err(InvalidProblem::new(
                "qk_accum",
                format!(
                    "f16 QK accumulation needs f16 inputs; inputs are {}",
                    self.input_dtype
                ),
            ));
        }
        if !(self.sm_scale.is_finite() && self.sm_scale > 0.0) {
            return Err(InvalidProblem::new(
                "sm_scale",
                format!("{} is not a finite positive number", self.sm_scale),
            ));
        }
        self.mask.validate(&self.batch.lens())?;
        self.variant.validate(self.num_qo_heads)?;
        Ok(())
    }

    /// That the host tensor `name` has the problem's input dtype; the error names it.
    pub fn check_input_dtype(&self, name: &'static str, t: &HostTensor) -> Validation {
        if t.dtype() == self.input_dtype {
            return Ok(());
        }
        Err(InvalidProblem::new(
            name,
            format!(
                "has dtype {} but the problem's input dtype is {}",
                t.dtype(),
                self.input_dtype
            ),
        ))
    }

    /// [`validate`](Self::validate), then checks the host buffers' dtypes and sizes against the
    /// views.
    pub fn validate_inputs(&self, q: &HostTensor, k: &HostTensor, v: &HostTensor) -> Validation {
        self.validate()?;
        for (name, t) in [("q", q), ("k", k), ("v", v)] {
            self.check_input_dtype(name, t)?;
        }
        let (qo, kv) = (self.batch.total_qo(), self.batch.total_kv());
        let (dqk, dvo) = (self.head_dims.qk(), self.head_dims.vo());
        self.q_view
            .validate("q", qo, self.num_qo_heads, dqk, q.len())?;
        self.k_view
            .validate("k", kv, self.num_kv_heads, dqk, k.len())?;
        self.v_view
            .validate("v", kv, self.num_kv_heads, dvo, v.len())?;
        Ok(())
    }
}
