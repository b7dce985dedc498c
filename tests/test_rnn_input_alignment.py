"""With layers.INPUT_ALIGN = 8 (opt-in; 1 by default) the filtered input of the momentum / nag / sr
cells (layers.input_map) reaches torch's fused kernel (cuDNN on CUDA) with its channels padded by
zeros to a multiple of 8: its d + 1 (+ B) channels give the input GEMMs an odd row pitch (401 and
1151 at PTB's sizes). The padded channels change nothing: outputs, states and every gradient equal
the unpadded run's."""
import pytest
import torch

from plugins.rnn import MomentumLSTM, MomentumRNN, OrthogonalMomentumRNN, layers, orthogonal
from plugins.rnn.variants import read_hyperparameters

T, B = 7, 3


def make(cls, cell, D, H, bias, gen):
    kwargs = dict(restart=3 if cell == "sr" else None,
                  **read_hyperparameters(cell, momentum=0.6, step_size=0.7))
    layer = cls(D, H, 2, cell=cell, bias=bias, **kwargs).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return layer


def fused_widths(monkeypatch) -> list:
    """The input widths of every call of torch's fused kernel, recorded from now on."""
    widths = []
    fused = layers.fused_recurrence

    def recorded(kind, inp, *args, **kwargs):
        widths.append(inp.size(-1))
        return fused(kind, inp, *args, **kwargs)
    monkeypatch.setattr(layers, "fused_recurrence", recorded)
    return widths


def input_map_widths(monkeypatch, module) -> list:
    """The widths of the inputs layers.input_map forms for `module`'s calls, recorded from now on."""
    widths, input_map = [], layers.input_map

    def recorded(*args):
        inp, w, b = input_map(*args)
        widths.append(inp.size(-1))
        return inp, w, b
    monkeypatch.setattr(module, "input_map", recorded)
    return widths


def run(layer, x, lengths):
    """Output, final state and the gradients of every parameter and of the input, for a call
    carrying the state of a first call (v_0 carried: the B channels) over padded sequences."""
    x = x.clone().requires_grad_()
    _, state = layer(x[:3])
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    out, final = layer(packed, state)
    data = out.data
    loss = (data * torch.linspace(-1, 1, data.numel(), dtype=data.dtype).view_as(data)).sum()
    loss = loss + sum((t * 0.3).sum() for t in (final.h, final.c, final.v) if t is not None)
    grads = torch.autograd.grad(loss, [x, *layer.parameters()])
    return data, final, grads


@pytest.mark.parametrize("cls,cell,D,H,bias", [
    (MomentumLSTM, "momentum", 5, 6, True), (MomentumLSTM, "momentum", 7, 8, True),
    (MomentumLSTM, "nag", 4, 5, False), (MomentumLSTM, "sr", 9, 4, True),
    (MomentumRNN, "momentum", 5, 6, True), (MomentumLSTM, "adam", 5, 6, True)])
