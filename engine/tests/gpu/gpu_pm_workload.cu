// gpu_pm_workload.cu: known GPU load for the PM sampling checks (spec/gpu/pm_sampling.sh).
//
// It has no engine inside: cuptimon-lua traces it through the agent and samples its device. The
// phases are told apart by the kernels themselves (the checking script reads their records):
//   1. warm-up: the context is created, then 700 ms pass with nothing running, so the monitor's
//      PM request has reached the agent before anything is measured;
//   2. idle: a pm_marker kernel, 400 ms with nothing running, a second pm_marker;
//   3. memory-bound: pm_membw, a streaming copy of 1 GiB into another 1 GiB, again and again for
//      --phase-ms (default 500) ms: DRAM throughput near its peak, tensor pipes idle;
//   4. compute-bound: pm_tensor, a tensor-core matrix multiply-accumulate in registers (WMMA,
//      half inputs, float accumulators, four independent accumulators per warp, 32 warps per SM)
//      for --phase-ms ms: SM and tensor-pipe activity near their peak, DRAM idle;
//   5. a last pm_marker, then 200 ms with nothing running before the exit.
// With --bench it waits 700 ms (the PM session starts), then runs only a fixed amount of phases 3
// and 4 (--bench-iters launches of pm_membw, a tenth as many of pm_tensor) and prints
// "bench_ms=T", the wall time of that work, for the overhead comparison.
// Exit status: 0, 77 without a CUDA device, 1 on a CUDA error.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

using namespace nvcuda;

#define CK(call)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "gpu_pm_workload: %s: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

__global__ void pm_marker() {}

__global__ void pm_membw(const float4 *__restrict__ in, float4 *__restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    out[i] = in[i];
}

// Each warp multiplies one 16x16 half tile by another `iters` times into four accumulators and
// stores one of them, so the work stays in registers and on the tensor pipes.
__global__ void pm_tensor(float *out, int iters) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c0, c1, c2, c3;
  wmma::fill_fragment(a, __float2half(0.001f));
  wmma::fill_fragment(b, __float2half(0.001f));
  wmma::fill_fragment(c0, 0.0f);
  wmma::fill_fragment(c1, 0.0f);
  wmma::fill_fragment(c2, 0.0f);
  wmma::fill_fragment(c3, 0.0f);
  for (int i = 0; i < iters; i++) {
    wmma::mma_sync(c0, a, b, c0);
    wmma::mma_sync(c1, a, b, c1);
    wmma::mma_sync(c2, a, b, c2);
    wmma::mma_sync(c3, a, b, c3);
  }
  for (int i = 0; i < c0.num_elements; i++) c0.x[i] += c1.x[i] + c2.x[i] + c3.x[i];
  size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
  wmma::store_matrix_sync(out + warp * 256, c0, 16, wmma::mem_row_major);
}

static double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char **argv) {
  int phase_ms = 500, bench = 0, bench_iters = 200;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--phase-ms") && i + 1 < argc) phase_ms = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--bench")) bench = 1;
    else if (!std::strcmp(argv[i], "--bench-iters") && i + 1 < argc) bench_iters = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: gpu_pm_workload [--phase-ms MS] [--bench [--bench-iters N]]\n");
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const size_t n = (size_t)1 << 26; // float4 elements: 1 GiB per buffer
  float4 *in = nullptr, *outv = nullptr;
  float *tout = nullptr;
  const int tblocks = prop.multiProcessorCount * 4, tthreads = 256; // 32 warps per SM
  CK(cudaMalloc(&in, n * sizeof(float4)));
  CK(cudaMalloc(&outv, n * sizeof(float4)));
  CK(cudaMalloc(&tout, (size_t)tblocks * (tthreads / 32) * 256 * sizeof(float)));
  CK(cudaMemset(in, 0, n * sizeof(float4)));
  const int mblocks = prop.multiProcessorCount * 8, mthreads = 512;
  const int titers = 20000; // about 10 ms a launch on an H200

  if (bench) {
    pm_membw<<<mblocks, mthreads>>>(in, outv, n); // warm-up, outside the measured time
    pm_tensor<<<tblocks, tthreads>>>(tout, 100);
    CK(cudaDeviceSynchronize());
    // Time for the monitor's PM request to start sampling before the measured work.
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    double t0 = now_ms();
    for (int i = 0; i < bench_iters; i++) pm_membw<<<mblocks, mthreads>>>(in, outv, n);
    for (int i = 0; i < bench_iters / 10; i++) pm_tensor<<<tblocks, tthreads>>>(tout, titers);
    CK(cudaDeviceSynchronize());
    std::printf("bench_ms=%.3f\n", now_ms() - t0);
    return 0;
  }

  CK(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  pm_marker<<<1, 1>>>();
  CK(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  pm_marker<<<1, 1>>>();
  CK(cudaDeviceSynchronize());
  double t0 = now_ms();
  while (now_ms() - t0 < phase_ms) {
    for (int i = 0; i < 20; i++) pm_membw<<<mblocks, mthreads>>>(in, outv, n);
    CK(cudaDeviceSynchronize());
  }
  t0 = now_ms();
  while (now_ms() - t0 < phase_ms) {
    pm_tensor<<<tblocks, tthreads>>>(tout, titers);
    pm_tensor<<<tblocks, tthreads>>>(tout, titers);
    CK(cudaDeviceSynchronize());
  }
  pm_marker<<<1, 1>>>();
  CK(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CK(cudaFree(in));
  CK(cudaFree(outv));
  CK(cudaFree(tout));
  std::printf("gpu_pm_workload: done\n");
  return 0;
}
