/*
 * test_fake.c: checks the fake CUPTI on its own, without the engine, so an engine test that fails
 * can trust its test double. It registers its own buffer callbacks and asserts the fake's
 * contracts: every record arrives exactly once (per-kind counts and a content checksum) while
 * producers and flushes race, pending records wait for a device sync, syncs write a
 * SYNCHRONIZATION record, missing buffers are counted as drops, the subscriber rules hold, and
 * the driver calls behave as documented.
 */
/* cuda.h declares the driver calls with CUresult/CUcontext; the fake exports them with the
 * engine's int/void* view, so cuda.h's declarations are renamed out of the way. */
#define cuCtxGetCurrent cudah_cuCtxGetCurrent
#define cuCtxSynchronize cudah_cuCtxSynchronize
#define cuDeviceGetCount cudah_cuDeviceGetCount
#define cuDevicePrimaryCtxGetState cudah_cuDevicePrimaryCtxGetState
#define cuDevicePrimaryCtxRetain cudah_cuDevicePrimaryCtxRetain
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <cupti.h>
#pragma GCC diagnostic pop
#undef cuCtxGetCurrent
#undef cuCtxSynchronize
#undef cuDeviceGetCount
#undef cuDevicePrimaryCtxGetState
#undef cuDevicePrimaryCtxRetain
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuDevicePrimaryCtxRelease

#include "cmt.h"
#include "fake/fake_cupti.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

/* The fake's libcuda calls, as the engine's binding sees them. */
int cuCtxGetCurrent(void **ctx);
int cuCtxSynchronize(void);
int cuDeviceGetCount(int *count);
int cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuDevicePrimaryCtxRelease(int dev);
int cuCtxPushCurrent(void *ctx);
int cuCtxPopCurrent(void **ctx);

#define BUF_SIZE (32u * 1024u)
#define MAX_CAPTURE 4096

/* What the completion callback has seen; rx.lock guards all of it. */
static struct {
  pthread_mutex_t lock;
  uint64_t per_kind[CUPTI_ACTIVITY_KIND_COUNT];
  uint64_t total;
  uint64_t hash_sum;
  uint64_t bad_kind;
  uint64_t buffers;
  size_t dropped_in_cb;
  int capture;
  size_t ncap;
  uint64_t cap[MAX_CAPTURE][32]; /* copies of records, 8-byte aligned */
} rx = {.lock = PTHREAD_MUTEX_INITIALIZER};

static atomic_int no_buffer;         /* request callback gives nothing */
static atomic_int query_drops_in_cb; /* completion callback asks for drops */
static atomic_long outstanding;      /* buffers lent to the fake */

static void request_cb(uint8_t **buffer, size_t *size, size_t *max_records) {
  *max_records = 0;
  if (atomic_load(&no_buffer)) {
    *buffer = NULL;
    *size = 0;
    return;
  }
  *buffer = aligned_alloc(8, BUF_SIZE);
  *size = *buffer ? BUF_SIZE : 0;
  if (*buffer) atomic_fetch_add(&outstanding, 1);
}

/* FNV-1a over the record's bytes: order-independent when summed, so a lost record and a
 * duplicated one cannot cancel out the way they would in counts alone. */
