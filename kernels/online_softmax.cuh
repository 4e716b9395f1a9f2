// online_softmax.cuh — running max (reference) and sum of one warp's rows, in the base-2 domain.
//
// Each thread holds two rows per m16 tile (g and g + 8, g = lane / 4); the four threads of a quad
// share a row. Logits arrive as x with -inf for masked keys; the base-2 logit is x * scale
// (scale > 0 folds sm_scale and LOG2E, or is LOG2E when a transform produced natural logits),
// so one FFMA per element forms the exponent. A row
// that has seen only masked keys keeps max = -inf; its exponent offset is then taken as 0 so no
// inf - inf ever forms: its p are exp2(-inf) = 0 and its sum stays 0.
// The row sums are kept one of two ways (SUM_BY_MMA):
// - false: each thread adds its own columns' p in f32 (one FADD per element), and finish()
//   reduces over the quad;
// - true: the tensor cores add them. The P V product calls accumulate_sums with each k16 block
//   of P as f16 (the A fragment it multiplies V by, for f16 inputs; packed again from the same p
//   for bf16), which multiplies it by a matrix of ones into an m16n8 f32 accumulator whose every
//   column is the row's sum over the whole quad: one mma per m16 tile and 16 keys instead of 16
//   FADDs, and no reduction at the end. The sum is then of the p as rounded to f16: for f16
//   inputs the very weights of the numerator.
// Requires: common.cuh, mma.cuh.

// How far (base 2) a row's max may grow past the reference the p are taken against before the
// reference moves up and o and the sums are rescaled. Rescaling only when the max grows by more
// than 2^8 makes it rare after the first tiles, where it was most tiles' work for some row of a
// warp (the max of random logits keeps growing slowly). Nothing is lost: p and o are relative to
// the same reference, p <= 2^8 stays far inside f16's and bf16's range, and the LSE adds the
// reference back.
constexpr float RESCALE_SLACK = 8.0f;

// EXP_AFTER_RESCALE: whether update() forms the exponents after the rescale branch of a full step
// rather than before it (see update()).
template <int MMA_Q, bool SUM_BY_MMA, bool EXP_AFTER_RESCALE = false>
struct OnlineSoftmax {
  // Base 2, per thread row, identical across a quad: the reference the row's p are taken against,
  // at most RESCALE_SLACK below the row's max so far (-inf until a key is seen).
  float row_max[MMA_Q][2];
  // In the m16n8 accumulator layout: row g in [0] (and [1]), row g + 8 in [2] (and [3]). Without
  // SUM_BY_MMA, [2h] is this thread's partial sum of row h, reduced in finish(), and [2h + 1] is
  // unused; with it, [2h] and [2h + 1] both hold row h's whole sum.
  float row_sum[MMA_Q][4];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
      for (int h = 0; h < 2; ++h) row_max[mq][h] = neg_inf();
#pragma unroll
      for (int e = 0; e < 4; ++e) row_sum[mq][e] = 0.0f;
    }
  }

  // This thread's sum of row (mq, h): partial or whole, as above.
  __device__ __forceinline__ float& sum(int mq, int h) { return row_sum[mq][2 * h]; }

  // With SUM_BY_MMA, adds the rows of one k16 block of P as f16 (`a`: in the A fragment layout of
  // m16 tile mq) to the sums; nothing otherwise.
  __device__ __forceinline__ void accumulate_sums(int mq, const u32_t (&a)[4]) {
    if constexpr (SUM_BY_MMA) {
      mma_f32acc<f16_t>(row_sum[mq], a, DTypeTraits<f16_t>::ONE2, DTypeTraits<f16_t>::ONE2);
    }
  }

  // Turns the logits of one sub-tile (`s`: F32Logits or F16Logits below) into probabilities
  // relative to the rows' references (row_max) and rescales the output accumulators `o` when a
  // reference moves up. Each step runs over all of the thread's rows before
  // the next one (independent chains, the quad shuffles of every row in flight together), and the
  // branches of the rescale come last, so that no row's latency waits behind another row's branch.
  //
  // The references usually stay (RESCALE_SLACK), and whether they do can be seen without the
  // quad: when every thread finds an upper bound of its own logits of each row (thread_bound:
  // its max, or a cheaper bound the logits carry) within the slack above the row's reference,
  // the quad's max is too, and the reference stays. One vote of the warp then stands for the
  // quad reduction, the new references and the rescale factors; the p are the ones the full
  // step would compute (the same offsets), so nothing else changes. Measured on the H200 against
  // the full step every sub-tile (`attnforge bench`): f16 D=128 causal s4096 +2.6%,
  // non-causal +3.6%, soft-cap 50 +7.0% (32/8 s8192 +7.6%), f16 QK +4.3%, f16 QK with soft-cap
  // +9.7%, D=64 +4.2%, D=256 +3.2%, ragged batch +3.8%; bf16 non-causal 32/8 s8192 -1.7% (its
  // wgmma products are serialized by ptxas; not read further).
  // With EXP_AFTER_RESCALE a full step rescales o before the exponents rather than after them:
  // the compiler then has no p of the sub-tile to hold across that branch (prefill.cuh says
  // where it is taken, and why).
  template <typename Logits, int VO_NT>
  __device__ __forceinline__ void update(Logits s, float (&o)[MMA_Q][VO_NT][4], float scale) {
    bool within = true;
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // `&`, not `&&`: every row's bound is taken (no branch), so the full step below reuses it.
        within = within & (s.thread_bound(mq, h) * scale <= row_max[mq][h] + RESCALE_SLACK);
      }
    const bool kept = __all_sync(0xffffffffu, within);
    float offset[MMA_Q][2], rescale[MMA_Q][2];
    if (kept) {
#pragma unroll
      for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // -inf only for a row that has seen no key yet and sees none here (its bound is -inf).
          offset[mq][h] = row_max[mq][h] == neg_inf() ? 0.0f : row_max[mq][h];
          rescale[mq][h] = 1.0f;
        }
    } else {
      // This thread's max of each row over its columns.
      float raw[MMA_Q][2];
#pragma unroll
      for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) raw[mq][h] = s.thread_row_max(mq, h);
      // The quad's max (the four threads of a row), one shuffle level for every row at a time.
