/*
 * engine.h: the engine's state, shared by the files of the engine noun: engine.c (creation,
 * observers, selection reconcile, the public calls), subscription.c (the CUPTI subscription:
 * CUPTI's callbacks into the engine, detach and attach), worker.c (the decode worker),
 * delivery.c (records to the observers), fence.c (flushes, device synchronization and the sync
 * fence) and log.c (the log callback). Calls go one way: engine.c calls into the others;
 * subscription.c and worker.c into fence.c, delivery.c and log.c; fence.c into delivery.c and
 * log.c; none of them back into engine.c. Nothing outside engine/core includes it.
 *
 * Threads and locks (see docs/architecture.md for the whole table). Fields are grouped by the
 * lock that guards them: engine.api_mu serializes the control calls; engine.dec_mu guards the
 * decoder, the observers and the decode selection; engine.work_mu guards the queue of completed
 * buffers. Lock order: api_mu, then dec_mu, then work_mu; the pool's mutex is a leaf.
 */
#ifndef CM_ENGINE_H
#define CM_ENGINE_H

#include "cm_internal.h"

typedef struct qitem {
  struct qitem *next;
  uint8_t *buf;
  size_t valid;
  uint64_t completed_ns; /* CLOCK_REALTIME when CUPTI completed the buffer */
} qitem;

typedef struct observer {
  uint32_t id;
  cm_observer_fn fn;
  void *ud;
  cm__bits sel[CM_KIND_MAX];
} observer;

struct cm_engine {
  cm__cupti cupti;
  CUpti_SubscriberHandle sub;
  cm__pool pool;
  cm__intern *strings;
  cm__decoder *dec;
  /* Handlers and arming (callbacks.c); lives as long as the subscription. Set once, after the
   * subscription exists, so the trampoline reads it atomically. */
  _Atomic(cm__callbacks *) cb;
  /* PM sampling sessions (pmsample.c); set at creation, freed before the subscription. */
  cm__pm *pm;
  pthread_t worker;
  bool worker_started;

  /* Guarded by log_mu: the log callback. */
  pthread_mutex_t log_mu;
  cm_log_fn log_fn;
  void *log_ud;

  /* Guarded by api_mu: the control path's state. */
  pthread_mutex_t api_mu;
  cm_config cfg;
  /* enabled, active and session_start_ns are written under api_mu and read without it (by the
   * getters, which observers may call while a control call holds api_mu). */
  _Atomic uint64_t enabled; /* kinds enabled in CUPTI, bit per kind */
  /* Kinds kept disabled in CUPTI whatever the observers select (cm__engine_set_suppressed): the
   * agent's lag guard stops CUPTI writing them while the records it already wrote still reach
   * the observers. Written under api_mu; the decode worker reads it without (worker.c). */
  _Atomic uint64_t suppressed;
  atomic_bool active;
  bool latency_on;
  bool event_ts_on;
  _Atomic uint64_t session_start_ns;

  /* Guarded by dec_mu: the decoder, the observers and the selection the decoder runs with. */
  pthread_mutex_t dec_mu;
  observer *obs;
  int nobs;
  int cap_obs;
  uint32_t next_id;
  cm__bits sel[CM_KIND_MAX];
  uint64_t drain_seq;

  /* Guarded by work_mu: the queue of completed buffers and the worker's control. */
  pthread_mutex_t work_mu;
  pthread_cond_t q_cv;      /* signals the worker: work queued, stop, or a cadence change */
  pthread_cond_t done_cv;   /* signals waiters: a buffer was decoded */
  qitem *q_head, *q_tail;
  qitem *q_spare;           /* recycled queue items */
  uint64_t enqueued;        /* buffers queued, ever */
  uint64_t decoded;         /* buffers decoded (or discarded), ever */
  uint64_t q_depth, q_peak;
  bool stop;
  /* cm__engine_flush_forced_async asked the worker for one forced flush (forced_wanted), whose
   * records the worker delivers once it has decoded what the flush completed (deliver_wanted). */
  bool forced_wanted, deliver_wanted;
  uint32_t forced_sync_ms; /* the deadline of the synchronize before that flush */
  uint32_t self_flush_ms;
  uint32_t deliver_ms;
  uint32_t batch_records;

