/*
 * agent.c: libcuptimon-agent.so, the engine inside a CUDA process, streaming to the monitor or to
 * a capture file.
 *
 * The CUDA driver loads the agent through CUDA_INJECTION64_PATH and calls InitializeInjection()
 * once, during cuInit. The agent then creates the engine, performs the handshake of docs/wire.md
 * synchronously (so tracing is configured before the application's first CUDA call returns), and
 * streams STRINGS, BATCH and STATS frames until the process exits, when an exit handler runs a
 * final fence and sends STATS and BYE. With no monitor but CUPTIMON_CAPTURE set, the same frames go
 * to a capture file. docs/agent.md describes the environment contract and the failure behavior.
 *
 * The one rule that shapes everything: the application never waits on the monitor. Frames are
 * pushed to a bounded send queue; when it is full, BATCH frames are dropped and counted (STRINGS,
 * STATS, FLUSH_DONE and BYE are small and never dropped, so what does arrive stays decodable). A
 * monitor that goes away (EOF, EPIPE, a corrupt frame) turns tracing off and the process runs on.
 * Every record the observer gets is sent or counted, in records, as dropped by the agent (full
 * queue, failed connection) or at the exit deadline; BATCH frames are numbered, and each STATS says
 * how many records were queued ahead of it, so the monitor can count what never reached it.
 * Every wait has a deadline, and every failure logs and leaves tracing off rather than failing
 * the process: InitializeInjection always returns 1.
 *
 * Threads and locks.
 *  - The init thread (the application thread inside cuInit) runs InitializeInjection: engine,
 *    handshake, first selection, then starts the two agent threads. init_mu makes it idempotent.
 *  - The engine's decode worker, or whichever thread runs cm_flush, calls on_batch(). The engine
 *    serializes observer callbacks (its dec_mu), so the callback state (cb_*) needs no lock of its
 *    own. The callback only encodes and pushes; it never blocks on I/O.
 *  - The sender thread pops frames and writes them (send with MSG_NOSIGNAL, or write for a
 *    capture). It is the only thread that writes to the descriptor after the handshake.
 *  - The control thread reads monitor frames (SELECT, CONFIGURE, FLUSH) and owns the observer
 *    list after the handshake: it is the only thread that calls cm_observe/cm_unobserve, so an
 *    observer callback never does. The sender wakes it through a pipe when the monitor is gone.
 *  - The exiting thread runs the exit handler within one budget: the engine's exit fence (which
 *    hurries a flush of the control thread out of its way), a bounded drain, the last frames,
 *    then it stops both threads (control.c applies the control frames).
 * Locks: send_mu guards the send queue and its flags; the engine's locks are taken only inside cm_*
 * calls. No agent lock is held while calling into the engine, except that on_batch takes send_mu
 * while the engine holds its dec_mu (order: engine dec_mu, then send_mu; send_mu is a leaf).
 * Counters are relaxed atomics.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cm_internal.h"
#include "control.h"
#include "guard.h"
#include "repeat.h"
#include "cuptimon_wire.h"
#include "listen.h"

/* The stderr log is shared with listen.c. */
#define alog cm__alog

#define EXPORT __attribute__((visibility("default")))

EXPORT int InitializeInjection(void);
EXPORT int InitializeInjectionNvtx2(const void *getExportTable);

/* The default selection of capture mode (CUPTIMON_SELECT overrides it). */
static const char default_select[] =
    "kernel:name,start,stop,device,context,stream,correlation,grid_x,grid_y,grid_z,block_x,"
    "block_y,block_z,registers,static_smem,dynamic_smem;"
    "memcpy:copy_kind,bytes,start,stop,device,stream,correlation;"
    "memset:bytes,start,stop,device,stream,correlation;"
    "runtime:cbid,start,stop,pid,tid,correlation;"
    "synchronization:sync_type,start,stop,stream,correlation;"
    "marker:all;marker_data:all";

enum {
  DEFAULT_HANDSHAKE_MS = 10000,
  DEFAULT_DELIVER_MS = 200,
  DEFAULT_QUEUE_MB = 64,
  DEFAULT_QUEUE_FRAMES = 1024,
  EXIT_BUDGET_MS = 2000,  /* all exit work: the final fence, the drain, the last frames, joins */
  MAX_BATCH_FRAME = 8 << 20, /* a larger batch is split into frames of about this size */
  MAX_STRINGS_FRAME = 4 << 20,
  MAX_OBSERVERS = 8,
  /* The lag guard's default limits (guard_tick, guard.h): the time CUPTI held records, and the
   * activity buffers it holds (24 MiB at the default 4 MiB; a CUPTI that keeps up holds a few,
   * with its per-thread buffers off as the engine sets them). */
  DEFAULT_GUARD_LAG_MS = 500,
  /* A detach is refused while this many threads call the CUDA runtime at once: between the
   * thread counts at which CUPTI's next subscription returned and at which it did not
   * (bench/RESULTS.md, "CUPTI states"). */
  DEFAULT_DETACH_MAX_THREADS = 8,
  /* How long a detach refused for now is retried once the monitor has gone. */
  LEAVE_RETRY_MS = 3000,
  DEFAULT_GUARD_BUFFERS = 6
};

/* One queued frame: malloc'd bytes, handed from the producer to the sender. */
typedef struct qframe {
  struct qframe *next;
  uint8_t *data;
  size_t len;
  uint32_t records; /* records in a BATCH frame, 0 otherwise */
  bool batch;
  bool stats; /* a STATS frame: its counts describe the batches queued ahead of it */
  bool bye;   /* the exit's BYE frame: once it is written, the monitor has the process's end */
  uint64_t queued_ns; /* CLOCK_MONOTONIC when it was queued */
} qframe;

static struct agent {
  /* Written by the init thread before any agent thread starts, read-only afterwards. */
  pthread_mutex_t init_mu;
  bool initialized;
  _Atomic int level;   /* the stderr log threshold, a cm_log_level */
  pid_t pid;
  cm_engine *eng;
  int fd;              /* the monitor socket or the capture file, -1 when none */
  bool is_socket;
  int wake[2];         /* the control thread's wake-up pipe */
  cm_wire_reader *reader; /* the control stream; the handshake leaves buffered frames in it */
  pthread_t sender, control;
  bool sender_started, control_started;
  uint32_t handshake_ms;
  uint32_t exit_budget_ms; /* CUPTIMON_EXIT_BUDGET_MS: all the exit handler's work */
  uint32_t exit_flush_ms; /* CUPTIMON_EXIT_FLUSH_MS: the final fence's part of the budget */
  uint32_t exit_drain_ms; /* CUPTIMON_EXIT_DRAIN_MS: the queue's part of the budget */
  /* Dormant mode (listen.c): the configuration between sessions, the queue bound to restore, and
   * the engine's counters at the session's start (STATS counts from there, so that each
   * monitor's loss accounting covers its own attach window). Written by the listener thread
   * between sessions only. */
  cm_config idle_cfg;
  size_t def_max_bytes;
  cm_stats base;

  /* Control thread only (the init thread before it starts): the engine configuration, the
   * application of control frames, and the agent's observers. */
  cm_config cfg;
  cm__control ctl;
  uint32_t obs_ids[MAX_OBSERVERS];
  /* The PM sampling consumers the monitor asked for (control thread only), and the entries that
   * wait for their device's CUDA context (pm_retry), with a copy of their names, until
   * pm_wait_end (mono ms). */
  uint32_t pm_ids[CM__CTL_PM_ENTRIES];
  uint32_t npm;
  struct pm_wait {
    cm__pm_entry e;
    char *names;
  } pm_wait[CM__CTL_PM_ENTRIES];
  uint32_t npm_wait;
  /* True while the engine runs without its cadences because nothing is traced (cadence_sync). */
  bool cadence_idle;
  /* What CUPTI is left in while nothing is traced (detach_idle; STATS cupti_idle_mode): one of
   * CM_IDLE_*, read by the sender for STATS. Written by the control thread. */
  _Atomic int idle_mode;
  /* The selections that enabled kinds since the agent started: CUPTI is detached between windows
   * only from the second on (detach_idle). Control thread. */
  uint32_t traced_selects;
  /* CUPTIMON_DETACH_MAX_THREADS: a detach is refused while this many threads call the CUDA
   * runtime at once (engine.c, "the finalize helper"); 0 turns the probe off. */
  uint64_t detach_max_threads;
  uint64_t pm_wait_end;
  int nobs;
  /* The lag guard (guard_tick; control thread only): its policy's state (guard.h; the limit is
   * CUPTIMON_GUARD_LAG_MS in ns, 0 when the guard is off); buffers_decoded at the last check; when
   * the next check is due (mono ms). */
  cm__guard guard;
  uint64_t guard_decoded, guard_next_ms;

  /* Guarded by send_mu: the send queue. */
  pthread_mutex_t send_mu;
  pthread_cond_t q_cv;     /* signals the sender: a frame, or a state change */
  pthread_cond_t idle_cv;  /* signals the exit handler: the queue ran empty or died */
  qframe *head, *tail;
  size_t q_bytes, q_frames;
  size_t max_bytes, max_frames;
  bool q_closed;           /* no more pushes (BYE was queued) */
  bool q_dead;             /* the descriptor failed: frames are freed, pushes refused */
  bool sender_stop;        /* the sender exits once the queue is empty */
  bool sending;            /* the sender holds a frame it has not finished writing */
  /* The BATCH frames queued so far, less those discarded unsent at exit: exactly the batches
   * ahead of the next STATS frame on the connection (records_queued / batches_queued). */
  uint64_t q_batches, q_records;

  /* Callback state: only on_batch touches it, and the engine serializes callbacks. */
  uint32_t cb_strings_sent; /* string ids below this were queued (id 0 is never sent) */
  uint64_t cb_last_seq;
  int32_t cb_last_kind;
  uint32_t cb_number;       /* the last BATCH frame number given (docs/wire.md: BATCH) */
  cm_wire_buf cb_buf;

  _Atomic bool active;     /* the agent runs: the exit handler has work to do */
  _Atomic bool gone;       /* the monitor or file failed: tracing goes off */
  _Atomic bool exiting;
  _Atomic bool ctl_stop;
  _Atomic bool tracing;    /* an observer is registered */
  _Atomic bool cut;        /* the exit deadline passed: what is still queued is dropped */
  _Atomic bool sender_drained; /* BYE was written whole (the sender wrote it, or stopped with
                                * the queue empty after the exit closed it) */
  /* The exit's final flush was abandoned at its deadline, or cut short, so what CUPTI and the
   * decoder still held is not known (STATS exit_tail_unknown; the monitor reports the process as
   * incomplete). */
  _Atomic bool tail_unknown;
  /* Every record the observer received ends in exactly one of records_sent (or still queued),
   * records_dropped_agent (the queue was full, or the connection failed) and
   * records_dropped_exit (still queued when the exit deadline passed). */
  _Atomic uint64_t batches_sent, batches_dropped, records_dropped_agent, records_dropped_exit,
      records_sent, bytes_sent, frames_sent, strings_sent;
  /* The selections applied (SELECT frames, whatever their effect) and the CLOCK_REALTIME instants
   * of the last two, taken between registering the new observer (whose kinds are enabled by
   * then) and removing the old one (whose kinds are disabled first thing): a trigger window that
   * saw exactly two (its widening and its narrowing) traced its kinds for last - prev. Written
   * by the control thread, read for STATS. */
  _Atomic uint64_t selects_applied, select_last_ns, select_prev_ns;
  /* SELECTs the engine refused (apply_selection): a window whose widening failed traced
   * nothing, and the monitor discards it. */
  _Atomic uint64_t selects_failed;
  /* How long the last BATCH frame sent had waited in the queue, and the peak (STATS). */
  _Atomic uint64_t send_wait_ns, send_wait_peak_ns;
  /* The kinds the lag guard stopped tracing for the rest of the session (one bit per kind), how
   * many times it shed, and CUPTI's lag when it last did (STATS guard_shed, guard_sheds,
   * guard_lag_ns). Written by the control thread. */
  _Atomic uint64_t guard_shed, guard_sheds, guard_lag_ns;
  /* The guard's measure at its last check (STATS lag_held_ns). */
  _Atomic uint64_t guard_held_ns;
  uint64_t cb_stats_ms; /* when on_batch last queued a STATS frame (callback state) */
} A = {
    .init_mu = PTHREAD_MUTEX_INITIALIZER,
    .send_mu = PTHREAD_MUTEX_INITIALIZER,
    .fd = -1,
    .wake = {-1, -1},
    .cb_last_kind = -1,
};

#define INC(field, v) atomic_fetch_add_explicit(&A.field, (v), memory_order_relaxed)
#define GET(field) atomic_load_explicit(&A.field, memory_order_relaxed)

/* ---- time and logging ----------------------------------------------------------------------- */




static const char *level_names[] = {"error", "warn", "info", "debug"};

