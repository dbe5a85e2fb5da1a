/*
 * control.c: the agent's application of monitor frames (control.h), with the bounds on what a
 * monitor may ask for.
 *
 * Design. The monitor speaks for the user, but its bytes are external input to a library living
 * inside someone else's process: a CONFIGURE must not make the agent allocate without bound
 * (pool_max_buffers, buffer_size, send_queue_bytes, batch_records), spin CUPTI flushes every
 * millisecond (flush_ms), or hold the engine for days (fence_timeout_ms, a FLUSH's timeout). Each
 * such number is clamped into its documented range and the clamp is logged once per request, so
 * a user who asked for too much learns what was used instead. A CONFIGURE applies its settings in
 * order and then checks the pool's total (buffer_size x pool_max_buffers), so the outcome does
 * not depend on the order of the names. A SELECT is parsed strictly: an invalid one is refused
 * whole and the previous selection stays.
 */
#include "control.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void clog_(cm__control *c, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void clog_(cm__control *c, int level, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  c->ops.log(c->ops.ud, level, msg);
}

void cm__control_init(cm__control *c, const cm__control_ops *ops, const cm_config *cfg) {
  memset(c, 0, sizeof *c);
  c->ops = *ops;
  c->cfg = *cfg;
}

int cm__control_feed(cm__control *c, cm_wire_reader *r, const void *data, size_t len) {
  int rc = cm_wire_reader_feed(r, data, len);
  c->fed += len;
  if (rc) clog_(c, CM_LOG_ERROR, "bad stream from the monitor: %s", cm_wire_reader_errmsg(r));
  return rc;
}

int cm__control_next(cm__control *c, cm_wire_reader *r, cm_wire_frame *f) {
  int rc = cm_wire_reader_next(r, f);
  if (rc == 1) {
    c->consumed = f->offset + CM_WIRE_FRAME_HEADER_SIZE + f->len;
    return 1;
  }
  if (rc < 0) {
    clog_(c, CM_LOG_ERROR, "bad frame from the monitor: %s", cm_wire_reader_errmsg(r));
    return rc;
  }
  if (c->fed > c->consumed && c->fed - c->consumed > CM__CTL_MAX_FRAME + CM_WIRE_FRAME_HEADER_SIZE) {
    clog_(c, CM_LOG_ERROR,
          "the monitor sent a control frame of more than %llu bytes (the agent's bound); closing",
          (unsigned long long)CM__CTL_MAX_FRAME);
    return CM_ERANGE;
  }
  return 0;
}

/* Clamps *v into [lo, hi] (0 stays 0 when zero_ok), logging a change. */
static void clamp32(cm__control *c, const char *name, uint64_t asked, uint32_t *v, uint32_t lo,
                    uint32_t hi, bool zero_ok) {
  uint64_t x = asked;
  if (!(zero_ok && x == 0)) {
    if (x < lo) x = lo;
    if (x > hi) x = hi;
  }
  *v = (uint32_t)x;
  if (x != asked) {
    c->clamped++;
    clog_(c, CM_LOG_WARN, "CONFIGURE %s = %llu is outside the agent's bounds [%u, %u]%s; using %llu",
          name, (unsigned long long)asked, lo, hi, zero_ok ? " (or 0)" : "",
          (unsigned long long)x);
  }
}

