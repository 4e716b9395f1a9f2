// prefill.cuh — FA2-class prefill attention for one work item, (request, query tile, KV head, KV
// chunk): the kernel's skeleton. Set-up (the work item, the query tile, the visible KV range, the
// shared-memory map), prologue (Q and the first K/V tile), main loop (per K/V tile: its barrier
// and the next tile's loads, then each sub-tile's step), epilogue (normalise and store, or a
// split plan's partial result).
//
// The pieces, by role: prefill_tile.cuh (the tile's constants, shared-memory map and rows),
// prefill_kv_pipeline.cuh (how Q, K and V reach shared memory; the request's bounds as the loop
// reads them), prefill_products.cuh (S = Q K^T and O += P V by mma.sync or wgmma),
// prefill_step.cuh (a sub-tile's logits, mask, online softmax update and P V, for each
// accumulation variant), prefill_epilogue.cuh. Every tuning choice arrives from Rust as a
// `policy::` constant (src/codegen/policy.rs; `attnforge compile --explain NAME` prints them).
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

// One CTA: one work item, (request, query tile, KV head) over the whole visible KV range, or over
// one chunk of it when the plan splits the KV range. A template (of nothing) so that the branches
// `if constexpr` discards are not instantiated: the wgmma calls, say, do not compile for the other
// tiles' fragments.
template <int = 0>
__device__ __forceinline__ void run_cta(const PrefillParams& p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // --- Set-up. Two loads side by side: the item, and its request's span (what the indptrs hold).
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
  // With wgmma: this warp's warpgroup, and the warp within it (written so that with one warpgroup
  // the compiler sees 0 and `warp`, which it cannot infer from threadIdx).
  const int warpgroup =
      NUM_WARPS > 4 ? (policy::UNIFORM_WARPGROUP ? static_cast<int>(warp_uniform(warp / 4)) : warp / 4) : 0;
  const int warp_in_group = NUM_WARPS > 4 ? warp % 4 : warp;
  const WarpRows warp_rows{WARPS_SPLIT_KEYS ? 0
                           : WGMMA        ? warpgroup * WARPGROUP_ROWS + warp_in_group * 16
                                          : warp * MMA_Q * 16};
  const RowCoords rows = tile.row_coords(warp_rows, lane);

  // The keys this query tile sees; with a split plan, one chunk of them (multiples of the KV tile).
  const int tok_lo = tile.group_div.div(tile.row0);
  const int tok_hi = tile.group_div.div(min(tile.row0 + CTA_Q, tile.packed_len) - 1);
  int kv_lo, kv_hi;
  visible_key_range<spec::MASK_KIND>(m, tok_lo, tok_hi, kv_lo, kv_hi);
  const bool split = p.kv_chunk > 0;
  if (split) {
    const int chunk_lo = work.w * p.kv_chunk;
    kv_lo = max(kv_lo, chunk_lo);
    kv_hi = min(kv_hi, chunk_lo + p.kv_chunk);
  }
  kv_lo = kv_lo / KV_TILE * KV_TILE;
  const int num_tiles = kv_hi > kv_lo ? (kv_hi - kv_lo + KV_TILE - 1) / KV_TILE : 0;

  // The shared-memory map (prefill_tile.cuh); with wgmma every tile 1024-byte aligned.
  const u32_t raw_base = smem_addr(smem_raw);
  const u32_t smem_base = WGMMA ? (raw_base + 1023u) & ~1023u : raw_base;
  unsigned char* const smem = smem_raw + (smem_base - raw_base);
  const QTile q_tile{smem_base};
  const u32_t k_base = q_tile.base + Q_TILE_BYTES;
  const u32_t v_base = k_base + KV_STAGES * K_TILE_BYTES;
  const u32_t ids_base = v_base + KV_STAGES * V_TILE_BYTES;
  const u32_t tma_bars = ids_base + PAGE_IDS_BYTES + KV_BASES_BYTES;

  // K and V rows: ragged rows start at the request's first key; paged rows at its first page.
  const i64_t kv_row0 = spec::KV_PAGED ? 0 : kv_start;
  const int* pages = spec::KV_PAGED ? p.kv_page_indices + p.kv_page_indptr[request] : nullptr;
  const KvRowsIn k_rows{static_cast<const DTypeIn*>(p.k) + kv_row0 * p.k_stride_token + tile.kv_head * p.k_stride_head,
                        p.k_stride_token, pages, p.k_page_stride, p.page_shift, p.page_mask};
  const KvRowsIn v_rows{static_cast<const DTypeIn*>(p.v) + kv_row0 * p.v_stride_token + tile.kv_head * p.v_stride_head,
                        p.v_stride_token, pages, p.v_page_stride, p.page_shift, p.page_mask};
  const KvSource<DTypeIn, spec::KV_PAGED, NUM_THREADS> kv_src(k_rows, v_rows, ids_base + PAGE_IDS_BYTES);
  // The request's bounds as the KV loop takes them (stored here with policy::BOUNDS_IN_SHARED,
  // before the first copy that reads them).
  const LoopBounds bounds{m, tok_lo, tok_hi, SharedBounds{tma_bars + TMA_BARRIER_BYTES}};
  if constexpr (policy::BOUNDS_IN_SHARED) bounds.shared.store(m.qo_len, m.kv_len, tok_lo, tok_hi);
  KvPipeline kv{p,      m.kv_len,        bounds, kv_lo,  num_tiles, kv_start, tile.kv_head,         k_base,
                v_base, ids_base, tma_bars, k_rows, v_rows,    kv_src,   policy::TMA_KV && p.kv_tma != 0,
                policy::FIRST_V_LATE};

  float o[MMA_Q][VO_NT][4];
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int dt = 0; dt < VO_NT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mq][dt][e] = 0.0f;
  Softmax softmax;
  softmax.init();

  // --- Prologue: Q and tile 0.
  if (num_tiles > 0) kv.load_prologue(tile, q_tile, static_cast<const DTypeIn*>(p.q), qo_start, smem, warp, lane);

  // --- Main loop.
  const FragAddrs frag(q_tile.base, warp_rows.first, lane);
  const FreshRows fresh_rows{tile, warp_rows};
  // The softmax folds its scale into the exponent: LOG2E after a transform, the whole scale
  // otherwise.
  const StepContext step{p,
                         tile,
                         rows,
                         fresh_rows,
                         bounds,
                         frag,
                         lane,
                         warpgroup,
                         VARIANT_HAS_TRANSFORM ? LOG2E : p.scale_log2,
                         q_tile.base,
                         q_tile.base + warpgroup * WARPGROUP_ROWS * QTile::ROW_BYTES};
  for (int t = 0; t < num_tiles; ++t) {
    kv.begin_tile(t);
    // Not unrolled: sub-tiles share no registers, and unrolling would keep two sets of addresses
    // and fragments live. With key-split warps, warp w takes sub-tiles w, w + NUM_WARPS..
#pragma unroll 1
    for (int sub = WARPS_SPLIT_KEYS ? warp : 0; sub < KV_TILE / KV_SUB; sub += WARPS_SPLIT_KEYS ? NUM_WARPS : 1) {
      const int k0 = kv_lo + t * KV_TILE + sub * KV_SUB;
      if (k0 >= kv_hi) break;  // uniform: the rest of the last tile is masked for every row
      // With wgmma the buffer index is made warp-uniform for ptxas, so the K and V descriptors are
      // computed in uniform registers. Rows are ROW_BYTES apart in either layout.
      const u32_t stage = WGMMA ? warp_uniform(t % KV_STAGES) : t % KV_STAGES;
      const u32_t k_sub = k_base + stage * K_TILE_BYTES + sub * KV_SUB * KTile::ROW_BYTES;
      const u32_t v_sub = v_base + stage * V_TILE_BYTES + sub * KV_SUB * VTile::ROW_BYTES;
      step_subtile(step, kv, t, k0, k_sub, v_sub, softmax, o);
    }
    kv.end_tile(t);
  }

  // --- Epilogue.
  if constexpr (WARPS_SPLIT_KEYS) {
    // The K/V buffers are free once every warp is past its last tile (the last real groups were
    // waited for; later ones are empty): they hold the states warp 0 merges, then it alone goes on.
    float* scratch = reinterpret_cast<float*>(smem + Q_TILE_BYTES);
    if (!merge_warp_states<NUM_WARPS>(softmax, o, scratch, warp, lane)) return;
  }
  write_result(CtaOutput{p, tile, warp_rows, qo_start, work.w, split, lane, smem, q_tile.base}, softmax, o);
}

}  // namespace prefill
