/*
 * log.c: the engine's log. The host sets one callback (cm_set_log), and every file of the engine
 * reports through cm__engine_log: the library never prints. engine.log_mu guards the callback and
 * its userdata and is held while the callback runs, so that cm_set_log can replace it safely; a
 * log callback must therefore not call back into the engine. Any thread logs, under any other
 * engine lock; no lock is taken under log_mu.
 */
#include <stdarg.h>
#include <stdio.h>

#include "engine.h"

void cm__engine_log(cm_engine *e, int level, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&e->log_mu);
  if (e->log_fn) e->log_fn(e->log_ud, level, msg);
  pthread_mutex_unlock(&e->log_mu);
}

void cm_set_log(cm_engine *e, cm_log_fn fn, void *ud) {
  if (!e) return;
  pthread_mutex_lock(&e->log_mu);
  e->log_fn = fn;
  e->log_ud = ud;
  pthread_mutex_unlock(&e->log_mu);
}
