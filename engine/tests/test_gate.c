/*
 * test_gate.c: the hub's handshake gate (engine/monitor/gate.c) alone, without a loop or a host:
 * peer credentials (through a fake credential function), the kernel's pid, the token, the cap on
 * a HELLO before authentication, the handshake deadline and the cap on waiting connections, and
 * that an admitted connection was answered by the gate itself: nothing on the loop thread runs
 * before the answer, so a busy script never delays a handshake.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cmt.h"
#include "cuptimon.h"
#include "cuptimon_wire.h"
#include "gate.h"

static char sock_path[108];
/* Set by the test, read on the gate thread. */
static _Atomic unsigned fake_uid;

static int fake_cred(int fd, pid_t *pid, uid_t *uid) {
  (void)fd;
  *pid = 4242;
  *uid = (uid_t)fake_uid;
  return 0;
}

static int listen_sock(void) {
  char dir[] = "/tmp/cmgate-XXXXXX";
  CMT_ASSERT(mkdtemp(dir));
  snprintf(sock_path, sizeof sock_path, "%s/s", dir);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
  CMT_EQ(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  CMT_EQ(listen(fd, 256), 0);
  return fd;
}

static int dial(void) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
  CMT_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  return fd;
}

static void send_hello(int fd, const char *token, uint32_t claimed_pid) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_hello h = {.pid = claimed_pid, .token = token, .host = "h", .exe = "/x"};
  CMT_OK(cm_wire_write_hello(&b, &h));
  /* A refused connection may be closed before this: the write may fail (SIGPIPE is ignored). */
  ssize_t w = write(fd, b.data, b.len);
  (void)w;
  cm_wire_buf_free(&b);
}

/* Reads frames until HELLO_ACK or EOF within `ms`: returns its status, or -1000 at EOF, -2000 on
 * timeout. *select gets the SELECT's text, when one came first. */
static int read_ack(int fd, int ms, char *select, size_t cap) {
  cm_wire_reader *r;
  CMT_OK(cm_wire_reader_new(&r, 0));
  int result = -2000;
  for (int waited = 0; waited < ms;) {
    cm_wire_frame f;
    int rc = cm_wire_reader_next(r, &f);
    if (rc == 1) {
      if (f.type == CM_WIRE_SELECT && select) {
        const char *s;
        uint32_t len;
        CMT_OK(cm_wire_decode_select(&f, &s, &len));
        snprintf(select, cap, "%.*s", (int)len, s);
      }
      if (f.type == CM_WIRE_HELLO_ACK) {
        int32_t st;
        const char *msg;
        CMT_OK(cm_wire_decode_hello_ack(&f, &st, &msg));
        result = st;
        break;
      }
      continue;
    }
    CMT_EQ(rc, 0);
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 50) <= 0) {
      waited += 50;
      continue;
    }
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) {
      result = -1000;
      break;
    }
    CMT_OK(cm_wire_reader_feed(r, buf, (size_t)n));
  }
  cm_wire_reader_free(r);
  return result;
}

/* Whether the peer closed `fd` within `ms`. */
static int closed_within(int fd, int ms) {
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  if (poll(&pf, 1, ms) <= 0) return 0;
  char b;
  return read(fd, &b, 1) == 0;
}

