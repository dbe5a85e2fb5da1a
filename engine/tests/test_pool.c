/*
 * test_pool.c: the activity-buffer pool. Checks the bound and the refusal count, recycling with
 * no new allocation once warm, reconfiguring the size (old-size buffers are freed when they come
 * back), lowering the bound, the one-time warning, and concurrent get/put from 4 threads with
 * the counters consistent at the end. Buffers are written end to end, so under ASan a buffer
 * shorter than its reported size, or one handed to two owners, fails the test.
 */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "cm_internal.h"
#include "cmt.h"

/* Checks the counters that must hold whenever no call is in flight. */
static void check_invariants(cm__pool *p) {
  CMT_EQU(p->alive, p->free_count + p->outstanding);
  CMT_LEU(p->alive, p->allocated);
}

/* Takes a buffer that must be granted, checks its size and alignment and fills it. */
static uint8_t *take(cm__pool *p, size_t want_size) {
  size_t size = 12345;
  bool warn = true;
  uint8_t *b = cm__pool_get(p, &size, &warn);
  CMT_ASSERT(b != NULL);
  CMT_EQU(size, want_size);
  CMT_EQU((uintptr_t)b % 64, 0);
  memset(b, 0xa5, size);
  return b;
}

static void test_init_rejects(void) {
  cm__pool p;
  CMT_EQ(cm__pool_init(&p, 0, 4, 0), CM_EINVAL);
  CMT_EQ(cm__pool_init(&p, 63, 4, 0), CM_EINVAL);
  CMT_EQ(cm__pool_init(&p, 4096, 0, 0), CM_EINVAL);
  CMT_OK(cm__pool_init(&p, 64, 1, 0));
  cm__pool_destroy(&p);
}

static void test_bound_and_refusal(void) {
  cm__pool p;
  CMT_OK(cm__pool_init(&p, 4096, 3, 0));
  uint8_t *b[3];
  for (int i = 0; i < 3; i++) b[i] = take(&p, 4096);
  CMT_ASSERT(b[0] != b[1] && b[1] != b[2] && b[0] != b[2]);
  CMT_EQU(p.alive, 3);
  CMT_EQU(p.outstanding, 3);
  CMT_EQU(p.allocated, 3);
  CMT_EQU(p.refused, 0);

  for (int i = 1; i <= 2; i++) {
    size_t size = 99;
    bool warn = true;
    CMT_ASSERT(cm__pool_get(&p, &size, &warn) == NULL);
    CMT_EQU(size, 0);
    CMT_ASSERT(!warn);
    CMT_EQU(p.refused, i);
  }
  CMT_EQU(p.alive, 3);
  CMT_EQU(p.allocated, 3);
  check_invariants(&p);

  /* One buffer back makes exactly one more request succeed, from the free list. */
  cm__pool_put(&p, b[1]);
  CMT_EQU(p.free_count, 1);
  CMT_ASSERT(take(&p, 4096) == b[1]);
  CMT_ASSERT(cm__pool_get(&p, NULL, NULL) == NULL);
  CMT_EQU(p.refused, 3);
  cm__pool_put(&p, NULL); /* ignored */
  for (int i = 0; i < 3; i++) cm__pool_put(&p, b[i]);
  CMT_EQU(p.outstanding, 0);
  CMT_EQU(p.free_count, 3);
  check_invariants(&p);
  cm__pool_destroy(&p);
}

static void test_recycling_warm(void) {
  cm__pool p;
  CMT_OK(cm__pool_init(&p, 1 << 16, 8, 0));
  uint8_t *first[4];
  for (int i = 0; i < 4; i++) first[i] = take(&p, 1 << 16);
  for (int i = 0; i < 4; i++) cm__pool_put(&p, first[i]);
  CMT_EQU(p.allocated, 4);

  /* Once warm, any pattern of at most 4 held buffers is served without allocating, and only
   * with buffers the pool already had. */
  for (int round = 0; round < 1000; round++) {
    uint8_t *held[4];
    int n = 1 + round % 4;
    for (int i = 0; i < n; i++) {
      held[i] = take(&p, 1 << 16);
      bool known = false;
      for (int j = 0; j < 4; j++) known |= held[i] == first[j];
      CMT_ASSERT(known);
    }
    for (int i = n - 1; i >= 0; i--) cm__pool_put(&p, held[i]);
  }
  CMT_EQU(p.allocated, 4);
  CMT_EQU(p.alive, 4);
  CMT_EQU(p.free_count, 4);
  CMT_EQU(p.refused, 0);
  check_invariants(&p);
  cm__pool_destroy(&p);
}

