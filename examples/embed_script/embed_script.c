/*
 * embed_script.c: a program with its own libuv loop that runs a cuptimon Lua script in-process
 * through cuptimon_host.h: the script observes, the program works, the loop delivers.
 *
 * Design note. The program owns the loop; the host adds the script's handles to it (luv shares
 * it). A program timer produces work (here the fake CUPTI's generator; a real program launches
 * kernels), and the script's cadence delivers batches on the loop thread. After a few rounds the
 * program shuts the host down: a final sync flush, then the script's exit hooks print.
 *
 *   CUPTIMON_LIBCUPTI=libfake_cupti.so CUPTIMON_LIBCUDA=libfake_cupti.so \
 *     ./embed_script script.lua
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <uv.h>

#include "cuptimon_host.h"

typedef int64_t (*workload_fn)(int, uint64_t, const int *, int);

typedef struct app {
  cm_host *host;
  workload_fn run;
  int rounds;
  int64_t written;
} app;

static void work(uv_timer_t *t) {
  app *a = t->data;
  int kind = CM_KIND_CONCURRENT_KERNEL;
  if (a->run) a->written += a->run(1, 1000, &kind, 1);
  if (++a->rounds == 5) {
    uv_timer_stop(t);
    uv_close((uv_handle_t *)t, NULL);
    printf("embed_script: the program wrote %lld kernel records\n", (long long)a->written);
    cm_host_shutdown(a->host); /* final flush, exit hooks, uv_stop */
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: embed_script script.lua [args]\n");
    return 2;
  }
  uv_loop_t loop;
  uv_loop_init(&loop);
  app a = {0};
  int rc = cm_host_new(&a.host, &loop, NULL);
  if (rc) {
    fprintf(stderr, "embed_script: %s\n", cm_strerror(rc));
    return 1;
  }
  if (cm_host_run_script(a.host, argv[1], argc - 2, argv + 2)) {
    cm_host_free(a.host);
    return 1;
  }
  /* The script's first observer created the engine, which loaded CUPTI. */
  const char *fake = getenv("CUPTIMON_LIBCUPTI");
  void *lib = fake ? dlopen(fake, RTLD_NOW | RTLD_NOLOAD) : NULL;
  /* POSIX's sanctioned way to turn dlsym's object pointer into a function pointer. */
  if (lib) *(void **)&a.run = dlsym(lib, "fake_run_workload");

  uv_timer_t timer;
  uv_timer_init(&loop, &timer);
  timer.data = &a;
  uv_timer_start(&timer, work, 10, 10);
  uv_run(&loop, UV_RUN_DEFAULT);

  int status = cm_host_shutdown(a.host);
  if (cm_host_error_count(a.host)) status = 1;
  cm_host_free(a.host);
  uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  if (lib) dlclose(lib);
  return status;
}
