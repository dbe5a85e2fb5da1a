/*
 * cupti.c: the run-time binding of libcupti (and of the few libcuda calls the fence needs).
 *
 * Nothing links against libcupti: the engine dlopens it, so one binary runs with the toolkit's
 * copy, a framework's bundled copy (PyTorch ships its own libcupti.so.13), or the test double.
 * The search order tries the bare soname first, so that a copy the process already loaded is
 * shared rather than loaded twice: two copies would be two CUPTIs, each seeing half the process.
 * The library is never unloaded. cuptiFinalize is called only by cm_cupti_detach (subscription.c),
 * which CUPTI documents for detaching from a running process; a later subscription initializes
 * CUPTI again. Whether a detach gives back what CUPTI costs once it has traced is what
 * spec/gpu/reattach.sh measures.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_internal.h"

static void *try_open(const char *path, char *tried, size_t tried_len) {
  size_t used = strlen(tried);
  if (used + strlen(path) + 4 < tried_len) {
    if (used) strcat(tried, ", ");
    strcat(tried, path);
  }
  return dlopen(path, RTLD_NOW | RTLD_GLOBAL);
}

static void *open_cupti(char *path_out, size_t path_len, char *tried, size_t tried_len) {
  char buf[480];
  void *h = NULL;
  const char *env = getenv("CUPTIMON_LIBCUPTI");
  /* An explicit CUPTIMON_LIBCUPTI wins over an already-loaded soname only when nothing in the
   * process holds CUPTI yet: RTLD_NOLOAD tells whether the soname is resident. */
  void *resident = dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD);
  if (resident) {
    snprintf(path_out, path_len, "libcupti.so.13 (already loaded)");
    return resident;
  }
  if (env && *env) {
    h = try_open(env, tried, tried_len);
    if (h) {
      snprintf(path_out, path_len, "%s", env);
      return h;
    }
  }
  h = try_open("libcupti.so.13", tried, tried_len);
  if (h) {
    snprintf(path_out, path_len, "libcupti.so.13");
    return h;
  }
  const char *roots[2] = {getenv("CUDA_HOME"), "/usr/local/cuda"};
  for (int i = 0; i < 2; i++) {
    if (!roots[i] || !*roots[i]) continue;
    static const char *subdirs[] = {"lib64", "lib", "extras/CUPTI/lib64",
                                    "targets/x86_64-linux/lib"};
    for (size_t j = 0; j < sizeof subdirs / sizeof subdirs[0]; j++) {
      snprintf(buf, sizeof buf, "%s/%s/libcupti.so.13", roots[i], subdirs[j]);
      h = try_open(buf, tried, tried_len);
      if (h) {
        snprintf(path_out, path_len, "%s", buf);
        return h;
      }
    }
  }
  return NULL;
}

#define BIND(lib, field, sym)                                                               \
  do {                                                                                      \
    *(void **)(&c->field) = dlsym(lib, sym);                                                \
    if (!c->field)                                                                          \
      return cm__seterr(CM_ENOCUPTI,                                                        \
                        "symbol %s not found in %s: this libcupti is too old or not CUPTI " \
                        "(cuptimon needs CUPTI 13.0 or newer; set CUPTIMON_LIBCUPTI to a "  \
                        "libcupti.so.13)",                                                  \
                        sym, c->path);                                                      \
  } while (0)

#define BIND_OPT(lib, field, sym) (*(void **)(&c->field) = dlsym(lib, sym))

