/*
 * wsrc.c: the wire source: one process seen through wire frames (a live agent or a process of a
 * capture), as a source of the host (see wsrc.h).
 *
 * Design note. A wire source keeps what its process's frames said (wsrc_frame.c reads them): the
 * schema, merged per kind with the latest winning, the string table, the HELLO (for the process
 * table) and the latest STATS. This file holds those tables and serves the host through the
 * source vtable: the observers and the union of their selections (sent to a live agent as a
 * SELECT when it changes), flushes, cadences and PM requests (handed to the owner), the process
 * table (describe), the stats and the loss.
 *
 * Bounded cost of hostile input. Every key a peer chooses (kind ids, string ids, counter names)
 * is looked up in an open-addressing hash table whose hash is seeded per source, so a frame
 * costs time linear in its size whatever keys it holds. The string table is sized by the
 * entries received, never by the ids (an id of 2^26 costs one slot, not 2^26), so its memory is
 * proportional to the bytes received. Distinct kinds and counter names are capped
 * (CM__WSRC_MAX_KINDS, CM__WSRC_MAX_STATS; fields per kind are capped at 128 by the wire);
 * beyond a cap the excess is refused, counted in `rejected`, and reported once per process,
 * and the stream goes on.
 *
 * Loss: the BATCH numbers received and the agent's STATS counts (records_queued ahead of each
 * STATS, records dropped by CUPTI, the agent and its exit) give what the process lost, in
 * records, and whether the counts are final (cm__wsrc_loss; docs/monitor.md, "Loss").
 *
 * Ownership: a wsrc owns its copies; the host owns the observers' selections until it calls
 * unobserve, which happens before the selection is freed. Loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wsrc_internal.h"

/* The string table starts at 2^STR_BITS_MIN slots and stops growing at 2^STR_BITS_MAX (16 GiB
 * of slots: never reached, since every entry arrived as at least 9 bytes of a frame). */
enum { STR_BITS_MIN = 8, STR_BITS_MAX = 30, INDEX_BITS_MIN = 4 };

/* ---- hashing ---------------------------------------------------------------------------------- */

/* A bijective 64-bit mixer (splitmix64's finalizer). */
static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/* The home slot of `key` in a table of 2^bits slots (1 <= bits <= 32). The seed makes the slots
 * a peer's keys land in unpredictable, so a crafted set of keys cannot pile up in one probe
 * sequence. */
static uint32_t home(uint64_t key, uint64_t seed, uint32_t bits) {
  return (uint32_t)(mix64(key ^ seed) >> (64 - bits));
}

uint64_t cm__wsrc_hash_str(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
}

static uint64_t seed_new(const void *p) {
  static uint64_t counter;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)p ^
               mix64(++counter));
}

/* Index tables map a key to 1 + its position in an array (0 marks an empty slot); the caller
 * compares keys. They are rebuilt from the array when they grow. */
static int index_grow(uint32_t **tab, uint32_t *bits, uint32_t n, uint64_t (*key)(const void *arr, uint32_t i),
                      const void *arr, uint64_t seed) {
  uint32_t nb = *bits ? *bits + 1 : INDEX_BITS_MIN;
  uint32_t *t = calloc((size_t)1 << nb, sizeof *t);
  if (!t) return CM_ENOMEM;
  uint32_t mask = (1u << nb) - 1;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t j = home(key(arr, i), seed, nb);
    while (t[j]) j = (j + 1) & mask;
    t[j] = i + 1;
  }
  free(*tab);
  *tab = t;
  *bits = nb;
  return 0;
}

static uint64_t kind_key(const void *arr, uint32_t i) { return ((const cm__wkind *)arr)[i].kind; }
static uint64_t stat_key(const void *arr, uint32_t i) { return cm__wsrc_hash_str(((const cm_wire_kv *)arr)[i].name); }

