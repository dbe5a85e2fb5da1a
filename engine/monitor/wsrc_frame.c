/*
 * wsrc_frame.c: what a process's frames mean to its wire source (see wsrc.h): cm__wsrc_frame, and
 * the replay's merge key.
 *
 * Design note. The frames of a process arrive in order: HELLO, SCHEMA, then STRINGS, BATCH and
 * STATS, and BYE at the end. The handlers below keep what later frames need in the source's
 * tables (wsrc.c): the schema, merged per kind with the latest winning and with its names copied
 * (a decoded schema points into its frame, which the reader reuses), the string table (copied:
 * ids are resolved long after their frame), the HELLO (for the process table) and the latest
 * STATS. A BATCH is decoded in place and, for each observer that selected its kind, handed to
 * cm_host_deliver as a cm_batch that carries only that observer's columns: the column descriptors
 * are rebuilt on the stack, the data stays in the frame. An observer never receives a kind with
 * one of its fields missing; such a batch is skipped for that observer and reported once. A
 * column whose type this version does not know is skipped (docs/wire.md), so an observer never
 * sees one.
 *
 * What a peer chooses is bounded here too (wsrc.c says how): kinds and counter names beyond
 * their caps are refused and reported once per process, and the stream goes on. The BATCH
 * numbers and the STATS counts received are noted for the loss accounting (cm__wsrc_loss).
 *
 * Loop thread only; the warnings' rate limit and the decode space of on_batch are the file's
 * own state.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host_source.h"
#include "wsrc_internal.h"

/* One-time warnings (cm__wsrc.warned bits). */
enum { WARN_KINDS = 1, WARN_STATS = 2, WARN_TYPE = 4, WARN_PM = 8 };

static void note_stats(cm__wsrc *w);

static int on_hello(cm__wsrc *w, const cm_wire_frame *f, char *err, size_t errlen) {
  cm_wire_hello hl;
  int rc = cm_wire_decode_hello(f, &hl);
  if (rc) {
    snprintf(err, errlen, "bad HELLO: %s", cm_wire_reader_errmsg(f->reader));
    cm_wire_hello_release(&hl);
    return rc;
  }
  cm__wsrc_free_hello(w);
  w->have_hello = 1;
  w->pid = hl.pid;
  w->ppid = hl.ppid;
  w->cupti_version = hl.cupti_version;
  w->host = xstrdup(hl.host);
  w->exe = xstrdup(hl.exe);
  w->argv = calloc(hl.argc + 1, sizeof *w->argv);
  w->dev_names = calloc(hl.ndevices + 1, sizeof *w->dev_names);
  w->dev_index = calloc(hl.ndevices + 1, sizeof *w->dev_index);
  w->env = calloc(hl.nenv + 1, sizeof *w->env);
  if (!w->argv || !w->dev_names || !w->dev_index || !w->env) {
    cm_wire_hello_release(&hl);
    snprintf(err, errlen, "out of memory");
    return CM_ENOMEM;
  }
  for (uint32_t i = 0; i < hl.argc; i++) w->argv[w->argc++] = xstrdup(hl.argv[i]);
  for (uint32_t i = 0; i < hl.ndevices; i++) {
    w->dev_names[i] = xstrdup(hl.devices[i].name);
    w->dev_index[i] = hl.devices[i].index;
    w->ndevices++;
  }
  for (uint32_t i = 0; i < hl.nenv; i++) w->env[w->nenv++] = xstrdup(hl.env[i]);
  cm_wire_hello_release(&hl);
  return 0;
}

/* The warnings below are once per process, but a peer (or a capture) can make many processes:
 * across them, a burst of LOG_BURST lines, then one a second; the rest are counted and reported
 * by cm__wsrc_log_summary. Loop thread only. */
enum { LOG_BURST = 20 };
static double log_tokens = LOG_BURST;
static uint64_t log_last_ms, log_suppressed;

static int log_ok(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
  if (log_last_ms) log_tokens += (double)(now - log_last_ms) / 1000.0;
  if (log_tokens > LOG_BURST) log_tokens = LOG_BURST;
  log_last_ms = now;
  if (log_tokens < 1) {
    log_suppressed++;
    return 0;
  }
  log_tokens -= 1;
  cm__wsrc_log_summary();
  return 1;
}

void cm__wsrc_log_summary(void) {
  if (!log_suppressed) return;
  fprintf(stderr, "cuptimon-lua: suppressed %llu warnings about processes' frames\n",
          (unsigned long long)log_suppressed);
  log_suppressed = 0;
}

