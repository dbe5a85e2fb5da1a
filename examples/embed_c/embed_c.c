/*
 * embed_c.c: a program that uses the engine's C API directly: one observer counting kernels and
 * summing their durations, a sync flush, the totals printed.
 *
 * Design note. The observer runs on the thread that calls cm_flush (deliver_ms = 0), so it needs
 * no locking. Without a GPU the example drives the fake CUPTI's workload generator, found with
 * dlsym in the library the engine loaded (CUPTIMON_LIBCUPTI); with a real CUPTI the program's
 * own CUDA work would produce the records instead.
 *
 *   CUPTIMON_LIBCUPTI=libfake_cupti.so CUPTIMON_LIBCUDA=libfake_cupti.so ./embed_c [records]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuptimon.h"

typedef struct totals {
  uint64_t kernels;
  uint64_t busy_ns;
  int start, stop; /* field ids, resolved once */
} totals;

static void on_batch(void *ud, const cm_batch *b) {
  totals *t = ud;
  const cm_column *cs = cm_batch_column(b, t->start), *ce = cm_batch_column(b, t->stop);
  if (!cs || !ce) return;
  const uint64_t *start = cs->data, *stop = ce->data;
  for (uint32_t i = 0; i < b->n; i++) t->busy_ns += stop[i] - start[i];
  t->kernels += b->n;
}

typedef int64_t (*workload_fn)(int, uint64_t, const int *, int);

int main(int argc, char **argv) {
  uint64_t records = argc > 1 ? strtoull(argv[1], NULL, 10) : 10000;
  cm_config cfg;
  cm_config_init(&cfg);
  cfg.deliver_ms = 0;
  cm_engine *e;
  int rc = cm_engine_new(&e, &cfg);
  if (rc) {
    fprintf(stderr, "embed_c: %s: %s\n", cm_err_name(rc), cm_errmsg());
    /* Without a GPU (or without CUPTI), the fake CUPTI of a build with tests stands in. */
    const char *lib = getenv("CUPTIMON_LIBCUPTI");
    if (!lib || !strstr(lib, "fake_cupti"))
      fprintf(stderr, "embed_c: without a GPU, run it on the fake CUPTI that a build with tests "
              "makes: CUPTIMON_LIBCUPTI=build/engine/tests/libfake_cupti.so "
              "CUPTIMON_LIBCUDA=build/engine/tests/libfake_cupti.so %s [records]\n", argv[0]);
    return 1;
  }
  totals t = {0};
  int kind = cm_kind_by_name("kernel");
  t.start = cm_field_by_name(kind, "start");
  t.stop = cm_field_by_name(kind, "stop");
  cm_selection *sel;
  cm_selection_new(&sel);
  cm_selection_parse(sel, "kernel:start,stop");
  uint32_t id;
  rc = cm_observe(e, sel, on_batch, &t, &id);
  cm_selection_free(sel);
  if (rc) {
    fprintf(stderr, "embed_c: observe: %s\n", cm_errmsg());
    cm_engine_free(e);
    return 1;
  }

  const char *fake = getenv("CUPTIMON_LIBCUPTI");
  void *lib = fake ? dlopen(fake, RTLD_NOW | RTLD_NOLOAD) : NULL;
  workload_fn run = NULL;
  /* POSIX's sanctioned way to turn dlsym's object pointer into a function pointer. */
  if (lib) *(void **)&run = dlsym(lib, "fake_run_workload");
  int64_t written = 0;
  if (run) {
    written = run(2, records / 2, &kind, 1);
  } else {
    printf("embed_c: no fake CUPTI: run your CUDA work here\n");
  }
  rc = cm_flush(e, CM_FLUSH_SYNC, 0);
  cm_unobserve(e, id);
  printf("embed_c: written %lld, observed %llu kernels, busy %.3f ms%s\n", (long long)written,
         (unsigned long long)t.kernels, t.busy_ns / 1e6, rc ? " (flush timed out)" : "");
  if (lib) dlclose(lib);
  cm_engine_free(e);
  return run && (int64_t)t.kernels != written ? 1 : 0;
}
