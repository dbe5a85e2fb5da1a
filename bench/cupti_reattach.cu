/*
 * cupti_reattach.cu: does cuptiFinalize give back what CUPTI costs once it has traced? Two GPU
 * experiments, with nothing of cuptimon inside.
 *
 * The duty cycle turns every kind off between its windows, yet a launch stays about as dear as
 * under the full trace once CUPTI has traced kernels in the process (spec/gpu/duty_residual.sh).
 * And under a long run at a high launch rate, CUPTI's own worker thread costs more and more per
 * record until it falls behind (spec/gpu/cupti_growth.sh). CUPTI documents cuptiFinalize for
 * detaching from a running process, after which any CUPTI call initializes it again. Whether that
 * brings either cost back to where it started decides how the engine can duty-cycle and recover.
 *
 *   cupti_reattach --phases N C
 *       C cycles, each of four phases of N empty <<<1,1>>> launches on the default stream, timed
 *       on the launching thread's CPU: "untraced" (first cycle: CUPTI never called; later
 *       cycles: after cuptiFinalize), "traced" (kernels and runtime API enabled, per-thread
 *       buffers off as the engine sets them), "disabled" (every kind disabled and flushed; CUPTI
 *       still initialized) and "finalized" (cuptiFinalize after a synchronize and a forced
 *       flush). Prints a line per phase and cycle, then the median of each phase and its ratio
 *       to the first untraced phase. Each traced phase must deliver exactly N kernel records,
 *       and no other phase any: the exit status is 1 otherwise.
 *   cupti_reattach --growth T S A
 *       T threads, each on its own stream, launch empty kernels for S seconds, traced (kernels and
 *       runtime API); at A seconds every thread pauses, the device synchronizes, CUPTI is flushed,
 *       disabled and finalized, then initialized and enabled again, and the threads go on. Once
 *       a second it prints the share of a core that CUPTI's threads (every thread but the
 *       launching ones, named cm-launch, and the main thread) used over that second, and the
 *       launch rate. Every launch must have its kernel record: the exit status is 1 otherwise.
 *
 * libcupti is opened at run time (bench/cupti_dl.h: CUPTI_REATTACH_LIBCUPTI, then libcupti.so.13,
 * then /usr/local/cuda/lib64/libcupti.so.13). Exit status 77 without a device.
 */
#include <cuda_runtime.h>
#include <cupti.h>
#include <dirent.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "cupti_dl.h"

extern "C" __global__ void cm_reattach_empty(void) {}

static CuptiDl cu;

static std::atomic<uint64_t> n_kernels{0}, n_runtime{0}, n_other{0};

static const size_t BUF_SIZE = 4u << 20;

static void CUPTIAPI on_request(uint8_t **buffer, size_t *size, size_t *max_records) {
  void *p = NULL;
  if (posix_memalign(&p, 64, BUF_SIZE) != 0) p = NULL;
  *buffer = (uint8_t *)p;
  *size = p ? BUF_SIZE : 0;
  *max_records = 0;
}

static void CUPTIAPI on_complete(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid) {
  CUpti_Activity *rec = NULL;
  uint64_t k = 0, r = 0, o = 0;
  while (cu.GetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
      k++;
    else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME)
      r++;
    else
      o++;
  }
  n_kernels += k;
  n_runtime += r;
  n_other += o;
  free(buffer);
}

/* Initializes CUPTI (again, after a finalize) and enables kernels and runtime API, with CUPTI's
 * per-thread buffers off as the engine sets them (the attribute must come before the callbacks). */
