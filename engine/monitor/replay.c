/*
 * replay.c: `cuptimon-lua --replay capture [--replay capture ...] script.lua`: captures replayed
 * through a script as if their processes were live.
 *
 * Design note. Each capture is a stream of frames; HELLO frames separate its processes, and each
 * process becomes a wire source (wsrc.c) of kind "replay", attached on its HELLO (the
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
 * Errors: a capture that cannot be opened or read, or is not a capture (its 24-byte file header
 * is checked at once), fails the start (cuptimon-lua exits 1 before the script runs). A
 * truncated one replays up to its last whole frame, with a warning naming the byte offset. In a
 * corrupt one, the file reader skips each corrupt stretch to the next valid frame (docs/wire.md,
 * "Resynchronizing"), with a warning naming the offset and the bytes skipped, and the replay goes
 * on; the frames after it belong to the process of the last HELLO read, and that process is
 * incomplete (the bytes skipped are counted in its loss, so the run prints the LOST line and exits
 * 3). A frame whose payload
 * does not decode ends its capture with a warning. A capture that yields no frame at all makes
 * the run's status 1 (through `finished`), so an empty or ruined capture never looks like a
 * clean replay of nothing.
 *
 * Loop thread only. The replay is a singleton, like the hub.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hub.h"
#include "wsrc.h"

typedef struct stream {
  const char *path;
  cm_wire_file *cf;
  cm__wsrc *cur;       /* the process whose frames are being read */
  int done;
  int pending;         /* `frame` holds a BATCH not delivered yet */
  cm_wire_frame frame; /* valid until the next cm_wire_file_next on cf */
  uint64_t key, last_key;
  uint64_t frames;     /* frames read */
  uint64_t resyncs;     /* corrupt stretches reported so far */
  uint64_t skipped;     /* their bytes, as attributed so far */
  uint64_t orphan_skip; /* bytes skipped before any process: charged to the next one */
} stream;

typedef struct replay {
  cm_host *h;
  uv_loop_t *loop;
  uv_idle_t idle;
  int started, closed;
  stream *s;
  int n;
  int empty;           /* captures that yielded no frame */
  void (*finished)(void *ud, int status);
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
  w->skipped_bytes = st->orphan_skip;
  st->orphan_skip = 0;
  st->cur = w;
  return 0;
}

/* Charges the bytes the reader skipped since the last call (corrupt stretches, the one the
 * capture ended in included) to the process being read: frames of it may have been in them, so
 * its counts become a lower bound (incomplete: the LOST line and status 3). A process whose BYE
 * was read stays current until the next frame, so damage right after its end is charged to it;
 * bytes before any process go to the next one. */
static void charge_skipped(stream *st) {
  uint64_t bytes = 0;
  cm_wire_file_resyncs(st->cf, &bytes);
  if (bytes == st->skipped) return;
  uint64_t d = bytes - st->skipped;
  st->skipped = bytes;
  if (st->cur) st->cur->skipped_bytes += d;
  else st->orphan_skip += d;
}

/* The stream is over; a capture that gave nothing is reported and fails the run. */
static void stream_done(replay *rp, stream *st, int end) {
  st->done = 1;
  st->pending = 0;
  end_process(st, end);
  if (st->frames == 0) {
    fprintf(stderr, "cuptimon-lua: capture %s: no frame could be read from it\n", st->path);
    rp->empty++;
  }
}

/* The rest of the capture cannot be read: the process being read loses its end, even one whose
 * BYE came (what followed it is unknown). */
static void stream_fail(replay *rp, stream *st, const char *what) {
  fprintf(stderr, "cuptimon-lua: warning: capture %s: %s\n", st->path, what);
  charge_skipped(st);
  if (st->cur && st->cur->end == CM__END_BYE && st->cur->skipped_bytes == 0) st->cur->end = CM__END_ERROR;
  stream_done(rp, st, CM__END_ERROR);
}

