/*
 * attach.c: the dormant agents seen from the monitor: the directory scan, stale-socket cleanup,
 * the connection to one agent, and `cuptimon-lua --list` (see attach.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "attach.h"
#include "cuptimon.h"
#include "cuptimon_wire.h"

/* Root's monitor may use another user's directory (XDG_RUNTIME_DIR=/run/user/UID): root can
 * reach it anyway, and the agents there admit root only with CUPTIMON_LISTEN_ALLOW_ROOT=1. */
static int root(void) { return geteuid() == 0; }

/* Whether a socket or marker of owner `uid` is ours to use. */
static int ours(uid_t uid) { return uid == geteuid() || root(); }

int cm__attach_dir(char *dir, size_t cap) {
  char err[512];
  int rc = cm_wire_listen_dir(dir, cap, root() ? CM_WIRE_LISTEN_ANY_OWNER : 0, err, sizeof err);
  if (rc && rc != CM_ENOENT) fprintf(stderr, "cuptimon-lua: %s\n", err);
  return rc;
}

static int alive(int pid) { return kill(pid, 0) == 0 || errno == EPERM; }

/* Removes the socket, the marker and a leftover temporary name of `pid`. */
static void remove_stale(const char *dir, int pid) {
  char p[PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/%d.sock", dir, pid);
  unlink(p);
  snprintf(p, sizeof p, "%s/%d.attached", dir, pid);
  unlink(p);
  snprintf(p, sizeof p, "%s/.%d.tmp", dir, pid);
  unlink(p);
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* The pid of a name "<pid><suffix>", or 0. */
static int name_pid(const char *name, const char *suffix) {
  char *end;
  long v = strtol(name, &end, 10);
  if (end == name || v <= 0 || v > INT_MAX || strcmp(end, suffix) != 0) return 0;
  return (int)v;
}

int cm__attach_scan(const char *dir, int *pids, int cap) {
  int n = 0, gone = 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    int sock = name_pid(e->d_name, ".sock");
    int mark = sock ? 0 : name_pid(e->d_name, ".attached");
    int tmp = sock || mark || e->d_name[0] != '.' ? 0 : name_pid(e->d_name + 1, ".tmp");
    int pid = sock ? sock : mark ? mark : tmp;
    if (!pid) continue;
    char p[PATH_MAX + 300];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(p, &st) != 0 || !ours(st.st_uid)) continue;
    if (!alive(pid)) {
      if (sock || tmp) gone += sock != 0;
      unlink(p);
      continue;
    }
    if (sock && S_ISSOCK(st.st_mode) && n < cap) pids[n++] = pid;
  }
  closedir(d);
  qsort(pids, (size_t)n, sizeof *pids, cmp_int);
  if (gone)
    fprintf(stderr, "cuptimon-lua: removed %d stale socket%s of processes that no longer exist\n",
            gone, gone == 1 ? "" : "s");
  return n;
}

int cm__attach_connect(const char *dir, int pid, char *err, size_t errlen) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int len = snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%d.sock", dir, pid);
  if (len < 0 || (size_t)len >= sizeof sa.sun_path) {
    snprintf(err, errlen, "the socket path in %s is too long", dir);
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  int rc = -1;
  for (int attempt = 0; attempt < 50; attempt++) {
    rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    if (rc == 0 || (errno != EAGAIN && errno != EINTR)) break;
    usleep(20000); /* a full backlog: the agent is answering another monitor */
  }
  if (rc != 0) {
    int e = errno;
    close(fd);
    if (e == ENOENT) {
      snprintf(err, errlen, "no dormant agent in process %d (no %s; start it with "
               "CUPTIMON_LISTEN=1 and CUDA_INJECTION64_PATH naming the agent)%s", pid,
               sa.sun_path, alive(pid) ? "" : ", and there is no such process");
    } else if (e == ECONNREFUSED) {
      remove_stale(dir, pid);
      snprintf(err, errlen, "process %d does not listen any more (%s); its stale socket was "
               "removed", pid, alive(pid) ? "the pid was reused" : "it exited");
    } else {
      snprintf(err, errlen, "cannot connect to %s: %s", sa.sun_path, strerror(e));
    }
    return -1;
  }
  struct ucred cr;
  socklen_t cl = sizeof cr;
  struct stat st;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.pid != pid ||
      !(cr.uid == geteuid() || (root() && stat(sa.sun_path, &st) == 0 && st.st_uid == cr.uid))) {
    snprintf(err, errlen, "the socket %s is not served by process %d of this user; refusing it",
             sa.sun_path, pid);
    close(fd);
    return -1;
  }
  return fd;
}

int cm__attach_parse(const char *spec, int *pids, int cap, int *n) {
  *n = 0;
  if (strcmp(spec, "all") == 0) return 1;
  const char *p = spec;
  while (*p) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v <= 0 || v > INT_MAX || (*end && *end != ',') || *n == cap) {
      fprintf(stderr, "cuptimon-lua: --attach %s: expected \"all\" or a list of pids "
              "(PID[,PID...], at most %d)\n", spec, cap);
      return -1;
    }
    pids[(*n)++] = (int)v;
    p = *end ? end + 1 : end;
  }
  if (*n == 0) {
    fprintf(stderr, "cuptimon-lua: --attach needs \"all\" or a list of pids\n");
    return -1;
  }
  return 0;
}

