/*
 * fuzz_agent_control.c: a libFuzzer target for how the agent applies the monitor's control frames
 * (engine/agent/control.c): the stream bound, CONFIGURE's clamps, SELECT's parse, FLUSH's
 * timeout.
 *
 * Design note. The agent's effects (the engine, the send queue) are replaced by checking
 * callbacks, so the target needs no CUPTI and no monitor. The first input byte picks a mode:
 *   0  the rest is a frame stream from the monitor, fed in chunks whose size comes from byte 1;
 *   1  the rest is a list of requests {u8 op, u8 n, n bytes}; each becomes a well-formed frame
 *      (op 0: CONFIGURE whose items are {u8 name index, u64 value} from the bytes, op 1: SELECT of
 *      the bytes as text, op 2: FLUSH{id, flags, timeout} from the bytes, op 3: HELLO_ACK, op 4:
 *      a frame of an unknown type, op 5: a PM request of the bytes as text), and the stream goes through the same path as mode 0, so the
 *      checksums that random bytes never get right do not hide the logic behind them.
 * The invariants checked: no crash, no sanitizer report; every configuration handed to the
 * engine and every queue bound and flush timeout lies within the agent's documented bounds; a
 * selection handed over is not empty of meaning (it came from a strict parse); a PM request
 * handed over has 1..64 metrics per entry, each 1..256 bytes, and a refusal says why; log lines are
 * NUL-terminated and short.
 */
#include "control.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile size_t sink;

static int f_select(void *ud, const cm_selection *sel) {
  (void)ud;
  if (!sel) abort();
  for (int k = 0; k < CM_KIND_MAX; k++) sink += (size_t)cm_selection_count(sel, k);
  return 0;
}

static int f_configure(void *ud, const cm_config *c) {
  (void)ud;
  if (c->buffer_size < CM__CTL_BUFFER_MIN || c->buffer_size > CM__CTL_BUFFER_MAX || c->buffer_size % 8)
    abort();
  if (c->pool_max_buffers < 1 || c->pool_max_buffers > CM__CTL_POOL_MAX) abort();
  if ((uint64_t)c->buffer_size * c->pool_max_buffers > CM__CTL_POOL_BYTES_MAX) abort();
  if (c->self_flush_ms && (c->self_flush_ms < CM__CTL_CADENCE_MIN_MS || c->self_flush_ms > CM__CTL_CADENCE_MAX_MS))
    abort();
  if (c->deliver_ms && (c->deliver_ms < CM__CTL_CADENCE_MIN_MS || c->deliver_ms > CM__CTL_CADENCE_MAX_MS))
    abort();
  if (c->fence_timeout_ms < CM__CTL_FENCE_MIN_MS || c->fence_timeout_ms > CM__CTL_FENCE_MAX_MS) abort();
  if (c->batch_records < CM__CTL_BATCH_MIN || c->batch_records > CM__CTL_BATCH_MAX) abort();
  return 0;
}

static void f_queue_bytes(void *ud, uint64_t bytes) {
  (void)ud;
  if (bytes < CM__CTL_QUEUE_MIN || bytes > CM__CTL_QUEUE_MAX) abort();
}

static int f_flush(void *ud, int mode, uint32_t timeout_ms) {
  (void)ud;
  if ((mode != CM_FLUSH_PLAIN && mode != CM_FLUSH_SYNC) || timeout_ms > CM__CTL_FENCE_MAX_MS) abort();
  return 0;
}

static void f_flush_done(void *ud, uint64_t id, int32_t status) {
  (void)ud;
  sink += (size_t)id + (size_t)status;
}

static void f_log(void *ud, int level, const char *msg) {
  (void)ud;
  if (level < 0 || level > 3) abort();
  size_t n = strlen(msg);
  if (n >= 1024) abort();
  sink += n;
}

