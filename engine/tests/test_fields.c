/*
 * test_fields.c: the field registry and the error space.
 *
 * The registry's layouts are checked against the CUPTI 13.0 structs independently of the macros
 * that build it: records are filled through their real members and read back through the
 * registry's offsets. Field ids are pinned by a golden list per kind, because ids are part of
 * the wire format: inserting a field anywhere but the end of a kind must fail here.
 */
#include <pthread.h>
#include <regex.h>

#include "cm_internal.h"
#include "cmt.h"

/* Every kind the registry must know, with the struct it decodes and its frozen field names. */
static const struct {
  int kind;
  const char *name;
  const char *record;
  size_t size;
  const char *fields; /* the ids 0..n-1 in order; the registry may only append after them */
} expect[] = {
    {CM_KIND_CONCURRENT_KERNEL, "concurrent_kernel", "CUpti_ActivityKernel10",
     sizeof(CUpti_ActivityKernel10),
     "cache_config,shared_mem_config,registers,partitioned_cache_requested,"
     "partitioned_cache_executed,start,stop,completed,device,context,stream,grid_x,grid_y,grid_z,"
     "block_x,block_y,block_z,static_smem,dynamic_smem,local_mem_per_thread,local_mem_total,"
     "correlation,grid_id,name,queued,submitted,launch_type,carveout_requested_set,"
     "carveout_requested,shared_mem_executed,graph_node,shmem_limit_config,graph,channel,"
     "channel_type,cluster_x,cluster_y,cluster_z,cluster_scheduling_policy,local_mem_total_v2,"
     "max_potential_cluster_size,max_active_clusters,device_launched"},
    {CM_KIND_KERNEL, "kernel_serial", "CUpti_ActivityKernel10", sizeof(CUpti_ActivityKernel10),
     "cache_config,shared_mem_config,registers,partitioned_cache_requested,"
     "partitioned_cache_executed,start,stop,completed,device,context,stream,grid_x,grid_y,grid_z,"
     "block_x,block_y,block_z,static_smem,dynamic_smem,local_mem_per_thread,local_mem_total,"
     "correlation,grid_id,name,queued,submitted,launch_type,carveout_requested_set,"
     "carveout_requested,shared_mem_executed,graph_node,shmem_limit_config,graph,channel,"
     "channel_type,cluster_x,cluster_y,cluster_z,cluster_scheduling_policy,local_mem_total_v2,"
     "max_potential_cluster_size,max_active_clusters,device_launched"},
    {CM_KIND_MEMCPY, "memcpy", "CUpti_ActivityMemcpy6", sizeof(CUpti_ActivityMemcpy6),
     "copy_kind,src_kind,dst_kind,flags,bytes,start,stop,device,context,stream,correlation,"
     "runtime_correlation,graph_node,graph,channel,channel_type,device_launched,copy_count"},
    {CM_KIND_MEMCPY2, "memcpy2", "CUpti_ActivityMemcpyPtoP4", sizeof(CUpti_ActivityMemcpyPtoP4),
     "copy_kind,src_kind,dst_kind,flags,bytes,start,stop,device,context,stream,src_device,"
     "src_context,dst_device,dst_context,correlation,graph_node,graph,channel,channel_type"},
    {CM_KIND_MEMSET, "memset", "CUpti_ActivityMemset4", sizeof(CUpti_ActivityMemset4),
     "value,bytes,start,stop,device,context,stream,correlation,flags,memory_kind,graph_node,graph,"
     "channel,channel_type,device_launched"},
    {CM_KIND_RUNTIME, "runtime", "CUpti_ActivityAPI", sizeof(CUpti_ActivityAPI),
     "cbid,start,stop,pid,tid,correlation,return_value"},
    {CM_KIND_DRIVER, "driver", "CUpti_ActivityAPI", sizeof(CUpti_ActivityAPI),
     "cbid,start,stop,pid,tid,correlation,return_value"},
    {CM_KIND_SYNCHRONIZATION, "synchronization", "CUpti_ActivitySynchronization2",
     sizeof(CUpti_ActivitySynchronization2),
     "sync_type,start,stop,correlation,context,stream,event,event_sync_id,return_value"},
    {CM_KIND_CUDA_EVENT, "cuda_event", "CUpti_ActivityCudaEvent2",
     sizeof(CUpti_ActivityCudaEvent2),
     "correlation,context,stream,event,device,device_timestamp,event_sync_id"},
    {CM_KIND_EXTERNAL_CORRELATION, "external_correlation", "CUpti_ActivityExternalCorrelation",
     sizeof(CUpti_ActivityExternalCorrelation), "external_kind,external_id,correlation"},
    {CM_KIND_MARKER, "marker", "CUpti_ActivityMarker2", sizeof(CUpti_ActivityMarker2),
     "flags,timestamp,id,object_kind,pid,tid,device,context,stream,name,domain"},
    {CM_KIND_MARKER_DATA, "marker_data", "CUpti_ActivityMarkerData2",
     sizeof(CUpti_ActivityMarkerData2), "flags,id,payload_kind,payload,color,category,domain_id"},
    {CM_KIND_OVERHEAD, "overhead", "CUpti_ActivityOverhead3", sizeof(CUpti_ActivityOverhead3),
     "overhead_kind,object_kind,pid,tid,device,context,stream,start,stop,correlation"},
    {CM_KIND_GRAPH_TRACE, "graph_trace", "CUpti_ActivityGraphTrace2",
     sizeof(CUpti_ActivityGraphTrace2),
     "correlation,start,stop,device,graph,context,stream,end_device,end_context"},
    {CM_KIND_MEMORY2, "memory2", "CUpti_ActivityMemory4", sizeof(CUpti_ActivityMemory4),
     "memory_op,memory_kind,correlation,address,bytes,timestamp,pc,pid,device,context,stream,name,"
     "async,pool_type,pool_address,pool_release_threshold,pool_size,pool_pid,pool_utilized_size,"
     "source"},
    {CM_KIND_MEMORY_POOL, "memory_pool", "CUpti_ActivityMemoryPool3",
     sizeof(CUpti_ActivityMemoryPool3),
     "pool_op,pool_type,correlation,pid,device,min_bytes_to_keep,address,size,release_threshold,"
     "timestamp,utilized_size,managed_pool"},
    {CM_KIND_DEVICE, "device", "CUpti_ActivityDevice5", sizeof(CUpti_ActivityDevice5),
     "flags,global_mem_bandwidth,global_mem_size,constant_mem_size,l2_cache_size,threads_per_warp,"
     "core_clock_rate,memcpy_engines,multiprocessors,max_ipc,max_warps_per_sm,max_blocks_per_sm,"
     "max_smem_per_sm,max_regs_per_sm,max_regs_per_block,max_smem_per_block,"
     "max_threads_per_block,max_block_x,max_block_y,max_block_z,max_grid_x,max_grid_y,max_grid_z,"
     "cc_major,cc_minor,device,ecc_enabled,name,cuda_visible,mig_enabled,gpu_instance,"
     "compute_instance,numa_node,numa_id"},
    {CM_KIND_CONTEXT, "context", "CUpti_ActivityContext3", sizeof(CUpti_ActivityContext3),
     "context,device,compute_api_kind,null_stream,parent_context,green_context,multiprocessors,"
     "cig_mode"},
    {CM_KIND_NAME, "name", "CUpti_ActivityName", sizeof(CUpti_ActivityName),
     "object_kind,pid,tid,device,context,stream,name"},
    {CM_KIND_STREAM, "stream", "CUpti_ActivityStream", sizeof(CUpti_ActivityStream),
     "context,stream,priority,flags,correlation"},
    {CM_KIND_ENVIRONMENT, "environment", "CUpti_ActivityEnvironment",
     sizeof(CUpti_ActivityEnvironment),
     "device,timestamp,env_kind,sm_clock,memory_clock,pcie_link_gen,pcie_link_width,"
     "throttle_reasons,gpu_temperature,power,power_limit,fan_speed"},
    {CM_KIND_RESOURCE, "resource", "cm__resource_record", sizeof(cm__resource_record),
     "event,timestamp,context,stream,device,module_id,context_id,stream_id,tid"},
    {CM_KIND_PM_SAMPLE, "pm_sample", "cm__pm_record", sizeof(cm__pm_record),
     "device,start,stop,metric,sample,value"},
};
#define NEXPECT ((int)(sizeof expect / sizeof expect[0]))

