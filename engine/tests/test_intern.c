/*
 * test_intern.c: string interning. Checks that ids follow content, not pointers; that NULL and ""
 * are id 0; that bytes with embedded NULs and long mangled names keep their identity; that the
 * pointer cache serves a pointer until it is invalidated and then re-reads the content; 100k
 * distinct strings; and readers on other threads resolving ids while the decoder thread interns.
 * It also prints (without asserting) the cost of a cached pointer lookup.
 */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "cm_internal.h"
#include "cmt.h"

static void check_get(cm__intern *t, uint32_t id, const char *want, size_t want_len) {
  size_t len = 99999;
  const char *s = cm__intern_get(t, id, &len);
  CMT_ASSERT(s != NULL);
  CMT_EQU(len, want_len);
  CMT_ASSERT(memcmp(s, want, want_len) == 0);
  CMT_EQ(s[len], '\0');
}

static void test_empty(void) {
  cm__intern *t;
  CMT_EQ(cm__intern_new(NULL), CM_EINVAL);
  CMT_OK(cm__intern_new(&t));
  CMT_EQU(cm__intern_count(t), 1);
  check_get(t, 0, "", 0);
  CMT_ASSERT(cm__intern_get(t, 1, NULL) == NULL);
  CMT_ASSERT(cm__intern_get(t, UINT32_MAX, NULL) == NULL);
  CMT_EQU(cm__intern_ptr(t, NULL), 0);
  CMT_EQU(cm__intern_ptr(t, ""), 0);
  CMT_EQU(cm__intern_bytes(t, "", 0), 0);
  CMT_EQU(cm__intern_bytes(t, NULL, 0), 0);
  CMT_EQU(cm__intern_count(t), 1);
  cm__intern_free(t);
  cm__intern_free(NULL);
}

static void test_content_identity(void) {
  cm__intern *t;
  CMT_OK(cm__intern_new(&t));
  char a[] = "hello", b[] = "hello";
  char *c = strdup("hello");
  uint32_t ia = cm__intern_ptr(t, a);
  CMT_NE(ia, 0);
  CMT_EQU(cm__intern_ptr(t, b), ia);
  CMT_EQU(cm__intern_ptr(t, c), ia);
  CMT_EQU(cm__intern_bytes(t, "hello world", 5), ia);
  CMT_EQU(cm__intern_count(t), 2);
  /* The table holds its own copy. */
  const char *s = cm__intern_get(t, ia, NULL);
  CMT_ASSERT(s != a && s != b && s != c);
  free(c);
  check_get(t, ia, "hello", 5);

  /* Prefixes, case and embedded NULs are all different content. */
  uint32_t ids[6];
  ids[0] = ia;
  ids[1] = cm__intern_ptr(t, "hell");
  ids[2] = cm__intern_ptr(t, "Hello");
  ids[3] = cm__intern_bytes(t, "hello\0x", 7);
  ids[4] = cm__intern_bytes(t, "hello\0y", 7);
  ids[5] = cm__intern_bytes(t, "hello\0", 6);
  for (int i = 0; i < 6; i++)
    for (int j = i + 1; j < 6; j++) CMT_NE(ids[i], ids[j]);
  check_get(t, ids[3], "hello\0x", 7);
  check_get(t, ids[5], "hello\0", 6);
  CMT_EQU(cm__intern_bytes(t, "hello\0x", 7), ids[3]);
  CMT_EQU(cm__intern_count(t), 7);
  cm__intern_free(t);
}

/* Builds a mangled-looking name of `len` bytes whose last character is `tail`. */
static char *long_name(size_t len, char tail) {
  static const char stem[] = "_ZN7cutlass6KernelINS_4gemm6kernel13GemmUniversalINS1_11threadblock";
  char *s = malloc(len + 1);
  CMT_ASSERT(s != NULL);
  for (size_t i = 0; i < len; i++) s[i] = stem[i % (sizeof stem - 1)];
  s[len - 1] = tail;
  s[len] = '\0';
  return s;
}

