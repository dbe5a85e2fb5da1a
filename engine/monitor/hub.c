/*
 * hub.c: the live-agent hub of cuptimon-lua: `cuptimon-lua script.lua -- cmd args...` and
 * `cuptimon-lua --record FILE -- cmd`.
 *
 * Design note. The hub creates a private 0700 directory (mkdtemp) holding a unix socket, and a
 * per-run token of 128 random bits. It starts the command with uv_spawn (stdio inherited) and the
 * injection variables of the agent contract: CUDA_INJECTION64_PATH and NVTX_INJECTION64_PATH name
 * libcuptimon-agent.so, CUPTIMON_SOCKET and CUPTIMON_TOKEN say where and how to connect. Every
 * CUDA process of the job (children included: they inherit the environment) connects; each
 * connection is a wire source (hub_source.c) attached to the host once its HELLO carries the
 * right token. The handshake follows docs/wire.md: on HELLO the hub answers CONFIGURE (when the
 * script set cadences), SELECT (the union of every observer's selection, plus --select) and
 * HELLO_ACK. Later selection changes are sent to every live agent as new SELECT frames.
 *
 * Bytes come from uv_read callbacks into a per-connection wire reader, whose frames are handled
 * in place: a BATCH is delivered straight from the reader's buffer. A corrupt stream closes that
 * agent's connection with a message naming the byte offset; the monitor and the other agents
 * go on.
 *
 * Flushes: the host asks each source to flush; the hub sends FLUSH{id, sync} and calls the host's
 * done when FLUSH_DONE{id} comes back, when the agent goes away, or when the deadline (the
 * flush's timeout, 5 s by default, plus 2 s of slack) passes. The host's rendezvous fires the
 * script's done once every source has answered.
 *
 * The end: when the command exits, the hub waits (at most CUPTIMON_DRAIN_MS, 5 s by default) for
 * the connected agents to send BYE or close, then stops the loop; cuptimon-lua then runs the
 * final flush and the script's exit hooks and exits with the command's status (128 + signal when
 * a signal killed it). SIGINT and SIGTERM are forwarded to the command, followed by SIGKILL after
 * a grace period (CUPTIMON_KILL_GRACE_MS, 3 s by default); a second signal sends SIGKILL at once.
 *
 * --record writes every agent's frames (HELLO with its token blanked) to a capture per process.
 *
 * Threads: everything runs on the loop thread; no other thread exists in the monitor besides
 * libuv's own. Ownership: the hub is a singleton owned by lua_main.c through cm__main_attach and
 * cm__hub_free; a connection is freed in its pipe's close callback, after the host has detached
 * its source.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "hub.h"

extern char **environ;

typedef struct pending_flush {
  uint64_t id;
  uint64_t deadline; /* uv_now() milliseconds */
  cm_source_done_fn done;
  void *ud;
} pending_flush;

enum { CONN_HANDSHAKE = 0, CONN_ACTIVE, CONN_CLOSING };

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
  FILE *cap;           /* --record */
  char *cap_path;
  uint64_t cap_frames;
} conn;

typedef struct record_summary {
  char *path;
  uint64_t frames, batches, records, dropped;
  struct record_summary *next;
} record_summary;

typedef struct hub {
  cm_host *host;
  uv_loop_t *loop;
  int live, replay;
  char dir[PATH_MAX];
  char sock[PATH_MAX];
  char token[33];
  char agent[PATH_MAX];
  uv_pipe_t server;
  int server_open;
  uv_process_t proc;
  int proc_started, proc_done, proc_closed;
  int cmd_status;
  char **cmd;
  uv_timer_t spawn_timer, drain_timer, kill_timer, tick_timer;
  int timers_init;
  int signals;
  conn *conns;
  int nconns;
  uint64_t next_flush;
  uint32_t flush_ms, deliver_ms;
  cm_selection *extra;
  const char *record;
  int recorded;        /* processes recorded so far (the first gets the plain path) */
  record_summary *summaries, **summaries_tail;
  int finished, status;
} hub;

