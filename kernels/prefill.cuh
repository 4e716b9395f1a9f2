// prefill.cuh — FA2-class prefill attention for one work item: (request, query tile, KV head,
// KV chunk).
//
// A CTA of NUM_WARPS warps owns CTA_Q "packed" query rows: row p of a request is token
// p / group_size of query head kv_head * group_size + p % group_size, so the query heads that
// share a KV head share every K/V tile load (GQA). Two warp layouts: ROWS (prefill) gives each
// warp its own MMA_Q * 16 rows (CTA_Q = NUM_WARPS * MMA_Q * 16) and every key; KEYS (decode and
// other short query tiles) gives every warp the same MMA_Q * 16 rows and a share of the keys (the
// sub-tiles of each KV tile, round robin), and merges the warps' softmax states at the end. K and
// V rows come from a ragged tensor or a paged cache (kv_rows.cuh). K and V stream through
// double-buffered swizzled shared memory with cp.async (whole tiles of ragged K/V by the tensor
// memory accelerator in the wgmma kernels: TMA_KV), KV_TILE keys per barrier, so the next
// tile loads while this one computes (with 32-row warps, tile 0's V rows land while its
// S = Q K^T is computed); each tile is computed KV_SUB keys at a time (the S registers). With one
// K/V buffer (KV_STAGES = 1: the rows layout over ragged K/V, one sub-tile per tile, for tiles
// too large to double-buffer at two CTAs per SM), tile t + 1's K rows load during tile t's P V
// and its V rows during tile t + 1's S = Q K^T, two barriers per tile (with f16 QK whose overflow
// fallback reads K during P V, both load after tile t: three barriers). Per
// sub-tile each warp computes S = Q K^T with mma.m16n8k16 (f32 or f16 accumulators), applies
// the variant and the mask to S as f32, updates the online softmax and accumulates O += P V (f32
// accumulators). On sm_90a a wgmma tile (WGMMA, below) computes both products as warpgroup MMAs
// instead, over tiles in wgmma's swizzled layout; everything between them is the same code.
// Where the logits are heavy in a tile whose accumulators fill the registers (HEAVY_LOGITS), an
// f32-QK sub-tile is computed in pieces of 32 keys, each from S = Q K^T to O += P V.
// Tiles wholly masked are skipped; element masks run only on tiles that need them. With f16
// accumulators, a sub-tile that needs no transform and no mask and did not overflow goes to the
// softmax as packed f16 (half the registers; each element widened exactly just before its
// exponent); the others are widened to f32 32 keys at a time (16 with heavy logits on mma.sync),
// overflowed elements recomputed with f32 accumulation (mma.sync, n8 tile by n8 tile; with wgmma
// "did not overflow" is decided for the whole warpgroup, whose warps then issue the same
// products). When the plan splits the KV range, the CTA covers one chunk and writes a partial
// result for merge_state.cuh instead of the output.
// Requires: common.cuh, mma.cuh, smem_tile.cuh, tma.cuh, kv_rows.cuh, mask.cuh, online_softmax.cuh,
// variant.cuh, the spec constants (namespace spec) and the rendered PrefillParams.

