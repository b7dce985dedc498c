"""Forward+backward time and peak memory of causal attention on CPU.

Methods (B=1, H=4, D=64, fp32): chunked momentum attention (β=0.6), chunked linear attention
(β=0), the naive quadratic eq. 13, and torch SDPA causal softmax. Prints a Markdown table with
ratios measured in the same run, plus achieved GFLOP/s of the chunked kernels against a large
matmul timed in the same run and the roofline's ideal bytes (benchmarks/roofline.py; on the CPU
no device limit, so no fraction of one). Peak memory: each (method, N) runs in a fresh subprocess; a
thread samples its resident set size during the timed runs, and the peak above the size
before the first run is reported (large tensors are mmap'd, so RSS falls when they are freed).

    .venv/bin/python benchmarks/attention.py            # N = 512 … 16384
    .venv/bin/python benchmarks/attention.py --quick    # N = 512 … 4096, fewer repeats
    .venv/bin/python benchmarks/attention.py --threads 1
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from datetime import date

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roofline import attention_bytes, attention_flops  # noqa: E402

from plugins.attention import momentum_attention, naive_causal_momentum_attention  # noqa: E402

H, D, CHUNK, BETA = 4, 64, 64, 0.6
NAIVE_MAX_N = 4096          # the quadratic form needs ~N²·H·4 bytes per intermediate


def method_fn(name):
    if name == "momentum":
        return lambda q, k, v: momentum_attention(q, k, v, momentum=BETA, chunk_size=CHUNK)
    if name == "linear":
        return lambda q, k, v: momentum_attention(q, k, v, momentum=0.0, chunk_size=CHUNK)
    if name == "naive":
        return lambda q, k, v: naive_causal_momentum_attention(q, k, v, momentum=BETA)
    if name == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    raise ValueError(f"unknown method {name!r}")


class PeakRSS:
    """Peak resident set size above the size at start, sampled every 0.5 ms (torch ops release
    the GIL, so the sampler runs while they work)."""

    def __enter__(self):
        self.base = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())

    @property
    def mb(self):
        return (self.peak - self.base) / 2 ** 20


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def time_fwd_bwd(fn, N, repeats):
    gen = torch.Generator().manual_seed(N)
    q, k, v = (torch.randn(1, H, N, D, generator=gen).requires_grad_() for _ in range(3))
    grad = torch.randn(1, H, N, D, generator=gen)
    times = []
    with PeakRSS() as memory:
        for i in range(repeats + 1):
            q.grad = k.grad = v.grad = None
            start = time.perf_counter()
            fn(q, k, v).backward(grad)
            if i:                                   # the first run warms up allocator and kernels
                times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, memory.mb


def worker(method, N, repeats, threads):
    if threads:
        torch.set_num_threads(threads)
    ms, peak = time_fwd_bwd(method_fn(method), N, repeats)
    print(json.dumps({"ms": ms, "peak_mb": peak}))


def run_worker(method, N, repeats, threads):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", method, str(N), str(repeats), str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def matmul_gflops(n=2048, repeats=5):
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / min(times) / 1e9


def chunked_flops(N, momentum):
    """Matmul FLOPs of the chunked kernel's forward+backward (formula in benchmarks/roofline.py)."""
    return attention_flops("momentum" if momentum else "linear", 1, H, N, D, D, CHUNK, backward=True)


def ideal_mb(N):
    """MB an ideal fwd+bwd must move (q, k, v, out; q, k, v, d_out, dq, dk, dv), the same for every method."""
    return attention_bytes("momentum", 1, H, N, D, D, "fp32", backward=True) / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=4, metavar=("METHOD", "N", "REPEATS", "THREADS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="N up to 4096, fewer repeats")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]), int(args.worker[3]))
        return
    lengths = [512, 1024, 2048, 4096] + ([] if args.quick else [8192, 16384])
    repeats = 3 if args.quick else args.repeats
    if args.threads:
        torch.set_num_threads(args.threads)
    peak = matmul_gflops()
    results = {}
    for N in lengths:
        for method in ("momentum", "linear", "naive", "sdpa"):
            if method == "naive" and N > NAIVE_MAX_N:
                continue
            results[method, N] = run_worker(method, N, repeats if method != "naive" else max(1, repeats // 2),
                                            args.threads)
            print(f"  N={N:6d} {method:8s} {results[method, N]['ms']:9.1f} ms "
                  f"{results[method, N]['peak_mb']:8.1f} MB", file=sys.stderr)
    print(f"# Causal attention fwd+bwd, CPU ({os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads), B=1 H={H} D={D} fp32, chunk {CHUNK}, β={BETA}; "
          f"{date.today()} on {platform.machine()} {platform.processor() or ''}".rstrip())
    print(f"# reference: {peak:.1f} GFLOP/s on a 2048² fp32 matmul")
    print()
    print("| N | momentum ms | linear ms | naive ms | SDPA ms | momentum/linear | naive/momentum | "
          "SDPA/momentum | momentum GFLOP/s (% of matmul) | ideal MB (momentum GB/s) | "
          "peak MB momentum / linear / naive / SDPA |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for N in lengths:
        r = {m: results.get((m, N)) for m in ("momentum", "linear", "naive", "sdpa")}
        mom = r["momentum"]["ms"]
        gflops = chunked_flops(N, True) / (mom / 1e3) / 1e9
        fmt = lambda x, key="ms": "—" if x is None else f"{x[key]:.1f}"  # noqa: E731
        ratio = lambda x: "—" if x is None else f"{x['ms'] / mom:.2f}"   # noqa: E731
        print(f"| {N} | {mom:.1f} | {fmt(r['linear'])} | {fmt(r['naive'])} | {fmt(r['sdpa'])} | "
              f"{mom / r['linear']['ms']:.2f} | {ratio(r['naive'])} | {ratio(r['sdpa'])} | "
              f"{gflops:.1f} ({100 * gflops / peak:.0f}%) | {ideal_mb(N):.1f} ({ideal_mb(N) / mom:.2f}) | "
              f"{' / '.join(fmt(r[m], 'peak_mb') for m in ('momentum', 'linear', 'naive', 'sdpa'))} |")
    print()
    print("| N → 8N | momentum time(8N)/time(N) | linear | SDPA |")
    print("|---|---|---|---|")
    for N in lengths:
        if 8 * N in lengths:
            print(f"| {N} → {8 * N} | " + " | ".join(
                f"{results[m, 8 * N]['ms'] / results[m, N]['ms']:.1f}"
                for m in ("momentum", "linear", "sdpa")) + " |")


if __name__ == "__main__":
    main()
