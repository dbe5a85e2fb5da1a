/*
 * inproc.c: the in-process engine as a source of the host: the cuptimon engine of this very
 * process (cuptimon-lua script.lua with no command, or a program embedding the host).
 *
 * Design note. The engine runs with deliver_ms = 0 and batch_records = 0, so its decode worker
 * never delivers: batches are delivered only inside cm_flush, cm_observe and cm_unobserve, which
 * this source calls on the loop thread, and a uv timer on the loop drives the delivery cadence
 * (a plain flush every deliver_ms). Each host observer is one engine observer whose callback
 * hands the batch to cm_host_deliver; the engine's columns are used in place.
 *
 * Ownership: the source owns its engine and its observer records; the host owns the source from
 * cm_host_add_source until it calls free. Loop thread only. This file does not include lua.h:
 * it describes its process through cm_process_info and reports errors through the host.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "cuptimon.h"
#include "cuptimon_host.h"
#include "cuptimon_wire.h"
#include "apicb.h"
#include "host_source.h"
#include "inproc.h"

typedef struct inproc inproc;

typedef struct inproc_obs {
  inproc *src;
  uint32_t obs;    /* host observer id */
  uint32_t engine; /* engine observer id */
} inproc_obs;

/* The most command-line arguments the process table shows (the rest are left out). */
#define INPROC_MAX_ARGS 512

struct inproc {
  cm_source base;
  cm_engine *e;
  uv_timer_t timer; /* the delivery cadence: cm_flush(PLAIN) on the loop thread */
  inproc_obs **obs;
  int nobs, cap;
  uint32_t deliver_ms;
  cm__apicb *apicb; /* subscriber callbacks for the script, created on first use */
  /* The process table's strings, rebuilt by each describe. */
  char exe[4096];
  char cmdline[8192];
  const char *argv[INPROC_MAX_ARGS];
  uint32_t argc;
  /* The engine's PM sampling consumers of the current request (vt->pm). */
  uint32_t pm_ids[CM_WIRE_PM_ENTRIES];
  uint32_t npm;
};

static void inproc_cb(void *ud, const cm_batch *b) {
  inproc_obs *o = ud;
  cm_host_deliver(o->src->base.host, &o->src->base, o->obs, b);
}

static int inproc_observe(cm_source *s, uint32_t obs, const cm_selection *sel, const char *spec) {
  inproc *p = (inproc *)s;
  if (p->nobs == p->cap) {
    int cap = p->cap ? p->cap * 2 : 8;
    inproc_obs **n = realloc(p->obs, (size_t)cap * sizeof *n);
    if (!n) return CM_ENOMEM;
    p->obs = n;
    p->cap = cap;
  }
  inproc_obs *o = calloc(1, sizeof *o);
  if (!o) return CM_ENOMEM;
  o->src = p;
  o->obs = obs;
  int rc = cm_observe(p->e, sel, inproc_cb, o, &o->engine);
  if (rc) {
    free(o);
    return rc;
  }
  p->obs[p->nobs++] = o;
  return 0;
}

static int inproc_unobserve(cm_source *s, uint32_t obs) {
  inproc *p = (inproc *)s;
  for (int i = 0; i < p->nobs; i++) {
    if (p->obs[i]->obs != obs) continue;
    inproc_obs *o = p->obs[i];
    int rc = cm_unobserve(p->e, o->engine); /* delivers o's last records, so remove after */
    memmove(&p->obs[i], &p->obs[i + 1], (size_t)(p->nobs - i - 1) * sizeof p->obs[0]);
    p->nobs--;
    free(o);
    return rc;
  }
  return CM_ENOENT;
}

static int inproc_flush(cm_source *s, int mode, uint32_t timeout_ms, cm_source_done_fn done,
                        void *ud) {
  inproc *p = (inproc *)s;
  int rc = p->nobs ? cm_flush(p->e, mode, timeout_ms) : 0;
  if (done) done(ud, rc);
  return rc;
}

static void inproc_tick(uv_timer_t *t) {
  inproc *p = t->data;
  cm_host *h = p->base.host;
  /* Inside a callback, a nested uv_run may tick: the next tick flushes instead. */
  if (cm__host_in_dispatch(h) || !p->nobs) return;
  int rc = cm_flush(p->e, CM_FLUSH_PLAIN, 0);
  if (rc && rc != CM_ETIMEDOUT) {
    char msg[512];
    snprintf(msg, sizeof msg, "cadenced flush failed: %s", cm_errmsg());
    cm__host_error(h, "flush", msg);
  }
}

static int inproc_configure(cm_source *s, uint32_t flush_ms, uint32_t deliver_ms) {
  inproc *p = (inproc *)s;
  if (flush_ms) {
    cm_config cfg;
    cm_config_init(&cfg);
    cfg.self_flush_ms = flush_ms;
    cfg.deliver_ms = 0;
    cfg.batch_records = 0;
    int rc = cm_configure(p->e, &cfg);
    if (rc) return rc;
  }
  if (deliver_ms) {
    p->deliver_ms = deliver_ms;
    uv_timer_start(&p->timer, inproc_tick, deliver_ms, deliver_ms);
  }
  return 0;
}

static int inproc_stats(cm_source *s, cm_stats *out) { return cm_stats_get(((inproc *)s)->e, out); }

static const char *inproc_string(cm_source *s, uint32_t id, size_t *len) {
  return cm_string(((inproc *)s)->e, id, len);
}

/* The in-process source's process is this one: its parent, executable and command line come
 * from /proc, so a script sees the same process table as for an agent. */
