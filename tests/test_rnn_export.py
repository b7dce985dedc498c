"""torch.export of every recurrent layer family and cell with a dynamic length
(plugins/rnn/export_scan.py: each layer a scan of its step), float64: the exported program,
given a random state (h, c, v, m and the step counter of the NAG/SR schedules), equals the
paper's equations written as a loop (helpers/rnn_layers.literal), outputs of every layer and the
final state, at lengths other than the traced one (each cell in one family at least, each family
with its plain cell, eq. 15's and a stepped one); batch_first and bidirectional too; at a static
length with a given state (the whole-sequence form). And the ε of eq. 15 reaches onnxruntime
(plugins/exported_eps.py)."""
import helpers.rnn_layers as shared
import pytest
import torch
from helpers.onnx_runtime import onnxruntime_function
from torch.export import Dim, export

from plugins.exported_eps import plus_eps
from plugins.rnn import MomentumLSTM, MomentumRNN, OrthogonalMomentumRNN, RecurrentState

FIELDS = ("h", "c", "v", "m")


class Layers(torch.nn.Module):
    """The layer with its state as plain tensors (the present fields, then the step counter)."""

    def __init__(self, layer, present):
        super().__init__()
        self.layer, self.present = layer, present

    def forward(self, x, *parts):
        fields = dict(zip(self.present, parts))
        state = RecurrentState(*(fields.get(name) for name in FIELDS), parts[-1])
        outputs, final = self.layer(x, state, all_layers=True)
        return (*outputs, *(getattr(final, name) for name in self.present), final.step)


# The cells' drives and decays are shared by the families (plugins/rnn/variants.py) and the families
# differ in their step: every cell of MomentumLSTM, and of each tanh family its plain cell, eq. 15's
# (v and m) and one with the step counter (SR's restarts, NAG's schedule), time-major; the adaptive
# cell batch-first in the families with their own layer class (MomentumLSTM and the orthogonal one).
TANH_CELLS = {MomentumRNN: ("rnn", "adam", "sr"), OrthogonalMomentumRNN: ("rnn", "adam", "nag")}
LAYOUTS = ([(case, False) for case in shared.CASES
            if case[0] is MomentumLSTM or case[1] in TANH_CELLS[case[0]]]
           + [(case, True) for case in shared.CASES if case[1] == "adam" and case[0] is not MomentumRNN])
LAYOUT_IDS = [f"{shared.case_id(case)}-{'batch' if first else 'time'}" for case, first in LAYOUTS]
# the families that have a backward direction (DTRIV's has none), each with eq. 15's cell (every
# state field, batch-first) and NAG's (its schedule counts steps in both directions): the backward
# direction is the layer's own scan of the flipped input, whatever the cell, and every cell's scan
# is checked in one direction above
BIDIRECTIONAL = [case for case in shared.CASES if case[0] is not OrthogonalMomentumRNN
                 and case[1] in ("adam", "nag")]


@pytest.mark.parametrize("case,batch_first", LAYOUTS, ids=LAYOUT_IDS)
def test_exported_layers_with_a_dynamic_length_equal_the_equations(make_generator, case, batch_first):
    check_exported(make_generator, case, batch_first, bidirectional=False)


@pytest.mark.parametrize("case", BIDIRECTIONAL, ids=shared.case_id)
def test_exported_bidirectional_layers_with_a_dynamic_length_equal_the_equations(make_generator, case):
    """The backward direction scans the flipped sequence (export_scan.py)."""
    check_exported(make_generator, case, case[1] == "adam", bidirectional=True)


def check_exported(make_generator, case, batch_first, bidirectional):
    cls, cell = case
    gen = make_generator()
    layer = shared.make(cls, cell, 2, gen, **({"bidirectional": True} if bidirectional else {})).eval()
    layer.batch_first = batch_first
    state = shared.random_state(layer, gen, 3)
    present = [name for name in FIELDS if getattr(state, name) is not None]
    parts = [getattr(state, name).detach() for name in present] + [state.step]
    module = Layers(layer, present)

    def sequence(T):
        x = torch.randn(T, 3, shared.D, generator=gen, dtype=torch.float64)
        return x, (x.transpose(0, 1) if batch_first else x)

    _, traced = sequence(6)
    length = Dim("length", min=1, max=128)
    program = export(module, (traced, *parts),
                     dynamic_shapes=({1 if batch_first else 0: length}, (None,) * len(parts))).module()
    for T in (1, 2, 11, 40):
        x, given = sequence(T)
        # with gradients, as a user calls it, once: torch's scan traces its joint graph again on
        # every call with gradients enabled (about 1 s for two layers here), for the same values
        with torch.set_grad_enabled(T == 1):
            got = program(given, *parts)
        want_out, finals = shared.literal(layer, x, state)
        last = got[layer.num_layers - 1]
        torch.testing.assert_close(last.transpose(0, 1) if batch_first else last, want_out,
                                   rtol=shared.TOL, atol=shared.TOL, msg=lambda m: f"T = {T}: {m}")
        for i, name in enumerate(present):
            want = torch.stack([f[FIELDS.index(name)] for f in finals])
            torch.testing.assert_close(got[layer.num_layers + i], want, rtol=shared.TOL, atol=shared.TOL,
                                       msg=lambda m: f"T = {T}, final {name}: {m}")
        assert torch.equal(got[-1], state.step + T)


