/*
 * hub.c: the live-agent hub of cuptimon-lua: `cuptimon-lua script.lua -- cmd args...` and
 * `cuptimon-lua --record FILE -- cmd`.
 *
 * Design note. The hub creates a private 0700 directory (mkdtemp) holding a 0600 unix socket,
 * and a per-run token of 128 random bits. It starts the command (supervise.c) with the injection
 * variables of the agent contract: CUDA_INJECTION64_PATH and NVTX_INJECTION64_PATH name
 * libcuptimon-agent.so, CUPTIMON_SOCKET and CUPTIMON_TOKEN say where and how to connect. Every
 * CUDA process of the job (children included: they inherit the environment) connects.
 *
 * Handshakes are the gate's (gate.c), a thread of their own: the agent waits for the answer
 * inside the application's cuInit, and the loop thread may be busy in the script for seconds.
 * The gate checks the peer's uid (SO_PEERCRED), reads only the HELLO (capped before the peer is
 * authenticated), compares the token in constant time, and answers CONFIGURE (when the script set
 * cadences), SELECT (the union of every observer's selection, plus --select) and HELLO_ACK from
 * what this file last published (publish(): at start and on every tick); idle or hostile
 * connections are closed by its deadline and its cap and never reach this file. An admitted
 * connection comes here through a uv_async: it becomes a wire source (wsrc.c) named by the
 * kernel's pid, is attached to the host (process_start hooks run), and gets a corrective SELECT or
 * CONFIGURE when the gate's copy was stale. Later selection changes are sent to every live agent
 * as new SELECT frames.
 *
 * Bytes come from uv_read callbacks into a per-connection wire reader, whose frames are handled
 * in place: a BATCH is delivered straight from the reader's buffer. A corrupt stream, or a frame
 * over the wire format's size limit, closes that agent's connection with a message naming the
 * byte offset; the monitor and the other agents go on.
 *
 * Flushes: the host asks each source to flush; the hub sends FLUSH{id, sync} and calls the host's
 * done when FLUSH_DONE{id} comes back, when the agent goes away, or when the deadline (the
 * flush's timeout, 5 s by default, plus 2 s of slack) passes. The host's rendezvous fires the
 * script's done once every source has answered.
 *
 * The end: when the command exits, the hub waits (at most CUPTIMON_DRAIN_MS, 5 s by default) for
 * the connected agents (and those the gate has admitted but this file has not taken yet) to send
 * BYE or close, then stops the loop; cuptimon-lua then runs the final flush and the script's exit
 * hooks and exits with the command's status (128 + signal when a signal killed it). The command's
 * own process reports that status in process_exit: when its agent says BYE first, its detach
 * waits (at most 2 s) for the status the supervisor reaps, unless the BYE carries the status the
 * process gave exit() (the agent's exit handler knows it on glibc). Then process_exit runs at
 * once and, when no other agent is connected, so does the end: the script's exit hooks print
 * their tables while the process is still tearing down CUDA (which can take a few hundred ms),
 * and cuptimon-lua reaps it afterwards (cm__hub_wait_command) for its own exit status. SIGINT and
 * SIGTERM are forwarded to the command, followed by SIGKILL after a grace period
 * (CUPTIMON_KILL_GRACE_MS, 3 s by default); a second signal sends SIGKILL at once.
 *
 * --record writes every agent's frames to a capture per process (record.c). A trigger window
 * (cm.window, window.c) is fenced by two sync FLUSHes sent here, and sees every frame after the
 * opening one.
 *
 * --attach (dormant agents, attach.c): there is no command, socket or gate. The hub connects to
 * each agent's own socket instead (`all`: every one in the rendezvous directory, and new ones as
 * they appear, seen through a uv_fs_event on the directory); the agent sends HELLO and SCHEMA and
 * this file answers CONFIGURE, SELECT and HELLO_ACK itself (the agent waits on its listener
 * thread, never in the application's cuInit, so the loop may answer). From there a connection is
 * the same as an agent's that connected: same frames, same wire source, same process events. A
 * BYE before HELLO is the agent's refusal (another monitor is attached: its message names that
 * monitor's pid). The window ends with cm__hub_detach: SELECT "" and a sync FLUSH, so every
 * record the agent held is delivered before the exit hooks; closing the connection then sends
 * the agent back to dormant. With a list of pids the run ends when every one has gone; with
 * `all`, at Control-C (status 0) or cm.exit().
 *
 * Threads: the loop thread, and the gate's thread, which shares only the gate's locked state
 * (gate.h). Ownership: the hub is a singleton owned by lua_main.c through cm__main_attach and
 * cm__hub_free; a connection is freed in its pipe's close callback, after the host has detached
 * its source.
 */
#include <errno.h>
#include <time.h>
#include <dirent.h>
#include <stdarg.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <sys/socket.h>

#include "attach.h"
#include "env.h"
#include "gate.h"
#include "host_source.h"
#include "hub.h"
#include "record.h"
#include "supervise.h"
#include "window.h"
#include "wsrc.h"

typedef struct pending_flush {
  uint64_t id;
  uint64_t deadline; /* uv_now() milliseconds */
  cm_source_done_fn done;
  void *ud;
} pending_flush;

enum { CONN_ACTIVE = 1, CONN_CLOSING };

typedef struct conn {
  cm__wsrc w;          /* first: the host's cm_source is w.base */
  uv_pipe_t pipe;
  cm_wire_reader *r;
  int state;
  int handshaking;     /* inside the attach: SELECT waits for the handshake's own */
  struct conn *next;
  char rbuf[64 * 1024];
  pending_flush *flushes;
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
} conn;

/* How long an --attach waits for the agent's HELLO: the agent's listener gives way to a waiting
 * connection within 250 ms of a silent peer (listen.c), and the first attach starts CUPTI. A
 * pid whose HELLO does not come in time is named and fails the run (status 1). */
enum { ATTACH_HELLO_MS = 10000 };

/* ATTACH_HELLO_MS, or CUPTIMON_ATTACH_HELLO_MS (1 to 600000) for tests. */
static long attach_hello_ms(void) {
  const char *s = getenv("CUPTIMON_ATTACH_HELLO_MS");
  char *end;
  long v = s && *s ? strtol(s, &end, 10) : 0;
  return s && *s && !*end && v >= 1 && v <= 600000 ? v : ATTACH_HELLO_MS;
}


typedef struct hub {
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
  conn *conns;
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
  /* agent_log's rate limit: a token bucket of LOG_BURST lines, one more per second. */
  double log_tokens;
  uint64_t log_last_ms, log_suppressed;
  char adir[PATH_MAX];
  uv_fs_event_t watch;
  int watch_init;
  uv_timer_t scan_timer;
  int scan_init;
  int detach_pending;
  cm__gate_stats gate_lost; /* the gate's counts when it stopped (lost: handshakes cut short) */
} hub;

static hub *g_hub;

/* Lines that agents can cause, one or more per connection (a corrupt stream, a frame over a
 * limit, a flush not answered...): a burst of LOG_BURST, then one a second; the rest are counted
 * and summarized ("suppressed N messages"), as journald rate-limits a service, so a peer that
 * opens connections by the thousand cannot flood the terminal. Loop thread. */
enum { LOG_BURST = 20 };

static void log_flush_suppressed(hub *hb) {
  cm__wsrc_log_summary();
  if (!hb->log_suppressed) return;
  fprintf(stderr, "cuptimon-lua: suppressed %llu messages about agents\n",
          (unsigned long long)hb->log_suppressed);
  hb->log_suppressed = 0;
}

