/*
 * clock.c: the time helpers every engine module shares. Records carry CLOCK_REALTIME
 * nanoseconds (the engine checks at start that CUPTI's clock is CLOCK_REALTIME), while deadlines
 * and cadences use CLOCK_MONOTONIC, which never jumps. Every function is thread-safe.
 */
#include <time.h>

#include "cm_internal.h"

uint64_t cm__realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t cm__mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void cm__abstime_in(struct timespec *ts, uint64_t ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += (time_t)(ms / 1000);
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}