#pragma unroll
      for (int m = 1; m <= 2; m *= 2)
#pragma unroll
        for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
          for (int h = 0; h < 2; ++h) raw[mq][h] = fmaxf(raw[mq][h], __shfl_xor_sync(0xffffffffu, raw[mq][h], m));
#pragma unroll
      for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // The new max, unless it exceeds the reference by at most RESCALE_SLACK (then the
          // reference stays, and this sub-tile's p may reach 2^RESCALE_SLACK). -inf + slack is
          // -inf, so the first finite max always becomes the reference.
          const float seen = fmaxf(row_max[mq][h], raw[mq][h] * scale);
          const float mx = seen <= row_max[mq][h] + RESCALE_SLACK ? row_max[mq][h] : seen;
          offset[mq][h] = mx == neg_inf() ? 0.0f : mx;
          rescale[mq][h] = exp2_approx(row_max[mq][h] - offset[mq][h]);
          row_max[mq][h] = mx;
        }
    }
    if constexpr (EXP_AFTER_RESCALE) {
      if (!kept) rescale_outputs(rescale, o);
    }
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (SUM_BY_MMA) {
          s.template exp_row<false>(mq, h, scale, offset[mq][h]);
        } else {
          sum(mq, h) = sum(mq, h) * rescale[mq][h] + s.template exp_row<true>(mq, h, scale, offset[mq][h]);
        }
      }
    if constexpr (!EXP_AFTER_RESCALE) {
      if (!kept) rescale_outputs(rescale, o);
    }
  }

  // After a full step: multiplies o (and with SUM_BY_MMA the sums, before P V adds this
  // sub-tile's) by each row's rescale factor. The rescale is 1 for every row whose reference did
  // not move: the multiplies are skipped when that holds for all of the warp's rows (one uniform
  // branch). A row whose rescale is 1 is multiplied by 1 when another row's is not.
  template <int VO_NT>
  __device__ __forceinline__ void rescale_outputs(const float (&rescale)[MMA_Q][2], float (&o)[MMA_Q][VO_NT][4]) {
    bool moved = false;
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) moved = moved || rescale[mq][h] != 1.0f;
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (SUM_BY_MMA) {
            row_sum[mq][2 * h] *= rescale[mq][h];
            row_sum[mq][2 * h + 1] *= rescale[mq][h];
          }
#pragma unroll
          for (int dt = 0; dt < VO_NT; ++dt) {
            o[mq][dt][2 * h] *= rescale[mq][h];
            o[mq][dt][2 * h + 1] *= rescale[mq][h];
          }
        }
    }
  }

  // Reduces the sums over the quad, normalises o and returns the natural-log LSE per row
  // (-inf for a row that saw no key; then o stays 0). With WITH_SINK, each row's sink logit
  // (base 2) joins the denominator only, once per row (after the quad reduction).
  template <bool WITH_SINK, int VO_NT>
  __device__ __forceinline__ void finish(float (&o)[MMA_Q][VO_NT][4], const float (&sink_log2)[MMA_Q][2],
                                         float (&lse)[MMA_Q][2]) {
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float sum = SUM_BY_MMA ? row_sum[mq][2 * h] : warp_sum_quad(row_sum[mq][2 * h]);
        float mx = row_max[mq][h];
        float scale = 1.0f;
        if constexpr (WITH_SINK) {
          float with_sink = fmaxf(mx, sink_log2[mq][h]);
          scale = exp2_approx(mx - with_sink);
          sum = sum * scale + exp2_approx(sink_log2[mq][h] - with_sink);
          mx = with_sink;
        }
        // sum >= 1 for a row that saw a key (its largest logit contributes exp2(0), or the sink
        // does), so the approximate reciprocal (within 1 ulp) needs no range handling.
        float inv = sum > 0.0f ? scale * rcp_approx(sum) : 0.0f;
        lse[mq][h] = sum > 0.0f ? (mx + log2_approx(sum)) * LN2 : neg_inf();
#pragma unroll
        for (int dt = 0; dt < VO_NT; ++dt) {
          o[mq][dt][2 * h] *= inv;
          o[mq][dt][2 * h + 1] *= inv;
        }
      }
    }
  }
};