/* Lua 5.1's reserved words, plus goto (reserved by LuaJIT 2 and Lua 5.2+). */
static const char *const lua_keywords[] = {
    "and",  "break", "do",   "else",   "elseif", "end",   "false", "for",   "function",
    "if",   "in",    "local", "nil",   "not",    "or",    "repeat", "return", "then",
    "true", "until", "while", "goto",
};

static int is_lua_keyword(const char *s) {
  for (size_t i = 0; i < sizeof lua_keywords / sizeof lua_keywords[0]; i++)
    if (strcmp(s, lua_keywords[i]) == 0) return 1;
  return 0;
}

/* The width a column of type t must have. */
static uint32_t type_width(int t) {
  switch (t) {
  case CM_TYPE_U8: case CM_TYPE_I8: return 1;
  case CM_TYPE_U16: case CM_TYPE_I16: return 2;
  case CM_TYPE_U32: case CM_TYPE_I32: case CM_TYPE_STR: return 4;
  case CM_TYPE_U64: case CM_TYPE_I64: case CM_TYPE_F64: return 8;
  default: return 0;
  }
}

/* The golden list's name number `id`, copied into buf; returns 0 past its end. */
static int golden_name(const char *list, int id, char *buf, size_t cap) {
  const char *p = list;
  for (int i = 0; i < id; i++) {
    p = strchr(p, ',');
    if (!p) return 0;
    p++;
  }
  size_t n = strcspn(p, ",");
  if (n == 0 || n >= cap) return 0;
  memcpy(buf, p, n);
  buf[n] = '\0';
  return 1;
}

