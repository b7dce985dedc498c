"""Generation cache holding O(1) recurrent states per layer, built on transformers'
`cache_utils.LinearAttentionLayer` (one layer object per model layer, several recurrent
states in it, `reorder_cache` for beam search).

Two pitfalls of using those layers alone are handled here: an all-linear cache cannot report
its sequence length (`DynamicCache.get_seq_length()` raises), and `update_recurrent_state`
does not mark a state as present. `RecurrentCache` counts the tokens it has absorbed and
marks states itself. It is not compileable (its states are replaced, not copied into static
buffers, when the batch is re-indexed).
"""
from typing import Optional, Sequence, Tuple

import torch
from transformers.cache_utils import Cache, LinearAttentionLayer


class RecurrentCache(Cache):
    """`num_states` tensors per layer (e.g. S, z, m of eq. 12, or an LSTM's h, c)."""

    is_compileable = False
    is_croppable = False

    def __init__(self, num_layers: int, num_states: int):
        super().__init__(layers=[LinearAttentionLayer(number_of_states=num_states)
                                 for _ in range(num_layers)])
        self.num_states = num_states
        self.seen_tokens = 0

    def get_states(self, layer_idx: int) -> Optional[Tuple[torch.Tensor, ...]]:
        """The layer's states, or None before its first update."""
        layer = self.layers[layer_idx]
        if not all(layer.has_previous_state.values()):
            return None
        return tuple(layer.recurrent_states[i] for i in range(self.num_states))

    def set_states(self, layer_idx: int, states: Sequence[torch.Tensor]) -> None:
        if len(states) != self.num_states:
            raise ValueError(f"expected {self.num_states} states, got {len(states)}")
        layer = self.layers[layer_idx]
        for i, state in enumerate(states):
            layer.recurrent_states[i] = state
            layer.is_recurrent_states_initialized[i] = True
            layer.has_previous_state[i] = True
        layer.dtype, layer.device = states[0].dtype, states[0].device

    def advance(self, num_tokens: int) -> None:
        """Record that `num_tokens` more positions were absorbed by every layer."""
        self.seen_tokens += num_tokens

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> Tuple[int, int]:
        return self.seen_tokens + query_length, 0

    def get_max_length(self, layer_idx: Optional[int] = None) -> int:
        return -1

    @property
    def batch_size(self) -> int:
        states = self.get_states(0) if self.layers else None
        return -1 if states is None else states[0].shape[0]

    def reset(self) -> None:
        super().reset()
        self.seen_tokens = 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError("a recurrent state cannot be cropped: it keeps no per-token history")

    def _map(self, fn) -> None:
        for idx in range(len(self.layers)):
            states = self.get_states(idx)
            if states is not None:
                self.set_states(idx, [fn(t) for t in states])