namespace prefill {

using DTypeIn = spec::DTypeIn;
using DTypeOut = spec::DTypeOut;
constexpr int NUM_WARPS = spec::NUM_WARPS;
constexpr int NUM_THREADS = NUM_WARPS * 32;
constexpr int MMA_Q = spec::MMA_Q;
constexpr bool WARPS_SPLIT_KEYS = spec::WARPS_SPLIT_KEYS;  // the KEYS warp layout
constexpr int CTA_Q = (WARPS_SPLIT_KEYS ? 1 : NUM_WARPS) * MMA_Q * 16;
constexpr int KV_TILE = spec::KV_TILE;  // keys loaded per barrier
constexpr int KV_SUB = spec::KV_SUB;    // keys computed at a time (S registers)
constexpr int KV_STAGES = spec::KV_STAGES;  // K/V buffers: 2, or 1 (SINGLE_BUFFER)
constexpr bool SINGLE_BUFFER = KV_STAGES == 1;
// Warpgroup MMA (sm_90a): each four warps of the CTA are one warpgroup, which owns MMA_Q m64
// tiles of its rows; S = Q K^T and O += P V are wgmma.m64n64k16 (mma.cuh) over the 128-byte
// swizzled tiles, and warp w of a warpgroup holds rows 16w.. of each of its m64 tiles (WarpRows).
// The softmax, masks and variants see the same fragments as with mma.sync. Either QK accumulation,
// 64-key tiles (one or two K/V buffers), one or two warpgroups.
constexpr bool WGMMA = spec::WGMMA;
constexpr int WARPGROUP_ROWS = MMA_Q * 64;  // a warpgroup's CTA rows with wgmma
// Whether whole K/V tiles of a ragged wgmma kernel with two buffers may be copied by the tensor
// memory accelerator (tma.cuh): one thread issues a tile's boxes, in wgmma's layout, on the
// buffer's mbarrier, instead of every thread's cp.async copies and their addresses (H200, session
// 17 run 2, ABBA against the copies: +0.5% to +8.5% on 10 ragged shapes). The launch says whether
// it does (p.kv_tma: the host could encode the tensor maps); a tile that reaches past the
// request's keys is copied with cp.async all the same (its rows past the end zero-filled, never
// another request's keys). Not paged: one box per page (16 boxes a tile at 16-slot pages) lost
// 2% against the copies, issued by one thread or by one lane per warp (session 17 runs 3-4).
constexpr bool TMA_KV = WGMMA && !spec::KV_PAGED && !SINGLE_BUFFER;

// Waits until at most N of this thread's cp.async groups are pending; with wgmma, also makes the
// landed rows visible to its async proxy (the barrier that follows publishes them CTA-wide).
template <int N>
__device__ __forceinline__ void wait_copies() {
  cp_async_wait<N>();
  if constexpr (WGMMA) fence_proxy_async_shared();
}
constexpr int QK_CHUNKS = spec::HEAD_DIM_QK / 8;  // 16-byte chunks per Q/K row
constexpr int VO_CHUNKS = spec::HEAD_DIM_VO / 8;
constexpr int KV_NT = KV_SUB / 8;                  // n8 tiles of S per m16 tile
constexpr int VO_NT = spec::HEAD_DIM_VO / 8;       // n8 tiles of O per m16 tile
constexpr int Q_TILE_BYTES = CTA_Q * QK_CHUNKS * 16;
constexpr int K_TILE_BYTES = KV_TILE * QK_CHUNKS * 16;
constexpr int V_TILE_BYTES = KV_TILE * VO_CHUNKS * 16;
// Paged: the page id of every key row of two KV tiles (the next tile's copies read them). Each
// thread's K and V base pointers (KvBaseStash).
constexpr int PAGE_IDS_BYTES = spec::KV_PAGED ? 2 * KV_TILE * 4 : 0;
constexpr int KV_BASES_BYTES = NUM_THREADS * 16;
// TMA_KV: one mbarrier per K/V buffer.
constexpr int TMA_BARRIER_BYTES = TMA_KV ? 2 * 8 : 0;
// wgmma's swizzle is a function of the shared address, so its tiles start 1024-byte aligned: the
// kernel rounds its base up, within this much slack.
constexpr int SMEM_ALIGN_SLACK = WGMMA ? 1024 : 0;
// (SMEM_BYTES, the total, follows BOUNDS_IN_SHARED below.)
static_assert(KV_SUB % 16 == 0 && KV_TILE % KV_SUB == 0, "KV tile: whole sub-tiles of 16k keys");
static_assert(KV_STAGES == 2 || (SINGLE_BUFFER && !WARPS_SPLIT_KEYS && !spec::KV_PAGED && KV_SUB == KV_TILE),
              "one K/V buffer: the rows layout over ragged K/V, one sub-tile per tile");
static_assert(!spec::QK_F16_ACCUM || !DTypeTraits<DTypeIn>::IS_BF16, "f16 QK accumulation needs f16 inputs");
static_assert(!WGMMA || ((NUM_WARPS == 4 || NUM_WARPS == 8) && !WARPS_SPLIT_KEYS && KV_SUB == 64 && KV_TILE == 64),
              "wgmma tiles: one or two warpgroups of row warps, 64-key tiles");
// The shared-memory layout of the Q, K and V tiles (smem_tile.cuh): with wgmma, columns of 64
// elements (wgmma's own swizzled layout; the same as rows at head dim 64), else rows.
constexpr int Q_ATOM_ROWS = WGMMA ? CTA_Q : 0;
constexpr int KV_ATOM_ROWS = WGMMA ? KV_TILE : 0;
using QTile = SmemTile<QK_CHUNKS, Q_ATOM_ROWS>;
using KTile = SmemTile<QK_CHUNKS, KV_ATOM_ROWS>;
using VTile = SmemTile<VO_CHUNKS, KV_ATOM_ROWS>;
// CTA rows between a warp's m16 tiles: the next block of 16 with mma.sync, the next m64 tile with
// wgmma (WarpRows).
constexpr int M16_ROW_STRIDE = WGMMA ? 64 : 16;
static_assert(QK_CHUNKS >= VO_CHUNKS, "the output is staged in the Q tile");
static_assert(!WARPS_SPLIT_KEYS || (KV_TILE / KV_SUB) % NUM_WARPS == 0, "key-split warps: equal sub-tiles per warp");
static_assert(!WARPS_SPLIT_KEYS ||
                  (NUM_WARPS - 1) * merge_scratch_floats<MMA_Q, VO_NT>() * 4 <= KV_STAGES * (K_TILE_BYTES + V_TILE_BYTES),
              "key-split warps: the K/V buffers hold the warps' states for the merge");
using KvRowsIn = KvRows<DTypeIn, spec::KV_PAGED>;
// Whether tile 0's P V waits for its V rows separately, after S = Q K^T (one more barrier), with
// two K/V buffers (with one, every tile's P V does). Only
// the rows layout can (key-split warps take different sub-tiles: no barrier inside the sub-tile
// loop), and only the 32-row warps gain (H200, session 6 runs 2-3, same calls: +4% f16 QK s4096
// causal, +2.4% paged prefill, +1% s1024 non-causal); 16-row warps lost (-4% s512 non-causal on
// the 64-row tile, -1% D=256).
constexpr bool FIRST_V_LATE = !WARPS_SPLIT_KEYS && MMA_Q >= 2;
// Whether a built-in transform takes the accumulator with post_scale folded into its parameters
// (variant.cuh): one FMUL per logit fewer. Measured on the soft-cap (H200, session 7 run 1, ABBA
// in one call): f16 QK +3.6%, but with mma.sync f32 QK -1.7% (s4096) and -1% (GQA s8192), same
// spills, so f32-QK kernels take it only with wgmma (H200, session 15 run 3, ABBA in one call:
// +1.3% to +6.0% on five soft-cap shapes, D=128 and 256; the non-causal D=128 twins stop spilling).
constexpr bool TRANSFORM_FROM_ACC = spec::QK_F16_ACCUM || WGMMA;
// Whether unmasked sub-tiles within the variant's small form take it factored into the softmax's
// exponents (FactoredSmallLogits in variant.cuh): where the transform is taken from the
// accumulator.
// Within the variant's short form (VARIANT_HAS_SHORT_FORM: the soft-cap's for |s| <= cap / 10),
// its factor instead (H200, session 18 run 4, ABBA in one call: soft-cap 50 +6.2% s4096, +8.8%
// s8192, +8.3% GQA 32/8 s8192, +3.6% f16 QK, +1.4% D=256; soft-cap 2, whose logits are past the
// short form, -1.4%; no variant unchanged, same SASS).
constexpr bool FACTORED_SMALL_FORM = VARIANT_HAS_SMALL_FORM && TRANSFORM_FROM_ACC;
// The tiles whose output accumulators and 64-key logits fill a thread's registers: head dim 128
// over 64-key sub-tiles, two warpgroups with wgmma (64 output floats, 128 registers a thread at
// two CTAs per SM) or 32-row warps with mma.sync (128 output floats, 255 registers).
constexpr bool ACCUMULATOR_BOUND =
    spec::HEAD_DIM_VO == 128 && KV_SUB == 64 && (WGMMA ? NUM_WARPS == 8 : MMA_Q == 2);
// Whether the logits take more than the accumulators and the causal mask: a transform of the
// scaled float logit (custom and ALiBi transforms, which take the elements' indices; the soft-cap
// where it is not taken from the accumulator: mma.sync with f32 QK), the variant's own mask, a
// sliding window or a custom mask. In an accumulator-bound tile these are most of the kernels
// ptxas spilled for (NVRTC 13, before this: 113 of the 2884 kernels of the matrix, all in such
// tiles): they compute smaller pieces at a time (F32_PIECE, F16_FLOAT_PIECE) and derive the
// values the loop's indices come from where they are used, rather than holding them through the
// loop (LOOP_ROWS_FRESH, Q_DESC_IN_LOOP; after it 10 spill, the sm_80 f16-QK window ones among
// them, at most 24/32 B).
// Every other kernel (the headline ones among them: no variant, unmasked or causal) keeps its
// code.
constexpr bool HEAVY_LOGITS =
    ACCUMULATOR_BOUND && ((VARIANT_HAS_TRANSFORM && !(TRANSFORM_FROM_ACC && VARIANT_TRANSFORM_FROM_ACC)) ||
                          VARIANT_HAS_MASK || spec::MASK_KIND == MASK_SLIDING_WINDOW || spec::MASK_KIND == MASK_CUSTOM);
// Whether the KV loop reads the request's bounds from shared memory (SharedBounds: each warp's
// copy, written once before the loop) rather than holding them in registers through it: the
// lengths qo_len and kv_len (the copies' valid rows, the tile mask test, the element masks) and,
// where a mask uses them (TOKENS_IN_SHARED), the query tile's first and last token (the tile mask
// test); the loop also computes the rows' coordinates where its masks use them (LOOP_ROWS_FRESH).
// For the mma.sync kernels of an accumulator-bound tile (255 registers: 128 O and 64 S floats a
// thread) that ptxas spilled without it, none with a transform or a variant's mask: f16 QK with a
// sliding window; f32 QK over a paged cache, unmasked or causal, with f16 inputs; f32 QK causal
// over ragged K/V with bf16 inputs. Each stored loop-invariant scalars before the KV loop and
// refilled them in it (session 22: the tile count, the first key, the KV length; the causal
// diagonal's offset), and removing one of them only moved the spill (session 23). NVRTC 13,
// compile only (session 24), sm_80 `w4q2kv64` D=128, none and sinks variants alike, spill
// stores/loads in bytes: f16-QK window ragged and paged 24/32 -> 0 (245 and 246 registers), f16
// paged unmasked 4/4 -> 0, f16 paged causal 16/20 -> 0, bf16 ragged causal 4/4 -> 0; sm_80's
// other 230 `w4q2kv64` kernels keep their code. At 255 registers ptxas's allocation moves with any
// of this, so the set is the one measured spill-free, not a rule; other sets moved the spills
// (sm_80): the tile count, first and last key in the slot too: f16 paged unmasked 8/12, bf16
// ragged causal 44/88; without the fresh rows: bf16 ragged causal 8/8; the token range of an
// unmasked kernel too: f16 paged unmasked 8/8 (the request's page-table pointer spilled); that
// pointer in the slot too: 8/8 (the query tile's first row, for the epilogue); one slot per CTA at
// a fixed address, written by thread 0 before the first tile's barrier: 8/16 to 28/40 on four of
// the six kinds. The bf16 paged causal kernels are left out: they do not spill on sm_80 (CI's
// target), only on sm_89. The cost (a shared load where the loop reads a bound, its address from
// a fresh thread index; the rows' coordinates at each masked sub-tile) is not measured: no A100
// has run it.
constexpr bool BOUNDS_IN_SHARED =
    ACCUMULATOR_BOUND && !WGMMA && !VARIANT_HAS_TRANSFORM && !VARIANT_HAS_MASK &&
    (spec::QK_F16_ACCUM              ? spec::MASK_KIND == MASK_SLIDING_WINDOW
     : DTypeTraits<DTypeIn>::IS_BF16 ? spec::MASK_KIND == MASK_CAUSAL && !spec::KV_PAGED
                                     : spec::KV_PAGED && (spec::MASK_KIND == MASK_NONE ||
                                                          spec::MASK_KIND == MASK_CAUSAL));
constexpr bool TOKENS_IN_SHARED = BOUNDS_IN_SHARED && spec::MASK_KIND != MASK_NONE;
// SharedBounds: a warp's slot (two ints, or four with the token range), and all of them.
constexpr int BOUNDS_SLOT_BYTES = TOKENS_IN_SHARED ? 16 : 8;
constexpr int BOUNDS_BYTES = BOUNDS_IN_SHARED ? NUM_WARPS * BOUNDS_SLOT_BYTES : 0;
constexpr int SMEM_BYTES = Q_TILE_BYTES + KV_STAGES * (K_TILE_BYTES + V_TILE_BYTES) + PAGE_IDS_BYTES + KV_BASES_BYTES +
                           TMA_BARRIER_BYTES + BOUNDS_BYTES + SMEM_ALIGN_SLACK;
// f32 QK accumulation: S = Q K^T, the logits, the softmax update and P V of a sub-tile run in
// pieces of this many keys (with wgmma one m64n32k16 product per m64 tile and k16 step and piece;
// with mma.sync half of the n8 tiles per piece), so that 32 keys' logits are live, not 64.
constexpr int F32_PIECE = HEAVY_LOGITS ? 32 : KV_SUB;
// f16 QK accumulation: a sub-tile whose logits need a transform, a mask or an overflow fallback
// turns its accumulators into floats in pieces of this many keys, so that with 64-key sub-tiles
// no float copy of more than 32 keys' logits is live; with heavy logits on mma.sync (32-row
// warps: four rows a thread) of 16 keys. Except with wgmma tiles of one m64 tile per warpgroup
// (16 rows a warp: 32 floats, as many as an f32-QK kernel's S) whose logits are not heavy and
// need no index-dependent transform (no variant, or the soft-cap's forms): the whole sub-tile at
// once, one softmax update and one P V. H200, session 20 (ABBA against 32-key pieces): f16 D=128
// causal soft-cap 50 +9.1% at seq 4096 and +4.4% at 32/8 heads seq 8192; causal and non-causal
// without a variant within noise (-0.2%, -1.1%).
constexpr bool F16_FLOAT_WHOLE_SUB = WGMMA && MMA_Q == 1 && !HEAVY_LOGITS && !VARIANT_HAS_MASK &&
                                     (!VARIANT_HAS_TRANSFORM || VARIANT_HAS_SMALL_FORM);
constexpr int F16_FLOAT_PIECE = F16_FLOAT_WHOLE_SUB                            ? KV_SUB
                                : KV_SUB % 32 == 0 && !(HEAVY_LOGITS && !WGMMA) ? 32
                                                                                : 16;
// Whether, with f16 QK on wgmma, the float path of a sub-tile computed whole (F16_FLOAT_WHOLE_SUB)
// packs its P into the accumulators as the hot path leaves it, so that both paths meet before one
// P V: the choice between them (no transform, no mask, no overflow) is then each warp's own, a
// vote of its lanes, rather than the warpgroup's through a named barrier per sub-tile (the
// warpgroup's products must be issued by all of its warps at the same instruction, which one P V
// after the paths ensures). Same values: the pairs are packed as the float path's P V packs them.
constexpr bool F16_WARP_CHOICE = WGMMA && spec::QK_F16_ACCUM && F16_FLOAT_WHOLE_SUB;
// Whether a sub-tile is done reading its K rows before its P V: with f32 QK, and with f16 QK where
// both paths meet before one P V (F16_WARP_CHOICE: the overflow fallback, the last reader of K,
// runs before it), not where the f16 float path runs piece by piece, each piece to its own P V.
// With one K/V buffer, tile t + 1's K rows then load during tile t's P V, after the V barrier, and
// its V rows during tile t + 1's S = Q K^T (two barriers per tile), rather than both after tile t.
constexpr bool K_FREE_BEFORE_PV = !spec::QK_F16_ACCUM || F16_WARP_CHOICE;
// Whether an F16_WARP_CHOICE kernel widens every sub-tile's accumulators first (its hot path
// included; the overflow fallback inside widen_f16) and runs the f32-QK kernels' step on the
// floats: both paths then meet before the softmax update rather than after it, so ptxas forms the
// exponents and packs P between the P V products, as in the f32-QK kernels, rather than all
// before the first. The hot path pays the f32 max (FMNMX) instead of the packed one. Head dim 256
// only (its P V is as large as its S = Q K^T): H200, session 26 call 2 (ABBA, one call, two
// rounds, against both paths meeting before P V): D=256 two warpgroups f16 QK causal +2.1%,
// non-causal +1.8%; D=128 -1.8% causal s4096, -0.8% non-causal, -3.2% 32/8 s8192, +0.9% s8192,
// soft-cap +0.0%; D=64 -5.3%. NVRTC 13, sm_90a: no spill, no serialized wgmma in any f16-QK
// kernel with it.
constexpr bool F16_WIDEN_FIRST = F16_WARP_CHOICE && spec::HEAD_DIM_VO == 256;
// Whether the sub-tile loop computes the rows' coordinates (RowCoords) where the logits use them,
// from a fresh read of the lane id (FreshRows), rather than holding the ones computed before the
// loop through it, as the epilogue does (see the end of run_cta).
constexpr bool LOOP_ROWS_FRESH = HEAVY_LOGITS || BOUNDS_IN_SHARED;
// Whether a two-warpgroup f16-QK kernel derives its warpgroup's Q base (the products' A
// descriptor) from a fresh read of the thread index in each sub-tile, rather than holding it
// through the loop: with heavy logits only. It is made warp-uniform (warp_uniform), as the
// warpgroup is before the loop, so the descriptors stay in uniform registers. Not with sinks,
// whose loop is the no-variant one: there it made the ragged f16-QK twin spill 4/4 B, which it
// does not otherwise (NVRTC 13, sm_90a, session 20).
constexpr bool Q_DESC_IN_LOOP =
    ACCUMULATOR_BOUND && WGMMA && spec::QK_F16_ACCUM && HEAVY_LOGITS;
static_assert(KV_SUB % F32_PIECE == 0 && F32_PIECE % 16 == 0, "f32 pieces: whole k16 blocks of P");
static_assert(!SINGLE_BUFFER || F32_PIECE == KV_SUB, "one K/V buffer: K_{t+1} loads during the only piece's P V");
// Whether the row sums come from the tensor cores (online_softmax.cuh): of p rounded to f16
// (2^-11 relative), which moves a row's sum, and so the LSE, by at most 5e-4. With f16 inputs
// that is P itself; bf16 P (2^-8) could move the LSE by 4e-3, beyond its 1e-3 bound, so bf16
// kernels pack p to f16 a second time for the sums (one conversion per two p, against two FADDs),
// and only at head dim 64, where the softmax is the larger share of the loop. H200, session 8
// run 4 (ABBA, one call), bf16 against f32 adds: D=64 non-causal +11% (s4096 291 -> 323 TFLOP/s,
// s16384 302 -> 335, s1024 235 -> 255); D=128 mixed, so not taken (s4096 causal +0.8%, s1024 /
// s4096 non-causal -1.4% / -0.5%, GQA 32/8 s8192 causal -2.4%). Only for 32-row warps:
// H200, session 7 run 2 (ABBA, one call), against f32 adds: +4.6% s4096 causal, +6.6% f16 QK,
// +1.6% / +1.9% s1024 / s2048 non-causal, +2.3% D=64, +2% paged prefill, +1.5% soft-cap; the
// 16-row warps lost (-0.9% s512 non-causal, -1.5% D=256). And only without a window or custom
// mask: the sums' accumulators take 4 more registers through the loop, and the kernels that
// also hold a mask's state there spilled past the budget (custom mask with a custom variant
// 176 B; window with ALiBi 88 B; NVRTC 13, session 7). The wgmma kernels (16-row warps of 64-row
// warpgroups) take them with f32 QK at head dim 128 without a transform, unmasked or over a paged
// cache (the kernels measured to gain):
// H200, session 16 runs 2-3 (ABBA, one call each), against f32 adds: non-causal s4096 / s1024
// +2.0% / +2.2%, paged prefill (causal) +5.3%, ragged batch +1.3%; every other kernel measured
// lost: ragged causal s4096 -6.8%, soft-cap -0.3% to -1.4%, f16 QK -1.6%, head dim 64 -2.1% to
// -3.9% (the loops' schedules differ; not read in SASS). Since session 25 only over a paged
// cache: over ragged K/V the unmasked f16 kernels gain more from f32 adds with the exponents
// after the rescale, as the bf16 ones have them (below; H200, session 25 run 2, ABBA in one call,
// two rounds: non-causal s4096 +3.9%, s1024 +3.1%, s16384 +4.6%, 32/8 s8192 +5.9%, ragged batch
// +4.4%), while the paged prefill moved -1.3% (causal) and +1.3% (non-causal), within that
// shape's spread.
// The class of kernels these choices are made for: f32 QK, head dim 128, no transform, unmasked
// or over a paged cache, on wgmma.
constexpr bool PLAIN_WGMMA_D128 = WGMMA && !spec::QK_F16_ACCUM && spec::HEAD_DIM_VO == 128 &&
                                  !VARIANT_HAS_TRANSFORM && (spec::MASK_KIND == MASK_NONE || spec::KV_PAGED);
constexpr bool SUM_BY_MMA_WGMMA = PLAIN_WGMMA_D128 && spec::KV_PAGED;
constexpr bool SUM_BY_MMA = (MMA_Q >= 2 || SUM_BY_MMA_WGMMA) &&
                            (!DTypeTraits<DTypeIn>::IS_BF16 || spec::HEAD_DIM_VO <= 64) &&
                            (spec::MASK_KIND == MASK_NONE || spec::MASK_KIND == MASK_CAUSAL);
// Whether the softmax forms a sub-tile's exponents after the rescale branch of a full step
// (OnlineSoftmax's EXP_AFTER_RESCALE): the two-warpgroup wgmma tiles of PLAIN_WGMMA_D128 that add
// their row sums in f32: with bf16 inputs all of them (bf16 keeps f32 adds at head dim 128,
// above), with f16 inputs the ragged ones (session 25, above). With the exponents
// before the branch, ptxas formed the first k16 block's p and packed them before it but sank
// their f32 adds past it, so the block's floats and its packed A fragment were live across the
// branch, and it serialized the wgmma products ("insufficient register resources"; the f16
// twins, whose sum MMA reads the packed P, do not). A helper's finding (session 20); NVRTC 13,
// sm_90a, the bf16 D=128 w8q1kv64g none_none, none_sinks (ragged, paged), causal_none and
// causal_sinks (paged) kernels: serialized 6 -> 0, no spills. The same operations on the same
// values in another order; every other kernel keeps its code.
constexpr bool SOFTMAX_EXP_AFTER_RESCALE = ACCUMULATOR_BOUND && PLAIN_WGMMA_D128 && !SUM_BY_MMA &&
                                           (spec::MASK_KIND == MASK_NONE || spec::MASK_KIND == MASK_CAUSAL);
using Softmax = OnlineSoftmax<MMA_Q, SUM_BY_MMA, SOFTMAX_EXP_AFTER_RESCALE>;
// Whether the epilogue reads the request's query length again (from the work list, by a load the
// compiler cannot merge with the first) for the packed row count its rows' coordinates and stores
// check, rather than holding it through the loop: the f16-QK causal paged two-warpgroup kernels,
// where with F16_WARP_CHOICE ptxas otherwise stored it before the loop and refilled it in the
// epilogue (NVRTC 13, sm_90a, D=128 `w8q1kv64g` causal none and sinks paged: 4/4 B of spills).
constexpr bool EPILOGUE_RELOADS_QO_LEN =
    F16_WARP_CHOICE && ACCUMULATOR_BOUND && spec::KV_PAGED && spec::MASK_KIND == MASK_CAUSAL;
static_assert(!F16_WARP_CHOICE || (!SUM_BY_MMA && F16_FLOAT_PIECE == KV_SUB),
              "f16 QK, one P V after both paths: one float piece, P V's A fragments alone");
// Each warp copies (and, for f16 QK, prescales) one block of this many Q rows; each lane works
// out one row's address and the warp shares it, rather than every chunk dividing by the group.
constexpr int Q_ROWS_PER_WARP = CTA_Q / NUM_WARPS;
static_assert(CTA_Q % NUM_WARPS == 0 && Q_ROWS_PER_WARP <= 32 && Q_ROWS_PER_WARP * QK_CHUNKS % 32 == 0,
              "Q rows: one block of at most 32 rows per warp, copied in whole warp steps");

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

// S = Q K^T for this warp's rows over NT * 8 keys (K rows from `k_base`: a sub-tile, or a piece
// of one): the fragment loads both accumulator types share. `mma(acc, a, b0, b1)` accumulates one
// m16n8k16 product into `acc` (float[4] or the two f16x2 registers of an f16 accumulator), which
// the caller has zeroed.
template <int NT, typename Acc, typename Mma>
__device__ __forceinline__ void qk_tiles(const FragAddrs& f, u32_t k_base, Acc (&acc)[MMA_Q][NT], Mma mma) {
#pragma unroll
  for (int kk = 0; kk < spec::HEAD_DIM_QK / 16; ++kk) {
    u32_t a[MMA_Q][4];
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq) ldmatrix_x4(a[mq], f.q.at(f.q_base, mq * 16, kk * 2));
#pragma unroll
    for (int nb = 0; nb < NT / 2; ++nb) {
      u32_t b[4];
      ldmatrix_x4(b, f.k.at(k_base, nb * 16, kk * 2));
#pragma unroll
      for (int mq = 0; mq < MMA_Q; ++mq) {
        mma(acc[mq][2 * nb], a[mq], b[0], b[1]);
        mma(acc[mq][2 * nb + 1], a[mq], b[2], b[3]);
      }
    }
  }
}

