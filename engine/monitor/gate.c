/*
 * gate.c: the hub's handshake gate (see gate.h for the contract).
 *
 * Design note. One thread polls the listening socket, a wake-up pipe and the connections that
 * have not completed their handshake ("pending"). A pending connection is read only up to the
 * end of its first frame: 24 header bytes, then, once the header's checksum, type (HELLO) and
 * declared length (at most hello_max_bytes) are checked, exactly that many payload bytes. So
 * what a peer can make the gate hold before it has proved anything is bounded by
 * max_pending x (24 + hello_max_bytes), and a frame that claims a gigabyte costs nothing. The
 * frames after HELLO stay in the socket for the loop thread's reader.
 *
 * A complete HELLO is verified by a wire reader (both checksums), decoded, and its token
 * compared in constant time. A wrong token or a malformed HELLO gets HELLO_ACK with an error and
 * the connection is closed. A good one gets CONFIGURE (when cadences were published), SELECT
 * (the published union) and HELLO_ACK 0, written here, and is queued for the loop thread. The
 * `inflight` count covers the moment between the answer and the queueing, so the hub never ends
 * the run while an agent it answered is not yet in its list.
 *
 * Descriptor exhaustion: accept failing with EMFILE first evicts the oldest pending connection;
 * with nothing to evict, a reserved descriptor is released to accept and close the connection,
 * so the listening socket never spins readable. Messages: the first few of each kind are
 * printed, the rest only counted (the hub prints a summary at the end).
 *
 * Threads: the gate thread, plus callers of the locked functions (gate.h). Lock: gate_mu guards
 * the published answer, the queue, inflight and the counters; it is a leaf lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cuptimon.h"
#include "cuptimon_wire.h"
#include "gate.h"

#define LOG_FIRST 3 /* messages printed per kind of refusal; the rest are counted */

typedef struct pending {
  int fd;
  pid_t pid;
  uid_t uid;
  uint64_t deadline; /* monotonic ms */
  uint8_t *buf;
  size_t len, want;  /* bytes read; bytes of the whole HELLO frame once its header is known */
} pending;

struct cm__gate {
  cm__gate_options o;
  char *token;
  int listen_fd, wake[2], reserve_fd;
  pthread_t thread;
  int started, stopped;
  pending *pend;
  uint32_t npend;

  pthread_mutex_t gate_mu;
  char *select;
  uint32_t flush_ms, deliver_ms;
  cm__gate_conn *queue;
  size_t nqueue, cap_queue;
  int inflight;
  int stop;
  cm__gate_stats st;
};

#if defined(__SANITIZE_THREAD__)
/* ThreadSanitizer tracks descriptors as memory. libuv, when not itself built with TSan (the
 * distribution's), closes descriptors with syscall(SYS_close), which TSan never sees, so when
 * accept4 here reuses the number of a descriptor that the loop thread created and libuv closed
 * (uv_spawn's pipe, an agent's connection), TSan reports a race on the number. The same happens
 * when a script's luv thread starts its own loop (epoll_create1, pipe2 and eventfd in uv_loop_init)
 * and reuses the numbers that a finished thread's loop closed (seen in lua_corr_spec under TSan).
 * Such reports name these descriptor-creating calls; nothing else is suppressed. */
const char *__tsan_default_suppressions(void);
/* Default visibility: the monitor is built with hidden visibility, and the TSan runtime finds this
 * hook only when it is exported. */
__attribute__((visibility("default"))) const char *__tsan_default_suppressions(void) {
  return "race:accept4\nrace:epoll_create1\nrace:pipe2\nrace:eventfd\n";
}
#endif

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t ld64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static uint32_t ld32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int cm__gate_token_equal(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  /* Every byte of `a` is looked at whatever the contents; only the length may show. */
  unsigned char diff = la != lb;
  for (size_t i = 0; i < la; i++) diff |= (unsigned char)(a[i] ^ (i < lb ? b[i] : 0));
  return diff == 0;
}

static int default_cred(int fd, pid_t *pid, uid_t *uid) {
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) return -errno;
  *pid = cr.pid;
  *uid = cr.uid;
  return 0;
}

/* Counts one event of a kind and says whether to print it. */
static int count(cm__gate *g, uint64_t *counter) {
  pthread_mutex_lock(&g->gate_mu);
  uint64_t n = ++*counter;
  pthread_mutex_unlock(&g->gate_mu);
  return n <= LOG_FIRST;
}

