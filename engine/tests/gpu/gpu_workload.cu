/*
 * gpu_workload.cu: the real-GPU acceptance test of the engine core.
 *
 * Design. The program embeds the engine through cuptimon.h, runs a workload whose every count and
 * size is known in advance, and compares what the observers received with what was issued. It
 * runs in three phases in one process:
 *
 *   1. Workload: two host threads launch two differently named kernels over four streams while
 *      the main thread issues H2D, D2H and D2D copies, memsets and event record/synchronize pairs.
 *      Three observers (kernels, copies and memsets, runtime API) see it; after one sync flush the
 *      counts, byte totals, stream spread, correlation joins and timestamps must all be exact.
 *   2. Fence: a kernel that spins for ~20 ms plus a tail of short kernels, then a sync flush at
 *      once. Every one of those records must have been delivered when the flush returns.
 *   3. Lifecycle: 50 cycles of observe, launch k kernels, unobserve. The unobserve of the last
 *      observer stops the session and must deliver exactly that cycle's k records.
 *
 * Field names are resolved at run time through the registry (cm_field_by_name), trying a short
 * list of plausible spellings for each logical field, so that a rename in the registry shows up
 * as one clear failure that lists the valid names rather than as a compile error. Kernels are
 * extern "C" so their names arrive unmangled; they are still matched by substring.
 *
 * Observer callbacks may run on the decode worker or on the flushing thread; all observer state
 * is guarded by one mutex per observer and read by the main thread only after a flush returned.
 *
 * Exit status: 0 when every check passes, 1 when one fails, 77 when there is no CUDA device.
 */
#include <cuda_runtime.h>
#include <cupti_activity.h>
#include <cupti_runtime_cbid.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuptimon.h"

/* The registry promises CUPTI's kind values; the test relies on that when it compares batch
 * kinds, so a mismatch is a build failure rather than a confusing run-time one. */
static_assert((int)CM_KIND_MEMCPY == (int)CUPTI_ACTIVITY_KIND_MEMCPY, "kind values follow CUPTI");
static_assert((int)CM_KIND_MEMSET == (int)CUPTI_ACTIVITY_KIND_MEMSET, "kind values follow CUPTI");
static_assert((int)CM_KIND_RUNTIME == (int)CUPTI_ACTIVITY_KIND_RUNTIME, "kind values follow CUPTI");
static_assert((int)CM_KIND_CONCURRENT_KERNEL == (int)CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
              "kind values follow CUPTI");

/* ---- the workload's known quantities ------------------------------------------------------ */

enum {
  kStreams = 4,
  kAxpyLaunches = 300,  /* host thread A */
  kScaleLaunches = 200, /* host thread B */
  kElems = 1 << 14,     /* elements per stream buffer */
  kH2DCount = 10,
  kD2HCount = 7,
  kD2DCount = 5,
  kMemsetCount = 9,
  kEventPairs = 12,
  kTailKernels = 64,
  kCycles = 50,
};
static const size_t kH2DBytes = 1u << 20;    /* 1 MiB */
static const size_t kD2HBytes = 512u << 10;  /* 512 KiB */
static const size_t kD2DBytes = 256u << 10;  /* 256 KiB */
static const size_t kMemsetBytes = 192u << 10; /* 192 KiB */
static const uint64_t kSpinNs = 20ull * 1000 * 1000;
static const uint32_t kFlushTimeoutMs = 10000;

/* ---- kernels ------------------------------------------------------------------------------ */

extern "C" __global__ void cm_test_axpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void cm_test_scale(float a, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] *= a;
}

/* Spins on the global nanosecond timer rather than on clock64(): the SM clock varies with boost
 * and power state, so a cycle count would not give a predictable wall duration. */
extern "C" __global__ void cm_test_spin(unsigned long long ns, int *sink) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
  if (threadIdx.x == 0 && sink) *sink = (int)(t - t0);
}

extern "C" __global__ void cm_test_tail(float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += 1.0f;
}

extern "C" __global__ void cm_test_cycle(int *counter) {
  if (threadIdx.x == 0) atomicAdd(counter, 1);
}

/* ---- small utilities ---------------------------------------------------------------------- */

