/*
 * test_engine_capture.c: the fence never breaks an application's CUDA graph capture, and never
 * waits on the device beyond its deadline.
 *
 * Design. The fake driver models two hazards of a sync flush: a cuCtxSynchronize
 * made while a stream capture is in progress invalidates the capture unless the calling thread is
 * in relaxed capture mode, and cuCtxSynchronize can block (a kernel still running at exit). The
 * test drives the engine's sync flush and its exit fence against both:
 *  1. A capture the engine sees begin (the driver callbacks fire): sync flushes during it make no
 *     synchronize call at all, the capture survives, and the flushes still deliver.
 *  2. A capture the engine cannot see (begun "before it subscribed"): the flush synchronizes, but
 *     from a thread in relaxed mode, so the capture still survives.
 *  3. A synchronize that blocks for a minute: a sync flush with a 200 ms timeout returns
 *     CM_ETIMEDOUT within about its timeout, and the next one does not start a second blocked
 *     synchronize.
 *  4. The exit fence, while a sync flush with a 60 s timeout holds the engine and waits on that
 *     blocked synchronize on another thread: it returns within its own deadline, says that the
 *     device sync timed out, and still delivers what was produced; the other flush ends at once.
 * The blocked synchronize of 3 and 4 is left sleeping in its helper thread; the process exits
 * over it, as an application does.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cm_internal.h"
#include "cmt.h"
#include "cmt_records.h"
#include "cuptimon.h"
#include "fake_cupti.h"

static atomic_ullong g_delivered;

static void on_batch(void *ud, const cm_batch *b) {
  (void)ud;
  atomic_fetch_add(&g_delivered, b->n);
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void emit_kernels(uint32_t thread, uint64_t n) {
  uint64_t buf[64];
  for (uint64_t j = 0; j < n; j++) {
    size_t sz = fake_gen_record(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, thread, j, buf);
    CMT_ASSERT(sz > 0);
    CMT_EQ(fake_emit(buf, sz, 0), 0);
  }
}

static void test_visible_capture(cm_engine *e) {
  fake_stats a, b;
  int stream;
  fake_get_stats(&a);
  fake_stream_begin_capture(&stream, 1);
  uint64_t before = atomic_load(&g_delivered);
  for (int i = 0; i < 20; i++) {
    emit_kernels(1, 50);
    CMT_OK(cm_flush(e, CM_FLUSH_SYNC, 5000));
  }
  CMT_EQ(fake_stream_end_capture(&stream, 1), 0);
  fake_get_stats(&b);
  printf("visible capture: %llu syncs during it, %llu records delivered\n",
         (unsigned long long)(b.syncs_during_capture - a.syncs_during_capture),
         (unsigned long long)(atomic_load(&g_delivered) - before));
  CMT_EQU(b.syncs_during_capture - a.syncs_during_capture, 0);
  CMT_EQU(b.syncs - a.syncs, 0);
  CMT_EQU(b.captures_invalidated - a.captures_invalidated, 0);
  /* The plain flushes that stood in for the fence delivered the completed records. */
  CMT_EQU(atomic_load(&g_delivered) - before, 20 * 50);
  /* Once the capture has ended, a sync flush synchronizes again. */
  CMT_OK(cm_flush(e, CM_FLUSH_SYNC, 5000));
  fake_get_stats(&b);
  CMT_GT(b.syncs - a.syncs, 0);
}

static void test_invisible_capture(cm_engine *e) {
  fake_stats a, b;
  int stream;
  fake_get_stats(&a);
  fake_stream_begin_capture(&stream, 0);
  for (int i = 0; i < 5; i++) CMT_OK(cm_flush(e, CM_FLUSH_SYNC, 5000));
  CMT_EQ(fake_stream_end_capture(&stream, 0), 0);
  fake_get_stats(&b);
  printf("invisible capture: %llu syncs during it, %llu mode exchanges, %llu invalidated\n",
         (unsigned long long)(b.syncs_during_capture - a.syncs_during_capture),
         (unsigned long long)(b.capture_mode_exchanges - a.capture_mode_exchanges),
         (unsigned long long)(b.captures_invalidated - a.captures_invalidated));
  CMT_GT(b.syncs_during_capture - a.syncs_during_capture, 0);
  CMT_GT(b.capture_mode_exchanges - a.capture_mode_exchanges, 0);
  CMT_EQU(b.captures_invalidated - a.captures_invalidated, 0);
}