cm__wkind *cm__wsrc_kind_find(const cm__wsrc *w, uint32_t kind) {
  if (!w->kind_index) return NULL;
  uint32_t mask = (1u << w->kind_bits) - 1;
  for (uint32_t j = home(kind, w->seed, w->kind_bits); w->kind_index[j]; j = (j + 1) & mask)
    if (w->kinds[w->kind_index[j] - 1].kind == kind) return &w->kinds[w->kind_index[j] - 1];
  return NULL;
}

/* Adds a zeroed kind at the end; NULL when out of memory. The caller checks the cap. */
cm__wkind *cm__wsrc_kind_add(cm__wsrc *w, uint32_t kind) {
  if (w->nkinds == w->cap_kinds) {
    uint32_t cap = w->cap_kinds ? w->cap_kinds * 2 : 16;
    cm__wkind *p = realloc(w->kinds, cap * sizeof *p);
    if (!p) return NULL;
    w->kinds = p;
    w->cap_kinds = cap;
  }
  if (!w->kind_index || (w->nkinds + 1) * 2 > (1u << w->kind_bits)) {
    if (index_grow(&w->kind_index, &w->kind_bits, w->nkinds, kind_key, w->kinds, w->seed)) return NULL;
  }
  cm__wkind *k = &w->kinds[w->nkinds];
  memset(k, 0, sizeof *k);
  k->kind = kind;
  k->start = -1;
  uint32_t mask = (1u << w->kind_bits) - 1, j = home(kind, w->seed, w->kind_bits);
  while (w->kind_index[j]) j = (j + 1) & mask;
  w->kind_index[j] = ++w->nkinds;
  return k;
}

/* The index of counter `name` in w->stats, or -1. */
int64_t cm__wsrc_stat_find(const cm__wsrc *w, const char *name, uint64_t h) {
  if (!w->stat_index) return -1;
  uint32_t mask = (1u << w->stat_bits) - 1;
  for (uint32_t j = home(h, w->seed, w->stat_bits); w->stat_index[j]; j = (j + 1) & mask)
    if (strcmp(w->stats[w->stat_index[j] - 1].name, name) == 0) return w->stat_index[j] - 1;
  return -1;
}

/* Adds counter `name`; returns its index or -1 when out of memory. The caller checks the cap. */
int64_t cm__wsrc_stat_add(cm__wsrc *w, const char *name, uint64_t h) {
  if (w->nstats == w->cap_stats) {
    uint32_t cap = w->cap_stats ? w->cap_stats * 2 : 16;
    cm_wire_kv *p = realloc(w->stats, cap * sizeof *p);
    if (!p) return -1;
    w->stats = p;
    w->cap_stats = cap;
  }
  if (!w->stat_index || (w->nstats + 1) * 2 > (1u << w->stat_bits)) {
    if (index_grow(&w->stat_index, &w->stat_bits, w->nstats, stat_key, w->stats, w->seed)) return -1;
  }
  char *copy = xstrdup(name);
  if (!copy) return -1;
  uint32_t i = w->nstats++;
  w->stats[i].name = copy;
  w->stats[i].value = 0;
  uint32_t mask = (1u << w->stat_bits) - 1, j = home(h, w->seed, w->stat_bits);
  while (w->stat_index[j]) j = (j + 1) & mask;
  w->stat_index[j] = i + 1;
  return i;
}

cm__wstr *cm__wsrc_str_find(const cm__wsrc *w, uint32_t id) {
  if (!w->str || id == 0) return NULL;
  uint32_t mask = (1u << w->str_bits) - 1;
  for (uint32_t j = home(id, w->seed, w->str_bits); w->str[j].id; j = (j + 1) & mask)
    if (w->str[j].id == id) return &w->str[j];
  return NULL;
}

/* The slot for a new id (id != 0, not present), growing the table to stay at most half full;
 * NULL when out of memory or at the size limit. */
