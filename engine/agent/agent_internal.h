/*
 * agent_internal.h: what the agent's files share: the agent's one state (A), and the calls
 * between its files. Nothing here leaves libcuptimon-agent.so (agent.map exports only the two
 * injection entry points).
 *
 * Design note. The agent is one object per process, and its files are its nouns: each owns the
 * fields of A that its comments name, and the lock or thread that guards a field is stated where
 * the field is declared (agent.c's design note has the threads and the lock order). Calls go one
 * way only, from the top of this list down, so no two files call into each other:
 *   agent.c          start-up and the entry points (InitializeInjection, InitializeInjectionNvtx2)
 *   dormant.c        dormant mode's sessions: the callbacks that listen.c runs them through
 *   exit.c           the exit handler, within its budget
 *   control_thread.c the control thread and the effects of the monitor's frames (control.c
 *                    parses and bounds them)
 *   handshake.c      HELLO and SCHEMA, HELLO_ACK, and the failure report
 *   tracing.c        what is traced: the engine's start, the selection, the idle cadence, CUPTI's
 *                    detach while idle, the lag guard's steps
 *   frames.c         the observer (BATCH), STRINGS and STATS
 *   sendq.c          the send queue, the sender thread and the connection's end
 *   log.c            the stderr log
 * with control.c, guard.c, repeat.c and listen.c below them all: they know the agent only through
 * their callback tables (cm__control_ops, cm__listen_ops) or not at all. The state itself is
 * defined in state.c, which calls nothing.
 */
#ifndef CM_AGENT_INTERNAL_H
#define CM_AGENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cm_agent.h"
#include "control.h"
#include "cuptimon_wire.h"
#include "guard.h"

enum {
  DEFAULT_DELIVER_MS = 200,
  MAX_OBSERVERS = 8,
  /* The grace a dormant agent's peer has to send its first byte before a waiting connection may
   * take the listener from it (listen.c). A monitor answers HELLO at once; a silent peer never. */
  PREEMPT_GRACE_MS = 250,
};

/* What the agent leaves CUPTI in while nothing is traced (STATS cupti_idle_mode; the monitor's
 * duty footer names it for each process). */
enum {
  CM_IDLE_DETACH = 1,        /* detached (cuptiFinalize) between windows: the default */
  CM_IDLE_SETTING = 2,       /* attached, as CUPTIMON_DETACH_IDLE=0 asks */
  CM_IDLE_SLOW_ATTACH = 3,   /* attached for good: attaching again outlasted the attach's wait */
  CM_IDLE_NVTX = 4,          /* attached for good: NVTX calls enter CUPTI */
  CM_IDLE_CANNOT = 5,        /* attached for good: no cuptiFinalize, or PM sampling used */
  CM_IDLE_SLOW_FINALIZE = 6, /* attached for good: a cuptiFinalize outlasted its deadline */
  CM_IDLE_BUSY = 7,          /* attached for now: too many threads were calling CUDA at once */
  CM_IDLE_GRAPHS = 8,        /* attached for good: the process uses CUDA graphs */
};

/* One queued frame: malloc'd bytes, handed from the producer to the sender. */
typedef struct qframe {
  struct qframe *next;
  uint8_t *data;
  size_t len;
  uint32_t records; /* records in a BATCH frame, 0 otherwise */
  bool batch;
  bool stats; /* a STATS frame: its counts describe the batches queued ahead of it */
  bool bye;   /* the exit's BYE frame: once it is written, the monitor has the process's end */
  uint64_t queued_ns; /* CLOCK_MONOTONIC when it was queued */
} qframe;

/* The agent's state, defined in state.c. Every file of the agent names it A. */
struct cm__agent {
  /* Written by the init thread before any agent thread starts, read-only afterwards. */
  pthread_mutex_t init_mu;
  bool initialized;
  _Atomic int level;   /* the stderr log threshold, a cm_log_level */
  pid_t pid;
  cm_engine *eng;
  int fd;              /* the monitor socket or the capture file, -1 when none */
  bool is_socket;
  int wake[2];         /* the control thread's wake-up pipe */
  cm_wire_reader *reader; /* the control stream; the handshake leaves buffered frames in it */
  pthread_t sender, control;
  bool sender_started, control_started;
  uint32_t handshake_ms;
  uint32_t exit_budget_ms; /* CUPTIMON_EXIT_BUDGET_MS: all the exit handler's work */
  uint32_t exit_flush_ms; /* CUPTIMON_EXIT_FLUSH_MS: the final fence's part of the budget */
  uint32_t exit_drain_ms; /* CUPTIMON_EXIT_DRAIN_MS: the queue's part of the budget */
  /* Dormant mode (listen.c): the configuration between sessions, the queue bound to restore, and
   * the engine's counters at the session's start (STATS counts from there, so that each
   * monitor's loss accounting covers its own attach window). Written by the listener thread
   * between sessions only. */
  cm_config idle_cfg;
  size_t def_max_bytes;
  cm_stats base;
  /* Set once InitializeInjectionNvtx2 has handed NVTX to CUPTI: NVTX calls then enter CUPTI,
   * which a detach would leave them calling. */
  _Atomic bool nvtx_injected;

