/*
 * test_wire.c: the wire format's writer, reader, decoders and capture files.
 *
 * Design note. Every frame type is written and read back; a million-row batch round-trips with
 * its checksum compared against an independent bit-at-a-time CRC32C; a small multi-frame stream
 * is cut at every byte offset and has every byte flipped, and each outcome is checked exactly
 * (how many frames came out, which error, which offset); hostile payloads with valid checksums
 * are thrown at the decoders. Run it under ASan (CUPTIMON_ASAN) to make "never crash" a checked
 * property. It uses only the wire (engine/wire), so it does not need a GPU, the fake CUPTI or
 * the engine.
 */
#include "cuptimon_wire.h"

#include "cmt.h"

#include <stdint.h>
#include <time.h>
#include <unistd.h>

/* Like CMT_OK, but the detail comes from the wire reader, which keeps its own message. */
#define WOK(call, r)                                                                   \
  do {                                                                                 \
    int wok_rc_ = (call);                                                              \
    if (wok_rc_ != 0) CMT_FAIL("%s returned %d (%s)", #call, wok_rc_, cm_wire_reader_errmsg(r)); \
  } while (0)

/* wire_common.c's table-driven CRC32C (internal), which cm_wire_crc32c uses on CPUs without
 * SSE4.2. */
uint32_t cm__wire_crc32c_table(uint32_t crc, const void *data, size_t len);

/* An independent CRC32C, one bit at a time, to check the table-driven and hardware ones. */
static uint32_t crc_ref(const void *data, size_t len) {
  const uint8_t *p = data;
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < len; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

static uint32_t ld32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t ld64(const uint8_t *p) { return ld32(p) | ((uint64_t)ld32(p + 4) << 32); }

static void test_crc(void) {
  CMT_EQU(cm_wire_crc32c(0, "123456789", 9), 0xE3069283u);
  uint8_t zeros[32] = {0}, ones[32];
  memset(ones, 0xFF, sizeof ones);
  CMT_EQU(cm_wire_crc32c(0, zeros, 32), 0x8A9136AAu); /* RFC 3720 B.4 */
  CMT_EQU(cm_wire_crc32c(0, ones, 32), 0x62A8AB43u);
  uint8_t buf[1000];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 131 + 7);
  for (size_t n = 0; n < sizeof buf; n += 37) {
    CMT_EQU(cm_wire_crc32c(0, buf, n), crc_ref(buf, n));
    /* Incremental: any split gives the same CRC. */
    CMT_EQU(cm_wire_crc32c(cm_wire_crc32c(0, buf, n / 3), buf + n / 3, n - n / 3), crc_ref(buf, n));
  }
  /* The hardware path (SSE4.2, where the CPU has it) and the table agree with the reference at
   * every length and alignment, whole and split. */
  for (size_t off = 0; off < 8; off++)
    for (size_t n = 0; n < 300; n++) {
      uint32_t want = crc_ref(buf + off, n);
      CMT_EQU(cm_wire_crc32c(0, buf + off, n), want);
      CMT_EQU(cm__wire_crc32c_table(0, buf + off, n), want);
      CMT_EQU(cm_wire_crc32c(cm__wire_crc32c_table(0, buf + off, n / 2), buf + off + n / 2, n - n / 2), want);
    }
}

/* ---- A small stream with one frame of every type ---------------------------------------- */

static const char *const argv_fix[] = {"python", "train.py", "--epochs=3", ""};
static const cm_wire_device dev_fix[] = {
    {0, 1, {0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, "NVIDIA H200"},
    {1, 0, {0}, "NVIDIA H200"}};
static const cm_wire_field kfields_fix[] = {
    {0, CM_TYPE_U64, 8, 0, "start"}, {1, CM_TYPE_U64, 8, 0, "stop"}, {4, CM_TYPE_STR, 4, 0, "name"},
    {7, CM_TYPE_U8, 1, 0, "flag"}};
static const cm_wire_field mfields_fix[] = {{0, CM_TYPE_I64, 8, 0, "bytes"}, {2, CM_TYPE_I16, 2, 0, "kind"}};
static const cm_wire_kind kinds_fix[] = {{CM_KIND_CONCURRENT_KERNEL, 4, "concurrent_kernel", kfields_fix},
                                         {CM_KIND_MEMCPY, 2, "memcpy", mfields_fix},
                                         {CM_KIND_RUNTIME, 0, "runtime", NULL}};
static const char name_bytes[] = {'a', 0, 'b', (char)0xff};
static const cm_wire_string strings_fix[] = {{1, 7, "kernelA"}, {2, 0, ""}, {99, 4, name_bytes}};
static const cm_wire_kv stats_fix[] = {{"buffers", 12}, {"records_dropped", UINT64_MAX}, {"batches_dropped", 0}};
static const cm_wire_kv conf_fix[] = {{"buffer_size", 4u << 20}, {"flush_ms", 200}, {"deliver_ms", 1000}};

static uint64_t col_start[5] = {10, 20, 30, 40, UINT64_MAX};
static uint64_t col_stop[5] = {11, 22, 33, 44, 0};
static uint32_t col_name[5] = {1, 1, 99, 2, 1};
static uint8_t col_flag[5] = {0, 1, 2, 3, 255};

static void fill_batch(cm_batch *b, cm_column *cols) {
  memset(cols, 0, 4 * sizeof *cols);
  cols[0] = (cm_column){0, CM_TYPE_U64, 8, 0, "start", col_start};
  cols[1] = (cm_column){1, CM_TYPE_U64, 8, 0, "stop", col_stop};
  cols[2] = (cm_column){4, CM_TYPE_STR, 4, 0, "name", col_name};
  cols[3] = (cm_column){7, CM_TYPE_U8, 1, 0, "flag", col_flag};
  *b = (cm_batch){CM_KIND_CONCURRENT_KERNEL, 5, 4, 0, cols, 42};
}

enum { NFRAMES = 12 };

/* Writes the stream; ends[i] is the end offset of frame i and starts[i] its start. Returns the
 * offset where the first frame starts (24 with a capture header). */
static size_t build_stream(cm_wire_buf *b, int capture, size_t *starts, size_t *ends) {
  cm_wire_buf_init(b);
  if (capture) CMT_EQ(cm_wire_write_file_header(b, 0), 0);
  size_t first = b->len;
  cm_wire_hello h = {4242, 1, 130000, 0, 1700000000123456789ull, 1700000000123000000ull,
                     "tok-3f9a", "gpu-node-7", "/usr/bin/python3", 4, 2, argv_fix, dev_fix, 0, NULL};
  cm_wire_schema s = {3, 0, kinds_fix};
  cm_batch batch;
  cm_column cols[4];
  fill_batch(&batch, cols);
  int k = 0;
#define STEP(call)                                                                     \
  do {                                                                                 \
    starts[k] = b->len;                                                                \
    CMT_EQ(call, 0);                                                                   \
    ends[k++] = b->len;                                                                \
  } while (0)
  STEP(cm_wire_write_hello(b, &h));
  STEP(cm_wire_write_schema(b, &s));
  STEP(cm_wire_write_strings(b, strings_fix, 3));
  STEP(cm_wire_write_batch(b, &batch));
  STEP(cm_wire_write_stats(b, stats_fix, 3));
  STEP(cm_wire_write_flush_done(b, 77, -8));
  STEP(cm_wire_write_hello_ack(b, 0, "welcome"));
  STEP(cm_wire_write_select(b, "kernel:name,start,stop;memcpy"));
  STEP(cm_wire_write_configure(b, conf_fix, 3));
  STEP(cm_wire_write_flush(b, 78, CM_WIRE_FLUSH_SYNC, 5000));
  STEP(cm_wire_write_batch(b, &(cm_batch){CM_KIND_MEMCPY, 0, 0, 0, NULL, 43}));
  STEP(cm_wire_write_bye(b, CM_WIRE_BYE_EXIT, 3, "bye now"));
#undef STEP
  CMT_EQ(k, NFRAMES);
  return first;
}

/* Decodes a frame of any type and releases what the decoder allocated. */
static int decode_any(const cm_wire_frame *f) {
  switch (f->type) {
  case CM_WIRE_HELLO: {
    cm_wire_hello h;
    int rc = cm_wire_decode_hello(f, &h);
    cm_wire_hello_release(&h);
    return rc;
  }
  case CM_WIRE_SCHEMA: {
    cm_wire_schema s;
    int rc = cm_wire_decode_schema(f, &s);
    cm_wire_schema_release(&s);
    return rc;
  }
  case CM_WIRE_STRINGS: {
    cm_wire_strings s;
    int rc = cm_wire_decode_strings(f, &s);
    cm_wire_strings_release(&s);
    return rc;
  }
  case CM_WIRE_STATS:
  case CM_WIRE_CONFIGURE: {
    cm_wire_kvlist l;
    int rc = cm_wire_decode_kvlist(f, &l);
    cm_wire_kvlist_release(&l);
    return rc;
  }
  case CM_WIRE_BATCH: {
    static cm_wire_batch wb;
    int rc = cm_wire_decode_batch(f, NULL, &wb);
    /* Touch every byte of every column so that ASan proves the views are in bounds. */
    unsigned sum = 0;
    for (uint32_t i = 0; rc == 0 && i < wb.batch.ncols; i++)
      for (uint64_t j = 0; j < (uint64_t)wb.batch.n * wb.cols[i].width; j++)
        sum += ((const uint8_t *)wb.cols[i].data)[j];
    (void)sum;
    return rc;
  }
  case CM_WIRE_FLUSH_DONE: return cm_wire_decode_flush_done(f, NULL, NULL);
  case CM_WIRE_BYE: {
    cm_wire_bye b;
    return cm_wire_decode_bye(f, &b);
  }
  case CM_WIRE_HELLO_ACK: return cm_wire_decode_hello_ack(f, NULL, NULL);
  case CM_WIRE_SELECT: return cm_wire_decode_select(f, NULL, NULL);
  case CM_WIRE_FLUSH: return cm_wire_decode_flush(f, NULL, NULL, NULL);
  default: return CM_EINVAL;
  }
}

static void check_frame_header(const cm_wire_frame *f, const uint8_t *stream, size_t start, size_t end) {
  CMT_EQU(f->offset, start);
  CMT_EQU(f->len + 24, end - start);
  CMT_EQ((uintptr_t)f->payload % 8, 0);
  CMT_EQ(memcmp(f->payload, stream + start + 24, (size_t)f->len), 0);
  CMT_EQU(ld32(stream + start + 16), crc_ref(stream + start + 24, (size_t)f->len));
  CMT_EQU(ld32(stream + start + 20), crc_ref(stream + start, 20));
}

static void test_roundtrip(void) {
  for (int capture = 0; capture <= 1; capture++) {
    cm_wire_buf b;
    size_t starts[NFRAMES], ends[NFRAMES];
    build_stream(&b, capture, starts, ends);
    CMT_EQ(b.len % 8, 0);
    cm_wire_reader *r;
    CMT_EQ(cm_wire_reader_new(&r, capture ? CM_WIRE_READER_CAPTURE : 0), 0);
    WOK(cm_wire_reader_feed(r, b.data, b.len), r);
    cm_wire_frame f;
    cm_wire_schema schema = {0};
    for (int k = 0; k < NFRAMES; k++) {
      CMT_EQ(cm_wire_reader_next(r, &f), 1);
      check_frame_header(&f, b.data, starts[k], ends[k]);
      CMT_EQ(f.major, CM_WIRE_MAJOR);
      CMT_EQ(f.minor, CM_WIRE_MINOR);
      switch (k) {
      case 0: {
        cm_wire_hello h;
        CMT_EQ(f.type, CM_WIRE_HELLO);
        WOK(cm_wire_decode_hello(&f, &h), r);
        CMT_EQ(h.pid, 4242);
        CMT_EQ(h.ppid, 1);
        CMT_EQ(h.cupti_version, 130000);
        CMT_EQU(h.clock_realtime_ns, 1700000000123456789ull);
        CMT_EQU(h.clock_cupti_ns, 1700000000123000000ull);
        CMT_STREQ(h.token, "tok-3f9a");
        CMT_STREQ(h.host, "gpu-node-7");
        CMT_STREQ(h.exe, "/usr/bin/python3");
        CMT_EQ(h.argc, 4);
        for (int i = 0; i < 4; i++) CMT_STREQ(h.argv[i], argv_fix[i]);
        CMT_ASSERT(h.argv[4] == NULL);
        CMT_EQ(h.ndevices, 2);
        CMT_EQ(h.devices[0].index, 0);
        CMT_EQ(h.devices[0].has_uuid, 1);
        CMT_EQ(memcmp(h.devices[0].uuid, dev_fix[0].uuid, 16), 0);
        CMT_STREQ(h.devices[0].name, "NVIDIA H200");
        CMT_EQ(h.devices[1].index, 1);
        CMT_EQ(h.devices[1].has_uuid, 0);
        cm_wire_hello_release(&h);
        break;
      }
      case 1: {
        CMT_EQ(f.type, CM_WIRE_SCHEMA);
        WOK(cm_wire_decode_schema(&f, &schema), r);
        CMT_EQ(schema.nkinds, 3);
        for (int i = 0; i < 3; i++) {
          CMT_EQ(schema.kinds[i].kind, kinds_fix[i].kind);
          CMT_STREQ(schema.kinds[i].name, kinds_fix[i].name);
          CMT_EQ(schema.kinds[i].nfields, kinds_fix[i].nfields);
          for (uint32_t j = 0; j < kinds_fix[i].nfields; j++) {
            CMT_EQ(schema.kinds[i].fields[j].id, kinds_fix[i].fields[j].id);
            CMT_EQ(schema.kinds[i].fields[j].type, kinds_fix[i].fields[j].type);
            CMT_EQ(schema.kinds[i].fields[j].width, kinds_fix[i].fields[j].width);
            CMT_STREQ(schema.kinds[i].fields[j].name, kinds_fix[i].fields[j].name);
          }
        }
        break;
      }
      case 2: {
        cm_wire_strings s;
        CMT_EQ(f.type, CM_WIRE_STRINGS);
        WOK(cm_wire_decode_strings(&f, &s), r);
        CMT_EQ(s.count, 3);
        for (int i = 0; i < 3; i++) {
          CMT_EQ(s.entries[i].id, strings_fix[i].id);
          CMT_EQ(s.entries[i].len, strings_fix[i].len);
          CMT_EQ(memcmp(s.entries[i].bytes, strings_fix[i].bytes, s.entries[i].len), 0);
          CMT_EQ(s.entries[i].bytes[s.entries[i].len], 0);
        }
        cm_wire_strings_release(&s);
        break;
      }
      case 3: {
        cm_wire_batch wb;
        CMT_EQ(f.type, CM_WIRE_BATCH);
        WOK(cm_wire_decode_batch(&f, &schema, &wb), r);
        CMT_EQ(wb.batch.kind, CM_KIND_CONCURRENT_KERNEL);
        CMT_EQ(wb.batch.n, 5);
        CMT_EQ(wb.batch.ncols, 4);
        CMT_EQU(wb.batch.seq, 42);
        CMT_ASSERT(wb.batch.cols == wb.cols);
        cm_batch ref;
        cm_column rc[4];
        fill_batch(&ref, rc);
        for (int i = 0; i < 4; i++) {
          CMT_EQ(wb.cols[i].field, rc[i].field);
          CMT_EQ(wb.cols[i].type, rc[i].type);
          CMT_EQ(wb.cols[i].width, rc[i].width);
          CMT_STREQ(wb.cols[i].name, rc[i].name);
          CMT_EQ((uintptr_t)wb.cols[i].data % 8, 0);
          /* In place: the column points into the frame, it is not a copy. */
          CMT_ASSERT((const uint8_t *)wb.cols[i].data > f.payload &&
                     (const uint8_t *)wb.cols[i].data < f.payload + f.len);
          CMT_EQ(memcmp(wb.cols[i].data, rc[i].data, 5 * rc[i].width), 0);
        }
        CMT_EQU(((const uint64_t *)wb.cols[0].data)[4], UINT64_MAX);
        break;
      }
      case 4:
      case 8: {
        cm_wire_kvlist l;
        const cm_wire_kv *want = k == 4 ? stats_fix : conf_fix;
        CMT_EQ(f.type, k == 4 ? CM_WIRE_STATS : CM_WIRE_CONFIGURE);
        WOK(cm_wire_decode_kvlist(&f, &l), r);
        CMT_EQ(l.count, 3);
        for (int i = 0; i < 3; i++) {
          CMT_STREQ(l.items[i].name, want[i].name);
          CMT_EQU(l.items[i].value, want[i].value);
        }
        cm_wire_kvlist_release(&l);
        break;
      }
      case 5: {
        uint64_t id;
        int32_t st;
        CMT_EQ(f.type, CM_WIRE_FLUSH_DONE);
        WOK(cm_wire_decode_flush_done(&f, &id, &st), r);
        CMT_EQU(id, 77);
        CMT_EQ(st, -8);
        break;
      }
      case 6: {
        int32_t st = 5;
        const char *m;
        CMT_EQ(f.type, CM_WIRE_HELLO_ACK);
        WOK(cm_wire_decode_hello_ack(&f, &st, &m), r);
        CMT_EQ(st, 0);
        CMT_STREQ(m, "welcome");
        break;
      }
      case 7: {
        const char *spec;
        uint32_t len;
        CMT_EQ(f.type, CM_WIRE_SELECT);
        WOK(cm_wire_decode_select(&f, &spec, &len), r);
        CMT_STREQ(spec, "kernel:name,start,stop;memcpy");
        CMT_EQ(len, strlen(spec));
        break;
      }
      case 9: {
        uint64_t id;
        uint32_t fl, to;
        CMT_EQ(f.type, CM_WIRE_FLUSH);
        WOK(cm_wire_decode_flush(&f, &id, &fl, &to), r);
        CMT_EQU(id, 78);
        CMT_EQ(fl, CM_WIRE_FLUSH_SYNC);
        CMT_EQ(to, 5000);
        /* The wrong decoder for a type is a caller mistake. */
        cm_wire_bye bye;
        CMT_EQ(cm_wire_decode_bye(&f, &bye), CM_EINVAL);
        break;
      }
      case 10: {
        cm_wire_batch wb;
        WOK(cm_wire_decode_batch(&f, NULL, &wb), r);
        CMT_EQ(wb.batch.n, 0);
        CMT_EQ(wb.batch.ncols, 0);
        CMT_EQU(wb.batch.seq, 43);
        break;
      }
      case 11: {
        cm_wire_bye bye;
        CMT_EQ(f.type, CM_WIRE_BYE);
        WOK(cm_wire_decode_bye(&f, &bye), r);
        CMT_EQ(bye.reason, CM_WIRE_BYE_EXIT);
        CMT_EQ(bye.exit_code, 3);
        CMT_STREQ(bye.message, "bye now");
        break;
      }
      }
    }
    CMT_EQ(cm_wire_reader_next(r, &f), 0);
    WOK(cm_wire_reader_end(r), r);
    CMT_EQU(cm_wire_reader_frames(r), NFRAMES);
    cm_wire_schema_release(&schema);
    cm_wire_reader_free(r);
    cm_wire_buf_free(&b);
  }
}

/* The bytes of a FLUSH frame, pinned: docs/wire.md shows the same bytes as its worked example,
 * so a change to the format or the checksum fails here first. */
static void test_golden(void) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_EQ(cm_wire_write_flush(&b, 1, CM_WIRE_FLUSH_SYNC, 250), 0);
  static const uint8_t want[40] = {
      0x43, 0x4d, 0x01, 0x02, 0x43, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x3a, 0x99, 0x24, 0x77, 0xcc, 0xd4, 0x51, 0x22, 0x01, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0xfa, 0x00, 0x00, 0x00};
  CMT_EQ(b.len, 40);
  for (size_t i = 0; i < 40; i++)
    if (b.data[i] != want[i]) CMT_FAIL("golden FLUSH byte %zu: 0x%02x, want 0x%02x", i, b.data[i], want[i]);
  cm_wire_buf_clear(&b);
  CMT_EQ(cm_wire_write_file_header(&b, 0), 0);
  static const uint8_t fh[24] = {'C', 'U', 'P', 'T', 'I', 'M', 'O', 'N', 1, 0, 2, 0,
                                 0,   0,   0,   0,   0,   0,   0,   0,   0, 0, 0, 0};
  CMT_EQ(memcmp(b.data, fh, 20), 0);
  CMT_EQU(ld32(b.data + 20), crc_ref(fh, 20));
  CMT_EQU(ld32(b.data + 20), 0x9CB3A7A3u);
  cm_wire_buf_free(&b);
}

/* Wire 1.2's PM request and PM_STATUS frames round-trip, and an F64 column is accepted with width
 * 8 only. */
static void test_pm_frames(void) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_OK(cm_wire_write_pm(&b, "0:1000:sm__cycles_active.avg"));
  CMT_OK(cm_wire_write_pm_status(&b, CM_EPERM, 3, "restricted"));
  double v[2] = {1.5, -2.25};
  cm_column col = {.field = 5, .type = CM_TYPE_F64, .width = 8, .name = "value", .data = v};
  cm_batch bt = {.kind = CM_KIND_PM_SAMPLE, .n = 2, .ncols = 1, .cols = &col, .seq = 1};
  CMT_OK(cm_wire_write_batch(&b, &bt));
  col.width = 4;
  CMT_EQ(cm_wire_write_batch(&b, &bt), CM_EINVAL);
  cm_wire_reader *r;
  CMT_OK(cm_wire_reader_new(&r, 0));
  CMT_OK(cm_wire_reader_feed(r, b.data, b.len));
  cm_wire_frame f;
  const char *spec = NULL, *msg = NULL;
  uint32_t len = 0, dev = 0;
  int32_t st = 0;
  CMT_EQ(cm_wire_reader_next(r, &f), 1);
  CMT_STREQ(cm_wire_type_name(f.type), "PM");
  CMT_OK(cm_wire_decode_pm(&f, &spec, &len));
  CMT_STREQ(spec, "0:1000:sm__cycles_active.avg");
  CMT_EQU(len, strlen(spec));
  CMT_EQ(cm_wire_decode_pm_status(&f, &st, &dev, &msg), CM_EINVAL);
  CMT_EQ(cm_wire_reader_next(r, &f), 1);
  CMT_STREQ(cm_wire_type_name(f.type), "PM_STATUS");
  CMT_OK(cm_wire_decode_pm_status(&f, &st, &dev, &msg));
  CMT_EQ(st, CM_EPERM);
  CMT_EQU(dev, 3);
  CMT_STREQ(msg, "restricted");
  static cm_wire_batch wb;
  CMT_EQ(cm_wire_reader_next(r, &f), 1);
  CMT_OK(cm_wire_decode_batch(&f, NULL, &wb));
  CMT_EQ(wb.cols[0].type, CM_TYPE_F64);
  CMT_ASSERT(((const double *)wb.cols[0].data)[1] == -2.25);
  CMT_EQ(cm_wire_reader_next(r, &f), 0);
  cm_wire_reader_free(r);
  cm_wire_buf_free(&b);
}

