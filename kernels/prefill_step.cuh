// prefill_step.cuh — a sub-tile's step: step_subtile, S = Q K^T in the kernel's accumulation
// variant (f32 QK; f16 QK with its packed hot path and its float path, whole or in pieces), then
// the pieces it shares once S is in registers as floats: the logits transform and the masks
// (applied to S as f32, whatever the accumulation type), the online softmax update, and O += P V.
// Requires: mask.cuh, variant.cuh, online_softmax.cuh, prefill_tile.cuh, prefill_products.cuh,
// prefill_fp8_fragments.cuh, prefill_kv_pipeline.cuh.

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
        int kv_idx = s_column_key(k0, nt, lane, e);
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
  if constexpr (policy::FP8_FRAGMENTS) {
    pv_fp8_fragments<NT>(v_base, lane, F32Logits<MMA_Q, NT, DTypeIn>{s}, softmax, o);
  } else {
    pv<NT>(f, v_base, F32Logits<MMA_Q, NT, DTypeIn>{s}, softmax, o);
  }
}

// The keys of the float logits a step holds at once: the whole sub-tile, or one piece of it.
constexpr int STEP_KEYS = policy::F16_WIDEN_FIRST || policy::F16_WARP_CHOICE ? KV_SUB
                          : spec::QK_F16_ACCUM                                 ? policy::F16_FLOAT_PIECE
                                                                               : policy::F32_PIECE;

// The rows' coordinates as the sub-tile loop's logits take them: RowCoords computed before the
// loop, or with policy::LOOP_ROWS_FRESH, FreshRows (computed again at each use).
template <bool FRESH>
struct LoopRowsOf {
  using type = RowCoords;
};
template <>
struct LoopRowsOf<true> {
  using type = FreshRows;
};
using LoopRows = typename LoopRowsOf<policy::LOOP_ROWS_FRESH>::type;
// (A template, so that the branch `if constexpr` discards is not instantiated.)
template <typename Coords, typename Fresh>
__device__ __forceinline__ const LoopRows& loop_rows(const Coords& rows, const Fresh& fresh) {
  if constexpr (policy::LOOP_ROWS_FRESH) {
    return fresh;
  } else {
    return rows;
  }
}

// A sub-tile step's context: run_cta's values it reads, by reference.
template <typename Rows>
struct StepContext {
  const PrefillParams& p;
  const QueryTile& tile;
  const Rows& rows;
  const LoopBounds& bounds;
  const FragAddrs& frag;
  const int& lane;
  const int& warpgroup;
  const float& softmax_scale;  // folded into the softmax's exponent
  const u32_t& q_tile_base;
  const u32_t& q_group_base;  // with wgmma: the first Q row of this warp's warpgroup
  const float& k_scale;       // with FP8_SCALES_AFTER_PRODUCTS: the KV head's K scale, for S

  // The Q rows the products read from: with policy::Q_DESC_IN_LOOP derived again in each sub-tile
  // from a fresh read of the thread index, not held through the loop.
  __device__ __forceinline__ u32_t q_base_now() const {
    return policy::Q_DESC_IN_LOOP ? q_tile_base + warp_uniform(thread_index() / 128) * WARPGROUP_ROWS * QTile::ROW_BYTES
                                  : q_group_base;
  }
};

