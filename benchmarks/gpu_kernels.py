"""Where a Triton momentum-attention forward+backward spends its GPU time, kernel by kernel
(torch.profiler's device times, averaged over the profiled steps), with the launches per step:
the chunked kernels as the launcher splits them and in one pass, and the fused kernels.
Each attention kernel's line also gives the flops of its matrix products in a step
(benchmarks/roofline.py's launch_flops, from each launch's arguments and the tile it ran) and the
TFLOP/s that makes; with the per-launch bytes model (launch_bytes, computed offline on the same
shapes: benchmarks/launch_model.py) this gives each kernel's achieved bandwidth (issue 27 item 2).

    python benchmarks/gpu_kernels.py                       # bf16, the issue's four shapes
    python benchmarks/gpu_kernels.py --json kernels.json
    python benchmarks/gpu_kernels.py --dtype fp32 --shapes 0 --modes default
    python benchmarks/gpu_kernels.py --host-profile 25    # also where the host's time to issue a step goes
    python benchmarks/gpu_kernels.py --shapes 1 --modes default --host-trace   # the same on every thread
    python benchmarks/gpu_kernels.py --modes layer layer-torch-marks   # a decoder layer's call, NaN marks
    python benchmarks/gpu_kernels.py --dtype fp32 --shapes 0 --modes default --tiles bwd_dqk=64,16,8
                                  # each mode also with the named kernels at the given (BK, BV, warps)
"""
import argparse
import collections
import contextlib
import cProfile
import inspect
import io
import json
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_attention import BETA, DTYPES, triton_method
from host_trace import markdown, trace
from timing import device_kernel_times

SHAPES = [(16, 16, 64, 1024), (4, 16, 64, 4096), (1, 16, 64, 16384), (1, 8, 64, 32768)]


@contextlib.contextmanager
def forced_split():
    """Split the state scans whatever the launcher would choose (split.even_splits)."""
    from plugins.attention.triton import chunk, split
    chosen, chunk.scan_splits = chunk.scan_splits, split.even_splits
    try:
        yield
    finally:
        chunk.scan_splits = chosen


def parse_tile(text: str) -> tuple:
    """"bwd_dqk=64,16,8" → ("bwd_dqk", (64, 16, 8)): a chunk kernel and its (BK, BV, warps)."""
    from plugins.attention.triton import chunk_kernels
    name, _, tile = text.partition("=")
    numbers = tile.split(",")
    if not hasattr(chunk_kernels, name) or len(numbers) != 3 or not all(n.isdigit() for n in numbers):
        raise argparse.ArgumentTypeError(f"{text!r}: not KERNEL=BK,BV,WARPS with KERNEL a chunk kernel "
                                         "(fwd_h, fwd_o, bwd_dh, bwd_dv, bwd_dqk)")
    return name, tuple(int(n) for n in numbers)


@contextlib.contextmanager
def forced_tiles(tiles: dict):
    """The chunk kernels named in `tiles` ({name: (BK, BV, warps)}) at that tile alone, kept by
    their pruner or not (utils.CHUNK_PRUNERS: three tiles for exact fp32 dots at D ≤ 64): a candidate timed
    beside what the autotuner chooses. Their tuning is kept apart and restored after."""
    from plugins.attention.triton import chunk_kernels
    saved = []
    for name, tile in tiles.items():
        tuner = getattr(chunk_kernels, name)

        def only(configs, named_args, _tile=tile, _name=name, **kwargs):
            chosen = [c for c in configs if (c.kwargs["BK"], c.kwargs["BV"], c.num_warps) == _tile]
            if not chosen:
                raise ValueError(f"{_name}: no tuning config has (BK, BV, warps) = {_tile}")
            return chosen
        saved.append((tuner, tuner.early_config_prune, tuner.cache))
        tuner.early_config_prune, tuner.cache = only, {}     # a new cache: the direct launcher starts over
    try:
        yield
    finally:
        for tuner, prune, cache in saved:
            tuner.early_config_prune, tuner.cache = prune, cache


def layer_method(torch_marks=False):
    """What a decoder layer runs (plugins.attention.attend: raw q, k, v, the feature map and the
    NaN marks always, the trusted path); `torch_marks`: the marks in PyTorch ops, as before
    feature_marks (the Triton module's finite_features then declines, as for a custom map)."""
    from plugins.attention import triton as kernels
    from plugins.attention.attend import attend
    from plugins.attention.spec import AttentionSpec
    spec = AttentionSpec(momentum=BETA, step_size=1.0, backend="triton")

    def run(q, k, v):
        return attend(q, k, v, spec)

    @contextlib.contextmanager
    def pytorch_marks():
        fused, kernels.finite_features = kernels.finite_features, lambda *args: None
        try:
            yield
        finally:
            kernels.finite_features = fused
    if torch_marks:
        run.context = pytorch_marks
    return run