cm__wstr *cm__wsrc_str_slot_new(cm__wsrc *w, uint32_t id) {
  if (!w->str || (uint64_t)(w->nstr + 1) * 2 > ((uint64_t)1 << w->str_bits)) {
    uint32_t nb = w->str ? w->str_bits + 1 : STR_BITS_MIN;
    if (nb > STR_BITS_MAX) return NULL;
    cm__wstr *t = calloc((size_t)1 << nb, sizeof *t);
    if (!t) return NULL;
    uint32_t mask = (1u << nb) - 1;
    for (uint64_t i = 0; w->str && i < ((uint64_t)1 << w->str_bits); i++) {
      if (!w->str[i].id) continue;
      uint32_t j = home(w->str[i].id, w->seed, nb);
      while (t[j].id) j = (j + 1) & mask;
      t[j] = w->str[i];
    }
    free(w->str);
    w->str = t;
    w->str_bits = nb;
  }
  uint32_t mask = (1u << w->str_bits) - 1, j = home(id, w->seed, w->str_bits);
  while (w->str[j].id) j = (j + 1) & mask;
  return &w->str[j];
}

/* ---- the source vtable ---------------------------------------------------------------------------- */

/* Sends the union of the observers' selections to the process when it changed. */
static void publish_union(cm__wsrc *w) {
  char *u = cm__wsrc_union(w);
  if (u && (!w->union_spec || strcmp(u, w->union_spec) != 0)) {
    free(w->union_spec);
    w->union_spec = u;
    w->ops->select(w, u);
  } else {
    free(u);
  }
}

static int ws_observe(cm_source *s, uint32_t obs, const cm_selection *sel, const char *spec) {
  (void)spec;
  cm__wsrc *w = (cm__wsrc *)s;
  if (w->nobs == w->cap_obs) {
    int cap = w->cap_obs ? w->cap_obs * 2 : 8;
    cm__wobs *p = realloc(w->obs, (size_t)cap * sizeof *p);
    if (!p) return CM_ENOMEM;
    w->obs = p;
    w->cap_obs = cap;
  }
  w->obs[w->nobs].id = obs;
  w->obs[w->nobs].sel = sel;
  w->obs[w->nobs].retired = 0;
  w->nobs++;
  if (w->ops->select) publish_union(w);
  return 0;
}

static int ws_retire(cm_source *s, uint32_t obs) {
  cm__wsrc *w = (cm__wsrc *)s;
  for (int i = 0; i < w->nobs; i++) {
    if (w->obs[i].id != obs) continue;
    w->obs[i].retired = 1;
    if (w->ops->select && w->attached) publish_union(w);
    return 0;
  }
  return CM_ENOENT;
}

static int ws_unobserve(cm_source *s, uint32_t obs) {
  cm__wsrc *w = (cm__wsrc *)s;
  for (int i = 0; i < w->nobs; i++) {
    if (w->obs[i].id != obs) continue;
    memmove(&w->obs[i], &w->obs[i + 1], (size_t)(w->nobs - i - 1) * sizeof w->obs[0]);
    w->nobs--;
    if (w->ops->select && w->attached) publish_union(w);
    return 0;
  }
  return CM_ENOENT;
}

int cm__wsrc_write_state(const cm__wsrc *w, cm_wire_buf *b) {
  int rc = 0;
  if (w->nkinds) {
    cm_wire_kind *ks = calloc(w->nkinds, sizeof *ks);
    if (!ks) return CM_ENOMEM;
    for (uint32_t i = 0; i < w->nkinds; i++)
      ks[i] = (cm_wire_kind){.kind = w->kinds[i].kind, .nfields = w->kinds[i].nfields,
                             .name = w->kinds[i].name, .fields = w->kinds[i].fields};
    cm_wire_schema sc = {.nkinds = w->nkinds, .kinds = ks};
    rc = cm_wire_write_schema(b, &sc);
    free(ks);
  }
  if (!rc && w->nstr) {
    cm_wire_string *es = calloc(w->nstr, sizeof *es);
    if (!es) return CM_ENOMEM;
    uint32_t n = 0;
    for (uint64_t i = 0; i < ((uint64_t)1 << w->str_bits) && n < w->nstr; i++)
      if (w->str[i].id) es[n++] = (cm_wire_string){w->str[i].id, w->str[i].len, w->str[i].bytes};
    rc = cm_wire_write_strings(b, es, n);
    free(es);
  }
  return rc;
}

