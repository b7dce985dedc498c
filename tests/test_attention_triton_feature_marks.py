"""The Triton path's feature map with its non-finite marks (plugins/attention/triton/feature_marks.py)
against nonfinite.NonFiniteMarks in PyTorch ops: the same features, marks and gradients on inputs
with NaN, inf and −inf, laid out as a decoder layer hands them over (heads transposed out of
(B, N, H, D)), for each built-in map; and that the eager Triton path takes it. Under
TRITON_INTERPRET=1 (tests/conftest.py); tests/triton_launch_check.py compiles it for sm_90, and the
`gpu` test runs it compiled."""
import collections
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from plugins.attention.attend import _feature_map, attend
from plugins.attention.feature_maps import elu_plus_one, identity
from plugins.attention.nonfinite import NonFiniteMarks
from plugins.attention.spec import AttentionSpec

kernels = pytest.importorskip("plugins.attention.triton")
pytest.importorskip("triton")

MAPS = [elu_plus_one, F.relu, identity]


def raw_inputs(gen, B, H, N, D, Dv, dtype):
    """q, k, v as (B, N, H, D) projections viewed per head, with NaN, inf and −inf entries."""
    q, k = (torch.randn(B, N, H, D, generator=gen).to(dtype).transpose(1, 2) for _ in range(2))
    v = torch.randn(B, N, H, Dv, generator=gen).to(dtype).transpose(1, 2)
    for t, index, value in ((q, (0, 1, 5, 3), math.nan), (q, (-1, 0, -1, 0), -math.inf),
                            (k, (-1, -1, 7, -1), math.inf), (v, (0, 0, 9, 2), -math.inf),
                            (v, (-1, 1, 2, 0), math.nan)):
        t[tuple(i % n for i, n in zip(index, t.shape))] = value
    return q, k, v


