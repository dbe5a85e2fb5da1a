#!/usr/bin/env python3
"""A small deterministic training job for the ranks recipe, one process per rank.

Usage: ranks_train.py [--steps N] [--sleep-rank R] [--sleep-ms MS] [--ddp] [--profile]

The rank is RANK from the environment (0 when unset), its device LOCAL_RANK (or 0). Each step is
an NVTX range "step" holding the forward pass, the backward pass and the optimizer step, and ends
with torch.cuda.synchronize(), so a step lasts as long as its GPU work. The process of rank
--sleep-rank sleeps --sleep-ms at the start of each of its steps (a straggler made on purpose).

--ddp: the model is wrapped in DistributedDataParallel over NCCL (run under torchrun; the NCCL
settings of the environment are left as they are). Without it the processes are independent
(several may share one GPU).

--profile: the run is under torch.profiler (CUDA activities) and prints one line
"EXPECT rank R kernels N nccl M": the kernels the profiler saw in this process, and those of them
whose names start with ncclDevKernel_ or ncclKernel_. torch.profiler and cuptimon cannot trace a
process together (CUPTI allows one subscriber), so the comparison is between two runs of the same
fixed-seed job.
"""
import argparse
import json
import os
import tempfile
import time

import torch


def train(args, rank, dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator(device="cpu").manual_seed(1234 + rank)
    x = torch.randn(256, 512, generator=g).to(dev)
    y = torch.randint(0, 10, (256,), generator=g).to(dev)
    nvtx = torch.cuda.nvtx
    loss = None
    for _ in range(args.steps):
        nvtx.range_push("step")
        if rank == args.sleep_rank and args.sleep_ms > 0:
            time.sleep(args.sleep_ms / 1000.0)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        nvtx.range_pop()
    return float(loss)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--sleep-rank", type=int, default=-1)
    p.add_argument("--sleep-ms", type=float, default=0.0)
    p.add_argument("--ddp", action="store_true")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) if args.ddp else 0)
    torch.cuda.set_device(dev)

    def run():
        # The process group is made and destroyed inside, so a profiled run sees every kernel of
        # the job (NCCL's setup included), as cuptimon does.
        if args.ddp:
            torch.distributed.init_process_group("nccl", device_id=dev)
        loss = train(args, rank, dev)
        if args.ddp:
            torch.distributed.destroy_process_group()
        return loss

    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            loss = run()
        path = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        names = [e["name"] for e in events if e.get("cat") == "kernel"]
        nccl = [n for n in names if n.startswith("ncclDevKernel_") or n.startswith("ncclKernel_")]
        print("EXPECT rank %d kernels %d nccl %d" % (rank, len(names), len(nccl)), flush=True)
    else:
        loss = run()
    print("RESULT rank %d steps %d loss %.6f" % (rank, args.steps, loss), flush=True)

if __name__ == "__main__":
    main()