static void drop(cm__gate *g, uint32_t i) {
  pending *p = &g->pend[i];
  close(p->fd);
  free(p->buf);
  memmove(&g->pend[i], &g->pend[i + 1], (g->npend - i - 1) * sizeof *p);
  g->npend--;
}

/* Writes all of `b` within `ms` milliseconds. */
static int send_all(int fd, const uint8_t *p, size_t n, uint32_t ms) {
  uint64_t deadline = now_ms() + ms;
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      uint64_t now = now_ms();
      if (now >= deadline) return CM_ETIMEDOUT;
      struct pollfd pf = {.fd = fd, .events = POLLOUT};
      poll(&pf, 1, (int)(deadline - now));
      continue;
    }
    return CM_EIO;
  }
  return 0;
}

static void refuse(cm__gate *g, uint32_t i, int32_t status, const char *msg) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  if (cm_wire_write_hello_ack(&b, status, msg) == 0) send_all(g->pend[i].fd, b.data, b.len, 200);
  cm_wire_buf_free(&b);
  drop(g, i);
}

/* Answers and queues pending connection i, whose HELLO checked out. */
static void admit(cm__gate *g, uint32_t i) {
  pending *p = &g->pend[i];
  cm__gate_conn c = {.fd = p->fd, .pid = p->pid, .uid = p->uid, .bytes = p->buf, .len = p->len};
  pthread_mutex_lock(&g->gate_mu);
  g->inflight++;
  c.select = strdup(g->select ? g->select : "");
  c.flush_ms = g->flush_ms;
  c.deliver_ms = g->deliver_ms;
  pthread_mutex_unlock(&g->gate_mu);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_kv kv[2];
  uint32_t n = 0;
  if (c.flush_ms) kv[n++] = (cm_wire_kv){.name = "flush_ms", .value = c.flush_ms};
  if (c.deliver_ms) kv[n++] = (cm_wire_kv){.name = "deliver_ms", .value = c.deliver_ms};
  int rc = c.select ? 0 : CM_ENOMEM;
  if (!rc && n) rc = cm_wire_write_configure(&b, kv, n);
  if (!rc) rc = cm_wire_write_select(&b, c.select);
  if (!rc) rc = cm_wire_write_hello_ack(&b, 0, "");
  if (!rc) rc = send_all(c.fd, b.data, b.len, 1000);
  cm_wire_buf_free(&b);
  pthread_mutex_lock(&g->gate_mu);
  if (!rc && g->nqueue == g->cap_queue) {
    size_t cap = g->cap_queue ? g->cap_queue * 2 : 16;
    cm__gate_conn *q = realloc(g->queue, cap * sizeof *q);
    if (q) {
      g->queue = q;
      g->cap_queue = cap;
    } else {
      rc = CM_ENOMEM;
    }
  }
  if (!rc) {
    g->queue[g->nqueue++] = c;
    g->st.admitted++;
  } else {
    g->st.eof++;
  }
  g->inflight--;
  pthread_mutex_unlock(&g->gate_mu);
  if (rc) {
    free(c.select);
    drop(g, i);
    return;
  }
  /* The connection now belongs to the queue. */
  memmove(&g->pend[i], &g->pend[i + 1], (g->npend - i - 1) * sizeof *p);
  g->npend--;
  if (g->o.admitted) g->o.admitted(g->o.ud);
}

/* The whole HELLO frame of pending connection i is in its buffer. */
static void check_hello(cm__gate *g, uint32_t i) {
  pending *p = &g->pend[i];
  cm_wire_reader *r = NULL;
  cm_wire_frame f;
  cm_wire_hello hl;
  memset(&hl, 0, sizeof hl);
  int rc = cm_wire_reader_new(&r, 0);
  if (!rc) rc = cm_wire_reader_feed(r, p->buf, p->len);
  if (!rc) rc = cm_wire_reader_next(r, &f) == 1 ? 0 : CM_EIO;
  if (!rc) rc = cm_wire_decode_hello(&f, &hl);
  if (rc) {
    if (count(g, &g->st.bad_hello))
      fprintf(stderr, "cuptimon-lua: refusing an agent (pid %d): malformed HELLO (%s)\n",
              (int)p->pid, r ? cm_wire_reader_errmsg(r) : "out of memory");
    cm_wire_hello_release(&hl);
    cm_wire_reader_free(r);
    refuse(g, i, CM_EINVAL, "malformed HELLO");
    return;
  }
  int good = hl.token && cm__gate_token_equal(hl.token, g->token);
  cm_wire_hello_release(&hl);
  cm_wire_reader_free(r);
  if (!good) {
    if (count(g, &g->st.wrong_token))
      fprintf(stderr, "cuptimon-lua: refusing an agent (pid %d): wrong token\n", (int)p->pid);
    refuse(g, i, CM_EINVAL,
           "wrong token: this agent's CUPTIMON_TOKEN does not belong to this cuptimon-lua run");
    return;
  }
  admit(g, i);
}

