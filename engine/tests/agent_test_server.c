/*
 * agent_test_server.c: the monitor side of the agent tests, included by test_agent_*.c (each test
 * is one translation unit, as the test glob builds them).
 *
 * Design. The tests run engine/tests/fake_cuda_app as a child process with the agent injected
 * (CUDA_INJECTION64_PATH) and the fake CUPTI (CUPTIMON_LIBCUPTI, inherited from ctest). What the
 * agent sends is checked by a `checker`, which takes frames from a capture file or from a socket
 * and folds every BATCH into per-kind, per-field order-independent checksums (a wrapping sum of
 * value times an odd constant, and an XOR of a mixed value; strings by the FNV-1a hash of their
 * bytes, resolved through the STRINGS frames seen before the batch). The expected side
 * regenerates the app's workload with fake_gen_record and the registry's offsets, as
 * test_engine_mixed.c does, so nothing is compared against constants.
 *
 * The server is a thread that implements the monitor's half of the handshake of docs/wire.md
 * (token check, CONFIGURE, SELECT, HELLO_ACK) and then reads frames, with knobs for the failure
 * tests: close after N batches, pause reading, send a FLUSH on request.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cmt.h"
#include "cmt_records.h"
#include "cuptimon.h"
#include "cuptimon_wire.h"
#include "fake_cupti.h"

#ifndef CM_TEST_AGENT
#error "CM_TEST_AGENT (the path of libcuptimon-agent.so) must be defined by the build"
#endif
#ifndef CM_TEST_APP
#error "CM_TEST_APP (the path of fake_cuda_app) must be defined by the build"
#endif

/* ---- accumulated checksums ----------------------------------------------------------------- */

typedef struct kacc {
  uint64_t count;
  uint64_t sum[128], xr[128];
} kacc;

typedef struct checker {
  kacc k[CM_KIND_MAX];
  uint64_t *str_hash; /* by id; 0 = not received */
  size_t nstr;
  int hellos, schemas, byes, batches, frames_after_bye;
  uint32_t hello_pid;
  char token[128];
  uint64_t stats_batches_dropped, stats_records_dropped_agent, stats_records_dropped;
  uint64_t stats_batches_sent;
  uint64_t stats_records_dropped_exit;
  uint64_t stats_exit_tail_unknown;
  int stats_frames;
  /* Loss accounting (wire 1.1): BATCH numbers run 1, 2, 3, ... with no gap, and each STATS's
   * records_queued / batches_queued equal what arrived before it. */
  uint32_t last_number;
  uint64_t records_in, batches_in;
  int stats_checked;
  uint64_t last_flush_id;
  int32_t last_flush_status;
  int flush_dones;
  uint64_t last_seq;
  char bye_message[1200];
  const cm_selection *expect_sel; /* when set, every batch must carry exactly these columns */
} checker;

static void checker_free(checker *c) { free(c->str_hash); }

static void fold_batch(checker *c, const cm_batch *b) {
  CMT_ASSERT(b->kind > 0 && b->kind < CM_KIND_MAX);
  CMT_GE(b->seq, c->last_seq); /* non-decreasing: the pieces of one drain share their seq */
  c->last_seq = b->seq;
  if (c->expect_sel) {
    CMT_EQ(b->ncols, cm_selection_count(c->expect_sel, b->kind));
    for (uint32_t i = 0; i < b->ncols; i++)
      CMT_EQ(cm_selection_has(c->expect_sel, b->kind, b->cols[i].field), 1);
  }
  kacc *ka = &c->k[b->kind];
  for (uint32_t i = 0; i < b->ncols; i++) {
    const cm_column *col = &b->cols[i];
    CMT_ASSERT(col->field >= 0 && col->field < 128);
    cm_field_info fi;
    CMT_OK(cm_field_info_get(b->kind, col->field, &fi));
    CMT_EQ(col->type, fi.type);
    CMT_EQU(col->width, fi.width);
    CMT_EQU((uintptr_t)col->data % 8, 0);
    for (uint32_t r = 0; r < b->n; r++) {
      uint64_t raw = load_le((const uint8_t *)col->data + (size_t)r * col->width, col->width);
      uint64_t v;
      if (col->type == CM_TYPE_STR) {
        if (raw == 0) {
          v = fnv1a("", 0);
        } else {
          if (raw >= c->nstr || c->str_hash[raw] == 0)
            CMT_FAIL("string id %llu used by a batch before any STRINGS frame sent it",
                     (unsigned long long)raw);
          v = c->str_hash[raw];
        }
      } else {
        v = normalize(raw, col->width, type_signed(col->type));
      }
      fold_value(&ka->sum[col->field], &ka->xr[col->field], col->field, v);
    }
  }
  ka->count += b->n;
  c->batches++;
}

