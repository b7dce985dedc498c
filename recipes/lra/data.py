"""Generate the Long-Range Arena's ListOps and Pathfinder data, deterministically by seed.

    python -m recipes.lra.data listops --out DIR [--n N] [--seed S]     # DIR/{train,val,test}.tsv
    python -m recipes.lra.data pathfinder --out DIR [--n N] [--seed S]  # DIR/{train,val,test}.npz
"""
import argparse
from pathlib import Path

from recipes.common.cli import bounded_int, non_negative_int, positive_int

from . import listops, pathfinder

SPLITS = ("train", "val", "test")


def split_sizes(n: int, n_val, n_test, ratio: int):
    """Val and test default to n // ratio (at least 1), the release's proportions."""
    default = max(1, n // ratio)
    return {"train": n, "val": default if n_val is None else n_val,
            "test": default if n_test is None else n_test}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m recipes.lra.data", description=__doc__.splitlines()[0])
    tasks = p.add_subparsers(dest="task", required=True)
    lo = tasks.add_parser("listops", help="ListOps TSV files in the LRA release's format")
    lo.add_argument("--out", type=Path, required=True, help="output folder (required)")
    lo.add_argument("--n", type=positive_int, default=96_000,
                    help="training examples (default: %(default)s, the release's count)")
    lo.add_argument("--n-val", type=non_negative_int,
                    help="validation examples (default: n // 48, 2000 for the default n, as the release)")
    lo.add_argument("--n-test", type=non_negative_int, help="test examples (default: n // 48)")
    lo.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default: %(default)s)")
    lo.add_argument("--max-depth", type=lambda t: bounded_int(t, 2), default=10,
                    help="tree depth, digits included (default: %(default)s)")
    lo.add_argument("--max-args", type=lambda t: bounded_int(t, 2), default=10,
                    help="arguments per operator (default: %(default)s)")
    lo.add_argument("--min-length", type=non_negative_int, default=500,
                    help="keep trees of more tokens than this, parentheses not counted "
                         "(default: %(default)s)")
    lo.add_argument("--max-length", type=positive_int, default=2000,
                    help="and of fewer tokens than this (default: %(default)s)")
    lo.add_argument("--no-parens", action="store_true",
                    help="write [MAX 2 9 ] instead of the release's ( ( ( [MAX 2 ) 9 ) ] ) "
                         "(default: parentheses)")

    pf = tasks.add_parser("pathfinder", help="Pathfinder images and labels (npz: images, labels, markers)")
    pf.add_argument("--out", type=Path, required=True, help="output folder (required)")
    pf.add_argument("--n", type=positive_int, default=160_000,
                    help="training images (default: %(default)s, the release's 80 %% of 200,000)")
    pf.add_argument("--n-val", type=non_negative_int, help="validation images (default: n // 8)")
    pf.add_argument("--n-test", type=non_negative_int, help="test images (default: n // 8)")
    pf.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default: %(default)s)")
    pf.add_argument("--difficulty", choices=list(pathfinder.CONTOUR_LENGTHS), default="hard",
                    help="dashes per main path: " + ", ".join(f"{k} {v}" for k, v in
                                                              pathfinder.CONTOUR_LENGTHS.items())
                    + " (default: %(default)s)")
    pf.add_argument("--size", type=lambda t: bounded_int(t, 8), default=32,
                    help="image side in pixels (default: %(default)s)")

    args = p.parse_args(argv)
    if args.task == "listops" and args.max_length <= args.min_length + 1:
        p.error(f"argument --max-length: must exceed --min-length + 1 = {args.min_length + 1}, "
                f"got {args.max_length}")
    return args


def write_listops(args) -> dict:
    sizes = split_sizes(args.n, args.n_val, args.n_test, ratio=48)
    trees = listops.generate(sum(sizes.values()), args.seed, max_depth=args.max_depth,
                             max_args=args.max_args, min_length=args.min_length, max_length=args.max_length)
    paths, start = {}, 0
    for split in SPLITS:        # one pool of distinct trees: no expression in two splits
        paths[split] = listops.write_tsv(args.out / f"{split}.tsv", trees[start:start + sizes[split]],
                                         parens=not args.no_parens)
        start += sizes[split]
    return paths


def write_pathfinder(args) -> dict:
    sizes = split_sizes(args.n, args.n_val, args.n_test, ratio=8)
    settings = pathfinder.Settings.for_difficulty(args.difficulty, size=args.size)
    paths, start = {}, 0
    for split in SPLITS:        # consecutive sample indices: no sample in two splits
        data = pathfinder.generate(sizes[split], args.seed, settings, start=start)
        paths[split] = pathfinder.save_npz(args.out / f"{split}.npz", data)
        start += sizes[split]
    return paths


def main(argv=None) -> int:
    args = parse_args(argv)
    paths = (write_listops if args.task == "listops" else write_pathfinder)(args)
    for split, path in paths.items():
        print(f"[lra] {args.task} {split}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
