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
 *
 * Two switches make the floor do what cuptimon's engine does with CUPTI, so that the two can be
 * compared under the same settings (bench/load.py floor): CUPTI_FLOOR_PER_THREAD=0 or 1 sets
 * CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER (unset keeps CUPTI's default, per-thread buffers;
 * the engine turns them off), and CUPTI_FLOOR_FLUSH_MS=N starts a thread, named floor-flush, that
 * calls cuptiActivityFlushAll(0) every N ms, as the engine's decode worker does at its flush
 * cadence. With CUPTI_FLOOR_LAG=1 the completion callback prints, at most once a second, how far
 * CUPTI is behind, for kernel and runtime API records apart: the time from the buffer's newest
 * record end of each kind to the callback (-1 when the buffer has none), and the records counted
 * so far of each kind (bench/load.py floor sets it):
 *
 *   FLOOR_LAG t_s T kernel_ms LK runtime_ms LR kernels K runtime R
 */
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FLOOR_BUFFER_SIZE (4u << 20)

static struct {
  CUptiResult (*RegisterCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*Enable)(CUpti_ActivityKind);
  CUptiResult (*FlushAll)(uint32_t);
  CUptiResult (*GetNextRecord)(uint8_t *, size_t, CUpti_Activity **);
  CUptiResult (*GetNumDropped)(CUcontext, uint32_t, size_t *);
  CUptiResult (*SetAttribute)(CUpti_ActivityAttribute, size_t *, void *);
} fl;

static unsigned flush_ms; /* CUPTI_FLOOR_FLUSH_MS: the flusher thread's period, 0 for none */
static int lag_on;        /* CUPTI_FLOOR_LAG=1 */
static uint64_t lag_t0_ns, lag_next_ns; /* the first request, and when the next line is due */
static pthread_mutex_t lag_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The lag in ms of a record kind's newest end `newest` at `now` (CUPTI's timestamps are on
 * CLOCK_REALTIME here), or -1 when there is none or it is off this run's clock by an hour (the
 * fake CUPTI's fixed dates). */
static double lag_ms(uint64_t now, uint64_t newest) {
  if (!newest || newest > now + 1000000000ull || now - newest > 3600ull * 1000000000ull) return -1;
  return now > newest ? (double)(now - newest) / 1e6 : 0.0;
}

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
  uint64_t k = 0, r = 0, o = 0, newest_k = 0, newest_r = 0;
  while (valid > 0 && fl.GetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      k++;
      uint64_t end = ((const CUpti_ActivityKernel10 *)rec)->end;
      if (end > newest_k) newest_k = end;
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      r++;
      uint64_t end = ((const CUpti_ActivityAPI *)rec)->end;
      if (end > newest_r) newest_r = end;
    } else {
      o++;
    }
  }
  size_t dropped = 0;
  if (fl.GetNumDropped(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
    __atomic_add_fetch(&n_dropped, (uint64_t)dropped, __ATOMIC_RELAXED);
  __atomic_add_fetch(&n_kernels, k, __ATOMIC_RELAXED);
  __atomic_add_fetch(&n_runtime, r, __ATOMIC_RELAXED);
  __atomic_add_fetch(&n_other, o, __ATOMIC_RELAXED);
  if (lag_on && (newest_k || newest_r)) {
    uint64_t now = realtime_ns();
    double lk = lag_ms(now, newest_k), lr = lag_ms(now, newest_r);
    pthread_mutex_lock(&lag_mu);
    if ((lk >= 0 || lr >= 0) && now >= lag_next_ns) {
      lag_next_ns = now + 1000000000ull;
      fprintf(stderr, "FLOOR_LAG t_s %.1f kernel_ms %.1f runtime_ms %.1f kernels %llu runtime %llu\n",
              (double)(now - lag_t0_ns) / 1e9, lk, lr,
              (unsigned long long)__atomic_load_n(&n_kernels, __ATOMIC_RELAXED),
              (unsigned long long)__atomic_load_n(&n_runtime, __ATOMIC_RELAXED));
    }
    pthread_mutex_unlock(&lag_mu);
  }
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

/* The flusher thread of CUPTI_FLOOR_FLUSH_MS: a default flush every flush_ms, until the process
 * ends (it is detached, and never joined). */
static void *flusher_main(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "floor-flush");
  struct timespec ts = {.tv_sec = flush_ms / 1000, .tv_nsec = (long)(flush_ms % 1000) * 1000000L};
  for (;;) {
    nanosleep(&ts, NULL);
    fl.FlushAll(0);
  }
  return NULL;
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
  *(void **)&fl.SetAttribute = dlsym(lib, "cuptiActivitySetAttribute");
  if (!fl.RegisterCallbacks || !fl.Enable || !fl.FlushAll || !fl.GetNextRecord ||
      !fl.GetNumDropped) {
    fl.FlushAll = NULL;
    return floor_fail("a CUPTI activity symbol is missing");
  }
  /* CUPTI takes the per-thread attribute only before the buffer callbacks are registered. */
  const char *pt = getenv("CUPTI_FLOOR_PER_THREAD");
  if (pt && (strcmp(pt, "0") == 0 || strcmp(pt, "1") == 0)) {
    uint8_t on = pt[0] == '1';
    size_t sz = sizeof on;
    if (!fl.SetAttribute ||
        fl.SetAttribute(CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER, &sz, &on) != CUPTI_SUCCESS)
      return floor_fail("cannot set CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER");
  }
  if (fl.RegisterCallbacks(floor_request, floor_complete) != CUPTI_SUCCESS ||
      fl.Enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
    return floor_fail("cannot register the buffer callbacks or enable CONCURRENT_KERNEL");
  const char *rt = getenv("CUPTI_FLOOR_RUNTIME");
  if (rt && strcmp(rt, "1") == 0 && fl.Enable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS)
    return floor_fail("cannot enable RUNTIME");
  const char *lg = getenv("CUPTI_FLOOR_LAG");
  lag_on = lg && strcmp(lg, "1") == 0;
  lag_t0_ns = realtime_ns();
  const char *fm = getenv("CUPTI_FLOOR_FLUSH_MS");
  flush_ms = fm && *fm ? (unsigned)strtoul(fm, NULL, 10) : 0;
  if (flush_ms) {
    pthread_t t;
    if (pthread_create(&t, NULL, flusher_main, NULL) != 0) return floor_fail("cannot start the flusher thread");
    pthread_detach(t);
  }
  atexit(floor_exit);
  return 1;
}
