/*
 * cuptimon_host.h: embedding the cuptimon Lua API (LuaJIT + luv) in a program that owns a libuv
 * loop, and the source interface through which batches reach the scripts.
 *
 * A host owns one lua_State whose luv module runs on the embedder's loop: luv_set_loop() is called
 * before luaopen_luv(), and the module is put in package.loaded["luv"], so `require "luv"` in a
 * script returns handles on the same loop. The Lua modules of lua/cuptimon/ are embedded in the
 * binary and registered in package.preload; a directory given in CUPTIMON_LUA_PATH (or
 * cm_host_options.lua_path) is searched first, so a developer can edit them without rebuilding.
 *
 * Threads. Nothing here is thread-safe. Every function must be called on the loop's thread (the
 * thread that called cm_host_new, which runs the loop), and so must every source operation below;
 * the host checks this in cm_host_deliver, which drops and counts a batch from another thread.
 * Every call into Lua (observer callbacks, timers, hooks) happens on that thread under lua_pcall
 * with a traceback handler; an error is reported (through the script's "error" hook or on
 * stderr) and never crashes the host. A source whose data arrives on another thread must hand it
 * to the loop (uv_async_send) before calling cm_host_deliver().
 *
 * Only the host itself includes lua.h: a source describes its process by filling a C struct
 * (cm_process_info), and the host turns that into the script's process table.
 *
 * Re-entrancy. Calls that can run observer callbacks (observe, unobserve, flush and freeing an
 * engine) are made only from C: from a lua_CFunction or a uv callback, never from an FFI call,
 * because LuaJIT cannot re-enter Lua from inside an FFI call. While a batch is being dispatched,
 * such requests from the script are deferred to the next loop iteration.
 */
#ifndef CUPTIMON_HOST_H
#define CUPTIMON_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "cuptimon.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Forward declarations, so this header does not need uv.h or lua.h (cm_host_lua returns the
 * state to an embedder that wants to use the Lua API itself). */
struct uv_loop_s;
struct lua_State;

typedef struct cm_host cm_host;
typedef struct cm_source cm_source;

/* ---- the embedding API ------------------------------------------------------------------------- */

typedef struct cm_host_options {
  const char *lua_path;   /* a directory searched before the embedded modules, or NULL */
  uint32_t flags;         /* CM_HOST_* */
} cm_host_options;

enum {
  /* Validate only: observers check their selections against the field registry, but no engine
   * is created, no timer starts and no batch is delivered (cuptimon-lua --check); the script's
   * calls that write files, create directories, bind sockets or start processes are stand-ins
   * that do nothing (lua/cuptimon/check.lua). */
  CM_HOST_CHECK = 1u << 0,
  /* Do not create the in-process engine source on the first observer (a host that attaches its
   * own sources, such as the live-agent hub or a replay). */
  CM_HOST_NO_INPROC = 1u << 1,
  /* cm.exit() (cm_host_request_exit) only stops the loop; the embedder calls cm_host_shutdown
   * once uv_run returns, after work of its own (cuptimon-lua --attach detaches its agents first,
   * so that the final window is complete before the exit hooks run). */
  CM_HOST_STOP_ON_EXIT = 1u << 2,
  /* Errors printed on stderr keep their Lua traceback (cuptimon-lua --verbose); without it a
   * printed error is its one-line message, which names the script's file and line. The "error"
   * hooks get the whole message either way. */
  CM_HOST_VERBOSE = 1u << 3
};

/* Creates a host on `loop` (which must outlive it). `opts` may be NULL. Returns 0 or a CM_E*
 * code; on failure *out is NULL and cm_errmsg() has the detail. */
CM_EXTERN int cm_host_new(cm_host **out, struct uv_loop_s *loop, const cm_host_options *opts);

