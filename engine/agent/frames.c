/*
 * frames.c: the frames the agent writes while it streams: BATCH (the observer), the STRINGS that
 * the batches need, and STATS.
 *
 * Design note. The observer (cm__frames_on_batch) runs where the engine delivers (its decode
 * worker, or a thread in cm_flush), serialized by the engine, so the callback state (A.cb_*)
 * needs no lock. It only encodes and pushes; it never blocks on I/O. Before a batch that carries
 * string ids, the strings interned since the last call go out as STRINGS frames, so the wire rule
 * (a string before its first use) holds. A batch is admitted against the queue's bound before it
 * is numbered and encoded, and one over it is dropped and counted; the numbers of the queued
 * frames therefore have no gaps, and each STATS frame says how many records were queued ahead of
 * it, so the monitor can count what never reached it. STATS goes out once a second while records
 * flow, and at each flush, lag guard step and exit. Lock order: the engine's dec_mu, then send_mu.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "agent_internal.h"

enum {
  MAX_BATCH_FRAME = 8 << 20, /* a larger batch is split into frames of about this size */
  MAX_STRINGS_FRAME = 4 << 20,
};

/* Fills kv with the STATS counters: the engine's (from st) and the agent's. send_mu held, so that
 * records_queued and batches_queued describe exactly the BATCH frames queued ahead of this STATS
 * frame: a monitor that has received fewer knows that the difference was lost on the way. */
static uint32_t stats_items_locked(const cm_stats *stp, cm_wire_kv *kv) {
  cm_stats st = *stp;
  st.buffers_allocated -= A.base.buffers_allocated;
  st.buffers_decoded -= A.base.buffers_decoded;
  st.buffers_refused -= A.base.buffers_refused;
  st.records_decoded -= A.base.records_decoded;
  st.records_delivered -= A.base.records_delivered;
  st.records_dropped -= A.base.records_dropped;
  st.fence_timeouts -= A.base.fence_timeouts;
  uint32_t n = 0;
#define KV(nm, v) kv[n++] = (cm_wire_kv){.name = nm, .value = (v)}
  KV("buffers_allocated", st.buffers_allocated);
  KV("buffers_outstanding", st.buffers_outstanding);
  KV("buffers_free", st.buffers_free);
  KV("buffers_decoded", st.buffers_decoded);
  KV("buffers_refused", st.buffers_refused);
  KV("records_decoded", st.records_decoded);
  KV("records_delivered", st.records_delivered);
  KV("records_dropped", st.records_dropped);
  KV("fence_timeouts", st.fence_timeouts);
  KV("batches_sent", GET(batches_sent));
  KV("batches_dropped", GET(batches_dropped));
  KV("records_sent", GET(records_sent));
  KV("records_dropped_agent", GET(records_dropped_agent));
  KV("records_dropped_exit", GET(records_dropped_exit));
  KV("records_queued", A.q_records);
  KV("batches_queued", A.q_batches);
  KV("strings_sent", GET(strings_sent));
  KV("bytes_sent", GET(bytes_sent));
  KV("selects_applied", GET(selects_applied));
  KV("select_last_ns", GET(select_last_ns));
  KV("select_prev_ns", GET(select_prev_ns));
  KV("selects_failed", GET(selects_failed));
  KV("exit_tail_unknown", atomic_load(&A.tail_unknown) ? 1 : 0);
  KV("lag_cupti_ns", st.lag_cupti_ns);
  KV("lag_decode_ns", st.lag_decode_ns);
  KV("lag_decode_peak_ns", st.lag_decode_peak_ns);
  KV("decode_wait_ns", st.decode_wait_ns);
  KV("send_wait_ns", GET(send_wait_ns));
  KV("send_wait_peak_ns", GET(send_wait_peak_ns));
  KV("guard_shed", GET(guard_shed));
  KV("guard_sheds", GET(guard_sheds));
  KV("guard_lag_ns", GET(guard_lag_ns));
  KV("guard_limit_ns", A.guard.limit_ns);
  KV("guard_buffers_limit", A.guard.buffers_limit);
  KV("cupti_buffers", A.eng ? cm__engine_cupti_buffers(A.eng) : 0);
  KV("lag_held_ns", GET(guard_held_ns));
  KV("cupti_detaches", st.cupti_detaches);
  KV("cupti_detach_ns", st.cupti_detach_ns);
  KV("cupti_attach_ns", st.cupti_attach_ns);
  KV("cupti_idle_mode", (uint64_t)atomic_load(&A.idle_mode));
  KV("kind_changes", st.kind_changes);
  KV("kind_change_ns", st.kind_change_ns);
  KV("kind_change_max_ns", st.kind_change_max_ns);
  /* PM sampling's counters (wire 1.2); pm_overflows and pm_dropped are samples lost. The engine's
   * PM lock is a leaf, so it may be taken under send_mu. */
  cm_pm_stats pm;
  memset(&pm, 0, sizeof pm);
  if (A.eng) cm_pm_stats_get(A.eng, &pm);
  KV("pm_samples", pm.samples);
  KV("pm_filtered", pm.filtered);
  KV("pm_overflows", pm.overflows);
  KV("pm_dropped", pm.dropped);
#undef KV
  return n;
}

