"""Packed rows in the sequence layers (issue 18, item 2): with `cu_seqlens` or `segment_starts`
every cell of the table, in every layer family, runs each segment exactly as if it ran alone —
outputs, each segment's final state (h, c, v, m and the step counter), and the gradients of the
input, the weights and the per-segment initial states — in float64, both layouts, random segment
lengths with 1-step and empty segments; the two forms agree; bad offsets are refused by name."""
import pytest
import torch
from rnn_literal import LITERAL_DRIVES

from plugins.rnn import (
    VARIANTS,
    MomentumLSTM,
    MomentumRNN,
    OrthogonalMomentumRNN,
    RecurrentState,
    cell_names,
)
from plugins.rnn.adam_recurrence import recurrence_backend
from plugins.rnn.filters import SegmentDecay, filter_sequence
from plugins.rnn.variants import read_hyperparameters

D, H = 4, 3
HP = dict(momentum=0.6, step_size=0.7, beta=0.8, eps=1e-6)
RESTART = 3
TOL = 1e-10
FAMILIES = {MomentumLSTM: "lstm", MomentumRNN: "rnn", OrthogonalMomentumRNN: "rnn"}
CASES = [(cls, cell) for cls, plain in FAMILIES.items() for cell in cell_names(plain)]


def case_id(case):
    return f"{case[0].__name__}-{case[1]}" if isinstance(case, tuple) else str(case)


def make(cls, cell, gen, num_layers=2, batch_first=False, **options):
    restart = RESTART if VARIANTS[cell].restart != "refused" else None
    layer = cls(D, H, num_layers, cell=cell, restart=restart, batch_first=batch_first,
                **read_hyperparameters(cell, **HP), **options).double()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_((0.3 if "original" in name else 0.5) * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return layer


def random_lengths(gen, count=7):
    """Segment lengths 0..9 with at least one 1-step and one empty segment, in random order."""
    rest = torch.randint(2, 10, (count - 2,), generator=gen)
    lengths = torch.cat([torch.tensor([1, 0]), rest])
    return lengths[torch.randperm(count, generator=gen)]


def offsets(lengths):
    return torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])


def random_state(layer, gen, count):
    """Initial state of `count` segments: every field the cell carries, and start steps."""
    variant = VARIANTS[layer.cell]
    n = (4 if isinstance(layer, MomentumLSTM) else 1) * H
    shape = (layer.num_layers * layer.directions, count)
    rnd = lambda k: torch.randn(shape + (k,), generator=gen, dtype=torch.float64).requires_grad_()
    return RecurrentState(
        rnd(H), rnd(H) if isinstance(layer, MomentumLSTM) else None,
        rnd(n) if variant.has_v else None,
        torch.rand(shape + (n,), generator=gen, dtype=torch.float64).requires_grad_()
        if variant.has_m else None,
        torch.randint(0, 8, (count,), generator=gen))


def row(x, batch_first):
    """(T, D) steps -> the layer's input of one row."""
    return x[None] if batch_first else x[:, None]


def flat(out, batch_first):
    """The layer's output of one row -> (T, H)."""
    return out[0] if batch_first else out[:, 0]


def segment_state(state, s):
    if state is None:
        return None
    pick = lambda t, dim=1: None if t is None else t.narrow(dim, s, 1)
    return RecurrentState(pick(state.h), pick(state.c), pick(state.v), pick(state.m), pick(state.step, 0))


def alone(layer, x, cu, state):
    """Each segment as its own call: outputs (T, H) in the row's order and the final states
    stacked over segments (an empty segment keeps its initial state)."""
    outs, finals = [], []
    for s in range(cu.numel() - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        init = segment_state(state, s)
        if a == b:
            full = layer._state(init, 1, x, 0)
            finals.append(full)
            continue
        out, final = layer(row(x[a:b], layer.batch_first), init)
        outs.append(flat(out, layer.batch_first))
        finals.append(final)
    cat = lambda i, dim=1: None if finals[0][i] is None else torch.cat([f[i] for f in finals], dim)
    return torch.cat(outs), RecurrentState(cat(0), cat(1), cat(2), cat(3), cat(4, 0))


def packed(layer, x, cu, state):
    out, final = layer(row(x, layer.batch_first), state, cu_seqlens=cu)
    return flat(out, layer.batch_first), final


def loss_weights(gen, out, final):
    """Random weights for every output and final-state entry (a loss reaching all of them)."""
    rnd = lambda t: None if t is None else torch.randn(t.shape, generator=gen, dtype=torch.float64)
    return rnd(out), [rnd(t) if t is not None and t.is_floating_point() else None for t in final]


def loss(out, final, weights):
    w_out, w_final = weights
    total = (out * w_out).sum()
    for t, w in zip(final, w_final):
        if w is not None:
            total = total + (t * w).sum()
    return total


def assert_same_results(layer, x, state, got, want, gen, grad_rtol=0.0):
    """Two runs' (outputs, final state) `got` and `want` of `layer` on input x from `state` agree:
    outputs, final states, and the gradients of a random loss over both with respect to the input, the
    weights and the initial state."""
    (out, final), (ref_out, ref_final) = got, want
    torch.testing.assert_close(out, ref_out, atol=TOL, rtol=0)
    for name, a, b in zip(RecurrentState._fields, final, ref_final):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=f"final state.{name}")
    weights = loss_weights(gen, out, final)
    inputs = [x, *layer.parameters()]
    if state is not None:
        inputs += [t for t in state if t is not None and t.requires_grad]
    grads = torch.autograd.grad(loss(out, final, weights), inputs, allow_unused=True)
    ref_grads = torch.autograd.grad(loss(ref_out, ref_final, weights), inputs, allow_unused=True)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        g = torch.zeros_like(inputs[i]) if g is None else g
        r = torch.zeros_like(inputs[i]) if r is None else r
        torch.testing.assert_close(g, r, atol=TOL, rtol=grad_rtol,
                                   msg=lambda message: f"gradient of input {i}: {message}")