// S = Q K^T with f32 accumulators over NT * 8 keys.
template <int NT>
__device__ __forceinline__ void qk_f32(const FragAddrs& f, u32_t k_base, float (&s)[MMA_Q][NT][4]) {
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mq][nt][e] = 0.0f;
  qk_tiles(f, k_base, s, [](float (&c)[4], const u32_t (&a)[4], u32_t b0, u32_t b1) { mma_f32acc<DTypeIn>(c, a, b0, b1); });
}

// Bytes between the 8-row groups of a 128-byte swizzled tile (wgmma's stride byte offset).
constexpr u32_t SW128_GROUP_BYTES = 8 * 128;

// The products of S = Q K^T by wgmma: for each m64 tile mq of the warpgroup's rows (from Q row
// `q_base` on; this warp's 16 rows of it in the accumulator of tile mq) and k16 step kk,
// `product(mq, kk, a, b)` issues one product (m64n64k16, or m64n32k16 for a piece) of the
// descriptors a (Q) and b (the K rows from `k_base` on), both K-major in shared memory (a k16
// step is 32 bytes into a column's swizzled rows, four steps a column). Waits for the products
// before returning.
template <typename Product>
__device__ __forceinline__ void qk_wgmma_products(u32_t q_base, u32_t k_base, Product product) {
  const WgmmaDesc q = WgmmaDesc::sw128(q_base, 16, SW128_GROUP_BYTES);
  const WgmmaDesc k = WgmmaDesc::sw128(k_base, 16, SW128_GROUP_BYTES);
  wgmma_fence();
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int kk = 0; kk < spec::HEAD_DIM_QK / 16; ++kk) {
      const u32_t k_step = (kk / 4) * KTile::GROUP_BYTES + (kk % 4) * 32;
      const u32_t q_step = (kk / 4) * QTile::GROUP_BYTES + (kk % 4) * 32;
      product(mq, kk, q.at(mq * 64 * QTile::ROW_BYTES + q_step), k.at(k_step));
    }
  wgmma_commit();
  wgmma_wait<0>();
}

