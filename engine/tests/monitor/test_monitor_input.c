/*
 * test_monitor_input.c: the bounded cost of hostile input to the monitor's frame handling
 * (engine/monitor/wsrc.c), through cm__wsrc_frame as the hub and the replay call it.
 *
 * Design note. wsrc.c is linked with the stand-in host of engine/fuzz/host_stubs.c (no
 * LuaJIT), whose delivery checks abort on a broken contract. Frames are written with the wire
 * writers and read back through a wire reader, as they arrive in production. Covered:
 *  - a STRINGS entry with a huge id (2^26 - 1, 2^32 - 1) costs one slot, not an array up to the
 *    id: the peak RSS grows by a few MiB at most (it grew by 768 MiB before);
 *  - a STATS frame with 65,536 distinct names keeps the documented cap of names, refuses the
 *    rest with a warning, and takes milliseconds (5.5 s before: a strcmp scan and a realloc per
 *    name);
 *  - SCHEMA frames naming thousands of distinct kinds keep the cap of kinds;
 *  - a BATCH column of a type this version does not know is skipped: no observer receives it.
 */
#include "cmt.h"
#include "host_stubs.h"
#include "wsrc.h"

#include <sys/resource.h>
#include <time.h>

static void release_src(cm__wsrc *w) {
  cm__wsrc_release(w);
  free(w);
}

static const cm__wsrc_ops ops = {.detached = release_src};

static cm__wsrc *new_src(void) {
  cm__wsrc *w = calloc(1, sizeof *w);
  CMT_ASSERT(w);
  cm__wsrc_init(w, &ops, NULL, "replay");
  return w;
}

/* Reads the frames in `b` and hands each to the source; returns the first error. */
static int feed(cm__wsrc *w, cm_wire_buf *b) {
  cm_wire_reader *r;
  CMT_OK(cm_wire_reader_new(&r, 0));
  CMT_OK(cm_wire_reader_feed(r, b->data, b->len));
  cm_wire_frame f;
  char err[512] = "";
  int rc = 0, got;
  while (rc == 0 && (got = cm_wire_reader_next(r, &f)) == 1) rc = cm__wsrc_frame(w, &f, err, sizeof err);
  if (rc) fprintf(stderr, "test_monitor_input: frame refused: %s\n", err);
  cm_wire_reader_free(r);
  cm_wire_buf_clear(b);
  return rc;
}

static long maxrss_kb(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *str_of(cm__wsrc *w, uint32_t id, size_t *len) { return w->base.vt->string(&w->base, id, len); }

static void test_strings(void) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm__wsrc *w = new_src();
  long before = maxrss_kb();
  /* Sparse ids: each costs one entry, whatever its value. */
  static const cm_wire_string sparse[] = {{(1u << 26) - 1, 3, "big"}, {UINT32_MAX, 3, "max"}, {7, 5, "seven"},
                                          {0x80000000u, 4, "half"}, {0, 3, "nil"}};
  CMT_OK(cm_wire_write_strings(&b, sparse, 5));
  CMT_OK(feed(w, &b));
  long after = maxrss_kb();
  printf("test_monitor_input: a STRINGS frame with id 2^26-1: peak RSS %ld -> %ld KiB\n", before, after);
  CMT_LT(after - before, 32 * 1024);
  size_t len;
  CMT_STREQ(str_of(w, (1u << 26) - 1, &len), "big");
  CMT_EQU(len, 3);
  CMT_STREQ(str_of(w, UINT32_MAX, &len), "max");
  CMT_STREQ(str_of(w, 0x80000000u, &len), "half");
  CMT_STREQ(str_of(w, 7, &len), "seven");
  CMT_STREQ(str_of(w, 0, &len), ""); /* id 0 is the empty string, never stored */
  CMT_ASSERT(str_of(w, 8, &len) == NULL);
  cm_stats st;
  CMT_OK(w->base.vt->stats(&w->base, &st));
  CMT_EQU(st.strings, 4);
  /* Dense ids, as an agent sends them, in two frames; then one replaced. */
  enum { N = 200000 };
  cm_wire_string *e = calloc(N, sizeof *e);
  char (*txt)[16] = calloc(N, 16);
  for (uint32_t i = 0; i < N; i++) {
    snprintf(txt[i], 16, "s%u", i + 1);
    e[i] = (cm_wire_string){i + 1, (uint32_t)strlen(txt[i]), txt[i]};
  }
  CMT_OK(cm_wire_write_strings(&b, e, N / 2));
  CMT_OK(cm_wire_write_strings(&b, e + N / 2, N / 2));
  CMT_OK(cm_wire_write_strings(&b, &(cm_wire_string){5, 4, "five"}, 1));
  CMT_OK(feed(w, &b));
  for (uint32_t i = 0; i < N; i++) {
    const char *s = str_of(w, i + 1, &len);
    CMT_ASSERT(s);
    if (i + 1 == 5) CMT_STREQ(s, "five");
    else if (i + 1 == 7) CMT_STREQ(s, "s7");
    else if (strcmp(s, txt[i]) != 0) CMT_FAIL("id %u: \"%s\", expected \"%s\"", i + 1, s, txt[i]);
  }
  CMT_OK(w->base.vt->stats(&w->base, &st));
  CMT_EQU(st.strings, N + 3); /* 1..N, and the three sparse ids above N */
  free(e);
  free(txt);
  release_src(w);
  cm_wire_buf_free(&b);
}

