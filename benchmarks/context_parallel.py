"""Context parallelism on CPU gloo: peak memory per rank and bytes exchanged per training step.

One causal momentum attention layer (B=1, H=4, D=64, fp32, β=0.6, chunk 64), forward+backward,
the sequence of T tokens split contiguously over R ranks (`process_group=`), against one process
holding all T tokens (no process group). Each configuration runs in fresh processes; each rank
warms up on a 64-token slice, then reports its peak resident set size (the kernel's high-water
mark, ru_maxrss) above its resident size before the full-size step, and counts the bytes its
collectives carry (torch.distributed's all_gather / all_reduce wrapped: the size of each
gathered or reduced result, forward and backward). The ranks run with glibc's
MALLOC_MMAP_THRESHOLD_=65536, so that a freed tensor leaves the resident set at once and the peak
is the live tensors' (with the default, sliding threshold, tensors under 32 MB stay resident
after they are freed and the peak jumps with N: ±20% between runs). The states exchanged are
per (batch, head): s, m (D×D) and z (D), so the bytes should be O(B·H·D²·R) whatever T; ring
attention would move the other ranks' keys and values instead, (T − T/R)·B·H·2D values, shown
for comparison.
Times on a shared 2-core CPU say little.

    .venv/bin/python benchmarks/context_parallel.py                       # T = 8192, 32768; R = 1, 2, 4
    .venv/bin/python benchmarks/context_parallel.py --lengths 4096 --ranks 1 2
"""
import argparse
import json
import os
import resource
import socket
import sys
import tempfile
import time
from datetime import date, timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from plugins.attention import momentum_attention  # noqa: E402
from plugins.attention.context_parallel import slice_bounds  # noqa: E402

B, H, D, BETA, CHUNK = 1, 4, 64, 0.6, 64


class ByteCounter:
    """Wraps dist.all_gather and dist.all_reduce (as `plugins.attention.context_parallel` calls
    them) and adds up the bytes of each collective's result."""

    def __init__(self):
        self.bytes = 0
        self._gather, self._reduce = dist.all_gather, dist.all_reduce

    def __enter__(self):
        def all_gather(parts, tensor, *args, **kwargs):
            self.bytes += sum(p.numel() * p.element_size() for p in parts)
            return self._gather(parts, tensor, *args, **kwargs)

        def all_reduce(tensor, *args, **kwargs):
            self.bytes += tensor.numel() * tensor.element_size()
            return self._reduce(tensor, *args, **kwargs)

        dist.all_gather, dist.all_reduce = all_gather, all_reduce
        return self

    def __exit__(self, *exc):
        dist.all_gather, dist.all_reduce = self._gather, self._reduce


def tokens(T, world, rank):
    start, stop = slice_bounds(T, world, rank)
    return stop - start


def step(rank, world, T, group):
    """One forward+backward on this rank's slice of T tokens (after one on a slice of 64 tokens);
    returns (peak MB above the size before it, ms, bytes exchanged)."""
    for n in (tokens(64, world, rank), tokens(T, world, rank)):
        gen = torch.Generator().manual_seed(rank)
        q, k, v = (torch.randn(B, H, n, D, generator=gen).requires_grad_() for _ in range(3))
        grad = torch.randn(B, H, n, D, generator=gen)
        before, high_before = _rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with ByteCounter() as counter:
            start = time.perf_counter()
            momentum_attention(q, k, v, momentum=BETA, chunk_size=CHUNK, process_group=group).backward(grad)
            ms = (time.perf_counter() - start) * 1e3
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if high_before > before + 2 ** 20 * 8:
        print(f"rank {rank}: the high-water mark before the step was already {high_before - before} bytes "
              "above the resident size; the peak below is a lower bound", file=sys.stderr)
    return (peak - before) / 2 ** 20, ms, counter.bytes


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def rank_main(rank, world, T, port, out_dir, threads):
    torch.set_num_threads(threads)
    group = None
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(minutes=10))
        group = dist.group.WORLD
    peak, ms, sent = step(rank, world, T, group)
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump({"peak_mb": peak, "ms": ms, "bytes": sent}, f)
    if group is not None:
        dist.destroy_process_group()


def run(world, T, threads):
    with tempfile.TemporaryDirectory() as out_dir, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.spawn(rank_main, args=(world, T, port, out_dir, threads), nprocs=world)
        ranks = [json.load(open(os.path.join(out_dir, f"{r}.json"))) for r in range(world)]
    return {"peak_mb": max(r["peak_mb"] for r in ranks), "ms": max(r["ms"] for r in ranks),
            "bytes": max(r["bytes"] for r in ranks)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args()
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")      # read by the spawned ranks' glibc
    state_bytes = B * H * (2 * D * D + D) * 4
    print(f"# context parallel, {date.today()}, torch {torch.__version__}, {os.cpu_count()} CPU cores, gloo, "
          f"B={B} H={H} D={D} fp32 β={BETA}, {args.threads} thread(s) per rank")
    print(f"# one rank's state (s, m, z) = B·H·(2D²+D)·4 = {state_bytes} bytes\n")
    print("| T | ranks | tokens per rank | peak MB per rank | vs 1 rank | bytes exchanged per rank per step "
          "| / (R·state bytes) | ring attention's K, V bytes | ms (shared CPU) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for T in args.lengths:
        single = None
        for world in args.ranks:
            result = run(world, T, args.threads)
            if world == 1:
                single = result["peak_mb"]
            ratio = f"{result['peak_mb'] / single:.2f}" if single else "—"
            ring = (T - tokens(T, world, 0)) * B * H * 2 * D * 4 if world > 1 else 0
            per_state = f"{result['bytes'] / (world * state_bytes):.2f}" if world > 1 else "—"
            print(f"| {T} | {world} | {tokens(T, world, 0)} | {result['peak_mb']:.1f} | {ratio} "
                  f"| {result['bytes']} | {per_state} | {ring} | {result['ms']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
