// mma.cuh — tensor-core and async-copy wrappers (sm_80 and newer).
//
// Fragment layouts are those of PTX `mma.m16n8k16` with g = lane / 4, t = lane % 4:
//   A (16x16, row-major), 4 registers of 2 elements: a0 (g, 2t), a1 (g+8, 2t), a2 (g, 2t+8),
//     a3 (g+8, 2t+8);
//   B (16x8, k x n), 2 registers: b0 (k = 2t, n = g), b1 (k = 2t+8, n = g);
//   C/D f32, 4 registers: c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1);
//   C/D f16, 2 registers: c0 (g, 2t..2t+1), c1 (g+8, 2t..2t+1).
// Requires: common.cuh. Provides: mma_f32acc<T>, mma_f16acc, ld_shared_16, ld_shared_8, st_shared_16, ldmatrix_x4(_trans),
// cp.async, and for sm_90a the wgmma products (f32 or f16 accumulators), descriptors, fences and
// warpgroup_all.

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

// 8 bytes from shared memory.
__device__ __forceinline__ uint2 ld_shared_8(u32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

// 16 bytes to shared memory.
__device__ __forceinline__ void st_shared_16(u32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
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

// ---- Warpgroup MMA (sm_90a only; kernels call these only when the spec's tile asks for wgmma) ----
//
// `wgmma.mma_async.m64n64k16`: the four warps of a warpgroup compute a 64x64 product together,
// warp w holding rows 16w..16w+15 of it. The accumulator of one thread is 8 n8 tiles of 4 floats
// in the mma.m16n8 C layout above (c[nt][0..1] row g, c[nt][2..3] row g + 8, columns 8 nt + 2t..),
// and an A operand taken from registers is the m16n8k16 A fragment of the warp's 16 rows: the
// same fragments as the mma.sync path, so the softmax code is shared. B (and A, when it comes
// from shared memory) is read through a matrix descriptor of a tile in the 128-byte swizzled
// layout: rows of 128 bytes, 16-byte chunk c of row r at position c ^ (r % 8), the 8-row groups
// 1024 bytes apart and 1024-byte aligned: SmemTile's column layout (smem_tile.cuh).

// The descriptor of a 128-byte swizzled operand at shared address `addr`: 8-row groups
// `group_bytes` apart (the stride byte offset), and `lead_bytes` between 64-element blocks of
// an N-major operand (the leading byte offset; unused for K-major swizzled operands).
__device__ __forceinline__ u64_t wgmma_desc_sw128(u32_t addr, u32_t lead_bytes, u32_t group_bytes) {
  return static_cast<u64_t>((addr & 0x3ffffu) >> 4) | (static_cast<u64_t>(lead_bytes >> 4) << 16) |
         (static_cast<u64_t>(group_bytes >> 4) << 32) | (1ull << 62);
}

// A descriptor built once for an operand's base address, then advanced to each k16 step or
// column block with one integer add to its low word (`at`), instead of building each product's
// descriptor from its address (five or six instructions, most of a product's issue cost). The
// low 14 bits hold address / 16; shared addresses stay below 2^18 (228 KiB at most), so
// base / 16 + bytes / 16 < 2^14 and the add never carries into the leading byte offset above.
struct WgmmaDesc {
  u32_t lo, hi;
  __device__ __forceinline__ static WgmmaDesc sw128(u32_t addr, u32_t lead_bytes, u32_t group_bytes) {
    const u64_t d = wgmma_desc_sw128(addr, lead_bytes, group_bytes);
    return {static_cast<u32_t>(d), static_cast<u32_t>(d >> 32)};
  }
  // The descriptor of the operand `bytes` (a multiple of 16) past the base.
  __device__ __forceinline__ u64_t at(u32_t bytes) const {
    return (static_cast<u64_t>(hi) << 32) | static_cast<u64_t>(lo + (bytes >> 4));
  }
};

// Orders this thread's earlier register writes before the next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most N committed groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

#define AF_WGMMA_D4(d, n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define AF_WGMMA_D32(d)                                                                                 \
  AF_WGMMA_D4(d, 0), AF_WGMMA_D4(d, 1), AF_WGMMA_D4(d, 2), AF_WGMMA_D4(d, 3), AF_WGMMA_D4(d, 4), \
      AF_WGMMA_D4(d, 5), AF_WGMMA_D4(d, 6), AF_WGMMA_D4(d, 7)
#define AF_WGMMA_D32_TEXT                                                                               \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
  "%27,%28,%29,%30,%31}"
#define AF_WGMMA_D64(d)                                                                                    \
  AF_WGMMA_D32(d), AF_WGMMA_D4(d, 8), AF_WGMMA_D4(d, 9), AF_WGMMA_D4(d, 10), AF_WGMMA_D4(d, 11), AF_WGMMA_D4(d, 12), \
      AF_WGMMA_D4(d, 13), AF_WGMMA_D4(d, 14), AF_WGMMA_D4(d, 15)
#define AF_WGMMA_D64_TEXT                                                                                   \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
  "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51," \
  "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define AF_WGMMA_D16(d) AF_WGMMA_D4(d, 0), AF_WGMMA_D4(d, 1), AF_WGMMA_D4(d, 2), AF_WGMMA_D4(d, 3)
#define AF_WGMMA_D16_TEXT "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
// f16 accumulators: 8 n8 tiles (from tile n) of two f16x2 registers a thread.
#define AF_WGMMA_H2(d, n) "+r"(d[n][0]), "+r"(d[n][1])
#define AF_WGMMA_H16_AT(d, n)                                                                                 \
  AF_WGMMA_H2(d, n), AF_WGMMA_H2(d, n + 1), AF_WGMMA_H2(d, n + 2), AF_WGMMA_H2(d, n + 3), AF_WGMMA_H2(d, n + 4), \
      AF_WGMMA_H2(d, n + 5), AF_WGMMA_H2(d, n + 6), AF_WGMMA_H2(d, n + 7)
#define AF_WGMMA_H16(d) AF_WGMMA_H16_AT(d, 0)
#define AF_WGMMA_H16_TEXT AF_WGMMA_D16_TEXT

// d (+)= A B, m64n64k16, f32 accumulators, A and B (K-major) from shared memory; `accumulate`
// false overwrites d.
template <typename T>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], u64_t a_desc, u64_t b_desc, bool accumulate);
// d += A B, m64n64k16, f32 accumulators, A from registers, B N-major (rows of K) from shared memory.
template <typename T>
__device__ __forceinline__ void wgmma_m64n64k16_rs_nmajor(float (&d)[8][4], const u32_t (&a)[4], u64_t b_desc);
// d (+)= A B, m64n32k16: as wgmma_m64n64k16_ss over 32 columns of B (its first 32 rows, K-major,
// from the descriptor's address): per thread 4 n8 tiles of 4 floats in the same layout, the first
// four of m64n64k16's (16 registers: N / 2). Sub-tiles of 32 keys of a 64-row K tile (4096 bytes,
// four 8-row groups, apart: the swizzle's 1024-byte period is kept).
template <typename T>
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[4][4], u64_t a_desc, u64_t b_desc, bool accumulate);

