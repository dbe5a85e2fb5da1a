/*
 * cm_internal.h: the interfaces between the engine's modules. Nothing here is public.
 * The calls that the agent makes too are declared in cm_agent.h, and the libcupti binding in
 * cm_cupti.h; both are included below, so that the core sees one interface.
 *
 * Module map (one noun per file):
 *   errors.c  error strings and the per-thread detail message (cm__seterr)
 *   fields.c  the field registry: per kind, the 13.0 record layout of every exported field
 *   select.c  cm_selection, the per-kind field bitsets, and the couplings between kinds
 *   cupti.c   the dlopen binding of libcupti (and of the few libcuda calls the fence needs)
 *   pool.c    the bounded, recycled pool of activity buffers
 *   intern.c  string interning by content, with a pointer-keyed cache in front
 *   decode.c  the decoder: completed buffers to per-kind columns
 *   json.c    the JSON documents of correlation metadata
 *   engine.c  the engine: creation, observers, selection reconcile, the public calls
 *   subscription.c  the CUPTI subscription: CUPTI's callbacks into the engine, detach, attach
 *   worker.c  the decode worker: decoding, the delivery and flush cadences
 *   delivery.c  records handed to the observers
 *   fence.c   flushes, device synchronization and the sync fence
 *   log.c     the engine's log callback
 *             (engine.h holds the state of these six files)
 *   pmsample.c PM sampling: per-device sessions over the union of the consumers' metrics
 *   job.c     helper threads that their waiter may abandon at a deadline
 */
#ifndef CM_INTERNAL_H
#define CM_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuptimon.h"
/* The part of this interface that the agent uses too: declared there, once. */
#include "cm_agent.h"

/* ---- errors.c ---------------------------------------------------------------------------- */

/* Records a printf-style detail for the calling thread and returns `err`, so that a failing
 * function can `return cm__seterr(CM_EINVAL, "bad size %u", n);`. */
