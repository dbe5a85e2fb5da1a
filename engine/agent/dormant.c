/*
 * dormant.c: dormant mode's sessions (CUPTIMON_LISTEN=1), the agent's side of listen.c.
 *
 * Design note. listen.c owns the socket, the credentials check and the session lock; it runs each
 * session through the callbacks here (cm__listen_ops), and knows the agent by nothing else. A
 * session is a live connection like any other: the engine (created on the first one, with no
 * cadence, so that between sessions its worker sleeps), HELLO and SCHEMA, the monitor's answer,
 * then the sender and control threads. Its end stops and joins them, closes the socket, turns
 * every kind off, detaches CUPTI, drops the pool's free buffers and restores the dormant
 * configuration; each session's STATS count from its own start (A.base).
 *
 * Threads: the listener thread calls the session callbacks, one at a time, under listen.c's
 * session lock; between sessions no agent thread runs and no observer is registered, so the
 * listener owns A then. The exit handler (listen.c's) calls ops_exit under the same lock.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "listen.h"
#include "agent_internal.h"

static bool ops_attached(void *ud) {
  (void)ud;
  return atomic_load(&A.active);
}

static bool ops_session_gone(void *ud) {
  (void)ud;
  return atomic_load(&A.active) && atomic_load(&A.gone);
}

static void ops_exit(void *ud, int exit_code) {
  (void)ud;
  cm__exit_work(exit_code);
}

static void ops_log(void *ud, int level, const char *msg) {
  (void)ud;
  alog(level, "%s", msg);
}

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

static bool session_end(void *ud, uint64_t deadline);

/* Starts a session on the connected socket `fd` (listen.h, cm__listen_ops.session_begin). */
static int session_begin(void *ud, int fd, uint64_t deadline, int preempt_fd) {
  (void)ud;
  if (!A.eng) {
    /* The first attach: the engine (libcupti, the subscription) starts here, on the listener
     * thread, with no cadence, so that between sessions its worker sleeps. */
    char why[1024];
    int rc = cm__tracing_start_engine(0, why, sizeof why);
    if (rc) {
      alog(CM_LOG_ERROR, "dormant: cannot start the engine: %s", why);
      A.fd = fd;
      A.is_socket = true;
      cm__handshake_report_failure("", why, deadline, false);
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
  int rc = cm__handshake_hello_schema(&b, "");
  if (!rc && cm__sendq_write_all(A.fd, true, b.data, b.len, deadline) != 0) rc = CM_EIO;
  cm_wire_buf_free(&b);
  if (!rc) rc = cm_wire_reader_new(&A.reader, 0);
  if (!rc) {
    cm__control_thread_init();
    int32_t st = cm__handshake_await_ack(deadline, preempt_fd);
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
  if (!rc && cm__control_thread_start() != 0) rc = CM_EIO;
  if (rc) {
    /* Threads that did start exit on the dead queue; the end of the session joins them. */
    atomic_store(&A.active, true);
    cm__sendq_monitor_gone("the attach failed");
    session_end(NULL, deadline + 5000);
    return rc;
  }
  atomic_store(&A.active, true);
  return 0;
}

/* Ends the session whose monitor is gone (listen.h, cm__listen_ops.session_end). */
static bool session_end(void *ud, uint64_t deadline) {
  (void)ud;
  bool ok = true;
  cm__sendq_monitor_gone("detached"); /* idempotent: the queue dies and the sender stops */
  atomic_store(&A.ctl_stop, true);
  cm__sendq_wake_control();
  if (A.fd >= 0) shutdown(A.fd, SHUT_RDWR);
  if (A.control_started) ok &= cm__exit_join(A.control, "control", deadline);
  if (A.sender_started) ok &= cm__exit_join(A.sender, "sender", deadline);
  A.control_started = A.sender_started = false;
  if (!ok) return false;
  if (A.fd >= 0) close(A.fd);
  A.fd = -1;
  /* Every kind off (a no-op when the control thread did it already), then the pool's free
   * buffers go, CUPTI is detached, and the dormant configuration (no cadence) comes back. */
  if (A.nobs) cm__tracing_apply_selection(NULL);
  cm__tracing_detach_idle(true);
  if (A.eng) {
    if (cm_configure(A.eng, &A.idle_cfg) == 0) A.cfg = A.idle_cfg;
    cm__engine_trim(A.eng);
  }
  atomic_store(&A.active, false);
  return true;
}

static const cm__listen_ops listen_ops = {
    .session_begin = session_begin,
    .session_end = session_end,
    .attached = ops_attached,
    .session_gone = ops_session_gone,
    .exit = ops_exit,
    .log = ops_log,
};

bool cm__dormant_start(void) {
  A.def_max_bytes = A.max_bytes;
  return cm__listen_start(&listen_ops);
}
