/*
 * cuptimon_wire.h: the cuptimon wire format, which carries frames from an agent to the monitor,
 * control frames back, and the same frames in capture files.
 *
 * docs/wire.md is the normative description of the bytes. This header is the C API over it:
 *
 *  - Writers encode one frame per call into a growable cm_wire_buf. They take plain C values,
 *    or the view structs that the decoders produce, so that what is decoded can be written back.
 *  - The reader is fed bytes in any chunking (cm_wire_reader_feed) and yields whole frames
 *    whose header and payload checksums have been verified (cm_wire_reader_next). It is the
 *    only code that touches untrusted bytes. It bounds-checks every length, count and offset,
 *    caps the frame size, and reports a truncated or corrupt stream with its byte offset.
 *  - Decoders turn a verified frame's payload into views. A batch view's columns point into the
 *    frame itself: the reader keeps frames 8-byte aligned, so column arrays are used in place.
 *  - The capture file reader opens a path and iterates its frames, with file offsets in errors.
 *
 * Errors are 0 or a negative CM_E* code from cuptimon.h: CM_EIO for a corrupt or truncated
 * stream, CM_ENOSYS for an unsupported major version or must-understand flag, CM_ERANGE for a
 * frame over the size cap, CM_ENOMEM, CM_EINVAL for caller mistakes. The detail is kept in the
 * reader (cm_wire_reader_errmsg), not in the engine's per-thread message, so this module can be
 * used on its own (the fuzzer links only the wire's own files).
 *
 * Threads: nothing here is thread-safe except where stated. The module keeps no shared state (its
 * CRC table is built once, under pthread_once), so every call may run on any thread, and calls
 * on distinct objects may run concurrently:
 *  - a buffer (cm_wire_buf), a reader (cm_wire_reader) or a capture file (cm_wire_file) is used by
 *    one thread at a time, including the frames it yielded;
 *  - a decoder reads only its frame and leaves its error detail in the frame's reader, so the
 *    frames of one reader are decoded by the thread that uses the reader;
 *  - cm_wire_type_name and cm_wire_crc32c are thread-safe.
 */
#ifndef CUPTIMON_WIRE_H
#define CUPTIMON_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "cuptimon.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The wire version. A reader accepts any minor version of its major: newer minors only add
 * frame types (skipped by older readers) and append fields to payloads (ignored). */
#define CM_WIRE_MAJOR 1
#define CM_WIRE_MINOR 2

enum {
  CM_WIRE_FILE_HEADER_SIZE = 24,   /* "CUPTIMON", major, minor, flags, reserved, crc */
  CM_WIRE_FRAME_HEADER_SIZE = 24,  /* "CM", major, minor, type, flags, length, crcs */
  CM_WIRE_MAX_COLS = 128,          /* columns per batch, and fields per schema kind */
  CM_WIRE_ERRMSG_SIZE = 256
};

/* The largest payload a reader accepts: 1 GiB. */
#define CM_WIRE_MAX_PAYLOAD ((uint64_t)1 << 30)

/* Frame types. Agent to monitor are 1..63, monitor to agent 64..127. */
typedef enum cm_wire_type {
  CM_WIRE_HELLO = 1,
  CM_WIRE_SCHEMA = 2,
  CM_WIRE_STRINGS = 3,
  CM_WIRE_BATCH = 4,
  CM_WIRE_STATS = 5,
  CM_WIRE_FLUSH_DONE = 6,
  CM_WIRE_BYE = 7,
  CM_WIRE_PM_STATUS = 8, /* wire 1.2: the outcome of a PM request */
  CM_WIRE_HELLO_ACK = 64,
  CM_WIRE_SELECT = 65,
  CM_WIRE_CONFIGURE = 66,
  CM_WIRE_FLUSH = 67,
  CM_WIRE_PM = 68 /* wire 1.2: the PM sampling the monitor wants */
} cm_wire_type;

/* The name of a frame type ("BATCH"), or NULL for a type this version does not know.
 * Thread-safe. */
CM_EXTERN const char *cm_wire_type_name(uint32_t type);

/* Bits of FLUSH's flags. */
enum { CM_WIRE_FLUSH_SYNC = 1u << 0 };

