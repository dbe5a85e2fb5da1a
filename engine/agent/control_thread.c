/*
 * control_thread.c: the agent's control thread, and the effects of the monitor's frames that it
 * applies (control.c parses and bounds the frames, and calls these through cm__control_ops).
 *
 * Design note. After the handshake, the control thread reads the monitor's frames (SELECT,
 * CONFIGURE, FLUSH, PM requests) and owns the observer list: it is the only thread that calls
 * cm_observe and cm_unobserve, so an observer callback never does. It sleeps in poll() on the
 * socket and a wake-up pipe; the pipe wakes it when the monitor is gone (sendq.c) or at the exit.
 * Its timeout is that of the lag guard's next check or of a PM request still waiting for its
 * device, and none otherwise. When the monitor has gone it turns tracing off (tracing.c) and, in
 * dormant mode, tells the listener that the session is over. A FLUSH that arrives during the exit
 * is answered at once: the exit's fence owns the engine then.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "listen.h"
#include "agent_internal.h"

/* ---- the control frames' effects (control.c applies the frames) ----------------------------- */

static int ops_select(void *ud, const cm_selection *sel) {
  (void)ud;
  return cm__tracing_apply_selection(sel);
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
  cm__frames_push_stats();
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  if (cm_wire_write_flush_done(&b, id, status) == 0) cm__sendq_push_buf(&b, false, 0);
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
  if (cm_wire_write_pm_status(&b, rc, (uint32_t)device, text) == 0)
    cm__sendq_push_buf(&b, false, 0);
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
  cm__tracing_cadence_sync();
}

/* Replaces the PM consumers with the monitor's request and answers each entry with PM_STATUS
 * (an entry whose device is not ready yet later, from pm_retry). The old consumers go first, so
 * a device whose metrics change restarts once. Control thread. */
static void ops_pm(void *ud, const cm__pm_entry *en, int n, const char *refusal) {
  (void)ud;
  if (n < 0) {
    cm_wire_buf b;
    cm_wire_buf_init(&b);
    if (cm_wire_write_pm_status(&b, n, UINT32_MAX, refusal) == 0) cm__sendq_push_buf(&b, false, 0);
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
  cm__tracing_cadence_sync();
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

void cm__control_thread_init(void) { cm__control_init(&A.ctl, &control_ops, &A.cfg); }

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
      if (!atomic_load(&A.exiting)) cm__tracing_off();
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
        cm__sendq_monitor_gone(r == CM_ERANGE ? "a control frame over the agent's bound"
                                              : "bad frame from the monitor");
        reading = false;
      }
      break;
    }
    struct pollfd pf[2] = {{.fd = A.wake[0], .events = POLLIN},
                           {.fd = reading ? A.fd : -1, .events = POLLIN}};
    int tmo = A.npm_wait ? PM_RETRY_MS : -1;
    uint32_t gms = cm__guard_interval_ms(&A.guard);
    if (cm__tracing_guard_armed() && (tmo < 0 || (uint32_t)tmo > gms)) tmo = (int)gms;
    int pr = poll(pf, 2, tmo);
    pm_retry();
    cm__tracing_guard_tick();
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
        cm__sendq_monitor_gone(why);
        reading = false;
        continue;
      }
      if (cm__control_feed(&A.ctl, A.reader, buf, (size_t)r) != 0) {
        cm__sendq_monitor_gone("bad stream from the monitor");
        reading = false;
      }
    }
  }
  pm_wait_clear();
  return NULL;
}

/* ---- the session's threads ------------------------------------------------------------------ */

int cm__control_thread_start(void) {
  if (A.wake[0] < 0 && pipe2(A.wake, O_CLOEXEC) != 0) {
    alog(CM_LOG_ERROR, "pipe2: %s", strerror(errno));
    return -1;
  }
  if (pthread_create(&A.sender, NULL, cm__sendq_sender_main, NULL) != 0) {
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
