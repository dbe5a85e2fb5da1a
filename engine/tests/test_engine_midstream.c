/*
 * test_engine_midstream.c: selection changes while producers run lose and duplicate nothing.
 *
 * Design. Two fake producer threads write kernel and memcpy records alternately (record j of
 * thread t has kind kinds[j % 2] and is fake_gen_record(kind, t, j)) for as long as the test runs.
 * The observers come and go around them:
 *   C  kernel, every field: registered before the producers start and kept to the end, so every
 *      kernel record written must reach C exactly once;
 *   A  kernel:name,start: added after the producers started, removed before they stop;
 *   B  memcpy (every field) plus kernel:name,stop,grid_x: added while A exists and kept to the
 *      end. memcpy is enabled only by B, so every memcpy record written must reach B.
 * Identity. A delivered record is identified by regenerating the workload: the hash of all of a
 * kernel record's fields (C) or all of a memcpy record's fields (B) names exactly one (t, j), and
 * the projections onto A's and B's kernel fields are used the same way after checking that they
 * are unambiguous. Each producer reports how many sequence numbers it used, and the walk covers
 * exactly those: the producers stop between any two records, so the last one written may be a
 * kernel or a memcpy record, and nothing delivered can tell where a thread ended (see prod_main).
 * The checks, per producer thread t:
 *  - C holds exactly the thread's kernel records j = 0, 2, 4, ... below its count: every one, with
 *    no duplicate (delivered multiplicities are counted down to zero);
 *  - B's memcpy records are one contiguous run of the thread's memcpy sequence, ending at the
 *    thread's last record, and nothing else;
 *  - A's kernel records are one contiguous run, and B's kernel records one contiguous run that
 *    ends at the thread's last kernel record; together they leave no gap (B was added before A
 *    was removed);
 *  - the producers' own count of written records equals C's kernel records plus B's memcpy ones.
 * Every batch is also checked to carry exactly its observer's fields. Phases advance on observed
 * progress (a number of records delivered), not only on time, so a slow sanitizer build still
 * exercises every phase. A drop would make gaps legitimate, so the test asserts there were none.
 * The producers are paced (see prod_main); a last part runs the fake's unpaced producers to check
 * that the delivery cadence keeps delivering while the decoder never runs out of work.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmt.h"
#include "cmt_records.h"
#include "cuptimon.h"
#include "fake_cupti.h"

#define NPROD 2
#define PHASE_RECORDS 20000u /* kernel records an observer must see before the next step */
#define PHASE_MIN_MS 30
#define PHASE_MAX_MS 20000

/* ---- observers ------------------------------------------------------------------------------ */

typedef struct obs {
  const char *label;
  cm_selection *sel;
  uint32_t id;
  bool active;
  bool light;           /* count and time batches only, without hashing their rows */
  uint64_t batches;
  uint64_t last_ms;     /* monotonic time of the last batch, or of the start of a window */
  uint64_t max_gap_ms;  /* the longest time without a batch since the window started */
  uint64_t count[CM_KIND_MAX];
  hset rows[CM_KIND_MAX]; /* hash of the selected fields of each delivered record */
} obs;

static cm_engine *g_engine;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_str_hash[4096]; /* content hash by string id; 0 when not yet resolved */

static uint64_t string_hash(uint32_t id) {
  if (id < 4096 && g_str_hash[id]) return g_str_hash[id];
  size_t len = 0;
  const char *s = cm_string(g_engine, id, &len);
  if (!s) CMT_FAIL("string id %u does not resolve", id);
  uint64_t h = fnv1a(s, len);
  if (id < 4096) g_str_hash[id] = h;
  return h;
}

static uint64_t column_value(const cm_column *c, uint32_t i) {
  uint64_t raw = load_le((const unsigned char *)c->data + (size_t)i * c->width, c->width);
  if (c->type == CM_TYPE_STR) return string_hash((uint32_t)raw);
  return normalize(raw, c->width, type_signed(c->type));
}

