/*
 * test_engine_errors.c: failures a user meets, and how the engine reports them.
 *
 * Design. Three groups:
 *  - Naming mistakes. An unknown kind or field, given to cm_selection_add, cm_selection_add_id or
 *    cm_selection_parse, fails with CM_ENOKIND or CM_ENOFIELD, and the detail (cm_errmsg) lists
 *    what is valid. The valid names are taken from the registry itself, so the check follows the
 *    registry as it grows. A failed parse adds nothing. No registry name is a Lua keyword.
 *  - Misuse of the engine: an empty selection, an unknown observer id, a bad flush mode. These
 *    fail without side effects (no session starts). The detail is per thread.
 *  - Pool exhaustion. With two 64 KiB buffers, a burst from four threads cannot fit: the fake
 *    drops what has no buffer. The engine must report the drops in cm_stats (equal to what the
 *    fake dropped), and deliver every record that was written, exactly once. Then the pool is
 *    left at its bound with every buffer partly filled by a thread that exited, and a sync fence
 *    must still complete, although its own SYNCHRONIZATION record finds no buffer at first.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmt.h"
#include "cmt_records.h"
#include "cuptimon.h"
#include "fake_cupti.h"

/* ---- naming mistakes ------------------------------------------------------------------------ */

/* Asserts that `msg` names every kind of the registry (canonical names). */
static void expect_all_kinds(const char *msg) {
  int n = cm_kind_count();
  CMT_GT(n, 5);
  for (int i = 0; i < n; i++) CMT_CONTAINS(msg, cm_kind_name(cm_kind_at(i)));
}

/* Asserts that `msg` names every field of `kind`. */
static void expect_all_fields(const char *msg, int kind) {
  int n = cm_field_count(kind);
  CMT_GT(n, 3);
  for (int f = 0; f < n; f++) {
    cm_field_info fi;
    CMT_OK(cm_field_info_get(kind, f, &fi));
    CMT_CONTAINS(msg, fi.name);
  }
}

static const char *const lua_keywords[] = {
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if",
    "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while"};

static void test_names(void) {
  int kernel = cm_kind_by_name("kernel");
  int memcpy_k = cm_kind_by_name("memcpy");
  CMT_GT(kernel, 0);
  CMT_GT(memcpy_k, 0);
  cm_selection *sel;
  CMT_OK(cm_selection_new(&sel));

  CMT_EQ(cm_selection_add(sel, "no_such_kind", NULL), CM_ENOKIND);
  CMT_CONTAINS(cm_errmsg(), "no_such_kind");
  expect_all_kinds(cm_errmsg());

  CMT_EQ(cm_selection_add(sel, "kernel", "no_such_field"), CM_ENOFIELD);
  CMT_CONTAINS(cm_errmsg(), "no_such_field");
  expect_all_fields(cm_errmsg(), kernel);
  CMT_EQ(cm_selection_count(sel, kernel), 0);

  /* "end" is a Lua keyword: the end timestamp is "stop", and "end" names nothing. */
  CMT_EQ(cm_selection_add(sel, "kernel", "end"), CM_ENOFIELD);
  expect_all_fields(cm_errmsg(), kernel);

  CMT_EQ(cm_selection_add_id(sel, CM_KIND_MAX + 7, -1), CM_ENOKIND);
  expect_all_kinds(cm_errmsg());
  CMT_EQ(cm_selection_add_id(sel, CM_KIND_INVALID, -1), CM_ENOKIND);
  CMT_EQ(cm_selection_add_id(sel, kernel, cm_field_count(kernel)), CM_ENOFIELD);
  CMT_EQ(cm_selection_add_id(sel, kernel, -2), CM_ENOFIELD);
  CMT_EQ(cm_selection_count(sel, kernel), 0);

  /* A failed parse adds nothing, not even the parts before the mistake. */
  CMT_EQ(cm_selection_parse(sel, "memcpy:bytes;kernel:name,no_such_field"), CM_ENOFIELD);
  CMT_CONTAINS(cm_errmsg(), "no_such_field");
  expect_all_fields(cm_errmsg(), kernel);
  CMT_EQ(cm_selection_count(sel, kernel), 0);
  CMT_EQ(cm_selection_count(sel, memcpy_k), 0);

  CMT_EQ(cm_selection_parse(sel, "memcpy:bytes;no_such_kind:all"), CM_ENOKIND);
  CMT_CONTAINS(cm_errmsg(), "no_such_kind");
  expect_all_kinds(cm_errmsg());
  CMT_EQ(cm_selection_count(sel, memcpy_k), 0);

  CMT_EQ(cm_kind_by_name("no_such_kind"), CM_ENOKIND);
  expect_all_kinds(cm_errmsg());
  CMT_EQ(cm_field_by_name(memcpy_k, "no_such_field"), CM_ENOFIELD);
  expect_all_fields(cm_errmsg(), memcpy_k);

  /* The selection is still usable after the failures. */
  CMT_OK(cm_selection_parse(sel, "kernel:name,stop;memcpy"));
  CMT_EQ(cm_selection_count(sel, kernel), 2);
  CMT_EQ(cm_selection_count(sel, memcpy_k), cm_field_count(memcpy_k));
  cm_selection_free(sel);

  /* No kind or field name is a Lua keyword: every name is usable as b.name in a script. */
  for (int i = 0; i < cm_kind_count(); i++) {
    int k = cm_kind_at(i);
    for (size_t w = 0; w < sizeof lua_keywords / sizeof lua_keywords[0]; w++)
      if (strcmp(cm_kind_name(k), lua_keywords[w]) == 0)
        CMT_FAIL("kind name '%s' is a Lua keyword", cm_kind_name(k));
    for (int f = 0; f < cm_field_count(k); f++) {
      cm_field_info fi;
      CMT_OK(cm_field_info_get(k, f, &fi));
      for (size_t w = 0; w < sizeof lua_keywords / sizeof lua_keywords[0]; w++)
        if (strcmp(fi.name, lua_keywords[w]) == 0)
          CMT_FAIL("field %s.%s is a Lua keyword", cm_kind_name(k), fi.name);
    }
  }

  /* Every error code has a name and a description, and they differ. */
  for (int c = CM_EINVAL; c > CM_ERRNO_LAST; c--) {
    CMT_ASSERT(cm_err_name(c) != NULL && cm_strerror(c) != NULL);
    for (int d = c - 1; d > CM_ERRNO_LAST; d--) {
      if (strcmp(cm_err_name(c), cm_err_name(d)) == 0)
        CMT_FAIL("codes %d and %d share the name %s", c, d, cm_err_name(c));
    }
  }
  CMT_ASSERT(cm_err_name(-1000) != NULL && cm_strerror(-1000) != NULL);
  printf("naming mistakes: codes and details as documented\n");
}

