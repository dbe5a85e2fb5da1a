/*
 * state.c: a host's life and its Lua state. cm_host_new builds the lua_State (the standard
 * libraries; luv on the embedder's loop, in package.loaded before any script asks; the embedded
 * Lua modules and cuptimon.core in package.preload; os.exit replaced so an exit still shuts down
 * cleanly; --check's stand-ins), cm_host_run_script and cm_host_eval run code in it, and
 * cm_host_free closes the script's luv handles, the state and the host's timers.
 *
 * Design note. luv must adopt the host's loop (luv_set_loop before luaopen_luv) and report its
 * callbacks' errors through the host (cm__host_luv_pcall) instead of exiting the process. The
 * loop is the embedder's and outlives the host, so cm_host_free closes only what belongs to this
 * state: the handles whose luv context is this state's, then the host's own timers, and runs the
 * loop until their close callbacks have run.
 *
 * Ownership: the host and its lua_State, created and freed here; the loop is not the host's. Loop
 * thread only (the thread that calls cm_host_new is the loop thread from then on).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <luv/luv.h>
#include <luv/lhandle.h>
#include <uv.h>

#include "cuptimon.h"
#include "cuptimon_host.h"
#include "host_internal.h"

/* The Lua modules embedded at build time (a generated file, lua/CMakeLists.txt). */
typedef struct cm__lua_module {
  const char *name;  /* "cuptimon", "cuptimon.agg", ... */
  const char *file;  /* "cuptimon/init.lua", for chunk names */
  const unsigned char *src;
  size_t len;
} cm__lua_module;
extern const cm__lua_module cm__lua_modules[];

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
  cm_host *h = cm__host_of(L);
  luv_set_loop(L, h->loop);
  int n = luaopen_luv(L);
  luv_set_callback(L, cm__host_luv_pcall);
  h->luv_ctx = luv_context(L);
  return n;
}

static int host_init(lua_State *L) {
  cm_host *h = lua_touserdata(L, 1);
  luaL_openlibs(L);
  lua_pushlightuserdata(L, h);
  lua_setfield(L, LUA_REGISTRYINDEX, CM__HOST_KEY);

  /* luv, eagerly, so package.loaded.luv is the host's loop even before a script asks. */
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  lua_pushcfunction(L, luaopen_luv_on_host);
  lua_call(L, 0, 1);
  lua_setfield(L, -2, "luv");
  lua_pop(L, 1);

  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, cm__corelib_open);
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
  lua_pushcfunction(L, cm__corelib_os_exit);
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
    cm__host_report(h, "loading the script");
    return CM_EINVAL;
  }
  for (int i = 0; i < argc; i++) lua_pushstring(L, argv[i]);
  return cm__host_run_chunk(h, argc);
}

int cm_host_eval(cm_host *h, const char *chunk, const char *name) {
  if (!h || !chunk) return CM_EINVAL;
  lua_State *L = h->L;
  if (luaL_loadbuffer(L, chunk, strlen(chunk), name ? name : "=(command line)")) {
    cm__host_report(h, "loading the script");
    return CM_EINVAL;
  }
  return cm__host_run_chunk(h, 0);
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
