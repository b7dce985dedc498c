"""Records each Triton launch's grid on meta tensors (the launch-grid and bytes-model tests)."""
import inspect

import torch


class Recorder:
    """Stands for `kernel`: `kernel[grid](*args, **constants)` records (name, grid, constants) and,
    in `arguments`, the launch's arguments by name."""

    def __init__(self, name, kernel, launches, arguments):
        self.name, self.launches, self.arguments = name, launches, arguments
        while hasattr(kernel, "fn"):                  # autotuner → jit function → Python function
            kernel = kernel.fn
        self.arg_names = list(inspect.signature(kernel).parameters)

    def __getitem__(self, grid):
        def launch(*args, **constants):
            self.launches.append((self.name, grid, constants))
            self.arguments.append(dict(zip(self.arg_names, args)))
        return launch


def record_launches(monkeypatch, B, H, T, D=64, dtype=torch.bfloat16, arguments=None):
    """(launches of a forward and backward, how many of them the forward made, q); the launches'
    arguments by name are appended to `arguments` if given."""
    from plugins.attention.triton import chunk, split
    launches, arguments = [], [] if arguments is None else arguments
    for name in ("fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqk"):
        monkeypatch.setattr(chunk.K, name, Recorder(name, getattr(chunk.K, name), launches, arguments))
    merge = Recorder("merge_splits", split.merge_splits, launches, arguments)
    monkeypatch.setattr(split, "merge_splits", merge)
    meta = torch.device("meta")
    q, k, v, do = (torch.empty(B, H, T, D, dtype=dtype, device=meta) for _ in range(4))
    out, den, *_ = chunk.chunk_forward(q, k, v, None, None, None, None, None, 0.9, 1.0, 1e-6, 64)
    forward = len(launches)
    chunk.chunk_backward(q, k, v, out, den, do, None, None, None, None, None, None, None, None,
                         0.9, 1.0, 1e-6, 64)
    return launches, forward, q


def programs(name, grid, constants, first, monkeypatch):
    """The fewest programs the launch can have: over the configs the GPU's pruner keeps."""
    from plugins.attention.triton import utils
    if not callable(grid):
        return grid[0] * grid[1] * (grid[2] if len(grid) > 2 else 1)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)       # the GPU's config list
    prune = utils.prune_scan if name in ("fwd_h", "bwd_dh") else utils.prune_chunk
    counts = []
    for config in prune(utils.tuning_configs(), {"q": first}, **constants):
        size = grid(config.kwargs)
        counts.append(size[0] * size[1] * (size[2] if len(size) > 2 else 1))
    assert counts, f"the pruner keeps no config of {name}"
    return min(counts)
