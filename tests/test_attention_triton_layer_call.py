"""A decoder layer's eager training call in one autograd node (plugins/attention/triton/layer_call.py)
against the three nodes that `attend` chains where a state goes in or out (the feature map with its
marks, the chunk op, the causal marks): the same bits in the output and in every input's gradient,
on inputs with NaN and ±inf, laid out as a layer hands them over, for rows, padded rows (left
padding, which `attend` reorders) and packed sequences; and `attend` takes the one node exactly
where it applies. Under TRITON_INTERPRET=1 (tests/conftest.py); the sm_90 launch check
(tests/triton_direct_launch_check.py) launches it through Triton's real launcher."""
import math

import pytest
import torch
import torch.nn.functional as F

from plugins.attention.attend import attend
from plugins.attention.feature_maps import elu_plus_one, identity
from plugins.attention.spec import AttentionSpec
from plugins.attention.state import MomentumAttentionState
from plugins.packing import Segments

pytest.importorskip("triton")
pytest.importorskip("plugins.attention.triton")

B, N, H, D, DV = 2, 150, 2, 16, 8


def raw_inputs(gen, batch, dtype):
    """q, k, v (batch, N, H, ·) as a layer's projections, with NaN, inf and −inf entries."""
    q, k = (torch.randn(batch, N, H, D, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(batch, N, H, DV, generator=gen).to(dtype)
    q[0, 70, 1, 3] = math.nan
    k[-1, 100, 0, 5] = math.inf
    v[0, 120, 1, 2] = -math.inf
    q[-1, 140, 1, 0] = math.nan                              # padding in the padded layout's last row
    return q, k, v


def node_names(out) -> set:
    """The names of the autograd nodes behind out."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [next_node for next_node, _ in node.next_functions]
    return {node.name() for node in seen}


def run(inputs, segments, spec, grad, one_node, needs=(True, True, True)):
    """(out, gradients of the leaves that need one, the autograd nodes' names) of attend on heads
    transposed out of (batch, N, H, ·); one_node False asks for the state, which takes the chain."""
    leaves = [t.detach().clone().requires_grad_(need) for t, need in zip(inputs, needs)]
    views = [t.transpose(1, 2) for t in leaves]
    if one_node:
        out = attend(*views, spec, segments=segments)
    else:
        out, _state = attend(*views, spec, segments=segments, return_state=True)
    wanted = [t for t in leaves if t.requires_grad]
    return out, torch.autograd.grad(out, wanted, grad), node_names(out)


def layouts(dtype):
    gen = torch.Generator().manual_seed(3)
    real = torch.ones(B, N, dtype=torch.bool)
    real[0, :40] = False                                      # left padding: attend reorders the row
    real[1, 130:] = False
    packed = Segments.from_cu_seqlens(torch.tensor([0, 1, 64, 64, 150]), N, batch=1)
    return [("rows", raw_inputs(gen, B, dtype), None),
            ("padded", raw_inputs(gen, B, dtype), Segments.from_padding_mask(real, B, N)),
            ("packed", raw_inputs(gen, 1, dtype), packed)]


# every pair of (feature map, momentum, dtype) values once: 6 cases instead of the product's 12
# (each runs the three layouts forward and backward, twice, under the interpreter)
PAIRWISE = [pytest.param(phi, momentum, dtype, id=f"{name}-{momentum}-{str(dtype)[6:]}")
            for phi, name, momentum, dtype in ((elu_plus_one, "elu+1", 0.6, torch.float32),
                                               (elu_plus_one, "elu+1", 0.0, torch.bfloat16),
                                               (F.relu, "relu", 0.0, torch.float32),
                                               (F.relu, "relu", 0.6, torch.bfloat16),
                                               (identity, "identity", 0.6, torch.float32),
                                               (identity, "identity", 0.0, torch.bfloat16))]


@pytest.mark.parametrize("phi,momentum,dtype", PAIRWISE)
def test_one_node_gives_the_chained_nodes_bits(phi, momentum, dtype):
    spec = AttentionSpec(momentum=momentum, step_size=0.8, feature_map=phi, backend="triton", chunk_size=64)
    for name, inputs, segments in layouts(dtype):
        shape = (inputs[0].shape[0], H, N, DV)
        grad = torch.randn(shape, generator=torch.Generator().manual_seed(5)).to(dtype)
        grad[0, 0, 3, 1] = math.nan                          # a non-finite output gradient, before the marks
        out, grads, nodes = run(inputs, segments, spec, grad, True)
        expected, expected_grads, chained = run(inputs, segments, spec, grad, False)
        assert "MarkedChunkBackward" in nodes and "FiniteFeaturesBackward" not in nodes, name
        assert "MarkedChunkBackward" not in chained and "FiniteFeaturesBackward" in chained, name
        assert out.dtype == dtype and out.isnan().any(), name
        assert torch.equal(out.isnan(), expected.isnan()), name
        assert torch.equal(out.nan_to_num(), expected.nan_to_num()), name
        for x, a, b in zip("qkv", grads, expected_grads):
            assert torch.equal(a.isnan(), b.isnan()), (name, x)
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), (name, x)


def test_inputs_without_gradient_get_none_and_the_others_the_chained_bits():
    spec = AttentionSpec(momentum=0.6, step_size=1.0, backend="triton", chunk_size=64)
    name, inputs, segments = layouts(torch.float32)[1]
    grad = torch.randn(B, H, N, DV, generator=torch.Generator().manual_seed(7))
    needs = (False, True, False)
    _, grads, nodes = run(inputs, segments, spec, grad, True, needs)
    _, expected, _ = run(inputs, segments, spec, grad, False, needs)
    assert "MarkedChunkBackward" in nodes and len(grads) == 1
    assert torch.equal(grads[0].nan_to_num(), expected[0].nan_to_num())


def test_a_feature_map_without_a_kernel_and_a_given_state_take_the_chain():
    """A feature map the kernels do not apply, and an initial state, keep the general path."""
    gen = torch.Generator().manual_seed(9)
    inputs = raw_inputs(gen, B, torch.float32)
    grad = torch.randn(B, H, N, DV, generator=gen)
    custom = AttentionSpec(momentum=0.6, step_size=1.0, feature_map=lambda x: F.softplus(x), backend="triton")
    _, _, nodes = run(inputs, None, custom, grad, True)
    assert "MarkedChunkBackward" not in nodes
    spec = AttentionSpec(momentum=0.6, step_size=1.0, backend="triton")
    state = MomentumAttentionState.zeros(B, H, D, DV, dtype=torch.float32, device="cpu")
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = attend(*(t.transpose(1, 2) for t in leaves), spec, initial_state=state)
    assert "FiniteFeaturesBackward" in node_names(out) and "MarkedChunkBackward" not in node_names(out)
