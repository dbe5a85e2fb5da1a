/*
 * capture_tool.c: a test helper that reads, damages and re-encodes cuptimon captures.
 *
 *   capture_tool info IN                      frames per type, records per kind, the file's
 *                                             minor version and how many BATCH frames are
 *                                             numbered, as "key value" lines
 *   capture_tool flip IN OUT --seed S [--flips N]
 *                                             N (default 1) random bit flips, none in the 24-byte
 *                                             file header (that case is a clean refusal)
 *   capture_tool bighdr IN OUT --after K [--len L]
 *                                             inserts, after the K-th frame, a 24-byte frame
 *                                             header with valid checksums of its 20 bytes that
 *                                             declares an L-byte payload (default 2^30) that never
 *                                             follows: a crafted header that must not hide the
 *                                             frames after it
 *   capture_tool upgrade IN OUT              re-encodes every frame through the current writer
 *                                             (cm_wire_write_*): BATCH frames numbered 1, 2, ...
 *                                             per process, STATS given records_queued and
 *                                             batches_queued (the BATCH frames of the process
 *                                             before it, as an agent of wire 1.1 counts them).
 *                                             Records, strings and every other field are kept.
 *   capture_tool relabel IN OUT [--exe PATH] [--device-name NAME]
 *                                             upgrade, and in each HELLO: the executable (and an
 *                                             argv[0] equal to it) becomes PATH, and a HELLO
 *                                             that lists no device gets device 0 named NAME (a
 *                                             capture's TARGET_INFO_GPU name without DEVICE
 *                                             records). Records and strings are kept.
 *
 * The mutators are the capture half of the attack clients (docs/reliability.md): the
 * hub specs replay their output and check that damage is counted, printed and fails the run.
 * Exit status 0, 1 on an I/O or format error (with a message), 2 on a usage error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuptimon.h"
#include "cuptimon_wire.h"

static int die(const char *fmt, const char *a) {
  fprintf(stderr, "capture_tool: ");
  fprintf(stderr, fmt, a);
  fputc('\n', stderr);
  return 1;
}

static int slurp(const char *path, uint8_t **out, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return die("cannot open %s", path);
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  *out = malloc(n > 0 ? (size_t)n : 1);
  *len = *out ? fread(*out, 1, (size_t)n, fp) : 0;
  fclose(fp);
  return *out && *len == (size_t)n ? 0 : die("cannot read %s", path);
}

static int spill(const char *path, const uint8_t *p, size_t n) {
  FILE *fp = fopen(path, "wb");
  if (!fp) return die("cannot create %s", path);
  size_t w = fwrite(p, 1, n, fp);
  return fclose(fp) == 0 && w == n ? 0 : die("cannot write %s", path);
}

/* A small deterministic generator (xorshift64*), so a seed names one mutation everywhere. */
static uint64_t rng_state;
static uint64_t rng(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Dull;
}

static int flip(const char *in, const char *out, uint64_t seed, int flips) {
  uint8_t *p;
  size_t n;
  if (slurp(in, &p, &n)) return 1;
  if (n <= CM_WIRE_FILE_HEADER_SIZE) return die("%s has no frame to damage", in);
  rng_state = seed * 2654435761u + 88172645463325252ull;
  for (int i = 0; i < flips; i++) {
    size_t at = CM_WIRE_FILE_HEADER_SIZE + (size_t)(rng() % (n - CM_WIRE_FILE_HEADER_SIZE));
    p[at] ^= (uint8_t)(1u << (rng() % 8));
    printf("flipped byte %zu\n", at);
  }
  int rc = spill(out, p, n);
  free(p);
  return rc;
}

static void st32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static int bighdr(const char *in, const char *out, long after, uint64_t len) {
  uint8_t *p;
  size_t n;
  if (slurp(in, &p, &n)) return 1;
  /* Walk the frames by their headers (a clean capture) to the end of the K-th. */
  size_t at = CM_WIRE_FILE_HEADER_SIZE;
  for (long k = 0; k < after; k++) {
    if (at + CM_WIRE_FRAME_HEADER_SIZE > n) return die("%s has fewer frames than --after", in);
    uint64_t l = 0;
    for (int i = 0; i < 8; i++) l |= (uint64_t)p[at + 8 + i] << (8 * i);
    at += CM_WIRE_FRAME_HEADER_SIZE + (size_t)l;
  }
  uint8_t h[CM_WIRE_FRAME_HEADER_SIZE] = {'C', 'M', CM_WIRE_MAJOR, CM_WIRE_MINOR};
  h[4] = CM_WIRE_BATCH;
  for (int i = 0; i < 8; i++) h[8 + i] = (uint8_t)(len >> (8 * i));
  st32(h + 16, 0);
  st32(h + 20, cm_wire_crc32c(0, h, 20));
  uint8_t *q = malloc(n + sizeof h);
  if (!q) return die("%s", "out of memory");
  memcpy(q, p, at);
  memcpy(q + at, h, sizeof h);
  memcpy(q + at + sizeof h, p + at, n - at);
  printf("inserted a header declaring %llu bytes at byte %zu\n", (unsigned long long)len, at);
  int rc = spill(out, q, n + sizeof h);
  free(p);
  free(q);
  return rc;
}

