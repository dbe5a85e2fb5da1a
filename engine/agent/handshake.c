/*
 * handshake.c: the agent's side of the handshake (docs/wire.md): HELLO and SCHEMA out, the
 * monitor's frames in until HELLO_ACK, and the BYE(error) that reports a process that cannot be
 * traced.
 *
 * Design note. The handshake runs synchronously on the thread that starts a session (the init
 * thread inside cuInit, or the dormant listener), before any agent thread exists, so tracing is
 * configured before the application's first CUDA call returns; every wait has the handshake's
 * deadline. HELLO says who the process is (pid, command line, executable, host, the launcher's
 * rank variables, the clocks); SCHEMA lists every kind's fields. The CONFIGURE and SELECT frames
 * that come before HELLO_ACK are applied in order through A.ctl (control.c), and the frames read
 * past it stay in A.reader for the control thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent_internal.h"

/* Reads /proc/self/cmdline into a NUL-separated block and an argv array (both malloc'd). */
static uint32_t read_cmdline(char **block, const char ***argv) {
  *block = NULL;
  *argv = NULL;
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    if (len == cap) {
      char *p = realloc(buf, cap * 2 + 1);
      if (!p) break;
      buf = p;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    len += (size_t)r;
  }
  close(fd);
  if (!buf) return 0;
  buf[len] = '\0';
  uint32_t argc = 0;
  for (size_t i = 0; i < len; i++)
    if (buf[i] == '\0') argc++;
  if (len && buf[len - 1] != '\0') argc++;
  if (argc > 65536) argc = 65536;
  const char **av = calloc(argc ? argc : 1, sizeof *av);
  if (!av) {
    free(buf);
    return 0;
  }
  size_t p = 0;
  for (uint32_t i = 0; i < argc && p <= len; i++) {
    av[i] = buf + p;
    p += strlen(buf + p) + 1;
  }
  *block = buf;
  *argv = av;
  return argc;
}

/* The environment variables HELLO carries: a distributed job's place of the process (torchrun,
 * torch.distributed and most launchers set them), so a script can name ranks. A value longer
 * than ENV_VALUE_MAX bytes is not sent. */
static const char *const hello_env_names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"};
enum { ENV_VALUE_MAX = 64, NENV = sizeof hello_env_names / sizeof hello_env_names[0] };

/* Fills `store` with "NAME=VALUE" strings of the names set, `list` with pointers to them; returns
 * how many. */
static uint32_t hello_env(char store[][32 + ENV_VALUE_MAX], const char **list) {
  uint32_t n = 0;
  for (size_t i = 0; i < NENV; i++) {
    const char *v = getenv(hello_env_names[i]);
    if (!v || strlen(v) > ENV_VALUE_MAX) continue;
    snprintf(store[n], sizeof store[n], "%s=%s", hello_env_names[i], v);
    list[n] = store[n];
    n++;
  }
  return n;
}

/* Appends HELLO (with `token`) and SCHEMA to `b`. */
int cm__handshake_hello_schema(cm_wire_buf *b, const char *token) {
  cm_session_info si;
  memset(&si, 0, sizeof si);
  if (A.eng) cm_session_info_get(A.eng, &si);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  char exe[4096] = "";
  ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[el > 0 ? el : 0] = '\0';
  char *block;
  const char **argv;
  uint32_t argc = read_cmdline(&block, &argv);
  char env_store[NENV][32 + ENV_VALUE_MAX];
  const char *env[NENV];
  uint32_t nenv = hello_env(env_store, env);
  uint64_t t0 = cm__realtime_ns();
  uint64_t t1 = cm__realtime_ns();
  cm_wire_hello h = {
      .pid = (uint32_t)getpid(),
      .ppid = (uint32_t)getppid(),
      .cupti_version = si.cupti_version,
      .clock_realtime_ns = t0 + (t1 - t0) / 2,
      /* The engine measured cuptiGetTimestamp against CLOCK_REALTIME at its start. */
      .clock_cupti_ns = (uint64_t)((int64_t)(t0 + (t1 - t0) / 2) + si.clock_offset_ns),
      .token = token ? token : "",
      .host = host,
      .exe = exe,
      .argc = argc,
      .argv = argv,
      .ndevices = 0, /* devices are not queried inside cuInit; DEVICE records carry them */
      .devices = NULL,
      .nenv = nenv,
      .env = env,
  };
  int rc = cm_wire_write_hello(b, &h);
  free(argv);
  free(block);
  if (rc) return rc;

  int nk = cm_kind_count();
  cm_wire_kind *kinds = calloc((size_t)(nk > 0 ? nk : 1), sizeof *kinds);
  cm_wire_field *fields = calloc((size_t)(nk > 0 ? nk : 1) * CM_WIRE_MAX_COLS, sizeof *fields);
  if (!kinds || !fields) {
    free(kinds);
    free(fields);
    return CM_ENOMEM;
  }
  uint32_t nout = 0;
  for (int i = 0; i < nk; i++) {
    int k = cm_kind_at(i);
    int nf = cm_field_count(k);
    if (nf <= 0) continue;
    if (nf > CM_WIRE_MAX_COLS) nf = CM_WIRE_MAX_COLS;
    cm_wire_field *fs = &fields[(size_t)nout * CM_WIRE_MAX_COLS];
    uint32_t m = 0;
    for (int f = 0; f < nf; f++) {
      cm_field_info fi;
      if (cm_field_info_get(k, f, &fi) != 0) continue;
      fs[m++] = (cm_wire_field){.id = (uint32_t)fi.id, .type = (uint32_t)fi.type,
                                .width = fi.width, .name = fi.name};
    }
    kinds[nout++] = (cm_wire_kind){.kind = (uint32_t)k, .nfields = m, .name = cm_kind_name(k),
                                   .fields = fs};
  }
  cm_wire_schema s = {.nkinds = nout, .kinds = kinds};
  rc = cm_wire_write_schema(b, &s);
  free(kinds);
  free(fields);
  return rc;
}

