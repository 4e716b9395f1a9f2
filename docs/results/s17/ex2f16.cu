// ex2.approx.f16 against exp2 in double over every f16 input in [-24, 9]: max and mean relative
// error, and the mean signed error (bias), per unit interval of x.
#include <cstdio>
#include <cmath>
#include <cuda_fp16.h>
__global__ void k(const unsigned short* in, unsigned short* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned int x = in[i] | (unsigned(in[i]) << 16), r;
  asm("ex2.approx.f16x2 %0, %1;" : "=r"(r) : "r"(x));
  out[i] = r & 0xffff;
}
int main() {
  static unsigned short h[65536], o[65536];
  int n = 0;
  for (int b = 0; b < 65536; ++b) {
    float f = __half2float(__ushort_as_half((unsigned short)b));
    if (std::isfinite(f) && f >= -24.0f && f <= 9.0f) h[n++] = b;
  }
  unsigned short *din, *dout;
  cudaMalloc(&din, n * 2); cudaMalloc(&dout, n * 2);
  cudaMemcpy(din, h, n * 2, cudaMemcpyHostToDevice);
  k<<<(n + 255) / 256, 256>>>(din, dout, n);
  if (cudaDeviceSynchronize() != cudaSuccess) { printf("launch failed\n"); return 1; }
  cudaMemcpy(o, dout, n * 2, cudaMemcpyDeviceToHost);
  double maxr[40] = {0}, sumr[40] = {0}, sums[40] = {0}, rmax = 0, rsum = 0; int cnt[40] = {0}, all = 0;
  double rnd_max = 0;  // error of exact exp2 rounded to f16, for comparison
  for (int i = 0; i < n; ++i) {
    double x = __half2float(__ushort_as_half(h[i]));
    double e = exp2(x), g = __half2float(__ushort_as_half(o[i]));
    if (e < 6.2e-5) continue;  // normal f16 results only
    double r = (g - e) / e, rr = (__half2float(__float2half((float)e)) - e) / e;
    int b = (int)floor(x) + 24;
    maxr[b] = fmax(maxr[b], fabs(r)); sumr[b] += fabs(r); sums[b] += r; cnt[b]++;
    rmax = fmax(rmax, fabs(r)); rsum += r; all++; rnd_max = fmax(rnd_max, fabs(rr));
  }
  printf("ex2.approx.f16: %d inputs, max rel err %.3e (2^%.2f), mean signed %.3e; exact-then-round max %.3e\n",
         all, rmax, log2(rmax), rsum / all, rnd_max);
  for (int b = 0; b < 40; ++b)
    if (cnt[b]) printf("  x in [%d,%d): n %d max %.2e mean|.| %.2e mean %.2e\n", b - 24, b - 23, cnt[b], maxr[b], sumr[b] / cnt[b], sums[b] / cnt[b]);
  return 0;
}
