/*
 * cm_profiler_host.h: the part of CUPTI 13.0's profiler host API (cupti_profiler_host.h) that PM
 * sampling uses, declared for C.
 *
 * CUPTI's own header includes the C++ header <string>, so a C translation unit cannot include it.
 * The declarations below repeat the 13.0 ABI: the same struct names, member order and types, and
 * the same *_STRUCT_SIZE macros, so CUPTI sees exactly what its header describes. The include
 * guard is CUPTI's, so a C++ unit that includes the real header first skips this one.
 * engine/tests/check_profiler_host.cpp compiles both and asserts that every size and offset
 * matches.
 */
#ifndef _CUPTI_PROFILER_HOST_H_
#define _CUPTI_PROFILER_HOST_H_

#include <stddef.h>
#include <stdint.h>

#include <cupti_result.h>

#ifndef CUPTI_PROFILER_STRUCT_SIZE
#define CUPTI_PROFILER_STRUCT_SIZE(type_, lastfield_) \
  (offsetof(type_, lastfield_) + sizeof(((type_ *)0)->lastfield_))
#endif

typedef enum CUpti_MetricType {
  CUPTI_METRIC_TYPE_COUNTER = 0,
  CUPTI_METRIC_TYPE_RATIO,
  CUPTI_METRIC_TYPE_THROUGHPUT,
  CUPTI_METRIC_TYPE__COUNT
} CUpti_MetricType;

typedef enum CUpti_ProfilerType {
  CUPTI_PROFILER_TYPE_RANGE_PROFILER,
  CUPTI_PROFILER_TYPE_PM_SAMPLING,
  CUPTI_PROFILER_TYPE_PROFILER_INVALID
} CUpti_ProfilerType;

typedef struct CUpti_Profiler_Host_Object CUpti_Profiler_Host_Object;

typedef struct CUpti_Profiler_Host_Initialize_Params {
  size_t structSize;
  void *pPriv;
  CUpti_ProfilerType profilerType;
  const char *pChipName;
  const uint8_t *pCounterAvailabilityImage;
  CUpti_Profiler_Host_Object *pHostObject; /* out */
} CUpti_Profiler_Host_Initialize_Params;
#define CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE \
  CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_Initialize_Params, pHostObject)
CUptiResult CUPTIAPI cuptiProfilerHostInitialize(CUpti_Profiler_Host_Initialize_Params *pParams);

typedef struct CUpti_Profiler_Host_Deinitialize_Params {
  size_t structSize;
  void *pPriv;
  CUpti_Profiler_Host_Object *pHostObject;
} CUpti_Profiler_Host_Deinitialize_Params;
#define CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE \
  CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_Deinitialize_Params, pHostObject)
CUptiResult CUPTIAPI cuptiProfilerHostDeinitialize(CUpti_Profiler_Host_Deinitialize_Params *pParams);

typedef struct CUpti_Profiler_Host_EvaluateToGpuValues_Params {
  size_t structSize;
  void *pPriv;
  CUpti_Profiler_Host_Object *pHostObject;
  const uint8_t *pCounterDataImage;
  size_t counterDataImageSize;
  size_t rangeIndex;
  const char **ppMetricNames;
  size_t numMetrics;
  double *pMetricValues; /* out */
} CUpti_Profiler_Host_EvaluateToGpuValues_Params;
#define CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE \
  CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_EvaluateToGpuValues_Params, pMetricValues)
CUptiResult CUPTIAPI
cuptiProfilerHostEvaluateToGpuValues(CUpti_Profiler_Host_EvaluateToGpuValues_Params *pParams);

typedef struct CUpti_Profiler_Host_ConfigAddMetrics_Params {
  size_t structSize;
  void *pPriv;
  CUpti_Profiler_Host_Object *pHostObject;
  const char **ppMetricNames;
  size_t numMetrics;
} CUpti_Profiler_Host_ConfigAddMetrics_Params;
#define CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE \
  CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_ConfigAddMetrics_Params, numMetrics)
CUptiResult CUPTIAPI
cuptiProfilerHostConfigAddMetrics(CUpti_Profiler_Host_ConfigAddMetrics_Params *pParams);

