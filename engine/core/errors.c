/*
 * errors.c: the error space's strings and the per-thread detail message.
 *
 * Design: a code says what kind of failure happened; the detail says which argument, name or
 * library was at fault and what would have been valid. Codes map to strings through the
 * CM_ERRNO_MAP X-macro of cuptimon.h, so the enum and its strings cannot drift apart. The detail
 * lives in a thread-local buffer, so a failing call on one thread never overwrites the message
 * another thread is about to read, and no lock is needed. A detail longer than the buffer is
 * truncated, never allocated: reporting an error must not itself fail.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cm_internal.h"

#define CM__ERRMSG_SIZE 4096

/* The calling thread's last detail; "" until a cm_ call fails on this thread. */
static _Thread_local char errmsg_buf[CM__ERRMSG_SIZE];

#define CM__STR(x) #x
#define CM__XSTR(x) CM__STR(x)

const char *cm_strerror(int err) {
  switch (err) {
  case CM_OK:
    return "success";
#define CM__ERR_TEXT(name, value, text) \
  case CM_##name:                       \
    return text;
    CM_ERRNO_MAP(CM__ERR_TEXT)
#undef CM__ERR_TEXT
  default:
    return "unknown error";
  }
}

const char *cm_err_name(int err) {
  switch (err) {
  case CM_OK:
    return "OK";
#define CM__ERR_NAME(name, value, text) \
  case CM_##name:                       \
    return #name;
    CM_ERRNO_MAP(CM__ERR_NAME)
#undef CM__ERR_NAME
  default:
    return "UNKNOWN";
  }
}

const char *cm_errmsg(void) { return errmsg_buf; }

/* The message is formatted into a scratch buffer first and then copied, so that a caller may
 * pass cm_errmsg() itself as an argument (to prefix context onto a callee's detail) without the
 * formatter reading the bytes it is writing. */
int cm__seterr(int err, const char *fmt, ...) {
  char tmp[CM__ERRMSG_SIZE];
  if (fmt == NULL) {
    errmsg_buf[0] = '\0';
    return err;
  }
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) {
    tmp[0] = '\0';
  } else if ((size_t)n >= sizeof tmp) {
    /* Mark the truncation so a reader does not take a cut list of names as complete. */
    memcpy(tmp + sizeof tmp - 4, "...", 4);
  }
  memcpy(errmsg_buf, tmp, strlen(tmp) + 1);
  return err;
}

void cm__clearerr(void) { errmsg_buf[0] = '\0'; }

const char *cm_version(void) {
  return CM__XSTR(CM_VERSION_MAJOR) "." CM__XSTR(CM_VERSION_MINOR) "." CM__XSTR(CM_VERSION_PATCH);
}

void cm__stderr_linev(const char *prefix, const char *fmt, va_list ap) {
  char line[1536];
  int n = snprintf(line, sizeof line, "%s", prefix);
  if (n < 0) return;
  if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, len);
  (void)w;
}