  /* Control thread only (the init thread before it starts): the engine configuration, the
   * application of control frames, and the agent's observers. */
  cm_config cfg;
  cm__control ctl;
  uint32_t obs_ids[MAX_OBSERVERS];
  /* The PM sampling consumers the monitor asked for (control thread only), and the entries that
   * wait for their device's CUDA context (pm_retry), with a copy of their names, until
   * pm_wait_end (mono ms). */
  uint32_t pm_ids[CM__CTL_PM_ENTRIES];
  uint32_t npm;
  struct pm_wait {
    cm__pm_entry e;
    char *names;
  } pm_wait[CM__CTL_PM_ENTRIES];
  uint32_t npm_wait;
  /* True while the engine runs without its cadences because nothing is traced
   * (cm__tracing_cadence_sync). */
  bool cadence_idle;
  /* What CUPTI is left in while nothing is traced (cm__tracing_detach_idle; STATS
   * cupti_idle_mode): one of CM_IDLE_*, read by the sender for STATS. Written by the control
   * thread. */
  _Atomic int idle_mode;
  /* The selections that enabled kinds since the agent started: CUPTI is detached between windows
   * only from the second on (cm__tracing_detach_idle). Control thread. */
  uint32_t traced_selects;
  /* CUPTIMON_DETACH_MAX_THREADS: a detach is refused while this many threads call the CUDA
   * runtime at once (subscription.c, "the finalize helper"); 0 turns the probe off. */
  uint64_t detach_max_threads;
  uint64_t pm_wait_end;
  int nobs;
  /* The lag guard (cm__tracing_guard_tick; control thread only): its policy's state (guard.h; the
   * limit is CUPTIMON_GUARD_LAG_MS in ns, 0 when the guard is off); buffers_decoded at the last
   * check; when the next check is due (mono ms). */
  cm__guard guard;
  uint64_t guard_decoded, guard_next_ms;

  /* Guarded by send_mu: the send queue. */
  pthread_mutex_t send_mu;
  pthread_cond_t q_cv;     /* signals the sender: a frame, or a state change */
  pthread_cond_t idle_cv;  /* signals the exit handler: the queue ran empty or died */
  qframe *head, *tail;
  size_t q_bytes, q_frames;
  size_t max_bytes, max_frames;
  bool q_closed;           /* no more pushes (BYE was queued) */
  bool q_dead;             /* the descriptor failed: frames are freed, pushes refused */
  bool sender_stop;        /* the sender exits once the queue is empty */
  bool sending;            /* the sender holds a frame it has not finished writing */
  /* The BATCH frames queued so far, less those discarded unsent at exit: exactly the batches
   * ahead of the next STATS frame on the connection (records_queued / batches_queued). */
  uint64_t q_batches, q_records;

  /* Callback state: only cm__frames_on_batch touches it, and the engine serializes callbacks. */
  uint32_t cb_strings_sent; /* string ids below this were queued (id 0 is never sent) */
  uint64_t cb_last_seq;
  int32_t cb_last_kind;
  uint32_t cb_number;       /* the last BATCH frame number given (docs/wire.md: BATCH) */
  cm_wire_buf cb_buf;