/* Wire 1.1 numbers BATCH frames in the head's last u32 (offset 20 of the payload, reserved in
 * 1.0): the writer puts it there, the decoder hands it out, and 0 means unnumbered. */
static void test_batch_number(void) {
  uint64_t v[3] = {1, 2, 3};
  cm_column col = {.field = 0, .type = CM_TYPE_U64, .width = 8, .name = "start", .data = v};
  cm_batch bt = {.kind = 10, .n = 3, .ncols = 1, .cols = &col, .seq = 9};
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_OK(cm_wire_write_batch_numbered(&b, &bt, 0xA1B2C3D4u));
  CMT_OK(cm_wire_write_batch(&b, &bt));
  CMT_EQU(ld32(b.data + CM_WIRE_FRAME_HEADER_SIZE + 20), 0xA1B2C3D4u);
  cm_wire_reader *r;
  CMT_OK(cm_wire_reader_new(&r, 0));
  CMT_OK(cm_wire_reader_feed(r, b.data, b.len));
  cm_wire_frame f;
  static cm_wire_batch wb;
  CMT_EQ(cm_wire_reader_next(r, &f), 1);
  CMT_EQU(f.minor, CM_WIRE_MINOR);
  CMT_OK(cm_wire_decode_batch(&f, NULL, &wb));
  CMT_EQU(wb.number, 0xA1B2C3D4u);
  CMT_EQU(wb.batch.seq, 9);
  CMT_EQU(wb.batch.n, 3);
  CMT_EQ(cm_wire_reader_next(r, &f), 1);
  CMT_OK(cm_wire_decode_batch(&f, NULL, &wb));
  CMT_EQU(wb.number, 0);
  cm_wire_reader_free(r);
  cm_wire_buf_free(&b);
}

