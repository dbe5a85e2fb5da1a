/*
 * wsrc.h: the wire source: one process seen through wire frames, a live agent connection (conn.c)
 * or one process of a capture (replay.c), as a source of the host. Implemented in wsrc.c (the
 * source and its tables) and wsrc_frame.c (what each frame means).
 *
 * Design note. A wire source owns that process's string table (STRINGS), its schema (SCHEMA),
 * its HELLO and its latest STATS, and turns each BATCH frame into one cm_batch per interested
 * observer whose columns point into the frame (zero copy). The hub and the replay only move
 * frames; everything about what a frame means is in the wire source, so a script sees the same
 * batches and the same process tables live and on a replay.
 *
 * Threads: loop thread only. Ownership: the owner (an agent connection, a replay stream) holds
 * the struct, and releases it (cm__wsrc_release) once the host has detached the source.
 */
#ifndef CM_WSRC_H
#define CM_WSRC_H

#include <stddef.h>
#include <stdint.h>

#include "cuptimon.h"
#include "cuptimon_host.h"
#include "cuptimon_wire.h"

typedef struct cm__wsrc cm__wsrc;

/* How a process ended, for the process_exit event. */
/* CM__END_DETACHED: --attach ended the window and the process goes on (its counts are final). */
enum { CM__END_NONE = 0, CM__END_BYE, CM__END_EOF, CM__END_ERROR, CM__END_TIMEOUT, CM__END_DETACHED };

/* Callbacks of the owner (an agent connection or a replay stream). */
typedef struct cm__wsrc_ops {
  /* The host's request to flush; live agents send FLUSH. May be NULL (done at once). */
  int (*flush)(cm__wsrc *w, int mode, uint32_t timeout_ms, cm_source_done_fn done, void *ud);
  /* The union selection changed (text form); live agents send SELECT. May be NULL. */
  void (*select)(cm__wsrc *w, const char *spec);
  void (*configure)(cm__wsrc *w, uint32_t flush_ms, uint32_t deliver_ms);
  /* The PM request changed (the PM frame's text); live agents send PM. May be NULL. */
  void (*pm)(cm__wsrc *w, const char *spec);
  /* The host detached the source (shutdown, or our own cm_host_remove_source): release the
   * owner's side. The wsrc itself is released by the owner afterwards (cm__wsrc_release). */
  void (*detached)(cm__wsrc *w);
} cm__wsrc_ops;

struct cm__wsrc {
  cm_source base;       /* first: the host sees a cm_source */
  const cm__wsrc_ops *ops;
  void *owner;
  const char *origin;   /* "agent" or "replay" */
  int attached;         /* between cm_host_add_source and the detach */

  /* HELLO: the process. */
  int have_hello;
  uint32_t pid, ppid;
  char *host, *exe;
  char **argv;
  uint32_t argc;
  char **dev_names;
  uint32_t *dev_index;
  uint32_t ndevices;
  char **env;           /* "NAME=VALUE" strings from HELLO */
  uint32_t nenv;
  uint32_t cupti_version;

  /* Peer-chosen keys (kind ids, string ids, counter names) are looked up in hash tables with a
   * per-source seed, so lookups stay O(1) whatever keys a peer picks, and every table is
   * bounded by what was received (the caps are in wsrc.c and docs/monitor.md). */
  uint64_t seed;

  /* SCHEMA, merged per kind (the latest wins), at most CM__WSRC_MAX_KINDS kinds. */
  struct cm__wkind *kinds;
  uint32_t nkinds, cap_kinds;
  uint32_t *kind_index;  /* hash table: 1 + index into kinds, 0 for an empty slot */
  uint32_t kind_bits;

  /* STRINGS: id -> bytes, a hash table sized by the entries received, never by the ids. */
  struct cm__wstr *str;
  uint32_t str_bits, nstr;

  /* STATS: the latest counters (at most CM__WSRC_MAX_STATS names), and the end. */
  cm_wire_kv *stats;
  uint32_t nstats, cap_stats;
  uint32_t *stat_index;  /* hash table: 1 + index into stats, 0 for an empty slot */
  uint32_t stat_bits;
  uint64_t rejected;     /* kinds and counter names refused at the caps */
  int warned;            /* one-time warnings printed (bits, wsrc.c) */
  uint64_t guard_said;   /* the kinds the agent's lag guard shed that were reported (note_guard) */
  int end;              /* CM__END_* */
  int32_t exit_code;
  int exit_known;       /* exit_code is the status the monitor reaped (it spawned the process) */
  uint32_t bye_reason;
  char *end_message;

