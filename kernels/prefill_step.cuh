// prefill_step.cuh — one sub-tile's step once S = Q K^T is in registers: the logits transform
// and the masks (applied to S as f32, whatever the accumulation type), the online softmax update,
// and O += P V. The accumulation variants (f32 QK; f16 QK with its packed hot path and its float
// path; the float path's pieces) share these pieces and are put together by step_subtile in
// prefill.cuh's main loop.
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

// What a sub-tile's step reads of its CTA: the parameters, the query tile, the rows' coordinates,
// the request's bounds as the loop reads them, this thread's fragment addresses, and with wgmma
// where the warpgroup's Q rows start.
struct StepContext {
  const PrefillParams& p;
  const QueryTile& tile;
  const RowCoords& held_rows;   // computed before the loop
  const FreshRows& fresh_rows;  // computed again at each use
  const LoopBounds& bounds;
  const FragAddrs& frag;
  int lane;
  int warpgroup;
  float softmax_scale;  // the softmax folds this into its exponent
  u32_t q_tile_base;
  u32_t q_group_base;  // wgmma: the first Q row of this warp's warpgroup

  // The warpgroup's Q base as the products read it: with policy::Q_DESC_IN_LOOP derived again in
  // each sub-tile from a fresh read of the thread index, not held through the loop.
  __device__ __forceinline__ u32_t q_base_now() const {
    return policy::Q_DESC_IN_LOOP
               ? q_tile_base + warp_uniform(thread_index() / 128) * WARPGROUP_ROWS * QTile::ROW_BYTES
               : q_group_base;
  }

  // The rows' coordinates as the loop's logits take them (coords_of): FreshRows with
  // policy::LOOP_ROWS_FRESH, so that nothing of them is live between the sub-tiles' logits.
  __device__ __forceinline__ const auto& rows() const {
    if constexpr (policy::LOOP_ROWS_FRESH) {
      return fresh_rows;
    } else {
      return held_rows;
    }
  }

  // Whether the keys k0.. (n of them) need the element masks for this query tile.
  __device__ __forceinline__ bool needs_mask(int k0, int n) const {
    return tile_needs_mask<spec::MASK_KIND, VARIANT_HAS_MASK>(bounds.mask(), bounds.tok_lo(), bounds.tok_hi(), k0, n);
  }
};

// A sub-tile's step once its logits are floats (s: NT n8 tiles, keys k0..), up to the softmax
// update: the mask and the transform where they apply, then the update, leaving P in `s`
// (F32Logits) for the caller's P V. An unmasked sub-tile within the variant's small form (from
// the accumulator) goes to the softmax as FactoredSmallLogits, the transform merged into the
// exponents; within the short form too (VARIANT_HAS_SHORT_FORM), its cheaper factor: one more vote.
template <int NT>
__device__ __forceinline__ void float_logits_update(const StepContext& c, int k0, float (&s)[MMA_Q][NT][4],
                                                    Softmax& softmax, float (&o)[MMA_Q][VO_NT][4]) {
  decltype(auto) m = c.bounds.mask();
  const int tok_lo = c.bounds.tok_lo(), tok_hi = c.bounds.tok_hi();
  const PrefillParams& p = c.p;
  const int kv_head = c.tile.kv_head;
  bool factored = false, short_form = false;
  float largest = 0.0f;  // the largest |acc| of this thread, where a form is checked
  if (tile_needs_mask<spec::MASK_KIND, VARIANT_HAS_MASK>(m, tok_lo, tok_hi, k0, NT * 8)) {
    logits<true>(p, coords_of(c.rows()), m, kv_head, k0, c.lane, s);
  } else if constexpr (policy::FACTORED_SMALL_FORM) {
    largest = largest_magnitude(s);
    factored = __all_sync(0xffffffffu, largest <= small_form_acc_limit(p.variant));
    if constexpr (VARIANT_HAS_SHORT_FORM) {
      short_form = factored && __all_sync(0xffffffffu, largest <= short_form_acc_limit(p.variant));
    }
    if (!factored) logits_as<false, false>(p, coords_of(c.rows()), m, kv_head, k0, c.lane, s);
  } else if constexpr (VARIANT_HAS_TRANSFORM) {
    logits<false>(p, coords_of(c.rows()), m, kv_head, k0, c.lane, s);
  }
  const F32Logits<MMA_Q, NT, DTypeIn> probs{s};
  if (short_form) {
    if constexpr (policy::FACTORED_SMALL_FORM && VARIANT_HAS_SHORT_FORM) {
      softmax.update(FactoredSmallLogits<MMA_Q, NT, true>{s, p.variant, largest}, o, 1.0f);
    }
  } else if (policy::FACTORED_SMALL_FORM && factored) {
    softmax.update(FactoredSmallLogits<MMA_Q, NT, false>{s, p.variant, largest}, o, 1.0f);
  } else {
    softmax.update(probs, o, c.softmax_scale);
  }
}

