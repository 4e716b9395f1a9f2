// append_paged.cuh — writes the new tokens' K and V rows of a ragged batch into their pages.
//
// Request r's n_r = append_indptr[r+1] - append_indptr[r] new tokens are its last n_r
// positions, kv_len[r] - n_r .. kv_len[r] (the page table already covers them). One thread
// copies one 16-byte chunk of one head of one new token, K chunks first, then V chunks; the host
// validated the table and checked that no two writes share a slot, so threads never race.
// Requires: common.cuh and the rendered AppendParams.

namespace append {

constexpr int NUM_THREADS = 256;

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
  u16_t* base = static_cast<u16_t*>(is_k ? p.k_cache : p.v_cache);
  *reinterpret_cast<uint4*>(base + dst + chunk * 8) = *src;
}

}  // namespace append
