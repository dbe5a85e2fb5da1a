/*
 * fuzz_wsrc_frame.c: a libFuzzer target for what the monitor does with the frames of one
 * process, live or on a replay: cm__wsrc_frame (engine/monitor/wsrc.c) and the batches it
 * hands to observers.
 *
 * Design note. Byte 0 of the input holds options: bit 0 makes the source a replay process
 * ("replay") rather than a live agent ("agent"); bit 1 attaches it to the host before the first
 * frame (else on its first HELLO, as the hub does); bits 2..4 pick the observers
 * (fuzz_observers). The rest is records (fuzz_monitor.h) that become checksummed frames; they
 * go through a wire reader, as in production (so payloads are verified and 8-byte aligned),
 * and each frame goes to cm__wsrc_frame; a BATCH frame also to cm__wsrc_batch_key, the replay's
 * merge key. The first error stops the stream, as the hub closes the connection then. At the
 * end the source's strings (ids 0..64 and a few large ones), counters, union selection and
 * stats are read, and it is detached, which runs its describe callback and frees it.
 *
 * The host is the stand-in of host_stubs.c; its delivery checks abort on a broken contract (a
 * column of an unknown type, a column not selected, a selected field missing, a string without
 * its terminator), and every byte delivered is read, so ASan sees any read out of bounds.
 * Invariants checked here: no crash, no sanitizer report, an error always leaves a message,
 * and the time and memory a frame costs stay linear in its size (libFuzzer's -timeout and
 * -rss_limit_mb report the rest).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_monitor.h"
#include "wsrc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile unsigned sink;

static void release_src(cm__wsrc *w) {
  cm__wsrc_release(w);
  free(w);
}

static const cm__wsrc_ops ops = {.detached = release_src};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  unsigned opt = data[0];
  fuzz_observers(opt >> 2);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  fuzz_records(&b, data + 1, size - 1, 0);
  cm__wsrc *w = calloc(1, sizeof *w);
  if (!w) abort();
  cm__wsrc_init(w, &ops, NULL, opt & 1 ? "replay" : "agent");
  if (opt & 2 && cm__wsrc_attach(w, stub_host)) abort();
  cm_wire_reader *r;
  if (cm_wire_reader_new(&r, 0) || cm_wire_reader_feed(r, b.data, b.len)) abort();
  cm_wire_frame f;
  char err[CM_WIRE_ERRMSG_SIZE + 64];
  int rc = 0;
  while (rc == 0 && cm_wire_reader_next(r, &f) == 1) {
    if (f.type == CM_WIRE_BATCH) sink += (unsigned)cm__wsrc_batch_key(w, &f);
    err[0] = 0;
    rc = cm__wsrc_frame(w, &f, err, sizeof err);
    if (rc && !err[0]) abort(); /* a refused frame always says why */
    if (rc == 0 && f.type == CM_WIRE_HELLO && !w->attached && cm__wsrc_attach(w, stub_host)) abort();
  }
  cm_wire_reader_free(r);
  cm_wire_buf_free(&b);
  /* What a script may ask of the source afterwards. */
  static const uint32_t ids[] = {UINT32_MAX, 1u << 26, (1u << 26) - 1, 0x80000000u};
  for (uint32_t id = 0; id < 64 + sizeof ids / sizeof ids[0]; id++) {
    size_t len = 0;
    const char *s = w->base.vt->string(&w->base, id < 64 ? id : ids[id - 64], &len);
    if (s && s[len] != 0) abort();
    if (s) sink += (unsigned)len;
  }
  sink += (unsigned)cm__wsrc_stat(w, "records_dropped");
  cm_stats st;
  if (w->base.vt->stats(&w->base, &st)) abort();
  char *u = cm__wsrc_union(w);
  free(u);
  if (w->attached) cm__wsrc_detach(w); /* describe, unobserve, free */
  else release_src(w);
  stub_host_reset();
  return 0;
}