/* ---- --list ------------------------------------------------------------------------------------- */

/* Reads up to cap-1 bytes of a small file; returns the length, or -1. */
static ssize_t slurp(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t len = 0;
  while (len + 1 < cap) {
    ssize_t r = read(fd, buf + len, cap - 1 - len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    len += (size_t)r;
  }
  close(fd);
  buf[len] = 0;
  return (ssize_t)len;
}

/* The start time of `pid` as a local "YYYY-mm-dd HH:MM:SS", from /proc (its start in clock ticks
 * after boot, and the boot time). */
static void start_time(int pid, char *out, size_t cap) {
  char p[64], buf[4096];
  snprintf(out, cap, "?");
  snprintf(p, sizeof p, "/proc/%d/stat", pid);
  if (slurp(p, buf, sizeof buf) <= 0) return;
  char *s = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  if (!s) return;
  unsigned long long ticks = 0;
  int field = 2;
  for (char *t = s + 1; *t && field < 22; t++)
    if (*t == ' ' && ++field == 22) ticks = strtoull(t + 1, NULL, 10);
  char st[8192];
  if (slurp("/proc/stat", st, sizeof st) <= 0) return;
  char *b = strstr(st, "\nbtime ");
  long hz = sysconf(_SC_CLK_TCK);
  if (!b || hz <= 0 || !ticks) return;
  time_t t = (time_t)(strtoull(b + 7, NULL, 10) + ticks / (unsigned long long)hz);
  struct tm tm;
  if (localtime_r(&t, &tm)) strftime(out, cap, "%Y-%m-%d %H:%M:%S", &tm);
}

/* CUDA_VISIBLE_DEVICES of the process (what it may use; the agent learns the devices only once
 * attached), or "all". */
static void devices(int pid, char *out, size_t cap) {
  char p[64], buf[65536];
  snprintf(out, cap, "all");
  snprintf(p, sizeof p, "/proc/%d/environ", pid);
  ssize_t n = slurp(p, buf, sizeof buf);
  for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1)
    if (strncmp(buf + i, "CUDA_VISIBLE_DEVICES=", 21) == 0) {
      snprintf(out, cap, "%s", buf[i + 21] ? buf + i + 21 : "none");
      return;
    }
}

/* The monitor attached to `pid` ("pid N"), or "no". */
static void attached(const char *dir, int pid, char *out, size_t cap) {
  char p[PATH_MAX + 32], buf[32];
  snprintf(out, cap, "no");
  snprintf(p, sizeof p, "%s/%d.attached", dir, pid);
  if (slurp(p, buf, sizeof buf) <= 0) return;
  int mon = atoi(buf);
  if (mon > 0 && alive(mon)) snprintf(out, cap, "pid %d", mon);
}

int cm__attach_list(FILE *out) {
  char dir[PATH_MAX];
  int rc = cm__attach_dir(dir, sizeof dir);
  if (rc == CM_ENOENT) {
    fprintf(out, "no dormant cuptimon agent of this user (no directory %s)\n", dir);
    return 0;
  }
  if (rc) return 1;
  int pids[4096];
  int n = cm__attach_scan(dir, pids, 4096);
  if (n == 0) {
    fprintf(out, "no dormant cuptimon agent of this user in %s\n", dir);
    return 0;
  }
  fprintf(out, "%-8s %-19s %-10s %-8s %s\n", "PID", "STARTED", "ATTACHED", "DEVICES",
          "COMMAND");
  for (int i = 0; i < n; i++) {
    char st[32], dev[64], at[32], exe[PATH_MAX] = "?", p[64], cmd[4096];
    start_time(pids[i], st, sizeof st);
    devices(pids[i], dev, sizeof dev);
    attached(dir, pids[i], at, sizeof at);
    snprintf(p, sizeof p, "/proc/%d/exe", pids[i]);
    ssize_t el = readlink(p, exe, sizeof exe - 1);
    exe[el > 0 ? el : 1] = 0;
    snprintf(p, sizeof p, "/proc/%d/cmdline", pids[i]);
    ssize_t cl = slurp(p, cmd, sizeof cmd);
    if (cl < 0) cl = 0;
    /* The arguments after argv[0], space-separated (slurp ends the bytes with a NUL). */
    size_t a0 = strnlen(cmd, (size_t)cl);
    char *args = a0 < (size_t)cl ? cmd + a0 + 1 : cmd + cl;
    for (char *c = args; c + 1 < cmd + cl; c++)
      if (*c == 0) *c = ' ';
    fprintf(out, "%-8d %-19s %-10s %-8s %s%s%s\n", pids[i], st, at, dev, exe, *args ? " " : "",
            args);
  }
  return 0;
}
