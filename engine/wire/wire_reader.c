/*
 * wire_reader.c: the streaming reader of the wire format, and the capture file reader built on it
 * (docs/wire.md defines the bytes; wire_decode.c decodes the payloads of the frames it yields).
 *
 * The reader is the trust boundary. It accumulates fed bytes in one malloc'd buffer whose start
 * is also the start of the oldest unconsumed frame, so every frame it yields is 8-byte aligned
 * (malloc aligns to 16, headers are 24 bytes and payloads multiples of 8). It trusts nothing in
 * a header until the header's own CRC matches, so a corrupt length field is reported at once
 * rather than making the reader wait for bytes that never come; then it checks the version, the
 * must-understand flags, the size cap and the payload CRC. Errors are sticky: once a stream is
 * known bad, no later frame is yielded from it. With CM_WIRE_READER_RESYNC (capture files), a
 * corrupt frame instead starts a skipped stretch: the reader scans byte by byte for the next
 * "CM" whose header and payload check out, moves that frame to the aligned buffer start if it
 * is off the 8-byte grid, and reports the stretch once (docs/wire.md, "Resynchronizing"). The
 * payload bytes checked in vain within a stretch are bounded by the bytes skipped, so crafted
 * overlapping headers cannot make the scan quadratic.
 *
 * Thread rules: a reader, and a capture file, belong to their caller; none is shared.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "wire_internal.h"

/* ---- Reader ------------------------------------------------------------------------------ */

struct cm_wire_reader {
  uint8_t *buf;       /* buf[head..tail) holds the unconsumed bytes */
  size_t cap;
  size_t head;
  size_t tail;
  uint64_t base;      /* the stream offset of buf[0] */
  uint64_t frames;    /* frames yielded */
  uint64_t skipped;   /* unknown newer-minor frames skipped */
  uint32_t flags;     /* CM_WIRE_READER_* */
  int have_file_header;
  uint32_t file_minor;
  int err;            /* sticky error, 0 while the stream is good */
  char msg[CM_WIRE_ERRMSG_SIZE];
  /* Resynchronization (CM_WIRE_READER_RESYNC): while `resyncing`, the bytes from stream offset
   * `resync_at` on are being skipped; `cause` says what was wrong there. */
  int resyncing;
  uint64_t resync_at;
  uint64_t resyncs;        /* corrupt stretches skipped and left behind */
  uint64_t resync_bytes;   /* their total length */
  uint64_t resync_work;    /* payload bytes checked in vain during the current stretch */
  /* The stream's whole length when known (a capture file's size; 0: unknown, a live stream).
   * With CM_WIRE_READER_RESYNC, a frame whose header checks out but that would end past it can
   * never be whole: it is a corrupt stretch like any other, so a crafted header declaring 1 GiB
   * does not hide the frames after it. */
  uint64_t stream_end;
  int resync_truncated;    /* the current stretch began at such a frame */
  char cause[CM_WIRE_ERRMSG_SIZE];
  char note[CM_WIRE_ERRMSG_SIZE + 128];
};

int cm__wire_reader_say(cm_wire_reader *r, int err, const char *fmt, ...) {
  if (r) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
  }
  return err;
}

/* Records a sticky stream error. */
static int fail(cm_wire_reader *r, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(cm_wire_reader *r, int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->msg, sizeof r->msg, fmt, ap);
  va_end(ap);
  r->err = err;
  return err;
}

/* While resyncing, the payload bytes checked in vain are bounded by this factor times the bytes
 * skipped, plus the minimum. */
enum { RESYNC_WORK_FACTOR = 4, RESYNC_WORK_MIN = 4 << 20 };

/* A corrupt frame at stream offset `at`. Without CM_WIRE_READER_RESYNC it is a sticky error.
 * With it, the reader starts (or goes on) skipping: it steps one byte past `at` and scans from
 * there for the next frame that passes every check (see cm_wire_reader_next). */