static void agent_log(hub *hb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void agent_log(hub *hb, const char *fmt, ...) {
  uint64_t now = uv_now(hb->loop);
  if (!hb->log_last_ms) hb->log_tokens = LOG_BURST;
  hb->log_tokens += (double)(now - hb->log_last_ms) / 1000.0;
  if (hb->log_tokens > LOG_BURST) hb->log_tokens = LOG_BURST;
  hb->log_last_ms = now ? now : 1;
  if (hb->log_tokens < 1) {
    hb->log_suppressed++;
    return;
  }
  hb->log_tokens -= 1;
  log_flush_suppressed(hb);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
}

/* ---- the end ------------------------------------------------------------------------------------ */

static void conn_end(conn *c, int end);
static void conn_detach_now(conn *c);

/* Stops accepting: the gate thread ends and closes every connection that has not completed its
 * handshake (idle ones are not agents: they neither delay the end nor get a message each). */
static void stop_gate(hub *hb) {
  log_flush_suppressed(hb);
  if (hb->gate && !hb->gate_summary_done) {
    hb->gate_summary_done = 1; /* stop_gate runs at the end and again at the free: one summary */
    cm__gate_stop(hb->gate);
    cm__gate_stats st;
    cm__gate_get_stats(hb->gate, &st);
    hb->gate_lost = st;
    uint64_t closed = st.refused_uid + st.wrong_token + st.bad_hello + st.oversized +
                      st.timed_out + st.evicted;
    if (hb->over_budget || hb->over_cap)
      fprintf(stderr, "cuptimon-lua: %llu agent connections were closed over the budget of %llu "
              "MiB for partly received frames, %llu over the cap of %u connections per run\n",
              (unsigned long long)hb->over_budget, (unsigned long long)(hb->partial_budget >> 20),
              (unsigned long long)hb->over_cap, hb->max_conns);
    if (closed > 3)
      fprintf(stderr, "cuptimon-lua: %llu connections were refused or closed before their "
              "handshake (%llu another uid, %llu wrong token, %llu bad HELLO, %llu oversized, "
              "%llu timed out, %llu over the cap)\n", (unsigned long long)closed,
              (unsigned long long)st.refused_uid, (unsigned long long)st.wrong_token,
              (unsigned long long)st.bad_hello, (unsigned long long)st.oversized,
              (unsigned long long)st.timed_out, (unsigned long long)st.evicted);
  }
  if (hb->listen_fd >= 0) {
    close(hb->listen_fd);
    hb->listen_fd = -1;
  }
}

static void stop_watch(hub *hb);
static char *current_union(hub *hb);

static void finish(hub *hb) {
  if (hb->finished) return;
  hb->finished = 1;
  if (hb->attach) {
    /* The connections stay: cm__hub_detach ends their windows after the loop. */
    stop_watch(hb);
    uv_stop(hb->loop);
    return;
  }
  stop_gate(hb);
  /* Agents still connected after the drain period are cut off (their processes run on). */
  for (conn *c = hb->conns; c; c = c->next) {
    if (c->await_status) {
      conn_detach_now(c);
    } else if (c->state != CONN_CLOSING) {
      agent_log(hb, "cuptimon-lua: agent pid %u is still connected after the command ended; "
              "closing its connection\n", c->w.pid);
      conn_end(c, CM__END_TIMEOUT);
    }
  }
  uv_timer_stop(&hb->drain_timer);
  uv_timer_stop(&hb->tick_timer);
  uv_stop(hb->loop);
}

/* Agents the end waits for: connected ones, and those the gate has answered but the loop has
 * not taken yet. */
static int live_conns(hub *hb) {
  int n = hb->gate ? cm__gate_admitting(hb->gate) : 0;
  for (conn *c = hb->conns; c; c = c->next)
    if (c->state != CONN_CLOSING) n++;
  return n;
}

static void drain_cb(uv_timer_t *t) { finish(t->data); }

/* The command is done: finish once its agents are, or after the drain period. A command whose
 * own process said BYE with its exit status is done too, as far as the script is concerned,
 * when no other agent is connected; the drain period starts only with the reap. */
static void maybe_finish(hub *hb) {
  if (hb->finished) return;
  if (!hb->proc_done) {
    if (hb->cmd_exiting && live_conns(hb) == 0) finish(hb);
    return;
  }
  if (live_conns(hb) == 0) {
    finish(hb);
    return;
  }
  if (!uv_is_active((uv_handle_t *)&hb->drain_timer))
    uv_timer_start(&hb->drain_timer, drain_cb, cm__env_u64("CUPTIMON_DRAIN_MS", 5000), 0);
}

/* ---- sending --------------------------------------------------------------------------------------- */

typedef struct send_req {
  uv_write_t req;
  int close_after;
  conn *c;
  uint8_t data[];
} send_req;

static void conn_close(conn *c);

static void sent_cb(uv_write_t *req, int status) {
  send_req *s = (send_req *)req;
  if (s->close_after) conn_close(s->c);
  free(s);
  (void)status; /* a failed write shows up as a read error or EOF */
}

/* Sends the frames in `b` (and clears it). */
static void conn_send(conn *c, cm_wire_buf *b, int close_after) {
  if (c->state == CONN_CLOSING || uv_is_closing((uv_handle_t *)&c->pipe)) {
    cm_wire_buf_clear(b);
    return;
  }
  send_req *s = malloc(sizeof *s + b->len);
  if (!s) {
    cm_wire_buf_clear(b);
    return;
  }
  memcpy(s->data, b->data, b->len);
  s->close_after = close_after;
  s->c = c;
  uv_buf_t buf = uv_buf_init((char *)s->data, (unsigned)b->len);
  if (uv_write(&s->req, (uv_stream_t *)&c->pipe, &buf, 1, sent_cb)) {
    free(s);
    if (close_after) conn_close(c);
  }
  cm_wire_buf_clear(b);
}

/* ---- the wire source's owner callbacks ------------------------------------------------------------ */

static int conn_flush(cm__wsrc *w, int mode, uint32_t timeout_ms, cm_source_done_fn done, void *ud) {
  conn *c = w->owner;
  hub *hb = g_hub;
  /* Before HELLO_ACK (a process_start hook flushing) the agent has traced nothing yet, and a
   * FLUSH would break the handshake's order; after the end there is nothing left to flush. */
  if (c->state != CONN_ACTIVE || c->handshaking || c->detaching) {
    if (done) done(ud, 0);
    return 0;
  }

  if (c->nflush == c->cap_flush) {
    int cap = c->cap_flush ? c->cap_flush * 2 : 4;
    pending_flush *p = realloc(c->flushes, (size_t)cap * sizeof *p);
    if (!p) {
      if (done) done(ud, CM_ENOMEM);
      return CM_ENOMEM;
    }
    c->flushes = p;
    c->cap_flush = cap;
  }
  uint64_t id = ++hb->next_flush;
  c->flushes[c->nflush++] = (pending_flush){
      .id = id, .deadline = uv_now(hb->loop) + (timeout_ms ? timeout_ms : 5000) + 2000,
      .done = done, .ud = ud};
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_flush(&b, id, mode == CM_FLUSH_SYNC ? CM_WIRE_FLUSH_SYNC : 0, timeout_ms);
  conn_send(c, &b, 0);
  cm_wire_buf_free(&b);
  return 0;
}

/* Completes pending flush `i` with `status` (the host's done runs Lua: call it last). */
static void flush_complete(conn *c, int i, int status) {
  pending_flush p = c->flushes[i];
  memmove(&c->flushes[i], &c->flushes[i + 1], (size_t)(c->nflush - i - 1) * sizeof p);
  c->nflush--;
  if (p.done) p.done(p.ud, status);
}

static void conn_select(cm__wsrc *w, const char *spec) {
  conn *c = w->owner;
  /* The handshake sends its own; a detaching agent keeps its empty selection. */
  if (c->handshaking || c->state != CONN_ACTIVE || c->detaching) return;
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_select(&b, spec);
  conn_send(c, &b, 0);
  cm_wire_buf_free(&b);
}

/* Sends the PM request; during the handshake nothing is sent, and the attach sends it after. */
static void conn_pm(cm__wsrc *w, const char *spec) {
  conn *c = w->owner;
  if (c->handshaking || c->state != CONN_ACTIVE) return;
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_pm(&b, spec);
  conn_send(c, &b, 0);
  cm_wire_buf_free(&b);
}

static void send_configure(conn *c, uint32_t flush_ms, uint32_t deliver_ms) {
  cm_wire_kv kv[2];
  uint32_t n = 0;
  if (flush_ms) kv[n++] = (cm_wire_kv){.name = "flush_ms", .value = flush_ms};
  if (deliver_ms) kv[n++] = (cm_wire_kv){.name = "deliver_ms", .value = deliver_ms};
  if (!n) return;
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_configure(&b, kv, n);
  conn_send(c, &b, 0);
  cm_wire_buf_free(&b);
}

static void conn_configure(cm__wsrc *w, uint32_t flush_ms, uint32_t deliver_ms) {
  conn *c = w->owner;
  if (flush_ms) g_hub->flush_ms = flush_ms;
  if (deliver_ms) g_hub->deliver_ms = deliver_ms;
  if (c->handshaking || c->state != CONN_ACTIVE || c->detaching) return;
  if (flush_ms) c->sent_flush_ms = flush_ms;
  if (deliver_ms) c->sent_deliver_ms = deliver_ms;
  send_configure(c, flush_ms, deliver_ms);
}

static void conn_detached(cm__wsrc *w) { conn_close(w->owner); }

static const cm__wsrc_ops conn_ops = {
    .flush = conn_flush, .select = conn_select, .configure = conn_configure, .pm = conn_pm,
    .detached = conn_detached,
};

/* ---- connections ------------------------------------------------------------------------------------ */

static void close_capture(hub *hb, conn *c) {
  if (!c->cap) return;
  cm_loss l;
  cm__wsrc_loss(&c->w, &l);
  /* Dropped records, wherever they were lost; incomplete when the final counts never came. */
  cm__record_close(hb->rec, c->cap, c->w.batches, c->w.records, l.dropped, l.incomplete != 0);
  c->cap = NULL;
}

static void conn_closed(uv_handle_t *hd) {
  conn *c = hd->data;
  hub *hb = g_hub;
  hb->partial_total -= c->partial;
  close_capture(hb, c);
  for (conn **p = &hb->conns; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  hb->nconns--;
  cm__wsrc_release(&c->w);
  cm_wire_reader_free(c->r);
  free(c->flushes);
  free(c->sent_select);
  free(c->hello);
  free(c);
  if (hb->attach && !hb->attach_all && !hb->conns && !hb->detach_pending) finish(hb);
  maybe_finish(hb);
}

static void window_finish(conn *c, int status);

/* Closes the pipe; pending flushes complete with CM_EIO, and an open window ends with what it
 * received (complete when the process said BYE). Idempotent. */
static void conn_close(conn *c) {
  c->state = CONN_CLOSING;
  /* Nothing more is read: its partly received frame leaves the budget now. */
  g_hub->partial_total -= c->partial;
  c->partial = 0;
  while (c->nflush) flush_complete(c, 0, CM_EIO);
  if (c->win) window_finish(c, c->w.end == CM__END_BYE ? 0 : CM_EIO);
  if (!uv_is_closing((uv_handle_t *)&c->pipe)) uv_close((uv_handle_t *)&c->pipe, conn_closed);
}

/* Detaches the source now (process_exit runs), or closes the connection when never attached. */
static void conn_detach_now(conn *c) {
  c->await_status = 0;
  if (c->w.attached) cm__wsrc_detach(&c->w); /* calls conn_detached */
  else conn_close(c);
}

/* The command's own exit status reached a connection of its process. */
static void conn_set_status(conn *c, int status) {
  c->w.exit_code = status;
  c->w.exit_known = 1;
}

/* An outward connection that will never be attached: named, and a named pid fails the run. */
static void attach_failed(hub *hb, conn *c, const char *why) {
  fprintf(stderr, "cuptimon-lua: cannot attach to pid %d: %s\n", (int)c->kpid, why);
  if (!hb->attach_all) hb->attach_failed = 1;
}

/* Ends the process's connection: process_exit runs when it was attached. */
static void conn_end(conn *c, int end) {
  hub *hb = g_hub;
  if (c->outward && !c->w.have_hello && c->state != CONN_CLOSING)
    attach_failed(hb, c, "it closed the connection without a HELLO (the agent refused this "
                  "monitor, or it is exiting; its stderr says why)");
  if (c->w.end == CM__END_NONE) c->w.end = end;
  c->state = CONN_CLOSING; /* nothing more is sent: the unobserves below change no SELECT */
  if (c->w.attached && hb->proc.started && c->kpid == cm__proc_pid(&hb->proc)) {
    if (hb->proc_done) {
      conn_set_status(c, hb->cmd_status);
    } else if (c->w.end == CM__END_BYE && c->w.exit_code >= 0) {
      /* The agent's exit handler gave the status of exit(): no wait for the reap. */
      hb->cmd_exiting = 1;
      hb->bye_status = c->w.exit_code;
      conn_set_status(c, c->w.exit_code);
    } else if (c->w.end == CM__END_BYE || c->w.end == CM__END_EOF) {
      /* The process is exiting: its status comes within moments (bounded by tick_cb). */
      c->await_status = 1;
      c->await_deadline = uv_now(hb->loop) + 2000;
      uv_read_stop((uv_stream_t *)&c->pipe);
      return;
    }
  }
  conn_detach_now(c);
}

/* The HELLO of an admitted connection: the gate checked its token and answered it, so this
 * records it, attaches the process (process_start hooks run) and corrects the gate's answer when
 * the selection or the cadences changed since the gate's copy was published. */
static void on_hello(hub *hb, conn *c, const cm_wire_frame *f) {
  cm_wire_hello hl;
  char err[CM_WIRE_ERRMSG_SIZE + 64] = "";
  int rc = cm__wsrc_frame(&c->w, f, err, sizeof err);
  if (rc) { /* the gate decoded it already: only memory can fail here */
    agent_log(hb, "cuptimon-lua: agent pid %d: %s; closing its connection\n", (int)c->kpid, err);
    conn_end(c, CM__END_ERROR);
    return;
  }
  /* The process table carries the kernel's pid, never the one the peer wrote. */
  c->w.pid = (uint32_t)c->kpid;
  if (hb->rec && cm_wire_decode_hello(f, &hl) == 0) {
    c->cap = cm__record_open(hb->rec, (uint32_t)c->kpid, &hl);
    cm_wire_hello_release(&hl);
  }
  free(c->hello);
  c->hello = malloc(f->len ? f->len : 8);
  if (c->hello) {
    memcpy(c->hello, f->payload, f->len);
    c->hello_frame = *f;
    c->hello_frame.payload = c->hello;
    c->hello_frame.reader = NULL;
  }
  /* After the script's end (cm__hub_forget_host) there is no host to attach to: an outward
   * connection is closed before HELLO_ACK, so the agent stays dormant. */
  if (!hb->host) {
    if (c->outward) attach_failed(hb, c, "the script ended before the handshake completed; nothing was traced");
    else agent_log(hb, "cuptimon-lua: agent pid %d connected after the script ended; not traced\n", (int)c->kpid);
    conn_end(c, CM__END_ERROR);
    return;
  }
  hb->attached_any = 1;
  if (c->outward) {
    /* The gate's part of the handshake, done here: the agent waits on its listener thread. */
    char *u = current_union(hb);
    cm_wire_buf b;
    cm_wire_buf_init(&b);
    cm_wire_kv kv[2];
    uint32_t n = 0;
    if (hb->flush_ms) kv[n++] = (cm_wire_kv){.name = "flush_ms", .value = hb->flush_ms};
    if (hb->deliver_ms) kv[n++] = (cm_wire_kv){.name = "deliver_ms", .value = hb->deliver_ms};
    int wrc = u ? 0 : CM_ENOMEM;
    if (!wrc && n) wrc = cm_wire_write_configure(&b, kv, n);
    if (!wrc) wrc = cm_wire_write_select(&b, u);
    if (!wrc) wrc = cm_wire_write_hello_ack(&b, 0, "");
    if (wrc) {
      cm_wire_buf_free(&b);
      free(u);
      fprintf(stderr, "cuptimon-lua: cannot answer pid %d: %s\n", (int)c->kpid, cm_strerror(wrc));
      conn_end(c, CM__END_ERROR);
      return;
    }
    conn_send(c, &b, 0);
    cm_wire_buf_free(&b);
    free(c->sent_select);
    c->sent_select = u;
    c->sent_flush_ms = hb->flush_ms;
    c->sent_deliver_ms = hb->deliver_ms;
  }
  c->w.extra = hb->extra;
  c->w.union_spec = c->sent_select;
  c->sent_select = NULL;
  c->handshaking = 1;
  c->state = CONN_ACTIVE;
  /* After the script's end (cm__hub_forget_host) there is no host to attach to. */
  rc = hb->host ? cm__wsrc_attach(&c->w, hb->host) : CM_ESTATE;
  c->handshaking = 0;
  if (rc) {
    fprintf(stderr, "cuptimon-lua: cannot attach agent pid %u: %s\n", c->w.pid, cm_strerror(rc));
    conn_end(c, CM__END_ERROR);
    return;
  }
  if (c->state != CONN_ACTIVE) return; /* a process_start hook ended the run */
  if (hb->flush_ms != c->sent_flush_ms || hb->deliver_ms != c->sent_deliver_ms) {
    send_configure(c, hb->flush_ms != c->sent_flush_ms ? hb->flush_ms : 0,
                   hb->deliver_ms != c->sent_deliver_ms ? hb->deliver_ms : 0);
    c->sent_flush_ms = hb->flush_ms;
    c->sent_deliver_ms = hb->deliver_ms;
  }
  char *u = cm__wsrc_union(&c->w);
  if (u && (!c->w.union_spec || strcmp(u, c->w.union_spec) != 0)) {
    free(c->w.union_spec);
    c->w.union_spec = u;
    conn_select(&c->w, u);
  } else {
    free(u);
  }
  /* The attach applied the script's PM request (vt->pm) while the handshake held it back. */
  if (c->w.pm_spec && *c->w.pm_spec) conn_pm(&c->w, c->w.pm_spec);
}

/* ---- trigger windows ------------------------------------------------------------------------ */

/* The live connection whose source is `s`, or NULL (a replay, the in-process engine, an ended
 * process). */
static conn *conn_of(cm_source *s) {
  if (!g_hub) return NULL;
  for (conn *c = g_hub->conns; c; c = c->next)
    if (&c->w.base == s) return c->state == CONN_ACTIVE && c->w.attached ? c : NULL;
  return NULL;
}

static int live_shed(cm_source *s, uint64_t kinds) {
  conn *c = conn_of(s);
  if (!c) return CM_ESTATE;
  cm__wsrc_set_shed(&c->w, kinds);
  return 0;
}

/* The opening fence completed: the frames from here on are the window's. */
static void window_opened(void *ud, int status) {
  conn *c = ud;
  if (c->win) cm__window_opened(c->win, &c->w, status);
}

/* Ends the connection's window, if one is open (window.c frees it). */
static void window_finish(conn *c, int status) {
  cm__window *win = c->win;
  if (!win) return;
  c->win = NULL;
  cm__window_finish(win, &c->w, status);
}

static void window_closed(void *ud, int status) { window_finish(ud, status); }


static int live_window_begin(cm_source *s, const char *path, int force, cm__window_done_fn done,
                             void *ud) {
  conn *c = conn_of(s);
  if (!c) return CM_ESTATE;
  if (c->win) return CM_EBUSY;
  cm__window *win;
  int rc = cm__window_new(&win, path, force, c->hello ? &c->hello_frame : NULL,
                          (uint32_t)c->kpid, &c->w, done, ud);
  if (rc) return rc;
  c->win = win;
  return conn_flush(&c->w, CM_FLUSH_SYNC, 0, window_opened, c);
}


static int live_window_end(cm_source *s) {
  conn *c = conn_of(s);
  if (!c || !c->win) return CM_ENOENT;
  if (cm__window_end(c->win)) return 0;
  return conn_flush(&c->w, CM_FLUSH_SYNC, 0, window_closed, c);
}

/* Whether this run takes live agents (`-- cmd` or --attach), not a replay. */
static int live_agents(void) { return g_hub && (g_hub->live || g_hub->attach); }

/* Whether the command could not be started: cm__proc_spawn failed (printing why), so it never
 * ran. A signal before the start (cm__hub_signal) is not such a failure. */
static int live_command_failed(void) {
  return g_hub && g_hub->live && g_hub->proc.done && !g_hub->proc.started;
}

static const cm__live_ops live_ops = {
    .shed = live_shed, .window_begin = live_window_begin, .window_end = live_window_end,
    .agents = live_agents, .command_failed = live_command_failed,
};

static void on_frame(hub *hb, conn *c, const cm_wire_frame *f) {
  if (!c->w.have_hello && c->outward && f->type == CM_WIRE_BYE) {
    /* A dormant agent's refusal (another monitor is attached, or it is exiting). */
    cm_wire_bye bye;
    memset(&bye, 0, sizeof bye);
    int drc = cm_wire_decode_bye(f, &bye);
    char clean[1024];
    fprintf(stderr, "cuptimon-lua: cannot attach to pid %d: %s\n", (int)c->kpid,
            drc == 0 && bye.message ? cm__text_tmp(bye.message, clean, sizeof clean) : "the agent refused");
    if (!hb->attach_all) hb->attach_failed = 1;
    c->state = CONN_CLOSING;
    conn_close(c);
    return;
  }
  if (!c->w.have_hello) { /* the gate admitted it on this very frame */
    if (c->outward && f->type != CM_WIRE_HELLO) {
      agent_log(hb, "cuptimon-lua: pid %d sent %s before HELLO; closing the connection\n",
              (int)c->kpid, cm_wire_type_name(f->type) ? cm_wire_type_name(f->type) : "a frame");
      conn_end(c, CM__END_ERROR);
      return;
    }
    on_hello(hb, c, f);
    return;
  }
  cm__record_frame(c->cap, f);
  if (f->type == CM_WIRE_FLUSH_DONE) {
    uint64_t id;
    int32_t status;
    if (cm_wire_decode_flush_done(f, &id, &status) == 0)
      for (int i = 0; i < c->nflush; i++)
        if (c->flushes[i].id == id) {
          flush_complete(c, i, status);
          break;
        }
    return;
  }
  char err[CM_WIRE_ERRMSG_SIZE + 64] = "";
  int rc = cm__wsrc_frame(&c->w, f, err, sizeof err);
  if (rc) {
    agent_log(hb, "cuptimon-lua: agent pid %u: %s; closing its connection\n", c->w.pid, err);
    conn_end(c, CM__END_ERROR);
    return;
  }
  if (c->win) cm__window_frame(c->win, f);
  if (f->type == CM_WIRE_BYE) conn_end(c, CM__END_BYE);
}

static void alloc_cb(uv_handle_t *hd, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn *c = hd->data;
  *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

/* Feeds bytes to the connection's reader and handles the frames they complete. */
static void conn_feed(hub *hb, conn *c, const void *data, size_t len) {
  int rc = cm_wire_reader_feed(c->r, data, len);
  cm_wire_frame f;
  while (rc == 0 && c->state != CONN_CLOSING) {
    rc = cm_wire_reader_next(c->r, &f);
    if (rc == 1) {
      on_frame(hb, c, &f);
      rc = 0;
    } else {
      break;
    }
  }
  if (rc == 0 && c->state != CONN_CLOSING) {
    /* The frame being received counts against the run's budget from its header on, so a peer
     * that declares a big frame and sends it slowly holds no more than the others leave. */
    uint64_t p = cm_wire_reader_pending(c->r);
    hb->partial_total += p - c->partial;
    c->partial = p;
    if (hb->partial_total > hb->partial_budget && p > (1u << 20)) {
      if (hb->over_budget++ < 3)
        fprintf(stderr, "cuptimon-lua: agent pid %u: its partly received frame of %llu bytes puts the "
                "frames being received over the budget of %llu MiB (CUPTIMON_PARTIAL_BUDGET_MB); "
                "closing its connection\n", c->w.pid, (unsigned long long)p,
                (unsigned long long)(hb->partial_budget >> 20));
      hb->partial_total -= c->partial;
      c->partial = 0;
      conn_end(c, CM__END_ERROR);
      return;
    }
  }
  if (rc == CM_ERANGE && c->state != CONN_CLOSING) {
    agent_log(hb, "cuptimon-lua: agent pid %u sent a frame over the wire format's size limit "
            "(%s); closing its connection\n", c->w.pid, cm_wire_reader_errmsg(c->r));
    conn_end(c, CM__END_ERROR);
  } else if (rc < 0 && c->state != CONN_CLOSING) {
    agent_log(hb, "cuptimon-lua: agent pid %u: corrupt stream (%s); closing its connection\n",
            c->w.pid, cm_wire_reader_errmsg(c->r));
    conn_end(c, CM__END_ERROR);
  }
}

static void read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  conn *c = st->data;
  hub *hb = g_hub;
  (void)buf;
  if (nread == 0 || c->state == CONN_CLOSING) return;
  if (nread < 0) {
    if (nread != UV_EOF)
      agent_log(hb, "cuptimon-lua: agent pid %u: read error: %s\n", c->w.pid, uv_strerror((int)nread));
    conn_end(c, CM__END_EOF);
    return;
  }
  conn_feed(hb, c, c->rbuf, (size_t)nread);
}

static void free_data(uv_handle_t *hd) {
  conn *c = hd->data;
  cm_wire_reader_free(c->r);
  free(c->sent_select);
  free(c);
}

/* Takes a connection the gate admitted: from here on the loop thread owns it. */
static conn *conn_admit(hub *hb, cm__gate_conn *gc) {
  conn *c = calloc(1, sizeof *c);
  if (!c) {
    close(gc->fd);
    return NULL;
  }
  cm__wsrc_init(&c->w, &conn_ops, c, "agent");
  c->kpid = gc->pid;
  c->sent_select = gc->select;
  gc->select = NULL;
  c->sent_flush_ms = gc->flush_ms;
  c->sent_deliver_ms = gc->deliver_ms;
  c->state = CONN_ACTIVE;
  uv_pipe_init(hb->loop, &c->pipe, 0);
  c->pipe.data = c;
  if (uv_pipe_open(&c->pipe, gc->fd) || cm_wire_reader_new(&c->r, 0)) {
    close(gc->fd);
    uv_close((uv_handle_t *)&c->pipe, free_data);
    return NULL;
  }
  c->next = hb->conns;
  hb->conns = c;
  hb->nconns++;
  uv_read_start((uv_stream_t *)&c->pipe, alloc_cb, read_cb);
  if (gc->len) conn_feed(hb, c, gc->bytes, gc->len);
  return c;
}

static void admit_cb(uv_async_t *a) {
  hub *hb = a->data;
  cm__gate_conn gc;
  while (hb->gate && cm__gate_take(hb->gate, &gc)) {
    if (hb->finished) {
      close(gc.fd);
    } else if ((uint32_t)hb->nconns >= hb->max_conns) {
      /* The token is readable in a traced process's environment: a cap on the connections that
       * present it bounds what one leak of it can open. */
      if (hb->over_cap++ < 3)
        fprintf(stderr, "cuptimon-lua: agent pid %d: over the cap of %u connections per run "
                "(CUPTIMON_MAX_AGENTS); closing its connection\n", (int)gc.pid, hb->max_conns);
      close(gc.fd);
    } else {
      conn_admit(hb, &gc);
    }
    cm__gate_conn_release(&gc);
  }
}

/* Runs on the gate thread. */
static void gate_admitted(void *ud) { uv_async_send(&((hub *)ud)->admit_async); }

/* Observers of the script, collected into a wire source that is never attached, for the union. */
static int probe_observer(void *ud, uint32_t id, const cm_selection *sel, const char *spec) {
  cm__wsrc *w = ud;
  return w->base.vt->observe(&w->base, id, sel, spec);
}

static const cm__wsrc_ops probe_ops = {0};

/* The union selection a process attached now would get, or NULL (out of memory). */
static char *current_union(hub *hb) {
  cm__wsrc probe;
  memset(&probe, 0, sizeof probe);
  cm__wsrc_init(&probe, &probe_ops, NULL, "agent");
  probe.extra = hb->extra;
  if (hb->host) cm_host_each_observer(hb->host, probe_observer, &probe);
  char *u = cm__wsrc_union(&probe);
  cm__wsrc_release(&probe);
  return u;
}

/* Publishes to the gate what a new agent's handshake must answer, when it changed. */
static void publish(hub *hb) {
  if (!hb->gate) return;
  char *u = current_union(hb);
  if (!u) return;
  if (hb->published && strcmp(u, hb->published) == 0 && hb->pub_flush_ms == hb->flush_ms &&
      hb->pub_deliver_ms == hb->deliver_ms) {
    free(u);
    return;
  }
  if (cm__gate_publish(hb->gate, u, hb->flush_ms, hb->deliver_ms) == 0) {
    free(hb->published);
    hb->published = u;
    hb->pub_flush_ms = hb->flush_ms;
    hb->pub_deliver_ms = hb->deliver_ms;
  } else {
    free(u);
  }
}

/* Completes flushes whose deadline passed (an agent that stopped answering), ends the wait for
 * an exit status that does not come, and keeps the gate's answer current. */
static void tick_cb(uv_timer_t *t) {
  hub *hb = t->data;
  uint64_t now = uv_now(hb->loop);
  publish(hb);
  for (conn *c = hb->conns; c; c = c->next)
    if (c->await_status && c->await_deadline <= now) {
      conn_detach_now(c);
      break; /* the list may have changed; the next tick goes on */
    }
  for (conn *c = hb->conns; c; c = c->next)
    if (c->outward && !c->w.have_hello && c->state == CONN_ACTIVE && c->hello_deadline <= now) {
      char why[160];
      snprintf(why, sizeof why, "no HELLO within %ld ms (the process is stopped, or its agent's "
               "listener is not answering)", attach_hello_ms());
      attach_failed(hb, c, why);
      c->state = CONN_CLOSING;
      conn_close(c);
      break;
    }
  for (conn *c = hb->conns; c; c = c->next)
    for (int i = 0; i < c->nflush; i++)
      if (c->flushes[i].deadline <= now) {
        agent_log(hb, "cuptimon-lua: agent pid %u did not answer a flush in time\n", c->w.pid);
        flush_complete(c, i, CM_ETIMEDOUT);
        i = -1; /* the done may have changed the list */
      }
}

/* ---- the command ------------------------------------------------------------------------------------ */

static void proc_exit(void *ud, int status, int64_t exit_status, int term_signal) {
  hub *hb = ud;
  (void)exit_status, (void)term_signal;
  hb->proc_done = 1;
  hb->cmd_status = status;
  if (hb->cmd_exiting && status != hb->bye_status)
    fprintf(stderr, "cuptimon-lua: the command ended with status %d after its agent reported %d "
            "(process_exit has %d): it failed or was stopped while tearing down\n", status,
            hb->bye_status, hb->bye_status);
  int pid = cm__proc_pid(&hb->proc);
  for (conn *c = hb->conns; c; c = c->next)
    if (c->kpid == pid && c->w.attached) conn_set_status(c, status);
  for (int again = 1; again;) { /* a detach runs Lua, which may change the list */
    again = 0;
    for (conn *c = hb->conns; c; c = c->next)
      if (c->await_status) {
        conn_detach_now(c);
        again = 1;
        break;
      }
  }
  maybe_finish(hb);
}

/* Where an installed cuptimon-lua finds the installed agent, relative to its own directory (the
 * build sets it from the install's bin and lib directories). */
#ifndef CM__AGENT_RELDIR
#define CM__AGENT_RELDIR "../lib"
#endif

static int find_agent(hub *hb) {
  const char *env = getenv("CUPTIMON_AGENT");
  if (env && *env) {
    if (access(env, R_OK) != 0) {
      fprintf(stderr, "cuptimon-lua: CUPTIMON_AGENT=%s: %s\n", env, strerror(errno));
      return CM_ENOENT;
    }
    if (!realpath(env, hb->agent)) snprintf(hb->agent, sizeof hb->agent, "%s", env);
    return 0;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) n = 0;
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (slash) *slash = 0;
  char a[PATH_MAX + 64], b[PATH_MAX + 64];
  snprintf(a, sizeof a, "%s/libcuptimon-agent.so", exe);
  snprintf(b, sizeof b, "%s/" CM__AGENT_RELDIR "/libcuptimon-agent.so", exe);
  const char *found = access(a, R_OK) == 0 ? a : access(b, R_OK) == 0 ? b : NULL;
  if (!found) {
    fprintf(stderr,
            "cuptimon-lua: cannot find the agent library libcuptimon-agent.so (looked for %s and "
            "%s); set CUPTIMON_AGENT to its path\n", a, b);
    return CM_ENOENT;
  }
  if (!realpath(found, hb->agent))
    snprintf(hb->agent, sizeof hb->agent, "%.*s", (int)sizeof hb->agent - 1, found);
  return 0;
}

static void spawn_cb(uv_timer_t *t) {
  hub *hb = t->data;
  char v[4][PATH_MAX + 64];
  snprintf(v[0], sizeof v[0], "CUDA_INJECTION64_PATH=%s", hb->agent);
  snprintf(v[1], sizeof v[1], "NVTX_INJECTION64_PATH=%s", hb->agent);
  snprintf(v[2], sizeof v[2], "CUPTIMON_SOCKET=%s", hb->sock);
  snprintf(v[3], sizeof v[3], "CUPTIMON_TOKEN=%s", hb->token);
  const char *env[] = {v[0], v[1], v[2], v[3], NULL};
  cm__proc_spawn(&hb->proc, hb->cmd, env);
}

/* ---- the interface to lua_main.c ------------------------------------------------------------------- */

static int make_token(char out[33]) {
  unsigned char r[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return CM_EIO;
  ssize_t got = read(fd, r, sizeof r);
  close(fd);
  if (got != (ssize_t)sizeof r) return CM_EIO;
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
  return 0;
}

/* Removes the private directories that monitors killed with SIGKILL left in `base`: a
 * "cuptimon-XXXXXX" directory of ours (not a symlink, mode 0700) whose agent.sock, older than
 * STALE_S seconds, refuses connections (no monitor listens on it). Nothing else is touched: the
 * rmdir fails when the directory holds anything more. */
enum { STALE_S = 10 };

static void remove_stale_dirs(const char *base) {
  DIR *d = opendir(base);
  if (!d) return;
  struct dirent *e;
  time_t now = time(NULL);
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, "cuptimon-", 9) != 0 || strlen(e->d_name) != 15) continue;
    char dir[PATH_MAX], sock[PATH_MAX + 16];
    struct stat st;
    if (snprintf(dir, sizeof dir, "%s/%s", base, e->d_name) >= (int)sizeof dir) continue;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 0777) != 0700)
      continue;
    snprintf(sock, sizeof sock, "%s/agent.sock", dir);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(sock) >= sizeof sa.sun_path || lstat(sock, &st) != 0 || !S_ISSOCK(st.st_mode) ||
        st.st_uid != geteuid() || now - st.st_mtime < STALE_S)
      continue;
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int refused = connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno == ECONNREFUSED;
    close(fd);
    if (!refused) continue;
    if (unlink(sock) == 0 && rmdir(dir) == 0)
      fprintf(stderr, "cuptimon-lua: removed %s, left by a monitor that was killed\n", dir);
  }
  closedir(d);
}