static uint64_t rec_hash(const void *p, size_t n) {
  const uint8_t *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static uint32_t rec_kind(const void *r) {
  uint32_t k;
  memcpy(&k, r, sizeof k);
  return k;
}

static size_t rec_size(const void *r) {
  switch (rec_kind(r)) {
  case CUPTI_ACTIVITY_KIND_KERNEL:
  case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return sizeof(CUpti_ActivityKernel10);
  case CUPTI_ACTIVITY_KIND_MEMCPY: return sizeof(CUpti_ActivityMemcpy6);
  case CUPTI_ACTIVITY_KIND_MEMCPY2: return sizeof(CUpti_ActivityMemcpyPtoP4);
  case CUPTI_ACTIVITY_KIND_MEMSET: return sizeof(CUpti_ActivityMemset4);
  case CUPTI_ACTIVITY_KIND_RUNTIME:
  case CUPTI_ACTIVITY_KIND_DRIVER: return sizeof(CUpti_ActivityAPI);
  case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: return sizeof(CUpti_ActivitySynchronization2);
  case CUPTI_ACTIVITY_KIND_CUDA_EVENT: return sizeof(CUpti_ActivityCudaEvent2);
  case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: return sizeof(CUpti_ActivityExternalCorrelation);
  case CUPTI_ACTIVITY_KIND_MARKER: return sizeof(CUpti_ActivityMarker2);
  case CUPTI_ACTIVITY_KIND_MARKER_DATA: return sizeof(CUpti_ActivityMarkerData2);
  case CUPTI_ACTIVITY_KIND_OVERHEAD: return sizeof(CUpti_ActivityOverhead3);
  case CUPTI_ACTIVITY_KIND_GRAPH_TRACE: return sizeof(CUpti_ActivityGraphTrace2);
  case CUPTI_ACTIVITY_KIND_MEMORY2: return sizeof(CUpti_ActivityMemory4);
  case CUPTI_ACTIVITY_KIND_MEMORY_POOL: return sizeof(CUpti_ActivityMemoryPool3);
  case CUPTI_ACTIVITY_KIND_DEVICE: return sizeof(CUpti_ActivityDevice5);
  case CUPTI_ACTIVITY_KIND_CONTEXT: return sizeof(CUpti_ActivityContext3);
  case CUPTI_ACTIVITY_KIND_NAME: return sizeof(CUpti_ActivityName);
  case CUPTI_ACTIVITY_KIND_STREAM: return sizeof(CUpti_ActivityStream);
  case CUPTI_ACTIVITY_KIND_ENVIRONMENT: return sizeof(CUpti_ActivityEnvironment);
  default: return 0;
  }
}

static void complete_cb(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                        size_t valid) {
  size_t dropped = 0;
  if (atomic_load(&query_drops_in_cb))
    CMT_EQ(cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped), CUPTI_SUCCESS);
  CMT_ASSERT(ctx == NULL);
  CMT_EQ(stream, 0);
  CMT_EQ(size, BUF_SIZE);
  CMT_LEU(valid, size);
  pthread_mutex_lock(&rx.lock);
  rx.buffers++;
  rx.dropped_in_cb += dropped;
  CUpti_Activity *r = NULL;
  size_t walked = 0;
  CUptiResult res;
  while ((res = cuptiActivityGetNextRecord(buffer, valid, &r)) == CUPTI_SUCCESS) {
    size_t n = rec_size(r);
    if (!n) {
      rx.bad_kind++;
      break;
    }
    rx.per_kind[r->kind]++;
    rx.total++;
    rx.hash_sum += rec_hash(r, n);
    walked += n;
    if (rx.capture && rx.ncap < MAX_CAPTURE) memcpy(rx.cap[rx.ncap++], r, n);
  }
  CMT_EQ(res, CUPTI_ERROR_MAX_LIMIT_REACHED);
  CMT_EQU(walked, valid);
  pthread_mutex_unlock(&rx.lock);
  free(buffer);
  atomic_fetch_sub(&outstanding, 1);
}

static void rx_reset(int capture) {
  pthread_mutex_lock(&rx.lock);
  memset(rx.per_kind, 0, sizeof rx.per_kind);
  rx.total = rx.hash_sum = rx.bad_kind = rx.buffers = 0;
  rx.dropped_in_cb = 0;
  rx.capture = capture;
  rx.ncap = 0;
  pthread_mutex_unlock(&rx.lock);
}

static uint64_t rx_total(void) {
  pthread_mutex_lock(&rx.lock);
  uint64_t n = rx.total;
  pthread_mutex_unlock(&rx.lock);
  return n;
}

/* Returns the index of the last captured record of `kind`, or -1. Caller holds no lock; the
 * capture is read only after a flush has returned. */
static long find_last(uint32_t kind) {
  long at = -1;
  pthread_mutex_lock(&rx.lock);
  for (size_t i = 0; i < rx.ncap; i++)
    if (rec_kind(rx.cap[i]) == kind) at = (long)i;
  pthread_mutex_unlock(&rx.lock);
  return at;
}

static void enable_all_gen_kinds(void) {
  int k[64];
  int n = fake_gen_kinds(k, 64);
  CMT_EQ(n, 20);
  for (int i = 0; i < n; i++) CMT_EQ(cuptiActivityEnable((CUpti_ActivityKind)k[i]), 0);
}

