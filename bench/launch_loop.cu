/*
 * launch_loop.cu: the empty-kernel workload of the benchmark harnesses, with nothing of cuptimon
 * inside, so that it is traced from outside (cuptimon-lua, the agent, the CUPTI floor).
 *
 *   launch_loop N
 *       N empty <<<1,1>>> launches on the legacy default stream after a warm-up of
 *       min(max(N/10, 1000), 10000), timed from the first launch to the device synchronize after
 *       the last. Prints
 *         RESULT launch_loop launches N wall_ns X cpu_ns Y
 *       where X and Y are per launch, Y being the launching thread's CPU time
 *       (CLOCK_THREAD_CPUTIME_ID), where the cost CUPTI adds to a launch lands.
 *   launch_loop --control PATH
 *       serves the requests of the control file PATH (engine/tests/window_control.h), for the
 *       dormant agent's attach windows (spec/gpu/dormant.sh): N launches and a synchronize per
 *       request, acknowledged with "launched=N total=T wall_ns=W cpu_ns=C" (W and C per
 *       launch, from the first launch to the synchronize: spec/gpu/duty_residual.sh)
 *   launch_loop --threads T --seconds S [--rate R]
 *       T threads, each on its own stream, launch empty kernels as fast as they can for S seconds
 *       (bench/thread_sweep.sh, bench/long_run.sh), or at R launches per second over all threads
 *       (spec/gpu/duty_paced.sh). Prints
 *         RESULT sweep threads T launches L seconds S2 launches_per_s R
 *
 * Both end with "LAUNCHED total" (every launch including the warm-up, which is what a tracer must
 * count) and "PROCESS_CPU user_s U sys_s S" (getrusage of the whole process, CUPTI's and any
 * injected tool's threads included). The launching threads are named "cm-launch" so that a
 * /proc sampler can tell them from the tracer's threads. Exit status 77 without a device.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "window_control.h"

extern "C" __global__ void cm_loop_empty(void) {}


static uint64_t clock_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static std::atomic<uint64_t> launched{0};

static void launches(int n, cudaStream_t s) {
  for (int i = 0; i < n; i++) cm_loop_empty<<<1, 1, 0, s>>>();
  launched.fetch_add((uint64_t)n, std::memory_order_relaxed);
}

static int timed_loop(int n) {
  CK(cudaFree(0));
  launches(std::max(1000, std::min(n / 10, 10000)), 0);
  CK(cudaDeviceSynchronize());
  uint64_t w0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  launches(n, 0);
  CK(cudaDeviceSynchronize());
  uint64_t w1 = clock_ns(CLOCK_MONOTONIC), c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  printf("RESULT launch_loop launches %d wall_ns %.2f cpu_ns %.2f\n", n, (double)(w1 - w0) / n,
         (double)(c1 - c0) / n);
  return 0;
}

static int serve(const char *path) {
  CK(cudaFree(0));
  long long n;
  uint64_t total = 0;
  while ((n = cm_window_next(path)) >= 0) {
    uint64_t w0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (long long done = 0; done < n; done += 10000)
      launches((int)std::min(n - done, 10000LL), 0);
    CK(cudaDeviceSynchronize());
    uint64_t w1 = clock_ns(CLOCK_MONOTONIC), c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    total += (uint64_t)n;
    char line[160];
    snprintf(line, sizeof line, "launched=%lld total=%" PRIu64 " wall_ns=%.1f cpu_ns=%.1f\n", n, total,
             n ? (double)(w1 - w0) / (double)n : 0.0, n ? (double)(c1 - c0) / (double)n : 0.0);
    if (cm_window_ack(path, line) != 0) return 1;
  }
  return 0;
}

/* --rate R paces the launches at R per second over all threads (0: as fast as they go), checked
 * every 64 launches against each thread's share: a workload whose rate tracing cannot lower, so
 * that a duty cycle's estimate can be held against the launches made (spec/gpu/duty_paced.sh).
 * A thread that fell behind by more than PACE_SLACK_NS (a stall: CUPTI subscribing or enabling
 * kinds holds the launching thread for milliseconds) does not catch up in a burst: its schedule
 * moves on, as fake_cuda_app's does. A burst right after a duty window opened would put more
 * launches in the window than its length holds, and the estimates would come out high
 * (bench/RESULTS.md, "Duty cycle"). */
#define PACE_SLACK_NS 2000000.0
static int sweep(int threads, double seconds, double rate) {
  CK(cudaFree(0));
  std::vector<cudaStream_t> streams((size_t)threads);
  for (auto &s : streams) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  launches(1000, streams[0]);
  CK(cudaDeviceSynchronize());
  uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  uint64_t deadline = t0 + (uint64_t)(seconds * 1e9);
  uint64_t before = launched.load();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++) {
    pool.emplace_back([&, t] {
      pthread_setname_np(pthread_self(), "cm-launch");
      if (rate <= 0) {
        while (clock_ns(CLOCK_MONOTONIC) < deadline) launches(256, streams[(size_t)t]);
      } else {
        double per_ns = rate / threads / 1e9;
        uint64_t done = 0, base = t0;
        for (uint64_t now = clock_ns(CLOCK_MONOTONIC); now < deadline; now = clock_ns(CLOCK_MONOTONIC)) {
          double ahead_ns = (double)done / per_ns - (double)(now - base);
          if (ahead_ns < -PACE_SLACK_NS) {
            base = now - (uint64_t)((double)done / per_ns);
            ahead_ns = 0;
          }
          if (ahead_ns > 0) {
            struct timespec ts = {(time_t)(ahead_ns / 1e9), (long)((uint64_t)ahead_ns % 1000000000ull)};
            nanosleep(&ts, NULL);
            continue;
          }
          launches(64, streams[(size_t)t]);
          done += 64;
        }
      }
      CK(cudaStreamSynchronize(streams[(size_t)t]));
    });
  }
  for (auto &th : pool) th.join();
  double took = (double)(clock_ns(CLOCK_MONOTONIC) - t0) / 1e9;
  uint64_t n = launched.load() - before;
  printf("RESULT sweep threads %d launches %" PRIu64 " seconds %.3f launches_per_s %.0f\n",
         threads, n, took, (double)n / took);
  for (auto &s : streams) CK(cudaStreamDestroy(s));
  return 0;
}

int main(int argc, char **argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  int rc;
  if ((argc == 5 || (argc == 7 && strcmp(argv[5], "--rate") == 0 && atof(argv[6]) > 0)) &&
      strcmp(argv[1], "--threads") == 0 && strcmp(argv[3], "--seconds") == 0 &&
      atoi(argv[2]) > 0 && atof(argv[4]) > 0) {
    rc = sweep(atoi(argv[2]), atof(argv[4]), argc == 7 ? atof(argv[6]) : 0);
  } else if (argc == 2 && atoi(argv[1]) > 0) {
    rc = timed_loop(atoi(argv[1]));
  } else if (argc == 3 && strcmp(argv[1], "--control") == 0) {
    rc = serve(argv[2]);
  } else {
    fprintf(stderr, "usage: %s N | --threads T --seconds S [--rate R] | --control PATH\n", argv[0]);
    return 2;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("LAUNCHED %" PRIu64 "\n", launched.load());
  printf("PROCESS_CPU user_s %.3f sys_s %.3f\n", ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
         ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
  /* When main returns, on CLOCK_MONOTONIC: bench/load.py times the exit from here to the
   * process's end (the agent may add at most its exit budget). */
  printf("MAIN_RETURN_MONO_NS %" PRIu64 "\n", clock_ns(CLOCK_MONOTONIC));
  fflush(stdout);
  return rc;
}
