"""Host time of one Triton momentum-attention forward+backward through the public API, without a
GPU: Triton's real launch path (autotuner, binder, launcher) runs with the stand-in driver of
tests/triton_standin.py, whose launches are no-ops, so what is timed is everything the host does
per call. On a GPU this time is what the device waits for whenever it exceeds the kernels' own
time (docs/benchmarks.md, 2026-11-27: 0.76 ms of kernels in a 2.34 ms fwd+bwd at B16-H16-T1k).

    python benchmarks/triton_host_overhead.py [--length 64] [--profile 25]
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


def fwd_bwd(B=1, H=1, N=64, D=64, beta=0.6, entry="api"):
    """A closure running one forward + backward on small CPU bf16 tensors (small, so that the CPU
    arithmetic of the torch ops around the kernels stays out of the time; nothing else runs):
    `entry` "api" is plugins.attention.momentum_attention (the feature map, checks, dispatch),
    "chunk" the Triton entry point on feature-mapped inputs (what benchmarks/gpu_attention.py
    times after its own elu + 1)."""
    import torch

    from plugins.attention import momentum_attention
    from plugins.attention.triton import chunk_momentum_attention
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=gen).to(torch.bfloat16).requires_grad_() for _ in range(3))
    grad = torch.randn(B, H, N, D, generator=gen).to(torch.bfloat16)

    def step():
        if entry == "api":
            out = momentum_attention(q, k, v, momentum=beta, backend="triton")
        else:
            out, _ = chunk_momentum_attention(q, k, v, momentum=beta, step_size=1.0, eps=1e-6, chunk_size=64)
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
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--length", type=int, default=64,
                        help="N (B1-H1-D64): from 2048 on, one row splits its scans (split.scan_splits)")
    args = parser.parse_args()
    triton_standin.activate(90)
    import torch
    torch.set_num_threads(1)
    from triton_launch_check import allow_cpu_tensors
    allow_cpu_tensors()
    step = fwd_bwd(N=args.length)
    launches = triton_standin._NoLaunch.launches
    step()                                     # compiles and autotunes (the stand-in's timings)
    per_call = triton_standin._NoLaunch.launches - launches
    chunk_step = fwd_bwd(N=args.length, entry="chunk")
    for _ in range(20):
        step()
        chunk_step()
    rounds = {"api": [], "chunk": []}
    for _ in range(args.rounds):                 # alternating, so that load on the machine hits both
        rounds["api"].append(host_us(step, rounds=1))
        rounds["chunk"].append(host_us(chunk_step, rounds=1))
    api, chunk = (statistics.median(rounds[name]) for name in ("api", "chunk"))
    print(f"host µs per forward+backward (bf16, B1-H1-N{args.length}-D64, Triton launch path, no-op "
          f"launches, median of {args.rounds} rounds of 50): momentum_attention {api:.0f}, "
          f"chunk_momentum_attention {chunk:.0f}; {per_call} Triton launches in the first call "
          "(autotuning included)")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [step() for _ in range(100)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
