/*
 * test_correlation.c: external correlation ids, chains, their retirement, and metadata.
 *
 * Design. Three threads push nested ids around fake kernel launches (fake_launch_kernel writes a
 * RUNTIME record, the EXTERNAL_CORRELATION record CUPTI would write for the innermost id of the
 * thread's stack, and a kernel, all with one correlation id). Each thread notes the chain it
 * expects for each launch; the observer keeps the kernel and external_correlation columns, and
 * after the flush cm_corr_join_chains must give every kernel exactly the expected chain. The
 * retirement test counts drains: a chain resolves inside the first and second drains after its
 * pop and is gone after the second. The rejected-push test reads the fake's own CUPTI stack to
 * show that the pop of a rejected frame does not unwind the enclosing one. Metadata merges are
 * checked on the serialized text, which is deterministic (ids ascending, keys in first-seen
 * order).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_internal.h"
#include "cmt.h"
#include "fake_cupti.h"

#define LAUNCH_CBID 211u /* CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000 */
#define NT 3
#define MAXL 64
#define MAXK 4096

/* ---- what the observer saw ------------------------------------------------------------------ */

static struct {
  pthread_mutex_t mu;
  uint32_t kcorr[MAXK];
  uint32_t nk;
  uint32_t ec_kind[MAXK], ec_corr[MAXK];
  uint64_t ec_ext[MAXK];
  uint32_t nec;
  /* Checked inside the observer: the chain of `watch` resolved during that drain. */
  uint64_t watch;
  int watch_len_in_drain;
} seen = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const void *col(const cm_batch *b, const char *name) {
  int f = cm_field_by_name(b->kind, name);
  const cm_column *c = cm_batch_column(b, f);
  if (!c) CMT_FAIL("batch of kind %d lacks column %s", b->kind, name);
  return c->data;
}

static void observer(void *ud, const cm_batch *b) {
  (void)ud;
  pthread_mutex_lock(&seen.mu);
  if (b->kind == CM_KIND_CONCURRENT_KERNEL) {
    const uint32_t *c = col(b, "correlation");
    for (uint32_t i = 0; i < b->n && seen.nk < MAXK; i++) seen.kcorr[seen.nk++] = c[i];
  } else if (b->kind == CM_KIND_EXTERNAL_CORRELATION) {
    const uint32_t *k = col(b, "external_kind"), *c = col(b, "correlation");
    const uint64_t *x = col(b, "external_id");
    for (uint32_t i = 0; i < b->n && seen.nec < MAXK; i++) {
      seen.ec_kind[seen.nec] = k[i];
      seen.ec_corr[seen.nec] = c[i];
      seen.ec_ext[seen.nec++] = x[i];
    }
  }
  if (seen.watch) {
    uint64_t ch[8];
    seen.watch_len_in_drain = cm_corr_chain(seen.watch, ch, 8);
  }
  pthread_mutex_unlock(&seen.mu);
}

static void reset_seen(void) {
  pthread_mutex_lock(&seen.mu);
  seen.nk = seen.nec = 0;
  seen.watch = 0;
  seen.watch_len_in_drain = -1;
  pthread_mutex_unlock(&seen.mu);
}

static cm_engine *start_engine(uint32_t *obs) {
  cm_engine *e = NULL;
  CMT_OK(cm_engine_new(&e, NULL));
  cm_selection *s;
  CMT_OK(cm_selection_new(&s));
  CMT_OK(cm_selection_parse(s, "kernel:correlation,name;external_correlation"));
  CMT_OK(cm_observe(e, s, observer, NULL, obs));
  cm_selection_free(s);
  return e;
}

/* ---- nested pushes on three threads ---------------------------------------------------------- */

typedef struct launch {
  uint32_t corr;
  int n;
  uint64_t chain[4];
} launch;

typedef struct worker {
  launch l[MAXL];
  int nl;
} worker;

static void do_launch(worker *w, const uint64_t *stack, int depth) {
  launch *l = &w->l[w->nl++];
  l->corr = fake_launch_kernel(LAUNCH_CBID, "_Z6nestedv");
  l->n = depth;
  for (int i = 0; i < depth; i++) l->chain[i] = stack[depth - 1 - i];
}