static void apply_configure(cm__control *c, const cm_wire_frame *f) {
  cm_wire_kvlist l;
  memset(&l, 0, sizeof l);
  if (cm_wire_decode_kvlist(f, &l) != 0) {
    clog_(c, CM_LOG_WARN, "ignoring a malformed CONFIGURE: %s", cm_wire_reader_errmsg(f->reader));
    return;
  }
  cm_config n = c->cfg;
  bool engine_change = false;
  for (uint32_t i = 0; i < l.count; i++) {
    const char *name = l.items[i].name;
    uint64_t v = l.items[i].value;
    clog_(c, CM_LOG_DEBUG, "CONFIGURE %s = %llu", name, (unsigned long long)v);
    if (strcmp(name, "buffer_size") == 0) {
      clamp32(c, name, v, &n.buffer_size, CM__CTL_BUFFER_MIN, CM__CTL_BUFFER_MAX, false);
      n.buffer_size &= ~7u; /* the engine wants a multiple of 8 */
      engine_change = true;
    } else if (strcmp(name, "pool_max_buffers") == 0) {
      clamp32(c, name, v, &n.pool_max_buffers, 1, CM__CTL_POOL_MAX, false);
      engine_change = true;
    } else if (strcmp(name, "flush_ms") == 0) {
      clamp32(c, name, v, &n.self_flush_ms, CM__CTL_CADENCE_MIN_MS, CM__CTL_CADENCE_MAX_MS, true);
      engine_change = true;
    } else if (strcmp(name, "deliver_ms") == 0) {
      clamp32(c, name, v, &n.deliver_ms, CM__CTL_CADENCE_MIN_MS, CM__CTL_CADENCE_MAX_MS, true);
      engine_change = true;
    } else if (strcmp(name, "fence_timeout_ms") == 0) {
      clamp32(c, name, v, &n.fence_timeout_ms, CM__CTL_FENCE_MIN_MS, CM__CTL_FENCE_MAX_MS, false);
      engine_change = true;
    } else if (strcmp(name, "batch_records") == 0) {
      /* 0 would mean "no bound" to the engine: the monitor gets the agent's bound instead. */
      if (v == 0) {
        c->clamped++;
        clog_(c, CM_LOG_WARN, "CONFIGURE batch_records = 0 (no bound) is outside the agent's "
                              "bounds [%u, %u]; using %u",
              CM__CTL_BATCH_MIN, CM__CTL_BATCH_MAX, CM__CTL_BATCH_MAX);
        n.batch_records = CM__CTL_BATCH_MAX;
      } else {
        clamp32(c, name, v, &n.batch_records, CM__CTL_BATCH_MIN, CM__CTL_BATCH_MAX, false);
      }
      engine_change = true;
    } else if (strcmp(name, "send_queue_bytes") == 0) {
      uint64_t q = v < CM__CTL_QUEUE_MIN ? CM__CTL_QUEUE_MIN : v > CM__CTL_QUEUE_MAX ? CM__CTL_QUEUE_MAX : v;
      if (q != v) {
        c->clamped++;
        clog_(c, CM_LOG_WARN,
              "CONFIGURE send_queue_bytes = %llu is outside the agent's bounds [%llu, %llu]; "
              "using %llu",
              (unsigned long long)v, (unsigned long long)CM__CTL_QUEUE_MIN,
              (unsigned long long)CM__CTL_QUEUE_MAX, (unsigned long long)q);
      }
      c->ops.queue_bytes(c->ops.ud, q);
    } else {
      clog_(c, CM_LOG_WARN, "CONFIGURE: unknown setting '%s' ignored", name);
    }
  }
  cm_wire_kvlist_release(&l);
  if (!engine_change) return;
  if ((uint64_t)n.buffer_size * n.pool_max_buffers > CM__CTL_POOL_BYTES_MAX) {
    uint32_t p = (uint32_t)(CM__CTL_POOL_BYTES_MAX / n.buffer_size);
    c->clamped++;
    clog_(c, CM_LOG_WARN,
          "CONFIGURE pool of %u buffers of %u bytes is over the agent's bound of %llu bytes; "
          "using %u buffers",
          n.pool_max_buffers, n.buffer_size, (unsigned long long)CM__CTL_POOL_BYTES_MAX, p);
    n.pool_max_buffers = p;
  }
  int rc = c->ops.configure(c->ops.ud, &n);
  if (rc)
    clog_(c, CM_LOG_WARN, "CONFIGURE rejected by the engine: %s", cm_err_name(rc));
  else
    c->cfg = n;
}

