//! Variants: the logits transform applied to each scaled logit, and the attention sink.
//!
//! Every variant, built-in or custom, has one interface: it receives the scaled logit
//! `s = sm_scale * dot(q_i, k_j)` as an f32 and returns an f32, whatever type the QK dot product
//! was accumulated in. Kernels widen the accumulator to f32 exactly before calling it.

use super::error::{InvalidProblem, Validation};
use std::fmt;
use std::sync::Arc;

/// Where a logit sits: the arguments every logits transform and logits mask receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogitSite {
    /// Index of the request in the batch.
    pub request: usize,
    /// Query index within the request (`0..qo_len`).
    pub qo_idx: usize,
    /// Key index within the request (`0..kv_len`).
    pub kv_idx: usize,
    /// Query head.
    pub qo_head: usize,
    /// KV head serving that query head.
    pub kv_head: usize,
    /// Number of queries in the request.
    pub qo_len: usize,
    /// Number of keys in the request.
    pub kv_len: usize,
}

/// A logits transform written in Rust (for the CPU backends and the reference).
pub type CpuTransform = Arc<dyn Fn(f32, &LogitSite) -> f32 + Send + Sync>;
/// A logits mask written in Rust: `false` hides the key.
pub type CpuMask = Arc<dyn Fn(&LogitSite) -> bool + Send + Sync>;

/// The type of one extra parameter of a custom CUDA variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum ParamType {
    /// A `float` scalar.
    F32,
    /// An `int` scalar.
    I32,
    /// A `const float*` to device memory.
    F32Ptr,
    /// A `const int*` to device memory.
    I32Ptr,
}

impl ParamType {
    /// The CUDA type of the parameter's field.
    pub fn cuda_type(self) -> &'static str {
        match self {
            ParamType::F32 => "float",
            ParamType::I32 => "int",
            ParamType::F32Ptr => "const float*",
            ParamType::I32Ptr => "const int*",
        }
    }
}

/// The value of one extra parameter. Arrays live on the host here; the CUDA runtime uploads them
/// and passes the device pointer.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    /// A `float`.
    F32(f32),
    /// An `int`.
    I32(i32),
    /// A `const float*` array.
    F32Array(Vec<f32>),
    /// A `const int*` array.
    I32Array(Vec<i32>),
}

impl ParamValue {
    /// The type this value fills.
    pub fn param_type(&self) -> ParamType {
        match self {
            ParamValue::F32(_) => ParamType::F32,
            ParamValue::I32(_) => ParamType::I32,
            ParamValue::F32Array(_) => ParamType::F32Ptr,
            ParamValue::I32Array(_) => ParamType::I32Ptr,
        }
    }
}

/// A custom variant's CUDA side: function bodies and the parameters they read.
///
/// `transform_body` is the body of
/// `float logits_transform(const VariantParams& params, float s, int qo_idx, int kv_idx, int qo_head, int kv_head)`;
/// `mask_body`, if any, the body of
/// `bool logits_mask(const VariantParams& params, int qo_idx, int kv_idx, int qo_head, int kv_head)`.
/// Each declared parameter becomes a field `params.NAME` of the declared type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaVariantSource {
    /// Body of `logits_transform`.
    pub transform_body: String,
    /// Body of `logits_mask`, if the variant masks.
    pub mask_body: Option<String>,
    /// Extra parameters, in declaration order: (name, type).
    pub params: Vec<(String, ParamType)>,
}

/// A user-defined variant: a name, a Rust implementation for the CPU side, and optionally a CUDA
/// one. Both sides must compute the same function; the verify suite checks that they do.
#[derive(Clone)]
pub struct CustomVariant {
    /// A short identifier (letters, digits, `_`), used in kernel names.
    pub name: String,
    /// The transform on the CPU side.
    pub cpu_transform: CpuTransform,
    /// The mask on the CPU side, if the variant masks.
    pub cpu_mask: Option<CpuMask>,
    /// The CUDA side; `None` for a CPU-only variant.
    pub cuda: Option<CudaVariantSource>,
    /// Values of the CUDA side's parameters, in declaration order.
    pub param_values: Vec<ParamValue>,
}

impl fmt::Debug for CustomVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomVariant")
            .field("name", &self.name)
            .field("cpu_mask", &self.cpu_mask.is_some())
            .field("cuda", &self.cuda)
            .field("param_values", &self.param_values)
            .finish()
    }
}

