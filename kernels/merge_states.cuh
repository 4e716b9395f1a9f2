// merge_states.cuh — the public merge: n partial states of each (row, head) into one, for
// shared-prefix (cascade) attention and for callers that split a KV range themselves.
//
// State c of (row, head) has its o (head_dim elements, contiguous) at
//   (c == 0 ? v0 : v1 + (c - 1) * v_stride_state) + row * v_stride_row + head * v_stride_head
// and its LSE likewise from s0 / s1. The n-way form (one tensor [rows, n, heads, D]) passes
// v1 = v0 + v_stride_state; the pair form passes two tensors as v0 and v1. The merge itself is
// merge_math's. One warp per (row, head); each lane takes element pairs, 64 elements per step.
// The element type is a runtime value (the branch is uniform): o in and out share it, LSEs are
// f32. Inputs are not checked for NaN here (the host cannot see device data); a NaN LSE or o
// gives a NaN result.
// Requires: common.cuh, merge_math.cuh and the rendered MergeParams.

namespace merge_states {

constexpr int WARPS = 4;
constexpr int NUM_THREADS = WARPS * 32;
constexpr int DTYPE_F16 = 0, DTYPE_BF16 = 1, DTYPE_F32 = 2;

// Elements e, e + 1 of the row at `base` (element offset `at`), widened to float.
__device__ __forceinline__ float2 load_pair(const void* base, i64_t at, int dtype) {
  if (dtype == DTYPE_F32) return *reinterpret_cast<const float2*>(static_cast<const float*>(base) + at);
  const u32_t x = *reinterpret_cast<const u32_t*>(static_cast<const u16_t*>(base) + at);
  const u16_t lo = static_cast<u16_t>(x & 0xffffu), hi = static_cast<u16_t>(x >> 16);
  if (dtype == DTYPE_BF16) return make_float2(DTypeTraits<bf16_t>::to_float(lo), DTypeTraits<bf16_t>::to_float(hi));
  return make_float2(DTypeTraits<f16_t>::to_float(lo), DTypeTraits<f16_t>::to_float(hi));
}

__device__ __forceinline__ void store_pair(void* base, i64_t at, int dtype, float lo, float hi) {
  if (dtype == DTYPE_F32) {
    *reinterpret_cast<float2*>(static_cast<float*>(base) + at) = make_float2(lo, hi);
  } else {
    const u32_t x = dtype == DTYPE_BF16 ? DTypeTraits<bf16_t>::pack2(lo, hi) : DTypeTraits<f16_t>::pack2(lo, hi);
    *reinterpret_cast<u32_t*>(static_cast<u16_t*>(base) + at) = x;
  }
}

__device__ __forceinline__ void run(const MergeParams& p) {
  const int lane = threadIdx.x % 32;
  const i64_t item = static_cast<i64_t>(blockIdx.x) * WARPS + threadIdx.x / 32;  // row * heads + head
  if (item >= static_cast<i64_t>(p.rows) * p.heads) return;
  const i64_t row = item / p.heads;
  const int head = static_cast<int>(item - row * p.heads);
  const i64_t s_at = row * p.s_stride_row + head * p.s_stride_head;
  const i64_t v_at = row * p.v_stride_row + head * p.v_stride_head;
  auto lse_at = [&](int c) { return c == 0 ? p.s0[s_at] : p.s1[(c - 1) * p.s_stride_state + s_at]; };
  auto o_at = [&](int c) { return c == 0 ? v_at : (c - 1) * p.v_stride_state + v_at; };

  const float mx = merge_math::max_lse(p.num_states, lane, lse_at);
  float sum = 0.0f;
  if (mx != neg_inf()) {
    for (int c0 = 0; c0 < p.num_states; c0 += 32) {
      sum += warp_sum(c0 + lane < p.num_states ? merge_math::weight(lse_at(c0 + lane), mx) : 0.0f);
    }
  }
  const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
  const i64_t out_at = row * p.out_stride_row + head * p.out_stride_head;
  for (int e = 2 * lane; e < p.head_dim; e += 64) {
    float lo = 0.0f, hi = 0.0f;
    if (sum > 0.0f) {
#pragma unroll 4
      for (int c = 0; c < p.num_states; ++c) {
        const float w = merge_math::weight(lse_at(c), mx);
        if (w != 0.0f) {  // a state that saw no key adds nothing, whatever its o holds
          const float2 x = load_pair(c == 0 ? p.v0 : p.v1, o_at(c) + e, p.dtype);
          lo = fmaf(w, x.x, lo);
          hi = fmaf(w, x.y, hi);
        }
      }
    }
    store_pair(p.v_out, out_at + e, p.dtype, lo * inv_sum, hi * inv_sum);
  }
  if (lane == 0) p.s_out[row * p.s_out_stride_row + head] = merge_math::merged_lse(mx, sum);
}

}  // namespace merge_states
