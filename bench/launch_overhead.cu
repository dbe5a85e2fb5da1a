/*
 * launch_overhead.cu: what tracing adds to the cost of a kernel launch.
 *
 * Design. The program times N empty kernel launches (default 200000), from the first launch to
 * the device synchronize after the last, in five configurations:
 *
 *   none                 no tracing at all
 *   raw_kernel           a minimal CUPTI consumer enabling CONCURRENT_KERNEL (the floor)
 *   raw_kernel_runtime   the same consumer with RUNTIME added
 *   engine_kernel        cuptimon with one observer on kernel:start,stop,name
 *   engine_kernel_rt     cuptimon with observers on kernels and on runtime:cbid,start,stop
 *
 * CUPTI allows one subscriber per process and keeps state once initialized, so each configuration
 * runs in a fresh child process: the parent makes no CUDA call, re-executes its own binary with
 * "--child CONFIG N" and reads one RESULT line from the child's stdout. Configurations are run in
 * interleaved rounds and the median per configuration is reported, because the machines are
 * shared and a single run is noisy.
 *
 * The table gives ns per launch, the overhead added over "none", and the ratio of each engine
 * configuration's added overhead to the matching raw consumer's (1.0 means the engine costs no
 * more than the floor). Every traced configuration must see exactly N kernel records (and N
 * launch API records when RUNTIME is on) with none dropped; otherwise the exit status is 1.
 *
 * Usage: launch_overhead [N] [--rounds R]     (exit 77 when there is no CUDA device)
 */
#include <cuda_runtime.h>
#include <cupti.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "cuptimon.h"

#include "cuda_check.h"

extern "C" __global__ void cm_bench_empty(void) {}


static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static bool is_launch_cbid(uint32_t cbid) {
  return cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000;
}

/* Launch API records per launch cbid; cbids are small (below 1024 in CUPTI 13.0). Updated from
 * CUPTI's or the engine's threads, read after the final flush. */
enum { kMaxCbid = 1024 };
static uint64_t launch_by_cbid[kMaxCbid];

static void count_launch(uint32_t cbid) {
  if (cbid < kMaxCbid && is_launch_cbid(cbid))
    __atomic_add_fetch(&launch_by_cbid[cbid], 1, __ATOMIC_RELAXED);
}

/* The number of launches the launch API records stand for. When a launch is recorded under two
 * nested entry points, every launch cbid present has the same count, which is then the answer;
 * otherwise the counts are of distinct launches and are summed. */
static uint64_t launches_seen(void) {
  uint64_t sum = 0, first = 0;
  int groups = 0;
  bool equal = true;
  for (int c = 0; c < kMaxCbid; c++) {
    uint64_t v = __atomic_load_n(&launch_by_cbid[c], __ATOMIC_RELAXED);
    if (!v) continue;
    if (groups++ == 0) first = v;
    else if (v != first) equal = false;
    sum += v;
  }
  return groups > 1 && equal ? first : sum;
}

static void reset_launches(void) {
  for (int c = 0; c < kMaxCbid; c++) __atomic_store_n(&launch_by_cbid[c], 0, __ATOMIC_RELAXED);
}

/* What one child measured. */
struct Result {
  double ns_per_launch = 0;
  uint64_t kernel_records = 0;
  uint64_t launch_records = 0; /* runtime records of a launch API; 0 when RUNTIME is off */
  uint64_t dropped = 0;
  double drain_ms = 0; /* the flush after the timed loop, not included in ns_per_launch */
};

/* Launches n empty kernels on the legacy default stream and returns the elapsed ns, including
 * the final device synchronize (the launch queue is bounded, so the loop is throughput-bound
 * either way; the synchronize makes the figure independent of queue depth). */
static uint64_t timed_launches(int n) {
  uint64_t t0 = mono_ns();
  for (int i = 0; i < n; i++) cm_bench_empty<<<1, 1>>>();
  CK(cudaDeviceSynchronize());
  return mono_ns() - t0;
}

static int warmup_count(int n) { return std::max(1000, std::min(n / 10, 10000)); }

/* ---- the raw CUPTI consumer: the floor -------------------------------------------------- */

/* libcupti is opened with dlopen so that the other configurations never load it themselves (the
 * engine opens it on its own). The table holds only what a minimal consumer needs. */
static struct {
  decltype(&cuptiActivityRegisterCallbacks) RegisterCallbacks;
  decltype(&cuptiActivityEnable) Enable;
  decltype(&cuptiActivityFlushAll) FlushAll;
  decltype(&cuptiActivityGetNextRecord) GetNextRecord;
  decltype(&cuptiActivityGetNumDroppedRecords) GetNumDropped;
  decltype(&cuptiGetResultString) GetResultString;
} raw;

