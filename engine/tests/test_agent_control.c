/*
 * test_agent_control.c: the agent's application of monitor frames (engine/agent/control.c), in
 * process, with recording callbacks instead of an engine and a queue.
 *
 *  1. CONFIGURE values outside the agent's bounds are clamped (each with a log line), values
 *     inside are kept, the pool's total is bounded whatever the order of the names, and an
 *     unknown name is logged and ignored.
 *  2. A SELECT is parsed strictly (an invalid one changes nothing), and one longer than 64 KiB is
 *     refused.
 *  3. A FLUSH's timeout is cut to 60 s; FLUSH_DONE follows with the flush's status.
 *  4. A frame whose header claims more than the 1 MiB bound fails the stream once more than the
 *     bound has arrived, so its bytes never pile up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmt.h"
#include "control.h"
#include "cuptimon.h"
#include "cuptimon_wire.h"

typedef struct rec {
  int selects, configures, flushes, dones;
  cm_config cfg;
  uint64_t queue_bytes;
  int flush_mode;
  uint32_t flush_timeout;
  uint64_t done_id;
  int32_t done_status;
  int sel_count;
  int pms, pm_n;
  char pm[1024];
  char log[16384];
} rec;

static int r_select(void *ud, const cm_selection *sel) {
  rec *r = ud;
  r->selects++;
  r->sel_count = 0;
  for (int k = 0; k < CM_KIND_MAX; k++) r->sel_count += cm_selection_count(sel, k);
  return 0;
}
static int r_configure(void *ud, const cm_config *c) {
  rec *r = ud;
  r->configures++;
  r->cfg = *c;
  return 0;
}
static void r_queue(void *ud, uint64_t b) { ((rec *)ud)->queue_bytes = b; }
static int r_flush(void *ud, int mode, uint32_t t) {
  rec *r = ud;
  r->flushes++;
  r->flush_mode = mode;
  r->flush_timeout = t;
  return CM_ETIMEDOUT;
}
static void r_done(void *ud, uint64_t id, int32_t st) {
  rec *r = ud;
  r->dones++;
  r->done_id = id;
  r->done_status = st;
}
static void r_log(void *ud, int level, const char *msg) {
  rec *r = ud;
  (void)level;
  size_t n = strlen(r->log);
  snprintf(r->log + n, sizeof r->log - n, "%s\n", msg);
}

/* Records a PM request as text: "device/interval/metric+metric|..." or "refused: why". */
static void r_pm(void *ud, const cm__pm_entry *en, int n, const char *refusal) {
  rec *r = ud;
  r->pms++;
  r->pm_n = n;
  r->pm[0] = 0;
  if (n < 0) {
    snprintf(r->pm, sizeof r->pm, "refused: %s", refusal);
    return;
  }
  for (int i = 0; i < n; i++) {
    size_t k = strlen(r->pm);
    snprintf(r->pm + k, sizeof r->pm - k, "%s%d/%u/", i ? "|" : "", en[i].device, en[i].interval_us);
    for (uint32_t j = 0; j < en[i].nmetrics; j++) {
      k = strlen(r->pm);
      snprintf(r->pm + k, sizeof r->pm - k, "%s%s", j ? "+" : "", en[i].metrics[j]);
    }
  }
}

static rec R;
static cm__control C;
static cm_wire_reader *RD;

static void setup(void) {
  memset(&R, 0, sizeof R);
  cm__control_ops ops = {&R, r_select, r_configure, r_queue, r_flush, r_done, r_log, r_pm};
  cm_config cfg;
  cm_config_init(&cfg);
  cm__control_init(&C, &ops, &cfg);
  if (RD) cm_wire_reader_free(RD);
  CMT_OK(cm_wire_reader_new(&RD, 0));
}

/* Sends the frames in `b` through the stream path; returns the last cm__control_next result. */
static int send_buf(cm_wire_buf *b) {
  CMT_OK(cm__control_feed(&C, RD, b->data, b->len));
  cm_wire_buf_clear(b);
  cm_wire_frame f;
  int rc;
  while ((rc = cm__control_next(&C, RD, &f)) == 1) cm__control_apply(&C, &f, NULL);
  return rc;
}

