"""The Long-Range Arena classifier of Momentum Transformer §4.3 (Table 4): token embedding plus
learned positions, 2 pre-LN `plugins.transformer.TransformerBlock`s (embedding 64, FFN hidden
128, 2 heads, non-causal attention: eq. 14 for momentum, elu+1 features for linear and
momentum), mean pooling over the real (non-padding) tokens, and a two-layer classifier head.
Retrieval is LRA's dual encoder: both passages through the same encoder, the head reads
[u, v, u·v, u − v].

§4.3 follows the training code of Xiong et al. (2021, Nyströmformer), whose LRA configuration
fixes what the paper does not say: dropout 0.1 (after the embeddings, after attention, in the
FFN), embeddings drawn from N(0, 0.02²), a final LayerNorm before pooling, a classifier head
Linear(d, 128) → ReLU → Linear(128, classes).

Models and their constants (Momentum Transformer, Table 1, rows ListOps / Text / Retrieval /
Image / Pathfinder):
- softmax, linear: no constants;
- momentum: β ("Momentum") and γ ("Stepsize") of eq. 14 per task;
- adaptive: the same β, γ and the adaptive momentum connection (eq. 18) with the task's
  "Stepsize in Momentum Connection" γ_r;
- momentum_connection: Table 1 has no LRA row for it (and Table 4 no result): the task's β, γ
  and the momentum connection (eq. 15) with the library's defaults μ_r = 0.3, γ_r = 0.9 (Table 1's
  translation row, `plugins.connection`).
"""
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Tuple

import torch
from torch import nn

from plugins.connection import DEFAULT_CONNECTION_MOMENTUM, DEFAULT_CONNECTION_STEP_SIZE
from plugins.packing import Segments
from plugins.transformer import BlockConfig, TransformerBlock, TransformerStack, masked_mean
from plugins.transformer.config import kinds_from_layer_types, stack_configs
from plugins.validation import check_int

MODELS = ("softmax", "linear", "momentum", "momentum_connection", "adaptive")
TASKS = ("listops", "text", "retrieval", "image", "pathfinder")


class TaskConstants(NamedTuple):
    """Table 1: β and γ of momentum attention, γ_r of the adaptive connection."""

    momentum: float
    step_size: float
    adaptive_step_size: float


TABLE1 = {"listops": TaskConstants(0.1, 0.6, 0.4), "text": TaskConstants(0.6, 2.0, 0.001),
          "retrieval": TaskConstants(0.6, 1.0, 0.5), "image": TaskConstants(0.9, 0.9, 0.001),
          "pathfinder": TaskConstants(0.3, 0.1, 0.8)}

# Table 4, test accuracy (%); momentum_connection has no LRA result in the paper.
PAPER_ACCURACY = {
    "softmax": {"listops": 37.10, "text": 64.17, "retrieval": 80.71, "image": 39.06, "pathfinder": 72.48},
    "linear": {"listops": 18.30, "text": 64.22, "retrieval": 81.37, "image": 38.29, "pathfinder": 71.17},
    "momentum": {"listops": 19.56, "text": 64.35, "retrieval": 81.95, "image": 39.40, "pathfinder": 73.12},
    "adaptive": {"listops": 20.16, "text": 64.45, "retrieval": 82.07, "image": 39.53, "pathfinder": 74.00},
}
PAPER_AVERAGE = {"softmax": 58.70, "linear": 54.67, "momentum": 55.68, "adaptive": 56.04}


@dataclass(frozen=True)
class ClassifierConfig:
    """One task's classifier. padding_id: the token id of padding (None: every token is real,
    as in the pixel tasks, where 0 is a pixel value); dual: inputs are (B, 2, T) pairs;
    layer_types: transformers' vocabulary per layer, "full_attention" for a softmax layer (None:
    every layer the model's own attention)."""

    vocab_size: int
    max_length: int
    n_classes: int
    padding_id: Optional[int] = 0
    dual: bool = False
    layers: int = 2
    d_model: int = 64
    heads: int = 2
    ffn_dim: int = 128
    mlp_dim: int = 128
    dropout: float = 0.1
    chunk_size: int = 64
    layer_types: Optional[Tuple[str, ...]] = None

    def __post_init__(self):
        for name in ("vocab_size", "max_length", "layers", "d_model", "heads", "ffn_dim", "mlp_dim",
                     "chunk_size"):
            check_int(getattr(self, name), name, low=1)
        check_int(self.n_classes, "n_classes", low=2)
        if self.padding_id is not None and not (isinstance(self.padding_id, int)
                                                and 0 <= self.padding_id < self.vocab_size):
            raise ValueError(f"padding_id must be None or an integer in [0, vocab_size = {self.vocab_size}), "
                             f"got {self.padding_id!r}")
        if self.layer_types is not None:
            kinds_from_layer_types(self.layer_types, "softmax", self.layers)
            object.__setattr__(self, "layer_types", tuple(self.layer_types))


