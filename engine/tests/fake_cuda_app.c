/*
 * fake_cuda_app.c: a stand-in for a CUDA program, for the agent's end-to-end tests.
 *
 * It does what the CUDA driver does with CUDA_INJECTION64_PATH: dlopen the named library and call
 * its InitializeInjection() (twice, to check that the second call is harmless). Then it runs a
 * scripted workload through the fake CUPTI (linked in, and the same copy the agent's engine loads
 * through CUPTIMON_LIBCUPTI) and prints what it wrote as one line of key=value pairs, which the
 * tests compare with what reached the monitor or the capture:
 *
 *   fake_cuda_app: pid=1234 init=1 records=1000000 concurrent_kernel=250000 memcpy=250000 ...
 *
 * Workload: producer t (of --threads) writes records 0..per_thread-1, record j having kind
 * kinds[j % nkinds] and content fake_gen_record(kind, t, j), exactly like fake_run_workload, so a
 * test can regenerate every record. This loop is the fake's own producer loop, repeated here so
 * that the records actually written are counted per kind (a record of a kind that is not enabled
 * is not written and not counted). --rounds repeats the workload with --pause-ms between rounds,
 * so that a monitor can act in the middle of a run.
 *
 * With --control PATH it runs windows on request instead, for the dormant agent's attach tests:
 * it takes each request N of the control file PATH (window_control.h), writes N records (as one
 * round of --records N), and acknowledges with "written=W total=T" (W records written in this
 * window, T since the start).
 *
 * Options: --records N (total per round, split over the threads) --threads T --kinds k1,k2
 *          --rounds R --pause-ms P --linger-ms L (sleep after printing the line, before exiting)
 *          --control PATH (windows on request, above)
 *          --crash (abort() after the workload: no atexit handlers run)
 *          --flush-block-ms B (once the workload is done, every cuptiActivityFlushAll blocks B ms:
 *          the exit's flushes, as under a backlog on a GPU); --forced-flush-block-ms B, only the
 *          forced ones
 *          --backlog-ms B (once the workload is done, CUPTI's flushes complete no buffer for B ms:
 *          CUPTI behind by B ms at exit)
 *          --completion-delay-us U (CUPTI's completion thread waits U us before it completes each
 *          buffer: CUPTI behind on completing its buffers, holding more and more of them, as a
 *          GPU's CUPTI can under sustained load)
 *          --kernel-backlog N (kernel records are held when made, and each cuptiActivityFlushAll
 *          writes at most N of them: CUPTI behind on kernel records alone)
 *          --default-flush-full-only (once the workload is done, default flushes return no partly
 *          filled buffer: only a forced flush returns those, as at a long run's exit)
 *          --pending (kernel records are written still running: they complete at the next
 *          synchronize, and a forced flush before it delivers them with end 0, as CUPTI does)
 *          --exit-code C (the status of a normal exit, through exit(), so atexit handlers run)
 *          --stamp (print "fake_cuda_app: exit_mono_ns=T", CLOCK_MONOTONIC in ns, just before
 *          exit(), for the time-to-a-table measurement: bench/time_to_table_fake.sh)
 *          --teardown-ms D (an exit handler registered before the agent's, so it runs after it,
 *          sleeps D ms: the stand-in for the CUDA runtime's and driver's teardown at exit)
 *          --teardown-abort (that handler then calls abort(): a process that fails in teardown)
 *          --rate R (records per second over all threads, paced every 1024 records; 0, the
 *          default, is as fast as the threads go: bench/pipeline_rate.sh offers rates with it)
 *          --slow-round R (in round R, from 1, the kernels named --slow-kernel, default vectorAdd,
 *          last --slow-factor times longer, default 20: a kernel made slow on purpose)
 *          --pm N (each round also puts N PM samples of 1 ms on device 0, the first one starting
 *          at the round's start, and one kernel record inside each sample: "pm_kernel_a" in even
 *          samples, "pm_kernel_b" in odd ones, for the join of samples and kernels).
 *
 * Steady launches at known rates, for the duty cycle's estimates (spec/duty_spec.lua): --steady-ms
 * D replaces the workload by D ms in which one thread launches a kernel "steady_kernel" on
 * device 0 at --kernel-rate R per second (default 2000), each lasting --kernel-us U (default 50,
 * fake clock), paced to absolute times (a stall of more than 20 ms is skipped, not made up by a
 * burst, so the report's launched / steady_ms is the true rate), and after every
 * --copy-every K kernels (default 10; 0 for none) a host-to-device copy of --copy-bytes B bytes
 * (default 1048576) lasting U/2. From --phase-ms P on the kernel rate is --phase-factor F times R
 * (a phase change). With --poisson-seed S (not 0) the launches are a Poisson process instead:
 * the gaps are exponential with mean 1/R, drawn from a generator seeded with S, so that the counts
 * of the windows spread as a real workload's do (the true rate is still launched / steady_ms).
 * Each launch is wrapped in a runtime call (its API callbacks fire, as a real launch's do), and
 * --busy-threads N adds N threads that make a runtime call every 200 us for the whole run, so
 * that N + 1 threads call the runtime at once. With --graph-every K every K-th launch is also a
 * launch of a CUDA graph (cuGraphLaunch's driver callbacks fire, while CUPTI is attached). With --hidden-kernel NAME each launch of
 * steady_kernel that finds kernel
 * tracing off also launches NAME, a kernel that therefore runs only while tracing is off. The
 * line reports the launches and records written, and kernel_segments / memcpy_segments: the
 * records written in each run of launches that found the kind traced, in order, which are the
 * duty cycle's windows one by one (at most 4096 are listed), with --phase-ms also
 * kernel_segments_after: how many of each run's records were launched from --phase-ms on (a run
 * with some but not all of them spans the phase change), the fake CUPTI's finalize counters
 * (finalize, finalize_in_callback, finalize_lost, finalize_buffers, calls_finalized: see
 * fake_stats) and subscribes, and flushes_off: the
 * cuptiActivityFlushAll calls made while kernel tracing was off (between two launches that both
 * found it off), which an agent idle between windows does not make.
 *
 * Training steps, for the ranks recipe: --steps N replaces the workload by N steps, each an NVTX
 * range "step" (markers) around a compute kernel "fake_train_kernel" and a communication kernel
 * "ncclDevKernel_AllReduce_Sum_f32_RING_LL", on device --device D. A step lasts --step-us U
 * (default 2000) plus --extra-us E (the process's own slowness, added to the compute kernel) plus
 * --wait-us W (time spent waiting for the other ranks, added to the communication kernel), with
 * timestamps from the fake clock; --pause-ms P sleeps between steps; --no-comm leaves the
 * communication kernel out (a job of independent processes, as on one GPU without NCCL). The line then reports
 * steps=N and the kernels written.
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_cupti.h"
#include "window_control.h"

static const struct {
  const char *name;
  int kind;
} kind_names[] = {
    {"concurrent_kernel", 10}, {"kernel", 10},       {"memcpy", 1},           {"memset", 2},
    {"runtime", 5},            {"driver", 4},        {"synchronization", 38}, {"marker", 12},
    {"marker_data", 13},       {"memcpy2", 22},      {"cuda_event", 36},      {"overhead", 17},
    {"external_correlation", 39}, {"graph_trace", 51}, {"memory2", 49},       {"memory_pool", 50},
    {"device", 8},             {"context", 9},       {"name", 11},            {"stream", 37},
    {"environment", 20},
};

static int kind_by_name(const char *s) {
  for (size_t i = 0; i < sizeof kind_names / sizeof kind_names[0]; i++)
    if (strcmp(kind_names[i].name, s) == 0) return kind_names[i].kind;
  char *end;
  long v = strtol(s, &end, 10);
  return (*s && !*end && v > 0 && v < 64) ? (int)v : -1;
}

static const char *kind_name(int kind) {
  for (size_t i = 0; i < sizeof kind_names / sizeof kind_names[0]; i++)
    if (kind_names[i].kind == kind) return kind_names[i].name;
  return "unknown";
}

typedef struct producer {
  pthread_t tid;
  uint32_t thread;
  uint64_t n;
  const int *kinds;
  int nkinds;
  double rate;       /* records per second for this thread, 0 for no pacing */
  uint64_t written[64];
  int failed;
  const char *slow_kernel; /* NULL, or the kernel made slow this round */
  uint64_t slow_factor;
} producer;

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --pending: kernel records are written still running (fake_emit's `pending`). */
static int g_pending_kernels;

static void *produce(void *arg) {
  producer *p = arg;
  uint64_t buf[64];
  double t0 = mono_s();
  for (uint64_t j = 0; j < p->n; j++) {
    if (p->rate > 0 && (j & 1023) == 0) {
      double ahead = (double)j / p->rate - (mono_s() - t0);
      if (ahead > 0) usleep((useconds_t)(ahead * 1e6));
    }
    int kind = p->kinds[j % (uint64_t)p->nkinds];
    size_t sz = fake_gen_record(kind, p->thread, j, buf);
    if (!sz) {
      p->failed = 1;
      return NULL;
    }
    if (p->slow_kernel) fake_stretch_kernel(buf, p->slow_kernel, p->slow_factor);
    /* With --pending, a kernel record is still running when written (end 0 until the next
     * synchronize), as a real kernel's is until it completes. */
    int pending = g_pending_kernels && kind == 10; /* CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL */
    if (fake_emit(buf, sz, pending) == 0) p->written[kind]++;
  }
  return NULL;
}

static unsigned g_teardown_ms;
static int g_teardown_abort;

/* Runs after the agent's exit handler (exit handlers run in reverse order of registration). */
static void teardown(void) {
  usleep((useconds_t)g_teardown_ms * 1000);
  if (g_teardown_abort) abort();
}

/* One round: `records` records over `threads` producers (paced at `rate` records per second in
 * all, 0 for no pacing), with `slow_kernel` (NULL: none) made
 * slow_factor times longer; adds what was written to per_kind and *total. Returns 0, or 3 (the
 * app's failure status). */
static int run_round(uint64_t records, int threads, double rate, const int *kinds, int nkinds,
                     const char *slow_kernel, uint64_t slow_factor, uint64_t *per_kind,
                     uint64_t *total) {
  producer *ps = calloc((size_t)threads, sizeof *ps);
  if (!ps) return 3;
  for (int t = 0; t < threads; t++) {
    ps[t].thread = (uint32_t)t;
    ps[t].n = records / (uint64_t)threads + ((uint64_t)t < records % (uint64_t)threads);
    ps[t].kinds = kinds;
    ps[t].nkinds = nkinds;
    ps[t].rate = rate / threads;
    ps[t].slow_kernel = slow_kernel;
    ps[t].slow_factor = slow_factor;
    if (pthread_create(&ps[t].tid, NULL, produce, &ps[t]) != 0) {
      fprintf(stderr, "fake_cuda_app: pthread_create failed\n");
      return 3;
    }
  }
  int rc = 0;
  for (int t = 0; t < threads; t++) {
    pthread_join(ps[t].tid, NULL);
    if (ps[t].failed) rc = 3;
    for (int k = 0; k < 64; k++) {
      per_kind[k] += ps[t].written[k];
      *total += ps[t].written[k];
    }
  }
  free(ps);
  if (rc) fprintf(stderr, "fake_cuda_app: the generator does not know a kind\n");
  return rc;
}

/* Serves windows on request through the file `path` (window_control.h). Returns 0 on "quit". */
static int serve_windows(const char *path, int threads, const int *kinds, int nkinds,
                         uint64_t *per_kind, uint64_t *total) {
  long long n;
  while ((n = cm_window_next(path)) >= 0) {
    uint64_t before = *total;
    int rc = run_round((uint64_t)n, threads, 0, kinds, nkinds, NULL, 0, per_kind, total);
    if (rc) return rc;
    char line[96];
    snprintf(line, sizeof line, "written=%llu total=%llu\n", (unsigned long long)(*total - before),
             (unsigned long long)*total);
    if (cm_window_ack(path, line) != 0) return 3;
  }
  return 0;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void usage(void) {
  fprintf(stderr, "usage: fake_cuda_app [--records N] [--threads T] [--kinds k1,k2] [--rounds R] "
                  "[--pause-ms P] [--linger-ms L] [--flush-block-ms B] [--backlog-ms B] [--kernel-backlog N] [--completion-delay-us U] [--default-flush-full-only] [--pending] [--crash] [--exit-code C] [--slow-round R] "
                  "[--slow-factor F] [--slow-kernel NAME] [--pm N] "
                  "[--stamp] [--teardown-ms D] [--teardown-abort] [--rate R]\n"
                  "       fake_cuda_app --steps N [--step-us U] [--extra-us E] [--wait-us W] "
                  "[--device D] [--pause-ms P] [--no-comm]\n"
                  "       fake_cuda_app --steady-ms D [--kernel-rate R] [--kernel-us U] "
                  "[--copy-every K] [--copy-bytes B] [--phase-ms P] [--phase-factor F] "
                  "[--poisson-seed S] [--hidden-kernel NAME] [--busy-threads N] [--graph-every K]\n"
                  "       fake_cuda_app --control PATH [--threads T] [--kinds k1,k2]\n");
  exit(2);
}

/* Writes one record; counts it in *written when the fake took it. */
static void emit(const void *rec, size_t size, uint64_t *written) {
  if (fake_emit(rec, size, 0) == 0) (*written)++;
}

/* The --steps workload (see the header); returns the kernels written. The compute kernel takes
 * half of the step's base length plus `extra`, the communication kernel a fifth plus `wait`. */
static uint64_t run_steps(int steps, uint64_t step_ns, uint64_t extra_ns, uint64_t wait_ns,
                          uint32_t device, int pause_ms, int no_comm, uint64_t *markers) {
  uint64_t buf[32], kernels = 0;
  uint64_t t = fake_now();
  const uint32_t tid = 100;
  for (int i = 0; i < steps; i++) {
    if (i && pause_ms) usleep((useconds_t)pause_ms * 1000);
    uint64_t k0 = t + step_ns / 10, k1 = k0 + step_ns / 2 + extra_ns;
    uint64_t c0 = k1 + step_ns / 20, c1 = c0 + step_ns / 5 + wait_ns;
    uint64_t end = t + step_ns + extra_ns + wait_ns;
    uint32_t id = (uint32_t)i + 1, corr = 2 * (uint32_t)i + 1;
    emit(buf, fake_make_marker(buf, 1, t, id, tid, "step"), markers);
    emit(buf, fake_make_kernel(buf, "fake_train_kernel", device, 7, k0, k1, corr), &kernels);
    if (!no_comm)
      emit(buf, fake_make_kernel(buf, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", device, 13, c0, c1,
                                 corr + 1), &kernels);
    emit(buf, fake_make_marker(buf, 0, end, id, tid, NULL), markers);
    t = end + step_ns / 100;
  }
  return kernels;
}

/* The records written in each run of successful emits of one kind (the steady mode's windows),
 * and of those, the ones emitted from --phase-ms on (`after`). */
#define MAX_SEGMENTS 4096
typedef struct segments {
  uint64_t cur, cur_after, n, v[MAX_SEGMENTS], after[MAX_SEGMENTS];
} segments;

static void seg_note(segments *s, int written, int after) {
  if (written) {
    s->cur++;
    s->cur_after += after != 0;
  } else if (s->cur) {
    if (s->n < MAX_SEGMENTS) {
      s->after[s->n] = s->cur_after;
      s->v[s->n++] = s->cur;
    }
    s->cur = s->cur_after = 0;
  }
}

/* " NAME_segments=..." and, with `after`, " NAME_segments_after=..." (the same runs' records
 * emitted from --phase-ms on). */
static void seg_print(const char *name, segments *s, int after) {
  seg_note(s, 0, 0);
  printf(" %s_segments=", name);
  for (uint64_t i = 0; i < s->n; i++) printf("%s%llu", i ? "," : "", (unsigned long long)s->v[i]);
  if (!after) return;
  printf(" %s_segments_after=", name);
  for (uint64_t i = 0; i < s->n; i++)
    printf("%s%llu", i ? "," : "", (unsigned long long)s->after[i]);
}

static void sleep_until(double t_s) {
  double now = mono_s();
  if (t_s > now) usleep((useconds_t)((t_s - now) * 1e6));
}

/* CUPTI's runtime callback ids (cupti_runtime_cbid.h) of the calls the steady workload makes:
 * cudaStreamQuery_v3020 and cudaLaunchKernel_v7000. */
enum { CBID_cudaStreamQuery = 132, CBID_cudaLaunchKernel = 211 };

/* The --busy-threads threads: runtime calls without work until `steady_stop`. */
static atomic_int steady_stop;
static void *busy_main(void *arg) {
  (void)arg;
  while (!atomic_load(&steady_stop)) {
    fake_runtime_call(CBID_cudaStreamQuery);
    usleep(200);
  }
  return NULL;
}

/* The --steady-ms workload (see the header). Returns the process's exit status. */
static int run_steady(int init, double ms, double rate, uint64_t kernel_us, int copy_every,
                      uint64_t copy_bytes, double phase_ms, double phase_factor,
                      uint64_t poisson_seed, const char *hidden, int linger_ms, int exit_code,
                      int busy_threads, int graph_every) {
  static segments ks, cs;
  pthread_t busy[64];
  if (busy_threads > 64) busy_threads = 64;
  for (int i = 0; i < busy_threads; i++)
    if (pthread_create(&busy[i], NULL, busy_main, NULL) != 0) busy_threads = i;
  uint64_t rng = poisson_seed;
  uint64_t buf[32], launched = 0, kernels = 0, copies = 0, dropped = 0, hidden_launched = 0,
                    hidden_written = 0;
  double t0 = mono_s(), t = t0;
  uint64_t flushes_off = 0, prev_flushes = 0;
  int prev_off = 0;
  fake_stats fs;
  while (t - t0 < ms / 1e3) {
    sleep_until(t);
    uint64_t s0 = fake_now();
    uint32_t corr = (uint32_t)(launched + 1);
    int rc = fake_emit(buf, fake_make_kernel(buf, "steady_kernel", 0, 7, s0, s0 + kernel_us * 1000,
                                             corr), 0);
    fake_runtime_call(CBID_cudaLaunchKernel);
    launched++;
    if (graph_every > 0 && launched % (uint64_t)graph_every == 0) fake_graph_launch(NULL, 1);
    if (rc == 1) dropped++;
    kernels += rc == 0;
    /* A launch due from --phase-ms on is after the phase change; the gaps from it on are the
     * phase's. */
    int after = phase_ms > 0 && (t - t0) * 1e3 >= phase_ms;
    seg_note(&ks, rc == 0, after);
    /* cuptiActivityFlushAll calls between two launches that both found kernel off. */
    fake_get_stats(&fs);
    if (rc == 2 && prev_off) flushes_off += fs.flushes - prev_flushes;
    prev_flushes = fs.flushes;
    prev_off = rc == 2;
    if (rc == 2 && hidden) {
      hidden_launched++;
      if (fake_emit(buf, fake_make_kernel(buf, hidden, 0, 7, s0, s0 + kernel_us * 1000, corr), 0) == 0)
        hidden_written++;
    }
    if (copy_every > 0 && launched % (uint64_t)copy_every == 0) {
      uint64_t c0 = s0 + kernel_us * 1000;
      int crc = fake_emit(buf, fake_make_memcpy(buf, 1, copy_bytes, 0, c0, c0 + kernel_us * 500,
                                                corr), 0);
      if (crc == 1) dropped++;
      copies += crc == 0;
      seg_note(&cs, crc == 0, 0);
    }
    double r = after ? rate * phase_factor : rate;
    if (poisson_seed) {
      /* xorshift64*, then an exponential gap from a uniform in (0, 1]. */
      rng ^= rng >> 12;
      rng ^= rng << 25;
      rng ^= rng >> 27;
      double u = (double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
      t += -log(1.0 - u) / r;
    } else {
      t += 1.0 / r;
    }
    /* A stall (a shared, loaded machine) is not made up by a burst: the schedule moves on, so
     * the launches stay evenly spread; the true rate is launched / steady_ms either way. */
    double now = mono_s();
    if (now - t > 0.02) t = now;
  }
  atomic_store(&steady_stop, 1);
  for (int i = 0; i < busy_threads; i++) pthread_join(busy[i], NULL);
  fake_get_stats(&fs);
  printf("fake_cuda_app: pid=%d init=%d steady_ms=%.0f launched=%llu concurrent_kernel=%llu "
         "memcpy=%llu dropped=%llu hidden_launched=%llu hidden_written=%llu flushes_off=%llu "
         "finalize=%llu finalize_in_callback=%llu finalize_lost=%llu finalize_buffers=%llu "
         "calls_finalized=%llu subscribes=%llu finalize_in_runtime=%llu",
         (int)getpid(), init, (mono_s() - t0) * 1e3, (unsigned long long)launched,
         (unsigned long long)kernels, (unsigned long long)copies, (unsigned long long)dropped,
         (unsigned long long)hidden_launched, (unsigned long long)hidden_written,
         (unsigned long long)flushes_off, (unsigned long long)fs.finalize_calls,
         (unsigned long long)fs.finalize_in_callback, (unsigned long long)fs.finalize_lost_records,
         (unsigned long long)fs.finalize_held_buffers, (unsigned long long)fs.calls_while_finalized,
         (unsigned long long)fs.subscribes, (unsigned long long)fs.finalize_in_runtime);
  seg_print("kernel", &ks, phase_ms > 0);
  seg_print("memcpy", &cs, 0);
  printf("\n");
  fflush(stdout);
  if (linger_ms) usleep((useconds_t)linger_ms * 1000);
  exit(exit_code);
}

int main(int argc, char **argv) {
  uint64_t records = 1000;
  double rate = 0;
  int threads = 1, rounds = 1, pause_ms = 0, linger_ms = 0, crash = 0, exit_code = 0, stamp = 0;
  int busy_threads = 0;
  int graph_every = 0;
  int flush_block_ms = 0;
  int backlog_ms = 0, kernel_backlog = 0;
  bool full_only = false;
  int slow_round = 0;
  uint64_t slow_factor = 20;
  const char *slow_kernel = "vectorAdd";
  int pm = 0;
  int kinds[64], nkinds = 0;
  const char *control = NULL;
  int steps = 0, device = 0, no_comm = 0;
  uint64_t step_us = 2000, extra_us = 0, wait_us = 0;
  double steady_ms = 0, kernel_rate = 2000, phase_ms = 0, phase_factor = 1;
  uint64_t kernel_us = 50, copy_bytes = 1048576;
  int copy_every = 10;
  uint64_t poisson_seed = 0;
  const char *hidden = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--crash") == 0) {
      crash = 1;
      continue;
    }
    if (strcmp(a, "--no-comm") == 0) {
      no_comm = 1;
      continue;
    }
    if (strcmp(a, "--teardown-abort") == 0) {
      g_teardown_abort = 1;
      continue;
    }
    if (strcmp(a, "--stamp") == 0) {
      stamp = 1;
      continue;
    }
    if (strcmp(a, "--default-flush-full-only") == 0) {
      full_only = true;
      continue;
    }
    if (strcmp(a, "--pending") == 0) {
      g_pending_kernels = 1;
      continue;
    }
    if (!v) usage();
    i++;
    if (strcmp(a, "--records") == 0) {
      records = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--threads") == 0) {
      threads = atoi(v);
    } else if (strcmp(a, "--rounds") == 0) {
      rounds = atoi(v);
    } else if (strcmp(a, "--pause-ms") == 0) {
      pause_ms = atoi(v);
    } else if (strcmp(a, "--linger-ms") == 0) {
      linger_ms = atoi(v);
    } else if (strcmp(a, "--flush-block-ms") == 0) {
      flush_block_ms = atoi(v);
    } else if (strcmp(a, "--forced-flush-block-ms") == 0) {
      flush_block_ms = atoi(v);
      fake_set_flush_block_forced_only(1);
    } else if (strcmp(a, "--backlog-ms") == 0) {
      backlog_ms = atoi(v);
    } else if (strcmp(a, "--kernel-backlog") == 0) {
      kernel_backlog = atoi(v);
    } else if (strcmp(a, "--completion-delay-us") == 0) {
      fake_set_completion_delay_us((uint32_t)atoi(v));
    } else if (strcmp(a, "--rate") == 0) {
      rate = strtod(v, NULL);
    } else if (strcmp(a, "--teardown-ms") == 0) {
      g_teardown_ms = (unsigned)atoi(v);
    } else if (strcmp(a, "--control") == 0) {
      control = v;
    } else if (strcmp(a, "--slow-round") == 0) {
      slow_round = atoi(v);
    } else if (strcmp(a, "--slow-factor") == 0) {
      slow_factor = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--slow-kernel") == 0) {
      slow_kernel = v;
    } else if (strcmp(a, "--pm") == 0) {
      pm = atoi(v);
    } else if (strcmp(a, "--exit-code") == 0) {
      exit_code = atoi(v);
    } else if (strcmp(a, "--steps") == 0) {
      steps = atoi(v);
    } else if (strcmp(a, "--step-us") == 0) {
      step_us = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--extra-us") == 0) {
      extra_us = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--wait-us") == 0) {
      wait_us = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--steady-ms") == 0) {
      steady_ms = strtod(v, NULL);
    } else if (strcmp(a, "--kernel-rate") == 0) {
      kernel_rate = strtod(v, NULL);
    } else if (strcmp(a, "--kernel-us") == 0) {
      kernel_us = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--copy-every") == 0) {
      copy_every = atoi(v);
    } else if (strcmp(a, "--copy-bytes") == 0) {
      copy_bytes = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--phase-ms") == 0) {
      phase_ms = strtod(v, NULL);
    } else if (strcmp(a, "--poisson-seed") == 0) {
      poisson_seed = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--phase-factor") == 0) {
      phase_factor = strtod(v, NULL);
    } else if (strcmp(a, "--busy-threads") == 0) {
      busy_threads = atoi(v);
    } else if (strcmp(a, "--graph-every") == 0) {
      graph_every = atoi(v);
    } else if (strcmp(a, "--hidden-kernel") == 0) {
      hidden = v;
    } else if (strcmp(a, "--device") == 0) {
      device = atoi(v);
    } else if (strcmp(a, "--kinds") == 0) {
      char *copy = strdup(v), *save = NULL;
      for (char *t = strtok_r(copy, ",", &save); t && nkinds < 64; t = strtok_r(NULL, ",", &save)) {
        int k = kind_by_name(t);
        if (k < 0) {
          fprintf(stderr, "fake_cuda_app: unknown kind '%s'\n", t);
          return 2;
        }
        kinds[nkinds++] = k;
      }
      free(copy);
    } else {
      usage();
    }
  }
  if (threads < 1 || threads > 256 || rounds < 1 || steps < 0 || device < 0 || step_us < 100)
    usage();
  if (nkinds == 0) {
    kinds[0] = 10;
    kinds[1] = 1;
    kinds[2] = 5;
    nkinds = 3;
  }

  if (g_teardown_ms || g_teardown_abort) atexit(teardown);
  /* What the driver does inside cuInit. */
  int init = -1;
  const char *inj = getenv("CUDA_INJECTION64_PATH");
  if (inj && *inj) {
    void *h = dlopen(inj, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      fprintf(stderr, "fake_cuda_app: dlopen %s: %s\n", inj, dlerror());
      return 3;
    }
    int (*fn)(void) = NULL;
    *(void **)&fn = dlsym(h, "InitializeInjection");
    if (!fn) {
      fprintf(stderr, "fake_cuda_app: no InitializeInjection in %s\n", inj);
      return 3;
    }
    init = fn();
    if (fn() != init) {
      fprintf(stderr, "fake_cuda_app: a second InitializeInjection returned something else\n");
      return 3;
    }
  }

  if (steady_ms > 0) {
    if (kernel_rate <= 0 || phase_factor <= 0 || copy_every < 0) usage();
    return run_steady(init, steady_ms, kernel_rate, kernel_us, copy_every, copy_bytes, phase_ms,
                      phase_factor, poisson_seed, hidden, linger_ms, exit_code, busy_threads,
                      graph_every);
  }

  if (steps > 0) {
    uint64_t markers = 0;
    uint64_t kernels = run_steps(steps, step_us * 1000, extra_us * 1000, wait_us * 1000,
                                 (uint32_t)device, pause_ms, no_comm, &markers);
    printf("fake_cuda_app: pid=%d init=%d steps=%d concurrent_kernel=%llu marker=%llu\n",
           (int)getpid(), init, steps, (unsigned long long)kernels, (unsigned long long)markers);
    fflush(stdout);
    if (linger_ms) usleep((useconds_t)linger_ms * 1000);
    exit(exit_code);
  }

  uint64_t per_kind[64] = {0}, total = 0;
  if (kernel_backlog) fake_set_kernel_backlog(kernel_backlog);
  double t0 = now_ms();
  if (control) {
    int rc = serve_windows(control, threads, kinds, nkinds, per_kind, &total);
    if (rc) return rc;
  }
  for (int r = 0; r < rounds && !control; r++) {
    if (r && pause_ms) usleep((useconds_t)pause_ms * 1000);
    int rc = run_round(records, threads, rate, kinds, nkinds, r + 1 == slow_round ? slow_kernel : NULL,
                       slow_factor, per_kind, &total);
    if (rc) return rc;
    if (pm > 0) {
      uint64_t t = fake_now();
      fake_pm_emit(0, (uint32_t)pm, t, 1000000);
      for (int i = 0; i < pm; i++) {
        uint64_t s0 = t + (uint64_t)i * 1000000u;
        if (fake_emit_kernel(i % 2 ? "pm_kernel_b" : "pm_kernel_a", 0, s0 + 100000, s0 + 600000) == 0) {
          per_kind[10]++;
          total++;
        }
      }
    }
  }
  double t1 = now_ms();

  printf("fake_cuda_app: pid=%d init=%d records=%llu", (int)getpid(), init,
         (unsigned long long)total);
  for (int k = 0; k < 64; k++) {
    bool listed = false;
    for (int i = 0; i < nkinds; i++) listed |= kinds[i] == k;
    if (listed) printf(" %s=%llu", kind_name(k), (unsigned long long)per_kind[k]);
  }
  printf(" workload_ms=%.0f\n", t1 - t0);
  fflush(stdout);
  if (linger_ms) usleep((useconds_t)linger_ms * 1000);
  if (flush_block_ms) fake_set_flush_block_ms(flush_block_ms);
  if (backlog_ms) fake_set_backlog_ms(backlog_ms);
  if (full_only) fake_set_default_flush_full_only(1);
  if (crash) abort();
  if (stamp) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("fake_cuda_app: exit_mono_ns=%llu\n",
           (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    fflush(stdout);
  }
  exit(exit_code);
}
