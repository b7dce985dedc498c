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
by decreasing length, `batch_sizes`; `SegmentLayout`): the fused kernels (cuDNN / oneDNN) and eq. 15's
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


class SegmentLayout(NamedTuple):
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


def segment_layout(offsets: Tensor, device) -> SegmentLayout:
    """The packed layout of the segments [offsets[s], offsets[s+1]) (offsets int64 on the CPU),
    formed with a few vectorised index operations (no loop over segments); the host copy is read
    as a list, so nothing here waits for the device."""
    bounds = offsets.tolist()
    sizes = [end - begin for begin, end in zip(bounds, bounds[1:])]
    kept = [s for s, size in enumerate(sizes) if size > 0]
    lengths = torch.tensor(sizes, dtype=torch.int64)
    keep = torch.tensor(kept, dtype=torch.int64)
    sizes, starts = lengths[keep], offsets[:-1][keep]
    sizes, order = torch.sort(sizes, descending=True, stable=True)
    t = torch.arange(max(lengths.tolist()))[:, None]
    inside = t < sizes[None, :]
    batch_sizes = inside.sum(1)
    gather = (starts[order][None, :] + t)[inside]
    to = lambda i: i.to(device)
    nonempty = None if len(kept) == len(bounds) - 1 else to(keep)
    return SegmentLayout(lengths, nonempty, batch_sizes, to(order), to(torch.argsort(order)), to(gather),
                    to(torch.argsort(gather)))


def check_host_offsets(cu_seqlens_cpu, length: int) -> Tensor:
    """The host copy of cu_seqlens (as fla's cu_seqlens_cpu): a 1-D integer CPU tensor of n + 1
    offsets from 0, non-decreasing, ending at `length`; checked on the host, so no device wait.
    Returns it as int64. ValueError naming `cu_seqlens_cpu` otherwise."""
    if not isinstance(cu_seqlens_cpu, Tensor) or cu_seqlens_cpu.device.type != "cpu" \
            or cu_seqlens_cpu.dim() != 1 or cu_seqlens_cpu.numel() < 2 \
            or cu_seqlens_cpu.dtype not in (torch.int32, torch.int64):
        got = (f"{tuple(cu_seqlens_cpu.shape)} {cu_seqlens_cpu.dtype} on {cu_seqlens_cpu.device}"
               if isinstance(cu_seqlens_cpu, Tensor) else type(cu_seqlens_cpu).__name__)
        raise ValueError(f"cu_seqlens_cpu must be a 1-D int32/int64 CPU tensor of n + 1 >= 2 offsets, "
                         f"got {got}")
    bounds = cu_seqlens_cpu.tolist()
    if bounds[0] != 0 or bounds[-1] != length or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens_cpu must run from 0 to the sequence length {length} without "
                         f"decreasing, got {bounds}")
    return cu_seqlens_cpu.long()


def check_offsets_metadata(cu_seqlens, device, batch: int, count: int) -> None:
    """cu_seqlens beside its host copy: a tensor of `count` int32/int64 offsets on the input's
    device over a batch of one row; its values are the host copy's (not read here)."""
    if not isinstance(cu_seqlens, Tensor) or tuple(cu_seqlens.shape) != (count,) \
            or cu_seqlens.dtype not in (torch.int32, torch.int64) \
            or cu_seqlens.device != torch.device(device):
        got = (f"{tuple(cu_seqlens.shape)} {cu_seqlens.dtype} on {cu_seqlens.device}"
               if isinstance(cu_seqlens, Tensor) else type(cu_seqlens).__name__)
        raise ValueError(f"cu_seqlens must be a ({count},) int32/int64 tensor on the input's device {device} "
                         f"(the device copy of cu_seqlens_cpu), got {got}")
    if batch != 1:
        raise ValueError(f"cu_seqlens needs a batch of one row (batch 1, the sequences packed into it), got "
                         f"batch {batch}: concatenate the rows into one")
