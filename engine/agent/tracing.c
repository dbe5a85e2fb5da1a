/*
 * tracing.c: what the agent traces, and what CUPTI is left in meanwhile: the engine's start, the
 * agent's observer and its selection, the engine's cadence while nothing is traced, CUPTI's detach
 * between windows, and the lag guard's steps (guard.c decides them).
 *
 * Design note. One thread changes what is traced at a time: the control thread once it runs (the
 * init thread before, the dormant listener between sessions), so the fields these functions own
 * (the observers, the PM consumers' count, cadence_idle, traced_selects, the guard's state) need
 * no lock; what STATS reports from them (idle_mode, the selection instants, the guard's counters)
 * is atomic. The engine's locks are taken only inside its calls; no agent lock is held across
 * them.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "agent_internal.h"

/* How long a detach refused for now is retried once the monitor has gone. */
enum { LEAVE_RETRY_MS = 3000 };

/* Creates the engine with the default configuration and `deliver_ms`, and routes its log.
 * Returns 0, or a CM_E* code with the reason in why (A.eng stays NULL). */
int cm__tracing_start_engine(uint32_t deliver_ms, char *why, size_t cap) {
  cm_config_init(&A.cfg);
  A.cfg.deliver_ms = deliver_ms;
  int rc = cm_engine_new(&A.eng, &A.cfg);
  if (rc) {
    snprintf(why, cap, "%s: %s", cm_err_name(rc), cm_errmsg());
    A.eng = NULL;
    return rc;
  }
  cm_set_log(A.eng, cm__alog_engine, NULL);
  cm__engine_set_detach_max_threads(A.eng, (int)A.detach_max_threads);
  return 0;
}

bool cm__tracing_selection_empty(const cm_selection *sel) {
  for (int k = 0; k < CM_KIND_MAX; k++)
    if (cm_selection_count(sel, k)) return false;
  return true;
}

/* CUPTI is detached (cm_cupti_detach) each time nothing is traced any more: between a duty
 * cycle's windows, and once a monitor has gone. Once CUPTI has traced, a launch stays dearer with
 * every kind off than before CUPTI attached, and only cuptiFinalize gives that back
 * (bench/RESULTS.md, "CUPTI states"); the next SELECT attaches it again. Two things make a
 * process stay attached for good instead, at the cost of that residue, so that it is never left
 * unable to trace: an attach that outlasted its wait (a process whose threads launch without
 * pause can keep cuptiSubscribe from returning: cm__tracing_apply_selection) and a cuptiFinalize
 * that outlasted its deadline. A third keeps it attached even once the monitor has gone, so that
 * the application is never broken: the use of CUDA graphs, whose launches fail after a
 * cuptiFinalize and a new subscription. Nor is CUPTI detached before two windows have traced on the
 * subscription made at start-up, when no application thread could hold it. A refusal between
 * windows is said and changes nothing: the next idle period tries again, except where it never
 * can (no cuptiFinalize, PM sampling used, NVTX injected). Once the monitor has gone there is no
 * next idle period, so a refusal for now (CUPTI still delivering, a buffer it holds, a graph
 * capture in progress) is retried for LEAVE_RETRY_MS, and one that outlasts that is said as a
 * warning. Control thread, or the listener's between sessions. */
static void idle_mode_set(int mode, const char *why) {
  if (atomic_load(&A.idle_mode) == mode) return;
  atomic_store(&A.idle_mode, mode);
  if (mode != CM_IDLE_DETACH && why)
    alog(CM_LOG_INFO, "CUPTI stays attached while nothing is traced, from now on: %s (a launch "
                      "costs more between windows; CUPTIMON_DETACH_IDLE in docs/agent.md)", why);
}