static void test_reconfigure_size(void) {
  cm__pool p;
  CMT_OK(cm__pool_init(&p, 4096, 4, 0));
  uint8_t *a = take(&p, 4096), *b = take(&p, 4096), *c = take(&p, 4096);
  cm__pool_put(&p, a);
  CMT_EQU(p.free_count, 1);

  /* The free old-size buffer is freed at once; the two outstanding ones stay alive. */
  cm__pool_configure(&p, 8192, 4, 0);
  CMT_EQU(p.buffer_size, 8192);
  CMT_EQU(p.free_count, 0);
  CMT_EQU(p.alive, 2);
  check_invariants(&p);

  uint8_t *d = take(&p, 8192); /* ASan fails here if the buffer were the old 4096-byte one */
  CMT_EQU(p.allocated, 4);
  CMT_EQU(p.alive, 3);

  /* Old-size buffers returned now are freed, not recycled. */
  cm__pool_put(&p, b);
  CMT_EQU(p.free_count, 0);
  CMT_EQU(p.alive, 2);
  cm__pool_put(&p, c);
  CMT_EQU(p.alive, 1);
  /* A current-size buffer is recycled. */
  cm__pool_put(&p, d);
  CMT_EQU(p.free_count, 1);
  CMT_EQU(p.alive, 1);
  CMT_ASSERT(take(&p, 8192) == d);
  cm__pool_put(&p, d);

  /* Zero keeps the current values; a tiny size is raised to the minimum. */
  cm__pool_configure(&p, 0, 0, 0);
  CMT_EQU(p.buffer_size, 8192);
  CMT_EQU(p.max_buffers, 4);
  CMT_EQU(p.free_count, 1);
  cm__pool_configure(&p, 1, 0, 0);
  CMT_EQU(p.buffer_size, 64);
  CMT_EQU(p.free_count, 0);
  CMT_EQU(p.alive, 0);
  uint8_t *e = take(&p, 64);
  cm__pool_put(&p, e);
  check_invariants(&p);
  cm__pool_destroy(&p);
}

static void test_lower_bound(void) {
  cm__pool p;
  CMT_OK(cm__pool_init(&p, 4096, 6, 0));
  uint8_t *b[6];
  for (int i = 0; i < 6; i++) b[i] = take(&p, 4096);
  cm__pool_put(&p, b[0]);
  cm__pool_put(&p, b[1]);

  /* Lowering the bound to 3 frees both free buffers (alive 6 -> 4); the excess outstanding one is
   * freed when it comes back, and new requests are refused until alive is below the bound. */
  cm__pool_configure(&p, 4096, 3, 0);
  CMT_EQU(p.free_count, 0);
  CMT_EQU(p.alive, 4);
  CMT_ASSERT(cm__pool_get(&p, NULL, NULL) == NULL);
  CMT_EQU(p.refused, 1);
  cm__pool_put(&p, b[2]);
  CMT_EQU(p.alive, 3);
  CMT_EQU(p.free_count, 0);
  cm__pool_put(&p, b[3]);
  CMT_EQU(p.alive, 3);
  CMT_EQU(p.free_count, 1);
  cm__pool_put(&p, b[4]);
  cm__pool_put(&p, b[5]);
  CMT_EQU(p.alive, 3);
  CMT_EQU(p.free_count, 3);
  check_invariants(&p);
  cm__pool_destroy(&p);
}