// The logits of one sub-tile as OnlineSoftmax::update takes them, in the m16n8 accumulator
// layout (row g of a thread's pair h = 0, row g + 8 for h = 1), and the probabilities it leaves
// in their place. Five operations: thread_row_max (this thread's max of row (mq, h) over its
// columns), thread_bound (an upper bound of the same, scaled as the max is: here the max itself,
// which the update's two uses share), exp_row (p = exp2(x * scale - offset) for the row's elements, replacing them, and
// with WITH_SUM their sum, else 0), p_pair (the row's two probabilities of n8 tile nt as packed
// `P` input of the PV product) and sum_pair (the same two as f16, for the row sums by mma).

// This thread's max of row (mq, h) of float logits in the m16n8 accumulator layout. Started from
// the first pair rather than -inf: one FMNMX fewer per row, same max (fmaxf drops a NaN operand,
// and the fmaxf with the running max absorbs an all-NaN row as -inf would).
template <int MMA_Q, int KV_NT>
__device__ __forceinline__ float thread_row_max_f32(const float (&s)[MMA_Q][KV_NT][4], int mq, int h) {
  float raw = fmaxf(s[mq][0][2 * h], s[mq][0][2 * h + 1]);
#pragma unroll
  for (int nt = 1; nt < KV_NT; ++nt) raw = fmaxf(raw, fmaxf(s[mq][nt][2 * h], s[mq][nt][2 * h + 1]));
  return raw;
}

// f32 logits (any QK accumulation, after the transform and the mask): p is kept as float
// until p_pair rounds it to the input dtype.
template <int MMA_Q, int KV_NT, typename P>
struct F32Logits {
  float (&s)[MMA_Q][KV_NT][4];

  __device__ __forceinline__ float thread_row_max(int mq, int h) const { return thread_row_max_f32(s, mq, h); }
  __device__ __forceinline__ float thread_bound(int mq, int h) const { return thread_row_max(mq, h); }
  template <bool WITH_SUM>
  __device__ __forceinline__ float exp_row(int mq, int h, float scale, float offset) const {
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < KV_NT; ++nt) {
      s[mq][nt][2 * h] = exp2_approx(fmaf(s[mq][nt][2 * h], scale, -offset));
      s[mq][nt][2 * h + 1] = exp2_approx(fmaf(s[mq][nt][2 * h + 1], scale, -offset));
      if constexpr (WITH_SUM) sum += s[mq][nt][2 * h] + s[mq][nt][2 * h + 1];
    }
    return sum;
  }
  __device__ __forceinline__ u32_t p_pair(int mq, int nt, int h) const {
    return DTypeTraits<P>::pack2(s[mq][nt][2 * h], s[mq][nt][2 * h + 1]);
  }
  // The same pair as f16 for the row sums (for f16 P the same conversion as p_pair's, merged).
  __device__ __forceinline__ u32_t sum_pair(int mq, int nt, int h) const {
    return DTypeTraits<f16_t>::pack2(s[mq][nt][2 * h], s[mq][nt][2 * h + 1]);
  }
};

// f16 accumulators taken as they are (one f16x2 register per row and n8 tile), for logits that
// need no transform and no mask and are all finite: the max is taken on the packed halves (exact:
// widening is monotonic), each element is widened (exactly) just before its exponent, and p
// replaces it already packed: the logits take half the registers of F32Logits, and no float copy
// of the whole sub-tile needs to be live. Same values as F32Logits of the widened accumulators.
template <int MMA_Q, int KV_NT>
struct F16Logits {
  u32_t (&acc)[MMA_Q][KV_NT][2];

