/*
 * process.c: what the script sees of each source's process: its table (the "process_start" and
 * "process_exit" hooks, cuptimon.sources()), its counters (cm.stats()) and its losses (cm.loss(),
 * the end-of-run loss line), kept for the sources that went away so that the sums cover the
 * whole run.
 *
 * Design note. A source describes its process through cm_process_info and its counters through
 * its stats and loss methods; this file turns them into Lua tables and sums. Every string a
 * process chose goes through cm_host_text first, so a table holds valid UTF-8 without control
 * characters (cm_host_text lives here for that reason; the Lua modules call it for string
 * columns too). The host (host.c) calls cm__process_push when it attaches or detaches a source,
 * and cm__process_gone before it frees one; this file calls no function of host.c, it reads the
 * host's fields and the sources' methods only.
 *
 * Ownership: the gone sources' counters (h->gone) and the text buffer (h->text_buf) live in the
 * host and are freed with it (state.c). Loop thread only.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lua.h>

#include "cuptimon.h"
#include "cuptimon_host.h"
#include "host_internal.h"

/* What source s lost; a source without a loss method lost what its stats call dropped. */
static void source_loss(cm_source *s, cm_loss *out) {
  memset(out, 0, sizeof *out);
  if (s->vt->loss && s->vt->loss(s, out) == 0) return;
  cm_stats st;
  memset(out, 0, sizeof *out);
  if (s->vt->stats(s, &st)) return;
  /* The in-process engine: what it decoded reached the script's process. */
  out->received = st.records_decoded;
  out->dropped = out->dropped_cupti = st.records_dropped;
  out->produced = out->received + out->dropped;
}

static void add_loss(cm_loss *sum, const cm_loss *l) {
  uint64_t last = sum->last_number > l->last_number ? sum->last_number : l->last_number;
  uint64_t *d = (uint64_t *)sum;
  const uint64_t *a = (const uint64_t *)l;
  for (size_t k = 0; k < sizeof *l / sizeof(uint64_t); k++) d[k] += a[k];
  sum->last_number = last;
}

