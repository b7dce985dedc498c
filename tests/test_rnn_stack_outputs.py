"""MomentumLSTM / MomentumRNN stacks: every layer's output (`all_layers`) and a per-call recurrent
weight (`recurrent_weight`, AWD-LSTM's weight drop), each against one-layer stacks run in a chain,
float64, for every cell: whole sequences, padded (PackedSequence), packed rows (cu_seqlens) and
one decoding step."""
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from plugins.rnn import VARIANTS, MomentumLSTM, MomentumRNN, cell_names
from plugins.rnn.variants import read_hyperparameters

T, B, D, H, LAYERS = 7, 3, 4, 5, 3
CASES = [(MomentumLSTM, cell) for cell in cell_names("lstm")] + [(MomentumRNN, cell) for cell in
                                                                  cell_names("rnn")]


def case_id(case):
    return f"{case[0].__name__}-{case[1]}"


def make(cls, cell, gen, num_layers, input_size=D):
    hyper = read_hyperparameters(cell, momentum=0.6, step_size=0.7, beta=0.8, eps=1e-8)
    restart = 3 if VARIANTS[cell].restart == "required" else None
    layer = cls(input_size, H, num_layers, cell=cell, restart=restart, batch_first=True, **hyper).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return layer


def one_layer_chain(stack, gen):
    """One-layer stacks of the same cell holding layer k's parameters."""
    chain = []
    for k in range(stack.num_layers):
        one = make(type(stack), stack.cell, gen, 1, stack.input_size if k == 0 else stack.hidden_size)
        one.load_state_dict({name[:-1] + "0": p for name, p in stack.state_dict().items()
                             if name.endswith(f"_l{k}")})
        chain.append(one)
    return chain


def run_chain(chain, x, **kwargs):
    outputs = []
    for one in chain:
        x, _ = one(x, **kwargs)
        outputs.append(x)
    return outputs


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_all_layers_equal_a_chain_of_one_layer_stacks(case, make_generator):
    gen = make_generator()
    stack = make(*case, gen, LAYERS)
    chain = one_layer_chain(stack, gen)
    x = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    outputs, state = stack(x, all_layers=True)
    last, last_state = stack(x)
    assert len(outputs) == LAYERS
    torch.testing.assert_close(outputs[-1], last, rtol=0, atol=1e-12)
    torch.testing.assert_close(state.h, last_state.h, rtol=0, atol=1e-12)
    for got, want in zip(outputs, run_chain(chain, x)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)

    lengths = torch.tensor([T, 3, 5])
    padded = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    for got, want in zip(stack(padded, all_layers=True)[0], run_chain(chain, padded)):
        torch.testing.assert_close(got.data, want.data, rtol=0, atol=1e-12)

    cu = torch.tensor([0, 2, 2, 6, 7])
    for got, want in zip(stack(x[:1], all_layers=True, cu_seqlens=cu)[0],
                         run_chain(chain, x[:1], cu_seqlens=cu)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)

    steps, _ = stack.step(x[:, 0], state, all_layers=True)
    want, inp = [], x[:, 0]
    for k, one in enumerate(chain):
        layer_state = type(state)(*(None if t is None else t[k:k + 1] for t in state[:4]), state.step)
        inp, _ = one.step(inp, layer_state)
        want.append(inp)
    for got, w in zip(steps, want):
        torch.testing.assert_close(got, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_recurrent_weight_is_used_for_this_call_and_trains_the_parameter(case, make_generator):
    """The output with recurrent_weight = 0.5 W_hh equals a stack whose W_hh is 0.5 W_hh, and the
    gradient reaches W_hh through the transform (half the copy's); the parameters are unchanged."""
    gen = make_generator()
    stack = make(*case, gen, 2)
    halved = make(*case, gen, 2)
    halved.load_state_dict({name: 0.5 * p if name.startswith("weight_hh") else p
                            for name, p in stack.state_dict().items()})
    before = {name: p.clone() for name, p in stack.state_dict().items()}
    x = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    upstream = torch.randn(B, T, H, generator=gen, dtype=torch.float64)
    seen = []

    def transform(k, weight):
        seen.append(k)
        return 0.5 * weight

    out, _ = stack(x, recurrent_weight=transform)
    want, _ = halved(x)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    assert seen == [0, 1]
    (out * upstream).sum().backward()
    (want * upstream).sum().backward()
    for k in range(2):
        torch.testing.assert_close(getattr(stack, f"weight_hh_l{k}").grad,
                                   0.5 * getattr(halved, f"weight_hh_l{k}").grad, rtol=0, atol=1e-12)
    for name, p in stack.state_dict().items():
        assert torch.equal(p, before[name]), name


def test_bad_stack_arguments_are_refused_by_name(make_generator):
    stack = make(MomentumLSTM, "momentum", make_generator(), 2)
    x = torch.zeros(B, T, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="recurrent_weight"):
        stack(x, recurrent_weight=0.5)
    with pytest.raises(ValueError, match="all_layers"):
        stack(x, all_layers="yes")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_host_copy_of_cu_seqlens_gives_each_segment_alone(case, make_generator):
    """cu_seqlens with its host copy cu_seqlens_cpu (checked on the host): every segment, empty
    and trailing ones included, equals the stack run on that segment alone."""
    gen = make_generator()
    stack = make(*case, gen, 2)
    x = torch.randn(1, T + 2, D, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, 3, 3, 8, 9])
    out, state = stack(x, cu_seqlens=cu, cu_seqlens_cpu=cu.clone())
    for s in range(4):
        begin, end = cu[s].item(), cu[s + 1].item()
        if begin == end:
            assert torch.equal(state.h[:, s], torch.zeros_like(state.h[:, s]))
            continue
        alone, alone_state = stack(x[:, begin:end])
        torch.testing.assert_close(out[:, begin:end], alone, rtol=0, atol=1e-12)
        torch.testing.assert_close(state.h[:, s], alone_state.h[:, 0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("bad", [torch.tensor([1, 3, 9]), torch.tensor([0, 5, 3, 9]), torch.tensor([0, 3, 8]),
                                 torch.tensor([[0, 9]]), torch.tensor([0.0, 9.0])])
def test_bad_host_copy_of_cu_seqlens_is_refused_by_name(bad, make_generator):
    stack = make(MomentumLSTM, "momentum", make_generator(), 2)
    x = torch.zeros(1, 9, D, dtype=torch.float64)
    device_copy = torch.zeros(bad.shape[-1], dtype=torch.int64)
    with pytest.raises(ValueError, match="cu_seqlens_cpu"):
        stack(x, cu_seqlens=device_copy, cu_seqlens_cpu=bad)
    with pytest.raises(ValueError, match="cu_seqlens"):
        stack(x, cu_seqlens_cpu=torch.tensor([0, 9]))
