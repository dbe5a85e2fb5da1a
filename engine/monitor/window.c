/*
 * window.c: a trigger window (cm.window) on one live process (see window.h).
 *
 * Design note. The capture a window writes is a complete one: the HELLO, the schema and string
 * table known when the window opened, the window's BATCH frames renumbered from 1, its own SCHEMA
 * and STRINGS frames, then a STATS with the window's counts and a BYE, so a replay accounts for
 * every record and reports no loss. The losses the window reports are the process's losses at
 * its end less those at its opening, read from the wire source's STATS.
 *
 * Loop thread only. A window owns its recorder and capture (record.c) and frees them when it
 * finishes; the done callback runs last, after the window is freed, because it runs Lua.
 */
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "record.h"
#include "window.h"

/* A window; its fields are the loop thread's. */
struct cm__window {
  int opened, closing;
  int status;             /* the first failure, or 0 */
  cm__record *rec;        /* the capture's recorder (record.c), NULL without a file */
  cm__capture *cap;
  uint32_t number;        /* BATCH frames written */
  uint64_t batches, records;
  uint64_t by_kind[CM_KIND_MAX];
  cm_loss loss0;          /* the process's losses when the window opened */
  uint64_t open_ns, end_ns; /* uv_hrtime() at the opening FLUSH_DONE and at cm__window_end */
  uint64_t selects0;        /* the agent's selects_applied at the opening fence */
  uint64_t failed0;         /* the agent's selects_failed when the window began */
  cm__window_done_fn done;
  void *ud;
  cm_wire_batch wb;       /* decode space (large: kept off the stack) */
};

int cm__window_new(cm__window **out, const char *path, int force, const cm_wire_frame *hello,
                   uint32_t pid, const cm__wsrc *w, cm__window_done_fn done, void *ud) {
  cm__window *win = calloc(1, sizeof *win);
  if (!win) return CM_ENOMEM;
  if (path) {
    cm_wire_hello hl;
    int rc = cm__record_new(&win->rec, path, (force ? CM__RECORD_FORCE : 0) | CM__RECORD_EACH_PID);
    if (!rc && (!hello || cm_wire_decode_hello(hello, &hl))) rc = CM_EIO;
    if (!rc) {
      win->cap = cm__record_open(win->rec, pid, &hl);
      cm_wire_hello_release(&hl);
      if (!win->cap) rc = CM_EIO;
    }
    if (rc) {
      cm__record_free(win->rec, 0);
      free(win);
      return rc;
    }
  }
  win->done = done;
  win->ud = ud;
  win->failed0 = cm__wsrc_stat(w, "selects_failed");
  *out = win;
  return 0;
}

/* The opening fence completed: the frames from here on are the window's. */
void cm__window_opened(cm__window *win, const cm__wsrc *w, int status) {
  if (win->opened) return;
  if (status && !win->status) win->status = status;
  win->opened = 1;
  win->open_ns = uv_hrtime();
  win->selects0 = cm__wsrc_stat(w, "selects_applied");
  cm__wsrc_loss(w, &win->loss0);
  if (win->cap) {
    cm_wire_buf buf;
    cm_wire_buf_init(&buf);
    int rc = cm__wsrc_write_state(w, &buf);
    if (rc && !win->status) win->status = rc;
    cm__record_bytes(win->cap, &buf, (uint64_t)(w->nkinds > 0) + (uint64_t)(w->nstr > 0));
    cm_wire_buf_free(&buf);
  }
}

/* A frame of the window's interval: counted, and written to its capture. The process's own
 * STATS and BYE are left out (their counts cover the whole process; the window writes its own). */
