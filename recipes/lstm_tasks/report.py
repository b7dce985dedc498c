"""Tables and Figure-4 style loss plots for the copying and adding tasks."""
import statistics
from pathlib import Path
from typing import Dict, List

from recipes.common.plots import markdown_table, plot_curves, write_csv

from .train import History

SUMMARY_HEADERS = ["task", "model", "seeds", "final train loss", "final test loss",
                   "memoryless baseline", "train time (s)"]
CURVE_HEADERS = ["task", "model", "seed", "step", "train_seconds", "train_loss", "test_loss"]


def mean_std(values: List[float], digits: int = 4) -> str:
    if not values:
        return "n/a"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {std:.{digits}f}"


def mean_curve(histories: List[History], x: str, y: str):
    """Seed-averaged (x, y) points; all seeds share the evaluation steps."""
    columns = [list(zip(getattr(h, x), getattr(h, y))) for h in histories]
    return [(statistics.mean(p[0] for p in pts), statistics.mean(p[1] for p in pts))
            for pts in zip(*columns)]


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
    table = markdown_table(SUMMARY_HEADERS, rows)
    (out_dir / "results.md").write_text(f"# {title}\n\n{table}\n")
    write_csv(SUMMARY_HEADERS, rows, out_dir / "results.csv")
    write_csv(CURVE_HEADERS, curves, out_dir / "curves.csv")
    return table
