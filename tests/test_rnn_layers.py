"""MomentumLSTM / MomentumRNN layers (fused fast paths) vs the step-wise cells, float64."""
import copy
import warnings

import pytest
import torch
from rnn_literal import LITERAL_DRIVES
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from plugins.rnn import (
    VARIANTS,
    LSTMStepCell,
    MomentumLSTM,
    MomentumRNN,
    OrthogonalMomentumRNN,
    RecurrentState,
    cell_names,
)
from plugins.rnn.variants import read_hyperparameters

T, B, D, H = 6, 3, 4, 5
MU, S, BETA, EPS, F = 0.6, 0.7, 0.8, 1e-8, 3
KINDS = cell_names("lstm")
TOL = 1e-10


def make_layer(cls, kind, num_layers, gen, batch_first=False, momentum=MU):
    hyper = read_hyperparameters(kind, momentum=momentum, step_size=S, beta=BETA, eps=EPS)
    layer = cls(D, H, num_layers, cell=kind, restart=F if VARIANTS[kind].restart == "required" else None,
                batch_first=batch_first, **hyper).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return layer


def random_state(layer, gen, batch=B):
    width = (4 if isinstance(layer, MomentumLSTM) else 1) * H
    shape = (layer.num_layers, batch)
    rnd = lambda n: torch.randn(shape + (n,), generator=gen, dtype=torch.float64).requires_grad_()
    variant = VARIANTS[layer.cell]
    return RecurrentState(
        rnd(H), rnd(H) if isinstance(layer, MomentumLSTM) else None,
        rnd(width) if variant.has_v else None,
        (torch.rand(shape + (width,), generator=gen, dtype=torch.float64).requires_grad_()
         if variant.has_m else None),
        torch.randint(0, 8, (batch,), generator=gen))


def lstm_cells(layer):
    """Step-wise cells of the layer's cell sharing the layer's Parameter objects."""
    cells = []
    for k in range(layer.num_layers):
        d = D if k == 0 else H
        cell = LSTMStepCell(d, H, layer.cell, momentum=layer.momentum, step_size=layer.step_size,
                            beta=layer.beta, eps=layer.eps, restart=layer.restart).double()
        cell.x2h.weight, cell.h2h.weight = layer.weight_ih_l0 if k == 0 else getattr(
            layer, f"weight_ih_l{k}"), getattr(layer, f"weight_hh_l{k}")
        cell.x2h.bias, cell.h2h.bias = getattr(layer, f"bias_ih_l{k}"), getattr(layer, f"bias_hh_l{k}")
        cells.append(cell)
    return cells


def reference_lstm(layer, x, state):
    """Run the cells step by step. x (T, B, D) time-major; returns out and final states."""
    cells = lstm_cells(layer)
    finals = []
    for k, cell in enumerate(cells):
        h, c = state.h[k], state.c[k]
        states = {"v": None if state.v is None else state.v[k], "m": None if state.m is None else state.m[k],
                  "step": state.step}
        names = cell.variant.step_states
        outs = []
        for xt in x:
            h, (h, c), *new = cell(xt, (h, c), *(states[n] for n in names))
            states.update(zip(names, new))
            outs.append(h)
        x = torch.stack(outs)
        finals.append((h, c, states["v"], states["m"]))
    return x, finals


def tanh_reference(layer, x, state):
    """Literal float64 tanh MomentumRNN (eq. 9, eq. 15, Section 2.4), step by step."""
    kind = layer.cell
    finals = []
    for k in range(layer.num_layers):
        W, U = getattr(layer, f"weight_ih_l{k}"), getattr(layer, f"weight_hh_l{k}")
        b, c_b = getattr(layer, f"bias_ih_l{k}"), getattr(layer, f"bias_hh_l{k}")
        h = state.h[k]
        v = state.v[k] if state.v is not None else None
        m = state.m[k] if state.m is not None else None
        step = state.step.clone()
        outs = []
        hp = dict(mu=MU, s=S, beta=BETA, eps=EPS, restart=F if VARIANTS[kind].restart == "required" else None)
        for xt in x:
            step = step + 1
            pre, v, m = LITERAL_DRIVES[kind](xt @ W.T + b, v, m, step, hp)
            h = torch.tanh(pre + h @ U.T + c_b)
            outs.append(h)
        x = torch.stack(outs)
        finals.append((h, None, v, m))
    return x, finals


