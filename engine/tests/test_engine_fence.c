/*
 * test_engine_fence.c: cm_flush(CM_FLUSH_SYNC) is a fence, under concurrent producers.
 *
 * Design. The fence's contract is that when a sync flush returns, every record produced before
 * the call has been delivered. The test makes the "before" unambiguous: four test-owned threads
 * write known kernel records with fake_emit (record j of thread t is fake_gen_record(kernel,
 * 1000 + t, j)), some of them as kernels still running (pending until a device sync), the test
 * joins them, writes one more marker record (a running kernel) from its own thread, and then
 * calls the fence, while the fake's own producers keep writing memcpy records in the background.
 * A kernel observer selecting every field folds each delivered record's hash into a multiset;
 * after the fence every record written so far must be taken out of it exactly once, leaving it
 * empty (no loss, no duplicate, nothing foreign). This repeats, so a fence that happens to win a
 * race once does not pass by luck.
 *
 * Then the edges: a fence whose SYNCHRONIZATION records are suppressed must give up after its
 * timeout with CM_ETIMEDOUT (not hang), count the timeout and still deliver what it has; a record
 * still pending (a running kernel) is not delivered by a plain flush, is delivered by a sync
 * flush with its real end time, and is delivered with its end time when the last observer ends
 * the session; and a process with no CUDA context has nothing to wait for.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmt.h"
#include "cmt_records.h"
#include "cuptimon.h"
#include "fake_cupti.h"

#define NWRITERS 4
#define PER_WRITER 2000u
#define ROUNDS 20
#define WRITER_BASE 1000u /* generator thread ids of the test's writers */
#define MARKER_THREAD 9999u

/* ---- observers ------------------------------------------------------------------------------ */

static cm_engine *g_engine;
static int g_kernel, g_memcpy, g_stop_field;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static hset g_kernel_rows;      /* hashes of delivered kernel records, guarded by g_mu */
static uint64_t g_kernel_count; /* guarded by g_mu */
static uint64_t g_zero_stops;   /* kernel records delivered with stop == 0, guarded by g_mu */
static uint64_t g_memcpy_count; /* guarded by g_mu */
static int g_nf;
static cm_field_info *g_fi;

static void on_kernel(void *ud, const cm_batch *b) {
  (void)ud;
  CMT_EQ(b->kind, g_kernel);
  CMT_EQ(b->ncols, g_nf);
  pthread_mutex_lock(&g_mu);
  for (uint32_t i = 0; i < b->n; i++) {
    uint64_t h = (uint64_t)b->kind;
    for (uint32_t c = 0; c < b->ncols; c++) {
      CMT_EQ(b->cols[c].field, (int)c);
      uint64_t v = column_value_resolved(g_engine, &b->cols[c], i);
      if ((int)c == g_stop_field && v == 0) g_zero_stops++;
      h = row_step(h, (int)c, v);
    }
    hset_add(&g_kernel_rows, h);
  }
  g_kernel_count += b->n;
  pthread_mutex_unlock(&g_mu);
}

static void on_memcpy(void *ud, const cm_batch *b) {
  (void)ud;
  CMT_EQ(b->kind, g_memcpy);
  CMT_EQ(b->ncols, 1);
  pthread_mutex_lock(&g_mu);
  g_memcpy_count += b->n;
  pthread_mutex_unlock(&g_mu);
}

/* The hash the kernel observer computes for generated record (thread, seq); the record is
 * written to `rec` (at least 256 bytes) and its size returned through *size. */
static uint64_t gen_kernel(uint32_t thread, uint64_t seq, unsigned char *rec, size_t *size) {
  *size = fake_gen_record(g_kernel, thread, seq, rec);
  CMT_GT(*size, 0);
  uint64_t h = (uint64_t)g_kernel;
  for (int f = 0; f < g_nf; f++) h = row_step(h, f, record_value(rec, *size, &g_fi[f]));
  return h;
}

/* Checks that the kernel observer holds exactly the records whose hashes are in `want`. */
static void expect_exactly(const uint64_t *want, size_t n, const char *when) {
  pthread_mutex_lock(&g_mu);
  size_t missing = 0;
  for (size_t i = 0; i < n; i++)
    if (!hset_take(&g_kernel_rows, want[i])) missing++;
  uint64_t extra = g_kernel_rows.total;
  pthread_mutex_unlock(&g_mu);
  if (missing || extra)
    CMT_FAIL("%s: %zu of %zu records written before the fence were not delivered, and %" PRIu64
             " delivered records were not expected (duplicates or foreign)",
             when, missing, n, extra);
}

/* ---- writers -------------------------------------------------------------------------------- */

typedef struct writer {
  pthread_t tid;
  uint32_t thread;
  uint64_t seq0;
  uint64_t *hashes; /* PER_WRITER hashes of the records written */
} writer;

