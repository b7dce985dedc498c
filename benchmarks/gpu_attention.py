"""Causal attention on a CUDA GPU, bf16: forward and forward+backward time and peak memory.

Shapes (B-H-D-T): 4-16-64 at T = 1k, 4k, 16k, 32k and 8-32-128 at T = 8192. Methods, all on the
same q, k, v (B, H, T, D) in one process:
  momentum triton   plugins.attention.triton (β = 0.6), elu+1 applied in the timed function
  linear triton     the same kernels with β = 0 (one carried state)
  momentum torch    plugins.attention.momentum_attention (the PyTorch chunked path), β = 0.6
  linear torch      plugins.attention.linear_attention on the PyTorch path
  fla linear        fla-core's chunk_linear_attn on elu+1-mapped inputs (normalize=True, scale 1),
                    skipped with a message when fla-core is not installed
  sdpa              F.scaled_dot_product_attention(is_causal=True) (flash softmax attention)
Times are medians of CUDA-event-timed runs after warm-up (triton.testing.do_bench); peak memory
is torch.cuda.max_memory_allocated above the inputs during one fwd(+bwd). Ratios are against fla
and SDPA measured in the same run. Prints Markdown.

    python benchmarks/gpu_attention.py                 # all shapes
    python benchmarks/gpu_attention.py --quick         # 4-16-64 at T = 1k, 4k only
"""
import argparse
import inspect
import os
import sys
from datetime import date

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from plugins.attention import linear_attention, momentum_attention

BETA = 0.6
CHUNK = 64
SHAPES = [(4, 16, 64, 1024), (4, 16, 64, 4096), (4, 16, 64, 16384), (4, 16, 64, 32768), (8, 32, 128, 8192)]
METHODS = ["momentum triton", "linear triton", "momentum torch", "linear torch", "fla linear", "sdpa"]


def elu1(x):
    return F.elu(x) + 1


def triton_method(momentum):
    from plugins.attention.triton import chunk_momentum_attention

    def run(q, k, v):
        out, _ = chunk_momentum_attention(elu1(q), elu1(k), v, momentum=momentum, step_size=1.0, eps=1e-6,
                                          chunk_size=CHUNK, initial_state=None, lengths=None,
                                          return_state=False)
        return out
    return run


def torch_path_kwargs(fn):
    """Pin the PyTorch path where the API has a backend switch."""
    return {"backend": "torch"} if "backend" in inspect.signature(fn).parameters else {}


def fla_method():
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except ImportError:
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


def measure(fn, B, H, D, T, backward):
    """(median ms, peak MiB above the inputs) of fn's forward, or forward+backward."""
    from triton.testing import do_bench
    gen = torch.Generator(device="cuda").manual_seed(T)
    q, k, v = (torch.randn(B, H, T, D, generator=gen, device="cuda", dtype=torch.bfloat16)
               .requires_grad_(backward) for _ in range(3))
    grad = torch.randn(B, H, T, D, generator=gen, device="cuda", dtype=torch.bfloat16)

    def step():
        out = fn(q, k, v)
        if backward:
            torch.autograd.grad(out, (q, k, v), grad.view(out.shape))

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    ms = do_bench(step, warmup=25, rep=100, return_mode="median")
    return ms, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_attention.py needs a CUDA GPU")
    shapes = SHAPES[:2] if args.quick else SHAPES
    methods = {name: method_fn(name) for name in METHODS}
    if methods["fla linear"] is None:
        print("fla-core is not installed (pip install fla-core): the fla column is skipped", file=sys.stderr)
    results = {}
    for B, H, D, T in shapes:
        for name, fn in methods.items():
            if fn is None:
                continue
            for backward in (False, True):
                try:
                    results[name, (B, H, D, T), backward] = measure(fn, B, H, D, T, backward)
                except torch.cuda.OutOfMemoryError:
                    results[name, (B, H, D, T), backward] = None
                except Exception as error:  # one method failing (e.g. a kernel compile) keeps the others
                    print(f"  {B}-{H}-{D}-{T} {name}: {type(error).__name__}: {error}", file=sys.stderr)
                    results[name, (B, H, D, T), backward] = "error"
                torch.cuda.empty_cache()
            r = results[name, (B, H, D, T), True]
            cell = _ms(r) if r is None or r == "error" else f"{r[0]:8.2f} ms {r[1]:9.1f} MiB"
            print(f"  {B}-{H}-{D}-{T} {name:16s} {cell}", file=sys.stderr)

    print(f"# Causal attention, bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"β = {BETA}, chunk {CHUNK}; {date.today()}")
    print()
    print("| B-H-D-T | method | fwd ms | fwd+bwd ms | peak MiB (fwd+bwd) | fwd+bwd / fla | fwd+bwd / SDPA |")
    print("|---|---|---|---|---|---|---|")
    for shape in shapes:
        fla = results.get(("fla linear", shape, True))
        sdpa = results.get(("sdpa", shape, True))
        for name in METHODS:
            if (name, shape, True) not in results:
                continue
            fwd, both = results[name, shape, False], results[name, shape, True]
            memory = _ms(both) if both is None or both == "error" else f"{both[1]:.0f}"
            print(f"| {'-'.join(map(str, shape))} | {name} | {_ms(fwd)} | {_ms(both)} | {memory} | "
                  f"{_ratio(both, fla)} | {_ratio(both, sdpa)} |")


def _ms(result):
    """None: out of memory; "error": the method raised (printed while measuring)."""
    if result is None or result == "error":
        return "OOM" if result is None else "error"
    return f"{result[0]:.2f}"


def _ratio(result, reference):
    if any(r is None or r == "error" for r in (result, reference)):
        return "—"
    return f"{result[0] / reference[0]:.2f}"


if __name__ == "__main__":
    main()
