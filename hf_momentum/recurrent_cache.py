"""Generation cache holding O(1) recurrent states per layer, built on transformers'
`cache_utils.LinearAttentionLayer` (one layer object per model layer, several recurrent
states in it, `reorder_cache` for beam search).

Two pitfalls of using those layers alone are handled here: an all-linear cache cannot report
its sequence length (`DynamicCache.get_seq_length()` raises), and `update_recurrent_state`
does not mark a state as present. `RecurrentCache` counts the tokens it has absorbed (and,
once asked for `row_positions`, each row's real tokens) and marks states itself. It is not
compileable: its states are replaced by new tensors at every step. `StaticStateMixin` makes a
subclass that is (fixed buffers updated in place).

A hybrid model's softmax layers hold their keys and values instead (`KeyValueLayer`, transformers'
`DynamicLayer`, as Qwen3-Next's cache mixes linear-attention and attention layers), with which
cached positions are real tokens, so padded rows stay apart.
"""
from typing import Optional, Sequence, Tuple

import torch
from transformers.cache_utils import Cache, DynamicLayer, LinearAttentionLayer

from .cache_history import CroppableStatesMixin

KeyValues = Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]


class KeyValueLayer(DynamicLayer):
    """A softmax layer's keys and values (B, H, N, D) of every cached position, and `real` (B, N)
    bool, True = real token (None: all real). Set whole by `set`: the layer's attention extends
    them itself."""

    real: Optional[torch.Tensor] = None
    # whether generate records the past (cache_history.CroppableStatesMixin.recording_past): a
    # DynamicLayer has no such switch, so a cache of softmax layers only could never be cropped
    record_past: bool = False

    def activate_past_recording(self, **kwargs) -> None:
        """(transformers 5.25 also passes `recurrent_states_to_keep`, which a crop here does not need:
        it restores the snapshot hf_momentum.cache_history keeps.)"""
        self.record_past = True

    def set(self, keys: torch.Tensor, values: torch.Tensor, real: Optional[torch.Tensor]) -> None:
        self.keys, self.values, self.real = keys, values, real
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def get(self) -> Optional[KeyValues]:
        return (self.keys, self.values, self.real) if self.is_initialized else None

    def reset(self) -> None:
        super().reset()
        self.real = None

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError("crop the whole cache (RecurrentCache.crop, which restores every layer), "
                           "not one of its layers")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.real is not None:
            self.real = self.real.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.real is not None:
            self.real = self.real[indices.to(self.real.device)]


class RecurrentCache(CroppableStatesMixin, Cache):
    """`num_states` tensors per layer (e.g. S, z, m of eq. 12, or an LSTM's h, c); the layers in
    `key_value_layers` (softmax attention) hold a `KeyValueLayer` instead. `crop`: see
    hf_momentum.cache_history (speculative decoding)."""

    is_compileable = False
    row_tokens: Optional[torch.Tensor] = None
    # The width of the padding mask generate() was given with this cache, where it dropped that mask
    # (all ones) before the prefill; None where it kept it (generation_config._mask_length)
    dropped_mask_columns: Optional[int] = None

    def __init__(self, num_layers: int, num_states: int, key_value_layers: Sequence[int] = ()):
        self.key_value_layers = tuple(sorted(set(key_value_layers)))
        super().__init__(layers=[KeyValueLayer() if i in self.key_value_layers
                                 else LinearAttentionLayer(number_of_states=num_states)
                                 for i in range(num_layers)])
        self.num_states = num_states
        self.seen_tokens = 0

    def get_key_values(self, layer_idx: int) -> Optional[KeyValues]:
        """A softmax layer's (keys, values, real), or None before its first update."""
        return self.layers[layer_idx].get()

    def set_key_values(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor,
                       real: Optional[torch.Tensor]) -> None:
        self.layers[layer_idx].set(keys, values, real)

    def get_states(self, layer_idx: int) -> Optional[Tuple[torch.Tensor, ...]]:
        """The layer's states, or None before its first update."""
        layer = self.layers[layer_idx]
        if not all(layer.has_previous_state.values()):
            return None
        states = layer.recurrent_states
        return tuple([states[i] for i in range(self.num_states)])

    def set_states(self, layer_idx: int, states: Sequence[torch.Tensor]) -> None:
        if len(states) != self.num_states:
            raise ValueError(f"expected {self.num_states} states, got {len(states)}")
        layer = self.layers[layer_idx]
        for i, state in enumerate(states):
            layer.recurrent_states[i] = state
            layer.is_recurrent_states_initialized[i] = True
            layer.has_previous_state[i] = True
        layer.dtype, layer.device = states[0].dtype, states[0].device

    def row_positions(self, batch: int, device: torch.device) -> torch.Tensor:
        """(batch,) real tokens absorbed so far by each row, from then on counted by `advance`:
        a decode step's positions follow from it and the new tokens' mask alone, so the step
        does the same work at any context. Before the first call every absorbed token counts
        as real."""
        if self.row_tokens is None:
            self.row_tokens = self._new_counter(
                torch.full((batch,), self.seen_tokens, dtype=torch.long, device=device))
        elif self.row_tokens.shape[0] != batch:
            raise ValueError(f"the cache holds {self.row_tokens.shape[0]} rows, got a batch of {batch}")
        return self.row_tokens

    def advance(self, num_tokens: int, real: Optional[torch.Tensor] = None) -> None:
        """Record that `num_tokens` more positions were absorbed by every layer; `real` (batch,
        num_tokens) bool marks the real ones (None: all real)."""
        self.seen_tokens += num_tokens
        self._count_rows(num_tokens, real)

    def _count_rows(self, num_tokens: int, real: Optional[torch.Tensor]) -> None:
        if self.row_tokens is not None:
            self.row_tokens.add_(num_tokens if real is None else real.sum(-1))

    def _new_counter(self, counter: torch.Tensor) -> torch.Tensor:
        return counter

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.get_seq_length()

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> Tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self, layer_idx: Optional[int] = None) -> int:
        return -1

    @property
    def batch_size(self) -> int:
        if not self.layers:
            return -1
        states = self.get_key_values(0) if 0 in self.key_value_layers else self.get_states(0)
        return -1 if states is None else states[0].shape[0]

    def reset(self) -> None:
        super().reset()
        self.seen_tokens = 0
        self.row_tokens = None

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices])

    def _map(self, fn) -> None:
        for idx in range(len(self.layers)):
            if idx in self.key_value_layers:
                held = self.get_key_values(idx)
                if held is not None:
                    keys, values, real = held
                    self.set_key_values(idx, fn(keys), fn(values), None if real is None else fn(real))
                continue
            states = self.get_states(idx)
            if states is not None:
                self.set_states(idx, [fn(t) for t in states])
        if self.row_tokens is not None:
            self._set_rows(fn(self.row_tokens))

    def _set_rows(self, rows: torch.Tensor) -> None:
        self.row_tokens = rows


