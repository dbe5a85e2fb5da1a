/*
 * test_agent_exit.c: the agent's exit stays within its budget (CUPTIMON_EXIT_BUDGET_MS), and the
 * monitor's requests are bounded.
 *
 * The fake driver's cuCtxSynchronize is made to block (FAKE_CUDA_SYNC_BLOCK_MS), as it does on a
 * GPU when a kernel is still running at exit. Without a bound the final fence waited for it (25 s
 * for a 25 s block); now the exit takes at most the budget, every record written is still
 * delivered (the forced flush), and BYE says that the device did not synchronize.
 *  1. Capture mode, a sync that blocks for 25 s, a 1 s budget.
 *  2. Live mode, the same.
 *  3. Live mode while the monitor's FLUSH{sync, 60000} is in flight on the agent's control thread,
 *     holding the engine and waiting for a sync that blocks for a minute: the exit still takes at
 *     most the budget.
 *  4. Live mode, and every cuptiActivityFlushAll blocks for 10 s once the workload is done (as
 *     CUPTI's flush can under a backlog): the exit still takes at most the budget,
 *     STATS says the tail is unknown, and BYE says why.
 *  5. Live mode, and CUPTI is 1.2 s behind at exit (its flushes complete nothing for 1.2 s): the
 *     sync fence, which gets most of the default 2 s budget, completes, and every record arrives.
 *  6. Live mode, and once the workload is done CUPTI's default flushes return no partly filled
 *     buffer (as after a long run of sustained launches): the sync fence's own record comes
 *     back only with a forced flush, which the exit's fence issues once the device is synchronized;
 *     every record arrives and the tail is known.
 *  7. Live mode, and CUPTI is behind on kernel records alone (the fake holds them, and each flush
 *     writes 200: CUPTI under sustained launches, where a fence that completed at its sync record
 *     would lose kernel records uncounted): the fence flushes on while
 *     records from before it keep coming, every record arrives, and the tail is known.
 *  8. The same with one kernel record per flush, which the budget cannot drain: the tail is
 *     unknown, STATS and BYE say so (before, 2,600 of 3,000 kernel records were lost silently).
 *  9. A monitor asks for too much in CONFIGURE (a billion buffers, a 2 GiB buffer, a 1 TiB send
 *     queue, a 1 ms flush cadence, no batch bound, a 49-day fence) and in FLUSH (a 49-day
 *     timeout): the agent clamps each, says so in its log, and traces exactly as before.
 */
#include "agent_test_server.c"

/* The budget leaves the decoder time to catch up even under ThreadSanitizer on a loaded machine
 * (the sync fence gets nine tenths of nine tenths of it): the records must all arrive. */
#define BUDGET_MS 3000
/* Room for a loaded machine under a sanitizer: the process's own teardown after the handler. */
#define SLACK_MS 3000

static const char *const blocked_env[] = {"FAKE_CUDA_SYNC_BLOCK_MS=25000",
                                          "CUPTIMON_EXIT_BUDGET_MS=3000"};

/* Prints the agent's log (every case runs it at info level), before any check that may fail: its
 * exit line says how long the sync fence, the forced flush and the drain took, how many default
 * flushes came before the forced ones, and what the budget cut, so that a failure in a loaded
 * suite run can be told from a slow machine by its output alone. */
static void print_agent_log(const app *a) { printf("  agent log:\n%s", app_log(a)); }

static void check_counts(const checker *c, const app *a, const int *kinds, int nk) {
  for (int i = 0; i < nk; i++)
    CMT_EQ((int64_t)c->k[kinds[i]].count, app_get(a, cm_kind_name(kinds[i])));
  CMT_EQU(c->stats_records_dropped_agent, 0);
  CMT_EQU(c->stats_records_dropped, 0);
}

