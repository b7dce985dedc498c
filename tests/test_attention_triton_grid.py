"""Occupancy of the Triton attention kernels on an H100 (132 SMs), without a GPU: the launchers
of plugins/attention/triton/chunk.py run on meta tensors with every kernel replaced by a recorder
of its grid, and each autotuned grid is evaluated at every tile config the GPU's pruner keeps
(the autotuner may pick any of them). Where the state scans are split (few, long rows:
split.scan_splits), every launch whose work grows with the sequence must give each SM two
programs; a pass that only combines the splits' states (`merge` in its name) is exempt (issue 27,
acceptance). At B16-H16-T1k, B4-H16-T4k and B1-H16-T16k the scans run in one pass: splitting
them measured slower on an H200 (split.py; docs/benchmarks.md, 2026-11-26)."""
import importlib.util

import pytest
from helpers.triton_grid import record_launches

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

H100_PROGRAMS = 2 * 132
SPLIT_SHAPES = [(1, 8, 32768), (1, 4, 65536), (2, 2, 131072)]
ONE_PASS_SHAPES = [(1, 16, 16384), (4, 16, 4096), (16, 16, 1024), (32, 16, 256)]
ONE_PASS = ["fwd_h", "fwd_o", "fwd_h", "bwd_prep", "bwd_dh", "bwd_dv", "bwd_dqk"]


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


@pytest.mark.parametrize("B,H,T", SPLIT_SHAPES)
def test_every_sequence_sized_launch_gives_each_h100_sm_two_programs(monkeypatch, B, H, T):
    launches, _, first = record_launches(monkeypatch, B, H, T)
    assert {name for name, _, _ in launches} >= {"fwd_h", "fwd_o", "bwd_prep", "bwd_dh", "bwd_dv", "bwd_dqk",
                                                 "merge_splits"}
    for name, grid, constants in launches:
        if "merge" in name or "combine" in name:
            continue
        fewest = programs(name, grid, constants, first, monkeypatch)
        assert fewest >= H100_PROGRAMS, f"{name} at B{B}-H{H}-T{T}: {fewest} programs"


@pytest.mark.parametrize("B,H,T", ONE_PASS_SHAPES)
def test_many_or_short_rows_scan_in_one_pass(monkeypatch, B, H, T):
    launches, forward, _ = record_launches(monkeypatch, B, H, T)
    assert [name for name, _, _ in launches] == ONE_PASS
    assert forward == 2