/* Counters of the completion callback. CUPTI completes buffers on its own threads, so they are
 * updated atomically. */
static uint64_t raw_kernels, raw_dropped;
static const size_t kRawBufferSize = 4u << 20;

static void CUPTIAPI raw_request(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = (uint8_t *)aligned_alloc(8, kRawBufferSize);
  *size = *buffer ? kRawBufferSize : 0;
  *max_records = 0;
}

static void CUPTIAPI raw_complete(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t,
                                  size_t valid) {
  CUpti_Activity *rec = nullptr;
  uint64_t k = 0;
  while (raw.GetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
      k++;
    else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME)
      count_launch(((const CUpti_ActivityAPI *)rec)->cbid);
  }
  size_t dropped = 0;
  if (raw.GetNumDropped(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
    __atomic_add_fetch(&raw_dropped, (uint64_t)dropped, __ATOMIC_RELAXED);
  __atomic_add_fetch(&raw_kernels, k, __ATOMIC_RELAXED);
  free(buffer);
}

static void raw_check(CUptiResult r, const char *what) {
  if (r != CUPTI_SUCCESS) {
    const char *s = "?";
    if (raw.GetResultString) raw.GetResultString(r, &s);
    fprintf(stderr, "raw CUPTI: %s failed: %s\n", what, s);
    exit(1);
  }
}

static Result run_raw(int n, bool runtime) {
  void *lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) lib = dlopen("/usr/local/cuda/lib64/libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fprintf(stderr, "raw CUPTI: cannot open libcupti.so.13 or /usr/local/cuda/lib64/libcupti.so.13:"
            " %s\n", dlerror());
    exit(1);
  }