/* Folds one verified frame into the checker. */
static void checker_frame(checker *c, const cm_wire_frame *f) {
  if (c->byes) c->frames_after_bye++;
  switch (f->type) {
  case CM_WIRE_HELLO: {
    cm_wire_hello h;
    CMT_OK(cm_wire_decode_hello(f, &h));
    c->hellos++;
    c->hello_pid = h.pid;
    snprintf(c->token, sizeof c->token, "%s", h.token);
    CMT_GT(h.argc, 0);
    CMT_CONTAINS(h.argv[0], "fake_cuda_app");
    CMT_GT(h.clock_realtime_ns, 0);
    cm_wire_hello_release(&h);
    break;
  }
  case CM_WIRE_SCHEMA: {
    cm_wire_schema s;
    CMT_OK(cm_wire_decode_schema(f, &s));
    c->schemas++;
    /* Every kind and field of the registry, as the registry describes it. */
    CMT_EQ(s.nkinds, cm_kind_count());
    for (uint32_t i = 0; i < s.nkinds; i++) {
      CMT_EQ(s.kinds[i].nfields, cm_field_count((int)s.kinds[i].kind));
      for (uint32_t j = 0; j < s.kinds[i].nfields; j++) {
        cm_field_info fi;
        CMT_OK(cm_field_info_get((int)s.kinds[i].kind, (int)s.kinds[i].fields[j].id, &fi));
        CMT_STREQ(s.kinds[i].fields[j].name, fi.name);
        CMT_EQ(s.kinds[i].fields[j].type, fi.type);
      }
    }
    cm_wire_schema_release(&s);
    break;
  }
  case CM_WIRE_STRINGS: {
    cm_wire_strings s;
    CMT_OK(cm_wire_decode_strings(f, &s));
    for (uint32_t i = 0; i < s.count; i++) {
      uint32_t id = s.entries[i].id;
      CMT_NE(id, 0);
      if (id >= c->nstr) {
        size_t n = (size_t)id * 2 + 16;
        c->str_hash = realloc(c->str_hash, n * sizeof *c->str_hash);
        CMT_ASSERT(c->str_hash != NULL);
        memset(c->str_hash + c->nstr, 0, (n - c->nstr) * sizeof *c->str_hash);
        c->nstr = n;
      }
      if (c->str_hash[id]) CMT_FAIL("string id %u sent twice", id);
      c->str_hash[id] = fnv1a(s.entries[i].bytes, s.entries[i].len);
    }
    cm_wire_strings_release(&s);
    break;
  }
  case CM_WIRE_BATCH: {
    static cm_wire_batch wb;
    CMT_OK(cm_wire_decode_batch(f, NULL, &wb));
    CMT_EQU(wb.number, c->last_number + 1);
    c->last_number = wb.number;
    c->records_in += wb.batch.n;
    c->batches_in++;
    fold_batch(c, &wb.batch);
    break;
  }
  case CM_WIRE_STATS: {
    cm_wire_kvlist l;
    CMT_OK(cm_wire_decode_kvlist(f, &l));
    c->stats_frames++;
    for (uint32_t i = 0; i < l.count; i++) {
      if (strcmp(l.items[i].name, "batches_dropped") == 0) c->stats_batches_dropped = l.items[i].value;
      if (strcmp(l.items[i].name, "records_dropped_agent") == 0)
        c->stats_records_dropped_agent = l.items[i].value;
      if (strcmp(l.items[i].name, "records_dropped") == 0) c->stats_records_dropped = l.items[i].value;
      if (strcmp(l.items[i].name, "batches_sent") == 0) c->stats_batches_sent = l.items[i].value;
      if (strcmp(l.items[i].name, "records_dropped_exit") == 0)
        c->stats_records_dropped_exit = l.items[i].value;
      if (strcmp(l.items[i].name, "exit_tail_unknown") == 0)
        c->stats_exit_tail_unknown = l.items[i].value;
      if (strcmp(l.items[i].name, "records_queued") == 0) {
        CMT_EQU(l.items[i].value, c->records_in);
        c->stats_checked++;
      }
      if (strcmp(l.items[i].name, "batches_queued") == 0) CMT_EQU(l.items[i].value, c->batches_in);
    }
    cm_wire_kvlist_release(&l);
    break;
  }
  case CM_WIRE_FLUSH_DONE:
    CMT_OK(cm_wire_decode_flush_done(f, &c->last_flush_id, &c->last_flush_status));
    c->flush_dones++;
    break;
  case CM_WIRE_BYE: {
    cm_wire_bye b;
    CMT_OK(cm_wire_decode_bye(f, &b));
    CMT_EQ(b.reason, CM_WIRE_BYE_EXIT);
    snprintf(c->bye_message, sizeof c->bye_message, "%s", b.message ? b.message : "");
    c->byes++;
    break;
  }
  default:
    CMT_FAIL("unexpected frame type %u from the agent", f->type);
  }
}