/* BYE reasons. */
typedef enum cm_wire_bye_reason {
  CM_WIRE_BYE_EXIT = 0,   /* the process is exiting; exit_code holds its status if known */
  CM_WIRE_BYE_DETACH = 1, /* tracing stopped, the process goes on */
  CM_WIRE_BYE_ERROR = 2   /* the agent failed; message says why */
} cm_wire_bye_reason;

/* CRC32C (Castagnoli, reflected, polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF).
 * `crc` is the value returned for the bytes so far (0 to start), so that
 * cm_wire_crc32c(cm_wire_crc32c(0, a, n), b, m) is the CRC of a followed by b.
 * cm_wire_crc32c(0, "123456789", 9) == 0xE3069283. Thread-safe. */
CM_EXTERN uint32_t cm_wire_crc32c(uint32_t crc, const void *data, size_t len);

/* ---- Views (decoder output, writer input) ------------------------------------------------ */

/* Strings in views are NUL-terminated and point into the frame; `len` fields give byte counts.
 * When a view is writer input, the strings are ordinary NUL-terminated C strings. */

typedef struct cm_wire_device {
  uint32_t index;    /* the CUDA device ordinal */
  uint32_t has_uuid; /* 1 when uuid holds the device's UUID */
  uint8_t uuid[16];
  const char *name;  /* "NVIDIA H200" */
} cm_wire_device;

typedef struct cm_wire_hello {
  uint32_t pid;
  uint32_t ppid;
  uint32_t cupti_version;      /* cuptiGetVersion */
  uint32_t flags;              /* reserved, 0 */
  uint64_t clock_realtime_ns;  /* CLOCK_REALTIME at the anchor */
  uint64_t clock_cupti_ns;     /* cuptiGetTimestamp at the same instant */
  const char *token;           /* the per-run token the monitor gave the agent */
  const char *host;
  const char *exe;
  uint32_t argc;
  uint32_t ndevices;
  const char *const *argv;     /* argc strings */
  const cm_wire_device *devices;
  /* Chosen environment variables of the process as "NAME=VALUE" strings (the agent sends the
   * distributed job's RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE when set), at most
   * CM_WIRE_MAX_ENV. Appended after the devices; a HELLO that ends there decodes with nenv 0. */
  uint32_t nenv;
  const char *const *env;
} cm_wire_hello;

enum { CM_WIRE_MAX_ENV = 64 };

typedef struct cm_wire_field {
  uint32_t id;      /* stable field id within the kind */
  uint32_t type;    /* cm_type */
  uint32_t width;   /* bytes per element: 1, 2, 4 or 8 */
  uint32_t reserved;
  const char *name;
} cm_wire_field;

typedef struct cm_wire_kind {
  uint32_t kind;    /* cm_kind */
  uint32_t nfields; /* at most CM_WIRE_MAX_COLS; ids strictly ascending */
  const char *name;
  const cm_wire_field *fields;
} cm_wire_kind;

typedef struct cm_wire_schema {
  uint32_t nkinds;
  uint32_t reserved;
  const cm_wire_kind *kinds;
} cm_wire_schema;

/* One interned string: id to bytes. The bytes may hold any value; a decoded entry is also
 * NUL-terminated after `len` bytes. */
typedef struct cm_wire_string {
  uint32_t id;
  uint32_t len;
  const char *bytes;
} cm_wire_string;

typedef struct cm_wire_strings {
  uint32_t count;
  uint32_t reserved;
  const cm_wire_string *entries;
} cm_wire_strings;

/* A (name, value) pair: a STATS counter or a CONFIGURE setting. */
typedef struct cm_wire_kv {
  const char *name;
  uint64_t value;
} cm_wire_kv;

typedef struct cm_wire_kvlist {
  uint32_t count;
  uint32_t reserved;
  const cm_wire_kv *items;
} cm_wire_kvlist;

typedef struct cm_wire_bye {
  uint32_t reason;      /* cm_wire_bye_reason */
  int32_t exit_code;    /* the process's exit status, or -1 when unknown */
  const char *message;  /* "" when none */
} cm_wire_bye;

