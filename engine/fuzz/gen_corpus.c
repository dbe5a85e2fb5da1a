/*
 * gen_corpus.c: writes the seed corpus of fuzz_wire_reader into a directory.
 *
 * Design note. The seeds are small, valid examples of each input mode of the fuzz target (see
 * fuzz_wire_reader.c): a frame stream with one frame of every type, the same as a capture, each
 * frame's payload on its own, and the record form that the target turns into checksummed frames.
 * The committed files in engine/fuzz/corpus were made by this program; run it again (the
 * fuzz_wire_corpus target) after a format change. Usage: gen_corpus DIR.
 */
#include "cuptimon_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dir;

static void put(const char *name, uint8_t mode, uint8_t arg, const void *p, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *fp = fopen(path, "wb");
  if (!fp || fputc(mode, fp) == EOF || fputc(arg, fp) == EOF || fwrite(p, 1, n, fp) != n || fclose(fp)) {
    fprintf(stderr, "gen_corpus: cannot write %s\n", path);
    exit(1);
  }
}

static void check(int rc) {
  if (rc) {
    fprintf(stderr, "gen_corpus: writer failed with %d\n", rc);
    exit(1);
  }
}

/* The fuzz target's type table order, for modes 2 and 3. */
static const uint32_t types[] = {CM_WIRE_HELLO,     CM_WIRE_SCHEMA,    CM_WIRE_STRINGS,
                                 CM_WIRE_BATCH,     CM_WIRE_STATS,     CM_WIRE_FLUSH_DONE,
                                 CM_WIRE_BYE,       CM_WIRE_HELLO_ACK, CM_WIRE_SELECT,
                                 CM_WIRE_CONFIGURE, CM_WIRE_FLUSH,     200 /* unknown */,
                                 CM_WIRE_PM,        CM_WIRE_PM_STATUS};

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen_corpus DIR\n");
    return 2;
  }
  dir = argv[1];
  static const char *const args[] = {"app", "--x"};
  static const cm_wire_device devs[] = {{0, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, "GPU"}};
  cm_wire_hello h = {100, 1, 130000, 0, 1700000000000000000ull, 1700000000000000001ull, "tok", "host",
                     "/bin/app", 2, 1, args, devs};
  static const cm_wire_field fields[] = {{0, CM_TYPE_U64, 8, 0, "start"}, {2, CM_TYPE_STR, 4, 0, "name"},
                                         {3, CM_TYPE_U8, 1, 0, "b"}};
  static const cm_wire_kind kinds[] = {{CM_KIND_CONCURRENT_KERNEL, 3, "concurrent_kernel", fields}};
  cm_wire_schema s = {1, 0, kinds};
  static const cm_wire_string strs[] = {{1, 3, "k_a"}, {2, 0, ""}};
  static const uint64_t start[3] = {5, 6, 7};
  static const uint32_t name[3] = {1, 2, 1};
  static const uint8_t bb[3] = {1, 0, 1};
  cm_column cols[3] = {{0, CM_TYPE_U64, 8, 0, "start", start}, {2, CM_TYPE_STR, 4, 0, "name", name},
                       {3, CM_TYPE_U8, 1, 0, "b", bb}};
  cm_batch batch = {CM_KIND_CONCURRENT_KERNEL, 3, 3, 0, cols, 1};
  static const cm_wire_kv kv[] = {{"records_dropped", 3}, {"flush_ms", 200}};

  cm_wire_buf b;
  cm_wire_buf_init(&b);
  size_t starts[20], n = 0;
#define FRAME(call) (starts[n++] = b.len, check(call))
  FRAME(cm_wire_write_hello(&b, &h));
  FRAME(cm_wire_write_schema(&b, &s));
  FRAME(cm_wire_write_strings(&b, strs, 2));
  FRAME(cm_wire_write_batch(&b, &batch));
  FRAME(cm_wire_write_stats(&b, kv, 2));
  FRAME(cm_wire_write_flush_done(&b, 9, 0));
  FRAME(cm_wire_write_bye(&b, CM_WIRE_BYE_EXIT, 0, "done"));
  FRAME(cm_wire_write_hello_ack(&b, 0, "ok"));
  FRAME(cm_wire_write_select(&b, "kernel:name,start"));
  FRAME(cm_wire_write_configure(&b, kv, 2));
  FRAME(cm_wire_write_flush(&b, 9, CM_WIRE_FLUSH_SYNC, 100));
  FRAME(cm_wire_write_frame(&b, 200, 0, CM_WIRE_MINOR + 1, "future", 6)); /* the unknown slot */
  FRAME(cm_wire_write_pm(&b, "0:1000:sm__cycles_active.avg,dram__throughput.avg.pct_of_peak_sustained_elapsed"));
  FRAME(cm_wire_write_pm_status(&b, CM_EPERM, 0, "profiling counters are restricted"));
#undef FRAME
  starts[n] = b.len;
  put("stream", 0, 0, b.data, b.len);
  put("stream_chunked", 0, 5, b.data, b.len);

  cm_wire_buf c;
  cm_wire_buf_init(&c);
  check(cm_wire_write_file_header(&c, 0));
  check(cm_wire_write_frame(&c, 200, 0, CM_WIRE_MINOR + 1, "future", 6)); /* skipped */
  size_t at = c.len;
  if (!(c.data = realloc(c.data, c.cap = at + b.len))) return 1;
  memcpy(c.data + at, b.data, b.len);
  c.len = at + b.len;
  put("capture", 1, 0, c.data, c.len);

  cm_wire_buf rec;
  cm_wire_buf_init(&rec);
  for (size_t i = 0; i < n; i++) {
    const uint8_t *payload = b.data + starts[i] + CM_WIRE_FRAME_HEADER_SIZE;
    size_t len = starts[i + 1] - starts[i] - CM_WIRE_FRAME_HEADER_SIZE;
    char fname[32];
    const char *tn = cm_wire_type_name(types[i]);
    snprintf(fname, sizeof fname, "payload_%s", tn ? tn : "unknown");
    put(fname, 2, (uint8_t)i, payload, len);
    uint8_t hdr[3] = {(uint8_t)i, (uint8_t)len, (uint8_t)(len >> 8)};
    if (rec.cap < rec.len + 3 + len && !(rec.data = realloc(rec.data, rec.cap = (rec.len + 3 + len) * 2))) return 1;
    memcpy(rec.data + rec.len, hdr, 3);
    memcpy(rec.data + rec.len + 3, payload, len);
    rec.len += 3 + len;
  }
  put("records", 3, 0, rec.data, rec.len);
  cm_wire_buf_free(&b);
  cm_wire_buf_free(&c);
  cm_wire_buf_free(&rec);
  return 0;
}