def state_tensors(state):
    return [t for t in state[:4] if t is not None]


def check_against(layer, out, new_state, ref_out, ref_finals, leaves, gen):
    assert torch.allclose(out, ref_out, rtol=0, atol=TOL)
    for i in range(4):
        if new_state[i] is None:
            continue
        ref = torch.stack([f[i] for f in ref_finals])
        assert torch.allclose(new_state[i], ref, rtol=0, atol=TOL), i
    probes = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in [out] + state_tensors(new_state)]
    ours = sum((p * t).sum() for p, t in zip(probes, [out] + state_tensors(new_state)))
    ref_tensors = [ref_out] + [torch.stack([f[i] for f in ref_finals])
                               for i in range(4) if new_state[i] is not None]
    theirs = sum((p * t).sum() for p, t in zip(probes, ref_tensors))
    g_ours = torch.autograd.grad(ours, leaves, allow_unused=True)
    g_ref = torch.autograd.grad(theirs, leaves, allow_unused=True)
    for leaf, a, b in zip(leaves, g_ours, g_ref):
        zero = torch.zeros_like(leaf)  # unused leaves (v_0 when μ_1 = 0) have no gradient
        assert torch.allclose(zero if a is None else a, zero if b is None else b, rtol=0, atol=TOL)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("batch_first", [False, True])
def test_lstm_layer_matches_cells(kind, num_layers, batch_first, make_generator):
    gen = make_generator()
    layer = make_layer(MomentumLSTM, kind, num_layers, gen, batch_first)
    x = torch.randn(T, B, D, generator=gen, dtype=torch.float64, requires_grad=True)
    state = random_state(layer, gen)
    out, new_state = layer(x.transpose(0, 1) if batch_first else x, state)
    out = out.transpose(0, 1) if batch_first else out
    ref_out, ref_finals = reference_lstm(layer, x, state)
    assert torch.equal(new_state.step, state.step + T)
    leaves = [x] + list(layer.parameters()) + state_tensors(state)
    check_against(layer, out, new_state, ref_out, ref_finals, leaves, gen)


@pytest.mark.parametrize("kind", cell_names("rnn"))
@pytest.mark.parametrize("num_layers", [1, 2])
def test_tanh_layer_matches_literal(kind, num_layers, make_generator):
    gen = make_generator()
    layer = make_layer(MomentumRNN, kind, num_layers, gen)
    x = torch.randn(T, B, D, generator=gen, dtype=torch.float64, requires_grad=True)
    state = random_state(layer, gen)
    out, new_state = layer(x, state)
    ref_out, ref_finals = tanh_reference(layer, x, state)
    leaves = [x] + list(layer.parameters()) + state_tensors(state)
    check_against(layer, out, new_state, ref_out, ref_finals, leaves, gen)


@pytest.mark.parametrize("kind", ["momentum", "adam"])
def test_zero_momentum_path(kind, make_generator):
    gen = make_generator()
    layer = make_layer(MomentumLSTM, kind, 1, gen, momentum=0.0)
    x = torch.randn(T, B, D, generator=gen, dtype=torch.float64, requires_grad=True)
    state = random_state(layer, gen)
    out, new_state = layer(x, state)
    ref_out, ref_finals = reference_lstm(layer, x, state)
    check_against(layer, out, new_state, ref_out, ref_finals, [x] + list(layer.parameters()), gen)


@pytest.mark.parametrize("kind", KINDS)
def test_truncated_bptt_carries_state(kind, make_generator):
    gen = make_generator()
    layer = make_layer(MomentumLSTM, kind, 2, gen)
    x = torch.randn(3 * T, B, D, generator=gen, dtype=torch.float64)
    full, full_state = layer(x)
    state, outs = None, []
    for chunk in x.split([T - 1, T, T + 1]):
        out, state = layer(chunk, state)
        outs.append(out)
    assert torch.allclose(torch.cat(outs), full, rtol=0, atol=TOL)
    for a, b in zip(state, full_state):
        assert (a is None and b is None) or torch.allclose(a.double(), b.double(), rtol=0, atol=TOL)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cls", [MomentumLSTM, MomentumRNN])