static void test_blocked_sync(cm_engine *e) {
  fake_set_sync_block_ms(1500);
  uint64_t t0 = now_ms();
  CMT_EQ(cm_flush(e, CM_FLUSH_SYNC, 200), CM_ETIMEDOUT);
  uint64_t t1 = now_ms();
  printf("blocked sync: the flush returned after %llu ms\n", (unsigned long long)(t1 - t0));
  CMT_LT(t1 - t0, 2000);
  /* The first synchronize is still blocked: the next fence does not queue behind it. */
  fake_stats a, b;
  fake_get_stats(&a);
  CMT_EQ(cm_flush(e, CM_FLUSH_SYNC, 200), CM_ETIMEDOUT);
  fake_get_stats(&b);
  CMT_LT(now_ms() - t1, 2000);
  CMT_EQU(b.syncs, a.syncs);
  /* The abandoned synchronize finishes on its own. */
  for (int i = 0; i < 1000 && b.syncs == a.syncs; i++) {
    usleep(10 * 1000);
    fake_get_stats(&b);
  }
  CMT_GT(b.syncs, a.syncs);
  usleep(20 * 1000); /* its helper thread leaves just after the sync returns */
}

typedef struct long_flush {
  cm_engine *e;
  int rc;
  uint64_t ended;
} long_flush;

static void *long_flush_main(void *arg) {
  long_flush *lf = arg;
  lf->rc = cm_flush(lf->e, CM_FLUSH_SYNC, 60000);
  lf->ended = now_ms();
  return NULL;
}

static void test_exit_fence(cm_engine *e) {
  /* The monitor-like flush below starts a synchronize that blocks for a minute and waits for it
   * for up to 60 s, holding the engine, unless the exit fence hurries it. */
  fake_set_sync_block_ms(60000);
  long_flush lf = {.e = e};
  pthread_t t;
  CMT_EQ(pthread_create(&t, NULL, long_flush_main, &lf), 0);
  usleep(100 * 1000);
  emit_kernels(2, 300);
  uint64_t before = atomic_load(&g_delivered);
  uint64_t t0 = now_ms();
  cm__exit_flush ef;
  int rc = cm__engine_exit_flush(e, t0 + 500, t0 + 1000, &ef);
  uint64_t t1 = now_ms();
  pthread_join(t, NULL);
  printf("exit fence: rc=%d after %llu ms (busy=%d capture=%d sync_timed_out=%d decode=%d "
         "synced=%d); the other flush ended %lld ms after it began, rc=%d; %llu delivered\n",
         rc, (unsigned long long)(t1 - t0), ef.engine_busy, ef.capture_active, ef.sync_timed_out,
         ef.decode_timed_out, ef.synced, (long long)(lf.ended - t0), lf.rc,
         (unsigned long long)(atomic_load(&g_delivered) - before));
  CMT_LT(t1 - t0, 1500);
  CMT_GE((int64_t)(lf.ended - t0), 0); /* it was still waiting when the exit fence began */
  CMT_LT(lf.ended - t0, 1500);
  CMT_EQ(lf.rc, CM_ETIMEDOUT);
  CMT_EQ(rc, CM_ETIMEDOUT);
  CMT_ASSERT(!ef.engine_busy);
  CMT_ASSERT(ef.sync_timed_out);
  CMT_ASSERT(!ef.synced);
  /* The forced flush delivered the 300 records written before the fence. */
  CMT_EQU(atomic_load(&g_delivered) - before, 300);
  /* After the exit fence every wait ends at once. */
  uint64_t t2 = now_ms();
  cm_flush(e, CM_FLUSH_SYNC, 60000);
  CMT_LT(now_ms() - t2, 1000);
}

int main(void) {
  cm_engine *e = NULL;
  cm_config cfg;
  cm_config_init(&cfg);
  CMT_OK(cm_engine_new(&e, &cfg));
  cm_selection *sel;
  CMT_OK(cm_selection_new(&sel));
  CMT_OK(cm_selection_parse(sel, "kernel:name,start,stop"));
  uint32_t id;
  CMT_OK(cm_observe(e, sel, on_batch, NULL, &id));
  test_visible_capture(e);
  test_invisible_capture(e);
  test_blocked_sync(e);
  test_exit_fence(e);
  cm_selection_free(sel);
  /* The session's last fence finds the synchronize still blocked and does not wait for it. */
  uint64_t t0 = now_ms();
  cm_engine_free(e);
  CMT_LT(now_ms() - t0, 2000);
  printf("ok\n");
  return 0;
}
