"""Host time of one Triton momentum-attention forward+backward through the public API, without a
GPU: Triton's real launch path (autotuner, binder, launcher) runs with the stand-in driver of
tests/triton_standin.py, whose launches are no-ops, so what is timed is everything the host does
per call. On a GPU this time is what the device waits for whenever it exceeds the kernels' own
time (docs/benchmarks.md, 2026-11-27: 0.76 ms of kernels in a 2.34 ms fwd+bwd at B16-H16-T1k).

    python benchmarks/triton_host_overhead.py [--profile 25]
Must run without TRITON_INTERPRET (the interpreter skips the launcher)."""
import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET: the interpreter skips the launcher timed here")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import triton_standin  # noqa: E402  (active before any kernel is used)


def fwd_bwd(B=2, H=2, N=256, D=64, beta=0.6):
    """A closure running the public API's forward + backward on small CPU bf16 tensors (their
    size does not matter: nothing runs)."""
    import torch

    from plugins.attention import momentum_attention
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=gen).to(torch.bfloat16).requires_grad_() for _ in range(3))
    grad = torch.randn(B, H, N, D, generator=gen).to(torch.bfloat16)

    def step():
        out = momentum_attention(q, k, v, momentum=beta, backend="triton")
        torch.autograd.grad(out, (q, k, v), grad)
    return step


def host_us(step, rounds=7, calls=50):
    """Median over rounds of the mean host µs per call."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=int, default=0, help="print the N functions with the most own time")
    args = parser.parse_args()
    triton_standin.activate(90)
    import torch
    torch.set_num_threads(1)
    from triton_launch_check import allow_cpu_tensors
    allow_cpu_tensors()
    step = fwd_bwd()
    launches = triton_standin._NoLaunch.launches
    step()                                     # compiles and autotunes (the stand-in's timings)
    per_call = triton_standin._NoLaunch.launches - launches
    for _ in range(20):
        step()
    print(f"momentum_attention fwd+bwd (bf16, Triton launch path, no-op launches): "
          f"{host_us(step):.0f} µs host per call, {per_call} Triton launches")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [step() for _ in range(100)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
