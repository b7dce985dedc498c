"""Forward+backward time and peak memory of the MomentumRNN layers on CPU or CUDA.

Shapes on CPU: pixel-MNIST (T=784, input 1, B=32, H=128 and 256) and PTB (T=70, B=20,
input 400, H=1150), one layer; on CUDA (--device cuda): PTB 3 layers × 1150 (T=70, B=20,
input 400) and PMNIST 1 × 256 (T=784, B=128, input 1). float32. Variants: the Appendix-F
cell stepped in a Python loop (the authors' code, tests/reference_appendix_f.py; stacked
for several layers), torch.nn.LSTM (cuDNN on CUDA), and every cell of
plugins.rnn.MomentumLSTM (μ = 0.6, s = 1, β = 0.9; sr with F = 2), and adam and rmsprop on
torch's fused LSTM kernel after the drive of every step (adam-cudnn, rmsprop-cudnn: recurrence
backend "cudnn", an identity input weight of 4H × 4H; aten's kernel on CPU); on CUDA also adam and
rmsprop forced onto the torch loop (adam-torch, rmsprop-torch) and onto the Triton recurrence
with the GEMM inside the step kernel (adam-triton-one-launch, rmsprop-triton-one-launch) beside
their default Triton recurrence (a cuBLAS GEMM and a kernel per step). With --tanh instead:
torch.nn.RNN (tanh) and the tanh MomentumRNN's adam and rmsprop layers, on their Python step loop
and drive first on torch's fused tanh-RNN kernel (tanh-adam-cudnn, tanh-rmsprop-cudnn: an H × H
identity input weight), the table against nn.RNN. Loss = sum of outputs.

Precision. torch's defaults give float32 two precisions here: cuDNN's RNNs (nn.LSTM, and the
fused LSTM of the plain and eq.-9 cells, of adam-cudnn and of rmsprop-cudnn) take TF32 tensor
cores (torch.backends.cudnn.rnn.fp32_precision "tf32"), float32 matmuls do not
(torch.get_float32_matmul_precision() "highest"), and with them the Adam/RMSProp recurrences' GEMMs
and Triton steps. On CUDA two more variants put each side at the other's precision: nn.LSTM-ieee
(cuDNN without TF32) and adam-tf32 (float32 matmuls in TF32, as
torch.set_float32_matmul_precision("high") gives a user); the table has a ratio column against
nn.LSTM-ieee.

Structure. The momentum/nag/sr cells run cuDNN's LSTM one layer at a time (their filter sits
between layers), where nn.LSTM runs all layers in one call; nn.LSTM-per-layer (CUDA) is nn.LSTM
called that way, the floor of that structure, so that the cells' own cost reads against it.

Time: one process per shape builds all variants and runs them round-robin, keeping each
variant's best forward+backward time, so load from other processes hits every variant
alike (the Appendix-F loop takes part in the first --loop-repeats rounds only).
Peak memory: one process per (shape, variant), so it can be read from the process's peak
resident set size: peak = ru_maxrss after one forward+backward minus the resident size
just before it (model, input and torch already loaded, torch's lazy initialisation done by
a 2-step warm-up).

On CUDA everything runs in one process: after a warm-up round (Triton compilation, cuDNN
set-up) the variants run round-robin, each round timed with CUDA events, and the median is
reported; peak memory = torch.cuda.max_memory_allocated during one forward+backward minus
the memory allocated just before it; device busy = the device time of one forward+backward's
kernels and copies (torch.profiler) as a share of its median wall time: near 100 % the device
bounds a variant, far below it the host does. Usage:

    python benchmarks/rnn.py                # all CPU shapes, about 3 min on 2 idle cores
    python benchmarks/rnn.py --quick        # MNIST H=128 only, 2 rounds
    python benchmarks/rnn.py --threads 1    # torch.set_num_threads(1) in every worker
    python benchmarks/rnn.py --device cuda  # the two GPU shapes, median of 20 rounds
    python benchmarks/rnn.py --tanh         # the tanh MomentumRNN's Adam/RMSProp layers vs nn.RNN
    python benchmarks/rnn.py --device cuda --shapes ptb-3x1150 --variants nn.LSTM-per-layer momentum \
        --host-trace                        # where each variant's host time goes, instead of the table

--host-trace: the momentum cell at PTB took 1.45× nn.LSTM on the H200 (2026-12-04) where nn.LSTM
called one layer at a time took 1.20×, with its device busy 75 % of the wall time against 86 %:
one forward+backward of each variant at the first shape, profiled with Python stacks, its host self
time by kind on every thread (benchmarks/host_trace.py), in place of the timing table.
"""
import argparse
import contextlib
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
    "ptb-3x1150": dict(T=70, B=20, D=400, H=1150, L=3),
    "pmnist-256": dict(T=784, B=128, D=1, H=256),
    "tiny": dict(T=12, B=2, D=3, H=8, L=2),           # benchmarks/gpu_check.py's CPU dry run
    # where the Adam/RMSProp LSTM's one-launch step stops paying (adam_recurrence.ONE_LAUNCH_MAX_HIDDEN:
    # 0.40x the two-launch loop at pMNIST's 256 units, 1.58x at PTB's 1150; gpu_call.sh)
    "b64-h256": dict(T=100, B=64, D=128, H=256),
    "b64-h512": dict(T=100, B=64, D=128, H=512),
    "b64-h768": dict(T=100, B=64, D=128, H=768),
}
DEFAULT_SHAPES = {"cpu": ["mnist-128", "mnist-256", "ptb-1150"],
                  "cuda": ["ptb-3x1150", "pmnist-256"]}