/* Reads what pending connection i has sent, up to the end of its first frame. */
static void on_readable(cm__gate *g, uint32_t i) {
  for (;;) {
    pending *p = &g->pend[i];
    size_t want = p->want ? p->want : CM_WIRE_FRAME_HEADER_SIZE;
    ssize_t n = read(p->fd, p->buf + p->len, want - p->len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      count(g, &g->st.eof);
      drop(g, i);
      return;
    }
    p->len += (size_t)n;
    if (p->len < want) continue;
    if (p->want) {
      check_hello(g, i);
      return;
    }
    /* The header: trusted only once its own checksum matches (docs/wire.md). */
    const uint8_t *h = p->buf;
    uint64_t len = ld64(h + 8);
    uint32_t type = (uint32_t)h[4] | (uint32_t)h[5] << 8;
    const char *why = NULL;
    char detail[160];
    if (h[0] != 'C' || h[1] != 'M' || cm_wire_crc32c(0, h, 20) != ld32(h + 20)) {
      why = "its first bytes are not a wire frame header";
    } else if (type != CM_WIRE_HELLO) {
      const char *tn = cm_wire_type_name(type);
      snprintf(detail, sizeof detail, "it sent %s before HELLO", tn ? tn : "an unknown frame");
      why = detail;
    } else if (len > g->o.hello_max_bytes || len % 8) {
      if (count(g, &g->st.oversized))
        fprintf(stderr, "cuptimon-lua: closing a connection (pid %d): its HELLO declares %llu "
                "bytes, over the cap of %u bytes before the handshake (CUPTIMON_HELLO_MAX_BYTES)\n",
                (int)p->pid, (unsigned long long)len, g->o.hello_max_bytes);
      drop(g, i);
      return;
    }
    if (why) {
      if (count(g, &g->st.bad_hello))
        fprintf(stderr, "cuptimon-lua: closing a connection (pid %d): %s\n", (int)p->pid, why);
      drop(g, i);
      return;
    }
    uint8_t *nb = realloc(p->buf, CM_WIRE_FRAME_HEADER_SIZE + (size_t)len);
    if (!nb) {
      drop(g, i);
      return;
    }
    p->buf = nb;
    p->want = CM_WIRE_FRAME_HEADER_SIZE + (size_t)len;
    if (p->len == p->want) {
      check_hello(g, i);
      return;
    }
  }
}

/* Counts pending connection i as a process lost, when it had sent part of its HELLO. */
static void note_lost(cm__gate *g, uint32_t i) {
  if (!g->pend[i].len) return;
  pthread_mutex_lock(&g->gate_mu);
  if (g->st.lost < sizeof g->st.lost_pids / sizeof g->st.lost_pids[0])
    g->st.lost_pids[g->st.lost] = (int32_t)g->pend[i].pid;
  g->st.lost++;
  pthread_mutex_unlock(&g->gate_mu);
}

/* Makes room when the pending table is full. Fair per peer: the victim is a connection of the pid
 * that holds the most pending connections, one that has sent nothing before one in the middle of
 * its HELLO, the oldest first. So one process that opens connections and sends nothing (a flood)
 * evicts only its own, and an agent writing its HELLO is closed only when every pending
 * connection is mid-HELLO. */
static void evict_one(cm__gate *g) {
  if (!g->npend) return;
  uint32_t best = 0, best_n = 0;
  int best_idle = 0;
  for (uint32_t i = 0; i < g->npend; i++) {
    uint32_t n = 0;
    for (uint32_t j = 0; j < g->npend; j++) n += g->pend[j].pid == g->pend[i].pid;
    int idle = g->pend[i].len == 0;
    if (i == 0 || idle > best_idle || (idle == best_idle && n > best_n)) {
      best = i;
      best_n = n;
      best_idle = idle;
    }
  }
  if (count(g, &g->st.evicted))
    fprintf(stderr, "cuptimon-lua: %u connections are waiting for their handshake (the cap, "
            "CUPTIMON_MAX_STARTUPS); closing one of pid %d (%u pending, %s)\n", g->o.max_pending,
            (int)g->pend[best].pid, best_n, best_idle ? "idle" : "in the middle of its HELLO");
  note_lost(g, best);
  drop(g, best);
}