void cm__wsrc_set_shed(cm__wsrc *w, uint64_t kinds) {
  w->shed = kinds;
  if (w->ops->select && w->attached) publish_union(w);
}

static int ws_flush(cm_source *s, int mode, uint32_t timeout_ms, cm_source_done_fn done, void *ud) {
  cm__wsrc *w = (cm__wsrc *)s;
  if (w->ops->flush) return w->ops->flush(w, mode, timeout_ms, done, ud);
  if (done) done(ud, 0);
  return 0;
}

static int ws_configure(cm_source *s, uint32_t flush_ms, uint32_t deliver_ms) {
  cm__wsrc *w = (cm__wsrc *)s;
  if (w->ops->configure) w->ops->configure(w, flush_ms, deliver_ms);
  return 0;
}

static const struct {
  const char *name;
  size_t off;
} stat_map[] = {
    {"buffers_allocated", offsetof(cm_stats, buffers_allocated)},
    {"buffers_outstanding", offsetof(cm_stats, buffers_outstanding)},
    {"buffers_free", offsetof(cm_stats, buffers_free)},
    {"buffers_decoded", offsetof(cm_stats, buffers_decoded)},
    {"buffers_refused", offsetof(cm_stats, buffers_refused)},
    {"records_decoded", offsetof(cm_stats, records_decoded)},
    {"records_dropped", offsetof(cm_stats, records_dropped)},
    {"lag_cupti_ns", offsetof(cm_stats, lag_cupti_ns)},
    {"lag_decode_ns", offsetof(cm_stats, lag_decode_ns)},
    {"lag_decode_peak_ns", offsetof(cm_stats, lag_decode_peak_ns)},
    {"decode_wait_ns", offsetof(cm_stats, decode_wait_ns)},
    {"send_wait_ns", offsetof(cm_stats, send_wait_ns)},
    {"send_wait_peak_ns", offsetof(cm_stats, send_wait_peak_ns)},
    {"guard_shed", offsetof(cm_stats, guard_shed)},
    {"guard_lag_ns", offsetof(cm_stats, guard_lag_ns)},
    {"lag_held_ns", offsetof(cm_stats, lag_held_ns)},
    {"cupti_detaches", offsetof(cm_stats, cupti_detaches)},
    {"cupti_detach_ns", offsetof(cm_stats, cupti_detach_ns)},
    {"cupti_attach_ns", offsetof(cm_stats, cupti_attach_ns)},
    {"kind_changes", offsetof(cm_stats, kind_changes)},
    {"kind_change_ns", offsetof(cm_stats, kind_change_ns)},
    {"kind_change_max_ns", offsetof(cm_stats, kind_change_max_ns)},
    {"cupti_idle_mode", offsetof(cm_stats, cupti_idle_mode)},
};

static int ws_stats(cm_source *s, cm_stats *out) {
  cm__wsrc *w = (cm__wsrc *)s;
  memset(out, 0, sizeof *out);
  for (size_t i = 0; i < sizeof stat_map / sizeof stat_map[0]; i++)
    *(uint64_t *)((char *)out + stat_map[i].off) = cm__wsrc_stat(w, stat_map[i].name);
  /* Every record the process lost, wherever: CUPTI, the agent, its exit, the wire. */
  cm_loss l;
  cm__wsrc_loss(w, &l);
  out->records_dropped = l.dropped;
  /* What reached the monitor is counted here, whatever the agent says it sent. */
  out->records_delivered = w->records;
  out->strings = w->nstr;
  memcpy(out->records_by_kind, w->records_by_kind, sizeof out->records_by_kind);
  /* The agent's send queue at its last STATS: records queued so far less those it had sent. */
  uint64_t queued = cm__wsrc_stat(w, "records_queued"), sent = cm__wsrc_stat(w, "records_sent");
  out->backlog_records = queued > sent ? queued - sent : 0;
  out->lag_recv_ns = w->lag_ns;
  out->lag_recv_peak_ns = w->lag_peak_ns;
  return 0;
}

