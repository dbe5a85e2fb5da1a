// check_profiler_host.cpp: engine/core/cm_profiler_host.h must describe the same ABI as CUPTI's
// C++-only cupti_profiler_host.h. Both are included, the engine's copy inside a namespace, and
// every struct's size and every member's offset are compared at compile time: the ctest
// check_profiler_host compiles this file (syntax only), so a mismatch fails the build of the test.
#include <cstddef>

#include <cupti_profiler_host.h>

// CUPTI's *_STRUCT_SIZE values, kept before its macros are dropped, to compare with the engine's.
#define CUPTI_SIZE(T) constexpr size_t cupti_##T = T##_STRUCT_SIZE
CUPTI_SIZE(CUpti_Profiler_Host_Initialize_Params);
CUPTI_SIZE(CUpti_Profiler_Host_Deinitialize_Params);
CUPTI_SIZE(CUpti_Profiler_Host_EvaluateToGpuValues_Params);
CUPTI_SIZE(CUpti_Profiler_Host_ConfigAddMetrics_Params);
CUPTI_SIZE(CUpti_Profiler_Host_GetConfigImageSize_Params);
CUPTI_SIZE(CUpti_Profiler_Host_GetConfigImage_Params);
CUPTI_SIZE(CUpti_Profiler_Host_GetNumOfPasses_Params);
CUPTI_SIZE(CUpti_Profiler_Host_GetBaseMetrics_Params);
CUPTI_SIZE(CUpti_Profiler_Host_GetSubMetrics_Params);
CUPTI_SIZE(CUpti_Profiler_Host_GetMetricProperties_Params);

namespace mine {
#undef _CUPTI_PROFILER_HOST_H_
// CUPTI's *_STRUCT_SIZE macros are dropped to avoid the redefinition; the engine's are compared
// with the values kept above (SAME_STRUCT_SIZE).
#undef CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE
#undef CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE
#undef CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE
#undef CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE
#undef CUpti_Profiler_Host_GetConfigImageSize_Params_STRUCT_SIZE
#undef CUpti_Profiler_Host_GetConfigImage_Params_STRUCT_SIZE
#undef CUpti_Profiler_Host_GetNumOfPasses_Params_STRUCT_SIZE
#undef CUpti_Profiler_Host_GetBaseMetrics_Params_STRUCT_SIZE
#undef CUpti_Profiler_Host_GetSubMetrics_Params_STRUCT_SIZE
#undef CUpti_Profiler_Host_GetMetricProperties_Params_STRUCT_SIZE
#include "cm_profiler_host.h"
}  // namespace mine