static void apply_select(cm__control *c, const cm_wire_frame *f) {
  const char *spec = NULL;
  uint32_t len = 0;
  if (cm_wire_decode_select(f, &spec, &len) != 0) {
    clog_(c, CM_LOG_WARN, "ignoring a malformed SELECT: %s", cm_wire_reader_errmsg(f->reader));
    return;
  }
  if (len > CM__CTL_MAX_SELECT) {
    c->clamped++;
    clog_(c, CM_LOG_ERROR,
          "SELECT of %u bytes is longer than the agent's bound of %u; the previous selection stays",
          len, CM__CTL_MAX_SELECT);
    return;
  }
  cm_selection *sel = NULL;
  if (cm_selection_new(&sel) != 0) return;
  int rc = cm_selection_parse(sel, spec);
  if (rc) {
    clog_(c, CM_LOG_ERROR, "SELECT '%.200s' is invalid; the previous selection stays: %s", spec,
          cm_errmsg());
  } else {
    clog_(c, CM_LOG_DEBUG, "SELECT %.400s", spec);
    c->ops.select(c->ops.ud, sel);
  }
  cm_selection_free(sel);
}

static void apply_pm(cm__control *c, const cm_wire_frame *f) {
  const char *spec = NULL;
  uint32_t len = 0;
  if (cm_wire_decode_pm(f, &spec, &len) != 0) {
    clog_(c, CM_LOG_WARN, "ignoring a malformed PM request: %s", cm_wire_reader_errmsg(f->reader));
    return;
  }
  cm__pm_entry *entries = malloc(CM__CTL_PM_ENTRIES * sizeof *entries);
  char *text = malloc(CM__CTL_MAX_SELECT + 1);
  char why[256];
  int n = CM_ENOMEM;
  snprintf(why, sizeof why, "no memory to parse it");
  if (entries && text)
    n = cm_wire_parse_pm(spec, len, text, CM__CTL_MAX_SELECT + 1, entries, CM__CTL_PM_ENTRIES,
                         why, sizeof why);
  if (n < 0) {
    c->clamped++;
    clog_(c, CM_LOG_ERROR, "PM request '%.200s' is invalid (%s); the previous sampling stays", spec,
          why);
    c->ops.pm(c->ops.ud, NULL, n, why);
  } else {
    c->ops.pm(c->ops.ud, entries, n, NULL);
  }
  free(entries);
  free(text);
}

static void apply_flush(cm__control *c, const cm_wire_frame *f) {
  uint64_t id = 0;
  uint32_t flags = 0, timeout = 0;
  if (cm_wire_decode_flush(f, &id, &flags, &timeout) != 0) {
    clog_(c, CM_LOG_WARN, "ignoring a malformed FLUSH: %s", cm_wire_reader_errmsg(f->reader));
    return;
  }
  /* The control thread holds the engine during the flush: a monitor's "49 days" is cut. */
  if (timeout > CM__CTL_FENCE_MAX_MS) {
    c->clamped++;
    clog_(c, CM_LOG_INFO, "FLUSH %llu: timeout %u ms is over the agent's bound; using %u ms",
          (unsigned long long)id, timeout, CM__CTL_FENCE_MAX_MS);
    timeout = CM__CTL_FENCE_MAX_MS;
  }
  int status = c->ops.flush(c->ops.ud, (flags & CM_WIRE_FLUSH_SYNC) ? CM_FLUSH_SYNC : CM_FLUSH_PLAIN,
                            timeout);
  c->ops.flush_done(c->ops.ud, id, status);
}

int cm__control_apply(cm__control *c, const cm_wire_frame *f, int32_t *ack) {
  switch (f->type) {
  case CM_WIRE_HELLO_ACK: {
    const char *msg = "";
    int32_t st = CM_EIO;
    if (cm_wire_decode_hello_ack(f, &st, &msg) != 0) msg = "malformed HELLO_ACK";
    if (st != 0)
      clog_(c, CM_LOG_WARN, "the monitor refused this process: %.300s (%s)", msg, cm_err_name(st));
    if (ack) *ack = st;
    return 1;
  }
  case CM_WIRE_CONFIGURE:
    apply_configure(c, f);
    return 0;
  case CM_WIRE_SELECT:
    apply_select(c, f);
    return 0;
  case CM_WIRE_FLUSH:
    apply_flush(c, f);
    return 0;
  case CM_WIRE_PM:
    apply_pm(c, f);
    return 0;
  default:
    clog_(c, CM_LOG_DEBUG, "ignoring a %s frame (type %u) from the monitor",
          cm_wire_type_name(f->type) ? cm_wire_type_name(f->type) : "unknown", f->type);
    return 0;
  }
}
