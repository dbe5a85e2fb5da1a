/*
 * exit.c: the agent's exit: a final fence, the last batches, STATS and BYE, within one budget.
 *
 * Design note. The exit handler (on_exit with glibc, atexit elsewhere; listen.c's handler runs it
 * for a dormant agent's session) runs on the thread that calls exit(). All of its work fits in
 * CUPTIMON_EXIT_BUDGET_MS, whatever the device (a kernel still running), the engine (a monitor's
 * sync flush in progress) or the monitor (one that stopped reading) do, in four steps, each with
 * its part of the budget: the fence (exit_fence), the drain (exit_drain), the last frames
 * (exit_last_frames) and the threads' stop (exit_stop). What the budget cut off is counted in
 * STATS (records_dropped_exit) where it can be, and said in BYE's message and the log either way.
 * The fence runs on a helper thread that the handler may leave behind at its deadline; the engine
 * is never freed, since CUPTI's threads may still call its callbacks during the teardown. In a
 * forked child (the agent's threads do not exist there) it does nothing.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "agent_internal.h"

/* Joins `t` unless `deadline` (mono ms) passes first; then the thread is left behind, logged, and
 * it returns false. */
bool cm__exit_join(pthread_t t, const char *name, uint64_t deadline) {
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

/* What one exit has done so far: its deadlines, what its steps took, and what the budget cut (for
 * BYE and the last log line). */
typedef struct exit_run {
  uint64_t t0, end, reserve;
  /* The fence's two parts, for the log: the sync fence, then the forced flush (its wait). */
  uint64_t exit_sync_ms, exit_forced_ms;
  uint64_t fence_ms, drain_ms;
  char sync_how[256]; /* how the sync fence went, for the log */
  char cut[1024];     /* "; "-separated clauses: what the budget cut */
  size_t cl;
  size_t left;        /* frames still queued when the last frames' wait ended */
  bool bye_queued;    /* BYE was built and queued */
} exit_run;

#define CUT(...) cut_add(r->cut, sizeof r->cut, &r->cl, __VA_ARGS__)

/* 1. The fence: the sync fence (the device's synchronize and the flushes until its record is
 * decoded) gets nine tenths of the fence's part, which by default is all of the budget but its
 * last tenth; the forced flush and the decoder may use the rest of it (what they deliver is
 * queued as it comes, so the drain overlaps them). The sync fence gets the most because it is
 * what makes the tail known: with many launching threads CUPTI can be more than a second
 * behind at exit, and a smaller sync part leaves the tail unknown. Another control call
 * holding the engine is hurried out of the way. */
static void exit_fence(exit_run *r) {
  uint64_t t0 = r->t0, end = r->end, reserve = r->reserve;
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
      r->exit_sync_ms = fe >= t0 ? fe - t0 : done - t0;
      r->exit_forced_ms = fe >= t0 ? done - fe : 0;
      uint64_t ds = atomic_load(&ef.device_synced_ms);
      uint64_t late = atomic_load(&ef.backlog_records);
      char late_how[96] = "";
      if (late)
        snprintf(late_how, sizeof late_how, "; %llu records from before it came after its record",
                 (unsigned long long)late);
      if (ds >= t0)
        snprintf(r->sync_how, sizeof r->sync_how, " (the device synchronized in %llu ms; %u default flushes%s%s)",
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
}

/* 2. The drain, until its part or the budget's last tenth, whichever comes first. */
static void exit_drain(exit_run *r) {
  uint64_t t0 = r->t0, end = r->end, reserve = r->reserve;
  {
    pthread_mutex_lock(&A.send_mu);
    size_t queued = A.q_frames;
    pthread_mutex_unlock(&A.send_mu);
    /* Tests wait for this line to know that every record has passed the observer. */
    alog(CM_LOG_INFO, "exit: the final flush is done; %zu frames to send", queued);
  }

  pthread_mutex_lock(&A.send_mu);
  struct timespec ts;
  uint64_t drain_start = cm__mono_ms();
  r->fence_ms = drain_start - t0;
  uint64_t drain_end = min_u64(drain_start + A.exit_drain_ms, end - reserve);
  uint64_t now = cm__mono_ms();
  cm__abstime_in(&ts, drain_end > now ? drain_end - now : 0);
  while ((A.head || A.sending) && !A.q_dead)
    if (pthread_cond_timedwait(&A.idle_cv, &A.send_mu, &ts) == ETIMEDOUT) break;
  r->drain_ms = cm__mono_ms() - drain_start;
  uint64_t purged = 0, purged_batches = 0;
  if (!A.q_dead && A.head) {
    atomic_store(&A.cut, true);
    purged = cm__sendq_purge_batches_locked(&purged_batches);
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
}

/* 3. STATS and BYE (with what was cut), then the rest of the budget for them to leave. Returns
 * whether the queue drained. */
static bool exit_last_frames(exit_run *r, int exit_code) {
  uint64_t end = r->end, reserve = r->reserve;
  cm__frames_push_stats();
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  char msg[1100];
  snprintf(msg, sizeof msg, "%s%s", r->cl ? "exit budget: " : "", r->cut);
  r->bye_queued =
      cm_wire_write_bye(&b, CM_WIRE_BYE_EXIT, exit_code, msg) == 0 && cm__sendq_push_bye(&b);
  cm_wire_buf_free(&b);
  pthread_mutex_lock(&A.send_mu);
  A.q_closed = true;
  A.sender_stop = true;
  pthread_cond_signal(&A.q_cv);
  struct timespec ts;
  uint64_t now = cm__mono_ms();
  uint64_t last_end = end - reserve / 2;
  cm__abstime_in(&ts, last_end > now ? last_end - now : 0);
  while ((A.head || A.sending) && !A.q_dead)
    if (pthread_cond_timedwait(&A.idle_cv, &A.send_mu, &ts) == ETIMEDOUT) break;
  bool drained = !A.head && !A.sending;
  r->left = A.q_frames;
  pthread_mutex_unlock(&A.send_mu);
  return drained;
}

/* 4. The threads' stop, and the descriptor's close. */
static void exit_stop(const exit_run *r, bool drained) {
  uint64_t end = r->end;
  /* What is still queued now is lost to the exit deadline. */
  atomic_store(&A.cut, true);
  /* A sender blocked in send() on a monitor that does not read is released by the shutdown;
   * the threads get what is left of the budget to stop. Whether BYE got out is known only once
   * the sender has stopped (a frame it was writing at the deadline may still have gone whole),
   * so that is what the log says, and the monitor's account agrees with it: without BYE it
   * reports the process as incomplete. */
  bool was_gone = atomic_load(&A.gone);
  if (A.is_socket && A.fd >= 0) shutdown(A.fd, SHUT_RDWR);
  if (!drained) cm__sendq_monitor_gone("closed at exit");
  atomic_store(&A.ctl_stop, true);
  cm__sendq_wake_control();
  if (A.sender_started) cm__exit_join(A.sender, "sender", end);
  if (A.sender_started && !was_gone && !atomic_load(&A.sender_drained)) {
    if (!r->bye_queued)
      alog(CM_LOG_WARN, "exit: BYE could not be built or queued; the monitor reports this process "
                        "as incomplete");
    else
      alog(CM_LOG_WARN,
           "the %s did not take the last %zu frames within the exit budget (%u ms); closed "
           "without them (STATS and BYE among them): the monitor reports this process as "
           "incomplete",
           A.is_socket ? "monitor" : "capture file", r->left, A.exit_budget_ms);
  }
  if (A.control_started) cm__exit_join(A.control, "control", end);
  if (A.fd >= 0) close(A.fd);
  A.fd = -1;
  atomic_store(&A.active, false);
}

/* The exit's last log line: what was sent, what was lost where, and what each step took. */
static void exit_report(const exit_run *r) {
  cm_stats st;
  memset(&st, 0, sizeof st);
  cm_stats_get(A.eng, &st);
  cm__alog_drain_repeats();
  int lvl = GET(batches_dropped) || st.records_dropped || r->cl ? CM_LOG_WARN : CM_LOG_INFO;
  alog(lvl,
       "exit: %llu batches (%llu records) sent, %llu batches dropped: %llu records by the agent "
       "(%s), %llu records at the exit deadline; %llu records dropped "
       "by CUPTI, %llu bytes, %llu ms of a %u ms budget (fence %llu ms: sync %llu ms%s, forced "
       "flush %llu ms; drain %llu ms)%s%s",
       (unsigned long long)GET(batches_sent), (unsigned long long)GET(records_sent),
       (unsigned long long)GET(batches_dropped), (unsigned long long)GET(records_dropped_agent),
       A.is_socket ? "queue full or connection lost" : "queue full or the capture file not written",
       (unsigned long long)GET(records_dropped_exit), (unsigned long long)st.records_dropped,
       (unsigned long long)GET(bytes_sent), (unsigned long long)(cm__mono_ms() - r->t0),
       A.exit_budget_ms, (unsigned long long)r->fence_ms, (unsigned long long)r->exit_sync_ms,
       r->sync_how, (unsigned long long)r->exit_forced_ms, (unsigned long long)r->drain_ms,
       r->cl ? "; " : "", r->cut);
}

#undef CUT

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
void cm__exit_work(int exit_code) {
  if (getpid() != A.pid || !atomic_load(&A.active)) return;
  atomic_store(&A.exiting, true);
  exit_run r;
  memset(&r, 0, sizeof r);
  r.t0 = cm__mono_ms();
  r.end = r.t0 + A.exit_budget_ms;
  r.reserve = A.exit_budget_ms / 10 < 20 ? 20 : A.exit_budget_ms / 10;
  if (r.reserve > A.exit_budget_ms) r.reserve = A.exit_budget_ms;
  exit_fence(&r);
  exit_drain(&r);
  bool drained = exit_last_frames(&r, exit_code);
  exit_stop(&r, drained);
  exit_report(&r);
  /* The engine is left alive: CUPTI's threads may still call its callbacks during teardown. */
}

#ifdef __GLIBC__
/* glibc's on_exit handlers receive the status given to exit() (main's return value too). */
static void agent_on_exit(int status, void *arg) {
  (void)arg;
  cm__exit_work(status & 0xff);
}
#define REGISTER_EXIT_HANDLER() on_exit(agent_on_exit, NULL)
#else
static void agent_atexit(void) { cm__exit_work(-1); }
#define REGISTER_EXIT_HANDLER() atexit(agent_atexit)
#endif

void cm__exit_register(void) { REGISTER_EXIT_HANDLER(); }
