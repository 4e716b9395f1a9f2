// variant.cuh — the variant interface every generated kernel calls (documentation and glue).
//
// A variant is rendered by Rust (codegen/variant.rs) just before this file, built-in or custom
// alike, and must provide:
//   struct VariantParams { ... };                       // its parameters, passed by value
//   constexpr bool VARIANT_HAS_TRANSFORM, VARIANT_TRANSFORM_FROM_ACC, VARIANT_HAS_MASK,
//                  VARIANT_HAS_SINK;
//   float logits_transform(const VariantParams& params, float s, int qo_idx, int kv_idx,
//                          int qo_head, int kv_head, int qo_len, int kv_len);
//   float logits_transform_from_acc(const VariantParams& params, float acc, int qo_idx,
//                                   int kv_idx, int qo_head, int kv_head, int qo_len, int kv_len);
//   bool  logits_mask(const VariantParams& params, int qo_idx, int kv_idx, int qo_head,
//                     int kv_head, int qo_len, int kv_len);
//   float sink_logit(const VariantParams& params, int qo_head);
//   constexpr bool VARIANT_HAS_SMALL_FORM;
//   float small_form_acc_limit(const VariantParams& params);
//   float logits_transform_small(...), logits_transform_small_from_acc(...);  // as the two above
//   float small_form_acc_factor_log2(const VariantParams& params, float acc);
//   constexpr bool VARIANT_HAS_SHORT_FORM;
//   float short_form_acc_limit(const VariantParams& params);
//   float short_form_acc_factor_log2(const VariantParams& params, float acc);
// `s` is always the scaled logit as a float (sm_scale * q.k), whatever the QK accumulation type:
// kernels widen an f16 accumulator exactly before the call, so a variant never meets a half.
// `logits_transform_from_acc` is the same function of `s = post_scale * acc` taken from the
// widened accumulator, with post_scale folded into the variant's own (host-computed) parameters,
// which saves one multiplication per logit. Only built-ins provide one
// (VARIANT_TRANSFORM_FROM_ACC); a custom variant's transform always sees `s`.
// A built-in may also have a cheaper form of its transform that holds while the accumulator is
// small (VARIANT_HAS_SMALL_FORM: the soft-cap's polynomial, for |s| <= cap / 2): the same function
// within the transform's own error bound wherever |acc| <= small_form_acc_limit(params). Kernels
// take it for a whole sub-tile when every accumulator of the warp is within the limit (a
// warp-uniform choice), and the full form otherwise; a custom variant never has one. Its
// accumulator form is a non-decreasing function of acc alone on that range, also given factored in
// log2 units: acc * small_form_acc_factor_log2(acc) = LOG2E * logits_transform_small_from_acc(acc)
// (FactoredSmallLogits below). A small form may have a short form still (VARIANT_HAS_SHORT_FORM:
// the soft-cap's quadratic factor, for |s| <= cap / 10), given only factored, under a smaller
// limit, with the same bound and monotonicity; kernels take it for a sub-tile the same way.
// Indices are local to the request (0 <= qo_idx < qo_len, 0 <= kv_idx < kv_len).
// This file turns the hooks into the logits the fast kernels' online softmax works with
// (variant_logit) and into the plain natural logits and visibility the reference kernel uses
// (variant_transform, variant_visible).
// Requires: common.cuh and the rendered variant; FactoredSmallLogits also online_softmax.cuh
// (thread_row_max_f32), which the reference kernel, which does not use it, leaves out.

