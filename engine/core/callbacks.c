/*
 * callbacks.c: subscriber-callback handlers, their refcounted arming, and the built-in RESOURCE
 * handler that turns context, stream and module events into CM_KIND_RESOURCE records.
 *
 * Design. CUPTI gives a subscription one callback function; the engine's trampoline calls
 * cm__callbacks_dispatch, which finds the handlers of (domain, cbid) in an immutable table and
 * calls them in registration order. Dispatch runs on application threads inside CUDA calls, so it
 * takes no lock: writers (register, unregister) build a new table under `mu`, publish it with an
 * atomic store, and free the old one after a grace period. Readers announce themselves in one of
 * two counters, chosen by the parity of `gen`; a writer flips the parity and waits for the old
 * counter to drain, twice, so that every reader that could hold the old table has left (the two
 * flips make a reader that read the parity just before an earlier flip safe too). A writer running
 * inside a dispatch on its own thread cannot wait for itself, so it defers the free to the next
 * writer outside a dispatch, or to cm__callbacks_free.
 *
 * Arming is counted per (domain, cbid): CUPTI is told to enable a callback when its count leaves
 * zero and to disable it when the count returns to zero. The engine's own needs are pins, counted
 * apart, so a consumer's disarm can never turn off a callback the engine relies on. Removing the
 * last handler of a key drops its arm count to zero.
 *
 * The capture handler watches the driver calls that begin and end a CUDA stream capture and keeps
 * the set of streams with a capture in progress, so the fence can tell that a device synchronize
 * would break an application's graph capture (issue: a sync flush invalidated PyTorch's CUDA
 * graphs). Its callbacks are pinned like the resource ones.
 *
 * The resource handler copies what it needs out of CUPTI's callback data into a fixed-layout
 * record and appends it to a bounded side queue; the engine moves the queue into the decoder at
 * the start of each drain, so resource records are delivered like any other kind.
 *
 * Thread rules. Dispatch: any thread, lock-free except for the side queue's short append and the
 * capture set's lock (`cap_mu`, a leaf, taken only in capture begin and end calls).
 * Register, unregister, arm, disarm: any thread, serialized by `mu`. Lock order: the engine's
 * dec_mu, then `res_mu` (a leaf); `mu` is never held while a handler runs, and never taken inside
 * dispatch.
 */
#include <dlfcn.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cm_internal.h"

#define RESOURCE_QUEUE_MAX 65536
#define CAPTURE_WAIT_MS 100   /* how long a capture that begins waits for a running synchronize */
#define CAPTURE_TRACK_MAX 256 /* streams tracked by handle; more are counted without a handle */

/* One registered handler. Freed only after a grace period, so a dispatch may still read it. */
typedef struct hrec {
  uint32_t handle;
  int domain;
  uint32_t cbid;
  cm_callback_fn fn;
  void *ud;
  atomic_int failure_logged;
} hrec;

/* The published table: keys sorted by (domain, cbid), each naming a run of `recs`. */
typedef struct tkey {
  uint64_t key;
  uint32_t first, n;
} tkey;

typedef struct table {
  uint32_t nkeys;
  tkey *keys;
  hrec **recs;
} table;

typedef struct armed {
  int domain;
  uint32_t cbid;
  uint32_t arms; /* consumers' arms */
  uint32_t pins; /* the engine's own needs */
  bool enabled;  /* what CUPTI was last told successfully */
} armed;

/* What a grace period must free: a table, and the handlers it alone referenced. */
typedef struct retired {
  struct retired *next;
  table *t;
  hrec *rec;
} retired;

struct cm__callbacks {
  const cm__cupti *c;
  CUpti_SubscriberHandle sub;
  cm__log_hook log;
  void *log_ctx;
  int (*ctx_get_device)(int *dev, void *ctx);
  int (*ctx_get_id)(void *ctx, unsigned long long *id);
  int (*stream_get_id)(void *stream, unsigned long long *id);

  /* Read by dispatch without a lock. */
  _Atomic(table *) tab;
  atomic_uint gen;
  atomic_uint_fast64_t readers[2];

  /* Serializes grace periods. Taken before mu, never inside a dispatch. */
  pthread_mutex_t grace_mu;

