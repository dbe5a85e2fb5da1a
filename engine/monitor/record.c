/*
 * record.c: --record's capture files (see record.h).
 *
 * Design note. A capture is the 24-byte file header followed by the process's frames exactly as
 * the hub received and verified them (docs/wire.md), so a replay sees what the live script saw.
 * The HELLO is re-encoded with an empty token: the token is a secret of the run.
 *
 * Files. One per process. A template with %p names each by the pid the kernel gave for the
 * connection (never one the peer wrote); without %p the first process of the run writes the name
 * as given and each further one gets its pid before the extension (run.cmcap, then
 * run.<pid>.cmcap), so a single-process run writes exactly the file asked for and two processes
 * still never share one. Files are created with O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600: a file that exists already
 * (another run's capture, a file planted in a shared directory, a symlink) is never written
 * through, and only --force replaces an existing regular file (by unlinking it first). A FIFO or
 * any other non-regular file is refused, so the monitor can never block opening or writing one.
 * The directory is checked when the run starts, by creating and removing a probe file, and so is
 * the first process's file of a template without %p (it must not exist, unless --force), so a
 * wrong path fails before the command runs rather than after it has done its work.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuptimon.h"
#include "record.h"

typedef struct record_summary {
  char *path;
  uint64_t frames, batches, records, dropped;
  int incomplete; /* the process's final counts never arrived: more may be lost */
  struct record_summary *next;
} record_summary;

struct cm__capture {
  FILE *fp;
  char *path;
  uint64_t frames;
  /* A write that failed (ENOSPC, EIO) ends the file there: that frame and every later one are
   * not written, and their records are counted as dropped, so the summary never says "0
   * dropped" for a capture that lost its tail. */
  int err;                         /* the errno of the first failed write, 0 while good */
  uint64_t unwritten_records, unwritten_batches;
  uint64_t bytes, limit;           /* bytes written; CUPTIMON_TEST_RECORD_ENOSPC_AT (0: none) */
};

static int is_batch(const uint8_t *frame) { return (frame[4] | frame[5] << 8) == CM_WIRE_BATCH; }

/* The records of a frame: a BATCH's n (payload offset 12), 0 for other types. */
static uint64_t frame_records(const uint8_t *frame, size_t len) {
  if (len < CM_WIRE_FRAME_HEADER_SIZE + 16 || !is_batch(frame)) return 0;
  const uint8_t *p = frame + CM_WIRE_FRAME_HEADER_SIZE + 12;
  return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
}

/* Writes whole frames (n bytes) holding `records` records, flushed at once so a failure is seen
 * on the frame that caused it. Returns 0, or -1 once the capture has failed. */
static int cap_write(cm__capture *c, const void *p, size_t n, uint64_t records, uint64_t batches) {
  if (!c->err && c->limit && c->bytes + n > c->limit) c->err = ENOSPC; /* the test hook */
  if (!c->err && (fwrite(p, 1, n, c->fp) != n || fflush(c->fp) != 0)) c->err = errno ? errno : EIO;
  if (c->err) {
    c->unwritten_records += records;
    c->unwritten_batches += batches;
    return -1;
  }
  c->bytes += n;
  return 0;
}

struct cm__record {
  char *tmpl;
  int force;
  int named_used; /* a template without %p: the first process took the name as given */
  int each;       /* CM__RECORD_EACH_PID */
  int failures;
  record_summary *summaries, **tail;
};

/* The capture path of the process whose pid is `num` (see record.h). */
static void capture_path(const char *tmpl, const char *num, char *out, size_t cap) {
  size_t o = 0;
  if (strstr(tmpl, "%p")) {
    for (const char *p = tmpl; *p && o + 1 < cap;) {
      if (p[0] == '%' && p[1] == 'p') {
        int n = snprintf(out + o, cap - o, "%s", num);
        o = n < 0 || (size_t)n >= cap - o ? cap - 1 : o + (size_t)n;
        p += 2;
      } else {
        out[o++] = *p++;
      }
    }
    out[o < cap ? o : cap - 1] = 0;
    return;
  }
  const char *base = strrchr(tmpl, '/');
  base = base ? base + 1 : tmpl;
  const char *dot = strrchr(base, '.');
  if (!dot || dot == base) dot = base + strlen(base); /* no extension: suffix */
  snprintf(out, cap, "%.*s.%s%s", (int)(dot - tmpl), tmpl, num, dot);
}

