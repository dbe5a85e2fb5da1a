// gpu_exit_spin.cu: returns from main while a kernel is still running. Untraced
// the process exits in well under a second (the driver tears the context down); under the agent
// it must exit within the agent's exit budget (CUPTIMON_EXIT_BUDGET_MS, 2 s by default) instead
// of waiting for the kernel in the final fence's cuCtxSynchronize. The kernel spins for
// --spin-s seconds (default 60), long past any budget, then ends by itself, so nothing is left
// running on the device if the process were somehow killed. It prints the CLOCK_REALTIME time at
// which main returns; engine/tests/gpu/exit_within_budget.sh measures the exit from there.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__global__ void spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

__global__ void quick(float *p) { p[threadIdx.x] += 1.0f; }

int main(int argc, char **argv) {
  int spin_s = 60;
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "--spin-s") == 0) spin_s = atoi(argv[++i]);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  float *p;
  cudaMalloc(&p, 32 * sizeof(float));
  for (int i = 0; i < 100; i++) quick<<<1, 32>>>(p);
  cudaDeviceSynchronize();
  spin<<<1, 1>>>((unsigned long long)spin_s * 1000000000ull);
  if (cudaGetLastError() != cudaSuccess) {
    fprintf(stderr, "launch failed\n");
    return 1;
  }
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  printf("returning at %lld ms with a kernel still running\n",
         (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
  fflush(stdout);
  return 0;
}
