#!/usr/bin/env python3
"""A stand-in for the overhead harness's workloads (bench/overhead.py --stub), so that the harness
itself is tested without a GPU: prints the RESULT and LAUNCHED lines of gpu/launch_loop or of
torch_workload.py micro or steps, with random figures that are larger when a tracer's variables are set."""
import os
import random
import sys

factor = 1.0
if os.environ.get("CUDA_INJECTION64_PATH"):
    factor += 0.2
if os.environ.get("CUPTIMON_SOCKET"):
    factor += 0.3
wall = random.gauss(4000 * factor, 100)
cpu = random.gauss(3000 * factor, 100)
if sys.argv[1:] == ["launch"]:
    print("RESULT launch_loop launches 1000 wall_ns %.2f cpu_ns %.2f" % (wall, cpu))
    print("LAUNCHED 2000")
elif sys.argv[1:] == ["train"]:
    print("RESULT steps none ns_per_op %.1f cpu_ns_per_op %.1f" % (wall * 300, cpu * 300))
else:
    print("RESULT micro none ns_per_op %.1f cpu_ns_per_op %.1f" % (wall * 2, cpu * 2))
