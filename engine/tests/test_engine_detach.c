/*
 * test_engine_detach.c: detaching CUPTI while nothing is traced (cm_cupti_detach), and attaching
 * it again with the next observer.
 *
 * The fake's cuptiFinalize forgets everything, as CUPTI documents: kinds, callbacks, the buffer
 * and timestamp callbacks, the attributes; it counts the records and buffers it still held (lost
 * with CUPTI's state), whether it ran inside a subscriber callback (the call site CUPTI
 * recommends), and every CUPTI call made between it and the next cuptiSubscribe (each one would
 * initialize the real CUPTI again). The test checks that a detach loses nothing, that a detached
 * engine calls nothing in CUPTI, that the next observer finds every callback and registration
 * back and sees its records exactly, over many cycles without a buffer leaked, and that the
 * detach is refused while something still needs CUPTI.
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

/* One traced session: an observer, `n` kernel and runtime records, the observer gone; checks
 * that the observer saw exactly what was written. */
static void session(cm_engine *e, cm_selection *sel, uint32_t n) {
  memset(cmt_seen, 0, sizeof cmt_seen);
  uint32_t id = 0;
  CMT_OK(cm_observe(e, sel, cmt_count_batch, NULL, &id));
  for (uint32_t i = 1; i <= n; i++) {
    CMT_EQ(cmt_emit_kernel(i), 0);
    CMT_EQ(cmt_emit_api(i), 0);
  }
  CMT_OK(cm_unobserve(e, id));
  CMT_EQU(cmt_seen[CM_KIND_CONCURRENT_KERNEL], n);
  CMT_EQU(cmt_seen[CM_KIND_RUNTIME], n);
}

/* The engine's last log line that contains "attached again" (the attach's timing). */
static char g_attach_line[512];

static void keep_attach_line(void *ud, int level, const char *msg) {
  (void)ud;
  (void)level;
  if (strstr(msg, "attached again")) snprintf(g_attach_line, sizeof g_attach_line, "%s", msg);
}