/* A million rows in six columns, checked value by value and against independent checksums. */
static void test_big_batch(void) {
  enum { N = 1000000 };
  uint64_t *a = malloc(N * 8);
  int64_t *bb = malloc(N * 8);
  uint32_t *c = malloc(N * 4);
  uint16_t *d = malloc(N * 2);
  uint8_t *e = malloc(N);
  int32_t *g = malloc(N * 4);
  CMT_ASSERT(a && bb && c && d && e && g);
  uint64_t x = 88172645463325252ull;
  for (uint32_t i = 0; i < N; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    a[i] = 1700000000000000000ull + i * 1000ull;
    bb[i] = (int64_t)x;
    c[i] = (uint32_t)(x >> 20);
    d[i] = (uint16_t)x;
    e[i] = (uint8_t)(x >> 56);
    g[i] = -(int32_t)i;
  }
  cm_column cols[6] = {{0, CM_TYPE_U64, 8, 0, "start", a}, {1, CM_TYPE_I64, 8, 0, "v", bb},
                       {3, CM_TYPE_STR, 4, 0, "name", c},  {5, CM_TYPE_U16, 2, 0, "s", d},
                       {6, CM_TYPE_U8, 1, 0, "b", e},      {9, CM_TYPE_I32, 4, 0, "neg", g}};
  cm_batch batch = {CM_KIND_CONCURRENT_KERNEL, N, 6, 0, cols, 123456789012ull};
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_EQ(cm_wire_write_batch(&b, &batch), 0);
  uint64_t plen = ld64(b.data + 8);
  CMT_EQU(plen + 24, b.len);
  CMT_EQU(plen, 24 + 6 * 24 + 8 * N + 8 * N + 4 * N + 2 * N + N + 4 * N);
  CMT_EQU(ld32(b.data + 16), crc_ref(b.data + 24, (size_t)plen));
  CMT_EQU(ld32(b.data + 20), crc_ref(b.data, 20));

  cm_wire_reader *r;
  CMT_EQ(cm_wire_reader_new(&r, 0), 0);
  /* Feed in uneven chunks, so the frame is reassembled from pieces. */
  for (size_t off = 0; off < b.len;) {
    size_t n = b.len - off < 65521 ? b.len - off : 65521;
    WOK(cm_wire_reader_feed(r, b.data + off, n), r);
    off += n;
  }
  cm_wire_frame f;
  CMT_EQ(cm_wire_reader_next(r, &f), 1);
  cm_wire_batch *wb = malloc(sizeof *wb);
  WOK(cm_wire_decode_batch(&f, NULL, wb), r);
  CMT_EQ(wb->batch.n, N);
  CMT_EQU(wb->batch.seq, 123456789012ull);
  const void *want[6] = {a, bb, c, d, e, g};
  for (int i = 0; i < 6; i++) {
    CMT_EQ((uintptr_t)wb->cols[i].data % 8, 0);
    CMT_EQ(memcmp(wb->cols[i].data, want[i], (size_t)N * cols[i].width), 0);
  }
  /* Used in place as typed arrays, as an FFI consumer would. */
  const uint64_t *start = wb->cols[0].data;
  const int32_t *neg = wb->cols[5].data;
  CMT_EQU(start[N - 1], 1700000000000000000ull + (N - 1) * 1000ull);
  CMT_EQ(neg[N - 1], -(N - 1));
  CMT_EQ(cm_wire_reader_next(r, &f), 0);
  WOK(cm_wire_reader_end(r), r);
  free(wb);
  cm_wire_reader_free(r);
  cm_wire_buf_free(&b);
  free(a), free(bb), free(c), free(d), free(e), free(g);
}

