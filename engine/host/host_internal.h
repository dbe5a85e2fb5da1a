/*
 * host_internal.h: what the Lua host (host.c) shares with the files of engine/host only, beyond
 * host_source.h (the interface every source may use, which this header includes).
 *
 * Design note. This header is private to engine/host: the command (engine/monitor) includes
 * host_source.h, never this one. Loop thread only, like everything in the host.
 */
#ifndef CM_HOST_INTERNAL_H
#define CM_HOST_INTERNAL_H

#include <stdint.h>

#include "cuptimon_host.h"
#include "host_source.h"

struct cm__apicb;

/* Subscriber callbacks (apicb.h): events are waiting; the host takes them into Lua (the script's
 * "api" event). Called from the queue's uv_async on the loop thread. */
void cm__host_api_ready(cm_host *h);
/* The subscriber-callback queue of an in-process source, created on first use; NULL for another
 * kind of source or when it cannot be created. Implemented in inproc.c. */
struct cm__apicb *cm__inproc_apicb(cm_source *s);

#endif /* CM_HOST_INTERNAL_H */