  /* Guarded by mu: the handlers, the arm counts and the deferred frees. */
  pthread_mutex_t mu;
  hrec **recs;
  size_t nrecs, caprecs;
  armed *arms;
  size_t narms, caparms;
  uint32_t next_handle;
  retired *deferred;

  /* Guarded by res_mu: the resource records waiting for the next drain. */
  pthread_mutex_t res_mu;
  cm__resource_record *q;
  size_t qn, qcap;

  /* Guarded by cap_mu: the streams with a capture in progress (begin and end are rare calls). */
  pthread_mutex_t cap_mu;
  uint64_t cap_streams[CAPTURE_TRACK_MAX];
  uint32_t ncap;
  uint32_t cap_untracked; /* captures begun while the table was full */
  atomic_int captures;    /* ncap + cap_untracked, read without the lock */
  atomic_int begin_pending; /* begin calls between their enter and exit callbacks */
  /* Sticky: a call that makes or launches a CUDA graph was seen (graph_cbids, a capture). It
   * survives every detach and attach, since the graphs it stands for do. */
  atomic_bool graphs_used;

  atomic_uint_fast64_t st_dispatched, st_calls, st_failures, st_res, st_res_dropped;
};

/* The engine allows one engine per process, so one registry exists at a time; the public calls
 * find it through the engine, and this thread-local depth tells a writer it runs in a dispatch. */
static _Thread_local int t_dispatch_depth;
/* Capture begin calls of this thread between their enter and exit callbacks. */
static _Thread_local int t_begin_pending;
/* Device synchronizes still running on fence.c's helper thread (0 or 1). fence.c counts its
 * helper in and out; a capture that begins waits until it is 0 (record_capture). It is defined
 * here, with the side that waits on it, so that fence.c calls into this file and never the
 * reverse. */
_Atomic int cm__sync_helpers;

static const uint32_t resource_cbids[] = {
    CUPTI_CBID_RESOURCE_CONTEXT_CREATED, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING,
    CUPTI_CBID_RESOURCE_STREAM_CREATED,  CUPTI_CBID_RESOURCE_STREAM_DESTROY_STARTING,
    CUPTI_CBID_RESOURCE_MODULE_LOADED,   CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING,
};

/* The driver calls that begin or end a stream capture. The runtime's cudaStreamBeginCapture and
 * cudaStreamEndCapture call these, so watching the driver domain sees both APIs. */
static const uint32_t capture_begin_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture,        CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2,     CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph, CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz,
};
/* The driver calls that make or launch a CUDA graph (a capture makes one too). A process that has
 * used a graph keeps CUPTI attached from then on: a cuptiFinalize followed by a new subscription
 * breaks the launches of graphs made before it (torch.compile's CUDA graphs failed with "unspecified
 * launch failure" right after such a detach, and PyTorch's profiler turns its own CUPTI teardown
 * off once graphs are used, for the same reason), so the detach refuses once one is seen. A graph
 * made while CUPTI is detached is seen at its first launch in the next window. */
static const uint32_t graph_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate,           CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate_v2,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags,  CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,                CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphUpload,                CUPTI_DRIVER_TRACE_CBID_cuGraphUpload_ptsz,
};
static const uint32_t capture_end_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture,
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz,
};

static uint64_t mkkey(int domain, uint32_t cbid) { return (uint64_t)(uint32_t)domain << 32 | cbid; }