static void test_warn_once(void) {
  cm__pool p;
  CMT_OK(cm__pool_init(&p, 256, 16, 2));
  uint8_t *b[6];
  int warnings = 0, warned_at = -1;
  for (int i = 0; i < 6; i++) {
    bool warn = true;
    b[i] = cm__pool_get(&p, NULL, &warn);
    CMT_ASSERT(b[i] != NULL);
    if (warn) {
      warnings++;
      warned_at = i;
    }
  }
  CMT_EQ(warnings, 1);
  CMT_EQ(warned_at, 2); /* the third outstanding buffer is the first past 2 */
  for (int i = 0; i < 6; i++) cm__pool_put(&p, b[i]);

  /* Passing the threshold again, from the free list this time, does not warn again. */
  for (int i = 0; i < 6; i++) {
    bool warn = true;
    b[i] = cm__pool_get(&p, NULL, &warn);
    CMT_ASSERT(!warn);
  }
  for (int i = 0; i < 6; i++) cm__pool_put(&p, b[i]);
  cm__pool_destroy(&p);

  /* A threshold of 0 turns the warning off. */
  CMT_OK(cm__pool_init(&p, 256, 16, 0));
  for (int i = 0; i < 6; i++) {
    bool warn = true;
    b[i] = cm__pool_get(&p, NULL, &warn);
    CMT_ASSERT(!warn);
  }
  for (int i = 0; i < 6; i++) cm__pool_put(&p, b[i]);
  cm__pool_destroy(&p);
}

/* The resident set of this process in KiB (/proc/self/statm), or 0 when it cannot be read. */
static uint64_t rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long size = 0, rss = 0;
  if (!f) return 0;
  int n = fscanf(f, "%llu %llu", &size, &rss);
  fclose(f);
  return n == 2 ? rss * (uint64_t)(sysconf(_SC_PAGESIZE) / 1024) : 0;
}

/* Buffers of 1 MiB and more are mappings of their own: aligned, writable to the last byte, and
 * given back to the system when the pool trims them, so the resident set falls by what they held
 * (checked outside the sanitizer builds, whose allocators keep memory of their own). */
static void test_trim_gives_memory_back(void) {
  enum { N = 8 };
  const size_t size = 4u << 20;
  cm__pool p;
  CMT_OK(cm__pool_init(&p, size, N, 0));
  uint8_t *b[N];
  for (int i = 0; i < N; i++) b[i] = take(&p, size); /* take() writes every byte */
  uint64_t full = rss_kib();
  for (int i = 0; i < N; i++) cm__pool_put(&p, b[i]);
  CMT_EQU(p.free_count, N);
  CMT_EQU(cm__pool_trim(&p, 2), N - 2);
  CMT_EQU(p.free_count, 2);
  check_invariants(&p);
  uint64_t trimmed = rss_kib();
  printf("trim: resident %llu KiB with %d buffers of 4 MiB written, %llu KiB after freeing %d\n",
         (unsigned long long)full, N, (unsigned long long)trimmed, N - 2);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  CMT_ASSERT(full > 0 && trimmed > 0);
  CMT_LEU(trimmed + (N - 2) * 4096 * 3 / 4, full); /* at least 3/4 of the 24 MiB went back */
#endif
  /* The two kept are recycled, and fresh ones are mapped again. */
  uint8_t *c = take(&p, size), *d = take(&p, size), *e = take(&p, size);
  cm__pool_put(&p, c);
  cm__pool_put(&p, d);
  cm__pool_put(&p, e);
  check_invariants(&p);
  cm__pool_destroy(&p);
}

/* ---- concurrency ------------------------------------------------------------------------ */

#define NTHREADS 4
#define ROUNDS 20000

typedef struct worker {
  cm__pool *p;
  pthread_barrier_t *start; /* lines the workers up so that their requests overlap */
  int index;
  uint64_t got, refused, warnings;
} worker;

/* Marks the first and last 8 bytes of a buffer with the owner and a sequence number; a buffer
 * handed to two owners at once fails the check when it is returned. */
static void mark(uint8_t *b, size_t size, uint64_t tag) {
  memcpy(b, &tag, 8);
  memcpy(b + size - 8, &tag, 8);
}

static void check_mark(const uint8_t *b, size_t size, uint64_t tag) {
  uint64_t head, tail;
  memcpy(&head, b, 8);
  memcpy(&tail, b + size - 8, 8);
  CMT_EQU(head, tag);
  CMT_EQU(tail, tag);
}

