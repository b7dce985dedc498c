"""Triton's interpreter runs the kernels on CPU tensors from Triton 3.8 on (plugins/triton_launch.py,
INTERPRETER_FLOOR): an older Triton is refused at the public boundary, naming both versions and the
PyTorch path, instead of failing inside a launch ("0 active drivers" from 3.6's and 3.7's autotuner
on a machine without a GPU)."""
import importlib.util

import pytest
import torch

from plugins.attention import momentum_attention
from plugins.rnn import MomentumLSTM
from plugins.rnn.adam_recurrence import recurrence_backend

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
                                reason="the interpreter's CPU path: triton installed, no GPU")


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