void cm__process_push_loss(lua_State *L, const cm_loss *l) {
#define F_(name)                               \
  lua_pushnumber(L, (lua_Number)l->name);      \
  lua_setfield(L, -2, #name);
  F_(produced) F_(received) F_(dropped) F_(dropped_cupti) F_(dropped_agent) F_(dropped_exit)
  F_(lost_wire) F_(lost_frames) F_(incomplete) F_(last_number) F_(tail_unknown)
  F_(skipped_bytes)
#undef F_
}

void cm__process_gone(cm_host *h, cm_source *s) {
  if (h->ngone == h->cap_gone) {
    int cap = h->cap_gone ? h->cap_gone * 2 : 8;
    gone_source *p = realloc(h->gone, (size_t)cap * sizeof *p);
    if (!p) return; /* its counters leave the sums; nothing else depends on them */
    h->gone = p;
    h->cap_gone = cap;
  }
  gone_source *g = &h->gone[h->ngone];
  memset(g, 0, sizeof *g);
  g->id = s->id;
  g->pid = s->pid;
  if (s->vt->stats(s, &g->st)) memset(&g->st, 0, sizeof g->st);
  source_loss(s, &g->loss);
  h->ngone++;
}

const char *cm_host_text(cm_host *h, const char *s, size_t len, size_t *out_len) {
  if (!s) s = "", len = 0;
  if (cm__text_is_clean(s, len)) {
    if (out_len) *out_len = len;
    return s;
  }
  size_t need = 3 * len + 1;
  if (need > h->text_cap) {
    char *p = realloc(h->text_buf, need);
    if (!p) {
      if (out_len) *out_len = 0;
      return "";
    }
    h->text_buf = p;
    h->text_cap = need;
  }
  size_t n = cm__text_clean(s, len, h->text_buf, h->text_cap);
  if (out_len) *out_len = n;
  return h->text_buf;
}

/* Pushes an agent's or a capture's string as text (cm_host_text). */
static void push_text(cm_host *h, const char *s) {
  size_t n;
  const char *t = cm_host_text(h, s, s ? strlen(s) : 0, &n);
  lua_pushlstring(h->L, t, n);
}

void cm__process_push(cm_host *h, cm_source *s, int exiting) {
  lua_State *L = h->L;
  cm_process_info info;
  memset(&info, 0, sizeof info);
  if (s->vt->describe) s->vt->describe(s, &info, exiting);
  lua_createtable(L, 0, 8);
  lua_pushinteger(L, s->id);
  lua_setfield(L, -2, "source");
  lua_pushinteger(L, s->pid);
  lua_setfield(L, -2, "pid");
  lua_pushstring(L, s->vt->name);
  lua_setfield(L, -2, "kind");
  char hostname[256] = "";
  if (!info.host || !*info.host) {
    gethostname(hostname, sizeof hostname - 1);
    info.host = hostname;
  }
  push_text(h, info.host);
  lua_setfield(L, -2, "host");
  if (s->vt->describe) {
    if (info.has_ppid) {
      lua_pushinteger(L, (lua_Integer)info.ppid);
      lua_setfield(L, -2, "ppid");
    }
    if (info.exe) {
      push_text(h, info.exe);
      lua_setfield(L, -2, "exe");
    }
    if (info.has_cupti_version) {
      lua_pushinteger(L, (lua_Integer)info.cupti_version);
      lua_setfield(L, -2, "cupti_version");
    }
    lua_createtable(L, (int)info.argc, 0);
    for (uint32_t i = 0; i < info.argc; i++) {
      push_text(h, info.argv[i]);
      lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "argv");
    lua_createtable(L, (int)info.ndevices, 0);
    for (uint32_t i = 0; i < info.ndevices; i++) {
      lua_createtable(L, 0, 2);
      lua_pushinteger(L, (lua_Integer)info.devices[i].index);
      lua_setfield(L, -2, "index");
      push_text(h, info.devices[i].name);
      lua_setfield(L, -2, "name");
      lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "devices");
    lua_createtable(L, 0, (int)info.nenv);
    for (uint32_t i = 0; i < info.nenv; i++) {
      const char *eq = info.env[i] ? strchr(info.env[i], '=') : NULL;
      if (!eq || eq == info.env[i]) continue; /* not NAME=VALUE: skipped */
      size_t kn;
      const char *k = cm_host_text(h, info.env[i], (size_t)(eq - info.env[i]), &kn);
      lua_pushlstring(L, k, kn);
      push_text(h, eq + 1);
      lua_rawset(L, -3);
    }
    lua_setfield(L, -2, "env");
    if (info.status) {
      lua_pushstring(L, info.status);
      lua_setfield(L, -2, "status");
    }
    if (info.has_exit_code) {
      lua_pushinteger(L, info.exit_code);
      lua_setfield(L, -2, "exit_code");
    }
    if (info.message) {
      push_text(h, info.message);
      lua_setfield(L, -2, "message");
    }
    if (info.stats) {
      lua_createtable(L, 0, (int)info.nstats);
      for (uint32_t i = 0; i < info.nstats; i++) {
        push_text(h, info.stats[i].name);
        lua_pushnumber(L, (lua_Number)info.stats[i].value);
        lua_rawset(L, -3);
      }
      lua_setfield(L, -2, "stats");
    }
    if (info.has_dropped) {
      lua_pushnumber(L, (lua_Number)info.dropped);
      lua_setfield(L, -2, "dropped");
    }
  }
  if (exiting) {
    cm_loss l;
    source_loss(s, &l);
    cm__process_push_loss(L, &l);
  }
}

const char *cm_host_source_string(cm_host *h, int source, uint32_t id, size_t *len) {
  if (!h) return NULL;
  for (int i = 0; i < h->nsources; i++)
    if (h->sources[i]->id == source) return h->sources[i]->vt->string(h->sources[i], id, len);
  return NULL;
}

/* Adds one source's counters to a sum; the lags take the largest instead (a run is as far behind
 * as its slowest process). */
static void add_stats(cm_stats *sum, const cm_stats *one) {
  cm_stats keep = *sum;
  uint64_t *dst = (uint64_t *)sum;
  const uint64_t *src = (const uint64_t *)one;
  for (size_t k = 0; k < sizeof *one / sizeof(uint64_t); k++) dst[k] += src[k];
#define MAX_(f) sum->f = keep.f > one->f ? keep.f : one->f
  MAX_(lag_cupti_ns);
  MAX_(lag_decode_ns);
  MAX_(lag_decode_peak_ns);
  MAX_(decode_wait_ns);
  MAX_(lag_recv_ns);
  MAX_(lag_recv_peak_ns);
  MAX_(send_wait_ns);
  MAX_(send_wait_peak_ns);
  MAX_(guard_lag_ns);
  MAX_(lag_held_ns);
  MAX_(kind_change_max_ns);
  MAX_(cupti_idle_mode);
#undef MAX_
  sum->guard_shed = keep.guard_shed | one->guard_shed;
}

int cm_host_source_stats(cm_host *h, int source, cm_stats *out) {
  if (!h || !out) return CM_EINVAL;
  memset(out, 0, sizeof *out);
  int found = 0;
  for (int i = 0; i < h->nsources; i++) {
    cm_source *s = h->sources[i];
    if (source && s->id != source) continue;
    cm_stats one;
    if (s->vt->stats(s, &one)) continue;
    found = 1;
    add_stats(out, &one);
  }
  for (int i = 0; i < h->ngone; i++) {
    if (source && h->gone[i].id != source) continue;
    found = 1;
    /* A process that ended is behind by nothing any more; its peaks stay. */
    cm_stats g = h->gone[i].st;
    g.lag_cupti_ns = g.lag_decode_ns = g.decode_wait_ns = g.lag_recv_ns = g.send_wait_ns = 0;
    g.lag_held_ns = 0;
    g.backlog_records = 0;
    add_stats(out, &g);
  }
  return source && !found ? CM_ENOENT : 0;
}

int cm_host_source_loss_at(cm_host *h, int i, int *id, int *pid, cm_loss *out) {
  if (!h || !out || i < 0) return CM_EINVAL;
  if (i < h->nsources) {
    cm_source *s = h->sources[i];
    if (id) *id = s->id;
    if (pid) *pid = s->pid;
    source_loss(s, out);
    return 0;
  }
  i -= h->nsources;
  if (i >= h->ngone) return CM_ENOENT;
  if (id) *id = h->gone[i].id;
  if (pid) *pid = h->gone[i].pid;
  *out = h->gone[i].loss;
  return 0;
}

int cm_host_source_loss(cm_host *h, int source, cm_loss *out) {
  if (!h || !out) return CM_EINVAL;
  memset(out, 0, sizeof *out);
  int found = 0, id;
  cm_loss one;
  for (int i = 0; cm_host_source_loss_at(h, i, &id, NULL, &one) == 0; i++) {
    if (source && id != source) continue;
    found = 1;
    add_loss(out, &one);
  }
  return source && !found ? CM_ENOENT : 0;
}

