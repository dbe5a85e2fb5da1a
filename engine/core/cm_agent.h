/*
 * cm_agent.h: the core's calls that the agent (engine/agent) makes beyond the public cuptimon.h,
 * and the types they take. Nothing here is public.
 *
 * Design note. The agent is the core's one internal client outside engine/core: it lives in the
 * same process and library, and some of what it does has no public API (the exit's bounded fence,
 * the lag guard's measures, the idle detach's settings, the pool's trim between sessions). This
 * header is that interface, stated: the agent includes it and never cm_internal.h, so a core
 * function the agent does not name here stays the core's own to change. cm_internal.h includes
 * it, so each declaration is written once. The libcupti binding's header (cm_cupti.h) comes with
 * it for InitializeInjectionNvtx2, which loads libcupti through the core's search order.
 *
 * What the agent may call, and from which thread:
 *  - the clock, the stderr line and the helper threads of job.c: any thread;
 *  - cm__cupti_load (cm_cupti.h): InitializeInjectionNvtx2 only, once, under its own lock, into a
 *    table it keeps for the process;
 *  - cm__engine_exit_flush: the exit handler only (directly, or on the exit's helper thread that
 *    it may abandon at its deadline);
 *  - the cm__engine_* calls below: the thread each one states (most are any thread;
 *    cm__engine_set_suppressed never from an observer callback, since it takes the engine's
 *    control lock). The agent makes them from its control thread, its init thread, the dormant
 *    listener between sessions and the exit handler; its observer calls cm__engine_cupti_buffers
 *    alone, for STATS.
 * The rest of the engine the agent reaches through cuptimon.h, as any host does.
 */
#ifndef CM_AGENT_H
#define CM_AGENT_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cm_cupti.h"
#include "cuptimon.h"

/* ---- errors.c ---------------------------------------------------------------------------- */

/* Writes `prefix`, `fmt` formatted with `ap` and a newline to stderr in a single write(2) (at
 * most 1.5 KiB, longer lines are cut), so lines of several threads (and of several processes
 * sharing the terminal) do not interleave and nothing stays buffered if the process dies next.
 * Thread-safe; never allocates. */
void cm__stderr_linev(const char *prefix, const char *fmt, va_list ap);

/* ---- clock.c ------------------------------------------------------------------------------ */

struct timespec;
/* CLOCK_REALTIME in nanoseconds, the timebase of every record. Thread-safe. */
uint64_t cm__realtime_ns(void);
/* CLOCK_MONOTONIC in milliseconds, for deadlines and cadences. Thread-safe. */
uint64_t cm__mono_ms(void);
/* Fills *ts with the CLOCK_MONOTONIC time `ms` from now, for pthread_cond_timedwait on a
 * condition variable created with CLOCK_MONOTONIC. Thread-safe. */
void cm__abstime_in(struct timespec *ts, uint64_t ms);

/* ---- job.c -------------------------------------------------------------------------------- */

/* A helper thread that its waiter may abandon at a deadline (job.c). Embed it first in the job's
 * struct, which must come from malloc: the last of the waiter and the helper to leave frees it. */
typedef struct cm__job {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  int refs;          /* mu: the waiter and the helper */
  bool done;         /* mu: set by cm__job_finish */
  bool abandoned;    /* mu: set by cm__job_abandon before the helper finished */
} cm__job;

/* Starts fn(j) on a detached thread with every signal blocked. Returns 0, or pthread_create's
 * error (the job is then the caller's alone, to free). */
int cm__job_start(cm__job *j, void *(*fn)(void *));
/* The helper's end, once its results are written: done, and the waiter woken. Returns whether
 * the waiter abandoned the job first (cm__job_abandon): the helper then undoes what its results
 * would have left to the waiter. The helper then calls cm__job_release. */
bool cm__job_finish(cm__job *j);
/* Waits until the helper finished or `deadline` (mono ms) passed, in slices of at most slice_ms
 * (0: one wait), ending early when hurry(arg) says so. Returns whether it finished; its results
 * are then visible to the caller. */
bool cm__job_wait(cm__job *j, uint64_t deadline, uint32_t slice_ms, bool (*hurry)(void *),
                  void *arg);
/* Drops one reference; the last frees the job. */
void cm__job_release(cm__job *j);

/* ---- fence.c: the exit fence ------------------------------------------------------------------
 *
 * What the exit fence did; every field is a reason why records produced before it may be missing
 * from what it delivered. */
typedef struct cm__exit_flush {
  bool engine_busy;     /* another control call held the engine past the deadline: nothing flushed */
  bool capture_active;  /* a CUDA graph capture was in progress: no device sync */
  bool sync_timed_out;  /* the device sync did not finish in time (a kernel still running) */
  bool decode_timed_out; /* the decoder had not caught up at the deadline */
  bool synced;          /* the device sync completed and its record was seen */
  /* Set (once, with release order) as soon as the sync fence has completed, before the forced
   * flush: a caller that stops waiting during that flush (the agent's exit) knows from it that
   * every record produced before the fence was decoded. Readable from another thread. */
  _Atomic bool fence_complete;
  /* CLOCK_MONOTONIC ms at which the sync fence ended (completed or not), before the forced
   * flush; 0 until then. Readable from another thread, for the exit's log. */
  _Atomic uint64_t fence_end_ms;
  /* For the exit's log, each readable from another thread: when the device synchronize returned
   * (CLOCK_MONOTONIC ms, 0 until then), how many default flushes ran after it, and whether the
   * fence's sync record came only with a forced flush (see cm__engine_exit_flush). */
  _Atomic uint64_t device_synced_ms;
  _Atomic uint32_t default_flushes;
  _Atomic bool seen_after_forced;
  /* Records from before the fence's mark that CUPTI delivered after the fence's own sync record
   * (CUPTI behind on some kind; the fence waited for them), and whether the deadline came while
   * they were still arriving (then the records CUPTI still held are unknown). Readable from
   * another thread. */
  _Atomic uint64_t backlog_records;
  _Atomic bool backlog_cut;
} cm__exit_flush;

