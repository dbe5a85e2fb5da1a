#!/usr/bin/env python3
"""CUDA graph captures under a monitor that synchronizes: every capture must succeed.

PyTorch captures and replays N small graphs (global capture mode, its default), each a few
cuBLAS and elementwise kernels. Run it untraced, then under
    cuptimon-lua spec/gpu/flush_every_2ms.lua -- python3 spec/gpu/torch_graphs.py 300
which asks for a sync flush every 2 ms. A monitor must never change what the application
computes: every capture must succeed and the replayed results must match eager execution.
Prints "RESULT graphs ok N fail M mismatch K" and exits 1 if any capture failed or mismatched.
"""
import sys

import torch


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    torch.manual_seed(0)
    dev = "cuda"
    a = torch.randn(64, 64, device=dev)
    b = torch.randn(64, 64, device=dev)
    ok = fail = mismatch = 0
    errors = {}
    side = torch.cuda.Stream()
    for i in range(n):
        x = torch.full((64, 64), float(i % 7), device=dev)
        want = torch.relu(a @ x + b) * 0.5
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(side):
                with torch.cuda.graph(g):  # capture_error_mode defaults to "global"
                    out = torch.relu(a @ x + b) * 0.5
            g.replay()
            torch.cuda.synchronize()
            if torch.allclose(out, want, rtol=1e-4, atol=1e-4):
                ok += 1
            else:
                mismatch += 1
        except Exception as e:  # a failed capture is what this checks for
            fail += 1
            key = str(e).splitlines()[0][:120]
            errors[key] = errors.get(key, 0) + 1
            torch.cuda.synchronize()
        del g
    for k, v in errors.items():
        print(f"ERROR x{v}: {k}")
    print(f"RESULT graphs ok {ok} fail {fail} mismatch {mismatch}", flush=True)
    return 0 if fail == 0 and mismatch == 0 and ok == n else 1


if __name__ == "__main__":
    sys.exit(main())
