/*
 * test_pm_sample.c: PM sampling on the fake CUPTI (fake_pm.c). Consumers, the per-device union
 * and its restarts, the decode into CM_KIND_PM_SAMPLE records with their values and timestamps,
 * the clock-domain filter, the image-full and overflow paths, the refusals (unknown metric, two
 * passes, no permission) and the rule that every CUPTI object is released exactly once.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_internal.h"
#include "cmt.h"
#include "cuptimon.h"
#include "fake_cupti.h"

#define MAXR 40000

static struct {
  uint32_t n;
  uint32_t device[MAXR];
  uint64_t start[MAXR], stop[MAXR], sample[MAXR];
  char metric[MAXR][96];
  double value[MAXR];
} got;

static cm_engine *g_e;

static void on_batch(void *ud, const cm_batch *b) {
  (void)ud;
  CMT_EQ(b->kind, CM_KIND_PM_SAMPLE);
  const cm_column *dev = cm_batch_column(b, cm_field_by_name(CM_KIND_PM_SAMPLE, "device"));
  const cm_column *st = cm_batch_column(b, cm_field_by_name(CM_KIND_PM_SAMPLE, "start"));
  const cm_column *sp = cm_batch_column(b, cm_field_by_name(CM_KIND_PM_SAMPLE, "stop"));
  const cm_column *me = cm_batch_column(b, cm_field_by_name(CM_KIND_PM_SAMPLE, "metric"));
  const cm_column *sa = cm_batch_column(b, cm_field_by_name(CM_KIND_PM_SAMPLE, "sample"));
  const cm_column *va = cm_batch_column(b, cm_field_by_name(CM_KIND_PM_SAMPLE, "value"));
  CMT_ASSERT(dev && st && sp && me && sa && va);
  CMT_EQ(va->type, CM_TYPE_F64);
  CMT_EQ(me->type, CM_TYPE_STR);
  for (uint32_t i = 0; i < b->n; i++) {
    CMT_LT(got.n, MAXR);
    uint32_t k = got.n++;
    got.device[k] = ((const uint32_t *)dev->data)[i];
    got.start[k] = ((const uint64_t *)st->data)[i];
    got.stop[k] = ((const uint64_t *)sp->data)[i];
    got.sample[k] = ((const uint64_t *)sa->data)[i];
    got.value[k] = ((const double *)va->data)[i];
    size_t len = 0;
    const char *s = cm_string(g_e, ((const uint32_t *)me->data)[i], &len);
    CMT_ASSERT(s && len < sizeof got.metric[k]);
    memcpy(got.metric[k], s, len);
    got.metric[k][len] = 0;
  }
}

/* Checks that records [from, got.n) are `nsamples` samples of the metrics `m`, numbered from
 * `sample0` (the fake numbered them from `seq0`), each with the fake's value, emitted at `t0` + i * dt. */
static void expect(uint32_t from, uint32_t nsamples, const char *const *m, int nm, uint64_t sample0,
                   uint64_t seq0, uint64_t t0, uint64_t dt) {
  CMT_EQU(got.n - from, (uint64_t)nsamples * (uint64_t)nm);
  for (uint32_t i = 0; i < nsamples; i++) {
    for (int j = 0; j < nm; j++) {
      uint32_t k = from + i * (uint32_t)nm + (uint32_t)j;
      bool known = false;
      for (int q = 0; q < nm; q++) known |= !strcmp(got.metric[k], m[q]);
      if (!known) CMT_FAIL("record %u has metric %s, not one asked for", k, got.metric[k]);
      CMT_EQU(got.sample[k], sample0 + i);
      CMT_EQU(got.device[k], 0);
      CMT_EQU(got.start[k], t0 + i * dt);
      CMT_EQU(got.stop[k], t0 + (i + 1) * dt);
      double want = fake_pm_value(got.metric[k], seq0 + i);
      if (got.value[k] != want) CMT_FAIL("record %u value %f, want %f", k, got.value[k], want);
    }
  }
}

