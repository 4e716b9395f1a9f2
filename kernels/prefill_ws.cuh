// prefill_ws.cuh — the warp-specialised Hopper prefill kernel (sm_90a): run_ws_cta is a
// persistent CTA that computes the work items (request, query tile, KV head) at positions
// blockIdx.x, blockIdx.x + gridDim.x, .. of the work list, up to an end marker (the host balances
// the CTAs' items: cuda/plan.rs), each over its whole visible KV range (with a split plan, over
// its KV chunk, ending in a partial result for the merge kernel), with the roles of
// FlashAttention-3's published technique:
//
// - warpgroup 0 produces: after giving back registers (setmaxnreg.dec), it fills a ring of
//   WS_STAGES K/V stages (ws_pipeline.cuh), K one tile ahead of V: its thread 0 issues the TMA
//   boxes of a whole tile's K rows, or V rows, on their full mbarrier (expect-tx); a request's
//   last, partial tile is copied by the warpgroup's cp.async with the rows past the request
//   zero-filled, then announced on the same barriers. Over a paged cache every tile is copied by
//   the warpgroup's cp.async, each row from its page, and each thread's copies arrive on the full
//   barrier as they land, so the producer never waits for its own copies;
// - warpgroups 1 to WS_CONSUMERS consume (setmaxnreg.inc), each owning 64 of the CTA's packed
//   query rows (two: 128 rows; three, at head dim 64: 192; the tile's spec constants describe
//   these warpgroups: prefill_tile.cuh): S = Q K^T
//   and O += P V by wgmma, the variant, the mask and the online softmax of the shared step
//   (prefill_step.cuh), the stores of prefill_epilogue.cuh; with f16 QK accumulation S is
//   accumulated in f16 and widened to f32 before the logits (ws_widen_s);
// - the consumers take turns at the tensor cores in a fixed rotation (one named barrier each): a
//   warpgroup issues its products of a turn (S_j = Q K_j^T, then P_{j-1} V_{j-1}) and hands the
//   turn to the next, so that its softmax runs while the others' products do;
// - inside a warpgroup, the softmax of S_j runs while P_{j-1} V_{j-1} is still being computed:
//   the update's rescale of the output is collected as factors and applied once that product is
//   done (nothing is in flight from one tile to the next, so ptxas keeps the products async).
//
// Per consumer warpgroup, tile j: [turn: S_j; P_{j-1} V_{j-1}]; wait for S_j and release K_j;
// logits, mask and softmax update; wait for P_{j-1} V_{j-1} and release V_{j-1}; rescale o; P_j
// packed to registers. Tile 0's S and the last tile's P V take a turn each. Tiles of 64 or 128
// keys (KV_TILE): with 64 at head dims 64 and 128, Q is read into registers once per item (S =
// Q K^T takes it as A fragments), so each warp then loads its next item's Q rows into the same Q
// tile while this one computes; otherwise S = Q K^T reads Q from shared memory
// (WS_Q_IN_REGISTERS), and the next item's rows go to a second Q tile. The output is staged in a
// region of its own, except where that region and a second Q tile would not fit beside the ring
// (head dims 256 and (192, 128)): there the output is staged in the item's Q tile, whose rows the
// products no longer read, and each warp loads its next item's Q rows after its stores
// (spec::WS_OUTPUT_IN_Q_TILE). The ring's tiles count on across items, so the producer runs ahead
// into the next item's.
// Requires: everything prefill.cuh does, and ws_pipeline.cuh.

