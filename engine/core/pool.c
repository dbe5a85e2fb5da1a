/*
 * pool.c: the bounded, recycled pool of CUPTI activity buffers.
 *
 * Design. CUPTI's buffer-request callback runs on application threads and must never block for
 * long, so the warm path is a pop from an intrusive free list under a mutex that is held only for
 * the list operation and the counters; memory is allocated and freed outside it. Every buffer is
 * preceded by a 64-byte header that records the size it was allocated with: after a reconfigure
 * the pool keeps recycling buffers of the current size and frees the ones of an older size as
 * they come back, so CUPTI never holds a buffer whose size the pool has forgotten. A free buffer
 * stores the free list's next pointer in its own first bytes, so the list costs no memory of its
 * own. The bound is on alive buffers (free plus outstanding): a request at the bound with an
 * empty free list gets NULL and is counted as refused, and CUPTI counts the records it could not
 * store as dropped. Buffers handed out are never freed by the pool until they are returned, since
 * CUPTI may still be writing them.
 *
 * A buffer of POOL_MMAP_MIN bytes or more (the default is 4 MiB) is a mapping of its own, so that
 * freeing it gives its pages back to the system at once. From malloc, a freed buffer of that size
 * would stay in the process: glibc raises its mmap threshold after the first such free and serves
 * the next from an arena, whose free chunks it keeps. That memory would then show as growth, for
 * example after the agent's lag guard has shed every kind and the buffers CUPTI had filled come
 * back for good.
 *
 * Lock order: the pool mutex is a leaf; nothing is called while it is held.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cm_internal.h"

/* The alignment of every buffer and the size of the header before it. CUPTI requires 8 bytes;
 * 64 keeps each buffer on its own cache lines. The header is a whole alignment unit so that the
 * buffer after it stays aligned. */
#define POOL_ALIGN 64
/* The smallest buffer the pool hands out: a free buffer must hold the free list's next pointer,
 * and nothing smaller is useful to CUPTI anyway. */
#define POOL_MIN_SIZE 64
/* The size (header included) from which a buffer is mapped on its own rather than taken from
 * malloc. */
#define POOL_MMAP_MIN ((size_t)1 << 20)

typedef union pool_hdr {
  struct {
    size_t size;           /* the usable size of the buffer after this header */
    uint64_t requested_ns; /* when CUPTI last asked for it (cm__pool_stamp) */
    bool mapped;           /* a mapping of its own (munmap), else from posix_memalign (free) */
  } h;
  unsigned char pad[POOL_ALIGN];
} pool_hdr;

_Static_assert(sizeof(pool_hdr) == POOL_ALIGN, "the header must keep buffers aligned");

static pool_hdr *hdr_of(uint8_t *buf) { return (pool_hdr *)(void *)(buf - sizeof(pool_hdr)); }

/* The free list's next pointer lives in the first bytes of a free buffer. memcpy keeps the
 * access free of aliasing assumptions about what CUPTI wrote there. */
static void *next_of(void *buf) {
  void *next;
  memcpy(&next, buf, sizeof next);
  return next;
}

static void set_next(void *buf, void *next) { memcpy(buf, &next, sizeof next); }

/* Allocates a buffer of `size` usable bytes with its header; NULL when memory is exhausted.
 * Called without the mutex. */
static uint8_t *buf_alloc(size_t size) {
  void *base = NULL;
  if (size > SIZE_MAX - sizeof(pool_hdr)) return NULL;
  size_t total = sizeof(pool_hdr) + size;
  bool mapped = total >= POOL_MMAP_MIN;
  if (mapped) {
    /* Page-aligned, so the buffer after the 64-byte header is aligned too. */
    base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
  } else if (posix_memalign(&base, POOL_ALIGN, total) != 0) {
    return NULL;
  }
  ((pool_hdr *)base)->h.size = size;
  ((pool_hdr *)base)->h.requested_ns = 0;
  ((pool_hdr *)base)->h.mapped = mapped;
  return (uint8_t *)base + sizeof(pool_hdr);
}

/* Frees a buffer from buf_alloc. Called without the mutex. */
static void buf_free(uint8_t *buf) {
  pool_hdr *h = hdr_of(buf);
  if (h->h.mapped)
    munmap(h, sizeof(pool_hdr) + h->h.size);
  else
    free(h);
}

/* Frees a chain of free buffers linked through their next pointers. Called without the mutex,
 * on a chain already detached from the pool. */
static void chain_free(void *head) {
  while (head) {
    void *next = next_of(head);
    buf_free(head);
    head = next;
  }
}

/* Counts one more outstanding buffer and decides the one-time warning. Mutex held. */
static bool note_outstanding(cm__pool *p) {
  p->outstanding++;
  if (!p->warned && p->warn_outstanding != 0 && p->outstanding > p->warn_outstanding) {
    p->warned = true;
    return true;
  }
  return false;
}

/* Detaches up to n free buffers and returns them as a chain for the caller to free after
 * unlocking. Mutex held. */
static void *detach_free_locked(cm__pool *p, uint64_t n) {
  void *chain = NULL;
  for (; n && p->free_list; n--) {
    void *b = p->free_list;
    p->free_list = next_of(b);
    set_next(b, chain);
    chain = b;
    p->free_count--;
    p->alive--;
  }
  return chain;
}

/* Detaches free buffers until alive fits the bound. Outstanding buffers are left alone: they
 * are freed on return while the pool is over its bound. Mutex held. */
static void *trim_locked(cm__pool *p) {
  return detach_free_locked(p, p->alive > p->max_buffers ? p->alive - p->max_buffers : 0);
}

/* Initializes the pool; no buffer is allocated until the first request. warn_outstanding == 0
 * turns the warning off. Fails with CM_EINVAL when buffer_size is below 64 bytes or max_buffers
 * is 0, and with CM_ENOMEM when the mutex cannot be created. */