static void test_configure(void) {
  setup();
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_kv kv[] = {{"pool_max_buffers", 1000000}, {"buffer_size", 100 << 20},
                     {"deliver_ms", 50},            {"flush_ms", 0},
                     {"fence_timeout_ms", 5},       {"batch_records", 0},
                     {"send_queue_bytes", 1},       {"bogus", 3}};
  CMT_OK(cm_wire_write_configure(&b, kv, 8));
  CMT_EQ(send_buf(&b), 0);
  printf("configure log:\n%s", R.log);
  CMT_EQ(R.configures, 1);
  CMT_EQU(R.cfg.buffer_size, 64u << 20);
  CMT_EQU(R.cfg.pool_max_buffers, 64); /* 4 GiB / 64 MiB */
  CMT_EQU(R.cfg.deliver_ms, 50);
  CMT_EQU(R.cfg.self_flush_ms, 0);
  CMT_EQU(R.cfg.fence_timeout_ms, CM__CTL_FENCE_MIN_MS);
  CMT_EQU(R.cfg.batch_records, CM__CTL_BATCH_MAX);
  CMT_EQU(R.queue_bytes, CM__CTL_QUEUE_MIN);
  CMT_CONTAINS(R.log, "pool_max_buffers = 1000000 is outside");
  CMT_CONTAINS(R.log, "unknown setting 'bogus'");
  CMT_ASSERT(strstr(R.log, "deliver_ms = 50 is outside") == NULL);
  CMT_EQ(C.clamped, 6);
  /* Names in the other order bound the pool the same way. */
  cm_wire_kv kv2[] = {{"buffer_size", 64 << 20}, {"pool_max_buffers", 1000}};
  CMT_OK(cm_wire_write_configure(&b, kv2, 2));
  CMT_EQ(send_buf(&b), 0);
  CMT_EQU(R.cfg.pool_max_buffers, 64);
  cm_wire_buf_free(&b);
}

static void test_select(void) {
  setup();
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_OK(cm_wire_write_select(&b, "kernel:name,start;memcpy:bytes"));
  CMT_EQ(send_buf(&b), 0);
  CMT_EQ(R.selects, 1);
  CMT_EQ(R.sel_count, 3);
  CMT_OK(cm_wire_write_select(&b, "kernel:name,nosuch"));
  CMT_EQ(send_buf(&b), 0);
  CMT_EQ(R.selects, 1);
  CMT_CONTAINS(R.log, "the previous selection stays");
  size_t n = CM__CTL_MAX_SELECT + 10;
  char *big = malloc(n + 1);
  CMT_ASSERT(big != NULL);
  memset(big, ';', n);
  memcpy(big, "kernel", 6);
  big[n] = '\0';
  CMT_OK(cm_wire_write_select(&b, big));
  free(big);
  CMT_EQ(send_buf(&b), 0);
  CMT_EQ(R.selects, 1);
  CMT_CONTAINS(R.log, "longer than the agent's bound");
  cm_wire_buf_free(&b);
}

static void test_flush(void) {
  setup();
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_OK(cm_wire_write_flush(&b, 77, CM_WIRE_FLUSH_SYNC, 4000000000u));
  CMT_EQ(send_buf(&b), 0);
  CMT_EQ(R.flushes, 1);
  CMT_EQ(R.flush_mode, CM_FLUSH_SYNC);
  CMT_EQU(R.flush_timeout, CM__CTL_FENCE_MAX_MS);
  CMT_EQ(R.dones, 1);
  CMT_EQU(R.done_id, 77);
  CMT_EQ(R.done_status, CM_ETIMEDOUT);
  cm_wire_buf_free(&b);
}

