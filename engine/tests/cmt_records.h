/*
 * cmt_records.h: the value and checksum helpers that the engine and agent tests share.
 *
 * Design. Those tests all check delivery the same way: they regenerate the records that the fake
 * CUPTI wrote (fake_gen_record) and read each field at the registry's offset and source width
 * (record_value), read the delivered columns back (load_le, normalize, column_value_resolved),
 * and compare the two sides as order-independent checksums (field_mix, row_step, fold_value) or
 * as a multiset of row hashes (hset). Both sides must compute a value the same way, so the value
 * rules live here once: an integer is converted to the column's width and sign-extended when its
 * type is signed, and a string is the FNV-1a hash of its bytes (a NULL string hashes like "").
 *
 * Every function is static inline, so a test that includes this header and uses only some of
 * them draws no unused-function warning. The names are the ones the tests already used; the
 * header is meant for the test translation units only (each test is its own program), never for
 * the library. Helpers that differ from test to test (string-id caches, observers, the shape
 * checks of a batch) stay in their tests.
 */
#ifndef CMT_RECORDS_H
#define CMT_RECORDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmt.h"
#include "cuptimon.h"

/* The odd multiplier (2^64 divided by the golden ratio) that spreads field numbers and values. */
#define CMT_ODD_MUL 0x9E3779B97F4A7C15ull

/* ---- values --------------------------------------------------------------------------------- */

/* Returns the splitmix64 finalizer of `x`. It is a bijection, so distinct inputs give distinct
 * outputs. */
static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

/* Returns the 64-bit FNV-1a hash of the `n` bytes at `s`. `s` may be NULL only when `n` is 0. */
static inline uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

/* Returns whether the registry type `type` (a CM_TYPE_* value) is a signed integer. */
static inline int type_signed(int type) {
  return type == CM_TYPE_I8 || type == CM_TYPE_I16 || type == CM_TYPE_I32 || type == CM_TYPE_I64;
}

/* Keeps the low `bytes` bytes of `raw` and, when `sgn` is set, sign-extends them to 64 bits.
 * `bytes` of 8 or more returns `raw` unchanged; `bytes` must not be 0. */
static inline uint64_t normalize(uint64_t raw, unsigned bytes, int sgn) {
  if (bytes >= 8) return raw;
  uint64_t mask = ((uint64_t)1 << (bytes * 8)) - 1;
  raw &= mask;
  if (sgn && ((raw >> (bytes * 8 - 1)) & 1)) raw |= ~mask;
  return raw;
}

/* Reads a little-endian unsigned integer of `bytes` bytes (at most 8) at `p`, zero-extended. The
 * tests run on little-endian hosts (x86-64, aarch64), so this is a plain copy. */
static inline uint64_t load_le(const void *p, unsigned bytes) {
  uint64_t v = 0;
  memcpy(&v, p, bytes);
  return v;
}

/* Returns the value that field `f` of the generated record `rec` (of `rec_size` bytes, as
 * fake_gen_record returned it) must have in a delivered column: a string as the FNV-1a hash of
 * the pointed-to bytes, a number read at the registry's offset and source width and then
 * converted to the column's width and signedness. Fails the test when the field does not lie
 * inside the record or the registry gives it a source width that a record cannot have. */
static inline uint64_t record_value(const void *rec, size_t rec_size, const cm_field_info *f) {
  CMT_LEU((uint64_t)f->offset + f->src_width, rec_size);
  const unsigned char *p = (const unsigned char *)rec + f->offset;
  if (f->type == CM_TYPE_STR) {
    const char *s = NULL;
    CMT_EQU(f->src_width, sizeof s);
    memcpy(&s, p, sizeof s);
    return s ? fnv1a(s, strlen(s)) : fnv1a("", 0);
  }
  CMT_ASSERT(f->src_width >= 1 && f->src_width <= 8);
  int sgn = type_signed(f->type);
  return normalize(normalize(load_le(p, f->src_width), f->src_width, sgn), f->width, sgn);
}

/* Returns the value of row `i` of the delivered column `c`, computed as record_value computes
 * it for the generated record. A string id is resolved through cm_string() on engine `e` every
 * time (no cache); an id that does not resolve fails the test. */
