/*
 * decode_bench.c: decode throughput of one core, side by side with memcpy of the same bytes.
 *
 * Design. The benchmark runs the engine's real decode path, cm__decoder_decode, over activity
 * buffers laid out exactly as CUPTI 13.0 lays them out: each record is a complete 13.0 struct made
 * by the fake CUPTI's fake_gen_record, and records sit back to back at 8-byte aligned offsets. The
 * records are walked with cuptiActivityGetNextRecord from the binding that cm__cupti_load returns,
 * which here is the fake library (a pointer walk), so the cost of the real libcupti's
 * GetNextRecord is not included; the printed report says so.
 *
 * The yardstick is memcpy of the same input bytes into a separate destination of the same size,
 * measured in the same process and interleaved pass by pass with the decode (memcpy, decode,
 * memcpy, decode, ...), so that both see the same machine noise, frequency and memory traffic. The
 * input is far larger than the last-level cache in the default configuration (64 buffers of 4 MiB),
 * so both stream from memory, as the decode worker does with buffers CUPTI has just completed.
 * The figure of merit is decode GB/s divided by memcpy GB/s over the input bytes; the goal is at
 * least 0.5.
 *
 * Three workloads (kernel-only, runtime-API-only, and a realistic mix) are each decoded with two
 * selections: the few fields a typical script asks for, and every field. Every case first runs one
 * untimed pass that grows the decoder's columns and is checked against the source records
 * (count per kind, and every selected field of every record in --quick mode, or of a sample
 * otherwise), so a decoder that got faster by getting wrong fails here instead of looking good.
 *
 * The output is a Markdown block (date, CPU model, compiler, configuration and one table) meant to
 * be pasted into bench/RESULTS.md. The exit status is 0 on success, 1 when a check fails, and 2 on a
 * usage or setup error; with --min-ratio R a median ratio below R also fails, for use in CI.
 *
 * Thread rules: the benchmark is single-threaded and pins itself to the CPU it starts on (unless
 * --no-pin), because the decode worker is one thread.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_internal.h"
#include "fake_cupti.h"

#ifndef CM_BENCH_FAKE_CUPTI
#define CM_BENCH_FAKE_CUPTI ""
#endif
#ifndef CM_BENCH_COMPILER
#define CM_BENCH_COMPILER "unknown compiler " __VERSION__
#endif
#ifndef CM_BENCH_FLAGS
#define CM_BENCH_FLAGS ""
#endif
#ifndef CM_BENCH_BUILD_TYPE
#define CM_BENCH_BUILD_TYPE "unknown"
#endif

/* ---- options ---------------------------------------------------------------------------- */

typedef struct options {
  uint32_t nbuffers;     /* input buffers per workload */
  size_t buffer_size;    /* bytes per buffer */
  uint32_t passes;       /* timed passes per case, each one memcpy pass and one decode pass */
  int quick;             /* tiny sizes and a full check: the ctest smoke run */
  int pin;               /* pin to the starting CPU */
  double min_ratio;      /* fail when a case's median ratio is below this (0 = never) */
  const char *only;      /* run only this workload, or NULL for all */
} options;

static void usage(FILE *f, const char *argv0) {
  fprintf(f,
          "usage: %s [--quick] [--buffers N] [--buffer-kib K] [--passes P] [--workload W]\n"
          "          [--min-ratio R] [--no-pin]\n"
          "  Measures cm__decoder_decode throughput on one core against memcpy of the same\n"
          "  bytes, and prints a Markdown report.\n"
          "  --quick        tiny run (4 buffers of 64 KiB, 3 passes) with every record checked\n"
          "  --buffers N    input buffers per workload (default 64)\n"
          "  --buffer-kib K bytes per buffer in KiB (default 4096)\n"
          "  --passes P     timed passes per case (default 9); the median and best are reported\n"
          "  --workload W   kernel, api or mixed (default all three)\n"
          "  --min-ratio R  exit 1 when a median decode/memcpy ratio is below R\n"
          "  --no-pin       do not pin the process to the CPU it starts on\n",
          argv0);
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = (uint32_t)v;
  return 0;
}

