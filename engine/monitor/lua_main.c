/*
 * lua_main.c: cuptimon-lua, the monitor's command line.
 *
 * Design note. main() parses the options, creates a libuv loop and a host (engine/host) on it, runs
 * the script (or -e chunks), then runs the loop until nothing keeps it alive, the script calls
 * cm.exit(), or SIGINT/SIGTERM arrive; then cm_host_shutdown() does the final flush and runs the
 * script's exit hooks. A monitored command (`-- cmd`), --record and --replay go to the hub
 * (hub.c, replay.c) through cm__main_attach; the command starts once the script has loaded
 * (cm__hub_start), signals are offered to the hub first (it forwards them to the command), and
 * the hub's status (the command's) becomes ours unless the script chose one.
 *
 * Exit status: the script's cm.exit(status) or os.exit(status); with a command, the command's
 * status; 1 instead of 0 when the script, a callback or a hook raised an error; 1 when the script
 * failed to load or a capture cannot be read; 2 for usage errors (the script's too, raised by
 * cuptimon.args); 130 on SIGINT. A run that lost records prints
 * one loss line after everything else and exits 3 where it would have exited 0 (--allow-loss
 * keeps the 0): results computed over incomplete data must not pass for complete ones.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <luajit.h>
#include <uv.h>

#include "cuptimon.h"
#include "cuptimon_host.h"

#include "attach.h"
#include "host_source.h"
#include "hub.h"

#define EXIT_USAGE 2
#define EXIT_LOSS 3

static void usage(FILE *out) {
  fprintf(out,
"Usage: cuptimon-lua [options] script.lua [script args...] [-- cmd args...]\n"
"       cuptimon-lua [options] --replay CAPTURE [--replay CAPTURE...] script.lua [script args...]\n"
"       cuptimon-lua --record CAPTURE [--select SPEC] [script.lua [args...]] -- cmd args...\n"
"       cuptimon-lua [options] --attach PID[,PID...] | --attach all  script.lua [script args...]\n"
"       cuptimon-lua --list\n"
"       cuptimon-lua [options] -e 'lua chunk' [-e ...] [-- cmd args...]\n"
"       cuptimon-lua --check script.lua [script args...]\n"
"  (a recipe also goes by its name: `cuptimon-lua top -- cmd` runs the installed\n"
"   share/cuptimon/scripts/top.lua)\n"
"\n"
"Runs a Lua script that observes CUDA activity through CUPTI: kernels, memory copies, API calls,\n"
"NVTX ranges and more, delivered to the script as columns (FFI arrays) on a libuv event loop.\n"
"\n"
"  -- cmd args...    runs cmd with the cuptimon agent injected (CUDA_INJECTION64_PATH); every\n"
"                    CUDA process of the command, children included, streams to this script.\n"
"                    When the command exits, its agents get up to 5 s to finish, the script's\n"
"                    exit hooks run, and cuptimon-lua exits with the command's status.\n"
"  --replay CAPTURE  runs the script over recorded captures instead (one per rank, say): their\n"
"                    processes replay concurrently, merged in timestamp order, as fast as the\n"
"                    script consumes. A truncated capture replays up to its last whole frame;\n"
"                    a corrupt stretch is skipped to the next valid frame; each with a warning\n"
"                    naming the byte offset (and the bytes skipped).\n"
"  --record CAPTURE  writes every agent's frames to one new file per process, with or without a\n"
"                    script, and prints a summary line per capture: the first process writes\n"
"                    CAPTURE as named and any further one gets its pid before the extension\n"
"                    (run.<pid>.cmcap); %%p in CAPTURE names every file by its pid instead.\n"
"                    Existing files are refused (see --force), CAPTURE itself before the\n"
"                    command runs.\n"
"  --attach PID,...  attaches the script to running processes whose agent is dormant (started\n"
"                    with CUDA_INJECTION64_PATH=.../libcuptimon-agent.so CUPTIMON_LISTEN=1: no\n"
"                    kind is traced until a script attaches). The script sees the same events\n"
"                    and batches as with `-- cmd`; when it ends (or at Control-C, status 0) each\n"
"                    process delivers what it holds, disables every kind and is dormant again,\n"
"                    ready for the next attach. `--attach all` takes every dormant process of\n"
"                    this user and new ones as they start, until Control-C. A process already\n"
"                    attached to another monitor refuses, naming that monitor's pid.\n"
"  --list            lists the dormant processes of this user: pid, start time, the monitor\n"
"                    attached (if any), CUDA_VISIBLE_DEVICES and the command line; removes the\n"
"                    sockets of processes that died without cleaning up.\n"
"Without `-- cmd` or --replay, the script observes this process through the in-process engine\n"
"(embedding, tests with the fake CUPTI); a script whose observers saw nothing at all there\n"
"fails with a hint. A script runs unchanged in all three modes.\n"
"\n");
  /* Split so that no string literal passes the 4095 bytes C99 compilers must support. */
  fprintf(out,
"Options:\n"
"  -e CHUNK          run the Lua chunk CHUNK (repeatable; runs before the script, if any)\n"
"  --check           load the script and validate its options and selections without tracing,\n"
"                    then exit: 0 when it is valid, 1 with the message otherwise (2 for a usage\n"
"                    error). Nothing changes: what the script opens for writing, creates, binds\n"
"                    or starts while it loads is a stand-in that does nothing\n"
"  --replay FILE     replay a capture (repeatable)\n"
"  --record FILE     record what the command's agents send to a capture FILE\n"
"  --force           let --record replace existing regular files\n"
"  --attach PIDS     attach to dormant processes (PID[,PID...] or all)\n"
"  --list            list the dormant processes and exit\n"
"  --select SPEC     also trace SPEC (\"kernel:name,start,stop;memcpy\") in the command; the\n"
"                    default for --record with no script is\n"
"                    kernel;memcpy;memcpy2;memset;runtime;synchronization;marker;marker_data\n"
"  --lua-path DIR    load the cuptimon modules from DIR instead of the embedded copies\n"
"  --verbose         print the Lua traceback of an error (without it an error is one line that\n"
"                    names the script's file and line)\n"
"  --duration SECS   end the run after SECS seconds, as cm.exit(0) would: live processes deliver\n"
"                    what they hold first, then the exit hooks run (a command still running goes\n"
"                    on untraced; --attach detaches)\n"
"  --allow-loss      exit with the usual status even when records were lost (the loss line\n"
"                    is still printed); without it a run that lost records exits 3 instead of 0\n"
  );
  fprintf(out,
"  -h, --help        show this help and exit\n"
"  -v, --version     show the versions of cuptimon, LuaJIT and libuv and exit\n"
"  --                the rest of the line is the command to run and monitor\n"
"\n"
"The script receives its arguments as `arg` (arg[0] is the script) and as `...`.\n"
"\n"
"Lua API (local cm = require \"cuptimon\"; the whole reference, every kind and field included, is\n"
"docs/lua-api.md):\n"
"  cm.observe({ kernel = {\"name\",\"start\",\"stop\"}, memcpy = \"all\" }, function(b) ... end)\n"
"                    b.n records; b.start[i] typed columns (i from 0); b:str(\"name\", i);\n"
"                    b:process() / cm.process(b.source): pid, ppid, host, exe, argv, devices, env\n"
"  cm.configure{ flush_ms = 200, deliver_ms = 1000 }   cadences\n"
"  cm.every(ms, fn), cm.after(ms, fn)                   timers on the loop\n"
"  cm.flush{ sync = true, done = fn }                   deliver everything produced so far\n"
"                    (with a command: every agent answers, or dies, or the timeout passes)\n"
"  cm.on(\"exit\" | \"process_start\" | \"process_exit\" | \"error\" | \"window\" | \"shed\" |\n"
"        \"restore\", fn)\n"
"  cm.stats(), cm.sources(), cm.exit(status)\n"
"  cm.count(), cm.summary(), cm.hist(), cm.lhist(min, max, step), cm.quantiles(),\n"
"  cm.count_by(), cm.sum_by(), cm.stats_by(), cm.topk(k)   aggregations that print themselves\n"
"                    (name: \"s\" or { name = \"s\", unit = \"ns\" | \"bytes\" }: 18.6 us, 1.5 KiB)\n"
"  cm.kernel_name(name [, full]), b:kernel_name(i)      a short demangled kernel name\n"
"  cm.demangle(name)                                    the full demangled C++ name\n"
"  cm.pm_sample{ metrics = {...}, interval_us = 1000, device = 0, fn = function(rows) end }\n"
"                    GPU counters by PM sampling (kind pm_sample); cm.pm_rows(b) pivots a batch\n"
"  Live processes only (`-- cmd`):\n"
"  cm.window{ select = {...}, ms = 2000, record = \"spike.%%p.cmcap\", pid = n, done = fn }\n"
"                    trace more for a while (optionally to a capture), then narrow back\n"
"  cm.budget{ records_per_s = n, shed = {\"runtime\", ...}, hold_ms = 5000 }\n"
"                    shed kinds of a process above the rate; cm.print_shed_notes()\n"
"  In-process only (this process's CUDA work, not `-- cmd` or --replay; see docs/monitor.md):\n"
"  cm.on_api(\"cudaLaunchKernel\", fn [, {site=}])        API callbacks, queued to the loop\n"
"  cm.corr_push([id]), cm.corr_pop(), cm.corr_current(), cm.corr_depth(), cm.corr_chain(id),\n"
"  cm.corr_join_chains(ec, b), cm.corr_metadata_put(id, json), cm.corr_metadata_take()\n"
"  cm.corr_join(ec, b)                                  external ids of rows (batches of any source)\n"
"  require \"luv\" gives the same loop as the host.\n"
"\n");
  fprintf(out,
"Examples:\n"
"  cuptimon-lua scripts/top.lua --top 20 -- python train.py\n"
"  cuptimon-lua scripts/count.lua --per-process -- torchrun --nproc-per-node 8 train.py\n"
"  cuptimon-lua --record run.%%p.cmcap -- ./my_cuda_app\n"
"  cuptimon-lua --replay run.1.cmcap --replay run.2.cmcap scripts/timeline.lua -o trace.json\n"
"  cuptimon-lua -e 'local cm = require \"cuptimon\"; print(cm.version)'\n"
"  cuptimon-lua --check my_script.lua\n"
"  CUDA_INJECTION64_PATH=$PWD/libcuptimon-agent.so CUPTIMON_LISTEN=1 python train.py &\n"
"  cuptimon-lua --list; cuptimon-lua --attach all scripts/top.lua    # Control-C to detach\n"
"\n"
"Environment:\n"
"  CUPTIMON_AGENT      the agent library to inject (default: libcuptimon-agent.so next to this\n"
"                      binary, then ../lib/libcuptimon-agent.so)\n"
"  CUPTIMON_DRAIN_MS   how long to wait for agents after the command exits (default 5000)\n"
"  CUPTIMON_KILL_GRACE_MS  after Control-C, how long before the command gets SIGKILL (3000)\n"
"  CUPTIMON_HELLO_TIMEOUT_MS  a connection that sends no valid HELLO in time is closed (5000)\n"
"  CUPTIMON_MAX_STARTUPS      connections waiting for their HELLO at once; more close the\n"
"                             oldest (64)\n"
"  CUPTIMON_HELLO_MAX_BYTES   the largest HELLO accepted before the handshake (524288)\n"
"  CUPTIMON_LIBCUPTI   path of the libcupti to load (default: libcupti.so.13, CUDA_HOME,\n"
"                      /usr/local/cuda); passed on to the command\n"
"  CUPTIMON_LIBCUDA    path of the libcuda the fence uses (tests use the fake CUPTI here)\n"
"  CUDA_HOME           CUDA toolkit root, searched for libcupti\n"
"  CUPTIMON_LUA_PATH   a directory of cuptimon modules to use instead of the embedded ones\n"
"  XDG_RUNTIME_DIR     dormant agents listen in $XDG_RUNTIME_DIR/cuptimon (else in\n"
"                      $TMPDIR/cuptimon-<uid>, or /tmp/cuptimon-<uid>), as --list and --attach\n"
"                      look for them\n"
"  CUPTIMON_LOG        engine log level printed on stderr: 0 errors, 1 warnings (default),\n"
"                      2 info, 3 debug\n"
"  The command gets CUDA_INJECTION64_PATH, NVTX_INJECTION64_PATH, CUPTIMON_SOCKET and\n"
"  CUPTIMON_TOKEN (a private socket and a per-run token) on top of this environment.\n"
"  The agent in the command reads its own variables (docs/agent.md), among them\n"
"  CUPTIMON_EXIT_BUDGET_MS (2000: the most its exit adds to the process), CUPTIMON_AGENT_LOG\n"
"  (warn) and CUPTIMON_GUARD_LAG_MS (500: when CUPTI holds records back longer, the agent\n"
"  stops tracing the API records, then all but kernels, then kernels; 0 turns that off) and\n"
"  CUPTIMON_GUARD_BUFFERS (6: the same when CUPTI holds more activity buffers than this).\n"
"\n"
"Exit status: with `-- cmd`, the command's status (128 + signal if a signal killed it; 127\n"
"when it cannot be run), or 1 when it exited 0 but a --record capture could not be written;\n"
"the script's cm.exit()/os.exit() status when it chose one. Without a command: 0 when the loop\n"
"runs out of work or the replay ends, 1 on a capture that is unreadable, not a capture or\n"
"yields no frame (a truncated or corrupt one only warns) or a script whose observers saw\n"
"nothing, 2 on a usage error (the script's too, and a script that cannot be opened),\n"
"130 after Control-C. Any error of the script, an observer, a timer, a hook (exit hooks\n"
"included) or a deferred call turns a status of 0 into 1, and so does output that could not be\n"
"written (a full disk, a file-size limit: a recipe's -o file, a capture, the standard output).\n"
"Lost records: when any record was lost (CUPTI had no buffer, an agent's queue was full or its\n"
"exit deadline passed, frames never arrived, or a process ended without its final counts),\n"
"one line \"cuptimon-lua: LOST N of M records (...)\" goes to stderr after all other output,\n"
"and a status of 0 becomes 3 (unless --allow-loss); a non-zero status is kept.\n");
}