namespace prefill {

constexpr int WS_STAGES = spec::WS_KV_STAGES;
constexpr int WS_PRODUCER_THREADS = 128;
// Consumer warpgroups: two, or three at head dim 64 (TileConfig::ws_consumers), where a tile's
// products take half as long as at 128 and two softmaxes can run under one warpgroup's.
constexpr int WS_CONSUMERS = NUM_WARPS / 4;
constexpr int WS_THREADS = WS_PRODUCER_THREADS + NUM_THREADS;
// The output's staging area: the CTA's rows, 16-byte chunks (prefill_epilogue.cuh's row layout),
// in a region of its own unless it is the Q tile (spec::WS_OUTPUT_IN_Q_TILE, the host's choice:
// TileConfig::ws_output_in_q_tile).
constexpr bool WS_OUTPUT_IN_Q_TILE = spec::WS_OUTPUT_IN_Q_TILE;
// In the Q tile it takes that tile's column layout, so that each warp's rows there are the Q rows
// of its own (which only its warpgroup's products read); in its own region, rows.
constexpr int O_STAGE_BYTES = WS_OUTPUT_IN_Q_TILE ? 0 : CTA_Q * VO_CHUNKS * 16;
using OStage = SmemTile<VO_CHUNKS, WS_OUTPUT_IN_Q_TILE ? Q_ATOM_ROWS : 0>;
// Where S = Q K^T reads Q: with 64-key tiles at head dims 64 and 128 each warp holds its rows as
// A fragments (32 registers at head dim 128), read once per item, so one Q tile takes the next
// item's rows while this one computes; with 128-key tiles the logits of a tile take those
// registers, and at head dim 256 the output's do (128 a thread), so the products read Q from
// shared memory (m64n128k16 with both operands there: 6 KB per 64 cycles of the tensor cores)
// and the next item's rows go to a second Q tile, or, with the output staged in the Q tile,
// follow the item's stores into the same one.
constexpr bool WS_Q_IN_REGISTERS = KV_TILE == 64 && QK_CHUNKS <= 16;
constexpr bool WS_Q_AHEAD = !WS_OUTPUT_IN_Q_TILE;  // the next item's Q copied during this one
constexpr int WS_Q_TILES = WS_Q_IN_REGISTERS || !WS_Q_AHEAD ? 1 : 2;
// Registers per thread after the hand-over: 40 x 128 + 232 x 256 (or 24 x 128 + 240 x 256) = 64512
// of the SM's 65536, as many as the launch's 168 x 384 (ptxas's cap for 384 threads). With
// 128-key tiles the consumers hold 64 logits, 32 of P and 64 of O; at 232 registers ptxas spilled
// 4 to 88 bytes of them (head dim 128; `attnforge compile --arch sm_90a --filter ws2q1kv128`),
// at 240 none but with a custom mask, and the producer's TMA loop fits 24. The same 240 where the
// products read Q from shared memory at head dim 256 (128 of O, 32 logits, 16 of P).
// With three consumer warpgroups (head dim 64: 32 of O, at most 64 logits and 32 of P) 32 x 128 +
// 160 x 384 = 65536, the launch's 128 x 512.
constexpr int WS_PRODUCER_REGS = WS_CONSUMERS == 3 ? 32 : KV_TILE == 128 || !WS_Q_IN_REGISTERS ? 24 : 40;
constexpr int WS_CONSUMER_REGS = WS_CONSUMERS == 3 ? 160 : KV_TILE == 128 || !WS_Q_IN_REGISTERS ? 240 : 232;
constexpr int WS_SMEM_BYTES = WS_Q_TILES * Q_TILE_BYTES + WS_STAGES * (K_TILE_BYTES + V_TILE_BYTES) + O_STAGE_BYTES +
                              4 * WS_STAGES * 8 + SMEM_ALIGN_SLACK;
// Named barriers (0 is __syncthreads): the producer warpgroup's copies of a partial tile (1), each
// consumer warpgroup's turn at the tensor cores (4, 5 and with three consumers 6).
constexpr u32_t WS_BAR_PRODUCER = 1, WS_BAR_TURN = 4;

static_assert(WGMMA && (NUM_WARPS == 8 || (NUM_WARPS == 12 && QK_CHUNKS == 8 && VO_CHUNKS == 8)) && MMA_Q == 1 &&
                  (KV_TILE == 64 || KV_TILE == 128) && KV_SUB == KV_TILE && spec::KV_FP8 == KV_FP8_NONE,
              "warp-specialised tile: two consumer warpgroups of 64 rows (three at head dim 64), 64- or 128-key tiles, "
              "f16/bf16 K/V");
static_assert(!WS_OUTPUT_IN_Q_TILE || !WS_Q_IN_REGISTERS,
              "the output staged in the Q tile: the products read Q from there, so its rows are free only after them");
// Arrivals that complete a full barrier's phase: the producer's thread 0 (with its TMA bytes), or
// over a paged cache each producer thread's cp.async copies (ws::cp_async_arrive).
constexpr u32_t WS_FULL_ARRIVALS = spec::KV_PAGED ? WS_PRODUCER_THREADS : 1;
// Keys per TMA box (the host's tensor maps, src/cuda/tma.rs): a tile's column group is copied as
// KV_TILE / WS_BOX_ROWS boxes.
constexpr int WS_BOX_ROWS = 64;
static_assert(WS_STAGES >= 2, "tile j + 1 lands while tile j is computed");
static_assert(!policy::SUM_BY_MMA, "the row sums are rescaled by the softmax update, before the output is");
static_assert(WS_PRODUCER_REGS * WS_PRODUCER_THREADS + WS_CONSUMER_REGS * NUM_THREADS <= 65536, "register file");

using WsRing = ws::KvRing<WS_STAGES, KTile, VTile, K_TILE_BYTES, V_TILE_BYTES>;

// One work item as a CTA of either role sees it: its request's bounds, query tile, token range and
// visible KV tiles (run_cta's set-up): with a split plan, those of its KV chunk only.
struct WsItem {
  RequestMaskContext m;
  QueryTile tile;
  int qo_start, kv_start;
  int tok_lo, tok_hi;
  int kv_lo, num_tiles;
  int chunk;         // the KV chunk, with a split plan (p.kv_chunk > 0)
  const int* pages;  // paged: the request's page ids, in token order
};

// Work item `index` of the list into `it`; false at an end marker (request -1).
__device__ __forceinline__ bool ws_item(const PrefillParams& p, int index, WsItem& it) {
  const int4 work = p.work[2 * index];      // (request, query tile, kv head, kv chunk)
  if (work.x < 0) return false;
  const int4 span = p.work[2 * index + 1];  // (qo start, qo len, kv start, kv len)
  it.qo_start = span.x;
  it.kv_start = span.z;
  it.m.qo_len = span.y;
  it.m.kv_len = span.w;
  it.m.window_left = p.window_left;
  it.m.custom_bits = spec::MASK_KIND == MASK_CUSTOM ? p.custom_mask + p.mask_indptr[work.x] : nullptr;
  it.tile.row0 = work.y * CTA_Q;
  it.tile.packed_len = it.m.qo_len * p.group_size;
  it.tile.kv_head = work.z;
  it.tile.group = p.group_size;
  it.tile.group_div = FastDivisor{p.group_div_magic, p.group_div_shift};
  it.tok_lo = it.tile.group_div.div(it.tile.row0);
  it.tok_hi = it.tile.group_div.div(min(it.tile.row0 + CTA_Q, it.tile.packed_len) - 1);
  int kv_hi;
  visible_key_range<spec::MASK_KIND>(it.m, it.tok_lo, it.tok_hi, it.kv_lo, kv_hi);
  it.chunk = work.w;
  it.pages = spec::KV_PAGED ? p.kv_page_indices + p.kv_page_indptr[work.x] : nullptr;
  if (p.kv_chunk > 0) {  // a chunk's bounds are multiples of the KV tile
    const int chunk_lo = work.w * p.kv_chunk;
    it.kv_lo = max(it.kv_lo, chunk_lo);
    kv_hi = min(kv_hi, chunk_lo + p.kv_chunk);
  }
  it.kv_lo = it.kv_lo / KV_TILE * KV_TILE;
  it.num_tiles = kv_hi > it.kv_lo ? (kv_hi - it.kv_lo + KV_TILE - 1) / KV_TILE : 0;
  return true;
}

// Over a paged cache each producer warp copies WS_WARP_ROWS consecutive rows of a tile, 16 at a
// time (a pass), each row by two lanes: lane l takes row l % 16 of the pass and, of its chunks,
// every other one from l / 16, so the two lanes of a row read 32 contiguous bytes (a whole
// sector) per copy. A lane reads the page ids of its rows once per tile, a tile ahead
// (ws_produce), and forms each row's address once; its copies of a row then differ by constants.
// (With one lane per row, at 128-key tiles, a copy read half a sector and the kernel ran at 0.67x
// of the planner's paged prefill on an H200; `attnforge bench --suite paged --filter
// paged-prefill --tile ws2q1kv128`.)
constexpr int WS_WARP_ROWS = KV_TILE / (WS_PRODUCER_THREADS / 32);
constexpr int WS_ROW_PASSES = WS_WARP_ROWS / 16;
static_assert(WS_WARP_ROWS % 16 == 0, "whole passes of 16 rows");

// A producer thread's page ids of a tile, one per pass.
struct WsPageIds {
  int id[WS_ROW_PASSES];
};

// Producer thread, paged: the tile row (0..KV_TILE) it copies in pass `pass`.
__device__ __forceinline__ int ws_paged_row(int pass) {
  return (threadIdx.x / 32) * WS_WARP_ROWS + pass * 16 + threadIdx.x % 16;
}

// Producer thread, paged: the page ids of its rows of the tile from key k0 of item `it` (0 for a
// row past the request, which has no page).
__device__ __forceinline__ WsPageIds ws_row_page_ids(const PrefillParams& p, const WsItem& it, int k0) {
  WsPageIds ids;
#pragma unroll
  for (int q = 0; q < WS_ROW_PASSES; ++q) {
    const int row = k0 + ws_paged_row(q);
    ids.id[q] = row < it.m.kv_len ? __ldg(it.pages + (row >> p.page_shift)) : 0;
  }
  return ids;
}

// Producer thread, paged: its chunks of its rows of the tile from key k0 of one KV head (`head`:
// its element offset inside page 0) into `tile` by cp.async, a row zero-filled when it is at or
// past `valid_rows` (relative to k0); `ids` are ws_row_page_ids'.
template <int CHUNKS, int ATOM_ROWS>
__device__ __forceinline__ void ws_copy_paged_rows(const SmemTile<CHUNKS, ATOM_ROWS>& tile, const DTypeIn* head,
                                                   i64_t token_stride, i64_t page_stride, int k0, int valid_rows,
                                                   int page_mask, const WsPageIds& ids) {
  static_assert(ATOM_ROWS > 0, "wgmma's column layout: 128 bytes a row in each column of 8 chunks");
  constexpr int ELEMS = 16 / sizeof(DTypeIn);
  const int part = (threadIdx.x % 32) / 16;
#pragma unroll
  for (int q = 0; q < WS_ROW_PASSES; ++q) {
    const int row = ws_paged_row(q);
    const bool valid = row < valid_rows;
    const DTypeIn* src =
        (valid ? head + ids.id[q] * page_stride + ((k0 + row) & page_mask) * token_stride : head) + part * ELEMS;
    // Chunk 2 c + part, at tile.chunk_addr(row, 2 c + part): the swizzle's XOR of the chunk's
    // position with row % 8 splits into a constant and (part ^ row % 8).
    const u32_t row_base = tile.base + static_cast<u32_t>(row * 128);
    const u32_t swz = static_cast<u32_t>((part ^ (row & 7)) * 16);
#pragma unroll
    for (int c = 0; c < CHUNKS / 2; ++c) {
      const int first = 2 * c;  // the chunk of part 0
      const u32_t dst = row_base + static_cast<u32_t>((first / 8) * SmemTile<CHUNKS, ATOM_ROWS>::GROUP_BYTES) +
                        (swz ^ static_cast<u32_t>((first % 8) * 16));
      cp_async_16(dst, src + first * ELEMS, valid);
    }
  }
}

// The producer warpgroup: the K rows (IS_K) or V rows of tile j of item `it` into the ring as ring
// tile t, announced on their full barrier: over ragged K/V, a whole tile by thread 0's TMA boxes
// and a request's last, partial tile by the warpgroup's cp.async with the rows past the request
// zero-filled (a box would read the next request's rows); over a paged cache, every tile by
// cp.async (ws_copy_paged_rows), each thread's copies arriving on the barrier as they land.
// `ids`: over a paged cache, ws_row_page_ids' for the tile (unused otherwise).
template <bool IS_K>
__device__ __forceinline__ void ws_produce_rows(const PrefillParams& p, const WsRing& ring, const WsItem& it, int j,
                                                int t, const WsPageIds& ids) {
  constexpr ws::Rows ROWS = IS_K ? ws::Rows::K : ws::Rows::V;
  constexpr int CHUNKS = IS_K ? QK_CHUNKS : VO_CHUNKS;
  using Tile = SmemTile<CHUNKS, KV_ATOM_ROWS>;
  const Tile tile{IS_K ? ring.k(t).base : ring.v(t).base};
  const int k0 = it.kv_lo + j * KV_TILE;
  ring.wait_empty(ROWS, t);
  if constexpr (spec::KV_PAGED) {
    const DTypeIn* head = static_cast<const DTypeIn*>(IS_K ? p.k : p.v) +
                          it.tile.kv_head * (IS_K ? p.k_stride_head : p.v_stride_head);
    ws_copy_paged_rows(tile, head, IS_K ? p.k_stride_token : p.v_stride_token, IS_K ? p.k_page_stride : p.v_page_stride,
                       k0, it.m.kv_len - k0, p.page_mask, ids);
    ws::cp_async_arrive(ring.full(ROWS, t));
  } else if (it.m.kv_len - k0 >= KV_TILE) {
    if (threadIdx.x == 0) {
      const u32_t bar = ring.full(ROWS, t);
      mbarrier_arrive_expect_tx(bar, IS_K ? K_TILE_BYTES : V_TILE_BYTES);
      const int row = it.kv_start + k0;
#pragma unroll
      for (int b = 0; b < KV_TILE / WS_BOX_ROWS; ++b)
#pragma unroll
        for (int g = 0; g < CHUNKS / 8; ++g)
          tma_load_3d(tile.base + g * Tile::GROUP_BYTES + b * WS_BOX_ROWS * 128, IS_K ? &p.k_tmap : &p.v_tmap,
                      g * 64, it.tile.kv_head, row + b * WS_BOX_ROWS, bar);
    }
  } else {
    const i64_t stride_token = IS_K ? p.k_stride_token : p.v_stride_token;
    const i64_t stride_head = IS_K ? p.k_stride_head : p.v_stride_head;
    const DTypeIn* first =
        static_cast<const DTypeIn*>(IS_K ? p.k : p.v) + it.kv_start * stride_token + it.tile.kv_head * stride_head;
    if constexpr (WS_PRODUCER_THREADS % CHUNKS == 0) {
      const KvRowsIn rows{first, stride_token, nullptr, 0, 0, 0};
      load_kv_rows_async<KV_TILE, CHUNKS, WS_PRODUCER_THREADS>(tile, rows, k0, it.m.kv_len - k0);
    } else {
      // Rows whose chunks do not divide over the warpgroup (head dim 192): a loop, not unrolled,
      // since every chunk's address is its own and the producer holds 24 registers (unrolled,
      // ptxas spilled about 700 bytes of them); it runs once per request.
      const int valid_rows = it.m.kv_len - k0;
      first += k0 * stride_token;
#pragma unroll 1
      for (int idx = threadIdx.x; idx < KV_TILE * CHUNKS; idx += WS_PRODUCER_THREADS) {
        const int row = idx / CHUNKS, chunk = idx % CHUNKS;
        const bool valid = row < valid_rows;
        cp_async_16(tile.chunk_addr(row, chunk), first + (valid ? row * stride_token : 0) + chunk * (16 / sizeof(DTypeIn)),
                    valid);
      }
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async_shared();
    ws::named_sync(WS_BAR_PRODUCER, WS_PRODUCER_THREADS);
    if (threadIdx.x == 0) ws::mbarrier_arrive(ring.full(ROWS, t));
  }
}

// The producer warpgroup: every K/V tile of item `it` into the ring, as ring tiles first,
// first + 1, ..; the K rows one tile ahead of the V rows (K_0, K_1, V_0, K_2, V_1, ..), in the order
// the consumers free them: K_{j+2} waits for the consumers' S_j, not for their P_j V_j. Over a
// paged cache, the page ids of tile j + 1 are read while tile j's copies are issued, and tile j's
// serve its K and then its V rows.
__device__ __forceinline__ void ws_produce(const PrefillParams& p, const WsRing& ring, const WsItem& it, int first) {
  const int n = it.num_tiles;
  const WsPageIds none{};
  WsPageIds ids_k = spec::KV_PAGED && n > 0 ? ws_row_page_ids(p, it, it.kv_lo) : none, ids_v = none;
  for (int j = 0; j <= n; ++j) {
    const WsPageIds ids_next =
        spec::KV_PAGED && j + 1 < n ? ws_row_page_ids(p, it, it.kv_lo + (j + 1) * KV_TILE) : none;
    if (j < n) ws_produce_rows<true>(p, ring, it, j, first + j, ids_k);
    if (j > 0) ws_produce_rows<false>(p, ring, it, j - 1, first + j - 1, ids_v);
    ids_v = ids_k;
    ids_k = ids_next;
  }
}

// Consumer: after waiting on a full barrier, over a paged cache, the rows the producer's cp.async
// wrote (generic proxy) ordered before the products' reads of them (async proxy).
__device__ __forceinline__ void ws_rows_to_products() {
  if constexpr (spec::KV_PAGED) fence_proxy_async_shared();
}

// Consumer warp `cwarp` (0..7): the copies of its block of Q rows of item `it` into the Q tile
// (its own rows, which only it reads), as one cp.async group, not waited for.
__device__ __forceinline__ void ws_load_q_async(const PrefillParams& p, const WsItem& it, const QTile& q_tile,
                                                int cwarp, int lane) {
  const int q_row0 = cwarp * Q_ROWS_PER_WARP;
  const i64_t lane_row =
      lane < Q_ROWS_PER_WARP ? it.tile.row_offset(q_row0 + lane, it.qo_start, p.q_stride_token, p.q_stride_head) : 0;
  const DTypeIn* q_ptr = static_cast<const DTypeIn*>(p.q);
  for_lane_chunks<Q_ROWS_PER_WARP, QK_CHUNKS>(lane, [&](int r, int chunk) {
    const i64_t row = shfl_i64(lane_row, r);
    cp_async_16(q_tile.chunk_addr(q_row0 + r, chunk), q_ptr + row + chunk * (16 / sizeof(DTypeIn)),
                it.tile.valid(q_row0 + r));
  });
  cp_async_commit();
}

// d (+)= A B, m64n64k16, f32 accumulators, A from registers (the m16n8k16 A fragment of the
// warp's 16 rows), B K-major from shared memory; `accumulate` false overwrites d.
__device__ __forceinline__ void wgmma_m64n64k16_rs_kmajor(float (&d)[8][4], const u32_t (&a)[4], u64_t b_desc,
                                                          bool accumulate) {
  if constexpr (DTypeTraits<DTypeIn>::IS_BF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " AF_WGMMA_D32_TEXT
                 ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}"
                 : AF_WGMMA_D32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(static_cast<int>(accumulate)));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " AF_WGMMA_D32_TEXT
                 ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}"
                 : AF_WGMMA_D32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(static_cast<int>(accumulate)));
  }
}

