/*
 * wire_gen.c: a test helper that speaks the cuptimon wire format without CUPTI: it writes
 * synthetic captures, and it plays a minimal agent against a live cuptimon-lua hub.
 *
 *   wire_gen capture PATH [--pid P] [--records N] [--kinds k1,k2] [--truncate BYTES] [--corrupt AT]
 *                         [--drop-batch K] [--no-end] [--unknown-type T] [--rank R] [--hostile]
 *                         [--hostile-names] [--small-ids]
 *   wire_gen agent [--records N] [--kinds k1,k2] [--token T] [--garbage] [--exit-code C]
 *                  [--pid P] [--oversize-hello BYTES] [--big-frame BYTES [--fill BYTES]]
 *                  [--cupti-dropped N] [--no-end] [--pm-status N]
 *   wire_gen idle N [--hold-ms MS] [--ready FILE]
 *
 * Records are synthetic but deterministic: record i of a kind has start = base + i * 1000,
 * stop = start + 500 + (i % 7) * 100 (end, completed likewise), string fields cycle over three
 * names (--hostile-names: names with quotes and SQL, a NUL, invalid UTF-8), other fields hold
 * i (--small-ids: i % 4, so a run has four threads, devices, contexts... as a real one has a
 * few). Every field of the registry is carried (a capture) or every field
 * of the monitor's SELECT (an agent), so a test can compute exact counts and sums. With
 * --rank R, HELLO carries RANK=R and WORLD_SIZE=R+1 in its environment list. With
 * --unknown-type T, a capture's string columns are written with cm_type T (one this version does
 * not know; width 4), as a later minor version could.
 *
 * The agent mode follows docs/wire.md: HELLO (with CUPTIMON_TOKEN, or --token) and SCHEMA, then
 * it waits for HELLO_ACK, applying SELECT; it sends the records of the selected kinds that are in
 * --kinds, answers FLUSH with FLUSH_DONE, and ends with STATS and BYE. --garbage sends a corrupt
 * frame after the first batch. It exits with --exit-code. Single-threaded, blocking I/O. It
 * prints how long the handshake took ("handshake_ms=") and its real pid (--pid only changes the
 * pid its HELLO claims). --oversize-hello sends, instead of HELLO, a valid HELLO header that
 * declares BYTES of payload, and reports whether the monitor closed the connection;
 * --big-frame sends such a header (a BATCH) after the handshake, and --fill that many bytes of
 * its payload (a hostile agent holding a partly sent frame in the monitor's memory). --pm-status
 * N sends N PM_STATUS errors no one asked for, their message full of terminal escapes.
 *
 * The idle mode opens N connections to CUPTIMON_SOCKET that never send anything (non-blocking
 * connects; failures are counted), creates --ready FILE once they are open, holds them for
 * --hold-ms (default 3000), and prints how many the monitor closed meanwhile.
 *
 * Loss accounting (wire 1.1): both modes number their BATCH frames 1, 2, 3, ... and send STATS
 * with records_queued and batches_queued, as the agent does. --drop-batch K leaves out the K-th
 * BATCH frame while still counting it as sent (a frame lost on the way); --no-end leaves out the
 * final STATS and BYE (a process killed before its last counts); --cupti-dropped N reports N
 * records dropped by CUPTI (records_dropped).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <sys/un.h>
#include <unistd.h>

#include "cuptimon.h"
#include "cuptimon_wire.h"

#define MAXK 16
static int kinds[MAXK], nkinds;
static uint64_t nrec = 1000;
static uint32_t pid;
static const char *rank_env[2]; /* --rank: "RANK=R", "WORLD_SIZE=R+1" */
static char rank_store[2][32];
static uint64_t drop_batch, cupti_dropped, fill, pm_flood;
static int no_end;
static const char *names[3] = {"kernelA", "kernelB", "_Z7kernelCv"};
static uint32_t names_len[3]; /* 0: strlen; --hostile-names sets them (a name holds a NUL) */
/* --hostile-names: quotes and SQL, an embedded NUL, invalid UTF-8 (a lone continuation byte,
 * 0xFF, a truncated sequence at the end), for the exporters' escaping tests. */