static void test_kinds_and_layouts(void) {
  regex_t re;
  CMT_EQ(regcomp(&re, "^[a-z_][a-z0-9_]*$", REG_EXTENDED | REG_NOSUB), 0);

  CMT_EQ(cm_kind_count(), NEXPECT);
  int n = 0;
  const cm__kind_desc *descs = cm__kind_descs(&n);
  CMT_EQ(n, NEXPECT);

  for (int e = 0; e < NEXPECT; e++) {
    const cm__kind_desc *d = cm__kind_desc_get(expect[e].kind);
    if (!d) CMT_FAIL("kind %s (%d) missing from the registry", expect[e].name, expect[e].kind);
    CMT_EQ(d->kind, expect[e].kind);
    CMT_STREQ(d->name, expect[e].name);
    CMT_STREQ(d->record, expect[e].record);
    CMT_EQU(d->record_size, expect[e].size);
    CMT_STREQ(cm_kind_name(expect[e].kind), expect[e].name);
    CMT_EQ(cm_kind_by_name(expect[e].name), expect[e].kind);
    CMT_EQ(cm_field_count(expect[e].kind), d->nfields);
    CMT_GT(d->nfields, 0);
    CMT_LE(d->nfields, CM__MAX_FIELDS);
    CMT_ASSERT(regexec(&re, d->name, 0, NULL, 0) == 0);
    CMT_ASSERT(!is_lua_keyword(d->name));

    for (int i = 0; i < d->nfields; i++) {
      const cm__field *f = &d->fields[i];
      if (regexec(&re, f->name, 0, NULL, 0) != 0)
        CMT_FAIL("%s.%s is not a snake_case identifier", d->name, f->name);
      if (is_lua_keyword(f->name)) CMT_FAIL("%s.%s is a Lua keyword", d->name, f->name);
      if (strcmp(f->name, "kind") == 0) CMT_FAIL("%s exports the record's kind", d->name);
      char gold[64];
      if (!golden_name(expect[e].fields, i, gold, sizeof gold))
        CMT_FAIL("%s: field %d '%s' is not in the golden list; append it there", d->name, i,
                 f->name);
      if (strcmp(gold, f->name) != 0)
        CMT_FAIL("%s: field id %d is '%s', was '%s' (ids are stable; only append)", d->name, i,
                 f->name, gold);
      CMT_ASSERT(f->doc != NULL && f->doc[0] != '\0');
      CMT_LEU((uint64_t)f->offset + f->src_width, d->record_size);
      CMT_GE(f->offset, 4); /* bytes 0..3 are the record's kind */
      CMT_EQU(f->width, type_width(f->type));
      if (f->type == CM_TYPE_STR) {
        CMT_EQU(f->src_width, sizeof(const char *));
      } else {
        CMT_EQU(f->src_width, f->width);
      }
      CMT_EQ(f->offset % f->src_width, 0); /* CUPTI's members are naturally aligned */
      for (int j = 0; j < i; j++)
        if (strcmp(d->fields[j].name, f->name) == 0)
          CMT_FAIL("%s: duplicate field name '%s' (ids %d and %d)", d->name, f->name, j, i);

      cm_field_info fi;
      CMT_OK(cm_field_info_get(d->kind, i, &fi));
      CMT_EQ(fi.kind, d->kind);
      CMT_EQ(fi.id, i);
      CMT_STREQ(fi.name, f->name);
      CMT_EQ(fi.type, f->type);
      CMT_EQU(fi.width, f->width);
      CMT_EQU(fi.offset, f->offset);
      CMT_EQU(fi.src_width, f->src_width);
      CMT_STREQ(fi.doc, f->doc);
      CMT_EQ(cm_field_by_name(d->kind, f->name), i);
    }
    char gold[64];
    if (golden_name(expect[e].fields, d->nfields, gold, sizeof gold))
      CMT_FAIL("%s: golden field '%s' (id %d) missing from the registry", d->name, gold,
               d->nfields);

    /* Timestamp fields: a start field is "start" or a single timestamp; an end field is "stop"
     * and needs a start field. Both are 64-bit. */
    if (d->start_field >= 0) {
      CMT_LT(d->start_field, d->nfields);
      const char *sn = d->fields[d->start_field].name;
      CMT_ASSERT(strcmp(sn, "start") == 0 || strcmp(sn, "timestamp") == 0 ||
                 strcmp(sn, "device_timestamp") == 0);
      CMT_EQ(d->fields[d->start_field].type, CM_TYPE_U64);
    } else {
      CMT_EQ(d->start_field, -1);
      CMT_EQ(cm_field_by_name(d->kind, "start"), CM_ENOFIELD);
    }
    if (d->end_field >= 0) {
      CMT_GE(d->start_field, 0);
      CMT_LT(d->end_field, d->nfields);
      CMT_STREQ(d->fields[d->end_field].name, "stop");
      CMT_EQ(d->fields[d->end_field].type, CM_TYPE_U64);
    } else {
      CMT_EQ(d->end_field, -1);
      CMT_EQ(cm_field_by_name(d->kind, "stop"), CM_ENOFIELD);
    }
  }

  /* Registry order is what cm_kind_at enumerates; every entry is one of the expected kinds. */
  for (int i = 0; i < n; i++) {
    CMT_EQ(cm_kind_at(i), descs[i].kind);
    CMT_ASSERT(cm__kind_desc_get(descs[i].kind) == &descs[i]);
    for (int j = 0; j < i; j++) CMT_NE(descs[j].kind, descs[i].kind);
  }
  regfree(&re);
}

