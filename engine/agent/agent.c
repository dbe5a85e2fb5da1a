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
 *  - The engine's decode worker, or whichever thread runs cm_flush, calls the observer
 *    (cm__frames_on_batch). The engine serializes observer callbacks (its dec_mu), so the callback
 *    state (cb_*) needs no lock of its own. The callback only encodes and pushes; it never blocks
 *    on I/O.
 *  - The sender thread pops frames and writes them (send with MSG_NOSIGNAL, or write for a
 *    capture). It is the only thread that writes to the descriptor after the handshake.
 *  - The control thread reads monitor frames (SELECT, CONFIGURE, FLUSH) and owns the observer
 *    list after the handshake: it is the only thread that calls cm_observe/cm_unobserve, so an
 *    observer callback never does. The sender wakes it through a pipe when the monitor is gone.
 *  - The exiting thread runs the exit handler within one budget: the engine's exit fence (which
 *    hurries a flush of the control thread out of its way), a bounded drain, the last frames,
 *    then it stops both threads (exit.c).
 * Locks: send_mu guards the send queue and its flags; the engine's locks are taken only inside cm_*
 * calls. No agent lock is held while calling into the engine, except that the observer
 * (cm__frames_on_batch) takes send_mu while the engine holds its dec_mu (order: engine dec_mu,
 * then send_mu; send_mu is a leaf). Counters are relaxed atomics.
 *
 * This file is the agent's start-up and its entry points; agent_internal.h lists the agent's other
 * files, each one noun (the log, the send queue, the frames, the handshake, what is traced, the
 * control thread, the exit, dormant sessions), and the one direction in which they call each
 * other.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "agent_internal.h"

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
  DEFAULT_QUEUE_MB = 64,
  DEFAULT_QUEUE_FRAMES = 1024,
  EXIT_BUDGET_MS = 2000,  /* all exit work: the final fence, the drain, the last frames, joins */
  /* The lag guard's default limits (cm__tracing_guard_tick, guard.h): the time CUPTI held records,
   * and the activity buffers it holds (24 MiB at the default 4 MiB; a CUPTI that keeps up holds a
   * few, with its per-thread buffers off as the engine sets them). */
  DEFAULT_GUARD_LAG_MS = 500,
  /* A detach is refused while this many threads call the CUDA runtime at once: between the
   * thread counts at which CUPTI's next subscription returned and at which it did not
   * (bench/RESULTS.md, "CUPTI states"). */
  DEFAULT_DETACH_MAX_THREADS = 8,
  DEFAULT_GUARD_BUFFERS = 6
};

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

/* Logs one name that the lenient parse of CUPTIMON_SELECT (or the default selection) left out. */
static void on_select_skip(void *ud, size_t offset, const char *message) {
  (void)offset;
  alog(CM_LOG_WARN, "%s: left out: %s", (const char *)ud, message);
}

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

/* Start-up, step 1: the state the observer may touch first, and the log. The observer may push to
 * the queue (and signal q_cv) as soon as a selection is applied, which happens before the
 * threads start. */
static void init_basics(void) {
  A.pid = getpid();
  cm__sendq_init();
  if (!cm__alog_init_level())
    alog(CM_LOG_WARN, "CUPTIMON_AGENT_LOG=%s is not one of error|warn|info|debug; using warn",
         getenv("CUPTIMON_AGENT_LOG"));
  const char *rep = getenv("CUPTIMON_AGENT_LOG_REPEAT_MS");
  cm__alog_set_repeat_ms(
      rep && strcmp(rep, "0") == 0 ? 0 : env_u64("CUPTIMON_AGENT_LOG_REPEAT_MS", 60000, 86400000));
}

/* Step 2: the settings of docs/agent.md's environment (deadlines, budgets, bounds, the lag guard,
 * the idle detach). */
static void init_settings(void) {
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
}

/* Step 3: the descriptor, the monitor's socket (`sock`) or the capture file (`cap`). Returns false
 * (logged) when there is none: tracing is off. */
static bool init_descriptor(const char *sock, const char *cap, uint64_t deadline) {
  char path[4096];

  if (sock) {
    A.fd = connect_monitor(sock, deadline);
    if (A.fd < 0) {
      alog(CM_LOG_WARN, "tracing off");
      return false;
    }
    A.is_socket = true;
  } else {
    expand_path(cap, path, sizeof path);
    A.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (A.fd < 0) {
      alog(CM_LOG_ERROR, "cannot create the capture file %s: %s; tracing off", path,
           strerror(errno));
      return false;
    }
    alog(CM_LOG_INFO, "writing the capture %s", path);
  }
  return true;
}