static int make_socket(hub *hb) {
  const char *tmp = getenv("TMPDIR");
  remove_stale_dirs(tmp && *tmp ? tmp : "/tmp");
  for (int attempt = 0; attempt < 2; attempt++) {
    const char *base = attempt == 0 && tmp && *tmp ? tmp : "/tmp";
    snprintf(hb->dir, sizeof hb->dir, "%s/cuptimon-XXXXXX", base);
    /* A unix socket path holds at most 107 bytes: fall back to /tmp for a long TMPDIR. */
    if (strlen(hb->dir) + 16 >= sizeof(((struct sockaddr_un *)0)->sun_path)) continue;
    if (!mkdtemp(hb->dir)) { /* mkdtemp makes it 0700 */
      if (attempt == 0) continue;
      fprintf(stderr, "cuptimon-lua: cannot create a private directory in %s: %s\n", base,
              strerror(errno));
      hb->dir[0] = 0;
      return CM_EIO;
    }
    /* Copied, not formatted: the length was checked above, which a compiler cannot see
     * through snprintf (it warned that the output may be truncated). */
    size_t dlen = strlen(hb->dir);
    memcpy(hb->sock, hb->dir, dlen);
    memcpy(hb->sock + dlen, "/agent.sock", sizeof "/agent.sock");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, hb->sock, strlen(hb->sock) + 1); /* the length was checked above */
    hb->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    /* The directory is 0700 already; the socket itself is 0600 too, and the gate checks each
     * peer's uid (SO_PEERCRED) besides. */
    if (hb->listen_fd < 0 || bind(hb->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        chmod(hb->sock, 0600) != 0 || listen(hb->listen_fd, SOMAXCONN) != 0) {
      fprintf(stderr, "cuptimon-lua: cannot listen on %s: %s\n", hb->sock, strerror(errno));
      return CM_EIO;
    }
    return 0;
  }
  fprintf(stderr, "cuptimon-lua: no directory short enough for a unix socket\n");
  return CM_EIO;
}

