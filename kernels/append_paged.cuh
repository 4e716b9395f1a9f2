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
// head h becomes the code of div.rn.f32(x, scale[h]): nearest, ties to even, saturating; a NaN
// element becomes 0x7F and an infinity the largest finite code (the host cannot check device
// rows first). quantize8 computes those codes with one reciprocal a chunk (two fused
// multiply-adds an element, no division); on sm_89 and later the conversion is the hardware's
// (two elements an instruction), elsewhere fp8.cuh's f32_to_fp8. The kernel is one entry with a
// path for each cache format and new rows' dtype, chosen once a thread.
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

// Whether any of the eight codes is a NaN code (e4m3: magnitude 0x7F; e5m2: 0x7C and up, which a
// saturating conversion gives only for a NaN): a byte's magnitude plus TO_TOP reaches bit 7.
template <int FMT>
__device__ __forceinline__ bool has_nan_code(const u32_t (&words)[2]) {
  constexpr u32_t TO_TOP = FMT == KV_FP8_E4M3 ? 0x01010101u : 0x04040404u;
  return ((((words[0] & 0x7f7f7f7fu) + TO_TOP) | ((words[1] & 0x7f7f7f7fu) + TO_TOP)) & 0x80808080u) != 0u;
}

// Eight codes of `x / scale` (the chunk's elements `x`, widened from the 16-bit rows `raw`), code 0
// in the low byte of `.x`: the codes of div.rn.f32's quotients (docs/semantics.md), with one
// reciprocal a chunk. The scale is finite, positive and below 2^120 (`KvScales::validate` admits
// no other); one below 2^-125 is scaled by 2^64 with x, which leaves every quotient as it is
// (an x that overflows so has a quotient beyond every code). Then recip = 1 / scale rounded to
// nearest, q0 = x recip rounded, the remainder x - q0 scale exact by one fma and q = q0 +
// remainder recip rounded once is the IEEE quotient (Markstein's correction) wherever that is a
// normal f32; below, both encode to a zero, whose sign is x's (ORed in). A NaN x, an infinite
// one, or a quotient beyond f32's range leaves a NaN q and so a NaN code, which becomes 0x7F for
// a NaN x and the largest finite code of x's sign otherwise. tests/append_quantizer.rs checks
// these steps against the host's quantiser on every f16 and bf16 value.
template <int FMT>
__device__ __forceinline__ uint2 quantize8(float (&x)[8], const uint4& raw, float scale) {
  if (scale < 0x1p-125f) {
    scale = mul_rn(scale, 0x1p64f);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = mul_rn(x[i], 0x1p64f);
  }
  const float recip = rcp_rn_normal(scale);
  u32_t words[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    float q[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float q0 = mul_rn(x[i + j], recip);
      q[j] = fma_rn(fma_rn(-q0, scale, x[i + j]), recip, q0);
    }
#if __CUDA_ARCH__ >= 890
    u16_t pair;
    if constexpr (FMT == KV_FP8_E4M3) {
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(q[1]), "f"(q[0]));
    } else {
      asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(q[1]), "f"(q[0]));
    }
    words[i / 4] |= static_cast<u32_t>(pair) << (8 * (i % 4));
#else
    words[i / 4] |= (f32_to_fp8<FMT>(q[0]) | (f32_to_fp8<FMT>(q[1]) << 8)) << (8 * (i % 4));
#endif
  }
  // Each element's sign bit (bit 15 of its 16 bits) onto its code's bit 7.
  words[0] |= __byte_perm(raw.x, raw.y, 0x7531) & 0x80808080u;
  words[1] |= __byte_perm(raw.z, raw.w, 0x7531) & 0x80808080u;
  if (has_nan_code<FMT>(words)) {
    constexpr u32_t MAX_CODE = FMT == KV_FP8_E4M3 ? 0x7eu : 0x7bu;
    constexpr u32_t NAN_MAGNITUDE = FMT == KV_FP8_E4M3 ? 0x7fu : 0x7cu;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int shift = 8 * (i % 4);
      const u32_t code = (words[i / 4] >> shift) & 0xffu;
      if ((code & 0x7fu) >= NAN_MAGNITUDE) {
        const u32_t fixed = x[i] != x[i] ? 0x7fu : (code & 0x80u) | MAX_CODE;
        words[i / 4] = (words[i / 4] & ~(0xffu << shift)) | (fixed << shift);
      }
    }
  }
  return make_uint2(words[0], words[1]);
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

// Where a thread's chunks go: its token's slot in the K and V pages (element offsets), and each
// row's chunk count with its reciprocal, which splits a chunk index into head and chunk without
// an integer division: for n < 2^20 chunks (the host checks token_chunks) and d <= 2^12,
// trunc((n + 1/2) * rn(1/d)) = n / d, since the quotient's fraction is at least 1/(2d) from
// an integer and the two roundings move it by less than (n + 1/2) 2^-23 / d.
struct TokenDst {
  i64_t k, v;
  float k_inv, v_inv;
};

