/*
 * record.h: `cuptimon-lua --record FILE`: one capture file per traced process, written from the
 * frames the hub receives. Used by the hub (hub.c, conn.c) and the trigger windows (window.c);
 * implemented in record.c.
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

/* cm__record_new's flags. */
enum {
  CM__RECORD_FORCE = 1,    /* replace existing regular files */
  CM__RECORD_EACH_PID = 2, /* without "%p" too, every file gets its pid (a trigger window's: a
                            * window per process, each its own recorder) */
};

/* Creates the recorder for the path template `tmpl`: "%p" becomes each process's pid; without
 * "%p" the first process writes `tmpl` itself and each further one gets its pid inserted before
 * the extension ("run.cmcap", then "run.<pid>.cmcap", saying so once), so two processes never
 * share a file. Checks now, before the command runs, that files can be created where the
 * template says, that it does not name a FIFO, a device, a socket, a directory or a symlink, and
 * (without "%p" and `force`) that `tmpl` does not exist. Returns 0, or a CM_E* code after
 * printing why. `flags`: CM__RECORD_FORCE, CM__RECORD_EACH_PID. */
int cm__record_new(cm__record **out, const char *tmpl, int flags);
/* Creates the capture of process `pid` (the kernel's) and writes the file header and `hello`
 * (whose token is left out). The file is created new (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600):
 * an existing file is refused unless `force` was given and it is a regular file, which is then
 * replaced. Returns NULL after printing why (the process is then traced but not recorded, and
 * the run counts a failure). */
cm__capture *cm__record_open(cm__record *r, uint32_t pid, const cm_wire_hello *hello);
/* Appends one verified frame as received (FLUSH_DONE frames are not recorded). */
void cm__record_frame(cm__capture *c, const cm_wire_frame *f);
/* Appends `frames` whole frames the monitor encoded itself (a trigger window's). */
void cm__record_bytes(cm__capture *c, const cm_wire_buf *b, uint64_t frames);
/* The capture's file name. */
const char *cm__record_path(const cm__capture *c);
/* Closes a capture and keeps its summary line: `dropped` records lost wherever they were lost;
 * `incomplete` when the process's final counts never arrived (more may be lost). */
void cm__record_close(cm__record *r, cm__capture *c, uint64_t batches, uint64_t records,
                      uint64_t dropped, int incomplete);
/* How many captures could not be created or written. */
int cm__record_failures(const cm__record *r);
/* Prints the summaries (and, when `no_process`, that no CUDA process connected so nothing was
 * recorded) and frees the recorder. NULL is fine. */
void cm__record_free(cm__record *r, int no_process);

#endif /* CM_RECORD_H */
