"""Registers and spills (ptxas -v for sm_90a, no GPU needed) of the fused attention kernels at every
config the autotuner keeps (fused_chunk_kernels.fused_configs), as markdown rows of
docs/kernel_resources.md: bf16, fp16 and exact fp32, with and without momentum, D 64, chunks of 32.

    python benchmarks/fused_registers.py [--dim 64]       # without TRITON_INTERPRET"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

SCALARS = ("N", "H", "NT", "CPS", "G", "N_BUCKET", "BH_BUCKET")
INPUTS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=64)
    dim = parser.parse_args().dim
    import triton
    import triton_standin
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from plugins.attention.triton import fused_chunk_kernels as FK
    from plugins.attention.triton.utils import block
    for dtype, ieee in (("bf16", False), ("fp16", False), ("fp32", True)):
        for momentum in (True, False):
            for name in ("fused_fwd", "fused_bwd_dkv", "fused_bwd_dq"):
                kernel = getattr(FK, name)
                tiles = dict(DK=dim, DV=dim, BT=FK.MAX_CHUNK, BK=block(dim), BV=block(dim))
                consts = dict(**tiles, MOMENTUM=momentum, HAS_LEN=True, IS_VARLEN=False, LOW=dtype == "bf16",
                              IEEE=ieee, **EXTRA[name])
                for config in FK._prune_v(FK.fused_configs(name == "fused_fwd"), {}, **consts):
                    full = {**consts, **config.kwargs}
                    source = ASTSource(kernel.fn, pointer_types(kernel.fn, full, dtype), constexprs=full)
                    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
                    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
                    regs, stores, loads = triton_standin.registers_and_spills(compiled)
                    shown = " ".join(f"{k}={int(full[k])}" for k in ("DK", "DV", "BT", "BK", "BV", "SPLIT_V",
                                                                     "MOMENTUM", "IEEE"))
                    print(f"| {name} | {dtype} | {shown} | {config.num_warps} | {config.num_stages} | {regs} "
                          f"| {stores} / {loads} | {compiled.metadata.shared} |", flush=True)


if __name__ == "__main__":
    main()