/* ---- misuse --------------------------------------------------------------------------------- */

static void on_nothing(void *ud, const cm_batch *b) {
  (void)ud;
  (void)b;
}

static void *fail_on_other_thread(void *arg) {
  (void)arg;
  CMT_EQ(cm_kind_by_name("other_thread_kind"), CM_ENOKIND);
  CMT_CONTAINS(cm_errmsg(), "other_thread_kind");
  return NULL;
}

static void test_misuse(cm_engine *e) {
  cm_selection *sel;
  CMT_OK(cm_selection_new(&sel));
  uint32_t id = 0;
  cm_stats s0, s1;
  CMT_OK(cm_stats_get(e, &s0));
  int rc = cm_observe(e, sel, on_nothing, NULL, &id);
  printf("empty selection: %s: %s\n", cm_err_name(rc), cm_errmsg());
  CMT_LT(rc, 0);
  CMT_OK(cm_stats_get(e, &s1));
  CMT_EQU(s1.sessions, s0.sessions);
  CMT_EQU(cm_enabled_kinds(e), 0);

  CMT_EQ(cm_unobserve(e, 4242), CM_ENOENT);
  CMT_EQ(cm_flush(e, 7, 0), CM_EINVAL);

  /* The detail is per thread: a failure elsewhere does not overwrite this thread's. */
  CMT_EQ(cm_kind_by_name("this_thread_kind"), CM_ENOKIND);
  pthread_t t;
  CMT_EQ(pthread_create(&t, NULL, fail_on_other_thread, NULL), 0);
  CMT_EQ(pthread_join(t, NULL), 0);
  CMT_CONTAINS(cm_errmsg(), "this_thread_kind");
  cm_selection_free(sel);
}

/* ---- pool exhaustion ------------------------------------------------------------------------ */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_delivered;
static uint64_t g_sum, g_xor; /* over the delivered (start, correlation) pairs */
static int g_start_field, g_corr_field;

static uint64_t pair_hash(uint64_t start, uint64_t corr) { return mix64(mix64(start) ^ corr); }