static void on_batch(void *ud, const cm_batch *b) {
  obs *o = ud;
  pthread_mutex_lock(&g_mu);
  if (!o->active) CMT_FAIL("observer %s got a batch after cm_unobserve returned", o->label);
  int want = b->kind > 0 && b->kind < CM_KIND_MAX ? cm_selection_count(o->sel, b->kind) : 0;
  if (want <= 0)
    CMT_FAIL("observer %s got a batch of kind %d that it did not select", o->label, b->kind);
  if ((int)b->ncols != want)
    CMT_FAIL("observer %s, kind %s: %u columns, selected %d", o->label, cm_kind_name(b->kind),
             b->ncols, want);
  int prev = -1;
  for (uint32_t c = 0; c < b->ncols; c++) {
    const cm_column *col = &b->cols[c];
    if (col->field <= prev || !cm_selection_has(o->sel, b->kind, col->field))
      CMT_FAIL("observer %s, kind %s: column %u is field %d, not the next selected field",
               o->label, cm_kind_name(b->kind), c, col->field);
    prev = col->field;
    cm_field_info fi;
    CMT_OK(cm_field_info_get(b->kind, col->field, &fi));
    CMT_EQ(col->type, fi.type);
    CMT_EQU(col->width, fi.width);
  }
  o->batches++;
  uint64_t now = mono_ms();
  if (o->last_ms && now - o->last_ms > o->max_gap_ms) o->max_gap_ms = now - o->last_ms;
  o->last_ms = now;
  for (uint32_t i = 0; !o->light && i < b->n; i++) {
    uint64_t h = (uint64_t)b->kind;
    for (uint32_t c = 0; c < b->ncols; c++)
      h = row_step(h, b->cols[c].field, column_value(&b->cols[c], i));
    hset_add(&o->rows[b->kind], h);
  }
  o->count[b->kind] += b->n;
  pthread_mutex_unlock(&g_mu);
}

static uint64_t obs_count(obs *o, int kind) {
  pthread_mutex_lock(&g_mu);
  uint64_t n = o->count[kind];
  pthread_mutex_unlock(&g_mu);
  return n;
}

static void observe(obs *o, const char *label, const char *spec) {
  o->label = label;
  CMT_OK(cm_selection_new(&o->sel));
  CMT_OK(cm_selection_parse(o->sel, spec));
  pthread_mutex_lock(&g_mu);
  o->active = true;
  pthread_mutex_unlock(&g_mu);
  CMT_OK(cm_observe(g_engine, o->sel, on_batch, o, &o->id));
}

static void unobserve(obs *o) {
  CMT_OK(cm_unobserve(g_engine, o->id));
  pthread_mutex_lock(&g_mu);
  o->active = false;
  pthread_mutex_unlock(&g_mu);
}

/* ---- paced producers ------------------------------------------------------------------------ */

/* The fake's own producers (fake_start_producers) write as fast as the CPU allows, which on two
 * cores is faster than any decoder here and than any GPU produces records; their backlog would
 * end in pool drops, which make gaps legitimate and the strict checks meaningless. These
 * producers write the same sequence (record j of thread t is fake_gen_record(kinds[j % 2], t, j))
 * in bursts with a pause between them. The unpaced case is tested on its own at the end. */
#define BURST 32
static atomic_int g_stop;
static int g_kinds[2];

typedef struct prod {
  pthread_t tid;
  uint32_t t;
  uint64_t written, disabled;
  uint64_t used; /* sequence numbers used: records 0 .. used-1 went to fake_emit */
} prod;

static void *prod_main(void *arg) {
  prod *p = arg;
  union {
    uint64_t align;
    unsigned char b[1024];
  } rec;
  uint64_t j = 0;
  for (; !atomic_load(&g_stop); j++) {
    size_t size = fake_gen_record(g_kinds[j % 2], p->t, j, rec.b);
    int rc = fake_emit(rec.b, size, 0);
    if (rc == 0) p->written++;
    else if (rc == 2) p->disabled++;
    else CMT_FAIL("fake_emit returned %d for producer %u record %" PRIu64, rc, p->t, j);
    if (j % BURST == BURST - 1) usleep(1000);
  }
  /* The stop can come after any record. A burst ends with a memcpy record (BURST is even), so on
   * an idle machine the stop is nearly always seen in the pause after a memcpy; a producer
   * preempted inside a burst stops after a kernel record about half the time. The walk in main
   * must therefore not infer a thread's end from what was delivered: it stops at `used`. */
  p->used = j;
  return NULL;
}

