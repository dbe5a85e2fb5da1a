/*
 * corelib.c: the cuptimon.core module, the lua_CFunctions that the Lua half of the host
 * (lua/cuptimon/init.lua) calls: registering the dispatcher, observers and their selections,
 * flushes, PM sampling, the live operations (shed, trigger windows), subscriber callbacks, the
 * cadences, deferred calls, the exit, and the run's counters and losses.
 *
 * Design note. Everything that may deliver batches (cm_observe, cm_unobserve, cm_flush,
 * cm_engine_free) is reached from these functions or from a uv callback, never through the FFI,
 * because LuaJIT cannot re-enter Lua from an FFI call. Runtime failures return nil, "ENAME:
 * detail", "ENAME" (push_fail), luv's shape; misuse raises through luaL_check*. The module holds no
 * state of its own: it works on the host that owns the calling lua_State (host_internal.h), and
 * attaches the in-process source (inproc.c) on the first observer, PM request or subscription.
 * state.c registers it in package.preload and puts cm__corelib_os_exit in place of os.exit.
 *
 * Loop thread only: every function here runs inside a call into Lua on the loop thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "cuptimon.h"
#include "cuptimon_host.h"
#include "apicb.h"
#include "host_internal.h"
#include "inproc.h"

static cm_host *core_host(lua_State *L) {
  cm_host *h = cm__host_of(L);
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

/* Attaches the in-process source on its first need (an observer, a PM request, a subscription),
 * unless the host runs --check or takes its sources from elsewhere (CM_HOST_NO_INPROC). Returns 0
 * or the CM_E* code it failed with, which is remembered: later calls return it again at once. */
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
  int idx = cm__host_find_obs(h, id);
  if (idx < 0) return push_fail(L, CM_ENOENT, "no such observer");
  for (int i = 0; i < h->nsources; i++) h->sources[i]->vt->unobserve(h->sources[i], id);
  idx = cm__host_find_obs(h, id);
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
  if (cm__host_find_obs(h, id) < 0) return push_fail(L, CM_ENOENT, "no such observer");
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
    cm__host_fire_event(h, "flush_done", 2);
  }
  free(w);
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
  cm__host_fire_event(h, "window_done", 2);
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

/* defer(): fires the "deferred" event on the next loop iteration. */
static int core_defer(lua_State *L) {
  cm_host *h = core_host(L);
  cm__host_defer(h);
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
    cm__process_push(h, h->sources[i], 0);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* cm__host_report(msg, where): hands a failure the Lua side caught itself (a hook, a deferred call) to
 * cm__host_report(), so it is counted and reaches the "error" hooks like any other. */
static int core_report(lua_State *L) {
  cm_host *h = core_host(L);
  const char *where = luaL_optstring(L, 2, "script");
  lua_settop(L, 2);
  if (!lua_isstring(L, 1) && !cm__host_is_exit_request(L, 1)) {
    lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    lua_replace(L, 1);
  }
  lua_pushvalue(L, 1);
  cm__host_report(h, where);
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
  cm__process_push_loss(L, &l);
  return 1;
}

/* errors() -> the number of reported errors, deliveries refused from foreign threads. */
static int core_errors(lua_State *L) {
  cm_host *h = core_host(L);
  lua_pushnumber(L, (lua_Number)h->errors);
  lua_pushnumber(L, (lua_Number)h->foreign);
  return 2;
}

int cm__corelib_os_exit(lua_State *L) {
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

/* ---- subscriber callbacks (apicb.c, the in-process source's queue) ---------------------------- */

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

int cm__corelib_open(lua_State *L) {
  lua_newtable(L);
  luaL_register(L, NULL, core_funcs);
  return 1;
}

