/*
 * conn.c: one agent's connection to the hub, as the loop sees it: the frames it sends, the frames
 * the hub sends it, its flushes, its trigger window and its end (see hub_internal.h).
 *
 * Design note. A connection comes from the gate (an agent that connected and completed its
 * handshake) or from --attach (the monitor connected to a dormant agent); either way it becomes
 * a wire source (wsrc.c) named by the kernel's pid, attached to the host on its HELLO
 * (process_start hooks run), and gets a corrective SELECT or CONFIGURE when the gate's answer was
 * stale. Later selection changes are sent to every live agent as new SELECT frames. For
 * --attach, on_hello answers CONFIGURE, SELECT and HELLO_ACK itself, the gate's part.
 *
 * Bytes come from uv_read callbacks into a per-connection wire reader, whose frames are handled
 * in place: a BATCH is delivered straight from the reader's buffer. A corrupt stream, or a frame
 * over the wire format's size limit, closes that agent's connection with a message naming the
 * byte offset; the monitor and the other agents go on. The frame being received counts against
 * the run's budget for partly received frames (CUPTIMON_PARTIAL_BUDGET_MB).
 *
 * Flushes: the host asks each source to flush; the hub sends FLUSH{id, sync} and calls the host's
 * done when FLUSH_DONE{id} comes back, when the agent goes away, or when the deadline (the
 * flush's timeout, 5 s by default, plus 2 s of slack) passes (hub.c's tick). The host's
 * rendezvous fires the script's done once every source has answered.
 *
 * --record writes every agent's frames to a capture per process (record.c), opened on its HELLO
 * and closed with its connection. A trigger window (window.c) is fenced by two sync FLUSHes sent
 * here, and sees every frame after the opening one.
 *
 * Threads: loop thread only. Ownership: the hub's list holds its connections; a connection is
 * freed in its pipe's close callback, after the host has detached its source, and then tells the
 * hub (conn_gone), which may end the run. This file never calls into hub.c otherwise.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host_source.h"
#include "hub_internal.h"

/* ---- messages about agents ------------------------------------------------------------------- */

/* Lines that agents can cause, one or more per connection (a corrupt stream, a frame over a
 * limit, a flush not answered...): a burst of LOG_BURST, then one a second; the rest are counted
 * and summarized ("suppressed N messages"), as journald rate-limits a service, so a peer that
 * opens connections by the thousand cannot flood the terminal. Loop thread. */
enum { LOG_BURST = 20 };

void cm__conn_log_flush(cm__hub *hb) {
  cm__wsrc_log_summary();
  if (!hb->log_suppressed) return;
  fprintf(stderr, "cuptimon-lua: suppressed %llu messages about agents\n",
          (unsigned long long)hb->log_suppressed);
  hb->log_suppressed = 0;
}

void cm__conn_log(cm__hub *hb, const char *fmt, ...) {
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
  cm__conn_log_flush(hb);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
}

/* ---- sending --------------------------------------------------------------------------------- */

typedef struct send_req {
  uv_write_t req;
  int close_after;
  cm__conn *c;
  uint8_t data[];
} send_req;

static void sent_cb(uv_write_t *req, int status) {
  send_req *s = (send_req *)req;
  if (s->close_after) cm__conn_close(s->c);
  free(s);
  (void)status; /* a failed write shows up as a read error or EOF */
}

/* Sends the frames in `b` (and clears it). */
void cm__conn_send(cm__conn *c, cm_wire_buf *b, int close_after) {
  if (c->state == CM__CONN_CLOSING || uv_is_closing((uv_handle_t *)&c->pipe)) {
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
    if (close_after) cm__conn_close(c);
  }
  cm_wire_buf_clear(b);
}

/* ---- the wire source's owner callbacks ------------------------------------------------------- */

