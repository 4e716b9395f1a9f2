// prefill.cuh — FA2-class prefill attention for one work item, (request, query tile, KV head, KV
// chunk): run_cta, the kernel's set-up (the work item, the query tile, the visible KV range, the
// shared-memory map), prologue (Q and the first K/V tile), main loop (per K/V tile: its barrier and
// the next tile's loads, then each sub-tile's step in the kernel's accumulation variant) and
// epilogue (normalise and store, or a split plan's partial result).
//
// The pieces it calls, by role: prefill_tile.cuh (the tile's constants, shared-memory map and
// rows), prefill_kv_pipeline.cuh (the K/V loads, KvLoads, over run_cta's locals; the request's
// bounds as the KV loop reads them, LoopBounds; the Q prescale), prefill_products.cuh (S = Q K^T
// and O += P V by mma.sync or wgmma), prefill_step.cuh (step_subtile: a sub-tile's S = Q K^T,
// logits, mask, online softmax update and P V), prefill_epilogue.cuh (write_result: normalise and
// store). Every tuning choice arrives from Rust as a `policy::` constant (src/codegen/policy.rs;
// `attnforge compile --explain NAME` prints them).
//
// Per sub-tile, S = Q K^T is computed with f32 or f16 accumulators; the variant and the mask see S
// as f32; the online softmax updates its state and O += P V accumulates in f32. Tiles wholly
// masked are skipped; element masks run only on tiles that need them. With f16 accumulators, a
// sub-tile that needs no transform and no mask and did not overflow goes to the softmax as packed
// f16; the others are widened exactly to f32 (overflowed elements recomputed with f32
// accumulation). When the plan splits the KV range, the CTA covers one chunk and writes a partial
// result for merge_state.cuh instead of the output.
// Requires: common.cuh, mma.cuh, smem_tile.cuh, tma.cuh, kv_rows.cuh, mask.cuh, online_softmax.cuh,
// variant.cuh, the spec and policy constants, the rendered PrefillParams, and the prefill_*.cuh
// files above.

