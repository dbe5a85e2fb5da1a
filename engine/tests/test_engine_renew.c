/*
 * test_engine_renew.c: renewing CUPTI under a running trace (cm_cupti_renew).
 *
 * The fake's cuptiFinalize forgets everything, as CUPTI documents, and counts what it still held
 * (lost with CUPTI's state) and every CUPTI call made between it and the next cuptiSubscribe. The
 * test checks that a renewal hands every record written before it to the observer, that the
 * observer's kinds, its toggles and the armed callbacks are back after it, that nothing is left
 * in CUPTI or leaked over many renewals, that a thread writing records all the while loses none
 * (each record the fake took is seen), and that a renewal is refused where it must be.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cupti.h>

#include "cm_internal.h"
#include "cmt.h"
#include "cmt_engine.h"
#include "cuptimon.h"
#include "fake_cupti.h"

static fake_stats fstats(void) {
  fake_stats f;
  fake_get_stats(&f);
  return f;
}

/* The writer thread: kernel records until told to stop, counting those the fake took (0) and
 * those it refused because the kind was off (2: the renewal's gap). */
static atomic_bool g_stop;
static uint64_t g_taken, g_refused;

static void *writer(void *arg) {
  (void)arg;
  uint32_t i = 0;
  while (!atomic_load(&g_stop)) {
    int rc = cmt_emit_kernel(++i);
    if (rc == 0) g_taken++;
    else if (rc == 2) g_refused++;
  }
  return NULL;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  cm_engine *e = NULL;
  CMT_OK(cm_engine_new(&e, NULL));
  cm_selection *sel = NULL;
  CMT_OK(cm_selection_new(&sel));
  CMT_OK(cm_selection_parse(sel, "kernel:start,stop;runtime:start,stop"));
  const uint32_t ctx_created = CUPTI_CBID_RESOURCE_CONTEXT_CREATED;

  /* Nothing traced: nothing to renew. */
  CMT_EQ(cm_cupti_renew(e, 0), CM_ESTATE);
  CMT_CONTAINS(cm_errmsg(), "nothing is traced");
  CMT_EQU(fstats().finalize_calls, 0);

  /* One renewal: every record written before it reaches the observer first; the kinds, the
   * pinned callbacks and a consumer's armed callback are back after it. */
  memset(cmt_seen, 0, sizeof cmt_seen);
  uint32_t id = 0;
  CMT_OK(cm_observe(e, sel, cmt_count_batch, NULL, &id));
  CMT_OK(cm_callback_arm(e, CUPTI_CB_DOMAIN_RUNTIME_API, 13));
  for (uint32_t i = 1; i <= 1000; i++) {
    CMT_EQ(cmt_emit_kernel(i), 0);
    CMT_EQ(cmt_emit_api(i), 0);
  }
  CMT_OK(cm_cupti_renew(e, 0));
  CMT_EQU(cmt_seen[CM_KIND_CONCURRENT_KERNEL], 1000);
  CMT_EQU(cmt_seen[CM_KIND_RUNTIME], 1000);
  fake_stats f = fstats();
  CMT_EQU(f.finalize_calls, 1);
  CMT_EQU(f.finalize_in_callback, 1);
  CMT_EQU(f.finalize_lost_records, 0);
  CMT_EQU(f.finalize_held_buffers, 0);
  CMT_EQ(cm_cupti_detached(e), 0);
  CMT_EQ(fake_callback_enabled(CUPTI_CB_DOMAIN_RESOURCE, ctx_created), 1);
  CMT_EQ(fake_callback_enabled(CUPTI_CB_DOMAIN_RUNTIME_API, 13), 1);
  CMT_EQ(fake_per_thread_attr(), 0);
  CMT_EQU(cm_enabled_kinds(e) & (1ull << CM_KIND_CONCURRENT_KERNEL | 1ull << CM_KIND_RUNTIME),
          1ull << CM_KIND_CONCURRENT_KERNEL | 1ull << CM_KIND_RUNTIME);
  for (uint32_t i = 1; i <= 500; i++) {
    CMT_EQ(cmt_emit_kernel(i), 0);
    CMT_EQ(cmt_emit_api(i), 0);
  }
  CMT_OK(cm_callback_disarm(e, CUPTI_CB_DOMAIN_RUNTIME_API, 13));
  cm_stats st;
  CMT_OK(cm_stats_get(e, &st));
  CMT_EQU(st.cupti_renewals, 1);
  CMT_ASSERT(st.cupti_renew_gap_ns > 0);
  CMT_EQU(st.cupti_detaches, 0);

  /* Twenty more, with records between them: exact counts, no buffer left or leaked. */
  for (uint32_t r = 0; r < 20; r++) {
    for (uint32_t i = 1; i <= 100 + r; i++) CMT_EQ(cmt_emit_kernel(i), 0);
    CMT_OK(cm_cupti_renew(e, 0));
  }
  CMT_OK(cm_unobserve(e, id));
  uint64_t want_k = 1000 + 500;
  for (uint32_t r = 0; r < 20; r++) want_k += 100 + r;
  CMT_EQU(cmt_seen[CM_KIND_CONCURRENT_KERNEL], want_k);
  CMT_EQU(cmt_seen[CM_KIND_RUNTIME], 1500);
  CMT_OK(cm_stats_get(e, &st));
  CMT_EQU(st.cupti_renewals, 21);
  CMT_EQU(st.buffers_outstanding, 0);
  CMT_EQU(st.records_dropped, 0);
  f = fstats();
  CMT_EQU(f.finalize_calls, 21);
  CMT_EQU(f.finalize_lost_records, 0);
  CMT_EQU(f.finalize_held_buffers, 0);
  CMT_EQU(f.calls_while_finalized, 0);
  printf("renew: 21 renewals, %.2f ms untraced each\n", (double)st.cupti_renew_gap_ns / 21 / 1e6);

  /* CUPTI behind on kernels: what it writes only flush by flush still reaches the observer
   * before the finalize, none is lost inside CUPTI. */
  memset(cmt_seen, 0, sizeof cmt_seen);
  CMT_OK(cm_observe(e, sel, cmt_count_batch, NULL, &id));
  fake_set_kernel_backlog(7);
  for (uint32_t i = 1; i <= 200; i++) CMT_EQ(cmt_emit_kernel(i), 0);
  CMT_OK(cm_cupti_renew(e, 0));
  fake_set_kernel_backlog(0);
  CMT_EQU(fstats().finalize_lost_records, 0);
  CMT_EQU(cmt_seen[CM_KIND_CONCURRENT_KERNEL], 200);

  /* A thread writes all the while: every record the fake took reaches the observer, the ones
   * written while the kinds were off were refused by the fake (never written), and none is lost
   * at any of the renewals. */
  memset(cmt_seen, 0, sizeof cmt_seen);
  pthread_t th;
  CMT_EQ(pthread_create(&th, NULL, writer, NULL), 0);
  for (int r = 0; r < 30; r++) {
    struct timespec nap = {0, 2000000};
    nanosleep(&nap, NULL);
    int rc = cm_cupti_renew(e, 2000);
    /* CUPTI (the fake) still busy at the deadline is a refusal that leaves the kinds on. */
    CMT_ASSERT(rc == 0 || rc == CM_EAGAIN);
  }
  atomic_store(&g_stop, true);
  CMT_EQ(pthread_join(th, NULL), 0);
  CMT_OK(cm_unobserve(e, id));
  CMT_OK(cm_stats_get(e, &st));
  f = fstats();
  printf("renew under writes: %" PRIu64 " records taken, %" PRIu64 " refused in the gaps, %" PRIu64
         " seen, %" PRIu64 " renewals in all\n",
         g_taken, g_refused, cmt_seen[CM_KIND_CONCURRENT_KERNEL], st.cupti_renewals);
  CMT_EQU(cmt_seen[CM_KIND_CONCURRENT_KERNEL], g_taken);
  CMT_EQU(st.records_dropped, 0);
  CMT_EQU(f.finalize_lost_records, 0);
  CMT_EQU(f.finalize_held_buffers, 0);
  CMT_EQU(f.calls_while_finalized, 0);
  CMT_ASSERT(st.cupti_renewals > 22);

  /* Refused during a capture (a synchronize would invalidate it), with the kinds left on. */
  CMT_OK(cm_observe(e, sel, cmt_count_batch, NULL, &id));
  int stream = 0;
  fake_stream_begin_capture(&stream, 1);
  CMT_EQ(cm_cupti_renew(e, 0), CM_EBUSY);
  CMT_CONTAINS(cm_errmsg(), "capture");
  CMT_EQ(cmt_emit_kernel(1), 0);
  CMT_EQ(fake_stream_end_capture(&stream, 1), 0);
  CMT_OK(cm_cupti_renew(e, 0));

  /* Refused for good once PM sampling has initialized CUPTI's profiler. */
  static const char *const metric[] = {"sm__cycles_active.avg"};
  uint32_t pm = 0;
  CMT_OK(cm_pm_sample_add(e, 0, metric, 1, 1000, &pm));
  CMT_OK(cm_pm_sample_remove(e, pm));
  CMT_EQ(cm_cupti_renew(e, 0), CM_ENOSYS);
  CMT_CONTAINS(cm_errmsg(), "PM sampling");
  CMT_EQ(cmt_emit_kernel(2), 0);
  CMT_OK(cm_unobserve(e, id));

  cm_selection_free(sel);
  cm_engine_free(e);
  CMT_EQU(fstats().calls_while_finalized, 0);
  printf("ok\n");
  return 0;
}
