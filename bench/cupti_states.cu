/*
 * cupti_states.cu: what a kernel launch costs in each state CUPTI can be left in, and how long
 * CUPTI takes to come back, with nothing of cuptimon inside. The agent's idle state between duty
 * windows and after a monitor has gone is chosen from these figures (bench/RESULTS.md, "CUPTI
 * states").
 *
 *   cupti_states --states N CYCLES
 *       CYCLES cycles in one process. Each cycle walks CUPTI through the states below, and in
 *       each state the main thread makes N empty <<<1,1>>> launches, timed on its CPU clock and on
 *       the wall clock:
 *         dormant        CUPTI never called (first cycle), or finalized (later cycles: by the
 *                        control thread in even cycles, from an application thread's callback in
 *                        odd ones; the line names which)
 *         subscribed     cuptiSubscribe, no domain and no callback enabled
 *         resource_cb    the RESOURCE domain's callbacks the engine pins (context, stream, module)
 *         capture_cb     and the driver API callbacks the engine pins to see graph captures
 *                        (cuStreamBeginCapture*, cuStreamEndCapture*)
 *         traced         and CONCURRENT_KERNEL activity (the duty cycle's default kind)
 *         disabled       every kind disabled and flushed, the callbacks above still enabled
 *         quiet          every callback disabled too, still subscribed
 *         unsubscribed   cuptiUnsubscribe (even cycles only; odd cycles finalize while subscribed)
 *       Each traced phase must deliver exactly N kernel records and no other phase any (exit
 *       status 1 otherwise). Prints a PHASE line per phase, then per state the median cost per
 *       launch and the median of its ratio to the same cycle's dormant phase, with a 95% interval
 *       of that median (order statistics).
 *   cupti_states --subscribe THREADS REPS DEADLINE_MS
 *       THREADS threads launch empty kernels without pause, each on its own stream. The main
 *       thread meanwhile, REPS times: subscribes and traces kernels for 200 ms, unsubscribes,
 *       subscribes again, and finalizes: from the control thread, from a launching thread's API
 *       exit callback, or from that callback followed there by a new subscription (reps cycle
 *       through the three); and subscribes again where it has not. Each CUPTI call runs on a helper
 *       thread and is waited for DEADLINE_MS at most; a call past it is reported as not returned
 *       within the deadline, the launching threads are stopped, and the time it then took to
 *       return is printed. A TIME line per call.
 *
 * libcupti is opened at run time (bench/cupti_dl.h: CUPTI_STATES_LIBCUPTI, then libcupti.so.13,
 * then /usr/local/cuda/lib64/libcupti.so.13). Exit status 77 without a device.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "cupti_dl.h"

extern "C" __global__ void cm_states_empty(void) {}

static CuptiDl cu;

static std::atomic<uint64_t> n_kernels{0}, n_other{0};
static CUpti_SubscriberHandle g_sub;

/* Finalize from an application thread: the callback finalizes at the API exit of the first call
 * that comes after the request, once. */
static std::atomic<int> fin_request{0};
static std::atomic<uint64_t> fin_cb_ns{0};
static std::atomic<int> fin_cb_rc{0};
static std::atomic<bool> resub_request{false};
static std::atomic<uint64_t> resub_ns{0};

static const size_t BUF_SIZE = 4u << 20;

static uint64_t clock_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void CUPTIAPI on_request(uint8_t **buffer, size_t *size, size_t *max_records) {
  void *p = NULL;
  if (posix_memalign(&p, 64, BUF_SIZE) != 0) p = NULL;
  *buffer = (uint8_t *)p;
  *size = p ? BUF_SIZE : 0;
  *max_records = 0;
}

static void CUPTIAPI on_complete(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid) {
  CUpti_Activity *rec = NULL;
  uint64_t k = 0, o = 0;
  while (cu.GetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
      k++;
    else
      o++;
  }
  n_kernels += k;
  n_other += o;
  free(buffer);
}