/* A line that can repeat once a window (alog_repeat) is printed once a minute at most, with the
 * count of the repeats it stands for, and the counts not yet said are printed at the exit
 * (repeat.h): a duty cycle whose every window fails the same way says so once a minute, not once
 * a window. Other lines are events, each printed.
 * CUPTIMON_AGENT_LOG_REPEAT_MS sets the interval (0 prints every line). Guarded by log_mu, a
 * leaf lock. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static cm__repeat log_repeat = {.interval_ms = 60000};

static void say_line(const char *prefix, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say_line(const char *prefix, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cm__stderr_linev(prefix, fmt, ap);
  va_end(ap);
}

static void say_repeats(void *ud, const char *text, uint64_t n) {
  say_line(ud, "the line \"%s\" was repeated %" PRIu64 " more times since it was last printed",
           text, n);
}

static void alogv(bool repeats, int level, const char *fmt, va_list ap) {
  if (level > A.level) return;
  char prefix[64], body[1280];
  snprintf(prefix, sizeof prefix, "cuptimon-agent[%d]: %s: ", (int)getpid(),
           level_names[level < 0 ? 0 : level > 3 ? 3 : level]);
  vsnprintf(body, sizeof body, fmt, ap);
  if (!repeats) {
    say_line(prefix, "%s", body);
    return;
  }
  cm__repeat_verdict v;
  pthread_mutex_lock(&log_mu);
  cm__repeat_check(&log_repeat, body, cm__mono_ms(), &v);
  pthread_mutex_unlock(&log_mu);
  if (v.evicted) say_repeats(prefix, v.evicted_text, v.evicted);
  if (!v.print) return;
  if (v.repeats)
    say_line(prefix, "%s (repeated %" PRIu64 " more times since it was last printed)", body, v.repeats);
  else
    say_line(prefix, "%s", body);
}

/* Writes one line to stderr with a single write(2), so lines of several threads (and of several
 * processes sharing the terminal) do not interleave. Thread-safe; never allocates. */
void alog(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  alogv(false, level, fmt, ap);
  va_end(ap);
}

/* alog for a line that can come once a window, for as long as a run lasts (a refusal that
 * repeats): its repeats are counted and said once a minute at most (log_repeat). */
static void alog_repeat(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void alog_repeat(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  alogv(true, level, fmt, ap);
  va_end(ap);
}

/* Prints the repeats of every line that were counted and not yet said. Any thread. */
static void alog_drain_repeats(void) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "cuptimon-agent[%d]: %s: ", (int)getpid(), level_names[CM_LOG_WARN]);
  pthread_mutex_lock(&log_mu);
  cm__repeat_drain(&log_repeat, say_repeats, prefix);
  pthread_mutex_unlock(&log_mu);
}

/* The engine's log callback: the same stderr line, at the engine's level. */
static void engine_log(void *ud, int level, const char *msg) {
  (void)ud;
  alog(level, "engine: %s", msg);
}

static int parse_level(const char *s) {
  if (!s || !*s) return CM_LOG_WARN;
  for (int i = 0; i < 4; i++)
    if (strcmp(s, level_names[i]) == 0) return i;
  if (strcmp(s, "warning") == 0) return CM_LOG_WARN;
  return -1;
}

/* Sets the log threshold from CUPTIMON_AGENT_LOG; returns false when the value is not valid. */
static bool init_level(void) {
  int lvl = parse_level(getenv("CUPTIMON_AGENT_LOG"));
  A.level = lvl < 0 ? CM_LOG_WARN : lvl;
  return lvl >= 0;
}

/* Reads a positive integer environment variable; `def` when unset, with a warning when bad. */
static uint64_t env_u64(const char *name, uint64_t def, uint64_t max) {
  const char *s = getenv(name);
  if (!s || !*s) return def;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || !end || *end || v == 0 || v > max) {
    alog(CM_LOG_WARN, "%s=%s is not an integer in [1, %llu]; using %llu", name, s,
         (unsigned long long)max, (unsigned long long)def);
    return def;
  }
  return v;
}

/* ---- descriptor I/O ------------------------------------------------------------------------- */

/* Writes all of p[0..n). With deadline 0 it blocks (the sender, whose stalls the exit handler
 * ends by shutting the socket down); otherwise it polls and fails with ETIMEDOUT at the deadline.
 * Sockets use MSG_NOSIGNAL: a closed peer is EPIPE, never SIGPIPE. Returns 0 or an errno. */