static void *worker_main(void *arg) {
  worker *w = arg;
  for (int rep = 0; rep < 5; rep++) {
    uint64_t st[3];
    do_launch(w, st, 0); /* untagged */
    st[0] = cm_corr_push();
    CMT_NE(st[0], 0);
    do_launch(w, st, 1);
    st[1] = cm_corr_push();
    do_launch(w, st, 2);
    st[2] = cm_corr_push();
    CMT_EQU(cm_corr_current(), st[2]);
    CMT_EQ(cm_corr_depth(), 3);
    do_launch(w, st, 3);
    uint64_t popped = 0;
    CMT_OK(cm_corr_pop(&popped));
    CMT_EQU(popped, st[2]);
    do_launch(w, st, 2); /* tagged with the middle id again */
    CMT_OK(cm_corr_pop(&popped));
    CMT_EQU(popped, st[1]);
    CMT_OK(cm_corr_pop(&popped));
    CMT_EQU(popped, st[0]);
    CMT_EQ(cm_corr_depth(), 0);
    CMT_EQ(fake_external_depth(CM_CORR_EXTERNAL_KIND), 0);
  }
  return NULL;
}

static void test_nested_three_threads(void) {
  reset_seen();
  uint32_t obs;
  cm_engine *e = start_engine(&obs);
  static worker w[NT];
  pthread_t th[NT];
  for (int i = 0; i < NT; i++) CMT_EQ(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 0));

  pthread_mutex_lock(&seen.mu);
  uint32_t total = 0;
  for (int i = 0; i < NT; i++) total += (uint32_t)w[i].nl;
  CMT_EQ(seen.nk, total);
  uint32_t *off = malloc((seen.nk + 1) * sizeof *off);
  uint64_t ids[MAXK];
  int64_t need = cm_corr_join_chains(seen.ec_kind, seen.ec_ext, seen.ec_corr, seen.nec, seen.kcorr,
                                     seen.nk, off, ids, MAXK);
  CMT_GE(need, 0);
  CMT_LE(need, MAXK);
  uint64_t *inner = malloc(seen.nk * sizeof *inner);
  CMT_OK(cm_corr_join(seen.ec_kind, seen.ec_ext, seen.ec_corr, seen.nec, seen.kcorr, seen.nk,
                      inner));
  int checked = 0;
  for (uint32_t r = 0; r < seen.nk; r++) {
    const launch *l = NULL;
    for (int i = 0; i < NT && !l; i++)
      for (int j = 0; j < w[i].nl; j++)
        if (w[i].l[j].corr == seen.kcorr[r]) l = &w[i].l[j];
    if (!l) CMT_FAIL("kernel with correlation %u was never launched", seen.kcorr[r]);
    CMT_EQ(off[r + 1] - off[r], l->n);
    for (int i = 0; i < l->n; i++) CMT_EQU(ids[off[r] + i], l->chain[i]);
    CMT_EQU(inner[r], l->n ? l->chain[0] : 0);
    checked++;
  }
  CMT_EQ(checked, (int)total);
  pthread_mutex_unlock(&seen.mu);
  free(off);
  free(inner);
  CMT_OK(cm_unobserve(e, obs));
  cm_engine_free(e);
  printf("nested pushes on %d threads: %d kernels resolved to their chains\n", NT, checked);
}

/* ---- retirement ------------------------------------------------------------------------------ */

