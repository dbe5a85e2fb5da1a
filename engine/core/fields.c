/*
 * fields.c: the field registry. For every activity kind the engine decodes, it names the CUPTI
 * 13.0 record struct and lists the record's exported members: a stable id, a Lua-safe name, the
 * column type, and where the member lives in the record.
 *
 * Design:
 *  - Layouts are right by construction. Every row is produced by one macro from the real struct
 *    and member: offsetof() gives the offset, sizeof() the width read from the record, and a
 *    _Generic over the member's C type gives the column type. Nothing about a layout is typed in
 *    by hand, so a CUPTI header change either still compiles to the right table or fails to build.
 *  - Each struct's fields are one X-macro list. The list expands twice: into an enum of field ids
 *    (so the descriptor's start/end field ids are names, not counted numbers) and into the table.
 *  - A field id is its index in the list. Ids are part of the wire format and of captures, so a
 *    list only ever grows at its end; a member CUPTI removes stays in place with a new source.
 *  - Exported: every scalar member (integers, enums, string pointers). Skipped: the record's
 *    `kind` (a batch is already one kind), padding, reserved words, arrays (UUIDs) and pointers
 *    that are not strings. Unions are exported through named views over the same bytes (for
 *    example the object id of a marker as pid/tid or as device/context/stream), and a byte that
 *    holds bitfields is exported raw.
 *  - String members are read as 8-byte pointers and stored as 4-byte string ids (CM_TYPE_STR);
 *    the decoder interns them by content.
 *  - Kinds with a single timestamp (marker, memory2, memory_pool, environment, cuda_event) name
 *    it as their start field and have no end field. cuda_event's device_timestamp is 0 unless
 *    CUDA event device timestamps are enabled. Kinds with no time at all have neither.
 *
 * Everything here is constant data, so every function is thread-safe. Failing lookups record a
 * detail (cm__seterr) that lists every valid name, because the usual caller is a person typing a
 * script.
 */
#include <stdio.h>
#include <string.h>

#include "cm_internal.h"

/* ---- kind values: cuptimon's enum is CUPTI's ------------------------------------------------ */