static void test_long_names(void) {
  cm__intern *t;
  CMT_OK(cm__intern_new(&t));
  /* Lengths below and above the arena's dedicated-chunk threshold, and one larger than a chunk;
   * names of one length differ only in their last byte. */
  static const size_t lens[] = {300, 5000, 20000, 200000};
  /* Every string passed to cm__intern_ptr stays allocated until the end: a freed address reused
   * by the next malloc would hit the cache with the old id, which is the case invalidation exists
   * for (see test_invalidate). */
  uint32_t ids[4][2];
  char *keep[4][2][2];
  for (int i = 0; i < 4; i++) {
    for (int k = 0; k < 2; k++) {
      char *s = long_name(lens[i], k ? 'X' : 'Y');
      ids[i][k] = cm__intern_ptr(t, s);
      char *again = strdup(s);
      CMT_EQU(cm__intern_ptr(t, again), ids[i][k]);
      check_get(t, ids[i][k], s, lens[i]);
      keep[i][k][0] = s;
      keep[i][k][1] = again;
    }
    CMT_NE(ids[i][0], ids[i][1]);
  }
  CMT_EQU(cm__intern_count(t), 9);
  /* Short strings interned after a dedicated chunk still land in (and fill) the shared one. */
  for (int i = 0; i < 1000; i++) {
    char buf[32];
    snprintf(buf, sizeof buf, "short-%d", i);
    uint32_t id = cm__intern_bytes(t, buf, strlen(buf)); /* buf's address is reused: by content */
    CMT_EQU(id, 9 + (uint32_t)i);
    check_get(t, id, buf, strlen(buf));
  }
  for (int i = 0; i < 4; i++) {
    char *s = long_name(lens[i], 'X');
    check_get(t, ids[i][1], s, lens[i]);
    CMT_EQU(cm__intern_bytes(t, s, lens[i]), ids[i][1]);
    free(s);
  }
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < 2; k++) {
      free(keep[i][k][0]);
      free(keep[i][k][1]);
    }
  cm__intern_free(t);
}

typedef struct inval_arg {
  cm__intern *t;
} inval_arg;

static void *invalidate_main(void *arg) {
  cm__intern_invalidate(((inval_arg *)arg)->t);
  return NULL;
}

static void test_invalidate(void) {
  cm__intern *t;
  CMT_OK(cm__intern_new(&t));
  char buf[64] = "kernelA";
  uint32_t a = cm__intern_ptr(t, buf);

  /* Same pointer, new content, no invalidation: the cache answers by pointer, without reading the
   * bytes (this is what makes it fast, and why a module unload must invalidate it). */
  strcpy(buf, "kernelB");
  CMT_EQU(cm__intern_ptr(t, buf), a);
  CMT_EQU(cm__intern_count(t), 2);

  cm__intern_invalidate(t);
  uint32_t b = cm__intern_ptr(t, buf);
  CMT_NE(b, a);
  check_get(t, b, "kernelB", 7);
  check_get(t, a, "kernelA", 7);

  /* Invalidation from another thread, and back to the first content: the old id is found by
   * content. */
  strcpy(buf, "kernelA");
  inval_arg arg = {t};
  pthread_t th;
  CMT_EQ(pthread_create(&th, NULL, invalidate_main, &arg), 0);
  CMT_EQ(pthread_join(th, NULL), 0);
  CMT_EQU(cm__intern_ptr(t, buf), a);
  CMT_EQU(cm__intern_count(t), 3);

  /* The same content at many pointers after an invalidation still maps to one id. */
  cm__intern_invalidate(t);
  cm__intern_invalidate(t);
  char copies[16][16];
  for (int i = 0; i < 16; i++) {
    strcpy(copies[i], "kernelB");
    CMT_EQU(cm__intern_ptr(t, copies[i]), b);
  }
  cm__intern_free(t);
}

#define MANY 100000

static void test_many(void) {
  cm__intern *t;
  CMT_OK(cm__intern_new(&t));
  char **strs = malloc(sizeof(char *) * MANY);
  uint32_t *ids = malloc(sizeof(uint32_t) * MANY);
  CMT_ASSERT(strs && ids);
  for (int i = 0; i < MANY; i++) {
    char buf[96];
    int n = snprintf(buf, sizeof buf, "_Z%dkernel_%d_%.*s", i % 1000, i, i % 40,
                     "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz");
    strs[i] = malloc((size_t)n + 1);
    memcpy(strs[i], buf, (size_t)n + 1);
    ids[i] = cm__intern_ptr(t, strs[i]);
    CMT_EQU(ids[i], (uint32_t)i + 1); /* new content takes the next dense id */
  }
  CMT_EQU(cm__intern_count(t), MANY + 1);
  /* Second pass through the (thrashed) cache, then by content, then from fresh pointers. */
  for (int i = 0; i < MANY; i++) CMT_EQU(cm__intern_ptr(t, strs[i]), ids[i]);
  for (int i = 0; i < MANY; i++) CMT_EQU(cm__intern_bytes(t, strs[i], strlen(strs[i])), ids[i]);
  /* Fresh copies at new addresses, all alive at once so that no address is reused. */
  cm__intern_invalidate(t);
  char **copies = malloc(sizeof(char *) * MANY);
  CMT_ASSERT(copies != NULL);
  for (int i = MANY - 1; i >= 0; i--) {
    copies[i] = strdup(strs[i]);
    CMT_EQU(cm__intern_ptr(t, copies[i]), ids[i]);
    check_get(t, ids[i], strs[i], strlen(strs[i]));
  }
  CMT_EQU(cm__intern_count(t), MANY + 1);
  for (int i = 0; i < MANY; i++) {
    free(strs[i]);
    free(copies[i]);
  }
  free(copies);
  free(strs);
  free(ids);
  cm__intern_free(t);
}

