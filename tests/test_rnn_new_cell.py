"""A new cell is one table entry (plus its float64 transcription for the tests): registered here
through `register_cell` only, it runs through every layer family (forward and gradients vs the
literal equations, `step` ≡ `forward`), the step-wise LSTMStepCell, the HF config, fairseq's
--lstm-cell and the generated cell list of docs/cells.md."""
import argparse

import helpers.rnn_layers as shared
import pytest
import torch
from rnn_literal import LITERAL_DRIVES
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from plugins.rnn import (
    VARIANTS,
    CellVariant,
    LSTMStepCell,
    MomentumLSTM,
    RecurrentState,
    cell_names,
    register_cell,
)
from plugins.rnn.filters import ConstantDecay
from plugins.rnn.variants import cells_markdown

TOY = "halfball"


def toy_drive(g, v, m, step, hyper):
    """Heavy ball with half the momentum: v_t = (μ/2) v_{t-1} + s g_t; the drive is v_t."""
    v = 0.5 * hyper.momentum * v + hyper.step_size * g
    return v, v, None


def toy_decay(hyper, length, start_step):
    """Its filter: M[t, k] = (μ/2)^(t−k), eq. 9 with μ/2 (filters.py)."""
    return None if hyper.momentum == 0 else ConstantDecay(0.5 * hyper.momentum, length, start_step.device)


def toy_literal(g, v, m, step, hp):
    v = hp["mu"] / 2 * v + hp["s"] * g
    return v, v, m


@pytest.fixture
def toy_cell(monkeypatch):
    variant = register_cell(CellVariant(TOY, "heavy ball with μ/2 (a test's toy)", has_v=True, has_m=False,
                                        restart="refused", decay=toy_decay, drive=toy_drive))
    monkeypatch.setitem(LITERAL_DRIVES, TOY, toy_literal)
    yield variant
    del VARIANTS[TOY]


@pytest.mark.parametrize("cls", list(shared.FAMILIES))
def test_registered_cell_runs_in_every_layer_family(toy_cell, cls, make_generator):
    gen = make_generator()
    assert TOY in cell_names(shared.FAMILIES[cls])
    layer = shared.make(cls, TOY, 2, gen)
    lengths = [5, 3]
    x = torch.randn(5, 2, shared.D, generator=gen, dtype=torch.float64, requires_grad=True)
    state = shared.random_state(layer, gen, 2)
    out, new = layer(pack_padded_sequence(x, torch.tensor(lengths)), state)
    out = pad_packed_sequence(out)[0]
    loss, ref_loss = out.sum() + new.v.sum(), 0.0
    for b, n in enumerate(lengths):
        row = RecurrentState(*[None if t is None else t[:, b:b + 1] for t in state[:4]], state.step[b:b + 1])
        ref_out, finals = shared.literal(layer, x[:n, b:b + 1], row)
        torch.testing.assert_close(out[:n, b:b + 1], ref_out, rtol=0, atol=shared.TOL)
        ref_v = torch.stack([f[2] for f in finals])
        torch.testing.assert_close(new.v[:, b:b + 1], ref_v, rtol=0, atol=shared.TOL)
        ref_loss = ref_loss + ref_out.sum() + ref_v.sum()
    leaves = [x] + list(layer.parameters())
    for a, b in zip(torch.autograd.grad(loss, leaves), torch.autograd.grad(ref_loss, leaves)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=shared.TOL)
    first = RecurrentState(*[None if t is None else t[:, :1] for t in state[:4]], state.step[:1])
    with torch.no_grad():
        whole, _ = layer(x[:, :1], first)
        for t in range(5):
            h, first = layer.step(x[t, :1], first)
            torch.testing.assert_close(h, whole[t], rtol=0, atol=shared.TOL)


def test_registered_cell_runs_as_a_step_wise_cell(toy_cell, make_generator):
    gen = make_generator()
    layer = shared.make(MomentumLSTM, TOY, 1, gen)
    cell = LSTMStepCell(shared.D, shared.H, TOY, momentum=shared.HP["mu"], step_size=shared.HP["s"]).double()
    with torch.no_grad():
        cell.x2h.weight.copy_(layer.weight_ih_l0)
        cell.x2h.bias.copy_(layer.bias_ih_l0)
        cell.h2h.weight.copy_(layer.weight_hh_l0)
        cell.h2h.bias.copy_(layer.bias_hh_l0)
    assert cell.variant.step_states == ("v",)
    x = torch.randn(4, 2, shared.D, generator=gen, dtype=torch.float64)
    out, _ = layer(x)
    h = c = torch.zeros(2, shared.H, dtype=torch.float64)
    v = torch.zeros(2, 4 * shared.H, dtype=torch.float64)
    for t in range(4):
        h, (h, c), v = cell(x[t], (h, c), v)
        torch.testing.assert_close(h, out[t], rtol=0, atol=shared.TOL)


def test_registered_cell_is_seen_by_hf_fairseq_and_the_docs(toy_cell):
    pytest.importorskip("transformers")
    from hf_momentum import MomentumLSTMConfig, MomentumLSTMForCausalLM

    config = MomentumLSTMConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1, cell=TOY)
    logits = MomentumLSTMForCausalLM(config)(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 11)
    pytest.importorskip("fairseq")
    from fairseq_momentum.options import add_lstm_cell_args

    parser = argparse.ArgumentParser()
    add_lstm_cell_args(parser)
    assert parser.parse_args(["--lstm-cell", TOY]).lstm_cell == TOY
    assert f"| `{TOY}` |" in cells_markdown()


def test_registering_refuses_taken_names_and_plain_cells():
    with pytest.raises(ValueError, match="already"):
        register_cell(VARIANTS["momentum"])
    with pytest.raises(ValueError, match="plain"):
        register_cell(CellVariant("plain2", "", has_v=False, has_m=False, restart="refused", decay=toy_decay,
                                  drive=toy_drive, plain=True))
    with pytest.raises(ValueError, match="eq. 15"):
        register_cell(CellVariant("adam2", "", has_v=True, has_m=True, restart="refused", decay=toy_decay,
                                  drive=toy_drive))
    with pytest.raises(TypeError):
        register_cell("momentum")
    assert "plain2" not in VARIANTS and "adam2" not in VARIANTS