// S = Q K^T with f32 accumulators by wgmma over the NT * 8 keys from `k_base` on: a whole 64-key
// sub-tile (m64n64k16 products) or a 32-key piece of one (m64n32k16).
template <int NT>
__device__ __forceinline__ void qk_wgmma(u32_t q_base, u32_t k_base, float (&s)[MMA_Q][NT][4]) {
  static_assert(!WGMMA || NT == 8 || NT == 4, "one m64n64k16 or m64n32k16 product per m64 tile and k16 step");
  qk_wgmma_products(q_base, k_base, [&](int mq, int kk, u64_t a, u64_t b) {
    if constexpr (NT == 8) {
      wgmma_m64n64k16_ss<DTypeIn>(s[mq], a, b, kk > 0);
    } else {
      wgmma_m64n32k16_ss<DTypeIn>(s[mq], a, b, kk > 0);
    }
  });
}

// S = Q K^T with f16 accumulators by wgmma (the same products) into `acc`, which the caller has
// zeroed.
__device__ __forceinline__ void qk_wgmma_f16(u32_t q_base, u32_t k_base, u32_t (&acc)[MMA_Q][KV_NT][2]) {
  static_assert(!WGMMA || KV_NT == 8, "one m64n64k16 product per m64 tile and k16 step");
  qk_wgmma_products(q_base, k_base, [&](int mq, int, u64_t a, u64_t b) {
    wgmma_m64n64k16_ss_f16acc(reinterpret_cast<u32_t(&)[8][2]>(acc[mq][0]), a, b);
  });
}

// One m16n8 tile of S = Q K^T with f32 accumulators: m16 tile `mq`, n8 tile `nt` of the sub-tile
// at `k_base`, the same products in the same order as qk_f32 (so the same values as the f32-QK
// kernels). The overflow fallback of the f16-QK kernels: inline (no call, no stack) but small, kk
// not unrolled, and it needs only a few registers.
__device__ __forceinline__ void qk_tile_f32(const FragAddrs& f, u32_t k_base, int mq, int nt, float (&c)[4]) {
  c[0] = c[1] = c[2] = c[3] = 0.0f;
#pragma unroll 1
  for (int kk = 0; kk < spec::HEAD_DIM_QK / 16; ++kk) {
    u32_t a[4], b[4];
    ldmatrix_x4(a, f.q.at(f.q_base, mq * M16_ROW_STRIDE, kk * 2));
    ldmatrix_x4(b, f.k.at(k_base, (nt / 2) * 16, kk * 2));
    mma_f32acc<DTypeIn>(c, a, b[2 * (nt % 2)], b[2 * (nt % 2) + 1]);
  }
}

// S = Q K^T with f16 accumulators (rounded to f16 after each k16 step) into `acc`: mma.sync, or
// wgmma from the warpgroup's Q rows at `q_group_base`. Returns whether every accumulator of the
// warp is finite (with wgmma: of the warpgroup, whose warps must then take the same path to their
// next products), at one HFMA2 per accumulator register (a tree of f16x2_nonfinite_or) and one
// vote (a warpgroup barrier with wgmma).
// WARPGROUP_VOTE false: of the warp alone (a vote of its lanes), for a caller whose warps may take
// different paths to the same products (F16_WARP_CHOICE).
template <bool WARPGROUP_VOTE = WGMMA>
__device__ __forceinline__ bool qk_f16(const FragAddrs& f, u32_t q_group_base, u32_t k_base, int warpgroup,
                                       u32_t (&acc)[MMA_Q][KV_NT][2]) {
  constexpr int REGS = MMA_Q * KV_NT * 2;
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int nt = 0; nt < KV_NT; ++nt) acc[mq][nt][0] = acc[mq][nt][1] = 0u;
  if constexpr (WGMMA) {
    qk_wgmma_f16(q_group_base, k_base, acc);
  } else {
    qk_tiles(f, k_base, acc, [](u32_t (&c)[2], const u32_t (&a)[4], u32_t b0, u32_t b1) { mma_f16acc(c, a, b0, b1); });
  }
  // Pairwise tree, level l folding register i + 2^l into register i: tree[0] ends up non-finite
  // in a half iff some accumulator half is.
  u32_t tree[REGS];
#pragma unroll
  for (int i = 0; i < REGS; ++i) tree[i] = acc[i / (KV_NT * 2)][(i / 2) % KV_NT][i % 2];
#pragma unroll
  for (int l = 0; (1 << l) < REGS; ++l)
#pragma unroll
    for (int i = 0; i + (1 << l) < REGS; i += 2 << l) tree[i] = f16x2_nonfinite_or(tree[i + (1 << l)], tree[i]);
  if constexpr (WARPGROUP_VOTE) return warpgroup_all(f16x2_finite(tree[0]), warpgroup);
  return !__any_sync(0xffffffffu, !f16x2_finite(tree[0]));
}

// The f16 accumulators of keys [piece * NT * 8, (piece + 1) * NT * 8) of the sub-tile, widened
// exactly to f32. Unless `finite`, an accumulator that overflowed (inf or NaN: a non-finite
// partial sum never becomes finite again) is replaced by the f32-accumulated logit: n8 tile by
// n8 tile (warp-uniform, as the MMA needs) where some lane has one, each lane keeping its finite
// elements.
template <int NT>
__device__ __forceinline__ void widen_f16(const FragAddrs& f, u32_t k_base, const u32_t (&acc)[MMA_Q][KV_NT][2],
                                          int piece, bool finite, float (&s)[MMA_Q][NT][4]) {
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      f16x2_to_float2(acc[mq][piece * NT + nt][0], s[mq][nt][0], s[mq][nt][1]);
      f16x2_to_float2(acc[mq][piece * NT + nt][1], s[mq][nt][2], s[mq][nt][3]);
    }
  if (finite) return;
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      bool bad = false;
#pragma unroll
      for (int e = 0; e < 4; ++e) bad |= !isfinite(s[mq][nt][e]);
      if (__any_sync(0xffffffffu, bad)) {
        float c[4];
        qk_tile_f32(f, k_base, mq, piece * NT + nt, c);
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mq][nt][e] = isfinite(s[mq][nt][e]) ? s[mq][nt][e] : c[e];
      }
    }
}