/* Loads and runs the script at `path` with `argv` (argc strings, may be 0) as the global `arg`
 * table and as the chunk's varargs. Returns 0, or CM_EINVAL when the script failed to load or
 * raised an error (reported like every script error, with a traceback; see
 * cm_host_error_count). The script's timers and observers stay registered; the embedder runs the
 * loop afterwards. A script that raises an exit request (a table with a number field
 * exit_status, as cuptimon.args does after --help) is not a failure: its message is printed on
 * stderr, the exit is requested with that status (cm_host_exit_requested) and 0 is returned. */
CM_EXTERN int cm_host_run_script(cm_host *h, const char *path, int argc, char **argv);
/* Runs a chunk of Lua source, like cuptimon-lua -e. `name` names it in messages (may be NULL). */
CM_EXTERN int cm_host_eval(cm_host *h, const char *chunk, const char *name);

/* Ends the script: a final sync flush of every source, then the "exit" hooks, then observers are
 * closed and sources freed. Idempotent. The loop is stopped with uv_stop() so an embedder's
 * uv_run() returns. Returns the exit status the script asked for (cm.exit), or 0. */
CM_EXTERN int cm_host_shutdown(cm_host *h);
/* Requests a shutdown from a uv callback (SIGINT, for example): it runs on the next iteration of
 * the loop, with `status` as the default exit status. */
CM_EXTERN void cm_host_request_exit(cm_host *h, int status);
/* Whether the script asked to exit (cm.exit or a requested exit), and the status it asked for. */
CM_EXTERN int cm_host_exit_requested(cm_host *h, int *status);
/* The number of errors raised by the script, its callbacks (observers, timers, luv callbacks,
 * deferred calls) and its hooks (exit hooks included), whether an "error" hook took them or they
 * were printed on stderr. cuptimon-lua turns an exit status of 0 into 1 when it is not 0. */
CM_EXTERN uint64_t cm_host_error_count(cm_host *h);

/* Closes the Lua state and frees the host (shutting down first if needed). NULL is accepted. */
CM_EXTERN void cm_host_free(cm_host *h);

CM_EXTERN struct lua_State *cm_host_lua(cm_host *h);
CM_EXTERN struct uv_loop_s *cm_host_loop(cm_host *h);

/* ---- sources --------------------------------------------------------------------------------------
 *
 * A source produces batches: the in-process engine (cm_host_inproc_source_new), live agents
 * and capture replays (cuptimon-lua's hub). The host keeps the script's observers, each with its selection, and applies every
 * observer to every source, including sources attached later. A source calls cm_host_deliver()
 * on the loop thread for each batch of an observer; the batch and its columns need only be valid
 * during that call, so a received frame or the engine's own columns are used in place. */

/* What a source knows of its process, for the script's process table (the "process_start" and
 * "process_exit" hooks, cuptimon.sources()). The host zeroes the struct and calls describe; a
 * field the source leaves NULL, or whose has_ flag it leaves 0, is left out of the table (argv
 * and devices are always there, empty when the count is 0). Strings and arrays belong to the
 * source and need only stay valid until the next call into the source. */
typedef struct cm_process_device {
  uint32_t index;   /* the CUDA device ordinal */
  const char *name; /* "NVIDIA H200" */
} cm_process_device;

typedef struct cm_process_counter {
  const char *name; /* "records_dropped", ... */
  uint64_t value;
} cm_process_counter;

typedef struct cm_process_info {
  const char *host;          /* the machine's name; NULL: this machine's (gethostname) */
  int has_ppid;
  uint32_t ppid;
  const char *exe;           /* the executable's path; NULL: unknown */
  int has_cupti_version;
  uint32_t cupti_version;    /* cuptiGetVersion in that process */
  const char *const *argv;   /* argc strings: the command line (an empty table when argc is 0) */
  uint32_t argc;
  const cm_process_device *devices; /* ndevices entries (an empty table when 0) */
  uint32_t ndevices;
  const char *const *env;    /* nenv "NAME=VALUE" strings: the table's `env` (RANK, LOCAL_RANK,
                              * WORLD_SIZE, LOCAL_WORLD_SIZE when the agent found them) */
  uint32_t nenv;
  /* Set only when describing a process that is going away (exiting = 1): */
  const char *status;        /* "exit", "disconnected", "error", "timeout", "detached", ... */
  int has_exit_code;
  int32_t exit_code;
  const char *message;       /* why it ended, or NULL */
  int has_dropped;
  uint64_t dropped;          /* records the process lost */
  const cm_process_counter *stats; /* nstats counters, the table's `stats`; NULL: no table */
  uint32_t nstats;
} cm_process_info;