// d (+)= A B, m64n128k16, f32 accumulators, A and B (K-major) from shared memory.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[16][4], u64_t a_desc, u64_t b_desc, bool accumulate) {
  if constexpr (DTypeTraits<DTypeIn>::IS_BF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " AF_WGMMA_D64_TEXT
                 ", %64, %65, p, 1, 1, 0, 0;\n}"
                 : AF_WGMMA_D64(d)
                 : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " AF_WGMMA_D64_TEXT
                 ", %64, %65, p, 1, 1, 0, 0;\n}"
                 : AF_WGMMA_D64(d)
                 : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)));
  }
}

// d (+)= A B, m64n64k16, f16 inputs and f16 accumulators, A from registers, B K-major from shared
// memory (the f16-QK twin of the f32 one; d in wgmma_m64n64k16_ss_f16acc's layout).
__device__ __forceinline__ void wgmma_m64n64k16_rs_kmajor(u32_t (&d)[8][2], const u32_t (&a)[4], u64_t b_desc,
                                                          bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f16.f16.f16 " AF_WGMMA_H16_TEXT
               ", {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}"
               : AF_WGMMA_H16(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(static_cast<int>(accumulate)));
}

// d (+)= A B, m64n128k16, f16 inputs and f16 accumulators, A and B (K-major) from shared memory
// (the f16-QK twin of the f32 one: 16 n8 tiles of two f16x2 registers).
__device__ __forceinline__ void wgmma_m64n128k16_ss(u32_t (&d)[16][2], u64_t a_desc, u64_t b_desc, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f16.f16.f16 " AF_WGMMA_D32_TEXT
               ", %32, %33, p, 1, 1, 0, 0;\n}"
               : AF_WGMMA_H16(d), AF_WGMMA_H16_AT(d, 8)
               : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)));
}

