/*
 * control.h: how the agent applies what the monitor asks for (HELLO_ACK, CONFIGURE, SELECT and
 * FLUSH frames), separated from the agent's sockets, queue and engine so that a fuzz target and a
 * unit test can drive it without a monitor or a GPU (engine/fuzz/fuzz_agent_control.c).
 *
 * The monitor is trusted only as far as its requests are bounded: every number it may set is
 * clamped to the limits below, with a log line naming the request and the value used, and a
 * control frame larger than CM__CTL_MAX_FRAME ends the connection. The effects go through
 * `cm__control_ops`, which the agent implements with its engine and queue.
 *
 * Not thread-safe: one thread (the agent's init thread during the handshake, then its control
 * thread) owns a cm__control.
 */
#ifndef CM_AGENT_CONTROL_H
#define CM_AGENT_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuptimon.h"
#include "cuptimon_wire.h"

/* The bounds on what the monitor may ask for (docs/agent.md lists them). */
#define CM__CTL_MAX_FRAME ((uint64_t)1 << 20)           /* payload bytes of one control frame */
#define CM__CTL_MAX_SELECT 65536u                       /* bytes of a SELECT text */
#define CM__CTL_BUFFER_MIN 4096u                        /* buffer_size */
#define CM__CTL_BUFFER_MAX (64u << 20)
#define CM__CTL_POOL_MAX 8192u                          /* pool_max_buffers */
#define CM__CTL_POOL_BYTES_MAX ((uint64_t)4 << 30)      /* buffer_size x pool_max_buffers */
#define CM__CTL_CADENCE_MIN_MS 10u                      /* flush_ms, deliver_ms (0 = off) */
#define CM__CTL_CADENCE_MAX_MS 3600000u
#define CM__CTL_FENCE_MIN_MS 100u                       /* fence_timeout_ms */
#define CM__CTL_FENCE_MAX_MS 60000u                     /* and a FLUSH's timeout_ms */
#define CM__CTL_BATCH_MIN 1024u                         /* batch_records (0 = the maximum) */
#define CM__CTL_BATCH_MAX (1u << 22)
#define CM__CTL_QUEUE_MIN ((uint64_t)1 << 20)           /* send_queue_bytes */
#define CM__CTL_QUEUE_MAX ((uint64_t)1 << 30)
/* A PM request's bounds are the wire's (CM_WIRE_PM_*, cuptimon_wire.h). */
#define CM__CTL_PM_ENTRIES CM_WIRE_PM_ENTRIES
#define CM__CTL_PM_METRICS CM_WIRE_PM_METRICS
#define CM__CTL_PM_NAME CM_WIRE_PM_NAME
typedef cm_wire_pm_entry cm__pm_entry;

/* What applying a frame does. `ud` is passed back. Every member must be set. */
typedef struct cm__control_ops {
  void *ud;
  /* Replaces the selection; NULL or empty stops tracing. Returns 0 or a CM_E* code (the previous
   * selection then stays). */
  int (*select)(void *ud, const cm_selection *sel);
  /* Applies an engine configuration. Returns 0 or a CM_E* code (nothing changed then). */
  int (*configure)(void *ud, const cm_config *cfg);
  /* Sets the send queue's bound in bytes. */
  void (*queue_bytes)(void *ud, uint64_t bytes);
  /* Runs a flush (CM_FLUSH_PLAIN or CM_FLUSH_SYNC) and returns its status. */
  int (*flush)(void *ud, int mode, uint32_t timeout_ms);
  /* Queues STATS, then FLUSH_DONE{id, status}. */
  void (*flush_done)(void *ud, uint64_t id, int32_t status);
  /* One log line at a cm_log_level. */
  void (*log)(void *ud, int level, const char *msg);
  /* Replaces the PM sampling with `n` entries (0: none) and answers each with a PM_STATUS; or,
   * when n is a negative CM_E* code, answers that the request was refused for `refusal`. The
   * entries and their strings are valid during the call only. */
  void (*pm)(void *ud, const cm__pm_entry *entries, int n, const char *refusal);
} cm__control_ops;

typedef struct cm__control {
  cm__control_ops ops;
  cm_config cfg;     /* the engine configuration in force (what CONFIGURE changes) */
  uint64_t fed;      /* bytes fed to the reader */
  uint64_t consumed; /* stream offset just past the last whole frame taken */
  uint32_t clamped;  /* requests clamped or refused so far */
} cm__control;

/* Starts a control state over the configuration `cfg` (the engine's current one). */
void cm__control_init(cm__control *c, const cm__control_ops *ops, const cm_config *cfg);

/* Feeds bytes received from the monitor to `r`. Returns 0, or a CM_E* code when the stream is bad
 * (logged): the caller then drops the monitor. */
int cm__control_feed(cm__control *c, cm_wire_reader *r, const void *data, size_t len);

/* Takes the next whole frame from `r` (as cm_wire_reader_next: 1, 0 or a negative code). When it
 * returns 0 it also checks the frame still incomplete: one that would exceed CM__CTL_MAX_FRAME
 * fails with CM_ERANGE (logged), before its bytes pile up. */
int cm__control_next(cm__control *c, cm_wire_reader *r, cm_wire_frame *f);

/* Applies one monitor frame. Returns 1 for HELLO_ACK (its status in *ack when ack is not NULL),
 * 0 for every other frame (a malformed or unknown one is logged and ignored). */
int cm__control_apply(cm__control *c, const cm_wire_frame *f, int32_t *ack);

#endif /* CM_AGENT_CONTROL_H */
