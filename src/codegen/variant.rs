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
/// The same transform of `s = post_scale * acc`, taken from the accumulator: `softcap_tanh` reads
/// its argument only through `|s| * exp2_scale` and the sign of `s`, and `post_scale > 0`, so
/// `softcap_acc_exp2_scale = post_scale * softcap_exp2_scale` (rounded once on the host) saves the
/// multiplication by `post_scale` on every logit.
const SOFTCAP_TRANSFORM_FROM_ACC: &str =
    "return softcap_tanh(acc, params.soft_cap, params.softcap_acc_exp2_scale);";
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
    /// A built-in's body of the same transform computed from the raw accumulator (`post_scale`
    /// folded into its parameters), if it has one; custom variants never do.
    pub transform_from_acc: Option<String>,
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
                       transform_from_acc: Option<&str>,
                       sink: Option<&str>,
                       params: &[(&str, ParamType)]| VariantCode {
            transform: transform.map(str::to_string),
            transform_from_acc: transform_from_acc.map(str::to_string),
            mask: None,
            sink: sink.map(str::to_string),
            params: params.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
            origin: spec.label(),
        };
        match spec {
            VariantSpec::None => builtin(None, None, None, &[]),
            VariantSpec::SoftCap => builtin(
                Some(SOFTCAP_TRANSFORM),
                Some(SOFTCAP_TRANSFORM_FROM_ACC),
                None,
                &[
                    ("soft_cap", ParamType::F32),
                    ("softcap_exp2_scale", ParamType::F32),
                    ("softcap_acc_exp2_scale", ParamType::F32),
                ],
            ),
            VariantSpec::Alibi => builtin(
                Some(ALIBI_TRANSFORM),
                None,
                None,
                &[("alibi_slopes", ParamType::F32Ptr)],
            ),
            VariantSpec::Sinks => builtin(
                None,
                None,
                Some(SINK_LOGIT),
                &[("sinks", ParamType::F32Ptr)],
            ),
            VariantSpec::Custom { source, .. } => custom(source),
        }
    }
}

fn custom(source: &CudaVariantSource) -> VariantCode {
    VariantCode {
        transform: Some(source.transform_body.clone()),
        transform_from_acc: None,
        mask: source.mask_body.clone(),
        sink: None,
        params: source.params.clone(),
        origin: "custom".to_string(),
    }
}

/// The parameter values of a problem's variant, in declaration order (arrays still on the host).
/// `post_scale` is the factor between the kernel's QK accumulator and the scaled logit
/// ([`crate::problem::QkScaling`]), which a built-in's accumulator form folds in.
pub fn param_values(variant: &Variant, post_scale: f32) -> Vec<ParamValue> {
    match variant {
        Variant::None => Vec::new(),
        Variant::SoftCap { cap } => vec![
            ParamValue::F32(*cap),
            ParamValue::F32(softcap_exp2_scale(*cap, 1.0)),
            ParamValue::F32(softcap_exp2_scale(*cap, post_scale)),
        ],
        Variant::Alibi { slopes } => vec![ParamValue::F32Array(slopes.clone())],
        Variant::Sinks { sinks } => vec![ParamValue::F32Array(sinks.clone())],
        Variant::Custom(c) => c.param_values.clone(),
    }
}

/// The soft-cap's exponent scale `-2 * LOG2E * factor / cap`, rounded once from f64, so that
/// `exp2(|x| * scale)` is `exp(-2 |factor x| / cap)` (the kernel's `softcap_tanh`): factor 1 for
/// the scaled logit, `post_scale` for the accumulator.
fn softcap_exp2_scale(cap: f32, factor: f32) -> f32 {
    (-2.0 * std::f64::consts::LOG2_E * f64::from(factor) / f64::from(cap)) as f32
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
const TRANSFORM_FROM_ACC_SIGNATURE: &str =
    "float logits_transform_from_acc(const VariantParams& params, float acc, int qo_idx, int kv_idx, \
                                   int qo_head, int kv_head, int qo_len, int kv_len)";
const MASK_SIGNATURE: &str =
    "bool logits_mask(const VariantParams& params, int qo_idx, int kv_idx, int qo_head, int kv_head, int qo_len, int kv_len)";
const SINK_SIGNATURE: &str = "float sink_logit(const VariantParams& params, int qo_head)";

/// Renders the variant block onto `out` (which already holds `out.lines().count()` lines of the
/// file named `file`), recording where each snippet lands.
pub fn render(code: &VariantCode, out: &mut String, spans: &mut Vec<SnippetSpan>, file: &str) {
    let _ = writeln!(
        out,
        "// Variant: {}\nconstexpr bool VARIANT_HAS_TRANSFORM = {};\nconstexpr bool VARIANT_TRANSFORM_FROM_ACC = {};\nconstexpr bool VARIANT_HAS_MASK = {};\nconstexpr bool VARIANT_HAS_SINK = {};",
        code.origin,
        code.transform.is_some(),
        code.transform_from_acc.is_some(),
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
        label("logits_transform_from_acc"),
        TRANSFORM_FROM_ACC_SIGNATURE,
        code.transform_from_acc.as_deref().unwrap_or("return acc;"),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The accumulator form's exponent scale is the logit form's times `post_scale`, rounded
    /// once: the two give the same `|s| * scale` for `s = post_scale * acc`.
    #[test]
    fn soft_cap_accumulator_scale_folds_post_scale() {
        let cap = 30.0f32;
        let post_scale = 0.088388346f32; // 1 / sqrt(128)
        let values = param_values(&Variant::SoftCap { cap }, post_scale);
        let [ParamValue::F32(c), ParamValue::F32(logit_scale), ParamValue::F32(acc_scale)] =
            values[..]
        else {
            panic!("soft-cap parameters: {values:?}");
        };
        assert_eq!(c, cap);
        let exact = -2.0 * std::f64::consts::LOG2_E / 30.0;
        assert_eq!(logit_scale, exact as f32);
        assert_eq!(acc_scale, (exact * f64::from(post_scale)) as f32);
        for acc in [-1234.5f32, -3.0, 0.25, 17.0, 5000.0] {
            let via_logit = f64::from((post_scale * acc).abs() * logit_scale);
            let via_acc = f64::from(acc.abs() * acc_scale);
            // A few f32 roundings apart, no more.
            let tolerance = 4.0 * f64::from(f32::EPSILON) * via_logit.abs();
            assert!(
                (via_logit - via_acc).abs() <= tolerance,
                "{acc}: {via_logit} vs {via_acc}"
            );
        }
        assert_eq!(
            VariantCode::of(&VariantSpec::SoftCap).params.len(),
            values.len()
        );
    }
}
