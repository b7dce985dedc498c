"""The discretized mixture of logistics likelihood and its sampler (PixelCNN++ (Salimans et al.
2017), eq. 2-3), the output distribution of the image generation experiment (Momentum
Transformer, §4.2: a mixture of 10 logistics per pixel).

A pixel level v ∈ {0, …, 255} is mapped to x = v / 127.5 − 1 ∈ [−1, 1]; its bin is
[x − 1/255, x + 1/255]. Each of the K components puts on the bin the mass of a logistic(μ, s)
(PixelCNN++, eq. 2), with the edge bins reaching to −∞ (v = 0) and +∞ (v = 255) so the 256
masses sum to 1 (eq. 3). For C channels per pixel the channels share the component and
channel c's mean is shifted by the earlier channels' values (eq. 3's RGB coupling, as
openai/pixel-cnn's `discretized_mix_logistic_loss`):

    μ_c(x) = μ_c + Σ_{j<c} α_{c,j} · x_j,     α = tanh(network output).

Network output layout, last dimension of size K · (1 + 2C + C(C−1)/2), in blocks:
`[logits (K) | means (C·K) | log-scales (C·K) | couplings (C(C−1)/2 · K)]`, each block
channel-major; couplings ordered (1,0), (2,0), (2,1), … (for RGB: G←R, B←R, B←G). One channel
(MNIST, and CIFAR-10 read one sub-pixel per step) has no couplings: 3K outputs; three channels
per step: 10K.

Departure from openai/pixel-cnn: the log-mass of an interior bin is computed exactly in log
space, log(σ(a) − σ(b)) = log σ(a) + log σ(−b) + log(1 − e^{b−a}), instead of
log(σ(a) − σ(b)) with the mid-bin density fallback log pdf(x) + log(2/255) below a mass of 1e-5.
The identity is exact for every mass, finite and with finite gradients wherever σ(a) − σ(b)
underflows, so no approximation branch is needed.
"""
import math
from typing import NamedTuple, Optional

import torch
from torch.nn import functional as F

LEVELS = 256
HALF_BIN = 1.0 / (LEVELS - 1)     # half the width of a bin on the [−1, 1] scale
LOG_SCALE_MIN = -7.0              # openai/pixel-cnn's floor on log s


class LogisticMixture(NamedTuple):
    """Parameters of a K-component mixture over C channels, for every pixel of a batch."""
    logits: torch.Tensor      # (..., K) unnormalised mixture weights
    means: torch.Tensor       # (..., C, K) μ before the coupling
    log_scales: torch.Tensor  # (..., C, K) log s, floored at LOG_SCALE_MIN
    coeffs: torch.Tensor      # (..., C(C−1)/2, K) coupling α in (−1, 1)


def coupling_count(channels: int) -> int:
    """Number of coupling coefficients per component: one per pair j < c."""
    return channels * (channels - 1) // 2