/* ---- Truncation, corruption, chunking ---------------------------------------------------- */

static int drain(cm_wire_reader *r, const uint8_t *stream, const size_t *starts, const size_t *ends,
                 int *rc_out) {
  cm_wire_frame f;
  int n = 0, rc;
  while ((rc = cm_wire_reader_next(r, &f)) == 1) {
    /* Whatever comes out must be exactly a frame that was written: no misparse. */
    CMT_LT(n, NFRAMES);
    check_frame_header(&f, stream, starts[n], ends[n]);
    CMT_EQ(decode_any(&f), 0);
    n++;
  }
  *rc_out = rc;
  return n;
}

static void test_truncation(void) {
  for (int capture = 0; capture <= 1; capture++) {
    cm_wire_buf b;
    size_t starts[NFRAMES], ends[NFRAMES];
    size_t first = build_stream(&b, capture, starts, ends);
    for (size_t L = 0; L <= b.len; L++) {
      cm_wire_reader *r;
      CMT_EQ(cm_wire_reader_new(&r, capture ? CM_WIRE_READER_CAPTURE : 0), 0);
      WOK(cm_wire_reader_feed(r, b.data, L), r);
      int rc;
      int n = drain(r, b.data, starts, ends, &rc);
      CMT_EQ(rc, 0);
      int want = 0;
      while (want < NFRAMES && ends[want] <= L) want++;
      CMT_EQ(n, want);
      /* A clean end is right after the file header or right after a frame. */
      int boundary = L == first || (want > 0 && ends[want - 1] == L);
      rc = cm_wire_reader_end(r);
      if (boundary) {
        if (rc != 0) CMT_FAIL("L=%zu: end() = %d (%s)", L, rc, cm_wire_reader_errmsg(r));
      } else {
        CMT_EQ(rc, CM_EIO);
        char expect[96];
        snprintf(expect, sizeof expect, "%d whole frames, truncated at byte %zu (", want, L);
        if (strncmp(cm_wire_reader_errmsg(r), expect, strlen(expect)) != 0)
          CMT_FAIL("L=%zu: \"%s\" does not start with \"%s\"", L, cm_wire_reader_errmsg(r), expect);
      }
      cm_wire_reader_free(r);
    }
    cm_wire_buf_free(&b);
  }
}

static void test_flips(void) {
  static const uint8_t masks[] = {0x01, 0x80, 0xFF, 0x5A};
  for (int capture = 0; capture <= 1; capture++) {
    cm_wire_buf b;
    size_t starts[NFRAMES], ends[NFRAMES];
    build_stream(&b, capture, starts, ends);
    uint8_t *copy = malloc(b.len);
    for (size_t i = 0; i < b.len; i++) {
      int k = 0; /* the frame holding byte i; -1 for the file header */
      if (i < starts[0]) k = -1;
      else
        while (ends[k] <= i) k++;
      size_t at = k < 0 ? 0 : starts[k];
      for (size_t m = 0; m < sizeof masks; m++) {
        memcpy(copy, b.data, b.len);
        copy[i] ^= masks[m];
        cm_wire_reader *r;
        CMT_EQ(cm_wire_reader_new(&r, capture ? CM_WIRE_READER_CAPTURE : 0), 0);
        WOK(cm_wire_reader_feed(r, copy, b.len), r);
        int rc;
        int n = drain(r, copy, starts, ends, &rc);
        if (rc >= 0) CMT_FAIL("byte %zu ^ 0x%02x: no error (%d frames)", i, masks[m], n);
        CMT_EQ(n, k < 0 ? 0 : k);
        char expect[48];
        snprintf(expect, sizeof expect, "at byte %zu", at);
        const char *msg = cm_wire_reader_errmsg(r);
        if (!strstr(msg, expect))
          CMT_FAIL("byte %zu ^ 0x%02x: \"%s\" does not name \"%s\"", i, masks[m], msg, expect);
        /* A payload byte is caught by the payload checksum, a header byte by the magic or the
         * header checksum: always CM_EIO, never a misread length or version. */
        CMT_EQ(rc, CM_EIO);
        size_t in = i - at;
        if (k >= 0 && in >= 24) CMT_CONTAINS(msg, "bad checksum at byte");
        else if (k >= 0 && in >= 2) CMT_CONTAINS(msg, "bad header checksum at byte");
        /* The error is sticky, and end() repeats it. */
        cm_wire_frame f;
        CMT_EQ(cm_wire_reader_next(r, &f), rc);
        CMT_EQ(cm_wire_reader_end(r), rc);
        cm_wire_reader_free(r);
      }
    }
    free(copy);
    cm_wire_buf_free(&b);
  }
}

static int read_all(const cm_wire_buf *b, uint32_t flags, cm_wire_reader **out, int *nframes);

/* ---- Resynchronization (CM_WIRE_READER_RESYNC) ------------------------------------------- */

/* Reads `n` bytes in chunks of `chunk` with resync on. Checks each yielded frame against the
 * original frame it must be (the payload bytes, 8-byte alignment), where `shift` is added to
 * the offsets of frames at or after `from`. Returns the end() status. */
typedef struct rs_expect {
  const uint8_t *orig;
  const size_t *starts, *ends;
  int skip;          /* the original frame that must not come out, or -1 */
  size_t from;       /* original offset from which the stream was shifted */
  long shift;
} rs_expect;

static int rs_read(const uint8_t *p, size_t n, size_t chunk, const rs_expect *e, int *nframes,
                   cm_wire_reader **out) {
  cm_wire_reader *r;
  CMT_EQ(cm_wire_reader_new(&r, CM_WIRE_READER_CAPTURE | CM_WIRE_READER_RESYNC), 0);
  cm_wire_frame f;
  int k = 0, rc = 0;
  for (size_t off = 0; off < n && rc >= 0;) {
    size_t m = n - off < chunk ? n - off : chunk;
    WOK(cm_wire_reader_feed(r, p + off, m), r);
    off += m;
    while ((rc = cm_wire_reader_next(r, &f)) == 1) {
      if (k == e->skip) k++;
      CMT_LT(k, NFRAMES);
      size_t st = e->starts[k], en = e->ends[k];
      long sh = st >= e->from ? e->shift : 0;
      CMT_EQU(f.offset, (uint64_t)((long)st + sh));
      CMT_EQU(f.len + 24, en - st);
      CMT_EQ((uintptr_t)f.payload % 8, 0);
      CMT_EQ(memcmp(f.payload, e->orig + st + 24, (size_t)f.len), 0);
      CMT_EQ(decode_any(&f), 0);
      k++;
    }
  }
  if (rc == 0) rc = cm_wire_reader_end(r);
  *nframes = k;
  *out = r;
  return rc;
}

