/*
 * repeat.h: the agent's rule for a log line that repeats (log.c's alog applies it).
 *
 * A line the agent has printed is not printed again for `interval_ms` if it comes back with the
 * same words (its numbers may differ: "has not returned after 1.5 s" repeats "after 0.4 s"): it
 * is counted instead. The first time it comes back after that interval it is printed
 * with the count of the repeats it stands for, and at the end of the process every count not yet
 * said is printed once (cm__repeat_drain). So an error that recurs every window of a long duty
 * cycle fills the log with a line a minute, not a line a window, and no repeat goes uncounted.
 * Lines are told apart by their words (a 64-bit hash of the whole line with each number read as
 * one sign, and the first bytes of that form); a table of
 * CM_REPEAT_SLOTS lines is kept, and a new line takes the slot of the one printed longest ago,
 * whose pending count is then returned so that it can be said first.
 *
 * Pure functions of their arguments and the table: not thread-safe (the caller locks), no clock
 * of their own, never allocate.
 */
#ifndef CM_AGENT_REPEAT_H
#define CM_AGENT_REPEAT_H

#include <stdbool.h>
#include <stdint.h>

enum { CM_REPEAT_SLOTS = 16, CM_REPEAT_TEXT = 200 };

typedef struct cm__repeat_slot {
  uint64_t hash;       /* 0: free */
  uint64_t printed_ms; /* when the line was last printed */
  uint64_t suppressed; /* repeats counted since then */
  char norm[CM_REPEAT_TEXT]; /* the first bytes of its words, numbers read as '#' */
  char text[CM_REPEAT_TEXT]; /* the first bytes of the line last printed, for the summary */
} cm__repeat_slot;

typedef struct cm__repeat {
  uint64_t interval_ms; /* 0: every line is printed */
  cm__repeat_slot slot[CM_REPEAT_SLOTS];
} cm__repeat;

/* What to do with one line. */
typedef struct cm__repeat_verdict {
  bool print;          /* false: counted as a repeat, not printed */
  uint64_t repeats;    /* when printed: the repeats of this line counted since it was last printed */
  uint64_t evicted;    /* a line pushed out of the table with this many repeats not yet said ... */
  char evicted_text[CM_REPEAT_TEXT]; /* ... and its first bytes ("" when evicted is 0) */
} cm__repeat_verdict;

/* Decides about `text` at `now_ms` (any monotonic milliseconds). */
void cm__repeat_check(cm__repeat *r, const char *text, uint64_t now_ms, cm__repeat_verdict *out);

/* Calls fn(ud, text, n) for every line with n > 0 repeats not yet said, and forgets them. */
void cm__repeat_drain(cm__repeat *r, void (*fn)(void *ud, const char *text, uint64_t n), void *ud);

#endif /* CM_AGENT_REPEAT_H */