/* What relabel changes in each HELLO (NULL: keep). */
typedef struct relabel {
  const char *exe, *device_name;
} relabel;

/* Prints the capture's facts; with `out`, writes every frame again through the current writer,
 * with the HELLO changes of `rl` (NULL for none). */
static int walk(const char *in, const char *out, const relabel *rl) {
  cm_wire_file *cf;
  char msg[CM_WIRE_ERRMSG_SIZE];
  if (cm_wire_file_open(&cf, in, msg)) return die("%s", msg);
  cm_wire_buf b;
  cm_wire_buf_init(&b);
  if (out) cm_wire_write_file_header(&b, 0);
  uint64_t types[128] = {0}, kinds[CM_KIND_MAX] = {0}, numbered = 0, records = 0;
  uint64_t proc_records = 0, proc_batches = 0;
  cm_wire_schema schema = {0};
  cm_wire_frame f;
  int rc, bad = 0;
  uint32_t minor = 0;
  while ((rc = cm_wire_file_next(cf, &f)) == 1) {
    minor = cm_wire_reader_file_minor(f.reader);
    types[f.type < 128 ? f.type : 0]++;
    int wrc = 0;
    switch (f.type) {
    case CM_WIRE_HELLO: {
      cm_wire_hello h;
      if ((wrc = cm_wire_decode_hello(&f, &h)) == 0 && out) {
        /* A shallow copy carries the changes; h keeps what the decoder owns, for release. */
        cm_wire_hello w = h;
        const char *argv0[64];
        cm_wire_device dev = {.index = 0, .has_uuid = 0, .name = rl ? rl->device_name : NULL};
        if (rl && rl->exe) {
          if (h.argc > 0 && h.argc <= 64 && h.exe && !strcmp(h.argv[0], h.exe)) {
            memcpy(argv0, h.argv, h.argc * sizeof *argv0);
            argv0[0] = rl->exe;
            w.argv = argv0;
          }
          w.exe = rl->exe;
        }
        if (dev.name && h.ndevices == 0) {
          w.ndevices = 1;
          w.devices = &dev;
        }
        wrc = cm_wire_write_hello(&b, &w);
      }
      cm_wire_hello_release(&h);
      proc_records = proc_batches = 0;
      break;
    }
    case CM_WIRE_SCHEMA:
      /* Batches are decoded against the latest schema (what a BATCH needs of it: the types). */
      cm_wire_schema_release(&schema);
      if ((wrc = cm_wire_decode_schema(&f, &schema)) == 0 && out) wrc = cm_wire_write_schema(&b, &schema);
      break;
    case CM_WIRE_STRINGS: {
      cm_wire_strings s;
      if ((wrc = cm_wire_decode_strings(&f, &s)) == 0 && out) wrc = cm_wire_write_strings(&b, s.entries, s.count);
      cm_wire_strings_release(&s);
      break;
    }
    case CM_WIRE_BATCH: {
      static cm_wire_batch wb;
      if ((wrc = cm_wire_decode_batch(&f, NULL, &wb)) != 0) break;
      if (wb.number) numbered++;
      records += wb.batch.n;
      if (wb.batch.kind >= 0 && wb.batch.kind < CM_KIND_MAX) kinds[wb.batch.kind] += wb.batch.n;
      proc_records += wb.batch.n;
      proc_batches++;
      if (out) wrc = cm_wire_write_batch_numbered(&b, &wb.batch, (uint32_t)proc_batches);
      break;
    }
    case CM_WIRE_STATS: {
      cm_wire_kvlist l;
      if ((wrc = cm_wire_decode_kvlist(&f, &l)) == 0 && out) {
        cm_wire_kv *kv = calloc((size_t)l.count + 2, sizeof *kv);
        uint32_t k = 0;
        for (uint32_t i = 0; kv && i < l.count; i++)
          if (strcmp(l.items[i].name, "records_queued") && strcmp(l.items[i].name, "batches_queued"))
            kv[k++] = l.items[i];
        if (kv) {
          kv[k++] = (cm_wire_kv){"records_queued", proc_records};
          kv[k++] = (cm_wire_kv){"batches_queued", proc_batches};
        }
        wrc = kv ? cm_wire_write_stats(&b, kv, k) : CM_ENOMEM;
        free(kv);
      }
      cm_wire_kvlist_release(&l);
      break;
    }
    case CM_WIRE_FLUSH_DONE: {
      uint64_t id;
      int32_t st;
      if ((wrc = cm_wire_decode_flush_done(&f, &id, &st)) == 0 && out) wrc = cm_wire_write_flush_done(&b, id, st);
      break;
    }
    case CM_WIRE_BYE: {
      cm_wire_bye y;
      if ((wrc = cm_wire_decode_bye(&f, &y)) == 0 && out) wrc = cm_wire_write_bye(&b, y.reason, y.exit_code, y.message);
      break;
    }
    case CM_WIRE_PM_STATUS: {
      int32_t st;
      uint32_t dev;
      const char *m;
      if ((wrc = cm_wire_decode_pm_status(&f, &st, &dev, &m)) == 0 && out)
        wrc = cm_wire_write_pm_status(&b, st, dev, m);
      break;
    }
    default:
      if (out) wrc = cm_wire_write_frame(&b, f.type, f.flags, f.minor, f.payload, (size_t)f.len);
    }
    if (wrc) {
      fprintf(stderr, "capture_tool: the %s frame at byte %llu: %s\n", cm_wire_type_name(f.type),
              (unsigned long long)f.offset, cm_wire_reader_errmsg(f.reader));
      bad = 1;
      break;
    }
  }
  if (rc < 0) {
    fprintf(stderr, "capture_tool: %s: %s\n", in, cm_wire_file_errmsg(cf));
    bad = 1;
  }
  uint64_t resyncs = cm_wire_file_resyncs(cf, NULL);
  cm_wire_schema_release(&schema);
  cm_wire_file_close(cf);
  if (!out) {
    printf("minor %u\nresyncs %llu\nrecords %llu\nnumbered %llu\n", minor, (unsigned long long)resyncs,
           (unsigned long long)records, (unsigned long long)numbered);
    for (int t = 1; t < 128; t++)
      if (types[t]) printf("frames.%s %llu\n", cm_wire_type_name((uint32_t)t), (unsigned long long)types[t]);
    for (int k = 0; k < CM_KIND_MAX; k++)
      if (kinds[k]) printf("records.%s %llu\n", cm_kind_name(k), (unsigned long long)kinds[k]);
  } else if (!bad) {
    bad = spill(out, b.data, b.len);
  }
  cm_wire_buf_free(&b);
  return bad;
}