/* Reads field `name` of `kind` out of `rec` through the registry, widened to 64 bits. */
static uint64_t read_field(int kind, const void *rec, const char *name) {
  int id = cm_field_by_name(kind, name);
  if (id < 0) CMT_FAIL("field %s of kind %d: %s", name, kind, cm_errmsg());
  cm_field_info fi;
  CMT_OK(cm_field_info_get(kind, id, &fi));
  const uint8_t *p = (const uint8_t *)rec + fi.offset;
  switch (fi.src_width) {
  case 1: return *p;
  case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
  case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
  case 8: { uint64_t v; memcpy(&v, p, 8); return v; }
  default: CMT_FAIL("bad src_width %u", fi.src_width);
  }
  return 0;
}

static int field_type(int kind, const char *name) {
  cm_field_info fi;
  CMT_OK(cm_field_info_get(kind, cm_field_by_name(kind, name), &fi));
  return fi.type;
}

/* Fills records through their real members and reads them back through the registry. */
static void test_records_round_trip(void) {
  static const char kname[] = "_Z6kernelPf";
  CUpti_ActivityKernel10 k;
  memset(&k, 0, sizeof k);
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.cacheConfig.both = 0x21;
  k.registersPerThread = 77;
  k.start = 1000000000000000001ull;
  k.end = 1000000000000000999ull;
  k.deviceId = 3;
  k.contextId = 4;
  k.streamId = 5;
  k.gridX = -7;
  k.blockZ = 9;
  k.dynamicSharedMemory = 4096;
  k.correlationId = 1234;
  k.gridId = -42;
  k.name = kname;
  k.queued = 11;
  k.submitted = 12;
  k.graphNodeId = 0x1122334455667788ull;
  k.channelType = CUPTI_CHANNEL_TYPE_ASYNC_MEMCPY;
  k.localMemoryTotal_v2 = 1ull << 40;
  k.isDeviceLaunched = 1;
  int ck = CM_KIND_CONCURRENT_KERNEL;
  CMT_EQU(read_field(ck, &k, "cache_config"), 0x21);
  CMT_EQU(read_field(ck, &k, "registers"), 77);
  CMT_EQU(read_field(ck, &k, "start"), k.start);
  CMT_EQU(read_field(ck, &k, "stop"), k.end);
  CMT_EQU(read_field(ck, &k, "device"), 3);
  CMT_EQU(read_field(ck, &k, "context"), 4);
  CMT_EQU(read_field(ck, &k, "stream"), 5);
  CMT_EQ((int32_t)read_field(ck, &k, "grid_x"), -7);
  CMT_EQ(field_type(ck, "grid_x"), CM_TYPE_I32);
  CMT_EQU(read_field(ck, &k, "block_z"), 9);
  CMT_EQU(read_field(ck, &k, "dynamic_smem"), 4096);
  CMT_EQU(read_field(ck, &k, "correlation"), 1234);
  CMT_EQ((int64_t)read_field(ck, &k, "grid_id"), -42);
  CMT_EQ(field_type(ck, "grid_id"), CM_TYPE_I64);
  CMT_EQU(read_field(ck, &k, "name"), (uint64_t)(uintptr_t)kname);
  CMT_EQ(field_type(ck, "name"), CM_TYPE_STR);
  CMT_EQU(read_field(ck, &k, "queued"), 11);
  CMT_EQU(read_field(ck, &k, "submitted"), 12);
  CMT_EQU(read_field(ck, &k, "graph_node"), 0x1122334455667788ull);
  CMT_EQU(read_field(ck, &k, "channel_type"), CUPTI_CHANNEL_TYPE_ASYNC_MEMCPY);
  CMT_EQU(read_field(ck, &k, "local_mem_total_v2"), 1ull << 40);
  CMT_EQU(read_field(ck, &k, "device_launched"), 1);

  CUpti_ActivityMemcpy6 m;
  memset(&m, 0, sizeof m);
  m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  m.dstKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  m.bytes = 1ull << 33;
  m.start = 5;
  m.end = 6;
  m.runtimeCorrelationId = 99;
  m.copyCount = 3;
  CMT_EQU(read_field(CM_KIND_MEMCPY, &m, "copy_kind"), CUPTI_ACTIVITY_MEMCPY_KIND_HTOD);
  CMT_EQU(read_field(CM_KIND_MEMCPY, &m, "dst_kind"), CUPTI_ACTIVITY_MEMORY_KIND_DEVICE);
  CMT_EQU(read_field(CM_KIND_MEMCPY, &m, "bytes"), 1ull << 33);
  CMT_EQU(read_field(CM_KIND_MEMCPY, &m, "stop"), 6);
  CMT_EQU(read_field(CM_KIND_MEMCPY, &m, "runtime_correlation"), 99);
  CMT_EQU(read_field(CM_KIND_MEMCPY, &m, "copy_count"), 3);

  CUpti_ActivityMemset4 ms;
  memset(&ms, 0, sizeof ms);
  ms.flags = 0xbeef;
  ms.memoryKind = 0x1234;
  CMT_EQU(read_field(CM_KIND_MEMSET, &ms, "flags"), 0xbeef);
  CMT_EQ(field_type(CM_KIND_MEMSET, "flags"), CM_TYPE_U16);
  CMT_EQU(read_field(CM_KIND_MEMSET, &ms, "memory_kind"), 0x1234);

  CUpti_ActivityAPI a;
  memset(&a, 0, sizeof a);
  a.cbid = 211;
  a.threadId = 4242;
  a.returnValue = 2;
  CMT_EQU(read_field(CM_KIND_RUNTIME, &a, "cbid"), 211);
  CMT_EQU(read_field(CM_KIND_DRIVER, &a, "tid"), 4242);
  CMT_EQU(read_field(CM_KIND_DRIVER, &a, "return_value"), 2);

  /* The union views read the bytes their member would. */
  static const char mname[] = "step", dom[] = "torch";
  CUpti_ActivityMarker2 mk;
  memset(&mk, 0, sizeof mk);
  mk.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
  mk.objectId.pt.processId = 100;
  mk.objectId.pt.threadId = 101;
  mk.name = mname;
  mk.domain = dom;
  CMT_EQU(read_field(CM_KIND_MARKER, &mk, "pid"), 100);
  CMT_EQU(read_field(CM_KIND_MARKER, &mk, "tid"), 101);
  CMT_EQU(read_field(CM_KIND_MARKER, &mk, "name"), (uint64_t)(uintptr_t)mname);
  CMT_EQU(read_field(CM_KIND_MARKER, &mk, "domain"), (uint64_t)(uintptr_t)dom);
  mk.objectId.dcs.streamId = 55;
  CMT_EQU(read_field(CM_KIND_MARKER, &mk, "stream"), 55);

  CUpti_ActivityEnvironment env;
  memset(&env, 0, sizeof env);
  env.environmentKind = CUPTI_ACTIVITY_ENVIRONMENT_POWER;
  env.data.power.power = 250000;
  env.data.power.powerLimit = 700000;
  CMT_EQU(read_field(CM_KIND_ENVIRONMENT, &env, "power"), 250000);
  CMT_EQU(read_field(CM_KIND_ENVIRONMENT, &env, "power_limit"), 700000);
  env.data.speed.clocksThrottleReasons = CUPTI_CLOCKS_THROTTLE_REASON_UNKNOWN;
  CMT_EQU(read_field(CM_KIND_ENVIRONMENT, &env, "throttle_reasons"), 0x80000000u);

  CUpti_ActivityMemory4 mem;
  memset(&mem, 0, sizeof mem);
  mem.memoryPoolConfig.releaseThreshold = 77777;
  mem.memoryPoolConfig.pool.size = 1ull << 36;
  mem.memoryPoolConfig.utilizedSize = 31;
  mem.source = dom;
  CMT_EQU(read_field(CM_KIND_MEMORY2, &mem, "pool_release_threshold"), 77777);
  CMT_EQU(read_field(CM_KIND_MEMORY2, &mem, "pool_size"), 1ull << 36);
  CMT_EQU(read_field(CM_KIND_MEMORY2, &mem, "pool_utilized_size"), 31);
  CMT_EQU(read_field(CM_KIND_MEMORY2, &mem, "source"), (uint64_t)(uintptr_t)dom);

  CUpti_ActivityDevice5 dev;
  memset(&dev, 0, sizeof dev);
  dev.id = 6;
  dev.computeCapabilityMajor = 9;
  dev.numaId = 2;
  CMT_EQU(read_field(CM_KIND_DEVICE, &dev, "device"), 6);
  CMT_EQU(read_field(CM_KIND_DEVICE, &dev, "cc_major"), 9);
  CMT_EQU(read_field(CM_KIND_DEVICE, &dev, "numa_id"), 2);

  CUpti_ActivitySynchronization2 sy;
  memset(&sy, 0, sizeof sy);
  sy.end = 123456789;
  sy.cudaEventSyncId = 8;
  CMT_EQU(read_field(CM_KIND_SYNCHRONIZATION, &sy, "stop"), 123456789);
  CMT_EQU(read_field(CM_KIND_SYNCHRONIZATION, &sy, "event_sync_id"), 8);
}

