/*
 * env.h: the monitor's tunables read from the environment (CUPTIMON_DRAIN_MS,
 * CUPTIMON_KILL_GRACE_MS, CUPTIMON_MAX_AGENTS...). Used by the hub (hub.c) and the supervisor
 * (supervise.c); implemented in env.c.
 *
 * Design note. One parser, so every such variable means the same thing: a decimal unsigned
 * integer, and anything else (unset, empty, trailing characters) is the default. The callers
 * bound the values themselves. Any thread: it reads the environment and keeps no state.
 */
#ifndef CM_ENV_H
#define CM_ENV_H

#include <stdint.h>

/* The value of environment variable `name` as a decimal unsigned integer, or `dflt` when it is
 * unset, empty or not a number. */
uint64_t cm__env_u64(const char *name, uint64_t dflt);

#endif /* CM_ENV_H */