/* A decoded batch. batch.cols points at cols, so the struct must not be copied by value and
 * used after the copy's source is gone. Column data points into the frame. */
typedef struct cm_wire_batch {
  cm_batch batch;
  cm_column cols[CM_WIRE_MAX_COLS];
  /* The frame's number on its connection (wire 1.1): 1, 2, 3, ... for the BATCH frames an agent
   * queued, so a gap is a frame that never arrived. 0 from a writer that does not number. */
  uint32_t number;
} cm_wire_batch;

/* ---- Writer ------------------------------------------------------------------------------ */

/* A growable byte buffer. `data` is malloc'd (16-byte aligned) and every frame in it starts at a
 * multiple of 8 from `data`, because frame sizes are multiples of 8. */
typedef struct cm_wire_buf {
  uint8_t *data;
  size_t len;
  size_t cap;
} cm_wire_buf;

CM_EXTERN void cm_wire_buf_init(cm_wire_buf *b);
/* Frees the bytes and leaves an empty buffer. */
CM_EXTERN void cm_wire_buf_free(cm_wire_buf *b);
/* Forgets the bytes but keeps the allocation. */
CM_EXTERN void cm_wire_buf_clear(cm_wire_buf *b);

/* Every writer appends one whole frame (or the file header) to `b` and returns 0, or fails with
 * CM_EINVAL (a bad argument, named below) or CM_ENOMEM and leaves b->len as it was. */

/* The 24-byte capture file header; `flags` must be 0 in this version. */
CM_EXTERN int cm_wire_write_file_header(cm_wire_buf *b, uint32_t flags);
/* A frame of any type with an opaque payload, padded with zeros to a multiple of 8. Used for
 * frame types this version does not define, and by tests. `minor` is the header's minor. */
CM_EXTERN int cm_wire_write_frame(cm_wire_buf *b, uint32_t type, uint32_t flags, uint32_t minor,
                                  const void *payload, size_t len);
/* NULL strings are written as "". Fails with CM_EINVAL when argc or ndevices exceeds the
 * reader's caps (65536 and 1024) or argv/devices is NULL with a nonzero count. */
CM_EXTERN int cm_wire_write_hello(cm_wire_buf *b, const cm_wire_hello *h);
/* Fails with CM_EINVAL when a kind has more than CM_WIRE_MAX_COLS fields, field ids are not
 * strictly ascending, or a width does not match its type. */
CM_EXTERN int cm_wire_write_schema(cm_wire_buf *b, const cm_wire_schema *s);
CM_EXTERN int cm_wire_write_strings(cm_wire_buf *b, const cm_wire_string *entries, uint32_t count);
/* Writes batch->seq, kind, n and every column's data. Fails with CM_EINVAL when ncols exceeds
 * CM_WIRE_MAX_COLS, field ids are not strictly ascending, a width does not match its type, or
 * a column has n > 0 and no data. */
CM_EXTERN int cm_wire_write_batch(cm_wire_buf *b, const cm_batch *batch);
/* The same, with the frame's number (wire 1.1; 0 for none): an agent numbers its BATCH frames
 * 1, 2, 3, ... per connection, so that the monitor can tell which ones it did not receive. */
CM_EXTERN int cm_wire_write_batch_numbered(cm_wire_buf *b, const cm_batch *batch, uint32_t number);
CM_EXTERN int cm_wire_write_stats(cm_wire_buf *b, const cm_wire_kv *items, uint32_t count);
CM_EXTERN int cm_wire_write_flush_done(cm_wire_buf *b, uint64_t flush_id, int32_t status);
CM_EXTERN int cm_wire_write_bye(cm_wire_buf *b, uint32_t reason, int32_t exit_code,
                                const char *message);
/* The monitor's answer to HELLO: status 0 accepts the agent, a negative CM_E* code refuses it. */
CM_EXTERN int cm_wire_write_hello_ack(cm_wire_buf *b, int32_t status, const char *message);
/* A selection in cm_selection_parse's text form: "kernel:name,start,stop;memcpy". */
CM_EXTERN int cm_wire_write_select(cm_wire_buf *b, const char *spec);
CM_EXTERN int cm_wire_write_configure(cm_wire_buf *b, const cm_wire_kv *items, uint32_t count);
/* The PM sampling the monitor wants, as text: entries "device:interval_us:metric,metric,..."
 * separated by ';' ("" for none). The agent replaces what it samples with it and answers with
 * one PM_STATUS per entry. */
