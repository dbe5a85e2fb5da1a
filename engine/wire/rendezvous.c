/*
 * rendezvous.c: where dormant agents listen and where the monitor looks for them (the contract is
 * in cuptimon_wire.h, cm_wire_listen_dir). Shared by the agent and the monitor so that both name
 * the same directory and apply the same checks.
 *
 * The checks follow what OpenSSH and systemd do for a per-user runtime directory in a shared
 * place: the directory is created 0700 if missing, then examined with lstat (a symbolic link is
 * refused, so a link planted in /tmp cannot redirect the sockets), and it must be owned by the
 * effective uid with no group or world write bit. /tmp's sticky bit then keeps others from
 * replacing it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cuptimon_wire.h"

/* The room a socket name ("/" then "<pid>.sock", or the agent's temporary ".<pid>.tmp") needs
 * after the directory within sun_path. */
#define NAME_ROOM 24

static int fail(char *err, size_t errlen, int rc, const char *fmt, const char *path, int e) {
  if (err && errlen) snprintf(err, errlen, fmt, path, e ? strerror(e) : "");
  return rc;
}

int cm_wire_listen_dir(char *out, size_t cap, int flags, char *err, size_t errlen) {
  const size_t room = sizeof(((struct sockaddr_un *)0)->sun_path) - NAME_ROOM;
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n;
  if (xdg && xdg[0] == '/' && strlen(xdg) + 9 < room) {
    n = snprintf(out, cap, "%s/cuptimon", xdg);
  } else {
    const char *tmp = getenv("TMPDIR");
    if (!tmp || tmp[0] != '/' || strlen(tmp) + 32 >= room) tmp = "/tmp";
    n = snprintf(out, cap, "%s/cuptimon-%u", tmp, (unsigned)geteuid());
  }
  if (n < 0 || (size_t)n >= cap)
    return fail(err, errlen, CM_EINVAL, "%s: the path does not fit%s", "", 0);
  if ((flags & CM_WIRE_LISTEN_CREATE) && mkdir(out, 0700) != 0 && errno != EEXIST)
    return fail(err, errlen, CM_EIO, "cannot create %s: %s", out, errno);
  struct stat st;
  if (lstat(out, &st) != 0) {
    int e = errno;
    return fail(err, errlen, e == ENOENT ? CM_ENOENT : CM_EIO, "%s: %s", out, e);
  }
  if (!S_ISDIR(st.st_mode))
    return fail(err, errlen, CM_EIO, "%s is not a directory (a symbolic link is refused too)%s",
                out, 0);
  if (st.st_uid != geteuid() && !(flags & CM_WIRE_LISTEN_ANY_OWNER)) {
    if (err && errlen)
      snprintf(err, errlen, "%s belongs to uid %u, not to this user (uid %u); refusing it", out,
               (unsigned)st.st_uid, (unsigned)geteuid());
    return CM_EIO;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    if (err && errlen)
      snprintf(err, errlen, "%s is writable by its group or by others (mode %03o); refusing it "
               "(chmod 700 it)", out, (unsigned)(st.st_mode & 0777));
    return CM_EIO;
  }
  return 0;
}