static hub *g_hub;

static uint64_t env_ms(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  unsigned long long x = strtoull(v, &end, 10);
  return *end ? dflt : (uint64_t)x;
}

/* ---- the end ------------------------------------------------------------------------------------ */

static void conn_end(conn *c, int end);

static void finish(hub *hb) {
  if (hb->finished) return;
  hb->finished = 1;
  /* Agents still connected after the drain period are cut off (their processes run on). */
  for (conn *c = hb->conns; c; c = c->next)
    if (c->state != CONN_CLOSING) {
      fprintf(stderr, "cuptimon-lua: agent pid %u is still connected after the command ended; "
              "closing its connection\n", c->w.pid);
      conn_end(c, CM__END_TIMEOUT);
    }
  if (hb->server_open) {
    uv_close((uv_handle_t *)&hb->server, NULL);
    hb->server_open = 0;
  }
  uv_timer_stop(&hb->drain_timer);
  uv_timer_stop(&hb->kill_timer);
  uv_timer_stop(&hb->tick_timer);
  uv_stop(hb->loop);
}

static int live_conns(hub *hb) {
  int n = 0;
  for (conn *c = hb->conns; c; c = c->next)
    if (c->state != CONN_CLOSING) n++;
  return n;
}

static void drain_cb(uv_timer_t *t) { finish(t->data); }

