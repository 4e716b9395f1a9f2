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
/// The soft-cap's form for small logits (`odd_poly7` is in common.cuh): `cap tanh(s / cap)` for
/// `|s| <= cap / 2` as `s P((s / cap)^2)`, the cubic `P` of [`SOFTCAP_SMALL_POLY`] with its
/// coefficients scaled on the host ([`param_values`]): 5 FMA-pipe instructions per logit against
/// the full form's 10 and one MUFU.
const SOFTCAP_SMALL_TRANSFORM: &str = "return odd_poly7(s, 1.0f, params.softcap_small_c1, \
     params.softcap_small_c2, params.softcap_small_c3);";
/// The same of `s = post_scale * acc` from the accumulator: `post_scale` folded into the
/// coefficients, `acc * (post_scale P((post_scale acc / cap)^2))`.
const SOFTCAP_SMALL_TRANSFORM_FROM_ACC: &str =
    "return odd_poly7(acc, params.softcap_small_acc_c0, \
     params.softcap_small_acc_c1, params.softcap_small_acc_c2, params.softcap_small_acc_c3);";
/// The same small form from the accumulator as `acc * factor`, in log2 units: `factor =
/// LOG2E post_scale P((post_scale acc / cap)^2)` (`even_poly6` is in common.cuh), so that a
/// kernel forms the exponent `LOG2E * transform - offset` as one FMA of `acc` and `factor`.
const SOFTCAP_SMALL_FACTOR_LOG2: &str = "return even_poly6(acc, params.softcap_small_acc_log2_c0, \
     params.softcap_small_acc_log2_c1, params.softcap_small_acc_log2_c2, params.softcap_small_acc_log2_c3);";
/// The accumulators the soft-cap's small form holds for: `|acc| <= softcap_small_acc_limit`, that
/// is `|s| <= cap / 2`.
const SOFTCAP_SMALL_LIMIT: &str = "return params.softcap_small_acc_limit;";
/// The soft-cap's short form, factored as the small one: `factor = LOG2E post_scale (1 + c1 (s /
/// cap)^2)` with the `c1` of [`SOFTCAP_SHORT_POLY`], for `|s| <= SOFTCAP_SHORT_X cap`: one FMUL
/// and one FFMA per logit before the exponent's FFMA, against the small form's FMUL and three
/// FFMA.
const SOFTCAP_SHORT_FACTOR_LOG2: &str =
    "return fmaf(acc * acc, params.softcap_short_acc_log2_c1, params.softcap_short_acc_log2_c0);";
/// The accumulators the short form holds for: `|acc| <= softcap_short_acc_limit`.
const SOFTCAP_SHORT_LIMIT: &str = "return params.softcap_short_acc_limit;";

/// `tanh(x) / x` on `|x| <= SOFTCAP_SMALL_X` as `1 + c1 x^2 + c2 x^4 + c3 x^6`: the coefficients
/// `c1, c2, c3`, fitted offline (minimax of the absolute error of `x P(x^2)` against `tanh x`, by
/// iteratively reweighted least squares). Its own error is 1.9e-7; evaluated in f32 with FMA as
/// the kernel does, the soft-cap's error stays below 2.3e-7 * cap (the test below; the full form's
/// bound is 2.7e-7 * cap).
pub const SOFTCAP_SMALL_POLY: [f64; 3] = [-0.33326461, 0.13185866, -0.04422941];
/// The largest `|s| / cap` the small form covers.
pub const SOFTCAP_SMALL_X: f64 = 0.5;
/// `tanh(x) / x` on `|x| <= SOFTCAP_SHORT_X` as `1 + c1 x^2`: `c1` fitted offline (minimax of the
/// absolute error of `x (1 + c1 x^2)` against `tanh x`, by ternary search). Its own error is
/// 1.73e-7, and the kernel's evaluation stays within the small form's bound, 2.3e-7 * cap (the
/// test below).
pub const SOFTCAP_SHORT_POLY: f64 = -0.33217884;
/// The largest `|s| / cap` the short form covers.
pub const SOFTCAP_SHORT_X: f64 = 0.1;

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
    /// A built-in's cheaper form of the transform for small accumulators, if it has one.
    pub small: Option<SmallForm>,
    /// Mask body, if any.
    pub mask: Option<String>,
    /// Sink body, if any.
    pub sink: Option<String>,
    /// Parameter declarations.
    pub params: Vec<(String, ParamType)>,
    /// Label for `#line` directives and error messages (`custom` or the built-in's name).
    pub origin: String,
}

