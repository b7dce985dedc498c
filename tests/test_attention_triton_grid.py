"""Occupancy of the Triton attention kernels on an H100 (132 SMs), without a GPU: the launchers
of plugins/attention/triton/chunk.py run on meta tensors with every kernel replaced by a recorder
of its grid, and each autotuned grid is evaluated at every tile config the GPU's pruner keeps
(the autotuner may pick any of them). Every launch whose work grows with the sequence must give
each SM two programs; a pass that only combines the splits' states (`merge` in its name) is
exempt (issue 27, acceptance)."""
import importlib.util
import inspect

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

H100_PROGRAMS = 2 * 132
SHAPES = [(1, 8, 32768), (1, 16, 16384), (4, 16, 4096), (16, 16, 1024)]


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
    for name in ("fwd_h", "fwd_o", "bwd_prep", "bwd_dh", "bwd_dv", "bwd_dqk"):
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


@pytest.mark.parametrize("B,H,T", SHAPES)
def test_every_sequence_sized_launch_gives_each_h100_sm_two_programs(monkeypatch, B, H, T):
    launches, _, first = record_launches(monkeypatch, B, H, T)
    assert {name for name, _, _ in launches} >= {"fwd_h", "fwd_o", "bwd_prep", "bwd_dh", "bwd_dv", "bwd_dqk"}
    for name, grid, constants in launches:
        if "merge" in name or "combine" in name:
            continue
        fewest = programs(name, grid, constants, first, monkeypatch)
        assert fewest >= H100_PROGRAMS, f"{name} at B{B}-H{H}-T{T}: {fewest} programs"


def test_rows_that_fill_the_gpu_scan_in_one_pass(monkeypatch):
    launches, forward, _ = record_launches(monkeypatch, 32, 16, 256)
    names = [name for name, _, _ in launches]
    assert names == ["fwd_h", "fwd_o", "fwd_h", "bwd_prep", "bwd_dh", "bwd_dv", "bwd_dqk"]
    assert forward == 2