/* The command is done: finish once its agents are, or after the drain period. */
static void maybe_finish(hub *hb) {
  if (hb->finished || !hb->proc_done) return;
  if (live_conns(hb) == 0) {
    finish(hb);
    return;
  }
  if (!uv_is_active((uv_handle_t *)&hb->drain_timer))
    uv_timer_start(&hb->drain_timer, drain_cb, env_ms("CUPTIMON_DRAIN_MS", 5000), 0);
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
  if (c->state != CONN_ACTIVE || c->handshaking) {
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
  if (c->handshaking || c->state != CONN_ACTIVE) return; /* the handshake sends its own */
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_select(&b, spec);
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
  if (c->handshaking || c->state != CONN_ACTIVE) return;
  send_configure(c, flush_ms, deliver_ms);
}

static void conn_detached(cm__wsrc *w) { conn_close(w->owner); }

static const cm__wsrc_ops conn_ops = {
    .flush = conn_flush, .select = conn_select, .configure = conn_configure,
    .detached = conn_detached,
};

/* ---- connections ------------------------------------------------------------------------------------ */

static void close_capture(hub *hb, conn *c) {
  if (!c->cap) return;
  int bad = fclose(c->cap) != 0;
  c->cap = NULL;
  if (bad) fprintf(stderr, "cuptimon-lua: error writing capture %s: %s\n", c->cap_path, strerror(errno));
  record_summary *s = calloc(1, sizeof *s);
  if (!s) return;
  s->path = c->cap_path;
  c->cap_path = NULL;
  s->frames = c->cap_frames;
  s->batches = c->w.batches;
  s->records = c->w.records;
  s->dropped = cm__wsrc_stat(&c->w, "records_dropped") + cm__wsrc_stat(&c->w, "batches_dropped");
  *hb->summaries_tail = s;
  hb->summaries_tail = &s->next;
}

static void conn_closed(uv_handle_t *hd) {
  conn *c = hd->data;
  hub *hb = g_hub;
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
  free(c->cap_path);
  free(c);
  maybe_finish(hb);
}

/* Closes the pipe; pending flushes complete with CM_EIO. Idempotent. */
static void conn_close(conn *c) {
  c->state = CONN_CLOSING;
  while (c->nflush) flush_complete(c, 0, CM_EIO);
  if (!uv_is_closing((uv_handle_t *)&c->pipe)) uv_close((uv_handle_t *)&c->pipe, conn_closed);
}

/* Ends the process's connection: process_exit runs when it was attached. */
static void conn_end(conn *c, int end) {
  if (c->w.end == CM__END_NONE) c->w.end = end;
  c->state = CONN_CLOSING; /* nothing more is sent: the unobserves below change no SELECT */
  if (c->w.attached) cm__wsrc_detach(&c->w); /* calls conn_detached */
  else conn_close(c);
}

/* Opens the --record capture of a process and writes the file header. */
static void open_capture(hub *hb, conn *c) {
  const char *path = hb->record;
  char buf[PATH_MAX];
  const char *pp = strstr(path, "%p");
  if (pp) {
    snprintf(buf, sizeof buf, "%.*s%u%s", (int)(pp - path), path, c->w.pid, pp + 2);
  } else if (hb->recorded) {
    snprintf(buf, sizeof buf, "%s.%u", path, c->w.pid);
  } else {
    snprintf(buf, sizeof buf, "%s", path);
  }
  hb->recorded++;
  c->cap = fopen(buf, "wb");
  if (!c->cap) {
    fprintf(stderr, "cuptimon-lua: cannot create capture %s: %s\n", buf, strerror(errno));
    return;
  }
  c->cap_path = strdup(buf);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_file_header(&b, 0);
  fwrite(b.data, 1, b.len, c->cap);
  cm_wire_buf_free(&b);
}

static void record_frame(conn *c, const cm_wire_frame *f) {
  if (!c->cap || f->type == CM_WIRE_FLUSH_DONE) return;
  /* The reader keeps the verified header just before the payload. */
  fwrite(f->payload - CM_WIRE_FRAME_HEADER_SIZE, 1, CM_WIRE_FRAME_HEADER_SIZE + (size_t)f->len,
         c->cap);
  c->cap_frames++;
}

static void on_hello(hub *hb, conn *c, const cm_wire_frame *f) {
  cm_wire_hello hl;
  int rc = cm_wire_decode_hello(f, &hl);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  if (rc || !hl.token || strcmp(hl.token, hb->token) != 0) {
    fprintf(stderr, "cuptimon-lua: refusing an agent (pid %u): %s\n", rc ? 0 : hl.pid,
            rc ? cm_wire_reader_errmsg(f->reader) : "wrong token");
    cm_wire_write_hello_ack(&b, CM_EINVAL,
                            rc ? "malformed HELLO"
                               : "wrong token: this agent's CUPTIMON_TOKEN does not belong to "
                                 "this cuptimon-lua run");
    cm_wire_hello_release(&hl);
    uv_read_stop((uv_stream_t *)&c->pipe);
    conn_send(c, &b, 1);
    c->state = CONN_CLOSING;
    cm_wire_buf_free(&b);
    return;
  }
  if (hb->record) {
    open_capture(hb, c);
    if (c->cap) {
      /* The token was a secret of this run; a capture carries an empty one, like an agent's. */
      cm_wire_hello copy = hl;
      copy.token = "";
      cm_wire_write_hello(&b, &copy);
      fwrite(b.data, 1, b.len, c->cap);
      c->cap_frames++;
      cm_wire_buf_clear(&b);
    }
  }
  cm_wire_hello_release(&hl);
  char err[256] = "";
  cm__wsrc_frame(&c->w, f, err, sizeof err);
  c->w.extra = hb->extra;
  c->handshaking = 1;
  c->state = CONN_ACTIVE;
  rc = cm__wsrc_attach(&c->w, hb->host);
  c->handshaking = 0;
  if (rc) {
    fprintf(stderr, "cuptimon-lua: cannot attach agent pid %u: %s\n", c->w.pid, cm_strerror(rc));
    cm_wire_write_hello_ack(&b, rc, "the monitor cannot take another process");
    conn_send(c, &b, 1);
    c->state = CONN_CLOSING;
    cm_wire_buf_free(&b);
    return;
  }
  if (c->state != CONN_ACTIVE) { /* a process_start hook ended the run */
    cm_wire_buf_free(&b);
    return;
  }
  send_configure(c, hb->flush_ms, hb->deliver_ms);
  free(c->w.union_spec);
  c->w.union_spec = cm__wsrc_union(&c->w);
  cm_wire_write_select(&b, c->w.union_spec ? c->w.union_spec : "");
  cm_wire_write_hello_ack(&b, 0, "");
  conn_send(c, &b, 0);
  cm_wire_buf_free(&b);
}

static void on_frame(hub *hb, conn *c, const cm_wire_frame *f) {
  if (c->state == CONN_HANDSHAKE) {
    if (f->type != CM_WIRE_HELLO) {
      fprintf(stderr, "cuptimon-lua: an agent sent %s before HELLO; closing its connection\n",
              cm_wire_type_name(f->type));
      conn_end(c, CM__END_ERROR);
      return;
    }
    on_hello(hb, c, f);
    return;
  }
  record_frame(c, f);
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
    fprintf(stderr, "cuptimon-lua: agent pid %u: %s; closing its connection\n", c->w.pid, err);
    conn_end(c, CM__END_ERROR);
    return;
  }
  if (f->type == CM_WIRE_BYE) conn_end(c, CM__END_BYE);
}

