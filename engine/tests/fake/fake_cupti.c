/*
 * fake_cupti.c: a test-only stand-in for libcupti (and the few libcuda calls of the fence), so the
 * engine's real code path runs in CI without a GPU. fake_cupti.h describes the model; this note
 * describes how it is built.
 *
 * Design.
 *  - Every thread that produces records owns a `fthread`: its current buffer (`cur`) and, for the
 *    owner alone, its external-correlation stacks and its pushed-context stack. `fthread.lock`
 *    guards `cur`; producers append under it, and a flush takes buffers away under it. The request
 *    callback is always called with no fake lock held, so the engine's own locks never nest inside
 *    ours (the completion callback, on our completion thread, calls back into
 *    cuptiActivityGetNumDroppedRecords and cuptiActivityGetNextRecord, which take no lock at all).
 *  - A buffer leaves its thread in one of two ways: full (the producer retires it) or flushed.
 *    Either way it goes to the completion queue, or, when it still holds pending records, to the
 *    held list until a device sync completes them (or a forced flush delivers them with end == 0).
 *  - Pending records are tracked by epoch: a pending record is stamped with the current
 *    `sync_epoch`, and cuCtxSynchronize increments it, so a record is complete once
 *    sync_epoch > its stamp. That makes a sync O(held buffers) and race-free with producers: a
 *    buffer's completeness is decided under the queue lock, which the sync also takes after it
 *    bumps the epoch.
 *  - One completion thread pops the queue in FIFO order and calls the completion callback. A flush
 *    notes how many buffers have been enqueued so far and waits until that many have been
 *    delivered, so it returns only after everything queued before it has been handed over.
 *  - Thread records are never freed: when a thread exits, its record is orphaned (its buffer stays
 *    for the next flush) and a later new thread adopts it, so the registry stays as large as the
 *    peak number of producing threads.
 *
 * Lock order: reg.lock -> fthread.lock -> q.lock; ctl.lock is a leaf. Counters and knobs are C11
 * atomics. No lock is held while a user callback (request, completion, subscriber) runs.
 */

/* cupti.h pulls in cuda.h, whose driver prototypes use CUresult/CUcontext; the fake exports the
 * same symbols with the engine's int/void* view (ABI-identical), so the cuda.h declarations are
 * renamed out of the way while the header is read. */
#define cuCtxGetCurrent fake_cudah_cuCtxGetCurrent
#define cuCtxSynchronize fake_cudah_cuCtxSynchronize
#define cuDeviceGetCount fake_cudah_cuDeviceGetCount
#define cuDevicePrimaryCtxGetState fake_cudah_cuDevicePrimaryCtxGetState
#define cuDevicePrimaryCtxRetain fake_cudah_cuDevicePrimaryCtxRetain
#define cuThreadExchangeStreamCaptureMode fake_cudah_cuThreadExchangeStreamCaptureMode
/* CUPTI's headers use an enumerator above INT_MAX, which -Wpedantic flags; that is theirs. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <cupti.h>
#pragma GCC diagnostic pop
#undef cuCtxGetCurrent
#undef cuCtxSynchronize
#undef cuDeviceGetCount
#undef cuDevicePrimaryCtxGetState
#undef cuDevicePrimaryCtxRetain
#undef cuThreadExchangeStreamCaptureMode
/* cuda.h maps these three to their _v2 names; the fake exports both spellings. */
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuDevicePrimaryCtxRelease

#include "fake_cupti.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

/* The libcuda calls, as the engine's binding table declares them. */
FAKE_EXPORT int cuCtxGetCurrent(void **ctx);
FAKE_EXPORT int cuCtxSynchronize(void);
FAKE_EXPORT int cuDeviceGetCount(int *count);
FAKE_EXPORT int cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active);
FAKE_EXPORT int cuDevicePrimaryCtxRetain(void **ctx, int dev);
FAKE_EXPORT int cuDevicePrimaryCtxRelease(int dev);
FAKE_EXPORT int cuCtxPushCurrent(void *ctx);
FAKE_EXPORT int cuCtxPopCurrent(void **ctx);
FAKE_EXPORT int cuThreadExchangeStreamCaptureMode(int *mode);

/* The CUresult values the fake driver returns. */
enum {
  FAKE_CUDA_SUCCESS = 0,
  FAKE_CUDA_ERROR_INVALID_VALUE = 1,
  FAKE_CUDA_ERROR_OUT_OF_MEMORY = 2,
  FAKE_CUDA_ERROR_INVALID_DEVICE = 101,
  FAKE_CUDA_ERROR_INVALID_CONTEXT = 201,
};

#define FAKE_VERSION 130001u
#define FAKE_NKINDS ((int)CUPTI_ACTIVITY_KIND_COUNT)
#define FAKE_NEXT_KINDS ((int)CUPTI_EXTERNAL_CORRELATION_KIND_SIZE)
#define FAKE_CTX_STACK 16
#define FAKE_CBID_BITS 8192 /* above every driver/runtime/resource/nvtx cbid of CUPTI 13.0 */

/* ---- record layouts ---------------------------------------------------------------------- */

/* Per kind: the 13.0 struct size, and the offset of its `end` timestamp (0 when it has none; the
 * kind field sits at offset 0, so 0 never names a real end). A size of 0 marks a kind the fake
 * does not know, which cuptiActivityGetNextRecord reports as CUPTI_ERROR_INVALID_KIND. */
typedef struct kind_info {
  uint32_t size;
  uint32_t end_off;
} kind_info;

#define KI(K, T, E) [CUPTI_ACTIVITY_KIND_##K] = {sizeof(T), E}
static const kind_info kind_tab[FAKE_NKINDS] = {
    KI(KERNEL, CUpti_ActivityKernel10, offsetof(CUpti_ActivityKernel10, end)),
    KI(CONCURRENT_KERNEL, CUpti_ActivityKernel10, offsetof(CUpti_ActivityKernel10, end)),
    KI(MEMCPY, CUpti_ActivityMemcpy6, offsetof(CUpti_ActivityMemcpy6, end)),
    KI(MEMCPY2, CUpti_ActivityMemcpyPtoP4, offsetof(CUpti_ActivityMemcpyPtoP4, end)),
    KI(MEMSET, CUpti_ActivityMemset4, offsetof(CUpti_ActivityMemset4, end)),
    KI(RUNTIME, CUpti_ActivityAPI, offsetof(CUpti_ActivityAPI, end)),
    KI(DRIVER, CUpti_ActivityAPI, offsetof(CUpti_ActivityAPI, end)),
    KI(SYNCHRONIZATION, CUpti_ActivitySynchronization2,
       offsetof(CUpti_ActivitySynchronization2, end)),
    KI(CUDA_EVENT, CUpti_ActivityCudaEvent2, 0),
    KI(EXTERNAL_CORRELATION, CUpti_ActivityExternalCorrelation, 0),
    KI(MARKER, CUpti_ActivityMarker2, 0),
    KI(MARKER_DATA, CUpti_ActivityMarkerData2, 0),
    KI(OVERHEAD, CUpti_ActivityOverhead3, offsetof(CUpti_ActivityOverhead3, end)),
    KI(GRAPH_TRACE, CUpti_ActivityGraphTrace2, offsetof(CUpti_ActivityGraphTrace2, end)),
    KI(MEMORY2, CUpti_ActivityMemory4, 0),
    KI(MEMORY_POOL, CUpti_ActivityMemoryPool3, 0),
    KI(DEVICE, CUpti_ActivityDevice5, 0),
    KI(CONTEXT, CUpti_ActivityContext3, 0),
    KI(NAME, CUpti_ActivityName, 0),
    KI(STREAM, CUpti_ActivityStream, 0),
    KI(ENVIRONMENT, CUpti_ActivityEnvironment, 0),
};
#undef KI

/* Returns the record size of `kind`, or 0 when the fake does not know it. */
static size_t kind_size(uint32_t kind) {
  return kind < (uint32_t)FAKE_NKINDS ? kind_tab[kind].size : 0;
}

/* ---- buffers, threads, queue ------------------------------------------------------------- */

typedef struct pend_rec {
  size_t off;     /* record offset in the buffer */
  uint64_t epoch; /* sync_epoch when it was written; complete once sync_epoch > epoch */
} pend_rec;

/* A buffer lent by the request callback. Owned by one fthread (under its lock) while current,
 * then by the queue (under q.lock), then by the completion thread, which frees the struct after
 * handing `data` back. */
typedef struct fbuf {
  uint8_t *data;
  size_t size;
  size_t used;
  pend_rec *pend; /* pending records, oldest first; entries older than the epoch are stale */
  size_t npend;
  size_t cappend;
  struct fbuf *next;
} fbuf;

typedef struct fthread {
  /* Guarded by `lock`. */
  pthread_mutex_t lock;
  fbuf *cur;
  /* Guarded by reg.lock. */
  int orphan;
  struct fthread *next;
  /* Touched only by the owner thread (adoption is ordered by reg.lock). */
  uint64_t *corr[FAKE_NEXT_KINDS];
  size_t ncorr[FAKE_NEXT_KINDS];
  size_t capcorr[FAKE_NEXT_KINDS];
  void *ctx_stack[FAKE_CTX_STACK];
  int nctx;
} fthread;

static struct {
  pthread_mutex_t lock; /* guards `head` and every fthread's orphan/next */
  fthread *head;
  pthread_key_t key;
  pthread_once_t once;
} reg = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, PTHREAD_ONCE_INIT};

static struct {
  pthread_mutex_t lock; /* guards everything below */
  pthread_cond_t work;  /* signalled when `head` gains a buffer */
  pthread_cond_t done;  /* broadcast when `delivered` grows */
  fbuf *head, *tail;    /* FIFO of buffers to complete */
  fbuf *held;           /* buffers with pending records, waiting for a sync */
  uint64_t enqueued;    /* buffers ever put on the FIFO */
  uint64_t delivered;   /* buffers whose completion callback has returned */
  pthread_once_t started;
} q = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
       NULL, NULL, NULL, 0, 0, PTHREAD_ONCE_INIT};

/* Subscriber state; ctl.lock guards all of it. */
static struct {
  pthread_mutex_t lock;
  int subscribed;
  CUpti_CallbackFunc callback;
  void *userdata;
  char name[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN];
  char foreign[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN]; /* empty: no foreign subscriber */
  uint8_t domain_on[CUPTI_CB_DOMAIN_SIZE];
  uint8_t cbid_on[CUPTI_CB_DOMAIN_SIZE][FAKE_CBID_BITS / 8];
} ctl = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The handle cuptiSubscribe gives out; only its address matters. */
static int subscriber_token;
/* The dummy primary context of device 0. */
static int primary_ctx_token;

static _Atomic(CUpti_BuffersCallbackRequestFunc) cb_request;
static _Atomic(CUpti_BuffersCallbackCompleteFunc) cb_complete;
static _Atomic(CUpti_TimestampCallbackFunc) cb_timestamp;

static atomic_int kind_on[FAKE_NKINDS];
/* The last value given to CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER (-1: never set). */
static atomic_int per_thread_attr = -1;
static atomic_uint_fast64_t sync_epoch;
static atomic_uint_fast64_t drops_unreported;

static atomic_int knob_no_context;
static atomic_int knob_primary_inactive; /* device 0's primary context reads as not active */
static atomic_uint knob_completion_delay_us;
static atomic_int knob_suppress_sync;
static atomic_int knob_reject_push;
/* cuCtxSynchronize blocks this long first (a kernel still running); -1: not read from the
 * environment (FAKE_CUDA_SYNC_BLOCK_MS) yet. */
static atomic_int knob_sync_block_ms = -1;
/* fake_set_flush_block_ms: how long every cuptiActivityFlushAll sleeps first (0: not at all). */
static atomic_int knob_flush_block_ms;
static atomic_int knob_flush_block_forced_only; /* the block applies to forced flushes only */
/* fake_set_backlog_ms: until this CLOCK_MONOTONIC time (ns; 0: none), cuptiActivityFlushAll
 * completes no buffer, as CUPTI behind by that much does. */