/* A PM request's entries must hold what the parser promised. */
static void f_pm(void *ud, const cm__pm_entry *en, int n, const char *refusal) {
  (void)ud;
  if (n < 0) {
    if (!refusal || !*refusal) abort();
    return;
  }
  for (int i = 0; i < n; i++) {
    if (!en[i].nmetrics || en[i].nmetrics > CM__CTL_PM_METRICS) abort();
    for (uint32_t j = 0; j < en[i].nmetrics; j++) {
      size_t l = strlen(en[i].metrics[j]);
      if (!l || l > CM__CTL_PM_NAME) abort();
    }
  }
}

static const cm__control_ops ops = {NULL, f_select, f_configure, f_queue_bytes, f_flush, f_flush_done, f_log, f_pm};

static const char *const names[] = {"buffer_size", "pool_max_buffers", "flush_ms", "deliver_ms",
                                    "fence_timeout_ms", "batch_records", "send_queue_bytes",
                                    "no_such_setting"};

/* Feeds `p[0..n)` in chunks of `chunk` bytes and applies every frame, as the control thread does. */
static void run_stream(const uint8_t *p, size_t n, size_t chunk) {
  /* The agent's starting configuration (cm_config_init's defaults, deliver_ms 200); the target does
   * not link the engine, which cm_config_init lives in. */
  cm_config cfg = {.buffer_size = 4u << 20, .pool_max_buffers = 256, .warn_outstanding = 64,
                   .deliver_ms = 200, .fence_timeout_ms = 5000, .batch_records = 1u << 20};
  cm__control c;
  cm__control_init(&c, &ops, &cfg);
  cm_wire_reader *r = NULL;
  if (cm_wire_reader_new(&r, 0) != 0) return;
  for (size_t off = 0; off < n;) {
    size_t k = n - off < chunk ? n - off : chunk;
    if (cm__control_feed(&c, r, p + off, k) != 0) break;
    off += k;
    cm_wire_frame f;
    int rc;
    while ((rc = cm__control_next(&c, r, &f)) == 1) {
      int32_t ack = 0;
      cm__control_apply(&c, &f, &ack);
    }
    if (rc < 0) break;
  }
  cm_wire_reader_free(r);
}

static uint64_t le64(const uint8_t *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n && i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  uint8_t mode = data[0] & 1, arg = data[1];
  const uint8_t *p = data + 2;
  size_t n = size - 2;
  if (mode == 0) {
    run_stream(p, n, arg ? arg : n + 1);
    return 0;
  }
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  for (size_t off = 0; off + 2 <= n;) {
    uint8_t op = p[off] % 6;
    size_t len = p[off + 1];
    off += 2;
    if (len > n - off) len = n - off;
    const uint8_t *q = p + off;
    off += len;
    switch (op) {
    case 0: {
      cm_wire_kv kv[32];
      uint32_t m = 0;
      for (size_t i = 0; i + 1 <= len && m < 32; i += 9)
        kv[m++] = (cm_wire_kv){.name = names[q[i] % 8], .value = le64(q + i + 1, len - i - 1 < 8 ? len - i - 1 : 8)};
      if (cm_wire_write_configure(&b, kv, m)) abort();
      break;
    }
    case 1: {
      char text[256];
      memcpy(text, q, len);
      text[len] = '\0';
      if (cm_wire_write_select(&b, text)) abort();
      break;
    }
    case 2:
      if (cm_wire_write_flush(&b, le64(q, len), len > 8 ? q[8] : 0,
                              (uint32_t)(len > 9 ? le64(q + 9, len - 9 < 4 ? len - 9 : 4) : 0)))
        abort();
      break;
    case 3:
      if (cm_wire_write_hello_ack(&b, len ? -(int32_t)(q[0] % 20) : 0, "")) abort();
      break;
    case 5: {
      char text[256];
      memcpy(text, q, len);
      text[len] = '\0';
      if (cm_wire_write_pm(&b, text)) abort();
      break;
    }
    default:
      if (cm_wire_write_frame(&b, 300, 0, CM_WIRE_MINOR, q, len)) abort();
      break;
    }
  }
  run_stream(b.data, b.len, arg ? (size_t)arg * 8 : b.len + 1);
  cm_wire_buf_free(&b);
  return 0;
}
