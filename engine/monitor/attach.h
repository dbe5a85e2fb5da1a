/*
 * attach.h: finding dormant agents (CUPTIMON_LISTEN=1) for `cuptimon-lua --list` and `--attach`.
 *
 * Design note. Dormant agents listen on "<pid>.sock" in the per-user rendezvous directory
 * (cm_wire_listen_dir, which also checks the directory's owner and mode); "<pid>.attached" holds
 * the pid of the monitor attached to it. A process killed without running its exit handlers
 * leaves its socket behind: every scan removes the sockets (and markers) of processes that no
 * longer exist, and a connection refused on a socket is taken for the same thing (the pid was
 * reused). Only sockets owned by this user, in a directory owned by this user, are looked at
 * (root's monitor may use another user's directory and sockets: attach.c).
 *
 * Used on the loop thread only; keeps no state between calls.
 */
#ifndef CM_ATTACH_H
#define CM_ATTACH_H

#include <stddef.h>
#include <stdio.h>

/* The rendezvous directory into dir (cap bytes): 0, or a CM_E* code after printing why (a
 * missing directory is CM_ENOENT, and prints nothing). */
int cm__attach_dir(char *dir, size_t cap);
/* The pids of the dormant agents in `dir`, ascending, into pids (at most cap); removes the stale
 * sockets and markers it finds, and says how many on stderr. Returns how many pids. */
int cm__attach_scan(const char *dir, int *pids, int cap);
/* Connects to the agent of `pid` and checks that the peer is that pid and this user. Returns a
 * non-blocking descriptor, or -1 with the reason in err (a stale socket is removed then). */
int cm__attach_connect(const char *dir, int pid, char *err, size_t errlen);
/* `cuptimon-lua --list`: prints the table of attachable processes to `out`; returns the exit
 * status (0, or 1 when the directory is refused). */
int cm__attach_list(FILE *out);
/* Parses "all" (returns 1, *n = 0) or "PID[,PID...]" (returns 0); -1 on a bad list, after
 * printing why. */
int cm__attach_parse(const char *spec, int *pids, int cap, int *n);

#endif /* CM_ATTACH_H */
