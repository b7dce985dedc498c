"""Feature maps φ for linear attention (Momentum Transformer, eq. 5)."""
from typing import Callable, Union

import torch
import torch.nn.functional as F

FeatureMap = Union[str, Callable[[torch.Tensor], torch.Tensor]]


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1, the map of Katharopoulos et al. used by the paper: positive, so
    every denominator φ(q)ᵀΣφ(k) is > 0."""
    return F.elu(x) + 1.0


def identity(x: torch.Tensor) -> torch.Tensor:
    """For inputs that are already feature-mapped."""
    return x


FEATURE_MAPS = {"elu": elu_plus_one, "relu": F.relu, "identity": identity}


def resolve_feature_map(feature_map: FeatureMap) -> Callable[[torch.Tensor], torch.Tensor]:
    if callable(feature_map):
        return feature_map
    if isinstance(feature_map, str) and feature_map in FEATURE_MAPS:
        return FEATURE_MAPS[feature_map]
    raise ValueError(
        f"feature_map must be one of {sorted(FEATURE_MAPS)} or a callable, got {feature_map!r}"
    )
