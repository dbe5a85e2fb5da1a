/*
 * hub.c: the live-agent hub of cuptimon-lua: `cuptimon-lua script.lua -- cmd args...` and
 * `cuptimon-lua --record FILE -- cmd`.
 *
 * Design note. The hub creates a private 0700 directory (mkdtemp) holding a 0600 unix socket,
 * and a per-run token of 128 random bits. It starts the command (supervise.c) with the injection
 * variables of the agent contract: CUDA_INJECTION64_PATH and NVTX_INJECTION64_PATH name
 * libcuptimon-agent.so, CUPTIMON_SOCKET and CUPTIMON_TOKEN say where and how to connect. Every
 * CUDA process of the job (children included: they inherit the environment) connects.
 *
 * Handshakes are the gate's (gate.c), a thread of their own: the agent waits for the answer
 * inside the application's cuInit, and the loop thread may be busy in the script for seconds.
 * The gate checks the peer's uid (SO_PEERCRED), reads only the HELLO (capped before the peer is
 * authenticated), compares the token in constant time, and answers CONFIGURE (when the script set
 * cadences), SELECT (the union of every observer's selection, plus --select) and HELLO_ACK from
 * what this file last published (publish(): at start and on every tick); idle or hostile
 * connections are closed by its deadline and its cap and never reach this file. An admitted
 * connection comes here through a uv_async and becomes an agent connection (conn.c: its frames,
 * its flushes, its end), under the run's caps on connections and on partly received frames.
 *
 * The end: when the command exits, the hub waits (at most CUPTIMON_DRAIN_MS, 5 s by default) for
 * the connected agents (and those the gate has admitted but this file has not taken yet) to send
 * BYE or close, then stops the loop; cuptimon-lua then runs the final flush and the script's exit
 * hooks and exits with the command's status (128 + signal when a signal killed it). The command's
 * own process reports that status in process_exit: when its agent says BYE first, its detach
 * waits (at most 2 s) for the status the supervisor reaps, unless the BYE carries the status the
 * process gave exit() (the agent's exit handler knows it on glibc). Then process_exit runs at
 * once and, when no other agent is connected, so does the end: the script's exit hooks print
 * their tables while the process is still tearing down CUDA (which can take a few hundred ms),
 * and cuptimon-lua reaps it afterwards (cm__hub_wait_command) for its own exit status. SIGINT and
 * SIGTERM are forwarded to the command, followed by SIGKILL after a grace period
 * (CUPTIMON_KILL_GRACE_MS, 3 s by default); a second signal sends SIGKILL at once.
 *
 * --record: the hub creates the recorder (record.c), and each connection writes its process's
 * capture (conn.c). The script's trigger windows (cm.window) and budgets reach a live process
 * through the host's live operations (cm__live_ops), installed here: they find the connection of
 * a source and act on it (conn.c, window.c).
 *
 * --attach (dormant agents, attach.c): there is no command, socket or gate. The hub connects to
 * each agent's own socket instead (`all`: every one in the rendezvous directory, and new ones as
 * they appear, seen through a uv_fs_event on the directory); the agent sends HELLO and SCHEMA and
 * the connection answers CONFIGURE, SELECT and HELLO_ACK itself (the agent waits on its listener
 * thread, never in the application's cuInit, so the loop may answer). From there a connection is
 * the same as an agent's that connected: same frames, same wire source, same process events. A
 * BYE before HELLO is the agent's refusal (another monitor is attached: its message names that
 * monitor's pid). The window ends with cm__hub_detach: SELECT "" and a sync FLUSH, so every
 * record the agent held is delivered before the exit hooks; closing the connection then sends
 * the agent back to dormant. With a list of pids the run ends when every one has gone; with
 * `all`, at Control-C (status 0) or cm.exit().
 *
 * Threads: the loop thread, and the gate's thread, which shares only the gate's locked state
 * (gate.h). Ownership: the hub is a singleton owned by lua_main.c through cm__main_attach and
 * cm__hub_free; a connection is freed in its pipe's close callback, after the host has detached
 * its source (conn.c), which then tells the hub through its conn_gone hook: the calls between
 * the two files go one way, from here to conn.c.
 */
#include <errno.h>
#include <time.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <sys/socket.h>

#include "attach.h"
#include "env.h"
#include "gate.h"
#include "host_source.h"
#include "hub.h"
#include "hub_internal.h"
#include "record.h"
#include "supervise.h"
#include "wsrc.h"

/* How long an --attach waits for the agent's HELLO: the agent's listener gives way to a waiting
 * connection within 250 ms of a silent peer (listen.c), and the first attach starts CUPTI. A
 * pid whose HELLO does not come in time is named and fails the run (status 1). */
enum { ATTACH_HELLO_MS = 10000 };

/* ATTACH_HELLO_MS, or CUPTIMON_ATTACH_HELLO_MS (1 to 600000) for tests. */
static long attach_hello_ms(void) {
  const char *s = getenv("CUPTIMON_ATTACH_HELLO_MS");
  char *end;
  long v = s && *s ? strtol(s, &end, 10) : 0;
  return s && *s && !*end && v >= 1 && v <= 600000 ? v : ATTACH_HELLO_MS;
}

