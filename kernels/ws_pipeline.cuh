// ws_pipeline.cuh — the synchronisation of the warp-specialised prefill kernel (prefill_ws.cuh):
// a ring of K/V stages between one producer warp and two consumer warpgroups, the named barriers
// that take the consumers' turns at the tensor cores, and the register hand-over between the
// roles (sm_90a).
//
// The ring: stage s holds a K tile and a V tile, each with a "full" mbarrier (over ragged K/V one
// arrival, the producer's, plus the bytes its TMA copies complete; over a paged cache one arrival
// per producer thread, made by its cp.async copies as they land) and an "empty" mbarrier (one arrival per
// consumer thread, once its warpgroup's products are done with those rows): K is free once S = Q K^T
// is, a tile before its V, so the producer can copy the next K tile while that V is still read.
// Tile t sits in stage t % STAGES; its (t / STAGES)-th use of the stage is the phase of parity
// (t / STAGES) % 2 of each of its barriers.
// Requires: common.cuh, mma.cuh, tma.cuh.

namespace ws {

// Initialises the mbarrier at `bar` for `count` arrivals per phase and makes the initialisation
// visible to the async proxy; a CTA barrier then publishes it.
__device__ __forceinline__ void mbarrier_init(u32_t bar, u32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival on the mbarrier at `bar` (release: this thread's earlier accesses to the stage are
// ordered before the phase completes).
__device__ __forceinline__ void mbarrier_arrive(u32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// An arrival on the mbarrier at `bar` once every cp.async this thread issued before has landed
// (the barrier's count includes it: .noinc), so the thread goes on without waiting for them.
__device__ __forceinline__ void cp_async_arrive(u32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// Named barrier `id` over `threads` threads: wait for all of them, or arrive without waiting.
__device__ __forceinline__ void named_sync(u32_t id, u32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(u32_t id, u32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// The register hand-over (every thread of the warpgroup executes it): the producer warpgroup
// gives registers back to the pool, each consumer warpgroup takes them.
template <int REGS>
__device__ __forceinline__ void registers_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void registers_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
}

// Which rows of a stage a barrier of the ring guards.
enum class Rows { K = 0, V = 1 };

// The K/V ring in shared memory: STAGES stages of K and V tiles and their barriers.
template <int STAGES, typename KTileT, typename VTileT, int K_BYTES, int V_BYTES>
struct KvRing {
  static constexpr int BARRIER_BYTES = 4 * STAGES * 8;
  u32_t k_base;  // K tiles, K_BYTES apart
  u32_t v_base;  // V tiles, V_BYTES apart
  u32_t bars;    // full barriers of K, then of V, then empty ones of K, then of V: STAGES each, 8 bytes

  __device__ __forceinline__ static int stage(int t) { return t % STAGES; }
  __device__ __forceinline__ static u32_t parity(int t) { return static_cast<u32_t>(t / STAGES) & 1u; }
  __device__ __forceinline__ KTileT k(int t) const { return KTileT{k_base + stage(t) * K_BYTES}; }
  __device__ __forceinline__ VTileT v(int t) const { return VTileT{v_base + stage(t) * V_BYTES}; }
  __device__ __forceinline__ u32_t full(Rows r, int t) const {
    return bars + (static_cast<int>(r) * STAGES + stage(t)) * 8;
  }
  __device__ __forceinline__ u32_t empty(Rows r, int t) const {
    return bars + ((2 + static_cast<int>(r)) * STAGES + stage(t)) * 8;
  }

  // One thread, before any other touches the ring: full barriers for `producers` arrivals (1 with
  // TMA, the producer threads with cp.async), empty ones for `consumers` arrivals.
  __device__ __forceinline__ void init(u32_t producers, u32_t consumers) const {
#pragma unroll
    for (int s = 0; s < STAGES; ++s)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const Rows r = static_cast<Rows>(i);
        mbarrier_init(full(r, s), producers);
        mbarrier_init(empty(r, s), consumers);
      }
  }
  // Producer: waits until tile t's rows `r` are free (every consumer is done with those of tile
  // t - STAGES).
  __device__ __forceinline__ void wait_empty(Rows r, int t) const {
    if (t >= STAGES) mbarrier_wait_parity(empty(r, t), parity(t - STAGES));
  }
  // Consumer: waits until tile t's rows `r` have landed.
  __device__ __forceinline__ void wait_full(Rows r, int t) const { mbarrier_wait_parity(full(r, t), parity(t)); }
  // Consumer: this thread is done with tile t's rows `r`.
  __device__ __forceinline__ void release(Rows r, int t) const { mbarrier_arrive(empty(r, t)); }
};

}  // namespace ws
