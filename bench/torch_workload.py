#!/usr/bin/env python3
"""A deterministic PyTorch workload for the GPU checks and the overhead benchmark.

Usage:
  torch_workload.py train [profiler]   a small MLP training loop (fixed seed, fixed shapes).
                                       With "profiler", the whole run is under torch.profiler and
                                       its kernels are printed as "EXPECT kernel NAME COUNT" lines,
                                       for spec/gpu/compare_torch.py to match against cuptimon.
  torch_workload.py micro MODE [N]     N (default 20000) tiny in-place adds, one kernel each, timed
                                       after 2000 untimed ones; MODE is none, profiler_cuda or
                                       profiler_cpu_cuda (the loop inside torch.profiler's context;
                                       no trace is exported). Prints "RESULT micro MODE ns_per_op X
                                       cpu_ns_per_op Y", per op: X wall time, Y the CPU time of the
                                       launching thread (time.thread_time_ns). Run MODE none under
                                       a tracer to measure the tracer (bench/overhead.py).
  torch_workload.py steps N            N timed steps (after 50 untimed) of the training loop of
                                       spec/gpu/duty_train.py (an MLP, AdamW, 256x1024 batches,
                                       a synchronize every 50 steps); prints "RESULT steps none
                                       ns_per_op X cpu_ns_per_op Y", per step.
"""
import json
import os
import sys
import tempfile
import time

import torch


def train():
    torch.manual_seed(0)
    dev = "cuda"
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device=dev)
    y = torch.randint(0, 10, (64,), device=dev)
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return float(loss)


def steps(n):
    """Per step (wall ns, launching thread CPU ns) of duty_train.py's loop: the same model, the
    same optimizer and the same pacing, so that its figures and that script's agree."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "spec", "gpu"))
    import duty_train
    step = duty_train.make_step()
    for _ in range(50):
        step()
    torch.cuda.synchronize()
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for i in range(1, n + 1):
        step()
        if i % 50 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter_ns() - t0) / n, (time.thread_time_ns() - c0) / n


def profiled(fn, activities):
    from torch.profiler import profile
    with profile(activities=activities) as prof:
        out = fn()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return out, [e for e in events if e.get("cat") == "kernel"]


def main():
    torch.cuda.init()
    mode = sys.argv[1] if len(sys.argv) > 1 else "train"
    if mode == "train":
        if len(sys.argv) > 2 and sys.argv[2] == "profiler":
            from torch.profiler import ProfilerActivity
            loss, kernels = profiled(train, [ProfilerActivity.CUDA])
            counts = {}
            for e in kernels:
                counts[e["name"]] = counts.get(e["name"], 0) + 1
            for name in sorted(counts):
                print("EXPECT kernel %s %d" % (name, counts[name]))
        else:
            loss = train()
        print("RESULT train loss %.6f" % loss)
        return
    if mode == "steps":
        ns, cpu = steps(int(sys.argv[2]) if len(sys.argv) > 2 else 5000)
        print("RESULT steps none ns_per_op %.1f cpu_ns_per_op %.1f" % (ns, cpu))
        return
    if mode != "micro":
        sys.exit("unknown mode %s (train, micro, steps)" % mode)
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    sub = sys.argv[2] if len(sys.argv) > 2 else "none"
    x = torch.zeros(1024, device="cuda")

    def loop():
        for _ in range(2000):
            x.add_(1.0)
        torch.cuda.synchronize()
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(n):
            x.add_(1.0)
        torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / n, (time.thread_time_ns() - c0) / n

    if sub == "none":
        ns, cpu = loop()
    elif sub in ("profiler_cuda", "profiler_cpu_cuda"):
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CUDA]
        if sub == "profiler_cpu_cuda":
            acts.insert(0, ProfilerActivity.CPU)
        with profile(activities=acts):
            ns, cpu = loop()
    else:
        sys.exit("unknown micro mode %s (none, profiler_cuda, profiler_cpu_cuda)" % sub)
    print("RESULT micro %s ns_per_op %.1f cpu_ns_per_op %.1f" % (sub, ns, cpu))


if __name__ == "__main__":
    main()
