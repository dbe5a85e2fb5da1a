/*
 * wire_writer.c: the frame writers of the wire format (docs/wire.md defines the bytes).
 *
 * Writers append a frame to a cm_wire_buf in one pass: they reserve the 24-byte header, append
 * the payload, pad it with zeros to a multiple of 8, then compute the payload CRC and fill the
 * header. A failed writer restores the buffer's length, so a buffer never holds half a frame.
 * Every writer checks what it is given against the bounds a reader enforces (wire_internal.h),
 * so that it never writes a frame that a reader would refuse.
 *
 * Thread rules: a cm_wire_buf belongs to its caller; writers share nothing else.
 */
#include <stdlib.h>
#include <string.h>

#include "wire_internal.h"

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
  memcpy(h, cm__wire_file_magic, 8);
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
      if (!cm__wire_type_width_ok(kd->fields[i].type, kd->fields[i].width)) return CM_EINVAL;
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


int cm_wire_write_batch(cm_wire_buf *b, const cm_batch *batch) {
  return cm_wire_write_batch_numbered(b, batch, 0);
}

int cm_wire_write_batch_numbered(cm_wire_buf *b, const cm_batch *batch, uint32_t number) {
  if (!b || !batch || batch->ncols > CM_WIRE_MAX_COLS || (batch->ncols && !batch->cols))
    return CM_EINVAL;
  uint64_t off = BATCH_HEAD + (uint64_t)BATCH_DESC * batch->ncols;
  for (uint32_t i = 0; i < batch->ncols; i++) {
    const cm_column *c = &batch->cols[i];
    if (c->field < 0 || c->type < 0 || !cm__wire_type_width_ok((uint32_t)c->type, c->width)) return CM_EINVAL;
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
