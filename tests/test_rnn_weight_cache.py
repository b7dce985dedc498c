"""The joined input weight [W | b_ih] of the momentum / nag / sr cells with μ > 0 (layers.py,
`JoinedWeightCache`): formed once per weight change while no gradient is recorded, re-formed
after any change of the parameters, and never kept under autograd."""
import copy
import pickle

import pytest
import torch

from plugins.rnn import MomentumLSTM, MomentumRNN, RecurrentState, layers
from plugins.rnn.variants import read_hyperparameters

D, H, T, B = 4, 5, 6, 3


@pytest.fixture
def joins(monkeypatch):
    """Counts the [W | b_ih] concatenations."""
    calls = []
    original = layers.join_input_weight

    def counted(weight, bias):
        calls.append(weight)
        return original(weight, bias)

    monkeypatch.setattr(layers, "join_input_weight", counted)
    return calls


def make(cls=MomentumLSTM, cell="momentum", gen=None):
    layer = cls(D, H, 2, cell=cell, restart=3 if cell == "sr" else None,
                **read_hyperparameters(cell, momentum=0.6, step_size=0.7)).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return layer


def inputs(gen, batch=B):
    return torch.randn(T, batch, D, generator=gen, dtype=torch.float64)


def fresh(layer, x, state=None):
    """The same layer with no cache (a deep copy drops it)."""
    return copy.deepcopy(layer)(x, state)


@pytest.mark.parametrize("cls,cell", [(MomentumLSTM, "momentum"), (MomentumLSTM, "nag"), (MomentumRNN, "sr"),
                                      (MomentumRNN, "adam")])
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_formed_once_while_no_gradient_is_recorded(joins, cls, cell, mode, make_generator):
    gen = make_generator()
    layer = make(cls, cell, gen)
    x1, x2 = inputs(gen), inputs(gen)
    with mode():
        out1, _ = layer(x1)
        out2, state = layer(x2)
        assert len(joins) == 2  # one per layer, not per call
        out3, _ = layer(x1, state)  # a carried v_0 is appended to the kept weight
        assert len(joins) == 2
        for out, x, st in ((out1, x1, None), (out2, x2, None), (out3, x1, state)):
            torch.testing.assert_close(out, fresh(layer, x, st)[0], rtol=0, atol=0)


def test_re_formed_after_a_parameter_change(joins, make_generator):
    gen = make_generator()
    layer = make(gen=gen)
    x = inputs(gen)
    with torch.no_grad():
        layer(x)
        layer.bias_ih_l1.add_(0.25)                 # an in-place change bumps its version counter
        out, _ = layer(x)
        assert len(joins) == 3                      # layer 1 only
        torch.testing.assert_close(out, fresh(layer, x)[0], rtol=0, atol=0)
        layer.load_state_dict(make(gen=gen).state_dict())
        loaded, _ = layer(x)
        assert len(joins) == 3 + 2 + 2              # the fresh copy's two, then both layers
        torch.testing.assert_close(loaded, fresh(layer, x)[0], rtol=0, atol=0)


def write_through_data(layer, gen):
    """An optimiser step as fairseq's Adam takes it: in place on `.data`, no version bump."""
    for p in layer.parameters():
        p.data.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def torch_step(layer, gen):
    torch.optim.SGD(layer.parameters(), lr=0.1).step()


@pytest.mark.parametrize("update", [write_through_data, torch_step])
def test_evaluation_after_a_training_step_sees_the_new_weights(update, make_generator):
    gen = make_generator()
    layer = make(gen=gen)
    x = inputs(gen)
    for _ in range(2):
        with torch.no_grad():
            before, _ = layer(x)
        layer(x)[0].sum().backward()  # the training forward (grad mode) drops the cache
        update(layer, gen)
        with torch.no_grad():
            after, _ = layer(x)
            torch.testing.assert_close(after, fresh(layer, x)[0], rtol=0, atol=0)
        assert not torch.equal(before, after)


@pytest.mark.parametrize("switch", ["eval", "train"])
def test_a_mode_switch_after_a_write_through_data_sees_the_new_weights(switch, make_generator):
    """PEFT's merge_and_unload writes the merged weight in place through `.data` between two
    no-grad calls; the next train() / eval() of the layer (or of a model holding it) empties the
    cache, so the evaluation after it runs the written weights."""
    gen = make_generator()
    layer = make(gen=gen).eval()
    x = inputs(gen)
    with torch.no_grad():
        before, _ = layer(x)
        write_through_data(layer, gen)
        getattr(torch.nn.Sequential(layer), switch)()
        after, _ = layer(x)
    torch.testing.assert_close(after, fresh(layer, x)[0], rtol=0, atol=0)
    assert not torch.equal(before, after)


def test_nothing_is_kept_under_autograd(joins, make_generator):
    """Two forward passes and one backward: the gradients of a fresh computation of each."""
    gen = make_generator()
    layer = make(gen=gen)
    x1, x2 = inputs(gen), inputs(gen)
    with torch.no_grad():
        layer(x1)  # a kept weight from evaluation must not enter the graph
    out1, state = layer(x1)
    out2, _ = layer(x2, state)
    assert not layer.joined_weights.entries
    probe = torch.randn(out1.shape, generator=gen, dtype=torch.float64)
    ((out1 * probe).sum() + (out2 * probe).sum()).backward()
    ref = copy.deepcopy(layer)
    ref.zero_grad()
    r1, rstate = ref(x1)
    r2, _ = ref(x2, RecurrentState(*rstate))
    ((r1 * probe).sum() + (r2 * probe).sum()).backward()
    for p, q in zip(layer.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
    assert len(joins) == 2 + 4 + 4


def test_dtype_change_pickle_and_deep_copy_start_empty(make_generator):
    gen = make_generator()
    layer = make(gen=gen)
    x = inputs(gen)
    with torch.no_grad():
        layer(x)
        assert layer.joined_weights.entries
        assert not pickle.loads(pickle.dumps(layer)).joined_weights.entries
        assert not copy.deepcopy(layer).joined_weights.entries
        layer.float()
        assert not layer.joined_weights.entries
        out, _ = layer(x.float())
    assert out.dtype == torch.float32


def test_weight_kept_in_inference_mode_serves_no_grad_calls(make_generator):
    gen = make_generator()
    layer = make(gen=gen)
    x = inputs(gen)
    with torch.inference_mode():
        layer(x)
    with torch.no_grad():
        out, _ = layer(x)
        torch.testing.assert_close(out, fresh(layer, x)[0], rtol=0, atol=0)
    out, _ = layer(x)
    out.sum().backward()
    assert all(p.grad is not None for p in layer.parameters())