static void test_stats(void) {
  enum { N = 65536 };
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm__wsrc *w = new_src();
  cm_wire_kv *kv = calloc(N, sizeof *kv);
  char (*names)[24] = calloc(N, 24);
  for (uint32_t i = 0; i < N; i++) {
    snprintf(names[i], 24, "counter_%05u", i);
    kv[i] = (cm_wire_kv){names[i], i + 1};
  }
  CMT_OK(cm_wire_write_stats(&b, kv, N));
  printf("test_monitor_input: a STATS frame of %d names is %zu bytes\n", N, b.len);
  double t0 = now();
  CMT_OK(feed(w, &b));
  double t1 = now();
  for (uint32_t i = 0; i < N; i++) kv[i].value = 1000000 + i;
  CMT_OK(cm_wire_write_stats(&b, kv, N));
  double t2 = now();
  CMT_OK(feed(w, &b));
  double t3 = now();
  printf("test_monitor_input: STATS with %d names: %.1f ms, again %.1f ms\n", N, (t1 - t0) * 1e3, (t3 - t2) * 1e3);
  CMT_EQU(w->nstats, CM__WSRC_MAX_STATS);
  CMT_EQU(w->rejected, 2 * (uint64_t)(N - CM__WSRC_MAX_STATS));
  CMT_EQU(cm__wsrc_stat(w, "counter_00000"), 1000000);
  CMT_EQU(cm__wsrc_stat(w, "counter_01023"), 1000000 + 1023);
  CMT_EQU(cm__wsrc_stat(w, "counter_01024"), 0); /* refused */
  /* Known names keep updating past the cap; a lookup is exact. */
  CMT_OK(cm_wire_write_stats(&b, (cm_wire_kv[]){{"counter_00500", 42}, {"records_dropped", 9}}, 2));
  CMT_OK(feed(w, &b));
  CMT_EQU(cm__wsrc_stat(w, "counter_00500"), 42);
  CMT_EQU(cm__wsrc_stat(w, "records_dropped"), 0);
  /* Under the cap every name is kept. */
  cm__wsrc *v = new_src();
  CMT_OK(cm_wire_write_stats(&b, kv, CM__WSRC_MAX_STATS));
  CMT_OK(feed(v, &b));
  CMT_EQU(v->nstats, CM__WSRC_MAX_STATS);
  CMT_EQU(v->rejected, 0);
  for (uint32_t i = 0; i < CM__WSRC_MAX_STATS; i++) CMT_EQU(cm__wsrc_stat(v, names[i]), 1000000 + i);
  release_src(v);
  release_src(w);
  free(kv);
  free(names);
  cm_wire_buf_free(&b);
}

