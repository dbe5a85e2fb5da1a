/*
 * wsrc_internal.h: what the wire source's own files share: its tables (wsrc.c) and the handlers
 * of its frames (wsrc_frame.c). Nobody else includes it; the owners of a source use wsrc.h.
 *
 * Design note. The tables are keyed by values a peer chooses (kind ids, string ids, counter
 * names), under a hash seeded per source (wsrc.c). Loop thread only.
 */
#ifndef CM_WSRC_INTERNAL_H
#define CM_WSRC_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wsrc.h"

typedef struct cm__wkind {
  uint32_t kind;
  char *name;
  uint32_t nfields;
  cm_wire_field *fields; /* names owned */
  int start;             /* index of the "start" (or "timestamp") field, or -1 */
} cm__wkind;

typedef struct cm__wobs {
  uint32_t id;
  const cm_selection *sel;
  int retired; /* out of the union, still delivered to (ws_retire) */
} cm__wobs;

/* One slot of the string table. */
typedef struct cm__wstr {
  uint32_t id;  /* 0 for an empty slot: id 0 is the empty string and never stored */
  uint32_t len;
  char *bytes;  /* NUL-terminated after len bytes */
} cm__wstr;

static inline char *xstrdup(const char *s) { return strdup(s ? s : ""); }

/* The FNV-1a hash of a counter name, the key of the counters' table. */
uint64_t cm__wsrc_hash_str(const char *s);
/* The kind's schema, or NULL. */
cm__wkind *cm__wsrc_kind_find(const cm__wsrc *w, uint32_t kind);
/* Adds a zeroed kind at the end; NULL when out of memory. The caller checks the cap. */
cm__wkind *cm__wsrc_kind_add(cm__wsrc *w, uint32_t kind);
/* The index of counter `name` (whose hash is h) in w->stats, or -1. */
int64_t cm__wsrc_stat_find(const cm__wsrc *w, const char *name, uint64_t h);
/* Adds counter `name`; returns its index or -1 when out of memory. The caller checks the cap. */
int64_t cm__wsrc_stat_add(cm__wsrc *w, const char *name, uint64_t h);
/* The string of id `id` (not 0), or NULL. */
cm__wstr *cm__wsrc_str_find(const cm__wsrc *w, uint32_t id);
/* The slot for a new id (id != 0, not present), growing the table to stay at most half full;
 * NULL when out of memory or at the size limit. */
cm__wstr *cm__wsrc_str_slot_new(cm__wsrc *w, uint32_t id);
/* Frees the HELLO's copies / a kind's schema (the kind is left zeroed). */
void cm__wsrc_free_hello(cm__wsrc *w);
void cm__wsrc_free_kind(cm__wkind *k);

#endif /* CM_WSRC_INTERNAL_H */
