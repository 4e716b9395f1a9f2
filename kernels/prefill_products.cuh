// prefill_products.cuh — the prefill tile's matrix products: S = Q K^T (f32 or f16 accumulators,
// with the f16 overflow check and its f32 fallback) and O += P V, by mma.sync (m16n8k16, fragments
// by ldmatrix) or, in wgmma tiles on sm_90a, by warpgroup MMAs (m64n64k16 and m64n32k16, operands
// by descriptor over the 128-byte swizzled tiles). Every product leaves its accumulators in the
// same fragment layout, so the step that follows (prefill_step.cuh) is the same code for both.
// Requires: mma.cuh, online_softmax.cuh, prefill_tile.cuh.

namespace prefill {

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

// acc = 0 for every accumulator of a product.
template <int NT>
__device__ __forceinline__ void zero_products(float (&acc)[MMA_Q][NT][4]) {
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mq][nt][e] = 0.0f;
}

// S = Q K^T with f32 accumulators over NT * 8 keys.
template <int NT>
__device__ __forceinline__ void qk_f32(const FragAddrs& f, u32_t k_base, float (&s)[MMA_Q][NT][4]) {
  zero_products(s);
  qk_tiles(f, k_base, s, [](float (&c)[4], const u32_t (&a)[4], u32_t b0, u32_t b1) { mma_f32acc<DTypeIn>(c, a, b0, b1); });
}

// acc *= scale for every accumulator of a product (an fp8 cache's K or V scale, applied to the
// products of tiles that hold the codes' exact values: FP8_SCALES_AFTER_PRODUCTS).
template <int NT>
__device__ __forceinline__ void scale_products(float (&acc)[MMA_Q][NT][4], float scale) {
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mq][nt][e] *= scale;
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
  // (The warp-specialised tiles, whose 128-key tiles it does not cover, issue their own: prefill_ws.cuh.)
  static_assert(!WGMMA || KV_NT == 8 || spec::WARP_SPECIALIZED, "one m64n64k16 product per m64 tile and k16 step");
  qk_wgmma_products(q_base, k_base, [&](int mq, int, u64_t a, u64_t b) {
    wgmma_m64n64k16_ss_f16acc(reinterpret_cast<u32_t(&)[8][2]>(acc[mq][0]), a, b, true);
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

// Whether every f16 accumulator in `acc` is finite in every thread of the warp (WARPGROUP_VOTE:
// of the warpgroup `warpgroup`, whose warps must then take the same path to their next products),
// at one HFMA2 per accumulator register (a pairwise tree of f16x2_nonfinite_or, level l folding
// register i + 2^l into register i, so that register 0 ends up non-finite in a half iff some
// accumulator half is) and one vote (a warpgroup barrier with WARPGROUP_VOTE).
template <bool WARPGROUP_VOTE, int M, int NT>
__device__ __forceinline__ bool f16_accumulators_finite(const u32_t (&acc)[M][NT][2], int warpgroup) {
  constexpr int REGS = M * NT * 2;
  u32_t tree[REGS];
#pragma unroll
  for (int i = 0; i < REGS; ++i) tree[i] = acc[i / (NT * 2)][(i / 2) % NT][i % 2];
#pragma unroll
  for (int l = 0; (1 << l) < REGS; ++l)
#pragma unroll
    for (int i = 0; i + (1 << l) < REGS; i += 2 << l) tree[i] = f16x2_nonfinite_or(tree[i + (1 << l)], tree[i]);
  if constexpr (WARPGROUP_VOTE) return warpgroup_all(f16x2_finite(tree[0]), warpgroup);
  return !__any_sync(0xffffffffu, !f16x2_finite(tree[0]));
}

// S = Q K^T with f16 accumulators (rounded to f16 after each k16 step) into `acc`: mma.sync, or
// wgmma from the warpgroup's Q rows at `q_group_base`. Returns whether every accumulator of the
// warp is finite (with wgmma: of the warpgroup, whose warps must then take the same path to their
// next products): f16_accumulators_finite.
// WARPGROUP_VOTE false: of the warp alone (a vote of its lanes), for a caller whose warps may take
// different paths to the same products (policy::F16_WARP_CHOICE).
template <bool WARPGROUP_VOTE = WGMMA>
__device__ __forceinline__ bool qk_f16(const FragAddrs& f, u32_t q_group_base, u32_t k_base, int warpgroup,
                                       u32_t (&acc)[MMA_Q][KV_NT][2]) {
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int nt = 0; nt < KV_NT; ++nt) acc[mq][nt][0] = acc[mq][nt][1] = 0u;
  if constexpr (WGMMA) {
    qk_wgmma_f16(q_group_base, k_base, acc);
  } else {
    qk_tiles(f, k_base, acc, [](u32_t (&c)[2], const u32_t (&a)[4], u32_t b0, u32_t b1) { mma_f16acc(c, a, b0, b1); });
  }
  return f16_accumulators_finite<WARPGROUP_VOTE>(acc, warpgroup);
}

// The f16 accumulators of keys [piece * NT * 8, (piece + 1) * NT * 8) of the sub-tile, widened
// exactly to f32. Unless `finite`, an accumulator that overflowed (inf or NaN: a non-finite
// partial sum never becomes finite again) is replaced by the f32-accumulated logit: n8 tile by
// n8 tile (warp-uniform, as the MMA needs) where some lane has one, each lane keeping its finite
// elements. `f` is the Q and K fragments' addresses that qk_tile_f32 takes (FragAddrs; the
// warp-specialised kernel passes its own, with an overload of qk_tile_f32).
template <int NT, typename Frags>
__device__ __forceinline__ void widen_f16(const Frags& f, u32_t k_base, const u32_t (&acc)[MMA_Q][KV_NT][2],
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

// The A fragments of k16 block kk of P (F32Logits or F16Logits after the softmax update), one per
// m16 tile; with policy::SUM_BY_MMA the block, as f16, also goes to the softmax's row sums.
template <typename Probs>
__device__ __forceinline__ void p_block_fragments(const Probs& P, Softmax& softmax, int kk, u32_t (&a)[MMA_Q][4]) {
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq) {
    a[mq][0] = P.p_pair(mq, 2 * kk, 0);
    a[mq][1] = P.p_pair(mq, 2 * kk, 1);
    a[mq][2] = P.p_pair(mq, 2 * kk + 1, 0);
    a[mq][3] = P.p_pair(mq, 2 * kk + 1, 1);
    if constexpr (policy::SUM_BY_MMA) {
      const u32_t sa[4] = {P.sum_pair(mq, 2 * kk, 0), P.sum_pair(mq, 2 * kk, 1), P.sum_pair(mq, 2 * kk + 1, 0),
                           P.sum_pair(mq, 2 * kk + 1, 1)};
      softmax.accumulate_sums(mq, sa);
    }
  }
}

// O += P V for this warp's rows over the NT * 8 keys of `P` (F32Logits or F16Logits after the
// softmax update), V rows from `v_base`; with policy::SUM_BY_MMA each k16 block of P, as f16, also goes to
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

}  // namespace prefill
