"""The Adam/RMSProp layers of MomentumLSTM and of the tanh MomentumRNN on torch's fused kernels
(recurrence backend "cudnn", MomentumRNN eq. 15 with eq. 2 or the tanh RNN): the drive
v_t/√(m_t + ε) of every step formed first, then one kernel call per layer through an identity input
weight.

Against a float64 transcription of the paper (rnn_literal: eq. 15's drive, eq. 2's LSTM, the tanh
step) run on
each sequence alone: outputs, final h, c, v, m and the gradients of the input, the parameters and
the carried state, for full batches, unsorted padded lengths, lengths past the chunk of the
filters (128) and not a multiple of it, two layers and bidirectional layers; on the meta device,
no value is read back and nothing is copied from the host; under CPU autocast it runs in the
weights' dtype, bit for bit as without it.
"""
from types import SimpleNamespace

import pytest
import torch
from rnn_literal import LITERAL_DRIVES, lstm_literal
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from plugins.rnn import MomentumLSTM, MomentumRNN, RecurrentState, adam_recurrence, layers
from plugins.rnn.adam_recurrence import AdamLSTMRecurrence, recurrence_backend
from plugins.rnn.filters import second_moment

D, H = 3, 5
MU, S, BETA, EPS = 0.6, 0.7, 0.8, 1e-8
TOL = 1e-10
CELLS = ["adam", "rmsprop"]
CLASSES = [MomentumLSTM, MomentumRNN]


def make_layer(cell, gen, num_layers=1, bias=True, bidirectional=False, batch_first=False, cls=MomentumLSTM):
    hyper = dict(momentum=MU) if cell == "adam" else {}
    layer = cls(D, H, num_layers, cell=cell, step_size=S, beta=BETA, eps=EPS, bias=bias,
                bidirectional=bidirectional, batch_first=batch_first, **hyper).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return layer


def random_state(layer, gen, batch):
    shape = (layer.num_layers * layer.directions, batch)
    rnd = lambda n: torch.randn(shape + (n,), generator=gen, dtype=torch.float64).requires_grad_()
    width = layer.gate_count * H
    m = torch.rand(shape + (width,), generator=gen, dtype=torch.float64).requires_grad_()
    c = rnd(H) if layer.gate_count == 4 else None
    return RecurrentState(rnd(H), c, rnd(width), m, torch.randint(0, 8, (batch,), generator=gen))


def tensors_of(state):
    """The state's h, c, v, m that are tensors (the tanh RNN has no c)."""
    return [t for t in state[:4] if t is not None]


def literal_step(layer, drive, h, c, w_hh, b_hh):
    """Eq. 2's LSTM step, or the tanh RNN's h_t = tanh(d_t + U h_{t-1} + b_hh)."""
    if layer.gate_count == 4:
        return lstm_literal(drive, h, c, w_hh, b_hh)
    return torch.tanh(drive + h @ w_hh.T + (0.0 if b_hh is None else b_hh)), None


def literal_layers(layer, x, state):
    """Eq. 15's drive and the layer's step (literal_step) step by step, layer after layer
    (unidirectional), on one sequence x (T, 1, D). Returns the output (T, 1, H) and the final
    (h, c, v, m) of each layer (c None for the tanh RNN)."""
    hp = dict(mu=MU if layer.cell == "adam" else 0.0, s=S, beta=BETA, eps=EPS, restart=None)
    finals = []
    for k in range(layer.num_layers):
        w_ih, w_hh, b_ih, b_hh = layer.layer_parameters(k)
        h, c, v, m = (None if t is None else t[k] for t in state[:4])
        outs = []
        for x_t in x:
            g = x_t @ w_ih.T + (0.0 if b_ih is None else b_ih)
            drive, v, m = LITERAL_DRIVES[layer.cell](g, v, m, None, hp)
            h, c = literal_step(layer, drive, h, c, w_hh, b_hh)
            outs.append(h)
        x = torch.stack(outs)
        finals.append((h, c, v, m))
    return x, finals