static atomic_uint_fast64_t knob_backlog_until_ns;
/* fake_set_default_flush_full_only: default flushes return no partly filled buffer. */
static atomic_int knob_default_full_only;
/* fake_set_kernel_backlog: while > 0, kernel records are not written when made but held in
 * `held_k`, and each cuptiActivityFlushAll writes at most this many of them (into the flushing
 * thread's buffer) before it takes the buffers: CUPTI behind on kernel records alone, as a GPU's
 * CUPTI can be under sustained launches while the API and sync records of the same time come on
 * time. */
static atomic_int knob_kernel_backlog;
static pthread_mutex_t held_k_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *held_k;          /* records back to back, guarded by held_k_mu */
static size_t held_k_len, held_k_cap, held_k_off; /* bytes held, capacity, bytes written out */

static uint64_t fake_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Simulated stream captures: how many are in progress, and whether a synchronize in a mode other
 * than relaxed has invalidated them since the first one began. */
static atomic_int cap_active;
static atomic_int cap_invalidated;
static _Thread_local int t_capture_mode; /* CUstreamCaptureMode of the thread: 0 global */

#define FAKE_CB_COUNTED 1024
/* cuptiEnableCallback calls per (enable, domain, cbid), for cbid < FAKE_CB_COUNTED. */
static atomic_uint cb_enable_calls[2][CUPTI_CB_DOMAIN_SIZE][FAKE_CB_COUNTED];
static atomic_uint fake_next_correlation = 1u << 20;

static struct {
  atomic_uint_fast64_t records_written, records_dropped, records_disabled;
  atomic_uint_fast64_t buffers_requested, buffers_completed;
  atomic_uint_fast64_t flushes, forced_flushes, syncs;
  atomic_uint_fast64_t enable_calls[64], disable_calls[64];
  atomic_uint_fast64_t subscribes, unsubscribes, finalize_calls;
  atomic_uint_fast64_t finalize_in_callback, finalize_lost_records, finalize_held_buffers;
  atomic_uint_fast64_t finalize_in_runtime;
  atomic_uint_fast64_t calls_while_finalized;
  atomic_uint_fast64_t syncs_during_capture, captures_invalidated, capture_mode_exchanges;
  atomic_int latency_timestamps, cuda_event_device_timestamps, timestamp_callback_registrations;
} st;

static _Thread_local fthread *t_self;
/* Subscriber callbacks the calling thread is inside of (fake_fire_callback). */
static _Thread_local int t_in_callback;
static _Thread_local int t_callback_domain; /* the domain of the callback running on this thread */
/* Set by cuptiFinalize, cleared by the next cuptiSubscribe: every CUPTI call in between (which
 * would initialize the real CUPTI again, the cost a detach is meant to shed) is counted. */
static atomic_int finalized;
#define AFTER_FINALIZE()                                                                        \
  do {                                                                                          \
    if (atomic_load(&finalized)) BUMP(st.calls_while_finalized);                                \
  } while (0)
static _Thread_local int t_is_completer;

/* Counter bump with relaxed ordering: stats are read only for assertions after the fact. */
#define BUMP(c) atomic_fetch_add_explicit(&(c), 1, memory_order_relaxed)

/* ---- time -------------------------------------------------------------------------------- */

uint64_t fake_now(void) {
  CUpti_TimestampCallbackFunc f = atomic_load(&cb_timestamp);
  if (f) return f();
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- thread records ---------------------------------------------------------------------- */

/* Runs when a producing thread exits: frees its correlation stacks and orphans its record; the
 * buffer stays in place for the next flush, and a new thread may adopt the record. */
static void thread_exit(void *p) {
  fthread *ft = p;
  for (int k = 0; k < FAKE_NEXT_KINDS; k++) {
    free(ft->corr[k]);
    ft->corr[k] = NULL;
    ft->ncorr[k] = ft->capcorr[k] = 0;
  }
  ft->nctx = 0;
  t_self = NULL;
  pthread_mutex_lock(&reg.lock);
  ft->orphan = 1;
  pthread_mutex_unlock(&reg.lock);
}

static void reg_init(void) { pthread_key_create(&reg.key, thread_exit); }

/* Returns the calling thread's record, adopting an orphan or allocating one; NULL only when out
 * of memory. */
static fthread *self_thread(void) {
  if (t_self) return t_self;
  pthread_once(&reg.once, reg_init);
  fthread *ft = NULL;
  pthread_mutex_lock(&reg.lock);
  for (fthread *it = reg.head; it; it = it->next)
    if (it->orphan) {
      it->orphan = 0;
      ft = it;
      break;
    }
  if (!ft && (ft = calloc(1, sizeof *ft)) != NULL) {
    pthread_mutex_init(&ft->lock, NULL);
    ft->next = reg.head;
    reg.head = ft;
  }
  pthread_mutex_unlock(&reg.lock);
  if (!ft) return NULL;
  pthread_setspecific(reg.key, ft);
  t_self = ft;
  return ft;
}

/* ---- completion -------------------------------------------------------------------------- */

/* True when every pending record of `b` has been completed by a sync. */
static int fbuf_complete(const fbuf *b, uint64_t epoch) {
  return b->npend == 0 || b->pend[b->npend - 1].epoch < epoch;
}

/* Delivers a forced buffer as real CUPTI does: still-running records get end == 0. */
static void fbuf_force(fbuf *b, uint64_t epoch) {
  for (size_t i = 0; i < b->npend; i++) {
    if (b->pend[i].epoch < epoch) continue;
    uint32_t kind;
    memcpy(&kind, b->data + b->pend[i].off, sizeof kind);
    uint32_t end_off = kind < (uint32_t)FAKE_NKINDS ? kind_tab[kind].end_off : 0;
    if (end_off) memset(b->data + b->pend[i].off + end_off, 0, sizeof(uint64_t));
  }
  b->npend = 0;
}

static void *completer_main(void *arg) {
  (void)arg;
  t_is_completer = 1;
  pthread_mutex_lock(&q.lock);
  for (;;) {
    while (!q.head) pthread_cond_wait(&q.work, &q.lock);
    fbuf *b = q.head;
    q.head = b->next;
    if (!q.head) q.tail = NULL;
    pthread_mutex_unlock(&q.lock);

    unsigned delay = atomic_load(&knob_completion_delay_us);
    if (delay) usleep(delay);
    CUpti_BuffersCallbackCompleteFunc f = atomic_load(&cb_complete);
    if (f) f(NULL, 0, b->data, b->size, b->used);
    BUMP(st.buffers_completed);
    free(b->pend);
    free(b);

    pthread_mutex_lock(&q.lock);
    q.delivered++;
    pthread_cond_broadcast(&q.done);
  }
  return NULL;
}

static void completer_start(void) {
  pthread_t t;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  pthread_create(&t, &a, completer_main, NULL);
  pthread_attr_destroy(&a);
}

/* Appends `b` to the FIFO. Caller holds q.lock. */
static void enqueue_locked(fbuf *b) {
  b->next = NULL;
  if (q.tail) q.tail->next = b;
  else q.head = b;
  q.tail = b;
  q.enqueued++;
  pthread_cond_signal(&q.work);
}

/* Hands a buffer that left its thread to the completion path: the FIFO when its records are all
 * complete (or `forced`), else the held list. Takes q.lock; the caller may hold an fthread lock. */
static void retire(fbuf *b, int forced) {
  pthread_once(&q.started, completer_start);
  pthread_mutex_lock(&q.lock);
  uint64_t epoch = atomic_load(&sync_epoch);
  if (forced) fbuf_force(b, epoch);
  if (fbuf_complete(b, epoch)) {
    enqueue_locked(b);
  } else {
    b->next = q.held;
    q.held = b;
  }
  pthread_mutex_unlock(&q.lock);
}

/* Moves held buffers whose records are now complete (all of them when `forced`) to the FIFO,
 * keeping their original order. Takes q.lock. */
static void release_held(int forced) {
  pthread_mutex_lock(&q.lock);
  uint64_t epoch = atomic_load(&sync_epoch);
  fbuf *keep = NULL, *rev = NULL;
  for (fbuf *b = q.held, *n; b; b = n) { /* the held list is newest first: reverse it */
    n = b->next;
    b->next = rev;
    rev = b;
  }
  for (fbuf *b = rev, *n; b; b = n) {
    n = b->next;
    if (forced) fbuf_force(b, epoch);
    if (fbuf_complete(b, epoch)) {
      enqueue_locked(b);
    } else {
      b->next = keep;
      keep = b;
    }
  }
  q.held = keep;
  pthread_mutex_unlock(&q.lock);
}

/* Waits until every buffer enqueued so far has been delivered. On the completion thread itself
 * (a completion callback that flushes) waiting would deadlock, so it returns at once. */
static void wait_delivered(void) {
  if (t_is_completer) return;
  pthread_mutex_lock(&q.lock);
  uint64_t target = q.enqueued;
  while (q.delivered < target) pthread_cond_wait(&q.done, &q.lock);
  pthread_mutex_unlock(&q.lock);
}

/* ---- the write path ---------------------------------------------------------------------- */

/* Asks the request callback for a buffer that fits `need` bytes. Called with no lock held.
 * Returns NULL when none was given; a buffer too small for the record is handed straight back
 * through the completion path (validSize 0), so the engine never loses track of it. */
static fbuf *request_buffer(size_t need) {
  CUpti_BuffersCallbackRequestFunc f = atomic_load(&cb_request);
  if (!f) return NULL;
  uint8_t *data = NULL;
  size_t size = 0, maxrec = 0;
  f(&data, &size, &maxrec);
  BUMP(st.buffers_requested);
  if (!data || size == 0) return NULL;
  fbuf *b = calloc(1, sizeof *b);
  if (!b) return NULL; /* the buffer is lost to the engine; only under OOM in a test */
  b->data = data;
  b->size = size;
  if (size < need) {
    retire(b, 0);
    return NULL;
  }
  return b;
}

static void count_drop(void) {
  BUMP(st.records_dropped);
  atomic_fetch_add(&drops_unreported, 1);
}

/* Appends one record to the calling thread's buffer. Returns 0, 1 (dropped) or -1 (no memory).
 * The kind's enablement has been checked by the caller. */
static int write_record(const void *rec, size_t size, int pending) {
  fthread *ft = self_thread();
  if (!ft) return -1;
  pthread_mutex_lock(&ft->lock);
  if (ft->cur && ft->cur->size - ft->cur->used < size) {
    retire(ft->cur, 0);
    ft->cur = NULL;
  }
  if (!ft->cur) {
    pthread_mutex_unlock(&ft->lock);
    fbuf *nb = request_buffer(size);
    if (!nb) {
      count_drop();
      return 1;
    }
    pthread_mutex_lock(&ft->lock);
    /* Only the owner installs a buffer, and a flush only takes one away, so cur is still NULL. */
    ft->cur = nb;
  }
  fbuf *b = ft->cur;
  if (pending) {
    uint64_t epoch = atomic_load(&sync_epoch);
    if (b->npend && b->pend[b->npend - 1].epoch < epoch) b->npend = 0; /* all stale */
    if (b->npend == b->cappend) {
      size_t cap = b->cappend ? b->cappend * 2 : 64;
      pend_rec *p = realloc(b->pend, cap * sizeof *p);
      if (!p) {
        pthread_mutex_unlock(&ft->lock);
        return -1;
      }
      b->pend = p;
      b->cappend = cap;
    }
    b->pend[b->npend++] = (pend_rec){b->used, epoch};
  }
  memcpy(b->data + b->used, rec, size);
  b->used += size;
  pthread_mutex_unlock(&ft->lock);
  BUMP(st.records_written);
  return 0;
}

/* Real CUPTI writes an EXTERNAL_CORRELATION record for each non-empty external-id stack of the
 * thread ahead of an API record; the fake does the same, so correlation is testable end to end. */
static void emit_external_correlation(const void *api_record) {
  if (!atomic_load(&kind_on[CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION])) return;
  fthread *ft = self_thread();
  if (!ft) return;
  CUpti_ActivityAPI api;
  memcpy(&api, api_record, sizeof api);
  for (int k = 0; k < FAKE_NEXT_KINDS; k++) {
    if (!ft->ncorr[k]) continue;
    CUpti_ActivityExternalCorrelation r;
    memset(&r, 0, sizeof r);
    r.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    r.externalKind = (CUpti_ExternalCorrelationKind)k;
    r.externalId = ft->corr[k][ft->ncorr[k] - 1];
    r.correlationId = api.correlationId;
    write_record(&r, sizeof r, 0);
  }
}

/* cuptiActivityDisable returns only once every record of the kind that a producer had begun to
 * write (it saw the kind enabled) is in a buffer, as CUPTI's own disable does for the calls in
 * progress: emitters count themselves in under one of two phases, and the disable flips the phase
 * and waits for the old one to drain. So a record the fake counts as written is always in a
 * buffer that the flush after the disable takes. */
static atomic_uint emit_phase;
static atomic_uint emit_inflight[2];

/* Holds a kernel record for fake_set_kernel_backlog. Returns 0, or -1 without memory. */
static int hold_kernel(const void *record, size_t size) {
  pthread_mutex_lock(&held_k_mu);
  if (held_k_len + size > held_k_cap) {
    size_t cap = held_k_cap ? held_k_cap * 2 : 1u << 16;
    while (cap < held_k_len + size) cap *= 2;
    uint8_t *p = realloc(held_k, cap);
    if (!p) {
      pthread_mutex_unlock(&held_k_mu);
      return -1;
    }
    held_k = p;
    held_k_cap = cap;
  }
  memcpy(held_k + held_k_len, record, size);
  held_k_len += size;
  pthread_mutex_unlock(&held_k_mu);
  return 0;
}

/* Writes at most `n` held kernel records from the calling thread (a flush). */
static void release_kernels(int n) {
  const size_t size = sizeof(CUpti_ActivityKernel10);
  pthread_mutex_lock(&held_k_mu);
  for (; n > 0 && held_k_off + size <= held_k_len; n--, held_k_off += size)
    write_record(held_k + held_k_off, size, 0);
  if (held_k_off == held_k_len) held_k_off = held_k_len = 0;
  pthread_mutex_unlock(&held_k_mu);
}

int fake_emit(const void *record, size_t size, int pending) {
  uint32_t kind;
  if (!record || size < sizeof kind || size % 8 != 0) return -1;
  memcpy(&kind, record, sizeof kind);
  if (kind == 0 || kind >= (uint32_t)FAKE_NKINDS) return -1;
  if (kind_size(kind) && kind_size(kind) != size) return -1;
  unsigned ph = atomic_load(&emit_phase) & 1;
  atomic_fetch_add(&emit_inflight[ph], 1);
  int rc;
  if (!atomic_load(&kind_on[kind])) {
    BUMP(st.records_disabled);
    rc = 2;
  } else {
    if (kind == CUPTI_ACTIVITY_KIND_RUNTIME || kind == CUPTI_ACTIVITY_KIND_DRIVER)
      emit_external_correlation(record);
    if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && !pending && atomic_load(&knob_kernel_backlog) > 0)
      rc = hold_kernel(record, size);
    else
      rc = write_record(record, size, pending);
  }
  atomic_fetch_sub(&emit_inflight[ph], 1);
  return rc;
}