static void attach(void) {
  uint8_t off = 0;
  size_t sz = sizeof off;
  check(cu.SetAttribute(CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER, &sz, &off), "per-thread buffers off");
  check(cu.RegisterCallbacks(on_request, on_complete), "cuptiActivityRegisterCallbacks");
  check(cu.Enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable CONCURRENT_KERNEL");
  check(cu.Enable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable RUNTIME");
}

/* Every launch traced so far has its records once this returns: the device is idle and CUPTI's
 * buffers are forced out. */
static void drain(void) {
  CK(cudaDeviceSynchronize());
  check(cu.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll(forced)");
}

static void disable(void) {
  drain();
  check(cu.Disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disable CONCURRENT_KERNEL");
  check(cu.Disable(CUPTI_ACTIVITY_KIND_RUNTIME), "disable RUNTIME");
  drain();
}

/* The documented detach: the device synchronized, the buffers flushed, then cuptiFinalize. */
static void detach(void) {
  drain();
  check(cu.Finalize(), "cuptiFinalize");
}

static uint64_t clock_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void launches(int n, cudaStream_t s) {
  for (int i = 0; i < n; i++) cm_reattach_empty<<<1, 1, 0, s>>>();
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static const char *const PHASES[] = {"untraced", "traced", "disabled", "finalized"};

static int phases(int n, int cycles) {
  CK(cudaFree(0));
  launches(10000, 0);
  CK(cudaDeviceSynchronize());
  std::vector<double> cpu[4], wall[4];
  int bad = 0;
  for (int c = 0; c < cycles; c++) {
    for (int p = 0; p < 4; p++) {
      if (p == 1) attach();
      if (p == 2) disable();
      if (p == 3) detach();
      uint64_t k0 = n_kernels.load(), r0 = n_runtime.load();
      uint64_t w0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
      launches(n, 0);
      CK(cudaDeviceSynchronize());
      uint64_t w1 = clock_ns(CLOCK_MONOTONIC), c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
      /* CUPTI is initialized in phases 1 and 2 only; a flush in the others would initialize it. */
      if (p == 1 || p == 2) check(cu.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll(forced)");
      uint64_t k = n_kernels.load() - k0, r = n_runtime.load() - r0;
      double cn = (double)(c1 - c0) / n, wn = (double)(w1 - w0) / n;
      cpu[p].push_back(cn);
      wall[p].push_back(wn);
      bool ok = p == 1 ? k == (uint64_t)n : k == 0;
      if (!ok) bad++;
      printf("PHASE cycle %d %-9s cpu_ns %.1f wall_ns %.1f kernels %" PRIu64 " runtime %" PRIu64 "%s\n",
             c, PHASES[p], cn, wn, k, r, ok ? "" : "  (WRONG kernel count)");
      fflush(stdout);
    }
  }
  double base = cpu[0][0];
  for (int p = 0; p < 4; p++) {
    /* The first untraced phase (before CUPTI was ever called) is the baseline; the later ones
     * come after a cuptiFinalize. */
    std::vector<double> later(cpu[p].begin() + (p == 0 ? 1 : 0), cpu[p].end());
    printf("SUMMARY %-9s cpu_ns_median %.1f wall_ns_median %.1f of_first_untraced %.3f (%zu phases)\n",
           PHASES[p], median(later.empty() ? cpu[p] : later), median(wall[p]),
           median(later.empty() ? cpu[p] : later) / base, later.size());
  }
  printf("SUMMARY first_untraced cpu_ns %.1f\n", base);
  return bad ? 1 : 0;
}

/* The CPU seconds of every thread of this process but the launching ones and the main thread. */
static double others_cpu_s(pid_t main_tid) {
  static const long tick = sysconf(_SC_CLK_TCK);
  double sum = 0;
  DIR *d = opendir("/proc/self/task");
  if (!d) return 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.' || atoi(de->d_name) == main_tid) continue;
    std::string path = std::string("/proc/self/task/") + de->d_name + "/stat";
    FILE *f = fopen(path.c_str(), "r");
    if (!f) continue;
    char buf[1024];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    char *open = strchr(buf, '('), *close = strrchr(buf, ')');
    if (!open || !close) continue;
    if (std::string(open + 1, close) == "cm-launch") continue;
    /* After ") ": state, ppid, pgrp, session, tty_nr, tpgid, flags, minflt, cminflt, majflt,
     * cmajflt, utime, stime. */
    unsigned long long ut = 0, st = 0;
    if (sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2)
      sum += (double)(ut + st) / (double)tick;
  }
  closedir(d);
  return sum;
}

static int growth(int threads, double seconds, double reattach_at) {
  CK(cudaFree(0));
  pid_t main_tid = (pid_t)gettid();
  std::vector<cudaStream_t> streams((size_t)threads);
  for (auto &s : streams) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  attach();
  launches(1000, streams[0]);
  CK(cudaDeviceSynchronize());
  std::atomic<uint64_t> launched{1000};
  std::atomic<bool> stop{false}, pause{false};
  std::atomic<int> paused{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++) {
    pool.emplace_back([&, t] {
      pthread_setname_np(pthread_self(), "cm-launch");
      while (!stop.load(std::memory_order_relaxed)) {
        if (pause.load(std::memory_order_acquire)) {
          paused++;
          while (pause.load(std::memory_order_acquire)) usleep(200);
          paused--;
          continue;
        }
        launches(256, streams[(size_t)t]);
        launched.fetch_add(256, std::memory_order_relaxed);
      }
    });
  }
  uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  double prev_cpu = others_cpu_s(main_tid), prev_t = 0;
  uint64_t prev_n = launched.load();
  bool done_reattach = reattach_at <= 0;
  for (;;) {
    usleep(1000000);
    double t = (double)(clock_ns(CLOCK_MONOTONIC) - t0) / 1e9;
    double cpu = others_cpu_s(main_tid);
    uint64_t n = launched.load();
    printf("SHARE t_s %.1f cupti_threads %.3f launches_per_s %.0f kernels %" PRIu64 "\n", t,
           (cpu - prev_cpu) / (t - prev_t), (double)(n - prev_n) / (t - prev_t), n_kernels.load());
    fflush(stdout);
    prev_cpu = cpu;
    prev_t = t;
    prev_n = n;
    if (t >= seconds) break;
    if (!done_reattach && t >= reattach_at) {
      done_reattach = true;
      pause.store(true, std::memory_order_release);
      while (paused.load() < threads) usleep(100);
      uint64_t r0 = clock_ns(CLOCK_MONOTONIC);
      disable();
      detach();
      attach();
      uint64_t r1 = clock_ns(CLOCK_MONOTONIC);
      printf("REATTACH at_s %.1f took_ms %.1f\n", t, (double)(r1 - r0) / 1e6);
      fflush(stdout);
      pause.store(false, std::memory_order_release);
      prev_cpu = others_cpu_s(main_tid);
      prev_t = (double)(clock_ns(CLOCK_MONOTONIC) - t0) / 1e9;
      prev_n = launched.load();
    }
  }
  stop = true;
  for (auto &th : pool) th.join();
  drain();
  uint64_t n = launched.load(), k = n_kernels.load();
  printf("RESULT growth threads %d launches %" PRIu64 " kernels %" PRIu64 " runtime %" PRIu64 " %s\n", threads,
         n, k, n_runtime.load(), k == n ? "exact" : "MISMATCH");
  for (auto &s : streams) CK(cudaStreamDestroy(s));
  return k == n ? 0 : 1;
}

int main(int argc, char **argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  cupti_dl_load(&cu, "cupti_reattach", "CUPTI_REATTACH_LIBCUPTI");
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 4 && strcmp(argv[1], "--phases") == 0 && atoi(argv[2]) > 0 && atoi(argv[3]) > 0)
    return phases(atoi(argv[2]), atoi(argv[3]));
  if (argc == 5 && strcmp(argv[1], "--growth") == 0 && atoi(argv[2]) > 0 && atof(argv[3]) > 0)
    return growth(atoi(argv[2]), atof(argv[3]), atof(argv[4]));
  fprintf(stderr, "usage: %s --phases N CYCLES | --growth THREADS SECONDS REATTACH_AT_S\n", argv[0]);
  return 2;
}
