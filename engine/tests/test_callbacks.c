/*
 * test_callbacks.c: subscriber-callback handlers, refcounted arming, failing handlers, the
 * subscription's independence from the activity session, concurrent registration during
 * dispatch, and resource events delivered as the "resource" kind.
 *
 * Design. The fake CUPTI records every cuptiEnableCallback call per (domain, cbid) and reports
 * whether a callback is enabled, so arming is checked against what CUPTI was actually told, not
 * against the engine's own counters. Callbacks are fired through fake_fire_callback, which (like
 * CUPTI) calls the subscriber only while the callback is enabled; fake_launch_kernel fires the
 * RUNTIME enter and exit sites of a launch.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_internal.h"
#include "cmt.h"
#include "fake_cupti.h"

#define RT CUPTI_CB_DOMAIN_RUNTIME_API
#define LAUNCH 211u      /* CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000 */
#define LAUNCH_PTSZ 214u /* CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000 */

_Static_assert(LAUNCH == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, "cbid");
_Static_assert(LAUNCH_PTSZ == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000, "cbid");

static atomic_int log_failed_msgs;

static void on_log(void *ud, int level, const char *msg) {
  (void)ud;
  (void)level;
  if (strstr(msg, "failed with")) atomic_fetch_add(&log_failed_msgs, 1);
}

typedef struct counter {
  atomic_int calls, enters;
  int ret;
} counter;

static int count_handler(void *ud, int domain, uint32_t cbid, const void *cbdata) {
  counter *c = ud;
  atomic_fetch_add(&c->calls, 1);
  if (domain == RT && cbdata) {
    const CUpti_CallbackData *cd = cbdata;
    if (cd->callbackSite == CUPTI_API_ENTER) atomic_fetch_add(&c->enters, 1);
  }
  (void)cbid;
  return c->ret;
}

static cm_engine *new_engine(void) {
  cm_engine *e = NULL;
  CMT_OK(cm_engine_new(&e, NULL));
  cm_set_log(e, on_log, NULL);
  return e;
}

static void test_refcounted_arming(void) {
  cm_engine *e = new_engine();
  counter c = {0};
  uint32_t h;
  CMT_OK(cm_callback_register(e, RT, LAUNCH, count_handler, &c, &h));
  CMT_EQ(fake_callback_enabled(RT, LAUNCH), 0); /* registering does not enable */
  uint32_t on0 = fake_callback_enable_calls(RT, LAUNCH, 1);
  uint32_t off0 = fake_callback_enable_calls(RT, LAUNCH, 0);

  CMT_OK(cm_callback_arm(e, RT, LAUNCH)); /* consumer A */
  CMT_OK(cm_callback_arm(e, RT, LAUNCH)); /* consumer B */
  CMT_EQ(cm_callback_armed(e, RT, LAUNCH), 2);
  CMT_EQ(fake_callback_enabled(RT, LAUNCH), 1);
  CMT_EQ(fake_callback_enable_calls(RT, LAUNCH, 1) - on0, 1); /* enabled once, not twice */
  fake_launch_kernel(LAUNCH, "_Z1kv");
  CMT_EQ(c.enters, 1);
  CMT_EQ(c.calls, 2); /* enter and exit */

  CMT_OK(cm_callback_disarm(e, RT, LAUNCH)); /* A leaves: B's window must stay open */
  CMT_EQ(fake_callback_enabled(RT, LAUNCH), 1);
  CMT_EQ(fake_callback_enable_calls(RT, LAUNCH, 0) - off0, 0);
  fake_launch_kernel(LAUNCH, "_Z1kv");
  CMT_EQ(c.enters, 2);
  CMT_OK(cm_callback_disarm(e, RT, LAUNCH)); /* B leaves: disabled */
  CMT_EQ(fake_callback_enabled(RT, LAUNCH), 0);
  CMT_EQ(fake_callback_enable_calls(RT, LAUNCH, 0) - off0, 1);
  fake_launch_kernel(LAUNCH, "_Z1kv");
  CMT_EQ(c.enters, 2);
  CMT_EQ(cm_callback_disarm(e, RT, LAUNCH), CM_ENOENT); /* nothing armed */
  CMT_EQ(cm_callback_armed(e, RT, LAUNCH), 0);

  /* Removing the last handler disables the key whatever its arm count. */
  CMT_OK(cm_callback_arm(e, RT, LAUNCH));
  CMT_OK(cm_callback_arm(e, RT, LAUNCH));
  counter c2 = {0};
  uint32_t h2;
  CMT_OK(cm_callback_register(e, RT, LAUNCH, count_handler, &c2, &h2));
  CMT_OK(cm_callback_unregister(e, h));
  CMT_EQ(fake_callback_enabled(RT, LAUNCH), 1); /* h2 still there */
  CMT_OK(cm_callback_unregister(e, h2));
  CMT_EQ(fake_callback_enabled(RT, LAUNCH), 0);
  CMT_EQ(cm_callback_armed(e, RT, LAUNCH), 0);
  CMT_EQ(cm_callback_unregister(e, h2), CM_ENOENT);

  CMT_EQ(cm_callback_register(e, 0, LAUNCH, count_handler, &c, &h), CM_EINVAL);
  CMT_EQ(cm_callback_register(e, RT, LAUNCH, NULL, &c, &h), CM_EINVAL);
  CMT_EQ(cm_callback_arm(e, 99, 1), CM_EINVAL);
  cm_engine_free(e);
}

