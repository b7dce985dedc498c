"""The Triton attention kernels' launches per forward+backward, without a GPU: the launchers of
plugins/attention/triton/chunk.py run on meta tensors with every kernel replaced by a recorder
(tests/helpers/triton_grid.py, as the launch-grid and bytes-model tests do). Per shape: the
launches in order, the fewest programs of each over the tile configs an H100's pruner keeps
(132 SMs: 264 is two per SM), and benchmarks/roofline.py's bytes model against the ideal bytes.
Nothing is timed: GPU speed is measured by `make gpu-check`.

    python benchmarks/launch_model.py [--shapes 1-8-32768 4-16-4096]"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=SHAPES, help="B-H-T, bf16, D 64")
    parser.add_argument("--scans", nargs="+", default=["chunked", "fused"], help="chunk.SCANS to model")
    args = parser.parse_args()
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
