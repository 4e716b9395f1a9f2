// mma_accum_rate.cu: tensor-core throughput of mma.sync.m16n8k16 with f16 inputs, f16 against
// f32 accumulators, on the GPU this runs on. Every warp runs CHAINS independent accumulator
// chains of ITERS products each (enough independent work to fill the pipe); the grid fills every
// SM with WARPS_PER_SM warps. Prints TFLOP/s for each accumulator type and their ratio.
// Built and run on the GPU machine by s27run3.sh: nvcc -O3 -arch=sm_90a mma_accum_rate.cu && ./a.out
#include <cstdio>
#include <cstdlib>

constexpr int CHAINS = 8;
constexpr int ITERS = 4096;
constexpr int WARPS_PER_BLOCK = 8;

template <bool F16_ACC>
__global__ void mma_loop(unsigned seed, float* sink) {
  const unsigned a0 = seed ^ threadIdx.x, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u;
  const unsigned b0 = a0 * 11u, b1 = a0 * 13u;
  if constexpr (F16_ACC) {
    unsigned c[CHAINS][2] = {};
    for (int i = 0; i < ITERS; ++i) {
#pragma unroll
      for (int k = 0; k < CHAINS; ++k)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};"
            : "+r"(c[k][0]), "+r"(c[k][1])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    unsigned x = 0;
#pragma unroll
    for (int k = 0; k < CHAINS; ++k) x ^= c[k][0] ^ c[k][1];
    if (x == 0x12345678u) sink[threadIdx.x] = 1.0f;
  } else {
    float c[CHAINS][4] = {};
    for (int i = 0; i < ITERS; ++i) {
#pragma unroll
      for (int k = 0; k < CHAINS; ++k)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(c[k][0]), "+f"(c[k][1]), "+f"(c[k][2]), "+f"(c[k][3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    float x = 0;
#pragma unroll
    for (int k = 0; k < CHAINS; ++k) x += c[k][0] + c[k][1] + c[k][2] + c[k][3];
    if (x == 1.2345f) sink[threadIdx.x] = x;
  }
}

static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e)); exit(1); }
}

template <bool F16_ACC>
static double tflops(int sms, int blocks_per_sm, float* sink) {
  const int blocks = sms * blocks_per_sm;
  cudaEvent_t t0, t1;
  check(cudaEventCreate(&t0), "event");
  check(cudaEventCreate(&t1), "event");
  mma_loop<F16_ACC><<<blocks, WARPS_PER_BLOCK * 32>>>(1u, sink);  // warm-up
  check(cudaGetLastError(), "launch");
  float best = 1e30f;
  for (int r = 0; r < 5; ++r) {
    check(cudaEventRecord(t0), "record");
    mma_loop<F16_ACC><<<blocks, WARPS_PER_BLOCK * 32>>>(r + 2u, sink);
    check(cudaEventRecord(t1), "record");
    check(cudaEventSynchronize(t1), "sync");
    float ms;
    check(cudaEventElapsedTime(&ms, t0, t1), "elapsed");
    if (ms < best) best = ms;
  }
  const double flops = 2.0 * 16 * 8 * 16 * CHAINS * double(ITERS) * WARPS_PER_BLOCK * blocks;
  return flops / (best * 1e-3) / 1e12;
}

int main() {
  int sms;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  float* sink;
  check(cudaMalloc(&sink, 1024 * sizeof(float)), "malloc");
  printf("| warps per SM | f32 accumulators (TFLOP/s) | f16 accumulators (TFLOP/s) | f16 / f32 |\n|---|---|---|---|\n");
  for (int bps : {1, 2, 4}) {
    const double f32 = tflops<false>(sms, bps, sink), f16 = tflops<true>(sms, bps, sink);
    printf("| %d | %.1f | %.1f | %.3f |\n", bps * WARPS_PER_BLOCK, f32, f16, f16 / f32);
  }
  return 0;
}
