/*
 * test_agent_capture.c: the agent in capture mode (no monitor, CUPTIMON_CAPTURE set).
 *
 *  1. A capture of one million records from four threads, read back with cm_wire_file_*, matches
 *     the regenerated workload exactly: per kind the count, per selected field two checksums.
 *     STATS reports nothing dropped, BYE ends the file, and nothing follows it.
 *  2. Two processes writing captures through one "%p" pattern each get their own complete file,
 *     with the default selection (CUPTIMON_SELECT unset).
 *  3. A crashing target (abort() after its workload, so no exit handler runs) leaves a capture
 *     that is readable up to its last whole frame; a copy cut in the middle of a frame reports
 *     "truncated" after yielding every whole frame.
 *  4. A selection with an unknown field is applied without it, and the log names it.
 *  5. With neither CUPTIMON_SOCKET nor CUPTIMON_CAPTURE, the agent does nothing and the app runs.
 */
#include "agent_test_server.c"

static void test_million(void) {
  const char *spec = "kernel:all;memcpy:all;memset:all;runtime:all;marker:all";
  int kinds[] = {CM_KIND_CONCURRENT_KERNEL, CM_KIND_MEMCPY, CM_KIND_MEMSET, CM_KIND_RUNTIME,
                 CM_KIND_MARKER};
  int nk = 5;
  char path[256], env_cap[300], env_sel[300];
  snprintf(path, sizeof path, "/tmp/cmt-agent-%d-million.cap", (int)getpid());
  snprintf(env_cap, sizeof env_cap, "CUPTIMON_CAPTURE=%s", path);
  snprintf(env_sel, sizeof env_sel, "CUPTIMON_SELECT=%s", spec);
  /* Generous exit deadlines: under ThreadSanitizer the final fence and the drain of a million
   * records take several times their release-build time, and this test checks completeness, not
   * speed. */
  const char *env[] = {env_cap, env_sel, "CUPTIMON_AGENT_QUEUE_MB=2048",
                       "CUPTIMON_AGENT_QUEUE_FRAMES=100000", "CUPTIMON_EXIT_BUDGET_MS=120000", "CUPTIMON_EXIT_FLUSH_MS=60000",
                       "CUPTIMON_EXIT_DRAIN_MS=60000", NULL};
  app a;
  app_start(&a, env, "--records 1000000 --threads 4 --kinds kernel,memcpy,memset,runtime,marker");
  int st = app_wait(&a, 120000);
  printf("million: %s", a.line);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) CMT_FAIL("app status %d, log:\n%s", st, app_log(&a));
  CMT_EQ(app_get(&a, "init"), 1);
  CMT_EQ(app_get(&a, "records"), 1000000);

  cm_selection *sel;
  CMT_OK(cm_selection_new(&sel));
  CMT_OK(cm_selection_parse(sel, spec));
  static checker c;
  memset(&c, 0, sizeof c);
  c.expect_sel = sel;
  char em[CM_WIRE_ERRMSG_SIZE];
  int rc = read_capture(path, &c, em);
  if (rc != 0) CMT_FAIL("capture did not end cleanly: %s", em);
  CMT_EQ(c.hellos, 1);
  CMT_EQ(c.schemas, 1);
  CMT_STREQ(c.token, "");
  CMT_EQ(c.hello_pid, app_get(&a, "pid"));
  CMT_EQ(c.byes, 1);
  CMT_EQ(c.frames_after_bye, 0);
  CMT_GE(c.stats_frames, 1);
  CMT_GE(c.stats_checked, 1);
  CMT_EQU(c.stats_batches_dropped, 0);
  CMT_EQU(c.stats_records_dropped_agent, 0);
  CMT_EQU(c.stats_records_dropped, 0);
  for (int i = 0; i < nk; i++)
    CMT_EQ((int64_t)c.k[kinds[i]].count, app_get(&a, cm_kind_name(kinds[i])));
  static kacc exp[CM_KIND_MAX];
  expect_workload(exp, 1000000, 4, kinds, nk, sel);
  CMT_EQ(compare(c.k, exp, kinds, nk, sel), 0);
  printf("million: %d batches, checksums match\n", c.batches);
  checker_free(&c);
  cm_selection_free(sel);
  unlink(path);
  app_cleanup(&a);
}

static void test_two_processes(void) {
  char pat[256], env_cap[300];
  snprintf(pat, sizeof pat, "/tmp/cmt-agent-%d-two.%%p.cap", (int)getpid());
  snprintf(env_cap, sizeof env_cap, "CUPTIMON_CAPTURE=%s", pat);
  const char *env[] = {env_cap, NULL};
  app a[2];
  for (int i = 0; i < 2; i++) app_start(&a[i], env, "--records 30000 --threads 2 --kinds kernel,memcpy,runtime");
  int kinds[] = {CM_KIND_CONCURRENT_KERNEL, CM_KIND_MEMCPY, CM_KIND_RUNTIME};
  for (int i = 0; i < 2; i++) {
    int st = app_wait(&a[i], 60000);
    CMT_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    int64_t pid = app_get(&a[i], "pid");
    CMT_EQ(pid, a[i].pid);
    char path[300];
    snprintf(path, sizeof path, "/tmp/cmt-agent-%d-two.%d.cap", (int)getpid(), (int)pid);
    static checker c;
    memset(&c, 0, sizeof c);
    char em[CM_WIRE_ERRMSG_SIZE];
    int rc = read_capture(path, &c, em);
    if (rc != 0) CMT_FAIL("%s did not end cleanly: %s", path, em);
    CMT_EQ(c.hello_pid, pid);
    CMT_EQ(c.byes, 1);
    CMT_EQ(c.k[kinds[0]].count, app_get(&a[i], "concurrent_kernel"));
    CMT_EQ(c.k[kinds[1]].count, app_get(&a[i], "memcpy"));
    CMT_EQ(c.k[kinds[2]].count, app_get(&a[i], "runtime"));
    CMT_EQ(app_get(&a[i], "records"), 30000);
    /* The default selection's columns, checked against the regenerated workload. */
    cm_selection *sel;
    CMT_OK(cm_selection_new(&sel));
    CMT_OK(cm_selection_parse(sel, "kernel:name,start,stop,device,context,stream,correlation,"
                                   "grid_x,grid_y,grid_z,block_x,block_y,block_z,registers,"
                                   "static_smem,dynamic_smem;memcpy:copy_kind,bytes,start,stop,"
                                   "device,stream,correlation;runtime:cbid,start,stop,pid,tid,"
                                   "correlation"));
    static kacc exp[CM_KIND_MAX];
    memset(exp, 0, sizeof exp);
    expect_workload(exp, 30000, 2, kinds, 3, sel);
    CMT_EQ(compare(c.k, exp, kinds, 3, sel), 0);
    cm_selection_free(sel);
    checker_free(&c);
    unlink(path);
    app_cleanup(&a[i]);
  }
  printf("two processes: both captures complete\n");
}

