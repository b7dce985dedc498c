"""Seed statistics for the recipes' tables and curves."""
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
    columns = [list(zip(getattr(h, x), getattr(h, y))) for h in histories]
    return [(statistics.mean(p[0] for p in pts), statistics.mean(p[1] for p in pts)) for pts in zip(*columns)]