static const char *ws_string(cm_source *s, uint32_t id, size_t *len) {
  cm__wsrc *w = (cm__wsrc *)s;
  if (id == 0) {
    if (len) *len = 0;
    return "";
  }
  const cm__wstr *e = cm__wsrc_str_find(w, id);
  if (!e) return NULL;
  if (len) *len = e->len;
  return e->bytes;
}

static void ws_free(cm_source *s) {
  cm__wsrc *w = (cm__wsrc *)s;
  w->attached = 0;
  w->nobs = 0;
  if (w->ops->detached) w->ops->detached(w);
}

static const char *end_name(int end) {
  switch (end) {
  case CM__END_BYE: return "exit";
  case CM__END_EOF: return "disconnected";
  case CM__END_ERROR: return "error";
  case CM__END_TIMEOUT: return "timeout";
  case CM__END_DETACHED: return "detached";
  default: return "running";
  }
}

/* The process table's facts, from the HELLO and, at the end, the latest STATS. The device and
 * counter arrays are rebuilt in the wsrc's own scratch arrays, which live until the next describe
 * or the release; when they cannot be allocated the table goes without them. */
static void ws_describe(cm_source *s, cm_process_info *out, int exiting) {
  cm__wsrc *w = (cm__wsrc *)s;
  if (w->have_hello) {
    out->has_ppid = 1;
    out->ppid = w->ppid;
    out->host = w->host;
    out->exe = w->exe;
    out->has_cupti_version = 1;
    out->cupti_version = w->cupti_version;
  }
  out->argv = (const char *const *)w->argv;
  out->argc = w->argc;
  out->env = (const char *const *)w->env;
  out->nenv = w->nenv;
  free(w->desc_devices);
  w->desc_devices = w->ndevices ? calloc(w->ndevices, sizeof *w->desc_devices) : NULL;
  if (w->desc_devices) {
    for (uint32_t i = 0; i < w->ndevices; i++) {
      w->desc_devices[i].index = w->dev_index[i];
      w->desc_devices[i].name = w->dev_names[i];
    }
    out->devices = w->desc_devices;
    out->ndevices = w->ndevices;
  }
  if (!exiting) return;
  out->status = end_name(w->end);
  if (w->end == CM__END_BYE || w->exit_known) {
    out->has_exit_code = 1;
    out->exit_code = w->exit_code;
  }
  out->message = w->end_message ? w->end_message : "";
  free(w->desc_stats);
  w->desc_stats = calloc((size_t)w->nstats + 2, sizeof *w->desc_stats);
  if (w->desc_stats) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < w->nstats; i++)
      w->desc_stats[n++] = (cm_process_counter){w->stats[i].name, w->stats[i].value};
    w->desc_stats[n++] = (cm_process_counter){"batches_received", w->batches};
    w->desc_stats[n++] = (cm_process_counter){"records_received", w->records};
    out->stats = w->desc_stats;
    out->nstats = n;
  }
  /* dropped and the other loss fields are set by the host (the source's loss method). */
}

static int ws_loss(cm_source *s, cm_loss *out) {
  cm__wsrc_loss((cm__wsrc *)s, out);
  return 0;
}

/* Keeps the request and hands it to the owner, which sends it (a live agent answers each entry
 * with PM_STATUS later: see on_pm_status). */
static int ws_pm(cm_source *s, const char *spec, char *err, size_t errlen) {
  cm__wsrc *w = (cm__wsrc *)s;
  char *copy = xstrdup(spec);
  if (!copy) {
    snprintf(err, errlen, "no memory for the PM request");
    return CM_ENOMEM;
  }
  free(w->pm_spec);
  w->pm_spec = copy;
  if (w->ops->pm) {
    /* The agent answers each entry (';'-separated) with one PM_STATUS, or the whole request
     * with one refusal: that many answers are due, and any beyond them are ignored. */
    uint32_t n = *copy ? 1 : 0;
    for (const char *p = copy; *p; p++) n += *p == ';';
    w->pm_expect += n;
    w->ops->pm(w, copy);
  }
  return 0;
}

