/*
 * lua_main.c: cuptimon-lua, the monitor's command line.
 *
 * Design note. main() parses the options, creates a libuv loop and a host (host.c) on it, runs
 * the script (or -e chunks), then runs the loop until nothing keeps it alive, the script calls
 * cm.exit(), or SIGINT/SIGTERM arrive; then cm_host_shutdown() does the final flush and runs the
 * script's exit hooks. A monitored command (`-- cmd`), --record and --replay go to the hub
 * (hub.c, replay.c) through cm__main_attach; the command starts once the script has loaded
 * (cm__hub_start), signals are offered to the hub first (it forwards them to the command), and
 * the hub's status (the command's) becomes ours unless the script chose one.
 *
 * Exit status: the script's cm.exit(status) or os.exit(status); with a command, the command's
 * status, or 1 when it exited 0 and the script raised errors; 1 when the script failed to load
 * or a capture cannot be read; 2 for usage errors; 130 on SIGINT.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "cuptimon.h"
#include "cuptimon_host.h"

#include "hub.h"

#define EXIT_USAGE 2

static void usage(FILE *out) {
  fprintf(out,
"Usage: cuptimon-lua [options] script.lua [script args...] [-- cmd args...]\n"
"       cuptimon-lua [options] --replay CAPTURE [--replay CAPTURE...] script.lua [script args...]\n"
"       cuptimon-lua --record CAPTURE [--select SPEC] [script.lua [args...]] -- cmd args...\n"
"       cuptimon-lua [options] -e 'lua chunk' [-e ...] [-- cmd args...]\n"
"       cuptimon-lua --check script.lua\n"
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
"  --record CAPTURE  writes every agent's frames to CAPTURE (%%p in the path becomes the pid;\n"
"                    without %%p the first process gets CAPTURE, later ones CAPTURE.<pid>), with\n"
"                    or without a script, and prints a summary line per capture.\n"
"Without `-- cmd` or --replay, the script observes this process through the in-process engine\n"
"(embedding, tests with the fake CUPTI). A script runs unchanged in all three modes.\n"
"\n");
  /* Split so that no string literal passes the 4095 bytes C99 compilers must support. */
  fprintf(out,
"Options:\n"
"  -e CHUNK          run the Lua chunk CHUNK (repeatable; runs before the script, if any)\n"
"  --check           load the script and validate its selections without tracing, then exit:\n"
"                    0 when it is valid, 1 with the message otherwise\n"
"  --replay FILE     replay a capture (repeatable)\n"
"  --record FILE     record what the command's agents send to a capture FILE\n"
"  --select SPEC     also trace SPEC (\"kernel:name,start,stop;memcpy\") in the command; the\n"
"                    default for --record with no script is\n"
"                    kernel;memcpy;memcpy2;memset;runtime;synchronization;marker;marker_data\n"
"  --lua-path DIR    load the cuptimon modules from DIR instead of the embedded copies\n"
"  -h, --help        show this help and exit\n"
"  -v, --version     show the versions of cuptimon, LuaJIT and libuv and exit\n"
"  --                the rest of the line is the command to run and monitor\n"
"\n"
"The script receives its arguments as `arg` (arg[0] is the script) and as `...`.\n"
"\n"
"Lua API (local cm = require \"cuptimon\"):\n"
"  cm.observe({ kernel = {\"name\",\"start\",\"stop\"}, memcpy = \"all\" }, function(b) ... end)\n"
"                    b.n records; b.start[i] typed columns (i from 0); b:str(\"name\", i);\n"
"                    b:process() / cm.process(b.source): pid, ppid, host, exe, argv, devices\n"
"  cm.configure{ flush_ms = 200, deliver_ms = 1000 }   cadences\n"
"  cm.every(ms, fn), cm.after(ms, fn)                   timers on the loop\n"
"  cm.flush{ sync = true, done = fn }                   deliver everything produced so far\n"
"                    (with a command: every agent answers, or dies, or the timeout passes)\n"
"  cm.on(\"exit\" | \"process_start\" | \"process_exit\" | \"error\", fn)\n"
"  cm.stats(), cm.sources(), cm.exit(status)\n"
"  cm.count(), cm.summary(), cm.hist(), cm.lhist(min, max, step), cm.quantiles(),\n"
"  cm.count_by(), cm.sum_by(), cm.stats_by(), cm.topk(k)   aggregations that print themselves\n"
"  require \"luv\" gives the same loop as the host.\n"
"\n");
  fprintf(out,
"Examples:\n"
"  cuptimon-lua scripts/top_kernels.lua --top 20 -- python train.py\n"
"  cuptimon-lua scripts/count.lua --per-process -- torchrun --nproc-per-node 8 train.py\n"
"  cuptimon-lua --record run.%%p.cmcap -- ./my_cuda_app\n"
"  cuptimon-lua --replay run.1.cmcap --replay run.2.cmcap scripts/timeline.lua\n"
"  cuptimon-lua -e 'local cm = require \"cuptimon\"; print(cm.version)'\n"
"  cuptimon-lua --check my_script.lua\n"
"\n"
"Environment:\n"
"  CUPTIMON_AGENT      the agent library to inject (default: libcuptimon-agent.so next to this\n"
"                      binary, then ../lib/libcuptimon-agent.so)\n"
"  CUPTIMON_DRAIN_MS   how long to wait for agents after the command exits (default 5000)\n"
"  CUPTIMON_KILL_GRACE_MS  after Control-C, how long before the command gets SIGKILL (3000)\n"
"  CUPTIMON_LIBCUPTI   path of the libcupti to load (default: libcupti.so.13, CUDA_HOME,\n"
"                      /usr/local/cuda); passed on to the command\n"
"  CUPTIMON_LIBCUDA    path of the libcuda the fence uses (tests use the fake CUPTI here)\n"
"  CUDA_HOME           CUDA toolkit root, searched for libcupti\n"
"  CUPTIMON_LUA_PATH   a directory of cuptimon modules to use instead of the embedded ones\n"
"  CUPTIMON_LOG        engine log level printed on stderr: 0 errors, 1 warnings (default),\n"
"                      2 info, 3 debug\n"
"  The command gets CUDA_INJECTION64_PATH, NVTX_INJECTION64_PATH, CUPTIMON_SOCKET and\n"
"  CUPTIMON_TOKEN (a private socket and a per-run token) on top of this environment.\n"
"\n"
"Exit status: with `-- cmd`, the command's status (128 + signal if a signal killed it; 127\n"
"when it cannot be run), or 1 when it exited 0 but the script raised errors; the script's\n"
"cm.exit()/os.exit() status when it chose one. Without a command: 0 when the loop runs out of\n"
"work or the replay ends, 1 on a script error, or a capture that is unreadable, not a capture or\n"
"yields no frame (a truncated or corrupt one only warns), 2 on a usage error, 130 after Control-C.\n");
}