static void test_resync(void) {
  static const uint8_t masks[] = {0x01, 0x80, 0xFF, 0x5A};
  static const size_t chunks[] = {1 << 20, 7, 24};
  cm_wire_buf b;
  size_t starts[NFRAMES], ends[NFRAMES];
  build_stream(&b, 1, starts, ends);
  uint8_t *copy = malloc(b.len + 64);
  char expect[160];
  /* Every byte of every frame flipped: that frame alone is lost, the rest come out, and the
   * skipped stretch is reported with its offset and length. */
  for (size_t i = starts[0]; i < b.len; i++) {
    int k = 0;
    while (ends[k] <= i) k++;
    for (size_t m = 0; m < sizeof masks; m++)
      for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        if (c > 0 && i % 5 != 0) continue; /* the small chunks on a sample of the bytes */
        memcpy(copy, b.data, b.len);
        copy[i] ^= masks[m];
        rs_expect e = {b.data, starts, ends, k, 0, 0};
        cm_wire_reader *r;
        int n, rc = rs_read(copy, b.len, chunks[c], &e, &n, &r);
        uint64_t bytes, resyncs = cm_wire_reader_resyncs(r, &bytes);
        if (k == NFRAMES - 1) {
          /* The last frame: the stretch runs to the end, which end() reports and counts. */
          CMT_EQ(rc, CM_EIO);
          CMT_EQ(n, NFRAMES - 1);
          CMT_EQU(resyncs, 1);
          CMT_EQU(bytes, ends[k] - starts[k]);
          snprintf(expect, sizeof expect, "at byte %zu", starts[k]);
          CMT_CONTAINS(cm_wire_reader_errmsg(r), expect);
          snprintf(expect, sizeof expect, "no valid frame in the %zu bytes from byte %zu to the end at byte %zu",
                   ends[k] - starts[k], starts[k], ends[k]);
          CMT_CONTAINS(cm_wire_reader_errmsg(r), expect);
        } else {
          if (rc != 0) CMT_FAIL("byte %zu ^ 0x%02x chunk %zu: end() = %d (%s)", i, masks[m], chunks[c], rc,
                                cm_wire_reader_errmsg(r));
          CMT_EQ(n, NFRAMES);
          CMT_EQU(resyncs, 1);
          CMT_EQU(bytes, ends[k] - starts[k]);
          snprintf(expect, sizeof expect, "at byte %zu", starts[k]);
          CMT_CONTAINS(cm_wire_reader_resync_msg(r), expect);
          snprintf(expect, sizeof expect, "; skipped %zu bytes from byte %zu to the next valid frame at byte %zu",
                   ends[k] - starts[k], starts[k], ends[k]);
          CMT_CONTAINS(cm_wire_reader_resync_msg(r), expect);
          size_t in = i - starts[k];
          if (in >= 24) CMT_CONTAINS(cm_wire_reader_resync_msg(r), "bad checksum at byte");
          else if (in >= 2) CMT_CONTAINS(cm_wire_reader_resync_msg(r), "bad header checksum at byte");
          else CMT_CONTAINS(cm_wire_reader_resync_msg(r), "bad frame magic at byte");
        }
        cm_wire_reader_free(r);
      }
  }
  /* Junk inserted between frames, of every length 1..40 (most leave the next frames off the
   * 8-byte grid): every frame comes out, aligned, at its shifted offset. The junk holds "CM"
   * and a header-sized run, so the scan must reject false starts. */
  static const char junk[] = "CMCM\x01\x00" "CM junk that is not a frame header..";
  for (size_t J = 1; J <= 40; J++)
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
      size_t at = starts[4];
      memcpy(copy, b.data, at);
      memcpy(copy + at, junk, J);
      memcpy(copy + at + J, b.data + at, b.len - at);
      rs_expect e = {b.data, starts, ends, -1, at, (long)J};
      cm_wire_reader *r;
      int n, rc = rs_read(copy, b.len + J, chunks[c], &e, &n, &r);
      if (rc != 0) CMT_FAIL("junk %zu chunk %zu: end() = %d (%s)", J, chunks[c], rc, cm_wire_reader_errmsg(r));
      CMT_EQ(n, NFRAMES);
      uint64_t bytes;
      CMT_EQU(cm_wire_reader_resyncs(r, &bytes), 1);
      CMT_EQU(bytes, J);
      snprintf(expect, sizeof expect, "skipped %zu bytes from byte %zu to the next valid frame at byte %zu", J, at,
               at + J);
      CMT_CONTAINS(cm_wire_reader_resync_msg(r), expect);
      cm_wire_reader_free(r);
    }
  /* A torn frame: frame 3 loses its last 5 bytes (a writer died mid-frame and another went on).
   * Frame 3 is lost; the next frames come out 5 bytes earlier than written. */
  {
    size_t cut = ends[3] - 5;
    memcpy(copy, b.data, cut);
    memcpy(copy + cut, b.data + ends[3], b.len - ends[3]);
    rs_expect e = {b.data, starts, ends, 3, ends[3], -5};
    cm_wire_reader *r;
    int n, rc = rs_read(copy, b.len - 5, 1 << 20, &e, &n, &r);
    if (rc != 0) CMT_FAIL("torn frame: end() = %d (%s)", rc, cm_wire_reader_errmsg(r));
    CMT_EQ(n, NFRAMES);
    uint64_t bytes;
    CMT_EQU(cm_wire_reader_resyncs(r, &bytes), 1);
    CMT_EQU(bytes, ends[3] - 5 - starts[3]);
    cm_wire_reader_free(r);
  }
  /* Without the flag, the first corrupt frame still ends the stream for good. */
  {
    memcpy(copy, b.data, b.len);
    copy[starts[5] + 30] ^= 1;
    cm_wire_reader *r;
    int n;
    CMT_EQ(read_all(&(cm_wire_buf){copy, b.len, b.len}, CM_WIRE_READER_CAPTURE, &r, &n), CM_EIO);
    CMT_EQ(n, 5);
    CMT_EQU(cm_wire_reader_resyncs(r, NULL), 0);
    cm_wire_reader_free(r);
  }
  free(copy);
  cm_wire_buf_free(&b);
}

/* A stretch crafted to make resynchronization quadratic: thousands of overlapping headers with
 * good header checksums, each claiming a 4 MiB payload whose checksum is wrong. Checking each
 * one in full would CRC about 20 GB; the reader bounds that work by the bytes it skips, finds
 * the real frame after the stretch, and returns promptly. */
static void test_resync_crafted(void) {
  enum { K = 5000, L = 4 << 20 };
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_EQ(cm_wire_write_file_header(&b, 0), 0);
  CMT_EQ(cm_wire_write_bye(&b, 0, 1, "first"), 0);
  size_t stretch = b.len, total = b.len + (size_t)K * 24 + L;
  uint8_t *p = calloc(1, total + 64);
  memcpy(p, b.data, b.len);
  for (size_t i = 0; i < K; i++) {
    uint8_t *h = p + stretch + i * 24;
    h[0] = 'C', h[1] = 'M', h[2] = 1, h[4] = CM_WIRE_BYE;
    uint64_t len = L;
    memcpy(h + 8, &len, 8); /* little-endian host, as the other tests assume */
    uint32_t c = crc_ref(h, 20);
    memcpy(h + 20, &c, 4);
  }
  cm_wire_buf_clear(&b);
  CMT_EQ(cm_wire_write_bye(&b, 0, 2, "second"), 0);
  memcpy(p + total, b.data, b.len);
  total += b.len;
  cm_wire_reader *r;
  CMT_EQ(cm_wire_reader_new(&r, CM_WIRE_READER_CAPTURE | CM_WIRE_READER_RESYNC), 0);
  WOK(cm_wire_reader_feed(r, p, total), r);
  cm_wire_frame f;
  int n = 0, rc;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while ((rc = cm_wire_reader_next(r, &f)) == 1) n++;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  CMT_EQ(rc, 0);
  WOK(cm_wire_reader_end(r), r);
  CMT_EQ(n, 2);
  uint64_t bytes;
  CMT_EQU(cm_wire_reader_resyncs(r, &bytes), 1);
  CMT_EQU(bytes, (uint64_t)K * 24 + L);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("test_wire: crafted stretch of %d headers skipped in %.3f s\n", K, s);
  /* Bounded, it takes milliseconds (even under a sanitizer); unbounded, about 17 s. */
  if (s > 5) CMT_FAIL("skipping the crafted stretch took %.1f s", s);
  cm_wire_reader_free(r);
  free(p);
  cm_wire_buf_free(&b);
}

typedef struct seen {
  uint32_t type;
  uint64_t offset, len;
  uint32_t crc;
} seen;

