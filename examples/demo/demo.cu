/*
 * demo.cu: a small CUDA program with the shape of a training loop, used to record the bundled
 * demo capture. It does not use cuptimon: it is the kind of program cuptimon watches.
 *
 * Design. A two-layer perceptron is trained on synthetic data for a number of steps (default
 * 200; argument 1 changes it). Each step, on two streams:
 *
 *   copy stream     H2D of the next input batch from pinned memory, then an event
 *   compute stream  waits for the batch; memsets the gradient buffers; forward matmul, bias+ReLU,
 *                   second matmul; loss reduction; backward matmuls; SGD update; D2H of the loss
 *   every 10 steps  a D2D copy of the weights into a shadow copy (a "checkpoint")
 *
 * The kernels have a mix of plain (extern "C") and C++-mangled (templated) names, so recipes
 * that demangle or group by name have both to work with. When the header-only NVTX v3 is
 * available, each step is an NVTX range ("step"), the setup and the loop are ranges too, and a
 * marker is emitted at each checkpoint.
 *
 * The program checks nothing about tracing; it prints the loss at a few steps and the elapsed
 * time, and exits 0 (77 when there is no CUDA device).
 */
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#if defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define DEMO_HAVE_NVTX 1
#endif
#endif
#ifndef DEMO_HAVE_NVTX
#define DEMO_HAVE_NVTX 0
static inline void nvtxRangePushA(const char *) {}
static inline void nvtxRangePop(void) {}
static inline void nvtxMarkA(const char *) {}
#endif

#define CK(call)                                                                              \
  do {                                                                                        \
    cudaError_t ck_rc_ = (call);                                                              \
    if (ck_rc_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: CUDA error %s in %s\n", __FILE__, __LINE__,                   \
              cudaGetErrorName(ck_rc_), #call);                                               \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

/* Problem shape: a batch of B inputs of width D, a hidden layer of H units, O outputs. */
enum { B = 256, D = 512, H = 512, O = 64, TILE = 16 };

/* C[M,N] = op(A) * op(B) with optional transposes, row-major, tiled through shared memory. The
 * template parameter gives the kernel a mangled name in the trace. */
template <int T>
__global__ void cm_demo_matmul(const float *A, const float *Bm, float *C, int M, int N, int K,
                               bool ta, bool tb, float alpha) {
  __shared__ float sa[T][T];
  __shared__ float sb[T][T];
  int row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += T) {
    int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
    sa[threadIdx.y][threadIdx.x] =
        (row < M && ka < K) ? (ta ? A[ka * M + row] : A[row * K + ka]) : 0.f;
    sb[threadIdx.y][threadIdx.x] =
        (kb < K && col < N) ? (tb ? Bm[col * K + kb] : Bm[kb * N + col]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < T; k++) acc += sa[threadIdx.y][k] * sb[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = alpha * acc;
}

extern "C" __global__ void cm_demo_bias_relu(float *x, const float *bias, int rows, int cols) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows * cols) x[i] = fmaxf(x[i] + bias[i % cols], 0.f);
}

/* Gradient of the ReLU: zeroes the upstream gradient where the activation was clipped. */
extern "C" __global__ void cm_demo_relu_backward(float *g, const float *act, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && act[i] <= 0.f) g[i] = 0.f;
}

/* Squared-error loss against the target: writes the per-element gradient and accumulates the
 * sum of squares into *loss with one atomic per block. */
extern "C" __global__ void cm_demo_loss_reduce(const float *y, const float *target, float *grad,
                                               float *loss, int n) {
  __shared__ float part[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float d = 0.f;
  if (i < n) {
    d = y[i] - target[i];
    grad[i] = 2.f * d / n;
  }
  part[threadIdx.x] = d * d;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(loss, part[0] / n);
}

template <typename T>
__global__ void cm_demo_sgd_update(T *w, const T *g, T lr, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) w[i] -= lr * g[i];
}

