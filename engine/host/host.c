/*
 * host.c: the Lua host. It owns one lua_State with luv on the embedder's libuv loop, the script's
 * observers and the sources that feed them; this file is the host's runtime: every call from C
 * into the script, the one reporting path, the observers and sources, and the end of the run.
 * The host's other files build on it (host_internal.h has the map): state.c creates and frees
 * the host and its lua_State, corelib.c is the cuptimon.core module that the Lua side calls, and
 * process.c is what the script sees of each source's process. Only the host's files include
 * lua.h: the sources (inproc.c, wsrc.c) describe their processes through cm_process_info.
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
 * A request to exit (cm.exit, cm_host_request_exit, an exit request the script raises) runs the
 * shutdown from a timer on the next loop iteration; the shutdown delivers the last window, runs
 * the exit hooks and detaches every source.
 *
 * Ownership. The host owns the lua_State, the observer table and the attached sources; it does
 * not own the loop. All functions run on the loop thread.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <uv.h>

#include "cuptimon.h"
#include "cuptimon_host.h"
#include "host_internal.h"
#include "inproc.h"

/* ---- reporting ------------------------------------------------------------------------------- */

cm_host *cm__host_of(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, CM__HOST_KEY);
  cm_host *h = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return h;
}

int cm__host_is_exit_request(lua_State *L, int idx) {
  if (!lua_istable(L, idx)) return 0;
  lua_pushstring(L, "exit_status");
  lua_rawget(L, idx < 0 ? idx - 1 : idx);
  int yes = lua_type(L, -1) == LUA_TNUMBER;
  lua_pop(L, 1);
  return yes;
}

/* The message handler of every call into Lua: the error message plus a traceback. An exit
 * request passes through unchanged, for cm__host_run_chunk. */
static int msgh(lua_State *L) {
  if (cm__host_is_exit_request(L, 1)) return 1;
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
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

void cm__host_report(cm_host *h, const char *where) {
  lua_State *L = h->L;
  /* An exit request (cuptimon.args's, which a recipe raises to stop with a message and a status)
   * is not an error object: its message is printed as it is and its status becomes the run's,
   * wherever it was raised (an observer, a hook, a timer), as when the main chunk raises it. */
  if (cm__host_is_exit_request(L, -1)) {
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
  cm__host_report(h, where);
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

void cm__host_fire_event(cm_host *h, const char *event, int nargs) {
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
  if (lua_pcall(L, nargs + 1, 0, base)) cm__host_report(h, event);
  lua_remove(L, base);
}

int cm__host_luv_pcall(lua_State *L, int nargs, int nresults, int flags) {
  int fn = lua_gettop(L) - nargs;
  lua_pushcfunction(L, msgh);
  lua_insert(L, fn);
  int ret = lua_pcall(L, nargs, nresults, fn);
  if (ret) {
    cm_host *h = cm__host_of(L);
    lua_remove(L, fn);
    if (h) cm__host_report(h, "luv callback");
    else lua_pop(L, 1);
    return -ret;
  }
  lua_remove(L, fn);
  if (nresults == LUA_MULTRET) return lua_gettop(L) - fn + 1;
  return nresults;
}

int cm__host_run_chunk(cm_host *h, int nargs) {
  lua_State *L = h->L;
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, msgh);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, 0, base);
  if (rc && cm__host_is_exit_request(L, -1)) {
    take_exit_request(h);
    rc = 0;
  } else if (rc) {
    cm__host_report(h, "the script");
  }
  lua_remove(L, base);
  return rc ? CM_EINVAL : 0;
}

/* ---- observers and sources ---------------------------------------------------------------------- */

int cm__host_find_obs(cm_host *h, uint32_t id) {
  for (int i = 0; i < h->nobs; i++)
    if (h->obs[i].id == id) return i;
  return -1;
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
      cm__host_report(h, "add_source");
    }
  }
  if (h->pm_spec && *h->pm_spec && s->vt->pm) {
    char err[4096] = "";
    int rc = s->vt->pm(s, h->pm_spec, err, sizeof err);
    if (rc) {
      lua_pushfstring(h->L, "PM sampling in source %d (%s): %s", s->id, s->vt->name, err);
      cm__host_report(h, "pm_sample");
    }
  }
  cm__process_push(h, s, 0);
  cm__host_fire_event(h, "process_start", 1);
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
  cm__process_gone(h, s);
  cm__process_push(h, s, 1);
  s->vt->free(s);
  cm__host_fire_event(h, "process_exit", 1);
}

void cm_host_deliver(cm_host *h, cm_source *s, uint32_t obs, const cm_batch *b) {
  if (!pthread_equal(pthread_self(), h->thread)) {
    h->foreign++; /* Not atomic on purpose: this is a bug counter, read in tests. */
    return;
  }
  if (h->dispatch_ref == LUA_NOREF || cm__host_find_obs(h, obs) < 0) return;
  lua_State *L = h->L;
  int top = lua_gettop(L);
  lua_pushcfunction(L, msgh);
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->dispatch_ref);
  lua_pushlightuserdata(L, (void *)b);
  lua_pushinteger(L, s->id);
  lua_pushinteger(L, (lua_Integer)obs);
  h->in_dispatch++;
  if (lua_pcall(L, 3, 0, top + 1)) cm__host_report(h, "observer callback");
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

void cm__host_set_live_ops(cm_host *h, const cm__live_ops *ops) {
  if (h) h->live = ops;
}

/* ---- subscriber callbacks (apicb.c) ---------------------------------------------------------- */

void cm__host_api_ready(cm_host *h) {
  if (h->shut_down) return;
  cm__host_fire_event(h, "api", 0);
}

/* ---- the end of the run --------------------------------------------------------------------- */

int cm_host_exit_requested(cm_host *h, int *status) {
  if (status) *status = h->exit_status;
  return h->exit_requested;
}

static void defer_cb(uv_timer_t *t) {
  cm_host *h = t->data;
  cm__host_fire_event(h, "deferred", 0);
}

/* Runs the deferred calls still pending, at shutdown. The defer timer does not keep the loop
 * alive, so without this they would run after the exit hooks and the exit status (or never),
 * and a failure among them would go unreported. */
static void run_deferred_now(cm_host *h) {
  if (!uv_is_active((uv_handle_t *)&h->defer_timer)) return;
  uv_timer_stop(&h->defer_timer);
  cm__host_fire_event(h, "deferred", 0);
}

void cm__host_defer(cm_host *h) { uv_timer_start(&h->defer_timer, defer_cb, 0, 0); }

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
    cm__host_fire_event(h, "exit", 0);
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

lua_State *cm_host_lua(cm_host *h) { return h ? h->L : NULL; }
uv_loop_t *cm_host_loop(cm_host *h) { return h ? h->loop : NULL; }
uint64_t cm_host_error_count(cm_host *h) { return h ? h->errors : 0; }
