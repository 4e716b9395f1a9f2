// append_paged.cuh — writes the new tokens' K and V rows of a ragged batch into their pages,
// copied (a cache of the rows' dtype) or quantised to fp8 codes.
//
// Request r's n_r = append_indptr[r+1] - append_indptr[r] new tokens are its last n_r
// positions, kv_len[r] - n_r .. kv_len[r] (the page table already covers them). The threads of
// a token share out its 16-byte chunks (8 elements) of its K rows, then of its V rows, every KV
// head, with 32-bit arithmetic: one chunk a thread in the narrow launch (the CTAs of a token are
// consecutive), or, with p.wide, 64 threads a token, each loading several of its chunks before
// it writes any (the host takes the wide launch for batches with enough tokens to fill the GPU
// so: cuda/append.rs). The host validated the table and checked that no two writes share a
// slot, so threads never race. An fp8 cache receives 8 codes per chunk: each element x of KV
// head h becomes f32_to_fp8(div_rn(x, scale[h])) (fp8.cuh): nearest, ties to even, saturating; a
// NaN element becomes 0x7F and an infinity the largest finite code (the host cannot check device
// rows first). On sm_89 and later the conversion is the hardware's (two elements an
// instruction; a chunk with a NaN quotient is converted again with each NaN code replaced by
// 0x7F); the software conversion computes the same codes elsewhere.
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
  float q[8];
  bool any_nan = false;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    q[i] = div_rn(x[i], scale);
    any_nan = any_nan || q[i] != q[i];
  }
  u32_t words[2] = {0u, 0u};
#if __CUDA_ARCH__ >= 890
  // The hardware's pairs as they are; only a chunk with a NaN needs its NaN codes replaced.
  if (!any_nan) {
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      u16_t pair;
      if constexpr (FMT == KV_FP8_E4M3) {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(q[i + 1]), "f"(q[i]));
      } else {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(q[i + 1]), "f"(q[i]));
      }
      words[i / 4] |= static_cast<u32_t>(pair) << (8 * (i % 4));
    }
    uint2 r;
    r.x = words[0];
    r.y = words[1];
    return r;
  }
#endif
#pragma unroll
  for (int i = 0; i < 8; i += 2)
    words[i / 4] |= f32x2_to_fp8x2<FMT>(q[i], q[i + 1]) << (8 * (i % 4));
  uint2 r;
  r.x = words[0];
  r.y = words[1];
  return r;
}

// The wide launch (p.wide): WIDE_TOKEN_THREADS threads a new token, which take every
// WIDE_TOKEN_THREADS-th chunk of its K and V rows (all KV heads, K first), so a warp's copies of
// one step are consecutive chunks and the token's request, page and slot are found once for all
// of a thread's chunks; a thread loads up to CHUNKS_IN_FLIGHT chunks before it writes any. The
// narrow launch: one chunk a thread, blocks_per_token CTAs a token.
constexpr int WIDE_TOKEN_THREADS = 64;
// Two rather than four: the fewer registers let six CTAs share an SM (APPEND_MIN_BLOCKS_PER_SM in
// src/codegen/fixed.rs says what that measured).
constexpr int CHUNKS_IN_FLIGHT = 2;

// Chunk `c` of a token's rows (K chunks first, then V) into its slot, from the loaded chunk `x`
// of the new rows: copied, or quantised to fp8 codes.
__device__ __forceinline__ void store_chunk(const AppendParams& p, int c, const uint4& x, int page, int slot) {
  const int k_part = p.num_kv_heads * p.k_chunks;
  const bool is_k = c < k_part;
  const int row_chunks = is_k ? p.k_chunks : p.v_chunks;
  const u32_t in_rows = static_cast<u32_t>(is_k ? c : c - k_part);
  const int head = static_cast<int>(in_rows / static_cast<u32_t>(row_chunks));
  const int chunk = static_cast<int>(in_rows % static_cast<u32_t>(row_chunks));
  const i64_t dst = is_k ? page * p.k_page_stride + slot * p.k_token_stride + head * p.k_head_stride
                         : page * p.v_page_stride + slot * p.v_token_stride + head * p.v_head_stride;
  if (p.fp8_format == KV_FP8_NONE) {
    u16_t* base = static_cast<u16_t*>(is_k ? p.k_cache : p.v_cache);
    *reinterpret_cast<uint4*>(base + dst + chunk * 8) = x;
    return;
  }
  float v[8];
  if (p.new_bf16) {
    widen8<bf16_t>(x, v);
  } else {
    widen8<f16_t>(x, v);
  }
  const float scale = (is_k ? p.k_scale : p.v_scale)[head * p.scale_head_stride];
  const uint2 codes = p.fp8_format == KV_FP8_E4M3 ? quantize8<KV_FP8_E4M3>(v, scale) : quantize8<KV_FP8_E5M2>(v, scale);
  unsigned char* base = static_cast<unsigned char*>(is_k ? p.k_cache : p.v_cache);
  *reinterpret_cast<uint2*>(base + dst + chunk * 8) = codes;
}