  /* Session facts, written once at creation. */
  uint32_t cupti_version;
  int clock_realtime;
  int64_t clock_offset_ns;
  int timestamp_callback;

  /* Counters, updated with relaxed atomics from any thread. */
  _Atomic uint64_t st_buffers_decoded, st_bytes_decoded, st_records_decoded, st_records_delivered,
      st_records_dropped, st_drains, st_fences, st_fence_timeouts, st_sessions;
  /* Fences that did not synchronize the device: a capture was in progress, or an abandoned sync
   * was still blocked. */
  _Atomic uint64_t st_sync_skipped_capture, st_sync_skipped_busy, st_sync_abandoned;
  /* The stage lags of the newest decoded buffer (cm_stats), stored by the decode worker. */
  _Atomic uint64_t lag_cupti_ns, lag_decode_ns, lag_decode_peak_ns, decode_wait_ns;
  /* The longest CUPTI held a record, over the buffers decoded since the agent's lag guard last
   * took it (cm__engine_take_lag_held_max): the newest buffer's alone would be noisy, since a
   * buffer of fresh API records can follow one of late kernel records at once. */
  _Atomic uint64_t lag_held_max_ns;
  /* Activity buffers CUPTI holds: handed to it by on_buffer_request and not yet completed
   * (cm__engine_cupti_buffers). */
  _Atomic uint64_t cupti_buffers;

  /* Set by the exit fence: waits of other control calls end at once (see t_exit_fence). */
  atomic_bool exiting;

  /* CUPTI detached (cm_cupti_detach): cuptiFinalize has run and no subscription exists, so
   * nothing may call CUPTI until attach_cupti subscribes again. Written under api_mu (and
   * work_mu, for the worker), read atomically. */
  atomic_bool detached;
  /* work_mu: a detach is under way (the worker makes no CUPTI call), and whether the worker is
   * inside one now (the detach waits until it is not; done_cv signals it). */
  bool detaching, worker_in_cupti;
  /* A cuptiFinalize that did not return by its deadline and runs on in its helper thread
   * (subscription.c, "detach and attach"): api_mu. `finalizing` is set meanwhile (read atomically), and
   * `detaching` stays set, so that nothing calls CUPTI until it has returned. */
  struct cm__fin_job *fin_job;
  atomic_bool finalizing;
  /* The detach's probe (subscription.c, "the finalize helper"): refuse a finalize when this many
   * application threads call the runtime within its time (0: no probe, and no application thread
   * finalizes); and what the last probe that refused counted (0 when the last detach was not
   * refused by it). api_mu; the count read atomically. */
  int detach_max_threads;
  atomic_int probe_busy_threads;
  /* A cuptiSubscribe of an attach that did not return by its deadline and runs on in its helper
   * thread (subscription.c, "the attach helper"): api_mu. `detached` stays set meanwhile, so nothing
   * calls CUPTI; the next attach takes its subscription once it has returned. */
  struct cm__att_job *att_job;
  /* Detaches and attaches again since creation, and the time they took (cm_stats). */
  _Atomic uint64_t st_detaches, st_detach_ns, st_attach_ns;
  /* The changes of the kinds enabled in CUPTI (apply_kinds), the time their enable and disable
   * calls took, summed and the longest (cm_stats), and CLOCK_REALTIME just before the first
   * enable of the last change that enabled a kind (cm__engine_enable_start_ns). */
  _Atomic uint64_t st_kind_changes, st_kind_change_ns, st_kind_change_max_ns;
  _Atomic uint64_t enable_start_ns;
};

#define ADD(e, field, v) atomic_fetch_add_explicit(&(e)->field, (v), memory_order_relaxed)
#define LOAD(e, field) atomic_load_explicit(&(e)->field, memory_order_relaxed)

/* Raises *p to v when v is larger; any thread (the lag's and the kind changes' peaks). */
static inline void cm__atomic_max_u64(_Atomic uint64_t *p, uint64_t v) {
  uint64_t cur = atomic_load_explicit(p, memory_order_relaxed);
  while (v > cur && !atomic_compare_exchange_weak_explicit(p, &cur, v, memory_order_relaxed,
                                                           memory_order_relaxed)) {
  }
}

/* The deadline (CLOCK_MONOTONIC ms) of a control call that waits `timeout_ms`, 0 meaning the
 * configured fence timeout. Called with api_mu held (it reads cfg). */