// One sub-tile's step (keys k0.., K rows at k_sub, V rows at v_sub) in the kernel's accumulation
// variant. await_v() waits for V_t before a P V; await_v_free_k() too, and with one K/V buffer
// lets tile t + 1's K rows out (policy::K_FREE_BEFORE_PV).
template <typename Rows, typename AwaitV, typename AwaitVFreeK, typename S>
__device__ __forceinline__ void step_subtile(const StepContext<Rows>& c, int k0, const KTile& k_sub, const VTile& v_sub,
                                             Softmax& softmax, float (&o)[MMA_Q][VO_NT][4], AwaitV await_v,
                                             AwaitVFreeK await_v_free_k, u32_t (&acc)[MMA_Q][KV_NT][2],
                                             S& s) {
  if constexpr (policy::F16_WIDEN_FIRST) {
    // Every warp widens its accumulators (the overflow fallback included), then runs the
    // f32-QK kernels' step on the floats: one P V after one update, as there.
    const bool finite = qk_f16<false>(c.frag, c.q_base_now(), k_sub.base, c.warpgroup, acc);
    widen_f16(c.frag, k_sub.base, acc, 0, finite, s);
    float_logits_step(c.p, c.rows, c.bounds.mask(), c.tile, c.bounds.tok_lo(), c.bounds.tok_hi(), k0, c.lane, c.frag, v_sub.base,
                      c.softmax_scale, softmax, s, o, await_v_free_k);
  } else if constexpr (policy::F16_WARP_CHOICE) {
    const bool finite = qk_f16<false>(c.frag, c.q_base_now(), k_sub.base, c.warpgroup, acc);
    if (!VARIANT_HAS_TRANSFORM && finite &&
        !tile_needs_mask<spec::MASK_KIND, VARIANT_HAS_MASK>(c.bounds.mask(), c.bounds.tok_lo(), c.bounds.tok_hi(), k0,
                                                            KV_SUB)) {
      softmax.update(F16Logits<MMA_Q, KV_NT>{acc}, o, c.softmax_scale);
    } else {
        widen_f16(c.frag, k_sub.base, acc, 0, finite, s);
      float_logits_update(c.p, c.rows, c.bounds.mask(), c.tile, c.bounds.tok_lo(), c.bounds.tok_hi(), k0, c.lane, c.softmax_scale,
                          softmax, s, o);
      const F32Logits<MMA_Q, KV_NT, DTypeIn> probs{s};
#pragma unroll
      for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
        for (int nt = 0; nt < KV_NT; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h) acc[mq][nt][h] = probs.p_pair(mq, nt, h);
    }
    await_v_free_k();
    pv<KV_NT>(c.frag, v_sub.base, F16Logits<MMA_Q, KV_NT>{acc}, softmax, o);
  } else if constexpr (spec::QK_F16_ACCUM) {
    const bool finite = qk_f16(c.frag, c.q_base_now(), k_sub.base, c.warpgroup, acc);
    if (!VARIANT_HAS_TRANSFORM && finite &&
        !tile_needs_mask<spec::MASK_KIND, VARIANT_HAS_MASK>(c.bounds.mask(), c.bounds.tok_lo(), c.bounds.tok_hi(), k0,
                                                            KV_SUB)) {
      // The hot path: the softmax takes the accumulators as they are.
      const F16Logits<MMA_Q, KV_NT> probs{acc};
      softmax.update(probs, o, c.softmax_scale);
      await_v();
      pv<KV_NT>(c.frag, v_sub.base, probs, softmax, o);
    } else {
#pragma unroll
      for (int piece = 0; piece < KV_SUB / policy::F16_FLOAT_PIECE; ++piece) {
        widen_f16(c.frag, k_sub.base, acc, piece, finite, s);
        float_logits_step(c.p, c.rows, c.bounds.mask(), c.tile, c.bounds.tok_lo(), c.bounds.tok_hi(),
                          k0 + piece * policy::F16_FLOAT_PIECE, c.lane, c.frag,
                          v_sub.base + piece * policy::F16_FLOAT_PIECE * VTile::ROW_BYTES, c.softmax_scale, softmax, s, o,
                          await_v);
      }
    }
  } else {
    // Piece by piece (policy::F32_PIECE; one piece of the whole sub-tile unless the logits are heavy).
    // Not unrolled: unrolled, ptxas overlapped the two pieces and spilled more than with the
    // whole sub-tile (sm_80 f32-QK window w4q2kv64: 0 -> 80/88 B of spills).
#pragma unroll 1
    for (int piece = 0; piece < KV_SUB / policy::F32_PIECE; ++piece) {
      const u32_t k_piece = k_sub.base + piece * policy::F32_PIECE * K_ROW_BYTES;
      const u32_t v_piece = v_sub.base + piece * policy::F32_PIECE * V_ROW_BYTES;
      if constexpr (WGMMA) {
        qk_wgmma(c.q_group_base, k_piece, s);
      } else if constexpr (policy::FP8_FRAGMENTS) {
        qk_f32_fp8_fragments(c.frag, k_piece, c.lane, s);
      } else {
        qk_f32(c.frag, k_piece, s);
      }
      if constexpr (FP8_SCALES_AFTER_PRODUCTS && !K_SCALE_IN_SOFTMAX) scale_products(s, c.k_scale);
      float_logits_step(c.p, c.rows, c.bounds.mask(), c.tile, c.bounds.tok_lo(), c.bounds.tok_hi(), k0 + piece * policy::F32_PIECE, c.lane,
                        c.frag, v_piece, c.softmax_scale, softmax, s, o, await_v_free_k);
    }
  }
}

}  // namespace prefill