int cm__conn_flush(cm__wsrc *w, int mode, uint32_t timeout_ms, cm_source_done_fn done, void *ud) {
  cm__conn *c = w->owner;
  cm__hub *hb = c->hb;
  /* Before HELLO_ACK (a process_start hook flushing) the agent has traced nothing yet, and a
   * FLUSH would break the handshake's order; after the end there is nothing left to flush. */
  if (c->state != CM__CONN_ACTIVE || c->handshaking || c->detaching) {
    if (done) done(ud, 0);
    return 0;
  }

  if (c->nflush == c->cap_flush) {
    int cap = c->cap_flush ? c->cap_flush * 2 : 4;
    cm__pending_flush *p = realloc(c->flushes, (size_t)cap * sizeof *p);
    if (!p) {
      if (done) done(ud, CM_ENOMEM);
      return CM_ENOMEM;
    }
    c->flushes = p;
    c->cap_flush = cap;
  }
  uint64_t id = ++hb->next_flush;
  c->flushes[c->nflush++] = (cm__pending_flush){
      .id = id, .deadline = uv_now(hb->loop) + (timeout_ms ? timeout_ms : 5000) + 2000,
      .done = done, .ud = ud};
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_flush(&b, id, mode == CM_FLUSH_SYNC ? CM_WIRE_FLUSH_SYNC : 0, timeout_ms);
  cm__conn_send(c, &b, 0);
  cm_wire_buf_free(&b);
  return 0;
}

/* Completes pending flush `i` with `status` (the host's done runs Lua: call it last). */
void cm__conn_flush_complete(cm__conn *c, int i, int status) {
  cm__pending_flush p = c->flushes[i];
  memmove(&c->flushes[i], &c->flushes[i + 1], (size_t)(c->nflush - i - 1) * sizeof p);
  c->nflush--;
  if (p.done) p.done(p.ud, status);
}

static void conn_select(cm__wsrc *w, const char *spec) {
  cm__conn *c = w->owner;
  /* The handshake sends its own; a detaching agent keeps its empty selection. */
  if (c->handshaking || c->state != CM__CONN_ACTIVE || c->detaching) return;
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_select(&b, spec);
  cm__conn_send(c, &b, 0);
  cm_wire_buf_free(&b);
}

/* Sends the PM request; during the handshake nothing is sent, and the attach sends it after. */
static void conn_pm(cm__wsrc *w, const char *spec) {
  cm__conn *c = w->owner;
  if (c->handshaking || c->state != CM__CONN_ACTIVE) return;
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_pm(&b, spec);
  cm__conn_send(c, &b, 0);
  cm_wire_buf_free(&b);
}

static void send_configure(cm__conn *c, uint32_t flush_ms, uint32_t deliver_ms) {
  cm_wire_kv kv[2];
  uint32_t n = 0;
  if (flush_ms) kv[n++] = (cm_wire_kv){.name = "flush_ms", .value = flush_ms};
  if (deliver_ms) kv[n++] = (cm_wire_kv){.name = "deliver_ms", .value = deliver_ms};
  if (!n) return;
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_configure(&b, kv, n);
  cm__conn_send(c, &b, 0);
  cm_wire_buf_free(&b);
}

static void conn_configure(cm__wsrc *w, uint32_t flush_ms, uint32_t deliver_ms) {
  cm__conn *c = w->owner;
  if (flush_ms) c->hb->flush_ms = flush_ms;
  if (deliver_ms) c->hb->deliver_ms = deliver_ms;
  if (c->handshaking || c->state != CM__CONN_ACTIVE || c->detaching) return;
  if (flush_ms) c->sent_flush_ms = flush_ms;
  if (deliver_ms) c->sent_deliver_ms = deliver_ms;
  send_configure(c, flush_ms, deliver_ms);
}

static void conn_detached(cm__wsrc *w) { cm__conn_close(w->owner); }

static const cm__wsrc_ops conn_ops = {
    .flush = cm__conn_flush, .select = conn_select, .configure = conn_configure, .pm = conn_pm,
    .detached = conn_detached,
};

/* ---- the end of a connection ----------------------------------------------------------------- */

static void window_finish(cm__conn *c, int status);

static void close_capture(cm__hub *hb, cm__conn *c) {
  if (!c->cap) return;
  cm_loss l;
  cm__wsrc_loss(&c->w, &l);
  /* Dropped records, wherever they were lost; incomplete when the final counts never came. */
  cm__record_close(hb->rec, c->cap, c->w.batches, c->w.records, l.dropped, l.incomplete != 0);
  c->cap = NULL;
}