static void CUPTIAPI on_callback(void *, CUpti_CallbackDomain domain, CUpti_CallbackId, const void *data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
  if (cb->callbackSite != CUPTI_API_EXIT) return;
  int want = 1;
  if (fin_request.load(std::memory_order_relaxed) == 1 && fin_request.compare_exchange_strong(want, 2)) {
    uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
    CUptiResult r = cu.Finalize();
    fin_cb_ns = clock_ns(CLOCK_MONOTONIC) - t0;
    /* The safe point, when asked: subscribe again from the same callback, right after. */
    if (r == CUPTI_SUCCESS && resub_request.load()) {
      uint64_t t1 = clock_ns(CLOCK_MONOTONIC);
      r = cu.Subscribe(&g_sub, on_callback, NULL);
      resub_ns = clock_ns(CLOCK_MONOTONIC) - t1;
    }
    fin_cb_rc = (int)r;
    fin_request = 3;
  }
}

static const CUpti_CallbackId RESOURCE_CBIDS[] = {
    CUPTI_CBID_RESOURCE_CONTEXT_CREATED, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING,
    CUPTI_CBID_RESOURCE_STREAM_CREATED,  CUPTI_CBID_RESOURCE_STREAM_DESTROY_STARTING,
    CUPTI_CBID_RESOURCE_MODULE_LOADED,   CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING,
};
static const CUpti_CallbackId CAPTURE_CBIDS[] = {
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture,        CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2,     CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph, CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture,          CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz,
};

static void subscribe(void) {
  check(cu.Subscribe(&g_sub, on_callback, NULL), "cuptiSubscribe");
}

static void resource_callbacks(uint32_t on) {
  for (CUpti_CallbackId id : RESOURCE_CBIDS)
    check(cu.EnableCallback(on, g_sub, CUPTI_CB_DOMAIN_RESOURCE, id), "cuptiEnableCallback(RESOURCE)");
}

static void capture_callbacks(uint32_t on) {
  for (CUpti_CallbackId id : CAPTURE_CBIDS)
    check(cu.EnableCallback(on, g_sub, CUPTI_CB_DOMAIN_DRIVER_API, id), "cuptiEnableCallback(DRIVER_API)");
}

static void drain(void) {
  CK(cudaDeviceSynchronize());
  check(cu.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll(forced)");
}

static void launches(int n, cudaStream_t s) {
  for (int i = 0; i < n; i++) cm_states_empty<<<1, 1, 0, s>>>();
}

/* The 95% interval of a median from order statistics: the widest rank pair (j, n-1-j) whose
 * binomial coverage is still at least 0.95. */
static void median_ci(std::vector<double> v, double *med, double *lo, double *hi) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  *med = n == 0 ? 0.0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  *lo = n ? v.front() : 0;
  *hi = n ? v.back() : 0;
  for (size_t j = 0; 2 * j + 1 < n; j++) {
    /* P(X < j+1) + P(X > n-1-j) for X ~ Bin(n, 1/2): the chance the interval [v[j], v[n-1-j]]
     * misses the true median. */
    double tail = 0, c = 1;
    for (size_t i = 0; i <= j; i++) {
      if (i > 0) c = c * (double)(n - i + 1) / (double)i;
      tail += c;
    }
    tail = 2 * tail / std::pow(2.0, (double)n);
    if (tail > 0.05) break;
    *lo = v[j];
    *hi = v[n - 1 - j];
  }
}

enum { DORMANT, SUBSCRIBED, RESOURCE_CB, CAPTURE_CB, TRACED, DISABLED, QUIET, UNSUBSCRIBED, NSTATES };
static const char *const STATE[NSTATES] = {"dormant",  "subscribed", "resource_cb", "capture_cb",
                                           "traced",   "disabled",   "quiet",       "unsubscribed"};