int main(int argc, char **argv) {
  const char *usage = "usage: capture_tool info IN | flip IN OUT --seed S [--flips N] | "
                      "bighdr IN OUT --after K [--len L] | upgrade IN OUT | "
                      "relabel IN OUT [--exe PATH] [--device-name NAME]\n";
  if (argc < 3) {
    fputs(usage, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "info")) return walk(argv[2], NULL, NULL);
  if (argc < 4) {
    fputs(usage, stderr);
    return 2;
  }
  uint64_t seed = 1, len = (uint64_t)1 << 30;
  long after = 1;
  int flips = 1;
  relabel rl = {0};
  for (int i = 4; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--exe")) rl.exe = argv[i + 1];
    else if (!strcmp(argv[i], "--device-name")) rl.device_name = argv[i + 1];
    else if (!strcmp(argv[i], "--flips")) flips = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--after")) after = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "--len")) len = strtoull(argv[i + 1], NULL, 10);
    else {
      fputs(usage, stderr);
      return 2;
    }
  }
  if (!strcmp(cmd, "flip")) return flip(argv[2], argv[3], seed, flips);
  if (!strcmp(cmd, "bighdr")) return bighdr(argv[2], argv[3], after, len);
  if (!strcmp(cmd, "upgrade")) return walk(argv[2], argv[3], NULL);
  if (!strcmp(cmd, "relabel")) return walk(argv[2], argv[3], &rl);
  fputs(usage, stderr);
  return 2;
}