static inline uint64_t cm__engine_deadline(const cm_engine *e, uint32_t timeout_ms) {
  return cm__mono_ms() + (timeout_ms ? timeout_ms : e->cfg.fence_timeout_ms);
}

/* ---- log.c ----------------------------------------------------------------------------------- */

/* Logs through the engine's log callback (engine.log_mu held while it runs). Any thread. */
void cm__engine_log(cm_engine *e, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- delivery.c ------------------------------------------------------------------------------ */

/* Hands every held record to the observers, then empties the decoder. Called with dec_mu held. */
void cm__engine_deliver(cm_engine *e);

/* ---- subscription.c -------------------------------------------------------------------------- */

/* Takes the process's one engine slot (CUPTI allows one subscriber per process): false when an
 * engine already holds it. cm__engine_release_slot gives it back. Any thread. */
bool cm__engine_claim_slot(void);
void cm__engine_release_slot(void);
/* Subscribes to CUPTI (e->sub): at creation, and after a detach when no attach helper can start.
 * Fails with CM_EBUSY, naming the holder, when another subscriber holds the process. */
int cm__engine_subscribe(cm_engine *e);
/* Registers the timestamp callback (when configured) and the buffer callbacks, once per CUPTI
 * initialization: at creation, and again after a detach (cuptiFinalize forgets them). */
int cm__engine_register_activity(cm_engine *e);
/* The last step of cm_engine_new: CUPTI's callbacks reach the engine from now on, and external
 * correlation is bound to CUPTI. */
void cm__engine_publish(cm_engine *e);
/* The subscription's end, in cm_engine_free once the worker has stopped: CUPTI's callbacks no
 * longer reach the engine, the subscription is undone (or left to a helper still running, which
 * undoes it), and it returns once no callback is inside the engine. */
void cm__engine_unsubscribe(cm_engine *e);
/* Subscribes again after a detach (cm_cupti_attach); no-op while attached; refused while a
 * detach's cuptiFinalize, or an earlier attach's cuptiSubscribe, still runs. Called with api_mu
 * held. */
int cm__engine_attach(cm_engine *e);

/* ---- worker.c -------------------------------------------------------------------------------- */

/* Starts the decode worker (e->worker_started). Returns 0 or CM_ENOMEM. Called by cm_engine_new. */
int cm__engine_worker_start(cm_engine *e);
/* Stops the decode worker, once it has decoded what is queued, and joins it. Called by
 * cm_engine_free. */
void cm__engine_worker_stop(cm_engine *e);

/* ---- fence.c ---------------------------------------------------------------------------------- */

/* Outcomes of a device synchronize (cm__engine_device_sync's *why). */
enum {
  CM__SYNC_OK = 0,    /* the device was synchronized */
  CM__SYNC_NONE,      /* nothing to synchronize (no context, no libcuda) */
  CM__SYNC_CAPTURE,   /* a stream capture is in progress: not synchronized on purpose */
  CM__SYNC_BUSY,      /* an abandoned synchronize is still blocked: not started */
  CM__SYNC_ABANDONED  /* this synchronize missed its deadline and was left to finish alone */
};

/* Waits until every buffer queued so far has been decoded, or until `deadline` (monotonic ms), or
 * until the exit fence hurries the wait. Takes work_mu; called with api_mu held. */
bool cm__engine_wait_decoded(cm_engine *e, uint64_t deadline);
/* Asks CUPTI for its completed buffers (cuptiActivityFlushAll(flag)) and waits until they are
 * decoded. Called with api_mu held. */
bool cm__engine_plain_flush(cm_engine *e, uint64_t deadline, uint32_t flag);
/* Synchronizes every active primary context and the caller's current one, on a helper thread in
 * relaxed capture mode, waiting for it until `deadline`. Returns the number of contexts
 * synchronized; *why says why it is 0 (CM__SYNC_*). Called with api_mu held. */
int cm__engine_device_sync(cm_engine *e, uint64_t deadline, int *why);
/* The sync fence: when it returns true, every record produced before the call is decoded. Called
 * with api_mu held; delivers nothing itself. *why receives the first synchronize's outcome. */
bool cm__engine_fence(cm_engine *e, uint64_t deadline, int *why);

#endif /* CM_ENGINE_H */