static int write_all(int fd, bool sock, const uint8_t *p, size_t n, uint64_t deadline) {
  while (n) {
    if (deadline) {
      uint64_t now = cm__mono_ms();
      if (now >= deadline) return ETIMEDOUT;
      struct pollfd pf = {.fd = fd, .events = POLLOUT};
      int pr = poll(&pf, 1, (int)(deadline - now));
      if (pr < 0 && errno == EINTR) continue;
      if (pr < 0) return errno;
      if (pr == 0) return ETIMEDOUT;
    }
    ssize_t w = sock ? send(fd, p, n, MSG_NOSIGNAL | (deadline ? MSG_DONTWAIT : 0))
                     : write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* ---- the send queue ------------------------------------------------------------------------- */

static void free_frames(qframe *f) {
  while (f) {
    qframe *next = f->next;
    free(f->data);
    free(f);
    f = next;
  }
}

/* Counts a BATCH frame that will never be sent: as an exit loss once the exit deadline has
 * passed, as the agent's loss (full queue, failed connection) before. Any thread. */
static void count_dropped(uint64_t batches, uint64_t records) {
  if (!batches) return;
  INC(batches_dropped, batches);
  if (atomic_load(&A.cut))
    INC(records_dropped_exit, records);
  else
    INC(records_dropped_agent, records);
}

/* Appends f (filled in by the caller) to the queue. send_mu held. */
static void q_link_locked(qframe *f) {
  f->next = NULL;
  f->queued_ns = cm__mono_ms() * 1000000ull;
  if (A.tail)
    A.tail->next = f;
  else
    A.head = f;
  A.tail = f;
  A.q_bytes += f->len;
  A.q_frames++;
  if (f->batch) {
    A.q_batches++;
    A.q_records += f->records;
  }
  pthread_cond_signal(&A.q_cv);
}

/* Unlinks every queued frame (not the one the sender is writing) and returns the list; the
 * batches in it no longer count as queued. send_mu held. */
static qframe *q_take_all_locked(uint64_t *batches, uint64_t *records) {
  qframe *f = A.head;
  *batches = *records = 0;
  for (qframe *p = f; p; p = p->next) {
    A.q_bytes -= p->len;
    A.q_frames--;
    if (p->batch) {
      ++*batches;
      *records += p->records;
    }
  }
  A.q_batches -= *batches;
  A.q_records -= *records;
  A.head = A.tail = NULL;
  return f;
}

/* Queues a frame. It takes ownership of `data` (malloc'd). The queue's bounds are the caller's
 * decision: on_batch admits a BATCH before numbering and encoding it, and other frames are small
 * and always queued while the queue lives. A BATCH that cannot be queued (the queue died or
 * closed, no memory) is counted as dropped. Returns true when queued. Any thread; never blocks
 * beyond send_mu. */
static bool q_push(uint8_t *data, size_t len, bool batch, uint32_t records, bool bye) {
  qframe *f = malloc(sizeof *f);
  pthread_mutex_lock(&A.send_mu);
  if (!f || A.q_dead || A.q_closed) {
    pthread_mutex_unlock(&A.send_mu);
    if (batch) count_dropped(1, records);
    free(f);
    free(data);
    return false;
  }
  f->data = data;
  f->len = len;
  f->batch = batch;
  f->stats = false;
  f->bye = bye;
  f->records = records;
  q_link_locked(f);
  pthread_mutex_unlock(&A.send_mu);
  return true;
}

/* Hands the bytes of `b` to the queue and leaves `b` empty. */
static bool q_push_buf(cm_wire_buf *b, bool batch, uint32_t records) {
  uint8_t *data = b->data;
  size_t len = b->len;
  cm_wire_buf_init(b);
  return q_push(data, len, batch, records, false);
}

/* Queues the exit's BYE frame, as q_push_buf. */
static bool q_push_bye(cm_wire_buf *b) {
  uint8_t *data = b->data;
  size_t len = b->len;
  cm_wire_buf_init(b);
  return q_push(data, len, false, 0, true);
}

static void wake_control(void) {
  if (A.wake[1] >= 0) {
    char c = 1;
    ssize_t w = write(A.wake[1], &c, 1);
    (void)w;
  }
}

/* The monitor (or the capture file) is gone. The queue dies (its frames are freed and pushes are
 * refused), and the control thread is woken to switch tracing off. Any thread; idempotent. */
static void monitor_gone(const char *why) {
  if (atomic_exchange(&A.gone, true)) return;
  pthread_mutex_lock(&A.send_mu);
  A.q_dead = true;
  size_t nframes = A.q_frames;
  uint64_t batches, records;
  qframe *f = q_take_all_locked(&batches, &records);
  A.q_bytes = 0;
  A.q_frames = 0;
  pthread_cond_broadcast(&A.q_cv);
  pthread_cond_broadcast(&A.idle_cv);
  pthread_mutex_unlock(&A.send_mu);
  count_dropped(batches, records);
  free_frames(f);
  if (atomic_load(&A.exiting))
    alog(CM_LOG_DEBUG, "%s %s during exit", A.is_socket ? "monitor connection" : "capture", why);
  else if (cm__listen_mode())
    alog(CM_LOG_INFO, "the monitor detached (%s); %zu queued frames discarded", why, nframes);
  else
    alog(CM_LOG_WARN,
         "%s: %s; tracing off, the application continues (%zu queued frames discarded, %llu "
         "batches dropped in all)",
         A.is_socket ? "the monitor connection is lost" : "the capture file cannot be written",
         why, nframes, (unsigned long long)GET(batches_dropped));
  wake_control();
}

static void *sender_main(void *arg) {
  pthread_setname_np(pthread_self(), "cm-send");
  (void)arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  pthread_mutex_lock(&A.send_mu);
  for (;;) {
    while (!A.head && !A.q_dead && !A.sender_stop) pthread_cond_wait(&A.q_cv, &A.send_mu);
    if (A.q_dead) break;
    if (!A.head && A.sender_stop) {
      atomic_store(&A.sender_drained, true);
      break;
    }
    qframe *f = A.head;
    A.head = f->next;
    if (!A.head) A.tail = NULL;
    A.sending = true;
    pthread_mutex_unlock(&A.send_mu);

    int err = write_all(A.fd, A.is_socket, f->data, f->len, 0);
    if (!err) {
      INC(bytes_sent, f->len);
      INC(frames_sent, 1);
      if (f->batch) {
        INC(batches_sent, 1);
        INC(records_sent, f->records);
        uint64_t now = cm__mono_ms() * 1000000ull;
        uint64_t wait = now > f->queued_ns ? now - f->queued_ns : 0;
        atomic_store_explicit(&A.send_wait_ns, wait, memory_order_relaxed);
        if (wait > GET(send_wait_peak_ns))
          atomic_store_explicit(&A.send_wait_peak_ns, wait, memory_order_relaxed);
      }
    } else if (f->batch) {
      count_dropped(1, f->records);
    }
    /* BYE written whole: the monitor has the process's end, whatever happens to the connection
     * next. The monitor closes it once it has read BYE, and the control thread may then mark
     * the queue dead before this thread looks at it again; the exit's account goes by this. */
    if (!err && f->bye) atomic_store(&A.sender_drained, true);
    size_t len = f->len;
    bool f_batch = f->batch;
    uint32_t f_records = f->records;
    free(f->data);
    free(f);

    pthread_mutex_lock(&A.send_mu);
    A.sending = false;
    if (!A.q_dead) {
      A.q_bytes -= len;
      A.q_frames--;
    }
    if (err && f_batch) {
      A.q_batches--;
      A.q_records -= f_records;
    }
    if (!A.head) pthread_cond_broadcast(&A.idle_cv);
    if (err) {
      pthread_mutex_unlock(&A.send_mu);
      char why[128];
      snprintf(why, sizeof why, "write failed: %s", strerror(err));
      monitor_gone(why);
      pthread_mutex_lock(&A.send_mu);
      break;
    }
  }
  pthread_cond_broadcast(&A.idle_cv);
  pthread_mutex_unlock(&A.send_mu);
  return NULL;
}

/* ---- frames the agent writes ---------------------------------------------------------------- */

/* Fills kv with the STATS counters: the engine's (from st) and the agent's. send_mu held, so that
 * records_queued and batches_queued describe exactly the BATCH frames queued ahead of this STATS
 * frame: a monitor that has received fewer knows that the difference was lost on the way. */
static uint32_t stats_items_locked(const cm_stats *stp, cm_wire_kv *kv) {
  cm_stats st = *stp;
  st.buffers_allocated -= A.base.buffers_allocated;
  st.buffers_decoded -= A.base.buffers_decoded;
  st.buffers_refused -= A.base.buffers_refused;
  st.records_decoded -= A.base.records_decoded;
  st.records_delivered -= A.base.records_delivered;
  st.records_dropped -= A.base.records_dropped;
  st.fence_timeouts -= A.base.fence_timeouts;
  uint32_t n = 0;
#define KV(nm, v) kv[n++] = (cm_wire_kv){.name = nm, .value = (v)}
  KV("buffers_allocated", st.buffers_allocated);
  KV("buffers_outstanding", st.buffers_outstanding);
  KV("buffers_free", st.buffers_free);
  KV("buffers_decoded", st.buffers_decoded);
  KV("buffers_refused", st.buffers_refused);
  KV("records_decoded", st.records_decoded);
  KV("records_delivered", st.records_delivered);
  KV("records_dropped", st.records_dropped);
  KV("fence_timeouts", st.fence_timeouts);
  KV("batches_sent", GET(batches_sent));
  KV("batches_dropped", GET(batches_dropped));
  KV("records_sent", GET(records_sent));
  KV("records_dropped_agent", GET(records_dropped_agent));
  KV("records_dropped_exit", GET(records_dropped_exit));
  KV("records_queued", A.q_records);
  KV("batches_queued", A.q_batches);
  KV("strings_sent", GET(strings_sent));
  KV("bytes_sent", GET(bytes_sent));
  KV("selects_applied", GET(selects_applied));
  KV("select_last_ns", GET(select_last_ns));
  KV("select_prev_ns", GET(select_prev_ns));
  KV("selects_failed", GET(selects_failed));
  KV("exit_tail_unknown", atomic_load(&A.tail_unknown) ? 1 : 0);
  KV("lag_cupti_ns", st.lag_cupti_ns);
  KV("lag_decode_ns", st.lag_decode_ns);
  KV("lag_decode_peak_ns", st.lag_decode_peak_ns);
  KV("decode_wait_ns", st.decode_wait_ns);
  KV("send_wait_ns", GET(send_wait_ns));
  KV("send_wait_peak_ns", GET(send_wait_peak_ns));
  KV("guard_shed", GET(guard_shed));
  KV("guard_sheds", GET(guard_sheds));
  KV("guard_lag_ns", GET(guard_lag_ns));
  KV("guard_limit_ns", A.guard.limit_ns);
  KV("guard_buffers_limit", A.guard.buffers_limit);
  KV("cupti_buffers", A.eng ? cm__engine_cupti_buffers(A.eng) : 0);
  KV("lag_held_ns", GET(guard_held_ns));
  KV("cupti_detaches", st.cupti_detaches);
  KV("cupti_detach_ns", st.cupti_detach_ns);
  KV("cupti_attach_ns", st.cupti_attach_ns);
  KV("cupti_idle_mode", (uint64_t)atomic_load(&A.idle_mode));
  KV("kind_changes", st.kind_changes);
  KV("kind_change_ns", st.kind_change_ns);
  KV("kind_change_max_ns", st.kind_change_max_ns);
  /* PM sampling's counters (wire 1.2); pm_overflows and pm_dropped are samples lost. The engine's
   * PM lock is a leaf, so it may be taken under send_mu. */
  cm_pm_stats pm;
  memset(&pm, 0, sizeof pm);
  if (A.eng) cm_pm_stats_get(A.eng, &pm);
  KV("pm_samples", pm.samples);
  KV("pm_filtered", pm.filtered);
  KV("pm_overflows", pm.overflows);
  KV("pm_dropped", pm.dropped);
#undef KV
  return n;
}

/* Encodes a STATS frame and links it to the queue. send_mu held, and the queue alive; `st` holds
 * the engine's counters, which the caller read without send_mu (the engine's locks come first). */
static void q_link_stats_locked(const cm_stats *st) {
  cm_wire_kv kv[56]; /* stats_items_locked writes at most 46 */
  uint32_t n = stats_items_locked(st, kv);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  qframe *f = malloc(sizeof *f);
  if (f && cm_wire_write_stats(&b, kv, n) == 0) {
    f->data = b.data;
    f->len = b.len;
    f->batch = false;
    f->stats = true;
    f->bye = false;
    f->records = 0;
    q_link_locked(f);
  } else {
    free(f);
    cm_wire_buf_free(&b);
  }
}

static void push_stats(void) {
  cm_stats st;
  memset(&st, 0, sizeof st);
  if (A.eng) cm_stats_get(A.eng, &st);
  pthread_mutex_lock(&A.send_mu);
  if (!A.q_dead && !A.q_closed) q_link_stats_locked(&st);
  pthread_mutex_unlock(&A.send_mu);
}

/* Queues STRINGS frames for every id interned since the last call. Ids are dense and interned in
 * order, so "not sent before" is everything from the high-water mark up; sending them ahead of
 * the batch that first uses them satisfies the wire rule. Callback state: on_batch only. */
static void push_new_strings(void) {
  uint32_t count = cm_string_count(A.eng);
  if (A.cb_strings_sent == 0) A.cb_strings_sent = 1; /* id 0 is the empty string, never sent */
  while (A.cb_strings_sent < count) {
    uint32_t first = A.cb_strings_sent, n = 0;
    size_t bytes = 0;
    cm_wire_string *ents = malloc((size_t)(count - first) * sizeof *ents);
    if (!ents) return; /* tried again before the next batch */
    for (uint32_t id = first; id < count && bytes < MAX_STRINGS_FRAME && n < (1u << 20); id++) {
      size_t len = 0;
      const char *s = cm_string(A.eng, id, &len);
      ents[n++] = (cm_wire_string){.id = id, .len = (uint32_t)len, .bytes = s ? s : ""};
      if (!s) ents[n - 1].len = 0;
      bytes += len + 16;
    }
    cm_wire_buf b;
    cm_wire_buf_init(&b);
    int rc = cm_wire_write_strings(&b, ents, n);
    free(ents);
    if (rc) {
      cm_wire_buf_free(&b);
      return;
    }
    q_push_buf(&b, false, 0);
    A.cb_strings_sent = first + n;
    INC(strings_sent, n);
  }
}

/* The observer. It runs on the engine's decode worker or on a flushing thread, serialized by the
 * engine. Two observers are registered for a moment while a SELECT swaps them (the new one is
 * added before the old one goes, so unchanged kinds are never toggled); both then receive the
 * same drain, the newest first (the engine's order). The generation rule sends each (drain, kind)
 * once, from the newest observer, whose columns are the ones the monitor asked for: an observer
 * older than the newest one seen is retired, and a repeat of the (seq, kind) just sent is
 * skipped. */
static void on_batch(void *ud, const cm_batch *b) {
  /* While one observer replaces another (apply_selection adds the new one first), the engine
   * hands a drain's batch of a kind both select to the new observer and then to the old one:
   * the second is the same records, skipped here by its seq. A kind only the old observer selects
   * (one the new selection turns off) reaches the old observer alone, and is forwarded: those are
   * the records written before the kind was turned off. Skipping every batch of an older
   * observer once the newer one has received one would lose them silently. */
  (void)ud;
  if (b->seq == A.cb_last_seq && b->kind == A.cb_last_kind) return;
  A.cb_last_seq = b->seq;
  A.cb_last_kind = b->kind;
  if (atomic_load_explicit(&A.gone, memory_order_relaxed) || b->n == 0) return;

  bool has_str = false;
  size_t row_bytes = 0;
  for (uint32_t c = 0; c < b->ncols; c++) {
    if (b->cols[c].type == CM_TYPE_STR) has_str = true;
    row_bytes += b->cols[c].width;
  }
  if (has_str) push_new_strings();

  /* A large drain is split into frames of at most MAX_BATCH_FRAME bytes (and a quarter of the
   * queue's bound, so that a small queue still admits whole frames); they share the drain's seq.
   * Each piece is its own BATCH with the same columns. */
  pthread_mutex_lock(&A.send_mu);
  size_t frame_cap = A.max_bytes / 4 < MAX_BATCH_FRAME ? A.max_bytes / 4 : MAX_BATCH_FRAME;
  pthread_mutex_unlock(&A.send_mu);
  uint32_t rows = row_bytes ? (uint32_t)(frame_cap / row_bytes) : b->n;
  if (rows == 0) rows = 1;
  cm_column cols[CM_WIRE_MAX_COLS];
  uint32_t ncols = b->ncols > CM_WIRE_MAX_COLS ? CM_WIRE_MAX_COLS : b->ncols;
  for (uint32_t at = 0; at < b->n; at += rows) {
    uint32_t n = b->n - at < rows ? b->n - at : rows;
    size_t est = 48 + 24 * (size_t)ncols + row_bytes * n + 8 * (size_t)ncols;
    /* The admission decision: only this callback queues batches (the engine serializes it),
     * and est bounds the encoded size, so an admitted frame is queued unless the queue dies or
     * closes meanwhile; the small frames of other threads may overshoot the bound a little. */
    pthread_mutex_lock(&A.send_mu);
    bool full = A.q_bytes + est > A.max_bytes || A.q_frames + 1 > A.max_frames;
    pthread_mutex_unlock(&A.send_mu);
    if (full) {
      count_dropped(1, n);
      continue;
    }
    /* Numbered once admitted, so the numbers of the queued frames have no gaps (0 is skipped
     * when they wrap: it means "not numbered"). */
    if (++A.cb_number == 0) A.cb_number = 1;
    for (uint32_t c = 0; c < ncols; c++) {
      cols[c] = b->cols[c];
      cols[c].data = (const uint8_t *)b->cols[c].data + (size_t)at * b->cols[c].width;
    }
    cm_batch piece = {.kind = b->kind, .n = n, .ncols = ncols, .cols = cols, .seq = b->seq};
    if (cm_wire_write_batch_numbered(&A.cb_buf, &piece, A.cb_number) != 0) {
      cm_wire_buf_clear(&A.cb_buf);
      count_dropped(1, n);
      continue;
    }
    q_push_buf(&A.cb_buf, true, n);
  }
  /* While records flow, STATS goes out once a second too, so the monitor sees the lag and the
   * backlog live, not only at flushes and at exit. */
  uint64_t now = cm__mono_ms();
  if (now - A.cb_stats_ms >= 1000) {
    A.cb_stats_ms = now;
    push_stats();
  }
}

/* ---- the handshake's frames ----------------------------------------------------------------- */

/* Reads /proc/self/cmdline into a NUL-separated block and an argv array (both malloc'd). */
static uint32_t read_cmdline(char **block, const char ***argv) {
  *block = NULL;
  *argv = NULL;
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    if (len == cap) {
      char *p = realloc(buf, cap * 2 + 1);
      if (!p) break;
      buf = p;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    len += (size_t)r;
  }
  close(fd);
  if (!buf) return 0;
  buf[len] = '\0';
  uint32_t argc = 0;
  for (size_t i = 0; i < len; i++)
    if (buf[i] == '\0') argc++;
  if (len && buf[len - 1] != '\0') argc++;
  if (argc > 65536) argc = 65536;
  const char **av = calloc(argc ? argc : 1, sizeof *av);
  if (!av) {
    free(buf);
    return 0;
  }
  size_t p = 0;
  for (uint32_t i = 0; i < argc && p <= len; i++) {
    av[i] = buf + p;
    p += strlen(buf + p) + 1;
  }
  *block = buf;
  *argv = av;
  return argc;
}

/* The environment variables HELLO carries: a distributed job's place of the process (torchrun,
 * torch.distributed and most launchers set them), so a script can name ranks. A value longer
 * than ENV_VALUE_MAX bytes is not sent. */
static const char *const hello_env_names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"};
enum { ENV_VALUE_MAX = 64, NENV = sizeof hello_env_names / sizeof hello_env_names[0] };

/* Fills `store` with "NAME=VALUE" strings of the names set, `list` with pointers to them; returns
 * how many. */
static uint32_t hello_env(char store[][32 + ENV_VALUE_MAX], const char **list) {
  uint32_t n = 0;
  for (size_t i = 0; i < NENV; i++) {
    const char *v = getenv(hello_env_names[i]);
    if (!v || strlen(v) > ENV_VALUE_MAX) continue;
    snprintf(store[n], sizeof store[n], "%s=%s", hello_env_names[i], v);
    list[n] = store[n];
    n++;
  }
  return n;
}

/* Appends HELLO (with `token`) and SCHEMA to `b`. */
static int write_hello_schema(cm_wire_buf *b, const char *token) {
  cm_session_info si;
  memset(&si, 0, sizeof si);
  if (A.eng) cm_session_info_get(A.eng, &si);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  char exe[4096] = "";
  ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[el > 0 ? el : 0] = '\0';
  char *block;
  const char **argv;
  uint32_t argc = read_cmdline(&block, &argv);
  char env_store[NENV][32 + ENV_VALUE_MAX];
  const char *env[NENV];
  uint32_t nenv = hello_env(env_store, env);
  uint64_t t0 = cm__realtime_ns();
  uint64_t t1 = cm__realtime_ns();
  cm_wire_hello h = {
      .pid = (uint32_t)getpid(),
      .ppid = (uint32_t)getppid(),
      .cupti_version = si.cupti_version,
      .clock_realtime_ns = t0 + (t1 - t0) / 2,
      /* The engine measured cuptiGetTimestamp against CLOCK_REALTIME at its start. */
      .clock_cupti_ns = (uint64_t)((int64_t)(t0 + (t1 - t0) / 2) + si.clock_offset_ns),
      .token = token ? token : "",
      .host = host,
      .exe = exe,
      .argc = argc,
      .argv = argv,
      .ndevices = 0, /* devices are not queried inside cuInit; DEVICE records carry them */
      .devices = NULL,
      .nenv = nenv,
      .env = env,
  };
  int rc = cm_wire_write_hello(b, &h);
  free(argv);
  free(block);
  if (rc) return rc;

  int nk = cm_kind_count();
  cm_wire_kind *kinds = calloc((size_t)(nk > 0 ? nk : 1), sizeof *kinds);
  cm_wire_field *fields = calloc((size_t)(nk > 0 ? nk : 1) * CM_WIRE_MAX_COLS, sizeof *fields);
  if (!kinds || !fields) {
    free(kinds);
    free(fields);
    return CM_ENOMEM;
  }
  uint32_t nout = 0;
  for (int i = 0; i < nk; i++) {
    int k = cm_kind_at(i);
    int nf = cm_field_count(k);
    if (nf <= 0) continue;
    if (nf > CM_WIRE_MAX_COLS) nf = CM_WIRE_MAX_COLS;
    cm_wire_field *fs = &fields[(size_t)nout * CM_WIRE_MAX_COLS];
    uint32_t m = 0;
    for (int f = 0; f < nf; f++) {
      cm_field_info fi;
      if (cm_field_info_get(k, f, &fi) != 0) continue;
      fs[m++] = (cm_wire_field){.id = (uint32_t)fi.id, .type = (uint32_t)fi.type,
                                .width = fi.width, .name = fi.name};
    }
    kinds[nout++] = (cm_wire_kind){.kind = (uint32_t)k, .nfields = m, .name = cm_kind_name(k),
                                   .fields = fs};
  }
  cm_wire_schema s = {.nkinds = nout, .kinds = kinds};
  rc = cm_wire_write_schema(b, &s);
  free(kinds);
  free(fields);
  return rc;
}

/* ---- selection and configuration ------------------------------------------------------------ */

/* Logs one name that the lenient parse of CUPTIMON_SELECT (or the default selection) left out. */
static void on_select_skip(void *ud, size_t offset, const char *message) {
  (void)offset;
  alog(CM_LOG_WARN, "%s: left out: %s", (const char *)ud, message);
}

static bool selection_empty(const cm_selection *sel) {
  for (int k = 0; k < CM_KIND_MAX; k++)
    if (cm_selection_count(sel, k)) return false;
  return true;
}

/* Set once InitializeInjectionNvtx2 has handed NVTX to CUPTI: NVTX calls then enter CUPTI, which a
 * detach would leave them calling. */
static atomic_bool g_nvtx_injected;

/* What the agent leaves CUPTI in while nothing is traced (STATS cupti_idle_mode; the monitor's
 * duty footer names it for each process). */
enum {
  CM_IDLE_DETACH = 1,        /* detached (cuptiFinalize) between windows: the default */
  CM_IDLE_SETTING = 2,       /* attached, as CUPTIMON_DETACH_IDLE=0 asks */
  CM_IDLE_SLOW_ATTACH = 3,   /* attached for good: attaching again outlasted the attach's wait */
  CM_IDLE_NVTX = 4,          /* attached for good: NVTX calls enter CUPTI */
  CM_IDLE_CANNOT = 5,        /* attached for good: no cuptiFinalize, or PM sampling used */
  CM_IDLE_SLOW_FINALIZE = 6, /* attached for good: a cuptiFinalize outlasted its deadline */
  CM_IDLE_BUSY = 7,          /* attached for now: too many threads were calling CUDA at once */
};

/* CUPTI is detached (cm_cupti_detach) each time nothing is traced any more: between a duty
 * cycle's windows, and once a monitor has gone. Once CUPTI has traced, a launch stays dearer with
 * every kind off than before CUPTI attached, and only cuptiFinalize gives that back
 * (bench/RESULTS.md, "CUPTI states"); the next SELECT attaches it again. Two things make a
 * process stay attached for good instead, at the cost of that residue, so that it is never left
 * unable to trace: an attach that outlasted its wait (a process whose threads launch without
 * pause can keep cuptiSubscribe from returning: apply_selection) and a cuptiFinalize that
 * outlasted its deadline. Nor is CUPTI detached before two windows have traced on the
 * subscription made at start-up, when no application thread could hold it. A refusal between
 * windows is said and changes nothing: the next idle period tries again, except where it never
 * can (no cuptiFinalize, PM sampling used, NVTX injected). Once the monitor has gone there is no
 * next idle period, so a refusal for now (CUPTI still delivering, a buffer it holds, a graph
 * capture in progress) is retried for LEAVE_RETRY_MS, and one that outlasts that is said as a
 * warning. Control thread, or the listener's between sessions. */
static void idle_mode_set(int mode, const char *why) {
  if (atomic_load(&A.idle_mode) == mode) return;
  atomic_store(&A.idle_mode, mode);
  if (mode != CM_IDLE_DETACH && why)
    alog(CM_LOG_INFO, "CUPTI stays attached while nothing is traced, from now on: %s (a launch "
                      "costs more between windows; CUPTIMON_DETACH_IDLE in docs/agent.md)", why);
}

static void detach_idle(bool leaving) {
  int mode = atomic_load(&A.idle_mode);
  if (atomic_load(&A.exiting) || !A.eng || cm_cupti_detached(A.eng)) return;
  if (mode == CM_IDLE_SETTING || mode == CM_IDLE_NVTX || mode == CM_IDLE_CANNOT) return;
  /* Between windows, the first detach waits for two windows traced on the subscription made at
   * start-up: should attaching again never return in this process, its estimates still rest on
   * two windows, enough for an interval. A process that stays attached for good does so only
   * while a monitor traces it: once the monitor has gone it is detached, as an idle one is. */
  if (!leaving && ((mode != CM_IDLE_DETACH && mode != CM_IDLE_BUSY) || A.traced_selects < 2)) return;
  if (atomic_load(&g_nvtx_injected)) {
    idle_mode_set(CM_IDLE_NVTX, "NVTX is injected into CUPTI, whose calls a detach would break");
    return;
  }
  /* A second bounds the flushes: CUPTI that is still delivering then is behind, and stays. When
   * the monitor has gone, the probe of the threads is skipped: no window needs CUPTI back soon,
   * and a monitor that comes later waits for its subscription as long as it takes. */
  if (leaving) cm__engine_set_detach_max_threads(A.eng, 0);
  int rc = cm_cupti_detach(A.eng, 1000);
  for (uint64_t end = cm__mono_ms() + LEAVE_RETRY_MS;
       leaving && (rc == CM_EAGAIN || rc == CM_EBUSY) && !atomic_load(&A.exiting) &&
       cm__mono_ms() < end;) {
    struct timespec pause = {0, 100 * 1000000L};
    nanosleep(&pause, NULL);
    rc = cm_cupti_detach(A.eng, 1000);
  }
  if (leaving) cm__engine_set_detach_max_threads(A.eng, (int)A.detach_max_threads);
  if (leaving && rc != 0 && rc != CM_ETIMEDOUT && rc != CM_ENOSYS)
    alog(CM_LOG_WARN, "CUPTI stays attached after the monitor left (a launch costs more until a "
                      "monitor comes and goes again): %s", cm_errmsg());
  if (rc == 0) {
    if (mode == CM_IDLE_BUSY) atomic_store(&A.idle_mode, CM_IDLE_DETACH);
    return;
  }
  if (rc == CM_ETIMEDOUT && cm__engine_finalizing(A.eng)) {
    /* cuptiFinalize blocks (CUPTI waits for the application's threads): it goes on in its own
     * thread, and the selections that need CUPTI fail, and say why, until it returns; after
     * that CUPTI attaches again and stays. */
    alog(CM_LOG_WARN, "detaching CUPTI while idle: %s", cm_errmsg());
    if (!leaving) idle_mode_set(CM_IDLE_SLOW_FINALIZE, "cuptiFinalize did not return by its deadline");
    return;
  }
  if (rc == CM_ENOSYS) {
    idle_mode_set(CM_IDLE_CANNOT, cm_errmsg());
    return;
  }
  if (rc == CM_EBUSY && cm__engine_probe_busy_threads(A.eng) > 0) {
    /* Too many threads call CUDA for CUPTI to attach again: attached for this period, and the
     * next idle period probes again. */
    atomic_store(&A.idle_mode, CM_IDLE_BUSY);
    alog_repeat(CM_LOG_INFO, "detaching CUPTI while idle: %s", cm_errmsg());
    return;
  }
  alog_repeat(CM_LOG_INFO, "detaching CUPTI while idle: CUPTI stays attached for now: %s", cm_errmsg());
}

/* While nothing is traced (no observer, no PM consumer: a duty cycle between its windows, or a
 * monitor that selects nothing) the engine runs as a dormant agent's does: no flush or delivery
 * cadence, so its worker sleeps and makes no CUPTI call, and the pool's free buffers are freed.
 * The configured cadence (A.cfg) returns with the next observer. Control thread (or the
 * listener's between sessions). */
static void cadence_sync(void) {
  if (!A.eng) return;
  bool idle = A.nobs == 0 && A.npm == 0 && A.npm_wait == 0;
  if (idle == A.cadence_idle) return;
  cm_config c = A.cfg;
  if (idle) c.self_flush_ms = c.deliver_ms = 0;
  if (cm_configure(A.eng, &c) == 0) A.cadence_idle = idle;
  if (idle) {
    cm__engine_trim(A.eng);
    detach_idle(false);
  }
}

/* Replaces the agent's observer with one for `sel` (NULL or empty: tracing stops). The new
 * observer is registered before the old one goes, so kinds in both are never toggled. Control
 * thread (or init thread before it starts). */
static int apply_selection(const cm_selection *sel) {
  int rc = 0;
  int old_n = A.nobs;
  uint32_t old_ids[MAX_OBSERVERS];
  memcpy(old_ids, A.obs_ids, sizeof old_ids);
  uint64_t before = cm__realtime_ns();
  if (sel && !selection_empty(sel)) {
    uint32_t id = 0;
    rc = cm_observe(A.eng, sel, on_batch, NULL, &id);
    if (rc) {
      alog_repeat(CM_LOG_ERROR, "cannot apply the selection: %s: %s (the previous one stays)",
                  cm_err_name(rc), cm_errmsg());
      INC(selects_failed, 1);
      /* An attach that outlasted its wait: this process's threads can hold cuptiSubscribe, so
       * once it has returned CUPTI is not detached again. */
      if (rc == CM_EAGAIN && A.eng && cm_cupti_detached(A.eng) &&
          atomic_load(&A.idle_mode) == CM_IDLE_DETACH)
        idle_mode_set(CM_IDLE_SLOW_ATTACH, "attaching CUPTI again took longer than its wait");
      return rc;
    }
    A.traced_selects++;
    A.obs_ids[0] = id;
    A.nobs = 1;
    atomic_store(&A.tracing, true);
  } else {
    A.nobs = 0;
    atomic_store(&A.tracing, false);
  }
  /* The edge of a window (select_prev_ns, select_last_ns): now, between enabling the new kinds and
   * disabling the old. Where this call enabled a kind, the edge is the moment it began to: a
   * launching thread that cuptiActivityEnable held meanwhile launches the work it was held from
   * once it returns, traced, so that time belongs to the window. The closing edge needs no such
   * care: the disable comes after it, and what it holds back runs untraced. */
  uint64_t stamp = cm__realtime_ns();
  if (A.nobs && A.eng) {
    uint64_t en = cm__engine_enable_start_ns(A.eng);
    if (en >= before && en < stamp) stamp = en;
  }
  for (int i = 0; i < old_n; i++) {
    int urc = cm_unobserve(A.eng, old_ids[i]);
    if (urc) alog(CM_LOG_WARN, "cm_unobserve(%u): %s", old_ids[i], cm_errmsg());
  }
  atomic_store(&A.select_prev_ns, GET(select_last_ns));
  atomic_store(&A.select_last_ns, stamp);
  INC(selects_applied, 1);
  cadence_sync();
  return rc;
}

/* The lag guard. CUPTI can fall behind the launches for good: over a long run at a high launch
 * rate its own worker thread grows to a whole core, and the records it holds then grow the process
 * without bound (bench/RESULTS.md, "Memory under a long run"). Nothing the agent does downstream of
 * CUPTI bounds that memory: only tracing less does. Every check (a tenth of the limit, 20 ms to
 * 1 s) on which a buffer was decoded since the last, the guard measures how long CUPTI held records
 * back (cm__engine_take_lag_held_max: from a record's timestamp to CUPTI asking for the buffer it
 * then wrote the record into, for the kind most behind in a buffer, the largest over the buffers
 * decoded since the last check; a record waiting in a partly filled buffer does not count), and
 * guard.h's policy decides: over CUPTIMON_GUARD_LAG_MS (default 500; 0 turns the guard off) for
 * 3 checks in a row, CUPTI stops writing one group of kinds for the rest of the session (the API
 * records, then every other kind but kernels, then kernels), and a further step comes one limit
 * later at the earliest, and only if CUPTI is no less behind than at the last. The observer keeps
 * its selection (cm__engine_set_suppressed), so the records CUPTI had already written still
 * arrive, are sent, and the exit's fence still waits for them: nothing traced is dropped by the
 * shed. It never turns a kind back on: turning kinds off and on again under load makes CUPTI
 * fall further behind. Each step is logged, and STATS carries the kinds shed
 * (guard_shed), so the monitor says so. Control thread. */
static bool guard_armed(void) {
  return A.guard.limit_ns && A.eng && A.nobs > 0 && !atomic_load(&A.exiting) &&
         (cm__engine_enabled(A.eng) & ~A.guard.shed & cm__guard_cupti_kinds());
}

static void guard_tick(void) {
  if (!guard_armed()) return;
  uint64_t now = cm__mono_ms();
  if (now < A.guard_next_ms) return;
  A.guard_next_ms = now + cm__guard_interval_ms(&A.guard);
  cm_stats st;
  memset(&st, 0, sizeof st);
  cm_stats_get(A.eng, &st);
  bool fresh = st.buffers_decoded != A.guard_decoded;
  A.guard_decoded = st.buffers_decoded;
  uint64_t lag = cm__engine_take_lag_held_max(A.eng);
  uint64_t bufs = cm__engine_cupti_buffers(A.eng);
  /* No buffer decoded since the last check: no new measure of the time CUPTI held records, and
   * nothing to judge unless CUPTI holds too many buffers (which is also how CUPTI looks when it
   * completes none). */
  if (!fresh && !(A.guard.buffers_limit && bufs > A.guard.buffers_limit)) return;
  if (fresh) atomic_store(&A.guard_held_ns, lag);
  uint64_t shed = A.guard.shed, wanted = cm__engine_enabled(A.eng);
  uint64_t add = cm__guard_check(&A.guard, now, lag, bufs, wanted);
  if (!add) return;
  /* How far behind CUPTI is: the time it held records, or, when it is its buffers that it holds,
   * the stage lag to their completion. */
  uint64_t behind = lag > st.lag_cupti_ns ? lag : st.lag_cupti_ns;
  char names[512];
  size_t len = 0;
  names[0] = 0;
  for (int k = 0; k < CM_KIND_MAX; k++) {
    if (!(add >> k & 1) || len >= sizeof names) continue;
    const char *nm = cm_kind_name(k);
    int w = snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", nm ? nm : "?");
    if (w > 0) len += (size_t)w;
  }
  atomic_store(&A.guard_shed, A.guard.shed);
  atomic_store(&A.guard_lag_ns, behind);
  INC(guard_sheds, 1);
  bool last = (wanted & ~A.guard.shed & cm__guard_cupti_kinds()) == 0;
  alog(CM_LOG_WARN, "CUPTI is %.1f s behind the application: it held records %.1f s before "
       "writing them (CUPTIMON_GUARD_LAG_MS=%llu) and holds %llu activity buffers "
       "(CUPTIMON_GUARD_BUFFERS=%llu), over a limit for %d checks in a row%s: tracing of %s stops "
       "for the rest of the session%s, so that what CUPTI holds stops growing",
       (double)behind / 1e9, (double)lag / 1e9, (unsigned long long)(A.guard.limit_ns / 1000000),
       (unsigned long long)bufs, (unsigned long long)A.guard.buffers_limit, CM_GUARD_CHECKS,
       shed ? ", and no less behind than at the last step" : "", names,
       last ? " (nothing is traced any more; CUPTI's partly filled buffers are flushed now)" : "");
  int rc = cm__engine_set_suppressed(A.eng, A.guard.shed);
  if (rc) alog(CM_LOG_ERROR, "the lag guard could not change the traced kinds: %s: %s",
               cm_err_name(rc), cm_errmsg());
  /* With nothing traced any more, CUPTI fills no buffer further: the records in its partly filled
   * ones would wait for the exit's fence, however long the run goes on.
   * One forced flush, on the decode worker, delivers them now. */
  if (last && !rc) cm__engine_flush_forced_async(A.eng);
  push_stats(); /* the monitor learns it now, not at the next batch */
}

/* The monitor has gone: nothing is traced, and CUPTI is detached whatever the duty cycle's rules
 * kept (detach_idle), so that the process pays nothing for the monitor that left. */
static void tracing_off(void) {
  if (A.nobs > 0) {
    apply_selection(NULL);
    alog(CM_LOG_INFO, "tracing is off");
  }
  detach_idle(true);
}

/* ---- the control frames' effects (control.c applies the frames) ----------------------------- */

static int ops_select(void *ud, const cm_selection *sel) {
  (void)ud;
  return apply_selection(sel);
}

static int ops_configure(void *ud, const cm_config *cfg) {
  (void)ud;
  cm_config c = *cfg;
  if (A.cadence_idle) c.self_flush_ms = c.deliver_ms = 0; /* until something is traced */
  int rc = cm_configure(A.eng, &c);
  if (rc == 0) A.cfg = *cfg;
  return rc;
}

static void ops_queue_bytes(void *ud, uint64_t bytes) {
  (void)ud;
  pthread_mutex_lock(&A.send_mu);
  A.max_bytes = (size_t)bytes;
  pthread_mutex_unlock(&A.send_mu);
}

/* A FLUSH that arrives while the process exits is answered at once: the exit fence owns the
 * engine then, and the monitor learns the state from the status. */
static int ops_flush(void *ud, int mode, uint32_t timeout_ms) {
  (void)ud;
  if (atomic_load(&A.exiting)) return CM_ESTATE;
  int rc = cm_flush(A.eng, mode, timeout_ms);
  /* A fence while nothing is traced (a duty cycle's) used buffers for its sync records: they go
   * too, so the STATS that follows shows the idle state. */
  if (A.cadence_idle) cm__engine_trim(A.eng);
  return rc;
}

/* The batches the flush delivered are queued already; a STATS frame tells the monitor about
 * drops at the same point, then FLUSH_DONE closes the window. */
static void ops_flush_done(void *ud, uint64_t id, int32_t status) {
  (void)ud;
  push_stats();
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  if (cm_wire_write_flush_done(&b, id, status) == 0) q_push_buf(&b, false, 0);
  cm_wire_buf_free(&b);
}

static void ops_log(void *ud, int level, const char *msg) {
  (void)ud;
  alog(level, "%s", msg);
}

/* An entry whose device is not ready (CM_EAGAIN: the driver still initializing, or no CUDA
 * context on the device yet, and CUPTI's PM sampling needs one) waits for it: the control thread
 * tries it again every PM_RETRY_MS between frames, never blocking on it, and answers its
 * PM_STATUS once it starts, fails otherwise, or PM_READY_MS pass. */
#define PM_READY_MS 60000
#define PM_RETRY_MS 50

/* Starts one entry's consumer; its id joins A.pm_ids. Control thread. */
static int pm_try(const cm__pm_entry *en) {
  uint32_t id = 0;
  int rc = cm_pm_sample_add(A.eng, en->device, en->metrics, en->nmetrics, en->interval_us, &id);
  if (rc == 0) A.pm_ids[A.npm++] = id;
  return rc;
}

/* Answers one entry with PM_STATUS (and logs a failure); `msg` overrides cm_errmsg(). */
static void pm_answer(int rc, int device, const char *msg) {
  const char *text = rc ? (msg ? msg : cm_errmsg()) : "";
  if (rc) alog(CM_LOG_ERROR, "PM sampling on device %d: %s", device, text);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  if (cm_wire_write_pm_status(&b, rc, (uint32_t)device, text) == 0) q_push_buf(&b, false, 0);
  cm_wire_buf_free(&b);
}

/* Keeps a copy of `en` (its names included) among the waiting entries; false without memory. */
static bool pm_wait_add(const cm__pm_entry *en) {
  size_t len = 1;
  for (uint32_t i = 0; i < en->nmetrics; i++) len += strlen(en->metrics[i]) + 1;
  struct pm_wait *w = &A.pm_wait[A.npm_wait];
  w->names = malloc(len);
  if (!w->names) return false;
  w->e = *en;
  char *p = w->names;
  for (uint32_t i = 0; i < en->nmetrics; i++) {
    size_t l = strlen(en->metrics[i]) + 1;
    memcpy(p, en->metrics[i], l);
    w->e.metrics[i] = p;
    p += l;
  }
  A.npm_wait++;
  return true;
}

static void pm_wait_clear(void) {
  for (uint32_t i = 0; i < A.npm_wait; i++) free(A.pm_wait[i].names);
  A.npm_wait = 0;
}

/* Tries the waiting entries again; those that start or fail are answered, and past
 * pm_wait_end (or at exit) the rest fail with what the engine said. Control thread. */
static void pm_retry(void) {
  if (!A.npm_wait) return;
  bool late = cm__mono_ms() >= A.pm_wait_end || atomic_load(&A.exiting);
  uint32_t k = 0;
  for (uint32_t i = 0; i < A.npm_wait; i++) {
    struct pm_wait w = A.pm_wait[i];
    int rc = pm_try(&w.e);
    if (rc == CM_EAGAIN && !late) {
      A.pm_wait[k++] = w;
      continue;
    }
    char msg[4200];
    if (rc == CM_EAGAIN)
      snprintf(msg, sizeof msg, "still not ready after %d s: %.4000s", PM_READY_MS / 1000,
               cm_errmsg());
    pm_answer(rc, w.e.device, rc == CM_EAGAIN ? msg : NULL);
    free(w.names);
  }
  A.npm_wait = k;
  cadence_sync();
}

/* Replaces the PM consumers with the monitor's request and answers each entry with PM_STATUS
 * (an entry whose device is not ready yet later, from pm_retry). The old consumers go first, so
 * a device whose metrics change restarts once. Control thread. */
static void ops_pm(void *ud, const cm__pm_entry *en, int n, const char *refusal) {
  (void)ud;
  if (n < 0) {
    cm_wire_buf b;
    cm_wire_buf_init(&b);
    if (cm_wire_write_pm_status(&b, n, UINT32_MAX, refusal) == 0) q_push_buf(&b, false, 0);
    cm_wire_buf_free(&b);
    return;
  }
  for (uint32_t i = 0; i < A.npm; i++) {
    int rc = cm_pm_sample_remove(A.eng, A.pm_ids[i]);
    if (rc) alog(CM_LOG_WARN, "PM sampling: %s", cm_errmsg());
  }
  A.npm = 0;
  pm_wait_clear();
  A.pm_wait_end = cm__mono_ms() + PM_READY_MS;
  for (int i = 0; i < n && A.npm + A.npm_wait < CM__CTL_PM_ENTRIES; i++) {
    int rc = pm_try(&en[i]);
    if (rc == CM_EAGAIN && !atomic_load(&A.exiting) && pm_wait_add(&en[i])) {
      alog(CM_LOG_INFO, "PM sampling on device %d waits (up to %d s): %s", en[i].device,
           PM_READY_MS / 1000, cm_errmsg());
      continue;
    }
    pm_answer(rc, en[i].device, NULL);
  }
  cadence_sync();
}

static const cm__control_ops control_ops = {
    .pm = ops_pm,
    .select = ops_select,
    .configure = ops_configure,
    .queue_bytes = ops_queue_bytes,
    .flush = ops_flush,
    .flush_done = ops_flush_done,
    .log = ops_log,
};

/* ---- the control thread --------------------------------------------------------------------- */

static void *control_main(void *arg) {
  pthread_setname_np(pthread_self(), "cm-control");
  (void)arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  uint8_t buf[65536];
  bool reading = A.is_socket;
  for (;;) {
    if (atomic_load(&A.ctl_stop)) break;
    if (atomic_load(&A.gone)) {
      reading = false;
      if (!atomic_load(&A.exiting)) tracing_off();
      /* Dormant mode: the session is over; the listener ends it and waits for the next one. */
      if (cm__listen_mode() && !atomic_load(&A.exiting)) {
        cm__listen_session_over();
        break;
      }
    }
    /* Frames the handshake (or the last read) left in the reader come first. */
    while (reading) {
      cm_wire_frame f;
      int r = cm__control_next(&A.ctl, A.reader, &f);
      if (r == 1) {
        cm__control_apply(&A.ctl, &f, NULL);
        continue;
      }
      if (r < 0) {
        monitor_gone(r == CM_ERANGE ? "a control frame over the agent's bound" : "bad frame from the monitor");
        reading = false;
      }
      break;
    }
    struct pollfd pf[2] = {{.fd = A.wake[0], .events = POLLIN},
                           {.fd = reading ? A.fd : -1, .events = POLLIN}};
    int tmo = A.npm_wait ? PM_RETRY_MS : -1;
    uint32_t gms = cm__guard_interval_ms(&A.guard);
    if (guard_armed() && (tmo < 0 || (uint32_t)tmo > gms)) tmo = (int)gms;
    int pr = poll(pf, 2, tmo);
    pm_retry();
    guard_tick();
    if (pr < 0) {
      if (errno == EINTR) continue;
      alog(CM_LOG_ERROR, "control thread: poll failed: %s", strerror(errno));
      break;
    }
    if (pf[0].revents) {
      char tmp[64];
      ssize_t r = read(A.wake[0], tmp, sizeof tmp);
      (void)r;
    }
    if (reading && pf[1].revents) {
      ssize_t r = recv(A.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (r <= 0) {
        char why[128];
        snprintf(why, sizeof why, "%s", r == 0 ? "end of stream" : strerror(errno));
        monitor_gone(why);
        reading = false;
        continue;
      }
      if (cm__control_feed(&A.ctl, A.reader, buf, (size_t)r) != 0) {
        monitor_gone("bad stream from the monitor");
        reading = false;
      }
    }
  }
  pm_wait_clear();
  return NULL;
}

/* ---- exit ----------------------------------------------------------------------------------- */

/* Joins `t` unless `deadline` (mono ms) passes first; then the thread is left behind, logged, and
 * it returns false. */
static bool join_with_deadline(pthread_t t, const char *name, uint64_t deadline) {
  uint64_t now = cm__mono_ms();
  uint64_t ms = deadline > now ? deadline - now : 0;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += (time_t)(ms / 1000);
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  if (pthread_timedjoin_np(t, NULL, &ts) == 0) return true;
  alog(CM_LOG_WARN, "the %s thread did not stop %s; leaving it", name,
       atomic_load(&A.exiting) ? "within the exit budget" : "in time");
  return false;
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Appends one "; "-separated clause to the exit report `cut` (cap bytes, *len used). */
static void cut_add(char *cut, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void cut_add(char *cut, size_t cap, size_t *len, const char *fmt, ...) {
  if (*len && *len + 2 < cap) {
    memcpy(cut + *len, "; ", 3);
    *len += 2;
  }
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(cut + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* Removes the BATCH frames still queued (not the one being written), counting them as dropped at
 * the exit deadline (A.cut is set first), so the STATS frame queued after them reports them. The
 * STATS frames still queued go too: they counted the removed batches as queued ahead of them,
 * which is no longer true (the final STATS replaces them).
 * Returns the records; *batches receives the frames. send_mu held. */
static uint64_t purge_batches_locked(uint64_t *batches) {
  uint64_t records = 0;
  *batches = 0;
  qframe **pp = &A.head, *last = NULL, *gone = NULL;
  while (*pp) {
    qframe *f = *pp;
    if (f->stats) {
      *pp = f->next;
      A.q_bytes -= f->len;
      A.q_frames--;
      f->next = gone;
      gone = f;
    } else if (f->batch) {
      *pp = f->next;
      A.q_bytes -= f->len;
      A.q_frames--;
      A.q_batches--;
      A.q_records -= f->records;
      count_dropped(1, f->records);
      ++*batches;
      records += f->records;
      f->next = gone;
      gone = f;
    } else {
      last = f;
      pp = &f->next;
    }
  }
  A.tail = last;
  free_frames(gone);
  return records;
}

/* The exit's final flush runs on a helper thread, so that the exit handler can leave it at its
 * deadline whatever CUPTI does: cuptiActivityFlushAll has no deadline of its own, and under a
 * backlog it can take seconds. An abandoned flush goes on alone until
 * the process ends; the job it shares with the handler is freed by whichever of the two leaves
 * last, and the engine is never freed at exit, so the helper touches nothing that goes away. */
typedef struct exit_job {
  cm__job job; /* first (job.c) */
  cm_engine *eng;
  uint64_t sync_end, end;
  cm__exit_flush ef; /* written by the helper before done */
} exit_job;

static void *exit_job_main(void *arg) {
  pthread_setname_np(pthread_self(), "cm-exit");
  exit_job *j = arg;
  /* Into the job itself, so the waiter can read fence_complete while the forced flush runs. */
  cm__engine_exit_flush(j->eng, j->sync_end, j->end, &j->ef);
  cm__job_finish(&j->job);
  cm__job_release(&j->job);
  return NULL;
}

/* Runs cm__engine_exit_flush(eng, sync_end, end) and waits for it until `wait_end` at the latest.
 * Returns false when it was abandoned there (*out then holds only fence_complete and
 * fence_end_ms: whether and when the sync fence had completed, so that only the forced flush was
 * left behind); it runs inline when no helper thread can be started. Monotonic times in ms. */
static bool exit_flush_bounded(cm_engine *eng, uint64_t sync_end, uint64_t end, uint64_t wait_end,
                               cm__exit_flush *out) {
  memset(out, 0, sizeof *out);
  exit_job *j = calloc(1, sizeof *j);
  if (!j) {
    cm__engine_exit_flush(eng, sync_end, end, out);
    return true;
  }
  j->eng = eng;
  j->sync_end = sync_end;
  j->end = end;
  if (cm__job_start(&j->job, exit_job_main) != 0) {
    free(j);
    cm__engine_exit_flush(eng, sync_end, end, out);
    return true;
  }
  bool done = cm__job_wait(&j->job, wait_end, 0, NULL, NULL);
  if (done) {
    out->engine_busy = j->ef.engine_busy;
    out->capture_active = j->ef.capture_active;
    out->sync_timed_out = j->ef.sync_timed_out;
    out->decode_timed_out = j->ef.decode_timed_out;
    out->synced = j->ef.synced;
  }
  atomic_store(&out->fence_complete,
               atomic_load_explicit(&j->ef.fence_complete, memory_order_acquire));
  atomic_store(&out->fence_end_ms, atomic_load_explicit(&j->ef.fence_end_ms, memory_order_acquire));
  atomic_store(&out->device_synced_ms, atomic_load(&j->ef.device_synced_ms));
  atomic_store(&out->default_flushes, atomic_load(&j->ef.default_flushes));
  atomic_store(&out->seen_after_forced, atomic_load(&j->ef.seen_after_forced));
  atomic_store(&out->backlog_records, atomic_load(&j->ef.backlog_records));
  atomic_store(&out->backlog_cut, atomic_load(&j->ef.backlog_cut));
  cm__job_release(&j->job);
  return done;
}

/* The exit handler (on_exit with glibc, atexit elsewhere): a final fence, the last batches, STATS
 * and BYE. All of it runs within one budget (CUPTIMON_EXIT_BUDGET_MS), whatever the device (a
 * kernel still running), the engine (a monitor's sync flush in progress) or the monitor (one that
 * stopped reading) do: the fence gets at most CUPTIMON_EXIT_FLUSH_MS of it, the queue drains until
 * CUPTIMON_EXIT_DRAIN_MS or the budget's last tenth, the batches still queued then are dropped and
 * counted, and STATS, BYE and the threads' joins get the rest. What the budget cut off is counted
 * in STATS (records_dropped_exit) where it can be, and said in BYE's message and the log either
 * way. In a forked child (the agent's threads do not exist there) it does nothing. `exit_code` is
 * the status the process passed to exit() (0 to 255), or -1 when unknown; BYE carries it, so the
 * monitor can run process_exit (and print its tables) without waiting for the teardown that
 * follows this handler (the CUDA runtime and driver, which can take a few hundred ms), then reaps
 * the process. */
static void agent_exit_work(int exit_code) {
  if (getpid() != A.pid || !atomic_load(&A.active)) return;
  atomic_store(&A.exiting, true);
  uint64_t t0 = cm__mono_ms();
  uint64_t end = t0 + A.exit_budget_ms;
  /* The fence's two parts, for the log: the sync fence, then the forced flush (its wait). */
  uint64_t exit_sync_ms = 0, exit_forced_ms = 0;
  char sync_how[256] = ""; /* how the sync fence went, for the log */
  uint64_t reserve = A.exit_budget_ms / 10 < 20 ? 20 : A.exit_budget_ms / 10;
  if (reserve > A.exit_budget_ms) reserve = A.exit_budget_ms;
  char cut[1024] = "";
  size_t cl = 0;
#define CUT(...) cut_add(cut, sizeof cut, &cl, __VA_ARGS__)

  /* 1. The fence: the sync fence (the device's synchronize and the flushes until its record is
   * decoded) gets nine tenths of the fence's part, which by default is all of the budget but its
   * last tenth; the forced flush and the decoder may use the rest of it (what they deliver is
   * queued as it comes, so the drain overlaps them). The sync fence gets the most because it is
   * what makes the tail known: with many launching threads CUPTI can be more than a second
   * behind at exit, and a smaller sync part leaves the tail unknown. Another control call
   * holding the engine is hurried out of the way. */
  if (A.eng && !atomic_load(&A.gone)) {
    uint64_t flush_end = min_u64(t0 + A.exit_flush_ms, end - reserve);
    uint64_t sync_end = flush_end - (flush_end - t0) / 10;
    cm__exit_flush ef;
    /* The helper's own deadlines end at end - reserve; it gets a quarter of the reserve more
     * before it is left behind. */
    if (!exit_flush_bounded(A.eng, sync_end, end - reserve, end - reserve + reserve / 4, &ef)) {
      /* Either way the tail is unknown. A completed sync fence proves only that the buffers
       * CUPTI completed were delivered: with per-thread buffers (CUPTI's default), a thread
       * that stopped launching without synchronizing keeps its partly filled buffer until the
       * forced flush, so such a thread's records are exactly what is missing when the forced flush
       * is left behind. */
      atomic_store(&A.tail_unknown, true);
      if (atomic_load(&ef.fence_complete))
        CUT("the final forced flush did not return within the budget and was left running; the "
            "sync fence before it had completed, but the records in buffers only that flush "
            "returns (threads that stopped without synchronizing) were not sent (not counted: "
            "the tail is unknown)");
      else
        CUT("the final flush did not return within the budget (CUPTI's flush or the device was "
            "still busy); it was left running, so records CUPTI still held were not sent (not "
            "counted: the tail is unknown)");
    }
    {
      uint64_t fe = atomic_load(&ef.fence_end_ms), done = cm__mono_ms();
      exit_sync_ms = fe >= t0 ? fe - t0 : done - t0;
      exit_forced_ms = fe >= t0 ? done - fe : 0;
      uint64_t ds = atomic_load(&ef.device_synced_ms);
      uint64_t late = atomic_load(&ef.backlog_records);
      char late_how[96] = "";
      if (late)
        snprintf(late_how, sizeof late_how, "; %llu records from before it came after its record",
                 (unsigned long long)late);
      if (ds >= t0)
        snprintf(sync_how, sizeof sync_how, " (the device synchronized in %llu ms; %u default flushes%s%s)",
                 (unsigned long long)(ds - t0), (unsigned)atomic_load(&ef.default_flushes),
                 atomic_load(&ef.seen_after_forced) ? ", then its record came with a forced flush" : "",
                 late_how);
    }
    if (atomic_load(&ef.backlog_cut)) {
      atomic_store(&A.tail_unknown, true);
      CUT("CUPTI was still delivering records from before the exit's synchronize (%llu after its "
          "sync record) when the fence's deadline came: it was behind on some kind, and the "
          "records it still held were not sent (not counted: the tail is unknown)",
          (unsigned long long)atomic_load(&ef.backlog_records));
    }
    if (ef.engine_busy || ef.decode_timed_out) atomic_store(&A.tail_unknown, true);
    if (ef.engine_busy)
      CUT("the engine stayed busy past the fence's deadline, so the records CUPTI still held "
          "were not flushed (not counted)");
    if (ef.sync_timed_out)
      CUT("the device did not synchronize in time (a kernel still running?): records of work "
          "still running are missing or have end 0");
    if (ef.capture_active) CUT("a CUDA graph capture was in progress, so the device was not synchronized");
    if (ef.decode_timed_out)
      CUT("the decoder had not caught up at the budget's deadline: records CUPTI had delivered "
          "but not yet decoded were not sent (not counted)");
  }

  {
    pthread_mutex_lock(&A.send_mu);
    size_t queued = A.q_frames;
    pthread_mutex_unlock(&A.send_mu);
    /* Tests wait for this line to know that every record has passed the observer. */
    alog(CM_LOG_INFO, "exit: the final flush is done; %zu frames to send", queued);
  }

  /* 2. The drain, until its part or the budget's last tenth, whichever comes first. */
  pthread_mutex_lock(&A.send_mu);
  struct timespec ts;
  uint64_t drain_start = cm__mono_ms();
  uint64_t fence_ms = drain_start - t0;
  uint64_t drain_end = min_u64(drain_start + A.exit_drain_ms, end - reserve);
  uint64_t now = cm__mono_ms();
  cm__abstime_in(&ts, drain_end > now ? drain_end - now : 0);
  while ((A.head || A.sending) && !A.q_dead)
    if (pthread_cond_timedwait(&A.idle_cv, &A.send_mu, &ts) == ETIMEDOUT) break;
  uint64_t drain_ms = cm__mono_ms() - drain_start;
  uint64_t purged = 0, purged_batches = 0;
  if (!A.q_dead && A.head) {
    atomic_store(&A.cut, true);
    purged = purge_batches_locked(&purged_batches);
  }
  pthread_mutex_unlock(&A.send_mu);
  if (purged_batches) {
    alog(CM_LOG_WARN,
         "exit: the %s did not take the last frames within %llu ms: dropping %llu batches (%llu "
         "records), sending the final counts",
         A.is_socket ? "monitor" : "capture file", (unsigned long long)(drain_end > drain_start ? drain_end - drain_start : 0),
         (unsigned long long)purged_batches, (unsigned long long)purged);
    CUT("%llu records still queued at the drain's deadline were not sent (counted as dropped at "
        "exit)", (unsigned long long)purged);
  }

  /* 3. STATS and BYE (with what was cut), then the rest of the budget for them to leave. */
  push_stats();
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  char msg[1100];
  snprintf(msg, sizeof msg, "%s%s", cl ? "exit budget: " : "", cut);
  if (cm_wire_write_bye(&b, CM_WIRE_BYE_EXIT, exit_code, msg) == 0) q_push_bye(&b);
  cm_wire_buf_free(&b);
  pthread_mutex_lock(&A.send_mu);
  A.q_closed = true;
  A.sender_stop = true;
  pthread_cond_signal(&A.q_cv);
  now = cm__mono_ms();
  uint64_t last_end = end - reserve / 2;
  cm__abstime_in(&ts, last_end > now ? last_end - now : 0);
  while ((A.head || A.sending) && !A.q_dead)
    if (pthread_cond_timedwait(&A.idle_cv, &A.send_mu, &ts) == ETIMEDOUT) break;
  bool drained = !A.head && !A.sending;
  size_t left = A.q_frames;
  pthread_mutex_unlock(&A.send_mu);
  /* What is still queued now is lost to the exit deadline. */
  atomic_store(&A.cut, true);
  /* 4. A sender blocked in send() on a monitor that does not read is released by the shutdown;
   * the threads get what is left of the budget to stop. Whether BYE got out is known only once
   * the sender has stopped (a frame it was writing at the deadline may still have gone whole),
   * so that is what the log says, and the monitor's account agrees with it: without BYE it
   * reports the process as incomplete. */
  bool was_gone = atomic_load(&A.gone);
  if (A.is_socket && A.fd >= 0) shutdown(A.fd, SHUT_RDWR);
  if (!drained) monitor_gone("closed at exit");
  atomic_store(&A.ctl_stop, true);
  wake_control();
  if (A.sender_started) join_with_deadline(A.sender, "sender", end);
  if (A.sender_started && !was_gone && !atomic_load(&A.sender_drained))
    alog(CM_LOG_WARN,
         "the %s did not take the last %zu frames within the exit budget (%u ms); closed "
         "without them (STATS and BYE among them): the monitor reports this process as "
         "incomplete",
         A.is_socket ? "monitor" : "capture file", left, A.exit_budget_ms);
  if (A.control_started) join_with_deadline(A.control, "control", end);
  if (A.fd >= 0) close(A.fd);
  A.fd = -1;
  atomic_store(&A.active, false);
  cm_stats st;
  memset(&st, 0, sizeof st);
  cm_stats_get(A.eng, &st);
  alog_drain_repeats();
  int lvl = GET(batches_dropped) || st.records_dropped || cl ? CM_LOG_WARN : CM_LOG_INFO;
  alog(lvl,
       "exit: %llu batches (%llu records) sent, %llu batches dropped: %llu records by the agent "
       "(queue full or connection lost), %llu records at the exit deadline; %llu records dropped "
       "by CUPTI, %llu bytes, %llu ms of a %u ms budget (fence %llu ms: sync %llu ms%s, forced "
       "flush %llu ms; drain %llu ms)%s%s",
       (unsigned long long)GET(batches_sent), (unsigned long long)GET(records_sent),
       (unsigned long long)GET(batches_dropped), (unsigned long long)GET(records_dropped_agent),
       (unsigned long long)GET(records_dropped_exit), (unsigned long long)st.records_dropped,
       (unsigned long long)GET(bytes_sent), (unsigned long long)(cm__mono_ms() - t0),
       A.exit_budget_ms, (unsigned long long)fence_ms, (unsigned long long)exit_sync_ms, sync_how,
       (unsigned long long)exit_forced_ms, (unsigned long long)drain_ms, cl ? "; " : "", cut);
#undef CUT
  /* The engine is left alive: CUPTI's threads may still call its callbacks during teardown. */
}

#ifdef __GLIBC__
/* glibc's on_exit handlers receive the status given to exit() (main's return value too). */
static void agent_on_exit(int status, void *arg) {
  (void)arg;
  agent_exit_work(status & 0xff);
}
#define REGISTER_EXIT_HANDLER() on_exit(agent_on_exit, NULL)
#else
static void agent_atexit(void) { agent_exit_work(-1); }
#define REGISTER_EXIT_HANDLER() atexit(agent_atexit)
#endif

/* In a forked child the agent's threads are gone and the descriptor is the parent's: the child
 * closes its copy (so the monitor still sees the parent's end) and stays silent. */
static void atfork_child(void) {
  atomic_store(&A.active, false);
  atomic_store(&A.gone, true);
  if (A.fd >= 0) close(A.fd);
  if (A.wake[0] >= 0) close(A.wake[0]);
  if (A.wake[1] >= 0) close(A.wake[1]);
  A.fd = A.wake[0] = A.wake[1] = -1;
}

/* ---- start-up ------------------------------------------------------------------------------- */

static int connect_monitor(const char *path, uint64_t deadline) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa.sun_path) {
    alog(CM_LOG_ERROR, "CUPTIMON_SOCKET '%s' is longer than a unix socket path may be", path);
    return -1;
  }
  strcpy(sa.sun_path, path);
  for (;;) {
    /* Non-blocking, so a monitor whose backlog is full (a blocking connect would wait for it to
     * accept, with no deadline) cannot hold cuInit past the handshake deadline. */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      alog(CM_LOG_ERROR, "socket: %s", strerror(errno));
      return -1;
    }
    int err = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        uint64_t now = cm__mono_ms();
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int pr = now < deadline ? poll(&pf, 1, (int)(deadline - now)) : 0;
        socklen_t len = sizeof err;
        if (pr != 1)
          err = pr == 0 ? ETIMEDOUT : errno;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) /* the outcome */
          err = errno;
      }
    }
    if (err == 0) {
      /* The sender relies on blocking sends (the exit handler bounds them by a shutdown). */
      int fl = fcntl(fd, F_GETFL);
      if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
      return fd;
    }
    close(fd);
    /* A listener with a full backlog answers EAGAIN; retry until the deadline. */
    if ((err != EAGAIN && err != EINTR) || cm__mono_ms() >= deadline) {
      alog(CM_LOG_ERROR, "cannot connect to the monitor at %s: %s", path, strerror(err));
      return -1;
    }
    usleep(10000);
  }
}

/* Reads monitor frames until HELLO_ACK or the deadline, applying CONFIGURE and SELECT in order.
 * Returns the HELLO_ACK status, or CM_ETIMEDOUT / CM_EIO. */
/* The grace a dormant agent's peer has to send its first byte before a waiting connection may
 * take the listener from it (listen.c). A monitor answers HELLO at once; a silent peer never. */
enum { PREEMPT_GRACE_MS = 250 };

/* Waits for HELLO_ACK until `deadline`. With `preempt_fd` >= 0 (a dormant agent's listening
 * socket), a peer that has sent nothing for PREEMPT_GRACE_MS while another connection waits on
 * preempt_fd loses the handshake (CM_EAGAIN), so one silent peer never holds the listener. */
static int32_t await_ack(uint64_t deadline, int preempt_fd) {
  uint8_t buf[16384];
  bool heard = false;
  uint64_t grace_end = cm__mono_ms() + PREEMPT_GRACE_MS;
  for (;;) {
    cm_wire_frame f;
    int r;
    while ((r = cm__control_next(&A.ctl, A.reader, &f)) == 1) {
      int32_t st = 0;
      if (cm__control_apply(&A.ctl, &f, &st)) return st;
    }
    if (r < 0) {
      alog(CM_LOG_ERROR, "the handshake failed on the monitor's stream (see above)");
      return CM_EIO;
    }
    uint64_t now = cm__mono_ms();
    if (now >= deadline) {
      alog(CM_LOG_ERROR, "no HELLO_ACK from the monitor within %u ms (CUPTIMON_HANDSHAKE_MS)",
           A.handshake_ms);
      return CM_ETIMEDOUT;
    }
    struct pollfd pf[2] = {{.fd = A.fd, .events = POLLIN}, {.fd = preempt_fd, .events = POLLIN}};
    bool watch = preempt_fd >= 0 && !heard && now >= grace_end;
    uint64_t until = preempt_fd >= 0 && !heard && now < grace_end && grace_end < deadline ? grace_end : deadline;
    int pr = poll(pf, watch ? 2 : 1, (int)(until - now));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    if (watch && (pf[1].revents & POLLIN) && !(pf[0].revents & POLLIN)) return CM_EAGAIN;
    if (!(pf[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    ssize_t n = recv(A.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) heard = true;
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      alog(CM_LOG_ERROR, "the monitor closed the connection during the handshake%s%s",
           n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
      return CM_EIO;
    }
    if (cm__control_feed(&A.ctl, A.reader, buf, (size_t)n) != 0) return CM_EIO;
  }
}

/* Expands "%p" to the pid (and "%%" to "%") into out. */
static void expand_path(const char *pat, char *out, size_t cap) {
  size_t o = 0;
  for (const char *p = pat; *p && o + 1 < cap; p++) {
    if (p[0] == '%' && p[1] == 'p') {
      int n = snprintf(out + o, cap - o, "%d", (int)getpid());
      if (n > 0) o += (size_t)n < cap - o ? (size_t)n : cap - o - 1;
      p++;
    } else if (p[0] == '%' && p[1] == '%') {
      out[o++] = '%';
      p++;
    } else {
      out[o++] = *p;
    }
  }
  out[o < cap ? o : cap - 1] = '\0';
}

/* Writes BYE(error) after HELLO and SCHEMA, so a monitor or a capture reader learns that this
 * process exists but is not traced, and why. */
static void report_failure(const char *token, const char *why, uint64_t deadline, bool capture) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  if ((!capture || cm_wire_write_file_header(&b, 0) == 0) && write_hello_schema(&b, token) == 0 &&
      cm_wire_write_bye(&b, CM_WIRE_BYE_ERROR, -1, why) == 0)
    write_all(A.fd, A.is_socket, b.data, b.len, deadline);
  cm_wire_buf_free(&b);
}

static int start_threads(void) {
  if (A.wake[0] < 0 && pipe2(A.wake, O_CLOEXEC) != 0) {
    alog(CM_LOG_ERROR, "pipe2: %s", strerror(errno));
    return -1;
  }
  if (pthread_create(&A.sender, NULL, sender_main, NULL) != 0) {
    alog(CM_LOG_ERROR, "cannot start the sender thread");
    return -1;
  }
  A.sender_started = true;
  if (pthread_create(&A.control, NULL, control_main, NULL) != 0) {
    alog(CM_LOG_ERROR, "cannot start the control thread");
    return -1;
  }
  A.control_started = true;
  return 0;
}

/* Creates the engine with the default configuration and `deliver_ms`, and routes its log.
 * Returns 0, or a CM_E* code with the reason in why (A.eng stays NULL). */
static int start_engine(uint32_t deliver_ms, char *why, size_t cap) {
  cm_config_init(&A.cfg);
  A.cfg.deliver_ms = deliver_ms;
  int rc = cm_engine_new(&A.eng, &A.cfg);
  if (rc) {
    snprintf(why, cap, "%s: %s", cm_err_name(rc), cm_errmsg());
    A.eng = NULL;
    return rc;
  }
  cm_set_log(A.eng, engine_log, NULL);
  cm__engine_set_detach_max_threads(A.eng, (int)A.detach_max_threads);
  return 0;
}

/* Everything InitializeInjection does, once. Returns with tracing on, or off after logging. */
static void agent_init(void) {
  A.pid = getpid();
  /* First of all: the observer may push to the queue (and signal q_cv) as soon as a selection is
   * applied, which happens before the threads start. */
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&A.q_cv, &ca);
  pthread_cond_init(&A.idle_cv, &ca);
  pthread_condattr_destroy(&ca);
  if (!init_level())
    alog(CM_LOG_WARN, "CUPTIMON_AGENT_LOG=%s is not one of error|warn|info|debug; using warn",
         getenv("CUPTIMON_AGENT_LOG"));
  const char *rep = getenv("CUPTIMON_AGENT_LOG_REPEAT_MS");
  log_repeat.interval_ms =
      rep && strcmp(rep, "0") == 0 ? 0 : env_u64("CUPTIMON_AGENT_LOG_REPEAT_MS", 60000, 86400000);
  const char *sock = getenv("CUPTIMON_SOCKET");
  const char *cap = getenv("CUPTIMON_CAPTURE");
  const char *token = getenv("CUPTIMON_TOKEN");
  const char *lsn = getenv("CUPTIMON_LISTEN");
  if (sock && !*sock) sock = NULL;
  if (cap && !*cap) cap = NULL;
  bool dormant = lsn && *lsn && strcmp(lsn, "0") != 0 && !sock;
  if (!sock && !cap && !dormant) {
    alog(CM_LOG_INFO, "neither CUPTIMON_SOCKET nor CUPTIMON_CAPTURE is set (nor CUPTIMON_LISTEN); not tracing");
    return;
  }
  A.handshake_ms = (uint32_t)env_u64("CUPTIMON_HANDSHAKE_MS", DEFAULT_HANDSHAKE_MS, 3600000);
  /* One budget bounds the whole exit, as a service manager's stop timeout does; the fence's and
   * the drain's deadlines are parts of it (by default all of it but its last tenth for the
   * fence, at most, and whatever the fence left for the drain, which overlaps the fence). */
  A.exit_budget_ms = (uint32_t)env_u64("CUPTIMON_EXIT_BUDGET_MS", EXIT_BUDGET_MS, 3600000);
  A.exit_flush_ms = (uint32_t)env_u64("CUPTIMON_EXIT_FLUSH_MS", A.exit_budget_ms - A.exit_budget_ms / 10, 3600000);
  A.exit_drain_ms = (uint32_t)env_u64("CUPTIMON_EXIT_DRAIN_MS", A.exit_budget_ms, 3600000);
  A.max_bytes = (size_t)env_u64("CUPTIMON_AGENT_QUEUE_MB", DEFAULT_QUEUE_MB, 1 << 20) << 20;
  A.max_frames = (size_t)env_u64("CUPTIMON_AGENT_QUEUE_FRAMES", DEFAULT_QUEUE_FRAMES, 1 << 24);
  const char *guard = getenv("CUPTIMON_GUARD_LAG_MS");
  bool guard_off = guard && strcmp(guard, "0") == 0;
  A.guard.limit_ns =
      guard_off ? 0 : env_u64("CUPTIMON_GUARD_LAG_MS", DEFAULT_GUARD_LAG_MS, 86400000) * 1000000;
  const char *det = getenv("CUPTIMON_DETACH_IDLE");
  atomic_store(&A.idle_mode, det && strcmp(det, "0") == 0 ? CM_IDLE_SETTING : CM_IDLE_DETACH);
  const char *dmt = getenv("CUPTIMON_DETACH_MAX_THREADS");
  A.detach_max_threads = dmt && strcmp(dmt, "0") == 0
                             ? 0
                             : env_u64("CUPTIMON_DETACH_MAX_THREADS", DEFAULT_DETACH_MAX_THREADS, 4096);
  if (det && *det && strcmp(det, "0") != 0 && strcmp(det, "1") != 0)
    alog(CM_LOG_WARN, "CUPTIMON_DETACH_IDLE=%s is neither 0 nor 1: CUPTI is detached while idle, "
                      "the default", det);
  const char *gbuf = getenv("CUPTIMON_GUARD_BUFFERS");
  A.guard.buffers_limit = gbuf && strcmp(gbuf, "0") == 0
                              ? 0
                              : env_u64("CUPTIMON_GUARD_BUFFERS", DEFAULT_GUARD_BUFFERS, 1000000);
  if (dormant) {
    /* Nothing is loaded or enabled until a monitor attaches (listen.c, docs/agent.md). */
    if (cap) alog(CM_LOG_WARN, "CUPTIMON_LISTEN is set: CUPTIMON_CAPTURE is ignored");
    A.def_max_bytes = A.max_bytes;
    cm__listen_start();
    return;
  }
  uint64_t deadline = cm__mono_ms() + A.handshake_ms;
  char path[4096];

  if (sock) {
    A.fd = connect_monitor(sock, deadline);
    if (A.fd < 0) {
      alog(CM_LOG_WARN, "tracing off");
      return;
    }
    A.is_socket = true;
  } else {
    expand_path(cap, path, sizeof path);
    A.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (A.fd < 0) {
      alog(CM_LOG_ERROR, "cannot create the capture file %s: %s; tracing off", path,
           strerror(errno));
      return;
    }
    alog(CM_LOG_INFO, "writing the capture %s", path);
  }

  char why[1024];
  int rc = start_engine(DEFAULT_DELIVER_MS, why, sizeof why);
  if (rc) {
    alog(CM_LOG_ERROR, "cannot start the engine: %s; tracing off", why);
    report_failure(sock ? token : "", why, deadline, !sock);
    close(A.fd);
    A.fd = -1;
    return;
  }

  cm_wire_buf b;
  cm_wire_buf_init(&b);
  rc = (!sock ? cm_wire_write_file_header(&b, 0) : 0);
  if (!rc) rc = write_hello_schema(&b, sock ? (token ? token : "") : "");
  if (!rc) {
    int err = write_all(A.fd, A.is_socket, b.data, b.len, deadline);
    if (err && sock && (err == EPIPE || err == ECONNRESET) && cm__mono_ms() < deadline) {
      /* The monitor's gate closed this connection before reading it (it was full: a flood of
       * idle connections): once more, on a new connection, within the deadline. */
      alog(CM_LOG_WARN, "cannot send HELLO: %s; connecting once more", strerror(err));
      close(A.fd);
      A.fd = connect_monitor(sock, deadline);
      err = A.fd < 0 ? ECONNREFUSED : write_all(A.fd, A.is_socket, b.data, b.len, deadline);
    }
    if (err) {
      alog(CM_LOG_ERROR, "cannot send HELLO: %s; tracing off", strerror(err));
      rc = CM_EIO;
    } else {
      INC(bytes_sent, b.len);
      INC(frames_sent, 2);
    }
  }
  cm_wire_buf_free(&b);
  if (rc) goto off;

  if (cm_wire_reader_new(&A.reader, 0) != 0) goto off;
  cm__control_init(&A.ctl, &control_ops, &A.cfg);
  if (sock) {
    int32_t st = await_ack(deadline, -1);
    if (st != 0) {
      alog(CM_LOG_WARN, "handshake failed (%s); tracing off, the application continues",
           cm_err_name(st));
      goto off;
    }
  } else {
    const char *spec = getenv("CUPTIMON_SELECT");
    cm_selection *sel = NULL;
    if (cm_selection_new(&sel) != 0) goto off;
    int dropped = cm_selection_parse_ex(sel, spec && *spec ? spec : default_select,
                                        CM_SELECT_LENIENT, on_select_skip,
                                        (void *)(spec && *spec ? "CUPTIMON_SELECT"
                                                               : "the default selection"));
    if (dropped > 0)
      alog(CM_LOG_WARN, "%d selection names were left out (see above)", dropped);
    if (selection_empty(sel))
      alog(CM_LOG_WARN, "the selection is empty: the capture will hold no records");
    else
      apply_selection(sel);
    cm_selection_free(sel);
  }
  if (start_threads() != 0) goto off;
  atomic_store(&A.active, true);
  pthread_atfork(NULL, NULL, atfork_child);
  REGISTER_EXIT_HANDLER();
  alog(CM_LOG_INFO, "%s; tracing %s", sock ? "connected to the monitor" : "capture mode",
       atomic_load(&A.tracing) ? "on" : "idle until a selection arrives");
  return;

off:
  /* Nothing runs: observers go, the descriptor closes, the engine stays (idle) for the process. */
  if (A.nobs) apply_selection(NULL);
  if (A.sender_started || A.control_started) {
    /* Threads that started keep no state worth a teardown here; they exit on the dead queue. */
    monitor_gone("start-up failed");
    atomic_store(&A.ctl_stop, true);
    wake_control();
  } else if (A.fd >= 0) {
    close(A.fd);
    A.fd = -1;
  }
}

/* ---- dormant mode's sessions (listen.c drives them; listen.h has the contract) --------------- */

bool cm__agent_attached(void) { return atomic_load(&A.active); }

bool cm__agent_session_gone(void) { return atomic_load(&A.active) && atomic_load(&A.gone); }

void cm__agent_exit(int exit_code) { agent_exit_work(exit_code); }

/* Restores the state of a fresh connection: an empty live queue, zero counters, no strings sent,
 * BATCH numbers from 1, and the engine's counters as the new baseline. Listener thread, between
 * sessions: no agent thread runs and no observer is registered, so nothing else touches it. */
static void session_reset(int fd) {
  A.fd = fd;
  A.is_socket = true;
  atomic_store(&A.gone, false);
  atomic_store(&A.cut, false);
  atomic_store(&A.ctl_stop, false);
  atomic_store(&A.tracing, false);
  pthread_mutex_lock(&A.send_mu);
  A.head = A.tail = NULL;
  A.q_bytes = A.q_frames = 0;
  A.q_batches = A.q_records = 0;
  A.q_closed = A.q_dead = A.sender_stop = A.sending = false;
  A.max_bytes = A.def_max_bytes;
  pthread_mutex_unlock(&A.send_mu);
  atomic_store(&A.batches_sent, 0);
  atomic_store(&A.batches_dropped, 0);
  atomic_store(&A.records_dropped_agent, 0);
  atomic_store(&A.sender_drained, false);
  atomic_store(&A.tail_unknown, false);
  atomic_store(&A.records_dropped_exit, 0);
  atomic_store(&A.records_sent, 0);
  atomic_store(&A.bytes_sent, 0);
  atomic_store(&A.frames_sent, 0);
  atomic_store(&A.strings_sent, 0);
  A.cb_strings_sent = 0;
  A.cb_number = 0;
  A.cb_last_seq = 0;
  A.cb_last_kind = -1;
  A.sender_started = A.control_started = false;
  A.cadence_idle = false; /* session_begin applies the live cadence next */
  /* Each session starts with every kind the monitor asks for: the guard sheds afresh. */
  if (GET(guard_shed)) cm__engine_set_suppressed(A.eng, 0);
  atomic_store(&A.guard_shed, 0);
  atomic_store(&A.guard_sheds, 0);
  atomic_store(&A.guard_lag_ns, 0);
  atomic_store(&A.guard_held_ns, 0);
  cm__guard_reset(&A.guard);
  A.guard_decoded = A.guard_next_ms = 0;
  memset(&A.base, 0, sizeof A.base);
  cm_stats_get(A.eng, &A.base);
}

int cm__agent_session_begin(int fd, uint64_t deadline, int preempt_fd) {
  if (!A.eng) {
    /* The first attach: the engine (libcupti, the subscription) starts here, on the listener
     * thread, with no cadence, so that between sessions its worker sleeps. */
    char why[1024];
    int rc = start_engine(0, why, sizeof why);
    if (rc) {
      alog(CM_LOG_ERROR, "dormant: cannot start the engine: %s", why);
      A.fd = fd;
      A.is_socket = true;
      report_failure("", why, deadline, false);
      close(fd);
      A.fd = -1;
      return rc;
    }
    A.idle_cfg = A.cfg;
  }
  session_reset(fd);
  /* While attached, the agent's usual delivery cadence. */
  cm_config live = A.idle_cfg;
  live.deliver_ms = DEFAULT_DELIVER_MS;
  if (cm_configure(A.eng, &live) == 0) A.cfg = live;
  cm_wire_reader_free(A.reader);
  A.reader = NULL;
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  int rc = write_hello_schema(&b, "");
  if (!rc && write_all(A.fd, true, b.data, b.len, deadline) != 0) rc = CM_EIO;
  cm_wire_buf_free(&b);
  if (!rc) rc = cm_wire_reader_new(&A.reader, 0);
  if (!rc) {
    cm__control_init(&A.ctl, &control_ops, &A.cfg);
    int32_t st = await_ack(deadline, preempt_fd);
    if (st == CM_EAGAIN) {
      alog(CM_LOG_DEBUG, "dormant: a peer sent nothing within %d ms while another connection "
           "waited; serving the next one", PREEMPT_GRACE_MS);
      rc = st;
    } else if (st != 0) {
      alog(CM_LOG_WARN, "dormant: the monitor's handshake failed (%s); staying dormant",
           cm_err_name(st));
      rc = st;
    }
  }
  if (!rc && start_threads() != 0) rc = CM_EIO;
  if (rc) {
    /* Threads that did start exit on the dead queue; the end of the session joins them. */
    atomic_store(&A.active, true);
    monitor_gone("the attach failed");
    cm__agent_session_end(deadline + 5000);
    return rc;
  }
  atomic_store(&A.active, true);
  return 0;
}

bool cm__agent_session_end(uint64_t deadline) {
  bool ok = true;
  monitor_gone("detached"); /* idempotent: the queue dies and the sender stops */
  atomic_store(&A.ctl_stop, true);
  wake_control();
  if (A.fd >= 0) shutdown(A.fd, SHUT_RDWR);
  if (A.control_started) ok &= join_with_deadline(A.control, "control", deadline);
  if (A.sender_started) ok &= join_with_deadline(A.sender, "sender", deadline);
  A.control_started = A.sender_started = false;
  if (!ok) return false;
  if (A.fd >= 0) close(A.fd);
  A.fd = -1;
  /* Every kind off (a no-op when the control thread did it already), then the pool's free
   * buffers go, CUPTI is detached, and the dormant configuration (no cadence) comes back. */
  if (A.nobs) apply_selection(NULL);
  detach_idle(true);
  if (A.eng) {
    if (cm_configure(A.eng, &A.idle_cfg) == 0) A.cfg = A.idle_cfg;
    cm__engine_trim(A.eng);
  }
  atomic_store(&A.active, false);
  return true;
}

/* The CUDA driver calls this once, inside cuInit, when CUDA_INJECTION64_PATH names the agent.
 * Idempotent: later calls return at once. It never fails the process: any failure is logged and
 * leaves tracing off, and it returns 1 either way. */
int InitializeInjection(void) {
  pthread_mutex_lock(&A.init_mu);
  if (!A.initialized) {
    A.initialized = true;
    agent_init();
  }
  pthread_mutex_unlock(&A.init_mu);
  return 1;
}

/* NVTX calls this when NVTX_INJECTION64_PATH names the agent. NVTX ranges are recorded by CUPTI,
 * so the call is forwarded to the loaded libcupti's InitializeInjectionNvtx2 (loading libcupti
 * through the engine's binding if nothing has yet). Returns its result, or 0 (NVTX then runs
 * without an injection) when libcupti or the symbol is missing. */
int InitializeInjectionNvtx2(const void *getExportTable) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static cm__cupti cupti;
  static bool loaded;
  pthread_mutex_lock(&mu);
  if (!loaded) init_level();
  if (!loaded) {
    int rc = cm__cupti_load(&cupti);
    if (rc) {
      pthread_mutex_unlock(&mu);
      alog(CM_LOG_WARN, "NVTX injection: %s; NVTX ranges are not recorded", cm_errmsg());
      return 0;
    }
    loaded = true;
  }
  pthread_mutex_unlock(&mu);
  int (*fn)(const void *) = NULL;
  *(void **)&fn = dlsym(cupti.lib, "InitializeInjectionNvtx2");
  if (!fn) {
    alog(CM_LOG_WARN, "NVTX injection: %s has no InitializeInjectionNvtx2; NVTX ranges are not "
                      "recorded", cupti.path);
    return 0;
  }
  int rc = fn(getExportTable);
  atomic_store(&g_nvtx_injected, true);
  return rc;
}
