"""Tables (Table 1 layout: best test accuracy) and Figure-3 style curves for (P)MNIST."""
from pathlib import Path
from typing import Dict, List

from recipes.common.plots import plot_curves, write_results
from recipes.common.stats import mean_curve, mean_std

from .train import History

SUMMARY_HEADERS = ["task", "model", "seeds", "best test acc (%)", "final test acc (%)",
                   "final train loss", "train time (s)"]
CURVE_HEADERS = ["task", "model", "seed", "epoch", "train_seconds", "train_loss", "test_loss",
                 "test_accuracy"]


def summary_rows(task: str, runs: Dict[str, List[History]]) -> List[List]:
    return [[task, name, len(hs), mean_std([100 * max(h.test_accuracy) for h in hs], 2),
             mean_std([100 * h.test_accuracy[-1] for h in hs], 2),
             mean_std([h.train_loss[-1] for h in hs], 4),
             mean_std([h.seconds[-1] for h in hs], 1)] for name, hs in runs.items()]


def curve_rows(task: str, runs: Dict[str, List[History]], seeds: List[int]) -> List[List]:
    return [[task, name, seed, e, round(t, 3), round(tr, 5), round(te, 5), round(a, 5)]
            for name, hs in runs.items() for seed, h in zip(seeds, hs)
            for e, t, tr, te, a in zip(h.epochs, h.seconds, h.train_loss, h.test_loss,
                                       h.test_accuracy)]


def plot_task(task: str, runs: Dict[str, List[History]], out_dir: Path, title: str) -> None:
    for y, label, logy in [("train_loss", "training loss", True),
                           ("test_accuracy", "test accuracy", False)]:
        for x, xlabel, suffix in [("epochs", "epoch", "epoch"),
                                  ("seconds", "training time (s)", "time")]:
            plot_curves({name: mean_curve(hs, x, y) for name, hs in runs.items()},
                        out_dir / f"{task}_{y}_vs_{suffix}.png", xlabel=xlabel, ylabel=label,
                        title=f"{title}: {label}", logy=logy)


def write_tables(rows: List[List], curves: List[List], out_dir: Path, title: str) -> str:
    return write_results(out_dir, title, SUMMARY_HEADERS, rows, CURVE_HEADERS, curves)
