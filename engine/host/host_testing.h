/*
 * host_testing.h: test-only hooks, built into libcuptimon_testing.so for the specs and never into
 * libcuptimon, the host library or cuptimon-lua. spec/testing.lua declares them for the FFI, and
 * spec/cdef_spec.lua checks that declaration against this header.
 */
#ifndef CM_HOST_TESTING_H
#define CM_HOST_TESTING_H

#include "cuptimon.h"

#ifdef __cplusplus
extern "C" {
#endif

/* sizeof and offsetof of the public structs as the C compiler laid them out, for the spec that
 * checks the Lua cdefs: `what` is "cm_batch", "cm_batch.cols", ... Returns -1 for an unknown name.
 * Thread-safe. */
CM_EXTERN long cm_testing_layout(const char *what);

#ifdef __cplusplus
}
#endif

#endif /* CM_HOST_TESTING_H */
