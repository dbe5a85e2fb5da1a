/*
 * wire_internal.h: what the files of the wire share and nothing else sees: little-endian access,
 * the payload layouts and bounds that the writers and the decoders must agree on, and the calls
 * between those files. The public API is engine/include/cuptimon_wire.h.
 */
#ifndef CM_WIRE_INTERNAL_H
#define CM_WIRE_INTERNAL_H

#include <stdint.h>

#include "cuptimon_wire.h"

/* ---- Little-endian access ---------------------------------------------------------------- */

/* Loads and stores go through bytes so that they are correct on any host and at any alignment. */
static inline uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ld32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }
static inline void st16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void st32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void st64(uint8_t *p, uint64_t v) {
  st32(p, (uint32_t)v);
  st32(p + 4, (uint32_t)(v >> 32));
}

static inline uint64_t align8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }

/* ---- Bounds and layouts ------------------------------------------------------------------ */

/* Reader caps on counts, besides the bytes-left checks. They bound allocations further. */
enum {
  MAX_ARGC = 65536,
  MAX_DEVICES = 1024,
  MAX_KINDS = 1024,
  MAX_STRINGS = 1u << 24,
  MAX_KVS = 65536
};

/* Must-understand flag bits: a reader rejects a frame (or file) with one it does not know. */
#define FRAME_MUST_UNDERSTAND 0x00FFu
#define FILE_MUST_UNDERSTAND 0x0000FFFFu

/* The capture file's magic, "CUPTIMON" (docs/wire.md, "Capture file header"). */
extern const uint8_t cm__wire_file_magic[8];

/* Batch payload: a 24-byte head, a 24-byte descriptor per column, then the columns' data, each
 * at an 8-aligned offset (relative to the payload, hence to the frame) in descriptor order. */
enum { BATCH_HEAD = 24, BATCH_DESC = 24 };

/* ---- wire_common.c ----------------------------------------------------------------------- */

/* The table-driven CRC32C, on any CPU. test_wire compares it with the hardware one. */
uint32_t cm__wire_crc32c_table(uint32_t crc, const void *data, size_t len);
/* A column's (type, width) is acceptable when the width is a power of two up to 8 and, for a
 * known type, is that type's width. Unknown types (a newer minor) pass so they can be skipped
 * by the consumer; their width still bounds the data. */
int cm__wire_type_width_ok(uint32_t type, uint32_t width);

/* ---- wire_reader.c ----------------------------------------------------------------------- */

/* Writes the reader's message (cm_wire_reader_errmsg) without making the error sticky, and
 * returns `err`: a decoder's complaint about one frame. `r` may be NULL. */
int cm__wire_reader_say(cm_wire_reader *r, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* CM_WIRE_INTERNAL_H */