/* Encodes a STATS frame and links it to the queue. send_mu held, and the queue alive; `st` holds
 * the engine's counters, which the caller read without send_mu (the engine's locks come first). */
static void q_link_stats_locked(const cm_stats *st) {
  cm_wire_kv kv[56]; /* stats_items_locked writes at most 46 */
  uint32_t n = stats_items_locked(st, kv);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  qframe *f = malloc(sizeof *f);
  if (f && cm_wire_write_stats(&b, kv, n) == 0) {
    f->data = b.data;
    f->len = b.len;
    f->batch = false;
    f->stats = true;
    f->bye = false;
    f->records = 0;
    cm__sendq_link_locked(f);
  } else {
    free(f);
    cm_wire_buf_free(&b);
  }
}

void cm__frames_push_stats(void) {
  cm_stats st;
  memset(&st, 0, sizeof st);
  if (A.eng) cm_stats_get(A.eng, &st);
  pthread_mutex_lock(&A.send_mu);
  if (!A.q_dead && !A.q_closed) q_link_stats_locked(&st);
  pthread_mutex_unlock(&A.send_mu);
}

/* Queues STRINGS frames for every id interned since the last call. Ids are dense and interned in
 * order, so "not sent before" is everything from the high-water mark up; sending them ahead of
 * the batch that first uses them satisfies the wire rule. Callback state: cm__frames_on_batch
 * only. */
static void push_new_strings(void) {
  uint32_t count = cm_string_count(A.eng);
  if (A.cb_strings_sent == 0) A.cb_strings_sent = 1; /* id 0 is the empty string, never sent */
  while (A.cb_strings_sent < count) {
    uint32_t first = A.cb_strings_sent, n = 0;
    size_t bytes = 0;
    cm_wire_string *ents = malloc((size_t)(count - first) * sizeof *ents);
    if (!ents) return; /* tried again before the next batch */
    for (uint32_t id = first; id < count && bytes < MAX_STRINGS_FRAME && n < (1u << 20); id++) {
      size_t len = 0;
      const char *s = cm_string(A.eng, id, &len);
      ents[n++] = (cm_wire_string){.id = id, .len = (uint32_t)len, .bytes = s ? s : ""};
      if (!s) ents[n - 1].len = 0;
      bytes += len + 16;
    }
    cm_wire_buf b;
    cm_wire_buf_init(&b);
    int rc = cm_wire_write_strings(&b, ents, n);
    free(ents);
    if (rc) {
      cm_wire_buf_free(&b);
      return;
    }
    cm__sendq_push_buf(&b, false, 0);
    A.cb_strings_sent = first + n;
    INC(strings_sent, n);
  }
}

/* The observer. It runs on the engine's decode worker or on a flushing thread, serialized by the
 * engine. Two observers are registered for a moment while a SELECT swaps them (the new one is
 * added before the old one goes, so unchanged kinds are never toggled); both then receive the
 * same drain, the newest first (the engine's order). The generation rule sends each (drain, kind)
 * once, from the newest observer, whose columns are the ones the monitor asked for: an observer
 * older than the newest one seen is retired, and a repeat of the (seq, kind) just sent is
 * skipped. */
