/*
 * fuzz_monitor.h: what the monitor's fuzz targets (fuzz_wsrc_frame.c, fuzz_replay.c) share: the
 * record form of their inputs and the observer sets they apply.
 *
 * Design note. Random bytes almost never carry a valid CRC32C, so most of an input is a list of
 * records {u8 type index, u16 little-endian length, bytes}: each becomes one frame of the type
 * the index picks (fuzz_types), with correct checksums, so the fuzzer spends its time in what
 * the monitor does with frames rather than in the checksum check. The index past the last type
 * is RAW: its bytes go into the stream as they are, unframed (junk for the replay's
 * resynchronization). Observer sets come from a few bits of the input's first byte.
 */
#ifndef CM_FUZZ_MONITOR_H
#define CM_FUZZ_MONITOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuptimon_wire.h"
#include "host_stubs.h"

static const uint32_t fuzz_types[] = {CM_WIRE_HELLO,      CM_WIRE_SCHEMA, CM_WIRE_STRINGS, CM_WIRE_BATCH,
                                      CM_WIRE_STATS,      CM_WIRE_BYE,    CM_WIRE_FLUSH_DONE,
                                      CM_WIRE_HELLO_ACK,  CM_WIRE_SELECT, 200 /* unknown, newer minor */};
enum { FUZZ_NTYPES = sizeof fuzz_types / sizeof fuzz_types[0], FUZZ_RAW = FUZZ_NTYPES };

/* Appends the frames (and raw bytes) the records in p[0..n) describe to b. Raw records are
 * skipped when `raw` is 0. */
static inline void fuzz_records(cm_wire_buf *b, const uint8_t *p, size_t n, int raw) {
  for (size_t off = 0; off + 3 <= n;) {
    unsigned t = p[off] % (FUZZ_NTYPES + 1);
    size_t len = (size_t)p[off + 1] | ((size_t)p[off + 2] << 8);
    off += 3;
    if (len > n - off) len = n - off;
    if (t == FUZZ_RAW) {
      if (raw && len) {
        /* Appended by hand: a frame writer would pad and frame them. The buffer is realloc'd
         * memory, as the writers keep it. */
        if (b->len + len > b->cap) {
          uint8_t *q = realloc(b->data, (b->len + len) * 2);
          if (!q) abort();
          b->data = q;
          b->cap = (b->len + len) * 2;
        }
        memcpy(b->data + b->len, p + off, len);
        b->len += len;
      }
    } else {
      uint32_t type = fuzz_types[t];
      if (cm_wire_write_frame(b, type, 0, type == 200 ? CM_WIRE_MINOR + 1 : CM_WIRE_MINOR, p + off, len)) abort();
    }
    off += len;
  }
}

/* Adds the stub observers that bits 0..2 of `sel` pick. */
static inline void fuzz_observers(unsigned sel) {
  if (sel & 1) stub_host_observe("kernel;memcpy");
  if (sel & 2) stub_host_observe("concurrent_kernel:all;memcpy:all;runtime:all;marker:all");
  if (sel & 4) stub_host_observe("concurrent_kernel:start,name;memset:bytes");
}

#endif /* CM_FUZZ_MONITOR_H */