static int states(int n, int cycles) {
  CK(cudaFree(0));
  launches(10000, 0);
  CK(cudaDeviceSynchronize());
  std::vector<double> cpu[NSTATES], wall[NSTATES], ratio[NSTATES], wratio[NSTATES];
  std::vector<double> dormant_by[2]; /* dormant cpu after a finalize: [0] control thread, [1] callback */
  double never = 0;
  int bad = 0;
  for (int c = 0; c < cycles; c++) {
    bool by_cb = c % 2 == 1; /* how this cycle ends: odd cycles finalize from a callback */
    double base_cpu = 0, base_wall = 0;
    for (int s = 0; s < NSTATES; s++) {
      switch (s) {
      case SUBSCRIBED: subscribe(); break;
      case RESOURCE_CB: resource_callbacks(1); break;
      case CAPTURE_CB: capture_callbacks(1); break;
      case TRACED:
        check(cu.RegisterCallbacks(on_request, on_complete), "cuptiActivityRegisterCallbacks");
        check(cu.Enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable CONCURRENT_KERNEL");
        break;
      case DISABLED:
        drain();
        check(cu.Disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disable CONCURRENT_KERNEL");
        drain();
        break;
      case QUIET:
        capture_callbacks(0);
        resource_callbacks(0);
        break;
      case UNSUBSCRIBED:
        if (by_cb) continue;
        check(cu.Unsubscribe(g_sub), "cuptiUnsubscribe");
        break;
      default: break;
      }
      uint64_t k0 = n_kernels.load();
      uint64_t w0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
      launches(n, 0);
      CK(cudaDeviceSynchronize());
      uint64_t w1 = clock_ns(CLOCK_MONOTONIC), c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
      if (s >= TRACED && s <= QUIET) check(cu.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
      uint64_t k = n_kernels.load() - k0;
      double cn = (double)(c1 - c0) / n, wn = (double)(w1 - w0) / n;
      if (s == DORMANT) {
        base_cpu = cn;
        base_wall = wn;
        if (c == 0)
          never = cn;
        else
          dormant_by[c % 2 == 1 ? 0 : 1].push_back(cn); /* cycle c began after cycle c-1's end */
      }
      cpu[s].push_back(cn);
      wall[s].push_back(wn);
      if (s != DORMANT) {
        ratio[s].push_back(cn / base_cpu);
        wratio[s].push_back(wn / base_wall);
      }
      bool ok = s == TRACED ? k == (uint64_t)n : k == 0;
      if (!ok) bad++;
      printf("PHASE cycle %d %-12s%s cpu_ns %.1f wall_ns %.1f kernels %" PRIu64 "%s\n", c, STATE[s],
             s == DORMANT ? (c == 0 ? " (never)" : c % 2 == 1 ? " (fin_ctl)" : " (fin_cb)") : "", cn, wn, k,
             ok ? "" : "  (WRONG kernel count)");
    }
    /* The cycle's end: finalize, so the next cycle's dormant phase comes after it. */
    uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
    if (!by_cb) {
      std::thread ctl([] { check(cu.Finalize(), "cuptiFinalize"); });
      ctl.join();
      printf("FINALIZE cycle %d from control_thread took_ms %.2f\n", c, (double)(clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
    } else {
      check(cu.EnableDomain(1, g_sub, CUPTI_CB_DOMAIN_RUNTIME_API), "cuptiEnableDomain(RUNTIME_API)");
      fin_request = 1;
      while (fin_request.load() != 3) launches(1, 0);
      check((CUptiResult)fin_cb_rc.load(), "cuptiFinalize in a callback");
      printf("FINALIZE cycle %d from app_thread_callback took_ms %.2f (request to done %.2f)\n", c,
             (double)fin_cb_ns.load() / 1e6, (double)(clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
      fin_request = 0;
    }
    CK(cudaDeviceSynchronize());
  }
  printf("SUMMARY never cpu_ns %.1f\n", never);
  for (int w = 0; w < 2; w++) {
    double m, lo, hi;
    median_ci(dormant_by[w], &m, &lo, &hi);
    printf("SUMMARY dormant_after_%s cpu_ns_median %.1f of_never %.3f (%zu phases)\n", w ? "fin_cb" : "fin_ctl", m,
           never > 0 ? m / never : 0, dormant_by[w].size());
  }
  for (int s = 0; s < NSTATES; s++) {
    double cm, clo, chi, wm, wlo, whi, rm, rlo, rhi, qm, qlo, qhi;
    median_ci(cpu[s], &cm, &clo, &chi);
    median_ci(wall[s], &wm, &wlo, &whi);
    if (s == DORMANT) {
      printf("SUMMARY %-12s cpu_ns_median %.1f wall_ns_median %.1f (%zu phases)\n", STATE[s], cm, wm, cpu[s].size());
      continue;
    }
    median_ci(ratio[s], &rm, &rlo, &rhi);
    median_ci(wratio[s], &qm, &qlo, &qhi);
    printf("SUMMARY %-12s cpu_ns_median %.1f wall_ns_median %.1f cpu_ratio %.3f [%.3f, %.3f] wall_ratio %.3f "
           "[%.3f, %.3f] (%zu paired phases)\n",
           STATE[s], cm, wm, rm, rlo, rhi, qm, qlo, qhi, ratio[s].size());
  }
  return bad ? 1 : 0;
}

/* A CUPTI call on a helper thread, waited for `deadline_ms` at most. Returns the milliseconds it
 * took, or -1 past the deadline, in which case `late` is set and the caller must call
 * finish_late() to wait for it. */
struct Timed {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  CUptiResult rc = CUPTI_SUCCESS;
  uint64_t t0 = 0, t1 = 0;
  std::thread th;
};

static double timed(Timed &t, std::function<CUptiResult()> fn, int deadline_ms) {
  t.done = false;
  t.t0 = clock_ns(CLOCK_MONOTONIC);
  t.th = std::thread([&t, fn] {
    CUptiResult r = fn();
    std::lock_guard<std::mutex> g(t.mu);
    t.rc = r;
    t.t1 = clock_ns(CLOCK_MONOTONIC);
    t.done = true;
    t.cv.notify_all();
  });
  std::unique_lock<std::mutex> g(t.mu);
  if (!t.cv.wait_for(g, std::chrono::milliseconds(deadline_ms), [&t] { return t.done; })) return -1;
  g.unlock();
  t.th.join();
  check(t.rc, "a timed CUPTI call");
  return (double)(t.t1 - t.t0) / 1e6;
}

static int subscribe_times(int threads, int reps, int deadline_ms) {
  CK(cudaFree(0));
  std::vector<cudaStream_t> streams((size_t)threads);
  for (auto &s : streams) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> launched{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++)
    pool.emplace_back([&, t] {
      while (!stop.load(std::memory_order_relaxed)) {
        launches(64, streams[(size_t)t]);
        launched.fetch_add(64, std::memory_order_relaxed);
      }
    });
  usleep(300000);
  Timed t;
  int status = 0;
  auto step = [&](const char *what, std::function<CUptiResult()> fn) -> bool {
    double ms = timed(t, fn, deadline_ms);
    if (ms >= 0) {
      printf("TIME threads %d %-28s ms %.2f\n", threads, what, ms);
      return true;
    }
    printf("TIME threads %d %-28s did_not_return_within_ms %d\n", threads, what, deadline_ms);
    uint64_t s0 = clock_ns(CLOCK_MONOTONIC);
    stop = true;
    for (auto &th : pool) th.join();
    pool.clear();
    std::unique_lock<std::mutex> g(t.mu);
    bool back = t.cv.wait_for(g, std::chrono::seconds(30), [&t] { return t.done; });
    g.unlock();
    if (back) {
      t.th.join();
      printf("LATE threads %d %s returned %.1f ms after the launching threads stopped\n", threads, what,
             (double)(t.t1 - s0) / 1e6);
    } else {
      printf("LATE threads %d %s had not returned 30 s after the launching threads stopped\n", threads, what);
      fflush(stdout);
      _exit(2);
    }
    status = 2;
    return false;
  };
  auto sub = [] { return cu.Subscribe(&g_sub, on_callback, NULL); };
  auto enable = [] {
    CUptiResult r = cu.RegisterCallbacks(on_request, on_complete);
    if (r == CUPTI_SUCCESS) r = cu.Enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    return r;
  };
  auto disable = [] {
    CUptiResult r = cu.Disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r == CUPTI_SUCCESS) r = cu.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    return r;
  };
  bool subscribed = false;
  for (int r = 0; r < reps && status == 0; r++) {
    /* How this rep finalizes: from the control thread, from a launching thread's API exit
     * callback, or from that callback followed at once by a new subscription there. */
    int how = r % 3;
    if (!subscribed && !step(r == 0 ? "subscribe_first" : "subscribe_after_finalize", sub)) break;
    subscribed = true;
    if (!step("enable_kernel", enable)) break;
    usleep(200000);
    if (!step("disable_flush", disable)) break;
    if (!step("unsubscribe", [] { return cu.Unsubscribe(g_sub); })) break;
    usleep(200000);
    if (!step("subscribe_after_unsubscribe", sub)) break;
    if (!step("enable_kernel_again", [] { return cu.Enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL); })) break;
    usleep(200000);
    if (!step("disable_flush_again", disable)) break;
    if (how == 0) {
      if (!step("finalize_control_thread", [] { return cu.Finalize(); })) break;
      subscribed = false;
    } else {
      if (!step("enable_runtime_domain", [] { return cu.EnableDomain(1, g_sub, CUPTI_CB_DOMAIN_RUNTIME_API); }))
        break;
      uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
      resub_request = how == 2;
      fin_request = 1;
      while (fin_request.load() != 3 && clock_ns(CLOCK_MONOTONIC) - t0 < (uint64_t)deadline_ms * 1000000ull)
        usleep(100);
      const char *what = how == 2 ? "finalize_resubscribe_app_cb" : "finalize_app_callback";
      if (fin_request.load() != 3) {
        printf("TIME threads %d %-28s did_not_return_within_ms %d\n", threads, what, deadline_ms);
        fflush(stdout);
        _exit(2);
      }
      check((CUptiResult)fin_cb_rc.load(), what);
      printf("TIME threads %d %-28s ms %.2f subscribe_ms %.2f (request to done %.2f)\n", threads, what,
             (double)fin_cb_ns.load() / 1e6, how == 2 ? (double)resub_ns.load() / 1e6 : 0.0,
             (double)(clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
      fin_request = 0;
      subscribed = how == 2;
      /* The new subscription's runtime callbacks stay off: nothing was enabled in it. */
    }
    usleep(200000);
  }
  stop = true;
  for (auto &th : pool) th.join();
  printf("RESULT subscribe threads %d launches %" PRIu64 " kernels_traced %" PRIu64 " status %d\n", threads,
         launched.load(), n_kernels.load(), status);
  return status;
}

int main(int argc, char **argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  cupti_dl_load(&cu, "cupti_states", "CUPTI_STATES_LIBCUPTI");
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 4 && strcmp(argv[1], "--states") == 0 && atoi(argv[2]) > 0 && atoi(argv[3]) > 0)
    return states(atoi(argv[2]), atoi(argv[3]));
  if (argc == 5 && strcmp(argv[1], "--subscribe") == 0 && atoi(argv[2]) > 0 && atoi(argv[3]) > 0 && atoi(argv[4]) > 0)
    return subscribe_times(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
  fprintf(stderr, "usage: %s --states N CYCLES | --subscribe THREADS REPS DEADLINE_MS\n", argv[0]);
  return 2;
}
