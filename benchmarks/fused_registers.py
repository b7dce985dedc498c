"""Registers and spills (ptxas -v for sm_90a, no GPU needed) of the fused attention kernels at every
config the autotuner keeps (fused_chunk_kernels.fused_configs and prune_fused), as markdown rows of
docs/kernel_resources.md: bf16, fp16 and exact fp32, with and without momentum, D 64, chunks of 32,
every pointer 16-byte aligned as launched. The last column counts the loads Triton's software
pipeline issues ahead of their chunk (0: not pipelined).

    python benchmarks/fused_registers.py [--dim 64] [--stages 1 2 3] [--dtypes bf16 fp16] [--json]

Without TRITON_INTERPRET (under the interpreter the autotuner keeps one config). --json prints a
JSON object per compiled kernel instead of a markdown row."""
import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

SCALARS = ("N", "H", "NT", "CPS", "G", "N_BUCKET", "BH_BUCKET")
INPUTS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
EXTRA = {"fused_fwd": dict(USE_INIT=True), "fused_bwd_dq": dict(USE_INIT=True),
         "fused_bwd_dkv": dict(HAS_FINAL_GRAD=True, DDEN_READY=False)}


def pointer_types(fn, consts, dtype):
    types = {}
    for name in fn.arg_names:
        if name in consts:
            types[name] = "constexpr"
        elif name in SCALARS:
            types[name] = "i32"
        else:
            element = dtype if name in INPUTS else "fp32"
            types[name] = "*" + {"lengths": "i32", "cu_seqlens": "i32"}.get(name, element)
    return types


def aligned(fn, types) -> dict:
    """Every pointer 16-byte aligned, as Triton's launcher specialises a torch allocation: the
    software pipeliner's asynchronous copies need the alignment, so a kernel compiled without it
    pipelines fewer loads than the launched one."""
    return {(i,): [["tt.divisibility", 16]]
            for i, name in enumerate(fn.arg_names) if types[name].startswith("*")}


def kept_kernels(dtype: str, momentum: bool, dim: int = 64, stages=None):
    """(kernel name, config, num_stages, CompiledKernel) of each fused kernel at every config the
    pruner keeps for `dtype` inputs, compiled for sm_90a (at each of `stages` instead of the
    config's own, if given); no GPU needed, nothing launched."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from plugins.attention.triton import fused_chunk_kernels as FK
    from plugins.attention.triton.utils import block
    first = torch.empty(0, dtype=getattr(torch, TORCH_DTYPES[dtype]))     # what the pruner reads
    for name in ("fused_fwd", "fused_bwd_dkv", "fused_bwd_dq"):
        kernel = getattr(FK, name)
        consts = dict(DK=dim, DV=dim, BT=FK.MAX_CHUNK, BK=block(dim), BV=block(dim), MOMENTUM=momentum,
                      HAS_LEN=True, IS_VARLEN=False, LOW=dtype == "bf16", IEEE=dtype == "fp32", **EXTRA[name])
        for config in FK.prune_fused(FK.fused_configs(name == "fused_fwd"), {"q": first}, **consts):
            full = {**consts, **config.kwargs}
            types = pointer_types(kernel.fn, full, dtype)
            source = ASTSource(kernel.fn, types, constexprs=full, attrs=aligned(kernel.fn, types))
            for num_stages in stages or [config.num_stages]:
                options = {"num_warps": config.num_warps, "num_stages": num_stages}
                yield name, config, num_stages, triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                                               options=options)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--stages", type=int, nargs="+", default=None,
                        help="compile each kept config at these num_stages instead of its own")
    parser.add_argument("--dtypes", nargs="+", choices=list(TORCH_DTYPES), default=list(TORCH_DTYPES))
    parser.add_argument("--json", action="store_true", help="a JSON object per kernel instead of a row")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("run without TRITON_INTERPRET: the interpreter's config list is not the GPU's")
    from triton_standin import prefetched_loads, registers_and_spills
    for dtype in args.dtypes:
        for momentum in (True, False):
            for name, config, stages, compiled in kept_kernels(dtype, momentum, args.dim, args.stages):
                regs, stores, loads = registers_and_spills(compiled)
                row = dict(kernel=name, dtype=dtype, constants=_shown(compiled), warps=config.num_warps,
                           stages=stages, registers=regs, spill_stores=stores, spill_loads=loads,
                           shared=compiled.metadata.shared, prefetched=prefetched_loads(compiled))
                print(json.dumps(row) if args.json else _markdown(row), flush=True)


def _markdown(row: dict) -> str:
    shown = " ".join(f"{k}={int(v)}" for k, v in row["constants"].items())
    return (f"| {row['kernel']} | {row['dtype']} | {shown} | {row['warps']} | {row['stages']} "
            f"| {row['registers']} | {row['spill_stores']} / {row['spill_loads']} | {row['shared']} "
            f"| {row['prefetched']} |")


def _shown(compiled) -> dict:
    from triton_standin import named_constants
    consts = named_constants(compiled)
    return {k: int(consts[k]) for k in ("DK", "DV", "BT", "BK", "BV", "SPLIT_V", "MOMENTUM", "IEEE")}


if __name__ == "__main__":
    main()
