// common.cuh — element types, conversions and fast math for generated kernels.
//
// Generated kernels include no CUDA toolkit header: NVRTC alone compiles them. f16 and bf16 are
// stored as raw 16-bit patterns and converted with PTX instructions (round to nearest even).
// Requires: nothing. Provides: f16_t, bf16_t, DTypeTraits<T>, f16x2_to_float2, f16x2_nonfinite_or,
// f16x2_finite, f16x2_max, f16x2_mul, exp2_approx, log2_approx, rcp_approx, softcap_tanh,
// even_poly6, odd_poly7, tanh_accurate, neg_inf, lane_id, thread_index, warp_uniform, warp_max, warp_sum,
// shfl_i64, request_of, FastDivisor, TmaMap, the mask-kind constants, LOG2E and LN2.

typedef unsigned short u16_t;
typedef unsigned int u32_t;
typedef long long i64_t;
typedef unsigned long long u64_t;

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// A CUDA tensor map (CUtensorMap: 128 opaque bytes, 64-byte aligned), encoded on the host and
// passed in the kernel's parameter block (tma.cuh).
struct alignas(64) TmaMap {
  u64_t bits[16];
};

// Mask kinds, as KernelSpec renders them into the spec constants.
constexpr int MASK_NONE = 0;
constexpr int MASK_CAUSAL = 1;
constexpr int MASK_SLIDING_WINDOW = 2;
constexpr int MASK_CUSTOM = 3;

// a * b + c with a 64-bit product of 32-bit factors: one IMAD.WIDE.U32.
__device__ __forceinline__ u64_t mad_wide_u32(u32_t a, u32_t b, u64_t c) {
  u64_t r;
  asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(r) : "r"(a), "r"(b), "l"(c));
  return r;
}

// Division of 0 <= n < 2^31 by a divisor fixed for the launch, from the multiplier and shift the
// host computes (`codegen::FastDivisor`): a multiply-high, an add and a shift instead of the
// twenty-odd instructions of an int division. umulhi(n, magic) < n, so the sum fits in 32 bits.
struct FastDivisor {
  u32_t magic;
  int shift;
  __device__ __forceinline__ int div(int n) const {
    return static_cast<int>((__umulhi(static_cast<u32_t>(n), magic) + static_cast<u32_t>(n)) >> shift);
  }
};

// A 64-bit value from lane `src` of the warp (every lane takes part).
__device__ __forceinline__ i64_t shfl_i64(i64_t v, int src) {
  const u32_t lo = __shfl_sync(0xffffffffu, static_cast<u32_t>(v), src);
  const u32_t hi = __shfl_sync(0xffffffffu, static_cast<u32_t>(static_cast<unsigned long long>(v) >> 32), src);
  return static_cast<i64_t>((static_cast<unsigned long long>(hi) << 32) | lo);
}

// -infinity (NVRTC has no constexpr builtin for it without headers).
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

struct f16_t {
  u16_t bits;
};
struct bf16_t {
  u16_t bits;
};

template <typename T>
struct DTypeTraits;

template <>
struct DTypeTraits<f16_t> {
  static constexpr bool IS_BF16 = false;
  static constexpr u32_t ONE2 = 0x3c003c00u;  // (1, 1)
  // Packs two floats into an f16x2 register: `lo` in bits 0..15, `hi` in bits 16..31.
  static __device__ __forceinline__ u32_t pack2(float lo, float hi) {
    u32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  static __device__ __forceinline__ float to_float(u16_t x) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x));
    return r;
  }
};

template <>
struct DTypeTraits<bf16_t> {
  static constexpr bool IS_BF16 = true;
  static constexpr u32_t ONE2 = 0x3f803f80u;  // (1, 1)
  static __device__ __forceinline__ u32_t pack2(float lo, float hi) {
    u32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  static __device__ __forceinline__ float to_float(u16_t x) {
    return __uint_as_float(static_cast<u32_t>(x) << 16);
  }
};

// Exact widening of the two f16 halves of a register.
__device__ __forceinline__ void f16x2_to_float2(u32_t x, float& lo, float& hi) {
  u16_t l = static_cast<u16_t>(x & 0xffffu), h = static_cast<u16_t>(x >> 16);
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(l));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(h));
}

// x * 0 + y on f16x2, one HFMA2: non-finite (inf or NaN) in a half when that half of x or y is,
// else y's half. x * 0 is +-0 for finite x and NaN otherwise, and adding +-0 to a finite y is
// exact. Folding a set of registers pairwise leaves a register non-finite exactly where one of
// them was.
__device__ __forceinline__ u32_t f16x2_nonfinite_or(u32_t x, u32_t y) {
  u32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(0u), "r"(y));
  return r;
}

// Whether both f16 halves of x are finite: x * 0 + 0 is +0 in a finite half (+-0 + +0 rounds to
// +0) and NaN otherwise, so the register is zero exactly when both are. One HFMA2, one compare.
__device__ __forceinline__ bool f16x2_finite(u32_t x) { return f16x2_nonfinite_or(x, 0u) == 0u; }