void cm__tracing_detach_idle(bool leaving) {
  int mode = atomic_load(&A.idle_mode);
  if (atomic_load(&A.exiting) || !A.eng || cm_cupti_detached(A.eng)) return;
  if (mode == CM_IDLE_SETTING || mode == CM_IDLE_NVTX || mode == CM_IDLE_CANNOT ||
      mode == CM_IDLE_GRAPHS)
    return;
  /* Between windows, the first detach waits for two windows traced on the subscription made at
   * start-up: should attaching again never return in this process, its estimates still rest on
   * two windows, enough for an interval. A process that stays attached for good does so only
   * while a monitor traces it: once the monitor has gone it is detached, as an idle one is. */
  if (!leaving && ((mode != CM_IDLE_DETACH && mode != CM_IDLE_BUSY) || A.traced_selects < 2)) return;
  if (atomic_load(&A.nvtx_injected)) {
    idle_mode_set(CM_IDLE_NVTX, "NVTX is injected into CUPTI, whose calls a detach would break");
    return;
  }
  /* A process that uses CUDA graphs is never detached, not even once the monitor has gone: the
   * graphs' launches fail after a cuptiFinalize and a new subscription (callbacks.c). */
  if (cm__engine_graphs_used(A.eng)) {
    idle_mode_set(CM_IDLE_GRAPHS, "the process uses CUDA graphs, whose launches a cuptiFinalize "
                                  "and a new subscription would break");
    return;
  }
  /* A second bounds the flushes: CUPTI that is still delivering then is behind, and stays. When
   * the monitor has gone, the probe of the threads is skipped: no window needs CUPTI back soon,
   * and a monitor that comes later waits for its subscription as long as it takes. */
  if (leaving) cm__engine_set_detach_max_threads(A.eng, 0);
  int rc = cm_cupti_detach(A.eng, 1000);
  for (uint64_t end = cm__mono_ms() + LEAVE_RETRY_MS;
       leaving && (rc == CM_EAGAIN || rc == CM_EBUSY) && !atomic_load(&A.exiting) &&
       cm__mono_ms() < end;) {
    struct timespec pause = {0, 100 * 1000000L};
    nanosleep(&pause, NULL);
    rc = cm_cupti_detach(A.eng, 1000);
  }
  if (leaving) cm__engine_set_detach_max_threads(A.eng, (int)A.detach_max_threads);
  if (leaving && rc != 0 && rc != CM_ETIMEDOUT && rc != CM_ENOSYS)
    alog(CM_LOG_WARN, "CUPTI stays attached after the monitor left (a launch costs more until a "
                      "monitor comes and goes again): %s", cm_errmsg());
  if (rc == 0) {
    if (mode == CM_IDLE_BUSY) atomic_store(&A.idle_mode, CM_IDLE_DETACH);
    return;
  }
  if (rc == CM_ETIMEDOUT && cm__engine_finalizing(A.eng)) {
    /* cuptiFinalize blocks (CUPTI waits for the application's threads): it goes on in its own
     * thread, and the selections that need CUPTI fail, and say why, until it returns; after
     * that CUPTI attaches again and stays. */
    alog(CM_LOG_WARN, "detaching CUPTI while idle: %s", cm_errmsg());
    if (!leaving) idle_mode_set(CM_IDLE_SLOW_FINALIZE, "cuptiFinalize did not return by its deadline");
    return;
  }
  if (rc == CM_ENOSYS) {
    idle_mode_set(CM_IDLE_CANNOT, cm_errmsg());
    return;
  }
  if (rc == CM_EBUSY && cm__engine_probe_busy_threads(A.eng) > 0) {
    /* Too many threads call CUDA for CUPTI to attach again: attached for this period, and the
     * next idle period probes again. */
    atomic_store(&A.idle_mode, CM_IDLE_BUSY);
    cm__alog_repeat(CM_LOG_INFO, "detaching CUPTI while idle: %s", cm_errmsg());
    return;
  }
  cm__alog_repeat(CM_LOG_INFO, "detaching CUPTI while idle: CUPTI stays attached for now: %s", cm_errmsg());
}

/* While nothing is traced (no observer, no PM consumer: a duty cycle between its windows, or a
 * monitor that selects nothing) the engine runs as a dormant agent's does: no flush or delivery
 * cadence, so its worker sleeps and makes no CUPTI call, and the pool's free buffers are freed.
 * The configured cadence (A.cfg) returns with the next observer. Control thread (or the
 * listener's between sessions). */
void cm__tracing_cadence_sync(void) {
  if (!A.eng) return;
  bool idle = A.nobs == 0 && A.npm == 0 && A.npm_wait == 0;
  if (idle == A.cadence_idle) return;
  cm_config c = A.cfg;
  if (idle) c.self_flush_ms = c.deliver_ms = 0;
  if (cm_configure(A.eng, &c) == 0) A.cadence_idle = idle;
  if (idle) {
    cm__engine_trim(A.eng);
    cm__tracing_detach_idle(false);
  }
}