static const char hostile_sql[3][32] = {"k'\"; DROP TABLE StringIds; --", "nul\0inside",
                                    "bad\x80\xffutf8\xc3"};
static const uint32_t hostile_sql_len[3] = {29, 10, 10};
/* --hostile: kernel names with invalid UTF-8 (a stray 0xff 0xfe, an overlong '/', a surrogate)
 * and terminal escapes, and a HELLO whose host, executable, argv and device carry the same. */
static const char *hostile_names[3] = {"bad\xff\xfe\x1b]0;pwned\x07", "over\xc0\xafload",
                                       "surr\xed\xa0\x80gate\x1b[2J"};
static int hostile;
static int unknown_type; /* --unknown-type: the type written for string columns, 0 for STR */
static int small_ids;    /* --small-ids: the other fields hold i % 4 (few threads, devices, ...) */

static void parse_kinds(const char *s) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *t = strtok(buf, ","); t && nkinds < MAXK; t = strtok(NULL, ",")) {
    int k = cm_kind_by_name(t);
    if (k < 0) {
      fprintf(stderr, "wire_gen: unknown kind %s\n", t);
      exit(2);
    }
    kinds[nkinds++] = k;
  }
}

static void hello(cm_wire_buf *b, const char *token) {
  const char *argv[] = {"wire_gen", hostile ? "--title\x1b]2;pwned\x07\xff" : "--synthetic"};
  cm_wire_device dev = {.index = 0, .has_uuid = 0, .name = hostile ? "Fake\x9b GPU\xc2\x9b" : "Fake GPU"};
  cm_wire_hello h = {.pid = pid, .ppid = (uint32_t)getppid(), .cupti_version = 130000,
                     .clock_realtime_ns = 1, .clock_cupti_ns = 1, .token = token,
                     .host = hostile ? "test\x1b[2Jhost" : "testhost",
                     .exe = hostile ? "/usr/bin/wire\xffgen" : "/usr/bin/wire_gen", .argc = 2, .ndevices = 1,
                     .argv = argv, .devices = &dev, .nenv = rank_env[0] ? 2 : 0, .env = rank_env};
  cm_wire_write_hello(b, &h);
}

static void schema(cm_wire_buf *b) {
  cm_wire_kind wk[MAXK];
  static cm_wire_field wf[MAXK][CM_WIRE_MAX_COLS];
  for (int i = 0; i < nkinds; i++) {
    int nf = cm_field_count(kinds[i]);
    for (int f = 0; f < nf; f++) {
      cm_field_info fi;
      cm_field_info_get(kinds[i], f, &fi);
      wf[i][f] = (cm_wire_field){.id = (uint32_t)f, .type = (uint32_t)fi.type, .width = fi.width,
                                 .name = fi.name};
    }
    wk[i] = (cm_wire_kind){.kind = (uint32_t)kinds[i], .nfields = (uint32_t)nf,
                           .name = cm_kind_name(kinds[i]), .fields = wf[i]};
  }
  cm_wire_schema s = {.nkinds = (uint32_t)nkinds, .kinds = wk};
  cm_wire_write_schema(b, &s);
}

static void strings(cm_wire_buf *b) {
  cm_wire_string e[3];
  const char **nm = hostile ? hostile_names : names;
  for (int i = 0; i < 3; i++)
    e[i] = (cm_wire_string){.id = (uint32_t)i + 1,
                            .len = hostile ? (uint32_t)strlen(nm[i])
                                 : names_len[i] ? names_len[i] : (uint32_t)strlen(names[i]),
                            .bytes = nm[i]};
  cm_wire_write_strings(b, e, 3);
}