static void conn_closed(uv_handle_t *hd) {
  cm__conn *c = hd->data;
  cm__hub *hb = c->hb;
  hb->partial_total -= c->partial;
  close_capture(hb, c);
  for (cm__conn **p = &hb->conns; *p; p = &(*p)->next)
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
  hb->conn_gone(hb); /* hub.c: the end may come now */
}

/* Closes the pipe; pending flushes complete with CM_EIO, and an open window ends with what it
 * received (complete when the process said BYE). Idempotent. */
void cm__conn_close(cm__conn *c) {
  c->state = CM__CONN_CLOSING;
  /* Nothing more is read: its partly received frame leaves the budget now. */
  c->hb->partial_total -= c->partial;
  c->partial = 0;
  while (c->nflush) cm__conn_flush_complete(c, 0, CM_EIO);
  if (c->win) window_finish(c, c->w.end == CM__END_BYE ? 0 : CM_EIO);
  if (!uv_is_closing((uv_handle_t *)&c->pipe)) uv_close((uv_handle_t *)&c->pipe, conn_closed);
}

/* Detaches the source now (process_exit runs), or closes the connection when never attached. */
void cm__conn_detach_now(cm__conn *c) {
  c->await_status = 0;
  if (c->w.attached) cm__wsrc_detach(&c->w); /* calls conn_detached */
  else cm__conn_close(c);
}

/* The command's own exit status reached a connection of its process. */
void cm__conn_set_status(cm__conn *c, int status) {
  c->w.exit_code = status;
  c->w.exit_known = 1;
}

/* An outward connection that will never be attached: named, and a named pid fails the run. */
void cm__conn_attach_failed(cm__hub *hb, cm__conn *c, const char *why) {
  fprintf(stderr, "cuptimon-lua: cannot attach to pid %d: %s\n", (int)c->kpid, why);
  if (!hb->attach_all) hb->attach_failed = 1;
}

/* Ends the process's connection: process_exit runs when it was attached. */
void cm__conn_end(cm__conn *c, int end) {
  cm__hub *hb = c->hb;
  if (c->outward && !c->w.have_hello && c->state != CM__CONN_CLOSING)
    cm__conn_attach_failed(hb, c, "it closed the connection without a HELLO (the agent refused "
                           "this monitor, or it is exiting; its stderr says why)");
  if (c->w.end == CM__END_NONE) c->w.end = end;
  c->state = CM__CONN_CLOSING; /* nothing more is sent: the unobserves below change no SELECT */
  if (c->w.attached && hb->proc.started && c->kpid == cm__proc_pid(&hb->proc)) {
    if (hb->proc_done) {
      cm__conn_set_status(c, hb->cmd_status);
    } else if (c->w.end == CM__END_BYE && c->w.exit_code >= 0) {
      /* The agent's exit handler gave the status of exit(): no wait for the reap. */
      hb->cmd_exiting = 1;
      hb->bye_status = c->w.exit_code;
      cm__conn_set_status(c, c->w.exit_code);
    } else if (c->w.end == CM__END_BYE || c->w.end == CM__END_EOF) {
      /* The process is exiting: its status comes within moments (bounded by hub.c's tick_cb). */
      c->await_status = 1;
      c->await_deadline = uv_now(hb->loop) + 2000;
      uv_read_stop((uv_stream_t *)&c->pipe);
      return;
    }
  }
  cm__conn_detach_now(c);
}

/* ---- the handshake --------------------------------------------------------------------------- */

/* Observers of the script, collected into a wire source that is never attached, for the union. */
static int probe_observer(void *ud, uint32_t id, const cm_selection *sel, const char *spec) {
  cm__wsrc *w = ud;
  return w->base.vt->observe(&w->base, id, sel, spec);
}

static const cm__wsrc_ops probe_ops = {0};

/* The union selection a process attached now would get, or NULL (out of memory). */
char *cm__conn_union(cm__hub *hb) {
  cm__wsrc probe;
  memset(&probe, 0, sizeof probe);
  cm__wsrc_init(&probe, &probe_ops, NULL, "agent");
  probe.extra = hb->extra;
  if (hb->host) cm_host_each_observer(hb->host, probe_observer, &probe);
  char *u = cm__wsrc_union(&probe);
  cm__wsrc_release(&probe);
  return u;
}

