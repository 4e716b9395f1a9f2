// reference.cuh — the GPU reference: plain f32 attention, one warp per (query token, query head).
//
// Slow on purpose and written to be read against docs/semantics.md: for each key of the row's
// request the logit is a dot product (lanes split the head dim: lane l holds elements l, l + 32,
// ..), then the same variant hooks and mask predicate as the fast kernels (variant.cuh,
// mask.cuh), then a two-pass softmax with accurate expf/logf: pass 1 finds the largest visible
// logit (the sink included), pass 2 recomputes every logit, sums exp(t - max) and accumulates
// P·V in f32. The sink joins the denominator once; a row with no visible key gives o = 0 and
// lse = -inf (with a sink: lse = sink). The output is f32 whatever the input dtype, the LSE is
// natural-log. K and V are ragged views (a paged cache is gathered on the host first).
//
// QK accumulation, as docs/semantics.md defines it:
// - f32: s = sm_scale * dot(q, k), the dot product in f32 (fmaf per lane, then warp_sum).
// - f16: q' = round_f16(q * prescale); each 16-wide chunk of q'·k is summed in f64 (a product of
//   two f16 values is exact in f64, and so is the sum of 16 of them unless their magnitudes span
//   more than 53 bits), added to the f16 accumulator and rounded to f16 once (cvt.rn.f16.f64);
//   s = f32(acc) * post_scale. If the accumulator overflows (rounds to inf), the logit is
//   s = sm_scale * dot(q, k) with f32 accumulation.
// Requires: common.cuh, the spec constants (namespace spec: DTypeIn, HEAD_DIM_QK, HEAD_DIM_VO,
// QK_F16_ACCUM, MASK_KIND), the rendered variant, the rendered PrefillParams, mask.cuh and
// variant.cuh. Of PrefillParams it reads q, k, v, o (f32), lse, qo_indptr, kv_indptr,
// custom_mask, mask_indptr, the q/k/v/o strides, num_qo_heads, group_size, window_left,
// q_prescale, post_scale, total_qo and batch_size.

namespace reference {

using DTypeIn = spec::DTypeIn;
constexpr int NUM_WARPS = 4;
constexpr int NUM_THREADS = NUM_WARPS * 32;
constexpr int QK_PER_LANE = spec::HEAD_DIM_QK / 32;
constexpr int VO_PER_LANE = spec::HEAD_DIM_VO / 32;
constexpr int F16_CHUNK = 16;  // elements summed exactly before each f16 rounding
static_assert(spec::HEAD_DIM_QK % 32 == 0 && spec::HEAD_DIM_VO % 32 == 0, "lanes split the head dims evenly");
static_assert(!spec::QK_F16_ACCUM || !DTypeTraits<DTypeIn>::IS_BF16, "f16 QK accumulation needs f16 inputs");

// Rounds x to the nearest f16 (ties to even), widened back to f32 (inf when |x| >= 65520).
__device__ __forceinline__ float round_f16(double x) {
  u16_t h;
  asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(x));
  return DTypeTraits<f16_t>::to_float(h);
}
__device__ __forceinline__ float round_f16(float x) {
  u16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return DTypeTraits<f16_t>::to_float(h);
}

// This lane's elements of one row: row[lane + 32 i], widened to f32.
template <int N>
__device__ __forceinline__ void load_row(const DTypeIn* row, int lane, float (&out)[N]) {
  const u16_t* bits = reinterpret_cast<const u16_t*>(row);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = DTypeTraits<DTypeIn>::to_float(bits[lane + 32 * i]);
}

// sm_scale * dot(q, k) with f32 accumulation (every lane gets it).
__device__ __forceinline__ float dot_f32(const float (&q)[QK_PER_LANE], const float (&k)[QK_PER_LANE],
                                         float sm_scale) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < QK_PER_LANE; ++i) acc = fmaf(q[i], k[i], acc);
  return __fmul_rn(warp_sum(acc), sm_scale);
}

// The f16-accumulated logit (every lane gets it); q_pre is round_f16(q * prescale). Element
// lane + 32 i lies in chunk 2 i + lane / 16: each half-warp sums one chunk per i.
__device__ __forceinline__ float dot_f16(const float (&q)[QK_PER_LANE], const float (&q_pre)[QK_PER_LANE],
                                         const float (&k)[QK_PER_LANE], float prescale, float post_scale) {
  double chunk[QK_PER_LANE];
#pragma unroll
  for (int i = 0; i < QK_PER_LANE; ++i) {
    double x = static_cast<double>(q_pre[i]) * static_cast<double>(k[i]);  // exact
#pragma unroll
    for (int m = F16_CHUNK / 2; m > 0; m /= 2) x += __shfl_xor_sync(0xffffffffu, x, m);
    chunk[i] = x;
  }
  float acc = 0.0f;
  bool overflow = false;
#pragma unroll
  for (int c = 0; c < spec::HEAD_DIM_QK / F16_CHUNK; ++c) {
    const double sum = __shfl_sync(0xffffffffu, chunk[c / 2], (c % 2) * F16_CHUNK);
    acc = round_f16(static_cast<double>(acc) + sum);
    overflow = overflow || !isfinite(acc);
  }
  if (overflow) return dot_f32(q, k, __fmul_rn(prescale, post_scale));
  return __fmul_rn(acc, post_scale);
}

