// prefill_tile.cuh — the prefill CTA's tile: its constants, its shared-memory map, and where each
// thread's fragment rows sit.
//
// A CTA of NUM_WARPS warps owns CTA_Q "packed" query rows: row p of a request is token
// p / group_size of query head kv_head * group_size + p % group_size, so the query heads that
// share a KV head share every K/V tile load (GQA). Two warp layouts: ROWS (prefill) gives each
// warp its own MMA_Q * 16 rows (CTA_Q = NUM_WARPS * MMA_Q * 16) and every key; KEYS (decode and
// other short query tiles) gives every warp the same MMA_Q * 16 rows and a share of the keys (the
// sub-tiles of each KV tile, round robin), and merges the warps' softmax states at the end. With
// WGMMA (sm_90a) each four warps are one warpgroup, which owns MMA_Q m64 tiles of its rows; warp w
// of a warpgroup holds rows 16w.. of each of them (WarpRows).
//
// Shared memory, in order from a base that wgmma tiles align to 1024 bytes (the period of its
// swizzle): the Q tile (also the output's staging area); KV_STAGES K tiles; KV_STAGES V tiles;
// paged, the page ids of two KV tiles; each thread's K and V base pointers (KvSource); with
// policy::TMA_KV one mbarrier per K/V buffer; with policy::BOUNDS_IN_SHARED each warp's copy of
// the request's bounds. The host computes the same total (KernelSpec::smem_bytes), checked when
// the kernel compiles.
// Requires: common.cuh, smem_tile.cuh, kv_rows.cuh, online_softmax.cuh, the spec and policy
// constants.