/* Reads monitor frames until HELLO_ACK or the deadline, applying CONFIGURE and SELECT in order.
 * Returns the HELLO_ACK status, or CM_ETIMEDOUT / CM_EIO. With `preempt_fd` >= 0 (a dormant
 * agent's listening socket), a peer that has sent nothing for PREEMPT_GRACE_MS while another
 * connection waits on preempt_fd loses the handshake (CM_EAGAIN), so one silent peer never holds
 * the listener. */
int32_t cm__handshake_await_ack(uint64_t deadline, int preempt_fd) {
  uint8_t buf[16384];
  bool heard = false;
  uint64_t grace_end = cm__mono_ms() + PREEMPT_GRACE_MS;
  for (;;) {
    cm_wire_frame f;
    int r;
    while ((r = cm__control_next(&A.ctl, A.reader, &f)) == 1) {
      int32_t st = 0;
      if (cm__control_apply(&A.ctl, &f, &st)) return st;
    }
    if (r < 0) {
      alog(CM_LOG_ERROR, "the handshake failed on the monitor's stream (see above)");
      return CM_EIO;
    }
    uint64_t now = cm__mono_ms();
    if (now >= deadline) {
      alog(CM_LOG_ERROR, "no HELLO_ACK from the monitor within %u ms (CUPTIMON_HANDSHAKE_MS)",
           A.handshake_ms);
      return CM_ETIMEDOUT;
    }
    struct pollfd pf[2] = {{.fd = A.fd, .events = POLLIN}, {.fd = preempt_fd, .events = POLLIN}};
    bool watch = preempt_fd >= 0 && !heard && now >= grace_end;
    uint64_t until = preempt_fd >= 0 && !heard && now < grace_end && grace_end < deadline ? grace_end : deadline;
    int pr = poll(pf, watch ? 2 : 1, (int)(until - now));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    if (watch && (pf[1].revents & POLLIN) && !(pf[0].revents & POLLIN)) return CM_EAGAIN;
    if (!(pf[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    ssize_t n = recv(A.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) heard = true;
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      alog(CM_LOG_ERROR, "the monitor closed the connection during the handshake%s%s",
           n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
      return CM_EIO;
    }
    if (cm__control_feed(&A.ctl, A.reader, buf, (size_t)n) != 0) return CM_EIO;
  }
}

/* Writes BYE(error) after HELLO and SCHEMA, so a monitor or a capture reader learns that this
 * process exists but is not traced, and why. */
void cm__handshake_report_failure(const char *token, const char *why, uint64_t deadline,
                                  bool capture) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  if ((!capture || cm_wire_write_file_header(&b, 0) == 0) &&
      cm__handshake_hello_schema(&b, token) == 0 &&
      cm_wire_write_bye(&b, CM_WIRE_BYE_ERROR, -1, why) == 0)
    cm__sendq_write_all(A.fd, A.is_socket, b.data, b.len, deadline);
  cm_wire_buf_free(&b);
}
