"""NaN and inf in q, k, v (or made by the feature map) reach only the outputs that depend on them.

A matmul multiplies every entry, so a non-finite φ(k_j) or v_j would turn the zero weight it
gets at an earlier query into NaN (0 × NaN), and a non-finite q_i would do the same to the key
gradients through a zero upstream gradient (and leave NaN in its own gradient, hence in the
projection weights' gradients, even with its output left out of the loss). The feature map and
the kernels therefore see only finite parts (non-finite entries replaced by 0 with `where`),
and each result gets its NaN back afterwards exactly where eq. 12 would carry a non-finite
value: output i from q_i and from k_j, v_j with j ≤ i (causal) or any real j (eq. 14); a v entry
only reaches its own value column. The marks are tensors of 0 and NaN, so adding them is exact
and needs no data-dependent branch: the trusted path (`attend`) always computes them (fused under
torch.compile; on the Triton path in eager mode, with the feature map, by one kernel for q, k, v:
attend._feature_map), so that no layer waits for the device to say whether there is anything to mark;
only a caller that has checked its inputs finite (the public functions, in eager mode, with one
sum per input) skips them."""
import math
from dataclasses import dataclass
from typing import Optional

import torch

from ..exporting import is_exporting
from .checks import check_feature_dims
from .feature_maps import FEATURE_MAPS
from .state import MomentumAttentionState

# The built-in maps send finite inputs to finite features.
FINITE_MAPS = tuple(FEATURE_MAPS.values())


def split_finite(t: torch.Tensor):
    """(finite part, marks): non-finite entries → 0 in the first (whose gradient there is 0,
    as a product: nan_to_num's backward keeps an upstream NaN, as the Triton marks do), NaN in the
    second (t·0: 0 where t is finite). Under export (no backward) one `where` instead, which ONNX
    runs in one pass over t, where it spells nan_to_num as three (NaN, −inf, +inf); its mask is
    |t| < inf (false for NaN and ±inf), two ONNX ops where isfinite is four."""
    if is_exporting():
        zero = torch.zeros((), dtype=t.dtype, device=t.device)
        return torch.where(t.abs() < math.inf, t, zero), t.detach() * 0
    return torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0), t.detach() * 0


def all_finite(*tensors: torch.Tensor) -> bool:
    """Eager shortcut of the public functions: True when no entry is NaN or inf (one sum per
    tensor, accumulated in at least float32; a sum that overflows only sends the call down the
    exact marked path). Reads the device: never call it on the trusted path."""
    sums = [t.sum(dtype=torch.promote_types(t.dtype, torch.float32)) for t in tensors]
    return bool(torch.isfinite(torch.stack(sums)).all())


class FiniteInputs:
    """The marks of inputs known to be finite: every result stays as it is."""

    def causal(self, out: torch.Tensor, segments: Optional[torch.Tensor] = None,
               count: int = 0) -> torch.Tensor:
        return out

    step = noncausal = causal

    def state(self, state: MomentumAttentionState, segments: Optional[torch.Tensor] = None,
              count: int = 0) -> MomentumAttentionState:
        return state


@dataclass
class NonFiniteMarks:
    """0/NaN marks of q and φ(q) per query (B, H, Nq, 1), of k and φ(k) per key (B, H, Nk, 1),
    or per key and feature (B, H, Nk, D′) when φ may overflow, and of v per key and value
    column (B, H, Nk, Dv)."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor

    @classmethod
    def feature_map(cls, phi, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, finite: bool = False):
        """φ on the finite parts of q and k: returns finite φ(q), φ(k), v and the marks. A
        non-finite entry of q or k marks every feature of its position (φ may mix them).
        finite: the caller has checked q, k, v finite; with a built-in map nothing is marked.
        (The Triton path computes the same in its own kernels: attend._feature_map.)"""
        if finite and phi in FINITE_MAPS:
            fq, fk = phi(q), phi(k)
            check_feature_dims(fq, fk, q, k)
            return fq, fk, v, FiniteInputs()
        q, q_marks = split_finite(q)
        k, k_marks = split_finite(k)
        v, value = split_finite(v)
        fq, fk = phi(q), phi(k)
        check_feature_dims(fq, fk, q, k)
        query, key = q_marks.sum(-1, keepdim=True), k_marks.sum(-1, keepdim=True)
        if phi not in FINITE_MAPS:                      # a callable may overflow: mark that too
            fq, fq_marks = split_finite(fq)
            fk, fk_marks = split_finite(fk)
            query, key = query + fq_marks.sum(-1, keepdim=True), key + fk_marks
        return fq, fk, v, cls(query, key, value)

    def _per_key(self) -> torch.Tensor:
        return self.key.sum(-1, keepdim=True) + self.value             # (B, H, Nk, Dv)

    def causal(self, out: torch.Tensor, segments: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Output i is marked by query i and by every key/value j ≤ i (of its own segment, when
        `segments` (N,) gives each position's packed sequence)."""
        if segments is None:
            return out + (self.query + self._per_key().cumsum(2)).to(out.dtype)
        position = torch.arange(out.shape[2], device=out.device)
        start = torch.searchsorted(segments, segments)                 # first position of each one's segment
        flagged = torch.where(self._per_key().isnan(), position[:, None], -1)
        last_flag = flagged.cummax(2).values                           # latest non-finite j ≤ i
        nan = torch.full((), float("nan"), dtype=out.dtype, device=out.device)
        marked = torch.where(last_flag >= start[:, None], nan, torch.zeros_like(nan))
        return out + self.query.to(out.dtype) + marked

    def step(self, out: torch.Tensor) -> torch.Tensor:
        """One new position (out (B, H, Dv), marks of length 1); earlier ones are in the state."""
        return out + (self.query + self._per_key())[:, :, 0].to(out.dtype)

    def noncausal(self, out: torch.Tensor, segments: Optional[torch.Tensor] = None,
                  count: int = 0) -> torch.Tensor:
        """Every output is marked by every (real) key/value (of its segment: `segments` (N,),
        `count` segments); padded keys were zeroed before."""
        if segments is None:
            return out + (self.query + self._per_key().sum(2, keepdim=True)).to(out.dtype)
        per_segment = _segment_sum(self._per_key(), segments, count)
        return out + (self.query + per_segment[:, :, segments]).to(out.dtype)

    def state(self, state: MomentumAttentionState, segments: Optional[torch.Tensor] = None,
              count: int = 0) -> MomentumAttentionState:
        """Eq. 12's state after the keys: a key feature marks its row of S and m and its entry
        of z; a value column marks its column of S and m. With `segments` (N,) of a packed row,
        the state has one row per segment (`count` of them), marked by its own keys only."""
        if segments is None:
            key = self.key.sum(2).to(state.s.dtype)                   # (B, H, D′)
            value = self.value.sum(2).to(state.s.dtype)               # (B, H, Dv)
        else:
            key = _segment_sum(self.key, segments, count)[0].transpose(0, 1).to(state.s.dtype)
            value = _segment_sum(self.value, segments, count)[0].transpose(0, 1).to(state.s.dtype)
        both = key[..., :, None] + value[..., None, :]
        return MomentumAttentionState.trusted(state.s + both, state.z + key, state.m + both)


def _segment_sum(marks: torch.Tensor, segments: torch.Tensor, count: int) -> torch.Tensor:
    """(1, H, N, W) marks summed per segment → (1, H, count, W)."""
    return marks.new_zeros(*marks.shape[:2], count, marks.shape[3]).index_add(2, segments, marks)
