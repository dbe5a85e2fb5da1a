/*
 * guard.h: the policy of the agent's lag guard (tracing.c's cm__tracing_guard_tick measures; this
 * decides).
 *
 * It has two measures, each with its limit: how long CUPTI held records back before writing them
 * (the largest over the buffers decoded since the last check), and how many activity buffers
 * CUPTI holds (handed to it and not yet completed: a CUPTI behind under sustained load can keep
 * records in buffers it does not complete and ask for new ones, so that the first measure stays
 * at 0 while the second grows). When either stays over its limit for
 * CM_GUARD_CHECKS checks in a row, each on a buffer decoded since the last, the guard sheds the
 * next group of kinds: the
 * API records (runtime, driver, external correlation), then every other kind CUPTI writes but
 * kernels, then kernels. After a step it waits one limit's time, and it takes the next step only
 * while CUPTI is no less behind than when it took the last: the backlog CUPTI held from before a
 * step drains after it, so a measure that shrinks means that the step helped. Nothing is ever
 * turned back on. Pure functions of their arguments, so a test can drive them with any sequence.
 */
#ifndef CM_AGENT_GUARD_H
#define CM_AGENT_GUARD_H

#include <stdint.h>

enum { CM_GUARD_CHECKS = 3, CM_GUARD_CHECK_MIN_MS = 20, CM_GUARD_CHECK_MAX_MS = 1000 };

typedef struct cm__guard {
  uint64_t limit_ns;    /* the limit on the time CUPTI held records; 0 turns the guard off */
  uint64_t buffers_limit; /* the limit on the buffers CUPTI holds; 0: no such limit */
  uint32_t over;        /* the checks in a row with a measure over its limit */
  uint64_t quiet_ms;    /* no step before this time (monotonic ms): one limit after the last */
  uint64_t shed;        /* the kinds shed so far, one bit per kind */
  uint64_t step_lag_ns; /* the measures when the last step was taken */
  uint64_t step_buffers;
} cm__guard;

/* Every kind CUPTI writes: the engine's synthetic kinds (from CM_KIND_RESOURCE on) cost CUPTI
 * nothing and are never shed. */
uint64_t cm__guard_cupti_kinds(void);
/* The time between checks: a tenth of the limit, within [CM_GUARD_CHECK_MIN_MS,
 * CM_GUARD_CHECK_MAX_MS]. */
uint32_t cm__guard_interval_ms(const cm__guard *g);
/* Forgets the session's state (the limit stays). */
void cm__guard_reset(cm__guard *g);
/* One check, at `now_ms`, on the measures `held_ns` (taken from buffers decoded since the last
 * check) and `buffers` (CUPTI's now), with `wanted` the kinds enabled for the observers. Returns
 * the kinds to shed now (0: none) and records them in g->shed. */
uint64_t cm__guard_check(cm__guard *g, uint64_t now_ms, uint64_t held_ns, uint64_t buffers,
                         uint64_t wanted);

#endif /* CM_AGENT_GUARD_H */
