/*
 * sendq.c: the agent's send queue, the sender thread that empties it, and the connection's end.
 *
 * Design note. The application never waits on the monitor: producers (the observer, the control
 * thread, the exit handler) push malloc'd frames onto a bounded queue and return; one sender
 * thread pops them and writes them (send with MSG_NOSIGNAL, or write for a capture), and it is
 * the only thread that writes to the descriptor after the handshake. The queue's bound is the
 * observer's admission decision (frames.c): only BATCH frames are ever dropped for room, and every
 * dropped batch is counted, in records, as the agent's loss or, past the exit's deadline, as an
 * exit loss. STRINGS, STATS, FLUSH_DONE and BYE are small and always queued while the queue
 * lives, so what arrives stays decodable.
 *
 * A write that fails, a monitor that closes, or a corrupt control stream kills the queue
 * (cm__sendq_monitor_gone): its frames are freed and counted, pushes are refused from then on,
 * and the control thread is woken to turn tracing off; the process runs on.
 *
 * Locks: send_mu guards the queue and its flags (A's "Guarded by send_mu" fields); it is a leaf,
 * taken under the engine's dec_mu by the observer, and never held across a write. The counters
 * are relaxed atomics. The exit handler waits on idle_cv for the queue to run empty (exit.c).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "listen.h"
#include "agent_internal.h"

/* ---- descriptor I/O ------------------------------------------------------------------------- */

/* Writes all of p[0..n). With deadline 0 it blocks (the sender, whose stalls the exit handler
 * ends by shutting the socket down); otherwise it polls and fails with ETIMEDOUT at the deadline.
 * Sockets use MSG_NOSIGNAL: a closed peer is EPIPE, never SIGPIPE. Returns 0 or an errno. */
int cm__sendq_write_all(int fd, bool sock, const uint8_t *p, size_t n, uint64_t deadline) {
  while (n) {
    if (deadline) {
      uint64_t now = cm__mono_ms();
      if (now >= deadline) return ETIMEDOUT;
      struct pollfd pf = {.fd = fd, .events = POLLOUT};
      int pr = poll(&pf, 1, (int)(deadline - now));
      if (pr < 0 && errno == EINTR) continue;
      if (pr < 0) return errno;
      if (pr == 0) return ETIMEDOUT;
    }
    ssize_t w = sock ? send(fd, p, n, MSG_NOSIGNAL | (deadline ? MSG_DONTWAIT : 0))
                     : write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* ---- the send queue ------------------------------------------------------------------------- */

void cm__sendq_init(void) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&A.q_cv, &ca);
  pthread_cond_init(&A.idle_cv, &ca);
  pthread_condattr_destroy(&ca);
}

static void free_frames(qframe *f) {
  while (f) {
    qframe *next = f->next;
    free(f->data);
    free(f);
    f = next;
  }
}

/* Counts a BATCH frame that will never be sent: as an exit loss once the exit deadline has
 * passed, as the agent's loss (full queue, failed connection) before. Any thread. */
void cm__sendq_count_dropped(uint64_t batches, uint64_t records) {
  if (!batches) return;
  INC(batches_dropped, batches);
  if (atomic_load(&A.cut))
    INC(records_dropped_exit, records);
  else
    INC(records_dropped_agent, records);
}

/* Appends f (filled in by the caller) to the queue. send_mu held. */
void cm__sendq_link_locked(qframe *f) {
  f->next = NULL;
  f->queued_ns = cm__mono_ms() * 1000000ull;
  if (A.tail)
    A.tail->next = f;
  else
    A.head = f;
  A.tail = f;
  A.q_bytes += f->len;
  A.q_frames++;
  if (f->batch) {
    A.q_batches++;
    A.q_records += f->records;
  }
  pthread_cond_signal(&A.q_cv);
}

/* Unlinks every queued frame (not the one the sender is writing) and returns the list; the
 * batches in it no longer count as queued. send_mu held. */
static qframe *q_take_all_locked(uint64_t *batches, uint64_t *records) {
  qframe *f = A.head;
  *batches = *records = 0;
  for (qframe *p = f; p; p = p->next) {
    A.q_bytes -= p->len;
    A.q_frames--;
    if (p->batch) {
      ++*batches;
      *records += p->records;
    }
  }
  A.q_batches -= *batches;
  A.q_records -= *records;
  A.head = A.tail = NULL;
  return f;
}

/* Queues the bytes of `b` as one frame and leaves `b` empty (the queue owns them from here, or
 * frees them). The queue's bounds are the caller's decision: the observer (cm__frames_on_batch)
 * admits a BATCH before numbering and encoding it, and other frames are small and always queued
 * while the queue lives. A BATCH that cannot be queued (the queue died or closed, no memory) is
 * counted as dropped. Returns true when queued. Any thread; never blocks beyond send_mu. */
static bool q_push(cm_wire_buf *b, bool batch, uint32_t records, bool bye) {
  uint8_t *data = b->data;
  size_t len = b->len;
  cm_wire_buf_init(b);
  qframe *f = malloc(sizeof *f);
  pthread_mutex_lock(&A.send_mu);
  if (!f || A.q_dead || A.q_closed) {
    pthread_mutex_unlock(&A.send_mu);
    if (batch) cm__sendq_count_dropped(1, records);
    free(f);
    free(data);
    return false;
  }
  f->data = data;
  f->len = len;
  f->batch = batch;
  f->stats = false;
  f->bye = bye;
  f->records = records;
  cm__sendq_link_locked(f);
  pthread_mutex_unlock(&A.send_mu);
  return true;
}

bool cm__sendq_push_buf(cm_wire_buf *b, bool batch, uint32_t records) {
  return q_push(b, batch, records, false);
}