// This warp's Q rows as the A fragments of S = Q K^T, one per k16 step, read once from the Q tile:
// the products then read only K from shared memory (with Q there too, two warpgroups' m64n64k16
// products and the TMA copies together would ask for all of the SM's shared-memory bandwidth).
// (A template on the fragments' count, which is 1 where Q stays in shared memory and the call is
// discarded.)
template <int KK>
__device__ __forceinline__ void ws_load_q_fragments(const FragAddrs& f, u32_t (&qf)[KK][4]) {
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) ldmatrix_x4(qf[kk], f.q.at(f.q_base, 0, kk * 2));
}

// Q as this warp's products read it (WS_Q_IN_REGISTERS): its A fragments, or the address of its
// warpgroup's first row in the item's Q tile.
struct WsQ {
  u32_t frags[WS_Q_IN_REGISTERS ? QK_CHUNKS / 2 : 1][4];
  u32_t group_rows;
};

// S = Q K^T for one tile (K rows from `k_base`), issued as one wgmma group (not waited for), into
// f32 accumulators (float, E = 4 a tile) or, with f16 QK accumulation (Q prescaled), f16 ones
// (two f16x2 registers a tile: E = 2).
// (A template on the n8 tiles of S, so that the product of the other width is not instantiated.)
template <int NT, typename Acc, int E>
__device__ __forceinline__ void ws_issue_qk(const WsQ& q, u32_t k_base, Acc (&s)[MMA_Q][NT][E]) {
  static_assert(NT * 8 == KV_TILE && (NT == 8 || !WS_Q_IN_REGISTERS),
                "S covers the tile's keys: 64 with Q in registers, 64 or 128 with Q in shared memory");
  const WgmmaDesc k = WgmmaDesc::sw128(k_base, 16, SW128_GROUP_BYTES);
  const WgmmaDesc a = WgmmaDesc::sw128(q.group_rows, 16, SW128_GROUP_BYTES);
#pragma unroll
  for (int kk = 0; kk < QK_CHUNKS / 2; ++kk) {
    const u64_t k_desc = k.at((kk / 4) * KTile::GROUP_BYTES + (kk % 4) * 32);
    const u64_t q_desc = a.at((kk / 4) * QTile::GROUP_BYTES + (kk % 4) * 32);
    if constexpr (NT == 16) {
      wgmma_m64n128k16_ss(s[0], q_desc, k_desc, kk > 0);
    } else if constexpr (WS_Q_IN_REGISTERS) {
      wgmma_m64n64k16_rs_kmajor(s[0], q.frags[kk], k_desc, kk > 0);
    } else if constexpr (E == 4) {
      wgmma_m64n64k16_ss<DTypeIn>(reinterpret_cast<float(&)[8][4]>(s[0]), q_desc, k_desc, kk > 0);
    } else {
      wgmma_m64n64k16_ss_f16acc(reinterpret_cast<u32_t(&)[8][2]>(s[0]), q_desc, k_desc, kk > 0);
    }
  }
  wgmma_commit();
}