static void test_chunked(void) {
  cm_wire_buf b;
  size_t starts[NFRAMES], ends[NFRAMES];
  build_stream(&b, 1, starts, ends);
  seen one[NFRAMES], byte[NFRAMES];
  int n1 = 0, n2 = 0;
  cm_wire_reader *r;
  cm_wire_frame f;
  CMT_EQ(cm_wire_reader_new(&r, CM_WIRE_READER_CAPTURE), 0);
  WOK(cm_wire_reader_feed(r, b.data, b.len), r);
  while (cm_wire_reader_next(r, &f) == 1)
    one[n1++] = (seen){f.type, f.offset, f.len, crc_ref(f.payload, (size_t)f.len)};
  WOK(cm_wire_reader_end(r), r);
  cm_wire_reader_free(r);
  CMT_EQ(cm_wire_reader_new(&r, CM_WIRE_READER_CAPTURE), 0);
  for (size_t i = 0; i < b.len; i++) {
    WOK(cm_wire_reader_feed(r, b.data + i, 1), r);
    int rc;
    while ((rc = cm_wire_reader_next(r, &f)) == 1) {
      CMT_LT(n2, NFRAMES);
      CMT_EQ((uintptr_t)f.payload % 8, 0);
      CMT_EQ(decode_any(&f), 0);
      byte[n2++] = (seen){f.type, f.offset, f.len, crc_ref(f.payload, (size_t)f.len)};
    }
    CMT_EQ(rc, 0);
  }
  WOK(cm_wire_reader_end(r), r);
  cm_wire_reader_free(r);
  CMT_EQ(n1, NFRAMES);
  CMT_EQ(n2, NFRAMES);
  for (int i = 0; i < NFRAMES; i++) {
    CMT_EQ(one[i].type, byte[i].type);
    CMT_EQU(one[i].offset, byte[i].offset);
    CMT_EQU(one[i].len, byte[i].len);
    CMT_EQU(one[i].crc, byte[i].crc);
  }
  cm_wire_buf_free(&b);
}

/* ---- Versions, flags, caps --------------------------------------------------------------- */

/* Rewrites a frame header field at `pos` and recomputes the header checksum, so the change is
 * "genuine" rather than corruption. */
static void patch_header(uint8_t *h, size_t pos, const void *v, size_t n) {
  memcpy(h + pos, v, n);
  uint32_t c = crc_ref(h, 20);
  for (int i = 0; i < 4; i++) h[20 + i] = (uint8_t)(c >> (8 * i));
}

static int read_all(const cm_wire_buf *b, uint32_t flags, cm_wire_reader **out, int *nframes) {
  CMT_EQ(cm_wire_reader_new(out, flags), 0);
  WOK(cm_wire_reader_feed(*out, b->data, b->len), *out);
  cm_wire_frame f;
  int rc, n = 0;
  while ((rc = cm_wire_reader_next(*out, &f)) == 1) n++;
  *nframes = n;
  if (rc == 0) rc = cm_wire_reader_end(*out);
  return rc;
}

static void test_versions(void) {
  cm_wire_buf b;
  cm_wire_reader *r;
  int n;
  uint8_t pay[16] = {1, 2, 3};
  /* An unknown type from a newer minor is skipped by its length. */
  cm_wire_buf_init(&b);
  CMT_EQ(cm_wire_write_frame(&b, 200, 0, CM_WIRE_MINOR + 1, pay, 13), 0);
  CMT_EQ(cm_wire_write_bye(&b, 0, 0, NULL), 0);
  CMT_EQ(read_all(&b, 0, &r, &n), 0);
  CMT_EQ(n, 1);
  CMT_EQU(cm_wire_reader_skipped(r), 1);
  cm_wire_reader_free(r);
  /* An unknown type that claims this minor is an error. */
  cm_wire_buf_clear(&b);
  CMT_EQ(cm_wire_write_frame(&b, 200, 0, CM_WIRE_MINOR, pay, 16), 0);
  CMT_EQ(read_all(&b, 0, &r, &n), CM_EIO);
  CMT_CONTAINS(cm_wire_reader_errmsg(r), "unknown frame type 200 at byte 0");
  cm_wire_reader_free(r);
  /* A newer major version is refused with a clear message. */
  cm_wire_buf_clear(&b);
  CMT_EQ(cm_wire_write_bye(&b, 0, 0, NULL), 0);
  CMT_EQ(cm_wire_write_bye(&b, 0, 0, NULL), 0);
  size_t second = b.len / 2;
  patch_header(b.data + second, 2, (const uint8_t[]){2, 0}, 2); /* major 2, minor 0 */
  CMT_EQ(read_all(&b, 0, &r, &n), CM_ENOSYS);
  CMT_EQ(n, 1);
  CMT_CONTAINS(cm_wire_reader_errmsg(r), "version 2.0; this reader supports major version 1");
  cm_wire_reader_free(r);
  /* Same for a capture file header. */
  cm_wire_buf_clear(&b);
  CMT_EQ(cm_wire_write_file_header(&b, 0), 0);
  b.data[8] = 3;
  b.data[10] = 0; /* minor 0 */
  {
    uint32_t c = crc_ref(b.data, 20);
    for (int i = 0; i < 4; i++) b.data[20 + i] = (uint8_t)(c >> (8 * i));
  }
  CMT_EQ(read_all(&b, CM_WIRE_READER_CAPTURE, &r, &n), CM_ENOSYS);
  CMT_CONTAINS(cm_wire_reader_errmsg(r), "capture has wire format version 3.0");
  cm_wire_reader_free(r);
  /* A newer minor capture is read, and its minor reported. */
  b.data[8] = 1;
  b.data[10] = 7;
  {
    uint32_t c = crc_ref(b.data, 20);
    for (int i = 0; i < 4; i++) b.data[20 + i] = (uint8_t)(c >> (8 * i));
  }
  CMT_EQ(read_all(&b, CM_WIRE_READER_CAPTURE, &r, &n), 0);
  CMT_EQ(cm_wire_reader_file_minor(r), 7);
  cm_wire_reader_free(r);
  /* Not a capture at all. */
  cm_wire_buf_clear(&b);
  CMT_EQ(cm_wire_write_bye(&b, 0, 0, NULL), 0);
  CMT_EQ(read_all(&b, CM_WIRE_READER_CAPTURE, &r, &n), CM_EIO);
  CMT_CONTAINS(cm_wire_reader_errmsg(r), "not a cuptimon capture");
  cm_wire_reader_free(r);
  /* A must-understand flag this reader does not know is refused; an optional one is not. */
  cm_wire_buf_clear(&b);
  CMT_EQ(cm_wire_write_frame(&b, CM_WIRE_BYE, 0x0100, 0, NULL, 0), 0);
  CMT_EQ(cm_wire_write_frame(&b, CM_WIRE_BYE, 0x0001, 0, NULL, 0), 0);
  CMT_EQ(read_all(&b, 0, &r, &n), CM_ENOSYS);
  CMT_EQ(n, 1);
  CMT_CONTAINS(cm_wire_reader_errmsg(r), "unknown required flags 0x1");
  cm_wire_reader_free(r);
  /* A frame over the cap is refused from its header, before any payload arrives. */
  cm_wire_buf_clear(&b);
  CMT_EQ(cm_wire_write_bye(&b, 0, 0, NULL), 0);
  uint8_t big[8] = {0, 0, 0, 0x40, 1, 0, 0, 0}; /* 2^30 + 2^32 bytes */
  patch_header(b.data, 8, big, 8);
  b.len = 24;
  CMT_EQ(read_all(&b, 0, &r, &n), CM_ERANGE);
  CMT_CONTAINS(cm_wire_reader_errmsg(r), "over the cap");
  cm_wire_reader_free(r);
  /* A length that is not a multiple of 8, with a valid header checksum. */
  cm_wire_buf_clear(&b);
  CMT_EQ(cm_wire_write_bye(&b, 0, 0, NULL), 0);
  patch_header(b.data, 8, &(uint64_t){12}, 8);
  CMT_EQ(read_all(&b, 0, &r, &n), CM_EIO);
  CMT_CONTAINS(cm_wire_reader_errmsg(r), "not a multiple of 8");
  cm_wire_reader_free(r);
  cm_wire_buf_free(&b);
}

/* ---- Hostile payloads with valid checksums ----------------------------------------------- */

static int decode_payload(uint32_t type, const void *p, size_t len, char *msg, size_t msglen) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_EQ(cm_wire_write_frame(&b, type, 0, 0, p, len), 0);
  cm_wire_reader *r;
  CMT_EQ(cm_wire_reader_new(&r, 0), 0);
  WOK(cm_wire_reader_feed(r, b.data, b.len), r);
  cm_wire_frame f;
  CMT_EQ(cm_wire_reader_next(r, &f), 1);
  int rc = decode_any(&f);
  /* Again from an exact-size copy of the payload, so that ASan sees any read past its end. */
  uint8_t *exact = malloc(len ? len : 1);
  memcpy(exact, f.payload, len);
  f.payload = exact;
  CMT_EQ(decode_any(&f), rc);
  free(exact);
  if (msg) snprintf(msg, msglen, "%s", cm_wire_reader_errmsg(r));
  cm_wire_reader_free(r);
  cm_wire_buf_free(&b);
  return rc;
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  put32(p, (uint32_t)v);
  put32(p + 4, (uint32_t)(v >> 32));
}

