// prefill_kv_pipeline.cuh — how Q, K and V reach the prefill CTA's shared memory, and the
// request's bounds as the KV loop reads them.
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

// The request's bounds as the KV loop takes them: from shared memory with policy::BOUNDS_IN_SHARED
// (each read a fresh load), else the registers of `m` and the query tile's token range. `mask()`
// is `m` itself in registers, not a copy (a copy moved ptxas's register allocation).
struct LoopBounds {
  const RequestMaskContext& m;
  int first_token, last_token;
  SharedBounds shared;

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
      return first_token;
    }
  }
  __device__ __forceinline__ int tok_hi() const {
    if constexpr (policy::TOKENS_IN_SHARED) {
      return shared.tok_hi();
    } else {
      return last_token;
    }
  }
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

// The K/V loads of one CTA: where tile t's buffers and page ids sit, and the copies that fill
// them. Tile t covers keys kv_lo + t * KV_TILE.. of the request; num_tiles tiles in all.
struct KvPipeline {
  const PrefillParams& p;
  int kv_len;  // the request's KV length, in registers
  const LoopBounds& bounds;
  int kv_lo, num_tiles, kv_start, kv_head;
  u32_t k_base, v_base, ids_base, tma_bars;
  const KvRowsIn& k_rows;
  const KvRowsIn& v_rows;
  const KvSource<DTypeIn, spec::KV_PAGED, NUM_THREADS>& kv_src;
  bool kv_tma;     // policy::TMA_KV and the launch passed tensor maps
  bool v_pending;  // tile t's V rows are still awaited before its P V (await_v)

  // The K and V buffers of tile t (double-buffered: t % 2); paged, its page ids' stage.
  __device__ __forceinline__ KTile k_tile(int t) const { return KTile{k_base + (t % KV_STAGES) * K_TILE_BYTES}; }
  __device__ __forceinline__ VTile v_tile(int t) const { return VTile{v_base + (t % KV_STAGES) * V_TILE_BYTES}; }
  __device__ __forceinline__ u32_t page_ids(int t) const { return ids_base + (t % 2) * KV_TILE * 4; }

  // policy::TMA_KV: whether the tile at keys k0.. comes by the accelerator (whole tiles only), and
  // the mbarrier of buffer t % 2, which completes when tile t's boxes have landed (its (t / 2)-th
  // use: the phase parity tile t waits for).
  __device__ __forceinline__ bool tma_tile(int k0) const { return kv_tma && kv_len - k0 >= KV_TILE; }
  __device__ __forceinline__ u32_t tma_bar(int t) const { return tma_bars + static_cast<u32_t>(t % 2) * 8; }

  // Tile t (keys k0..) by the accelerator: issued by thread 0 alone.
  __device__ __forceinline__ void issue_tma(int t, int k0) const {
    const u32_t bar = tma_bar(t);
    mbarrier_arrive_expect_tx(bar, K_TILE_BYTES + V_TILE_BYTES);
    const int row = kv_start + k0;
#pragma unroll
    for (int g = 0; g < QK_CHUNKS / 8; ++g)
      tma_load_3d(k_tile(t).base + g * KTile::GROUP_BYTES, &p.k_tmap, g * 64, kv_head, row, bar);
#pragma unroll
    for (int g = 0; g < VO_CHUNKS / 8; ++g)
      tma_load_3d(v_tile(t).base + g * VTile::GROUP_BYTES, &p.v_tmap, g * 64, kv_head, row, bar);
  }

  // Paged: the page ids of tile t + 1 into stage (t + 1) % 2, which tile t - 1's copies were the
  // last to read (they were issued before the barrier that precedes this call).
  __device__ __forceinline__ void stage_next_page_ids(int t) const {
    const int k1 = kv_lo + (t + 1) * KV_TILE;
    if (t + 1 < num_tiles) stage_page_ids_async<KV_TILE, NUM_THREADS>(page_ids(t + 1), k_rows, k1, bounds.kv_len() - k1);
  }

  // The prologue's loads, issued by every thread: this warp's block of Q rows (`q_tile` at
  // `q_ptr`; lane i works out the address of its row i), then tile 0 as two groups: Q with K_0
  // (and the page ids of tile 1), then V_0 (with TMA, both are the boxes). With f16 QK each thread
  // then scales the Q chunks it copied itself once they have landed (with K_0, which the first
  // tile waits for anyway); the first tile's barrier publishes them. Out of the main loop, whose
  // registers it would otherwise share.
  __device__ __forceinline__ void load_prologue(const QueryTile& tile, const QTile& q_tile, const DTypeIn* q_ptr,
                                                int qo_start, unsigned char* smem, int warp, int lane) const {
    if (kv_tma) {
      // The barriers, initialised before any thread waits on one (thread 0 issues tile 0's boxes
      // below, after its own initialisation).
      if (threadIdx.x == 0) {
        mbarrier_init_one(tma_bar(0));
        mbarrier_init_one(tma_bar(1));
      }
      __syncthreads();
    }
    {
      const int q_row0 = warp * Q_ROWS_PER_WARP;
      const i64_t lane_row =
          lane < Q_ROWS_PER_WARP ? tile.row_offset(q_row0 + lane, qo_start, p.q_stride_token, p.q_stride_head) : 0;
      for_lane_chunks<Q_ROWS_PER_WARP, QK_CHUNKS>(lane, [&](int r, int chunk) {
        const i64_t row = shfl_i64(lane_row, r);
        cp_async_16(q_tile.chunk_addr(q_row0 + r, chunk), q_ptr + row + chunk * (16 / sizeof(DTypeIn)),
                    tile.valid(q_row0 + r));
      });
    }
    const bool tile0_tma = tma_tile(kv_lo);
    if (tile0_tma) {
      if (threadIdx.x == 0) issue_tma(0, kv_lo);
    } else {
      load_kv_rows_async<KV_TILE, QK_CHUNKS, NUM_THREADS>(k_tile(0), k_rows, kv_lo, kv_len - kv_lo);
      stage_next_page_ids(0);
    }
    cp_async_commit();
    if (!tile0_tma) load_kv_rows_async<KV_TILE, VO_CHUNKS, NUM_THREADS>(v_tile(0), v_rows, kv_lo, kv_len - kv_lo);
    cp_async_commit();
    if constexpr (spec::QK_F16_ACCUM) {
      wait_copies<1>();
      prescale_q(q_tile, smem, p.q_prescale, warp, lane);
    }
  }