static void test_failing_handler(void) {
  cm_engine *e = new_engine();
  atomic_store(&log_failed_msgs, 0);
  counter bad = {.ret = -1}, good1 = {0}, good2 = {0};
  uint32_t h1, h2, h3;
  CMT_OK(cm_callback_register(e, RT, LAUNCH, count_handler, &good1, &h1));
  CMT_OK(cm_callback_register(e, RT, LAUNCH, count_handler, &bad, &h2));
  CMT_OK(cm_callback_register(e, RT, LAUNCH, count_handler, &good2, &h3));
  CMT_OK(cm_callback_arm(e, RT, LAUNCH));
  for (int i = 0; i < 5; i++) fake_launch_kernel(LAUNCH, "_Z1kv");
  CMT_EQ(good1.calls, 10);
  CMT_EQ(bad.calls, 10);
  CMT_EQ(good2.calls, 10); /* the handler after the failing one still ran every time */
  cm_callback_stats st;
  CMT_OK(cm_callback_stats_get(e, &st));
  CMT_EQU(st.handler_failures, 10);
  CMT_EQU(st.handler_calls, 30);
  CMT_EQU(st.handlers, 3);
  CMT_EQ(atomic_load(&log_failed_msgs), 1); /* logged once */
  cm_engine_free(e);
}

static void observer_noop(void *ud, const cm_batch *b) {
  (void)b;
  atomic_fetch_add((atomic_int *)ud, 1);
}

static uint32_t observe(cm_engine *e, const char *spec, cm_observer_fn fn, void *ud) {
  cm_selection *s;
  CMT_OK(cm_selection_new(&s));
  CMT_OK(cm_selection_parse(s, spec));
  uint32_t id;
  CMT_OK(cm_observe(e, s, fn, ud, &id));
  cm_selection_free(s);
  return id;
}

