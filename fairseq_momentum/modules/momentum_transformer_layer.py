"""Transformer layers with momentum attention and the momentum connection, as subclasses
of fairseq's layers (Momentum Transformer, Section 3; docs/equations.md, D3-D4).

Only the attention modules and the self-attention residual change; layer norms, the
feed-forward block, dropout and pre-/post-LN placement are fairseq's. The momentum
connection (eq. 15, adaptive eq. 18) carries a velocity from one layer to the next within
a forward pass: the layers of one encoder or decoder share a `ConnectionCarrier`, which
the encoder or decoder clears at the start and end of every forward pass.

`--layer-types` makes some layers softmax attention (fairseq's own MultiheadAttention, with
its causal mask, key padding mask and incremental key/value cache) among the momentum layers;
their residual is still the connection, as in the HF hybrid.
"""
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from plugins.connection import CONNECTION_READS, build_connection

from ..options import layer_kinds
from .momentum_attention import MomentumMultiheadAttention

PRINT_ALIGNMENT_NEEDS_SOFTMAX = (
    "--print-alignment needs --cross-attention softmax: linear/momentum cross-attention has no "
    "attention matrix, so there are no alignment weights to print")


class ConnectionCarrier:
    """The `plugins.connection.ConnectionState` passed from layer ℓ to layer ℓ + 1."""

    def __init__(self):
        self.state = None


def shared_carrier(owner):
    """The carrier of an encoder or decoder, created on first use (while it builds layers)."""
    if "_connection_carrier" not in owner.__dict__:
        owner.__dict__["_connection_carrier"] = ConnectionCarrier()
    return owner.__dict__["_connection_carrier"]


def next_layer_kind(owner, cfg, layers: int, stack: str) -> str:
    """The --layer-types entry of the next layer `owner` (an encoder or decoder) builds: fairseq
    builds its layers in order through build_*_layer, which gets no index."""
    built = owner.__dict__.setdefault("_layers_built", 0)
    owner.__dict__["_layers_built"] = built + 1
    return layer_kinds(cfg, layers, stack)[built % layers]


def build_momentum_attention(embed_dim, num_heads, cfg, *, causal, cross=False):
    """Self-attention (eq. 13 causal / eq. 14), or cross-attention per --cross-attention."""
    linear = cross and cfg.cross_attention == "linear"
    return MomentumMultiheadAttention(
        embed_dim, num_heads, causal=causal,
        momentum=0.0 if linear else cfg.attention_momentum,
        step_size=1.0 if linear else cfg.attention_step_size,
        feature_map=cfg.feature_map, chunk_size=cfg.attention_chunk_size,
        kdim=cfg.encoder.embed_dim if cross else None, vdim=cfg.encoder.embed_dim if cross else None,
        self_attention=not cross)


class _MomentumResidual:
    """Replaces the first residual of a layer (the self-attention one) by the connection."""

    def _init_connection(self, cfg, carrier):
        """The residual of eq. 15 chosen by --connection (None: the plain residual), built by
        the builder the HF integration uses too, from the --connection-* values it reads (the
        others are unset, options.check_connection_args)."""
        reads = CONNECTION_READS.get(cfg.connection, ())
        self.connection = build_connection(cfg.connection,
                                           **{name: getattr(cfg, f"connection_{name}") for name in reads})
        self._carrier = carrier
        self._attention_residual_pending = False

    def forward(self, *args, **kwargs):
        self._attention_residual_pending = self.connection is not None
        return super().forward(*args, **kwargs)

    def residual_connection(self, x, residual):
        if not self._attention_residual_pending:
            return residual + x
        self._attention_residual_pending = False
        out, self._carrier.state = self.connection(residual, x, self._carrier.state)
        return out


