/*
 * fake_pm.c: the PM sampling and profiler host entry points of the fake CUPTI.
 *
 * Model. A device has a "hardware buffer": a bounded queue of samples that the test emits with
 * fake_pm_emit (each with its own timestamps, so a test can emit one from another clock domain).
 * cuptiPmSamplingDecodeData moves samples from it into the counter data image until the image is
 * full (stop reason COUNTER_DATA_FULL) or the queue is empty (END_OF_RECORDS). The image is a
 * header and an array of samples; each sample stores its number, and
 * cuptiProfilerHostEvaluateToGpuValues computes the value of a metric from the metric's name and
 * that number (fake_pm_value), so a test knows what to expect. The metrics the fake knows are
 * listed in fake_pm_metrics; "fake__two_pass.sum" needs two passes. Host objects and sampling
 * objects are counted, and releasing one twice is counted as a double release (which real CUPTI
 * punishes with a crash). FAKE_PM_DENIED=1 in the environment refuses every cuptiPmSamplingEnable
 * with CUPTI_ERROR_INSUFFICIENT_PRIVILEGES, for a process the test does not drive (an app under
 * the agent). FAKE_PM_NOT_READY=N (or fake_pm_set_not_ready) makes the next N enables fail with
 * CUPTI_ERROR_NOT_READY, as a device still being initialized does.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cupti.h>
#include <cupti_pmsampling.h>
#include <cupti_profiler_target.h>
#include <cupti_target.h>

#include "cm_profiler_host.h"
#include "fake_cupti.h"

#define FAKE_EXPORT __attribute__((visibility("default")))
#define FAKE_PM_DEVICES 8
#define FAKE_PM_QUEUE 4096
#define FAKE_PM_METRICS 16
#define FAKE_PM_MAGIC 0x504d494du

static const char *const known[] = {
    "sm__cycles_active.avg",
    "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gr__cycles_active.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum.per_second",
    "pcie__read_bytes.sum.per_second",
    "pcie__write_bytes.sum.per_second",
    "fake__two_pass.sum",
};
#define NKNOWN (sizeof known / sizeof known[0])

typedef struct fsample {
  uint64_t seq, start, stop;
} fsample;

/* An input CUPTI may keep a pointer to, as the real one may: the pointer and a copy of the first
 * bytes it pointed at, compared again by later calls (kept_same), so a caller that freed or
 * reused it while the object lives is caught (glibc's free writes into a freed block's start). */
#define KEPT_BYTES 64
typedef struct kept_input {
  const void *p;
  size_t n;
  unsigned char copy[KEPT_BYTES];
} kept_input;

static void keep(kept_input *k, const void *p, size_t n) {
  k->p = p;
  k->n = p ? (n < KEPT_BYTES ? n : KEPT_BYTES) : 0;
  if (k->n) memcpy(k->copy, p, k->n);
}

static int kept_same(const kept_input *k) { return !k->n || !memcmp(k->copy, k->p, k->n); }

struct CUpti_Profiler_Host_Object {
  struct CUpti_Profiler_Host_Object *next_released; /* the list of released objects */
  int alive;
  int nmetrics;
  int metrics[FAKE_PM_METRICS]; /* indices into known[] */
  kept_input avail, names; /* pCounterAvailabilityImage, the last ppMetricNames array */
};

static struct CUpti_Profiler_Host_Object *g_released_hosts; /* guarded by mu */

struct CUpti_PmSampling_Object {
  struct CUpti_PmSampling_Object *next_released; /* the list of released objects */
  int alive;
  int device;
  int configured, started;
  kept_input config; /* pConfig */
};
static struct CUpti_PmSampling_Object *g_released_pm; /* guarded by mu */

typedef struct image_header {
  uint32_t magic, max_samples;
  uint32_t populated, completed;
  fsample samples[];
} image_header;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  fsample q[FAKE_PM_QUEUE];
  size_t head, n;
  uint64_t next_seq;
  int overflow;
  struct CUpti_PmSampling_Object *obj; /* the enabled object, or NULL */
} dev[FAKE_PM_DEVICES];
static int denied, not_ready, profiler_init_calls, profiler_deinit_calls;
static fake_pm_stats st;