/* Drains every buffer, so each test starts from an empty fake. */
static void drain(void) { CMT_EQ(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), 0); }

/* ---- tests ------------------------------------------------------------------------------- */

static void test_basics(void) {
  uint32_t v = 0;
  CMT_EQ(cuptiGetVersion(&v), CUPTI_SUCCESS);
  CMT_EQ(v, 130001);
  const char *s = NULL;
  CMT_EQ(cuptiGetResultString(CUPTI_ERROR_QUEUE_EMPTY, &s), CUPTI_SUCCESS);
  CMT_STREQ(s, "CUPTI_ERROR_QUEUE_EMPTY");

  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t before = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec, t = 0;
  CMT_EQ(cuptiGetTimestamp(&t), CUPTI_SUCCESS);
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t after = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  CMT_LEU(before, t);
  CMT_LEU(t, after);
}

static void test_generator(void) {
  uint64_t a[32], b[32];
  int k[64];
  int n = fake_gen_kinds(k, 64);
  for (int i = 0; i < n; i++) {
    size_t sa = fake_gen_record(k[i], 3, 77, a);
    size_t sb = fake_gen_record(k[i], 3, 77, b);
    CMT_GT(sa, 0);
    CMT_EQU(sa, sb);
    CMT_EQ(memcmp(a, b, sa), 0); /* deterministic */
    CMT_EQU(rec_kind(a), (uint32_t)k[i]);
    CMT_EQU(sa, rec_size(a));
    fake_gen_record(k[i], 3, 78, b);
    CMT_NE(memcmp(a, b, sa), 0); /* depends on seq */
    fake_gen_record(k[i], 4, 77, b);
    CMT_NE(memcmp(a, b, sa), 0); /* depends on thread */
  }
  CUpti_ActivityKernel10 kr;
  CMT_EQU(fake_gen_record(CUPTI_ACTIVITY_KIND_KERNEL, 0, 5, &kr), sizeof kr);
  CMT_EQ(kr.kind, CUPTI_ACTIVITY_KIND_KERNEL);
  CMT_LT(kr.start, kr.end);
  CMT_ASSERT(kr.name != NULL);
  CUpti_ActivitySynchronization2 sy;
  fake_gen_record(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, 3, 100000, &sy);
  CMT_LT(sy.end, 1000000000000000ll); /* never mistaken for a fence's sync */
  CMT_EQU(fake_gen_record(CUPTI_ACTIVITY_KIND_PC_SAMPLING, 0, 0, a), 0);
}

static atomic_int flusher_stop;

/* Flushes in a loop while producers write, mostly plain and now and then forced. */
static void *flusher_main(void *arg) {
  (void)arg;
  for (unsigned i = 0; !atomic_load(&flusher_stop); i++) {
    CMT_EQ(cuptiActivityFlushAll(i % 8 == 7 ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0), 0);
    sched_yield();
  }
  return NULL;
}

/* 4 threads x 50k mixed records, flushed concurrently: each one arrives exactly once. */
static void test_workload_exactly_once(void) {
  enum { THREADS = 4, PER_THREAD = 50000 };
  int kinds[64];
  int nk = fake_gen_kinds(kinds, 64);
  uint64_t want[CUPTI_ACTIVITY_KIND_COUNT] = {0}, want_hash = 0;
  uint64_t rec[32];
  for (uint32_t t = 0; t < THREADS; t++)
    for (uint64_t j = 0; j < PER_THREAD; j++) {
      size_t n = fake_gen_record(kinds[j % (uint64_t)nk], t, j, rec);
      want[kinds[j % (uint64_t)nk]]++;
      want_hash += rec_hash(rec, n);
    }

  rx_reset(0);
  fake_stats s0, s1;
  fake_get_stats(&s0);
  pthread_t fl;
  atomic_store(&flusher_stop, 0);
  CMT_EQ(pthread_create(&fl, NULL, flusher_main, NULL), 0);
  int64_t written = fake_run_workload(THREADS, PER_THREAD, kinds, nk);
  atomic_store(&flusher_stop, 1);
  pthread_join(fl, NULL);
  CMT_EQ(written, THREADS * PER_THREAD);

  /* Nothing is pending, so a plain flush delivers the rest. */
  CMT_EQ(cuptiActivityFlushAll(0), 0);
  fake_get_stats(&s1);
  CMT_EQU(s1.records_written - s0.records_written, (uint64_t)written);
  CMT_EQU(s1.records_dropped, s0.records_dropped);
  pthread_mutex_lock(&rx.lock);
  CMT_EQU(rx.total, (uint64_t)written);
  CMT_EQU(rx.bad_kind, 0);
  for (int k = 0; k < CUPTI_ACTIVITY_KIND_COUNT; k++) {
    if (rx.per_kind[k] != want[k]) CMT_FAIL("kind %d: got %" PRIu64 " want %" PRIu64, k,
                                            rx.per_kind[k], want[k]);
  }
  CMT_EQU(rx.hash_sum, want_hash);
  CMT_GT(rx.buffers, 100); /* many buffers, so the full-buffer path ran too */
  pthread_mutex_unlock(&rx.lock);
  CMT_EQ(atomic_load(&outstanding), 0);
}