static void test_hostile(void) {
  char msg[CM_WIRE_ERRMSG_SIZE];
  uint8_t p[256];
  /* A batch whose row count times width overflows 32 bits and runs far past the payload. */
  memset(p, 0, sizeof p);
  put64(p, 1);
  put32(p + 8, 10);
  put32(p + 12, 0xFFFFFFFFu);
  put32(p + 16, 1);
  put32(p + 24, 0), put32(p + 28, CM_TYPE_U64), put32(p + 32, 8), put64(p + 40, 48);
  CMT_EQ(decode_payload(CM_WIRE_BATCH, p, 64, msg, sizeof msg), CM_EIO);
  CMT_CONTAINS(msg, "BATCH frame at byte 0: column data runs past the payload");
  /* A misaligned column offset, an overlapping one, one inside the column table. */
  put32(p + 12, 1);
  put64(p + 40, 52);
  CMT_EQ(decode_payload(CM_WIRE_BATCH, p, 64, msg, sizeof msg), CM_EIO);
  CMT_CONTAINS(msg, "not 8-byte aligned");
  put64(p + 40, 40);
  CMT_EQ(decode_payload(CM_WIRE_BATCH, p, 64, msg, sizeof msg), CM_EIO);
  CMT_CONTAINS(msg, "overlaps");
  put64(p + 40, UINT64_MAX - 7);
  CMT_EQ(decode_payload(CM_WIRE_BATCH, p, 64, msg, sizeof msg), CM_EIO);
  put64(p + 40, 48);
  CMT_EQ(decode_payload(CM_WIRE_BATCH, p, 64, msg, sizeof msg), 0);
  /* Widths that do not fit the type, too many columns, a column table past the end. */
  put32(p + 32, 4);
  CMT_EQ(decode_payload(CM_WIRE_BATCH, p, 64, msg, sizeof msg), CM_EIO);
  CMT_CONTAINS(msg, "width");
  put32(p + 32, 8);
  put32(p + 16, 129);
  CMT_EQ(decode_payload(CM_WIRE_BATCH, p, 64, msg, sizeof msg), CM_EIO);
  put32(p + 16, 3);
  CMT_EQ(decode_payload(CM_WIRE_BATCH, p, 64, msg, sizeof msg), CM_EIO);
  CMT_CONTAINS(msg, "column table runs past");
  /* Strings: a length past the end, a missing NUL, a huge count. */
  memset(p, 0, sizeof p);
  put32(p, 1), put32(p + 4, 5), put32(p + 8, 0xFFFFFFF0u);
  CMT_EQ(decode_payload(CM_WIRE_STRINGS, p, 16, msg, sizeof msg), CM_EIO);
  put32(p + 8, 3), memcpy(p + 12, "abcd", 4);
  CMT_EQ(decode_payload(CM_WIRE_STRINGS, p, 16, msg, sizeof msg), CM_EIO);
  put32(p, 0xFFFFFFFFu);
  CMT_EQ(decode_payload(CM_WIRE_STRINGS, p, 16, msg, sizeof msg), CM_EIO);
  CMT_CONTAINS(msg, "bad string count");
  /* A string whose length leaves no room for its NUL. */
  put32(p, 4), memcpy(p + 4, "abcd", 4);
  CMT_EQ(decode_payload(CM_WIRE_SELECT, p, 8, msg, sizeof msg), CM_EIO);
  CMT_CONTAINS(msg, "SELECT frame at byte 0: bad selection text");
  /* Schema: too many fields, descending ids. */
  memset(p, 0, sizeof p);
  put32(p, 1), put32(p + 4, 10), put32(p + 8, 200);
  CMT_EQ(decode_payload(CM_WIRE_SCHEMA, p, 64, msg, sizeof msg), CM_EIO);
  put32(p + 8, 2), put32(p + 12, 0); /* kind 10, 2 fields, name "" */
  uint8_t *q = p + 17;
  put32(q, 5), put32(q + 4, CM_TYPE_U32), put32(q + 8, 4), put32(q + 12, 0), q[16] = 0;
  q += 17;
  put32(q, 3), put32(q + 4, CM_TYPE_U32), put32(q + 8, 4), put32(q + 12, 0), q[16] = 0;
  CMT_EQ(decode_payload(CM_WIRE_SCHEMA, p, 56, msg, sizeof msg), CM_EIO);
  CMT_CONTAINS(msg, "strictly ascending");
  put32(p + 17 + 17, 6);
  CMT_EQ(decode_payload(CM_WIRE_SCHEMA, p, 56, msg, sizeof msg), 0);
  /* Every type with an empty payload, then with noise. */
  static const uint32_t types[] = {1, 2, 3, 4, 5, 6, 7, 64, 65, 66, 67};
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    int rc = decode_payload(types[t], NULL, 0, NULL, 0);
    CMT_ASSERT(rc == 0 || rc == CM_EIO);
    for (int it = 0; it < 300; it++) {
      size_t len = (size_t)(it % 32) * 8;
      for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* Small numbers make counts and lengths that are sometimes in range. */
        p[i] = (uint8_t)((x & 3) ? (x >> 8) % 6 : x >> 24);
      }
      rc = decode_payload(types[t], p, len, NULL, 0);
      CMT_ASSERT(rc == 0 || rc == CM_EIO);
    }
  }
}

/* Mutates valid frames' payloads, re-checksums them, and decodes: no crash, only 0 or CM_EIO. */
static void test_mutations(void) {
  cm_wire_buf b;
  size_t starts[NFRAMES], ends[NFRAMES];
  build_stream(&b, 0, starts, ends);
  uint64_t x = 0x2545F4914F6CDD1Dull;
  uint8_t *pay = malloc(b.len);
  for (int k = 0; k < NFRAMES; k++) {
    size_t len = ends[k] - starts[k] - 24;
    uint32_t type = (uint32_t)(b.data[starts[k] + 4] | (b.data[starts[k] + 5] << 8));
    for (int it = 0; it < 2000; it++) {
      memcpy(pay, b.data + starts[k] + 24, len);
      int nmut = 1 + it % 4;
      for (int j = 0; j < nmut && len; j++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        pay[(x >> 16) % len] = (uint8_t)(it & 1 ? x >> 40 : pay[(x >> 16) % len] ^ (1u << (x & 7)));
      }
      size_t cut = it % 3 == 0 ? (len / 8 - (size_t)(x % (len / 8 + 1))) * 8 : len;
      int rc = decode_payload(type, pay, cut, NULL, 0);
      CMT_ASSERT(rc == 0 || rc == CM_EIO);
    }
  }
  free(pay);
  cm_wire_buf_free(&b);
}

/* ---- Capture files ----------------------------------------------------------------------- */

static void write_file(const char *path, const uint8_t *p, size_t n) {
  FILE *fp = fopen(path, "wb");
  CMT_ASSERT(fp);
  CMT_EQ(fwrite(p, 1, n, fp), n);
  CMT_EQ(fclose(fp), 0);
}

static char resync_note[CM_WIRE_ERRMSG_SIZE + 128];

/* Reads a capture file; the message of its last skipped stretch, if any, goes to resync_note. */
static int read_file(const char *path, int *nframes, char *msg) {
  cm_wire_file *cf;
  char err[CM_WIRE_ERRMSG_SIZE];
  resync_note[0] = 0;
  int rc = cm_wire_file_open(&cf, path, err);
  if (rc) {
    snprintf(msg, CM_WIRE_ERRMSG_SIZE, "%s", err);
    return rc;
  }
  cm_wire_frame f;
  *nframes = 0;
  uint64_t resyncs = 0;
  while ((rc = cm_wire_file_next(cf, &f)) == 1) {
    if (cm_wire_reader_resyncs(f.reader, NULL) != resyncs) {
      resyncs = cm_wire_reader_resyncs(f.reader, NULL);
      snprintf(resync_note, sizeof resync_note, "%s", cm_wire_reader_resync_msg(f.reader));
    }
    CMT_EQ(decode_any(&f), 0);
    (*nframes)++;
  }
  snprintf(msg, CM_WIRE_ERRMSG_SIZE, "%s", cm_wire_file_errmsg(cf));
  cm_wire_file_close(cf);
  return rc;
}