static cm__hub *g_hub;

/* ---- the end --------------------------------------------------------------------------------- */

/* Stops accepting: the gate thread ends and closes every connection that has not completed its
 * handshake (idle ones are not agents: they neither delay the end nor get a message each). */
static void stop_gate(cm__hub *hb) {
  cm__conn_log_flush(hb);
  if (hb->gate && !hb->gate_summary_done) {
    hb->gate_summary_done = 1; /* stop_gate runs at the end and again at the free: one summary */
    cm__gate_stop(hb->gate);
    cm__gate_stats st;
    cm__gate_get_stats(hb->gate, &st);
    hb->gate_lost = st;
    uint64_t closed = st.refused_uid + st.wrong_token + st.bad_hello + st.oversized +
                      st.timed_out + st.evicted;
    if (hb->over_budget || hb->over_cap)
      fprintf(stderr, "cuptimon-lua: %llu agent connections were closed over the budget of %llu "
              "MiB for partly received frames, %llu over the cap of %u connections per run\n",
              (unsigned long long)hb->over_budget, (unsigned long long)(hb->partial_budget >> 20),
              (unsigned long long)hb->over_cap, hb->max_conns);
    if (closed > 3)
      fprintf(stderr, "cuptimon-lua: %llu connections were refused or closed before their "
              "handshake (%llu another uid, %llu wrong token, %llu bad HELLO, %llu oversized, "
              "%llu timed out, %llu over the cap)\n", (unsigned long long)closed,
              (unsigned long long)st.refused_uid, (unsigned long long)st.wrong_token,
              (unsigned long long)st.bad_hello, (unsigned long long)st.oversized,
              (unsigned long long)st.timed_out, (unsigned long long)st.evicted);
  }
  if (hb->listen_fd >= 0) {
    close(hb->listen_fd);
    hb->listen_fd = -1;
  }
}

static void stop_watch(cm__hub *hb);

static void finish(cm__hub *hb) {
  if (hb->finished) return;
  hb->finished = 1;
  if (hb->attach) {
    /* The connections stay: cm__hub_detach ends their windows after the loop. */
    stop_watch(hb);
    uv_stop(hb->loop);
    return;
  }
  stop_gate(hb);
  /* Agents still connected after the drain period are cut off (their processes run on). */
  for (cm__conn *c = hb->conns; c; c = c->next) {
    if (c->await_status) {
      cm__conn_detach_now(c);
    } else if (c->state != CM__CONN_CLOSING) {
      cm__conn_log(hb, "cuptimon-lua: agent pid %u is still connected after the command ended; "
                 "closing its connection\n", c->w.pid);
      cm__conn_end(c, CM__END_TIMEOUT);
    }
  }
  uv_timer_stop(&hb->drain_timer);
  uv_timer_stop(&hb->tick_timer);
  uv_stop(hb->loop);
}

/* Agents the end waits for: connected ones, and those the gate has answered but the loop has
 * not taken yet. */
static int live_conns(cm__hub *hb) {
  int n = hb->gate ? cm__gate_admitting(hb->gate) : 0;
  for (cm__conn *c = hb->conns; c; c = c->next)
    if (c->state != CM__CONN_CLOSING) n++;
  return n;
}

static void drain_cb(uv_timer_t *t) { finish(t->data); }

/* The command is done: finish once its agents are, or after the drain period. A command whose
 * own process said BYE with its exit status is done too, as far as the script is concerned,
 * when no other agent is connected; the drain period starts only with the reap. */
static void maybe_finish(cm__hub *hb) {
  if (hb->finished) return;
  if (!hb->proc_done) {
    if (hb->cmd_exiting && live_conns(hb) == 0) finish(hb);
    return;
  }
  if (live_conns(hb) == 0) {
    finish(hb);
    return;
  }
  if (!uv_is_active((uv_handle_t *)&hb->drain_timer))
    uv_timer_start(&hb->drain_timer, drain_cb, cm__env_u64("CUPTIMON_DRAIN_MS", 5000), 0);
}

/* A connection was freed (conn.c): with a list of pids, the run ends when the last one has
 * gone; after the command, the end may come now. */
static void conn_gone(cm__hub *hb) {
  if (hb->attach && !hb->attach_all && !hb->conns && !hb->detach_pending) finish(hb);
  maybe_finish(hb);
}

/* ---- the host's live operations -------------------------------------------------------------- */

/* The live connection whose source is `s`, or NULL (a replay, the in-process engine, an ended
 * process). */
static cm__conn *conn_of(cm_source *s) {
  if (!g_hub) return NULL;
  for (cm__conn *c = g_hub->conns; c; c = c->next)
    if (&c->w.base == s) return c->state == CM__CONN_ACTIVE && c->w.attached ? c : NULL;
  return NULL;
}

static int live_shed(cm_source *s, uint64_t kinds) {
  cm__conn *c = conn_of(s);
  if (!c) return CM_ESTATE;
  cm__wsrc_set_shed(&c->w, kinds);
  return 0;
}

