/*
 * engine.c: the engine. It owns the process's CUPTI subscription, the buffer callbacks, the decode
 * worker, the observers and their union selection, and delivery. The flushes, the device
 * synchronization and the fences (the exit fence too) are in fence.c, the couplings between kinds
 * in select.c; the state they share is in engine.h.
 *
 * Threads and locks. Three kinds of thread meet here:
 *  - CUPTI's threads (and the application's, for per-thread buffers) call the buffer request and
 *    completion callbacks. They take only pool.mu or engine.work_mu, each for a list operation, so
 *    the application is never made to wait on decoding or on an observer.
 *  - The decode worker pops completed buffers, decodes them under `dec_mu`, returns them to the
 *    pool, and runs the delivery and self-flush cadences.
 *  - Control calls (cm_observe, cm_unobserve, cm_flush, cm_configure, cm_engine_free) are
 *    serialized by `api_mu`.
 * Lock order: api_mu, then dec_mu, then work_mu; the pool mutex is a leaf. Observer callbacks run
 * with dec_mu held, on the worker or on the thread calling cm_flush, so one engine never runs two
 * callbacks at once and the columns cannot change under a callback.
 *
 * The device synchronization of a fence, and the exit fence that bounds it by one deadline, are
 * described in fence.c.
 *
 * Selection changes follow two rules from the reference monitor. A kind whose selection does not
 * change is never toggled, because disabling and re-enabling RUNTIME or DRIVER stops kernel records
 * of CUDA graphs captured earlier. And pending records are delivered before the decode table
 * changes, so no observer ever sees a batch decoded with a table that lacks one of its fields.
 */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

/* CUPTI's buffer callbacks carry no user data, and they are registered once per process, so they
 * reach the engine through this pointer. It is NULL between engines; a buffer completed then is
 * leaked rather than touched, since its pool is gone. */
static _Atomic(cm_engine *) g_engine;
/* CUPTI callbacks currently inside the engine. A callback counts itself in before it reads
 * g_engine, and cm_engine_free clears g_engine before it waits for the count to reach zero, so no
 * callback can touch an engine being freed (sequentially consistent atomics make the two orders
 * agree). */
static atomic_int g_inflight;

static cm_engine *callback_enter(void) {
  atomic_fetch_add(&g_inflight, 1);
  return atomic_load(&g_engine);
}

static void callback_leave(void) { atomic_fetch_sub(&g_inflight, 1); }
static pthread_mutex_t g_once_mu = PTHREAD_MUTEX_INITIALIZER;
static bool g_callbacks_registered; /* guarded by g_once_mu */
static bool g_timestamp_registered; /* guarded by g_once_mu */
static bool g_engine_exists;        /* guarded by g_once_mu */

static void release_slot(void) {
  pthread_mutex_lock(&g_once_mu);
  g_engine_exists = false;
  pthread_mutex_unlock(&g_once_mu);
}





void cm__engine_log(cm_engine *e, int level, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&e->log_mu);
  if (e->log_fn) e->log_fn(e->log_ud, level, msg);
  pthread_mutex_unlock(&e->log_mu);
}

static uint64_t CUPTIAPI realtime_timestamp_cb(void) { return cm__realtime_ns(); }

/* CUPTI's CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER, set before the buffer callbacks are
 * registered, as CUPTI requires. CUPTI's own default is per-thread buffers; the engine turns them
 * off unless CUPTIMON_CUPTI_PER_THREAD_BUFFERS=1: after a long run at a high launch rate, the
 * exit's first cuptiActivityFlushAll takes seconds with per-thread buffers (a minimal CUPTI
 * consumer's too) and milliseconds without them, with every record delivered both ways and no
 * lower launch rate (bench/RESULTS.md, "Memory under a long run"). */
static void set_per_thread_buffers(cm_engine *e) {
  const char *v = getenv("CUPTIMON_CUPTI_PER_THREAD_BUFFERS");
  bool asked = v && *v;
  if (asked && strcmp(v, "0") != 0 && strcmp(v, "1") != 0) {
    cm__engine_log(e, CM_LOG_WARN,
                   "CUPTIMON_CUPTI_PER_THREAD_BUFFERS='%s' is neither 0 nor 1: ignored (per-thread buffers stay off)", v);
    asked = false;
  }
  uint8_t on = asked && v[0] == '1';
  size_t sz = sizeof on;
  CUptiResult r = e->cupti.ActivitySetAttribute
                      ? e->cupti.ActivitySetAttribute(CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER, &sz, &on)
                      : CUPTI_ERROR_NOT_SUPPORTED;
  if (r != CUPTI_SUCCESS)
    cm__engine_log(e, asked ? CM_LOG_WARN : CM_LOG_INFO,
                   "CUPTI did not take CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER = %u (result %d): "
                   "its default stands", (unsigned)on, (int)r);
  else if (asked)
    cm__engine_log(e, CM_LOG_INFO, "CUPTI's per-thread activity buffers are %s (CUPTIMON_CUPTI_PER_THREAD_BUFFERS)",
                   on ? "on" : "off");
}

/* ---- CUPTI callbacks ------------------------------------------------------------------------ */

static void CUPTIAPI on_buffer_request(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = NULL;
  *size = 0;
  *max_records = 0;
  cm_engine *e = callback_enter();
  if (e) {
    bool warn = false;
    uint8_t *b = cm__pool_get(&e->pool, size, &warn);
    if (b) {
      cm__pool_stamp(b, cm__realtime_ns());
      ADD(e, cupti_buffers, 1);
    }
    if (warn)
      cm__engine_log(e, CM_LOG_WARN,
           "more than %u activity buffers are outstanding: the decoder is not keeping up with "
           "CUPTI (consider a larger pool, fewer kinds, or a faster delivery cadence)",
           e->pool.warn_outstanding);
    *buffer = b;
    if (!b) *size = 0;
  }
  callback_leave();
}

/* The completion callback proper; on_buffer_complete counts it in and out. */
static void buffer_complete(cm_engine *e, CUcontext ctx, uint32_t stream, uint8_t *buffer,
                            size_t valid) {
  size_t dropped = 0;
  if (e->cupti.ActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
    ADD(e, st_records_dropped, dropped);
  if (!buffer) return;
  atomic_fetch_sub_explicit(&e->cupti_buffers, 1, memory_order_relaxed);
  if (!valid) {
    cm__pool_put(&e->pool, buffer);
    return;
  }
  pthread_mutex_lock(&e->work_mu);
  qitem *it = e->q_spare;
  if (it) e->q_spare = it->next;
  pthread_mutex_unlock(&e->work_mu);
  if (!it) it = malloc(sizeof *it);
  if (!it) {
    /* Out of memory: the buffer's records are lost, and counted as dropped rather than silently
     * gone. Counting them walks the buffer, which is cheap next to losing it. */
    CUpti_Activity *rec = NULL;
    uint64_t n = 0;
    while (e->cupti.ActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) n++;
    ADD(e, st_records_dropped, n);
    cm__pool_put(&e->pool, buffer);
    return;
  }
  it->next = NULL;
  it->buf = buffer;
  it->valid = valid;
  it->completed_ns = cm__realtime_ns();
  pthread_mutex_lock(&e->work_mu);
  if (e->q_tail)
    e->q_tail->next = it;
  else
    e->q_head = it;
  e->q_tail = it;
  e->enqueued++;
  if (++e->q_depth > e->q_peak) e->q_peak = e->q_depth;
  pthread_cond_signal(&e->q_cv);
  pthread_mutex_unlock(&e->work_mu);
}

static void CUPTIAPI on_buffer_complete(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                        size_t valid) {
  cm_engine *e = callback_enter();
  /* With no engine the buffer is leaked rather than touched: its pool may be gone. */
  if (e) buffer_complete(e, ctx, stream, buffer, valid);
  callback_leave();
}

/* ---- the finalize helper ---------------------------------------------------------------------
 *
 * cuptiFinalize can block for as long as the application keeps CUPTI busy: with kernel and
 * runtime records traced and then disabled, it may not return until the launching threads stop
 * (bench/RESULTS.md, "Memory under a long run"). So it runs on a helper thread of its own, and the
 * detach waits for it until a deadline only. The helper shares a job with the engine (the last to
 * leave frees it) and touches nothing else: an engine freed meanwhile is never reached. Its driver
 * call's exit callback runs cuptiFinalize there, the call site CUPTI recommends; without that
 * callback it is called directly, which CUPTI allows once the device is synchronized and the
 * buffers flushed.
 *
 * Before that, the helper offers the finalize to the application's own threads, as PyTorch's
 * profiler does: with the runtime API's callbacks enabled, the first application thread that
 * leaves a runtime call runs cuptiFinalize in its exit callback, at the call site CUPTI
 * recommends, where it is quicker than from another thread while the application launches
 * (bench/RESULTS.md, "CUPTI states"). For FIN_PROBE_MS first the callbacks only count the threads
 * that call the runtime: when the engine's detach_max_threads or more do, the detach is refused,
 * because CUPTI's next subscription does not return while many threads call it (the same
 * section), and a process detached then could not be traced again. When no application thread calls the runtime within FIN_APP_WAIT_MS (an idle
 * process), the helper withdraws the offer and finalizes itself. The offer and the probe are
 * process-wide statics, since an application thread may still read them after the job has gone:
 * only the thread whose compare-and-swap takes the offer touches the job, and the helper waits
 * for it before it leaves. */
enum { FIN_PROBE_MS = 20, FIN_APP_WAIT_MS = 100, FIN_PROBE_TIDS = 32 };
enum { APP_OFF, APP_PROBING, APP_OFFERED, APP_DONE };
static _Atomic int g_app_state;                  /* APP_*: what the callbacks do */
static _Atomic(struct cm__fin_job *) g_app_offer; /* the job an application thread may take */
static _Atomic uint32_t g_app_tids[FIN_PROBE_TIDS]; /* the threads seen while probing */
static _Atomic int g_app_ntids;                  /* how many of them (may pass FIN_PROBE_TIDS) */
/* The runtime calls that begin or end a stream capture: the finalize is not taken at their exit,
 * where a capture may have just begun. */
static bool capture_cbid(CUpti_CallbackId cbid) {
  return cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCapture_v10000 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCapture_ptsz_v10000 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCaptureToGraph_v12030 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCaptureToGraph_ptsz_v12030 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamEndCapture_v10000 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamEndCapture_ptsz_v10000;
}

typedef struct cm__fin_job {
  cm__job job;       /* first (job.c) */
  bool in_callback;  /* the helper thread's own: cuptiFinalize ran in the callback, */
  CUptiResult cb_rc; /* with this result */
  CUptiResult rc;    /* the result, once done */
  uint64_t start_ns, end_ns; /* CLOCK_REALTIME when it began and when it returned */
  CUptiResult(CUPTIAPI *Finalize)(void);
  CUptiResult(CUPTIAPI *EnableCallback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain,
                                        CUpti_CallbackId);
  CUptiResult(CUPTIAPI *EnableDomain)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain);
  int max_threads;   /* the probe's refusal threshold (0: no offer, no probe) */
  int busy_threads;  /* the helper's own: >0 when the probe refused the finalize */
  bool on_app;       /* the helper's own: an application thread ran cuptiFinalize */
  int (*cuDriverGetVersion)(int *version);
  CUpti_SubscriberHandle sub;
} cm__fin_job;

