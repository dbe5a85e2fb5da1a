/*
 * hub.h: the internal interface between cuptimon-lua's command line (lua_main.c), the live-agent
 * hub (hub.c) and the capture replay (replay.c). Both move frames to wire sources (wsrc.h), which
 * say what the frames mean.
 *
 * Everything here runs on the loop thread. The hub is a process-wide singleton (the command line
 * has one loop and one host).
 */
#ifndef CM_HUB_H
#define CM_HUB_H

#include <stdint.h>
#include <stdio.h>

#include <uv.h>

#include "cuptimon.h"
#include "cuptimon_host.h"
#include "cuptimon_wire.h"

/* What the command line asks for beyond running a script in-process. */
typedef struct cm__main_request {
  char **cmd;           /* argv of the command after `--`, or NULL */
  int cmd_argc;
  const char **replay;  /* --replay FILE (repeatable), NULL-terminated, or NULL */
  int nreplay;
  const char *record;   /* --record FILE */
  int force;            /* --force: --record may replace existing regular files */
  const char *select;   /* --select SPEC: kinds traced in addition to the script's */
  int has_script;       /* 0 for --record with no script */
  const char *attach;   /* --attach PID[,PID...] or "all": dormant agents (attach.c) */
} cm__main_request;

/* Attaches the sources that serve `req` (a socket and the command, or the captures). Prints its
 * own message on failure and returns a CM_E* code; CM_EINVAL means a usage error. */
int cm__main_attach(cm_host *h, uv_loop_t *loop, const cm__main_request *req);
/* Starts the command (on the loop's next turn); called once the script has loaded. */
void cm__hub_start(void);
/* A signal arrived. Returns 1 when the hub handles it (it forwards SIGINT/SIGTERM to the
 * command and ends when the command does), 0 when the caller should end the script itself. */
int cm__hub_signal(int signum);
/* --attach: whether a named pid could not be attached (named on stderr); such a run fails with
 * status 1 even when the script chose 0 with cm.exit. */
int cm__hub_attach_failed(void);
/* Whether the hub has finished (the command exited and its agents are done, or every capture was
 * replayed), and then the exit status it proposes: the command's status or 128 + its signal. */
int cm__hub_finished(int *status);
/* The processes the gate closed in the middle of their HELLO (they are not traced), once the gate
 * has stopped: returns how many, and writes up to `max` of their pids. */
int cm__hub_lost_handshakes(int32_t *pids, int max);
/* The hub may finish on the BYE of the command's own process, before the process is reaped (its
 * CUDA teardown can take a few hundred ms): after the exit hooks, this runs the loop until the
 * supervisor has reaped it, so that cm__hub_finished gives the real status. Forwarded signals
 * and the kill grace timer work meanwhile. The script's handles must be closed by then. */
void cm__hub_wait_command(void);
/* Starts forwarding SIGINT and SIGTERM to the command when it is still to be reaped after the run
 * (the hub finished on its BYE): called as the run ends, before the run's own signal watchers
 * stop, so that no moment is left in which a signal takes its default action and kills
 * cuptimon-lua while the exit hooks run and the host is freed. A signal that comes then waits in
 * the loop and is forwarded by cm__hub_wait_command's turns (or the host's last ones), which
 * stops the watchers. Does nothing when the command is not pending. */
void cm__hub_forward_signals(void);
/* The host is about to be freed: the hub drops its pointer (and the host's live operations), so
 * that nothing after, cm__hub_wait_command and cm__hub_free included, reaches it; a process that
 * connects from then on is refused. */
void cm__hub_forget_host(void);

/* --attach: ends the attach window of every attached agent before the script's exit hooks run:
 * it sends SELECT "" (the agent disables every kind, delivering what it holds) and a sync FLUSH,
 * and runs the loop until each answered, went away, or 10 s passed; later flushes of those
 * agents complete at once. The agents go back to dormant when the connections close
 * (cm__hub_free). No-op in the other modes. */
void cm__hub_detach(void);
/* Prints the --record summaries, removes the socket directory, frees the hub. Idempotent;
 * safe when cm__main_attach was never called. */
void cm__hub_free(void);

/* ---- replay (replay.c) ---------------------------------------------------------------------- */

/* Opens the captures and starts replaying them from an idle handle. Returns 0 or a CM_E* code
 * after printing why (an unreadable file, or one that is not a capture). `finished` runs once
 * every capture is done, with status 1 when a capture yielded no frame at all, else 0. */
int cm__replay_start(cm_host *h, uv_loop_t *loop, const char *const *paths, int n,
                     void (*finished)(void *ud, int status), void *ud);
void cm__replay_free(void);

#endif /* CM_HUB_H */