static const char *file_kind(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  return "not a regular file";
}

int cm__record_new(cm__record **out, const char *tmpl, int flags) {
  *out = NULL;
  int force = (flags & CM__RECORD_FORCE) != 0, each = (flags & CM__RECORD_EACH_PID) != 0;
  if (!*tmpl) {
    fprintf(stderr, "cuptimon-lua: --record needs a file name\n");
    return CM_EINVAL;
  }
  struct stat st;
  /* A template that names an existing non-regular file is a mistake (a FIFO would block); one
   * without %p is the first process's file, so an existing one is refused now (or replaced). */
  if (lstat(tmpl, &st) == 0 && !S_ISREG(st.st_mode)) {
    fprintf(stderr, "cuptimon-lua: --record %s: it is %s; a capture must be a regular file "
            "(cuptimon-lua writes one new file per process)\n", tmpl, file_kind(st.st_mode));
    return CM_EINVAL;
  }
  if (!strstr(tmpl, "%p") && !each && !force && lstat(tmpl, &st) == 0) {
    fprintf(stderr, "cuptimon-lua: --record %s: the file exists (--force replaces it, %%p in the "
            "name gives each process a file named by its pid)\n", tmpl);
    return CM_EINVAL;
  }
  /* The directory must take new files; a directory part with %p in it is checked per process. */
  const char *slash = strrchr(tmpl, '/');
  char dir[PATH_MAX];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == tmpl) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - tmpl), tmpl);
  if (!strstr(dir, "%p")) {
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/.cuptimon-probe-XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0) {
      fprintf(stderr, "cuptimon-lua: --record %s: cannot create files in %s: %s\n", tmpl, dir,
              strerror(errno));
      return CM_EINVAL;
    }
    close(fd);
    unlink(probe);
  }
  cm__record *r = calloc(1, sizeof *r);
  if (!r || !(r->tmpl = strdup(tmpl))) {
    free(r);
    return CM_ENOMEM;
  }
  r->force = force;
  r->named_used = r->each = each;
  r->tail = &r->summaries;
  *out = r;
  return 0;
}

cm__capture *cm__record_open(cm__record *r, uint32_t pid, const cm_wire_hello *hello) {
  char num[16], path[PATH_MAX];
  snprintf(num, sizeof num, "%u", pid);
  if (!strstr(r->tmpl, "%p") && !r->named_used) {
    r->named_used = 1;
    snprintf(path, sizeof path, "%s", r->tmpl);
  } else {
    capture_path(r->tmpl, num, path, sizeof path);
    if (!strstr(r->tmpl, "%p") && r->named_used++ == 1 && !r->each)
      fprintf(stderr, "cuptimon-lua: --record %s: another process, pid %u, is recorded to %s "
              "(and so is each further one, by its pid; %%p in the name gives every process its "
              "pid)\n", r->tmpl, pid, path);
  }
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      fprintf(stderr, "cuptimon-lua: not recording pid %u: %s is %s; a capture must be a new "
              "regular file\n", pid, path, file_kind(st.st_mode));
      r->failures++;
      return NULL;
    }
    if (!r->force) {
      fprintf(stderr, "cuptimon-lua: not recording pid %u: %s exists (--force replaces it)\n",
              pid, path);
      r->failures++;
      return NULL;
    }
    if (unlink(path) != 0 && errno != ENOENT) {
      fprintf(stderr, "cuptimon-lua: not recording pid %u: cannot replace %s: %s\n", pid, path,
              strerror(errno));
      r->failures++;
      return NULL;
    }
  }
  cm__capture *c = calloc(1, sizeof *c);
  if (!c) {
    r->failures++;
    return NULL;
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  c->fp = fd >= 0 ? fdopen(fd, "wb") : NULL;
  if (!c->fp) {
    fprintf(stderr, "cuptimon-lua: cannot create capture %s: %s%s\n", path, strerror(errno),
            errno == EEXIST ? " (--force replaces a regular file)" : "");
    if (fd >= 0) close(fd);
    free(c);
    r->failures++;
    return NULL;
  }
  c->path = strdup(path);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_file_header(&b, 0);
  /* The token was a secret of this run; a capture carries an empty one, like an agent's. */
  cm_wire_hello copy = *hello;
  copy.token = "";
  cm_wire_write_hello(&b, &copy);
  const char *lim = getenv("CUPTIMON_TEST_RECORD_ENOSPC_AT");
  c->limit = lim && *lim ? strtoull(lim, NULL, 10) : 0;
  if (cap_write(c, b.data, b.len, 0, 0) == 0) c->frames++;
  cm_wire_buf_free(&b);
  return c;
}

