/*
 * selfcheck.c: cuptimon-selfcheck, the engine's end-to-end self-check.
 *
 * With no CUDA device (or with --fake) it drives the engine through the fake CUPTI: producer
 * threads write a mixed workload in the real CUPTI 13.0 record layouts, the engine decodes it into
 * columns, and a C observer aggregates the kernels into a "top kernels" table, exactly as a recipe
 * would on live data. It then checks that every record written was delivered and prints the
 * engine's counters. On a machine with a GPU and no --fake, it loads the real CUPTI, reports the
 * session facts (CUPTI version, clock check) and exits: there is no workload of its own to trace.
 * Kernel names print as the recipes show them (cm.kernel_name): demangled, without the parameter
 * list and the return type.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuptimon.h"
#include "fake_cupti.h"

/* libstdc++'s demangler, as the host uses it (engine/host/corelib.c; the cuptimon_demangle
 * target links it). */
char *__cxa_demangle(const char *mangled, char *buf, size_t *n, int *status);

/* The short form of kernel name `nm` (len bytes) into out (cap bytes, NUL-terminated): a
 * mangled C++ name demangled, without its parameter list and return type ("_Z9reduceSumPKfPfi"
 * becomes "reduceSum"), as cm.kernel_name gives it; any other name as it is. Returns out. */
static const char *short_name(const char *nm, size_t len, char *out, size_t cap) {
  snprintf(out, cap, "%.*s", (int)len, nm);
  if (len < 3 || nm[0] != '_' || nm[1] != 'Z') return out;
  int status = 0;
  char *d = __cxa_demangle(out, NULL, NULL, &status);
  if (status != 0 || !d) {
    free(d);
    return out;
  }
  size_t n = strlen(d);
  /* The parameter list: from the '(' that matches the final ')'. */
  if (n > 0 && d[n - 1] == ')') {
    int depth = 0;
    for (size_t i = n; i-- > 0;) {
      if (d[i] == ')') depth++;
      if (d[i] == '(' && --depth == 0) {
        n = i;
        break;
      }
    }
  }
  /* The return type ends at the last space outside template brackets. */
  size_t from = 0;
  int angle = 0;
  for (size_t i = 0; i < n; i++) {
    if (d[i] == '<') angle++;
    if (d[i] == '>') angle--;
    if (d[i] == ' ' && angle == 0) from = i + 1;
  }
  snprintf(out, cap, "%.*s", (int)(n - from), d + from);
  free(d);
  return out;
}

typedef struct agg {
  uint64_t count, total_ns;
  uint32_t name;
} agg;

typedef struct state {
  cm_engine *e;
  int f_name, f_start, f_stop;
  agg by_name[4096];
  uint64_t kernels, others;
} state;

static void on_batch(void *ud, const cm_batch *b) {
  state *s = ud;
  if (b->kind != CM_KIND_CONCURRENT_KERNEL) {
    s->others += b->n;
    return;
  }
  const uint32_t *name = cm_batch_column(b, s->f_name)->data;
  const uint64_t *start = cm_batch_column(b, s->f_start)->data;
  const uint64_t *stop = cm_batch_column(b, s->f_stop)->data;
  for (uint32_t i = 0; i < b->n; i++) {
    /* The fake interns a handful of names, so ids index the table directly; a real recipe
     * would use a hash map. Ids past the table are folded into the last slot. */
    agg *a = &s->by_name[name[i] < 4095 ? name[i] : 4095];
    a->name = name[i];
    a->count++;
    a->total_ns += stop[i] - start[i];
  }
  s->kernels += b->n;
}

static int has_gpu(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return 0;
  int (*init)(unsigned);
  int (*count)(int *);
  *(void **)&init = dlsym(h, "cuInit");
  *(void **)&count = dlsym(h, "cuDeviceGetCount");
  int n = 0;
  int ok = init && count && init(0) == 0 && count(&n) == 0 && n > 0;
  return ok;
}

static void usage(void) {
  printf("usage: cuptimon-selfcheck [--fake] [--records N] [--threads T]\n"
         "\n"
         "Runs the cuptimon engine end to end. With no CUDA device, or with --fake, the engine\n"
         "reads a synthetic mixed workload (N records from T producer threads, default 1000000\n"
         "from 4) through the fake CUPTI, aggregates kernels into a top-kernels table and checks\n"
         "that every record was delivered. With a GPU it loads the real CUPTI and reports the\n"
         "session facts.\n");
}

static int cmp_agg(const void *a, const void *b) {
  const agg *x = a, *y = b;
  return x->total_ns < y->total_ns ? 1 : x->total_ns > y->total_ns ? -1 : 0;
}

