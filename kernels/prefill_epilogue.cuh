// prefill_epilogue.cuh — the stores at the end of a prefill CTA, once the softmax has normalised
// its state: the output rows and their LSE, or, when the plan splits the KV range, this chunk's
// partial result for the merge kernel (merge_state.cuh).
// Requires: online_softmax.cuh, variant.cuh, prefill_tile.cuh.

namespace prefill {

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

}  // namespace prefill
