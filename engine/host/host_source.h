/*
 * host_source.h: the interface a record source uses to feed a host, beyond the public
 * cuptimon_host.h: what the sources (the in-process engine here, the hub's wire sources, the
 * replay) and cuptimon-lua's main may call of the host library, and from which thread.
 *
 * Design note. cuptimon_host.h is what every embedder sees: the host, the source vtable and the
 * one door for batches, cm_host_deliver. A source built with the host needs a little more: to
 * report a failure through the host's one reporting path, to know when a delivery must wait, to
 * know which observers belong to a trigger window, to install the live operations that only the
 * hub can perform, and to turn bytes that a process chose into text. This header is that
 * interface, and the only header of engine/host that engine/monitor includes; the host's own files
 * share host_internal.h, which stays private to engine/host. Nothing here needs lua.h: a source
 * never sees the host's Lua state, it describes its process through cm_process_info.
 *
 * Threads: the loop thread only (the one that created the host), like everything in the host,
 * except the text functions at the end, which are pure and run on any thread.
 */
#ifndef CM_HOST_SOURCE_H
#define CM_HOST_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "cuptimon_host.h"

/* ---- what a source may ask of the host (host.c) ---------------------------------------------- */

/* Whether a batch is being dispatched into Lua (a nested uv_run inside an observer callback):
 * a source must not start a delivery then. */
int cm__host_in_dispatch(const cm_host *h);
/* Reports a runtime failure of the source (`where` names it, `msg` says what happened) through
 * the host's one reporting path: the script's "error" hooks, the error count, stderr. */
void cm__host_error(cm_host *h, const char *where, const char *msg);
/* Whether observer `id` is bound to one source: a trigger window's (cm.window), which widens
 * the selection itself, so the batches decoded before the widening that lack its fields are
 * expected, skipped for it without a warning. */
int cm__host_observer_bound(const cm_host *h, uint32_t id);
/* The CM_E* code the in-process engine failed to start with when a script observed (no GPU or
 * driver, no CUPTI), or 0 when it started or was never needed. */
int cm__host_inproc_error(const cm_host *h);
/* The cadences the script asked for with cuptimon.configure (0 when it did not). */
void cm__host_cadence(const cm_host *h, uint32_t *flush_ms, uint32_t *deliver_ms);

/* ---- live operations, which the hub installs --------------------------------------------------- */

/* What a trigger window (cm.window) held when it closed; the arrays and strings are valid during
 * the done call only. status: 0, or a CM_E* code when a fence failed or the process ended first
 * (the counts are then what arrived). */
typedef struct cm__window_result {
  int status;
  const char *path;        /* the capture written, or NULL */
  uint64_t records, batches, frames;
  uint64_t dropped;        /* records the process lost during the window */
  const uint64_t *by_kind; /* CM_KIND_MAX counts, by kind value */
  /* uv_hrtime() when the opening fence completed and when window_end sent the narrowing SELECT
   * (0 and 0 when the window never opened): the span the extra kinds were traced, up to the
   * socket's latency each way. */
  uint64_t open_ns, end_ns;
  /* The span the agent traced the window's kinds, by its own clock (between the instants it
   * applied the widening and the narrowing SELECT), or 0 when it did not say (an older agent, or
   * another selection change in between). */
  uint64_t agent_ns;
} cm__window_result;
typedef void (*cm__window_done_fn)(void *ud, const cm__window_result *r);

/* Operations on live agents that only the hub can do (hub.c installs them; an embedding host
 * without a hub has none). Each returns 0 or a CM_E* code; CM_ENOTSUP for a source that is not
 * a live agent. */
typedef struct cm__live_ops {
  /* Stops tracing the kinds whose bits are set in `kinds` (1 << kind value) in process `s`,
   * whatever the observers select, and traces the others again: a new SELECT when it changes. */
  int (*shed)(cm_source *s, uint64_t kinds);
  /* Opens a window on `s`: a sync FLUSH fences it, and the frames after that fence are counted
   * (and, when `path` is not NULL, written to a new capture named by the --record rules) until
   * window_end's fence. done runs exactly once, when the window closes or the process ends. */
  int (*window_begin)(cm_source *s, const char *path, int force, cm__window_done_fn done, void *ud);
  /* Closes the window of `s` with a second sync FLUSH; done runs when it completes. */
  int (*window_end)(cm_source *s);
  /* 1 when the run takes live agents (`-- cmd`, --attach), 0 for a replay. */
  int (*agents)(void);
  /* 1 when the command (`-- cmd`) could not be started (not found, or not executable: the
   * one-line error is printed and the run's status is 127 or 126), else 0. May be NULL. */
  int (*command_failed)(void);
} cm__live_ops;
/* Installs the live operations (NULL removes them). */
void cm__host_set_live_ops(cm_host *h, const cm__live_ops *ops);

/* ---- text from agents and captures (text.c) ---------------------------------------------------- */

/* Whether n bytes are well-formed UTF-8 without control characters; a cleaned copy into out (cap
 * bytes, NUL-terminated; 3 * n + 1 always suffice), each offending byte replaced with U+FFFD,
 * returning its length; and `s` itself when clean, else its cleaned copy in buf (cap bytes,
 * truncated between sequences), for one stderr line. Pure functions; any thread. */
int cm__text_is_clean(const char *s, size_t n);
size_t cm__text_clean(const char *s, size_t n, char *out, size_t cap);
const char *cm__text_tmp(const char *s, char *buf, size_t cap);

#endif /* CM_HOST_SOURCE_H */
