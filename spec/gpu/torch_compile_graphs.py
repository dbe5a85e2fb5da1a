#!/usr/bin/env python3
"""torch.compile(mode="reduce-overhead") under a monitor: the compiled model runs as a CUDA graph,
and a monitor that attaches CUPTI, traces, and finalizes it between windows must neither break
the graph nor change what it computes.

An MLP (Linear 1024->4096, GELU, Linear 4096->1024) in inference, compiled with
mode="reduce-overhead" (CUDA graphs through PyTorch's graph trees), runs for SECONDS (default 15)
after its warm-up; every 500 steps the output is compared with the eager model's.
Prints "RESULT compile steps N mismatch M seconds S" and exits 1 on any mismatch. Run it
untraced, under the full trace (scripts/top.lua) and under a duty cycle
(spec/gpu/graph_windows.lua, or the recipes' --duty): spec/gpu/torch_compile_graphs.sh."""
import sys
import time

import torch


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024)).cuda().eval()
    x = torch.randn(64, 1024, device="cuda")
    with torch.no_grad():
        want = model(x).clone()
        compiled = torch.compile(model, mode="reduce-overhead")
        for _ in range(5):  # the graph trees record on the third call
            compiled(x)
        torch.cuda.synchronize()
        mismatch = 0
        t0 = time.monotonic()
        steps = 0
        while time.monotonic() - t0 < seconds:
            out = compiled(x)
            steps += 1
            if steps % 500 == 0:
                if not torch.allclose(out, want, rtol=1e-3, atol=1e-3):
                    mismatch += 1
        torch.cuda.synchronize()
    print("RESULT compile steps %d mismatch %d seconds %.3f" % (steps, mismatch, time.monotonic() - t0),
          flush=True)
    sys.exit(1 if mismatch else 0)


if __name__ == "__main__":
    main()