def loss_and_literal(layer, x, lengths, state, gen):
    """(a random linear function of the layer's padded output and final state under "cudnn", the same
    function of the literal run of each sequence alone)."""
    batch = x.size(1)
    packed = x if lengths is None else pack_padded_sequence(x, lengths, enforce_sorted=False)
    with recurrence_backend("cudnn"):
        out, new = layer(packed, state)
    if lengths is not None:
        out, _ = pad_packed_sequence(out, total_length=x.size(0))
    lengths = [x.size(0)] * batch if lengths is None else lengths.tolist()
    ours = theirs = 0.0
    for b, n in enumerate(lengths):
        ref_out, finals = literal_layers(layer, x[:n, b:b + 1],
                                         [None if t is None else t[:, b:b + 1] for t in state[:4]])
        torch.testing.assert_close(out[:n, b:b + 1], ref_out, atol=TOL, rtol=0)
        assert torch.all(out[n:, b] == 0)
        probe = torch.randn(ref_out.shape, generator=gen, dtype=torch.float64)
        ours, theirs = ours + (out[:n, b:b + 1] * probe).sum(), theirs + (ref_out * probe).sum()
        for i, name in enumerate("hcvm"):
            if new[i] is None:
                assert name == "c" and layer.gate_count == 1
                continue
            ref = torch.stack([f[i] for f in finals])
            torch.testing.assert_close(new[i][:, b:b + 1], ref, atol=TOL, rtol=0, msg=name)
            probe = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
            ours, theirs = ours + (new[i][:, b:b + 1] * probe).sum(), theirs + (ref * probe).sum()
    assert torch.equal(new.step, state.step + torch.tensor(lengths))
    return ours, theirs


def assert_same_gradients(ours, theirs, leaves):
    for leaf, a, b in zip(leaves, torch.autograd.grad(ours, leaves), torch.autograd.grad(theirs, leaves)):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("num_layers,bias", [(1, True), (2, True), (2, False)])
@pytest.mark.parametrize("steps,lengths", [(6, None), (7, [7, 3, 1, 5]), (130, None), (131, [131, 2, 129])],
                         ids=["full", "padded", "130", "padded-131"])
def test_layer_matches_eq15_literal_float64(cls, cell, num_layers, bias, steps, lengths, make_generator):
    gen = make_generator()
    layer = make_layer(cell, gen, num_layers, bias, cls=cls)
    batch = 3 if lengths is None else len(lengths)
    x = torch.randn(steps, batch, D, generator=gen, dtype=torch.float64, requires_grad=True)
    state = random_state(layer, gen, batch)
    ours, theirs = loss_and_literal(layer, x, None if lengths is None else torch.tensor(lengths), state, gen)
    # μ = 0: the carried v never enters
    leaves = [x, *layer.parameters(), *tensors_of(state._replace(v=state.v if cell == "adam" else None))]
    assert_same_gradients(ours, theirs, leaves)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("cell", CELLS)
