/*
 * window_control.h: the control file of the test programs that make work on request, for the
 * dormant agent's attach windows (engine/tests/fake_cuda_app.c --control and
 * bench/launch_loop.cu --control; spec/attach_spec.lua and spec/gpu/dormant.sh
 * drive them).
 *
 * The driver writes a number N (or "quit") and a newline to PATH, through a rename so the file is
 * whole when it appears; the program takes it (and removes PATH), does N units of work, and writes
 * one line of counts to PATH.ack, also through a rename. The driver removes the .ack before it
 * asks again. Header-only, C and C++ (nvcc).
 */
#ifndef CM_TESTS_WINDOW_CONTROL_H
#define CM_TESTS_WINDOW_CONTROL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Waits (polling every 2 ms) for the next request on `path`; returns N, or -1 for "quit". */
static inline long long cm_window_next(const char *path) {
  for (;;) {
    FILE *f = fopen(path, "r");
    if (!f) {
      usleep(2000);
      continue;
    }
    char line[64] = "";
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    fclose(f);
    if (!strchr(line, '\n')) { /* not whole yet */
      usleep(2000);
      continue;
    }
    unlink(path);
    if (strncmp(line, "quit", 4) == 0) return -1;
    return strtoll(line, NULL, 10);
  }
}

/* Writes `line` (with its newline) to path.ack through a rename. Returns 0, or -1. */
static inline int cm_window_ack(const char *path, const char *line) {
  char ack[4096], tmp[4096];
  snprintf(ack, sizeof ack, "%s.ack", path);
  snprintf(tmp, sizeof tmp, "%s.ack.tmp", path);
  FILE *a = fopen(tmp, "w");
  if (!a) return -1;
  fputs(line, a);
  if (fclose(a) != 0) return -1;
  return rename(tmp, ack) == 0 ? 0 : -1;
}

#endif /* CM_TESTS_WINDOW_CONTROL_H */
