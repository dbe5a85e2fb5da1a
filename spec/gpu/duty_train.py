#!/usr/bin/env python3
"""A steady PyTorch training loop for the duty cycle's accuracy check (spec/gpu/duty_accuracy.py):
an MLP with a few layers trained on fixed random data for SECONDS seconds (default 300), after a
warm-up of 50 steps. Prints "TRAIN steps N seconds S" (the timed loop only), so that the exact
rates of a full trace are counts / S. With DUTY_TRAIN_PROGRESS=1 it also prints, about once a
second, "PROGRESS wall W steps_per_s R" (W: the wall clock in seconds, R: the steps per second
since the line before), which spec/gpu/duty_slowdown.sh lines up with the duty cycle's windows."""
import os
import sys
import time

import torch


def make_step():
    """One training step of the loop (bench/torch_workload.py's "steps" workload runs it too)."""
    torch.manual_seed(0)
    dev = "cuda"
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
        torch.nn.LayerNorm(2048), torch.nn.Linear(2048, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=dev)
    y = torch.randint(0, 10, (256,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    return step


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 300.0
    step = make_step()
    for _ in range(50):
        step()
    torch.cuda.synchronize()
    progress = os.environ.get("DUTY_TRAIN_PROGRESS") == "1"
    t0 = time.monotonic()
    t_line, n_line = t0, 0
    n = 0
    while time.monotonic() - t0 < seconds:
        step()
        n += 1
        if n % 50 == 0:
            torch.cuda.synchronize()  # a training loop's usual pacing: no unbounded queue
            if progress:
                now = time.monotonic()
                if now - t_line >= 1.0:
                    print("PROGRESS wall %.3f steps_per_s %.1f" % (time.time(), (n - n_line) / (now - t_line)),
                          flush=True)
                    t_line, n_line = now, n
    torch.cuda.synchronize()
    print("TRAIN steps %d seconds %.3f" % (n, time.monotonic() - t0), flush=True)


if __name__ == "__main__":
    main()
