"""Figure 2 of MomentumRNN: ‖∂L/∂h_t‖₂ per time step t, recorded on a fixed probe batch
during training, measured and drawn by `plugins.gradient_norms`."""
from pathlib import Path
from typing import List

import torch
from torch.nn import functional as F

from plugins.gradient_norms import hidden_gradient_norms, save_gradient_heatmap
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