/* Lets the producers run until `o` has received `n` more records of `kind` (and at least
 * PHASE_MIN_MS have passed), so every phase sees traffic however slow the machine is. */
static void run_phase(obs *o, int kind, uint64_t n) {
  uint64_t base = obs_count(o, kind), t0 = mono_ms();
  for (;;) {
    uint64_t el = mono_ms() - t0;
    if (el >= PHASE_MIN_MS && obs_count(o, kind) >= base + n) break;
    if (el > PHASE_MAX_MS)
      CMT_FAIL("observer %s received %" PRIu64 " %s records in %" PRIu64
               " ms, wanted %" PRIu64 ": delivery stalled",
               o->label, obs_count(o, kind) - base, cm_kind_name(kind), el, n);
    /* MIDSTREAM_DEBUG=1 prints the pipeline's state about once a second, to tell a stalled
     * decoder from a stalled delivery. */
    if (getenv("MIDSTREAM_DEBUG") && el / 1000 != (mono_ms() - t0 + 2) / 1000) {
      cm_stats st;
      cm_stats_get(g_engine, &st);
      fake_stats fs;
      fake_get_stats(&fs);
      fprintf(stderr, "  [%s %" PRIu64 " ms] got %" PRIu64 " queue %" PRIu64 " decoded %" PRIu64
              " delivered %" PRIu64 " outstanding %" PRIu64 " fake written %" PRIu64
              " dropped %" PRIu64 " drains %" PRIu64 "\n",
              o->label, el, obs_count(o, kind) - base, st.decode_queue_depth, st.records_decoded,
              st.records_delivered, st.buffers_outstanding, fs.records_written,
              fs.records_dropped, st.drains);
    }
    usleep(2000);
  }
  printf("phase of %s: %" PRIu64 " ms\n", o->label, mono_ms() - t0);
}

/* The projection hash of a generated record onto the fields `sel` selects of `kind`. */
static uint64_t project(const unsigned char *rec, size_t size, int kind, const cm_selection *sel,
                        const cm_field_info *fi, int nf) {
  uint64_t h = (uint64_t)kind;
  for (int f = 0; f < nf; f++)
    if (cm_selection_has(sel, kind, f)) h = row_step(h, f, record_value(rec, size, &fi[f]));
  return h;
}

/* A per-thread run check: `present[i]` for ordinals i = 0..n-1 must be one contiguous run.
 * Returns the run as [*first, *last] (first > last when empty). */