static void *writer_main(void *arg) {
  writer *w = arg;
  union {
    uint64_t align;
    unsigned char b[1024];
  } rec;
  for (uint64_t j = 0; j < PER_WRITER; j++) {
    size_t size;
    w->hashes[j] = gen_kernel(w->thread, w->seq0 + j, rec.b, &size);
    /* Some records are kernels still running: only a device sync completes their buffers, so a
     * flush that does not synchronize cannot deliver them. */
    int rc = fake_emit(rec.b, size, j % 97 == 0);
    if (rc != 0) CMT_FAIL("fake_emit returned %d (thread %u, seq %" PRIu64 ")", rc, w->thread, j);
  }
  return NULL;
}

/* ---- parts ---------------------------------------------------------------------------------- */

static void test_fence_rounds(void) {
  int kinds[1] = {g_memcpy};
  CMT_EQ(fake_start_producers(1, kinds, 1), 0);
  size_t per_round = NWRITERS * PER_WRITER + 1;
  uint64_t *want = malloc(per_round * sizeof *want);
  CMT_ASSERT(want != NULL);
  uint64_t worst_ms = 0;
  for (int r = 0; r < ROUNDS; r++) {
    writer w[NWRITERS];
    for (uint32_t t = 0; t < NWRITERS; t++) {
      w[t] = (writer){.thread = WRITER_BASE + t, .seq0 = (uint64_t)r * PER_WRITER,
                      .hashes = want + t * PER_WRITER};
      CMT_EQ(pthread_create(&w[t].tid, NULL, writer_main, &w[t]), 0);
    }
    for (uint32_t t = 0; t < NWRITERS; t++) CMT_EQ(pthread_join(w[t].tid, NULL), 0);
    /* The marker: a kernel launched by this thread just before the fence, still running. */
    union {
      uint64_t align;
      unsigned char b[1024];
    } rec;
    size_t size;
    want[per_round - 1] = gen_kernel(MARKER_THREAD, (uint64_t)r, rec.b, &size);
    CMT_EQ(fake_emit(rec.b, size, 1), 0);
    uint64_t t0 = mono_ms();
    CMT_OK(cm_flush(g_engine, CM_FLUSH_SYNC, 30000));
    uint64_t el = mono_ms() - t0;
    if (el > worst_ms) worst_ms = el;
    char when[64];
    snprintf(when, sizeof when, "fence round %d", r);
    expect_exactly(want, per_round, when);
  }
  free(want);
  pthread_mutex_lock(&g_mu);
  CMT_EQU(g_zero_stops, 0); /* running kernels were completed by the sync, not forced out */
  pthread_mutex_unlock(&g_mu);
  int64_t written = fake_stop_producers();
  CMT_GT(written, 0);
  CMT_OK(cm_flush(g_engine, CM_FLUSH_SYNC, 30000));
  pthread_mutex_lock(&g_mu);
  uint64_t mc = g_memcpy_count;
  pthread_mutex_unlock(&g_mu);
  printf("%d fences with %u records each from %d threads: all delivered, slowest fence %" PRIu64
         " ms; background memcpy written %" PRId64 ", delivered %" PRIu64 "\n",
         ROUNDS, (unsigned)per_round, NWRITERS, worst_ms, written, mc);
  CMT_EQU(mc, (uint64_t)written);
}

static void test_fence_timeout(void) {
  union {
    uint64_t align;
    unsigned char b[1024];
  } rec;
  size_t size;
  uint64_t want = gen_kernel(MARKER_THREAD, 100000, rec.b, &size);
  CMT_EQ(fake_emit(rec.b, size, 0), 0);
  cm_stats s0, s1;
  CMT_OK(cm_stats_get(g_engine, &s0));
  fake_set_suppress_sync_records(1);
  uint64_t t0 = mono_ms();
  int rc = cm_flush(g_engine, CM_FLUSH_SYNC, 300);
  uint64_t el = mono_ms() - t0;
  fake_set_suppress_sync_records(0);
  CMT_OK(cm_stats_get(g_engine, &s1));
  printf("fence without sync records: %s after %" PRIu64 " ms (%s)\n", cm_err_name(rc), el,
         cm_errmsg());
  CMT_EQ(rc, CM_ETIMEDOUT);
  CMT_GE(el, 250);
  CMT_LE(el, 5000);
  CMT_EQU(s1.fence_timeouts, s0.fence_timeouts + 1);
  CMT_EQU(s1.fences, s0.fences + 1);
  /* What was complete before the failed fence has still been delivered. */
  expect_exactly(&want, 1, "timed-out fence");
  /* A fence works again once sync records come back. */
  CMT_OK(cm_flush(g_engine, CM_FLUSH_SYNC, 30000));
  CMT_OK(cm_stats_get(g_engine, &s1));
  CMT_EQU(s1.fence_timeouts, s0.fence_timeouts + 1);
}