static void replay_finished(void *ud, int status) {
  hub *hb = ud;
  hb->finished = 1;
  hb->status = status;
  uv_stop(hb->loop);
}

/* ---- --attach -------------------------------------------------------------------------------------- */

static int tried_before(hub *hb, int pid) {
  for (int i = 0; i < hb->ntried; i++)
    if (hb->tried[i] == pid) return 1;
  return 0;
}

/* Connects to the dormant agent of `pid` (once per run); its HELLO arrives on the loop. Returns 0,
 * or -1 after printing why. */
static int attach_pid(hub *hb, int pid) {
  if (tried_before(hb, pid)) return 0;
  if (hb->ntried == hb->cap_tried) {
    int cap = hb->cap_tried ? hb->cap_tried * 2 : 64;
    int *t = realloc(hb->tried, (size_t)cap * sizeof *t);
    if (!t) return -1;
    hb->tried = t;
    hb->cap_tried = cap;
  }
  hb->tried[hb->ntried++] = pid;
  char err[1024];
  int fd = cm__attach_connect(hb->adir, pid, err, sizeof err);
  if (fd < 0) {
    fprintf(stderr, "cuptimon-lua: cannot attach to pid %d: %s\n", pid, err);
    return -1;
  }
  cm__gate_conn gc = {.fd = fd, .pid = pid, .uid = geteuid()};
  conn *c = conn_admit(hb, &gc);
  if (!c) return -1;
  c->outward = 1;
  c->hello_deadline = uv_now(hb->loop) + (uint64_t)attach_hello_ms();
  return 0;
}

