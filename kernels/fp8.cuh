// fp8.cuh — fp8 KV-cache codes (e4m3, e5m2): exact decoding, dequantisation to the tile's f16 or
// bf16, and the quantising encoding of the append. The definitions are docs/semantics.md's ("fp8
// KV cache") and `dtype::fp8`'s on the host:
// - decode(code) is exact in f32 (sm_89 and later: the cvt.rn.f16x2.e4m3x2/e5m2x2 instructions,
//   exact, then f16 -> f32; sm_80: the bit fields assembled by hand, e5m2 being the top byte of
//   an f16);
// - dequantised = T(decode(code) * scale): mul.rn.f32 (never flushed to zero), then cvt.rn to T,
//   exactly what the host reference computes (the f16-QK kernels' tiles);
// - decoded = T(decode(code)), exact (the f32-QK kernels' tiles and the key-split tiles' fragments
//   read from the codes, which apply the scale to the f32 logits and output instead);
// - encode(q): the nearest code, ties to even, magnitudes beyond the largest finite saturated,
//   NaN to 0x7F, written out in integer steps as the host does (f32_to_fp8; the append's
//   quantize8 computes q = x / scale as div.rn.f32 would, with fma_rn and rcp_rn_normal).
// Requires: common.cuh. Provides: KV_FP8_NONE, KV_FP8_E4M3, KV_FP8_E5M2, Select, fp8x2_to_float2,
// cvt_fp8x2_f16x2 (sm_89 and later), dequantize_fp8x8, decode_fp8x2, decode_fp8x4, decode_fp8x8, f32_to_fp8,
// mul_rn, fma_rn, rcp_rn_normal.

constexpr int KV_FP8_NONE = 0;
constexpr int KV_FP8_E4M3 = 1;
constexpr int KV_FP8_E5M2 = 2;

// Select<C, A, B>::type is A when C holds, else B.
template <bool C, typename A, typename B>
struct Select {
  using type = A;
};
template <typename A, typename B>
struct Select<false, A, B> {
  using type = B;
};

// a * b, rounded to nearest even, subnormals kept (whatever the compile flags say about f32).
__device__ __forceinline__ float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// a * b + c, rounded once to nearest even, subnormals kept.
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}

// 1 / a rounded to nearest even, for a in [2^-126, 2^125] (a normal a with a normal reciprocal):
// the hardware's approximation refined by one Newton step in fused multiply-adds, which is how
// rcp.rn.f32 computes that range (its fast path, without the branch to the general routine).
__device__ __forceinline__ float rcp_rn_normal(float a) {
  float r0, r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(a));
  const float e = fma_rn(-a, r0, 1.0f);
  r = fma_rn(r0, e, r0);
  return r;
}

// The exact value of one code (bits 0..7 of `c`).
template <int FMT>
__device__ __forceinline__ float fp8_to_float(u32_t c) {
  if constexpr (FMT == KV_FP8_E5M2) {
    // e5m2 is an f16 without its low 8 mantissa bits: same bias, infinities and NaNs.
    return DTypeTraits<f16_t>::to_float(static_cast<u16_t>((c & 0xffu) << 8));
  } else {
    const u32_t mag = c & 0x7fu;
    // Normal: rebias the exponent (7 -> 127) and move the 3 mantissa bits to the top of f32's.
    // Subnormal (exponent field 0): mantissa * 2^-9, exact.
    float x = (mag >> 3) != 0 ? __uint_as_float((mag << 20) + (120u << 23)) : static_cast<float>(mag) * 0.001953125f;
    if (mag == 0x7fu) x = __uint_as_float(0x7fc00000u);
    return (c & 0x80u) ? -x : x;
  }
}

#if __CUDA_ARCH__ >= 890
// The two codes in bits 0..15 of `c` (the low byte first) as an exact f16 pair: the conversion
// instruction (sm_89 and later).
template <int FMT>
__device__ __forceinline__ u32_t cvt_fp8x2_f16x2(u32_t c) {
  const u16_t codes = static_cast<u16_t>(c & 0xffffu);
  u32_t h2;
  if constexpr (FMT == KV_FP8_E5M2) {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(codes));
  } else {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(codes));
  }
  return h2;
}
#endif

// The exact values of the two codes in bits 0..15 of `c` (the low byte first).
template <int FMT>
__device__ __forceinline__ void fp8x2_to_float2(u32_t c, float& lo, float& hi) {
#if __CUDA_ARCH__ >= 890
  f16x2_to_float2(cvt_fp8x2_f16x2<FMT>(c), lo, hi);
#else
  lo = fp8_to_float<FMT>(c);
  hi = fp8_to_float<FMT>(c >> 8);
#endif
}

