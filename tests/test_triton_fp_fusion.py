"""Every kernel is compiled with FMA contraction (plugins/triton_launch.py, COMPILE_OPTIONS), whatever
the installed Triton's default: Triton 3.9 warns where a launch leaves it to the default, and 3.10
turns the default off. Checked through Triton's real launch path without a GPU (tests/triton_standin.py),
with the default turned off as 3.10 will have it and TRITON_DEFAULT_FP_FUSION unset: the attention's
autotuned chunk kernels and its feature kernels, and the Adam/RMSProp step kernels (pinned)."""
import importlib.util
import json

import pytest
from helpers.compiled_process import run_compiled

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

SCRIPT = """
import json, os, sys, warnings
warnings.simplefilter("always")
caught = []
warnings.showwarning = lambda message, *rest, **kw: caught.append(str(message))
sys.path[:0] = ["tests", "."]
import triton_standin
triton_standin.activate(90)
from triton import knobs
knobs.language.default_fp_fusion = False   # Triton 3.10's default; setting it sets the variable:
os.environ.pop("TRITON_DEFAULT_FP_FUSION")    # unset, 3.9 warns wherever a launch relies on the default
import torch
from triton_launch_check import LSTM_KERNELS, allow_cpu_tensors, lstm_recurrences
allow_cpu_tensors()
from plugins.attention import momentum_attention
from plugins.attention.triton import chunk_kernels, feature_marks
q, k, v = (torch.randn(1, 2, 40, 16).bfloat16().requires_grad_() for _ in range(3))
momentum_attention(q, k, v, momentum=0.6, backend="triton").float().sum().backward()
lstm_recurrences(torch.float32, 16)
kernels = [getattr(chunk_kernels, name) for name in ("fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqk")]
kernels += [getattr(feature_marks, name) for name in ("finite_features_fwd", "finite_features_bwd",
                                                      "mark_causal_kernel")]
fusion = [ck.metadata.enable_fp_fusion for kernel in kernels + LSTM_KERNELS
          for ck in triton_standin.compiled_kernels(kernel)]
print(json.dumps(dict(fused=sum(fusion), unfused=len(fusion) - sum(fusion), lstm=len(LSTM_KERNELS),
                      warned=[message for message in caught if "FP_FUSION" in message])))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_kernel_is_compiled_with_fma_contraction_whatever_the_default(tmp_path):
    result = json.loads(run_compiled(SCRIPT, timeout=840, TRITON_DEFAULT_FP_FUSION=None,
                                     TRITON_FORCE_DISABLE_FP_FUSION=None,
                                     TRITON_CACHE_DIR=tmp_path))   # compile here, not load earlier kernels
    assert result["unfused"] == 0 and result["fused"] >= 8 + result["lstm"], result
    assert result["lstm"] >= 2 and not result["warned"], result
