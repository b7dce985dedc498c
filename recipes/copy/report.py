"""Tables and Figure-1 plots for the copy task from the per-seed histories."""
from pathlib import Path
from typing import Dict, List

from recipes.common.plots import plot_curves, write_results
from recipes.common.stats import mean_curve, mean_std

from .train import History

SUMMARY_HEADERS = ["model", "seeds", "final train loss", "final test loss", "final test acc (%)",
                   "steps to 90% test acc", "train time (s)"]
CURVE_HEADERS = ["model", "seed", "step", "train_seconds", "train_loss", "test_loss",
                 "test_accuracy"]
ACCURACY_TARGET = 0.9


def steps_to_accuracy(history: History, target: float = ACCURACY_TARGET):
    """First evaluated step with test accuracy ≥ target, or None."""
    return next((s for s, a in zip(history.steps, history.test_accuracy) if a >= target), None)


def summary_rows(runs: Dict[str, List[History]]) -> List[List]:
    rows = []
    for name, histories in runs.items():
        reached = [s for s in map(steps_to_accuracy, histories) if s is not None]
        to_target = mean_std(reached, 0)
        if len(reached) < len(histories):
            to_target = f"{to_target} ({len(reached)}/{len(histories)} reached)"
        rows.append([name, len(histories),
                     mean_std([h.train_loss[-1] for h in histories]),
                     mean_std([h.test_loss[-1] for h in histories]),
                     mean_std([100 * h.test_accuracy[-1] for h in histories], 1),
                     to_target,
                     mean_std([h.seconds[-1] for h in histories], 1)])
    return rows


def curve_rows(runs: Dict[str, List[History]], seeds: List[int]) -> List[List]:
    rows = []
    for name, histories in runs.items():
        for seed, h in zip(seeds, histories):
            rows += [[name, seed, s, round(t, 3), round(tr, 5), round(te, 5), round(a, 5)]
                     for s, t, tr, te, a in zip(h.steps, h.seconds, h.train_loss, h.test_loss,
                                                h.test_accuracy)]
    return rows


def write_report(runs: Dict[str, List[History]], seeds: List[int], out_dir: Path,
                 title: str) -> str:
    rows = summary_rows(runs)
    table = write_results(out_dir, title, SUMMARY_HEADERS, rows, CURVE_HEADERS, curve_rows(runs, seeds))
    for y, label, logy in [("train_loss", "training loss", True),
                           ("test_accuracy", "test accuracy", False)]:
        for x, xlabel in [("steps", "iteration"), ("seconds", "training time (s)")]:
            curves = {name: mean_curve(h, x, y) for name, h in runs.items()}
            plot_curves(curves, out_dir / f"{y}_vs_{'step' if x == 'steps' else 'time'}.png",
                        xlabel=xlabel, ylabel=label, title=f"{title}: {label}", logy=logy)
    return table
