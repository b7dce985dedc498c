"""A constant μ's filter constants (filters.ConstantDecay.filter_operands and
.carried_and_bias_channel) are built once per (μ, sizes, s, dtype, device) and shared by every
layer and later call, where each forward built them again per layer (eq. 15's chunked m once per
layer too); traced calls build their own, and constants first built under torch.inference_mode
still serve a training call's backward. Their values are checked against the recursions in
test_rnn_cells.py."""
import warnings

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from plugins.rnn import MomentumLSTM
from plugins.rnn.adam_recurrence import recurrence_backend
from plugins.rnn.filters import ConstantDecay, _cached, filter_sequence, second_moment

DECAY_OPS = {"aten::pow", "aten::arange", "aten::where", "aten::clamp"}


def ops_of(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {event.name for event in prof.events()}


def test_constants_are_shared_between_decays_and_keyed_by_what_they_depend_on():
    cpu = torch.device("cpu")
    first = ConstantDecay(0.6, 300).filter_operands(128, 3, 0.5, cpu, torch.float32)
    assert all(a is b for a, b in zip(first, ConstantDecay(0.6, 300).filter_operands(128, 3, 0.5, cpu,
                                                                                        torch.float32)))
    for other in [ConstantDecay(0.7, 300).filter_operands(128, 3, 0.5, cpu, torch.float32),
                  ConstantDecay(0.6, 300).filter_operands(128, 3, 0.25, cpu, torch.float32),
                  ConstantDecay(0.6, 300).filter_operands(128, 3, 0.5, cpu, torch.float64)]:
        assert not torch.equal(first[0].double(), other[0].double()) or first[0].dtype != other[0].dtype
    carried, channel = ConstantDecay(0.6, 5).carried_and_bias_channel(0.5, cpu, torch.float64)
    assert ConstantDecay(0.6, 5).carried_and_bias_channel(0.5, cpu, torch.float64)[0] is carried
    assert torch.allclose(carried, 0.6 ** torch.arange(1, 6, dtype=torch.float64), rtol=1e-15, atol=0)
    assert torch.allclose(channel, 0.5 * (1 - 0.6 ** torch.arange(1, 6, dtype=torch.float64)) / 0.4,
                          rtol=1e-14, atol=0)


@pytest.mark.parametrize("cell,backend", [("momentum", "auto"), ("adam", "cudnn"), ("rmsprop", "cudnn")])
def test_a_later_forward_builds_no_decay_matrix(cell, backend, make_generator):
    """The layers' filters (eq. 9, the bias channel, eq. 15's chunked m) all read shared constants:
    a second forward+backward forms none of them, and computes what the first did."""
    gen = make_generator()
    torch.manual_seed(0)
    hyper = dict(momentum=0.6, step_size=0.7, beta=0.9, eps=1e-6)
    read = {"momentum": ("momentum", "step_size"), "adam": tuple(hyper),
            "rmsprop": ("step_size", "beta", "eps")}
    model = MomentumLSTM(5, 6, num_layers=2, cell=cell, **{name: hyper[name] for name in read[cell]})
    x = torch.randn(140, 3, 5, generator=gen)                  # past one chunk of 128 steps

    def step():
        out, _ = model(x)
        return (out, *torch.autograd.grad((out * out).sum(), list(model.parameters())))

    with recurrence_backend(backend):
        _cached.cache_clear()
        first = step()
        assert ops_of(step) & DECAY_OPS == set()
        second = step()
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_constants_first_built_under_inference_mode_serve_a_training_backward(make_generator):
    gen = make_generator()
    model = MomentumLSTM(4, 5, num_layers=2, cell="adam", momentum=0.6, step_size=0.7, beta=0.9)
    x = torch.randn(20, 2, 4, generator=gen)
    with recurrence_backend("cudnn"):
        _cached.cache_clear()
        with torch.inference_mode():
            evaluated, _ = model(x)
        trained, _ = model(x)
        grads = torch.autograd.grad(trained.sum(), list(model.parameters()))
        _cached.cache_clear()
        fresh, _ = model(x)
        expected = torch.autograd.grad(fresh.sum(), list(model.parameters()))
    assert torch.equal(evaluated, trained)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected))


def test_traced_calls_build_their_own_constants(make_generator):
    gen = make_generator()
    x = torch.randn(37, 2, 3, generator=gen)
    m0 = torch.rand(2, 3, generator=gen)

    def filters(x, m0):
        return filter_sequence(x, ConstantDecay(0.55, x.size(0)), 0.3) + second_moment(x * x, m0, 0.85, True)

    _cached.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.compile(filters, fullgraph=True, backend="aot_eager")(x, m0)
    assert _cached.cache_info().currsize == 0
    assert not [w for w in caught if "lru_cache" in str(w.message)]     # the cache never met the tracer
    assert torch.allclose(traced, filters(x, m0), rtol=1e-6, atol=1e-6)
    assert _cached.cache_info().currsize > 0