// f16 QK accumulation: this warp's Q rows times p.q_prescale, rounded to f16 (as prescale_q scales
// the Q tile of the other kernels), once per item: its A fragments (WS_Q_IN_REGISTERS), or its rows
// of the Q tile at `q_tile`, each thread's own copies (ws_load_q_async's), which it has waited for.
__device__ __forceinline__ void ws_prescale_q(const PrefillParams& p, WsQ& q, const QTile& q_tile,
                                              unsigned char* q_bytes, int cwarp, int lane) {
  if constexpr (WS_Q_IN_REGISTERS) {
    const u32_t s2 = DTypeTraits<f16_t>::pack2(p.q_prescale, p.q_prescale);
#pragma unroll
    for (int kk = 0; kk < QK_CHUNKS / 2; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) q.frags[kk][r] = f16x2_mul(q.frags[kk][r], s2);
  } else {
    prescale_q(q_tile, q_bytes, p.q_prescale, cwarp, lane);
  }
}

// The Q and K fragments' addresses of the f16-QK overflow fallback (widen_f16): this warp's Q rows
// as its prescaled A fragments (WS_Q_IN_REGISTERS), or in the Q tile through `f`, which also
// locates the K rows.
struct WsQkFrags {
  const WsQ& q;
  FragAddrs f;
};

