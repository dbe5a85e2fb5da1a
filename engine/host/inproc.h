/*
 * inproc.h: the in-process engine source (inproc.c) beyond its public constructor,
 * cm_host_inproc_source_new: its subscriber-callback queue, and what it tells the host when the
 * queue has events.
 *
 * Design note. The queue (apicb.c) belongs to the in-process source, which creates it on first
 * use and frees it with its engine; the cuptimon.core module (corelib.c) finds it through
 * cm__inproc_apicb to subscribe and to take the events, and the queue's ready callback reaches the
 * host through cm__host_api_ready, which hands them to Lua. So the calls go corelib.c -> inproc.c
 * -> host.c, and never back. Loop thread only.
 */
#ifndef CM_INPROC_H
#define CM_INPROC_H

#include "cuptimon_host.h"

struct cm__apicb;

/* The subscriber-callback queue of an in-process source, created on first use; NULL for another
 * kind of source or when it cannot be created. Implemented in inproc.c. */
struct cm__apicb *cm__inproc_apicb(cm_source *s);
/* Subscriber callbacks (apicb.h): events are waiting; the host takes them into Lua (the script's
 * "api" event). Called from the queue's uv_async on the loop thread. Implemented in host.c. */
void cm__host_api_ready(cm_host *h);

#endif /* CM_INPROC_H */
