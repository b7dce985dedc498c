"""Which kernels run causal momentum attention: the PyTorch chunked form (`chunk.py`,
`recurrent.py`; any device, the reference) or the fused Triton kernels of
`plugins.attention.triton` (CUDA, or CPU tensors under Triton's interpreter). The Triton
package is imported only when a call may use it, so CPU-only installs never load it."""
import os
from types import ModuleType
from typing import Optional

import torch

from ..exporting import onnx_exporting
from .rule import MomentumRule

_FAILED = {}      # the import error of plugins.attention.triton, once "auto" has met it


def use_triton(backend: str, device: torch.device, float64: bool) -> bool:
    """backend is one of checks.BACKENDS: "torch" never, "auto" for CUDA tensors when the
    kernels are available, "triton" always — or a ValueError saying why it cannot run here.
    float64 (inputs or state) stays on the PyTorch reference path. Under torch.onnx.export the
    kernels cannot run: they are custom ops (triton/op.py), which ONNX has no form of, so "auto"
    takes the PyTorch path there; torch.export alone keeps them (its program calls the ops)."""
    if backend == "torch":
        return False
    if backend == "auto":
        return device.type == "cuda" and not float64 and not onnx_exporting() and _available()
    if onnx_exporting():
        raise ValueError("backend='triton' cannot be exported to ONNX: its kernels are torch custom ops, "
                         "which ONNX has no form of; export with backend='auto' or 'torch' (the PyTorch "
                         "path, which 'auto' takes under torch.onnx.export)")
    if float64:
        raise ValueError("backend='triton' runs bfloat16, float16 and float32 inputs and states; "
                         "for float64 use backend='torch' or 'auto'")
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("backend='triton' on CPU tensors needs Triton's interpreter: set "
                             "TRITON_INTERPRET=1 before triton is imported, or use backend='torch' or 'auto'")
        triton_kernels()
        return True
    if device.type != "cuda":
        raise ValueError(f"backend='triton' needs CUDA tensors (or CPU tensors under TRITON_INTERPRET=1), "
                         f"got {device}; use backend='torch' or 'auto'")
    if not triton_kernels().is_available():
        raise ValueError("backend='triton': the Triton kernels are not available on this machine "
                         "(plugins.attention.triton.is_available() is False); use backend='torch' or 'auto'")
    return True


def triton_for(backend: str, device: torch.device, float64: bool,
               rule: Optional[MomentumRule] = None) -> Optional[ModuleType]:
    """The Triton kernels when `use_triton` says they run this call, else None (PyTorch). The
    kernels compute eq. 12's coefficients from (β, γ): a rule that is not eq. 12
    (`MomentumRule.is_momentum`) runs in PyTorch, and backend="triton" refuses it."""
    if rule is not None and not rule.is_momentum:
        if backend == "triton":
            raise ValueError("backend='triton' runs the momentum rule (eq. 12) only; a registered rule "
                             "other than 'momentum' runs with backend='torch' or 'auto'")
        return None
    return triton_kernels() if use_triton(backend, device, float64) else None


def triton_kernels() -> ModuleType:
    """plugins.attention.triton, or a ValueError naming why it does not import."""
    try:
        from . import triton as kernels  # an import statement: torch.compile traces it
    except ImportError as error:
        raise ValueError("backend='triton' needs plugins.attention.triton, which does not import here "
                         f"({error}); use backend='torch' or 'auto'") from error
    return kernels


def _available() -> bool:
    """For "auto": whether the kernels import and run here. A failed import is remembered, so
    that CUDA machines without Triton do not retry it on every call."""
    if _FAILED:
        return False
    try:
        return bool(triton_kernels().is_available())
    except ValueError as error:
        _FAILED["import"] = error
        return False
