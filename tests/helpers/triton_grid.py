"""Records each Triton launch's grid on meta tensors (the launch-grid and bytes-model tests)."""
import inspect
import math

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


FUSED = ("fused_fwd", "fused_bwd_dkv", "fused_bwd_dq")


def record_launches(monkeypatch, B, H, T, D=64, dtype=torch.bfloat16, arguments=None, scan="chunked"):
    """(launches of a forward and backward, how many of them the forward made, q) of the `scan`
    kernels (chunk.SCANS); the launches' arguments by name are appended to `arguments` if given."""
    from plugins.attention.triton import chunk, split
    from plugins.attention.triton import launches as kernels
    launches, arguments = [], [] if arguments is None else arguments
    monkeypatch.setattr(chunk, "SCAN", scan)
    for name in ("fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqk"):
        monkeypatch.setattr(kernels.K, name, Recorder(name, getattr(kernels.K, name), launches, arguments))
    for name in FUSED:
        monkeypatch.setattr(kernels.F, name, Recorder(name, getattr(kernels.F, name), launches, arguments))
    merge = Recorder("merge_splits", split.merge_splits, launches, arguments)
    monkeypatch.setattr(split, "merge_splits", merge)
    meta = torch.device("meta")
    q, k, v, do = (torch.empty(B, H, T, D, dtype=dtype, device=meta) for _ in range(4))
    out, den, _s, _z, _m, splits = chunk.chunk_forward(q, k, v, None, None, None, None, None, 0.9, 1.0, 1e-6,
                                                       64)
    forward = len(launches)
    chunk.chunk_backward(q, k, v, out, den, splits, do, None, None, None, None, None, None, None, None,
                         0.9, 1.0, 1e-6, 64)
    return launches, forward, q


def kept_configs(name, constants, first, monkeypatch):
    """The configs the GPU's pruner keeps for the launch (`first`: its first tensor argument)."""
    from plugins.attention.triton import fused_chunk_kernels, utils
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)       # the GPU's config list
    if name in FUSED:
        configs = fused_chunk_kernels.fused_configs(tile_v=True)
        kept = fused_chunk_kernels.prune_fused(configs, {"q": first}, **constants)
    else:
        scan = name in ("fwd_h", "bwd_dh")
        prune = utils.prune_scan if scan else utils.CHUNK_PRUNERS.get(name, utils.prune_chunk)
        kept = prune(utils.tuning_configs(), {"q": first}, **constants)
    assert kept, f"the pruner keeps no config of {name}"
    return kept


def programs(name, grid, constants, first, monkeypatch):
    """The fewest programs the launch can have: over the configs the GPU's pruner keeps."""
    if not callable(grid):
        return math.prod(grid)
    return min(math.prod(grid({**constants, **config.kwargs}))
               for config in kept_configs(name, constants, first, monkeypatch))