  _Atomic bool active;     /* the agent runs: the exit handler has work to do */
  _Atomic bool gone;       /* the monitor or file failed: tracing goes off */
  _Atomic bool exiting;
  _Atomic bool ctl_stop;
  _Atomic bool tracing;    /* an observer is registered */
  _Atomic bool cut;        /* the exit deadline passed: what is still queued is dropped */
  _Atomic bool sender_drained; /* BYE was written whole: the sender wrote the exit's BYE frame */
  /* The exit's final flush was abandoned at its deadline, or cut short, so what CUPTI and the
   * decoder still held is not known (STATS exit_tail_unknown; the monitor reports the process as
   * incomplete). */
  _Atomic bool tail_unknown;
  /* Every record the observer received ends in exactly one of records_sent (or still queued),
   * records_dropped_agent (the queue was full, or the connection failed) and
   * records_dropped_exit (still queued when the exit deadline passed). */
  _Atomic uint64_t batches_sent, batches_dropped, records_dropped_agent, records_dropped_exit,
      records_sent, bytes_sent, frames_sent, strings_sent;
  /* The selections applied (SELECT frames, whatever their effect) and the CLOCK_REALTIME instants
   * of the last two, taken between registering the new observer (whose kinds are enabled by
   * then) and removing the old one (whose kinds are disabled first thing): a trigger window that
   * saw exactly two (its widening and its narrowing) traced its kinds for last - prev. Written
   * by the control thread, read for STATS. */
  _Atomic uint64_t selects_applied, select_last_ns, select_prev_ns;
  /* SELECTs the engine refused (cm__tracing_apply_selection): a window whose widening failed traced
   * nothing, and the monitor discards it. */
  _Atomic uint64_t selects_failed;
  /* How long the last BATCH frame sent had waited in the queue, and the peak (STATS). */
  _Atomic uint64_t send_wait_ns, send_wait_peak_ns;
  /* The kinds the lag guard stopped tracing for the rest of the session (one bit per kind), how
   * many times it shed, and CUPTI's lag when it last did (STATS guard_shed, guard_sheds,
   * guard_lag_ns). Written by the control thread. */
  _Atomic uint64_t guard_shed, guard_sheds, guard_lag_ns;
  /* The guard's measure at its last check (STATS lag_held_ns). */
  _Atomic uint64_t guard_held_ns;
  uint64_t cb_stats_ms; /* when cm__frames_on_batch last queued a STATS frame (callback state) */
};

extern struct cm__agent cm__agent;

#define INC(field, v) atomic_fetch_add_explicit(&A.field, (v), memory_order_relaxed)
#define GET(field) atomic_load_explicit(&A.field, memory_order_relaxed)

/* ---- log.c: the stderr log ------------------------------------------------------------------ */

/* One stderr line at a cm_log_level ("cuptimon-agent[pid]: level: ..."), written with a single
 * write(2), so lines of several threads (and of several processes sharing the terminal) do not
 * interleave. Any thread; never allocates. */
