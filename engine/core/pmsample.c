/*
 * pmsample.c: PM sampling, the GPU's performance-monitor counters read at a fixed interval.
 *
 * Design. Consumers name metrics per device; the module runs at most one CUPTI PM sampling
 * session per device, over the union of that device's consumers' metrics, at the shortest
 * interval asked for. The first consumer of a device starts its session and the last one's
 * removal stops it; any change of the union stops the session (polling it one last time, so its
 * samples are kept) and starts a new one. A session is: a profiler host object for the device's
 * chip (cuptiProfilerHostInitialize), which turns metric names into a config image and later
 * evaluates raw counters into metric values; a sampling object (cuptiPmSamplingEnable) that the
 * config image programs (SetConfig) and that fills a hardware buffer; and a counter data image
 * that cuptiPmSamplingDecodeData decodes the hardware buffer into.
 *
 * Polling runs when the engine delivers (its delivery cadence, or a flush): the hardware buffer
 * is decoded into the image, each completed sample's timestamps and metric values are read, and
 * the samples become CM_KIND_PM_SAMPLE records injected into the decoder beside the activity
 * records of the same drain. The hardware buffer is sized from the interval and the expected
 * time between polls, with a margin, so that it does not overflow; when it does anyway (CUPTI's
 * overflow flag), the poll is counted in `overflows` and reported, never hidden.
 *
 * Caveats handled here: a metric set that needs more than one pass cannot be sampled and is
 * refused with CM_ENOSYS; cuptiProfilerInitialize is called once per process and
 * cuptiProfilerDeInitialize never (a second deinitialization crashes CUPTI, and the activity API
 * keeps running beside it anyway); every host and sampling object is released exactly once (the
 * pointer is cleared as it is released); every input a CUPTI object was given a pointer to (the
 * chip name and counter availability image of the host object, the config image of the sampling
 * object, the metric list of both) lives in the session until both objects are released, since
 * CUPTI may keep those pointers (freeing them right after setup, as this module first did, is a
 * use after free on the GPU); a session starts only on a device whose CUDA context exists, and
 * no CUPTI call touches it once that context is gone; sample timestamps are on cuptiGetTimestamp's clock and
 * are converted with the engine's clock offset, and samples whose timestamps fall outside the
 * session's window on that clock (another clock domain, or garbage) are dropped and counted in
 * `filtered`.
 *
 * Threads: cm__pm_add and cm__pm_remove run on the control path (api_mu held), cm__pm_drain in
 * delivery (dec_mu held). `mu` guards the consumers, the sessions and the pending records, and is
 * held across the PM CUPTI calls (a poll decodes and evaluates under it); under it only
 * g_profiler_mu is taken (docs/architecture.md, "Locks"). The counters are relaxed atomics, so
 * cm__pm_stats reads them from any thread without the lock (the agent does, under its send lock).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cm_internal.h"

#define PM_MAX_DEVICES 64
#define PM_MAX_METRICS 64
/* The shortest interval accepted, in microseconds. */
#define PM_MIN_INTERVAL_US 20
/* A guess at the hardware buffer's bytes per sample, generous on purpose: the buffer lives in
 * device-visible memory that CUPTI allocates, and a too-small one loses samples. */
#define PM_BYTES_PER_SAMPLE 4096
#define PM_HW_MIN ((size_t)32 << 20)
#define PM_HW_MAX ((size_t)512 << 20)
/* Decode rounds per session per poll: each fills at most one image. */
#define PM_MAX_ROUNDS 64
/* Slack of the clock filter around the session's window. */
#define PM_CLOCK_SLACK_NS 2000000000ull

typedef struct consumer {
  uint32_t id;
  int device;
  uint32_t interval_us;
  uint32_t nmetrics;
  const char **metrics; /* names owned by the module's name list */
} consumer;

typedef struct session {
  bool on;
  CUpti_PmSampling_Object *obj;      /* released (and cleared) exactly once */
  CUpti_Profiler_Host_Object *host;  /* likewise */
  /* What the CUPTI objects were made from, kept until they are released: CUPTI may keep the
   * pointers it was given (NVIDIA's sample and XLA keep every one alive for the objects' life). */
  char chip[64];      /* pChipName of the host object */
  uint8_t *avail;     /* pCounterAvailabilityImage of the host object */
  uint8_t *config;    /* pConfig of the sampling object */
  const char **metrics; /* ppMetricNames / pMetricNames of every call (names owned by the module) */
  uint32_t nmetrics;
  uint32_t interval_us;
  uint8_t *image;
  size_t image_size;
  uint32_t emitted;  /* samples of the current image already turned into records */
  bool ctx_gone;     /* the device's context went away while sampling: no more CUPTI calls on obj */
  uint64_t started_ns; /* CLOCK_REALTIME when the session started */
} session;

struct cm__pm {
  const cm__cupti *c;
  int64_t clock_offset_ns;
  pthread_mutex_t mu; /* guards everything below but the counters */
  char **names;       /* every metric name ever requested, kept until the module is freed */
  uint32_t nnames, cap_names;
  consumer *cons;
  uint32_t ncons, cap_cons;
  uint32_t next_id;
  uint64_t next_sample[PM_MAX_DEVICES];
  session dev[PM_MAX_DEVICES];
  cm__pm_record *pending;
  size_t npending, cap_pending;
  cm__pm_columns cols;
  _Atomic uint64_t st_consumers, st_sessions, st_polls, st_samples, st_filtered, st_overflows,
      st_dropped;
};

#define PADD(pm, f, v) atomic_fetch_add_explicit(&(pm)->f, (v), memory_order_relaxed)

static pthread_mutex_t g_profiler_mu = PTHREAD_MUTEX_INITIALIZER;
static bool g_profiler_initialized; /* guarded by g_profiler_mu; never reset */

bool cm__pm_profiler_initialized(void) {
  pthread_mutex_lock(&g_profiler_mu);
  bool on = g_profiler_initialized;
  pthread_mutex_unlock(&g_profiler_mu);
  return on;
}

/* ---- the call trace ------------------------------------------------------------------------- */

/* With CUPTIMON_PM_TRACE=1 (or CUPTIMON_AGENT_LOG=debug) every CUPTI PM sampling and profiler
 * host call is written to stderr before it is made and after it returns, with its key arguments
 * and results, so that a crash inside CUPTI is pinpointed by the last line even without a
 * debugger; the per-sample calls of a decode round are traced for its first PM_TRACE_SAMPLES
 * samples only, all of them with CUPTIMON_PM_TRACE=2. Each line is one write(2), so nothing stays
 * in a buffer when the process dies. */
