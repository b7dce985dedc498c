"""Packed documents in the transformers integration (padding-free training with transformers'
`DataCollatorWithFlattening`): where each document starts, and the one packed row that
momentum attention takes with `cu_seqlens` (flash-attention's and flash-linear-attention's
convention), so that every document is computed exactly as if it ran alone.

A document's start is read from any of three forms; when several are given they must agree:
- `position_ids` that restart: a token whose position is not the previous token's + 1 starts
  a document (transformers' `masking_utils.find_packed_sequence_indices`, the rule its sdpa,
  eager and flex masks use; on the collator's rows it equals flash-attention's
  `prepare_fa_kwargs_from_position_ids`). Several rows, each packed, are allowed.
- `cu_seq_lens_q` / `cu_seq_lens_k` from `DataCollatorWithFlattening(return_flash_attn_kwargs=True)`:
  n + 1 offsets over one row (batch 1). `max_length_q` / `max_length_k` size flash-attention's
  grid and are not needed by the chunked form.
- `seq_idx` from `DataCollatorWithFlattening(return_seq_idx=True)`: the document of every token.
With a padding mask, only real tokens count (a row's first real token starts a document, padding
is skipped), so padded rows keep their unpacked meaning. A flat sibling of the modeling files
(torch and the `validation` sibling only), so a saved model's remote code carries it.
"""
from typing import Optional

import torch

from .validation import check_offsets

COLLATOR = "transformers.DataCollatorWithFlattening"
PACKING_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


def pop_packing_kwargs(kwargs: dict) -> dict:
    """Remove the collator's packing keys from `kwargs` (e.g. a model's **kwargs) and return them."""
    return {key: kwargs.pop(key) for key in PACKING_KWARGS if key in kwargs}


def has_packing_kwargs(cu_seq_lens_q=None, cu_seq_lens_k=None, seq_idx=None, **ignored) -> bool:
    return any(x is not None for x in (cu_seq_lens_q, cu_seq_lens_k, seq_idx))


def document_starts(batch: int, length: int, device, **forms) -> Optional[torch.Tensor]:
    """`possible_document_starts`, or None when no row holds more than one document (one read of
    the device; a model's edge reads it with the rest of its `Segments` instead)."""
    starts = possible_document_starts(batch, length, device, **forms)
    return starts if starts is not None and bool((starts.sum(-1) > 1).any()) else None


def possible_document_starts(batch: int, length: int, device, *, padding_mask: Optional[torch.Tensor] = None,
                             position_ids=None, cu_seq_lens_q=None, cu_seq_lens_k=None, seq_idx=None,
                             **ignored) -> Optional[torch.Tensor]:
    """(batch, length) bool, True at every real token that starts a document (each row's first
    real token included), or None when no form of packing is given; whether any row holds more
    than one is left on the device. padding_mask: (batch, length) bool, True = real token, or
    None. `ignored` takes max_length_q/k. Raises ValueError for malformed forms and for forms
    that disagree; under torch.compile only their types and shapes are checked (the values would
    be a read of the device) and the first form given is trusted."""
    if position_ids is None and seq_idx is None and cu_seq_lens_q is None and cu_seq_lens_k is None:
        return None                     # no form given: nothing to compute (eight device ops a step before)
    real = (torch.ones(batch, length, dtype=torch.bool, device=device) if padding_mask is None
            else padding_mask.to(device=device, dtype=torch.bool))
    arange = torch.arange(length, device=device)
    last_real = torch.where(real, arange, -1).cummax(-1).values
    # the row's previous real token, -1 if none (a roll keeps an empty row empty)
    previous = torch.where(arange == 0, -1, last_real.roll(1, -1))
    first = real & (previous < 0)
    found = {}
    if position_ids is not None:
        pos = _per_token(position_ids, "position_ids", batch, length, device)
        found["position_ids"] = first | (real & (pos != pos.gather(1, previous.clamp(min=0)) + 1))
    if seq_idx is not None:
        seq = _per_token(seq_idx, "seq_idx", batch, length, device)
        found["seq_idx"] = first | (real & (seq != seq.gather(1, previous.clamp(min=0))))
    if cu_seq_lens_q is not None or cu_seq_lens_k is not None:
        found["cu_seq_lens_q"] = _starts_from_offsets(cu_seq_lens_q, cu_seq_lens_k, real, first)
    names = list(found)
    for other in [] if torch.compiler.is_compiling() else names[1:]:   # a comparison reads the device
        if not torch.equal(found[names[0]], found[other]):
            raise ValueError(
                f"{names[0]} and {other} disagree on where the packed documents start: {names[0]} "
                f"starts them at tokens {_where(found[names[0]])}, {other} at {_where(found[other])}; pass "
                f"what {COLLATOR} returns for the same batch (position_ids restart at 0 at every document)")
    return found[names[0]] if names else None


