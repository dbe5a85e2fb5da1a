/*
 * test_engine_cycles.c: many sessions and many engines in one process, with no loss and no leak.
 *
 * Design. CUPTI cannot be initialized again once finalized, and a process may only hold one
 * subscriber, so the engine must start and stop activity sessions, and be freed and created
 * again, any number of times. Each cycle here registers an observer (which starts a session),
 * writes a cycle-dependent number of known kernel records, and unregisters it (which ends the
 * session with a device sync and a forced flush); the observer must have received exactly that
 * cycle's records, identified by hashing every field against fake_gen_record. Between cycles the
 * buffer pool must have every buffer back, and it must reuse buffers rather than allocate per
 * session. The fake's counters show the subscription's life: one subscribe per engine, one
 * unsubscribe per free, each kind enabled and disabled once per session, and cuptiFinalize never.
 * Finally the one-engine rule: a second engine is refused with CM_EBUSY, and so is an engine
 * while another tool holds CUPTI, with a message naming that tool; neither refusal leaves
 * anything behind that stops the next engine.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmt.h"
#include "cmt_records.h"
#include "cuptimon.h"
#include "fake_cupti.h"

#define CYCLES 200
#define ENGINES 20

/* ---- one cycle ------------------------------------------------------------------------------ */

static cm_engine *g_engine;
static int g_kernel, g_nf;
static cm_field_info *g_fi;

/* What the observer received in the current cycle. The callback runs on the thread calling
 * cm_unobserve (no delivery cadence is configured), so no lock is needed. */
static uint64_t g_got_n, g_got_sum, g_got_xor;

static void on_batch(void *ud, const cm_batch *b) {
  (void)ud;
  CMT_EQ(b->kind, g_kernel);
  CMT_EQ(b->ncols, g_nf);
  for (uint32_t i = 0; i < b->n; i++) {
    uint64_t h = (uint64_t)b->kind;
    for (uint32_t c = 0; c < b->ncols; c++)
      h = row_step(h, (int)c, column_value_resolved(g_engine, &b->cols[c], i));
    /* A sum and an XOR of mixed row hashes: order-independent, and a duplicate that replaces a
     * lost record changes both. */
    g_got_sum += h;
    g_got_xor ^= mix64(h);
  }
  g_got_n += b->n;
}

/* One session: observe, write `k` known records, unobserve; checks the observer got exactly
 * them and that the pool has every buffer back. `tag` keeps records of different cycles apart. */
