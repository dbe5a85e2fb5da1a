/*
 * cupti_dl.h: libcupti opened at run time for the CUDA benchmark programs that call CUPTI
 * directly (cupti_states, cupti_reattach). The benchmarks load libcupti themselves so that
 * nothing of cuptimon is inside them: they measure CUPTI alone, and this header uses nothing of
 * the engine.
 *
 *   cupti_dl_load(&cu, "prog", "PROG_LIBCUPTI") opens $PROG_LIBCUPTI, then libcupti.so.13, then
 *   /usr/local/cuda/lib64/libcupti.so.13, and fills `cu` with every CUPTI function the programs
 *   call. A library that does not open, or a symbol that is missing, is said on stderr and ends
 *   the program with status 1.
 *   check(r, what): a CUPTI result other than CUPTI_SUCCESS is said on stderr as "prog: WHAT
 *   failed (CUPTI result N)" and ends the program with status 1.
 *
 * Every message begins with the program's name and a colon, which the scripts that run these
 * programs grep for.
 */
#ifndef CM_BENCH_CUPTI_DL_H
#define CM_BENCH_CUPTI_DL_H

#include <cupti.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

/* The CUPTI functions the programs call, named without their "cupti"/"cuptiActivity" prefix. */
struct CuptiDl {
  CUptiResult (*Subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
  CUptiResult (*Unsubscribe)(CUpti_SubscriberHandle);
  CUptiResult (*EnableCallback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
  CUptiResult (*EnableDomain)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain);
  CUptiResult (*RegisterCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*Enable)(CUpti_ActivityKind);
  CUptiResult (*Disable)(CUpti_ActivityKind);
  CUptiResult (*FlushAll)(uint32_t);
  CUptiResult (*GetNextRecord)(uint8_t *, size_t, CUpti_Activity **);
  CUptiResult (*SetAttribute)(CUpti_ActivityAttribute, size_t *, void *);
  CUptiResult (*Finalize)(void);
};

/* The program's name, for the messages; set by cupti_dl_load. */
static const char *cupti_dl_prog = "cupti";

static inline void check(CUptiResult r, const char *what) {
  if (r != CUPTI_SUCCESS) {
    fprintf(stderr, "%s: %s failed (CUPTI result %d)\n", cupti_dl_prog, what, (int)r);
    exit(1);
  }
}

static inline void cupti_dl_load(CuptiDl *cu, const char *prog, const char *env_var) {
  cupti_dl_prog = prog;
  const char *env = getenv(env_var);
  void *lib = env && *env ? dlopen(env, RTLD_NOW | RTLD_GLOBAL) : NULL;
  if (!lib) lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) lib = dlopen("/usr/local/cuda/lib64/libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fprintf(stderr, "%s: cannot open libcupti.so.13 (set %s)\n", prog, env_var);
    exit(1);
  }
  const struct {
    const char *name;
    void **fn;
  } syms[] = {
      {"cuptiSubscribe", (void **)&cu->Subscribe},
      {"cuptiUnsubscribe", (void **)&cu->Unsubscribe},
      {"cuptiEnableCallback", (void **)&cu->EnableCallback},
      {"cuptiEnableDomain", (void **)&cu->EnableDomain},
      {"cuptiActivityRegisterCallbacks", (void **)&cu->RegisterCallbacks},
      {"cuptiActivityEnable", (void **)&cu->Enable},
      {"cuptiActivityDisable", (void **)&cu->Disable},
      {"cuptiActivityFlushAll", (void **)&cu->FlushAll},
      {"cuptiActivityGetNextRecord", (void **)&cu->GetNextRecord},
      {"cuptiActivitySetAttribute", (void **)&cu->SetAttribute},
      {"cuptiFinalize", (void **)&cu->Finalize},
  };
  for (const auto &s : syms) {
    *s.fn = dlsym(lib, s.name);
    if (!*s.fn) {
      fprintf(stderr, "%s: a CUPTI symbol is missing: %s\n", prog, s.name);
      exit(1);
    }
  }
}

#endif