static void on_kernel(void *ud, const cm_batch *b) {
  (void)ud;
  const cm_column *start = cm_batch_column(b, g_start_field);
  const cm_column *corr = cm_batch_column(b, g_corr_field);
  CMT_ASSERT(start && corr && b->ncols == 2);
  CMT_EQU(start->width, 8);
  CMT_EQU(corr->width, 4);
  pthread_mutex_lock(&g_mu);
  for (uint32_t i = 0; i < b->n; i++) {
    uint64_t h = pair_hash(((const uint64_t *)start->data)[i], ((const uint32_t *)corr->data)[i]);
    g_sum += h;
    g_xor ^= mix64(h);
  }
  g_delivered += b->n;
  pthread_mutex_unlock(&g_mu);
}

/* A burst writer that remembers which of its records were written (fake_emit returned 0). */
typedef struct burst {
  pthread_t tid;
  uint32_t thread;
  uint64_t n, written, dropped;
  uint64_t sum, xr; /* over the written records' (start, correlation) pairs */
  pthread_barrier_t *hold; /* when set, waited on after writing, so the writers overlap */
} burst;

static pthread_barrier_t g_hold;

static int g_kernel;

static void *burst_main(void *arg) {
  burst *w = arg;
  union {
    uint64_t align;
    unsigned char b[1024];
  } rec;
  cm_field_info fs, fc;
  CMT_OK(cm_field_info_get(g_kernel, g_start_field, &fs));
  CMT_OK(cm_field_info_get(g_kernel, g_corr_field, &fc));
  for (uint64_t j = 0; j < w->n; j++) {
    size_t size = fake_gen_record(g_kernel, w->thread, j, rec.b);
    CMT_GT(size, 0);
    int rc = fake_emit(rec.b, size, 0);
    if (rc == 1) {
      w->dropped++;
      continue;
    }
    CMT_EQ(rc, 0);
    uint64_t start = 0;
    uint32_t corr = 0;
    memcpy(&start, rec.b + fs.offset, sizeof start);
    memcpy(&corr, rec.b + fc.offset, sizeof corr);
    uint64_t h = pair_hash(start, corr);
    w->sum += h;
    w->xr ^= mix64(h);
    w->written++;
  }
  if (w->hold) pthread_barrier_wait(w->hold);
  return NULL;
}