def fwd_bwd_step(fn, B, H, D, T, dtype):
    """A closure running fn's forward+backward on fresh CUDA inputs, after three warm-up runs
    (compilation, autotuning) and a sync."""
    gen = torch.Generator(device="cuda").manual_seed(T)
    q, k, v = (torch.randn(B, H, T, D, generator=gen, device="cuda", dtype=DTYPES[dtype]).requires_grad_()
               for _ in range(3))
    grad = torch.randn(B, H, T, D, generator=gen, device="cuda", dtype=DTYPES[dtype])

    def step():
        with getattr(fn, "context", contextlib.nullcontext)():
            torch.autograd.grad(fn(q, k, v), (q, k, v), grad)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    return step


class _Recording:
    """Stands for an attention kernel on launches.K / launches.F: launches it as the launchers do
    (directly, launch plans included) and keeps (name, arguments by name, constants, the config the
    launch ran: the direct launcher's kept entry, or the autotuner's last choice)."""

    def __init__(self, name, kernel, log):
        from plugins.triton_launch import direct
        self.name, self.launcher, self.log = name, direct(kernel), log
        self.tuner = kernel
        while hasattr(kernel, "fn"):
            kernel = kernel.fn
        self.arg_names = list(inspect.signature(kernel).parameters)

    def __getitem__(self, grid):
        run = self.launcher[grid]

        def launch(*args, **constants):
            result = run(*args, **constants)
            named = dict(zip(self.arg_names, args))
            self.log.append((self.name, named, constants, self.config(args, constants)))
            return result
        return launch

    def config(self, args, constants) -> dict:
        compiled = getattr(self.launcher, "compiled", None)
        if compiled is not None:
            entry = compiled.get(self.launcher.key(args, constants))
            if entry is not None:
                return entry[1]
        chosen = getattr(self.tuner, "best_config", None)
        return chosen.all_kwargs() if chosen is not None else {}


@contextlib.contextmanager
def recorded_launches(log: list):
    """The chunked and fused attention kernels' launches inside, and the splits' merges, appended
    to `log`."""
    from plugins.attention.triton import chunk_kernels, fused_chunk_kernels, split
    from plugins.attention.triton import launches as kernels
    sets = ((kernels.K, chunk_kernels, ("fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqk")),
            (kernels.F, fused_chunk_kernels, ("fused_fwd", "fused_bwd_dkv", "fused_bwd_dq")))
    for holder, module, names in sets:
        for name in names:
            setattr(holder, name, _Recording(name, getattr(module, name), log))
    merge = split.merge_splits
    split.merge_splits = _Recording("merge_splits", merge, log)
    try:
        yield
    finally:
        split.merge_splits = merge
        for holder, _, names in sets:
            for name in names:
                vars(holder).pop(name, None)


def step_flops(step) -> dict:
    """{kernel name: flops of its matrix products in one call of `step`} (roofline.launch_flops at
    the tiles each launch ran)."""
    from roofline import launch_flops
    log, flops = [], collections.defaultdict(int)
    with recorded_launches(log):
        step()
    for name, args, constants, config in log:
        flops[name] += launch_flops(name, args, constants, config)
    return dict(flops)


def kernel_times(fn, B, H, D, T, dtype="bf16", steps=5):
    """({kernel name: (mean µs per step, launches per step)} of fn's forward+backward, and the
    host's µs to issue one step and a step's µs back to back, both over `steps` steps without a
    sync between them: issue ≈ back to back above the device time means the host bounds the
    step; back to back ≈ issue + device would mean the step waits for the device), and the
    attention kernels' flops in a step (step_flops)."""
    step = fwd_bwd_step(fn, B, H, D, T, dtype)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    issued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    host = dict(issue_us=(issued - start) / steps * 1e6, back_to_back_us=(done - start) / steps * 1e6)
    kernels = device_kernel_times(step, steps)
    try:
        flops = step_flops(step)
    except Exception as error:                  # noqa: BLE001 (the times stand without the flops)
        print(f"flops not recorded: {type(error).__name__}: {error}")
        flops = {}
    torch.cuda.synchronize()
    return {name: (total / steps, count / steps) for name, (total, count) in kernels.items()}, host, flops