def features_and_gradients(phi, q, k, v, lengths, gen, use_kernels):
    """attend's feature map (padding from `lengths` on) through the Triton kernels or PyTorch ops."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    mask = None if lengths is None else torch.arange(q.shape[2], device=q.device) < lengths[:, None]
    fq, fk, fv, marks = _feature_map(phi, *leaves, False, kernels if use_kernels else None, mask, lengths)
    grads = [torch.randn(t.shape, generator=gen).to(device=t.device, dtype=t.dtype) for t in (fq, fk, fv)]
    for grad, index in ((grads[0], (0, 0, 3, 1)), (grads[2], (0, 0, 9, 2))):   # finite and non-finite
        grad[tuple(i % n for i, n in zip(index, grad.shape))] = math.nan

    results = (fq, fk, fv, marks.query, marks.key, marks.value)
    return results, torch.autograd.grad((fq, fk, fv), leaves, grads), getattr(marks, "first", None)


def earliest(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """feature_marks.first_marked's contents from 0/NaN marks: per row, the first position whose
    key is marked (column 0) and whose value entry is (column 1 + c), N where none is."""
    N = key.shape[2]
    position = torch.arange(N, device=key.device)[:, None]
    return torch.cat([torch.where(m.isnan(), position, N).amin(2) for m in (key, value)], -1).int()


@pytest.mark.parametrize("phi", MAPS, ids=["elu+1", "relu", "identity"])
@pytest.mark.parametrize("shape", [(2, 3, 37, 20, 12), (1, 2, 300, 64, 64), (3, 1, 1, 5, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("padded", [False, True])
def test_feature_marks_match_the_pytorch_marks(phi, shape, dtype, padded):
    """Padded: rows of unequal lengths (none real in some), a non-finite entry in the padding."""
    gen = torch.Generator().manual_seed(sum(shape))
    q, k, v = raw_inputs(gen, *shape, dtype)
    B, N = shape[0], shape[2]
    lengths = torch.tensor([N - (7 * b + 3) % (N + 1) for b in range(B)]) if padded else None
    expected, expected_grads, _ = features_and_gradients(phi, q, k, v, lengths,
                                                         torch.Generator().manual_seed(1), False)
    got, got_grads, first = features_and_gradients(phi, q, k, v, lengths, torch.Generator().manual_seed(1),
                                                   True)
    assert torch.equal(first, earliest(*expected[4:])), "first marked positions"
    # fp32 products round alike; in fp16 torch rounds elu before adding 1, the kernel once
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-3, atol=1e-3)
    for name, a, b in zip(("φ(q)", "φ(k)", "v", "query marks", "key marks", "value marks"), got, expected):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert torch.equal(a.isnan(), b.isnan()), name
        torch.testing.assert_close(a, b, equal_nan=True, **tol, msg=name)
    for name, a, b, leaf in zip("qkv", got_grads, expected_grads, (q, k, v)):
        assert a.dtype == leaf.dtype, name
        assert torch.equal(a.isnan(), b.isnan()), name
        torch.testing.assert_close(a, b, equal_nan=True, **tol, msg=f"d{name}")
    assert all(t.is_contiguous() for t in got[:3])


@pytest.mark.parametrize("used", ["q", "k", "v", "q and v"])
def test_only_the_inputs_whose_features_are_used_get_a_gradient(used):
    """One autograd node serves q, k and v: an input whose feature the loss does not use gets no
    gradient (None, as through the PyTorch ops), the others the PyTorch path's."""
    q, k, v = raw_inputs(torch.Generator().manual_seed(11), 2, 2, 40, 16, 8, torch.float32)
    got = {}
    for use_kernels in (False, True):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        features = _feature_map(elu_plus_one, *leaves, False, kernels if use_kernels else None)[:3]
        sum(f.sum() for f, name in zip(features, "qkv") if name in used).backward()
        got[use_kernels] = [t.grad for t in leaves]
    for name, a, b in zip("qkv", got[True], got[False]):
        assert (a is None) == (b is None) == (name not in used), name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("phi", [elu_plus_one, F.relu], ids=["elu+1", "relu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_feature_marks_on_a_gpu_match_the_pytorch_marks(phi, dtype):
    """The compiled kernels at a layer's size (B2-H4-T1000, D 64), heads transposed, one row padded,
    NaN and inf in and out of the padding."""
    q, k, v = (t.cuda() for t in raw_inputs(torch.Generator().manual_seed(5), 2, 4, 1000, 64, 64, dtype))
    lengths = torch.tensor([1000, 777], device="cuda")
    expected, expected_grads, _ = features_and_gradients(phi, q, k, v, lengths,
                                                         torch.Generator().manual_seed(1), False)
    got, got_grads, first = features_and_gradients(phi, q, k, v, lengths, torch.Generator().manual_seed(1),
                                                   True)
    assert torch.equal(first, earliest(*expected[4:]))
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    for a, b in zip(got + got_grads, expected + expected_grads):
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.isnan(), b.isnan())
        torch.testing.assert_close(a, b, equal_nan=True, **tol)


def earliest_per_sequence(key: torch.Tensor, value: torch.Tensor, segments: torch.Tensor,
                          count: int) -> torch.Tensor:
    """feature_marks.first_marked's contents for one packed row (B = 1): per sequence of
    `segments`, the first marked key position (column 0) and value entry (column 1 + c)."""
    N, H, Dv = key.shape[2], key.shape[1], value.shape[3]
    first = torch.full((count, H, 1 + Dv), N, dtype=torch.int32)
    for s in range(count):
        inside = (segments == s).nonzero()[:, 0]
        if len(inside):
            within = earliest(key[:, :, inside], value[:, :, inside])[0]
            first[s] = torch.where(within < len(inside), within + inside[0], N)
    return first


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packed", [False, True])
def test_marked_output_matches_the_pytorch_causal_marks(dtype, device, packed):
    """The causal marks in one kernel, each tile from the first marked positions, against
    NonFiniteMarks.causal: sparse NaN marks in rows of several tiles, a value width that is not a
    power of two, an output of another dtype than the marks; packed: one row of four sequences,
    whose marks stay in their own sequence."""
    from plugins.attention.triton.feature_marks import marked_output
    gen = torch.Generator().manual_seed(7)
    B, H, N, Dv = (1 if packed else 2), 3, 150, 20

    def marks(*shape, rate):
        return torch.where(torch.rand(*shape, generator=gen) < rate, math.nan, 0.0)
    query, key = marks(B, H, N, 1, rate=0.02), marks(B, H, N, 1, rate=0.005)
    value = marks(B, H, N, Dv, rate=0.003)
    out = torch.randn(B, H, N, Dv, generator=gen).to(dtype)
    segments = torch.repeat_interleave(torch.arange(4), torch.tensor([40, 1, 0, 109])) if packed else None
    first = earliest_per_sequence(key, value, segments, 4) if packed else earliest(key, value)
    query, key, value, out, first = (t.to(device) for t in (query, key, value, out, first))
    segments = None if segments is None else segments.to(device)
    expected = NonFiniteMarks(query, key, value).causal(out, segments)
    got = marked_output(out, query, first, segments)
    assert got.dtype == dtype and 0 < got.isnan().float().mean() < 1
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got[~got.isnan()], expected[~expected.isnan()])


