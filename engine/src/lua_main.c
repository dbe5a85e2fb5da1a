/*
 * lua_main.c: cuptimon-lua, the monitor's command line.
 *
 * Design note. main() parses the options, creates a libuv loop and a host (host.c) on it, runs
 * the script (or -e chunks), then runs the loop until nothing keeps it alive, the script calls
 * cm.exit(), or SIGINT/SIGTERM arrive; then cm_host_shutdown() does the final flush and runs the
 * script's exit hooks. The options for a monitored command (`-- cmd`), --replay and --record
 * belong to the live-agent hub and the capture reader; until they are linked in, they fail with
 * exit status 2 and a clear message. They reach the hub through cm__main_attach below, the one
 * hook to fill: it receives the parsed request and attaches its sources to the host.
 *
 * Exit status: the script's cm.exit(status) or os.exit(status); 1 when the script failed to load
 * or raised an error at top level; 2 for usage errors and unavailable features; 130 on SIGINT.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "cuptimon.h"
#include "cuptimon_host.h"

#define EXIT_USAGE 2

/* What the command line asks for beyond running a script in-process. */
typedef struct cm__main_request {
  char **cmd;          /* argv of the command after `--`, or NULL */
  int cmd_argc;
  const char *replay;  /* --replay FILE */
  const char *record;  /* --record FILE */
} cm__main_request;

/* The hook for the hub and the capture reader: attach the sources that serve `req` to the host
 * (spawning the command, opening the capture). Returns 0 or a CM_E* code. This build has no hub,
 * so it refuses; the hub's file replaces this definition. */
__attribute__((weak)) int cm__main_attach(cm_host *h, uv_loop_t *loop, const cm__main_request *req);
__attribute__((weak)) int cm__main_attach(cm_host *h, uv_loop_t *loop, const cm__main_request *req) {
  (void)h, (void)loop, (void)req;
  return CM_ENOSYS;
}

static void usage(FILE *out) {
  fprintf(out,
"Usage: cuptimon-lua [options] script.lua [script args...] [-- cmd args...]\n"
"       cuptimon-lua [options] -e 'lua chunk' [-e ...] [-- cmd args...]\n"
"       cuptimon-lua --check script.lua\n"
"\n"
"Runs a Lua script that observes CUDA activity through CUPTI: kernels, memory copies, API calls,\n"
"NVTX ranges and more, delivered to the script as columns (FFI arrays) on a libuv event loop.\n"
"Without `-- cmd`, the script observes this process through the in-process engine (useful for\n"
"embedding and for tests with the fake CUPTI).\n"
"\n"
"Options:\n"
"  -e CHUNK          run the Lua chunk CHUNK (repeatable; runs before the script, if any)\n"
"  --check           load the script and validate its selections without tracing, then exit:\n"
"                    0 when it is valid, 1 with the message otherwise\n"
"  --replay FILE     run the script over a recorded capture instead of a live command\n"
"  --record FILE     also write everything observed to a capture FILE\n"
"  --lua-path DIR    load the cuptimon modules from DIR instead of the embedded copies\n"
"  -h, --help        show this help and exit\n"
"  -v, --version     show the versions of cuptimon, LuaJIT and libuv and exit\n"
"  --                the rest of the line is the command to run and monitor\n"
"\n"
"The script receives its arguments as `arg` (arg[0] is the script) and as `...`.\n"
"\n"
"Lua API (local cm = require \"cuptimon\"):\n"
"  cm.observe({ kernel = {\"name\",\"start\",\"stop\"}, memcpy = \"all\" }, function(b) ... end)\n"
"                    b.n records; b.start[i] typed columns (i from 0); b:str(\"name\", i)\n"
"  cm.configure{ flush_ms = 200, deliver_ms = 1000 }   cadences\n"
"  cm.every(ms, fn), cm.after(ms, fn)                   timers on the loop\n"
"  cm.flush{ sync = true, done = fn }                   deliver everything produced so far\n"
"  cm.on(\"exit\" | \"process_start\" | \"process_exit\" | \"error\", fn)\n"
"  cm.stats(), cm.exit(status)\n"
"  cm.count(), cm.summary(), cm.hist(), cm.lhist(min, max, step), cm.quantiles(),\n"
"  cm.count_by(), cm.sum_by(), cm.stats_by(), cm.topk(k)   aggregations that print themselves\n"
"  require \"luv\" gives the same loop as the host.\n"
"\n"
"Examples:\n"
"  cuptimon-lua scripts/topk_kernels.lua -- python train.py\n"
"  cuptimon-lua -e 'local cm = require \"cuptimon\"; print(cm.version)'\n"
"  cuptimon-lua --check my_script.lua\n"
"  cuptimon-lua --replay run.cmcap scripts/timeline.lua\n"
"\n"
"Environment:\n"
"  CUPTIMON_LIBCUPTI   path of the libcupti to load (default: libcupti.so.13, CUDA_HOME,\n"
"                      /usr/local/cuda)\n"
"  CUPTIMON_LIBCUDA    path of the libcuda the fence uses (tests use the fake CUPTI here)\n"
"  CUDA_HOME           CUDA toolkit root, searched for libcupti\n"
"  CUPTIMON_LUA_PATH   a directory of cuptimon modules to use instead of the embedded ones\n"
"  CUPTIMON_LOG        engine log level printed on stderr: 0 errors, 1 warnings (default),\n"
"                      2 info, 3 debug\n"
"\n"
"Exit status: the script's cm.exit()/os.exit() status; 0 when the loop runs out of work;\n"
"1 on a script error; 2 on a usage error or an unavailable feature; 130 after Control-C.\n");
}

static void version(void) {
  printf("cuptimon-lua %s (LuaJIT, libuv %s)\n", cm_version(), uv_version_string());
}

static cm_host *g_host;
static int g_signalled;

static void on_signal(uv_signal_t *s, int signum) {
  if (g_signalled++) {
    /* A second Control-C while the exit hooks run: leave now. */
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
               strcmp(a, "--lua-path") == 0) {
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
        req.replay = v;
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
  if (!script && nchunks == 0) {
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
  int wants_hub = req.cmd || req.replay || req.record;
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
    if (rc == CM_ENOSYS) {
      fprintf(stderr,
              "cuptimon-lua: %s is not available yet in this build (the live-agent hub and the "
              "capture reader are not linked in); run the script without it to observe this "
              "process in-process\n",
              req.cmd ? "`-- cmd`" : req.replay ? "--replay" : "--record");
      cm_host_free(h);
      uv_loop_close(&loop);
      return EXIT_USAGE;
    }
    if (rc) {
      fprintf(stderr, "cuptimon-lua: %s: %s\n", cm_strerror(rc), cm_errmsg());
      cm_host_free(h);
      uv_loop_close(&loop);
      return 1;
    }
  }

  int failed = 0;
  for (int c = 0; c < nchunks && !failed; c++) failed = cm_host_eval(h, chunks[c], "=(-e)") != 0;
  if (!failed && script) failed = cm_host_run_script(h, script, script_argc, script_argv) != 0;

  int status = failed ? 1 : 0;
  if (!failed && !check) {
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
  int shut = cm_host_shutdown(h);
  if (!failed) status = requested ? asked : shut;
  /* Errors in callbacks were reported as they happened; without an explicit status they make
   * the run fail, so a broken script never looks like a clean one. */
  if (!requested && status == 0 && cm_host_error_count(h)) status = 1;
  cm_host_free(h);
  uv_walk(&loop, close_walk, NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  fflush(stdout);
  return status;
}