// Turns accumulators into logits in the softmax's units in place (variant_logit, through the
// variant's small form when SMALL), then applies the mask (-inf). `s` holds keys k0.. of NT n8
// tiles.
template <bool NEEDS_MASK, bool SMALL, int NT>
__device__ __forceinline__ void logits_as(const PrefillParams& p, const RowCoords& rows, const RequestMaskContext& m,
                                          int kv_head, int k0, int lane, float (&s)[MMA_Q][NT][4]) {
  // A custom mask's bits for each of the thread's rows, read for the whole sub-tile at once
  // (custom_mask_row_bits) and shifted to this thread's first key: element (nt, e) of a row is
  // then bit (8 * nt) % 32 + e % 2 of word (8 * nt) / 32. Only with wgmma (its 16-row warps: two
  // rows per thread); the mma.sync tiles read each element's bit (mask_visible): with the 32-row
  // warps' four rows the words stayed live through the element loop and ptxas spilled more
  // (sm_80, f32-QK w4q2kv64 custom mask paged, 36/52 -> 72/92 bytes; NVRTC 13).
  constexpr bool CUSTOM_BITS = NEEDS_MASK && spec::MASK_KIND == MASK_CUSTOM && WGMMA;
  constexpr int MASK_WORDS = CUSTOM_BITS ? (NT * 8 + 31) / 32 : 1;
  u32_t mask_bits[MMA_Q][2][MASK_WORDS];
  if constexpr (CUSTOM_BITS) {
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        u32_t bits[MASK_WORDS];
        custom_mask_row_bits(m, rows.token[mq][h], k0, bits);
#pragma unroll
        for (int w = 0; w < MASK_WORDS; ++w)
          mask_bits[mq][h][w] = __funnelshift_r(bits[w], w + 1 < MASK_WORDS ? bits[w + 1] : 0u, 2 * (lane % 4));
      }
  }
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int h = e / 2;
        int kv_idx = k0 + nt * 8 + 2 * (lane % 4) + (e % 2);
        int qo_idx = rows.token[mq][h];
        int qo_head = rows.head[mq][h];
        float t = variant_logit<TRANSFORM_FROM_ACC, SMALL>(p.variant, s[mq][nt][e], p.post_scale, qo_idx, kv_idx,
                                                           qo_head, kv_head, m.qo_len, m.kv_len);
        if constexpr (NEEDS_MASK) {
          bool visible;
          if constexpr (CUSTOM_BITS) {
            // mask_visible's definition, padding rows included, without a branch.
            const u32_t bit = (mask_bits[mq][h][(8 * nt) / 32] >> ((8 * nt) % 32 + e % 2)) & 1u;
            visible = (kv_idx < m.kv_len) & (qo_idx < m.qo_len) & (bit != 0u);
          } else {
            visible = kv_idx < m.kv_len && mask_visible<spec::MASK_KIND>(m, qo_idx, kv_idx);
          }
          if constexpr (VARIANT_HAS_MASK) {
            visible = visible && logits_mask(p.variant, qo_idx, kv_idx, qo_head, kv_head, m.qo_len, m.kv_len);
          }
          t = visible ? t : neg_inf();
        }
        s[mq][nt][e] = t;
      }
}

// The largest |accumulator| of this thread's part of a sub-tile (a NaN accumulator is passed
// over, so it counts as within either form: both keep NaN).
template <int NT>
__device__ __forceinline__ float largest_magnitude(const float (&s)[MMA_Q][NT][4]) {
  float largest = 0.0f;
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) largest = fmaxf(largest, fabsf(s[mq][nt][e]));
  return largest;
}

// Whether the variant's small form holds for every accumulator of the warp's sub-tile.
// Warp-uniform.
template <int NT>
__device__ __forceinline__ bool small_form_holds(const VariantParams& params, const float (&s)[MMA_Q][NT][4]) {
  return __all_sync(0xffffffffu, largest_magnitude(s) <= small_form_acc_limit(params));
}

// logits_as, through the variant's small form where it has one and small_form_holds.
template <bool NEEDS_MASK, int NT>
__device__ __forceinline__ void logits(const PrefillParams& p, const RowCoords& rows, const RequestMaskContext& m,
                                       int kv_head, int k0, int lane, float (&s)[MMA_Q][NT][4]) {
  if constexpr (VARIANT_HAS_SMALL_FORM) {
    if (small_form_holds(p.variant, s)) {
      logits_as<NEEDS_MASK, true>(p, rows, m, kv_head, k0, lane, s);
      return;
    }
  }
  logits_as<NEEDS_MASK, false>(p, rows, m, kv_head, k0, lane, s);
}

// The A fragments of k16 block kk of P (F32Logits or F16Logits after the softmax update), one per
// m16 tile; with SUM_BY_MMA the block, as f16, also goes to the softmax's row sums.
template <typename Probs>
__device__ __forceinline__ void p_block_fragments(const Probs& P, Softmax& softmax, int kk, u32_t (&a)[MMA_Q][4]) {
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq) {
    a[mq][0] = P.p_pair(mq, 2 * kk, 0);
    a[mq][1] = P.p_pair(mq, 2 * kk, 1);
    a[mq][2] = P.p_pair(mq, 2 * kk + 1, 0);
    a[mq][3] = P.p_pair(mq, 2 * kk + 1, 1);
    if constexpr (SUM_BY_MMA) {
      const u32_t sa[4] = {P.sum_pair(mq, 2 * kk, 0), P.sum_pair(mq, 2 * kk, 1), P.sum_pair(mq, 2 * kk + 1, 0),
                           P.sum_pair(mq, 2 * kk + 1, 1)};
      softmax.accumulate_sums(mq, sa);
    }
  }
}

// O += P V for this warp's rows over the NT * 8 keys of `P` (F32Logits or F16Logits after the
// softmax update), V rows from `v_base`; with SUM_BY_MMA each k16 block of P, as f16, also goes to
// the softmax's row sums.
template <int NT, typename Probs>
__device__ __forceinline__ void pv(const FragAddrs& f, u32_t v_base, const Probs& P, Softmax& softmax,
                                   float (&o)[MMA_Q][VO_NT][4]) {
  if constexpr (WGMMA) {
    // Per k16 block of P: its A fragments packed, a fence (wgmma reads A registers
    // asynchronously), one m64n64k16 product per m64 tile and 64 columns of V (one column of the
    // tile), V N-major: 16 rows (keys) per k16 block, 2048 bytes; then at most one block's
    // products left in flight, so that two blocks' fragments are live, not all of them.
    const WgmmaDesc v = WgmmaDesc::sw128(v_base, VTile::GROUP_BYTES, SW128_GROUP_BYTES);
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
      u32_t a[MMA_Q][4];
      p_block_fragments(P, softmax, kk, a);
      wgmma_fence();
#pragma unroll
      for (int db = 0; db < VO_NT / 8; ++db) {
        const u64_t b = v.at(db * VTile::GROUP_BYTES + kk * 16 * 128);
#pragma unroll
        for (int mq = 0; mq < MMA_Q; ++mq)
          wgmma_m64n64k16_rs_nmajor<DTypeIn>(reinterpret_cast<float(&)[8][4]>(o[mq][db * 8]), a[mq], b);
      }
      wgmma_commit();
      wgmma_wait<1>();
    }
    wgmma_wait<0>();
    return;
  }
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    u32_t a[MMA_Q][4];
    p_block_fragments(P, softmax, kk, a);
#pragma unroll
    for (int db = 0; db < VO_NT / 2; ++db) {
      u32_t b[4];
      ldmatrix_x4_trans(b, f.v.at(v_base, kk * 16, db * 2));
#pragma unroll
      for (int mq = 0; mq < MMA_Q; ++mq) {
        mma_f32acc<DTypeIn>(o[mq][2 * db], a[mq], b[0], b[1]);
        mma_f32acc<DTypeIn>(o[mq][2 * db + 1], a[mq], b[2], b[3]);
      }
    }
  }
}

// Multiplies this thread's Q chunks (loaded by itself) by the f16 prescale, an exact power of two.
__device__ __forceinline__ void prescale_q(const QTile& q, unsigned char* q_bytes, float prescale,
                                           int warp, int lane) {
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
// LOOP_ROWS_FRESH: computed again at each use (coords_of) from a fresh read of the lane id (which
// the compiler cannot merge with the first one), so that nothing of them is live between the
// sub-tiles' logits. Without it the loop takes the RowCoords computed before it, as they are.
struct FreshRows {
  const QueryTile& tile;
  WarpRows warp_rows;
};
__device__ __forceinline__ const RowCoords& coords_of(const RowCoords& rows) { return rows; }
__device__ __forceinline__ RowCoords coords_of(const FreshRows& rows) {
  return rows.tile.row_coords(rows.warp_rows, lane_id());
}

// Writes this warp's normalised O rows (staged through its own rows of the Q tile, so the global
// stores are 16 bytes wide) and their LSE.
__device__ __forceinline__ void store_output(const PrefillParams& p, const QueryTile& tile, const RowCoords& rows,
                                             int qo_start, WarpRows warp_rows, int lane, unsigned char* q_bytes,
                                             const SmemTile<VO_CHUNKS>& stage, const float (&o)[MMA_Q][VO_NT][4],
                                             const float (&lse)[MMA_Q][2]) {
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Row lane / 4 of an 8-row group: its swizzle is the same for every chunk, so each store's
      // offset is this thread's offset XOR a constant plus a constant (FragOffsets).
      const FragOffsets<VO_CHUNKS> at(lane / 4, 0);
#pragma unroll
      for (int dt = 0; dt < VO_NT; ++dt) {
        u32_t packed = DTypeTraits<DTypeOut>::pack2(o[mq][dt][2 * h], o[mq][dt][2 * h + 1]);
        u32_t addr = at.at(stage.base, warp_rows.at(mq * 16 + 8 * h), dt) + 4 * (lane % 4);
        *reinterpret_cast<u32_t*>(q_bytes + (addr - stage.base)) = packed;
      }
      if (p.lse != nullptr && lane % 4 == 0 && rows.valid[mq][h]) {
        p.lse[static_cast<i64_t>(qo_start + rows.token[mq][h]) * p.num_qo_heads + rows.head[mq][h]] = lse[mq][h];
      }
    }
  __syncwarp();
  constexpr int WARP_ROWS = MMA_Q * 16;
  DTypeOut* out = static_cast<DTypeOut*>(p.o);
  // Lane i works out the address of the warp's row i; the chunk loop takes it from that lane.
  const i64_t lane_row = lane < WARP_ROWS ? tile.row_offset(warp_rows.at(lane), qo_start, p.o_stride_token, p.o_stride_head) : 0;
  for_lane_chunks<WARP_ROWS, VO_CHUNKS>(lane, [&](int r, int chunk) {
    const i64_t row = shfl_i64(lane_row, r);
    if (tile.valid(warp_rows.at(r))) {
      const uint4* src = reinterpret_cast<const uint4*>(q_bytes + (stage.chunk_addr(warp_rows.at(r), chunk) - stage.base));
      *reinterpret_cast<uint4*>(out + row + chunk * (16 / sizeof(DTypeOut))) = *src;
    }
  });
}