def assert_same_run(layer, x, cu, state, gen):
    """Packed ≡ alone: outputs, final states, gradients of input, weights, initial states."""
    assert_same_results(layer, x, state, packed(layer, x, cu, state), alone(layer, x, cu, state), gen)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_packed_row_equals_each_segment_alone(case, batch_first, make_generator):
    cls, cell = case
    gen = make_generator()
    layer = make(cls, cell, gen, batch_first=batch_first)
    lengths = random_lengths(gen)
    cu = offsets(lengths)
    x = torch.randn(int(cu[-1]), D, generator=gen, dtype=torch.float64, requires_grad=True)
    assert_same_run(layer, x, cu, random_state(layer, gen, lengths.numel()), gen)
    assert_same_run(layer, x, cu.int(), None, gen)


@pytest.mark.parametrize("chunk", [1, 3, 4, 128])
@pytest.mark.parametrize("cell", [name for name, v in VARIANTS.items() if v.has_v and not v.has_m])
def test_segment_filter_equals_the_literal_momentum_of_each_segment(cell, chunk, make_generator):
    """filters.SegmentDecay: the momentum of eq. 9 (and its NAG/SR schedules) over a packed row,
    chunked across segment boundaries, ≡ the literal recurrence of each segment alone from its
    own v_0 and start step (MomentumRNN, eq. 9, Section 2.4)."""
    gen = make_generator()
    variant = VARIANTS[cell]
    hyper = variant.hyper(HP["momentum"], HP["step_size"], HP["beta"], HP["eps"],
                          RESTART if variant.restart != "refused" else None)
    lengths = random_lengths(gen)
    cu = offsets(lengths)
    start = torch.randint(0, 8, (lengths.numel(),), generator=gen)
    g = torch.randn(int(cu[-1]), 1, 5, generator=gen, dtype=torch.float64)
    v0 = torch.randn(lengths.numel(), 5, generator=gen, dtype=torch.float64)
    decay = SegmentDecay(variant.decay(hyper, int(cu[-1]), torch.zeros(1, dtype=torch.long)), cu, start)
    got = filter_sequence(g, decay, hyper.step_size, chunk)[:, 0] + decay.carried() @ v0
    hp = dict(mu=hyper.momentum, s=hyper.step_size, beta=hyper.beta, eps=hyper.eps, restart=hyper.restart)
    want = []
    for s in range(lengths.numel()):
        v = v0[s:s + 1]
        for t in range(int(cu[s]), int(cu[s + 1])):
            step = start[s:s + 1] + t - int(cu[s]) + 1
            _, v, _ = LITERAL_DRIVES[cell](g[t], v, None, step, hp)
            want.append(v)
    torch.testing.assert_close(got, torch.cat(want), atol=TOL, rtol=0)


@pytest.mark.parametrize("cell", cell_names("lstm"))
def test_segments_longer_than_a_filter_chunk(cell, make_generator):
    """Segments of 131 and 129 steps (filters.py works in chunks of 128) beside short ones."""
    gen = make_generator()
    layer = make(MomentumLSTM, cell, gen, num_layers=1)
    lengths = torch.tensor([131, 1, 129, 4])
    x = torch.randn(int(lengths.sum()), D, generator=gen, dtype=torch.float64, requires_grad=True)
    assert_same_run(layer, x, offsets(lengths), random_state(layer, gen, 4), gen)


@pytest.mark.parametrize("backend,cls", [("triton", MomentumLSTM), ("cudnn", MomentumLSTM),
                                         ("cudnn", MomentumRNN)], ids=["triton", "cudnn", "cudnn-tanh"])
