/*
 * gpu_correlation.cu: external correlation, subscriber callbacks and resource events on a real GPU.
 *
 * Design. Two host threads each create a stream and run a fixed pattern of nested pushes and pops
 * around real kernel launches: push A, launch, push B, launch, pop B, launch, pop A (four times).
 * A RUNTIME callback handler, armed on cudaLaunchKernel (and its per-thread-stream variant), counts
 * the API-enter sites and stores the launch's correlation id in a thread-local, so each thread
 * knows, for each of its launches, the correlation id and the chain it expects (innermost first).
 * After one sync flush:
 *   - the enter count equals the number of launches exactly;
 *   - every expected launch has a kernel record, and cm_corr_join_chains maps it to exactly the
 *     expected chain (untagged launches map to nothing);
 *   - the two streams' creation arrived as "resource" records (event STREAM_CREATED) carrying
 *     the stream handles the threads got back from cudaStreamCreate.
 * Observer callbacks run on the flushing thread or the decode worker; their state is guarded by a
 * mutex and read by the main thread only after the flush returned.
 *
 * Output: one "[PASS]"/"[FAIL]" line per check and a final "RESULT:" line. Exit status: 0 when
 * every check passes, 1 when one fails, 77 when there is no CUDA device.
 */
#include <cuda_runtime.h>
#include <cupti_callbacks.h>
#include <cupti_runtime_cbid.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "cuptimon.h"

enum { kThreads = 2, kReps = 4 };

__global__ void tiny_kernel(int *p) {
  if (p) p[threadIdx.x] += 1;
}

static int g_failures = 0;

static void check(bool ok, const char *name, const char *fmt = "", long long a = 0,
                  long long b = 0) {
  char detail[160];
  snprintf(detail, sizeof detail, fmt, a, b);
  printf("[%s] %-52s %s\n", ok ? "PASS" : "FAIL", name, detail);
  if (!ok) g_failures++;
}

/* ---- the RUNTIME callback ------------------------------------------------------------------ */

static std::atomic<long long> g_enters{0};
static thread_local uint32_t t_last_corr = 0;

static int on_launch(void *ud, int domain, uint32_t cbid, const void *cbdata) {
  (void)ud;
  (void)domain;
  (void)cbid;
  const CUpti_CallbackData *cd = static_cast<const CUpti_CallbackData *>(cbdata);
  if (cd && cd->callbackSite == CUPTI_API_ENTER) {
    g_enters.fetch_add(1);
    t_last_corr = cd->correlationId;
  }
  return 0;
}

/* ---- what the observer saw ----------------------------------------------------------------- */

static std::mutex g_mu;
static std::vector<uint32_t> g_kcorr;
static std::vector<uint32_t> g_ec_kind, g_ec_corr;
static std::vector<uint64_t> g_ec_ext;
static std::vector<uint32_t> g_res_event;
static std::vector<uint64_t> g_res_stream;

template <typename T>
static const T *column(const cm_batch *b, const char *name) {
  const cm_column *c = cm_batch_column(b, cm_field_by_name(b->kind, name));
  return c ? static_cast<const T *>(c->data) : nullptr;
}

static void observer(void *ud, const cm_batch *b) {
  (void)ud;
  std::lock_guard<std::mutex> lk(g_mu);
  if (b->kind == CM_KIND_CONCURRENT_KERNEL) {
    const uint32_t *c = column<uint32_t>(b, "correlation");
    for (uint32_t i = 0; c && i < b->n; i++) g_kcorr.push_back(c[i]);
  } else if (b->kind == CM_KIND_EXTERNAL_CORRELATION) {
    const uint32_t *k = column<uint32_t>(b, "external_kind");
    const uint32_t *c = column<uint32_t>(b, "correlation");
    const uint64_t *x = column<uint64_t>(b, "external_id");
    for (uint32_t i = 0; k && c && x && i < b->n; i++) {
      g_ec_kind.push_back(k[i]);
      g_ec_corr.push_back(c[i]);
      g_ec_ext.push_back(x[i]);
    }
  } else if (b->kind == CM_KIND_RESOURCE) {
    const uint32_t *ev = column<uint32_t>(b, "event");
    const uint64_t *st = column<uint64_t>(b, "stream");
    for (uint32_t i = 0; ev && st && i < b->n; i++) {
      g_res_event.push_back(ev[i]);
      g_res_stream.push_back(st[i]);
    }
  }
}

/* ---- the workload -------------------------------------------------------------------------- */

struct Launch {
  uint32_t corr;
  std::vector<uint64_t> chain; /* innermost first; empty when untagged */
};

struct Worker {
  cudaStream_t stream = nullptr;
  std::vector<Launch> launches;
  int errors = 0;
};

static void launch(Worker &w, int *buf, const std::vector<uint64_t> &stack) {
  t_last_corr = 0;
  tiny_kernel<<<1, 32, 0, w.stream>>>(buf);
  if (cudaGetLastError() != cudaSuccess || t_last_corr == 0) {
    w.errors++;
    return;
  }
  Launch l;
  l.corr = t_last_corr;
  l.chain.assign(stack.rbegin(), stack.rend());
  w.launches.push_back(l);
}

static void worker_main(Worker *w) {
  if (cudaStreamCreate(&w->stream) != cudaSuccess) {
    w->errors++;
    return;
  }
  int *buf = nullptr;
  if (cudaMalloc(&buf, 32 * sizeof(int)) != cudaSuccess) w->errors++;
  for (int r = 0; r < kReps; r++) {
    std::vector<uint64_t> st;
    launch(*w, buf, st); /* untagged */
    st.push_back(cm_corr_push());
    launch(*w, buf, st);
    st.push_back(cm_corr_push());
    launch(*w, buf, st);
    uint64_t popped = 0;
    if (cm_corr_pop(&popped) != 0 || popped != st.back()) w->errors++;
    st.pop_back();
    launch(*w, buf, st);
    if (cm_corr_pop(&popped) != 0 || popped != st.back()) w->errors++;
    st.pop_back();
  }
  if (cudaStreamSynchronize(w->stream) != cudaSuccess) w->errors++;
  cudaFree(buf);
}

