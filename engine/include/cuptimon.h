/*
 * cuptimon.h: the public C API of the cuptimon engine.
 *
 * The engine owns the process's single CUPTI subscription. It keeps a bounded pool of activity
 * buffers, decodes completed buffers into per-field columns on its own worker thread, and hands
 * those columns to observers in batches. A flush fence makes a window of records complete.
 *
 * Conventions:
 *  - Every call that can fail returns 0 or a negative CM_E* code. cm_strerror() and cm_err_name()
 *    describe a code; cm_errmsg() returns the calling thread's detail for its last failed call
 *    (for example the list of valid field names after CM_ENOFIELD).
 *  - Handles are opaque. No struct is passed by value, and no CUDA or CUPTI header is included,
 *    so the header can be fed to LuaJIT's FFI as it is.
 *  - Threads: nothing here is thread-safe except where stated. Each declaration says which
 *    thread may call it: "Thread-safe" means any thread, at any time, concurrently with other
 *    calls; "Any thread" means any thread, with the serialization the note gives. One engine may
 *    exist per process, because CUPTI allows one subscriber per process.
 *  - The library never prints and never exits. It reports through the log callback.
 *  - Only the declarations marked CM_EXTERN are exported from libcuptimon.so; everything else in
 *    the library is built with hidden visibility.
 */