def parameter_count(n_mix: int, channels: int) -> int:
    """Network outputs per pixel for K = n_mix components over `channels` channels."""
    for value, name in ((n_mix, "n_mix"), (channels, "channels")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return n_mix * (1 + 2 * channels + coupling_count(channels))


def mixture_size(features: int, channels: int) -> int:
    """K from the size of the network's last dimension."""
    per_component = parameter_count(1, channels)
    if features % per_component != 0 or features == 0:
        raise ValueError(f"output's last dimension must be a positive multiple of "
                         f"1 + 2·channels + channels·(channels−1)/2 = {per_component} for "
                         f"channels={channels}, got {features}")
    return features // per_component


def split_parameters(output: torch.Tensor, channels: int) -> LogisticMixture:
    """The mixture parameters from a network output (..., K · (1 + 2C + C(C−1)/2))."""
    if not isinstance(output, torch.Tensor) or not output.is_floating_point():
        raise ValueError(f"output must be a floating-point tensor, got {_describe(output)}")
    k = mixture_size(output.shape[-1], channels)
    if output.dtype in (torch.float16, torch.bfloat16):
        output = output.float()   # the likelihood is summed over thousands of pixels
    batch = output.shape[:-1]
    c, pairs = channels, coupling_count(channels)
    logits, means, log_scales, coeffs = output.split([k, c * k, c * k, pairs * k], dim=-1)
    return LogisticMixture(
        logits=logits,
        means=means.reshape(*batch, c, k),
        log_scales=log_scales.reshape(*batch, c, k).clamp(min=LOG_SCALE_MIN),
        coeffs=torch.tanh(coeffs.reshape(*batch, pairs, k)),
    )


def to_unit_interval(levels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Pixel levels 0..255 → bin centres in [−1, 1]."""
    return levels.to(dtype) / (0.5 * (LEVELS - 1)) - 1.0


def coupled_means(mixture: LogisticMixture, x: torch.Tensor) -> torch.Tensor:
    """μ_c + Σ_{j<c} α_{c,j} x_j for every channel and component (PixelCNN++, eq. 3's coupling);
    x: (..., C) values in [−1, 1] of the pixel's channels."""
    channels = mixture.means.shape[-2]
    rows = [mixture.means[..., 0, :]]
    pair = 0
    for c in range(1, channels):
        mean = mixture.means[..., c, :]
        for j in range(c):
            mean = mean + mixture.coeffs[..., pair, :] * x[..., j, None]
            pair += 1
        rows.append(mean)
    return torch.stack(rows, dim=-2)


def log_bin_mass(levels: torch.Tensor, means: torch.Tensor, log_scales: torch.Tensor) -> torch.Tensor:
    """log P(level) under logistic(μ, s) discretized to 256 bins with open edge bins
    (PixelCNN++, eq. 2 and its edge cases); all arguments broadcast together."""
    x = to_unit_interval(levels, means.dtype)
    inv_scale = torch.exp(-log_scales)
    upper = inv_scale * (x - means + HALF_BIN)      # a: standardized upper edge of the bin
    lower = inv_scale * (x - means - HALF_BIN)      # b: standardized lower edge
    log_cdf_upper = F.logsigmoid(upper)             # bin 0: log σ(a)
    log_survival_lower = F.logsigmoid(-lower)       # bin 255: log(1 − σ(b))
    # Interior: log(σ(a) − σ(b)) = log σ(a) + log σ(−b) + log(1 − e^{−(a−b)}), a − b = 2/(255 s).
    width = (2.0 * HALF_BIN * inv_scale).clamp(min=torch.finfo(means.dtype).tiny)
    interior = log_cdf_upper + log_survival_lower + torch.log(-torch.expm1(-width))
    return torch.where(levels == 0, log_cdf_upper,
                       torch.where(levels == LEVELS - 1, log_survival_lower, interior))


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"


def _check_levels(target, output: torch.Tensor, channels: int) -> torch.Tensor:
    """target as (..., C) integer levels matching output's leading dimensions."""
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.is_complex() \
            or target.dtype == torch.bool:
        raise ValueError(f"target must be an integer tensor of pixel levels 0..{LEVELS - 1}, "
                         f"got {_describe(target)}")
    batch = tuple(output.shape[:-1])
    if channels == 1 and tuple(target.shape) == batch:
        target = target.unsqueeze(-1)
    if tuple(target.shape) != batch + (channels,):
        allowed = f"{batch + (channels,)}" + (f" or {batch}" if channels == 1 else "")
        raise ValueError(f"target must have shape {allowed} for output of shape "
                         f"{tuple(output.shape)} and channels={channels}, got {tuple(target.shape)}")
    if target.numel() and bool(((target < 0) | (target > LEVELS - 1)).any()):
        raise ValueError(f"target must hold pixel levels in [0, {LEVELS - 1}], got values in "
                         f"[{int(target.min())}, {int(target.max())}]")
    return target.to(output.device)


def log_prob(output: torch.Tensor, target: torch.Tensor, channels: int) -> torch.Tensor:
    """log P(pixel) in nats for every pixel: output (..., K(1 + 2C + C(C−1)/2)), target (..., C)
    integer levels (or (...) when C = 1) → (...). PixelCNN++, eq. 2-3."""
    mixture = split_parameters(output, channels)
    levels = _check_levels(target, output, channels)
    x = to_unit_interval(levels, mixture.means.dtype)
    means = coupled_means(mixture, x)                                    # (..., C, K)
    per_channel = log_bin_mass(levels[..., None], means, mixture.log_scales)
    per_component = per_channel.sum(dim=-2) + torch.log_softmax(mixture.logits, dim=-1)
    return torch.logsumexp(per_component, dim=-1)


def nll_per_image(output: torch.Tensor, target: torch.Tensor, channels: int) -> torch.Tensor:
    """Negative log-likelihood in nats of each image (dimension 0 indexes images; every other
    leading dimension is a pixel position): (B,)."""
    log_p = log_prob(output, target, channels)
    if log_p.dim() == 0:
        raise ValueError(f"output must have a batch dimension, got shape {tuple(output.shape)}")
    return -log_p.reshape(log_p.shape[0], -1).sum(dim=1)


def bits_per_dim(nll: torch.Tensor, dims: int) -> torch.Tensor:
    """nll / (dims · ln 2): nats per image → bits per sub-pixel, dims = H·W·C."""
    if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
        raise ValueError(f"dims must be an integer >= 1 (sub-pixels per image), got {dims!r}")
    return nll / (dims * math.log(2.0))


def bin_log_probs(output: torch.Tensor) -> torch.Tensor:
    """log P(v) for all 256 levels v of a one-channel mixture: (..., 3K) → (..., 256)."""
    mixture = split_parameters(output, 1)
    levels = torch.arange(LEVELS, device=output.device)[:, None]        # (256, 1) against K
    per_component = log_bin_mass(levels, mixture.means[..., None, 0, :],
                                 mixture.log_scales[..., None, 0, :])
    return torch.logsumexp(per_component + torch.log_softmax(mixture.logits, -1)[..., None, :], -1)


def _uniform(shape, like: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """U(0, 1) kept off 0 and 1 so its logs stay finite."""
    u = torch.rand(shape, generator=generator, device=like.device, dtype=like.dtype)
    return u.clamp(min=torch.finfo(like.dtype).tiny, max=1.0 - torch.finfo(like.dtype).eps)


@torch.no_grad()
def sample(output: torch.Tensor, channels: int,
           generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One pixel per position from the mixture: (..., K(1 + 2C + C(C−1)/2)) → (..., C) int64
    levels. The component is drawn by Gumbel-max on the logits, each channel's logistic by
    inverse CDF μ + s·(log u − log(1 − u)) and rounded to its bin (the tails fall into the edge
    bins), so the draw has exactly the bin probabilities of `log_prob`; a later channel's mean
    is coupled to the earlier channels' rounded levels, as `log_prob` conditions on the data's."""
    mixture = split_parameters(output, channels)
    logits = mixture.logits
    gumbel = -torch.log(-torch.log(_uniform(logits.shape, logits, generator)))
    component = (logits + gumbel).argmax(dim=-1, keepdim=True)               # (..., 1)

    def pick(table: torch.Tensor) -> torch.Tensor:                           # (..., R, K) → (..., R)
        index = component[..., None, :].expand(*table.shape[:-1], 1)
        return table.gather(-1, index)[..., 0]

    means, log_scales, coeffs = pick(mixture.means), pick(mixture.log_scales), pick(mixture.coeffs)
    noise = torch.logit(_uniform(means.shape, means, generator))
    levels, units = [], []
    pair = 0
    for c in range(channels):
        mean = means[..., c]
        for j in range(c):
            mean = mean + coeffs[..., pair] * units[j]
            pair += 1
        value = mean + torch.exp(log_scales[..., c]) * noise[..., c]
        level = ((value + 1.0) * (0.5 * (LEVELS - 1))).round().clamp(0, LEVELS - 1)
        levels.append(level.long())
        units.append(to_unit_interval(level, means.dtype))
    return torch.stack(levels, dim=-1)
