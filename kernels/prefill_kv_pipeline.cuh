// prefill_kv_pipeline.cuh — how Q, K and V reach the prefill CTA's shared memory: the K/V loads
// (KvLoads; run_cta in prefill.cuh issues the Q copies and decides when each K/V load is issued
// and awaited), the Q prescale, and the request's bounds as the KV loop reads them (LoopBounds,
// with policy::BOUNDS_IN_SHARED).
//
// Two K/V buffers (KV_STAGES = 2): tile t + 1 loads while tile t computes, one barrier per tile;
// tile 0 arrives in two cp.async groups (Q and K_0, then V_0), so that with policy::FIRST_V_LATE
// tile 0's S = Q K^T runs while V_0 still lands. Rows come by cp.async (kv_rows.cuh: ragged rows
// or pages, whose ids are staged one tile ahead; fp8 pages as codes, expanded in place after the
// tile before has computed: KvLoads::expand_fp8), or, with policy::TMA_KV and tensor maps passed
// by the launch, as whole tiles by the tensor memory accelerator on the buffer's mbarrier. One K/V
// buffer (KV_STAGES = 1): tile t + 1's K rows load during tile t's P V (with
// policy::K_FREE_BEFORE_PV, after the V barrier) and its V rows during tile t + 1's S = Q K^T;
// otherwise both after tile t.
// Requires: common.cuh, tma.cuh, kv_rows.cuh, mask.cuh, the rendered PrefillParams, prefill_tile.cuh.

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

// The K/V source of the CTA's rows (ragged rows or pages, with the staged page ids).
using KvSourceIn = KvSource<DTypeIn, spec::KV_PAGED, NUM_THREADS, spec::KV_FP8>;

// Whether the K/V tile from key k0 comes by the accelerator (policy::TMA_KV, the launch passing
// tensor maps: kv_tma; whole tiles only). An object of its own, as run_cta's lambda was: without
// TMA the test is a constant, and NVVM keeps the calls to such a function until late, so a
// KvLoads method here would hold all of KvLoads (and every local it refers to) in memory that
// long (the causal kernels' SASS moved).
struct TmaTileTest {
  const bool& kv_tma;
  const RequestMaskContext& m;

  __device__ __forceinline__ bool operator()(int k0) const {
    return policy::TMA_KV && kv_tma && m.kv_len - k0 >= KV_TILE;
  }
};

// The CTA's K/V loads: tile 0's in the prologue (after the Q copies run_cta issues), then one
// tile's per call in the main loop. The members are references to run_cta's locals, as
// LoopBounds's are, so that the kernels compile to the same code as with the loads written out
// in run_cta (built over copies, the buffer-parity arithmetic came out combined differently).
//
// Buffers: K_t at k_tile(t), V_t at v_tile(t) (t % KV_STAGES); the page ids of tile t at
// page_ids(t) (t % 2), copied there with tile t - 1's group (tile 0's rows read the page table
// directly). policy::TMA_KV: the mbarrier tma_bar(t) of buffer t % 2 completes when tile t's boxes
// have landed (its (t / 2)-th use: the phase parity tile t waits for).
// (A template, like run_cta, so that its loads are instantiated only where run_cta uses them: the
// warp-specialised kernel's tile spec has consumer threads these loads are not written for.)
template <int = 0>
struct KvLoadsOf {
  const PrefillParams& p;
  const QueryTile& tile;
  const RequestMaskContext& m;
  const LoopBounds& loop;
  const int& kv_start;
  const int& kv_lo;
  const int& num_tiles;
  const TmaTileTest& tma_tile;
  const u32_t& k_base;
  const u32_t& v_base;
  const u32_t& ids_base;
  const u32_t& tma_bars;
  const KvRowsIn& k_rows;
  const KvRowsIn& v_rows;
  const KvSourceIn& kv_src;

  __device__ __forceinline__ KTile k_tile(int t) const { return KTile{k_base + (t % KV_STAGES) * K_TILE_BYTES}; }
  __device__ __forceinline__ VTile v_tile(int t) const { return VTile{v_base + (t % KV_STAGES) * V_TILE_BYTES}; }
  __device__ __forceinline__ u32_t page_ids(int t) const { return ids_base + (t % 2) * KV_TILE * 4; }
  __device__ __forceinline__ u32_t tma_bar(int t) const { return tma_bars + static_cast<u32_t>(t % 2) * 8; }

  // Tile t (keys k0..) by the accelerator: issued by thread 0 alone.
  __device__ __forceinline__ void issue_tma(int t, int k0) const {
    const u32_t bar = tma_bar(t);
    mbarrier_arrive_expect_tx(bar, K_TILE_BYTES + V_TILE_BYTES);
    const int row = kv_start + k0;
#pragma unroll
    for (int g = 0; g < QK_CHUNKS / 8; ++g)
      tma_load_3d(k_tile(t).base + g * KTile::GROUP_BYTES, &p.k_tmap, g * 64, tile.kv_head, row, bar);
#pragma unroll
    for (int g = 0; g < VO_CHUNKS / 8; ++g)
      tma_load_3d(v_tile(t).base + g * VTile::GROUP_BYTES, &p.v_tmap, g * 64, tile.kv_head, row, bar);
  }