int main(int argc, char **argv) {
  int fake = 0, threads = 4;
  uint64_t records = 1000000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--fake"))
      fake = 1;
    else if (!strcmp(argv[i], "--records") && i + 1 < argc)
      records = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage();
      return 0;
    } else {
      fprintf(stderr, "cuptimon-selfcheck: unknown argument '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  if (threads < 1 || threads > 64) {
    fprintf(stderr, "cuptimon-selfcheck: --threads must be in 1..64\n");
    return 2;
  }
  printf("cuptimon %s self-check\n", cm_version());
  if (!fake && !getenv("CUPTIMON_LIBCUPTI") && !has_gpu()) {
    printf("no CUDA device found: using the fake CUPTI (%s)\n", CUPTIMON_FAKE_PATH);
    fake = 1;
  }
  if (fake) {
    setenv("CUPTIMON_LIBCUPTI", CUPTIMON_FAKE_PATH, 1);
    setenv("CUPTIMON_LIBCUDA", CUPTIMON_FAKE_PATH, 1);
  }
  state *s = calloc(1, sizeof *s);
  int rc = cm_engine_new(&s->e, NULL);
  if (rc) {
    fprintf(stderr, "cuptimon-selfcheck: cannot start the engine: %s: %s\n", cm_err_name(rc),
            cm_errmsg());
    return 1;
  }
  cm_session_info info;
  cm_session_info_get(s->e, &info);
  printf("CUPTI %u from %s; timestamps %s CLOCK_REALTIME (offset %" PRId64 " ns)\n",
         info.cupti_version, info.cupti_path, info.clock_realtime ? "are" : "are NOT",
         info.clock_offset_ns);
  if (!fake) {
    cm_engine_free(s->e);
    printf("self-check passed (real CUPTI loaded; no workload traced)\n");
    return 0;
  }

  s->f_name = cm_field_by_name(CM_KIND_CONCURRENT_KERNEL, "name");
  s->f_start = cm_field_by_name(CM_KIND_CONCURRENT_KERNEL, "start");
  s->f_stop = cm_field_by_name(CM_KIND_CONCURRENT_KERNEL, "stop");
  cm_selection *sel;
  cm_selection_new(&sel);
  rc = cm_selection_parse(sel, "kernel:name,start,stop;runtime:start,stop;memcpy:bytes");
  uint32_t id = 0;
  if (!rc) rc = cm_observe(s->e, sel, on_batch, s, &id);
  cm_selection_free(sel);
  if (rc) {
    fprintf(stderr, "cuptimon-selfcheck: %s: %s\n", cm_err_name(rc), cm_errmsg());
    return 1;
  }
  int kinds[3] = {CM_KIND_CONCURRENT_KERNEL, CM_KIND_RUNTIME, CM_KIND_MEMCPY};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int64_t written = fake_run_workload(threads, records / (uint64_t)threads, kinds, 3);
  rc = cm_flush(s->e, CM_FLUSH_SYNC, 10000);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  if (rc) fprintf(stderr, "flush: %s: %s\n", cm_err_name(rc), cm_errmsg());

  qsort(s->by_name, 4096, sizeof(agg), cmp_agg);
  /* Microseconds, as the recipes' tables give them (scripts/top.lua). */
  printf("\ntop kernels by total time\n%10s %12s %10s  %s\n", "count", "total_us", "avg_us",
         "name");
  for (int i = 0; i < 4096 && s->by_name[i].count; i++) {
    size_t len = 0;
    const char *nm = cm_string(s->e, s->by_name[i].name, &len);
    char shown[512];
    if (nm) short_name(nm, len, shown, sizeof shown);
    printf("%10" PRIu64 " %12.0f %10.3f  %s\n", s->by_name[i].count,
           (double)s->by_name[i].total_ns / 1e3,
           (double)s->by_name[i].total_ns / 1e3 / (double)s->by_name[i].count, nm ? shown : "?");
  }

  cm_stats st;
  cm_stats_get(s->e, &st);
  uint64_t got = s->kernels + s->others;
  printf("\nwritten %" PRId64 " records, delivered %" PRIu64 " (%" PRIu64 " kernels), dropped %"
         PRIu64 ", %.0f records/s end to end\n",
         written, got, s->kernels, st.records_dropped, (double)got / secs);
  printf("buffers: %" PRIu64 " allocated, %" PRIu64 " decoded, queue peak %" PRIu64
         "; strings interned: %" PRIu64 "\n",
         st.buffers_allocated, st.buffers_decoded, st.decode_queue_peak, st.strings);
  cm_unobserve(s->e, id);
  cm_engine_free(s->e);
  int ok = written > 0 && got == (uint64_t)written && st.records_dropped == 0 && rc == 0;
  printf("%s\n", ok ? "self-check passed" : "self-check FAILED");
  free(s);
  return ok ? 0 : 1;
}