int main(void) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int ndev = 0;
  cudaError_t drc = cudaGetDeviceCount(&ndev);
  if (drc != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device (%s)\n", drc != cudaSuccess ? cudaGetErrorName(drc) : "count 0");
    return 77;
  }

  cm_engine *e = nullptr;
  int rc = cm_engine_new(&e, nullptr);
  if (rc != 0) {
    printf("[FAIL] cm_engine_new: %s: %s\nRESULT: FAIL\n", cm_err_name(rc), cm_errmsg());
    return 1;
  }
  static const uint32_t cbids[] = {CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
                                   CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000};
  uint32_t handles[2];
  for (int i = 0; i < 2; i++) {
    rc = cm_callback_register(e, CUPTI_CB_DOMAIN_RUNTIME_API, cbids[i], on_launch, nullptr,
                              &handles[i]);
    if (rc == 0) rc = cm_callback_arm(e, CUPTI_CB_DOMAIN_RUNTIME_API, cbids[i]);
    check(rc == 0, "register and arm the cudaLaunchKernel callback", "cbid %lld rc %lld",
          cbids[i], rc);
  }

  cm_selection *sel = nullptr;
  cm_selection_new(&sel);
  rc = cm_selection_parse(sel, "kernel:correlation,name;external_correlation;resource");
  uint32_t obs = 0;
  if (rc == 0) rc = cm_observe(e, sel, observer, nullptr, &obs);
  cm_selection_free(sel);
  check(rc == 0, "observe kernel, external_correlation, resource", "rc %lld", rc);
  if (rc != 0) {
    printf("  %s\nRESULT: FAIL\n", cm_errmsg());
    cm_engine_free(e);
    return 1;
  }

  cudaFree(nullptr); /* create the context on this thread first */
  long long enters0 = g_enters.load();
  Worker w[kThreads];
  std::vector<std::thread> th;
  for (int i = 0; i < kThreads; i++) th.emplace_back(worker_main, &w[i]);
  for (auto &t : th) t.join();
  long long enters = g_enters.load() - enters0;

  rc = cm_flush(e, CM_FLUSH_SYNC, 10000);
  check(rc == 0, "sync flush", "rc %lld", rc);

  size_t nlaunch = 0;
  int werr = 0;
  for (auto &x : w) {
    nlaunch += x.launches.size();
    werr += x.errors;
  }
  check(werr == 0, "workload ran without CUDA or pop errors", "errors %lld", werr);
  check(nlaunch == (size_t)kThreads * kReps * 4, "every launch reported a correlation id",
        "%lld of %lld", (long long)nlaunch, (long long)kThreads * kReps * 4);
  check(enters == (long long)kThreads * kReps * 4, "cudaLaunchKernel enter callbacks counted exactly",
        "%lld of %lld", enters, (long long)kThreads * kReps * 4);

  {
    std::lock_guard<std::mutex> lk(g_mu);
    std::map<uint32_t, size_t> row; /* kernel correlation -> row */
    for (size_t i = 0; i < g_kcorr.size(); i++) row[g_kcorr[i]] = i;
    std::vector<uint32_t> off(g_kcorr.size() + 1);
    std::vector<uint64_t> ids(4096);
    int64_t need = cm_corr_join_chains(g_ec_kind.data(), g_ec_ext.data(), g_ec_corr.data(),
                                       (uint32_t)g_ec_kind.size(), g_kcorr.data(),
                                       (uint32_t)g_kcorr.size(), off.data(), ids.data(),
                                       (uint32_t)ids.size());
    check(need >= 0 && need <= (int64_t)ids.size(), "join kernels to their chains", "ids %lld",
          (long long)need);
    long long missing = 0, wrong = 0, tagged = 0;
    for (auto &x : w)
      for (auto &l : x.launches) {
        auto it = row.find(l.corr);
        if (it == row.end()) {
          missing++;
          continue;
        }
        size_t r = it->second;
        std::vector<uint64_t> got(ids.begin() + off[r], ids.begin() + off[r + 1]);
        if (got != l.chain) wrong++;
        if (!l.chain.empty()) tagged++;
      }
    check(missing == 0, "every launch has its kernel record", "missing %lld", missing);
    check(wrong == 0, "every kernel resolves to its expected chain", "wrong %lld of tagged %lld",
          wrong, tagged);

    std::set<uint64_t> want;
    for (auto &x : w) want.insert((uint64_t)(uintptr_t)x.stream);
    long long found = 0;
    for (size_t i = 0; i < g_res_event.size(); i++)
      if (g_res_event[i] == CUPTI_CBID_RESOURCE_STREAM_CREATED && want.count(g_res_stream[i]))
        found++;
    check(found == kThreads, "stream creation arrived as resource records", "%lld of %lld",
          found, (long long)kThreads);
  }

  cm_callback_stats cs;
  cm_callback_stats_get(e, &cs);
  check(cs.handler_failures == 0, "no handler failed", "failures %lld",
        (long long)cs.handler_failures);
  for (auto &x : w) cudaStreamDestroy(x.stream);
  cm_unobserve(e, obs);
  for (int i = 0; i < 2; i++) cm_callback_unregister(e, handles[i]);
  cm_engine_free(e);
  printf("RESULT: %s (%d failure(s))\n", g_failures ? "FAIL" : "PASS", g_failures);
  return g_failures ? 1 : 0;
}
