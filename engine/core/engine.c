/*
 * engine.c: the engine. It creates and frees the engine, holds its configuration, its observers
 * and their union selection, reconciles the kinds enabled in CUPTI with that selection, and
 * offers the public calls. The other files of the engine noun share its state through engine.h,
 * and engine.c calls down into them, never the reverse:
 *   subscription.c  the CUPTI subscription: CUPTI's callbacks into the engine, detach and attach
 *   worker.c        the decode worker and its cadences
 *   delivery.c      records handed to the observers
 *   fence.c         flushes, the device synchronization and the fences (the exit fence too)
 *   log.c           the log callback
 * The couplings between kinds are in select.c.
 *
 * Threads and locks. Control calls (cm_observe, cm_unobserve, cm_flush, cm_configure,
 * cm_engine_free, and cm_cupti_detach and cm_cupti_attach in subscription.c) are serialized by
 * `api_mu`. Lock order: api_mu, then dec_mu, then work_mu; the pool mutex is a leaf. The threads
 * that CUPTI calls the engine on are described in subscription.c, the decode worker in worker.c,
 * and where observer callbacks run in delivery.c.
 *
 * Selection changes follow two rules from the reference monitor. A kind whose selection does not
 * change is never toggled, because disabling and re-enabling RUNTIME or DRIVER stops kernel records
 * of CUDA graphs captured earlier. And pending records are delivered before the decode table
 * changes, so no observer ever sees a batch decoded with a table that lacks one of its fields.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

/* ---- selection ------------------------------------------------------------------------------ */

uint64_t cm__engine_enabled(cm_engine *e) {
  return atomic_load_explicit(&e->enabled, memory_order_relaxed);
}

uint64_t cm__engine_enable_start_ns(cm_engine *e) { return LOAD(e, enable_start_ns); }

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
  cm__atomic_max_u64(&e->st_kind_change_max_ns, took);
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

/* Ends the activity session: device sync, forced flush, delivery, every kind disabled. Called with
 * api_mu held, while the observers are still registered so they receive the last records. */
static void end_session(cm_engine *e) {
  uint64_t deadline = cm__engine_deadline(e, 0);
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

static void log_hook(void *ctx, int level, const char *msg) { cm__engine_log(ctx, level, "%s", msg); }

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
  cm__engine_release_slot();
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

  if (!cm__engine_claim_slot())
    return cm__seterr(CM_EBUSY, "a cuptimon engine already exists in this process (CUPTI allows "
                                "one subscriber per process; reuse it or free it first)");
  cm_engine *e = calloc(1, sizeof *e);
  if (!e) {
    cm__engine_release_slot();
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
  rc = cm__engine_subscribe(e);
  if (rc) goto fail_decoder;
  /* The registry pins the RESOURCE callbacks the engine needs (module unload included, for the
   * string cache), so a consumer's disarm cannot turn them off. */
  cm__callbacks *cbreg = NULL;
  rc = cm__callbacks_new(&cbreg, &e->cupti, e->sub, log_hook, e);
  atomic_store(&e->cb, cbreg);
  if (rc) goto fail_sub;

  rc = cm__engine_register_activity(e);
  if (rc) goto fail_sub;
  check_clock(e);
  /* PM timestamps are on cuptiGetTimestamp's clock: the same as the records' when it is
   * CLOCK_REALTIME (the offset is then only the bracket's noise), else moved by the offset. */
  rc = cm__pm_new(&e->pm, &e->cupti, e->clock_realtime ? 0 : e->clock_offset_ns);
  if (rc) goto fail_sub;

  rc = cm__engine_worker_start(e);
  if (rc) goto fail_sub;
  cm__engine_publish(e);
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

  cm__engine_worker_stop(e);

  /* PM sessions stop before the subscription goes; samples not yet drained are lost with them. */
  cm__pm_free(e->pm);
  e->pm = NULL;
  cm__engine_unsubscribe(e);
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

int cm_observe(cm_engine *e, const cm_selection *sel, cm_observer_fn fn, void *ud, uint32_t *id) {
  cm__clearerr();
  if (!e || !sel || !fn) return cm__seterr(CM_EINVAL, "engine, selection or callback is NULL");
  bool empty = true;
  for (int k = 0; k < CM_KIND_MAX; k++)
    if (!cm__bits_empty(&sel->kinds[k])) empty = false;
  if (empty) return cm__seterr(CM_EINVAL, "the selection is empty: name at least one kind");

  pthread_mutex_lock(&e->api_mu);
  int rc = cm__engine_attach(e);
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
  if (e->active) cm__engine_plain_flush(e, cm__engine_deadline(e, 0), 0);
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
    if (!cm__engine_fence(e, cm__engine_deadline(e, 0), &why))
      cm__engine_log(e, CM_LOG_WARN,
                     "the fence of a narrowing selection missed its deadline; records of the kinds "
                     "it turned off that arrive later are counted as dropped");
  } else {
    cm__engine_plain_flush(e, cm__engine_deadline(e, 0), 0);
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
  uint64_t deadline = cm__engine_deadline(e, timeout_ms);
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
  int rc = cm__engine_attach(e);
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
    int rc = cm__engine_attach(e);
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
