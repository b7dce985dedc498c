"""gpu-check's tests part sets TRITON_CACHE_AUTOTUNING=1 so that its xdist workers share each tuning
key's result (benchmarks/gpu_check.py): checked here through Triton's real launch path without a GPU
(tests/triton_standin.py). A first process tunes the attention's forward kernels, timing every config
the pruning keeps (9 on 2026-11-28, each compiled and loaded); a second one with the same cache finds
the results on disk, times nothing and loads the two chosen kernels alone; without the setting it
times them all again."""
import json

import pytest
from helpers.compiled_process import run_compiled

pytest.importorskip("triton")

SCRIPT = """
import json, sys
sys.path[:0] = ["tests", "."]
import triton_standin
triton_standin.activate(90)
import torch
from triton_launch_check import allow_cpu_tensors
allow_cpu_tensors()
timed = []
bench = triton_standin._benchmarker
triton_standin._benchmarker = lambda call, **kw: (timed.append(1), bench(call, **kw))[1]
from plugins.attention.triton import chunk_momentum_attention
from triton.runtime.driver import driver
q, k, v = (torch.randn(1, 2, 200, 64).bfloat16() for _ in range(3))
chunk_momentum_attention(q, k, v, momentum=0.6, step_size=1.0, eps=1e-6, chunk_size=64)
print(json.dumps(dict(timed=len(timed), loaded=len(driver.active.utils.loaded))))
"""


def run(cache_dir, autotune_cache: bool) -> dict:
    return json.loads(run_compiled(SCRIPT, timeout=600, TRITON_CACHE_DIR=cache_dir,
                                   TRITON_DEFAULT_FP_FUSION=1,
                                   TRITON_CACHE_AUTOTUNING=1 if autotune_cache else None))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_second_process_reuses_the_tuned_configs(tmp_path):
    first = run(tmp_path, autotune_cache=True)
    assert first["timed"] >= 4, first               # fwd_h and fwd_o, each over several kept configs
    second = run(tmp_path, autotune_cache=True)
    assert second["timed"] == 0 and second["loaded"] < first["loaded"], (first, second)
    assert run(tmp_path, autotune_cache=False)["timed"] == first["timed"]
