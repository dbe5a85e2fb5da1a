/*
 * host.c: the Lua host. It owns one lua_State with luv on the embedder's libuv loop, the script's
 * observers and the sources that feed them. It is the only file that includes lua.h: the sources
 * (inproc.c, hub_source.c) describe their processes through cm_process_info.
 *
 * Design. Batches enter Lua through one door, cm_host_deliver(): it pushes the `const cm_batch *`
 * as a light userdata with the source and observer ids and calls the dispatcher that
 * lua/cuptimon/init.lua registered, under lua_pcall with a traceback handler. The Lua side casts
 * the pointer with the FFI and reads the columns in place, so a batch costs one Lua call whatever
 * its size. Everything that may deliver batches (cm_observe, cm_unobserve, cm_flush,
 * cm_engine_free) is reached from a lua_CFunction of the `cuptimon.core` module or from a uv
 * callback, never through the FFI, because LuaJIT cannot re-enter Lua from an FFI call.
 *
 * The host keeps the observers (id, selection) itself and applies each one to every source, so a
 * source attached later (a live agent connecting, a replay) gets the current selections. The
 * in-process source (inproc.c) runs the engine with deliver_ms = 0 and batch_records = 0: the
 * decode worker never delivers, and deliveries happen on the loop thread inside the calls above.
 * A delivery on any other thread would be a bug; it is dropped and counted, never run.
 * Subscriber callbacks (cm.on_api) come the same way: apicb.c queues them on the application
 * threads and wakes the loop, and the "api" event hands them to Lua on the loop thread.
 *
 * Ownership. The host owns the lua_State, the observer table and the attached sources; it does
 * not own the loop. All functions run on the loop thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <luv/luv.h>
#include <luv/lhandle.h>
#include <uv.h>

#include "cuptimon.h"
#include "cuptimon_host.h"
#include "apicb.h"
#include "host_internal.h"

/* The Lua modules embedded at build time (a generated file, lua/CMakeLists.txt). */
typedef struct cm__lua_module {
  const char *name;  /* "cuptimon", "cuptimon.agg", ... */
  const char *file;  /* "cuptimon/init.lua", for chunk names */
  const unsigned char *src;
  size_t len;
} cm__lua_module;
extern const cm__lua_module cm__lua_modules[];

#define CM__HOST_MAX_SOURCES 256

/* A source that went away: its last counters, so that cm.stats() and the end-of-run loss line
 * cover the whole run, not only the processes still attached. */
typedef struct gone_source {
  int id, pid;
  cm_stats st;
  cm_loss loss;
} gone_source;

typedef struct host_observer {
  uint32_t id;
  cm_selection *sel;
  char *spec;
  int source; /* 0: every source; else only this source (a trigger window's observer) */
} host_observer;

struct cm_host {
  uv_loop_t *loop;
  lua_State *L;
  luv_ctx_t *luv_ctx; /* identifies luv's handles on the shared loop */
  uint32_t flags;
  pthread_t thread; /* the loop thread: the one that created the host */

  int dispatch_ref; /* Lua function(batch_ptr, source_id, observer_id) */
  int event_ref;    /* Lua function(event, ...) */

  host_observer *obs;
  int nobs, cap_obs;
  char *pm_spec; /* the script's PM sampling request (core.pm), applied to every source */
  uint32_t next_obs;

  cm_source *sources[CM__HOST_MAX_SOURCES];
  int nsources;
  int next_source;
  gone_source *gone;     /* sources removed so far, in order */
  int ngone, cap_gone;
  int inproc_failed; /* the in-process source could not be created; err holds why */
  int inproc_err;

  int in_dispatch;       /* depth of cm_host_deliver calls */
  uint64_t errors;       /* errors raised by the script and its callbacks, all reported */
  int in_report;         /* report() is running the script's "error" hooks */
  uint64_t foreign;      /* deliveries refused because they came from another thread */
  uint32_t flush_ms, deliver_ms;
  const cm__live_ops *live; /* the hub's operations on live agents (host_internal.h), or NULL */

  uv_timer_t defer_timer; /* runs deferred requests on the next iteration */
  uv_timer_t exit_timer;  /* runs a requested shutdown on the next iteration */
  int timers_closed;
  int exit_requested, exit_status, shut_down;
  char *text_buf;         /* cm_host_text's cleaned copy */
  size_t text_cap;
};

/* ---- reporting ------------------------------------------------------------------------------- */

static const char *host_key = "cuptimon.host";

static cm_host *host_of(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, host_key);
  cm_host *h = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return h;
}

/* Whether the value at `idx` is an exit request raised by the script: a table whose field
 * exit_status is a number (cuptimon.args raises one for --help and usage errors). Reads the
 * table raw, so no metamethod runs. */
static int is_exit_request(lua_State *L, int idx) {
  if (!lua_istable(L, idx)) return 0;
  lua_pushstring(L, "exit_status");
  lua_rawget(L, idx < 0 ? idx - 1 : idx);
  int yes = lua_type(L, -1) == LUA_TNUMBER;
  lua_pop(L, 1);
  return yes;
}

/* The message handler of every call into Lua: the error message plus a traceback. An exit
 * request passes through unchanged, for run_chunk. */
