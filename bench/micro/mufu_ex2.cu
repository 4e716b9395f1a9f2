// mufu_ex2.cu: throughput of the exponent instructions a softmax can use, on the GPU it runs on.
//
// Each thread runs CHAINS independent chains of N steps of one instruction form: ex2.approx.ftz.f32
// (MUFU.EX2), ex2.approx.f16 and ex2.approx.f16x2 (MUFU.EX2.F16, one or two per register), and a
// plain FFMA for scale. Prints, per form, elements per clock per SM (from the measured time and
// the SM clock that cudaDeviceProp reports, so a ratio between forms is the number to read).
//
//   nvcc -arch=sm_90a -O3 -o mufu_ex2 bench/micro/mufu_ex2.cu && ./mufu_ex2
#include <cstdio>
#include <cuda_runtime.h>
#include <cuda_fp16.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

constexpr int CHAINS = 8;
constexpr int N = 4096;

__global__ void f32_ex2(float* out, float seed) {
  float x[CHAINS];
  for (int c = 0; c < CHAINS; ++c) x[c] = seed * (threadIdx.x + c) * 1e-9f - 1.0f;
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x[c]));
  float s = 0; for (int c = 0; c < CHAINS; ++c) s += x[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

__global__ void f16_ex2(float* out, float seed) {
  unsigned short x[CHAINS];
  for (int c = 0; c < CHAINS; ++c) x[c] = __half_as_ushort(__float2half(seed * (threadIdx.x + c) * 1e-9f - 1.0f));
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) asm volatile("ex2.approx.f16 %0, %0;" : "+h"(x[c]));
  float s = 0; for (int c = 0; c < CHAINS; ++c) s += __half2float(__ushort_as_half(x[c]));
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

__global__ void f16x2_ex2(float* out, float seed) {
  unsigned x[CHAINS];
  for (int c = 0; c < CHAINS; ++c) { __half2 h = __float2half2_rn(seed * (threadIdx.x + c) * 1e-9f - 1.0f); x[c] = *reinterpret_cast<unsigned*>(&h); }
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(x[c]));
  float s = 0; for (int c = 0; c < CHAINS; ++c) { __half2 h = *reinterpret_cast<__half2*>(&x[c]); s += __low2float(h) + __high2float(h); }
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

__global__ void ffma(float* out, float seed) {
  float x[CHAINS];
  for (int c = 0; c < CHAINS; ++c) x[c] = seed * (threadIdx.x + c) * 1e-9f;
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) asm volatile("fma.rn.f32 %0, %0, 0f3F7FFFFF, 0f33800000;" : "+f"(x[c]));
  float s = 0; for (int c = 0; c < CHAINS; ++c) s += x[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const int blocks = prop.multiProcessorCount * 8, threads = 256;
  float* out;
  CHECK(cudaMalloc(&out, sizeof(float) * blocks * threads));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  struct Form { const char* name; void (*k)(float*, float); int per_instr; };
  Form forms[] = {{"ex2.approx.ftz.f32", f32_ex2, 1}, {"ex2.approx.f16", f16_ex2, 1},
                  {"ex2.approx.f16x2", f16x2_ex2, 2}, {"fma.rn.f32", ffma, 1}};
  printf("%s, %d SMs, %d MHz (reported)\n", prop.name, prop.multiProcessorCount, clock_khz / 1000);
  printf("| form | ms | instructions / clk / SM | elements / clk / SM |\n|---|---:|---:|---:|\n");
  for (const Form& f : forms) {
    for (int w = 0; w < 3; ++w) f.k<<<blocks, threads>>>(out, 1.0f);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(a));
    const int reps = 5;
    for (int r = 0; r < reps; ++r) f.k<<<blocks, threads>>>(out, 1.0f);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    const double instrs = double(reps) * blocks * threads * CHAINS * N;
    const double clocks = ms * 1e-3 * clock_khz * 1e3;
    const double per_clk_sm = instrs / clocks / prop.multiProcessorCount;
    printf("| %s | %.3f | %.2f | %.2f |\n", f.name, ms / reps, per_clk_sm, per_clk_sm * f.per_instr);
  }
  return 0;
}
