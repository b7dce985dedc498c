"""MomentumLSTM / MomentumRNN(bidirectional=True): nn.LSTM's layout (parameters `_reverse`, state rows
layer * 2 + direction, outputs [forward | backward]), each direction the unidirectional layer, the
backward one on every sequence reversed; what it cannot do is refused by name."""
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from plugins.rnn import VARIANTS, MomentumLSTM, MomentumRNN, cell_names
from plugins.rnn.variants import read_hyperparameters


def cell_kwargs(cell):
    restart = 3 if VARIANTS[cell].restart != "refused" else None
    hyper = read_hyperparameters(cell, momentum=0.6, step_size=0.7, beta=0.8)
    return dict(cell=cell, restart=restart, **hyper)


def randomised(module, generator):
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.5, generator=generator)
    return module


@pytest.mark.parametrize("family,torch_family,plain", [(MomentumLSTM, nn.LSTM, "lstm"),
                                                        (MomentumRNN, nn.RNN, "rnn")])
@pytest.mark.parametrize("batch_first", [False, True])
def test_plain_cell_equals_torch_bidirectional(make_generator, family, torch_family, plain, batch_first):
    g = make_generator()
    layer = randomised(family(4, 5, 2, cell=plain, bidirectional=True, batch_first=batch_first).double(), g)
    ref = torch_family(4, 5, 2, bidirectional=True, batch_first=batch_first).double()
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(3, 6, 4, generator=g, dtype=torch.float64)
    h0 = torch.randn(4, 3 if batch_first else 6, 5, generator=g, dtype=torch.float64)
    state = (h0, torch.randn_like(h0)) if family is MomentumLSTM else h0
    out, final = layer(x, state)
    want, want_final = ref(x, state)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final.h, want_final[0] if family is MomentumLSTM else want_final,
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cell", cell_names("lstm"))
def test_each_direction_is_the_unidirectional_layer(make_generator, cell):
    g = make_generator()
    both = randomised(MomentumLSTM(4, 5, 1, bidirectional=True, **cell_kwargs(cell)).double(), g)
    forward, backward = (MomentumLSTM(4, 5, 1, **cell_kwargs(cell)).double() for _ in range(2))
    for single, suffix in ((forward, ""), (backward, "_reverse")):
        single.load_state_dict({f"{name}_l0": getattr(both, f"{name}_l0{suffix}")
                                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
    lengths = torch.tensor([5, 2, 4])
    x = torch.randn(5, 3, 4, generator=g, dtype=torch.float64)
    out, state = both(pack_padded_sequence(x, lengths, enforce_sorted=False))
    out = pad_packed_sequence(out)[0]
    for b, n in enumerate(lengths.tolist()):
        alone = x[:n, b:b + 1]
        ahead, ahead_state = forward(alone)
        behind, behind_state = backward(alone.flip(0))
        torch.testing.assert_close(out[:n, b:b + 1], torch.cat([ahead, behind.flip(0)], -1),
                                   rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(state.c[:, b], torch.cat([ahead_state.c, behind_state.c])[:, 0],
                                   rtol=1e-10, atol=1e-10)
        if state.v is not None:
            torch.testing.assert_close(state.v[:, b], torch.cat([ahead_state.v, behind_state.v])[:, 0],
                                       rtol=1e-10, atol=1e-10)


def test_recurrent_weight_reaches_both_directions(make_generator):
    g = make_generator()
    layer = randomised(MomentumLSTM(3, 4, 2, cell="momentum", momentum=0.6, step_size=0.7,
                                    bidirectional=True).double(), g)
    x = torch.randn(5, 2, 3, generator=g, dtype=torch.float64)
    seen = []
    zeroed, _ = layer(x, recurrent_weight=lambda k, w: seen.append(k) or torch.zeros_like(w))
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.startswith("weight_hh"):
                p.zero_()
    want, _ = layer(x)
    assert seen == [0, 1, 2, 3]
    torch.testing.assert_close(zeroed, want, rtol=1e-12, atol=1e-12)


def test_what_a_bidirectional_layer_cannot_do_is_refused():
    layer = MomentumLSTM(3, 4, cell="momentum", bidirectional=True)
    with pytest.raises(ValueError, match="step needs a unidirectional layer"):
        layer.step(torch.randn(2, 3))
    with pytest.raises(ValueError, match="cu_seqlens / segment_starts need a unidirectional layer"):
        layer(torch.randn(6, 1, 3), cu_seqlens=torch.tensor([0, 2, 6]))
    with pytest.raises(ValueError, match="bidirectional must be"):
        MomentumLSTM(3, 4, bidirectional="yes")