/* Takes every current buffer that may go: non-empty and complete, or non-empty when forced. */
static void flush_threads(int forced) {
  pthread_mutex_lock(&reg.lock);
  for (fthread *ft = reg.head; ft; ft = ft->next) {
    pthread_mutex_lock(&ft->lock);
    fbuf *b = ft->cur;
    if (b && b->used &&
        (forced || (!atomic_load(&knob_default_full_only) && fbuf_complete(b, atomic_load(&sync_epoch))))) {
      ft->cur = NULL;
      retire(b, forced);
    }
    pthread_mutex_unlock(&ft->lock);
  }
  pthread_mutex_unlock(&reg.lock);
}

/* ---- CUPTI: version, results, timestamps ------------------------------------------------- */

FAKE_EXPORT CUptiResult CUPTIAPI cuptiGetVersion(uint32_t *version) {
  if (!version) return CUPTI_ERROR_INVALID_PARAMETER;
  *version = FAKE_VERSION;
  return CUPTI_SUCCESS;
}

#define FAKE_RESULTS(X)                                                                         \
  X(SUCCESS) X(ERROR_INVALID_PARAMETER) X(ERROR_INVALID_DEVICE) X(ERROR_INVALID_CONTEXT)        \
  X(ERROR_INVALID_OPERATION) X(ERROR_OUT_OF_MEMORY) X(ERROR_API_NOT_IMPLEMENTED)                \
  X(ERROR_MAX_LIMIT_REACHED) X(ERROR_NOT_READY) X(ERROR_NOT_COMPATIBLE)                         \
  X(ERROR_NOT_INITIALIZED) X(ERROR_QUEUE_EMPTY) X(ERROR_INVALID_HANDLE) X(ERROR_INVALID_KIND)   \
  X(ERROR_DISABLED) X(ERROR_NOT_SUPPORTED) X(ERROR_INSUFFICIENT_PRIVILEGES)                     \
  X(ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) X(ERROR_INVALID_METRIC_NAME) X(ERROR_UNKNOWN)

FAKE_EXPORT CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char **str) {
  if (!str) return CUPTI_ERROR_INVALID_PARAMETER;
  switch (result) {
#define X(n)                                                                                    \
  case CUPTI_##n:                                                                               \
    *str = "CUPTI_" #n;                                                                         \
    return CUPTI_SUCCESS;
    FAKE_RESULTS(X)
#undef X
  default:
    *str = "CUPTI_ERROR_UNKNOWN";
    return CUPTI_ERROR_INVALID_PARAMETER;
  }
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t *timestamp) {
  AFTER_FINALIZE();
  if (!timestamp) return CUPTI_ERROR_INVALID_PARAMETER;
  *timestamp = fake_now();
  return CUPTI_SUCCESS;
}

/* Forgets the subscriber and every callback it enabled (an unsubscribe, a finalize). Caller holds
 * ctl.lock. */
static void ctl_forget_locked(void) {
  ctl.subscribed = 0;
  ctl.callback = NULL;
  ctl.userdata = NULL;
  memset(ctl.domain_on, 0, sizeof ctl.domain_on);
  memset(ctl.cbid_on, 0, sizeof ctl.cbid_on);
}

/* The records in a buffer the fake still holds. */
static uint64_t fbuf_records(const fbuf *b) {
  uint64_t n = 0;
  for (size_t off = 0; off + sizeof(uint32_t) <= b->used;) {
    uint32_t kind;
    memcpy(&kind, b->data + off, sizeof kind);
    size_t sz = kind_size(kind);
    if (!sz) break;
    off += sz;
    n++;
  }
  return n;
}

static void fbuf_drop(fbuf *b) {
  atomic_fetch_add(&st.finalize_lost_records, fbuf_records(b));
  BUMP(st.finalize_held_buffers);
  free(b->pend);
  free(b); /* its data is the client's, which CUPTI never frees */
}

/* Detaches as CUPTI documents: every kind, callback and registration is forgotten, and a later
 * cuptiSubscribe starts from nothing. Buffers completed before the call reach the client first;
 * what the fake still holds (a thread's current buffer, buffers waiting for a sync, held kernel
 * records) is lost with CUPTI's state and counted (finalize_lost_records, finalize_held_buffers):
 * the client must flush first. finalize_in_callback counts the calls made inside a subscriber
 * callback, the call site CUPTI recommends. */
static atomic_int finalize_block_ms;
void fake_set_finalize_block_ms(int ms) { atomic_store(&finalize_block_ms, ms); }

FAKE_EXPORT CUptiResult CUPTIAPI cuptiFinalize(void) {
  /* fake_set_finalize_block_ms: CUPTI waiting for the application's threads, as on a GPU.
   * Every CUPTI call meanwhile counts as one made while finalized. */
  int block = atomic_load(&finalize_block_ms);
  const char *env = getenv("FAKE_CUPTI_FINALIZE_BLOCK_MS");
  if (env && *env) block = atoi(env);
  if (block > 0) {
    atomic_store(&finalized, 1);
    usleep((useconds_t)block * 1000);
  }
  BUMP(st.finalize_calls);
  if (t_in_callback) BUMP(st.finalize_in_callback);
  if (t_in_callback && t_callback_domain == CUPTI_CB_DOMAIN_RUNTIME_API) BUMP(st.finalize_in_runtime);
  for (int k = 0; k < FAKE_NKINDS; k++) atomic_store(&kind_on[k], 0);
  unsigned old = atomic_fetch_add(&emit_phase, 1) & 1;
  while (atomic_load(&emit_inflight[old]) != 0) sched_yield();
  wait_delivered();
  pthread_mutex_lock(&reg.lock);
  for (fthread *ft = reg.head; ft; ft = ft->next) {
    pthread_mutex_lock(&ft->lock);
    if (ft->cur) fbuf_drop(ft->cur);
    ft->cur = NULL;
    pthread_mutex_unlock(&ft->lock);
  }
  pthread_mutex_unlock(&reg.lock);
  pthread_mutex_lock(&q.lock);
  for (fbuf *b = q.held, *n; b; b = n) {
    n = b->next;
    fbuf_drop(b);
  }
  q.held = NULL;
  pthread_mutex_unlock(&q.lock);
  pthread_mutex_lock(&held_k_mu);
  atomic_fetch_add(&st.finalize_lost_records, (held_k_len - held_k_off) / sizeof(CUpti_ActivityKernel10));
  held_k_off = held_k_len = 0;
  pthread_mutex_unlock(&held_k_mu);
  pthread_mutex_lock(&ctl.lock);
  ctl_forget_locked();
  pthread_mutex_unlock(&ctl.lock);
  atomic_store(&cb_request, NULL);
  atomic_store(&cb_complete, NULL);
  atomic_store(&cb_timestamp, NULL);
  atomic_store(&st.latency_timestamps, 0);
  atomic_store(&st.cuda_event_device_timestamps, 0);
  atomic_store(&per_thread_attr, -1);
  atomic_store(&finalized, 1);
  return CUPTI_SUCCESS;
}

/* ---- CUPTI: subscriber and callbacks ----------------------------------------------------- */

/* Copies the existing subscriber's name into the caller's buffer. Caller holds ctl.lock. */
static void report_old_subscriber(CUpti_SubscriberParams *p) {
  if (!p || !p->oldSubscriberName || p->oldSubscriberSize == 0) return;
  const char *old = ctl.foreign[0] ? ctl.foreign : ctl.name;
  size_t n = strlen(old);
  if (n >= p->oldSubscriberSize) n = p->oldSubscriberSize - 1;
  memcpy(p->oldSubscriberName, old, n);
  p->oldSubscriberName[n] = '\0';
}

static atomic_int subscribe_delay_ms;
void fake_set_subscribe_delay_ms(int ms) { atomic_store(&subscribe_delay_ms, ms); }