#define PM_TRACE_SAMPLES 3
static pthread_once_t g_trace_once = PTHREAD_ONCE_INIT;
static int g_trace_level;

static void trace_init(void) {
  const char *t = getenv("CUPTIMON_PM_TRACE"), *l = getenv("CUPTIMON_AGENT_LOG");
  if (t && *t && strcmp(t, "0") != 0) g_trace_level = atoi(t) >= 2 ? 2 : 1;
  else if (l && !strcmp(l, "debug")) g_trace_level = 1;
}

int cm__pm_trace_level(void) {
  pthread_once(&g_trace_once, trace_init);
  return g_trace_level;
}

void cm__pm_trace(const char *fmt, ...) {
  if (!cm__pm_trace_level()) return;
  char prefix[64];
  snprintf(prefix, sizeof prefix, "cuptimon pm [pid %d tid %ld]: ", (int)getpid(),
           (long)syscall(SYS_gettid));
  va_list ap;
  va_start(ap, fmt);
  cm__stderr_linev(prefix, fmt, ap);
  va_end(ap);
}

/* Calls `fn(&p)` into `r`, between two trace lines when `traced`: the call with p's structSize
 * and the arguments `fmt` formats, then its result. */
#define PM_CALL_T(traced, r, sym, fn, p, fmt, ...)                                             \
  do {                                                                                         \
    bool tr_ = (traced);                                                                       \
    if (tr_) cm__pm_trace("> %s(structSize=%zu, " fmt ")", sym, (size_t)(p).structSize,        \
                          __VA_ARGS__);                                                        \
    (r) = (fn)(&(p));                                                                          \
    if (tr_) cm__pm_trace("< %s = %d", sym, (int)(r));                                         \
  } while (0)
#define PM_CALL(r, sym, fn, p, fmt, ...) PM_CALL_T(true, r, sym, fn, p, fmt, __VA_ARGS__)

/* ---- names ----------------------------------------------------------------------------------- */

/* The module's copy of `name` (deduplicated by content), or NULL without memory. mu held. */
static const char *keep_name(cm__pm *pm, const char *name) {
  for (uint32_t i = 0; i < pm->nnames; i++)
    if (!strcmp(pm->names[i], name)) return pm->names[i];
  if (pm->nnames == pm->cap_names) {
    uint32_t cap = pm->cap_names ? pm->cap_names * 2 : 16;
    char **n = realloc(pm->names, cap * sizeof *n);
    if (!n) return NULL;
    pm->names = n;
    pm->cap_names = cap;
  }
  char *copy = strdup(name);
  if (!copy) return NULL;
  pm->names[pm->nnames++] = copy;
  return copy;
}

/* ---- decode ---------------------------------------------------------------------------------- */

static int grow_columns(cm__pm_columns *cols, uint32_t need, uint32_t nmetrics) {
  if (need <= cols->cap && nmetrics == cols->nmetrics) return 0;
  uint32_t cap = cols->cap > need ? cols->cap : need;
  if (cap < 64) cap = 64;
  uint64_t *start = malloc(cap * sizeof *start), *stop = malloc(cap * sizeof *stop);
  double *values = malloc((size_t)cap * (nmetrics ? nmetrics : 1) * sizeof *values);
  if (!start || !stop || !values) {
    free(start);
    free(stop);
    free(values);
    return CM_ENOMEM;
  }
  /* Existing samples are kept only when the shape is unchanged (cm__pm_decode_image appends). */
  if (cols->n && nmetrics == cols->nmetrics) {
    memcpy(start, cols->start, cols->n * sizeof *start);
    memcpy(stop, cols->stop, cols->n * sizeof *stop);
    for (uint32_t m = 0; m < nmetrics; m++)
      memcpy(values + (size_t)m * cap, cols->values + (size_t)m * cols->cap,
             cols->n * sizeof *values);
  } else {
    cols->n = 0;
  }
  free(cols->start);
  free(cols->stop);
  free(cols->values);
  cols->start = start;
  cols->stop = stop;
  cols->values = values;
  cols->cap = cap;
  cols->nmetrics = nmetrics;
  return 0;
}

void cm__pm_columns_free(cm__pm_columns *cols) {
  free(cols->start);
  free(cols->stop);
  free(cols->values);
  memset(cols, 0, sizeof *cols);
}

/* Decodes samples [first, completed) of the image, appending to `cols`; *next receives
 * `completed`. */
