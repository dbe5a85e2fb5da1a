/*
 * subscription.c: the engine's CUPTI subscription. CUPTI allows one subscriber per process, and
 * the engine is it. This file holds the process's one engine slot, the entry points CUPTI calls
 * (the buffer request and completion callbacks, the timestamp callback, and the trampoline of
 * the subscriber callbacks), the subscription made at creation, and its lifecycle afterwards:
 * the detach (cm_cupti_detach: every buffer drained, then cuptiFinalize on the finalize helper)
 * and the attach (cm_cupti_attach: cuptiSubscribe on the attach helper, then everything that
 * cuptiFinalize forgot). engine.c calls into it; it calls down into fence.c (flushes),
 * delivery.c, log.c, callbacks.c, correlation.c, pmsample.c and job.c, never back into engine.c.
 *
 * Threads and locks.
 *  - CUPTI's threads (and the application's, for per-thread buffers) call the buffer request and
 *    completion callbacks. They take only pool.mu or engine.work_mu, each for a list operation, so
 *    the application is never made to wait on decoding or on an observer. Every callback counts
 *    itself in flight before it reads g_engine, so that cm__engine_unsubscribe can wait until no
 *    callback is inside an engine being freed.
 *  - The detach and the attach run on the thread of a control call, with engine.api_mu held. They
 *    set the flags the decode worker obeys (detaching, detached) under engine.work_mu, and wait
 *    for the worker to leave CUPTI on done_cv.
 *  - The finalize helper and the attach helper are job.c threads that touch their job alone,
 *    never the engine, which may be freed while they block in CUPTI; the control path reads what
 *    they wrote only once cm__job_wait has said that they finished.
 *  - g_once_mu, a leaf, guards the process's engine slot and the registrations made once per
 *    CUPTI initialization (the buffer and timestamp callbacks), which cuptiFinalize undoes.
 */
#include <sched.h>
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
 * g_engine, and cm__engine_unsubscribe (at cm_engine_free) clears g_engine before it waits for
 * the count to reach zero, so no callback can touch an engine being freed (sequentially
 * consistent atomics make the two orders agree). */
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

bool cm__engine_claim_slot(void) {
  pthread_mutex_lock(&g_once_mu);
  bool exists = g_engine_exists;
  g_engine_exists = true;
  pthread_mutex_unlock(&g_once_mu);
  return !exists;
}

void cm__engine_release_slot(void) {
  pthread_mutex_lock(&g_once_mu);
  g_engine_exists = false;
  pthread_mutex_unlock(&g_once_mu);
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

uint64_t cm__engine_cupti_buffers(cm_engine *e) {
  return atomic_load_explicit(&e->cupti_buffers, memory_order_relaxed);
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

/* ---- the subscription ------------------------------------------------------------------------ */

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
int cm__engine_subscribe(cm_engine *e) {
  char old[128] = "";
  CUptiResult r = subscribe_call(&e->cupti, &e->sub, e, old, sizeof old);
  return subscribe_result(&e->cupti, r, old);
}

/* Registers the timestamp callback (when configured) and the buffer callbacks, once per CUPTI
 * initialization: at creation, and again after a detach (cuptiFinalize forgets them). */
int cm__engine_register_activity(cm_engine *e) {
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

void cm__engine_publish(cm_engine *e) {
  atomic_store(&g_engine, e);
  cm__corr_attach(&e->cupti);
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
  if (cm__callbacks_graphs_used(atomic_load(&e->cb)))
    return cm__seterr(CM_ENOSYS, "the process uses CUDA graphs, whose launches a cuptiFinalize "
                                 "followed by a new subscription breaks: CUPTI stays attached");
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
  rc = drain_and_finalize(e, cm__engine_deadline(e, timeout_ms));
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
    if (!j) return cm__engine_subscribe(e);
    j->c = e->cupti;
    j->ud = e;
    j->start_ns = *t0;
    if (cm__job_start(&j->job, att_main)) {
      free(j);
      return cm__engine_subscribe(e);
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
int cm__engine_attach(cm_engine *e) {
  if (!fin_settle(e)) return fin_pending(e);
  if (!atomic_load(&e->detached)) return 0;
  if (atomic_load(&e->exiting))
    return cm__seterr(CM_ESTATE, "the process is exiting: CUPTI stays detached");
  uint64_t t0 = 0;
  int rc = attach_subscribe(e, &t0);
  if (rc) return rc;
  uint64_t t1 = cm__realtime_ns();
  rc = cm__engine_register_activity(e);
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

void cm__engine_unsubscribe(cm_engine *e) {
  atomic_store(&g_engine, NULL);
  cm__corr_detach();
  /* Handlers live as long as the subscription: both go only at the engine's end, never with a
   * session. A detached engine has no subscription left. */
  if (!atomic_load(&e->detached) && !e->fin_job) e->cupti.Unsubscribe(e->sub);
  /* A cuptiFinalize still running keeps its job, never the engine. */
  if (e->fin_job) cm__job_release(&e->fin_job->job);
  e->fin_job = NULL;
  /* So does a cuptiSubscribe still running; what it subscribed is undone. */
  attach_abandon(e);
  /* No callback enters the engine from now on; wait for those already inside. */
  while (atomic_load(&g_inflight) != 0) sched_yield();
}

bool cm__engine_finalizing(cm_engine *e) { return atomic_load(&e->finalizing); }

void cm__engine_set_detach_max_threads(cm_engine *e, int n) {
  pthread_mutex_lock(&e->api_mu);
  e->detach_max_threads = n < 0 ? 0 : n;
  pthread_mutex_unlock(&e->api_mu);
}

int cm__engine_probe_busy_threads(cm_engine *e) { return atomic_load(&e->probe_busy_threads); }

bool cm__engine_graphs_used(cm_engine *e) { return cm__callbacks_graphs_used(atomic_load(&e->cb)); }

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
  int rc = cm__engine_attach(e);
  pthread_mutex_unlock(&e->api_mu);
  return rc;
}

int cm_cupti_detached(cm_engine *e) { return e && atomic_load(&e->detached) ? 1 : 0; }
