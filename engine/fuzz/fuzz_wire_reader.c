/*
 * fuzz_wire_reader.c: a libFuzzer target for the wire reader and every payload decoder.
 *
 * Design note. Random bytes almost never carry a valid CRC32C, so feeding them to the reader
 * alone would exercise little beyond the header checks. The first input byte therefore picks
 * one of four modes:
 *   0  the rest is a frame stream, fed to the reader in chunks whose size comes from byte 1;
 *   1  the same, as a capture file (file header first);
 *   2  byte 1 picks a frame type and the rest is its payload, decoded directly from an
 *      exact-size copy (so that any read past the end is an ASan report);
 *   3  the rest is a list of records {u8 type index, u16 little-endian length, bytes}; each
 *      becomes a frame with valid checksums, and the stream goes through the reader.
 * Bit 2 of the first byte adds CM_WIRE_READER_RESYNC to the reader of modes 0, 1 and 3, so
 * corrupt stretches are skipped rather than final; mode 3 then also flips one byte of its
 * otherwise valid stream (at an offset derived from byte 1), so that a skip has good frames
 * around it.
 * Every frame the reader yields is decoded with the matching decoder, and every column of a
 * decoded batch is read end to end. The invariants checked: no crash, no sanitizer report,
 * decoders return only 0 or CM_EIO, yielded payloads are 8-byte aligned, and a failure always
 * leaves a message.
 */
#include "cuptimon_wire.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint32_t types[] = {CM_WIRE_HELLO,     CM_WIRE_SCHEMA,    CM_WIRE_STRINGS,
                                 CM_WIRE_BATCH,     CM_WIRE_STATS,     CM_WIRE_FLUSH_DONE,
                                 CM_WIRE_BYE,       CM_WIRE_HELLO_ACK, CM_WIRE_SELECT,
                                 CM_WIRE_CONFIGURE, CM_WIRE_FLUSH,     200 /* unknown */,
                                 /* wire 1.2, appended so the older seeds keep their types */
                                 CM_WIRE_PM,        CM_WIRE_PM_STATUS};
enum { NTYPES = sizeof types / sizeof types[0] };

static volatile unsigned sink;

static void check_rc(int rc) {
  if (rc != 0 && rc != CM_EIO) abort();
}

/* Decodes one frame with its decoder. The schema, once decoded, names later batch columns. */
static void decode(const cm_wire_frame *f, cm_wire_schema *schema) {
  switch (f->type) {
  case CM_WIRE_HELLO: {
    cm_wire_hello h;
    int rc = cm_wire_decode_hello(f, &h);
    check_rc(rc);
    for (uint32_t i = 0; rc == 0 && i < h.argc; i++) sink += (unsigned)strlen(h.argv[i]);
    for (uint32_t i = 0; rc == 0 && i < h.ndevices; i++) sink += (unsigned)strlen(h.devices[i].name);
    if (rc == 0) sink += (unsigned)(strlen(h.token) + strlen(h.host) + strlen(h.exe));
    cm_wire_hello_release(&h);
    break;
  }
  case CM_WIRE_SCHEMA: {
    cm_wire_schema s;
    int rc = cm_wire_decode_schema(f, &s);
    check_rc(rc);
    for (uint32_t k = 0; rc == 0 && k < s.nkinds; k++)
      for (uint32_t i = 0; i < s.kinds[k].nfields; i++) sink += (unsigned)strlen(s.kinds[k].fields[i].name);
    if (rc == 0) {
      cm_wire_schema_release(schema);
      *schema = s;
    }
    break;
  }
  case CM_WIRE_STRINGS: {
    cm_wire_strings s;
    int rc = cm_wire_decode_strings(f, &s);
    check_rc(rc);
    for (uint32_t i = 0; rc == 0 && i < s.count; i++) {
      if (s.entries[i].bytes[s.entries[i].len] != 0) abort();
      for (uint32_t j = 0; j < s.entries[i].len; j++) sink += (uint8_t)s.entries[i].bytes[j];
    }
    cm_wire_strings_release(&s);
    break;
  }
  case CM_WIRE_STATS:
  case CM_WIRE_CONFIGURE: {
    cm_wire_kvlist l;
    int rc = cm_wire_decode_kvlist(f, &l);
    check_rc(rc);
    for (uint32_t i = 0; rc == 0 && i < l.count; i++) sink += (unsigned)strlen(l.items[i].name);
    cm_wire_kvlist_release(&l);
    break;
  }
  case CM_WIRE_BATCH: {
    static cm_wire_batch wb;
    int rc = cm_wire_decode_batch(f, schema, &wb);
    if (rc == CM_EINVAL && ((uintptr_t)f->payload & 7)) break;
    check_rc(rc);
    for (uint32_t i = 0; rc == 0 && i < wb.batch.ncols; i++) {
      if ((uintptr_t)wb.cols[i].data & 7) abort();
      const uint8_t *p = wb.cols[i].data;
      for (uint64_t j = 0; j < (uint64_t)wb.batch.n * wb.cols[i].width; j++) sink += p[j];
      if (wb.cols[i].name) sink += (unsigned)strlen(wb.cols[i].name);
    }
    break;
  }
  case CM_WIRE_FLUSH_DONE: check_rc(cm_wire_decode_flush_done(f, NULL, NULL)); break;
  case CM_WIRE_BYE: {
    cm_wire_bye b;
    int rc = cm_wire_decode_bye(f, &b);
    check_rc(rc);
    if (rc == 0) sink += (unsigned)strlen(b.message);
    break;
  }
  case CM_WIRE_HELLO_ACK: check_rc(cm_wire_decode_hello_ack(f, NULL, NULL)); break;
  case CM_WIRE_SELECT: check_rc(cm_wire_decode_select(f, NULL, NULL)); break;
  case CM_WIRE_FLUSH: check_rc(cm_wire_decode_flush(f, NULL, NULL, NULL)); break;
  case CM_WIRE_PM: check_rc(cm_wire_decode_pm(f, NULL, NULL)); break;
  case CM_WIRE_PM_STATUS: check_rc(cm_wire_decode_pm_status(f, NULL, NULL, NULL)); break;
  default: abort(); /* the reader must never yield a type it does not know */
  }
}

