"""Pixel-by-pixel autoregressive image models of the Momentum Transformer's §4.2 (Table 2):
softmax, linear, momentum, momentum + momentum connection and adaptive momentum transformers.

Each model reads the image as a sequence of levels (data.py: raster order, one sub-pixel per
step), shifted right by one behind a learned start token (`data.START`), and predicts every
position's discretized mixture of logistics (logistic_mixture.py, PixelCNN++ eq. 2-3; K = 10
as in §4.2). Input embedding: a learned embedding of the 257 input values plus a learned
absolute position embedding per sub-pixel position.

Backbones (public transformers API only, `from_config` + `inputs_embeds` + a cache):
- linear / momentum / momentum_connection / adaptive: hf_momentum's native
  `MomentumTransformerModel` (pre-LN, GELU feed-forward with biases, LayerNorm). "linear" is the
  native model with β = 0, γ = 1 (eq. 13 reduces to the linear attention of eq. 7); the others
  use Table 1's "MNIST Generation" rows: β = 0.6, γ = 0.9; momentum connection (eq. 15)
  μ_r = 0.1, γ_r = 0.99; adaptive (eq. 18) γ_r = 0.99 with δ = 1e-3 (§3.3). Its learned
  position table is the model's own `embed_positions`.
- softmax: transformers' `LlamaModel` with SDPA at the same width, depth, heads and
  `intermediate_size` = 4·d. What differs from the native model: Llama's feed-forward is SwiGLU
  (three matrices, so 1.5× the feed-forward parameters at the same intermediate size), RMSNorm
  instead of LayerNorm, no biases in attention. Positions: Llama rotates q, k by RoPE; we feed
  `position_ids = 0` everywhere, a rotation by angle 0 (the identity), and add our own learned
  absolute position table to the inputs, so both families see positions the same way (an
  explicit all-ones attention_mask keeps transformers from reading constant position_ids as
  packed one-token documents).
  Generation runs with transformers' `DynamicCache` (a KV cache) or, `kv_cache=False`, re-reads
  the whole prefix at every step.

Sizes (§4.2, MNIST): 8 layers, 8 heads, d = 256 (32 per head), feed-forward 4·d, mixture of
10 logistics; trained with RAdam at 1e-4 (train.py). Dropout is not given by the paper; 0 here.
"""
from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import nn
from transformers import AutoModel, DynamicCache, LlamaConfig

import hf_momentum  # noqa: F401  (registers the native momentum_transformer family)
from hf_momentum import MomentumCache, MomentumTransformerConfig

from .data import START, teacher_forcing
from .logistic_mixture import LEVELS, bits_per_dim, nll_per_image, parameter_count
from .logistic_mixture import sample as sample_mixture

MODELS = ("softmax", "linear", "momentum", "momentum_connection", "adaptive")

# Table 1, "MNIST Generation": momentum β, step size γ of the attention (eq. 12-13), and the
# momentum / step size of the momentum connection (eq. 15; adaptive: eq. 18 gives the momentum).
MNIST_TABLE_1 = {
    "linear": dict(attention_momentum=0.0, attention_step_size=1.0),
    "momentum": dict(attention_momentum=0.6, attention_step_size=0.9),
    "momentum_connection": dict(attention_momentum=0.6, attention_step_size=0.9, connection="momentum",
                                connection_momentum=0.1, connection_step_size=0.99),
    "adaptive": dict(attention_momentum=0.6, attention_step_size=0.9, connection="adaptive",
                     connection_step_size=0.99),
}

# Table 2: test bits/dim on MNIST (28×28, 8 layers, full MNIST, 250 epochs).
PAPER_BITS_PER_DIM = {"softmax": 0.84, "linear": 0.85, "momentum": 0.84, "momentum_connection": 0.82,
                      "adaptive": 0.80}