static int live_window_begin(cm_source *s, const char *path, int force, cm__window_done_fn done,
                             void *ud) {
  cm__conn *c = conn_of(s);
  if (!c) return CM_ESTATE;
  return cm__conn_window_begin(c, path, force, done, ud);
}

static int live_window_end(cm_source *s) {
  cm__conn *c = conn_of(s);
  if (!c) return CM_ENOENT;
  return cm__conn_window_end(c);
}

/* Whether this run takes live agents (`-- cmd` or --attach), not a replay. */
static int live_agents(void) { return g_hub && (g_hub->live || g_hub->attach); }

/* Whether the command could not be started: cm__proc_spawn failed (printing why), so it never
 * ran. A signal before the start (cm__hub_signal) is not such a failure. */
static int live_command_failed(void) {
  return g_hub && g_hub->live && g_hub->proc.done && !g_hub->proc.started;
}

static const cm__live_ops live_ops = {
    .shed = live_shed, .window_begin = live_window_begin, .window_end = live_window_end,
    .agents = live_agents, .command_failed = live_command_failed,
};

/* ---- admission and the tick ------------------------------------------------------------------ */

static void admit_cb(uv_async_t *a) {
  cm__hub *hb = a->data;
  cm__gate_conn gc;
  while (hb->gate && cm__gate_take(hb->gate, &gc)) {
    if (hb->finished) {
      close(gc.fd);
    } else if ((uint32_t)hb->nconns >= hb->max_conns) {
      /* The token is readable in a traced process's environment: a cap on the connections that
       * present it bounds what one leak of it can open. */
      if (hb->over_cap++ < 3)
        fprintf(stderr, "cuptimon-lua: agent pid %d: over the cap of %u connections per run "
                "(CUPTIMON_MAX_AGENTS); closing its connection\n", (int)gc.pid, hb->max_conns);
      close(gc.fd);
    } else {
      cm__conn_admit(hb, &gc);
    }
    cm__gate_conn_release(&gc);
  }
}

/* Runs on the gate thread. */
static void gate_admitted(void *ud) { uv_async_send(&((cm__hub *)ud)->admit_async); }

/* Publishes to the gate what a new agent's handshake must answer, when it changed. */
static void publish(cm__hub *hb) {
  if (!hb->gate) return;
  char *u = cm__conn_union(hb);
  if (!u) return;
  if (hb->published && strcmp(u, hb->published) == 0 && hb->pub_flush_ms == hb->flush_ms &&
      hb->pub_deliver_ms == hb->deliver_ms) {
    free(u);
    return;
  }
  if (cm__gate_publish(hb->gate, u, hb->flush_ms, hb->deliver_ms) == 0) {
    free(hb->published);
    hb->published = u;
    hb->pub_flush_ms = hb->flush_ms;
    hb->pub_deliver_ms = hb->deliver_ms;
  } else {
    free(u);
  }
}

/* Completes flushes whose deadline passed (an agent that stopped answering), ends the wait for
 * an exit status that does not come, and keeps the gate's answer current. */
static void tick_cb(uv_timer_t *t) {
  cm__hub *hb = t->data;
  uint64_t now = uv_now(hb->loop);
  publish(hb);
  for (cm__conn *c = hb->conns; c; c = c->next)
    if (c->await_status && c->await_deadline <= now) {
      cm__conn_detach_now(c);
      break; /* the list may have changed; the next tick goes on */
    }
  for (cm__conn *c = hb->conns; c; c = c->next)
    if (c->outward && !c->w.have_hello && c->state == CM__CONN_ACTIVE && c->hello_deadline <= now) {
      char why[160];
      snprintf(why, sizeof why, "no HELLO within %ld ms (the process is stopped, or its agent's "
               "listener is not answering)", attach_hello_ms());
      cm__conn_attach_failed(hb, c, why);
      c->state = CM__CONN_CLOSING;
      cm__conn_close(c);
      break;
    }
  for (cm__conn *c = hb->conns; c; c = c->next)
    for (int i = 0; i < c->nflush; i++)
      if (c->flushes[i].deadline <= now) {
        cm__conn_log(hb, "cuptimon-lua: agent pid %u did not answer a flush in time\n", c->w.pid);
        cm__conn_flush_complete(c, i, CM_ETIMEDOUT);
        i = -1; /* the done may have changed the list */
      }
}

/* ---- the command ----------------------------------------------------------------------------- */

static void proc_exit(void *ud, int status, int64_t exit_status, int term_signal) {
  cm__hub *hb = ud;
  (void)exit_status, (void)term_signal;
  hb->proc_done = 1;
  hb->cmd_status = status;
  if (hb->cmd_exiting && status != hb->bye_status)
    fprintf(stderr, "cuptimon-lua: the command ended with status %d after its agent reported %d "
            "(process_exit has %d): it failed or was stopped while tearing down\n", status,
            hb->bye_status, hb->bye_status);
  int pid = cm__proc_pid(&hb->proc);
  for (cm__conn *c = hb->conns; c; c = c->next)
    if (c->kpid == pid && c->w.attached) cm__conn_set_status(c, status);
  for (int again = 1; again;) { /* a detach runs Lua, which may change the list */
    again = 0;
    for (cm__conn *c = hb->conns; c; c = c->next)
      if (c->await_status) {
        cm__conn_detach_now(c);
        again = 1;
        break;
      }
  }
  maybe_finish(hb);
}

