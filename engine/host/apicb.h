/*
 * apicb.h: subscriber callbacks of the in-process engine, queued for the loop thread.
 *
 * Design note. CUPTI runs subscriber callbacks on the application thread, inside the CUDA call,
 * where no Lua may run (the lua_State belongs to the loop thread). A subscription here registers
 * a small C handler with the engine (cm_callback_register + cm_callback_arm); the handler copies
 * the facts of the call into a bounded queue and wakes the loop with a uv_async; the loop thread
 * then takes the events and the host hands them to Lua. A full queue drops the event and counts
 * it: nothing is lost silently, and an application thread never waits on the monitor.
 */
#ifndef CM_APICB_H
#define CM_APICB_H

#include <stdint.h>

#include <uv.h>

#include "cuptimon.h"

/* The default queue capacity, in events. */
enum { CM__APICB_CAPACITY = 4096 };

/* Which API sites a subscription wants: enter, exit, or both. */
enum { CM__APICB_ENTER = 1, CM__APICB_EXIT = 2 };

typedef struct cm__api_event {
  uint32_t sub;         /* the subscription id (cm__apicb_add) */
  int32_t domain;       /* CUpti_CallbackDomain */
  uint32_t cbid;        /* the callback id within the domain */
  uint32_t site;        /* CM__APICB_ENTER or CM__APICB_EXIT */
  uint32_t correlation; /* CUPTI's correlation id of the call (0 outside RUNTIME/DRIVER) */
  uint32_t tid;         /* the kernel thread id of the calling thread */
  uint64_t time_ns;     /* CLOCK_REALTIME when the handler ran */
} cm__api_event;

typedef struct cm__apicb cm__apicb;

/* Creates a queue of `capacity` events (0: CM__APICB_CAPACITY) for engine `e`, waking the loop
 * `loop` with a uv_async whose callback calls ready(ud) on the loop thread. Loop thread. */
int cm__apicb_new(cm__apicb **out, cm_engine *e, uv_loop_t *loop, uint32_t capacity,
                  void (*ready)(void *ud), void *ud);
/* Unregisters every subscription (waiting for handlers running on other threads), then closes
 * the uv_async; the memory goes in its close callback, so the loop must run once more. Events
 * still queued are discarded (cm__apicb_counts reports them first). Loop thread. */
void cm__apicb_free(cm__apicb *q);
/* Subscribes to (domain, cbid) at `sites` (CM__APICB_ENTER | CM__APICB_EXIT): registers and arms
 * the callback. Stores the subscription id (> 0) in *id. Returns 0 or a CM_E* error. */
int cm__apicb_add(cm__apicb *q, int domain, uint32_t cbid, unsigned sites, uint32_t *id);
/* Disarms and unregisters subscription `id`; once it returns, no new event of it is queued
 * (events already queued stay, and the consumer ignores them). CM_ENOENT for an unknown id. */
int cm__apicb_remove(cm__apicb *q, uint32_t id);
/* Moves up to `max` queued events, oldest first, into out; returns how many. Any thread. */
uint32_t cm__apicb_take(cm__apicb *q, cm__api_event *out, uint32_t max);
/* Events queued so far, events dropped because the queue was full, events waiting now. */
void cm__apicb_counts(cm__apicb *q, uint64_t *queued, uint64_t *dropped, uint64_t *waiting);

#endif /* CM_APICB_H */
