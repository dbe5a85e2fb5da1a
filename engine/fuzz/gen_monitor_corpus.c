/*
 * gen_monitor_corpus.c: writes the seeds of the monitor's fuzz targets (fuzz_wsrc_frame,
 * fuzz_replay) and the regression inputs for the monitor's input bounds.
 *
 * Design note. Seeds are small and realistic: one process's session (HELLO, SCHEMA with every
 * registry field of two kinds, STRINGS, a BATCH of each kind, STATS, BYE), in the record form
 * of fuzz_monitor.h and as a capture file. The regression inputs are the hostile cases
 * the monitor bounds: a STRINGS id of 2^26 - 1 (which must not cost memory in proportion),
 * counter names and kinds past their caps, a column of an unknown type (which must fail no
 * observer), and for the replay a corrupt frame,
 * junk between frames, a torn frame, a file that is not a capture and one with a header only.
 * The committed files in engine/fuzz/corpus_* and engine/fuzz/regress_{wsrc_frame,replay} were
 * made by this program (target fuzz_monitor_corpus). Usage: gen_monitor_corpus FUZZ_DIR.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuptimon.h"
#include "cuptimon_wire.h"
#include "fuzz_monitor.h"

static const char *root;

static void check_at(int rc, int line) {
  if (rc) {
    fprintf(stderr, "gen_monitor_corpus: the writer at line %d failed with %d\n", line, rc);
    exit(1);
  }
}
#define check(rc) check_at((rc), __LINE__)

static void put(const char *sub, const char *name, uint8_t opt, const void *p, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s/%s", root, sub, name);
  FILE *fp = fopen(path, "wb");
  if (!fp || fputc(opt, fp) == EOF || (n && fwrite(p, 1, n, fp) != n) || fclose(fp)) {
    fprintf(stderr, "gen_monitor_corpus: cannot write %s\n", path);
    exit(1);
  }
}

/* Records: the frames of `frames` (as written by the writers) in the record form. */
static void to_records(cm_wire_buf *out, const cm_wire_buf *frames) {
  for (size_t at = 0; at + 24 <= frames->len;) {
    const uint8_t *h = frames->data + at;
    uint32_t type = (uint32_t)h[4] | ((uint32_t)h[5] << 8);
    uint64_t len = 0;
    memcpy(&len, h + 8, 8);
    unsigned t = 0;
    while (t < FUZZ_NTYPES && fuzz_types[t] != type) t++;
    if (t == FUZZ_NTYPES || len > 0xFFFF) {
      fprintf(stderr, "gen_monitor_corpus: frame type %u (%llu bytes) has no record form\n", type,
              (unsigned long long)len);
      exit(1);
    }
    uint8_t head[3] = {(uint8_t)t, (uint8_t)len, (uint8_t)(len >> 8)};
    size_t need = out->len + 3 + len;
    if (need > out->cap) {
      out->data = realloc(out->data, need * 2);
      if (!out->data) exit(1);
      out->cap = need * 2;
    }
    memcpy(out->data + out->len, head, 3);
    memcpy(out->data + out->len + 3, h + 24, len);
    out->len += 3 + len;
    at += 24 + len;
  }
}

static void raw_record(cm_wire_buf *out, const char *junk) {
  size_t n = strlen(junk);
  out->data = realloc(out->data, out->len + 3 + n + 1);
  if (!out->data) exit(1);
  out->data[out->len] = FUZZ_RAW;
  out->data[out->len + 1] = (uint8_t)n;
  out->data[out->len + 2] = 0;
  memcpy(out->data + out->len + 3, junk, n);
  out->len += 3 + n;
  out->cap = out->len + 1;
}

static void hello(cm_wire_buf *b, uint32_t pid) {
  static const char *const argv[] = {"app", "--train"};
  static const cm_wire_device dev = {0, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, "GPU"};
  static const char *const env[] = {"RANK=0", "WORLD_SIZE=2"};
  cm_wire_hello h = {pid, 1, 130000, 0, 1700000000000000000ull, 1, "", "host", "/bin/app", 2, 1, argv, &dev,
                     2, env};
  check(cm_wire_write_hello(b, &h));
}

static const int kinds[] = {CM_KIND_CONCURRENT_KERNEL, CM_KIND_MEMCPY};
enum { NK = 2, NREC = 4 };