static int msgh(lua_State *L) {
  if (is_exit_request(L, 1)) return 1;
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* The one reporting function of the host: every failure of the script goes through it, whether
 * raised in the main chunk, an observer, a timer or other luv callback, an event hook, a deferred
 * call or an exit hook (lua/cuptimon/init.lua hands the failures it catches itself over through
 * core.report). It reports the error message on top of the stack (and pops it): it counts the
 * error (cm_host_error_count, which makes cuptimon-lua's exit status non-zero), then hands it to
 * the script's "error" hooks when it has any, else prints it on stderr. An error raised while the
 * error hooks run is counted and printed, never handed to the hooks again (no recursion). Never
 * raises. */
static void take_exit_request(cm_host *h);

static void report(cm_host *h, const char *where) {
  lua_State *L = h->L;
  /* An exit request (cuptimon.args's, which a recipe raises to stop with a message and a status)
   * is not an error object: its message is printed as it is and its status becomes the run's,
   * wherever it was raised (an observer, a hook, a timer), as when the main chunk raises it. */
  if (is_exit_request(L, -1)) {
    take_exit_request(h);
    return;
  }
  h->errors++;
  const char *msg = lua_tostring(L, -1);
  if (!msg) msg = "(error object is not a string)";
  int handled = 0;
  if (h->event_ref != LUA_NOREF && !h->in_report) {
    h->in_report = 1;
    lua_pushcfunction(L, msgh);
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->event_ref);
    lua_pushstring(L, "error");
    lua_pushstring(L, msg);
    lua_pushstring(L, where);
    if (lua_pcall(L, 3, 1, -5) == 0) {
      handled = lua_toboolean(L, -1);
    } else {
      h->errors++;
      fprintf(stderr, "cuptimon: error in the error hook: %s\n", lua_tostring(L, -1));
    }
    lua_pop(L, 2);
    h->in_report = 0;
  }
  if (!handled) {
    /* The traceback runs through cuptimon's own modules: only --verbose shows it. */
    const char *tb = (h->flags & CM_HOST_VERBOSE) ? NULL : strstr(msg, "\nstack traceback:");
    int len = tb ? (int)(tb - msg) : (int)strlen(msg);
    fprintf(stderr, "cuptimon: error in %s: %.*s%s\n", where, len, msg,
            tb ? " (--verbose shows the traceback)" : "");
  }
  lua_pop(L, 1);
}

void cm__host_error(cm_host *h, const char *where, const char *msg) {
  lua_pushstring(h->L, msg);
  report(h, where);
}

int cm__host_in_dispatch(const cm_host *h) { return h->in_dispatch > 0; }

int cm__host_inproc_error(const cm_host *h) { return h->inproc_failed ? h->inproc_err : 0; }

int cm__host_observer_bound(const cm_host *h, uint32_t id) {
  for (int i = 0; i < h->nobs; i++)
    if (h->obs[i].id == id) return h->obs[i].source != 0;
  return 0;
}

void cm__host_cadence(const cm_host *h, uint32_t *flush_ms, uint32_t *deliver_ms) {
  *flush_ms = h->flush_ms;
  *deliver_ms = h->deliver_ms;
}

/* Calls the script's event function with `nargs` arguments already pushed. */
static void fire_event(cm_host *h, const char *event, int nargs) {
  lua_State *L = h->L;
  if (h->event_ref == LUA_NOREF) {
    lua_pop(L, nargs);
    return;
  }
  lua_pushcfunction(L, msgh);
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->event_ref);
  lua_pushstring(L, event);
  /* Move the handler, function and name below the arguments. */
  for (int i = 0; i < 3; i++) lua_insert(L, -(nargs + 3));
  int base = lua_gettop(L) - nargs - 2;
  if (lua_pcall(L, nargs + 1, 0, base)) report(h, event);
  lua_remove(L, base);
}

/* luv's callbacks run through this instead of luv's default, which exits the process on error. */
static int luv_pcall(lua_State *L, int nargs, int nresults, int flags) {
  int fn = lua_gettop(L) - nargs;
  lua_pushcfunction(L, msgh);
  lua_insert(L, fn);
  int ret = lua_pcall(L, nargs, nresults, fn);
  if (ret) {
    cm_host *h = host_of(L);
    lua_remove(L, fn);
    if (h) report(h, "luv callback");
    else lua_pop(L, 1);
    return -ret;
  }
  lua_remove(L, fn);
  if (nresults == LUA_MULTRET) return lua_gettop(L) - fn + 1;
  return nresults;
}

/* ---- observers and sources ---------------------------------------------------------------------- */

static int find_obs(cm_host *h, uint32_t id) {
  for (int i = 0; i < h->nobs; i++)
    if (h->obs[i].id == id) return i;
  return -1;
}

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

/* Sets the loss fields on the table on top of L's stack (the process table, or cm.stats()). */
static void push_loss_fields(lua_State *L, const cm_loss *l) {
#define F_(name)                               \
  lua_pushnumber(L, (lua_Number)l->name);      \
  lua_setfield(L, -2, #name);
  F_(produced) F_(received) F_(dropped) F_(dropped_cupti) F_(dropped_agent) F_(dropped_exit)
  F_(lost_wire) F_(lost_frames) F_(incomplete) F_(last_number) F_(tail_unknown)
  F_(skipped_bytes)
#undef F_
}

static void remember_gone(cm_host *h, cm_source *s) {
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

/* Pushes the process table of source `s`: source, pid and kind, then what the source's describe
 * filled in (host, ppid, exe, argv, devices, env; status and stats at exit). The same shape for every
 * kind of source, so a script never needs to know where its batches come from. */
static void push_text(cm_host *h, const char *s);

static void push_process(cm_host *h, cm_source *s, int exiting) {
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
    push_loss_fields(L, &l);
  }
}

static int ensure_inproc(cm_host *h) {
  if (h->flags & (CM_HOST_CHECK | CM_HOST_NO_INPROC)) return 0;
  for (int i = 0; i < h->nsources; i++)
    if (strcmp(h->sources[i]->vt->name, "inproc") == 0) return 0;
  if (h->inproc_failed) return h->inproc_err;
  cm_source *s;
  int rc = cm_host_inproc_source_new(h, &s);
  if (rc) {
    h->inproc_failed = 1;
    h->inproc_err = rc;
    return rc;
  }
  rc = cm_host_add_source(h, s);
  return rc < 0 ? rc : 0;
}

int cm_host_add_source(cm_host *h, cm_source *s) {
  if (!h || !s || !s->vt) return CM_EINVAL;
  if (h->nsources == CM__HOST_MAX_SOURCES) return CM_ERANGE;
  s->host = h;
  s->id = ++h->next_source;
  h->sources[h->nsources++] = s;
  if (h->flush_ms || h->deliver_ms) s->vt->configure(s, h->flush_ms, h->deliver_ms);
  for (int i = 0; i < h->nobs; i++) {
    if (h->obs[i].source) continue; /* bound to another source */
    int rc = s->vt->observe(s, h->obs[i].id, h->obs[i].sel, h->obs[i].spec);
    if (rc) {
      lua_pushfstring(h->L, "source %d (%s) refused observer %d: %s", s->id, s->vt->name,
                      (int)h->obs[i].id, cm_errmsg());
      report(h, "add_source");
    }
  }
  if (h->pm_spec && *h->pm_spec && s->vt->pm) {
    char err[4096] = "";
    int rc = s->vt->pm(s, h->pm_spec, err, sizeof err);
    if (rc) {
      lua_pushfstring(h->L, "PM sampling in source %d (%s): %s", s->id, s->vt->name, err);
      report(h, "pm_sample");
    }
  }
  push_process(h, s, 0);
  fire_event(h, "process_start", 1);
  return s->id;
}

void cm_host_remove_source(cm_host *h, cm_source *s) {
  if (!h || !s) return;
  int idx = -1;
  for (int i = 0; i < h->nsources; i++)
    if (h->sources[i] == s) idx = i;
  if (idx < 0) return;
  for (int i = 0; i < h->nobs; i++) s->vt->unobserve(s, h->obs[i].id);
  memmove(&h->sources[idx], &h->sources[idx + 1],
          (size_t)(h->nsources - idx - 1) * sizeof h->sources[0]);
  h->nsources--;
  remember_gone(h, s);
  push_process(h, s, 1);
  s->vt->free(s);
  fire_event(h, "process_exit", 1);
}

void cm_host_deliver(cm_host *h, cm_source *s, uint32_t obs, const cm_batch *b) {
  if (!pthread_equal(pthread_self(), h->thread)) {
    h->foreign++; /* Not atomic on purpose: this is a bug counter, read in tests. */
    return;
  }
  if (h->dispatch_ref == LUA_NOREF || find_obs(h, obs) < 0) return;
  lua_State *L = h->L;
  int top = lua_gettop(L);
  lua_pushcfunction(L, msgh);
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->dispatch_ref);
  lua_pushlightuserdata(L, (void *)b);
  lua_pushinteger(L, s->id);
  lua_pushinteger(L, (lua_Integer)obs);
  h->in_dispatch++;
  if (lua_pcall(L, 3, 0, top + 1)) report(h, "observer callback");
  h->in_dispatch--;
  lua_settop(L, top);
}

