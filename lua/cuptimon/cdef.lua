-- cuptimon.cdef: the FFI declarations of engine/include/cuptimon.h and cuptimon_host.h.
--
-- Design note. The declarations are copied from the headers with the comments (and CM_EXTERN)
-- stripped, and spec/cdef_spec.lua checks them against the headers (field lists by parsing the
-- header text, sizes and offsets through the test-only libcuptimon_testing.so). Functions that can deliver batches (cm_observe,
-- cm_unobserve, cm_flush, cm_engine_new/free) are deliberately NOT declared: delivering runs
-- observer callbacks, and LuaJIT cannot re-enter Lua from inside an FFI call. The host reaches
-- them from lua_CFunctions (the cuptimon.core module) instead. Everything declared here is safe to
-- call from Lua at any time on the loop thread. Loading the module twice is harmless: the cdef
-- runs once per lua_State.
local ffi = require "ffi"

local M = {}

M.source = [[
typedef enum cm_errno {
  CM_OK = 0,
  CM_EINVAL = -1, CM_ENOMEM = -2, CM_ENOKIND = -3, CM_ENOFIELD = -4, CM_ENOCUPTI = -5,
  CM_ECUPTI = -6, CM_EBUSY = -7, CM_ETIMEDOUT = -8, CM_ENOENT = -9, CM_ESTATE = -10,
  CM_ENOSYS = -11, CM_ECLOCK = -12, CM_EAGAIN = -13, CM_EIO = -14, CM_ERANGE = -15,
  CM_EPERM = -16, CM_ERRNO_LAST = -17
} cm_errno;

const char *cm_strerror(int err);
const char *cm_err_name(int err);
const char *cm_errmsg(void);

typedef enum cm_type {
  CM_TYPE_U8 = 1, CM_TYPE_U16 = 2, CM_TYPE_U32 = 3, CM_TYPE_U64 = 4, CM_TYPE_I32 = 5,
  CM_TYPE_I64 = 6, CM_TYPE_STR = 7, CM_TYPE_I8 = 8, CM_TYPE_I16 = 9, CM_TYPE_F64 = 10
} cm_type;

typedef struct cm_field_info {
  int32_t kind;
  int32_t id;
  const char *name;
  int32_t type;
  uint32_t width;
  uint32_t offset;
  uint32_t src_width;
  const char *doc;
} cm_field_info;

const char *cm_kind_name(int kind);
int cm_kind_by_name(const char *name);
int cm_kind_count(void);
int cm_kind_at(int index);
int cm_field_count(int kind);
int cm_field_info_get(int kind, int id, cm_field_info *out);
int cm_field_by_name(int kind, const char *name);

typedef struct cm_selection cm_selection;
int cm_selection_new(cm_selection **out);
void cm_selection_free(cm_selection *sel);
int cm_selection_parse(cm_selection *sel, const char *spec);

typedef struct cm_column {
  int32_t field;
  int32_t type;
  uint32_t width;
  uint32_t reserved;
  const char *name;
  const void *data;
} cm_column;

typedef struct cm_batch {
  int32_t kind;
  uint32_t n;
  uint32_t ncols;
  uint32_t reserved;
  const cm_column *cols;
  uint64_t seq;
} cm_batch;

const cm_column *cm_batch_column(const cm_batch *b, int field);

typedef struct cm_config {
  uint32_t buffer_size;
  uint32_t pool_max_buffers;
  uint32_t warn_outstanding;
  uint32_t self_flush_ms;
  uint32_t deliver_ms;
  uint32_t fence_timeout_ms;
  uint32_t batch_records;
  uint32_t flags;
} cm_config;

typedef struct cm_stats {
  uint64_t buffers_allocated;
  uint64_t buffers_outstanding;
  uint64_t buffers_free;
  uint64_t buffers_decoded;
  uint64_t buffers_refused;
  uint64_t bytes_decoded;
  uint64_t records_decoded;
  uint64_t records_delivered;
  uint64_t records_dropped;
  uint64_t decode_queue_depth;
  uint64_t decode_queue_peak;
  uint64_t drains;
  uint64_t fences;
  uint64_t fence_timeouts;
  uint64_t sessions;
  uint64_t strings;
  uint64_t records_by_kind[64];
  uint64_t lag_cupti_ns;
  uint64_t lag_decode_ns;
  uint64_t lag_decode_peak_ns;
  uint64_t decode_wait_ns;
  uint64_t lag_recv_ns;
  uint64_t lag_recv_peak_ns;
  uint64_t backlog_records;
  uint64_t send_wait_ns;
  uint64_t send_wait_peak_ns;
  uint64_t guard_shed;
  uint64_t guard_lag_ns;
  uint64_t lag_held_ns;
  uint64_t cupti_detaches;
  uint64_t cupti_detach_ns;
  uint64_t cupti_attach_ns;
  uint64_t kind_changes;
  uint64_t kind_change_ns;
  uint64_t kind_change_max_ns;
  uint64_t cupti_idle_mode;
} cm_stats;

typedef struct cm_session_info {
  uint32_t cupti_version;
  int32_t clock_realtime;
  int32_t active;
  int32_t timestamp_callback;
  int64_t clock_offset_ns;
  uint64_t session_start_ns;
  char cupti_path[512];
} cm_session_info;

const char *cm_version(void);

uint64_t cm_corr_push(void);
int cm_corr_push_id(uint64_t id);
int cm_corr_pop(uint64_t *id);
uint64_t cm_corr_current(void);
int cm_corr_depth(void);
int cm_corr_chain(uint64_t id, uint64_t *out, int max);
int cm_corr_join(const uint32_t *ec_kind, const uint64_t *ec_external_id,
                 const uint32_t *ec_correlation, uint32_t n_ec,
                 const uint32_t *correlation, uint32_t n, uint64_t *external_out);
int64_t cm_corr_join_chains(const uint32_t *ec_kind, const uint64_t *ec_external_id,
                            const uint32_t *ec_correlation, uint32_t n_ec,
                            const uint32_t *correlation, uint32_t n, uint32_t *offsets,
                            uint64_t *ids, uint32_t cap_ids);
int cm_corr_metadata_put(uint64_t id, const char *json, size_t len);
int cm_corr_metadata_take(char **json_out, size_t *len_out);
void cm_free(void *p);

typedef struct cm_host cm_host;
const char *cm_host_source_string(cm_host *h, int source, uint32_t id, size_t *len);
const char *cm_host_text(cm_host *h, const char *s, size_t len, size_t *out_len);
int cm_host_source_stats(cm_host *h, int source, cm_stats *out);
]]

-- Structs checked by spec/cdef_spec.lua, in header order.
M.structs = { "cm_field_info", "cm_column", "cm_batch", "cm_config", "cm_stats", "cm_session_info" }

if not pcall(ffi.typeof, "cm_batch") then
  ffi.cdef(M.source)
end

return M
