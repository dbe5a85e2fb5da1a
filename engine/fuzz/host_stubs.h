/*
 * host_stubs.h: a minimal stand-in for the Lua host, so that the monitor's frame handling
 * (engine/monitor/wsrc.c) and capture replay (replay.c) can be linked without LuaJIT: by
 * the fuzz targets, their regression drivers and the monitor's input tests. Test code only;
 * production links the real host (engine/host).
 *
 * Design note. The stubs implement the host calls those files make (cuptimon_host.h's and
 * engine/host/host_source.h's): cm_host_add_source applies the stub observers (stub_host_observe)
 * to the source as the real host does, cm_host_deliver checks what an observer receives and reads
 * every byte of it (every column element, and every string a STR column names, through the source's
 * string callback), cm_host_remove_source runs the source's describe callback (with the Lua calls
 * stubbed to no-ops), unobserves and frees it, and cm_host_exit_requested says no. The delivery
 * checks are the monitor's contracts: a column's type is one this version knows, every column is
 * one the observer selected, and no selected field is missing. A broken contract aborts, which the
 * fuzzer reports as a crash.
 */
#ifndef CM_HOST_STUBS_H
#define CM_HOST_STUBS_H

#include <stdint.h>

#include "cuptimon.h"
#include "cuptimon_host.h"
#include "host_source.h"

enum { STUB_MAX_OBS = 8 };

/* Errors the sources reported through cm__host_error (a failed PM entry). The stubs of
 * cm__host_error and cm__host_observer_bound are declared by host_source.h, the interface the
 * real host offers its sources. */
extern uint64_t stub_errors;

typedef struct stub_obs {
  uint32_t id;
  cm_selection *sel;
  uint64_t batches, records, columns;
} stub_obs;

extern stub_obs stub_obs_tab[STUB_MAX_OBS];
extern int stub_nobs;
/* The host handle to pass where a cm_host is expected. */
extern cm_host *stub_host;

/* Adds an observer with the selection `spec` (cm_selection_parse's text form); returns its index
 * in stub_obs_tab, or -1. Sources attached later get it. */
int stub_host_observe(const char *spec);
/* Detaches and frees the sources still attached (as the real host does at shutdown), then drops
 * the observers and their counts. */
void stub_host_reset(void);

#endif /* CM_HOST_STUBS_H */
