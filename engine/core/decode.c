/*
 * decode.c: completed CUPTI buffers to per-kind columns.
 *
 * Design. The decoder is table-driven. For each kind it keeps the selected fields' (offset,
 * source width, column width) triples, in ascending field id. Records are walked with
 * cuptiActivityGetNextRecord, as CUPTI requires, but they are not copied field by field as they
 * are met: the decoder collects pointers to the records of each kind into a short run and, when a
 * run is full or the buffer ends, copies one field at a time over the whole run. The inner loops
 * are then strided loads of one width into a contiguous column, with no per-field branch, which is
 * what keeps the decode near memcpy speed on wide records such as kernels (216 bytes).
 *
 * String fields hold pointers to CUPTI-owned names. They are interned by content (intern.c), with
 * a pointer-keyed cache in front so that the common case costs one probe rather than a hash of a
 * long mangled name.
 *
 * SYNCHRONIZATION records are always inspected, selected or not: the fence waits for the newest
 * sync end time to pass its mark.
 *
 * Thread rules: a decoder is used by one thread at a time and takes no locks. The engine holds its
 * decode mutex around every call.
 */
#include <stdlib.h>
#include <string.h>

#include "cm_internal.h"

/* A run of 64 kernel records (about 14 KB) stays in L1 while its fields are gathered. */
#define RUN_MAX 64

typedef struct kstate {
  const cm__kind_desc *desc;
  int nsel;
  int16_t ids[CM__MAX_FIELDS];
  uint16_t off[CM__MAX_FIELDS];
  uint8_t srcw[CM__MAX_FIELDS];
  uint8_t isstr[CM__MAX_FIELDS];
  uint8_t *cols[CM__MAX_FIELDS]; /* indexed by field id; NULL when not selected */
  uint32_t n;                    /* records held */
  uint32_t cap;                  /* capacity of every selected column, in records */
  uint32_t nrun;
  bool in_pending;
  const uint8_t *run[RUN_MAX];
  uint64_t seen;
  _Atomic uint64_t seen_pub; /* `seen` as other threads may read it, published per buffer */
} kstate;

struct cm__decoder {
  const cm__cupti *c;
  cm__intern *strings;
  uint64_t sync_end;
  uint64_t unknown;
  uint64_t lost; /* records dropped because their columns could not grow */
  _Atomic uint64_t lost_pub;
  /* Kinds whose records no observer receives any more and that CUPTI no longer produces: a record
   * of one of them that still arrives was written while it was traced, reached nobody, and is
   * counted in `late` (cm__decoder_watch_late). */
  uint64_t late_mask;
  uint64_t late;
  _Atomic uint64_t late_pub;
  int16_t ts_off[CM_KIND_MAX]; /* offset of each kind's end (else start) timestamp, or -1 */
  /* While a sync fence runs (cm__decoder_watch_before): its mark, and the records decoded since
   * then whose timestamp is before it (and within the hour before it, so that a clock other than
   * CUPTI's realtime one, as a test double's fixed dates, counts nothing). 0: not watching. */
  uint64_t before_mark;
  uint64_t before_count;
  /* Of the last buffer: the oldest of its kinds' newest timestamps (each kind's last record's
   * end, else start), or 0. Records of different kinds share a buffer, and CUPTI can be seconds
   * behind on one kind (kernels, whose timestamps come from the device) while the API records
   * beside them are fresh, so the lag is that of the kind most behind, not of the buffer's last
   * record. */
  uint64_t last_ts;
  int npending;
  int pending[CM_KIND_MAX]; /* kinds with a non-empty run */
  kstate k[CM_KIND_MAX];
};

int cm__decoder_new(cm__decoder **out, const cm__cupti *c, cm__intern *strings) {
  cm__decoder *d = calloc(1, sizeof *d);
  if (!d) return cm__seterr(CM_ENOMEM, "cannot allocate the decoder");
  d->c = c;
  d->strings = strings;
  for (int k = 0; k < CM_KIND_MAX; k++) {
    const cm__kind_desc *kd = d->k[k].desc = cm__kind_desc_get(k);
    int f = !kd ? -1 : kd->end_field >= 0 ? kd->end_field : kd->start_field;
    d->ts_off[k] = f >= 0 && kd->fields[f].src_width == 8 ? (int16_t)kd->fields[f].offset : -1;
  }
  *out = d;
  return 0;
}

void cm__decoder_free(cm__decoder *d) {
  if (!d) return;
  for (int k = 0; k < CM_KIND_MAX; k++)
    for (int f = 0; f < CM__MAX_FIELDS; f++) free(d->k[k].cols[f]);
  free(d);
}