/* Handlers and arms outlive the activity session, in both directions. */
static void test_subscription_outlives_session(void) {
  fake_stats f0, f1;
  fake_get_stats(&f0);
  cm_engine *e = new_engine();
  counter c = {0};
  uint32_t h;
  atomic_int batches = 0;
  /* Registered and armed before any session. */
  CMT_OK(cm_callback_register(e, RT, LAUNCH, count_handler, &c, &h));
  CMT_OK(cm_callback_arm(e, RT, LAUNCH));
  fake_launch_kernel(LAUNCH, "_Z1kv");
  CMT_EQ(c.enters, 1);
  uint32_t o = observe(e, "kernel", observer_noop, &batches);
  fake_launch_kernel(LAUNCH, "_Z1kv");
  CMT_EQ(c.enters, 2);
  /* Armed during a session (the ptsz variant), then the last observer leaves. */
  counter p = {0};
  uint32_t hp;
  CMT_OK(cm_callback_register(e, RT, LAUNCH_PTSZ, count_handler, &p, &hp));
  CMT_OK(cm_callback_arm(e, RT, LAUNCH_PTSZ));
  CMT_OK(cm_unobserve(e, o));
  CMT_GT(atomic_load(&batches), 0);
  cm_session_info si;
  CMT_OK(cm_session_info_get(e, &si));
  CMT_EQ(si.active, 0);
  CMT_EQ(fake_callback_enabled(RT, LAUNCH), 1);
  CMT_EQ(fake_callback_enabled(RT, LAUNCH_PTSZ), 1);
  fake_launch_kernel(LAUNCH, "_Z1kv");
  fake_launch_kernel(LAUNCH_PTSZ, "_Z1kv");
  CMT_EQ(c.enters, 3); /* still dispatched after the session ended */
  CMT_EQ(p.enters, 1);
  /* A second session leaves them alone too. */
  o = observe(e, "runtime", observer_noop, &batches);
  CMT_OK(cm_unobserve(e, o));
  fake_launch_kernel(LAUNCH, "_Z1kv");
  CMT_EQ(c.enters, 4);
  fake_get_stats(&f1);
  CMT_EQU(f1.unsubscribes - f0.unsubscribes, 0);
  cm_engine_free(e);
  fake_get_stats(&f1);
  CMT_EQU(f1.unsubscribes - f0.unsubscribes, 1); /* only the engine's end unsubscribes */
}

/* Registration and removal while other threads dispatch: no handler runs after its removal
 * returned, and nothing crashes. */
typedef struct guard {
  atomic_int alive;
  atomic_int after_removal;
} guard;

static int guarded_handler(void *ud, int domain, uint32_t cbid, const void *cbdata) {
  (void)domain, (void)cbid, (void)cbdata;
  guard *g = ud;
  if (!atomic_load(&g->alive)) atomic_fetch_add(&g->after_removal, 1);
  return 0;
}

static atomic_int stop_firing;

static void *firer(void *arg) {
  (void)arg;
  while (!atomic_load(&stop_firing)) fake_launch_kernel(LAUNCH, "_Z1kv");
  return NULL;
}

static void test_concurrent_registration(void) {
  cm_engine *e = new_engine();
  counter base = {0};
  uint32_t hb;
  CMT_OK(cm_callback_register(e, RT, LAUNCH, count_handler, &base, &hb));
  CMT_OK(cm_callback_arm(e, RT, LAUNCH));
  atomic_store(&stop_firing, 0);
  pthread_t th[2];
  for (int i = 0; i < 2; i++) CMT_EQ(pthread_create(&th[i], NULL, firer, NULL), 0);
  /* Make sure both threads are dispatching before the churn starts. */
  while (atomic_load(&base.calls) < 100) sched_yield();
  int violations = 0;
  for (int i = 0; i < 2000; i++) {
    guard *g = calloc(1, sizeof *g);
    atomic_store(&g->alive, 1);
    uint32_t h;
    CMT_OK(cm_callback_register(e, RT, LAUNCH, guarded_handler, g, &h));
    CMT_OK(cm_callback_unregister(e, h));
    atomic_store(&g->alive, 0);
    violations += atomic_load(&g->after_removal);
    free(g); /* safe only because no dispatch can still hold the handler */
  }
  atomic_store(&stop_firing, 1);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  CMT_EQ(violations, 0);
  CMT_GT(atomic_load(&base.calls), 0);
  cm_engine_free(e);
}