CM_EXTERN int cm_wire_write_pm(cm_wire_buf *b, const char *spec);
/* A PM request's bounds, which cm_wire_parse_pm enforces. */
enum {
  CM_WIRE_PM_ENTRIES = 64,          /* devices in one request */
  CM_WIRE_PM_METRICS = 64,          /* metrics of one device */
  CM_WIRE_PM_NAME = 256,            /* bytes of one metric name */
  CM_WIRE_PM_INTERVAL_MIN_US = 20,
  CM_WIRE_PM_INTERVAL_MAX_US = 10000000
};
/* One device's entry of a parsed PM request; the metric names point into the parse buffer. */
typedef struct cm_wire_pm_entry {
  int32_t device;
  uint32_t interval_us;
  uint32_t nmetrics;
  uint32_t reserved;
  const char *metrics[CM_WIRE_PM_METRICS];
} cm_wire_pm_entry;
/* Parses a PM request's text (`len` bytes, "" for none) into at most `max` entries, copying it
 * into `buf` (`cap` bytes) so the metric names are NUL-terminated there. Returns the number of
 * entries, or CM_EINVAL with the reason in `why` (`why_len` bytes): a malformed entry, a device
 * over 1023, an interval outside the bounds, an empty or too long name, too many entries or
 * metrics, or text longer than cap - 1. Pure and bounded by `len`. Thread-safe. */
CM_EXTERN int cm_wire_parse_pm(const char *text, size_t len, char *buf, size_t cap,
                               cm_wire_pm_entry *out, uint32_t max, char *why, size_t why_len);
/* The outcome of a PM entry on `device`: status 0, or a CM_E* code and a message saying what to
 * do (CM_EPERM: profiling counters are restricted to admin users). */
CM_EXTERN int cm_wire_write_pm_status(cm_wire_buf *b, int32_t status, uint32_t device,
                                      const char *message);
/* flags: CM_WIRE_FLUSH_SYNC. timeout_ms 0 means the agent's configured deadline. */
CM_EXTERN int cm_wire_write_flush(cm_wire_buf *b, uint64_t flush_id, uint32_t flags,
                                  uint32_t timeout_ms);

/* ---- Reader ------------------------------------------------------------------------------ */

typedef struct cm_wire_reader cm_wire_reader;

enum {
  /* The stream starts with the 24-byte capture file header. */
  CM_WIRE_READER_CAPTURE = 1u << 0,
  /* A corrupt frame (bad magic, header or payload checksum, impossible length, unknown type) is
   * skipped instead of ending the stream: the reader scans forward for the next "CM" whose
   * header checksum matches and whose frame passes every check, and goes on from there
   * (docs/wire.md, "Resynchronizing"). Each skipped stretch is counted and described by
   * cm_wire_reader_resyncs and cm_wire_reader_resync_msg. Version and must-understand errors
   * stay final. Capture files are read this way. */
  CM_WIRE_READER_RESYNC = 1u << 1
};

/* A verified frame. `payload` is 8-byte aligned and holds `len` bytes (a multiple of 8). The
 * frame points into the reader's buffer and is valid until the next feed or next call. */
typedef struct cm_wire_frame {
  uint32_t type;        /* cm_wire_type */
  uint32_t flags;
  uint32_t major;
  uint32_t minor;
  uint64_t offset;      /* absolute stream (or file) offset of the frame header */
  uint64_t len;         /* payload bytes */
  const uint8_t *payload;
  cm_wire_reader *reader; /* decoders leave their error detail here; may be NULL */
} cm_wire_frame;