/* ---- readers on other threads ------------------------------------------------------------ */

#define WRITES 200000
#define READERS 3

/* The content the writer gives id `id` (ids from 1): the reader recomputes it to check what it
 * resolved. */
static size_t expected(uint32_t id, char *buf, size_t cap) {
  return (size_t)snprintf(buf, cap, "w%u:%.*s", id, (int)(id % 61),
                          "0123456789012345678901234567890123456789012345678901234567890123");
}

typedef struct reader {
  cm__intern *t;
  _Atomic int *done;
  uint64_t checked;
} reader;

static void *reader_main(void *arg) {
  reader *r = arg;
  uint64_t x = (uint64_t)(uintptr_t)r | 1;
  for (;;) {
    int finished = atomic_load(r->done);
    uint32_t n = cm__intern_count(r->t);
    CMT_ASSERT(n >= 1);
    for (int k = 0; k < 64; k++) {
      /* Probe the newest ids (the most likely to race) and random older ones. */
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      uint32_t id = k < 8 ? n - 1 - (uint32_t)k % n : (uint32_t)(x % n);
      size_t len = 0;
      const char *s = cm__intern_get(r->t, id, &len);
      CMT_ASSERT(s != NULL);
      if (id == 0) {
        CMT_EQU(len, 0);
        continue;
      }
      char want[128];
      size_t wlen = expected(id, want, sizeof want);
      CMT_EQU(len, wlen);
      CMT_STREQ(s, want);
      r->checked++;
    }
    if (finished) break;
  }
  return NULL;
}

static void test_concurrent_readers(void) {
  cm__intern *t;
  CMT_OK(cm__intern_new(&t));
  _Atomic int done;
  atomic_init(&done, 0);
  reader r[READERS];
  pthread_t th[READERS];
  for (int i = 0; i < READERS; i++) {
    r[i] = (reader){.t = t, .done = &done};
    CMT_EQ(pthread_create(&th[i], NULL, reader_main, &r[i]), 0);
  }
  /* This thread is the decoder. Its strings sit at distinct addresses in one block, as names in
   * a loaded module would, so the pointer cache is exercised without stale address reuse. */
  enum { SLOT = 128 };
  char *block = malloc((size_t)SLOT * WRITES);
  CMT_ASSERT(block != NULL);
  for (uint32_t id = 1; id <= WRITES; id++) expected(id, block + (size_t)SLOT * (id - 1), SLOT);
  for (uint32_t id = 1; id <= WRITES; id++) {
    const char *s = block + (size_t)SLOT * (id - 1);
    CMT_EQU(cm__intern_ptr(t, s), id);
    if (id % 5000 == 0) cm__intern_invalidate(t);
    if (id % 7 == 0) CMT_EQU(cm__intern_ptr(t, block + (size_t)SLOT * (id / 2)), id / 2 + 1);
  }
  atomic_store(&done, 1);
  uint64_t checked = 0;
  for (int i = 0; i < READERS; i++) {
    CMT_EQ(pthread_join(th[i], NULL), 0);
    checked += r[i].checked;
  }
  printf("concurrent readers: %" PRIu64 " lookups checked\n", checked);
  CMT_GT(checked, 0);
  CMT_EQU(cm__intern_count(t), WRITES + 1);
  free(block);
  cm__intern_free(t);
}

/* ---- micro-benchmark (printed only) ------------------------------------------------------ */

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void bench(void) {
  cm__intern *t;
  CMT_OK(cm__intern_new(&t));
  enum { NAMES = 64, ITERS = 4000000 };
  char *names[NAMES];
  for (int i = 0; i < NAMES; i++) {
    names[i] = long_name(400, (char)('A' + i % 26));
    names[i][0] = (char)('a' + i / 26);
  }
  uint64_t sum = 0;
  for (int i = 0; i < NAMES; i++) sum += cm__intern_ptr(t, names[i]);
  double t0 = now_ns();
  for (int i = 0; i < ITERS; i++) sum += cm__intern_ptr(t, names[i & (NAMES - 1)]);
  double t1 = now_ns();
  for (int i = 0; i < ITERS / 16; i++) {
    const char *s = names[i & (NAMES - 1)];
    sum += cm__intern_bytes(t, s, strlen(s));
  }
  double t2 = now_ns();
  printf("bench: cached pointer lookup %.2f ns, content lookup of a 400-byte name %.2f ns "
         "(checksum %" PRIu64 ")\n",
         (t1 - t0) / ITERS, (t2 - t1) / (ITERS / 16), sum);
  for (int i = 0; i < NAMES; i++) free(names[i]);
  cm__intern_free(t);
}

int main(void) {
  test_empty();
  test_content_identity();
  test_long_names();
  test_invalidate();
  test_many();
  test_concurrent_readers();
  bench();
  printf("test_intern: ok\n");
  return 0;
}