static void test_lookups(void) {
  CMT_EQ(cm_kind_by_name("kernel"), CM_KIND_CONCURRENT_KERNEL);
  CMT_EQ(cm_kind_by_name("concurrent_kernel"), CM_KIND_CONCURRENT_KERNEL);
  CMT_EQ(cm_kind_by_name("kernel_serial"), CM_KIND_KERNEL);
  CMT_EQ(cm_kind_by_name("memcpy_p2p"), CM_KIND_MEMCPY2);
  CMT_EQ(cm_kind_by_name("memcpy2"), CM_KIND_MEMCPY2);
  CMT_EQ(cm_kind_by_name("sync"), CM_KIND_SYNCHRONIZATION);
  CMT_EQ(cm_kind_by_name("runtime"), CM_KIND_RUNTIME);
  CMT_EQ(cm_kind_by_name("driver"), CM_KIND_DRIVER);

  /* Case-sensitive; the detail names the bad name and every valid name and alias. */
  cm__clearerr();
  CMT_EQ(cm_kind_by_name("Kernel"), CM_ENOKIND);
  CMT_CONTAINS(cm_errmsg(), "unknown kind 'Kernel'");
  CMT_CONTAINS(cm_errmsg(), "valid kinds: concurrent_kernel (kernel), kernel_serial, memcpy");
  for (int e = 0; e < NEXPECT; e++) CMT_CONTAINS(cm_errmsg(), expect[e].name);
  CMT_CONTAINS(cm_errmsg(), "memcpy_p2p");
  CMT_CONTAINS(cm_errmsg(), "(sync)");
  CMT_EQ(cm_kind_by_name("Memcpy"), CM_ENOKIND);
  CMT_EQ(cm_kind_by_name("SYNC"), CM_ENOKIND);
  CMT_EQ(cm_kind_by_name(""), CM_ENOKIND);
  CMT_EQ(cm_kind_by_name(NULL), CM_ENOKIND);
  CMT_CONTAINS(cm_errmsg(), "valid kinds:");

  /* Unknown numeric kinds. */
  static const int bad_kinds[] = {-1, 0, 6, 7, 63, 64, 1000};
  for (size_t i = 0; i < sizeof bad_kinds / sizeof bad_kinds[0]; i++) {
    int k = bad_kinds[i];
    CMT_ASSERT(cm_kind_name(k) == NULL);
    CMT_ASSERT(cm__kind_desc_get(k) == NULL);
    cm__clearerr();
    CMT_EQ(cm_field_count(k), CM_ENOKIND);
    CMT_CONTAINS(cm_errmsg(), "unknown activity kind");
    CMT_CONTAINS(cm_errmsg(), "concurrent_kernel");
    cm_field_info fi;
    CMT_EQ(cm_field_info_get(k, 0, &fi), CM_ENOKIND);
    CMT_EQ(cm_field_by_name(k, "start"), CM_ENOKIND);
  }
  CMT_EQ(cm_kind_at(-1), CM_ERANGE);
  CMT_EQ(cm_kind_at(cm_kind_count()), CM_ERANGE);

  /* Unknown fields: the detail names the field, the kind and every valid field. */
  int ck = CM_KIND_CONCURRENT_KERNEL;
  CMT_EQ(cm_field_by_name(ck, "strt"), CM_ENOFIELD);
  CMT_CONTAINS(cm_errmsg(),
               "unknown field 'strt' of kind concurrent_kernel; valid fields: cache_config, "
               "shared_mem_config, registers,");
  const cm__kind_desc *d = cm__kind_desc_get(ck);
  for (int i = 0; i < d->nfields; i++) CMT_CONTAINS(cm_errmsg(), d->fields[i].name);
  CMT_EQ(cm_field_by_name(ck, "end"), CM_ENOFIELD);
  CMT_EQ(cm_field_by_name(ck, "Start"), CM_ENOFIELD);
  CMT_EQ(cm_field_by_name(ck, "kind"), CM_ENOFIELD);
  CMT_EQ(cm_field_by_name(ck, NULL), CM_ENOFIELD);
  CMT_EQ(cm_field_by_name(CM_KIND_MEMCPY, "name"), CM_ENOFIELD);
  CMT_CONTAINS(cm_errmsg(), "of kind memcpy; valid fields: copy_kind, src_kind");

  cm_field_info fi;
  CMT_EQ(cm_field_info_get(ck, -1, &fi), CM_ENOFIELD);
  CMT_EQ(cm_field_info_get(ck, d->nfields, &fi), CM_ENOFIELD);
  CMT_CONTAINS(cm_errmsg(), "out of range");
  CMT_EQ(cm_field_info_get(ck, 0, NULL), CM_EINVAL);

  /* The two kernel kinds share a layout; the serialized one has no alias. */
  CMT_EQ(cm_field_count(CM_KIND_KERNEL), cm_field_count(CM_KIND_CONCURRENT_KERNEL));
  CMT_ASSERT(cm__kind_desc_get(CM_KIND_KERNEL)->alias == NULL);
}