int cm__cupti_load(cm__cupti *c) {
  char tried[2048] = "";
  memset(c, 0, sizeof *c);
  c->lib = open_cupti(c->path, sizeof c->path, tried, sizeof tried);
  if (!c->lib)
    return cm__seterr(CM_ENOCUPTI,
                      "libcupti not found (tried %s; last error: %s). Install the CUDA Toolkit's "
                      "CUPTI, or set CUPTIMON_LIBCUPTI=/path/to/libcupti.so.13 or CUDA_HOME",
                      tried, dlerror());
  BIND(c->lib, GetVersion, "cuptiGetVersion");
  BIND(c->lib, GetResultString, "cuptiGetResultString");
  BIND(c->lib, Subscribe, "cuptiSubscribe");
  BIND_OPT(c->lib, Subscribe_v2, "cuptiSubscribe_v2");
  BIND(c->lib, Unsubscribe, "cuptiUnsubscribe");
  BIND(c->lib, EnableCallback, "cuptiEnableCallback");
  BIND(c->lib, EnableDomain, "cuptiEnableDomain");
  BIND(c->lib, ActivityRegisterCallbacks, "cuptiActivityRegisterCallbacks");
  BIND_OPT(c->lib, ActivitySetAttribute, "cuptiActivitySetAttribute");
  BIND(c->lib, ActivityEnable, "cuptiActivityEnable");
  BIND(c->lib, ActivityDisable, "cuptiActivityDisable");
  BIND(c->lib, ActivityGetNextRecord, "cuptiActivityGetNextRecord");
  BIND(c->lib, ActivityFlushAll, "cuptiActivityFlushAll");
  BIND(c->lib, ActivityGetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords");
  BIND(c->lib, ActivityEnableLatencyTimestamps, "cuptiActivityEnableLatencyTimestamps");
  BIND(c->lib, ActivityEnableCudaEventDeviceTimestamps,
       "cuptiActivityEnableCudaEventDeviceTimestamps");
  BIND(c->lib, ActivityRegisterTimestampCallback, "cuptiActivityRegisterTimestampCallback");
  BIND(c->lib, ActivityPushExternalCorrelationId, "cuptiActivityPushExternalCorrelationId");
  BIND(c->lib, ActivityPopExternalCorrelationId, "cuptiActivityPopExternalCorrelationId");
  BIND(c->lib, GetTimestamp, "cuptiGetTimestamp");
  /* Optional: without it cm_cupti_detach answers CM_ENOSYS. */
  BIND_OPT(c->lib, Finalize, "cuptiFinalize");

  /* PM sampling is optional: the rest of the engine works with a libcupti that lacks it. */
#define BIND_PM(field, sym) \
  if (!BIND_OPT(c->lib, field, sym) && !c->pm_missing) c->pm_missing = sym
  BIND_PM(ProfilerInitialize, "cuptiProfilerInitialize");
  BIND_PM(DeviceGetChipName, "cuptiDeviceGetChipName");
  BIND_PM(PmGetCounterAvailability, "cuptiPmSamplingGetCounterAvailability");
  BIND_PM(HostInitialize, "cuptiProfilerHostInitialize");
  BIND_PM(HostDeinitialize, "cuptiProfilerHostDeinitialize");
  BIND_PM(HostConfigAddMetrics, "cuptiProfilerHostConfigAddMetrics");
  BIND_PM(HostGetConfigImageSize, "cuptiProfilerHostGetConfigImageSize");
  BIND_PM(HostGetConfigImage, "cuptiProfilerHostGetConfigImage");
  BIND_PM(HostGetNumOfPasses, "cuptiProfilerHostGetNumOfPasses");
  BIND_PM(HostEvaluateToGpuValues, "cuptiProfilerHostEvaluateToGpuValues");
  BIND_PM(PmEnable, "cuptiPmSamplingEnable");
  BIND_PM(PmSetConfig, "cuptiPmSamplingSetConfig");
  BIND_PM(PmStart, "cuptiPmSamplingStart");
  BIND_PM(PmStop, "cuptiPmSamplingStop");
  BIND_PM(PmDisable, "cuptiPmSamplingDisable");
  BIND_PM(PmGetCounterDataSize, "cuptiPmSamplingGetCounterDataSize");
  BIND_PM(PmCounterDataImageInitialize, "cuptiPmSamplingCounterDataImageInitialize");
  BIND_PM(PmDecodeData, "cuptiPmSamplingDecodeData");
  BIND_PM(PmGetCounterDataInfo, "cuptiPmSamplingGetCounterDataInfo");
  BIND_PM(PmCounterDataGetSampleInfo, "cuptiPmSamplingCounterDataGetSampleInfo");
#undef BIND_PM
  BIND_OPT(c->lib, HostGetBaseMetrics, "cuptiProfilerHostGetBaseMetrics");
  BIND_OPT(c->lib, HostGetSubMetrics, "cuptiProfilerHostGetSubMetrics");
  BIND_OPT(c->lib, HostGetMetricProperties, "cuptiProfilerHostGetMetricProperties");

  /* libcuda is optional: without it the fence cannot synchronize the device and degrades to a
   * plain flush, which the engine reports. */
  const char *cuda_env = getenv("CUPTIMON_LIBCUDA");
  const char *cuda_name = (cuda_env && *cuda_env) ? cuda_env : "libcuda.so.1";
  c->cuda = dlopen(cuda_name, RTLD_NOW | RTLD_GLOBAL);
  if (c->cuda) {
    snprintf(c->cuda_path, sizeof c->cuda_path, "%s", cuda_name);
    BIND_OPT(c->cuda, cuCtxGetCurrent, "cuCtxGetCurrent");
    BIND_OPT(c->cuda, cuCtxSynchronize, "cuCtxSynchronize");
    BIND_OPT(c->cuda, cuDeviceGetCount, "cuDeviceGetCount");
    BIND_OPT(c->cuda, cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState");
    BIND_OPT(c->cuda, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    BIND_OPT(c->cuda, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    if (!c->cuDevicePrimaryCtxRelease)
      BIND_OPT(c->cuda, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
    BIND_OPT(c->cuda, cuCtxPushCurrent, "cuCtxPushCurrent_v2");
    if (!c->cuCtxPushCurrent) BIND_OPT(c->cuda, cuCtxPushCurrent, "cuCtxPushCurrent");
    BIND_OPT(c->cuda, cuCtxPopCurrent, "cuCtxPopCurrent_v2");
    if (!c->cuCtxPopCurrent) BIND_OPT(c->cuda, cuCtxPopCurrent, "cuCtxPopCurrent");
    /* CUDA 10.1 and newer; without it the fence's threads keep the default capture mode. */
    BIND_OPT(c->cuda, cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
    /* A driver call of the detaching thread's own, at whose API exit cuptiFinalize runs. */
    BIND_OPT(c->cuda, cuDriverGetVersion, "cuDriverGetVersion");
  }
  return 0;
}

int cm__cupti_err(const cm__cupti *c, int res, const char *what) {
  if (res == CUPTI_SUCCESS) return 0;
  const char *s = NULL;
  if (c->GetResultString) c->GetResultString((CUptiResult)res, &s);
  int err = CM_ECUPTI;
  if (res == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) err = CM_EBUSY;
  if (res == CUPTI_ERROR_NOT_SUPPORTED || res == CUPTI_ERROR_NOT_COMPATIBLE) err = CM_ENOSYS;
  if (res == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES ||
      res == CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES)
    return cm__seterr(CM_EPERM,
                      "%s failed: %s (%d). The driver restricts GPU performance counters to "
                      "admin users: run as root (or with CAP_SYS_ADMIN), or load the driver with "
                      "NVreg_RestrictProfilingToAdminUsers=0 (see "
                      "https://developer.nvidia.com/ERR_NVGPUCTRPERM)",
                      what, s ? s : "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES", res);
  return cm__seterr(err, "%s failed: %s (%d)", what, s ? s : "unknown CUPTI error", res);
}