/* Step 4: HELLO and SCHEMA (after the file header, for a capture). Returns 0, or a CM_E* code
 * (logged). */
static int init_hello(const char *sock, const char *token, uint64_t deadline) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  int rc = (!sock ? cm_wire_write_file_header(&b, 0) : 0);
  if (!rc) rc = cm__handshake_hello_schema(&b, sock ? (token ? token : "") : "");
  if (!rc) {
    int err = cm__sendq_write_all(A.fd, A.is_socket, b.data, b.len, deadline);
    if (err && sock && (err == EPIPE || err == ECONNRESET) && cm__mono_ms() < deadline) {
      /* The monitor's gate closed this connection before reading it (it was full: a flood of
       * idle connections): once more, on a new connection, within the deadline. */
      alog(CM_LOG_WARN, "cannot send HELLO: %s; connecting once more", strerror(err));
      close(A.fd);
      A.fd = connect_monitor(sock, deadline);
      err = A.fd < 0 ? ECONNREFUSED
                     : cm__sendq_write_all(A.fd, A.is_socket, b.data, b.len, deadline);
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
  return rc;
}

/* Step 5: the first selection: the monitor's answer to HELLO, or CUPTIMON_SELECT (else the
 * default selection) for a capture. Returns false when tracing must stay off. */
static bool init_selection(const char *sock, uint64_t deadline) {
  if (cm_wire_reader_new(&A.reader, 0) != 0) return false;
  cm__control_thread_init();
  if (sock) {
    int32_t st = cm__handshake_await_ack(deadline, -1);
    if (st != 0) {
      alog(CM_LOG_WARN, "handshake failed (%s); tracing off, the application continues",
           cm_err_name(st));
      return false;
    }
  } else {
    const char *spec = getenv("CUPTIMON_SELECT");
    cm_selection *sel = NULL;
    if (cm_selection_new(&sel) != 0) return false;
    int dropped = cm_selection_parse_ex(sel, spec && *spec ? spec : default_select,
                                        CM_SELECT_LENIENT, on_select_skip,
                                        (void *)(spec && *spec ? "CUPTIMON_SELECT"
                                                               : "the default selection"));
    if (dropped > 0)
      alog(CM_LOG_WARN, "%d selection names were left out (see above)", dropped);
    if (cm__tracing_selection_empty(sel))
      alog(CM_LOG_WARN, "the selection is empty: the capture will hold no records");
    else
      cm__tracing_apply_selection(sel);
    cm_selection_free(sel);
  }
  return true;
}

/* A start-up that failed after the engine started: nothing runs. Observers go, the descriptor
 * closes, the engine stays (idle) for the process. */
static void init_off(void) {
  if (A.nobs) cm__tracing_apply_selection(NULL);
  if (A.sender_started || A.control_started) {
    /* Threads that started keep no state worth a teardown here; they exit on the dead queue. */
    cm__sendq_monitor_gone("start-up failed");
    atomic_store(&A.ctl_stop, true);
    cm__sendq_wake_control();
  } else if (A.fd >= 0) {
    close(A.fd);
    A.fd = -1;
  }
}

/* Everything InitializeInjection does, once. Returns with tracing on, or off after logging. */
static void agent_init(void) {
  init_basics();
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
  init_settings();
  if (dormant) {
    /* Nothing is loaded or enabled until a monitor attaches (listen.c, docs/agent.md). */
    if (cap) alog(CM_LOG_WARN, "CUPTIMON_LISTEN is set: CUPTIMON_CAPTURE is ignored");
    cm__dormant_start();
    return;
  }
  uint64_t deadline = cm__mono_ms() + A.handshake_ms;
  if (!init_descriptor(sock, cap, deadline)) return;

  char why[1024];
  int rc = cm__tracing_start_engine(DEFAULT_DELIVER_MS, why, sizeof why);
  if (rc) {
    alog(CM_LOG_ERROR, "cannot start the engine: %s; tracing off", why);
    cm__handshake_report_failure(sock ? token : "", why, deadline, !sock);
    close(A.fd);
    A.fd = -1;
    return;
  }

  if (init_hello(sock, token, deadline) != 0 || !init_selection(sock, deadline) ||
      cm__control_thread_start() != 0) {
    init_off();
    return;
  }
  atomic_store(&A.active, true);
  pthread_atfork(NULL, NULL, atfork_child);
  cm__exit_register();
  alog(CM_LOG_INFO, "%s; tracing %s", sock ? "connected to the monitor" : "capture mode",
       atomic_load(&A.tracing) ? "on" : "idle until a selection arrives");
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
  if (!loaded) cm__alog_init_level();
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
  atomic_store(&A.nvtx_injected, true);
  return rc;
}
