"""benchmarks/rnn.py's nn.LSTM-per-layer: cuDNN's LSTM called one layer at a time, each layer
reading the one before, as the momentum/nag/sr cells call it (their filter sits between layers);
nn.LSTM itself is one call for all layers."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import rnn  # noqa: E402

TINY = rnn.SHAPES["tiny"]


@pytest.mark.parametrize("variant,calls_expected", [("nn.LSTM-per-layer", [1] * TINY["L"]),
                                                    ("nn.LSTM", [TINY["L"]])])
def test_nn_lstm_per_layer_calls_each_layer_on_the_last_ones_output(monkeypatch, variant, calls_expected):
    assert TINY["L"] > 1
    calls, forward = [], torch.nn.LSTM.forward

    def recording(self, input, *args, **kwargs):
        out = forward(self, input, *args, **kwargs)
        calls.append((self.num_layers, input, out[0]))
        return out
    monkeypatch.setattr(torch.nn.LSTM, "forward", recording)
    rnn.build(variant, **TINY)()
    assert [layers for layers, _, _ in calls] == calls_expected
    for (_, _, out), (_, following, _) in zip(calls, calls[1:]):
        assert following is out
    assert calls[-1][2].shape == (TINY["T"], TINY["B"], TINY["H"])


def test_the_gpu_check_times_it_under_its_name():
    assert "nn.LSTM-per-layer" in rnn.GPU_CHECK_VARIANTS
    assert rnn.NAMES["nn.LSTM-per-layer"] == "torch nn.LSTM, one call per layer"