static void cblog(cm__callbacks *cb, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cblog(cm__callbacks *cb, int level, const char *fmt, ...) {
  if (!cb->log) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cb->log(cb->log_ctx, level, msg);
}

static void table_free(table *t) {
  if (!t) return;
  free(t->keys);
  free(t->recs);
  free(t);
}

/* ---- publication and grace ----------------------------------------------------------------- */

static int cmp_rec(const void *a, const void *b) {
  const hrec *x = *(hrec *const *)a, *y = *(hrec *const *)b;
  uint64_t kx = mkkey(x->domain, x->cbid), ky = mkkey(y->domain, y->cbid);
  if (kx != ky) return kx < ky ? -1 : 1;
  return x->handle < y->handle ? -1 : x->handle > y->handle;
}

/* Builds a table from the live handlers. mu held. NULL on allocation failure. */
static table *table_build(cm__callbacks *cb) {
  table *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  if (cb->nrecs) {
    t->recs = malloc(cb->nrecs * sizeof *t->recs);
    t->keys = malloc(cb->nrecs * sizeof *t->keys);
    if (!t->recs || !t->keys) {
      table_free(t);
      return NULL;
    }
    memcpy(t->recs, cb->recs, cb->nrecs * sizeof *t->recs);
    qsort(t->recs, cb->nrecs, sizeof *t->recs, cmp_rec);
    for (uint32_t i = 0; i < cb->nrecs; i++) {
      uint64_t k = mkkey(t->recs[i]->domain, t->recs[i]->cbid);
      if (t->nkeys && t->keys[t->nkeys - 1].key == k) {
        t->keys[t->nkeys - 1].n++;
      } else {
        t->keys[t->nkeys++] = (tkey){k, i, 1};
      }
    }
  }
  return t;
}

/* Waits until no dispatch can still see a table published before the call. grace_mu held, and
 * never mu: a handler running in a dispatch may take mu, and the wait would then never end. */
static void grace(cm__callbacks *cb) {
  for (int round = 0; round < 2; round++) {
    unsigned g = atomic_load(&cb->gen);
    atomic_store(&cb->gen, g ^ 1u);
    while (atomic_load(&cb->readers[g & 1u]) != 0) sched_yield();
  }
}

static void free_retired(retired *r) {
  while (r) {
    retired *nx = r->next;
    table_free(r->t);
    free(r->rec);
    free(r);
    r = nx;
  }
}

/* Publishes a table built from the live handlers. The old table (and `gone`, a handler just
 * removed) is retired: reclaim() frees it after a grace period, once the caller has released mu.
 * mu held. */
static int publish(cm__callbacks *cb, hrec *gone) {
  table *t = table_build(cb);
  if (!t) return cm__seterr(CM_ENOMEM, "cannot build the callback table");
  table *old = atomic_exchange(&cb->tab, t);
  retired *r = malloc(sizeof *r);
  if (!r) {
    /* Leaking is safer than freeing early: a dispatch may hold them. */
    return 0;
  }
  r->t = old;
  r->rec = gone;
  r->next = cb->deferred;
  cb->deferred = r;
  return 0;
}

/* Frees what publications retired, after a grace period. Called without mu. Inside a dispatch it
 * does nothing (the dispatch's own reader count would hold the grace period forever); a later
 * writer outside any dispatch, or the registry's free, reclaims the memory then. */
static void reclaim(cm__callbacks *cb) {
  if (t_dispatch_depth) return;
  pthread_mutex_lock(&cb->grace_mu);
  pthread_mutex_lock(&cb->mu);
  retired *r = cb->deferred;
  cb->deferred = NULL;
  pthread_mutex_unlock(&cb->mu);
  if (r) grace(cb);
  pthread_mutex_unlock(&cb->grace_mu);
  free_retired(r);
}

/* ---- arming -------------------------------------------------------------------------------- */

static armed *arm_find(cm__callbacks *cb, int domain, uint32_t cbid, bool create) {
  for (size_t i = 0; i < cb->narms; i++)
    if (cb->arms[i].domain == domain && cb->arms[i].cbid == cbid) return &cb->arms[i];
  if (!create) return NULL;
  if (cb->narms == cb->caparms) {
    size_t cap = cb->caparms ? cb->caparms * 2 : 16;
    armed *p = realloc(cb->arms, cap * sizeof *p);
    if (!p) return NULL;
    cb->arms = p;
    cb->caparms = cap;
  }
  armed *a = &cb->arms[cb->narms++];
  *a = (armed){.domain = domain, .cbid = cbid};
  return a;
}

/* Tells CUPTI what the counts of `a` want. mu held. Returns 0 or CM_ECUPTI. */
static int arm_sync(cm__callbacks *cb, armed *a) {
  bool want = a->arms > 0 || a->pins > 0;
  if (want == a->enabled) return 0;
  /* Detached (cm__callbacks_rebind with no subscription): CUPTI is told at the next attach. */
  if (!cb->sub) return 0;
  CUptiResult r = cb->c->EnableCallback(want ? 1 : 0, cb->sub, (CUpti_CallbackDomain)a->domain,
                                        (CUpti_CallbackId)a->cbid);
  if (r != CUPTI_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "cuptiEnableCallback(%d, domain %d, cbid %u)", want, a->domain,
             a->cbid);
    return cm__cupti_err(cb->c, r, what);
  }
  a->enabled = want;
  return 0;
}

