"""The trusted path (`attend`, `attend_step`) reads nothing back from the device: no
bool()/int()/.item() of a tensor (aten._local_scalar_dense) and no nonzero (whose output size is
data), forward and backward, padded and packed, on the PyTorch path and through the Triton
launchers (the interpreter here). On a GPU each such read drains the queue. The public functions
may read while validating; their `Segments` are built before counting."""
import pytest
import torch
from helpers.triton_attention import triton_ops
from torch.utils._python_dispatch import TorchDispatchMode

from plugins.attention import AttentionSpec, MomentumAttentionState, attend, attend_step
from plugins.packing import Segments

HOST_READS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::item", "aten::equal", "aten::is_nonzero"}


class CountHostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in HOST_READS:
            self.reads.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def inputs(g, batch=2, length=21, H=2, D=3):
    return [torch.randn(batch, H, length, D, generator=g, requires_grad=True) for _ in range(3)]


def run(q, k, v, spec, segments, return_state=False):
    with CountHostReads() as counter:
        out = attend(q, k, v, spec, segments=segments, return_state=return_state)
        if return_state:
            out, state = out
            out = out.sum() + state.s.sum() + state.z.sum() + state.m.sum()
        out.sum().backward()
    return counter.reads


def left_and_middle_padding():
    mask = torch.ones(2, 21, dtype=torch.bool)
    mask[0, :4] = False
    mask[1, 9:12] = False
    return mask


def test_counter_sees_a_host_read():
    """The counter itself: a layer that branches on data is caught."""
    x = torch.ones(3)
    with CountHostReads() as counter:
        bool(x.all())
        x.nonzero()
    assert counter.reads == ["aten::_local_scalar_dense", "aten::nonzero"]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("momentum", [0.0, 0.6])
@pytest.mark.parametrize("layout", ["dense", "right", "any", "cu_seqlens", "documents"])
def test_attend_reads_nothing_back(layout, causal, momentum, backend, make_generator):
    """Both backends (the Triton kernels under the interpreter: what a launcher does around them
    is the same as on a GPU)."""
    if backend == "triton":
        triton_ops()                      # skips where the kernels cannot run
    g = make_generator()
    q, k, v = inputs(g)
    spec = AttentionSpec(momentum=momentum, causal=causal, chunk_size=4, backend=backend)
    if layout == "dense":
        segments = None
    elif layout == "right":
        segments = Segments.from_padding_mask(torch.arange(21) < torch.tensor([[15], [21]]), 2, 21)
    elif layout == "any":
        segments = Segments.from_padding_mask(left_and_middle_padding(), 2, 21)
    elif layout == "cu_seqlens":
        q, k, v = (t[:1].detach().requires_grad_() for t in (q, k, v))
        segments = Segments.from_cu_seqlens(torch.tensor([0, 5, 5, 13, 21]), 21)
    else:
        starts = torch.zeros(2, 21, dtype=torch.bool)
        starts[:, [0, 7]] = True
        starts[0, 4] = True
        segments = Segments.from_document_starts(starts, left_and_middle_padding())
    assert run(q, k, v, spec, segments, return_state=causal) == []


def test_attend_reads_nothing_back_with_nonfinite_input(make_generator):
    q, k, v = inputs(make_generator())
    with torch.no_grad():
        k[0, 1, 5, 2] = float("nan")
    spec = AttentionSpec(momentum=0.5, chunk_size=4, backend="torch")
    assert run(q, k, v, spec, Segments.from_padding_mask(left_and_middle_padding(), 2, 21)) == []


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("padded", [False, True])
def test_attend_step_reads_nothing_back(padded, backend, make_generator):
    """With gradients, and (the Triton path's one-launch step) without."""
    if backend == "triton":
        triton_ops()                      # skips where the kernels cannot run
    g = make_generator()
    q, k, v = (t[:, :, :1] for t in inputs(g))
    spec = AttentionSpec(momentum=0.5, backend=backend)
    state = MomentumAttentionState.zeros(2, 2, 3, 3, dtype=torch.float32, device="cpu")
    segments = Segments.from_padding_mask(torch.tensor([[True], [False]]), 2, 1) if padded else None
    with CountHostReads() as counter:
        out, new_state = attend_step(q, k, v, state, spec, segments=segments)
        (out.sum() + new_state.s.sum()).backward()
        with torch.no_grad():
            attend_step(q, k, v, state, spec, segments=segments)
    assert counter.reads == []
