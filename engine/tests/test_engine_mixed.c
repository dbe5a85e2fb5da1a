/*
 * test_engine_mixed.c: one million mixed records from four producer threads, delivered exactly.
 *
 * Design. The fake CUPTI writes a deterministic workload: producer t writes record j with kind
 * kinds[j % nkinds] as fake_gen_record(kind, t, j) builds it. One observer selects every field of
 * every kind that both the fake generates and the registry knows. After a sync flush the test
 * regenerates every record independently and compares, per kind:
 *  - the record count;
 *  - per field, two order-independent checksums over the column (a wrapping sum of value times an
 *    odd constant, and an XOR of a mixed value), because delivery order across producer threads
 *    is not defined; string fields are compared by an FNV-1a hash of their content, resolved
 *    through cm_string() on the delivered side and read through the record's pointer on the
 *    generated side;
 *  - the multiset of per-record row hashes (all fields of one record mixed together), which
 *    catches a duplicate that happens to hide a loss of the same count, and a record whose fields
 *    were torn from different records.
 * The fence's own device synchronization may add SYNCHRONIZATION records the workload did not
 * write (they are real activity); for that kind only, rows that match no generated record are
 * allowed, up to the number of device syncs the fake saw, and are left out of the checksums.
 * Expected values come only from the generator and the registry's offsets, never from constants.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmt.h"
#include "cmt_records.h"
#include "cuptimon.h"
#include "fake_cupti.h"

#define NTHREADS 4
#define PER_THREAD 250000ull

/* ---- per-kind state ------------------------------------------------------------------------ */

typedef struct u64vec {
  uint64_t *v;
  size_t n, cap;
} u64vec;

static void vec_push(u64vec *a, uint64_t x) {
  if (a->n == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 1024;
    a->v = realloc(a->v, a->cap * sizeof *a->v);
    CMT_ASSERT(a->v != NULL);
  }
  a->v[a->n++] = x;
}

typedef struct kstate {
  int kind;
  int nf;
  cm_field_info *fi;
  bool keep_rows; /* store every delivered value, to take fence rows back out of the checksums */
  uint64_t exp_count, got_count;
  uint64_t *exp_sum, *exp_xor, *got_sum, *got_xor;
  u64vec exp_rows, got_rows; /* row hashes */
  u64vec got_vals;           /* keep_rows only: nf values per delivered row */
} kstate;

static kstate g_ks[CM_KIND_MAX];
static bool g_selected[CM_KIND_MAX];
static cm_engine *g_engine;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_batches;
static u64vec g_str_hash; /* FNV-1a of string id i, or 0 when not yet resolved */

static void kstate_init(kstate *ks, int kind) {
  ks->kind = kind;
  ks->nf = cm_field_count(kind);
  CMT_GT(ks->nf, 0);
  ks->fi = calloc((size_t)ks->nf, sizeof *ks->fi);
  ks->exp_sum = calloc((size_t)ks->nf, sizeof(uint64_t));
  ks->exp_xor = calloc((size_t)ks->nf, sizeof(uint64_t));
  ks->got_sum = calloc((size_t)ks->nf, sizeof(uint64_t));
  ks->got_xor = calloc((size_t)ks->nf, sizeof(uint64_t));
  CMT_ASSERT(ks->fi && ks->exp_sum && ks->exp_xor && ks->got_sum && ks->got_xor);
  for (int f = 0; f < ks->nf; f++) {
    CMT_OK(cm_field_info_get(kind, f, &ks->fi[f]));
    CMT_EQ(ks->fi[f].id, f);
    CMT_EQ(ks->fi[f].kind, kind);
  }
  ks->keep_rows = kind == CM_KIND_SYNCHRONIZATION;
}