def test_padded_channels_change_nothing(monkeypatch, make_generator, cls, cell, D, H, bias):
    gen = make_generator()
    layer = make(cls, cell, D, H, bias, gen)
    x = torch.randn(T, B, D, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([T, 4, 6])
    widths = fused_widths(monkeypatch)
    plain = run(layer, x, lengths)
    if cls is not MomentumLSTM or cell != "adam":
        assert any(width % 8 for width in widths), "the unpadded run is no control"
    monkeypatch.setattr(layers, "INPUT_ALIGN", 8)
    widths.clear()
    padded = run(layer, x, lengths)
    if cls is not MomentumLSTM or cell != "adam":
        assert widths and all(width % 8 == 0 for width in widths), widths
    assert torch.allclose(padded[0], plain[0], rtol=1e-12, atol=1e-13)
    for name in ("h", "c", "v", "m"):
        got, expected = getattr(padded[1], name), getattr(plain[1], name)
        assert (got is None) == (expected is None), name
        if got is not None:
            assert torch.allclose(got, expected, rtol=1e-12, atol=1e-13), name
    for got, expected in zip(padded[2], plain[2]):
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("cell", ["momentum", "nag"])
def test_packed_rows_padded_equal_each_sequence_alone(monkeypatch, make_generator, cell):
    """Packed rows (cu_seqlens: a SegmentDecay per segment) with the padded channels: every segment's
    output and final state as that sequence's run alone, unpadded."""
    gen = make_generator()
    layer = make(MomentumLSTM, cell, 5, 6, True, gen)
    lengths = [4, 7, 2]
    seqs = [torch.randn(n, 1, 5, generator=gen, dtype=torch.float64) for n in lengths]
    alone = [layer(seq) for seq in seqs]
    widths = input_map_widths(monkeypatch, layers)        # the rows reach torch's packed kernel
    monkeypatch.setattr(layers, "INPUT_ALIGN", 8)
    cu = torch.tensor([0, 4, 11, 13], dtype=torch.int32)
    out, final = layer(torch.cat(seqs), cu_seqlens=cu)
    assert widths and all(width % 8 == 0 for width in widths), widths
    for i, (start, (seq_out, seq_final)) in enumerate(zip(cu[:-1].tolist(), alone)):
        assert torch.allclose(out[start:start + lengths[i]], seq_out, rtol=1e-12, atol=1e-13)
        for name in ("h", "c", "v"):
            assert torch.allclose(getattr(final, name)[:, i], getattr(seq_final, name)[:, 0],
                                  rtol=1e-12, atol=1e-13), name


def test_the_kept_joined_weight_follows_a_change_of_the_alignment(monkeypatch, make_generator):
    """Without gradients [W | b_ih] is kept between calls (JoinedWeightCache): one formed unpadded is
    not handed to a padded call, nor the other way round."""
    gen = make_generator()
    layer = make(MomentumLSTM, "momentum", 5, 6, True, gen).eval()
    x = torch.randn(T, B, 5, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        plain, _ = layer(x)
        monkeypatch.setattr(layers, "INPUT_ALIGN", 8)
        padded, _ = layer(x)
        monkeypatch.setattr(layers, "INPUT_ALIGN", 1)
        again, _ = layer(x)
    assert torch.allclose(padded, plain, rtol=1e-12, atol=1e-13)
    assert torch.equal(again, plain)


@pytest.mark.parametrize("cell", ["momentum", "adam"])
def test_the_orthogonal_rnn_input_map_is_padded_and_equal(monkeypatch, make_generator, cell):
    """The orthogonal RNN forms v = W x̃ through input_map without the fused kernel: the same."""
    gen = make_generator()
    layer = OrthogonalMomentumRNN(5, 6, cell=cell, **read_hyperparameters(cell, momentum=0.6,
                                                                          step_size=0.7)).double()
    x = torch.randn(T, B, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    widths = input_map_widths(monkeypatch, orthogonal)
    plain, _ = layer(x)
    plain_grads = torch.autograd.grad(plain.sum(), [x, *layer.parameters()])
    monkeypatch.setattr(layers, "INPUT_ALIGN", 8)
    out, _ = layer(x)
    grads = torch.autograd.grad(out.sum(), [x, *layer.parameters()])
    assert widths == [5, 8]
    assert torch.allclose(out, plain, rtol=1e-12, atol=1e-13)
    for got, expected in zip(grads, plain_grads):
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-13)


def test_the_benchmark_times_the_padded_cell_beside_the_default(monkeypatch):
    """benchmarks/rnn.py's momentum-padded: the momentum cell with INPUT_ALIGN = 8, for gpu_call.sh
    to time both in one device call; the default is back after each call."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import rnn
    widths = fused_widths(monkeypatch)
    shape = dict(T=5, B=2, D=3, H=4, L=2)
    rnn.build("momentum", **shape)()
    plain, widths[:] = list(widths), []
    rnn.build(rnn.PADDED, **shape)()
    assert plain == [4, 5] and widths == [8, 8]
    assert layers.INPUT_ALIGN == 1