@pytest.mark.parametrize("cell", [name for name, v in VARIANTS.items() if v.has_m])
def test_other_adam_recurrences_on_segments(cell, backend, cls, make_generator):
    """eq. 15's recurrence on the Triton steps (interpreter on CPU), and on torch's fused LSTM
    (tanh-RNN) kernel after the drive of every step ("cudnn"), sees each segment alone."""
    if backend == "triton":
        pytest.importorskip("triton")
    gen = make_generator()
    layer = make(cls, cell, gen)
    lengths = torch.tensor([3, 1, 0, 6, 2])
    x = torch.randn(int(lengths.sum()), D, generator=gen, dtype=torch.float64, requires_grad=True)
    with recurrence_backend(backend):
        assert_same_run(layer, x, offsets(lengths), random_state(layer, gen, 5), gen)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_run_that_mixes_the_segments_differs(case, make_generator):
    """The check above can fail: one call over the whole row (documents mixed) differs from
    the packed call after the first segment, for every cell."""
    cls, cell = case
    gen = make_generator()
    layer = make(cls, cell, gen)
    cu = torch.tensor([0, 4, 5, 11])
    x = torch.randn(11, D, generator=gen, dtype=torch.float64)
    out, _ = packed(layer, x, cu, None)
    mixed = flat(layer(row(x, False))[0], False)
    torch.testing.assert_close(out[:4], mixed[:4], atol=TOL, rtol=0)
    assert (out[4:] - mixed[4:]).abs().max() > 1e-3


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_segment_starts_equal_cu_seqlens(case, batch_first, make_generator):
    """segment_starts (batch, time) over two rows ≡ cu_seqlens over the rows laid end to end;
    a row's first step begins a segment whether or not it is marked."""
    cls, cell = case
    gen = make_generator()
    layer = make(cls, cell, gen, batch_first=batch_first)
    steps = 9
    starts = torch.rand(2, steps, generator=gen) < 0.3
    starts[0, 0], starts[1, 0] = True, False
    starts[1, 5] = True
    x = torch.randn(2, steps, D, generator=gen, dtype=torch.float64)
    begin = torch.nonzero(starts.reshape(-1) | (torch.arange(2 * steps) % steps == 0))[:, 0]
    cu = torch.cat([begin, torch.tensor([2 * steps])])
    state = random_state(layer, gen, begin.numel())
    out, final = layer(x if batch_first else x.transpose(0, 1), state, segment_starts=starts)
    ref_out, ref_final = packed(layer, x.reshape(2 * steps, D), cu, state)
    out = out if batch_first else out.transpose(0, 1)
    torch.testing.assert_close(out.reshape(2 * steps, H), ref_out, atol=TOL, rtol=0)
    for got, want in zip(final, ref_final):
        if want is not None:
            torch.testing.assert_close(got, want, atol=TOL, rtol=0)


def bad_offsets(length):
    cu = torch.tensor([0, 3, length])
    return [
        (cu[None], "1-D"),
        (cu.double(), "int32 or int64"),
        (torch.tensor([1, 3, length]), "start at 0"),
        (torch.tensor([0, 4, 2, length]), "non-decreasing"),
        (torch.tensor([0, 3, length - 1]), f"end at the sequence length {length}"),
        (torch.tensor([0, 3, length + 1]), f"end at the sequence length {length}"),
        (cu.to("meta"), "device"),
        ([0, 3, length], "tensor"),
    ]


@pytest.mark.parametrize("index", range(len(bad_offsets(6))))
def test_bad_cu_seqlens_is_refused_by_name(index, make_generator):
    layer = make(MomentumLSTM, "momentum", make_generator())
    cu, reason = bad_offsets(6)[index]
    with pytest.raises(ValueError, match=r"cu_seqlens.*" + reason):
        layer(torch.randn(6, 1, D, dtype=torch.float64), cu_seqlens=cu)


def test_cu_seqlens_needs_one_row_and_a_plain_tensor(make_generator):
    layer = make(MomentumLSTM, "momentum", make_generator())
    cu = torch.tensor([0, 2, 6])
    with pytest.raises(ValueError, match="cu_seqlens.*batch of one row.*batch 2"):
        layer(torch.randn(6, 2, D, dtype=torch.float64), cu_seqlens=cu)
    packed_input = torch.nn.utils.rnn.pack_sequence([torch.randn(6, D, dtype=torch.float64)])
    with pytest.raises(ValueError, match="cu_seqlens cannot be combined with a PackedSequence"):
        layer(packed_input, cu_seqlens=cu)
    with pytest.raises(ValueError, match="cu_seqlens or segment_starts, not both"):
        layer(torch.randn(6, 1, D, dtype=torch.float64), cu_seqlens=cu,
              segment_starts=torch.ones(1, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"state.h must have shape \(2, 2, 3\)"):
        layer(torch.randn(6, 1, D, dtype=torch.float64), torch.zeros(2, 1, H, dtype=torch.float64),
              cu_seqlens=cu)


@pytest.mark.parametrize("bad, reason", [
    (torch.ones(6, dtype=torch.bool), r"shape \(batch, time\) = \(1, 6\)"),
    (torch.ones(6, 1, dtype=torch.bool), r"shape \(batch, time\) = \(1, 6\)"),
    (torch.ones(1, 6, dtype=torch.long), "torch.bool"),
    (torch.ones(1, 6, dtype=torch.bool, device="meta"), "device"),
    ([[True] * 6], "tensor"),
])
def test_bad_segment_starts_is_refused_by_name(bad, reason, make_generator):
    layer = make(MomentumLSTM, "nag", make_generator(), batch_first=True)
    with pytest.raises(ValueError, match="segment_starts.*" + reason):
        layer(torch.randn(1, 6, D, dtype=torch.float64), segment_starts=bad)