static int decode_range(const cm__cupti *c, CUpti_PmSampling_Object *obj,
                        CUpti_Profiler_Host_Object *host, const uint8_t *image, size_t image_size,
                        const char *const *metrics, uint32_t nmetrics, int64_t clock_offset_ns,
                        uint64_t lo_ns, uint64_t hi_ns, uint32_t first, cm__pm_columns *cols,
                        uint64_t *filtered, uint32_t *next) {
  CUpti_PmSampling_GetCounterDataInfo_Params info = {
      .structSize = CUpti_PmSampling_GetCounterDataInfo_Params_STRUCT_SIZE,
      .pCounterDataImage = image,
      .counterDataImageSize = image_size};
  int r;
  PM_CALL(r, "cuptiPmSamplingGetCounterDataInfo", c->PmGetCounterDataInfo, info,
          "image=%p, size=%zu", (const void *)image, image_size);
  if (r != CUPTI_SUCCESS) return cm__cupti_err(c, r, "cuptiPmSamplingGetCounterDataInfo");
  cm__pm_trace("  total=%zu populated=%zu completed=%zu", info.numTotalSamples,
               info.numPopulatedSamples, info.numCompletedSamples);
  uint32_t done = info.numCompletedSamples > UINT32_MAX ? UINT32_MAX : (uint32_t)info.numCompletedSamples;
  *next = done > first ? done : first;
  if (done <= first) return 0;
  int rc = grow_columns(cols, cols->n + (done - first), nmetrics);
  if (rc) return cm__seterr(rc, "no memory for %u PM samples", done - first);
  double vals[PM_MAX_METRICS];
  for (uint32_t i = first; i < done; i++) {
    CUpti_PmSampling_CounterData_GetSampleInfo_Params si = {
        .structSize = CUpti_PmSampling_CounterData_GetSampleInfo_Params_STRUCT_SIZE,
        .pPmSamplingObject = obj,
        .pCounterDataImage = image,
        .counterDataImageSize = image_size,
        .sampleIndex = i};
    bool tr = cm__pm_trace_level() >= 2 || i < first + PM_TRACE_SAMPLES;
    PM_CALL_T(tr, r, "cuptiPmSamplingCounterDataGetSampleInfo", c->PmCounterDataGetSampleInfo, si,
            "obj=%p, image=%p, size=%zu, sample=%u", (void *)obj, (const void *)image, image_size, i);
    if (r != CUPTI_SUCCESS) return cm__cupti_err(c, r, "cuptiPmSamplingCounterDataGetSampleInfo");
    uint64_t start = si.startTimestamp - (uint64_t)clock_offset_ns;
    uint64_t stop = si.endTimestamp - (uint64_t)clock_offset_ns;
    if (!si.startTimestamp || si.endTimestamp < si.startTimestamp || start < lo_ns ||
        stop > hi_ns) {
      (*filtered)++;
      continue;
    }
    CUpti_Profiler_Host_EvaluateToGpuValues_Params ev = {
        .structSize = CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE,
        .pHostObject = host,
        .pCounterDataImage = image,
        .counterDataImageSize = image_size,
        .rangeIndex = i,
        .ppMetricNames = (const char **)metrics,
        .numMetrics = nmetrics,
        .pMetricValues = vals};
    PM_CALL_T(tr, r, "cuptiProfilerHostEvaluateToGpuValues", c->HostEvaluateToGpuValues, ev,
            "host=%p, image=%p, size=%zu, range=%u, metrics=%u, values=%p", (void *)host,
            (const void *)image, image_size, i, nmetrics, (void *)vals);
    if (r != CUPTI_SUCCESS) return cm__cupti_err(c, r, "cuptiProfilerHostEvaluateToGpuValues");
    uint32_t k = cols->n++;
    cols->start[k] = start;
    cols->stop[k] = stop;
    for (uint32_t m = 0; m < nmetrics; m++) cols->values[(size_t)m * cols->cap + k] = vals[m];
  }
  return 0;
}

int cm__pm_decode_image(const cm__cupti *c, CUpti_PmSampling_Object *obj,
                        CUpti_Profiler_Host_Object *host, const uint8_t *image, size_t image_size,
                        const char *const *metrics, uint32_t nmetrics, int64_t clock_offset_ns,
                        uint64_t lo_ns, uint64_t hi_ns, cm__pm_columns *cols, uint64_t *filtered) {
  uint32_t next;
  if (nmetrics > PM_MAX_METRICS) return cm__seterr(CM_EINVAL, "more than %d metrics", PM_MAX_METRICS);
  cols->n = 0;
  return decode_range(c, obj, host, image, image_size, metrics, nmetrics, clock_offset_ns, lo_ns,
                      hi_ns, 0, cols, filtered, &next);
}

/* ---- sessions -------------------------------------------------------------------------------- */

/* A CUPTI failure of the setup calls that touch the device. A device that is not ready yet (the
 * driver still initializing it while the application's cuInit runs) is CM_EAGAIN, which a caller
 * may retry; the rest as cm__cupti_err translates them. */
static int device_err(const cm__cupti *c, int r, const char *what) {
  if (r == CUPTI_ERROR_NOT_INITIALIZED || r == CUPTI_ERROR_NOT_READY) {
    const char *s = NULL;
    c->GetResultString((CUptiResult)r, &s);
    return cm__seterr(CM_EAGAIN, "%s failed: %s (%d): the device is not ready yet; try again",
                      what, s ? s : "not ready", r);
  }
  return cm__cupti_err(c, r, what);
}

/* Whether `device` holds the application's CUDA context: 1 when its primary context is active,
 * 0 when it is not (or the driver is not initialized yet), -1 when unknown (no libcuda, or an
 * error such as an ordinal the driver does not know, which CUPTI then reports itself). CUPTI's
 * PM sampling programs the device and allocates its hardware buffer in device-visible memory;
 * NVIDIA's sample and the known users enable it only on a device whose context exists, and a
 * poll or a stop after the context is gone (a device reset, or the runtime's teardown at exit)
 * would touch a buffer that no longer exists. */
static int device_ctx(const cm__cupti *c, int device) {
  if (!c->cuDevicePrimaryCtxGetState) return -1;
  unsigned flags = 0;
  int active = 0;
  int r = c->cuDevicePrimaryCtxGetState(device, &flags, &active);
  cm__pm_trace("  cuDevicePrimaryCtxGetState(device=%d) = %d, active=%d", device, r, active);
  if (r == 3 /* CUDA_ERROR_NOT_INITIALIZED */) return 0;
  if (r != 0) return -1;
  return active ? 1 : 0;
}

static int init_image(const cm__cupti *c, session *s) {
  CUpti_PmSampling_CounterDataImage_Initialize_Params p = {
      .structSize = CUpti_PmSampling_CounterDataImage_Initialize_Params_STRUCT_SIZE,
      .pPmSamplingObject = s->obj,
      .counterDataSize = s->image_size,
      .pCounterData = s->image};
  int r;
  PM_CALL(r, "cuptiPmSamplingCounterDataImageInitialize", c->PmCounterDataImageInitialize, p,
          "obj=%p, image=%p, size=%zu", (void *)s->obj, (void *)s->image, s->image_size);
  s->emitted = 0;
  return r == CUPTI_SUCCESS ? 0 : cm__cupti_err(c, r, "cuptiPmSamplingCounterDataImageInitialize");
}

/* Releases whatever the session holds, each object exactly once. */
static void release(const cm__cupti *c, session *s) {
  if (s->obj) {
    CUpti_PmSampling_Disable_Params p = {.structSize = CUpti_PmSampling_Disable_Params_STRUCT_SIZE,
                                         .pPmSamplingObject = s->obj};
    s->obj = NULL;
    int r;
    PM_CALL(r, "cuptiPmSamplingDisable", c->PmDisable, p, "obj=%p", (void *)p.pPmSamplingObject);
    (void)r;
  }
  if (s->host) {
    CUpti_Profiler_Host_Deinitialize_Params p = {
        .structSize = CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE, .pHostObject = s->host};
    s->host = NULL;
    int r;
    PM_CALL(r, "cuptiProfilerHostDeinitialize", c->HostDeinitialize, p, "host=%p",
            (void *)p.pHostObject);
    (void)r;
  }
  /* Only now that both objects are gone: they may point into these. */
  free(s->image);
  free(s->metrics);
  free(s->avail);
  free(s->config);
  memset(s, 0, sizeof *s);
}

