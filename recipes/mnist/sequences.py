"""Images → pixel sequences for sequential MNIST (row by row) and PMNIST (one fixed
permutation of the pixel order, applied to train and test alike; MomentumRNN, §3.1)."""
import torch
from torch.nn import functional as F

PERMUTATION_SEED = 92916  # one permutation for every run, model and seed


def fixed_permutation(length: int, seed: int = PERMUTATION_SEED) -> torch.Tensor:
    return torch.randperm(length, generator=torch.Generator().manual_seed(seed))


def downsample(images: torch.Tensor, side: int) -> torch.Tensor:
    """(N, 28, 28) uint8 → (N, side, side) float in [0, 1] by area averaging (side = 28: no-op
    besides scaling). Smaller sides give shorter sequences for CPU-sized runs."""
    x = images.float().div(255.0)
    if side == x.shape[-1]:
        return x
    return F.interpolate(x[:, None], size=(side, side), mode="area")[:, 0]


def pixel_sequences(images: torch.Tensor, side: int, permuted: bool) -> torch.Tensor:
    """(N, T = side², 1) pixel intensities in row-major order, or in the fixed permuted order."""
    x = downsample(images, side).flatten(1)
    if permuted:
        x = x[:, fixed_permutation(x.shape[1])]
    return x.unsqueeze(-1).contiguous()