/* Reads a whole capture into `c`. Returns 0 for a clean end, or the reader's negative error with
 * its message in errmsg (CM_WIRE_ERRMSG_SIZE bytes). */
__attribute__((unused)) static int read_capture(const char *path, checker *c, char *errmsg) {
  cm_wire_file *cf = NULL;
  char em[CM_WIRE_ERRMSG_SIZE];
  int rc = cm_wire_file_open(&cf, path, em);
  if (rc) CMT_FAIL("cannot open capture %s: %s", path, em);
  cm_wire_frame f;
  while ((rc = cm_wire_file_next(cf, &f)) == 1) checker_frame(c, &f);
  if (errmsg) snprintf(errmsg, CM_WIRE_ERRMSG_SIZE, "%s", cm_wire_file_errmsg(cf));
  cm_wire_file_close(cf);
  return rc;
}

/* ---- the expected side --------------------------------------------------------------------- */

/* Regenerates the app's workload (fake_cuda_app's split of `records` over `threads`) and folds
 * the fields `sel` selects into exp[kind]. */
__attribute__((unused)) static void expect_workload(kacc *exp, uint64_t records, int threads, const int *kinds, int nk,
                            const cm_selection *sel) {
  union {
    uint64_t align;
    unsigned char b[1024];
  } rec;
  static cm_field_info fi[CM_KIND_MAX][128];
  static int nf[CM_KIND_MAX];
  for (int i = 0; i < nk; i++) {
    int k = kinds[i];
    nf[k] = cm_field_count(k);
    CMT_GT(nf[k], 0);
    for (int f = 0; f < nf[k]; f++) CMT_OK(cm_field_info_get(k, f, &fi[k][f]));
  }
  for (int t = 0; t < threads; t++) {
    uint64_t n = records / (uint64_t)threads + ((uint64_t)t < records % (uint64_t)threads);
    for (uint64_t j = 0; j < n; j++) {
      int k = kinds[j % (uint64_t)nk];
      memset(rec.b, 0, sizeof rec.b);
      size_t size = fake_gen_record(k, (uint32_t)t, j, rec.b);
      CMT_GT(size, 0);
      for (int f = 0; f < nf[k]; f++) {
        if (!cm_selection_has(sel, k, f)) continue;
        fold_value(&exp[k].sum[f], &exp[k].xr[f], f, record_value(rec.b, size, &fi[k][f]));
      }
      exp[k].count++;
    }
  }
}

/* Compares got with exp for the listed kinds; returns the number of mismatches (printed). */
__attribute__((unused)) static int compare(const kacc *got, const kacc *exp, const int *kinds, int nk,
                   const cm_selection *sel) {
  int bad = 0;
  for (int i = 0; i < nk; i++) {
    int k = kinds[i];
    printf("  %-18s expected %8llu got %8llu\n", cm_kind_name(k),
           (unsigned long long)exp[k].count, (unsigned long long)got[k].count);
    if (got[k].count != exp[k].count) bad++;
    for (int f = 0; f < cm_field_count(k); f++) {
      if (!cm_selection_has(sel, k, f)) continue;
      if (got[k].sum[f] != exp[k].sum[f] || got[k].xr[f] != exp[k].xr[f]) {
        cm_field_info fi;
        cm_field_info_get(k, f, &fi);
        fprintf(stderr, "FAIL %s.%s: checksum mismatch\n", cm_kind_name(k), fi.name);
        bad++;
      }
    }
  }
  return bad;
}

/* ---- the fake CUDA application as a child process ------------------------------------------ */

typedef struct app {
  pid_t pid;
  int out_fd;
  char line[4096];
  char errpath[256];
  int status;
} app;

/* Starts fake_cuda_app with `args` (space-separated) and the environment assignments `env`
 * ("NAME=value", NULL-terminated) on top of the agent's injection variable. */