/* --attach all: every dormant agent in the directory not attached before. */
static void attach_scan(hub *hb) {
  int pids[4096];
  int n = cm__attach_scan(hb->adir, pids, 4096);
  for (int i = 0; i < n && !hb->finished; i++)
    if (pids[i] != (int)getpid()) attach_pid(hb, pids[i]);
}

static void watch_cb(uv_fs_event_t *w, const char *name, int events, int status) {
  (void)name, (void)events, (void)status;
  hub *hb = w->data;
  if (!hb->finished) attach_scan(hb);
}

/* A safety net for the directory watch (events can be coalesced or lost): a rescan each second. */
static void scan_cb(uv_timer_t *t) {
  hub *hb = t->data;
  if (!hb->finished) attach_scan(hb);
}

static void stop_watch(hub *hb) {
  if (hb->watch_init && !uv_is_closing((uv_handle_t *)&hb->watch))
    uv_close((uv_handle_t *)&hb->watch, NULL);
  if (hb->scan_init && !uv_is_closing((uv_handle_t *)&hb->scan_timer))
    uv_close((uv_handle_t *)&hb->scan_timer, NULL);
}

/* Starts --attach: the named pids, or `all` and the watch for new ones. */
static void attach_start(hub *hb) {
  if (!hb->attach_all) {
    /* The directory's stale sockets go first, as --list would remove them. */
    int none[1];
    cm__attach_scan(hb->adir, none, 0);
    for (int i = 0; i < hb->ntargets; i++)
      if (attach_pid(hb, hb->targets[i]) != 0) hb->attach_failed = 1;
    if (!hb->conns) finish(hb);
    return;
  }
  if (uv_fs_event_init(hb->loop, &hb->watch) == 0) {
    hb->watch_init = 1;
    hb->watch.data = hb;
    if (uv_fs_event_start(&hb->watch, watch_cb, hb->adir, 0) != 0)
      fprintf(stderr, "cuptimon-lua: cannot watch %s; looking for new processes every second\n",
              hb->adir);
  }
  /* Referenced: with `all` the run goes on until Control-C, with or without processes. */
  if (uv_timer_init(hb->loop, &hb->scan_timer) == 0) {
    hb->scan_init = 1;
    hb->scan_timer.data = hb;
    uv_timer_start(&hb->scan_timer, scan_cb, 1000, 1000);
  }
  attach_scan(hb);
}

