/*
 * worker.c: the decode worker, the engine's own thread ("cm-decode"). It pops the buffers CUPTI
 * completed (queued by the completion callback, subscription.c), decodes them under
 * engine.dec_mu into the decoder's columns, returns them to the pool, and runs the cadences:
 * delivery every deliver_ms (and whenever a kind holds batch_records), a plain
 * cuptiActivityFlushAll every self_flush_ms (self-flush, off by default), and the one forced flush
 * that cm__engine_flush_forced_async asks for. It stores the stage lags of every buffer it decodes
 * (cm_stats).
 *
 * Threads and locks. The worker looks at the queue and at its control (cadences, stop, the forced
 * flush, a detach under way) with engine.work_mu held, and drops it for every CUPTI call and for
 * decoding, so the completion callback that queues a buffer never waits on either. It takes
 * dec_mu only with work_mu dropped (the lock order puts dec_mu first). While it is inside a CUPTI
 * call, worker_in_cupti says so (under work_mu, done_cv signals its end), and a detach waits until
 * it is not; while CUPTI is detached, or being detached, it makes no CUPTI call at all. Control
 * calls start and stop it, and change its cadences under work_mu, signalling q_cv.
 */
#include <time.h>

#include "engine.h"

static bool held_over(cm_engine *e, uint32_t limit) {
  for (int k = 0; k < CM_KIND_MAX; k++)
    if (cm__decoder_count(e->dec, k) >= limit) return true;
  return false;
}

uint64_t cm__engine_take_lag_held_max(cm_engine *e) {
  return atomic_exchange_explicit(&e->lag_held_max_ns, 0, memory_order_relaxed);
}

/* Stores the stage lags of one decoded buffer whose last record has timestamp `newest` (0:
 * none), and how long CUPTI held that record before asking for the buffer (at `requested`) that
 * it then wrote it into (lag_held_max_ns). A timestamp that is not on the realtime clock of this
 * run (a test double's fixed dates, a clock more than an hour off) is no measure of lag and is
 * ignored. */
static void note_lag(cm_engine *e, uint64_t newest, uint64_t requested, uint64_t completed,
                     uint64_t started) {
  uint64_t now = cm__realtime_ns();
  const uint64_t hour = 3600ull * 1000000000ull;
  atomic_store_explicit(&e->decode_wait_ns, started > completed ? started - completed : 0,
                        memory_order_relaxed);
  if (!newest || newest > now + 1000000000ull || now - newest > hour) return;
  uint64_t lag = now > newest ? now - newest : 0;
  atomic_store_explicit(&e->lag_cupti_ns, completed > newest ? completed - newest : 0,
                        memory_order_relaxed);
  cm__atomic_max_u64(&e->lag_held_max_ns, requested > newest ? requested - newest : 0);
  atomic_store_explicit(&e->lag_decode_ns, lag, memory_order_relaxed);
  if (lag > atomic_load_explicit(&e->lag_decode_peak_ns, memory_order_relaxed))
    atomic_store_explicit(&e->lag_decode_peak_ns, lag, memory_order_relaxed);
}

/* The worker's delivery: called and returning with work_mu held, which it drops meanwhile (the
 * lock order puts dec_mu before work_mu). */
static void worker_deliver(cm_engine *e) {
  pthread_mutex_unlock(&e->work_mu);
  pthread_mutex_lock(&e->dec_mu);
  cm__engine_deliver(e);
  pthread_mutex_unlock(&e->dec_mu);
  pthread_mutex_lock(&e->work_mu);
}

/* The worker's CUPTI call has returned: a detach waiting for it may go on. work_mu held. */
static void worker_left_cupti(cm_engine *e) {
  e->worker_in_cupti = false;
  pthread_cond_broadcast(&e->done_cv);
}

