"""benchmarks/gpu_kernels.py's flops per kernel (step_flops): recorded from the launches a step makes
through Triton's real launch path (tests/triton_standin.py: compiled for sm_90, launches that do
nothing), each at the tile it ran, the direct launcher's kept entry. Forced tiles of bwd_dqk that
differ only in BK must differ by the repeats of dNum·Vᵀ and nothing else; the scans' count is the
closed form of eq. 13's state updates."""
import json

import pytest
from helpers.compiled_process import run_compiled

pytest.importorskip("triton")

SCRIPT = """
import json, sys
sys.path[:0] = ["tests", ".", "benchmarks"]
import triton_standin
triton_standin.activate(90)
import torch
from triton_launch_check import allow_cpu_tensors
allow_cpu_tensors()
import gpu_kernels
from plugins.attention.triton import chunk_momentum_attention
q, k, v = (torch.randn(1, 2, 200, 64).bfloat16().requires_grad_() for _ in range(3))

def step():
    out, _ = chunk_momentum_attention(q, k, v, momentum=0.6, step_size=1.0, eps=1e-6, chunk_size=64)
    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

found = {}
for bk in (16, 64):
    tiles = {name: (64, 64, 8) for name in ("fwd_h", "fwd_o", "bwd_dh", "bwd_dv")}
    with gpu_kernels.forced_tiles({**tiles, "bwd_dqk": (bk, 64, 8)}):
        step()
        found[bk] = gpu_kernels.step_flops(step)
print(json.dumps(found))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_each_kernel_s_flops_at_the_tile_it_ran(tmp_path):
    found = json.loads(run_compiled(SCRIPT, timeout=900, TRITON_CACHE_DIR=tmp_path,
                                    TRITON_DEFAULT_FP_FUSION=1))
    small, whole = found["16"], found["64"]
    assert set(small) == set(whole) == {"fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqk"}
    chunks, cube = 2 * 4, 2 * 64 ** 3                  # B·H rows of cdiv(200, 64) chunks; one 64³ dot
    assert whole["fwd_h"] == 2 * chunks * 2 * cube      # forward, and again in the backward: S and M'
    assert whole["bwd_dh"] == chunks * 2 * cube
    assert small["bwd_dqk"] - whole["bwd_dqk"] == 3 * chunks * cube     # dNum·Vᵀ once per K tile
    assert all(small[name] == whole[name] for name in ("fwd_h", "fwd_o", "bwd_dh", "bwd_dv"))