// The token's slot: its request's page id and the slot in the page, as offsets into the pages.
__device__ __forceinline__ TokenDst token_dst(const AppendParams& p, int i) {
  const int r = request_of(p.append_indptr, p.batch_size, i);
  const int j = p.kv_len[r] - (p.append_indptr[r + 1] - p.append_indptr[r]) + (i - p.append_indptr[r]);
  const int page = p.page_indices[p.page_indptr[r] + (j >> p.page_shift)];
  const int slot = j & p.page_mask;
  TokenDst d;
  d.k = page * p.k_page_stride + slot * p.k_token_stride;
  d.v = page * p.v_page_stride + slot * p.v_token_stride;
  d.k_inv = rcp_rn_normal(static_cast<float>(p.k_chunks));
  d.v_inv = rcp_rn_normal(static_cast<float>(p.v_chunks));
  return d;
}

// Chunk `c` of a token's rows (K chunks first, then V) into its slot, from the loaded chunk `x`
// of the new rows (E values): copied (FMT == KV_FP8_NONE), or quantised to fp8 codes.
template <int FMT, typename E>
__device__ __forceinline__ void store_chunk(const AppendParams& p, int c, const uint4& x, const TokenDst& d) {
  const int k_part = p.num_kv_heads * p.k_chunks;
  const bool is_k = c < k_part;
  const int row_chunks = is_k ? p.k_chunks : p.v_chunks;
  const int in_rows = is_k ? c : c - k_part;
  const float inv = is_k ? d.k_inv : d.v_inv;
  const int head = static_cast<int>(fma_rn(static_cast<float>(in_rows), inv, 0.5f * inv));
  const int chunk = in_rows - head * row_chunks;
  // Within the token's slot the offset fits 32 bits (the host checks the head strides).
  const int in_slot = head * static_cast<int>(is_k ? p.k_head_stride : p.v_head_stride) + chunk * 8;
  const i64_t dst = (is_k ? d.k : d.v) + in_slot;
  if constexpr (FMT == KV_FP8_NONE) {
    u16_t* base = static_cast<u16_t*>(is_k ? p.k_cache : p.v_cache);
    *reinterpret_cast<uint4*>(base + dst) = x;
  } else {
    float v[8];
    widen8<E>(x, v);
    const float scale = (is_k ? p.k_scale : p.v_scale)[head * p.scale_head_stride];
    unsigned char* base = static_cast<unsigned char*>(is_k ? p.k_cache : p.v_cache);
    *reinterpret_cast<uint2*>(base + dst) = quantize8<FMT>(v, x, scale);
  }
}

// CTAs per new token in the narrow launch: enough threads for the chunks of its K and V rows of
// every KV head (the host launches total_new times as many).
__device__ __forceinline__ u32_t blocks_per_token(const AppendParams& p) {
  return (static_cast<u32_t>(p.token_chunks) + NUM_THREADS - 1) / NUM_THREADS;
}

template <int FMT, typename E>
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
  store_chunk<FMT, E>(p, c, x, token_dst(p, i));
}

template <int FMT, typename E>
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
  const TokenDst d = token_dst(p, i);
  for (int c0 = first; c0 < all; c0 += CHUNKS_IN_FLIGHT * T) {
    if (c0 != first) load(c0);
#pragma unroll
    for (int n = 0; n < CHUNKS_IN_FLIGHT; ++n) {
      const int c = c0 + n * T;
      if (c < all) store_chunk<FMT, E>(p, c, x[n], d);
    }
  }
}

template <int FMT, typename E>
__device__ __forceinline__ void run_as(const AppendParams& p) {
  if (p.wide) {
    run_wide<FMT, E>(p);
  } else {
    run_narrow<FMT, E>(p);
  }
}

// One kernel, a straight path for each cache format and new rows' dtype (a copy moves the 16 bits
// as they are, whatever they are).
__device__ __forceinline__ void run(const AppendParams& p) {
  if (p.fp8_format == KV_FP8_E4M3) {
    if (p.new_bf16) {
      run_as<KV_FP8_E4M3, bf16_t>(p);
    } else {
      run_as<KV_FP8_E4M3, f16_t>(p);
    }
  } else if (p.fp8_format == KV_FP8_E5M2) {
    if (p.new_bf16) {
      run_as<KV_FP8_E5M2, bf16_t>(p);
    } else {
      run_as<KV_FP8_E5M2, f16_t>(p);
    }
  } else {
    run_as<KV_FP8_NONE, u16_t>(p);
  }
}

}  // namespace append