def test_two_calls_chained_by_the_state_equal_the_torch_loop(cls, cell, make_generator):
    """The state one call returns (v, m included) carries into the next exactly as the torch
    recurrence's does, a fresh state in the first call (no carried v), batch_first input."""
    gen = make_generator()
    layer = make_layer(cell, gen, num_layers=2, batch_first=True, cls=cls)
    xs = [torch.randn(4, 9, D, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    results = {}
    for backend in ("torch", "cudnn"):
        state, outs = None, []
        with recurrence_backend(backend):
            for x in xs:
                out, state = layer(x, state)
                outs.append(out)
        tensors = outs + tensors_of(state)
        probes = [torch.randn(t.shape, generator=make_generator("probe"), dtype=t.dtype) for t in tensors]
        loss = sum((p * t).sum() for p, t in zip(probes, tensors))
        results[backend] = tensors + list(torch.autograd.grad(loss, xs + list(layer.parameters())))
    for a, b in zip(results["cudnn"], results["torch"]):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("cell", CELLS)
def test_bidirectional_layers_equal_the_torch_loop(cls, cell, make_generator):
    gen = make_generator()
    layer = make_layer(cell, gen, num_layers=2, bidirectional=True, cls=cls)
    x = torch.randn(8, 4, D, generator=gen, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([8, 2, 5, 7])
    state = random_state(layer, gen, 4)
    results = {}
    for backend in ("torch", "cudnn"):
        with recurrence_backend(backend):
            out, new = layer(pack_padded_sequence(x, lengths, enforce_sorted=False), state)
        tensors = [out.data, *tensors_of(new)]
        probes = [torch.randn(t.shape, generator=make_generator("probe"), dtype=t.dtype) for t in tensors]
        loss = sum((p * t).sum() for p, t in zip(probes, tensors))
        leaves = [x, *layer.parameters(), *tensors_of(state)]
        results[backend] = tensors + list(torch.autograd.grad(loss, leaves, allow_unused=True))
    for a, b in zip(results["cudnn"], results["torch"]):
        if b is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b, atol=TOL, rtol=0)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("cell", CELLS)
def test_one_fused_call_per_layer_and_no_step_loop(cls, cell, monkeypatch, make_generator):
    """Under "cudnn" each layer is one call of torch's fused LSTM (tanh-RNN) kernel, on an input 4H
    (H) wide with an identity input weight, and the loop over steps (AdamLSTMRecurrence, the tanh
    RNN's recurrence_loop) never runs; under "torch" it runs once per layer and the fused kernel
    never."""
    calls = []
    fused = layers.fused_recurrence
    width = (4 if cls is MomentumLSTM else 1) * H

    def counted(kind, x, lengths, hx, weights, *args, **kwargs):
        calls.append((kind, x.size(-1), torch.equal(weights[0], torch.eye(width, dtype=x.dtype))))
        return fused(kind, x, lengths, hx, weights, *args, **kwargs)

    loops = []
    monkeypatch.setattr(layers, "fused_recurrence", counted)
    if cls is MomentumLSTM:
        monkeypatch.setattr(AdamLSTMRecurrence, "apply", classmethod(lambda _, *a: loops.append(a) or 1 / 0))
    else:
        monkeypatch.setattr(layers, "recurrence_loop", lambda *a: loops.append(a) or 1 / 0)
    layer = make_layer(cell, make_generator(), num_layers=3, cls=cls)
    x = torch.randn(5, 2, D, dtype=torch.float64)
    with recurrence_backend("cudnn"):
        layer(x)[0].sum().backward()
    assert calls == [(cls.fused_kind, width, True)] * 3 and loops == []
    with recurrence_backend("torch"), pytest.raises(ZeroDivisionError):
        layer(x)
    assert len(loops) == 1


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("cls", CLASSES)
def test_compiled_with_aot_autograd_equals_eager(cls, dynamic, make_generator):
    """torch.compile(fullgraph=True, aot_eager: forward and backward re-traced through
    AOTAutograd) of two layers from a given (h, c): one graph, where the default recurrence is a
    graph break per layer (its step loop runs eagerly), and outputs, states and gradients equal
    eager's in float64; with static shapes, and with the length and batch symbolic (dynamic=True,
    as torch.compile recompiles a function called at a second shape)."""
    gen = make_generator()
    layer = make_layer("adam", gen, num_layers=2, cls=cls)
    x = torch.randn(6, 3, D, generator=gen, dtype=torch.float64, requires_grad=True)
    state = random_state(layer, gen, 3)
    hc = (state.h, state.c) if cls is MomentumLSTM else state.h
    given = list(hc) if cls is MomentumLSTM else [hc]
    torch._dynamo.reset()
    results = []
    with recurrence_backend("cudnn"):
        for run in (layer, torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=dynamic)):
            out, new = run(x, hc)
            tensors = [out, *tensors_of(new)]
            probes = [torch.linspace(-1, 1, t.numel(), dtype=t.dtype).view_as(t) for t in tensors]
            loss = sum((t * probe).sum() for t, probe in zip(tensors, probes))
            results.append(tensors + list(torch.autograd.grad(loss, [x, *layer.parameters(), *given])))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def with_a_leading_dim(fused):
    """torch's fused kernel `fused` with its final states as torch 2.11's AOTAutograd traces
    aten::lstm's: (1, L, B, H), the values right."""
    def call(*args):
        out = fused(*args)
        return (out[0], *(t[None] for t in out[1:]))
    return call


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("cls", CLASSES)
def test_final_states_keep_their_shape_where_the_fused_kernel_adds_a_dim(monkeypatch, make_generator, cls,
                                                                         packed):
    """The layers' outputs and states on a fused kernel that adds that leading dim equal those on
    torch's, shapes included, with and without lengths."""
    from plugins.rnn import sequence
    gen = make_generator()
    layer = make_layer("adam", gen, num_layers=2, cls=cls)
    x = torch.randn(6, 3, D, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([6, 2, 4])

    def run():
        with recurrence_backend("cudnn"):
            out, new = layer(pack_padded_sequence(x, lengths, enforce_sorted=False) if packed else x)
        return [pad_packed_sequence(out)[0] if packed else out, *tensors_of(new)]

    expected = run()
    monkeypatch.setattr(sequence, "_VF", SimpleNamespace(lstm=with_a_leading_dim(torch._VF.lstm),
                                                         rnn_tanh=with_a_leading_dim(torch._VF.rnn_tanh)))
    for a, b in zip(run(), expected):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("cls", CLASSES)
def test_cpu_autocast_runs_in_the_weights_dtype(cls):
    """The drive and the recurrence run in float32 with autocast off: the same bits as without
    autocast (eq. 15's normaliser divides by |g|; bf16 rounding of g would be amplified)."""
    torch.manual_seed(0)
    layer = cls(D, H, 2, cell="adam")
    x = torch.randn(9, 2, D)
    with recurrence_backend("cudnn"):
        plain_out, plain_state = layer(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, state = layer(x)
    assert out.dtype == torch.float32 and state.m.dtype == torch.float32
    assert torch.equal(out, plain_out)
    assert all(torch.equal(a, b) for a, b in zip(tensors_of(state), tensors_of(plain_state)))


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("cell", CELLS)
def test_forward_backward_never_wait_for_the_device(cls, cell):
    """On the meta device (tests/test_rnn_device.py's HostWaits): no value read back and no tensor
    copied from the host, in the forward and backward of two layers with a fresh state."""
    from test_rnn_device import HostWaits
    layer = cls(D, H, 2, cell=cell).to("meta")
    x = torch.randn(130, 2, D, device="meta", requires_grad=True)
    with recurrence_backend("cudnn"), HostWaits() as watch:
        out, state = layer(x)
        (out.sum() + state.m.sum()).backward()
    assert watch.reads == [] and watch.copies == []
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("steps", [1, 127, 128, 129, 300])
def test_chunked_second_moment_is_the_loop_and_the_literal(steps, make_generator):
    """filters.second_moment(chunked=True): eq. 15's m through eq. 9's stationary filter, with m_0,
    at lengths around the chunk (128) and several chunks, values and gradients."""
    gen = make_generator()
    g = torch.randn(steps, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    m0 = torch.rand(3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    literal, m = [], m0
    for g_t in g:
        m = BETA * m + (1 - BETA) * g_t * g_t
        literal.append(m)
    literal = torch.stack(literal)
    probe = torch.randn(literal.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad((literal * probe).sum(), [g, m0])
    for chunked in (False, True):
        got = second_moment(g * g, m0, BETA, chunked=chunked)
        torch.testing.assert_close(got, literal, atol=1e-12, rtol=0)
        for a, b in zip(torch.autograd.grad((got * probe).sum(), [g, m0]), want):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_the_backend_is_named_and_chosen_only_when_asked():
    assert "cudnn" in adam_recurrence.BACKENDS
    assert not adam_recurrence.drive_first()  # auto: never (TF32; docs/benchmarks.md, 2026-12-04)
    with recurrence_backend("cudnn"):
        assert adam_recurrence.drive_first()
        with recurrence_backend("triton"):
            assert not adam_recurrence.drive_first()
    assert not adam_recurrence.drive_first()


@pytest.mark.gpu
@pytest.mark.parametrize("cell", CELLS)
def test_gpu_cudnn_matches_the_triton_recurrence_at_ptb(cell):
    """cuDNN without TF32 (float32 throughout) and the default Triton recurrence at the benchmark's
    PTB shape, 3 layers × 1150, each against the float64 torch path: outputs, states and weight
    gradients about as accurate as torch's own float32 path. (An elementwise bound between the two
    float32 paths failed on an H200, 2026-12-04: 177 of 1.6M elements off by up to 5e-3, as rounding
    compounds over 70 steps and through 1/sqrt(r + eps); a wrong recurrence is off by O(1).)"""
    from benchmarks.rnn import fp32_precision
    torch.manual_seed(0)
    layer = MomentumLSTM(400, 1150, 3, cell=cell).cuda()
    x = torch.randn(70, 20, 400, device="cuda")
    results = {}
    with fp32_precision(cudnn_rnn="ieee", matmul="ieee"):
        for backend, dtype in [("torch", torch.float64), ("torch", torch.float32),
                               ("triton", torch.float32), ("cudnn", torch.float32)]:
            layer.to(dtype)
            with recurrence_backend(backend):
                out, state = layer(x.to(dtype))
            grads = torch.autograd.grad(out.square().sum(), list(layer.parameters()))
            results[backend, dtype] = [t.detach().double() for t in (out, *state[:4], *grads)]
    reference, baseline = results["torch", torch.float64], results["torch", torch.float32]
    for backend in ("triton", "cudnn"):
        for i, (ref, ours, theirs) in enumerate(zip(reference, results[backend, torch.float32], baseline)):
            assert torch.isfinite(ours).all(), (backend, i)
            error, floor = ((t - ref).norm() / ref.norm() for t in (ours, theirs))
            assert error <= 4 * floor + 1e-6, f"{backend} tensor {i}: {error:.2e}, torch float32 {floor:.2e}"


@pytest.mark.parametrize("cls, backend", [(MomentumLSTM, "cudnn"), (MomentumRNN, "cudnn"),
                                          (MomentumRNN, "torch"), ("orthogonal", "torch")])
def test_rmsprop_does_not_form_the_mapped_input_it_would_not_use(cls, backend, monkeypatch):
    """The layers that form eq. 15's drive from eq. 9's v (MomentumLSTM's on "cudnn"; the tanh and
    orthogonal MomentumRNN's): with μ ≡ 0, v_t is s·g_t, taken from g = W x + b scaled, and
    input_map's W(s x) + s b (an elementwise pass over the input at s ≠ 1) is not formed. Adam
    (μ > 0) forms it."""
    from plugins.rnn import OrthogonalMomentumRNN, orthogonal
    mapped = []
    for module in (layers, orthogonal):
        def recorded(*args, real=module.input_map, **kwargs):
            mapped.append(args[1])
            return real(*args, **kwargs)
        monkeypatch.setattr(module, "input_map", recorded)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(6, 2, D, generator=gen, dtype=torch.float64)
    for cell in CELLS:
        mapped.clear()
        if cls == "orthogonal":
            layer = OrthogonalMomentumRNN(D, H, cell=cell, step_size=S, beta=BETA, eps=EPS,
                                          **(dict(momentum=MU) if cell == "adam" else {})).double()
        else:
            layer = make_layer(cell, gen, cls=cls)
        with recurrence_backend(backend):
            layer(x)
        assert bool(mapped) == (cell == "adam"), (cell, len(mapped))