def document_positions(starts: torch.Tensor, padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(batch, length) int64: each real token's position within its document (0 at its start),
    counted over real tokens; padding gets the position of the real token before it (0 if none)."""
    real = torch.ones_like(starts) if padding_mask is None else padding_mask.to(torch.bool)
    count = real.long().cumsum(-1) - 1
    start_count = torch.where(starts, count, torch.zeros_like(count)).cummax(-1).values
    return (count - start_count).clamp(min=0)


def _per_token(values, name: str, batch: int, length: int, device) -> torch.Tensor:
    if not isinstance(values, torch.Tensor) or values.dtype.is_floating_point or values.dtype.is_complex \
            or values.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of shape (batch, length), got "
                         f"{getattr(values, 'dtype', type(values).__name__)}")
    if values.dim() == 1:
        values = values[None]
    # not `shape[0] in (1, batch)`: torch 2.13's compile with dynamic shapes can judge that wrongly
    # (plugins/rnn/sequence.initial_state)
    if values.dim() != 2 or values.shape[1] != length or (values.shape[0] != 1 and values.shape[0] != batch):
        raise ValueError(f"{name} must have shape ({batch}, {length}) (or (1, {length})), got "
                         f"{tuple(values.shape)}")
    return values.to(device=device, dtype=torch.long).expand(batch, length)


def _starts_from_offsets(cu_q, cu_k, real: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Document starts from the collator's offsets (one row, no padding: the collator adds none)."""
    if cu_q is None or cu_k is None:
        given, missing = ("cu_seq_lens_q", "cu_seq_lens_k")
        if cu_q is None:
            given, missing = missing, given
        raise ValueError(f"{given} was given without {missing}: {COLLATOR}(return_flash_attn_kwargs=True) "
                         "returns both")
    batch, length = real.shape
    cu = check_offsets(cu_q, length, name="cu_seq_lens_q").to(real.device)
    cu_k = check_offsets(cu_k, length, name="cu_seq_lens_k").to(real.device)
    compiling = torch.compiler.is_compiling()
    if not compiling and not torch.equal(cu, cu_k):
        raise ValueError(f"cu_seq_lens_q {cu.tolist()[:16]} and cu_seq_lens_k {cu_k.tolist()[:16]} differ: "
                         "momentum self-attention splits queries and keys alike")
    if batch != 1:
        raise ValueError(f"cu_seq_lens_q needs the documents flattened into one row (batch 1, as {COLLATOR} "
                         f"returns), got batch {batch}")
    if not compiling and not bool(real.all()):
        raise ValueError("cu_seq_lens_q covers every token of the row, but the attention_mask marks "
                         f"padding; {COLLATOR} adds no padding (pass no attention_mask)")
    # a scatter, not a boolean index (whose size is data): offsets equal to length land in the
    # dropped last slot, and the clamp keeps unchecked offsets (under torch.compile) in memory
    marked = torch.zeros(1, length + 1, dtype=torch.bool, device=real.device)
    return first | marked.scatter(1, cu[None, :-1].clamp(0, length), True)[:, :length]


def _where(starts: torch.Tensor) -> list:
    return [tuple(i) if len(i) > 1 else i[0] for i in starts.nonzero().tolist()][:16]