static const cm_source_vtable agent_vt = {
    .name = "agent", .observe = ws_observe, .unobserve = ws_unobserve, .retire = ws_retire, .flush = ws_flush,
    .configure = ws_configure, .stats = ws_stats, .string = ws_string, .free = ws_free,
    .describe = ws_describe, .loss = ws_loss, .pm = ws_pm,
};
static const cm_source_vtable replay_vt = {
    .name = "replay", .observe = ws_observe, .unobserve = ws_unobserve, .flush = ws_flush,
    .configure = ws_configure, .stats = ws_stats, .string = ws_string, .free = ws_free,
    .describe = ws_describe, .loss = ws_loss,
};

/* ---- the source's life ---------------------------------------------------------------------------- */

void cm__wsrc_init(cm__wsrc *w, const cm__wsrc_ops *ops, void *owner, const char *origin) {
  w->base.vt = strcmp(origin, "replay") == 0 ? &replay_vt : &agent_vt;
  w->ops = ops;
  w->owner = owner;
  w->origin = origin;
  w->exit_code = -1;
  w->seed = seed_new(w);
}

int cm__wsrc_attach(cm__wsrc *w, cm_host *h) {
  w->base.pid = (int)w->pid;
  w->attached = 1;
  int rc = cm_host_add_source(h, &w->base);
  if (rc < 0) w->attached = 0;
  return rc < 0 ? rc : 0;
}

void cm__wsrc_detach(cm__wsrc *w) {
  if (w->attached) cm_host_remove_source(w->base.host, &w->base);
}

void cm__wsrc_free_hello(cm__wsrc *w) {
  free(w->host);
  free(w->exe);
  for (uint32_t i = 0; i < w->argc; i++) free(w->argv[i]);
  free(w->argv);
  for (uint32_t i = 0; i < w->ndevices; i++) free(w->dev_names[i]);
  free(w->dev_names);
  free(w->dev_index);
  for (uint32_t i = 0; i < w->nenv; i++) free(w->env[i]);
  free(w->env);
  w->host = w->exe = NULL;
  w->argv = w->dev_names = w->env = NULL;
  w->dev_index = NULL;
  w->argc = w->ndevices = w->nenv = 0;
}

void cm__wsrc_free_kind(cm__wkind *k) {
  for (uint32_t i = 0; i < k->nfields; i++) free((void *)k->fields[i].name);
  free(k->fields);
  free(k->name);
  memset(k, 0, sizeof *k);
}

/* ---- what the process reported ------------------------------------------------------------------ */

void cm__wsrc_loss(const cm__wsrc *w, cm_loss *out) {
  memset(out, 0, sizeof *out);
  out->received = w->records;
  out->dropped_cupti = cm__wsrc_stat(w, "records_dropped");
  out->dropped_agent = cm__wsrc_stat(w, "records_dropped_agent");
  out->dropped_exit = cm__wsrc_stat(w, "records_dropped_exit");
  /* Up to the latest STATS the agent's own counts say exactly what the wire lost; after it, only
   * the gaps in the BATCH numbers tell, and not how many records those frames held. */
  uint64_t gaps_after = w->gap_frames;
  if (w->have_queued) {
    uint64_t q = cm__wsrc_stat(w, "records_queued"), qb = cm__wsrc_stat(w, "batches_queued");
    out->lost_wire = q > w->recv_at_stats ? q - w->recv_at_stats : 0;
    out->lost_frames = qb > w->batches_at_stats ? qb - w->batches_at_stats : 0;
    gaps_after -= w->gaps_at_stats;
  }
  out->lost_frames += gaps_after;
  out->dropped = out->dropped_cupti + out->dropped_agent + out->dropped_exit + out->lost_wire;
  out->produced = out->received + out->dropped;
  /* A process still running is not incomplete yet; one that ended without BYE (killed, cut off,
   * a corrupt or truncated stream) never sent its final counts. */
  out->tail_unknown = cm__wsrc_stat(w, "exit_tail_unknown") != 0;
  out->incomplete = (w->end != CM__END_NONE && w->end != CM__END_BYE &&
                     w->end != CM__END_DETACHED) || gaps_after > 0 || out->tail_unknown ||
                    w->skipped_bytes > 0;
  out->last_number = w->last_number;
  out->skipped_bytes = w->skipped_bytes;
}