static int parse_options(int argc, char **argv, options *o) {
  o->nbuffers = 64;
  o->buffer_size = (size_t)4 << 20;
  o->passes = 9;
  o->quick = 0;
  o->pin = 1;
  o->min_ratio = 0;
  o->only = NULL;
  int sized = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    uint32_t u;
    if (!strcmp(a, "--quick")) {
      o->quick = 1;
    } else if (!strcmp(a, "--no-pin")) {
      o->pin = 0;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout, argv[0]);
      exit(0);
    } else if (!strcmp(a, "--buffers") && v && !parse_u32(v, 1, 4096, &u)) {
      o->nbuffers = u, sized = 1, i++;
    } else if (!strcmp(a, "--buffer-kib") && v && !parse_u32(v, 4, 1u << 20, &u)) {
      o->buffer_size = (size_t)u << 10, sized = 1, i++;
    } else if (!strcmp(a, "--passes") && v && !parse_u32(v, 1, 1000, &u)) {
      o->passes = u, i++;
    } else if (!strcmp(a, "--workload") && v &&
               (!strcmp(v, "kernel") || !strcmp(v, "api") || !strcmp(v, "mixed"))) {
      o->only = v, i++;
    } else if (!strcmp(a, "--min-ratio") && v) {
      char *end;
      o->min_ratio = strtod(v, &end);
      if (*end || o->min_ratio < 0) goto bad;
      i++;
    } else {
      goto bad;
    }
  }
  /* --quick shrinks whatever was not given explicitly. */
  if (o->quick && !sized) {
    o->nbuffers = 4;
    o->buffer_size = (size_t)64 << 10;
  }
  if (o->quick && o->passes == 9) o->passes = 3;
  return 0;
bad:
  usage(stderr, argv[0]);
  return -1;
}

/* ---- workloads and selections --------------------------------------------------------------- */

/* A kind in a workload's mix, with an integer weight (records of this kind per `total`). */
typedef struct mix_entry {
  int kind;
  uint32_t weight;
  const char *few; /* the fields a typical script selects, comma separated; NULL for none */
} mix_entry;

typedef struct workload {
  const char *name;  /* the --workload name */
  const char *label; /* the table's label */
  int nmix;
  mix_entry mix[5];
} workload;

/* The realistic mix is 1 kernel : 2 runtime : 0.2 memcpy : 0.1 memset : 0.05 sync, scaled by 20
 * to integers. Kinds are drawn at random with these weights (a fixed seed), which interleaves them
 * less regularly than a real program does and so is the harder case for the decoder's per-kind
 * runs and for branch prediction. The synchronization records are left out of the typical
 * selection: scripts rarely ask for them, but the decoder still inspects every one for the fence. */
static const workload WORKLOADS[] = {
    {"kernel", "kernel only (CONCURRENT_KERNEL)", 1,
     {{CM_KIND_CONCURRENT_KERNEL, 1, "name,start,stop,stream,correlation"}}},
    {"api", "API only (RUNTIME)", 1, {{CM_KIND_RUNTIME, 1, "cbid,start,stop,correlation"}}},
    {"mixed", "mixed (1 kernel : 2 runtime : 0.2 memcpy : 0.1 memset : 0.05 sync)", 5,
     {{CM_KIND_CONCURRENT_KERNEL, 20, "name,start,stop,stream,correlation"},
      {CM_KIND_RUNTIME, 40, "cbid,start,stop,correlation"},
      {CM_KIND_MEMCPY, 4, "copy_kind,bytes,start,stop,stream,correlation"},
      {CM_KIND_MEMSET, 2, "bytes,start,stop,stream,correlation"},
      {CM_KIND_SYNCHRONIZATION, 1, NULL}}},
};
#define NWORKLOADS ((int)(sizeof WORKLOADS / sizeof WORKLOADS[0]))

/* SEL_NONE selects nothing: the decoder then only walks the records, counts them and inspects the
 * sync records, which is the floor every selection pays (GetNextRecord and the per-record loop). */
enum { SEL_NONE = 0, SEL_FEW = 1, SEL_ALL = 2, SEL_COUNT = 3 };
static const char *const SEL_NAMES[SEL_COUNT] = {"none (walk only)", "few", "all"};

/* Fills sel[CM_KIND_MAX] for the workload's kinds: the typical fields, or all fields of each kind.
 * Returns the number of fields selected over all kinds, or -1 with a message when the registry
 * does not know a name (the selection lists here are then out of date). */