static void test_capture_blocked_sync(void) {
  char path[256], env_cap[300];
  snprintf(path, sizeof path, "/tmp/cmt-agent-%d-exit.cap", (int)getpid());
  snprintf(env_cap, sizeof env_cap, "CUPTIMON_CAPTURE=%s", path);
  const char *env[] = {env_cap, "CUPTIMON_SELECT=kernel:all;memcpy:all", blocked_env[0],
                       blocked_env[1], "CUPTIMON_AGENT_LOG=info", NULL};
  app a;
  app_start(&a, env, "--records 6000 --threads 2 --kinds kernel,memcpy");
  CMT_ASSERT(app_read_line(&a, 60000));
  uint64_t t0 = mono_ms();
  int st = app_wait(&a, 60000);
  uint64_t ms = mono_ms() - t0;
  printf("capture, blocked sync: exit took %llu ms\n", (unsigned long long)ms);
  print_agent_log(&a);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) CMT_FAIL("app status %d, log:\n%s", st, app_log(&a));
  CMT_LT(ms, BUDGET_MS + SLACK_MS);
  static checker c;
  memset(&c, 0, sizeof c);
  char em[CM_WIRE_ERRMSG_SIZE];
  if (read_capture(path, &c, em) != 0) CMT_FAIL("capture did not end cleanly: %s", em);
  CMT_EQ(c.byes, 1);
  printf("  BYE: %s\n", c.bye_message);
  CMT_CONTAINS(c.bye_message, "exit budget");
  CMT_CONTAINS(c.bye_message, "did not synchronize");
  int kinds[] = {CM_KIND_CONCURRENT_KERNEL, CM_KIND_MEMCPY};
  check_counts(&c, &a, kinds, 2);
  CMT_CONTAINS(app_log(&a), "did not synchronize");
  checker_free(&c);
  unlink(path);
  app_cleanup(&a);
}

/* Live mode; with `flush_in_flight`, the monitor sends FLUSH{sync, 60000} once the workload is
 * done and the app exits while that flush waits for the blocked sync. */
static void test_live_blocked_sync(bool flush_in_flight) {
  static server s;
  server_start(&s, "t", "kernel:all;memcpy:all", 50);
  s.flush_timeout_ms = 60000;
  server_run(&s);
  char sock[200];
  snprintf(sock, sizeof sock, "CUPTIMON_SOCKET=%s", s.path);
  const char *env[] = {sock, "CUPTIMON_TOKEN=t",
                       flush_in_flight ? "FAKE_CUDA_SYNC_BLOCK_MS=60000" : blocked_env[0],
                       blocked_env[1], "CUPTIMON_AGENT_LOG=info", NULL};
  int linger = flush_in_flight ? 500 : 0;
  char args[200];
  snprintf(args, sizeof args, "--records 6000 --threads 2 --kinds kernel,memcpy --linger-ms %d",
           linger);
  app a;
  app_start(&a, env, args);
  CMT_ASSERT(app_read_line(&a, 60000));
  uint64_t t0 = mono_ms();
  if (flush_in_flight) atomic_store(&s.flush_req, 7);
  int st = app_wait(&a, 90000);
  uint64_t ms = mono_ms() - t0;
  server_join(&s);
  printf("live, blocked sync%s: exit took %llu ms after the workload (linger %d ms)\n",
         flush_in_flight ? ", FLUSH{sync, 60000} in flight" : "", (unsigned long long)ms, linger);
  print_agent_log(&a);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) CMT_FAIL("app status %d, log:\n%s", st, app_log(&a));
  CMT_LT(ms, (uint64_t)linger + BUDGET_MS + SLACK_MS);
  CMT_EQ(s.chk.byes, 1);
  printf("  BYE: %s\n", s.chk.bye_message);
  CMT_CONTAINS(s.chk.bye_message, "did not synchronize");
  int kinds[] = {CM_KIND_CONCURRENT_KERNEL, CM_KIND_MEMCPY};
  check_counts(&s.chk, &a, kinds, 2);
  checker_free(&s.chk);
  app_cleanup(&a);
}