int cm__pool_init(cm__pool *p, size_t buffer_size, uint32_t max_buffers, uint32_t warn_outstanding) {
  if (!p) return cm__seterr(CM_EINVAL, "pool: NULL pool");
  if (buffer_size < POOL_MIN_SIZE)
    return cm__seterr(CM_EINVAL, "pool: buffer size %zu is below the minimum of %d bytes",
                      buffer_size, POOL_MIN_SIZE);
  if (max_buffers == 0) return cm__seterr(CM_EINVAL, "pool: max_buffers must be at least 1");
  memset(p, 0, sizeof *p);
  int rc = pthread_mutex_init(&p->mu, NULL);
  if (rc != 0) return cm__seterr(CM_ENOMEM, "pool: pthread_mutex_init: %s", strerror(rc));
  p->buffer_size = buffer_size;
  p->max_buffers = max_buffers;
  p->warn_outstanding = warn_outstanding;
  return 0;
}

/* Frees the free list and the mutex. Buffers still outstanding stay allocated on purpose: CUPTI
 * may still own them, and a leak at teardown is better than a write into freed memory. The
 * caller guarantees no other thread uses the pool during or after the call. */
void cm__pool_destroy(cm__pool *p) {
  if (!p) return;
  void *chain = p->free_list;
  p->free_list = NULL;
  p->alive -= p->free_count;
  p->free_count = 0;
  chain_free(chain);
  pthread_mutex_destroy(&p->mu);
}

/* Any thread. A warm pool answers from the free list without allocating. A cold pool below its
 * bound reserves a slot under the mutex, then allocates outside it; if the allocation fails the
 * reservation is undone and the request counts as refused, like a request at the bound. */
uint8_t *cm__pool_get(cm__pool *p, size_t *size, bool *warn) {
  bool w = false;
  uint8_t *buf = NULL;
  size_t sz = 0;

  pthread_mutex_lock(&p->mu);
  if (p->free_list) {
    buf = p->free_list;
    p->free_list = next_of(buf);
    p->free_count--;
    w = note_outstanding(p);
    pthread_mutex_unlock(&p->mu);
    sz = hdr_of(buf)->h.size;
  } else if (p->alive >= p->max_buffers) {
    p->refused++;
    pthread_mutex_unlock(&p->mu);
  } else {
    p->alive++;
    p->allocated++;
    sz = p->buffer_size;
    w = note_outstanding(p);
    pthread_mutex_unlock(&p->mu);

    buf = buf_alloc(sz);
    if (!buf) {
      sz = 0;
      pthread_mutex_lock(&p->mu);
      p->alive--;
      p->allocated--;
      p->outstanding--;
      p->refused++;
      pthread_mutex_unlock(&p->mu);
    }
  }
  if (size) *size = sz;
  if (warn) *warn = w;
  return buf;
}

/* Any thread. A buffer of the current size goes back on the free list while the pool is within
 * its bound; a buffer of an older size, or one returned while a lowered bound is exceeded, is
 * freed (outside the mutex). NULL is ignored. */
void cm__pool_put(cm__pool *p, uint8_t *buf) {
  if (!buf) return;
  /* The header's size was written before the buffer was first handed out and is never written
   * again, so it can be read without the mutex (only the request stamp beside it changes). */
  size_t sz = hdr_of(buf)->h.size;
  bool recycle;

  pthread_mutex_lock(&p->mu);
  p->outstanding--;
  recycle = sz == p->buffer_size && p->alive <= p->max_buffers;
  if (recycle) {
    set_next(buf, p->free_list);
    p->free_list = buf;
    p->free_count++;
  } else {
    p->alive--;
  }
  pthread_mutex_unlock(&p->mu);

  if (!recycle) buf_free(buf);
}

/* Any thread. A new size takes effect for buffers allocated from now on; free buffers of the old
 * size are freed at once, outstanding ones when they are returned. A lowered bound frees surplus
 * free buffers at once and outstanding ones as they return. A buffer_size of 0 or max_buffers of 0
 * keeps the current value; a nonzero buffer size below 64 bytes is raised to 64. warn == 0 turns
 * the warning off. The warning is not re-armed: it fires at most once per pool. */
void cm__pool_configure(cm__pool *p, size_t buffer_size, uint32_t max_buffers, uint32_t warn) {
  void *stale = NULL, *surplus;

  if (buffer_size != 0 && buffer_size < POOL_MIN_SIZE) buffer_size = POOL_MIN_SIZE;

  pthread_mutex_lock(&p->mu);
  if (buffer_size != 0 && buffer_size != p->buffer_size) {
    stale = p->free_list;
    p->free_list = NULL;
    p->alive -= p->free_count;
    p->free_count = 0;
    p->buffer_size = buffer_size;
  }
  if (max_buffers != 0) p->max_buffers = max_buffers;
  p->warn_outstanding = warn;
  surplus = trim_locked(p);
  pthread_mutex_unlock(&p->mu);

  chain_free(stale);
  chain_free(surplus);
}

/* Any thread. The free buffers beyond `keep` are detached under the mutex and freed outside it. */
uint64_t cm__pool_trim(cm__pool *p, uint64_t keep) {
  pthread_mutex_lock(&p->mu);
  uint64_t n = p->free_count > keep ? p->free_count - keep : 0;
  void *chain = detach_free_locked(p, n);
  pthread_mutex_unlock(&p->mu);
  chain_free(chain);
  return n;
}

void cm__pool_stamp(uint8_t *buf, uint64_t ns) { hdr_of(buf)->h.requested_ns = ns; }

uint64_t cm__pool_requested_ns(uint8_t *buf) { return hdr_of(buf)->h.requested_ns; }