/* Writes the records [from, to) of `kind` as one batch with the fields `sel` selects (NULL: all). */
static void batch(cm_wire_buf *b, int kind, uint64_t from, uint64_t to, const cm_selection *sel,
                  uint64_t seq) {
  /* Every frame gets its number; the one --drop-batch names is encoded and then cut off. */
  static uint32_t number;
  size_t before = b->len;
  number++;
  static uint64_t data[CM_WIRE_MAX_COLS][4096];
  cm_column cols[CM_WIRE_MAX_COLS];
  uint32_t nc = 0, n = (uint32_t)(to - from);
  uint64_t base = 1700000000000000000ull + (uint64_t)pid * 1000;
  for (int f = 0; f < cm_field_count(kind); f++) {
    if (sel && !cm_selection_has(sel, kind, f)) continue;
    cm_field_info fi;
    cm_field_info_get(kind, f, &fi);
    for (uint32_t r = 0; r < n; r++) {
      uint64_t i = from + r, start = base + i * 1000, v = i;
      if (!strcmp(fi.name, "start") || !strcmp(fi.name, "timestamp")) v = start;
      else if (!strcmp(fi.name, "stop") || !strcmp(fi.name, "end") || !strcmp(fi.name, "completed"))
        v = start + 500 + (i % 7) * 100;
      else if (fi.type == CM_TYPE_STR) v = 1 + i % 3;
      else if (!strcmp(fi.name, "bytes")) v = 1024u << (i % 5);
      else if (!strcmp(fi.name, "copy_kind")) v = 1 + i % 2;
      else if (!strcmp(fi.name, "cbid")) v = i % 3 == 0 ? 211 : i % 3 == 1 ? 31 : 13;
      else if (!strcmp(fi.name, "stream") || !strcmp(fi.name, "stream_id")) v = i % 2;
      else if (small_ids) v = i % 4;
      uint8_t *p = (uint8_t *)data[nc] + r * fi.width;
      memcpy(p, &v, fi.width); /* little-endian host */
    }
    int type = fi.type == CM_TYPE_STR && unknown_type && !sel ? unknown_type : fi.type;
    cols[nc] = (cm_column){.field = f, .type = type, .width = fi.width, .name = fi.name,
                           .data = data[nc]};
    nc++;
  }
  cm_batch bt = {.kind = kind, .n = n, .ncols = nc, .cols = cols, .seq = seq};
  cm_wire_write_batch_numbered(b, &bt, number);
  if (number == drop_batch) b->len = before;
}

static int capture(const char *path, long truncate_at, long corrupt_at) {
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  cm_wire_write_file_header(&b, 0);
  hello(&b, "");
  schema(&b);
  strings(&b);
  uint64_t seq = 0, sent = 0;
  for (uint64_t from = 0; from < nrec; from += 1000)
    for (int k = 0; k < nkinds; k++) {
      uint64_t to = from + 1000 < nrec ? from + 1000 : nrec;
      batch(&b, kinds[k], from, to, NULL, ++seq);
      sent += to - from;
    }
  cm_wire_kv st[] = {{"records_decoded", nrec * (uint64_t)nkinds}, {"records_dropped", cupti_dropped},
                     {"records_queued", sent}, {"batches_queued", seq}};
  if (!no_end) {
    cm_wire_write_stats(&b, st, 4);
    cm_wire_write_bye(&b, CM_WIRE_BYE_EXIT, 0, "");
  }
  size_t len = b.len;
  if (truncate_at >= 0 && (size_t)truncate_at < len) len = (size_t)truncate_at;
  if (corrupt_at >= 0 && (size_t)corrupt_at < len) b.data[corrupt_at] ^= 0x5a;
  FILE *fp = fopen(path, "wb");
  if (!fp || fwrite(b.data, 1, len, fp) != len || fclose(fp)) {
    perror(path);
    return 1;
  }
  cm_wire_buf_free(&b);
  return 0;
}

