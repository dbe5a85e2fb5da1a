/*
 * window.h: a trigger window (cm.window) on one live process: the counts, and the capture, of the
 * frames between two fences. Used by the agent connections (conn.c); implemented in window.c.
 *
 * Design note. A window is opened by a sync FLUSH, so that everything traced before it arrived
 * ahead of its FLUSH_DONE; the frames after that FLUSH_DONE are counted, and written to a capture
 * of their own, until the FLUSH_DONE of the closing FLUSH. The connection sends the fences and
 * tells the window when each completed; the window knows nothing of the connection, only the
 * process's wire source, which it reads (its schema, strings and STATS) and never changes.
 *
 * Threads: loop thread only. Ownership: the connection holds the window from cm__window_new to
 * cm__window_finish, which frees it.
 */
#ifndef CM_WINDOW_H
#define CM_WINDOW_H

#include <stdint.h>

#include "cuptimon_wire.h"
#include "host_source.h"
#include "wsrc.h"

typedef struct cm__window cm__window;

/* Creates the window of process `pid` (the kernel's). With `path`, it also creates its capture,
 * named by the --record rules (every file gets its pid; `force` replaces an existing regular
 * file), which starts with `hello`, the process's HELLO frame (NULL when it was not kept: the
 * capture then fails with CM_EIO). `done` runs exactly once, from cm__window_finish. Returns 0
 * or a CM_E* code (nothing is created then). */
int cm__window_new(cm__window **out, const char *path, int force, const cm_wire_frame *hello,
                   uint32_t pid, const cm__wsrc *w, cm__window_done_fn done, void *ud);
/* The opening fence completed with `status`: the frames from here on are the window's. The
 * capture gets the schema and the string table known now. Only the first call counts. */
void cm__window_opened(cm__window *win, const cm__wsrc *w, int status);
/* A frame of the process, after the wire source took it: counted and written when the window
 * is open (frames before the opening fence are not the window's). */
void cm__window_frame(cm__window *win, const cm_wire_frame *f);
/* The narrowing SELECT was sent: the window's span ends now. Returns 1 when the window was
 * closing already (its closing fence is on the way), else 0: the caller sends that fence. */
int cm__window_end(cm__window *win);
/* Ends the window (the closing fence completed, or the process ended, with `status`): its
 * capture gets the window's STATS and a BYE, `done` gets the counts, and the window is freed. */
void cm__window_finish(cm__window *win, const cm__wsrc *w, int status);

#endif /* CM_WINDOW_H */