/* The job of the helper thread that is running on this thread, if any. */
static _Thread_local cm__fin_job *t_fin_job;

static bool fin_callback(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data) {
  cm__fin_job *j = t_fin_job;
  if (!j || domain != CUPTI_CB_DOMAIN_DRIVER_API ||
      cbid != CUPTI_DRIVER_TRACE_CBID_cuDriverGetVersion || !data ||
      ((const CUpti_CallbackData *)data)->callbackSite != CUPTI_API_EXIT)
    return false;
  j->cb_rc = j->Finalize();
  j->in_callback = true;
  return true;
}

/* An application thread's runtime callback while the helper probes or offers the finalize:
 * counts the thread, or takes the offer and finalizes. Returns true when it finalized. */
static bool fin_app_callback(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API || t_fin_job) return false;
  int st = atomic_load_explicit(&g_app_state, memory_order_acquire);
  if (st == APP_PROBING) {
    static _Thread_local uint32_t tid;
    if (!tid) tid = (uint32_t)syscall(SYS_gettid);
    int n = atomic_load(&g_app_ntids);
    for (int i = 0; i < n && i < FIN_PROBE_TIDS; i++)
      if (atomic_load(&g_app_tids[i]) == tid) return false;
    int slot = atomic_fetch_add(&g_app_ntids, 1);
    if (slot < FIN_PROBE_TIDS) atomic_store(&g_app_tids[slot], tid);
    return false;
  }
  if (st != APP_OFFERED || !data || ((const CUpti_CallbackData *)data)->callbackSite != CUPTI_API_EXIT ||
      capture_cbid(cbid))
    return false;
  cm__fin_job *j = atomic_load(&g_app_offer);
  if (!j || !atomic_compare_exchange_strong(&g_app_offer, &j, NULL)) return false;
  /* The offer is this thread's: the helper waits for APP_DONE before it reads the job again. */
  j->cb_rc = j->Finalize();
  j->on_app = true;
  atomic_store_explicit(&g_app_state, APP_DONE, memory_order_release);
  return true;
}

/* Offers the finalize to the application's threads (see above). Returns 1 when one of them
 * finalized, 0 when none took the offer in time (the helper finalizes), -1 when the probe found
 * too many threads calling the runtime (j->busy_threads; nothing finalized). Helper thread. */
static int fin_offer(cm__fin_job *j) {
  if (!j->max_threads || !j->EnableDomain ||
      j->EnableDomain(1, j->sub, CUPTI_CB_DOMAIN_RUNTIME_API) != CUPTI_SUCCESS)
    return 0;
  atomic_store(&g_app_ntids, 0);
  for (int i = 0; i < FIN_PROBE_TIDS; i++) atomic_store(&g_app_tids[i], 0);
  atomic_store_explicit(&g_app_state, APP_PROBING, memory_order_release);
  struct timespec ts = {0, FIN_PROBE_MS * 1000000L};
  nanosleep(&ts, NULL);
  int n = atomic_load(&g_app_ntids);
  if (n >= j->max_threads) {
    atomic_store(&g_app_state, APP_OFF);
    j->EnableDomain(0, j->sub, CUPTI_CB_DOMAIN_RUNTIME_API);
    j->busy_threads = n;
    return -1;
  }
  atomic_store(&g_app_offer, j);
  atomic_store_explicit(&g_app_state, APP_OFFERED, memory_order_release);
  uint64_t end = cm__mono_ms() + FIN_APP_WAIT_MS;
  struct timespec tick = {0, 200000L};
  while (atomic_load_explicit(&g_app_state, memory_order_acquire) != APP_DONE && cm__mono_ms() < end)
    nanosleep(&tick, NULL);
  cm__fin_job *mine = j;
  if (atomic_load(&g_app_state) != APP_DONE &&
      atomic_compare_exchange_strong(&g_app_offer, &mine, NULL)) {
    /* Withdrawn before any thread took it. */
    atomic_store(&g_app_state, APP_OFF);
    j->EnableDomain(0, j->sub, CUPTI_CB_DOMAIN_RUNTIME_API);
    return 0;
  }
  /* Taken: its cuptiFinalize may take as long as CUPTI likes; the detach's waiter has its own
   * deadline. */
  while (atomic_load_explicit(&g_app_state, memory_order_acquire) != APP_DONE) nanosleep(&tick, NULL);
  atomic_store(&g_app_state, APP_OFF);
  return 1;
}

static void *fin_main(void *arg) {
  cm__fin_job *j = arg;
  int offered = fin_offer(j);
  if (offered != 0) {
    /* Finalized by an application thread (its result in cb_rc), or refused by the probe. */
    j->rc = offered > 0 ? j->cb_rc : CUPTI_SUCCESS;
    j->end_ns = cm__realtime_ns();
    cm__job_finish(&j->job);
    cm__job_release(&j->job);
    return NULL;
  }
  t_fin_job = j;
  if (j->cuDriverGetVersion &&
      j->EnableCallback(1, j->sub, CUPTI_CB_DOMAIN_DRIVER_API,
                        CUPTI_DRIVER_TRACE_CBID_cuDriverGetVersion) == CUPTI_SUCCESS) {
    int version = 0;
    j->cuDriverGetVersion(&version);
  }
  j->rc = j->in_callback ? j->cb_rc : j->Finalize();
  j->end_ns = cm__realtime_ns();
  t_fin_job = NULL;
  cm__job_finish(&j->job);
  cm__job_release(&j->job);
  return NULL;
}

static void CUPTIAPI on_subscriber_callback(void *ud, CUpti_CallbackDomain domain,
                                            CUpti_CallbackId cbid, const void *data) {
  /* The finalize helper's own driver call: the call site where CUPTI recommends cuptiFinalize.
   * It touches only its job, never the engine, and is not counted in flight: cuptiFinalize may
   * block for as long as CUPTI likes (fin_main). */
  if (fin_callback(domain, cbid, data)) return;
  /* An application thread counted by the finalize's probe, or the one that takes its offer. */
  if (fin_app_callback(domain, cbid, data)) return;
  /* `ud` is the engine, but it is used only once the in-flight count says it is still alive. */
  cm_engine *e = callback_enter();
  if (e && e == ud) {
    cm__callbacks *cb = atomic_load(&e->cb);
    if (cb) cm__callbacks_dispatch(cb, (int)domain, (uint32_t)cbid, data, e->strings);
  }
  callback_leave();
}

static void log_hook(void *ctx, int level, const char *msg) { cm__engine_log(ctx, level, "%s", msg); }

/* ---- delivery ------------------------------------------------------------------------------- */