/* The detach flush of connection `ud` completed (its pending flushes complete before the
 * connection is freed, so `ud` is still valid here). */
static void detach_done(void *ud, int status) {
  conn *c = ud;
  if (status == 0 && c->w.end == CM__END_NONE) c->w.end = CM__END_DETACHED;
  if (g_hub && g_hub->detach_pending > 0) g_hub->detach_pending--;
}

static void detach_timeout(uv_timer_t *t) {
  hub *hb = t->data;
  fprintf(stderr, "cuptimon-lua: %d agent%s did not answer the detach within 10 s\n",
          hb->detach_pending, hb->detach_pending == 1 ? "" : "s");
  hb->detach_pending = 0;
}

void cm__hub_detach(void) {
  hub *hb = g_hub;
  if (!hb || !hb->attach) return;
  hb->finished = 1;
  stop_watch(hb);
  for (conn *c = hb->conns; c; c = c->next)
    if (c->outward && !c->w.have_hello && c->state == CONN_ACTIVE) {
      /* The script ended before this agent's HELLO: it was never traced. */
      attach_failed(hb, c, "the script ended before the agent's HELLO came; nothing was traced");
      c->state = CONN_CLOSING;
      conn_close(c);
    }
  for (conn *c = hb->conns; c; c = c->next) {
    if (c->state != CONN_ACTIVE || !c->w.attached || c->detaching) continue;
    cm_wire_buf b;
    cm_wire_buf_init(&b);
    if (cm_wire_write_select(&b, "") == 0) conn_send(c, &b, 0);
    cm_wire_buf_free(&b);
    hb->detach_pending++;
    conn_flush(&c->w, CM_FLUSH_SYNC, 5000, detach_done, c);
    c->detaching = 1;
  }
  if (hb->detach_pending <= 0) return;
  uv_timer_start(&hb->drain_timer, detach_timeout, 10000, 0);
  while (hb->detach_pending > 0)
    if (uv_run(hb->loop, UV_RUN_ONCE) == 0 && !uv_loop_alive(hb->loop)) break;
  uv_timer_stop(&hb->drain_timer);
}

