"""benchmarks/rnn.py compares float32 variants at a stated precision: by torch's defaults cuDNN's
RNNs take TF32 and float32 matmuls (and the Adam/RMSProp recurrences with them) do not, so the
variants nn.LSTM-ieee and adam-tf32 run each side at the other's. Each must run under its
precision and leave torch's settings as they were, also when the call fails."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import rnn  # noqa: E402

from plugins.rnn import MomentumLSTM  # noqa: E402

TINY = rnn.SHAPES["tiny"]


def cudnn_rnn_precision() -> str:
    flags = getattr(torch.backends.cudnn, "rnn", None)
    if hasattr(flags, "fp32_precision"):
        return flags.fp32_precision
    return "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"


def settings():
    return cudnn_rnn_precision(), torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32


def test_torch_defaults_differ_between_cudnn_rnns_and_matmuls():
    """What the two extra variants are for: if torch's defaults agreed, they would be redundant."""
    assert settings() == ("tf32", "highest", False)


@pytest.mark.parametrize("variant,seen", [("nn.LSTM-ieee", ("ieee", "highest", False)),
                                          ("adam-tf32", ("tf32", "high", True)),
                                          ("nn.LSTM", ("tf32", "highest", False)),
                                          ("adam", ("tf32", "highest", False))])
def test_each_variant_runs_at_its_precision_and_restores_torch_s(monkeypatch, variant, seen):
    """The settings are read inside the modules' forward (the Triton recurrence reads allow_tf32
    at its launch, cuDNN its RNN flag at its call)."""
    before, calls = settings(), []
    for cls in (torch.nn.LSTM, MomentumLSTM):
        forward = cls.forward

        def recording(self, *args, _forward=forward, **kwargs):
            calls.append(settings())
            return _forward(self, *args, **kwargs)
        monkeypatch.setattr(cls, "forward", recording)
    rnn.build(variant, **TINY)()
    assert calls and set(calls) == {seen}
    assert settings() == before


def test_the_settings_come_back_when_the_call_fails():
    before = settings()

    def fails():
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        rnn.at_precision(fails, cudnn_rnn="ieee", matmul="tf32")()
    assert settings() == before


def test_the_table_gives_each_row_against_cudnn_without_tf32():
    results = [dict(shape="tiny", variant=v, seconds=s, peak_mib=0.0)
               for v, s in (("appendix-f", 8.0), ("nn.LSTM", 1.0), ("nn.LSTM-ieee", 2.0), ("adam", 3.0))]
    rows = {line.split("|")[2].strip(): line for line in rnn.table(results).splitlines()[2:]}
    assert rows["adam"].rstrip(" |").endswith("1.50")                 # 3 / 2, where × nn.LSTM is 3.00
    assert "| 3.00 |" in rows["adam"]
    assert "torch nn.LSTM, cuDNN without TF32" in rows
