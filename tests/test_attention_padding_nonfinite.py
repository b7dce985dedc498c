"""NaN/inf in a padded position of q, k or v reaches no gradient and no real output: causal and
not, in one process and with context parallelism (process_group) over 1-3 gloo ranks, each rank
holding a slice of the same padded sequence."""
import json

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import spawn_gloo

from plugins.attention import momentum_attention
from plugins.attention.context_parallel import slice_bounds

B, H, N, D = 2, 2, 9, 3
PADDED = (0, 4)                    # (row, position) of the padded token that gets the bad value
CASES = [(causal, name, value) for causal in (True, False) for name in "qkv"
         for value in ("nan", "inf", "-inf")]


def padded_inputs(name, value):
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, [1, 4, 8]] = False
    mask[1, :2] = False
    bad = dict(q=q, k=k, v=v)[name]
    bad[PADDED[0], :, PADDED[1]] = float(value)
    upstream = torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    return q, k, v, mask, upstream


def finite_everywhere(causal, name, value, world=1, rank=0, group=None):
    """Runs one case on this rank's slice; True when every gradient and every real output is finite."""
    q, k, v, mask, upstream = padded_inputs(name, value)
    start, stop = slice_bounds(N, world, rank)
    q, k, v = (t[:, :, start:stop].clone().requires_grad_() for t in (q, k, v))
    mask, upstream = mask[:, start:stop], upstream[:, :, start:stop]
    out = momentum_attention(q, k, v, momentum=0.6, step_size=0.8, causal=causal, padding_mask=mask,
                             chunk_size=2, process_group=group)
    real = mask[:, None, :, None]
    torch.where(real, out * upstream, torch.zeros(())).sum().backward()
    outputs = bool(torch.isfinite(out[real.expand_as(out)]).all())
    return outputs and all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))


@pytest.mark.parametrize("causal, name, value", CASES)
def test_one_process(causal, name, value):
    assert finite_everywhere(causal, name, value)


def _worker(rank, world, out_dir):
    results = {f"{c}-{n}-{v}": finite_everywhere(c, n, v, world, rank, dist.group.WORLD)
               for c, n, v in CASES}
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(results, f)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_context_parallel(world, tmp_path):
    spawn_gloo(_worker, world, str(tmp_path))
    for rank in range(world):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        failed = [case for case, ok in results.items() if not ok]
        assert failed == [], f"rank {rank} of {world}: non-finite gradient or real output in {failed}"