static int build_selection(const workload *w, int which, cm__bits *sel) {
  memset(sel, 0, sizeof(cm__bits) * CM_KIND_MAX);
  int total = 0;
  for (int i = 0; i < w->nmix; i++) {
    int kind = w->mix[i].kind;
    if (which == SEL_ALL) {
      int n = cm_field_count(kind);
      if (n < 0) {
        fprintf(stderr, "decode_bench: kind %d: %s\n", kind, cm_errmsg());
        return -1;
      }
      for (int f = 0; f < n; f++) cm__bits_set(&sel[kind], f);
      total += n;
      continue;
    }
    if (which == SEL_NONE || !w->mix[i].few) continue;
    char list[256];
    snprintf(list, sizeof list, "%s", w->mix[i].few);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name;
         name = strtok_r(NULL, ",", &save)) {
      int f = cm_field_by_name(kind, name);
      if (f < 0) {
        fprintf(stderr, "decode_bench: %s\n", cm_errmsg());
        return -1;
      }
      cm__bits_set(&sel[kind], f);
      total++;
    }
  }
  return total;
}

/* ---- input buffers ------------------------------------------------------------------------- */

typedef struct input {
  cm__pool pool;              /* the engine's buffer pool, which the buffers come from */
  bool pool_ok;               /* the pool was initialized */
  uint32_t nbuffers;
  uint8_t **buf;              /* nbuffers buffers of buffer_size bytes, from the pool */
  size_t *valid;              /* bytes of records in each, as CUPTI's validSize */
  uint64_t bytes;             /* sum of valid */
  uint64_t records;
  uint64_t per_kind[CM_KIND_MAX];
} input;

/* A small deterministic generator (xorshift64*), so every run decodes the same buffers. */
static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1DULL;
}

static void input_free(input *in) {
  if (in->buf)
    for (uint32_t b = 0; b < in->nbuffers; b++)
      if (in->buf[b]) cm__pool_put(&in->pool, in->buf[b]);
  if (in->pool_ok) cm__pool_destroy(&in->pool);
  free(in->buf);
  free(in->valid);
  memset(in, 0, sizeof *in);
}

/* Fills the buffers with the workload's records. The buffers come from the engine's pool (so they
 * are allocated, aligned and laid out in memory as the decode worker's are). Each record is
 * fake_gen_record's 13.0 struct, placed at the next 8-byte boundary as CUPTI places records; a
 * buffer is complete when the next record would not fit. Returns 0, or -1 with a message; either
 * way input_free releases what was taken. */
static int input_fill(input *in, const workload *w, const options *o) {
  memset(in, 0, sizeof *in);
  if (cm__pool_init(&in->pool, o->buffer_size, o->nbuffers, 0)) {
    fprintf(stderr, "decode_bench: cannot create the buffer pool: %s\n", cm_errmsg());
    return -1;
  }
  in->pool_ok = true;
  in->nbuffers = o->nbuffers;
  in->buf = calloc(o->nbuffers, sizeof *in->buf);
  in->valid = calloc(o->nbuffers, sizeof *in->valid);
  if (!in->buf || !in->valid) goto oom;
  uint32_t total_weight = 0;
  for (int i = 0; i < w->nmix; i++) total_weight += w->mix[i].weight;
  uint64_t seed = 0x9E3779B97F4A7C15ULL, seq[CM_KIND_MAX] = {0};
  _Alignas(8) uint8_t rec[512];
  int kind = -1;
  size_t size = 0;
  for (uint32_t b = 0; b < o->nbuffers; b++) {
    size_t got = 0;
    bool warn = false;
    in->buf[b] = cm__pool_get(&in->pool, &got, &warn);
    if (!in->buf[b] || got < o->buffer_size) goto oom;
    /* Touching every page now keeps page faults out of the timed passes. */
    memset(in->buf[b], 0, o->buffer_size);
    size_t off = 0;
    for (;;) {
      if (kind < 0) {
        uint32_t r = (uint32_t)(rng_next(&seed) % total_weight);
        int i = 0;
        while (r >= w->mix[i].weight) r -= w->mix[i++].weight;
        kind = w->mix[i].kind;
        memset(rec, 0, sizeof rec);
        size = fake_gen_record(kind, 0, seq[kind], rec);
        if (size == 0 || size > sizeof rec) {
          fprintf(stderr, "decode_bench: fake_gen_record does not generate kind %d (%s)\n", kind,
                  cm_kind_name(kind) ? cm_kind_name(kind) : "?");
          return -1;
        }
      }
      if (off + size > o->buffer_size) break; /* this record starts the next buffer */
      memcpy(in->buf[b] + off, rec, size);
      off = (off + size + 7) & ~(size_t)7;
      seq[kind]++;
      in->per_kind[kind]++;
      in->records++;
      kind = -1;
    }
    if (off > o->buffer_size) off = o->buffer_size;
    in->valid[b] = off;
    in->bytes += off;
  }
  return 0;
oom:
  fprintf(stderr, "decode_bench: out of memory for %u buffers of %zu bytes\n", o->nbuffers,
          o->buffer_size);
  return -1;
}