namespace prefill {

using DTypeIn = spec::DTypeIn;
using DTypeOut = spec::DTypeOut;
constexpr int NUM_WARPS = spec::NUM_WARPS;
// fp8 K/V with f32 QK: the tiles hold the codes' exact values (decode_fp8x8), and the scales are
// applied to the f32 products instead, k_scale to S = Q K^T before the logits (or in the
// softmax's scale, K_SCALE_IN_SOFTMAX) and v_scale to O before the normalisation: per element
// one conversion instruction rather than a conversion, an f32 multiply and a rounding (fp8.cuh).
// With f16 QK the tiles stay dequantised: the f16 accumulator of the unscaled codes (up to 448 or
// 57344) could overflow where the problem's does not.
constexpr bool FP8_SCALES_AFTER_PRODUCTS = spec::KV_FP8 != KV_FP8_NONE && !spec::QK_F16_ACCUM;
// Without a logits transform the softmax takes the raw products and multiplies them by its scale
// inside the exponent's FFMA (variant_logit), so k_scale joins that scale there instead of
// multiplying each product of S (scales are > 0, so the row maxima are the same).
constexpr bool K_SCALE_IN_SOFTMAX = FP8_SCALES_AFTER_PRODUCTS && !VARIANT_HAS_TRANSFORM;
constexpr int NUM_THREADS = NUM_WARPS * 32;
constexpr int MMA_Q = spec::MMA_Q;
constexpr bool WARPS_SPLIT_KEYS = spec::WARPS_SPLIT_KEYS;  // the KEYS warp layout
constexpr int CTA_Q = (WARPS_SPLIT_KEYS ? 1 : NUM_WARPS) * MMA_Q * 16;
constexpr int KV_TILE = spec::KV_TILE;      // keys loaded per barrier
constexpr int KV_SUB = spec::KV_SUB;        // keys computed at a time (S registers)
constexpr int KV_STAGES = spec::KV_STAGES;  // K/V buffers: 2, or 1 (SINGLE_BUFFER)
constexpr bool SINGLE_BUFFER = KV_STAGES == 1;
constexpr bool WGMMA = spec::WGMMA;
constexpr int WARPGROUP_ROWS = MMA_Q * 64;  // a warpgroup's CTA rows with wgmma
constexpr int QK_CHUNKS = spec::HEAD_DIM_QK / 8;  // 16-byte chunks per Q/K row
constexpr int VO_CHUNKS = spec::HEAD_DIM_VO / 8;
constexpr int KV_NT = KV_SUB / 8;             // n8 tiles of S per m16 tile
constexpr int VO_NT = spec::HEAD_DIM_VO / 8;  // n8 tiles of O per m16 tile
constexpr int Q_TILE_BYTES = CTA_Q * QK_CHUNKS * 16;
// With policy::FP8_FRAGMENTS the K/V buffers hold the fp8 codes alone, one byte an element
// (Fp8CodeSlots' dense rows, read in place by prefill_fp8_fragments.cuh); otherwise DTypeIn rows.
constexpr int KV_ELEM_BYTES = policy::FP8_FRAGMENTS ? 1 : 2;
constexpr int K_TILE_BYTES = KV_TILE * QK_CHUNKS * 8 * KV_ELEM_BYTES;
constexpr int V_TILE_BYTES = KV_TILE * VO_CHUNKS * 8 * KV_ELEM_BYTES;
constexpr int PAGE_IDS_BYTES = spec::KV_PAGED ? 2 * KV_TILE * 4 : 0;
constexpr int KV_BASES_BYTES = NUM_THREADS * 16;
constexpr int TMA_BARRIER_BYTES = policy::TMA_KV ? 2 * 8 : 0;
constexpr int SMEM_ALIGN_SLACK = WGMMA ? 1024 : 0;
// A warp's copy of the request's bounds (two ints, or four with the token range), and all of them.
constexpr int BOUNDS_SLOT_BYTES = policy::TOKENS_IN_SHARED ? 16 : 8;
constexpr int BOUNDS_BYTES = policy::BOUNDS_IN_SHARED ? NUM_WARPS * BOUNDS_SLOT_BYTES : 0;
constexpr int SMEM_BYTES = Q_TILE_BYTES + KV_STAGES * (K_TILE_BYTES + V_TILE_BYTES) + PAGE_IDS_BYTES + KV_BASES_BYTES +
                           TMA_BARRIER_BYTES + BOUNDS_BYTES + SMEM_ALIGN_SLACK;

static_assert(KV_SUB % 16 == 0 && KV_TILE % KV_SUB == 0, "KV tile: whole sub-tiles of 16k keys");
static_assert(KV_STAGES == 2 || (SINGLE_BUFFER && !WARPS_SPLIT_KEYS && !spec::KV_PAGED && KV_SUB == KV_TILE),
              "one K/V buffer: the rows layout over ragged K/V, one sub-tile per tile");
static_assert(!spec::QK_F16_ACCUM || !DTypeTraits<DTypeIn>::IS_BF16, "f16 QK accumulation needs f16 inputs");
static_assert(!WGMMA || ((NUM_WARPS == 4 || NUM_WARPS == 8 || (spec::WARP_SPECIALIZED && NUM_WARPS == 12)) &&
                          !WARPS_SPLIT_KEYS && KV_SUB == KV_TILE &&
                          (KV_TILE == 64 || (spec::WARP_SPECIALIZED && KV_TILE == 128))),
              "wgmma tiles: one or two warpgroups of row warps (three warp-specialised), 64-key tiles (128 "
              "warp-specialised)");
static_assert(!policy::TMA_KV || (WGMMA && !spec::KV_PAGED && !SINGLE_BUFFER),
              "TMA copies: ragged two-buffer wgmma tiles");
static_assert(KV_SUB % policy::F32_PIECE == 0 && policy::F32_PIECE % 16 == 0, "f32 pieces: whole k16 blocks of P");
static_assert(!SINGLE_BUFFER || policy::F32_PIECE == KV_SUB,
              "one K/V buffer: K_{t+1} loads during the only piece's P V");
static_assert(!policy::F16_WARP_CHOICE || (!policy::SUM_BY_MMA && policy::F16_FLOAT_PIECE == KV_SUB),
              "f16 QK, one P V after both paths: one float piece, P V's A fragments alone");
static_assert(!policy::FIRST_V_LATE || !WARPS_SPLIT_KEYS, "key-split warps: no barrier inside the sub-tile loop");

// The shared-memory layout of the Q, K and V tiles (smem_tile.cuh): with wgmma, columns of 64
// elements (wgmma's own swizzled layout; the same as rows at head dim 64), else rows.
constexpr int Q_ATOM_ROWS = WGMMA ? CTA_Q : 0;
constexpr int KV_ATOM_ROWS = WGMMA ? KV_TILE : 0;
using QTile = SmemTile<QK_CHUNKS, Q_ATOM_ROWS>;
using KTile = SmemTile<QK_CHUNKS, KV_ATOM_ROWS>;
using VTile = SmemTile<VO_CHUNKS, KV_ATOM_ROWS>;
// Bytes between the K (V) rows of a buffer: the tile's rows, or the dense code rows.
constexpr int K_ROW_BYTES = policy::FP8_FRAGMENTS ? spec::HEAD_DIM_QK : KTile::ROW_BYTES;
constexpr int V_ROW_BYTES = policy::FP8_FRAGMENTS ? spec::HEAD_DIM_VO : VTile::ROW_BYTES;
// CTA rows between a warp's m16 tiles: the next block of 16 with mma.sync, the next m64 tile with
// wgmma (WarpRows).
constexpr int M16_ROW_STRIDE = WGMMA ? 64 : 16;
static_assert(QK_CHUNKS >= VO_CHUNKS, "the output is staged in the Q tile");
static_assert(!WARPS_SPLIT_KEYS || (KV_TILE / KV_SUB) % NUM_WARPS == 0, "key-split warps: equal sub-tiles per warp");
static_assert(!WARPS_SPLIT_KEYS ||
                  (NUM_WARPS - 1) * merge_scratch_floats<MMA_Q, VO_NT>() * 4 <= KV_STAGES * (K_TILE_BYTES + V_TILE_BYTES),
              "key-split warps: the K/V buffers hold the warps' states for the merge");
using KvRowsIn = KvRows<DTypeIn, spec::KV_PAGED, spec::KV_FP8>;
using Softmax = OnlineSoftmax<MMA_Q, policy::SUM_BY_MMA, policy::SOFTMAX_EXP_AFTER_RESCALE>;

// The key of element e (0..3) of n8 tile nt of a sub-tile's S, keys k0.., for this lane: column
// 2 (lane % 4) + e % 2 of the tile, which is key nt * 8 + column, or with policy::FP8_FRAGMENTS
// key 16 (nt / 2) + 4 (column / 2) + 2 (nt % 2) + column % 2 (prefill_fp8_fragments.cuh).
__device__ __forceinline__ int s_column_key(int k0, int nt, int lane, int e) {
  if constexpr (policy::FP8_FRAGMENTS) {
    return k0 + 16 * (nt / 2) + 4 * (lane % 4) + 2 * (nt % 2) + e % 2;
  } else {
    return k0 + nt * 8 + 2 * (lane % 4) + e % 2;
  }
}

// Each warp copies (and, for f16 QK, prescales) one block of this many Q rows; each lane works
// out one row's address and the warp shares it, rather than every chunk dividing by the group.
constexpr int Q_ROWS_PER_WARP = CTA_Q / NUM_WARPS;
static_assert(CTA_Q % NUM_WARPS == 0 && Q_ROWS_PER_WARP <= 32 && Q_ROWS_PER_WARP * QK_CHUNKS % 32 == 0,
              "Q rows: one block of at most 32 rows per warp, copied in whole warp steps");

// Waits until at most N of this thread's cp.async groups are pending; with wgmma, also makes the
// landed rows visible to its async proxy (the barrier that follows publishes them CTA-wide).
template <int N>
__device__ __forceinline__ void wait_copies() {
  cp_async_wait<N>();
  if constexpr (WGMMA) fence_proxy_async_shared();
}

// Calls f(r, chunk) for the chunks of a block of ROWS rows of CHUNKS 16-byte chunks (r counted from
// the block's first row) that lane `lane` handles: 32 consecutive chunks per step, so a step
// covers whole rows where CHUNKS divides 32 and its stores coalesce.
template <int ROWS, int CHUNKS, typename F>
__device__ __forceinline__ void for_lane_chunks(int lane, F f) {
  static_assert(ROWS * CHUNKS % 32 == 0, "whole warp steps");
#pragma unroll
  for (int i = 0; i < ROWS * CHUNKS / 32; ++i) {
    const int idx = i * 32 + lane;
    f(idx / CHUNKS, idx % CHUNKS);
  }
}

// The CTA rows of one warp's fragments. Fragment row r (0 <= r < MMA_Q * 16, m16 tile r / 16) is
// CTA row first + r with mma.sync (each warp its own block of rows; every warp the same rows with
// key-split warps); with wgmma, warp w of warpgroup g holds rows 16w.. of each of the
// warpgroup's m64 tiles, first = g * WARPGROUP_ROWS + 16w.
struct WarpRows {
  int first;
  __device__ __forceinline__ int at(int r) const { return WGMMA ? first + (r / 16) * 64 + r % 16 : first + r; }
};

// Where this thread's fragment rows sit: token within the request and query head.
struct RowCoords {
  int token[MMA_Q][2];
  int head[MMA_Q][2];
  bool valid[MMA_Q][2];
};

// This thread's ldmatrix offsets (FragOffsets) in the Q, K and V tiles: Q and V reads take rows
// lane % 16 and chunk lane / 16 of each 16x16 block, K reads rows (lane / 16) * 8 + lane % 8 and
// chunk (lane / 8) % 2. Computed once per CTA; the main loop adds only constants to them. (With
// wgmma the products read the tiles by descriptor; the f16-QK overflow fallback reads them so.)
struct FragAddrs {
  u32_t q_base;  // the warp's first Q row
  FragOffsets<QK_CHUNKS, Q_ATOM_ROWS> q;
  FragOffsets<QK_CHUNKS, KV_ATOM_ROWS> k;
  FragOffsets<VO_CHUNKS, KV_ATOM_ROWS> v;