namespace prefill {

// One CTA: one work item, (request, query tile, KV head) over the whole visible KV range, or
// over one chunk of it when the plan splits the KV range. A template (of nothing) so that the
// branches `if constexpr` discards are not instantiated: the wgmma calls, say, do not compile for
// the other tiles' fragments.
template <int = 0>
__device__ __forceinline__ void run_cta(const PrefillParams& p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // Two loads side by side: the item, and its request's span (what the indptrs hold for it).
  const int4 work = p.work[2 * blockIdx.x];      // (request, query tile, kv head, kv chunk)
  const int4 span = p.work[2 * blockIdx.x + 1];  // (qo start, qo len, kv start, kv len)
  const int request = work.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int qo_start = span.x, kv_start = span.z;
  RequestMaskContext m;
  m.qo_len = span.y;
  m.kv_len = span.w;
  m.window_left = p.window_left;
  m.custom_bits = spec::MASK_KIND == MASK_CUSTOM ? p.custom_mask + p.mask_indptr[request] : nullptr;

  QueryTile tile;
  tile.row0 = work.y * CTA_Q;
  tile.packed_len = m.qo_len * p.group_size;
  tile.kv_head = work.z;
  tile.group = p.group_size;
  tile.group_div = FastDivisor{p.group_div_magic, p.group_div_shift};
  // With wgmma: this warp's warpgroup, and the warp within it (written so that with one
  // warpgroup the compiler sees 0 and `warp`, which it cannot infer from threadIdx). With f16 QK
  // the warpgroup is made warp-uniform for ptxas (warp_uniform), so the Q descriptors of S = Q K^T
  // stay in uniform registers and 8 vector registers are free; with the buffer index below, S =
  // Q K^T takes 103 -> 76 instructions per tile and warp (f16 D=128 causal, in SASS). With f32 QK
  // the same serialized the wgmma products (policy::UNIFORM_WARPGROUP).
  const int warpgroup =
      NUM_WARPS > 4 ? (policy::UNIFORM_WARPGROUP ? static_cast<int>(warp_uniform(warp / 4)) : warp / 4) : 0;
  const int warp_in_group = NUM_WARPS > 4 ? warp % 4 : warp;
  const WarpRows warp_rows{WARPS_SPLIT_KEYS ? 0
                           : WGMMA        ? warpgroup * WARPGROUP_ROWS + warp_in_group * 16
                                          : warp * MMA_Q * 16};

  RowCoords rows = tile.row_coords(warp_rows, lane);

  const int tok_lo = tile.group_div.div(tile.row0);
  const int tok_hi = tile.group_div.div(min(tile.row0 + CTA_Q, tile.packed_len) - 1);
  int kv_lo, kv_hi;
  visible_key_range<spec::MASK_KIND>(m, tok_lo, tok_hi, kv_lo, kv_hi);
  // Split KV: this CTA covers one chunk (its bounds are multiples of the KV tile).
  const bool split = p.kv_chunk > 0;
  if (split) {
    const int chunk_lo = work.w * p.kv_chunk;
    kv_lo = max(kv_lo, chunk_lo);
    kv_hi = min(kv_hi, chunk_lo + p.kv_chunk);
  }
  kv_lo = kv_lo / KV_TILE * KV_TILE;
  const int num_tiles = kv_hi > kv_lo ? (kv_hi - kv_lo + KV_TILE - 1) / KV_TILE : 0;

  // With wgmma, every tile 1024-byte aligned (SMEM_ALIGN_SLACK); `smem` then points at the base.
  const u32_t raw_base = smem_addr(smem_raw);
  const u32_t smem_base = WGMMA ? (raw_base + 1023u) & ~1023u : raw_base;
  unsigned char* const smem = smem_raw + (smem_base - raw_base);
  const QTile q_tile{smem_base};
  const u32_t k_base = q_tile.base + Q_TILE_BYTES;
  const u32_t v_base = k_base + KV_STAGES * K_TILE_BYTES;

  const DTypeIn* q_ptr = static_cast<const DTypeIn*>(p.q);
  // Ragged rows start at the request's first key; paged rows at its first page.
  const i64_t kv_row0 = spec::KV_PAGED ? 0 : kv_start;
  const int* pages = spec::KV_PAGED ? p.kv_page_indices + p.kv_page_indptr[request] : nullptr;
  const KvRowsIn k_rows{static_cast<const KvRowsIn::Elem*>(p.k) + kv_row0 * p.k_stride_token + tile.kv_head * p.k_stride_head,
                        p.k_stride_token, pages, p.k_page_stride, p.page_shift, p.page_mask,
                        kv_scale<spec::KV_FP8>(p.k_scale, p.kv_scale_head_stride, tile.kv_head)};
  const KvRowsIn v_rows{static_cast<const KvRowsIn::Elem*>(p.v) + kv_row0 * p.v_stride_token + tile.kv_head * p.v_stride_head,
                        p.v_stride_token, pages, p.v_page_stride, p.page_shift, p.page_mask,
                        kv_scale<spec::KV_FP8>(p.v_scale, p.kv_scale_head_stride, tile.kv_head)};

  // Shared memory after the K/V buffers: the staged page ids, the K/V source's row bases, the TMA
  // mbarriers, the request's bounds (with policy::BOUNDS_IN_SHARED stored here, before the first
  // copy that reads them; LoopBounds). Then the K/V loads over all of these (KvLoads).
  const u32_t ids_base = v_base + KV_STAGES * V_TILE_BYTES;
  const KvSourceIn kv_src(k_rows, v_rows, ids_base + PAGE_IDS_BYTES);

  const u32_t tma_bars = ids_base + PAGE_IDS_BYTES + KV_BASES_BYTES;
  const SharedBounds bounds{tma_bars + TMA_BARRIER_BYTES};
  if constexpr (policy::BOUNDS_IN_SHARED) bounds.store(m.qo_len, m.kv_len, tok_lo, tok_hi);
  const LoopBounds loop{m, tok_lo, tok_hi, bounds};
  const bool kv_tma = policy::TMA_KV && p.kv_tma != 0;
  const TmaTileTest tma_tile{kv_tma, m};
  const KvLoads kv{p,      tile,    m,        loop,     kv_start, kv_lo,  num_tiles, tma_tile,
                   k_base, v_base, ids_base, tma_bars, k_rows,   v_rows, kv_src};
  // With policy::FIRST_V_LATE, tile 0's S = Q K^T is computed while its V rows still land (their own
  // group, the second of the prologue); before the first P V the CTA waits for them and publishes
  // them. Otherwise the first tile waits for both groups. With one K/V buffer every tile's V rows
  // are the newest group and awaited so; that barrier also tells that every warp is past this
  // tile's S = Q K^T, so with policy::K_FREE_BEFORE_PV the caller then lets tile t + 1's K rows out
  // (otherwise the overflow fallback still reads K_t during P V: after the tile). This hook holds
  // nothing but v_pending: holding more (the K loader) moved ptxas's register allocation of the
  // two-buffer kernels, which do not use it.
  bool v_pending = policy::FIRST_V_LATE;
  auto await_v = [&]() {
    if (v_pending) {
      wait_copies<SINGLE_BUFFER ? 0 : 1>();
      __syncthreads();
      v_pending = false;
    }
  };

  float o[MMA_Q][VO_NT][4];
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int dt = 0; dt < VO_NT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mq][dt][e] = 0.0f;
  Softmax softmax;
  softmax.init();