static void one_cycle(uint32_t tag, uint64_t k, cm_selection *sel) {
  g_got_n = g_got_sum = g_got_xor = 0;
  uint32_t id = 0;
  CMT_OK(cm_observe(g_engine, sel, on_batch, NULL, &id));
  CMT_EQ(fake_kind_enabled(g_kernel), 1);
  cm_session_info si;
  CMT_OK(cm_session_info_get(g_engine, &si));
  CMT_EQ(si.active, 1);
  union {
    uint64_t align;
    unsigned char b[1024];
  } rec;
  uint64_t want_sum = 0, want_xor = 0;
  for (uint64_t j = 0; j < k; j++) {
    size_t size = fake_gen_record(g_kernel, tag, j, rec.b);
    CMT_GT(size, 0);
    uint64_t h = (uint64_t)g_kernel;
    for (int f = 0; f < g_nf; f++) h = row_step(h, f, record_value(rec.b, size, &g_fi[f]));
    want_sum += h;
    want_xor ^= mix64(h);
    CMT_EQ(fake_emit(rec.b, size, 0), 0);
  }
  CMT_OK(cm_unobserve(g_engine, id));
  if (g_got_n != k || g_got_sum != want_sum || g_got_xor != want_xor)
    CMT_FAIL("cycle %u: wrote %" PRIu64 " records, the observer received %" PRIu64
             " (checksums %s)", tag, k, g_got_n,
             g_got_sum == want_sum && g_got_xor == want_xor ? "match" : "differ");
  CMT_EQ(fake_kind_enabled(g_kernel), 0);
  CMT_OK(cm_session_info_get(g_engine, &si));
  CMT_EQ(si.active, 0);
  cm_stats st;
  CMT_OK(cm_stats_get(g_engine, &st));
  CMT_EQU(st.buffers_outstanding, 0);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep the progress lines when an assertion aborts */
  g_kernel = cm_kind_by_name("kernel");
  CMT_GT(g_kernel, 0);
  g_nf = cm_field_count(g_kernel);
  g_fi = calloc((size_t)g_nf, sizeof *g_fi);
  CMT_ASSERT(g_fi != NULL);
  for (int f = 0; f < g_nf; f++) CMT_OK(cm_field_info_get(g_kernel, f, &g_fi[f]));
  cm_selection *sel;
  CMT_OK(cm_selection_new(&sel));
  CMT_OK(cm_selection_add_id(sel, g_kernel, -1));

  /* 200 sessions on one engine. */
  fake_stats f0, f1;
  fake_get_stats(&f0);
  CMT_OK(cm_engine_new(&g_engine, NULL));
  cm_set_log(g_engine, log_to_stderr, NULL);
  uint64_t total = 0;
  for (uint32_t c = 0; c < CYCLES; c++) {
    uint64_t k = 1 + (c * 7919u) % 97; /* 1..97 records, varying from cycle to cycle */
    one_cycle(c, k, sel);
    total += k;
  }
  cm_stats st;
  CMT_OK(cm_stats_get(g_engine, &st));
  fake_get_stats(&f1);
  printf("%d sessions, %" PRIu64 " records: sessions %" PRIu64 ", buffers allocated %" PRIu64
         ", kernel enabled %" PRIu64 " times, disabled %" PRIu64 " times\n",
         CYCLES, total, st.sessions, st.buffers_allocated,
         f1.enable_calls[g_kernel] - f0.enable_calls[g_kernel],
         f1.disable_calls[g_kernel] - f0.disable_calls[g_kernel]);
  CMT_EQU(st.sessions, CYCLES);
  CMT_EQU(st.records_by_kind[g_kernel], total);
  CMT_EQU(st.records_dropped, 0);
  CMT_EQU(f1.enable_calls[g_kernel] - f0.enable_calls[g_kernel], CYCLES);
  CMT_EQU(f1.disable_calls[g_kernel] - f0.disable_calls[g_kernel], CYCLES);
  /* One thread writes, so one buffer at a time is in use: a pool that recycles needs a handful,
   * a pool that leaks one per session needs hundreds. */
  CMT_LEU(st.buffers_allocated, 4);

  /* The one-engine rule. */
  cm_engine *second = (cm_engine *)&second;
  CMT_EQ(cm_engine_new(&second, NULL), CM_EBUSY);
  CMT_ASSERT(second == NULL);
  CMT_ASSERT(strlen(cm_errmsg()) > 0);
  printf("second engine: %s\n", cm_errmsg());
  one_cycle(CYCLES, 5, sel); /* the refusal did not disturb the existing engine */
  cm_engine_free(g_engine);
  g_engine = NULL;

  /* 20 engines, one after another, each with a session. */
  fake_get_stats(&f0);
  for (uint32_t i = 0; i < ENGINES; i++) {
    CMT_OK(cm_engine_new(&g_engine, NULL));
    cm_set_log(g_engine, log_to_stderr, NULL);
    one_cycle(10000 + i, 1 + i, sel);
    cm_engine_free(g_engine);
    g_engine = NULL;
  }
  fake_get_stats(&f1);
  CMT_EQU(f1.subscribes - f0.subscribes, ENGINES);
  CMT_EQU(f1.unsubscribes - f0.unsubscribes, ENGINES);
  CMT_EQU(f1.subscribes, f1.unsubscribes);
  CMT_EQU(f1.finalize_calls, 0);
  printf("%d engines created and freed: subscribes %" PRIu64 ", unsubscribes %" PRIu64
         ", cuptiFinalize calls %" PRIu64 "\n",
         ENGINES, f1.subscribes - f0.subscribes, f1.unsubscribes - f0.unsubscribes,
         f1.finalize_calls);

  /* Another tool holding CUPTI: refused, with its name in the message. */
  fake_set_foreign_subscriber("Nsight Systems");
  cm_engine *e = (cm_engine *)&e;
  int rc = cm_engine_new(&e, NULL);
  printf("foreign subscriber: %s: %s\n", cm_err_name(rc), cm_errmsg());
  CMT_EQ(rc, CM_EBUSY);
  CMT_ASSERT(e == NULL);
  CMT_CONTAINS(cm_errmsg(), "Nsight Systems");
  /* The engine's advice may itself mention Nsight Systems, so a name it cannot know proves the
   * message carries the holder CUPTI reported. */
  fake_set_foreign_subscriber("cmt-probe-tool 7.3");
  CMT_EQ(cm_engine_new(&e, NULL), CM_EBUSY);
  CMT_ASSERT(e == NULL);
  CMT_CONTAINS(cm_errmsg(), "cmt-probe-tool 7.3");
  fake_set_foreign_subscriber(NULL);
  fake_get_stats(&f0);
  CMT_EQU(f0.subscribes, f0.unsubscribes);

  /* Neither refusal left anything half-registered. */
  CMT_OK(cm_engine_new(&g_engine, NULL));
  one_cycle(20000, 11, sel);
  cm_engine_free(g_engine);
  fake_get_stats(&f1);
  CMT_EQU(f1.finalize_calls, 0);
  CMT_EQU(f1.subscribes, f1.unsubscribes);
  CMT_EQU(f1.records_dropped, 0);

  cm_selection_free(sel);
  free(g_fi);
  printf("ok\n");
  return 0;
}