/* Where an installed cuptimon-lua finds the installed agent, relative to its own directory (the
 * build sets it from the install's bin and lib directories). */
#ifndef CM__AGENT_RELDIR
#define CM__AGENT_RELDIR "../lib"
#endif

static int find_agent(cm__hub *hb) {
  const char *env = getenv("CUPTIMON_AGENT");
  if (env && *env) {
    if (access(env, R_OK) != 0) {
      fprintf(stderr, "cuptimon-lua: CUPTIMON_AGENT=%s: %s\n", env, strerror(errno));
      return CM_ENOENT;
    }
    if (!realpath(env, hb->agent)) snprintf(hb->agent, sizeof hb->agent, "%s", env);
    return 0;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) n = 0;
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (slash) *slash = 0;
  char a[PATH_MAX + 64], b[PATH_MAX + 64];
  snprintf(a, sizeof a, "%s/libcuptimon-agent.so", exe);
  snprintf(b, sizeof b, "%s/" CM__AGENT_RELDIR "/libcuptimon-agent.so", exe);
  const char *found = access(a, R_OK) == 0 ? a : access(b, R_OK) == 0 ? b : NULL;
  if (!found) {
    fprintf(stderr,
            "cuptimon-lua: cannot find the agent library libcuptimon-agent.so (looked for %s and "
            "%s); set CUPTIMON_AGENT to its path\n", a, b);
    return CM_ENOENT;
  }
  if (!realpath(found, hb->agent))
    snprintf(hb->agent, sizeof hb->agent, "%.*s", (int)sizeof hb->agent - 1, found);
  return 0;
}

static void spawn_cb(uv_timer_t *t) {
  cm__hub *hb = t->data;
  char v[4][PATH_MAX + 64];
  snprintf(v[0], sizeof v[0], "CUDA_INJECTION64_PATH=%s", hb->agent);
  snprintf(v[1], sizeof v[1], "NVTX_INJECTION64_PATH=%s", hb->agent);
  snprintf(v[2], sizeof v[2], "CUPTIMON_SOCKET=%s", hb->sock);
  snprintf(v[3], sizeof v[3], "CUPTIMON_TOKEN=%s", hb->token);
  const char *env[] = {v[0], v[1], v[2], v[3], NULL};
  cm__proc_spawn(&hb->proc, hb->cmd, env);
}

/* ---- the interface to lua_main.c ------------------------------------------------------------- */

static int make_token(char out[33]) {
  unsigned char r[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return CM_EIO;
  ssize_t got = read(fd, r, sizeof r);
  close(fd);
  if (got != (ssize_t)sizeof r) return CM_EIO;
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
  return 0;
}

/* Removes the private directories that monitors killed with SIGKILL left in `base`: a
 * "cuptimon-XXXXXX" directory of ours (not a symlink, mode 0700) whose agent.sock, older than
 * STALE_S seconds, refuses connections (no monitor listens on it). Nothing else is touched: the
 * rmdir fails when the directory holds anything more. */
enum { STALE_S = 10 };

static void remove_stale_dirs(const char *base) {
  DIR *d = opendir(base);
  if (!d) return;
  struct dirent *e;
  time_t now = time(NULL);
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, "cuptimon-", 9) != 0 || strlen(e->d_name) != 15) continue;
    char dir[PATH_MAX], sock[PATH_MAX + 16];
    struct stat st;
    if (snprintf(dir, sizeof dir, "%s/%s", base, e->d_name) >= (int)sizeof dir) continue;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 0777) != 0700)
      continue;
    snprintf(sock, sizeof sock, "%s/agent.sock", dir);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(sock) >= sizeof sa.sun_path || lstat(sock, &st) != 0 || !S_ISSOCK(st.st_mode) ||
        st.st_uid != geteuid() || now - st.st_mtime < STALE_S)
      continue;
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int refused = connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno == ECONNREFUSED;
    close(fd);
    if (!refused) continue;
    if (unlink(sock) == 0 && rmdir(dir) == 0)
      fprintf(stderr, "cuptimon-lua: removed %s, left by a monitor that was killed\n", dir);
  }
  closedir(d);
}

