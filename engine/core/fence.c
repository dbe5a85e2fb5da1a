/*
 * fence.c: flushing, device synchronization and the fences of the engine.
 *
 * A plain flush asks CUPTI for the buffers it has completed and waits until the decode worker has
 * decoded them. The sync fence makes a window complete: it reads CUPTI's clock (the mark),
 * synchronizes the device with SYNCHRONIZATION enabled just for the fence, then flushes (never
 * forced) until the decoder has seen a sync record that ends at or past the mark.
 *
 * A monitor must never change what the application computes nor hold it up. The device is
 * synchronized on a helper thread in relaxed stream-capture mode, and not at all while a CUDA
 * stream capture is in progress anywhere in the process (callbacks.c watches captures begin and
 * end): a synchronize would invalidate it. A synchronize that misses its deadline (a kernel that
 * never ends) is abandoned to finish on its own, and no other starts while it is blocked. The exit
 * fence (cm__engine_exit_flush) bounds all of it by one deadline, and makes every wait of another
 * control call end at once. Every wait has a deadline; a missed one is counted (fence_timeouts)
 * and reported, never a hang.
 *
 * All of it runs on the thread of a control call, with engine.api_mu held (the exit fence takes
 * it with a deadline), except the device synchronize that precedes the decode worker's forced
 * flush (worker.c), which needs no engine lock.
 *
 * engine.c, worker.c and subscription.c call into this file; it reaches the rest of the engine
 * only through the state in engine.h, delivery.c (cm__engine_deliver, for the exit fence) and
 * log.c, and never calls back into them.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

/* True on the thread running the exit fence, whose own waits keep their deadlines. */
static _Thread_local bool t_exit_fence;

/* Whether a wait of the calling thread must end now: the exit fence runs on another thread. */
static bool hurried(cm_engine *e) { return atomic_load(&e->exiting) && !t_exit_fence; }
static bool hurried_cb(void *e) { return hurried(e); }

bool cm__engine_wait_decoded(cm_engine *e, uint64_t deadline) {
  bool ok = true;
  pthread_mutex_lock(&e->work_mu);
  uint64_t target = e->enqueued;
  while (e->decoded < target) {
    uint64_t now = cm__mono_ms();
    if (now >= deadline || hurried(e)) {
      ok = false;
      break;
    }
    struct timespec ts;
    cm__abstime_in(&ts, deadline - now);
    pthread_cond_timedwait(&e->done_cv, &e->work_mu, &ts);
  }
  pthread_mutex_unlock(&e->work_mu);
  return ok;
}

/* One device synchronize on a helper thread. The waiter and the helper share the job; the last
 * of the two to leave frees it. The helper works from a copy of the binding table, so it never
 * touches the engine, which may be freed while an abandoned helper is still blocked. */
typedef struct sync_job {
  cm__job job;  /* first (job.c) */
  int synced;   /* written by the helper before done */
  void *cur;    /* the caller's current context, synchronized first */
  cm__cupti c;
} sync_job;

/* Synchronizes the caller's current context and every active primary context, in relaxed capture
 * mode. Returns the number of contexts synchronized. Runs on the helper thread. */
static int sync_contexts(const cm__cupti *c, void *cur) {
  int synced = 0;
  int mode = 2; /* CU_STREAM_CAPTURE_MODE_RELAXED */
  bool relaxed = c->cuThreadExchangeStreamCaptureMode &&
                 c->cuThreadExchangeStreamCaptureMode(&mode) == 0;
  if (cur && c->cuCtxPushCurrent && c->cuCtxPopCurrent && c->cuCtxPushCurrent(cur) == 0) {
    if (c->cuCtxSynchronize() == 0) synced++;
    void *popped = NULL;
    c->cuCtxPopCurrent(&popped);
  }
  int ndev = 0;
  if (c->cuDeviceGetCount && c->cuDevicePrimaryCtxGetState && c->cuDevicePrimaryCtxRetain &&
      c->cuDevicePrimaryCtxRelease && c->cuCtxPushCurrent && c->cuCtxPopCurrent &&
      c->cuDeviceGetCount(&ndev) == 0) {
    for (int d = 0; d < ndev; d++) {
      unsigned flags = 0;
      int active = 0;
      if (c->cuDevicePrimaryCtxGetState(d, &flags, &active) != 0 || !active) continue;
      void *ctx = NULL;
      if (c->cuDevicePrimaryCtxRetain(&ctx, d) != 0) continue;
      /* A primary context that is the caller's current one was synchronized above. */
      if (ctx != cur && c->cuCtxPushCurrent(ctx) == 0) {
        if (c->cuCtxSynchronize() == 0) synced++;
        void *popped = NULL;
        c->cuCtxPopCurrent(&popped);
      }
      c->cuDevicePrimaryCtxRelease(d);
    }
  }
  if (relaxed) c->cuThreadExchangeStreamCaptureMode(&mode); /* restores the previous mode */
  return synced;
}