// The token's slot: its request's page id and the slot in the page.
__device__ __forceinline__ void token_slot(const AppendParams& p, int i, int& page, int& slot) {
  const int r = request_of(p.append_indptr, p.batch_size, i);
  const int j = p.kv_len[r] - (p.append_indptr[r + 1] - p.append_indptr[r]) + (i - p.append_indptr[r]);
  page = p.page_indices[p.page_indptr[r] + (j >> p.page_shift)];
  slot = j & p.page_mask;
}

// CTAs per new token in the narrow launch: enough threads for the chunks of its K and V rows of
// every KV head (the host launches total_new times as many).
__device__ __forceinline__ u32_t blocks_per_token(const AppendParams& p) {
  return (static_cast<u32_t>(p.token_chunks) + NUM_THREADS - 1) / NUM_THREADS;
}

__device__ __forceinline__ void run_narrow(const AppendParams& p) {
  const u32_t per_token = blocks_per_token(p);
  const int i = static_cast<int>(blockIdx.x / per_token);
  const int c = static_cast<int>((blockIdx.x % per_token) * NUM_THREADS + threadIdx.x);
  if (i >= p.total_new || c >= p.token_chunks) return;
  const int k_part = p.num_kv_heads * p.k_chunks;
  // Loaded before the slot lookup (a chain of dependent reads) needs it.
  const uint4 x = __ldg(c < k_part ? static_cast<const uint4*>(p.k_new) + static_cast<i64_t>(i) * k_part + c
                                   : static_cast<const uint4*>(p.v_new) +
                                         static_cast<i64_t>(i) * (p.token_chunks - k_part) + (c - k_part));
  int page, slot;
  token_slot(p, i, page, slot);
  store_chunk(p, c, x, page, slot);
}

__device__ __forceinline__ void run_wide(const AppendParams& p) {
  constexpr int T = WIDE_TOKEN_THREADS;
  static_assert(NUM_THREADS % T == 0, "a CTA holds whole tokens");
  const int i = static_cast<int>((blockIdx.x * NUM_THREADS + threadIdx.x) / T);
  if (i >= p.total_new) return;
  // The token's new rows, [heads, chunks] each: chunk c of its K rows, or c - k_part of its V.
  const int k_part = p.num_kv_heads * p.k_chunks, all = p.token_chunks;
  const uint4* k_src = static_cast<const uint4*>(p.k_new) + static_cast<i64_t>(i) * k_part;
  const uint4* v_src = static_cast<const uint4*>(p.v_new) + static_cast<i64_t>(i) * (all - k_part);
  const int first = static_cast<int>(threadIdx.x) % T;
  uint4 x[CHUNKS_IN_FLIGHT];
  auto load = [&](int c0) {
#pragma unroll
    for (int n = 0; n < CHUNKS_IN_FLIGHT; ++n) {
      const int c = c0 + n * T;
      if (c < all) x[n] = __ldg(c < k_part ? k_src + c : v_src + (c - k_part));
    }
  };
  // The first chunks load while the token's slot is looked up.
  load(first);
  int page, slot;
  token_slot(p, i, page, slot);
  for (int c0 = first; c0 < all; c0 += CHUNKS_IN_FLIGHT * T) {
    if (c0 != first) load(c0);
#pragma unroll
    for (int n = 0; n < CHUNKS_IN_FLIGHT; ++n) {
      const int c = c0 + n * T;
      if (c < all) store_chunk(p, c, x[n], page, slot);
    }
  }
}

__device__ __forceinline__ void run(const AppendParams& p) {
  if (p.wide) {
    run_wide(p);
  } else {
    run_narrow(p);
  }
}

}  // namespace append
