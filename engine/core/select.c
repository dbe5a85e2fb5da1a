/*
 * select.c: selections (for each kind, the set of field ids an observer wants) and the text form
 * scripts and command lines use to write them.
 *
 * Design: a selection is a fixed array of 128-bit sets indexed by kind value, so copying,
 * comparing and taking unions (the engine's reconcile) are plain word operations and nothing is
 * allocated after cm_selection_new. Names are resolved through the field registry, whose failing
 * lookups already leave a detail listing the valid names; this file adds where in the text the
 * bad token was. Every mutating call either applies completely or leaves the selection as it was:
 * parse works on a copy and commits it only when the whole text is valid. The lenient mode
 * (CM_SELECT_LENIENT, for selections written by hand in an environment variable, where one typo
 * should cost only itself) runs the same grammar, reports each bad name to a callback and goes on
 * with the next one.
 *
 * A selection is not thread-safe; the caller serializes access to one selection.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cm_internal.h"

int cm_selection_new(cm_selection **out) {
  if (out == NULL) return cm__seterr(CM_EINVAL, "cm_selection_new: out is NULL");
  *out = calloc(1, sizeof **out);
  if (*out == NULL) return cm__seterr(CM_ENOMEM, "cm_selection_new: out of memory");
  return 0;
}

void cm_selection_free(cm_selection *sel) { free(sel); }

/* Sets every field of `d`. */
static void set_all(cm__bits *b, const cm__kind_desc *d) {
  for (int i = 0; i < d->nfields; i++) cm__bits_set(b, i);
}

int cm_selection_add_id(cm_selection *sel, int kind, int field_id) {
  if (sel == NULL) return cm__seterr(CM_EINVAL, "cm_selection_add_id: selection is NULL");
  const cm__kind_desc *d = cm__kind_desc_get(kind);
  if (d == NULL) return cm_field_count(kind); /* CM_ENOKIND with the list of kinds */
  if (field_id == -1) {
    set_all(&sel->kinds[kind], d);
    return 0;
  }
  if (field_id < 0 || field_id >= d->nfields)
    return cm__seterr(CM_ENOFIELD, "field id %d of kind %s out of range 0..%d (or -1 for all)",
                      field_id, d->name, d->nfields - 1);
  cm__bits_set(&sel->kinds[kind], field_id);
  return 0;
}

int cm_selection_add(cm_selection *sel, const char *kind, const char *field) {
  if (sel == NULL) return cm__seterr(CM_EINVAL, "cm_selection_add: selection is NULL");
  int k = cm_kind_by_name(kind);
  if (k < 0) return k;
  if (field == NULL || strcmp(field, "all") == 0) return cm_selection_add_id(sel, k, -1);
  int f = cm_field_by_name(k, field);
  if (f < 0) return f;
  return cm_selection_add_id(sel, k, f);
}

/* ---- the text form ------------------------------------------------------------------------

   spec  := entry (';' entry)*           empty entries are ignored ("kernel;" is fine)
   entry := kind | kind ':' fields
   fields:= name (',' name)*             "all" selects every field of the kind
   Spaces (isspace) around names are ignored; a name is the text between separators. */

#define CM__TOKEN_MAX 128

/* Copies s[b..e) without surrounding whitespace into tok (CM__TOKEN_MAX bytes). Returns the
 * trimmed length, or -1 when it does not fit. */
static int token(const char *s, size_t b, size_t e, char *tok) {
  while (b < e && isspace((unsigned char)s[b])) b++;
  while (e > b && isspace((unsigned char)s[e - 1])) e--;
  if (e - b >= CM__TOKEN_MAX) return -1;
  memcpy(tok, s + b, e - b);
  tok[e - b] = '\0';
  return (int)(e - b);
}

/* How a parse handles a bad name: strict parses stop at the first, lenient ones report it to
 * `on_skip` and go on. */
typedef struct parse_mode {
  bool lenient;
  cm_select_skip_fn on_skip;
  void *ud;
  int skipped;
} parse_mode;

/* A bad name at `offset`: the detail is already set (cm__seterr). Returns `err` for a strict parse
 * (which then stops), 0 after reporting it for a lenient one. */
static int bad_name(parse_mode *m, size_t offset, int err) {
  if (!m->lenient) return err;
  m->skipped++;
  if (m->on_skip) m->on_skip(m->ud, offset, cm_errmsg());
  return 0;
}

/* Parses one entry, spec[b..e), into sel. `b` is also the offset errors report. */
static int parse_entry(cm_selection *sel, const char *spec, size_t b, size_t e, parse_mode *m) {
  char tok[CM__TOKEN_MAX];
  const char *colon = memchr(spec + b, ':', e - b);
  size_t kind_end = colon ? (size_t)(colon - spec) : e;
  int n = token(spec, b, kind_end, tok);
  if (n < 0) return bad_name(m, b, cm__seterr(CM_EINVAL, "selection offset %zu: kind name too long", b));
  if (n == 0) {
    if (colon == NULL) return 0; /* an empty entry */
    return bad_name(m, b, cm__seterr(CM_EINVAL, "selection offset %zu: missing kind name before ':'", b));
  }
  int k = cm_kind_by_name(tok);
  if (k < 0) return bad_name(m, b, cm__seterr(k, "selection offset %zu: %s", b, cm_errmsg()));
  if (colon == NULL) return cm_selection_add_id(sel, k, -1);

  /* The field list: names separated by ','. An empty name is an error, so "kernel:" and
   * "kernel:name,,stop" are rejected rather than read as "all". */
  size_t p = kind_end + 1;
  for (;;) {
    const char *comma = memchr(spec + p, ',', e - p);
    size_t q = comma ? (size_t)(comma - spec) : e;
    n = token(spec, p, q, tok);
    int rc = 0;
    if (n < 0) {
      rc = bad_name(m, p, cm__seterr(CM_EINVAL, "selection offset %zu: field name too long", p));
    } else if (n == 0) {
      rc = bad_name(m, p, cm__seterr(CM_EINVAL, "selection offset %zu: empty field name in the list of %s", p,
                                     cm_kind_name(k)));
    } else if (strcmp(tok, "all") == 0) {
      rc = cm_selection_add_id(sel, k, -1);
    } else {
      int f = cm_field_by_name(k, tok);
      if (f < 0)
        rc = bad_name(m, p, cm__seterr(f, "selection offset %zu: %s", p, cm_errmsg()));
      else
        rc = cm_selection_add_id(sel, k, f);
    }
    if (rc < 0) return rc;
    if (comma == NULL) return 0;
    p = q + 1;
  }
}