/* Prints a cap's warning once per process. */
static void warn_once(cm__wsrc *w, int bit, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void warn_once(cm__wsrc *w, int bit, const char *fmt, ...) {
  if (w->warned & bit) return;
  w->warned |= bit;
  if (!log_ok()) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "cuptimon-lua: warning: %s pid %u: ", w->origin, w->pid);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static int on_schema(cm__wsrc *w, const cm_wire_frame *f, char *err, size_t errlen) {
  cm_wire_schema s;
  int rc = cm_wire_decode_schema(f, &s);
  if (rc) {
    snprintf(err, errlen, "bad SCHEMA: %s", cm_wire_reader_errmsg(f->reader));
    return rc;
  }
  uint32_t refused = 0;
  for (uint32_t i = 0; i < s.nkinds; i++) {
    const cm_wire_kind *src = &s.kinds[i];
    cm__wkind *dst = cm__wsrc_kind_find(w, src->kind);
    if (!dst) {
      if (w->nkinds >= CM__WSRC_MAX_KINDS) {
        refused++;
        continue;
      }
      dst = cm__wsrc_kind_add(w, src->kind);
      if (!dst) {
        cm_wire_schema_release(&s);
        snprintf(err, errlen, "out of memory for the SCHEMA frame at byte %llu", (unsigned long long)f->offset);
        return CM_ENOMEM;
      }
    } else {
      cm__wsrc_free_kind(dst);
    }
    dst->kind = src->kind;
    dst->name = xstrdup(src->name);
    dst->fields = calloc(src->nfields ? src->nfields : 1, sizeof *dst->fields);
    dst->start = -1;
    for (uint32_t j = 0; dst->fields && j < src->nfields; j++) {
      dst->fields[j] = src->fields[j];
      dst->fields[j].name = xstrdup(src->fields[j].name);
      dst->nfields++;
      if (src->fields[j].type == CM_TYPE_U64 &&
          (strcmp(src->fields[j].name, "start") == 0 ||
           (dst->start < 0 && strcmp(src->fields[j].name, "timestamp") == 0)))
        dst->start = (int)j;
    }
  }
  cm_wire_schema_release(&s);
  if (refused) {
    w->rejected += refused;
    warn_once(w, WARN_KINDS,
              "the SCHEMA frame at byte %llu names %u kinds over the cap of %d distinct kinds per "
              "process; they were refused, and their batches carry only the registry's field names",
              (unsigned long long)f->offset, refused, CM__WSRC_MAX_KINDS);
  }
  return 0;
}

static int on_strings(cm__wsrc *w, const cm_wire_frame *f, char *err, size_t errlen) {
  cm_wire_strings s;
  int rc = cm_wire_decode_strings(f, &s);
  if (rc) {
    snprintf(err, errlen, "bad STRINGS: %s", cm_wire_reader_errmsg(f->reader));
    return rc;
  }
  /* Each entry costs one slot and a copy of its bytes, whatever its id: the table grows with
   * the entries received (at least 9 bytes of frame each), never with the ids' values. */
  for (uint32_t i = 0; i < s.count; i++) {
    uint32_t id = s.entries[i].id;
    if (id == 0) continue; /* the empty string, never sent; nothing to store */
    char *b = malloc((size_t)s.entries[i].len + 1);
    cm__wstr *e = b ? cm__wsrc_str_find(w, id) : NULL;
    if (b && !e && (e = cm__wsrc_str_slot_new(w, id)) != NULL) {
      e->id = id;
      w->nstr++;
    }
    if (!e) {
      free(b);
      cm_wire_strings_release(&s);
      snprintf(err, errlen, "out of memory for the STRINGS frame at byte %llu (%u strings held)",
               (unsigned long long)f->offset, w->nstr);
      return CM_ENOMEM;
    }
    memcpy(b, s.entries[i].bytes, s.entries[i].len);
    b[s.entries[i].len] = 0;
    free(e->bytes);
    e->bytes = b;
    e->len = s.entries[i].len;
  }
  cm_wire_strings_release(&s);
  return 0;
}

/* Says, once per change, that the agent's lag guard had CUPTI stop writing some kinds
 * (docs/agent.md, "The lag guard"): the counts of those kinds cover the run up to then. */
static void note_guard(cm__wsrc *w) {
  uint64_t shed = cm__wsrc_stat(w, "guard_shed");
  uint64_t add = shed & ~w->guard_said;
  if (!add) return;
  w->guard_said |= shed;
  if (!log_ok()) return;
  char names[512];
  size_t len = 0;
  names[0] = 0;
  for (int k = 0; k < 64; k++) {
    if (!(add >> k & 1) || len >= sizeof names) continue;
    const char *nm = cm_kind_name(k);
    int n = snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", nm ? nm : "?");
    if (n > 0) len += (size_t)n;
  }
  fprintf(stderr,
          "cuptimon-lua: warning: %s pid %u: CUPTI fell %.1f s behind the application (the "
          "limits are records held %.1f s, CUPTIMON_GUARD_LAG_MS, and %llu activity buffers held, "
          "CUPTIMON_GUARD_BUFFERS): its agent stopped tracing %s for the rest of the "
          "run, so that CUPTI's backlog stops growing; the records of %s end there, and what was "
          "traced before is complete\n",
          w->origin, w->pid, (double)cm__wsrc_stat(w, "guard_lag_ns") / 1e9,
          (double)cm__wsrc_stat(w, "guard_limit_ns") / 1e9,
          (unsigned long long)cm__wsrc_stat(w, "guard_buffers_limit"), names,
          (add & (add - 1)) ? "these kinds" : "this kind");
}

static int on_stats(cm__wsrc *w, const cm_wire_frame *f, char *err, size_t errlen) {
  cm_wire_kvlist l;
  int rc = cm_wire_decode_kvlist(f, &l);
  if (rc) {
    snprintf(err, errlen, "bad STATS: %s", cm_wire_reader_errmsg(f->reader));
    return rc;
  }
  /* Running totals: a counter's latest value replaces the previous one. */
  uint32_t refused = 0;
  for (uint32_t i = 0; i < l.count; i++) {
    uint64_t h = cm__wsrc_hash_str(l.items[i].name);
    int64_t j = cm__wsrc_stat_find(w, l.items[i].name, h);
    if (j < 0) {
      if (w->nstats >= CM__WSRC_MAX_STATS) {
        refused++;
        continue;
      }
      j = cm__wsrc_stat_add(w, l.items[i].name, h);
      if (j < 0) {
        cm_wire_kvlist_release(&l);
        snprintf(err, errlen, "out of memory for the STATS frame at byte %llu", (unsigned long long)f->offset);
        return CM_ENOMEM;
      }
    }
    w->stats[j].value = l.items[i].value;
  }
  cm_wire_kvlist_release(&l);
  if (refused) {
    w->rejected += refused;
    warn_once(w, WARN_STATS,
              "the STATS frame at byte %llu has %u counter names over the cap of %d distinct "
              "names per process; they were refused", (unsigned long long)f->offset, refused,
              CM__WSRC_MAX_STATS);
  }
  note_stats(w);
  note_guard(w);
  return 0;
}

/* Notes a BATCH frame's number: a jump past last_number + 1 is frames that never arrived. 0 is
 * an unnumbered frame (a wire 1.0 writer), and numbers wrap past 2^32 - 1 to 1. */
static void note_number(cm__wsrc *w, uint32_t number) {
  if (number == 0) return;
  uint32_t last = w->last_number;
  if (number > last)
    w->gap_frames += number - last - 1;
  else
    w->gap_frames += (UINT32_MAX - last) + (number - 1);
  w->last_number = number;
}

/* The schema's name of a field of kind k (fields ascend by id), or NULL. */
static const char *field_name(const cm__wkind *k, int32_t field) {
  uint32_t lo = 0, hi = k ? k->nfields : 0;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if ((int64_t)k->fields[mid].id < (int64_t)field) lo = mid + 1;
    else hi = mid;
  }
  return lo < (k ? k->nfields : 0) && (int64_t)k->fields[lo].id == (int64_t)field ? k->fields[lo].name : NULL;
}

