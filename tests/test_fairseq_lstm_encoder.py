"""fairseq's LSTM encoder slot (MomentumLSTMEncoderRNN) is one MomentumLSTM stack: it equals the
layer-by-layer composition of single-layer layers (and nn.LSTM for the plain cell), forward and
gradients, bidirectional and on unsorted packed batches; per-layer checkpoints load into it."""
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from fairseq_momentum.modules.momentum_lstm_adapters import MomentumLSTMEncoderRNN
from plugins.rnn import VARIANTS, MomentumLSTM, cell_names
from plugins.rnn.variants import read_hyperparameters

LAYERS, HIDDEN, INPUT = 3, 5, 4


def cell_kwargs(cell):
    restart = 3 if VARIANTS[cell].restart != "refused" else None
    hyper = read_hyperparameters(cell, momentum=0.6, step_size=0.7, beta=0.8)
    return dict(cell=cell, restart=restart, **hyper)


def reversed_in_lengths(x, lengths):
    """x (T, B, C) with the first lengths[b] steps of column b reversed, written as a loop."""
    out = x.clone()
    for b, n in enumerate(lengths.tolist()):
        out[:n, b] = x[:n, b].flip(0)
    return out


def per_layer_reference(layers, packed, h0, c0, directions):
    """The encoder as a loop over single-layer MomentumLSTMs, one per layer and direction
    (i = layer * directions + direction), the backward one run on each sequence reversed."""
    x, lengths = pad_packed_sequence(packed)
    finals_h, finals_c = [], []
    for k in range(len(layers) // directions):
        outs = []
        for d in range(directions):
            i = k * directions + d
            inp = x if d == 0 else reversed_in_lengths(x, lengths)
            out, state = layers[i](pack_padded_sequence(inp, lengths, enforce_sorted=False),
                                   (h0[i:i + 1], c0[i:i + 1]))
            out, _ = pad_packed_sequence(out, total_length=x.size(0))
            outs.append(out if d == 0 else reversed_in_lengths(out, lengths))
            finals_h.append(state.h)
            finals_c.append(state.c)
        x = torch.cat(outs, -1)
    return x, torch.cat(finals_h), torch.cat(finals_c)


def randomised(module, generator):
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.5, generator=generator)
    return module


def per_layer_state_dict(encoder):
    """The encoder's parameters under the per-layer names of a checkpoint saved before the stack."""
    rnn = encoder.rnn
    return {f"layers.{i}.{name}_l0": getattr(rnn, f"{name}_l{rnn.layer_name(i)}").detach().clone()
            for i in range(rnn.num_layers * rnn.directions)
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}


def single_layers(encoder, cell):
    directions = 2 if encoder.bidirectional else 1
    layers = nn.ModuleList(
        MomentumLSTM(INPUT if i < directions else HIDDEN * directions, HIDDEN, 1, **cell_kwargs(cell))
        for i in range(LAYERS * directions)).double()
    for i, layer in enumerate(layers):
        layer.load_state_dict({key.split(".", 2)[2]: value
                               for key, value in per_layer_state_dict(encoder).items()
                               if key.startswith(f"layers.{i}.")})
    return layers


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cell", cell_names("lstm"))
def test_encoder_equals_per_layer_loop(make_generator, cell, bidirectional):
    g = make_generator()
    directions = 2 if bidirectional else 1
    encoder = randomised(MomentumLSTMEncoderRNN(INPUT, HIDDEN, LAYERS, bidirectional=bidirectional,
                                                **cell_kwargs(cell)).double(), g)
    layers = single_layers(encoder, cell)
    lengths = torch.tensor([4, 7, 1, 5])
    x = torch.randn(7, 4, INPUT, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(LAYERS * directions, 4, HIDDEN, generator=g, dtype=torch.float64)
    c0 = torch.randn(LAYERS * directions, 4, HIDDEN, generator=g, dtype=torch.float64)
    pack = lambda: pack_padded_sequence(x, lengths, enforce_sorted=False)

    out, (h, c) = encoder(pack(), (h0, c0))
    out, out_lengths = pad_packed_sequence(out)
    ref, ref_h, ref_c = per_layer_reference(layers, pack(), h0, c0, directions)
    assert out_lengths.tolist() == lengths.tolist()
    for got, want in ((out, ref), (h, ref_h), (c, ref_c)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)

    weights = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (ref, ref_h, ref_c)]
    loss = lambda *ts: sum((t * w).sum() for t, w in zip(ts, weights))
    grads = torch.autograd.grad(loss(out, h, c), [x, *encoder.parameters()])
    ref_grads = torch.autograd.grad(loss(ref, ref_h, ref_c), [x, *layers.parameters()])
    torch.testing.assert_close(grads[0], ref_grads[0], rtol=1e-9, atol=1e-9)
    by_name = dict(zip(per_layer_state_dict(encoder), ref_grads[1:]))
    for name, grad in zip((n for n, _ in encoder.rnn.named_parameters()), grads[1:]):
        k, reverse = name.split("_l")[1].split("_")[0], name.endswith("_reverse")
        key = f"layers.{int(k) * directions + reverse}.{name.split('_l')[0]}_l0"
        torch.testing.assert_close(grad, by_name[key], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_plain_cell_encoder_equals_nn_lstm(make_generator, bidirectional):
    g = make_generator()
    encoder = randomised(MomentumLSTMEncoderRNN(INPUT, HIDDEN, LAYERS, bidirectional=bidirectional,
                                                cell="lstm").double(), g)
    lstm = nn.LSTM(INPUT, HIDDEN, LAYERS, bidirectional=bidirectional).double()
    lstm.load_state_dict({name[len("rnn."):]: p for name, p in encoder.state_dict().items()})
    directions = 2 if bidirectional else 1
    x = torch.randn(6, 3, INPUT, generator=g, dtype=torch.float64)
    packed = pack_padded_sequence(x, torch.tensor([3, 6, 2]), enforce_sorted=False)
    hx = tuple(torch.randn(LAYERS * directions, 3, HIDDEN, generator=g, dtype=torch.float64) for _ in "hc")
    out, (h, c) = encoder(packed, hx)
    ref, (ref_h, ref_c) = lstm(packed, hx)
    torch.testing.assert_close(pad_packed_sequence(out)[0], pad_packed_sequence(ref)[0],
                               rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, ref_h, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(c, ref_c, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_per_layer_checkpoint_loads_bit_identically(make_generator, bidirectional):
    g = make_generator()
    saved = randomised(MomentumLSTMEncoderRNN(INPUT, HIDDEN, LAYERS, bidirectional=bidirectional,
                                              cell="momentum", momentum=0.6, step_size=0.7), g)
    old = {f"encoder.lstm.{key}": value for key, value in per_layer_state_dict(saved).items()}
    outer = nn.Module()
    outer.encoder = nn.Module()
    outer.encoder.lstm = MomentumLSTMEncoderRNN(INPUT, HIDDEN, LAYERS, bidirectional=bidirectional,
                                                cell="momentum", momentum=0.6, step_size=0.7)
    outer.load_state_dict(old)
    for (name, p), (_, q) in zip(outer.encoder.lstm.named_parameters(), saved.named_parameters()):
        assert torch.equal(p, q), name
