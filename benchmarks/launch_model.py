"""The Triton attention kernels' launches per forward+backward, without a GPU: the launchers of
plugins/attention/triton/chunk.py run on meta tensors with every kernel replaced by a recorder
(tests/helpers/triton_grid.py, as the launch-grid and bytes-model tests do). Per shape: the
launches in order, the fewest programs of each over the tile configs an H100's pruner keeps
(132 SMs: 264 is two per SM), and benchmarks/roofline.py's bytes model against the ideal bytes.
With --flops: each launch's matrix-product flops (roofline.launch_flops) at each tile the pruner
keeps for the dtype, against eq. 13's own (attention_flops). Nothing is timed: GPU speed is
measured by `make gpu-check`.

    python benchmarks/launch_model.py [--shapes 1-8-32768 4-16-4096]
    python benchmarks/launch_model.py --flops --dtype fp32 --shapes 16-16-1024 --scans chunked"""
import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
# Meta tensors, recorders for kernels: nothing launches, and without a GPU Triton has no driver for
# the launch plans (plugins/triton_launch.py) to ask for a device; the interpreter's plans are none.
os.environ.setdefault("TRITON_INTERPRET", "1")

from benchmarks.gpu_attention import DTYPES  # noqa: E402 (after the interpreter is chosen)

SHAPES = ["1-8-32768", "1-16-16384", "4-16-4096", "16-16-1024"]


def model(B: int, H: int, T: int, D: int = 64, scan: str = "chunked") -> dict:
    from _pytest.monkeypatch import MonkeyPatch
    from helpers.triton_grid import programs, record_launches

    from benchmarks.roofline import attention_bytes, launch_bytes
    patch, arguments = MonkeyPatch(), []
    try:
        launches, forward, first = record_launches(patch, B, H, T, D, arguments=arguments, scan=scan)
        rows = [(name, programs(name, grid, constants, first, patch), launch_bytes(name, args, constants))
                for (name, grid, constants), args in zip(launches, arguments)]
    finally:
        patch.undo()
    return {"rows": rows, "forward": forward,
            "ideal": attention_bytes("momentum", B, H, T, D, D, "bf16", backward=True)}


def tile_label(config) -> str:
    """A chunk kernel's (BK, BV, warps), or a fused kernel's SPLIT_V and warps."""
    if "BK" in config.kwargs:
        return f"({config.kwargs['BK']}, {config.kwargs['BV']}, {config.num_warps})"
    return f"SPLIT_V {config.kwargs['SPLIT_V']}, {config.num_warps} warps"


def flops_model(B: int, H: int, T: int, D: int = 64, scan: str = "chunked", dtype: str = "bf16") -> dict:
    """Per launch of a forward+backward: (kernel, [(tile_label, flops) per kept config]), and eq. 13's
    own flops at the kernels' chunk of 64."""
    from _pytest.monkeypatch import MonkeyPatch
    from helpers.triton_grid import kept_configs, record_launches

    from benchmarks.roofline import attention_flops, launch_flops
    patch, arguments = MonkeyPatch(), []
    try:
        launches, forward, first = record_launches(patch, B, H, T, D, dtype=DTYPES[dtype],
                                                   arguments=arguments, scan=scan)
        rows = []
        for (name, grid, constants), args in zip(launches, arguments):
            configs = kept_configs(name, constants, first, patch) if callable(grid) else []
            tiles = [(tile_label(c), launch_flops(name, args, constants, c.all_kwargs())) for c in configs]
            rows.append((name, tiles or [(None, launch_flops(name, args, constants, {}))]))
    finally:
        patch.undo()
    return {"rows": rows, "forward": forward,
            "ideal": attention_flops("momentum", B, H, T, D, D, 64, backward=True)}


def print_flops(shapes, scans, dtype) -> None:
    print("| B-H-D-T | kernels | launch | GFLOP at each kept config: (BK, BV, warps) or the fused ones' |")
    print("|---|---|---|---|")
    for shape, scan in ((shape, scan) for shape in shapes for scan in scans):
        B, H, T = (int(x) for x in shape.split("-"))
        m = flops_model(B, H, T, scan=scan, dtype=dtype)
        for name, tiles in m["rows"]:
            cells = ", ".join(f"{f / 1e9:.3f}" + (f" at {tile}" if tile else "") for tile, f in tiles)
            print(f"| {B}-{H}-64-{T} | {scan} | {name} | {cells} |")
        fewest = sum(min(f for _, f in tiles) for _, tiles in m["rows"])
        most = sum(max(f for _, f in tiles) for _, tiles in m["rows"])
        print(f"| {B}-{H}-64-{T} | {scan} | fwd+bwd | {fewest / 1e9:.3f} to {most / 1e9:.3f} "
              f"(eq. 13's own: {m['ideal'] / 1e9:.3f}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=SHAPES, help="B-H-T, bf16, D 64")
    parser.add_argument("--scans", nargs="+", default=["chunked", "fused"], help="chunk.SCANS to model")
    parser.add_argument("--flops", action="store_true", help="each launch's modelled flops at the kept tiles")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES),
                        help="with --flops: the inputs' dtype")
    args = parser.parse_args()
    if args.flops:
        print_flops(args.shapes, args.scans, args.dtype)
        return
    print("| B-H-D-T | kernels | launches fwd + bwd | fewest programs per launch | modelled MB (× ideal) |")
    print("|---|---|---:|---|---:|")
    for shape, scan in ((shape, scan) for shape in args.shapes for scan in args.scans):
        B, H, T = (int(x) for x in shape.split("-"))
        m = model(B, H, T, scan=scan)
        total = sum(n for _, _, n in m["rows"])
        launches = ", ".join(f"{name} {count}" for name, count, _ in m["rows"])
        print(f"| {B}-{H}-64-{T} | {scan} | {m['forward']} + {len(m['rows']) - m['forward']} | {launches} | "
              f"{total / 1e6:.0f} ({total / m['ideal']:.2f}×) |")


if __name__ == "__main__":
    main()