static void *sync_helper_main(void *arg) {
  pthread_setname_np(pthread_self(), "cm-sync");
  sync_job *j = arg;
  int synced = sync_contexts(&j->c, j->cur);
  /* The count drops before `done` is published, so a waiter that saw this sync finish may start
   * the next one at once. */
  atomic_fetch_sub(&cm__sync_helpers, 1);
  j->synced = synced;
  cm__job_finish(&j->job);
  cm__job_release(&j->job);
  return NULL;
}

/* Synchronizes every active primary context and the calling thread's current context on a helper
 * thread, waiting for it until `deadline` (mono ms). Returns the number of contexts synchronized;
 * 0 means there was no GPU work to wait for, no libcuda, or no sync: *why then says CM__SYNC_CAPTURE
 * (a stream capture is in progress), CM__SYNC_BUSY (an abandoned sync is still blocked),
 * CM__SYNC_ABANDONED (this one did not finish by the deadline) or CM__SYNC_NONE. */
int cm__engine_device_sync(cm_engine *e, uint64_t deadline, int *why) {
  cm__cupti *c = &e->cupti;
  *why = CM__SYNC_NONE;
  if (!c->cuCtxSynchronize || !c->cuCtxGetCurrent) return 0;
  /* At most one helper at a time: a second one would only block behind the first. The helper
   * is counted before the capture check, and a capture that begins counts itself before it waits
   * for the helpers to finish (callbacks.c): with both orders sequentially consistent, either this
   * check sees the capture, or the capture waits for this synchronize. */
  int expected = 0;
  if (!atomic_compare_exchange_strong(&cm__sync_helpers, &expected, 1)) {
    ADD(e, st_sync_skipped_busy, 1);
    *why = CM__SYNC_BUSY;
    return 0;
  }
  if (cm__callbacks_captures_active(atomic_load(&e->cb)) > 0) {
    atomic_fetch_sub(&cm__sync_helpers, 1);
    if (ADD(e, st_sync_skipped_capture, 1) == 0)
      cm__engine_log(e, CM_LOG_INFO, "a CUDA stream capture is in progress: sync flushes do not synchronize "
                           "the device until it ends (a synchronize would invalidate the capture)");
    *why = CM__SYNC_CAPTURE;
    return 0;
  }
  sync_job *j = calloc(1, sizeof *j);
  if (!j) {
    atomic_fetch_sub(&cm__sync_helpers, 1);
    return 0;
  }
  j->c = *c;
  void *cur = NULL;
  if (c->cuCtxGetCurrent(&cur) == 0) j->cur = cur;
  if (cm__job_start(&j->job, sync_helper_main) != 0) {
    atomic_fetch_sub(&cm__sync_helpers, 1);
    free(j);
    return 0;
  }
  /* Waits in short slices, so that the exit fence's hurry is seen within a few milliseconds. */
  bool done = cm__job_wait(&j->job, deadline, 5, hurried_cb, e);
  int synced = done ? j->synced : 0;
  cm__job_release(&j->job);
  if (!done) {
    if (ADD(e, st_sync_abandoned, 1) == 0)
      cm__engine_log(e, CM_LOG_WARN, "a device synchronize did not finish before the fence's deadline (a "
                           "kernel still running?); it is left to finish on its own, and no fence "
                           "synchronizes until it has");
    *why = CM__SYNC_ABANDONED;
    return 0;
  }
  *why = synced ? CM__SYNC_OK : CM__SYNC_NONE;
  return synced;
}

bool cm__engine_plain_flush(cm_engine *e, uint64_t deadline, uint32_t flag) {
  e->cupti.ActivityFlushAll(flag);
  return cm__engine_wait_decoded(e, deadline);
}

/* How long the exit fence waits for its sync record with default flushes before it forces them.
 * After a long run of sustained launches from several threads, default flushes may not return
 * the sync record within the budget (nor a thread's earlier records in a partly filled buffer),
 * while a forced flush after a completed synchronize delivers them. */
#define CM__EXIT_DEFAULT_FLUSH_MS 50

/* How long the exit's fence, once its sync record has come, waits, flushing, for records from
 * before its mark to stop arriving, once some arrived after that record (CUPTI behind on a
 * kind). */
#define CM__FENCE_QUIET_MS 50

static uint64_t before_count(cm_engine *e) {
  pthread_mutex_lock(&e->dec_mu);
  uint64_t n = cm__decoder_before_count(e->dec);
  pthread_mutex_unlock(&e->dec_mu);
  return n;
}