FAKE_EXPORT CUptiResult CUPTIAPI cuptiSubscribe_v2(CUpti_SubscriberHandle *subscriber,
                                                   CUpti_CallbackFunc callback, void *userdata,
                                                   CUpti_SubscriberParams *pParams) {
  if (!subscriber) return CUPTI_ERROR_INVALID_PARAMETER;
  if (pParams && pParams->structSize == 0) return CUPTI_ERROR_INVALID_PARAMETER;
  /* FAKE_CUPTI_SUBSCRIBE_DELAY_MS: a subscription as slow as the real one (loading CUPTI takes
   * tens of ms), during which the agent's connection to the monitor is open but silent. */
  const char *delay = getenv("FAKE_CUPTI_SUBSCRIBE_DELAY_MS");
  if (delay && atoi(delay) > 0) usleep((useconds_t)atoi(delay) * 1000);
  /* fake_set_subscribe_delay_ms: an attach as slow as one on a GPU with many launching threads. */
  int slow = atomic_load(&subscribe_delay_ms);
  if (slow > 0) usleep((useconds_t)slow * 1000);
  /* FAKE_CUPTI_RESUBSCRIBE_DELAY_MS: every subscription after the first takes this long. With
   * many threads launching, each attach after a detach blocks for as long as they do, while the
   * first, at the start, returns at once. */
  const char *again = getenv("FAKE_CUPTI_RESUBSCRIBE_DELAY_MS");
  if (again && atoi(again) > 0 && atomic_load(&st.subscribes) > 0)
    usleep((useconds_t)atoi(again) * 1000);
  /* FAKE_CUPTI_SUBSCRIBE_RESULT=N: subscribing fails with CUPTI result N, as the real CUPTI does
   * on a machine without a GPU or driver (CUPTI_ERROR_UNKNOWN, 999). */
  const char *fail = getenv("FAKE_CUPTI_SUBSCRIBE_RESULT");
  if (fail && atoi(fail) != 0) return (CUptiResult)atoi(fail);
  pthread_mutex_lock(&ctl.lock);
  if (ctl.foreign[0] || ctl.subscribed) {
    report_old_subscriber(pParams);
    pthread_mutex_unlock(&ctl.lock);
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  }
  ctl.subscribed = 1;
  ctl.callback = callback;
  ctl.userdata = userdata;
  const char *nm = pParams && pParams->subscriberName ? pParams->subscriberName : "unnamed";
  snprintf(ctl.name, sizeof ctl.name, "CUPTI for %s", nm);
  memset(ctl.domain_on, 0, sizeof ctl.domain_on);
  memset(ctl.cbid_on, 0, sizeof ctl.cbid_on);
  pthread_mutex_unlock(&ctl.lock);
  *subscriber = (CUpti_SubscriberHandle)&subscriber_token;
  atomic_store(&finalized, 0);
  BUMP(st.subscribes);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle *subscriber,
                                                CUpti_CallbackFunc callback, void *userdata) {
  return cuptiSubscribe_v2(subscriber, callback, userdata, NULL);
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiUnsubscribe(CUpti_SubscriberHandle subscriber) {
  pthread_mutex_lock(&ctl.lock);
  if (!ctl.subscribed || subscriber != (CUpti_SubscriberHandle)&subscriber_token) {
    pthread_mutex_unlock(&ctl.lock);
    return CUPTI_ERROR_INVALID_PARAMETER;
  }
  ctl_forget_locked();
  pthread_mutex_unlock(&ctl.lock);
  BUMP(st.unsubscribes);
  return CUPTI_SUCCESS;
}

/* Validates a subscriber handle and domain. Caller holds ctl.lock. */
static CUptiResult check_sub(CUpti_SubscriberHandle s, CUpti_CallbackDomain domain) {
  if (!ctl.subscribed || s != (CUpti_SubscriberHandle)&subscriber_token)
    return CUPTI_ERROR_INVALID_PARAMETER;
  if ((int)domain <= (int)CUPTI_CB_DOMAIN_INVALID || (int)domain >= (int)CUPTI_CB_DOMAIN_SIZE)
    return CUPTI_ERROR_INVALID_PARAMETER;
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiEnableCallback(uint32_t enable,
                                                     CUpti_SubscriberHandle subscriber,
                                                     CUpti_CallbackDomain domain,
                                                     CUpti_CallbackId cbid) {
  AFTER_FINALIZE();
  pthread_mutex_lock(&ctl.lock);
  CUptiResult r = check_sub(subscriber, domain);
  if (r == CUPTI_SUCCESS && cbid >= FAKE_CBID_BITS) r = CUPTI_ERROR_INVALID_PARAMETER;
  if (r == CUPTI_SUCCESS && cbid < FAKE_CB_COUNTED)
    atomic_fetch_add(&cb_enable_calls[enable ? 1 : 0][domain][cbid], 1);
  if (r == CUPTI_SUCCESS) {
    uint8_t bit = (uint8_t)(1u << (cbid % 8));
    if (enable) ctl.cbid_on[domain][cbid / 8] |= bit;
    else ctl.cbid_on[domain][cbid / 8] &= (uint8_t)~bit;
  }
  pthread_mutex_unlock(&ctl.lock);
  return r;
}

/* Enabling a domain turns on each of its callbacks, and disabling it turns each off, as in
 * CUPTI; the domain flag and the per-cbid bits are kept in step. */
FAKE_EXPORT CUptiResult CUPTIAPI cuptiEnableDomain(uint32_t enable,
                                                   CUpti_SubscriberHandle subscriber,
                                                   CUpti_CallbackDomain domain) {
  AFTER_FINALIZE();
  pthread_mutex_lock(&ctl.lock);
  CUptiResult r = check_sub(subscriber, domain);
  if (r == CUPTI_SUCCESS) {
    ctl.domain_on[domain] = enable ? 1 : 0;
    memset(ctl.cbid_on[domain], enable ? 0xff : 0, sizeof ctl.cbid_on[domain]);
  }
  pthread_mutex_unlock(&ctl.lock);
  return r;
}

int fake_fire_callback(int domain, uint32_t cbid, const void *cbdata) {
  if (domain <= (int)CUPTI_CB_DOMAIN_INVALID || domain >= (int)CUPTI_CB_DOMAIN_SIZE ||
      cbid >= FAKE_CBID_BITS)
    return 0;
  pthread_mutex_lock(&ctl.lock);
  int on = ctl.subscribed && ctl.callback && (ctl.cbid_on[domain][cbid / 8] >> (cbid % 8)) & 1;
  CUpti_CallbackFunc f = ctl.callback;
  void *ud = ctl.userdata;
  pthread_mutex_unlock(&ctl.lock);
  if (!on) return 0;
  t_in_callback++;
  int outer = t_callback_domain;
  t_callback_domain = domain;
  f(ud, (CUpti_CallbackDomain)domain, (CUpti_CallbackId)cbid, cbdata);
  t_callback_domain = outer;
  t_in_callback--;
  return 1;
}

/* ---- CUPTI: activity API ----------------------------------------------------------------- */

FAKE_EXPORT CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(
    CUpti_BuffersCallbackRequestFunc funcBufferRequested,
    CUpti_BuffersCallbackCompleteFunc funcBufferCompleted) {
  AFTER_FINALIZE();
  if (!funcBufferRequested || !funcBufferCompleted) return CUPTI_ERROR_INVALID_PARAMETER;
  atomic_store(&cb_request, funcBufferRequested);
  atomic_store(&cb_complete, funcBufferCompleted);
  pthread_once(&q.started, completer_start);
  return CUPTI_SUCCESS;
}

static int valid_kind(CUpti_ActivityKind kind) {
  return (int)kind > (int)CUPTI_ACTIVITY_KIND_INVALID && (int)kind < FAKE_NKINDS;
}

/* fake_set_enable_delay_us: each cuptiActivityEnable takes this long before the kind is on. */
static atomic_int enable_delay_us;
void fake_set_enable_delay_us(int us) { atomic_store(&enable_delay_us, us); }

/* Any kind of CUPTI 13.0 may be enabled; kinds the fake has no layout for are simply never
 * produced (unless a test emits one on purpose, to see the engine meet an unknown kind). */
FAKE_EXPORT CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind) {
  AFTER_FINALIZE();
  if (!valid_kind(kind)) return CUPTI_ERROR_INVALID_KIND;
  int delay = atomic_load(&enable_delay_us);
  if (delay > 0) usleep((useconds_t)delay);
  atomic_store(&kind_on[kind], 1);
  BUMP(st.enable_calls[kind]);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind) {
  AFTER_FINALIZE();
  if (!valid_kind(kind)) return CUPTI_ERROR_INVALID_KIND;
  atomic_store(&kind_on[kind], 0);
  BUMP(st.disable_calls[kind]);
  /* Waits for the emitters that may have seen the kind enabled (see fake_emit). A producer calls
   * disable only through the engine, never from inside fake_emit, so this cannot wait on itself. */
  unsigned old = atomic_fetch_add(&emit_phase, 1) & 1;
  while (atomic_load(&emit_inflight[old]) != 0) sched_yield();
  return CUPTI_SUCCESS;
}

/* Walks records by the size of each one's kind; takes no lock (the caller owns the buffer). */
FAKE_EXPORT CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t *buffer,
                                                            size_t validBufferSizeBytes,
                                                            CUpti_Activity **record) {
  if (!buffer || !record) return CUPTI_ERROR_INVALID_PARAMETER;
  size_t off = 0;
  uint32_t kind;
  if (*record) {
    uint8_t *cur = (uint8_t *)*record;
    if (cur < buffer || cur >= buffer + validBufferSizeBytes) return CUPTI_ERROR_INVALID_PARAMETER;
    memcpy(&kind, cur, sizeof kind);
    size_t sz = kind_size(kind);
    if (!sz) return CUPTI_ERROR_INVALID_KIND;
    off = (size_t)(cur - buffer) + sz;
  }
  if (validBufferSizeBytes < sizeof kind || off > validBufferSizeBytes - sizeof kind)
    return CUPTI_ERROR_MAX_LIMIT_REACHED;
  memcpy(&kind, buffer + off, sizeof kind);
  size_t sz = kind_size(kind);
  if (!sz) return CUPTI_ERROR_INVALID_KIND;
  if (sz > validBufferSizeBytes - off) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = (CUpti_Activity *)(void *)(buffer + off);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t flag) {
  AFTER_FINALIZE();
  int forced = (flag & CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) != 0;
  int block = atomic_load(&knob_flush_block_ms);
  if (block > 0 && (forced || !atomic_load(&knob_flush_block_forced_only)))
    usleep((useconds_t)block * 1000);
  BUMP(st.flushes);
  if (forced) BUMP(st.forced_flushes);
  uint64_t until = atomic_load(&knob_backlog_until_ns);
  if (until && fake_mono_ns() < until) return CUPTI_SUCCESS; /* nothing completed yet */
  int backlog = atomic_load(&knob_kernel_backlog);
  if (backlog > 0) release_kernels(backlog);
  flush_threads(forced);
  if (forced) release_held(1);
  wait_delivered();
  return CUPTI_SUCCESS;
}

/* Returns the drops counted since the previous call, and resets that count. */
FAKE_EXPORT CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext context,
                                                                   uint32_t streamId,
                                                                   size_t *dropped) {
  (void)context; /* drops are counted process-wide, not per context or stream */
  (void)streamId;
  if (!dropped) return CUPTI_ERROR_INVALID_PARAMETER;
  *dropped = (size_t)atomic_exchange(&drops_unreported, 0);
  return CUPTI_SUCCESS;
}

/* Only the per-thread buffer attribute is known; it is recorded for fake_per_thread_attr, and
 * the fake's buffers stay per thread either way. */
FAKE_EXPORT CUptiResult CUPTIAPI cuptiActivitySetAttribute(CUpti_ActivityAttribute attr,
                                                           size_t *valueSize, void *value) {
  AFTER_FINALIZE();
  if (!valueSize || !value) return CUPTI_ERROR_INVALID_PARAMETER;
  if (attr != CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER) return CUPTI_ERROR_NOT_SUPPORTED;
  if (*valueSize < sizeof(uint8_t)) return CUPTI_ERROR_PARAMETER_SIZE_NOT_SUFFICIENT;
  atomic_store(&per_thread_attr, *(const uint8_t *)value);
  return CUPTI_SUCCESS;
}

int fake_per_thread_attr(void) { return atomic_load(&per_thread_attr); }

FAKE_EXPORT CUptiResult CUPTIAPI cuptiActivityEnableLatencyTimestamps(uint8_t enable) {
  AFTER_FINALIZE();
  atomic_store(&st.latency_timestamps, enable ? 1 : 0);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI cuptiActivityEnableCudaEventDeviceTimestamps(uint8_t enable) {
  AFTER_FINALIZE();
  atomic_store(&st.cuda_event_device_timestamps, enable ? 1 : 0);
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI
cuptiActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc funcTimestamp) {
  AFTER_FINALIZE();
  if (!funcTimestamp) return CUPTI_ERROR_INVALID_PARAMETER;
  atomic_store(&cb_timestamp, funcTimestamp);
  atomic_fetch_add(&st.timestamp_callback_registrations, 1);
  return CUPTI_SUCCESS;
}

/* The stacks are per thread and per external kind, owned by the calling thread alone. */
FAKE_EXPORT CUptiResult CUPTIAPI
cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t id) {
  AFTER_FINALIZE();
  if ((int)kind <= (int)CUPTI_EXTERNAL_CORRELATION_KIND_INVALID || (int)kind >= FAKE_NEXT_KINDS)
    return CUPTI_ERROR_INVALID_PARAMETER;
  if (atomic_load(&knob_reject_push)) return CUPTI_ERROR_INVALID_OPERATION;
  fthread *ft = self_thread();
  if (!ft) return CUPTI_ERROR_OUT_OF_MEMORY;
  if (ft->ncorr[kind] == ft->capcorr[kind]) {
    size_t cap = ft->capcorr[kind] ? ft->capcorr[kind] * 2 : 16;
    uint64_t *p = realloc(ft->corr[kind], cap * sizeof *p);
    if (!p) return CUPTI_ERROR_OUT_OF_MEMORY;
    ft->corr[kind] = p;
    ft->capcorr[kind] = cap;
  }
  ft->corr[kind][ft->ncorr[kind]++] = id;
  return CUPTI_SUCCESS;
}

