/*
 * hub_internal.h: the live-agent hub's state, shared by its two files: hub.c (the run: the
 * socket, the gate, the command, the end, --attach, signals and the host's live operations) and
 * conn.c (one agent's connection). Nobody else includes it; lua_main.c uses hub.h.
 *
 * Design note. The hub is a singleton, and every connection points back to it. Calls go one way,
 * from hub.c to conn.c: the one thing conn.c must tell the hub, that a connection is gone and the
 * end may come, goes through the conn_gone hook that hub.c sets. Loop thread only, except the
 * gate's locked state (gate.h).
 */
#ifndef CM_HUB_INTERNAL_H
#define CM_HUB_INTERNAL_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "cuptimon.h"
#include "cuptimon_host.h"
#include "cuptimon_wire.h"
#include "gate.h"
#include "record.h"
#include "supervise.h"
#include "window.h"
#include "wsrc.h"

/* A flush sent to an agent, waiting for its FLUSH_DONE. */
typedef struct cm__pending_flush {
  uint64_t id;
  uint64_t deadline; /* uv_now() milliseconds */
  cm_source_done_fn done;
  void *ud;
} cm__pending_flush;

/* A connection's state: CLOSING once nothing more is read or sent. */
enum { CM__CONN_ACTIVE = 1, CM__CONN_CLOSING };

struct cm__hub;

/* One agent's connection (conn.c). */
typedef struct cm__conn {
  cm__wsrc w;          /* first: the host's cm_source is w.base */
  struct cm__hub *hb;  /* the hub it belongs to */
  uv_pipe_t pipe;
  cm_wire_reader *r;
  int state;
  int handshaking;     /* inside the attach: SELECT waits for the handshake's own */
  struct cm__conn *next;
  char rbuf[64 * 1024];
  cm__pending_flush *flushes;
  int nflush, cap_flush;
  cm__capture *cap;    /* --record */
  cm__window *win;     /* the open trigger window (window.c), or NULL */
  uint8_t *hello;      /* a copy of the HELLO payload, for a window's capture */
  cm_wire_frame hello_frame;
  pid_t kpid;          /* the peer's pid, from the kernel (SO_PEERCRED) */
  char *sent_select;   /* the SELECT the gate answered the HELLO with */
  uint32_t sent_flush_ms, sent_deliver_ms;
  /* The command's own process said BYE: process_exit waits (briefly) for the exit status that
   * the supervisor reaps, so it reports the real one. Until then the connection is closed for
   * I/O but still attached. */
  int await_status;
  uint64_t await_deadline;
  int outward;         /* --attach: the monitor connected to the agent's socket */
  int detaching;       /* --attach: SELECT "" was sent; nothing more is sent */
  uint64_t hello_deadline; /* --attach: uv_now() ms by which the agent's HELLO must come */
  uint64_t partial;    /* this connection's share of hub.partial_total */
} cm__conn;