static void test_crash(void) {
  char path[256], cut[300], env_cap[300];
  snprintf(path, sizeof path, "/tmp/cmt-agent-%d-crash.cap", (int)getpid());
  snprintf(cut, sizeof cut, "%s.cut", path);
  snprintf(env_cap, sizeof env_cap, "CUPTIMON_CAPTURE=%s", path);
  const char *env[] = {env_cap, NULL};
  app a;
  app_start(&a, env, "--records 200000 --threads 2 --kinds kernel,memcpy --linger-ms 500 --crash");
  int st = app_wait(&a, 60000);
  CMT_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
  static checker c;
  memset(&c, 0, sizeof c);
  char em[CM_WIRE_ERRMSG_SIZE];
  int rc = read_capture(path, &c, em);
  printf("crash: capture read %s (%s), %d batches, %d byes\n", rc == 0 ? "cleanly" : "truncated",
         em, c.batches, c.byes);
  if (rc != 0) CMT_CONTAINS(em, "truncated");
  CMT_EQ(c.hellos, 1);
  CMT_EQ(c.schemas, 1);
  CMT_EQ(c.byes, 0); /* no exit handler ran */

  /* Cut the file in the middle of its last frame: every frame before it is still read. */
  struct stat sb;
  CMT_EQ(stat(path, &sb), 0);
  int in = open(path, O_RDONLY), out = open(cut, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CMT_ASSERT(in >= 0 && out >= 0);
  size_t keep = (size_t)sb.st_size - 5;
  char *buf = malloc(keep);
  CMT_EQ(read(in, buf, keep), (ssize_t)keep);
  CMT_EQ(write(out, buf, keep), (ssize_t)keep);
  free(buf);
  close(in);
  close(out);
  cm_wire_file *cf;
  CMT_OK(cm_wire_file_open(&cf, cut, em));
  cm_wire_frame f;
  uint64_t frames = 0;
  while ((rc = cm_wire_file_next(cf, &f)) == 1) frames++;
  CMT_EQ(rc, CM_EIO);
  CMT_CONTAINS(cm_wire_file_errmsg(cf), "truncated");
  printf("crash: cut copy: %llu whole frames, then: %s\n", (unsigned long long)frames,
         cm_wire_file_errmsg(cf));
  CMT_GE(frames, 1);
  cm_wire_file_close(cf);
  checker_free(&c);
  unlink(path);
  unlink(cut);
  app_cleanup(&a);
}

static void test_bad_select_name(void) {
  char path[256], env_cap[300];
  snprintf(path, sizeof path, "/tmp/cmt-agent-%d-badsel.cap", (int)getpid());
  snprintf(env_cap, sizeof env_cap, "CUPTIMON_CAPTURE=%s", path);
  const char *env[] = {env_cap, "CUPTIMON_SELECT=kernel:start,no_such_field;memcpy", NULL};
  app a;
  app_start(&a, env, "--records 1000 --kinds kernel,memcpy");
  int st = app_wait(&a, 30000);
  CMT_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const char *log = app_log(&a);
  CMT_CONTAINS(log, "cuptimon-agent[");
  CMT_CONTAINS(log, "no_such_field");
  static checker c;
  memset(&c, 0, sizeof c);
  CMT_EQ(read_capture(path, &c, NULL), 0);
  CMT_EQ(c.k[CM_KIND_CONCURRENT_KERNEL].count, app_get(&a, "concurrent_kernel"));
  CMT_EQ(c.k[CM_KIND_MEMCPY].count, 500);
  checker_free(&c);
  unlink(path);
  app_cleanup(&a);
}

static void test_no_env(void) {
  app a;
  const char *env[] = {"CUPTIMON_AGENT_LOG=info", NULL};
  app_start(&a, env, "--records 100 --exit-code 4");
  int st = app_wait(&a, 30000);
  CMT_ASSERT(WIFEXITED(st));
  CMT_EQ(WEXITSTATUS(st), 4);
  CMT_EQ(app_get(&a, "init"), 1);
  CMT_EQ(app_get(&a, "records"), 0); /* nothing enabled: the fake writes nothing */
  CMT_CONTAINS(app_log(&a), "neither CUPTIMON_SOCKET nor CUPTIMON_CAPTURE");
  app_cleanup(&a);
}

int main(void) {
  test_no_env();
  test_bad_select_name();
  test_two_processes();
  test_crash();
  test_million();
  printf("ok\n");
  return 0;
}
