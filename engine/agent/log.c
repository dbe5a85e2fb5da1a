/*
 * log.c: the agent's stderr log (agent_internal.h declares it).
 *
 * Design note. The agent never prints through stdio: each line is formatted on the stack and
 * written with one write(2) (cm__stderr_linev), so lines of the agent's threads, of the
 * application's and of other processes on the terminal never interleave, and nothing waits in a
 * buffer if the process dies next. The threshold is CUPTIMON_AGENT_LOG (A.level, an atomic set at
 * start-up). Lines that a duty cycle repeats every window go through
 * repeat.c's rule under log_mu, a leaf lock; every other line is an event and is printed.
 * Any thread.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "repeat.h"
#include "agent_internal.h"

static const char *level_names[] = {"error", "warn", "info", "debug"};

/* A line that can repeat once a window (cm__alog_repeat) is printed once a minute at most, with the
 * count of the repeats it stands for, and the counts not yet said are printed at the exit
 * (repeat.h): a duty cycle whose every window fails the same way says so once a minute, not once
 * a window. Other lines are events, each printed.
 * CUPTIMON_AGENT_LOG_REPEAT_MS sets the interval (0 prints every line). Guarded by log_mu, a
 * leaf lock. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static cm__repeat log_repeat = {.interval_ms = 60000};

static void say_line(const char *prefix, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say_line(const char *prefix, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cm__stderr_linev(prefix, fmt, ap);
  va_end(ap);
}

static void say_repeats(void *ud, const char *text, uint64_t n) {
  say_line(ud, "the line \"%s\" was repeated %" PRIu64 " more times since it was last printed",
           text, n);
}

static void alogv(bool repeats, int level, const char *fmt, va_list ap) {
  if (level > A.level) return;
  char prefix[64], body[1280];
  snprintf(prefix, sizeof prefix, "cuptimon-agent[%d]: %s: ", (int)getpid(),
           level_names[level < 0 ? 0 : level > 3 ? 3 : level]);
  vsnprintf(body, sizeof body, fmt, ap);
  if (!repeats) {
    say_line(prefix, "%s", body);
    return;
  }
  cm__repeat_verdict v;
  pthread_mutex_lock(&log_mu);
  cm__repeat_check(&log_repeat, body, cm__mono_ms(), &v);
  pthread_mutex_unlock(&log_mu);
  if (v.evicted) say_repeats(prefix, v.evicted_text, v.evicted);
  if (!v.print) return;
  if (v.repeats)
    say_line(prefix, "%s (repeated %" PRIu64 " more times since it was last printed)", body, v.repeats);
  else
    say_line(prefix, "%s", body);
}

/* Writes one line to stderr with a single write(2), so lines of several threads (and of several
 * processes sharing the terminal) do not interleave. Thread-safe; never allocates. */
void cm__alog(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  alogv(false, level, fmt, ap);
  va_end(ap);
}

/* alog for a line that can come once a window, for as long as a run lasts (a refusal that
 * repeats): its repeats are counted and said once a minute at most (log_repeat). */
void cm__alog_repeat(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  alogv(true, level, fmt, ap);
  va_end(ap);
}

/* Prints the repeats of every line that were counted and not yet said. Any thread. */
void cm__alog_drain_repeats(void) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "cuptimon-agent[%d]: %s: ", (int)getpid(), level_names[CM_LOG_WARN]);
  pthread_mutex_lock(&log_mu);
  cm__repeat_drain(&log_repeat, say_repeats, prefix);
  pthread_mutex_unlock(&log_mu);
}

/* The engine's log callback: the same stderr line, at the engine's level. */
void cm__alog_engine(void *ud, int level, const char *msg) {
  (void)ud;
  alog(level, "engine: %s", msg);
}

static int parse_level(const char *s) {
  if (!s || !*s) return CM_LOG_WARN;
  for (int i = 0; i < 4; i++)
    if (strcmp(s, level_names[i]) == 0) return i;
  if (strcmp(s, "warning") == 0) return CM_LOG_WARN;
  return -1;
}

/* Sets the log threshold from CUPTIMON_AGENT_LOG; returns false when the value is not valid. */
bool cm__alog_init_level(void) {
  int lvl = parse_level(getenv("CUPTIMON_AGENT_LOG"));
  A.level = lvl < 0 ? CM_LOG_WARN : lvl;
  return lvl >= 0;
}

/* CUPTIMON_AGENT_LOG_REPEAT_MS, read at start-up. */
void cm__alog_set_repeat_ms(uint64_t ms) {
  pthread_mutex_lock(&log_mu);
  log_repeat.interval_ms = ms;
  pthread_mutex_unlock(&log_mu);
}