/// A built-in's form of its transform that holds, within the transform's own error bound, while
/// `|acc| <= limit` (kernels/variant.cuh): the bodies of `logits_transform_small`,
/// `logits_transform_small_from_acc`, `small_form_acc_factor_log2` and `small_form_acc_limit`.
/// The accumulator form must be a non-decreasing function of `acc` alone on that range (the
/// kernels take the row max on the accumulators).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SmallForm {
    /// Of the scaled logit `s`, as `logits_transform`.
    pub transform: String,
    /// Of the accumulator, as `logits_transform_from_acc`.
    pub transform_from_acc: String,
    /// The factor `f` of the accumulator form in log2 units (`acc * f = LOG2E *
    /// logits_transform_small_from_acc(acc)`), body of `small_form_acc_factor_log2`.
    pub acc_factor_log2: String,
    /// Returns the limit on `|acc|`.
    pub acc_limit: String,
    /// A cheaper factor still, for a smaller range, if the variant has one.
    pub short: Option<ShortForm>,
}

/// A built-in small form's cheaper factored form for `|acc| <= limit`, a limit within the small
/// form's (kernels/variant.cuh: `short_form_acc_factor_log2`, `short_form_acc_limit`), with the
/// same error bound and the same monotonicity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShortForm {
    /// The factor `f` in log2 units, as [`SmallForm::acc_factor_log2`].
    pub acc_factor_log2: String,
    /// Returns the limit on `|acc|`.
    pub acc_limit: String,
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
            small: None,
            mask: None,
            sink: sink.map(str::to_string),
            params: params.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
            origin: spec.label(),
        };
        match spec {
            VariantSpec::None => builtin(None, None, None, &[]),
            VariantSpec::SoftCap => VariantCode {
                small: Some(SmallForm {
                    transform: SOFTCAP_SMALL_TRANSFORM.to_string(),
                    transform_from_acc: SOFTCAP_SMALL_TRANSFORM_FROM_ACC.to_string(),
                    acc_factor_log2: SOFTCAP_SMALL_FACTOR_LOG2.to_string(),
                    acc_limit: SOFTCAP_SMALL_LIMIT.to_string(),
                    short: Some(ShortForm {
                        acc_factor_log2: SOFTCAP_SHORT_FACTOR_LOG2.to_string(),
                        acc_limit: SOFTCAP_SHORT_LIMIT.to_string(),
                    }),
                }),
                ..builtin(
                    Some(SOFTCAP_TRANSFORM),
                    Some(SOFTCAP_TRANSFORM_FROM_ACC),
                    None,
                    &[
                        ("soft_cap", ParamType::F32),
                        ("softcap_exp2_scale", ParamType::F32),
                        ("softcap_acc_exp2_scale", ParamType::F32),
                        ("softcap_small_c1", ParamType::F32),
                        ("softcap_small_c2", ParamType::F32),
                        ("softcap_small_c3", ParamType::F32),
                        ("softcap_small_acc_c0", ParamType::F32),
                        ("softcap_small_acc_c1", ParamType::F32),
                        ("softcap_small_acc_c2", ParamType::F32),
                        ("softcap_small_acc_c3", ParamType::F32),
                        ("softcap_small_acc_log2_c0", ParamType::F32),
                        ("softcap_small_acc_log2_c1", ParamType::F32),
                        ("softcap_small_acc_log2_c2", ParamType::F32),
                        ("softcap_small_acc_log2_c3", ParamType::F32),
                        ("softcap_small_acc_limit", ParamType::F32),
                        ("softcap_short_acc_log2_c0", ParamType::F32),
                        ("softcap_short_acc_log2_c1", ParamType::F32),
                        ("softcap_short_acc_limit", ParamType::F32),
                    ],
                )
            },
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
        small: None,
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
        Variant::SoftCap { cap } => {
            let mut values = vec![
                ParamValue::F32(*cap),
                ParamValue::F32(softcap_exp2_scale(*cap, 1.0)),
                ParamValue::F32(softcap_exp2_scale(*cap, post_scale)),
            ];
            let small = SoftCapSmall::new(*cap, post_scale);
            values.extend(small.s_coeffs.map(ParamValue::F32));
            values.extend(small.acc_coeffs.map(ParamValue::F32));
            values.extend(small.acc_log2_coeffs.map(ParamValue::F32));
            values.push(ParamValue::F32(small.acc_limit));
            values.extend(small.short_acc_log2_coeffs.map(ParamValue::F32));
            values.push(ParamValue::F32(small.short_acc_limit));
            values
        }
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

/// The soft-cap's small-form parameters for `cap` and `post_scale`, each rounded once from f64.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftCapSmall {
    /// `c_k / cap^(2k)`, k = 1..3: the polynomial in `s` (its constant term is 1).
    pub s_coeffs: [f32; 3],
    /// `post_scale`, then `post_scale c_k (post_scale / cap)^(2k)`: the polynomial in `acc`.
    pub acc_coeffs: [f32; 4],
    /// The same times `LOG2E`: the factor of `acc` in log2 units.
    pub acc_log2_coeffs: [f32; 4],
    /// The largest `|acc|` the small form is taken for: `SOFTCAP_SMALL_X cap / post_scale`,
    /// rounded down.
    pub acc_limit: f32,
    /// `LOG2E post_scale`, then `LOG2E post_scale c1 (post_scale / cap)^2` with the short form's
    /// `c1`: its factor of `acc` in log2 units.
    pub short_acc_log2_coeffs: [f32; 2],
    /// The largest `|acc|` the short form is taken for: `SOFTCAP_SHORT_X cap / post_scale`,
    /// rounded down.
    pub short_acc_limit: f32,
}