void cm__window_frame(cm__window *win, const cm_wire_frame *f) {
  if (!win->opened) return; /* before the opening fence: not the window's */
  if (f->type == CM_WIRE_BATCH) {
    if (cm_wire_decode_batch(f, NULL, &win->wb)) return; /* cm__wsrc_frame accepted it already */
    const cm_batch *b = &win->wb.batch;
    win->batches++;
    win->records += b->n;
    if (b->kind >= 0 && b->kind < CM_KIND_MAX) win->by_kind[b->kind] += b->n;
    if (win->cap) {
      cm_wire_buf buf;
      cm_wire_buf_init(&buf);
      if (cm_wire_write_batch_numbered(&buf, b, ++win->number) == 0)
        cm__record_bytes(win->cap, &buf, 1);
      else if (!win->status)
        win->status = CM_ENOMEM;
      cm_wire_buf_free(&buf);
    }
  } else if (f->type == CM_WIRE_SCHEMA || f->type == CM_WIRE_STRINGS) {
    cm__record_frame(win->cap, f);
  }
}

int cm__window_end(cm__window *win) {
  if (win->closing) return 1;
  win->closing = 1;
  /* The narrowing SELECT (core.retire) went first: the span ends here. */
  win->end_ns = uv_hrtime();
  return 0;
}

/* Ends the window: its capture gets the window's STATS and a BYE, and done gets the counts. */
void cm__window_finish(cm__window *win, const cm__wsrc *w, int status) {
  if (status && !win->status) win->status = status;
  cm_loss now;
  cm__wsrc_loss(w, &now);
  uint64_t d_cupti = now.dropped_cupti - win->loss0.dropped_cupti;
  uint64_t d_agent = now.dropped_agent - win->loss0.dropped_agent;
  uint64_t d_exit = now.dropped_exit - win->loss0.dropped_exit;
  /* The agent refused the window's selection (its log says why: CUPTI still being finalized,
   * say): the window traced nothing it asked for, so it is no sample. */
  if (cm__wsrc_stat(w, "selects_failed") != win->failed0 && !win->status)
    win->status = CM_EAGAIN;
  if (!win->opened) d_cupti = d_agent = d_exit = 0;
  char *path = NULL;
  if (win->cap) {
    cm_wire_kv kv[] = {{"records_queued", win->records}, {"batches_queued", win->batches},
                       {"records_dropped", d_cupti},     {"records_dropped_agent", d_agent},
                       {"records_dropped_exit", d_exit}};
    cm_wire_buf buf;
    cm_wire_buf_init(&buf);
    int rc = cm_wire_write_stats(&buf, kv, sizeof kv / sizeof kv[0]);
    if (!rc) rc = cm_wire_write_bye(&buf, CM_WIRE_BYE_DETACH, -1, "the trigger window ended");
    if (rc && !win->status) win->status = rc;
    cm__record_bytes(win->cap, &buf, 2);
    cm_wire_buf_free(&buf);
    path = strdup(cm__record_path(win->cap));
    cm__record_close(win->rec, win->cap, win->batches, win->records, d_cupti + d_agent + d_exit, 0);
    if (cm__record_failures(win->rec) && !win->status) win->status = CM_EIO;
    cm__record_free(win->rec, 0);
  }
  /* The counts by kind are copied: `win` is freed before the script's callback runs. */
  uint64_t by_kind[CM_KIND_MAX];
  memcpy(by_kind, win->by_kind, sizeof by_kind);
  /* The agent's own span: exactly two SELECTs (the widening and the narrowing) were applied
   * between the fences, at the instants its STATS reported (engine/agent/tracing.c,
   * selects_applied). */
  uint64_t agent_ns = 0;
  uint64_t last = cm__wsrc_stat(w, "select_last_ns"), prev = cm__wsrc_stat(w, "select_prev_ns");
  if (win->opened && cm__wsrc_stat(w, "selects_applied") == win->selects0 + 2 && prev &&
      last > prev)
    agent_ns = last - prev;
  cm__window_result r = {.status = win->status, .path = path, .records = win->records,
                         .batches = win->batches, .frames = win->number,
                         .dropped = d_cupti + d_agent + d_exit, .by_kind = by_kind,
                         .open_ns = win->opened ? win->open_ns : 0,
                         .end_ns = win->opened ? (win->end_ns ? win->end_ns : uv_hrtime()) : 0,
                         .agent_ns = agent_ns};
  cm__window_done_fn done = win->done;
  void *ud = win->ud;
  free(win);
  done(ud, &r); /* runs Lua: last */
  free(path);
}