static int make_socket(cm__hub *hb) {
  const char *tmp = getenv("TMPDIR");
  remove_stale_dirs(tmp && *tmp ? tmp : "/tmp");
  for (int attempt = 0; attempt < 2; attempt++) {
    const char *base = attempt == 0 && tmp && *tmp ? tmp : "/tmp";
    snprintf(hb->dir, sizeof hb->dir, "%s/cuptimon-XXXXXX", base);
    /* A unix socket path holds at most 107 bytes: fall back to /tmp for a long TMPDIR. */
    if (strlen(hb->dir) + 16 >= sizeof(((struct sockaddr_un *)0)->sun_path)) continue;
    if (!mkdtemp(hb->dir)) { /* mkdtemp makes it 0700 */
      if (attempt == 0) continue;
      fprintf(stderr, "cuptimon-lua: cannot create a private directory in %s: %s\n", base,
              strerror(errno));
      hb->dir[0] = 0;
      return CM_EIO;
    }
    /* Copied, not formatted: the length was checked above, which a compiler cannot see
     * through snprintf (it warned that the output may be truncated). */
    size_t dlen = strlen(hb->dir);
    memcpy(hb->sock, hb->dir, dlen);
    memcpy(hb->sock + dlen, "/agent.sock", sizeof "/agent.sock");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, hb->sock, strlen(hb->sock) + 1); /* the length was checked above */
    hb->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    /* The directory is 0700 already; the socket itself is 0600 too, and the gate checks each
     * peer's uid (SO_PEERCRED) besides. */
    if (hb->listen_fd < 0 || bind(hb->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        chmod(hb->sock, 0600) != 0 || listen(hb->listen_fd, SOMAXCONN) != 0) {
      fprintf(stderr, "cuptimon-lua: cannot listen on %s: %s\n", hb->sock, strerror(errno));
      return CM_EIO;
    }
    return 0;
  }
  fprintf(stderr, "cuptimon-lua: no directory short enough for a unix socket\n");
  return CM_EIO;
}

static void replay_finished(void *ud, int status) {
  cm__hub *hb = ud;
  hb->finished = 1;
  hb->status = status;
  uv_stop(hb->loop);
}

/* ---- --attach -------------------------------------------------------------------------------- */

static int tried_before(cm__hub *hb, int pid) {
  for (int i = 0; i < hb->ntried; i++)
    if (hb->tried[i] == pid) return 1;
  return 0;
}

/* Connects to the dormant agent of `pid` (once per run); its HELLO arrives on the loop. Returns 0,
 * or -1 after printing why. */
static int attach_pid(cm__hub *hb, int pid) {
  if (tried_before(hb, pid)) return 0;
  if (hb->ntried == hb->cap_tried) {
    int cap = hb->cap_tried ? hb->cap_tried * 2 : 64;
    int *t = realloc(hb->tried, (size_t)cap * sizeof *t);
    if (!t) return -1;
    hb->tried = t;
    hb->cap_tried = cap;
  }
  hb->tried[hb->ntried++] = pid;
  char err[1024];
  int fd = cm__attach_connect(hb->adir, pid, err, sizeof err);
  if (fd < 0) {
    fprintf(stderr, "cuptimon-lua: cannot attach to pid %d: %s\n", pid, err);
    return -1;
  }
  cm__gate_conn gc = {.fd = fd, .pid = pid, .uid = geteuid()};
  cm__conn *c = cm__conn_admit(hb, &gc);
  if (!c) return -1;
  c->outward = 1;
  c->hello_deadline = uv_now(hb->loop) + (uint64_t)attach_hello_ms();
  return 0;
}

/* --attach all: every dormant agent in the directory not attached before. */
static void attach_scan(cm__hub *hb) {
  int pids[4096];
  int n = cm__attach_scan(hb->adir, pids, 4096);
  for (int i = 0; i < n && !hb->finished; i++)
    if (pids[i] != (int)getpid()) attach_pid(hb, pids[i]);
}

static void watch_cb(uv_fs_event_t *w, const char *name, int events, int status) {
  (void)name, (void)events, (void)status;
  cm__hub *hb = w->data;
  if (!hb->finished) attach_scan(hb);
}

/* A safety net for the directory watch (events can be coalesced or lost): a rescan each second. */
static void scan_cb(uv_timer_t *t) {
  cm__hub *hb = t->data;
  if (!hb->finished) attach_scan(hb);
}

static void stop_watch(cm__hub *hb) {
  if (hb->watch_init && !uv_is_closing((uv_handle_t *)&hb->watch))
    uv_close((uv_handle_t *)&hb->watch, NULL);
  if (hb->scan_init && !uv_is_closing((uv_handle_t *)&hb->scan_timer))
    uv_close((uv_handle_t *)&hb->scan_timer, NULL);
}

/* Starts --attach: the named pids, or `all` and the watch for new ones. */
static void attach_start(cm__hub *hb) {
  if (!hb->attach_all) {
    /* The directory's stale sockets go first, as --list would remove them. */
    int none[1];
    cm__attach_scan(hb->adir, none, 0);
    for (int i = 0; i < hb->ntargets; i++)
      if (attach_pid(hb, hb->targets[i]) != 0) hb->attach_failed = 1;
    if (!hb->conns) finish(hb);
    return;
  }
  if (uv_fs_event_init(hb->loop, &hb->watch) == 0) {
    hb->watch_init = 1;
    hb->watch.data = hb;
    if (uv_fs_event_start(&hb->watch, watch_cb, hb->adir, 0) != 0)
      fprintf(stderr, "cuptimon-lua: cannot watch %s; looking for new processes every second\n",
              hb->adir);
  }
  /* Referenced: with `all` the run goes on until Control-C, with or without processes. */
  if (uv_timer_init(hb->loop, &hb->scan_timer) == 0) {
    hb->scan_init = 1;
    hb->scan_timer.data = hb;
    uv_timer_start(&hb->scan_timer, scan_cb, 1000, 1000);
  }
  attach_scan(hb);
}

