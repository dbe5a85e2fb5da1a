/*
 * listen.c: the dormant agent's listener (CUPTIMON_LISTEN=1; the contract is in listen.h and
 * docs/agent.md, "Dormant mode").
 *
 * Design note. InitializeInjection only creates a socket and a thread: it loads no libcupti,
 * enables no activity kind and no callback, so a dormant process runs as if uninjected. The
 * socket is "<pid>.sock" in the per-user rendezvous directory (cm_wire_listen_dir checks its
 * owner and mode). It is bound under a temporary name, made 0600, put to listening, and only then
 * renamed into place, so a monitor never finds a socket that refuses connections because it is
 * not listening yet (which the monitor would take for the stale socket of a dead process).
 *
 * The listener thread sleeps in poll() with no timeout on the socket and a wake-up pipe. For
 * each connection it reads the peer's credentials (SO_PEERCRED) before it reads a byte: only the
 * same uid (and root when CUPTIMON_LISTEN_ALLOW_ROOT=1) is served. A connection while a session
 * runs gets a BYE naming the attached monitor's pid and is closed: CUPTI allows one subscriber,
 * and this agent serves one monitor at a time. While attached, "<pid>.attached" holds the
 * monitor's pid, for `cuptimon-lua --list`.
 *
 * Every wait has a deadline: the handshake (CUPTIMON_HANDSHAKE_MS), the end of a session, and the
 * exit handler's wait for the session lock. No one peer holds the listener: a peer that has sent
 * nothing 250 ms into its handshake gives way as soon as another connection is waiting (the
 * monitor answers HELLO at once, a silent peer never), so a silent client cannot keep a real
 * `--attach` waiting behind it. The application never waits on any of it: only the
 * exit handler touches this file from an application thread, and it is bounded by the exit
 * budget.
 *
 * The agent is reached only through the callbacks it passed to cm__listen_start (listen.h):
 * this file calls no function of the agent's other files.
 *
 * Threads and locks: the listener thread; the exit handler (any thread that calls exit); the
 * agent's control thread (cm__listen_session_over). sess_mu serializes session changes (the
 * listener's begin and end) with the exit handler; it is taken before any of the agent's locks.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cm_agent.h"
#include "cuptimon_wire.h"
#include "listen.h"

#define L_ERROR CM_LOG_ERROR
#define L_WARN CM_LOG_WARN
#define L_INFO CM_LOG_INFO

enum { DEFAULT_HANDSHAKE_MS = 10000, END_MS = 15000, EXIT_WAIT_MS = 1000 };

static struct listener {
  pid_t pid;                   /* the process that listens (a forked child does not) */
  int fd;                      /* the listening socket */
  int wake[2];
  char dir[108], sock[160], marker[160];
  pthread_t thread;
  pthread_mutex_t sess_mu;     /* session changes, and the exit handler */
  uint32_t handshake_ms;
  uid_t uid;
  bool allow_root;
  long test_uid;               /* CUPTIMON_LISTEN_TEST_PEER_UID: the peer uid to pretend, or -1 */
  long test_over_delay_ms;     /* CUPTIMON_LISTEN_TEST_OVER_DELAY_MS (see cm__listen_session_over) */
  _Atomic bool on;             /* cm__listen_start succeeded */
  _Atomic bool exiting;
  _Atomic bool over;           /* the session's monitor is gone */
  _Atomic bool broken;         /* a session did not end cleanly: no more sessions */
  _Atomic int monitor_pid;     /* the attached monitor, 0 when dormant */
  cm__listen_ops ops;          /* the agent's session callbacks; set before the thread starts */
} L = {.fd = -1, .wake = {-1, -1}, .sess_mu = PTHREAD_MUTEX_INITIALIZER};

bool cm__listen_mode(void) { return atomic_load(&L.on); }

/* One log line through the agent's callback. */
static void say(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int level, const char *fmt, ...) {
  char msg[1280];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  L.ops.log(L.ops.ud, level, msg);
}

static void wake_listener(void) {
  if (L.wake[1] >= 0) {
    char c = 1;
    ssize_t w = write(L.wake[1], &c, 1);
    (void)w;
  }
}

/* The test hook CUPTIMON_LISTEN_TEST_OVER_DELAY_MS makes the control thread tell the listener
 * that late, as a loaded machine can, so a test can attach again in between. */
void cm__listen_session_over(void) {
  if (L.test_over_delay_ms > 0) {
    struct timespec d = {L.test_over_delay_ms / 1000, (L.test_over_delay_ms % 1000) * 1000000L};
    nanosleep(&d, NULL);
  }
  atomic_store(&L.over, true);
  wake_listener();
}

/* Reads a connection's credentials; -1 when they cannot be read. The test hook
 * CUPTIMON_LISTEN_TEST_PEER_UID replaces the uid (the pid stays the kernel's), so a test can
 * check the refusal of another user without a second account. */
static int peer_cred(int fd, pid_t *pid, uid_t *uid) {
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) return -1;
  *pid = cr.pid;
  *uid = L.test_uid >= 0 ? (uid_t)L.test_uid : cr.uid;
  return 0;
}

