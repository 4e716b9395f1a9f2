// f16acc_probe.cu: which rounding the tensor cores' f16-accumulating mma.sync.m16n8k16 applies.
// Session 19 probe (not part of the product). D = A B + C with f16 A, B, C, D on random O(1)
// inputs, against four models of one output element (sum = the exact sum of its 16 products):
//   rn16  : RN(c + sum)                      (the reference's model, src/reference/logits.rs)
//   rz16  : RZ(c + sum)                      (truncation)
//   rn8x2 : RN(RN(c + sum of k 0..7) + sum of k 8..15)  (two k8 halves)
//   rz8x2 : RZ(RZ(c + sum of k 0..7) + sum of k 8..15)
// and prints how many of the outputs each model reproduces bit for bit, and the largest
// difference from rn16 in units of the result's f16 ulp. Build: nvcc -arch=sm_90a -O2.
#include <cuda_fp16.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); exit(1); } } while (0)

// One m16n8k16 product per warp: A row-major 16x16, B as [n][k] (8x16), C and D row-major 16x8.
__global__ void probe(const __half* a, const __half* b, const __half* c, __half* d) {
  const int lane = threadIdx.x % 32, tile = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const __half* A = a + tile * 256; const __half* B = b + tile * 128;
  const __half* C = c + tile * 128; __half* D = d + tile * 128;
  const int g = lane / 4, t = lane % 4;
  auto pack = [](__half lo, __half hi) {
    return static_cast<uint32_t>(__half_as_ushort(lo)) | (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
  };
  uint32_t ra[4], rb[2], rc[2], rd[2];
  ra[0] = pack(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]);
  ra[1] = pack(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]);
  ra[2] = pack(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]);
  ra[3] = pack(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9]);
  rb[0] = pack(B[g * 16 + 2 * t], B[g * 16 + 2 * t + 1]);
  rb[1] = pack(B[g * 16 + 2 * t + 8], B[g * 16 + 2 * t + 9]);
  rc[0] = pack(C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1]);
  rc[1] = pack(C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]);
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%9};"
               : "=r"(rd[0]), "=r"(rd[1])
               : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]), "r"(rc[0]), "r"(rc[1]));
  D[g * 8 + 2 * t] = __ushort_as_half(rd[0] & 0xffff);
  D[g * 8 + 2 * t + 1] = __ushort_as_half(rd[0] >> 16);
  D[(g + 8) * 8 + 2 * t] = __ushort_as_half(rd[1] & 0xffff);
  D[(g + 8) * 8 + 2 * t + 1] = __ushort_as_half(rd[1] >> 16);
}

// Rounds x (exact in double) to f16: nearest-even or toward zero. Normal range only (the inputs
// keep |x| < 2^10; subnormal results are counted apart).
static double round_f16(double x, bool nearest) {
  if (x == 0.0) return 0.0;
  int e;
  std::frexp(std::fabs(x), &e);             // |x| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, e - 11);  // 11 significant bits
  const double q = x / ulp;
  double r = nearest ? std::nearbyint(q) : std::trunc(q);  // nearbyint: ties to even (default mode)
  return r * ulp;
}
static double ulp_of(double x) { int e; std::frexp(std::fabs(x), &e); return std::ldexp(1.0, e - 11); }

int main() {
  const int tiles = 1 << 14, warps_per_block = 4;
  std::vector<__half> a(tiles * 256), b(tiles * 128), c(tiles * 128), d(tiles * 128);
  srand(19);
  auto uni = [] { return 2.0 * rand() / RAND_MAX - 1.0; };
  for (auto& x : a) x = __float2half(static_cast<float>(2.0 * uni()));
  for (auto& x : b) x = __float2half(static_cast<float>(2.0 * uni()));
  for (auto& x : c) x = __float2half(static_cast<float>(8.0 * uni()));
  __half *da, *db, *dc, *dd;
  CHECK(cudaMalloc(&da, a.size() * 2)); CHECK(cudaMalloc(&db, b.size() * 2));
  CHECK(cudaMalloc(&dc, c.size() * 2)); CHECK(cudaMalloc(&dd, d.size() * 2));
  CHECK(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dc, c.data(), c.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dd, 0xff, d.size() * 2));  // NaN poison
  probe<<<tiles / warps_per_block, 32 * warps_per_block>>>(da, db, dc, dd);
  CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(d.data(), dd, d.size() * 2, cudaMemcpyDeviceToHost));
  const char* names[4] = {"rn16", "rz16", "rn8x2", "rz8x2"};
  long match[4] = {0, 0, 0, 0}, total = 0, tiny = 0, none = 0;
  double worst_ulps = 0.0;
  for (int tile = 0; tile < tiles; ++tile)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        double lo = __half2float(c[tile * 128 + m * 8 + n]), hi = 0.0;
        for (int k = 0; k < 16; ++k) {
          const double p = double(__half2float(a[tile * 256 + m * 16 + k])) * __half2float(b[tile * 128 + n * 16 + k]);
          (k < 8 ? lo : hi) += p;  // exact: products of f16 have 22 bits, sums stay well within 53
        }
        const double got = __half2float(d[tile * 128 + m * 8 + n]);
        const double exact = lo + hi;
        if (std::fabs(exact) < std::ldexp(1.0, -14)) { ++tiny; continue; }
        const double model[4] = {round_f16(exact, true), round_f16(exact, false),
                                 round_f16(round_f16(lo, true) + hi, true), round_f16(round_f16(lo, false) + hi, false)};
        bool any = false;
        for (int i = 0; i < 4; ++i) if (got == model[i]) { ++match[i]; any = true; }
        if (!any) ++none;
        worst_ulps = std::fmax(worst_ulps, std::fabs(got - model[0]) / ulp_of(model[0]));
        ++total;
      }
  printf("f16-accumulating mma.sync.m16n8k16: %ld outputs compared (%ld near zero left out)\n", total, tiny);
  for (int i = 0; i < 4; ++i) printf("  %-6s reproduces %ld (%.4f%%)\n", names[i], match[i], 100.0 * match[i] / total);
  printf("  none of the models: %ld; largest |hw - rn16| = %.2f ulp\n", none, worst_ulps);
  return 0;
}