static int take_within(cm__gate *g, cm__gate_conn *c, int ms) {
  for (int i = 0; i < ms / 10; i++) {
    if (cm__gate_take(g, c)) return 1;
    usleep(10000);
  }
  return 0;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  CMT_ASSERT(cm__gate_token_equal("abc", "abc"));
  CMT_ASSERT(!cm__gate_token_equal("abc", "abd"));
  CMT_ASSERT(!cm__gate_token_equal("abc", "ab"));
  CMT_ASSERT(!cm__gate_token_equal("", "a"));

  fake_uid = geteuid();
  int lfd = listen_sock();
  cm__gate_options o = {.token = "secret", .uid = geteuid(), .hello_timeout_ms = 400,
                        .max_pending = 4, .hello_max_bytes = 4096, .cred = fake_cred};
  cm__gate *g;
  CMT_OK(cm__gate_start(&g, lfd, &o));
  CMT_OK(cm__gate_publish(g, "concurrent_kernel:start", 250, 0));

  /* An agent of our uid with the right token is answered by the gate, with the published
   * selection and the kernel's pid (the HELLO claims another). Nothing takes it meanwhile. */
  int a = dial();
  send_hello(a, "secret", 1);
  char sel[256] = "";
  CMT_EQ(read_ack(a, 3000, sel, sizeof sel), 0);
  CMT_STREQ(sel, "concurrent_kernel:start");
  cm__gate_conn c;
  CMT_ASSERT(take_within(g, &c, 3000));
  CMT_EQ(c.pid, 4242);
  CMT_STREQ(c.select, "concurrent_kernel:start");
  CMT_EQ(c.flush_ms, 250);
  CMT_ASSERT(c.len > CM_WIRE_FRAME_HEADER_SIZE && c.bytes[0] == 'C' && c.bytes[1] == 'M');
  close(c.fd);
  cm__gate_conn_release(&c);
  close(a);

  /* Another uid is refused before anything is read or answered. */
  fake_uid = geteuid() + 1;
  a = dial();
  send_hello(a, "secret", 1);
  CMT_EQ(read_ack(a, 3000, NULL, 0), -1000);
  close(a);
  fake_uid = geteuid();

  /* A wrong token gets an error answer. */
  a = dial();
  send_hello(a, "secreT", 1);
  CMT_NE(read_ack(a, 3000, NULL, 0), 0);
  close(a);

  /* A HELLO header declaring more than the cap is closed at once, unread. */
  a = dial();
  uint8_t h[24] = {'C', 'M', 1, 0, CM_WIRE_HELLO, 0};
  uint64_t len = 1u << 30;
  for (int i = 0; i < 8; i++) h[8 + i] = (uint8_t)(len >> (8 * i));
  uint32_t crc = cm_wire_crc32c(0, h, 20);
  for (int i = 0; i < 4; i++) h[20 + i] = (uint8_t)(crc >> (8 * i));
  CMT_EQ(write(a, h, sizeof h), 24);
  CMT_ASSERT(closed_within(a, 2000));
  close(a);

  /* An idle connection is closed at the deadline. */
  a = dial();
  CMT_ASSERT(!closed_within(a, 100));
  CMT_ASSERT(closed_within(a, 3000));
  close(a);

  cm__gate_stop(g);
  cm__gate_stats st;
  cm__gate_get_stats(g, &st);
  CMT_EQU(st.admitted, 1);
  CMT_EQU(st.refused_uid, 1);
  CMT_EQU(st.wrong_token, 1);
  CMT_EQU(st.oversized, 1);
  CMT_EQU(st.timed_out, 1);
  cm__gate_free(g);

  /* Ten idle connections with room for four (and a deadline that cannot interfere): the oldest
   * six are closed, the newest four stay, and an agent arriving now is still served. */
  o.hello_timeout_ms = 60000;
  CMT_OK(cm__gate_start(&g, lfd, &o));
  int idle[10];
  for (int i = 0; i < 10; i++) idle[i] = dial();
  for (int i = 0; i < 6; i++) CMT_ASSERT(closed_within(idle[i], 5000));
  for (int i = 6; i < 10; i++) CMT_ASSERT(!closed_within(idle[i], 0));
  a = dial();
  send_hello(a, "secret", 1);
  CMT_EQ(read_ack(a, 5000, NULL, 0), 0);
  CMT_ASSERT(take_within(g, &c, 5000));
  close(c.fd);
  cm__gate_conn_release(&c);
  close(a);
  cm__gate_stop(g);
  cm__gate_get_stats(g, &st);
  CMT_EQU(st.admitted, 1);
  CMT_EQU(st.evicted, 7); /* the six, then the oldest idle one for the agent */
  /* Stopping closed the rest. */
  for (int i = 7; i < 10; i++) CMT_ASSERT(closed_within(idle[i], 1000));
  for (int i = 0; i < 10; i++) close(idle[i]);
  cm__gate_free(g);
  close(lfd);
  unlink(sock_path);
  *strrchr(sock_path, '/') = 0;
  rmdir(sock_path);
  printf("test_gate: ok\n");
  return 0;
}