  // Paged: the page ids of tile t + 1 into stage (t + 1) % 2, which tile t - 1's copies were the
  // last to read (they were issued before the barrier that precedes this call).
  __device__ __forceinline__ void stage_next_page_ids(int t) const {
    // page_ids(t + 1) written out: called here, it moved the paged kernels' copy-loop arithmetic.
    const int k1 = kv_lo + (t + 1) * KV_TILE;
    if (t + 1 < num_tiles)
      stage_page_ids_async<KV_TILE, NUM_THREADS>(ids_base + ((t + 1) % 2) * KV_TILE * 4, k_rows, k1, loop.kv_len() - k1);
  }

  // Tile t >= 1: K and V go to buffer t % 2 as one cp.async group, with the next tile's page ids.
  // The group is committed even when empty (past the last tile) so that every iteration waits for
  // the same groups. Tile 0 is loaded by the prologue, in two groups.
  __device__ __forceinline__ void load_kv(int t) const {
    if (t < num_tiles) {
      const int k0 = kv_lo + t * KV_TILE;
      if (tma_tile(k0)) {
        if (threadIdx.x == 0) issue_tma(t, k0);
      } else {
        load_kv_tiles_staged_async<KV_TILE, QK_CHUNKS, VO_CHUNKS, NUM_THREADS, policy::FP8_FRAGMENTS>(
            k_tile(t), v_tile(t), kv_src, page_ids(t), k0, loop.kv_len() - k0);
        stage_next_page_ids(t);
      }
    }
    cp_async_commit();
  }

  // One K/V buffer: tile t's K rows, or its V rows, as one cp.async group, committed even when
  // empty (past the last tile) so that every tile waits for the same groups.
  __device__ __forceinline__ void load_k(int t) const {
    if (t < num_tiles) {
      const int k0 = kv_lo + t * KV_TILE;
      load_kv_rows_async<KV_TILE, QK_CHUNKS, NUM_THREADS>(k_tile(t), k_rows, k0, m.kv_len - k0);
    }
    cp_async_commit();
  }
  __device__ __forceinline__ void load_v(int t) const {
    if (t < num_tiles) {
      const int k0 = kv_lo + t * KV_TILE;
      load_kv_rows_async<KV_TILE, VO_CHUNKS, NUM_THREADS>(v_tile(t), v_rows, k0, m.kv_len - k0);
    }
    cp_async_commit();
  }

  // Tile 0, after the Q copies the caller issued: K_0 (with the page ids of tile 1) closes the
  // first cp.async group, V_0 is the second (with TMA, both are the boxes, issued by thread 0).
  __device__ __forceinline__ void load_first_tile() const {
    const bool tile0_tma = tma_tile(kv_lo);
    if (tile0_tma) {
      if (threadIdx.x == 0) issue_tma(0, kv_lo);
    } else {
      load_kv_rows_async<KV_TILE, QK_CHUNKS, NUM_THREADS, policy::FP8_FRAGMENTS>(k_tile(0), k_rows, kv_lo,
                                                                                m.kv_len - kv_lo);
      stage_next_page_ids(0);
    }
    cp_async_commit();  // the first group: Q, K_0 (and the page ids of tile 1)
    if (!tile0_tma) {
      load_kv_rows_async<KV_TILE, VO_CHUNKS, NUM_THREADS, policy::FP8_FRAGMENTS>(v_tile(0), v_rows, kv_lo,
                                                                                m.kv_len - kv_lo);
    }
    cp_async_commit();  // the second: V_0 (with TMA, both are the boxes)
    // fp8: tile 0's codes are expanded before the first tile's barrier (both groups awaited).
    expand_fp8(0);
  }

  // fp8: tile t's codes (copied by this thread with tile t's group, which is awaited here)
  // dequantised in place in buffer t % 2; nothing past the last tile, and nothing without fp8 or
  // with policy::FP8_FRAGMENTS (the products read the codes: prefill_fp8_fragments.cuh).
  // The main loop calls it for tile t + 1 after tile t's products, so the copies had the whole
  // tile to land; the next tile's barrier publishes the result.
  __device__ __forceinline__ void expand_fp8(int t) const {
    if constexpr (spec::KV_FP8 != KV_FP8_NONE && !policy::FP8_FRAGMENTS) {
      if (t < num_tiles) {
        cp_async_wait<0>();
        constexpr bool UNROLLED = policy::FP8_EXPAND_UNROLLED;
        constexpr bool LATER = FP8_SCALES_AFTER_PRODUCTS;
        expand_fp8_codes<KV_TILE, QK_CHUNKS, NUM_THREADS, DTypeIn, spec::KV_FP8, UNROLLED, LATER>(k_tile(t), k_rows.scale);
        expand_fp8_codes<KV_TILE, VO_CHUNKS, NUM_THREADS, DTypeIn, spec::KV_FP8, UNROLLED, LATER>(v_tile(t), v_rows.scale);
      }
    }
  }
};
using KvLoads = KvLoadsOf<>;

}  // namespace prefill