static int host_new(const cm__cupti *c, const char *chip, uint8_t *avail,
                    CUpti_Profiler_Host_Object **out) {
  CUpti_Profiler_Host_Initialize_Params p = {
      .structSize = CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE,
      .profilerType = CUPTI_PROFILER_TYPE_PM_SAMPLING,
      .pChipName = chip,
      .pCounterAvailabilityImage = avail};
  int r;
  PM_CALL(r, "cuptiProfilerHostInitialize", c->HostInitialize, p,
          "type=PM_SAMPLING, chip=%s, availability=%p", chip, (void *)avail);
  if (r != CUPTI_SUCCESS) return cm__cupti_err(c, r, "cuptiProfilerHostInitialize");
  cm__pm_trace("  host=%p", (void *)p.pHostObject);
  *out = p.pHostObject;
  return 0;
}

static void host_free(const cm__cupti *c, CUpti_Profiler_Host_Object *h) {
  CUpti_Profiler_Host_Deinitialize_Params p = {
      .structSize = CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE, .pHostObject = h};
  int r;
  PM_CALL(r, "cuptiProfilerHostDeinitialize", c->HostDeinitialize, p, "host=%p", (void *)h);
  (void)r;
}

static int add_metrics(const cm__cupti *c, CUpti_Profiler_Host_Object *h, const char **m,
                       uint32_t n) {
  CUpti_Profiler_Host_ConfigAddMetrics_Params p = {
      .structSize = CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE,
      .pHostObject = h,
      .ppMetricNames = m,
      .numMetrics = n};
  int r;
  PM_CALL(r, "cuptiProfilerHostConfigAddMetrics", c->HostConfigAddMetrics, p,
          "host=%p, metrics=%u, first=%s", (void *)h, n, n ? m[0] : "");
  for (uint32_t i = 1; i < n; i++) cm__pm_trace("  metric %u: %s", i, m[i]);
  return r;
}

/* Appends to `b` (`cap` bytes) what the chip offers near a refused metric: the sub-metrics of
 * its base metric (the name up to its first '.') when the chip knows the base, else the base
 * metrics of the same unit (the name up to "__"). At most 16 names; nothing when the query
 * entry points are missing or fail. */
static void suggest(const cm__cupti *c, const char *chip, uint8_t *avail, const char *bad,
                    char *b, size_t cap) {
  if (!c->HostGetMetricProperties || !c->HostGetSubMetrics || !c->HostGetBaseMetrics) return;
  CUpti_Profiler_Host_Object *h = NULL;
  if (host_new(c, chip, avail, &h)) return;
  char base[260];
  snprintf(base, sizeof base, "%.*s", (int)strcspn(bad, "."), bad);
  size_t used = strlen(b);
  int shown = 0;
  CUpti_Profiler_Host_GetMetricProperties_Params mp = {
      .structSize = CUpti_Profiler_Host_GetMetricProperties_Params_STRUCT_SIZE,
      .pHostObject = h,
      .pMetricName = base};
  int r;
  PM_CALL(r, "cuptiProfilerHostGetMetricProperties", c->HostGetMetricProperties, mp,
          "host=%p, metric=%s", (void *)h, base);
  if (r == CUPTI_SUCCESS) {
    CUpti_Profiler_Host_GetSubMetrics_Params sp = {
        .structSize = CUpti_Profiler_Host_GetSubMetrics_Params_STRUCT_SIZE,
        .pHostObject = h,
        .metricType = mp.metricType,
        .pMetricName = base};
    PM_CALL(r, "cuptiProfilerHostGetSubMetrics", c->HostGetSubMetrics, sp,
            "host=%p, type=%d, metric=%s", (void *)h, (int)sp.metricType, base);
    if (r == CUPTI_SUCCESS && sp.ppSubMetrics) {
      used += (size_t)snprintf(b + used, used < cap ? cap - used : 0,
                               ". This chip offers %s with:", base);
      for (size_t i = 0; i < sp.numOfSubmetrics && shown < 16 && used < cap; i++, shown++)
        used += (size_t)snprintf(b + used, cap - used, "%s %s", i ? "," : "", sp.ppSubMetrics[i]);
    }
  } else {
    const char *unit_end = strstr(bad, "__");
    size_t unit = unit_end ? (size_t)(unit_end - bad) + 2 : strlen(bad);
    for (int t = 0; t < CUPTI_METRIC_TYPE__COUNT && shown < 16; t++) {
      CUpti_Profiler_Host_GetBaseMetrics_Params bp = {
          .structSize = CUpti_Profiler_Host_GetBaseMetrics_Params_STRUCT_SIZE,
          .pHostObject = h,
          .metricType = (CUpti_MetricType)t};
      PM_CALL(r, "cuptiProfilerHostGetBaseMetrics", c->HostGetBaseMetrics, bp, "host=%p, type=%d",
              (void *)h, t);
      if (r != CUPTI_SUCCESS || !bp.ppMetricNames) continue;
      for (size_t i = 0; i < bp.numMetrics && shown < 16 && used < cap; i++) {
        if (strncmp(bp.ppMetricNames[i], bad, unit) != 0) continue;
        used += (size_t)snprintf(b + used, cap - used, "%s %s",
                                 shown ? "," : ". Base metrics of this chip with that unit:",
                                 bp.ppMetricNames[i]);
        shown++;
      }
    }
  }
  host_free(c, h);
}

/* Finds which metric the chip rejects, on fresh host objects, and says so. */
static int name_bad_metric(const cm__cupti *c, const char *chip, uint8_t *avail, int device,
                           const char **m, uint32_t n, int res) {
  for (uint32_t i = 0; i < n; i++) {
    CUpti_Profiler_Host_Object *h = NULL;
    if (host_new(c, chip, avail, &h)) break;
    int r = add_metrics(c, h, &m[i], 1);
    host_free(c, h);
    if (r != CUPTI_SUCCESS) {
      const char *s = NULL;
      c->GetResultString((CUptiResult)r, &s);
      char near[1400] = "";
      suggest(c, chip, avail, m[i], near, sizeof near);
      return cm__seterr(CM_ENOENT,
                        "metric \"%s\" cannot be PM-sampled on device %d (chip %s): %s. PM "
                        "sampling supports a subset of the profiler's metrics; check the name "
                        "against that chip's list (CUPTI's pm_sampling sample lists them, or "
                        "ncu --query-metrics --chip %s), and use a base metric with a "
                        ".sum/.avg/.max rollup such as sm__cycles_active.avg%.1400s",
                        m[i], device, chip, s ? s : "rejected", chip, near);
    }
  }
  return cm__cupti_err(c, res, "cuptiProfilerHostConfigAddMetrics");
}