static void inproc_describe(cm_source *s, cm_process_info *out, int exiting) {
  inproc *p = (inproc *)s;
  out->has_ppid = 1;
  out->ppid = (uint32_t)getppid();
  ssize_t n = readlink("/proc/self/exe", p->exe, sizeof p->exe - 1);
  p->exe[n > 0 ? n : 0] = 0;
  out->exe = p->exe;
  /* The command line: NUL-separated in /proc, split in place (up to INPROC_MAX_ARGS). */
  p->argc = 0;
  FILE *fp = fopen("/proc/self/cmdline", "rb");
  if (fp) {
    size_t len = fread(p->cmdline, 1, sizeof p->cmdline - 1, fp);
    fclose(fp);
    p->cmdline[len] = 0;
    for (size_t at = 0; at < len && p->argc < INPROC_MAX_ARGS; at += strlen(p->cmdline + at) + 1)
      p->argv[p->argc++] = p->cmdline + at;
  }
  out->argv = p->argv;
  out->argc = p->argc;
  if (exiting) {
    cm_stats st;
    if (cm_stats_get(p->e, &st) == 0) {
      out->has_dropped = 1;
      out->dropped = st.records_dropped;
    }
    out->status = "detached";
  }
}

static void inproc_closed(uv_handle_t *hd) { free(hd->data); }

static void inproc_free(cm_source *s) {
  inproc *p = (inproc *)s;
  while (p->nobs) inproc_unobserve(s, p->obs[p->nobs - 1]->obs);
  cm__apicb_free(p->apicb); /* before the engine: it unregisters its handlers */
  cm_engine_free(p->e);
  free(p->obs);
  uv_close((uv_handle_t *)&p->timer, inproc_closed);
}

static void apicb_ready(void *ud) {
  inproc *p = ud;
  cm__host_api_ready(p->base.host);
}

/* Replaces the engine's PM consumers with the request's entries. The old ones go first, so a
 * device whose metrics change restarts once. The first failure is returned; the entries that
 * succeeded keep sampling. */
static int inproc_pm(cm_source *s, const char *spec, char *err, size_t errlen) {
  inproc *p = (inproc *)s;
  size_t len = strlen(spec);
  cm_wire_pm_entry *en = malloc(CM_WIRE_PM_ENTRIES * sizeof *en);
  char *buf = malloc(len + 1);
  int n = CM_ENOMEM, first = 0;
  snprintf(err, errlen, "no memory for the PM request");
  if (en && buf)
    n = cm_wire_parse_pm(spec, len, buf, len + 1, en, CM_WIRE_PM_ENTRIES, err, errlen);
  if (n >= 0) {
    for (uint32_t i = 0; i < p->npm; i++) cm_pm_sample_remove(p->e, p->pm_ids[i]);
    p->npm = 0;
    for (int i = 0; i < n; i++) {
      uint32_t id = 0;
      int rc = cm_pm_sample_add(p->e, en[i].device, en[i].metrics, en[i].nmetrics,
                                en[i].interval_us, &id);
      if (rc == 0) {
        p->pm_ids[p->npm++] = id;
      } else if (!first) {
        first = rc;
        snprintf(err, errlen, "%s", cm_errmsg());
      }
    }
  }
  free(en);
  free(buf);
  return n < 0 ? n : first;
}

static const cm_source_vtable inproc_vt;

cm__apicb *cm__inproc_apicb(cm_source *s) {
  if (!s || s->vt != &inproc_vt) return NULL;
  inproc *p = (inproc *)s;
  if (!p->apicb && cm__apicb_new(&p->apicb, p->e, cm_host_loop(p->base.host), 0, apicb_ready, p))
    p->apicb = NULL;
  return p->apicb;
}

static const cm_source_vtable inproc_vt = {
    .name = "inproc",
    .observe = inproc_observe,
    .unobserve = inproc_unobserve,
    .flush = inproc_flush,
    .configure = inproc_configure,
    .stats = inproc_stats,
    .string = inproc_string,
    .free = inproc_free,
    .describe = inproc_describe,
    .pm = inproc_pm,
};

static void engine_log(void *ud, int level, const char *msg) {
  static const char *names[] = {"error", "warning", "info", "debug"};
  int max = CM_LOG_WARN;
  const char *env = getenv("CUPTIMON_LOG");
  if (env && *env) max = atoi(env);
  if (level <= max) fprintf(stderr, "cuptimon: %s: %s\n", names[level & 3], msg);
}

int cm_host_inproc_source_new(cm_host *h, cm_source **out) {
  if (!h || !out) return CM_EINVAL;
  *out = NULL;
  inproc *p = calloc(1, sizeof *p);
  if (!p) return CM_ENOMEM;
  cm_config cfg;
  cm_config_init(&cfg);
  cfg.deliver_ms = 0;    /* never on the worker: deliveries must run on the loop thread */
  cfg.batch_records = 0;
  uint32_t flush_ms, deliver_ms;
  cm__host_cadence(h, &flush_ms, &deliver_ms);
  if (flush_ms) cfg.self_flush_ms = flush_ms;
  int rc = cm_engine_new(&p->e, &cfg);
  if (rc) {
    fprintf(stderr, "cuptimon: cannot create the in-process engine: %s: %s\n", cm_err_name(rc),
            cm_errmsg());
    free(p);
    return rc;
  }
  cm_set_log(p->e, engine_log, NULL);
  p->base.vt = &inproc_vt;
  p->base.pid = (int)getpid();
  uv_timer_init(cm_host_loop(h), &p->timer);
  p->timer.data = p;
  uv_unref((uv_handle_t *)&p->timer); /* the cadence alone does not keep the script running */
  p->deliver_ms = deliver_ms ? deliver_ms : 1000;
  uv_timer_start(&p->timer, inproc_tick, p->deliver_ms, p->deliver_ms);
  *out = &p->base;
  return 0;
}
