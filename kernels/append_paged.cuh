// append_paged.cuh — writes the new tokens' K and V rows of a ragged batch into their pages,
// copied (a cache of the rows' dtype) or quantised to fp8 codes.
//
// Request r's n_r = append_indptr[r+1] - append_indptr[r] new tokens are its last n_r
// positions, kv_len[r] - n_r .. kv_len[r] (the page table already covers them). The CTAs of one
// new token are consecutive (BLOCKS_PER_TOKEN of them, usually one), so a thread finds its token
// from its CTA and its part of the token's rows from its thread index, with 32-bit arithmetic.
// One thread handles one 16-byte chunk (8 elements) of one head of that token, K chunks first,
// then V chunks; the host validated the table and checked that no two writes share a slot, so
// threads never race. An fp8 cache receives 8 codes per chunk: each element x of KV head h
// becomes f32_to_fp8(div_rn(x, scale[h])) (fp8.cuh): nearest, ties to even, saturating; a NaN
// element becomes 0x7F and an infinity the largest finite code (the host cannot check device rows
// first). On sm_89 and later the conversion is the hardware's (two elements an instruction, its
// NaN replaced by 0x7F); the software conversion computes the same codes elsewhere.
// Requires: common.cuh, fp8.cuh and the rendered AppendParams.

namespace append {

constexpr int NUM_THREADS = 256;

// The eight elements of a 16-byte chunk of T rows, widened exactly.
template <typename T>
__device__ __forceinline__ void widen8(const uint4& chunk, float (&x)[8]) {
  const u32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = DTypeTraits<T>::to_float(static_cast<u16_t>(words[i] & 0xffffu));
    x[2 * i + 1] = DTypeTraits<T>::to_float(static_cast<u16_t>(words[i] >> 16));
  }
}

// The codes of a and b (f32_to_fp8's), a in the low byte.
template <int FMT>
__device__ __forceinline__ u32_t f32x2_to_fp8x2(float a, float b) {
#if __CUDA_ARCH__ >= 890
  u16_t pair;
  // Round to nearest even, saturating to the largest finite value (infinities included).
  if constexpr (FMT == KV_FP8_E4M3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(b), "f"(a));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(b), "f"(a));
  }
  const u32_t lo = a != a ? 0x7fu : pair & 0xffu;
  const u32_t hi = b != b ? 0x7fu : pair >> 8;
  return lo | (hi << 8);
#else
  return f32_to_fp8<FMT>(a) | (f32_to_fp8<FMT>(b) << 8);
#endif
}

// Eight codes of `x / scale`, code 0 in the low byte of `.x`.
template <int FMT>
__device__ __forceinline__ uint2 quantize8(const float (&x)[8], float scale) {
  u32_t words[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; i += 2)
    words[i / 4] |= f32x2_to_fp8x2<FMT>(div_rn(x[i], scale), div_rn(x[i + 1], scale)) << (8 * (i % 4));
  uint2 r;
  r.x = words[0];
  r.y = words[1];
  return r;
}

// CTAs per new token: enough threads for the chunks of its K and V rows of every KV head (the
// host launches total_new times as many).
__device__ __forceinline__ u32_t blocks_per_token(const AppendParams& p) {
  return (static_cast<u32_t>(p.num_kv_heads * (p.k_chunks + p.v_chunks)) + NUM_THREADS - 1) / NUM_THREADS;
}

__device__ __forceinline__ void run(const AppendParams& p) {
  const u32_t per_token = blocks_per_token(p);
  const int i = static_cast<int>(blockIdx.x / per_token);
  const u32_t part = (blockIdx.x % per_token) * NUM_THREADS + threadIdx.x;
  const u32_t k_part = static_cast<u32_t>(p.num_kv_heads * p.k_chunks);
  if (i >= p.total_new || part >= k_part + static_cast<u32_t>(p.num_kv_heads * p.v_chunks)) return;
  const bool is_k = part < k_part;
  const int row_chunks = is_k ? p.k_chunks : p.v_chunks;
  const u32_t in_rows = is_k ? part : part - k_part;
  const int head = static_cast<int>(in_rows / static_cast<u32_t>(row_chunks));
  const int chunk = static_cast<int>(in_rows % static_cast<u32_t>(row_chunks));
  const int r = request_of(p.append_indptr, p.batch_size, i);
  const int j = p.kv_len[r] - (p.append_indptr[r + 1] - p.append_indptr[r]) + (i - p.append_indptr[r]);
  const int page = p.page_indices[p.page_indptr[r] + (j >> p.page_shift)];
  const int slot = j & p.page_mask;
  const uint4* src = static_cast<const uint4*>(is_k ? p.k_new : p.v_new) +
                     (static_cast<i64_t>(i) * p.num_kv_heads + head) * row_chunks + chunk;
  const i64_t dst = is_k ? page * p.k_page_stride + slot * p.k_token_stride + head * p.k_head_stride
                         : page * p.v_page_stride + slot * p.v_token_stride + head * p.v_head_stride;
  if (p.fp8_format == KV_FP8_NONE) {
    u16_t* base = static_cast<u16_t*>(is_k ? p.k_cache : p.v_cache);
    *reinterpret_cast<uint4*>(base + dst + chunk * 8) = *src;
    return;
  }
  float x[8];
  if (p.new_bf16) {
    widen8<bf16_t>(*src, x);
  } else {
    widen8<f16_t>(*src, x);
  }
  const float scale = (is_k ? p.k_scale : p.v_scale)[head * p.scale_head_stride];
  const uint2 codes = p.fp8_format == KV_FP8_E4M3 ? quantize8<KV_FP8_E4M3>(x, scale) : quantize8<KV_FP8_E5M2>(x, scale);
  unsigned char* base = static_cast<unsigned char*>(is_k ? p.k_cache : p.v_cache);
  *reinterpret_cast<uint2*>(base + dst + chunk * 8) = codes;
}

}  // namespace append