def test_other_maps_and_float64_keep_the_pytorch_ops():
    q = torch.randn(1, 1, 4, 3)
    assert kernels.finite_features(torch.tanh, q, q, q) is None
    assert kernels.finite_features(elu_plus_one, q.double(), q.double(), q.double()) is None


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("layout", ["rows", "padded", "packed"])
def test_the_eager_triton_path_takes_them_and_agrees_with_the_pytorch_path(layout):
    """attend on raw inputs with a NaN key: no nan_to_num or isfinite op runs on the Triton path,
    nor a `where` for padding, and its output (NaN where eq. 12 carries the key) and gradients
    match the PyTorch path's."""
    from plugins.packing import Segments
    gen = torch.Generator().manual_seed(3)
    B = 2 if layout == "padded" else 1
    q, k, v = (torch.randn(B, 2, 70, 16, generator=gen).requires_grad_() for _ in range(3))
    with torch.no_grad():
        k[0, 1, 40, 2] = math.nan
        v[0, 0, 20, 3] = -math.inf                    # marks its own column from position 20 on
        v[0, 1, 50, 7] = math.nan                     # the same in another head
        q[0, 1, 10, 5] = math.nan                     # marks its own position only
        k[-1, 0, 65, 0] = math.inf                    # padding in the padded batch
    segments = None
    if layout == "packed":
        segments = Segments.from_cu_seqlens(torch.tensor([0, 30, 70]), 70, device=q.device, batch=1)
    elif layout == "padded":
        segments = Segments.from_padding_mask(torch.arange(70) < torch.tensor([[70], [60]]), B, 70)
    upstream = torch.randn(B, 2, 70, 16, generator=gen)
    results = {}
    for backend in ("torch", "triton"):
        spec = AttentionSpec(momentum=0.6, step_size=0.8, backend=backend)
        ops = Ops()
        with ops:
            out = attend(q, k, v, spec, segments=segments)
            grads = torch.autograd.grad(out, (q, k, v), upstream)
        results[backend] = out, grads, ops.names
    out, grads, names = results["triton"]
    ref, ref_grads, ref_names = results["torch"]
    assert "nan_to_num" in ref_names and not set(names) & {"nan_to_num", "isfinite", "ne", "abs"}
    if layout != "packed":                            # padding: the output's mask only, forward and backward
        assert names["where"] == (2 if layout == "padded" else 0) < ref_names["where"]
        assert "cumsum" in ref_names and "cumsum" not in names          # the causal marks in a kernel
    else:                                             # per packed sequence, in a kernel too
        assert "isnan" in ref_names and "isnan" not in names            # NonFiniteMarks.causal's packed form
    assert torch.equal(out.isnan(), ref.isnan()) and out.isnan().any()
    torch.testing.assert_close(out, ref, equal_nan=True, rtol=1e-4, atol=1e-5)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-4, atol=1e-5)