def host_profile(fn, B, H, D, T, dtype="bf16", steps=20, top=25):
    """cProfile of the host issuing `steps` forward+backward steps (no sync between them; the
    queue does not fill in 20 steps): the functions with the most own time, as text."""
    step = fwd_bwd_step(fn, B, H, D, T, dtype)
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [step() for _ in range(steps)])
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def compiled_report(module_names=("plugins.attention.triton.chunk_kernels",
                                  "plugins.attention.triton.fused_chunk_kernels")):
    """Per compiled Triton kernel: warps, stages, registers and spills (ptxas), and each autotuner's
    chosen configs; best effort across Triton versions."""
    import importlib
    lines = []
    for module_name in module_names:
        module = importlib.import_module(module_name)
        for attr, obj in sorted(vars(module).items()):
            fn = getattr(obj, "fn", obj)
            if not hasattr(fn, "device_caches") or getattr(fn, "__module__", module_name) != module_name:
                continue
            for key, config in getattr(obj, "cache", {}).items():
                lines.append(f"  {attr} tuned {key}: {config}")
            for entry in getattr(fn, "device_caches", {}).values():
                for kernel in entry[0].values():
                    try:
                        meta = kernel.metadata
                        lines.append(f"  {attr}: warps {meta.num_warps} stages {meta.num_stages} "
                                     f"regs {kernel.n_regs} spills {kernel.n_spills} shared {meta.shared}")
                    except Exception as error:          # noqa: BLE001 (a report, across versions)
                        lines.append(f"  {attr}: {type(error).__name__}: {error}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--shapes", type=int, nargs="+", default=list(range(len(SHAPES))),
                        help="indices into SHAPES")
    parser.add_argument("--forced-split", action="store_true",
                        help="also time the scans split at every shape")
    parser.add_argument("--modes", nargs="+", default=["default", "1-pass", "fused"],
                        choices=["default", "1-pass", "fused", "layer", "layer-torch-marks"],
                        help="layer: a decoder layer's call (attend: feature map and NaN marks in Triton); "
                             "layer-torch-marks: the same with the marks in PyTorch ops")
    parser.add_argument("--tiles", nargs="+", type=parse_tile, default=[], metavar="KERNEL=BK,BV,WARPS",
                        help="time each chunked mode again with these kernels at these tiles alone")
    parser.add_argument("--host-profile", type=int, default=0, metavar="N",
                        help="print the N functions with the most host time per step (first shape, "
                             "default mode)")
    parser.add_argument("--host-trace", action="store_true",
                        help="where the host's time per step goes on every thread, by kind (benchmarks/"
                             "host_trace.py): each shape's first mode")
    args = parser.parse_args()
    rows = []
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, momentum β = {BETA}, fwd+bwd, µs per step")
    modes = [("default", False), ("1-pass", True), ("fused", "fused"), ("layer", "layer"),
             ("layer-torch-marks", "layer-torch-marks")]
    modes = [(label, one_pass) for label, one_pass in modes if label in args.modes]
    modes += [("forced split", None)] if args.forced_split else []
    tiles = dict(args.tiles)
    tiled = " ".join(f"{name}={','.join(map(str, tile))}" for name, tile in tiles.items())
    runs = [(label, one_pass, None) for label, one_pass in modes]
    runs += [(f"{label}, {tiled}", one_pass, tiles) for label, one_pass in modes
             if tiles and one_pass in (False, True)]
    for shape in [SHAPES[i] for i in args.shapes]:
        for label, one_pass, forced in runs:
            if label.startswith("layer"):
                fn = layer_method(torch_marks=label == "layer-torch-marks")
            else:
                scan = "fused" if one_pass == "fused" else "chunked"
                fn = triton_method(BETA, one_pass=one_pass is True, scan=scan)
            if one_pass is None:
                fn.context = forced_split
            with forced_tiles(forced or {}):
                times, host, flops = kernel_times(fn, *shape, dtype=args.dtype)
            total = sum(t for t, _ in times.values())
            launches = sum(n for _, n in times.values())
            case = "-".join(map(str, shape))
            print(f"\nB-H-D-T {case} {label}: {total:.0f} µs in {launches:.0f} launches; "
                  f"the host issues a step in {host['issue_us']:.0f} µs, back to back a step takes "
                  f"{host['back_to_back_us']:.0f} µs")
            for name, (t, n) in sorted(times.items(), key=lambda item: -item[1][0]):
                work = (f"  {flops[name] / 1e9:7.3f} GFLOP, {flops[name] / t / 1e6:6.1f} TFLOP/s"
                        if flops.get(name) else "")
                print(f"  {t:9.1f} µs  {n:4.0f}×  {name[:60]:60s}{work}")
            for name in sorted(set(flops) - set(times)):     # a kernel the profiler named otherwise
                print(f"  {name}: {flops[name] / 1e9:.3f} GFLOP a step, no device time under that name")
            rows.append(dict(shape=shape, mode=label, dtype=args.dtype, total_us=total, launches=launches,
                             **host, kernels={k: dict(us=t, launches=n, flops=flops.get(k, 0))
                                              for k, (t, n) in times.items()}))
            if args.host_trace and (label, one_pass, forced) == runs[0]:
                print(markdown(trace(fwd_bwd_step(fn, *shape, dtype=args.dtype), steps=10, cuda=True),
                               f"\nhost trace, B-H-D-T {case} {label}:"))
    if args.host_profile:
        print(f"\nhost profile, B-H-D-T {'-'.join(map(str, SHAPES[args.shapes[0]]))} default, 20 steps:")
        print(host_profile(triton_method(BETA), *SHAPES[args.shapes[0]], dtype=args.dtype,
                           top=args.host_profile))
    print("\ncompiled kernels (ptxas):")
    print("\n".join(compiled_report()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
