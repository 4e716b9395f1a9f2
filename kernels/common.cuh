// common.cuh — element types, conversions and fast math for generated kernels.
//
// Generated kernels include no CUDA toolkit header: NVRTC alone compiles them. f16 and bf16 are
// stored as raw 16-bit patterns and converted with PTX instructions (round to nearest even).
// Requires: nothing. Provides: f16_t, bf16_t, DTypeTraits<T>, exp2_approx, log2_approx,
// rcp_approx, tanh_accurate, neg_inf, warp_max, warp_sum, request_of, the mask-kind constants, LOG2E and LN2.

typedef unsigned short u16_t;
typedef unsigned int u32_t;
typedef long long i64_t;
typedef unsigned long long u64_t;

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

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

// tanh with absolute error near 1e-7 (tanh.approx.f32 has a relative error of 2^-11, too coarse
// for a soft-cap of 50: it would move logits by 0.02). tanh(x) = 1 - 2 / (exp(2x) + 1).
__device__ __forceinline__ float tanh_accurate(float x) {
  float e = exp2_approx(fminf(fabsf(x) * (2.0f * LOG2E), 126.0f));
  float t = 1.0f - 2.0f * rcp_approx(e + 1.0f);
  return copysignf(t, x);
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