  __device__ __forceinline__ FragAddrs(u32_t q_tile_base, int warp_row0, int lane)
      : q_base(q_tile_base + static_cast<u32_t>(warp_row0 * QTile::ROW_BYTES)),
        q(lane % 16, lane / 16),
        k((lane / 16) * 8 + lane % 8, (lane / 8) % 2),
        v(lane % 16, lane / 16) {}
};

// The query tile of a work item: packed rows [row0, row0 + CTA_Q) of a request's
// qo_len * group_size packed rows.
struct QueryTile {
  int row0;
  int packed_len;
  int kv_head;
  int group;
  FastDivisor group_div;  // divides by group

  __device__ __forceinline__ bool coords(int row, int& token, int& head) const {
    int packed = row0 + row;
    token = group_div.div(packed);
    head = kv_head * group + (packed - token * group);
    return packed < packed_len;
  }

  // The element offset of packed row `row` in a [tokens, heads, dim] tensor of the request that
  // starts at token `qo_start`; 0 for a row past the request's rows (never read or written).
  __device__ __forceinline__ i64_t row_offset(int row, int qo_start, i64_t stride_token, i64_t stride_head) const {
    int token, head;
    return coords(row, token, head) ? static_cast<i64_t>(qo_start + token) * stride_token + head * stride_head : 0;
  }

  __device__ __forceinline__ bool valid(int row) const { return row0 + row < packed_len; }

  // The coordinates of this thread's fragment rows.
  __device__ __forceinline__ RowCoords row_coords(WarpRows warp_rows, int lane) const {
    RowCoords rows;
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        rows.valid[mq][h] = coords(warp_rows.at(mq * 16 + lane / 4 + 8 * h), rows.token[mq][h], rows.head[mq][h]);
    return rows;
  }
};

// The coordinates of this thread's fragment rows as the sub-tile loop's logits take them with
// policy::LOOP_ROWS_FRESH: computed again at each use (coords_of) from a fresh read of the lane id
// (which the compiler cannot merge with the first one), so that nothing of them is live between
// the sub-tiles' logits. Without it the loop takes the RowCoords computed before it, as they are.
struct FreshRows {
  const QueryTile& tile;
  WarpRows warp_rows;
};
__device__ __forceinline__ const RowCoords& coords_of(const RowCoords& rows) { return rows; }
__device__ __forceinline__ RowCoords coords_of(const FreshRows& rows) {
  return rows.tile.row_coords(rows.warp_rows, lane_id());
}

}  // namespace prefill
