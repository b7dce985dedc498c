"""Causal attention on a CUDA GPU: forward and forward+backward time, peak memory and the roofline.

Shapes (B-H-D-T): 4-16-64 at T = 1k, 4k, 16k, 32k and 8-32-128 at T = 8192. Methods, all on the
same q, k, v (B, H, T, D) in one process:
  momentum triton   plugins.attention.triton (β = 0.6), elu+1 applied in the timed function
  linear triton     the same kernels with β = 0 (one carried state)
  momentum torch    plugins.attention.momentum_attention (the PyTorch chunked path), β = 0.6
  linear torch      plugins.attention.linear_attention on the PyTorch path
  fla linear        fla-core's chunk_linear_attn on elu+1-mapped inputs (normalize=True, scale 1),
                    skipped with a message when fla-core is not installed
  sdpa              F.scaled_dot_product_attention(is_causal=True) (flash softmax attention in bf16)
Times are medians of CUDA-event-timed runs after warm-up runs (Triton compilation and autotuning
happen there; benchmarks/timing.py); peak memory is torch.cuda.max_memory_allocated above the
inputs during one fwd(+bwd). Ratios are against fla and SDPA measured in the same run. Each case
also gets its roofline (benchmarks/roofline.py): the bytes and flops an ideal implementation
needs, the achieved rates and, on a device in roofline.DEVICES, their fraction of its published
bandwidth and peak. Prints Markdown.

    python benchmarks/gpu_attention.py                 # all shapes, bf16
    python benchmarks/gpu_attention.py --quick         # 4-16-64 at T = 1k, 4k only
    python benchmarks/gpu_attention.py --dtypes bf16 fp32 --json rows.json
    python benchmarks/gpu_attention.py --device cpu --quick   # the same table on the CPU (no fractions)
"""
import argparse
import contextlib
import inspect
import json
import os
import sys
import time
from datetime import date

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roofline import HEADER, case_roofline, device_limits, limits_line
from timing import median_ms, synchronize

from plugins.attention import linear_attention, momentum_attention

