"""Triton's interpreter runs the kernels on CPU tensors from Triton 3.8 on (plugins/triton_launch.py,
INTERPRETER_FLOOR): an older Triton is refused before the first launch (at the attention's entry
points; where the Adam/RMSProp recurrence picks the interpreter), naming both versions and the
PyTorch path, instead of failing inside a launch ("0 active drivers" from 3.6's and 3.7's autotuner
on a machine without a GPU)."""
import importlib.util

import pytest
import torch
from helpers.compiled_process import run_compiled

from plugins.attention import momentum_attention
from plugins.rnn import MomentumLSTM, adam_recurrence_triton
from plugins.rnn.adam_recurrence import recurrence_backend

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
                                reason="the interpreter's CPU path: triton installed, no GPU")


@pytest.fixture(autouse=True)
def lstm_kernels_chosen_afresh():
    """The Adam/RMSProp step kernels are chosen once per process (`_kernel` is cached) and the floor is
    checked there: each test starts and ends with none chosen, whatever ran before it in its worker."""
    adam_recurrence_triton._kernel.cache_clear()
    yield
    adam_recurrence_triton._kernel.cache_clear()


def attention(gen):
    q, k, v = (torch.randn(1, 2, 5, 4, generator=gen) for _ in range(3))
    return momentum_attention(q, k, v, momentum=0.5, backend="triton")


def adam_lstm(gen):
    torch.manual_seed(0)
    layer = MomentumLSTM(3, 4, cell="adam")
    with recurrence_backend("triton"):
        return layer(torch.randn(5, 2, 3, generator=gen))[0]


@pytest.mark.parametrize("run, instead", [(attention, "backend='torch'"),
                                          (adam_lstm, "recurrence backend 'torch' or 'cudnn'")])
@pytest.mark.parametrize("old", ["3.6.0", "3.7.1"])
def test_a_triton_before_3_8_is_refused_naming_both_versions(monkeypatch, make_generator, run, instead, old):
    import triton
    monkeypatch.setattr(triton, "__version__", old)
    with pytest.raises(RuntimeError) as refused:
        run(make_generator())
    message = str(refused.value)
    assert f"Triton {old}" in message and "triton>=3.8" in message and instead in message


@pytest.mark.parametrize("run", [attention, adam_lstm])
@pytest.mark.parametrize("new", ["3.8.0", "3.10.0"])
def test_triton_3_8_and_later_run(monkeypatch, make_generator, run, new):
    """3.10 compares as a version, not as text ("3.10" < "3.8")."""
    import triton
    monkeypatch.setattr(triton, "__version__", new)
    assert torch.isfinite(run(make_generator())).all()


COMPILED_FROM_CPU = """
import sys
sys.path[:0] = ["tests", "."]
import triton_standin
triton_standin.activate(90)
import torch
import triton
triton.__version__ = "3.6.0"             # the GPU image's Triton, below the interpreter's floor
from triton_launch_check import LSTM_KERNELS, allow_cpu_tensors, lstm_recurrences
allow_cpu_tensors()
lstm_recurrences(torch.float32, 16)
print(sum(1 for kernel in LSTM_KERNELS for _ in triton_standin.compiled_kernels(kernel)))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compiling_for_the_gpu_from_cpu_tensors_is_not_refused():
    """`make triton-carry` compiles the Adam/RMSProp step kernels for sm_90 with the GPU image's
    Triton 3.6 on CPU tensors, through Triton's real launcher (tests/triton_standin.py): no
    interpreter runs there, so its Triton floor must not refuse them (it did, from where the
    backend was chosen, and the carry's build failed)."""
    compiled = int(run_compiled(COMPILED_FROM_CPU, timeout=540))
    assert compiled >= 4, compiled          # adam and rmsprop, each on both backends
