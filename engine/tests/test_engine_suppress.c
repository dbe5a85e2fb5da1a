/*
 * test_engine_suppress.c: the engine's suppressed kinds (cm__engine_set_suppressed), which the
 * agent's lag guard uses to have CUPTI stop writing kinds while CUPTI is behind.
 *
 * A suppressed kind is disabled in CUPTI at once, whatever the observers select, so the fake
 * refuses new records of it; the observer keeps its selection, so the records CUPTI had already
 * written and still holds (the fake's kernel backlog) reach it at the following flushes, and none
 * is counted as dropped or late. A narrowing selection does not lift it; lifting it (0) enables
 * the selected kinds again.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cupti.h>

#include "cm_internal.h"
#include "cmt.h"
#include "cmt_engine.h"
#include "cuptimon.h"
#include "fake_cupti.h"

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  cmt_engine t = cmt_engine_start(cmt_count_batch);
  cm_engine *e = t.e;
  cm_selection *s = t.sel;
  uint32_t id = t.id;
  const uint64_t api = 1ull << CM_KIND_RUNTIME, kern = 1ull << CM_KIND_CONCURRENT_KERNEL;
  CMT_EQU(cm__engine_enabled(e) & (api | kern), api | kern);

  /* 100 kernel records held by the fake (5 written per flush), 100 API records written. */
  fake_set_kernel_backlog(5);
  for (uint32_t i = 1; i <= 100; i++) {
    CMT_EQ(cmt_emit_kernel(i), 0);
    CMT_EQ(cmt_emit_api(i), 0);
  }

  /* Runtime, then kernels, are suppressed: new records of them are refused at once. */
  CMT_OK(cm__engine_set_suppressed(e, api));
  CMT_EQU(cm__engine_enabled(e) & (api | kern), kern);
  CMT_EQ(cmt_emit_api(101), 2);
  CMT_OK(cm__engine_set_suppressed(e, api | kern));
  CMT_EQU(cm__engine_enabled(e) & (api | kern), 0);
  CMT_EQ(cmt_emit_kernel(101), 2);

  /* What CUPTI held still arrives, flush by flush, with nothing dropped. */
  for (int i = 0; i < 40 && cmt_seen[CM_KIND_CONCURRENT_KERNEL] < 100; i++)
    CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 5000));
  printf("after suppressing both: kernel %" PRIu64 " runtime %" PRIu64 "\n",
         cmt_seen[CM_KIND_CONCURRENT_KERNEL], cmt_seen[CM_KIND_RUNTIME]);
  CMT_EQU(cmt_seen[CM_KIND_CONCURRENT_KERNEL], 100);
  CMT_EQU(cmt_seen[CM_KIND_RUNTIME], 100);
  cm_stats st;
  memset(&st, 0, sizeof st);
  cm_stats_get(e, &st);
  CMT_EQU(st.records_dropped, 0);
  /* With every kind off in CUPTI, the buffers that came back were given back, not kept. */
  printf("buffers: allocated %" PRIu64 " free %" PRIu64 " outstanding %" PRIu64 "\n",
         st.buffers_allocated, st.buffers_free, st.buffers_outstanding);
  CMT_EQU(st.buffers_free, 0);

  /* A new observer (a SELECT) does not lift the suppression. */
  uint32_t id2 = 0;
  CMT_OK(cm_observe(e, s, cmt_count_batch, NULL, &id2));
  CMT_OK(cm_unobserve(e, id));
  CMT_EQU(cm__engine_enabled(e) & (api | kern), 0);
  CMT_EQ(cmt_emit_api(102), 2);

  /* Lifting it enables the selected kinds again. */
  fake_set_kernel_backlog(0);
  CMT_OK(cm__engine_set_suppressed(e, 0));
  CMT_EQU(cm__engine_enabled(e) & (api | kern), api | kern);
  CMT_EQ(cmt_emit_api(103), 0);
  CMT_EQ(cmt_emit_kernel(103), 0);
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 5000));
  CMT_EQU(cmt_seen[CM_KIND_RUNTIME], 101);
  CMT_EQU(cmt_seen[CM_KIND_CONCURRENT_KERNEL], 101);

  t.id = id2;
  cmt_engine_end(&t);
  printf("ok\n");
  return 0;
}