  if (num_tiles > 0) {
    if (kv_tma) {
      // The barriers, initialised before any thread waits on one (thread 0 issues tile 0's boxes
      // below, after its own initialisation).
      if (threadIdx.x == 0) {
        mbarrier_init_one(kv.tma_bar(0));
        mbarrier_init_one(kv.tma_bar(1));
      }
      __syncthreads();
    }
    {
      // This warp's block of Q rows; lane i works out the address of its row i.
      const int q_row0 = warp * Q_ROWS_PER_WARP;
      const i64_t lane_row =
          lane < Q_ROWS_PER_WARP ? tile.row_offset(q_row0 + lane, qo_start, p.q_stride_token, p.q_stride_head) : 0;
      if constexpr (policy::FP8_FRAGMENTS) {
        // Two elements at a time, each pair where the fp8 fragments' S = Q K^T reads it
        // (fp8_fragments_q_dim).
        for_lane_chunks<Q_ROWS_PER_WARP, QK_CHUNKS * 4>(lane, [&](int r, int w) {
          const i64_t row = shfl_i64(lane_row, r);
          cp_async_4(q_tile.chunk_addr(q_row0 + r, w / 4) + 4 * (w % 4), q_ptr + row + fp8_fragments_q_dim(w),
                     tile.valid(q_row0 + r));
        });
      } else {
        for_lane_chunks<Q_ROWS_PER_WARP, QK_CHUNKS>(lane, [&](int r, int chunk) {
          const i64_t row = shfl_i64(lane_row, r);
          cp_async_16(q_tile.chunk_addr(q_row0 + r, chunk), q_ptr + row + chunk * (16 / sizeof(DTypeIn)),
                      tile.valid(q_row0 + r));
        });
      }
    }
    kv.load_first_tile();
    if constexpr (spec::QK_F16_ACCUM) {
      // Each thread scales the Q chunks it copied itself, once they have landed (with K_0, which
      // the first tile waits for anyway); the first tile's barrier publishes them. Out of the main
      // loop, whose registers it would otherwise share.
      wait_copies<1>();
      prescale_q(q_tile, smem, p.q_prescale, warp, lane);
    }
  }
  // The softmax folds this into its exponent: LOG2E after a transform, the whole scale otherwise
  // (times k_scale with K_SCALE_IN_SOFTMAX).
  const float softmax_scale = VARIANT_HAS_TRANSFORM ? LOG2E : K_SCALE_IN_SOFTMAX ? p.scale_log2 * k_rows.scale : p.scale_log2;
  const FragAddrs frag(q_tile.base, warp_rows.first, lane);
  // With wgmma: the first Q row of this warp's warpgroup, whose products read from it.
  const u32_t q_group_base = q_tile.base + warpgroup * WARPGROUP_ROWS * QTile::ROW_BYTES;
  // The rows' coordinates as the sub-tile loop's logits take them (RowCoords, or FreshRows with
  // policy::LOOP_ROWS_FRESH).
  const FreshRows fresh_rows{tile, warp_rows};
  const StepContext<LoopRows> step{p,         tile,          loop_rows(rows, fresh_rows), loop,        frag, lane,
                                   warpgroup, softmax_scale, q_tile.base,                 q_group_base, k_rows.scale};
  for (int t = 0; t < num_tiles; ++t) {
    if constexpr (SINGLE_BUFFER) {
      // K_t has landed (tile 0: with Q). In flight: tile 0's V rows (the prologue's second group),
      // without policy::K_FREE_BEFORE_PV every tile's (issued after the tile before); with it, V_t goes out
      // here, now that every warp is done with tile t - 1's P V, and lands during S = Q K^T (one
      // barrier per tile fewer: +0.3% to +1.3% at D=256 on the H200; with f16 QK, whose K then
      // still loaded after the tile, the later V cost 4%). V_t is awaited before P V.
      if (!policy::K_FREE_BEFORE_PV || t == 0) {
        wait_copies<1>();
      } else {
        wait_copies<0>();
      }
      __syncthreads();
      if constexpr (policy::K_FREE_BEFORE_PV) {
        if (t > 0) kv.load_v(t);
      }
      v_pending = true;
    } else {
      // K_t and V_t have landed (tile 0: Q and K_0; V_0 too unless policy::FIRST_V_LATE; by the
      // accelerator, both with tile 0).
      if (kv.tma_tile(kv_lo + t * KV_TILE)) mbarrier_wait_parity(kv.tma_bar(t), static_cast<u32_t>(t / 2) & 1u);
      if (t > 0 || !policy::FIRST_V_LATE) {
        wait_copies<0>();
      } else {
        wait_copies<1>();
      }
      __syncthreads();
      // Every warp is done with tile t - 1: tile t + 1 may overwrite its buffers, and loads
      // while this whole tile computes.
      kv.load_kv(t + 1);
    }
    // Not unrolled: sub-tiles share no registers, and unrolling would keep two sets of
    // addresses and fragments live. With key-split warps, warp w takes sub-tiles w, w + NUM_WARPS..
#pragma unroll 1
    for (int sub = WARPS_SPLIT_KEYS ? warp : 0; sub < KV_TILE / KV_SUB; sub += WARPS_SPLIT_KEYS ? NUM_WARPS : 1) {
      const int k0 = kv_lo + t * KV_TILE + sub * KV_SUB;
      if (k0 >= kv_hi) break;  // uniform: the rest of the last tile is masked for every row
      // (wgmma tiles compute whole tiles: sub is 0.) Rows are K_ROW_BYTES (V_ROW_BYTES) apart in
      // every layout.
      // With wgmma the buffer is made warp-uniform for ptxas, so the K and V descriptors are
      // computed in uniform registers (where the loop counter was in a vector register: f16 QK).
      const u32_t stage = WGMMA ? warp_uniform(t % KV_STAGES) : t % KV_STAGES;
      const KTile k_sub{k_base + stage * K_TILE_BYTES + sub * KV_SUB * K_ROW_BYTES};
      const VTile v_sub{v_base + stage * V_TILE_BYTES + sub * KV_SUB * V_ROW_BYTES};
      // Waits for V_t before a P V; with one K/V buffer that barrier also frees K's buffer (every
      // warp is past its reads of K_t), so tile t + 1's K rows then load during P V: the steps of
      // policy::K_FREE_BEFORE_PV (f32 QK: one piece with one buffer; f16 QK with one P V).
      auto await_v_free_k = [&]() {
        await_v();
        if constexpr (SINGLE_BUFFER) kv.load_k(t + 1);
      };
      // The sub-tile's registers: with f16 QK its packed accumulators, and its logits as floats
      // (STEP_KEYS keys at a time). Declared here, not in step_subtile: there they moved ptxas's
      // register choices (the f32-QK wgmma kernels: 8 instructions fewer, a different schedule).
      u32_t acc[MMA_Q][KV_NT][2];
      float s[MMA_Q][STEP_KEYS / 8][4];
      step_subtile(step, k0, k_sub, v_sub, softmax, o, await_v, await_v_free_k, acc, s);
    }
    // fp8: tile t + 1's codes, copied while this tile computed, become its K/V rows.
    if constexpr (!SINGLE_BUFFER) kv.expand_fp8(t + 1);
    if constexpr (SINGLE_BUFFER) {
      if (v_pending) {
        // A warp that took no sub-tile still meets the V barrier (and issues K_{t+1}) once.
        await_v();
        if constexpr (policy::K_FREE_BEFORE_PV) kv.load_k(t + 1);
      }
      if constexpr (!policy::K_FREE_BEFORE_PV) {
        // Every warp is done with V_t and K_t: tile t + 1's rows may overwrite them.
        __syncthreads();
        kv.load_k(t + 1);
        kv.load_v(t + 1);
      }
    }
  }

  if constexpr (WARPS_SPLIT_KEYS) {
    // The K/V buffers are free once every warp is past its last tile (the last real groups were
    // waited for; later ones are empty): they hold the states warp 0 merges, then it alone goes on.
    float* scratch = reinterpret_cast<float*>(smem + Q_TILE_BYTES);
    if (!merge_warp_states<NUM_WARPS>(softmax, o, scratch, warp, lane)) return;
  }
  float lse[MMA_Q][2];
  write_result(CtaResult{p, tile, rows, warp_rows, qo_start, work.w, split, lane, smem, q_tile}, softmax, o, lse);
}

}  // namespace prefill