static dim3 grid2(int rows, int cols) { return dim3((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE); }
static int blocks(int n) { return (n + 255) / 256; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 200;
  if (steps <= 0) steps = 200;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  double t_begin = now_s();
  nvtxRangePushA("setup");
  cudaStream_t copy_s, comp_s;
  CK(cudaStreamCreateWithFlags(&copy_s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&comp_s, cudaStreamNonBlocking));

  /* Host data: two pinned input buffers (double-buffered batches), a target and the weights. */
  const size_t xbytes = sizeof(float) * B * D;
  float *h_x[2], *h_loss;
  CK(cudaMallocHost(&h_x[0], xbytes));
  CK(cudaMallocHost(&h_x[1], xbytes));
  CK(cudaMallocHost(&h_loss, sizeof(float) * 256));
  std::vector<float> h_w1(D * H), h_w2(H * O), h_t(B * O);
  srand(7);
  for (auto &v : h_w1) v = (rand() / (float)RAND_MAX - 0.5f) * 0.08f;
  for (auto &v : h_w2) v = (rand() / (float)RAND_MAX - 0.5f) * 0.08f;
  for (auto &v : h_t) v = rand() / (float)RAND_MAX;

  float *x[2], *w1, *w2, *b1, *hid, *y, *tgt, *gy, *ghid, *gw1, *gw2, *loss, *w1_shadow;
  CK(cudaMalloc(&x[0], xbytes));
  CK(cudaMalloc(&x[1], xbytes));
  CK(cudaMalloc(&w1, sizeof(float) * D * H));
  CK(cudaMalloc(&w1_shadow, sizeof(float) * D * H));
  CK(cudaMalloc(&w2, sizeof(float) * H * O));
  CK(cudaMalloc(&b1, sizeof(float) * H));
  CK(cudaMalloc(&hid, sizeof(float) * B * H));
  CK(cudaMalloc(&y, sizeof(float) * B * O));
  CK(cudaMalloc(&tgt, sizeof(float) * B * O));
  CK(cudaMalloc(&gy, sizeof(float) * B * O));
  CK(cudaMalloc(&ghid, sizeof(float) * B * H));
  CK(cudaMalloc(&gw1, sizeof(float) * D * H));
  CK(cudaMalloc(&gw2, sizeof(float) * H * O));
  CK(cudaMalloc(&loss, sizeof(float) * 256));
  CK(cudaMemcpy(w1, h_w1.data(), sizeof(float) * D * H, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w2, h_w2.data(), sizeof(float) * H * O, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(tgt, h_t.data(), sizeof(float) * B * O, cudaMemcpyHostToDevice));
  CK(cudaMemset(b1, 0, sizeof(float) * H));
  cudaEvent_t batch_ready[2], batch_used[2];
  for (int i = 0; i < 2; i++) {
    CK(cudaEventCreateWithFlags(&batch_ready[i], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&batch_used[i], cudaEventDisableTiming));
    CK(cudaEventRecord(batch_used[i], comp_s));
  }
  nvtxRangePop();

  nvtxRangePushA("train");
  const float lr = 0.05f;
  for (int step = 0; step < steps; step++) {
    nvtxRangePushA("step");
    int cur = step & 1;
    /* A new synthetic batch: the host fills the pinned buffer only after the compute stream has
     * finished with it, then the copy stream uploads it. */
    CK(cudaEventSynchronize(batch_used[cur]));
    for (int i = 0; i < B * D; i += 97) h_x[cur][i] = (float)((i + step) % 13) / 13.f;
    CK(cudaMemcpyAsync(x[cur], h_x[cur], xbytes, cudaMemcpyHostToDevice, copy_s));
    CK(cudaEventRecord(batch_ready[cur], copy_s));
    CK(cudaStreamWaitEvent(comp_s, batch_ready[cur], 0));

    CK(cudaMemsetAsync(loss, 0, sizeof(float), comp_s));
    CK(cudaMemsetAsync(gw1, 0, sizeof(float) * D * H, comp_s));
    dim3 tb(TILE, TILE);
    /* Forward: hid = relu(x*w1 + b1); y = hid*w2. */
    cm_demo_matmul<TILE><<<grid2(B, H), tb, 0, comp_s>>>(x[cur], w1, hid, B, H, D, false, false, 1.f);
    cm_demo_bias_relu<<<blocks(B * H), 256, 0, comp_s>>>(hid, b1, B, H);
    cm_demo_matmul<TILE><<<grid2(B, O), tb, 0, comp_s>>>(hid, w2, y, B, O, H, false, false, 1.f);
    cm_demo_loss_reduce<<<blocks(B * O), 256, 0, comp_s>>>(y, tgt, gy, loss, B * O);
    /* Backward: gw2 = hid^T*gy; ghid = gy*w2^T masked by the ReLU; gw1 = x^T*ghid. */
    cm_demo_matmul<TILE><<<grid2(H, O), tb, 0, comp_s>>>(hid, gy, gw2, H, O, B, true, false, 1.f);
    cm_demo_matmul<TILE><<<grid2(B, H), tb, 0, comp_s>>>(gy, w2, ghid, B, H, O, false, true, 1.f);
    cm_demo_relu_backward<<<blocks(B * H), 256, 0, comp_s>>>(ghid, hid, B * H);
    cm_demo_matmul<TILE><<<grid2(D, H), tb, 0, comp_s>>>(x[cur], ghid, gw1, D, H, B, true, false, 1.f);
    CK(cudaEventRecord(batch_used[cur], comp_s));
    cm_demo_sgd_update<float><<<blocks(D * H), 256, 0, comp_s>>>(w1, gw1, lr, D * H);
    cm_demo_sgd_update<float><<<blocks(H * O), 256, 0, comp_s>>>(w2, gw2, lr, H * O);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(h_loss, loss, sizeof(float), cudaMemcpyDeviceToHost, comp_s));

    if (step % 10 == 9) {
      nvtxMarkA("checkpoint");
      CK(cudaMemcpyAsync(w1_shadow, w1, sizeof(float) * D * H, cudaMemcpyDeviceToDevice, comp_s));
    }
    if (step % 50 == 0 || step == steps - 1) {
      CK(cudaStreamSynchronize(comp_s));
      printf("step %4d  loss %.6f\n", step, *h_loss);
    }
    nvtxRangePop();
  }
  CK(cudaDeviceSynchronize());
  nvtxRangePop();

  double elapsed = now_s() - t_begin;
  printf("demo: %d steps in %.3f s (nvtx %s)\n", steps, elapsed, DEMO_HAVE_NVTX ? "on" : "off");
  bool finite = std::isfinite(*h_loss);

  for (int i = 0; i < 2; i++) {
    cudaEventDestroy(batch_ready[i]);
    cudaEventDestroy(batch_used[i]);
    cudaFree(x[i]);
    cudaFreeHost(h_x[i]);
  }
  float *to_free[] = {w1, w1_shadow, w2, b1, hid, y, tgt, gy, ghid, gw1, gw2, loss};
  for (float *p : to_free) cudaFree(p);
  cudaFreeHost(h_loss);
  cudaStreamDestroy(copy_s);
  cudaStreamDestroy(comp_s);
  if (!finite) {
    printf("demo: the loss is not finite\n");
    return 1;
  }
  return 0;
}