static void app_start(app *a, const char *const *env, const char *args) {
  memset(a, 0, sizeof *a);
  static int seq;
  snprintf(a->errpath, sizeof a->errpath, "/tmp/cmt-agent-%d-%d.err", (int)getpid(), seq++);
  int p[2];
  CMT_EQ(pipe(p), 0);
  fflush(NULL);
  a->pid = fork();
  CMT_GE(a->pid, 0);
  if (a->pid == 0) {
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    int efd = open(a->errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (efd >= 0) dup2(efd, 2);
    unsetenv("CUPTIMON_SOCKET");
    unsetenv("CUPTIMON_CAPTURE");
    unsetenv("CUPTIMON_SELECT");
    unsetenv("CUPTIMON_TOKEN");
    setenv("CUDA_INJECTION64_PATH", CM_TEST_AGENT, 1);
    for (int i = 0; env && env[i]; i++) putenv(strdup(env[i]));
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)CM_TEST_APP;
    char *copy = strdup(args), *save = NULL;
    for (char *t = strtok_r(copy, " ", &save); t && argc < 63; t = strtok_r(NULL, " ", &save))
      argv[argc++] = t;
    argv[argc] = NULL;
    execv(CM_TEST_APP, argv);
    _exit(127);
  }
  close(p[1]);
  a->out_fd = p[0];
}

/* Reads the app's one stdout line (waiting at most timeout_ms). Returns true when read. */
static bool app_read_line(app *a, int timeout_ms) {
  size_t len = strlen(a->line);
  uint64_t deadline = mono_ms() + (uint64_t)timeout_ms;
  while (!strchr(a->line, '\n')) {
    uint64_t now = mono_ms();
    if (now >= deadline) return false;
    struct pollfd pf = {.fd = a->out_fd, .events = POLLIN};
    if (poll(&pf, 1, (int)(deadline - now)) <= 0) continue;
    ssize_t r = read(a->out_fd, a->line + len, sizeof a->line - 1 - len);
    if (r <= 0) return len > 0;
    len += (size_t)r;
    a->line[len] = '\0';
  }
  return true;
}

/* Waits for the app to end (killing it after timeout_ms, which fails the test). */
static int app_wait(app *a, int timeout_ms) {
  app_read_line(a, timeout_ms);
  uint64_t deadline = mono_ms() + (uint64_t)timeout_ms;
  for (;;) {
    pid_t w = waitpid(a->pid, &a->status, WNOHANG);
    if (w == a->pid) break;
    if (mono_ms() >= deadline) {
      kill(a->pid, SIGKILL);
      waitpid(a->pid, &a->status, 0);
      CMT_FAIL("fake_cuda_app did not exit within %d ms (it hung)", timeout_ms);
    }
    usleep(5000);
  }
  close(a->out_fd);
  return a->status;
}

/* The value of `key=` in the app's line, or -1. */
static int64_t app_get(const app *a, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, " %s=", key);
  const char *p = strstr(a->line, pat);
  return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* The app's stderr (the agent's log), malloc'd. */