// Writes this thread's normalised O fragments (f32) and LSE of one KV chunk to the split-KV
// workspace, slot (token, query head, chunk).
__device__ __forceinline__ void store_partial(const PrefillParams& p, const RowCoords& rows, int qo_start, int chunk,
                                              int lane, const float (&o)[MMA_Q][VO_NT][4], const float (&lse)[MMA_Q][2]) {
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!rows.valid[mq][h]) continue;
      const i64_t slot =
          (static_cast<i64_t>(qo_start + rows.token[mq][h]) * p.num_qo_heads + rows.head[mq][h]) * p.max_chunks + chunk;
      float* dst = p.partial_o + slot * spec::HEAD_DIM_VO + 2 * (lane % 4);
#pragma unroll
      for (int dt = 0; dt < VO_NT; ++dt) {
        *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[mq][dt][2 * h], o[mq][dt][2 * h + 1]);
      }
      if (lane % 4 == 0) p.partial_lse[slot] = lse[mq][h];
    }
}

// The rest of a sub-tile's step once its logits are floats (s: NT n8 tiles, keys k0..; the rows'
// coordinates from `rows`, RowCoords or FreshRows): the mask
// and the transform where they apply, the softmax update and O += P V (V rows from v_base, once
// `await_v()` has returned).
// float_logits_update: the same up to the softmax update, leaving P in `s` (F32Logits) for the
// caller's P V.
template <int NT, typename Rows>
__device__ __forceinline__ void float_logits_update(const PrefillParams& p, const Rows& rows,
                                                    const RequestMaskContext& m, const QueryTile& tile, int tok_lo,
                                                    int tok_hi, int k0, int lane, float softmax_scale,
                                                    Softmax& softmax, float (&s)[MMA_Q][NT][4],
                                                    float (&o)[MMA_Q][VO_NT][4]) {
  // An unmasked sub-tile within the small form (from the accumulator) goes to the softmax as
  // FactoredSmallLogits: the transform merges into the exponents.
  // Within the short form too (VARIANT_HAS_SHORT_FORM), its cheaper factor: one more vote.
  bool factored = false, short_form = false;
  float largest = 0.0f;  // the largest |acc| of this thread, where a form is checked
  if (tile_needs_mask<spec::MASK_KIND, VARIANT_HAS_MASK>(m, tok_lo, tok_hi, k0, NT * 8)) {
    logits<true>(p, coords_of(rows), m, tile.kv_head, k0, lane, s);
  } else if constexpr (FACTORED_SMALL_FORM) {
    largest = largest_magnitude(s);
    factored = __all_sync(0xffffffffu, largest <= small_form_acc_limit(p.variant));
    if constexpr (VARIANT_HAS_SHORT_FORM) {
      short_form = factored && __all_sync(0xffffffffu, largest <= short_form_acc_limit(p.variant));
    }
    if (!factored) logits_as<false, false>(p, coords_of(rows), m, tile.kv_head, k0, lane, s);
  } else if constexpr (VARIANT_HAS_TRANSFORM) {
    logits<false>(p, coords_of(rows), m, tile.kv_head, k0, lane, s);
  }
  const F32Logits<MMA_Q, NT, DTypeIn> probs{s};
  if (short_form) {
    if constexpr (FACTORED_SMALL_FORM && VARIANT_HAS_SHORT_FORM) {
      softmax.update(FactoredSmallLogits<MMA_Q, NT, true>{s, p.variant, largest}, o, 1.0f);
    }
  } else if (FACTORED_SMALL_FORM && factored) {
    softmax.update(FactoredSmallLogits<MMA_Q, NT, false>{s, p.variant, largest}, o, 1.0f);
  } else {
    softmax.update(probs, o, softmax_scale);
  }
}
template <int NT, typename Rows, typename AwaitV>
__device__ __forceinline__ void float_logits_step(const PrefillParams& p, const Rows& rows,
                                                  const RequestMaskContext& m, const QueryTile& tile, int tok_lo,
                                                  int tok_hi, int k0, int lane, const FragAddrs& f, u32_t v_base,
                                                  float softmax_scale, Softmax& softmax,
                                                  float (&s)[MMA_Q][NT][4], float (&o)[MMA_Q][VO_NT][4],
                                                  AwaitV await_v) {
  float_logits_update(p, rows, m, tile, tok_lo, tok_hi, k0, lane, softmax_scale, softmax, s, o);
  await_v();
  pv<NT>(f, v_base, F32Logits<MMA_Q, NT, DTypeIn>{s}, softmax, o);
}

// The request's bounds as the KV loop reads them with BOUNDS_IN_SHARED: each warp's copy in
// BOUNDS_SLOT_BYTES of shared memory from `base` on (warp w's at base + w * BOUNDS_SLOT_BYTES),
// written by all its lanes at once (the same values) and read back where the loop uses them. The
// slot's address is formed from a fresh read of the thread index at each read.
struct SharedBounds {
  u32_t base;

