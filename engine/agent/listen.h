/*
 * listen.h: the dormant agent (CUPTIMON_LISTEN=1): the listener in listen.c, and the session
 * calls it makes into agent.c. docs/agent.md ("Dormant mode") has the user's view.
 *
 * A dormant agent loads nothing and traces nothing; a thread of listen.c sleeps in poll() on a
 * unix socket in the per-user rendezvous directory (cm_wire_listen_dir). A monitor that connects
 * (`cuptimon-lua --attach PID`) and passes the credential check starts a session: agent.c creates
 * the engine on the first one, sends HELLO and SCHEMA and applies the monitor's answer, exactly
 * as in live mode, and streams until the monitor goes away; then the session ends, every kind is
 * disabled, the pool drops to its idle size and the agent is dormant again.
 *
 * Threads: the listener thread calls cm__agent_session_begin and cm__agent_session_end, one at a
 * time, under the listener's session lock; the exit handler takes the same lock (with a
 * deadline) before it runs the agent's exit. agent.c's control thread calls
 * cm__listen_session_over when the monitor is gone.
 */
#ifndef CM_AGENT_LISTEN_H
#define CM_AGENT_LISTEN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- agent.c ---- */

/* One stderr line of the agent at a cm_log_level ("cuptimon-agent[pid]: level: ..."). */
void cm__alog(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Starts a session on the connected socket `fd` (blocking mode, owned from here on): the engine
 * (created on the first session), HELLO, SCHEMA, the monitor's answer until `deadline`
 * (monotonic ms), then the sender and control threads. Returns 0 when attached; otherwise the
 * descriptor is closed and the agent stays dormant. A peer that sends nothing within 250 ms
 * while a connection waits on `preempt_fd` (the listening socket; -1 for none) loses the
 * handshake: CM_EAGAIN, and the listener serves the next connection. */
int cm__agent_session_begin(int fd, uint64_t deadline, int preempt_fd);
/* Ends the session whose monitor is gone: stops and joins the session's threads (until
 * `deadline`), closes the socket, disables every kind, drops the pool's free buffers and restores
 * the dormant configuration. Returns false when a thread did not stop in time: the agent then
 * cannot start another session. */
bool cm__agent_session_end(uint64_t deadline);
/* Whether a session is running. */
bool cm__agent_attached(void);
/* Whether the running session's monitor is gone (its connection ended or broke), so that the
 * session is ending. */
bool cm__agent_session_gone(void);
/* The agent's exit work (the final fence, STATS and BYE) for a session in progress; `exit_code` is
 * the status given to exit(), or -1 when it is not known. */
void cm__agent_exit(int exit_code);

/* ---- listen.c ---- */

/* Creates the socket and starts the listener thread; returns false (logged) when it cannot, and
 * the process then runs untraced. Called once, from InitializeInjection. */
bool cm__listen_start(void);
/* Whether the agent runs dormant (cm__listen_start succeeded). */
bool cm__listen_mode(void);
/* The monitor of the running session is gone: wakes the listener to end the session. Any
 * thread. */
void cm__listen_session_over(void);

#endif /* CM_AGENT_LISTEN_H */