/* ---- checks ----------------------------------------------------------------------------- */

static uint64_t load_le(const uint8_t *p, unsigned width) {
  uint64_t v = 0;
  memcpy(&v, p, width > 8 ? 8 : width); /* little-endian hosts only, as CUPTI is */
  return v;
}

/* Compares the decoder's columns with the source records: the count of every kind, and each
 * selected field of every `stride`-th record. Returns the number of mismatches (printing the first
 * few). */
static uint64_t check_decode(const cm__cupti *c, cm__decoder *d, cm__intern *strings,
                             const input *in, const cm__bits *sel, uint32_t stride) {
  uint64_t bad = 0, idx[CM_KIND_MAX] = {0};
  for (int k = 0; k < CM_KIND_MAX; k++) {
    if (cm__bits_empty(&sel[k])) continue;
    if (cm__decoder_count(d, k) != in->per_kind[k]) {
      fprintf(stderr, "check: kind %s holds %u records, expected %llu\n", cm_kind_name(k),
              cm__decoder_count(d, k), (unsigned long long)in->per_kind[k]);
      bad++;
    }
  }
  if (bad) return bad;
  for (uint32_t b = 0; b < in->nbuffers; b++) {
    CUpti_Activity *rec = NULL;
    while (c->ActivityGetNextRecord(in->buf[b], in->valid[b], &rec) == CUPTI_SUCCESS) {
      int k = (int)rec->kind;
      if (k < 0 || k >= CM_KIND_MAX) continue;
      uint64_t i = idx[k]++;
      if (cm__bits_empty(&sel[k]) || i % stride) continue;
      const cm__kind_desc *desc = cm__kind_desc_get(k);
      for (int f = 0; f < desc->nfields; f++) {
        if (!cm__bits_has(&sel[k], f)) continue;
        const cm__field *fd = &desc->fields[f];
        const uint8_t *col = cm__decoder_column(d, k, f);
        const uint8_t *src = (const uint8_t *)rec + fd->offset;
        int ok;
        if (!col) {
          ok = 0;
        } else if (fd->type == CM_TYPE_STR) {
          const char *s;
          uint32_t id;
          size_t len = 0;
          memcpy(&s, src, sizeof s);
          memcpy(&id, col + i * 4, 4);
          const char *got = cm__intern_get(strings, id, &len);
          ok = s ? (got && len == strlen(s) && !memcmp(got, s, len)) : id == 0;
        } else {
          ok = load_le(src, fd->src_width) == load_le(col + i * fd->width, fd->width);
        }
        if (!ok && bad++ < 5)
          fprintf(stderr, "check: %s.%s of record %llu differs from the source record\n",
                  desc->name, fd->name, (unsigned long long)i);
      }
    }
  }
  return bad;
}