static void alloc_cb(uv_handle_t *hd, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn *c = hd->data;
  *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  conn *c = st->data;
  hub *hb = g_hub;
  (void)buf;
  if (nread == 0 || c->state == CONN_CLOSING) return;
  if (nread < 0) {
    if (nread != UV_EOF)
      fprintf(stderr, "cuptimon-lua: agent pid %u: read error: %s\n", c->w.pid, uv_strerror((int)nread));
    conn_end(c, CM__END_EOF);
    return;
  }
  int rc = cm_wire_reader_feed(c->r, c->rbuf, (size_t)nread);
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
  if (rc < 0 && c->state != CONN_CLOSING) {
    fprintf(stderr, "cuptimon-lua: agent pid %u: corrupt stream (%s); closing its connection\n",
            c->w.pid, cm_wire_reader_errmsg(c->r));
    conn_end(c, CM__END_ERROR);
  }
}

static void free_data(uv_handle_t *hd) {
  conn *c = hd->data;
  cm_wire_reader_free(c->r);
  free(c);
}

static void on_connection(uv_stream_t *server, int status) {
  hub *hb = g_hub;
  if (status < 0) return;
  conn *c = calloc(1, sizeof *c);
  if (!c) return;
  cm__wsrc_init(&c->w, &conn_ops, c, "agent");
  uv_pipe_init(hb->loop, &c->pipe, 0);
  c->pipe.data = c;
  if (uv_accept(server, (uv_stream_t *)&c->pipe) || cm_wire_reader_new(&c->r, 0)) {
    uv_close((uv_handle_t *)&c->pipe, free_data);
    return;
  }
  c->next = hb->conns;
  hb->conns = c;
  hb->nconns++;
  uv_read_start((uv_stream_t *)&c->pipe, alloc_cb, read_cb);
}

/* Completes flushes whose deadline passed (an agent that stopped answering). */
static void tick_cb(uv_timer_t *t) {
  hub *hb = t->data;
  uint64_t now = uv_now(hb->loop);
  for (conn *c = hb->conns; c; c = c->next)
    for (int i = 0; i < c->nflush; i++)
      if (c->flushes[i].deadline <= now) {
        fprintf(stderr, "cuptimon-lua: agent pid %u did not answer a flush in time\n", c->w.pid);
        flush_complete(c, i, CM_ETIMEDOUT);
        i = -1; /* the done may have changed the list */
      }
}

/* ---- the command ------------------------------------------------------------------------------------ */

static void proc_closed(uv_handle_t *hd) { ((hub *)hd->data)->proc_closed = 1; }