static int check_key(int domain, uint32_t cbid) {
  if (domain <= (int)CUPTI_CB_DOMAIN_INVALID || domain >= (int)CUPTI_CB_DOMAIN_SIZE)
    return cm__seterr(CM_EINVAL, "callback domain %d: valid domains are 1..%d", domain,
                      (int)CUPTI_CB_DOMAIN_SIZE - 1);
  (void)cbid; /* CUPTI validates the id when the callback is enabled */
  return 0;
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

/* Pins the engine's own driver callbacks `ids` (held by the engine, not by a consumer); `lost`
 * says what is missing when one cannot be enabled. Called with mu held. */
static void pin_driver(cm__callbacks *cb, const uint32_t *ids, size_t n, const char *lost) {
  for (size_t i = 0; i < n; i++) {
    armed *a = arm_find(cb, CUPTI_CB_DOMAIN_DRIVER_API, ids[i], true);
    if (!a) continue;
    a->pins++;
    if (arm_sync(cb, a) != 0)
      cblog(cb, CM_LOG_WARN, "cannot enable driver callback %u: %s", ids[i], lost);
  }
}

int cm__callbacks_new(cm__callbacks **out, const cm__cupti *c, CUpti_SubscriberHandle sub,
                      cm__log_hook log, void *log_ctx) {
  cm__callbacks *cb = calloc(1, sizeof *cb);
  if (!cb) return cm__seterr(CM_ENOMEM, "cannot allocate the callback registry");
  cb->c = c;
  cb->sub = sub;
  cb->log = log;
  cb->log_ctx = log_ctx;
  cb->next_handle = 1;
  pthread_mutex_init(&cb->grace_mu, NULL);
  pthread_mutex_init(&cb->mu, NULL);
  pthread_mutex_init(&cb->res_mu, NULL);
  pthread_mutex_init(&cb->cap_mu, NULL);
  table *t = calloc(1, sizeof *t);
  if (!t) {
    free(cb);
    return cm__seterr(CM_ENOMEM, "cannot allocate the callback table");
  }
  atomic_store(&cb->tab, t);
  /* The optional driver queries of the resource records. */
  if (c->cuda) {
    *(void **)&cb->ctx_get_device = dlsym(c->cuda, "cuCtxGetDevice_v2");
    *(void **)&cb->ctx_get_id = dlsym(c->cuda, "cuCtxGetId");
    *(void **)&cb->stream_get_id = dlsym(c->cuda, "cuStreamGetId");
  }
  pthread_mutex_lock(&cb->mu);
  for (size_t i = 0; i < sizeof resource_cbids / sizeof resource_cbids[0]; i++) {
    armed *a = arm_find(cb, CUPTI_CB_DOMAIN_RESOURCE, resource_cbids[i], true);
    if (!a) continue;
    a->pins++;
    if (arm_sync(cb, a) != 0)
      cblog(cb, CM_LOG_WARN, "cannot enable resource callback %u: resource records of that "
                             "event will be missing", resource_cbids[i]);
  }
  pin_driver(cb, capture_begin_cbids, sizeof capture_begin_cbids / sizeof capture_begin_cbids[0],
             "a sync flush cannot tell that a graph capture begun there is in progress");
  pin_driver(cb, capture_end_cbids, sizeof capture_end_cbids / sizeof capture_end_cbids[0],
             "a sync flush cannot tell that a graph capture begun there is in progress");
  pin_driver(cb, graph_cbids, sizeof graph_cbids / sizeof graph_cbids[0],
             "a CUDA graph made or launched there is not seen, and a detach could break it");
  pthread_mutex_unlock(&cb->mu);
  *out = cb;
  return 0;
}

void cm__callbacks_free(cm__callbacks *cb) {
  if (!cb) return;
  /* The subscription is gone, so no new dispatch starts; this waits for the ones in flight. */
  pthread_mutex_lock(&cb->grace_mu);
  grace(cb);
  pthread_mutex_unlock(&cb->grace_mu);
  pthread_mutex_lock(&cb->mu);
  free_retired(cb->deferred);
  table_free(atomic_load(&cb->tab));
  for (size_t i = 0; i < cb->nrecs; i++) free(cb->recs[i]);
  free(cb->recs);
  free(cb->arms);
  pthread_mutex_unlock(&cb->mu);
  pthread_mutex_destroy(&cb->grace_mu);
  pthread_mutex_destroy(&cb->mu);
  pthread_mutex_destroy(&cb->res_mu);
  pthread_mutex_destroy(&cb->cap_mu);
  free(cb->q);
  free(cb);
}

/* ---- dispatch ------------------------------------------------------------------------------ */


/* The built-in RESOURCE handler: one record per context, stream or module event. */
static void record_resource(cm__callbacks *cb, uint32_t cbid, const void *data) {
  bool known = false;
  for (size_t i = 0; i < sizeof resource_cbids / sizeof resource_cbids[0]; i++)
    if (resource_cbids[i] == cbid) known = true;
  if (!known || !data) return;
  const CUpti_ResourceData *rd = data;
  cm__resource_record r;
  memset(&r, 0, sizeof r);
  r.kind = CM_KIND_RESOURCE;
  r.event = cbid;
  r.timestamp = cm__realtime_ns();
  r.context = (uint64_t)(uintptr_t)rd->context;
  r.device = UINT32_MAX;
  r.tid = (uint32_t)syscall(SYS_gettid);
  if (rd->context) {
    int dev = 0;
    unsigned long long id = 0;
    if (cb->ctx_get_device && cb->ctx_get_device(&dev, rd->context) == 0) r.device = (uint32_t)dev;
    if (cb->ctx_get_id && cb->ctx_get_id(rd->context, &id) == 0) r.context_id = id;
  }
  if (cbid == CUPTI_CBID_RESOURCE_STREAM_CREATED ||
      cbid == CUPTI_CBID_RESOURCE_STREAM_DESTROY_STARTING) {
    r.stream = (uint64_t)(uintptr_t)rd->resourceHandle.stream;
    unsigned long long id = 0;
    if (rd->resourceHandle.stream && cb->stream_get_id &&
        cb->stream_get_id(rd->resourceHandle.stream, &id) == 0)
      r.stream_id = id;
  }
  if ((cbid == CUPTI_CBID_RESOURCE_MODULE_LOADED ||
       cbid == CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING) &&
      rd->resourceDescriptor)
    r.module_id = ((const CUpti_ModuleResourceData *)rd->resourceDescriptor)->moduleId;

  pthread_mutex_lock(&cb->res_mu);
  bool ok = cb->qn < RESOURCE_QUEUE_MAX;
  if (ok && cb->qn == cb->qcap) {
    size_t cap = cb->qcap ? cb->qcap * 2 : 64;
    cm__resource_record *p = realloc(cb->q, cap * sizeof *p);
    if (p) {
      cb->q = p;
      cb->qcap = cap;
    } else {
      ok = false;
    }
  }
  if (ok) cb->q[cb->qn++] = r;
  pthread_mutex_unlock(&cb->res_mu);
  atomic_fetch_add_explicit(ok ? &cb->st_res : &cb->st_res_dropped, 1, memory_order_relaxed);
}

static bool in_list(const uint32_t *ids, size_t n, uint32_t cbid) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] == cbid) return true;
  return false;
}