/// `limit` as an f32 no larger than it.
fn f32_at_most(limit: f64) -> f32 {
    let rounded = limit as f32;
    if f64::from(rounded) > limit {
        f32::from_bits(rounded.to_bits() - 1)
    } else {
        rounded
    }
}

impl SoftCapSmall {
    /// The parameters for `cap > 0` and `post_scale > 0`.
    pub fn new(cap: f32, post_scale: f32) -> SoftCapSmall {
        let (cap, ps) = (f64::from(cap), f64::from(post_scale));
        let [c1, c2, c3] = SOFTCAP_SMALL_POLY;
        let s_coeffs = [c1 / cap.powi(2), c2 / cap.powi(4), c3 / cap.powi(6)].map(|c| c as f32);
        let r = ps / cap;
        let acc = [
            ps,
            ps * c1 * r.powi(2),
            ps * c2 * r.powi(4),
            ps * c3 * r.powi(6),
        ];
        let acc_coeffs = acc.map(|c| c as f32);
        let acc_log2_coeffs = acc.map(|c| (c * std::f64::consts::LOG2_E) as f32);
        let short = [ps, ps * SOFTCAP_SHORT_POLY * r.powi(2)];
        SoftCapSmall {
            s_coeffs,
            acc_coeffs,
            acc_log2_coeffs,
            acc_limit: f32_at_most(SOFTCAP_SMALL_X * cap / ps),
            short_acc_log2_coeffs: short.map(|c| (c * std::f64::consts::LOG2_E) as f32),
            short_acc_limit: f32_at_most(SOFTCAP_SHORT_X * cap / ps),
        }
    }
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
const SMALL_TRANSFORM_SIGNATURE: &str =
    "float logits_transform_small(const VariantParams& params, float s, int qo_idx, int kv_idx, \
                                   int qo_head, int kv_head, int qo_len, int kv_len)";
const SMALL_TRANSFORM_FROM_ACC_SIGNATURE: &str =
    "float logits_transform_small_from_acc(const VariantParams& params, float acc, int qo_idx, \
                                   int kv_idx, int qo_head, int kv_head, int qo_len, int kv_len)";
const SMALL_FACTOR_SIGNATURE: &str =
    "float small_form_acc_factor_log2(const VariantParams& params, float acc)";
const SMALL_LIMIT_SIGNATURE: &str = "float small_form_acc_limit(const VariantParams& params)";
const SHORT_FACTOR_SIGNATURE: &str =
    "float short_form_acc_factor_log2(const VariantParams& params, float acc)";
const SHORT_LIMIT_SIGNATURE: &str = "float short_form_acc_limit(const VariantParams& params)";

/// Renders the variant block onto `out` (which already holds `out.lines().count()` lines of the
/// file named `file`), recording where each snippet lands.
pub fn render(code: &VariantCode, out: &mut String, spans: &mut Vec<SnippetSpan>, file: &str) {
    let _ = writeln!(
        out,
        "// Variant: {}\nconstexpr bool VARIANT_HAS_TRANSFORM = {};\nconstexpr bool VARIANT_TRANSFORM_FROM_ACC = {};\nconstexpr bool VARIANT_HAS_SMALL_FORM = {};\nconstexpr bool VARIANT_HAS_SHORT_FORM = {};\nconstexpr bool VARIANT_HAS_MASK = {};\nconstexpr bool VARIANT_HAS_SINK = {};",
        code.origin,
        code.transform.is_some(),
        code.transform_from_acc.is_some(),
        code.small.is_some(),
        code.small.as_ref().is_some_and(|f| f.short.is_some()),
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
    let small = code.small.as_ref();
    hook(
        out,
        spans,
        label("logits_transform_small"),
        SMALL_TRANSFORM_SIGNATURE,
        small.map_or("return s;", |f| &f.transform),
        file,
    );
    hook(
        out,
        spans,
        label("logits_transform_small_from_acc"),
        SMALL_TRANSFORM_FROM_ACC_SIGNATURE,
        small.map_or("return acc;", |f| &f.transform_from_acc),
        file,
    );
    hook(
        out,
        spans,
        label("small_form_acc_factor_log2"),
        SMALL_FACTOR_SIGNATURE,
        small.map_or("return LOG2E;", |f| &f.acc_factor_log2),
        file,
    );
    hook(
        out,
        spans,
        label("small_form_acc_limit"),
        SMALL_LIMIT_SIGNATURE,
        small.map_or("return 0.0f;", |f| &f.acc_limit),
        file,
    );
    let short = small.and_then(|f| f.short.as_ref());
    hook(
        out,
        spans,
        label("short_form_acc_factor_log2"),
        SHORT_FACTOR_SIGNATURE,
        short.map_or("return LOG2E;", |f| &f.acc_factor_log2),
        file,
    );
    hook(
        out,
        spans,
        label("short_form_acc_limit"),
        SHORT_LIMIT_SIGNATURE,
        short.map_or("return 0.0f;", |f| &f.acc_limit),
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
        let [ParamValue::F32(c), ParamValue::F32(logit_scale), ParamValue::F32(acc_scale), ..] =
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

    /// The kernel's `odd_poly7`, operation for operation (FFMA is a fused multiply-add, FMUL a
    /// rounded product).
    fn even_poly6(x: f32, c: [f32; 4]) -> f32 {
        let t = x * x;
        c[3].mul_add(t, c[2]).mul_add(t, c[1]).mul_add(t, c[0])
    }
    fn odd_poly7(x: f32, c: [f32; 4]) -> f32 {
        x * even_poly6(x, c)
    }

    /// The small form agrees with `cap tanh(s / cap)` within 2.3e-7 * cap wherever the kernel
    /// takes it (`|acc| <= acc_limit`), from the logit and from the accumulator, on a dense grid
    /// for several caps and post-scales; and the limit stays within `|s| <= cap / 2`.
    #[test]
    fn soft_cap_small_form_is_within_its_bound() {
        for (cap, post_scale) in [
            (50.0f32, 0.088388346f32),
            (30.0, 0.125),
            (2.0, 0.0625),
            (0.05, 1.0),
        ] {
            let small = SoftCapSmall::new(cap, post_scale);
            let [c1, c2, c3] = small.s_coeffs;
            let limit = small.acc_limit;
            assert!(
                f64::from(limit) * f64::from(post_scale)
                    <= SOFTCAP_SMALL_X * f64::from(cap) * (1.0 + 1e-6)
            );
            let bound = 2.3e-7 * f64::from(cap);
            let steps = 200_000;
            let mut previous_log2 = f32::NEG_INFINITY;
            for i in -steps..=steps {
                let acc = limit * i as f32 / steps as f32;
                let s = acc * post_scale;
                let exact = f64::from(cap) * (f64::from(s) / f64::from(cap)).tanh();
                let via_s = odd_poly7(s, [1.0, c1, c2, c3]);
                assert!(
                    (f64::from(via_s) - exact).abs() <= bound,
                    "cap {cap}, s {s}: {via_s} vs {exact}"
                );
                // From the accumulator: the same function of acc (whose s is exact up to rounding).
                let exact_acc = f64::from(cap)
                    * (f64::from(acc) * f64::from(post_scale) / f64::from(cap)).tanh();
                let via_acc = odd_poly7(acc, small.acc_coeffs);
                assert!(
                    (f64::from(via_acc) - exact_acc).abs() <= bound,
                    "cap {cap}, acc {acc}: {via_acc} vs {exact_acc}"
                );
                // Factored, in log2 units: the kernels' exponent FFMA(acc, factor, -offset)
                // rounds once, after the offset, so the product is exact here (f64 of two f32);
                // the same bound times LOG2E, and non-decreasing in acc (the row max is taken on
                // acc; checked on the f32 product too).
                let factor = even_poly6(acc, small.acc_log2_coeffs);
                let log2 = f64::from(acc) * f64::from(factor);
                let exact_log2 = exact_acc * std::f64::consts::LOG2_E;
                assert!(
                    (log2 - exact_log2).abs() <= bound * std::f64::consts::LOG2_E,
                    "cap {cap}, acc {acc}: {log2} vs {exact_log2} (log2 units)"
                );
                let rounded = acc * factor;
                assert!(rounded >= previous_log2, "cap {cap}, acc {acc}: decreasing");
                previous_log2 = rounded;
            }
            assert!(odd_poly7(f32::NAN, [1.0, c1, c2, c3]).is_nan());
        }
    }

    /// The short form, as the kernels evaluate it (`fmaf(acc * acc, c1, c0)`, then the exponent's
    /// FFMA, exact here as above), agrees with `cap tanh(s / cap)` within the small form's bound
    /// wherever the kernel takes it (`|acc| <= short_acc_limit`), is non-decreasing there, and its
    /// limit stays within `|s| <= SOFTCAP_SHORT_X cap` and within the small form's.
    #[test]
    fn soft_cap_short_form_is_within_its_bound() {
        for (cap, post_scale) in [
            (50.0f32, 0.088388346f32),
            (30.0, 0.125),
            (2.0, 0.0625),
            (0.05, 1.0),
        ] {
            let small = SoftCapSmall::new(cap, post_scale);
            let [c0, c1] = small.short_acc_log2_coeffs;
            let limit = small.short_acc_limit;
            assert!(
                f64::from(limit) * f64::from(post_scale)
                    <= SOFTCAP_SHORT_X * f64::from(cap) * (1.0 + 1e-6)
            );
            assert!(limit < small.acc_limit);
            let bound = 2.3e-7 * f64::from(cap) * std::f64::consts::LOG2_E;
            let steps = 200_000;
            let mut previous = f32::NEG_INFINITY;
            for i in -steps..=steps {
                let acc = limit * i as f32 / steps as f32;
                let factor = (acc * acc).mul_add(c1, c0);
                let log2 = f64::from(acc) * f64::from(factor);
                let exact = f64::from(cap)
                    * (f64::from(acc) * f64::from(post_scale) / f64::from(cap)).tanh()
                    * std::f64::consts::LOG2_E;
                assert!(
                    (log2 - exact).abs() <= bound,
                    "cap {cap}, acc {acc}: {log2} vs {exact} (log2 units)"
                );
                let rounded = acc * factor;
                assert!(rounded >= previous, "cap {cap}, acc {acc}: decreasing");
                previous = rounded;
            }
        }
    }
}