#define SAME_SIZE(T) static_assert(sizeof(::T) == sizeof(mine::T), #T " differs in size")
#define SAME_AT(T, m) static_assert(offsetof(::T, m) == offsetof(mine::T, m), #T "." #m " moved")
// The engine's macro, expanded in namespace mine, against CUPTI's value: the structSize that
// CUPTI reads to know which members the caller filled.
#define SAME_STRUCT_SIZE(T)                                                                 \
  namespace mine {                                                                         \
  static_assert(T##_STRUCT_SIZE == ::cupti_##T, #T "_STRUCT_SIZE differs from CUPTI's"); \
  }
SAME_STRUCT_SIZE(CUpti_Profiler_Host_Initialize_Params)
SAME_STRUCT_SIZE(CUpti_Profiler_Host_Deinitialize_Params)
SAME_STRUCT_SIZE(CUpti_Profiler_Host_EvaluateToGpuValues_Params)
SAME_STRUCT_SIZE(CUpti_Profiler_Host_ConfigAddMetrics_Params)
SAME_STRUCT_SIZE(CUpti_Profiler_Host_GetConfigImageSize_Params)
SAME_STRUCT_SIZE(CUpti_Profiler_Host_GetConfigImage_Params)
SAME_STRUCT_SIZE(CUpti_Profiler_Host_GetNumOfPasses_Params)
SAME_STRUCT_SIZE(CUpti_Profiler_Host_GetBaseMetrics_Params)
SAME_STRUCT_SIZE(CUpti_Profiler_Host_GetSubMetrics_Params)
SAME_STRUCT_SIZE(CUpti_Profiler_Host_GetMetricProperties_Params)

static_assert((int)::CUPTI_PROFILER_TYPE_PM_SAMPLING == (int)mine::CUPTI_PROFILER_TYPE_PM_SAMPLING,
              "CUpti_ProfilerType differs");
SAME_SIZE(CUpti_Profiler_Host_Initialize_Params);
SAME_AT(CUpti_Profiler_Host_Initialize_Params, profilerType);
SAME_AT(CUpti_Profiler_Host_Initialize_Params, pChipName);
SAME_AT(CUpti_Profiler_Host_Initialize_Params, pCounterAvailabilityImage);
SAME_AT(CUpti_Profiler_Host_Initialize_Params, pHostObject);
SAME_SIZE(CUpti_Profiler_Host_Deinitialize_Params);
SAME_AT(CUpti_Profiler_Host_Deinitialize_Params, pHostObject);
SAME_SIZE(CUpti_Profiler_Host_EvaluateToGpuValues_Params);
SAME_AT(CUpti_Profiler_Host_EvaluateToGpuValues_Params, pHostObject);
SAME_AT(CUpti_Profiler_Host_EvaluateToGpuValues_Params, pCounterDataImage);
SAME_AT(CUpti_Profiler_Host_EvaluateToGpuValues_Params, counterDataImageSize);
SAME_AT(CUpti_Profiler_Host_EvaluateToGpuValues_Params, rangeIndex);
SAME_AT(CUpti_Profiler_Host_EvaluateToGpuValues_Params, ppMetricNames);
SAME_AT(CUpti_Profiler_Host_EvaluateToGpuValues_Params, numMetrics);
SAME_AT(CUpti_Profiler_Host_EvaluateToGpuValues_Params, pMetricValues);
SAME_SIZE(CUpti_Profiler_Host_ConfigAddMetrics_Params);
SAME_AT(CUpti_Profiler_Host_ConfigAddMetrics_Params, pHostObject);
SAME_AT(CUpti_Profiler_Host_ConfigAddMetrics_Params, ppMetricNames);
SAME_AT(CUpti_Profiler_Host_ConfigAddMetrics_Params, numMetrics);
SAME_SIZE(CUpti_Profiler_Host_GetConfigImageSize_Params);
SAME_AT(CUpti_Profiler_Host_GetConfigImageSize_Params, pHostObject);
SAME_AT(CUpti_Profiler_Host_GetConfigImageSize_Params, configImageSize);
SAME_SIZE(CUpti_Profiler_Host_GetConfigImage_Params);
SAME_AT(CUpti_Profiler_Host_GetConfigImage_Params, configImageSize);
SAME_AT(CUpti_Profiler_Host_GetConfigImage_Params, pConfigImage);
SAME_SIZE(CUpti_Profiler_Host_GetNumOfPasses_Params);
SAME_AT(CUpti_Profiler_Host_GetNumOfPasses_Params, configImageSize);
SAME_AT(CUpti_Profiler_Host_GetNumOfPasses_Params, pConfigImage);
SAME_AT(CUpti_Profiler_Host_GetNumOfPasses_Params, numOfPasses);
SAME_SIZE(CUpti_Profiler_Host_GetBaseMetrics_Params);
SAME_AT(CUpti_Profiler_Host_GetBaseMetrics_Params, pHostObject);
SAME_AT(CUpti_Profiler_Host_GetBaseMetrics_Params, metricType);
SAME_AT(CUpti_Profiler_Host_GetBaseMetrics_Params, ppMetricNames);
SAME_AT(CUpti_Profiler_Host_GetBaseMetrics_Params, numMetrics);
SAME_SIZE(CUpti_Profiler_Host_GetSubMetrics_Params);
SAME_AT(CUpti_Profiler_Host_GetSubMetrics_Params, pHostObject);
SAME_AT(CUpti_Profiler_Host_GetSubMetrics_Params, metricType);
SAME_AT(CUpti_Profiler_Host_GetSubMetrics_Params, pMetricName);
SAME_AT(CUpti_Profiler_Host_GetSubMetrics_Params, numOfSubmetrics);
SAME_AT(CUpti_Profiler_Host_GetSubMetrics_Params, ppSubMetrics);
SAME_SIZE(CUpti_Profiler_Host_GetMetricProperties_Params);
SAME_AT(CUpti_Profiler_Host_GetMetricProperties_Params, pHostObject);
SAME_AT(CUpti_Profiler_Host_GetMetricProperties_Params, pMetricName);
SAME_AT(CUpti_Profiler_Host_GetMetricProperties_Params, pDescription);
SAME_AT(CUpti_Profiler_Host_GetMetricProperties_Params, pHwUnit);
SAME_AT(CUpti_Profiler_Host_GetMetricProperties_Params, pDimUnit);
SAME_AT(CUpti_Profiler_Host_GetMetricProperties_Params, metricType);