FAKE_EXPORT CUptiResult CUPTIAPI
cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t *lastId) {
  AFTER_FINALIZE();
  if ((int)kind <= (int)CUPTI_EXTERNAL_CORRELATION_KIND_INVALID || (int)kind >= FAKE_NEXT_KINDS)
    return CUPTI_ERROR_INVALID_PARAMETER;
  fthread *ft = self_thread();
  if (!ft) return CUPTI_ERROR_OUT_OF_MEMORY;
  if (!ft->ncorr[kind]) return CUPTI_ERROR_QUEUE_EMPTY;
  uint64_t id = ft->corr[kind][--ft->ncorr[kind]];
  if (lastId) *lastId = id;
  return CUPTI_SUCCESS;
}

/* ---- libcuda ----------------------------------------------------------------------------- */

FAKE_EXPORT int cuCtxGetCurrent(void **ctx) {
  if (!ctx) return FAKE_CUDA_ERROR_INVALID_VALUE;
  fthread *ft = self_thread();
  if (ft && ft->nctx) *ctx = ft->ctx_stack[ft->nctx - 1];
  else *ctx = atomic_load(&knob_no_context) ? NULL : (void *)&primary_ctx_token;
  return FAKE_CUDA_SUCCESS;
}

static int sync_block_ms(void) {
  int v = atomic_load(&knob_sync_block_ms);
  if (v >= 0) return v;
  const char *s = getenv("FAKE_CUDA_SYNC_BLOCK_MS");
  v = s && *s ? atoi(s) : 0;
  if (v < 0) v = 0;
  int expected = -1;
  atomic_compare_exchange_strong(&knob_sync_block_ms, &expected, v);
  return atomic_load(&knob_sync_block_ms);
}

/* Completes every pending record, then (SYNCHRONIZATION enabled, not suppressed) writes a
 * CONTEXT_SYNCHRONIZE record whose times are taken after the records before it. With a block
 * configured it first sleeps that long, holding no lock, as a sync behind a long kernel does. A
 * sync made while a simulated capture is in progress is counted, and unless the calling thread is
 * in relaxed capture mode it invalidates the capture, as the driver does in global mode. */
FAKE_EXPORT int cuCtxSynchronize(void) {
  void *ctx = NULL;
  cuCtxGetCurrent(&ctx);
  if (!ctx) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (atomic_load(&cap_active) > 0) {
    BUMP(st.syncs_during_capture);
    if (t_capture_mode != 2) {
      atomic_store(&cap_invalidated, 1);
      return 901; /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */
    }
  }
  int block = sync_block_ms();
  if (block > 0) {
    struct timespec ts = {.tv_sec = block / 1000, .tv_nsec = (long)(block % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
  }
  atomic_fetch_add(&sync_epoch, 1);
  release_held(0);
  BUMP(st.syncs);
  if (atomic_load(&knob_suppress_sync)) return FAKE_CUDA_SUCCESS;
  if (!atomic_load(&kind_on[CUPTI_ACTIVITY_KIND_SYNCHRONIZATION])) return FAKE_CUDA_SUCCESS;
  CUpti_ActivitySynchronization2 r;
  memset(&r, 0, sizeof r);
  r.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
  r.type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE;
  r.start = fake_now();
  r.end = r.start;
  r.contextId = 1;
  r.streamId = 0;
  r.cudaEventId = 0;
  r.correlationId = 0;
  fake_emit(&r, sizeof r, 0);
  return FAKE_CUDA_SUCCESS;
}

/* Fires the driver API callback of cuDriverGetVersion at its enter and exit, as the real driver
 * does under CUPTI (the engine's detach runs cuptiFinalize at that exit). */
FAKE_EXPORT CUresult CUDAAPI cuDriverGetVersion(int *version) {
  CUpti_CallbackData cd;
  memset(&cd, 0, sizeof cd);
  cd.functionName = "cuDriverGetVersion";
  cd.callbackSite = CUPTI_API_ENTER;
  fake_fire_callback(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuDriverGetVersion, &cd);
  if (version) *version = 13000;
  cd.callbackSite = CUPTI_API_EXIT;
  fake_fire_callback(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuDriverGetVersion, &cd);
  return (CUresult)(version ? FAKE_CUDA_SUCCESS : FAKE_CUDA_ERROR_INVALID_VALUE);
}

FAKE_EXPORT int cuThreadExchangeStreamCaptureMode(int *mode) {
  if (!mode || *mode < 0 || *mode > 2) return FAKE_CUDA_ERROR_INVALID_VALUE;
  int old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  BUMP(st.capture_mode_exchanges);
  return FAKE_CUDA_SUCCESS;
}

FAKE_EXPORT int cuDeviceGetCount(int *count) {
  if (!count) return FAKE_CUDA_ERROR_INVALID_VALUE;
  *count = atomic_load(&knob_no_context) ? 0 : 1;
  return FAKE_CUDA_SUCCESS;
}

static int valid_device(int dev) { return dev == 0 && !atomic_load(&knob_no_context); }

FAKE_EXPORT int cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active) {
  if (!flags || !active) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return FAKE_CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = !atomic_load(&knob_primary_inactive);
  return FAKE_CUDA_SUCCESS;
}

FAKE_EXPORT int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  if (!ctx) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return FAKE_CUDA_ERROR_INVALID_DEVICE;
  *ctx = &primary_ctx_token;
  return FAKE_CUDA_SUCCESS;
}

FAKE_EXPORT int cuDevicePrimaryCtxRelease(int dev) {
  return valid_device(dev) ? FAKE_CUDA_SUCCESS : FAKE_CUDA_ERROR_INVALID_DEVICE;
}

/* Pushed contexts form a small per-thread stack above the implicit primary context. */
FAKE_EXPORT int cuCtxPushCurrent(void *ctx) {
  if (!ctx) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  fthread *ft = self_thread();
  if (!ft || ft->nctx == FAKE_CTX_STACK) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  ft->ctx_stack[ft->nctx++] = ctx;
  return FAKE_CUDA_SUCCESS;
}

FAKE_EXPORT int cuCtxPopCurrent(void **ctx) {
  fthread *ft = self_thread();
  if (!ft || !ft->nctx) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  void *c = ft->ctx_stack[--ft->nctx];
  if (ctx) *ctx = c;
  return FAKE_CUDA_SUCCESS;
}

/* cuda.h's _v2 spellings, for a binding that resolves those names. */
FAKE_EXPORT CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  return (CUresult)cuCtxPushCurrent(ctx);
}
FAKE_EXPORT CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx) {
  void *c = NULL;
  int r = cuCtxPopCurrent(&c);
  if (pctx && r == 0) *pctx = (CUcontext)c;
  return (CUresult)r;
}
FAKE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return (CUresult)cuDevicePrimaryCtxRelease(dev);
}

/* ---- the record generator ---------------------------------------------------------------- */

/* Names the generator points string fields at: stable addresses for the process's lifetime, one
 * of them a long mangled C++ name so interning is exercised on realistic input. */
static const char *const gen_names[8] = {
    "vectorAdd",
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEv"
    "iT0_T1_",
    "sgemm_128x128_nn",
    "_Z9reduceSumPKfPfi",
    "nccl:allreduce",
    "forward",
    "cudaMalloc",
    "backward",
};

/* splitmix64's finalizer: a cheap bijective mix, so distinct inputs give distinct-looking
 * values. */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A field-value stream: the n-th value of record (kind, thread, seq). */
typedef struct gen {
  uint64_t seed;
  uint64_t n;
} gen;

static uint64_t nx(gen *g) { return mix64(g->seed + ++g->n * 0x100000001b3ull); }
static uint32_t nu(gen *g, uint32_t mod) { return (uint32_t)(nx(g) % mod); }
static uint32_t n32(gen *g) { return (uint32_t)nx(g); }
static const char *nname(gen *g) { return gen_names[nx(g) % 8]; }
/* A kernel's name: the first four are kernels' names, the others are NVTX ranges', an API
 * call's and a collective's, which a kernel never carries (a "top kernels" table of the fake
 * lists kernels only). Draws from the stream as nname does. */
static const char *kname(gen *g) { return gen_names[nx(g) % 4]; }

int fake_stretch_kernel(void *record, const char *name, uint64_t factor) {
  CUpti_ActivityKernel10 *k = record;
  if ((k->kind != CUPTI_ACTIVITY_KIND_KERNEL && k->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) ||
      !k->name || strcmp(k->name, name) != 0)
    return 0;
  k->end = k->start + (k->end - k->start) * factor;
  k->completed = k->end;
  return 1;
}