@pytest.mark.parametrize("cell", ["momentum", "adam", "nag", "sr"])
def test_exported_layers_with_a_static_length_and_a_given_state_equal_the_equations(make_generator, cell):
    """A static length and a dynamic batch (the README's export, given a state): the layer takes its
    whole-sequence form, not the scan, where eager calls on the CPU ask whether the state's carried
    channels (v_0's weights) and the rows' start steps (NAG/SR) are all alike. export has no values
    to ask, and failed on both."""
    gen = make_generator()
    layer = shared.make(MomentumLSTM, cell, 2, gen).eval()
    batch = Dim("batch", min=1, max=64)

    def inputs(rows):
        state = shared.random_state(layer, gen, rows)
        present = [name for name in FIELDS if getattr(state, name) is not None]
        parts = [getattr(state, name).detach() for name in present] + [state.step]
        return torch.randn(6, rows, shared.D, generator=gen, dtype=torch.float64), state, present, parts

    x, _, present, parts = inputs(3)
    module = Layers(layer, present)
    program = export(module, (x, *parts), dynamic_shapes=(
        {1: batch}, tuple({0: batch} if part.dim() == 1 else {1: batch} for part in parts))).module()
    for rows in (3, 5):
        x, state, _, parts = inputs(rows)
        got = program(x, *parts)
        want_out, finals = shared.literal(layer, x, state)
        torch.testing.assert_close(got[layer.num_layers - 1], want_out, rtol=shared.TOL, atol=shared.TOL)
        for i, name in enumerate(present):
            want = torch.stack([f[FIELDS.index(name)] for f in finals])
            torch.testing.assert_close(got[layer.num_layers + i], want, rtol=shared.TOL, atol=shared.TOL)
        assert torch.equal(got[-1], state.step + 6)


class AdaptiveDenominator(torch.nn.Module):
    def __init__(self, add):
        super().__init__()
        self.add = add

    def forward(self, v, m):
        return v / torch.sqrt(self.add(m))


def onnxruntime_of(module, inputs, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    program = torch.onnx.export(module, inputs, dynamo=True, verbose=False)
    return onnxruntime_function(program, tmp_path)(*inputs)


@pytest.mark.parametrize("eps", [1e-8, 1e-12])
def test_an_eps_as_small_as_eq15s_reaches_onnxruntime(tmp_path, eps):
    """v / √(m + ε) with m ≈ 0, where ε decides the result: onnxruntime equals eager."""
    v, m = torch.full((2, 3), 1e-5), torch.zeros(2, 3)
    module = AdaptiveDenominator(lambda m: plus_eps(m, eps))
    torch.testing.assert_close(onnxruntime_of(module, (v, m), tmp_path), module(v, m), rtol=1e-5, atol=0)


def test_onnxscript_drops_a_scalar_eps(tmp_path):
    """Why plus_eps exists: torch.onnx.export's default optimiser removes `m + 1e-8`. If onnxscript
    stops doing so, this fails, and exported_eps.py can go."""
    v, m = torch.full((2, 3), 1e-5), torch.zeros(2, 3)
    module = AdaptiveDenominator(lambda m: m + 1e-8)
    got = onnxruntime_of(module, (v, m), tmp_path)
    assert not torch.allclose(got, module(v, m)), "onnxscript keeps a scalar eps now: plus_eps can go"


class Outputs(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)[0]


@pytest.mark.parametrize("cell", ["momentum", "adam"])
def test_a_bidirectional_layer_with_a_dynamic_length_runs_in_onnxruntime_as_eager(make_generator, cell,
                                                                                   tmp_path):
    """The backward direction's flips and scan through ONNX: onnxruntime equals eager at lengths
    other than the traced one."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    gen = make_generator()
    layer = shared.make(MomentumLSTM, cell, 2, gen, bidirectional=True).float().eval()
    x = lambda T: torch.randn(T, 3, shared.D, generator=gen)
    length = Dim("length", min=1, max=128)
    run = onnxruntime_function(torch.onnx.export(Outputs(layer), (x(6),), dynamic_shapes=({0: length},),
                                                 dynamo=True, verbose=False), tmp_path)
    for T in (1, 13, 40):
        given = x(T)
        torch.testing.assert_close(run(given), layer(given)[0], rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"T = {T}: {m}")


@pytest.mark.parametrize("backend", ["auto", "torch", "triton", "cudnn"])
@pytest.mark.parametrize("cell", ["adam", "rmsprop"])
def test_every_recurrence_backend_exports_eq15_as_a_differentiable_program(cell, backend, make_generator):
    """Under torch.export eq. 15 always takes the drive-first form (torch's fused LSTM fed the drive
    of every step), whatever the recurrence backend: the Triton Functions launch kernels on memory
    that export's fake tensors lack, and the torch loop's Function writes into its buffers, which
    an exported program replays without the Function's backward ("functions with out=...
    arguments don't support automatic differentiation" wherever gradients are enabled). At a
    fixed length, float64: the program's outputs and parameter gradients equal eager's (the torch
    loop's), with gradients enabled."""
    from plugins.rnn import adam_recurrence
    if backend == "triton":
        pytest.importorskip("triton")
    gen = make_generator()
    layer = shared.make(MomentumLSTM, cell, 2, gen).eval()
    x = torch.randn(7, 3, shared.D, dtype=torch.float64, generator=gen)
    with adam_recurrence.recurrence_backend(backend):
        program = export(Outputs(layer), (x,)).module()
    got, want = program(x), Outputs(layer)(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    probe = torch.randn(got.shape, dtype=torch.float64, generator=gen)
    grads = torch.autograd.grad((got * probe).sum(), list(program.parameters()))
    expected = torch.autograd.grad((want * probe).sum(), list(layer.parameters()))
    assert len(grads) == len(expected) > 0
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-11)
