/*
 * record.h: `cuptimon-lua --record FILE`: one capture file per traced process, written from the
 * frames the hub receives. Used by hub.c; implemented in record.c.
 *
 * Design note. The hub calls cm__record_open when a process has completed its handshake, hands
 * it every verified frame the process sends (cm__record_frame), and cm__record_close when its
 * connection ends; record.c names and creates the files, writes them, and keeps one summary per
 * capture, printed by cm__record_free at the end of the run.
 *
 * Threads: loop thread only. Ownership: the recorder owns its captures and summaries.
 */
#ifndef CM_RECORD_H
#define CM_RECORD_H

#include <stdint.h>

#include "cuptimon_wire.h"

typedef struct cm__record cm__record;
typedef struct cm__capture cm__capture;

/* Creates the recorder for the path template `tmpl`. Returns 0, or a CM_E* code after printing
 * why the captures could not be created. */
int cm__record_new(cm__record **out, const char *tmpl, int force);
/* Creates the capture of process `pid` and writes the file header and `hello` (whose token is
 * left out). Returns NULL after printing why (the process is then traced but not recorded). */
cm__capture *cm__record_open(cm__record *r, uint32_t pid, const cm_wire_hello *hello);
/* Appends one verified frame as received (FLUSH_DONE frames are not recorded). */
void cm__record_frame(cm__capture *c, const cm_wire_frame *f);
/* Closes a capture and keeps its summary line. */
void cm__record_close(cm__record *r, cm__capture *c, uint64_t batches, uint64_t records,
                      uint64_t dropped);
/* Prints the summaries and frees the recorder. NULL is fine. */
void cm__record_free(cm__record *r);

#endif /* CM_RECORD_H */