/* Free-running producers with flushes racing them: the count written is the count received. */
static void test_producers(void) {
  int kinds[64];
  int nk = fake_gen_kinds(kinds, 64);
  rx_reset(0);
  CMT_EQ(fake_start_producers(3, kinds, nk), 0);
  CMT_EQ(fake_start_producers(3, kinds, nk), -1); /* one set at a time */
  fake_stats s0, s;
  fake_get_stats(&s0);
  /* Flush while they write, until they have written a fair amount (or 20 s have passed). */
  for (int i = 0; i < 20000; i++) {
    CMT_EQ(cuptiActivityFlushAll(i % 5 ? 0 : CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), 0);
    fake_get_stats(&s);
    if (s.records_written - s0.records_written > 100000) break;
    usleep(1000);
  }
  int64_t n = fake_stop_producers();
  CMT_GT(n, 0);
  CMT_EQ(cuptiActivityFlushAll(0), 0);
  CMT_EQU(rx_total(), (uint64_t)n);
  CMT_EQ(atomic_load(&outstanding), 0);
  CMT_EQ(fake_stop_producers(), -1);
}

static void test_disabled_kind(void) {
  uint64_t rec[32];
  size_t n = fake_gen_record(CUPTI_ACTIVITY_KIND_MEMSET, 0, 1, rec);
  CMT_EQ(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET), 0);
  CMT_EQ(fake_kind_enabled(CUPTI_ACTIVITY_KIND_MEMSET), 0);
  CMT_EQ(fake_emit(rec, n, 0), 2);
  CMT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), 0);
  CMT_EQ(fake_kind_enabled(CUPTI_ACTIVITY_KIND_MEMSET), 1);
  CMT_EQ(fake_emit(rec, n, 1 - 1), 0);
  CMT_EQ(fake_emit(rec, n - 8, 0), -1); /* wrong size for the kind */
  drain();
}

/* A pending kernel holds its buffer back from a plain flush until a device sync; the buffers
 * that filled up after it are delivered meanwhile. */
