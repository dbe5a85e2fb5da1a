/*
 * text.c: the one place where bytes that a traced process or a capture chose become text.
 *
 * Design note. Kernel and marker names, executable paths, argv, host names, counter names and the
 * messages of BYE and PM_STATUS come from agents and captures, which may be hostile or broken. A
 * byte sequence that is not UTF-8 makes Prometheus reject a whole exposition and breaks JSON
 * parsers; an ESC or OSC sequence printed to a terminal can retitle the window or clear it. So
 * every such string goes through cm__text_clean before it reaches Lua (cm_host_text: the process
 * table and every string column) or the monitor's own stderr lines: each byte that does not start
 * a well-formed UTF-8 sequence (a stray continuation byte, a truncated sequence, an overlong form,
 * a surrogate, a code point past U+10FFFF) is replaced with U+FFFD, and so is each control
 * character (U+0000..U+001F, U+007F, U+0080..U+009F), so that what comes out is valid UTF-8 with
 * no control character. Well-formed text passes unchanged.
 *
 * Pure functions; any thread.
 */
#include <string.h>

#include "host_source.h"

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

/* The length of the well-formed, non-control UTF-8 sequence at s (n bytes left), or 0. */
static size_t seq_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  if (c < 0x80) return c >= 0x20 && c != 0x7F ? 1 : 0;
  unsigned char lo = 0x80, hi = 0xBF;
  size_t len;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    if (c == 0xC2) lo = 0xA0; /* U+0080..U+009F are C1 controls */
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;      /* overlong */
    else if (c == 0xED) hi = 0x9F; /* surrogates */
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;      /* overlong */
    else if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
  } else {
    return 0;
  }
  if (n < len || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < len; i++)
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  return len;
}

int cm__text_is_clean(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    size_t k = seq_len(p + i, n - i);
    if (!k) return 0;
    i += k;
  }
  return 1;
}

size_t cm__text_clean(const char *s, size_t n, char *out, size_t cap) {
  if (!cap) return 0;
  const unsigned char *p = (const unsigned char *)s;
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    size_t k = seq_len(p + i, n - i);
    const char *from = k ? s + i : REPLACEMENT;
    size_t m = k ? k : sizeof REPLACEMENT;
    if (o + m + 1 > cap) break; /* truncated between sequences, never inside one */
    memcpy(out + o, from, m);
    o += m;
    i += k ? k : 1;
  }
  out[o] = 0;
  return o;
}

const char *cm__text_tmp(const char *s, char *buf, size_t cap) {
  if (!s) return "";
  size_t n = strlen(s);
  if (cm__text_is_clean(s, n)) return s;
  cm__text_clean(s, n, buf, cap);
  return buf;
}