static fake_stats fstats(void) {
  fake_stats f;
  fake_get_stats(&f);
  return f;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  cm_engine *e = NULL;
  CMT_OK(cm_engine_new(&e, NULL));
  cm_selection *sel = NULL;
  CMT_OK(cm_selection_new(&sel));
  CMT_OK(cm_selection_parse(sel, "kernel:start,stop;runtime:start,stop"));
  const uint32_t ctx_created = CUPTI_CBID_RESOURCE_CONTEXT_CREATED;
  CMT_EQ(fake_callback_enabled(CUPTI_CB_DOMAIN_RESOURCE, ctx_created), 1);

  /* Refused while an observer is registered. */
  uint32_t id = 0;
  CMT_OK(cm_observe(e, sel, cmt_count_batch, NULL, &id));
  CMT_EQ(cm_cupti_detach(e, 0), CM_EBUSY);
  CMT_CONTAINS(cm_errmsg(), "observer");
  CMT_OK(cm_unobserve(e, id));

  /* Refused while a consumer has armed a callback; allowed once it is disarmed. */
  CMT_OK(cm_callback_arm(e, CUPTI_CB_DOMAIN_RUNTIME_API, 13));
  CMT_EQ(cm_cupti_detach(e, 0), CM_EBUSY);
  CMT_CONTAINS(cm_errmsg(), "armed");
  CMT_OK(cm_callback_disarm(e, CUPTI_CB_DOMAIN_RUNTIME_API, 13));
  CMT_EQU(fstats().finalize_calls, 0);

  /* A session, then the detach: at the API exit of the engine's own driver call. */
  session(e, sel, 1000);
  CMT_OK(cm_cupti_detach(e, 0));
  CMT_EQ(cm_cupti_detached(e), 1);
  fake_stats f = fstats();
  CMT_EQU(f.finalize_calls, 1);
  CMT_EQU(f.finalize_in_callback, 1);
  CMT_EQU(f.finalize_lost_records, 0);
  CMT_EQU(f.finalize_held_buffers, 0);
  CMT_EQ(fake_callback_enabled(CUPTI_CB_DOMAIN_RESOURCE, ctx_created), 0);

  /* Detached: a second detach, flushes of both modes and the stats call nothing in CUPTI, and
   * no record can be written. */
  CMT_OK(cm_cupti_detach(e, 0));
  CMT_OK(cm_flush(e, CM_FLUSH_SYNC, 1000));
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 1000));
  cm_stats st;
  CMT_OK(cm_stats_get(e, &st));
  CMT_EQU(st.cupti_detaches, 1);
  CMT_EQU(st.buffers_outstanding, 0);
  CMT_EQ(cmt_emit_kernel(1), 2);
  f = fstats();
  CMT_EQU(f.finalize_calls, 1);
  CMT_EQU(f.calls_while_finalized, 0);

  /* An external-correlation frame pushed before a detach is not popped in CUPTI after it. */
  session(e, sel, 10);
  uint64_t corr = cm_corr_push();
  CMT_ASSERT(corr != 0);
  CMT_EQ(fake_external_depth(CM_CORR_EXTERNAL_KIND), 1);
  CMT_OK(cm_cupti_detach(e, 0));
  uint64_t popped = 0;
  CMT_OK(cm_corr_pop(&popped));
  CMT_EQU(popped, corr);
  CMT_EQU(fstats().calls_while_finalized, 0);

  /* The next observer attaches CUPTI again: the subscription, the pinned callbacks, the buffer
   * callbacks and the per-thread attribute are back, and its records arrive exactly. Twenty
   * cycles leak no buffer and lose no record. */
  uint64_t subs0 = fstats().subscribes;
  cm_set_log(e, keep_attach_line, NULL);
  for (int cycle = 0; cycle < 20; cycle++) {
    session(e, sel, 500 + (uint32_t)cycle);
    CMT_EQ(cm_cupti_detached(e), 0);
    CMT_OK(cm_cupti_detach(e, 0));
    CMT_OK(cm_stats_get(e, &st));
    CMT_EQU(st.buffers_outstanding, 0);
  }
  f = fstats();
  CMT_EQU(f.subscribes - subs0, 20);
  CMT_EQU(f.finalize_calls, 22);
  CMT_EQU(f.finalize_in_callback, 22);
  CMT_EQU(f.finalize_lost_records, 0);
  CMT_EQU(f.finalize_held_buffers, 0);
  CMT_EQU(f.calls_while_finalized, 0);
  CMT_OK(cm_stats_get(e, &st));
  CMT_EQU(st.cupti_detaches, 22);
  CMT_EQU(st.records_dropped, 0);
  /* The attach's log line times each of its CUPTI steps apart. */
  printf("last attach: %s\n", g_attach_line);
  CMT_CONTAINS(g_attach_line, "CUPTI attached again in");
  CMT_CONTAINS(g_attach_line, "cuptiSubscribe");
  CMT_CONTAINS(g_attach_line, "the activity callbacks");
  CMT_CONTAINS(g_attach_line, "external correlation");
  cm_set_log(e, NULL, NULL);
  printf("detach: 22 detaches, %.2f ms each; attach %.2f ms each\n",
         (double)st.cupti_detach_ns / 22 / 1e6, (double)st.cupti_attach_ns / 21 / 1e6);

  /* Arming a callback while detached attaches CUPTI again, with the pins and the arm. */
  CMT_OK(cm_callback_arm(e, CUPTI_CB_DOMAIN_RUNTIME_API, 13));
  CMT_EQ(cm_cupti_detached(e), 0);
  CMT_EQ(fake_callback_enabled(CUPTI_CB_DOMAIN_RUNTIME_API, 13), 1);
  CMT_EQ(fake_callback_enabled(CUPTI_CB_DOMAIN_RESOURCE, ctx_created), 1);
  CMT_EQ(fake_per_thread_attr(), 0);
  CMT_OK(cm_callback_disarm(e, CUPTI_CB_DOMAIN_RUNTIME_API, 13));

  /* CUPTI behind on kernels: records it writes only flush by flush are delivered (late, and
   * counted so) before the detach, never lost inside CUPTI. */
  memset(cmt_seen, 0, sizeof cmt_seen);
  CMT_OK(cm_observe(e, sel, cmt_count_batch, NULL, &id));
  fake_set_kernel_backlog(7);
  for (uint32_t i = 1; i <= 200; i++) CMT_EQ(cmt_emit_kernel(i), 0);
  CMT_OK(cm_unobserve(e, id));
  CMT_OK(cm_stats_get(e, &st));
  uint64_t before_late = st.records_dropped;
  CMT_OK(cm_cupti_detach(e, 0));
  fake_set_kernel_backlog(0);
  CMT_OK(cm_stats_get(e, &st));
  f = fstats();
  printf("backlog: %" PRIu64 " kernel records delivered, %" PRIu64 " counted late at the detach\n",
         cmt_seen[CM_KIND_CONCURRENT_KERNEL], st.records_dropped - before_late);
  CMT_EQU(f.finalize_lost_records, 0);
  CMT_EQU(cmt_seen[CM_KIND_CONCURRENT_KERNEL] + st.records_dropped, 200);

  /* cm_cupti_attach attaches without an observer; a second call changes nothing. */
  CMT_EQ(cm_cupti_detached(e), 1);
  uint64_t subs1 = fstats().subscribes;
  CMT_OK(cm_cupti_attach(e));
  CMT_OK(cm_cupti_attach(e));
  CMT_EQ(cm_cupti_detached(e), 0);
  CMT_EQU(fstats().subscribes - subs1, 1);
  CMT_EQ(fake_callback_enabled(CUPTI_CB_DOMAIN_RESOURCE, ctx_created), 1);

  /* A cuptiFinalize that blocks (CUPTI waiting for the application's threads, as on a GPU)
   * does not hold the detaching thread past its deadline: the detach says so, nothing calls
   * CUPTI while it runs, an observer is refused meanwhile, and once it has returned the next
   * observer attaches again and sees its records exactly. */
  CMT_OK(cm_cupti_attach(e));
  session(e, sel, 100);
  f = fstats();
  uint64_t fin0 = f.finalize_calls, calls0 = f.calls_while_finalized;
  fake_set_finalize_block_ms(700);
  uint64_t t0 = cm__mono_ms();
  CMT_EQ(cm_cupti_detach(e, 50), CM_ETIMEDOUT);
  uint64_t waited = cm__mono_ms() - t0;
  printf("blocked finalize: the detach returned after %" PRIu64 " ms\n", waited);
  CMT_ASSERT(waited < 600);
  CMT_CONTAINS(cm_errmsg(), "did not return");
  CMT_EQ(cm_cupti_detached(e), 0);
  CMT_EQ(cm_observe(e, sel, cmt_count_batch, NULL, &id), CM_EAGAIN);
  CMT_CONTAINS(cm_errmsg(), "still being finalized");
  CMT_EQ(cm_callback_arm(e, CUPTI_CB_DOMAIN_RUNTIME_API, 13), CM_EAGAIN);
  CMT_EQ(cm_cupti_detach(e, 0), CM_EAGAIN);
  CMT_OK(cm_flush(e, CM_FLUSH_SYNC, 100));
  CMT_OK(cm_stats_get(e, &st));
  uint64_t dropped0 = st.records_dropped;
  struct timespec nap = {0, 900000000};
  nanosleep(&nap, NULL);
  fake_set_finalize_block_ms(0);
  f = fstats();
  CMT_EQU(f.finalize_calls, fin0 + 1);
  CMT_EQU(f.calls_while_finalized, calls0);
  session(e, sel, 300);
  CMT_EQ(cm_cupti_detached(e), 0);
  CMT_OK(cm_stats_get(e, &st));
  CMT_EQU(st.records_dropped, dropped0);
  CMT_EQU(fstats().finalize_lost_records, 0);
  CMT_OK(cm_cupti_detach(e, 0));

  /* A cuptiSubscribe that blocks (as an attach can for seconds on a GPU with many launching threads)
   * does not hold the attaching thread past the attach's wait (500 ms): the observer is refused
   * then, the engine stays detached and calls nothing else in CUPTI, a second attach meanwhile is
   * refused at once, and once the subscription has returned the next observer takes it (no
   * second subscription) and sees its records exactly. */
  CMT_EQ(cm_cupti_detached(e), 1);
  f = fstats();
  uint64_t subs2 = f.subscribes, calls1 = f.calls_while_finalized;
  fake_set_subscribe_delay_ms(1500);
  t0 = cm__mono_ms();
  CMT_EQ(cm_observe(e, sel, cmt_count_batch, NULL, &id), CM_EAGAIN);
  waited = cm__mono_ms() - t0;
  printf("blocked subscribe: the attach returned after %" PRIu64 " ms: %s\n", waited, cm_errmsg());
  CMT_ASSERT(waited >= 400 && waited < 1400);
  CMT_CONTAINS(cm_errmsg(), "did not return within");
  fake_set_subscribe_delay_ms(0); /* the subscription under way keeps its 1.5 s */
  CMT_EQ(cm_cupti_detached(e), 1);
  t0 = cm__mono_ms();
  CMT_EQ(cm_cupti_attach(e), CM_EAGAIN);
  CMT_ASSERT(cm__mono_ms() - t0 < 300);
  CMT_CONTAINS(cm_errmsg(), "still attaching");
  CMT_OK(cm_flush(e, CM_FLUSH_SYNC, 100));
  CMT_OK(cm_cupti_detach(e, 0));
  int orc = CM_EAGAIN;
  struct timespec tick = {0, 50000000};
  for (int i = 0; i < 200 && orc == CM_EAGAIN; i++) {
    nanosleep(&tick, NULL);
    orc = cm_observe(e, sel, cmt_count_batch, NULL, &id);
  }
  CMT_OK(orc);
  memset(cmt_seen, 0, sizeof cmt_seen);
  for (uint32_t i = 1; i <= 300; i++) {
    CMT_EQ(cmt_emit_kernel(i), 0);
    CMT_EQ(cmt_emit_api(i), 0);
  }
  CMT_OK(cm_unobserve(e, id));
  CMT_EQU(cmt_seen[CM_KIND_CONCURRENT_KERNEL], 300);
  CMT_EQU(cmt_seen[CM_KIND_RUNTIME], 300);
  f = fstats();
  CMT_EQU(f.subscribes - subs2, 1);
  CMT_EQU(f.calls_while_finalized, calls1);
  CMT_EQ(fake_callback_enabled(CUPTI_CB_DOMAIN_RESOURCE, ctx_created), 1);
  CMT_OK(cm_cupti_detach(e, 0));

  /* An engine freed while its attach's cuptiSubscribe still runs: the free does not wait for it,
   * the helper undoes the subscription when it returns, and the next engine can subscribe. */
  uint64_t unsubs0 = fstats().unsubscribes;
  fake_set_subscribe_delay_ms(1000);
  CMT_EQ(cm_observe(e, sel, cmt_count_batch, NULL, &id), CM_EAGAIN);
  fake_set_subscribe_delay_ms(0);
  t0 = cm__mono_ms();
  cm_engine_free(e);
  waited = cm__mono_ms() - t0;
  printf("engine freed during a blocked subscribe after %" PRIu64 " ms\n", waited);
  CMT_ASSERT(waited < 400);
  for (int i = 0; i < 200 && fstats().unsubscribes == unsubs0; i++) nanosleep(&tick, NULL);
  CMT_EQU(fstats().unsubscribes - unsubs0, 1);
  CMT_EQU(fstats().calls_while_finalized, calls1);
  CMT_OK(cm_engine_new(&e, NULL));
  session(e, sel, 50);

  /* A process that has launched a CUDA graph is never detached again (CM_ENOSYS): a cuptiFinalize
   * and a new subscription break the launches of graphs made before them. The engine sees the
   * graph's launch through its own pinned driver callback; it still traces, and the refusal
   * holds after a session too. */
  const uint32_t graph_launch = CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch;
  CMT_EQ(fake_callback_enabled(CUPTI_CB_DOMAIN_DRIVER_API, graph_launch), 1);
  uint64_t fin_before = fstats().finalize_calls;
  fake_graph_launch((void *)0x77, 1);
  CMT_EQ(cm_cupti_detach(e, 0), CM_ENOSYS);
  CMT_CONTAINS(cm_errmsg(), "CUDA graphs");
  CMT_EQ(cm_cupti_detached(e), 0);
  session(e, sel, 50);
  CMT_EQ(cm_cupti_detach(e, 0), CM_ENOSYS);
  CMT_EQU(fstats().finalize_calls, fin_before);
  cm_engine_free(e);
  /* A graph made by a stream capture counts as soon as the capture ends. */
  CMT_OK(cm_engine_new(&e, NULL));
  fake_stream_begin_capture((void *)0x78, 1);
  CMT_EQ(fake_stream_end_capture((void *)0x78, 1), 0);
  CMT_EQ(cm_cupti_detach(e, 0), CM_ENOSYS);
  CMT_CONTAINS(cm_errmsg(), "CUDA graphs");
  cm_engine_free(e);
  /* A fresh engine knows of no graph: it detaches. */
  CMT_OK(cm_engine_new(&e, NULL));
  session(e, sel, 50);

  /* PM sampling attaches a detached engine too; once it has initialized CUPTI's profiler, a
   * detach is refused for good (CM_ENOSYS), even after the consumer is gone. */
  CMT_OK(cm_cupti_detach(e, 0));
  static const char *const metric[] = {"sm__cycles_active.avg"};
  uint32_t pm = 0;
  CMT_OK(cm_pm_sample_add(e, 0, metric, 1, 1000, &pm));
  CMT_EQ(cm_cupti_detached(e), 0);
  CMT_OK(cm_pm_sample_remove(e, pm));
  CMT_EQ(cm_cupti_detach(e, 0), CM_ENOSYS);
  CMT_CONTAINS(cm_errmsg(), "PM sampling");
  CMT_EQ(cm_cupti_detached(e), 0);

  cm_selection_free(sel);
  cm_engine_free(e);
  f = fstats();
  CMT_EQU(f.calls_while_finalized, 0);
  printf("ok\n");
  return 0;
}