uint64_t cm__wsrc_stat(const cm__wsrc *w, const char *name) {
  int64_t i = cm__wsrc_stat_find(w, name, cm__wsrc_hash_str(name));
  return i < 0 ? 0 : w->stats[i].value;
}

/* Appends to a growable string; returns 0 or -1 on allocation failure. */
static int sb_add(char **s, size_t *len, size_t *cap, const char *t) {
  size_t n = strlen(t);
  if (*len + n + 1 > *cap) {
    size_t c = *cap ? *cap * 2 : 256;
    while (c < *len + n + 1) c *= 2;
    char *p = realloc(*s, c);
    if (!p) return -1;
    *s = p;
    *cap = c;
  }
  memcpy(*s + *len, t, n + 1);
  *len += n;
  return 0;
}

char *cm__wsrc_union(cm__wsrc *w) {
  char *s = NULL;
  size_t len = 0, cap = 0;
  if (sb_add(&s, &len, &cap, "")) return NULL;
  for (int ki = 0; ki < cm_kind_count(); ki++) {
    int kind = cm_kind_at(ki);
    if (kind >= 0 && kind < CM_KIND_MAX && (w->shed >> kind & 1)) continue; /* shed by a budget */
    int nf = cm_field_count(kind);
    int first = 1;
    for (int fid = 0; fid < nf; fid++) {
      int has = w->extra && cm_selection_has(w->extra, kind, fid);
      for (int i = 0; i < w->nobs && !has; i++)
        has = !w->obs[i].retired && cm_selection_has(w->obs[i].sel, kind, fid);
      if (!has) continue;
      cm_field_info fi;
      if (cm_field_info_get(kind, fid, &fi)) continue;
      if (first) {
        if (len) sb_add(&s, &len, &cap, ";");
        sb_add(&s, &len, &cap, cm_kind_name(kind));
        sb_add(&s, &len, &cap, ":");
        first = 0;
      } else {
        sb_add(&s, &len, &cap, ",");
      }
      if (sb_add(&s, &len, &cap, fi.name)) {
        free(s);
        return NULL;
      }
    }
  }
  return s;
}

void cm__wsrc_release(cm__wsrc *w) {
  cm__wsrc_free_hello(w);
  for (uint32_t i = 0; i < w->nkinds; i++) cm__wsrc_free_kind(&w->kinds[i]);
  free(w->kinds);
  free(w->kind_index);
  for (uint64_t i = 0; w->str && i < ((uint64_t)1 << w->str_bits); i++) free(w->str[i].bytes);
  free(w->str);
  for (uint32_t i = 0; i < w->nstats; i++) free((void *)w->stats[i].name);
  free(w->stats);
  free(w->stat_index);
  free(w->end_message);
  free(w->obs);
  free(w->union_spec);
  free(w->pm_spec);
  free(w->desc_devices);
  free(w->desc_stats);
  w->desc_devices = NULL;
  w->desc_stats = NULL;
  w->kinds = NULL;
  w->kind_index = NULL;
  w->str = NULL;
  w->stats = NULL;
  w->stat_index = NULL;
  w->obs = NULL;
  w->nkinds = w->cap_kinds = w->kind_bits = 0;
  w->nstr = w->str_bits = 0;
  w->nstats = w->cap_stats = w->stat_bits = 0;
  w->nobs = 0;
}
