// mask.cuh — which keys a query sees, per element and per tile.
//
// The definition is docs/semantics.md's (and `Mask::visible` in Rust): with d = kv_len - qo_len,
// causal keeps j <= i + d; the sliding window also keeps j >= i + d - window_left; a custom mask
// reads bit (i * kv_len + j) of the request's packed segment (little-endian bit order). The
// variant's own `logits_mask` hides further keys.
// Requires: common.cuh, the spec constant MASK_KIND, the variant (VARIANT_HAS_MASK,
// logits_mask), and the kernel params fields custom_mask, mask_indptr, window_left.

struct RequestMaskContext {
  int qo_len;
  int kv_len;
  int window_left;
  const unsigned char* custom_bits;  // this request's packed segment, or null
};

template <int KIND>
__device__ __forceinline__ bool mask_visible(const RequestMaskContext& m, int qo_idx, int kv_idx) {
  int diag = qo_idx + m.kv_len - m.qo_len;
  if constexpr (KIND == MASK_CAUSAL) {
    return kv_idx <= diag;
  } else if constexpr (KIND == MASK_SLIDING_WINDOW) {
    return kv_idx <= diag && kv_idx >= diag - m.window_left;
  } else if constexpr (KIND == MASK_CUSTOM) {
    // A padding row of a query tile (qo_idx >= qo_len) has no bits: reading them would run past
    // the request's segment (past the end of the mask for the last request).
    if (qo_idx >= m.qo_len) return false;
    i64_t bit = static_cast<i64_t>(qo_idx) * m.kv_len + kv_idx;
    return (m.custom_bits[bit >> 3] >> (bit & 7)) & 1;
  } else {
    return true;
  }
}

// The custom mask's bits of query row qo_idx for keys [k0, k0 + 32 * WORDS): bit b of bits[w] is
// key k0 + 32 * w + b. The fast kernels read a row's bits for a whole sub-tile at once: WORDS + 1
// aligned 32-bit loads around them and one funnel shift per word, instead of one dependent byte
// load (a 64-bit bit index, a shift and a branch) per element, a form that held each element's
// address and logit across its branches and spilled (f32-QK wgmma kernels: 72 to 96 bytes, NVRTC
// 13). The aligned words reach up to 3 bytes before the row's first byte and CUSTOM_MASK_PAD_BYTES
// past the request's last byte: the host uploads the mask 4-byte aligned and padded so (Rust:
// `CUSTOM_MASK_PAD_BYTES`). Bits of keys at or past kv_len belong to the next row, the padding, or
// nothing: the caller masks those keys by kv_len. A padding row (qo_idx >= qo_len) reads the last
// row's bits instead, which the caller discards.
constexpr int CUSTOM_MASK_PAD_BYTES = 20;
template <int WORDS>
__device__ __forceinline__ void custom_mask_row_bits(const RequestMaskContext& m, int qo_idx, int k0,
                                                     u32_t (&bits)[WORDS]) {
  static_assert(4 * WORDS + 3 <= CUSTOM_MASK_PAD_BYTES, "the aligned words stay within the padding");
  const i64_t bit0 = static_cast<i64_t>(min(qo_idx, m.qo_len - 1)) * m.kv_len + k0;
  const u64_t first = reinterpret_cast<u64_t>(m.custom_bits) + static_cast<u64_t>(bit0 >> 3);
  const u32_t* words = reinterpret_cast<const u32_t*>(first & ~u64_t{3});
  const int shift = static_cast<int>(first & 3) * 8 + static_cast<int>(bit0 & 7);
  u32_t raw[WORDS + 1];
#pragma unroll
  for (int w = 0; w <= WORDS; ++w) raw[w] = words[w];
#pragma unroll
  for (int w = 0; w < WORDS; ++w) bits[w] = __funnelshift_r(raw[w], raw[w + 1], shift);
}

// Key range [lo, hi) that tokens [tok_lo, tok_hi] of a request can see at all under KIND.
template <int KIND>
__device__ __forceinline__ void visible_key_range(const RequestMaskContext& m, int tok_lo, int tok_hi, int& lo,
                                                  int& hi) {
  int d = m.kv_len - m.qo_len;
  lo = 0;
  hi = m.kv_len;
  if constexpr (KIND == MASK_CAUSAL || KIND == MASK_SLIDING_WINDOW) {
    hi = min(hi, max(0, tok_hi + d + 1));
  }
  if constexpr (KIND == MASK_SLIDING_WINDOW) {
    lo = min(hi, max(0, tok_lo + d - m.window_left));
  }
}

// Whether keys [k0, k0 + tile) need per-element masking for tokens [tok_lo, tok_hi]: false only
// when every key in the tile exists and is visible to every token.
template <int KIND, bool VARIANT_MASKS>
__device__ __forceinline__ bool tile_needs_mask(const RequestMaskContext& m, int tok_lo, int tok_hi, int k0,
                                                int tile) {
  if (k0 + tile > m.kv_len) return true;
  if constexpr (VARIANT_MASKS || KIND == MASK_CUSTOM) {
    return true;
  } else {
    int d = m.kv_len - m.qo_len;
    bool inside = true;
    if constexpr (KIND == MASK_CAUSAL || KIND == MASK_SLIDING_WINDOW) {
      inside = k0 + tile - 1 <= tok_lo + d;
    }
    if constexpr (KIND == MASK_SLIDING_WINDOW) {
      inside = inside && k0 >= tok_hi + d - m.window_left;
    }
    return !inside;
  }
}