/* Starts a session on `device` over the metrics `m` (the module's names). On failure nothing is
 * left behind. mu held. */
static int start_session(cm__pm *pm, int device, const char **m, uint32_t n, uint32_t interval_us,
                         uint32_t poll_ms) {
  const cm__cupti *c = pm->c;
  session *s = &pm->dev[device];
  int rc = 0, r;
  uint8_t *avail, *config;
  memset(s, 0, sizeof *s);
  cm__pm_trace("start: device %d, %u metrics, interval %u us, poll %u ms", device, n, interval_us,
               poll_ms);
  if (device_ctx(c, device) == 0)
    return cm__seterr(CM_EAGAIN,
                      "device %d has no CUDA context yet: PM sampling starts on a device once the "
                      "application has created its context there (cudaSetDevice, the first "
                      "allocation or launch); try again",
                      device);

  pthread_mutex_lock(&g_profiler_mu);
  if (!g_profiler_initialized) {
    CUpti_Profiler_Initialize_Params ip = {.structSize = CUpti_Profiler_Initialize_Params_STRUCT_SIZE};
    PM_CALL(r, "cuptiProfilerInitialize", c->ProfilerInitialize, ip, "pPriv=%p", ip.pPriv);
    if (r == CUPTI_SUCCESS) g_profiler_initialized = true;
    else rc = cm__cupti_err(c, r, "cuptiProfilerInitialize");
  }
  pthread_mutex_unlock(&g_profiler_mu);
  if (rc) return rc;

  CUpti_Device_GetChipName_Params cp = {.structSize = CUpti_Device_GetChipName_Params_STRUCT_SIZE,
                                        .deviceIndex = (size_t)device};
  PM_CALL(r, "cuptiDeviceGetChipName", c->DeviceGetChipName, cp, "device=%d", device);
  if (r != CUPTI_SUCCESS) return device_err(c, r, "cuptiDeviceGetChipName");
  cm__pm_trace("  chip=%s", cp.pChipName ? cp.pChipName : "(null)");
  char *chip = s->chip;
  snprintf(chip, sizeof s->chip, "%s", cp.pChipName ? cp.pChipName : "?");
  s->metrics = malloc(n * sizeof *s->metrics);
  if (!s->metrics) return cm__seterr(CM_ENOMEM, "no memory for the metric list");
  memcpy(s->metrics, m, n * sizeof *m);
  s->nmetrics = n;

  CUpti_PmSampling_GetCounterAvailability_Params ap = {
      .structSize = CUpti_PmSampling_GetCounterAvailability_Params_STRUCT_SIZE,
      .deviceIndex = (size_t)device};
  PM_CALL(r, "cuptiPmSamplingGetCounterAvailability", c->PmGetCounterAvailability, ap,
          "device=%d, image=NULL", device);
  if (r != CUPTI_SUCCESS) return device_err(c, r, "cuptiPmSamplingGetCounterAvailability");
  cm__pm_trace("  availability size=%zu", ap.counterAvailabilityImageSize);
  avail = s->avail = malloc(ap.counterAvailabilityImageSize ? ap.counterAvailabilityImageSize : 1);
  if (!avail) {
    rc = cm__seterr(CM_ENOMEM, "no memory for the counter availability image");
    goto fail;
  }
  ap.pCounterAvailabilityImage = avail;
  PM_CALL(r, "cuptiPmSamplingGetCounterAvailability", c->PmGetCounterAvailability, ap,
          "device=%d, image=%p, size=%zu", device, (void *)avail, ap.counterAvailabilityImageSize);
  if (r != CUPTI_SUCCESS) {
    rc = cm__cupti_err(c, r, "cuptiPmSamplingGetCounterAvailability");
    goto fail;
  }

  if ((rc = host_new(c, chip, avail, &s->host))) goto fail;
  r = add_metrics(c, s->host, s->metrics, n);
  if (r != CUPTI_SUCCESS) {
    rc = name_bad_metric(c, chip, avail, device, m, n, r);
    goto fail;
  }
  CUpti_Profiler_Host_GetConfigImageSize_Params sp = {
      .structSize = CUpti_Profiler_Host_GetConfigImageSize_Params_STRUCT_SIZE, .pHostObject = s->host};
  PM_CALL(r, "cuptiProfilerHostGetConfigImageSize", c->HostGetConfigImageSize, sp, "host=%p",
          (void *)s->host);
  cm__pm_trace("  config size=%zu", sp.configImageSize);
  if (r != CUPTI_SUCCESS) {
    rc = cm__cupti_err(c, r, "cuptiProfilerHostGetConfigImageSize");
    goto fail;
  }
  config = s->config = malloc(sp.configImageSize ? sp.configImageSize : 1);
  if (!config) {
    rc = cm__seterr(CM_ENOMEM, "no memory for the config image");
    goto fail;
  }
  CUpti_Profiler_Host_GetConfigImage_Params gp = {
      .structSize = CUpti_Profiler_Host_GetConfigImage_Params_STRUCT_SIZE,
      .pHostObject = s->host,
      .configImageSize = sp.configImageSize,
      .pConfigImage = config};
  PM_CALL(r, "cuptiProfilerHostGetConfigImage", c->HostGetConfigImage, gp,
          "host=%p, config=%p, size=%zu", (void *)s->host, (void *)config, sp.configImageSize);
  if (r != CUPTI_SUCCESS) {
    rc = cm__cupti_err(c, r, "cuptiProfilerHostGetConfigImage");
    goto fail;
  }
  CUpti_Profiler_Host_GetNumOfPasses_Params np = {
      .structSize = CUpti_Profiler_Host_GetNumOfPasses_Params_STRUCT_SIZE,
      .configImageSize = sp.configImageSize,
      .pConfigImage = config};
  PM_CALL(r, "cuptiProfilerHostGetNumOfPasses", c->HostGetNumOfPasses, np,
          "config=%p, size=%zu", (void *)config, sp.configImageSize);
  cm__pm_trace("  passes=%zu", np.numOfPasses);
  if (r != CUPTI_SUCCESS) {
    rc = cm__cupti_err(c, r, "cuptiProfilerHostGetNumOfPasses");
    goto fail;
  }
  if (np.numOfPasses > 1) {
    rc = cm__seterr(CM_ENOSYS,
                    "the %u metrics asked for on device %d need %zu passes, and PM sampling "
                    "collects in one: ask for fewer metrics (the union over every consumer of "
                    "the device counts), or split them over separate runs",
                    n, device, np.numOfPasses);
    goto fail;
  }

  CUpti_PmSampling_Enable_Params ep = {.structSize = CUpti_PmSampling_Enable_Params_STRUCT_SIZE,
                                       .deviceIndex = (size_t)device};
  PM_CALL(r, "cuptiPmSamplingEnable", c->PmEnable, ep, "device=%d", device);
  cm__pm_trace("  obj=%p", (void *)ep.pPmSamplingObject);
  if (r != CUPTI_SUCCESS) {
    rc = device_err(c, r, "cuptiPmSamplingEnable");
    goto fail;
  }
  s->obj = ep.pPmSamplingObject;

  /* Size the hardware buffer for the samples of four poll periods, and the image for two. */
  uint64_t per_poll = ((uint64_t)(poll_ms ? poll_ms : 1000) * 1000) / interval_us + 1;
  uint64_t hw = per_poll * 4 * PM_BYTES_PER_SAMPLE;
  if (hw < PM_HW_MIN) hw = PM_HW_MIN;
  if (hw > PM_HW_MAX) hw = PM_HW_MAX;
  uint64_t max_samples = per_poll * 2;
  if (max_samples < 256) max_samples = 256;
  if (max_samples > 16384) max_samples = 16384;
  CUpti_PmSampling_SetConfig_Params cfg = {
      .structSize = CUpti_PmSampling_SetConfig_Params_STRUCT_SIZE,
      .pPmSamplingObject = s->obj,
      .configSize = sp.configImageSize,
      .pConfig = config,
      .hardwareBufferSize = (size_t)hw,
      .samplingInterval = (uint64_t)interval_us * 1000,
      .triggerMode = CUPTI_PM_SAMPLING_TRIGGER_MODE_GPU_TIME_INTERVAL,
      .hwBufferAppendMode = CUPTI_PM_SAMPLING_HARDWARE_BUFFER_APPEND_MODE_KEEP_OLDEST};
  PM_CALL(r, "cuptiPmSamplingSetConfig", c->PmSetConfig, cfg,
          "obj=%p, config=%p, size=%zu, hw_buffer=%zu, interval_ns=%llu, trigger=%d, append=%d",
          (void *)s->obj, (void *)config, cfg.configSize, cfg.hardwareBufferSize,
          (unsigned long long)cfg.samplingInterval, (int)cfg.triggerMode,
          (int)cfg.hwBufferAppendMode);
  if (r != CUPTI_SUCCESS) {
    rc = cm__cupti_err(c, r, "cuptiPmSamplingSetConfig");
    goto fail;
  }
  CUpti_PmSampling_GetCounterDataSize_Params dp = {
      .structSize = CUpti_PmSampling_GetCounterDataSize_Params_STRUCT_SIZE,
      .pPmSamplingObject = s->obj,
      .pMetricNames = s->metrics,
      .numMetrics = n,
      .maxSamples = (uint32_t)max_samples};
  PM_CALL(r, "cuptiPmSamplingGetCounterDataSize", c->PmGetCounterDataSize, dp,
          "obj=%p, metrics=%u, max_samples=%u", (void *)s->obj, n, dp.maxSamples);
  cm__pm_trace("  counter data size=%zu", dp.counterDataSize);
  if (r != CUPTI_SUCCESS) {
    rc = cm__cupti_err(c, r, "cuptiPmSamplingGetCounterDataSize");
    goto fail;
  }
  s->image_size = dp.counterDataSize;
  s->image = malloc(s->image_size ? s->image_size : 1);
  if (!s->image) {
    rc = cm__seterr(CM_ENOMEM, "no memory for the counter data image (%zu bytes)", s->image_size);
    goto fail;
  }
  s->interval_us = interval_us;
  if ((rc = init_image(c, s))) goto fail;
  CUpti_PmSampling_Start_Params st = {.structSize = CUpti_PmSampling_Start_Params_STRUCT_SIZE,
                                      .pPmSamplingObject = s->obj};
  PM_CALL(r, "cuptiPmSamplingStart", c->PmStart, st, "obj=%p", (void *)s->obj);
  if (r != CUPTI_SUCCESS) {
    rc = cm__cupti_err(c, r, "cuptiPmSamplingStart");
    goto fail;
  }
  s->started_ns = cm__realtime_ns();
  s->on = true;
  PADD(pm, st_sessions, 1);
  return 0;
fail:
  release(c, s);
  return rc;
}