static void version(void) {
  printf("cuptimon-lua %s (%s, libuv %s)\n", cm_version(), LUAJIT_VERSION, uv_version_string());
}

static cm_host *g_host;
static int g_signalled;

static void on_signal(uv_signal_t *s, int signum) {
  g_signalled++;
  /* With a command, the hub forwards the signal and the run ends when the command does; a
   * second signal kills the command, a third leaves at once. */
  if (g_signalled <= 2 && cm__hub_signal(signum)) return;
  if (g_signalled > 1) {
    /* Another Control-C while the exit hooks run: leave now. */
    fprintf(stderr, "cuptimon-lua: interrupted again, exiting\n");
    exit(128 + signum);
  }
  cm_host_request_exit(g_host, 128 + signum);
  uv_stop(s->loop);
}

/* Appends to a fixed buffer, truncating. */
static void addf(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void addf(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  if (*len + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* Writes the one loss line of the run into line (cap bytes), if any record of any source (gone
 * ones included) was lost or may have been; returns 1 then. Call after the exit hooks; the
 * caller prints it last, after the script's output and the --record summaries. */
static int loss_line(cm_host *h, char *line, size_t cap) {
  cm_loss sum, l;
  int32_t gone[16];
  int ngone = cm__hub_lost_handshakes(gone, 16);
  if (cm_host_source_loss(h, 0, &sum) != 0 || (sum.dropped == 0 && sum.incomplete == 0 &&
                                              sum.lost_frames == 0)) {
    if (!ngone) return 0;
    memset(&sum, 0, sizeof sum);
  }
  /* What was lost where, then the whole line. Incomplete counts (a process ended without its
   * final STATS) make the numbers lower bounds. */
  char cats[512];
  size_t c = 0;
  const char *sep = "";
  if (sum.dropped_cupti) {
    addf(cats, sizeof cats, &c, "%sCUPTI had no buffer: %llu", sep,
         (unsigned long long)sum.dropped_cupti);
    sep = ", ";
  }
  if (sum.dropped_agent) {
    addf(cats, sizeof cats, &c, "%sagent queue full or connection lost: %llu", sep,
         (unsigned long long)sum.dropped_agent);
    sep = ", ";
  }
  if (sum.dropped_exit) {
    addf(cats, sizeof cats, &c, "%sagent exit deadline: %llu", sep,
         (unsigned long long)sum.dropped_exit);
    sep = ", ";
  }
  if (sum.lost_wire) {
    addf(cats, sizeof cats, &c, "%snever received: %llu", sep, (unsigned long long)sum.lost_wire);
    sep = ", ";
  }
  if (sum.lost_frames) {
    addf(cats, sizeof cats, &c, "%s%llu batch frame%s missing", sep,
         (unsigned long long)sum.lost_frames, sum.lost_frames == 1 ? "" : "s");
    sep = ", ";
  }
  if (sum.skipped_bytes) {
    addf(cats, sizeof cats, &c, "%s%llu corrupt capture bytes skipped", sep,
         (unsigned long long)sum.skipped_bytes);
    sep = ", ";
  }
  if (sum.incomplete && sum.dropped) addf(cats, sizeof cats, &c, "%sthe rest unknown", sep);
  size_t n = 0;
  line[0] = 0;
  if (sum.dropped)
    addf(line, cap, &n, "cuptimon-lua: LOST %s%llu of %llu records",
         sum.incomplete ? "at least " : "", (unsigned long long)sum.dropped,
         (unsigned long long)sum.produced);
  else
    addf(line, cap, &n, "cuptimon-lua: LOST an unknown number of records");
  if (c) addf(line, cap, &n, " (%s)", cats);
  if (!sum.dropped && !sum.incomplete && !sum.lost_frames) {
    /* Only handshakes were lost: those processes ran untraced. */
    n = 0;
    line[0] = 0;
    addf(line, cap, &n, "cuptimon-lua: LOST every record of %d process%s whose handshake was cut "
         "short (the gate was full or the HELLO timed out); they ran untraced: pid", ngone,
         ngone == 1 ? "" : "es");
    for (int i = 0; i < ngone && i < 16; i++) addf(line, cap, &n, "%s %d", i ? "," : "", gone[i]);
    if (ngone > 16) addf(line, cap, &n, ", ...");
    return 1;
  }
  addf(line, cap, &n, " in");
  /* Each pid once, however many connections (attach windows, reconnects) it had: what its
   * sources lost is merged. */
  enum { MAX_LISTED = 16 };
  struct {
    int pid, final_missing;       /* a source of it ended without its final counts */
    int tail_unknown;             /* a source's exit cut its final fence short */
    uint64_t last_number, skipped; /* the largest last batch number of those; corrupt bytes */
  } by_pid[MAX_LISTED];
  int id, pid, npids = 0, more = 0;
  for (int i = 0; cm_host_source_loss_at(h, i, &id, &pid, &l) == 0; i++) {
    if (!l.dropped && !l.incomplete && !l.lost_frames) continue;
    int k = 0;
    while (k < npids && by_pid[k].pid != pid) k++;
    if (k == npids) {
      if (npids == MAX_LISTED) {
        more = 1;
        continue;
      }
      memset(&by_pid[k], 0, sizeof by_pid[k]);
      by_pid[k].pid = pid;
      npids++;
    }
    by_pid[k].skipped += l.skipped_bytes;
    by_pid[k].tail_unknown |= l.tail_unknown != 0;
    if (l.incomplete && !l.skipped_bytes && !l.tail_unknown) {
      by_pid[k].final_missing = 1;
      if (l.last_number > by_pid[k].last_number) by_pid[k].last_number = l.last_number;
    }
  }
  sep = " pid ";
  for (int k = 0; k < npids; k++) {
    addf(line, cap, &n, "%s%d", sep, by_pid[k].pid);
    if (by_pid[k].skipped)
      addf(line, cap, &n, " (its capture is damaged)");
    else if (by_pid[k].tail_unknown)
      addf(line, cap, &n, " (its exit's final fence was cut short at the deadline: the records "
                          "CUPTI still held are unknown)");
    else if (by_pid[k].final_missing && by_pid[k].last_number)
      addf(line, cap, &n,
           " (its final counts are missing; the last batch frame received was %llu)",
           (unsigned long long)by_pid[k].last_number);
    else if (by_pid[k].final_missing)
      addf(line, cap, &n, " (its final counts are missing)");
    sep = ", pid ";
  }
  if (more) addf(line, cap, &n, ", ...");
  if (ngone) {
    addf(line, cap, &n, "; and every record of %d process%s whose handshake was cut short (pid",
         ngone, ngone == 1 ? "" : "es");
    for (int i = 0; i < ngone && i < 16; i++) addf(line, cap, &n, "%s %d", i ? "," : "", gone[i]);
    addf(line, cap, &n, "%s)", ngone > 16 ? ", ..." : "");
  }
  return 1;
}

/* --duration: the run ends as if the script called cm.exit(0): live processes deliver what they
 * hold first (lua/cuptimon/init.lua), then the exit hooks run. */
static void duration_cb(uv_timer_t *t) {
  cm_host *h = t->data;
  cm_host_eval(h, "require('cuptimon').exit(0)", "=(--duration)");
}

/* A recipe named without a path ("top", "top.lua") that is not a file here: the installed recipe
 * of that name, <bin>/../share/cuptimon/scripts/NAME.lua beside this binary, into buf (cap
 * bytes). Returns buf, or `name` unchanged when there is no such recipe (loading it then fails
 * naming it). */
static const char *find_recipe(const char *name, char *buf, size_t cap) {
  if (strchr(name, '/') || access(name, F_OK) == 0) return name;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return name;
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return name;
  *slash = 0;
  size_t len = strlen(name);
  const char *ext = len > 4 && strcmp(name + len - 4, ".lua") == 0 ? "" : ".lua";
  int w = snprintf(buf, cap, "%s/../share/cuptimon/scripts/%s%s", exe, name, ext);
  if (w < 0 || (size_t)w >= cap || access(buf, R_OK) != 0) return name;
  return buf;
}

/* A script that cannot be opened is a usage error (status 2), said in one line: a path that is
 * not there, or a name that is neither a file here nor an installed recipe. Returns 1 when it
 * printed the error. */
static int script_missing(const char *given, const char *found) {
  if (access(found, R_OK) == 0) return 0;
  int e = errno;
  if (strchr(given, '/')) {
    fprintf(stderr, "cuptimon-lua: cannot open the script %s: %s (see --help)\n", given,
            strerror(e));
    return 1;
  }
  /* A bare name is looked up as an installed recipe, beside the binary. */
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  char *slash = strrchr(exe, '/');
  if (slash) *slash = 0;
  fprintf(stderr, "cuptimon-lua: no script %s: it is not a file here, and recipes are found by "
          "name only in an install (%s/../share/cuptimon/scripts/); in a source tree, name the "
          "file: scripts/%s%s (see --help)\n", given, slash ? exe : "<prefix>/bin", given,
          strstr(given, ".lua") ? "" : ".lua");
  return 1;
}

/* Whether everything written to stdout reached it; says why not (once) on stderr. A reader that
 * closed its end of a pipe (EPIPE: `| head`) chose to stop reading, which is not a failure. */
static int stdout_failed(void) {
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
  int e = errno;
  /* The write that failed may have been an earlier one (a print that filled the buffer), whose
   * errno is gone: a file at the file-size limit, or on a full file system, tells it. */
  struct stat st;
  struct rlimit rl;
  struct statvfs vfs;
  if (!e && fstat(STDOUT_FILENO, &st) == 0) {
    if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))
      e = EPIPE; /* a pipe's write fails only when its reader has gone */
    else if (S_ISREG(st.st_mode) && getrlimit(RLIMIT_FSIZE, &rl) == 0 &&
             rl.rlim_cur != RLIM_INFINITY && (rlim_t)st.st_size >= rl.rlim_cur)
      e = EFBIG;
    else if (S_ISREG(st.st_mode) && fstatvfs(STDOUT_FILENO, &vfs) == 0 && vfs.f_bavail == 0)
      e = ENOSPC;
  }
  if (e == EPIPE) return 0;
  fprintf(stderr, "cuptimon-lua: cannot write the standard output: %s\n",
          e ? strerror(e) : "a write failed");
  return 1;
}

static void close_walk(uv_handle_t *hd, void *arg) {
  (void)arg;
  if (!uv_is_closing(hd)) uv_close(hd, NULL);
}

int main(int argc, char **argv) {
  /* A file-size limit (ulimit -f) must fail a write with EFBIG, which is reported and counted
   * like a full disk, not kill the monitor with SIGXFSZ before it says anything: the command
   * would run on untraced and the capture or output would end silently. A spawned command gets
   * the default action back (uv_spawn resets every signal in the child). */
  signal(SIGXFSZ, SIG_IGN);
  const char *chunks[64];
  int nchunks = 0, check = 0, allow_loss = 0, verbose = 0;
  const char *lua_path = NULL;
  double duration_s = 0;
  cm__main_request req = {0};
  const char *replays[64];
  const char *script = NULL;
  int script_argc = 0;
  char **script_argv = NULL;

  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      req.cmd = argv + i + 1;
      req.cmd_argc = argc - i - 1;
      i = argc;
      break;
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0) {
      version();
      return 0;
    } else if (strcmp(a, "--check") == 0) {
      check = 1;
    } else if (strcmp(a, "--force") == 0) {
      req.force = 1;
    } else if (strcmp(a, "--allow-loss") == 0) {
      allow_loss = 1;
    } else if (strcmp(a, "--verbose") == 0) {
      verbose = 1;
    } else if (strcmp(a, "--list") == 0) {
      if (i + 1 < argc) {
        fprintf(stderr, "cuptimon-lua: --list takes no other argument\n");
        return EXIT_USAGE;
      }
      return cm__attach_list(stdout);
    } else if (strcmp(a, "-e") == 0 || strcmp(a, "--replay") == 0 || strcmp(a, "--record") == 0 ||
               strcmp(a, "--lua-path") == 0 || strcmp(a, "--select") == 0 ||
               strcmp(a, "--attach") == 0 || strcmp(a, "--duration") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "cuptimon-lua: %s needs an argument (see --help)\n", a);
        return EXIT_USAGE;
      }
      const char *v = argv[++i];
      if (a[1] == 'e') {
        if (nchunks == (int)(sizeof chunks / sizeof chunks[0])) {
          fprintf(stderr, "cuptimon-lua: too many -e chunks\n");
          return EXIT_USAGE;
        }
        chunks[nchunks++] = v;
      } else if (strcmp(a, "--replay") == 0) {
        if (req.nreplay == (int)(sizeof replays / sizeof replays[0]) - 1) {
          fprintf(stderr, "cuptimon-lua: too many --replay captures\n");
          return EXIT_USAGE;
        }
        replays[req.nreplay++] = v;
        replays[req.nreplay] = NULL;
        req.replay = replays;
      } else if (strcmp(a, "--select") == 0) {
        req.select = v;
      } else if (strcmp(a, "--attach") == 0) {
        req.attach = v;
      } else if (strcmp(a, "--record") == 0) {
        req.record = v;
      } else if (strcmp(a, "--duration") == 0) {
        char *end = NULL;
        duration_s = strtod(v, &end);
        if (!end || *end || end == v || !(duration_s > 0) || duration_s > 1e7) {
          fprintf(stderr, "cuptimon-lua: --duration needs a positive number of seconds, got %s "
                  "(see --help)\n", v);
          return EXIT_USAGE;
        }
      } else {
        lua_path = v;
      }
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "cuptimon-lua: unknown option %s (see --help)\n", a);
      return EXIT_USAGE;
    } else {
      /* The script; what follows up to `--` is its arguments. */
      script = a;
      int j = i + 1;
      while (j < argc && strcmp(argv[j], "--") != 0) j++;
      script_argv = argv + i + 1;
      script_argc = j - i - 1;
      if (j < argc) {
        req.cmd = argv + j + 1;
        req.cmd_argc = argc - j - 1;
      }
      break;
    }
  }
  char recipe[PATH_MAX + 64];
  if (script) {
    const char *given = script;
    script = find_recipe(script, recipe, sizeof recipe);
    if (script_missing(given, script)) return EXIT_USAGE;
  }
  if (req.cmd && req.cmd_argc == 0) {
    fprintf(stderr, "cuptimon-lua: `--` must be followed by a command to run\n");
    return EXIT_USAGE;
  }
  req.has_script = script || nchunks;
  if (req.record && !req.cmd) {
    fprintf(stderr, "cuptimon-lua: --record needs a command: cuptimon-lua --record FILE [script] -- cmd\n");
    return EXIT_USAGE;
  }
  if (req.force && !req.record) {
    fprintf(stderr, "cuptimon-lua: --force applies to --record\n");
    return EXIT_USAGE;
  }
  if (req.select && !req.cmd) {
    fprintf(stderr, "cuptimon-lua: --select applies to a command: it needs `-- cmd`\n");
    return EXIT_USAGE;
  }
  if (req.attach && !script && nchunks == 0) {
    fprintf(stderr, "cuptimon-lua: --attach needs a script: cuptimon-lua --attach PID script.lua\n");
    return EXIT_USAGE;
  }
  if (!script && nchunks == 0 && !(req.record && !check)) {
    /* One line, not the whole help: the error is what the user needs to see. */
    fprintf(stderr, "cuptimon-lua: no script given: cuptimon-lua SCRIPT.lua [args] -- cmd args... "
            "(see --help)\n");
    return EXIT_USAGE;
  }
  if (check && !script) {
    fprintf(stderr, "cuptimon-lua: --check needs a script\n");
    return EXIT_USAGE;
  }

  uv_loop_t loop;
  uv_loop_init(&loop);
  cm_host_options opts = {.lua_path = lua_path,
                          .flags = (check ? CM_HOST_CHECK : 0) | (verbose ? CM_HOST_VERBOSE : 0)};
  int wants_hub = req.cmd || req.nreplay || req.record || req.attach;
  if (wants_hub) opts.flags |= CM_HOST_NO_INPROC;
  /* --attach closes its windows after the loop and before the exit hooks (cm__hub_detach). */
  if (req.attach) opts.flags |= CM_HOST_STOP_ON_EXIT;
  cm_host *h;
  int rc = cm_host_new(&h, &loop, &opts);
  if (rc) {
    fprintf(stderr, "cuptimon-lua: cannot create the host: %s\n", cm_strerror(rc));
    return 1;
  }
  g_host = h;

  if (wants_hub && !check) {
    rc = cm__main_attach(h, &loop, &req);
    if (rc) {
      /* The hub has said why. */
      cm__hub_free();
      cm_host_free(h);
      uv_walk(&loop, close_walk, NULL);
      uv_run(&loop, UV_RUN_NOWAIT);
      uv_loop_close(&loop);
      return rc == CM_EINVAL ? EXIT_USAGE : 1;
    }
  }

  int failed = 0;
  for (int c = 0; c < nchunks && !failed; c++) failed = cm_host_eval(h, chunks[c], "=(-e)") != 0;
  if (!failed && script) failed = cm_host_run_script(h, script, script_argc, script_argv) != 0;

  int status = failed ? 1 : 0;
  /* A script that asked to exit while loading (cm.exit, or --help and usage errors raised by
   * cuptimon.args) never starts the command, a replay or the loop. */
  int exit_at_load = !failed && cm_host_exit_requested(h, NULL);
  /* At function scope: the loop finishes closing them later, in cm_host_free's last turns. */
  uv_signal_t sigint, sigterm;
  uv_timer_t duration;
  int duration_on = 0;
  if (!failed && !check && !exit_at_load) {
    cm__hub_start();
    if (duration_s > 0 && uv_timer_init(&loop, &duration) == 0) {
      duration_on = 1;
      duration.data = h;
      uv_timer_start(&duration, duration_cb, (uint64_t)(duration_s * 1000 + 0.5), 0);
      /* It ends the run; it does not keep a run alive that would end on its own. */
      uv_unref((uv_handle_t *)&duration);
    }
    uv_signal_init(&loop, &sigint);
    uv_signal_init(&loop, &sigterm);
    uv_signal_start(&sigint, on_signal, SIGINT);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    /* Signals alone do not keep the script alive. */
    uv_unref((uv_handle_t *)&sigint);
    uv_unref((uv_handle_t *)&sigterm);
    /* Returns when nothing keeps the loop alive, or after uv_stop (cm.exit, a signal). */
    uv_run(&loop, UV_RUN_DEFAULT);
    /* The exit hooks come next, and a script may handle signals there itself (prometheus.lua's
     * --linger). A command still tearing down after its BYE gets SIGINT and SIGTERM forwarded
     * from here on, by watchers started before these stop: between the two, a signal would take
     * its default action and kill cuptimon-lua in the middle of its exit (hub_spec, "forwards
     * SIGTERM to a command still tearing down after the exit hooks", failed so under TSan). */
    cm__hub_forward_signals();
    if (duration_on) uv_close((uv_handle_t *)&duration, NULL);
    uv_signal_stop(&sigint);
    uv_signal_stop(&sigterm);
    uv_close((uv_handle_t *)&sigint, NULL);
    uv_close((uv_handle_t *)&sigterm, NULL);
  }
  int asked = 0;
  int requested = cm_host_exit_requested(h, &asked);
  /* A script that observes, run with no command and no capture, watches this process only: when
   * its observers saw nothing at all (the in-process engine, source 1, was never handed a
   * buffer, or could not even start: no GPU or driver here), the likely mistake is a missing
   * `-- cmd`; say so and fail rather than print an empty report with status 0. Scripts that
   * observe nothing, or chose their status, are fine. */
  cm_stats inproc;
  int nothing_traced = !failed && !check && !wants_hub && !requested &&
                       (cm__host_inproc_error(h) != 0 ||
                        (cm_host_source_stats(h, 1, &inproc) == 0 && inproc.buffers_allocated == 0 &&
                         inproc.records_decoded == 0 && inproc.records_delivered == 0));
  if (!failed && !check) cm__hub_detach();
  int shut = cm_host_shutdown(h);
  /* A cm.exit() whose delivery flush was still under way when the run ended chose the status in
   * the shutdown (lua/cuptimon/init.lua, before the exit hooks). */
  if (!requested) requested = cm_host_exit_requested(h, &asked);
  /* The exit hooks' tables go out now: the command's process may still be tearing down. */
  fflush(stdout);
  /* A test hook: CUPTIMON_TEST_AFTER_HOOKS_MS holds cuptimon-lua here, after the exit hooks and
   * before the host is freed, so that a spec can send a signal in that stretch (hub_spec); a
   * signal that is handled ends the hold early. */
  const char *after_hooks = getenv("CUPTIMON_TEST_AFTER_HOOKS_MS");
  if (after_hooks && atoi(after_hooks) > 0) usleep((useconds_t)atoi(after_hooks) * 1000);
  int errors = cm_host_error_count(h);
  char lost[2048];
  int lossy = !check && loss_line(h, lost, sizeof lost);
  cm__hub_forget_host();
  cm_host_free(h);
  /* The run may have ended on the BYE of the command's own process: reap it now (signals are
   * forwarded to it meanwhile) for its real exit status. */
  cm__hub_wait_command();
  int hub_status = 0;
  int hub_done = cm__hub_finished(&hub_status);
  if (!failed) status = requested ? asked : shut;
  /* With a command, its status is ours unless the script chose one (cm.exit); a signal that
   * stopped the run through the hub counts as the command's. */
  if (!failed && hub_done && !requested) status = hub_status;
  /* Errors of the script, its callbacks and its hooks were reported as they happened (the exit
   * hooks ran in cm_host_shutdown above); they turn a status of 0 into 1, also one chosen with
   * cm.exit(0), so a broken script never looks like a clean one. A non-zero status (a failing
   * command's, or one the script chose) is kept. */
  if (status == 0 && errors) status = 1;
  /* A named --attach pid that was never attached fails the run, whatever the script chose. */
  if (status == 0 && cm__hub_attach_failed()) status = 1;
  if (nothing_traced) {
    fprintf(stderr, "cuptimon-lua: the script observed nothing: there is no command to monitor. "
            "Run `cuptimon-lua %s -- cmd args...` to monitor a program, or `cuptimon-lua --replay "
            "CAPTURE %s` to read a capture\n", script ? script : "SCRIPT", script ? script : "SCRIPT");
    if (status == 0) status = 1;
  }
  /* Lost records: one line after everything else, and a distinct status for a run that would
   * otherwise pass (a failing status says more already). */
  if (lossy && status == 0 && !allow_loss) status = EXIT_LOSS;
  cm__hub_free();
  uv_walk(&loop, close_walk, NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  /* Output the user asked for that did not reach stdout (a full disk, a file-size limit behind
   * `> FILE`) fails the run like any other unwritten output. */
  if (stdout_failed() && status == 0) status = 1;
  if (lossy) fprintf(stderr, "%s\n", lost);
  return status;
}
