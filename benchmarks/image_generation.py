"""Image generation throughput and memory on CPU (Momentum Transformer, Table 2's images/s):
the five pixel-by-pixel models of recipes/image_generation/model.py generating a batch of 28×28
images (784 steps, one pixel per step for the whole batch), all on one architecture (the shared
block, differing only in attention): softmax with its KV cache (`plugins.transformer.KeyValueCache`,
O(t) work at step t) and without one (re-reading the prefix each step, O(t²)), the momentum
models with their recurrent state of eq. 12 (its size does not depend on the position).
"ms / step" is the mean time of one pixel step for the batch: comparing it between runs of
different `--steps` shows how the per-pixel cost grows with the position.

Each method runs in a fresh worker process (random weights, fixed seed): one warm-up of 8 steps,
then `--repeats` full generations; reported are images/s of the fastest repeat and the peak
resident memory the generation added above the process's size after the warm-up, per image.
Ratios are against KV-cached softmax measured in the same run.

    python benchmarks/image_generation.py                          # §4.2 size: 8 layers, d 256
    python benchmarks/image_generation.py --steps 196 --layers 2   # quick look
    python benchmarks/image_generation.py --nocache-steps 196      # softmax without a cache is quadratic
"""
import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import date

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

METHODS = ("softmax_kv", "softmax_nocache", "linear", "momentum", "momentum_connection", "adaptive")


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(method: str, args) -> dict:
    import torch

    from recipes.image_generation.model import ImageModelConfig, PixelTransformer

    torch.set_num_threads(args.threads)
    steps = args.nocache_steps if method == "softmax_nocache" and args.nocache_steps else args.steps
    name = "softmax" if method.startswith("softmax") else method
    config = ImageModelConfig(sequence_length=784, layers=args.layers, heads=args.heads, d_model=args.d_model)
    torch.manual_seed(0)
    model = PixelTransformer(name, config).eval()
    kv_cache = method != "softmax_nocache"
    model.sample(args.batch, 8, torch.Generator().manual_seed(0), kv_cache=kv_cache)
    base = current_rss_bytes()
    best = float("inf")
    for repeat in range(args.repeats):
        start = time.perf_counter()
        model.sample(args.batch, steps, torch.Generator().manual_seed(repeat), kv_cache=kv_cache)
        best = min(best, time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"method": method, "steps": steps, "seconds": best, "images_per_s": args.batch / best,
            "peak_added_mb_per_image": max(peak - base, 0) / args.batch / 2**20}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=784, help="pixels generated per image (784: 28×28)")
    p.add_argument("--nocache-steps", type=int, help="fewer steps for softmax without a cache")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    for value, name in ((args.batch, "--batch"), (args.steps, "--steps"), (args.repeats, "--repeats")):
        if value < 1:
            p.error(f"{name} must be >= 1, got {value}")
    if not 1 <= args.steps <= 784 or (args.nocache_steps is not None and not 1 <= args.nocache_steps <= 784):
        p.error("--steps and --nocache-steps must be in [1, 784]")
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return
    rows = []
    passthrough = [a for a in sys.argv[1:] if a != "--json"]
    if args.json:
        passthrough = [a for a in passthrough if a != args.json]
    for method in args.methods:
        out = subprocess.run([sys.executable, __file__, *passthrough, "--worker", method], check=True,
                             capture_output=True, text=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"{method}: {rows[-1]['images_per_s']:.3f} images/s", file=sys.stderr)
    reference = next((r for r in rows if r["method"] == "softmax_kv"), None)
    print(f"Date {date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{args.threads} thread(s); batch {args.batch}, {args.layers} layers, {args.heads} heads, "
          f"d {args.d_model}; best of {args.repeats}")
    print("| method | steps | images/s | × softmax KV | ms / step | peak added MB / image |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        comparable = reference is not None and r["steps"] == reference["steps"]
        ratio = f"{r['images_per_s'] / reference['images_per_s']:.2f}×" if comparable else "n/a"
        print(f"| {r['method']} | {r['steps']} | {r['images_per_s']:.3f} | {ratio} | "
              f"{1000 * r['seconds'] / r['steps']:.1f} | {r['peak_added_mb_per_image']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