static void test_union_and_decode(void) {
  static const char *const a[] = {"sm__cycles_active.avg", "dram__throughput.avg.pct_of_peak_sustained_elapsed"};
  static const char *const b[] = {"dram__throughput.avg.pct_of_peak_sustained_elapsed",
                                  "pcie__read_bytes.sum.per_second"};
  static const char *const ab[] = {"sm__cycles_active.avg",
                                   "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                                   "pcie__read_bytes.sum.per_second"};
  fake_pm_stats fs;
  uint32_t ida, idb;
  CMT_OK(cm_pm_sample_add(g_e, 0, a, 2, 1000, &ida));
  fake_pm_get_stats(&fs);
  CMT_EQU(fs.enables, 1);
  CMT_EQU(fs.starts, 1);
  CMT_EQU(fs.last_interval, 1000000); /* ns, in the time-interval trigger mode */
  CMT_EQU(fs.last_trigger_mode, CUPTI_PM_SAMPLING_TRIGGER_MODE_GPU_TIME_INTERVAL);
  CMT_GE(fs.last_hw_buffer, 32u << 20);

  /* Ten samples on the record clock, and one from another clock domain, which is filtered. */
  uint64_t t0 = fake_now();
  CMT_EQ(fake_pm_emit(0, 10, t0, 1000000), 10);
  CMT_EQ(fake_pm_emit(0, 1, 12345, 1000), 1);
  uint32_t from = got.n;
  CMT_OK(cm_flush(g_e, CM_FLUSH_PLAIN, 5000));
  expect(from, 10, a, 2, 0, 0, t0, 1000000);
  cm_pm_stats ps;
  CMT_OK(cm_pm_stats_get(g_e, &ps));
  CMT_EQU(ps.filtered, 1);
  CMT_EQU(ps.samples, 10);
  CMT_EQU(ps.consumers, 1);

  /* A second consumer widens the union: the session restarts over three metrics, at the shorter
   * interval. Samples left in the old session are delivered, not lost. */
  CMT_EQ(fake_pm_emit(0, 3, t0 + 20000000, 1000000), 3);
  from = got.n;
  CMT_OK(cm_pm_sample_add(g_e, 0, b, 2, 500, &idb));
  fake_pm_get_stats(&fs);
  CMT_EQU(fs.enables, 2);
  CMT_EQU(fs.disables, 1);
  CMT_EQU(fs.last_interval, 500000);
  CMT_OK(cm_flush(g_e, CM_FLUSH_PLAIN, 5000));
  expect(from, 3, a, 2, 10, 11, t0 + 20000000, 1000000);
  uint64_t t1 = fake_now();
  CMT_EQ(fake_pm_emit(0, 4, t1, 500000), 4);
  from = got.n;
  CMT_OK(cm_flush(g_e, CM_FLUSH_PLAIN, 5000));
  expect(from, 4, ab, 3, 13, 14, t1, 500000);

  /* An unchanged union does not restart; removing one consumer restarts over the other's. */
  uint32_t idc;
  CMT_OK(cm_pm_sample_add(g_e, 0, a, 1, 2000, &idc));
  fake_pm_get_stats(&fs);
  CMT_EQU(fs.enables, 2);
  CMT_OK(cm_pm_sample_remove(g_e, idc));
  CMT_OK(cm_pm_sample_remove(g_e, ida));
  fake_pm_get_stats(&fs);
  CMT_EQU(fs.enables, 3);
  CMT_OK(cm_pm_sample_remove(g_e, idb));
  CMT_EQ(cm_pm_sample_remove(g_e, idb), CM_ENOENT);
  fake_pm_get_stats(&fs);
  CMT_EQU(fs.enables, fs.disables);
  CMT_EQU(fs.host_inits, fs.host_deinits);
  CMT_EQU(fs.double_releases, 0);
  CMT_EQU(fs.profiler_initialize_calls, 1);
  CMT_EQU(fs.profiler_deinitialize_calls, 0);
  printf("union and decode: ok\n");
}

/* More samples than the counter data image holds are decoded in several rounds; past the
 * hardware buffer's capacity, the overflow is counted. */
static void test_full_and_overflow(void) {
  static const char *const a[] = {"sm__cycles_active.avg"};
  uint32_t id;
  CMT_OK(cm_pm_sample_add(g_e, 0, a, 1, 1000, &id));
  uint64_t t0 = fake_now();
  fake_pm_stats before, after;
  fake_pm_get_stats(&before);
  CMT_EQ(fake_pm_emit(0, 4000, t0, 100000), 4000);
  uint32_t from = got.n;
  cm_pm_stats ps0, ps;
  CMT_OK(cm_pm_stats_get(g_e, &ps0));
  CMT_OK(cm_flush(g_e, CM_FLUSH_PLAIN, 5000));
  fake_pm_get_stats(&after);
  CMT_GE(after.decodes - before.decodes, 2); /* the image filled at least once */
  CMT_EQU(got.n - from, 4000);
  for (uint32_t i = 1; i < 4000; i++) CMT_EQU(got.sample[from + i], got.sample[from] + i);
  CMT_EQ(fake_pm_emit(0, 5000, t0, 100000), 4096);
  CMT_OK(cm_flush(g_e, CM_FLUSH_PLAIN, 5000));
  CMT_OK(cm_pm_stats_get(g_e, &ps));
  CMT_EQU(ps.overflows - ps0.overflows, 1);
  CMT_OK(cm_pm_sample_remove(g_e, id));
  printf("image full and overflow: ok\n");
}

static void test_refusals(void) {
  static const char *const good[] = {"sm__cycles_active.avg"};
  static const char *const bad[] = {"sm__cycles_active.avg", "sm__no_such_metric.avg"};
  static const char *const two[] = {"fake__two_pass.sum"};
  uint32_t id, keep;
  fake_pm_stats fs;
  CMT_OK(cm_pm_sample_add(g_e, 0, good, 1, 1000, &keep));
  CMT_EQ(cm_pm_sample_add(g_e, 0, bad, 2, 1000, &id), CM_ENOENT);
  CMT_CONTAINS(cm_errmsg(), "\"sm__no_such_metric.avg\" cannot be PM-sampled on device 0 (chip FAKE100)");
  /* An unknown base: the chip's base metrics of the same unit are suggested. */
  CMT_CONTAINS(cm_errmsg(), "Base metrics of this chip with that unit: sm__cycles_active, "
                            "sm__pipe_tensor_op_hmma_cycles_active, sm__throughput");
  /* A known base with an unknown rollup: its sub-metrics are suggested. */
  static const char *const rollup[] = {"dram__throughput.max"};
  CMT_EQ(cm_pm_sample_add(g_e, 0, rollup, 1, 1000, &id), CM_ENOENT);
  CMT_CONTAINS(cm_errmsg(), "This chip offers dram__throughput with: .avg.pct_of_peak_sustained_elapsed");
  CMT_EQ(cm_pm_sample_add(g_e, 0, two, 1, 1000, &id), CM_ENOSYS);
  CMT_CONTAINS(cm_errmsg(), "need 2 passes");
  /* The refused consumers left the first one sampling. */
  uint64_t t0 = fake_now();
  CMT_EQ(fake_pm_emit(0, 2, t0, 1000000), 2);
  uint32_t from = got.n;
  CMT_OK(cm_flush(g_e, CM_FLUSH_PLAIN, 5000));
  CMT_EQU(got.n - from, 2);
  CMT_STREQ(got.metric[from], "sm__cycles_active.avg");
  CMT_OK(cm_pm_sample_remove(g_e, keep));

  /* A device that is not ready yet is CM_EAGAIN, and the next try succeeds. */
  fake_pm_set_not_ready(1);
  CMT_EQ(cm_pm_sample_add(g_e, 1, good, 1, 1000, &id), CM_EAGAIN);
  CMT_CONTAINS(cm_errmsg(), "CUPTI_ERROR_NOT_READY");
  CMT_OK(cm_pm_sample_add(g_e, 1, good, 1, 1000, &id));
  CMT_OK(cm_pm_sample_remove(g_e, id));

  fake_pm_set_denied(1);
  CMT_EQ(cm_pm_sample_add(g_e, 1, good, 1, 1000, &id), CM_EPERM);
  CMT_CONTAINS(cm_errmsg(), "cuptiPmSamplingEnable failed: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES");
  CMT_CONTAINS(cm_errmsg(), "NVreg_RestrictProfilingToAdminUsers=0");
  fake_pm_set_denied(0);

  CMT_EQ(cm_pm_sample_add(g_e, 0, good, 1, 5, &id), CM_EINVAL);
  CMT_EQ(cm_pm_sample_add(g_e, -1, good, 1, 1000, &id), CM_EINVAL);
  CMT_EQ(cm_pm_sample_add(g_e, 0, good, 0, 1000, &id), CM_EINVAL);
  fake_pm_get_stats(&fs);
  CMT_EQU(fs.enables, fs.disables);
  CMT_EQU(fs.host_inits, fs.host_deinits);
  CMT_EQU(fs.double_releases, 0);
  printf("refusals: ok\n");
}

/* The decode path on its own: timestamps move by the clock offset, and the window filters. */
static void test_decode_offset(void) {
  static const char *m[] = {"pcie__write_bytes.sum.per_second"};
  uint32_t id;
  CMT_OK(cm_pm_sample_add(g_e, 2, m, 1, 1000, &id));
  /* Reach the device's objects through a second, direct use of the fake's entry points. */
  cm__cupti c;
  CMT_OK(cm__cupti_load(&c));
  CUpti_Profiler_Host_Initialize_Params hp = {.structSize = CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE,
                                              .profilerType = CUPTI_PROFILER_TYPE_PM_SAMPLING,
                                              .pChipName = "FAKE100"};
  CMT_EQ(c.HostInitialize(&hp), CUPTI_SUCCESS);
  CUpti_Profiler_Host_ConfigAddMetrics_Params ap = {
      .structSize = CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE,
      .pHostObject = hp.pHostObject, .ppMetricNames = m, .numMetrics = 1};
  CMT_EQ(c.HostConfigAddMetrics(&ap), CUPTI_SUCCESS);
  CUpti_PmSampling_Enable_Params ep = {.structSize = CUpti_PmSampling_Enable_Params_STRUCT_SIZE,
                                       .deviceIndex = 3};
  CMT_EQ(c.PmEnable(&ep), CUPTI_SUCCESS);
  static uint8_t image[1 << 16];
  CUpti_PmSampling_CounterDataImage_Initialize_Params ip = {
      .structSize = CUpti_PmSampling_CounterDataImage_Initialize_Params_STRUCT_SIZE,
      .pPmSamplingObject = ep.pPmSamplingObject, .counterDataSize = sizeof image, .pCounterData = image};
  CMT_EQ(c.PmCounterDataImageInitialize(&ip), CUPTI_SUCCESS);
  CMT_EQ(fake_pm_emit(3, 3, 1000000, 1000), 3);
  CUpti_PmSampling_DecodeData_Params dp = {.structSize = CUpti_PmSampling_DecodeData_Params_STRUCT_SIZE,
                                           .pPmSamplingObject = ep.pPmSamplingObject,
                                           .pCounterDataImage = image, .counterDataImageSize = sizeof image};
  CMT_EQ(c.PmDecodeData(&dp), CUPTI_SUCCESS);
  cm__pm_columns cols = {0};
  uint64_t filtered = 0;
  /* An offset of +500 ns: CUPTI's clock runs ahead of the record clock. The window keeps the
   * first two samples only. */
  CMT_OK(cm__pm_decode_image(&c, ep.pPmSamplingObject, hp.pHostObject, image, sizeof image, m, 1,
                             500, 999000, 1001500, &cols, &filtered));
  CMT_EQU(cols.n, 2);
  CMT_EQU(filtered, 1);
  CMT_EQU(cols.start[0], 999500);
  CMT_EQU(cols.stop[1], 1001500);
  CMT_ASSERT(cols.values[1] == fake_pm_value(m[0], 1));
  cm__pm_columns_free(&cols);
  CUpti_PmSampling_Disable_Params xp = {.structSize = CUpti_PmSampling_Disable_Params_STRUCT_SIZE,
                                        .pPmSamplingObject = ep.pPmSamplingObject};
  CMT_EQ(c.PmDisable(&xp), CUPTI_SUCCESS);
  CUpti_Profiler_Host_Deinitialize_Params dh = {.structSize = CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE,
                                                .pHostObject = hp.pHostObject};
  CMT_EQ(c.HostDeinitialize(&dh), CUPTI_SUCCESS);
  CMT_OK(cm_pm_sample_remove(g_e, id));
  printf("decode with a clock offset: ok\n");
}

/* No CUDA context on the device yet: the start is refused with CM_EAGAIN before any PM call (the
 * agent retries). Once the context exists the session starts; when the context goes away while
 * sampling (the runtime's teardown at exit), no PM call touches the sampling object any more
 * (no decode, no stop, no disable: the object is left), the host object is still freed, and the
 * lost poll is counted in `dropped`. */
static void test_context(void) {
  static const char *const a[] = {"sm__cycles_active.avg"};
  fake_pm_stats before, after;
  fake_pm_get_stats(&before);
  fake_set_primary_inactive(1);
  uint32_t id = 0;
  CMT_EQ(cm_pm_sample_add(g_e, 0, a, 1, 1000, &id), CM_EAGAIN);
  if (!strstr(cm_errmsg(), "device 0 has no CUDA context yet"))
    CMT_FAIL("unexpected message: %s", cm_errmsg());
  fake_pm_get_stats(&after);
  CMT_EQU(after.enables, before.enables);
  CMT_EQU(after.host_inits, before.host_inits);
  fake_set_primary_inactive(0);
  CMT_OK(cm_pm_sample_add(g_e, 0, a, 1, 1000, &id));
  cm_pm_stats ps0, ps;
  CMT_OK(cm_pm_stats_get(g_e, &ps0));
  fake_pm_get_stats(&before);
  fake_set_primary_inactive(1);
  CMT_EQ(fake_pm_emit(0, 10, fake_now(), 100000), 10);
  CMT_OK(cm_flush(g_e, CM_FLUSH_PLAIN, 5000));
  CMT_OK(cm_pm_sample_remove(g_e, id));
  fake_set_primary_inactive(0);
  fake_pm_get_stats(&after);
  CMT_EQU(after.decodes, before.decodes);
  CMT_EQU(after.stops, before.stops);
  CMT_EQU(after.disables, before.disables);
  CMT_EQU(after.host_deinits - before.host_deinits, 1);
  CMT_EQU(after.double_releases, 0);
  CMT_OK(cm_pm_stats_get(g_e, &ps));
  CMT_EQU(ps.dropped - ps0.dropped, 1);
  CMT_EQU(ps.polls, ps0.polls);
  printf("no context yet, and a context gone: ok\n");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  cm_config cfg;
  cm_config_init(&cfg);
  CMT_OK(cm_engine_new(&g_e, &cfg));
  cm_selection *sel;
  CMT_OK(cm_selection_new(&sel));
  CMT_OK(cm_selection_parse(sel, "pm"));
  uint32_t obs;
  CMT_OK(cm_observe(g_e, sel, on_batch, NULL, &obs));
  cm_selection_free(sel);
  test_union_and_decode();
  test_full_and_overflow();
  test_refusals();
  test_decode_offset();
  test_context();
  /* A consumer left at exit is stopped by cm_engine_free, once. */
  static const char *const a[] = {"sm__cycles_active.avg"};
  uint32_t id;
  CMT_OK(cm_pm_sample_add(g_e, 1, a, 1, 1000, &id));
  cm_engine_free(g_e);
  fake_pm_stats fs;
  fake_pm_get_stats(&fs);
  /* test_context left the one sampling object whose context was gone. */
  CMT_EQU(fs.enables, fs.disables + 1);
  CMT_EQU(fs.host_inits, fs.host_deinits);
  CMT_EQU(fs.double_releases, 0);
  CMT_EQU(fs.profiler_deinitialize_calls, 0);
  /* Every input CUPTI may keep a pointer to lived as long as the object that got it. */
  CMT_EQU(fs.stale_inputs, 0);
  printf("ok\n");
  return 0;
}
