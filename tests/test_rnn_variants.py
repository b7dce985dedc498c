"""Every cell of the table in plugins.rnn.variants, in every layer family: forward and
gradients vs a float64 transcription of the paper's equations (1–3 layers, packed input,
carried state), `step` ≡ `forward` over 50 consecutive steps, the cell/restart rule and
argument checks, and long sequences without a T × T decay matrix."""
import math

import pytest
import torch
from helpers.rnn_layers import (
    CASES,
    FAMILIES,
    HP,
    TOL,
    D,
    H,
    case_id,
    literal,
    make,
    random_state,
    takes_restart,
)
from rnn_literal import LITERAL_DRIVES
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from plugins.rnn import (
    VARIANTS,
    MomentumLSTM,
    MomentumRNN,
    OrthogonalMomentumRNN,
    OrthogonalRNNCell,
    RecurrentState,
    filters,
)
from plugins.rnn.lstm_cells import LSTMStepCell
from plugins.rnn.variants import read_hyperparameters


def test_every_cell_has_a_literal_transcription_and_a_family():
    assert set(LITERAL_DRIVES) == set(VARIANTS)
    assert {cell for _, cell in CASES} == set(VARIANTS)
    for variant in VARIANTS.values():
        assert variant.restart in ("required", "optional", "refused")
        assert not (variant.plain and (variant.has_v or variant.has_m))


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("num_layers,packed", [(1, False), (2, True), (3, False)])
def test_layer_matches_literal_equations(case, num_layers, packed, make_generator):
    cls, cell = case
    gen = make_generator()
    layer = make(cls, cell, num_layers, gen)
    lengths = [5, 7, 1, 4] if packed else [7, 7, 7]
    steps, batch = max(lengths), len(lengths)
    x = torch.randn(steps, batch, D, generator=gen, dtype=torch.float64, requires_grad=True)
    state = random_state(layer, gen, batch)
    if packed:
        out, new = layer(pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False), state)
        out = pad_packed_sequence(out)[0]
    else:
        out, new = layer(x, state)
    assert torch.equal(new.step, state.step + torch.tensor(lengths))
    probe = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    loss = (out * probe).sum() + sum((t * t).sum() for t in new[:4] if t is not None)
    ref_loss = 0.0
    for b, n in enumerate(lengths):
        row = RecurrentState(*[None if t is None else t[:, b:b + 1] for t in state[:4]], state.step[b:b + 1])
        ref_out, finals = literal(layer, x[:n, b:b + 1], row)
        torch.testing.assert_close(out[:n, b:b + 1], ref_out, rtol=0, atol=TOL)
        assert torch.all(out[n:, b] == 0)
        for i in range(4):
            assert (new[i] is None) == (finals[0][i] is None), i
            if new[i] is not None:
                ref = torch.stack([f[i] for f in finals])
                torch.testing.assert_close(new[i][:, b:b + 1], ref, rtol=0, atol=TOL)
                ref_loss = ref_loss + (ref * ref).sum()
        ref_loss = ref_loss + (ref_out * probe[:n, b:b + 1]).sum()
    leaves = [x] + list(layer.parameters()) + [t for t in state[:4] if t is not None]
    ours = torch.autograd.grad(loss, leaves, allow_unused=True)
    theirs = torch.autograd.grad(ref_loss, leaves, allow_unused=True)
    for leaf, a, b_ in zip(leaves, ours, theirs):
        zero = torch.zeros_like(leaf)  # v_0 is unused where μ_1 = 0 (NAG/SR block starts)
        torch.testing.assert_close(zero if a is None else a, zero if b_ is None else b_, rtol=1e-9, atol=TOL)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_step_equals_forward_for_50_steps(case, make_generator):
    cls, cell = case
    gen = make_generator()
    layer = make(cls, cell, 2, gen)
    batch = 3
    state = RecurrentState(*[None if t is None else t.detach() for t in random_state(layer, gen, batch)[:4]],
                           torch.randint(0, 8, (batch,), generator=gen))
    x = torch.randn(50, batch, D, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        whole, whole_state = layer(x, state)
        _, one_state = layer(x[:1], state)
        stepped = state
        for t in range(50):
            h, stepped = layer.step(x[t], stepped)
            torch.testing.assert_close(h, whole[t], rtol=0, atol=TOL)
            if t == 0:
                for a, b in zip(stepped, one_state):
                    assert (a is None) == (b is None)
                    if a is not None:
                        torch.testing.assert_close(a, b, rtol=0, atol=TOL)
    for a, b in zip(stepped, whole_state):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=TOL)