int cm_host_each_observer(cm_host *h,
                          int (*fn)(void *ud, uint32_t id, const cm_selection *sel, const char *spec),
                          void *ud) {
  if (!h || !fn) return CM_EINVAL;
  for (int i = 0; i < h->nobs; i++) {
    if (h->obs[i].source) continue; /* bound to one source: never part of a new one's answer */
    int rc = fn(ud, h->obs[i].id, h->obs[i].sel, h->obs[i].spec);
    if (rc) return rc;
  }
  return 0;
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

/* ---- the cuptimon.core module (lua_CFunctions) -------------------------------------------------- */

static cm_host *core_host(lua_State *L) {
  cm_host *h = host_of(L);
  if (!h) luaL_error(L, "cuptimon.core used outside a cuptimon host");
  return h;
}

/* Pushes nil, "ENAME: detail" and "ENAME", luv's shape for runtime failures; returns 3. */
static int push_fail(lua_State *L, int err, const char *detail) {
  lua_pushnil(L);
  if (detail && *detail)
    lua_pushfstring(L, "%s: %s", cm_err_name(err), detail);
  else
    lua_pushfstring(L, "%s: %s", cm_err_name(err), cm_strerror(err));
  lua_pushstring(L, cm_err_name(err));
  return 3;
}

static int core_register(lua_State *L) {
  cm_host *h = core_host(L);
  luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  luaL_unref(L, LUA_REGISTRYINDEX, h->dispatch_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, h->event_ref);
  lua_pushvalue(L, 2);
  h->event_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, 1);
  h->dispatch_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

static int core_host_ptr(lua_State *L) {
  lua_pushlightuserdata(L, core_host(L));
  return 1;
}

/* core.pm(spec): replaces the PM sampling of every source, now and attached later, with `spec`
 * (lua/cuptimon/init.lua builds it from the script's cm.pm_sample requests). Returns true, or
 * nil, err naming the first source that refused (the others keep the new request). */
static int core_pm(lua_State *L) {
  cm_host *h = core_host(L);
  const char *spec = luaL_checkstring(L, 1);
  /* The in-process engine first, so that attaching it does not apply the new request twice. */
  if (*spec && !(h->flags & CM_HOST_CHECK)) {
    int rc = ensure_inproc(h);
    if (rc) return push_fail(L, rc, "cannot start the in-process engine (is CUPTI available? set "
                                    "CUPTIMON_LIBCUPTI): see the log above");
  }
  char *copy = strdup(spec);
  if (!copy) return push_fail(L, CM_ENOMEM, "no memory for the PM request");
  free(h->pm_spec);
  h->pm_spec = copy;
  if (h->flags & CM_HOST_CHECK) {
    lua_pushboolean(L, 1);
    return 1;
  }
  int first = 0;
  char first_err[4200] = "";
  for (int i = 0; i < h->nsources; i++) {
    cm_source *s = h->sources[i];
    if (!s->vt->pm) continue;
    char err[4096] = "";
    int rc = s->vt->pm(s, spec, err, sizeof err);
    if (rc && !first) {
      first = rc;
      snprintf(first_err, sizeof first_err, "source %d (%s): %s", s->id, s->vt->name, err);
    }
  }
  if (first) return push_fail(L, first, first_err);
  lua_pushboolean(L, 1);
  return 1;
}

/* The source with id `id`, or NULL. */
static cm_source *find_source(cm_host *h, int id) {
  for (int i = 0; i < h->nsources; i++)
    if (h->sources[i]->id == id) return h->sources[i];
  return NULL;
}

/* observe(spec[, source]) -> id | nil, err, name. The Lua side has already validated the
 * selection. With `source`, the observer applies to that source only (a trigger window's). */
static int core_observe(lua_State *L) {
  cm_host *h = core_host(L);
  const char *spec = luaL_checkstring(L, 1);
  int only = (int)luaL_optinteger(L, 2, 0);
  if (only && !(h->flags & CM_HOST_CHECK) && !find_source(h, only))
    return push_fail(L, CM_ENOENT, "no such source (the process has ended)");
  cm_selection *sel;
  int rc = cm_selection_new(&sel);
  if (rc) return push_fail(L, rc, cm_errmsg());
  rc = cm_selection_parse(sel, spec);
  if (rc) {
    cm_selection_free(sel);
    return push_fail(L, rc, cm_errmsg());
  }
  if (h->flags & CM_HOST_CHECK) {
    cm_selection_free(sel);
    lua_pushinteger(L, (lua_Integer)++h->next_obs);
    return 1;
  }
  rc = ensure_inproc(h);
  if (rc) {
    cm_selection_free(sel);
    return push_fail(L, rc, "cannot start the in-process engine (is CUPTI available? set "
                            "CUPTIMON_LIBCUPTI): see the log above");
  }
  if (h->nobs == h->cap_obs) {
    int cap = h->cap_obs ? h->cap_obs * 2 : 8;
    host_observer *p = realloc(h->obs, (size_t)cap * sizeof *p);
    if (!p) {
      cm_selection_free(sel);
      return push_fail(L, CM_ENOMEM, "observer table");
    }
    h->obs = p;
    h->cap_obs = cap;
  }
  host_observer *o = &h->obs[h->nobs++];
  o->id = ++h->next_obs;
  o->sel = sel;
  o->spec = strdup(spec);
  o->source = only;
  for (int i = 0; i < h->nsources; i++) {
    cm_source *s = h->sources[i];
    if (only && s->id != only) continue;
    rc = s->vt->observe(s, o->id, sel, spec);
    if (rc) {
      char detail[512];
      snprintf(detail, sizeof detail, "%s", cm_errmsg());
      for (int j = 0; j < i; j++)
        if (!only) h->sources[j]->vt->unobserve(h->sources[j], o->id);
      o = &h->obs[h->nobs - 1]; /* a delivery above cannot grow the table, but be exact */
      cm_selection_free(o->sel);
      free(o->spec);
      h->nobs--;
      return push_fail(L, rc, detail);
    }
  }
  lua_pushinteger(L, (lua_Integer)o->id);
  return 1;
}

static int core_unobserve(lua_State *L) {
  cm_host *h = core_host(L);
  uint32_t id = (uint32_t)luaL_checkinteger(L, 1);
  int idx = find_obs(h, id);
  if (idx < 0) return push_fail(L, CM_ENOENT, "no such observer");
  for (int i = 0; i < h->nsources; i++) h->sources[i]->vt->unobserve(h->sources[i], id);
  idx = find_obs(h, id);
  cm_selection_free(h->obs[idx].sel);
  free(h->obs[idx].spec);
  memmove(&h->obs[idx], &h->obs[idx + 1], (size_t)(h->nobs - idx - 1) * sizeof h->obs[0]);
  h->nobs--;
  lua_pushboolean(L, 1);
  return 1;
}

/* retire(id) -> true: observer id stops counting in what the sources trace but still receives
 * what arrives, until unobserve (a window's closing). Sources without retire keep tracing it. */
static int core_retire(lua_State *L) {
  cm_host *h = core_host(L);
  uint32_t id = (uint32_t)luaL_checkinteger(L, 1);
  if (find_obs(h, id) < 0) return push_fail(L, CM_ENOENT, "no such observer");
  for (int i = 0; i < h->nsources; i++)
    if (h->sources[i]->vt->retire) h->sources[i]->vt->retire(h->sources[i], id);
  lua_pushboolean(L, 1);
  return 1;
}

typedef struct flush_wait {
  cm_host *h;
  int token;
  int pending;
  int status;
} flush_wait;

static void flush_one_done(void *ud, int status) {
  flush_wait *w = ud;
  if (status && !w->status) w->status = status;
  if (--w->pending > 0) return;
  cm_host *h = w->h;
  if (w->token) {
    lua_pushinteger(h->L, w->token);
    if (w->status) {
      lua_pushfstring(h->L, "%s: %s", cm_err_name(w->status), cm_strerror(w->status));
    } else {
      lua_pushnil(h->L);
    }
    fire_event(h, "flush_done", 2);
  }
  free(w);
}

void cm__host_set_live_ops(cm_host *h, const cm__live_ops *ops) {
  if (h) h->live = ops;
}

/* The source `id` as a live agent for a live operation, or NULL after pushing nil, err, name. */
static cm_source *live_source(lua_State *L, cm_host *h, int id, int *nret) {
  cm_source *s = find_source(h, id);
  if (!s) *nret = push_fail(L, CM_ENOENT, "no such source (the process has ended)");
  else if (!h->live) *nret = push_fail(L, CM_ESTATE, "only live processes (`-- cmd`) can be reconfigured");
  return *nret ? NULL : s;
}

/* nil, err, name for a live operation that failed with `rc`. */
static int live_fail(lua_State *L, int rc) {
  const char *detail = rc == CM_ESTATE  ? "the source is not a live agent (a replay, or the process ended)"
                       : rc == CM_EBUSY ? "a trigger window is already open in this process"
                       : rc == CM_EIO   ? "cannot create the capture (see the message above)"
                                        : NULL;
  return push_fail(L, rc, detail);
}

/* shed(source, kinds_mask_low32, kinds_mask_high32) -> true | nil, err, name. */
static int core_shed(lua_State *L) {
  cm_host *h = core_host(L);
  int nret = 0;
  cm_source *s = live_source(L, h, (int)luaL_checkinteger(L, 1), &nret);
  if (!s) return nret;
  uint64_t mask = (uint64_t)(uint32_t)luaL_checkinteger(L, 2) |
                  (uint64_t)(uint32_t)luaL_checkinteger(L, 3) << 32;
  int rc = h->live->shed(s, mask);
  if (rc) return live_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

typedef struct window_wait {
  cm_host *h;
  int token;
} window_wait;

/* A window closed: the "window_done" event gets its token and a table of what it held. */
static void window_one_done(void *ud, const cm__window_result *r) {
  window_wait *w = ud;
  cm_host *h = w->h;
  lua_State *L = h->L;
  lua_pushinteger(L, w->token);
  lua_createtable(L, 0, 8);
  if (r->status) {
    lua_pushfstring(L, "%s: %s", cm_err_name(r->status), cm_strerror(r->status));
    lua_setfield(L, -2, "error");
  }
  if (r->path) {
    lua_pushstring(L, r->path);
    lua_setfield(L, -2, "file");
  }
  lua_pushnumber(L, (lua_Number)r->records);
  lua_setfield(L, -2, "records");
  lua_pushnumber(L, (lua_Number)r->batches);
  lua_setfield(L, -2, "batches");
  lua_pushnumber(L, (lua_Number)r->dropped);
  lua_setfield(L, -2, "dropped");
  lua_newtable(L);
  for (int k = 0; k < CM_KIND_MAX; k++) {
    if (!r->by_kind[k]) continue;
    lua_pushnumber(L, (lua_Number)r->by_kind[k]);
    lua_rawseti(L, -2, k);
  }
  lua_setfield(L, -2, "by_kind");
  if (r->open_ns) {
    lua_pushnumber(L, (lua_Number)(r->end_ns > r->open_ns ? r->end_ns - r->open_ns : 0) / 1e6);
    lua_setfield(L, -2, "monitor_ms");
  }
  if (r->agent_ns) {
    lua_pushnumber(L, (lua_Number)r->agent_ns / 1e6);
    lua_setfield(L, -2, "agent_ms");
  }
  free(w);
  fire_event(h, "window_done", 2);
}

/* window_begin(source, path|nil, force, token) -> true | nil, err, name. */
static int core_window_begin(lua_State *L) {
  cm_host *h = core_host(L);
  int nret = 0;
  cm_source *s = live_source(L, h, (int)luaL_checkinteger(L, 1), &nret);
  if (!s) return nret;
  const char *path = luaL_optstring(L, 2, NULL);
  int force = lua_toboolean(L, 3);
  window_wait *w = calloc(1, sizeof *w);
  if (!w) return push_fail(L, CM_ENOMEM, NULL);
  w->h = h;
  w->token = (int)luaL_checkinteger(L, 4);
  int rc = h->live->window_begin(s, path, force, window_one_done, w);
  if (rc) {
    free(w);
    return live_fail(L, rc);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* window_end(source) -> true | nil, err, name. */
static int core_window_end(lua_State *L) {
  cm_host *h = core_host(L);
  int nret = 0;
  cm_source *s = live_source(L, h, (int)luaL_checkinteger(L, 1), &nret);
  if (!s) return nret;
  int rc = h->live->window_end(s);
  if (rc) return live_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* flush(sync, timeout_ms, token) -> true | nil, err. Runs the sources' flushes; the "flush_done"
 * event with `token` fires when every source has delivered its window. */
static int core_flush(lua_State *L) {
  cm_host *h = core_host(L);
  int mode = lua_toboolean(L, 1) ? CM_FLUSH_SYNC : CM_FLUSH_PLAIN;
  uint32_t timeout = (uint32_t)luaL_optinteger(L, 2, 0);
  int token = (int)luaL_optinteger(L, 3, 0);
  if (h->in_dispatch) return push_fail(L, CM_ESTATE, "flush inside an observer callback");
  flush_wait *w = calloc(1, sizeof *w);
  if (!w) return push_fail(L, CM_ENOMEM, NULL);
  w->h = h;
  w->token = token;
  w->pending = 1; /* held until every source has been asked */
  int first_err = 0;
  char detail[256] = "";
  for (int i = 0; i < h->nsources; i++) {
    w->pending++;
    int rc = h->sources[i]->vt->flush(h->sources[i], mode, timeout, flush_one_done, w);
    if (rc && !first_err) {
      first_err = rc;
      snprintf(detail, sizeof detail, "%s", cm_errmsg());
    }
  }
  flush_one_done(w, 0);
  if (first_err) return push_fail(L, first_err, detail);
  lua_pushboolean(L, 1);
  return 1;
}

static int core_configure(lua_State *L) {
  cm_host *h = core_host(L);
  uint32_t flush_ms = (uint32_t)luaL_optinteger(L, 1, 0);
  uint32_t deliver_ms = (uint32_t)luaL_optinteger(L, 2, 0);
  if (flush_ms) h->flush_ms = flush_ms;
  if (deliver_ms) h->deliver_ms = deliver_ms;
  for (int i = 0; i < h->nsources; i++) {
    int rc = h->sources[i]->vt->configure(h->sources[i], flush_ms, deliver_ms);
    if (rc) return push_fail(L, rc, cm_errmsg());
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int core_in_dispatch(lua_State *L) {
  lua_pushboolean(L, core_host(L)->in_dispatch > 0);
  return 1;
}

static void defer_cb(uv_timer_t *t) {
  cm_host *h = t->data;
  fire_event(h, "deferred", 0);
}

/* Runs the deferred calls still pending, at shutdown. The defer timer does not keep the loop
 * alive, so without this they would run after the exit hooks and the exit status (or never),
 * and a failure among them would go unreported. */
static void run_deferred_now(cm_host *h) {
  if (!uv_is_active((uv_handle_t *)&h->defer_timer)) return;
  uv_timer_stop(&h->defer_timer);
  fire_event(h, "deferred", 0);
}

/* defer(): fires the "deferred" event on the next loop iteration. */
static int core_defer(lua_State *L) {
  cm_host *h = core_host(L);
  uv_timer_start(&h->defer_timer, defer_cb, 0, 0);
  return 0;
}

static int core_exit(lua_State *L) {
  cm_host *h = core_host(L);
  int status = (int)luaL_optinteger(L, 1, 0);
  h->exit_requested = 1;
  h->exit_status = status;
  cm_host_request_exit(h, status);
  return 0;
}

/* live_mode() -> true when the run takes live agents (`-- cmd`, --attach), so that a duty cycle
 * waits for processes; false under --replay, the in-process engine and --check. */
static int core_live_mode(lua_State *L) {
  cm_host *h = core_host(L);
  lua_pushboolean(L, h->live && h->live->agents && h->live->agents());
  return 1;
}

/* command_failed() -> true when the run's command (`-- cmd`) could not be started: the monitor
 * printed the one-line error, and the script's exit hooks have nothing to report. */
static int core_command_failed(lua_State *L) {
  cm_host *h = core_host(L);
  lua_pushboolean(L, h->live && h->live->command_failed && h->live->command_failed());
  return 1;
}

static int core_check_mode(lua_State *L) {
  lua_pushboolean(L, (core_host(L)->flags & CM_HOST_CHECK) != 0);
  return 1;
}

static int core_sources(lua_State *L) {
  cm_host *h = core_host(L);
  lua_createtable(L, h->nsources, 0);
  for (int i = 0; i < h->nsources; i++) {
    push_process(h, h->sources[i], 0);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* report(msg, where): hands a failure the Lua side caught itself (a hook, a deferred call) to
 * report(), so it is counted and reaches the "error" hooks like any other. */
static int core_report(lua_State *L) {
  cm_host *h = core_host(L);
  const char *where = luaL_optstring(L, 2, "script");
  lua_settop(L, 2);
  if (!lua_isstring(L, 1) && !is_exit_request(L, 1)) {
    lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    lua_replace(L, 1);
  }
  lua_pushvalue(L, 1);
  report(h, where);
  return 0;
}

/* loss([source]) -> a table of what the source (or, for 0 or none, every source of the run)
 * lost: the cm_loss fields; nil, "ENOENT" for an unknown source. */
static int core_loss(lua_State *L) {
  cm_host *h = core_host(L);
  cm_loss l;
  if (cm_host_source_loss(h, (int)luaL_optinteger(L, 1, 0), &l) != 0) {
    lua_pushnil(L);
    lua_pushstring(L, "ENOENT");
    return 2;
  }
  lua_createtable(L, 0, 10);
  push_loss_fields(L, &l);
  return 1;
}

/* errors() -> the number of reported errors, deliveries refused from foreign threads. */
static int core_errors(lua_State *L) {
  cm_host *h = core_host(L);
  lua_pushnumber(L, (lua_Number)h->errors);
  lua_pushnumber(L, (lua_Number)h->foreign);
  return 2;
}

/* os.exit replacement: a script (or busted) that exits still gets its exit hooks and a clean
 * engine shutdown, except inside an observer callback, where the engine's locks are held. */
static int core_os_exit(lua_State *L) {
  cm_host *h = core_host(L);
  int status;
  if (lua_isboolean(L, 1))
    status = lua_toboolean(L, 1) ? 0 : 1;
  else
    status = (int)luaL_optinteger(L, 1, 0);
  fflush(stdout);
  if (!h->in_dispatch) {
    h->exit_status = status;
    h->exit_requested = 1;
    cm_host_shutdown(h);
  }
  fflush(stdout);
  fflush(stderr);
  exit(status);
  return 0;
}

/* libstdc++'s demangler. Linked from the static archive, it pulls in no other part of the C++
 * runtime, so the binary's dependencies do not change. */
char *__cxa_demangle(const char *mangled, char *buf, size_t *n, int *status);

/* core.demangle(name): the demangled form of a C++ (Itanium ABI) symbol, or `name` itself when it
 * is not mangled or does not demangle. Kernel names from CUPTI are mangled. */
static int core_demangle(lua_State *L) {
  size_t len = 0;
  const char *s = luaL_checklstring(L, 1, &len);
  lua_settop(L, 1);
  if (len < 3 || s[0] != '_' || s[1] != 'Z') return 1;
  int status = 0;
  char *d = __cxa_demangle(s, NULL, NULL, &status);
  if (status == 0 && d) lua_pushstring(L, d);
  free(d);
  return 1;
}

/* ---- subscriber callbacks (apicb.c) ---------------------------------------------------------- */

void cm__host_api_ready(cm_host *h) {
  if (h->shut_down) return;
  fire_event(h, "api", 0);
}

/* The in-process source's subscriber-callback queue, or NULL (pushing nil, err, name: the
 * caller returns 3) when there is none: the script monitors other processes only. */
static cm__apicb *host_apicb(lua_State *L, cm_host *h) {
  int rc = ensure_inproc(h);
  if (rc) {
    push_fail(L, rc, "cannot start the in-process engine (is CUPTI available? set "
                     "CUPTIMON_LIBCUPTI): see the log above");
    return NULL;
  }
  for (int i = 0; i < h->nsources; i++) {
    cm__apicb *q = cm__inproc_apicb(h->sources[i]);
    if (q) return q;
  }
  lua_pushnil(L);
  lua_pushstring(L, "ENOTSUP: API callbacks need the in-process engine (a script run without "
                    "'-- cmd' or --replay); the traced processes of a hub are remote");
  lua_pushstring(L, "ENOTSUP");
  return NULL;
}

/* api_add(domain, cbid, sites) -> subscription id | nil, err, name. */
static int core_api_add(lua_State *L) {
  cm_host *h = core_host(L);
  int domain = (int)luaL_checkinteger(L, 1);
  uint32_t cbid = (uint32_t)luaL_checkinteger(L, 2);
  unsigned sites = (unsigned)luaL_checkinteger(L, 3);
  cm__apicb *q = host_apicb(L, h);
  if (!q) return 3;
  uint32_t id;
  int rc = cm__apicb_add(q, domain, cbid, sites, &id);
  if (rc) return push_fail(L, rc, cm_errmsg());
  lua_pushinteger(L, (lua_Integer)id);
  return 1;
}

/* api_remove(id) -> true | nil, err, name. */
static int core_api_remove(lua_State *L) {
  cm_host *h = core_host(L);
  uint32_t id = (uint32_t)luaL_checkinteger(L, 1);
  cm__apicb *q = host_apicb(L, h);
  if (!q) return 3;
  int rc = cm__apicb_remove(q, id);
  if (rc) return push_fail(L, rc, NULL);
  lua_pushboolean(L, 1);
  return 1;
}

/* api_take() -> { {sub, domain, cbid, site, correlation, tid, time}, ... } (the queued events,
 * oldest first, at most one queue's worth), queued, dropped; nil when there is no in-process
 * engine. */
static int core_api_take(lua_State *L) {
  cm_host *h = core_host(L);
  cm__apicb *q = NULL;
  for (int i = 0; i < h->nsources && !q; i++) q = cm__inproc_apicb(h->sources[i]);
  if (!q) return 0;
  /* In chunks, and at most one queue's worth per call, so producers that keep pushing cannot
   * hold the loop here. */
  cm__api_event buf[256];
  lua_createtable(L, 256, 0);
  int at = 0;
  for (uint32_t total = 0; total < CM__APICB_CAPACITY;) {
    uint32_t n = cm__apicb_take(q, buf, 256);
    for (uint32_t i = 0; i < n; i++) {
      const cm__api_event *ev = &buf[i];
      lua_createtable(L, 0, 7);
      lua_pushinteger(L, (lua_Integer)ev->sub);
      lua_setfield(L, -2, "sub");
      lua_pushinteger(L, ev->domain);
      lua_setfield(L, -2, "domain");
      lua_pushinteger(L, (lua_Integer)ev->cbid);
      lua_setfield(L, -2, "cbid");
      lua_pushstring(L, ev->site == CM__APICB_EXIT ? "exit" : "enter");
      lua_setfield(L, -2, "site");
      lua_pushnumber(L, (lua_Number)ev->correlation);
      lua_setfield(L, -2, "correlation");
      lua_pushnumber(L, (lua_Number)ev->tid);
      lua_setfield(L, -2, "tid");
      lua_pushnumber(L, (lua_Number)ev->time_ns);
      lua_setfield(L, -2, "time");
      lua_rawseti(L, -2, ++at);
    }
    total += n;
    if (n < 256) break;
  }
  uint64_t queued, dropped;
  cm__apicb_counts(q, &queued, &dropped, NULL);
  lua_pushnumber(L, (lua_Number)queued);
  lua_pushnumber(L, (lua_Number)dropped);
  return 3;
}

static const luaL_Reg core_funcs[] = {
    {"api_add", core_api_add},
    {"api_remove", core_api_remove},
    {"api_take", core_api_take},
    {"register", core_register},
    {"demangle", core_demangle},
    {"host", core_host_ptr},
    {"observe", core_observe},
    {"pm", core_pm},
    {"unobserve", core_unobserve},
    {"retire", core_retire},
    {"shed", core_shed},
    {"window_begin", core_window_begin},
    {"window_end", core_window_end},
    {"flush", core_flush},
    {"configure", core_configure},
    {"in_dispatch", core_in_dispatch},
    {"defer", core_defer},
    {"exit", core_exit},
    {"check_mode", core_check_mode},
    {"live_mode", core_live_mode},
    {"command_failed", core_command_failed},
    {"sources", core_sources},
    {"loss", core_loss},
    {"errors", core_errors},
    {"report", core_report},
    {NULL, NULL},
};

static int luaopen_core(lua_State *L) {
  lua_newtable(L);
  luaL_register(L, NULL, core_funcs);
  return 1;
}

/* ---- the host ------------------------------------------------------------------------------------ */

static int load_embedded(lua_State *L) {
  const cm__lua_module *m = lua_touserdata(L, lua_upvalueindex(1));
  char chunk[256];
  snprintf(chunk, sizeof chunk, "@%s", m->file);
  if (luaL_loadbuffer(L, (const char *)m->src, m->len, chunk)) return lua_error(L);
  lua_pushstring(L, m->name);
  lua_call(L, 1, 1);
  return 1;
}

static int luaopen_luv_on_host(lua_State *L) {
  /* luv_set_loop must come before luaopen_luv, so luv adopts the host's loop. */
  cm_host *h = host_of(L);
  luv_set_loop(L, h->loop);
  int n = luaopen_luv(L);
  luv_set_callback(L, luv_pcall);
  h->luv_ctx = luv_context(L);
  return n;
}

static int host_init(lua_State *L) {
  cm_host *h = lua_touserdata(L, 1);
  luaL_openlibs(L);
  lua_pushlightuserdata(L, h);
  lua_setfield(L, LUA_REGISTRYINDEX, host_key);

  /* luv, eagerly, so package.loaded.luv is the host's loop even before a script asks. */
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  lua_pushcfunction(L, luaopen_luv_on_host);
  lua_call(L, 0, 1);
  lua_setfield(L, -2, "luv");
  lua_pop(L, 1);

  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_core);
  lua_setfield(L, -2, "cuptimon.core");
  const char *path = lua_tostring(L, 2);
  if (!path) {
    for (const cm__lua_module *m = cm__lua_modules; m->name; m++) {
      lua_pushlightuserdata(L, (void *)m);
      lua_pushcclosure(L, load_embedded, 1);
      lua_setfield(L, -2, m->name);
    }
  }
  lua_pop(L, 1);
  if (path) {
    lua_getfield(L, -1, "path");
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", path, path, lua_tostring(L, -1));
    lua_setfield(L, -3, "path");
    lua_pop(L, 1);
  }
  lua_pop(L, 1);

  /* os.exit runs the shutdown first. */
  lua_getglobal(L, "os");
  lua_pushcfunction(L, core_os_exit);
  lua_setfield(L, -2, "exit");
  lua_pop(L, 1);

  /* --check: the script's calls that write, bind or start something do nothing
   * (lua/cuptimon/check.lua says which). */
  if (h->flags & CM_HOST_CHECK) {
    lua_getglobal(L, "require");
    lua_pushstring(L, "cuptimon.check");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, "install");
    lua_call(L, 0, 0);
    lua_pop(L, 1);
  }
  return 0;
}

int cm_host_new(cm_host **out, uv_loop_t *loop, const cm_host_options *opts) {
  if (!out) return CM_EINVAL;
  *out = NULL;
  if (!loop) return CM_EINVAL;
  cm_host *h = calloc(1, sizeof *h);
  if (!h) return CM_ENOMEM;
  h->loop = loop;
  h->thread = pthread_self();
  h->flags = opts ? opts->flags : 0;
  h->dispatch_ref = h->event_ref = LUA_NOREF;
  h->L = luaL_newstate();
  if (!h->L) {
    free(h);
    return CM_ENOMEM;
  }
  const char *path = opts && opts->lua_path ? opts->lua_path : getenv("CUPTIMON_LUA_PATH");
  if (path && !*path) path = NULL;
  lua_pushcfunction(h->L, host_init);
  lua_pushlightuserdata(h->L, h);
  if (path) lua_pushstring(h->L, path);
  else lua_pushnil(h->L);
  if (lua_pcall(h->L, 2, 0, 0)) {
    fprintf(stderr, "cuptimon: cannot initialize Lua: %s\n", lua_tostring(h->L, -1));
    lua_close(h->L);
    free(h);
    return CM_ENOMEM;
  }
  uv_timer_init(loop, &h->defer_timer);
  uv_timer_init(loop, &h->exit_timer);
  h->defer_timer.data = h->exit_timer.data = h;
  uv_unref((uv_handle_t *)&h->defer_timer);
  uv_unref((uv_handle_t *)&h->exit_timer);
  *out = h;
  return 0;
}

lua_State *cm_host_lua(cm_host *h) { return h ? h->L : NULL; }
uv_loop_t *cm_host_loop(cm_host *h) { return h ? h->loop : NULL; }
uint64_t cm_host_error_count(cm_host *h) { return h ? h->errors : 0; }

int cm_host_exit_requested(cm_host *h, int *status) {
  if (status) *status = h->exit_status;
  return h->exit_requested;
}

/* Takes the exit request on top of the stack (and pops it): prints its message on stderr, when
 * it has one, and requests the exit with its status. Not an error: nothing is counted. */
static void take_exit_request(cm_host *h) {
  lua_State *L = h->L;
  lua_getfield(L, -1, "exit_status");
  int status = (int)lua_tointeger(L, -1);
  lua_getfield(L, -2, "message");
  if (lua_type(L, -1) == LUA_TSTRING) fprintf(stderr, "%s\n", lua_tostring(L, -1));
  lua_pop(L, 3);
  fflush(stdout);
  cm_host_request_exit(h, status);
}

/* Runs the function below its `nargs` arguments on the stack; reports an error through report().
 * An exit request raised by the chunk (cuptimon.args after --help) requests the exit instead and
 * is not a failure. */
static int run_chunk(cm_host *h, int nargs) {
  lua_State *L = h->L;
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, msgh);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, 0, base);
  if (rc && is_exit_request(L, -1)) {
    take_exit_request(h);
    rc = 0;
  } else if (rc) {
    report(h, "the script");
  }
  lua_remove(L, base);
  return rc ? CM_EINVAL : 0;
}

int cm_host_run_script(cm_host *h, const char *path, int argc, char **argv) {
  if (!h || !path) return CM_EINVAL;
  lua_State *L = h->L;
  lua_createtable(L, argc, 1);
  lua_pushstring(L, path);
  lua_rawseti(L, -2, 0);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setglobal(L, "arg");
  if (luaL_loadfile(L, path)) {
    report(h, "loading the script");
    return CM_EINVAL;
  }
  for (int i = 0; i < argc; i++) lua_pushstring(L, argv[i]);
  return run_chunk(h, argc);
}

int cm_host_eval(cm_host *h, const char *chunk, const char *name) {
  if (!h || !chunk) return CM_EINVAL;
  lua_State *L = h->L;
  if (luaL_loadbuffer(L, chunk, strlen(chunk), name ? name : "=(command line)")) {
    report(h, "loading the script");
    return CM_EINVAL;
  }
  return run_chunk(h, 0);
}

static void flush_sync_done(void *ud, int status) { (void)ud, (void)status; }

int cm_host_shutdown(cm_host *h) {
  if (!h) return 0;
  if (h->shut_down) return h->exit_status;
  h->shut_down = 1;
  /* The last window first, so the exit hooks see every record. */
  /* A --check run traced nothing, so it has no window to close and no exit hooks to run: they
   * would print reports of an empty run. */
  if (!(h->flags & CM_HOST_CHECK)) {
    run_deferred_now(h);
    for (int i = 0; i < h->nsources; i++)
      h->sources[i]->vt->flush(h->sources[i], CM_FLUSH_SYNC, 0, flush_sync_done, NULL);
    /* The final window's observers may have deferred requests (a flush with a done callback,
     * say): they run before the exit hooks too. */
    run_deferred_now(h);
    fire_event(h, "exit", 0);
  }
  while (h->nsources) cm_host_remove_source(h, h->sources[h->nsources - 1]);
  for (int i = 0; i < h->nobs; i++) {
    cm_selection_free(h->obs[i].sel);
    free(h->obs[i].spec);
  }
  h->nobs = 0;
  uv_stop(h->loop);
  return h->exit_status;
}

static void exit_cb(uv_timer_t *t) {
  cm_host *h = t->data;
  if (h->flags & CM_HOST_STOP_ON_EXIT) {
    uv_unref((uv_handle_t *)&h->exit_timer);
    uv_stop(h->loop);
    return;
  }
  cm_host_shutdown(h);
}

void cm_host_request_exit(cm_host *h, int status) {
  if (!h) return;
  if (!h->exit_requested) {
    h->exit_requested = 1;
    h->exit_status = status;
  }
  /* Referenced, so the loop turns once more even if nothing else is alive. */
  uv_ref((uv_handle_t *)&h->exit_timer);
  uv_timer_start(&h->exit_timer, exit_cb, 0, 0);
}

/* Collects the userdata of the script's luv handles that are still open. A handle belongs to
 * this state's luv when its data is a luv_handle_t with our luv context; the loop is shared, so
 * the embedder's handles are left alone (those with NULL data are skipped outright). */
static void collect_luv(uv_handle_t *hd, void *arg) {
  cm_host *h = arg;
  if (uv_is_closing(hd) || !hd->data || hd == (uv_handle_t *)&h->defer_timer ||
      hd == (uv_handle_t *)&h->exit_timer)
    return;
  luv_handle_t *d = hd->data;
  if (d->ctx != h->luv_ctx || d->ref == LUA_NOREF || d->ref == LUA_REFNIL) return;
  lua_rawgeti(h->L, LUA_REGISTRYINDEX, d->ref);
  lua_rawseti(h->L, -2, (int)lua_objlen(h->L, -2) + 1);
}

static const char close_luv_handles[] =
    "for _, hd in ipairs(...) do if not hd:is_closing() then hd:close() end end";

void cm_host_free(cm_host *h) {
  if (!h) return;
  cm_host_shutdown(h);
  /* luv's close callbacks use the lua_State, so the script's handles are closed, and their
   * callbacks run, before the state goes away. */
  lua_State *L = h->L;
  if (luaL_loadstring(L, close_luv_handles) == 0) {
    lua_newtable(L);
    uv_walk(h->loop, collect_luv, h);
    if (lua_pcall(L, 1, 0, 0)) lua_pop(L, 1);
  } else {
    lua_pop(L, 1);
  }
  /* Twice: the first run may only clear a pending uv_stop() (shutdown stops the loop) without
   * running the close callbacks. */
  uv_run(h->loop, UV_RUN_NOWAIT);
  uv_run(h->loop, UV_RUN_NOWAIT);
  luaL_unref(h->L, LUA_REGISTRYINDEX, h->dispatch_ref);
  luaL_unref(h->L, LUA_REGISTRYINDEX, h->event_ref);
  h->dispatch_ref = h->event_ref = LUA_NOREF;
  /* Closing the state closes luv's handles; then our timers; the loop must run their closes. */
  lua_close(h->L);
  uv_close((uv_handle_t *)&h->defer_timer, NULL);
  uv_close((uv_handle_t *)&h->exit_timer, NULL);
  uv_run(h->loop, UV_RUN_NOWAIT);
  free(h->obs);
  free(h->gone);
  free(h->pm_spec);
  free(h->text_buf);
  free(h);
}
