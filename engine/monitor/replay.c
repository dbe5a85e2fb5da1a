/*
 * replay.c: `cuptimon-lua --replay capture [--replay capture ...] script.lua`: captures replayed
 * through a script as if their processes were live.
 *
 * Design note. Each capture is a stream of frames; HELLO frames separate its processes, and each
 * process becomes a wire source (hub_source.c) of kind "replay", attached on its HELLO (the
 * script's process_start hooks run) and detached on its BYE or at the end of the capture
 * (process_exit). Several captures (one per rank, say) replay concurrently: every stream keeps
 * one BATCH frame pending, keyed by the smallest value of the kind's start column (the SCHEMA
 * names it: "start", else "timestamp"); the batch with the smallest key is delivered next, then
 * its stream reads ahead to its next BATCH, handling the SCHEMA, STRINGS and STATS frames on
 * the way. A batch whose kind has no start column takes its stream's previous key, so it keeps
 * its place in its own stream. Timestamps are CLOCK_REALTIME, so processes of one host merge
 * correctly; across hosts the merge is only as good as their clocks.
 *
 * The replay is driven from a uv_idle handle, a bounded number of batches per loop turn, so it
 * runs as fast as the script consumes while the script's timers and luv handles still run. It
 * starts on the first turn of the loop, after the script has registered its observers.
 *
 * Errors: a capture that cannot be opened or read fails the start (cuptimon-lua exits 1); a
 * truncated one replays up to its last whole frame and a corrupt one up to the bad frame, each
 * with a warning naming the byte offset, and the run goes on.
 *
 * Loop thread only. The replay is a singleton, like the hub.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hub.h"

typedef struct stream {
  const char *path;
  cm_wire_file *cf;
  cm__wsrc *cur;       /* the process whose frames are being read */
  int done;
  int pending;         /* `frame` holds a BATCH not delivered yet */
  cm_wire_frame frame; /* valid until the next cm_wire_file_next on cf */
  uint64_t key, last_key;
} stream;

typedef struct replay {
  cm_host *h;
  uv_loop_t *loop;
  uv_idle_t idle;
  int started, closed;
  stream *s;
  int n;
  void (*finished)(void *ud);
  void *ud;
} replay;

static replay *g_replay;

/* Batches delivered per loop turn: large enough to amortize the turn, small enough that a
 * script's timers run on time. */
enum { BATCHES_PER_TURN = 64 };

static void proc_detached(cm__wsrc *w) {
  stream *st = w->owner;
  if (st && st->cur == w) st->cur = NULL;
  cm__wsrc_release(w);
  free(w);
}

static const cm__wsrc_ops replay_ops = {.detached = proc_detached};

static void end_process(stream *st, int end) {
  cm__wsrc *w = st->cur;
  if (!w) return;
  if (w->end == CM__END_NONE) w->end = end;
  st->cur = NULL;
  w->owner = NULL;
  if (w->attached) cm__wsrc_detach(w); /* process_exit; frees w */
  else proc_detached(w);
}

static int new_process(replay *rp, stream *st) {
  cm__wsrc *w = calloc(1, sizeof *w);
  if (!w) return CM_ENOMEM;
  cm__wsrc_init(w, &replay_ops, st, "replay");
  st->cur = w;
  return 0;
}

static void stream_fail(stream *st, const char *what) {
  fprintf(stderr, "cuptimon-lua: warning: capture %s: %s\n", st->path, what);
  st->done = 1;
  st->pending = 0;
  end_process(st, CM__END_ERROR);
}

