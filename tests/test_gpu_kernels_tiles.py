"""benchmarks/gpu_kernels.py --tiles: a chunk kernel forced to a tile its pruner does not keep
(here, through Triton's interpreter, a tile other than the head size's) runs at that tile, stays
exact against the float64 token loop (eq. 12), and leaves the kernel's own tuning as it was."""
import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from helpers.triton_attention import TOL, loss_of, make_inputs, rel_rms, triton_ops, upstreams

from plugins.attention.naive import naive_recurrent_momentum_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


def tile_of(config):
    return config.kwargs["BK"], config.kwargs["BV"], config.num_warps


def test_forced_tiles_run_there_exactly_and_restore_the_tuning(make_generator):
    import gpu_kernels

    from plugins.attention.triton import chunk_kernels as K
    tri = triton_ops()
    gen = make_generator()
    B, H, N, D, beta = 1, 2, 70, 32, 0.6                     # 70: a partial last chunk of 32
    fq, fk, v, real = make_inputs(gen, B, H, N, D, D, torch.tensor([N]))
    up = upstreams(gen, B, H, N, D, D)[0]

    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (fq, fk, v)]
        out = fn(*leaves)
        return out, torch.autograd.grad(loss_of(out, None, [up.to(dtype)]), leaves)

    ref_out, ref_grads = run(lambda q, k, x: naive_recurrent_momentum_attention(
        q, k, x, None, momentum=beta, feature_map="identity", padding_mask=real)[0], torch.float64)
    prunes = {name: getattr(K, name).early_config_prune for name in ("bwd_dqk", "fwd_o")}
    caches = {name: getattr(K, name).cache for name in prunes}
    tuned = {name: dict(cache) for name, cache in caches.items()}       # what earlier calls chose
    forced = {"bwd_dqk": (16, 32, 4), "fwd_o": (32, 16, 4)}   # the interpreter's pruner keeps (32, 32)
    with gpu_kernels.forced_tiles(forced):
        out, grads = run(lambda q, k, x: tri.chunk_momentum_attention(
            q, k, x, momentum=beta, step_size=1.0, eps=1e-6, chunk_size=32)[0], torch.float32)
        for name, tile in forced.items():
            chosen = {tile_of(config) for config in getattr(K, name).cache.values()}
            assert chosen == {tile}, name
    assert rel_rms(out, ref_out) <= TOL
    for name, got, expected in zip(("fq", "fk", "v"), grads, ref_grads):
        assert rel_rms(got, expected) <= TOL, f"d{name}: {rel_rms(got, expected):.2e}"
    for name in prunes:
        assert getattr(K, name).early_config_prune is prunes[name]
        assert getattr(K, name).cache is caches[name] and caches[name] == tuned[name]

    with pytest.raises(ValueError, match="bwd_dqk: no tuning config has"), \
            gpu_kernels.forced_tiles({"bwd_dqk": (48, 32, 4)}):
        run(lambda q, k, x: tri.chunk_momentum_attention(
            q, k, x, momentum=beta, step_size=1.0, eps=1e-6, chunk_size=32)[0], torch.float32)


def test_tiles_are_parsed_or_refused_with_the_form():
    import gpu_kernels
    assert gpu_kernels.parse_tile("bwd_dqk=64,16,8") == ("bwd_dqk", (64, 16, 8))
    for bad in ("bwd_dqk=64,16", "nope=16,16,4", "fwd_o=16,x,4", "fwd_o"):
        with pytest.raises(argparse.ArgumentTypeError, match="KERNEL=BK,BV,WARPS"):
            gpu_kernels.parse_tile(bad)