/* The lag of a live agent's batch: now less the newest start timestamp among its records, when
 * the batch carries its kind's start column. Timestamps off this run's realtime clock by more
 * than an hour (a test double's fixed dates) measure nothing and are ignored. */
static void note_lag(cm__wsrc *w, const cm_wire_batch *wb) {
  const cm__wkind *k = cm__wsrc_kind_find(w, (uint32_t)wb->batch.kind);
  if (!k || k->start < 0) return;
  int32_t field = (int32_t)k->fields[k->start].id;
  for (uint32_t i = 0; i < wb->batch.ncols; i++) {
    if (wb->cols[i].field != field || wb->cols[i].type != CM_TYPE_U64) continue;
    const uint64_t *v = wb->cols[i].data;
    uint64_t newest = 0;
    for (uint32_t r = 0; r < wb->batch.n; r++)
      if (v[r] > newest) newest = v[r];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    const uint64_t hour = 3600ull * 1000000000ull;
    if (!newest || newest > now + 1000000000ull || now - newest > hour) return;
    w->lag_ns = now > newest ? now - newest : 0;
    if (w->lag_ns > w->lag_peak_ns) w->lag_peak_ns = w->lag_ns;
    return;
  }
}

static int on_batch(cm__wsrc *w, const cm_wire_frame *f, char *err, size_t errlen) {
  static cm_wire_batch wb; /* large (128 columns); loop thread only, never re-entered */
  int rc = cm_wire_decode_batch(f, NULL, &wb);
  if (rc) {
    snprintf(err, errlen, "bad BATCH: %s", cm_wire_reader_errmsg(f->reader));
    return rc;
  }
  int kind = wb.batch.kind;
  note_number(w, wb.number);
  w->batches++;
  w->records += wb.batch.n;
  if (kind >= 0 && kind < CM_KIND_MAX) w->records_by_kind[kind] += wb.batch.n;
  if (w->ops->select) note_lag(w, &wb);
  if (!w->attached || wb.batch.n == 0) return 0;
  /* A column of a type this version does not know is skipped (docs/wire.md): no consumer could
   * read it. The others are named by the schema, else by the registry, else a placeholder, so
   * Lua never reads a NULL name. */
  const cm__wkind *wk = cm__wsrc_kind_find(w, (uint32_t)kind);
  uint32_t kept = 0;
  for (uint32_t i = 0; i < wb.batch.ncols; i++) {
    cm_column c = wb.cols[i];
    if (c.type < CM_TYPE_U8 || c.type > CM_TYPE_F64) {
      warn_once(w, WARN_TYPE,
                "the %s batch at byte %llu has a column (field %d) of unknown type %d; columns of "
                "unknown types are skipped", cm_kind_name(kind) ? cm_kind_name(kind) : "?",
                (unsigned long long)f->offset, c.field, c.type);
      continue;
    }
    c.name = field_name(wk, c.field);
    cm_field_info fi;
    if (!c.name) c.name = cm_field_info_get(kind, c.field, &fi) == 0 ? fi.name : "?";
    wb.cols[kept++] = c;
  }
  wb.batch.ncols = kept;
  cm_column cols[CM_WIRE_MAX_COLS];
  cm_batch b = wb.batch;
  b.cols = cols;
  b.seq = ++w->seq;
  /* An observer may close (deferred) while we deliver; iterate over a snapshot of the ids. */
  uint32_t ids_small[64];
  uint32_t *ids = w->nobs <= 64 ? ids_small : malloc((size_t)w->nobs * sizeof *ids);
  if (!ids) {
    snprintf(err, errlen, "out of memory delivering a batch");
    return CM_ENOMEM;
  }
  int nids = 0;
  for (int i = 0; i < w->nobs; i++) ids[nids++] = w->obs[i].id;
  for (int k = 0; k < nids; k++) {
    const cm_selection *sel = NULL;
    for (int i = 0; i < w->nobs; i++)
      if (w->obs[i].id == ids[k]) sel = w->obs[i].sel;
    if (!sel) continue;
    int want = cm_selection_count(sel, kind);
    if (want <= 0) continue;
    uint32_t nc = 0;
    for (uint32_t i = 0; i < wb.batch.ncols; i++)
      if (cm_selection_has(sel, kind, wb.cols[i].field)) cols[nc++] = wb.cols[i];
    if ((int)nc < want) {
      /* A trigger window's own observer sees the batches decoded before its widening: expected,
       * and no mistake of the script's. */
      if (!cm__host_observer_bound(w->base.host, ids[k]) && !w->warned_missing++ && log_ok())
        fprintf(stderr,
                "cuptimon-lua: warning: %s pid %u: a %s batch lacks %d of the fields an observer "
                "selected; such batches are skipped for that observer\n",
                w->origin, w->pid, cm_kind_name(kind) ? cm_kind_name(kind) : "?", want - (int)nc);
      continue;
    }
    b.ncols = nc;
    cm_host_deliver(w->base.host, &w->base, ids[k], &b);
  }
  if (ids != ids_small) free(ids);
  return 0;
}