static void proc_exit(uv_process_t *p, int64_t exit_status, int term_signal) {
  hub *hb = p->data;
  hb->proc_done = 1;
  hb->cmd_status = term_signal ? 128 + term_signal : (int)exit_status;
  uv_timer_stop(&hb->kill_timer);
  uv_close((uv_handle_t *)p, proc_closed);
  maybe_finish(hb);
}

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
  snprintf(b, sizeof b, "%s/../lib/libcuptimon-agent.so", exe);
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

static int is_ours(const char *e) {
  static const char *names[] = {"CUDA_INJECTION64_PATH=", "NVTX_INJECTION64_PATH=",
                                "CUPTIMON_SOCKET=", "CUPTIMON_TOKEN=", NULL};
  for (int i = 0; names[i]; i++)
    if (strncmp(e, names[i], strlen(names[i])) == 0) return 1;
  return 0;
}

static void spawn_cb(uv_timer_t *t) {
  hub *hb = t->data;
  size_t n = 0;
  while (environ[n]) n++;
  char **env = calloc(n + 5, sizeof *env);
  char v[4][PATH_MAX + 64];
  size_t k = 0;
  for (size_t i = 0; env && i < n; i++)
    if (!is_ours(environ[i])) env[k++] = environ[i];
  snprintf(v[0], sizeof v[0], "CUDA_INJECTION64_PATH=%s", hb->agent);
  snprintf(v[1], sizeof v[1], "NVTX_INJECTION64_PATH=%s", hb->agent);
  snprintf(v[2], sizeof v[2], "CUPTIMON_SOCKET=%s", hb->sock);
  snprintf(v[3], sizeof v[3], "CUPTIMON_TOKEN=%s", hb->token);
  for (int i = 0; env && i < 4; i++) env[k++] = v[i];
  uv_stdio_container_t stdio[3];
  for (int i = 0; i < 3; i++) {
    stdio[i].flags = UV_INHERIT_FD;
    stdio[i].data.fd = i;
  }
  uv_process_options_t o = {0};
  o.file = hb->cmd[0];
  o.args = hb->cmd;
  o.env = env;
  o.stdio = stdio;
  o.stdio_count = 3;
  o.exit_cb = proc_exit;
  hb->proc.data = hb;
  int rc = env ? uv_spawn(hb->loop, &hb->proc, &o) : UV_ENOMEM;
  free(env);
  if (rc) {
    fprintf(stderr, "cuptimon-lua: cannot run %s: %s\n", hb->cmd[0], uv_strerror(rc));
    uv_close((uv_handle_t *)&hb->proc, proc_closed);
    hb->proc_done = 1;
    hb->cmd_status = rc == UV_ENOENT ? 127 : 126;
    maybe_finish(hb);
    return;
  }
  hb->proc_started = 1;
}

