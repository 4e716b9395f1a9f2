// prefill_step.cuh — a sub-tile's step once S = Q K^T is in registers as floats: the logits
// transform and the masks (applied to S as f32, whatever the accumulation type), the online
// softmax update, and O += P V. The accumulation variants (f32 QK; f16 QK with its packed hot path
// and its float path, whole or in pieces) share these pieces in prefill.cuh's main loop.
// Requires: mask.cuh, variant.cuh, online_softmax.cuh, prefill_tile.cuh, prefill_products.cuh.

namespace prefill {

// Turns accumulators into logits in the softmax's units in place (variant_logit, through the
// variant's small form when SMALL), then applies the mask (-inf). `s` holds keys k0.. of NT n8
// tiles.
template <bool NEEDS_MASK, bool SMALL, int NT>
__device__ __forceinline__ void logits_as(const PrefillParams& p, const RowCoords& rows, const RequestMaskContext& m,
                                          int kv_head, int k0, int lane, float (&s)[MMA_Q][NT][4]) {
  // With policy::CUSTOM_MASK_WORDS, a custom mask's bits for each of the thread's rows, read for
  // the whole sub-tile at once (custom_mask_row_bits) and shifted to this thread's first key:
  // element (nt, e) of a row is then bit (8 * nt) % 32 + e % 2 of word (8 * nt) / 32. Otherwise
  // each element's bit is read by mask_visible.
  constexpr bool CUSTOM_BITS = NEEDS_MASK && policy::CUSTOM_MASK_WORDS;
  constexpr int MASK_WORDS = CUSTOM_BITS ? (NT * 8 + 31) / 32 : 1;
  u32_t mask_bits[MMA_Q][2][MASK_WORDS];
  if constexpr (CUSTOM_BITS) {
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        u32_t bits[MASK_WORDS];
        custom_mask_row_bits(m, rows.token[mq][h], k0, bits);
#pragma unroll
        for (int w = 0; w < MASK_WORDS; ++w)
          mask_bits[mq][h][w] = __funnelshift_r(bits[w], w + 1 < MASK_WORDS ? bits[w + 1] : 0u, 2 * (lane % 4));
      }
  }
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int h = e / 2;
        int kv_idx = k0 + nt * 8 + 2 * (lane % 4) + (e % 2);
        int qo_idx = rows.token[mq][h];
        int qo_head = rows.head[mq][h];
        float t = variant_logit<policy::TRANSFORM_FROM_ACC, SMALL>(p.variant, s[mq][nt][e], p.post_scale, qo_idx, kv_idx,
                                                           qo_head, kv_head, m.qo_len, m.kv_len);
        if constexpr (NEEDS_MASK) {
          bool visible;
          if constexpr (CUSTOM_BITS) {
            // mask_visible's definition, padding rows included, without a branch.
            const u32_t bit = (mask_bits[mq][h][(8 * nt) / 32] >> ((8 * nt) % 32 + e % 2)) & 1u;
            visible = (kv_idx < m.kv_len) & (qo_idx < m.qo_len) & (bit != 0u);
          } else {
            visible = kv_idx < m.kv_len && mask_visible<spec::MASK_KIND>(m, qo_idx, kv_idx);
          }
          if constexpr (VARIANT_HAS_MASK) {
            visible = visible && logits_mask(p.variant, qo_idx, kv_idx, qo_head, kv_head, m.qo_len, m.kv_len);
          }
          t = visible ? t : neg_inf();
        }
        s[mq][nt][e] = t;
      }
}

// The largest |accumulator| of this thread's part of a sub-tile (a NaN accumulator is passed
// over, so it counts as within either form: both keep NaN).
template <int NT>
__device__ __forceinline__ float largest_magnitude(const float (&s)[MMA_Q][NT][4]) {
  float largest = 0.0f;
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) largest = fmaxf(largest, fabsf(s[mq][nt][e]));
  return largest;
}

// Whether the variant's small form holds for every accumulator of the warp's sub-tile.
// Warp-uniform.
template <int NT>
__device__ __forceinline__ bool small_form_holds(const VariantParams& params, const float (&s)[MMA_Q][NT][4]) {
  return __all_sync(0xffffffffu, largest_magnitude(s) <= small_form_acc_limit(params));
}

