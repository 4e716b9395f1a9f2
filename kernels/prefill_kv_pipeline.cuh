// prefill_kv_pipeline.cuh — pieces of how Q, K and V reach the prefill CTA's shared memory (the
// loads themselves are issued by run_cta in prefill.cuh), and the request's bounds as the KV loop
// reads them with policy::BOUNDS_IN_SHARED.
//
// Two K/V buffers (KV_STAGES = 2): tile t + 1 loads while tile t computes, one barrier per tile;
// tile 0 arrives in two cp.async groups (Q and K_0, then V_0), so that with policy::FIRST_V_LATE
// tile 0's S = Q K^T runs while V_0 still lands. Rows come by cp.async (kv_rows.cuh: ragged rows
// or pages, whose ids are staged one tile ahead), or, with policy::TMA_KV and tensor maps passed
// by the launch, as whole tiles by the tensor memory accelerator on the buffer's mbarrier. One K/V
// buffer (KV_STAGES = 1): tile t + 1's K rows load during tile t's P V (with
// policy::K_FREE_BEFORE_PV, after the V barrier) and its V rows during tile t + 1's S = Q K^T;
// otherwise both after tile t.
// Requires: common.cuh, tma.cuh, kv_rows.cuh, mask.cuh, prefill_tile.cuh.

namespace prefill {

// The request's bounds as the KV loop reads them with policy::BOUNDS_IN_SHARED: each warp's copy in
// BOUNDS_SLOT_BYTES of shared memory from `base` on (warp w's at base + w * BOUNDS_SLOT_BYTES),
// written by all its lanes at once (the same values) and read back where the loop uses them. The
// slot's address is formed from a fresh read of the thread index at each read.
struct SharedBounds {
  u32_t base;

  __device__ __forceinline__ void store(int qo_len, int kv_len, int tok_lo, int tok_hi) const {
    const u32_t slot = base + (threadIdx.x / 32) * BOUNDS_SLOT_BYTES;
    if constexpr (policy::TOKENS_IN_SHARED) {
      asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};" ::"r"(slot), "r"(qo_len), "r"(kv_len), "r"(tok_lo),
                   "r"(tok_hi));
    } else {
      asm volatile("st.shared.v2.s32 [%0], {%1, %2};" ::"r"(slot), "r"(qo_len), "r"(kv_len));
    }
    __syncwarp();
  }

  __device__ __forceinline__ u32_t slot() const {
    return base + static_cast<u32_t>(thread_index()) / 32 * BOUNDS_SLOT_BYTES;
  }

  // The KV length alone (the copies' valid rows); the mask context `m` with both lengths; the
  // query tile's first and last token (policy::TOKENS_IN_SHARED).
  __device__ __forceinline__ int kv_len() const { return ld_shared_s32(slot() + 4); }
  __device__ __forceinline__ RequestMaskContext mask(const RequestMaskContext& m) const {
    RequestMaskContext r = m;
    asm volatile("ld.shared.v2.s32 {%0, %1}, [%2];" : "=r"(r.qo_len), "=r"(r.kv_len) : "r"(slot()));
    return r;
  }
  __device__ __forceinline__ int tok_lo() const { return ld_shared_s32(slot() + 8); }
  __device__ __forceinline__ int tok_hi() const { return ld_shared_s32(slot() + 12); }
};

// Multiplies this thread's Q chunks (loaded by itself) by the f16 prescale, an exact power of two.
__device__ __forceinline__ void prescale_q(const QTile& q, unsigned char* q_bytes, float prescale, int warp, int lane) {
  u32_t s2 = DTypeTraits<f16_t>::pack2(prescale, prescale);
  const int q_row0 = warp * Q_ROWS_PER_WARP;
  for_lane_chunks<Q_ROWS_PER_WARP, QK_CHUNKS>(lane, [&](int r, int chunk) {
    uint4* c = reinterpret_cast<uint4*>(q_bytes + (q.chunk_addr(q_row0 + r, chunk) - q.base));
    uint4 x = *c;
    x.x = f16x2_mul(x.x, s2);
    x.y = f16x2_mul(x.y, s2);
    x.z = f16x2_mul(x.z, s2);
    x.w = f16x2_mul(x.w, s2);
    *c = x;
  });
}

// The request's bounds as the KV loop takes them: from shared memory with policy::BOUNDS_IN_SHARED
// (`shared`, stored by run_cta before the first copy that reads them), else the registers of the
// mask context `m` and the query tile's token range. (`m` itself then, not a copy: passing a copy
// to the logits moved ptxas's register allocation of the ALiBi kernels, 246 -> 254 registers for
// bf16 causal paged `w4q2kv64` at sm_80.)
struct LoopBounds {
  const RequestMaskContext& m;
  const int& tok_first;
  const int& tok_last;
  const SharedBounds& shared;

  __device__ __forceinline__ int kv_len() const {
    if constexpr (policy::BOUNDS_IN_SHARED) {
      return shared.kv_len();
    } else {
      return m.kv_len;
    }
  }
  __device__ __forceinline__ decltype(auto) mask() const {
    if constexpr (policy::BOUNDS_IN_SHARED) {
      return shared.mask(m);
    } else {
      return (m);
    }
  }
  __device__ __forceinline__ int tok_lo() const {
    if constexpr (policy::TOKENS_IN_SHARED) {
      return shared.tok_lo();
    } else {
      return tok_first;
    }
  }
  __device__ __forceinline__ int tok_hi() const {
    if constexpr (policy::TOKENS_IN_SHARED) {
      return shared.tok_hi();
    } else {
      return tok_last;
    }
  }
};

}  // namespace prefill