/* The exit's BYE: the one frame whose writing sets sender_drained. */
bool cm__sendq_push_bye(cm_wire_buf *b) { return q_push(b, false, 0, true); }

void cm__sendq_wake_control(void) {
  if (A.wake[1] >= 0) {
    char c = 1;
    ssize_t w = write(A.wake[1], &c, 1);
    (void)w;
  }
}

/* The monitor (or the capture file) is gone. The queue dies (its frames are freed and pushes are
 * refused), and the control thread is woken to switch tracing off. Any thread; idempotent. */
void cm__sendq_monitor_gone(const char *why) {
  if (atomic_exchange(&A.gone, true)) return;
  pthread_mutex_lock(&A.send_mu);
  A.q_dead = true;
  size_t nframes = A.q_frames;
  uint64_t batches, records;
  qframe *f = q_take_all_locked(&batches, &records);
  A.q_bytes = 0;
  A.q_frames = 0;
  pthread_cond_broadcast(&A.q_cv);
  pthread_cond_broadcast(&A.idle_cv);
  pthread_mutex_unlock(&A.send_mu);
  cm__sendq_count_dropped(batches, records);
  free_frames(f);
  if (atomic_load(&A.exiting))
    alog(CM_LOG_DEBUG, "%s %s during exit", A.is_socket ? "monitor connection" : "capture", why);
  else if (cm__listen_mode())
    alog(CM_LOG_INFO, "the monitor detached (%s); %zu queued frames discarded", why, nframes);
  else
    alog(CM_LOG_WARN,
         "%s: %s; tracing off, the application continues (%zu queued frames discarded, %llu "
         "batches dropped in all)",
         A.is_socket ? "the monitor connection is lost" : "the capture file cannot be written",
         why, nframes, (unsigned long long)GET(batches_dropped));
  cm__sendq_wake_control();
}

void *cm__sendq_sender_main(void *arg) {
  pthread_setname_np(pthread_self(), "cm-send");
  (void)arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  pthread_mutex_lock(&A.send_mu);
  for (;;) {
    while (!A.head && !A.q_dead && !A.sender_stop) pthread_cond_wait(&A.q_cv, &A.send_mu);
    if (A.q_dead) break;
    /* Stopped with the queue empty: sender_drained is left as the BYE frame set it. An exit that
     * could not build or queue BYE leaves it false, so the exit says that BYE did not get out. */
    if (!A.head && A.sender_stop) break;
    qframe *f = A.head;
    A.head = f->next;
    if (!A.head) A.tail = NULL;
    A.sending = true;
    pthread_mutex_unlock(&A.send_mu);

    int err = cm__sendq_write_all(A.fd, A.is_socket, f->data, f->len, 0);
    if (!err) {
      INC(bytes_sent, f->len);
      INC(frames_sent, 1);
      if (f->batch) {
        INC(batches_sent, 1);
        INC(records_sent, f->records);
        uint64_t now = cm__mono_ms() * 1000000ull;
        uint64_t wait = now > f->queued_ns ? now - f->queued_ns : 0;
        atomic_store_explicit(&A.send_wait_ns, wait, memory_order_relaxed);
        if (wait > GET(send_wait_peak_ns))
          atomic_store_explicit(&A.send_wait_peak_ns, wait, memory_order_relaxed);
      }
    } else if (f->batch) {
      cm__sendq_count_dropped(1, f->records);
    }
    /* BYE written whole: the monitor has the process's end, whatever happens to the connection
     * next. The monitor closes it once it has read BYE, and the control thread may then mark
     * the queue dead before this thread looks at it again; the exit's account goes by this. */
    if (!err && f->bye) atomic_store(&A.sender_drained, true);
    size_t len = f->len;
    bool f_batch = f->batch;
    uint32_t f_records = f->records;
    free(f->data);
    free(f);

    pthread_mutex_lock(&A.send_mu);
    A.sending = false;
    if (!A.q_dead) {
      A.q_bytes -= len;
      A.q_frames--;
    }
    if (err && f_batch) {
      A.q_batches--;
      A.q_records -= f_records;
    }
    if (!A.head) pthread_cond_broadcast(&A.idle_cv);
    if (err) {
      pthread_mutex_unlock(&A.send_mu);
      char why[128];
      snprintf(why, sizeof why, "write failed: %s", strerror(err));
      cm__sendq_monitor_gone(why);
      pthread_mutex_lock(&A.send_mu);
      break;
    }
  }
  pthread_cond_broadcast(&A.idle_cv);
  pthread_mutex_unlock(&A.send_mu);
  return NULL;
}

/* Removes the BATCH frames still queued (not the one being written), counting them as dropped at
 * the exit deadline (A.cut is set first), so the STATS frame queued after them reports them. The
 * STATS frames still queued go too: they counted the removed batches as queued ahead of them,
 * which is no longer true (the final STATS replaces them).
 * Returns the records; *batches receives the frames. send_mu held. */
uint64_t cm__sendq_purge_batches_locked(uint64_t *batches) {
  uint64_t records = 0;
  *batches = 0;
  qframe **pp = &A.head, *last = NULL, *gone = NULL;
  while (*pp) {
    qframe *f = *pp;
    if (f->stats) {
      *pp = f->next;
      A.q_bytes -= f->len;
      A.q_frames--;
      f->next = gone;
      gone = f;
    } else if (f->batch) {
      *pp = f->next;
      A.q_bytes -= f->len;
      A.q_frames--;
      A.q_batches--;
      A.q_records -= f->records;
      cm__sendq_count_dropped(1, f->records);
      ++*batches;
      records += f->records;
      f->next = gone;
      gone = f;
    } else {
      last = f;
      pp = &f->next;
    }
  }
  A.tail = last;
  free_frames(gone);
  return records;
}
