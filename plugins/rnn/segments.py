"""Packed rows for the sequence layers: many sequences (segments) in one row, each run as if alone.

Two ways to say where the segments lie, as flash-attention / fla and transformers' padding-free
collator do:
- `cu_seqlens`: a 1-D int32/int64 tensor of n+1 offsets over a batch of ONE row, on the input's
  device; cu[0] = 0, non-decreasing (empty segments allowed), cu[-1] = the row's length.
  Segment s is time steps [cu[s], cu[s+1]).
- `segment_starts`: a (batch, time) bool tensor, True where a new sequence begins (position_ids
  == 0), in that order whatever the layer's batch_first; each row's first step always begins a
  segment. Its segments are numbered row by row, left to right (row 0's first, then row 1's …).

The recurrences run the n segments as a batch of n sequences in torch's packed layout (sorted
by decreasing length, `batch_sizes`; `Segments`): the fused kernels (cuDNN / oneDNN) and eq. 15's
recurrence then see each segment from its own first step, with its own initial state, exactly as
a separate sequence, and the row's steps are gathered into that layout and back by one index
each (layers.py says which path filters the momentum on the row itself). Empty segments take no
step: their final state is their initial state.
"""
from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence


def offsets_from_starts(segment_starts, batch, length, device) -> Tensor:
    """cu_seqlens (int64, CPU) over the rows of `segment_starts` laid end to end (row-major);
    each row's first step begins a segment. ValueError naming `segment_starts` otherwise."""
    if not isinstance(segment_starts, Tensor):
        raise ValueError(f"segment_starts must be a (batch, time) bool tensor, got "
                         f"{type(segment_starts).__name__}")
    if segment_starts.dtype != torch.bool:
        raise ValueError(f"segment_starts must have dtype torch.bool (True where a sequence begins), "
                         f"got {segment_starts.dtype}")
    if tuple(segment_starts.shape) != (batch, length):
        raise ValueError(f"segment_starts must have shape (batch, time) = {(batch, length)}, "
                         f"got {tuple(segment_starts.shape)}")
    if segment_starts.device != torch.device(device):
        raise ValueError(f"segment_starts must be on the input's device {device}, "
                         f"got {segment_starts.device}")
    starts = segment_starts.detach().to("cpu").clone()
    starts[:, 0] = True
    begin = torch.nonzero(starts.reshape(-1))[:, 0]
    return torch.cat([begin, torch.tensor([batch * length])])


class Segments(NamedTuple):
    """Where each step of the flattened row sits in torch's packed layout of the non-empty segments.

    lengths (n,) int64 on the CPU; nonempty: indices of the segments with steps (on the device),
    or None when all have; packed: PackedSequence metadata (batch_sizes and the sort by length);
    gather: (N,) step of the row at each position of the packed data; scatter: its inverse.
    """
    lengths: Tensor
    nonempty: Tensor | None
    batch_sizes: Tensor
    sorted_indices: Tensor
    unsorted_indices: Tensor
    gather: Tensor
    scatter: Tensor

    @property
    def count(self) -> int:
        return self.lengths.numel()

    def pack(self, flat: Tensor) -> PackedSequence:
        """flat (N, D), the row's steps in order -> the non-empty segments as a PackedSequence."""
        return PackedSequence(flat.index_select(0, self.gather), self.batch_sizes, self.sorted_indices,
                              self.unsorted_indices)

    def unpack(self, data: Tensor) -> Tensor:
        """Packed data (N, H) in this layout -> (N, H) in the row's order."""
        return data.index_select(0, self.scatter)


def segment_layout(offsets: Tensor, device) -> Segments:
    """The packed layout of the segments [offsets[s], offsets[s+1]) (offsets int64 on the CPU),
    formed with a few vectorised index operations (no loop over segments)."""
    lengths = offsets.diff()
    keep = torch.nonzero(lengths > 0)[:, 0]
    sizes, starts = lengths[keep], offsets[:-1][keep]
    sizes, order = torch.sort(sizes, descending=True, stable=True)
    t = torch.arange(int(sizes[0]))[:, None]
    inside = t < sizes[None, :]
    batch_sizes = inside.sum(1)
    gather = (starts[order][None, :] + t)[inside]
    to = lambda i: i.to(device)
    nonempty = None if keep.numel() == lengths.numel() else to(keep)
    return Segments(lengths, nonempty, batch_sizes, to(order), to(torch.argsort(order)), to(gather),
                    to(torch.argsort(gather)))