static void test_pending(void) {
  drain();
  CMT_EQ(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION), 0);
  CMT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_KERNEL), 0);
  rx_reset(1);
  CUpti_ActivityKernel10 k;
  fake_gen_record(CUPTI_ACTIVITY_KIND_KERNEL, 9, 1, &k);
  uint64_t end = k.end;
  CMT_EQ(fake_emit(&k, sizeof k, 1), 0);
  CMT_EQ(cuptiActivityFlushAll(0), 0);
  CMT_EQU(rx_total(), 0); /* withheld */

  /* Fill past the first buffer: later buffers complete, the one with the kernel waits. */
  uint64_t rec[32];
  size_t per = fake_gen_record(CUPTI_ACTIVITY_KIND_RUNTIME, 9, 0, rec);
  uint64_t extra = 3 * BUF_SIZE / per;
  for (uint64_t j = 0; j < extra; j++) {
    fake_gen_record(CUPTI_ACTIVITY_KIND_RUNTIME, 9, j, rec);
    CMT_EQ(fake_emit(rec, per, 0), 0);
  }
  CMT_EQ(cuptiActivityFlushAll(0), 0);
  uint64_t got = rx_total();
  CMT_GT(got, 0);
  CMT_LT(got, extra);
  CMT_EQ(find_last(CUPTI_ACTIVITY_KIND_KERNEL), -1);

  CMT_EQ(cuCtxSynchronize(), 0);
  CMT_EQ(cuptiActivityFlushAll(0), 0);
  CMT_EQU(rx_total(), extra + 1);
  long at = find_last(CUPTI_ACTIVITY_KIND_KERNEL);
  CMT_GE(at, 0);
  CUpti_ActivityKernel10 got_k;
  memcpy(&got_k, rx.cap[at], sizeof got_k);
  CMT_EQU(got_k.end, end);

  /* Forced: delivered at once, with end == 0. */
  rx_reset(1);
  CMT_EQ(fake_emit(&k, sizeof k, 1), 0);
  CMT_EQ(cuptiActivityFlushAll(0), 0);
  CMT_EQU(rx_total(), 0);
  CMT_EQ(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), 0);
  CMT_EQU(rx_total(), 1);
  memcpy(&got_k, rx.cap[find_last(CUPTI_ACTIVITY_KIND_KERNEL)], sizeof got_k);
  CMT_EQU(got_k.end, 0);
  CMT_EQU(got_k.start, k.start);
  /* A later sync has nothing left to release. */
  CMT_EQ(cuCtxSynchronize(), 0);
  CMT_EQ(cuptiActivityFlushAll(0), 0);
  CMT_EQU(rx_total(), 1);
}

static void test_sync_record(void) {
  drain();
  CMT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION), 0);
  rx_reset(1);
  uint64_t rec[32];
  size_t n = fake_gen_record(CUPTI_ACTIVITY_KIND_MEMCPY, 0, 0, rec);
  CMT_EQ(fake_emit(rec, n, 0), 0);
  uint64_t mark = fake_now();
  CMT_EQ(cuCtxSynchronize(), 0);
  CMT_EQ(cuptiActivityFlushAll(0), 0);
  long at = find_last(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  CMT_GE(at, 0);
  CUpti_ActivitySynchronization2 sy;
  memcpy(&sy, rx.cap[at], sizeof sy);
  CMT_EQ(sy.type, CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE);
  CMT_EQU(sy.start, sy.end);
  CMT_LEU(mark, sy.end);
  CMT_EQU(rx_total(), 2);

  /* Suppressed: the sync still happens, but writes nothing. */
  fake_set_suppress_sync_records(1);
  rx_reset(1);
  CMT_EQ(cuCtxSynchronize(), 0);
  CMT_EQ(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), 0);
  CMT_EQU(rx_total(), 0);
  fake_set_suppress_sync_records(0);

  /* Disabled: likewise nothing. */
  CMT_EQ(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION), 0);
  CMT_EQ(cuCtxSynchronize(), 0);
  CMT_EQ(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), 0);
  CMT_EQU(rx_total(), 0);
  CMT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION), 0);
}

static void test_drops(void) {
  drain(); /* no current buffer: the next record asks for one */
  rx_reset(0);
  size_t d = 0;
  CMT_EQ(cuptiActivityGetNumDroppedRecords(NULL, 0, &d), 0); /* clear */
  fake_stats s0, s1;
  fake_get_stats(&s0);
  uint64_t rec[32];
  size_t n = fake_gen_record(CUPTI_ACTIVITY_KIND_DRIVER, 1, 1, rec);
  atomic_store(&no_buffer, 1);
  for (int i = 0; i < 10; i++) CMT_EQ(fake_emit(rec, n, 0), 1);
  atomic_store(&no_buffer, 0);
  fake_get_stats(&s1);
  CMT_EQU(s1.records_dropped - s0.records_dropped, 10);

  /* The completion callback may ask, and gets the drops so far; the next ask gets none. */
  atomic_store(&query_drops_in_cb, 1);
  CMT_EQ(fake_emit(rec, n, 0), 0);
  CMT_EQ(cuptiActivityFlushAll(0), 0);
  atomic_store(&query_drops_in_cb, 0);
  pthread_mutex_lock(&rx.lock);
  CMT_EQU(rx.dropped_in_cb, 10);
  CMT_EQU(rx.total, 1);
  pthread_mutex_unlock(&rx.lock);
  CMT_EQ(cuptiActivityGetNumDroppedRecords(NULL, 0, &d), 0);
  CMT_EQU(d, 0);
}

