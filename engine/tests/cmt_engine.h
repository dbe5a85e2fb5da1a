/*
 * cmt_engine.h: the common start of the engine tests that trace kernels and runtime API on the
 * fake CUPTI: an engine with one observer of kernel and runtime start and stop.
 */
#ifndef CMT_ENGINE_H
#define CMT_ENGINE_H

#include "cmt.h"
#include "cuptimon.h"

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

/* Unregisters the observer (which must still be registered) and frees everything. */
static inline void cmt_engine_end(cmt_engine *t) {
  CMT_OK(cm_unobserve(t->e, t->id));
  cm_selection_free(t->sel);
  cm_engine_free(t->e);
}

#endif /* CMT_ENGINE_H */
