/*
 * intern.c: string interning by content, with a pointer-keyed cache in front.
 *
 * Design. The decoder sees the same kernel and marker names millions of times, as pointers into
 * CUPTI's or the driver's memory. Ids must follow content, not address (a module unload frees a
 * name and a later one may reuse the address), yet hashing a long mangled name per record would
 * cost more than decoding the record. So there are two layers:
 *
 *   - the content table: an open-addressing (linear probing) hash table of 64-bit content hashes
 *     to ids, grown by doubling, owned by the decoder thread;
 *   - the pointer cache: a 2-way set-associative cache of pointer value -> id, decoder thread only.
 *     A hit costs a multiply, two compares and no look at the string's bytes. Any thread may
 *     invalidate it by bumping an atomic generation; the decoder compares the generation with the
 *     one it last saw before each lookup and clears the cache when it moved.
 *
 * Storage never moves, so that other threads can read strings by id without a lock: the bytes
 * are copied (NUL-terminated) into chunked arenas that are only freed with the table, and the
 * id -> (pointer, length) directory is a fixed page table whose pages are allocated on demand and
 * never reallocated. The writer fills an entry, then publishes the new count with a release store;
 * a reader loads the count with acquire and only touches ids below it, which orders its reads of
 * the entry (and of the page pointer and the bytes) after the writer's writes.
 *
 * Failure: cm__intern_bytes and cm__intern_ptr cannot report an error through their return value
 * (an id), so when memory or id space is exhausted they return 0, the empty string, and the record
 * carries an empty name instead of a dangling id.
 */
#include <stdlib.h>
#include <string.h>

#include "cm_internal.h"

/* The directory: DIR_PAGES pages of DIR_PAGE entries, 64M ids in all. The page table itself is
 * part of the table object, so it never moves either. */
#define DIR_PAGE_SHIFT 12
#define DIR_PAGE ((uint32_t)1 << DIR_PAGE_SHIFT)
#define DIR_PAGES 16384u
#define MAX_IDS (DIR_PAGE * DIR_PAGES)

/* Arena chunks. A string longer than a quarter of a chunk gets a chunk of its own, so that long
 * mangled names do not waste the tail of the current chunk. */
#define CHUNK_SIZE ((size_t)64 * 1024)
#define CHUNK_OWN (CHUNK_SIZE / 4)

/* The pointer cache: CACHE_SETS sets of 2 ways, 4096 slots. */
#define CACHE_SET_BITS 11
#define CACHE_SETS ((size_t)1 << CACHE_SET_BITS)

/* The content table starts at this many slots and doubles when more than 70% full. */
#define TABLE_MIN 1024u

typedef struct dir_entry {
  const char *ptr; /* NUL-terminated copy in an arena */
  size_t len;      /* bytes before the terminating NUL (the string may hold NULs of its own) */
  uint64_t hash;   /* kept so that growing the content table does not rehash the bytes */
} dir_entry;

/* A content-table slot: id + 1 (0 marks an empty slot) and the high half of the hash, which
 * rejects almost every mismatching slot without touching the directory. */
typedef struct table_slot {
  uint32_t id1;
  uint32_t tag;
} table_slot;

typedef struct cache_way {
  const char *key; /* NULL marks an empty way; NULL is never looked up */
  uint32_t id;
} cache_way;

typedef struct chunk {
  struct chunk *next;
  size_t cap;
  size_t used;
  char data[];
} chunk;

struct cm__intern {
  /* Published to every thread. count is the number of valid ids; written by the decoder with
   * release, read elsewhere with acquire. */
  _Atomic uint32_t count;
  /* Bumped by any thread to invalidate the pointer cache. */
  _Atomic uint64_t generation;

  /* Decoder thread only: the pointer cache and the generation it was last cleared at. */
  uint64_t seen_generation;
  cache_way cache[CACHE_SETS][2];

  /* Decoder thread only: the content table and the arenas. */
  table_slot *table;
  uint32_t table_cap; /* a power of two */
  chunk *chunks;      /* the current chunk first; dedicated chunks are linked behind it */

  /* Written by the decoder before publishing count; read by any thread below count. */
  dir_entry *pages[DIR_PAGES];
};

/* The content hash. FNV-1a's byte-serial multiply costs about a microsecond on a 400-byte
 * mangled name, so this takes 8 bytes per step (xor, multiply, fold) and ends with murmur3's
 * finalizer so that both the low bits (the slot) and the high bits (the tag) are well mixed. */