static void run_reader(const uint8_t *p, size_t n, uint32_t flags, size_t chunk) {
  uint64_t resyncs = 0;
  cm_wire_reader *r;
  if (cm_wire_reader_new(&r, flags) != 0) abort();
  cm_wire_schema schema = {0};
  cm_wire_frame f;
  int rc = 0;
  for (size_t off = 0; off < n && rc >= 0;) {
    size_t k = n - off < chunk ? n - off : chunk;
    rc = cm_wire_reader_feed(r, p + off, k);
    off += k;
    while (rc >= 0 && (rc = cm_wire_reader_next(r, &f)) == 1) {
      if ((uintptr_t)f.payload & 7 || f.len % 8) abort();
      /* A skipped stretch is counted once, with a message, and never without the flag. */
      uint64_t skipped, nr = cm_wire_reader_resyncs(r, &skipped);
      if (nr < resyncs || (nr && !(flags & CM_WIRE_READER_RESYNC)) || (nr && !cm_wire_reader_resync_msg(r)[0]) ||
          skipped < nr)
        abort();
      resyncs = nr;
      decode(&f, &schema);
    }
  }
  if (rc == 0) rc = cm_wire_reader_end(r);
  if (rc < 0 && cm_wire_reader_errmsg(r)[0] == 0) abort();
  cm_wire_schema_release(&schema);
  cm_wire_reader_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  uint8_t mode = data[0] & 3, arg = data[1];
  uint32_t resync = data[0] & 4 ? CM_WIRE_READER_RESYNC : 0;
  const uint8_t *p = data + 2;
  size_t n = size - 2;
  switch (mode) {
  case 0:
  case 1: run_reader(p, n, (mode == 1 ? CM_WIRE_READER_CAPTURE : 0) | resync, arg ? arg : n + 1); break;
  case 2: {
    /* An exact-size copy; malloc's alignment keeps the batch decoder's alignment rule. */
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) return 0;
    if (n) memcpy(copy, p, n);
    cm_wire_frame f = {types[arg % NTYPES], 0, CM_WIRE_MAJOR, CM_WIRE_MINOR, 0, n, copy, NULL};
    cm_wire_schema schema = {0};
    if (f.type != 200) decode(&f, &schema);
    cm_wire_schema_release(&schema);
    free(copy);
    break;
  }
  case 3: {
    cm_wire_buf b;
    cm_wire_buf_init(&b);
    for (size_t off = 0; off + 3 <= n;) {
      uint32_t type = types[p[off] % NTYPES];
      size_t len = (size_t)p[off + 1] | ((size_t)p[off + 2] << 8);
      off += 3;
      if (len > n - off) len = n - off;
      if (cm_wire_write_frame(&b, type, 0, type == 200 ? CM_WIRE_MINOR + 1 : CM_WIRE_MINOR, p + off, len))
        abort();
      off += len;
    }
    if (resync && b.len) b.data[((size_t)arg * 131) % b.len] ^= 0x20;
    run_reader(b.data, b.len, resync, arg ? (size_t)arg * 8 : b.len + 1);
    cm_wire_buf_free(&b);
    break;
  }
  }
  return 0;
}