#define CK(call)                                                                              \
  do {                                                                                        \
    cudaError_t ck_rc_ = (call);                                                              \
    if (ck_rc_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: CUDA error %s (%s) in %s\n", __FILE__, __LINE__,              \
              cudaGetErrorName(ck_rc_), cudaGetErrorString(ck_rc_), #call);                   \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

static uint64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int g_checks, g_failures;

/* Records one check: prints "[PASS]" or "[FAIL]", its name and the numbers behind it. */
static bool check(bool ok, const char *name, const char *fmt, ...) {
  char detail[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  g_checks++;
  if (!ok) g_failures++;
  printf("[%s] %-44s %s\n", ok ? "PASS" : "FAIL", name, detail);
  fflush(stdout);
  return ok;
}

/* Reads element i of a column as an unsigned 64-bit value, whatever its width. Every field this
 * test reads is an unsigned quantity (timestamps, byte counts, ids, enum values). */
static inline uint64_t col_u64(const cm_column *c, uint32_t i) {
  switch (c->width) {
    case 1: return ((const uint8_t *)c->data)[i];
    case 2: return ((const uint16_t *)c->data)[i];
    case 4: return ((const uint32_t *)c->data)[i];
    default: return ((const uint64_t *)c->data)[i];
  }
}

/* Prints every field of a kind with its type and width, so a name mismatch is easy to fix. */
static void print_fields(int kind) {
  int n = cm_field_count(kind);
  printf("  fields of %s (%d):", cm_kind_name(kind) ? cm_kind_name(kind) : "?", n);
  for (int i = 0; i < n; i++) {
    cm_field_info fi;
    if (cm_field_info_get(kind, i, &fi) == 0) printf(" %s", fi.name);
  }
  printf("\n");
}

static int g_missing_fields;

/* Resolves a logical field to its registry id, trying each spelling in turn. On a miss it
 * reports the engine's detail message and the kind's valid names and returns -1; the caller
 * stops after all fields were tried so that every mismatch is listed in one run. */
static int resolve_field(int kind, const char *logical, std::initializer_list<const char *> names) {
  std::string tried;
  std::string detail;
  for (const char *nm : names) {
    int id = cm_field_by_name(kind, nm);
    if (id >= 0) return id;
    if (detail.empty()) detail = cm_errmsg();
    if (!tried.empty()) tried += ", ";
    tried += nm;
  }
  g_missing_fields++;
  printf("[FAIL] field %s.%s not in the registry (tried: %s): %s\n", cm_kind_name(kind), logical,
         tried.c_str(), detail.c_str());
  print_fields(kind);
  return -1;
}

/* ---- observers ---------------------------------------------------------------------------- */

enum KernelCat { CAT_AXPY, CAT_SCALE, CAT_SPIN, CAT_TAIL, CAT_CYCLE, CAT_OTHER, CAT_N };
static const char *const kCatName[CAT_N] = {"cm_test_axpy", "cm_test_scale", "cm_test_spin",
                                            "cm_test_tail", "cm_test_cycle", "(other)"};

/* What a timestamped observer accumulates in common: ordering and bracket statistics. */
struct TimeStats {
  uint64_t records = 0;
  uint64_t zero_ts = 0;      /* records with start or stop == 0 */
  uint64_t inverted = 0;     /* records with start > stop */
  uint64_t min_start = UINT64_MAX;
  uint64_t max_stop = 0;
  void add(uint64_t s, uint64_t e) {
    records++;
    if (s == 0 || e == 0) zero_ts++;
    if (s > e) inverted++;
    if (s < min_start) min_start = s;
    if (e > max_stop) max_stop = e;
  }
};

struct KernelObserver {
  cm_engine *e = nullptr;
  int f_name = -1, f_start = -1, f_stop = -1, f_stream = -1, f_corr = -1;
  uint32_t want_cols = 0;

  std::mutex mu; /* guards everything below */
  std::map<uint32_t, int> cat_of_id; /* string id -> category, resolved once per id */
  uint64_t count[CAT_N] = {};
  std::map<uint64_t, std::vector<uint64_t>> per_stream; /* stream -> count per category */
  std::vector<uint64_t> corr;                            /* correlation ids, workload kernels */
  TimeStats ts;
  uint64_t spin_duration = 0;
  uint64_t bad_batches = 0; /* wrong kind, missing column or wrong column count */
  uint64_t batches = 0;
  std::string other_names;

  void reset() {
    std::lock_guard<std::mutex> g(mu);
    for (auto &c : count) c = 0;
    per_stream.clear();
    corr.clear();
    ts = TimeStats();
    spin_duration = 0;
    bad_batches = batches = 0;
    other_names.clear();
  }

  int category(uint32_t id) {
    auto it = cat_of_id.find(id);
    if (it != cat_of_id.end()) return it->second;
    size_t len = 0;
    const char *p = cm_string(e, id, &len);
    std::string s = p ? std::string(p, len) : std::string();
    int cat = CAT_OTHER;
    for (int c = 0; c < CAT_OTHER; c++)
      if (s.find(kCatName[c]) != std::string::npos) cat = c;
    if (cat == CAT_OTHER && other_names.size() < 512) other_names += "'" + s + "' ";
    cat_of_id[id] = cat;
    return cat;
  }

  static void cb(void *ud, const cm_batch *b) { static_cast<KernelObserver *>(ud)->on_batch(b); }

  void on_batch(const cm_batch *b) {
    std::lock_guard<std::mutex> g(mu);
    batches++;
    const cm_column *cn = cm_batch_column(b, f_name), *cs = cm_batch_column(b, f_start),
                    *ce = cm_batch_column(b, f_stop);
    const cm_column *cst = f_stream >= 0 ? cm_batch_column(b, f_stream) : nullptr;
    const cm_column *cc = f_corr >= 0 ? cm_batch_column(b, f_corr) : nullptr;
    if (b->kind != CM_KIND_CONCURRENT_KERNEL || !cn || !cs || !ce || b->ncols != want_cols ||
        (f_stream >= 0 && !cst) || (f_corr >= 0 && !cc)) {
      bad_batches++;
      return;
    }
    for (uint32_t i = 0; i < b->n; i++) {
      int cat = category((uint32_t)col_u64(cn, i));
      uint64_t s = col_u64(cs, i), t = col_u64(ce, i);
      count[cat]++;
      ts.add(s, t);
      if (cat == CAT_SPIN) spin_duration = t - s;
      if (cst && (cat == CAT_AXPY || cat == CAT_SCALE)) {
        auto &v = per_stream[col_u64(cst, i)];
        if (v.empty()) v.assign(CAT_N, 0);
        v[cat]++;
      }
      if (cc && cat != CAT_OTHER) corr.push_back(col_u64(cc, i));
    }
  }
};

struct CopyKindStats {
  uint64_t count = 0, bytes = 0;
  std::set<uint64_t> sizes;
};

struct CopyObserver {
  int m_bytes = -1, m_kind = -1, m_start = -1, m_stop = -1;
  int s_bytes = -1, s_start = -1, s_stop = -1;

  std::mutex mu; /* guards everything below */
  std::map<uint64_t, CopyKindStats> memcpy_by_kind;
  CopyKindStats memset_stats;
  TimeStats ts;
  uint64_t bad_batches = 0;

  void reset() {
    std::lock_guard<std::mutex> g(mu);
    memcpy_by_kind.clear();
    memset_stats = CopyKindStats();
    ts = TimeStats();
    bad_batches = 0;
  }

  static void cb(void *ud, const cm_batch *b) { static_cast<CopyObserver *>(ud)->on_batch(b); }

  void on_batch(const cm_batch *b) {
    std::lock_guard<std::mutex> g(mu);
    if (b->kind == CM_KIND_MEMCPY) {
      const cm_column *cb_ = cm_batch_column(b, m_bytes), *ck = cm_batch_column(b, m_kind),
                      *cs = cm_batch_column(b, m_start), *ce = cm_batch_column(b, m_stop);
      if (!cb_ || !ck || !cs || !ce || b->ncols != 4) {
        bad_batches++;
        return;
      }
      for (uint32_t i = 0; i < b->n; i++) {
        CopyKindStats &k = memcpy_by_kind[col_u64(ck, i)];
        uint64_t by = col_u64(cb_, i);
        k.count++;
        k.bytes += by;
        k.sizes.insert(by);
        ts.add(col_u64(cs, i), col_u64(ce, i));
      }
    } else if (b->kind == CM_KIND_MEMSET) {
      const cm_column *cb_ = cm_batch_column(b, s_bytes), *cs = cm_batch_column(b, s_start),
                      *ce = cm_batch_column(b, s_stop);
      if (!cb_ || !cs || !ce || b->ncols != 3) {
        bad_batches++;
        return;
      }
      for (uint32_t i = 0; i < b->n; i++) {
        uint64_t by = col_u64(cb_, i);
        memset_stats.count++;
        memset_stats.bytes += by;
        memset_stats.sizes.insert(by);
        ts.add(col_u64(cs, i), col_u64(ce, i));
      }
    } else {
      bad_batches++;
    }
  }
};

static bool is_launch_cbid(uint64_t cbid) {
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060:
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000:
    case CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000:
      return true;
    default:
      return false;
  }
}

struct RuntimeObserver {
  int f_cbid = -1, f_start = -1, f_stop = -1, f_corr = -1;

  std::mutex mu; /* guards everything below */
  std::map<uint64_t, uint64_t> by_cbid;
  std::set<uint64_t> launch_corr;
  TimeStats ts;
  uint64_t bad_batches = 0;

  void reset() {
    std::lock_guard<std::mutex> g(mu);
    by_cbid.clear();
    launch_corr.clear();
    ts = TimeStats();
    bad_batches = 0;
  }

  /* The number of kernel launches the launch API records stand for. If the runtime records a
   * launch under two nested launch entry points (the chevron's __cudaLaunchKernel around
   * cudaLaunchKernel, say), every launch cbid present holds the same count, and that count is the
   * answer; otherwise the records are of distinct launches and are summed. */
  uint64_t launches() {
    uint64_t sum = 0, first = 0;
    int groups = 0;
    bool equal = true;
    for (auto &kv : by_cbid) {
      if (!is_launch_cbid(kv.first)) continue;
      if (groups++ == 0) first = kv.second;
      else if (kv.second != first) equal = false;
      sum += kv.second;
    }
    return groups > 1 && equal ? first : sum;
  }

  uint64_t of(uint64_t cbid) {
    auto it = by_cbid.find(cbid);
    return it == by_cbid.end() ? 0 : it->second;
  }

  static void cb(void *ud, const cm_batch *b) { static_cast<RuntimeObserver *>(ud)->on_batch(b); }

  void on_batch(const cm_batch *b) {
    std::lock_guard<std::mutex> g(mu);
    const cm_column *ci = cm_batch_column(b, f_cbid), *cs = cm_batch_column(b, f_start),
                    *ce = cm_batch_column(b, f_stop), *cc = cm_batch_column(b, f_corr);
    if (b->kind != CM_KIND_RUNTIME || !ci || !cs || !ce || !cc || b->ncols != 4) {
      bad_batches++;
      return;
    }
    for (uint32_t i = 0; i < b->n; i++) {
      uint64_t cbid = col_u64(ci, i);
      by_cbid[cbid]++;
      if (is_launch_cbid(cbid)) launch_corr.insert(col_u64(cc, i));
      ts.add(col_u64(cs, i), col_u64(ce, i));
    }
  }

  std::string histogram() {
    std::vector<std::pair<uint64_t, uint64_t>> v;
    for (auto &kv : by_cbid) v.push_back({kv.second, kv.first});
    std::sort(v.rbegin(), v.rend());
    std::string s;
    char tmp[64];
    for (size_t i = 0; i < v.size() && i < 10; i++) {
      snprintf(tmp, sizeof tmp, "%s%" PRIu64 "x%" PRIu64, i ? " " : "", v[i].second, v[i].first);
      s += tmp;
    }
    return s;
  }
};

/* Engine warnings and errors go to stderr; info and debug lines would bury the check lines
 * (every one of the 50 sessions would log its start and stop). */
static void log_cb(void *, int level, const char *msg) {
  static const char *const lv[] = {"error", "warn", "info", "debug"};
  if (level <= CM_LOG_WARN)
    fprintf(stderr, "cuptimon[%s]: %s\n", level >= 0 && level <= 3 ? lv[level] : "?", msg);
}

/* Checks that a timestamp range lies within a CLOCK_REALTIME bracket and is well ordered. */
static void check_times(const char *what, const TimeStats &ts, uint64_t lo, uint64_t hi) {
  char name[96];
  snprintf(name, sizeof name, "%s: start <= stop, nonzero", what);
  check(ts.inverted == 0 && ts.zero_ts == 0, name, "records=%" PRIu64 " inverted=%" PRIu64
        " zero=%" PRIu64, ts.records, ts.inverted, ts.zero_ts);
  snprintf(name, sizeof name, "%s: within realtime bracket", what);
  bool in = ts.records == 0 || (ts.min_start >= lo && ts.max_stop <= hi);
  check(in, name, "bracket=[%" PRIu64 ", %" PRIu64 "] records=[%" PRIu64 ", %" PRIu64
        "] (lead %+.3f ms, tail %+.3f ms)", lo, hi, ts.min_start, ts.max_stop,
        ts.records ? ((double)ts.min_start - (double)lo) / 1e6 : 0.0,
        ts.records ? ((double)hi - (double)ts.max_stop) / 1e6 : 0.0);
}

/* ---- main --------------------------------------------------------------------------------- */

int main(void) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int ndev = 0;
  cudaError_t drc = cudaGetDeviceCount(&ndev);
  if (drc != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device (%s)\n", drc != cudaSuccess ? cudaGetErrorName(drc) : "count 0");
    return 77;
  }

  /* The engine is created before the context so that CUPTI sees the context's creation. */
  cm_config cfg;
  cm_config_init(&cfg);
  cfg.fence_timeout_ms = kFlushTimeoutMs;
  cm_engine *e = nullptr;
  int rc = cm_engine_new(&e, &cfg);
  if (rc != 0) {
    printf("[FAIL] cm_engine_new: %s (%s): %s\n", cm_err_name(rc), cm_strerror(rc), cm_errmsg());
    return 1;
  }
  cm_set_log(e, log_cb, nullptr);

  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device 0: %s (sm_%d%d), %d device(s)\n", prop.name, prop.major, prop.minor, ndev);

  /* Resolve every field before anything runs, and report all misses at once. */
  const int K = CM_KIND_CONCURRENT_KERNEL;
  KernelObserver kobs;
  kobs.e = e;
  kobs.f_name = resolve_field(K, "name", {"name", "kernel_name"});
  kobs.f_start = resolve_field(K, "start", {"start", "start_ns"});
  kobs.f_stop = resolve_field(K, "stop", {"stop", "end_ns", "finish"});
  kobs.f_stream = resolve_field(K, "stream", {"stream", "stream_id"});
  kobs.f_corr = resolve_field(K, "correlation", {"correlation", "correlation_id"});
  kobs.want_cols = 5;

  CopyObserver cobs;
  cobs.m_bytes = resolve_field(CM_KIND_MEMCPY, "bytes", {"bytes", "size"});
  cobs.m_kind = resolve_field(CM_KIND_MEMCPY, "copy_kind", {"copy_kind", "copykind", "direction"});
  cobs.m_start = resolve_field(CM_KIND_MEMCPY, "start", {"start", "start_ns"});
  cobs.m_stop = resolve_field(CM_KIND_MEMCPY, "stop", {"stop", "end_ns", "finish"});
  cobs.s_bytes = resolve_field(CM_KIND_MEMSET, "bytes", {"bytes", "size"});
  cobs.s_start = resolve_field(CM_KIND_MEMSET, "start", {"start", "start_ns"});
  cobs.s_stop = resolve_field(CM_KIND_MEMSET, "stop", {"stop", "end_ns", "finish"});

  RuntimeObserver robs;
  robs.f_cbid = resolve_field(CM_KIND_RUNTIME, "cbid", {"cbid", "callback_id", "api_id"});
  robs.f_start = resolve_field(CM_KIND_RUNTIME, "start", {"start", "start_ns"});
  robs.f_stop = resolve_field(CM_KIND_RUNTIME, "stop", {"stop", "end_ns", "finish"});
  robs.f_corr = resolve_field(CM_KIND_RUNTIME, "correlation", {"correlation", "correlation_id"});

  if (g_missing_fields) {
    printf("RESULT: FAIL (%d field name(s) missing from the registry; see the lists above)\n",
           g_missing_fields);
    cm_engine_free(e);
    return 1;
  }

  /* The selections are written in the text form, from the names the registry answered with,
   * so cm_selection_parse is exercised on the real path too. */
  auto fname = [](int kind, int id) {
    cm_field_info fi;
    cm_field_info_get(kind, id, &fi);
    return std::string(fi.name);
  };
  std::string kspec = "kernel:" + fname(K, kobs.f_name) + "," + fname(K, kobs.f_start) + "," +
                      fname(K, kobs.f_stop) + "," + fname(K, kobs.f_stream) + "," +
                      fname(K, kobs.f_corr);
  std::string cspec = "memcpy:" + fname(CM_KIND_MEMCPY, cobs.m_bytes) + "," +
                      fname(CM_KIND_MEMCPY, cobs.m_kind) + "," +
                      fname(CM_KIND_MEMCPY, cobs.m_start) + "," +
                      fname(CM_KIND_MEMCPY, cobs.m_stop) + ";memset:" +
                      fname(CM_KIND_MEMSET, cobs.s_bytes) + "," +
                      fname(CM_KIND_MEMSET, cobs.s_start) + "," + fname(CM_KIND_MEMSET, cobs.s_stop);
  std::string rspec = "runtime:" + fname(CM_KIND_RUNTIME, robs.f_cbid) + "," +
                      fname(CM_KIND_RUNTIME, robs.f_start) + "," +
                      fname(CM_KIND_RUNTIME, robs.f_stop) + "," +
                      fname(CM_KIND_RUNTIME, robs.f_corr);
  std::string cyspec = "kernel:" + fname(K, kobs.f_name) + "," + fname(K, kobs.f_start) + "," +
                       fname(K, kobs.f_stop);
  cm_selection *ksel = nullptr, *csel = nullptr, *rsel = nullptr, *cysel = nullptr;
  const char *specs[] = {kspec.c_str(), cspec.c_str(), rspec.c_str(), cyspec.c_str()};
  cm_selection **sels[] = {&ksel, &csel, &rsel, &cysel};
  for (int i = 0; i < 4; i++) {
    if (cm_selection_new(sels[i]) != 0 || (rc = cm_selection_parse(*sels[i], specs[i])) != 0) {
      printf("[FAIL] cm_selection_parse(\"%s\"): %s: %s\n", specs[i], cm_err_name(rc), cm_errmsg());
      cm_engine_free(e);
      return 1;
    }
    printf("selection %d: %s\n", i, specs[i]);
  }

  /* ---- setup, before any observer, so none of it is recorded ---- */
  cudaStream_t streams[kStreams];
  float *dx[kStreams], *dy[kStreams];
  for (int s = 0; s < kStreams; s++) {
    CK(cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking));
    CK(cudaMalloc(&dx[s], kElems * sizeof(float)));
    CK(cudaMalloc(&dy[s], kElems * sizeof(float)));
    CK(cudaMemset(dx[s], 0, kElems * sizeof(float)));
    CK(cudaMemset(dy[s], 0, kElems * sizeof(float)));
  }
  void *h_src = nullptr, *h_dst = nullptr, *d_a = nullptr, *d_b = nullptr, *d_c = nullptr,
       *d_m = nullptr;
  int *d_sink = nullptr;
  CK(cudaMallocHost(&h_src, kH2DBytes));
  CK(cudaMallocHost(&h_dst, kD2HBytes));
  memset(h_src, 1, kH2DBytes);
  CK(cudaMalloc(&d_a, kH2DBytes));
  CK(cudaMalloc(&d_b, kD2HBytes));
  CK(cudaMalloc(&d_c, kD2DBytes));
  CK(cudaMalloc(&d_m, kMemsetBytes));
  CK(cudaMalloc(&d_sink, sizeof(int) * 4));
  cudaEvent_t ev;
  CK(cudaEventCreate(&ev));
  CK(cudaDeviceSynchronize());

  /* ================= phase 1: the known workload ================= */
  printf("\n== phase 1: %d axpy + %d scale kernels from 2 threads on %d streams, copies, memsets,"
         " events ==\n", kAxpyLaunches, kScaleLaunches, kStreams);
  uint32_t kid = 0, cid = 0, rid = 0;
  uint64_t t0 = realtime_ns();
  if ((rc = cm_observe(e, ksel, KernelObserver::cb, &kobs, &kid)) != 0 ||
      (rc = cm_observe(e, csel, CopyObserver::cb, &cobs, &cid)) != 0 ||
      (rc = cm_observe(e, rsel, RuntimeObserver::cb, &robs, &rid)) != 0) {
    printf("[FAIL] cm_observe: %s: %s\n", cm_err_name(rc), cm_errmsg());
    cm_engine_free(e);
    return 1;
  }
  check(kid > 0 && cid > 0 && rid > 0 && kid != cid && cid != rid && kid != rid,
        "observer ids positive and distinct", "ids=%u,%u,%u", kid, cid, rid);
  uint64_t kinds = cm_enabled_kinds(e);
  uint64_t want_kinds = (1ull << CM_KIND_CONCURRENT_KERNEL) | (1ull << CM_KIND_MEMCPY) |
                        (1ull << CM_KIND_MEMSET) | (1ull << CM_KIND_RUNTIME);
  check((kinds & want_kinds) == want_kinds, "selected kinds enabled", "mask=0x%" PRIx64, kinds);

  std::atomic<int> launch_errors{0};
  const int threads = 256, blocks = (kElems + threads - 1) / threads;
  std::thread ta([&] {
    if (cudaSetDevice(0) != cudaSuccess) launch_errors++;
    for (int i = 0; i < kAxpyLaunches; i++) {
      int s = i % kStreams;
      cm_test_axpy<<<blocks, threads, 0, streams[s]>>>(0.5f, dx[s], dy[s], kElems);
      if (cudaGetLastError() != cudaSuccess) launch_errors++;
    }
  });
  std::thread tb([&] {
    if (cudaSetDevice(0) != cudaSuccess) launch_errors++;
    for (int i = 0; i < kScaleLaunches; i++) {
      int s = i % kStreams;
      cm_test_scale<<<blocks, threads, 0, streams[s]>>>(0.999f, dy[s], kElems);
      if (cudaGetLastError() != cudaSuccess) launch_errors++;
    }
  });
  /* The main thread's copies, memsets and events overlap the two launching threads. */
  for (int i = 0; i < kH2DCount; i++)
    CK(cudaMemcpyAsync(d_a, h_src, kH2DBytes, cudaMemcpyHostToDevice, streams[i % kStreams]));
  for (int i = 0; i < kD2HCount; i++)
    CK(cudaMemcpyAsync(h_dst, d_b, kD2HBytes, cudaMemcpyDeviceToHost, streams[i % kStreams]));
  for (int i = 0; i < kD2DCount; i++)
    CK(cudaMemcpyAsync(d_c, d_a, kD2DBytes, cudaMemcpyDeviceToDevice, streams[i % kStreams]));
  for (int i = 0; i < kMemsetCount; i++)
    CK(cudaMemsetAsync(d_m, i, kMemsetBytes, streams[i % kStreams]));
  for (int i = 0; i < kEventPairs; i++) {
    CK(cudaEventRecord(ev, streams[i % kStreams]));
    CK(cudaEventSynchronize(ev));
  }
  ta.join();
  tb.join();
  CK(cudaDeviceSynchronize());
  check(launch_errors.load() == 0, "all launches accepted", "errors=%d", launch_errors.load());

  uint64_t f0 = realtime_ns();
  rc = cm_flush(e, CM_FLUSH_SYNC, kFlushTimeoutMs);
  uint64_t t1 = realtime_ns();
  check(rc == 0, "cm_flush(SYNC) returns 0", "rc=%d (%s) %s, took %.3f ms", rc, cm_err_name(rc),
        rc ? cm_errmsg() : "", (double)(t1 - f0) / 1e6);

  {
    std::lock_guard<std::mutex> g1(kobs.mu);
    std::lock_guard<std::mutex> g2(cobs.mu);
    std::lock_guard<std::mutex> g3(robs.mu);
    check(kobs.count[CAT_AXPY] == kAxpyLaunches, "kernel records: cm_test_axpy",
          "got %" PRIu64 ", want %d", kobs.count[CAT_AXPY], kAxpyLaunches);
    check(kobs.count[CAT_SCALE] == kScaleLaunches, "kernel records: cm_test_scale",
          "got %" PRIu64 ", want %d", kobs.count[CAT_SCALE], kScaleLaunches);
    uint64_t stray = kobs.count[CAT_SPIN] + kobs.count[CAT_TAIL] + kobs.count[CAT_CYCLE] +
                     kobs.count[CAT_OTHER];
    check(stray == 0, "kernel records: no other names", "got %" PRIu64 " %s", stray,
          kobs.other_names.c_str());
    check(kobs.bad_batches == 0, "kernel batches carry exactly the selection",
          "batches=%" PRIu64 " bad=%" PRIu64, kobs.batches, kobs.bad_batches);

    /* Each thread spread its launches round-robin, so every stream holds the same split. */
    bool spread = kobs.per_stream.size() == kStreams;
    std::string per;
    for (auto &kv : kobs.per_stream) {
      char tmp[96];
      snprintf(tmp, sizeof tmp, " [%" PRIu64 ": axpy %" PRIu64 " scale %" PRIu64 "]", kv.first,
               kv.second[CAT_AXPY], kv.second[CAT_SCALE]);
      per += tmp;
      if (kv.second[CAT_AXPY] != kAxpyLaunches / kStreams ||
          kv.second[CAT_SCALE] != kScaleLaunches / kStreams)
        spread = false;
    }
    check(spread, "kernel records: 4 streams, even split", "streams=%zu%s (want %d axpy, %d scale each)",
          kobs.per_stream.size(), per.c_str(), kAxpyLaunches / kStreams, kScaleLaunches / kStreams);

    std::vector<uint64_t> c = kobs.corr;
    std::sort(c.begin(), c.end());
    size_t dups = c.size() - (size_t)(std::unique(c.begin(), c.end()) - c.begin());
    check(dups == 0 && !c.empty() && c.front() != 0, "kernel correlation ids unique, nonzero",
          "n=%zu duplicates=%zu", kobs.corr.size(), dups);
    size_t joined = 0;
    for (uint64_t x : kobs.corr) joined += robs.launch_corr.count(x);
    check(joined == kobs.corr.size(), "kernel correlation joins a launch API record",
          "joined %zu of %zu (launch API records %zu)", joined, kobs.corr.size(),
          robs.launch_corr.size());
    check_times("kernel", kobs.ts, t0, t1);

    struct {
      uint64_t kind;
      const char *name;
      uint64_t count;
      size_t bytes;
    } want[] = {{CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, "memcpy HtoD", kH2DCount, kH2DBytes},
                {CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, "memcpy DtoH", kD2HCount, kD2HBytes},
                {CUPTI_ACTIVITY_MEMCPY_KIND_DTOD, "memcpy DtoD", kD2DCount, kD2DBytes}};
    uint64_t memcpy_total = 0;
    for (auto &kv : cobs.memcpy_by_kind) memcpy_total += kv.second.count;
    for (auto &w : want) {
      CopyKindStats k;
      auto it = cobs.memcpy_by_kind.find(w.kind);
      if (it != cobs.memcpy_by_kind.end()) k = it->second;
      char name[64];
      snprintf(name, sizeof name, "%s: count and bytes", w.name);
      check(k.count == w.count && k.bytes == w.count * w.bytes &&
                (k.sizes.size() == 1 && *k.sizes.begin() == w.bytes),
            name, "count %" PRIu64 "/%" PRIu64 ", bytes %" PRIu64 "/%" PRIu64 ", sizes seen %zu",
            k.count, w.count, k.bytes, (uint64_t)(w.count * w.bytes), k.sizes.size());
    }
    std::string kinds_seen;
    for (auto &kv : cobs.memcpy_by_kind) {
      char tmp[64];
      snprintf(tmp, sizeof tmp, " kind%" PRIu64 "=%" PRIu64, kv.first, kv.second.count);
      kinds_seen += tmp;
    }
    check(memcpy_total == kH2DCount + kD2HCount + kD2DCount, "memcpy: no other copies",
          "total %" PRIu64 ", want %d;%s", memcpy_total, kH2DCount + kD2HCount + kD2DCount,
          kinds_seen.c_str());
    check(cobs.memset_stats.count == kMemsetCount &&
              cobs.memset_stats.bytes == kMemsetCount * kMemsetBytes,
          "memset: count and bytes", "count %" PRIu64 "/%d, bytes %" PRIu64 "/%" PRIu64,
          cobs.memset_stats.count, kMemsetCount, cobs.memset_stats.bytes,
          (uint64_t)(kMemsetCount * kMemsetBytes));
    check(cobs.bad_batches == 0, "copy batches carry exactly the selection", "bad=%" PRIu64,
          cobs.bad_batches);
    check_times("memcpy+memset", cobs.ts, t0, t1);

    uint64_t launches = robs.launches();
    check(launches == kAxpyLaunches + kScaleLaunches, "runtime: launch API records",
          "got %" PRIu64 ", want %d (top cbid x count: %s)", launches,
          kAxpyLaunches + kScaleLaunches, robs.histogram().c_str());
    uint64_t erec = robs.of(CUPTI_RUNTIME_TRACE_CBID_cudaEventRecord_v3020) +
                    robs.of(CUPTI_RUNTIME_TRACE_CBID_cudaEventRecord_ptsz_v7000) +
                    robs.of(CUPTI_RUNTIME_TRACE_CBID_cudaEventRecordWithFlags_v11010) +
                    robs.of(CUPTI_RUNTIME_TRACE_CBID_cudaEventRecordWithFlags_ptsz_v11010);
    uint64_t esync = robs.of(CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020);
    check(erec == kEventPairs && esync == kEventPairs, "runtime: cudaEventRecord/Synchronize",
          "record %" PRIu64 ", synchronize %" PRIu64 ", want %d each", erec, esync, kEventPairs);
    uint64_t mc = robs.of(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020) +
                  robs.of(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000);
    uint64_t ms = robs.of(CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020) +
                  robs.of(CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000);
    check(mc == kH2DCount + kD2HCount + kD2DCount && ms == kMemsetCount,
          "runtime: cudaMemcpyAsync/cudaMemsetAsync", "memcpy %" PRIu64 "/%d, memset %" PRIu64 "/%d",
          mc, kH2DCount + kD2HCount + kD2DCount, ms, kMemsetCount);
    check(robs.bad_batches == 0, "runtime batches carry exactly the selection", "bad=%" PRIu64,
          robs.bad_batches);
    check_times("runtime", robs.ts, t0, t1);
  }

  /* ================= phase 2: the sync-flush fence ================= */
  printf("\n== phase 2: a %.0f ms spinning kernel and %d tail kernels, then cm_flush(SYNC) at once"
         " ==\n", kSpinNs / 1e6, kTailKernels);
  kobs.reset();
  robs.reset();
  cobs.reset();
  t0 = realtime_ns();
  cm_test_spin<<<1, 32, 0, streams[0]>>>(kSpinNs, d_sink);
  CK(cudaGetLastError());
  for (int i = 0; i < kTailKernels; i++)
    cm_test_tail<<<blocks, threads, 0, streams[i % kStreams]>>>(dy[i % kStreams], kElems);
  CK(cudaGetLastError());
  cudaError_t q = cudaStreamQuery(streams[0]);
  f0 = realtime_ns();
  rc = cm_flush(e, CM_FLUSH_SYNC, kFlushTimeoutMs);
  t1 = realtime_ns();
  printf("  spin kernel still running when the flush was called: %s; flush took %.3f ms\n",
         q == cudaErrorNotReady ? "yes" : "no (the fence is then not really exercised)",
         (double)(t1 - f0) / 1e6);
  check(rc == 0, "cm_flush(SYNC) returns 0", "rc=%d (%s) %s", rc, cm_err_name(rc),
        rc ? cm_errmsg() : "");
  {
    std::lock_guard<std::mutex> g1(kobs.mu);
    std::lock_guard<std::mutex> g3(robs.mu);
    check(kobs.count[CAT_SPIN] == 1, "fence: spin kernel delivered by flush return",
          "got %" PRIu64 ", want 1", kobs.count[CAT_SPIN]);
    check(kobs.count[CAT_TAIL] == kTailKernels, "fence: tail kernels delivered by flush return",
          "got %" PRIu64 ", want %d", kobs.count[CAT_TAIL], kTailKernels);
    check(kobs.spin_duration >= kSpinNs * 9 / 10, "fence: spin kernel record lasts ~20 ms",
          "duration %.3f ms", kobs.spin_duration / 1e6);
    uint64_t stray = kobs.count[CAT_AXPY] + kobs.count[CAT_SCALE] + kobs.count[CAT_CYCLE] +
                     kobs.count[CAT_OTHER];
    check(stray == 0, "fence: nothing from phase 1 redelivered", "stray=%" PRIu64 " %s", stray,
          kobs.other_names.c_str());
    check(robs.launches() == 1 + kTailKernels, "fence: launch API records",
          "got %" PRIu64 ", want %d", robs.launches(), 1 + kTailKernels);
    check_times("fence kernels", kobs.ts, t0, t1);
  }

  /* Removing the observers delivers anything still pending; after a sync flush nothing should be,
   * so the counts must not move (a second delivery of a record would show here). */
  rc = cm_unobserve(e, kid);
  int rc2 = cm_unobserve(e, cid), rc3 = cm_unobserve(e, rid);
  check(rc == 0 && rc2 == 0 && rc3 == 0, "cm_unobserve x3", "rc=%d,%d,%d %s", rc, rc2, rc3,
        (rc || rc2 || rc3) ? cm_errmsg() : "");
  {
    std::lock_guard<std::mutex> g1(kobs.mu);
    check(kobs.count[CAT_SPIN] == 1 && kobs.count[CAT_TAIL] == kTailKernels,
          "unobserve after sync flush adds nothing", "spin %" PRIu64 " tail %" PRIu64,
          kobs.count[CAT_SPIN], kobs.count[CAT_TAIL]);
  }
  check(cm_enabled_kinds(e) == 0, "last unobserve disables every kind", "mask=0x%" PRIx64,
        cm_enabled_kinds(e));
  check(cm_unobserve(e, kid) < 0, "unobserve of a removed id fails", "rc=%d", cm_unobserve(e, kid));

  /* ================= phase 3: start/stop cycles ================= */
  printf("\n== phase 3: %d cycles of observe, launch k kernels, unobserve ==\n", kCycles);
  KernelObserver yobs;
  yobs.e = e;
  yobs.f_name = kobs.f_name;
  yobs.f_start = kobs.f_start;
  yobs.f_stop = kobs.f_stop;
  yobs.want_cols = 3;
  int cycle_fail = 0, cycle_stray = 0, cycle_time = 0, cycle_rc = 0, cycle_kinds = 0;
  uint64_t total_want = 0, total_got = 0;
  for (int c = 0; c < kCycles; c++) {
    const int k = 5 + c * 3 % 47; /* 5..51, varied so a shifted record changes a count */
    yobs.reset();
    uint32_t yid = 0;
    uint64_t c0 = realtime_ns();
    rc = cm_observe(e, cysel, KernelObserver::cb, &yobs, &yid);
    if (rc != 0) {
      cycle_rc++;
      printf("  cycle %d: cm_observe: %s: %s\n", c, cm_err_name(rc), cm_errmsg());
      continue;
    }
    for (int i = 0; i < k; i++) cm_test_cycle<<<1, 32, 0, streams[i % kStreams]>>>(d_sink + 1);
    CK(cudaGetLastError());
    rc = cm_unobserve(e, yid);
    uint64_t c1 = realtime_ns();
    if (rc != 0) {
      cycle_rc++;
      printf("  cycle %d: cm_unobserve: %s: %s\n", c, cm_err_name(rc), cm_errmsg());
    }
    std::lock_guard<std::mutex> g(yobs.mu);
    uint64_t got = yobs.count[CAT_CYCLE];
    uint64_t stray = 0;
    for (int cat = 0; cat < CAT_N; cat++)
      if (cat != CAT_CYCLE) stray += yobs.count[cat];
    total_want += (uint64_t)k;
    total_got += got;
    if (got != (uint64_t)k || yobs.bad_batches) {
      cycle_fail++;
      printf("  cycle %d: got %" PRIu64 " cycle kernel records, want %d (bad batches %" PRIu64
             ")\n", c, got, k, yobs.bad_batches);
    }
    if (stray) {
      cycle_stray++;
      printf("  cycle %d: %" PRIu64 " records of other kernels %s\n", c, stray,
             yobs.other_names.c_str());
    }
    if (yobs.ts.inverted || yobs.ts.zero_ts || yobs.ts.min_start < c0 || yobs.ts.max_stop > c1) {
      cycle_time++;
      printf("  cycle %d: timestamps out of order or outside [%" PRIu64 ", %" PRIu64 "]\n", c, c0,
             c1);
    }
    if (cm_enabled_kinds(e) != 0) cycle_kinds++;
  }
  check(cycle_rc == 0, "cycles: observe/unobserve succeed", "failures=%d of %d", cycle_rc, kCycles);
  check(cycle_fail == 0 && total_got == total_want, "cycles: exact records per cycle",
        "bad cycles %d; total %" PRIu64 "/%" PRIu64, cycle_fail, total_got, total_want);
  check(cycle_stray == 0, "cycles: no stray records", "cycles with strays %d", cycle_stray);
  check(cycle_time == 0, "cycles: timestamps ordered and bracketed", "bad cycles %d", cycle_time);
  check(cycle_kinds == 0, "cycles: kinds disabled after each stop", "bad cycles %d", cycle_kinds);

  /* ================= summary ================= */
  cm_stats st;
  cm_session_info si;
  memset(&st, 0, sizeof st);
  memset(&si, 0, sizeof si);
  int src = cm_stats_get(e, &st);
  int irc = cm_session_info_get(e, &si);
  printf("\n== engine ==\n");
  printf("  cuptimon %s, CUPTI version %u, clock_realtime %d, timestamp_callback %d, "
         "clock_offset %" PRId64 " ns\n  cupti_path %s\n",
         cm_version(), si.cupti_version, si.clock_realtime, si.timestamp_callback,
         si.clock_offset_ns, si.cupti_path);
  printf("  records_decoded %" PRIu64 ", records_delivered %" PRIu64 ", records_dropped %" PRIu64
         "\n  buffers allocated %" PRIu64 " decoded %" PRIu64 " outstanding %" PRIu64
         " refused %" PRIu64 ", bytes_decoded %" PRIu64 "\n  drains %" PRIu64 ", fences %" PRIu64
         ", fence_timeouts %" PRIu64 ", sessions %" PRIu64 ", strings %" PRIu64
         ", decode_queue_peak %" PRIu64 "\n",
         st.records_decoded, st.records_delivered, st.records_dropped, st.buffers_allocated,
         st.buffers_decoded, st.buffers_outstanding, st.buffers_refused, st.bytes_decoded,
         st.drains, st.fences, st.fence_timeouts, st.sessions, st.strings, st.decode_queue_peak);
  printf("  records by kind:");
  for (int k = 0; k < CM_KIND_MAX; k++)
    if (st.records_by_kind[k])
      printf(" %s=%" PRIu64, cm_kind_name(k) ? cm_kind_name(k) : "?", st.records_by_kind[k]);
  printf("\n");
  check(src == 0 && irc == 0, "cm_stats_get / cm_session_info_get", "rc=%d,%d", src, irc);
  check(st.records_dropped == 0 && st.buffers_refused == 0, "no records dropped",
        "dropped %" PRIu64 ", refused buffers %" PRIu64, st.records_dropped, st.buffers_refused);
  check(st.fence_timeouts == 0, "no fence timed out", "fence_timeouts %" PRIu64, st.fence_timeouts);
  check(st.sessions >= 1 + kCycles, "sessions counted", "sessions %" PRIu64 ", want >= %d",
        st.sessions, 1 + kCycles);
  check(si.clock_realtime == 1 || si.timestamp_callback == 1, "timestamps are CLOCK_REALTIME",
        "clock_realtime %d, timestamp_callback %d", si.clock_realtime, si.timestamp_callback);

  cm_engine_free(e);
  for (int i = 0; i < 4; i++) cm_selection_free(*sels[i]);
  for (int s = 0; s < kStreams; s++) {
    cudaStreamDestroy(streams[s]);
    cudaFree(dx[s]);
    cudaFree(dy[s]);
  }
  cudaEventDestroy(ev);
  cudaFreeHost(h_src);
  cudaFreeHost(h_dst);
  cudaFree(d_a);
  cudaFree(d_b);
  cudaFree(d_c);
  cudaFree(d_m);
  cudaFree(d_sink);

  printf("\nRESULT: %s (%d of %d checks passed)\n", g_failures ? "FAIL" : "PASS",
         g_checks - g_failures, g_checks);
  return g_failures ? 1 : 0;
}
