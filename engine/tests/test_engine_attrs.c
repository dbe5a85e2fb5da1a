/*
 * test_engine_attrs.c: the CUPTI activity attributes the engine sets when it starts.
 *
 * CUPTI's per-thread activity buffers are off unless CUPTIMON_CUPTI_PER_THREAD_BUFFERS=1: with
 * them on, CUPTI's flush at exit takes seconds after a long run, and milliseconds with them off
 * (bench/RESULTS.md, "Memory under a long run"). The attribute must be set before the buffer
 * callbacks are registered. The ctest entries run this with the variable unset, set to 1, and set
 * to a bad value (which leaves them off).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmt.h"
#include "cuptimon.h"
#include "fake_cupti.h"

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *v = getenv("CUPTIMON_CUPTI_PER_THREAD_BUFFERS");
  int want = v && strcmp(v, "1") == 0 ? 1 : 0;
  CMT_EQ(fake_per_thread_attr(), -1);
  cm_engine *e;
  CMT_OK(cm_engine_new(&e, NULL));
  printf("CUPTIMON_CUPTI_PER_THREAD_BUFFERS=%s: the attribute is %d\n", v ? v : "(unset)",
         fake_per_thread_attr());
  CMT_EQ(fake_per_thread_attr(), want);
  cm_engine_free(e);
  printf("ok\n");
  return 0;
}
