"""Convergence plots and result tables for the recipes (matplotlib, headless)."""
from pathlib import Path
from typing import Dict, List, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_curves(curves: Dict[str, Sequence[tuple]], path: Path, *, xlabel: str, ylabel: str, title: str,
                logy: bool = False) -> Path:
    """One line per model: curves[name] = [(x, y), …]."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = [(name, points) for name, points in curves.items() if points]
    for name, points in drawn:
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o" if len(xs) < 15 else None, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no points logged", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown_table(headers: List[str], rows: List[List]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(headers: List[str], rows: List[List], path: Path) -> Path:
    import csv
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(headers)
        writer.writerows(rows)
    return path


def write_results(out_dir: Path, title: str, headers: List[str], rows: List[List],
                  curve_headers: Sequence[str] = (), curve_rows: Sequence[Sequence] = ()) -> str:
    """A recipe's results: `results.md` (title + Markdown table), `results.csv`, and
    `curves.csv` when curve rows are given. Returns the Markdown table."""
    table = markdown_table(headers, rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.md").write_text(f"# {title}\n\n{table}\n")
    write_csv(headers, rows, out_dir / "results.csv")
    if curve_rows:
        write_csv(list(curve_headers), list(curve_rows), out_dir / "curves.csv")
    return table


def write_run_config(args, started: float, settings: dict) -> Path:
    """`config.json` beside a recipe's results: its settings plus the run's seeds, threads,
    device and wall time (`started` from time.perf_counter() at the beginning)."""
    import json
    import time

    path = args.out_dir / "config.json"
    path.write_text(json.dumps({**settings, "seeds": args.seeds, "threads": args.threads,
                                "device": str(args.device),
                                "wall_seconds": round(time.perf_counter() - started, 1)}, indent=2))
    print(f"wrote {args.out_dir}/results.md, results.csv, curves.csv and PNG plots")
    return path
