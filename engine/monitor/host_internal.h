/*
 * host_internal.h: what the Lua host (host.c) offers the sources built into it, here the
 * in-process engine source (inproc.c), beyond the public cuptimon_host.h.
 *
 * Design note. These calls let a source take part in the host's rules without seeing its Lua
 * state: a source never includes lua.h. Loop thread only, like everything in the host.
 */
#ifndef CM_HOST_INTERNAL_H
#define CM_HOST_INTERNAL_H

#include <stdint.h>

#include "cuptimon_host.h"

/* Whether a batch is being dispatched into Lua (a nested uv_run inside an observer callback):
 * a source must not start a delivery then. */
int cm__host_in_dispatch(const cm_host *h);
/* Reports a runtime failure of the source (`where` names it, `msg` says what happened) through
 * the host's one reporting path: the script's "error" hooks, the error count, stderr. */
void cm__host_error(cm_host *h, const char *where, const char *msg);
/* The cadences the script asked for with cuptimon.configure (0 when it did not). */
void cm__host_cadence(const cm_host *h, uint32_t *flush_ms, uint32_t *deliver_ms);

struct cm__apicb;

/* Subscriber callbacks (apicb.h): events are waiting; the host takes them into Lua (the script's
 * "api" event). Called from the queue's uv_async on the loop thread. */
void cm__host_api_ready(cm_host *h);
/* The subscriber-callback queue of an in-process source, created on first use; NULL for another
 * kind of source or when it cannot be created. Implemented in inproc.c. */
struct cm__apicb *cm__inproc_apicb(cm_source *s);

#endif /* CM_HOST_INTERNAL_H */
