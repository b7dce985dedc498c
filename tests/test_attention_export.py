"""torch.export of `momentum_attention` (causal, eq. 13) with a dynamic length, float64: the
exported program equals the quadratic reference at lengths inside one chunk, at and across chunk
boundaries and over several chunks, for plain linear attention and momentum, with a padding mask
(chunk.py's `_exported_tiles` and scan.py's `_exported_entering`); and with NaN and ±inf inputs,
the program and onnxruntime as eager (nonfinite.py's `split_finite`)."""
import pytest
import torch
from helpers.onnx_runtime import onnxruntime_function
from test_attention_exactness import random_qkv
from torch.export import Dim, export

from plugins.attention import momentum_attention, naive_causal_momentum_attention
from plugins.attention.backends import onnx_exporting

CHUNK = 16


class Attention(torch.nn.Module):
    def __init__(self, momentum, step_size):
        super().__init__()
        self.momentum, self.step_size = momentum, step_size

    def forward(self, q, k, v, mask):
        return momentum_attention(q, k, v, momentum=self.momentum, step_size=self.step_size,
                                  padding_mask=mask, chunk_size=CHUNK, backend="torch")


def left_padded_mask(N, pads):
    return torch.arange(N)[None, :] >= torch.tensor(pads)[:, None]


@pytest.mark.parametrize("momentum,step_size", [(0.0, 1.0), (0.6, 0.6), (0.99, 2.0)])
def test_exported_attention_with_a_dynamic_length_equals_eq13(make_generator, momentum, step_size):
    module = Attention(momentum, step_size)
    gen = make_generator()
    q, k, v = (t.detach() for t in random_qkv(gen, N=20))
    length = Dim("length", min=1, max=256)
    shapes = {2: length}
    program = export(module, (q, k, v, left_padded_mask(20, [0, 3])),
                     dynamic_shapes=(shapes, shapes, shapes, {1: length}))
    for N in (1, 2, 15, 16, 17, 32, 50, 100):
        q, k, v = (t.detach() for t in random_qkv(gen, N=N))
        mask = left_padded_mask(N, [0, N // 3])
        want = naive_causal_momentum_attention(q, k, v, momentum=momentum, step_size=step_size,
                                               padding_mask=mask)
        torch.testing.assert_close(program.module()(q, k, v, mask), want, rtol=1e-9, atol=1e-10,
                                   msg=lambda m: f"N = {N}: {m}")


def with_non_finite(t, gen):
    """t with NaN, +inf and −inf at random entries."""
    t = t.clone()
    flat = t.view(-1)
    spots = torch.randperm(flat.numel(), generator=gen)[:6]
    flat[spots] = torch.tensor([float("nan"), float("inf"), -float("inf")] * 2, dtype=t.dtype)
    return t


def test_exported_attention_keeps_non_finite_inputs_where_eager_does(make_generator, tmp_path):
    """NaN and ±inf in q, k, v (nonfinite.py's `split_finite`, one where under export): the program
    and onnxruntime give eager's outputs, NaN exactly where eager has NaN, at lengths other than the
    traced one."""
    module = Attention(0.6, 0.6)
    gen = make_generator()
    q, k, v = (t.detach().float() for t in random_qkv(gen, N=20))
    length = Dim("length", min=1, max=256)
    shapes = {2: length}
    inputs = (q, k, v, left_padded_mask(20, [0, 3]))
    dynamic = (shapes, shapes, shapes, {1: length})
    program = export(module, inputs, dynamic_shapes=dynamic).module()
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    run = onnxruntime_function(torch.onnx.export(module, inputs, dynamic_shapes=dynamic, dynamo=True,
                                                 verbose=False), tmp_path)
    for N in (7, 40):
        q, k, v = (with_non_finite(t.detach().float(), gen) for t in random_qkv(gen, N=N))
        given = (q, k, v, left_padded_mask(N, [0, N // 3]))
        want = module(*given)
        assert want.isnan().any() and not want.isnan().all(), "the inputs must reach some outputs, not all"
        for name, got in (("program", program(*given)), ("onnxruntime", run(*given))):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True,
                                       msg=lambda m: f"{name}, N = {N}: {m}")


def test_torch_export_keeps_the_triton_kernels_as_custom_ops(make_generator):
    """torch.export alone (what AOTInductor builds on) keeps backend='triton': the program calls
    the kernels' custom op and equals eager at a length other than the traced one (run under
    Triton's interpreter here, on CPU tensors)."""
    pytest.importorskip("plugins.attention.triton")
    module = TritonAttention()
    gen = make_generator()
    q, k, v = (t.detach().float() for t in random_qkv(gen, N=20))
    length = Dim("length", min=1, max=256)
    program = export(module, (q, k, v), dynamic_shapes=tuple({2: length} for _ in range(3)))
    code = "".join(str(m.code) for m in program.graph_module.modules() if hasattr(m, "code"))
    assert "momentum_plugins.chunk_momentum_attention" in code
    q, k, v = (t.detach().float() for t in random_qkv(gen, N=45))
    torch.testing.assert_close(program.module()(q, k, v), module(q, k, v), rtol=0, atol=0)


class TritonAttention(torch.nn.Module):
    def forward(self, q, k, v):
        return momentum_attention(q, k, v, momentum=0.6, step_size=0.6, backend="triton")


def test_under_onnx_export_auto_takes_the_pytorch_path_and_triton_is_refused(monkeypatch):
    """The kernels are custom ops, which ONNX has no form of: while torch.onnx.export traces,
    "auto" on a CUDA device takes the PyTorch path, and "triton" is refused by name. (No CUDA here:
    the kernels are declared available and the export flags set, as torch.onnx.export's
    non-strict capture sets them.)"""
    from plugins.attention import backends
    monkeypatch.setattr(backends, "_available", lambda: True)
    cuda = torch.device("cuda")
    assert backends.use_triton("auto", cuda, float64=False), "outside export, auto runs the kernels on CUDA"
    monkeypatch.setattr(torch.compiler, "_is_exporting_flag", True)      # as torch.export sets it
    assert backends.use_triton("auto", cuda, float64=False), "torch.export alone keeps the kernels"
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    assert not backends.use_triton("auto", cuda, float64=False)
    with pytest.raises(ValueError, match="backend='triton' cannot be exported to ONNX"):
        backends.use_triton("triton", cuda, float64=False)


class ExportFlag(torch.nn.Module):
    def forward(self, x):
        return x + float(onnx_exporting())


@pytest.mark.parametrize("strict", [False, True])
def test_onnx_export_is_seen_in_both_of_the_exporters_captures(monkeypatch, strict):
    """torch.onnx.export captures with torch.export(strict=False), then, if that fails, strict
    (dynamo), which folds torch.onnx.is_in_onnx_export() to False: backends.onnx_exporting sees
    the export in both, and nothing outside one."""
    from torch.onnx._internal.exporter import _flags
    x = torch.zeros(2)
    assert torch.equal(export(ExportFlag(), (x,), strict=strict).module()(x), x)
    monkeypatch.setattr(_flags, "_is_onnx_exporting", True)
    assert torch.equal(export(ExportFlag(), (x,), strict=strict).module()(x), x + 1)


def test_onnx_export_of_the_triton_backend_is_refused_by_name():
    """Through torch.onnx.export itself (both captures refuse, under Triton's interpreter here)."""
    pytest.importorskip("plugins.attention.triton")
    pytest.importorskip("onnxscript")
    q, k, v = torch.randn(3, 1, 2, 20, 8).unbind(0)
    with pytest.raises(Exception, match="backend='triton' cannot be exported to ONNX"):
        torch.onnx.export(TritonAttention(), (q, k, v), dynamo=True, verbose=False)