def test_packed_sequences(kind, cls, make_generator):
    if cls is MomentumRNN and kind == "lstm":
        kind = "rnn"
    gen = make_generator()
    layer = make_layer(cls, kind, 2, gen)
    lengths = torch.tensor([4, T, 1, 5])
    batch = len(lengths)
    x = torch.randn(T, batch, D, generator=gen, dtype=torch.float64, requires_grad=True)
    state = random_state(layer, gen, batch)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    out, new_state = layer(packed, state)
    assert isinstance(out, PackedSequence)
    assert torch.equal(out.batch_sizes, packed.batch_sizes)
    assert torch.equal(out.sorted_indices, packed.sorted_indices)
    assert torch.equal(new_state.step, state.step + lengths)
    padded, out_lengths = pad_packed_sequence(out)
    assert torch.equal(out_lengths, lengths)
    reference = reference_lstm if cls is MomentumLSTM else tanh_reference
    probe = torch.randn(padded.shape, generator=gen, dtype=torch.float64)
    loss = (padded * probe).sum()
    ref_loss = 0.0
    for b, n in enumerate(lengths.tolist()):
        sub = RecurrentState(*[None if t is None else t[:, b:b + 1] for t in state[:4]],
                             state.step[b:b + 1])
        ref_out, ref_finals = reference(layer, x[:n, b:b + 1], sub)
        assert torch.allclose(padded[:n, b:b + 1], ref_out, rtol=0, atol=TOL)
        assert torch.all(padded[n:, b] == 0)
        for i in range(4):
            if new_state[i] is not None:
                ref = torch.stack([f[i] for f in ref_finals])
                assert torch.allclose(new_state[i][:, b:b + 1], ref, rtol=0, atol=TOL)
        ref_loss = ref_loss + (ref_out * probe[:n, b:b + 1]).sum()
    leaves = [x] + list(layer.parameters())
    for a, b_ in zip(torch.autograd.grad(loss, leaves), torch.autograd.grad(ref_loss, leaves)):
        assert torch.allclose(a, b_, rtol=0, atol=TOL)


def test_plain_lstm_is_nn_lstm(make_generator):
    gen = make_generator()
    ours = make_layer(MomentumLSTM, "lstm", 2, gen, batch_first=True)
    ref = nn.LSTM(D, H, 2, batch_first=True).double()
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    out, state = ours(x)
    ref_out, (h, c) = ref(x)
    assert torch.allclose(out, ref_out, rtol=0, atol=TOL)
    assert torch.allclose(state.h, h, rtol=0, atol=TOL) and torch.allclose(state.c, c, rtol=0, atol=TOL)


def test_tuple_state_and_default_init(make_generator):
    layer = MomentumLSTM(D, H, 1, cell="momentum").double()
    assert torch.equal(layer.weight_hh_l0, torch.eye(4 * H, H, dtype=torch.float64))
    assert torch.all(layer.bias_ih_l0[H:2 * H] == 1) and torch.all(layer.bias_hh_l0[:H] == 0)
    x = torch.randn(T, B, D, generator=make_generator(), dtype=torch.float64)
    h = torch.zeros(1, B, H, dtype=torch.float64)
    out_tuple, _ = layer(x, (h, h))
    out_none, _ = layer(x)
    assert torch.equal(out_tuple, out_none)


def test_dropout_between_layers(make_generator):
    gen = make_generator()
    layer = MomentumLSTM(D, H, 2, cell="momentum", dropout=0.5).double()
    x = torch.randn(T, B, D, generator=gen, dtype=torch.float64)
    layer.eval()
    eval_out, _ = layer(x)
    nodrop = MomentumLSTM(D, H, 2, cell="momentum").double()
    nodrop.load_state_dict(layer.state_dict())
    assert torch.equal(eval_out, nodrop(x)[0])
    layer.train()
    assert not torch.allclose(layer(x)[0], eval_out)