  __device__ __forceinline__ float thread_row_max(int mq, int h) const {
    u32_t m2 = acc[mq][0][h];
#pragma unroll
    for (int nt = 1; nt < KV_NT; ++nt) m2 = f16x2_max(m2, acc[mq][nt][h]);
    float lo, hi;
    f16x2_to_float2(m2, lo, hi);
    return fmaxf(lo, hi);
  }
  __device__ __forceinline__ float thread_bound(int mq, int h) const { return thread_row_max(mq, h); }
  template <bool WITH_SUM>
  __device__ __forceinline__ float exp_row(int mq, int h, float scale, float offset) const {
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < KV_NT; ++nt) {
      float x0, x1;
      f16x2_to_float2(acc[mq][nt][h], x0, x1);
      const float p0 = exp2_approx(fmaf(x0, scale, -offset));
      const float p1 = exp2_approx(fmaf(x1, scale, -offset));
      if constexpr (WITH_SUM) sum += p0 + p1;
      acc[mq][nt][h] = DTypeTraits<f16_t>::pack2(p0, p1);
    }
    return sum;
  }
  __device__ __forceinline__ u32_t p_pair(int mq, int nt, int h) const { return acc[mq][nt][h]; }
  __device__ __forceinline__ u32_t sum_pair(int mq, int nt, int h) const { return acc[mq][nt][h]; }
};

// Combines the states of NUM_WARPS warps that ran the same rows over different keys (the
// key-split layout): warps 1.. write (max, partial sum, o) to `scratch`, and warp 0 folds them into
// its own state, each scaled by exp2(max_w - max); a warp that saw no key (max -inf) weighs 0.
// Returns true in warp 0, which then holds the state of all keys; the other warps are done. Must
// be reached by every thread of the CTA; `scratch` (shared memory, free for this use) holds
// (NUM_WARPS - 1) * merge_scratch_floats<MMA_Q, VO_NT>() floats.
template <int MMA_Q, int VO_NT>
__host__ __device__ constexpr int merge_scratch_floats() {
  return 32 * MMA_Q * (4 + 4 * VO_NT);
}

template <int NUM_WARPS, int MMA_Q, int VO_NT, bool SUM_BY_MMA, bool EXP_AFTER_RESCALE>
__device__ __forceinline__ bool merge_warp_states(OnlineSoftmax<MMA_Q, SUM_BY_MMA, EXP_AFTER_RESCALE>& sm,
                                                  float (&o)[MMA_Q][VO_NT][4], float* scratch, int warp, int lane) {
  // Value i of a warp's state sits at scratch[(warp - 1) * STATE + i * 32 + lane]: lane-major, so
  // each access of a warp touches 32 consecutive words (no bank conflicts).
  constexpr int STATE = merge_scratch_floats<MMA_Q, VO_NT>();
  auto slot = [&](int w, int i) -> float& { return scratch[(w - 1) * STATE + i * 32 + lane]; };
  __syncthreads();  // every warp is done with the shared memory `scratch` reuses
  if (warp > 0) {
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        slot(warp, (mq * 2 + h) * 2) = sm.row_max[mq][h];
        slot(warp, (mq * 2 + h) * 2 + 1) = sm.sum(mq, h);
#pragma unroll
        for (int dt = 0; dt < VO_NT; ++dt) {
          slot(warp, 4 * MMA_Q + (mq * VO_NT + dt) * 4 + 2 * h) = o[mq][dt][2 * h];
          slot(warp, 4 * MMA_Q + (mq * VO_NT + dt) * 4 + 2 * h + 1) = o[mq][dt][2 * h + 1];
        }
      }
  }
  __syncthreads();
  if (warp > 0) return false;
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = sm.row_max[mq][h];
#pragma unroll
      for (int w = 1; w < NUM_WARPS; ++w) mx = fmaxf(mx, slot(w, (mq * 2 + h) * 2));
      const float offset = mx == neg_inf() ? 0.0f : mx;
      const float own = exp2_approx(sm.row_max[mq][h] - offset);
      sm.row_max[mq][h] = mx;
      sm.sum(mq, h) *= own;
#pragma unroll
      for (int dt = 0; dt < VO_NT; ++dt) {
        o[mq][dt][2 * h] *= own;
        o[mq][dt][2 * h + 1] *= own;
      }
#pragma unroll
      for (int w = 1; w < NUM_WARPS; ++w) {
        const float f = exp2_approx(slot(w, (mq * 2 + h) * 2) - offset);
        sm.sum(mq, h) = fmaf(f, slot(w, (mq * 2 + h) * 2 + 1), sm.sum(mq, h));
#pragma unroll
        for (int dt = 0; dt < VO_NT; ++dt) {
          o[mq][dt][2 * h] = fmaf(f, slot(w, 4 * MMA_Q + (mq * VO_NT + dt) * 4 + 2 * h), o[mq][dt][2 * h]);
          o[mq][dt][2 * h + 1] = fmaf(f, slot(w, 4 * MMA_Q + (mq * VO_NT + dt) * 4 + 2 * h + 1), o[mq][dt][2 * h + 1]);
        }
      }
    }
  return true;
}