/* ---- timing ----------------------------------------------------------------------------- */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static uint64_t median_u64(uint64_t *v, uint32_t n) {
  qsort(v, n, sizeof *v, cmp_u64);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef struct result {
  const workload *w;
  int which;
  int nfields;
  uint64_t records, bytes;
  uint64_t dec_med, dec_best, cpy_med, cpy_best; /* ns per pass */
  double ratio_med, ratio_best; /* decode GB/s / memcpy GB/s, from the median pair and the best */
} result;

/* The copy every pass makes. The empty asm tells the compiler the destination is read afterwards,
 * so it cannot drop or shrink the copy. */
static void copy_pass(uint8_t **dst, const input *in) {
  for (uint32_t b = 0; b < in->nbuffers; b++) {
    memcpy(dst[b], in->buf[b], in->valid[b]);
    __asm__ volatile("" : : "r"(dst[b]) : "memory");
  }
}

static uint64_t decode_pass(cm__decoder *d, const input *in) {
  uint64_t n = 0;
  cm__decoder_reset(d);
  for (uint32_t b = 0; b < in->nbuffers; b++) n += cm__decoder_decode(d, in->buf[b], in->valid[b]);
  return n;
}

/* Runs one (workload, selection) case. Returns 0, or 1 when the decode is wrong, or -1 on a setup
 * failure. */
static int run_case(const cm__cupti *c, const input *in, uint8_t **dst, const workload *w,
                    int which, const options *o, result *r) {
  cm__bits sel[CM_KIND_MAX];
  int nfields = build_selection(w, which, sel);
  if (nfields < 0) return -1;
  cm__intern *strings = NULL;
  cm__decoder *d = NULL;
  if (cm__intern_new(&strings) || cm__decoder_new(&d, c, strings)) {
    fprintf(stderr, "decode_bench: cannot create the decoder: %s\n", cm_errmsg());
    cm__intern_free(strings);
    return -1;
  }
  cm__decoder_select(d, sel);

  /* The untimed first pass grows the columns to their final size (as a warm decode worker's are)
   * and interns the names; it is the one that is checked. */
  int rc = 0;
  uint64_t seen = decode_pass(d, in);
  if (seen != in->records) {
    fprintf(stderr, "check: decode saw %llu records, the buffers hold %llu\n",
            (unsigned long long)seen, (unsigned long long)in->records);
    rc = 1;
  } else if (check_decode(c, d, strings, in, sel, o->quick ? 1 : 61)) {
    rc = 1;
  }
  copy_pass(dst, in);

  uint64_t *dec = calloc(o->passes, sizeof *dec), *cpy = calloc(o->passes, sizeof *cpy);
  if (!dec || !cpy) {
    fprintf(stderr, "decode_bench: out of memory\n");
    rc = -1;
    goto out;
  }
  for (uint32_t p = 0; p < o->passes && rc == 0; p++) {
    uint64_t t0 = now_ns();
    copy_pass(dst, in);
    uint64_t t1 = now_ns();
    seen = decode_pass(d, in);
    uint64_t t2 = now_ns();
    cpy[p] = t1 - t0;
    dec[p] = t2 - t1;
    if (seen != in->records) rc = 1;
  }
  if (rc) goto out;
  r->w = w;
  r->which = which;
  r->nfields = nfields;
  r->records = in->records;
  r->bytes = in->bytes;
  r->dec_med = median_u64(dec, o->passes);
  r->cpy_med = median_u64(cpy, o->passes);
  r->dec_best = dec[0];
  r->cpy_best = cpy[0];
  /* GB/s is bytes/ns, and both moved the same bytes, so the ratio is the inverse time ratio. */
  r->ratio_med = (double)r->cpy_med / (double)(r->dec_med ? r->dec_med : 1);
  r->ratio_best = (double)r->cpy_best / (double)(r->dec_best ? r->dec_best : 1);
out:
  free(dec);
  free(cpy);
  cm__decoder_free(d);
  cm__intern_free(strings);
  return rc;
}

/* ---- report ----------------------------------------------------------------------------- */

static void cpu_model(char *out, size_t len) {
  snprintf(out, len, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10)) continue;
    const char *v = strchr(line, ':');
    if (!v) break;
    v++;
    while (*v == ' ' || *v == '\t') v++;
    snprintf(out, len, "%s", v);
    out[strcspn(out, "\n")] = 0;
    break;
  }
  fclose(f);
}

static double gbps(uint64_t bytes, uint64_t ns) { return ns ? (double)bytes / (double)ns : 0; }

