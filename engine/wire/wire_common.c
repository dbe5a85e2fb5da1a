/*
 * wire_common.c: what the wire's writers and readers share: the CRC32C of every header and
 * payload, the names of the frame types, the widths of the column types, and the capture file's
 * magic. The writers are in wire_writer.c, the stream reader and the capture reader in
 * wire_reader.c, the payload decoders in wire_decode.c; docs/wire.md defines the bytes.
 *
 * Thread rules: everything here may be called from any thread. The CRC tables are built once
 * under pthread_once, and the choice between the SSE4.2 instruction and the table is stored
 * atomically.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "wire_internal.h"

/* ---- CRC32C ------------------------------------------------------------------------------ */

/* Slicing-by-8: table k maps a byte that is k positions before the end of an 8-byte block to
 * its contribution, so that eight bytes are folded with eight lookups and no per-bit work. */
static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    crc_tab[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++)
      crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xFF];
}

/* The table-driven CRC32C, on any CPU. Internal (hidden): test_wire compares it with the
 * hardware one. */
uint32_t cm__wire_crc32c_table(uint32_t crc, const void *data, size_t len) {
  pthread_once(&crc_once, crc_init);
  const uint8_t *p = data;
  uint32_t c = ~crc;
  while (len >= 8) {
    uint32_t lo = c ^ ld32(p), hi = ld32(p + 4);
    c = crc_tab[7][lo & 0xFF] ^ crc_tab[6][(lo >> 8) & 0xFF] ^ crc_tab[5][(lo >> 16) & 0xFF] ^
        crc_tab[4][lo >> 24] ^ crc_tab[3][hi & 0xFF] ^ crc_tab[2][(hi >> 8) & 0xFF] ^
        crc_tab[1][(hi >> 16) & 0xFF] ^ crc_tab[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len--) c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 0xFF];
  return ~c;
}

/* x86-64 with SSE4.2 has CRC32C (the Castagnoli polynomial, reflected, as the table) in one
 * instruction, eight bytes at a time: several times the table's speed, which matters because
 * every BATCH frame's payload is checksummed by the agent and again by the monitor. The CPU is
 * asked once; others use the table. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data,
                                                                size_t len) {
  const uint8_t *p = data;
  uint64_t c = (uint32_t)~crc;
  while (len >= 8) {
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian, as the table's ld32 pairs */
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    len -= 8;
  }
  uint32_t c32 = (uint32_t)c;
  while (len--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return ~c32;
}

static uint32_t (*_Atomic crc_impl)(uint32_t, const void *, size_t);

uint32_t cm_wire_crc32c(uint32_t crc, const void *data, size_t len) {
  uint32_t (*f)(uint32_t, const void *, size_t) = atomic_load_explicit(&crc_impl, memory_order_relaxed);
  if (!f) {
    __builtin_cpu_init();
    f = __builtin_cpu_supports("sse4.2") ? crc32c_sse42 : cm__wire_crc32c_table;
    atomic_store_explicit(&crc_impl, f, memory_order_relaxed);
  }
  return f(crc, data, len);
}
#else
uint32_t cm_wire_crc32c(uint32_t crc, const void *data, size_t len) {
  return cm__wire_crc32c_table(crc, data, len);
}
#endif

/* ---- Frame types and widths -------------------------------------------------------------- */

const char *cm_wire_type_name(uint32_t type) {
  switch (type) {
  case CM_WIRE_HELLO: return "HELLO";
  case CM_WIRE_SCHEMA: return "SCHEMA";
  case CM_WIRE_STRINGS: return "STRINGS";
  case CM_WIRE_BATCH: return "BATCH";
  case CM_WIRE_STATS: return "STATS";
  case CM_WIRE_FLUSH_DONE: return "FLUSH_DONE";
  case CM_WIRE_BYE: return "BYE";
  case CM_WIRE_PM_STATUS: return "PM_STATUS";
  case CM_WIRE_HELLO_ACK: return "HELLO_ACK";
  case CM_WIRE_SELECT: return "SELECT";
  case CM_WIRE_CONFIGURE: return "CONFIGURE";
  case CM_WIRE_FLUSH: return "FLUSH";
  case CM_WIRE_PM: return "PM";
  default: return NULL;
  }
}

/* The width a known cm_type requires, 0 for a type this version does not know. */
static uint32_t type_width(uint32_t type) {
  switch (type) {
  case CM_TYPE_U8: case CM_TYPE_I8: return 1;
  case CM_TYPE_U16: case CM_TYPE_I16: return 2;
  case CM_TYPE_U32: case CM_TYPE_I32: case CM_TYPE_STR: return 4;
  case CM_TYPE_U64: case CM_TYPE_I64: case CM_TYPE_F64: return 8;
  default: return 0;
  }
}

/* A column's (type, width) is acceptable when the width is a power of two up to 8 and, for a
 * known type, is that type's width. Unknown types (a newer minor) pass so they can be skipped
 * by the consumer; their width still bounds the data. */
int cm__wire_type_width_ok(uint32_t type, uint32_t width) {
  if (width != 1 && width != 2 && width != 4 && width != 8) return 0;
  uint32_t w = type_width(type);
  return w == 0 || w == width;
}

/* docs/wire.md, "Capture file header". */
const uint8_t cm__wire_file_magic[8] = {'C', 'U', 'P', 'T', 'I', 'M', 'O', 'N'};