// Logit of one element in the units the online softmax takes; the softmax multiplies by its
// scale inside the exponent's FFMA. With a transform: the natural logit transform(post_scale *
// acc) (softmax scale LOG2E), through the variant's accumulator form where it has one and the
// kernel asks for it (FROM_ACC); without one: the raw accumulator (softmax scale
// post_scale * LOG2E).
// SMALL: through the variant's small form, which the caller has checked holds for `acc`.
template <bool FROM_ACC, bool SMALL>
__device__ __forceinline__ float variant_logit(const VariantParams& params, float acc, float post_scale, int qo_idx,
                                               int kv_idx, int qo_head, int kv_head, int qo_len, int kv_len) {
  static_assert(!SMALL || VARIANT_HAS_SMALL_FORM, "the small form of a variant that has one");
  if constexpr (FROM_ACC && VARIANT_TRANSFORM_FROM_ACC) {
    return SMALL ? logits_transform_small_from_acc(params, acc, qo_idx, kv_idx, qo_head, kv_head, qo_len, kv_len)
                 : logits_transform_from_acc(params, acc, qo_idx, kv_idx, qo_head, kv_head, qo_len, kv_len);
  } else if constexpr (VARIANT_HAS_TRANSFORM) {
    const float s = acc * post_scale;
    return SMALL ? logits_transform_small(params, s, qo_idx, kv_idx, qo_head, kv_head, qo_len, kv_len)
                 : logits_transform(params, s, qo_idx, kv_idx, qo_head, kv_head, qo_len, kv_len);
  } else {
    return acc;
  }
}

// The natural-log logit t = transform(s) of one element, `s` the scaled logit (a variant without
// a transform returns s): the form the reference kernel works with.
__device__ __forceinline__ float variant_transform(const VariantParams& params, float s, int qo_idx, int kv_idx,
                                                   int qo_head, int kv_head, int qo_len, int kv_len) {
  if constexpr (VARIANT_HAS_TRANSFORM) {
    return logits_transform(params, s, qo_idx, kv_idx, qo_head, kv_head, qo_len, kv_len);
  } else {
    return s;
  }
}

// Whether the variant's own mask lets the key through (always, for a variant without one).
__device__ __forceinline__ bool variant_visible(const VariantParams& params, int qo_idx, int kv_idx, int qo_head,
                                                int kv_head, int qo_len, int kv_len) {
  if constexpr (VARIANT_HAS_MASK) {
    return logits_mask(params, qo_idx, kv_idx, qo_head, kv_head, qo_len, kv_len);
  } else {
    return true;
  }
}

// The logits of one sub-tile as OnlineSoftmax::update takes them (online_softmax.cuh: the same
// thread_row_max and exp_row as F32Logits), left as raw accumulators of a variant's small form
// from the accumulator, which the caller has checked holds for every element of the warp's
// sub-tile (none masked). The form is non-decreasing in acc, so the row max is taken on the
// accumulators and only it is transformed; each exponent is then one FFMA of acc and its factor
// (small_form_acc_factor_log2, log2 units), the form's last product and the softmax's scale
// merged: one instruction per logit fewer than transform, then exponent. `scale` is unused (the
// factor holds LOG2E). After the update the probabilities are in `s`, as F32Logits leaves them.
// SHORT: the short form's factor (which the caller has checked holds) instead of the small form's.
// `largest` is the caller's largest |acc| of this thread's part (largest_magnitude), which its
// check of the form took anyway: the form of it bounds every logit of the thread's rows
// (thread_bound), so a sub-tile whose references stay needs no row max at all (one FMNMX per
// logit fewer).
template <int MMA_Q, int KV_NT, bool SHORT>
struct FactoredSmallLogits {
  float (&s)[MMA_Q][KV_NT][4];
  const VariantParams& params;
  float largest;

  __device__ __forceinline__ float factor(float acc) const {
    static_assert(!SHORT || VARIANT_HAS_SHORT_FORM, "the short form of a variant that has one");
    return SHORT ? short_form_acc_factor_log2(params, acc) : small_form_acc_factor_log2(params, acc);
  }
  __device__ __forceinline__ float thread_row_max(int mq, int h) const {
    const float raw = thread_row_max_f32(s, mq, h);
    return raw * factor(raw);
  }
  __device__ __forceinline__ float thread_bound(int, int) const { return largest * factor(largest); }
  template <bool WITH_SUM>
  __device__ __forceinline__ float exp_row(int mq, int h, float, float offset) const {
    auto p = [&](float a) { return exp2_approx(fmaf(a, factor(a), -offset)); };
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < KV_NT; ++nt) {
      s[mq][nt][2 * h] = p(s[mq][nt][2 * h]);
      s[mq][nt][2 * h + 1] = p(s[mq][nt][2 * h + 1]);
      if constexpr (WITH_SUM) sum += s[mq][nt][2 * h] + s[mq][nt][2 * h + 1];
    }
    return sum;
  }
};