static char *app_log(const app *a) {
  FILE *f = fopen(a->errpath, "r");
  CMT_ASSERT(f != NULL);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void app_cleanup(const app *a) { unlink(a->errpath); }

/* ---- the monitor side ---------------------------------------------------------------------- */

typedef struct server {
  char path[108];
  int lfd, fd;
  pthread_t th;
  /* Settings, fixed before the thread starts. */
  const char *token;       /* the token the server expects */
  const char *select;      /* the SELECT it sends, or NULL */
  uint32_t deliver_ms;     /* sent in CONFIGURE when not 0 */
  uint32_t flush_timeout_ms; /* the timeout of the FLUSH of flush_req; 0 means 10000 */
  const cm_wire_kv *configure; /* when set, sent as the CONFIGURE instead (nconfigure items) */
  uint32_t nconfigure;
  int close_after_batches; /* close the connection after this many batches (0: never) */
  /* Commands from the test thread. */
  atomic_int pause;        /* while set, the server does not read */
  atomic_ullong flush_req; /* when not 0, send FLUSH{sync} with this id once */
  /* Results; read by the test thread after join, or under mu. */
  pthread_mutex_t mu;
  checker chk;
  kacc snap[CM_KIND_MAX];  /* the counts when the FLUSH_DONE of flush_req arrived */
  bool snap_taken;
  bool refused, eof, closed_by_us, accepted;
  uint64_t bytes;
} server;

static void srv_send(server *s, cm_wire_buf *b) {
  const uint8_t *p = b->data;
  size_t n = b->len;
  while (n) {
    ssize_t w = send(s->fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= (size_t)w;
  }
  cm_wire_buf_clear(b);
}

static void *server_main(void *arg) {
  server *s = arg;
  struct pollfd pf = {.fd = s->lfd, .events = POLLIN};
  if (poll(&pf, 1, 30000) <= 0) return NULL;
  s->fd = accept(s->lfd, NULL, NULL);
  if (s->fd < 0) return NULL;
  s->accepted = true;
  cm_wire_reader *r = NULL;
  CMT_OK(cm_wire_reader_new(&r, 0));
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  bool handshaken = false, flush_sent = false;
  uint8_t buf[65536];
  for (;;) {
    if (handshaken && atomic_load(&s->pause)) {
      usleep(5000);
      continue;
    }
    uint64_t fid = atomic_load(&s->flush_req);
    if (handshaken && fid && !flush_sent) {
      CMT_OK(cm_wire_write_flush(&b, fid, CM_WIRE_FLUSH_SYNC,
                                 s->flush_timeout_ms ? s->flush_timeout_ms : 10000));
      srv_send(s, &b);
      flush_sent = true;
    }
    struct pollfd p2 = {.fd = s->fd, .events = POLLIN};
    if (poll(&p2, 1, 20) <= 0) continue;
    ssize_t n = recv(s->fd, buf, sizeof buf, 0);
    if (n <= 0) {
      s->eof = true;
      break;
    }
    s->bytes += (uint64_t)n;
    CMT_OK(cm_wire_reader_feed(r, buf, (size_t)n));
    cm_wire_frame f;
    int rc;
    bool done = false;
    while ((rc = cm_wire_reader_next(r, &f)) == 1) {
      pthread_mutex_lock(&s->mu);
      checker_frame(&s->chk, &f);
      if (f.type == CM_WIRE_FLUSH_DONE && s->chk.last_flush_id == fid && !s->snap_taken) {
        memcpy(s->snap, s->chk.k, sizeof s->snap);
        s->snap_taken = true;
      }
      pthread_mutex_unlock(&s->mu);
      if (!handshaken && s->chk.hellos == 1 && s->chk.schemas == 1) {
        if (strcmp(s->chk.token, s->token) != 0) {
          CMT_OK(cm_wire_write_hello_ack(&b, CM_EINVAL, "wrong token"));
          srv_send(s, &b);
          s->refused = true;
          done = true;
          break;
        }
        if (s->configure) {
          CMT_OK(cm_wire_write_configure(&b, s->configure, s->nconfigure));
        } else if (s->deliver_ms) {
          cm_wire_kv kv[] = {{"deliver_ms", s->deliver_ms}, {"no_such_setting", 1}};
          CMT_OK(cm_wire_write_configure(&b, kv, 2));
        }
        if (s->select) CMT_OK(cm_wire_write_select(&b, s->select));
        CMT_OK(cm_wire_write_hello_ack(&b, 0, ""));
        srv_send(s, &b);
        handshaken = true;
      }
      if (s->close_after_batches && s->chk.batches >= s->close_after_batches) {
        s->closed_by_us = true;
        done = true;
        break;
      }
    }
    if (rc < 0) CMT_FAIL("the agent's stream is corrupt: %s", cm_wire_reader_errmsg(r));
    if (done) break;
  }
  close(s->fd);
  cm_wire_buf_free(&b);
  cm_wire_reader_free(r);
  return NULL;
}

__attribute__((unused)) static void server_start(server *s, const char *token, const char *select, uint32_t deliver_ms) {
  static int seq;
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  s->token = token;
  s->select = select;
  s->deliver_ms = deliver_ms;
  snprintf(s->path, sizeof s->path, "/tmp/cmt-agent-%d-%d.sock", (int)getpid(), seq++);
  unlink(s->path);
  s->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  CMT_GE(s->lfd, 0);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  strcpy(sa.sun_path, s->path);
  CMT_EQ(bind(s->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  CMT_EQ(listen(s->lfd, 4), 0);
}

__attribute__((unused)) static void server_run(server *s) { CMT_EQ(pthread_create(&s->th, NULL, server_main, s), 0); }

__attribute__((unused)) static void server_join(server *s) {
  pthread_join(s->th, NULL);
  close(s->lfd);
  unlink(s->path);
}