static inline uint64_t column_value_resolved(cm_engine *e, const cm_column *c, uint32_t i) {
  uint64_t raw = load_le((const unsigned char *)c->data + (size_t)i * c->width, c->width);
  if (c->type == CM_TYPE_STR) {
    size_t len = 0;
    const char *s = cm_string(e, (uint32_t)raw, &len);
    if (!s) CMT_FAIL("string id %" PRIu64 " does not resolve", raw);
    return fnv1a(s, len);
  }
  return normalize(raw, c->width, type_signed(c->type));
}

/* ---- checksums ------------------------------------------------------------------------------ */

/* Returns value `v` of field `field` mixed with the field number, so equal values of different
 * fields contribute differently. */
static inline uint64_t field_mix(int field, uint64_t v) {
  return mix64(v ^ ((uint64_t)(field + 1) * CMT_ODD_MUL));
}

/* Folds value `v` of field `field` into a running row hash `h` and returns the new hash. A row's
 * hash starts from its kind and folds its fields in field order. */
static inline uint64_t row_step(uint64_t h, int field, uint64_t v) {
  return mix64(h ^ field_mix(field, v));
}

/* Adds value `v` of field `field` to a per-field pair of order-independent checksums: a wrapping
 * sum of the value times CMT_ODD_MUL and an XOR of field_mix. A lost value and a duplicated one
 * change at least one of the two. */
static inline void fold_value(uint64_t *sum, uint64_t *xr, int field, uint64_t v) {
  *sum += v * CMT_ODD_MUL;
  *xr ^= field_mix(field, v);
}

/* ---- time ----------------------------------------------------------------------------------- */

/* Returns CLOCK_MONOTONIC in milliseconds. */
static inline uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- a multiset of 64-bit hashes ------------------------------------------------------------ */

/* One slot of an hset: a hash and how many times it is held. A slot once used stays used (with
 * count 0 after the last take), which keeps the open-addressing probe chains intact. */
typedef struct hslot {
  uint64_t h;
  uint32_t count;
  uint32_t used;
} hslot;

/* A multiset of 64-bit hashes (open addressing, linear probing, power-of-two capacity). A
 * zero-initialized hset is empty and valid; it is never freed (the tests exit). The caller
 * serializes access. */
typedef struct hset {
  hslot *s;
  size_t cap, n;  /* n: slots in use (distinct hashes ever inserted) */
  uint64_t total; /* the sum of the counts */
} hset;

static inline void hset_grow(hset *m);

/* Returns the slot of hash `h`, or NULL when it has none and `insert` is false. With `insert`,
 * a missing hash gets a new slot of count 0 (growing the table first when it is half full). */
static inline hslot *hset_find(hset *m, uint64_t h, bool insert) {
  if (insert && (m->n + 1) * 2 > m->cap) hset_grow(m);
  if (!m->cap) return NULL;
  size_t i = (size_t)mix64(h) & (m->cap - 1);
  for (;;) {
    hslot *s = &m->s[i];
    if (!s->used) {
      if (!insert) return NULL;
      *s = (hslot){.h = h, .count = 0, .used = 1};
      m->n++;
      return s;
    }
    if (s->h == h) return s;
    i = (i + 1) & (m->cap - 1);
  }
}

/* Doubles the capacity of `m` (to 4096 slots when empty) and rehashes every used slot. A failed
 * allocation fails the test. */
static inline void hset_grow(hset *m) {
  hset old = *m;
  m->cap = old.cap ? old.cap * 2 : 4096;
  m->s = calloc(m->cap, sizeof *m->s);
  CMT_ASSERT(m->s != NULL);
  m->n = 0;
  for (size_t i = 0; i < old.cap; i++)
    if (old.s[i].used) hset_find(m, old.s[i].h, true)->count = old.s[i].count;
  free(old.s);
}

/* Adds one occurrence of `h`. */
static inline void hset_add(hset *m, uint64_t h) {
  hset_find(m, h, true)->count++;
  m->total++;
}

/* Takes one occurrence of `h` out; returns whether there was one. */
static inline bool hset_take(hset *m, uint64_t h) {
  hslot *s = hset_find(m, h, false);
  if (!s || !s->count) return false;
  s->count--;
  m->total--;
  return true;
}

/* ---- engine log ----------------------------------------------------------------------------- */

/* A cm log callback that prints every engine log line to stderr with its level. */
static inline void log_to_stderr(void *ud, int level, const char *msg) {
  (void)ud;
  fprintf(stderr, "[engine log %d] %s\n", level, msg);
}

#endif /* CMT_RECORDS_H */