static void test_pool_exhaustion(void) {
  g_kernel = cm_kind_by_name("kernel");
  g_start_field = cm_field_by_name(g_kernel, "start");
  g_corr_field = cm_field_by_name(g_kernel, "correlation");
  CMT_GE(g_start_field, 0);
  CMT_GE(g_corr_field, 0);

  cm_config cfg;
  cm_config_init(&cfg);
  cfg.buffer_size = 64u << 10;
  cfg.pool_max_buffers = 2;
  cm_engine *e;
  CMT_OK(cm_engine_new(&e, &cfg));
  cm_set_log(e, log_to_stderr, NULL);
  cm_selection *sel;
  CMT_OK(cm_selection_new(&sel));
  CMT_OK(cm_selection_parse(sel, "kernel:start,correlation"));
  uint32_t id;
  CMT_OK(cm_observe(e, sel, on_kernel, NULL, &id));

  fake_stats f0, f1, f2;
  fake_get_stats(&f0);
  burst w[4];
  for (uint32_t t = 0; t < 4; t++) {
    w[t] = (burst){.thread = t, .n = 20000};
    CMT_EQ(pthread_create(&w[t].tid, NULL, burst_main, &w[t]), 0);
  }
  uint64_t written = 0, dropped = 0, want_sum = 0, want_xor = 0;
  for (uint32_t t = 0; t < 4; t++) {
    CMT_EQ(pthread_join(w[t].tid, NULL), 0);
    written += w[t].written;
    dropped += w[t].dropped;
    want_sum += w[t].sum;
    want_xor ^= w[t].xr;
  }
  fake_get_stats(&f1);
  CMT_EQU(written + dropped, 4 * 20000);
  uint64_t burst_written = written;
  CMT_EQU(f1.records_dropped - f0.records_dropped, dropped);
  CMT_GT(dropped, 0); /* two 64 KiB buffers cannot hold the burst */

  /* Put the pool at its bound with every buffer partly filled. A plain flush gives the burst's
   * buffers back. This thread then writes one record, so that it owns a per-thread record of
   * its own in the fake (without one, its device sync would adopt an exited thread's record,
   * buffer and all), and a second plain flush takes that buffer away again. Finally two more
   * threads write one record each and exit, each keeping a buffer as its current one
   * (per-thread buffers are CUPTI 13's default). */
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 10000));
  burst self = {.thread = 99, .n = 1};
  burst_main(&self);
  CMT_EQU(self.written, 1);
  written += self.written;
  want_sum += self.sum;
  want_xor ^= self.xr;
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 10000));
  CMT_EQ(pthread_barrier_init(&g_hold, NULL, 2), 0);
  /* The holders run at once (the fake gives an exited thread's record, and its buffer, to the
   * next new thread), and wait for each other before exiting, so each keeps its own buffer. */
  burst h[2];
  CMT_EQU(cfg.pool_max_buffers, 2);
  for (uint32_t t = 0; t < 2; t++) h[t] = (burst){.thread = 100 + t, .n = 1, .hold = &g_hold};
  for (uint32_t t = 0; t < 2; t++) CMT_EQ(pthread_create(&h[t].tid, NULL, burst_main, &h[t]), 0);
  for (uint32_t t = 0; t < 2; t++) {
    CMT_EQ(pthread_join(h[t].tid, NULL), 0);
    CMT_EQU(h[t].written, 1);
    written += h[t].written;
    want_sum += h[t].sum;
    want_xor ^= h[t].xr;
  }
  pthread_barrier_destroy(&g_hold);
  cm_stats mid;
  CMT_OK(cm_stats_get(e, &mid));
  CMT_EQU(mid.buffers_outstanding, cfg.pool_max_buffers);

  /* A fence now: its device sync's SYNCHRONIZATION record finds no buffer. The fence must still
   * complete (the held buffers can be flushed and the sync repeated), not wait out its deadline. */
  uint64_t t0 = mono_ms();
  int fence_rc = cm_flush(e, CM_FLUSH_SYNC, 3000);
  uint64_t fence_ms = mono_ms() - t0;
  const char *fence_msg = fence_rc ? cm_errmsg() : "";
  char fence_detail[512];
  snprintf(fence_detail, sizeof fence_detail, "%s", fence_msg);
  /* A second fence, with the pool's buffers back, for the accounting below. */
  int fence2_rc = cm_flush(e, CM_FLUSH_SYNC, 10000);

  cm_stats st;
  CMT_OK(cm_stats_get(e, &st));
  fake_get_stats(&f2);
  pthread_mutex_lock(&g_mu);
  uint64_t delivered = g_delivered, got_sum = g_sum, got_xor = g_xor;
  pthread_mutex_unlock(&g_mu);
  printf("burst of %d: written %" PRIu64 " (+%" PRIu64 " by the test and the buffer holders), "
         "dropped %" PRIu64 " (fake total %" PRIu64 "); engine: delivered %" PRIu64
         ", records_dropped %" PRIu64 ", buffers refused %" PRIu64 ", allocated %" PRIu64 "\n",
         4 * 20000, burst_written, written - burst_written, dropped,
         f2.records_dropped - f0.records_dropped, delivered, st.records_dropped,
         st.buffers_refused, st.buffers_allocated);
  printf("fence after the burst: %s in %" PRIu64 " ms %s; second fence: %s\n",
         cm_err_name(fence_rc), fence_ms, fence_detail, cm_err_name(fence2_rc));

  /* Every written record was delivered exactly once; every dropped one was counted. */
  CMT_EQU(delivered, written);
  CMT_EQU(got_sum, want_sum);
  CMT_EQU(got_xor, want_xor);
  CMT_LEU(st.buffers_allocated, cfg.pool_max_buffers);
  CMT_GT(st.buffers_refused, 0);
  CMT_EQU(delivered + st.records_dropped, written + f2.records_dropped - f0.records_dropped);
  CMT_GE(st.records_dropped, dropped);
  CMT_OK(fence2_rc);
  /* Last, so the accounting above is reported first: the fence right after the burst must not
   * stall until its deadline because its own SYNCHRONIZATION record found no buffer. */
  CMT_OK(fence_rc);

  CMT_OK(cm_unobserve(e, id));
  cm_selection_free(sel);
  cm_engine_free(e);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep the progress lines when an assertion aborts */
  test_names();
  cm_engine *e;
  CMT_OK(cm_engine_new(&e, NULL));
  test_misuse(e);
  cm_engine_free(e);
  test_pool_exhaustion();
  printf("ok\n");
  return 0;
}