@pytest.mark.parametrize("kwargs,match", [
    (dict(momentum=1.0), "momentum"), (dict(momentum=-0.2), "momentum"),
    (dict(step_size=0.0), "step_size"), (dict(cell="adam", beta=1.0), "beta must be in"),
    (dict(cell="adam", beta=-0.1), "beta must be in"),
    (dict(cell="nag", restart=0), "restart"), (dict(cell="sr", restart=2.5), "restart"),
    (dict(cell="sr"), "restart"), (dict(cell="gru"), "cell"), (dict(cell="adam", eps=0.0), "eps must be"),
    (dict(dropout=1.5), "dropout"),
])
@pytest.mark.parametrize("cls", [MomentumLSTM, MomentumRNN])
def test_bad_hyperparameters(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(D, H, **kwargs)


@pytest.mark.parametrize("cls", [MomentumLSTM, MomentumRNN])
def test_bad_inputs(cls):
    layer = cls(D, H, 2)
    with pytest.raises(ValueError, match="num_layers"):
        cls(D, H, 0)
    with pytest.raises(ValueError, match="input"):
        layer(torch.zeros(B, D))
    with pytest.raises(ValueError, match="input_size=4"):
        layer(torch.zeros(T, B, D + 1))
    with pytest.raises(ValueError, match="state.h"):
        layer(torch.zeros(T, B, D), RecurrentState(torch.zeros(1, B, H), None, None, None, None))


LAYER_CLASSES = [MomentumLSTM, MomentumRNN, OrthogonalMomentumRNN]


@pytest.mark.parametrize("cell", ["lstm", "momentum", "adam"])
@pytest.mark.parametrize("cls", LAYER_CLASSES)
def test_input_of_another_dtype_is_refused_with_both_dtypes(cls, cell):
    """nn.LSTM's rule: outside autocast, one message naming the input's and the weights' dtypes
    and the fix (today torch fails inside a matrix product or oneDNN, naming neither); under
    autocast the input may differ as before."""
    cell = "rnn" if cell == "lstm" and cls is not MomentumLSTM else cell
    layer = cls(D, H, 2, cell=cell)
    needle = (r"input dtype torch.float64 does not match the weights' dtype torch.float32: .*"
              r"input.to\(torch.float32\).*model.to\(torch.float64\)")
    with pytest.raises(ValueError, match=needle):
        layer(torch.zeros(T, B, D, dtype=torch.float64))
    with pytest.raises(ValueError, match=needle):
        layer.step(torch.zeros(B, D, dtype=torch.float64))
    if cell == "momentum":
        x = torch.randn(T, B, D, dtype=torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, state = layer(x)
            layer(x, state)
            layer.step(x[0], state)
        assert torch.isfinite(out.float()).all()
    out, _ = layer.double()(torch.zeros(T, B, D, dtype=torch.float64))     # the fix the message names
    assert out.dtype == torch.float64


@pytest.mark.parametrize("cls", LAYER_CLASSES)
def test_every_cell_runs_under_cpu_autocast_with_float32_states(cls):
    """Under CPU bf16 autocast, fresh and with a carried state (oneDNN has no bf16 LSTM primitive
    on CPUs without bf16 instructions, nn.LSTM fails there; the Adam/RMSProp recurrence got a
    bf16 g beside float32 states): every cell runs, keeps its states in float32, and stays
    within bf16 rounding of the float32 run, outputs and input gradients."""
    plain = "lstm" if cls is MomentumLSTM else "rnn"
    for cell in cell_names(plain):
        torch.manual_seed(0)
        layer = cls(D, H, 2, cell=cell, restart=3 if cell == "sr" else None)
        x = torch.randn(T, B, D, requires_grad=True)
        runs = []
        for autocast in (False, True):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out, state = layer(x)
                out2, state2 = layer(x, state)
            grad, = torch.autograd.grad((out.float() * out2.float()).sum(), x)
            runs.append((out2.float(), grad))
        floats = [t for t in state2 if isinstance(t, torch.Tensor) and t.is_floating_point()]
        assert all(t.dtype == torch.float32 for t in floats), cell
        for got, expected in zip(runs[1], runs[0]):
            assert torch.isfinite(got).all(), cell
            assert ((got - expected).norm() / expected.norm()).item() < 3e-2, cell


@pytest.mark.parametrize("cls", [MomentumLSTM, MomentumRNN])
def test_nag_momentum_under_cpu_autocast_keeps_float32_accuracy_at_length_2000(cls):
    """NAG's μ_t = (t − 1)/(t + 2) tends to 1, so its momentum v sums ever more of the inputs. Under
    CPU bf16 autocast eq. 9's filter runs in float32 like the other states: outputs, the final v
    and the input gradient at T = 2000 stay within 1 % of the float32 run (with the filter in bf16,
    the outputs were 12 % off)."""
    torch.manual_seed(0)
    layer = cls(16, 16, 2, cell="nag")
    x = torch.randn(2000, 4, 16, requires_grad=True)
    runs = []
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out, state = layer(x)
        grad, = torch.autograd.grad(out.float().sum(), x)
        runs.append((out.float(), state.v.float(), grad))
    for got, expected in zip(runs[1], runs[0]):
        assert ((got - expected).norm() / expected.norm()).item() < 1e-2


@pytest.mark.parametrize("cell", ["adam", "rmsprop"])
@pytest.mark.parametrize("cls", [MomentumLSTM, MomentumRNN])
def test_float16_layers_keep_eq15_finite_and_within_float16_rounding(cls, cell):
    """Eq. 15's ε = 1e-8 is below float16's smallest subnormal, and g⊙g underflows there for
    |g| < 2.4e-4. A float16 layer computes m and the normaliser in float32: on inputs of every
    scale, zeros included, its float16 output is within float16's rounding of the float32
    layer's in one call, and finite and close in single steps, whose states carry m in float16
    between calls (before: NaN on zeros, 180 % off at 1e-4)."""
    for scale in (0.0, 1e-4, 1e-2, 1.0):
        torch.manual_seed(0)
        layer = cls(D, H, 2, cell=cell)
        with torch.no_grad():
            for name, parameter in layer.named_parameters():
                if name.startswith("bias"):
                    parameter.zero_()
        x = torch.randn(T, B, D) * scale
        expected, _ = layer(x)
        half = copy.deepcopy(layer).half()
        with torch.no_grad():
            out, _ = half(x.half())
            state, steps = None, []
            for t in range(T):
                step, state = half.step(x[t].half(), state)
                steps.append(step)
        norm = expected.norm().clamp(min=1e-12)
        assert out.dtype == torch.float16 and torch.isfinite(out).all(), scale
        assert ((out.float() - expected).norm() / norm).item() < 3e-3, scale
        steps = torch.stack(steps).float()
        assert torch.isfinite(steps).all() and ((steps - expected).norm() / norm).item() < 5e-2, scale


@pytest.mark.parametrize("first", [torch.bfloat16, torch.float16])
def test_filter_tables_first_built_under_autocast_are_the_float32_tables(first):
    """A constant μ's tables (eq. 9's bias channel c_t, the carried weight M[t, 0]) are built once
    per (μ, length, s, device, dtype) and shared by later calls. Built first inside an autocast
    region, they are still the float64 tables cast to float32: the bits of tables built outside it
    (the bias channel was a 16-bit product cast back, which a float32 call then read)."""
    from plugins.rnn import filters
    decay = filters.ConstantDecay(MU, 300)
    filters._cached.cache_clear()
    expected = decay.carried_and_bias_channel(S, torch.device("cpu"), torch.float32)
    filters._cached.cache_clear()
    with torch.autocast("cpu", dtype=first):
        decay.carried_and_bias_channel(S, torch.device("cpu"), torch.float32)
    got = decay.carried_and_bias_channel(S, torch.device("cpu"), torch.float32)
    for table, want in zip(got, expected):
        assert table.dtype == torch.float32 and torch.equal(table, want)


@pytest.mark.parametrize("form", ["forward", "step"])
@pytest.mark.parametrize("cls", LAYER_CLASSES)
def test_a_state_of_another_batch_is_refused_on_use(cls, form):
    layer = cls(D, H, 2, cell="nag")
    _, state = layer(torch.randn(T, B, D))
    run = (lambda x, s: layer(x, s)) if form == "forward" else (lambda x, s: layer.step(x[0], s))
    x = torch.randn(T, B + 1, D)
    with pytest.raises(ValueError, match=rf"state.h must have shape \(2, {B + 1}, {H}\) .*got \(2, {B}, "):
        run(x, state)
    # only the step counter from another batch (torch's expand failed with a RuntimeError)
    fresh = state._replace(**{name: torch.zeros(2, B + 1, part.size(-1)) for name, part
                              in zip(state._fields[:4], state[:4]) if part is not None})
    with pytest.raises(ValueError, match=rf"state.step must have shape \(batch,\) = \({B + 1},\).*\({B},"):
        run(x, fresh)


@pytest.mark.parametrize("change,needle", [
    (dict(h=[0.0]), r"state.h must be a tensor of shape \(1, 3, 5\), got list"),
    (dict(v=torch.zeros(1, B, 4 * H, dtype=torch.float64)),
     "state.v has dtype torch.float64 but the input has torch.float32"),
    (dict(step=torch.zeros(B, 2, dtype=torch.long)), r"state.step must have shape \(batch,\)"),
])
def test_state_parts_of_the_wrong_kind_are_named(change, needle):
    layer = MomentumLSTM(D, H, cell="momentum")
    _, state = layer(torch.randn(T, B, D))
    with pytest.raises(ValueError, match=needle):
        layer(torch.randn(T, B, D), state._replace(**change))


@pytest.mark.parametrize("form", ["forward", "step"])
@pytest.mark.parametrize("cls,cell,part", [
    (MomentumLSTM, "lstm", "v"), (MomentumLSTM, "lstm", "m"), (MomentumLSTM, "momentum", "m"),
    (MomentumRNN, "momentum", "c"), (MomentumRNN, "adam", "c"), (OrthogonalMomentumRNN, "momentum", "m"),
])
def test_a_state_part_the_cell_does_not_carry_is_refused(cls, cell, part, form):
    """A part of another cell's state (the plain LSTM given a momentum v, a tanh RNN given a c) was
    dropped without a word: the output equalled the call without it."""
    layer = cls(D, H, cell=cell)
    _, state = layer(torch.randn(T, B, D))
    size = H if part == "c" else 4 * H
    given = state._replace(**{part: torch.ones(1, B, size)})
    run = (lambda s: layer(torch.randn(T, B, D), s)) if form == "forward" else \
        (lambda s: layer.step(torch.randn(B, D), s))
    with pytest.raises(ValueError, match=rf"state.{part} is given, but this layer's cell carries no"):
        run(given)
    run(state)


def test_an_lstm_state_without_h_is_refused_naming_h():
    layer = MomentumLSTM(D, H, cell="lstm")
    with pytest.raises(ValueError, match=rf"state.h must be a tensor of shape \(1, {B}, {H}\).*got None"):
        layer(torch.randn(T, B, D), (None, torch.zeros(1, B, H)))


@pytest.mark.parametrize("cls", LAYER_CLASSES)
def test_dropout_with_one_layer_warns_as_nn_lstm_does(cls):
    """nn.LSTM warns that dropout after all but the last layer does nothing with one layer; ours
    accepted it without a word (train-mode outputs equal eval-mode ones)."""
    with pytest.warns(UserWarning, match=r"dropout=0.5 with num_layers=1 has no effect"):
        layer = cls(D, H, 1, dropout=0.5)
    x = torch.randn(T, B, D)
    torch.testing.assert_close(layer.train()(x)[0], layer.eval()(x)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cls(D, H, 2, dropout=0.5)
        cls(D, H, 1)


def test_weight_dtype_region_casts_and_turns_autocast_off():
    """sequence.in_weight_dtype, the one "autocast off + cast to the weights' dtype" of the layers:
    bf16 tensors come back float32 (None kept), and inside the region a matmul stays float32."""
    from plugins.rnn.sequence import in_weight_dtype
    weight = torch.ones(2, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (x, none), region = in_weight_dtype(weight, torch.ones(3, 2, dtype=torch.bfloat16), None)
        assert x.dtype == torch.float32 and none is None
        assert (x @ weight).dtype == torch.bfloat16
        with region:
            assert (x @ weight).dtype == torch.float32