class StaticStateMixin:
    """Put before a `RecurrentCache` subclass: its states keep their memory, so that a compiled
    decode step reads and writes the same buffers at every call (torch.compile builds the graph
    once; with mode="reduce-overhead" on CUDA it is replayed as a CUDA graph).

    The first update of a state allocates it (transformers' `LinearAttentionLayer.
    update_recurrent_state`, which also marks it a static address for CUDA graphs), later ones
    copy into it. The token counts are tensors as well, `tokens` (positions absorbed) and
    `row_tokens` (real tokens absorbed per row), so no Python number changes from one step to
    the next (a changing int would be a guard, and every step a recompilation). With
    `is_compileable` True, `generate()` compiles the model's forward for the decode steps itself
    (on CUDA; elsewhere when `compile_config._compile_all_devices` is set)."""

    is_compileable = True
    tokens: Optional[torch.Tensor] = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.key_value_layers:
            raise ValueError(f"{type(self).__name__} (cache_implementation='static') holds fixed-size states "
                             f"only, but layers {list(self.key_value_layers)} are softmax attention "
                             "(layer_types 'full_attention' / 'sliding_attention'), whose keys and values "
                             "grow with the sequence; leave cache_implementation unset for a hybrid model")

    def set_states(self, layer_idx: int, states: Sequence[torch.Tensor]) -> None:
        if len(states) != self.num_states:
            raise ValueError(f"expected {self.num_states} states, got {len(states)}")
        layer = self.layers[layer_idx]
        for i, state in enumerate(states):
            held = layer.recurrent_states[i]
            layout = (state.shape, state.dtype, state.device)
            if held is None or (held.shape, held.dtype, held.device) != layout:
                layer.is_recurrent_states_initialized[i] = False   # first update or a new batch: allocate
                layer.dtype, layer.device = state.dtype, state.device
            layer.update_recurrent_state(state, i)
            if not layer.has_previous_state[i]:
                layer.has_previous_state[i] = True

    def row_positions(self, batch: int, device: torch.device) -> torch.Tensor:
        if self.tokens is None:
            self.tokens = _static(torch.zeros((), dtype=torch.long, device=device))
        return super().row_positions(batch, device)

    def advance(self, num_tokens: int, real: Optional[torch.Tensor] = None) -> None:
        """As `RecurrentCache.advance`, with the count of positions a tensor too. Call
        `row_positions` first."""
        self._count_rows(num_tokens, real)
        self.tokens.add_(num_tokens)

    def _new_counter(self, counter: torch.Tensor) -> torch.Tensor:
        return _static(counter)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.tokens is None else int(self.tokens)

    def reset(self) -> None:
        rows = self.row_tokens
        super().reset()
        self.row_tokens = rows   # zeroed in place: a captured graph keeps its address
        for counter in (self.tokens, self.row_tokens):
            if counter is not None:
                counter.zero_()

    def _set_rows(self, rows: torch.Tensor) -> None:
        if rows.shape == self.row_tokens.shape:
            self.row_tokens.copy_(rows)
        else:
            self.row_tokens = _static(rows)


def _static(t: torch.Tensor) -> torch.Tensor:
    """Mark a buffer that is only ever updated in place as a fixed address for CUDA graphs."""
    if not torch.compiler.is_compiling():
        torch._dynamo.mark_static_address(t)
    return t
