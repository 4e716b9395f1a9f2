//! Rendering a variant into CUDA: built-in and custom variants through one path.
//!
//! Every variant becomes the same block: `struct VariantParams`, the `VARIANT_HAS_*` flags and
//! the hooks `logits_transform`, `logits_mask` and `sink_logit` that `kernels/variant.cuh`
//! documents. Built-ins are [`CudaVariantSource`]s defined here, so a custom snippet goes through
//! exactly the code path the built-ins prove. A snippet body is preceded by a `#line` directive,
//! so NVRTC reports errors in it by the snippet's own line numbers.

use super::spec::VariantSpec;
use crate::jit::SnippetSpan;
use crate::problem::{CudaVariantSource, ParamType, ParamValue, Variant};
use std::fmt::Write;

/// Body of the soft-cap transform (`softcap_tanh` is in common.cuh; `softcap_exp2_scale` is
/// `-2 * LOG2E / soft_cap`, see [`param_values`]).
const SOFTCAP_TRANSFORM: &str =
    "return softcap_tanh(s, params.soft_cap, params.softcap_exp2_scale);";
/// Body of the ALiBi transform: the key's distance to the query's position, times the slope.
const ALIBI_TRANSFORM: &str =
    "return s + params.alibi_slopes[qo_head] * static_cast<float>(kv_idx - (qo_idx + kv_len - qo_len));";
/// Body of the sink hook.
const SINK_LOGIT: &str = "return params.sinks[qo_head];";

/// What a variant contributes to the kernel: its source and how it fills its parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VariantCode {
    /// Transform body, if any.
    pub transform: Option<String>,
    /// Mask body, if any.
    pub mask: Option<String>,
    /// Sink body, if any.
    pub sink: Option<String>,
    /// Parameter declarations.
    pub params: Vec<(String, ParamType)>,
    /// Label for `#line` directives and error messages (`custom` or the built-in's name).
    pub origin: String,
}

impl VariantCode {
    /// The code of a variant spec.
    pub fn of(spec: &VariantSpec) -> VariantCode {
        let builtin = |transform: Option<&str>,
                       sink: Option<&str>,
                       params: &[(&str, ParamType)]| VariantCode {
            transform: transform.map(str::to_string),
            mask: None,
            sink: sink.map(str::to_string),
            params: params.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
            origin: spec.label(),
        };
        match spec {
            VariantSpec::None => builtin(None, None, &[]),
            VariantSpec::SoftCap => builtin(
                Some(SOFTCAP_TRANSFORM),
                None,
                &[
                    ("soft_cap", ParamType::F32),
                    ("softcap_exp2_scale", ParamType::F32),
                ],
            ),
            VariantSpec::Alibi => builtin(
                Some(ALIBI_TRANSFORM),
                None,
                &[("alibi_slopes", ParamType::F32Ptr)],
            ),
            VariantSpec::Sinks => builtin(None, Some(SINK_LOGIT), &[("sinks", ParamType::F32Ptr)]),
            VariantSpec::Custom { source, .. } => custom(source),
        }
    }
}

fn custom(source: &CudaVariantSource) -> VariantCode {
    VariantCode {
        transform: Some(source.transform_body.clone()),
        mask: source.mask_body.clone(),
        sink: None,
        params: source.params.clone(),
        origin: "custom".to_string(),
    }
}

/// The parameter values of a problem's variant, in declaration order (arrays still on the host).
pub fn param_values(variant: &Variant) -> Vec<ParamValue> {
    match variant {
        Variant::None => Vec::new(),
        Variant::SoftCap { cap } => vec![
            ParamValue::F32(*cap),
            ParamValue::F32(softcap_exp2_scale(*cap)),
        ],
        Variant::Alibi { slopes } => vec![ParamValue::F32Array(slopes.clone())],
        Variant::Sinks { sinks } => vec![ParamValue::F32Array(sinks.clone())],
        Variant::Custom(c) => c.param_values.clone(),
    }
}

/// The soft-cap's second parameter: `-2 * LOG2E / cap`, rounded once from f64, so that
/// `exp2(|s| * scale)` is `exp(-2 |s| / cap)` (the kernel's `softcap_tanh`).
fn softcap_exp2_scale(cap: f32) -> f32 {
    (-2.0 * std::f64::consts::LOG2_E / f64::from(cap)) as f32
}

/// Appends one hook: signature, `#line` so errors name the snippet, body, closing brace, and a
/// `#line` back to the generated file.
fn hook(
    out: &mut String,
    spans: &mut Vec<SnippetSpan>,
    label: String,
    signature: &str,
    body: &str,
    file: &str,
) {
    let _ = writeln!(out, "__device__ __forceinline__ {signature} {{");
    let _ = writeln!(out, "#line 1 \"{label}\"");
    let first_line = out.lines().count() + 1;
    out.push_str(body.trim_end());
    out.push('\n');
    spans.push(SnippetSpan {
        label,
        first_line,
        line_count: body.trim_end().lines().count().max(1),
    });
    out.push_str("}\n");
    let next = out.lines().count() + 2;
    let _ = writeln!(out, "#line {next} \"{file}\"");
}

const TRANSFORM_SIGNATURE: &str =
    "float logits_transform(const VariantParams& params, float s, int qo_idx, int kv_idx, \
                                   int qo_head, int kv_head, int qo_len, int kv_len)";
const MASK_SIGNATURE: &str =
    "bool logits_mask(const VariantParams& params, int qo_idx, int kv_idx, int qo_head, int kv_head, int qo_len, int kv_len)";
const SINK_SIGNATURE: &str = "float sink_logit(const VariantParams& params, int qo_head)";

/// Renders the variant block onto `out` (which already holds `out.lines().count()` lines of the
/// file named `file`), recording where each snippet lands.
pub fn render(code: &VariantCode, out: &mut String, spans: &mut Vec<SnippetSpan>, file: &str) {
    let _ = writeln!(
        out,
        "// Variant: {}\nconstexpr bool VARIANT_HAS_TRANSFORM = {};\nconstexpr bool VARIANT_HAS_MASK = {};\nconstexpr bool VARIANT_HAS_SINK = {};",
        code.origin,
        code.transform.is_some(),
        code.mask.is_some(),
        code.sink.is_some()
    );
    // Hooks a variant leaves out get a body the kernel never calls (guarded by the flags above);
    // they exist so that every kernel sees the same interface.
    let label = |hook: &str| format!("{} {hook}", code.origin);
    hook(
        out,
        spans,
        label("logits_transform"),
        TRANSFORM_SIGNATURE,
        code.transform.as_deref().unwrap_or("return s;"),
        file,
    );
    hook(
        out,
        spans,
        label("logits_mask"),
        MASK_SIGNATURE,
        code.mask.as_deref().unwrap_or("return true;"),
        file,
    );
    hook(
        out,
        spans,
        label("sink_logit"),
        SINK_SIGNATURE,
        code.sink.as_deref().unwrap_or("return neg_inf();"),
        file,
    );
}