static void schema(cm_wire_buf *b) {
  static cm_wire_field wf[NK][CM_WIRE_MAX_COLS];
  cm_wire_kind wk[NK];
  for (int k = 0; k < NK; k++) {
    int nf = cm_field_count(kinds[k]);
    for (int f = 0; f < nf; f++) {
      cm_field_info fi;
      check(cm_field_info_get(kinds[k], f, &fi));
      wf[k][f] = (cm_wire_field){(uint32_t)f, (uint32_t)fi.type, fi.width, 0, fi.name};
    }
    wk[k] = (cm_wire_kind){(uint32_t)kinds[k], (uint32_t)nf, cm_kind_name(kinds[k]), wf[k]};
  }
  check(cm_wire_write_schema(b, &(cm_wire_schema){NK, 0, wk}));
}

/* A batch of `kind` with every registry field; string columns take `str_type`. */
static void batch(cm_wire_buf *b, int kind, uint64_t seq, int str_type) {
  static uint64_t data[CM_WIRE_MAX_COLS][NREC];
  cm_column cols[CM_WIRE_MAX_COLS];
  int nf = cm_field_count(kind);
  for (int f = 0; f < nf; f++) {
    cm_field_info fi;
    check(cm_field_info_get(kind, f, &fi));
    for (int r = 0; r < NREC; r++) {
      uint64_t v = fi.type == CM_TYPE_STR ? (uint64_t)(1 + r % 3) : 1700000000000000000ull + seq * 1000 + (uint64_t)r;
      memcpy((uint8_t *)data[f] + (size_t)r * fi.width, &v, fi.width);
    }
    cols[f] = (cm_column){f, fi.type == CM_TYPE_STR ? str_type : fi.type, fi.width, 0, fi.name, data[f]};
  }
  check(cm_wire_write_batch(b, &(cm_batch){kind, NREC, (uint32_t)nf, 0, cols, seq}));
}

static void strings(cm_wire_buf *b) {
  static const cm_wire_string s[] = {{1, 7, "kernelA"}, {2, 7, "kernelB"}, {3, 11, "_Z7kernelCv"}};
  check(cm_wire_write_strings(b, s, 3));
}

/* One process's session; with `unknown`, string columns have type 42. */
static void session(cm_wire_buf *b, uint32_t pid, int unknown) {
  hello(b, pid);
  schema(b);
  strings(b);
  batch(b, kinds[0], 1, unknown ? 42 : CM_TYPE_STR);
  batch(b, kinds[1], 2, CM_TYPE_STR);
  static const cm_wire_kv st[] = {{"records_decoded", 8}, {"records_dropped", 0}};
  check(cm_wire_write_stats(b, st, 2));
  check(cm_wire_write_bye(b, 0, 0, ""));
}

