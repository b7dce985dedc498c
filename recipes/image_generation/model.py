"""Pixel-by-pixel autoregressive image models of the Momentum Transformer's §4.2 (Table 2):
softmax, linear, momentum, momentum + momentum connection and adaptive momentum transformers.

Each model reads the image as a sequence of levels (data.py: raster order, one sub-pixel per
step), shifted right by one behind a learned start token (`data.START`), and predicts every
position's discretized mixture of logistics (logistic_mixture.py, PixelCNN++ eq. 2-3; K = 10
as in §4.2).

All five models are one architecture that differs only in the attention and the residual
around it (§4's footnote 2 builds the momentum models on the linear transformer's architecture;
softmax is put on it too, so that Table 2 compares attention alone): a learned embedding of
the 257 input values plus a learned absolute position embedding, a stack of the shared
`plugins.transformer.TransformerBlock` (pre-LN, GELU feed-forward of 4·d, LayerNorm, biases),
a final LayerNorm and a linear mixture head. Attention: softmax (eq. 1), linear (eq. 7) or
causal momentum attention (eq. 13) with Table 1's "MNIST Generation" constants β = 0.6,
γ = 0.9; the momentum connection (eq. 15) μ_r = 0.1, γ_r = 0.99; adaptive (eq. 18) γ_r = 0.99
with δ = 1e-3 (§3.3).

Generation carries one attention state per layer: the momentum models' `MomentumAttentionState`
(S, z, m of eq. 12, its size independent of the position), softmax a `KeyValueCache` of the
prefix's keys and values or (`kv_cache=False`) nothing, re-reading the whole prefix at every step.

Sizes (§4.2, MNIST): 8 layers, 8 heads, d = 256 (32 per head), feed-forward 4·d, mixture of
10 logistics; trained with RAdam at 1e-4 (train.py). Dropout is not given by the paper; 0 here.
"""
from dataclasses import asdict, dataclass
from typing import List, Optional, Tuple

import torch
from torch import nn

from plugins.transformer import BlockConfig, TransformerBlock, TransformerStack
from plugins.transformer.config import kinds_from_layer_types, stack_configs
from plugins.validation import check_int

from .data import START, teacher_forcing
from .logistic_mixture import LEVELS, bits_per_dim, nll_per_image, parameter_count
from .logistic_mixture import sample as sample_mixture

MODELS = ("softmax", "linear", "momentum", "momentum_connection", "adaptive")

# Table 1, "MNIST Generation": momentum β, step size γ of the attention (eq. 12-13), and the
# momentum / step size of the momentum connection (eq. 15; adaptive: eq. 18 gives the momentum).
MNIST_TABLE_1 = {
    "softmax": dict(attention="softmax"),
    "linear": dict(attention="linear"),
    "momentum": dict(attention="momentum", momentum=0.6, step_size=0.9),
    "momentum_connection": dict(attention="momentum", momentum=0.6, step_size=0.9, connection="momentum",
                                connection_momentum=0.1, connection_step_size=0.99),
    "adaptive": dict(attention="momentum", momentum=0.6, step_size=0.9, connection="adaptive",
                     connection_step_size=0.99),
}

# Table 2: test bits/dim on MNIST (28×28, 8 layers, full MNIST, 250 epochs).
PAPER_BITS_PER_DIM = {"softmax": 0.84, "linear": 0.85, "momentum": 0.84, "momentum_connection": 0.82,
                      "adaptive": 0.80}
# Standard deviation of the normal initialisation of embeddings and block weights (as GPT-2 and
# transformers' models): a unit-variance position table would drown the pixel embedding.
INIT_STD = 0.02


@dataclass(frozen=True)
class ImageModelConfig:
    """Sizes of one image model; defaults are §4.2's MNIST model on 28×28 images. layer_types:
    transformers' vocabulary per layer, "full_attention" for a softmax layer (None: every layer
    the model's own attention)."""

    sequence_length: int = 784
    layers: int = 8
    heads: int = 8
    d_model: int = 256
    ffn_multiplier: int = 4
    n_mix: int = 10
    dropout: float = 0.0
    layer_types: Optional[Tuple[str, ...]] = None

    def __post_init__(self):
        for name in ("sequence_length", "layers", "heads", "d_model", "ffn_multiplier", "n_mix"):
            check_int(getattr(self, name), name, low=1)
        if self.layer_types is not None:
            kinds_from_layer_types(self.layer_types, "softmax", self.layers)
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")


def block_config(name: str, config: ImageModelConfig) -> BlockConfig:
    """The shared block of model `name`: the same for all five up to attention and connection."""
    if name not in MODELS:
        raise ValueError(f"name must be one of {MODELS}, got {name!r}")
    return BlockConfig(d_model=config.d_model, heads=config.heads,
                       ffn_dim=config.ffn_multiplier * config.d_model, norm="pre", activation="gelu",
                       attention_dropout=config.dropout, hidden_dropout=config.dropout,
                       **MNIST_TABLE_1[name])


def layer_block_configs(name: str, config: ImageModelConfig) -> Tuple[BlockConfig, ...]:
    """One block config per layer: model `name`'s block, softmax in config.layer_types'
    "full_attention" layers."""
    return stack_configs(block_config(name, config), config.layers, config.layer_types)