/* Replaces the agent's observer with one for `sel` (NULL or empty: tracing stops). The new
 * observer is registered before the old one goes, so kinds in both are never toggled. Control
 * thread (or init thread before it starts). */
int cm__tracing_apply_selection(const cm_selection *sel) {
  int rc = 0;
  int old_n = A.nobs;
  uint32_t old_ids[MAX_OBSERVERS];
  memcpy(old_ids, A.obs_ids, sizeof old_ids);
  uint64_t before = cm__realtime_ns();
  if (sel && !cm__tracing_selection_empty(sel)) {
    uint32_t id = 0;
    rc = cm_observe(A.eng, sel, cm__frames_on_batch, NULL, &id);
    if (rc) {
      cm__alog_repeat(CM_LOG_ERROR, "cannot apply the selection: %s: %s (the previous one stays)",
                  cm_err_name(rc), cm_errmsg());
      INC(selects_failed, 1);
      /* An attach that outlasted its wait: this process's threads can hold cuptiSubscribe, so
       * once it has returned CUPTI is not detached again. */
      if (rc == CM_EAGAIN && A.eng && cm_cupti_detached(A.eng) &&
          atomic_load(&A.idle_mode) == CM_IDLE_DETACH)
        idle_mode_set(CM_IDLE_SLOW_ATTACH, "attaching CUPTI again took longer than its wait");
      return rc;
    }
    A.traced_selects++;
    A.obs_ids[0] = id;
    A.nobs = 1;
    atomic_store(&A.tracing, true);
  } else {
    A.nobs = 0;
    atomic_store(&A.tracing, false);
  }
  /* The edge of a window (select_prev_ns, select_last_ns): now, between enabling the new kinds and
   * disabling the old. Where this call enabled a kind, the edge is the moment it began to: a
   * launching thread that cuptiActivityEnable held meanwhile launches the work it was held from
   * once it returns, traced, so that time belongs to the window. The closing edge needs no such
   * care: the disable comes after it, and what it holds back runs untraced. */
  uint64_t stamp = cm__realtime_ns();
  if (A.nobs && A.eng) {
    uint64_t en = cm__engine_enable_start_ns(A.eng);
    if (en >= before && en < stamp) stamp = en;
  }
  for (int i = 0; i < old_n; i++) {
    int urc = cm_unobserve(A.eng, old_ids[i]);
    if (urc) alog(CM_LOG_WARN, "cm_unobserve(%u): %s", old_ids[i], cm_errmsg());
  }
  atomic_store(&A.select_prev_ns, GET(select_last_ns));
  atomic_store(&A.select_last_ns, stamp);
  INC(selects_applied, 1);
  cm__tracing_cadence_sync();
  return rc;
}

/* The lag guard. CUPTI can fall behind the launches for good: over a long run at a high launch
 * rate its own worker thread grows to a whole core, and the records it holds then grow the process
 * without bound (bench/RESULTS.md, "Memory under a long run"). Nothing the agent does downstream of
 * CUPTI bounds that memory: only tracing less does. Every check (a tenth of the limit, 20 ms to
 * 1 s) on which a buffer was decoded since the last, the guard measures how long CUPTI held records
 * back (cm__engine_take_lag_held_max: from a record's timestamp to CUPTI asking for the buffer it
 * then wrote the record into, for the kind most behind in a buffer, the largest over the buffers
 * decoded since the last check; a record waiting in a partly filled buffer does not count), and
 * guard.h's policy decides: over CUPTIMON_GUARD_LAG_MS (default 500; 0 turns the guard off) for
 * 3 checks in a row, CUPTI stops writing one group of kinds for the rest of the session (the API
 * records, then every other kind but kernels, then kernels), and a further step comes one limit
 * later at the earliest, and only if CUPTI is no less behind than at the last. The observer keeps
 * its selection (cm__engine_set_suppressed), so the records CUPTI had already written still
 * arrive, are sent, and the exit's fence still waits for them: nothing traced is dropped by the
 * shed. It never turns a kind back on: turning kinds off and on again under load makes CUPTI
 * fall further behind. Each step is logged, and STATS carries the kinds shed
 * (guard_shed), so the monitor says so. Control thread. */
