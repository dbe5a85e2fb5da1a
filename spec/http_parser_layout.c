/* http_parser_layout: prints the layout of http-parser's struct http_parser as the C compiler sees
 * it (size, offsets, and where the method and http_errno bitfields sit in their 32-bit word), for
 * spec/prometheus_spec.lua to compare with the ffi.cdef of scripts/prometheus.lua, which cannot
 * copy the bitfields. */
#include <http_parser.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The bit position of the lowest set bit of the 32-bit word at offset 20 (status_code, method,
 * http_errno, upgrade) after setting one field to 1. */
static int shift_of(const http_parser *p) {
  uint32_t w;
  memcpy(&w, (const char *)p + offsetof(http_parser, http_minor) + sizeof p->http_minor, sizeof w);
  for (int i = 0; i < 32; i++)
    if (w & (UINT32_C(1) << i)) return i;
  return -1;
}

int main(void) {
  http_parser p;
  printf("size %zu\n", sizeof(http_parser));
  printf("nread %zu\n", offsetof(http_parser, nread));
  printf("content_length %zu\n", offsetof(http_parser, content_length));
  printf("http_major %zu\n", offsetof(http_parser, http_major));
  printf("http_minor %zu\n", offsetof(http_parser, http_minor));
  printf("data %zu\n", offsetof(http_parser, data));
  memset(&p, 0, sizeof p);
  p.method = 1;
  printf("method_shift %d\n", shift_of(&p));
  memset(&p, 0, sizeof p);
  p.http_errno = 1;
  printf("errno_shift %d\n", shift_of(&p));
  memset(&p, 0, sizeof p);
  p.upgrade = 1;
  printf("upgrade_shift %d\n", shift_of(&p));
  printf("settings_size %zu\n", sizeof(http_parser_settings));
  printf("on_message_complete %zu\n", offsetof(http_parser_settings, on_message_complete));
  printf("version %lu\n", http_parser_version());
  return 0;
}