  /* Observers (host ids and selections, which the host owns until unobserve). */
  struct cm__wobs *obs;
  int nobs, cap_obs;
  char *union_spec;     /* the last union sent (or computed) */
  char *pm_spec;        /* the PM request the host asked for, NULL for none */
  const cm_selection *extra; /* the hub's --select, may be NULL */
  uint64_t shed;        /* kinds (1 << kind value) left out of the union: a budget shed them */

  /* Counters of what reached us. */
  uint64_t frames, batches, records, bytes;
  uint64_t records_by_kind[CM_KIND_MAX];
  /* A live agent's lag as the monitor sees it: CLOCK_REALTIME at a BATCH's arrival less the
   * newest start of its records, for the last batch that had a start column, and the peak. */
  uint64_t lag_ns, lag_peak_ns;
  uint64_t seq;
  int warned_missing;

  /* The arrays of the last describe (the process table's devices and stats). */
  cm_process_device *desc_devices;
  cm_process_counter *desc_stats;
  /* Loss accounting (docs/monitor.md, "Loss"): the BATCH frame numbers seen, and what had been
   * received when the latest STATS with records_queued arrived (the agent's count of the BATCH
   * records ahead of that STATS on the connection). */
  uint32_t last_number;    /* the last BATCH number received, 0 before any */
  uint64_t gap_frames;     /* numbers skipped so far: frames that never arrived */
  int have_queued;         /* a STATS carried records_queued */
  uint64_t recv_at_stats, batches_at_stats, gaps_at_stats;
  uint32_t pm_expect;      /* PM_STATUS answers still due for the PM requests sent */
  uint64_t pm_unsolicited; /* PM_STATUS frames with none due: ignored */
  uint64_t skipped_bytes;  /* bytes of a capture skipped as corrupt while this process was read:
                            * frames of it may be in them, so its counts are a lower bound */
};

/* Caps on what one process's frames may make the monitor keep (docs/monitor.md). Beyond them,
 * the excess is refused with one warning per process; the stream goes on. */
enum { CM__WSRC_MAX_KINDS = 1024, CM__WSRC_MAX_STATS = 1024 };

/* Initializes `w` (zeroed by the caller) for an owner. */
void cm__wsrc_init(cm__wsrc *w, const cm__wsrc_ops *ops, void *owner, const char *origin);
/* Handles one verified frame from the process. Returns 0, or a negative code with a message in
 * `err` (a corrupt payload: the caller closes the stream). A HELLO is only recorded; the owner
 * decides when to attach. A BATCH is delivered to the observers when the source is attached. */
int cm__wsrc_frame(cm__wsrc *w, const cm_wire_frame *f, char *err, size_t errlen);
/* Attaches to the host (process_start runs) / detaches (process_exit runs). */
int cm__wsrc_attach(cm__wsrc *w, cm_host *h);
void cm__wsrc_detach(cm__wsrc *w);
/* The union of the observers' selections (and the extra), in cm_selection_parse's text form;
 * the caller frees it. "" when nothing is selected. */
char *cm__wsrc_union(cm__wsrc *w);
/* Appends what a capture that starts now needs to read the frames that follow: one SCHEMA of
 * every kind known so far and one STRINGS of the whole string table. Returns 0 or a CM_E* code. */
int cm__wsrc_write_state(const cm__wsrc *w, cm_wire_buf *b);
/* Sets the kinds left out of the union whatever the observers select (a record-rate budget
 * shedding them) and sends the new union when it changed. */
void cm__wsrc_set_shed(cm__wsrc *w, uint64_t kinds);
/* The smallest value of the kind's "start" (or "timestamp") column of a batch frame, for the
 * replay's merge; UINT64_MAX when the batch has none. */
uint64_t cm__wsrc_batch_key(cm__wsrc *w, const cm_wire_frame *f);
/* The latest value of a STATS counter, or 0. */
uint64_t cm__wsrc_stat(const cm__wsrc *w, const char *name);
/* Prints how many warnings about processes' frames the rate limit suppressed since the last
 * line, if any. Loop thread. */
void cm__wsrc_log_summary(void);
/* What the process lost so far, from its STATS and the BATCH numbers received. */
void cm__wsrc_loss(const cm__wsrc *w, cm_loss *out);
/* Frees what the wsrc holds (not the struct). */
void cm__wsrc_release(cm__wsrc *w);

#endif /* CM_WSRC_H */
