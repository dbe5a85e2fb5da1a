/*
 * test_engine_nocupti.c: cm_engine_new without a usable libcupti.
 *
 * Design. The engine dlopens libcupti in a documented order (the bare soname libcupti.so.13,
 * then $CUPTIMON_LIBCUPTI, $CUDA_HOME, /usr/local/cuda), and a failure must be CM_ENOCUPTI with a
 * detail naming what was looked for. Two cases, each in a child process so that whatever a case
 * loads or leaves in the environment cannot leak into the next:
 *  - nothing to load: CUPTIMON_LIBCUPTI and CUDA_HOME name paths that do not exist. This case
 *    can only be tested where the soname libcupti.so.13 does not resolve system-wide (a probe
 *    child tries it); where it resolves, the engine would rightly fall back to the real CUPTI,
 *    and the case is reported as not run;
 *  - the wrong library: CUPTIMON_LIBCUPTI names a library that exists but is not CUPTI (libm),
 *    so the load succeeds and the first CUPTI symbol is missing; the detail must name the symbol
 *    and the library.
 * After both, in this process, the fake loads and an engine starts: failed loads leave nothing
 * behind that blocks the next engine.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmt.h"
#include "cuptimon.h"
#include "fake_cupti.h"

#define MISSING_DIR "/nonexistent-cuptimon-test"

/* Runs `fn` in a child and returns its exit status (or 128 + signal). */
static int in_child(int (*fn)(void)) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  CMT_ASSERT(pid >= 0);
  if (pid == 0) _exit(fn());
  int status = 0;
  CMT_EQ(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

/* Exit 0 when libcupti.so.13 resolves through the loader's ordinary search. */
static int probe_soname(void) { return dlopen("libcupti.so.13", RTLD_LAZY) ? 0 : 1; }

static int case_nothing_found(void) {
  setenv("CUPTIMON_LIBCUPTI", MISSING_DIR "/libcupti.so.13", 1);
  setenv("CUDA_HOME", MISSING_DIR, 1);
  cm_engine *e = (cm_engine *)&e;
  int rc = cm_engine_new(&e, NULL);
  printf("nothing to load: %s: %s\n", cm_err_name(rc), cm_errmsg());
  CMT_EQ(rc, CM_ENOCUPTI);
  CMT_ASSERT(e == NULL);
  CMT_CONTAINS(cm_errmsg(), MISSING_DIR "/libcupti.so.13"); /* the explicit path it tried */
  CMT_CONTAINS(cm_errmsg(), "libcupti.so.13");
  CMT_CONTAINS(cm_errmsg(), "CUPTIMON_LIBCUPTI"); /* and how to point it at one */
  return 0;
}

static int case_not_cupti(void) {
  setenv("CUPTIMON_LIBCUPTI", "libm.so.6", 1);
  cm_engine *e = (cm_engine *)&e;
  int rc = cm_engine_new(&e, NULL);
  printf("not CUPTI: %s: %s\n", cm_err_name(rc), cm_errmsg());
  CMT_EQ(rc, CM_ENOCUPTI);
  CMT_ASSERT(e == NULL);
  CMT_CONTAINS(cm_errmsg(), "libm.so.6");
  CMT_CONTAINS(cm_errmsg(), "cupti"); /* names the missing cupti* symbol */
  /* The failure released the process's engine slot: the fake loads now. */
  const char *fake = getenv("CMT_FAKE_PATH");
  CMT_ASSERT(fake != NULL);
  setenv("CUPTIMON_LIBCUPTI", fake, 1);
  CMT_OK(cm_engine_new(&e, NULL));
  cm_engine_free(e);
  return 0;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep the progress lines when an assertion aborts */
  const char *fake = getenv("CUPTIMON_LIBCUPTI");
  if (!fake || !*fake) CMT_SKIP("CUPTIMON_LIBCUPTI does not name the fake CUPTI");
  setenv("CMT_FAKE_PATH", fake, 1);

  int resolvable = in_child(probe_soname) == 0;
  if (resolvable) {
    printf("not run: libcupti.so.13 resolves on this machine, so after a missing "
           "CUPTIMON_LIBCUPTI the engine would rightly fall back to the real CUPTI; the "
           "nothing-to-load case needs a machine without it\n");
  } else {
    CMT_EQ(in_child(case_nothing_found), 0);
  }
  CMT_EQ(in_child(case_not_cupti), 0);

  /* And this process, untouched by the children, starts an engine on the fake. */
  cm_engine *e;
  CMT_OK(cm_engine_new(&e, NULL));
  cm_session_info si;
  CMT_OK(cm_session_info_get(e, &si));
  printf("engine on %s, CUPTI version %u\n", si.cupti_path, si.cupti_version);
  CMT_CONTAINS(si.cupti_path, fake);
  cm_engine_free(e);
  printf("ok\n");
  return 0;
}