static void kill_cb(uv_timer_t *t) {
  hub *hb = t->data;
  if (hb->proc_started && !hb->proc_done) {
    fprintf(stderr, "cuptimon-lua: the command did not exit; sending SIGKILL\n");
    uv_process_kill(&hb->proc, SIGKILL);
  }
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

static int make_socket(hub *hb) {
  const char *tmp = getenv("TMPDIR");
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
    snprintf(hb->sock, sizeof hb->sock, "%s/agent.sock", hb->dir);
    uv_pipe_init(hb->loop, &hb->server, 0);
    hb->server_open = 1;
    int rc = uv_pipe_bind(&hb->server, hb->sock);
    if (!rc) rc = uv_listen((uv_stream_t *)&hb->server, 128, on_connection);
    if (rc) {
      fprintf(stderr, "cuptimon-lua: cannot listen on %s: %s\n", hb->sock, uv_strerror(rc));
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

/* The kinds --record traces when no script selects anything and --select is not given. */
static const char default_record_select[] =
    "kernel;memcpy;memcpy2;memset;runtime;synchronization;marker;marker_data";

int cm__main_attach(cm_host *h, uv_loop_t *loop, const cm__main_request *req) {
  hub *hb = calloc(1, sizeof *hb);
  if (!hb) return CM_ENOMEM;
  g_hub = hb;
  hb->host = h;
  hb->loop = loop;
  hb->summaries_tail = &hb->summaries;
  uv_timer_init(loop, &hb->spawn_timer);
  uv_timer_init(loop, &hb->drain_timer);
  uv_timer_init(loop, &hb->kill_timer);
  uv_timer_init(loop, &hb->tick_timer);
  hb->spawn_timer.data = hb->drain_timer.data = hb->kill_timer.data = hb->tick_timer.data = hb;
  hb->timers_init = 1;
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
  hb->record = req->record;
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
  /* The command starts on the loop's first turn, after the script has registered its observers,
   * so the first SELECT already holds them; a script that fails to load never starts it. */
  if (hb && hb->live && !hb->proc_started && !hb->proc_done)
    uv_timer_start(&hb->spawn_timer, spawn_cb, 0, 0);
}

int cm__hub_signal(int signum) {
  hub *hb = g_hub;
  if (!hb) return 0;
  hb->signals++;
  if (hb->replay) {
    hb->status = 128 + signum;
    cm__replay_free();
    hb->finished = 1;
    uv_stop(hb->loop);
    return 1;
  }
  if (!hb->live) return 0;
  if (!hb->proc_started || hb->proc_done) {
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
    uv_process_kill(&hb->proc, signum);
    uv_timer_start(&hb->kill_timer, kill_cb, env_ms("CUPTIMON_KILL_GRACE_MS", 3000), 0);
  } else {
    uv_process_kill(&hb->proc, SIGKILL);
  }
  return 1;
}

int cm__hub_finished(int *status) {
  hub *hb = g_hub;
  if (!hb || !hb->finished) return 0;
  if (status) *status = hb->live ? hb->cmd_status : hb->status;
  return 1;
}

static void close_if_open(uv_handle_t *hd) {
  if (!uv_is_closing(hd)) uv_close(hd, NULL);
}

void cm__hub_free(void) {
  hub *hb = g_hub;
  if (!hb) return;
  cm__replay_free();
  /* Connections still open (the script ended first): close them and let the loop run their
   * close callbacks, which write the capture summaries. */
  for (conn *c = hb->conns; c; c = c->next)
    if (!uv_is_closing((uv_handle_t *)&c->pipe)) conn_close(c);
  if (hb->server_open) {
    uv_close((uv_handle_t *)&hb->server, NULL);
    hb->server_open = 0;
  }
  if (hb->timers_init) {
    close_if_open((uv_handle_t *)&hb->spawn_timer);
    close_if_open((uv_handle_t *)&hb->drain_timer);
    close_if_open((uv_handle_t *)&hb->kill_timer);
    close_if_open((uv_handle_t *)&hb->tick_timer);
  }
  if (hb->proc_started && !hb->proc_done)
    fprintf(stderr, "cuptimon-lua: the command (pid %d) is still running; it goes on untraced\n",
            hb->proc.pid);
  if (hb->proc_started && !hb->proc_closed && !uv_is_closing((uv_handle_t *)&hb->proc))
    uv_close((uv_handle_t *)&hb->proc, NULL);
  uv_run(hb->loop, UV_RUN_NOWAIT);
  uv_run(hb->loop, UV_RUN_NOWAIT);
  for (record_summary *s = hb->summaries, *next; s; s = next) {
    next = s->next;
    fprintf(stderr, "cuptimon-lua: recorded %s: %llu frames, %llu batches, %llu records, %llu dropped\n",
            s->path, (unsigned long long)s->frames, (unsigned long long)s->batches,
            (unsigned long long)s->records, (unsigned long long)s->dropped);
    free(s->path);
    free(s);
  }
  if (hb->sock[0]) unlink(hb->sock);
  if (hb->dir[0]) rmdir(hb->dir);
  cm_selection_free(hb->extra);
  free(hb);
  g_hub = NULL;
}
