// variant.cuh — the variant interface every generated kernel calls (documentation and glue).
//
// A variant is rendered by Rust (codegen/variant.rs) just before this file, built-in or custom
// alike, and must provide:
//   struct VariantParams { ... };                       // its parameters, passed by value
//   constexpr bool VARIANT_HAS_TRANSFORM, VARIANT_HAS_MASK, VARIANT_HAS_SINK;
//   float logits_transform(const VariantParams& params, float s, int qo_idx, int kv_idx,
//                          int qo_head, int kv_head, int qo_len, int kv_len);
//   bool  logits_mask(const VariantParams& params, int qo_idx, int kv_idx, int qo_head,
//                     int kv_head, int qo_len, int kv_len);
//   float sink_logit(const VariantParams& params, int qo_head);
// `s` is always the scaled logit as a float (sm_scale * q.k), whatever the QK accumulation type:
// kernels widen an f16 accumulator exactly before the call, so a variant never meets a half.
// Indices are local to the request (0 <= qo_idx < qo_len, 0 <= kv_idx < kv_len).
// This file turns the hooks into the base-2 logits the online softmax works with.
// Requires: common.cuh and the rendered variant.

// Logit of one element in the units the online softmax takes; the softmax multiplies by its
// scale inside the exponent's FFMA. With a transform: the natural logit transform(post_scale *
// acc) (softmax scale LOG2E); without one: the raw accumulator (softmax scale post_scale * LOG2E).
__device__ __forceinline__ float variant_logit(const VariantParams& params, float acc, float post_scale, int qo_idx,
                                               int kv_idx, int qo_head, int kv_head, int qo_len, int kv_len) {
  if constexpr (VARIANT_HAS_TRANSFORM) {
    return logits_transform(params, acc * post_scale, qo_idx, kv_idx, qo_head, kv_head, qo_len, kv_len);
  } else {
    return acc;
  }
}