/* Live mode with the default 2 s budget and a CUPTI that misbehaves once the workload is done.
 *  - EXIT_EVERY_FLUSH_BLOCKS: every cuptiActivityFlushAll blocks 10 s, so the fence cannot
 *    complete: the tail is unknown.
 *  - EXIT_FORCED_FLUSH_BLOCKS: only the forced flush blocks 10 s, after the sync fence completed.
 *    The tail is still unknown: only that flush returns the partly filled buffers of threads that
 *    stopped without synchronizing (such as a main thread's warm-up launches).
 *  - EXIT_BACKLOG: CUPTI is 1.2 s behind (its flushes complete no buffer for 1.2 s, as with many
 *    launching threads on a GPU). The sync fence gets most of the budget, so it completes,
 *    every record arrives and the tail is known; a sync fence stopped after 750 ms would leave
 *    it unknown.
 *  - EXIT_DEFAULT_FULL_ONLY: CUPTI's default flushes return only full buffers, so the sync
 *    record written on the fence's helper thread comes back only with a forced flush. The exit's
 *    fence forces its flushes once the device is synchronized, so it completes and every record
 *    arrives within a few tens of ms, and the log says the record came with a forced flush.
 *    With default flushes only the sync fence would time out at its deadline (here the final
 *    forced flush would still bring the records; on a GPU that flush itself can take seconds,
 *    and the tail would be unknown).
 *  - EXIT_KERNEL_BACKLOG: CUPTI is behind on kernel records alone (200 written per flush), with
 *    records stamped with the realtime clock, as CUPTI's are. The fence's sync record comes at
 *    once; the fence flushes on while records from before it arrive, and every record arrives.
 *  - EXIT_KERNEL_BACKLOG_CUT: one kernel record per flush, more than the budget can drain: the
 *    tail is unknown, and BYE says that CUPTI was still delivering.
 * In every case the exit stays within the budget, and BYE says what happened. */
enum exit_case {
  EXIT_EVERY_FLUSH_BLOCKS,
  EXIT_FORCED_FLUSH_BLOCKS,
  EXIT_BACKLOG,
  EXIT_DEFAULT_FULL_ONLY,
  EXIT_KERNEL_BACKLOG,
  EXIT_KERNEL_BACKLOG_CUT
};

static void test_live_exit(enum exit_case ec) {
  static const char *const args[] = {
      "--records 6000 --threads 2 --kinds kernel,memcpy --flush-block-ms 10000",
      "--records 6000 --threads 2 --kinds kernel,memcpy --forced-flush-block-ms 10000",
      "--records 6000 --threads 2 --kinds kernel,memcpy --backlog-ms 1200",
      "--records 6000 --threads 2 --kinds kernel,memcpy --default-flush-full-only",
      "--records 6000 --threads 2 --kinds kernel,memcpy --kernel-backlog 200",
      "--records 6000 --threads 2 --kinds kernel,memcpy --kernel-backlog 1",
  };
  static const char *const what[] = {"every flush blocks 10 s", "the forced flush blocks 10 s",
                                     "CUPTI 1.2 s behind at exit",
                                     "default flushes return only full buffers",
                                     "CUPTI behind on kernel records (200 a flush)",
                                     "CUPTI behind on kernel records (1 a flush)"};
  bool kernel_backlog = ec == EXIT_KERNEL_BACKLOG || ec == EXIT_KERNEL_BACKLOG_CUT;
  static server s;
  server_start(&s, "t", "kernel:all;memcpy:all", 50);
  server_run(&s);
  char sock[200];
  snprintf(sock, sizeof sock, "CUPTIMON_SOCKET=%s", s.path);
  const char *env[] = {sock, "CUPTIMON_TOKEN=t", "CUPTIMON_EXIT_BUDGET_MS=2000",
                       "CUPTIMON_AGENT_LOG=info", kernel_backlog ? "FAKE_CUPTI_NOW_STAMPS=1" : NULL,
                       NULL};
  app a;
  app_start(&a, env, args[ec]);
  CMT_ASSERT(app_read_line(&a, 60000));
  uint64_t t0 = mono_ms();
  int st = app_wait(&a, 90000);
  uint64_t ms = mono_ms() - t0;
  server_join(&s);
  printf("live, %s: exit took %llu ms after the workload\n", what[ec], (unsigned long long)ms);
  print_agent_log(&a);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) CMT_FAIL("app status %d, log:\n%s", st, app_log(&a));
  CMT_LT(ms, 2000 + SLACK_MS);
  CMT_EQ(s.chk.byes, 1);
  printf("  BYE: %s\n", s.chk.bye_message);
  switch (ec) {
  case EXIT_EVERY_FLUSH_BLOCKS:
    CMT_CONTAINS(s.chk.bye_message, "final flush did not return within the budget");
    CMT_EQU(s.chk.stats_exit_tail_unknown, 1);
    break;
  case EXIT_FORCED_FLUSH_BLOCKS:
    /* Which of the two messages depends on whether the sync record came before the exit's fence
     * began to force its flushes (CM__EXIT_DEFAULT_FLUSH_MS): both say the tail is unknown. */
    CMT_CONTAINS(s.chk.bye_message, "the tail is unknown");
    CMT_EQU(s.chk.stats_exit_tail_unknown, 1);
    break;
  case EXIT_KERNEL_BACKLOG_CUT:
    CMT_CONTAINS(s.chk.bye_message, "CUPTI was still delivering records from before the exit's synchronize");
    CMT_CONTAINS(s.chk.bye_message, "the tail is unknown");
    CMT_EQU(s.chk.stats_exit_tail_unknown, 1);
    break;
  case EXIT_BACKLOG:
  case EXIT_DEFAULT_FULL_ONLY:
  case EXIT_KERNEL_BACKLOG: {
    if (ec == EXIT_DEFAULT_FULL_ONLY) CMT_CONTAINS(app_log(&a), "its record came with a forced flush");
    if (ec == EXIT_KERNEL_BACKLOG) CMT_CONTAINS(app_log(&a), "records from before it came after its record");
    CMT_EQU(s.chk.stats_exit_tail_unknown, 0);
    CMT_ASSERT(strstr(s.chk.bye_message, "tail is unknown") == NULL);
    int kinds[] = {CM_KIND_CONCURRENT_KERNEL, CM_KIND_MEMCPY};
    check_counts(&s.chk, &a, kinds, 2);
    break;
  }
  }
  checker_free(&s.chk);
  app_cleanup(&a);
}