/* Writes one BYE(error) frame to a connection that is refused, without blocking. */
static void refuse(int fd, const char *msg) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  if (cm_wire_write_bye(&b, CM_WIRE_BYE_ERROR, -1, msg) == 0) {
    ssize_t w = send(fd, b.data, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
  }
  cm_wire_buf_free(&b);
}

static void write_marker(pid_t monitor) {
  int fd = open(L.marker, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  char s[32];
  int n = snprintf(s, sizeof s, "%d\n", (int)monitor);
  ssize_t w = write(fd, s, (size_t)n);
  (void)w;
  close(fd);
}

static uint64_t now_ms(void) { return cm__mono_ms(); }

/* Ends the running session (listener thread, or the exit handler's absence of one). sess_mu held. */
static void end_session_locked(void) {
  if (!L.ops.attached(L.ops.ud)) return;
  if (!L.ops.session_end(L.ops.ud, now_ms() + END_MS)) {
    atomic_store(&L.broken, true);
    say(L_ERROR, "dormant: the session's threads did not stop; no further attach is served");
  }
  unlink(L.marker);
  atomic_store(&L.monitor_pid, 0);
  say(L_INFO, "dormant: the monitor detached; tracing is off");
}

static void on_connection(int fd) {
  pid_t pid = 0;
  uid_t uid = (uid_t)-1;
  if (peer_cred(fd, &pid, &uid) != 0) {
    say(L_WARN, "dormant: refusing a connection: cannot read its credentials: %s",
        strerror(errno));
    close(fd);
    return;
  }
  if (uid != L.uid && !(uid == 0 && L.allow_root)) {
    say(L_WARN, "dormant: refusing a connection from uid %u (pid %d): only uid %u%s may "
        "attach", (unsigned)uid, (int)pid, (unsigned)L.uid,
        L.allow_root ? " and root" : "");
    close(fd);
    return;
  }
  /* The session's monitor may be gone before the control thread has told this thread so (a
   * monitor that detached and exited, and a new `--attach` at once): that session is over, so it
   * ends here, and the new monitor is served instead of refused. */
  int mon = atomic_load(&L.monitor_pid);
  if (L.ops.attached(L.ops.ud) && !atomic_load(&L.exiting) &&
      (L.ops.session_gone(L.ops.ud) || (mon > 0 && kill(mon, 0) != 0 && errno == ESRCH))) {
    say(L_INFO, "dormant: the attached monitor pid %d is gone; its session ends before pid "
        "%d is served", mon, (int)pid);
    pthread_mutex_lock(&L.sess_mu);
    if (!atomic_load(&L.exiting)) end_session_locked();
    pthread_mutex_unlock(&L.sess_mu);
    mon = atomic_load(&L.monitor_pid);
  }
  char msg[160];
  if (mon || L.ops.attached(L.ops.ud) || atomic_load(&L.broken) || atomic_load(&L.exiting)) {
    if (mon || L.ops.attached(L.ops.ud))
      snprintf(msg, sizeof msg, "already attached: the monitor pid %d is attached to this process "
               "(one monitor at a time)", mon);
    else
      snprintf(msg, sizeof msg, "this process %s", atomic_load(&L.exiting)
               ? "is exiting" : "cannot be attached again (a session did not end cleanly)");
    say(L_INFO, "dormant: refusing monitor pid %d: %s", (int)pid, msg);
    refuse(fd, msg);
    close(fd);
    return;
  }
  pthread_mutex_lock(&L.sess_mu);
  if (atomic_load(&L.exiting)) {
    pthread_mutex_unlock(&L.sess_mu);
    close(fd);
    return;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  atomic_store(&L.over, false);
  atomic_store(&L.monitor_pid, (int)pid);
  write_marker(pid);
  if (L.ops.session_begin(L.ops.ud, fd, now_ms() + L.handshake_ms, L.fd) != 0) {
    unlink(L.marker);
    atomic_store(&L.monitor_pid, 0);
  } else {
    say(L_INFO, "dormant: monitor pid %d attached", (int)pid);
  }
  pthread_mutex_unlock(&L.sess_mu);
}

static void *listener_main(void *arg) {
  pthread_setname_np(pthread_self(), "cm-listen");
  (void)arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  for (;;) {
    struct pollfd pf[2] = {{.fd = L.wake[0], .events = POLLIN}, {.fd = L.fd, .events = POLLIN}};
    /* No timeout: a dormant process's listener costs nothing until someone connects. */
    int n = poll(pf, 2, -1);
    if (atomic_load(&L.exiting)) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      say(L_ERROR, "dormant: poll failed: %s; no further attach is served", strerror(errno));
      break;
    }
    if (pf[0].revents) {
      char junk[64];
      ssize_t r = read(L.wake[0], junk, sizeof junk);
      (void)r;
    }
    if (atomic_exchange(&L.over, false)) {
      pthread_mutex_lock(&L.sess_mu);
      if (!atomic_load(&L.exiting)) end_session_locked();
      pthread_mutex_unlock(&L.sess_mu);
    }
    if (pf[1].revents & POLLIN) {
      int fd = accept4(L.fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) on_connection(fd);
      else if (errno == EMFILE || errno == ENFILE) usleep(100000); /* do not spin */
    }
  }
  return NULL;
}

/* The process exits: a session in progress gets the agent's exit work (the final fence, STATS and
 * BYE, within the exit budget); the socket and the marker are removed either way. The session
 * lock is awaited for at most EXIT_WAIT_MS (a handshake or a session end in progress), so the
 * exit never hangs on the listener. Not in a forked child. */
static void listen_exit_work(int exit_code) {
  if (getpid() != L.pid || !atomic_load(&L.on)) return;
  atomic_store(&L.exiting, true);
  unlink(L.sock);
  wake_listener();
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += EXIT_WAIT_MS / 1000;
  ts.tv_nsec += (EXIT_WAIT_MS % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  if (pthread_mutex_timedlock(&L.sess_mu, &ts) == 0) {
    if (L.ops.attached(L.ops.ud)) L.ops.exit(L.ops.ud, exit_code);
    pthread_mutex_unlock(&L.sess_mu);
  } else {
    say(L_WARN, "dormant: a session change was in progress at exit; leaving without the "
        "final flush");
  }
  unlink(L.marker);
}

#ifdef __GLIBC__
/* glibc's on_exit handlers receive the status given to exit(), which BYE carries. */
static void listen_on_exit(int status, void *arg) {
  (void)arg;
  listen_exit_work(status & 0xff);
}
#define REGISTER_LISTEN_EXIT() on_exit(listen_on_exit, NULL)
#else
static void listen_atexit(void) { listen_exit_work(-1); }
#define REGISTER_LISTEN_EXIT() atexit(listen_atexit)
#endif

/* In a forked child the listener thread does not exist and the socket is the parent's. */
static void listen_atfork_child(void) {
  atomic_store(&L.on, false);
  if (L.fd >= 0) close(L.fd);
  if (L.wake[0] >= 0) close(L.wake[0]);
  if (L.wake[1] >= 0) close(L.wake[1]);
  L.fd = L.wake[0] = L.wake[1] = -1;
}

static long env_long(const char *name, long def) {
  const char *s = getenv(name);
  if (!s || !*s) return def;
  char *end;
  long v = strtol(s, &end, 10);
  return *end || v < 0 ? def : v;
}

bool cm__listen_start(const cm__listen_ops *ops) {
  L.ops = *ops;
  L.pid = getpid();
  L.uid = geteuid();
  L.allow_root = env_long("CUPTIMON_LISTEN_ALLOW_ROOT", 0) == 1;
  L.test_uid = env_long("CUPTIMON_LISTEN_TEST_PEER_UID", -1);
  L.test_over_delay_ms = env_long("CUPTIMON_LISTEN_TEST_OVER_DELAY_MS", 0);
  if (L.test_over_delay_ms > 10000) L.test_over_delay_ms = 10000;
  long hs = env_long("CUPTIMON_HANDSHAKE_MS", DEFAULT_HANDSHAKE_MS);
  L.handshake_ms = hs >= 1 && hs <= 3600000 ? (uint32_t)hs : DEFAULT_HANDSHAKE_MS;
  char err[512];
  if (cm_wire_listen_dir(L.dir, sizeof L.dir, CM_WIRE_LISTEN_CREATE, err, sizeof err) != 0) {
    say(L_ERROR, "dormant: %s; not listening (the process runs untraced)", err);
    return false;
  }
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s/.%d.tmp", L.dir, (int)L.pid);
  snprintf(L.sock, sizeof L.sock, "%s/%d.sock", L.dir, (int)L.pid);
  snprintf(L.marker, sizeof L.marker, "%s/%d.attached", L.dir, (int)L.pid);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(L.sock) >= sizeof sa.sun_path) { /* cm_wire_listen_dir leaves room; a check still */
    say(L_ERROR, "dormant: %s is too long for a unix socket; not listening", L.sock);
    return false;
  }
  memcpy(sa.sun_path, tmp, strlen(tmp) + 1);
  unlink(tmp);
  unlink(L.marker);
  L.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (L.fd < 0 || bind(L.fd, (struct sockaddr *)&sa, sizeof sa) != 0 || chmod(tmp, 0600) != 0 ||
      listen(L.fd, 8) != 0 || rename(tmp, L.sock) != 0) {
    say(L_ERROR, "dormant: cannot listen on %s: %s; the process runs untraced", L.sock,
        strerror(errno));
    if (L.fd >= 0) close(L.fd);
    unlink(tmp);
    L.fd = -1;
    return false;
  }
  if (pipe2(L.wake, O_CLOEXEC | O_NONBLOCK) != 0 ||
      pthread_create(&L.thread, NULL, listener_main, NULL) != 0) {
    say(L_ERROR, "dormant: cannot start the listener thread; the process runs untraced");
    unlink(L.sock);
    close(L.fd);
    L.fd = -1;
    return false;
  }
  pthread_detach(L.thread);
  atomic_store(&L.on, true);
  pthread_atfork(NULL, NULL, listen_atfork_child);
  REGISTER_LISTEN_EXIT();
  say(L_INFO, "dormant: listening on %s", L.sock);
  return true;
}