static int sock_fd;
static cm_wire_reader *rd;

static void send_buf(cm_wire_buf *b) {
  size_t off = 0;
  while (off < b->len) {
    ssize_t w = write(sock_fd, b->data + off, b->len - off);
    if (w <= 0) {
      perror("wire_gen: write");
      exit(3);
    }
    off += (size_t)w;
  }
  cm_wire_buf_clear(b);
}

/* Blocks for the next control frame; returns 0 at EOF. */
static int next_frame(cm_wire_frame *f) {
  for (;;) {
    int rc = cm_wire_reader_next(rd, f);
    if (rc == 1) return 1;
    if (rc < 0) {
      fprintf(stderr, "wire_gen: bad control stream: %s\n", cm_wire_reader_errmsg(rd));
      exit(3);
    }
    char buf[65536];
    ssize_t n = read(sock_fd, buf, sizeof buf);
    if (n <= 0) return 0;
    cm_wire_reader_feed(rd, buf, (size_t)n);
  }
}

static cm_selection *sel;

static void apply_select(const cm_wire_frame *f) {
  const char *spec;
  uint32_t len;
  cm_wire_decode_select(f, &spec, &len);
  cm_selection_free(sel);
  cm_selection_new(&sel);
  if (cm_selection_parse(sel, spec)) fprintf(stderr, "wire_gen: bad SELECT %s\n", spec);
  fprintf(stderr, "wire_gen: pid %u SELECT %s\n", pid, spec);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Writes a frame header of `type` that declares `len` payload bytes, with a valid header crc. */
static void claim_header(uint8_t h[24], uint32_t type, uint64_t len) {
  memset(h, 0, 24);
  h[0] = 'C';
  h[1] = 'M';
  h[2] = 1;
  h[4] = (uint8_t)type;
  h[5] = (uint8_t)(type >> 8);
  for (int i = 0; i < 8; i++) h[8 + i] = (uint8_t)(len >> (8 * i));
  uint32_t crc = cm_wire_crc32c(0, h, 20);
  for (int i = 0; i < 4; i++) h[20 + i] = (uint8_t)(crc >> (8 * i));
}

/* Waits up to `ms` for the peer to close; returns 1 when it did. */
static int closed_within(int fd, int ms) {
  double end = now_ms() + ms;
  for (;;) {
    int left = (int)(end - now_ms());
    if (left <= 0) return 0;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, left) <= 0) continue;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return 1;
  }
}

static int idle(int n, int hold_ms, const char *ready) {
  const char *path = getenv("CUPTIMON_SOCKET");
  if (!path) {
    fprintf(stderr, "wire_gen: CUPTIMON_SOCKET is not set\n");
    return 2;
  }
  int *fds = calloc((size_t)n, sizeof *fds);
  int opened = 0;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  for (int i = 0; i < n; i++) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) break;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
      close(fd);
      continue;
    }
    fds[opened++] = fd;
  }
  if (ready) {
    FILE *f = fopen(ready, "w");
    if (f) fclose(f);
  }
  double end = now_ms() + hold_ms;
  int closed = 0;
  char *done = calloc((size_t)opened + 1, 1);
  while (now_ms() < end && closed < opened) {
    for (int i = 0; i < opened; i++) {
      if (done[i]) continue;
      char b;
      ssize_t r = read(fds[i], &b, 1);
      if (r == 0 || (r < 0 && errno != EAGAIN)) {
        done[i] = 1;
        closed++;
      }
    }
    usleep(20000);
  }
  printf("wire_gen: idle opened=%d closed=%d\n", opened, closed);
  free(done);
  free(fds);
  return 0;
}