void cm__decoder_select(cm__decoder *d, const cm__bits *sel) {
  for (int k = 0; k < CM_KIND_MAX; k++) {
    kstate *ks = &d->k[k];
    ks->nsel = 0;
    if (!ks->desc) continue;
    for (int f = 0; f < ks->desc->nfields; f++) {
      if (!cm__bits_has(&sel[k], f)) {
        free(ks->cols[f]);
        ks->cols[f] = NULL;
        continue;
      }
      const cm__field *fd = &ks->desc->fields[f];
      int i = ks->nsel++;
      ks->ids[i] = (int16_t)f;
      ks->off[i] = fd->offset;
      ks->srcw[i] = fd->src_width;
      ks->isstr[i] = fd->type == CM_TYPE_STR;
      if (!ks->cols[f] && ks->cap) ks->cols[f] = malloc((size_t)ks->cap * fd->width);
    }
    if (ks->nsel == 0) ks->cap = 0;
  }
}

/* Grows every selected column of `ks` to hold `need` records. On allocation failure the run is
 * dropped by the caller, which counts it. */
static bool reserve(kstate *ks, uint32_t need) {
  if (need <= ks->cap && ks->cap) {
    for (int i = 0; i < ks->nsel; i++)
      if (!ks->cols[ks->ids[i]]) goto grow;
    return true;
  }
grow:;
  uint32_t cap = ks->cap ? ks->cap : 1024;
  while (cap < need) {
    /* A kind holding 2^31 records between drains cannot grow further: the run is counted lost. */
    if (cap > UINT32_MAX / 2) return false;
    cap *= 2;
  }
  for (int i = 0; i < ks->nsel; i++) {
    int f = ks->ids[i];
    size_t w = ks->desc->fields[f].width;
    uint8_t *p = realloc(ks->cols[f], (size_t)cap * w);
    if (!p) return false;
    ks->cols[f] = p;
  }
  ks->cap = cap;
  return true;
}

static void flush_run(cm__decoder *d, kstate *ks) {
  uint32_t m = ks->nrun;
  ks->nrun = 0;
  if (!m) return;
  if (ks->n > UINT32_MAX - m || !reserve(ks, ks->n + m)) {
    /* Out of memory for the columns: the run is lost, and counted so stats report it. */
    d->lost += m;
    return;
  }
  const uint8_t *const *run = ks->run;
  for (int i = 0; i < ks->nsel; i++) {
    size_t off = ks->off[i];
    uint8_t *col = ks->cols[ks->ids[i]];
    if (ks->isstr[i]) {
      uint32_t *dst = (uint32_t *)col + ks->n;
      for (uint32_t j = 0; j < m; j++) {
        const char *s;
        memcpy(&s, run[j] + off, sizeof s);
        dst[j] = cm__intern_ptr(d->strings, s);
      }
      continue;
    }
    switch (ks->srcw[i]) {
    case 8: {
      uint64_t *dst = (uint64_t *)col + ks->n;
      for (uint32_t j = 0; j < m; j++) memcpy(&dst[j], run[j] + off, 8);
      break;
    }
    case 4: {
      uint32_t *dst = (uint32_t *)col + ks->n;
      for (uint32_t j = 0; j < m; j++) memcpy(&dst[j], run[j] + off, 4);
      break;
    }
    case 2: {
      uint16_t *dst = (uint16_t *)col + ks->n;
      for (uint32_t j = 0; j < m; j++) memcpy(&dst[j], run[j] + off, 2);
      break;
    }
    default: {
      uint8_t *dst = col + ks->n;
      for (uint32_t j = 0; j < m; j++) dst[j] = run[j][off];
      break;
    }
    }
  }
  ks->n += m;
}

/* Makes the counters readable from other threads (cm_stats_get) without the decoder's lock: one
 * relaxed store per kind per buffer, instead of an atomic operation per record. */
static void publish_counts(cm__decoder *d) {
  for (int k = 0; k < CM_KIND_MAX; k++)
    atomic_store_explicit(&d->k[k].seen_pub, d->k[k].seen, memory_order_relaxed);
  atomic_store_explicit(&d->lost_pub, d->lost, memory_order_relaxed);
  atomic_store_explicit(&d->late_pub, d->late, memory_order_relaxed);
}

