"""Where one momentum attention call runs, decided once per call by `plan` from the validated spec,
the batch description and the inputs' dtypes and device (no device value is read). `attend`,
`attend_step` and the public functions execute the plan; nothing else chooses a kernel.

Paths: "context_parallel" (a process group: wraps the kernel, `context_parallel`), "noncausal" /
"noncausal_varlen" (eq. 14's two sums, per row / per packed segment), "chunk" / "varlen" (eq. 13
in PyTorch, rows / packed segments: one kernel body, two layouts), "triton" (the fused chunk kernels,
rows or packed), "step" / "triton_step" (eq. 12 for one new token of unpacked rows)."""
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

import torch

from ..packing import Segments
from .backends import triton_for
from .checks import compute_dtype
from .spec import AttentionSpec
from .state import MomentumAttentionState

PATHS = ("context_parallel", "noncausal", "noncausal_varlen", "chunk", "varlen", "triton", "step",
         "triton_step")


@dataclass(frozen=True)
class Plan:
    """path: one of PATHS; kernels: the Triton module for "triton" / "triton_step", else None;
    state_dtype: states and denominators (float32, or float64 for float64 inputs or state);
    run_dtype: what q, k, v are cast to before the kernel (the Triton kernels take the inputs'
    dtype and accumulate in float32 themselves); rule_args: how the kernel takes the rule (the
    PyTorch kernels the rule object, the Triton kernels eq. 12's β and γ)."""

    path: str
    kernels: Optional[ModuleType]
    state_dtype: torch.dtype
    run_dtype: torch.dtype
    rule_args: dict


def plan(spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
         segments: Optional[Segments] = None, state: Optional[MomentumAttentionState] = None,
         step: bool = False, process_group=None) -> Plan:
    """The path of one call. step: a decoding call (`attend_step`), whose single token of unpacked
    rows runs the fused step; process_group: context parallelism."""
    state_dtype = compute_dtype(q, k, v)
    if state is not None and state.s.dtype == torch.float64:
        state_dtype = torch.float64
    packed = segments is not None and segments.packed
    rule = spec.momentum_rule
    torch_args = dict(rule=rule)
    if process_group is not None:
        return Plan("context_parallel", None, state_dtype, state_dtype, torch_args)
    if not spec.causal:
        return Plan("noncausal_varlen" if packed else "noncausal", None, state_dtype, state_dtype, torch_args)
    kernels = triton_for(spec.backend, q.device, float64=state_dtype == torch.float64, rule=rule)
    args = torch_args if kernels is None else dict(momentum=rule.decay, step_size=rule.direct)
    if step and q.shape[2] == 1 and not packed:
        return Plan("step" if kernels is None else "triton_step", kernels, state_dtype, state_dtype, args)
    if kernels is not None:
        inputs = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
        return Plan("triton", kernels, state_dtype, inputs, args)
    return Plan("varlen" if packed else "chunk", None, state_dtype, state_dtype, args)
