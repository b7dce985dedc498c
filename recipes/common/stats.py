"""Seed statistics for the recipes' tables and curves."""
import math
import statistics
from typing import List, Sequence


def mean_std(values: Sequence[float], digits: int = 3) -> str:
    """"mean ± std" over seeds, the value alone for one seed (no spread was measured), "n/a" for none."""
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def mean_curve(histories: List, x: str, y: str):
    """Seed-averaged (x, y) points of histories with attributes x and y (equal evaluation steps)."""
    return mean_points([(getattr(h, x), getattr(h, y)) for h in histories])


def mean_points(series: Sequence):
    """Seed-averaged (x, y) points of (xs, ys) pairs, one pair per seed (equal evaluation steps)."""
    columns = [list(zip(xs, ys)) for xs, ys in series]
    return [(statistics.mean(p[0] for p in pts), statistics.mean(p[1] for p in pts)) for pts in zip(*columns)]


def verdict(name: str, values: Sequence[float], baseline: str, baseline_values: Sequence[float], *,
            metric: str, lower_is_better: bool, digits: int = 1) -> str:
    """One line comparing a model with its baseline over seeds: which is better on `metric`, by how
    much, and whether the difference of the means exceeds the seed spread, √(std² + std_baseline²)
    (the standard deviation of the difference of two single runs)."""
    if not values or not baseline_values:
        return f"{name} vs {baseline}: no runs to compare"
    a, b = statistics.mean(values), statistics.mean(baseline_values)
    better, worse = (name, baseline) if (a < b) == lower_is_better else (baseline, name)
    if a == b:
        head = f"{name} vs {baseline}: equal {metric} ({a:.{digits}f})"
    else:
        head = (f"{name} vs {baseline}: {better} better on {metric} by {abs(a - b):.{digits}f} "
                f"({mean_std(values, digits)} vs {mean_std(baseline_values, digits)}, {len(values)} vs "
                f"{len(baseline_values)} seeds)")
    if len(values) < 2 or len(baseline_values) < 2:
        return f"{head}; one seed, so the spread is unknown: not conclusive"
    spread = math.sqrt(statistics.stdev(values) ** 2 + statistics.stdev(baseline_values) ** 2)
    if abs(a - b) > spread:
        return f"{head}; the difference exceeds the seed spread ({spread:.{digits}f})"
    return f"{head}; within the seed spread ({spread:.{digits}f}): no clear difference"
