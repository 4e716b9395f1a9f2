// tanh_approx_error.cu: the error of the hardware tanh (PTX tanh.approx.f32, SASS MUFU.TANH)
// against double tanh, over every f32 x in [2^-24, 32) (tanh is odd, so x > 0 covers both signs).
// Reports the largest relative and absolute errors and where they occur, and the largest error a
// soft-cap logit cap * tanh(s / cap) would carry from it (cap * absolute error). Built and run on
// the GPU machine by s27run1.sh: nvcc -O3 -arch=sm_90a tanh_approx_error.cu && ./a.out
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cmath>

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

struct Worst { double rel, rel_x, abs, abs_x; };

__global__ void scan(uint32_t first_bits, uint32_t count, Worst* out) {
  __shared__ Worst part[256];
  Worst w{0, 0, 0, 0};
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    uint32_t bits = first_bits + i;
    float x;
    memcpy(&x, &bits, 4);
    const double exact = tanh((double)x);
    const double got = (double)tanh_approx(x);
    const double abs_err = fabs(got - exact);
    const double rel_err = abs_err / fabs(exact);
    if (rel_err > w.rel) { w.rel = rel_err; w.rel_x = x; }
    if (abs_err > w.abs) { w.abs = abs_err; w.abs_x = x; }
  }
  part[threadIdx.x] = w;
  __syncthreads();
  if (threadIdx.x == 0) {
    Worst b = part[0];
    for (int t = 1; t < blockDim.x; ++t) {
      if (part[t].rel > b.rel) { b.rel = part[t].rel; b.rel_x = part[t].rel_x; }
      if (part[t].abs > b.abs) { b.abs = part[t].abs; b.abs_x = part[t].abs_x; }
    }
    out[blockIdx.x] = b;
  }
}

static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e)); exit(1); }
}

int main() {
  const int blocks = 4096, threads = 256;
  Worst* d;
  check(cudaMalloc(&d, blocks * sizeof(Worst)), "cudaMalloc");
  Worst* h = new Worst[blocks];
  printf("| x range | max rel err | at x | max abs err | at x | cap 50: max logit err |\n|---|---|---|---|---|---|\n");
  // One binade group at a time: [2^e, 2^(e+1)) for e = -24 .. 4.
  Worst all{0, 0, 0, 0};
  for (int e = -24; e <= 4; ++e) {
    float lo = ldexpf(1.0f, e);
    uint32_t lo_bits;
    memcpy(&lo_bits, &lo, 4);
    scan<<<blocks, threads>>>(lo_bits, 1u << 23, d);
    check(cudaGetLastError(), "launch");
    check(cudaMemcpy(h, d, blocks * sizeof(Worst), cudaMemcpyDeviceToHost), "copy");
    Worst b{0, 0, 0, 0};
    for (int i = 0; i < blocks; ++i) {
      if (h[i].rel > b.rel) { b.rel = h[i].rel; b.rel_x = h[i].rel_x; }
      if (h[i].abs > b.abs) { b.abs = h[i].abs; b.abs_x = h[i].abs_x; }
    }
    printf("| [2^%d, 2^%d) | %.3e (2^%.2f) | %.6g | %.3e | %.6g | %.3e |\n", e, e + 1, b.rel, log2(b.rel), b.rel_x,
           b.abs, b.abs_x, 50.0 * b.abs);
    if (b.rel > all.rel) { all.rel = b.rel; all.rel_x = b.rel_x; }
    if (b.abs > all.abs) { all.abs = b.abs; all.abs_x = b.abs_x; }
  }
  printf("\nall of [2^-24, 32): max rel err %.3e (2^%.2f) at x = %.6g; max abs err %.3e at x = %.6g;"
         " cap 50 logit error up to %.3e\n", all.rel, log2(all.rel), all.rel_x, all.abs, all.abs_x, 50.0 * all.abs);
  return 0;
}
