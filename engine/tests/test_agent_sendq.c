/*
 * test_agent_sendq.c: the agent's send queue and sender thread (engine/agent/sendq.c), in process,
 * over a socket pair instead of a monitor; the log and the dormant-mode query are stubs here.
 *
 *  1. The sender writes the queued frames in order, and the exit's BYE frame, once written whole,
 *     marks the queue drained (sender_drained): the exit's account of whether BYE got out.
 *  2. A sender stopped with the queue empty but no BYE queued (the exit could not build or queue
 *     it) leaves sender_drained false, so the exit says that the monitor did not get BYE.
 *  3. A BYE whose write fails (the monitor closed the connection) leaves it false too, and the
 *     queue dies: later pushes are refused, and a refused BATCH is counted as dropped.
 *  4. Pushing hands the buffer's bytes to the queue and leaves the buffer empty, and BYE closes
 *     nothing by itself: frames queued after it still go out before the sender stops.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cmt.h"
#include "cuptimon.h"
#include "cuptimon_wire.h"
#include "agent_internal.h"

/* What sendq.c calls outside itself: the log, and whether the agent is dormant. */
static int log_lines;
void cm__alog(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "  agent log (%d): ", level);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  log_lines++;
}
bool cm__listen_mode(void) { return false; }

static int peer = -1; /* the monitor's end of the socket pair */

/* A fresh queue over a new socket pair, with its sender thread running. */
static void start(void) {
  int sv[2];
  CMT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  A.fd = sv[0];
  A.is_socket = true;
  peer = sv[1];
  A.head = A.tail = NULL;
  A.q_bytes = A.q_frames = 0;
  A.q_batches = A.q_records = 0;
  A.max_bytes = 64u << 20;
  A.max_frames = 1024;
  A.q_closed = A.q_dead = A.sender_stop = A.sending = false;
  atomic_store(&A.gone, false);
  atomic_store(&A.sender_drained, false);
  atomic_store(&A.batches_dropped, 0);
  atomic_store(&A.records_dropped_agent, 0);
  atomic_store(&A.frames_sent, 0);
  CMT_EQ(pthread_create(&A.sender, NULL, cm__sendq_sender_main, NULL), 0);
}

/* What the exit does once its last frames are queued: no more pushes, and the sender stops once
 * the queue is empty. Then joins the sender. */
static void stop(void) {
  pthread_mutex_lock(&A.send_mu);
  A.q_closed = true;
  A.sender_stop = true;
  pthread_cond_signal(&A.q_cv);
  pthread_mutex_unlock(&A.send_mu);
  CMT_EQ(pthread_join(A.sender, NULL), 0);
  close(A.fd);
  A.fd = -1;
}

/* Reads what the peer received until EOF (the agent's end is closed by then). */
static size_t drain_peer(uint8_t *buf, size_t cap) {
  size_t n = 0;
  for (;;) {
    ssize_t r = read(peer, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  close(peer);
  peer = -1;
  return n;
}

/* The kinds of the whole frames in buf[0..n), in order; returns how many. */
static int frame_kinds(const uint8_t *buf, size_t n, uint32_t *kinds, int cap) {
  cm_wire_reader *r = NULL;
  CMT_OK(cm_wire_reader_new(&r, 0));
  CMT_OK(cm_wire_reader_feed(r, buf, n));
  int k = 0;
  cm_wire_frame f;
  while (k < cap && cm_wire_reader_next(r, &f) == 1) kinds[k++] = f.type;
  cm_wire_reader_free(r);
  return k;
}

static void push_flush_done(uint64_t id) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_OK(cm_wire_write_flush_done(&b, id, 0));
  CMT_ASSERT(cm__sendq_push_buf(&b, false, 0));
  CMT_ASSERT(b.data == NULL && b.len == 0); /* the queue owns the bytes now */
  cm_wire_buf_free(&b);
}

static bool push_bye(void) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_OK(cm_wire_write_bye(&b, CM_WIRE_BYE_EXIT, 0, ""));
  bool ok = cm__sendq_push_bye(&b);
  CMT_ASSERT(b.data == NULL && b.len == 0);
  cm_wire_buf_free(&b);
  return ok;
}

static void test_bye_written(void) {
  start();
  push_flush_done(1);
  CMT_ASSERT(push_bye());
  push_flush_done(2); /* after BYE in the queue: still sent, in order */
  stop();
  static uint8_t buf[1 << 16];
  size_t n = drain_peer(buf, sizeof buf);
  uint32_t kinds[8];
  int k = frame_kinds(buf, n, kinds, 8);
  CMT_EQ(k, 3);
  CMT_EQ(kinds[0], CM_WIRE_FLUSH_DONE);
  CMT_EQ(kinds[1], CM_WIRE_BYE);
  CMT_EQ(kinds[2], CM_WIRE_FLUSH_DONE);
  CMT_EQU(atomic_load(&A.frames_sent), 3);
  CMT_ASSERT(atomic_load(&A.sender_drained));
  printf("ok: BYE written whole marks the queue drained\n");
}

static void test_no_bye(void) {
  start();
  push_flush_done(1);
  stop(); /* as an exit whose BYE could not be built: the queue ran empty without it */
  static uint8_t buf[1 << 16];
  size_t n = drain_peer(buf, sizeof buf);
  uint32_t kinds[8];
  CMT_EQ(frame_kinds(buf, n, kinds, 8), 1);
  CMT_EQ(kinds[0], CM_WIRE_FLUSH_DONE);
  /* Nothing says the monitor got BYE: it did not. */
  CMT_ASSERT(!atomic_load(&A.sender_drained));
  printf("ok: a queue stopped without BYE is not marked drained\n");
}

static void test_bye_write_fails(void) {
  start();
  close(peer); /* the monitor is gone before BYE goes out */
  peer = -1;
  CMT_ASSERT(push_bye());
  /* The sender's write fails (EPIPE), and the queue dies. */
  for (int i = 0; i < 500 && !atomic_load(&A.gone); i++) {
    struct timespec d = {0, 10 * 1000000L};
    nanosleep(&d, NULL);
  }
  CMT_ASSERT(atomic_load(&A.gone));
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  CMT_OK(cm_wire_write_flush_done(&b, 3, 0));
  CMT_ASSERT(!cm__sendq_push_buf(&b, true, 7)); /* refused, counted as the agent's loss */
  CMT_ASSERT(b.data == NULL && b.len == 0);
  cm_wire_buf_free(&b);
  CMT_EQU(atomic_load(&A.batches_dropped), 1);
  CMT_EQU(atomic_load(&A.records_dropped_agent), 7);
  stop();
  CMT_ASSERT(!atomic_load(&A.sender_drained));
  CMT_GE(log_lines, 1); /* the connection's loss was said */
  printf("ok: a BYE whose write failed is not marked drained; the dead queue refuses pushes\n");
}

int main(void) {
  cm__sendq_init();
  test_bye_written();
  test_no_bye();
  test_bye_write_fails();
  return 0;
}