static void *other_thread(void *arg) {
  (void)arg;
  /* A fresh thread has no detail, and its failures do not touch the main thread's. */
  if (cm_errmsg()[0] != '\0') return (void *)1;
  cm_kind_by_name("nope_in_thread");
  return NULL;
}

static void test_errors(void) {
  CMT_STREQ(cm_version(), "0.1.0");
  CMT_STREQ(cm_err_name(CM_EINVAL), "EINVAL");
  CMT_STREQ(cm_err_name(CM_ENOFIELD), "ENOFIELD");
  CMT_STREQ(cm_err_name(CM_ERANGE), "ERANGE");
  CMT_STREQ(cm_strerror(CM_ENOKIND), "unknown activity kind");
  CMT_STREQ(cm_strerror(CM_OK), "success");
  CMT_STREQ(cm_err_name(CM_OK), "OK");
  for (int e = -1; e > CM_ERRNO_LAST; e--) {
    CMT_ASSERT(strcmp(cm_strerror(e), "unknown error") != 0);
    CMT_ASSERT(strcmp(cm_err_name(e), "UNKNOWN") != 0);
    for (int f = -1; f > e; f--) CMT_ASSERT(strcmp(cm_err_name(e), cm_err_name(f)) != 0);
  }
  static const int unknown[] = {CM_ERRNO_LAST, -999, 1, 77};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    CMT_STREQ(cm_strerror(unknown[i]), "unknown error");
    CMT_STREQ(cm_err_name(unknown[i]), "UNKNOWN");
  }

  cm__clearerr();
  CMT_STREQ(cm_errmsg(), "");
  CMT_EQ(cm__seterr(CM_EIO, "disk %d on fire", 3), CM_EIO);
  CMT_STREQ(cm_errmsg(), "disk 3 on fire");
  /* The current detail may be an argument of the next one. */
  CMT_EQ(cm__seterr(CM_EIO, "outer: %s", cm_errmsg()), CM_EIO);
  CMT_STREQ(cm_errmsg(), "outer: disk 3 on fire");
  cm__clearerr();
  CMT_STREQ(cm_errmsg(), "");

  /* A detail longer than the buffer is cut, marked, and stays NUL-terminated. */
  char big[6000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  CMT_EQ(cm__seterr(CM_EINVAL, "%s", big), CM_EINVAL);
  size_t len = strlen(cm_errmsg());
  CMT_EQU(len, 4095);
  CMT_STREQ(cm_errmsg() + len - 3, "...");

  cm__seterr(CM_EIO, "main thread detail");
  pthread_t t;
  void *res = (void *)2;
  CMT_EQ(pthread_create(&t, NULL, other_thread, NULL), 0);
  CMT_EQ(pthread_join(t, &res), 0);
  CMT_ASSERT(res == NULL);
  CMT_STREQ(cm_errmsg(), "main thread detail");
}

int main(void) {
  test_kinds_and_layouts();
  test_records_round_trip();
  test_lookups();
  test_errors();
  printf("test_fields: ok\n");
  return 0;
}