static void on_accept(cm__gate *g) {
  for (int round = 0; round < 256; round++) {
    int fd = accept4(g->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        if (g->npend) {
          evict_one(g);
          continue;
        }
        /* Nothing of ours to close: take the connection with the reserved descriptor and
         * close it, or the listening socket would stay readable forever. */
        if (g->reserve_fd >= 0) {
          close(g->reserve_fd);
          int x = accept4(g->listen_fd, NULL, NULL, SOCK_CLOEXEC);
          if (x >= 0) close(x);
          g->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
          if (count(g, &g->st.evicted))
            fprintf(stderr, "cuptimon-lua: out of descriptors; refusing a connection\n");
        }
      }
      return;
    }
    pid_t pid = 0;
    uid_t uid = (uid_t)-1;
    int rc = g->o.cred(fd, &pid, &uid);
    if (rc || uid != g->o.uid) {
      if (count(g, &g->st.refused_uid)) {
        if (rc)
          fprintf(stderr, "cuptimon-lua: refusing a connection: cannot read its credentials: %s\n",
                  strerror(-rc));
        else
          fprintf(stderr, "cuptimon-lua: refusing a connection from uid %u (pid %d): the monitor "
                  "admits only its own user (uid %u)\n", (unsigned)uid, (int)pid, (unsigned)g->o.uid);
      }
      close(fd);
      continue;
    }
    if (g->npend >= g->o.max_pending) evict_one(g);
    pending *p = &g->pend[g->npend];
    memset(p, 0, sizeof *p);
    p->buf = malloc(CM_WIRE_FRAME_HEADER_SIZE);
    if (!p->buf) {
      close(fd);
      continue;
    }
    p->fd = fd;
    p->pid = pid;
    p->uid = uid;
    p->deadline = now_ms() + g->o.hello_timeout_ms;
    g->npend++;
    /* An agent writes its HELLO right after connecting: it is usually here already. */
    on_readable(g, g->npend - 1);
  }
}

static void expire(cm__gate *g) {
  uint64_t now = now_ms();
  for (uint32_t i = g->npend; i-- > 0;)
    if (g->pend[i].deadline <= now) {
      if (count(g, &g->st.timed_out))
        fprintf(stderr, "cuptimon-lua: closing a connection (pid %d) that sent no valid HELLO "
                "within %u ms (CUPTIMON_HELLO_TIMEOUT_MS)\n", (int)g->pend[i].pid,
                g->o.hello_timeout_ms);
      note_lost(g, i);
      drop(g, i);
    }
}

static void *gate_main(void *arg) {
  pthread_setname_np(pthread_self(), "cm-gate");
  cm__gate *g = arg;
  struct pollfd *pf = calloc(g->o.max_pending + 2, sizeof *pf);
  if (!pf) return NULL;
  for (;;) {
    pthread_mutex_lock(&g->gate_mu);
    int stop = g->stop;
    pthread_mutex_unlock(&g->gate_mu);
    if (stop) break;
    pf[0] = (struct pollfd){.fd = g->wake[0], .events = POLLIN};
    pf[1] = (struct pollfd){.fd = g->listen_fd, .events = POLLIN};
    uint32_t np = g->npend;
    uint64_t next = UINT64_MAX;
    for (uint32_t i = 0; i < np; i++) {
      pf[2 + i] = (struct pollfd){.fd = g->pend[i].fd, .events = POLLIN};
      if (g->pend[i].deadline < next) next = g->pend[i].deadline;
    }
    int timeout = -1;
    if (next != UINT64_MAX) {
      uint64_t now = now_ms();
      timeout = next <= now ? 0 : (int)(next - now);
    }
    int n = poll(pf, 2 + np, timeout);
    if (n < 0 && errno != EINTR) break;
    if (n > 0) {
      if (pf[0].revents) {
        char junk[64];
        while (read(g->wake[0], junk, sizeof junk) > 0) {
        }
      }
      /* Backwards: dropping connection i moves only those after it, already handled. */
      for (uint32_t i = np; i-- > 0;)
        if (pf[2 + i].revents) on_readable(g, i);
      if (pf[1].revents) on_accept(g);
    }
    expire(g);
  }
  free(pf);
  return NULL;
}