static void one_run(const char *what, uint32_t t, const uint8_t *present, size_t n, long *first,
                    long *last) {
  *first = -1;
  *last = -2;
  for (size_t i = 0; i < n; i++) {
    if (!present[i]) continue;
    if (*first < 0) *first = (long)i;
    else if (*last != (long)i - 1)
      CMT_FAIL("%s, producer %u: a gap before ordinal %zu (previous present %ld)", what, t, i,
               *last);
    *last = (long)i;
  }
  if (*first < 0) *last = -2;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep the progress lines when an assertion aborts */
  int kernel = cm_kind_by_name("kernel"), memcpy_k = cm_kind_by_name("memcpy");
  CMT_GT(kernel, 0);
  CMT_GT(memcpy_k, 0);
  int kinds[2] = {kernel, memcpy_k};
  g_kinds[0] = kernel;
  g_kinds[1] = memcpy_k;

  cm_config cfg;
  cm_config_init(&cfg);
  cfg.deliver_ms = 10; /* deliveries on the worker race the selection changes, on purpose */
  cfg.fence_timeout_ms = 30000;
  CMT_OK(cm_engine_new(&g_engine, &cfg));

  static obs a, b, c;
  observe(&c, "C", "kernel");
  fake_stats fs0;
  fake_get_stats(&fs0);
  prod prods[NPROD];
  for (uint32_t t = 0; t < NPROD; t++) {
    prods[t] = (prod){.t = t};
    CMT_EQ(pthread_create(&prods[t].tid, NULL, prod_main, &prods[t]), 0);
  }
  run_phase(&c, kernel, PHASE_RECORDS);
  observe(&a, "A", "kernel:name,start");
  run_phase(&a, kernel, PHASE_RECORDS);
  observe(&b, "B", "memcpy;kernel:name,stop,grid_x");
  run_phase(&b, kernel, PHASE_RECORDS);
  unobserve(&a);
  run_phase(&b, memcpy_k, PHASE_RECORDS);
  atomic_store(&g_stop, 1);
  int64_t written = 0;
  uint64_t disabled = 0;
  for (uint32_t t = 0; t < NPROD; t++) {
    CMT_EQ(pthread_join(prods[t].tid, NULL), 0);
    written += (int64_t)prods[t].written;
    disabled += prods[t].disabled;
  }
  CMT_GT(written, 0);
  CMT_OK(cm_flush(g_engine, CM_FLUSH_SYNC, 30000));

  fake_stats fs1;
  fake_get_stats(&fs1);
  cm_stats st;
  CMT_OK(cm_stats_get(g_engine, &st));
  CMT_EQU(fs1.records_dropped - fs0.records_dropped, 0);
  CMT_EQU(st.records_dropped, 0);
  printf("producers wrote %" PRId64 " records; C kernel %" PRIu64 ", A kernel %" PRIu64
         ", B kernel %" PRIu64 ", B memcpy %" PRIu64 "\n",
         written, c.count[kernel], a.count[kernel], b.count[kernel], b.count[memcpy_k]);
  CMT_EQU((uint64_t)written, c.count[kernel] + b.count[memcpy_k]);
  CMT_EQU(a.count[memcpy_k] + c.count[memcpy_k], 0);

  /* Field tables of the two kinds. */
  int nfk = cm_field_count(kernel), nfm = cm_field_count(memcpy_k);
  cm_field_info *fik = calloc((size_t)nfk, sizeof *fik), *fim = calloc((size_t)nfm, sizeof *fim);
  CMT_ASSERT(fik && fim);
  for (int f = 0; f < nfk; f++) CMT_OK(cm_field_info_get(kernel, f, &fik[f]));
  for (int f = 0; f < nfm; f++) CMT_OK(cm_field_info_get(memcpy_k, f, &fim[f]));

  /* Walk each producer's sequence, taking every generated record out of the delivered sets. */
  union {
    uint64_t align;
    unsigned char b[1024];
  } rec;
  hset seen_a = {0}, seen_b = {0}; /* projections of generated kernel records, for ambiguity */
  bool ambiguous_a = false, ambiguous_b = false;
  uint64_t total_walked = 0;
  for (uint32_t t = 0; t < NPROD; t++) {
    size_t cap = 1 << 16, nk = 0, nm = 0;
    uint8_t *in_a = calloc(cap, 1), *in_b = calloc(cap, 1), *in_bm = calloc(cap, 1);
    CMT_ASSERT(in_a && in_b && in_bm);
    uint64_t j = 0;
    for (; j < prods[t].used; j++) {
      int kind = kinds[j % 2];
      size_t size = fake_gen_record(kind, t, j, rec.b);
      CMT_GT(size, 0);
      if (nk >= cap || nm >= cap) {
        in_a = realloc(in_a, cap * 2);
        in_b = realloc(in_b, cap * 2);
        in_bm = realloc(in_bm, cap * 2);
        CMT_ASSERT(in_a && in_b && in_bm);
        memset(in_a + cap, 0, cap);
        memset(in_b + cap, 0, cap);
        memset(in_bm + cap, 0, cap);
        cap *= 2;
      }
      if (kind == kernel) {
        uint64_t full = project(rec.b, size, kernel, c.sel, fik, nfk);
        /* C saw every kernel record from the start (kernels are never disabled). */
        if (!hset_take(&c.rows[kernel], full))
          CMT_FAIL("C: kernel record %" PRIu64 " of producer %u (of %" PRIu64 ") not delivered",
                   j, t, prods[t].used);
        uint64_t pa = project(rec.b, size, kernel, a.sel, fik, nfk);
        uint64_t pb = project(rec.b, size, kernel, b.sel, fik, nfk);
        if (hset_find(&seen_a, pa, false)) ambiguous_a = true;
        if (hset_find(&seen_b, pb, false)) ambiguous_b = true;
        hset_add(&seen_a, pa);
        hset_add(&seen_b, pb);
        in_a[nk] = hset_take(&a.rows[kernel], pa);
        in_b[nk] = hset_take(&b.rows[kernel], pb);
        nk++;
      } else {
        in_bm[nm] = hset_take(&b.rows[memcpy_k], project(rec.b, size, memcpy_k, b.sel, fim, nfm));
        nm++;
      }
    }
    total_walked += j;
    long fa, la, fb, lb, fm, lm;
    printf("producer %u: %zu kernel records, %zu memcpy seqs walked; its last record was a %s\n",
           t, nk, nm, j && kinds[(j - 1) % 2] == kernel ? "kernel" : "memcpy");
    CMT_GT(nk, 0);
    one_run("B memcpy", t, in_bm, nm, &fm, &lm);
    CMT_GE(fm, 0);
    /* memcpy stays enabled to the end, so the run reaches the thread's last memcpy record. */
    CMT_EQ(lm, (long)nm - 1);
    if (!ambiguous_a) one_run("A kernel", t, in_a, nk, &fa, &la);
    if (!ambiguous_b) {
      one_run("B kernel", t, in_b, nk, &fb, &lb);
      CMT_EQ(lb, (long)nk - 1);
      if (!ambiguous_a) {
        CMT_GE(fa, 0);
        CMT_LE(fb, la + 1);
        printf("  A kernel ordinals [%ld, %ld], B kernel [%ld, %ld], B memcpy [%ld, %ld]\n", fa,
               la, fb, lb, fm, lm);
      }
    }
    free(in_a);
    free(in_b);
    free(in_bm);
  }
  if (ambiguous_a || ambiguous_b)
    printf("note: A's or B's kernel projection does not identify records uniquely; only their "
           "multisets were checked\n");
  /* Nothing delivered is left unexplained, and nothing was delivered twice. */
  CMT_EQU(c.rows[kernel].total, 0);
  CMT_EQU(b.rows[memcpy_k].total, 0);
  CMT_EQU(a.rows[kernel].total, 0);
  CMT_EQU(b.rows[kernel].total, 0);
  /* Every sequence number was either written or skipped because memcpy was not yet enabled. */
  CMT_EQU(total_walked, (uint64_t)written + disabled);

  unobserve(&b);
  unobserve(&c);
  CMT_EQU(cm_enabled_kinds(g_engine), 0);

  /* Unpaced producers: the delivery cadence must keep delivering while the decoder is busy.
   * Four producers on two cores outrun a decoder that copies every kernel field, so the decode
   * queue does not run empty. The measures are the backlog of records decoded but not yet
   * delivered, sampled through the window, and the longest time without a batch: with a working
   * cadence the backlog stays within what is decoded between two deliveries, while a cadence
   * that waits for an empty queue lets it grow with everything decoded. The window is short
   * enough that the backlog of undecoded buffers stays below the pool's bound: at the bound,
   * drops would empty the queue now and then and hide a starved cadence. A decoder that keeps up
   * on a quiet machine lets this check pass without proving much; it cannot fail a correct
   * engine. All records written are delivered (a drop is not a written record). */
  static obs d;
  d.light = true;
  observe(&d, "D", "kernel"); /* every field: the decoder has real work per record */
  union {
    uint64_t align;
    unsigned char b[1024];
  } probe;
  size_t rec_size = fake_gen_record(kernel, 0, 0, probe.b);
  CMT_GT(rec_size, 0);
  uint64_t per_buffer = cfg.buffer_size / rec_size;
  cm_stats s0;
  CMT_OK(cm_stats_get(g_engine, &s0));
  pthread_mutex_lock(&g_mu);
  d.last_ms = mono_ms();
  pthread_mutex_unlock(&g_mu);
  CMT_EQ(fake_start_producers(2 * NPROD, kinds, 1), 0);
  int64_t max_held = 0;
  for (uint64_t t0 = mono_ms(); mono_ms() - t0 < 1000;) {
    usleep(20 * 1000);
    cm_stats sn;
    CMT_OK(cm_stats_get(g_engine, &sn));
    /* Decoded first, then delivered: delivery never runs ahead of decoding, so this order can
     * only underestimate the backlog. */
    int64_t held = (int64_t)(sn.records_by_kind[kernel] - s0.records_by_kind[kernel]) -
                   (int64_t)obs_count(&d, kernel);
    if (held > max_held) max_held = held;
  }
  pthread_mutex_lock(&g_mu);
  uint64_t gap_end = mono_ms() - d.last_ms;
  uint64_t max_gap = d.max_gap_ms > gap_end ? d.max_gap_ms : gap_end;
  uint64_t during = d.count[kernel], nbatches = d.batches;
  pthread_mutex_unlock(&g_mu);
  int64_t w2 = fake_stop_producers();
  /* A plain flush first returns the backlog's buffers to the pool: a sync fence started with the
   * pool at its bound loses its own SYNCHRONIZATION record (test_engine_errors covers that). */
  CMT_OK(cm_flush(g_engine, CM_FLUSH_PLAIN, 60000));
  CMT_OK(cm_flush(g_engine, CM_FLUSH_SYNC, 60000));
  cm_stats st2;
  CMT_OK(cm_stats_get(g_engine, &st2));
  printf("unpaced producers: wrote %" PRId64 " kernel records in 1 s; %" PRIu64 " delivered "
         "while they ran in %" PRIu64 " batches, longest time without a batch %" PRIu64 " ms "
         "(deliver_ms %u); largest decoded-but-undelivered backlog %" PRId64 " records (%" PRIu64
         " per buffer); delivered in all %" PRIu64 ", dropped %" PRIu64 ", decode queue peak %"
         PRIu64 "\n",
         w2, during, nbatches, max_gap, cfg.deliver_ms, max_held, per_buffer,
         obs_count(&d, kernel), st2.records_dropped, st2.decode_queue_peak);
  CMT_EQU(obs_count(&d, kernel), (uint64_t)w2);
  /* Either measure alone misleads: a fast decoder legitimately holds several buffers' worth
   * when the worker is preempted for 100 ms, and a slow (sanitized) one legitimately goes a
   * second without a batch while it decodes one buffer. A starved cadence shows both at once:
   * an engine whose cadence waited for an empty queue held 45 buffers' worth and delivered
   * nothing for seconds. */
  if (max_held > (int64_t)(4 * per_buffer) && max_gap > 50u * cfg.deliver_ms)
    CMT_FAIL("deliver_ms = %u, but while producers kept the decoder busy %" PRId64
             " decoded records (%.1f buffers) waited for delivery, and no batch came for %" PRIu64
             " ms", cfg.deliver_ms, max_held, (double)max_held / (double)per_buffer, max_gap);
  unobserve(&d);
  cm_selection_free(d.sel);
  for (int k = 0; k < CM_KIND_MAX; k++) free(d.rows[k].s);
  cm_engine_free(g_engine);
  for (int k = 0; k < CM_KIND_MAX; k++) {
    free(a.rows[k].s);
    free(b.rows[k].s);
    free(c.rows[k].s);
  }
  free(seen_a.s);
  free(seen_b.s);
  cm_selection_free(a.sel);
  cm_selection_free(b.sel);
  cm_selection_free(c.sel);
  free(fik);
  free(fim);
  printf("ok\n");
  return 0;
}
