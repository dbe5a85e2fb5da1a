/*
 * fuzz_replay.c: a libFuzzer target for `cuptimon-lua --replay`: the capture reader with
 * resynchronization, replay.c's process bookkeeping and merge, and wsrc.c behind them,
 * driven through cm__replay_start on a real libuv loop exactly as the command line drives it.
 *
 * Design note. Byte 0 of the input holds options: bit 0 replays the capture twice (two
 * --replay arguments, so the merge interleaves two streams); bits 1..3 pick the observers
 * (fuzz_observers); bit 4 says what the rest is: 0, the capture file's bytes as they are (the
 * reader's own checks, file header first); 1, records (fuzz_monitor.h) after a valid file
 * header, RAW records included, so the frames carry valid checksums and junk between them
 * exercises resynchronization. The capture is written to a memfd and opened through
 * /proc/self/fd, so no file is left behind. The host is the stand-in of host_stubs.c (its
 * delivery checks abort on a broken contract); a replay that fails to start (not a capture)
 * is fine, anything else runs until the replay calls `finished`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_monitor.h"
#include "hub.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int finished;

static void on_finished(void *ud, int status) {
  (void)ud;
  finished = 1;
  if (status != 0 && status != 1) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  unsigned opt = data[0];
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  const uint8_t *bytes = data + 1;
  size_t nbytes = size - 1;
  if (opt & 16) {
    if (cm_wire_write_file_header(&b, 0)) abort();
    fuzz_records(&b, data + 1, size - 1, 1);
    bytes = b.data;
    nbytes = b.len;
  }
  int fd = memfd_create("fuzz_replay", 0);
  if (fd < 0) abort();
  if (nbytes && write(fd, bytes, nbytes) != (ssize_t)nbytes) abort();
  cm_wire_buf_free(&b);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const char *paths[3] = {path, path, NULL};
  fuzz_observers(opt >> 1);
  uv_loop_t loop;
  if (uv_loop_init(&loop)) abort();
  finished = 0;
  int rc = cm__replay_start(stub_host, &loop, paths, opt & 1 ? 2 : 1, on_finished, NULL);
  if (rc == 0) {
    uv_run(&loop, UV_RUN_DEFAULT);
    if (!finished) abort(); /* the loop ran dry before every capture was done */
  }
  cm__replay_free();
  uv_run(&loop, UV_RUN_NOWAIT); /* the idle handle's close callback */
  stub_host_reset();
  if (uv_loop_close(&loop)) abort();
  close(fd);
  return 0;
}