def test_step_backpropagates_like_forward(make_generator):
    gen = make_generator()
    layer = make(MomentumLSTM, "sr", 2, gen)
    x = torch.randn(4, 2, D, generator=gen, dtype=torch.float64, requires_grad=True)
    out, _ = layer(x)
    state, outs = None, []
    for t in range(4):
        h, state = layer.step(x[t], state)
        outs.append(h)
    grads = [torch.autograd.grad(o.sum(), [x] + list(layer.parameters())) for o in (out, torch.stack(outs))]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=TOL)


@pytest.mark.parametrize("make_layer", [
    lambda cell: MomentumLSTM(D, H, cell=cell), lambda cell: MomentumRNN(D, H, cell=cell),
    lambda cell: OrthogonalMomentumRNN(D, H, cell=cell), lambda cell: OrthogonalRNNCell(D, H, cell=cell),
], ids=["MomentumLSTM", "MomentumRNN", "OrthogonalMomentumRNN", "OrthogonalRNNCell"])
@pytest.mark.parametrize("cell", ["gru", "LSTM", "", None, 3])
def test_unknown_cells_are_refused_with_the_known_list(make_layer, cell):
    with pytest.raises(ValueError, match="cell must be one of") as error:
        make_layer(cell)
    assert all(repr(name) in str(error.value) for name in VARIANTS if not VARIANTS[name].plain)


def test_plain_cell_of_the_other_family_is_refused():
    with pytest.raises(ValueError, match="cell"):
        MomentumLSTM(D, H, cell="rnn")
    with pytest.raises(ValueError, match="cell"):
        MomentumRNN(D, H, cell="lstm")


# What each cell's equations read (MomentumRNN eq. 9, eq. 15, Section 2.4), written out here
# rather than taken from the table under test: the plain recurrences read none of the four,
# rmsprop fixes μ = 0, NAG/SR take μ_t from their schedule, only eq. 15 has β and ε.
UNREAD = {"lstm": {"momentum", "step_size", "beta", "eps"}, "rnn": {"momentum", "step_size", "beta", "eps"},
          "momentum": {"beta", "eps"}, "adam": set(), "rmsprop": {"momentum"},
          "nag": {"momentum", "beta", "eps"}, "sr": {"momentum", "beta", "eps"}}
GIVEN = {"momentum": 0.5, "step_size": 0.5, "beta": 0.5, "eps": 1e-6}
PAPER_DEFAULTS = {"momentum": 0.6, "step_size": 1.0, "beta": 0.9, "eps": 1e-8}
CONSTRUCTORS = {
    "MomentumLSTM": (lambda cell, **kw: MomentumLSTM(D, H, cell=cell, **kw), "lstm"),
    "MomentumRNN": (lambda cell, **kw: MomentumRNN(D, H, cell=cell, **kw), "rnn"),
    "OrthogonalMomentumRNN": (lambda cell, **kw: OrthogonalMomentumRNN(D, H, cell=cell, **kw), "rnn"),
    "OrthogonalRNNCell": (lambda cell, **kw: OrthogonalRNNCell(D, H, cell=cell, **kw), "rnn"),
    "LSTMStepCell": (lambda cell, **kw: LSTMStepCell(D, H, cell, **kw), "lstm"),
}
UNREAD_CASES = [(name, cell, hyper) for name, (_, plain) in CONSTRUCTORS.items()
                for cell in UNREAD if cell not in {"lstm", "rnn"} - {plain} for hyper in GIVEN]


@pytest.mark.parametrize("name,cell,hyper", UNREAD_CASES, ids=["-".join(c) for c in UNREAD_CASES])
def test_a_hyperparameter_the_cell_never_reads_is_refused(name, cell, hyper):
    """A value for a hyperparameter the cell ignores is refused naming both (the integrations'
    rule); a read one is kept; None (the default) is the cell's default, and None if unread."""
    make = CONSTRUCTORS[name][0]
    restart = {"restart": 3} if cell == "sr" else {}
    if hyper in UNREAD[cell]:
        with pytest.raises(ValueError, match=f"{hyper}={GIVEN[hyper]!r} is not read by cell={cell!r}"):
            make(cell, **{hyper: GIVEN[hyper]}, **restart)
    else:
        assert getattr(make(cell, **{hyper: GIVEN[hyper]}, **restart), hyper) == GIVEN[hyper]
    default = getattr(make(cell, **restart), hyper)
    assert default == (None if hyper in UNREAD[cell] else PAPER_DEFAULTS[hyper])


