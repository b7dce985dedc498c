"""Small (CPU, minutes) and full (Section 4.1) copy-task configurations."""
from dataclasses import dataclass, replace
from typing import Optional, Tuple

from plugins.transformer.config import kinds_from_layer_types


@dataclass(frozen=True)
class CopyConfig:
    max_length: int      # longest sequence: w 0 w and 0s
    n_symbols: int       # |alphabet|, symbols 1..n
    layers: int
    heads: int
    head_dim: int        # d_model = heads * head_dim
    dropout: float
    batch_size: int
    steps: int           # optimiser iterations
    lr: float
    lr_drop_step: int    # lr / 10 from this iteration on
    eval_every: int      # iterations per "epoch" of Figure 1
    eval_batches: int    # fixed test set = eval_batches * batch_size sequences
    # transformers' layer_types, one per layer (None: every layer the model's own attention)
    layer_types: Optional[Tuple[str, ...]] = None

    def __post_init__(self):
        if self.layer_types is not None:
            kinds_from_layer_types(self.layer_types, "softmax", self.layers, name="layer_types")
            object.__setattr__(self, "layer_types", tuple(self.layer_types))


# Section 4.1: length 128, 10 symbols, 4 layers, 8 heads, D = 32 (per head, d_model 256, as in
# the linear-transformer copy task it follows), RAdam, batch 64, lr 1e-3 → 1e-4 after 3000
# iterations; 100-iteration epochs, 100 epochs (the paper plots epochs but gives no count).
FULL = CopyConfig(max_length=128, n_symbols=10, layers=4, heads=8, head_dim=32, dropout=0.1,
                  batch_size=64, steps=10_000, lr=1e-3, lr_drop_step=3000, eval_every=100,
                  eval_batches=20)

SMALL = CopyConfig(max_length=32, n_symbols=10, layers=2, heads=4, head_dim=16, dropout=0.0,
                   batch_size=32, steps=600, lr=1e-3, lr_drop_step=450, eval_every=50,
                   eval_batches=8)


def configure(full: bool, **overrides) -> CopyConfig:
    base = FULL if full else SMALL
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