int cm__gate_start(cm__gate **out, int listen_fd, const cm__gate_options *o) {
  cm__gate *g = calloc(1, sizeof *g);
  if (!g) return CM_ENOMEM;
  g->o = *o;
  if (!g->o.hello_timeout_ms) g->o.hello_timeout_ms = 5000;
  if (!g->o.max_pending) g->o.max_pending = 64;
  if (!g->o.hello_max_bytes) g->o.hello_max_bytes = 512u << 10;
  if (!g->o.cred) g->o.cred = default_cred;
  g->listen_fd = listen_fd;
  g->wake[0] = g->wake[1] = g->reserve_fd = -1;
  g->token = strdup(o->token ? o->token : "");
  g->select = strdup(o->select ? o->select : "");
  g->flush_ms = o->flush_ms;
  g->deliver_ms = o->deliver_ms;
  g->pend = calloc(g->o.max_pending, sizeof *g->pend);
  pthread_mutex_init(&g->gate_mu, NULL);
  int fl = fcntl(listen_fd, F_GETFL);
  if (!g->token || !g->select || !g->pend || fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) != 0 ||
      pipe2(g->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    cm__gate_free(g);
    return CM_EIO;
  }
  g->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  /* The gate thread takes no signals: the loop thread's handlers get them. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&g->thread, NULL, gate_main, g);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    cm__gate_free(g);
    return CM_EIO;
  }
  g->started = 1;
  *out = g;
  return 0;
}

int cm__gate_publish(cm__gate *g, const char *select, uint32_t flush_ms, uint32_t deliver_ms) {
  char *s = strdup(select ? select : "");
  if (!s) return CM_ENOMEM;
  pthread_mutex_lock(&g->gate_mu);
  free(g->select);
  g->select = s;
  g->flush_ms = flush_ms;
  g->deliver_ms = deliver_ms;
  pthread_mutex_unlock(&g->gate_mu);
  return 0;
}

int cm__gate_take(cm__gate *g, cm__gate_conn *out) {
  int got = 0;
  pthread_mutex_lock(&g->gate_mu);
  if (g->nqueue) {
    *out = g->queue[0];
    memmove(&g->queue[0], &g->queue[1], (g->nqueue - 1) * sizeof *out);
    g->nqueue--;
    got = 1;
  }
  pthread_mutex_unlock(&g->gate_mu);
  return got;
}

void cm__gate_conn_release(cm__gate_conn *c) {
  free(c->bytes);
  free(c->select);
  c->bytes = NULL;
  c->select = NULL;
}

int cm__gate_admitting(cm__gate *g) {
  pthread_mutex_lock(&g->gate_mu);
  int n = g->inflight + (int)g->nqueue;
  pthread_mutex_unlock(&g->gate_mu);
  return n;
}

void cm__gate_stop(cm__gate *g) {
  if (!g || g->stopped) return;
  g->stopped = 1;
  if (g->started) {
    pthread_mutex_lock(&g->gate_mu);
    g->stop = 1;
    pthread_mutex_unlock(&g->gate_mu);
    char c = 1;
    while (write(g->wake[1], &c, 1) < 0 && errno == EINTR) {
    }
    pthread_join(g->thread, NULL);
  }
  while (g->npend) drop(g, g->npend - 1);
  cm__gate_conn c;
  while (cm__gate_take(g, &c)) {
    close(c.fd);
    cm__gate_conn_release(&c);
  }
}

void cm__gate_get_stats(cm__gate *g, cm__gate_stats *out) {
  pthread_mutex_lock(&g->gate_mu);
  *out = g->st;
  pthread_mutex_unlock(&g->gate_mu);
}

void cm__gate_free(cm__gate *g) {
  if (!g) return;
  cm__gate_stop(g);
  if (g->wake[0] >= 0) close(g->wake[0]);
  if (g->wake[1] >= 0) close(g->wake[1]);
  if (g->reserve_fd >= 0) close(g->reserve_fd);
  pthread_mutex_destroy(&g->gate_mu);
  free(g->pend);
  free(g->queue);
  free(g->select);
  free(g->token);
  free(g);
}
