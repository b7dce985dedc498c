"""Where the host's time goes in an HF training step, for the momentum model and Llama-SDPA: gpu-check's
hf part found the momentum step host-bound on an H200 (2026-11-28, T = 8192: 33.4 ms a step against
20.7 ms of device work, where Llama's 29.2 ms held 26.6 ms of it). For each model, at gpu-check's hf
sizes (4 layers, hidden 512, 8 heads, 16384 tokens a step): the step's ms with CUDA events, the
host's ms to issue it (no sync inside; the device still busy after), then a cProfile of a few steps:
the functions with the most own time and the project's functions by cumulative time. With
--compile MODE, each model is also timed compiled whole (nn.Module.compile, fullgraph; MODE "default"
is Inductor, "reduce-overhead" adds CUDA graphs, which take the host out of the step).

    python benchmarks/train_host_profile.py --length 8192
    python benchmarks/train_host_profile.py --length 8192 --skip-profile --compile reduce-overhead
    python benchmarks/train_host_profile.py --device cpu --length 64 --layers 2   (a dry run)
"""
import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_train  # noqa: E402
from timing import synchronize, time_once_ms  # noqa: E402


def issue_ms(step, device, steps=5) -> float:
    """Median host ms to issue one step, each after the device has finished the last one."""
    times = []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    synchronize(device)
    return statistics.median(times)


def profile_text(step, device, steps, top) -> str:
    profiler = cProfile.Profile()
    synchronize(device)
    profiler.enable()
    for _ in range(steps):
        step()
    synchronize(device)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats("/(plugins|hf_momentum)/", top)
    return "\n".join(line for line in out.getvalue().splitlines() if line.strip())


def compiled_times(make, mode, args, tokens, size) -> str:
    model, step, _ = gpu_train.training_step(make, args.length, tokens, size, args.device)
    model.compile(mode=mode, fullgraph=True)
    start = time.perf_counter()
    for _ in range(3):
        step()
    synchronize(args.device)
    warm = time.perf_counter() - start
    wall = statistics.median(time_once_ms(step, args.device) for _ in range(5))
    return (f"{wall:.2f} ms a step, the host issues it in {issue_ms(step, args.device):.2f} ms; "
            f"compiling and 3 steps took {warm:.0f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=3, help="steps under cProfile")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--models", nargs="+", default=["momentum", "llama"], choices=["momentum", "llama"])
    parser.add_argument("--skip-profile", action="store_true", help="time the eager steps only")
    parser.add_argument("--compile", nargs="*", default=[], metavar="MODE",
                        help="also time the model compiled in each torch.compile mode")
    args = parser.parse_args()
    size = dict(layers=args.layers, hidden=512, heads=8, ffn=2048, vocab=32000)
    tokens = max(args.tokens, args.length)
    for name in args.models:
        make = gpu_train.momentum_model if name == "momentum" else gpu_train.llama_model
        _model, step, batch = gpu_train.training_step(make, args.length, tokens, size, args.device)
        for _ in range(3):
            step()
        synchronize(args.device)
        wall = statistics.median(time_once_ms(step, args.device) for _ in range(5))
        issue = issue_ms(step, args.device)
        print(f"== {name}, B{batch}-T{args.length}, {args.layers} layers: {wall:.2f} ms a step, "
              f"the host issues it in {issue:.2f} ms")
        if not args.skip_profile:
            print(profile_text(step, args.device, args.steps, args.top))
        for mode in args.compile:
            try:
                print(f"== {name} compiled ({mode}): {compiled_times(make, mode, args, tokens, size)}")
            except Exception as error:                  # the other rows still run; the reason is printed
                print(f"== {name} compiled ({mode}): {type(error).__name__}: {str(error)[:300]}")


if __name__ == "__main__":
    main()