/* Creates a reader. flags: CM_WIRE_READER_CAPTURE, CM_WIRE_READER_RESYNC. */
CM_EXTERN int cm_wire_reader_new(cm_wire_reader **out, uint32_t flags);
CM_EXTERN void cm_wire_reader_free(cm_wire_reader *r);
/* Appends bytes. Returns 0, CM_ENOMEM, or the reader's sticky error. */
CM_EXTERN int cm_wire_reader_feed(cm_wire_reader *r, const void *data, size_t len);
/* Yields the next whole, verified frame: returns 1 and fills *f, 0 when more bytes are needed,
 * or a negative code once the stream is known bad (sticky; the detail names the byte offset).
 * Frames of unknown type with a newer minor version are skipped and counted. */
CM_EXTERN int cm_wire_reader_next(cm_wire_reader *r, cm_wire_frame *f);
/* Declares the end of the stream, after next() returned 0. Returns 0 when the stream ended on a
 * frame boundary, or CM_EIO with "N whole frames, truncated at byte X (...)", where X is the
 * stream's length. A capture with no complete file header is truncated too. */
CM_EXTERN int cm_wire_reader_end(cm_wire_reader *r);
/* The detail of the last failure of this reader or of a decoder given one of its frames, or "". */
CM_EXTERN const char *cm_wire_reader_errmsg(const cm_wire_reader *r);
/* Whole frames yielded so far, and frames skipped as unknown newer-minor types. */
CM_EXTERN uint64_t cm_wire_reader_frames(const cm_wire_reader *r);
CM_EXTERN uint64_t cm_wire_reader_skipped(const cm_wire_reader *r);
/* The capture header's version and flags, once read (0 before). */
CM_EXTERN uint32_t cm_wire_reader_file_minor(const cm_wire_reader *r);
/* With CM_WIRE_READER_RESYNC: the number of corrupt stretches skipped so far (each ended by a
 * valid frame), and their total bytes through *bytes_skipped (may be NULL). After next() yields
 * the frame that ends a stretch, cm_wire_reader_resync_msg describes it: "bad checksum at byte X
 * (...); skipped N bytes from byte X to the next valid frame at byte Y" ("" before any). A
 * stretch that runs to the end of the stream is reported by cm_wire_reader_end as an error. */
CM_EXTERN uint64_t cm_wire_reader_resyncs(const cm_wire_reader *r, uint64_t *bytes_skipped);
CM_EXTERN const char *cm_wire_reader_resync_msg(const cm_wire_reader *r);
/* The bytes the reader holds for the frame it waits for: the whole frame's size (24 + length)
 * once its header has checked out, else the bytes buffered. What a consumer budgets memory by. */
CM_EXTERN uint64_t cm_wire_reader_pending(const cm_wire_reader *r);

/* ---- Decoders ---------------------------------------------------------------------------- */

/* Each decoder checks the frame type (CM_EINVAL on mismatch) and the payload's structure
 * (CM_EIO with a detail in f->reader on any inconsistency). Decoders that produce arrays
 * allocate them; the matching release function frees them (call it only on decoder output;
 * it is safe on a zeroed struct and after a failed decode). Everything else points into the
 * frame and shares its lifetime. Bytes after the fields a decoder knows are ignored: later
 * minor versions may append fields. */
CM_EXTERN int cm_wire_decode_hello(const cm_wire_frame *f, cm_wire_hello *out);
CM_EXTERN void cm_wire_hello_release(cm_wire_hello *h);
CM_EXTERN int cm_wire_decode_schema(const cm_wire_frame *f, cm_wire_schema *out);
CM_EXTERN void cm_wire_schema_release(cm_wire_schema *s);
CM_EXTERN int cm_wire_decode_strings(const cm_wire_frame *f, cm_wire_strings *out);
CM_EXTERN void cm_wire_strings_release(cm_wire_strings *s);
/* STATS and CONFIGURE share the (name, u64) list layout. */
CM_EXTERN int cm_wire_decode_kvlist(const cm_wire_frame *f, cm_wire_kvlist *out);
CM_EXTERN void cm_wire_kvlist_release(cm_wire_kvlist *l);
/* Allocates nothing. When `schema` is not NULL, each column's name is looked up in it (NULL
 * when the schema lacks the kind or field). The payload must be 8-byte aligned (CM_EINVAL). */
