/*
 * test_agent_live.c: the agent streaming to a monitor (the test server of agent_test_server.c).
 *
 *  1. Handshake (token, CONFIGURE with an unknown key, SELECT, HELLO_ACK), then, once the app has
 *     finished its workload, a FLUSH{sync}: when its FLUSH_DONE arrives, the records received
 *     equal exactly what the app wrote, column checksums included; BYE follows at exit.
 *  2. A wrong token: the monitor refuses the agent; the app completes with exit 0.
 *  3. The monitor closes the connection mid-run: the app finishes with the requested exit code
 *     and logs that tracing is off.
 *  4. A full queue: a tiny send queue and a monitor that stops reading. The app is not blocked
 *     (it finishes its workload while the monitor reads nothing), batches are dropped and counted
 *     in STATS, and received + dropped records add up to what the app wrote.
 *  5. A crashing target: the monitor sees the connection close without BYE.
 */
#include "agent_test_server.c"

static void env_for(server *s, char *sock, size_t n) { snprintf(sock, n, "CUPTIMON_SOCKET=%s", s->path); }

static void test_flush_exact(void) {
  static server s;
  const char *spec = "kernel:name,start,stop,grid_x;memcpy:bytes,start,copy_kind;runtime:all";
  server_start(&s, "tok-123", spec, 50);
  server_run(&s);
  char sock[200];
  env_for(&s, sock, sizeof sock);
  const char *env[] = {sock, "CUPTIMON_TOKEN=tok-123", NULL};
  app a;
  app_start(&a, env, "--records 90000 --threads 3 --kinds kernel,memcpy,runtime --linger-ms 3000");
  CMT_ASSERT(app_read_line(&a, 60000));
  atomic_store(&s.flush_req, 42);
  int st = app_wait(&a, 60000);
  CMT_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  server_join(&s);
  printf("flush: %s", a.line);
  CMT_ASSERT(s.accepted);
  CMT_ASSERT(!s.refused);
  CMT_ASSERT(s.snap_taken);
  CMT_EQ(s.chk.last_flush_id, 42);
  CMT_EQ(s.chk.last_flush_status, 0);
  CMT_EQ(s.chk.flush_dones, 1);
  CMT_EQ(s.chk.byes, 1);
  CMT_ASSERT(s.eof);
  CMT_STREQ(s.chk.token, "tok-123");
  CMT_EQ(s.chk.hello_pid, a.pid);
  int kinds[] = {CM_KIND_CONCURRENT_KERNEL, CM_KIND_MEMCPY, CM_KIND_RUNTIME};
  cm_selection *sel;
  CMT_OK(cm_selection_new(&sel));
  CMT_OK(cm_selection_parse(sel, spec));
  static kacc exp[CM_KIND_MAX];
  expect_workload(exp, 90000, 3, kinds, 3, sel);
  printf("at FLUSH_DONE:\n");
  CMT_EQ(compare(s.snap, exp, kinds, 3, sel), 0);
  printf("at BYE:\n");
  CMT_EQ(compare(s.chk.k, exp, kinds, 3, sel), 0);
  for (int i = 0; i < 3; i++) CMT_EQ(s.snap[kinds[i]].count, app_get(&a, cm_kind_name(kinds[i])));
  CMT_EQU(s.chk.stats_batches_dropped, 0);
  /* The unknown CONFIGURE key is reported, not fatal. */
  CMT_CONTAINS(app_log(&a), "no_such_setting");
  cm_selection_free(sel);
  checker_free(&s.chk);
  app_cleanup(&a);
}

static void test_wrong_token(void) {
  static server s;
  server_start(&s, "right", "kernel:all", 0);
  server_run(&s);
  char sock[200];
  env_for(&s, sock, sizeof sock);
  const char *env[] = {sock, "CUPTIMON_TOKEN=wrong", NULL};
  app a;
  app_start(&a, env, "--records 1000 --kinds kernel");
  int st = app_wait(&a, 30000);
  server_join(&s);
  CMT_ASSERT(WIFEXITED(st));
  CMT_EQ(WEXITSTATUS(st), 0);
  CMT_ASSERT(s.refused);
  CMT_EQ(app_get(&a, "init"), 1);
  CMT_CONTAINS(app_log(&a), "refused");
  printf("wrong token: refused, app exit 0\n");
  checker_free(&s.chk);
  app_cleanup(&a);
}

static void test_server_killed(void) {
  static server s;
  server_start(&s, "t", "kernel:all;memcpy:all", 20);
  s.close_after_batches = 1;
  server_run(&s);
  char sock[200];
  env_for(&s, sock, sizeof sock);
  const char *env[] = {sock, "CUPTIMON_TOKEN=t", NULL};
  app a;
  app_start(&a, env, "--records 20000 --kinds kernel,memcpy --rounds 6 --pause-ms 150 --exit-code 3");
  int st = app_wait(&a, 60000);
  server_join(&s);
  CMT_ASSERT(s.closed_by_us);
  CMT_ASSERT(WIFEXITED(st));
  CMT_EQ(WEXITSTATUS(st), 3);
  CMT_EQ(app_get(&a, "records") > 0, 1);
  const char *log = app_log(&a);
  printf("server killed: app exit 3; log:\n%s", log);
  CMT_CONTAINS(log, "connection is lost");
  CMT_CONTAINS(log, "tracing off");
  CMT_CONTAINS(log, "dropped");
  checker_free(&s.chk);
  app_cleanup(&a);
}

