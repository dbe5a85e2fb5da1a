/*
 * listen.h: the dormant agent (CUPTIMON_LISTEN=1): the listener in listen.c, and the callbacks
 * through which it runs the agent's sessions (dormant.c implements them). docs/agent.md ("Dormant
 * mode") has the user's view.
 *
 * A dormant agent loads nothing and traces nothing; a thread of listen.c sleeps in poll() on a
 * unix socket in the per-user rendezvous directory (cm_wire_listen_dir). A monitor that connects
 * (`cuptimon-lua --attach PID`) and passes the credential check starts a session: the agent
 * creates the engine on the first one, sends HELLO and SCHEMA and applies the monitor's answer,
 * exactly as in live mode, and streams until the monitor goes away; then the session ends, every
 * kind is disabled, the pool drops to its idle size and the agent is dormant again.
 *
 * listen.c knows the agent only through cm__listen_ops, as control.c knows it through
 * cm__control_ops: the agent calls into listen.c, never the other way.
 *
 * Threads: the listener thread calls session_begin and session_end, one at a time, under the
 * listener's session lock; the exit handler takes the same lock (with a deadline) before it calls
 * exit. The agent's control thread calls cm__listen_session_over when the monitor is gone.
 */
#ifndef CM_AGENT_LISTEN_H
#define CM_AGENT_LISTEN_H

#include <stdbool.h>
#include <stdint.h>

/* The agent's side of a session. `ud` is passed back. Every member must be set. */
typedef struct cm__listen_ops {
  void *ud;
  /* Starts a session on the connected socket `fd` (blocking mode, owned from here on): the engine
   * (created on the first session), HELLO, SCHEMA, the monitor's answer until `deadline`
   * (monotonic ms), then the sender and control threads. Returns 0 when attached; otherwise the
   * descriptor is closed and the agent stays dormant. A peer that sends nothing within 250 ms
   * while a connection waits on `preempt_fd` (the listening socket; -1 for none) loses the
   * handshake: CM_EAGAIN, and the listener serves the next connection. */
  int (*session_begin)(void *ud, int fd, uint64_t deadline, int preempt_fd);
  /* Ends the session whose monitor is gone: stops and joins the session's threads (until
   * `deadline`), closes the socket, disables every kind, drops the pool's free buffers and
   * restores the dormant configuration. Returns false when a thread did not stop in time: the
   * agent then cannot start another session. */
  bool (*session_end)(void *ud, uint64_t deadline);
  /* Whether a session is running. */
  bool (*attached)(void *ud);
  /* Whether the running session's monitor is gone (its connection ended or broke), so that the
   * session is ending. */
  bool (*session_gone)(void *ud);
  /* The agent's exit work (the final fence, STATS and BYE) for a session in progress;
   * `exit_code` is the status given to exit(), or -1 when it is not known. */
  void (*exit)(void *ud, int exit_code);
  /* One log line at a cm_log_level. */
  void (*log)(void *ud, int level, const char *msg);
} cm__listen_ops;

/* Creates the socket and starts the listener thread, which runs sessions through `ops` (copied);
 * returns false (logged) when it cannot, and the process then runs untraced. Called once, at
 * start-up. */
bool cm__listen_start(const cm__listen_ops *ops);
/* Whether the agent runs dormant (cm__listen_start succeeded). Any thread. */
bool cm__listen_mode(void);
/* The monitor of the running session is gone: wakes the listener to end the session. Any
 * thread. */
void cm__listen_session_over(void);

#endif /* CM_AGENT_LISTEN_H */