class PixelTransformer(nn.Module):
    """Autoregressive model of (N, T) pixel-level sequences with a 3K-parameter mixture per step."""

    def __init__(self, name: str, config: ImageModelConfig = ImageModelConfig()):
        super().__init__()
        if not isinstance(config, ImageModelConfig):
            raise ValueError(f"config must be an ImageModelConfig, got {type(config).__name__}")
        blocks = layer_block_configs(name, config)
        self.name, self.config = name, config
        self.embed_pixels = nn.Embedding(LEVELS + 1, config.d_model)
        self.embed_positions = nn.Embedding(config.sequence_length, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = TransformerStack(TransformerBlock(block) for block in blocks)
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, parameter_count(config.n_mix, 1))
        for module in (self.embed_pixels, self.embed_positions, self.blocks):
            module.apply(_normal_init)

    @property
    def is_softmax(self) -> bool:
        return self.name == "softmax"

    def _run(self, inputs: torch.Tensor, offset: int, states: Optional[List]):
        """Mixture parameters of positions offset.. given their inputs; `states` (one attention
        state per layer) are continued when given, in place: a layer's old KV cache is freed as
        soon as its successor exists, not after the last layer. Returns (parameters, states)."""
        positions = torch.arange(offset, offset + inputs.shape[1], device=inputs.device)
        x = self.dropout(self.embed_pixels(inputs) + self.embed_positions(positions))
        return self.head(self.blocks(x, attention_states=states, final=self.norm).hidden), states

    def _check_inputs(self, inputs: torch.Tensor, name: str, limit: int) -> None:
        if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2 or inputs.is_floating_point():
            found = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
            raise ValueError(f"{name} must be an integer tensor (N, T), got {found}")
        if inputs.shape[1] > self.config.sequence_length:
            raise ValueError(f"{name} has {inputs.shape[1]} positions, more than sequence_length "
                             f"{self.config.sequence_length}")
        if inputs.numel() and bool(((inputs < 0) | (inputs > limit)).any()):
            raise ValueError(f"{name} must hold values in [0, {limit}]")

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Teacher-forced mixture parameters: inputs (N, T) in 0..256 (START first) → (N, T, 3K);
        position t sees inputs ≤ t only (causal)."""
        self._check_inputs(inputs, "inputs", START)
        return self._run(inputs, 0, None)[0]

    def log_likelihood(self, images: torch.Tensor) -> torch.Tensor:
        """Bits/dim of each image: images (N, T) levels 0..255 (data.py's sequences) → (N,)."""
        self._check_inputs(images, "images", LEVELS - 1)
        inputs, targets = teacher_forcing(images.to(self.head.weight.device))
        return bits_per_dim(nll_per_image(self(inputs), targets, 1), images.shape[1])

    def new_cache(self, kv_cache: bool = True) -> Optional[List]:
        """An empty generation cache: one attention state per layer (None before the first step;
        then eq. 12's MomentumAttentionState of a size independent of the prefix, or softmax's
        KeyValueCache). None for softmax with kv_cache=False: each step re-reads the prefix."""
        if not isinstance(kv_cache, bool):
            raise ValueError(f"kv_cache must be a bool, got {kv_cache!r}")
        return None if self.is_softmax and not kv_cache else [None] * len(self.blocks)

    def step(self, inputs: torch.Tensor, cache: Optional[List], offset: int):
        """Mixture parameters (N, 3K) of position `offset` given its input (N,) and a cache holding
        positions < offset; returns (parameters, cache), the cache updated in place. Without a
        cache (softmax, kv_cache=False) `inputs` must be the whole prefix (N, offset + 1)."""
        length = self.config.sequence_length
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < length:
            raise ValueError(f"offset must be an integer in [0, {length - 1}], got {offset!r}")
        if cache is None:
            if inputs.dim() != 2 or inputs.shape[1] != offset + 1:
                raise ValueError(f"inputs must be the whole prefix (N, {offset + 1}) without a cache, "
                                 f"got {tuple(inputs.shape)}")
            return self._run(inputs, 0, None)[0][:, -1], None
        if inputs.dim() != 1:
            raise ValueError(f"inputs must be one level per image (N,) with a cache, got "
                             f"{tuple(inputs.shape)}")
        params, cache = self._run(inputs[:, None], offset, cache)
        return params[:, 0], cache

    @torch.no_grad()
    def sample(self, n: int, steps: Optional[int] = None, generator: Optional[torch.Generator] = None,
               kv_cache: bool = True) -> torch.Tensor:
        """n sequences of `steps` levels (default sequence_length), generated one pixel per step
        for the whole batch: (n, steps) int64. The momentum models carry their recurrent state,
        softmax a KV cache or (kv_cache=False) the prefix it re-reads at every step."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        length = self.config.sequence_length
        steps = length if steps is None else steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= length:
            raise ValueError(f"steps must be an integer in [1, {length}], got {steps!r}")
        cache = self.new_cache(kv_cache)
        tokens = torch.full((n, 1), START, dtype=torch.long, device=self.head.weight.device)
        for t in range(steps):
            params, cache = self.step(tokens if cache is None else tokens[:, -1], cache, t)
            pixel = sample_mixture(params, 1, generator)[:, 0]
            tokens = torch.cat([tokens, pixel[:, None]], dim=1)
        return tokens[:, 1:]


def _normal_init(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=INIT_STD)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def settings(name: str, config: ImageModelConfig) -> dict:
    """What a run records about a model (and its cache key): its sizes and its block's
    hyperparameters; layer_types only when given, so the keys of the runs before it stay."""
    sizes = {k: v for k, v in asdict(config).items() if k != "layer_types" or v is not None}
    return {"model": name, **sizes, "block": asdict(block_config(name, config)), "init_std": INIT_STD}