size_t fake_gen_record(int kind, uint32_t thread, uint64_t seq, void *out) {
  if (!out) return 0;
  gen g = {mix64(mix64(mix64((uint64_t)(uint32_t)kind) ^ thread) ^ seq), 0};
  /* FAKE_CUPTI_NOW_STAMPS=1 stamps records with the time they are made (less 1 us), so that the
   * pipeline's lag is measurable (spec/window_spec.lua); by default the values depend only on
   * (kind, thread, seq), so tests can regenerate them. */
  static atomic_int now_stamps = -1; /* producers race to read the variable once */
  int ns = atomic_load(&now_stamps);
  if (ns < 0) {
    const char *e = getenv("FAKE_CUPTI_NOW_STAMPS");
    ns = e && *e == '1';
    atomic_store(&now_stamps, ns);
  }
  const uint64_t start = ns ? fake_now() - 1000u
                                    : 1700000000000000000ull + seq * 1000u + (uint64_t)thread * 7u;
  const uint64_t end = start + 100u + seq % 50u;
  const uint32_t corr = (uint32_t)(thread * 1000003u + seq + 1u);
  union {
    CUpti_ActivityKernel10 k;
    CUpti_ActivityMemcpy6 mc;
    CUpti_ActivityMemcpyPtoP4 p2p;
    CUpti_ActivityMemset4 ms;
    CUpti_ActivityAPI api;
    CUpti_ActivitySynchronization2 sy;
    CUpti_ActivityCudaEvent2 ev;
    CUpti_ActivityExternalCorrelation ec;
    CUpti_ActivityMarker2 mk;
    CUpti_ActivityMarkerData2 md;
    CUpti_ActivityOverhead3 ov;
    CUpti_ActivityGraphTrace2 gt;
    CUpti_ActivityMemory4 mem;
    CUpti_ActivityMemoryPool3 mp;
    CUpti_ActivityDevice5 dev;
    CUpti_ActivityContext3 ctx;
    CUpti_ActivityName nm;
    CUpti_ActivityStream str;
    CUpti_ActivityEnvironment env;
  } r;
  memset(&r, 0, sizeof r);
  switch (kind) {
  case CUPTI_ACTIVITY_KIND_KERNEL:
  case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    r.k.kind = (CUpti_ActivityKind)kind;
    r.k.cacheConfig.both = (uint8_t)nx(&g);
    r.k.sharedMemoryConfig = (uint8_t)nu(&g, 3);
    r.k.registersPerThread = (uint16_t)(16 + nu(&g, 240));
    r.k.partitionedGlobalCacheRequested = (CUpti_ActivityPartitionedGlobalCacheConfig)nu(&g, 4);
    r.k.partitionedGlobalCacheExecuted = (CUpti_ActivityPartitionedGlobalCacheConfig)nu(&g, 4);
    r.k.start = start;
    r.k.end = end;
    r.k.completed = end;
    r.k.deviceId = nu(&g, 4);
    r.k.contextId = 1 + nu(&g, 4);
    r.k.streamId = nu(&g, 16);
    r.k.gridX = (int32_t)(1 + nu(&g, 4096));
    r.k.gridY = (int32_t)(1 + nu(&g, 64));
    r.k.gridZ = (int32_t)(1 + nu(&g, 4));
    r.k.blockX = (int32_t)(32 * (1 + nu(&g, 32)));
    r.k.blockY = (int32_t)(1 + nu(&g, 4));
    r.k.blockZ = (int32_t)(1 + nu(&g, 2));
    r.k.staticSharedMemory = (int32_t)nu(&g, 49152);
    r.k.dynamicSharedMemory = (int32_t)nu(&g, 49152);
    r.k.localMemoryPerThread = nu(&g, 1024);
    r.k.localMemoryTotal = n32(&g);
    r.k.correlationId = corr;
    r.k.gridId = (int64_t)(nx(&g) >> 1);
    r.k.name = kname(&g);
    r.k.queued = start - 1000u - nu(&g, 1000);
    r.k.submitted = start - nu(&g, 1000);
    r.k.launchType = (uint8_t)nu(&g, 4);
    r.k.isSharedMemoryCarveoutRequested = (uint8_t)nu(&g, 2);
    r.k.sharedMemoryCarveoutRequested = (uint8_t)nu(&g, 101);
    r.k.sharedMemoryExecuted = nu(&g, 1u << 18);
    r.k.graphNodeId = nx(&g);
    r.k.shmemLimitConfig = (CUpti_FuncShmemLimitConfig)nu(&g, 2);
    r.k.graphId = n32(&g);
    r.k.channelID = nu(&g, 64);
    r.k.channelType = (CUpti_ChannelType)nu(&g, 3);
    r.k.clusterX = 1 + nu(&g, 4);
    r.k.clusterY = 1 + nu(&g, 2);
    r.k.clusterZ = 1;
    r.k.clusterSchedulingPolicy = nu(&g, 3);
    r.k.localMemoryTotal_v2 = nx(&g);
    r.k.maxPotentialClusterSize = nu(&g, 32);
    r.k.maxActiveClusters = nu(&g, 256);
    r.k.isDeviceLaunched = (uint8_t)nu(&g, 2);
    return memcpy(out, &r.k, sizeof r.k), sizeof r.k;
  case CUPTI_ACTIVITY_KIND_MEMCPY:
    r.mc.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
    r.mc.copyKind = (uint8_t)(1 + nu(&g, 9));
    r.mc.srcKind = (uint8_t)nu(&g, 8);
    r.mc.dstKind = (uint8_t)nu(&g, 8);
    r.mc.flags = (uint8_t)nu(&g, 2);
    r.mc.bytes = 1 + nx(&g) % (1ull << 30);
    r.mc.start = start;
    r.mc.end = end;
    r.mc.deviceId = nu(&g, 4);
    r.mc.contextId = 1 + nu(&g, 4);
    r.mc.streamId = nu(&g, 16);
    r.mc.correlationId = corr;
    r.mc.runtimeCorrelationId = corr;
    r.mc.graphNodeId = nx(&g);
    r.mc.graphId = n32(&g);
    r.mc.channelID = nu(&g, 64);
    r.mc.channelType = (CUpti_ChannelType)nu(&g, 3);
    r.mc.isDeviceLaunched = (uint8_t)nu(&g, 2);
    r.mc.copyCount = 1 + nu(&g, 8);
    return memcpy(out, &r.mc, sizeof r.mc), sizeof r.mc;
  case CUPTI_ACTIVITY_KIND_MEMCPY2:
    r.p2p.kind = CUPTI_ACTIVITY_KIND_MEMCPY2;
    r.p2p.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_PTOP;
    r.p2p.srcKind = (uint8_t)nu(&g, 8);
    r.p2p.dstKind = (uint8_t)nu(&g, 8);
    r.p2p.flags = (uint8_t)nu(&g, 2);
    r.p2p.bytes = 1 + nx(&g) % (1ull << 30);
    r.p2p.start = start;
    r.p2p.end = end;
    r.p2p.deviceId = nu(&g, 4);
    r.p2p.contextId = 1 + nu(&g, 4);
    r.p2p.streamId = nu(&g, 16);
    r.p2p.srcDeviceId = nu(&g, 4);
    r.p2p.srcContextId = 1 + nu(&g, 4);
    r.p2p.dstDeviceId = nu(&g, 4);
    r.p2p.dstContextId = 1 + nu(&g, 4);
    r.p2p.correlationId = corr;
    r.p2p.graphNodeId = nx(&g);
    r.p2p.graphId = n32(&g);
    r.p2p.channelID = nu(&g, 64);
    r.p2p.channelType = (CUpti_ChannelType)nu(&g, 3);
    return memcpy(out, &r.p2p, sizeof r.p2p), sizeof r.p2p;
  case CUPTI_ACTIVITY_KIND_MEMSET:
    r.ms.kind = CUPTI_ACTIVITY_KIND_MEMSET;
    r.ms.value = nu(&g, 256);
    r.ms.bytes = 1 + nx(&g) % (1ull << 30);
    r.ms.start = start;
    r.ms.end = end;
    r.ms.deviceId = nu(&g, 4);
    r.ms.contextId = 1 + nu(&g, 4);
    r.ms.streamId = nu(&g, 16);
    r.ms.correlationId = corr;
    r.ms.flags = (uint16_t)nu(&g, 2);
    r.ms.memoryKind = (uint16_t)nu(&g, 8);
    r.ms.graphNodeId = nx(&g);
    r.ms.graphId = n32(&g);
    r.ms.channelID = nu(&g, 64);
    r.ms.channelType = (CUpti_ChannelType)nu(&g, 3);
    r.ms.isDeviceLaunched = (uint8_t)nu(&g, 2);
    return memcpy(out, &r.ms, sizeof r.ms), sizeof r.ms;
  case CUPTI_ACTIVITY_KIND_RUNTIME:
  case CUPTI_ACTIVITY_KIND_DRIVER:
    r.api.kind = (CUpti_ActivityKind)kind;
    r.api.cbid = 1 + nu(&g, kind == CUPTI_ACTIVITY_KIND_RUNTIME ? 500 : 800);
    r.api.start = start;
    r.api.end = end;
    r.api.processId = 1000 + nu(&g, 4);
    r.api.threadId = 100000 + thread;
    r.api.correlationId = corr;
    r.api.returnValue = nu(&g, 4) == 0 ? 1 + nu(&g, 100) : 0;
    return memcpy(out, &r.api, sizeof r.api), sizeof r.api;
  case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
    /* Small times, far below any CLOCK_REALTIME mark, so a generated sync never satisfies a
     * fence by accident. */
    const uint64_t s = 1000000000000ull + seq * 1000u + (uint64_t)thread * 7u;
    r.sy.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    r.sy.type = (CUpti_ActivitySynchronizationType)(1 + nu(&g, 4));
    r.sy.start = s;
    r.sy.end = s + 100u + seq % 50u;
    r.sy.correlationId = corr;
    r.sy.contextId = 1 + nu(&g, 4);
    r.sy.streamId = nu(&g, 16);
    r.sy.cudaEventId = n32(&g);
    r.sy.cudaEventSyncId = nx(&g);
    r.sy.returnValue = nu(&g, 2);
    return memcpy(out, &r.sy, sizeof r.sy), sizeof r.sy;
  }
  case CUPTI_ACTIVITY_KIND_CUDA_EVENT:
    r.ev.kind = CUPTI_ACTIVITY_KIND_CUDA_EVENT;
    r.ev.correlationId = corr;
    r.ev.contextId = 1 + nu(&g, 4);
    r.ev.streamId = nu(&g, 16);
    r.ev.eventId = n32(&g);
    r.ev.deviceId = nu(&g, 4);
    r.ev.deviceTimestamp = start;
    r.ev.cudaEventSyncId = nx(&g);
    return memcpy(out, &r.ev, sizeof r.ev), sizeof r.ev;
  case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
    r.ec.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    r.ec.externalKind = (CUpti_ExternalCorrelationKind)(1 + nu(&g, 5));
    r.ec.externalId = nx(&g);
    r.ec.correlationId = corr;
    return memcpy(out, &r.ec, sizeof r.ec), sizeof r.ec;
  case CUPTI_ACTIVITY_KIND_MARKER: {
    /* Like NVTX ranges: start (named), end (unnamed, as CUPTI reports it), instantaneous. */
    static const CUpti_ActivityFlag fl[3] = {CUPTI_ACTIVITY_FLAG_MARKER_START,
                                             CUPTI_ACTIVITY_FLAG_MARKER_END,
                                             CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS};
    r.mk.kind = CUPTI_ACTIVITY_KIND_MARKER;
    r.mk.flags = fl[seq % 3];
    r.mk.timestamp = start;
    r.mk.id = (uint32_t)(thread * 1000003u + seq / 3);
    r.mk.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
    r.mk.objectId.pt.processId = 1000 + nu(&g, 4);
    r.mk.objectId.pt.threadId = 100000 + thread;
    r.mk.name = seq % 3 == 1 ? NULL : nname(&g);
    r.mk.domain = gen_names[4 + nu(&g, 2)];
    return memcpy(out, &r.mk, sizeof r.mk), sizeof r.mk;
  }
  case CUPTI_ACTIVITY_KIND_MARKER_DATA:
    r.md.kind = CUPTI_ACTIVITY_KIND_MARKER_DATA;
    r.md.flags = CUPTI_ACTIVITY_FLAG_MARKER_COLOR_ARGB;
    r.md.id = (uint32_t)(thread * 1000003u + seq / 3);
    r.md.payloadKind = CUPTI_METRIC_VALUE_KIND_UINT64;
    r.md.payload.metricValueUint64 = nx(&g);
    r.md.color = n32(&g);
    r.md.category = nu(&g, 16);
    r.md.cuptiDomainId = nu(&g, 8);
    return memcpy(out, &r.md, sizeof r.md), sizeof r.md;
  case CUPTI_ACTIVITY_KIND_OVERHEAD:
    r.ov.kind = CUPTI_ACTIVITY_KIND_OVERHEAD;
    r.ov.overheadKind = (CUpti_ActivityOverheadKind)((1 + nu(&g, 8)) << 16);
    r.ov.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
    r.ov.objectId.pt.processId = 1000 + nu(&g, 4);
    r.ov.objectId.pt.threadId = 100000 + thread;
    r.ov.start = start;
    r.ov.end = end;
    r.ov.correlationId = corr;
    return memcpy(out, &r.ov, sizeof r.ov), sizeof r.ov;
  case CUPTI_ACTIVITY_KIND_GRAPH_TRACE:
    r.gt.kind = CUPTI_ACTIVITY_KIND_GRAPH_TRACE;
    r.gt.correlationId = corr;
    r.gt.start = start;
    r.gt.end = end;
    r.gt.deviceId = nu(&g, 4);
    r.gt.graphId = n32(&g);
    r.gt.contextId = 1 + nu(&g, 4);
    r.gt.streamId = nu(&g, 16);
    r.gt.endDeviceId = nu(&g, 4);
    r.gt.endContextId = 1 + nu(&g, 4);
    return memcpy(out, &r.gt, sizeof r.gt), sizeof r.gt;
  case CUPTI_ACTIVITY_KIND_MEMORY2:
    r.mem.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
    r.mem.memoryOperationType = (CUpti_ActivityMemoryOperationType)(1 + nu(&g, 2));
    r.mem.memoryKind = (CUpti_ActivityMemoryKind)nu(&g, 8);
    r.mem.correlationId = corr;
    r.mem.address = nx(&g) & ~0xffull;
    r.mem.bytes = 1 + nx(&g) % (1ull << 32);
    r.mem.timestamp = start;
    r.mem.PC = nx(&g);
    r.mem.processId = 1000 + nu(&g, 4);
    r.mem.deviceId = nu(&g, 4);
    r.mem.contextId = 1 + nu(&g, 4);
    r.mem.streamId = nu(&g, 16);
    r.mem.name = nname(&g);
    r.mem.isAsync = nu(&g, 2);
    r.mem.memoryPoolConfig.memoryPoolType = (CUpti_ActivityMemoryPoolType)nu(&g, 3);
    r.mem.memoryPoolConfig.address = nx(&g) & ~0xffull;
    r.mem.memoryPoolConfig.releaseThreshold = nx(&g);
    r.mem.memoryPoolConfig.pool.size = nx(&g);
    r.mem.memoryPoolConfig.utilizedSize = nx(&g);
    r.mem.source = nname(&g);
    return memcpy(out, &r.mem, sizeof r.mem), sizeof r.mem;
  case CUPTI_ACTIVITY_KIND_MEMORY_POOL:
    r.mp.kind = CUPTI_ACTIVITY_KIND_MEMORY_POOL;
    r.mp.memoryPoolOperationType = (CUpti_ActivityMemoryPoolOperationType)(1 + nu(&g, 3));
    r.mp.memoryPoolType = (CUpti_ActivityMemoryPoolType)(1 + nu(&g, 2));
    r.mp.correlationId = corr;
    r.mp.processId = 1000 + nu(&g, 4);
    r.mp.deviceId = nu(&g, 4);
    r.mp.minBytesToKeep = (size_t)nx(&g);
    r.mp.address = nx(&g) & ~0xffull;
    r.mp.size = nx(&g);
    r.mp.releaseThreshold = nx(&g);
    r.mp.timestamp = start;
    r.mp.utilizedSize = nx(&g);
    r.mp.isManagedPool = (uint8_t)nu(&g, 2);
    return memcpy(out, &r.mp, sizeof r.mp), sizeof r.mp;
  case CUPTI_ACTIVITY_KIND_DEVICE:
    r.dev.kind = CUPTI_ACTIVITY_KIND_DEVICE;
    r.dev.flags = (CUpti_ActivityFlag)nu(&g, 2);
    r.dev.globalMemoryBandwidth = nx(&g);
    r.dev.globalMemorySize = nx(&g);
    r.dev.constantMemorySize = n32(&g);
    r.dev.l2CacheSize = n32(&g);
    r.dev.numThreadsPerWarp = 32;
    r.dev.coreClockRate = n32(&g);
    r.dev.numMemcpyEngines = 1 + nu(&g, 8);
    r.dev.numMultiprocessors = 1 + nu(&g, 160);
    r.dev.maxIPC = n32(&g);
    r.dev.maxWarpsPerMultiprocessor = n32(&g);
    r.dev.maxBlocksPerMultiprocessor = n32(&g);
    r.dev.maxSharedMemoryPerMultiprocessor = n32(&g);
    r.dev.maxRegistersPerMultiprocessor = n32(&g);
    r.dev.maxRegistersPerBlock = n32(&g);
    r.dev.maxSharedMemoryPerBlock = n32(&g);
    r.dev.maxThreadsPerBlock = n32(&g);
    r.dev.maxBlockDimX = n32(&g);
    r.dev.maxBlockDimY = n32(&g);
    r.dev.maxBlockDimZ = n32(&g);
    r.dev.maxGridDimX = n32(&g);
    r.dev.maxGridDimY = n32(&g);
    r.dev.maxGridDimZ = n32(&g);
    r.dev.computeCapabilityMajor = 7 + nu(&g, 4);
    r.dev.computeCapabilityMinor = nu(&g, 10);
    r.dev.id = nu(&g, 4);
    r.dev.eccEnabled = nu(&g, 2);
    for (size_t i = 0; i < sizeof r.dev.uuid.bytes; i++) r.dev.uuid.bytes[i] = (char)nx(&g);
    r.dev.name = nname(&g);
    r.dev.isCudaVisible = (uint8_t)nu(&g, 2);
    r.dev.isMigEnabled = (uint8_t)nu(&g, 2);
    r.dev.gpuInstanceId = n32(&g);
    r.dev.computeInstanceId = n32(&g);
    for (size_t i = 0; i < sizeof r.dev.migUuid.bytes; i++) r.dev.migUuid.bytes[i] = (char)nx(&g);
    r.dev.isNumaNode = nu(&g, 2);
    r.dev.numaId = nu(&g, 4);
    return memcpy(out, &r.dev, sizeof r.dev), sizeof r.dev;
  case CUPTI_ACTIVITY_KIND_CONTEXT:
    r.ctx.kind = CUPTI_ACTIVITY_KIND_CONTEXT;
    r.ctx.contextId = 1 + nu(&g, 4);
    r.ctx.deviceId = nu(&g, 4);
    r.ctx.computeApiKind = (uint16_t)nu(&g, 3);
    r.ctx.nullStreamId = (uint16_t)nu(&g, 16);
    r.ctx.parentContextId = nu(&g, 4);
    r.ctx.isGreenContext = (uint8_t)nu(&g, 2);
    r.ctx.numMultiprocessors = (uint16_t)(1 + nu(&g, 160));
    r.ctx.cigMode = (CUpti_ContextCigMode)nu(&g, 3);
    return memcpy(out, &r.ctx, sizeof r.ctx), sizeof r.ctx;
  case CUPTI_ACTIVITY_KIND_NAME:
    r.nm.kind = CUPTI_ACTIVITY_KIND_NAME;
    r.nm.objectKind = CUPTI_ACTIVITY_OBJECT_STREAM;
    r.nm.objectId.dcs.deviceId = nu(&g, 4);
    r.nm.objectId.dcs.contextId = 1 + nu(&g, 4);
    r.nm.objectId.dcs.streamId = nu(&g, 16);
    r.nm.name = nname(&g);
    return memcpy(out, &r.nm, sizeof r.nm), sizeof r.nm;
  case CUPTI_ACTIVITY_KIND_STREAM:
    r.str.kind = CUPTI_ACTIVITY_KIND_STREAM;
    r.str.contextId = 1 + nu(&g, 4);
    r.str.streamId = nu(&g, 16);
    r.str.priority = nu(&g, 6);
    r.str.flag = (CUpti_ActivityStreamFlag)(1 + nu(&g, 3));
    r.str.correlationId = corr;
    return memcpy(out, &r.str, sizeof r.str), sizeof r.str;
  case CUPTI_ACTIVITY_KIND_ENVIRONMENT:
    r.env.kind = CUPTI_ACTIVITY_KIND_ENVIRONMENT;
    r.env.deviceId = nu(&g, 4);
    r.env.timestamp = start;
    r.env.environmentKind = (CUpti_ActivityEnvironmentKind)(1 + seq % 4);
    switch (r.env.environmentKind) {
    case CUPTI_ACTIVITY_ENVIRONMENT_SPEED:
      r.env.data.speed.smClock = n32(&g);
      r.env.data.speed.memoryClock = n32(&g);
      r.env.data.speed.pcieLinkGen = 1 + nu(&g, 5);
      r.env.data.speed.pcieLinkWidth = 1 + nu(&g, 16);
      r.env.data.speed.clocksThrottleReasons = (CUpti_EnvironmentClocksThrottleReason)nu(&g, 16);
      break;
    case CUPTI_ACTIVITY_ENVIRONMENT_TEMPERATURE:
      r.env.data.temperature.gpuTemperature = 30 + nu(&g, 60);
      break;
    case CUPTI_ACTIVITY_ENVIRONMENT_POWER:
      r.env.data.power.power = n32(&g);
      r.env.data.power.powerLimit = n32(&g);
      break;
    default:
      r.env.data.cooling.fanSpeed = nu(&g, 101);
      break;
    }
    return memcpy(out, &r.env, sizeof r.env), sizeof r.env;
  default:
    return 0;
  }
}

