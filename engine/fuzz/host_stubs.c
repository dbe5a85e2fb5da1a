/*
 * host_stubs.c: the stand-in host of host_stubs.h (test code only; see there for the design).
 */
#include "host_stubs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


stub_obs stub_obs_tab[STUB_MAX_OBS];
int stub_nobs;

static int host_token;
cm_host *stub_host = (cm_host *)&host_token;

/* The sources attached and not yet removed. */
enum { MAX_SOURCES = 4096 };
static cm_source *sources[MAX_SOURCES];
static int nsources, next_id;

static volatile unsigned sink;

static void fail(const char *what) {
  fprintf(stderr, "host_stubs: contract broken: %s\n", what);
  abort();
}

/* The source's failures reach the host's reporting path; the stub reads the message and counts. */
uint64_t stub_errors;
void cm__host_error(cm_host *h, const char *where, const char *msg) {
  if (h != stub_host || !where || !msg) fail("cm__host_error without a host, place or message");
  sink += (unsigned)strlen(msg);
  stub_errors++;
}

/* The stub's observers are never bound to one source (no trigger windows here). */
int cm__host_observer_bound(const cm_host *h, uint32_t id) {
  if (h != stub_host) fail("cm__host_observer_bound without the host");
  (void)id;
  return 0;
}

int stub_host_observe(const char *spec) {
  if (stub_nobs == STUB_MAX_OBS) return -1;
  stub_obs *o = &stub_obs_tab[stub_nobs];
  memset(o, 0, sizeof *o);
  if (cm_selection_new(&o->sel)) return -1;
  if (cm_selection_parse(o->sel, spec)) {
    cm_selection_free(o->sel);
    o->sel = NULL;
    return -1;
  }
  o->id = (uint32_t)stub_nobs + 1;
  return stub_nobs++;
}

void stub_host_reset(void) {
  while (nsources > 0) cm_host_remove_source(stub_host, sources[nsources - 1]);
  for (int i = 0; i < stub_nobs; i++) cm_selection_free(stub_obs_tab[i].sel);
  memset(stub_obs_tab, 0, sizeof stub_obs_tab);
  stub_nobs = 0;
}

int cm_host_add_source(cm_host *h, cm_source *s) {
  if (h != stub_host || !s || !s->vt) fail("add_source arguments");
  if (nsources == MAX_SOURCES) return CM_EBUSY;
  s->host = h;
  s->id = ++next_id;
  sources[nsources++] = s;
  for (int i = 0; i < stub_nobs; i++)
    if (s->vt->observe && s->vt->observe(s, stub_obs_tab[i].id, stub_obs_tab[i].sel, "") != 0)
      fail("observe failed");
  return s->id;
}

void cm_host_remove_source(cm_host *h, cm_source *s) {
  if (h != stub_host) fail("remove_source host");
  int at = -1;
  for (int i = 0; i < nsources; i++)
    if (sources[i] == s) at = i;
  if (at < 0) fail("remove_source of a source not attached");
  sources[at] = sources[--nsources];
  /* The real host builds the process_exit table here, from describe and loss. */
  if (s->vt->describe) {
    cm_process_info info;
    memset(&info, 0, sizeof info);
    s->vt->describe(s, &info, 1);
  }
  if (s->vt->loss) {
    cm_loss l;
    s->vt->loss(s, &l);
  }
  cm_stats st;
  if (s->vt->stats) s->vt->stats(s, &st);
  for (int i = 0; i < stub_nobs; i++)
    if (s->vt->unobserve) s->vt->unobserve(s, stub_obs_tab[i].id);
  s->vt->free(s);
}

void cm_host_deliver(cm_host *h, cm_source *s, uint32_t obs, const cm_batch *b) {
  if (h != stub_host || !b || obs == 0 || obs > (uint32_t)stub_nobs) fail("deliver arguments");
  stub_obs *o = &stub_obs_tab[obs - 1];
  if ((int)b->ncols != cm_selection_count(o->sel, b->kind)) fail("a selected field is missing or one too many");
  for (uint32_t i = 0; i < b->ncols; i++) {
    const cm_column *c = &b->cols[i];
    if (c->type < CM_TYPE_U8 || c->type > CM_TYPE_F64) fail("a column of unknown type");
    if (!cm_selection_has(o->sel, b->kind, c->field)) fail("a column the observer did not select");
    if (!c->name) fail("a column without a name");
    sink += (unsigned)strlen(c->name);
    const uint8_t *p = c->data;
    for (uint64_t j = 0; j < (uint64_t)b->n * c->width; j++) sink += p[j];
    if (c->type != CM_TYPE_STR) continue;
    for (uint32_t r = 0; r < b->n; r++) {
      uint32_t id;
      memcpy(&id, p + (size_t)r * 4, 4);
      size_t len = 0;
      const char *str = s->vt->string(s, id, &len);
      if (!str) continue;
      for (size_t k = 0; k < len; k++) sink += (uint8_t)str[k];
      if (str[len] != 0) fail("a string without its terminator");
    }
  }
  o->batches++;
  o->records += b->n;
  o->columns += b->ncols;
}

int cm_host_exit_requested(cm_host *h, int *status) {
  (void)h;
  if (status) *status = 0;
  return 0;
}