/* Hands every held record to the observers, then empties the decoder. Called with dec_mu held. */
void cm__engine_deliver(cm_engine *e) {
  cm_column cols[CM__MAX_FIELDS];
  bool any = false;
  uint64_t seq = ++e->drain_seq;
  /* Synthetic records (resource events, PM samples) join the held records first, so they go out
   * now. The PM poll rides this drain: its cadence is the delivery cadence. */
  if (e->cb) cm__callbacks_drain(e->cb, e->dec);
  if (e->pm) cm__pm_drain(e->pm, e->dec);
  for (int k = 0; k < CM_KIND_MAX; k++) {
    uint32_t n = cm__decoder_count(e->dec, k);
    if (!n) continue;
    any = true;
    const cm__kind_desc *desc = cm__kind_desc_get(k);
    /* Newest observer first: while one observer replaces another (the agent's SELECT adds the
     * new one before removing the old), the batch decoded with the new, wider table reaches the
     * replacement before the one it replaces. */
    for (int o = e->nobs - 1; o >= 0; o--) {
      observer *ob = &e->obs[o];
      if (cm__bits_empty(&ob->sel[k])) continue;
      uint32_t nc = 0;
      for (int f = 0; f < desc->nfields; f++) {
        if (!cm__bits_has(&ob->sel[k], f)) continue;
        const cm__field *fd = &desc->fields[f];
        cols[nc].field = f;
        cols[nc].type = fd->type;
        cols[nc].width = fd->width;
        cols[nc].reserved = 0;
        cols[nc].name = fd->name;
        cols[nc].data = cm__decoder_column(e->dec, k, f);
        nc++;
      }
      cm_batch b = {.kind = k, .n = n, .ncols = nc, .cols = cols, .seq = seq};
      ob->fn(ob->ud, &b);
      ADD(e, st_records_delivered, n);
    }
  }
  if (any) ADD(e, st_drains, 1);
  cm__decoder_reset(e->dec);
  /* After the observers ran: popped correlation chains age one drain. Only drains that delivered
   * records count, so idle cadence ticks cannot retire a chain before its records arrive. */
  if (any) cm__corr_drain();
}

static bool held_over(cm_engine *e, uint32_t limit) {
  for (int k = 0; k < CM_KIND_MAX; k++)
    if (cm__decoder_count(e->dec, k) >= limit) return true;
  return false;
}

/* ---- the decode worker ---------------------------------------------------------------------- */

uint64_t cm__engine_enabled(cm_engine *e) {
  return atomic_load_explicit(&e->enabled, memory_order_relaxed);
}

bool cm__engine_finalizing(cm_engine *e) { return atomic_load(&e->finalizing); }

void cm__engine_set_detach_max_threads(cm_engine *e, int n) {
  pthread_mutex_lock(&e->api_mu);
  e->detach_max_threads = n < 0 ? 0 : n;
  pthread_mutex_unlock(&e->api_mu);
}

int cm__engine_probe_busy_threads(cm_engine *e) { return atomic_load(&e->probe_busy_threads); }

uint64_t cm__engine_enable_start_ns(cm_engine *e) { return LOAD(e, enable_start_ns); }

uint64_t cm__engine_cupti_buffers(cm_engine *e) {
  return atomic_load_explicit(&e->cupti_buffers, memory_order_relaxed);
}

uint64_t cm__engine_take_lag_held_max(cm_engine *e) {
  return atomic_exchange_explicit(&e->lag_held_max_ns, 0, memory_order_relaxed);
}

