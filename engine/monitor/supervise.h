/*
 * supervise.h: the command that cuptimon-lua monitors (`-- cmd args...`): spawn, signals, exit
 * status. Used by the hub (hub.c); implemented in supervise.c.
 *
 * Design note. The command is one child started with uv_spawn on the loop, its stdio inherited
 * and its environment the monitor's own plus a few variables that replace any of the same name
 * (the agent's injection variables). The supervisor knows the child's exit status (it reaped
 * it) and reports it once through a callback. Stopping follows the usual two steps: the first
 * stop forwards the signal and arms a grace timer (CUPTIMON_KILL_GRACE_MS, 3 s by default) after
 * which the child gets SIGKILL; cm__proc_kill sends SIGKILL at once.
 *
 * Threads: loop thread only. Ownership: the struct is embedded in its owner; cm__proc_close
 * closes its handles, and the owner frees it only after the loop has run their close callbacks.
 */
#ifndef CM_SUPERVISE_H
#define CM_SUPERVISE_H

#include <stdint.h>

#include <uv.h>

/* The command ended: `status` is its exit code, or 128 + the signal that killed it, or 127 (not
 * found) / 126 (cannot be run) when it never started. */
typedef void (*cm__proc_exit_fn)(void *ud, int status, int64_t exit_status, int term_signal);

typedef struct cm__proc {
  uv_loop_t *loop;
  uv_process_t proc;
  uv_timer_t kill_timer;
  int started, done, closed, timer_init;
  int status;
  cm__proc_exit_fn exit_fn;
  void *ud;
} cm__proc;

/* Initializes `p` (zeroed by the caller) on `loop`. */
void cm__proc_init(cm__proc *p, uv_loop_t *loop, cm__proc_exit_fn fn, void *ud);
/* Starts argv[0] with argv, stdio inherited, and the environment plus `setenv` ("NAME=VALUE"
 * strings, NULL-terminated, each replacing a variable of the same name). Returns 0, or the
 * status the command gets (127 or 126) after printing why it cannot run; the exit callback has
 * run then. */
int cm__proc_spawn(cm__proc *p, char **argv, const char *const *setenv);
/* Whether the command was started and has not exited yet. */
int cm__proc_running(const cm__proc *p);
/* The command's pid (0 before it started). */
int cm__proc_pid(const cm__proc *p);
/* Forwards `signum` and arms the SIGKILL grace timer. */
void cm__proc_stop(cm__proc *p, int signum);
/* Sends SIGKILL now. */
void cm__proc_kill(cm__proc *p);
/* Closes the handles (says so when the command is still running: it goes on untraced). */
void cm__proc_close(cm__proc *p);

#endif /* CM_SUPERVISE_H */