static void test_external_correlation(void) {
  drain();
  CMT_EQ(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION), 0);
  rx_reset(1);
  CMT_EQ(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 41), 0);
  CMT_EQ(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 42), 0);
  CUpti_ActivityAPI api;
  fake_gen_record(CUPTI_ACTIVITY_KIND_RUNTIME, 2, 5, &api);
  CMT_EQ(fake_emit(&api, sizeof api, 0), 0);
  CMT_EQ(cuptiActivityFlushAll(0), 0);
  CMT_EQU(rx_total(), 2);
  const CUpti_ActivityExternalCorrelation *ec = (const void *)rx.cap[0];
  CMT_EQ(ec->kind, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION); /* ahead of the API record */
  CMT_EQ(ec->externalKind, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
  CMT_EQU(ec->externalId, 42);
  CMT_EQU(ec->correlationId, api.correlationId);

  uint64_t id = 0;
  CMT_EQ(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1, &id),
         CUPTI_ERROR_QUEUE_EMPTY); /* stacks are per kind */
  CMT_EQ(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id), 0);
  CMT_EQU(id, 42);
  CMT_EQ(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id), 0);
  CMT_EQU(id, 41);
  CMT_EQ(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id),
         CUPTI_ERROR_QUEUE_EMPTY);
}

static void test_next_record_edges(void) {
  uint64_t buf[64];
  memset(buf, 0, sizeof buf);
  size_t n = fake_gen_record(CUPTI_ACTIVITY_KIND_STREAM, 0, 0, buf);
  uint32_t bogus = CUPTI_ACTIVITY_KIND_PC_SAMPLING;
  memcpy((uint8_t *)buf + n, &bogus, sizeof bogus);
  CUpti_Activity *r = NULL;
  CMT_EQ(cuptiActivityGetNextRecord((uint8_t *)buf, n, &r), CUPTI_SUCCESS);
  CMT_ASSERT((void *)r == (void *)buf);
  CMT_EQ(cuptiActivityGetNextRecord((uint8_t *)buf, n, &r), CUPTI_ERROR_MAX_LIMIT_REACHED);
  r = NULL;
  CMT_EQ(cuptiActivityGetNextRecord((uint8_t *)buf, n + 16, &r), CUPTI_SUCCESS);
  CMT_EQ(cuptiActivityGetNextRecord((uint8_t *)buf, n + 16, &r), CUPTI_ERROR_INVALID_KIND);
  r = NULL;
  CMT_EQ(cuptiActivityGetNextRecord((uint8_t *)buf, 0, &r), CUPTI_ERROR_MAX_LIMIT_REACHED);
}

static int cb_calls;
static const void *cb_last;
static void subscriber_cb(void *ud, CUpti_CallbackDomain d, CUpti_CallbackId id, const void *p) {
  CMT_ASSERT(ud == &cb_calls);
  cb_calls++;
  cb_last = p;
}