#define AF_WGMMA_SPECIALISE(T, PTX_T)                                                                         \
  template <>                                                                                                 \
  __device__ __forceinline__ void wgmma_m64n64k16_ss<T>(float (&d)[8][4], u64_t a_desc, u64_t b_desc,         \
                                                        bool accumulate) {                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                 \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32" PTX_T PTX_T " " AF_WGMMA_D32_TEXT              \
                 ", %32, %33, p, 1, 1, 0, 0;\n}"                                                              \
                 : AF_WGMMA_D32(d)                                                                            \
                 : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)));                             \
  }                                                                                                           \
  template <>                                                                                                 \
  __device__ __forceinline__ void wgmma_m64n64k16_rs_nmajor<T>(float (&d)[8][4], const u32_t (&a)[4],         \
                                                               u64_t b_desc) {                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                 \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32" PTX_T PTX_T " " AF_WGMMA_D32_TEXT              \
                 ", {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}"                                                   \
                 : AF_WGMMA_D32(d)                                                                            \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));                          \
  }                                                                                                           \
  template <>                                                                                                 \
  __device__ __forceinline__ void wgmma_m64n32k16_ss<T>(float (&d)[4][4], u64_t a_desc, u64_t b_desc,         \
                                                        bool accumulate) {                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                 \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32" PTX_T PTX_T " " AF_WGMMA_D16_TEXT              \
                 ", %16, %17, p, 1, 1, 0, 0;\n}"                                                              \
                 : AF_WGMMA_D16(d)                                                                            \
                 : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)));                             \
  }
AF_WGMMA_SPECIALISE(f16_t, ".f16")
AF_WGMMA_SPECIALISE(bf16_t, ".bf16")
#undef AF_WGMMA_SPECIALISE

// d (+)= A B, m64n64k16, f16 inputs and f16 accumulators (rounded to f16 after each product), A
// and B (K-major) from shared memory: per thread, 8 n8 tiles of two f16x2 registers in the
// mma.m16n8 f16 C layout (row g, then row g + 8); `accumulate` false overwrites d.
__device__ __forceinline__ void wgmma_m64n64k16_ss_f16acc(u32_t (&d)[8][2], u64_t a_desc, u64_t b_desc,
                                                          bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f16.f16.f16 "
      AF_WGMMA_H16_TEXT ", %16, %17, p, 1, 1, 0, 0;\n}"
      : AF_WGMMA_H16(d)
      : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)));
}

// Whether `pred` holds in every thread of this thread's warpgroup (warps 4g..4g + 3), through
// named barrier 1 + g: a decision that the warpgroup's wgmma products can follow together.
__device__ __forceinline__ bool warpgroup_all(bool pred, int warpgroup) {
  u32_t all;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.b32 p, %1, 0;\nbarrier.cta.red.and.pred q, %2, 128, p;\nselp.u32 %0, 1, 0, q;\n}"
      : "=r"(all)
      : "r"(static_cast<int>(pred)), "r"(1 + warpgroup)
      : "memory");
  return all != 0;
}

// Makes this thread's earlier shared-memory writes (cp.async copies it has waited for included)
// visible to the async proxy, in which wgmma reads its shared-memory operands; a barrier then
// publishes them to the other threads' wgmma.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