/* A handler that registers another handler from inside a dispatch must not deadlock. */
static cm_engine *g_engine;
static counter g_inner;
static int registering_handler(void *ud, int domain, uint32_t cbid, const void *cbdata) {
  (void)ud, (void)domain, (void)cbid, (void)cbdata;
  uint32_t h;
  if (atomic_load(&g_inner.calls) == 0 && !g_inner.ret) {
    g_inner.ret = 0;
    CMT_OK(cm_callback_register(g_engine, RT, LAUNCH_PTSZ, count_handler, &g_inner, &h));
    CMT_OK(cm_callback_unregister(g_engine, h));
  }
  return 0;
}

static void test_register_inside_dispatch(void) {
  g_engine = new_engine();
  uint32_t h;
  CMT_OK(cm_callback_register(g_engine, RT, LAUNCH, registering_handler, NULL, &h));
  CMT_OK(cm_callback_arm(g_engine, RT, LAUNCH));
  fake_launch_kernel(LAUNCH, "_Z1kv");
  fake_launch_kernel(LAUNCH, "_Z1kv");
  cm_engine_free(g_engine);
}

/* ---- resource events ------------------------------------------------------------------------- */

static struct {
  uint32_t n;
  uint32_t event[16];
  uint64_t context[16], stream[16], ts[16];
  uint32_t module_id[16], tid[16];
  int batches;
} res;

static void resource_observer(void *ud, const cm_batch *b) {
  (void)ud;
  CMT_EQ(b->kind, CM_KIND_RESOURCE);
  res.batches++;
  const cm_column *ev = cm_batch_column(b, cm_field_by_name(CM_KIND_RESOURCE, "event"));
  const cm_column *cx = cm_batch_column(b, cm_field_by_name(CM_KIND_RESOURCE, "context"));
  const cm_column *st = cm_batch_column(b, cm_field_by_name(CM_KIND_RESOURCE, "stream"));
  const cm_column *ts = cm_batch_column(b, cm_field_by_name(CM_KIND_RESOURCE, "timestamp"));
  const cm_column *mi = cm_batch_column(b, cm_field_by_name(CM_KIND_RESOURCE, "module_id"));
  const cm_column *ti = cm_batch_column(b, cm_field_by_name(CM_KIND_RESOURCE, "tid"));
  CMT_ASSERT(ev && cx && st && ts && mi && ti);
  for (uint32_t i = 0; i < b->n && res.n < 16; i++, res.n++) {
    res.event[res.n] = ((const uint32_t *)ev->data)[i];
    res.context[res.n] = ((const uint64_t *)cx->data)[i];
    res.stream[res.n] = ((const uint64_t *)st->data)[i];
    res.ts[res.n] = ((const uint64_t *)ts->data)[i];
    res.module_id[res.n] = ((const uint32_t *)mi->data)[i];
    res.tid[res.n] = ((const uint32_t *)ti->data)[i];
  }
}

