// mma.cuh — tensor-core and async-copy wrappers (sm_80 and newer).
//
// Fragment layouts are those of PTX `mma.m16n8k16` with g = lane / 4, t = lane % 4:
//   A (16x16, row-major), 4 registers of 2 elements: a0 (g, 2t), a1 (g+8, 2t), a2 (g, 2t+8),
//     a3 (g+8, 2t+8);
//   B (16x8, k x n), 2 registers: b0 (k = 2t, n = g), b1 (k = 2t+8, n = g);
//   C/D f32, 4 registers: c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1);
//   C/D f16, 2 registers: c0 (g, 2t..2t+1), c1 (g+8, 2t..2t+1).
// Requires: common.cuh. Provides: mma_f32acc<T>, mma_f16acc, ld_shared_16, ldmatrix_x4(_trans),
// cp.async.

template <typename T>
__device__ __forceinline__ void mma_f32acc(float c[4], const u32_t a[4], u32_t b0, u32_t b1);

template <>
__device__ __forceinline__ void mma_f32acc<f16_t>(float c[4], const u32_t a[4], u32_t b0, u32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_f32acc<bf16_t>(float c[4], const u32_t a[4], u32_t b0, u32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// f16 inputs, f16 accumulators: the accumulator is rounded to f16 after each k16 step.
__device__ __forceinline__ void mma_f16acc(u32_t c[2], const u32_t a[4], u32_t b0, u32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};"
      : "+r"(c[0]), "+r"(c[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ u32_t smem_addr(const void* p) {
  u32_t r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

// 16 bytes from shared memory.
__device__ __forceinline__ uint4 ld_shared_16(u32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

__device__ __forceinline__ void ldmatrix_x4(u32_t r[4], u32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32_t r[4], u32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Copies 16 bytes global -> shared asynchronously; when `valid` is false, writes 16 zero bytes
// and reads nothing (so padding rows hold zeros, never garbage that could become NaN).
__device__ __forceinline__ void cp_async_16(u32_t dst, const void* src, bool valid) {
  int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// Copies 4 bytes global -> shared asynchronously (zeros when `valid` is false).
__device__ __forceinline__ void cp_async_4(u32_t dst, const void* src, bool valid) {
  int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// Reads 4 bytes of shared memory.
__device__ __forceinline__ int ld_shared_s32(u32_t addr) {
  int v;
  asm volatile("ld.shared.s32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
