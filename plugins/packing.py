"""Where the sequences of a (batch, length) input are: right- or any-padded rows, or documents packed
into one row (flash-attention's and flash-linear-attention's `cu_seqlens`: n + 1 offsets, sequence s
is tokens [cu[s], cu[s+1])).

A `Segments` is built once per forward at the model's edge and validated when it is built: its
constructors are the only place that reads device values to the host (the all-real and
right-padding shortcuts of a padding mask, one host copy of the offsets, kept as
`cu_seqlens_cpu` as fla does). Every layer, attention op and kernel then trusts it.

Under torch.compile nothing is read: documents get offsets of a static size (every token may
start one; the unused offsets are empty documents at the end) and no host copy, so the varlen
kernels size their chunk layout by a static bound (`varlen.SegmentChunks.build`)."""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .validation import check_offsets_on_host


def front_order(mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(order, restore) of a (batch, length) bool mask, True = real: order[b] lists row b's real
    positions, then its padded ones, each in their order (a stable partition from cumulative
    sums, not a sort, so that ONNX and torch.export take it); restore is its inverse, the place
    of each position in that order."""
    real = mask.to(torch.long)
    padded_after = real.sum(-1, keepdim=True) + (1 - real).cumsum(-1) - 1
    restore = torch.where(mask, real.cumsum(-1) - 1, padded_after)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(restore)
    return torch.empty_like(restore).scatter_(1, restore, positions), restore


@dataclass(frozen=True, eq=False)
class Segments:
    """batch, length: the input's (batch, length). padding_mask (batch, length) bool, True = real, or
    None when every token is real; lengths (batch,) int64 real tokens per row; order (batch, length)
    the stable permutation moving each row's real tokens to its front and restore its inverse
    (`front_order`), None when the padding is only on the right. cu_seqlens (n + 1,) int64 on the
    device and cu_seqlens_cpu, its host copy:
    documents packed in one row of the real tokens; index: flat indices of those real tokens in
    the (batch, length) input, None when every token is real. most_documents: the most documents
    in one row, max_position: the largest of the `positions` given to `from_document_starts` or
    `from_starts_or_padding`, both read with the offsets' host copy (None when not described).
    real (batch * length,) bool, True at real tokens, when the packed row holds every token (under
    torch.compile: index is then a permutation putting the padding last, as one more document,
    and pack / unpack zero it); None otherwise."""

    batch: int
    length: int
    padding_mask: Optional[torch.Tensor] = None
    lengths: Optional[torch.Tensor] = None
    order: Optional[torch.Tensor] = None
    restore: Optional[torch.Tensor] = None
    cu_seqlens: Optional[torch.Tensor] = None
    cu_seqlens_cpu: Optional[torch.Tensor] = None
    index: Optional[torch.Tensor] = None
    most_documents: Optional[int] = None
    max_position: Optional[int] = None
    real: Optional[torch.Tensor] = None

    @classmethod
    def from_padding_mask(cls, padding_mask: Optional[torch.Tensor], batch: int, length: int) -> "Segments":
        """Rows of one (batch, length) input, padding_mask (batch, length) bool, True = real token,
        any pattern, or None. Eager mode drops a mask that marks every token real and the
        permutation of right-padded rows; under torch.compile both are kept (exact either way)
        rather than branch on data."""
        if padding_mask is None:
            return cls(batch=batch, length=length)
        _check_mask(padding_mask, "padding_mask", batch, length)
        compiling = torch.compiler.is_compiling()
        if not compiling and bool(padding_mask.all()):
            return cls(batch=batch, length=length)
        lengths = padding_mask.sum(-1)
        order = restore = None
        if compiling or not bool((padding_mask[:, 1:] <= padding_mask[:, :-1]).all()):
            order, restore = front_order(padding_mask)
        return cls(batch=batch, length=length, padding_mask=padding_mask, lengths=lengths, order=order,
                   restore=restore)

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: torch.Tensor, length: int, *,
                        cu_seqlens_cpu: Optional[torch.Tensor] = None, device=None,
                        batch: Optional[int] = None) -> "Segments":
        """Documents packed in one row of `length` tokens (batch 1). cu_seqlens_cpu: the same offsets
        already on the host (then nothing is copied); otherwise one copy is made and kept.
        device, batch: the inputs', checked against cu_seqlens where given."""
        if cu_seqlens_cpu is not None and not isinstance(cu_seqlens_cpu, torch.Tensor):
            raise ValueError(f"cu_seqlens_cpu must be a host copy of cu_seqlens (a 1-D int tensor), got "
                             f"{type(cu_seqlens_cpu).__name__}")
        if cu_seqlens_cpu is not None and cu_seqlens_cpu.device.type != "cpu":
            raise ValueError(f"cu_seqlens_cpu must be on the CPU, got {cu_seqlens_cpu.device}")
        cu, host = check_offsets_on_host(cu_seqlens, length, device=device, batch=batch, host=cu_seqlens_cpu)
        return cls(batch=1, length=length, cu_seqlens=cu, cu_seqlens_cpu=host)

    @classmethod
    def from_document_starts(cls, starts: torch.Tensor, padding_mask: Optional[torch.Tensor] = None, *,
                             positions: Optional[torch.Tensor] = None) -> "Segments":
        """starts (batch, length) bool, True where a document starts (each row's first real token
        included); padding_mask as in `from_padding_mask`. The real tokens of all rows, in order,
        become one row of documents. positions: the input's position ids (optional), whose
        maximum is read with the offsets. One copy to the host: the offsets and index are
        built on the device in fixed-size buffers, then sliced to the counts that copy brings.
        Under torch.compile no copy: `_static_documents` (trusting that starts mark every row's
        first real token, which `hf_momentum.packing.possible_document_starts` guarantees)."""
        return cls._read_documents(starts, padding_mask, positions)[0]

    @classmethod
    def from_starts_or_padding(cls, starts: torch.Tensor, padding_mask: Optional[torch.Tensor] = None, *,
                               positions: Optional[torch.Tensor] = None,
                               offsets: Optional[torch.Tensor] = None) -> "Segments":
        """`from_document_starts` when some row holds several documents, else the rows as
        `from_padding_mask` describes them; either from the one copy to the host. Under
        torch.compile always the documents (exact either way; which one is a read of the device).
        offsets: the same documents' cu_seqlens over one unpadded row (a collator's), if given;
        under torch.compile they are the layout (`_bucketed_offsets`), far smaller than the static one."""
        if offsets is not None and padding_mask is None and torch.compiler.is_compiling():
            return cls._bucketed_offsets(offsets, starts)
        documents, right_padded = cls._read_documents(starts, padding_mask, positions)
        if right_padded is None or documents.most_documents > 1:
            return documents
        known = dict(most_documents=documents.most_documents, max_position=documents.max_position)
        if documents.index is None:
            return cls(batch=documents.batch, length=documents.length, **known)
        order, restore = (None, None) if right_padded else front_order(padding_mask)
        return cls(batch=documents.batch, length=documents.length, padding_mask=padding_mask,
                   lengths=padding_mask.sum(-1), order=order, restore=restore, **known)

    @classmethod
    def _read_documents(cls, starts, padding_mask, positions):
        """(the packed Segments, whether padding is only on the right) from one copy to the host;
        under torch.compile (the static layout, None) from none."""
        if not isinstance(starts, torch.Tensor) or starts.dtype != torch.bool or starts.dim() != 2:
            raise ValueError(f"starts must be a (batch, length) bool tensor, True where a document starts, "
                             f"got "
                             f"{getattr(starts, 'dtype', type(starts).__name__)} of shape "
                             f"{tuple(getattr(starts, 'shape', ()))}")
        batch, length = starts.shape
        if padding_mask is not None:
            _check_mask(padding_mask, "padding_mask", batch, length)
            if padding_mask.device != starts.device:
                raise ValueError(f"padding_mask is on {padding_mask.device} but starts is on {starts.device}")
            starts = starts & padding_mask
        if torch.compiler.is_compiling():
            return cls._static_documents(starts, padding_mask), None
        total = batch * length
        keep = None if padding_mask is None else padding_mask.reshape(-1)
        flat = starts.reshape(-1)
        slot = torch.arange(total, device=starts.device)
        packed_slot = slot if keep is None else keep.cumsum(0) - 1
        real = packed_slot.new_full((), total) if keep is None else keep.sum()
        cu = _to_slots(real.repeat(total + 2), torch.where(flat, flat.cumsum(0) - 1, total + 1), packed_slot)
        top = (real.new_zeros(()) if positions is None or not positions.numel()
               else positions.max().long().to(real.device))
        most = starts.sum(-1).amax() if batch else real.new_zeros(())
        right = (real.new_ones(()) if keep is None
                 else (padding_mask[:, 1:] <= padding_mask[:, :-1]).all().long())
        host = torch.cat([cu[:total + 1], torch.stack([cu[0], flat.sum(), real, most, top, right])]).cpu()
        first, count, real_count, most_documents, max_position, right_padded = host[-6:].tolist()
        if real_count and first != 0:
            raise ValueError("starts must mark the first real token of every row as a document start")
        index = None
        if real_count < total:
            index = _to_slots(slot.new_full((total + 1,), total), torch.where(keep, packed_slot, total),
                              slot)[:real_count]
        documents = cls(batch=batch, length=length, cu_seqlens=cu[:count + 1],
                        cu_seqlens_cpu=host[:count + 1], index=index, most_documents=most_documents,
                        max_position=None if positions is None else max_position)
        return documents, bool(right_padded)

    @classmethod
    def _bucketed_offsets(cls, offsets: torch.Tensor, starts: torch.Tensor) -> "Segments":
        """Offsets of one unpadded row under torch.compile, padded with empty documents to a
        power of two of entries. Their count is a shape, which the varlen chunk layout is sized
        by (no read of the device); the padding lets every count within one power of two share a
        compiled graph (dynamo guards on the range, not the count), for at most twice the
        documents' share of the chunks."""
        batch, length = starts.shape
        cu = check_offsets_on_host(offsets, length, name="offsets", device=starts.device, batch=batch)[0]
        size = 2
        while size < cu.numel():
            size *= 2
        cu = torch.cat([cu, cu.new_full((size - cu.numel(),), length)])
        return cls(batch=batch, length=length, cu_seqlens=cu)

    @classmethod
    def _static_documents(cls, starts: torch.Tensor, padding_mask: Optional[torch.Tensor]) -> "Segments":
        """The documents of `starts` (already limited to real tokens) in shapes that depend on
        (batch, length) alone, N = batch · length: offsets (N + 1,) whose unused entries repeat the
        number of real tokens (empty documents), and with padding, the row of all N tokens with
        the padding moved behind the real tokens as one last document (offsets end at N)."""
        batch, length = starts.shape
        total = batch * length
        flat = starts.reshape(-1)
        slot = torch.arange(total, device=starts.device)
        document = torch.where(flat, flat.cumsum(0) - 1, total + 1)
        if padding_mask is None:
            cu = _to_slots(slot.new_full((total + 2,), total), document, slot)[:total + 1]
            return cls(batch=batch, length=length, cu_seqlens=cu)
        keep = padding_mask.reshape(-1)
        before = keep.cumsum(0) - keep.long()                # real tokens before each token
        real = keep.sum()
        cu = _to_slots(real.repeat(total + 2), document, before)[:total]
        cu = torch.cat([cu, cu.new_full((1,), total)])
        target = torch.where(keep, before, real + slot - before)   # padding after the real tokens
        index = _to_slots(torch.empty_like(slot), target, slot)
        return cls(batch=batch, length=length, cu_seqlens=cu, index=index, real=keep)

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None

    @property
    def count(self) -> int:
        """Sequences described: packed documents, or rows."""
        return self.cu_seqlens.numel() - 1 if self.packed else self.batch

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, H, length, D) → (1, H, M, D) over the M real tokens, rows in order (with `real`:
        all M = batch · length tokens, the padding zeroed and last)."""
        heads, dim = x.shape[1], x.shape[3]
        flat = _zero_padding(x.transpose(0, 1).reshape(heads, self.batch * self.length, dim), self.real, 1)
        if self.index is not None:
            flat = flat.index_select(1, self.index)
        return flat[None]

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """The inverse of `pack`, zeros at padding."""
        heads, dim = y.shape[1], y.shape[3]
        flat = y[0]
        if self.index is not None:
            flat = _zero_padding(flat.new_zeros(heads, self.batch * self.length, dim).index_copy(
                1, self.index, flat), self.real, 1)
        return flat.reshape(heads, self.batch, self.length, dim).transpose(0, 1)

    def pack_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, length, ...) → (1, M, ...)."""
        flat = _zero_padding(x.reshape(self.batch * self.length, *x.shape[2:]), self.real, 0)
        if self.index is not None:
            flat = flat.index_select(0, self.index)
        return flat[None]

    def document_ids(self) -> torch.Tensor:
        """(batch, length) int64 on the device: the document of each token, counted over the packed
        row (`cu_seqlens`); padding tokens get any of them. Found on the device (no host read)."""
        offsets = self.cu_seqlens
        tokens = self.batch * self.length if self.index is None else self.index.numel()
        ids = torch.searchsorted(offsets[1:], torch.arange(tokens, device=offsets.device), right=True)
        if self.index is not None:
            ids = ids.new_zeros(self.batch * self.length).index_copy(0, self.index, ids)
        return ids.view(self.batch, self.length)

    def unpack_tokens(self, y: torch.Tensor) -> torch.Tensor:
        flat = y[0]
        if self.index is not None:
            flat = _zero_padding(flat.new_zeros(self.batch * self.length, *flat.shape[1:]).index_copy(
                0, self.index, flat), self.real, 0)
        return flat.reshape(self.batch, self.length, *flat.shape[1:])


def _check_mask(mask, name: str, batch: int, length: int) -> None:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be a bool tensor (True = real token), got {got}")
    if tuple(mask.shape) != (batch, length):
        raise ValueError(f"{name} must have shape (batch, length) = {(batch, length)}, "
                         f"got {tuple(mask.shape)}")


def _zero_padding(flat: torch.Tensor, real: Optional[torch.Tensor], dim: int) -> torch.Tensor:
    """flat with zeros at the padding tokens along dim (a `where`, so neither NaN in padding nor
    the padding's own document reaches the real tokens or their gradients)."""
    if real is None:
        return flat
    shape = [1] * flat.dim()
    shape[dim] = -1
    return torch.where(real.view(shape), flat, torch.zeros((), dtype=flat.dtype, device=flat.device))


def _to_slots(fill: torch.Tensor, target: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """`fill` with each value written at its target slot: a `nonzero` of fixed size, which needs
    no read of how many. Each kept slot is written at most once; the values not kept all go to
    the last slot, which is never read (so which of them lands there does not matter)."""
    return fill.scatter(0, target, values)