static int metric_index(const char *name) {
  for (size_t i = 0; name && i < NKNOWN; i++)
    if (!strcmp(known[i], name)) return (int)i;
  return -1;
}

double fake_pm_value(const char *metric, uint64_t seq) {
  int i = metric_index(metric);
  return i < 0 ? -1.0 : 10.0 * i + (double)(seq % 7) + 0.5;
}

const char *const *fake_pm_metrics(int *n) {
  *n = (int)NKNOWN;
  return known;
}

void fake_pm_set_not_ready(int n) {
  pthread_mutex_lock(&mu);
  not_ready = n;
  pthread_mutex_unlock(&mu);
}

void fake_pm_set_denied(int on) {
  pthread_mutex_lock(&mu);
  denied = on;
  pthread_mutex_unlock(&mu);
}

int fake_pm_emit(int device, uint32_t n, uint64_t start_ns, uint64_t dt_ns) {
  if (device < 0 || device >= FAKE_PM_DEVICES) return -1;
  pthread_mutex_lock(&mu);
  int kept = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (dev[device].n == FAKE_PM_QUEUE) {
      dev[device].overflow = 1; /* KEEP_OLDEST: the newest are lost */
      st.samples_lost++;
      continue;
    }
    fsample *s = &dev[device].q[(dev[device].head + dev[device].n++) % FAKE_PM_QUEUE];
    s->seq = dev[device].next_seq++;
    s->start = start_ns + i * dt_ns;
    s->stop = s->start + dt_ns;
    kept++;
  }
  pthread_mutex_unlock(&mu);
  return kept;
}

int fake_emit_kernel(const char *name, uint32_t device, uint64_t start, uint64_t end) {
  CUpti_ActivityKernel10 k;
  memset(&k, 0, sizeof k);
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.name = name;
  k.deviceId = device;
  k.start = start;
  k.end = end;
  k.streamId = 7;
  k.correlationId = (uint32_t)(start & 0xffffff);
  return fake_emit(&k, sizeof k, 0);
}

void fake_pm_get_stats(fake_pm_stats *out) {
  pthread_mutex_lock(&mu);
  *out = st;
  out->profiler_initialize_calls = (uint64_t)profiler_init_calls;
  out->profiler_deinitialize_calls = (uint64_t)profiler_deinit_calls;
  pthread_mutex_unlock(&mu);
}

/* ---- the entry points ---------------------------------------------------------------------- */

