/*
 * cmt_engine.h: the common start of the engine tests that trace kernels and runtime API on the
 * fake CUPTI: an engine with one observer of kernel and runtime start and stop, an observer that
 * counts records per kind, and single kernel and runtime records for the fake to write.
 */
#ifndef CMT_ENGINE_H
#define CMT_ENGINE_H

#include <string.h>

#include <cupti.h>

#include "cmt.h"
#include "cuptimon.h"
#include "fake_cupti.h"

/* The engine, the observer's selection and its id; cmt_engine_end undoes cmt_engine_start. */
typedef struct cmt_engine {
  cm_engine *e;
  cm_selection *sel;
  uint32_t id;
} cmt_engine;

/* Creates the engine and registers `fn` for kernel and runtime records (start and stop). */
static inline cmt_engine cmt_engine_start(cm_observer_fn fn) {
  cmt_engine t = {NULL, NULL, 0};
  CMT_OK(cm_engine_new(&t.e, NULL));
  CMT_OK(cm_selection_new(&t.sel));
  CMT_OK(cm_selection_parse(t.sel, "kernel:start,stop;runtime:start,stop"));
  CMT_OK(cm_observe(t.e, t.sel, fn, NULL, &t.id));
  return t;
}

/* Records per kind that cmt_count_batch saw (one array per test program). */
static uint64_t cmt_seen[CM_KIND_MAX] __attribute__((unused));

/* An observer that counts the records of each kind in cmt_seen. */
static inline void cmt_count_batch(void *ud, const cm_batch *b) {
  (void)ud;
  if (b->kind >= 0 && b->kind < CM_KIND_MAX) cmt_seen[b->kind] += b->n;
}

/* Writes one runtime API record with `correlation`; the fake's answer (0 taken, 2 the kind is
 * disabled). */
static inline int cmt_emit_api(uint32_t correlation) {
  CUpti_ActivityAPI a;
  memset(&a, 0, sizeof a);
  a.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  a.cbid = 211;
  a.start = 1000 + correlation;
  a.end = 2000 + correlation;
  a.correlationId = correlation;
  return fake_emit(&a, sizeof a, 0);
}

/* Writes one kernel record "k" with `correlation`; the fake's answer, as above. */
static inline int cmt_emit_kernel(uint32_t correlation) {
  unsigned char rec[256];
  size_t n = fake_make_kernel(rec, "k", 0, 7, 1000 + correlation, 2000 + correlation, correlation);
  return fake_emit(rec, n, 0);
}

/* Unregisters the observer (which must still be registered) and frees everything. */
static inline void cmt_engine_end(cmt_engine *t) {
  CMT_OK(cm_unobserve(t->e, t->id));
  cm_selection_free(t->sel);
  cm_engine_free(t->e);
}

#endif /* CMT_ENGINE_H */
