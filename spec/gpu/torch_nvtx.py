#!/usr/bin/env python3
"""A deterministic PyTorch training loop with NVTX ranges, for the recipe checks of
spec/gpu/run_all.sh.

Usage: torch_nvtx.py [STEPS] [profiler|key_averages]
Each step is an NVTX range "step" holding "forward", "backward" and "optimizer" ranges (pushed
and popped on the main thread). With "profiler", the whole run is under torch.profiler (CUDA
activities) and every kernel is printed as "EXPECT kernel NAME COUNT TOTAL_NS", the input of
spec/gpu/compare_top.py. With "key_averages", the run is under torch.profiler (CUDA activities)
and its key_averages() table is printed, with "KEY_AVERAGES_MS T": the time from the loop's end
(inside the profiler's context) to the table, torch.profiler's time to a table
(bench/time_to_table.py). Every run ends with "LOOP_END_REALTIME_NS" and, as its last action,
"EXIT_REALTIME_NS" (CLOCK_REALTIME, as cuptimon's timestamps), so a monitor's script can measure
the time from the process's exit to its own exit hook. torch.profiler and cuptimon cannot trace one process together (CUPTI
allows one subscriber), so the comparison is between two runs of the same fixed-seed loop.
"""
import json
import os
import sys
import tempfile
import time

import torch


def train(steps):
    torch.manual_seed(0)
    dev = "cuda"
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 512, device=dev)
    y = torch.randint(0, 10, (256,), device=dev)
    nvtx = torch.cuda.nvtx
    for _ in range(steps):
        nvtx.range_push("step")
        nvtx.range_push("forward")
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        nvtx.range_pop()
        nvtx.range_push("backward")
        loss.backward()
        nvtx.range_pop()
        nvtx.range_push("optimizer")
        opt.step()
        nvtx.range_pop()
        nvtx.range_pop()
    torch.cuda.synchronize()
    return float(loss)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    torch.cuda.init()
    if len(sys.argv) > 2 and sys.argv[2] == "profiler":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            loss = train(steps)
            loop_end = time.time_ns()
        path = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        kern = {}
        for e in events:
            if e.get("cat") == "kernel":
                c = kern.setdefault(e["name"], [0, 0.0])
                c[0] += 1
                c[1] += float(e.get("dur", 0)) * 1000.0
        for name in sorted(kern):
            print("EXPECT kernel %s %d %.0f" % (name, kern[name][0], kern[name][1]))
    elif len(sys.argv) > 2 and sys.argv[2] == "key_averages":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            loss = train(steps)
            loop_end = time.time_ns()
            t0 = time.perf_counter_ns()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=20)
        took = time.perf_counter_ns() - t0
        print(table)
        print("KEY_AVERAGES_MS %.3f" % (took / 1e6))
    else:
        loss = train(steps)
        loop_end = time.time_ns()
    print("RESULT train steps %d loss %.6f" % (steps, loss))
    print("LOOP_END_REALTIME_NS %d" % loop_end)
    print("EXIT_REALTIME_NS %d" % time.time_ns(), flush=True)


if __name__ == "__main__":
    main()
