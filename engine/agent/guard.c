/*
 * guard.c: the policy of the agent's lag guard (see guard.h and docs/agent.md, "The lag guard").
 */
#include "guard.h"

#include <stdbool.h>
#include <string.h>

#include "cuptimon.h"

#define KIND(k) (1ull << (k))

uint64_t cm__guard_cupti_kinds(void) { return KIND(CM_KIND_RESOURCE) - 1; }

/* The steps, in order: each sheds what it names among the kinds still traced. */
static uint64_t step_kinds(int i) {
  switch (i) {
  case 0: return KIND(CM_KIND_RUNTIME) | KIND(CM_KIND_DRIVER) | KIND(CM_KIND_EXTERNAL_CORRELATION);
  case 1: return cm__guard_cupti_kinds() & ~(KIND(CM_KIND_KERNEL) | KIND(CM_KIND_CONCURRENT_KERNEL));
  case 2: return cm__guard_cupti_kinds();
  default: return 0;
  }
}

uint32_t cm__guard_interval_ms(const cm__guard *g) {
  uint64_t ms = g->limit_ns / 1000000 / 10;
  if (ms < CM_GUARD_CHECK_MIN_MS) ms = CM_GUARD_CHECK_MIN_MS;
  if (ms > CM_GUARD_CHECK_MAX_MS) ms = CM_GUARD_CHECK_MAX_MS;
  return (uint32_t)ms;
}

void cm__guard_reset(cm__guard *g) {
  uint64_t limit = g->limit_ns, buffers = g->buffers_limit;
  memset(g, 0, sizeof *g);
  g->limit_ns = limit;
  g->buffers_limit = buffers;
}

uint64_t cm__guard_check(cm__guard *g, uint64_t now_ms, uint64_t held_ns, uint64_t buffers,
                         uint64_t wanted) {
  if (!g->limit_ns) return 0;
  bool lag_over = held_ns > g->limit_ns;
  bool buf_over = g->buffers_limit && buffers > g->buffers_limit;
  if (!lag_over && !buf_over) {
    g->over = 0;
    return 0;
  }
  if (++g->over < CM_GUARD_CHECKS || now_ms < g->quiet_ms) return 0;
  /* After a step, the next only while a measure over its limit is no better than at the step:
   * a shrinking one is the backlog from before the step draining. */
  if (g->shed && !(lag_over && held_ns >= g->step_lag_ns) &&
      !(buf_over && buffers >= g->step_buffers))
    return 0;
  uint64_t add = 0;
  for (int i = 0; !add && step_kinds(i); i++) add = step_kinds(i) & wanted & ~g->shed;
  if (!add) return 0;
  g->shed |= add;
  g->step_lag_ns = held_ns;
  g->step_buffers = buffers;
  g->over = 0;
  g->quiet_ms = now_ms + g->limit_ns / 1000000;
  return add;
}
