// merge_state.cuh — combine the per-chunk results of a split KV range into the final output.
//
// When the planner splits each request's keys into chunks of `kv_chunk` keys, every prefill CTA
// writes, per (token, query head), its chunk's normalised output and natural-log LSE (sinks left
// out) into the workspace. One warp per (token, query head) then merges them exactly as
// `merge_state` in the reference does: lse = log(sum_c exp(lse_c)), o = sum_c exp(lse_c - lse) o_c;
// a row whose chunks all saw no key gets o = 0 and lse = -inf. The sink, if any, joins the
// denominator once, here: lse' = log(exp(lse) + exp(sink)), o' = o * exp(lse - lse').
// Requires: common.cuh, merge_math.cuh, the spec constants, the rendered variant (sink_logit)
// and PrefillParams.

namespace merge {

constexpr int WARPS = 4;
constexpr int NUM_THREADS = WARPS * 32;
constexpr int ELEMS = spec::HEAD_DIM_VO / 32;  // output elements per lane
static_assert(spec::HEAD_DIM_VO % 64 == 0, "each lane merges an even number of elements");

// Chunks of a request with kv_len keys; a request without keys still has one (empty) chunk.
__device__ __forceinline__ int chunk_count(int kv_len, int kv_chunk) {
  return kv_len > 0 ? (kv_len + kv_chunk - 1) / kv_chunk : 1;
}

__device__ __forceinline__ void run(const PrefillParams& p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * WARPS + threadIdx.x / 32;  // token * num_qo_heads + head
  if (row >= p.total_qo * p.num_qo_heads) return;
  const int token = row / p.num_qo_heads, head = row - token * p.num_qo_heads;
  const int r = request_of(p.qo_indptr, p.batch_size, token);
  const int chunks = chunk_count(p.kv_indptr[r + 1] - p.kv_indptr[r], p.kv_chunk);
  const i64_t slot0 = static_cast<i64_t>(row) * p.max_chunks;

  // The chunks' LSEs, 32 at a time across the lanes (one load each, all in flight): the max,
  // then each chunk's weight exp(lse_c - max) and their sum.
  const float mx = merge_math::max_lse(chunks, lane, [&](int c) { return p.partial_lse[slot0 + c]; });
  float sum = 0.0f;
  float acc[ELEMS];
#pragma unroll
  for (int e = 0; e < ELEMS; ++e) acc[e] = 0.0f;
  if (mx != neg_inf()) {
    for (int c0 = 0; c0 < chunks; c0 += 32) {
      const int n = min(32, chunks - c0);
      const float w_lane = lane < n ? merge_math::weight(p.partial_lse[slot0 + c0 + lane], mx) : 0.0f;
      sum += warp_sum(w_lane);
      // Each chunk's slice of o, UNROLL chunks per step so that many loads are in flight (a
      // request split into dozens of chunks would otherwise wait for one load per chunk).
      constexpr int UNROLL = 8;
      for (int c = 0; c < n; c += UNROLL) {
        float2 x[UNROLL][ELEMS / 2];
        float w[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          w[u] = __shfl_sync(0xffffffffu, w_lane, min(c + u, 31));
          const float* src = p.partial_o + (slot0 + c0 + min(c + u, n - 1)) * spec::HEAD_DIM_VO + lane * ELEMS;
#pragma unroll
          for (int e = 0; e < ELEMS; e += 2) x[u][e / 2] = *reinterpret_cast<const float2*>(src + e);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          if (c + u < n) {
#pragma unroll
            for (int e = 0; e < ELEMS; e += 2) {
              acc[e] = fmaf(w[u], x[u][e / 2].x, acc[e]);
              acc[e + 1] = fmaf(w[u], x[u][e / 2].y, acc[e + 1]);
            }
          }
        }
      }
    }
  }
  // Natural-log LSE over the keys; the sink (if any) joins the denominator once.
  float lse = merge_math::merged_lse(mx, sum);
  float scale = sum > 0.0f ? 1.0f / sum : 0.0f;
  if constexpr (VARIANT_HAS_SINK) {
    const float sink = sink_logit(p.variant, head);
    const float top = fmaxf(lse, sink);
    const float with_sink = top + log2_approx(exp2_approx((lse - top) * LOG2E) + exp2_approx((sink - top) * LOG2E)) * LN2;
    scale *= exp2_approx((lse - with_sink) * LOG2E);
    lse = with_sink;
  }
  spec::DTypeOut* dst = static_cast<spec::DTypeOut*>(p.o) + token * p.o_stride_token + head * p.o_stride_head + lane * ELEMS;
#pragma unroll
  for (int e = 0; e < ELEMS; e += 2) {
    *reinterpret_cast<u32_t*>(dst + e) = DTypeTraits<spec::DTypeOut>::pack2(acc[e] * scale, acc[e + 1] * scale);
  }
  if (p.lse != nullptr && lane == 0) p.lse[row] = lse;
}

}  // namespace merge