static void *worker_main(void *arg) {
  cm_engine *e = arg;
  pthread_setname_np(pthread_self(), "cm-decode");
  uint64_t next_flush = 0, next_deliver = 0, flush_said_ms = 0;
  pthread_mutex_lock(&e->work_mu);
  for (;;) {
    /* Cadences first, so a queue that never runs empty cannot starve delivery. */
    uint64_t now = cm__mono_ms();
    /* While CUPTI is detached, or being detached, the worker makes no CUPTI call: no periodic
     * flush, and a forced flush asked for meanwhile is dropped (there is nothing to flush). */
    bool no_cupti = e->detaching || atomic_load(&e->detached);
    uint32_t fl = no_cupti ? 0 : e->self_flush_ms, dl = e->deliver_ms;
    if (e->forced_wanted && no_cupti) e->forced_wanted = false;
    if (e->forced_wanted) {
      /* Asked for by cm__engine_flush_forced_async. Outside the lock, as every CUPTI call here:
       * the buffers it completes are queued by the completion callback, which takes work_mu. A
       * forced flush returns the records of work still running with an end of 0, so the device
       * is synchronized first (on a helper that the deadline abandons, as a fence's): the work
       * traced before the call has then completed. When it cannot be (a stream capture, a
       * synchronize still blocked), no flush is forced, and the records wait for the next
       * fence, as they did before. The synchronize holds the engine's one sync helper while it
       * runs: an exit fence that comes in those milliseconds finds it busy and reports the tail
       * as unknown (the LOST line, status 3), a false alarm that is said, never a silent loss. */
      e->forced_wanted = false;
      uint32_t ms = e->forced_sync_ms;
      e->worker_in_cupti = true;
      pthread_mutex_unlock(&e->work_mu);
      /* At exit the exit's fence synchronizes and forces its own flush, and this one would only
       * hold the sync helper it needs. */
      if (atomic_load(&e->exiting)) {
        pthread_mutex_lock(&e->work_mu);
        worker_left_cupti(e);
        continue;
      }
      int why = CM__SYNC_NONE;
      int synced = cm__engine_device_sync(e, cm__mono_ms() + ms, &why);
      bool force = synced > 0 || why == CM__SYNC_NONE;
      if (force)
        e->cupti.ActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
      else
        cm__engine_log(e, CM_LOG_INFO, "the device could not be synchronized (%s): CUPTI's partly "
                       "filled buffers are not flushed now, and arrive at the next fence",
                       why == CM__SYNC_CAPTURE ? "a stream capture is in progress"
                       : why == CM__SYNC_BUSY  ? "an earlier synchronize is still blocked"
                                               : "it did not finish in time");
      pthread_mutex_lock(&e->work_mu);
      worker_left_cupti(e);
      e->deliver_wanted = force;
      continue;
    }
    if (fl && now >= next_flush) {
      e->worker_in_cupti = true;
      pthread_mutex_unlock(&e->work_mu);
      uint64_t f0 = cm__mono_ms();
      e->cupti.ActivityFlushAll(0);
      uint64_t took = cm__mono_ms() - f0;
      /* The next flush is a cadence after this one returned, not after it began: a flush that
       * takes longer than the cadence (CUPTI behind) would otherwise be followed by another at
       * once, and the worker would flush on and never decode what the flushes completed. */
      next_flush = f0 + took + fl;
      /* A flush that takes long is CUPTI behind: said when it first passes 250 ms, and each time
       * it doubles the longest said so far. */
      if (took >= 250 && took >= 2 * flush_said_ms) {
        flush_said_ms = took;
        cm__engine_log(e, CM_LOG_WARN, "CUPTI's periodic flush (cuptiActivityFlushAll) took %llu ms: "
                       "CUPTI is behind the launches", (unsigned long long)took);
      }
      pthread_mutex_lock(&e->work_mu);
      worker_left_cupti(e);
      continue;
    }
    if (dl && now >= next_deliver) {
      next_deliver = now + dl;
      worker_deliver(e);
      continue;
    }
    qitem *it = e->q_head;
    if (it) {
      e->q_head = it->next;
      if (!e->q_head) e->q_tail = NULL;
      e->q_depth--;
      uint32_t limit = e->batch_records;
      pthread_mutex_unlock(&e->work_mu);

      pthread_mutex_lock(&e->dec_mu);
      uint64_t started = cm__realtime_ns();
      uint64_t n = cm__decoder_decode(e->dec, it->buf, it->valid);
      uint64_t newest = cm__decoder_last_ts(e->dec);
      if (limit && held_over(e, limit)) cm__engine_deliver(e);
      pthread_mutex_unlock(&e->dec_mu);
      note_lag(e, newest, cm__pool_requested_ns(it->buf), it->completed_ns, started);
      ADD(e, st_records_decoded, n);
      ADD(e, st_buffers_decoded, 1);
      ADD(e, st_bytes_decoded, it->valid);
      cm__pool_put(&e->pool, it->buf);
      /* Once the agent's lag guard has suppressed every kind the observers select, CUPTI asks
       * for no buffer to write records into for the rest of the run, so the free ones are given
       * back as they return: CUPTI's partly filled buffers come back once after the guard's last
       * step, and would otherwise stay in the pool, and in the process, to the end. A session that
       * merely ends keeps its buffers for the next (test_engine_cycles). */
      if (!LOAD(e, enabled) && atomic_load_explicit(&e->suppressed, memory_order_relaxed))
        cm__pool_trim(&e->pool, 0);

      pthread_mutex_lock(&e->work_mu);
      it->next = e->q_spare;
      e->q_spare = it;
      e->decoded++;
      pthread_cond_broadcast(&e->done_cv);
      continue;
    }
    if (e->deliver_wanted) {
      /* The queue is empty: what the forced flush completed is decoded, and goes out now. */
      e->deliver_wanted = false;
      worker_deliver(e);
      continue;
    }
    if (e->stop) break;
    /* Idle: sleep until the next cadence or new work. */
    uint64_t wake = UINT64_MAX;
    if (fl) wake = next_flush;
    if (dl && next_deliver < wake) wake = next_deliver;
    if (wake == UINT64_MAX) {
      pthread_cond_wait(&e->q_cv, &e->work_mu);
    } else {
      struct timespec ts;
      cm__abstime_in(&ts, wake > now ? wake - now : 0);
      pthread_cond_timedwait(&e->q_cv, &e->work_mu, &ts);
    }
  }
  pthread_mutex_unlock(&e->work_mu);
  return NULL;
}

int cm__engine_worker_start(cm_engine *e) {
  if (pthread_create(&e->worker, NULL, worker_main, e) != 0)
    return cm__seterr(CM_ENOMEM, "cannot start the decode worker thread");
  e->worker_started = true;
  return 0;
}

void cm__engine_worker_stop(cm_engine *e) {
  pthread_mutex_lock(&e->work_mu);
  e->stop = true;
  pthread_cond_signal(&e->q_cv);
  pthread_mutex_unlock(&e->work_mu);
  if (e->worker_started) pthread_join(e->worker, NULL);
}

void cm__engine_flush_forced_async(cm_engine *e) {
  if (!e) return;
  pthread_mutex_lock(&e->api_mu);
  uint32_t ms = e->cfg.fence_timeout_ms;
  pthread_mutex_unlock(&e->api_mu);
  pthread_mutex_lock(&e->work_mu);
  e->forced_wanted = true;
  e->forced_sync_ms = ms;
  pthread_cond_signal(&e->q_cv);
  pthread_mutex_unlock(&e->work_mu);
}
