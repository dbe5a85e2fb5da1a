/*
 * fence.c: flushing, device synchronization and the sync fence of the engine.
 *
 * A plain flush asks CUPTI for the buffers it has completed and waits until the decode worker has
 * decoded them. The sync fence makes a window complete: it reads CUPTI's clock (the mark),
 * synchronizes the device with SYNCHRONIZATION enabled just for the fence, then flushes (never
 * forced) until the decoder has seen a sync record that ends at or past the mark. Every wait has a
 * deadline; a missed deadline is counted (fence_timeouts) and reported, never a hang.
 *
 * All of it runs on the thread of a control call, with engine.api_mu held.
 */
#include <unistd.h>

#include "engine.h"

bool cm__engine_wait_decoded(cm_engine *e, uint64_t deadline) {
  bool ok = true;
  pthread_mutex_lock(&e->work_mu);
  uint64_t target = e->enqueued;
  while (e->decoded < target) {
    uint64_t now = cm__mono_ms();
    if (now >= deadline) {
      ok = false;
      break;
    }
    struct timespec ts;
    cm__abstime_in(&ts, deadline - now);
    pthread_cond_timedwait(&e->done_cv, &e->work_mu, &ts);
  }
  pthread_mutex_unlock(&e->work_mu);
  return ok;
}

int cm__device_sync(const cm__cupti *c) {
  int synced = 0;
  void *cur = NULL;
  if (c->cuCtxGetCurrent && c->cuCtxSynchronize && c->cuCtxGetCurrent(&cur) == 0 && cur) {
    if (c->cuCtxSynchronize() == 0) synced++;
  }
  int ndev = 0;
  if (c->cuDeviceGetCount && c->cuDevicePrimaryCtxGetState && c->cuDevicePrimaryCtxRetain &&
      c->cuDevicePrimaryCtxRelease && c->cuCtxPushCurrent && c->cuCtxPopCurrent &&
      c->cuCtxSynchronize && c->cuDeviceGetCount(&ndev) == 0) {
    for (int d = 0; d < ndev; d++) {
      unsigned flags = 0;
      int active = 0;
      if (c->cuDevicePrimaryCtxGetState(d, &flags, &active) != 0 || !active) continue;
      void *ctx = NULL;
      if (c->cuDevicePrimaryCtxRetain(&ctx, d) != 0) continue;
      /* A primary context that is the calling thread's current one was synchronized above. */
      if (ctx != cur && c->cuCtxPushCurrent(ctx) == 0) {
        if (c->cuCtxSynchronize() == 0) synced++;
        void *popped = NULL;
        c->cuCtxPopCurrent(&popped);
      }
      c->cuDevicePrimaryCtxRelease(d);
    }
  }
  return synced;
}

bool cm__engine_plain_flush(cm_engine *e, uint64_t deadline, uint32_t flag) {
  e->cupti.ActivityFlushAll(flag);
  return cm__engine_wait_decoded(e, deadline);
}

bool cm__engine_fence(cm_engine *e, uint64_t deadline) {
  cm__cupti *c = &e->cupti;
  ADD(e, st_fences, 1);
  bool temp_sync = !(e->enabled >> CM_KIND_SYNCHRONIZATION & 1);
  if (temp_sync && c->ActivityEnable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION) != CUPTI_SUCCESS)
    temp_sync = false;
  uint64_t mark = 0;
  c->GetTimestamp(&mark);
  int synced = cm__device_sync(c);
  bool ok = true;
  if (synced == 0) {
    ok = cm__engine_plain_flush(e, deadline, 0);
  } else {
    uint64_t last_sync = cm__mono_ms();
    for (;;) {
      ok = cm__engine_plain_flush(e, deadline, 0);
      pthread_mutex_lock(&e->dec_mu);
      uint64_t seen = cm__decoder_sync_end(e->dec);
      pthread_mutex_unlock(&e->dec_mu);
      if (seen >= mark) break;
      uint64_t now = cm__mono_ms();
      if (now >= deadline) {
        ok = false;
        break;
      }
      /* The sync record itself can be lost: when the pool was at its bound, CUPTI had no buffer
       * to write it into (it is counted as dropped). The flushes above have since returned
       * buffers, so synchronizing again produces a new record past the mark. */
      if (now - last_sync >= 20) {
        cm__device_sync(c);
        last_sync = now;
      }
      usleep(1000);
    }
  }
  if (temp_sync) c->ActivityDisable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  if (!ok) ADD(e, st_fence_timeouts, 1);
  return ok;
}
