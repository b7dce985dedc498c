"""Cropping a recurrent cache back to a verified prefix, exactly: what assisted and prompt-lookup
decoding need (issue 29). transformers' `_assisted_decoding` runs the target model once over
the candidate tokens and then calls the cache's `crop(-rejected)`; an assistant's cache is
cropped the same way before it drafts again.

A recurrent state keeps no per-token history, so while generate records the past
(`Cache.activate_past_recording`) the cache keeps a `History`: the layers as they were before
the first forward after the last crop (their tensors are replaced, never written in place, by
each forward, so keeping references costs no copy) and the inputs of every forward since.
`crop` puts the layers back and keeps the accepted inputs as pending; the model's next forward
first runs them (`replay_accepted`, one call at the top of its forward), so the state is
rebuilt by the model's own multi-token forward, for any cell or attention form and any layer
kind that replaces its tensors. The window is one drafting round: its length is bounded by the
candidate length (plus the assistant's two re-fed tokens).
"""
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F


@dataclass
class Inputs:
    """The inputs of one forward: token ids or embeddings (batch, length[, hidden]), the new tokens'
    padding-mask columns (batch, length) and position_ids, each None when not given."""

    input_ids: Optional[torch.Tensor]
    inputs_embeds: Optional[torch.Tensor]
    mask: Optional[torch.Tensor]
    position_ids: Optional[torch.Tensor]

    @property
    def length(self) -> int:
        return (self.input_ids if self.input_ids is not None else self.inputs_embeds).shape[1]


@dataclass
class History:
    """The cache as it was at `start` tokens (each layer's attributes, the row counter) and the
    inputs of the forwards since. `pending`: after a crop, how many of those tokens were kept;
    `closed`: a crop happened, so the next forward starts a new window."""

    start: int
    layers: list
    row_tokens: Optional[torch.Tensor]
    inputs: List[Inputs] = field(default_factory=list)
    pending: int = 0
    closed: bool = False

    @property
    def length(self) -> int:
        return sum(step.length for step in self.inputs)


def _copy_attributes(attributes: dict) -> dict:
    """A layer's attributes with its dicts of states copied (the tensors themselves are shared), so
    that neither the layer nor the snapshot sees the other's later assignments."""
    return {name: dict(value) if isinstance(value, dict) else value for name, value in attributes.items()}


