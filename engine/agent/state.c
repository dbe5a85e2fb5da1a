/*
 * state.c: the agent's one state, A (agent_internal.h declares it and groups its fields by the lock
 * or thread that owns them).
 *
 * Design note. The state is defined in a file of its own, which calls nothing, so that the agent's
 * files depend on it without depending on each other: each of them reads and writes the fields it
 * owns, and calls the others in one direction only (agent_internal.h). Its initial values are
 * those of an agent that has not started: no descriptor, no wake-up pipe, no kind yet sent.
 */
#include <pthread.h>

#include "agent_internal.h"

struct cm__agent cm__agent = {
    .init_mu = PTHREAD_MUTEX_INITIALIZER,
    .send_mu = PTHREAD_MUTEX_INITIALIZER,
    .fd = -1,
    .wake = {-1, -1},
    .cb_last_kind = -1,
};