static void test_chain_retirement(void) {
  reset_seen();
  uint32_t obs;
  cm_engine *e = start_engine(&obs);
  uint64_t outer = cm_corr_push(), inner = cm_corr_push();
  fake_launch_kernel(LAUNCH_CBID, "_Z4latev");
  uint64_t ch[4];
  CMT_EQ(cm_corr_chain(inner, ch, 4), 2);
  CMT_EQU(ch[0], inner);
  CMT_EQU(ch[1], outer);
  CMT_OK(cm_corr_pop(NULL));
  CMT_OK(cm_corr_pop(NULL));
  /* Popped, not yet drained: still resolves. */
  CMT_EQ(cm_corr_chain(inner, ch, 4), 2);

  pthread_mutex_lock(&seen.mu);
  seen.watch = inner;
  pthread_mutex_unlock(&seen.mu);
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 0)); /* drain 1 after the pop: records delivered */
  CMT_EQ(seen.nk, 1);
  CMT_EQ(seen.watch_len_in_drain, 2);
  CMT_EQ(cm_corr_chain(inner, ch, 4), 2); /* still resolvable after drain 1 */
  uint64_t x = 0;
  CMT_OK(cm_corr_join(seen.ec_kind, seen.ec_ext, seen.ec_corr, seen.nec, seen.kcorr, 1, &x));
  CMT_EQU(x, inner);

  /* A drain that delivers nothing does not age chains: an idle delivery cadence must not retire
   * a chain before its late records arrive. */
  seen.watch_len_in_drain = -1;
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 0));
  CMT_EQ(seen.watch_len_in_drain, -1); /* nothing to deliver, so the observer did not run */
  CMT_EQ(cm_corr_chain(inner, ch, 4), 2);

  fake_launch_kernel(LAUNCH_CBID, "_Z5otherv"); /* untagged work, so the next drain has records */
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 0)); /* drain 2: resolvable during it, retired after it */
  CMT_EQ(seen.watch_len_in_drain, 2);
  CMT_EQ(cm_corr_chain(inner, ch, 4), 0);
  CMT_EQ(cm_corr_chain(outer, ch, 4), 0);
  CMT_OK(cm_unobserve(e, obs));
  cm_engine_free(e);
}

/* The records arrive only in the second drain after the pop (the kernel is still running during
 * the first): they still resolve then. The first drain delivered nothing, so it did not age the
 * chain, which is gone after the next drain that delivers records. */
static void test_late_records_resolve(void) {
  reset_seen();
  uint32_t obs;
  cm_engine *e = start_engine(&obs);
  uint64_t id = cm_corr_push();
  pthread_mutex_lock(&seen.mu);
  seen.watch = id;
  pthread_mutex_unlock(&seen.mu);
  uint64_t t0 = fake_now();
  CUpti_ActivityAPI api;
  memset(&api, 0, sizeof api);
  api.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  api.cbid = LAUNCH_CBID;
  api.start = t0;
  api.end = t0 + 10;
  api.correlationId = 4242;
  CMT_EQ(fake_emit(&api, sizeof api, 0), 0);
  CUpti_ActivityKernel10 k;
  memset(&k, 0, sizeof k);
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.start = t0 + 20;
  k.end = t0 + 30;
  k.correlationId = 4242;
  k.name = "_Z7runningv";
  CMT_EQ(fake_emit(&k, sizeof k, 1), 0); /* pending until a device sync */
  CMT_OK(cm_corr_pop(NULL));

  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 0)); /* drain 1: the buffer is incomplete, nothing comes */
  CMT_EQ(seen.nk, 0);
  CMT_EQ(seen.watch_len_in_drain, -1);
  uint64_t ch[4];
  CMT_EQ(cm_corr_chain(id, ch, 4), 1);
  CMT_OK(cm_flush(e, CM_FLUSH_SYNC, 0)); /* drain 2: the sync completes the kernel */
  CMT_EQ(seen.nk, 1);
  CMT_EQ(seen.watch_len_in_drain, 1); /* resolved while its records were delivered */
  uint64_t x = 0;
  CMT_OK(cm_corr_join(seen.ec_kind, seen.ec_ext, seen.ec_corr, seen.nec, seen.kcorr, 1, &x));
  CMT_EQU(x, id);
  /* Drain 1 delivered nothing, so only one drain has aged the chain: it still resolves. */
  CMT_EQ(cm_corr_chain(id, ch, 4), 1);
  fake_launch_kernel(LAUNCH_CBID, "_Z5otherv");
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 0));
  CMT_EQ(cm_corr_chain(id, ch, 4), 0); /* retired two delivering drains after its pop */
  CMT_OK(cm_unobserve(e, obs));
  cm_engine_free(e);
}

/* ---- rejected pushes and over-pops -------------------------------------------------------------- */

