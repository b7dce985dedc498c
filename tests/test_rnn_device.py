"""The MomentumRNN layers on an accelerator: the host never waits for the device inside a
forward or backward pass (no value read back, no block copied from the host), the plain
cell is exactly nn.LSTM / nn.RNN's fused call (dropout between layers included), and on
CUDA its weights live in one cuDNN buffer.

Without a GPU the first property is checked on the `meta` device, where every tensor op
runs shape-only: a read of a value (`.item()`, `bool()`) or a copy from a CPU tensor is
recorded by a dispatch mode, exactly the operations that make a CUDA host wait.
"""
import warnings

import pytest
import torch
from torch.nn.utils import parametrize
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from plugins.rnn import MomentumLSTM, MomentumRNN, OrthogonalMomentumRNN, RecurrentState, cell_names
from plugins.rnn.variants import read_hyperparameters

FAMILIES = {MomentumLSTM: "lstm", MomentumRNN: "rnn", OrthogonalMomentumRNN: "rnn"}
CASES = [(cls, cell) for cls, plain in FAMILIES.items() for cell in cell_names(plain)]
IDS = [f"{cls.__name__}-{cell}" for cls, cell in CASES]


class HostWaits(TorchDispatchMode):
    """Records reads of device values and copies from the host onto the device. A read is
    answered with 0 (False), so that code paths behind a check can be followed on meta."""

    def __init__(self):
        super().__init__()
        self.reads, self.copies = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads.append(func)
            return 0
        out = func(*args, **kwargs)
        sources = {t.device.type for t in tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor) and t.dim() > 0}
        targets = {t.device.type for t in tree_leaves(out) if isinstance(t, torch.Tensor)}
        if "cpu" in sources and "meta" in targets:
            self.copies.append(func)
        return out


def meta_layer(cls, cell, layers=2):
    layer = cls(3, 5, layers, cell=cell, **read_hyperparameters(cell, momentum=0.6),
                restart=3 if cell == "sr" else None,
                dropout=0.1 if layers > 1 else 0.0)
    return layer.to("meta")


@pytest.mark.parametrize("cls,cell", CASES, ids=IDS)
def test_fresh_state_forward_backward_never_waits_for_the_device(cls, cell):
    layer = meta_layer(cls, cell)
    x = torch.randn(130, 2, 3, device="meta", requires_grad=True)  # 2 chunks of the filter
    with HostWaits() as watch:
        out, state = layer(x)
        (out.sum() + state.h.sum()).backward()
    assert watch.reads == [] and watch.copies == []
    assert state.step.device.type == "meta" and x.grad.shape == x.shape


@pytest.mark.parametrize("cls,cell", CASES, ids=IDS)
def test_carried_state_waits_only_for_the_step_counter_check(cls, cell):
    """A carried counter is range-checked (two reads); nothing else reads the device, in the
    whole-sequence forward and in the decoding step."""
    layer = meta_layer(cls, cell)
    with torch.no_grad():
        _, state = layer(torch.randn(7, 2, 3, device="meta"))
    state = RecurrentState(*(t if t is None else t.detach() for t in state))
    with HostWaits() as watch:
        out, _ = layer(torch.randn(130, 2, 3, device="meta"), state)
        out.sum().backward()
    assert len(watch.reads) == 2 and watch.copies == []
    with HostWaits() as watch, torch.no_grad():
        layer.step(torch.randn(2, 3, device="meta"), state)
    assert len(watch.reads) == 2 and watch.copies == []


