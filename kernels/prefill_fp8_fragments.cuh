// prefill_fp8_fragments.cuh — the key-split (decode) tile's products over an fp8 cache with
// policy::FP8_FRAGMENTS: the K and V fragments of mma.sync are read straight from the tile's codes
// in shared memory and decoded in registers (decode_fp8x2), so the codes are never expanded into
// f16/bf16 rows (KvLoads::expand_fp8 does nothing). Per code byte the tile then costs one
// shared-memory write (the copy) and one read, where the expansion cost a read, a two-byte write
// and the fragments' two-byte read, and the CTA no longer waits for the next tile's codes inside
// the tile.
//
// The K/V buffers hold the codes alone (K_TILE_BYTES, prefill_tile.cuh): code row r of a sub-tile
// at r * 128 from its base, run (16 codes) c of the row at fp8_code_run_at(r, c) in it
// (Fp8CodeSlots' dense rows, kv_rows.cuh).
//
// The products are sums, so their summed index may be taken in any order that both factors agree
// on; the fragments use three permutations, chosen so that each thread's codes are whole words:
// - S = Q K^T over head dims: at k16 step kk, slots 2c, 2c + 1, 2c + 8, 2c + 9 of thread c (lane %
//   4) hold dims d .. d + 3, d = 16 (c + 4 (kk / 4)) + 4 (kk % 4): one 32-bit word of codes of a
//   K row (word kk % 4 of run c + 4 (kk / 4)), whose halves are the two B registers; Q's copy
//   puts the same dims where ldmatrix gives them to those slots (fp8_fragments_q_dim), one
//   4-byte copy per two elements, once per CTA.
// - the keys of S: column n of n8 tile 2 nb + h is key 16 nb + 4 (n / 2) + 2 h + n % 2
//   (s_column_key, prefill_tile.cuh), so that slots 2c, 2c + 1, 2c + 8, 2c + 9 of the A
//   fragments of P (the softmax's P in S's layout, p_block_fragments) are keys 4c .. 4c + 3 of
//   their k16 block: the B fragments of V are four V rows at the same head dims;
// - O's columns: column n of n8 tile t is head dim 64 (t / 8) + 8 n + t % 8, so
//   that thread g (lane / 4) reads 8 consecutive codes (dims 64 M + 8 g ..) of each of its four
//   V rows; one byte permute per two pairs then gives each dim its pair of keys. The epilogue
//   writes O's columns back in order (store_output, store_partial).
// Every read is free of bank conflicts: see fp8_code_run_at.
// Requires: fp8.cuh, kv_rows.cuh (fp8_code_run_addr), prefill_tile.cuh, prefill_products.cuh
// (p_block_fragments, zero_products).