bool cm__tracing_guard_armed(void) {
  return A.guard.limit_ns && A.eng && A.nobs > 0 && !atomic_load(&A.exiting) &&
         (cm__engine_enabled(A.eng) & ~A.guard.shed & cm__guard_cupti_kinds());
}

void cm__tracing_guard_tick(void) {
  if (!cm__tracing_guard_armed()) return;
  uint64_t now = cm__mono_ms();
  if (now < A.guard_next_ms) return;
  A.guard_next_ms = now + cm__guard_interval_ms(&A.guard);
  cm_stats st;
  memset(&st, 0, sizeof st);
  cm_stats_get(A.eng, &st);
  bool fresh = st.buffers_decoded != A.guard_decoded;
  A.guard_decoded = st.buffers_decoded;
  uint64_t lag = cm__engine_take_lag_held_max(A.eng);
  uint64_t bufs = cm__engine_cupti_buffers(A.eng);
  /* No buffer decoded since the last check: no new measure of the time CUPTI held records, and
   * nothing to judge unless CUPTI holds too many buffers (which is also how CUPTI looks when it
   * completes none). */
  if (!fresh && !(A.guard.buffers_limit && bufs > A.guard.buffers_limit)) return;
  if (fresh) atomic_store(&A.guard_held_ns, lag);
  uint64_t shed = A.guard.shed, wanted = cm__engine_enabled(A.eng);
  uint64_t add = cm__guard_check(&A.guard, now, lag, bufs, wanted);
  if (!add) return;
  /* How far behind CUPTI is: the time it held records, or, when it is its buffers that it holds,
   * the stage lag to their completion. */
  uint64_t behind = lag > st.lag_cupti_ns ? lag : st.lag_cupti_ns;
  char names[512];
  size_t len = 0;
  names[0] = 0;
  for (int k = 0; k < CM_KIND_MAX; k++) {
    if (!(add >> k & 1) || len >= sizeof names) continue;
    const char *nm = cm_kind_name(k);
    int w = snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", nm ? nm : "?");
    if (w > 0) len += (size_t)w;
  }
  atomic_store(&A.guard_shed, A.guard.shed);
  atomic_store(&A.guard_lag_ns, behind);
  INC(guard_sheds, 1);
  bool last = (wanted & ~A.guard.shed & cm__guard_cupti_kinds()) == 0;
  alog(CM_LOG_WARN, "CUPTI is %.1f s behind the application: it held records %.1f s before "
       "writing them (CUPTIMON_GUARD_LAG_MS=%llu) and holds %llu activity buffers "
       "(CUPTIMON_GUARD_BUFFERS=%llu), over a limit for %d checks in a row%s: tracing of %s stops "
       "for the rest of the session%s, so that what CUPTI holds stops growing",
       (double)behind / 1e9, (double)lag / 1e9, (unsigned long long)(A.guard.limit_ns / 1000000),
       (unsigned long long)bufs, (unsigned long long)A.guard.buffers_limit, CM_GUARD_CHECKS,
       shed ? ", and no less behind than at the last step" : "", names,
       last ? " (nothing is traced any more; CUPTI's partly filled buffers are flushed now)" : "");
  int rc = cm__engine_set_suppressed(A.eng, A.guard.shed);
  if (rc) alog(CM_LOG_ERROR, "the lag guard could not change the traced kinds: %s: %s",
               cm_err_name(rc), cm_errmsg());
  /* With nothing traced any more, CUPTI fills no buffer further: the records in its partly filled
   * ones would wait for the exit's fence, however long the run goes on.
   * One forced flush, on the decode worker, delivers them now. */
  if (last && !rc) cm__engine_flush_forced_async(A.eng);
  cm__frames_push_stats(); /* the monitor learns it now, not at the next batch */
}

/* The monitor has gone: nothing is traced, and CUPTI is detached whatever the duty cycle's rules
 * kept (cm__tracing_detach_idle), so that the process pays nothing for the monitor that left. */
void cm__tracing_off(void) {
  if (A.nobs > 0) {
    cm__tracing_apply_selection(NULL);
    alog(CM_LOG_INFO, "tracing is off");
  }
  cm__tracing_detach_idle(true);
}