// logits_as, through the variant's small form where it has one and small_form_holds.
template <bool NEEDS_MASK, int NT>
__device__ __forceinline__ void logits(const PrefillParams& p, const RowCoords& rows, const RequestMaskContext& m,
                                       int kv_head, int k0, int lane, float (&s)[MMA_Q][NT][4]) {
  if constexpr (VARIANT_HAS_SMALL_FORM) {
    if (small_form_holds(p.variant, s)) {
      logits_as<NEEDS_MASK, true>(p, rows, m, kv_head, k0, lane, s);
      return;
    }
  }
  logits_as<NEEDS_MASK, false>(p, rows, m, kv_head, k0, lane, s);
}

// The rest of a sub-tile's step once its logits are floats (s: NT n8 tiles, keys k0..; the rows'
// coordinates from `rows`, RowCoords or FreshRows): the mask
// and the transform where they apply, the softmax update and O += P V (V rows from v_base, once
// `await_v()` has returned).
// float_logits_update: the same up to the softmax update, leaving P in `s` (F32Logits) for the
// caller's P V; `o` is what the update rescales: the output accumulators, or O_NT = 1 columns
// of ones that collect each row's rescale factor for a caller whose P V is still in flight.
template <int NT, typename Rows, int O_NT>
__device__ __forceinline__ void float_logits_update(const PrefillParams& p, const Rows& rows,
                                                    const RequestMaskContext& m, const QueryTile& tile, int tok_lo,
                                                    int tok_hi, int k0, int lane, float softmax_scale,
                                                    Softmax& softmax, float (&s)[MMA_Q][NT][4],
                                                    float (&o)[MMA_Q][O_NT][4]) {
  // An unmasked sub-tile within the small form (from the accumulator) goes to the softmax as
  // FactoredSmallLogits: the transform merges into the exponents.
  // Within the short form too (VARIANT_HAS_SHORT_FORM), its cheaper factor: one more vote.
  bool factored = false, short_form = false;
  float largest = 0.0f;  // the largest |acc| of this thread, where a form is checked
  if (tile_needs_mask<spec::MASK_KIND, VARIANT_HAS_MASK>(m, tok_lo, tok_hi, k0, NT * 8)) {
    logits<true>(p, coords_of(rows), m, tile.kv_head, k0, lane, s);
  } else if constexpr (policy::FACTORED_SMALL_FORM) {
    largest = largest_magnitude(s);
    factored = __all_sync(0xffffffffu, largest <= small_form_acc_limit(p.variant));
    if constexpr (VARIANT_HAS_SHORT_FORM) {
      short_form = factored && __all_sync(0xffffffffu, largest <= short_form_acc_limit(p.variant));
    }
    if (!factored) logits_as<false, false>(p, coords_of(rows), m, tile.kv_head, k0, lane, s);
  } else if constexpr (VARIANT_HAS_TRANSFORM) {
    logits<false>(p, coords_of(rows), m, tile.kv_head, k0, lane, s);
  }
  const F32Logits<MMA_Q, NT, DTypeIn> probs{s};
  if (short_form) {
    if constexpr (policy::FACTORED_SMALL_FORM && VARIANT_HAS_SHORT_FORM) {
      softmax.update(FactoredSmallLogits<MMA_Q, NT, true>{s, p.variant, largest}, o, 1.0f);
    }
  } else if (policy::FACTORED_SMALL_FORM && factored) {
    softmax.update(FactoredSmallLogits<MMA_Q, NT, false>{s, p.variant, largest}, o, 1.0f);
  } else {
    softmax.update(probs, o, softmax_scale);
  }
}
template <int NT, typename Rows, typename AwaitV>
__device__ __forceinline__ void float_logits_step(const PrefillParams& p, const Rows& rows,
                                                  const RequestMaskContext& m, const QueryTile& tile, int tok_lo,
                                                  int tok_hi, int k0, int lane, const FragAddrs& f, u32_t v_base,
                                                  float softmax_scale, Softmax& softmax,
                                                  float (&s)[MMA_Q][NT][4], float (&o)[MMA_Q][VO_NT][4],
                                                  AwaitV await_v) {
  float_logits_update(p, rows, m, tile, tok_lo, tok_hi, k0, lane, softmax_scale, softmax, s, o);
  await_v();
  pv<NT>(f, v_base, F32Logits<MMA_Q, NT, DTypeIn>{s}, softmax, o);
}

}  // namespace prefill