// The transformed logit t of (q, key kv_idx), or -inf when the key is hidden (the problem's mask
// or the variant's own).
__device__ __forceinline__ float logit(const PrefillParams& p, const RequestMaskContext& m, const DTypeIn* k_row0,
                                       const float (&q)[QK_PER_LANE], const float (&q_pre)[QK_PER_LANE], int qo_idx,
                                       int kv_idx, int qo_head, int kv_head, int lane) {
  const bool visible = mask_visible<spec::MASK_KIND>(m, qo_idx, kv_idx) &&
                       variant_visible(p.variant, qo_idx, kv_idx, qo_head, kv_head, m.qo_len, m.kv_len);
  if (!visible) return neg_inf();  // uniform: every lane of the warp has the same row and key
  float k[QK_PER_LANE];
  load_row(k_row0 + static_cast<i64_t>(kv_idx) * p.k_stride_token, lane, k);
  float s;
  if constexpr (spec::QK_F16_ACCUM) {
    s = dot_f16(q, q_pre, k, p.q_prescale, p.post_scale);
  } else {
    s = dot_f32(q, k, p.post_scale);
  }
  return variant_transform(p.variant, s, qo_idx, kv_idx, qo_head, kv_head, m.qo_len, m.kv_len);
}

// One warp: row (token, qo_head) = global warp index.
__device__ __forceinline__ void run(const PrefillParams& p) {
  const int lane = threadIdx.x % 32;
  const i64_t row = static_cast<i64_t>(blockIdx.x) * NUM_WARPS + threadIdx.x / 32;
  if (row >= static_cast<i64_t>(p.total_qo) * p.num_qo_heads) return;  // uniform per warp
  const int token = static_cast<int>(row / p.num_qo_heads);
  const int qo_head = static_cast<int>(row % p.num_qo_heads);
  const int kv_head = qo_head / p.group_size;
  const int request = request_of(p.qo_indptr, p.batch_size, token);
  const int qo_start = p.qo_indptr[request], kv_start = p.kv_indptr[request];
  RequestMaskContext m;
  m.qo_len = p.qo_indptr[request + 1] - qo_start;
  m.kv_len = p.kv_indptr[request + 1] - kv_start;
  m.window_left = p.window_left;
  m.custom_bits = spec::MASK_KIND == MASK_CUSTOM ? p.custom_mask + p.mask_indptr[request] : nullptr;
  const int qo_idx = token - qo_start;

  float q[QK_PER_LANE], q_pre[QK_PER_LANE];
  load_row(static_cast<const DTypeIn*>(p.q) + token * p.q_stride_token + qo_head * p.q_stride_head, lane, q);
#pragma unroll
  for (int i = 0; i < QK_PER_LANE; ++i) q_pre[i] = spec::QK_F16_ACCUM ? round_f16(q[i] * p.q_prescale) : q[i];
  const DTypeIn* k_row0 =
      static_cast<const DTypeIn*>(p.k) + static_cast<i64_t>(kv_start) * p.k_stride_token + kv_head * p.k_stride_head;
  const DTypeIn* v_row0 =
      static_cast<const DTypeIn*>(p.v) + static_cast<i64_t>(kv_start) * p.v_stride_token + kv_head * p.v_stride_head;

  // Pass 1: the largest logit, the sink included.
  const float sink = VARIANT_HAS_SINK ? sink_logit(p.variant, qo_head) : neg_inf();
  float max = sink;
  for (int j = 0; j < m.kv_len; ++j) max = fmaxf(max, logit(p, m, k_row0, q, q_pre, qo_idx, j, qo_head, kv_head, lane));

  // Pass 2: exp(t - max) of every key into the denominator and P·V.
  float o[VO_PER_LANE];
#pragma unroll
  for (int i = 0; i < VO_PER_LANE; ++i) o[i] = 0.0f;
  float lse = neg_inf();
  if (max != neg_inf()) {
    float denominator = VARIANT_HAS_SINK ? expf(sink - max) : 0.0f;
    for (int j = 0; j < m.kv_len; ++j) {
      const float t = logit(p, m, k_row0, q, q_pre, qo_idx, j, qo_head, kv_head, lane);
      if (t == neg_inf()) continue;  // hidden (uniform per warp)
      const float e = expf(t - max);
      denominator += e;
      float v[VO_PER_LANE];
      load_row(v_row0 + static_cast<i64_t>(j) * p.v_stride_token, lane, v);
#pragma unroll
      for (int i = 0; i < VO_PER_LANE; ++i) o[i] = fmaf(e, v[i], o[i]);
    }
#pragma unroll
    for (int i = 0; i < VO_PER_LANE; ++i) o[i] /= denominator;
    lse = max + logf(denominator);
  }
  float* out = static_cast<float*>(p.o) + token * p.o_stride_token + qo_head * p.o_stride_head;
#pragma unroll
  for (int i = 0; i < VO_PER_LANE; ++i) out[lane + 32 * i] = o[i];
  if (lane == 0) p.lse[row] = lse;
}

}  // namespace reference