// float_logits_update, then O += P V with V rows from v_base once `await_v()` has returned.
template <int NT, typename AwaitV>
__device__ __forceinline__ void float_logits_step(const StepContext& c, int k0, u32_t v_base,
                                                  float (&s)[MMA_Q][NT][4], Softmax& softmax,
                                                  float (&o)[MMA_Q][VO_NT][4], AwaitV await_v) {
  float_logits_update(c, k0, s, softmax, o);
  await_v();
  pv<NT>(c.frag, v_base, F32Logits<MMA_Q, NT, DTypeIn>{s}, softmax, o);
}

// One sub-tile of tile t: keys k0.. from K rows `k_sub` and V rows `v_sub`, from S = Q K^T to
// O += P V, in the kernel's accumulation variant. The K/V pipeline is asked for V before each P V
// (and, where the sub-tile is done with K by then, lets tile t + 1's K rows out).
__device__ __forceinline__ void step_subtile(const StepContext& c, KvPipeline& kv, int t, int k0, u32_t k_sub,
                                             u32_t v_sub, Softmax& softmax, float (&o)[MMA_Q][VO_NT][4]) {
  auto await_v = [&]() { kv.await_v(); };
  auto await_v_free_k = [&]() { kv.await_v_free_k(t); };
  if constexpr (policy::F16_WIDEN_FIRST) {
    // Every warp widens its accumulators (the overflow fallback included), then runs the f32-QK
    // step on the floats: one P V after one update.
    u32_t acc[MMA_Q][KV_NT][2];
    const bool finite = qk_f16<false>(c.frag, c.q_base_now(), k_sub, c.warpgroup, acc);
    float s[MMA_Q][KV_NT][4];
    widen_f16(c.frag, k_sub, acc, 0, finite, s);
    float_logits_step(c, k0, v_sub, s, softmax, o, await_v_free_k);
  } else if constexpr (policy::F16_WARP_CHOICE) {
    // The packed hot path and the float path meet before one P V, chosen by each warp's vote.
    u32_t acc[MMA_Q][KV_NT][2];
    const bool finite = qk_f16<false>(c.frag, c.q_base_now(), k_sub, c.warpgroup, acc);
    if (!VARIANT_HAS_TRANSFORM && finite && !c.needs_mask(k0, KV_SUB)) {
      softmax.update(F16Logits<MMA_Q, KV_NT>{acc}, o, c.softmax_scale);
    } else {
      float s[MMA_Q][KV_NT][4];
      widen_f16(c.frag, k_sub, acc, 0, finite, s);
      float_logits_update(c, k0, s, softmax, o);
      const F32Logits<MMA_Q, KV_NT, DTypeIn> probs{s};
#pragma unroll
      for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
        for (int nt = 0; nt < KV_NT; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h) acc[mq][nt][h] = probs.p_pair(mq, nt, h);
    }
    await_v_free_k();
    pv<KV_NT>(c.frag, v_sub, F16Logits<MMA_Q, KV_NT>{acc}, softmax, o);
  } else if constexpr (spec::QK_F16_ACCUM) {
    u32_t acc[MMA_Q][KV_NT][2];
    const bool finite = qk_f16(c.frag, c.q_base_now(), k_sub, c.warpgroup, acc);
    if (!VARIANT_HAS_TRANSFORM && finite && !c.needs_mask(k0, KV_SUB)) {
      // The hot path: the softmax takes the accumulators as they are.
      const F16Logits<MMA_Q, KV_NT> probs{acc};
      softmax.update(probs, o, c.softmax_scale);
      await_v();
      pv<KV_NT>(c.frag, v_sub, probs, softmax, o);
    } else {
      // The float path, piece by piece (policy::F16_FLOAT_PIECE), each piece to its own P V.
      constexpr int PIECE = policy::F16_FLOAT_PIECE;
#pragma unroll
      for (int piece = 0; piece < KV_SUB / PIECE; ++piece) {
        float s[MMA_Q][PIECE / 8][4];
        widen_f16(c.frag, k_sub, acc, piece, finite, s);
        float_logits_step(c, k0 + piece * PIECE, v_sub + piece * PIECE * VTile::ROW_BYTES, s, softmax, o, await_v);
      }
    }
  } else {
    // f32 QK, piece by piece (policy::F32_PIECE; one piece of the whole sub-tile unless the logits
    // are heavy). Not unrolled: unrolled, ptxas overlapped the pieces and spilled.
    constexpr int PIECE = policy::F32_PIECE;
#pragma unroll 1
    for (int piece = 0; piece < KV_SUB / PIECE; ++piece) {
      float s[MMA_Q][PIECE / 8][4];
      const u32_t k_piece = k_sub + piece * PIECE * KTile::ROW_BYTES;
      const u32_t v_piece = v_sub + piece * PIECE * VTile::ROW_BYTES;
      if constexpr (WGMMA) {
        qk_wgmma(c.q_group_base, k_piece, s);
      } else {
        qk_f32(c.frag, k_piece, s);
      }
      float_logits_step(c, k0 + piece * PIECE, v_piece, s, softmax, o, await_v_free_k);
    }
  }
}

}  // namespace prefill
