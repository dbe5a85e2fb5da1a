/*
 * host_internal.h: the host object and the interfaces between the files of engine/host that run
 * Lua. Private to engine/host: the command (engine/monitor) includes host_source.h, never this
 * header, and the sources built here (inproc.c) do not include it either, so that they never see
 * lua.h.
 *
 * File map (one noun per file). Calls go down this list, never back up, so no two files call
 * into each other:
 *   state.c    the host's life and its lua_State: cm_host_new (the libraries, luv on the
 *              embedder's loop, the embedded modules), running a script, cm_host_free
 *   corelib.c  the cuptimon.core module: the lua_CFunctions that lua/cuptimon/init.lua calls
 *   inproc.c   the in-process engine as a source (inproc.h, host_source.h)
 *   host.c     the host: every call into Lua and the one reporting path, the observers and the
 *              sources, delivery, the exit and the shutdown
 *   process.c  what the script sees of a source's process: its table, counters and losses, kept
 *              for the sources that went away
 *   apicb.c    the in-process engine's subscriber-callback queue (apicb.h)
 *   text.c     bytes that a process chose, made into text (host_source.h)
 *
 * Threads: the loop thread only (the one that created the host), like everything in the host.
 */
#ifndef CM_HOST_INTERNAL_H
#define CM_HOST_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <lua.h>
#include <luv/luv.h>
#include <uv.h>

#include "cuptimon.h"
#include "cuptimon_host.h"
#include "host_source.h"

#define CM__HOST_MAX_SOURCES 256

/* The registry field that holds the host (a light userdata), for the lua_CFunctions: state.c
 * sets it when it builds the state, cm__host_of reads it. */
#define CM__HOST_KEY "cuptimon.host"

/* A source that went away: its last counters, so that cm.stats() and the end-of-run loss line
 * cover the whole run, not only the processes still attached. */
typedef struct gone_source {
  int id, pid;
  cm_stats st;
  cm_loss loss;
} gone_source;

typedef struct host_observer {
  uint32_t id;
  cm_selection *sel;
  char *spec;
  int source; /* 0: every source; else only this source (a trigger window's observer) */
} host_observer;

struct cm_host {
  uv_loop_t *loop;
  lua_State *L;
  luv_ctx_t *luv_ctx; /* identifies luv's handles on the shared loop */
  uint32_t flags;
  pthread_t thread; /* the loop thread: the one that created the host */

  int dispatch_ref; /* Lua function(batch_ptr, source_id, observer_id) */
  int event_ref;    /* Lua function(event, ...) */

  host_observer *obs;
  int nobs, cap_obs;
  char *pm_spec; /* the script's PM sampling request (core.pm), applied to every source */
  uint32_t next_obs;

  cm_source *sources[CM__HOST_MAX_SOURCES];
  int nsources;
  int next_source;
  gone_source *gone;     /* sources removed so far, in order */
  int ngone, cap_gone;
  int inproc_failed; /* the in-process source could not be created; err holds why */
  int inproc_err;

  int in_dispatch;       /* depth of cm_host_deliver calls */
  uint64_t errors;       /* errors raised by the script and its callbacks, all reported */
  int in_report;         /* cm__host_report is running the script's "error" hooks */
  uint64_t foreign;      /* deliveries refused because they came from another thread */
  uint32_t flush_ms, deliver_ms;
  const cm__live_ops *live; /* the hub's operations on live agents (host_source.h), or NULL */

  uv_timer_t defer_timer; /* runs deferred requests on the next iteration */
  uv_timer_t exit_timer;  /* runs a requested shutdown on the next iteration */
  int timers_closed;
  int exit_requested, exit_status, shut_down;
  char *text_buf;         /* cm_host_text's cleaned copy */
  size_t text_cap;
};

/* ---- host.c --------------------------------------------------------------------------------- */

/* The host that owns L, or NULL outside a host. */
cm_host *cm__host_of(lua_State *L);
/* Whether the value at `idx` is an exit request raised by the script: a table whose field
 * exit_status is a number (cuptimon.args raises one for --help and usage errors). Reads the
 * table raw, so no metamethod runs. */
int cm__host_is_exit_request(lua_State *L, int idx);
/* The one reporting function of the host: every failure of the script goes through it, whether
 * raised in the main chunk, an observer, a timer or other luv callback, an event hook, a deferred
 * call or an exit hook (lua/cuptimon/init.lua hands the failures it catches itself over through
 * core.report). It reports the error message on top of the stack (and pops it): it counts the
 * error (cm_host_error_count, which makes cuptimon-lua's exit status non-zero), then hands it to
 * the script's "error" hooks when it has any, else prints it on stderr. An error raised while the
 * error hooks run is counted and printed, never handed to the hooks again (no recursion). Never
 * raises. */
void cm__host_report(cm_host *h, const char *where);
/* Calls the script's event function with `nargs` arguments already pushed. */
void cm__host_fire_event(cm_host *h, const char *event, int nargs);
/* luv's callbacks run through this instead of luv's default, which exits the process on error. */
int cm__host_luv_pcall(lua_State *L, int nargs, int nresults, int flags);
/* Runs the function below its `nargs` arguments on the stack; reports an error through
 * cm__host_report. An exit request raised by the chunk (cuptimon.args after --help) requests the
 * exit instead and is not a failure. Returns 0 or CM_EINVAL. */
int cm__host_run_chunk(cm_host *h, int nargs);
/* The index of observer `id` in h->obs, or -1. */
int cm__host_find_obs(cm_host *h, uint32_t id);
/* Fires the "deferred" event on the next loop iteration (core.defer). */
void cm__host_defer(cm_host *h);

/* ---- process.c ------------------------------------------------------------------------------- */

/* Pushes the process table of source `s`: source, pid and kind, then what the source's describe
 * filled in (host, ppid, exe, argv, devices, env; status and stats at exit). The same shape for every
 * kind of source, so a script never needs to know where its batches come from. */
void cm__process_push(cm_host *h, cm_source *s, int exiting);
/* Sets the loss fields on the table on top of L's stack (the process table, or cm.stats()). */
void cm__process_push_loss(lua_State *L, const cm_loss *l);
/* Keeps the last counters and losses of source `s`, which is going away (h->gone). */
void cm__process_gone(cm_host *h, cm_source *s);

/* ---- corelib.c -------------------------------------------------------------------------------- */

/* The cuptimon.core module's loader (package.preload["cuptimon.core"]). */
int cm__corelib_open(lua_State *L);
/* os.exit replacement: a script (or busted) that exits still gets its exit hooks and a clean
 * engine shutdown, except inside an observer callback, where the engine's locks are held. */
int cm__corelib_os_exit(lua_State *L);

#endif /* CM_HOST_INTERNAL_H */
