/*
 * wire.c: the cuptimon wire format: CRC32C, frame writers, the streaming reader, the payload
 * decoders and the capture file reader.
 *
 * Design note. docs/wire.md defines the bytes; this file implements them for both directions.
 *
 * Writers append a frame to a cm_wire_buf in one pass: they reserve the 24-byte header, append
 * the payload, pad it with zeros to a multiple of 8, then compute the payload CRC and fill the
 * header. A failed writer restores the buffer's length, so a buffer never holds half a frame.
 *
 * The reader is the trust boundary. It accumulates fed bytes in one malloc'd buffer whose start
 * is also the start of the oldest unconsumed frame, so every frame it yields is 8-byte aligned
 * (malloc aligns to 16, headers are 24 bytes and payloads multiples of 8). It trusts nothing in
 * a header until the header's own CRC matches, so a corrupt length field is reported at once
 * rather than making the reader wait for bytes that never come; then it checks the version, the
 * must-understand flags, the size cap and the payload CRC. Errors are sticky: once a stream is
 * known bad, no later frame is yielded from it. With CM_WIRE_READER_RESYNC (capture files), a
 * corrupt frame instead starts a skipped stretch: the reader scans byte by byte for the next
 * "CM" whose header and payload check out, moves that frame to the aligned buffer start if it
 * is off the 8-byte grid, and reports the stretch once (docs/wire.md, "Resynchronizing"). The
 * payload bytes checked in vain within a stretch are bounded by the bytes skipped, so crafted
 * overlapping headers cannot make the scan quadratic.
 *
 * Decoders run over a verified payload with a cursor whose every read is bounds-checked against
 * what remains. Counts are checked against the bytes left before anything is allocated (each
 * element has a minimum encoded size), so a hostile count cannot cause a large allocation, and
 * every size computation is done in 64 bits from values that cannot overflow there (a count is
 * at most 2^32 and a width at most 8).
 *
 * Thread rules: none of these objects is shared; the CRC tables are built once under
 * pthread_once.
 */
#include "cuptimon_wire.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- Little-endian access ---------------------------------------------------------------- */

/* Loads and stores go through bytes so that they are correct on any host and at any alignment. */
static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }
static void st16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void st32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void st64(uint8_t *p, uint64_t v) {
  st32(p, (uint32_t)v);
  st32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t align8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }

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
uint32_t cm__wire_crc32c_table(uint32_t crc, const void *data, size_t len);
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
static int type_width_ok(uint32_t type, uint32_t width) {
  if (width != 1 && width != 2 && width != 4 && width != 8) return 0;
  uint32_t w = type_width(type);
  return w == 0 || w == width;
}

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

static const uint8_t file_magic[8] = {'C', 'U', 'P', 'T', 'I', 'M', 'O', 'N'};

/* ---- Buffer ------------------------------------------------------------------------------ */

void cm_wire_buf_init(cm_wire_buf *b) { memset(b, 0, sizeof *b); }

