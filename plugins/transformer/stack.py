"""A stack of transformer blocks (Momentum Transformer, Section 3): one loop that carries the
connection state of eq. 15 / 18 from block to block, each block's attention state (eq. 12,
or a softmax KV cache) when generating, and the hidden states after each block. The HF model
and the recipes run their blocks through it instead of writing the loop again. Blocks may
differ in attention kind (`plugins.transformer.config.layer_configs`): a stack with softmax
blocks builds their masks over the batch's Segments once per forward (`SoftmaxMasks`) and
hands them to every block.

A `torch.nn.ModuleList`, so the blocks keep the state-dict keys of the list they replace
("layers.0.…", "blocks.0.…")."""
from typing import Callable, List, NamedTuple, Optional, Tuple

import torch
from torch import nn

from ..packing import Segments
from .block import BlockOutput
from .softmax_mask import SoftmaxMasks


class StackOutput(NamedTuple):
    """The last hidden state; the input then every block's output (None unless asked for; the
    last one after `final`); the attention states (None unless recurrent)."""

    hidden: torch.Tensor
    hidden_states: Optional[Tuple[torch.Tensor, ...]]
    attention_states: Optional[list]


class TransformerStack(nn.ModuleList):
    """Blocks called in order as `block(x, connection_state, segments=…, attention_state=…,
    recurrent=…)` (`TransformerBlock.forward`), the connection state starting at None, the one
    `plugins.packing.Segments` of the batch (built once by the caller) handed to every block,
    and, when some block is softmax attention, `softmax_masks=` the forward's one `SoftmaxMasks`.
    A subclass whose blocks take other arguments overrides `call_block`."""

    def forward(self, x: torch.Tensor, *, segments: Optional[Segments] = None,
                attention_states: Optional[List] = None, final: Optional[Callable] = None,
                output_hidden_states: bool = False, **block_kwargs) -> StackOutput:
        """x (B, N, d_model). attention_states: one state per block (None entries start fresh),
        continued recurrently and replaced in the list as soon as each block has run, so an old
        state is freed before the next block runs; None: no recurrence. final: applied to the
        last block's output (e.g. a final layer norm). block_kwargs go to `call_block`."""
        recurrent = attention_states is not None
        if not recurrent and self.has_softmax_blocks():
            block_kwargs["softmax_masks"] = SoftmaxMasks(segments, x.shape[1], x.device)
        hidden_states = [x] if output_hidden_states else None
        connection = None
        last = len(self) - 1
        for i, block in enumerate(self):
            x, connection, state = self.call_block(
                block, x, connection, segments=segments,
                attention_state=attention_states[i] if recurrent else None, recurrent=recurrent,
                **block_kwargs)
            if recurrent:
                attention_states[i] = state
            if final is not None and i == last:
                x = final(x)
            if hidden_states is not None:
                hidden_states.append(x)
        return StackOutput(x, None if hidden_states is None else tuple(hidden_states), attention_states)

    def has_softmax_blocks(self) -> bool:
        return any(getattr(getattr(block, "config", None), "attention", None) == "softmax" for block in self)

    def call_block(self, block: nn.Module, x: torch.Tensor, connection_state, **kwargs) -> BlockOutput:
        return block(x, connection_state, **kwargs)
