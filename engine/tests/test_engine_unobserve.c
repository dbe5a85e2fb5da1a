/*
 * test_engine_unobserve.c: an observer that goes receives every record of its kinds made before
 * they stopped, while producers keep writing.
 *
 * Design. The fake's unpaced producers write kernel records for the whole test, as fast as the
 * CPU allows; a record is written (and counted by the producer) only while kernel is enabled.
 * One observer selects kernel and nothing else selects it; it comes and goes 20 times, as a duty
 * cycle's windows do (the last observer: the session ends each time), and 20 more times beside
 * a second observer of memcpy (not the last: a plain flush). Every kernel record written must
 * have been delivered to it: cm_unobserve disables the kinds before its flush, so no record is
 * written between the flush and the disable and then decoded with no observer to take it.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "cmt.h"
#include "cuptimon.h"
#include "fake_cupti.h"

static _Atomic uint64_t g_delivered;

static void on_batch(void *ud, const cm_batch *b) {
  (void)ud;
  atomic_fetch_add(&g_delivered, b->n);
}

static cm_selection *sel_of(const char *spec) {
  cm_selection *s = NULL;
  CMT_OK(cm_selection_new(&s));
  CMT_OK(cm_selection_parse(s, spec));
  return s;
}

/* n windows of the kernel observer; `other` (0: none) stays registered throughout. */
static void windows(cm_engine *e, cm_selection *k, int n) {
  for (int i = 0; i < n; i++) {
    uint32_t id = 0;
    uint64_t before = atomic_load(&g_delivered);
    CMT_OK(cm_observe(e, k, on_batch, NULL, &id));
    /* Until some records arrived, so each window holds a stream that is cut mid-flight. */
    for (int spin = 0; spin < 2000 && atomic_load(&g_delivered) - before < 20000; spin++) {
      CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 5000));
      usleep(1000);
    }
    CMT_OK(cm_unobserve(e, id));
    usleep(2000); /* the producers run with kernel off */
  }
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int kernel = cm_kind_by_name("kernel"), memcpy_k = cm_kind_by_name("memcpy");
  CMT_GT(kernel, 0);
  CMT_GT(memcpy_k, 0);
  cm_config cfg;
  cm_config_init(&cfg);
  cfg.fence_timeout_ms = 30000;
  cm_engine *e = NULL;
  CMT_OK(cm_engine_new(&e, &cfg));
  cm_selection *k = sel_of("kernel:name,start"), *m = sel_of("memcpy:bytes");

  int kinds[1] = {kernel};
  CMT_EQ(fake_start_producers(2, kinds, 1), 0);
  windows(e, k, 20);
  uint32_t mid = 0;
  CMT_OK(cm_observe(e, m, on_batch, NULL, &mid));
  windows(e, k, 20);
  CMT_OK(cm_unobserve(e, mid));
  int64_t written = fake_stop_producers();
  CMT_GT(written, 0);
  fake_stats fs;
  fake_get_stats(&fs);
  CMT_EQU(fs.records_dropped, 0);
  printf("producers wrote %" PRId64 " kernel records in 40 windows; the observer got %" PRIu64 "\n",
         written, atomic_load(&g_delivered));
  CMT_EQU((uint64_t)written, atomic_load(&g_delivered));
  cm_selection_free(k);
  cm_selection_free(m);
  cm_engine_free(e);
  printf("ok\n");
  return 0;
}
