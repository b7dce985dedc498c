"""One decoding step of a native causal LM as a function of explicit states, for `torch.export`
and runtimes that take an exported program with fixed-shape inputs and outputs (ExecuTorch-style):

    (input_ids (B, 1), row_tokens (B,), *states) -> (logits (B, V), row_tokens, *states)

The states are the model's recurrent cache, flattened (momentum_transformer: S, z, m of eq. 12 per
layer; momentum_lstm: its stack's state fields), and `row_tokens` each row's count of real tokens,
from which the new token's position follows. Their sizes never change, so one exported program
with a dynamic batch runs every step; a prompt is fed either by an eager prefill
(`states_of(cache)` hands its states over) or token by token from `initial_states`. transformers'
`TorchExportableModuleForDecoderOnlyLM` builds a softmax `StaticCache` and does not apply to these
models; hybrids (`layer_types` with softmax layers) keep keys and values that grow with the context
and are refused."""
from typing import Tuple

import torch

from .recurrent_cache import RecurrentCache


class ExportableDecodeStep(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        cache_class = getattr(model, "cache_class", None)
        if not (isinstance(cache_class, type) and issubclass(cache_class, RecurrentCache)):
            raise ValueError(f"model: ExportableDecodeStep takes MomentumTransformerForCausalLM or "
                             f"MomentumLSTMForCausalLM, got {type(model).__name__}")
        probe = cache_class(model.config)
        if probe.key_value_layers:
            raise ValueError(f"model: layer_types has softmax layers ({list(probe.key_value_layers)}), whose "
                             "keys and values grow with the context: a fixed-shape step cannot hold them")
        self.model = model
        self.layers, self.per_layer = len(probe.layers), probe.num_states

    def forward(self, input_ids: torch.Tensor, row_tokens: torch.Tensor, *states: torch.Tensor):
        cache = self.model.cache_class(self.model.config)
        for layer in range(self.layers):
            cache.set_states(layer, states[layer * self.per_layer:(layer + 1) * self.per_layer])
        cache.row_tokens = row_tokens.clone()
        out = self.model(input_ids=input_ids, cache=cache, use_cache=True)
        return (out.logits[:, -1], *self._flat(cache))

    def states_of(self, cache: RecurrentCache) -> Tuple[torch.Tensor, ...]:
        """(row_tokens, *states) of a cache the model filled (an eager prefill), as copies."""
        if cache.get_states(0) is None:
            raise ValueError("cache: it holds no tokens yet (run the prompt through the model with it first)")
        return tuple(t.clone() for t in self._flat(cache))

    def _flat(self, cache: RecurrentCache) -> Tuple[torch.Tensor, ...]:
        """(row_tokens, *states) as the cache holds them. A cache that counts no rows (the LSTM's:
        it has no positions) gives its token count."""
        states = [t for layer in range(self.layers) for t in cache.get_states(layer)]
        rows = cache.row_tokens
        if rows is None:
            rows = torch.full(states[0].shape[:1], cache.seen_tokens, dtype=torch.long,
                              device=states[0].device)
        return (rows, *states)

    @torch.no_grad()
    def initial_states(self, batch: int) -> Tuple[torch.Tensor, ...]:
        """(row_tokens, *states) before any token: zeros, in the shapes, dtypes and device the
        model's cache holds (read off one eager step of a pad token, then zeroed)."""
        probe = self.model.cache_class(self.model.config)
        device = next(self.model.parameters()).device
        pad = self.model.config.pad_token_id or 0
        self.model(input_ids=torch.full((batch, 1), pad, device=device), cache=probe,
                   use_cache=True)
        return tuple(torch.zeros_like(t) for t in self.states_of(probe))