void cm__record_frame(cm__capture *c, const cm_wire_frame *f) {
  if (!c || f->type == CM_WIRE_FLUSH_DONE) return;
  /* The reader keeps the verified header just before the payload. */
  const uint8_t *h = f->payload - CM_WIRE_FRAME_HEADER_SIZE;
  size_t n = CM_WIRE_FRAME_HEADER_SIZE + (size_t)f->len;
  if (cap_write(c, h, n, frame_records(h, n), (uint64_t)is_batch(h)) == 0) c->frames++;
}

void cm__record_bytes(cm__capture *c, const cm_wire_buf *b, uint64_t frames) {
  if (!c || !b->len) return;
  uint64_t records = 0, batches = 0;
  for (size_t o = 0; o + CM_WIRE_FRAME_HEADER_SIZE <= b->len;) {
    uint64_t len = 0;
    for (int i = 0; i < 8; i++) len |= (uint64_t)b->data[o + 8 + i] << (8 * i);
    records += frame_records(b->data + o, b->len - o);
    batches += (uint64_t)is_batch(b->data + o);
    o += CM_WIRE_FRAME_HEADER_SIZE + (size_t)len;
  }
  if (cap_write(c, b->data, b->len, records, batches) == 0) c->frames += frames;
}

const char *cm__record_path(const cm__capture *c) { return c ? c->path : NULL; }

void cm__record_close(cm__record *r, cm__capture *c, uint64_t batches, uint64_t records,
                      uint64_t dropped, int incomplete) {
  if (!c) return;
  int bad = ferror(c->fp) != 0 || c->err != 0;
  int e = c->err ? c->err : errno;
  bad |= fclose(c->fp) != 0;
  if (bad) {
    if (!c->err) e = errno;
    fprintf(stderr, "cuptimon-lua: error writing capture %s: %s%s\n", c->path, strerror(e),
            c->err ? "; the file ends at the frame that failed, and the records after it are "
                     "counted as dropped" : "");
    r->failures++;
  }
  dropped += c->unwritten_records;
  /* The summary counts what the file holds. */
  records = records > c->unwritten_records ? records - c->unwritten_records : 0;
  batches = batches > c->unwritten_batches ? batches - c->unwritten_batches : 0;
  record_summary *s = calloc(1, sizeof *s);
  if (s) {
    s->path = c->path;
    c->path = NULL;
    s->frames = c->frames;
    s->batches = batches;
    s->records = records;
    s->dropped = dropped;
    s->incomplete = incomplete;
    *r->tail = s;
    r->tail = &s->next;
  }
  free(c->path);
  free(c);
}

int cm__record_failures(const cm__record *r) { return r ? r->failures : 0; }

void cm__record_free(cm__record *r, int no_process) {
  if (!r) return;
  int any = r->summaries != NULL;
  for (record_summary *s = r->summaries, *next; s; s = next) {
    next = s->next;
    fprintf(stderr, "cuptimon-lua: recorded %s: %llu frames, %llu batches, %llu records, %llu dropped%s\n",
            s->path, (unsigned long long)s->frames, (unsigned long long)s->batches,
            (unsigned long long)s->records, (unsigned long long)s->dropped,
            s->incomplete ? " (at least: the process's final counts are missing)" : "");
    free(s->path);
    free(s);
  }
  if (no_process && !any)
    fprintf(stderr, "cuptimon-lua: --record %s: no CUDA process connected, so nothing was "
            "recorded (the command never initialised CUDA, or it ran without the agent: a "
            "static binary, or CUDA_INJECTION64_PATH was changed)\n", r->tmpl);
  free(r->tmpl);
  free(r);
}
