/*
 * job.c: helper threads that their waiter may abandon at a deadline.
 *
 * A call that must never hold its caller past a deadline, whatever the library under it does (a
 * device synchronize behind a kernel that runs on, a cuptiFinalize that CUPTI keeps waiting, the
 * exit's flush), runs on a helper thread. The waiter and the helper share the job; the waiter
 * gives up at its deadline, and the last of the two to leave frees the job, so an abandoned
 * helper touches nothing but its job. A job embeds cm__job as its first member.
 */
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include "cm_internal.h"

int cm__job_start(cm__job *j, void *(*fn)(void *)) {
  pthread_mutex_init(&j->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&j->cv, &ca);
  pthread_condattr_destroy(&ca);
  j->refs = 2;
  j->done = false;
  j->abandoned = false;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  /* The helper inherits a mask that blocks every signal: the application's handlers never run
   * on it. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  pthread_t t;
  int rc = pthread_create(&t, &at, fn, j);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&at);
  if (rc) {
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
  }
  return rc;
}

bool cm__job_finish(cm__job *j) {
  pthread_mutex_lock(&j->mu);
  j->done = true;
  bool abandoned = j->abandoned;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  return abandoned;
}

/* done and abandoned change under one lock, so exactly one of the two sides sees the other's. */
bool cm__job_abandon(cm__job *j) {
  pthread_mutex_lock(&j->mu);
  bool done = j->done;
  if (!done) j->abandoned = true;
  pthread_mutex_unlock(&j->mu);
  return done;
}

bool cm__job_wait(cm__job *j, uint64_t deadline, uint32_t slice_ms, bool (*hurry)(void *),
                  void *arg) {
  pthread_mutex_lock(&j->mu);
  while (!j->done) {
    uint64_t now = cm__mono_ms();
    if (now >= deadline || (hurry && hurry(arg))) break;
    uint64_t left = deadline - now;
    struct timespec ts;
    cm__abstime_in(&ts, slice_ms && left > slice_ms ? slice_ms : left);
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
  }
  bool done = j->done;
  pthread_mutex_unlock(&j->mu);
  return done;
}

void cm__job_release(cm__job *j) {
  pthread_mutex_lock(&j->mu);
  bool last = --j->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j);
}