/* Appends the decoded columns of device `device` to the pending records. mu held. */
static void pend(cm__pm *pm, int device, const session *s) {
  const cm__pm_columns *cols = &pm->cols;
  size_t need = pm->npending + (size_t)cols->n * s->nmetrics;
  if (need > pm->cap_pending) {
    size_t cap = pm->cap_pending ? pm->cap_pending : 256;
    while (cap < need) cap *= 2;
    cm__pm_record *p = realloc(pm->pending, cap * sizeof *p);
    if (!p) {
      PADD(pm, st_dropped, cols->n);
      return;
    }
    pm->pending = p;
    pm->cap_pending = cap;
  }
  for (uint32_t i = 0; i < cols->n; i++) {
    uint64_t seq = pm->next_sample[device]++;
    for (uint32_t m = 0; m < s->nmetrics; m++) {
      cm__pm_record *r = &pm->pending[pm->npending++];
      memset(r, 0, sizeof *r);
      r->kind = CM_KIND_PM_SAMPLE;
      r->device = (uint32_t)device;
      r->start = cols->start[i];
      r->stop = cols->stop[i];
      r->metric = s->metrics[m];
      r->sample = seq;
      r->value = cols->values[(size_t)m * cols->cap + i];
    }
  }
  PADD(pm, st_samples, cols->n);
}