static void test_full_queue(void) {
  static server s;
  server_start(&s, "t", "kernel:all", 10);
  atomic_store(&s.pause, 1);
  server_run(&s);
  char sock[200];
  env_for(&s, sock, sizeof sock);
  /* Generous exit deadlines: the count below must balance exactly, and under a sanitizer on a
   * loaded machine the final fence can take longer than the default 3 s. */
  const char *env[] = {sock, "CUPTIMON_TOKEN=t", "CUPTIMON_AGENT_QUEUE_MB=1",
                       "CUPTIMON_AGENT_QUEUE_FRAMES=4", "CUPTIMON_EXIT_BUDGET_MS=120000", "CUPTIMON_EXIT_FLUSH_MS=60000",
                       "CUPTIMON_EXIT_DRAIN_MS=60000", NULL};
  app a;
  app_start(&a, env, "--records 300000 --threads 2 --kinds kernel");
  /* The monitor reads nothing until the app has finished its workload: a blocked app would never
   * print its line, and this wait would time out. */
  CMT_ASSERT(app_read_line(&a, 60000));
  atomic_store(&s.pause, 0);
  int st = app_wait(&a, 60000);
  server_join(&s);
  CMT_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  printf("full queue: %s  received %llu records, STATS: %llu batches (%llu records) dropped\n",
         a.line, (unsigned long long)s.chk.k[CM_KIND_CONCURRENT_KERNEL].count,
         (unsigned long long)s.chk.stats_batches_dropped,
         (unsigned long long)s.chk.stats_records_dropped_agent);
  CMT_EQ(s.chk.byes, 1);
  CMT_GT(s.chk.stats_checked, 0); /* the final STATS counted what was queued: all of it arrived */
  CMT_EQU(s.chk.stats_records_dropped_exit, 0);
  CMT_GT(s.chk.stats_batches_dropped, 0);
  CMT_GT(s.chk.stats_records_dropped_agent, 0);
  CMT_GT(s.chk.k[CM_KIND_CONCURRENT_KERNEL].count, 0); /* what fitted in the queue arrived */
  CMT_EQU(s.chk.stats_records_dropped, 0);
  CMT_EQ((int64_t)(s.chk.k[CM_KIND_CONCURRENT_KERNEL].count + s.chk.stats_records_dropped_agent),
         app_get(&a, "concurrent_kernel"));
  checker_free(&s.chk);
  app_cleanup(&a);
}

/* The exit deadline passes with batches still queued (the monitor does not read): the agent drops
 * them as exit losses and queues fresh final counts, which a monitor that reads again receives,
 * so the records still add up exactly. The server resumes only once the agent has logged the
 * cut, and the agent then waits up to 60 s for the final frames: no timing race. */
/* Whether the app's log holds `needle` yet (the log may not exist yet: the child creates it). */
static bool log_has(const app *a, const char *needle) {
  FILE *f = fopen(a->errpath, "r");
  if (!f) return false;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return strstr(buf, needle) != NULL;
}

static void test_exit_deadline(void) {
  static server s;
  server_start(&s, "t", "kernel:all", 10);
  atomic_store(&s.pause, 1);
  server_run(&s);
  char sock[200];
  env_for(&s, sock, sizeof sock);
  const char *env[] = {sock, "CUPTIMON_TOKEN=t", "CUPTIMON_AGENT_QUEUE_MB=1",
                       "CUPTIMON_AGENT_QUEUE_FRAMES=4", "CUPTIMON_EXIT_FLUSH_MS=60000",
                       "CUPTIMON_EXIT_DRAIN_MS=300", "CUPTIMON_EXIT_BUDGET_MS=60000", NULL};
  app a;
  app_start(&a, env, "--records 300000 --threads 2 --kinds kernel");
  uint64_t deadline = mono_ms() + 60000;
  while (!log_has(&a, "dropping") && mono_ms() < deadline) usleep(10000);
  CMT_CONTAINS(app_log(&a), "did not take the last frames within 300 ms: dropping");
  atomic_store(&s.pause, 0);
  int st = app_wait(&a, 60000);
  server_join(&s);
  CMT_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  printf("exit deadline: %s  received %llu records, STATS: %llu (agent) + %llu (exit) dropped\n",
         a.line, (unsigned long long)s.chk.k[CM_KIND_CONCURRENT_KERNEL].count,
         (unsigned long long)s.chk.stats_records_dropped_agent,
         (unsigned long long)s.chk.stats_records_dropped_exit);
  CMT_EQ(s.chk.byes, 1);
  CMT_GT(s.chk.stats_checked, 0);
  CMT_GT(s.chk.stats_records_dropped_exit, 0);
  CMT_EQU(s.chk.stats_records_dropped, 0);
  CMT_EQ((int64_t)(s.chk.k[CM_KIND_CONCURRENT_KERNEL].count + s.chk.stats_records_dropped_agent +
                   s.chk.stats_records_dropped_exit),
         app_get(&a, "concurrent_kernel"));
  CMT_ASSERT(strstr(app_log(&a), "not sent either") == NULL);
  checker_free(&s.chk);
  app_cleanup(&a);
}

static void test_crash(void) {
  static server s;
  server_start(&s, "t", "kernel:all", 20);
  server_run(&s);
  char sock[200];
  env_for(&s, sock, sizeof sock);
  const char *env[] = {sock, "CUPTIMON_TOKEN=t", NULL};
  app a;
  app_start(&a, env, "--records 20000 --kinds kernel --linger-ms 300 --crash");
  int st = app_wait(&a, 30000);
  server_join(&s);
  CMT_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
  CMT_ASSERT(s.eof);
  CMT_EQ(s.chk.byes, 0);
  CMT_EQ(s.chk.hellos, 1);
  printf("crash: the monitor saw the connection close after %d batches, no BYE\n", s.chk.batches);
  checker_free(&s.chk);
  app_cleanup(&a);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  test_wrong_token();
  test_flush_exact();
  test_server_killed();
  test_crash();
  test_full_queue();
  test_exit_deadline();
  printf("ok\n");
  return 0;
}