def block_config(name: str, task: str, config: ClassifierConfig) -> BlockConfig:
    """The shared block of model `name` with Table 1's constants of `task` (module docstring)."""
    if name not in MODELS:
        raise ValueError(f"name must be one of {MODELS}, got {name!r}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    constants = TABLE1[task]
    attention = {"softmax": "softmax", "linear": "linear"}.get(name, "momentum")
    momentum = {}
    if attention == "momentum":
        momentum = dict(momentum=constants.momentum, step_size=constants.step_size)
    connection = {"momentum_connection": dict(connection="momentum",
                                              connection_momentum=DEFAULT_CONNECTION_MOMENTUM,
                                              connection_step_size=DEFAULT_CONNECTION_STEP_SIZE),
                  "adaptive": dict(connection="adaptive",
                                   connection_step_size=constants.adaptive_step_size)}.get(name, {})
    return BlockConfig(config.d_model, config.heads, ffn_dim=config.ffn_dim, attention=attention,
                       feature_map="elu", causal=False, chunk_size=config.chunk_size, norm="pre",
                       activation="gelu", attention_dropout=config.dropout, activation_dropout=config.dropout,
                       hidden_dropout=config.dropout, **momentum, **connection)


def layer_block_configs(name: str, task: str, config: ClassifierConfig) -> Tuple[BlockConfig, ...]:
    """One block config per layer: model `name`'s block, softmax in config.layer_types'
    "full_attention" layers."""
    return stack_configs(block_config(name, task, config), config.layers, config.layer_types)


def settings(name: str, task: str, config: ClassifierConfig) -> Dict:
    """What identifies a model, for caches and reports; layer_types only when given, so the keys
    of the runs before it stay."""
    block = block_config(name, task, config)
    fields = [k for k in ClassifierConfig.__dataclass_fields__ if k != "layer_types" or config.layer_types]
    return {"name": name, "task": task, "attention": block.attention, "momentum": block.momentum,
            "step_size": block.step_size, "connection": block.connection,
            "connection_momentum": block.connection_momentum if block.connection == "momentum" else None,
            "connection_step_size": block.connection_step_size if block.connection != "none" else None,
            **{k: getattr(config, k) for k in fields}}


class Encoder(nn.Module):
    """Tokens (B, N) → mean-pooled features (B, d_model)."""

    def __init__(self, name: str, task: str, config: ClassifierConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.positions = nn.Embedding(config.max_length, config.d_model)
        for table in (self.embed, self.positions):
            nn.init.normal_(table.weight, std=0.02)
        self.dropout = nn.Dropout(config.dropout)
        blocks = layer_block_configs(name, task, config)
        self.blocks = TransformerStack(TransformerBlock(block) for block in blocks)
        self.norm = nn.LayerNorm(config.d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.config.max_length:
            raise ValueError(f"tokens has {length} positions, more than max_length = "
                             f"{self.config.max_length}")
        real = None if self.config.padding_id is None else tokens != self.config.padding_id
        if real is not None and not bool(real.any(dim=1).all()):
            raise ValueError("tokens: every sequence needs at least one non-padding token")
        x = self.dropout(self.embed(tokens) + self.positions.weight[:length])
        segments = None if real is None else Segments.from_padding_mask(real, *tokens.shape)
        return masked_mean(self.blocks(x, segments=segments, final=self.norm).hidden, real)


class LRAClassifier(nn.Module):
    """Logits (B, n_classes) of tokens (B, N), or of pairs (B, 2, N) when config.dual."""

    def __init__(self, name: str, task: str, config: ClassifierConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(name, task, config)
        width = 4 * config.d_model if config.dual else config.d_model
        self.head = nn.Sequential(nn.Linear(width, config.mlp_dim), nn.ReLU(),
                                  nn.Linear(config.mlp_dim, config.n_classes))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"tokens must be int64 or int32 ids, got {tokens.dtype}")
        if not self.config.dual:
            if tokens.dim() != 2:
                raise ValueError(f"tokens must be (batch, length), got shape {tuple(tokens.shape)}")
            return self.head(self.encoder(tokens))
        if tokens.dim() != 3 or tokens.shape[1] != 2:
            raise ValueError("tokens of a dual encoder must be (batch, 2, length), got shape "
                             f"{tuple(tokens.shape)}")
        batch = tokens.shape[0]
        u, v = self.encoder(tokens.reshape(2 * batch, -1)).view(batch, 2, -1).unbind(1)
        return self.head(torch.cat([u, v, u * v, u - v], dim=-1))