@pytest.mark.parametrize("ours,theirs", [(MomentumLSTM, torch.nn.LSTM), (MomentumRNN, torch.nn.RNN)])
def test_plain_cell_with_dropout_is_torchs_fused_call(ours, theirs, make_generator):
    """Training with dropout between layers: the same outputs and gradients as nn.LSTM /
    nn.RNN under the same seed, and different from the deterministic eval pass."""
    gen = make_generator()
    layer = ours(4, 6, 3, cell=ours.plain, dropout=0.4).double().train()
    ref = theirs(4, 6, 3, dropout=0.4).double().train()
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(9, 5, 4, generator=gen, dtype=torch.float64)
    results = []
    for module in (layer, ref):
        torch.manual_seed(1234)
        out = module(x)[0]
        grads = torch.autograd.grad(out.square().sum(), list(module.parameters()))
        results.append((out, grads))
    (out, grads), (ref_out, ref_grads) = results
    assert torch.equal(out, ref_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    torch.manual_seed(1234)
    assert not torch.equal(layer.eval()(x)[0], out)


def test_flatten_parameters_is_a_no_op_off_cuda():
    layer = MomentumLSTM(4, 6, 2, cell="lstm")
    before = {name: (p.data_ptr(), p.detach().clone()) for name, p in layer.named_parameters()}
    layer.flatten_parameters()
    for name, p in layer.named_parameters():
        assert p.data_ptr() == before[name][0] and torch.equal(p, before[name][1])


@pytest.mark.gpu
@pytest.mark.parametrize("ours,theirs", [(MomentumLSTM, torch.nn.LSTM), (MomentumRNN, torch.nn.RNN)])
def test_plain_cell_weights_in_one_cudnn_buffer(ours, theirs):
    """After .cuda() the plain cell's weights share one storage (cuDNN's flat buffer), the
    fused call does not warn about re-packing them, and it equals nn.LSTM / nn.RNN."""
    layer = ours(40, 64, 3, cell=ours.plain).cuda()
    ref = theirs(40, 64, 3).cuda()
    ref.load_state_dict(layer.state_dict())
    storages = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    assert len(storages) == 1
    x = torch.randn(30, 8, 40, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, _ = layer(x)
        out.sum().backward()
    assert torch.allclose(out, ref(x)[0], rtol=1e-5, atol=1e-6)
    copy = ours(40, 64, 3, cell=ours.plain)
    copy.load_state_dict({k: v.cpu() for k, v in layer.state_dict().items()})
    assert all(torch.equal(a.cpu(), b) for a, b in zip(layer.parameters(), copy.parameters()))


def test_one_buffer_lays_the_weights_out_one_after_another():
    """The layout cuDNN reads without copying (`fused_weights` on CUDA): one storage, starting with
    the first weight, each after the one before, the values and the gradients those of the weights."""
    from plugins.rnn.layers import one_buffer
    weights = [torch.randn(8, 5, requires_grad=True), torch.randn(8, 2, requires_grad=True),
               torch.randn(8, requires_grad=True)]
    views = one_buffer(weights)
    assert len({v.untyped_storage().data_ptr() for v in views}) == 1
    assert [v.storage_offset() for v in views] == [0, 40, 56] and all(v.is_contiguous() for v in views)
    assert all(torch.equal(v, w) for v, w in zip(views, weights))
    probes = [torch.randn_like(w) for w in weights]
    grads = torch.autograd.grad(sum((v * q).sum() for v, q in zip(views, probes)), weights)
    assert all(torch.equal(g, q) for g, q in zip(grads, probes))


@pytest.mark.gpu
@pytest.mark.parametrize("cls,cell", [(MomentumLSTM, "momentum"), (MomentumLSTM, "nag"),
                                      (MomentumRNN, "momentum")])
def test_momentum_cells_hand_cudnn_one_buffer(cls, cell, monkeypatch):
    """The momentum cells' fused call gets each layer's weights (the joined input weight among them)
    as views of one buffer: cuDNN does not warn that it re-packs them, and the outputs and gradients
    equal those of the same weights handed over separately, where the warning shows."""
    from plugins.rnn import layers
    layer = cls(40, 64, 3, cell=cell).cuda()
    x = torch.randn(30, 8, 40, device="cuda", requires_grad=True)

    def run():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out, state = layer(x)
            grads = torch.autograd.grad(out.sum() + state.h.sum(), [x, *layer.parameters()])
        repacked = [w for w in caught if "single contiguous chunk" in str(w.message)]
        return (out, *grads), repacked
    one, repacked = run()
    assert not repacked
    monkeypatch.setattr(layers, "one_buffer", list)
    separate, repacked = run()
    assert repacked
    for a, b in zip(one, separate):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("cls,cell", CASES, ids=IDS)
def test_cuda_forward_backward_without_synchronisation(cls, cell):
    """torch's sync debug mode raises on any host-device synchronisation; the first call
    (Triton compilation and autotuning, cuDNN set-up) runs outside it."""
    layer = cls(40, 64, 2, cell=cell, restart=3 if cell == "sr" else None).cuda()
    x = torch.randn(300, 8, 40, device="cuda", requires_grad=True)
    layer(x)[0].sum().backward()
    torch.cuda.synchronize()
    with parametrize.cached():
        # the orthogonal weight (torch's parametrization) is evaluated once per forward, outside
        # the sequence loop; torch.matrix_exp picks its degree from the matrix norm on the host, and
        # so does its backward (an H200 run, 2026-11-26), synchronisations of torch's own: the
        # weight is evaluated before the checked region, and the backward stops at it
        weights = [getattr(module, name) for module in layer.modules() if parametrize.is_parametrized(module)
                   for name in module.parametrizations]
        leaves = [x] + weights + [p for n, p in layer.named_parameters() if "parametrizations" not in n]
        torch.cuda.set_sync_debug_mode("error")
        try:
            out, state = layer(x)
            grads = torch.autograd.grad(out.sum() + state.h.sum(), leaves, allow_unused=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert all(g is not None for g in grads[:1 + len(weights)])
    assert all(torch.isfinite(g).all() for g in grads if g is not None)