/* Decodes what the hardware buffer holds into pending records. mu held. */
static void poll_session(cm__pm *pm, int device) {
  const cm__cupti *c = pm->c;
  session *s = &pm->dev[device];
  if (!s->on || s->ctx_gone) return;
  if (device_ctx(c, device) == 0) {
    /* The context is gone (the application reset the device, or the runtime's teardown at exit
     * ran): the hardware buffer went with it, so nothing is decoded, and the samples since the
     * last poll are lost: counted as one dropped poll. */
    PADD(pm, st_dropped, 1);
    s->ctx_gone = true;
    return;
  }
  PADD(pm, st_polls, 1);
  uint64_t hi = cm__realtime_ns() + PM_CLOCK_SLACK_NS;
  uint64_t lo = s->started_ns > PM_CLOCK_SLACK_NS ? s->started_ns - PM_CLOCK_SLACK_NS : 0;
  for (int round = 0; round < PM_MAX_ROUNDS; round++) {
    CUpti_PmSampling_DecodeData_Params dp = {
        .structSize = CUpti_PmSampling_DecodeData_Params_STRUCT_SIZE,
        .pPmSamplingObject = s->obj,
        .pCounterDataImage = s->image,
        .counterDataImageSize = s->image_size};
    int r;
    PM_CALL(r, "cuptiPmSamplingDecodeData", c->PmDecodeData, dp, "obj=%p, image=%p, size=%zu",
            (void *)s->obj, (void *)s->image, s->image_size);
    cm__pm_trace("  stop_reason=%d overflow=%d", (int)dp.decodeStopReason, (int)dp.overflow);
    if (r != CUPTI_SUCCESS) {
      PADD(pm, st_dropped, 1);
      return;
    }
    if (dp.overflow) PADD(pm, st_overflows, 1);
    uint64_t filtered = 0;
    uint32_t next = s->emitted;
    pm->cols.n = 0;
    int rc = decode_range(c, s->obj, s->host, s->image, s->image_size, s->metrics, s->nmetrics,
                          pm->clock_offset_ns, lo, hi, s->emitted, &pm->cols, &filtered, &next);
    cm__pm_trace("  device %d round %d: samples %u..%u read, %llu filtered, rc %d", device, round,
                 s->emitted, next, (unsigned long long)filtered, rc);
    if (filtered) PADD(pm, st_filtered, filtered);
    if (rc) PADD(pm, st_dropped, next > s->emitted ? next - s->emitted : 1);
    else pend(pm, device, s);
    s->emitted = next;
    /* As NVIDIA's sample and XLA do, the image is initialized afresh once its completed samples
     * are read, so each decode starts on an empty image rather than appending to one that holds
     * samples already. */
    bool full = dp.decodeStopReason == CUPTI_PM_SAMPLING_DECODE_STOP_REASON_COUNTER_DATA_FULL;
    if ((full || s->emitted) && init_image(c, s)) return;
    if (!full) break;
  }
}

static void stop_session(cm__pm *pm, int device) {
  session *s = &pm->dev[device];
  if (!s->on) return;
  if (s->ctx_gone || device_ctx(pm->c, device) == 0) {
    /* The device's context is gone, and the sampling object's buffer with it: no CUPTI call
     * touches the object any more (it is left). The host object is host memory and is freed. */
    cm__pm_trace("stop: device %d has no context any more; its sampling object is left", device);
    if (!s->ctx_gone) PADD(pm, st_dropped, 1);
    s->obj = NULL;
    release(pm->c, s);
    return;
  }
  CUpti_PmSampling_Stop_Params st = {.structSize = CUpti_PmSampling_Stop_Params_STRUCT_SIZE,
                                     .pPmSamplingObject = s->obj};
  int r;
  PM_CALL(r, "cuptiPmSamplingStop", pm->c->PmStop, st, "obj=%p", (void *)s->obj);
  (void)r;
  poll_session(pm, device);
  release(pm->c, s);
}

/* The union of the metrics of `device`'s consumers, skipping consumer index `skip`, plus the
 * `extra` ones; the shortest interval. Returns the count. mu held. */
static uint32_t union_for(const cm__pm *pm, int device, uint32_t skip, const char **extra,
                          uint32_t nextra, uint32_t extra_interval, const char **out,
                          uint32_t *interval) {
  uint32_t n = 0;
  *interval = extra_interval;
  for (uint32_t i = 0; i <= pm->ncons; i++) {
    const char **m;
    uint32_t nm;
    if (i < pm->ncons) {
      if (i == skip || pm->cons[i].device != device) continue;
      m = pm->cons[i].metrics;
      nm = pm->cons[i].nmetrics;
      if (!*interval || pm->cons[i].interval_us < *interval) *interval = pm->cons[i].interval_us;
    } else {
      m = extra;
      nm = nextra;
    }
    for (uint32_t j = 0; j < nm; j++) {
      bool seen = false;
      for (uint32_t k = 0; k < n && !seen; k++) seen = out[k] == m[j]; /* names are deduplicated */
      if (!seen && n < PM_MAX_METRICS) out[n++] = m[j];
    }
  }
  return n;
}

static bool same_set(const session *s, const char **m, uint32_t n, uint32_t interval) {
  if (!s->on || s->nmetrics != n || s->interval_us != interval) return false;
  for (uint32_t i = 0; i < n; i++) {
    bool found = false;
    for (uint32_t j = 0; j < n && !found; j++) found = s->metrics[j] == m[i];
    if (!found) return false;
  }
  return true;
}

/* Moves `device`'s session to the metrics `m` at `interval`: nothing when unchanged, a stop when
 * empty, else a restart. When the new session cannot start, the old one is restarted when
 * `old` allows (so a refused consumer leaves the others sampling) and the error is returned. */
static int reconcile(cm__pm *pm, int device, const char **m, uint32_t n, uint32_t interval,
                     uint32_t poll_ms) {
  session *s = &pm->dev[device];
  if (same_set(s, m, n, interval)) return 0;
  const char *old[PM_MAX_METRICS];
  uint32_t nold = s->on ? s->nmetrics : 0, old_interval = s->interval_us;
  if (nold) memcpy(old, s->metrics, nold * sizeof *old);
  stop_session(pm, device);
  if (!n) return 0;
  int rc = start_session(pm, device, m, n, interval, poll_ms);
  if (rc && nold) {
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", cm_errmsg());
    start_session(pm, device, old, nold, old_interval, poll_ms);
    cm__seterr(rc, "%s", msg);
  }
  return rc;
}

/* ---- the module ------------------------------------------------------------------------------ */

