/*
 * correlation.c: external correlation ids, their chains, and the metadata attached to them.
 *
 * Design. A framework brackets work with cm_corr_push / cm_corr_pop. Each thread keeps its own
 * stack of frames, as CUPTI keeps one per thread. CUPTI tags every API call with the innermost id
 * of our external kind only, so each push snapshots the thread's whole active stack into a chain
 * (innermost first) in a process-wide table; a kernel tagged with id X is then resolved to every
 * enclosing context through the chain of X. A frame remembers whether CUPTI accepted its push:
 * a pop unwinds CUPTI only for an accepted frame, so a rejected push never makes a later pop
 * remove the enclosing context from CUPTI's stack, and an over-pop does nothing at all.
 *
 * Records of a popped id arrive after the pop (CUPTI delivers buffers late), so a popped chain is
 * not dropped at once. Popped ids go to `pending`; at the end of each drain the ids in `ready` are
 * retired and `pending` becomes `ready`. A chain therefore resolves through the drain after its
 * pop and the one after that, and is gone after the second.
 *
 * Metadata blobs are parsed into a small JSON tree (json.c), merged into the id's tree under the
 * lock, and serialized on take.
 *
 * Thread rules. Every public function is thread-safe. The frame stacks are thread-local and
 * need no lock. `g.mu` guards the chain table, the retirement lists and the metadata store; it is
 * a leaf lock, held only for table operations (never while calling CUPTI or allocating a parse
 * tree). The CUPTI entry points are published with atomics by the engine (attach/detach).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_internal.h"

typedef __typeof__(&cuptiActivityPushExternalCorrelationId) push_fn;
typedef __typeof__(&cuptiActivityPopExternalCorrelationId) pop_fn;

/* ---- a u64-keyed hash map ------------------------------------------------------------------ */

typedef struct hent {
  struct hent *next;
  uint64_t key;
  void *val;
} hent;

typedef struct hmap {
  hent **b;
  size_t nb; /* a power of two, or 0 */
  size_t n;
} hmap;

static size_t hslot(const hmap *m, uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return (size_t)k & (m->nb - 1);
}

static hent *hfind(const hmap *m, uint64_t k) {
  if (!m->nb) return NULL;
  for (hent *e = m->b[hslot(m, k)]; e; e = e->next)
    if (e->key == k) return e;
  return NULL;
}

/* Inserts a new entry for `k` (the caller has checked it is absent). Returns it, or NULL. */
static hent *hinsert(hmap *m, uint64_t k, void *v) {
  if (m->n + 1 > m->nb) {
    size_t nb = m->nb ? m->nb * 2 : 64;
    hent **b = calloc(nb, sizeof *b);
    if (!b) {
      if (!m->nb) return NULL; /* keep going at a higher load when the table exists */
    } else {
      for (size_t i = 0; i < m->nb; i++)
        for (hent *e = m->b[i], *nx; e; e = nx) {
          nx = e->next;
          size_t s;
          hmap tmp = {b, nb, 0};
          s = hslot(&tmp, e->key);
          e->next = b[s];
          b[s] = e;
        }
      free(m->b);
      m->b = b;
      m->nb = nb;
    }
  }
  hent *e = malloc(sizeof *e);
  if (!e) return NULL;
  size_t s = hslot(m, k);
  e->key = k;
  e->val = v;
  e->next = m->b[s];
  m->b[s] = e;
  m->n++;
  return e;
}

/* Removes `k` and returns its value (NULL when absent). */
static void *hremove(hmap *m, uint64_t k) {
  if (!m->nb) return NULL;
  for (hent **pp = &m->b[hslot(m, k)]; *pp; pp = &(*pp)->next)
    if ((*pp)->key == k) {
      hent *e = *pp;
      void *v = e->val;
      *pp = e->next;
      free(e);
      m->n--;
      return v;
    }
  return NULL;
}

/* ---- state --------------------------------------------------------------------------------- */

enum { FRAME_LOCAL = 0, FRAME_CUPTI = 1, FRAME_REJECTED = 2 };

typedef struct frame {
  uint64_t id;
  int state; /* FRAME_*: whether CUPTI holds this frame on its stack */
  uint32_t epoch; /* g_epoch when it was pushed: a cuptiFinalize since then emptied CUPTI's stack */
} frame;

typedef struct tstack {
  int n;
  frame f[CM_CORR_MAX_DEPTH];
} tstack;

/* A chain snapshot: ids[0] is the id itself, then its enclosing ids outward. */
typedef struct chain {
  uint32_t n;
  uint64_t ids[];
} chain;