uint64_t cm__decoder_decode(cm__decoder *d, uint8_t *buf, size_t valid) {
  CUpti_Activity *rec = NULL;
  const CUpti_Activity *last_of[CM_KIND_MAX] = {0};
  uint64_t count = 0;
  const size_t sync_end_off = offsetof(CUpti_ActivitySynchronization2, end);
  while (d->c->ActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    count++;
    /* The walk is a dependent chain (where the next record starts depends on this one's kind),
     * which leaves it bound by memory latency: prefetching 1 KiB ahead measured twice as fast on
     * kernel records. */
    const uint8_t *ahead = (const uint8_t *)rec + 1024;
    if (ahead < buf + valid) __builtin_prefetch(ahead, 0, 3);
    unsigned kind = (unsigned)rec->kind;
    if (kind >= CM_KIND_MAX) {
      d->unknown++;
      continue;
    }
    kstate *ks = &d->k[kind];
    ks->seen++;
    last_of[kind] = rec;
    if (d->before_mark && d->ts_off[kind] >= 0) {
      uint64_t ts;
      memcpy(&ts, (const uint8_t *)rec + d->ts_off[kind], sizeof ts);
      d->before_count += ts < d->before_mark && ts + CM__HOUR_NS > d->before_mark;
    }
    if (kind == CUPTI_ACTIVITY_KIND_SYNCHRONIZATION) {
      uint64_t end;
      memcpy(&end, (const uint8_t *)rec + sync_end_off, sizeof end);
      if (end > d->sync_end) d->sync_end = end;
    }
    if (!ks->nsel) {
      d->late += d->late_mask >> kind & 1;
      continue;
    }
    if (!ks->in_pending) {
      ks->in_pending = true;
      d->pending[d->npending++] = (int)kind;
    }
    ks->run[ks->nrun++] = (const uint8_t *)rec;
    if (ks->nrun == RUN_MAX) flush_run(d, ks);
  }
  /* Runs point into this buffer, which goes back to the pool after the call: finish them now. */
  for (int i = 0; i < d->npending; i++) {
    kstate *ks = &d->k[d->pending[i]];
    flush_run(d, ks);
    ks->in_pending = false;
  }
  d->npending = 0;
  publish_counts(d);
  /* The lag is read off each kind's last record in the buffer (records of a kind are appended
   * in the order they are written), so the hot loop above pays one store per record for it. */
  d->last_ts = 0;
  for (int k = 0; k < CM_KIND_MAX; k++) {
    if (!last_of[k] || d->ts_off[k] < 0) continue;
    uint64_t ts;
    memcpy(&ts, (const uint8_t *)last_of[k] + d->ts_off[k], sizeof ts);
    if (ts && (!d->last_ts || ts < d->last_ts)) d->last_ts = ts;
  }
  return count;
}

uint32_t cm__decoder_count(const cm__decoder *d, int kind) {
  if (kind < 0 || kind >= CM_KIND_MAX) return 0;
  return d->k[kind].n;
}

const void *cm__decoder_column(const cm__decoder *d, int kind, int field) {
  if (kind < 0 || kind >= CM_KIND_MAX || field < 0 || field >= CM__MAX_FIELDS) return NULL;
  return d->k[kind].cols[field];
}

void cm__decoder_reset(cm__decoder *d) {
  for (int k = 0; k < CM_KIND_MAX; k++) d->k[k].n = 0;
}

uint64_t cm__decoder_sync_end(const cm__decoder *d) { return d->sync_end; }

uint64_t cm__decoder_lost(const cm__decoder *d) {
  return atomic_load_explicit(&d->lost_pub, memory_order_relaxed);
}

void cm__decoder_watch_late(cm__decoder *d, uint64_t set, uint64_t clear) {
  d->late_mask = (d->late_mask | set) & ~clear;
}

uint64_t cm__decoder_last_ts(const cm__decoder *d) { return d->last_ts; }

void cm__decoder_watch_before(cm__decoder *d, uint64_t mark) {
  d->before_mark = mark;
  d->before_count = 0;
}

uint64_t cm__decoder_before_count(const cm__decoder *d) { return d->before_count; }

uint64_t cm__decoder_late(const cm__decoder *d) {
  return atomic_load_explicit(&d->late_pub, memory_order_relaxed);
}

uint64_t cm__decoder_seen(const cm__decoder *d, int kind) {
  if (kind < 0 || kind >= CM_KIND_MAX) return 0;
  return atomic_load_explicit(&d->k[kind].seen_pub, memory_order_relaxed);
}

/* Synthetic records (the engine's own kinds) take the same run-and-copy path as CUPTI's, so their
 * columns are built by the same code; the records need only outlive this call. */
void cm__decoder_inject(cm__decoder *d, int kind, const uint8_t *recs, size_t n, size_t stride) {
  if (kind < 0 || kind >= CM_KIND_MAX || !d->k[kind].desc) return;
  kstate *ks = &d->k[kind];
  ks->seen += n;
  if (!ks->nsel) return;
  for (size_t i = 0; i < n; i++) {
    ks->run[ks->nrun++] = recs + i * stride;
    if (ks->nrun == RUN_MAX) flush_run(d, ks);
  }
  flush_run(d, ks);
  publish_counts(d);
}
