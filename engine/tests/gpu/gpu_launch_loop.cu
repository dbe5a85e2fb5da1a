/*
 * gpu_launch_loop.cu: empty-kernel launches, for the dormant agent's cost and attach windows on a
 * real GPU (spec/gpu/dormant.sh).
 *
 *   gpu_launch_loop --bench N      warms up, then times N launches of an empty kernel and prints
 *                                  "RESULT launches=N wall_ns=W cpu_ns=C": W per launch from the
 *                                  first launch to the synchronize after the last, C the
 *                                  launching thread's CPU time per launch over the same stretch
 *   gpu_launch_loop --control PATH serves the requests of the control file PATH
 *                                  (engine/tests/window_control.h): N kernels, a synchronize,
 *                                  and the acknowledgement "launched=N total=T"
 *
 * It makes one CUDA call before anything else (cudaFree(0)), so the driver initializes and
 * loads an injected agent before the loop starts. Exit status 77 without a CUDA device.
 */
#include <cuda_runtime.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "window_control.h"

extern "C" __global__ void cm_launch_empty(void) {}

/* Exits with a message naming the failed call. */
static void check(cudaError_t rc, const char *what) {
  if (rc == cudaSuccess) return;
  fprintf(stderr, "gpu_launch_loop: %s failed: %s\n", what, cudaGetErrorName(rc));
  exit(1);
}

static uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void launch(uint64_t n) {
  for (uint64_t i = 0; i < n; i++) cm_launch_empty<<<1, 1>>>();
  check(cudaGetLastError(), "a launch");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static int bench(uint64_t n) {
  launch(2000); /* warm: module load, the first launches' one-time work */
  uint64_t w0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  launch(n);
  uint64_t w1 = clock_ns(CLOCK_MONOTONIC), c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  printf("RESULT launches=%" PRIu64 " wall_ns=%.2f cpu_ns=%.2f\n", n, (double)(w1 - w0) / (double)n,
         (double)(c1 - c0) / (double)n);
  return 0;
}

static int serve(const char *path) {
  uint64_t total = 0;
  long long n;
  while ((n = cm_window_next(path)) >= 0) {
    launch((uint64_t)n);
    total += (uint64_t)n;
    char line[96];
    snprintf(line, sizeof line, "launched=%lld total=%" PRIu64 "\n", n, total);
    if (cm_window_ack(path, line) != 0) return 1;
  }
  printf("gpu_launch_loop: launched %" PRIu64 " kernels\n", total);
  return 0;
}

int main(int argc, char **argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  check(cudaFree(0), "cudaFree(0)");
  if (argc == 3 && strcmp(argv[1], "--bench") == 0) return bench(strtoull(argv[2], NULL, 10));
  if (argc == 3 && strcmp(argv[1], "--control") == 0) return serve(argv[2]);
  fprintf(stderr, "usage: gpu_launch_loop --bench N | --control PATH\n");
  return 2;
}
