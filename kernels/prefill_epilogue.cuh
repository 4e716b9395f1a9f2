// prefill_epilogue.cuh — the epilogue of a prefill CTA (write_result): the softmax's
// normalisation, then the output rows and their LSE, or, when the plan splits the KV range, this
// chunk's partial result for the merge kernel (merge_state.cuh).
// Requires: online_softmax.cuh, variant.cuh, kv_rows.cuh (kv_scale), prefill_tile.cuh, prefill_products.cuh
// (scale_products). With policy::FP8_FRAGMENTS O's columns arrive permuted (prefill_fp8_fragments.cuh)
// and are written back in order.

namespace prefill {

// Writes this warp's normalised O rows (staged through its own rows of `stage`, in either layout of
// smem_tile.cuh, so the global stores are 16 bytes wide) and their LSE.
template <int ATOM_ROWS>
__device__ __forceinline__ void store_output(const PrefillParams& p, const QueryTile& tile, const RowCoords& rows,
                                             int qo_start, WarpRows warp_rows, int lane, unsigned char* q_bytes,
                                             const SmemTile<VO_CHUNKS, ATOM_ROWS>& stage,
                                             const float (&o)[MMA_Q][VO_NT][4], const float (&lse)[MMA_Q][2]) {
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (policy::FP8_FRAGMENTS) {
        // Permuted columns (prefill_fp8_fragments.cuh): n8 tiles 8 M .. 8 M + 7 hold dims 64 M +
        // 16 (lane % 4) + 8 e + 0..7 in their element e of this row, one 16-byte chunk per M and e.
        const int row = warp_rows.at(mq * 16 + 8 * h + lane / 4);
#pragma unroll
        for (int M = 0; M < VO_NT / 8; ++M)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            u32_t packed[4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
              packed[i] =
                  DTypeTraits<DTypeOut>::pack2(o[mq][8 * M + 2 * i][2 * h + e], o[mq][8 * M + 2 * i + 1][2 * h + e]);
            st_shared_16(stage.chunk_addr(row, 8 * M + 2 * (lane % 4) + e),
                         make_uint4(packed[0], packed[1], packed[2], packed[3]));
          }
      } else {
        // Row lane / 4 of an 8-row group: its swizzle is the same for every chunk, so each store's
        // offset is this thread's offset XOR a constant plus a constant (FragOffsets).
        const FragOffsets<VO_CHUNKS, ATOM_ROWS> at(lane / 4, 0);
#pragma unroll
        for (int dt = 0; dt < VO_NT; ++dt) {
          u32_t packed = DTypeTraits<DTypeOut>::pack2(o[mq][dt][2 * h], o[mq][dt][2 * h + 1]);
          u32_t addr = at.at(stage.base, warp_rows.at(mq * 16 + 8 * h), dt) + 4 * (lane % 4);
          *reinterpret_cast<u32_t*>(q_bytes + (addr - stage.base)) = packed;
        }
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
      float* row = p.partial_o + slot * spec::HEAD_DIM_VO;
      if constexpr (policy::FP8_FRAGMENTS) {
        // Permuted columns, as in store_output: dims 64 M + 16 (lane % 4) + 8 e + 0..7.
#pragma unroll
        for (int M = 0; M < VO_NT / 8; ++M)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float* dst = row + 64 * M + 16 * (lane % 4) + 8 * e;
            const float (&x)[VO_NT][4] = o[mq];
            *reinterpret_cast<float4*>(dst) = make_float4(x[8 * M][2 * h + e], x[8 * M + 1][2 * h + e],
                                                          x[8 * M + 2][2 * h + e], x[8 * M + 3][2 * h + e]);
            *reinterpret_cast<float4*>(dst + 4) = make_float4(x[8 * M + 4][2 * h + e], x[8 * M + 5][2 * h + e],
                                                              x[8 * M + 6][2 * h + e], x[8 * M + 7][2 * h + e]);
          }
      } else {
        float* dst = row + 2 * (lane % 4);
#pragma unroll
        for (int dt = 0; dt < VO_NT; ++dt) {
          *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[mq][dt][2 * h], o[mq][dt][2 * h + 1]);
        }
      }
      if (lane % 4 == 0) p.partial_lse[slot] = lse[mq][h];
    }
}

// The epilogue's context: run_cta's values it reads, by reference (the query tile and the rows'
// coordinates are updated in place: the epilogue computes the coordinates again).
struct CtaResult {
  const PrefillParams& p;
  QueryTile& tile;
  RowCoords& rows;
  const WarpRows& warp_rows;
  const int& qo_start;
  const int& chunk;  // the KV chunk, with a split plan
  const bool& split;
  const int& lane;
  unsigned char* const& smem;
  const QTile& q_tile;
};

// The epilogue, once the warps' states are merged (key-split warps): the softmax's normalisation,
// then the output rows and their LSE, or with a split plan this chunk's partial result. `lse` is
// the caller's (declared here, among write_result's own locals, it moved ptxas's register choices
// in the main loop of the f16-QK kernels).
__device__ __forceinline__ void write_result(const CtaResult& c, Softmax& softmax, float (&o)[MMA_Q][VO_NT][4],
                                             float (&lse)[MMA_Q][2]) {
  // The 64-key sub-tiles need every register of the main loop: the rows' coordinates the epilogue
  // uses are computed again here rather than held through the loop. From a fresh read of the lane
  // id, which the compiler cannot merge with the first one (it would otherwise reuse the first
  // results and keep them live after all). With policy::LOOP_ROWS_FRESH the loop's logits do the same
  // (FreshRows), and the first ones are not used at all.
  if constexpr (policy::EPILOGUE_RELOADS_QO_LEN) {
    int qo_len;
    asm volatile("ld.global.s32 %0, [%1];" : "=r"(qo_len) : "l"(&c.p.work[2 * blockIdx.x + 1].y));
    c.tile.packed_len = qo_len * c.p.group_size;
  }
  c.rows = c.tile.row_coords(c.warp_rows, lane_id());
  float sink_log2[MMA_Q][2];
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      sink_log2[mq][h] = VARIANT_HAS_SINK ? LOG2E * sink_logit(c.p.variant, c.rows.head[mq][h]) : 0.0f;
  if constexpr (FP8_SCALES_AFTER_PRODUCTS) {
    // The V scale of an fp8 cache whose tiles held the codes' exact values: O is linear in V, and
    // the normalisation (and a split's merge) after it.
    scale_products(o, kv_scale<spec::KV_FP8>(c.p.v_scale, c.p.kv_scale_head_stride, c.tile.kv_head));
  }
  if (c.split) {
    // A chunk's partial result leaves the sink out: the merge adds it once.
    softmax.finish<false>(o, sink_log2, lse);
    store_partial(c.p, c.rows, c.qo_start, c.chunk, c.lane, o, lse);
    return;
  }
  softmax.finish<VARIANT_HAS_SINK>(o, sink_log2, lse);
  // The Q tile becomes the output staging area once every warp is past its last S = Q K^T (no
  // copy is in flight: the last tile's groups were waited for, later ones are empty). With
  // key-split warps, warp 0 alone is left, and the merge's barriers already ordered it.
  if constexpr (!WARPS_SPLIT_KEYS) __syncthreads();
  store_output(c.p, c.tile, c.rows, c.qo_start, c.warp_rows, c.lane, c.smem, SmemTile<VO_CHUNKS>{c.q_tile.base}, o, lse);
}

}  // namespace prefill