static void test_pending(void) {
  union {
    uint64_t align;
    unsigned char b[1024];
  } rec;
  size_t size;
  uint64_t want = gen_kernel(MARKER_THREAD, 200000, rec.b, &size);
  cm_field_info stop;
  CMT_OK(cm_field_info_get(g_kernel, g_stop_field, &stop));
  CMT_NE(record_value(rec.b, size, &stop), 0); /* the generated kernel has an end time */
  CMT_EQ(fake_emit(rec.b, size, 1), 0);

  /* A plain flush leaves a running kernel's buffer with CUPTI, and never forces it out. */
  fake_stats f0, f1;
  fake_get_stats(&f0);
  CMT_OK(cm_flush(g_engine, CM_FLUSH_PLAIN, 30000));
  fake_get_stats(&f1);
  CMT_EQU(f1.forced_flushes, f0.forced_flushes);
  pthread_mutex_lock(&g_mu);
  CMT_EQU(g_kernel_rows.total, 0);
  pthread_mutex_unlock(&g_mu);

  /* The fence synchronizes the device, which completes it with its end time. */
  CMT_OK(cm_flush(g_engine, CM_FLUSH_SYNC, 30000));
  expect_exactly(&want, 1, "pending record after a sync flush");
  pthread_mutex_lock(&g_mu);
  CMT_EQU(g_zero_stops, 0);
  pthread_mutex_unlock(&g_mu);
  printf("pending kernel: held by a plain flush, delivered by a sync flush with its end time\n");
}

/* The last observer ends the session with a device sync before the forced flush, so a kernel
 * still running is delivered with its end time rather than zero. */
static void test_pending_at_session_end(uint32_t *kernel_obs, uint32_t memcpy_obs) {
  union {
    uint64_t align;
    unsigned char b[1024];
  } rec;
  size_t size;
  uint64_t want = gen_kernel(MARKER_THREAD, 300000, rec.b, &size);
  CMT_EQ(fake_emit(rec.b, size, 1), 0);
  CMT_OK(cm_unobserve(g_engine, memcpy_obs));
  CMT_OK(cm_unobserve(g_engine, *kernel_obs));
  *kernel_obs = 0;
  expect_exactly(&want, 1, "pending record at session end");
  pthread_mutex_lock(&g_mu);
  CMT_EQU(g_zero_stops, 0);
  pthread_mutex_unlock(&g_mu);
  CMT_EQU(cm_enabled_kinds(g_engine), 0);
  printf("pending kernel at session end: delivered with its end time\n");
}

/* Without a CUDA context there is no device work to wait for: the fence must not wait out its
 * deadline. */
static void test_no_context(void) {
  cm_selection *sel;
  CMT_OK(cm_selection_new(&sel));
  CMT_OK(cm_selection_add(sel, "kernel", NULL));
  uint32_t id;
  CMT_OK(cm_observe(g_engine, sel, on_kernel, NULL, &id));
  union {
    uint64_t align;
    unsigned char b[1024];
  } rec;
  size_t size;
  uint64_t want = gen_kernel(MARKER_THREAD, 400000, rec.b, &size);
  CMT_EQ(fake_emit(rec.b, size, 0), 0);
  fake_set_no_context(1);
  uint64_t t0 = mono_ms();
  int rc = cm_flush(g_engine, CM_FLUSH_SYNC, 3000);
  uint64_t el = mono_ms() - t0;
  fake_set_no_context(0);
  printf("fence without a CUDA context: %s after %" PRIu64 " ms\n", cm_err_name(rc), el);
  CMT_OK(rc);
  CMT_LT(el, 2000);
  expect_exactly(&want, 1, "fence without a context");
  CMT_OK(cm_unobserve(g_engine, id));
  cm_selection_free(sel);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep the progress lines when an assertion aborts */
  g_kernel = cm_kind_by_name("kernel");
  g_memcpy = cm_kind_by_name("memcpy");
  CMT_GT(g_kernel, 0);
  CMT_GT(g_memcpy, 0);
  g_stop_field = cm_field_by_name(g_kernel, "stop");
  CMT_GE(g_stop_field, 0);
  g_nf = cm_field_count(g_kernel);
  g_fi = calloc((size_t)g_nf, sizeof *g_fi);
  CMT_ASSERT(g_fi != NULL);
  for (int f = 0; f < g_nf; f++) CMT_OK(cm_field_info_get(g_kernel, f, &g_fi[f]));

  cm_config cfg;
  cm_config_init(&cfg);
  CMT_OK(cm_engine_new(&g_engine, &cfg));
  cm_set_log(g_engine, log_to_stderr, NULL);
  cm_selection *ks, *ms;
  CMT_OK(cm_selection_new(&ks));
  CMT_OK(cm_selection_add_id(ks, g_kernel, -1));
  CMT_OK(cm_selection_new(&ms));
  CMT_OK(cm_selection_add(ms, "memcpy", "bytes"));
  uint32_t kid, mid;
  CMT_OK(cm_observe(g_engine, ks, on_kernel, NULL, &kid));
  CMT_OK(cm_observe(g_engine, ms, on_memcpy, NULL, &mid));

  test_fence_rounds();
  test_fence_timeout();
  test_pending();
  test_pending_at_session_end(&kid, mid);
  test_no_context();

  cm_stats st;
  CMT_OK(cm_stats_get(g_engine, &st));
  CMT_EQU(st.records_dropped, 0);
  cm_engine_free(g_engine);
  cm_selection_free(ks);
  cm_selection_free(ms);
  free(g_kernel_rows.s);
  free(g_fi);
  printf("ok\n");
  return 0;
}
