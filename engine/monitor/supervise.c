/*
 * supervise.c: the monitored command's life: spawn with the injection environment, forward
 * signals with a SIGKILL grace period, report the exit status (see supervise.h).
 *
 * Design note. One uv_process_t and one grace timer. The exit callback receives the status the
 * kernel gave (the supervisor reaped the child), so the hub can report a real exit code for the
 * command's own process, which its agent cannot know from inside atexit.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env.h"
#include "supervise.h"

extern char **environ;

static void proc_closed(uv_handle_t *hd) { ((cm__proc *)hd->data)->closed = 1; }

static void on_exit_cb(uv_process_t *up, int64_t exit_status, int term_signal) {
  cm__proc *p = up->data;
  p->done = 1;
  p->status = term_signal ? 128 + term_signal : (int)exit_status;
  uv_timer_stop(&p->kill_timer);
  uv_close((uv_handle_t *)up, proc_closed);
  p->exit_fn(p->ud, p->status, exit_status, term_signal);
}

void cm__proc_init(cm__proc *p, uv_loop_t *loop, cm__proc_exit_fn fn, void *ud) {
  p->loop = loop;
  p->exit_fn = fn;
  p->ud = ud;
  p->proc.data = p;
  uv_timer_init(loop, &p->kill_timer);
  p->kill_timer.data = p;
  p->timer_init = 1;
}

/* Whether environment entry `e` is replaced by one of `setenv`. */
static int replaced(const char *e, const char *const *setenv) {
  for (int i = 0; setenv && setenv[i]; i++) {
    const char *eq = strchr(setenv[i], '=');
    size_t n = eq ? (size_t)(eq - setenv[i]) + 1 : strlen(setenv[i]);
    if (strncmp(e, setenv[i], n) == 0) return 1;
  }
  return 0;
}

int cm__proc_spawn(cm__proc *p, char **argv, const char *const *setenv) {
  size_t n = 0, extra = 0;
  while (environ[n]) n++;
  while (setenv && setenv[extra]) extra++;
  char **env = calloc(n + extra + 1, sizeof *env);
  size_t k = 0;
  for (size_t i = 0; env && i < n; i++)
    if (!replaced(environ[i], setenv)) env[k++] = environ[i];
  for (size_t i = 0; env && i < extra; i++) env[k++] = (char *)setenv[i];
  uv_stdio_container_t stdio[3];
  for (int i = 0; i < 3; i++) {
    stdio[i].flags = UV_INHERIT_FD;
    stdio[i].data.fd = i;
  }
  uv_process_options_t o = {0};
  o.file = argv[0];
  o.args = argv;
  o.env = env;
  o.stdio = stdio;
  o.stdio_count = 3;
  o.exit_cb = on_exit_cb;
  int rc = env ? uv_spawn(p->loop, &p->proc, &o) : UV_ENOMEM;
  free(env);
  if (rc) {
    fprintf(stderr, "cuptimon-lua: cannot run %s: %s\n", argv[0], uv_strerror(rc));
    uv_close((uv_handle_t *)&p->proc, proc_closed);
    p->done = 1;
    p->status = rc == UV_ENOENT ? 127 : 126;
    p->exit_fn(p->ud, p->status, p->status, 0);
    return p->status;
  }
  p->started = 1;
  return 0;
}

int cm__proc_running(const cm__proc *p) { return p->started && !p->done; }

int cm__proc_pid(const cm__proc *p) { return p->started ? p->proc.pid : 0; }

static void kill_cb(uv_timer_t *t) {
  cm__proc *p = t->data;
  if (cm__proc_running(p)) {
    fprintf(stderr, "cuptimon-lua: the command did not exit; sending SIGKILL\n");
    uv_process_kill(&p->proc, SIGKILL);
  }
}

void cm__proc_stop(cm__proc *p, int signum) {
  if (!cm__proc_running(p)) return;
  uv_process_kill(&p->proc, signum);
  uv_timer_start(&p->kill_timer, kill_cb, cm__env_u64("CUPTIMON_KILL_GRACE_MS", 3000), 0);
}

void cm__proc_kill(cm__proc *p) {
  if (cm__proc_running(p)) uv_process_kill(&p->proc, SIGKILL);
}

void cm__proc_close(cm__proc *p) {
  if (p->timer_init && !uv_is_closing((uv_handle_t *)&p->kill_timer))
    uv_close((uv_handle_t *)&p->kill_timer, NULL);
  if (cm__proc_running(p))
    fprintf(stderr, "cuptimon-lua: the command (pid %d) is still running; it goes on untraced\n",
            p->proc.pid);
  if (p->started && !p->closed && !uv_is_closing((uv_handle_t *)&p->proc))
    uv_close((uv_handle_t *)&p->proc, NULL);
}