static void test_rejected_push(void) {
  reset_seen();
  uint32_t obs;
  cm_engine *e = start_engine(&obs);
  int K = CM_CORR_EXTERNAL_KIND;
  uint64_t a = cm_corr_push();
  CMT_EQ(fake_external_depth(K), 1);
  CMT_EQU(fake_external_top(K), a);
  fake_set_reject_external_push(1);
  uint64_t b = cm_corr_push();
  fake_set_reject_external_push(0);
  CMT_NE(b, 0);
  CMT_EQ(cm_corr_depth(), 2);
  CMT_EQ(fake_external_depth(K), 1); /* CUPTI refused b */
  CMT_EQU(cm_corr_current(), a);     /* records are tagged with a */
  uint64_t ch[4];
  CMT_EQ(cm_corr_chain(b, ch, 4), 2); /* b's chain exists, and names a as its parent */
  uint32_t corr = fake_launch_kernel(LAUNCH_CBID, "_Z8rejectedv");
  uint64_t popped;
  CMT_OK(cm_corr_pop(&popped));
  CMT_EQU(popped, b);
  CMT_EQ(fake_external_depth(K), 1); /* the pop of b did not unwind a */
  CMT_EQU(fake_external_top(K), a);
  CMT_OK(cm_corr_pop(&popped));
  CMT_EQU(popped, a);
  CMT_EQ(fake_external_depth(K), 0);
  /* Over-pop: an error, and nothing changes. */
  CMT_EQ(cm_corr_pop(&popped), CM_ENOENT);
  CMT_EQ(cm_corr_depth(), 0);
  CMT_EQ(fake_external_depth(K), 0);

  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 0));
  uint64_t x = 0;
  CMT_EQ(seen.nk, 1);
  CMT_EQU(seen.kcorr[0], corr);
  CMT_OK(cm_corr_join(seen.ec_kind, seen.ec_ext, seen.ec_corr, seen.nec, seen.kcorr, 1, &x));
  CMT_EQU(x, a);
  CMT_OK(cm_unobserve(e, obs));
  cm_engine_free(e);
}

/* ---- no engine -------------------------------------------------------------------------------- */

static void test_without_engine(void) {
  CMT_EQ(cm_corr_pop(NULL), CM_ENOENT);
  CMT_EQU(cm_corr_current(), 0);
  uint64_t a = cm_corr_push();
  CMT_OK(cm_corr_push_id(a + 1000000));
  CMT_EQU(cm_corr_current(), a + 1000000);
  CMT_EQ(fake_external_depth(CM_CORR_EXTERNAL_KIND), 0); /* nothing reached CUPTI */
  uint64_t ch[1];
  CMT_EQ(cm_corr_chain(a + 1000000, ch, 1), 2); /* full length, even past max */
  CMT_EQU(ch[0], a + 1000000);
  CMT_EQ(cm_corr_push_id(0), CM_EINVAL);
  CMT_OK(cm_corr_pop(NULL));
  CMT_OK(cm_corr_pop(NULL));
  CMT_EQ(cm_corr_pop(NULL), CM_ENOENT);
  /* Depth bound. */
  for (int i = 0; i < CM_CORR_MAX_DEPTH; i++) CMT_NE(cm_corr_push(), 0);
  CMT_EQU(cm_corr_push(), 0);
  CMT_CONTAINS(cm_errmsg(), "stack full");
  for (int i = 0; i < CM_CORR_MAX_DEPTH; i++) CMT_OK(cm_corr_pop(NULL));
  CMT_EQ(cm_corr_depth(), 0);
}

/* ---- metadata --------------------------------------------------------------------------------- */

static char *take(void) {
  char *s = NULL;
  size_t n = 0;
  CMT_OK(cm_corr_metadata_take(&s, &n));
  CMT_EQU(n, strlen(s));
  return s;
}

static void put(uint64_t id, const char *json) { CMT_OK(cm_corr_metadata_put(id, json, strlen(json))); }

