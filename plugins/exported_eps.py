"""`x + eps` that survives ONNX's graph optimiser.

torch.onnx.export(dynamo=True) runs onnxscript's optimiser by default (optimize=True). Its
"x + 0 → x" rule compares a scalar constant with 0 at an absolute tolerance of 1e-8
(onnxscript 0.7.2, `rewriter._pattern_ir.Constant`), so it removes `m + 1e-8`: eq. 15's default
ε, or any eps a user sets that small, vanishes from the exported graph and onnxruntime's numbers
differ from eager's. The rule matches scalar constants only, so under export eps is added as a
one-element tensor, which broadcasts to the same sums."""
import torch

from .exporting import is_exporting


def eps_operand(eps: float, like: torch.Tensor):
    """eps as the operand of an addition to `like`: the float itself, or while torch.export traces
    (the path ONNX takes), a one-element tensor of like's dtype and device."""
    if is_exporting():
        return torch.full((1,), eps, dtype=like.dtype, device=like.device)
    return eps


def plus_eps(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x + eps, with eps as `eps_operand` gives it."""
    return x + eps_operand(eps, x)
