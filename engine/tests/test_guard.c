/*
 * test_guard.c: the policy of the agent's lag guard (engine/agent/guard.c), driven with
 * sequences of measures at chosen times.
 *
 * The guard sheds a step after CM_GUARD_CHECKS checks in a row over its limit; it takes no step
 * in the limit's time after the last; it takes the next step only while CUPTI is no less behind
 * than at the last (a backlog that drains after a step is the step helping); the steps come in
 * order (API records, the other kinds but kernels, kernels) over the kinds the observers want;
 * it is off with a zero limit, and a reset forgets everything but the limits. The buffers CUPTI
 * holds are a second measure with its own limit, judged the same way.
 */
#include <inttypes.h>
#include <stdio.h>

#include "cmt.h"
#include "cuptimon.h"
#include "guard.h"

#define K(k) (1ull << (k))
#define MS 1000000ull

static const uint64_t api = K(CM_KIND_RUNTIME) | K(CM_KIND_DRIVER);
static const uint64_t kern = K(CM_KIND_CONCURRENT_KERNEL);
static const uint64_t copies = K(CM_KIND_MEMCPY) | K(CM_KIND_MEMSET);

/* Runs checks every `step_ms` from `*now` with the measures in `held` (ms); returns the kinds
 * shed by them. */
static uint64_t run(cm__guard *g, uint64_t *now, uint64_t step_ms, const uint64_t *held, int n,
                    uint64_t wanted) {
  uint64_t shed = 0;
  for (int i = 0; i < n; i++, *now += step_ms) shed |= cm__guard_check(g, *now, held[i] * MS, 1, wanted);
  return shed;
}

int main(void) {
  const uint64_t wanted = api | kern | copies;
  cm__guard g = {.limit_ns = 500 * MS};
  CMT_EQ(cm__guard_interval_ms(&g), 50);
  uint64_t now = 1000;

  /* Two checks over, one under, two over: never three in a row, so nothing is shed. */
  const uint64_t noisy[] = {600, 700, 100, 800, 900, 200};
  CMT_EQU(run(&g, &now, 50, noisy, 6, wanted), 0);

  /* Three in a row: the API records go first, and only the kinds that are wanted. */
  const uint64_t behind[] = {600, 700, 800};
  CMT_EQU(run(&g, &now, 50, behind, 3, wanted), api);
  CMT_EQU(g.shed, api);
  CMT_EQU(g.step_lag_ns, 800 * MS);

  /* Within one limit of the step, nothing more, however far behind. */
  const uint64_t soon[] = {2000, 2100, 2200, 2300, 2400, 2500, 2600, 2700, 2800};
  CMT_EQU(run(&g, &now, 50, soon, 9, wanted), 0);
  CMT_EQU(now, 1900); /* the step came at 1400: every check above was within its limit */

  /* Later, still over the limit but less behind than at the step: the backlog drains, the step
   * helped, no further step. */
  cm__guard d = {.limit_ns = 500 * MS};
  uint64_t t = 1000;
  CMT_EQU(run(&d, &t, 50, behind, 3, wanted), api);
  t += 1000;
  const uint64_t draining[] = {790, 760, 720, 690, 650, 600, 560, 520, 400, 300};
  CMT_EQU(run(&d, &t, 50, draining, 10, wanted), 0);
  CMT_EQU(d.shed, api);

  /* Once the limit's time has passed, further behind than at the step (its checks were over the
   * limit all along): the other kinds but kernels go at the first check. */
  const uint64_t worse[] = {900, 950, 1000};
  CMT_EQU(run(&g, &now, 50, worse, 3, wanted), copies);
  CMT_EQU(g.step_lag_ns, 900 * MS);
  /* Then kernels, one limit later and no less behind; after that nothing is left to shed. */
  now += 500;
  const uint64_t worst[] = {1100, 1200, 1300};
  CMT_EQU(run(&g, &now, 50, worst, 3, wanted), kern);
  now += 500;
  CMT_EQU(run(&g, &now, 50, worst, 3, wanted), 0);
  CMT_EQU(g.shed, wanted);

  /* A step that has nothing of its group wanted goes on to the next group at once. */
  cm__guard k = {.limit_ns = 500 * MS};
  t = 1000;
  CMT_EQU(run(&k, &t, 50, behind, 3, kern), kern);

  /* The synthetic kinds are never shed; a zero limit is off; a reset keeps the limit alone. */
  CMT_EQU(cm__guard_cupti_kinds() & K(CM_KIND_RESOURCE), 0);
  cm__guard off = {.limit_ns = 0};
  t = 1000;
  CMT_EQU(run(&off, &t, 50, worst, 3, wanted), 0);
  cm__guard_reset(&g);
  CMT_EQU(g.shed, 0);
  CMT_EQU(g.limit_ns, 500 * MS);
  CMT_EQU(run(&g, &now, 50, behind, 3, wanted), api);

  /* The buffers CUPTI holds, with the time it held records at 0 (CUPTI behind on completing its
   * buffers): over the limit of 6 at three checks in a row sheds; fewer each check after the step
   * (the backlog draining) sheds no more; as many or more does. */
  cm__guard b = {.limit_ns = 500 * MS, .buffers_limit = 6};
  t = 1000;
  const uint64_t bufs[] = {3, 9, 12, 5, 9, 12, 15};
  uint64_t got = 0;
  for (int i = 0; i < 7; i++, t += 50) got |= cm__guard_check(&b, t, 0, bufs[i], wanted);
  CMT_EQU(got, api);
  CMT_EQU(b.step_buffers, 15);
  t += 500;
  const uint64_t fewer[] = {14, 12, 10, 9, 8, 7};
  for (int i = 0; i < 6; i++, t += 50) CMT_EQU(cm__guard_check(&b, t, 0, fewer[i], wanted), 0);
  const uint64_t more[] = {15, 16, 17};
  got = 0;
  for (int i = 0; i < 3; i++, t += 50) got |= cm__guard_check(&b, t, 0, more[i], wanted);
  CMT_EQU(got, copies);
  /* Without a buffer limit, the buffers alone never shed. */
  cm__guard nb = {.limit_ns = 500 * MS};
  t = 1000;
  for (int i = 0; i < 5; i++, t += 50) CMT_EQU(cm__guard_check(&nb, t, 0, 100, wanted), 0);
  cm__guard_reset(&b);
  CMT_EQU(b.buffers_limit, 6);

  /* The interval between checks is a tenth of the limit, within its bounds. */
  cm__guard lo = {.limit_ns = 50 * MS}, hi = {.limit_ns = 60000 * MS};
  CMT_EQ(cm__guard_interval_ms(&lo), CM_GUARD_CHECK_MIN_MS);
  CMT_EQ(cm__guard_interval_ms(&hi), CM_GUARD_CHECK_MAX_MS);
  printf("ok\n");
  return 0;
}