VARIANTS = ["appendix-f", "nn.LSTM", "lstm", "momentum", "nag", "sr", "adam", "rmsprop", "adam-cudnn",
            "rmsprop-cudnn"]
CUDA_VARIANTS = VARIANTS + ["adam-torch", "rmsprop-torch", "adam-triton-one-launch",
                             "rmsprop-triton-one-launch", "nn.LSTM-ieee", "adam-tf32", "nn.LSTM-per-layer"]
# each Adam/RMSProp recurrence forced (--variants): "auto" takes one launch per step up to 256 units
FORCED_RECURRENCES = ["adam-triton", "rmsprop-triton"]
# (--variants) the momentum cell with its filtered input padded to a multiple of 8 channels
# (layers.INPUT_ALIGN = 8; unpadded by default): gpu_call.sh times both
PADDED = "momentum-padded"
# benchmarks/gpu_check.py's rnn part (50 s): without the torch loops, 9-15× nn.LSTM in every GPU run so far
GPU_CHECK_VARIANTS = [variant for variant in CUDA_VARIANTS if not variant.endswith("-torch")]
# --tanh: the tanh MomentumRNN's Adam/RMSProp layers (a Python loop over the steps by default; "cudnn":
# the drive first, then torch's fused tanh-RNN kernel) against nn.RNN
TANH_VARIANTS = ["nn.RNN", "tanh-adam", "tanh-adam-cudnn", "tanh-rmsprop", "tanh-rmsprop-cudnn"]
# gpu-check's tanh rows, after the LSTM's in the same 50 s: without the step loops (784 steps of
# autograd at pMNIST, untimed on a GPU so far), whose time a part cannot bound before it starts them
GPU_CHECK_TANH_VARIANTS = ["nn.RNN", "tanh-adam-cudnn", "tanh-rmsprop-cudnn"]
HYPER = dict(momentum=0.6, step_size=1.0, beta=0.9, eps=1e-8)


def current_rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


@contextlib.contextmanager
def fp32_precision(cudnn_rnn=None, matmul=None):
    """float32's precision in cuDNN's RNNs and in matmuls, "tf32" or "ieee" (None: as it is), for
    the calls inside, restored after (torch before 2.9 names cuDNN's as allow_tf32)."""
    import torch
    flags = getattr(torch.backends.cudnn, "rnn", None)
    new_api = hasattr(flags, "fp32_precision")
    saved_rnn = flags.fp32_precision if new_api else torch.backends.cudnn.allow_tf32
    saved_matmul = torch.get_float32_matmul_precision()

    def set_rnn(value):
        if new_api:
            flags.fp32_precision = value
        else:
            torch.backends.cudnn.allow_tf32 = value
    try:
        if cudnn_rnn is not None:
            set_rnn(cudnn_rnn if new_api else cudnn_rnn == "tf32")
        if matmul is not None:
            torch.set_float32_matmul_precision("high" if matmul == "tf32" else "highest")
        yield
    finally:
        torch.set_float32_matmul_precision(saved_matmul)
        set_rnn(saved_rnn)