def test_read_hyperparameters_keeps_only_what_the_cell_reads():
    for cell, unread in UNREAD.items():
        assert set(read_hyperparameters(cell, **GIVEN)) == set(GIVEN) - unread


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_restart_rule(case):
    cls, cell = case
    rule = VARIANTS[cell].restart
    if rule == "refused":
        with pytest.raises(ValueError, match="restart applies to cell 'nag', 'sr' only"):
            cls(D, H, cell=cell, restart=3)
    else:
        assert cls(D, H, cell=cell, restart=3).restart == 3
    if rule == "required":
        for missing in (None, math.inf):
            with pytest.raises(ValueError, match="restart must be an integer >= 1"):
                cls(D, H, cell=cell, restart=missing)
    for bad in (0, -2, 2.5, True, "3"):
        if rule != "refused":
            with pytest.raises(ValueError, match="restart"):
                cls(D, H, cell=cell, restart=bad)


@pytest.mark.parametrize("cls", list(FAMILIES))
@pytest.mark.parametrize("kwargs,name", [
    (dict(momentum=False), "momentum"), (dict(momentum=True), "momentum"),
    (dict(momentum=math.nan), "momentum"), (dict(step_size=True), "step_size"),
    (dict(step_size=math.inf), "step_size"), (dict(cell="adam", eps=math.inf), "eps must be"),
    (dict(cell="adam", eps=0.0), "eps must be"), (dict(cell="adam", beta=math.nan), "beta must be"),
    (dict(dropout=True), "dropout"), (dict(dropout=1.0), "dropout"),
    (dict(dropout=-0.1), "dropout"), (dict(num_layers=2.0), "num_layers"),
    (dict(num_layers=True), "num_layers"),
    (dict(batch_first="yes"), "batch_first"),
])
def test_bad_arguments_are_refused(cls, kwargs, name):
    kwargs = dict(kwargs)
    layers = kwargs.pop("num_layers", 1)
    with pytest.raises(ValueError, match=name):
        cls(D, H, layers, **kwargs)


@pytest.mark.parametrize("cls", list(FAMILIES))
def test_step_counter_cannot_wrap(cls, make_generator):
    layer = cls(D, H, 1, cell="nag").double()
    x = torch.randn(5, 2, D, generator=make_generator(), dtype=torch.float64)
    h = torch.zeros(1, 2, H, dtype=torch.float64)
    c = h if cls is MomentumLSTM else None
    for step, message in ((torch.tensor([0, 2 ** 62 - 3]), "state.step must be in"),
                          (torch.tensor([0, -5]), "state.step must be in"),
                          (torch.tensor([0.0, 1.0]), "integer")):
        with pytest.raises(ValueError, match=message):
            layer(x, RecurrentState(h, c, None, None, step))
    with pytest.raises(ValueError, match="state.step must be in"):
        layer.step(x[0], RecurrentState(h, c, None, None, torch.tensor([0, 2 ** 62])))
    near = torch.tensor([2 ** 62 - 6, 3])
    out, state = layer(x, RecurrentState(h, c, None, None, near))
    assert state.step.tolist() == [2 ** 62 - 1, 8] and torch.isfinite(out).all()


@pytest.mark.parametrize("cell", ["momentum", "sr"])
def test_long_sequence_forms_no_t_by_t_matrix(cell, monkeypatch, make_generator):
    """T = 50,000 at μ = 0.999 (a T × T float64 decay matrix would be 20 GB): every piece of
    the decay matrix formed is a (chunk + 1)² block, one (T, 1) column or the (T / chunk)²
    matrix between chunk ends, and the output stays finite. Peak memory is measured in
    benchmarks/rnn_filter_memory.py."""
    steps, chunk = 50_000, 128
    largest = []
    for name in ("ConstantDecay", "NAGDecay"):
        decay_class = getattr(filters, name)
        original = decay_class.matrix

        def recording(self, rows, cols, original=original):
            largest.append(rows.numel() * cols.numel())
            return original(self, rows, cols)

        monkeypatch.setattr(decay_class, "matrix", recording)
    layer = MomentumLSTM(4, 8, cell=cell, restart=HP["restart"] if takes_restart(cell) else None,
                         **read_hyperparameters(cell, momentum=0.999))
    x = torch.randn(steps, 2, 4, generator=make_generator())
    state = RecurrentState(torch.zeros(1, 2, 8), torch.zeros(1, 2, 8),
                           torch.randn(1, 2, 32, generator=make_generator()), None, torch.tensor([0, 5]))
    with torch.no_grad():
        out, new = layer(x, state)
    ends = -(-steps // chunk)
    assert largest and max(largest) <= max((chunk + 1) ** 2, steps, ends ** 2)
    assert torch.isfinite(out).all() and torch.equal(new.step, torch.tensor([steps, steps + 5]))