static uint64_t hash_bytes(const char *s, size_t len) {
  const uint64_t k = 0x9e3779b97f4a7c15ull;
  uint64_t h = 0xcbf29ce484222325ull ^ ((uint64_t)len * k);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    h = (h ^ w) * k;
    h ^= h >> 29;
  }
  if (i < len) {
    uint64_t w = 0;
    memcpy(&w, s + i, len - i);
    h = (h ^ w) * k;
    h ^= h >> 29;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

/* The cache set of a pointer: a Fibonacci hash of its value, so that strings packed at nearby
 * addresses spread over the sets. */
static size_t cache_set(const char *s) {
  return (size_t)(((uint64_t)(uintptr_t)s * 0x9e3779b97f4a7c15ull) >> (64 - CACHE_SET_BITS));
}

static dir_entry *entry_of(const cm__intern *t, uint32_t id) {
  return &t->pages[id >> DIR_PAGE_SHIFT][id & (DIR_PAGE - 1)];
}

/* Copies `len` bytes and a NUL into the arenas; NULL when memory is exhausted. Decoder only. */
static char *arena_copy(cm__intern *t, const char *s, size_t len) {
  chunk *c = t->chunks;
  char *dst;
  if (len >= CHUNK_OWN) {
    chunk *own = malloc(sizeof(chunk) + len + 1);
    if (!own) return NULL;
    own->cap = own->used = len + 1;
    /* Behind the current chunk, so that the current one keeps filling. */
    if (c) {
      own->next = c->next;
      c->next = own;
    } else {
      own->next = NULL;
      t->chunks = own;
    }
    dst = own->data;
  } else {
    if (!c || c->cap - c->used < len + 1) {
      chunk *fresh = malloc(sizeof(chunk) + CHUNK_SIZE);
      if (!fresh) return NULL;
      fresh->cap = CHUNK_SIZE;
      fresh->used = 0;
      fresh->next = c;
      t->chunks = c = fresh;
    }
    dst = c->data + c->used;
    c->used += len + 1;
  }
  if (len) memcpy(dst, s, len);
  dst[len] = '\0';
  return dst;
}

/* Places `id` in a table of `cap` slots; there is always an empty slot. */
static void table_place(table_slot *tab, uint32_t cap, uint64_t hash, uint32_t id) {
  uint32_t mask = cap - 1;
  for (uint32_t i = (uint32_t)hash & mask;; i = (i + 1) & mask) {
    if (tab[i].id1 == 0) {
      tab[i].id1 = id + 1;
      tab[i].tag = (uint32_t)(hash >> 32);
      return;
    }
  }
}

/* Doubles the content table, re-placing every id from its directory entry. Returns false (and
 * keeps the old table) when memory is exhausted. Decoder only. */
static bool table_grow(cm__intern *t, uint32_t n) {
  uint32_t cap = t->table_cap * 2;
  table_slot *tab = calloc(cap, sizeof *tab);
  if (!tab) return false;
  for (uint32_t id = 0; id < n; id++) table_place(tab, cap, entry_of(t, id)->hash, id);
  free(t->table);
  t->table = tab;
  t->table_cap = cap;
  return true;
}

/* Creates a table holding the empty string as id 0. Returns 0, CM_EINVAL for a NULL `out` or
 * CM_ENOMEM. The caller owns the table and frees it with cm__intern_free. */
int cm__intern_new(cm__intern **out) {
  if (!out) return cm__seterr(CM_EINVAL, "intern: NULL out pointer");
  *out = NULL;
  cm__intern *t = calloc(1, sizeof *t);
  if (!t) return cm__seterr(CM_ENOMEM, "intern: out of memory for the table");
  atomic_init(&t->count, 0);
  atomic_init(&t->generation, 0);
  t->table_cap = TABLE_MIN;
  t->table = calloc(t->table_cap, sizeof *t->table);
  if (!t->table) {
    free(t);
    return cm__seterr(CM_ENOMEM, "intern: out of memory for the content table");
  }
  /* Id 0 must be the empty string: an allocation failure here is the only way it is not. */
  if (cm__intern_bytes(t, "", 0) != 0 || atomic_load(&t->count) != 1) {
    cm__intern_free(t);
    return cm__seterr(CM_ENOMEM, "intern: out of memory for the empty string");
  }
  *out = t;
  return 0;
}

/* Frees the table, its arenas and its directory. Every string obtained from it becomes invalid;
 * the caller guarantees that no thread still uses the table. NULL is accepted. */
void cm__intern_free(cm__intern *t) {
  if (!t) return;
  for (uint32_t i = 0; i < DIR_PAGES && t->pages[i]; i++) free(t->pages[i]);
  for (chunk *c = t->chunks, *next; c; c = next) {
    next = c->next;
    free(c);
  }
  free(t->table);
  free(t);
}

/* Decoder thread only. Returns the id of the `len` bytes at `s` (which may hold NULs), adding
 * them if new; 0 when memory or id space is exhausted. `s` may be NULL only when len is 0. */
uint32_t cm__intern_bytes(cm__intern *t, const char *s, size_t len) {
  uint64_t hash = hash_bytes(s, len);
  uint32_t tag = (uint32_t)(hash >> 32);
  uint32_t mask = t->table_cap - 1;
  uint32_t i = (uint32_t)hash & mask;

  for (;; i = (i + 1) & mask) {
    table_slot sl = t->table[i];
    if (sl.id1 == 0) break;
    if (sl.tag == tag) {
      const dir_entry *e = entry_of(t, sl.id1 - 1);
      if (e->len == len && (len == 0 || memcmp(e->ptr, s, len) == 0)) return sl.id1 - 1;
    }
  }

  /* New content. Only this thread writes count, so a relaxed load of it is exact. */
  uint32_t n = atomic_load_explicit(&t->count, memory_order_relaxed);
  if (n >= MAX_IDS) return 0;
  if ((uint64_t)(n + 1) * 10 > (uint64_t)t->table_cap * 7) {
    if (!table_grow(t, n)) return 0;
  }
  uint32_t page = n >> DIR_PAGE_SHIFT;
  if (!t->pages[page]) {
    t->pages[page] = malloc(sizeof(dir_entry) * DIR_PAGE);
    if (!t->pages[page]) return 0;
  }
  char *copy = arena_copy(t, s, len);
  if (!copy) return 0;
  dir_entry *e = entry_of(t, n);
  e->ptr = copy;
  e->len = len;
  e->hash = hash;
  table_place(t->table, t->table_cap, hash, n);
  atomic_store_explicit(&t->count, n + 1, memory_order_release);
  return n;
}

/* Decoder thread only. NULL maps to id 0. A hit reads neither the string nor its length; a miss
 * interns the NUL-terminated string by content and remembers the pointer (most recent way first).
 * An id of 0 from a failed allocation is not cached, so a later lookup retries. */
uint32_t cm__intern_ptr(cm__intern *t, const char *s) {
  if (!s) return 0;
  uint64_t gen = atomic_load_explicit(&t->generation, memory_order_acquire);
  if (gen != t->seen_generation) {
    memset(t->cache, 0, sizeof t->cache);
    t->seen_generation = gen;
  }
  cache_way *set = t->cache[cache_set(s)];
  if (set[0].key == s) return set[0].id;
  if (set[1].key == s) {
    cache_way hit = set[1];
    set[1] = set[0];
    set[0] = hit;
    return hit.id;
  }
  size_t len = strlen(s);
  uint32_t id = cm__intern_bytes(t, s, len);
  if (id != 0 || len == 0) {
    set[1] = set[0];
    set[0].key = s;
    set[0].id = id;
  }
  return id;
}

/* Any thread. After it returns, the decoder's next cm__intern_ptr starts from an empty cache, so
 * a pointer freed before this call is never resolved through a stale entry. */
void cm__intern_invalidate(cm__intern *t) {
  atomic_fetch_add_explicit(&t->generation, 1, memory_order_release);
}

/* Any thread. Returns the NUL-terminated string of `id` and stores its length in *len (when len
 * is not NULL), or NULL for an id not yet published. The string lives as long as the table. */
const char *cm__intern_get(cm__intern *t, uint32_t id, size_t *len) {
  if (id >= atomic_load_explicit(&t->count, memory_order_acquire)) return NULL;
  const dir_entry *e = entry_of(t, id);
  if (len) *len = e->len;
  return e->ptr;
}

/* Any thread. The number of ids published so far; every id below it resolves. */
uint32_t cm__intern_count(cm__intern *t) {
  return atomic_load_explicit(&t->count, memory_order_acquire);
}
