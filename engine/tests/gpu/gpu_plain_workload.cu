/*
 * gpu_plain_workload.cu: the engine suite's known workload with no cuptimon inside, for tracing
 * from outside: under cuptimon-lua (the agent is injected by the driver) or with CUPTIMON_CAPTURE.
 *
 * Two host threads launch 300 cm_test_axpy and 200 cm_test_scale kernels over 4 streams, then the
 * main thread makes H2D, D2H and D2D copies of known sizes, memsets, and event records. The
 * program prints what it did as "EXPECT" lines, which spec/gpu/compare.py matches against the
 * "GOT" lines of spec/gpu/workload_counts.lua, so the check needs no numbers written twice.
 */
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <cuda_runtime.h>

#define CK(call)                                                                       \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess) {                                                         \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                    \
              cudaGetErrorString(err_));                                               \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

extern "C" __global__ void cm_test_axpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void cm_test_scale(float a, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] *= a;
}

int main(int argc, char **argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  const int n = 1 << 16, axpy = 300, scale = 200;
  float *x, *y;
  CK(cudaMalloc(&x, n * sizeof(float)));
  CK(cudaMalloc(&y, n * sizeof(float)));
  cudaStream_t streams[4];
  for (int s = 0; s < 4; s++) CK(cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking));
  std::thread ta([&] {
    for (int i = 0; i < axpy; i++) cm_test_axpy<<<n / 256, 256, 0, streams[i % 4]>>>(2.0f, x, y, n);
  });
  std::thread tb([&] {
    for (int i = 0; i < scale; i++) cm_test_scale<<<n / 256, 256, 0, streams[i % 4]>>>(0.5f, y, n);
  });
  ta.join();
  tb.join();
  CK(cudaDeviceSynchronize());

  const size_t h2d = 1 << 20, d2h = 512 << 10, d2d = 256 << 10, ms = 192 << 10;
  void *host, *da, *db;
  CK(cudaMallocHost(&host, h2d));
  CK(cudaMalloc(&da, h2d));
  CK(cudaMalloc(&db, h2d));
  for (int i = 0; i < 10; i++) CK(cudaMemcpyAsync(da, host, h2d, cudaMemcpyHostToDevice, streams[0]));
  for (int i = 0; i < 7; i++) CK(cudaMemcpyAsync(host, da, d2h, cudaMemcpyDeviceToHost, streams[1]));
  for (int i = 0; i < 5; i++) CK(cudaMemcpyAsync(db, da, d2d, cudaMemcpyDeviceToDevice, streams[2]));
  for (int i = 0; i < 9; i++) CK(cudaMemsetAsync(db, i, ms, streams[3]));
  cudaEvent_t ev;
  CK(cudaEventCreate(&ev));
  for (int i = 0; i < 12; i++) {
    CK(cudaEventRecord(ev, streams[i % 4]));
    CK(cudaEventSynchronize(ev));
  }
  CK(cudaDeviceSynchronize());

  printf("EXPECT kernel cm_test_axpy %d\n", axpy);
  printf("EXPECT kernel cm_test_scale %d\n", scale);
  printf("EXPECT memcpy 1 10 %zu\n", 10 * h2d);
  printf("EXPECT memcpy 2 7 %zu\n", 7 * d2h);
  printf("EXPECT memcpy 8 5 %zu\n", 5 * d2d);
  printf("EXPECT memset 9 %zu\n", 9 * ms);
  fflush(stdout);
  (void)argc;
  (void)argv;
  return 0;
}