typedef struct CUpti_Profiler_Host_GetConfigImageSize_Params {
  size_t structSize;
  void *pPriv;
  CUpti_Profiler_Host_Object *pHostObject;
  size_t configImageSize; /* out */
} CUpti_Profiler_Host_GetConfigImageSize_Params;
#define CUpti_Profiler_Host_GetConfigImageSize_Params_STRUCT_SIZE \
  CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_GetConfigImageSize_Params, configImageSize)
CUptiResult CUPTIAPI
cuptiProfilerHostGetConfigImageSize(CUpti_Profiler_Host_GetConfigImageSize_Params *pParams);

typedef struct CUpti_Profiler_Host_GetConfigImage_Params {
  size_t structSize;
  void *pPriv;
  CUpti_Profiler_Host_Object *pHostObject;
  size_t configImageSize;
  uint8_t *pConfigImage; /* out */
} CUpti_Profiler_Host_GetConfigImage_Params;
#define CUpti_Profiler_Host_GetConfigImage_Params_STRUCT_SIZE \
  CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_GetConfigImage_Params, pConfigImage)
CUptiResult CUPTIAPI cuptiProfilerHostGetConfigImage(CUpti_Profiler_Host_GetConfigImage_Params *pParams);

typedef struct CUpti_Profiler_Host_GetNumOfPasses_Params {
  size_t structSize;
  void *pPriv;
  size_t configImageSize;
  uint8_t *pConfigImage;
  size_t numOfPasses; /* out */
} CUpti_Profiler_Host_GetNumOfPasses_Params;
#define CUpti_Profiler_Host_GetNumOfPasses_Params_STRUCT_SIZE \
  CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_GetNumOfPasses_Params, numOfPasses)
CUptiResult CUPTIAPI cuptiProfilerHostGetNumOfPasses(CUpti_Profiler_Host_GetNumOfPasses_Params *pParams);

typedef struct CUpti_Profiler_Host_GetBaseMetrics_Params {
  size_t structSize;
  void *pPriv;
  CUpti_Profiler_Host_Object *pHostObject;
  CUpti_MetricType metricType;
  const char **ppMetricNames; /* out, owned by the host object */
  size_t numMetrics;          /* out */
} CUpti_Profiler_Host_GetBaseMetrics_Params;
#define CUpti_Profiler_Host_GetBaseMetrics_Params_STRUCT_SIZE \
  CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_GetBaseMetrics_Params, numMetrics)
CUptiResult CUPTIAPI cuptiProfilerHostGetBaseMetrics(CUpti_Profiler_Host_GetBaseMetrics_Params *pParams);

typedef struct CUpti_Profiler_Host_GetSubMetrics_Params {
  size_t structSize;
  void *pPriv;
  CUpti_Profiler_Host_Object *pHostObject;
  CUpti_MetricType metricType;
  const char *pMetricName;
  size_t numOfSubmetrics;    /* out */
  const char **ppSubMetrics; /* out, owned by the host object */
} CUpti_Profiler_Host_GetSubMetrics_Params;
#define CUpti_Profiler_Host_GetSubMetrics_Params_STRUCT_SIZE \
  CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_GetSubMetrics_Params, ppSubMetrics)
CUptiResult CUPTIAPI cuptiProfilerHostGetSubMetrics(CUpti_Profiler_Host_GetSubMetrics_Params *pParams);

typedef struct CUpti_Profiler_Host_GetMetricProperties_Params {
  size_t structSize;
  void *pPriv;
  CUpti_Profiler_Host_Object *pHostObject;
  const char *pMetricName;
  const char *pDescription;     /* out */
  const char *pHwUnit;          /* out */
  const char *pDimUnit;         /* out */
  CUpti_MetricType metricType;  /* out */
} CUpti_Profiler_Host_GetMetricProperties_Params;
#define CUpti_Profiler_Host_GetMetricProperties_Params_STRUCT_SIZE \
  CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_GetMetricProperties_Params, metricType)
CUptiResult CUPTIAPI
cuptiProfilerHostGetMetricProperties(CUpti_Profiler_Host_GetMetricProperties_Params *pParams);

#endif /* _CUPTI_PROFILER_HOST_H_ */