/* The detach flush of connection `ud` completed (its pending flushes complete before the
 * connection is freed, so `ud` is still valid here). */
static void detach_done(void *ud, int status) {
  cm__conn *c = ud;
  if (status == 0 && c->w.end == CM__END_NONE) c->w.end = CM__END_DETACHED;
  if (g_hub && g_hub->detach_pending > 0) g_hub->detach_pending--;
}

static void detach_timeout(uv_timer_t *t) {
  cm__hub *hb = t->data;
  fprintf(stderr, "cuptimon-lua: %d agent%s did not answer the detach within 10 s\n",
          hb->detach_pending, hb->detach_pending == 1 ? "" : "s");
  hb->detach_pending = 0;
}

void cm__hub_detach(void) {
  cm__hub *hb = g_hub;
  if (!hb || !hb->attach) return;
  hb->finished = 1;
  stop_watch(hb);
  for (cm__conn *c = hb->conns; c; c = c->next)
    if (c->outward && !c->w.have_hello && c->state == CM__CONN_ACTIVE) {
      /* The script ended before this agent's HELLO: it was never traced. */
      cm__conn_attach_failed(hb, c, "the script ended before the agent's HELLO came; nothing was traced");
      c->state = CM__CONN_CLOSING;
      cm__conn_close(c);
    }
  for (cm__conn *c = hb->conns; c; c = c->next) {
    if (c->state != CM__CONN_ACTIVE || !c->w.attached || c->detaching) continue;
    cm_wire_buf b;
    cm_wire_buf_init(&b);
    if (cm_wire_write_select(&b, "") == 0) cm__conn_send(c, &b, 0);
    cm_wire_buf_free(&b);
    hb->detach_pending++;
    cm__conn_flush(&c->w, CM_FLUSH_SYNC, 5000, detach_done, c);
    c->detaching = 1;
  }
  if (hb->detach_pending <= 0) return;
  uv_timer_start(&hb->drain_timer, detach_timeout, 10000, 0);
  while (hb->detach_pending > 0)
    if (uv_run(hb->loop, UV_RUN_ONCE) == 0 && !uv_loop_alive(hb->loop)) break;
  uv_timer_stop(&hb->drain_timer);
}

/* The kinds --record traces when no script selects anything and --select is not given. */
static const char default_record_select[] =
    "kernel;memcpy;memcpy2;memset;runtime;synchronization;marker;marker_data";

int cm__main_attach(cm_host *h, uv_loop_t *loop, const cm__main_request *req) {
  cm__hub *hb = calloc(1, sizeof *hb);
  if (!hb) return CM_ENOMEM;
  g_hub = hb;
  hb->conn_gone = conn_gone;
  hb->host = h;
  hb->loop = loop;
  cm__host_set_live_ops(h, &live_ops);
  hb->listen_fd = -1;
  uv_timer_init(loop, &hb->spawn_timer);
  uv_timer_init(loop, &hb->drain_timer);
  uv_timer_init(loop, &hb->tick_timer);
  hb->spawn_timer.data = hb->drain_timer.data = hb->tick_timer.data = hb;
  cm__proc_init(&hb->proc, loop, proc_exit, hb);
  hb->timers_init = 1;
  hb->partial_budget = cm__env_u64("CUPTIMON_PARTIAL_BUDGET_MB", 256) << 20;
  hb->max_conns = (uint32_t)cm__env_u64("CUPTIMON_MAX_AGENTS", 4096);
  if (hb->partial_budget == 0 || hb->partial_budget > ((uint64_t)64 << 30)) hb->partial_budget = (uint64_t)256 << 20;
  if (hb->max_conns == 0) hb->max_conns = 4096;
  if (req->attach) {
    if (req->cmd || req->nreplay || req->record || req->select) {
      fprintf(stderr, "cuptimon-lua: --attach cannot be combined with `-- cmd`, --replay, --record "
              "or --select\n");
      return CM_EINVAL;
    }
    int all = cm__attach_parse(req->attach, hb->targets, 256, &hb->ntargets);
    if (all < 0) return CM_EINVAL;
    int rc = cm__attach_dir(hb->adir, sizeof hb->adir);
    if (rc == CM_ENOENT) {
      if (!all) {
        fprintf(stderr, "cuptimon-lua: no dormant cuptimon agent of this user (no directory %s); "
                "start the processes with CUPTIMON_LISTEN=1\n", hb->adir);
        return CM_ENOENT;
      }
      /* `all` waits for the first process: the directory is made as an agent would. */
      char err[512];
      rc = cm_wire_listen_dir(hb->adir, sizeof hb->adir, CM_WIRE_LISTEN_CREATE, err, sizeof err);
      if (rc) fprintf(stderr, "cuptimon-lua: %s\n", err);
    }
    if (rc) return rc;
    hb->attach = 1;
    hb->attach_all = all;
    signal(SIGPIPE, SIG_IGN);
    uv_timer_start(&hb->tick_timer, tick_cb, 100, 100);
    uv_unref((uv_handle_t *)&hb->tick_timer);
    return 0;
  }
  if (req->nreplay) {
    if (req->cmd || req->record) {
      fprintf(stderr, "cuptimon-lua: --replay cannot be combined with `-- cmd` or --record\n");
      return CM_EINVAL;
    }
    hb->replay = 1;
    return cm__replay_start(h, loop, req->replay, req->nreplay, replay_finished, hb);
  }
  if (!req->cmd) {
    fprintf(stderr, "cuptimon-lua: --record needs a command: cuptimon-lua --record FILE -- cmd args\n");
    return CM_EINVAL;
  }
  hb->live = 1;
  hb->cmd = req->cmd;
  /* An agent that goes away mid-write must not kill the monitor; uv_spawn resets the
   * disposition in the command, so it still gets the default. */
  signal(SIGPIPE, SIG_IGN);
  if (req->record) {
    int rc = cm__record_new(&hb->rec, req->record, req->force ? CM__RECORD_FORCE : 0);
    if (rc) return rc;
  }
  const char *sel = req->select;
  if (!sel && req->record && !req->has_script) sel = default_record_select;
  if (sel) {
    int rc = cm_selection_new(&hb->extra);
    if (!rc) rc = cm_selection_parse(hb->extra, sel);
    if (rc) {
      fprintf(stderr, "cuptimon-lua: --select %s: %s\n", sel, cm_errmsg());
      return CM_EINVAL;
    }
  }
  int rc = find_agent(hb);
  if (!rc) rc = make_token(hb->token);
  if (!rc) rc = make_socket(hb);
  if (rc) return rc;
  uv_timer_start(&hb->tick_timer, tick_cb, 100, 100);
  uv_unref((uv_handle_t *)&hb->tick_timer);
  return 0;
}