CM_EXTERN int cm_wire_decode_batch(const cm_wire_frame *f, const cm_wire_schema *schema,
                                   cm_wire_batch *out);
CM_EXTERN int cm_wire_decode_flush_done(const cm_wire_frame *f, uint64_t *flush_id,
                                        int32_t *status);
CM_EXTERN int cm_wire_decode_bye(const cm_wire_frame *f, cm_wire_bye *out);
CM_EXTERN int cm_wire_decode_hello_ack(const cm_wire_frame *f, int32_t *status,
                                       const char **message);
CM_EXTERN int cm_wire_decode_select(const cm_wire_frame *f, const char **spec, uint32_t *len);
CM_EXTERN int cm_wire_decode_pm(const cm_wire_frame *f, const char **spec, uint32_t *len);
CM_EXTERN int cm_wire_decode_pm_status(const cm_wire_frame *f, int32_t *status, uint32_t *device,
                                       const char **message);
CM_EXTERN int cm_wire_decode_flush(const cm_wire_frame *f, uint64_t *flush_id, uint32_t *flags,
                                   uint32_t *timeout_ms);

/* ---- Capture files ----------------------------------------------------------------------- */

typedef struct cm_wire_file cm_wire_file;

/* Opens a capture for reading. Fails with CM_ENOENT (or CM_EIO for another open failure); then,
 * when errmsg_out is not NULL, it receives a message naming the path and the reason. errmsg_out
 * must hold CM_WIRE_ERRMSG_SIZE bytes. */
CM_EXTERN int cm_wire_file_open(cm_wire_file **out, const char *path, char *errmsg_out);
/* Yields the next frame (1), the clean end (0), or a negative error whose detail gives the file
 * offset: "N whole frames, truncated at byte X", "not a cuptimon capture", or a corrupt stretch
 * that runs to the end ("bad checksum at byte X (...); no valid frame in the N bytes ...").
 * Corrupt stretches followed by a valid frame are skipped (CM_WIRE_READER_RESYNC): after each
 * frame, cm_wire_reader_resyncs(f->reader, ...) tells whether one was. The frame is valid until
 * the next call. */
CM_EXTERN int cm_wire_file_next(cm_wire_file *cf, cm_wire_frame *f);
CM_EXTERN const char *cm_wire_file_errmsg(const cm_wire_file *cf);
/* The corrupt stretches skipped so far, the one the file ended in included, and their bytes
 * (bytes_skipped may be NULL). */
CM_EXTERN uint64_t cm_wire_file_resyncs(const cm_wire_file *cf, uint64_t *bytes_skipped);
CM_EXTERN void cm_wire_file_close(cm_wire_file *cf);


/* ---- the rendezvous of dormant agents (rendezvous.c) ------------------------------------------ */

/* A dormant agent (CUPTIMON_LISTEN=1, docs/agent.md) listens on a unix socket named
 * "<pid>.sock" in a per-user directory, and `cuptimon-lua --list` / `--attach` look for it there.
 * The directory is $XDG_RUNTIME_DIR/cuptimon when XDG_RUNTIME_DIR is set (an absolute path), and
 * otherwise cuptimon-<uid> in $TMPDIR (/tmp when TMPDIR is unset or too long for a socket path).
 * Writes its path to `out`. With CM_WIRE_LISTEN_CREATE in `flags`, a missing directory is made,
 * mode 0700. Either way the directory must be a directory (not a symbolic link) owned by the
 * effective uid with no group or world write bit, or it is refused: another user could otherwise
 * plant or remove sockets. CM_WIRE_LISTEN_ANY_OWNER lifts the owner check (root's monitor, given
 * the user's XDG_RUNTIME_DIR, attaching to agents that admit root); the mode check stays.
 * Returns 0, CM_ENOENT (missing, without CM_WIRE_LISTEN_CREATE), or CM_EIO (refused, or a failed
 * call) with a message in `err`. Thread-safe. */
enum { CM_WIRE_LISTEN_CREATE = 1, CM_WIRE_LISTEN_ANY_OWNER = 2 };
CM_EXTERN int cm_wire_listen_dir(char *out, size_t cap, int flags, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* CUPTIMON_WIRE_H */