static void *worker_main(void *arg) {
  worker *w = arg;
  uint8_t *held[3];
  size_t sizes[3];
  uint64_t tags[3];
  int nheld = 0;
  pthread_barrier_wait(w->start);
  for (uint64_t r = 0; r < ROUNDS; r++) {
    bool warn = false;
    size_t size = 0;
    uint8_t *b = cm__pool_get(w->p, &size, &warn);
    w->warnings += warn;
    if (b) {
      w->got++;
      CMT_ASSERT(size >= 64);
      CMT_EQU((uintptr_t)b % 64, 0);
      uint64_t tag = ((uint64_t)w->index << 56) | r;
      mark(b, size, tag);
      held[nheld] = b;
      sizes[nheld] = size;
      tags[nheld] = tag;
      nheld++;
    } else {
      w->refused++;
    }
    /* Yield now and then while holding buffers, so that on a machine with few cores the workers
     * interleave instead of each finishing within its time slice. */
    if (r % 64 == 0) sched_yield();
    /* Hold up to 3 buffers, releasing in a pattern that mixes LIFO and FIFO returns. */
    if (nheld == 3 || (nheld > 0 && r % 3 == 0)) {
      int k = (int)(r % (uint64_t)nheld);
      check_mark(held[k], sizes[k], tags[k]);
      cm__pool_put(w->p, held[k]);
      held[k] = held[nheld - 1];
      sizes[k] = sizes[nheld - 1];
      tags[k] = tags[nheld - 1];
      nheld--;
    }
  }
  while (nheld > 0) {
    nheld--;
    check_mark(held[nheld], sizes[nheld], tags[nheld]);
    cm__pool_put(w->p, held[nheld]);
  }
  return NULL;
}

typedef struct reconf {
  cm__pool *p;
  _Atomic int stop;
} reconf;

/* Flips the buffer size and the bound while the workers run. */
static void *reconf_main(void *arg) {
  reconf *rc = arg;
  for (unsigned i = 0; !atomic_load(&rc->stop); i++) {
    cm__pool_configure(rc->p, (i & 1) ? 512 : 1024, (i & 2) ? 4 : 6, 2);
    sched_yield();
  }
  return NULL;
}

static void run_concurrent(bool reconfigure) {
  cm__pool p;
  CMT_OK(cm__pool_init(&p, 1024, 5, 2)); /* below the 12 the workers can hold */
  worker w[NTHREADS];
  pthread_t th[NTHREADS], rt;
  reconf rc = {.p = &p};
  atomic_init(&rc.stop, 0);
  pthread_barrier_t start;
  CMT_EQ(pthread_barrier_init(&start, NULL, NTHREADS), 0);
  for (int i = 0; i < NTHREADS; i++) {
    w[i] = (worker){.p = &p, .start = &start, .index = i};
    CMT_EQ(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  if (reconfigure) CMT_EQ(pthread_create(&rt, NULL, reconf_main, &rc), 0);
  for (int i = 0; i < NTHREADS; i++) CMT_EQ(pthread_join(th[i], NULL), 0);
  if (reconfigure) {
    atomic_store(&rc.stop, 1);
    CMT_EQ(pthread_join(rt, NULL), 0);
  }
  pthread_barrier_destroy(&start);

  uint64_t got = 0, refused = 0, warnings = 0;
  for (int i = 0; i < NTHREADS; i++) {
    got += w[i].got;
    refused += w[i].refused;
    warnings += w[i].warnings;
    CMT_EQU(w[i].got + w[i].refused, ROUNDS);
  }
  printf("concurrent%s: %" PRIu64 " granted, %" PRIu64 " refused, %" PRIu64
         " allocated, %" PRIu64 " alive\n",
         reconfigure ? " with reconfigure" : "", got, refused, p.allocated, p.alive);
  CMT_EQU(p.outstanding, 0);
  CMT_EQU(p.refused, refused);
  CMT_EQU(p.alive, p.free_count);
  CMT_LEU(p.alive, p.max_buffers);
  CMT_EQU(warnings, 1); /* 4 threads holding up to 3 each pass 2 outstanding at some point */
  if (!reconfigure) CMT_EQU(p.allocated, p.alive); /* nothing is freed without a reconfigure */

  /* Every free buffer has the current size: drain the pool and fill each one end to end. */
  uint8_t *all[8];
  uint64_t n = p.free_count;
  for (uint64_t i = 0; i < n; i++) all[i] = take(&p, p.buffer_size);
  for (uint64_t i = 0; i < n; i++) cm__pool_put(&p, all[i]);
  check_invariants(&p);
  cm__pool_destroy(&p);
}

int main(void) {
  test_init_rejects();
  test_bound_and_refusal();
  test_recycling_warm();
  test_reconfigure_size();
  test_lower_bound();
  test_warn_once();
  test_trim_gives_memory_back();
  run_concurrent(false);
  run_concurrent(true);
  printf("test_pool: ok\n");
  return 0;
}