#define RAW_SYM(field, sym)                                                        \
  do {                                                                             \
    *(void **)&raw.field = dlsym(lib, #sym);                                       \
    if (!raw.field) {                                                              \
      fprintf(stderr, "raw CUPTI: symbol %s missing\n", #sym);                    \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)
  RAW_SYM(RegisterCallbacks, cuptiActivityRegisterCallbacks);
  RAW_SYM(Enable, cuptiActivityEnable);
  RAW_SYM(FlushAll, cuptiActivityFlushAll);
  RAW_SYM(GetNextRecord, cuptiActivityGetNextRecord);
  RAW_SYM(GetNumDropped, cuptiActivityGetNumDroppedRecords);
  RAW_SYM(GetResultString, cuptiGetResultString);
#undef RAW_SYM

  raw_check(raw.RegisterCallbacks(raw_request, raw_complete), "cuptiActivityRegisterCallbacks");
  raw_check(raw.Enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable CONCURRENT_KERNEL");
  if (runtime) raw_check(raw.Enable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable RUNTIME");
  CK(cudaFree(0));

  timed_launches(warmup_count(n));
  raw_check(raw.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  __atomic_store_n(&raw_kernels, 0, __ATOMIC_RELAXED);
  reset_launches();

  Result r;
  r.ns_per_launch = (double)timed_launches(n) / n;
  uint64_t d0 = mono_ns();
  raw_check(raw.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  r.drain_ms = (mono_ns() - d0) / 1e6;
  r.kernel_records = __atomic_load_n(&raw_kernels, __ATOMIC_RELAXED);
  r.launch_records = launches_seen();
  r.dropped = __atomic_load_n(&raw_dropped, __ATOMIC_RELAXED);
  return r;
}

/* ---- the engine ------------------------------------------------------------------------- */

/* Observer counters. Callbacks run on the flushing thread or the decode worker, one at a time,
 * and the main thread reads them only after cm_flush returned. */
static uint64_t eng_kernels;
static int eng_cbid_field = -1;

static void on_kernels(void *, const cm_batch *b) {
  if (b->kind == CM_KIND_CONCURRENT_KERNEL) eng_kernels += b->n;
}

static void on_runtime(void *, const cm_batch *b) {
  const cm_column *c = cm_batch_column(b, eng_cbid_field);
  if (!c || c->width != 4) return;
  const uint32_t *cbid = (const uint32_t *)c->data;
  for (uint32_t i = 0; i < b->n; i++) count_launch(cbid[i]);
}

static void eng_check(int rc, const char *what) {
  if (rc != 0) {
    fprintf(stderr, "cuptimon: %s failed: %s: %s\n", what, cm_err_name(rc), cm_errmsg());
    exit(1);
  }
}

static Result run_engine(int n, bool runtime) {
  cm_engine *e = nullptr;
  eng_check(cm_engine_new(&e, nullptr), "cm_engine_new");
  cm_selection *ks = nullptr, *rs = nullptr;
  eng_check(cm_selection_new(&ks), "cm_selection_new");
  eng_check(cm_selection_parse(ks, "kernel:start,stop,name"), "cm_selection_parse(kernel)");
  uint32_t kid = 0, rid = 0;
  eng_check(cm_observe(e, ks, on_kernels, nullptr, &kid), "cm_observe(kernel)");
  if (runtime) {
    eng_cbid_field = cm_field_by_name(CM_KIND_RUNTIME, "cbid");
    eng_check(eng_cbid_field < 0 ? eng_cbid_field : 0, "cm_field_by_name(runtime, cbid)");
    eng_check(cm_selection_new(&rs), "cm_selection_new");
    eng_check(cm_selection_parse(rs, "runtime:cbid,start,stop"), "cm_selection_parse(runtime)");
    eng_check(cm_observe(e, rs, on_runtime, nullptr, &rid), "cm_observe(runtime)");
  }
  CK(cudaFree(0));

  timed_launches(warmup_count(n));
  eng_check(cm_flush(e, CM_FLUSH_SYNC, 30000), "cm_flush(SYNC) after warmup");
  eng_kernels = 0;
  reset_launches();

  Result r;
  r.ns_per_launch = (double)timed_launches(n) / n;
  uint64_t d0 = mono_ns();
  eng_check(cm_flush(e, CM_FLUSH_SYNC, 30000), "cm_flush(SYNC)");
  r.drain_ms = (mono_ns() - d0) / 1e6;
  r.kernel_records = eng_kernels;
  r.launch_records = launches_seen();
  cm_stats st;
  eng_check(cm_stats_get(e, &st), "cm_stats_get");
  r.dropped = st.records_dropped + st.buffers_refused;
  fprintf(stderr, "  engine: records_decoded %" PRIu64 " records_dropped %" PRIu64
          " buffers_allocated %" PRIu64 " buffers_refused %" PRIu64 " decode_queue_peak %" PRIu64
          "\n", st.records_decoded, st.records_dropped, st.buffers_allocated, st.buffers_refused,
          st.decode_queue_peak);
  cm_unobserve(e, kid);
  if (rid) cm_unobserve(e, rid);
  cm_selection_free(ks);
  cm_selection_free(rs);
  cm_engine_free(e);
  return r;
}

/* ---- the parent: run every configuration in its own process ---------------------------- */

static const char *const kConfigs[] = {"none", "raw_kernel", "raw_kernel_runtime", "engine_kernel",
                                       "engine_kernel_rt"};
enum { kNone, kRawK, kRawKR, kEngK, kEngKR, kNConfigs };

static int child_main(const char *config, int n) {
  int ndev = 0;
  /* Only "none" probes the device before setting up: the tracing configurations must set CUPTI
   * up before the first CUDA call. A missing device surfaces as a CUDA error there instead. */
  if (strcmp(config, "none") == 0) {
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
      printf("SKIP: no CUDA device\n");
      return 77;
    }
    CK(cudaFree(0));
    timed_launches(warmup_count(n));
    Result r;
    r.ns_per_launch = (double)timed_launches(n) / n;
    printf("RESULT %.2f %" PRIu64 " %" PRIu64 " %" PRIu64 " %.3f\n", r.ns_per_launch,
           r.kernel_records, r.launch_records, r.dropped, r.drain_ms);
    return 0;
  }
  Result r;
  if (strcmp(config, "raw_kernel") == 0) r = run_raw(n, false);
  else if (strcmp(config, "raw_kernel_runtime") == 0) r = run_raw(n, true);
  else if (strcmp(config, "engine_kernel") == 0) r = run_engine(n, false);
  else if (strcmp(config, "engine_kernel_rt") == 0) r = run_engine(n, true);
  else {
    fprintf(stderr, "unknown configuration %s\n", config);
    return 2;
  }
  printf("RESULT %.2f %" PRIu64 " %" PRIu64 " %" PRIu64 " %.3f\n", r.ns_per_launch,
         r.kernel_records, r.launch_records, r.dropped, r.drain_ms);
  return 0;
}

/* Runs "self --child config n" and parses its RESULT line. Returns the child's exit status
 * (0 on success, 77 for no device), or -1 when it died or printed no result. */
static int spawn_child(const char *self, const char *config, int n, Result *out) {
  int fd[2];
  if (pipe(fd) != 0) return -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    char nbuf[32];
    snprintf(nbuf, sizeof nbuf, "%d", n);
    execl(self, self, "--child", config, nbuf, (char *)nullptr);
    _exit(127);
  }
  close(fd[1]);
  std::string text;
  char buf[4096];
  ssize_t got;
  while ((got = read(fd[0], buf, sizeof buf)) > 0) text.append(buf, (size_t)got);
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) return -1;
  int code = WEXITSTATUS(status);
  if (code != 0) return code;
  size_t at = text.find("RESULT ");
  if (at == std::string::npos) return -1;
  if (sscanf(text.c_str() + at, "RESULT %lf %" SCNu64 " %" SCNu64 " %" SCNu64 " %lf",
             &out->ns_per_launch, &out->kernel_records, &out->launch_records, &out->dropped,
             &out->drain_ms) != 5)
    return -1;
  return 0;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

int main(int argc, char **argv) {
  if (argc >= 4 && strcmp(argv[1], "--child") == 0) return child_main(argv[2], atoi(argv[3]));

  int n = 200000, rounds = 3;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (argv[i][0] != '-') n = atoi(argv[i]);
    else {
      fprintf(stderr, "usage: %s [N] [--rounds R]\n", argv[0]);
      return 2;
    }
  }
  if (n <= 0 || rounds <= 0) {
    fprintf(stderr, "N and R must be positive\n");
    return 2;
  }
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    perror("readlink /proc/self/exe");
    return 1;
  }
  self[len] = 0;

  printf("launch_overhead: N=%d empty launches per run, %d round(s), each run in its own process\n",
         n, rounds);
  std::vector<double> ns[kNConfigs];
  bool counts_ok = true;
  for (int round = 0; round < rounds; round++) {
    for (int c = 0; c < kNConfigs; c++) {
      Result r;
      int rc = spawn_child(self, kConfigs[c], n, &r);
      if (rc == 77) {
        printf("SKIP: no CUDA device\n");
        return 77;
      }
      if (rc != 0) {
        printf("configuration %s failed (status %d)\n", kConfigs[c], rc);
        return 1;
      }
      ns[c].push_back(r.ns_per_launch);
      bool traced = c != kNone;
      bool with_rt = c == kRawKR || c == kEngKR;
      bool ok = !traced || (r.kernel_records == (uint64_t)n && r.dropped == 0 &&
                            (!with_rt || r.launch_records == (uint64_t)n));
      if (!ok) counts_ok = false;
      printf("  round %d %-20s %9.1f ns/launch  kernel records %" PRIu64 "  launch records %"
             PRIu64 "  dropped %" PRIu64 "  drain %.1f ms  %s\n", round, kConfigs[c],
             r.ns_per_launch, r.kernel_records, r.launch_records, r.dropped, r.drain_ms,
             !traced ? "" : ok ? "counts OK" : "COUNT MISMATCH");
    }
  }

  double med[kNConfigs];
  for (int c = 0; c < kNConfigs; c++) med[c] = median(ns[c]);
  auto added = [&](int c) { return med[c] - med[kNone]; };
  auto ratio = [&](int c, int floor) {
    double d = added(floor);
    return d > 0 ? added(c) / d : 0.0;
  };
  printf("\n%-20s %14s %14s %22s\n", "configuration", "ns/launch", "added ns", "added / floor's added");
  printf("%-20s %14.1f %14s %22s\n", kConfigs[kNone], med[kNone], "-", "-");
  printf("%-20s %14.1f %14.1f %22s\n", kConfigs[kRawK], med[kRawK], added(kRawK), "1.00 (floor)");
  printf("%-20s %14.1f %14.1f %22s\n", kConfigs[kRawKR], med[kRawKR], added(kRawKR),
         "1.00 (floor, +rt)");
  printf("%-20s %14.1f %14.1f %17.2f vs %s\n", kConfigs[kEngK], med[kEngK], added(kEngK),
         ratio(kEngK, kRawK), "raw_kernel");
  printf("%-20s %14.1f %14.1f %17.2f vs %s\n", kConfigs[kEngKR], med[kEngKR], added(kEngKR),
         ratio(kEngKR, kRawKR), "raw_kernel_runtime");
  printf("(medians over %d round(s); a ratio is 0.00 when the floor's added overhead is not "
         "positive)\n", rounds);
  printf("\nRESULT: %s\n", counts_ok ? "PASS (every traced run saw N records, none dropped)"
                                     : "FAIL (record counts differ from N or records dropped)");
  return counts_ok ? 0 : 1;
}