/* The kinds --record traces when no script selects anything and --select is not given. */
static const char default_record_select[] =
    "kernel;memcpy;memcpy2;memset;runtime;synchronization;marker;marker_data";

int cm__main_attach(cm_host *h, uv_loop_t *loop, const cm__main_request *req) {
  hub *hb = calloc(1, sizeof *hb);
  if (!hb) return CM_ENOMEM;
  g_hub = hb;
  hb->host = h;
  hb->loop = loop;
  cm__host_set_live_ops(h, &live_ops);
  hb->listen_fd = -1;
  uv_timer_init(loop, &hb->spawn_timer);
  uv_timer_init(loop, &hb->drain_timer);
  uv_timer_init(loop, &hb->tick_timer);
  hb->spawn_timer.data = hb->drain_timer.data = hb->tick_timer.data = hb;
  cm__proc_init(&hb->proc, loop, proc_exit, hb);
  hb->timers_init = 1;
  hb->partial_budget = cm__env_u64("CUPTIMON_PARTIAL_BUDGET_MB", 256) << 20;
  hb->max_conns = (uint32_t)cm__env_u64("CUPTIMON_MAX_AGENTS", 4096);
  if (hb->partial_budget == 0 || hb->partial_budget > ((uint64_t)64 << 30)) hb->partial_budget = (uint64_t)256 << 20;
  if (hb->max_conns == 0) hb->max_conns = 4096;
  if (req->attach) {
    if (req->cmd || req->nreplay || req->record || req->select) {
      fprintf(stderr, "cuptimon-lua: --attach cannot be combined with `-- cmd`, --replay, --record "
              "or --select\n");
      return CM_EINVAL;
    }
    int all = cm__attach_parse(req->attach, hb->targets, 256, &hb->ntargets);
    if (all < 0) return CM_EINVAL;
    int rc = cm__attach_dir(hb->adir, sizeof hb->adir);
    if (rc == CM_ENOENT) {
      if (!all) {
        fprintf(stderr, "cuptimon-lua: no dormant cuptimon agent of this user (no directory %s); "
                "start the processes with CUPTIMON_LISTEN=1\n", hb->adir);
        return CM_ENOENT;
      }
      /* `all` waits for the first process: the directory is made as an agent would. */
      char err[512];
      rc = cm_wire_listen_dir(hb->adir, sizeof hb->adir, CM_WIRE_LISTEN_CREATE, err, sizeof err);
      if (rc) fprintf(stderr, "cuptimon-lua: %s\n", err);
    }
    if (rc) return rc;
    hb->attach = 1;
    hb->attach_all = all;
    signal(SIGPIPE, SIG_IGN);
    uv_timer_start(&hb->tick_timer, tick_cb, 100, 100);
    uv_unref((uv_handle_t *)&hb->tick_timer);
    return 0;
  }
  if (req->nreplay) {
    if (req->cmd || req->record) {
      fprintf(stderr, "cuptimon-lua: --replay cannot be combined with `-- cmd` or --record\n");
      return CM_EINVAL;
    }
    hb->replay = 1;
    return cm__replay_start(h, loop, req->replay, req->nreplay, replay_finished, hb);
  }
  if (!req->cmd) {
    fprintf(stderr, "cuptimon-lua: --record needs a command: cuptimon-lua --record FILE -- cmd args\n");
    return CM_EINVAL;
  }
  hb->live = 1;
  hb->cmd = req->cmd;
  /* An agent that goes away mid-write must not kill the monitor; uv_spawn resets the
   * disposition in the command, so it still gets the default. */
  signal(SIGPIPE, SIG_IGN);
  if (req->record) {
    int rc = cm__record_new(&hb->rec, req->record, req->force ? CM__RECORD_FORCE : 0);
    if (rc) return rc;
  }
  const char *sel = req->select;
  if (!sel && req->record && !req->has_script) sel = default_record_select;
  if (sel) {
    int rc = cm_selection_new(&hb->extra);
    if (!rc) rc = cm_selection_parse(hb->extra, sel);
    if (rc) {
      fprintf(stderr, "cuptimon-lua: --select %s: %s\n", sel, cm_errmsg());
      return CM_EINVAL;
    }
  }
  int rc = find_agent(hb);
  if (!rc) rc = make_token(hb->token);
  if (!rc) rc = make_socket(hb);
  if (rc) return rc;
  uv_timer_start(&hb->tick_timer, tick_cb, 100, 100);
  uv_unref((uv_handle_t *)&hb->tick_timer);
  return 0;
}

