/*
 * wire_decode.c: the payload decoders of the wire format (docs/wire.md, "Payloads"), and the
 * parser of a PM request's text. They turn a frame that the reader verified (wire_reader.c) into
 * the structs of cuptimon_wire.h, pointing into the frame's payload rather than copying it.
 *
 * Decoders run over a verified payload with a cursor whose every read is bounds-checked against
 * what remains. Counts are checked against the bytes left before anything is allocated (each
 * element has a minimum encoded size), so a hostile count cannot cause a large allocation, and
 * every size computation is done in 64 bits from values that cannot overflow there (a count is
 * at most 2^32 and a width at most 8). A decoder's complaint goes to the message of the reader
 * that yielded the frame (cm__wire_reader_say), without making that reader's error sticky.
 *
 * Thread rules: none; a decoded struct belongs to its caller and lives as long as the frame.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire_internal.h"

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
  cm__wire_reader_say(c->f->reader, CM_EIO, "%s frame at byte %llu: %s (payload offset %llu of %llu)",
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
      if (type > INT32_MAX || !cm__wire_type_width_ok(type, width)) cur_fail(c, "field width does not fit its type");
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
    return cm__wire_reader_say(f->reader, CM_EINVAL, "BATCH frame at byte %llu: payload is not 8-byte aligned",
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
    if (type > INT32_MAX || !cm__wire_type_width_ok(type, width)) return cur_fail(&c, "column width does not fit its type");
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
