"""benchmarks/roofline.py's bytes model of the Triton attention kernels, on the launches that
chunk.py's launchers make (recorded on meta tensors, nothing runs): every tensor a kernel takes is
modelled, and forward+backward is compared with the ideal bytes of attention_bytes (issue 27
item 2: the target, at most 2× the ideal, is met by the fused kernels, not by the chunked ones)."""
import importlib.util

import pytest
import torch
from helpers.triton_grid import record_launches

from benchmarks.roofline import KERNEL_TRAFFIC, attention_bytes, launch_bytes

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

SHAPES = [(1, 16, 16384), (4, 16, 4096)]


def modelled(monkeypatch, B, H, T, D=64, scan="chunked"):
    arguments = []
    launches, _, _ = record_launches(monkeypatch, B, H, T, D, arguments=arguments, scan=scan)
    return [(name, launch_bytes(name, args, constants))
            for (name, _, constants), args in zip(launches, arguments)]


@pytest.mark.parametrize("scan", ["chunked", "fused"])
def test_every_tensor_argument_of_every_kernel_is_modelled(monkeypatch, scan):
    arguments = []
    launches, _, _ = record_launches(monkeypatch, 1, 2, 4096, arguments=arguments, scan=scan)
    tables = {"lengths", "cu_seqlens", "chunk_offsets", "chunk_indices", "coef"}
    for (name, _, _), args in zip(launches, arguments):
        reads, writes = KERNEL_TRAFFIC[name]
        named = {entry.partition("?")[0] for entry in reads + writes}
        tensors = {arg for arg, value in args.items() if isinstance(value, torch.Tensor)}
        assert tensors - tables == named, name


@pytest.mark.parametrize("scan", ["chunked", "fused"])
@pytest.mark.parametrize("B,H,T", SHAPES + [(16, 16, 1024)])
def test_q_k_v_and_their_gradients_are_counted_at_least_once(monkeypatch, B, H, T, scan):
    """The model never undercounts: fwd+bwd moves at least the ideal bytes."""
    total = sum(n for _, n in modelled(monkeypatch, B, H, T, scan=scan))
    assert total >= attention_bytes("momentum", B, H, T, 64, 64, "bf16", backward=True)


@pytest.mark.parametrize("B,H,T", SHAPES + [(16, 16, 1024)])
def test_fused_forward_and_backward_move_at_most_twice_the_ideal_bytes(monkeypatch, B, H, T):
    """Issue 27 item 2's target, met by the fused kernels (no per-chunk state through memory):
    1.88× at 1-16-16384, 1.93× at 4-16-4096 (split), 1.42× at 16-16-1024."""
    total = sum(n for _, n in modelled(monkeypatch, B, H, T, scan="fused"))
    assert total <= 2 * attention_bytes("momentum", B, H, T, 64, 64, "bf16", backward=True)


@pytest.mark.xfail(strict=True, reason=(
    "the chunked kernels' per-chunk states go through HBM (fwd_h → fwd_o, recomputed for the backward, dh "
    "for bwd_dv/bwd_dqk): 3.55× the ideal at 1-16-16384 and 3.68× at 4-16-4096, both split (one pass: 3.28× "
    "at 16-16-1024); the fused kernels meet the target"))
@pytest.mark.parametrize("B,H,T", SHAPES)
def test_chunked_forward_and_backward_move_at_most_twice_the_ideal_bytes(monkeypatch, B, H, T):
    total = sum(n for _, n in modelled(monkeypatch, B, H, T))
    assert total <= 2 * attention_bytes("momentum", B, H, T, 64, 64, "bf16", backward=True)