static void over_caps(cm_wire_buf *strs, cm_wire_buf *stats, cm_wire_buf *kindsb) {
  static const cm_wire_string sparse[] = {{(1u << 26) - 1, 3, "big"}, {UINT32_MAX, 3, "max"}, {0, 1, "z"}};
  check(cm_wire_write_strings(strs, sparse, 3));
  enum { N = 1100 };
  static char names[N][12];
  static cm_wire_kv kv[N];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "c%d", i);
    kv[i] = (cm_wire_kv){names[i], (uint64_t)i};
  }
  check(cm_wire_write_stats(stats, kv, N));
  static cm_wire_kind wk[N];
  for (int i = 0; i < N; i++) wk[i] = (cm_wire_kind){(uint32_t)(1000 + i * 7919), 0, "k", NULL};
  /* Two frames (a frame holds at most 1024 kinds), 1100 distinct kinds in all. */
  check(cm_wire_write_schema(kindsb, &(cm_wire_schema){N / 2, 0, wk}));
  check(cm_wire_write_schema(kindsb, &(cm_wire_schema){N - N / 2, 0, wk + N / 2}));
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen_monitor_corpus FUZZ_DIR\n");
    return 2;
  }
  root = argv[1];
  cm_wire_buf fr, rec;
  cm_wire_buf_init(&fr);
  cm_wire_buf_init(&rec);

  /* fuzz_wsrc_frame: option byte, then records. */
  session(&fr, 100, 0);
  to_records(&rec, &fr);
  put("corpus_wsrc_frame", "session_agent", 7 << 2, rec.data, rec.len);
  put("corpus_wsrc_frame", "session_replay_attached", 1 | 2 | 7 << 2, rec.data, rec.len);
  cm_wire_buf_clear(&fr);
  cm_wire_buf_clear(&rec);
  cm_wire_buf strs, stats, kb;
  cm_wire_buf_init(&strs);
  cm_wire_buf_init(&stats);
  cm_wire_buf_init(&kb);
  over_caps(&strs, &stats, &kb);
  to_records(&rec, &strs);
  put("regress_wsrc_frame", "strings_sparse_ids", 2 | 7 << 2, rec.data, rec.len);
  cm_wire_buf_clear(&rec);
  to_records(&rec, &stats);
  put("regress_wsrc_frame", "stats_over_cap", 2, rec.data, rec.len);
  cm_wire_buf_clear(&rec);
  to_records(&rec, &kb);
  put("regress_wsrc_frame", "schema_over_cap", 2, rec.data, rec.len);
  cm_wire_buf_clear(&rec);
  session(&fr, 101, 1);
  to_records(&rec, &fr);
  put("regress_wsrc_frame", "batch_unknown_type", 2 | 7 << 2, rec.data, rec.len);
  cm_wire_buf_clear(&fr);
  cm_wire_buf_clear(&rec);

  /* fuzz_replay: option byte, then a capture (bit 4 clear) or records (bit 4 set). */
  check(cm_wire_write_file_header(&fr, 0));
  size_t first = fr.len;
  session(&fr, 200, 0);
  size_t second = fr.len;
  session(&fr, 201, 0);
  put("corpus_replay", "capture", 7 << 1, fr.data, fr.len);
  put("corpus_replay", "capture_twice", 1 | 7 << 1, fr.data, fr.len);
  {
    cm_wire_buf body = {fr.data + first, second - first, second - first};
    to_records(&rec, &body);
    raw_record(&rec, "CMjunkCM\x01");
    to_records(&rec, &body);
    put("corpus_replay", "records_with_junk", 16 | 7 << 1, rec.data, rec.len);
    cm_wire_buf_clear(&rec);
  }
  /* Regressions: a corrupt byte in the first batch, junk between the processes, a torn frame. */
  uint8_t *copy = malloc(fr.len + 64);
  memcpy(copy, fr.data, fr.len);
  copy[first + 700] ^= 0x5a;
  put("regress_replay", "capture_corrupt", 7 << 1, copy, fr.len);
  memcpy(copy, fr.data, second);
  memcpy(copy + second, "CM\x01\x00 junk", 9);
  memcpy(copy + second + 9, fr.data + second, fr.len - second);
  put("regress_replay", "capture_junk", 1 | 7 << 1, copy, fr.len + 9);
  memcpy(copy, fr.data, second - 13);
  memcpy(copy + second - 13, fr.data + second, fr.len - second);
  put("regress_replay", "capture_torn", 7 << 1, copy, fr.len - 13);
  put("regress_replay", "capture_truncated", 7 << 1, fr.data, fr.len - 100);
  free(copy);
  put("regress_replay", "header_only", 7 << 1, fr.data, first);
  put("regress_replay", "not_a_capture", 7 << 1, "not a capture at all, just text\n", 32);
  /* The hostile frames of fuzz_wsrc_frame's regressions, after a HELLO, in a capture. */
  {
    cm_wire_buf all;
    cm_wire_buf_init(&all);
    check(cm_wire_write_file_header(&all, 0));
    hello(&all, 300);
    cm_wire_buf_clear(&strs);
    cm_wire_buf_clear(&stats);
    cm_wire_buf_clear(&kb);
    over_caps(&strs, &stats, &kb);
    size_t n0 = all.len;
    all.data = realloc(all.data, all.len + strs.len + stats.len + kb.len);
    memcpy(all.data + n0, strs.data, strs.len);
    memcpy(all.data + n0 + strs.len, stats.data, stats.len);
    memcpy(all.data + n0 + strs.len + stats.len, kb.data, kb.len);
    all.len = n0 + strs.len + stats.len + kb.len;
    all.cap = all.len;
    check(cm_wire_write_bye(&all, 0, 0, ""));
    put("regress_replay", "capture_over_caps", 7 << 1, all.data, all.len);
    cm_wire_buf_free(&all);
  }
  cm_wire_buf_clear(&fr);
  check(cm_wire_write_file_header(&fr, 0));
  session(&fr, 400, 1);
  put("regress_replay", "capture_unknown_type", 7 << 1, fr.data, fr.len);
  cm_wire_buf_free(&fr);
  cm_wire_buf_free(&rec);
  cm_wire_buf_free(&strs);
  cm_wire_buf_free(&stats);
  cm_wire_buf_free(&kb);
  return 0;
}
