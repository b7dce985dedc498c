"""Figure 2 of MomentumRNN: ‖∂L/∂h_t‖₂ per time step t, recorded on a fixed probe batch
during training, measured by `plugins.gradient_norms` and drawn here. matplotlib is imported
only by the heat map, which draws on the Agg canvas directly (no pyplot, no change of the
global backend)."""
from pathlib import Path
from typing import List

import torch
from torch.nn import functional as F

from plugins.gradient_norms import hidden_gradient_norms
from recipes.common.plots import plot_curves, write_csv


class GradientProbe:
    """Call with (iteration, model) after every optimiser step (and with 0 before training);
    every `every` iterations it stores the (T,) norms of the classification loss on the
    probe batch."""

    def __init__(self, pixels: torch.Tensor, labels: torch.Tensor, every: int):
        self.pixels, self.labels, self.every = pixels, labels, every
        self.iterations: List[int] = []
        self.norms: List[torch.Tensor] = []

    def __call__(self, iteration: int, model) -> None:
        if iteration % self.every:
            return
        loss = lambda states: F.cross_entropy(model.head(states[:, -1]), self.labels)
        self.norms.append(hidden_gradient_norms(model.rnn, self.pixels, loss))
        self.iterations.append(iteration)


def save_gradient_heatmap(norms, path, *, iterations=None, title=None, log_scale=True, dpi=100):
    """Save a PNG heat map of ‖∂L/∂h_t‖₂: rows are training iterations, columns time steps.

    norms: (iterations, T) array-like of non-negative values (e.g. stacked outputs of
    hidden_gradient_norms). iterations: the training iteration of each row, used as the row
    labels (default 0, 1, …). log_scale plots log10 of the norms (zeros as the minimum).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    values = torch.as_tensor(norms, dtype=torch.float64)
    if values.dim() != 2 or values.numel() == 0:
        raise ValueError(f"norms must be a non-empty (iterations, T) array, got shape "
                         f"{tuple(values.shape)}")
    if bool((values < 0).any()) or not bool(torch.isfinite(values).all()):
        raise ValueError("norms must be finite and non-negative")
    if iterations is not None and len(iterations) != values.size(0):
        raise ValueError(f"iterations must give one number per row of norms ({values.size(0)}), "
                         f"got {len(iterations)}")
    label = "‖∂L/∂h_t‖₂"
    if log_scale:
        positive = values[values > 0]
        floor = positive.min() if positive.numel() else torch.tensor(1.0, dtype=torch.float64)
        values = torch.log10(values.clamp(min=floor))
        label = "log10 " + label
    fig = Figure(figsize=(8, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(values.numpy(), aspect="auto", origin="lower", interpolation="nearest",
                      extent=(0.5, values.size(1) + 0.5, -0.5, values.size(0) - 0.5))
    ax.set_xlabel("time step t")
    ax.set_ylabel("training iteration")
    if iterations is not None:
        rows = range(0, values.size(0), max(1, values.size(0) // 8))
        ax.set_yticks(list(rows), [str(iterations[r]) for r in rows])
    if title:
        ax.set_title(title)
    fig.colorbar(image, ax=ax, label=label)
    fig.savefig(path, dpi=dpi, format="png")
    return path


def save_gradient_figures(task: str, probes: dict, out_dir: Path) -> List[Path]:
    """One heat map per model (iterations × t, log10, as Fig. 2), a line plot of the last
    probe of every model, and the raw norms as CSV."""
    paths = []
    for name, probe in probes.items():
        path = out_dir / f"{task}_grad_norms_{name}.png"
        save_gradient_heatmap(torch.stack(probe.norms), path, iterations=probe.iterations,
                              title=f"{task}, {name}: ‖∂L/∂h_t‖ during training")
        paths.append(path)
    last = {name: [(t + 1, float(v)) for t, v in enumerate(p.norms[-1])] for name, p in probes.items()}
    paths.append(plot_curves(last, out_dir / f"{task}_grad_norms_final.png", xlabel="time step t",
                             ylabel="‖∂L/∂h_t‖₂", logy=True,
                             title=f"{task}: gradient norm per step after training"))
    rows = [[name, it, t + 1, float(v)] for name, p in probes.items()
            for it, norms in zip(p.iterations, p.norms) for t, v in enumerate(norms)]
    paths.append(write_csv(["model", "iteration", "t", "grad_norm"], rows,
                           out_dir / f"{task}_grad_norms.csv"))
    return paths