void cm__hub_start(void) {
  hub *hb = g_hub;
  if (hb && hb->attach && !hb->ntried && !hb->finished) {
    attach_start(hb);
    return;
  }
  /* The command starts on the loop's first turn, after the script has registered its observers,
   * so the first SELECT already holds them; a script that fails to load never starts it. */
  if (!hb || !hb->live || hb->proc.started || hb->proc_done || hb->gate) return;
  /* The gate answers handshakes from what the script has registered by now. */
  cm__gate_options o = {
      .token = hb->token,
      .uid = geteuid(),
      .hello_timeout_ms = (uint32_t)cm__env_u64("CUPTIMON_HELLO_TIMEOUT_MS", 5000),
      .max_pending = (uint32_t)cm__env_u64("CUPTIMON_MAX_STARTUPS", 64),
      .hello_max_bytes = (uint32_t)cm__env_u64("CUPTIMON_HELLO_MAX_BYTES", 512u << 10),
      .admitted = gate_admitted,
      .ud = hb,
  };
  if (o.max_pending > 65536) o.max_pending = 65536;
  if (o.hello_max_bytes > (64u << 20)) o.hello_max_bytes = 64u << 20;
  if (uv_async_init(hb->loop, &hb->admit_async, admit_cb) == 0) {
    hb->async_init = 1;
    hb->admit_async.data = hb;
    uv_unref((uv_handle_t *)&hb->admit_async);
  }
  /* The first answer is set before the thread starts, so no handshake ever gets none. */
  hb->published = current_union(hb);
  o.select = hb->published;
  o.flush_ms = hb->pub_flush_ms = hb->flush_ms;
  o.deliver_ms = hb->pub_deliver_ms = hb->deliver_ms;
  if (!hb->async_init || !hb->published || cm__gate_start(&hb->gate, hb->listen_fd, &o) != 0) {
    fprintf(stderr, "cuptimon-lua: cannot start the handshake thread; the command runs untraced\n");
    hb->gate = NULL;
  }
  uv_timer_start(&hb->spawn_timer, spawn_cb, 0, 0);
}

int cm__hub_signal(int signum) {
  hub *hb = g_hub;
  if (!hb) return 0;
  hb->signals++;
  if (hb->attach) {
    if (hb->signals > 1) return 0; /* again: the caller leaves at once */
    /* Control-C is how --attach ends: the windows close (cm__hub_detach) and the status is 0. */
    finish(hb);
    return 1;
  }
  if (hb->replay) {
    hb->status = 128 + signum;
    cm__replay_free();
    hb->finished = 1;
    uv_stop(hb->loop);
    return 1;
  }
  if (!hb->live) return 0;
  if (!cm__proc_running(&hb->proc)) {
    /* Nothing to stop but the wait for agents. */
    if (!hb->proc_done) {
      hb->proc_done = 1;
      hb->cmd_status = 128 + signum;
    }
    finish(hb);
    return 1;
  }
  if (hb->signals == 1) {
    fprintf(stderr, "cuptimon-lua: %s: stopping the command (again to kill it)\n",
            signum == SIGINT ? "interrupted" : "terminated");
    cm__proc_stop(&hb->proc, signum);
  } else {
    cm__proc_kill(&hb->proc);
  }
  return 1;
}

int cm__hub_lost_handshakes(int32_t *pids, int max) {
  hub *hb = g_hub;
  if (!hb) return 0;
  int n = (int)hb->gate_lost.lost, kept = n < 16 ? n : 16;
  for (int i = 0; i < kept && i < max; i++) pids[i] = hb->gate_lost.lost_pids[i];
  return n;
}

int cm__hub_attach_failed(void) { return g_hub && g_hub->attach && g_hub->attach_failed; }

int cm__hub_finished(int *status) {
  hub *hb = g_hub;
  if (hb && hb->attach) {
    /* A named pid that could not be attached fails the run. */
    if (status) *status = hb->attach_failed ? 1 : 0;
    return 1;
  }
  if (!hb || !hb->finished) return 0;
  if (status) *status = !hb->live ? hb->status : hb->proc_done ? hb->cmd_status : hb->bye_status;
  /* A capture that could not be written fails a run that otherwise succeeded. */
  if (status && *status == 0 && cm__record_failures(hb->rec)) *status = 1;
  return 1;
}

/* SIGINT or SIGTERM while cuptimon-lua reaps the command after the exit hooks: forwarded as
 * during the run (the grace timer, then SIGKILL; a second signal kills at once). */
static void wait_signal_cb(uv_signal_t *s, int signum) {
  hub *hb = s->data;
  if (++hb->signals == 1)
    cm__proc_stop(&hb->proc, signum);
  else
    cm__proc_kill(&hb->proc);
}

void cm__hub_forget_host(void) {
  hub *hb = g_hub;
  if (!hb) return;
  cm__host_set_live_ops(hb->host, NULL);
  hb->host = NULL;
}

/* Whether the command is still to be reaped after the run: only after an end on its BYE (when
 * the script ended first, the command goes on untraced, and is neither waited for nor signalled). */
static int command_pending(const hub *hb) {
  return hb && hb->live && hb->finished && hb->cmd_exiting && !hb->proc_done;
}

void cm__hub_forward_signals(void) {
  hub *hb = g_hub;
  if (!command_pending(hb) || hb->wait_sig_on) return;
  const int signums[2] = {SIGINT, SIGTERM};
  for (int i = 0; i < 2; i++) {
    uv_signal_init(hb->loop, &hb->wait_sig[i]);
    hb->wait_sig[i].data = hb;
    uv_signal_start(&hb->wait_sig[i], wait_signal_cb, signums[i]);
    uv_unref((uv_handle_t *)&hb->wait_sig[i]);
  }
  hb->wait_sig_on = 1;
}

static void forward_signals_end(hub *hb) {
  if (!hb->wait_sig_on) return;
  for (int i = 0; i < 2; i++) uv_close((uv_handle_t *)&hb->wait_sig[i], NULL);
  hb->wait_sig_on = 0;
}

void cm__hub_wait_command(void) {
  hub *hb = g_hub;
  if (!hb) return;
  if (command_pending(hb)) {
    cm__hub_forward_signals();
    /* uv_run returns 0 when nothing is left to wait for (the process handle is gone). */
    while (!hb->proc_done)
      if (uv_run(hb->loop, UV_RUN_ONCE) == 0 && !hb->proc_done) break;
  }
  forward_signals_end(hb);
  uv_run(hb->loop, UV_RUN_NOWAIT);
}

static void close_if_open(uv_handle_t *hd) {
  if (!uv_is_closing(hd)) uv_close(hd, NULL);
}

void cm__hub_free(void) {
  hub *hb = g_hub;
  if (!hb) return;
  cm__replay_free();
  stop_gate(hb);
  /* Connections still open (the script ended first): close them and let the loop run their
   * close callbacks, which write the capture summaries. */
  for (conn *c = hb->conns; c; c = c->next)
    if (!uv_is_closing((uv_handle_t *)&c->pipe)) conn_close(c);
  if (hb->async_init) close_if_open((uv_handle_t *)&hb->admit_async);
  forward_signals_end(hb);
  stop_watch(hb);
  if (hb->timers_init) {
    close_if_open((uv_handle_t *)&hb->spawn_timer);
    close_if_open((uv_handle_t *)&hb->drain_timer);
    close_if_open((uv_handle_t *)&hb->tick_timer);
    cm__proc_close(&hb->proc);
  }
  uv_run(hb->loop, UV_RUN_NOWAIT);
  uv_run(hb->loop, UV_RUN_NOWAIT);
  cm__record_free(hb->rec, hb->live && hb->proc.started && !hb->attached_any);
  cm__gate_free(hb->gate);
  free(hb->published);
  if (hb->sock[0]) unlink(hb->sock);
  if (hb->dir[0]) rmdir(hb->dir);
  cm_selection_free(hb->extra);
  free(hb->tried);
  cm__host_set_live_ops(hb->host, NULL);
  free(hb);
  g_hub = NULL;
}