int fake_gen_kinds(int *out, int max) {
  static const int all[] = {
      CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
      CUPTI_ACTIVITY_KIND_MEMCPY2,           CUPTI_ACTIVITY_KIND_MEMSET,
      CUPTI_ACTIVITY_KIND_RUNTIME,           CUPTI_ACTIVITY_KIND_DRIVER,
      CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,   CUPTI_ACTIVITY_KIND_CUDA_EVENT,
      CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_MARKER,
      CUPTI_ACTIVITY_KIND_MARKER_DATA,       CUPTI_ACTIVITY_KIND_OVERHEAD,
      CUPTI_ACTIVITY_KIND_GRAPH_TRACE,       CUPTI_ACTIVITY_KIND_MEMORY2,
      CUPTI_ACTIVITY_KIND_MEMORY_POOL,       CUPTI_ACTIVITY_KIND_DEVICE,
      CUPTI_ACTIVITY_KIND_CONTEXT,           CUPTI_ACTIVITY_KIND_NAME,
      CUPTI_ACTIVITY_KIND_STREAM,            CUPTI_ACTIVITY_KIND_ENVIRONMENT,
  };
  int n = (int)(sizeof all / sizeof all[0]);
  if (!out) return n;
  if (max < n) n = max < 0 ? 0 : max;
  memcpy(out, all, (size_t)n * sizeof *out);
  return n;
}

size_t fake_make_kernel(void *out, const char *name, uint32_t device, uint32_t stream, uint64_t start,
                        uint64_t end, uint32_t correlation) {
  CUpti_ActivityKernel10 k;
  memset(&k, 0, sizeof k);
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.start = start;
  k.end = k.completed = end;
  k.deviceId = device;
  k.contextId = 1;
  k.streamId = stream;
  k.gridX = k.gridY = k.gridZ = k.blockX = k.blockY = k.blockZ = 1;
  k.correlationId = correlation;
  k.name = name;
  k.queued = k.submitted = start;
  return memcpy(out, &k, sizeof k), sizeof k;
}

size_t fake_make_memcpy(void *out, uint8_t copy_kind, uint64_t bytes, uint32_t device,
                        uint64_t start, uint64_t end, uint32_t correlation) {
  CUpti_ActivityMemcpy6 m;
  memset(&m, 0, sizeof m);
  m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  m.copyKind = copy_kind;
  m.bytes = bytes;
  m.start = start;
  m.end = end;
  m.deviceId = device;
  m.contextId = 1;
  m.streamId = 7;
  m.correlationId = m.runtimeCorrelationId = correlation;
  m.copyCount = 1;
  return memcpy(out, &m, sizeof m), sizeof m;
}

size_t fake_make_marker(void *out, int start, uint64_t timestamp, uint32_t id, uint32_t tid,
                        const char *name) {
  CUpti_ActivityMarker2 m;
  memset(&m, 0, sizeof m);
  m.kind = CUPTI_ACTIVITY_KIND_MARKER;
  m.flags = start ? CUPTI_ACTIVITY_FLAG_MARKER_START : CUPTI_ACTIVITY_FLAG_MARKER_END;
  m.timestamp = timestamp;
  m.id = id;
  m.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
  m.objectId.pt.processId = (uint32_t)getpid();
  m.objectId.pt.threadId = tid;
  m.name = start ? name : NULL;
  return memcpy(out, &m, sizeof m), sizeof m;
}

/* ---- workloads --------------------------------------------------------------------------- */

/* The 256-byte generator contract covers every layout. */
_Static_assert(sizeof(CUpti_ActivityKernel10) <= 256 && sizeof(CUpti_ActivityDevice5) <= 256 &&
                   sizeof(CUpti_ActivityMemory4) <= 256,
               "fake_gen_record promises records of at most 256 bytes");

typedef struct producer {
  pthread_t tid;
  uint32_t thread;
  uint64_t limit; /* records to produce; UINT64_MAX: until stopped */
  const int *kinds;
  int nkinds;
  const atomic_int *stop;
  uint64_t written;
  int failed;
} producer;

static void *producer_main(void *arg) {
  producer *p = arg;
  uint64_t buf[32];
  for (uint64_t j = 0; j < p->limit; j++) {
    if (p->stop && atomic_load_explicit(p->stop, memory_order_relaxed)) break;
    size_t sz = fake_gen_record(p->kinds[j % (uint64_t)p->nkinds], p->thread, j, buf);
    if (!sz) {
      p->failed = 1;
      break;
    }
    int rc = fake_emit(buf, sz, 0);
    if (rc == 0) p->written++;
    else if (rc < 0) {
      p->failed = 1;
      break;
    }
  }
  return NULL;
}