void cm__hub_start(void) {
  cm__hub *hb = g_hub;
  if (hb && hb->attach && !hb->ntried && !hb->finished) {
    attach_start(hb);
    return;
  }
  /* The command starts on the loop's first turn, after the script has registered its observers,
   * so the first SELECT already holds them; a script that fails to load never starts it. */
  if (!hb || !hb->live || hb->proc.started || hb->proc_done || hb->gate) return;
  /* The gate answers handshakes from what the script has registered by now. */
  cm__gate_options o = {
      .token = hb->token,
      .uid = geteuid(),
      .hello_timeout_ms = (uint32_t)cm__env_u64("CUPTIMON_HELLO_TIMEOUT_MS", 5000),
      .max_pending = (uint32_t)cm__env_u64("CUPTIMON_MAX_STARTUPS", 64),
      .hello_max_bytes = (uint32_t)cm__env_u64("CUPTIMON_HELLO_MAX_BYTES", 512u << 10),
      .admitted = gate_admitted,
      .ud = hb,
  };
  if (o.max_pending > 65536) o.max_pending = 65536;
  if (o.hello_max_bytes > (64u << 20)) o.hello_max_bytes = 64u << 20;
  if (uv_async_init(hb->loop, &hb->admit_async, admit_cb) == 0) {
    hb->async_init = 1;
    hb->admit_async.data = hb;
    uv_unref((uv_handle_t *)&hb->admit_async);
  }
  /* The first answer is set before the thread starts, so no handshake ever gets none. */
  hb->published = cm__conn_union(hb);
  o.select = hb->published;
  o.flush_ms = hb->pub_flush_ms = hb->flush_ms;
  o.deliver_ms = hb->pub_deliver_ms = hb->deliver_ms;
  if (!hb->async_init || !hb->published || cm__gate_start(&hb->gate, hb->listen_fd, &o) != 0) {
    fprintf(stderr, "cuptimon-lua: cannot start the handshake thread; the command runs untraced\n");
    hb->gate = NULL;
  }
  uv_timer_start(&hb->spawn_timer, spawn_cb, 0, 0);
}

int cm__hub_signal(int signum) {
  cm__hub *hb = g_hub;
  if (!hb) return 0;
  hb->signals++;
  if (hb->attach) {
    if (hb->signals > 1) return 0; /* again: the caller leaves at once */
    /* Control-C is how --attach ends: the windows close (cm__hub_detach) and the status is 0. */
    finish(hb);
    return 1;
  }
  if (hb->replay) {
    hb->status = 128 + signum;
    cm__replay_free();
    hb->finished = 1;
    uv_stop(hb->loop);
    return 1;
  }
  if (!hb->live) return 0;
  if (!cm__proc_running(&hb->proc)) {
    /* Nothing to stop but the wait for agents. */
    if (!hb->proc_done) {
      hb->proc_done = 1;
      hb->cmd_status = 128 + signum;
    }
    finish(hb);
    return 1;
  }
  if (hb->signals == 1) {
    fprintf(stderr, "cuptimon-lua: %s: stopping the command (again to kill it)\n",
            signum == SIGINT ? "interrupted" : "terminated");
    cm__proc_stop(&hb->proc, signum);
  } else {
    cm__proc_kill(&hb->proc);
  }
  return 1;
}