/* Raises *p to v when v is larger; any thread (the lag's and the kind changes' peaks). */
static void atomic_max_u64(_Atomic uint64_t *p, uint64_t v) {
  uint64_t cur = atomic_load_explicit(p, memory_order_relaxed);
  while (v > cur && !atomic_compare_exchange_weak_explicit(p, &cur, v, memory_order_relaxed,
                                                           memory_order_relaxed)) {
  }
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
  atomic_max_u64(&e->lag_held_max_ns, requested > newest ? requested - newest : 0);
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
      if (!cm__engine_enabled(e) && atomic_load_explicit(&e->suppressed, memory_order_relaxed))
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

/* ---- selection ------------------------------------------------------------------------------ */

static int attach_cupti(cm_engine *e);
static void attach_abandon(cm_engine *e);

static void union_of(const cm_engine *e, int skip, const cm__bits *extra, cm__bits *out) {
  memset(out, 0, sizeof(cm__bits) * CM_KIND_MAX);
  for (int o = 0; o < e->nobs; o++) {
    if (o == skip) continue;
    for (int k = 0; k < CM_KIND_MAX; k++) {
      out[k].w[0] |= e->obs[o].sel[k].w[0];
      out[k].w[1] |= e->obs[o].sel[k].w[1];
    }
  }
  if (extra)
    for (int k = 0; k < CM_KIND_MAX; k++) {
      out[k].w[0] |= extra[k].w[0];
      out[k].w[1] |= extra[k].w[1];
    }
}

/* Counts one change of the kinds and the time its CUPTI calls took since `t0` (CLOCK_REALTIME,
 * as the detach's times are). */
static void count_kind_change(cm_engine *e, uint64_t t0) {
  uint64_t now = cm__realtime_ns();
  uint64_t took = now > t0 ? now - t0 : 0;
  ADD(e, st_kind_changes, 1);
  ADD(e, st_kind_change_ns, took);
  atomic_max_u64(&e->st_kind_change_max_ns, took);
}

/* Enables and disables kinds to move CUPTI from `e->enabled` to `want` less the suppressed kinds,
 * touching only the kinds that differ. On a failed enable, the kinds this call enabled are
 * disabled again and the error is returned, so a failure leaves CUPTI as it was. Called with
 * api_mu held. */
static int apply_kinds(cm_engine *e, uint64_t want) {
  cm__cupti *c = &e->cupti;
  want &= ~e->suppressed;
  uint64_t add = want & ~e->enabled, drop = e->enabled & ~want, done = 0;
  if (!(add | drop)) return 0;
  uint64_t t0 = cm__realtime_ns();
  if (add) atomic_store_explicit(&e->enable_start_ns, t0, memory_order_relaxed);
  for (int k = 0; k < CM_KIND_MAX; k++) {
    if (!(add >> k & 1)) continue;
    CUptiResult r = c->ActivityEnable((CUpti_ActivityKind)k);
    if (r != CUPTI_SUCCESS) {
      char what[96];
      snprintf(what, sizeof what, "cuptiActivityEnable(%s)", cm_kind_name(k));
      int err = cm__cupti_err(c, r, what);
      for (int j = 0; j < CM_KIND_MAX; j++)
        if (done >> j & 1) c->ActivityDisable((CUpti_ActivityKind)j);
      count_kind_change(e, t0);
      return err;
    }
    done |= 1ull << k;
  }
  for (int k = 0; k < CM_KIND_MAX; k++)
    if (drop >> k & 1) c->ActivityDisable((CUpti_ActivityKind)k);
  e->enabled = want;
  count_kind_change(e, t0);
  return 0;
}

static void apply_toggles(cm_engine *e, const cm__bits *sel) {
  bool lat = cm__sel_needs_latency(sel), ets = cm__sel_needs_event_ts(sel);
  if (lat != e->latency_on) {
    e->cupti.ActivityEnableLatencyTimestamps(lat);
    e->latency_on = lat;
  }
  if (ets != e->event_ts_on) {
    e->cupti.ActivityEnableCudaEventDeviceTimestamps(ets);
    e->event_ts_on = ets;
  }
}

int cm__engine_set_suppressed(cm_engine *e, uint64_t kinds) {
  pthread_mutex_lock(&e->api_mu);
  e->suppressed = kinds;
  int rc = 0;
  if (e->nobs > 0) rc = apply_kinds(e, cm__sel_kinds_needed(e->sel));
  pthread_mutex_unlock(&e->api_mu);
  return rc;
}

static uint64_t deadline_for(const cm_engine *e, uint32_t timeout_ms) {
  return cm__mono_ms() + (timeout_ms ? timeout_ms : e->cfg.fence_timeout_ms);
}

/* Ends the activity session: device sync, forced flush, delivery, every kind disabled. Called with
 * api_mu held, while the observers are still registered so they receive the last records. */
static void end_session(cm_engine *e) {
  uint64_t deadline = deadline_for(e, 0);
  int why;
  cm__engine_device_sync(e, deadline, &why);
  if (!cm__engine_plain_flush(e, deadline, CUPTI_ACTIVITY_FLAG_FLUSH_FORCED))
    cm__engine_log(e, CM_LOG_WARN, "session end: the decoder did not catch up before the deadline");
  pthread_mutex_lock(&e->dec_mu);
  cm__engine_deliver(e);
  pthread_mutex_unlock(&e->dec_mu);
}

/* ---- public API ----------------------------------------------------------------------------- */

void cm_config_init(cm_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->buffer_size = 4u << 20;
  cfg->pool_max_buffers = 256;
  cfg->warn_outstanding = 64;
  cfg->fence_timeout_ms = 5000;
  cfg->batch_records = 1u << 20;
}

static int check_config(const cm_config *cfg) {
  if (cfg->buffer_size < 4096 || cfg->buffer_size > (1u << 30) || cfg->buffer_size % 8)
    return cm__seterr(CM_EINVAL, "buffer_size %u: must be a multiple of 8 in [4096, 1 GiB]",
                      cfg->buffer_size);
  if (cfg->pool_max_buffers < 1)
    return cm__seterr(CM_EINVAL, "pool_max_buffers must be at least 1");
  return 0;
}

static void check_clock(cm_engine *e) {
  uint64_t t0 = cm__realtime_ns(), ts = 0;
  e->cupti.GetTimestamp(&ts);
  uint64_t t1 = cm__realtime_ns();
  /* A small slack absorbs the two reads' granularity. */
  e->clock_realtime = ts + 1000 >= t0 && ts <= t1 + 1000;
  e->clock_offset_ns = (int64_t)(ts - (t0 + (t1 - t0) / 2));
}

/* The subscription itself, named "cuptimon", with the engine as its callbacks' userdata (`ud`,
 * never dereferenced here); the name of a subscriber already there goes to old[]. Any thread: the
 * attach helper calls it too. */
static CUptiResult subscribe_call(const cm__cupti *c, CUpti_SubscriberHandle *sub, void *ud,
                                  char *old, size_t old_size) {
  if (c->Subscribe_v2) {
    CUpti_SubscriberParams p;
    memset(&p, 0, sizeof p);
    p.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    p.subscriberName = "cuptimon";
    p.oldSubscriberName = old;
    p.oldSubscriberSize = old_size;
    return c->Subscribe_v2(sub, on_subscriber_callback, ud, &p);
  }
  return c->Subscribe(sub, on_subscriber_callback, ud);
}

/* The error of a subscription that returned `r` (0 on success). */
static int subscribe_result(cm__cupti *c, CUptiResult r, const char *old) {
  if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
    return cm__seterr(CM_EBUSY,
                      "another CUPTI subscriber already holds this process: '%s'. CUPTI allows one "
                      "subscriber per process; stop that tool (Nsight Systems, Nsight Compute, "
                      "torch.profiler, another profiler) or run without it",
                      old[0] ? old : "unknown");
  if (r == CUPTI_ERROR_UNKNOWN)
    /* What CUPTI answers when there is no NVIDIA driver or no device to trace. */
    return cm__seterr(CM_ECUPTI,
                      "cuptiSubscribe failed: CUPTI_ERROR_UNKNOWN (999): no GPU or driver: CUPTI "
                      "finds no NVIDIA driver or device it can use here (nvidia-smi shows what the "
                      "machine has)");
  if (r != CUPTI_SUCCESS) return cm__cupti_err(c, r, "cuptiSubscribe");
  return 0;
}

/* Subscribes to CUPTI (e->sub): at creation, and after a detach when no attach helper can start.
 * Fails with CM_EBUSY, naming the holder, when another subscriber holds the process. */
static int subscribe(cm_engine *e) {
  char old[128] = "";
  CUptiResult r = subscribe_call(&e->cupti, &e->sub, e, old, sizeof old);
  return subscribe_result(&e->cupti, r, old);
}

/* Registers the timestamp callback (when configured) and the buffer callbacks, once per CUPTI
 * initialization: at creation, and again after a detach (cuptiFinalize forgets them). */
static int register_activity(cm_engine *e) {
  CUptiResult r;
  pthread_mutex_lock(&g_once_mu);
  if (e->cfg.flags & CM_CONFIG_TIMESTAMP_CALLBACK) {
    if (!g_timestamp_registered &&
        e->cupti.ActivityRegisterTimestampCallback(realtime_timestamp_cb) == CUPTI_SUCCESS)
      g_timestamp_registered = true;
    e->timestamp_callback = g_timestamp_registered;
  }
  if (!g_callbacks_registered) {
    set_per_thread_buffers(e);
    r = e->cupti.ActivityRegisterCallbacks(on_buffer_request, on_buffer_complete);
    if (r == CUPTI_SUCCESS) g_callbacks_registered = true;
  } else {
    r = CUPTI_SUCCESS;
  }
  pthread_mutex_unlock(&g_once_mu);
  return r == CUPTI_SUCCESS ? 0 : cm__cupti_err(&e->cupti, r, "cuptiActivityRegisterCallbacks");
}

/* Frees the engine's memory and locks, and gives the process's engine slot back. The modules it
 * owned must have been freed already. */
static void destroy(cm_engine *e) {
  pthread_mutex_destroy(&e->log_mu);
  pthread_mutex_destroy(&e->api_mu);
  pthread_mutex_destroy(&e->dec_mu);
  pthread_mutex_destroy(&e->work_mu);
  pthread_cond_destroy(&e->q_cv);
  pthread_cond_destroy(&e->done_cv);
  free(e);
  release_slot();
}

int cm_engine_new(cm_engine **out, const cm_config *cfg_in) {
  cm__clearerr();
  if (!out) return cm__seterr(CM_EINVAL, "out is NULL");
  *out = NULL;
  cm_config cfg;
  if (cfg_in)
    cfg = *cfg_in;
  else
    cm_config_init(&cfg);
  int rc = check_config(&cfg);
  if (rc) return rc;

  pthread_mutex_lock(&g_once_mu);
  bool exists = g_engine_exists;
  g_engine_exists = true;
  pthread_mutex_unlock(&g_once_mu);
  if (exists)
    return cm__seterr(CM_EBUSY, "a cuptimon engine already exists in this process (CUPTI allows "
                                "one subscriber per process; reuse it or free it first)");
  cm_engine *e = calloc(1, sizeof *e);
  if (!e) {
    release_slot();
    return cm__seterr(CM_ENOMEM, "cannot allocate the engine");
  }
  e->cfg = cfg;
  pthread_mutex_init(&e->log_mu, NULL);
  pthread_mutex_init(&e->api_mu, NULL);
  pthread_mutex_init(&e->dec_mu, NULL);
  pthread_mutex_init(&e->work_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&e->q_cv, &ca);
  pthread_cond_init(&e->done_cv, &ca);
  pthread_condattr_destroy(&ca);
  e->self_flush_ms = cfg.self_flush_ms;
  e->deliver_ms = cfg.deliver_ms;
  e->batch_records = cfg.batch_records;
  e->next_id = 1;

  rc = cm__cupti_load(&e->cupti);
  if (rc) goto fail_locks;
  rc = cm__pool_init(&e->pool, cfg.buffer_size, cfg.pool_max_buffers, cfg.warn_outstanding);
  if (rc) goto fail_locks;
  rc = cm__intern_new(&e->strings);
  if (rc) goto fail_pool;
  rc = cm__decoder_new(&e->dec, &e->cupti, e->strings);
  if (rc) goto fail_intern;

  e->cupti.GetVersion(&e->cupti_version);
  rc = subscribe(e);
  if (rc) goto fail_decoder;
  /* The registry pins the RESOURCE callbacks the engine needs (module unload included, for the
   * string cache), so a consumer's disarm cannot turn them off. */
  cm__callbacks *cbreg = NULL;
  rc = cm__callbacks_new(&cbreg, &e->cupti, e->sub, log_hook, e);
  atomic_store(&e->cb, cbreg);
  if (rc) goto fail_sub;

  rc = register_activity(e);
  if (rc) goto fail_sub;
  check_clock(e);
  /* PM timestamps are on cuptiGetTimestamp's clock: the same as the records' when it is
   * CLOCK_REALTIME (the offset is then only the bracket's noise), else moved by the offset. */
  rc = cm__pm_new(&e->pm, &e->cupti, e->clock_realtime ? 0 : e->clock_offset_ns);
  if (rc) goto fail_sub;

  if (pthread_create(&e->worker, NULL, worker_main, e) != 0) {
    rc = cm__seterr(CM_ENOMEM, "cannot start the decode worker thread");
    goto fail_sub;
  }
  e->worker_started = true;
  atomic_store(&g_engine, e);
  cm__corr_attach(&e->cupti);
  *out = e;
  return 0;

fail_sub:
  cm__pm_free(e->pm);
  e->cupti.Unsubscribe(e->sub);
  cm__callbacks_free(e->cb);
fail_decoder:
  cm__decoder_free(e->dec);
fail_intern:
  cm__intern_free(e->strings);
fail_pool:
  cm__pool_destroy(&e->pool);
fail_locks:
  destroy(e);
  return rc;
}

void cm_engine_free(cm_engine *e) {
  if (!e) return;
  pthread_mutex_lock(&e->api_mu);
  if (e->active) {
    /* Disabled first, as in cm_unobserve, so that nothing is written after the last flush. */
    apply_kinds(e, 0);
    end_session(e);
    apply_toggles(e, (cm__bits[CM_KIND_MAX]){{{0}}});
    e->active = false;
  }
  pthread_mutex_unlock(&e->api_mu);

  pthread_mutex_lock(&e->work_mu);
  e->stop = true;
  pthread_cond_signal(&e->q_cv);
  pthread_mutex_unlock(&e->work_mu);
  if (e->worker_started) pthread_join(e->worker, NULL);

  /* PM sessions stop before the subscription goes; samples not yet drained are lost with them. */
  cm__pm_free(e->pm);
  e->pm = NULL;
  atomic_store(&g_engine, NULL);
  cm__corr_detach();
  /* Handlers live as long as the subscription: they go only here, never with a session. A
   * detached engine has no subscription left. */
  if (!atomic_load(&e->detached) && !e->fin_job) e->cupti.Unsubscribe(e->sub);
  /* A cuptiFinalize still running keeps its job, never the engine. */
  if (e->fin_job) cm__job_release(&e->fin_job->job);
  e->fin_job = NULL;
  /* So does a cuptiSubscribe still running; what it subscribed is undone. */
  attach_abandon(e);
  /* No callback enters the engine from now on; wait for those already inside. */
  while (atomic_load(&g_inflight) != 0) sched_yield();
  cm__callbacks_free(atomic_load(&e->cb));
  /* The worker has drained the queue; items left are buffers completed after it stopped. Their
   * records are lost with the engine, and said so. */
  uint64_t lost = 0;
  pthread_mutex_lock(&e->work_mu);
  for (qitem *it = e->q_head; it;) {
    qitem *next = it->next;
    CUpti_Activity *rec = NULL;
    while (e->cupti.ActivityGetNextRecord(it->buf, it->valid, &rec) == CUPTI_SUCCESS) lost++;
    cm__pool_put(&e->pool, it->buf);
    free(it);
    it = next;
  }
  e->q_head = e->q_tail = NULL;
  pthread_mutex_unlock(&e->work_mu);
  if (lost)
    cm__engine_log(e, CM_LOG_WARN, "%llu records completed after the decoder stopped were not delivered",
         (unsigned long long)lost);
  for (qitem *it = e->q_spare; it;) {
    qitem *next = it->next;
    free(it);
    it = next;
  }
  if (e->pool.outstanding)
    cm__engine_log(e, CM_LOG_WARN, "%llu activity buffers are still owned by CUPTI and are not freed",
         (unsigned long long)e->pool.outstanding);
  cm__decoder_free(e->dec);
  cm__intern_free(e->strings);
  cm__pool_destroy(&e->pool);
  free(e->obs);
  destroy(e);
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

void cm__engine_trim(cm_engine *e) {
  if (e) cm__pool_trim(&e->pool, 0);
}

int cm_configure(cm_engine *e, const cm_config *cfg) {
  cm__clearerr();
  if (!e || !cfg) return cm__seterr(CM_EINVAL, "engine or config is NULL");
  int rc = check_config(cfg);
  if (rc) return rc;
  pthread_mutex_lock(&e->api_mu);
  e->cfg = *cfg;
  cm__pool_configure(&e->pool, cfg->buffer_size, cfg->pool_max_buffers, cfg->warn_outstanding);
  pthread_mutex_lock(&e->work_mu);
  e->self_flush_ms = cfg->self_flush_ms;
  e->deliver_ms = cfg->deliver_ms;
  e->batch_records = cfg->batch_records;
  pthread_cond_signal(&e->q_cv);
  pthread_mutex_unlock(&e->work_mu);
  pthread_mutex_unlock(&e->api_mu);
  return 0;
}

void cm_set_log(cm_engine *e, cm_log_fn fn, void *ud) {
  if (!e) return;
  pthread_mutex_lock(&e->log_mu);
  e->log_fn = fn;
  e->log_ud = ud;
  pthread_mutex_unlock(&e->log_mu);
}

int cm_observe(cm_engine *e, const cm_selection *sel, cm_observer_fn fn, void *ud, uint32_t *id) {
  cm__clearerr();
  if (!e || !sel || !fn) return cm__seterr(CM_EINVAL, "engine, selection or callback is NULL");
  bool empty = true;
  for (int k = 0; k < CM_KIND_MAX; k++)
    if (!cm__bits_empty(&sel->kinds[k])) empty = false;
  if (empty) return cm__seterr(CM_EINVAL, "the selection is empty: name at least one kind");

  pthread_mutex_lock(&e->api_mu);
  int rc = attach_cupti(e);
  if (rc) {
    pthread_mutex_unlock(&e->api_mu);
    return rc;
  }
  if (e->nobs == e->cap_obs) {
    int cap = e->cap_obs ? e->cap_obs * 2 : 8;
    /* Under dec_mu: the worker may be walking the table in deliver(). */
    pthread_mutex_lock(&e->dec_mu);
    observer *p = realloc(e->obs, (size_t)cap * sizeof *p);
    if (p) {
      e->obs = p;
      e->cap_obs = cap;
    }
    pthread_mutex_unlock(&e->dec_mu);
    if (!p) {
      pthread_mutex_unlock(&e->api_mu);
      return cm__seterr(CM_ENOMEM, "cannot grow the observer table");
    }
  }
  cm__bits next[CM_KIND_MAX];
  union_of(e, -1, sel->kinds, next);
  uint64_t want = cm__sel_kinds_needed(next);

  /* Pending records go to the current observers, decoded with the current table. */
  if (e->active) cm__engine_plain_flush(e, deadline_for(e, 0), 0);
  pthread_mutex_lock(&e->dec_mu);
  cm__engine_deliver(e);
  cm__bits prev[CM_KIND_MAX];
  memcpy(prev, e->sel, sizeof prev);
  memcpy(e->sel, next, sizeof next);
  cm__decoder_select(e->dec, e->sel);
  observer *ob = &e->obs[e->nobs++];
  ob->id = e->next_id++;
  ob->fn = fn;
  ob->ud = ud;
  memcpy(ob->sel, sel->kinds, sizeof ob->sel);
  pthread_mutex_unlock(&e->dec_mu);

  rc = apply_kinds(e, want);
  if (rc) {
    /* Roll back: the observer was never visible to a delivery with records of its new kinds. */
    pthread_mutex_lock(&e->dec_mu);
    e->nobs--;
    cm__engine_deliver(e);
    memcpy(e->sel, prev, sizeof prev);
    cm__decoder_select(e->dec, e->sel);
    pthread_mutex_unlock(&e->dec_mu);
    pthread_mutex_unlock(&e->api_mu);
    return rc;
  }
  apply_toggles(e, next);
  pthread_mutex_lock(&e->dec_mu);
  cm__decoder_watch_late(e->dec, 0, want);
  pthread_mutex_unlock(&e->dec_mu);
  if (!e->active) {
    e->active = true;
    e->session_start_ns = cm__realtime_ns();
    ADD(e, st_sessions, 1);
  }
  if (id) *id = ob->id;
  pthread_mutex_unlock(&e->api_mu);
  return 0;
}

int cm_unobserve(cm_engine *e, uint32_t id) {
  cm__clearerr();
  if (!e) return cm__seterr(CM_EINVAL, "engine is NULL");
  pthread_mutex_lock(&e->api_mu);
  int idx = -1;
  for (int o = 0; o < e->nobs; o++)
    if (e->obs[o].id == id) idx = o;
  if (idx < 0) {
    pthread_mutex_unlock(&e->api_mu);
    return cm__seterr(CM_ENOENT, "no observer with id %u", id);
  }
  bool last = e->nobs == 1;
  cm__bits next[CM_KIND_MAX];
  union_of(e, idx, NULL, next);
  uint64_t want = last ? 0 : cm__sel_kinds_needed(next);
  uint64_t leaving = e->enabled & ~want;
  /* The kinds that leave are disabled first, so CUPTI writes no more of them and every record of
   * them already exists; the fence then brings those records to the decoder, and the delivery
   * below hands them to the observers as they are now, the leaving one included. Flushing first
   * and disabling afterwards loses what the application writes in between. A buffer that CUPTI
   * completes only later (a kernel still running holds its buffer back from a plain flush) is why
   * a narrowing waits for the sync fence, not a plain flush. What still arrives after the fence
   * (the fence missed its deadline, or could not synchronize during a stream capture) is counted
   * as late and dropped (cm__decoder_watch_late), never skipped silently. */
  if (leaving) apply_kinds(e, want);
  if (last) {
    end_session(e);
  } else if (leaving) {
    int why = CM__SYNC_NONE;
    if (!cm__engine_fence(e, deadline_for(e, 0), &why))
      cm__engine_log(e, CM_LOG_WARN,
                     "the fence of a narrowing selection missed its deadline; records of the kinds "
                     "it turned off that arrive later are counted as dropped");
  } else {
    cm__engine_plain_flush(e, deadline_for(e, 0), 0);
  }
  uint64_t had = 0;
  for (int k = 0; k < CM_KIND_MAX; k++)
    if (!cm__bits_empty(&e->sel[k]) && cm__bits_empty(&next[k])) had |= 1ull << k;
  pthread_mutex_lock(&e->dec_mu);
  cm__engine_deliver(e);
  memmove(&e->obs[idx], &e->obs[idx + 1], (size_t)(e->nobs - idx - 1) * sizeof e->obs[0]);
  e->nobs--;
  memcpy(e->sel, next, sizeof next);
  cm__decoder_select(e->dec, e->sel);
  /* SYNCHRONIZATION records keep coming from every later fence, selected or not. */
  cm__decoder_watch_late(e->dec, had & ~want & ~(1ull << CM_KIND_SYNCHRONIZATION), 0);
  pthread_mutex_unlock(&e->dec_mu);
  if (!leaving) apply_kinds(e, want);
  apply_toggles(e, next);
  if (last) {
    e->active = false;
    e->session_start_ns = 0;
  }
  pthread_mutex_unlock(&e->api_mu);
  return 0;
}

int cm_flush(cm_engine *e, int mode, uint32_t timeout_ms) {
  cm__clearerr();
  if (!e) return cm__seterr(CM_EINVAL, "engine is NULL");
  if (mode != CM_FLUSH_PLAIN && mode != CM_FLUSH_SYNC)
    return cm__seterr(CM_EINVAL, "flush mode %d: use CM_FLUSH_PLAIN (0) or CM_FLUSH_SYNC (1)", mode);
  pthread_mutex_lock(&e->api_mu);
  uint64_t deadline = deadline_for(e, timeout_ms);
  int why = CM__SYNC_NONE;
  /* Detached, CUPTI holds nothing (the detach flushed it all), and a call would initialize it;
   * while a cuptiFinalize still runs, nothing may call CUPTI. */
  bool ok = atomic_load(&e->detached) || atomic_load(&e->finalizing) ? true
            : mode == CM_FLUSH_SYNC ? cm__engine_fence(e, deadline, &why)
                                    : cm__engine_plain_flush(e, deadline, 0);
  pthread_mutex_lock(&e->dec_mu);
  cm__engine_deliver(e);
  pthread_mutex_unlock(&e->dec_mu);
  uint32_t ms = timeout_ms ? timeout_ms : e->cfg.fence_timeout_ms;
  pthread_mutex_unlock(&e->api_mu);
  if (!ok) {
    cm__engine_log(e, CM_LOG_WARN,
         "%s flush missed its %u ms deadline; records produced before it may arrive later",
         mode == CM_FLUSH_SYNC ? "sync" : "plain", ms);
    return cm__seterr(CM_ETIMEDOUT, "%s flush missed its %u ms deadline",
                      mode == CM_FLUSH_SYNC ? "sync" : "plain", ms);
  }
  return 0;
}

/* ---- detach and attach ----------------------------------------------------------------------- */

/* Starts cuptiFinalize on its helper thread (above) and waits for it until `deadline`. Returns 1
 * when it returned (*rc its result), 0 when it still runs (e->fin_job keeps it; fin_settle learns
 * its end), or -1 when no helper could start (*rc an error). Called with api_mu held. */
static int finalize_bounded(cm_engine *e, uint64_t deadline, CUptiResult *rc, int *busy, bool *on_app) {
  cm__fin_job *j = calloc(1, sizeof *j);
  if (!j) {
    *rc = CUPTI_ERROR_OUT_OF_MEMORY;
    return -1;
  }
  j->start_ns = cm__realtime_ns();
  j->Finalize = e->cupti.Finalize;
  j->EnableCallback = e->cupti.EnableCallback;
  j->EnableDomain = e->cupti.EnableDomain;
  j->max_threads = e->detach_max_threads;
  j->cuDriverGetVersion = e->cupti.cuDriverGetVersion;
  j->sub = e->sub;
  if (cm__job_start(&j->job, fin_main)) {
    free(j);
    *rc = CUPTI_ERROR_UNKNOWN;
    return -1;
  }
  if (!cm__job_wait(&j->job, deadline, 0, NULL, NULL)) {
    e->fin_job = j;
    atomic_store(&e->finalizing, true);
    return 0;
  }
  *rc = j->rc;
  *busy = j->busy_threads;
  *on_app = j->on_app;
  cm__job_release(&j->job);
  return 1;
}

/* The shortest wait for cuptiFinalize, far above what it takes when it does not block. */
#define FIN_MIN_MS 200

/* Lets the worker call CUPTI again after a detach that did not happen. */
static void detach_abandoned(cm_engine *e) {
  pthread_mutex_lock(&e->work_mu);
  e->detaching = false;
  pthread_cond_signal(&e->q_cv);
  pthread_mutex_unlock(&e->work_mu);
}

/* After cuptiFinalize returned `r`: on success the engine forgets what CUPTI forgot and is
 * detached; on failure CUPTI is as it was (every kind off) and the worker may call it again.
 * Called with api_mu held. Returns 0 or the error. */
static int finalized(cm_engine *e, CUptiResult r) {
  if (r != CUPTI_SUCCESS) {
    detach_abandoned(e);
    return cm__cupti_err(&e->cupti, r, "cuptiFinalize");
  }
  /* CUPTI has forgotten the subscription, the callbacks it enabled, the buffer and timestamp
   * callbacks, the attributes and its external-correlation stacks. */
  cm__corr_finalized();
  cm__callbacks_rebind(atomic_load(&e->cb), NULL);
  e->sub = NULL;
  pthread_mutex_lock(&g_once_mu);
  g_callbacks_registered = false;
  g_timestamp_registered = false;
  pthread_mutex_unlock(&g_once_mu);
  e->latency_on = e->event_ts_on = false;
  atomic_store(&e->enabled, 0);
  pthread_mutex_lock(&e->work_mu);
  atomic_store(&e->detached, true);
  e->detaching = false;
  pthread_mutex_unlock(&e->work_mu);
  return 0;
}

/* Learns whether a cuptiFinalize left running by an earlier detach (e->fin_job) has returned, and
 * if so finishes that detach (finalized). Returns true when none is running any more, false while
 * it still runs. Called with api_mu held. */
static bool fin_settle(cm_engine *e) {
  cm__fin_job *j = e->fin_job;
  if (!j) return true;
  if (!cm__job_wait(&j->job, 0, 0, NULL, NULL)) return false;
  CUptiResult r = j->rc;
  uint64_t took = j->end_ns - j->start_ns;
  e->fin_job = NULL;
  cm__job_release(&j->job);
  atomic_store(&e->finalizing, false);
  int rc = finalized(e, r);
  if (rc == 0) {
    ADD(e, st_detaches, 1);
    ADD(e, st_detach_ns, took);
  }
  cm__engine_log(e, rc ? CM_LOG_WARN : CM_LOG_INFO, "the cuptiFinalize that outlived its detach's "
                 "deadline returned after %.1f s%s%s", (double)took / 1e9,
                 rc ? ": " : "", rc ? cm_errmsg() : "");
  return true;
}

/* The refusal while a cuptiFinalize still runs (fin_settle returned false). */
static int fin_pending(cm_engine *e) {
  uint64_t took = cm__realtime_ns() - e->fin_job->start_ns;
  return cm__seterr(CM_EAGAIN, "CUPTI is still being finalized (cuptiFinalize has not returned "
                               "after %.1f s): it cannot trace again until it has", (double)took / 1e9);
}

/* What a detach may not finalize under: returns 0, or the refusal. */
static int finalize_refused(cm_engine *e) {
  if (!e->cupti.Finalize)
    return cm__seterr(CM_ENOSYS, "the loaded libcupti (%s) has no cuptiFinalize: CUPTI cannot be "
                                 "detached", e->cupti.path);
  if (atomic_load(&e->exiting))
    return cm__seterr(CM_ESTATE, "the process is exiting: the exit's fence owns CUPTI");
  if (cm__pm_profiler_initialized())
    return cm__seterr(CM_ENOSYS, "PM sampling has initialized CUPTI's profiler in this process, "
                                 "and CUPTI does not document that state across a cuptiFinalize: "
                                 "CUPTI stays attached");
  if (cm__callbacks_captures_active(atomic_load(&e->cb)))
    return cm__seterr(CM_EBUSY, "a CUDA graph capture is in progress: CUPTI is not detached in "
                                "the middle of one");
  return 0;
}

/* The detach itself, with every kind already off: the decode worker leaves CUPTI alone, forced
 * flushes return every buffer CUPTI holds, what they carry is decoded and delivered, and
 * cuptiFinalize runs (finalize_bounded); the engine then forgets what CUPTI forgot. Returns 0
 * (e->detached is then set), CM_ETIMEDOUT while cuptiFinalize still runs past the deadline (see
 * fin_settle), or the reason nothing was finalized (the worker may call CUPTI again then).
 * Called with api_mu held. */
static int drain_and_finalize(cm_engine *e, uint64_t deadline) {
  /* From here the worker makes no CUPTI call; one it is inside of finishes first. */
  pthread_mutex_lock(&e->work_mu);
  e->detaching = true;
  while (e->worker_in_cupti) {
    uint64_t now = cm__mono_ms();
    if (now >= deadline) break;
    struct timespec ts;
    cm__abstime_in(&ts, deadline - now);
    pthread_cond_timedwait(&e->done_cv, &e->work_mu, &ts);
  }
  bool busy = e->worker_in_cupti;
  pthread_mutex_unlock(&e->work_mu);
  if (busy) {
    detach_abandoned(e);
    return cm__seterr(CM_ETIMEDOUT, "the decode worker's CUPTI flush did not return before the "
                                    "deadline: CUPTI stays attached");
  }
  /* No kind is enabled, so CUPTI writes nothing new. A forced flush returns every buffer it
   * holds, partly filled ones included, and what they carry is decoded and delivered (records
   * that arrive once the last observer has gone are counted as late). CUPTI behind on a kind may
   * still write records it held back, so the flushes go on until two in a row bring none. */
  bool caught_up;
  uint64_t decoded = LOAD(e, st_records_decoded);
  int quiet = 0;
  for (;;) {
    caught_up = cm__engine_plain_flush(e, deadline, CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    uint64_t now_decoded = LOAD(e, st_records_decoded);
    if (now_decoded == decoded) quiet++;
    else quiet = 0;
    decoded = now_decoded;
    if (!caught_up || quiet >= 2 || cm__mono_ms() >= deadline || atomic_load(&e->exiting)) break;
  }
  pthread_mutex_lock(&e->dec_mu);
  cm__engine_deliver(e);
  pthread_mutex_unlock(&e->dec_mu);
  uint64_t held = cm__engine_cupti_buffers(e);
  if (atomic_load(&e->exiting)) {
    detach_abandoned(e);
    return cm__seterr(CM_ESTATE, "the process began to exit during the detach: CUPTI stays attached");
  }
  if (!caught_up || quiet < 2 || held) {
    detach_abandoned(e);
    /* A buffer CUPTI still holds would be lost with its records, or written after the pool
     * forgot it, and so would records CUPTI has not written yet; so no detach until CUPTI has
     * given every buffer back and a flush brings nothing more. */
    if (held)
      return cm__seterr(CM_EAGAIN, "CUPTI still holds %llu activity buffer(s) after a forced "
                                   "flush: CUPTI stays attached", (unsigned long long)held);
    return cm__seterr(CM_EAGAIN, "CUPTI was still delivering records at the deadline: CUPTI stays "
                                 "attached");
  }
  /* A capture that began during the flushes: CUPTI stays, so that its end is seen. */
  cm__callbacks *cb = atomic_load(&e->cb);
  if (cm__callbacks_captures_active(cb)) {
    detach_abandoned(e);
    return cm__seterr(CM_EBUSY, "a CUDA graph capture began during the detach: CUPTI stays "
                                "attached");
  }
  /* cuptiFinalize gets at least FIN_MIN_MS, whatever the flushes left of the deadline. */
  uint64_t now = cm__mono_ms();
  CUptiResult r = CUPTI_SUCCESS;
  int app_threads = 0;
  bool on_app = false;
  int got = finalize_bounded(e, deadline > now + FIN_MIN_MS ? deadline : now + FIN_MIN_MS, &r,
                             &app_threads, &on_app);
  atomic_store(&e->probe_busy_threads, app_threads);
  if (got == 1 && app_threads > 0) {
    detach_abandoned(e);
    return cm__seterr(CM_EBUSY, "%d threads called the CUDA runtime within %d ms: CUPTI stays "
                                "attached, since attaching it again would not return while so "
                                "many threads call it", app_threads, FIN_PROBE_MS);
  }
  if (got == 1 && r == CUPTI_SUCCESS)
    cm__engine_log(e, CM_LOG_DEBUG, "cuptiFinalize ran on %s", on_app ? "an application thread, "
                   "at the exit of its runtime call" : "the finalize helper");
  if (got == 0)
    return cm__seterr(CM_ETIMEDOUT, "cuptiFinalize did not return by the deadline (CUPTI can "
                                    "wait for the application's threads to leave it): it goes on "
                                    "in the background, and nothing is traced until it returns");
  return finalized(e, r);
}

static int detach_locked(cm_engine *e, uint32_t timeout_ms) {
  if (!fin_settle(e)) return fin_pending(e);
  if (atomic_load(&e->detached)) return 0;
  int rc = finalize_refused(e);
  if (rc) return rc;
  if (e->nobs > 0)
    return cm__seterr(CM_EBUSY, "%d observer(s) registered: CUPTI is detached only while nothing "
                                "is traced", e->nobs);
  uint32_t arms = cm__callbacks_consumer_arms(atomic_load(&e->cb));
  if (arms)
    return cm__seterr(CM_EBUSY, "%u subscriber callback(s) armed by consumers: they would stop "
                                "firing, so CUPTI stays attached", arms);
  uint64_t t0 = cm__realtime_ns();
  rc = drain_and_finalize(e, deadline_for(e, timeout_ms));
  if (rc) return rc;
  uint64_t took = cm__realtime_ns() - t0;
  ADD(e, st_detaches, 1);
  ADD(e, st_detach_ns, took);
  cm__engine_log(e, CM_LOG_INFO, "CUPTI detached (cuptiFinalize) in %.1f ms; it attaches again "
                 "with the next observer", (double)took / 1e6);
  return 0;
}

/* ---- the attach helper -----------------------------------------------------------------------
 *
 * Attaching again after a detach can block as well: with many threads launching, an attach can
 * hold the agent's control thread for seconds, and the monitor's flush times out meanwhile
 * (bench/RESULTS.md, "Duty cycle"). So the subscription, CUPTI's first call after cuptiFinalize and
 * the one that initializes it again, runs on a helper thread, and the attach waits for it until
 * ATTACH_WAIT_MS only. Past that, the attach is refused (the duty cycle's window is discarded
 * with the reason) and the engine stays detached; the helper goes on, and the next attach takes
 * its subscription once it has returned. The helper touches its job alone: it hands the engine to
 * CUPTI as the callbacks' userdata, which the callbacks check against the live engine before use,
 * and when the engine was freed meanwhile it unsubscribes what it got itself. The calls after the
 * subscription (the buffer callbacks, the pinned callbacks) stay on the caller; the attach's log
 * line times each step. On the GPUs these calls never blocked and cuptiSubscribe is the one
 * that does, so it alone is bounded. */
typedef struct cm__att_job {
  cm__job job;                /* first (job.c) */
  cm__cupti c;                /* the engine's CUPTI entry points, copied */
  void *ud;                   /* the engine, for CUPTI only */
  CUpti_SubscriberHandle sub; /* the result, once done */
  CUptiResult rc;
  char old[128];              /* the name of a subscriber already there */
  uint64_t start_ns, end_ns;  /* CLOCK_REALTIME when it began and when it returned */
} cm__att_job;

/* How long an attach waits for cuptiSubscribe, far above what it takes when it does not block. */
#define ATTACH_WAIT_MS 500

static void *att_main(void *arg) {
  cm__att_job *j = arg;
  j->rc = subscribe_call(&j->c, &j->sub, j->ud, j->old, sizeof j->old);
  j->end_ns = cm__realtime_ns();
  /* An engine freed meanwhile left the subscription to the helper (attach_abandon). */
  if (cm__job_finish(&j->job) && j->rc == CUPTI_SUCCESS) j->c.Unsubscribe(j->sub);
  cm__job_release(&j->job);
  return NULL;
}

/* The subscription of an attach: taken from the helper left by an earlier attach once it has
 * returned, or from a new helper waited for until ATTACH_WAIT_MS (a direct call when no helper
 * can start). Returns 0 with e->sub set and *t0 the moment the subscription began, or the error;
 * CM_EAGAIN, with e->att_job kept, while cuptiSubscribe still runs. Called with api_mu held. */
static int attach_subscribe(cm_engine *e, uint64_t *t0) {
  cm__att_job *j = e->att_job;
  if (j) {
    if (!cm__job_wait(&j->job, 0, 0, NULL, NULL))
      return cm__seterr(CM_EAGAIN, "CUPTI is still attaching (cuptiSubscribe has not returned "
                                   "after %.1f s): nothing is traced until it has",
                        (double)(cm__realtime_ns() - j->start_ns) / 1e9);
    cm__engine_log(e, CM_LOG_INFO, "the cuptiSubscribe that outlived its attach's wait returned "
                   "after %.1f s", (double)(j->end_ns - j->start_ns) / 1e9);
  } else {
    *t0 = cm__realtime_ns();
    j = calloc(1, sizeof *j);
    if (!j) return subscribe(e);
    j->c = e->cupti;
    j->ud = e;
    j->start_ns = *t0;
    if (cm__job_start(&j->job, att_main)) {
      free(j);
      return subscribe(e);
    }
    if (!cm__job_wait(&j->job, cm__mono_ms() + ATTACH_WAIT_MS, 0, NULL, NULL)) {
      e->att_job = j;
      return cm__seterr(CM_EAGAIN, "cuptiSubscribe did not return within %d ms (CUPTI can wait "
                                   "for the application's threads while it initializes): it goes "
                                   "on in the background, and nothing is traced until it returns",
                        ATTACH_WAIT_MS);
    }
  }
  e->att_job = NULL;
  *t0 = j->start_ns;
  CUptiResult r = j->rc;
  e->sub = r == CUPTI_SUCCESS ? j->sub : NULL;
  char old[sizeof j->old];
  memcpy(old, j->old, sizeof old);
  old[sizeof old - 1] = 0;
  cm__job_release(&j->job);
  return subscribe_result(&e->cupti, r, old);
}

/* Forgets an attach's helper at the engine's end: a subscription it got is undone, by the engine
 * when the helper has returned, else by the helper when it does. Called once nothing else uses
 * the engine. */
static void attach_abandon(cm_engine *e) {
  cm__att_job *j = e->att_job;
  if (!j) return;
  e->att_job = NULL;
  if (cm__job_abandon(&j->job) && j->rc == CUPTI_SUCCESS) j->c.Unsubscribe(j->sub);
  cm__job_release(&j->job);
}

/* Subscribes again after a detach: the subscription (attach_subscribe), the buffer and timestamp
 * callbacks, every pinned or armed callback, and the external-correlation hooks; timed, each step
 * apart, so that the log says which CUPTI call held a slow attach. No-op while attached; refused
 * while a detach's cuptiFinalize, or an earlier attach's cuptiSubscribe, still runs. Called with
 * api_mu held. */
static int attach_cupti(cm_engine *e) {
  if (!fin_settle(e)) return fin_pending(e);
  if (!atomic_load(&e->detached)) return 0;
  if (atomic_load(&e->exiting))
    return cm__seterr(CM_ESTATE, "the process is exiting: CUPTI stays detached");
  uint64_t t0 = 0;
  int rc = attach_subscribe(e, &t0);
  if (rc) return rc;
  uint64_t t1 = cm__realtime_ns();
  rc = register_activity(e);
  if (rc) {
    e->cupti.Unsubscribe(e->sub);
    e->sub = NULL;
    return rc;
  }
  uint64_t t2 = cm__realtime_ns();
  cm__callbacks_rebind(atomic_load(&e->cb), e->sub);
  uint64_t t3 = cm__realtime_ns();
  cm__corr_attach(&e->cupti);
  pthread_mutex_lock(&e->work_mu);
  atomic_store(&e->detached, false);
  pthread_cond_signal(&e->q_cv);
  pthread_mutex_unlock(&e->work_mu);
  uint64_t t4 = cm__realtime_ns();
  ADD(e, st_attach_ns, t4 - t0);
  cm__engine_log(e, CM_LOG_INFO, "CUPTI attached again in %.1f ms (cuptiSubscribe %.1f ms, the "
                 "activity callbacks %.1f ms, the pinned and armed callbacks %.1f ms, external "
                 "correlation %.1f ms)", (double)(t4 - t0) / 1e6, (double)(t1 - t0) / 1e6,
                 (double)(t2 - t1) / 1e6, (double)(t3 - t2) / 1e6, (double)(t4 - t3) / 1e6);
  return 0;
}

int cm_cupti_detach(cm_engine *e, uint32_t timeout_ms) {
  cm__clearerr();
  if (!e) return cm__seterr(CM_EINVAL, "cm_cupti_detach: engine is NULL");
  pthread_mutex_lock(&e->api_mu);
  int rc = detach_locked(e, timeout_ms);
  pthread_mutex_unlock(&e->api_mu);
  return rc;
}

int cm_cupti_attach(cm_engine *e) {
  cm__clearerr();
  if (!e) return cm__seterr(CM_EINVAL, "cm_cupti_attach: engine is NULL");
  pthread_mutex_lock(&e->api_mu);
  int rc = attach_cupti(e);
  pthread_mutex_unlock(&e->api_mu);
  return rc;
}

int cm_cupti_detached(cm_engine *e) { return e && atomic_load(&e->detached) ? 1 : 0; }

const char *cm_string(cm_engine *e, uint32_t id, size_t *len) {
  if (!e) return NULL;
  return cm__intern_get(e->strings, id, len);
}

uint32_t cm_string_count(cm_engine *e) { return e ? cm__intern_count(e->strings) : 0; }

int cm_stats_get(cm_engine *e, cm_stats *out) {
  if (!e || !out) return cm__seterr(CM_EINVAL, "engine or out is NULL");
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&e->pool.mu);
  out->buffers_allocated = e->pool.allocated;
  out->buffers_outstanding = e->pool.outstanding;
  out->buffers_free = e->pool.free_count;
  out->buffers_refused = e->pool.refused;
  pthread_mutex_unlock(&e->pool.mu);
  out->buffers_decoded = LOAD(e, st_buffers_decoded);
  out->bytes_decoded = LOAD(e, st_bytes_decoded);
  out->records_decoded = LOAD(e, st_records_decoded);
  out->lag_cupti_ns = LOAD(e, lag_cupti_ns);
  out->lag_decode_ns = LOAD(e, lag_decode_ns);
  out->lag_decode_peak_ns = LOAD(e, lag_decode_peak_ns);
  out->decode_wait_ns = LOAD(e, decode_wait_ns);
  out->records_delivered = LOAD(e, st_records_delivered);
  out->records_dropped = LOAD(e, st_records_dropped);
  out->drains = LOAD(e, st_drains);
  out->fences = LOAD(e, st_fences);
  out->fence_timeouts = LOAD(e, st_fence_timeouts);
  out->sessions = LOAD(e, st_sessions);
  out->cupti_detaches = LOAD(e, st_detaches);
  out->cupti_detach_ns = LOAD(e, st_detach_ns);
  out->cupti_attach_ns = LOAD(e, st_attach_ns);
  out->kind_changes = LOAD(e, st_kind_changes);
  out->kind_change_ns = LOAD(e, st_kind_change_ns);
  out->kind_change_max_ns = LOAD(e, st_kind_change_max_ns);
  out->strings = cm__intern_count(e->strings);
  pthread_mutex_lock(&e->work_mu);
  out->decode_queue_depth = e->q_depth;
  out->decode_queue_peak = e->q_peak;
  pthread_mutex_unlock(&e->work_mu);
  /* The decoder publishes these counters atomically, so no dec_mu: an observer may call this. */
  for (int k = 0; k < CM_KIND_MAX; k++) out->records_by_kind[k] = cm__decoder_seen(e->dec, k);
  out->records_dropped += cm__decoder_lost(e->dec) + cm__decoder_late(e->dec);
  return 0;
}

int cm_session_info_get(cm_engine *e, cm_session_info *out) {
  if (!e || !out) return cm__seterr(CM_EINVAL, "engine or out is NULL");
  memset(out, 0, sizeof *out);
  out->cupti_version = e->cupti_version;
  out->clock_realtime = e->clock_realtime;
  out->clock_offset_ns = e->clock_offset_ns;
  out->timestamp_callback = e->timestamp_callback;
  out->active = atomic_load(&e->active);
  out->session_start_ns = atomic_load(&e->session_start_ns);
  snprintf(out->cupti_path, sizeof out->cupti_path, "%s", e->cupti.path);
  return 0;
}

uint64_t cm_enabled_kinds(cm_engine *e) {
  if (!e) return 0;
  return atomic_load(&e->enabled);
}

/* ---- subscriber callbacks: the public calls over the engine's handler registry ---------------- */

/* ---- PM sampling: the public calls over pmsample.c ------------------------------------------- */

/* The expected time between two polls: the delivery cadence, or a second when deliveries are
 * driven by the caller's flushes (the in-process host flushes on its own cadence). */
static uint32_t poll_ms(const cm_engine *e) { return e->cfg.deliver_ms ? e->cfg.deliver_ms : 1000; }

int cm_pm_sample_add(cm_engine *e, int device, const char *const *metrics, uint32_t nmetrics,
                     uint32_t interval_us, uint32_t *id) {
  cm__clearerr();
  if (!e) return cm__seterr(CM_EINVAL, "cm_pm_sample_add: engine is NULL");
  pthread_mutex_lock(&e->api_mu);
  int rc = attach_cupti(e);
  if (!rc) rc = cm__pm_add(e->pm, device, metrics, nmetrics, interval_us, poll_ms(e), id);
  pthread_mutex_unlock(&e->api_mu);
  return rc;
}

int cm_pm_sample_remove(cm_engine *e, uint32_t id) {
  cm__clearerr();
  if (!e) return cm__seterr(CM_EINVAL, "cm_pm_sample_remove: engine is NULL");
  pthread_mutex_lock(&e->api_mu);
  int rc = cm__pm_remove(e->pm, id, poll_ms(e));
  pthread_mutex_unlock(&e->api_mu);
  return rc;
}

int cm_pm_stats_get(cm_engine *e, cm_pm_stats *out) {
  cm__clearerr();
  if (!e || !out) return cm__seterr(CM_EINVAL, "cm_pm_stats_get: engine or out is NULL");
  cm__pm_stats(e->pm, out);
  return 0;
}

int cm_callback_register(cm_engine *e, int domain, uint32_t cbid, cm_callback_fn fn, void *ud,
                         uint32_t *handle) {
  cm__clearerr();
  if (!e) return cm__seterr(CM_EINVAL, "cm_callback_register: engine is NULL");
  return cm__callbacks_register(e->cb, domain, cbid, fn, ud, handle);
}

int cm_callback_unregister(cm_engine *e, uint32_t handle) {
  cm__clearerr();
  if (!e) return cm__seterr(CM_EINVAL, "cm_callback_unregister: engine is NULL");
  return cm__callbacks_unregister(e->cb, handle);
}

int cm_callback_arm(cm_engine *e, int domain, uint32_t cbid) {
  cm__clearerr();
  if (!e) return cm__seterr(CM_EINVAL, "cm_callback_arm: engine is NULL");
  /* Detached, an armed callback would not fire: CUPTI attaches again first. The control lock is
   * taken only then, so a handler that arms (CUPTI is attached while it runs) never waits on it. */
  if (atomic_load(&e->detached) || atomic_load(&e->finalizing)) {
    pthread_mutex_lock(&e->api_mu);
    int rc = attach_cupti(e);
    pthread_mutex_unlock(&e->api_mu);
    if (rc) return rc;
  }
  return cm__callbacks_arm(e->cb, domain, cbid);
}

int cm_callback_disarm(cm_engine *e, int domain, uint32_t cbid) {
  cm__clearerr();
  if (!e) return cm__seterr(CM_EINVAL, "cm_callback_disarm: engine is NULL");
  return cm__callbacks_disarm(e->cb, domain, cbid);
}

int cm_callback_armed(cm_engine *e, int domain, uint32_t cbid) {
  if (!e) return cm__seterr(CM_EINVAL, "cm_callback_armed: engine is NULL");
  return cm__callbacks_armed(e->cb, domain, cbid);
}

int cm_callback_stats_get(cm_engine *e, cm_callback_stats *out) {
  if (!e) return cm__seterr(CM_EINVAL, "cm_callback_stats_get: engine is NULL");
  return cm__callbacks_stats(e->cb, out);
}