static void test_files(void) {
  cm_wire_buf b;
  size_t starts[NFRAMES], ends[NFRAMES];
  build_stream(&b, 1, starts, ends);
  /* Make the capture span several read chunks with a large batch in the middle. */
  enum { N = 300000 };
  uint64_t *v = calloc(N, 8);
  for (uint32_t i = 0; i < N; i++) v[i] = i;
  cm_column col = {0, CM_TYPE_U64, 8, 0, "start", v};
  size_t big_start = b.len;
  CMT_EQ(cm_wire_write_batch(&b, &(cm_batch){CM_KIND_CONCURRENT_KERNEL, N, 1, 0, &col, 1}), 0);
  size_t bye_start = b.len;
  CMT_EQ(cm_wire_write_bye(&b, 0, 0, "end"), 0);
  free(v);
  char path[] = "/tmp/test_wire_XXXXXX";
  int fd = mkstemp(path);
  CMT_GE(fd, 0);
  close(fd);
  char msg[CM_WIRE_ERRMSG_SIZE], expect[128];
  int n;
  write_file(path, b.data, b.len);
  CMT_EQ(read_file(path, &n, msg), 0);
  CMT_EQ(n, NFRAMES + 2);
  /* Truncated inside the big batch: the frames before it are read, then the truncation. */
  write_file(path, b.data, big_start + 1000000);
  CMT_EQ(read_file(path, &n, msg), CM_EIO);
  CMT_EQ(n, NFRAMES);
  snprintf(expect, sizeof expect, "%d whole frames, truncated at byte %zu (the frame at byte %zu", NFRAMES,
           big_start + 1000000, big_start);
  CMT_CONTAINS(msg, expect);
  /* Corrupt inside the big batch, past the first read chunk: the batch is skipped, with its
   * offset and length, and the BYE after it is read. */
  b.data[big_start + 1500000] ^= 0x10;
  write_file(path, b.data, b.len);
  CMT_EQ(read_file(path, &n, msg), 0);
  CMT_EQ(n, NFRAMES + 1);
  snprintf(expect, sizeof expect, "bad checksum at byte %zu", big_start);
  CMT_CONTAINS(resync_note, expect);
  snprintf(expect, sizeof expect, "skipped %zu bytes from byte %zu", bye_start - big_start, big_start);
  CMT_CONTAINS(resync_note, expect);
  /* The same with the file cut inside the BYE: the stretch runs to the end, an error. */
  write_file(path, b.data, b.len - 8);
  CMT_EQ(read_file(path, &n, msg), CM_EIO);
  CMT_EQ(n, NFRAMES);
  snprintf(expect, sizeof expect, "bad checksum at byte %zu", big_start);
  CMT_CONTAINS(msg, expect);
  CMT_CONTAINS(msg, "no valid frame in the");
  /* A crafted header with valid checksums that declares 1 GiB, inserted after the second
   * frame, hides nothing: the file ends before such a frame could, so the reader skips its 24
   * bytes and reads every frame after it. */
  b.data[big_start + 1500000] ^= 0x10;
  {
    uint8_t h[24] = {'C', 'M', CM_WIRE_MAJOR, CM_WIRE_MINOR, CM_WIRE_BATCH, 0};
    uint64_t big = (uint64_t)1 << 30;
    for (int i = 0; i < 8; i++) h[8 + i] = (uint8_t)(big >> (8 * i));
    uint32_t crc = cm_wire_crc32c(0, h, 20);
    for (int i = 0; i < 4; i++) h[20 + i] = (uint8_t)(crc >> (8 * i));
    uint8_t *q = malloc(b.len + 24);
    memcpy(q, b.data, starts[2]);
    memcpy(q + starts[2], h, 24);
    memcpy(q + starts[2] + 24, b.data + starts[2], b.len - starts[2]);
    write_file(path, q, b.len + 24);
    free(q);
    CMT_EQ(read_file(path, &n, msg), 0);
    CMT_EQ(n, NFRAMES + 2);
    snprintf(expect, sizeof expect, "skipped 24 bytes from byte %zu to the next valid frame at byte %zu",
             starts[2], starts[2] + 24);
    CMT_CONTAINS(resync_note, expect);
  }
  /* An empty file is a truncated capture. */
  write_file(path, b.data, 0);
  CMT_EQ(read_file(path, &n, msg), CM_EIO);
  CMT_CONTAINS(msg, "0 whole frames, truncated at byte 0");
  unlink(path);
  CMT_EQ(read_file(path, &n, msg), CM_ENOENT);
  CMT_CONTAINS(msg, path);
  cm_wire_buf_free(&b);
}

static void test_writer_inval(void) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_EQ(cm_wire_write_bye(&b, 0, 0, "x"), 0);
  size_t len = b.len;
  uint32_t d[2] = {1, 2};
  cm_column cols[2] = {{3, CM_TYPE_U32, 4, 0, "a", d}, {3, CM_TYPE_U32, 4, 0, "b", d}};
  CMT_EQ(cm_wire_write_batch(&b, &(cm_batch){1, 2, 2, 0, cols, 0}), CM_EINVAL); /* duplicate ids */
  cols[1].field = 4;
  cols[1].width = 8;
  CMT_EQ(cm_wire_write_batch(&b, &(cm_batch){1, 2, 2, 0, cols, 0}), CM_EINVAL); /* width vs type */
  cols[1].width = 4;
  cols[1].data = NULL;
  CMT_EQ(cm_wire_write_batch(&b, &(cm_batch){1, 2, 2, 0, cols, 0}), CM_EINVAL); /* no data */
  CMT_EQ(cm_wire_write_file_header(&b, 1), CM_EINVAL);
  CMT_EQ(b.len, len); /* nothing half-written */
  cols[1].data = d;
  CMT_EQ(cm_wire_write_batch(&b, &(cm_batch){1, 2, 2, 0, cols, 0}), 0);
  CMT_EQ(b.len % 8, 0);
  cm_wire_buf_free(&b);
}

/* Decodes the first frame of `b` as HELLO into *h. The decoded strings point into the frame, so
 * the reader (*rp) outlives them: the caller releases *h, then frees *rp. */
static int decode_first_hello(const cm_wire_buf *b, cm_wire_hello *h, cm_wire_reader **rp) {
  CMT_OK(cm_wire_reader_new(rp, 0));
  CMT_OK(cm_wire_reader_feed(*rp, b->data, b->len));
  cm_wire_frame f;
  CMT_EQ(cm_wire_reader_next(*rp, &f), 1);
  return cm_wire_decode_hello(&f, h);
}

/* HELLO's environment list: written after the devices and decoded back; a HELLO that ends with
 * the devices (an older agent's) decodes with none, whatever padding follows; the writer refuses
 * more than CM_WIRE_MAX_ENV entries and the reader a count above it. */
static void test_hello_env(void) {
  static const char *const env[] = {"RANK=1", "LOCAL_RANK=1", "WORLD_SIZE=2"};
  cm_wire_hello h = {4242, 1, 130000, 0, 1, 2, "tok", "host", "/bin/x", 4, 2, argv_fix, dev_fix,
                     3, env};
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_OK(cm_wire_write_hello(&b, &h));
  cm_wire_hello d;
  cm_wire_reader *dr;
  CMT_OK(decode_first_hello(&b, &d, &dr));
  CMT_EQ(d.nenv, 3);
  for (int i = 0; i < 3; i++) CMT_STREQ(d.env[i], env[i]);
  CMT_ASSERT(d.env[3] == NULL);
  CMT_EQ(d.ndevices, 2);
  cm_wire_hello_release(&d);
  cm_wire_reader_free(dr);
  /* Without the list: every exe length moves the padding after the devices through 0..7 bytes. */
  for (int pad = 0; pad < 8; pad++) {
    char exe[16] = "/bin/";
    for (int i = 0; i < pad; i++) exe[5 + i] = 'a';
    exe[5 + pad] = 0;
    cm_wire_hello old = {1, 1, 1, 0, 1, 2, "t", "h", exe, 0, 0, NULL, NULL, 0, NULL};
    cm_wire_buf_clear(&b);
    CMT_OK(cm_wire_write_hello(&b, &old));
    /* Cut the list's count off, as an older writer never wrote it, and re-frame the payload. */
    cm_wire_reader *r;
    CMT_OK(cm_wire_reader_new(&r, 0));
    CMT_OK(cm_wire_reader_feed(r, b.data, b.len));
    cm_wire_frame f;
    CMT_EQ(cm_wire_reader_next(r, &f), 1);
    uint8_t pay[256];
    CMT_ASSERT(f.len <= sizeof pay);
    memcpy(pay, f.payload, (size_t)f.len);
    cm_wire_reader_free(r);
    size_t cut = 4 + 4 + 4 + 4 + 8 + 8 + (4 + 2) + (4 + 2) + (4 + strlen(exe) + 1) + 4 + 4;
    cm_wire_buf c;
    cm_wire_buf_init(&c);
    CMT_OK(cm_wire_write_frame(&c, CM_WIRE_HELLO, 0, CM_WIRE_MINOR, pay, cut));
    CMT_OK(decode_first_hello(&c, &d, &dr));
    CMT_EQ(d.nenv, 0);
    CMT_STREQ(d.exe, exe);
    cm_wire_hello_release(&d);
    cm_wire_reader_free(dr);
    cm_wire_buf_free(&c);
  }
  h.nenv = CM_WIRE_MAX_ENV + 1;
  cm_wire_buf_clear(&b);
  CMT_EQ(cm_wire_write_hello(&b, &h), CM_EINVAL);
  cm_wire_buf_free(&b);
}

int main(void) {
  test_crc();
  test_hello_env();
  test_golden();
  test_batch_number();
  test_pm_frames();
  test_roundtrip();
  test_writer_inval();
  test_chunked();
  test_versions();
  test_truncation();
  test_flips();
  test_resync();
  test_resync_crafted();
  test_hostile();
  test_mutations();
  test_files();
  test_big_batch();
  printf("test_wire: ok\n");
  return 0;
}