#ifndef CUPTIMON_H
#define CUPTIMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the public API, as libuv's UV_EXTERN does. The library is compiled with
 * -fvisibility=hidden, so these declarations are the only symbols libcuptimon.so exports (and the
 * only cm_ symbols a program linked with --export-dynamic shows to LuaJIT's ffi.C). */
#ifndef CM_EXTERN
#if defined(__GNUC__) && __GNUC__ >= 4
#define CM_EXTERN __attribute__((visibility("default")))
#else
#define CM_EXTERN
#endif
#endif

#define CM_VERSION_MAJOR 0
#define CM_VERSION_MINOR 1
#define CM_VERSION_PATCH 0

/* The error space. One X-macro produces the enum, cm_strerror() and cm_err_name(). */
#define CM_ERRNO_MAP(XX)                                                                     \
  XX(EINVAL, -1, "invalid argument")                                                         \
  XX(ENOMEM, -2, "out of memory")                                                            \
  XX(ENOKIND, -3, "unknown activity kind")                                                   \
  XX(ENOFIELD, -4, "unknown field")                                                          \
  XX(ENOCUPTI, -5, "CUPTI library or symbol not found")                                      \
  XX(ECUPTI, -6, "CUPTI call failed")                                                        \
  XX(EBUSY, -7, "resource busy (another engine or CUPTI subscriber exists)")                 \
  XX(ETIMEDOUT, -8, "timed out")                                                             \
  XX(ENOENT, -9, "no such entry")                                                            \
  XX(ESTATE, -10, "operation not valid in the current state")                                \
  XX(ENOSYS, -11, "operation not supported by this CUPTI")                                   \
  XX(ECLOCK, -12, "CUPTI timestamps are not CLOCK_REALTIME")                                 \
  XX(EAGAIN, -13, "resource temporarily unavailable")                                        \
  XX(EIO, -14, "input/output error")                                                         \
  XX(ERANGE, -15, "value out of range")                                                      \
  XX(EPERM, -16, "not permitted (GPU performance counters are restricted to admin users)")

typedef enum cm_errno {
  CM_OK = 0,
#define CM__ERR_ENUM(name, value, text) CM_##name = value,
  CM_ERRNO_MAP(CM__ERR_ENUM)
#undef CM__ERR_ENUM
  CM_ERRNO_LAST = -17
} cm_errno;

/* A short human description of an error code; never NULL. Thread-safe. */
CM_EXTERN const char *cm_strerror(int err);
/* The symbolic name of an error code ("EINVAL"); never NULL. Thread-safe. */
CM_EXTERN const char *cm_err_name(int err);
/* The detail message of the calling thread's last failed cm_ call, or "" if none. Thread-safe;
 * the string is valid until the thread's next failing call. */
CM_EXTERN const char *cm_errmsg(void);

/* Activity kinds. The values are CUPTI's CUpti_ActivityKind values, which are ABI-stable. */
typedef enum cm_kind {
  CM_KIND_INVALID = 0,
  CM_KIND_MEMCPY = 1,
  CM_KIND_MEMSET = 2,
  CM_KIND_KERNEL = 3, /* serialized kernels; prefer CM_KIND_CONCURRENT_KERNEL */
  CM_KIND_DRIVER = 4,
  CM_KIND_RUNTIME = 5,
  CM_KIND_DEVICE = 8,
  CM_KIND_CONTEXT = 9,
  CM_KIND_CONCURRENT_KERNEL = 10,
  CM_KIND_NAME = 11,
  CM_KIND_MARKER = 12,
  CM_KIND_MARKER_DATA = 13,
  CM_KIND_OVERHEAD = 17,
  CM_KIND_ENVIRONMENT = 20,
  CM_KIND_MEMCPY2 = 22,
  CM_KIND_CUDA_EVENT = 36,
  CM_KIND_STREAM = 37,
  CM_KIND_SYNCHRONIZATION = 38,
  CM_KIND_EXTERNAL_CORRELATION = 39,
  CM_KIND_MEMORY2 = 49,
  CM_KIND_MEMORY_POOL = 50,
  CM_KIND_GRAPH_TRACE = 51,
  /* Synthetic kinds: produced by the engine itself, never enabled in CUPTI. */
  CM_KIND_RESOURCE = 60, /* context/stream/module create and destroy, from RESOURCE callbacks */
  CM_KIND_PM_SAMPLE = 61, /* PM sampling: one metric value of one sample interval (cm_pm_sample) */
  CM_KIND_MAX = 64 /* an upper bound on kind values, for tables */
} cm_kind;

/* The type of a column's elements. Strings are carried as uint32_t ids (CM_TYPE_STR) that
 * cm_string() resolves; id 0 is the empty string. */
typedef enum cm_type {
  CM_TYPE_U8 = 1,
  CM_TYPE_U16 = 2,
  CM_TYPE_U32 = 3,
  CM_TYPE_U64 = 4,
  CM_TYPE_I32 = 5,
  CM_TYPE_I64 = 6,
  CM_TYPE_STR = 7,
  CM_TYPE_I8 = 8,
  CM_TYPE_I16 = 9,
  CM_TYPE_F64 = 10 /* double: PM sampling's metric values */
} cm_type;

/* A field of a kind, as described by the registry. Ids are stable across versions. */
typedef struct cm_field_info {
  int32_t kind;      /* cm_kind */
  int32_t id;        /* stable field id within the kind, 0..n-1 */
  const char *name;  /* Lua-safe name, for example "start", "stop", "name" */
  int32_t type;      /* cm_type */
  uint32_t width;    /* bytes per element in a column: 1, 2, 4 or 8 */
  uint32_t offset;   /* byte offset in the CUPTI 13.0 record */
  uint32_t src_width;/* bytes read from the record (a string field reads an 8-byte pointer) */
  const char *doc;   /* one line of description */
} cm_field_info;

/* The name of a kind ("concurrent_kernel"), or NULL for an unknown kind. Thread-safe. */
CM_EXTERN const char *cm_kind_name(int kind);
/* Looks a kind up by name or alias ("kernel" is CONCURRENT_KERNEL). Returns the kind or
 * CM_ENOKIND, with a detail listing the valid names. Thread-safe. */
CM_EXTERN int cm_kind_by_name(const char *name);
/* The number of kinds the registry knows, and the i-th of them. Thread-safe. */
CM_EXTERN int cm_kind_count(void);
CM_EXTERN int cm_kind_at(int index);
/* The number of fields of a kind, or CM_ENOKIND. Thread-safe. */
CM_EXTERN int cm_field_count(int kind);
/* Copies the description of field `id` of `kind` into *out. Thread-safe. */
CM_EXTERN int cm_field_info_get(int kind, int id, cm_field_info *out);
/* Looks a field up by name; returns its id or CM_ENOFIELD with a detail listing the valid
 * names of that kind. Thread-safe. */
CM_EXTERN int cm_field_by_name(int kind, const char *name);

/* A selection: for each kind, which fields an observer wants. Not thread-safe: one thread at a
 * time uses a given selection (distinct selections may be used on distinct threads). cm_observe
 * copies it, so it may be changed or freed as soon as cm_observe returns. */
typedef struct cm_selection cm_selection;

CM_EXTERN int cm_selection_new(cm_selection **out);
CM_EXTERN void cm_selection_free(cm_selection *sel);
/* Adds field `field` (a name, or "all" or NULL for every field) of kind `kind` (a name). */
CM_EXTERN int cm_selection_add(cm_selection *sel, const char *kind, const char *field);
/* Adds field `field_id` (or -1 for every field) of kind `kind`. */
CM_EXTERN int cm_selection_add_id(cm_selection *sel, int kind, int field_id);
/* Parses a text selection such as "kernel:name,start,stop;memcpy:all;runtime". A kind with no
 * field list means all of its fields. On error nothing is added. */
CM_EXTERN int cm_selection_parse(cm_selection *sel, const char *spec);

/* Flags of cm_selection_parse_ex. */
enum {
  /* Skip what cannot be selected (an unknown kind or field, an empty or overlong name) instead of
   * failing, and report each skipped name through the skip callback. */
  CM_SELECT_LENIENT = 1u << 0
};
/* Receives one skipped name: `offset` is its byte offset in the text, `message` says what it was
 * and lists the valid names (as cm_errmsg would). */
typedef void (*cm_select_skip_fn)(void *ud, size_t offset, const char *message);
/* cm_selection_parse with flags. Without CM_SELECT_LENIENT it is cm_selection_parse. With it,
 * every valid name is added, every other one is passed to `on_skip` (which may be NULL) and left
 * out, and the call returns the number of names left out (0 when all were valid), or a negative
 * code only for a NULL selection or text. Not thread-safe for one selection, like the others. */
CM_EXTERN int cm_selection_parse_ex(cm_selection *sel, const char *spec, unsigned flags,
                                    cm_select_skip_fn on_skip, void *ud);
/* Whether the selection holds field `field_id` of `kind` (1 or 0). */
CM_EXTERN int cm_selection_has(const cm_selection *sel, int kind, int field_id);
/* The number of fields selected for `kind`. */
CM_EXTERN int cm_selection_count(const cm_selection *sel, int kind);

/* One column of a batch. `data` points to `n` elements of `width` bytes each, 8-byte aligned. */
typedef struct cm_column {
  int32_t field;     /* field id within the batch's kind */
  int32_t type;      /* cm_type */
  uint32_t width;    /* bytes per element */
  uint32_t reserved;
  const char *name;  /* the field's name */
  const void *data;
} cm_column;

/* A batch: the records of one kind decoded in one drain. The batch and its columns are valid
 * only for the duration of the observer callback. Columns are in ascending field-id order and
 * hold exactly the fields the observer selected for this kind. */
typedef struct cm_batch {
  int32_t kind;      /* cm_kind */
  uint32_t n;        /* number of records */
  uint32_t ncols;
  uint32_t reserved;
  const cm_column *cols;
  uint64_t seq;      /* drain sequence number, increasing */
} cm_batch;

/* Returns the column of `field` in `b`, or NULL when the batch does not carry it. Thread-safe
 * (it only reads `b`). */
CM_EXTERN const cm_column *cm_batch_column(const cm_batch *b, int field);

typedef struct cm_engine cm_engine;

/* An observer callback. It runs on the engine's decode worker (cadenced delivery) or on the
 * thread calling cm_flush(), never on two threads at once for one engine. It must not call
 * cm_observe, cm_unobserve, cm_flush, cm_configure or cm_engine_free; it may call cm_stats_get,
 * cm_session_info_get, cm_enabled_kinds and cm_string. */
typedef void (*cm_observer_fn)(void *ud, const cm_batch *batch);

typedef enum cm_log_level {
  CM_LOG_ERROR = 0,
  CM_LOG_WARN = 1,
  CM_LOG_INFO = 2,
  CM_LOG_DEBUG = 3
} cm_log_level;

/* A log callback. It may run on any engine, CUPTI or application thread, so it must be
 * thread-safe with respect to the rest of the program. The engine calls it with its log lock held:
 * calls for one engine never overlap, and the callback must not call back into the engine
 * (cm_set_log included, which would wait for that lock forever). */
typedef void (*cm_log_fn)(void *ud, int level, const char *msg);

/* Engine configuration. cm_config_init() fills the defaults. */
typedef struct cm_config {
  uint32_t buffer_size;       /* bytes per activity buffer; default 4 MiB */
  uint32_t pool_max_buffers;  /* bound on buffers alive at once; default 256 (1 GiB at 4 MiB) */
  uint32_t warn_outstanding;  /* warn once when this many buffers are outstanding; default 64 */
  uint32_t self_flush_ms;     /* a plain cuptiActivityFlushAll on this cadence; 0 = off (default) */
  uint32_t deliver_ms;        /* deliver decoded batches on this cadence; 0 = only on flush */
  uint32_t fence_timeout_ms;  /* default deadline of a sync flush; default 5000 */
  uint32_t batch_records;     /* deliver early when a kind holds this many records; default 1<<20 */
  uint32_t flags;             /* CM_CONFIG_* */
} cm_config;

enum {
  /* Register a CLOCK_REALTIME timestamp callback with CUPTI (once per process, before any kind
   * is enabled). Use it when CUPTI's own clock is not CLOCK_REALTIME. */
  CM_CONFIG_TIMESTAMP_CALLBACK = 1u << 0
};

CM_EXTERN /* Thread-safe (it only writes *cfg). */
CM_EXTERN void cm_config_init(cm_config *cfg);

/* Creates the engine: loads CUPTI, subscribes, registers the buffer callbacks and starts the
 * decode worker. No kind is enabled until the first observer. `cfg` may be NULL. Fails with
 * CM_EBUSY when an engine already exists in the process or another CUPTI subscriber holds the
 * process (the detail names it), and with CM_ENOCUPTI when libcupti cannot be loaded.
 * Thread-safe: of concurrent calls, one wins and the others fail with CM_EBUSY. */
CM_EXTERN int cm_engine_new(cm_engine **out, const cm_config *cfg);
/* Stops the session (a final fence delivers the last records), unsubscribes and frees the
 * engine. Buffers CUPTI still owns are not freed. NULL is accepted. Not thread-safe: any thread,
 * but no other call on `e` may run concurrently or come after it, and never from an observer,
 * a callback handler or the log callback. It waits for CUPTI callbacks already inside the
 * engine to leave. */
CM_EXTERN void cm_engine_free(cm_engine *e);
/* Changes the configuration. The buffer size applies to buffers allocated from then on.
 * Any thread: it is serialized with cm_observe, cm_unobserve and cm_flush by the engine's control
 * lock. Not from an observer, a callback handler or the log callback. */
CM_EXTERN int cm_configure(cm_engine *e, const cm_config *cfg);
/* Sets (or, with fn NULL, removes) the log callback. Thread-safe, except from inside the log
 * callback itself: it waits for a callback running on another thread, and once it returns the
 * previous callback is not running and is not called again. No callback is set at creation, so
 * messages logged before this call (during cm_engine_new) are dropped. */
CM_EXTERN void cm_set_log(cm_engine *e, cm_log_fn fn, void *ud);

/* Registers an observer for `sel` (copied). The engine flushes pending records to the existing
 * observers first, then applies the new union of selections with a minimal diff. The first
 * observer starts the activity session. On success *id receives the observer's id (> 0).
 *
 * cm_observe, cm_unobserve and cm_flush: any thread. They are serialized with each other and with
 * cm_configure by the engine's control lock, and they deliver pending batches to the observers on
 * the calling thread (which is how a deliver_ms = 0 engine delivers on a thread of the caller's
 * choosing). They must not be called from an observer callback, a callback handler (they may
 * synchronize the device, which is not allowed inside a CUDA call) or the log callback. */
CM_EXTERN int cm_observe(cm_engine *e, const cm_selection *sel, cm_observer_fn fn, void *ud,
                         uint32_t *id);
/* Unregisters an observer. Its pending records are delivered to it first. The last observer
 * stops the session (device sync, forced flush, delivery, kinds disabled). */
CM_EXTERN int cm_unobserve(cm_engine *e, uint32_t id);

typedef enum cm_flush_mode {
  CM_FLUSH_PLAIN = 0, /* deliver every buffer CUPTI has completed */
  CM_FLUSH_SYNC = 1   /* deliver every record produced before the call (a device-sync fence) */
} cm_flush_mode;

/* Flushes and delivers. timeout_ms == 0 uses the configured fence timeout. A sync flush that
 * misses its deadline delivers what it has, logs a warning and returns CM_ETIMEDOUT. Any thread,
 * as cm_observe above. */
CM_EXTERN int cm_flush(cm_engine *e, int mode, uint32_t timeout_ms);

/* Detaches CUPTI from the process (cuptiFinalize) while nothing is traced, so that the
 * application's CUDA calls cost what they did before CUPTI attached: once CUPTI has traced, a
 * launch stays dearer after every kind is disabled (docs/agent.md, "Detaching CUPTI while
 * idle"). The next cm_observe, cm_callback_arm or cm_pm_sample_add attaches CUPTI again (a new
 * subscription, the buffer callbacks, every pinned or armed callback), and so does
 * cm_cupti_attach. Forced flushes first return what CUPTI holds, until one brings nothing; those
 * records reach no observer and count as late.
 * cuptiFinalize runs on a helper thread, at the exit of that thread's own driver API call, the
 * call site CUPTI recommends. timeout_ms bounds the flush and the wait for cuptiFinalize (0: the
 * configured fence timeout; cuptiFinalize gets at least 200 ms): CUPTI can keep cuptiFinalize
 * waiting for as long as the application's threads keep it busy (minutes, under many launching
 * threads), and then the call returns CM_ETIMEDOUT while cuptiFinalize goes on in the
 * background. Until it returns nothing calls CUPTI, and cm_observe, cm_callback_arm,
 * cm_pm_sample_add, cm_cupti_attach and cm_cupti_detach fail with CM_EAGAIN, saying so; the first
 * of them after it returned finds CUPTI detached.
 * Returns 0 (detached, or already so); CM_EBUSY while an observer is registered, a consumer has
 * armed a callback, or a CUDA graph capture is in progress; CM_EAGAIN when CUPTI still holds an
 * activity buffer after the flush (it stays attached; try again later); CM_ENOSYS when the
 * libcupti has no cuptiFinalize or PM sampling has initialized CUPTI's profiler in the process;
 * CM_ESTATE once the process exits; CM_ETIMEDOUT when the flush missed the deadline (CUPTI then
 * stays attached) or cuptiFinalize did (above); CM_ECUPTI when the finalize failed. The application must not call CUPTI itself meanwhile (no
 * other tool can: CUPTI allows one subscriber), nor cm_corr_push or cm_corr_pop. Any thread, as
 * cm_observe. */
CM_EXTERN int cm_cupti_detach(cm_engine *e, uint32_t timeout_ms);
/* Attaches CUPTI again after cm_cupti_detach; 0 when attached already. Fails with CM_EBUSY when
 * another CUPTI subscriber took the process meanwhile (the detail names it). Any thread, as
 * cm_observe. */
CM_EXTERN int cm_cupti_attach(cm_engine *e);
/* 1 while CUPTI is detached, else 0. Thread-safe. */
CM_EXTERN int cm_cupti_detached(cm_engine *e);

/* Resolves a string id to its bytes (not NUL-terminated in general; *len receives the length).
 * Returns NULL for an unknown id. Thread-safe; the bytes live as long as the engine. */
CM_EXTERN const char *cm_string(cm_engine *e, uint32_t id, size_t *len);
/* The number of interned strings (ids are 0..count-1). Thread-safe. */
CM_EXTERN uint32_t cm_string_count(cm_engine *e);

typedef struct cm_stats {
  uint64_t buffers_allocated;   /* buffers ever allocated by the pool */
  uint64_t buffers_outstanding; /* buffers currently owned by CUPTI or queued for decode */
  uint64_t buffers_free;        /* buffers in the pool's free list */
  uint64_t buffers_decoded;     /* buffers decoded */
  uint64_t buffers_refused;     /* requests answered with no buffer (the pool was at its bound) */
  uint64_t bytes_decoded;       /* valid bytes of decoded buffers */
  uint64_t records_decoded;     /* all records seen by the decoder */
  uint64_t records_delivered;   /* records handed to observers: a batch counts once per observer */
  uint64_t records_dropped;     /* records lost: CUPTI had no buffer, or the engine no memory */
  uint64_t decode_queue_depth;  /* completed buffers waiting for the decoder */
  uint64_t decode_queue_peak;
  uint64_t drains;
  uint64_t fences;
  uint64_t fence_timeouts;
  uint64_t sessions;            /* activity sessions started */
  uint64_t strings;
  uint64_t records_by_kind[CM_KIND_MAX];
  /* How far behind the records the pipeline runs, measured on the newest buffer decoded: the
   * time from its last record's timestamp (end, else start) to CUPTI completing the buffer
   * (lag_cupti_ns), and to the decoder finishing it (lag_decode_ns, and its peak since the
   * engine started); decode_wait_ns is how long that buffer waited in the decode queue. 0 while
   * no buffer with a timestamp on the realtime clock has been decoded. */
  uint64_t lag_cupti_ns;
  uint64_t lag_decode_ns;
  uint64_t lag_decode_peak_ns;
  uint64_t decode_wait_ns;
  /* Filled by the monitor for an agent's process (0 from an engine): the time from the newest
   * record start of the last batch received to its arrival, now and at its peak (how far behind
   * the script's view is), and the records the agent had decoded but not yet sent at its last
   * STATS. The sum over sources (cm_host_source_stats with 0) takes the largest of each lag. */
  uint64_t lag_recv_ns;
  uint64_t lag_recv_peak_ns;
  uint64_t backlog_records;
  /* The agent's send queue: how long the last BATCH frame sent had waited in it, and the peak. */
  uint64_t send_wait_ns;
  uint64_t send_wait_peak_ns;
  /* Filled by the monitor for an agent's process (0 from an engine): the kinds its lag guard had
   * CUPTI stop writing because CUPTI fell too far behind (one bit per kind; the sum over sources
   * takes their union), and CUPTI's lag when it last did (docs/agent.md, "The lag guard"). */
  uint64_t guard_shed;
  uint64_t guard_lag_ns;
  /* Filled by the monitor for an agent's process: the longest CUPTI held a record back before
   * writing it, over the buffers of the lag guard's last check (the guard's measure; 0 while the
   * guard is off or nothing is traced). */
  uint64_t lag_held_ns;
  /* CUPTI detaches (cm_cupti_detach) since the engine was created, and the time spent detaching
   * and attaching again, summed (cuptiFinalize, and the new subscription with its callbacks). */
  uint64_t cupti_detaches;
  uint64_t cupti_detach_ns;
  uint64_t cupti_attach_ns;
  /* Changes of the kinds enabled in CUPTI since the engine was created (an observer's kinds
   * turned on or off, a duty window's opening and closing, the lag guard's sheds), and the time
   * their cuptiActivityEnable and cuptiActivityDisable calls took, summed and the longest one
   * change (the largest over sources for a sum). */
  uint64_t kind_changes;
  uint64_t kind_change_ns;
  uint64_t kind_change_max_ns;
  /* What the agent leaves CUPTI in while nothing is traced, as its last STATS said: 0 unknown
   * (the in-process engine, a capture of an older agent), 1 detached (cuptiFinalize) between
   * windows, 2 attached as CUPTIMON_DETACH_IDLE=0 asks, and attached for good because 3
   * attaching again outlasted its wait, 4 NVTX calls enter CUPTI, 5 the libcupti has no
   * cuptiFinalize or PM sampling initialized CUPTI's profiler, 6 a cuptiFinalize outlasted its
   * deadline, 7 too many threads were calling CUDA at once for CUPTI to attach again (the
   * largest over sources for a sum). */
  uint64_t cupti_idle_mode;
} cm_stats;

/* Copies the engine's counters. Thread-safe; observers may call it. */
CM_EXTERN int cm_stats_get(cm_engine *e, cm_stats *out);

typedef struct cm_session_info {
  uint32_t cupti_version;     /* cuptiGetVersion */
  int32_t clock_realtime;     /* 1 when cuptiGetTimestamp fell within a CLOCK_REALTIME bracket */
  int32_t active;             /* 1 while an activity session runs */
  int32_t timestamp_callback; /* 1 when the CLOCK_REALTIME timestamp callback is registered */
  int64_t clock_offset_ns;    /* cuptiGetTimestamp minus the bracket's midpoint */
  uint64_t session_start_ns;  /* CLOCK_REALTIME at the session's start, 0 if none */
  char cupti_path[512];       /* the libcupti that was loaded */
} cm_session_info;

/* Copies the session facts. Thread-safe; observers may call it. */
CM_EXTERN int cm_session_info_get(cm_engine *e, cm_session_info *out);

/* The kinds currently enabled in CUPTI, as a bitmask by kind value (bit k for kind k < 64).
 * Thread-safe; observers may call it. */
CM_EXTERN uint64_t cm_enabled_kinds(cm_engine *e);

/* The library version as "major.minor.patch". Thread-safe. */
CM_EXTERN const char *cm_version(void);

/* ---- external correlation ------------------------------------------------------------------
 *
 * A framework tags the GPU work issued between a push and its pop with an id of its own. Every
 * id is pushed on CUPTI's stack of one external kind, CM_CORR_EXTERNAL_KIND
 * (CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0; UNKNOWN is what tools use when they do not care, and
 * CUSTOM0 keeps our records apart from those). CUPTI then writes, for each API call, one
 * EXTERNAL_CORRELATION record {external_kind, external_id, correlation} carrying the innermost id
 * only. To recover the enclosing contexts, each push snapshots the thread's whole active stack:
 * the chain of an id is innermost..outermost, and cm_corr_chain() returns it.
 *
 * These functions need no engine handle, so a framework may call them directly or look them up
 * with dlsym in the injected agent. Without an engine, ids, chains and metadata still work but
 * nothing is pushed to CUPTI. Every function in this section is thread-safe. The stacks are per
 * thread, as CUPTI's are.
 *
 * Lifetime of a chain: it is created by the push and retired two drains after the pop (a drain is
 * one delivery of batches to observers), so the records delivered in the drain that follows the
 * pop, and in the one after it, still resolve. An id that was never pushed, or whose chain was
 * retired, resolves to nothing (cm_corr_chain returns 0).
 */

/* The CUpti_ExternalCorrelationKind the engine pushes its ids with (CUSTOM0). */
enum { CM_CORR_EXTERNAL_KIND = 3 };
/* The deepest stack a thread may push; deeper pushes fail with CM_ERANGE. */
enum { CM_CORR_MAX_DEPTH = 256 };

/* Allocates a new process-unique id (> 0), pushes it and returns it; 0 on failure (out of memory
 * or CM_CORR_MAX_DEPTH, with cm_errmsg() set). A push that CUPTI rejects still succeeds here: the
 * frame is kept so that the matching pop stays balanced, and CUPTI goes on tagging records with
 * the enclosing id. */
CM_EXTERN uint64_t cm_corr_push(void);
/* Pushes a caller-chosen id (> 0). The caller keeps ids unique; an id pushed twice while its
 * first chain lives replaces that chain. Returns 0 or CM_EINVAL, CM_ENOMEM, CM_ERANGE. */
CM_EXTERN int cm_corr_push_id(uint64_t id);
/* Pops the calling thread's innermost frame and stores its id in *id (id may be NULL). CUPTI's
 * stack is popped only when CUPTI accepted that frame's push. With nothing pushed, returns
 * CM_ENOENT and changes nothing. */
CM_EXTERN int cm_corr_pop(uint64_t *id);
/* The id CUPTI is tagging the calling thread's work with: the innermost frame whose push was not
 * rejected, or 0 when there is none. */
CM_EXTERN uint64_t cm_corr_current(void);
/* The number of frames on the calling thread's stack (rejected pushes included). */
CM_EXTERN int cm_corr_depth(void);
/* Copies the chain of `id` (innermost first, so out[0] == id) into out[0..max) and returns its
 * full length (which may exceed max), or 0 when the id is unknown or retired. */
CM_EXTERN int cm_corr_chain(uint64_t id, uint64_t *out, int max);

/* Batch join for observers. Given the columns of one external_correlation batch (ec_kind may be
 * NULL to accept every external kind, else only CM_CORR_EXTERNAL_KIND rows are used) and the
 * correlation column of a kernel (or any other) batch, writes for each of the n rows the external
 * id its launch was tagged with, or 0. Returns 0 or CM_EINVAL/CM_ENOMEM. */
CM_EXTERN int cm_corr_join(const uint32_t *ec_kind, const uint64_t *ec_external_id,
                           const uint32_t *ec_correlation, uint32_t n_ec,
                           const uint32_t *correlation, uint32_t n, uint64_t *external_out);
/* Like cm_corr_join, but resolves each row to its whole chain, in CSR form: the chain of row i is
 * ids[offsets[i] .. offsets[i+1]) (innermost first; empty when untagged or retired). `offsets`
 * holds n + 1 entries. Returns the number of ids the result needs; when that exceeds cap_ids the
 * ids array is not written past cap_ids and offsets are still complete, so the caller can grow
 * the array and call again. Negative on error. */
CM_EXTERN int64_t cm_corr_join_chains(const uint32_t *ec_kind, const uint64_t *ec_external_id,
                                      const uint32_t *ec_correlation, uint32_t n_ec,
                                      const uint32_t *correlation, uint32_t n, uint32_t *offsets,
                                      uint64_t *ids, uint32_t cap_ids);

/* Metadata. A blob is JSON text (at most CM_CORR_MAX_JSON bytes and CM_CORR_MAX_NESTING levels).
 * Blobs put on one id are merged recursively: objects merge key by key, and on any other conflict
 * (a scalar, an array, or a type change) the later value wins. Arrays are leaves. Invalid JSON is
 * rejected with CM_EINVAL and a detail giving the byte offset; nothing is stored then. id 0 means
 * cm_corr_current() (CM_ENOENT when there is none). */
enum { CM_CORR_MAX_JSON = 1 << 20, CM_CORR_MAX_NESTING = 64 };
CM_EXTERN int cm_corr_metadata_put(uint64_t id, const char *json, size_t len);
/* Moves out every blob put since the last take, as one JSON object {"<id>": blob, ...} with ids
 * as decimal strings in ascending order ("{}" when empty), and resets the store. *json_out is
 * NUL-terminated and is freed with cm_free(); *len_out (may be NULL) receives its length. */
CM_EXTERN int cm_corr_metadata_take(char **json_out, size_t *len_out);
/* Frees memory the library handed out (cm_corr_metadata_take). NULL is accepted. Thread-safe. */
CM_EXTERN void cm_free(void *p);

/* ---- subscriber callbacks ------------------------------------------------------------------
 *
 * Handlers for CUPTI callbacks (domain, cbid), run synchronously on the application thread that
 * made the CUDA call, inside that call. `cbdata` is CUPTI's callback data for the domain
 * (CUpti_CallbackData for RUNTIME and DRIVER, CUpti_ResourceData or CUpti_ModuleResourceData for
 * RESOURCE, and so on), valid only during the call. A handler returns 0; a non-zero return counts
 * as a failure (cm_callback_stats), is logged once per (domain, cbid), and never keeps the other
 * handlers from running. A handler must be cheap, must not block, and must not call
 * cm_engine_free.
 *
 * Registering does not enable a callback: cm_callback_arm() does, refcounted per (domain, cbid),
 * so CUPTI is asked to enable it on the first arm and to disable it on the last disarm; two
 * consumers arming the same callback for different windows do not disable each other. Removing
 * the last handler of a (domain, cbid) disables it whatever its arm count. Handlers and arms live
 * on the engine's subscription, which is independent of the activity session: they keep working
 * before the first observer and after the last one, until cm_engine_free.
 *
 * Thread rules: register, unregister, arm and disarm are thread-safe and may run while callbacks
 * are dispatched on other threads. When cm_callback_unregister returns, the handler is not
 * running and will not run again (unless it was called from inside a dispatch on this thread).
 */
typedef int (*cm_callback_fn)(void *ud, int domain, uint32_t cbid, const void *cbdata);

CM_EXTERN int cm_callback_register(cm_engine *e, int domain, uint32_t cbid, cm_callback_fn fn,
                                   void *ud, uint32_t *handle);
/* Returns CM_ENOENT for an unknown handle. */
CM_EXTERN int cm_callback_unregister(cm_engine *e, uint32_t handle);
/* Arms (enables) or disarms one callback. Disarming one that is not armed returns CM_ENOENT.
 * A failed cuptiEnableCallback leaves the count unchanged and returns CM_ECUPTI. */
CM_EXTERN int cm_callback_arm(cm_engine *e, int domain, uint32_t cbid);
CM_EXTERN int cm_callback_disarm(cm_engine *e, int domain, uint32_t cbid);
/* The arm count of (domain, cbid), or a negative error. Thread-safe. */
CM_EXTERN int cm_callback_armed(cm_engine *e, int domain, uint32_t cbid);

typedef struct cm_callback_stats {
  uint64_t dispatched;       /* callbacks received from CUPTI */
  uint64_t handler_calls;    /* handler invocations */
  uint64_t handler_failures; /* handler invocations that returned non-zero */
  uint64_t handlers;         /* handlers registered now */
  uint64_t armed;            /* (domain, cbid) pairs enabled in CUPTI now */
  uint64_t resource_records; /* resource-kind records produced */
  uint64_t resource_dropped; /* resource-kind records dropped (the side queue was full) */
} cm_callback_stats;

/* Copies the callback counters. Thread-safe. */
CM_EXTERN int cm_callback_stats_get(cm_engine *e, cm_callback_stats *out);

/* ---- PM sampling ---------------------------------------------------------------------------
 *
 * PM sampling reads the GPU's performance-monitor counters at a fixed interval (CUPTI's
 * cupti_pmsampling.h), so a script sees how busy the hardware was beside the records of what
 * ran. It is opt-in and per device. Each consumer names its metrics ("sm__cycles_active.avg",
 * ...); the engine runs one sampling session per device over the union of the metrics of that
 * device's consumers, at the shortest interval any of them asked for. The session starts with the
 * device's first consumer and stops after its last; a change of the union restarts it. Samples
 * are polled when the engine delivers (the delivery cadence or a flush), decoded and evaluated
 * there, and delivered as CM_KIND_PM_SAMPLE records: one record per (sample, metric), with the
 * sample's start and stop on the record clock (CLOCK_REALTIME ns), the device, the metric name
 * (a string id) and its value. Observers select that kind like any other.
 *
 * Failures name what to do: CM_EPERM when the driver restricts profiling counters to admin users
 * (NVreg_RestrictProfilingToAdminUsers=1), CM_ENOENT for a metric the device cannot sample (the
 * detail names it), CM_ENOSYS when the metrics need more than one pass or this libcupti has no
 * PM sampling, CM_EAGAIN when the device is not ready yet (its driver is still initializing, or
 * the application has not created its CUDA context on the device yet: try again shortly), CM_ECUPTI for any other CUPTI failure (the detail carries CUPTI's own text).
 * Not thread-safe against other control calls of the same engine (they serialize on it). */

/* Adds a consumer of `nmetrics` metrics on `device` at `interval_us` microseconds (at least
 * 20). On success *id receives a handle for cm_pm_sample_remove. A failure leaves the sessions
 * as they were. */
CM_EXTERN int cm_pm_sample_add(cm_engine *e, int device, const char *const *metrics,
                               uint32_t nmetrics, uint32_t interval_us, uint32_t *id);
/* Removes a consumer; its device's session is polled one last time, then restarted over the
 * remaining union or stopped. CM_ENOENT for an unknown id. */
CM_EXTERN int cm_pm_sample_remove(cm_engine *e, uint32_t id);

typedef struct cm_pm_stats {
  uint64_t consumers;  /* consumers registered now */
  uint64_t sessions;   /* device sessions started, ever */
  uint64_t polls;      /* polls of a running session */
  uint64_t samples;    /* samples decoded and handed to the observers' drain */
  uint64_t filtered;   /* samples discarded: their timestamps were not on the record clock */
  uint64_t overflows;  /* polls that found the hardware buffer had overflowed (samples lost) */
  uint64_t dropped;    /* samples lost for want of memory or a failed evaluation, and polls
                        * lost because the device's context was gone (its samples with it) */
} cm_pm_stats;

/* Copies the PM sampling counters. Thread-safe. */
CM_EXTERN int cm_pm_stats_get(cm_engine *e, cm_pm_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* CUPTIMON_H */