namespace prefill {

static_assert(!policy::FP8_FRAGMENTS || (WARPS_SPLIT_KEYS && !WGMMA && FP8_SCALES_AFTER_PRODUCTS && !spec::QK_F16_ACCUM &&
                                         spec::HEAD_DIM_QK == 128 && spec::HEAD_DIM_VO == 128 && KV_SUB % 16 == 0),
              "fp8 fragments: key-split mma.sync tiles with f32 QK at head dim 128");

// The head dim whose two elements (it and the next) Q's copy puts at word `w` (elements 2w, 2w + 1)
// of a Q tile row: position p = 16 kk + 8 h + 2 c + e, which ldmatrix gives thread c as slot
// 8 h + 2 c + e of k16 step kk, holds dim 16 (c + 4 (kk / 4)) + 4 (kk % 4) + 2 h + e.
__device__ __forceinline__ int fp8_fragments_q_dim(int w) {
  const int p = 2 * w, kk = p / 16, h = (p / 8) % 2, c = (p / 2) % 4;
  return 16 * (c + 4 * (kk / 4)) + 4 * (kk % 4) + 2 * h;
}

// S = Q K^T with f32 accumulators over the NT * 8 keys of the code rows from `k_base` on, in the
// permuted key order (s_column_key); Q's A fragments by ldmatrix from its permuted copy
// (fp8_fragments_q_dim), each K code word decoded straight into the two B registers.
template <int NT>
__device__ __forceinline__ void qk_f32_fp8_fragments(const FragAddrs& f, u32_t k_base, int lane,
                                                     float (&s)[MMA_Q][NT][4]) {
  static_assert(NT % 2 == 0, "whole 16-key blocks");
  const int g = lane / 4, c = lane % 4;
  zero_products(s);
  // Four k16 steps (64 head dims) at a time: one 16-byte run of codes per K row.
#pragma unroll
  for (int J = 0; J < spec::HEAD_DIM_QK / 64; ++J)
#pragma unroll
    for (int nb = 0; nb < NT / 2; ++nb) {
      uint4 kw[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        kw[h] = ld_shared_16(fp8_code_run_addr(k_base, 16 * nb + 4 * (g / 2) + 2 * h + g % 2, c + 4 * J));
#pragma unroll
      for (int step = 0; step < 4; ++step) {
        const int kk = 4 * J + step;
        u32_t a[MMA_Q][4];
#pragma unroll
        for (int mq = 0; mq < MMA_Q; ++mq) ldmatrix_x4(a[mq], f.q.at(f.q_base, mq * 16, kk * 2));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const u32_t word = step == 0 ? kw[h].x : step == 1 ? kw[h].y : step == 2 ? kw[h].z : kw[h].w;
          u32_t b0, b1;
          decode_fp8x4<DTypeIn, spec::KV_FP8>(word, b0, b1);
#pragma unroll
          for (int mq = 0; mq < MMA_Q; ++mq) mma_f32acc<DTypeIn>(s[mq][2 * nb + h], a[mq], b0, b1);
        }
      }
    }
}

// O += P V for this warp's rows over the NT * 8 keys of `P` (F32Logits after the softmax update),
// V's code rows from `v_base` on, O's columns permuted (see above).
template <int NT, typename Probs>
__device__ __forceinline__ void pv_fp8_fragments(u32_t v_base, int lane, const Probs& P, Softmax& softmax,
                                                 float (&o)[MMA_Q][VO_NT][4]) {
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    u32_t a[MMA_Q][4];
    p_block_fragments(P, softmax, kk, a);
#pragma unroll
    for (int M = 0; M < spec::HEAD_DIM_VO / 64; ++M) {
      // Keys 4c + q of the block, dims 64 M + 8 g .. + 7: 8 bytes of run 4 M + g / 2.
      uint2 w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) w[q] = ld_shared_8(fp8_code_run_addr(v_base, 16 * kk + 4 * c + q, 4 * M + g / 2) + 8 * (g % 2));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const u32_t k0 = half == 0 ? w[0].x : w[0].y, k1 = half == 0 ? w[1].x : w[1].y;
        const u32_t k2 = half == 0 ? w[2].x : w[2].y, k3 = half == 0 ? w[3].x : w[3].y;
        // Dims 2j and 2j + 1 of the four: the halves of these words hold the codes of keys
        // (4c, 4c + 1) and (4c + 2, 4c + 3) at one dim.
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          u32_t b0[2], b1[2];  // [dim 2j or 2j + 1]
          decode_fp8x4<DTypeIn, spec::KV_FP8>(__byte_perm(k0, k1, j == 0 ? 0x5140 : 0x7362), b0[0], b0[1]);
          decode_fp8x4<DTypeIn, spec::KV_FP8>(__byte_perm(k2, k3, j == 0 ? 0x5140 : 0x7362), b1[0], b1[1]);
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int mq = 0; mq < MMA_Q; ++mq)
              mma_f32acc<DTypeIn>(o[mq][8 * M + 4 * half + 2 * j + i], a[mq], b0[i], b1[i]);
        }
      }
    }
  }
}

}  // namespace prefill