class CroppableStatesMixin:
    """For a `RecurrentCache`: `crop` back to any position inside the tokens absorbed since the
    last crop (or since recording began), while generate records the past."""

    history: Optional[History] = None
    replaying: bool = False

    @property
    def is_croppable(self) -> bool:
        """Whether `crop` can return to an earlier token now: while generate records the past, in a
        cache whose forwards replace its tensors (not a static one, updated in place). transformers'
        assisted decoding asks this after its first forward (from 5.24)."""
        return self.recording_past() and not self.is_compileable

    def recording_past(self) -> bool:
        """Whether generate asked this cache to record its past (`activate_past_recording`), which
        every layer of it keeps (`record_past`, also the softmax layers' `KeyValueLayer`)."""
        return any(self.is_recording_past(idx) for idx in range(len(self.layers)))

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last `-tokens_to_remove` tokens (transformers' convention: 0 or negative). The
        kept tokens are final: the next forward starts a new window."""
        if isinstance(tokens_to_remove, bool) or not isinstance(tokens_to_remove, int) or \
                tokens_to_remove > 0:
            raise ValueError("crop takes the number of tokens to remove as an int <= 0, got "
                             f"{tokens_to_remove!r}")
        history = self.history
        if tokens_to_remove == 0:
            if history is not None:
                history.closed = True
            return
        keep = self.seen_tokens + tokens_to_remove
        if history is None or keep < history.start:
            reach = "" if history is None else f", only back to {history.start} tokens"
            raise RuntimeError(
                f"cannot crop the cache to {keep} tokens{reach}: a recurrent state can be cropped only "
                "within the tokens of the forwards since its last crop, while generate records the past "
                "(Cache.activate_past_recording, as assisted and prompt-lookup decoding do)")
        for layer, saved in zip(self.layers, history.layers):
            layer.__dict__.update(_copy_attributes(saved))
        self.row_tokens = None if history.row_tokens is None else history.row_tokens.clone()
        self.seen_tokens = keep
        history.pending = keep - history.start
        history.closed = True

    def reset(self) -> None:
        self.history = None
        super().reset()

    def take_pending(self, embed) -> Optional[Inputs]:
        """The inputs of the accepted tokens the states do not hold yet as one forward's (None if
        none; `embed`: the model's input embedding, for a round that gave embeddings), the token
        count set back to the states', so that this forward brings it to `get_seq_length()`."""
        history = self.history
        if history is None or history.pending == 0:
            return None
        steps, count = [], history.pending
        for step in history.inputs:
            if count <= 0:
                break
            steps.append(step if step.length <= count else _head(step, count))
            count -= step.length
        pending = _concatenate(steps, embed)
        history.pending = 0
        self.seen_tokens = history.start
        return pending

    def record(self, inputs: Inputs) -> None:
        """Keep the inputs of a forward that is about to run, starting a new window (a snapshot
        of the layers now) after a crop. A forward that is not recorded ends the window: the
        states move past what it could restore."""
        if self.replaying:
            return
        if not self.recording_past():
            self.history = None
            return
        if self.is_compileable:
            raise ValueError(f"{type(self).__name__} keeps its states in place and cannot be cropped: "
                             "speculative decoding (assistant_model= / prompt_lookup_num_tokens=) needs the "
                             "default cache")
        history = self.history
        if history is None or history.closed:
            history = self.history = History(
                start=self.seen_tokens, layers=[_copy_attributes(vars(layer)) for layer in self.layers],
                row_tokens=None if self.row_tokens is None else self.row_tokens.clone())
        history.inputs.append(inputs)


def _head(step: Inputs, count: int) -> Inputs:
    cut = lambda t: None if t is None else t[:, :count]    # noqa: E731
    return Inputs(cut(step.input_ids), cut(step.inputs_embeds), cut(step.mask), cut(step.position_ids))


def _concatenate(steps: List[Inputs], embed) -> Inputs:
    """One forward's inputs from several: ids, or embeddings if a step gave embeddings (`embed`
    turns the others' ids into theirs); mask columns of ones where a step gave no mask."""
    if len(steps) == 1:
        return steps[0]
    if all(s.input_ids is not None for s in steps):
        ids, embeds = torch.cat([s.input_ids for s in steps], 1), None
    else:
        ids = None
        embeds = torch.cat([embed(s.input_ids) if s.inputs_embeds is None else s.inputs_embeds
                            for s in steps], 1)
    mask = None
    if any(s.mask is not None for s in steps):
        mask = torch.cat([s.mask.bool() if s.mask is not None else _ones(s) for s in steps], 1)
    given = [s.position_ids is not None for s in steps]
    if any(given) and not all(given):
        raise ValueError("position_ids were given to some forwards of a speculative round and not to others: "
                         "pass them to every forward or to none")
    position_ids = torch.cat([s.position_ids for s in steps], -1) if all(given) else None
    return Inputs(ids, embeds, mask, position_ids)


def _ones(step: Inputs) -> torch.Tensor:
    tokens = step.input_ids if step.input_ids is not None else step.inputs_embeds
    return torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device)


def replay_accepted(model, cache, input_ids=None, inputs_embeds=None, attention_mask=None,
                    position_ids=None) -> None:
    """Called first in a model's forward. After a crop, run the accepted tokens the states do not
    hold yet (their outputs are dropped: only the cache is wanted); then, while generate records
    the past, keep this forward's inputs so a later crop can return to any of its tokens."""
    if not isinstance(cache, CroppableStatesMixin):
        return
    pending = cache.take_pending(model.get_input_embeddings())
    if pending is not None:
        mask = None if pending.mask is None else F.pad(pending.mask, (cache.seen_tokens, 0), value=True)
        cache.replaying = True
        try:
            model(input_ids=pending.input_ids, inputs_embeds=pending.inputs_embeds, attention_mask=mask,
                  position_ids=pending.position_ids, cache=cache, use_cache=True)
        finally:
            cache.replaying = False
    if input_ids is None and inputs_embeds is None:
        return
    step = Inputs(input_ids, inputs_embeds, None, position_ids)
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        step.mask = attention_mask[:, attention_mask.shape[1] - step.length:]
    cache.record(step)
