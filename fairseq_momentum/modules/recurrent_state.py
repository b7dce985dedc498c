"""`plugins.rnn.RecurrentState` <-> fairseq's incremental-state buffers (flat dicts of
tensors), with beam reordering."""
from typing import Dict, List, Optional

from torch import Tensor

from plugins.rnn import RecurrentState


def states_to_buffer(states: List[RecurrentState]) -> Dict[str, Optional[Tensor]]:
    """One entry per field and layer: h0, c0, v0, m0, step0, h1, ... (None fields skipped)."""
    buffer = {}
    for k, state in enumerate(states):
        for name, value in zip(RecurrentState._fields, state):
            if value is not None:
                buffer[f"{name}{k}"] = value
    return buffer


def buffer_to_states(buffer: Dict[str, Optional[Tensor]], num_layers: int) -> List[RecurrentState]:
    return [RecurrentState(*(buffer.get(f"{name}{k}") for name in RecurrentState._fields))
            for k in range(num_layers)]


def reorder_buffer(buffer: Dict[str, Optional[Tensor]], new_order: Tensor) -> Dict[str, Optional[Tensor]]:
    """Select batch rows: dim 1 of h, c, v, m (layers, batch, N); dim 0 of step (batch,)."""
    return {name: value.index_select(0 if name.startswith("step") else 1,
                                     new_order.to(value.device))
            for name, value in buffer.items()}