@dataclass(frozen=True)
class ImageModelConfig:
    """Sizes of one image model; defaults are §4.2's MNIST model on 28×28 images."""

    sequence_length: int = 784
    layers: int = 8
    heads: int = 8
    d_model: int = 256
    ffn_multiplier: int = 4
    n_mix: int = 10
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("sequence_length", "layers", "heads", "d_model", "ffn_multiplier", "n_mix"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")


def backbone_config(name: str, config: ImageModelConfig):
    """The transformers config of model `name`'s backbone."""
    if name not in MODELS:
        raise ValueError(f"name must be one of {MODELS}, got {name!r}")
    sizes = dict(hidden_size=config.d_model, num_hidden_layers=config.layers,
                 num_attention_heads=config.heads, intermediate_size=config.ffn_multiplier * config.d_model,
                 max_position_embeddings=config.sequence_length, vocab_size=1,
                 attention_dropout=config.dropout)
    if name == "softmax":
        return LlamaConfig(**sizes, num_key_value_heads=config.heads, bos_token_id=None, eos_token_id=None)
    return MomentumTransformerConfig(**sizes, **MNIST_TABLE_1[name], hidden_dropout=config.dropout,
                                     embedding_dropout=config.dropout)


class PixelTransformer(nn.Module):
    """Autoregressive model of (N, T) pixel-level sequences with a 3K-parameter mixture per step."""

    def __init__(self, name: str, config: ImageModelConfig = ImageModelConfig()):
        super().__init__()
        if not isinstance(config, ImageModelConfig):
            raise ValueError(f"config must be an ImageModelConfig, got {type(config).__name__}")
        self.name, self.config = name, config
        hf_config = backbone_config(name, config)
        implementation = "sdpa" if name == "softmax" else None
        self.backbone = AutoModel.from_config(hf_config, attn_implementation=implementation)
        self.backbone.get_input_embeddings().requires_grad_(False)   # inputs_embeds only
        self.embed_pixels = nn.Embedding(LEVELS + 1, config.d_model)
        self.embed_positions = (nn.Embedding(config.sequence_length, config.d_model)
                                if name == "softmax" else None)
        self.head = nn.Linear(config.d_model, parameter_count(config.n_mix, 1))
        nn.init.normal_(self.embed_pixels.weight, std=0.02)

    @property
    def is_softmax(self) -> bool:
        return self.embed_positions is not None

    def _embed(self, inputs: torch.Tensor, offset: int) -> torch.Tensor:
        x = self.embed_pixels(inputs)
        if self.is_softmax:
            positions = torch.arange(offset, offset + inputs.shape[1], device=inputs.device)
            x = x + self.embed_positions(positions)
        return x

    def _run(self, inputs: torch.Tensor, cache, offset: int):
        embeds = self._embed(inputs, offset)
        kwargs = dict(inputs_embeds=embeds, past_key_values=cache, use_cache=cache is not None)
        if self.is_softmax:
            kwargs["position_ids"] = torch.zeros_like(inputs)
            if cache is None:   # else transformers reads position_ids that do not count up as packed rows
                kwargs["attention_mask"] = torch.ones_like(inputs)
        out = self.backbone(**kwargs)
        return self.head(out.last_hidden_state), out.past_key_values

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
        return self._run(inputs, None, 0)[0]

    def log_likelihood(self, images: torch.Tensor) -> torch.Tensor:
        """Bits/dim of each image: images (N, T) levels 0..255 (data.py's sequences) → (N,)."""
        self._check_inputs(images, "images", LEVELS - 1)
        inputs, targets = teacher_forcing(images.to(self.head.weight.device))
        return bits_per_dim(nll_per_image(self(inputs), targets, 1), images.shape[1])

    def new_cache(self, kv_cache: bool = True):
        """An empty generation cache: the recurrent MomentumCache (state of eq. 12 per layer, its
        size independent of the prefix) or, for softmax, a DynamicCache (None: no cache)."""
        if not self.is_softmax:
            return MomentumCache(self.backbone.config)
        return DynamicCache(config=self.backbone.config) if kv_cache else None

    def step(self, inputs: torch.Tensor, cache, offset: int):
        """Mixture parameters (N, 3K) of position `offset` given its input (N,) and a cache holding
        positions < offset; returns (parameters, cache). Without a cache (softmax, kv_cache=False)
        `inputs` must be the whole prefix (N, offset + 1)."""
        if cache is None:
            params, _ = self._run(inputs, None, 0)
            return params[:, -1], None
        params, cache = self._run(inputs[:, None], cache, offset)
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
        if not isinstance(kv_cache, bool):
            raise ValueError(f"kv_cache must be a bool, got {kv_cache!r}")
        device = self.head.weight.device
        cache = self.new_cache(kv_cache)
        tokens = torch.full((n, 1), START, dtype=torch.long, device=device)
        for t in range(steps):
            current = tokens if cache is None else tokens[:, -1]
            params, cache = self.step(current, cache, t)
            pixel = sample_mixture(params, 1, generator)[:, 0]
            tokens = torch.cat([tokens, pixel[:, None]], dim=1)
        return tokens[:, 1:]


def settings(name: str, config: ImageModelConfig) -> dict:
    """What a run records about a model (its sizes and the backbone's momentum constants)."""
    return {"model": name, **asdict(config), **MNIST_TABLE_1.get(name, {"attention": "softmax (sdpa)"})}