BETA = 0.6
CHUNK = 64
SHAPES = [(4, 16, 64, 1024), (4, 16, 64, 4096), (4, 16, 64, 16384), (4, 16, 64, 32768), (8, 32, 128, 8192)]
METHODS = ["momentum triton", "momentum triton fused", "momentum triton 1-pass", "linear triton",
           "momentum torch", "linear torch", "fla linear", "sdpa"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def elu1(x):
    return F.elu(x) + 1


def triton_method(momentum, one_pass=False, scan="chunked"):
    """The Triton op; `one_pass`: measure() runs each step (forward and backward) with the
    launcher's split choice (triton/split.py) replaced by one pass per row, to time what the
    sequence-split scans gain or cost; `scan`: the kernels that run (chunk.SCANS), as
    MOMENTUM_TRITON_SCAN would set them."""
    from plugins.attention.triton import chunk, chunk_momentum_attention

    def run(q, k, v):
        out, _ = chunk_momentum_attention(elu1(q), elu1(k), v, momentum=momentum, step_size=1.0, eps=1e-6,
                                          chunk_size=CHUNK, initial_state=None, lengths=None,
                                          return_state=False)
        return out

    @contextlib.contextmanager
    def single_pass():
        chosen, chunk.scan_splits = chunk.scan_splits, lambda rows, chunks, device: (1, max(chunks, 1))
        try:
            yield
        finally:
            chunk.scan_splits = chosen
    @contextlib.contextmanager
    def scans():
        chosen, chunk.SCAN = chunk.SCAN, scan
        try:
            yield
        finally:
            chunk.SCAN = chosen
    if one_pass:
        run.context = single_pass
    elif scan != chunk.SCAN:
        run.context = scans
    return run


def torch_path_kwargs(fn):
    """Pin the PyTorch path where the API has a backend switch."""
    return {"backend": "torch"} if "backend" in inspect.signature(fn).parameters else {}


def fla_method():
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception:                      # not installed, or its import fails (e.g. a triton mismatch)
        return None
    extra = {"head_first": False} if "head_first" in inspect.signature(chunk_linear_attn).parameters else {}

    def run(q, k, v):                      # fla wants (B, T, H, D)
        out, _ = chunk_linear_attn(elu1(q).transpose(1, 2), elu1(k).transpose(1, 2), v.transpose(1, 2),
                                   scale=1.0, normalize=True, **extra)
        return out
    return run


def method_fn(name):
    if name == "momentum triton":
        return triton_method(BETA)
    if name == "momentum triton 1-pass":
        return triton_method(BETA, one_pass=True)
    if name == "momentum triton fused":
        return triton_method(BETA, scan="fused")
    if name == "linear triton":
        return triton_method(0.0)
    if name == "momentum torch":
        kw = torch_path_kwargs(momentum_attention)
        return lambda q, k, v: momentum_attention(q, k, v, momentum=BETA, chunk_size=CHUNK, **kw)
    if name == "linear torch":
        kw = torch_path_kwargs(linear_attention)
        return lambda q, k, v: linear_attention(q, k, v, chunk_size=CHUNK, **kw)
    if name == "fla linear":
        return fla_method()
    if name == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    raise ValueError(name)


def unavailable(name, device):
    """Why `name` cannot run here, or None."""
    if name.endswith("triton"):
        from plugins.attention import triton as attention_triton
        if not attention_triton.HAS_TRITON:
            return "triton is not installed"
        if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            return "Triton kernels on the CPU need TRITON_INTERPRET=1"
    if name == "fla linear" and fla_method() is None:
        return "fla-core is not installed or does not import (pip install fla-core)"
    return None


def measure(fn, B, H, D, T, backward, dtype="bf16", device="cuda", repeats=None):
    """(median ms, peak MiB above the inputs or None off CUDA) of fn's forward, or forward+backward;
    `repeats`: keyword arguments of timing.median_ms (warm-up and timed runs)."""
    gen = torch.Generator(device=device).manual_seed(T)
    q, k, v = (torch.randn(B, H, T, D, generator=gen, device=device, dtype=DTYPES[dtype])
               .requires_grad_(backward) for _ in range(3))
    grad = torch.randn(B, H, T, D, generator=gen, device=device, dtype=DTYPES[dtype])

    def step():
        with getattr(fn, "context", contextlib.nullcontext)():
            out = fn(q, k, v)
            if backward:
                torch.autograd.grad(out, (q, k, v), grad.view(out.shape))

    step()
    synchronize(device)
    peak = None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    return median_ms(step, device, **(repeats or {})), peak


def run_cases(shapes, dtypes, names, device="cuda", budget_s=None, log=None, repeats=None):
    """One row per (dtype, shape, method, pass), bf16 first and short sequences first, so that a
    budget (seconds; cases not started in time get status "budget") cuts the long fp32 tail."""
    start = time.monotonic()
    methods = {name: method_fn(name) for name in names if unavailable(name, device) is None}
    rows = []
    for dtype in dtypes:
        for B, H, D, T in shapes:
            for name, fn in methods.items():
                for backward in (False, True):
                    row = dict(method=name, B=B, H=H, D=D, T=T, dtype=dtype, backward=backward, ms=None,
                               peak_mib=None, status="ok")
                    case_start = time.monotonic()
                    if budget_s is not None and time.monotonic() - start > budget_s:
                        row["status"] = "budget"
                    else:
                        row.update(_measure_row(fn, (B, H, D, T), backward, dtype, device, repeats))
                        row["case_s"] = time.monotonic() - case_start    # compilation and tuning included
                    rows.append(row)
                    if log:
                        log(row)
    return rows


def _measure_row(fn, shape, backward, dtype, device, repeats):
    try:
        ms, peak = measure(fn, *shape, backward, dtype, device, repeats)
        return {"ms": ms, "peak_mib": peak}
    except torch.cuda.OutOfMemoryError:
        return {"status": "OOM"}
    except Exception as error:  # one method failing (e.g. a kernel compile) keeps the others
        return {"status": "error", "error": f"{type(error).__name__}: {error}"[:300]}
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()


def roofline(row, limits):
    return case_roofline(row, limits, CHUNK)


def markdown(rows, device_name):
    """The table: one line per timed case, with ratios to SDPA and fla of the same case and the
    roofline cells (fractions only where `device_name` is in roofline.DEVICES)."""
    limits = device_limits(device_name)
    by_case = {_case(r) + (r["method"],): r for r in rows}
    lines = [f"{limits_line(limits, device_name)}", "",
             "| dtype | B-H-D-T | method | pass | ms | × SDPA | × fla | peak MiB | "
             + " | ".join(HEADER) + " |",
             "|---|---|---|---|---:|---:|---:|---:|" + "---:|" * len(HEADER)]
    for r in rows:
        sdpa, fla = by_case.get(_case(r) + ("sdpa",)), by_case.get(_case(r) + ("fla linear",))
        cells = roofline(r, limits).cells() if r["status"] == "ok" else ["—"] * len(HEADER)
        peak = "—" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        lines.append(f"| {r['dtype']} | {r['B']}-{r['H']}-{r['D']}-{r['T']} | {r['method']} | "
                     f"{'fwd+bwd' if r['backward'] else 'fwd'} | {_ms(r)} | {_ratio(r, sdpa)} | "
                     f"{_ratio(r, fla)} | {peak} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _case(row):
    return (row["dtype"], row["B"], row["H"], row["D"], row["T"], row["backward"])


def _ms(row):
    return f"{row['ms']:.3f}" if row["status"] == "ok" else row["status"]


def _ratio(row, reference):
    if reference is None or row["status"] != "ok" or reference["status"] != "ok":
        return "—"
    return f"{row['ms'] / reference['ms']:.2f}"


def log_row(row):
    cell = _ms(row) + (f"  {row['error']}" if "error" in row else "")
    print(f"  {row['dtype']} {row['B']}-{row['H']}-{row['D']}-{row['T']} {row['method']:16s} "
          f"{'fwd+bwd' if row['backward'] else 'fwd':7s} {cell}"
          + (f"  ({row['case_s']:.1f} s)" if "case_s" in row else ""), file=sys.stderr, flush=True)


def device_name(device):
    return torch.cuda.get_device_name() if device == "cuda" else "CPU"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["bf16"])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_attention.py needs a CUDA GPU (or --device cpu)")
    shapes = SHAPES[:2] if args.quick else SHAPES
    for name in METHODS:
        reason = unavailable(name, args.device)
        if reason:
            print(f"{name}: skipped, {reason}", file=sys.stderr)
    rows = run_cases(shapes, args.dtypes, METHODS, args.device, log=log_row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"# Causal attention, {'/'.join(args.dtypes)}, {device_name(args.device)}, "
          f"torch {torch.__version__}, β = {BETA}, chunk {CHUNK}; {date.today()}")
    print(markdown(rows, device_name(args.device)))


if __name__ == "__main__":
    main()
