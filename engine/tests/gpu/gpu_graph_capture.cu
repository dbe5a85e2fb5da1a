// gpu_graph_capture.cu: CUDA graph captures in global capture mode must all succeed while the
// engine runs sync flushes every 2 ms (a sync flush's cuCtxSynchronize during a capture would
// invalidate it, cudaErrorStreamCaptureInvalidated).
//
// One thread captures and replays 300 small graphs (each capture holds several kernel launches
// with short host pauses between them, so that flushes land inside captures); another thread
// calls cm_flush(CM_FLUSH_SYNC) every 2 ms through an in-process engine. The program exits 0 when
// 300 of 300 captures succeeded and the flusher ran throughout, 1 otherwise, 77 without a device.
//
// With --plain there is no engine in the process: run it under the agent and a monitor script
// that flushes every 2 ms instead (spec/gpu/flush_every_2ms.lua):
//   cuptimon-lua spec/gpu/flush_every_2ms.lua -- gpu/gpu_graph_capture --plain --delay-ms 500
// --delay-ms waits before the captures start, so the monitor's flushes are already running.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

#include "cuptimon.h"

#define NGRAPHS 300
#define LAUNCHES 4

__global__ void step(float *buf, int i) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  buf[t] = buf[t] * 0.5f + (float)i;
}

static std::atomic<bool> g_stop{false};
static std::atomic<int> g_flushes{0}, g_flush_errors{0};
static cm_engine *g_engine;
static std::atomic<unsigned long long> g_kernels{0};

static void on_batch(void *, const cm_batch *b) { g_kernels += b->n; }

static void *flusher(void *) {
  while (!g_stop.load()) {
    int rc = cm_flush(g_engine, CM_FLUSH_SYNC, 1000);
    g_flushes++;
    if (rc) g_flush_errors++;
    usleep(2000);
  }
  return NULL;
}

int main(int argc, char **argv) {
  bool plain = false;
  int delay_ms = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--plain") == 0) plain = true;
    else if (strcmp(argv[i], "--delay-ms") == 0 && i + 1 < argc) delay_ms = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: gpu_graph_capture [--plain] [--delay-ms N]\n");
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  cudaSetDevice(0);
  cudaFree(0);
  pthread_t ft;
  if (!plain) {
    cm_config cfg;
    cm_config_init(&cfg);
    cfg.deliver_ms = 100;
    int rc = cm_engine_new(&g_engine, &cfg);
    if (rc) {
      fprintf(stderr, "cm_engine_new: %s\n", cm_errmsg());
      return 1;
    }
    cm_selection *sel;
    cm_selection_new(&sel);
    cm_selection_parse(sel, "kernel:name,start,stop");
    uint32_t id;
    if (cm_observe(g_engine, sel, on_batch, NULL, &id)) {
      fprintf(stderr, "cm_observe: %s\n", cm_errmsg());
      return 1;
    }
    cm_selection_free(sel);
    pthread_create(&ft, NULL, flusher, NULL);
  }
  if (delay_ms) usleep((useconds_t)delay_ms * 1000);

  float *buf;
  cudaMalloc(&buf, 256 * sizeof(float));
  cudaMemset(buf, 0, 256 * sizeof(float));
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  int ok = 0, failed = 0;
  for (int i = 0; i < NGRAPHS; i++) {
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    if (e == cudaSuccess) {
      for (int k = 0; k < LAUNCHES; k++) {
        step<<<2, 128, 0, s>>>(buf, i * LAUNCHES + k);
        usleep(300); // host work inside the capture: flushes land here
      }
      e = cudaStreamEndCapture(s, &g);
    }
    if (e != cudaSuccess || !g) {
      if (failed < 5) fprintf(stderr, "capture %d failed: %s\n", i, cudaGetErrorName(e));
      failed++;
      cudaGetLastError();
      if (g) cudaGraphDestroy(g);
      continue;
    }
    cudaGraphExec_t x;
    e = cudaGraphInstantiate(&x, g, 0);
    if (e == cudaSuccess) e = cudaGraphLaunch(x, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e == cudaSuccess) {
      ok++;
      cudaGraphExecDestroy(x);
    } else {
      if (failed < 5) fprintf(stderr, "graph %d failed: %s\n", i, cudaGetErrorName(e));
      failed++;
      cudaGetLastError();
    }
    cudaGraphDestroy(g);
  }
  if (!plain) {
    g_stop = true;
    pthread_join(ft, NULL);
    cm_flush(g_engine, CM_FLUSH_SYNC, 5000);
  }
  printf("RESULT captures %d/%d ok, %d failed", ok, NGRAPHS, failed);
  if (!plain)
    printf("; %d sync flushes (%d not ok), %llu kernel records", g_flushes.load(),
           g_flush_errors.load(), (unsigned long long)g_kernels.load());
  printf("\n");
  fflush(stdout);
  if (!plain) cm_engine_free(g_engine);
  bool good = ok == NGRAPHS && (plain || (g_flushes.load() >= 50 && g_kernels.load() > 0));
  return good ? 0 : 1;
}
