/*
 * repeat.c: the agent's rule for a log line that repeats. The rule and its reasons are in
 * repeat.h.
 */
#include "repeat.h"

#include <string.h>

/* The line's shape: its text with every run of digits (and the decimal points inside one) read as
 * one '#', so that "not returned after 1.5 s" and "after 2.0 s" are the same line. Hashes the whole
 * shape and keeps its first bytes in `norm`. */
static uint64_t shape(const char *s, char *norm) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  size_t n = 0;
  bool in_num = false;
  for (; *s; s++) {
    bool digit = *s >= '0' && *s <= '9';
    if (in_num && (digit || (*s == '.' && s[1] >= '0' && s[1] <= '9'))) continue;
    in_num = digit;
    unsigned char c = digit ? '#' : (unsigned char)*s;
    h ^= c;
    h *= 1099511628211ull;
    if (n < CM_REPEAT_TEXT - 1) norm[n++] = (char)c;
  }
  norm[n] = '\0';
  return h ? h : 1; /* 0 marks a free slot */
}

static void copy_text(char *dst, const char *src) {
  size_t n = strlen(src);
  if (n > CM_REPEAT_TEXT - 1) n = CM_REPEAT_TEXT - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

void cm__repeat_check(cm__repeat *r, const char *text, uint64_t now_ms, cm__repeat_verdict *out) {
  out->print = true;
  out->repeats = 0;
  out->evicted = 0;
  out->evicted_text[0] = '\0';
  if (r->interval_ms == 0) return;
  char norm[CM_REPEAT_TEXT];
  uint64_t h = shape(text, norm);
  cm__repeat_slot *victim = &r->slot[0];
  for (int i = 0; i < CM_REPEAT_SLOTS; i++) {
    cm__repeat_slot *s = &r->slot[i];
    if (s->hash == h && strcmp(s->norm, norm) == 0) {
      if (now_ms - s->printed_ms < r->interval_ms) {
        s->suppressed++;
        out->print = false;
        return;
      }
      out->repeats = s->suppressed;
      s->suppressed = 0;
      s->printed_ms = now_ms;
      copy_text(s->text, text);
      return;
    }
    /* The victim: a free slot, else the line printed longest ago. */
    if (victim->hash != 0 && (s->hash == 0 || s->printed_ms < victim->printed_ms)) victim = s;
  }
  if (victim->hash != 0 && victim->suppressed > 0) {
    out->evicted = victim->suppressed;
    memcpy(out->evicted_text, victim->text, sizeof out->evicted_text);
  }
  victim->hash = h;
  victim->printed_ms = now_ms;
  victim->suppressed = 0;
  memcpy(victim->norm, norm, sizeof norm);
  copy_text(victim->text, text);
}

void cm__repeat_drain(cm__repeat *r, void (*fn)(void *ud, const char *text, uint64_t n), void *ud) {
  for (int i = 0; i < CM_REPEAT_SLOTS; i++) {
    cm__repeat_slot *s = &r->slot[i];
    if (s->hash != 0 && s->suppressed > 0) {
      uint64_t n = s->suppressed;
      s->suppressed = 0;
      fn(ud, s->text, n);
    }
  }
}