// qk_tile_f32 of the warp-specialised kernel: n8 tile `nt` of S = Q K^T with f32 accumulators by
// this warp's mma.sync, K rows from `k_base` (m16 tile 0: a warp holds 16 rows).
__device__ __forceinline__ void qk_tile_f32(const WsQkFrags& w, u32_t k_base, int, int nt, float (&c)[4]) {
  c[0] = c[1] = c[2] = c[3] = 0.0f;
  // Unrolled with Q in registers (an indexed fragment would go to the stack); else a loop.
#pragma unroll(WS_Q_IN_REGISTERS ? QK_CHUNKS / 2 : 1)
  for (int kk = 0; kk < QK_CHUNKS / 2; ++kk) {
    u32_t a[4], b[4];
    if constexpr (WS_Q_IN_REGISTERS) {
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = w.q.frags[kk][r];
    } else {
      ldmatrix_x4(a, w.f.q.at(w.f.q_base, 0, kk * 2));
    }
    ldmatrix_x4(b, w.f.k.at(k_base, (nt / 2) * 16, kk * 2));
    mma_f32acc<DTypeIn>(c, a, b[2 * (nt % 2)], b[2 * (nt % 2) + 1]);
  }
}

// f16 QK accumulation: the S_j accumulators `acc` (waited for) widened into the logits `s`
// (widen_f16), an overflowed n8 tile computed again with f32 accumulators from K_j's rows at
// `k_base`, which the caller releases only after this.
template <int NT>
__device__ __forceinline__ void ws_widen_s(const WsQ& q, const FragAddrs& f, u32_t k_base,
                                           const u32_t (&acc)[MMA_Q][NT][2], float (&s)[MMA_Q][NT][4]) {
  widen_f16(WsQkFrags{q, f}, k_base, acc, 0, f16_accumulators_finite<false>(acc, 0), s);
}

// O += P V for one tile, issued as one wgmma group (not waited for): P as the A fragments
// of its four k16 blocks, V N-major from `v_base`.
__device__ __forceinline__ void ws_issue_pv(u32_t v_base, const u32_t (&pf)[KV_NT / 2][MMA_Q][4],
                                            float (&o)[MMA_Q][VO_NT][4]) {
  const WgmmaDesc v = WgmmaDesc::sw128(v_base, VTile::GROUP_BYTES, SW128_GROUP_BYTES);
#pragma unroll
  for (int kk = 0; kk < KV_NT / 2; ++kk)
#pragma unroll
    for (int db = 0; db < VO_NT / 8; ++db)
      wgmma_m64n64k16_rs_nmajor<DTypeIn>(reinterpret_cast<float(&)[8][4]>(o[0][db * 8]), pf[kk][0],
                                         v.at(db * VTile::GROUP_BYTES + kk * 16 * 128));
  wgmma_commit();
}