static void test_resource_kind(void) {
  CMT_EQ(cm_kind_by_name("resource"), CM_KIND_RESOURCE);
  fake_stats f0, f1;
  fake_get_stats(&f0);
  cm_engine *e = new_engine();
  int RS = CUPTI_CB_DOMAIN_RESOURCE;
  CMT_EQ(fake_callback_enabled(RS, CUPTI_CBID_RESOURCE_STREAM_CREATED), 1);
  CMT_EQ(fake_callback_enabled(RS, CUPTI_CBID_RESOURCE_CONTEXT_CREATED), 1);
  CMT_EQ(fake_callback_enabled(RS, CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING), 1);
  /* A consumer's arm and disarm of a pinned resource callback cannot turn it off. */
  CMT_OK(cm_callback_arm(e, RS, CUPTI_CBID_RESOURCE_STREAM_CREATED));
  CMT_OK(cm_callback_disarm(e, RS, CUPTI_CBID_RESOURCE_STREAM_CREATED));
  CMT_EQ(fake_callback_enabled(RS, CUPTI_CBID_RESOURCE_STREAM_CREATED), 1);

  uint32_t o = observe(e, "resource", resource_observer, NULL);
  fake_get_stats(&f1);
  for (int k = 0; k < 64; k++) CMT_EQU(f1.enable_calls[k] - f0.enable_calls[k], 0);
  CMT_EQ(cm_enabled_kinds(e) >> CM_KIND_RESOURCE & 1, 0); /* never enabled in CUPTI */

  /* A user handler on a resource callback runs as well as the built-in one. */
  counter uc = {0};
  uint32_t hu;
  CMT_OK(cm_callback_register(e, RS, CUPTI_CBID_RESOURCE_STREAM_CREATED, count_handler, &uc, &hu));

  uint64_t t0 = fake_now();
  CUpti_ResourceData ctx = {.context = (CUcontext)(uintptr_t)0x1000};
  CUpti_ResourceData str = {.context = (CUcontext)(uintptr_t)0x1000,
                            .resourceHandle.stream = (CUstream)(uintptr_t)0x2000};
  CUpti_ModuleResourceData mod = {.moduleId = 42};
  CUpti_ResourceData modr = {.context = (CUcontext)(uintptr_t)0x1000, .resourceDescriptor = &mod};
  CMT_EQ(fake_fire_callback(RS, CUPTI_CBID_RESOURCE_CONTEXT_CREATED, &ctx), 1);
  CMT_EQ(fake_fire_callback(RS, CUPTI_CBID_RESOURCE_STREAM_CREATED, &str), 1);
  CMT_EQ(fake_fire_callback(RS, CUPTI_CBID_RESOURCE_MODULE_LOADED, &modr), 1);
  CMT_EQ(fake_fire_callback(RS, CUPTI_CBID_RESOURCE_STREAM_DESTROY_STARTING, &str), 1);
  CMT_EQ(uc.calls, 1);
  CMT_EQ(res.n, 0); /* delivered with the next drain, not from the application thread */
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 0));
  CMT_EQ(res.n, 4);
  CMT_EQ(res.batches, 1);
  CMT_EQU(res.event[0], CUPTI_CBID_RESOURCE_CONTEXT_CREATED);
  CMT_EQU(res.event[1], CUPTI_CBID_RESOURCE_STREAM_CREATED);
  CMT_EQU(res.event[2], CUPTI_CBID_RESOURCE_MODULE_LOADED);
  CMT_EQU(res.event[3], CUPTI_CBID_RESOURCE_STREAM_DESTROY_STARTING);
  for (int i = 0; i < 4; i++) {
    CMT_EQU(res.context[i], 0x1000);
    CMT_LEU(t0, res.ts[i]);
    CMT_EQU(res.tid[i], (uint32_t)gettid());
  }
  CMT_EQU(res.stream[0], 0);
  CMT_EQU(res.stream[1], 0x2000);
  CMT_EQU(res.stream[3], 0x2000);
  CMT_EQU(res.module_id[2], 42);
  cm_stats st;
  CMT_OK(cm_stats_get(e, &st));
  CMT_EQU(st.records_by_kind[CM_KIND_RESOURCE], 4);
  cm_callback_stats cs;
  CMT_OK(cm_callback_stats_get(e, &cs));
  CMT_EQU(cs.resource_records, 4);
  CMT_EQU(cs.resource_dropped, 0);
  CMT_OK(cm_flush(e, CM_FLUSH_PLAIN, 0));
  CMT_EQ(res.n, 4); /* delivered once */
  CMT_OK(cm_unobserve(e, o));
  cm_engine_free(e);
}

int main(void) {
  test_refcounted_arming();
  test_failing_handler();
  test_subscription_outlives_session();
  test_concurrent_registration();
  test_register_inside_dispatch();
  test_resource_kind();
  printf("test_callbacks: ok\n");
  return 0;
}