/* Reads ahead to the next BATCH of a stream, handling the frames before it. */
static void advance(replay *rp, stream *st) {
  char err[CM_WIRE_ERRMSG_SIZE + 64];
  st->pending = 0;
  while (!st->done) {
    cm_wire_frame f;
    int rc = cm_wire_file_next(st->cf, &f);
    if (rc == 0) {
      charge_skipped(st);
      stream_done(rp, st, CM__END_EOF);
      return;
    }
    if (rc < 0) {
      stream_fail(rp, st, cm_wire_file_errmsg(st->cf));
      return;
    }
    st->frames++;
    uint64_t resyncs = cm_wire_reader_resyncs(f.reader, NULL);
    if (resyncs != st->resyncs) {
      st->resyncs = resyncs;
      fprintf(stderr, "cuptimon-lua: warning: capture %s: %s\n", st->path, cm_wire_reader_resync_msg(f.reader));
    }
    charge_skipped(st);
    if (st->cur && st->cur->end == CM__END_BYE) end_process(st, CM__END_BYE);
    if (f.type == CM_WIRE_HELLO) {
      end_process(st, CM__END_EOF);
      if (new_process(rp, st)) { stream_fail(rp, st, "out of memory"); return; }
      err[0] = 0;
      if (cm__wsrc_frame(st->cur, &f, err, sizeof err)) { stream_fail(rp, st, err); return; }
      if (cm__wsrc_attach(st->cur, rp->h)) { stream_fail(rp, st, "too many processes"); return; }
      continue;
    }
    if (!st->cur) {
      /* Frames before any HELLO: an anonymous process. */
      if (new_process(rp, st)) { stream_fail(rp, st, "out of memory"); return; }
      if (cm__wsrc_attach(st->cur, rp->h)) { stream_fail(rp, st, "too many processes"); return; }
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
    if (cm__wsrc_frame(st->cur, &f, err, sizeof err)) { stream_fail(rp, st, err); return; }
    /* After BYE the process stays current until the next frame (charge_skipped). */
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
      if (rp->finished) rp->finished(rp->ud, rp->empty ? 1 : 0);
      return;
    }
    char err[CM_WIRE_ERRMSG_SIZE + 64] = "";
    best->pending = 0;
    if (best->cur && cm__wsrc_frame(best->cur, &best->frame, err, sizeof err)) {
      stream_fail(rp, best, err);
      continue;
    }
    advance(rp, best);
  }
}

/* Checks the capture file header, so that a file that is not a capture fails the start rather
 * than replaying nothing. Returns 0, or CM_EIO after printing why. */
static int check_header(const char *path) {
  uint8_t h[CM_WIRE_FILE_HEADER_SIZE];
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    fprintf(stderr, "cuptimon-lua: cannot read capture %s: %s\n", path, strerror(errno));
    return CM_EIO;
  }
  size_t got = fread(h, 1, sizeof h, fp);
  fclose(fp);
  cm_wire_reader *r;
  if (cm_wire_reader_new(&r, CM_WIRE_READER_CAPTURE)) return CM_ENOMEM;
  cm_wire_frame f;
  int rc = cm_wire_reader_feed(r, h, got);
  if (rc == 0) rc = cm_wire_reader_next(r, &f);
  if (rc == 0 && got < sizeof h) rc = cm_wire_reader_end(r);
  if (rc < 0)
    fprintf(stderr, "cuptimon-lua: cannot replay %s: %s\n", path, cm_wire_reader_errmsg(r));
  cm_wire_reader_free(r);
  return rc < 0 ? CM_EIO : 0;
}

int cm__replay_start(cm_host *h, uv_loop_t *loop, const char *const *paths, int n,
                     void (*finished)(void *ud, int status), void *ud) {
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
    if ((rc = check_header(paths[i])) != 0) return rc;
  }
  uv_idle_start(&rp->idle, idle_cb);
  return 0;
}

static void free_replay(uv_handle_t *hd) { free(hd->data); }

void cm__replay_free(void) {
  replay *rp = g_replay;
  if (!rp) return;
  cm__wsrc_log_summary();
  g_replay = NULL;
  for (int i = 0; i < rp->n; i++) {
    cm__wsrc *w = rp->s[i].cur;
    if (w) {
      w->owner = NULL;
      rp->s[i].cur = NULL;
      /* The host detaches and frees attached processes; one that never reached the host (the
       * run ended before its HELLO was handled) is the replay's to free. */
      if (!w->attached) proc_detached(w);
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