void cm__alog(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define alog cm__alog
/* cm__alog for a line that can come once a window, for as long as a run lasts (a refusal that
 * repeats): its repeats are counted and said once a minute at most. Any thread. */
void cm__alog_repeat(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the repeats of every line that were counted and not yet said. Any thread. */
void cm__alog_drain_repeats(void);
/* The engine's log callback (cm_set_log): the same stderr line, at the engine's level. */
void cm__alog_engine(void *ud, int level, const char *msg);
/* Sets the log threshold from CUPTIMON_AGENT_LOG; returns false when the value is not valid (the
 * threshold is then warn). */
bool cm__alog_init_level(void);
/* Sets the interval at which a repeating line is printed (CUPTIMON_AGENT_LOG_REPEAT_MS; 0 prints
 * every line). Init thread, at start-up. */
void cm__alog_set_repeat_ms(uint64_t ms);

/* ---- sendq.c: the send queue, the sender thread and the connection's end -------------------- */

/* Creates the queue's condition variables on CLOCK_MONOTONIC (the exit's waits on idle_cv have
 * monotonic deadlines). Init thread, once, before anything is queued. */
void cm__sendq_init(void);

/* Writes all of p[0..n). With deadline 0 it blocks (the sender, whose stalls the exit handler
 * ends by shutting the socket down); otherwise it polls and fails with ETIMEDOUT at the deadline.
 * Sockets use MSG_NOSIGNAL: a closed peer is EPIPE, never SIGPIPE. Returns 0 or an errno. */
int cm__sendq_write_all(int fd, bool sock, const uint8_t *p, size_t n, uint64_t deadline);
/* Counts BATCH frames that will never be sent: as an exit loss once the exit deadline has
 * passed, as the agent's loss (full queue, failed connection) before. Any thread. */
void cm__sendq_count_dropped(uint64_t batches, uint64_t records);
/* Appends f (filled in by the caller) to the queue. send_mu held. */
void cm__sendq_link_locked(qframe *f);
/* Hands the bytes of `b` to the queue and leaves `b` empty. A BATCH that cannot be queued (the
 * queue died or closed, no memory) is counted as dropped. Returns true when queued. Any thread;
 * never blocks beyond send_mu. */
bool cm__sendq_push_buf(cm_wire_buf *b, bool batch, uint32_t records);
/* Queues the exit's BYE frame, as cm__sendq_push_buf. */
bool cm__sendq_push_bye(cm_wire_buf *b);
/* Removes the BATCH and STATS frames still queued at the exit's drain deadline (sendq.c says
 * how they are counted). Returns the records; *batches receives the frames. send_mu held. */
uint64_t cm__sendq_purge_batches_locked(uint64_t *batches);
/* Wakes the control thread (its pipe). Any thread. */
void cm__sendq_wake_control(void);
/* The monitor (or the capture file) is gone: the queue dies and the control thread is woken to
 * switch tracing off. Any thread; idempotent. */
void cm__sendq_monitor_gone(const char *why);
/* The sender thread's body (pthread_create). */
void *cm__sendq_sender_main(void *arg);

/* ---- frames.c: the frames the agent writes while it streams --------------------------------- */

/* Queues a STATS frame with the engine's and the agent's counters, unless the queue is dead or
 * closed. Any thread that does not hold send_mu (it reads the engine's counters first, then takes
 * send_mu). */
void cm__frames_push_stats(void);
/* The agent's observer (cm_observe): encodes the batch into BATCH frames (and the strings they
 * need first) and queues them. Runs where the engine delivers, serialized by it. */
void cm__frames_on_batch(void *ud, const cm_batch *b);

/* ---- handshake.c: the handshake's frames ---------------------------------------------------- */

/* Appends HELLO (with `token`) and SCHEMA to `b`. */
int cm__handshake_hello_schema(cm_wire_buf *b, const char *token);
/* Reads monitor frames until HELLO_ACK or `deadline`, applying CONFIGURE and SELECT in order
 * (through A.ctl, which the caller starts). Returns the HELLO_ACK status, or CM_ETIMEDOUT,
 * CM_EIO, or CM_EAGAIN when a dormant agent's silent peer gives way (handshake.c). */
int32_t cm__handshake_await_ack(uint64_t deadline, int preempt_fd);
/* Writes BYE(error) after HELLO and SCHEMA, so a monitor or a capture reader learns that this
 * process exists but is not traced, and why. */
void cm__handshake_report_failure(const char *token, const char *why, uint64_t deadline,
                                  bool capture);

/* ---- tracing.c: what is traced -------------------------------------------------------------- */

/* Creates the engine with the default configuration and `deliver_ms`, and routes its log.
 * Returns 0, or a CM_E* code with the reason in why (A.eng stays NULL). */
int cm__tracing_start_engine(uint32_t deliver_ms, char *why, size_t cap);
/* Whether `sel` selects nothing. */
bool cm__tracing_selection_empty(const cm_selection *sel);
/* Replaces the agent's observer with one for `sel` (NULL or empty: tracing stops). Control
 * thread (or the init thread before it starts, or the listener's between sessions). */
int cm__tracing_apply_selection(const cm_selection *sel);
/* Detaches CUPTI while nothing is traced, where the rules allow; `leaving`: the monitor has
 * gone. Control thread, or the listener's between sessions. */
void cm__tracing_detach_idle(bool leaving);
/* Runs the engine without its cadences while nothing is traced, and with them again once
 * something is. Control thread (or the listener's between sessions). */
void cm__tracing_cadence_sync(void);
/* Whether the lag guard has something to watch, and its check when one is due. Control thread. */
bool cm__tracing_guard_armed(void);
void cm__tracing_guard_tick(void);
/* The monitor has gone: nothing is traced, and CUPTI is detached. Control thread. */
void cm__tracing_off(void);

/* ---- control_thread.c: the control thread --------------------------------------------------- */

/* Starts A.ctl over the configuration in force, with the agent's effects (cm__control_ops). The
 * thread that then owns A.ctl: the init thread or the listener during the handshake, then the
 * control thread. */
void cm__control_thread_init(void);
/* Starts the session's threads: the sender (sendq.c) and the control thread, with the control
 * thread's wake-up pipe first. Returns 0, or -1 (logged) when one could not start. */
int cm__control_thread_start(void);

/* ---- exit.c: the exit --------------------------------------------------------------------- */

/* Registers the exit handler (on_exit with glibc, atexit elsewhere). Init thread. */
void cm__exit_register(void);
/* The exit's work (the final fence, the last frames, STATS and BYE, within the exit budget);
 * `exit_code` is the status given to exit(), or -1 when it is not known. In a forked child, or
 * when the agent is not active, it does nothing. */
void cm__exit_work(int exit_code);
/* Joins `t` unless `deadline` (mono ms) passes first; then the thread is left behind, logged, and
 * it returns false. */
bool cm__exit_join(pthread_t t, const char *name, uint64_t deadline);

/* ---- dormant.c: dormant mode's sessions ----------------------------------------------------- */

/* Starts the listener (listen.c) with the session callbacks; false (logged) when it cannot, and
 * the process then runs untraced. Init thread, once. */
bool cm__dormant_start(void);

/* Last, so that no header above sees the short name. */
#define A cm__agent

#endif /* CM_AGENT_INTERNAL_H */
