"""Context parallelism's agreement protocol: before any state is exchanged, the ranks of the group
all-gather a short descriptor of their call, once per call, and raise the same ValueError when a
rank's own checks failed or when they disagree on an argument that must be the same on every rank
(a collective of mismatched shapes would hang or mix up the sequence)."""
import zlib
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.distributed as dist

from ..packing import Segments
from .spec import AttentionSpec
from .state import MomentumAttentionState

# The fields every rank must agree on, in the order of the descriptor each rank all-gathers.
_AGREED = ("batch", "heads", "key dim", "value dim", "dtype", "momentum", "step_size", "eps",
           "feature_map", "causal", "requires_grad", "cu_seqlens")
# Fields that may differ: validity, lengths, whether the rank has a padding mask or an
# initial_state, whether its state runs in float64.
_OWN = ("valid", "query length", "key length", "padding_mask", "initial_state", "float64 state")


@dataclass(frozen=True)
class Agreement:
    """What the ranks told each other: key_lengths[r] the keys of rank r's slice (padding
    included); masked: some rank has a padding mask; float64: some rank's state runs in float64."""

    key_lengths: List[int]
    masked: bool
    float64: bool


def agree(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec, group, *,
          segments: Optional[Segments], initial_state: Optional[MomentumAttentionState]) -> Agreement:
    """This rank's part of the protocol for an already checked call: its descriptor is all-gathered
    and checked against the other ranks'. A rank whose checks failed calls `report_invalid`
    instead."""
    table = _all_gather_descriptor(_describe(q, k, v, spec, segments, initial_state), group)
    _check_agreement(table)
    own = table[:, len(_AGREED):]
    return Agreement(key_lengths=own[:, 2].to(torch.long).tolist(), masked=bool(own[:, 3].any()),
                     float64=bool(own[:, 5].any()))


def report_invalid(group) -> None:
    """The part of a rank whose own checks failed: it sends an invalid descriptor, so that the
    other ranks raise too instead of waiting; the caller then raises its own error."""
    _all_gather_descriptor(None, group)


def _describe(q, k, v, spec: AttentionSpec, segments: Optional[Segments],
              initial_state: Optional[MomentumAttentionState]) -> List[float]:
    """The descriptor (_AGREED + _OWN) of a checked call, as float64 numbers."""
    cu_code, masked = 0, False
    if segments is not None:
        masked = segments.padding_mask is not None
        if segments.packed:
            cu_code = _code(",".join(str(x) for x in segments.cu_seqlens_cpu.tolist()))
    feature_map = spec.feature_map
    name = feature_map if isinstance(feature_map, str) else getattr(feature_map, "__qualname__",
                                                                     type(feature_map).__name__)
    tensors = [q, k, v] + ([] if initial_state is None else [initial_state.s, initial_state.z,
                                                              initial_state.m])
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    dtypes = ",".join(str(t.dtype) for t in (q, k, v))
    float64_state = initial_state is not None and initial_state.s.dtype == torch.float64
    agreed = (q.shape[0], q.shape[1], q.shape[3], v.shape[3], _code(dtypes), spec.momentum, spec.step_size,
              spec.eps, _code(name), spec.causal, grad, cu_code)
    own = (1, q.shape[2], k.shape[2], masked, initial_state is not None, float64_state)
    return [float(x) for x in agreed + own]


def _code(text: str) -> int:
    """A number for a name, the same in every process (Python's hash() is salted per process)."""
    return zlib.crc32(text.encode())


def _all_gather_descriptor(own: Optional[List[float]], group) -> torch.Tensor:
    """Every rank's descriptor (world, fields); a rank whose checks failed sends zeros (valid = 0).
    On the device the backend needs, not the inputs' (which may be what failed the checks)."""
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    size = len(_AGREED) + len(_OWN)
    row = torch.tensor(own if own is not None else [0.0] * size, dtype=torch.float64, device=device)
    parts = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, row, group=group)
    return torch.stack(parts).cpu()


def _check_agreement(table: torch.Tensor) -> None:
    """The same ValueError on every rank: a rank whose own checks failed, or the first
    argument the ranks disagree on."""
    valid = table[:, len(_AGREED)]
    if not bool(valid.all()):
        bad = [i for i in range(table.shape[0]) if not valid[i]]
        raise ValueError(f"process_group: the arguments of rank(s) {bad} are invalid (see the ValueError "
                         f"raised there)")
    for column, name in enumerate(_AGREED):
        values = table[:, column]
        if not bool((values == values[0]).all()):
            shown = ", ".join(f"rank {i}: {_show(name, x)}" for i, x in enumerate(values.tolist()))
            raise ValueError(f"process_group ranks disagree on {_argument(name)} ({shown}); every rank "
                             f"must pass the same {_argument(name)}")
    later = [i for i in range(1, table.shape[0]) if table[i, len(_AGREED) + 4]]
    if later:
        raise ValueError(f"initial_state with process_group is the state before the whole sequence: "
                         f"pass it on rank 0 only (rank(s) {later} passed one)")


def _argument(name: str) -> str:
    return {"batch": "q, k, v batch size", "heads": "q, k, v head count", "key dim": "q, k last dimension",
            "value dim": "v last dimension", "dtype": "q, k, v dtype",
            "requires_grad": "requires_grad of q, k, v (all ranks train, or none)",
            "cu_seqlens": "cu_seqlens (the global offsets over all ranks' tokens)"}.get(name, name)


def _show(name: str, value: float) -> str:
    if name in ("batch", "heads", "key dim", "value dim", "causal", "requires_grad"):
        return str(int(value)) if name not in ("causal", "requires_grad") else str(bool(value))
    if name in ("dtype", "feature_map", "cu_seqlens"):
        return f"name code {int(value)}"
    return f"{value:g}"