/* The built-in capture handler: at the exit of a call that began a capture successfully, the
 * stream joins the set; at the exit of an end call it leaves it, unless the call failed because it
 * came from the wrong thread (the capture then goes on). Every params struct of these calls starts
 * with the stream handle. */
static void record_capture(cm__callbacks *cb, uint32_t cbid, const void *data) {
  bool begin = in_list(capture_begin_cbids, sizeof capture_begin_cbids / sizeof capture_begin_cbids[0], cbid);
  bool end = !begin && in_list(capture_end_cbids, sizeof capture_end_cbids / sizeof capture_end_cbids[0], cbid);
  if ((!begin && !end) || !data) return;
  const CUpti_CallbackData *cd = data;
  if (begin && cd->callbackSite == CUPTI_API_ENTER) {
    /* Before the capture begins: count it, so no synchronize starts from now on, then let a
     * synchronize already running finish (a synchronize that overlaps the capture invalidates
     * it). The wait is bounded: a synchronize blocked behind a kernel that runs on does not hold
     * the application longer than CAPTURE_WAIT_MS. */
    t_begin_pending++;
    atomic_fetch_add(&cb->begin_pending, 1);
    struct timespec nap = {0, 50000};
    for (int waited_us = 0; atomic_load(&cm__sync_helpers) > 0 && waited_us < CAPTURE_WAIT_MS * 1000;
         waited_us += 50)
      nanosleep(&nap, NULL);
    return;
  }
  if (cd->callbackSite != CUPTI_API_EXIT || !cd->functionParams) return;
  CUresult res = cd->functionReturnValue ? *(const CUresult *)cd->functionReturnValue : CUDA_SUCCESS;
  uint64_t stream = (uint64_t)(uintptr_t)*(void *const *)cd->functionParams;
  pthread_mutex_lock(&cb->cap_mu);
  if (begin && res == CUDA_SUCCESS) {
    if (cb->ncap < CAPTURE_TRACK_MAX)
      cb->cap_streams[cb->ncap++] = stream;
    else
      cb->cap_untracked++;
  } else if (end && res != CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) {
    bool found = false;
    for (uint32_t i = 0; i < cb->ncap; i++)
      if (cb->cap_streams[i] == stream) {
        cb->cap_streams[i] = cb->cap_streams[--cb->ncap];
        found = true;
        break;
      }
    if (!found && cb->cap_untracked) cb->cap_untracked--;
  }
  atomic_store(&cb->captures, (int)(cb->ncap + cb->cap_untracked));
  pthread_mutex_unlock(&cb->cap_mu);
  /* After the stream joined the set, so the count never drops to 0 in between. An exit whose
   * enter was not seen (the registry was created in between) has nothing to undo. */
  if (begin && t_begin_pending > 0) {
    t_begin_pending--;
    atomic_fetch_sub(&cb->begin_pending, 1);
  }
}