int cm__seterr(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cm__clearerr(void);
/* cm__stderr_linev is in cm_agent.h. */

/* ---- clock.c: in cm_agent.h ---------------------------------------------------------------- */

/* ---- job.c -------------------------------------------------------------------------------- */

/* The job (cm__job) and the calls the agent makes too (start, finish, wait, release) are in
 * cm_agent.h. */
/* The waiter gives the job up for good, without releasing it: returns whether the helper had
 * finished, in which case what its results hold is the waiter's to undo; otherwise the helper's
 * cm__job_finish returns true and the helper undoes it. The waiter then calls cm__job_release. */
bool cm__job_abandon(cm__job *j);

/* ---- fields.c ---------------------------------------------------------------------------- */

#define CM__MAX_FIELDS 128 /* per kind; selections are 128-bit sets */

typedef struct cm__field {
  const char *name;
  const char *doc;
  uint16_t offset;    /* byte offset in the 13.0 record */
  uint8_t src_width;  /* bytes read from the record (8 for a string pointer) */
  uint8_t width;      /* bytes per column element */
  uint8_t type;       /* cm_type */
} cm__field;

typedef struct cm__kind_desc {
  int kind;               /* cm_kind */
  const char *name;       /* canonical Lua-safe name, "concurrent_kernel" */
  const char *alias;      /* a second accepted name ("kernel"), or NULL */
  const char *record;     /* the CUPTI struct it decodes, "CUpti_ActivityKernel10" */
  uint32_t record_size;   /* sizeof that struct */
  int nfields;
  const cm__field *fields;
  int16_t start_field;    /* id of the field holding the start timestamp, or -1 */
  int16_t end_field;      /* id of the field holding the end timestamp, or -1 */
} cm__kind_desc;

/* The descriptor of `kind`, or NULL if the registry does not know it. Thread-safe. */
const cm__kind_desc *cm__kind_desc_get(int kind);
/* All descriptors, in registry order; *n receives the count. */
const cm__kind_desc *cm__kind_descs(int *n);

/* ---- select.c ---------------------------------------------------------------------------- */

typedef struct cm__bits {
  uint64_t w[2];
} cm__bits;

static inline bool cm__bits_has(const cm__bits *b, int i) { return (b->w[i >> 6] >> (i & 63)) & 1; }
static inline void cm__bits_set(cm__bits *b, int i) { b->w[i >> 6] |= (uint64_t)1 << (i & 63); }
static inline bool cm__bits_empty(const cm__bits *b) { return (b->w[0] | b->w[1]) == 0; }
static inline bool cm__bits_eq(const cm__bits *a, const cm__bits *b) {
  return a->w[0] == b->w[0] && a->w[1] == b->w[1];
}
static inline bool cm__bits_subset(const cm__bits *a, const cm__bits *b) {
  return (a->w[0] & ~b->w[0]) == 0 && (a->w[1] & ~b->w[1]) == 0;
}
static inline int cm__bits_count(const cm__bits *b) {
  return __builtin_popcountll(b->w[0]) + __builtin_popcountll(b->w[1]);
}

struct cm_selection {
  cm__bits kinds[CM_KIND_MAX];
};

/* The couplings between kinds, for a union selection `sel[CM_KIND_MAX]`. Thread-safe.
 * The kinds CUPTI must have enabled, one bit per kind: CUDA_EVENT needs SYNCHRONIZATION, MEMCPY2
 * needs MEMCPY, EXTERNAL_CORRELATION needs RUNTIME (or DRIVER); synthetic kinds are never enabled. */
uint64_t cm__sel_kinds_needed(const cm__bits *sel);
/* Whether kernel QUEUED or SUBMITTED is selected: latency timestamps must be on. */
bool cm__sel_needs_latency(const cm__bits *sel);
/* Whether CUDA_EVENT device_timestamp is selected: event device timestamps must be on. */
bool cm__sel_needs_event_ts(const cm__bits *sel);

/* ---- cupti.c: in cm_cupti.h (cm_agent.h includes it too) --------------------------------- */

#include "cm_cupti.h"

/* ---- pool.c ------------------------------------------------------------------------------ */

/*
 * The buffer pool. CUPTI's request callback takes a buffer from here and the decode worker
 * returns it after decoding. The pool is bounded: past `max_buffers` alive at once a request
 * gets NULL and CUPTI counts the records it cannot store as dropped. Buffers live in a free list
 * and are reused; a warm pool never allocates. The mutex guards the free list and the counters;
 * it is held only for list operations, never while allocating or freeing memory.
 */
typedef struct cm__pool {
  pthread_mutex_t mu; /* guards everything below */
  void *free_list;
  size_t buffer_size;    /* size of newly allocated buffers */
  uint32_t max_buffers;
  uint32_t warn_outstanding;
  uint64_t alive;        /* buffers allocated and not freed */
  uint64_t outstanding;  /* buffers handed out and not yet returned */
  uint64_t free_count;
  uint64_t allocated;    /* ever allocated */
  uint64_t refused;
  bool warned;
} cm__pool;

int cm__pool_init(cm__pool *p, size_t buffer_size, uint32_t max_buffers, uint32_t warn_outstanding);
/* Frees the free list. Buffers still outstanding are not freed (CUPTI may own them). */
void cm__pool_destroy(cm__pool *p);
/* Any thread. Returns an 8-byte aligned buffer and its size, or NULL at the bound. Sets
 * *warn to true exactly once, when outstanding buffers first pass warn_outstanding. */
uint8_t *cm__pool_get(cm__pool *p, size_t *size, bool *warn);
/* Any thread. Returns a buffer obtained from cm__pool_get. */
void cm__pool_put(cm__pool *p, uint8_t *buf);
/* Notes when CUPTI asked for buffer `buf` (CLOCK_REALTIME ns), and reads it back: every record
 * CUPTI puts in the buffer is written after that instant, so a record older than it was held by
 * CUPTI at least that long (the lag guard's measure). The thread that got the buffer stamps it;
 * the decoder reads it after the completion queue's lock. */
void cm__pool_stamp(uint8_t *buf, uint64_t ns);
uint64_t cm__pool_requested_ns(uint8_t *buf);
/* Any thread. Changes the size of buffers allocated from now on and the bound. */
void cm__pool_configure(cm__pool *p, size_t buffer_size, uint32_t max_buffers, uint32_t warn);
/* Any thread. Frees the free buffers beyond `keep`; returns how many were freed. */
uint64_t cm__pool_trim(cm__pool *p, uint64_t keep);

/* ---- intern.c ---------------------------------------------------------------------------- */

/*
 * String interning. Ids are dense from 0 (id 0 is the empty string). The content table maps
 * bytes to ids; a pointer-keyed cache in front of it avoids hashing a long mangled name for every
 * record. The cache is used by the decoder thread only; other threads invalidate it by bumping
 * `generation` (a module unload may let a new string reuse an address), and the decoder clears it
 * before its next lookup. Lookup by id is safe from any thread: strings are never moved or freed
 * while the table lives, and the count is published with release ordering.
 */
typedef struct cm__intern cm__intern;

int cm__intern_new(cm__intern **out);
void cm__intern_free(cm__intern *t);
/* Decoder thread only. NULL maps to id 0. */
uint32_t cm__intern_ptr(cm__intern *t, const char *s);
/* Decoder thread only (or any thread while the decoder is stopped). */
uint32_t cm__intern_bytes(cm__intern *t, const char *s, size_t len);
/* Any thread. */
void cm__intern_invalidate(cm__intern *t);
/* Any thread. NULL for an unknown id. */
const char *cm__intern_get(cm__intern *t, uint32_t id, size_t *len);
/* Any thread. */
uint32_t cm__intern_count(cm__intern *t);


/* ---- decode.c ---------------------------------------------------------------------------- */

/*
 * The decoder turns one completed CUPTI buffer into appended column values. It is table-driven:
 * for each kind, the selected fields' (offset, width) pairs. Records of a kind are gathered in
 * runs and copied field by field, so the inner loops are strided copies of one width. The decoder
 * is used by one thread at a time (the decode worker, or a benchmark); nothing in it locks.
 */
typedef struct cm__decoder cm__decoder;

int cm__decoder_new(cm__decoder **out, const cm__cupti *c, cm__intern *strings);
void cm__decoder_free(cm__decoder *d);
/* Replaces the per-kind field selection (sel[k] for kind k). Only valid while no records are
 * held (after cm__decoder_reset). */
void cm__decoder_select(cm__decoder *d, const cm__bits *sel /* [CM_KIND_MAX] */);
/* Decodes every record of `buf[0..valid)` and returns the number of records seen. Records of
 * kinds with no selected field are counted but not stored. */
uint64_t cm__decoder_decode(cm__decoder *d, uint8_t *buf, size_t valid);
/* The number of records held for `kind`, and the column of `field` (NULL when not selected). */
uint32_t cm__decoder_count(const cm__decoder *d, int kind);
const void *cm__decoder_column(const cm__decoder *d, int kind, int field);
/* Forgets the held records, keeping the column memory for reuse. */
void cm__decoder_reset(cm__decoder *d);
/* The largest end timestamp of a SYNCHRONIZATION record seen so far (the fence watches it). */
uint64_t cm__decoder_sync_end(const cm__decoder *d);
/* Records dropped by the decoder itself (no memory to grow a column), since creation. This and
 * cm__decoder_seen may be called from any thread: they read counters published per buffer. */
uint64_t cm__decoder_lost(const cm__decoder *d);
/* Adds the kinds of `set` to, and removes those of `clear` from, the kinds whose unselected
 * records count as late: records of a kind that was traced and then left the selection, which
 * arrive after the fence of that change (they were written while the kind was traced, and no
 * observer receives them). Called with the decoder's lock held. */
void cm__decoder_watch_late(cm__decoder *d, uint64_t set, uint64_t clear);
/* The end (else start) timestamp of the last record of the buffer decoded last, or 0. Called
 * with the decoder's lock held. */
uint64_t cm__decoder_last_ts(const cm__decoder *d);
/* The exit fence's watch on records from before its mark (CUPTI's clock): from this call on, the
 * decoder counts the records it decodes whose end (else start) timestamp lies before `mark`, by
 * less than an hour (0 stops the watch). After the fence's own sync record has come, such records
 * still arriving mean that CUPTI is behind on some kind (kernel records, timed on the device,
 * behind the API records of the same launches), so the fence keeps flushing until they stop.
 * Both are called with the decoder's lock held. */
void cm__decoder_watch_before(cm__decoder *d, uint64_t mark);
uint64_t cm__decoder_before_count(const cm__decoder *d);
/* An hour in ns: a timestamp further than this from the realtime clock is taken to be on another
 * clock (a test double's fixed dates), and is no measure of lag. */
#define CM__HOUR_NS (3600ull * 1000000000ull)
/* Late records counted since creation; any thread, like cm__decoder_lost. */
uint64_t cm__decoder_late(const cm__decoder *d);
/* Records seen per kind since creation. */
uint64_t cm__decoder_seen(const cm__decoder *d, int kind);

/* ---- synthetic records ------------------------------------------------------------------------
 *
 * Records the engine produces itself (not CUPTI) are laid out like CUPTI records: a 32-bit kind
 * first, naturally aligned members after it, so the field registry describes them with the same
 * macros and the decoder copies them with the same table. They reach the decoder through
 * cm__decoder_inject at drain time, never through a CUPTI buffer.
 */
typedef struct cm__resource_record {
  uint32_t kind;        /* CM_KIND_RESOURCE */
  uint32_t event;       /* the CUPTI_CBID_RESOURCE_* that produced it */
  uint64_t timestamp;   /* CLOCK_REALTIME, ns */
  uint64_t context;     /* the CUcontext handle */
  uint64_t stream;      /* the CUstream handle (stream events), else 0 */
  uint64_t context_id;  /* cuCtxGetId of the context, 0 when unavailable */
  uint64_t stream_id;   /* cuStreamGetId of the stream, 0 when unavailable or not a stream event */
  uint32_t device;      /* cuCtxGetDevice_v2 of the context, UINT32_MAX when unavailable */
  uint32_t module_id;   /* CUpti_ModuleResourceData.moduleId (module events), else 0 */
  uint32_t tid;         /* the thread that made the call (gettid) */
  uint32_t reserved;
} cm__resource_record;

/* Appends `n` records of `kind`, `stride` bytes apart, as if a buffer had held them. Records of a
 * kind with no selected field are counted as seen and not stored. Same thread rules as decode. */
void cm__decoder_inject(cm__decoder *d, int kind, const uint8_t *recs, size_t n, size_t stride);

/* ---- json.c: the metadata documents of correlation.c --------------------------------------- */

typedef struct cm__json cm__json;
/* A growable string; `oom` is set (and later puts ignored) when it cannot grow. */
typedef struct cm__sbuf {
  char *p;
  size_t n, cap;
  bool oom;
} cm__sbuf;

/* Parses a whole document. On failure returns NULL, sets *rc and the detail (cm_errmsg). */
cm__json *cm__json_parse(const char *s, size_t len, int *rc);
/* Merges `src` into `dst` and returns the result; both are consumed. Two objects merge key by
 * key; on any other pair the later value (src) wins. */
cm__json *cm__json_merge(cm__json *dst, cm__json *src);
/* Appends the compact text of `n` to `b`. */
void cm__json_write(cm__sbuf *b, const cm__json *n);
void cm__json_free(cm__json *n);
void cm__sbuf_put(cm__sbuf *b, const char *s, size_t n);

/* ---- correlation.c ----------------------------------------------------------------------------
 *
 * The engine binds the external-correlation module to CUPTI while it lives: attach gives it the
 * push and pop entry points (libcupti is never unloaded, so the pointers stay valid), detach stops
 * new pushes from reaching CUPTI while frames pushed before can still be popped. The engine calls
 * cm__corr_drain once per delivery, after the observers ran, to age popped chains.
 */
void cm__corr_attach(const cm__cupti *c);
void cm__corr_detach(void);
/* After cuptiFinalize: no push reaches CUPTI until cm__corr_attach, and frames pushed before it
 * are not popped in CUPTI (its stacks are gone). */
void cm__corr_finalized(void);
void cm__corr_drain(void);

/* ---- callbacks.c ------------------------------------------------------------------------------
 *
 * The registry of subscriber-callback handlers of one engine, the refcounted arming, and the
 * built-in RESOURCE handler that produces CM_KIND_RESOURCE records into a bounded side queue.
 */
typedef struct cm__callbacks cm__callbacks;
typedef void (*cm__log_hook)(void *ctx, int level, const char *msg);

/* Creates the registry on a live subscription and enables the RESOURCE callbacks the resource
 * kind needs (they stay enabled, pinned, until the registry is freed). `cuda` is the libcuda
 * handle (may be NULL) used to look up the optional id queries. */
int cm__callbacks_new(cm__callbacks **out, const cm__cupti *c, CUpti_SubscriberHandle sub,
                      cm__log_hook log, void *log_ctx);
/* Frees the registry. Call after cuptiUnsubscribe, so no dispatch can start; waits for
 * dispatches still in flight. NULL is accepted. */
void cm__callbacks_free(cm__callbacks *cb);
/* The trampoline's target: runs the built-in handler and every registered handler. Any thread. */
void cm__callbacks_dispatch(cm__callbacks *cb, int domain, uint32_t cbid, const void *data,
                            cm__intern *strings);
/* Moves the queued synthetic records into the decoder. Called with the decoder's lock held. */
void cm__callbacks_drain(cm__callbacks *cb, cm__decoder *dec);
/* The operations behind the public cm_callback_* functions (engine.c checks the engine handle
 * and passes its registry). Same contracts as the public calls in cuptimon.h. */
int cm__callbacks_register(cm__callbacks *cb, int domain, uint32_t cbid, cm_callback_fn fn,
                           void *ud, uint32_t *handle);
int cm__callbacks_unregister(cm__callbacks *cb, uint32_t handle);
int cm__callbacks_arm(cm__callbacks *cb, int domain, uint32_t cbid);
int cm__callbacks_disarm(cm__callbacks *cb, int domain, uint32_t cbid);
int cm__callbacks_armed(cm__callbacks *cb, int domain, uint32_t cbid);
int cm__callbacks_stats(cm__callbacks *cb, cm_callback_stats *out);
/* Moves the registry to a new subscription after cuptiFinalize (cm_cupti_detach): with `sub`
 * NULL, no callback is enabled in CUPTI and arming only records what is wanted; with a new
 * subscription, every pinned or armed callback is enabled on it again. Forgets the captures in
 * progress (none can be seen while detached). Control thread, with the engine's api_mu held. */
void cm__callbacks_rebind(cm__callbacks *cb, CUpti_SubscriberHandle sub);
/* The consumers' arms over every callback (the engine's own pins not counted). */
uint32_t cm__callbacks_consumer_arms(cm__callbacks *cb);
/* The number of CUDA stream captures in progress in the process, as the built-in capture handler
 * saw them begin and end (cuStreamBeginCapture*, cuStreamEndCapture*, at API exit). The fence does
 * not synchronize the device while it is not 0: a synchronize call can invalidate an
 * application's graph capture. Any thread; lock-free. */
int cm__callbacks_captures_active(const cm__callbacks *cb);
/* Whether the process has made or launched a CUDA graph (a capture's end, cuGraphInstantiate*,
 * cuGraphLaunch*, cuGraphUpload*), as the engine's pinned driver callbacks saw while CUPTI was
 * attached. Sticky. A detach refuses from then on (subscription.c). Any thread; lock-free. */
bool cm__callbacks_graphs_used(const cm__callbacks *cb);
/* Device synchronizes running on fence.c's helper thread (0 or 1), which counts itself in and
 * out. A capture that begins waits, for a bounded time, until it is 0. Defined in callbacks.c. */
extern _Atomic int cm__sync_helpers;

/* ---- fence.c: the exit fence ------------------------------------------------------------------
 *
 * What the exit fence did (cm__exit_flush) and the fence itself (cm__engine_exit_flush) are in
 * cm_agent.h: the agent's exit is their caller. */

/* ---- pmsample.c: PM sampling ------------------------------------------------------------------
 *
 * The engine's PM sampling sessions, one per device, over the union of the metrics of that
 * device's consumers. Control calls (add, remove) come with the engine's api_mu held; the poll
 * runs inside delivery with dec_mu held. The module's own mutex guards its consumers, sessions
 * and pending records and is held across the PM CUPTI calls; only the process-wide
 * cuptiProfilerInitialize lock is taken under it. The counters are read without it. */
typedef struct cm__pm cm__pm;

/* The synthetic record of one metric of one sample (CM_KIND_PM_SAMPLE). `metric` points at a
 * name the module keeps until it is freed, so the decoder's pointer cache stays valid. */
typedef struct cm__pm_record {
  uint32_t kind;       /* CM_KIND_PM_SAMPLE */
  uint32_t device;     /* the CUDA device ordinal */
  uint64_t start;      /* the sample's start, CLOCK_REALTIME ns */
  uint64_t stop;       /* the sample's end, CLOCK_REALTIME ns */
  const char *metric;  /* the metric's name */
  uint64_t sample;     /* the sample's number in its device's sessions, from 0 */
  double value;        /* the metric's value over the sample */
} cm__pm_record;

/* Decoded samples of one poll, as columns: n samples, start[i] and stop[i] on the record clock,
 * values[m * cap + i] the value of metric m in sample i. */
typedef struct cm__pm_columns {
  uint32_t n, cap, nmetrics;
  uint64_t *start, *stop;
  double *values;
} cm__pm_columns;

/* Creates the module over a loaded libcupti. `clock_offset_ns` is cuptiGetTimestamp minus
 * CLOCK_REALTIME (engine.c's check), which converts sample timestamps to the record clock. */
int cm__pm_new(cm__pm **out, const cm__cupti *c, int64_t clock_offset_ns);
/* Stops every session (polling each one last time; those records are lost with the module) and
 * frees the module. NULL is accepted. */
void cm__pm_free(cm__pm *pm);
/* Whether cuptiProfilerInitialize has run in this process (it is never undone): cm_cupti_detach
 * then refuses, since the profiler API's state after a cuptiFinalize is not documented. */
bool cm__pm_profiler_initialized(void);
/* See cm_pm_sample_add and cm_pm_sample_remove. `poll_ms` is the expected time between polls,
 * which sizes the hardware buffer so that it does not overflow between two of them. */
int cm__pm_add(cm__pm *pm, int device, const char *const *metrics, uint32_t nmetrics,
               uint32_t interval_us, uint32_t poll_ms, uint32_t *id);
int cm__pm_remove(cm__pm *pm, uint32_t id, uint32_t poll_ms);
/* Polls every running session and moves the records gathered since the last drain into the
 * decoder. Called with the decoder's lock held. */
void cm__pm_drain(cm__pm *pm, cm__decoder *dec);
/* Copies the counters. Any thread. */
void cm__pm_stats(cm__pm *pm, cm_pm_stats *out);
/* The PM call trace: level 1 when CUPTIMON_PM_TRACE=1 or CUPTIMON_AGENT_LOG=debug, 2 (every
 * per-sample call too) when CUPTIMON_PM_TRACE=2, else 0. At a non-zero level cm__pm_trace writes
 * one line to stderr with a single write(2) (nothing is buffered, so the last line before a
 * crash is on the terminal), else it does nothing. Any thread. */
int cm__pm_trace_level(void);
void cm__pm_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Converts the samples of a counter data image to columns (the decode path, exposed for the
 * tests): for each completed sample, its timestamps and the evaluated metrics. Samples whose
 * timestamps are not on the record clock (0, reversed, or outside [lo_ns, hi_ns] after the
 * offset) are left out and counted in *filtered. `cols` grows as needed. */
int cm__pm_decode_image(const cm__cupti *c, CUpti_PmSampling_Object *obj,
                        CUpti_Profiler_Host_Object *host, const uint8_t *image, size_t image_size,
                        const char *const *metrics, uint32_t nmetrics, int64_t clock_offset_ns,
                        uint64_t lo_ns, uint64_t hi_ns, cm__pm_columns *cols, uint64_t *filtered);
void cm__pm_columns_free(cm__pm_columns *cols);

/* The engine's calls for the agent's idle periods, lag guard and selections (cm__engine_trim,
 * cm__engine_set_suppressed, ...) are in cm_agent.h. */

#endif /* CM_INTERNAL_H */