def at_precision(run, **precision):
    """`run` with fp32_precision(**precision) around each call."""
    def precise():
        with fp32_precision(**precision):
            run()
    return precise


def padded(run):
    """`run` with the filtered input's channels padded to a multiple of 8 (layers.INPUT_ALIGN) in
    each call."""
    def call():
        from plugins.rnn import layers
        align = layers.INPUT_ALIGN
        layers.INPUT_ALIGN = 8
        try:
            run()
        finally:
            layers.INPUT_ALIGN = align
    return call


def build(variant, T, B, D, H, L=1, device="cpu"):
    """A closure running one forward+backward of `variant` at the given shape."""
    import torch

    if variant == "nn.LSTM-ieee":
        return at_precision(build("nn.LSTM", T, B, D, H, L, device), cudnn_rnn="ieee")
    if variant.endswith("-tf32"):
        return at_precision(build(variant.removesuffix("-tf32"), T, B, D, H, L, device), matmul="tf32")
    if variant == PADDED:
        return padded(build("momentum", T, B, D, H, L, device))

    sys.path.insert(0, str(ROOT))
    from plugins.rnn import MomentumLSTM, MomentumRNN
    from plugins.rnn.adam_recurrence import recurrence_backend
    from plugins.rnn.variants import read_hyperparameters

    torch.manual_seed(0)
    x = torch.randn(T, B, D, device=device)
    if variant in ("nn.LSTM", "nn.RNN"):
        torch_layer = getattr(torch.nn, variant[3:])(D, H, num_layers=L).to(device)
        return lambda: torch_layer(x)[0].sum().backward()
    if variant == "nn.LSTM-per-layer":
        layers = [torch.nn.LSTM(D if k == 0 else H, H).to(device) for k in range(L)]

        def run():
            seq = x
            for layer in layers:
                seq = layer(seq)[0]
            seq.sum().backward()
        return run
    if variant == "appendix-f":
        spec = importlib.util.spec_from_file_location(
            "reference_appendix_f", ROOT / "tests" / "reference_appendix_f.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cells = [module.MomentumLSTMCell(D if k == 0 else H, H, HYPER["momentum"],
                                         HYPER["step_size"]).to(device) for k in range(L)]

        def run():
            seq = x
            for cell in cells:
                h = c = x.new_zeros(B, H)
                v = x.new_zeros(B, 4 * H)
                outs = []
                for x_t in seq:
                    _, (h, c), v = cell(x_t, (h, c), v)
                    outs.append(h)
                seq = torch.stack(outs)
            seq.sum().backward()
        return run
    cls = MomentumRNN if variant.startswith("tanh-") else MomentumLSTM
    cell, _, backend = variant.removeprefix("tanh-").partition("-")
    layer = cls(D, H, num_layers=L, cell=cell, restart=2 if cell == "sr" else None,
                **read_hyperparameters(cell, **HYPER)).to(device)

    def run():
        with recurrence_backend(backend or "auto"):
            layer(x)[0].sum().backward()
    return run


def setup_threads(threads):
    import warnings

    import torch

    warnings.simplefilter("ignore")
    if threads:
        torch.set_num_threads(threads)


def memory_worker(shape, variant, threads):
    setup_threads(threads)
    build(variant, **dict(SHAPES[shape], T=2))()  # one-off lazy initialisation of torch
    run = build(variant, **SHAPES[shape])
    before = current_rss_kib()
    run()
    peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(json.dumps(dict(peak_mib=peak_mib)))


def time_worker(shape, repeats, loop_repeats, threads, variants=VARIANTS):
    setup_threads(threads)
    runs = {variant: build(variant, **SHAPES[shape]) for variant in variants}
    best = dict.fromkeys(variants, float("inf"))
    for run in runs.values():
        run()
    for round_ in range(repeats):
        for variant, run in runs.items():
            if variant == "appendix-f" and round_ >= loop_repeats:
                continue
            start = time.perf_counter()
            run()
            best[variant] = min(best[variant], time.perf_counter() - start)
    print(json.dumps(best))


