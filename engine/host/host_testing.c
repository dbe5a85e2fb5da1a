/*
 * host_testing.c: the test-only hooks of host_testing.h, built as libcuptimon_testing.so.
 *
 * Design note. The Lua side declares the public structs again for the FFI (lua/cuptimon/cdef.lua);
 * a layout the C compiler disagrees with would make Lua read the wrong bytes silently. This file
 * reports the compiler's own sizes and offsets, so spec/cdef_spec.lua can compare them with
 * ffi.sizeof and ffi.offsetof. It lives outside the production libraries, which export only the
 * public API.
 */
#include <stddef.h>
#include <string.h>

#include "cuptimon.h"
#include "host_testing.h"

long cm_testing_layout(const char *what) {
#define L_(name, value) \
  if (strcmp(what, name) == 0) return (long)(value);
  L_("cm_field_info", sizeof(cm_field_info));
  L_("cm_field_info.name", offsetof(cm_field_info, name));
  L_("cm_field_info.type", offsetof(cm_field_info, type));
  L_("cm_field_info.offset", offsetof(cm_field_info, offset));
  L_("cm_field_info.doc", offsetof(cm_field_info, doc));
  L_("cm_column", sizeof(cm_column));
  L_("cm_column.field", offsetof(cm_column, field));
  L_("cm_column.type", offsetof(cm_column, type));
  L_("cm_column.width", offsetof(cm_column, width));
  L_("cm_column.name", offsetof(cm_column, name));
  L_("cm_column.data", offsetof(cm_column, data));
  L_("cm_batch", sizeof(cm_batch));
  L_("cm_batch.kind", offsetof(cm_batch, kind));
  L_("cm_batch.n", offsetof(cm_batch, n));
  L_("cm_batch.ncols", offsetof(cm_batch, ncols));
  L_("cm_batch.cols", offsetof(cm_batch, cols));
  L_("cm_batch.seq", offsetof(cm_batch, seq));
  L_("cm_config", sizeof(cm_config));
  L_("cm_config.deliver_ms", offsetof(cm_config, deliver_ms));
  L_("cm_config.flags", offsetof(cm_config, flags));
  L_("cm_stats", sizeof(cm_stats));
  L_("cm_stats.sessions", offsetof(cm_stats, sessions));
  L_("cm_stats.strings", offsetof(cm_stats, strings));
  L_("cm_stats.records_by_kind", offsetof(cm_stats, records_by_kind));
  L_("cm_stats.lag_decode_ns", offsetof(cm_stats, lag_decode_ns));
  L_("cm_stats.send_wait_peak_ns", offsetof(cm_stats, send_wait_peak_ns));
  L_("cm_session_info", sizeof(cm_session_info));
  L_("cm_session_info.clock_offset_ns", offsetof(cm_session_info, clock_offset_ns));
  L_("cm_session_info.cupti_path", offsetof(cm_session_info, cupti_path));
#undef L_
  return -1;
}
