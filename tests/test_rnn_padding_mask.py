"""Padded rows in the sequence layers through `padding_mask` (what torch.export traces, where a
PackedSequence's lengths would be read on the host): every cell of the table, in every layer family,
one and two directions, both layouts, runs each row exactly as its real steps alone — outputs (zero
at padding), the final state (h, c, v, m and the step counter) and the gradients of the input, the
weights and the initial state — in float64, with padding on the left, on the right, inside a row and
a row of padding only; bad masks are refused by name."""
import pytest
import torch
from test_rnn_packed import CASES, D, H, assert_same_results, case_id, make, random_state, segment_state
from torch.nn.utils.rnn import pack_sequence

from plugins.rnn import MomentumLSTM, OrthogonalMomentumRNN, RecurrentState

RTOL = 1e-12  # RMSProp's gradients reach 1e3 (eps = 1e-6 under √m): float64 rounding then passes TOL
LENGTH = 9
# OrthogonalMomentumRNN has one direction
DIRECTED_CASES = [(cls, cell, 1) for cls, cell in CASES] + [
    (cls, cell, 2) for cls, cell in CASES if cls is not OrthogonalMomentumRNN]


def masks(gen):
    """(5, LENGTH) bool: right, left and inner padding, a full row and a row of padding only."""
    real = torch.zeros(5, LENGTH, dtype=torch.bool)
    real[0, :4] = True
    real[1, 6:] = True
    real[2] = torch.rand(LENGTH, generator=gen) < 0.5
    real[2, 3] = True
    real[3] = True
    return real


def rows_alone(layer, x, real, state):
    """Each row's real steps as a call of their own: outputs (batch, LENGTH, ·) laid out as the
    padded input (zero at padding) and the final states stacked over rows (a row without a real
    step keeps its initial state)."""
    outs, finals = [], []
    for b in range(real.shape[0]):
        init = segment_state(state, b)
        out = x.new_zeros(LENGTH, layer.directions * H)
        if not real[b].any():
            finals.append(layer._state(init, 1, x, 0))
            outs.append(out)
            continue
        steps = x[b, real[b]]
        got, final = layer(steps[None] if layer.batch_first else steps[:, None], init)
        outs.append(out.index_put((real[b],), got[0] if layer.batch_first else got[:, 0]))
        finals.append(final)
    cat = lambda i, dim=1: None if finals[0][i] is None else torch.cat([f[i] for f in finals], dim)
    return torch.stack(outs), RecurrentState(cat(0), cat(1), cat(2), cat(3), cat(4, 0))


def masked(layer, x, real, state):
    out, final = layer(x if layer.batch_first else x.transpose(0, 1), state, padding_mask=real)
    return (out if layer.batch_first else out.transpose(0, 1)), final


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("case", DIRECTED_CASES, ids=lambda case: f"{case_id(case[:2])}-{case[2]}dir")
def test_padded_rows_equal_each_row_alone(case, batch_first, make_generator):
    cls, cell, directions = case
    gen = make_generator()
    options = {"bidirectional": True} if directions > 1 else {}
    layer = make(cls, cell, gen, batch_first=batch_first, **options)
    real = masks(gen)
    x = torch.randn(real.shape + (D,), generator=gen, dtype=torch.float64, requires_grad=True)
    for state in (random_state(layer, gen, real.shape[0]), None):
        got = masked(layer, x, real, state)
        assert not got[0][~real].any(), "outputs at padding are zero"
        assert_same_results(layer, x, state, got, rows_alone(layer, x, real, state), gen, grad_rtol=RTOL)


@pytest.mark.parametrize("cell", ["momentum", "adam"])
def test_a_mask_that_ignores_the_padding_differs(cell, make_generator):
    """The comparison above can fail: the same rows run whole (padding read as steps) differ."""
    gen = make_generator()
    layer = make(MomentumLSTM, cell, gen, batch_first=True)
    real = masks(gen)
    x = torch.randn(real.shape + (D,), generator=gen, dtype=torch.float64)
    ref_out, ref_final = rows_alone(layer, x, real, None)
    out, final = masked(layer, x, torch.ones_like(real), None)
    assert not torch.allclose(out * real[..., None], ref_out, atol=1e-3)
    assert not torch.allclose(final.h, ref_final.h, atol=1e-3)


def test_bad_padding_mask_is_refused_by_name(make_generator):
    gen = make_generator()
    layer = make(MomentumLSTM, "momentum", gen, batch_first=True)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    real = torch.ones(2, 5, dtype=torch.bool)
    bad = [(real.long(), "bool tensor"), (real[:, :4], r"shape \(batch, time\) = \(2, 5\)"),
           (real.T, r"shape \(batch, time\)"), ([[True] * 5] * 2, "bool tensor")]
    for mask, reason in bad:
        with pytest.raises(ValueError, match=f"padding_mask.*{reason}"):
            layer(x, padding_mask=mask)
    with pytest.raises(ValueError, match="padding_mask cannot be combined with cu_seqlens"):
        layer(x[:1], padding_mask=real[:1], cu_seqlens=torch.tensor([0, 2, 5]))
    with pytest.raises(ValueError, match="padding_mask cannot be combined with .* PackedSequence"):
        layer(pack_sequence([x[0], x[1, :3]]), padding_mask=real)
    with pytest.raises(ValueError, match="input must be a 3-D tensor"):
        layer(x[0], padding_mask=real)