typedef struct idvec {
  uint64_t *v;
  size_t n, cap;
} idvec;

static struct {
  pthread_mutex_t mu; /* guards everything below */
  hmap chains;        /* id -> chain* */
  idvec pending;      /* popped since the last drain */
  idvec ready;        /* popped before the last drain: retired at the next */
  hmap meta;          /* id -> cm__json* */
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Atomic uint64_t g_next_id = 1;
static _Atomic(push_fn) g_push; /* NULL while no engine is attached */
static _Atomic(pop_fn) g_pop;   /* kept after detach, for frames CUPTI still holds */
/* Counts cuptiFinalize calls (cm__corr_finalized): a frame pushed before one is not on CUPTI's
 * stack any more, and popping it there would only initialize CUPTI again. */
static _Atomic uint32_t g_epoch;

static pthread_once_t t_once = PTHREAD_ONCE_INIT;
static pthread_key_t t_key;
static _Thread_local tstack *t_stack;

static bool idvec_push(idvec *v, uint64_t id) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 64;
    uint64_t *p = realloc(v->v, cap * sizeof *p);
    if (!p) return false;
    v->v = p;
    v->cap = cap;
  }
  v->v[v->n++] = id;
  return true;
}

/* Queues `id` for retirement, or drops its chain now when the queue cannot grow. g.mu held. */
static void retire_later(uint64_t id) {
  if (!idvec_push(&g.pending, id)) free(hremove(&g.chains, id));
}

/* A thread that exits with frames pushed leaves them behind: their chains age like popped ones. */
static void thread_exit(void *p) {
  tstack *ts = p;
  pthread_mutex_lock(&g.mu);
  for (int i = 0; i < ts->n; i++) retire_later(ts->f[i].id);
  pthread_mutex_unlock(&g.mu);
  free(ts);
}

static void key_init(void) { pthread_key_create(&t_key, thread_exit); }

static tstack *self_stack(void) {
  if (t_stack) return t_stack;
  pthread_once(&t_once, key_init);
  tstack *ts = calloc(1, sizeof *ts);
  if (!ts) return NULL;
  pthread_setspecific(t_key, ts);
  t_stack = ts;
  return ts;
}

/* ---- engine hooks -------------------------------------------------------------------------- */

void cm__corr_attach(const cm__cupti *c) {
  atomic_store(&g_pop, c->ActivityPopExternalCorrelationId);
  atomic_store(&g_push, c->ActivityPushExternalCorrelationId);
}

void cm__corr_detach(void) { atomic_store(&g_push, NULL); }

void cm__corr_finalized(void) {
  atomic_store(&g_push, NULL);
  atomic_fetch_add(&g_epoch, 1);
}

void cm__corr_drain(void) {
  pthread_mutex_lock(&g.mu);
  for (size_t i = 0; i < g.ready.n; i++) free(hremove(&g.chains, g.ready.v[i]));
  idvec t = g.ready;
  g.ready = g.pending;
  t.n = 0;
  g.pending = t;
  pthread_mutex_unlock(&g.mu);
}

/* ---- push and pop -------------------------------------------------------------------------- */

int cm_corr_push_id(uint64_t id) {
  if (id == 0) return cm__seterr(CM_EINVAL, "cm_corr_push_id: id 0 is reserved for 'none'");
  tstack *ts = self_stack();
  if (!ts) return cm__seterr(CM_ENOMEM, "cannot allocate the thread's correlation stack");
  if (ts->n >= CM_CORR_MAX_DEPTH)
    return cm__seterr(CM_ERANGE, "correlation stack full (%d frames): a pop is missing",
                      CM_CORR_MAX_DEPTH);
  chain *ch = malloc(sizeof *ch + (size_t)(ts->n + 1) * sizeof ch->ids[0]);
  if (!ch) return cm__seterr(CM_ENOMEM, "cannot allocate a correlation chain");
  ch->n = (uint32_t)ts->n + 1;
  ch->ids[0] = id;
  for (int i = 0; i < ts->n; i++) ch->ids[1 + i] = ts->f[ts->n - 1 - i].id;

  pthread_mutex_lock(&g.mu);
  hent *e = hfind(&g.chains, id);
  if (e) {
    free(e->val);
    e->val = ch;
  } else if (!hinsert(&g.chains, id, ch)) {
    pthread_mutex_unlock(&g.mu);
    free(ch);
    return cm__seterr(CM_ENOMEM, "cannot grow the correlation chain table");
  }
  pthread_mutex_unlock(&g.mu);

  int state = FRAME_LOCAL;
  uint32_t epoch = atomic_load(&g_epoch);
  push_fn push = atomic_load(&g_push);
  if (push)
    state = push((CUpti_ExternalCorrelationKind)CM_CORR_EXTERNAL_KIND, id) == CUPTI_SUCCESS
                ? FRAME_CUPTI
                : FRAME_REJECTED;
  ts->f[ts->n++] = (frame){id, state, epoch};
  return 0;
}