static void test_kinds(void) {
  enum { PER = 1000, FRAMES = 3 };
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm__wsrc *w = new_src();
  cm_wire_kind *k = calloc(PER, sizeof *k);
  static const cm_wire_field start[] = {{0, CM_TYPE_U64, 8, 0, "start"}};
  static const cm_wire_field stamp[] = {{0, CM_TYPE_U64, 8, 0, "x"}, {3, CM_TYPE_U64, 8, 0, "timestamp"}};
  double t0 = now();
  for (uint32_t f = 0; f < FRAMES; f++) {
    for (uint32_t i = 0; i < PER; i++) k[i] = (cm_wire_kind){100000 + f * PER + i, 1, "k", start};
    CMT_OK(cm_wire_write_schema(&b, &(cm_wire_schema){PER, 0, k}));
    CMT_OK(feed(w, &b));
  }
  printf("test_monitor_input: %d SCHEMA kinds: %.1f ms\n", PER * FRAMES, (now() - t0) * 1e3);
  CMT_EQU(w->nkinds, CM__WSRC_MAX_KINDS);
  CMT_EQU(w->rejected, PER * FRAMES - CM__WSRC_MAX_KINDS);
  /* The latest schema of a kind wins: kind 100005 now has its start in field 3. */
  CMT_OK(cm_wire_write_schema(&b, &(cm_wire_schema){1, 0, &(cm_wire_kind){100005, 2, "k", stamp}}));
  CMT_OK(feed(w, &b));
  CMT_EQU(w->nkinds, CM__WSRC_MAX_KINDS);
  uint64_t v0[2] = {1, 2}, v3[2] = {900, 800};
  cm_column cols[2] = {{0, CM_TYPE_U64, 8, 0, "x", v0}, {3, CM_TYPE_U64, 8, 0, "timestamp", v3}};
  CMT_OK(cm_wire_write_batch(&b, &(cm_batch){100005, 2, 2, 0, cols, 1}));
  cm_wire_reader *r;
  CMT_OK(cm_wire_reader_new(&r, 0));
  CMT_OK(cm_wire_reader_feed(r, b.data, b.len));
  cm_wire_frame f;
  CMT_EQ(cm_wire_reader_next(r, &f), 1);
  CMT_EQU(cm__wsrc_batch_key(w, &f), 800);
  cm_wire_reader_free(r);
  cm_wire_buf_clear(&b);
  release_src(w);
  free(k);
  cm_wire_buf_free(&b);
}

static int field_id(int kind, const char *name) {
  for (int f = 0; f < cm_field_count(kind); f++) {
    cm_field_info fi;
    if (cm_field_info_get(kind, f, &fi) == 0 && strcmp(fi.name, name) == 0) return f;
  }
  CMT_FAIL("no field %s", name);
  return -1;
}

static void test_unknown_type(void) {
  int kind = CM_KIND_CONCURRENT_KERNEL;
  int named = stub_host_observe("concurrent_kernel:start,name");
  int plain = stub_host_observe("concurrent_kernel:start");
  CMT_GE(named, 0);
  CMT_GE(plain, 0);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm__wsrc *w = new_src();
  CMT_OK(cm__wsrc_attach(w, stub_host));
  int fs = field_id(kind, "start"), fn = field_id(kind, "name");
  CMT_LT(fs, fn);
  CMT_OK(cm_wire_write_strings(&b, &(cm_wire_string){1, 2, "k1"}, 1));
  uint64_t start[3] = {10, 20, 30};
  uint32_t name[3] = {1, 1, 1};
  cm_column cols[2] = {{fs, CM_TYPE_U64, 8, 0, "start", start}, {fn, 42 /* unknown */, 4, 0, "name", name}};
  CMT_OK(cm_wire_write_batch(&b, &(cm_batch){kind, 3, 2, 0, cols, 1}));
  cols[1].type = CM_TYPE_STR;
  CMT_OK(cm_wire_write_batch(&b, &(cm_batch){kind, 3, 2, 0, cols, 2}));
  CMT_OK(feed(w, &b));
  /* The stand-in host aborts if a column of unknown type reaches an observer. The observer that
   * selected the name gets only the batch that has it; the other gets both, start only. */
  CMT_EQU(stub_obs_tab[named].batches, 1);
  CMT_EQU(stub_obs_tab[named].columns, 2);
  CMT_EQU(stub_obs_tab[plain].batches, 2);
  CMT_EQU(stub_obs_tab[plain].records, 6);
  CMT_EQU(stub_obs_tab[plain].columns, 2);
  cm__wsrc_detach(w); /* frees w */
  stub_host_reset();
  cm_wire_buf_free(&b);
}

int main(void) {
  test_strings(); /* first: it measures the peak RSS */
  test_stats();
  test_kinds();
  test_unknown_type();
  printf("test_monitor_input: ok\n");
  return 0;
}
