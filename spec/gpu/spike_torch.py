"""A PyTorch loop whose elementwise kernel turns slow for one second, for spec/gpu/windows.sh.

For about 6 s it adds 1 to a tensor of 1M floats (the same CUDA kernel every time); from 3 s to
4 s the tensor has 32M floats, so that one kernel lasts about 32 times longer. Prints the number
of launches of each phase.
"""
import time

import torch

small = torch.zeros(1 << 20, device="cuda")
large = torch.zeros(1 << 25, device="cuda")
torch.cuda.synchronize()
t0 = time.time()
counts = {"before": 0, "slow": 0, "after": 0}
while True:
    t = time.time() - t0
    if t > 6.0:
        break
    phase = "before" if t < 3.0 else "slow" if t < 4.0 else "after"
    x = large if phase == "slow" else small
    for _ in range(50):
        x.add_(1.0)
    counts[phase] += 50
    torch.cuda.synchronize()
    time.sleep(0.002)
print("spike_torch: " + " ".join(f"{k}={v}" for k, v in counts.items()))
