/*
 * cm_cupti.h: the dlopen binding of libcupti (cupti.c): the function table every CUPTI call of the
 * core goes through, its load and the translation of CUptiResult. Nothing here is public.
 *
 * A header of its own, and not a section of cm_internal.h, because the agent shares it
 * (cm_agent.h includes it): InitializeInjectionNvtx2 loads libcupti through this binding to hand
 * NVTX to it. The table is written once by cm__cupti_load and read-only afterwards.
 */
#ifndef CM_CUPTI_H
#define CM_CUPTI_H

#include <stdint.h>

#include <cupti.h>
#include <cupti_pmsampling.h>
#include <cupti_profiler_target.h>
#include <cupti_target.h>

#include "cm_profiler_host.h"

/* The function table of the loaded libcupti. Every pointer is resolved at load time; a missing
 * symbol fails the load with CM_ENOCUPTI and a detail naming it. */
typedef struct cm__cupti {
  void *lib;
  void *cuda;
  char path[512];
  char cuda_path[512];
  __typeof__(&cuptiGetVersion) GetVersion;
  __typeof__(&cuptiGetResultString) GetResultString;
  __typeof__(&cuptiSubscribe) Subscribe;
  __typeof__(&cuptiSubscribe_v2) Subscribe_v2; /* may be NULL on older CUPTI */
  __typeof__(&cuptiUnsubscribe) Unsubscribe;
  __typeof__(&cuptiEnableCallback) EnableCallback;
  __typeof__(&cuptiEnableDomain) EnableDomain;
  __typeof__(&cuptiActivityRegisterCallbacks) ActivityRegisterCallbacks;
  __typeof__(&cuptiActivitySetAttribute) ActivitySetAttribute; /* may be NULL (a test double) */
  __typeof__(&cuptiActivityEnable) ActivityEnable;
  __typeof__(&cuptiActivityDisable) ActivityDisable;
  __typeof__(&cuptiActivityGetNextRecord) ActivityGetNextRecord;
  __typeof__(&cuptiActivityFlushAll) ActivityFlushAll;
  __typeof__(&cuptiActivityGetNumDroppedRecords) ActivityGetNumDroppedRecords;
  __typeof__(&cuptiActivityEnableLatencyTimestamps) ActivityEnableLatencyTimestamps;
  __typeof__(&cuptiActivityEnableCudaEventDeviceTimestamps) ActivityEnableCudaEventDeviceTimestamps;
  __typeof__(&cuptiActivityRegisterTimestampCallback) ActivityRegisterTimestampCallback;
  __typeof__(&cuptiActivityPushExternalCorrelationId) ActivityPushExternalCorrelationId;
  __typeof__(&cuptiActivityPopExternalCorrelationId) ActivityPopExternalCorrelationId;
  __typeof__(&cuptiGetTimestamp) GetTimestamp;
  __typeof__(&cuptiFinalize) Finalize; /* may be NULL (cm_cupti_detach then answers CM_ENOSYS) */
  /* PM sampling and the profiler host API (pmsample.c). Optional: a libcupti without them loads,
   * and PM sampling then fails with CM_ENOSYS naming `pm_missing`, the first symbol not found. */
  const char *pm_missing;
  __typeof__(&cuptiProfilerInitialize) ProfilerInitialize;
  __typeof__(&cuptiDeviceGetChipName) DeviceGetChipName;
  __typeof__(&cuptiPmSamplingGetCounterAvailability) PmGetCounterAvailability;
  __typeof__(&cuptiProfilerHostInitialize) HostInitialize;
  __typeof__(&cuptiProfilerHostDeinitialize) HostDeinitialize;
  __typeof__(&cuptiProfilerHostConfigAddMetrics) HostConfigAddMetrics;
  __typeof__(&cuptiProfilerHostGetConfigImageSize) HostGetConfigImageSize;
  __typeof__(&cuptiProfilerHostGetConfigImage) HostGetConfigImage;
  __typeof__(&cuptiProfilerHostGetNumOfPasses) HostGetNumOfPasses;
  __typeof__(&cuptiProfilerHostEvaluateToGpuValues) HostEvaluateToGpuValues;
  /* For the suggestions after a refused metric name; each may be NULL (no suggestion then). */
  __typeof__(&cuptiProfilerHostGetBaseMetrics) HostGetBaseMetrics;
  __typeof__(&cuptiProfilerHostGetSubMetrics) HostGetSubMetrics;
  __typeof__(&cuptiProfilerHostGetMetricProperties) HostGetMetricProperties;
  __typeof__(&cuptiPmSamplingEnable) PmEnable;
  __typeof__(&cuptiPmSamplingSetConfig) PmSetConfig;
  __typeof__(&cuptiPmSamplingStart) PmStart;
  __typeof__(&cuptiPmSamplingStop) PmStop;
  __typeof__(&cuptiPmSamplingDisable) PmDisable;
  __typeof__(&cuptiPmSamplingGetCounterDataSize) PmGetCounterDataSize;
  __typeof__(&cuptiPmSamplingCounterDataImageInitialize) PmCounterDataImageInitialize;
  __typeof__(&cuptiPmSamplingDecodeData) PmDecodeData;
  __typeof__(&cuptiPmSamplingGetCounterDataInfo) PmGetCounterDataInfo;
  __typeof__(&cuptiPmSamplingCounterDataGetSampleInfo) PmCounterDataGetSampleInfo;
  /* libcuda, for the fence's device synchronization. Optional: NULL when libcuda is absent. */
  int (*cuCtxGetCurrent)(void **ctx);
  int (*cuCtxSynchronize)(void);
  int (*cuDeviceGetCount)(int *count);
  int (*cuDevicePrimaryCtxGetState)(int dev, unsigned *flags, int *active);
  int (*cuDevicePrimaryCtxRetain)(void **ctx, int dev);
  int (*cuDevicePrimaryCtxRelease)(int dev);
  int (*cuCtxPushCurrent)(void *ctx);
  int (*cuCtxPopCurrent)(void **ctx);
  /* Sets the calling thread's stream-capture mode (CUstreamCaptureMode) and returns the old one
   * in *mode. The fence's threads run in relaxed mode, so their synchronize calls never count as
   * unsafe calls for a CUDA graph capture of the application. */
  int (*cuThreadExchangeStreamCaptureMode)(int *mode);
  /* The driver call whose API exit callback runs cuptiFinalize for cm_cupti_detach (the call site
   * CUPTI recommends); NULL: cuptiFinalize is called directly. */
  int (*cuDriverGetVersion)(int *version);
} cm__cupti;

/* Loads libcupti in the documented search order: "libcupti.so.13" (shares a copy the process
 * already loaded), $CUPTIMON_LIBCUPTI, $CUDA_HOME/lib64 and /lib, /usr/local/cuda/lib64 and /lib.
 * libcuda comes from $CUPTIMON_LIBCUDA, else "libcuda.so.1". Never unloads; cuptiFinalize is bound
 * for cm_cupti_detach alone. Returns 0, or CM_ENOCUPTI with a detail that names what was looked for and how
 * to fix it. */
int cm__cupti_load(cm__cupti *c);
/* Translates a CUptiResult: 0 for success, else CM_ECUPTI with a detail "what: CUPTI_ERROR_X". */
int cm__cupti_err(const cm__cupti *c, int res, const char *what);

#endif /* CM_CUPTI_H */