FAKE_EXPORT CUptiResult CUPTIAPI cuptiProfilerInitialize(CUpti_Profiler_Initialize_Params *p) {
  if (!p) return CUPTI_ERROR_INVALID_PARAMETER;
  pthread_mutex_lock(&mu);
  profiler_init_calls++;
  pthread_mutex_unlock(&mu);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiProfilerDeInitialize(CUpti_Profiler_DeInitialize_Params *p) {
  (void)p;
  pthread_mutex_lock(&mu);
  profiler_deinit_calls++;
  pthread_mutex_unlock(&mu);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiDeviceGetChipName(CUpti_Device_GetChipName_Params *p) {
  if (!p || p->deviceIndex >= FAKE_PM_DEVICES) return CUPTI_ERROR_INVALID_DEVICE;
  p->pChipName = "FAKE100";
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI
cuptiPmSamplingGetCounterAvailability(CUpti_PmSampling_GetCounterAvailability_Params *p) {
  if (!p || p->deviceIndex >= FAKE_PM_DEVICES) return CUPTI_ERROR_INVALID_DEVICE;
  if (!p->pCounterAvailabilityImage) {
    p->counterAvailabilityImageSize = 64;
    return CUPTI_SUCCESS;
  }
  if (p->counterAvailabilityImageSize < 64) return CUPTI_ERROR_INVALID_PARAMETER;
  memset(p->pCounterAvailabilityImage, 0xA5, 64);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiProfilerHostInitialize(CUpti_Profiler_Host_Initialize_Params *p) {
  if (!p || p->profilerType != CUPTI_PROFILER_TYPE_PM_SAMPLING || !p->pChipName)
    return CUPTI_ERROR_INVALID_PARAMETER;
  struct CUpti_Profiler_Host_Object *h = calloc(1, sizeof *h);
  if (!h) return CUPTI_ERROR_OUT_OF_MEMORY;
  h->alive = 1;
  keep(&h->avail, p->pCounterAvailabilityImage, 64);
  p->pHostObject = h;
  pthread_mutex_lock(&mu);
  st.host_inits++;
  pthread_mutex_unlock(&mu);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiProfilerHostDeinitialize(CUpti_Profiler_Host_Deinitialize_Params *p) {
  if (!p || !p->pHostObject) return CUPTI_ERROR_INVALID_PARAMETER;
  pthread_mutex_lock(&mu);
  if (!p->pHostObject->alive) {
    st.double_releases++;
    pthread_mutex_unlock(&mu);
    return CUPTI_ERROR_INVALID_OPERATION;
  }
  /* A released object is kept, on a list that keeps it reachable (so leak checkers stay quiet),
   * so that a second release is detected instead of crashing. */
  p->pHostObject->alive = 0;
  p->pHostObject->next_released = g_released_hosts;
  g_released_hosts = p->pHostObject;
  st.host_deinits++;
  pthread_mutex_unlock(&mu);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI
cuptiProfilerHostConfigAddMetrics(CUpti_Profiler_Host_ConfigAddMetrics_Params *p) {
  if (!p || !p->pHostObject || !p->pHostObject->alive) return CUPTI_ERROR_INVALID_PARAMETER;
  struct CUpti_Profiler_Host_Object *h = p->pHostObject;
  for (size_t i = 0; i < p->numMetrics; i++)
    if (metric_index(p->ppMetricNames[i]) < 0) return CUPTI_ERROR_INVALID_METRIC_NAME;
  if (h->nmetrics + p->numMetrics > FAKE_PM_METRICS) return CUPTI_ERROR_INVALID_PARAMETER;
  for (size_t i = 0; i < p->numMetrics; i++) h->metrics[h->nmetrics++] = metric_index(p->ppMetricNames[i]);
  keep(&h->names, p->ppMetricNames, p->numMetrics * sizeof *p->ppMetricNames);
  return CUPTI_SUCCESS;
}

/* Metric discovery: a base metric is a known name up to its first '.'; its sub-metrics are the
 * rest of the known names that share it. Every base is a counter. The arrays live in the host
 * object, as CUPTI's do. */
static size_t base_len(const char *name) { return strcspn(name, "."); }

FAKE_EXPORT CUptiResult CUPTIAPI
cuptiProfilerHostGetMetricProperties(CUpti_Profiler_Host_GetMetricProperties_Params *p) {
  if (!p || !p->pHostObject || !p->pMetricName) return CUPTI_ERROR_INVALID_PARAMETER;
  for (size_t i = 0; i < NKNOWN; i++)
    if (base_len(known[i]) == strlen(p->pMetricName) &&
        !strncmp(known[i], p->pMetricName, base_len(known[i]))) {
      p->pDescription = "a fake metric";
      p->pHwUnit = "fake";
      p->pDimUnit = "";
      p->metricType = CUPTI_METRIC_TYPE_COUNTER;
      return CUPTI_SUCCESS;
    }
  return CUPTI_ERROR_INVALID_METRIC_NAME;
}

FAKE_EXPORT CUptiResult CUPTIAPI
cuptiProfilerHostGetSubMetrics(CUpti_Profiler_Host_GetSubMetrics_Params *p) {
  static const char *subs[NKNOWN];
  if (!p || !p->pHostObject || !p->pMetricName) return CUPTI_ERROR_INVALID_PARAMETER;
  size_t n = 0, bl = strlen(p->pMetricName);
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < NKNOWN; i++)
    if (base_len(known[i]) == bl && !strncmp(known[i], p->pMetricName, bl)) subs[n++] = known[i] + bl;
  pthread_mutex_unlock(&mu);
  p->numOfSubmetrics = n;
  p->ppSubMetrics = subs;
  return n ? CUPTI_SUCCESS : CUPTI_ERROR_INVALID_METRIC_NAME;
}

FAKE_EXPORT CUptiResult CUPTIAPI
cuptiProfilerHostGetBaseMetrics(CUpti_Profiler_Host_GetBaseMetrics_Params *p) {
  static char bases[NKNOWN][96];
  static const char *list[NKNOWN];
  if (!p || !p->pHostObject) return CUPTI_ERROR_INVALID_PARAMETER;
  size_t n = 0;
  if (p->metricType == CUPTI_METRIC_TYPE_COUNTER) {
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < NKNOWN; i++) {
      size_t bl = base_len(known[i]);
      int seen = 0;
      for (size_t j = 0; j < n; j++) seen |= strlen(list[j]) == bl && !strncmp(list[j], known[i], bl);
      if (seen || bl >= sizeof bases[0]) continue;
      memcpy(bases[n], known[i], bl);
      bases[n][bl] = 0;
      list[n] = bases[n];
      n++;
    }
    pthread_mutex_unlock(&mu);
  }
  p->ppMetricNames = list;
  p->numMetrics = n;
  return CUPTI_SUCCESS;
}

/* The config image: the host's metric indices. */
FAKE_EXPORT CUptiResult CUPTIAPI
cuptiProfilerHostGetConfigImageSize(CUpti_Profiler_Host_GetConfigImageSize_Params *p) {
  if (!p || !p->pHostObject || !p->pHostObject->alive) return CUPTI_ERROR_INVALID_PARAMETER;
  p->configImageSize = sizeof(int) * (1 + (size_t)p->pHostObject->nmetrics);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiProfilerHostGetConfigImage(CUpti_Profiler_Host_GetConfigImage_Params *p) {
  if (!p || !p->pHostObject || !p->pHostObject->alive || !p->pConfigImage) return CUPTI_ERROR_INVALID_PARAMETER;
  size_t need = sizeof(int) * (1 + (size_t)p->pHostObject->nmetrics);
  if (p->configImageSize < need) return CUPTI_ERROR_INVALID_PARAMETER;
  memcpy(p->pConfigImage, &p->pHostObject->nmetrics, sizeof(int));
  memcpy(p->pConfigImage + sizeof(int), p->pHostObject->metrics, need - sizeof(int));
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiProfilerHostGetNumOfPasses(CUpti_Profiler_Host_GetNumOfPasses_Params *p) {
  if (!p || !p->pConfigImage || p->configImageSize < sizeof(int)) return CUPTI_ERROR_INVALID_PARAMETER;
  int n;
  memcpy(&n, p->pConfigImage, sizeof n);
  p->numOfPasses = 1;
  for (int i = 0; i < n; i++) {
    int m;
    memcpy(&m, p->pConfigImage + sizeof(int) * (1 + (size_t)i), sizeof m);
    if (m == metric_index("fake__two_pass.sum")) p->numOfPasses = 2;
  }
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiPmSamplingEnable(CUpti_PmSampling_Enable_Params *p) {
  if (!p || p->deviceIndex >= FAKE_PM_DEVICES) return CUPTI_ERROR_INVALID_DEVICE;
  const char *env = getenv("FAKE_PM_DENIED");
  static int env_not_ready = -1; /* FAKE_PM_NOT_READY, read once (under mu) */
  pthread_mutex_lock(&mu);
  if (env_not_ready < 0) {
    const char *nr = getenv("FAKE_PM_NOT_READY");
    env_not_ready = nr ? atoi(nr) : 0;
    not_ready += env_not_ready;
  }
  if (denied || (env && *env == '1')) {
    pthread_mutex_unlock(&mu);
    return CUPTI_ERROR_INSUFFICIENT_PRIVILEGES;
  }
  if (not_ready > 0) {
    not_ready--;
    pthread_mutex_unlock(&mu);
    return CUPTI_ERROR_NOT_READY;
  }
  if (dev[p->deviceIndex].obj) {
    pthread_mutex_unlock(&mu);
    return CUPTI_ERROR_INVALID_OPERATION;
  }
  struct CUpti_PmSampling_Object *o = calloc(1, sizeof *o);
  if (!o) {
    pthread_mutex_unlock(&mu);
    return CUPTI_ERROR_OUT_OF_MEMORY;
  }
  o->alive = 1;
  o->device = (int)p->deviceIndex;
  dev[p->deviceIndex].obj = o;
  st.enables++;
  pthread_mutex_unlock(&mu);
  p->pPmSamplingObject = o;
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiPmSamplingDisable(CUpti_PmSampling_Disable_Params *p) {
  if (!p || !p->pPmSamplingObject) return CUPTI_ERROR_INVALID_PARAMETER;
  pthread_mutex_lock(&mu);
  struct CUpti_PmSampling_Object *o = p->pPmSamplingObject;
  if (!o->alive) {
    st.double_releases++;
    pthread_mutex_unlock(&mu);
    return CUPTI_ERROR_INVALID_OPERATION;
  }
  o->alive = 0;
  o->next_released = g_released_pm; /* kept reachable, as released host objects are */
  g_released_pm = o;
  dev[o->device].obj = NULL;
  st.disables++;
  pthread_mutex_unlock(&mu);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiPmSamplingSetConfig(CUpti_PmSampling_SetConfig_Params *p) {
  if (!p || !p->pPmSamplingObject || !p->pPmSamplingObject->alive || !p->pConfig ||
      !p->hardwareBufferSize || !p->samplingInterval)
    return CUPTI_ERROR_INVALID_PARAMETER;
  pthread_mutex_lock(&mu);
  p->pPmSamplingObject->configured = 1;
  keep(&p->pPmSamplingObject->config, p->pConfig, p->configSize);
  st.last_interval = p->samplingInterval;
  st.last_hw_buffer = p->hardwareBufferSize;
  st.last_trigger_mode = (uint32_t)p->triggerMode;
  pthread_mutex_unlock(&mu);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiPmSamplingStart(CUpti_PmSampling_Start_Params *p) {
  if (!p || !p->pPmSamplingObject || !p->pPmSamplingObject->configured) return CUPTI_ERROR_INVALID_OPERATION;
  pthread_mutex_lock(&mu);
  p->pPmSamplingObject->started = 1;
  st.starts++;
  pthread_mutex_unlock(&mu);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiPmSamplingStop(CUpti_PmSampling_Stop_Params *p) {
  if (!p || !p->pPmSamplingObject || !p->pPmSamplingObject->started) return CUPTI_ERROR_INVALID_OPERATION;
  pthread_mutex_lock(&mu);
  p->pPmSamplingObject->started = 0;
  st.stops++;
  pthread_mutex_unlock(&mu);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiPmSamplingGetCounterDataSize(CUpti_PmSampling_GetCounterDataSize_Params *p) {
  if (!p || !p->pPmSamplingObject || !p->maxSamples || !p->numMetrics) return CUPTI_ERROR_INVALID_PARAMETER;
  p->counterDataSize = sizeof(image_header) + (size_t)p->maxSamples * sizeof(fsample);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI
cuptiPmSamplingCounterDataImageInitialize(CUpti_PmSampling_CounterDataImage_Initialize_Params *p) {
  if (!p || !p->pCounterData || p->counterDataSize < sizeof(image_header) + sizeof(fsample))
    return CUPTI_ERROR_INVALID_PARAMETER;
  image_header *h = (image_header *)p->pCounterData;
  h->magic = FAKE_PM_MAGIC;
  h->max_samples = (uint32_t)((p->counterDataSize - sizeof(image_header)) / sizeof(fsample));
  h->populated = h->completed = 0;
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiPmSamplingDecodeData(CUpti_PmSampling_DecodeData_Params *p) {
  if (!p || !p->pPmSamplingObject || !p->pPmSamplingObject->alive || !p->pCounterDataImage)
    return CUPTI_ERROR_INVALID_PARAMETER;
  image_header *h = (image_header *)p->pCounterDataImage;
  if (h->magic != FAKE_PM_MAGIC) return CUPTI_ERROR_INVALID_PARAMETER;
  pthread_mutex_lock(&mu);
  if (!kept_same(&p->pPmSamplingObject->config)) st.stale_inputs++;
  int d = p->pPmSamplingObject->device;
  while (dev[d].n && h->populated < h->max_samples) {
    h->samples[h->populated++] = dev[d].q[dev[d].head];
    dev[d].head = (dev[d].head + 1) % FAKE_PM_QUEUE;
    dev[d].n--;
  }
  h->completed = h->populated;
  p->decodeStopReason = dev[d].n ? CUPTI_PM_SAMPLING_DECODE_STOP_REASON_COUNTER_DATA_FULL
                                 : CUPTI_PM_SAMPLING_DECODE_STOP_REASON_END_OF_RECORDS;
  p->overflow = (uint8_t)dev[d].overflow;
  dev[d].overflow = 0;
  st.decodes++;
  pthread_mutex_unlock(&mu);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiPmSamplingGetCounterDataInfo(CUpti_PmSampling_GetCounterDataInfo_Params *p) {
  if (!p || !p->pCounterDataImage) return CUPTI_ERROR_INVALID_PARAMETER;
  const image_header *h = (const image_header *)p->pCounterDataImage;
  if (h->magic != FAKE_PM_MAGIC) return CUPTI_ERROR_INVALID_PARAMETER;
  p->numTotalSamples = h->max_samples;
  p->numPopulatedSamples = h->populated;
  p->numCompletedSamples = h->completed;
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI
cuptiPmSamplingCounterDataGetSampleInfo(CUpti_PmSampling_CounterData_GetSampleInfo_Params *p) {
  if (!p || !p->pCounterDataImage) return CUPTI_ERROR_INVALID_PARAMETER;
  const image_header *h = (const image_header *)p->pCounterDataImage;
  if (h->magic != FAKE_PM_MAGIC || p->sampleIndex >= h->completed) return CUPTI_ERROR_INVALID_PARAMETER;
  p->startTimestamp = h->samples[p->sampleIndex].start;
  p->endTimestamp = h->samples[p->sampleIndex].stop;
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI
cuptiProfilerHostEvaluateToGpuValues(CUpti_Profiler_Host_EvaluateToGpuValues_Params *p) {
  if (!p || !p->pHostObject || !p->pHostObject->alive || !p->pCounterDataImage || !p->pMetricValues)
    return CUPTI_ERROR_INVALID_PARAMETER;
  const image_header *h = (const image_header *)p->pCounterDataImage;
  if (h->magic != FAKE_PM_MAGIC || p->rangeIndex >= h->completed) return CUPTI_ERROR_INVALID_PARAMETER;
  if (!kept_same(&p->pHostObject->avail) || !kept_same(&p->pHostObject->names)) {
    pthread_mutex_lock(&mu);
    st.stale_inputs++;
    pthread_mutex_unlock(&mu);
  }
  for (size_t i = 0; i < p->numMetrics; i++) {
    int m = metric_index(p->ppMetricNames[i]), found = 0;
    for (int j = 0; j < p->pHostObject->nmetrics; j++) found |= p->pHostObject->metrics[j] == m;
    if (!found) return CUPTI_ERROR_INVALID_METRIC_NAME;
    p->pMetricValues[i] = fake_pm_value(p->ppMetricNames[i], h->samples[p->rangeIndex].seq);
  }
  return CUPTI_SUCCESS;
}