uint64_t cm_corr_push(void) {
  uint64_t id = atomic_fetch_add(&g_next_id, 1);
  return cm_corr_push_id(id) == 0 ? id : 0;
}

int cm_corr_pop(uint64_t *id) {
  tstack *ts = t_stack;
  if (!ts || ts->n == 0)
    return cm__seterr(CM_ENOENT, "cm_corr_pop: nothing is pushed on this thread");
  frame f = ts->f[--ts->n];
  if (f.state == FRAME_CUPTI && f.epoch == atomic_load(&g_epoch)) {
    pop_fn pop = atomic_load(&g_pop);
    uint64_t last = 0;
    if (pop) pop((CUpti_ExternalCorrelationKind)CM_CORR_EXTERNAL_KIND, &last);
  }
  pthread_mutex_lock(&g.mu);
  retire_later(f.id);
  pthread_mutex_unlock(&g.mu);
  if (id) *id = f.id;
  return 0;
}

uint64_t cm_corr_current(void) {
  tstack *ts = t_stack;
  for (int i = ts ? ts->n - 1 : -1; i >= 0; i--)
    if (ts->f[i].state != FRAME_REJECTED) return ts->f[i].id;
  return 0;
}

int cm_corr_depth(void) { return t_stack ? t_stack->n : 0; }

int cm_corr_chain(uint64_t id, uint64_t *out, int max) {
  if (max < 0 || (max > 0 && !out)) return cm__seterr(CM_EINVAL, "cm_corr_chain: bad out/max");
  pthread_mutex_lock(&g.mu);
  hent *e = hfind(&g.chains, id);
  int n = 0;
  if (e) {
    chain *ch = e->val;
    n = (int)ch->n;
    for (int i = 0; i < n && i < max; i++) out[i] = ch->ids[i];
  }
  pthread_mutex_unlock(&g.mu);
  return n;
}

/* ---- joins --------------------------------------------------------------------------------- */

/* correlation id -> external id, open addressing; 0 is never a valid correlation id key here, so
 * key 0 marks an empty slot (a row with correlation 0 is skipped, as CUPTI never uses it). */
typedef struct ctab {
  uint32_t *key;
  uint64_t *val;
  size_t mask;
} ctab;

static int ctab_build(ctab *t, const uint32_t *ec_kind, const uint64_t *ec_ext,
                      const uint32_t *ec_corr, uint32_t n_ec) {
  size_t cap = 16;
  while (cap < (size_t)n_ec * 2) cap *= 2;
  t->key = calloc(cap, sizeof *t->key);
  t->val = malloc(cap * sizeof *t->val);
  t->mask = cap - 1;
  if (!t->key || !t->val) {
    free(t->key);
    free(t->val);
    return cm__seterr(CM_ENOMEM, "cannot allocate the join table");
  }
  for (uint32_t i = 0; i < n_ec; i++) {
    if (ec_kind && ec_kind[i] != CM_CORR_EXTERNAL_KIND) continue;
    uint32_t k = ec_corr[i];
    if (!k) continue;
    size_t s = (k * 0x9E3779B1u) & t->mask;
    while (t->key[s] && t->key[s] != k) s = (s + 1) & t->mask;
    t->key[s] = k;
    t->val[s] = ec_ext[i]; /* a later record for the same call wins */
  }
  return 0;
}

static uint64_t ctab_get(const ctab *t, uint32_t k) {
  if (!k) return 0;
  size_t s = (k * 0x9E3779B1u) & t->mask;
  while (t->key[s]) {
    if (t->key[s] == k) return t->val[s];
    s = (s + 1) & t->mask;
  }
  return 0;
}

int cm_corr_join(const uint32_t *ec_kind, const uint64_t *ec_external_id,
                 const uint32_t *ec_correlation, uint32_t n_ec, const uint32_t *correlation,
                 uint32_t n, uint64_t *external_out) {
  if ((n_ec && (!ec_external_id || !ec_correlation)) || (n && (!correlation || !external_out)))
    return cm__seterr(CM_EINVAL, "cm_corr_join: a column is NULL");
  ctab t;
  int rc = ctab_build(&t, ec_kind, ec_external_id, ec_correlation, n_ec);
  if (rc) return rc;
  for (uint32_t i = 0; i < n; i++) external_out[i] = ctab_get(&t, correlation[i]);
  free(t.key);
  free(t.val);
  return 0;
}