/// The logits transform (and sink) of an attention problem.
#[derive(Clone, Debug)]
pub enum Variant {
    /// `t = s`.
    None,
    /// `t = cap * tanh(s / cap)`, `cap > 0`.
    SoftCap {
        /// The cap `c`.
        cap: f32,
    },
    /// `t = s + slopes[qo_head] * (j - (i + d))`.
    Alibi {
        /// One slope per query head.
        slopes: Vec<f32>,
    },
    /// `t = s`, and a per-head logit `sinks[qo_head]` joins the softmax denominator only.
    Sinks {
        /// One sink logit per query head (natural-log domain, like `t`).
        sinks: Vec<f32>,
    },
    /// User code with the same signature.
    Custom(CustomVariant),
}

/// The kind of a [`Variant`] without its data: what changes the generated kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum VariantKind {
    /// [`Variant::None`].
    None,
    /// [`Variant::SoftCap`].
    SoftCap,
    /// [`Variant::Alibi`].
    Alibi,
    /// [`Variant::Sinks`].
    Sinks,
    /// [`Variant::Custom`].
    Custom,
}

impl VariantKind {
    /// Short name used in kernel names and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            VariantKind::None => "none",
            VariantKind::SoftCap => "softcap",
            VariantKind::Alibi => "alibi",
            VariantKind::Sinks => "sinks",
            VariantKind::Custom => "custom",
        }
    }
}

impl Variant {
    /// The kind of this variant.
    pub fn kind(&self) -> VariantKind {
        match self {
            Variant::None => VariantKind::None,
            Variant::SoftCap { .. } => VariantKind::SoftCap,
            Variant::Alibi { .. } => VariantKind::Alibi,
            Variant::Sinks { .. } => VariantKind::Sinks,
            Variant::Custom(_) => VariantKind::Custom,
        }
    }

    /// The sink logit of `qo_head`, if this variant has sinks.
    pub fn sink(&self, qo_head: usize) -> Option<f32> {
        match self {
            Variant::Sinks { sinks } => Some(sinks[qo_head]),
            _ => None,
        }
    }

    /// Checks the variant's parameters for a problem with `num_qo_heads` query heads.
    pub fn validate(&self, num_qo_heads: usize) -> Validation {
        let per_head = |field: &str, v: &[f32]| -> Validation {
            if v.len() != num_qo_heads {
                return Err(InvalidProblem::new(
                    field,
                    format!(
                        "has {} entries, expected one per query head ({num_qo_heads})",
                        v.len()
                    ),
                ));
            }
            match v.iter().position(|x| !x.is_finite()) {
                Some(h) => Err(InvalidProblem::new(
                    format!("{field}[{h}]"),
                    format!("{} is not finite", v[h]),
                )),
                None => Ok(()),
            }
        };
        match self {
            Variant::None => Ok(()),
            Variant::SoftCap { cap } if !(cap.is_finite() && *cap > 0.0) => Err(
                InvalidProblem::new("soft_cap", format!("{cap} is not a finite positive number")),
            ),
            Variant::SoftCap { .. } => Ok(()),
            Variant::Alibi { slopes } => per_head("alibi_slopes", slopes),
            Variant::Sinks { sinks } => per_head("sinks", sinks),
            Variant::Custom(c) => validate_custom(c),
        }
    }
}

fn validate_custom(c: &CustomVariant) -> Validation {
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
            && !s.starts_with(|ch: char| ch.is_ascii_digit())
    };
    if !ident(&c.name) {
        return Err(InvalidProblem::new(
            "custom variant name",
            format!(
                "{:?} is not an identifier (letters, digits, _; not starting with a digit)",
                c.name
            ),
        ));
    }
    let Some(cuda) = &c.cuda else { return Ok(()) };
    if cuda.params.len() != c.param_values.len() {
        return Err(InvalidProblem::new(
            "custom variant parameters",
            format!(
                "{} declared but {} values given",
                cuda.params.len(),
                c.param_values.len()
            ),
        ));
    }
    for ((name, ty), value) in cuda.params.iter().zip(&c.param_values) {
        if !ident(name) {
            return Err(InvalidProblem::new(
                "custom variant parameter",
                format!("{name:?} is not an identifier"),
            ));
        }
        if value.param_type() != *ty {
            return Err(InvalidProblem::new(
                format!("custom variant parameter {name}"),
                format!("declared {ty:?} but given a {:?}", value.param_type()),
            ));
        }
    }
    Ok(())
}