void cm_wire_buf_free(cm_wire_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

void cm_wire_buf_clear(cm_wire_buf *b) { b->len = 0; }

/* Makes room for `more` bytes past len. */
static int buf_reserve(cm_wire_buf *b, size_t more) {
  if (more > SIZE_MAX - b->len) return CM_ENOMEM;
  size_t need = b->len + more;
  if (need <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
  uint8_t *p = realloc(b->data, cap);
  if (!p) return CM_ENOMEM;
  b->data = p;
  b->cap = cap;
  return 0;
}

/* An encoder for one frame. Appends fail softly: the first failure is remembered, later appends
 * do nothing, and frame_end reports it and rolls the buffer back. */
typedef struct enc {
  cm_wire_buf *b;
  size_t start; /* where the frame header begins */
  int err;
} enc;

static void enc_put(enc *e, const void *p, size_t n) {
  if (e->err || n == 0) return;
  if ((e->err = buf_reserve(e->b, n)) != 0) return;
  memcpy(e->b->data + e->b->len, p, n);
  e->b->len += n;
}
static void enc_u32(enc *e, uint32_t v) {
  uint8_t t[4];
  st32(t, v);
  enc_put(e, t, 4);
}
static void enc_u64(enc *e, uint64_t v) {
  uint8_t t[8];
  st64(t, v);
  enc_put(e, t, 8);
}
/* A string is a u32 length, the bytes and one NUL, with no padding. */
static void enc_bytes(enc *e, const char *s, uint32_t n) {
  static const uint8_t nul = 0;
  enc_u32(e, n);
  enc_put(e, s, n);
  enc_put(e, &nul, 1);
}
static void enc_str(enc *e, const char *s) {
  if (!s) s = "";
  size_t n = strlen(s);
  if (n > UINT32_MAX) {
    e->err = CM_EINVAL;
    return;
  }
  enc_bytes(e, s, (uint32_t)n);
}
static void enc_pad8(enc *e) {
  static const uint8_t zeros[8];
  size_t body = e->b->len - e->start;
  if (!e->err) enc_put(e, zeros, (size_t)(align8(body) - body));
}

static void frame_begin(enc *e, cm_wire_buf *b) {
  e->b = b;
  e->start = b->len;
  e->err = 0;
  uint8_t hdr[CM_WIRE_FRAME_HEADER_SIZE] = {0};
  enc_put(e, hdr, sizeof hdr);
}

/* Pads the payload, fills the header and verifies the payload fits the reader's cap. */
static int frame_end(enc *e, uint32_t type, uint32_t flags, uint32_t minor) {
  enc_pad8(e);
  if (!e->err) {
    uint64_t plen = e->b->len - e->start - CM_WIRE_FRAME_HEADER_SIZE;
    if (plen > CM_WIRE_MAX_PAYLOAD || type > 0xFFFF || flags > 0xFFFF || minor > 0xFF) {
      e->err = CM_EINVAL;
    } else {
      uint8_t *h = e->b->data + e->start;
      h[0] = 'C';
      h[1] = 'M';
      h[2] = CM_WIRE_MAJOR;
      h[3] = (uint8_t)minor;
      st16(h + 4, (uint16_t)type);
      st16(h + 6, (uint16_t)flags);
      st64(h + 8, plen);
      st32(h + 16, cm_wire_crc32c(0, h + CM_WIRE_FRAME_HEADER_SIZE, (size_t)plen));
      st32(h + 20, cm_wire_crc32c(0, h, 20));
    }
  }
  if (e->err) e->b->len = e->start;
  return e->err;
}

int cm_wire_write_file_header(cm_wire_buf *b, uint32_t flags) {
  if (!b || flags != 0) return CM_EINVAL;
  int rc = buf_reserve(b, CM_WIRE_FILE_HEADER_SIZE);
  if (rc) return rc;
  uint8_t *h = b->data + b->len;
  memcpy(h, file_magic, 8);
  st16(h + 8, CM_WIRE_MAJOR);
  st16(h + 10, CM_WIRE_MINOR);
  st32(h + 12, flags);
  st32(h + 16, 0);
  st32(h + 20, cm_wire_crc32c(0, h, 20));
  b->len += CM_WIRE_FILE_HEADER_SIZE;
  return 0;
}

int cm_wire_write_frame(cm_wire_buf *b, uint32_t type, uint32_t flags, uint32_t minor,
                        const void *payload, size_t len) {
  if (!b || (len && !payload)) return CM_EINVAL;
  enc e;
  frame_begin(&e, b);
  enc_put(&e, payload, len);
  return frame_end(&e, type, flags, minor);
}

int cm_wire_write_hello(cm_wire_buf *b, const cm_wire_hello *h) {
  if (!b || !h || h->argc > MAX_ARGC || h->ndevices > MAX_DEVICES ||
      (h->argc && !h->argv) || (h->ndevices && !h->devices) || h->nenv > CM_WIRE_MAX_ENV ||
      (h->nenv && !h->env))
    return CM_EINVAL;
  enc e;
  frame_begin(&e, b);
  enc_u32(&e, h->pid);
  enc_u32(&e, h->ppid);
  enc_u32(&e, h->cupti_version);
  enc_u32(&e, h->flags);
  enc_u64(&e, h->clock_realtime_ns);
  enc_u64(&e, h->clock_cupti_ns);
  enc_str(&e, h->token);
  enc_str(&e, h->host);
  enc_str(&e, h->exe);
  enc_u32(&e, h->argc);
  for (uint32_t i = 0; i < h->argc; i++) enc_str(&e, h->argv[i]);
  enc_u32(&e, h->ndevices);
  for (uint32_t i = 0; i < h->ndevices; i++) {
    const cm_wire_device *d = &h->devices[i];
    enc_u32(&e, d->index);
    enc_u32(&e, d->has_uuid ? 1 : 0);
    enc_put(&e, d->uuid, 16);
    enc_str(&e, d->name);
  }
  enc_u32(&e, h->nenv);
  for (uint32_t i = 0; i < h->nenv; i++) enc_str(&e, h->env[i]);
  return frame_end(&e, CM_WIRE_HELLO, 0, CM_WIRE_MINOR);
}

int cm_wire_write_schema(cm_wire_buf *b, const cm_wire_schema *s) {
  if (!b || !s || s->nkinds > MAX_KINDS || (s->nkinds && !s->kinds)) return CM_EINVAL;
  for (uint32_t k = 0; k < s->nkinds; k++) {
    const cm_wire_kind *kd = &s->kinds[k];
    if (kd->nfields > CM_WIRE_MAX_COLS || (kd->nfields && !kd->fields)) return CM_EINVAL;
    for (uint32_t i = 0; i < kd->nfields; i++) {
      if (i > 0 && kd->fields[i].id <= kd->fields[i - 1].id) return CM_EINVAL;
      if (!type_width_ok(kd->fields[i].type, kd->fields[i].width)) return CM_EINVAL;
    }
  }
  enc e;
  frame_begin(&e, b);
  enc_u32(&e, s->nkinds);
  for (uint32_t k = 0; k < s->nkinds; k++) {
    const cm_wire_kind *kd = &s->kinds[k];
    enc_u32(&e, kd->kind);
    enc_u32(&e, kd->nfields);
    enc_str(&e, kd->name);
    for (uint32_t i = 0; i < kd->nfields; i++) {
      enc_u32(&e, kd->fields[i].id);
      enc_u32(&e, kd->fields[i].type);
      enc_u32(&e, kd->fields[i].width);
      enc_str(&e, kd->fields[i].name);
    }
  }
  return frame_end(&e, CM_WIRE_SCHEMA, 0, CM_WIRE_MINOR);
}

int cm_wire_write_strings(cm_wire_buf *b, const cm_wire_string *entries, uint32_t count) {
  if (!b || count > MAX_STRINGS || (count && !entries)) return CM_EINVAL;
  for (uint32_t i = 0; i < count; i++)
    if (entries[i].len && !entries[i].bytes) return CM_EINVAL;
  enc e;
  frame_begin(&e, b);
  enc_u32(&e, count);
  for (uint32_t i = 0; i < count; i++) {
    enc_u32(&e, entries[i].id);
    enc_bytes(&e, entries[i].bytes, entries[i].len);
  }
  return frame_end(&e, CM_WIRE_STRINGS, 0, CM_WIRE_MINOR);
}

/* Batch payload: a 24-byte head, a 24-byte descriptor per column, then the columns' data, each
 * at an 8-aligned offset (relative to the payload, hence to the frame) in descriptor order. */
enum { BATCH_HEAD = 24, BATCH_DESC = 24 };

int cm_wire_write_batch(cm_wire_buf *b, const cm_batch *batch) {
  return cm_wire_write_batch_numbered(b, batch, 0);
}

int cm_wire_write_batch_numbered(cm_wire_buf *b, const cm_batch *batch, uint32_t number) {
  if (!b || !batch || batch->ncols > CM_WIRE_MAX_COLS || (batch->ncols && !batch->cols))
    return CM_EINVAL;
  uint64_t off = BATCH_HEAD + (uint64_t)BATCH_DESC * batch->ncols;
  for (uint32_t i = 0; i < batch->ncols; i++) {
    const cm_column *c = &batch->cols[i];
    if (c->field < 0 || c->type < 0 || !type_width_ok((uint32_t)c->type, c->width)) return CM_EINVAL;
    if (i > 0 && c->field <= batch->cols[i - 1].field) return CM_EINVAL;
    if (batch->n && !c->data) return CM_EINVAL;
    off = align8(off + (uint64_t)batch->n * c->width);
  }
  if (off > CM_WIRE_MAX_PAYLOAD || batch->kind < 0) return CM_EINVAL;

  enc e;
  frame_begin(&e, b);
  /* One reservation for the whole frame keeps a million-row batch to a single realloc. */
  if ((e.err = buf_reserve(b, (size_t)off)) != 0) return frame_end(&e, CM_WIRE_BATCH, 0, 0);
  enc_u64(&e, batch->seq);
  enc_u32(&e, (uint32_t)batch->kind);
  enc_u32(&e, batch->n);
  enc_u32(&e, batch->ncols);
  enc_u32(&e, number);
  off = BATCH_HEAD + (uint64_t)BATCH_DESC * batch->ncols;
  for (uint32_t i = 0; i < batch->ncols; i++) {
    const cm_column *c = &batch->cols[i];
    enc_u32(&e, (uint32_t)c->field);
    enc_u32(&e, (uint32_t)c->type);
    enc_u32(&e, c->width);
    enc_u32(&e, 0);
    enc_u64(&e, off);
    off = align8(off + (uint64_t)batch->n * c->width);
  }
  for (uint32_t i = 0; i < batch->ncols; i++) {
    const cm_column *c = &batch->cols[i];
    enc_put(&e, c->data, (size_t)batch->n * c->width);
    enc_pad8(&e);
  }
  return frame_end(&e, CM_WIRE_BATCH, 0, CM_WIRE_MINOR);
}

static int write_kvs(cm_wire_buf *b, uint32_t type, const cm_wire_kv *items, uint32_t count) {
  if (!b || count > MAX_KVS || (count && !items)) return CM_EINVAL;
  enc e;
  frame_begin(&e, b);
  enc_u32(&e, count);
  for (uint32_t i = 0; i < count; i++) {
    enc_u64(&e, items[i].value);
    enc_str(&e, items[i].name);
  }
  return frame_end(&e, type, 0, CM_WIRE_MINOR);
}

int cm_wire_write_stats(cm_wire_buf *b, const cm_wire_kv *items, uint32_t count) {
  return write_kvs(b, CM_WIRE_STATS, items, count);
}

int cm_wire_write_configure(cm_wire_buf *b, const cm_wire_kv *items, uint32_t count) {
  return write_kvs(b, CM_WIRE_CONFIGURE, items, count);
}

int cm_wire_write_flush_done(cm_wire_buf *b, uint64_t flush_id, int32_t status) {
  if (!b) return CM_EINVAL;
  enc e;
  frame_begin(&e, b);
  enc_u64(&e, flush_id);
  enc_u32(&e, (uint32_t)status);
  enc_u32(&e, 0);
  return frame_end(&e, CM_WIRE_FLUSH_DONE, 0, CM_WIRE_MINOR);
}

int cm_wire_write_bye(cm_wire_buf *b, uint32_t reason, int32_t exit_code, const char *message) {
  if (!b) return CM_EINVAL;
  enc e;
  frame_begin(&e, b);
  enc_u32(&e, reason);
  enc_u32(&e, (uint32_t)exit_code);
  enc_str(&e, message);
  return frame_end(&e, CM_WIRE_BYE, 0, CM_WIRE_MINOR);
}

int cm_wire_write_hello_ack(cm_wire_buf *b, int32_t status, const char *message) {
  if (!b) return CM_EINVAL;
  enc e;
  frame_begin(&e, b);
  enc_u32(&e, (uint32_t)status);
  enc_u32(&e, 0);
  enc_str(&e, message);
  return frame_end(&e, CM_WIRE_HELLO_ACK, 0, CM_WIRE_MINOR);
}

int cm_wire_write_select(cm_wire_buf *b, const char *spec) {
  if (!b || !spec) return CM_EINVAL;
  enc e;
  frame_begin(&e, b);
  enc_str(&e, spec);
  return frame_end(&e, CM_WIRE_SELECT, 0, CM_WIRE_MINOR);
}

int cm_wire_write_pm(cm_wire_buf *b, const char *spec) {
  if (!b || !spec) return CM_EINVAL;
  enc e;
  frame_begin(&e, b);
  enc_str(&e, spec);
  return frame_end(&e, CM_WIRE_PM, 0, CM_WIRE_MINOR);
}

/* ---- PM requests ------------------------------------------------------------------------- */

static bool pm_u32(const char *s, size_t n, uint32_t *out) {
  if (!n || n > 10) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  if (v > UINT32_MAX) return false;
  *out = (uint32_t)v;
  return true;
}

int cm_wire_parse_pm(const char *text, size_t len, char *buf, size_t cap, cm_wire_pm_entry *out,
                         uint32_t max, char *why, size_t why_len) {
#define PM_FAIL(...)                        \
  do {                                      \
    snprintf(why, why_len, __VA_ARGS__);    \
    return CM_EINVAL;                       \
  } while (0)
  if (len + 1 > cap) PM_FAIL("the request is %zu bytes, over the bound of %zu", len, cap - 1);
  memcpy(buf, text, len);
  buf[len] = '\0';
  if (memchr(buf, '\0', len)) PM_FAIL("the request holds a NUL byte");
  uint32_t n = 0;
  char *p = buf, *end = buf + len;
  while (p < end) {
    char *semi = memchr(p, ';', (size_t)(end - p));
    char *e = semi ? semi : end;
    *e = '\0';
    if (n == max) PM_FAIL("more than %u devices", max);
    cm_wire_pm_entry *en = &out[n];
    memset(en, 0, sizeof *en);
    char *c1 = strchr(p, ':');
    char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    uint32_t dev = 0;
    if (!c1 || !c2 || !pm_u32(p, (size_t)(c1 - p), &dev) || dev > 1023 ||
        !pm_u32(c1 + 1, (size_t)(c2 - c1 - 1), &en->interval_us))
      PM_FAIL("entry %u is not device:interval_us:metrics", n + 1);
    if (en->interval_us < CM_WIRE_PM_INTERVAL_MIN_US || en->interval_us > CM_WIRE_PM_INTERVAL_MAX_US)
      PM_FAIL("entry %u: interval_us %u is outside [%u, %u]", n + 1, en->interval_us,
              CM_WIRE_PM_INTERVAL_MIN_US, CM_WIRE_PM_INTERVAL_MAX_US);
    en->device = (int)dev;
    char *m = c2 + 1;
    while (*m) {
      char *comma = strchr(m, ',');
      if (comma) *comma = '\0';
      size_t ml = strlen(m);
      if (!ml || ml > CM_WIRE_PM_NAME) PM_FAIL("entry %u: a metric name is empty or too long", n + 1);
      if (en->nmetrics == CM_WIRE_PM_METRICS)
        PM_FAIL("entry %u: more than %u metrics", n + 1, CM_WIRE_PM_METRICS);
      en->metrics[en->nmetrics++] = m;
      if (!comma) break;
      m = comma + 1;
    }
    if (!en->nmetrics) PM_FAIL("entry %u names no metric", n + 1);
    n++;
    p = e + 1;
  }
  return (int)n;
#undef PM_FAIL
}

int cm_wire_write_pm_status(cm_wire_buf *b, int32_t status, uint32_t device, const char *message) {
  if (!b) return CM_EINVAL;
  enc e;
  frame_begin(&e, b);
  enc_u32(&e, (uint32_t)status);
  enc_u32(&e, device);
  enc_str(&e, message);
  return frame_end(&e, CM_WIRE_PM_STATUS, 0, CM_WIRE_MINOR);
}

int cm_wire_write_flush(cm_wire_buf *b, uint64_t flush_id, uint32_t flags, uint32_t timeout_ms) {
  if (!b) return CM_EINVAL;
  enc e;
  frame_begin(&e, b);
  enc_u64(&e, flush_id);
  enc_u32(&e, flags);
  enc_u32(&e, timeout_ms);
  return frame_end(&e, CM_WIRE_FLUSH, 0, CM_WIRE_MINOR);
}

/* ---- Reader ------------------------------------------------------------------------------ */

struct cm_wire_reader {
  uint8_t *buf;       /* buf[head..tail) holds the unconsumed bytes */
  size_t cap;
  size_t head;
  size_t tail;
  uint64_t base;      /* the stream offset of buf[0] */
  uint64_t frames;    /* frames yielded */
  uint64_t skipped;   /* unknown newer-minor frames skipped */
  uint32_t flags;     /* CM_WIRE_READER_* */
  int have_file_header;
  uint32_t file_minor;
  int err;            /* sticky error, 0 while the stream is good */
  char msg[CM_WIRE_ERRMSG_SIZE];
  /* Resynchronization (CM_WIRE_READER_RESYNC): while `resyncing`, the bytes from stream offset
   * `resync_at` on are being skipped; `cause` says what was wrong there. */
  int resyncing;
  uint64_t resync_at;
  uint64_t resyncs;        /* corrupt stretches skipped and left behind */
  uint64_t resync_bytes;   /* their total length */
  uint64_t resync_work;    /* payload bytes checked in vain during the current stretch */
  /* The stream's whole length when known (a capture file's size; 0: unknown, a live stream).
   * With CM_WIRE_READER_RESYNC, a frame whose header checks out but that would end past it can
   * never be whole: it is a corrupt stretch like any other, so a crafted header declaring 1 GiB
   * does not hide the frames after it. */
  uint64_t stream_end;
  int resync_truncated;    /* the current stretch began at such a frame */
  char cause[CM_WIRE_ERRMSG_SIZE];
  char note[CM_WIRE_ERRMSG_SIZE + 128];
};

static int set_msg(cm_wire_reader *r, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int set_msg(cm_wire_reader *r, int err, const char *fmt, ...) {
  if (r) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
  }
  return err;
}

/* Records a sticky stream error. */
static int fail(cm_wire_reader *r, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(cm_wire_reader *r, int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->msg, sizeof r->msg, fmt, ap);
  va_end(ap);
  r->err = err;
  return err;
}

/* While resyncing, the payload bytes checked in vain are bounded by this factor times the bytes
 * skipped, plus the minimum. */
enum { RESYNC_WORK_FACTOR = 4, RESYNC_WORK_MIN = 4 << 20 };

/* A corrupt frame at stream offset `at`. Without CM_WIRE_READER_RESYNC it is a sticky error.
 * With it, the reader starts (or goes on) skipping: it steps one byte past `at` and scans from
 * there for the next frame that passes every check (see cm_wire_reader_next). */
static int corrupt(cm_wire_reader *r, uint64_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int corrupt(cm_wire_reader *r, uint64_t at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (!(r->flags & CM_WIRE_READER_RESYNC)) {
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->err = CM_EIO;
    return CM_EIO;
  }
  if (!r->resyncing) {
    vsnprintf(r->cause, sizeof r->cause, fmt, ap);
    r->resyncing = 1;
    r->resync_at = at;
    r->resync_truncated = 0;
  }
  va_end(ap);
  r->head++;
  return 0;
}

/* The frame at buf[head] passed every check: a stretch being skipped ends here. */
static void resync_done(cm_wire_reader *r) {
  if (!r->resyncing) return;
  uint64_t at = r->base + r->head, n = at - r->resync_at;
  r->resyncing = 0;
  r->resync_work = 0;
  r->resyncs++;
  r->resync_bytes += n;
  snprintf(r->note, sizeof r->note, "%s; skipped %llu bytes from byte %llu to the next valid frame at byte %llu",
           r->cause, (unsigned long long)n, (unsigned long long)r->resync_at, (unsigned long long)at);
}

/* While resyncing: drops bytes up to the next "CM" at or after head. Returns 1 when a candidate
 * with a whole header is at head, 0 when more bytes are needed. */
static int resync_scan(cm_wire_reader *r) {
  while (r->head < r->tail) {
    const uint8_t *p = memchr(r->buf + r->head, 'C', r->tail - r->head);
    if (!p) {
      r->head = r->tail;
      return 0;
    }
    r->head = (size_t)(p - r->buf);
    if (r->head + 1 == r->tail) return 0; /* the byte after the 'C' has not come yet */
    if (p[1] != 'M') {
      r->head++;
      continue;
    }
    return r->tail - r->head >= CM_WIRE_FRAME_HEADER_SIZE;
  }
  return 0;
}

int cm_wire_reader_new(cm_wire_reader **out, uint32_t flags) {
  if (!out || (flags & ~(uint32_t)(CM_WIRE_READER_CAPTURE | CM_WIRE_READER_RESYNC))) return CM_EINVAL;
  cm_wire_reader *r = calloc(1, sizeof *r);
  if (!r) return CM_ENOMEM;
  r->flags = flags;
  *out = r;
  return 0;
}

void cm_wire_reader_free(cm_wire_reader *r) {
  if (!r) return;
  free(r->buf);
  free(r);
}

const char *cm_wire_reader_errmsg(const cm_wire_reader *r) { return r ? r->msg : ""; }
uint64_t cm_wire_reader_frames(const cm_wire_reader *r) { return r->frames; }
uint64_t cm_wire_reader_skipped(const cm_wire_reader *r) { return r->skipped; }
uint32_t cm_wire_reader_file_minor(const cm_wire_reader *r) { return r->file_minor; }
uint64_t cm_wire_reader_resyncs(const cm_wire_reader *r, uint64_t *bytes_skipped) {
  if (bytes_skipped) *bytes_skipped = r ? r->resync_bytes : 0;
  return r ? r->resyncs : 0;
}
const char *cm_wire_reader_resync_msg(const cm_wire_reader *r) { return r ? r->note : ""; }

uint64_t cm_wire_reader_pending(const cm_wire_reader *r) {
  if (!r) return 0;
  size_t avail = r->tail - r->head;
  const uint8_t *h = r->buf + r->head;
  if (avail >= CM_WIRE_FRAME_HEADER_SIZE && !r->resyncing && h[0] == 'C' && h[1] == 'M' &&
      cm_wire_crc32c(0, h, 20) == ld32(h + 20) && ld64(h + 8) <= CM_WIRE_MAX_PAYLOAD) {
    uint64_t whole = CM_WIRE_FRAME_HEADER_SIZE + ld64(h + 8);
    return whole > avail ? whole : avail;
  }
  return avail;
}

/* Tells a resynchronizing reader the stream's whole length (see stream_end). A file reader calls
 * it with the file's size before each read and with the exact length at its end. */
static void reader_set_end(cm_wire_reader *r, uint64_t end) {
  if (end >= r->base + r->tail) r->stream_end = end;
}

int cm_wire_reader_feed(cm_wire_reader *r, const void *data, size_t len) {
  if (!r || (len && !data)) return CM_EINVAL;
  if (r->err) return r->err;
  if (len == 0) return 0;
  /* Slide the unconsumed bytes to the front, which invalidates frames yielded before. */
  if (r->head > 0) {
    memmove(r->buf, r->buf + r->head, r->tail - r->head);
    r->base += r->head;
    r->tail -= r->head;
    r->head = 0;
  }
  if (len > r->cap - r->tail) {
    if (len > SIZE_MAX / 2 - r->tail) return fail(r, CM_ENOMEM, "stream buffer size overflow");
    size_t need = r->tail + len, cap = r->cap ? r->cap : 4096;
    while (cap < need) cap *= 2;
    uint8_t *p = realloc(r->buf, cap);
    if (!p) return set_msg(r, CM_ENOMEM, "out of memory growing the stream buffer to %zu bytes", cap);
    r->buf = p;
    r->cap = cap;
  }
  memcpy(r->buf + r->tail, data, len);
  r->tail += len;
  return 0;
}

/* Checks the capture file header at buf[head]; 24 bytes are present. */
static int read_file_header(cm_wire_reader *r) {
  const uint8_t *h = r->buf + r->head;
  uint64_t at = r->base + r->head;
  if (memcmp(h, file_magic, 8) != 0)
    return fail(r, CM_EIO, "not a cuptimon capture: bad file magic at byte %llu (expected \"CUPTIMON\")",
                (unsigned long long)at);
  uint32_t major = ld16(h + 8), minor = ld16(h + 10), flags = ld32(h + 12);
  if (cm_wire_crc32c(0, h, 20) != ld32(h + 20)) {
    if (major != CM_WIRE_MAJOR)
      return fail(r, CM_EIO,
                  "bad file header checksum at byte %llu (it claims wire version %u.%u; this "
                  "reader supports major %d)", (unsigned long long)at, major, minor, CM_WIRE_MAJOR);
    return fail(r, CM_EIO, "bad file header checksum at byte %llu", (unsigned long long)at);
  }
  if (major != CM_WIRE_MAJOR)
    return fail(r, CM_ENOSYS,
                "capture has wire format version %u.%u; this reader supports major version %d "
                "only (use a newer cuptimon)", major, minor, CM_WIRE_MAJOR);
  if (flags & FILE_MUST_UNDERSTAND)
    return fail(r, CM_ENOSYS, "capture file header has unknown required flags 0x%x at byte %llu",
                flags & FILE_MUST_UNDERSTAND, (unsigned long long)at);
  r->file_minor = minor;
  r->have_file_header = 1;
  r->head += CM_WIRE_FILE_HEADER_SIZE;
  return 0;
}

int cm_wire_reader_next(cm_wire_reader *r, cm_wire_frame *f) {
  if (!r || !f) return CM_EINVAL;
  for (;;) {
    if (r->err) return r->err;
    size_t avail = r->tail - r->head;
    if ((r->flags & CM_WIRE_READER_CAPTURE) && !r->have_file_header) {
      if (avail < CM_WIRE_FILE_HEADER_SIZE) return 0;
      int rc = read_file_header(r);
      if (rc) return rc;
      continue;
    }
    if (r->resyncing && !resync_scan(r)) return 0;
    avail = r->tail - r->head;
    if (avail < CM_WIRE_FRAME_HEADER_SIZE) return 0;
    const uint8_t *h = r->buf + r->head;
    uint64_t at64 = r->base + r->head;
    unsigned long long at = (unsigned long long)at64;
    if (h[0] != 'C' || h[1] != 'M') {
      if (corrupt(r, at64, "bad frame magic at byte %llu (expected \"CM\", found 0x%02x 0x%02x)", at,
                  h[0], h[1]))
        return r->err;
      continue;
    }
    uint32_t major = h[2], minor = h[3], type = ld16(h + 4), flags = ld16(h + 6);
    uint64_t len = ld64(h + 8);
    if (cm_wire_crc32c(0, h, 20) != ld32(h + 20)) {
      int rc = major != CM_WIRE_MAJOR
                   ? corrupt(r, at64, "bad header checksum at byte %llu (the header claims wire major "
                             "version %u; this reader supports %d)", at, major, CM_WIRE_MAJOR)
                   : corrupt(r, at64, "bad header checksum at byte %llu", at);
      if (rc) return rc;
      continue;
    }
    if (major != CM_WIRE_MAJOR)
      return fail(r, CM_ENOSYS,
                  "frame at byte %llu has wire format version %u.%u; this reader supports major "
                  "version %d only (use a newer cuptimon)", at, major, minor, CM_WIRE_MAJOR);
    if (len > CM_WIRE_MAX_PAYLOAD) {
      if (!(r->flags & CM_WIRE_READER_RESYNC))
        return fail(r, CM_ERANGE, "frame at byte %llu declares a %llu-byte payload, over the cap of "
                    "%llu bytes", at, (unsigned long long)len, (unsigned long long)CM_WIRE_MAX_PAYLOAD);
      corrupt(r, at64, "frame at byte %llu declares a %llu-byte payload, over the cap of %llu bytes", at,
              (unsigned long long)len, (unsigned long long)CM_WIRE_MAX_PAYLOAD);
      continue;
    }
    if (len % 8 != 0) {
      if (corrupt(r, at64, "frame at byte %llu declares a payload length of %llu, not a multiple of 8",
                  at, (unsigned long long)len))
        return r->err;
      continue;
    }
    if (avail - CM_WIRE_FRAME_HEADER_SIZE < len) {
      if (!(r->flags & CM_WIRE_READER_RESYNC) || !r->stream_end ||
          at64 + CM_WIRE_FRAME_HEADER_SIZE + len <= r->stream_end)
        return 0;
      int fresh = !r->resyncing;
      corrupt(r, at64, "%llu whole frames, truncated at byte %llu (the frame at byte %llu needs %llu "
              "bytes, %llu present)", (unsigned long long)(r->frames + r->skipped),
              (unsigned long long)r->stream_end, at,
              (unsigned long long)(CM_WIRE_FRAME_HEADER_SIZE + len),
              (unsigned long long)(r->stream_end - at64));
      if (fresh) r->resync_truncated = 1;
      continue;
    }
    if (r->resyncing && r->resync_work + len > RESYNC_WORK_FACTOR * (at64 - r->resync_at) + RESYNC_WORK_MIN) {
      /* Candidates whose headers check out but whose payloads do not are rare in real damage;
       * a stretch full of them is crafted. Their payload checks are bounded by the bytes
       * scanned, so skipping stays linear in the stream's length. */
      corrupt(r, at64, "-");
      continue;
    }
    uint32_t crc = cm_wire_crc32c(0, h + CM_WIRE_FRAME_HEADER_SIZE, (size_t)len);
    if (crc != ld32(h + 16)) {
      if (r->resyncing) r->resync_work += len;
      if (corrupt(r, at64, "bad checksum at byte %llu (%s frame, %llu-byte payload: stored "
                  "0x%08x, computed 0x%08x)", at, cm_wire_type_name(type) ? cm_wire_type_name(type) : "unknown",
                  (unsigned long long)len, ld32(h + 16), crc))
        return r->err;
      continue;
    }
    if (r->head & 7) {
      /* Only after a resync can a frame start off the 8-byte grid: move it to the buffer's
       * (aligned) start, so that its payload is 8-byte aligned as promised. */
      memmove(r->buf, r->buf + r->head, r->tail - r->head);
      r->base += r->head;
      r->tail -= r->head;
      r->head = 0;
      h = r->buf;
    }
    const uint8_t *payload = h + CM_WIRE_FRAME_HEADER_SIZE;
    if (flags & FRAME_MUST_UNDERSTAND)
      return fail(r, CM_ENOSYS, "frame at byte %llu has unknown required flags 0x%x", at,
                  flags & FRAME_MUST_UNDERSTAND);
    size_t whole = CM_WIRE_FRAME_HEADER_SIZE + (size_t)len;
    if (!cm_wire_type_name(type)) {
      if (minor > CM_WIRE_MINOR) {
        /* A type added by a newer minor version: its length lets us step over it. */
        resync_done(r);
        r->skipped++;
        r->head += whole;
        continue;
      }
      if (corrupt(r, at64, "unknown frame type %u at byte %llu (wire version %u.%u)", type, at, major,
                  minor))
        return r->err;
      continue;
    }
    resync_done(r);
    f->type = type;
    f->flags = flags;
    f->major = major;
    f->minor = minor;
    f->offset = r->base + r->head;
    f->len = len;
    f->payload = payload;
    f->reader = r;
    r->head += whole;
    r->frames++;
    return 1;
  }
}

int cm_wire_reader_end(cm_wire_reader *r) {
  if (!r) return CM_EINVAL;
  if (r->err) return r->err;
  unsigned long long whole = (unsigned long long)(r->frames + r->skipped);
  unsigned long long end = (unsigned long long)(r->base + r->tail);
  unsigned long long at = (unsigned long long)(r->base + r->head);
  if ((r->flags & CM_WIRE_READER_CAPTURE) && !r->have_file_header)
    return fail(r, CM_EIO, "0 whole frames, truncated at byte %llu (in the %d-byte file header)", end,
                CM_WIRE_FILE_HEADER_SIZE);
  /* A stretch that began at a frame cut by the end and found no frame after it: the stream is
   * simply truncated (a crafted length hid nothing). */
  if (r->resyncing && r->resync_truncated) return fail(r, CM_EIO, "%s", r->cause);
  if (r->resyncing) {
    /* The stretch the stream ends in counts as skipped too. */
    r->resyncing = 0;
    r->resyncs++;
    r->resync_bytes += end - r->resync_at;
    return fail(r, CM_EIO, "%s; no valid frame in the %llu bytes from byte %llu to the end at byte %llu",
                r->cause, end - (unsigned long long)r->resync_at, (unsigned long long)r->resync_at, end);
  }
  size_t left = r->tail - r->head;
  if (left == 0) return 0;
  if (left < CM_WIRE_FRAME_HEADER_SIZE)
    return fail(r, CM_EIO, "%llu whole frames, truncated at byte %llu (in the header of the frame "
                "at byte %llu)", whole, end, at);
  return fail(r, CM_EIO, "%llu whole frames, truncated at byte %llu (the frame at byte %llu needs "
              "%llu bytes, %zu present)", whole, end, at,
              (unsigned long long)(CM_WIRE_FRAME_HEADER_SIZE + ld64(r->buf + r->head + 8)), left);
}

/* ---- Decoders ---------------------------------------------------------------------------- */

/* A bounds-checked cursor over one payload. The first failure is kept; reads after it return
 * zeros, so decoders check `err` once per element rather than after every read. */
typedef struct cur {
  const uint8_t *p;
  uint64_t n;
  uint64_t at;
  const cm_wire_frame *f;
  int err;
} cur;

static int cur_fail(cur *c, const char *what) {
  if (c->err) return c->err;
  c->err = CM_EIO;
  set_msg(c->f->reader, CM_EIO, "%s frame at byte %llu: %s (payload offset %llu of %llu)",
          cm_wire_type_name(c->f->type) ? cm_wire_type_name(c->f->type) : "unknown",
          (unsigned long long)c->f->offset, what, (unsigned long long)c->at,
          (unsigned long long)c->n);
  return CM_EIO;
}

static uint64_t cur_left(const cur *c) { return c->n - c->at; }

static uint32_t get32(cur *c, const char *what) {
  if (c->err || cur_left(c) < 4) return cur_fail(c, what), 0;
  uint32_t v = ld32(c->p + c->at);
  c->at += 4;
  return v;
}

static uint64_t get64(cur *c, const char *what) {
  if (c->err || cur_left(c) < 8) return cur_fail(c, what), 0;
  uint64_t v = ld64(c->p + c->at);
  c->at += 8;
  return v;
}

/* A string: u32 length, bytes, NUL. With `text`, embedded NULs are refused too, so the C string
 * a consumer sees is the whole value. */
static const char *get_str(cur *c, uint32_t *len_out, int text, const char *what) {
  uint32_t len = get32(c, what);
  if (c->err) return "";
  if ((uint64_t)len >= cur_left(c)) return cur_fail(c, what), "";
  const char *s = (const char *)c->p + c->at;
  if (s[len] != 0) return cur_fail(c, what), "";
  if (text && memchr(s, 0, len)) return cur_fail(c, what), "";
  c->at += (uint64_t)len + 1;
  if (len_out) *len_out = len;
  return s;
}

/* A count of elements each at least `min_size` bytes long, checked against both a fixed cap and
 * the bytes left, so that it can be allocated safely. */
static uint32_t get_count(cur *c, uint64_t min_size, uint32_t cap, const char *what) {
  uint32_t n = get32(c, what);
  if (c->err) return 0;
  if (n > cap || (uint64_t)n * min_size > cur_left(c)) return cur_fail(c, what), 0;
  return n;
}

static int cur_begin(cur *c, const cm_wire_frame *f, uint32_t type) {
  memset(c, 0, sizeof *c);
  c->f = f;
  if (!f || !f->payload || f->type != type) return CM_EINVAL;
  c->p = f->payload;
  c->n = f->len;
  return 0;
}

enum { STR_MIN = 5 }; /* a u32 length and the NUL */

int cm_wire_decode_hello(const cm_wire_frame *f, cm_wire_hello *out) {
  if (!out) return CM_EINVAL;
  memset(out, 0, sizeof *out);
  cur c;
  int rc = cur_begin(&c, f, CM_WIRE_HELLO);
  if (rc) return rc;
  out->pid = get32(&c, "truncated pid");
  out->ppid = get32(&c, "truncated ppid");
  out->cupti_version = get32(&c, "truncated CUPTI version");
  out->flags = get32(&c, "truncated flags");
  out->clock_realtime_ns = get64(&c, "truncated realtime clock");
  out->clock_cupti_ns = get64(&c, "truncated CUPTI clock");
  out->token = get_str(&c, NULL, 1, "bad token string");
  out->host = get_str(&c, NULL, 1, "bad host string");
  out->exe = get_str(&c, NULL, 1, "bad exe string");
  uint32_t argc = get_count(&c, STR_MIN, MAX_ARGC, "bad argv count");
  if (c.err) return c.err;
  const char **argv = calloc(argc + 1, sizeof *argv);
  if (!argv) return CM_ENOMEM;
  out->argv = argv;
  for (uint32_t i = 0; i < argc && !c.err; i++) argv[i] = get_str(&c, NULL, 1, "bad argv string");
  out->argc = argc;
  uint32_t nd = get_count(&c, 4 + 4 + 16 + STR_MIN, MAX_DEVICES, "bad device count");
  if (c.err) return cm_wire_hello_release(out), c.err;
  cm_wire_device *devs = calloc(nd ? nd : 1, sizeof *devs);
  if (!devs) return cm_wire_hello_release(out), CM_ENOMEM;
  out->devices = devs;
  for (uint32_t i = 0; i < nd && !c.err; i++) {
    devs[i].index = get32(&c, "truncated device index");
    devs[i].has_uuid = get32(&c, "truncated device flags");
    if (devs[i].has_uuid > 1) cur_fail(&c, "bad device uuid flag");
    if (!c.err && cur_left(&c) >= 16) memcpy(devs[i].uuid, c.p + c.at, 16), c.at += 16;
    else cur_fail(&c, "truncated device uuid");
    devs[i].name = get_str(&c, NULL, 1, "bad device name");
  }
  out->ndevices = nd;
  if (c.err) return cm_wire_hello_release(out), c.err;
  /* The environment list came after the devices in a later writer. An older HELLO ends with the
   * devices and at most 7 bytes of zero padding: fewer than 4 bytes left means no list, and 4 or
   * more zero bytes read as an empty one. */
  if (cur_left(&c) < 4) return 0;
  uint32_t ne = get_count(&c, STR_MIN, CM_WIRE_MAX_ENV, "bad environment count");
  if (c.err) return cm_wire_hello_release(out), c.err;
  const char **env = calloc(ne + 1, sizeof *env);
  if (!env) return cm_wire_hello_release(out), CM_ENOMEM;
  out->env = env;
  for (uint32_t i = 0; i < ne && !c.err; i++) env[i] = get_str(&c, NULL, 1, "bad environment string");
  out->nenv = ne;
  if (c.err) return cm_wire_hello_release(out), c.err;
  return 0;
}

void cm_wire_hello_release(cm_wire_hello *h) {
  if (!h) return;
  free((void *)h->argv);
  free((void *)h->devices);
  free((void *)h->env);
  memset(h, 0, sizeof *h);
}

/* Parses the schema, and fills kinds/fields when they are given (the second pass). Returns the
 * total field count through *nfields_total. */
static void parse_schema(cur *c, cm_wire_kind *kinds, cm_wire_field *fields, uint32_t *nkinds,
                         uint64_t *nfields_total) {
  uint32_t nk = get_count(c, 4 + 4 + STR_MIN, MAX_KINDS, "bad kind count");
  uint64_t tot = 0;
  for (uint32_t k = 0; k < nk && !c->err; k++) {
    uint32_t kind = get32(c, "truncated kind id");
    uint32_t nf = get_count(c, 12 + STR_MIN, CM_WIRE_MAX_COLS, "bad field count");
    const char *kname = get_str(c, NULL, 1, "bad kind name");
    if (kind > INT32_MAX) cur_fail(c, "kind id out of range");
    if (kinds) {
      kinds[k].kind = kind;
      kinds[k].nfields = nf;
      kinds[k].name = kname;
      kinds[k].fields = fields + tot;
    }
    uint32_t prev = 0;
    for (uint32_t i = 0; i < nf && !c->err; i++) {
      uint32_t id = get32(c, "truncated field id");
      uint32_t type = get32(c, "truncated field type");
      uint32_t width = get32(c, "truncated field width");
      const char *fname = get_str(c, NULL, 1, "bad field name");
      if (c->err) break;
      if (id > INT32_MAX || (i > 0 && id <= prev)) cur_fail(c, "field ids not strictly ascending");
      prev = id;
      if (type > INT32_MAX || !type_width_ok(type, width)) cur_fail(c, "field width does not fit its type");
      if (fields) {
        fields[tot + i].id = id;
        fields[tot + i].type = type;
        fields[tot + i].width = width;
        fields[tot + i].name = fname;
      }
    }
    tot += nf;
  }
  *nkinds = nk;
  *nfields_total = tot;
}

int cm_wire_decode_schema(const cm_wire_frame *f, cm_wire_schema *out) {
  if (!out) return CM_EINVAL;
  memset(out, 0, sizeof *out);
  cur c;
  int rc = cur_begin(&c, f, CM_WIRE_SCHEMA);
  if (rc) return rc;
  uint32_t nk;
  uint64_t nf;
  parse_schema(&c, NULL, NULL, &nk, &nf);
  if (c.err) return c.err;
  /* The first pass bounded both counts by the payload size, so the size cannot overflow. The
   * kinds and then all their fields share one block, which cm_wire_schema_release frees. */
  cm_wire_kind *kinds = calloc(1, (size_t)nk * sizeof(cm_wire_kind) + (size_t)nf * sizeof(cm_wire_field) + 1);
  if (!kinds) return CM_ENOMEM;
  cm_wire_field *fields = (cm_wire_field *)(kinds + nk);
  cur_begin(&c, f, CM_WIRE_SCHEMA);
  parse_schema(&c, kinds, fields, &nk, &nf);
  out->kinds = kinds;
  out->nkinds = nk;
  if (c.err) return cm_wire_schema_release(out), c.err;
  return 0;
}

void cm_wire_schema_release(cm_wire_schema *s) {
  if (!s) return;
  free((void *)s->kinds);
  memset(s, 0, sizeof *s);
}

int cm_wire_decode_strings(const cm_wire_frame *f, cm_wire_strings *out) {
  if (!out) return CM_EINVAL;
  memset(out, 0, sizeof *out);
  cur c;
  int rc = cur_begin(&c, f, CM_WIRE_STRINGS);
  if (rc) return rc;
  uint32_t n = get_count(&c, 4 + STR_MIN, MAX_STRINGS, "bad string count");
  if (c.err) return c.err;
  cm_wire_string *e = calloc(n ? n : 1, sizeof *e);
  if (!e) return CM_ENOMEM;
  for (uint32_t i = 0; i < n && !c.err; i++) {
    e[i].id = get32(&c, "truncated string id");
    e[i].bytes = get_str(&c, &e[i].len, 0, "bad string bytes");
  }
  out->entries = e;
  out->count = n;
  if (c.err) return cm_wire_strings_release(out), c.err;
  return 0;
}

void cm_wire_strings_release(cm_wire_strings *s) {
  if (!s) return;
  free((void *)s->entries);
  memset(s, 0, sizeof *s);
}

int cm_wire_decode_kvlist(const cm_wire_frame *f, cm_wire_kvlist *out) {
  if (!out) return CM_EINVAL;
  memset(out, 0, sizeof *out);
  cur c;
  int rc = cur_begin(&c, f, f ? f->type : 0);
  if (rc) return rc;
  if (f->type != CM_WIRE_STATS && f->type != CM_WIRE_CONFIGURE) return CM_EINVAL;
  uint32_t n = get_count(&c, 8 + STR_MIN, MAX_KVS, "bad item count");
  if (c.err) return c.err;
  cm_wire_kv *kv = calloc(n ? n : 1, sizeof *kv);
  if (!kv) return CM_ENOMEM;
  for (uint32_t i = 0; i < n && !c.err; i++) {
    kv[i].value = get64(&c, "truncated value");
    kv[i].name = get_str(&c, NULL, 1, "bad name");
  }
  out->items = kv;
  out->count = n;
  if (c.err) return cm_wire_kvlist_release(out), c.err;
  return 0;
}

void cm_wire_kvlist_release(cm_wire_kvlist *l) {
  if (!l) return;
  free((void *)l->items);
  memset(l, 0, sizeof *l);
}

/* The schema's name for (kind, field), or NULL. Field ids are usually dense from 0, so the
 * direct index is tried before the scan. */
static const char *schema_name(const cm_wire_schema *s, uint32_t kind, uint32_t field) {
  for (uint32_t k = 0; k < s->nkinds; k++) {
    const cm_wire_kind *kd = &s->kinds[k];
    if (kd->kind != kind) continue;
    if (field < kd->nfields && kd->fields[field].id == field) return kd->fields[field].name;
    for (uint32_t i = 0; i < kd->nfields; i++)
      if (kd->fields[i].id == field) return kd->fields[i].name;
    return NULL;
  }
  return NULL;
}

int cm_wire_decode_batch(const cm_wire_frame *f, const cm_wire_schema *schema, cm_wire_batch *out) {
  if (!out) return CM_EINVAL;
  cur c;
  int rc = cur_begin(&c, f, CM_WIRE_BATCH);
  if (rc) return rc;
  if (((uintptr_t)f->payload & 7) != 0)
    return set_msg(f->reader, CM_EINVAL, "BATCH frame at byte %llu: payload is not 8-byte aligned",
                   (unsigned long long)f->offset);
  uint64_t seq = get64(&c, "truncated batch head");
  uint32_t kind = get32(&c, "truncated batch head");
  uint32_t n = get32(&c, "truncated batch head");
  uint32_t ncols = get32(&c, "truncated batch head");
  uint32_t number = get32(&c, "truncated batch head");
  if (c.err) return c.err;
  if (kind > INT32_MAX) return cur_fail(&c, "kind id out of range");
  if (ncols > CM_WIRE_MAX_COLS) return cur_fail(&c, "more columns than the cap of 128");
  if ((uint64_t)ncols * BATCH_DESC > cur_left(&c)) return cur_fail(&c, "column table runs past the payload");
  uint64_t data_start = BATCH_HEAD + (uint64_t)BATCH_DESC * ncols, prev_end = data_start;
  out->batch.kind = (int32_t)kind;
  out->batch.n = n;
  out->batch.ncols = ncols;
  out->batch.reserved = 0;
  out->batch.seq = seq;
  out->batch.cols = out->cols;
  out->number = number;
  for (uint32_t i = 0; i < ncols; i++) {
    uint32_t field = get32(&c, "truncated column descriptor");
    uint32_t type = get32(&c, "truncated column descriptor");
    uint32_t width = get32(&c, "truncated column descriptor");
    (void)get32(&c, "truncated column descriptor");
    uint64_t off = get64(&c, "truncated column descriptor");
    if (c.err) return c.err;
    if (field > INT32_MAX || (i > 0 && (int32_t)field <= out->cols[i - 1].field))
      return cur_fail(&c, "column field ids not strictly ascending");
    if (type > INT32_MAX || !type_width_ok(type, width)) return cur_fail(&c, "column width does not fit its type");
    /* n < 2^32 and width <= 8, so size < 2^35; off is checked against the payload first. */
    uint64_t size = (uint64_t)n * width;
    if (off % 8 != 0) return cur_fail(&c, "column data offset not 8-byte aligned");
    if (off < prev_end) return cur_fail(&c, "column data overlaps the column table or the previous column");
    if (off > f->len || size > f->len - off) return cur_fail(&c, "column data runs past the payload");
    prev_end = off + size;
    cm_column *col = &out->cols[i];
    col->field = (int32_t)field;
    col->type = (int32_t)type;
    col->width = width;
    col->reserved = 0;
    col->name = schema ? schema_name(schema, kind, field) : NULL;
    col->data = f->payload + off;
  }
  return 0;
}

int cm_wire_decode_flush_done(const cm_wire_frame *f, uint64_t *flush_id, int32_t *status) {
  cur c;
  int rc = cur_begin(&c, f, CM_WIRE_FLUSH_DONE);
  if (rc) return rc;
  uint64_t id = get64(&c, "truncated flush id");
  uint32_t st = get32(&c, "truncated status");
  if (c.err) return c.err;
  if (flush_id) *flush_id = id;
  if (status) *status = (int32_t)st;
  return 0;
}

int cm_wire_decode_bye(const cm_wire_frame *f, cm_wire_bye *out) {
  if (!out) return CM_EINVAL;
  cur c;
  int rc = cur_begin(&c, f, CM_WIRE_BYE);
  if (rc) return rc;
  uint32_t reason = get32(&c, "truncated reason");
  uint32_t code = get32(&c, "truncated exit code");
  const char *msg = get_str(&c, NULL, 1, "bad message");
  if (c.err) return c.err;
  out->reason = reason;
  out->exit_code = (int32_t)code;
  out->message = msg;
  return 0;
}

int cm_wire_decode_hello_ack(const cm_wire_frame *f, int32_t *status, const char **message) {
  cur c;
  int rc = cur_begin(&c, f, CM_WIRE_HELLO_ACK);
  if (rc) return rc;
  uint32_t st = get32(&c, "truncated status");
  (void)get32(&c, "truncated reserved word");
  const char *msg = get_str(&c, NULL, 1, "bad message");
  if (c.err) return c.err;
  if (status) *status = (int32_t)st;
  if (message) *message = msg;
  return 0;
}

int cm_wire_decode_select(const cm_wire_frame *f, const char **spec, uint32_t *len) {
  cur c;
  int rc = cur_begin(&c, f, CM_WIRE_SELECT);
  if (rc) return rc;
  uint32_t n = 0;
  const char *s = get_str(&c, &n, 1, "bad selection text");
  if (c.err) return c.err;
  if (spec) *spec = s;
  if (len) *len = n;
  return 0;
}

int cm_wire_decode_pm(const cm_wire_frame *f, const char **spec, uint32_t *len) {
  cur c;
  int rc = cur_begin(&c, f, CM_WIRE_PM);
  if (rc) return rc;
  uint32_t n = 0;
  const char *s = get_str(&c, &n, 1, "bad PM request text");
  if (c.err) return c.err;
  if (spec) *spec = s;
  if (len) *len = n;
  return 0;
}

int cm_wire_decode_pm_status(const cm_wire_frame *f, int32_t *status, uint32_t *device,
                             const char **message) {
  cur c;
  int rc = cur_begin(&c, f, CM_WIRE_PM_STATUS);
  if (rc) return rc;
  uint32_t st = get32(&c, "truncated status");
  uint32_t dev = get32(&c, "truncated device");
  const char *msg = get_str(&c, NULL, 1, "bad message");
  if (c.err) return c.err;
  if (status) *status = (int32_t)st;
  if (device) *device = dev;
  if (message) *message = msg;
  return 0;
}

int cm_wire_decode_flush(const cm_wire_frame *f, uint64_t *flush_id, uint32_t *flags,
                         uint32_t *timeout_ms) {
  cur c;
  int rc = cur_begin(&c, f, CM_WIRE_FLUSH);
  if (rc) return rc;
  uint64_t id = get64(&c, "truncated flush id");
  uint32_t fl = get32(&c, "truncated flags");
  uint32_t to = get32(&c, "truncated timeout");
  if (c.err) return c.err;
  if (flush_id) *flush_id = id;
  if (flags) *flags = fl;
  if (timeout_ms) *timeout_ms = to;
  return 0;
}

/* ---- Capture files ----------------------------------------------------------------------- */

/* The file reader feeds the stream reader 1 MiB at a time, only when it asks for more, so the
 * memory held is one frame plus one chunk. */
enum { FILE_CHUNK = 1 << 20 };

struct cm_wire_file {
  FILE *fp;
  cm_wire_reader *r;
  uint8_t *chunk;
  int eof;
  char msg[CM_WIRE_ERRMSG_SIZE];
};

int cm_wire_file_open(cm_wire_file **out, const char *path, char *errmsg_out) {
  if (errmsg_out) errmsg_out[0] = 0;
  if (!out || !path) return CM_EINVAL;
  cm_wire_file *cf = calloc(1, sizeof *cf);
  if (!cf) return CM_ENOMEM;
  cf->chunk = malloc(FILE_CHUNK);
  int rc = cf->chunk ? cm_wire_reader_new(&cf->r, CM_WIRE_READER_CAPTURE | CM_WIRE_READER_RESYNC) : CM_ENOMEM;
  if (rc) {
    cm_wire_file_close(cf);
    return rc;
  }
  cf->fp = fopen(path, "rb");
  if (!cf->fp) {
    int e = errno;
    if (errmsg_out)
      snprintf(errmsg_out, CM_WIRE_ERRMSG_SIZE, "cannot open capture %s: %s", path, strerror(e));
    cm_wire_file_close(cf);
    return e == ENOENT ? CM_ENOENT : CM_EIO;
  }
  *out = cf;
  return 0;
}

int cm_wire_file_next(cm_wire_file *cf, cm_wire_frame *f) {
  if (!cf || !f) return CM_EINVAL;
  for (;;) {
    int rc = cm_wire_reader_next(cf->r, f);
    if (rc != 0) return rc;
    if (cf->eof) return cm_wire_reader_end(cf->r);
    /* The file's size bounds every frame in it: a frame declared past it is corrupt at once,
     * rather than after the rest of the file was buffered waiting for it (the reader goes on
     * one byte past its header). A capture still being written is read up to its size now. */
    struct stat sb;
    if (fstat(fileno(cf->fp), &sb) == 0 && S_ISREG(sb.st_mode)) reader_set_end(cf->r, (uint64_t)sb.st_size);
    size_t got = fread(cf->chunk, 1, FILE_CHUNK, cf->fp);
    if (got < FILE_CHUNK) {
      if (ferror(cf->fp)) {
        snprintf(cf->msg, sizeof cf->msg, "read error in capture: %s", strerror(errno));
        return CM_EIO;
      }
      cf->eof = 1;
    }
    if (got && (rc = cm_wire_reader_feed(cf->r, cf->chunk, got)) != 0) return rc;
    if (cf->eof) cf->r->stream_end = cf->r->base + cf->r->tail;
  }
}

const char *cm_wire_file_errmsg(const cm_wire_file *cf) {
  if (!cf) return "";
  return cf->msg[0] ? cf->msg : cm_wire_reader_errmsg(cf->r);
}

uint64_t cm_wire_file_resyncs(const cm_wire_file *cf, uint64_t *bytes_skipped) {
  return cm_wire_reader_resyncs(cf ? cf->r : NULL, bytes_skipped);
}

void cm_wire_file_close(cm_wire_file *cf) {
  if (!cf) return;
  if (cf->fp) fclose(cf->fp);
  cm_wire_reader_free(cf->r);
  free(cf->chunk);
  free(cf);
}