int64_t cm_corr_join_chains(const uint32_t *ec_kind, const uint64_t *ec_external_id,
                            const uint32_t *ec_correlation, uint32_t n_ec,
                            const uint32_t *correlation, uint32_t n, uint32_t *offsets,
                            uint64_t *ids, uint32_t cap_ids) {
  if ((n_ec && (!ec_external_id || !ec_correlation)) || (n && !correlation) || !offsets ||
      (cap_ids && !ids))
    return cm__seterr(CM_EINVAL, "cm_corr_join_chains: a column is NULL");
  ctab t;
  int rc = ctab_build(&t, ec_kind, ec_external_id, ec_correlation, n_ec);
  if (rc) return rc;
  uint64_t total = 0;
  pthread_mutex_lock(&g.mu);
  for (uint32_t i = 0; i < n; i++) {
    offsets[i] = (uint32_t)(total > UINT32_MAX ? UINT32_MAX : total);
    uint64_t x = ctab_get(&t, correlation[i]);
    hent *e = x ? hfind(&g.chains, x) : NULL;
    if (!e) continue;
    const chain *ch = e->val;
    for (uint32_t j = 0; j < ch->n; j++, total++)
      if (total < cap_ids) ids[total] = ch->ids[j];
  }
  offsets[n] = (uint32_t)(total > UINT32_MAX ? UINT32_MAX : total);
  pthread_mutex_unlock(&g.mu);
  free(t.key);
  free(t.val);
  return (int64_t)total;
}

/* ---- metadata ------------------------------------------------------------------------------ */

int cm_corr_metadata_put(uint64_t id, const char *json, size_t len) {
  if (!json) return cm__seterr(CM_EINVAL, "cm_corr_metadata_put: json is NULL");
  if (len > CM_CORR_MAX_JSON)
    return cm__seterr(CM_EINVAL, "metadata blob of %zu bytes exceeds %d", len, CM_CORR_MAX_JSON);
  if (id == 0) id = cm_corr_current();
  if (id == 0) return cm__seterr(CM_ENOENT, "no id given and no correlation id is pushed");
  int rc = 0;
  cm__json *v = cm__json_parse(json, len, &rc);
  if (!v) return rc;
  pthread_mutex_lock(&g.mu);
  hent *e = hfind(&g.meta, id);
  if (e) {
    e->val = cm__json_merge(e->val, v);
  } else if (!hinsert(&g.meta, id, v)) {
    rc = cm__seterr(CM_ENOMEM, "cannot grow the metadata table");
    cm__json_free(v);
  }
  pthread_mutex_unlock(&g.mu);
  return rc;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int cm_corr_metadata_take(char **json_out, size_t *len_out) {
  if (!json_out) return cm__seterr(CM_EINVAL, "cm_corr_metadata_take: json_out is NULL");
  *json_out = NULL;
  pthread_mutex_lock(&g.mu);
  hmap m = g.meta;
  memset(&g.meta, 0, sizeof g.meta);
  pthread_mutex_unlock(&g.mu);

  uint64_t *keys = m.n ? malloc(m.n * sizeof *keys) : NULL;
  cm__sbuf b = {0};
  if (m.n && !keys) b.oom = true;
  size_t nk = 0;
  for (size_t i = 0; keys && i < m.nb; i++)
    for (hent *e = m.b[i]; e; e = e->next) keys[nk++] = e->key;
  if (keys) qsort(keys, nk, sizeof *keys, cmp_u64);
  cm__sbuf_put(&b, "{", 1);
  for (size_t i = 0; i < nk; i++) {
    char num[32];
    int l = snprintf(num, sizeof num, "%s\"%llu\":", i ? "," : "", (unsigned long long)keys[i]);
    cm__sbuf_put(&b, num, (size_t)l);
    cm__json_write(&b, hfind(&m, keys[i])->val);
  }
  cm__sbuf_put(&b, "}", 1);
  free(keys);
  for (size_t i = 0; i < m.nb; i++)
    for (hent *e = m.b[i], *nx; e; e = nx) {
      nx = e->next;
      cm__json_free(e->val);
      free(e);
    }
  free(m.b);
  if (b.oom) {
    free(b.p);
    return cm__seterr(CM_ENOMEM, "out of memory serializing metadata (it is lost)");
  }
  *json_out = b.p;
  if (len_out) *len_out = b.n;
  return 0;
}

void cm_free(void *p) { free(p); }