/* The exit fence: a best effort to deliver every record produced before the call, by `deadline`
 * (CLOCK_MONOTONIC ms) at the latest, whatever the device or another thread does. It makes a
 * control call in progress on another thread (a sync flush waiting for the device) give up at
 * once, takes the engine's control lock with the deadline, synchronizes the device on a helper
 * thread that it abandons at `sync_deadline` (and not at all while a graph capture is in
 * progress), waits for the synchronize's record (after CM__EXIT_DEFAULT_FLUSH_MS of default
 * flushes, with forced ones: after the synchronize every record before it is complete, and only a
 * forced flush is known to return the partly filled buffers of threads that stopped), then
 * flushes CUPTI with CUPTI_ACTIVITY_FLAG_FLUSH_FORCED once more and delivers. From then on
 * every wait in a later control call ends at once, so nothing queued behind it can hold the
 * process. Returns 0 when nothing was cut short, else CM_ETIMEDOUT; *out says what happened.
 * Any thread; meant for the process's exit. */
int cm__engine_exit_flush(cm_engine *e, uint64_t sync_deadline, uint64_t deadline,
                          cm__exit_flush *out);

/* ---- engine.c: what the agent's idle periods, lag guard and selections use ----------------- */

/* Frees every free buffer of the engine's pool (outstanding ones return and are recycled as
 * usual), so an engine with no session holds no buffer memory: the dormant agent calls it when a
 * monitor detaches. Any thread. */
void cm__engine_trim(cm_engine *e);
/* The longest CUPTI is known to have held a record, over the buffers decoded since the previous
 * call: for each buffer, the time from the timestamp of the kind most behind in it (as for
 * lag_cupti_ns) to CUPTI asking for the buffer, which it wrote that record into later. Unlike
 * lag_cupti_ns it does not count the time a record waited in a partly filled buffer, so a slow
 * process without a flush cadence does not look behind. 0 when no buffer showed CUPTI holding a
 * record back (or none had a timestamp on this run's clock). Any thread; the agent's lag guard
 * takes it. */
uint64_t cm__engine_take_lag_held_max(cm_engine *e);
/* How many activity buffers CUPTI holds now: handed to it and not yet completed. When CUPTI falls
 * behind on completing its buffers, it keeps asking for new ones while it holds the old, and this
 * count (the memory it holds in the pool) grows: a few while it keeps up, tens once it falls
 * behind. Any thread; the agent's lag guard reads it. */
uint64_t cm__engine_cupti_buffers(cm_engine *e);
/* Whether a detach's cuptiFinalize outlived its deadline and still runs (nothing may call CUPTI
 * until it returns; cm_cupti_detach). Any thread. */
bool cm__engine_finalizing(cm_engine *e);
/* A detach first probes the threads that call the runtime and refuses to finalize when `n` or
 * more do (0: no probe; subscription.c, "the finalize helper"). Any thread, before or between detaches. */
void cm__engine_set_detach_max_threads(cm_engine *e, int n);
/* The threads the last detach's probe counted when it refused the detach; 0 when the last detach
 * was not refused by the probe. Any thread. */
int cm__engine_probe_busy_threads(cm_engine *e);
/* Whether the process has made or launched a CUDA graph while CUPTI was attached: a detach then
 * refuses for good, since a cuptiFinalize and a new subscription break the graphs' launches
 * (callbacks.c, graph_cbids). Any thread. */
bool cm__engine_graphs_used(cm_engine *e);
/* CLOCK_REALTIME just before the engine last called cuptiActivityEnable to enable a kind that was
 * off (0 before the first). A call that enables kinds can hold the application's launching
 * threads while it runs, and the work they were held from then runs traced: the agent stamps a
 * window's opening edge here rather than after cm_observe returned. Any thread. */
uint64_t cm__engine_enable_start_ns(cm_engine *e);
/* Keeps `kinds` (one bit per kind) disabled in CUPTI, whatever the observers select, until the
 * next call, and disables them now. The observers keep their selections, so the records of those
 * kinds that CUPTI already wrote still reach them, at flushes and fences as usual; the exit's
 * fence still waits for them. 0 lifts it: the selected kinds are enabled again. Returns 0 or the
 * error of a failed enable. Any thread but an observer callback (it takes api_mu). */
int cm__engine_set_suppressed(cm_engine *e, uint64_t kinds);
/* The kinds enabled in CUPTI now (one bit per kind). Any thread. */
uint64_t cm__engine_enabled(cm_engine *e);
/* Asks the decode worker to synchronize the device and then make one forced
 * cuptiActivityFlushAll, and to deliver once it has decoded the buffers that flush completed;
 * returns at once. For a moment when nothing more will be written for a while (the lag guard has
 * shed every kind): CUPTI keeps a partly filled buffer until a forced flush, so without one the
 * records in it would reach the observers only at the next fence, which may be the exit's. The
 * synchronize comes first because a forced flush returns a running kernel's record with an end
 * of 0; when the device cannot be synchronized, nothing is forced. Any thread. */
void cm__engine_flush_forced_async(cm_engine *e);

#endif /* CM_AGENT_H */