// Eight codes (`c.x` holds codes 0..3, low byte first) dequantised with `scale` to eight T values
// packed as a 16-byte tile chunk (element 0 in the low half of `.x`).
template <typename T, int FMT>
__device__ __forceinline__ uint4 dequantize_fp8x8(uint2 c, float scale) {
  u32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const u32_t word = i < 2 ? c.x : c.y;
    float lo, hi;
    fp8x2_to_float2<FMT>(word >> (16 * (i % 2)), lo, hi);
    out[i] = DTypeTraits<T>::pack2(mul_rn(lo, scale), mul_rn(hi, scale));
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// The two codes in bits 0..15 of `codes` (the low byte first) as their exact values in T, packed
// (the first in the low half): every e4m3 and e5m2 value is exact in f16 and in bf16, so this is
// the dequantisation with the scale left out (the kernels that apply it to the f32 logits and
// output, FP8_SCALES_AFTER_PRODUCTS). f16 on sm_89 and later: the conversion instruction alone.
template <typename T, int FMT>
__device__ __forceinline__ u32_t decode_fp8x2(u32_t codes) {
#if __CUDA_ARCH__ >= 890
  if constexpr (!DTypeTraits<T>::IS_BF16) return cvt_fp8x2_f16x2<FMT>(codes);
#endif
  float lo, hi;
  fp8x2_to_float2<FMT>(codes, lo, hi);
  return DTypeTraits<T>::pack2(lo, hi);
}

// The four codes of `word` (the low byte first) as decode_fp8x2 gives them: codes 0, 1 in `lo`,
// codes 2, 3 in `hi`. f16 on sm_89 and later: the word's halves split by mov, so that the second
// conversion reads the upper half in place (no shift).
template <typename T, int FMT>
__device__ __forceinline__ void decode_fp8x4(u32_t word, u32_t& lo, u32_t& hi) {
#if __CUDA_ARCH__ >= 890
  if constexpr (!DTypeTraits<T>::IS_BF16) {
    if constexpr (FMT == KV_FP8_E5M2) {
      asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e5m2x2 %0, l;\ncvt.rn.f16x2.e5m2x2 %1, h;\n}"
          : "=r"(lo), "=r"(hi)
          : "r"(word));
    } else {
      asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
          : "=r"(lo), "=r"(hi)
          : "r"(word));
    }
    return;
  }
#endif
  lo = decode_fp8x2<T, FMT>(word);
  hi = decode_fp8x2<T, FMT>(word >> 16);
}

// Eight codes (`c.x` holds codes 0..3, low byte first) as their exact values in T (decode_fp8x2),
// packed as a 16-byte tile chunk.
template <typename T, int FMT>
__device__ __forceinline__ uint4 decode_fp8x8(uint2 c) {
  u32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = decode_fp8x2<T, FMT>((i < 2 ? c.x : c.y) >> (16 * (i % 2)));
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// The code of x: nearest, ties to even, |x| beyond the largest finite value (infinities included)
// saturating to it, NaN to 0x7F, -0 to 0x80.
template <int FMT>
__device__ __forceinline__ u32_t f32_to_fp8(float x) {
  constexpr int M = FMT == KV_FP8_E4M3 ? 3 : 2;
  constexpr int BIAS = FMT == KV_FP8_E4M3 ? 7 : 15;
  constexpr float MAX_FINITE = FMT == KV_FP8_E4M3 ? 448.0f : 57344.0f;
  constexpr u32_t MAX_CODE = FMT == KV_FP8_E4M3 ? 0x7eu : 0x7bu;
  const u32_t bits = __float_as_uint(x);
  const u32_t sign = (bits >> 24) & 0x80u;
  const u32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return 0x7fu;
  const float a = __uint_as_float(abs_bits);
  if (a >= MAX_FINITE) return sign | MAX_CODE;
  // floor(log2(a)), at least the smallest normal exponent (an f32 subnormal gives -127).
  const int e = max(static_cast<int>(abs_bits >> 23) - 127, 1 - BIAS);
  // a / 2^(e - M) is exact (a power-of-two scaling to below 2^(M + 1)); rint rounds half to even.
  const float n = rintf(mul_rn(a, __uint_as_float(static_cast<u32_t>(127 + M - e) << 23)));
  u32_t q = static_cast<u32_t>(n);
  int exp = e;
  if (q == (1u << (M + 1))) {
    q >>= 1;
    exp += 1;
  }
  const u32_t code = q < (1u << M) ? q : ((static_cast<u32_t>(exp + BIAS) << M) | (q - (1u << M)));
  return sign | code;
}
