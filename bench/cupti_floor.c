/*
 * cupti_floor.c: the floor of the overhead harness (bench/overhead.py), a minimal CUPTI consumer
 * loaded into any CUDA program with CUDA_INJECTION64_PATH=<build>/gpu/libcupti_floor.so.
 *
 * Design. CUPTI calls InitializeInjection at cuInit. The library opens libcupti (soname
 * libcupti.so.13 first, then /usr/local/cuda/lib64, or CUPTI_FLOOR_LIBCUPTI), registers its buffer
 * callbacks and enables CONCURRENT_KERNEL, plus RUNTIME when CUPTI_FLOOR_RUNTIME=1. The completion
 * callback only walks the records and counts them by kind; buffers go back to a free list and
 * are reused, so once warm the consumer allocates nothing. That is the least any CUPTI consumer
 * does, so its cost is CUPTI's own. At exit it flushes (forced) and prints one line to stderr:
 *
 *   cupti_floor: kernels K runtime R other O dropped D buffers B
 *
 * The exit status of the program is not changed; the harness checks the line.
 */
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FLOOR_BUFFER_SIZE (4u << 20)

static struct {
  CUptiResult (*RegisterCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*Enable)(CUpti_ActivityKind);
  CUptiResult (*FlushAll)(uint32_t);
  CUptiResult (*GetNextRecord)(uint8_t *, size_t, CUpti_Activity **);
  CUptiResult (*GetNumDropped)(CUcontext, uint32_t, size_t *);
} fl;

static uint64_t n_kernels, n_runtime, n_other, n_dropped, n_buffers;

/* The free list: buffers handed back by the completion callback, reused by the next request. */
static pthread_mutex_t free_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *free_list[64];
static int n_free;

static void CUPTIAPI floor_request(uint8_t **buffer, size_t *size, size_t *max_records) {
  uint8_t *b = NULL;
  pthread_mutex_lock(&free_mu);
  if (n_free > 0) b = free_list[--n_free];
  pthread_mutex_unlock(&free_mu);
  if (!b) {
    b = aligned_alloc(8, FLOOR_BUFFER_SIZE);
    if (b) __atomic_add_fetch(&n_buffers, 1, __ATOMIC_RELAXED);
  }
  *buffer = b;
  *size = b ? FLOOR_BUFFER_SIZE : 0;
  *max_records = 0;
}

static void CUPTIAPI floor_complete(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                    size_t valid) {
  (void)size;
  CUpti_Activity *rec = NULL;
  uint64_t k = 0, r = 0, o = 0;
  while (valid > 0 && fl.GetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) k++;
    else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) r++;
    else o++;
  }
  size_t dropped = 0;
  if (fl.GetNumDropped(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
    __atomic_add_fetch(&n_dropped, (uint64_t)dropped, __ATOMIC_RELAXED);
  __atomic_add_fetch(&n_kernels, k, __ATOMIC_RELAXED);
  __atomic_add_fetch(&n_runtime, r, __ATOMIC_RELAXED);
  __atomic_add_fetch(&n_other, o, __ATOMIC_RELAXED);
  pthread_mutex_lock(&free_mu);
  if (n_free < (int)(sizeof free_list / sizeof free_list[0])) {
    free_list[n_free++] = buffer;
    buffer = NULL;
  }
  pthread_mutex_unlock(&free_mu);
  free(buffer);
}

static void floor_exit(void) {
  if (fl.FlushAll) fl.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  fprintf(stderr, "cupti_floor: kernels %llu runtime %llu other %llu dropped %llu buffers %llu\n",
          (unsigned long long)__atomic_load_n(&n_kernels, __ATOMIC_RELAXED),
          (unsigned long long)__atomic_load_n(&n_runtime, __ATOMIC_RELAXED),
          (unsigned long long)__atomic_load_n(&n_other, __ATOMIC_RELAXED),
          (unsigned long long)__atomic_load_n(&n_dropped, __ATOMIC_RELAXED),
          (unsigned long long)__atomic_load_n(&n_buffers, __ATOMIC_RELAXED));
}

static int floor_fail(const char *what) {
  fprintf(stderr, "cupti_floor: %s; not tracing\n", what);
  return 1;
}

int InitializeInjection(void);

/* Called by CUDA at cuInit when this library is named by CUDA_INJECTION64_PATH. Returns 1 as
 * CUDA expects (a second call does nothing); a failure is reported on stderr and leaves the program untraced. */
int InitializeInjection(void) {
  static int done;
  if (__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL)) return 1;
  const char *env = getenv("CUPTI_FLOOR_LIBCUPTI");
  void *lib = env && *env ? dlopen(env, RTLD_NOW | RTLD_GLOBAL) : NULL;
  if (!lib) lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) lib = dlopen("/usr/local/cuda/lib64/libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) return floor_fail("cannot open libcupti.so.13 (set CUPTI_FLOOR_LIBCUPTI)");
  *(void **)&fl.RegisterCallbacks = dlsym(lib, "cuptiActivityRegisterCallbacks");
  *(void **)&fl.Enable = dlsym(lib, "cuptiActivityEnable");
  *(void **)&fl.FlushAll = dlsym(lib, "cuptiActivityFlushAll");
  *(void **)&fl.GetNextRecord = dlsym(lib, "cuptiActivityGetNextRecord");
  *(void **)&fl.GetNumDropped = dlsym(lib, "cuptiActivityGetNumDroppedRecords");
  if (!fl.RegisterCallbacks || !fl.Enable || !fl.FlushAll || !fl.GetNextRecord ||
      !fl.GetNumDropped) {
    fl.FlushAll = NULL;
    return floor_fail("a CUPTI activity symbol is missing");
  }
  if (fl.RegisterCallbacks(floor_request, floor_complete) != CUPTI_SUCCESS ||
      fl.Enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
    return floor_fail("cannot register the buffer callbacks or enable CONCURRENT_KERNEL");
  const char *rt = getenv("CUPTI_FLOOR_RUNTIME");
  if (rt && strcmp(rt, "1") == 0 && fl.Enable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS)
    return floor_fail("cannot enable RUNTIME");
  atexit(floor_exit);
  return 1;
}