bool cm__callbacks_graphs_used(const cm__callbacks *cb) {
  return cb && atomic_load(&cb->graphs_used);
}

int cm__callbacks_captures_active(const cm__callbacks *cb) {
  return cb ? atomic_load(&cb->captures) + atomic_load(&cb->begin_pending) : 0;
}

void cm__callbacks_dispatch(cm__callbacks *cb, int domain, uint32_t cbid, const void *data,
                            cm__intern *strings) {
  /* Everything below runs inside the reader count, so the registry's free waits for it. */
  unsigned g = atomic_load(&cb->gen) & 1u;
  atomic_fetch_add(&cb->readers[g], 1);
  atomic_fetch_add_explicit(&cb->st_dispatched, 1, memory_order_relaxed);
  /* A module unload may let a new module's kernel names reuse the old addresses: the decoder's
   * pointer cache must not map them to stale names. */
  if (strings && domain == CUPTI_CB_DOMAIN_RESOURCE &&
      cbid == CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING)
    cm__intern_invalidate(strings);
  if (domain == CUPTI_CB_DOMAIN_RESOURCE) record_resource(cb, cbid, data);
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    record_capture(cb, cbid, data);
    if (in_list(graph_cbids, sizeof graph_cbids / sizeof graph_cbids[0], cbid) ||
        in_list(capture_end_cbids, sizeof capture_end_cbids / sizeof capture_end_cbids[0], cbid))
      atomic_store(&cb->graphs_used, true);
  }
  t_dispatch_depth++;
  const table *t = atomic_load(&cb->tab);
  uint64_t k = mkkey(domain, cbid);
  uint32_t lo = 0, hi = t->nkeys;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (t->keys[mid].key < k)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < t->nkeys && t->keys[lo].key == k) {
    const tkey *tk = &t->keys[lo];
    for (uint32_t i = 0; i < tk->n; i++) {
      hrec *h = t->recs[tk->first + i];
      atomic_fetch_add_explicit(&cb->st_calls, 1, memory_order_relaxed);
      int rc = h->fn(h->ud, domain, cbid, data);
      if (rc != 0) {
        atomic_fetch_add_explicit(&cb->st_failures, 1, memory_order_relaxed);
        if (atomic_exchange(&h->failure_logged, 1) == 0)
          cblog(cb, CM_LOG_WARN,
                "callback handler %u (domain %d, cbid %u) failed with %d; the other handlers "
                "still run (logged once per handler)",
                h->handle, domain, cbid, rc);
      }
    }
  }
  t_dispatch_depth--;
  atomic_fetch_sub(&cb->readers[g], 1);
}

