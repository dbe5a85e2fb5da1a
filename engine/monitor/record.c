/*
 * record.c: --record's capture files (see record.h).
 *
 * Design note. A capture is the 24-byte file header followed by the process's frames exactly as
 * the hub received and verified them (docs/wire.md), so a replay sees what the live script saw.
 * The HELLO is re-encoded with an empty token: the token is a secret of the run.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuptimon.h"
#include "record.h"

typedef struct record_summary {
  char *path;
  uint64_t frames, batches, records, dropped;
  struct record_summary *next;
} record_summary;

struct cm__capture {
  FILE *fp;
  char *path;
  uint64_t frames;
};

struct cm__record {
  char *tmpl;
  int force;
  int recorded; /* processes recorded so far (the first gets the plain path) */
  record_summary *summaries, **tail;
};

int cm__record_new(cm__record **out, const char *tmpl, int force) {
  cm__record *r = calloc(1, sizeof *r);
  if (!r || !(r->tmpl = strdup(tmpl))) {
    free(r);
    return CM_ENOMEM;
  }
  r->force = force;
  r->tail = &r->summaries;
  *out = r;
  return 0;
}

cm__capture *cm__record_open(cm__record *r, uint32_t pid, const cm_wire_hello *hello) {
  const char *path = r->tmpl;
  char buf[PATH_MAX];
  const char *pp = strstr(path, "%p");
  if (pp) {
    snprintf(buf, sizeof buf, "%.*s%u%s", (int)(pp - path), path, pid, pp + 2);
  } else if (r->recorded) {
    snprintf(buf, sizeof buf, "%s.%u", path, pid);
  } else {
    snprintf(buf, sizeof buf, "%s", path);
  }
  r->recorded++;
  cm__capture *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->fp = fopen(buf, "wb");
  if (!c->fp) {
    fprintf(stderr, "cuptimon-lua: cannot create capture %s: %s\n", buf, strerror(errno));
    free(c);
    return NULL;
  }
  c->path = strdup(buf);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_file_header(&b, 0);
  /* The token was a secret of this run; a capture carries an empty one, like an agent's. */
  cm_wire_hello copy = *hello;
  copy.token = "";
  cm_wire_write_hello(&b, &copy);
  fwrite(b.data, 1, b.len, c->fp);
  c->frames++;
  cm_wire_buf_free(&b);
  return c;
}

void cm__record_frame(cm__capture *c, const cm_wire_frame *f) {
  if (!c || f->type == CM_WIRE_FLUSH_DONE) return;
  /* The reader keeps the verified header just before the payload. */
  fwrite(f->payload - CM_WIRE_FRAME_HEADER_SIZE, 1, CM_WIRE_FRAME_HEADER_SIZE + (size_t)f->len,
         c->fp);
  c->frames++;
}

void cm__record_close(cm__record *r, cm__capture *c, uint64_t batches, uint64_t records,
                      uint64_t dropped) {
  if (!c) return;
  int bad = fclose(c->fp) != 0;
  if (bad) fprintf(stderr, "cuptimon-lua: error writing capture %s: %s\n", c->path, strerror(errno));
  record_summary *s = calloc(1, sizeof *s);
  if (s) {
    s->path = c->path;
    c->path = NULL;
    s->frames = c->frames;
    s->batches = batches;
    s->records = records;
    s->dropped = dropped;
    *r->tail = s;
    r->tail = &s->next;
  }
  free(c->path);
  free(c);
}

void cm__record_free(cm__record *r) {
  if (!r) return;
  for (record_summary *s = r->summaries, *next; s; s = next) {
    next = s->next;
    fprintf(stderr, "cuptimon-lua: recorded %s: %llu frames, %llu batches, %llu records, %llu dropped\n",
            s->path, (unsigned long long)s->frames, (unsigned long long)s->batches,
            (unsigned long long)s->records, (unsigned long long)s->dropped);
    free(s->path);
    free(s);
  }
  free(r->tmpl);
  free(r);
}