/* The exit fence's last part, once its own sync record has been decoded. That record proves that
 * CUPTI has written the SYNCHRONIZATION records before it, not that it has written every kind's.
 * Kinds share buffers, and CUPTI's worker can be seconds behind on one of them (kernel records,
 * timed on the device) while the API and sync records of the same time arrive on time; a fence
 * that stopped at its sync record (the exit's among them) then left the records CUPTI still held
 * behind, uncounted. So the exit's fence flushes on while
 * records from before its mark keep arriving: it ends at once when none came during the fence,
 * else at the first flush that brings none, or, once some came after the sync record, after
 * CM__FENCE_QUIET_MS without any. At the deadline it fails, and the exit's account says that CUPTI
 * was still delivering (the tail is then unknown). `force_at`: when it forces its flushes. Mid-run
 * fences do not wait so: they mark windows' edges, and their lateness is a lag that the stage lags
 * show (lag_cupti_ns), not a loss; at exit, what is not waited for is lost. */
static bool drain_before_mark(cm_engine *e, uint64_t deadline, uint64_t force_at, cm__exit_flush *ex) {
  uint64_t seen = before_count(e), late = 0;
  /* No record from before the mark came during the fence at all: nothing was in flight (an idle
   * process), or the records are not on CUPTI's realtime clock (a test double's fixed dates), and
   * there is nothing to wait for. CUPTI behind on a kind shows in the buffers of the fence's own
   * flushes, which then carry records from before the mark. */
  if (seen == 0) return true;
  uint64_t quiet_since = cm__mono_ms();
  for (;;) {
    bool forced = cm__mono_ms() >= force_at;
    cm__engine_plain_flush(e, deadline, forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
    uint64_t n = before_count(e), now = cm__mono_ms();
    if (n > seen) {
      late += n - seen;
      seen = n;
      quiet_since = now;
      atomic_store(&ex->backlog_records, late);
    } else if (!late || now - quiet_since >= CM__FENCE_QUIET_MS) {
      break;
    }
    if (now >= deadline || hurried(e)) {
      atomic_store(&ex->backlog_cut, true);
      cm__engine_log(e, CM_LOG_WARN,
                     "the exit fence's deadline came while CUPTI was still delivering records from "
                     "before it (%llu after its sync record): CUPTI is behind, and what it still "
                     "holds is not delivered",
                     (unsigned long long)late);
      return false;
    }
    usleep(1000);
  }
  if (late)
    cm__engine_log(e, CM_LOG_INFO,
                   "the exit's fence waited for %llu records from before it that CUPTI delivered "
                   "after its sync record (CUPTI was behind on some kind)",
                   (unsigned long long)late);
  return true;
}

/* The sync fence. `ex` is the exit's account, NULL for the fences of control calls: those
 * flush only by default, since a forced flush mid-run would deliver records of work launched
 * after the mark before it completes (a running kernel's record with end 0). At exit nothing is
 * launched after the fence, the device has just been synchronized, and a forced flush is what
 * returns the buffers of threads that stopped launching. */
static bool fence(cm_engine *e, uint64_t deadline, int *why, cm__exit_flush *ex) {
  cm__cupti *c = &e->cupti;
  ADD(e, st_fences, 1);
  bool temp_sync = !(e->enabled >> CM_KIND_SYNCHRONIZATION & 1);
  if (temp_sync && c->ActivityEnable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION) != CUPTI_SUCCESS)
    temp_sync = false;
  uint64_t mark = 0;
  c->GetTimestamp(&mark);
  if (ex) {
    pthread_mutex_lock(&e->dec_mu);
    cm__decoder_watch_before(e->dec, mark);
    pthread_mutex_unlock(&e->dec_mu);
  }
  int synced = cm__engine_device_sync(e, deadline, why);
  bool ok = true;
  if (synced == 0) {
    /* Without a sync the fence holds only when there was nothing to wait for, or when it must not
     * wait (a capture); a synchronize that is blocked means the device is still busy. */
    ok = cm__engine_plain_flush(e, deadline, 0) && *why != CM__SYNC_ABANDONED && *why != CM__SYNC_BUSY;
  } else {
    uint64_t last_sync = cm__mono_ms();
    uint64_t force_at = ex ? last_sync + CM__EXIT_DEFAULT_FLUSH_MS : UINT64_MAX;
    if (ex) atomic_store(&ex->device_synced_ms, last_sync);
    for (;;) {
      bool forced = cm__mono_ms() >= force_at;
      ok = cm__engine_plain_flush(e, deadline, forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
      if (ex && !forced) atomic_fetch_add(&ex->default_flushes, 1);
      pthread_mutex_lock(&e->dec_mu);
      uint64_t seen = cm__decoder_sync_end(e->dec);
      pthread_mutex_unlock(&e->dec_mu);
      if (seen >= mark) {
        if (ex && forced) atomic_store(&ex->seen_after_forced, true);
        /* The exit's fence only: a mid-run fence marks a window's edge, and flushing on after its
         * sync record would move the window's records to the wrong side of it. */
        if (ex) ok = drain_before_mark(e, deadline, force_at, ex);
        break;
      }
      uint64_t now = cm__mono_ms();
      if (now >= deadline || hurried(e)) {
        ok = false;
        break;
      }
      /* The sync record itself can be lost: when the pool was at its bound, CUPTI had no buffer
       * to write it into (it is counted as dropped). The flushes above have since returned
       * buffers, so synchronizing again produces a new record past the mark. */
      if (now - last_sync >= 20) {
        int why2;
        cm__engine_device_sync(e, deadline, &why2);
        last_sync = now;
      }
      usleep(1000);
    }
  }
  if (ex) {
    pthread_mutex_lock(&e->dec_mu);
    cm__decoder_watch_before(e->dec, 0);
    pthread_mutex_unlock(&e->dec_mu);
  }
  if (temp_sync) c->ActivityDisable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  if (!ok) ADD(e, st_fence_timeouts, 1);
  return ok;
}

/* The sync fence: every record produced before the call is decoded when it returns true. Called
 * with api_mu held; delivers nothing itself. When the device cannot be synchronized (a stream
 * capture is in progress, or an earlier synchronize is still blocked) it degrades to a plain flush,
 * which delivers what CUPTI has completed; a synchronize that misses the deadline, or one still
 * blocked from an earlier fence, fails the fence.
 * *why receives the device_sync outcome of the first synchronize. */
bool cm__engine_fence(cm_engine *e, uint64_t deadline, int *why) { return fence(e, deadline, why, NULL); }

int cm__engine_exit_flush(cm_engine *e, uint64_t sync_deadline, uint64_t deadline,
                          cm__exit_flush *out) {
  /* Field by field, not memset: another thread may read fence_complete meanwhile. */
  out->engine_busy = out->capture_active = out->sync_timed_out = out->decode_timed_out = false;
  out->synced = false;
  atomic_store(&out->fence_complete, false);
  atomic_store(&out->fence_end_ms, 0);
  atomic_store(&out->device_synced_ms, 0);
  atomic_store(&out->default_flushes, 0);
  atomic_store(&out->seen_after_forced, false);
  atomic_store(&out->backlog_records, 0);
  atomic_store(&out->backlog_cut, false);
  if (!e) return CM_EINVAL;
  /* Another control call (a monitor's sync flush) may hold api_mu while it waits for the device:
   * `exiting` ends its waits, and the broadcast wakes one waiting for the decoder. */
  atomic_store(&e->exiting, true);
  pthread_mutex_lock(&e->work_mu);
  pthread_cond_broadcast(&e->done_cv);
  pthread_mutex_unlock(&e->work_mu);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t now = cm__mono_ms();
  uint64_t left = deadline > now ? deadline - now : 0;
  ts.tv_sec += (time_t)(left / 1000);
  ts.tv_nsec += (long)(left % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  if (pthread_mutex_timedlock(&e->api_mu, &ts) != 0) {
    out->engine_busy = true;
    return CM_ETIMEDOUT;
  }
  t_exit_fence = true;
  bool ok = true;
  if (e->active) {
    int why = CM__SYNC_NONE;
    uint64_t sd = sync_deadline < deadline ? sync_deadline : deadline;
    bool fenced = fence(e, sd, &why, out);
    out->capture_active = why == CM__SYNC_CAPTURE;
    /* CM__SYNC_BUSY: an earlier synchronize is still blocked, so the device is still busy too. */
    out->sync_timed_out = why == CM__SYNC_ABANDONED || why == CM__SYNC_BUSY ||
                          (why == CM__SYNC_OK && !fenced && !atomic_load(&out->backlog_cut));
    out->synced = fenced && why == CM__SYNC_OK;
    if (out->synced) atomic_store_explicit(&out->fence_complete, true, memory_order_release);
    atomic_store_explicit(&out->fence_end_ms, cm__mono_ms(), memory_order_release);
    /* Forced: buffers still being filled are delivered too (a running kernel's record with end 0). */
    if (!cm__engine_plain_flush(e, deadline, CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)) out->decode_timed_out = true;
    ok = !out->sync_timed_out && !out->decode_timed_out && !atomic_load(&out->backlog_cut);
  }
  pthread_mutex_lock(&e->dec_mu);
  cm__engine_deliver(e);
  pthread_mutex_unlock(&e->dec_mu);
  t_exit_fence = false;
  pthread_mutex_unlock(&e->api_mu);
  return ok ? 0 : CM_ETIMEDOUT;
}