static void version(void) {
  printf("cuptimon-lua %s (LuaJIT, libuv %s)\n", cm_version(), uv_version_string());
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

static void close_walk(uv_handle_t *hd, void *arg) {
  (void)arg;
  if (!uv_is_closing(hd)) uv_close(hd, NULL);
}

int main(int argc, char **argv) {
  const char *chunks[64];
  int nchunks = 0, check = 0;
  const char *lua_path = NULL;
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
    } else if (strcmp(a, "-e") == 0 || strcmp(a, "--replay") == 0 || strcmp(a, "--record") == 0 ||
               strcmp(a, "--lua-path") == 0 || strcmp(a, "--select") == 0) {
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
      } else if (strcmp(a, "--record") == 0) {
        req.record = v;
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
  if (req.cmd && req.cmd_argc == 0) {
    fprintf(stderr, "cuptimon-lua: `--` must be followed by a command to run\n");
    return EXIT_USAGE;
  }
  req.has_script = script || nchunks;
  if (req.record && !req.cmd) {
    fprintf(stderr, "cuptimon-lua: --record needs a command: cuptimon-lua --record FILE [script] -- cmd\n");
    return EXIT_USAGE;
  }
  if (req.select && !req.cmd) {
    fprintf(stderr, "cuptimon-lua: --select applies to a command: it needs `-- cmd`\n");
    return EXIT_USAGE;
  }
  if (!script && nchunks == 0 && !(req.record && !check)) {
    fprintf(stderr, "cuptimon-lua: no script given\n\n");
    usage(stderr);
    return EXIT_USAGE;
  }
  if (check && !script) {
    fprintf(stderr, "cuptimon-lua: --check needs a script\n");
    return EXIT_USAGE;
  }

  uv_loop_t loop;
  uv_loop_init(&loop);
  cm_host_options opts = {.lua_path = lua_path, .flags = check ? CM_HOST_CHECK : 0};
  int wants_hub = req.cmd || req.nreplay || req.record;
  if (wants_hub) opts.flags |= CM_HOST_NO_INPROC;
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
  if (!failed && !check) {
    cm__hub_start();
    uv_signal_t sigint, sigterm;
    uv_signal_init(&loop, &sigint);
    uv_signal_init(&loop, &sigterm);
    uv_signal_start(&sigint, on_signal, SIGINT);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    /* Signals alone do not keep the script alive. */
    uv_unref((uv_handle_t *)&sigint);
    uv_unref((uv_handle_t *)&sigterm);
    /* Returns when nothing keeps the loop alive, or after uv_stop (cm.exit, a signal). */
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_signal_stop(&sigint);
    uv_signal_stop(&sigterm);
    uv_close((uv_handle_t *)&sigint, NULL);
    uv_close((uv_handle_t *)&sigterm, NULL);
  }
  int asked = 0;
  int requested = cm_host_exit_requested(h, &asked);
  int hub_status = 0;
  int hub_done = cm__hub_finished(&hub_status);
  int shut = cm_host_shutdown(h);
  if (!failed) status = requested ? asked : shut;
  /* With a command, its status is ours unless the script chose one (cm.exit); a signal that
   * stopped the run through the hub counts as the command's. */
  if (!failed && hub_done && !requested) status = hub_status;
  /* Errors in callbacks were reported as they happened; without an explicit status they make
   * the run fail, so a broken script never looks like a clean one. A failing command's own
   * status is kept. */
  if (!requested && status == 0 && cm_host_error_count(h)) status = 1;
  cm_host_free(h);
  cm__hub_free();
  uv_walk(&loop, close_walk, NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  fflush(stdout);
  return status;
}