  __device__ __forceinline__ void store(int qo_len, int kv_len, int tok_lo, int tok_hi) const {
    const u32_t slot = base + (threadIdx.x / 32) * BOUNDS_SLOT_BYTES;
    if constexpr (TOKENS_IN_SHARED) {
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
  // query tile's first and last token (TOKENS_IN_SHARED).
  __device__ __forceinline__ int kv_len() const { return ld_shared_s32(slot() + 4); }
  __device__ __forceinline__ RequestMaskContext mask(const RequestMaskContext& m) const {
    RequestMaskContext r = m;
    asm volatile("ld.shared.v2.s32 {%0, %1}, [%2];" : "=r"(r.qo_len), "=r"(r.kv_len) : "r"(slot()));
    return r;
  }
  __device__ __forceinline__ int tok_lo() const { return ld_shared_s32(slot() + 8); }
  __device__ __forceinline__ int tok_hi() const { return ld_shared_s32(slot() + 12); }
};

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
  // Q K^T takes 103 -> 76 instructions per tile and warp (f16 D=128 causal; SASS, NVRTC 13). With
  // f32 QK the same serialized the wgmma products (ptxas: insufficient register resources).
  const int warpgroup =
      NUM_WARPS > 4 ? (spec::QK_F16_ACCUM ? static_cast<int>(warp_uniform(warp / 4)) : warp / 4) : 0;
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
  // The K and V buffers of tile t (double-buffered: t % 2).
  auto k_tile = [&](int t) { return KTile{k_base + (t % KV_STAGES) * K_TILE_BYTES}; };
  auto v_tile = [&](int t) { return VTile{v_base + (t % KV_STAGES) * V_TILE_BYTES}; };

  const DTypeIn* q_ptr = static_cast<const DTypeIn*>(p.q);
  // Ragged rows start at the request's first key; paged rows at its first page.
  const i64_t kv_row0 = spec::KV_PAGED ? 0 : kv_start;
  const int* pages = spec::KV_PAGED ? p.kv_page_indices + p.kv_page_indptr[request] : nullptr;
  const KvRowsIn k_rows{static_cast<const DTypeIn*>(p.k) + kv_row0 * p.k_stride_token + tile.kv_head * p.k_stride_head,
                        p.k_stride_token, pages, p.k_page_stride, p.page_shift, p.page_mask};
  const KvRowsIn v_rows{static_cast<const DTypeIn*>(p.v) + kv_row0 * p.v_stride_token + tile.kv_head * p.v_stride_head,
                        p.v_stride_token, pages, p.v_page_stride, p.page_shift, p.page_mask};

  // Paged: the page ids of tile t sit in stage t % 2, copied there with tile t - 1's group (tile
  // 0's rows read the page table directly). The threads' K and V base pointers follow.
  const u32_t ids_base = v_base + KV_STAGES * V_TILE_BYTES;
  auto page_ids = [&](int t) { return ids_base + (t % 2) * KV_TILE * 4; };
  const KvSource<DTypeIn, spec::KV_PAGED, NUM_THREADS> kv_src(k_rows, v_rows, ids_base + PAGE_IDS_BYTES);

  // TMA_KV: the mbarrier of buffer t % 2 completes when tile t's boxes have landed (its
  // (t / 2)-th use: the phase parity tile t waits for). Whole tiles only.
  const u32_t tma_bars = ids_base + PAGE_IDS_BYTES + KV_BASES_BYTES;
  // The request's bounds as the KV loop takes them: from shared memory with BOUNDS_IN_SHARED
  // (stored here, before the first copy that reads them), else the registers of `m` and the token
  // range.
  const SharedBounds bounds{tma_bars + TMA_BARRIER_BYTES};
  if constexpr (BOUNDS_IN_SHARED) bounds.store(m.qo_len, m.kv_len, tok_lo, tok_hi);
  auto loop_kv_len = [&]() {
    if constexpr (BOUNDS_IN_SHARED) {
      return bounds.kv_len();
    } else {
      return m.kv_len;
    }
  };
  // (`m` itself otherwise, not a copy: passing a copy to the logits moved ptxas's register
  // allocation of the ALiBi kernels, 246 -> 254 registers for bf16 causal paged `w4q2kv64` at sm_80.)
  auto loop_mask = [&]() -> decltype(auto) {
    if constexpr (BOUNDS_IN_SHARED) {
      return bounds.mask(m);
    } else {
      return (m);
    }
  };
  auto loop_tok_lo = [&]() {
    if constexpr (TOKENS_IN_SHARED) {
      return bounds.tok_lo();
    } else {
      return tok_lo;
    }
  };
  auto loop_tok_hi = [&]() {
    if constexpr (TOKENS_IN_SHARED) {
      return bounds.tok_hi();
    } else {
      return tok_hi;
    }
  };
  const bool kv_tma = TMA_KV && p.kv_tma != 0;
  auto tma_tile = [&](int k0) { return kv_tma && m.kv_len - k0 >= KV_TILE; };
  auto tma_bar = [&](int t) { return tma_bars + static_cast<u32_t>(t % 2) * 8; };
  // Tile t (keys k0..) by the accelerator: issued by thread 0 alone.
  auto issue_tma = [&](int t, int k0) {
    const u32_t bar = tma_bar(t);
    mbarrier_arrive_expect_tx(bar, K_TILE_BYTES + V_TILE_BYTES);
    const int row = kv_start + k0;
#pragma unroll
    for (int g = 0; g < QK_CHUNKS / 8; ++g)
      tma_load_3d(k_tile(t).base + g * KTile::GROUP_BYTES, &p.k_tmap, g * 64, tile.kv_head, row, bar);
#pragma unroll
    for (int g = 0; g < VO_CHUNKS / 8; ++g)
      tma_load_3d(v_tile(t).base + g * VTile::GROUP_BYTES, &p.v_tmap, g * 64, tile.kv_head, row, bar);
  };

  // Paged: the page ids of tile t + 1 into stage (t + 1) % 2, which tile t - 1's copies were the
  // last to read (they were issued before the barrier that precedes this call).
  auto stage_next_page_ids = [&](int t) {
    const int k1 = kv_lo + (t + 1) * KV_TILE;
    if (t + 1 < num_tiles) stage_page_ids_async<KV_TILE, NUM_THREADS>(page_ids(t + 1), k_rows, k1, loop_kv_len() - k1);
  };
  // Tile t >= 1: K and V go to buffer t % 2 as one cp.async group, with the next tile's page ids.
  // The group is committed even when empty (past the last tile) so that every iteration waits for
  // the same groups. Tile 0 is loaded by the prologue, in two groups.
  auto load_kv = [&](int t) {
    if (t < num_tiles) {
      const int k0 = kv_lo + t * KV_TILE;
      if (tma_tile(k0)) {
        if (threadIdx.x == 0) issue_tma(t, k0);
      } else {
        load_kv_tiles_staged_async<KV_TILE, QK_CHUNKS, VO_CHUNKS, NUM_THREADS>(k_tile(t), v_tile(t), kv_src, page_ids(t),
                                                                               k0, loop_kv_len() - k0);
        stage_next_page_ids(t);
      }
    }
    cp_async_commit();
  };
  // One K/V buffer: tile t's K rows, or its V rows, as one cp.async group, committed even when
  // empty (past the last tile) so that every tile waits for the same groups.
  auto load_k = [&](int t) {
    if (t < num_tiles) {
      const int k0 = kv_lo + t * KV_TILE;
      load_kv_rows_async<KV_TILE, QK_CHUNKS, NUM_THREADS>(k_tile(t), k_rows, k0, m.kv_len - k0);
    }
    cp_async_commit();
  };
  auto load_v = [&](int t) {
    if (t < num_tiles) {
      const int k0 = kv_lo + t * KV_TILE;
      load_kv_rows_async<KV_TILE, VO_CHUNKS, NUM_THREADS>(v_tile(t), v_rows, k0, m.kv_len - k0);
    }
    cp_async_commit();
  };
  // With FIRST_V_LATE, tile 0's S = Q K^T is computed while its V rows still land (their own
  // group, the second of the prologue); before the first P V the CTA waits for them and publishes
  // them. Otherwise the first tile waits for both groups. With one K/V buffer every tile's V rows
  // are the newest group and awaited so; that barrier also tells that every warp is past this
  // tile's S = Q K^T, so with K_FREE_BEFORE_PV the caller then lets tile t + 1's K rows out
  // (otherwise the overflow fallback still reads K_t during P V: after the tile). This hook holds
  // nothing but v_pending: holding more (the K loader) moved ptxas's register allocation of the
  // two-buffer kernels, which do not use it (NVRTC 13, session 10).
  bool v_pending = FIRST_V_LATE;
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
        mbarrier_init_one(tma_bar(0));
        mbarrier_init_one(tma_bar(1));
      }
      __syncthreads();
    }
    {
      // This warp's block of Q rows; lane i works out the address of its row i.
      const int q_row0 = warp * Q_ROWS_PER_WARP;
      const i64_t lane_row =
          lane < Q_ROWS_PER_WARP ? tile.row_offset(q_row0 + lane, qo_start, p.q_stride_token, p.q_stride_head) : 0;
      for_lane_chunks<Q_ROWS_PER_WARP, QK_CHUNKS>(lane, [&](int r, int chunk) {
        const i64_t row = shfl_i64(lane_row, r);
        cp_async_16(q_tile.chunk_addr(q_row0 + r, chunk), q_ptr + row + chunk * (16 / sizeof(DTypeIn)), tile.valid(q_row0 + r));
      });
    }
    const bool tile0_tma = tma_tile(kv_lo);
    if (tile0_tma) {
      if (threadIdx.x == 0) issue_tma(0, kv_lo);
    } else {
      load_kv_rows_async<KV_TILE, QK_CHUNKS, NUM_THREADS>(k_tile(0), k_rows, kv_lo, m.kv_len - kv_lo);
      stage_next_page_ids(0);
    }
    cp_async_commit();  // the first group: Q, K_0 (and the page ids of tile 1)
    if (!tile0_tma) load_kv_rows_async<KV_TILE, VO_CHUNKS, NUM_THREADS>(v_tile(0), v_rows, kv_lo, m.kv_len - kv_lo);
    cp_async_commit();  // the second: V_0 (with TMA, both are the boxes)
    if constexpr (spec::QK_F16_ACCUM) {
      // Each thread scales the Q chunks it copied itself, once they have landed (with K_0, which
      // the first tile waits for anyway); the first tile's barrier publishes them. Out of the main
      // loop, whose registers it would otherwise share.
      wait_copies<1>();
      prescale_q(q_tile, smem, p.q_prescale, warp, lane);
    }
  }
  // The softmax folds this into its exponent: LOG2E after a transform, the whole scale otherwise.
  const float softmax_scale = VARIANT_HAS_TRANSFORM ? LOG2E : p.scale_log2;
  const FragAddrs frag(q_tile.base, warp_rows.first, lane);
  // With wgmma: the first Q row of this warp's warpgroup, whose products read from it; with
  // Q_DESC_IN_LOOP derived again in each sub-tile (q_base_now) from a fresh read of the thread
  // index, not held through the loop.
  const u32_t q_group_base = q_tile.base + warpgroup * WARPGROUP_ROWS * QTile::ROW_BYTES;
  auto q_base_now = [&]() {
    return Q_DESC_IN_LOOP ? q_tile.base + warp_uniform(thread_index() / 128) * WARPGROUP_ROWS * QTile::ROW_BYTES
                          : q_group_base;
  };
  // The rows' coordinates as the sub-tile loop's logits take them (RowCoords or FreshRows).
  const FreshRows fresh_rows{tile, warp_rows};
  auto loop_rows = [&]() -> const auto& {
    if constexpr (LOOP_ROWS_FRESH) {
      return fresh_rows;
    } else {
      return rows;
    }
  };
  for (int t = 0; t < num_tiles; ++t) {
    if constexpr (SINGLE_BUFFER) {
      // K_t has landed (tile 0: with Q). In flight: tile 0's V rows (the prologue's second group),
      // without K_FREE_BEFORE_PV every tile's (issued after the tile before); with it, V_t goes out
      // here, now that every warp is done with tile t - 1's P V, and lands during S = Q K^T (one
      // barrier per tile fewer: H200, session 10, +0.3% to +1.3% at D=256; with f16 QK, whose K
      // then still loaded after the tile, the later V cost 4%). V_t is awaited before P V.
      if (!K_FREE_BEFORE_PV || t == 0) {
        wait_copies<1>();
      } else {
        wait_copies<0>();
      }
      __syncthreads();
      if constexpr (K_FREE_BEFORE_PV) {
        if (t > 0) load_v(t);
      }
      v_pending = true;
    } else {
      // K_t and V_t have landed (tile 0: Q and K_0; V_0 too unless FIRST_V_LATE; by the
      // accelerator, both with tile 0).
      if (tma_tile(kv_lo + t * KV_TILE)) mbarrier_wait_parity(tma_bar(t), static_cast<u32_t>(t / 2) & 1u);
      if (t > 0 || !FIRST_V_LATE) {
        wait_copies<0>();
      } else {
        wait_copies<1>();
      }
      __syncthreads();
      // Every warp is done with tile t - 1: tile t + 1 may overwrite its buffers, and loads
      // while this whole tile computes.
      load_kv(t + 1);
    }
    // Not unrolled: sub-tiles share no registers, and unrolling would keep two sets of
    // addresses and fragments live. With key-split warps, warp w takes sub-tiles w, w + NUM_WARPS..
#pragma unroll 1
    for (int sub = WARPS_SPLIT_KEYS ? warp : 0; sub < KV_TILE / KV_SUB; sub += WARPS_SPLIT_KEYS ? NUM_WARPS : 1) {
      const int k0 = kv_lo + t * KV_TILE + sub * KV_SUB;
      if (k0 >= kv_hi) break;  // uniform: the rest of the last tile is masked for every row
      // (wgmma tiles compute whole tiles: sub is 0.) Rows are ROW_BYTES apart in either layout.
      // With wgmma the buffer is made warp-uniform for ptxas, so the K and V descriptors are
      // computed in uniform registers (where the loop counter was in a vector register: f16 QK).
      const u32_t stage = WGMMA ? warp_uniform(t % KV_STAGES) : t % KV_STAGES;
      const KTile k_sub{k_base + stage * K_TILE_BYTES + sub * KV_SUB * KTile::ROW_BYTES};
      const VTile v_sub{v_base + stage * V_TILE_BYTES + sub * KV_SUB * VTile::ROW_BYTES};
      // Waits for V_t before a P V; with one K/V buffer that barrier also frees K's buffer (every
      // warp is past its reads of K_t), so tile t + 1's K rows then load during P V: the steps of
      // K_FREE_BEFORE_PV (f32 QK: one piece with one buffer; f16 QK with one P V).
      auto await_v_free_k = [&]() {
        await_v();
        if constexpr (SINGLE_BUFFER) load_k(t + 1);
      };
      if constexpr (F16_WIDEN_FIRST) {
        // Every warp widens its accumulators (the overflow fallback included), then runs the
        // f32-QK kernels' step on the floats: one P V after one update, as there.
        u32_t acc[MMA_Q][KV_NT][2];
        const bool finite = qk_f16<false>(frag, q_base_now(), k_sub.base, warpgroup, acc);
        float s[MMA_Q][KV_NT][4];
        widen_f16(frag, k_sub.base, acc, 0, finite, s);
        float_logits_step(p, loop_rows(), loop_mask(), tile, loop_tok_lo(), loop_tok_hi(), k0, lane, frag, v_sub.base,
                          softmax_scale, softmax, s, o, await_v_free_k);
      } else if constexpr (F16_WARP_CHOICE) {
        u32_t acc[MMA_Q][KV_NT][2];
        const bool finite = qk_f16<false>(frag, q_base_now(), k_sub.base, warpgroup, acc);
        if (!VARIANT_HAS_TRANSFORM && finite &&
            !tile_needs_mask<spec::MASK_KIND, VARIANT_HAS_MASK>(loop_mask(), loop_tok_lo(), loop_tok_hi(), k0,
                                                                KV_SUB)) {
          softmax.update(F16Logits<MMA_Q, KV_NT>{acc}, o, softmax_scale);
        } else {
          float s[MMA_Q][KV_NT][4];
          widen_f16(frag, k_sub.base, acc, 0, finite, s);
          float_logits_update(p, loop_rows(), loop_mask(), tile, loop_tok_lo(), loop_tok_hi(), k0, lane, softmax_scale,
                              softmax, s, o);
          const F32Logits<MMA_Q, KV_NT, DTypeIn> probs{s};
#pragma unroll
          for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
            for (int nt = 0; nt < KV_NT; ++nt)
#pragma unroll
              for (int h = 0; h < 2; ++h) acc[mq][nt][h] = probs.p_pair(mq, nt, h);
        }
        await_v_free_k();
        pv<KV_NT>(frag, v_sub.base, F16Logits<MMA_Q, KV_NT>{acc}, softmax, o);
      } else if constexpr (spec::QK_F16_ACCUM) {
        u32_t acc[MMA_Q][KV_NT][2];
        const bool finite = qk_f16(frag, q_base_now(), k_sub.base, warpgroup, acc);
        if (!VARIANT_HAS_TRANSFORM && finite &&
            !tile_needs_mask<spec::MASK_KIND, VARIANT_HAS_MASK>(loop_mask(), loop_tok_lo(), loop_tok_hi(), k0,
                                                                KV_SUB)) {
          // The hot path: the softmax takes the accumulators as they are.
          const F16Logits<MMA_Q, KV_NT> probs{acc};
          softmax.update(probs, o, softmax_scale);
          await_v();
          pv<KV_NT>(frag, v_sub.base, probs, softmax, o);
        } else {
#pragma unroll
          for (int piece = 0; piece < KV_SUB / F16_FLOAT_PIECE; ++piece) {
            float s[MMA_Q][F16_FLOAT_PIECE / 8][4];
            widen_f16(frag, k_sub.base, acc, piece, finite, s);
            float_logits_step(p, loop_rows(), loop_mask(), tile, loop_tok_lo(), loop_tok_hi(),
                              k0 + piece * F16_FLOAT_PIECE, lane, frag,
                              v_sub.base + piece * F16_FLOAT_PIECE * VTile::ROW_BYTES, softmax_scale, softmax, s, o,
                              await_v);
          }
        }
      } else {
        // Piece by piece (F32_PIECE; one piece of the whole sub-tile unless the logits are heavy).
        // Not unrolled: unrolled, ptxas overlapped the two pieces and spilled more than with the
        // whole sub-tile (NVRTC 13, sm_80 f32-QK window w4q2kv64: 0 -> 80/88 B).
#pragma unroll 1
        for (int piece = 0; piece < KV_SUB / F32_PIECE; ++piece) {
          float s[MMA_Q][F32_PIECE / 8][4];
          const u32_t k_piece = k_sub.base + piece * F32_PIECE * KTile::ROW_BYTES;
          const u32_t v_piece = v_sub.base + piece * F32_PIECE * VTile::ROW_BYTES;
          if constexpr (WGMMA) {
            qk_wgmma(q_group_base, k_piece, s);
          } else {
            qk_f32(frag, k_piece, s);
          }
          float_logits_step(p, loop_rows(), loop_mask(), tile, loop_tok_lo(), loop_tok_hi(), k0 + piece * F32_PIECE, lane,
                            frag, v_piece, softmax_scale, softmax, s, o, await_v_free_k);
        }
      }
    }
    if constexpr (SINGLE_BUFFER) {
      if (v_pending) {
        // A warp that took no sub-tile still meets the V barrier (and issues K_{t+1}) once.
        await_v();
        if constexpr (K_FREE_BEFORE_PV) load_k(t + 1);
      }
      if constexpr (!K_FREE_BEFORE_PV) {
        // Every warp is done with V_t and K_t: tile t + 1's rows may overwrite them.
        __syncthreads();
        load_k(t + 1);
        load_v(t + 1);
      }
    }
  }

  if constexpr (WARPS_SPLIT_KEYS) {
    // The K/V buffers are free once every warp is past its last tile (the last real groups were
    // waited for; later ones are empty): they hold the states warp 0 merges, then it alone goes on.
    float* scratch = reinterpret_cast<float*>(smem + Q_TILE_BYTES);
    if (!merge_warp_states<NUM_WARPS>(softmax, o, scratch, warp, lane)) return;
  }

  // The 64-key sub-tiles need every register of the main loop: the rows' coordinates the epilogue
  // uses are computed again here rather than held through the loop. From a fresh read of the lane
  // id, which the compiler cannot merge with the first one (it would otherwise reuse the first
  // results and keep them live after all). With LOOP_ROWS_FRESH the loop's logits do the same
  // (FreshRows), and the first ones are not used at all.
  if constexpr (EPILOGUE_RELOADS_QO_LEN) {
    int qo_len;
    asm volatile("ld.global.s32 %0, [%1];" : "=r"(qo_len) : "l"(&p.work[2 * blockIdx.x + 1].y));
    tile.packed_len = qo_len * p.group_size;
  }
  rows = tile.row_coords(warp_rows, lane_id());
  float sink_log2[MMA_Q][2];
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      sink_log2[mq][h] = VARIANT_HAS_SINK ? LOG2E * sink_logit(p.variant, rows.head[mq][h]) : 0.0f;
  float lse[MMA_Q][2];
  if (split) {
    // A chunk's partial result leaves the sink out: the merge adds it once.
    softmax.finish<false>(o, sink_log2, lse);
    store_partial(p, rows, qo_start, work.w, lane, o, lse);
    return;
  }
  softmax.finish<VARIANT_HAS_SINK>(o, sink_log2, lse);
  // The Q tile becomes the output staging area once every warp is past its last S = Q K^T (no
  // copy is in flight: the last tile's groups were waited for, later ones are empty). With
  // key-split warps, warp 0 alone is left, and the merge's barriers already ordered it.
  if constexpr (!WARPS_SPLIT_KEYS) __syncthreads();
  store_output(p, tile, rows, qo_start, warp_rows, lane, smem, SmemTile<VO_CHUNKS>{q_tile.base}, o, lse);
}

}  // namespace prefill
