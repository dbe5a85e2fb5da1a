/*
 * apicb.c: subscriber callbacks of the in-process engine, queued for the loop thread (apicb.h).
 *
 * Design note. The handler runs on application threads inside CUDA calls: it takes one mutex for
 * a copy into a fixed ring, never allocates, never blocks on the loop, and wakes the loop with
 * uv_async_send (thread-safe, and coalesced by libuv). Subscriptions are a list owned by the loop
 * thread; each one is the `ud` of its engine handler, so it lives until cm_callback_unregister
 * has returned (then the handler is not running and will not run again).
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cupti_callbacks.h>

#include "apicb.h"

typedef struct apicb_sub {
  struct apicb_sub *next;
  cm__apicb *q;
  uint32_t id;
  int domain;
  uint32_t cbid;
  unsigned sites;
  uint32_t handle; /* the engine's handler handle; the handler never reads it */
} apicb_sub;

struct cm__apicb {
  cm_engine *e;
  uv_async_t async;
  void (*ready)(void *ud);
  void *ud;
  apicb_sub *subs; /* loop thread only */
  uint32_t next_id;
  pthread_mutex_t mu; /* guards the ring and the counters */
  cm__api_event *ring;
  uint32_t cap, head, n;
  uint64_t queued, dropped;
};

static void on_async(uv_async_t *a) {
  cm__apicb *q = a->data;
  q->ready(q->ud);
}

int cm__apicb_new(cm__apicb **out, cm_engine *e, uv_loop_t *loop, uint32_t capacity,
                  void (*ready)(void *ud), void *ud) {
  if (!out || !e || !loop || !ready) return CM_EINVAL;
  *out = NULL;
  cm__apicb *q = calloc(1, sizeof *q);
  if (!q) return CM_ENOMEM;
  q->cap = capacity ? capacity : CM__APICB_CAPACITY;
  q->ring = calloc(q->cap, sizeof *q->ring);
  if (!q->ring) {
    free(q);
    return CM_ENOMEM;
  }
  q->e = e;
  q->ready = ready;
  q->ud = ud;
  pthread_mutex_init(&q->mu, NULL);
  if (uv_async_init(loop, &q->async, on_async)) {
    pthread_mutex_destroy(&q->mu);
    free(q->ring);
    free(q);
    return CM_ENOMEM;
  }
  q->async.data = q;
  /* A subscription alone does not keep the script running, as the delivery timer does not. */
  uv_unref((uv_handle_t *)&q->async);
  *out = q;
  return 0;
}

static void on_closed(uv_handle_t *hd) {
  cm__apicb *q = hd->data;
  pthread_mutex_destroy(&q->mu);
  free(q->ring);
  free(q);
}

void cm__apicb_free(cm__apicb *q) {
  if (!q) return;
  while (q->subs) cm__apicb_remove(q, q->subs->id);
  uv_close((uv_handle_t *)&q->async, on_closed);
}

/* The engine handler: copies the call's facts into the ring, or counts a drop. */
static int on_callback(void *ud, int domain, uint32_t cbid, const void *cbdata) {
  apicb_sub *s = ud;
  cm__apicb *q = s->q;
  uint32_t site = CM__APICB_ENTER, corr = 0;
  if ((domain == CUPTI_CB_DOMAIN_RUNTIME_API || domain == CUPTI_CB_DOMAIN_DRIVER_API) && cbdata) {
    const CUpti_CallbackData *d = cbdata;
    site = d->callbackSite == CUPTI_API_EXIT ? CM__APICB_EXIT : CM__APICB_ENTER;
    corr = d->correlationId;
  }
  if (!(s->sites & site)) return 0;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  cm__api_event ev = {
      .sub = s->id,
      .domain = domain,
      .cbid = cbid,
      .site = site,
      .correlation = corr,
      .tid = (uint32_t)syscall(SYS_gettid),
      .time_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec,
  };
  pthread_mutex_lock(&q->mu);
  if (q->n == q->cap) {
    q->dropped++;
  } else {
    q->ring[(q->head + q->n) % q->cap] = ev;
    q->n++;
    q->queued++;
  }
  pthread_mutex_unlock(&q->mu);
  uv_async_send(&q->async);
  return 0;
}

int cm__apicb_add(cm__apicb *q, int domain, uint32_t cbid, unsigned sites, uint32_t *id) {
  if (!q || !id || !(sites & (CM__APICB_ENTER | CM__APICB_EXIT))) return CM_EINVAL;
  apicb_sub *s = calloc(1, sizeof *s);
  if (!s) return CM_ENOMEM;
  s->q = q;
  s->id = ++q->next_id;
  s->domain = domain;
  s->cbid = cbid;
  s->sites = sites;
  int rc = cm_callback_register(q->e, domain, cbid, on_callback, s, &s->handle);
  if (rc) {
    free(s);
    return rc;
  }
  rc = cm_callback_arm(q->e, domain, cbid);
  if (rc) {
    cm_callback_unregister(q->e, s->handle);
    free(s);
    return rc;
  }
  s->next = q->subs;
  q->subs = s;
  *id = s->id;
  return 0;
}

int cm__apicb_remove(cm__apicb *q, uint32_t id) {
  if (!q) return CM_EINVAL;
  for (apicb_sub **p = &q->subs; *p; p = &(*p)->next) {
    apicb_sub *s = *p;
    if (s->id != id) continue;
    *p = s->next;
    cm_callback_disarm(q->e, s->domain, s->cbid);
    int rc = cm_callback_unregister(q->e, s->handle);
    free(s);
    return rc;
  }
  return CM_ENOENT;
}

uint32_t cm__apicb_take(cm__apicb *q, cm__api_event *out, uint32_t max) {
  pthread_mutex_lock(&q->mu);
  uint32_t k = q->n < max ? q->n : max;
  for (uint32_t i = 0; i < k; i++) out[i] = q->ring[(q->head + i) % q->cap];
  q->head = (q->head + k) % q->cap;
  q->n -= k;
  pthread_mutex_unlock(&q->mu);
  return k;
}

void cm__apicb_counts(cm__apicb *q, uint64_t *queued, uint64_t *dropped, uint64_t *waiting) {
  pthread_mutex_lock(&q->mu);
  if (queued) *queued = q->queued;
  if (dropped) *dropped = q->dropped;
  if (waiting) *waiting = q->n;
  pthread_mutex_unlock(&q->mu);
}