static int corrupt(cm_wire_reader *r, uint64_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int corrupt(cm_wire_reader *r, uint64_t at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (!(r->flags & CM_WIRE_READER_RESYNC)) {
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->err = CM_EIO;
    return CM_EIO;
  }
  if (!r->resyncing) {
    vsnprintf(r->cause, sizeof r->cause, fmt, ap);
    r->resyncing = 1;
    r->resync_at = at;
    r->resync_truncated = 0;
  }
  va_end(ap);
  r->head++;
  return 0;
}

/* The frame at buf[head] passed every check: a stretch being skipped ends here. */
static void resync_done(cm_wire_reader *r) {
  if (!r->resyncing) return;
  uint64_t at = r->base + r->head, n = at - r->resync_at;
  r->resyncing = 0;
  r->resync_work = 0;
  r->resyncs++;
  r->resync_bytes += n;
  snprintf(r->note, sizeof r->note, "%s; skipped %llu bytes from byte %llu to the next valid frame at byte %llu",
           r->cause, (unsigned long long)n, (unsigned long long)r->resync_at, (unsigned long long)at);
}

/* While resyncing: drops bytes up to the next "CM" at or after head. Returns 1 when a candidate
 * with a whole header is at head, 0 when more bytes are needed. */
static int resync_scan(cm_wire_reader *r) {
  while (r->head < r->tail) {
    const uint8_t *p = memchr(r->buf + r->head, 'C', r->tail - r->head);
    if (!p) {
      r->head = r->tail;
      return 0;
    }
    r->head = (size_t)(p - r->buf);
    if (r->head + 1 == r->tail) return 0; /* the byte after the 'C' has not come yet */
    if (p[1] != 'M') {
      r->head++;
      continue;
    }
    return r->tail - r->head >= CM_WIRE_FRAME_HEADER_SIZE;
  }
  return 0;
}

int cm_wire_reader_new(cm_wire_reader **out, uint32_t flags) {
  if (!out || (flags & ~(uint32_t)(CM_WIRE_READER_CAPTURE | CM_WIRE_READER_RESYNC))) return CM_EINVAL;
  cm_wire_reader *r = calloc(1, sizeof *r);
  if (!r) return CM_ENOMEM;
  r->flags = flags;
  *out = r;
  return 0;
}

void cm_wire_reader_free(cm_wire_reader *r) {
  if (!r) return;
  free(r->buf);
  free(r);
}

const char *cm_wire_reader_errmsg(const cm_wire_reader *r) { return r ? r->msg : ""; }
uint64_t cm_wire_reader_frames(const cm_wire_reader *r) { return r->frames; }
uint64_t cm_wire_reader_skipped(const cm_wire_reader *r) { return r->skipped; }
uint32_t cm_wire_reader_file_minor(const cm_wire_reader *r) { return r->file_minor; }
uint64_t cm_wire_reader_resyncs(const cm_wire_reader *r, uint64_t *bytes_skipped) {
  if (bytes_skipped) *bytes_skipped = r ? r->resync_bytes : 0;
  return r ? r->resyncs : 0;
}
const char *cm_wire_reader_resync_msg(const cm_wire_reader *r) { return r ? r->note : ""; }

uint64_t cm_wire_reader_pending(const cm_wire_reader *r) {
  if (!r) return 0;
  size_t avail = r->tail - r->head;
  const uint8_t *h = r->buf + r->head;
  if (avail >= CM_WIRE_FRAME_HEADER_SIZE && !r->resyncing && h[0] == 'C' && h[1] == 'M' &&
      cm_wire_crc32c(0, h, 20) == ld32(h + 20) && ld64(h + 8) <= CM_WIRE_MAX_PAYLOAD) {
    uint64_t whole = CM_WIRE_FRAME_HEADER_SIZE + ld64(h + 8);
    return whole > avail ? whole : avail;
  }
  return avail;
}

/* Tells a resynchronizing reader the stream's whole length (see stream_end). A file reader calls
 * it with the file's size before each read and with the exact length at its end. */
static void reader_set_end(cm_wire_reader *r, uint64_t end) {
  if (end >= r->base + r->tail) r->stream_end = end;
}

int cm_wire_reader_feed(cm_wire_reader *r, const void *data, size_t len) {
  if (!r || (len && !data)) return CM_EINVAL;
  if (r->err) return r->err;
  if (len == 0) return 0;
  /* Slide the unconsumed bytes to the front, which invalidates frames yielded before. */
  if (r->head > 0) {
    memmove(r->buf, r->buf + r->head, r->tail - r->head);
    r->base += r->head;
    r->tail -= r->head;
    r->head = 0;
  }
  if (len > r->cap - r->tail) {
    if (len > SIZE_MAX / 2 - r->tail) return fail(r, CM_ENOMEM, "stream buffer size overflow");
    size_t need = r->tail + len, cap = r->cap ? r->cap : 4096;
    while (cap < need) cap *= 2;
    uint8_t *p = realloc(r->buf, cap);
    if (!p) return cm__wire_reader_say(r, CM_ENOMEM, "out of memory growing the stream buffer to %zu bytes", cap);
    r->buf = p;
    r->cap = cap;
  }
  memcpy(r->buf + r->tail, data, len);
  r->tail += len;
  return 0;
}

/* Checks the capture file header at buf[head]; 24 bytes are present. */
static int read_file_header(cm_wire_reader *r) {
  const uint8_t *h = r->buf + r->head;
  uint64_t at = r->base + r->head;
  if (memcmp(h, cm__wire_file_magic, 8) != 0)
    return fail(r, CM_EIO, "not a cuptimon capture: bad file magic at byte %llu (expected \"CUPTIMON\")",
                (unsigned long long)at);
  uint32_t major = ld16(h + 8), minor = ld16(h + 10), flags = ld32(h + 12);
  if (cm_wire_crc32c(0, h, 20) != ld32(h + 20)) {
    if (major != CM_WIRE_MAJOR)
      return fail(r, CM_EIO,
                  "bad file header checksum at byte %llu (it claims wire version %u.%u; this "
                  "reader supports major %d)", (unsigned long long)at, major, minor, CM_WIRE_MAJOR);
    return fail(r, CM_EIO, "bad file header checksum at byte %llu", (unsigned long long)at);
  }
  if (major != CM_WIRE_MAJOR)
    return fail(r, CM_ENOSYS,
                "capture has wire format version %u.%u; this reader supports major version %d "
                "only (use a newer cuptimon)", major, minor, CM_WIRE_MAJOR);
  if (flags & FILE_MUST_UNDERSTAND)
    return fail(r, CM_ENOSYS, "capture file header has unknown required flags 0x%x at byte %llu",
                flags & FILE_MUST_UNDERSTAND, (unsigned long long)at);
  r->file_minor = minor;
  r->have_file_header = 1;
  r->head += CM_WIRE_FILE_HEADER_SIZE;
  return 0;
}

int cm_wire_reader_next(cm_wire_reader *r, cm_wire_frame *f) {
  if (!r || !f) return CM_EINVAL;
  for (;;) {
    if (r->err) return r->err;
    size_t avail = r->tail - r->head;
    if ((r->flags & CM_WIRE_READER_CAPTURE) && !r->have_file_header) {
      if (avail < CM_WIRE_FILE_HEADER_SIZE) return 0;
      int rc = read_file_header(r);
      if (rc) return rc;
      continue;
    }
    if (r->resyncing && !resync_scan(r)) return 0;
    avail = r->tail - r->head;
    if (avail < CM_WIRE_FRAME_HEADER_SIZE) return 0;
    const uint8_t *h = r->buf + r->head;
    uint64_t at64 = r->base + r->head;
    unsigned long long at = (unsigned long long)at64;
    if (h[0] != 'C' || h[1] != 'M') {
      if (corrupt(r, at64, "bad frame magic at byte %llu (expected \"CM\", found 0x%02x 0x%02x)", at,
                  h[0], h[1]))
        return r->err;
      continue;
    }
    uint32_t major = h[2], minor = h[3], type = ld16(h + 4), flags = ld16(h + 6);
    uint64_t len = ld64(h + 8);
    if (cm_wire_crc32c(0, h, 20) != ld32(h + 20)) {
      int rc = major != CM_WIRE_MAJOR
                   ? corrupt(r, at64, "bad header checksum at byte %llu (the header claims wire major "
                             "version %u; this reader supports %d)", at, major, CM_WIRE_MAJOR)
                   : corrupt(r, at64, "bad header checksum at byte %llu", at);
      if (rc) return rc;
      continue;
    }
    if (major != CM_WIRE_MAJOR)
      return fail(r, CM_ENOSYS,
                  "frame at byte %llu has wire format version %u.%u; this reader supports major "
                  "version %d only (use a newer cuptimon)", at, major, minor, CM_WIRE_MAJOR);
    if (len > CM_WIRE_MAX_PAYLOAD) {
      if (!(r->flags & CM_WIRE_READER_RESYNC))
        return fail(r, CM_ERANGE, "frame at byte %llu declares a %llu-byte payload, over the cap of "
                    "%llu bytes", at, (unsigned long long)len, (unsigned long long)CM_WIRE_MAX_PAYLOAD);
      corrupt(r, at64, "frame at byte %llu declares a %llu-byte payload, over the cap of %llu bytes", at,
              (unsigned long long)len, (unsigned long long)CM_WIRE_MAX_PAYLOAD);
      continue;
    }
    if (len % 8 != 0) {
      if (corrupt(r, at64, "frame at byte %llu declares a payload length of %llu, not a multiple of 8",
                  at, (unsigned long long)len))
        return r->err;
      continue;
    }
    if (avail - CM_WIRE_FRAME_HEADER_SIZE < len) {
      if (!(r->flags & CM_WIRE_READER_RESYNC) || !r->stream_end ||
          at64 + CM_WIRE_FRAME_HEADER_SIZE + len <= r->stream_end)
        return 0;
      int fresh = !r->resyncing;
      corrupt(r, at64, "%llu whole frames, truncated at byte %llu (the frame at byte %llu needs %llu "
              "bytes, %llu present)", (unsigned long long)(r->frames + r->skipped),
              (unsigned long long)r->stream_end, at,
              (unsigned long long)(CM_WIRE_FRAME_HEADER_SIZE + len),
              (unsigned long long)(r->stream_end - at64));
      if (fresh) r->resync_truncated = 1;
      continue;
    }
    if (r->resyncing && r->resync_work + len > RESYNC_WORK_FACTOR * (at64 - r->resync_at) + RESYNC_WORK_MIN) {
      /* Candidates whose headers check out but whose payloads do not are rare in real damage;
       * a stretch full of them is crafted. Their payload checks are bounded by the bytes
       * scanned, so skipping stays linear in the stream's length. */
      corrupt(r, at64, "-");
      continue;
    }
    uint32_t crc = cm_wire_crc32c(0, h + CM_WIRE_FRAME_HEADER_SIZE, (size_t)len);
    if (crc != ld32(h + 16)) {
      if (r->resyncing) r->resync_work += len;
      if (corrupt(r, at64, "bad checksum at byte %llu (%s frame, %llu-byte payload: stored "
                  "0x%08x, computed 0x%08x)", at, cm_wire_type_name(type) ? cm_wire_type_name(type) : "unknown",
                  (unsigned long long)len, ld32(h + 16), crc))
        return r->err;
      continue;
    }
    if (r->head & 7) {
      /* Only after a resync can a frame start off the 8-byte grid: move it to the buffer's
       * (aligned) start, so that its payload is 8-byte aligned as promised. */
      memmove(r->buf, r->buf + r->head, r->tail - r->head);
      r->base += r->head;
      r->tail -= r->head;
      r->head = 0;
      h = r->buf;
    }
    const uint8_t *payload = h + CM_WIRE_FRAME_HEADER_SIZE;
    if (flags & FRAME_MUST_UNDERSTAND)
      return fail(r, CM_ENOSYS, "frame at byte %llu has unknown required flags 0x%x", at,
                  flags & FRAME_MUST_UNDERSTAND);
    size_t whole = CM_WIRE_FRAME_HEADER_SIZE + (size_t)len;
    if (!cm_wire_type_name(type)) {
      if (minor > CM_WIRE_MINOR) {
        /* A type added by a newer minor version: its length lets us step over it. */
        resync_done(r);
        r->skipped++;
        r->head += whole;
        continue;
      }
      if (corrupt(r, at64, "unknown frame type %u at byte %llu (wire version %u.%u)", type, at, major,
                  minor))
        return r->err;
      continue;
    }
    resync_done(r);
    f->type = type;
    f->flags = flags;
    f->major = major;
    f->minor = minor;
    f->offset = r->base + r->head;
    f->len = len;
    f->payload = payload;
    f->reader = r;
    r->head += whole;
    r->frames++;
    return 1;
  }
}

int cm_wire_reader_end(cm_wire_reader *r) {
  if (!r) return CM_EINVAL;
  if (r->err) return r->err;
  unsigned long long whole = (unsigned long long)(r->frames + r->skipped);
  unsigned long long end = (unsigned long long)(r->base + r->tail);
  unsigned long long at = (unsigned long long)(r->base + r->head);
  if ((r->flags & CM_WIRE_READER_CAPTURE) && !r->have_file_header)
    return fail(r, CM_EIO, "0 whole frames, truncated at byte %llu (in the %d-byte file header)", end,
                CM_WIRE_FILE_HEADER_SIZE);
  /* A stretch that began at a frame cut by the end and found no frame after it: the stream is
   * simply truncated (a crafted length hid nothing). */
  if (r->resyncing && r->resync_truncated) return fail(r, CM_EIO, "%s", r->cause);
  if (r->resyncing) {
    /* The stretch the stream ends in counts as skipped too. */
    r->resyncing = 0;
    r->resyncs++;
    r->resync_bytes += end - r->resync_at;
    return fail(r, CM_EIO, "%s; no valid frame in the %llu bytes from byte %llu to the end at byte %llu",
                r->cause, end - (unsigned long long)r->resync_at, (unsigned long long)r->resync_at, end);
  }
  size_t left = r->tail - r->head;
  if (left == 0) return 0;
  if (left < CM_WIRE_FRAME_HEADER_SIZE)
    return fail(r, CM_EIO, "%llu whole frames, truncated at byte %llu (in the header of the frame "
                "at byte %llu)", whole, end, at);
  return fail(r, CM_EIO, "%llu whole frames, truncated at byte %llu (the frame at byte %llu needs "
              "%llu bytes, %zu present)", whole, end, at,
              (unsigned long long)(CM_WIRE_FRAME_HEADER_SIZE + ld64(r->buf + r->head + 8)), left);
}

/* ---- Capture files ----------------------------------------------------------------------- */

/* The file reader feeds the stream reader 1 MiB at a time, only when it asks for more, so the
 * memory held is one frame plus one chunk. */
enum { FILE_CHUNK = 1 << 20 };

struct cm_wire_file {
  FILE *fp;
  cm_wire_reader *r;
  uint8_t *chunk;
  int eof;
  char msg[CM_WIRE_ERRMSG_SIZE];
};

int cm_wire_file_open(cm_wire_file **out, const char *path, char *errmsg_out) {
  if (errmsg_out) errmsg_out[0] = 0;
  if (!out || !path) return CM_EINVAL;
  cm_wire_file *cf = calloc(1, sizeof *cf);
  if (!cf) return CM_ENOMEM;
  cf->chunk = malloc(FILE_CHUNK);
  int rc = cf->chunk ? cm_wire_reader_new(&cf->r, CM_WIRE_READER_CAPTURE | CM_WIRE_READER_RESYNC) : CM_ENOMEM;
  if (rc) {
    cm_wire_file_close(cf);
    return rc;
  }
  cf->fp = fopen(path, "rb");
  if (!cf->fp) {
    int e = errno;
    if (errmsg_out)
      snprintf(errmsg_out, CM_WIRE_ERRMSG_SIZE, "cannot open capture %s: %s", path, strerror(e));
    cm_wire_file_close(cf);
    return e == ENOENT ? CM_ENOENT : CM_EIO;
  }
  *out = cf;
  return 0;
}

int cm_wire_file_next(cm_wire_file *cf, cm_wire_frame *f) {
  if (!cf || !f) return CM_EINVAL;
  for (;;) {
    int rc = cm_wire_reader_next(cf->r, f);
    if (rc != 0) return rc;
    if (cf->eof) return cm_wire_reader_end(cf->r);
    /* The file's size bounds every frame in it: a frame declared past it is corrupt at once,
     * rather than after the rest of the file was buffered waiting for it (the reader goes on
     * one byte past its header). A capture still being written is read up to its size now. */
    struct stat sb;
    if (fstat(fileno(cf->fp), &sb) == 0 && S_ISREG(sb.st_mode)) reader_set_end(cf->r, (uint64_t)sb.st_size);
    size_t got = fread(cf->chunk, 1, FILE_CHUNK, cf->fp);
    if (got < FILE_CHUNK) {
      if (ferror(cf->fp)) {
        snprintf(cf->msg, sizeof cf->msg, "read error in capture: %s", strerror(errno));
        return CM_EIO;
      }
      cf->eof = 1;
    }
    if (got && (rc = cm_wire_reader_feed(cf->r, cf->chunk, got)) != 0) return rc;
    if (cf->eof) cf->r->stream_end = cf->r->base + cf->r->tail;
  }
}

const char *cm_wire_file_errmsg(const cm_wire_file *cf) {
  if (!cf) return "";
  return cf->msg[0] ? cf->msg : cm_wire_reader_errmsg(cf->r);
}

uint64_t cm_wire_file_resyncs(const cm_wire_file *cf, uint64_t *bytes_skipped) {
  return cm_wire_reader_resyncs(cf ? cf->r : NULL, bytes_skipped);
}

void cm_wire_file_close(cm_wire_file *cf) {
  if (!cf) return;
  if (cf->fp) fclose(cf->fp);
  cm_wire_reader_free(cf->r);
  free(cf->chunk);
  free(cf);
}