static void test_metadata(void) {
  char *s = take();
  CMT_STREQ(s, "{}");
  cm_free(s);

  /* Nested objects merge key by key; leaves conflict and the later wins; arrays are leaves. */
  put(7, "{\"op\":\"allreduce\",\"pg\":{\"name\":\"world\",\"ranks\":[0,1]},\"n\":1}");
  put(7, " { \"pg\" : { \"ranks\" : [2, 3], \"size\": 2 }, \"n\": 2.5e3, \"extra\": null } ");
  put(3, "{\"a\":{\"b\":{\"c\":true}}}");
  put(3, "{\"a\":{\"b\":{\"d\":false}}}");
  put(3, "{\"a\":{\"x\":\"\\u00e9\\n\"}}");
  s = take();
  CMT_STREQ(s, "{\"3\":{\"a\":{\"b\":{\"c\":true,\"d\":false},\"x\":\"\\u00e9\\n\"}},"
               "\"7\":{\"op\":\"allreduce\",\"pg\":{\"name\":\"world\",\"ranks\":[2,3],\"size\":2},"
               "\"n\":2.5e3,\"extra\":null}}");
  cm_free(s);
  s = take(); /* take resets */
  CMT_STREQ(s, "{}");
  cm_free(s);

  /* A type change is a leaf conflict: the later value replaces the whole subtree. */
  put(9, "{\"k\":{\"deep\":1}}");
  put(9, "{\"k\":[1,{\"z\":2}]}");
  put(9, "{\"k\":{\"again\":true}}");
  /* Duplicate keys in one blob merge as two puts would. */
  put(10, "{\"d\":{\"a\":1},\"d\":{\"b\":2}}");
  /* A non-object blob replaces. */
  put(11, "{\"a\":1}");
  put(11, "\"just a string\"");
  s = take();
  CMT_STREQ(s, "{\"9\":{\"k\":{\"again\":true}},\"10\":{\"d\":{\"a\":1,\"b\":2}},"
               "\"11\":\"just a string\"}");
  cm_free(s);

  /* Invalid JSON is rejected with CM_EINVAL and stores nothing. */
  static const char *bad[] = {
      "",         "{",         "{\"a\":}",     "{\"a\" 1}",   "{'a':1}",    "[1,]",
      "{\"a\":1,}", "01",      "1.",           "-",           "1e",         "tru",
      "nul",      "\"abc",     "\"\\x\"",      "\"\\u12\"",   "{\"a\":1} x", "{\"a\":\"\x01\"}",
      "[1 2]",    "{1:2}",     "NaN",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = cm_corr_metadata_put(5, bad[i], strlen(bad[i]));
    if (rc != CM_EINVAL) CMT_FAIL("'%s' was accepted (rc %d)", bad[i], rc);
    CMT_CONTAINS(cm_errmsg(), "invalid JSON metadata at byte");
  }
  /* Nesting is bounded. */
  char deep[2 * CM_CORR_MAX_NESTING + 8];
  size_t d = 0;
  for (int i = 0; i < CM_CORR_MAX_NESTING + 1; i++) deep[d++] = '[';
  for (int i = 0; i < CM_CORR_MAX_NESTING + 1; i++) deep[d++] = ']';
  CMT_EQ(cm_corr_metadata_put(5, deep, d), CM_EINVAL);
  CMT_CONTAINS(cm_errmsg(), "nesting too deep");
  CMT_OK(cm_corr_metadata_put(5, deep + 1, d - 2)); /* exactly the limit is fine */
  s = take();
  CMT_ASSERT(strncmp(s, "{\"5\":[[[", 8) == 0);
  cm_free(s);
  /* The length is honoured: text past len is ignored. */
  CMT_OK(cm_corr_metadata_put(6, "{\"a\":1}garbage", 7));
  /* id 0 means the current id; with none pushed it is an error. */
  CMT_EQ(cm_corr_metadata_put(0, "{}", 2), CM_ENOENT);
  uint64_t id = cm_corr_push();
  put(0, "{\"cur\":1}");
  CMT_OK(cm_corr_pop(NULL));
  s = take();
  char want[128];
  snprintf(want, sizeof want, "{\"6\":{\"a\":1},\"%llu\":{\"cur\":1}}", (unsigned long long)id);
  CMT_STREQ(s, want);
  cm_free(s);
  CMT_EQ(cm_corr_metadata_take(NULL, NULL), CM_EINVAL);
}

int main(void) {
  test_without_engine();
  test_metadata();
  test_nested_three_threads();
  test_chain_retirement();
  test_late_records_resolve();
  test_rejected_push();
  printf("test_correlation: ok\n");
  return 0;
}
