// tma.cuh — tile copies by the tensor memory accelerator (sm_90a) and the mbarriers they signal.
//
// A tensor map (TmaMap, encoded on the host: cuda/tma.rs) describes ragged K or V, a
// [tokens, heads, dim] view, as a 3-D tensor whose box is 64 elements of one head's vector by 64
// tokens, with the 128-byte swizzle: a box lands as one column of the wgmma tile layout
// (smem_tile.cuh, ATOM_ROWS = 64), 64 rows of 128 bytes, chunk c of row r at (c ^ (r % 8)) * 16,
// its base 1024-byte aligned. Boxes past the tensor's end are zero-filled, and still count their
// whole size.
// One thread issues a tile's copies and the expected byte count on the tile's mbarrier; every
// thread waits for the barrier's phase. A stage's barrier completes once per use, so the parity
// a tile waits for is its use count of the stage, modulo 2.
// Requires: common.cuh.

// Initialises the mbarrier at `bar` (8 bytes of shared memory) for one arriving thread, and makes
// the initialisation visible to the async proxy (the copies that complete on it). The caller then
// publishes it to the other threads with a barrier.
__device__ __forceinline__ void mbarrier_init_one(u32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The arriving thread's arrival, announcing `bytes` that copies will complete on the barrier.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32_t bar, u32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait_parity(u32_t bar, u32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Copies the box at coordinates (c0 elements, c1 heads, c2 tokens) of the tensor `map` to shared
// memory at `dst`, completing its bytes on the mbarrier at `bar`.
__device__ __forceinline__ void tma_load_3d(u32_t dst, const TmaMap* map, int c0, int c1, int c2, u32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];" ::"r"(dst),
      "l"(reinterpret_cast<u64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