static int on_bye(cm__wsrc *w, const cm_wire_frame *f, char *err, size_t errlen) {
  cm_wire_bye bye;
  int rc = cm_wire_decode_bye(f, &bye);
  if (rc) {
    snprintf(err, errlen, "bad BYE: %s", cm_wire_reader_errmsg(f->reader));
    return rc;
  }
  w->end = CM__END_BYE;
  w->exit_code = bye.exit_code;
  w->bye_reason = bye.reason;
  free(w->end_message);
  w->end_message = xstrdup(bye.message);
  return 0;
}

/* A failed PM entry is an error of the run: counted (the exit status), and printed or handed to
 * the script's error hooks, with the agent's message that says what to do. */
static int on_pm_status(cm__wsrc *w, const cm_wire_frame *f, char *err, size_t errlen) {
  int32_t status = 0;
  uint32_t device = 0;
  const char *msg = "";
  int rc = cm_wire_decode_pm_status(f, &status, &device, &msg);
  if (rc) {
    snprintf(err, errlen, "bad PM_STATUS: %s", cm_wire_reader_errmsg(f->reader));
    return rc;
  }
  /* Only answers to requests sent count: a flood of unsolicited ones is one warning. */
  if (w->pm_expect == 0) {
    w->pm_unsolicited++;
    warn_once(w, WARN_PM, "PM_STATUS frames with no PM request outstanding are ignored");
    return 0;
  }
  w->pm_expect--;
  if (status == 0 || !w->attached || !w->base.host) return 0;
  char text[4400], clean[4096];
  msg = cm__text_tmp(msg, clean, sizeof clean); /* the agent's bytes, for a terminal */
  if (device == UINT32_MAX)
    snprintf(text, sizeof text, "process %u refused the PM request: %s: %.4000s", w->pid,
             cm_err_name(status), msg);
  else
    snprintf(text, sizeof text, "PM sampling in process %u, device %u: %s: %.4000s", w->pid,
             device, cm_err_name(status), msg);
  cm__host_error(w->base.host, "pm_sample", text);
  return 0;
}