static void test_big_frame(void) {
  setup();
  /* A valid SELECT frame of 2 MiB, fed in 64 KiB pieces: the stream fails once the bound is
   * passed, long before the whole frame has arrived. */
  size_t n = 2u << 20;
  char *big = malloc(n + 1);
  CMT_ASSERT(big != NULL);
  memset(big, ';', n);
  big[n] = '\0';
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_OK(cm_wire_write_select(&b, big));
  free(big);
  int rc = 0;
  size_t fed = 0;
  while (fed < b.len && rc == 0) {
    size_t k = b.len - fed < 65536 ? b.len - fed : 65536;
    CMT_OK(cm__control_feed(&C, RD, b.data + fed, k));
    fed += k;
    cm_wire_frame f;
    while ((rc = cm__control_next(&C, RD, &f)) == 1) cm__control_apply(&C, &f, NULL);
  }
  printf("big frame: failed with %d after %zu of %zu bytes\n", rc, fed, b.len);
  CMT_EQ(rc, CM_ERANGE);
  CMT_LE(fed, CM__CTL_MAX_FRAME + 2 * 65536);
  CMT_EQ(R.selects, 0);
  CMT_CONTAINS(R.log, "control frame of more than");
  cm_wire_buf_free(&b);
}

static void test_pm(void) {
  setup();
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_OK(cm_wire_write_pm(&b, "0:1000:sm__cycles_active.avg,dram__throughput.avg.pct_of_peak_sustained_elapsed;3:500:x.sum"));
  CMT_EQ(send_buf(&b), 0);
  CMT_EQ(R.pms, 1);
  CMT_STREQ(R.pm, "0/1000/sm__cycles_active.avg+dram__throughput.avg.pct_of_peak_sustained_elapsed|3/500/x.sum");
  CMT_OK(cm_wire_write_pm(&b, ""));
  CMT_EQ(send_buf(&b), 0);
  CMT_EQ(R.pms, 2);
  CMT_EQ(R.pm_n, 0);
  /* Each malformed request is refused with its reason, and counted. */
  static const char *const bad[][2] = {
      {"0:1000:", "names no metric"},
      {"0:1000", "not device:interval_us:metrics"},
      {"x:1000:a", "not device:interval_us:metrics"},
      {"0:99999999999:a", "not device:interval_us:metrics"},
      {"0:5:a", "interval_us 5 is outside"},
      {"0:1000:a,,b", "empty or too long"},
      {"2000:1000:a", "not device:interval_us:metrics"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CMT_OK(cm_wire_write_pm(&b, bad[i][0]));
    CMT_EQ(send_buf(&b), 0);
    CMT_EQ(R.pm_n, CM_EINVAL);
    CMT_CONTAINS(R.pm, bad[i][1]);
  }
  CMT_EQ(C.clamped, (int)(sizeof bad / sizeof bad[0]));
  /* The parser on its own: the device and metric bounds. */
  static cm__pm_entry en[CM__CTL_PM_ENTRIES];
  static char text[200000], buf[200000];
  char why[256];
  size_t k = 0;
  for (uint32_t i = 0; i <= CM__CTL_PM_ENTRIES; i++) k += (size_t)snprintf(text + k, sizeof text - k, "%s%u:100:m", i ? ";" : "", i);
  CMT_EQ(cm_wire_parse_pm(text, k, buf, sizeof buf, en, CM__CTL_PM_ENTRIES, why, sizeof why), CM_EINVAL);
  CMT_CONTAINS(why, "more than 64 devices");
  k = (size_t)snprintf(text, sizeof text, "0:100:");
  for (uint32_t i = 0; i <= CM__CTL_PM_METRICS; i++) k += (size_t)snprintf(text + k, sizeof text - k, "%sm%u", i ? "," : "", i);
  CMT_EQ(cm_wire_parse_pm(text, k, buf, sizeof buf, en, CM__CTL_PM_ENTRIES, why, sizeof why), CM_EINVAL);
  CMT_CONTAINS(why, "more than 64 metrics");
  CMT_EQ(cm_wire_parse_pm("0:100:a", 7, buf, 4, en, 1, why, sizeof why), CM_EINVAL);
  CMT_CONTAINS(why, "over the bound");
  cm_wire_buf_free(&b);
  printf("pm: ok\n");
}

int main(void) {
  test_pm();
  test_configure();
  test_select();
  test_flush();
  test_big_frame();
  cm_wire_reader_free(RD);
  printf("ok\n");
  return 0;
}