#define CM__SAME_KIND(k)                                                   \
  _Static_assert((int)CM_KIND_##k == (int)CUPTI_ACTIVITY_KIND_##k, \
                 "cm_kind CM_KIND_" #k " differs from CUPTI_ACTIVITY_KIND_" #k)
CM__SAME_KIND(INVALID);
CM__SAME_KIND(MEMCPY);
CM__SAME_KIND(MEMSET);
CM__SAME_KIND(KERNEL);
CM__SAME_KIND(DRIVER);
CM__SAME_KIND(RUNTIME);
CM__SAME_KIND(DEVICE);
CM__SAME_KIND(CONTEXT);
CM__SAME_KIND(CONCURRENT_KERNEL);
CM__SAME_KIND(NAME);
CM__SAME_KIND(MARKER);
CM__SAME_KIND(MARKER_DATA);
CM__SAME_KIND(OVERHEAD);
CM__SAME_KIND(ENVIRONMENT);
CM__SAME_KIND(MEMCPY2);
CM__SAME_KIND(CUDA_EVENT);
CM__SAME_KIND(STREAM);
CM__SAME_KIND(SYNCHRONIZATION);
CM__SAME_KIND(EXTERNAL_CORRELATION);
CM__SAME_KIND(MEMORY2);
CM__SAME_KIND(MEMORY_POOL);
CM__SAME_KIND(GRAPH_TRACE);
#undef CM__SAME_KIND
_Static_assert((int)CUPTI_ACTIVITY_KIND_COUNT <= (int)CM_KIND_MAX, "CM_KIND_MAX must bound CUPTI's kinds");
_Static_assert((int)CM_KIND_RESOURCE >= (int)CUPTI_ACTIVITY_KIND_COUNT,
               "a synthetic kind must not collide with a CUPTI kind");

/* ---- rows --------------------------------------------------------------------------------- */

/* The column type of a member, from its C type. Enums are unsigned int under GCC and Clang when
 * no enumerator is negative, which holds for every CUPTI enum used here. `long` is 8 bytes on the
 * LP64 targets CUPTI supports. An unsupported type (a struct, an array, a non-string pointer)
 * selects 0, which CM__CHECKED turns into a compile error at the offending row. */
#define CM__CTYPE(e)                                   \
  _Generic((e),                                        \
      signed char: CM_TYPE_I8,                         \
      unsigned char: CM_TYPE_U8,                       \
      short: CM_TYPE_I16,                              \
      unsigned short: CM_TYPE_U16,                     \
      int: CM_TYPE_I32,                                \
      unsigned int: CM_TYPE_U32,                       \
      long: CM_TYPE_I64,                               \
      unsigned long: CM_TYPE_U64,                      \
      long long: CM_TYPE_I64,                          \
      unsigned long long: CM_TYPE_U64,                 \
      char *: CM_TYPE_STR,                             \
      const char *: CM_TYPE_STR,                       \
      double: CM_TYPE_F64,                             \
      default: 0)
_Static_assert(sizeof(long) == 8, "the registry assumes an LP64 target, as CUPTI does");

/* Zero, or a negative-size array (a compile error) when the member's type is unsupported. */
#define CM__CHECKED(e) (sizeof(char[CM__CTYPE(e) > 0 ? 1 : -1]) - 1)

#define CM__M(T, m) (((T *)0)->m)

#define CM__ROW(T, m, nm, dc)                                                          \
  {.name = #nm,                                                                        \
   .doc = dc,                                                                          \
   .offset = (uint16_t)offsetof(T, m),                                                 \
   .src_width = (uint8_t)sizeof(CM__M(T, m)),                                          \
   .width = (uint8_t)(CM__CTYPE(CM__M(T, m)) == CM_TYPE_STR ? 4 : sizeof(CM__M(T, m))), \
   .type = (uint8_t)(CM__CTYPE(CM__M(T, m)) + CM__CHECKED(CM__M(T, m)))},

#define CM__ID(T, m, nm, dc) CM__FID_##T##_##nm,

/* Expands a field list into the id enum, the table and a size check (offsets are 16-bit). */
#define CM__DEFINE_FIELDS(T, LIST)                                        \
  enum { LIST(CM__ID, T) CM__NFIELDS_##T };                               \
  static const cm__field fields_##T[] = {LIST(CM__ROW, T)};               \
  _Static_assert(sizeof(T) <= UINT16_MAX, #T " is too large for the registry"); \
  _Static_assert(CM__NFIELDS_##T <= CM__MAX_FIELDS, #T " has too many fields")

/* ---- field lists (append only: an id is the position in its list) ------------------------- */

#define CM__KERNEL10(F, T)                                                                      \
  F(T, cacheConfig.both, cache_config,                                                         \
    "raw cache config byte: requested config in one 4-bit field, executed in the other")       \
  F(T, sharedMemoryConfig, shared_mem_config, "shared memory bank config (CUsharedconfig)")    \
  F(T, registersPerThread, registers, "registers per thread")                                  \
  F(T, partitionedGlobalCacheRequested, partitioned_cache_requested,                           \
    "partitioned global caching requested (CUpti_ActivityPartitionedGlobalCacheConfig)")        \
  F(T, partitionedGlobalCacheExecuted, partitioned_cache_executed,                             \
    "partitioned global caching in effect (CUpti_ActivityPartitionedGlobalCacheConfig)")        \
  F(T, start, start, "start of execution on the device, ns")                                   \
  F(T, end, stop, "end of execution on the device, ns (0 if unknown)")                         \
  F(T, completed, completed, "completion time of a device-launched parent kernel, ns")         \
  F(T, deviceId, device, "device id")                                                          \
  F(T, contextId, context, "context id")                                                       \
  F(T, streamId, stream, "stream id")                                                          \
  F(T, gridX, grid_x, "grid size, x")                                                          \
  F(T, gridY, grid_y, "grid size, y")                                                          \
  F(T, gridZ, grid_z, "grid size, z")                                                          \
  F(T, blockX, block_x, "block size, x")                                                       \
  F(T, blockY, block_y, "block size, y")                                                       \
  F(T, blockZ, block_z, "block size, z")                                                       \
  F(T, staticSharedMemory, static_smem, "static shared memory per block, bytes")               \
  F(T, dynamicSharedMemory, dynamic_smem, "dynamic shared memory per block, bytes")            \
  F(T, localMemoryPerThread, local_mem_per_thread, "local memory per thread, bytes")           \
  F(T, localMemoryTotal, local_mem_total, "local memory reserved for the kernel, bytes (32-bit)") \
  F(T, correlationId, correlation, "correlation id of the launching API call")                 \
  F(T, gridId, grid_id, "grid id, unique per context")                                         \
  F(T, name, name, "kernel (function) name, mangled")                                          \
  F(T, queued, queued, "time the launch was queued, ns (needs latency timestamps)")            \
  F(T, submitted, submitted, "time the launch was submitted, ns (needs latency timestamps)")   \
  F(T, launchType, launch_type, "launch type (CUpti_ActivityLaunchType)")                      \
  F(T, isSharedMemoryCarveoutRequested, carveout_requested_set,                                \
    "1 when a shared memory carveout was requested")                                            \
  F(T, sharedMemoryCarveoutRequested, carveout_requested, "requested carveout, percent")       \
  F(T, sharedMemoryExecuted, shared_mem_executed, "shared memory size set by the driver, bytes") \
  F(T, graphNodeId, graph_node, "graph node id of the launch, 0 outside graphs")               \
  F(T, shmemLimitConfig, shmem_limit_config, "shared memory limit (CUpti_FuncShmemLimitConfig)") \
  F(T, graphId, graph, "graph id of the launch, 0 outside graphs")                             \
  F(T, channelID, channel, "hardware channel id")                                              \
  F(T, channelType, channel_type, "hardware channel type (CUpti_ChannelType)")                 \
  F(T, clusterX, cluster_x, "cluster size, x")                                                 \
  F(T, clusterY, cluster_y, "cluster size, y")                                                 \
  F(T, clusterZ, cluster_z, "cluster size, z")                                                 \
  F(T, clusterSchedulingPolicy, cluster_scheduling_policy, "cluster scheduling policy")        \
  F(T, localMemoryTotal_v2, local_mem_total_v2, "local memory reserved for the kernel, bytes") \
  F(T, maxPotentialClusterSize, max_potential_cluster_size, "largest possible cluster size")   \
  F(T, maxActiveClusters, max_active_clusters, "most clusters that can coexist on the device") \
  F(T, isDeviceLaunched, device_launched, "1 when launched from the device")
CM__DEFINE_FIELDS(CUpti_ActivityKernel10, CM__KERNEL10);

#define CM__MEMCPY6(F, T)                                                                      \
  F(T, copyKind, copy_kind, "copy direction (CUpti_ActivityMemcpyKind)")                       \
  F(T, srcKind, src_kind, "source memory kind (CUpti_ActivityMemoryKind)")                     \
  F(T, dstKind, dst_kind, "destination memory kind (CUpti_ActivityMemoryKind)")                \
  F(T, flags, flags, "flags (CUpti_ActivityFlag), e.g. async")                                 \
  F(T, bytes, bytes, "bytes copied")                                                           \
  F(T, start, start, "start of the copy, ns")                                                  \
  F(T, end, stop, "end of the copy, ns")                                                       \
  F(T, deviceId, device, "device id")                                                          \
  F(T, contextId, context, "context id")                                                       \
  F(T, streamId, stream, "stream id")                                                          \
  F(T, correlationId, correlation, "correlation id of the issuing API call")                   \
  F(T, runtimeCorrelationId, runtime_correlation, "runtime correlation id, when known")        \
  F(T, graphNodeId, graph_node, "graph node id, 0 outside graphs")                             \
  F(T, graphId, graph, "graph id, 0 outside graphs")                                           \
  F(T, channelID, channel, "hardware channel id")                                              \
  F(T, channelType, channel_type, "hardware channel type (CUpti_ChannelType)")                 \
  F(T, isDeviceLaunched, device_launched, "1 when issued from the device")                     \
  F(T, copyCount, copy_count, "number of copies a batched record stands for")
CM__DEFINE_FIELDS(CUpti_ActivityMemcpy6, CM__MEMCPY6);

#define CM__MEMCPYPTOP4(F, T)                                                                  \
  F(T, copyKind, copy_kind, "copy direction (CUpti_ActivityMemcpyKind)")                       \
  F(T, srcKind, src_kind, "source memory kind (CUpti_ActivityMemoryKind)")                     \
  F(T, dstKind, dst_kind, "destination memory kind (CUpti_ActivityMemoryKind)")                \
  F(T, flags, flags, "flags (CUpti_ActivityFlag), e.g. async")                                 \
  F(T, bytes, bytes, "bytes copied")                                                           \
  F(T, start, start, "start of the copy, ns")                                                  \
  F(T, end, stop, "end of the copy, ns")                                                       \
  F(T, deviceId, device, "device id of the device that ran the copy")                          \
  F(T, contextId, context, "context id")                                                       \
  F(T, streamId, stream, "stream id")                                                          \
  F(T, srcDeviceId, src_device, "source device id")                                            \
  F(T, srcContextId, src_context, "source context id")                                         \
  F(T, dstDeviceId, dst_device, "destination device id")                                       \
  F(T, dstContextId, dst_context, "destination context id")                                    \
  F(T, correlationId, correlation, "correlation id of the issuing API call")                   \
  F(T, graphNodeId, graph_node, "graph node id, 0 outside graphs")                             \
  F(T, graphId, graph, "graph id, 0 outside graphs")                                           \
  F(T, channelID, channel, "hardware channel id")                                              \
  F(T, channelType, channel_type, "hardware channel type (CUpti_ChannelType)")
CM__DEFINE_FIELDS(CUpti_ActivityMemcpyPtoP4, CM__MEMCPYPTOP4);

#define CM__MEMSET4(F, T)                                                                      \
  F(T, value, value, "value being set")                                                        \
  F(T, bytes, bytes, "bytes set")                                                              \
  F(T, start, start, "start of the memset, ns")                                                \
  F(T, end, stop, "end of the memset, ns")                                                     \
  F(T, deviceId, device, "device id")                                                          \
  F(T, contextId, context, "context id")                                                       \
  F(T, streamId, stream, "stream id")                                                          \
  F(T, correlationId, correlation, "correlation id of the issuing API call")                   \
  F(T, flags, flags, "flags (CUpti_ActivityFlag), e.g. async")                                 \
  F(T, memoryKind, memory_kind, "memory kind set (CUpti_ActivityMemoryKind)")                  \
  F(T, graphNodeId, graph_node, "graph node id, 0 outside graphs")                             \
  F(T, graphId, graph, "graph id, 0 outside graphs")                                           \
  F(T, channelID, channel, "hardware channel id")                                              \
  F(T, channelType, channel_type, "hardware channel type (CUpti_ChannelType)")                 \
  F(T, isDeviceLaunched, device_launched, "1 when issued from the device")
CM__DEFINE_FIELDS(CUpti_ActivityMemset4, CM__MEMSET4);

#define CM__API(F, T)                                                                          \
  F(T, cbid, cbid, "callback id of the API function (runtime or driver CBID)")                 \
  F(T, start, start, "entry into the API function, ns")                                        \
  F(T, end, stop, "exit from the API function, ns")                                            \
  F(T, processId, pid, "process id")                                                           \
  F(T, threadId, tid, "thread id")                                                             \
  F(T, correlationId, correlation, "correlation id, shared with the device activity it caused") \
  F(T, returnValue, return_value, "return value (cudaError_t or CUresult)")
CM__DEFINE_FIELDS(CUpti_ActivityAPI, CM__API);

#define CM__SYNCHRONIZATION2(F, T)                                                             \
  F(T, type, sync_type, "what was waited for (CUpti_ActivitySynchronizationType)")             \
  F(T, start, start, "start of the wait, ns")                                                  \
  F(T, end, stop, "end of the wait, ns")                                                       \
  F(T, correlationId, correlation, "correlation id of the synchronizing API call")             \
  F(T, contextId, context, "context id")                                                       \
  F(T, streamId, stream, "stream id, or CUPTI_SYNCHRONIZATION_INVALID_VALUE")                  \
  F(T, cudaEventId, event, "CUDA event id for event synchronization")                          \
  F(T, cudaEventSyncId, event_sync_id, "event sync id, matching a cuda_event record")          \
  F(T, returnValue, return_value, "return value of the synchronizing call")
CM__DEFINE_FIELDS(CUpti_ActivitySynchronization2, CM__SYNCHRONIZATION2);

#define CM__CUDAEVENT2(F, T)                                                                   \
  F(T, correlationId, correlation, "correlation id of the cudaEventRecord call")               \
  F(T, contextId, context, "context id")                                                       \
  F(T, streamId, stream, "stream id")                                                          \
  F(T, eventId, event, "CUDA event id")                                                        \
  F(T, deviceId, device, "device id")                                                          \
  F(T, deviceTimestamp, device_timestamp, "time the event fired on the device, ns (opt-in)")   \
  F(T, cudaEventSyncId, event_sync_id, "event sync id, matching a synchronization record")
CM__DEFINE_FIELDS(CUpti_ActivityCudaEvent2, CM__CUDAEVENT2);

#define CM__EXTERNALCORRELATION(F, T)                                                          \
  F(T, externalKind, external_kind, "who pushed the id (CUpti_ExternalCorrelationKind)")       \
  F(T, externalId, external_id, "the pushed external id")                                      \
  F(T, correlationId, correlation, "correlation id of the API call it applies to")
CM__DEFINE_FIELDS(CUpti_ActivityExternalCorrelation, CM__EXTERNALCORRELATION);

/* The object-id union of a record, as its two views: pid/tid when the object kind is a process or
 * a thread, device/context/stream when it is one of those. Both views read the same bytes. */
#define CM__OBJECT_ID(F, T)                                                                    \
  F(T, objectId.pt.processId, pid, "process id (object_kind process or thread)")               \
  F(T, objectId.pt.threadId, tid, "thread id (object_kind thread)")                            \
  F(T, objectId.dcs.deviceId, device, "device id (object_kind device, context or stream)")     \
  F(T, objectId.dcs.contextId, context, "context id (object_kind context or stream)")          \
  F(T, objectId.dcs.streamId, stream, "stream id (object_kind stream)")

#define CM__MARKER2(F, T)                                                                      \
  F(T, flags, flags, "marker flags (CUpti_ActivityFlag): instantaneous, start or end")         \
  F(T, timestamp, timestamp, "time of the marker, ns")                                         \
  F(T, id, id, "marker id; a range's start and end records share it")                          \
  F(T, objectKind, object_kind, "kind of object that made the marker (CUpti_ActivityObjectKind)") \
  CM__OBJECT_ID(F, T)                                                                          \
  F(T, name, name, "marker or range message; empty on an end record")                          \
  F(T, domain, domain, "NVTX domain name; empty for the default domain")
CM__DEFINE_FIELDS(CUpti_ActivityMarker2, CM__MARKER2);

#define CM__MARKERDATA2(F, T)                                                                  \
  F(T, flags, flags, "marker flags (CUpti_ActivityFlag)")                                      \
  F(T, id, id, "marker id, matching a marker record")                                          \
  F(T, payloadKind, payload_kind, "payload type (CUpti_MetricValueKind)")                      \
  F(T, payload.metricValueUint64, payload, "payload's 8 raw bytes; payload_kind says the type") \
  F(T, color, color, "ARGB color")                                                             \
  F(T, category, category, "NVTX category")                                                    \
  F(T, cuptiDomainId, domain_id, "CUPTI's id of the NVTX domain")
CM__DEFINE_FIELDS(CUpti_ActivityMarkerData2, CM__MARKERDATA2);

#define CM__OVERHEAD3(F, T)                                                                    \
  F(T, overheadKind, overhead_kind, "what the overhead was (CUpti_ActivityOverheadKind)")      \
  F(T, objectKind, object_kind, "kind of object that caused it (CUpti_ActivityObjectKind)")    \
  CM__OBJECT_ID(F, T)                                                                          \
  F(T, start, start, "start of the overhead, ns")                                              \
  F(T, end, stop, "end of the overhead, ns")                                                   \
  F(T, correlationId, correlation, "correlation id, when the overhead belongs to an API call")
CM__DEFINE_FIELDS(CUpti_ActivityOverhead3, CM__OVERHEAD3);

#define CM__GRAPHTRACE2(F, T)                                                                  \
  F(T, correlationId, correlation, "correlation id of the graph launch")                       \
  F(T, start, start, "start of the graph's first node, ns")                                    \
  F(T, end, stop, "end of the graph's last node, ns")                                          \
  F(T, deviceId, device, "device id where the graph started")                                  \
  F(T, graphId, graph, "graph id")                                                             \
  F(T, contextId, context, "context id where the graph started")                               \
  F(T, streamId, stream, "stream id of the launch")                                            \
  F(T, endDeviceId, end_device, "device id where the graph ended")                             \
  F(T, endContextId, end_context, "context id where the graph ended")
CM__DEFINE_FIELDS(CUpti_ActivityGraphTrace2, CM__GRAPHTRACE2);

#define CM__MEMORY4(F, T)                                                                      \
  F(T, memoryOperationType, memory_op, "allocation or release (CUpti_ActivityMemoryOperationType)") \
  F(T, memoryKind, memory_kind, "memory kind (CUpti_ActivityMemoryKind)")                      \
  F(T, correlationId, correlation, "correlation id of the allocating API call")                \
  F(T, address, address, "virtual address of the allocation")                                  \
  F(T, bytes, bytes, "bytes allocated or released")                                            \
  F(T, timestamp, timestamp, "time of the operation, ns")                                      \
  F(T, PC, pc, "program counter of the call")                                                  \
  F(T, processId, pid, "process id")                                                           \
  F(T, deviceId, device, "device id")                                                          \
  F(T, contextId, context, "context id")                                                       \
  F(T, streamId, stream, "stream id, for stream-ordered allocations")                          \
  F(T, name, name, "variable name of the allocation, when known")                              \
  F(T, isAsync, async, "1 for a stream-ordered (async) operation")                             \
  F(T, memoryPoolConfig.memoryPoolType, pool_type, "pool type (CUpti_ActivityMemoryPoolType)") \
  F(T, memoryPoolConfig.address, pool_address, "base address of the pool")                     \
  F(T, memoryPoolConfig.releaseThreshold, pool_release_threshold, "pool release threshold, bytes") \
  F(T, memoryPoolConfig.pool.size, pool_size, "pool size, bytes (local pools)")                \
  F(T, memoryPoolConfig.pool.processId, pool_pid, "exporting process id (imported pools; same bytes as pool_size)") \
  F(T, memoryPoolConfig.utilizedSize, pool_utilized_size, "bytes of the pool in use")          \
  F(T, source, source, "allocating library, when known")
CM__DEFINE_FIELDS(CUpti_ActivityMemory4, CM__MEMORY4);

#define CM__MEMORYPOOL3(F, T)                                                                  \
  F(T, memoryPoolOperationType, pool_op, "create, destroy or trim (CUpti_ActivityMemoryPoolOperationType)") \
  F(T, memoryPoolType, pool_type, "pool type (CUpti_ActivityMemoryPoolType)")                  \
  F(T, correlationId, correlation, "correlation id of the API call")                           \
  F(T, processId, pid, "process id")                                                           \
  F(T, deviceId, device, "device id")                                                          \
  F(T, minBytesToKeep, min_bytes_to_keep, "bytes a trim keeps")                                \
  F(T, address, address, "base address of the pool")                                           \
  F(T, size, size, "pool size, bytes")                                                         \
  F(T, releaseThreshold, release_threshold, "release threshold, bytes")                        \
  F(T, timestamp, timestamp, "time of the operation, ns")                                      \
  F(T, utilizedSize, utilized_size, "bytes of the pool in use")                                \
  F(T, isManagedPool, managed_pool, "1 for a managed memory pool")
CM__DEFINE_FIELDS(CUpti_ActivityMemoryPool3, CM__MEMORYPOOL3);

#define CM__DEVICE5(F, T)                                                                      \
  F(T, flags, flags, "device flags (CUpti_ActivityFlag)")                                      \
  F(T, globalMemoryBandwidth, global_mem_bandwidth, "global memory bandwidth, KB/s")           \
  F(T, globalMemorySize, global_mem_size, "global memory size, bytes")                         \
  F(T, constantMemorySize, constant_mem_size, "constant memory size, bytes")                   \
  F(T, l2CacheSize, l2_cache_size, "L2 cache size, bytes")                                     \
  F(T, numThreadsPerWarp, threads_per_warp, "threads per warp")                                \
  F(T, coreClockRate, core_clock_rate, "core clock rate, kHz")                                 \
  F(T, numMemcpyEngines, memcpy_engines, "number of copy engines")                             \
  F(T, numMultiprocessors, multiprocessors, "number of multiprocessors")                       \
  F(T, maxIPC, max_ipc, "peak instructions per cycle")                                         \
  F(T, maxWarpsPerMultiprocessor, max_warps_per_sm, "most warps per multiprocessor")           \
  F(T, maxBlocksPerMultiprocessor, max_blocks_per_sm, "most blocks per multiprocessor")        \
  F(T, maxSharedMemoryPerMultiprocessor, max_smem_per_sm, "shared memory per multiprocessor, bytes") \
  F(T, maxRegistersPerMultiprocessor, max_regs_per_sm, "registers per multiprocessor")         \
  F(T, maxRegistersPerBlock, max_regs_per_block, "registers per block")                        \
  F(T, maxSharedMemoryPerBlock, max_smem_per_block, "shared memory per block, bytes")          \
  F(T, maxThreadsPerBlock, max_threads_per_block, "threads per block")                         \
  F(T, maxBlockDimX, max_block_x, "largest block size, x")                                     \
  F(T, maxBlockDimY, max_block_y, "largest block size, y")                                     \
  F(T, maxBlockDimZ, max_block_z, "largest block size, z")                                     \
  F(T, maxGridDimX, max_grid_x, "largest grid size, x")                                        \
  F(T, maxGridDimY, max_grid_y, "largest grid size, y")                                        \
  F(T, maxGridDimZ, max_grid_z, "largest grid size, z")                                        \
  F(T, computeCapabilityMajor, cc_major, "compute capability, major")                          \
  F(T, computeCapabilityMinor, cc_minor, "compute capability, minor")                          \
  F(T, id, device, "device id")                                                                \
  F(T, eccEnabled, ecc_enabled, "1 when ECC is enabled")                                       \
  F(T, name, name, "device name")                                                              \
  F(T, isCudaVisible, cuda_visible, "1 when CUDA_VISIBLE_DEVICES exposes the device")          \
  F(T, isMigEnabled, mig_enabled, "1 when MIG is enabled")                                     \
  F(T, gpuInstanceId, gpu_instance, "MIG GPU instance id")                                     \
  F(T, computeInstanceId, compute_instance, "MIG compute instance id")                         \
  F(T, isNumaNode, numa_node, "1 when the device memory is a NUMA node")                       \
  F(T, numaId, numa_id, "NUMA node id of the device memory")
CM__DEFINE_FIELDS(CUpti_ActivityDevice5, CM__DEVICE5);

#define CM__CONTEXT3(F, T)                                                                     \
  F(T, contextId, context, "context id")                                                       \
  F(T, deviceId, device, "device id")                                                          \
  F(T, computeApiKind, compute_api_kind, "API that created it (CUpti_ActivityComputeApiKind)") \
  F(T, nullStreamId, null_stream, "id of the context's NULL stream")                           \
  F(T, parentContextId, parent_context, "parent context id of a green context")                \
  F(T, isGreenContext, green_context, "1 for a green context")                                 \
  F(T, numMultiprocessors, multiprocessors, "multiprocessors of a green context")              \
  F(T, cigMode, cig_mode, "CUDA in graphics mode (CUpti_ContextCigMode)")
CM__DEFINE_FIELDS(CUpti_ActivityContext3, CM__CONTEXT3);

#define CM__NAME(F, T)                                                                         \
  F(T, objectKind, object_kind, "kind of object named (CUpti_ActivityObjectKind)")             \
  CM__OBJECT_ID(F, T)                                                                          \
  F(T, name, name, "the name given to the object")
CM__DEFINE_FIELDS(CUpti_ActivityName, CM__NAME);

#define CM__STREAM(F, T)                                                                       \
  F(T, contextId, context, "context id")                                                       \
  F(T, streamId, stream, "stream id")                                                          \
  F(T, priority, priority, "stream priority")                                                  \
  F(T, flag, flags, "stream flags (CUpti_ActivityStreamFlag)")                                 \
  F(T, correlationId, correlation, "correlation id of the stream-creating API call")
CM__DEFINE_FIELDS(CUpti_ActivityStream, CM__STREAM);

/* The data union of an environment record: each view is valid only for its env_kind. */
#define CM__ENVIRONMENT(F, T)                                                                  \
  F(T, deviceId, device, "device id")                                                          \
  F(T, timestamp, timestamp, "time of the sample, ns")                                         \
  F(T, environmentKind, env_kind, "which view is valid (CUpti_ActivityEnvironmentKind)")       \
  F(T, data.speed.smClock, sm_clock, "SM clock, MHz (env_kind speed)")                         \
  F(T, data.speed.memoryClock, memory_clock, "memory clock, MHz (env_kind speed)")             \
  F(T, data.speed.pcieLinkGen, pcie_link_gen, "PCIe link generation (env_kind speed)")         \
  F(T, data.speed.pcieLinkWidth, pcie_link_width, "PCIe link width, lanes (env_kind speed)")   \
  F(T, data.speed.clocksThrottleReasons, throttle_reasons,                                     \
    "clock throttle reason bits (env_kind speed)")                                             \
  F(T, data.temperature.gpuTemperature, gpu_temperature, "GPU temperature, C (env_kind temperature)") \
  F(T, data.power.power, power, "power draw, mW (env_kind power)")                             \
  F(T, data.power.powerLimit, power_limit, "power limit, mW (env_kind power)")                 \
  F(T, data.cooling.fanSpeed, fan_speed, "fan speed, percent of max (env_kind cooling)")
CM__DEFINE_FIELDS(CUpti_ActivityEnvironment, CM__ENVIRONMENT);

/* The engine's synthetic resource record (cm_internal.h), produced from RESOURCE callbacks. */
#define CM__RESOURCE(F, T)                                                                     \
  F(T, event, event, "the resource callback id (CUpti_CallbackIdResource)")                  \
  F(T, timestamp, timestamp, "time of the callback, CLOCK_REALTIME ns")                       \
  F(T, context, context, "the CUcontext handle")                                              \
  F(T, stream, stream, "the CUstream handle (stream events), else 0")                         \
  F(T, device, device, "device ordinal of the context (UINT32_MAX when unknown)")             \
  F(T, module_id, module_id, "module id (module events), else 0")                             \
  F(T, context_id, context_id, "context id from cuCtxGetId (0 when unknown)")                 \
  F(T, stream_id, stream_id, "stream id from cuStreamGetId (stream events; 0 when unknown)")  \
  F(T, tid, tid, "thread that made the call")
CM__DEFINE_FIELDS(cm__resource_record, CM__RESOURCE);

/* The engine's synthetic PM sampling record (cm_internal.h): one metric of one sample. */
#define CM__PM_SAMPLE(F, T)                                                                    \
  F(T, device, device, "the CUDA device ordinal")                                            \
  F(T, start, start, "the sample's start, CLOCK_REALTIME ns")                                \
  F(T, stop, stop, "the sample's end, CLOCK_REALTIME ns")                                    \
  F(T, metric, metric, "the metric's name")                                                  \
  F(T, sample, sample, "the sample's number on its device, from 0")                          \
  F(T, value, value, "the metric's value over the sample (its unit is the metric's)")
CM__DEFINE_FIELDS(cm__pm_record, CM__PM_SAMPLE);

/* ---- kinds -------------------------------------------------------------------------------- */

#define CM__NONE (-1)
#define CM__F(T, nm) CM__FID_##T##_##nm

/* The registry order: the order cm_kind_at() enumerates and error messages list. */
#define CM__KINDS(X)                                                                            \
  X(CONCURRENT_KERNEL, "concurrent_kernel", "kernel", CUpti_ActivityKernel10,                    \
    CM__F(CUpti_ActivityKernel10, start), CM__F(CUpti_ActivityKernel10, stop))                   \
  X(KERNEL, "kernel_serial", NULL, CUpti_ActivityKernel10, CM__F(CUpti_ActivityKernel10, start), \
    CM__F(CUpti_ActivityKernel10, stop))                                                         \
  X(MEMCPY, "memcpy", NULL, CUpti_ActivityMemcpy6, CM__F(CUpti_ActivityMemcpy6, start),          \
    CM__F(CUpti_ActivityMemcpy6, stop))                                                          \
  X(MEMCPY2, "memcpy2", "memcpy_p2p", CUpti_ActivityMemcpyPtoP4,                                 \
    CM__F(CUpti_ActivityMemcpyPtoP4, start), CM__F(CUpti_ActivityMemcpyPtoP4, stop))             \
  X(MEMSET, "memset", NULL, CUpti_ActivityMemset4, CM__F(CUpti_ActivityMemset4, start),          \
    CM__F(CUpti_ActivityMemset4, stop))                                                          \
  X(RUNTIME, "runtime", NULL, CUpti_ActivityAPI, CM__F(CUpti_ActivityAPI, start),                \
    CM__F(CUpti_ActivityAPI, stop))                                                              \
  X(DRIVER, "driver", NULL, CUpti_ActivityAPI, CM__F(CUpti_ActivityAPI, start),                  \
    CM__F(CUpti_ActivityAPI, stop))                                                              \
  X(SYNCHRONIZATION, "synchronization", "sync", CUpti_ActivitySynchronization2,                  \
    CM__F(CUpti_ActivitySynchronization2, start), CM__F(CUpti_ActivitySynchronization2, stop))   \
  X(CUDA_EVENT, "cuda_event", NULL, CUpti_ActivityCudaEvent2,                                    \
    CM__F(CUpti_ActivityCudaEvent2, device_timestamp), CM__NONE)                                 \
  X(EXTERNAL_CORRELATION, "external_correlation", NULL, CUpti_ActivityExternalCorrelation,       \
    CM__NONE, CM__NONE)                                                                          \
  X(MARKER, "marker", NULL, CUpti_ActivityMarker2, CM__F(CUpti_ActivityMarker2, timestamp),      \
    CM__NONE)                                                                                    \
  X(MARKER_DATA, "marker_data", NULL, CUpti_ActivityMarkerData2, CM__NONE, CM__NONE)             \
  X(OVERHEAD, "overhead", NULL, CUpti_ActivityOverhead3, CM__F(CUpti_ActivityOverhead3, start),  \
    CM__F(CUpti_ActivityOverhead3, stop))                                                        \
  X(GRAPH_TRACE, "graph_trace", NULL, CUpti_ActivityGraphTrace2,                                 \
    CM__F(CUpti_ActivityGraphTrace2, start), CM__F(CUpti_ActivityGraphTrace2, stop))             \
  X(MEMORY2, "memory2", NULL, CUpti_ActivityMemory4, CM__F(CUpti_ActivityMemory4, timestamp),    \
    CM__NONE)                                                                                    \
  X(MEMORY_POOL, "memory_pool", NULL, CUpti_ActivityMemoryPool3,                                 \
    CM__F(CUpti_ActivityMemoryPool3, timestamp), CM__NONE)                                       \
  X(DEVICE, "device", NULL, CUpti_ActivityDevice5, CM__NONE, CM__NONE)                           \
  X(CONTEXT, "context", NULL, CUpti_ActivityContext3, CM__NONE, CM__NONE)                        \
  X(NAME, "name", NULL, CUpti_ActivityName, CM__NONE, CM__NONE)                                  \
  X(STREAM, "stream", NULL, CUpti_ActivityStream, CM__NONE, CM__NONE)                            \
  X(ENVIRONMENT, "environment", NULL, CUpti_ActivityEnvironment,                                 \
    CM__F(CUpti_ActivityEnvironment, timestamp), CM__NONE)                                       \
  X(RESOURCE, "resource", NULL, cm__resource_record, CM__F(cm__resource_record, timestamp),       \
    CM__NONE)                                                                                    \
  X(PM_SAMPLE, "pm_sample", "pm", cm__pm_record, CM__F(cm__pm_record, start),                      \
    CM__F(cm__pm_record, stop))

#define CM__KIND_INDEX(K, nm, al, T, s, e) CM__KI_##K,
enum { CM__KINDS(CM__KIND_INDEX) CM__NKINDS };
#undef CM__KIND_INDEX

#define CM__KIND_DESC(K, nm, al, T, s, e)                                          \
  [CM__KI_##K] = {.kind = CM_KIND_##K,                                             \
                  .name = nm,                                                      \
                  .alias = al,                                                     \
                  .record = #T,                                                    \
                  .record_size = sizeof(T),                                        \
                  .nfields = (int)(sizeof fields_##T / sizeof fields_##T[0]),      \
                  .fields = fields_##T,                                            \
                  .start_field = (int16_t)(s),                                     \
                  .end_field = (int16_t)(e)},
static const cm__kind_desc kind_descs[CM__NKINDS] = {CM__KINDS(CM__KIND_DESC)};
#undef CM__KIND_DESC

/* Kind value to registry index plus one; 0 means the registry does not know the kind. */
#define CM__KIND_SLOT(K, nm, al, T, s, e) [CM_KIND_##K] = CM__KI_##K + 1,
static const uint8_t kind_slot[CM_KIND_MAX] = {CM__KINDS(CM__KIND_SLOT)};
#undef CM__KIND_SLOT

/* ---- lookups ------------------------------------------------------------------------------ */

const cm__kind_desc *cm__kind_desc_get(int kind) {
  if (kind < 0 || kind >= CM_KIND_MAX || kind_slot[kind] == 0) return NULL;
  return &kind_descs[kind_slot[kind] - 1];
}

const cm__kind_desc *cm__kind_descs(int *n) {
  if (n) *n = CM__NKINDS;
  return kind_descs;
}

/* Appends `s` to buf (which holds `*len` bytes), truncating at the buffer's end. */
static void append(char *buf, size_t cap, size_t *len, const char *s) {
  size_t n = strlen(s);
  if (*len + 1 >= cap) return;
  if (n > cap - 1 - *len) n = cap - 1 - *len;
  memcpy(buf + *len, s, n);
  *len += n;
  buf[*len] = '\0';
}

/* Writes "name (alias), name, ..." for every kind into buf. */
static void list_kinds(char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < CM__NKINDS; i++) {
    if (i) append(buf, cap, &len, ", ");
    append(buf, cap, &len, kind_descs[i].name);
    if (kind_descs[i].alias) {
      append(buf, cap, &len, " (");
      append(buf, cap, &len, kind_descs[i].alias);
      append(buf, cap, &len, ")");
    }
  }
}

/* Writes "name, name, ..." for every field of d into buf. */
static void list_fields(const cm__kind_desc *d, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < d->nfields; i++) {
    if (i) append(buf, cap, &len, ", ");
    append(buf, cap, &len, d->fields[i].name);
  }
}

/* Shared by the failing paths below: returns CM_ENOKIND with a detail that lists the kinds. */
static int unknown_kind_id(int kind) {
  char names[2048];
  list_kinds(names, sizeof names);
  return cm__seterr(CM_ENOKIND, "unknown activity kind %d; valid kinds: %s", kind, names);
}

const char *cm_kind_name(int kind) {
  const cm__kind_desc *d = cm__kind_desc_get(kind);
  return d ? d->name : NULL;
}

int cm_kind_by_name(const char *name) {
  if (name == NULL) {
    char names[2048];
    list_kinds(names, sizeof names);
    return cm__seterr(CM_ENOKIND, "no kind name given; valid kinds: %s", names);
  }
  for (int i = 0; i < CM__NKINDS; i++) {
    const cm__kind_desc *d = &kind_descs[i];
    if (strcmp(d->name, name) == 0 || (d->alias && strcmp(d->alias, name) == 0)) return d->kind;
  }
  char names[2048];
  list_kinds(names, sizeof names);
  return cm__seterr(CM_ENOKIND, "unknown kind '%.200s'; valid kinds: %s", name, names);
}

int cm_kind_count(void) { return CM__NKINDS; }

int cm_kind_at(int index) {
  if (index < 0 || index >= CM__NKINDS)
    return cm__seterr(CM_ERANGE, "kind index %d out of range 0..%d", index, CM__NKINDS - 1);
  return kind_descs[index].kind;
}

int cm_field_count(int kind) {
  const cm__kind_desc *d = cm__kind_desc_get(kind);
  if (!d) return unknown_kind_id(kind);
  return d->nfields;
}

int cm_field_info_get(int kind, int id, cm_field_info *out) {
  const cm__kind_desc *d = cm__kind_desc_get(kind);
  if (!d) return unknown_kind_id(kind);
  if (out == NULL) return cm__seterr(CM_EINVAL, "cm_field_info_get: out is NULL");
  if (id < 0 || id >= d->nfields)
    return cm__seterr(CM_ENOFIELD, "field id %d of kind %s out of range 0..%d", id, d->name,
                      d->nfields - 1);
  const cm__field *f = &d->fields[id];
  out->kind = d->kind;
  out->id = id;
  out->name = f->name;
  out->type = f->type;
  out->width = f->width;
  out->offset = f->offset;
  out->src_width = f->src_width;
  out->doc = f->doc;
  return 0;
}

int cm_field_by_name(int kind, const char *name) {
  const cm__kind_desc *d = cm__kind_desc_get(kind);
  if (!d) return unknown_kind_id(kind);
  if (name != NULL) {
    for (int i = 0; i < d->nfields; i++)
      if (strcmp(d->fields[i].name, name) == 0) return i;
  }
  char names[2048];
  list_fields(d, names, sizeof names);
  return cm__seterr(CM_ENOFIELD, "unknown field '%.200s' of kind %s; valid fields: %s",
                    name ? name : "(null)", d->name, names);
}
