"""Forward+backward time and peak memory of the MomentumRNN layers on CPU.

Shapes: pixel-MNIST (T=784, input 1, B=32, H=128 and 256) and PTB (T=70, B=20, input 400,
H=1150), float32. Variants: the Appendix-F cell stepped in a Python loop (the authors'
code, tests/reference_appendix_f.py), torch.nn.LSTM, and every cell of
plugins.rnn.MomentumLSTM. Loss = sum of all outputs.

Each (shape, variant) runs in its own subprocess, so peak memory can be read from the
process's peak resident set size: peak = ru_maxrss after one forward+backward minus the
resident size just before it (model, input and torch already loaded). Time is the best of
--repeats runs after that first one (the machine may be shared; the best run is the least
disturbed). Usage:

    python benchmarks/rnn.py            # all shapes, ~3-5 min on 2 cores
    python benchmarks/rnn.py --quick    # MNIST H=128 only, fewer repeats
"""
import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "mnist-128": dict(T=784, B=32, D=1, H=128),
    "mnist-256": dict(T=784, B=32, D=1, H=256),
    "ptb-1150": dict(T=70, B=20, D=400, H=1150),
}
VARIANTS = ["appendix-f", "nn.LSTM", "lstm", "momentum", "nag", "sr", "adam", "rmsprop"]
HYPER = dict(momentum=0.6, step_size=1.0, beta=0.9, eps=1e-8)


def current_rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def build(variant, T, B, D, H):
    import torch

    sys.path.insert(0, str(ROOT))
    from plugins.rnn import MomentumLSTM

    torch.manual_seed(0)
    x = torch.randn(T, B, D)
    if variant == "nn.LSTM":
        lstm = torch.nn.LSTM(D, H)
        return lambda: lstm(x)[0].sum().backward()
    if variant == "appendix-f":
        spec = importlib.util.spec_from_file_location(
            "reference_appendix_f", ROOT / "tests" / "reference_appendix_f.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cell = module.MomentumLSTMCell(D, H, HYPER["momentum"], HYPER["step_size"])

        def run():
            h = c = x.new_zeros(B, H)
            v = x.new_zeros(B, 4 * H)
            outs = []
            for x_t in x:
                h, (h, c), v = cell(x_t, (h, c), v)
                outs.append(h)
            torch.stack(outs).sum().backward()
        return run
    layer = MomentumLSTM(D, H, cell=variant, restart=2 if variant == "sr" else None, **HYPER)
    return lambda: layer(x)[0].sum().backward()


def worker(shape, variant, repeats):
    import warnings

    warnings.simplefilter("ignore")
    run = build(variant, **SHAPES[shape])
    before = current_rss_kib()
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    times = [first]
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    best = min(times[1:]) if repeats else first
    print(json.dumps(dict(shape=shape, variant=variant, seconds=best, peak_mib=peak_mib)))


def measure(shape, variant, repeats):
    cmd = [sys.executable, __file__, "--worker", shape, variant, "--repeats", str(repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def table(results):
    lines = ["| shape | variant | fwd+bwd (s) | × nn.LSTM | × Appendix-F loop | peak memory (MiB) |",
             "|---|---|---:|---:|---:|---:|"]
    for shape in dict.fromkeys(r["shape"] for r in results):
        rows = {r["variant"]: r for r in results if r["shape"] == shape}
        base, loop = rows["nn.LSTM"]["seconds"], rows["appendix-f"]["seconds"]
        for variant, r in rows.items():
            name = "Appendix-F loop" if variant == "appendix-f" else variant
            name = "torch nn.LSTM" if variant == "nn.LSTM" else name
            lines.append(f"| {shape} | {name} | {r['seconds']:.3f} | {r['seconds'] / base:.2f} "
                         f"| {r['seconds'] / loop:.2f} | {r['peak_mib']:.0f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="MNIST H=128 only, 2 repeats")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=None)
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed runs after the first (default 3, --quick 2)")
    parser.add_argument("--loop-repeats", type=int, default=None,
                        help="timed runs for the slow Appendix-F loop (default 1)")
    parser.add_argument("--worker", nargs=2, metavar=("SHAPE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args.repeats)
        return
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 3)
    loop_repeats = args.loop_repeats if args.loop_repeats is not None else 1
    shapes = args.shapes or (["mnist-128"] if args.quick else list(SHAPES))
    results = []
    for shape in shapes:
        for variant in VARIANTS:
            r = measure(shape, variant, loop_repeats if variant == "appendix-f" else repeats)
            print(f"{shape:10s} {variant:11s} {r['seconds']:8.3f} s {r['peak_mib']:8.0f} MiB",
                  file=sys.stderr, flush=True)
            results.append(r)
    print(table(results))


if __name__ == "__main__":
    main()