void cm__callbacks_drain(cm__callbacks *cb, cm__decoder *dec) {
  pthread_mutex_lock(&cb->res_mu);
  cm__resource_record *q = cb->q;
  size_t n = cb->qn;
  cb->q = NULL;
  cb->qn = cb->qcap = 0;
  pthread_mutex_unlock(&cb->res_mu);
  if (n) cm__decoder_inject(dec, CM_KIND_RESOURCE, (const uint8_t *)q, n, sizeof *q);
  free(q);
}

/* ---- the handler registry's operations ------------------------------------------------------
 *
 * engine.c's public cm_callback_* functions check the engine handle and call these with its
 * registry, so this module never sees the engine. */

int cm__callbacks_register(cm__callbacks *cb, int domain, uint32_t cbid, cm_callback_fn fn,
                           void *ud, uint32_t *handle) {
  if (!fn) return cm__seterr(CM_EINVAL, "cm_callback_register: fn is NULL");
  int rc = check_key(domain, cbid);
  if (rc) return rc;
  hrec *h = calloc(1, sizeof *h);
  if (!h) return cm__seterr(CM_ENOMEM, "cannot allocate a callback handler");
  h->domain = domain;
  h->cbid = cbid;
  h->fn = fn;
  h->ud = ud;
  pthread_mutex_lock(&cb->mu);
  if (cb->nrecs == cb->caprecs) {
    size_t cap = cb->caprecs ? cb->caprecs * 2 : 16;
    hrec **p = realloc(cb->recs, cap * sizeof *p);
    if (!p) {
      pthread_mutex_unlock(&cb->mu);
      free(h);
      return cm__seterr(CM_ENOMEM, "cannot grow the handler list");
    }
    cb->recs = p;
    cb->caprecs = cap;
  }
  h->handle = cb->next_handle++;
  cb->recs[cb->nrecs++] = h;
  rc = publish(cb, NULL);
  if (rc) {
    cb->nrecs--;
    free(h);
  } else if (handle) {
    *handle = h->handle;
  }
  pthread_mutex_unlock(&cb->mu);
  reclaim(cb);
  return rc;
}

int cm__callbacks_unregister(cm__callbacks *cb, uint32_t handle) {
  pthread_mutex_lock(&cb->mu);
  size_t idx = cb->nrecs;
  for (size_t i = 0; i < cb->nrecs; i++)
    if (cb->recs[i]->handle == handle) idx = i;
  if (idx == cb->nrecs) {
    pthread_mutex_unlock(&cb->mu);
    return cm__seterr(CM_ENOENT, "no callback handler with handle %u", handle);
  }
  hrec *h = cb->recs[idx];
  memmove(&cb->recs[idx], &cb->recs[idx + 1], (cb->nrecs - idx - 1) * sizeof cb->recs[0]);
  cb->nrecs--;
  bool last = true;
  for (size_t i = 0; i < cb->nrecs; i++)
    if (cb->recs[i]->domain == h->domain && cb->recs[i]->cbid == h->cbid) last = false;
  if (last) {
    /* Delivering to nobody would cost the application thread for nothing. */
    armed *a = arm_find(cb, h->domain, h->cbid, false);
    if (a && a->arms) {
      a->arms = 0;
      if (arm_sync(cb, a) != 0)
        cblog(cb, CM_LOG_WARN, "cannot disable callback (domain %d, cbid %u): %s", h->domain,
              h->cbid, cm_errmsg());
    }
  }
  int rc = publish(cb, h);
  if (rc) {
    /* The old table still references h: leak it rather than free it under a reader. */
    rc = 0;
  }
  pthread_mutex_unlock(&cb->mu);
  reclaim(cb);
  return rc;
}

