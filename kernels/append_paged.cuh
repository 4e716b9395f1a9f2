// append_paged.cuh — writes the new tokens' K and V rows of a ragged batch into their pages,
// copied (a cache of the rows' dtype) or quantised to fp8 codes.
//
// Request r's n_r = append_indptr[r+1] - append_indptr[r] new tokens are its last n_r
// positions, kv_len[r] - n_r .. kv_len[r] (the page table already covers them). One thread
// handles one 16-byte chunk (8 elements) of one head of one new token, K chunks first, then V
// chunks; the host validated the table and checked that no two writes share a slot, so threads
// never race. An fp8 cache receives 8 codes per chunk: each element x of KV head h becomes
// f32_to_fp8(div_rn(x, scale[h])) (fp8.cuh): nearest, ties to even, saturating; a NaN element
// becomes 0x7F and an infinity the largest finite code (the host cannot check device rows first).
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

// Eight codes of `x / scale`, code 0 in the low byte of `.x`.
template <int FMT>
__device__ __forceinline__ uint2 quantize8(const float (&x)[8], float scale) {
  u32_t words[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i) words[i / 4] |= f32_to_fp8<FMT>(div_rn(x[i], scale)) << (8 * (i % 4));
  uint2 r;
  r.x = words[0];
  r.y = words[1];
  return r;
}

__device__ __forceinline__ void run(const AppendParams& p) {
  const int chunks = p.k_chunks + p.v_chunks;
  const i64_t idx = static_cast<i64_t>(blockIdx.x) * NUM_THREADS + threadIdx.x;
  if (idx >= static_cast<i64_t>(p.total_new) * p.num_kv_heads * chunks) return;
  const int c = static_cast<int>(idx % chunks);
  const i64_t token_head = idx / chunks;
  const int head = static_cast<int>(token_head % p.num_kv_heads);
  const int i = static_cast<int>(token_head / p.num_kv_heads);
  const int r = request_of(p.append_indptr, p.batch_size, i);
  const int j = p.kv_len[r] - (p.append_indptr[r + 1] - p.append_indptr[r]) + (i - p.append_indptr[r]);
  const int page = p.page_indices[p.page_indptr[r] + (j >> p.page_shift)];
  const int slot = j & p.page_mask;
  const bool is_k = c < p.k_chunks;
  const int chunk = is_k ? c : c - p.k_chunks;
  const int row_chunks = is_k ? p.k_chunks : p.v_chunks;
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
