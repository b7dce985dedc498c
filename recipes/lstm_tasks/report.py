"""Tables and Figure-4 style loss plots for the copying and adding tasks."""
from pathlib import Path
from typing import Dict, List

from recipes.common.plots import plot_curves, write_results
from recipes.common.stats import mean_curve, mean_std

from .train import History

SUMMARY_HEADERS = ["task", "model", "seeds", "final train loss", "final test loss",
                   "memoryless baseline", "train time (s)"]
CURVE_HEADERS = ["task", "model", "seed", "step", "train_seconds", "train_loss", "test_loss"]


def summary_rows(task: str, runs: Dict[str, List[History]], baseline: float) -> List[List]:
    return [[task, name, len(hs), mean_std([h.train_loss[-1] for h in hs]),
             mean_std([h.test_loss[-1] for h in hs]), f"{baseline:.4f}",
             mean_std([h.seconds[-1] for h in hs], 1)] for name, hs in runs.items()]


def curve_rows(task: str, runs: Dict[str, List[History]], seeds: List[int]) -> List[List]:
    return [[task, name, seed, s, round(t, 3), round(tr, 6), round(te, 6)]
            for name, hs in runs.items() for seed, h in zip(seeds, hs)
            for s, t, tr, te in zip(h.steps, h.seconds, h.train_loss, h.test_loss)]


def plot_task(task: str, runs: Dict[str, List[History]], out_dir: Path, title: str) -> None:
    for y, label in [("train_loss", "training loss"), ("test_loss", "held-out loss")]:
        for x, xlabel, suffix in [("steps", "iteration", "step"), ("seconds", "training time (s)", "time")]:
            plot_curves({name: mean_curve(hs, x, y) for name, hs in runs.items()},
                        out_dir / f"{task}_{y}_vs_{suffix}.png", xlabel=xlabel, ylabel=label,
                        title=f"{title}: {label}", logy=True)


def write_tables(rows: List[List], curves: List[List], out_dir: Path, title: str) -> str:
    return write_results(out_dir, title, SUMMARY_HEADERS, rows, CURVE_HEADERS, curves)