static int agent(const char *token, int garbage, int exit_code, uint64_t oversize, uint64_t big) {
  const char *path = getenv("CUPTIMON_SOCKET");
  if (!token) token = getenv("CUPTIMON_TOKEN");
  if (!path || !token) {
    fprintf(stderr, "wire_gen: CUPTIMON_SOCKET and CUPTIMON_TOKEN are not set\n");
    return 2;
  }
  sock_fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  if (connect(sock_fd, (struct sockaddr *)&sa, sizeof sa)) {
    perror("wire_gen: connect");
    return 3;
  }
  cm_wire_reader_new(&rd, 0);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  if (oversize) {
    uint8_t h[24];
    claim_header(h, CM_WIRE_HELLO, oversize);
    if (write(sock_fd, h, sizeof h) != (ssize_t)sizeof h) return 3;
    int c = closed_within(sock_fd, 3000);
    printf("wire_gen: oversized HELLO %s\n", c ? "closed by the monitor" : "still open after 3 s");
    return c ? 0 : 5;
  }
  double t0 = now_ms();
  hello(&b, token);
  schema(&b);
  send_buf(&b);
  cm_wire_frame f;
  int32_t status = 1;
  while (next_frame(&f)) {
    if (f.type == CM_WIRE_SELECT) apply_select(&f);
    if (f.type == CM_WIRE_HELLO_ACK) {
      const char *msg;
      cm_wire_decode_hello_ack(&f, &status, &msg);
      if (status) fprintf(stderr, "wire_gen: refused: %s\n", msg);
      break;
    }
  }
  fprintf(stderr, "wire_gen: real_pid=%d handshake_ms=%.0f\n", (int)getpid(), now_ms() - t0);
  if (status) {
    cm_wire_buf_free(&b);
    cm_wire_reader_free(rd);
    cm_selection_free(sel);
    return 4;
  }
  if (big) {
    uint8_t h[24];
    claim_header(h, CM_WIRE_BATCH, big);
    if (write(sock_fd, h, sizeof h) != (ssize_t)sizeof h) return 3;
    /* --fill: that much of the payload follows (never all of it), so the monitor holds it. */
    static uint8_t zeros[1 << 20];
    signal(SIGPIPE, SIG_IGN);
    for (uint64_t sent = 0; sent < fill;) {
      size_t n = fill - sent < sizeof zeros ? (size_t)(fill - sent) : sizeof zeros;
      ssize_t w = write(sock_fd, zeros, n);
      if (w <= 0) break;
      sent += (uint64_t)w;
    }
    int c = closed_within(sock_fd, 3000);
    printf("wire_gen: big frame %s\n", c ? "closed by the monitor" : "still open after 3 s");
    cm_wire_buf_free(&b);
    return c ? 0 : 5;
  }
  /* --pm-status N: N unsolicited PM_STATUS errors whose message holds terminal escapes. */
  for (uint64_t k = 0; k < pm_flood; k++) {
    cm_wire_write_pm_status(&b, CM_EIO, 0, "\x1b]0;pwned\x07\x1b[2Jsampling failed");
    if (b.len > (1u << 20)) send_buf(&b);
  }
  strings(&b);
  send_buf(&b);
  uint64_t seq = 0, sent = 0;
  for (uint64_t from = 0; from < nrec; from += 1000)
    for (int k = 0; k < nkinds; k++) {
      if (!sel || cm_selection_count(sel, kinds[k]) == 0) continue;
      uint64_t to = from + 1000 < nrec ? from + 1000 : nrec;
      batch(&b, kinds[k], from, to, sel, ++seq);
      sent += to - from;
      send_buf(&b);
      if (garbage) {
        static const char junk[64] = "CM this is not a frame header at all..........";
        if (write(sock_fd, junk, sizeof junk) < 0) return 3;
        garbage = 0;
      }
    }
  if (no_end) { /* like a process killed before its exit handler: no STATS, no BYE */
    cm_wire_buf_free(&b);
    close(sock_fd);
    printf("wire_gen: pid=%u sent=%llu\n", pid, (unsigned long long)sent);
    return exit_code;
  }
  cm_wire_kv st[] = {{"records_decoded", sent}, {"records_dropped", cupti_dropped},
                     {"batches_dropped", 0}, {"records_queued", sent}, {"batches_queued", seq}};
  cm_wire_write_stats(&b, st, 5);
  /* Answer a flush that arrives while we are still connected (non-blocking peek). */
  struct timeval tv = {0, 200000};
  setsockopt(sock_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  send_buf(&b);
  while (next_frame(&f)) {
    if (f.type == CM_WIRE_FLUSH) {
      uint64_t id;
      cm_wire_decode_flush(&f, &id, NULL, NULL);
      cm_wire_write_flush_done(&b, id, 0);
      send_buf(&b);
    } else if (f.type == CM_WIRE_SELECT) {
      apply_select(&f);
    }
  }
  cm_wire_write_bye(&b, CM_WIRE_BYE_EXIT, exit_code, "");
  send_buf(&b);
  cm_wire_buf_free(&b);
  cm_wire_reader_free(rd);
  cm_selection_free(sel);
  close(sock_fd);
  printf("wire_gen: pid=%u sent=%llu\n", pid, (unsigned long long)sent);
  return exit_code;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: wire_gen capture PATH [opts] | wire_gen agent [opts]\n");
    return 2;
  }
  pid = (uint32_t)getpid();
  const char *path = NULL, *token = NULL, *ready = NULL;
  long truncate_at = -1, corrupt_at = -1;
  int garbage = 0, exit_code = 0, i = 2, nidle = 0, hold_ms = 3000;
  uint64_t oversize = 0, big = 0;
  if (!strcmp(argv[1], "capture")) path = argv[i++];
  if (!strcmp(argv[1], "idle")) nidle = argc > 2 ? atoi(argv[i++]) : 0;
  for (; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(a, "--pid")) pid = (uint32_t)atoi(v), i++;
    else if (!strcmp(a, "--rank")) {
      snprintf(rank_store[0], sizeof rank_store[0], "RANK=%d", atoi(v));
      snprintf(rank_store[1], sizeof rank_store[1], "WORLD_SIZE=%d", atoi(v) + 1);
      rank_env[0] = rank_store[0], rank_env[1] = rank_store[1], i++;
    }
    else if (!strcmp(a, "--records")) nrec = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--kinds")) parse_kinds(v), i++;
    else if (!strcmp(a, "--truncate")) truncate_at = atol(v), i++;
    else if (!strcmp(a, "--corrupt")) corrupt_at = atol(v), i++;
    else if (!strcmp(a, "--unknown-type")) unknown_type = atoi(v), i++;
    else if (!strcmp(a, "--token")) token = v, i++;
    else if (!strcmp(a, "--exit-code")) exit_code = atoi(v), i++;
    else if (!strcmp(a, "--garbage")) garbage = 1;
    else if (!strcmp(a, "--oversize-hello")) oversize = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--big-frame")) big = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--fill")) fill = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--pm-status")) pm_flood = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--hold-ms")) hold_ms = atoi(v), i++;
    else if (!strcmp(a, "--ready")) ready = v, i++;
    else if (!strcmp(a, "--drop-batch")) drop_batch = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--cupti-dropped")) cupti_dropped = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--no-end")) no_end = 1;
    else if (!strcmp(a, "--small-ids")) small_ids = 1;
    else if (!strcmp(a, "--hostile-names"))
      for (int k = 0; k < 3; k++) names[k] = hostile_sql[k], names_len[k] = hostile_sql_len[k];
    else if (!strcmp(a, "--hostile")) hostile = 1;
    else {
      fprintf(stderr, "wire_gen: unknown option %s\n", a);
      return 2;
    }
  }
  if (!nkinds) parse_kinds("kernel,memcpy");
  if (path) return capture(path, truncate_at, corrupt_at);
  if (!strcmp(argv[1], "idle")) return idle(nidle, hold_ms, ready);
  return agent(token, garbage, exit_code, oversize, big);
}