int cm__pm_new(cm__pm **out, const cm__cupti *c, int64_t clock_offset_ns) {
  cm__pm *pm = calloc(1, sizeof *pm);
  if (!pm) return cm__seterr(CM_ENOMEM, "no memory for PM sampling");
  pm->c = c;
  pm->clock_offset_ns = clock_offset_ns;
  pm->next_id = 1;
  pthread_mutex_init(&pm->mu, NULL);
  *out = pm;
  return 0;
}

void cm__pm_free(cm__pm *pm) {
  if (!pm) return;
  pthread_mutex_lock(&pm->mu);
  for (int d = 0; d < PM_MAX_DEVICES; d++) stop_session(pm, d);
  pthread_mutex_unlock(&pm->mu);
  for (uint32_t i = 0; i < pm->ncons; i++) free(pm->cons[i].metrics);
  for (uint32_t i = 0; i < pm->nnames; i++) free(pm->names[i]);
  free(pm->names);
  free(pm->cons);
  free(pm->pending);
  cm__pm_columns_free(&pm->cols);
  pthread_mutex_destroy(&pm->mu);
  free(pm);
}

int cm__pm_add(cm__pm *pm, int device, const char *const *metrics, uint32_t nmetrics,
               uint32_t interval_us, uint32_t poll_ms, uint32_t *id) {
  if (pm->c->pm_missing)
    return cm__seterr(CM_ENOSYS,
                      "this libcupti (%s) has no PM sampling: %s is missing. PM sampling needs "
                      "CUPTI 12.6 or newer (set CUPTIMON_LIBCUPTI to such a libcupti.so)",
                      pm->c->path, pm->c->pm_missing);
  if (device < 0 || device >= PM_MAX_DEVICES)
    return cm__seterr(CM_EINVAL, "device %d is out of range (0..%d)", device, PM_MAX_DEVICES - 1);
  if (!metrics || !nmetrics || nmetrics > PM_MAX_METRICS)
    return cm__seterr(CM_EINVAL, "a PM sampling consumer names 1 to %d metrics, not %u",
                      PM_MAX_METRICS, nmetrics);
  if (interval_us < PM_MIN_INTERVAL_US)
    return cm__seterr(CM_EINVAL, "interval_us %u is below the minimum of %d", interval_us,
                      PM_MIN_INTERVAL_US);
  for (uint32_t i = 0; i < nmetrics; i++)
    if (!metrics[i] || !*metrics[i] || strlen(metrics[i]) > 256)
      return cm__seterr(CM_EINVAL, "metric %u is empty or longer than 256 bytes", i + 1);
  pthread_mutex_lock(&pm->mu);
  int rc = 0;
  const char **mine = malloc(nmetrics * sizeof *mine);
  consumer *cons = pm->cons;
  if (pm->ncons == pm->cap_cons) {
    uint32_t cap = pm->cap_cons ? pm->cap_cons * 2 : 8;
    cons = realloc(pm->cons, cap * sizeof *cons);
    if (cons) {
      pm->cons = cons;
      pm->cap_cons = cap;
    }
  }
  if (!mine || !cons) {
    rc = cm__seterr(CM_ENOMEM, "no memory for a PM sampling consumer");
    goto out;
  }
  uint32_t n = 0;
  for (uint32_t i = 0; i < nmetrics; i++) {
    const char *k = keep_name(pm, metrics[i]);
    if (!k) {
      rc = cm__seterr(CM_ENOMEM, "no memory for a metric name");
      goto out;
    }
    bool dup = false;
    for (uint32_t j = 0; j < n && !dup; j++) dup = mine[j] == k;
    if (!dup) mine[n++] = k;
  }
  const char *u[PM_MAX_METRICS];
  uint32_t interval;
  uint32_t nu = union_for(pm, device, UINT32_MAX, mine, n, interval_us, u, &interval);
  if ((rc = reconcile(pm, device, u, nu, interval, poll_ms))) goto out;
  consumer *cn = &pm->cons[pm->ncons++];
  cn->id = pm->next_id++;
  cn->device = device;
  cn->interval_us = interval_us;
  cn->nmetrics = n;
  cn->metrics = mine;
  mine = NULL;
  atomic_store_explicit(&pm->st_consumers, pm->ncons, memory_order_relaxed);
  if (id) *id = cn->id;
out:
  free(mine);
  pthread_mutex_unlock(&pm->mu);
  return rc;
}

int cm__pm_remove(cm__pm *pm, uint32_t id, uint32_t poll_ms) {
  pthread_mutex_lock(&pm->mu);
  uint32_t i = 0;
  while (i < pm->ncons && pm->cons[i].id != id) i++;
  if (i == pm->ncons) {
    pthread_mutex_unlock(&pm->mu);
    return cm__seterr(CM_ENOENT, "no PM sampling consumer %u", id);
  }
  int device = pm->cons[i].device;
  const char *u[PM_MAX_METRICS];
  uint32_t interval;
  uint32_t nu = union_for(pm, device, i, NULL, 0, 0, u, &interval);
  /* The consumer goes whatever happens to the restart: its removal must not fail. */
  int rc = reconcile(pm, device, u, nu, interval, poll_ms);
  free(pm->cons[i].metrics);
  memmove(&pm->cons[i], &pm->cons[i + 1], (pm->ncons - i - 1) * sizeof *pm->cons);
  pm->ncons--;
  atomic_store_explicit(&pm->st_consumers, pm->ncons, memory_order_relaxed);
  pthread_mutex_unlock(&pm->mu);
  return rc;
}

void cm__pm_drain(cm__pm *pm, cm__decoder *dec) {
  pthread_mutex_lock(&pm->mu);
  for (int d = 0; d < PM_MAX_DEVICES; d++) poll_session(pm, d);
  if (pm->npending)
    cm__decoder_inject(dec, CM_KIND_PM_SAMPLE, (const uint8_t *)pm->pending, pm->npending,
                       sizeof *pm->pending);
  pm->npending = 0;
  pthread_mutex_unlock(&pm->mu);
}

void cm__pm_stats(cm__pm *pm, cm_pm_stats *out) {
  memset(out, 0, sizeof *out);
#define PLOAD(f) atomic_load_explicit(&pm->f, memory_order_relaxed)
  out->consumers = PLOAD(st_consumers);
  out->sessions = PLOAD(st_sessions);
  out->polls = PLOAD(st_polls);
  out->samples = PLOAD(st_samples);
  out->filtered = PLOAD(st_filtered);
  out->overflows = PLOAD(st_overflows);
  out->dropped = PLOAD(st_dropped);
#undef PLOAD
}