/* Called by a source when an asynchronous flush completes; `status` is 0 or a CM_E* code. */
typedef void (*cm_source_done_fn)(void *ud, int status);

/* What a source's process lost, in records, by where it was lost (docs/monitor.md, "Loss").
 * For a sum over sources, every field is summed except last_number (the largest). */
typedef struct cm_loss {
  uint64_t produced;      /* received + dropped: what the process recorded, as far as known */
  uint64_t received;      /* records that reached the monitor */
  uint64_t dropped;       /* every record lost: the sum of the four below */
  uint64_t dropped_cupti; /* CUPTI had no buffer, or the engine no memory */
  uint64_t dropped_agent; /* the agent's send queue was full, or its connection failed */
  uint64_t dropped_exit;  /* still queued in the agent when its exit deadline passed */
  uint64_t lost_wire;     /* sent by the agent (its STATS say so) but never received */
  uint64_t lost_frames;   /* BATCH frames known to be missing (gaps in their numbers) */
  uint64_t incomplete;    /* 1 (per source) when the counts are a lower bound: the process ended
                           * without its final counts, or frames are missing after them */
  uint64_t last_number;   /* the number of the last BATCH frame received (0: none or unnumbered) */
  uint64_t tail_unknown;  /* 1 (per source) when the agent's exit left its final flush behind at
                           * the deadline: what CUPTI still held is not known (also incomplete) */
  uint64_t skipped_bytes; /* bytes of a capture skipped as corrupt (its frames unknown); a source
                           * with any is incomplete */
} cm_loss;

typedef struct cm_source_vtable {
  const char *name; /* "inproc", "agent", "replay" */
  /* Starts delivering the fields of `sel` (spec is the same selection as text) to observer
   * `obs` (a host-wide id > 0). May deliver pending batches to other observers before it
   * returns. */
  int (*observe)(cm_source *s, uint32_t obs, const cm_selection *sel, const char *spec);
  /* Stops observer `obs`; pending batches may be delivered to it first. */
  int (*unobserve)(cm_source *s, uint32_t obs);
  /* Flushes (CM_FLUSH_PLAIN or CM_FLUSH_SYNC). A source calls done exactly once, synchronously
   * or later on the loop thread; batches of the window are delivered before done runs. */
  int (*flush)(cm_source *s, int mode, uint32_t timeout_ms, cm_source_done_fn done, void *ud);
  /* Cadences: how often buffers are flushed and batches delivered; 0 leaves one unchanged. */
  int (*configure)(cm_source *s, uint32_t flush_ms, uint32_t deliver_ms);
  int (*stats)(cm_source *s, cm_stats *out);
  /* Resolves a string id of this source's columns; NULL when unknown. */
  const char *(*string)(cm_source *s, uint32_t id, size_t *len);
  /* Frees the source; the host has unobserved everything and detached it. */
  void (*free)(cm_source *s);
  /* Fills what the source knows of its process into *out (zeroed by the host): host, ppid, exe,
   * cupti_version, argv, devices, and when `exiting` is 1 also status, exit_code, message,
   * dropped and stats. The host adds source, pid and kind itself. May be NULL. */
  void (*describe)(cm_source *s, cm_process_info *out, int exiting);
  /* Fills what the source lost so far. May be NULL: then records_dropped of stats is all. */
  int (*loss)(cm_source *s, cm_loss *out);
  /* Replaces the PM sampling the source runs with `spec` (the PM frame's text, docs/wire.md;
   * "" for none). Returns 0, or a CM_E* code with the reason in err (errlen bytes). A source
   * that answers later (a live agent) reports each entry's failure through the host's errors.
   * May be NULL: a replay cannot sample. */
  int (*pm)(cm_source *s, const char *spec, char *err, size_t errlen);
  /* Takes observer `obs`'s selection out of what the source traces while it still receives the
   * batches that arrive (a window's closing: the records written before the narrowing still
   * reach its observer until the closing fence). unobserve ends it. May be NULL: the selection
   * then stays until unobserve. */
  int (*retire)(cm_source *s, uint32_t obs);
} cm_source_vtable;

