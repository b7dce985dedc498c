"""Copying and adding tasks: LSTM vs MomentumLSTM, AdamLSTM, RMSPropLSTM, NAG and SR LSTM.

    python -m recipes.lstm_tasks.run [--full] [--out-dir outputs/lstm_tasks] [--seeds 1 2 3]
        [--tasks copying adding] [--models lstm momentum adam rmsprop nag sr]
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
from .data import ADDING_BASELINE_MSE, copying_baseline_loss
from .report import curve_rows, plot_task, summary_rows, write_tables
from .train import train_task_model
from .variants import ADDING, MODELS, copying_specs


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m recipes.lstm_tasks.run",
                                description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="Appendix A.4 / Table 6 size (GPU hours)")
    p.add_argument("--out-dir", type=Path, default=Path("outputs/lstm_tasks"))
    p.add_argument("--seeds", type=non_negative_int, nargs="+", default=[1])
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    p.add_argument("--steps", type=positive_int, help="override the number of iterations")
    p.add_argument("--length", type=positive_int,
                   help="override the copying delay L / the adding length T")
    p.add_argument("--eval-every", type=positive_int, help="override iterations between evaluations")
    p.add_argument("--device", type=available_device, default=torch.device("cpu"),
                   help="cpu (default), cuda[:n], or auto (cuda when a CUDA device is present)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch CPU threads (default 1: small runs are latency-bound)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    require_distinct(p, args, "seeds", "tasks", "models")
    if args.length is not None and "adding" in args.tasks and args.length < 2:
        p.error(f"argument --length: the adding task needs at least 2 steps, got {args.length}")
    return args


def baseline(config) -> float:
    if config.task == "copying":
        return copying_baseline_loss(config.symbols, config.length, config.n_symbols)
    return ADDING_BASELINE_MSE


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    size = "full" if args.full else "small"
    configs = {task: configure(task, args.full, steps=args.steps, length=args.length,
                               eval_every=args.eval_every) for task in args.tasks}
    runs = {task: {name: [] for name in args.models} for task in args.tasks}
    jobs = [(task, name, seed) for task in args.tasks for seed in args.seeds for name in args.models]
    started = time.perf_counter()
    for task, name, seed in tqdm(jobs, desc="lstm task runs", disable=args.no_progress):
        runs[task][name].append(train_task_model(name, configs[task], seed,
                                                 progress=not args.no_progress,
                                                 device=args.device))
    rows, curves = [], []
    for task in args.tasks:
        config = configs[task]
        rows += summary_rows(task, runs[task], baseline(config))
        curves += curve_rows(task, runs[task], args.seeds)
        length = f"L = {config.length}" if task == "copying" else f"T = {config.length}"
        plot_task(task, runs[task], args.out_dir, f"{task} ({size}, {length})")
    title = f"Copying and adding tasks ({size}, seeds {' '.join(map(str, args.seeds))})"
    table = write_tables(rows, curves, args.out_dir, title)
    specs = {task: {m: asdict((copying_specs(configs[task].length) if task == "copying" else ADDING)[m])
                    for m in args.models} for task in args.tasks}
    print(table)
    write_run_config(args, started, {"configs": {t: asdict(c) for t, c in configs.items()}, "cells": specs})


if __name__ == "__main__":
    main()
