/*
 * gate.h: the hub's handshake gate: a thread that accepts agent connections on the listening
 * socket, checks who is calling, reads and checks the HELLO and answers it, then hands the
 * connection to the loop thread. Used by hub.c; implemented in gate.c; tested alone by
 * engine/tests/test_gate.c.
 *
 * Design note. An agent's handshake runs inside the application's cuInit, so its answer must
 * never wait for the script: the loop thread runs Lua (a slow observer can hold it for seconds),
 * the gate thread never does. The gate answers from what the loop thread last published (the
 * union selection of every observer and the cadences); the loop thread corrects a stale answer
 * with a new SELECT or CONFIGURE when it attaches the connection.
 *
 * Before a connection is admitted it is held to a budget, in the manner of OpenSSH's
 * LoginGraceTime and MaxStartups: the peer's uid (SO_PEERCRED) must be ours; it must send a valid
 * HELLO within hello_timeout_ms; the HELLO frame may not declare more than hello_max_bytes; and
 * at most max_pending connections wait for their HELLO at once (a new one evicts the oldest, so
 * idle connections can never lock a real agent out, and descriptors stay bounded). The pid of an
 * admitted connection is the kernel's (SO_PEERCRED), never the HELLO's.
 *
 * Threads: cm__gate_publish, cm__gate_take and cm__gate_admitting may be called from any thread
 * (they take the gate's lock, `gate_mu`, which is a leaf: nothing else is locked under it).
 * Ownership: the caller owns the listening descriptor; an admitted connection's descriptor and
 * buffers belong to whoever takes it.
 */
#ifndef CM_GATE_H
#define CM_GATE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct cm__gate cm__gate;

/* Reads the peer's credentials of a connected unix socket: 0, or -errno. The default is
 * getsockopt(SO_PEERCRED); tests pass their own. */
typedef int (*cm__gate_cred_fn)(int fd, pid_t *pid, uid_t *uid);

typedef struct cm__gate_options {
  const char *token;         /* the run's token (compared in constant time) */
  uid_t uid;                 /* the only uid admitted */
  uint32_t hello_timeout_ms; /* the handshake deadline; 0: 5000 */
  uint32_t max_pending;      /* connections waiting for their HELLO at once; 0: 64 */
  uint32_t hello_max_bytes;  /* the cap on the HELLO frame's payload; 0: 512 KiB */
  cm__gate_cred_fn cred;     /* NULL: SO_PEERCRED */
  const char *select;        /* the first answer (copied), until cm__gate_publish: see there */
  uint32_t flush_ms, deliver_ms;
  /* Runs on the gate thread after a connection was admitted (the hub's uv_async_send). */
  void (*admitted)(void *ud);
  void *ud;
} cm__gate_options;

/* An admitted connection: HELLO_ACK 0 was sent on it. */
typedef struct cm__gate_conn {
  int fd;                     /* non-blocking */
  pid_t pid;                  /* from the kernel */
  uid_t uid;
  uint8_t *bytes;             /* the HELLO frame (header included), then any bytes read after it */
  size_t len;
  char *select;               /* the SELECT the gate sent */
  uint32_t flush_ms, deliver_ms; /* the CONFIGURE the gate sent (0: that item was not sent) */
} cm__gate_conn;

/* What the gate counted. */
typedef struct cm__gate_stats {
  uint64_t admitted, refused_uid, wrong_token, bad_hello, oversized, timed_out, evicted, eof;
  /* Connections closed in the middle of their HELLO (evicted or timed out with part of a frame
   * read): processes that were trying to connect and are not traced. The first pids are kept. */
  uint64_t lost;
  int32_t lost_pids[16];
} cm__gate_stats;

/* Starts the gate thread on `listen_fd` (a listening unix socket, made non-blocking here). */
int cm__gate_start(cm__gate **out, int listen_fd, const cm__gate_options *o);
/* What the next handshakes answer: SELECT `select` (text form; NULL is ""), and CONFIGURE with
 * the cadences that are not 0. Returns 0 or CM_ENOMEM. */
int cm__gate_publish(cm__gate *g, const char *select, uint32_t flush_ms, uint32_t deliver_ms);
/* Takes the oldest admitted connection: 1 with *out filled (release it with
 * cm__gate_conn_release, which does not close fd), 0 when there is none. */
int cm__gate_take(cm__gate *g, cm__gate_conn *out);
void cm__gate_conn_release(cm__gate_conn *c);
/* Connections being answered or admitted and not taken yet: the run must wait for them. */
int cm__gate_admitting(cm__gate *g);
/* Stops the thread and closes every connection not taken. Idempotent. */
void cm__gate_stop(cm__gate *g);
/* The counters (stable after cm__gate_stop). */
void cm__gate_get_stats(cm__gate *g, cm__gate_stats *out);
/* Stops the gate if needed and frees it; NULL is fine. */
void cm__gate_free(cm__gate *g);

/* Compares two NUL-terminated secrets in time independent of where they differ. */
int cm__gate_token_equal(const char *a, const char *b);

#endif /* CM_GATE_H */