struct cm_source {
  const cm_source_vtable *vt;
  cm_host *host; /* set by cm_host_add_source */
  int id;        /* set by cm_host_add_source: 1, 2, ...; batches carry it as b.source */
  int pid;       /* the process the batches come from (getpid() for the in-process source) */
};

/* Attaches a source: every current observer is applied to it, and the script's
 * "process_start" hooks run with the process table {source=, pid=, kind=, host=, ...} (see
 * describe). Returns its id or a CM_E* code. */
CM_EXTERN int cm_host_add_source(cm_host *h, cm_source *s);
/* Detaches a source (the script's "process_exit" hooks run) and frees it. */
CM_EXTERN void cm_host_remove_source(cm_host *h, cm_source *s);
/* Delivers one batch of observer `obs` from source `s` into Lua. Loop thread only. */
void cm_host_deliver(cm_host *h, cm_source *s, uint32_t obs, const cm_batch *b);
/* Calls fn(ud, id, sel, spec) for each observer, oldest first, without running Lua: what a source
 * attached now would be asked to observe (the hub answers agents' handshakes from it). Stops at
 * the first non-zero return and returns it; 0 otherwise. Loop thread only. */
CM_EXTERN int cm_host_each_observer(cm_host *h,
                                    int (*fn)(void *ud, uint32_t id, const cm_selection *sel, const char *spec),
                                    void *ud);

/* The in-process engine as a source. The engine is created with deliver_ms = 0 and
 * batch_records = 0, so batches are delivered only inside cm_flush, cm_observe and
 * cm_unobserve, which this source calls on the loop thread; a uv timer on the loop drives the
 * delivery cadence. Returns 0 or a CM_E* code (CM_ENOCUPTI, CM_EBUSY). */
CM_EXTERN int cm_host_inproc_source_new(cm_host *h, cm_source **out);

/* ---- for the Lua modules (called through the FFI; they never run Lua) --------------------------- */

/* Resolves string `id` of source `source`. NULL for an unknown source or id. */
CM_EXTERN const char *cm_host_source_string(cm_host *h, int source, uint32_t id, size_t *len);
/* `s` (len bytes) as text for an output: `s` itself when it is well-formed UTF-8 without control
 * characters, else a copy in a buffer of the host, valid until the next call, with each offending
 * byte replaced by U+FFFD (engine/host/text.c). *out_len gets the length. Loop thread only. */
CM_EXTERN const char *cm_host_text(cm_host *h, const char *s, size_t len, size_t *out_len);
/* Copies the counters of source `source`, or of every source summed when `source` is 0. Sources
 * that went away keep their last counters, so the sum covers the whole run. */
CM_EXTERN int cm_host_source_stats(cm_host *h, int source, cm_stats *out);
/* What source `source` lost, or every source summed when `source` is 0 (gone ones included). */
CM_EXTERN int cm_host_source_loss(cm_host *h, int source, cm_loss *out);
/* The i-th source of the run (attached ones first, then those that went away, i from 0): its id,
 * pid and losses. Returns 0, or CM_ENOENT past the last one. For the end-of-run loss line. */
CM_EXTERN int cm_host_source_loss_at(cm_host *h, int i, int *id, int *pid, cm_loss *out);

#ifdef __cplusplus
}
#endif

#endif /* CUPTIMON_HOST_H */