/* The hub, a singleton (hub.c's g_hub). */
typedef struct cm__hub {
  cm_host *host;
  uv_loop_t *loop;
  int live, replay;
  char dir[PATH_MAX];
  char sock[PATH_MAX];
  char token[33];
  char agent[PATH_MAX];
  int listen_fd;       /* the listening socket; the gate thread accepts on it */
  cm__gate *gate;
  uv_async_t admit_async;
  int async_init;
  char *published;     /* the union selection last published to the gate */
  uint32_t pub_flush_ms, pub_deliver_ms;
  cm__proc proc;       /* the command (supervise.c) */
  int proc_done;
  int cmd_status;
  /* The command's own process said BYE with the status it gave exit(): it is exiting, and the
   * end need not wait for the reap (bye_status is compared with the reaped status then). */
  int cmd_exiting, bye_status;
  char **cmd;
  uv_timer_t spawn_timer, drain_timer, tick_timer;
  int timers_init;
  int signals;
  /* The watchers that forward SIGINT and SIGTERM to the command after the run (cm__hub_forward_
   * signals); wait_sig_on while they are started. */
  uv_signal_t wait_sig[2];
  int wait_sig_on;
  cm__conn *conns;
  int nconns;
  uint64_t next_flush;
  uint32_t flush_ms, deliver_ms;
  cm_selection *extra;
  cm__record *rec;     /* --record (record.c), or NULL */
  int finished, status;
  int attached_any;    /* some process completed its handshake */
  /* --attach */
  int attach, attach_all;
  int targets[256], ntargets;
  int *tried;          /* pids connected to so far (never twice) */
  int ntried, cap_tried;
  int attach_failed;   /* a named pid could not be attached */
  /* Memory bounds across the authenticated connections (docs/monitor.md, "Limits"): the bytes
   * their readers hold or are about to hold for partly received frames, under a budget, and the
   * number of connections of the run's token. */
  uint64_t partial_total, partial_budget;
  uint64_t over_budget, over_cap; /* connections closed for either */
  uint32_t max_conns;
  int gate_summary_done;
  /* cm__conn_log's rate limit (conn.c): a token bucket of LOG_BURST lines, one more per second. */
  double log_tokens;
  uint64_t log_last_ms, log_suppressed;
  char adir[PATH_MAX];
  uv_fs_event_t watch;
  int watch_init;
  uv_timer_t scan_timer;
  int scan_init;
  int detach_pending;
  cm__gate_stats gate_lost; /* the gate's counts when it stopped (lost: handshakes cut short) */
  /* Set by hub.c: conn.c calls it once a connection has been freed, so that the end may come
   * (the one call from conn.c into hub.c, made through this pointer). */
  void (*conn_gone)(struct cm__hub *hb);
} cm__hub;

/* ---- connections (conn.c) ------------------------------------------------------------------------ */

/* Takes a connection the gate admitted, or one --attach opened (gc->fd, gc->pid): from here on the
 * loop thread owns it and reads from it. Returns it, or NULL (the descriptor is closed then). */
cm__conn *cm__conn_admit(cm__hub *hb, cm__gate_conn *gc);
/* Sends the frames in `b` (and clears it); with close_after, closes the connection once they
 * are written. Nothing is sent on a closing connection. */
void cm__conn_send(cm__conn *c, cm_wire_buf *b, int close_after);
/* The wire source's flush (cm__wsrc_ops): sends FLUSH; `done` runs on its FLUSH_DONE, when the
 * connection closes (CM_EIO) or past its deadline (cm__conn_flush_complete from the tick). */
int cm__conn_flush(cm__wsrc *w, int mode, uint32_t timeout_ms, cm_source_done_fn done, void *ud);
/* Completes pending flush `i` with `status` (the host's done runs Lua: called last). */
void cm__conn_flush_complete(cm__conn *c, int i, int status);
/* Closes the pipe; pending flushes complete with CM_EIO, and an open window ends with what it
 * received. Idempotent. */
void cm__conn_close(cm__conn *c);
/* Ends the process's connection with `end` (CM__END_*): process_exit runs when it was attached,
 * or, for the command's own process, once its exit status is known (bounded by the tick). */
void cm__conn_end(cm__conn *c, int end);
/* Detaches the source now (process_exit runs), or closes the connection when never attached. */
void cm__conn_detach_now(cm__conn *c);
/* The command's own exit status reached a connection of its process. */
void cm__conn_set_status(cm__conn *c, int status);
/* An outward (--attach) connection that will never be attached: named on stderr, and a named
 * pid fails the run. */
void cm__conn_attach_failed(cm__hub *hb, cm__conn *c, const char *why);
/* The union selection a process attached now would get, or NULL (out of memory); the caller
 * frees it. */
char *cm__conn_union(cm__hub *hb);
/* Opens a trigger window on the connection (window.h says what it counts and writes) and sends
 * its opening fence; CM_EBUSY when one is open. */
int cm__conn_window_begin(cm__conn *c, const char *path, int force, cm__window_done_fn done,
                          void *ud);
/* Sends the closing fence of the connection's window; CM_ENOENT when none is open. */
int cm__conn_window_end(cm__conn *c);
/* Prints a line an agent caused, under the rate limit (a burst, then one a second; the rest are
 * counted). */
void cm__conn_log(cm__hub *hb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints how many lines the rate limits suppressed (the hub's and the wire sources'), if any. */
void cm__conn_log_flush(cm__hub *hb);

#endif /* CM_HUB_INTERNAL_H */
