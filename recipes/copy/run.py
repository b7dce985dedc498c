"""Copy task: softmax vs linear vs momentum vs momentum+connection vs adaptive transformers.

    python -m recipes.copy.run [--full] [--out-dir outputs/copy] [--seeds 1 2 3] [--models ...] \\
        [--layer-types KIND,...]
"""
import argparse
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from recipes.common.cli import (
    add_layer_types_argument,
    available_device,
    check_layer_types,
    non_negative_int,
    positive_int,
    require_distinct,
)
from recipes.common.plots import write_run_config

from .config import configure
from .model import VARIANTS
from .report import write_report
from .train import train_copy_model


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m recipes.copy.run", description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="Section 4.1 size (GPU hours, not CPU minutes)")
    p.add_argument("--out-dir", type=Path, default=Path("outputs/copy"))
    p.add_argument("--seeds", type=non_negative_int, nargs="+", default=[1])
    p.add_argument("--models", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--steps", type=positive_int, help="override the number of iterations")
    p.add_argument("--eval-every", type=positive_int, help="override iterations between evaluations")
    p.add_argument("--max-length", type=positive_int, help="override the maximum sequence length")
    add_layer_types_argument(p)
    p.add_argument("--device", type=available_device, default=torch.device("cpu"),
                   help="cpu (default), cuda[:n], or auto (cuda when a CUDA device is present)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch CPU threads (default 1: small runs are latency-bound)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    require_distinct(p, args, "seeds", "models")
    if args.max_length is not None and args.max_length < 8:
        p.error(f"argument --max-length: must be at least 8, got {args.max_length}")
    check_layer_types(p, args.layer_types, configure(args.full).layers)
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    config = configure(args.full, steps=args.steps, eval_every=args.eval_every,
                       max_length=args.max_length, layer_types=args.layer_types)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    runs = {name: [] for name in args.models}
    started = time.perf_counter()
    jobs = [(name, seed) for seed in args.seeds for name in args.models]
    for name, seed in tqdm(jobs, desc="copy task runs", disable=args.no_progress):
        runs[name].append(train_copy_model(name, config, seed, progress=not args.no_progress,
                                           device=args.device))
    title = f"Copy task ({'full' if args.full else 'small'}, seeds {' '.join(map(str, args.seeds))})"
    if config.layer_types is not None:
        title += f", layer types {','.join(config.layer_types)}"
    table = write_report(runs, args.seeds, args.out_dir, title)
    print(table)
    write_run_config(args, started, {"config": asdict(config),
                                     "models": {m: asdict(VARIANTS[m]) for m in args.models}})


if __name__ == "__main__":
    main()