// Halfwise max of two f16x2 registers (a NaN half loses to a number, as fmaxf).
__device__ __forceinline__ u32_t f16x2_max(u32_t a, u32_t b) {
  u32_t r;
  asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Multiplies both f16 halves by `s` (also f16x2), rounding to nearest even.
__device__ __forceinline__ u32_t f16x2_mul(u32_t a, u32_t s) {
  u32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(s));
  return r;
}

__device__ __forceinline__ float exp2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float log2_approx(float x) {
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// cap * tanh(s / cap) for cap > 0 with a single MUFU operation (ex2); `exp2_scale` is
// -2 * LOG2E / cap. tanh.approx.f32 is one MUFU operation too, but PTX bounds its relative error
// only by 2^-11 (0.02 in the logit at cap 50; measured on the H200, 8e-6 absolute: 4e-4 at cap
// 50), and a soft-cap built on it (Q scaled by sm_scale / cap, one MUFU.TANH per logit) ran 2-5%
// slower than the forms here at cap 50: two MUFU per logit make the exponent unit the limit
// (docs/kernel-design.md). An ex2 followed by rcp.approx costs two as well.
// With u = exp(-2|s| / cap) in [0, 1]: cap * tanh(|s| / cap) = cap * (R - 1), R = 2 / (1 + u)
// in [1, 2]. R comes from the FMA pipe instead of rcp: a cubic seed R0(u) (relative minimax
// error 1.7e-3 over u in [0, 1]) and one third-order correction R = R0 (1 + e + e^2) with the
// residual e = 1 - (1 + u) R0 / 2, which leaves a relative error e^3 < 6e-9. Absolute error of
// the result, emulated in f32 over |s| <= 200 cap: 2.2e-7 * cap with correctly rounded ex2,
// 2.7e-7 * cap at ex2's 2-ulp bound (docs/kernel-design.md).
// Edge cases: for |s| > ~44 cap (and +-inf), ex2 flushes u to 0 and the result is +-cap;
// s = +-0 gives 0; NaN stays NaN. 10 FMA/ALU-pipe instructions and one MUFU per call.
__device__ __forceinline__ float softcap_tanh(float s, float cap, float exp2_scale) {
  const float u = exp2_approx(fabsf(s) * exp2_scale);
  const float r0 = fmaf(fmaf(fmaf(-0.443674177f, u, 1.3310225f), u, -1.88561523f), u, 1.99653375f);
  const float e = fmaf(fmaf(u, -0.5f, -0.5f), r0, 1.0f);
  const float r = fmaf(r0, fmaf(e, e, e), r0);
  const float c = copysignf(cap, s);
  return fmaf(r, c, -c);
}

// c0 + c1 x^2 + c2 x^4 + c3 x^6 in one FMUL and 3 FFMA (the factor of odd_poly7, which a kernel
// can merge into the FFMA that uses it).
__device__ __forceinline__ float even_poly6(float x, float c0, float c1, float c2, float c3) {
  const float t = x * x;
  return fmaf(fmaf(fmaf(c3, t, c2), t, c1), t, c0);
}

// x (c0 + c1 x^2 + c2 x^4 + c3 x^6) in 2 FMUL and 3 FFMA, no MUFU: the soft-cap's form for
// small logits, cap * tanh(s / cap) for |s| <= cap / 2, with coefficients the host fits and scales
// (codegen/variant.rs: absolute error at most 2.3e-7 * cap, emulated in f32 with FMA). NaN stays
// NaN.
__device__ __forceinline__ float odd_poly7(float x, float c0, float c1, float c2, float c3) {
  return x * even_poly6(x, c0, c1, c2, c3);
}

// tanh with absolute error near 2e-7 (the soft-cap formula above with cap 1).
__device__ __forceinline__ float tanh_accurate(float x) { return softcap_tanh(x, 1.0f, -2.0f * LOG2E); }

// This thread's lane in its warp, read from the hardware register each time (volatile: two reads
// are never merged, so a value derived from one can be recomputed later instead of kept live).
__device__ __forceinline__ int lane_id() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

// `x`, which every lane of the (converged) warp holds, returned as lane 0's copy: a value ptxas
// then knows to be the same across the warp, so what is computed from it can stay in uniform
// registers (with wgmma: the descriptors of each product, one uniform instruction each rather
// than vector instructions and moves into uniform registers).
__device__ __forceinline__ u32_t warp_uniform(u32_t x) { return __shfl_sync(0xffffffffu, x, 0); }

// This thread's index in the (one-dimensional) CTA, read afresh as lane_id() is: for a value that
// is cheaper to derive again where it is used than to hold through a loop.
__device__ __forceinline__ int thread_index() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// Max and sum over the 32 lanes of a warp (every lane gets the result).
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

__device__ __forceinline__ float warp_max_quad(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

__device__ __forceinline__ float warp_sum_quad(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// The request holding row `i` of a ragged dimension with prefix sums `indptr` (`batch + 1`
// entries): the last r with indptr[r] <= i, which skips empty requests.
__device__ __forceinline__ int request_of(const int* indptr, int batch, int i) {
  int lo = 0, hi = batch;
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (indptr[mid] <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}