static void test_control_caps(void) {
  static server s;
  const char *spec = "kernel:name,start,stop";
  server_start(&s, "t", spec, 0);
  static const cm_wire_kv kv[] = {
      {"pool_max_buffers", 1000000000ull}, {"buffer_size", 2ull << 30},
      {"send_queue_bytes", 1ull << 40},    {"flush_ms", 1},
      {"batch_records", 0},                {"fence_timeout_ms", 4233600000ull},
      {"deliver_ms", 50},
  };
  s.configure = kv;
  s.nconfigure = sizeof kv / sizeof kv[0];
  s.flush_timeout_ms = 4000000000u;
  server_run(&s);
  char sock[200];
  snprintf(sock, sizeof sock, "CUPTIMON_SOCKET=%s", s.path);
  const char *env[] = {sock, "CUPTIMON_TOKEN=t", "CUPTIMON_AGENT_LOG=info", NULL};
  app a;
  app_start(&a, env, "--records 30000 --threads 2 --kinds kernel --linger-ms 3000");
  CMT_ASSERT(app_read_line(&a, 60000));
  atomic_store(&s.flush_req, 9);
  int st = app_wait(&a, 60000);
  server_join(&s);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) CMT_FAIL("app status %d, log:\n%s", st, app_log(&a));
  const char *log = app_log(&a);
  printf("control caps: log:\n%s", log);
  CMT_CONTAINS(log, "pool_max_buffers = 1000000000 is outside the agent's bounds");
  CMT_CONTAINS(log, "buffer_size = 2147483648 is outside");
  CMT_CONTAINS(log, "send_queue_bytes = 1099511627776 is outside");
  CMT_CONTAINS(log, "flush_ms = 1 is outside");
  CMT_CONTAINS(log, "batch_records = 0 (no bound) is outside");
  CMT_CONTAINS(log, "fence_timeout_ms = 4233600000 is outside");
  CMT_CONTAINS(log, "using 64 buffers"); /* 64 MiB buffers: 4 GiB in all */
  CMT_CONTAINS(log, "timeout 4000000000 ms is over the agent's bound");
  CMT_ASSERT(strstr(log, "deliver_ms = 50 is outside") == NULL);
  CMT_EQ(s.chk.last_flush_id, 9);
  CMT_EQ(s.chk.last_flush_status, 0);
  CMT_EQ((int64_t)s.snap[CM_KIND_CONCURRENT_KERNEL].count, app_get(&a, "concurrent_kernel"));
  checker_free(&s.chk);
  app_cleanup(&a);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  test_capture_blocked_sync();
  test_live_blocked_sync(false);
  test_live_blocked_sync(true);
  test_live_exit(EXIT_EVERY_FLUSH_BLOCKS);
  test_live_exit(EXIT_FORCED_FLUSH_BLOCKS);
  test_live_exit(EXIT_BACKLOG);
  test_live_exit(EXIT_DEFAULT_FULL_ONLY);
  test_live_exit(EXIT_KERNEL_BACKLOG);
  test_live_exit(EXIT_KERNEL_BACKLOG_CUT);
  test_control_caps();
  printf("ok\n");
  return 0;
}