/* Reads ahead to the next BATCH of a stream, handling the frames before it. */
static void advance(replay *rp, stream *st) {
  char err[CM_WIRE_ERRMSG_SIZE + 64];
  st->pending = 0;
  while (!st->done) {
    cm_wire_frame f;
    int rc = cm_wire_file_next(st->cf, &f);
    if (rc == 0) {
      st->done = 1;
      end_process(st, CM__END_EOF);
      return;
    }
    if (rc < 0) {
      stream_fail(st, cm_wire_file_errmsg(st->cf));
      return;
    }
    if (f.type == CM_WIRE_HELLO) {
      end_process(st, CM__END_EOF);
      if (new_process(rp, st)) { stream_fail(st, "out of memory"); return; }
      err[0] = 0;
      if (cm__wsrc_frame(st->cur, &f, err, sizeof err)) { stream_fail(st, err); return; }
      if (cm__wsrc_attach(st->cur, rp->h)) { stream_fail(st, "too many processes"); return; }
      continue;
    }
    if (!st->cur) {
      /* Frames before any HELLO: an anonymous process. */
      if (new_process(rp, st)) { stream_fail(st, "out of memory"); return; }
      if (cm__wsrc_attach(st->cur, rp->h)) { stream_fail(st, "too many processes"); return; }
    }
    if (f.type == CM_WIRE_BATCH) {
      st->frame = f;
      st->pending = 1;
      uint64_t k = cm__wsrc_batch_key(st->cur, &f);
      st->key = k == UINT64_MAX ? st->last_key : k;
      st->last_key = st->key;
      return;
    }
    err[0] = 0;
    if (cm__wsrc_frame(st->cur, &f, err, sizeof err)) { stream_fail(st, err); return; }
    if (f.type == CM_WIRE_BYE) end_process(st, CM__END_BYE);
  }
}

static void stop(replay *rp) {
  if (!rp->closed) {
    uv_idle_stop(&rp->idle);
  }
}

static void idle_cb(uv_idle_t *hd) {
  replay *rp = hd->data;
  if (!rp->started) {
    rp->started = 1;
    for (int i = 0; i < rp->n; i++) advance(rp, &rp->s[i]);
  }
  for (int turn = 0; turn < BATCHES_PER_TURN; turn++) {
    if (cm_host_exit_requested(rp->h, NULL)) {
      stop(rp);
      return;
    }
    stream *best = NULL;
    for (int i = 0; i < rp->n; i++) {
      stream *st = &rp->s[i];
      if (st->pending && (!best || st->key < best->key)) best = st;
    }
    if (!best) {
      stop(rp);
      if (rp->finished) rp->finished(rp->ud);
      return;
    }
    char err[CM_WIRE_ERRMSG_SIZE + 64] = "";
    best->pending = 0;
    if (best->cur && cm__wsrc_frame(best->cur, &best->frame, err, sizeof err)) {
      stream_fail(best, err);
      continue;
    }
    advance(rp, best);
  }
}

int cm__replay_start(cm_host *h, uv_loop_t *loop, const char *const *paths, int n,
                     void (*finished)(void *ud), void *ud) {
  replay *rp = calloc(1, sizeof *rp);
  stream *s = calloc((size_t)n, sizeof *s);
  if (!rp || !s) {
    free(rp);
    free(s);
    return CM_ENOMEM;
  }
  rp->h = h;
  rp->loop = loop;
  rp->s = s;
  rp->n = n;
  rp->finished = finished;
  rp->ud = ud;
  g_replay = rp;
  uv_idle_init(loop, &rp->idle);
  rp->idle.data = rp;
  for (int i = 0; i < n; i++) {
    s[i].path = paths[i];
    struct stat sb;
    char msg[CM_WIRE_ERRMSG_SIZE];
    if (stat(paths[i], &sb) != 0 || !S_ISREG(sb.st_mode)) {
      fprintf(stderr, "cuptimon-lua: cannot read capture %s: %s\n", paths[i],
              stat(paths[i], &sb) != 0 ? strerror(errno) : "not a regular file");
      return CM_EIO;
    }
    int rc = cm_wire_file_open(&s[i].cf, paths[i], msg);
    if (rc) {
      fprintf(stderr, "cuptimon-lua: %s\n", msg[0] ? msg : cm_strerror(rc));
      return rc;
    }
  }
  uv_idle_start(&rp->idle, idle_cb);
  return 0;
}

static void free_replay(uv_handle_t *hd) { free(hd->data); }

void cm__replay_free(void) {
  replay *rp = g_replay;
  if (!rp) return;
  g_replay = NULL;
  for (int i = 0; i < rp->n; i++) {
    if (rp->s[i].cur) {
      rp->s[i].cur->owner = NULL;
      rp->s[i].cur = NULL; /* the host detaches and frees attached processes */
    }
    cm_wire_file_close(rp->s[i].cf);
  }
  free(rp->s);
  rp->s = NULL;
  rp->n = 0;
  /* Last: the idle handle's close callback frees rp itself. */
  if (!rp->closed) {
    rp->closed = 1;
    uv_idle_stop(&rp->idle);
    uv_close((uv_handle_t *)&rp->idle, free_replay);
  } else {
    free(rp);
  }
}