def subprocess_json(*args):
    cmd = [sys.executable, __file__, *map(str, args)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def cuda_times(shape, repeats, loop_repeats, device="cuda", variants=CUDA_VARIANTS):
    """Median time (CUDA events on CUDA) and peak allocated memory (CUDA only, else 0) of every
    variant, in one process."""
    import statistics

    from timing import time_once_ms

    runs = {variant: build(variant, **SHAPES[shape], device=device) for variant in variants}
    for run in runs.values():
        run()
    times = {variant: [] for variant in runs}
    for round_ in range(repeats):
        for variant, run in runs.items():
            if variant == "appendix-f" and round_ >= loop_repeats:
                continue
            times[variant].append(time_once_ms(run, device) / 1000)
    results = []
    for variant, run in runs.items():
        peak_mib = cuda_peak_mib(run) if device == "cuda" else 0.0
        results.append({"shape": shape, "variant": variant, "peak_mib": peak_mib,
                        "seconds": statistics.median(times[variant])})
        if device == "cuda" and variant != "appendix-f":
            try:
                results[-1]["busy_seconds"] = device_busy_seconds(run)
            except Exception as error:          # noqa: BLE001 (the times stand without it)
                print(f"device busy not recorded: {type(error).__name__}: {error}", file=sys.stderr)
        print(f"{shape:10s} {variant:25s} {results[-1]['seconds'] * 1e3:8.2f} ms "
              f"{peak_mib:8.0f} MiB", file=sys.stderr, flush=True)
    return results


def cuda_peak_mib(run):
    """torch.cuda.max_memory_allocated during one call, above the memory allocated before it."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2 ** 20


def device_busy_seconds(run):
    """Seconds the device spends in one call's kernels and copies (timing.device_kernel_times).
    Against the call's wall time: near it, the device bounds the call; far below it, the device
    waits between launches for the host (the Adam LSTM issues two launches per step)."""
    from timing import device_kernel_times
    return sum(total for total, _ in device_kernel_times(run).values()) / 1e6


NAMES = {"appendix-f": "Appendix-F loop", "nn.LSTM": "torch nn.LSTM", "adam-torch": "adam, torch loop",
         "rmsprop-torch": "rmsprop, torch loop", "adam-triton-one-launch": "adam, one launch per step",
         "rmsprop-triton-one-launch": "rmsprop, one launch per step",
         "nn.LSTM-ieee": "torch nn.LSTM, cuDNN without TF32", "adam-tf32": "adam, float32 matmuls in TF32",
         "nn.LSTM-per-layer": "torch nn.LSTM, one call per layer",
         PADDED: "momentum, input channels padded to 8",
         "adam-cudnn": "adam, drive first, fused LSTM kernel",
         "rmsprop-cudnn": "rmsprop, drive first, fused LSTM kernel", "nn.RNN": "torch nn.RNN (tanh)",
         "tanh-adam": "tanh adam, torch loop", "tanh-rmsprop": "tanh rmsprop, torch loop",
         "tanh-adam-cudnn": "tanh adam, drive first, fused RNN kernel",
         "tanh-rmsprop-cudnn": "tanh rmsprop, drive first, fused RNN kernel"}


def table(results, unit="s"):
    """Every row against the torch baseline of its shape (nn.LSTM, or nn.RNN for --tanh) and the
    Appendix-F loop where it ran."""
    scale = 1e3 if unit == "ms" else 1.0
    baseline = "nn.LSTM" if any(r["variant"] == "nn.LSTM" for r in results) else "nn.RNN"
    looped = any(r["variant"] == "appendix-f" for r in results)
    exact = any(r["variant"] == "nn.LSTM-ieee" for r in results)
    busy = any("busy_seconds" in r for r in results)
    extra = [name for name, shown in ((" × nn.LSTM without TF32 |", exact),
                                      (" device busy (% of fwd+bwd) |", busy)) if shown]
    loop_head, loop_rule = (" × Appendix-F loop |", "---:|") if looped else ("", "")
    lines = [f"| shape | variant | fwd+bwd ({unit}) | × {baseline} |{loop_head} peak memory (MiB) |"
             + "".join(extra), f"|---|---|---:|---:|{loop_rule}---:|" + "---:|" * len(extra)]
    for shape in dict.fromkeys(r["shape"] for r in results):
        rows = {r["variant"]: r for r in results if r["shape"] == shape}
        base = rows[baseline]["seconds"]
        for variant, r in rows.items():
            loop = f" {r['seconds'] / rows['appendix-f']['seconds']:.2f} |" if looped else ""
            line = (f"| {shape} | {NAMES.get(variant, variant)} | {r['seconds'] * scale:.3f} | "
                    f"{r['seconds'] / base:.2f} |{loop} {r['peak_mib']:.0f} |")
            if exact:
                line += f" {r['seconds'] / rows['nn.LSTM-ieee']['seconds']:.2f} |"
            if busy:
                line += f" {100 * r['busy_seconds'] / r['seconds']:.0f} |" if "busy_seconds" in r else " |"
            lines.append(line)
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cpu (default) or cuda: the GPU shapes, CUDA events, medians")
    parser.add_argument("--quick", action="store_true",
                        help="MNIST H=128 only (cuda: PMNIST 1×256), 2 rounds")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=None)
    parser.add_argument("--variants", nargs="+", choices=CUDA_VARIANTS + FORCED_RECURRENCES + [PADDED],
                        default=None,
                        help="--device cuda: time these variants only (default: all of CUDA_VARIANTS)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed rounds after a warm-up round (default 3, cuda 20, --quick 2)")
    parser.add_argument("--loop-repeats", type=int, default=1,
                        help="rounds in which the slow Appendix-F loop is timed (default 1)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads in each worker (default: torch's default)")
    parser.add_argument("--tanh", action="store_true",
                        help="the tanh MomentumRNN's Adam/RMSProp layers (loop, drive first) vs nn.RNN")
    parser.add_argument("--host-trace", action="store_true",
                        help="print each of --variants' host time by kind at the first of --shapes "
                             "(benchmarks/host_trace.py) instead of the table")
    parser.add_argument("--memory-worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--time-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    variants = TANH_VARIANTS if args.tanh else VARIANTS
    default_repeats = 2 if args.quick else (20 if args.device == "cuda" else 3)
    repeats = args.repeats if args.repeats is not None else default_repeats
    if args.memory_worker:
        memory_worker(*args.memory_worker, args.threads)
        return
    if args.time_worker:
        time_worker(args.time_worker, repeats, args.loop_repeats, args.threads, variants)
        return
    if args.host_trace:
        shape = (args.shapes or DEFAULT_SHAPES[args.device])[0]
        setup_threads(args.threads)
        traces = host_traces(shape, args.variants or ["nn.LSTM-per-layer", "momentum"], args.device)
        from host_trace import markdown
        for title, result in traces:
            print(markdown(result, title))
        return
    if args.device == "cuda":
        cuda_main(args.shapes or (["pmnist-256"] if args.quick else DEFAULT_SHAPES["cuda"]),
                  repeats, args.loop_repeats,
                  args.variants or (TANH_VARIANTS if args.tanh else CUDA_VARIANTS))
        return
    shapes = args.shapes or (["mnist-128"] if args.quick else DEFAULT_SHAPES["cpu"])
    results = []
    for shape in shapes:
        best = subprocess_json("--time-worker", shape, "--repeats", repeats, "--loop-repeats",
                               args.loop_repeats, "--threads", args.threads, *["--tanh"] * args.tanh)
        for variant in variants:
            peak = subprocess_json("--memory-worker", shape, variant,
                                   "--threads", args.threads)["peak_mib"]
            results.append(dict(shape=shape, variant=variant, seconds=best[variant],
                                peak_mib=peak))
            print(f"{shape:10s} {variant:11s} {best[variant]:8.3f} s {peak:8.0f} MiB",
                  file=sys.stderr, flush=True)
    print(table(results))


def host_traces(shape, variants, device) -> list:
    """(title, host_trace.trace) of one forward+backward of each variant at `shape`, 5 profiled
    after the trace's untimed one (which, after a build's own, compiles and autotunes)."""
    from host_trace import trace
    steps = {variant: build(variant, **SHAPES[shape], device=device) for variant in variants}
    for step in steps.values():
        step()
    return [(f"Host trace: {variant}, {shape}, forward+backward", trace(step, steps=5, cuda=device == "cuda"))
            for variant, step in steps.items()]


def cuda_main(shapes, repeats, loop_repeats, variants=CUDA_VARIANTS):
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    results = [r for shape in shapes for r in cuda_times(shape, repeats, loop_repeats, variants=variants)]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, float32, median of "
          f"{repeats} rounds (Appendix-F loop: {min(repeats, loop_repeats)})")
    print(table(results, unit="ms"))


if __name__ == "__main__":
    main()