class MomentumTransformerEncoderLayer(_MomentumResidual, TransformerEncoderLayerBase):
    """fairseq encoder layer with non-causal momentum self-attention (eq. 14)."""

    def __init__(self, cfg, carrier, return_fc=False, *, kind="linear_attention"):
        self.kind = kind
        super().__init__(cfg, return_fc=return_fc)
        self._init_connection(cfg, carrier)

    def build_self_attention(self, embed_dim, cfg):
        if self.kind == "full_attention":
            return super().build_self_attention(embed_dim, cfg)
        return build_momentum_attention(embed_dim, cfg.encoder.attention_heads, cfg, causal=False)


class MomentumTransformerDecoderLayer(_MomentumResidual, TransformerDecoderLayerBase):
    """fairseq decoder layer with causal momentum self-attention (eq. 12/13), or non-causal
    (eq. 14) for non-autoregressive decoders; cross-attention per --cross-attention."""

    def __init__(self, cfg, carrier, *, causal=True, no_encoder_attn=False, kind="linear_attention"):
        self.causal, self.kind = causal, kind
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        self._init_connection(cfg, carrier)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if add_bias_kv or add_zero_attn or cfg.cross_self_attention:
            raise ValueError("momentum attention does not support --cross-self-attention, "
                             "add_bias_kv or add_zero_attn")
        if self.kind == "full_attention":
            return super().build_self_attention(embed_dim, cfg)
        return build_momentum_attention(embed_dim, cfg.decoder.attention_heads, cfg,
                                        causal=self.causal)

    def build_encoder_attention(self, embed_dim, cfg):
        if cfg.cross_attention == "softmax":
            return super().build_encoder_attention(embed_dim, cfg)
        return build_momentum_attention(embed_dim, cfg.decoder.attention_heads, cfg,
                                        causal=False, cross=True)

    def make_generation_fast_(self, need_attn: bool = False, **kwargs):
        """fairseq asks for attention weights here (need_attn = --print-alignment) before
        generating; linear/momentum cross-attention has none to give."""
        if need_attn and isinstance(self.encoder_attn, MomentumMultiheadAttention):
            raise ValueError(PRINT_ALIGNMENT_NEEDS_SOFTMAX)
        super().make_generation_fast_(need_attn=need_attn, **kwargs)


class MomentumEncoderMixin:
    """For subclasses of fairseq's TransformerEncoderBase: momentum layers."""

    def build_encoder_layer(self, cfg):
        cfg = _as_config(cfg)
        kind = next_layer_kind(self, cfg, cfg.encoder.layers, "encoder")
        return _wrap_layer(MomentumTransformerEncoderLayer(cfg, shared_carrier(self), kind=kind), cfg)

    def forward(self, *args, **kwargs):
        carrier = shared_carrier(self)
        carrier.state = None
        try:
            return super().forward(*args, **kwargs)
        finally:
            carrier.state = None


class MomentumDecoderMixin:
    """For subclasses of fairseq's TransformerDecoderBase: momentum layers, causal unless
    the class sets `causal_self_attention = False` (non-autoregressive decoders)."""

    causal_self_attention = True

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        cfg = _as_config(cfg)
        kind = next_layer_kind(self, cfg, cfg.decoder.layers, "decoder")
        layer = MomentumTransformerDecoderLayer(cfg, shared_carrier(self),
                                                causal=self.causal_self_attention,
                                                no_encoder_attn=no_encoder_attn, kind=kind)
        return _wrap_layer(layer, cfg)

    def extract_features(self, *args, **kwargs):
        carrier = shared_carrier(self)
        carrier.state = None
        try:
            return super().extract_features(*args, **kwargs)
        finally:
            carrier.state = None


def _as_config(cfg):
    return TransformerConfig.from_namespace(cfg)


def _wrap_layer(layer, cfg):
    """fairseq's activation checkpointing and FSDP wrapping, as in build_*_layer."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint and layer.connection is not None:
        raise ValueError(f"--connection {cfg.connection} carries a velocity across layers, which "
                         "activation checkpointing would recompute wrongly: drop "
                         "--checkpoint-activations and --offload-activations (which turns it on) "
                         "or use --connection none")
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)
