/*
 * test_engine_lag.c: CUPTI's stage lag (cm_stats lag_cupti_ns) is that of the kind most behind in
 * a buffer, not of the buffer's last record.
 *
 * Records of several kinds share a buffer, and CUPTI can be seconds behind on one of them while
 * the records beside them are fresh (kernel records, whose timestamps come from the device,
 * behind the API records of the same launches). A lag read off the buffer's last record then
 * says "on time" while CUPTI holds seconds of kernel records. Here a kernel record that ended 3 s
 * ago is written before a runtime record that ends now: the lag must be about 3 s. A buffer of
 * fresh records alone must give a lag under a second.
 *
 * The lag guard's measure (cm__engine_take_lag_held_max) is how long CUPTI held a record before
 * asking for the buffer it wrote it into. A fresh record that then waits 300 ms in a partly filled
 * buffer makes lag_cupti_ns 300 ms, but CUPTI held it back for nothing, so the guard's measure
 * stays near 0; the kernel record 3 s old, written into a new buffer, is held 3 s.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cupti.h>

#include "cm_internal.h"
#include "cmt.h"
#include "cmt_engine.h"
#include "cuptimon.h"
#include "fake_cupti.h"

static void on_batch(void *ud, const cm_batch *b) {
  (void)ud;
  (void)b;
}

static uint64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Writes a runtime API record from `start` to `end`. */
static void emit_api(uint64_t start, uint64_t end, uint32_t correlation) {
  CUpti_ActivityAPI a;
  memset(&a, 0, sizeof a);
  a.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  a.cbid = 211; /* cudaLaunchKernel_v7000 */
  a.start = start;
  a.end = end;
  a.correlationId = correlation;
  CMT_EQ(fake_emit(&a, sizeof a, 0), 0);
}

/* The lag CUPTI's stage reports after a plain flush of what was written. */
static uint64_t lag_after_flush(cm_engine *e) {
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 5000));
  cm_stats st;
  memset(&st, 0, sizeof st);
  cm_stats_get(e, &st);
  return st.lag_cupti_ns;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  cmt_engine t = cmt_engine_start(on_batch);
  cm_engine *e = t.e;

  /* Fresh records only: the lag is the time from writing to the flush, well under a second. */
  uint64_t now = realtime_ns();
  unsigned char rec[256];
  size_t n = fake_make_kernel(rec, "fresh", 0, 7, now - 20000, now - 10000, 1);
  CMT_EQ(fake_emit(rec, n, 0), 0);
  emit_api(now - 30000, now - 5000, 1);
  uint64_t fresh = lag_after_flush(e);
  printf("fresh kernel and API records: lag_cupti_ns %" PRIu64 "\n", fresh);
  CMT_LT(fresh, 1000000000ull);

  /* A fresh record that waits 300 ms in its buffer: late by lag_cupti_ns, not held by CUPTI. */
  (void)cm__engine_take_lag_held_max(e);
  now = realtime_ns();
  emit_api(now - 30000, now - 5000, 4);
  struct timespec pause = {0, 300000000};
  nanosleep(&pause, NULL);
  uint64_t waited = lag_after_flush(e);
  uint64_t held = cm__engine_take_lag_held_max(e);
  printf("a fresh record that waited 300 ms in its buffer: lag_cupti_ns %" PRIu64
         ", held %" PRIu64 "\n", waited, held);
  CMT_GE(waited, 290000000ull);
  CMT_LT(held, 100000000ull);

  /* A kernel record 3 s old written before a fresh API record: the kernel's lag is reported. */
  now = realtime_ns();
  n = fake_make_kernel(rec, "late", 0, 7, now - 3000000000ull - 10000, now - 3000000000ull, 2);
  CMT_EQ(fake_emit(rec, n, 0), 0);
  emit_api(now - 30000, now - 1000, 3);
  uint64_t late = lag_after_flush(e);
  printf("a kernel record 3 s behind, then a fresh API record: lag_cupti_ns %" PRIu64 "\n", late);
  CMT_GE(late, 2900000000ull);
  CMT_LT(late, 10000000000ull);
  held = cm__engine_take_lag_held_max(e);
  printf("the same: held %" PRIu64 "\n", held);
  CMT_GE(held, 2900000000ull);
  CMT_LT(held, 10000000000ull);
  CMT_EQ(cm__engine_take_lag_held_max(e), 0); /* taken: nothing decoded since */

  cmt_engine_end(&t);
  printf("ok\n");
  return 0;
}