int cm__callbacks_arm(cm__callbacks *cb, int domain, uint32_t cbid) {
  int rc = check_key(domain, cbid);
  if (rc) return rc;
  pthread_mutex_lock(&cb->mu);
  armed *a = arm_find(cb, domain, cbid, true);
  if (!a) {
    rc = cm__seterr(CM_ENOMEM, "cannot grow the arm table");
  } else {
    a->arms++;
    rc = arm_sync(cb, a);
    if (rc) a->arms--;
  }
  pthread_mutex_unlock(&cb->mu);
  return rc;
}

int cm__callbacks_disarm(cm__callbacks *cb, int domain, uint32_t cbid) {
  int rc = check_key(domain, cbid);
  if (rc) return rc;
  pthread_mutex_lock(&cb->mu);
  armed *a = arm_find(cb, domain, cbid, false);
  if (!a || a->arms == 0) {
    rc = cm__seterr(CM_ENOENT, "callback (domain %d, cbid %u) is not armed", domain, cbid);
  } else {
    a->arms--;
    rc = arm_sync(cb, a);
    if (rc) a->arms++;
  }
  pthread_mutex_unlock(&cb->mu);
  return rc;
}

int cm__callbacks_armed(cm__callbacks *cb, int domain, uint32_t cbid) {
  int rc = check_key(domain, cbid);
  if (rc) return rc;
  pthread_mutex_lock(&cb->mu);
  armed *a = arm_find(cb, domain, cbid, false);
  int n = a ? (int)a->arms : 0;
  pthread_mutex_unlock(&cb->mu);
  return n;
}

void cm__callbacks_rebind(cm__callbacks *cb, CUpti_SubscriberHandle sub) {
  pthread_mutex_lock(&cb->mu);
  cb->sub = sub;
  for (size_t i = 0; i < cb->narms; i++) {
    armed *a = &cb->arms[i];
    /* cuptiFinalize disabled every callback: CUPTI's state starts from nothing. */
    a->enabled = false;
    if (sub && arm_sync(cb, a) != 0)
      cblog(cb, CM_LOG_WARN, "cannot enable callback (domain %d, cbid %u) again after a detach: %s",
            a->domain, a->cbid, cm_errmsg());
  }
  pthread_mutex_unlock(&cb->mu);
  /* Captures that began or ended while no callback was enabled were not seen; the set starts
   * empty, as at the first attach (a capture the engine cannot see is covered by the fence's
   * relaxed capture mode). */
  pthread_mutex_lock(&cb->cap_mu);
  cb->ncap = 0;
  cb->cap_untracked = 0;
  atomic_store(&cb->captures, 0);
  pthread_mutex_unlock(&cb->cap_mu);
}

uint32_t cm__callbacks_consumer_arms(cm__callbacks *cb) {
  uint32_t n = 0;
  pthread_mutex_lock(&cb->mu);
  for (size_t i = 0; i < cb->narms; i++) n += cb->arms[i].arms;
  pthread_mutex_unlock(&cb->mu);
  return n;
}

int cm__callbacks_stats(cm__callbacks *cb, cm_callback_stats *out) {
  if (!out) return cm__seterr(CM_EINVAL, "cm_callback_stats_get: out is NULL");
  memset(out, 0, sizeof *out);
  out->dispatched = atomic_load(&cb->st_dispatched);
  out->handler_calls = atomic_load(&cb->st_calls);
  out->handler_failures = atomic_load(&cb->st_failures);
  out->resource_records = atomic_load(&cb->st_res);
  out->resource_dropped = atomic_load(&cb->st_res_dropped);
  pthread_mutex_lock(&cb->mu);
  out->handlers = cb->nrecs;
  for (size_t i = 0; i < cb->narms; i++) out->armed += cb->arms[i].enabled;
  pthread_mutex_unlock(&cb->mu);
  return 0;
}