void cm__frames_on_batch(void *ud, const cm_batch *b) {
  /* While one observer replaces another (cm__tracing_apply_selection adds the new one first), the
   * engine hands a drain's batch of a kind both select to the new observer and then to the old
   * one: the second is the same records, skipped here by its seq. A kind only the old observer selects
   * (one the new selection turns off) reaches the old observer alone, and is forwarded: those are
   * the records written before the kind was turned off. Skipping every batch of an older
   * observer once the newer one has received one would lose them silently. */
  (void)ud;
  if (b->seq == A.cb_last_seq && b->kind == A.cb_last_kind) return;
  A.cb_last_seq = b->seq;
  A.cb_last_kind = b->kind;
  if (atomic_load_explicit(&A.gone, memory_order_relaxed) || b->n == 0) return;

  bool has_str = false;
  size_t row_bytes = 0;
  for (uint32_t c = 0; c < b->ncols; c++) {
    if (b->cols[c].type == CM_TYPE_STR) has_str = true;
    row_bytes += b->cols[c].width;
  }
  if (has_str) push_new_strings();

  /* A large drain is split into frames of at most MAX_BATCH_FRAME bytes (and a quarter of the
   * queue's bound, so that a small queue still admits whole frames); they share the drain's seq.
   * Each piece is its own BATCH with the same columns. */
  pthread_mutex_lock(&A.send_mu);
  size_t frame_cap = A.max_bytes / 4 < MAX_BATCH_FRAME ? A.max_bytes / 4 : MAX_BATCH_FRAME;
  pthread_mutex_unlock(&A.send_mu);
  uint32_t rows = row_bytes ? (uint32_t)(frame_cap / row_bytes) : b->n;
  if (rows == 0) rows = 1;
  cm_column cols[CM_WIRE_MAX_COLS];
  uint32_t ncols = b->ncols > CM_WIRE_MAX_COLS ? CM_WIRE_MAX_COLS : b->ncols;
  for (uint32_t at = 0; at < b->n; at += rows) {
    uint32_t n = b->n - at < rows ? b->n - at : rows;
    size_t est = 48 + 24 * (size_t)ncols + row_bytes * n + 8 * (size_t)ncols;
    /* The admission decision: only this callback queues batches (the engine serializes it),
     * and est bounds the encoded size, so an admitted frame is queued unless the queue dies or
     * closes meanwhile; the small frames of other threads may overshoot the bound a little. */
    pthread_mutex_lock(&A.send_mu);
    bool full = A.q_bytes + est > A.max_bytes || A.q_frames + 1 > A.max_frames;
    pthread_mutex_unlock(&A.send_mu);
    if (full) {
      cm__sendq_count_dropped(1, n);
      continue;
    }
    /* Numbered once admitted, so the numbers of the queued frames have no gaps (0 is skipped
     * when they wrap: it means "not numbered"). */
    if (++A.cb_number == 0) A.cb_number = 1;
    for (uint32_t c = 0; c < ncols; c++) {
      cols[c] = b->cols[c];
      cols[c].data = (const uint8_t *)b->cols[c].data + (size_t)at * b->cols[c].width;
    }
    cm_batch piece = {.kind = b->kind, .n = n, .ncols = ncols, .cols = cols, .seq = b->seq};
    if (cm_wire_write_batch_numbered(&A.cb_buf, &piece, A.cb_number) != 0) {
      cm_wire_buf_clear(&A.cb_buf);
      cm__sendq_count_dropped(1, n);
      continue;
    }
    cm__sendq_push_buf(&A.cb_buf, true, n);
  }
  /* While records flow, STATS goes out once a second too, so the monitor sees the lag and the
   * backlog live, not only at flushes and at exit. */
  uint64_t now = cm__mono_ms();
  if (now - A.cb_stats_ms >= 1000) {
    A.cb_stats_ms = now;
    cm__frames_push_stats();
  }
}