static void print_header(const options *o, int cpu) {
  char date[64], cpu_name[256];
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
  cpu_model(cpu_name, sizeof cpu_name);
  printf("### Decode throughput (bench/decode_bench%s)\n\n", o->quick ? " --quick" : "");
  printf("- Date: %s\n", date);
  if (cpu >= 0)
    printf("- CPU: %s (one core, pinned to CPU %d)\n", cpu_name, cpu);
  else
    printf("- CPU: %s (one core, not pinned)\n", cpu_name);
  printf("- Build type: %s; compiler: %s, flags `%s`\n", CM_BENCH_BUILD_TYPE, CM_BENCH_COMPILER,
         CM_BENCH_FLAGS);
  printf("- Input: %u buffers of %zu KiB per workload, CUPTI 13.0 record layouts from "
         "fake_gen_record; %u timed passes per case, median (best in the last column)\n",
         o->nbuffers, o->buffer_size >> 10, o->passes);
  printf("- Baseline: memcpy of the same input bytes into a separate destination, interleaved "
         "pass by pass with the decode\n");
  printf("- Not included: the real libcupti's cuptiActivityGetNextRecord; records are walked "
         "with the fake CUPTI's GetNextRecord, a pointer walk\n");
  printf("- Selections: *none* = no field (the records are only walked and counted: the floor "
         "every selection pays); *few* = kernel name,start,stop,stream,correlation; runtime "
         "cbid,start,stop,correlation; memcpy copy_kind,bytes,start,stop,stream,correlation; "
         "memset bytes,start,stop,stream,correlation. *all* = every field of every kind present\n");
  if (o->quick)
    printf("- **--quick smoke run: the sizes fit in cache, so the figures are not "
           "representative**\n");
  printf("\n");
  printf("| workload | selection | fields | records | Mrecords/s | decode GB/s | memcpy GB/s "
         "| decode/memcpy | best |\n");
  printf("|---|---|--:|--:|--:|--:|--:|--:|--:|\n");
  fflush(stdout);
}

static void print_row(const result *r) {
  double secs = (double)r->dec_med / 1e9;
  printf("| %s | %s | %d | %llu | %.1f | %.2f | %.2f | %.2f | %.2f |\n", r->w->label,
         SEL_NAMES[r->which], r->nfields, (unsigned long long)r->records,
         secs > 0 ? (double)r->records / secs / 1e6 : 0, gbps(r->bytes, r->dec_med),
         gbps(r->bytes, r->cpy_med), r->ratio_med, r->ratio_best);
  fflush(stdout);
}

/* ---- main ------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  options o;
  if (parse_options(argc, argv, &o)) return 2;

  /* The fake CUPTI built with this tree is the default; an explicit CUPTIMON_LIBCUPTI wins. */
  if (CM_BENCH_FAKE_CUPTI[0]) setenv("CUPTIMON_LIBCUPTI", CM_BENCH_FAKE_CUPTI, 0);
  cm__cupti cupti;
  if (cm__cupti_load(&cupti)) {
    fprintf(stderr, "decode_bench: %s\n", cm_errmsg());
    return 2;
  }

  int cpu = -1;
  if (o.pin) {
    cpu = sched_getcpu();
    cpu_set_t set;
    CPU_ZERO(&set);
    if (cpu >= 0) CPU_SET(cpu, &set);
    if (cpu < 0 || sched_setaffinity(0, sizeof set, &set)) cpu = -1;
  }

  /* One destination for every workload, as large as the largest input: pages touched up front. */
  uint8_t **dst = calloc(o.nbuffers, sizeof *dst);
  if (!dst) return 2;
  for (uint32_t b = 0; b < o.nbuffers; b++) {
    if (posix_memalign((void **)&dst[b], 64, o.buffer_size)) {
      fprintf(stderr, "decode_bench: out of memory for the memcpy destination\n");
      return 2;
    }
    memset(dst[b], 1, o.buffer_size);
  }

  print_header(&o, cpu);
  int status = 0;
  double worst = 1e9;
  for (int wi = 0; wi < NWORKLOADS; wi++) {
    const workload *w = &WORKLOADS[wi];
    if (o.only && strcmp(o.only, w->name)) continue;
    input in;
    if (input_fill(&in, w, &o)) {
      input_free(&in);
      return 2;
    }
    for (int which = 0; which < SEL_COUNT; which++) {
      result r;
      int rc = run_case(&cupti, &in, dst, w, which, &o, &r);
      if (rc < 0) return 2;
      if (rc > 0) {
        printf("| %s | %s | | | decode check FAILED | | | | |\n", w->label, SEL_NAMES[which]);
        status = 1;
        continue;
      }
      print_row(&r);
      if (r.ratio_med < worst) worst = r.ratio_med;
      if (o.min_ratio > 0 && r.ratio_med < o.min_ratio) status = 1;
    }
    input_free(&in);
  }
  if (worst < 1e9)
    printf("\nLowest median decode/memcpy ratio: %.2f (goal: at least 0.50)%s\n", worst,
           o.min_ratio > 0 && worst < o.min_ratio ? " — below --min-ratio" : "");

  for (uint32_t b = 0; b < o.nbuffers; b++) free(dst[b]);
  free(dst);
  return status;
}
