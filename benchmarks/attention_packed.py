"""Packed sequences (`cu_seqlens`) against the same tokens as a padded batch (`padding_mask`):
forward + backward time of causal momentum attention and the peak memory it adds, per case in a
fresh process, in one run.

Document lengths are drawn from a log-normal (median 150 tokens, σ = 1, clipped to [1, 2048],
seed 0: most documents short, a few long, as in web text or paragraphs of a novel), so the padded
batch (n rows × the longest) holds mostly padding; the packed row holds only real tokens. The
ratio to compare with is 1 / (1 − padding fraction).

    python benchmarks/attention_packed.py                       # CPU, 1 thread
    python benchmarks/attention_packed.py --device cuda --backend triton
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def lengths(count: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(150), 1.0, count).round(), 1, 2048).astype(int).tolist()


def peak_rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def worker(layout: str, docs: int, device: str, backend: str, heads: int, dim: int) -> dict:
    import torch

    from benchmarks.timing import median_ms
    from plugins.attention import momentum_attention

    torch.set_num_threads(1)
    torch.manual_seed(0)
    lens = lengths(docs)
    n, longest, total = len(lens), max(lens), sum(lens)
    if layout == "packed":
        shape = (1, heads, total, dim)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=device)
        extra = dict(cu_seqlens=cu)
    else:
        shape = (n, heads, longest, dim)
        mask = torch.arange(longest)[None] < torch.tensor(lens)[:, None]
        extra = dict(padding_mask=mask.to(device))
    q, k, v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))

    def step():
        out = momentum_attention(q, k, v, momentum=0.9, backend=backend, **extra)
        out.sum().backward()

    step()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = peak_rss_kib() * 1024
    ms = median_ms(step, device)
    if device == "cuda":
        extra_bytes = torch.cuda.max_memory_allocated() - base
    else:
        extra_bytes = peak_rss_kib() * 1024 - base
    slots = shape[0] * shape[2]
    return dict(layout=layout, ms=ms, tokens=total, slots=slots, padding=1 - total / slots,
                tokens_per_s=total / ms * 1e3, peak_mib=extra_bytes / 2 ** 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, nargs="+", default=[16, 64], help="documents per batch")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        layout, docs = args.worker
        print(json.dumps(worker(layout, int(docs), args.device, args.backend, args.heads, args.dim)))
        return
    print(f"momentum attention, forward + backward, B·H·D = docs × {args.heads} × {args.dim}, "
          f"{args.device} ({args.backend}); peak = memory added during the timed runs (RSS on CPU)")
    print("| docs | tokens | padding fraction | padded ms | packed ms | speed-up | 1/(1−pad) "
          "| padded peak MiB | packed peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for docs in args.docs:
        rows = {}
        for layout in ("padded", "packed"):
            cmd = [sys.executable, __file__, "--worker", layout, str(docs), "--device", args.device,
                   "--backend", args.backend, "--heads", str(args.heads), "--dim", str(args.dim)]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
            rows[layout] = json.loads(done.stdout.strip().splitlines()[-1])
        pad, packed = rows["padded"], rows["packed"]
        print(f"| {docs} | {packed['tokens']} | {pad['padding']:.2f} | {pad['ms']:.1f} | "
              f"{packed['ms']:.1f} | {pad['ms'] / packed['ms']:.2f}× | {1 / (1 - pad['padding']):.2f}× | "
              f"{pad['peak_mib']:.0f} | {packed['peak_mib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