// One persistent CTA of the warp-specialised kernel (see the file comment): the work items at
// positions blockIdx.x, blockIdx.x + gridDim.x, .. until an end marker. A template for the reason run_cta
// is one.
template <int = 0>
__device__ __forceinline__ void run_ws_cta(const PrefillParams& p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const u32_t raw_base = smem_addr(smem_raw);
  const u32_t smem_base = (raw_base + 1023u) & ~1023u;
  // Q tile `buf` (of WS_Q_TILES), by address arithmetic (an array of them indexed at run time
  // went to the stack).
  auto q_tile = [&](int buf) { return QTile{smem_base + static_cast<u32_t>(buf * Q_TILE_BYTES)}; };
  const u32_t k_base = smem_base + WS_Q_TILES * Q_TILE_BYTES;
  const u32_t v_base = k_base + WS_STAGES * K_TILE_BYTES;
  const u32_t o_stage = WS_OUTPUT_IN_Q_TILE ? q_tile(0).base : v_base + WS_STAGES * V_TILE_BYTES;
  const WsRing ring{k_base, v_base, v_base + WS_STAGES * V_TILE_BYTES + O_STAGE_BYTES};
  static_assert(WsRing::BARRIER_BYTES == 4 * WS_STAGES * 8, "the ring's barriers as WS_SMEM_BYTES counts them");
  if (threadIdx.x == 0) ring.init(WS_FULL_ARRIVALS, NUM_THREADS);
  __syncthreads();

  if (warp < WS_PRODUCER_THREADS / 32) {
    ws::registers_dec<WS_PRODUCER_REGS>();
    int first = 0;  // ring tiles of the items before
    WsItem it;
    for (int i = blockIdx.x; ws_item(p, i, it); i += gridDim.x) {
      ws_produce(p, ring, it, first);
      first += it.num_tiles;
    }
    if constexpr (spec::KV_PAGED) cp_async_wait<0>();  // no copy outlives its thread
    return;
  }
  ws::registers_inc<WS_CONSUMER_REGS>();

  // This consumer warpgroup (0 .. WS_CONSUMERS - 1) and warp (0 .. NUM_WARPS - 1 over all of them).
  const int consumer = static_cast<int>(warp_uniform(warp / 4 - 1));
  const int cwarp = warp - WS_PRODUCER_THREADS / 32;
  const WarpRows warp_rows{consumer * WARPGROUP_ROWS + (cwarp % 4) * 16};
  // A turn's barrier counts its warpgroup and the one before it in the rotation, which arrives.
  const u32_t my_turn = WS_BAR_TURN + consumer;
  const u32_t other_turn = WS_BAR_TURN + (consumer + 1 == WS_CONSUMERS ? 0 : consumer + 1);
  const float softmax_scale = VARIANT_HAS_TRANSFORM ? LOG2E : p.scale_log2;
  unsigned char* const o_bytes = smem_raw + (o_stage - raw_base);

  int first = 0;  // ring tiles of the items before
  WsItem it;
  bool more = ws_item(p, blockIdx.x, it);
  int q_buf = 0;  // the item's Q tile (WS_Q_TILES)
  if (more) ws_load_q_async(p, it, q_tile(0), cwarp, lane);
  for (int i = blockIdx.x; more;) {
    // This warp's Q rows as registers, then its rows of the Q tile take the next item's; or, from
    // shared memory, its rows published to the products (after the warpgroup's turn barrier)
    // and the next item's rows into the other Q tile (whose products ended with the last item).
    cp_async_wait<0>();
    WsQ q;
    q.group_rows = q_tile(q_buf).base + consumer * WARPGROUP_ROWS * QTile::ROW_BYTES;
    if constexpr (WS_Q_IN_REGISTERS) {
      __syncwarp();
      ws_load_q_fragments(FragAddrs(q_tile(0).base, warp_rows.first, lane), q.frags);
      __syncwarp();
      if constexpr (spec::QK_F16_ACCUM) ws_prescale_q(p, q, q_tile(0), nullptr, cwarp, lane);
    } else {
      if constexpr (spec::QK_F16_ACCUM)
        ws_prescale_q(p, q, q_tile(q_buf), smem_raw + (q_tile(q_buf).base - raw_base), cwarp, lane);
      fence_proxy_async_shared();
    }
    const int next = i + gridDim.x;
    if constexpr (WS_Q_AHEAD) {
      WsItem after;
      if (ws_item(p, next, after)) ws_load_q_async(p, after, q_tile(WS_Q_TILES - 1 - q_buf), cwarp, lane);
    }

    const RowCoords rows = it.tile.row_coords(warp_rows, lane);
    float o[MMA_Q][VO_NT][4];
#pragma unroll
    for (int dt = 0; dt < VO_NT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[0][dt][e] = 0.0f;
    Softmax softmax;
    softmax.init();
    const int n = it.num_tiles;
    if (n > 0) {
      // Turns rotate from consumer 0's first; each warpgroup takes n + 1 of them, and the last
      // consumer hands its last one over to nobody.
      if (consumer == WS_CONSUMERS - 1) ws::named_arrive(WS_BAR_TURN, 2 * 128);
      float s[MMA_Q][KV_NT][4];
      // With f16 QK accumulation, the products' accumulators (ws_widen_s widens them into s);
      // unused otherwise.
      u32_t acc[MMA_Q][KV_NT][2];
      u32_t pf[KV_NT / 2][MMA_Q][4];  // P of the tile before, as the A fragments of P V
      auto pack_p = [&]() {
#pragma unroll
        for (int kk = 0; kk < KV_NT / 2; ++kk)
          p_block_fragments(F32Logits<MMA_Q, KV_NT, DTypeIn>{s}, softmax, kk, pf[kk]);
      };
      // S_j = Q K_j^T issued into s, or with f16 QK accumulation into acc.
      auto issue_qk = [&](u32_t k_tile) {
        if constexpr (spec::QK_F16_ACCUM) {
          ws_issue_qk(q, k_tile, acc);
        } else {
          ws_issue_qk(q, k_tile, s);
        }
      };
      // S_j, waited for, as floats in s: with f16 QK accumulation widened from acc, reading K_j's
      // rows where a tile overflowed (so before K_j is released).
      auto s_to_floats = [&](u32_t k_tile) {
        if constexpr (spec::QK_F16_ACCUM)
          ws_widen_s(q, FragAddrs(q_tile(q_buf).base, warp_rows.first, lane), k_tile, acc, s);
      };
      // Tile 0: S_0 alone in this turn.
      ring.wait_full(ws::Rows::K, first);
      ws_rows_to_products();
      ws::named_sync(my_turn, 2 * 128);
      wgmma_fence();
      issue_qk(ring.k(first).base);
      ws::named_arrive(other_turn, 2 * 128);
      wgmma_wait<0>();
      s_to_floats(ring.k(first).base);
      ring.release(ws::Rows::K, first);
      float_logits_update(p, rows, it.m, it.tile, it.tok_lo, it.tok_hi, it.kv_lo, lane, softmax_scale, softmax, s, o);
      pack_p();
      // Tile j: S_j and P_{j-1} V_{j-1} in one turn; the softmax of S_j while P_{j-1} V_{j-1}
      // runs (its rescale of o collected in `factors`, applied once that product is done).
#pragma unroll 1
      for (int j = 1; j < n; ++j) {
        const int t = first + j;
        ring.wait_full(ws::Rows::K, t);
        ring.wait_full(ws::Rows::V, t - 1);
        ws_rows_to_products();
        ws::named_sync(my_turn, 2 * 128);
        wgmma_fence();
        issue_qk(ring.k(t).base);
        ws_issue_pv(ring.v(t - 1).base, pf, o);
        ws::named_arrive(other_turn, 2 * 128);
        wgmma_wait<1>();
        s_to_floats(ring.k(t).base);
        ring.release(ws::Rows::K, t);
        float factors[MMA_Q][1][4];
#pragma unroll
        for (int e = 0; e < 4; ++e) factors[0][0][e] = 1.0f;
        float_logits_update(p, rows, it.m, it.tile, it.tok_lo, it.tok_hi, it.kv_lo + j * KV_TILE, lane,
                            softmax_scale, softmax, s, factors);
        wgmma_wait<0>();
        ring.release(ws::Rows::V, t - 1);
        const float rescale[MMA_Q][2] = {{factors[0][0][0], factors[0][0][2]}};
        softmax.rescale_outputs(rescale, o);
        pack_p();
      }
      // The last tile's P V, in a turn of its own.
      ring.wait_full(ws::Rows::V, first + n - 1);
      ws_rows_to_products();
      ws::named_sync(my_turn, 2 * 128);
      wgmma_fence();
      ws_issue_pv(ring.v(first + n - 1).base, pf, o);
      if (consumer != WS_CONSUMERS - 1) ws::named_arrive(other_turn, 2 * 128);
      wgmma_wait<0>();
      ring.release(ws::Rows::V, first + n - 1);
    }
    first += n;

    // The item and its rows read again rather than held through the loop (the barriers' memory
    // clobbers keep the compiler from reusing the first reads): the consumers' registers are
    // the loop's.
    ws_item(p, i, it);
    // With the output staged in the Q tile (head dims 256 and (192, 128)), this thread's rows and
    // lane are read afresh too: the staging addresses derive from them, which ptxas otherwise
    // computed before the loop and spilled (up to 476 bytes at 256, `attnforge compile --arch
    // sm_90a --filter ws2q1kv64`). Elsewhere the kernels keep the code they were measured with.
    WarpRows out_warp_rows = warp_rows;
    int out_lane = lane, coords_lane;
    if constexpr (WS_OUTPUT_IN_Q_TILE) {
      const int tid = thread_index();
      const int out_warp = tid / 32 - WS_PRODUCER_THREADS / 32;
      out_warp_rows = WarpRows{(out_warp / 4) * WARPGROUP_ROWS + (out_warp % 4) * 16};
      out_lane = coords_lane = tid % 32;
    } else {
      coords_lane = lane_id();
    }
    const RowCoords out_rows = it.tile.row_coords(out_warp_rows, coords_lane);
    float sink_log2[MMA_Q][2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      sink_log2[0][h] = VARIANT_HAS_SINK ? LOG2E * sink_logit(p.variant, out_rows.head[0][h]) : 0.0f;
    float lse[MMA_Q][2];
    if (p.kv_chunk > 0) {
      // A split plan: the chunk's partial result, from the registers, without the sink (the
      // merge adds it once).
      softmax.finish<false>(o, sink_log2, lse);
      store_partial(p, out_rows, it.qo_start, it.chunk, out_lane, o, lse);
    } else {
      softmax.finish<VARIANT_HAS_SINK>(o, sink_log2, lse);
      // Staged through this warp's own rows of the output stage: a region of its own, since the
      // Q tile already receives the next item's rows; or the Q tile, whose rows of this
      // warpgroup its products no longer read (each of its threads waited for its last
      // S = Q K^T before the turn barrier of its last P V), and which then takes the warp's rows
      // of the next item.
      store_output(p, it.tile, out_rows, it.qo_start, out_warp_rows, out_lane, o_bytes, OStage{o_stage}, o, lse);
    }
    i = next;
    q_buf = WS_Q_TILES - 1 - q_buf;
    more = ws_item(p, i, it);
    if constexpr (!WS_Q_AHEAD) {
      __syncwarp();  // the staged rows read by every lane before the copies overwrite them
      if (more) ws_load_q_async(p, it, q_tile(0), cwarp, lane);
    }
  }
}

}  // namespace prefill