int cm__hub_lost_handshakes(int32_t *pids, int max) {
  cm__hub *hb = g_hub;
  if (!hb) return 0;
  int n = (int)hb->gate_lost.lost, kept = n < 16 ? n : 16;
  for (int i = 0; i < kept && i < max; i++) pids[i] = hb->gate_lost.lost_pids[i];
  return n;
}

int cm__hub_attach_failed(void) { return g_hub && g_hub->attach && g_hub->attach_failed; }

int cm__hub_finished(int *status) {
  cm__hub *hb = g_hub;
  if (hb && hb->attach) {
    /* A named pid that could not be attached fails the run. */
    if (status) *status = hb->attach_failed ? 1 : 0;
    return 1;
  }
  if (!hb || !hb->finished) return 0;
  if (status) *status = !hb->live ? hb->status : hb->proc_done ? hb->cmd_status : hb->bye_status;
  /* A capture that could not be written fails a run that otherwise succeeded. */
  if (status && *status == 0 && cm__record_failures(hb->rec)) *status = 1;
  return 1;
}

/* SIGINT or SIGTERM while cuptimon-lua reaps the command after the exit hooks: forwarded as
 * during the run (the grace timer, then SIGKILL; a second signal kills at once). */
static void wait_signal_cb(uv_signal_t *s, int signum) {
  cm__hub *hb = s->data;
  if (++hb->signals == 1)
    cm__proc_stop(&hb->proc, signum);
  else
    cm__proc_kill(&hb->proc);
}

void cm__hub_forget_host(void) {
  cm__hub *hb = g_hub;
  if (!hb) return;
  cm__host_set_live_ops(hb->host, NULL);
  hb->host = NULL;
}

/* Whether the command is still to be reaped after the run: only after an end on its BYE (when
 * the script ended first, the command goes on untraced, and is neither waited for nor signalled). */
static int command_pending(const cm__hub *hb) {
  return hb && hb->live && hb->finished && hb->cmd_exiting && !hb->proc_done;
}

void cm__hub_forward_signals(void) {
  cm__hub *hb = g_hub;
  if (!command_pending(hb) || hb->wait_sig_on) return;
  const int signums[2] = {SIGINT, SIGTERM};
  for (int i = 0; i < 2; i++) {
    uv_signal_init(hb->loop, &hb->wait_sig[i]);
    hb->wait_sig[i].data = hb;
    uv_signal_start(&hb->wait_sig[i], wait_signal_cb, signums[i]);
    uv_unref((uv_handle_t *)&hb->wait_sig[i]);
  }
  hb->wait_sig_on = 1;
}

static void forward_signals_end(cm__hub *hb) {
  if (!hb->wait_sig_on) return;
  for (int i = 0; i < 2; i++) uv_close((uv_handle_t *)&hb->wait_sig[i], NULL);
  hb->wait_sig_on = 0;
}

void cm__hub_wait_command(void) {
  cm__hub *hb = g_hub;
  if (!hb) return;
  if (command_pending(hb)) {
    cm__hub_forward_signals();
    /* uv_run returns 0 when nothing is left to wait for (the process handle is gone). */
    while (!hb->proc_done)
      if (uv_run(hb->loop, UV_RUN_ONCE) == 0 && !hb->proc_done) break;
  }
  forward_signals_end(hb);
  uv_run(hb->loop, UV_RUN_NOWAIT);
}

static void close_if_open(uv_handle_t *hd) {
  if (!uv_is_closing(hd)) uv_close(hd, NULL);
}

void cm__hub_free(void) {
  cm__hub *hb = g_hub;
  if (!hb) return;
  cm__replay_free();
  stop_gate(hb);
  /* Connections still open (the script ended first): close them and let the loop run their
   * close callbacks, which write the capture summaries. */
  for (cm__conn *c = hb->conns; c; c = c->next)
    if (!uv_is_closing((uv_handle_t *)&c->pipe)) cm__conn_close(c);
  if (hb->async_init) close_if_open((uv_handle_t *)&hb->admit_async);
  forward_signals_end(hb);
  stop_watch(hb);
  if (hb->timers_init) {
    close_if_open((uv_handle_t *)&hb->spawn_timer);
    close_if_open((uv_handle_t *)&hb->drain_timer);
    close_if_open((uv_handle_t *)&hb->tick_timer);
    cm__proc_close(&hb->proc);
  }
  uv_run(hb->loop, UV_RUN_NOWAIT);
  uv_run(hb->loop, UV_RUN_NOWAIT);
  cm__record_free(hb->rec, hb->live && hb->proc.started && !hb->attached_any);
  cm__gate_free(hb->gate);
  free(hb->published);
  if (hb->sock[0]) unlink(hb->sock);
  if (hb->dir[0]) rmdir(hb->dir);
  cm_selection_free(hb->extra);
  free(hb->tried);
  cm__host_set_live_ops(hb->host, NULL);
  free(hb);
  g_hub = NULL;
}