/* The HELLO of an admitted connection: the gate checked its token and answered it, so this
 * records it, attaches the process (process_start hooks run) and corrects the gate's answer when
 * the selection or the cadences changed since the gate's copy was published. */
static void on_hello(cm__hub *hb, cm__conn *c, const cm_wire_frame *f) {
  cm_wire_hello hl;
  char err[CM_WIRE_ERRMSG_SIZE + 64] = "";
  int rc = cm__wsrc_frame(&c->w, f, err, sizeof err);
  if (rc) { /* the gate decoded it already: only memory can fail here */
    cm__conn_log(hb, "cuptimon-lua: agent pid %d: %s; closing its connection\n", (int)c->kpid, err);
    cm__conn_end(c, CM__END_ERROR);
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
    if (c->outward) cm__conn_attach_failed(hb, c, "the script ended before the handshake completed; nothing was traced");
    else cm__conn_log(hb, "cuptimon-lua: agent pid %d connected after the script ended; not traced\n", (int)c->kpid);
    cm__conn_end(c, CM__END_ERROR);
    return;
  }
  hb->attached_any = 1;
  if (c->outward) {
    /* The gate's part of the handshake, done here: the agent waits on its listener thread. */
    char *u = cm__conn_union(hb);
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
      cm__conn_end(c, CM__END_ERROR);
      return;
    }
    cm__conn_send(c, &b, 0);
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
  c->state = CM__CONN_ACTIVE;
  /* After the script's end (cm__hub_forget_host) there is no host to attach to. */
  rc = hb->host ? cm__wsrc_attach(&c->w, hb->host) : CM_ESTATE;
  c->handshaking = 0;
  if (rc) {
    fprintf(stderr, "cuptimon-lua: cannot attach agent pid %u: %s\n", c->w.pid, cm_strerror(rc));
    cm__conn_end(c, CM__END_ERROR);
    return;
  }
  if (c->state != CM__CONN_ACTIVE) return; /* a process_start hook ended the run */
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

/* ---- trigger windows ------------------------------------------------------------------------- */

/* Ends the connection's window, if one is open (window.c frees it). */
static void window_finish(cm__conn *c, int status) {
  cm__window *win = c->win;
  if (!win) return;
  c->win = NULL;
  cm__window_finish(win, &c->w, status);
}

/* The opening fence completed: the frames from here on are the window's. */
static void window_opened(void *ud, int status) {
  cm__conn *c = ud;
  if (c->win) cm__window_opened(c->win, &c->w, status);
}

static void window_closed(void *ud, int status) { window_finish(ud, status); }

int cm__conn_window_begin(cm__conn *c, const char *path, int force, cm__window_done_fn done,
                          void *ud) {
  if (c->win) return CM_EBUSY;
  cm__window *win;
  int rc = cm__window_new(&win, path, force, c->hello ? &c->hello_frame : NULL,
                          (uint32_t)c->kpid, &c->w, done, ud);
  if (rc) return rc;
  c->win = win;
  return cm__conn_flush(&c->w, CM_FLUSH_SYNC, 0, window_opened, c);
}

int cm__conn_window_end(cm__conn *c) {
  if (!c->win) return CM_ENOENT;
  if (cm__window_end(c->win)) return 0;
  return cm__conn_flush(&c->w, CM_FLUSH_SYNC, 0, window_closed, c);
}

/* ---- frames and bytes ------------------------------------------------------------------------ */

static void on_frame(cm__hub *hb, cm__conn *c, const cm_wire_frame *f) {
  if (!c->w.have_hello && c->outward && f->type == CM_WIRE_BYE) {
    /* A dormant agent's refusal (another monitor is attached, or it is exiting). */
    cm_wire_bye bye;
    memset(&bye, 0, sizeof bye);
    int drc = cm_wire_decode_bye(f, &bye);
    char clean[1024];
    fprintf(stderr, "cuptimon-lua: cannot attach to pid %d: %s\n", (int)c->kpid,
            drc == 0 && bye.message ? cm__text_tmp(bye.message, clean, sizeof clean) : "the agent refused");
    if (!hb->attach_all) hb->attach_failed = 1;
    c->state = CM__CONN_CLOSING;
    cm__conn_close(c);
    return;
  }
  if (!c->w.have_hello) { /* the gate admitted it on this very frame */
    if (c->outward && f->type != CM_WIRE_HELLO) {
      cm__conn_log(hb, "cuptimon-lua: pid %d sent %s before HELLO; closing the connection\n",
                 (int)c->kpid, cm_wire_type_name(f->type) ? cm_wire_type_name(f->type) : "a frame");
      cm__conn_end(c, CM__END_ERROR);
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
          cm__conn_flush_complete(c, i, status);
          break;
        }
    return;
  }
  char err[CM_WIRE_ERRMSG_SIZE + 64] = "";
  int rc = cm__wsrc_frame(&c->w, f, err, sizeof err);
  if (rc) {
    cm__conn_log(hb, "cuptimon-lua: agent pid %u: %s; closing its connection\n", c->w.pid, err);
    cm__conn_end(c, CM__END_ERROR);
    return;
  }
  if (c->win) cm__window_frame(c->win, f);
  if (f->type == CM_WIRE_BYE) cm__conn_end(c, CM__END_BYE);
}

static void alloc_cb(uv_handle_t *hd, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  cm__conn *c = hd->data;
  *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

/* Feeds bytes to the connection's reader and handles the frames they complete. */
static void conn_feed(cm__hub *hb, cm__conn *c, const void *data, size_t len) {
  int rc = cm_wire_reader_feed(c->r, data, len);
  cm_wire_frame f;
  while (rc == 0 && c->state != CM__CONN_CLOSING) {
    rc = cm_wire_reader_next(c->r, &f);
    if (rc == 1) {
      on_frame(hb, c, &f);
      rc = 0;
    } else {
      break;
    }
  }
  if (rc == 0 && c->state != CM__CONN_CLOSING) {
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
      cm__conn_end(c, CM__END_ERROR);
      return;
    }
  }
  if (rc == CM_ERANGE && c->state != CM__CONN_CLOSING) {
    cm__conn_log(hb, "cuptimon-lua: agent pid %u sent a frame over the wire format's size limit "
               "(%s); closing its connection\n", c->w.pid, cm_wire_reader_errmsg(c->r));
    cm__conn_end(c, CM__END_ERROR);
  } else if (rc < 0 && c->state != CM__CONN_CLOSING) {
    cm__conn_log(hb, "cuptimon-lua: agent pid %u: corrupt stream (%s); closing its connection\n",
               c->w.pid, cm_wire_reader_errmsg(c->r));
    cm__conn_end(c, CM__END_ERROR);
  }
}

static void read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  cm__conn *c = st->data;
  cm__hub *hb = c->hb;
  (void)buf;
  if (nread == 0 || c->state == CM__CONN_CLOSING) return;
  if (nread < 0) {
    if (nread != UV_EOF)
      cm__conn_log(hb, "cuptimon-lua: agent pid %u: read error: %s\n", c->w.pid, uv_strerror((int)nread));
    cm__conn_end(c, CM__END_EOF);
    return;
  }
  conn_feed(hb, c, c->rbuf, (size_t)nread);
}

static void free_data(uv_handle_t *hd) {
  cm__conn *c = hd->data;
  cm_wire_reader_free(c->r);
  free(c->sent_select);
  free(c);
}

/* Takes a connection the gate admitted: from here on the loop thread owns it. */
cm__conn *cm__conn_admit(cm__hub *hb, cm__gate_conn *gc) {
  cm__conn *c = calloc(1, sizeof *c);
  if (!c) {
    close(gc->fd);
    return NULL;
  }
  c->hb = hb;
  cm__wsrc_init(&c->w, &conn_ops, c, "agent");
  c->kpid = gc->pid;
  c->sent_select = gc->select;
  gc->select = NULL;
  c->sent_flush_ms = gc->flush_ms;
  c->sent_deliver_ms = gc->deliver_ms;
  c->state = CM__CONN_ACTIVE;
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

