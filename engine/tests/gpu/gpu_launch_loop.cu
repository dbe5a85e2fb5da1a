/*
 * gpu_launch_loop.cu: empty-kernel launches, for the dormant agent's cost and attach windows on a
 * real GPU (spec/gpu/dormant.sh).
 *
 *   gpu_launch_loop --bench N      warms up, then times N launches of an empty kernel and prints
 *                                  "RESULT launches=N wall_ns=W cpu_ns=C": W per launch from the
 *                                  first launch to the synchronize after the last, C the
 *                                  launching thread's CPU time per launch over the same stretch
 *   gpu_launch_loop --control PATH serves windows as engine/tests/fake_cuda_app does: it waits
 *                                  for PATH, reads N (or "quit"), removes it, launches N kernels,
 *                                  synchronizes, and writes "launched=N total=T" to PATH.ack
 *                                  (through a rename)
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

extern "C" __global__ void cm_launch_empty(void) {}

#define CK(call)                                                                              \
  do {                                                                                        \
    cudaError_t ck_rc_ = (call);                                                              \
    if (ck_rc_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: CUDA error %s in %s\n", __FILE__, __LINE__,                   \
              cudaGetErrorName(ck_rc_), #call);                                               \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

static uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void launch(uint64_t n) {
  for (uint64_t i = 0; i < n; i++) cm_launch_empty<<<1, 1>>>();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
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
  char ack[4096], tmp[4096];
  snprintf(ack, sizeof ack, "%s.ack", path);
  snprintf(tmp, sizeof tmp, "%s.ack.tmp", path);
  uint64_t total = 0;
  for (;;) {
    FILE *f = fopen(path, "r");
    if (!f) {
      usleep(2000);
      continue;
    }
    char line[64] = "";
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    fclose(f);
    if (!strchr(line, '\n')) {
      usleep(2000);
      continue;
    }
    unlink(path);
    if (strncmp(line, "quit", 4) == 0) break;
    uint64_t n = strtoull(line, NULL, 10);
    launch(n);
    total += n;
    FILE *a = fopen(tmp, "w");
    if (!a) return 1;
    fprintf(a, "launched=%" PRIu64 " total=%" PRIu64 "\n", n, total);
    fclose(a);
    if (rename(tmp, ack) != 0) return 1;
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
  CK(cudaFree(0));
  if (argc == 3 && strcmp(argv[1], "--bench") == 0) return bench(strtoull(argv[2], NULL, 10));
  if (argc == 3 && strcmp(argv[1], "--control") == 0) return serve(argv[2]);
  fprintf(stderr, "usage: gpu_launch_loop --bench N | --control PATH\n");
  return 2;
}
