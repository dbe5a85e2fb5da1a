/*
 * test_repeat.c: the agent's rule for a log line that repeats (engine/agent/repeat.c), driven
 * with lines at chosen times.
 *
 * A line is printed the first time; repeats within the interval (the same words, numbers
 * aside) are counted, not printed; the first repeat after the interval is printed with the count; other lines are
 * judged apart; a line pushed out of the full table hands back its count; the drain says every
 * count once; an interval of 0 prints everything.
 */
#include <stdio.h>
#include <string.h>

#include "cmt.h"
#include "repeat.h"

typedef struct said {
  int n;
  uint64_t total;
  char last[CM_REPEAT_TEXT];
} said;

static void on_drain(void *ud, const char *text, uint64_t n) {
  said *s = ud;
  s->n++;
  s->total += n;
  snprintf(s->last, sizeof s->last, "%s", text);
}

int main(void) {
  static cm__repeat r = {.interval_ms = 60000};
  cm__repeat_verdict v;
  const char *a = "cannot apply the selection: EAGAIN: CUPTI is still attaching";

  cm__repeat_check(&r, a, 1000, &v);
  CMT_ASSERT(v.print);
  CMT_EQU(v.repeats, 0);
  /* 299 repeats within the minute: none printed. */
  for (int i = 1; i < 300; i++) {
    cm__repeat_check(&r, a, 1000 + (uint64_t)i * 200, &v);
    CMT_ASSERT(!v.print);
  }
  /* Another line is its own. */
  cm__repeat_check(&r, "cannot apply the selection: EAGAIN: cuptiSubscribe did not return", 2000, &v);
  CMT_ASSERT(v.print);
  CMT_EQU(v.repeats, 0);
  /* After the interval: printed, saying the 299 repeats. */
  cm__repeat_check(&r, a, 61000, &v);
  CMT_ASSERT(v.print);
  CMT_EQU(v.repeats, 299);
  cm__repeat_check(&r, a, 61200, &v);
  CMT_ASSERT(!v.print);
  cm__repeat_check(&r, a, 61400, &v);
  CMT_ASSERT(!v.print);

  /* The drain says the 2 pending repeats once, and nothing the second time. */
  said s = {0};
  cm__repeat_drain(&r, on_drain, &s);
  CMT_EQ(s.n, 1);
  CMT_EQU(s.total, 2);
  CMT_STREQ(s.last, a);
  memset(&s, 0, sizeof s);
  cm__repeat_drain(&r, on_drain, &s);
  CMT_EQ(s.n, 0);

  /* A full table: the line printed longest ago leaves, handing back its pending count. */
  static cm__repeat t = {.interval_ms = 1000};
  char line[64];
  cm__repeat_check(&t, "first", 0, &v);
  cm__repeat_check(&t, "first", 10, &v);
  CMT_ASSERT(!v.print);
  for (int i = 0; i < CM_REPEAT_SLOTS - 1; i++) {
    snprintf(line, sizeof line, "line %c", 'a' + i); /* numbers would make them one line */
    cm__repeat_check(&t, line, 100 + (uint64_t)i, &v);
    CMT_ASSERT(v.print);
    CMT_EQU(v.evicted, 0);
  }
  cm__repeat_check(&t, "one more", 500, &v);
  CMT_ASSERT(v.print);
  CMT_EQU(v.evicted, 1);
  CMT_STREQ(v.evicted_text, "first");

  /* A long line is told apart by its whole text, and kept by its first bytes. */
  char longa[400], longb[400];
  memset(longa, 'x', sizeof longa - 1);
  longa[sizeof longa - 1] = '\0';
  memcpy(longb, longa, sizeof longb);
  longb[390] = 'y';
  static cm__repeat u = {.interval_ms = 1000};
  cm__repeat_check(&u, longa, 0, &v);
  CMT_ASSERT(v.print);
  cm__repeat_check(&u, longb, 1, &v);
  CMT_ASSERT(v.print);
  cm__repeat_check(&u, longa, 2, &v);
  CMT_ASSERT(!v.print);

  /* Numbers aside, the words make the line: "after 1.5 s" repeats "after 22.0 s". */
  static cm__repeat w = {.interval_ms = 1000};
  cm__repeat_check(&w, "CUPTI is still attaching (not returned after 1.5 s)", 0, &v);
  CMT_ASSERT(v.print);
  cm__repeat_check(&w, "CUPTI is still attaching (not returned after 22.0 s)", 1, &v);
  CMT_ASSERT(!v.print);
  cm__repeat_check(&w, "CUPTI is still attaching (not returned after s)", 2, &v);
  CMT_ASSERT(v.print);
  cm__repeat_check(&w, "CUPTI is still attaching (not returned after 30.5 s)", 1500, &v);
  CMT_ASSERT(v.print);
  CMT_EQU(v.repeats, 1);

  /* No interval: everything is printed. */
  static cm__repeat z = {.interval_ms = 0};
  for (int i = 0; i < 5; i++) {
    cm__repeat_check(&z, a, (uint64_t)i, &v);
    CMT_ASSERT(v.print);
  }
  printf("test_repeat: ok\n");
  return 0;
}