int cm__wsrc_frame(cm__wsrc *w, const cm_wire_frame *f, char *err, size_t errlen) {
  w->frames++;
  w->bytes += CM_WIRE_FRAME_HEADER_SIZE + f->len;
  switch (f->type) {
  case CM_WIRE_HELLO: return on_hello(w, f, err, errlen);
  case CM_WIRE_SCHEMA: return on_schema(w, f, err, errlen);
  case CM_WIRE_STRINGS: return on_strings(w, f, err, errlen);
  case CM_WIRE_BATCH: return on_batch(w, f, err, errlen);
  case CM_WIRE_STATS: return on_stats(w, f, err, errlen);
  case CM_WIRE_BYE: return on_bye(w, f, err, errlen);
  case CM_WIRE_PM_STATUS: return on_pm_status(w, f, err, errlen);
  default: return 0; /* FLUSH_DONE is the owner's; control frames do not come this way */
  }
}

uint64_t cm__wsrc_batch_key(cm__wsrc *w, const cm_wire_frame *f) {
  static cm_wire_batch wb;
  if (cm_wire_decode_batch(f, NULL, &wb) != 0) return 0; /* delivered at once; fails there */
  const cm__wkind *k = cm__wsrc_kind_find(w, (uint32_t)wb.batch.kind);
  if (!k || k->start < 0) return UINT64_MAX;
  int32_t field = (int32_t)k->fields[k->start].id;
  for (uint32_t i = 0; i < wb.batch.ncols; i++) {
    if (wb.cols[i].field != field || wb.cols[i].type != CM_TYPE_U64) continue;
    const uint64_t *v = wb.cols[i].data;
    uint64_t m = UINT64_MAX;
    for (uint32_t r = 0; r < wb.batch.n; r++)
      if (v[r] && v[r] < m) m = v[r];
    return m;
  }
  return UINT64_MAX;
}

/* A STATS frame arrived: when it carries records_queued (an agent of wire 1.1), every BATCH the
 * agent queued ahead of it should have arrived by now; remember what had, to compare. */
static void note_stats(cm__wsrc *w) {
  int has = 0;
  for (uint32_t i = 0; i < w->nstats && !has; i++)
    has = strcmp(w->stats[i].name, "records_queued") == 0;
  if (!has) return;
  w->have_queued = 1;
  w->recv_at_stats = w->records;
  w->batches_at_stats = w->batches;
  w->gaps_at_stats = w->gap_frames;
}