int cm_selection_parse_ex(cm_selection *sel, const char *spec, unsigned flags,
                          cm_select_skip_fn on_skip, void *ud) {
  if (sel == NULL) return cm__seterr(CM_EINVAL, "cm_selection_parse: selection is NULL");
  if (spec == NULL) return cm__seterr(CM_EINVAL, "cm_selection_parse: spec is NULL");
  if (flags & ~(unsigned)CM_SELECT_LENIENT)
    return cm__seterr(CM_EINVAL, "cm_selection_parse_ex: unknown flags 0x%x (valid: CM_SELECT_LENIENT)",
                      flags);
  parse_mode m = {.lenient = (flags & CM_SELECT_LENIENT) != 0, .on_skip = on_skip, .ud = ud};
  /* The copy is about 1 KiB, small enough for the stack; a failure never touches `sel`. */
  cm_selection tmp = *sel;
  size_t len = strlen(spec), b = 0;
  while (b <= len) {
    const char *semi = memchr(spec + b, ';', len - b);
    size_t e = semi ? (size_t)(semi - spec) : len;
    int rc = parse_entry(&tmp, spec, b, e, &m);
    if (rc < 0) return rc;
    b = e + 1;
  }
  *sel = tmp;
  if (m.skipped) cm__clearerr();
  return m.skipped;
}

int cm_selection_parse(cm_selection *sel, const char *spec) {
  return cm_selection_parse_ex(sel, spec, 0, NULL, NULL);
}

int cm_selection_has(const cm_selection *sel, int kind, int field_id) {
  if (sel == NULL || kind < 0 || kind >= CM_KIND_MAX) return 0;
  if (field_id < 0 || field_id >= CM__MAX_FIELDS) return 0;
  return cm__bits_has(&sel->kinds[kind], field_id) ? 1 : 0;
}

/* An unknown kind has nothing selected, so it counts 0 rather than failing: callers sum counts
 * over kind values. */
int cm_selection_count(const cm_selection *sel, int kind) {
  if (sel == NULL || kind < 0 || kind >= CM_KIND_MAX) return 0;
  return cm__bits_count(&sel->kinds[kind]);
}

const cm_column *cm_batch_column(const cm_batch *b, int field) {
  if (b == NULL || b->cols == NULL) return NULL;
  for (uint32_t i = 0; i < b->ncols; i++)
    if (b->cols[i].field == field) return &b->cols[i];
  return NULL;
}

/* ---- couplings: what CUPTI must enable for a union selection --------------------------------- */

static const cm__field *find_field(const cm__kind_desc *d, const char *name, int *id) {
  for (int f = 0; d && f < d->nfields; f++)
    if (strcmp(d->fields[f].name, name) == 0) {
      if (id) *id = f;
      return &d->fields[f];
    }
  return NULL;
}

static bool selects_named(const cm__bits *sel, int kind, const char *name) {
  int id;
  if (!find_field(cm__kind_desc_get(kind), name, &id)) return false;
  return cm__bits_has(&sel[kind], id);
}

uint64_t cm__sel_kinds_needed(const cm__bits *sel) {
  uint64_t m = 0;
  for (int k = 0; k < CM_KIND_MAX; k++)
    if (!cm__bits_empty(&sel[k])) m |= (uint64_t)1 << k;
  if (m & (1ull << CM_KIND_CUDA_EVENT)) m |= 1ull << CM_KIND_SYNCHRONIZATION;
  if (m & (1ull << CM_KIND_MEMCPY2)) m |= 1ull << CM_KIND_MEMCPY;
  if ((m & (1ull << CM_KIND_EXTERNAL_CORRELATION)) &&
      !(m & ((1ull << CM_KIND_RUNTIME) | (1ull << CM_KIND_DRIVER))))
    m |= 1ull << CM_KIND_RUNTIME;
  /* Synthetic kinds are produced by the engine, never enabled in CUPTI. */
  m &= ~((1ull << CM_KIND_RESOURCE) | (1ull << CM_KIND_PM_SAMPLE));
  return m;
}

bool cm__sel_needs_latency(const cm__bits *sel) {
  static const int kinds[] = {CM_KIND_CONCURRENT_KERNEL, CM_KIND_KERNEL};
  for (size_t i = 0; i < 2; i++)
    if (selects_named(sel, kinds[i], "queued") || selects_named(sel, kinds[i], "submitted"))
      return true;
  return false;
}

bool cm__sel_needs_event_ts(const cm__bits *sel) {
  return selects_named(sel, CM_KIND_CUDA_EVENT, "device_timestamp");
}
