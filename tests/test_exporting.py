"""plugins.exporting.is_exporting: True while torch.export traces (strict and non-strict), False in
eager calls and under torch.compile. torch.compiler.is_exporting() is True under every torch.compile
before torch 2.13 (dynamo folded it to True: on torch 2.11 a compiled Adam/RMSProp LSTM took the
exported program's drive-first path), so the library reads the flag through this function only."""
import re
from pathlib import Path

import pytest
import torch

from plugins.exporting import is_exporting

ROOT = Path(__file__).resolve().parents[1]


class Flag(torch.nn.Module):
    def forward(self, x):
        return x + float(is_exporting())


def test_false_in_eager_calls_and_under_torch_compile():
    x = torch.zeros(2)
    assert torch.equal(Flag()(x), x)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(Flag(), backend="eager", fullgraph=True)(x), x)


@pytest.mark.parametrize("strict", [False, True])
def test_true_while_torch_export_traces(strict):
    x = torch.zeros(2)
    assert torch.equal(torch.export.export(Flag(), (x,), strict=strict).module()(x), x + 1)
    assert not is_exporting()


def test_the_library_never_asks_torch_compiler_is_exporting():
    calls = [f"{path.relative_to(ROOT)}:{number}"
             for package in ("plugins", "hf_momentum", "fairseq_momentum")
             for path in sorted((ROOT / package).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"torch\.compiler\.is_exporting\(\)", line) and path.name != "exporting.py"]
    assert calls == []