  // Tile t >= 1: K and V go to buffer t % 2 as one cp.async group, with the next tile's page ids.
  // The group is committed even when empty (past the last tile) so that every iteration waits for
  // the same groups.
  __device__ __forceinline__ void load_kv(int t) const {
    if (t < num_tiles) {
      const int k0 = kv_lo + t * KV_TILE;
      if (tma_tile(k0)) {
        if (threadIdx.x == 0) issue_tma(t, k0);
      } else {
        load_kv_tiles_staged_async<KV_TILE, QK_CHUNKS, VO_CHUNKS, NUM_THREADS>(k_tile(t), v_tile(t), kv_src,
                                                                               page_ids(t), k0, bounds.kv_len() - k0);
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
      load_kv_rows_async<KV_TILE, QK_CHUNKS, NUM_THREADS>(k_tile(t), k_rows, k0, kv_len - k0);
    }
    cp_async_commit();
  }
  __device__ __forceinline__ void load_v(int t) const {
    if (t < num_tiles) {
      const int k0 = kv_lo + t * KV_TILE;
      load_kv_rows_async<KV_TILE, VO_CHUNKS, NUM_THREADS>(v_tile(t), v_rows, k0, kv_len - k0);
    }
    cp_async_commit();
  }

  // Waits until tile t may be computed, then issues what loads during it. Two buffers: K_t and
  // V_t have landed (tile 0: Q and K_0, V_0 too unless policy::FIRST_V_LATE; by the accelerator,
  // both), then, every warp being done with tile t - 1, tile t + 1 loads into its buffers. One
  // buffer: K_t has landed (tile 0: with Q); in flight are tile 0's V rows (the prologue's second
  // group) and, without policy::K_FREE_BEFORE_PV, every tile's (issued after the tile before);
  // with it, V_t goes out here, now that every warp is done with tile t - 1's P V, and lands during
  // S = Q K^T. V_t is then awaited before P V (await_v).
  __device__ __forceinline__ void begin_tile(int t) {
    if constexpr (SINGLE_BUFFER) {
      if (!policy::K_FREE_BEFORE_PV || t == 0) {
        wait_copies<1>();
      } else {
        wait_copies<0>();
      }
      __syncthreads();
      if constexpr (policy::K_FREE_BEFORE_PV) {
        if (t > 0) load_v(t);
      }
      v_pending = true;
    } else {
      if (tma_tile(kv_lo + t * KV_TILE)) mbarrier_wait_parity(tma_bar(t), static_cast<u32_t>(t / 2) & 1u);
      if (t > 0 || !policy::FIRST_V_LATE) {
        wait_copies<0>();
      } else {
        wait_copies<1>();
      }
      __syncthreads();
      load_kv(t + 1);
    }
  }

  // Before a P V: waits for the V rows still pending (tile 0's with policy::FIRST_V_LATE, every
  // tile's with one buffer) and publishes them. With one buffer that barrier also tells that every
  // warp is past this tile's S = Q K^T.
  __device__ __forceinline__ void await_v() {
    if (v_pending) {
      wait_copies<SINGLE_BUFFER ? 0 : 1>();
      __syncthreads();
      v_pending = false;
    }
  }

  // await_v, then with one buffer tile t + 1's K rows go out during P V (the steps whose sub-tile
  // is done with K before P V: policy::K_FREE_BEFORE_PV).
  __device__ __forceinline__ void await_v_free_k(int t) {
    await_v();
    if constexpr (SINGLE_BUFFER) load_k(t + 1);
  }

  // After tile t's sub-tiles, one buffer: a warp that took no sub-tile still meets the V barrier
  // (and issues K_{t+1}) once; without policy::K_FREE_BEFORE_PV, once every warp is done with V_t
  // and K_t, tile t + 1's rows overwrite them.
  __device__ __forceinline__ void end_tile(int t) {
    if constexpr (SINGLE_BUFFER) {
      if (v_pending) {
        await_v();
        if constexpr (policy::K_FREE_BEFORE_PV) load_k(t + 1);
      }
      if constexpr (!policy::K_FREE_BEFORE_PV) {
        __syncthreads();
        load_k(t + 1);
        load_v(t + 1);
      }
    }
  }
};

}  // namespace prefill