/* The FNV-1a hash of string id `id`, resolved once through cm_string(). Caller holds g_mu. */
static uint64_t string_hash(uint32_t id) {
  while (g_str_hash.n <= id) vec_push(&g_str_hash, 0);
  if (g_str_hash.v[id] == 0) {
    size_t len = 0;
    const char *s = cm_string(g_engine, id, &len);
    if (!s) CMT_FAIL("string id %u does not resolve (cm_string_count %u)", id,
                     cm_string_count(g_engine));
    g_str_hash.v[id] = fnv1a(s, len);
  }
  return g_str_hash.v[id];
}

static uint64_t column_value(const cm_column *c, uint32_t i) {
  uint64_t raw = load_le((const unsigned char *)c->data + (size_t)i * c->width, c->width);
  if (c->type == CM_TYPE_STR) return string_hash((uint32_t)raw);
  return normalize(raw, c->width, type_signed(c->type));
}

/* The observer. It checks the batch's shape against the registry and folds every value into
 * the delivered checksums and row hashes. */
static void on_batch(void *ud, const cm_batch *b) {
  (void)ud;
  pthread_mutex_lock(&g_mu);
  g_batches++;
  if (b->kind <= 0 || b->kind >= CM_KIND_MAX || !g_selected[b->kind])
    CMT_FAIL("batch of kind %d (%s) that the observer did not select", b->kind,
             cm_kind_name(b->kind) ? cm_kind_name(b->kind) : "?");
  kstate *ks = &g_ks[b->kind];
  CMT_EQ(b->ncols, ks->nf);
  for (int c = 0; c < ks->nf; c++) {
    const cm_column *col = &b->cols[c];
    CMT_EQ(col->field, c);
    CMT_EQ(col->type, ks->fi[c].type);
    CMT_EQU(col->width, ks->fi[c].width);
    CMT_STREQ(col->name, ks->fi[c].name);
    CMT_ASSERT(cm_batch_column(b, c) == col);
    if (b->n) {
      CMT_ASSERT(col->data != NULL);
      CMT_EQU((uintptr_t)col->data % 8, 0);
    }
  }
  for (uint32_t i = 0; i < b->n; i++) {
    uint64_t h = (uint64_t)b->kind;
    for (int c = 0; c < ks->nf; c++) {
      uint64_t v = column_value(&b->cols[c], i);
      fold_value(&ks->got_sum[c], &ks->got_xor[c], c, v);
      h = row_step(h, c, v);
      if (ks->keep_rows) vec_push(&ks->got_vals, v);
    }
    vec_push(&ks->got_rows, h);
  }
  ks->got_count += b->n;
  pthread_mutex_unlock(&g_mu);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

typedef struct idx_hash {
  uint64_t h;
  size_t row;
} idx_hash;

static int cmp_idx_hash(const void *a, const void *b) {
  const idx_hash *x = a, *y = b;
  if (x->h != y->h) return x->h < y->h ? -1 : 1;
  return x->row < y->row ? -1 : x->row > y->row;
}

/* Compares the delivered rows of `ks` with the generated ones as multisets. Returns the number
 * of generated rows never delivered; *extra receives the delivered rows that match no generated
 * row, and the row indices of those extras go to `extras` (when non-NULL). */
static uint64_t match_rows(kstate *ks, uint64_t *extra, u64vec *extras) {
  idx_hash *got = malloc((ks->got_rows.n + 1) * sizeof *got);
  CMT_ASSERT(got != NULL);
  for (size_t i = 0; i < ks->got_rows.n; i++) got[i] = (idx_hash){ks->got_rows.v[i], i};
  qsort(got, ks->got_rows.n, sizeof *got, cmp_idx_hash);
  qsort(ks->exp_rows.v, ks->exp_rows.n, sizeof(uint64_t), cmp_u64);
  size_t i = 0, j = 0;
  uint64_t missing = 0;
  *extra = 0;
  while (i < ks->exp_rows.n || j < ks->got_rows.n) {
    if (j == ks->got_rows.n || (i < ks->exp_rows.n && ks->exp_rows.v[i] < got[j].h)) {
      missing++;
      i++;
    } else if (i == ks->exp_rows.n || got[j].h < ks->exp_rows.v[i]) {
      (*extra)++;
      if (extras) vec_push(extras, got[j].row);
      j++;
    } else {
      i++;
      j++;
    }
  }
  free(got);
  return missing;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep the progress lines when an assertion aborts */
  int gen[64];
  int ngen = fake_gen_kinds(gen, 64);
  CMT_GT(ngen, 0);
  int kinds[64];
  int nk = 0;
  printf("fake generates %d kinds:", ngen);
  for (int i = 0; i < ngen; i++) {
    const char *name = cm_kind_name(gen[i]);
    if (name && cm_field_count(gen[i]) > 0) {
      kinds[nk++] = gen[i];
      printf(" %s", name);
    } else {
      printf(" [kind %d unknown to the registry: left out]", gen[i]);
    }
  }
  printf("\n");
  CMT_GT(nk, 1);

  cm_config cfg;
  cm_config_init(&cfg);
  cfg.fence_timeout_ms = 60000; /* a slow sanitizer build must not turn decode time into loss */
  CMT_OK(cm_engine_new(&g_engine, &cfg));
  cm_set_log(g_engine, log_to_stderr, NULL);

  cm_selection *sel = NULL;
  CMT_OK(cm_selection_new(&sel));
  for (int i = 0; i < nk; i++) {
    kstate_init(&g_ks[kinds[i]], kinds[i]);
    g_selected[kinds[i]] = true;
    CMT_OK(cm_selection_add_id(sel, kinds[i], -1));
    CMT_EQ(cm_selection_count(sel, kinds[i]), g_ks[kinds[i]].nf);
  }
  uint32_t obs = 0;
  CMT_OK(cm_observe(g_engine, sel, on_batch, NULL, &obs));
  CMT_GT(obs, 0);
  for (int i = 0; i < nk; i++) CMT_EQ(fake_kind_enabled(kinds[i]), 1);

  fake_stats fs0, fs1;
  fake_get_stats(&fs0);
  double t0 = now_s();
  int64_t written = fake_run_workload(NTHREADS, PER_THREAD, kinds, nk);
  CMT_EQ(written, (int64_t)(NTHREADS * PER_THREAD));
  double t1 = now_s();
  CMT_OK(cm_flush(g_engine, CM_FLUSH_SYNC, 60000));
  double t2 = now_s();
  fake_get_stats(&fs1);
  printf("workload %.3f s, sync flush %.3f s\n", t1 - t0, t2 - t1);

  /* Regenerate the workload independently. */
  union {
    uint64_t align;
    unsigned char b[1024];
  } rec;
  for (uint32_t t = 0; t < NTHREADS; t++) {
    for (uint64_t j = 0; j < PER_THREAD; j++) {
      int kind = kinds[j % (uint64_t)nk];
      kstate *ks = &g_ks[kind];
      memset(rec.b, 0, sizeof rec.b);
      size_t size = fake_gen_record(kind, t, j, rec.b);
      CMT_GT(size, 0);
      CMT_LEU(size, 256);
      uint64_t h = (uint64_t)kind;
      for (int f = 0; f < ks->nf; f++) {
        uint64_t v = record_value(rec.b, size, &ks->fi[f]);
        fold_value(&ks->exp_sum[f], &ks->exp_xor[f], f, v);
        h = row_step(h, f, v);
      }
      vec_push(&ks->exp_rows, h);
      ks->exp_count++;
    }
  }

  cm_stats st;
  CMT_OK(cm_stats_get(g_engine, &st));
  uint64_t fence_syncs = fs1.syncs - fs0.syncs;
  int failures = 0;
  uint64_t delivered = 0;
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < nk; i++) {
    kstate *ks = &g_ks[kinds[i]];
    const char *kname = cm_kind_name(ks->kind);
    uint64_t extra = 0;
    u64vec extras = {0};
    uint64_t missing = match_rows(ks, &extra, ks->keep_rows ? &extras : NULL);
    delivered += ks->got_count;
    uint64_t allowed_extra = ks->keep_rows ? fence_syncs : 0;
    printf("%-22s generated %8" PRIu64 " delivered %8" PRIu64 " missing %" PRIu64
           " unmatched %" PRIu64 "\n",
           kname, ks->exp_count, ks->got_count, missing, extra);
    if (missing != 0 || extra > allowed_extra) {
      fprintf(stderr, "FAIL %s: %" PRIu64 " generated records missing, %" PRIu64
              " delivered records match no generated one (allowed %" PRIu64 ")\n",
              kname, missing, extra, allowed_extra);
      failures++;
    }
    if (ks->keep_rows && ks->got_count != ks->exp_count + extra) {
      fprintf(stderr, "FAIL %s: delivered %" PRIu64 " != generated %" PRIu64 " + fence rows %"
              PRIu64 "\n", kname, ks->got_count, ks->exp_count, extra);
      failures++;
    }
    /* Take the fence's own rows back out of the delivered checksums. */
    for (size_t x = 0; x < extras.n; x++) {
      const uint64_t *vals = &ks->got_vals.v[extras.v[x] * (size_t)ks->nf];
      for (int f = 0; f < ks->nf; f++) {
        ks->got_sum[f] -= vals[f] * CMT_ODD_MUL;
        ks->got_xor[f] ^= field_mix(f, vals[f]);
      }
    }
    free(extras.v);
    for (int f = 0; f < ks->nf; f++) {
      if (ks->got_sum[f] != ks->exp_sum[f] || ks->got_xor[f] != ks->exp_xor[f]) {
        fprintf(stderr, "FAIL %s.%s (offset %u, src_width %u, width %u, type %d): checksum "
                "sum %016" PRIx64 " vs expected %016" PRIx64 ", xor %016" PRIx64
                " vs expected %016" PRIx64 "\n",
                kname, ks->fi[f].name, ks->fi[f].offset, ks->fi[f].src_width, ks->fi[f].width,
                ks->fi[f].type, ks->got_sum[f], ks->exp_sum[f], ks->got_xor[f], ks->exp_xor[f]);
        failures++;
      }
    }
    if (ks->kind != CM_KIND_SYNCHRONIZATION && st.records_by_kind[ks->kind] != ks->exp_count) {
      fprintf(stderr, "FAIL %s: stats records_by_kind %" PRIu64 " != generated %" PRIu64 "\n",
              kname, st.records_by_kind[ks->kind], ks->exp_count);
      failures++;
    }
  }
  printf("batches %" PRIu64 ", delivered %" PRIu64 ", strings %u, device syncs %" PRIu64 "\n",
         g_batches, delivered, cm_string_count(g_engine), fence_syncs);
  pthread_mutex_unlock(&g_mu);

  CMT_EQ(failures, 0);
  CMT_EQU(st.records_dropped, 0);
  CMT_EQU(fs1.records_dropped, 0);
  CMT_EQU(st.records_delivered, delivered);
  CMT_LEU(delivered, st.records_decoded);

  double t3 = now_s();
  CMT_OK(cm_unobserve(g_engine, obs));
  double t4 = now_s();
  cm_selection_free(sel);
  cm_engine_free(g_engine);
  printf("unobserve %.3f s, engine free %.3f s\n", t4 - t3, now_s() - t4);
  for (int i = 0; i < nk; i++) {
    kstate *ks = &g_ks[kinds[i]];
    free(ks->fi);
    free(ks->exp_sum);
    free(ks->exp_xor);
    free(ks->got_sum);
    free(ks->got_xor);
    free(ks->exp_rows.v);
    free(ks->got_rows.v);
    free(ks->got_vals.v);
  }
  free(g_str_hash.v);
  printf("ok\n");
  return 0;
}