static void test_subscriber(void) {
  CUpti_SubscriberHandle h = NULL, h2 = NULL;
  char old[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN] = "";
  CUpti_SubscriberParams p = {.structSize = CUpti_SubscriberParams_STRUCT_SIZE,
                              .subscriberName = "test_fake",
                              .oldSubscriberName = old,
                              .oldSubscriberSize = sizeof old};
  fake_set_foreign_subscriber("Nsight Systems");
  CMT_EQ(cuptiSubscribe_v2(&h, subscriber_cb, &cb_calls, &p),
         CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  CMT_STREQ(old, "Nsight Systems");
  CMT_EQ(cuptiSubscribe(&h, subscriber_cb, &cb_calls),
         CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  fake_set_foreign_subscriber(NULL);

  CMT_EQ(cuptiSubscribe_v2(&h, subscriber_cb, &cb_calls, &p), 0);
  old[0] = '\0';
  CMT_EQ(cuptiSubscribe_v2(&h2, subscriber_cb, NULL, &p),
         CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED); /* one subscriber at a time */
  CMT_CONTAINS(old, "test_fake");

  int data = 7;
  CMT_EQ(fake_fire_callback(CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING,
                            &data), 0);
  CMT_EQ(cuptiEnableCallback(1, h, CUPTI_CB_DOMAIN_RESOURCE,
                             CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING), 0);
  CMT_EQ(fake_fire_callback(CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING,
                            &data), 1);
  CMT_EQ(cb_calls, 1);
  CMT_ASSERT(cb_last == &data);
  CMT_EQ(fake_fire_callback(CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_CREATED, &data),
         0);
  CMT_EQ(cuptiEnableDomain(1, h, CUPTI_CB_DOMAIN_RUNTIME_API), 0);
  CMT_EQ(fake_fire_callback(CUPTI_CB_DOMAIN_RUNTIME_API, 211, &data), 1);
  CMT_EQ(cuptiEnableDomain(0, h, CUPTI_CB_DOMAIN_RUNTIME_API), 0);
  CMT_EQ(fake_fire_callback(CUPTI_CB_DOMAIN_RUNTIME_API, 211, &data), 0);
  CMT_EQ(cb_calls, 2);

  CMT_EQ(cuptiUnsubscribe(h), 0);
  CMT_EQ(fake_fire_callback(CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING,
                            &data), 0);
  CMT_NE(cuptiUnsubscribe(h), 0);
  CMT_EQ(cuptiSubscribe(&h, subscriber_cb, &cb_calls), 0); /* free again */
  CMT_EQ(cuptiUnsubscribe(h), 0);
}

static void test_driver(void) {
  void *ctx = NULL;
  int n = -1, active = 0;
  unsigned flags = 1;
  CMT_EQ(cuCtxGetCurrent(&ctx), 0);
  CMT_ASSERT(ctx != NULL);
  CMT_EQ(cuDeviceGetCount(&n), 0);
  CMT_EQ(n, 1);
  CMT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), 0);
  CMT_EQ(active, 1);
  void *prim = NULL;
  CMT_EQ(cuDevicePrimaryCtxRetain(&prim, 0), 0);
  CMT_ASSERT(prim == ctx);

  fake_set_no_context(1);
  CMT_EQ(cuCtxGetCurrent(&ctx), 0);
  CMT_ASSERT(ctx == NULL);
  CMT_EQ(cuDeviceGetCount(&n), 0);
  CMT_EQ(n, 0);
  CMT_NE(cuCtxSynchronize(), 0);
  /* A pushed context is current even then. */
  CMT_EQ(cuCtxPushCurrent(prim), 0);
  CMT_EQ(cuCtxGetCurrent(&ctx), 0);
  CMT_ASSERT(ctx == prim);
  CMT_EQ(cuCtxSynchronize(), 0);
  void *popped = NULL;
  CMT_EQ(cuCtxPopCurrent(&popped), 0);
  CMT_ASSERT(popped == prim);
  CMT_NE(cuCtxPopCurrent(&popped), 0);
  fake_set_no_context(0);
  CMT_EQ(cuDevicePrimaryCtxRelease(0), 0);
}

static uint64_t fixed_clock(void) { return 123456789ull; }

static void test_timestamp_callback(void) {
  CMT_EQ(cuptiActivityRegisterTimestampCallback(fixed_clock), 0);
  CMT_EQU(fake_now(), 123456789ull);
  uint64_t t = 0;
  CMT_EQ(cuptiGetTimestamp(&t), 0);
  CMT_EQU(t, 123456789ull);
  fake_stats s;
  fake_get_stats(&s);
  CMT_EQ(s.timestamp_callback_registrations, 1);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  test_basics();
  test_generator();
  test_next_record_edges();
  test_subscriber();
  test_driver();
  CMT_EQ(cuptiActivityRegisterCallbacks(request_cb, complete_cb), 0);
  enable_all_gen_kinds();
  test_workload_exactly_once();
  test_producers();
  test_disabled_kind();
  test_pending();
  test_sync_record();
  test_drops();
  test_external_correlation();
  drain();
  CMT_EQ(atomic_load(&outstanding), 0);
  fake_stats s;
  fake_get_stats(&s);
  CMT_EQU(s.finalize_calls, 0);
  CMT_EQU(s.forced_flushes > 0, 1);
  test_timestamp_callback(); /* last: the callback stays registered */
  printf("test_fake: ok\n");
  return 0;
}