/* Starts `n` producers over `ps`; returns how many started. */
static int start_all(producer *ps, int n) {
  for (int i = 0; i < n; i++)
    if (pthread_create(&ps[i].tid, NULL, producer_main, &ps[i]) != 0) return i;
  return n;
}

int64_t fake_run_workload(int nthreads, uint64_t per_thread, const int *kinds, int nkinds) {
  if (nthreads <= 0 || !kinds || nkinds <= 0) return -1;
  producer *ps = calloc((size_t)nthreads, sizeof *ps);
  if (!ps) return -1;
  for (int i = 0; i < nthreads; i++)
    ps[i] = (producer){.thread = (uint32_t)i, .limit = per_thread, .kinds = kinds,
                       .nkinds = nkinds};
  int started = start_all(ps, nthreads);
  int64_t total = 0;
  int failed = started != nthreads;
  for (int i = 0; i < started; i++) {
    pthread_join(ps[i].tid, NULL);
    total += (int64_t)ps[i].written;
    failed |= ps[i].failed;
  }
  free(ps);
  return failed ? -1 : total;
}

/* The asynchronous producers; bg.lock serializes start and stop. */
static struct {
  pthread_mutex_t lock;
  producer *ps;
  int n;
  int *kinds;
  atomic_int stop;
} bg = {.lock = PTHREAD_MUTEX_INITIALIZER};

int fake_start_producers(int nthreads, const int *kinds, int nkinds) {
  if (nthreads <= 0 || !kinds || nkinds <= 0) return -1;
  pthread_mutex_lock(&bg.lock);
  int rc = -1;
  if (!bg.ps) {
    bg.ps = calloc((size_t)nthreads, sizeof *bg.ps);
    bg.kinds = malloc((size_t)nkinds * sizeof *kinds);
    if (bg.ps && bg.kinds) {
      memcpy(bg.kinds, kinds, (size_t)nkinds * sizeof *kinds);
      atomic_store(&bg.stop, 0);
      for (int i = 0; i < nthreads; i++)
        bg.ps[i] = (producer){.thread = (uint32_t)i, .limit = UINT64_MAX, .kinds = bg.kinds,
                              .nkinds = nkinds, .stop = &bg.stop};
      bg.n = start_all(bg.ps, nthreads);
      rc = bg.n == nthreads ? 0 : -1;
    } else {
      free(bg.ps);
      free(bg.kinds);
      bg.ps = NULL;
      bg.kinds = NULL;
    }
  }
  pthread_mutex_unlock(&bg.lock);
  return rc;
}

int64_t fake_stop_producers(void) {
  pthread_mutex_lock(&bg.lock);
  int64_t total = -1;
  if (bg.ps) {
    atomic_store(&bg.stop, 1);
    total = 0;
    for (int i = 0; i < bg.n; i++) {
      pthread_join(bg.ps[i].tid, NULL);
      total += (int64_t)bg.ps[i].written;
    }
    free(bg.ps);
    free(bg.kinds);
    bg.ps = NULL;
    bg.kinds = NULL;
    bg.n = 0;
  }
  pthread_mutex_unlock(&bg.lock);
  return total;
}

/* ---- stats and knobs --------------------------------------------------------------------- */

void fake_get_stats(fake_stats *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  out->records_written = atomic_load(&st.records_written);
  out->records_dropped = atomic_load(&st.records_dropped);
  out->records_disabled = atomic_load(&st.records_disabled);
  out->buffers_requested = atomic_load(&st.buffers_requested);
  out->buffers_completed = atomic_load(&st.buffers_completed);
  out->flushes = atomic_load(&st.flushes);
  out->forced_flushes = atomic_load(&st.forced_flushes);
  out->syncs = atomic_load(&st.syncs);
  for (int k = 0; k < 64; k++) {
    out->enable_calls[k] = atomic_load(&st.enable_calls[k]);
    out->disable_calls[k] = atomic_load(&st.disable_calls[k]);
  }
  out->subscribes = atomic_load(&st.subscribes);
  out->unsubscribes = atomic_load(&st.unsubscribes);
  out->finalize_calls = atomic_load(&st.finalize_calls);
  out->finalize_in_callback = atomic_load(&st.finalize_in_callback);
  out->finalize_in_runtime = atomic_load(&st.finalize_in_runtime);
  out->finalize_lost_records = atomic_load(&st.finalize_lost_records);
  out->finalize_held_buffers = atomic_load(&st.finalize_held_buffers);
  out->calls_while_finalized = atomic_load(&st.calls_while_finalized);
  out->syncs_during_capture = atomic_load(&st.syncs_during_capture);
  out->captures_invalidated = atomic_load(&st.captures_invalidated);
  out->capture_mode_exchanges = atomic_load(&st.capture_mode_exchanges);
  out->latency_timestamps = atomic_load(&st.latency_timestamps);
  out->cuda_event_device_timestamps = atomic_load(&st.cuda_event_device_timestamps);
  out->timestamp_callback_registrations = atomic_load(&st.timestamp_callback_registrations);
}

int fake_kind_enabled(int kind) {
  return kind > 0 && kind < FAKE_NKINDS && atomic_load(&kind_on[kind]);
}

void fake_set_foreign_subscriber(const char *name) {
  pthread_mutex_lock(&ctl.lock);
  if (name) snprintf(ctl.foreign, sizeof ctl.foreign, "%s", name[0] ? name : "unnamed tool");
  else ctl.foreign[0] = '\0';
  pthread_mutex_unlock(&ctl.lock);
}

void fake_set_no_context(int on) { atomic_store(&knob_no_context, on ? 1 : 0); }
void fake_set_primary_inactive(int on) { atomic_store(&knob_primary_inactive, on ? 1 : 0); }

void fake_set_completion_delay_us(uint32_t us) { atomic_store(&knob_completion_delay_us, us); }

void fake_set_suppress_sync_records(int on) { atomic_store(&knob_suppress_sync, on ? 1 : 0); }

void fake_set_sync_block_ms(int ms) { atomic_store(&knob_sync_block_ms, ms < 0 ? 0 : ms); }

void fake_set_flush_block_ms(int ms) { atomic_store(&knob_flush_block_ms, ms < 0 ? 0 : ms); }

void fake_set_flush_block_forced_only(int on) { atomic_store(&knob_flush_block_forced_only, on != 0); }

void fake_set_default_flush_full_only(int on) { atomic_store(&knob_default_full_only, on != 0); }

void fake_set_kernel_backlog(int per_flush) { atomic_store(&knob_kernel_backlog, per_flush < 0 ? 0 : per_flush); }

void fake_set_backlog_ms(int ms) {
  atomic_store(&knob_backlog_until_ns, ms > 0 ? fake_mono_ns() + (uint64_t)ms * 1000000ull : 0);
}

/* Fires the driver API callback `cbid` at exit with a params struct that starts with the stream
 * and the given result, as CUPTI does for cuStreamBeginCapture_v2 and cuStreamEndCapture. */
static void fire_capture_cb(uint32_t cbid, void *stream, int result) {
  struct {
    void *stream;
    int mode; /* or the graph pointer of EndCapture: never read */
    void *graph;
  } params = {stream, 0, NULL};
  CUresult res = (CUresult)result;
  CUpti_CallbackData cd;
  memset(&cd, 0, sizeof cd);
  cd.callbackSite = CUPTI_API_ENTER;
  cd.functionName = cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture ? "cuStreamEndCapture"
                    : cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch  ? "cuGraphLaunch"
                                                                     : "cuStreamBeginCapture_v2";
  cd.functionParams = &params;
  cd.functionReturnValue = &res;
  cd.correlationId = atomic_fetch_add(&fake_next_correlation, 1);
  fake_fire_callback(CUPTI_CB_DOMAIN_DRIVER_API, cbid, &cd);
  cd.callbackSite = CUPTI_API_EXIT;
  fake_fire_callback(CUPTI_CB_DOMAIN_DRIVER_API, cbid, &cd);
}

void fake_stream_begin_capture(void *stream, int fire_callbacks) {
  if (atomic_fetch_add(&cap_active, 1) == 0) atomic_store(&cap_invalidated, 0);
  if (fire_callbacks) fire_capture_cb(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2, stream, 0);
}

int fake_stream_end_capture(void *stream, int fire_callbacks) {
  int bad = atomic_load(&cap_invalidated);
  if (bad) BUMP(st.captures_invalidated);
  atomic_fetch_sub(&cap_active, 1);
  if (fire_callbacks)
    fire_capture_cb(CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture, stream, bad ? 901 : 0);
  return bad;
}

void fake_graph_launch(void *stream, int fire_callbacks) {
  if (fire_callbacks) fire_capture_cb(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, stream, 0);
}

/* ---- additions: external correlation, callback state, kernel launches ---------------------- */

void fake_set_reject_external_push(int on) { atomic_store(&knob_reject_push, on ? 1 : 0); }

int fake_external_depth(int kind) {
  if (kind <= 0 || kind >= FAKE_NEXT_KINDS) return 0;
  fthread *ft = self_thread();
  return ft ? (int)ft->ncorr[kind] : 0;
}

uint64_t fake_external_top(int kind) {
  if (kind <= 0 || kind >= FAKE_NEXT_KINDS) return 0;
  fthread *ft = self_thread();
  return ft && ft->ncorr[kind] ? ft->corr[kind][ft->ncorr[kind] - 1] : 0;
}

int fake_callback_enabled(int domain, uint32_t cbid) {
  if (domain <= (int)CUPTI_CB_DOMAIN_INVALID || domain >= (int)CUPTI_CB_DOMAIN_SIZE ||
      cbid >= FAKE_CBID_BITS)
    return 0;
  pthread_mutex_lock(&ctl.lock);
  int on = ctl.subscribed && (ctl.cbid_on[domain][cbid / 8] >> (cbid % 8)) & 1;
  pthread_mutex_unlock(&ctl.lock);
  return on;
}

uint32_t fake_callback_enable_calls(int domain, uint32_t cbid, int enable) {
  if (domain <= (int)CUPTI_CB_DOMAIN_INVALID || domain >= (int)CUPTI_CB_DOMAIN_SIZE ||
      cbid >= FAKE_CB_COUNTED)
    return 0;
  return atomic_load(&cb_enable_calls[enable ? 1 : 0][domain][cbid]);
}

void fake_runtime_call(uint32_t cbid) {
  CUpti_CallbackData cd;
  memset(&cd, 0, sizeof cd);
  cd.callbackSite = CUPTI_API_ENTER;
  cd.functionName = "cudaRuntimeCall";
  cd.correlationId = atomic_fetch_add(&fake_next_correlation, 1);
  fake_fire_callback(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &cd);
  cd.callbackSite = CUPTI_API_EXIT;
  fake_fire_callback(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &cd);
}

uint32_t fake_launch_kernel(uint32_t cbid, const char *name) {
  uint32_t corr = atomic_fetch_add(&fake_next_correlation, 1);
  CUpti_CallbackData cd;
  memset(&cd, 0, sizeof cd);
  cd.callbackSite = CUPTI_API_ENTER;
  cd.functionName = "cudaLaunchKernel";
  cd.symbolName = name;
  cd.correlationId = corr;
  fake_fire_callback(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &cd);

  uint64_t t0 = fake_now();
  CUpti_ActivityAPI api;
  memset(&api, 0, sizeof api);
  api.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  api.cbid = cbid;
  api.start = t0;
  api.end = t0 + 1000;
  api.processId = (uint32_t)getpid();
  api.threadId = (uint32_t)gettid();
  api.correlationId = corr;
  fake_emit(&api, sizeof api, 0);

  CUpti_ActivityKernel10 k;
  memset(&k, 0, sizeof k);
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.start = t0 + 2000;
  k.end = t0 + 3000;
  k.deviceId = 0;
  k.contextId = 1;
  k.streamId = 7;
  k.gridX = k.gridY = k.gridZ = 1;
  k.blockX = k.blockY = k.blockZ = 1;
  k.correlationId = corr;
  k.name = name;
  fake_emit(&k, sizeof k, 0);

  cd.callbackSite = CUPTI_API_EXIT;
  fake_fire_callback(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &cd);
  return corr;
}
