"""Native momentum transformer (Momentum Transformer, Section 3): causal momentum attention
(eq. 13, recurrent eq. 12 when generating), bidirectional eq. 14 with `is_causal=False`, and the
momentum / adaptive momentum connection (eq. 15, eq. 18) around attention.

Generation carries per layer only the state (S, z, m) of eq. 12 in a `RecurrentCache`: the cost
of a new token does not depend on how many came before. Padding is handled by the kernel (a
padded token is removed from every sum), and positions are counted over real tokens, so a
left-padded batch gives each row the outputs of its sequence alone.

`StaticMomentumCache` (`generate(..., cache_implementation="static")`) keeps that state in fixed
buffers updated in place and counts positions in tensors, so the decode step has one shape and
reads no changing Python number: `generate()` compiles it whole (torch.compile, CUDA graphs with
mode="reduce-overhead") once, as it does for a softmax model's StaticCache.
"""
from typing import Optional

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, MaskedLMOutput, SequenceClassifierOutput

from .cache_history import replay_accepted
from .configuration_momentum_transformer import BLOCK_LABELS, MomentumTransformerConfig
from .modeling_common import (
    CACHE_NAME,
    LMHeadMixin,
    QuestionAnsweringMixin,
    RecurrentCausalLMMixin,
    SequenceClassificationMixin,
    TokenClassificationMixin,
    check_attention_mask,
    given_cache,
    output_with_cache,
    refuse_packed_rows,
    refuse_shifted_labels,
    resolve_cache,
    resolve_flag,
    shifted_by_trainers_label_smoothing,
    static_padding_mask,
    warn_no_attention_weights,
)
from .momentum_core import (
    POOLINGS,
    BlockConfig,
    ConnectionState,
    KeyValueCache,
    MomentumAttentionState,
    Segments,
    TransformerBlock,
    TransformerStack,
    apply_dropout,
)
from .packing import (
    COLLATOR,
    document_positions,
    has_packing_kwargs,
    pop_packing_kwargs,
    possible_document_starts,
)
from .recurrent_cache import RecurrentCache, StaticStateMixin
from .saving import RemoteCodeMixin

AUTO_MAP = {
    "AutoConfig": "configuration_momentum_transformer.MomentumTransformerConfig",
    "AutoModel": "modeling_momentum_transformer.MomentumTransformerModel",
    "AutoModelForCausalLM": "modeling_momentum_transformer.MomentumTransformerForCausalLM",
    "AutoModelForSequenceClassification":
        "modeling_momentum_transformer.MomentumTransformerForSequenceClassification",
    "AutoModelForTokenClassification":
        "modeling_momentum_transformer.MomentumTransformerForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_momentum_transformer.MomentumTransformerForQuestionAnswering",
    "AutoModelForMaskedLM": "modeling_momentum_transformer.MomentumTransformerForMaskedLM",
}


class MomentumCache(RecurrentCache):
    """Per momentum layer the three tensors of `MomentumAttentionState` (S, z, m of eq. 12), per
    softmax layer of a hybrid (`layer_types`) its `KeyValueCache`, and each row's count of real
    tokens (`row_positions`), from which the positions of new tokens follow without reading the
    attention mask over the cached ones."""

    def __init__(self, config: MomentumTransformerConfig):
        # another family's config (refused later, naming the cache) has no softmax layers
        softmax = config.softmax_layers() if hasattr(config, "softmax_layers") else ()
        super().__init__(config.num_hidden_layers, 3, key_value_layers=softmax)

    def get_attention_state(self, layer_idx: int):
        if layer_idx in self.key_value_layers:
            held = self.get_key_values(layer_idx)
            return None if held is None else KeyValueCache(*held)
        states = self.get_states(layer_idx)
        return None if states is None else MomentumAttentionState.trusted(*states)

    def set_attention_state(self, layer_idx: int, state) -> None:
        if isinstance(state, KeyValueCache):
            self.set_key_values(layer_idx, state.key, state.value, state.real)
        else:
            self.set_states(layer_idx, (state.s, state.z, state.m))


class StaticMomentumCache(StaticStateMixin, MomentumCache):
    """A `MomentumCache` for a compiled decode step: S, z, m of eq. 12 in buffers allocated by the
    first forward (the prompt, run eagerly) and overwritten in place by every later one, and each
    row's count of real tokens as a tensor, from which positions follow without the attention
    mask over the cached tokens (a forward may pass the mask of the new tokens only)."""


class MomentumBlockConfig(BlockConfig):
    """The shared block's hyperparameters (`plugins.transformer`), its errors naming this model's
    config fields. Defined here, not imported with the config: remote code may load the config
    file's `momentum_core` and this file's as two modules, each with its own BlockConfig."""

    labels = BLOCK_LABELS


def block_config(config: MomentumTransformerConfig) -> BlockConfig:
    """The shared block's hyperparameters read from this model's config, checked once."""
    return config.validated_block(MomentumBlockConfig)


class MomentumTransformerLayer(GradientCheckpointingLayer, TransformerBlock):
    """One shared block (`plugins.transformer.TransformerBlock`: momentum attention eq. 13 / eq. 14,
    recurrent eq. 12 with a cache, the connection eq. 15 / 18, pre- or post-LN). The velocity v and
    previous update A_{ℓ−1} of the connection are passed from layer to layer as separate tensors,
    which gradient checkpointing can follow; the attention state lives in the `MomentumCache`.
    config: the model's checked BlockConfig (trusted), or a MomentumTransformerConfig (checked);
    block_kwargs: further arguments of the block class (a subclass's)."""

    def __init__(self, config, layer_idx: int, **block_kwargs):
        super().__init__(config if isinstance(config, BlockConfig) else block_config(config), **block_kwargs)
        self.layer_idx = layer_idx

    def forward(self, hidden_states, velocity=None, previous_update=None, segments=None,
                past_key_values=None, padding_mask=None, softmax_masks=None, **block_kwargs):
        """segments: the model's one `Segments` of the batch (trusted); padding_mask (B, N): a
        convenience for one call, turned into Segments here; softmax_masks: the stack's (softmax
        layers of a hybrid); block_kwargs: further arguments of the block's forward (a subclass's:
        a decoder layer's cross-attention `memory`)."""
        cache = past_key_values
        state = None if velocity is None else ConnectionState(velocity, previous_update)
        attention_state = None if cache is None else cache.get_attention_state(self.layer_idx)
        out, state, attention_state = super().forward(hidden_states, state, segments=segments,
                                                      attention_state=attention_state,
                                                      recurrent=cache is not None, padding_mask=padding_mask,
                                                      softmax_masks=softmax_masks, **block_kwargs)
        if cache is not None:
            cache.set_attention_state(self.layer_idx, attention_state)
        if state is None:
            return out, velocity, previous_update
        return out, state.velocity, state.update


class MomentumTransformerLayers(TransformerStack):
    """The core stack over `MomentumTransformerLayer`s: the connection state is handed to each
    layer as two tensors (which gradient checkpointing follows) and each layer reads and writes
    its attention state in the cache `past_key_values`. `encoder_states` (an encoder-decoder's
    decoder): the encoder's hidden states and padding mask, handed to every layer after the
    connection state, positionally as well, so that a reentrant gradient checkpoint sees them."""

    def call_block(self, block, x, connection_state, *, segments, attention_state, recurrent,
                   past_key_values, softmax_masks=None, encoder_states=()):
        velocity, update = (None, None) if connection_state is None else connection_state
        out, velocity, update = block(x, velocity, update, *encoder_states, segments=segments,
                                      past_key_values=past_key_values, softmax_masks=softmax_masks)
        return out, None if velocity is None else ConnectionState(velocity, update), None


class MomentumTransformerPreTrainedModel(RemoteCodeMixin, PreTrainedModel):
    """Checks the config when a model is built, so values set after the config was validated
    (keyword overrides of `from_pretrained`, attribute assignment) are refused too."""

    config_class = MomentumTransformerConfig
    config: MomentumTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["MomentumTransformerLayer"]
    _skip_keys_device_placement = ["cache", "past_key_values"]
    auto_map = AUTO_MAP
    card_hyperparameters = ("attention_momentum", "attention_step_size", "attention_feature_map",
                            "connection", "connection_momentum", "connection_step_size", "adaptive_delta",
                            "is_causal")
    card_papers = ("momentum_transformer",)

    def __init__(self, config: MomentumTransformerConfig, *inputs, block: Optional[BlockConfig] = None,
                 **kwargs):
        """block: the spec an outer model already checked (trusted); None: check `config` now."""
        block = block_config(config) if block is None else block
        super().__init__(config, *inputs, **kwargs)
        self.block = block


class ScaledEmbedding(nn.Embedding):
    """Token embeddings times `embed_scale` (√hidden_size with `scale_embedding`, as BART's): the
    scale is part of the embedding, so `get_input_embeddings()(ids)` gives what the model reads."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: Optional[int],
                 embed_scale: float):
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale


def token_embedding(config: MomentumTransformerConfig, rows: Optional[int] = None) -> nn.Embedding:
    """The token embedding of `rows` tokens (None: config.vocab_size)."""
    rows = config.vocab_size if rows is None else rows
    if config.scale_embedding:
        return ScaledEmbedding(rows, config.hidden_size, config.pad_token_id, config.hidden_size ** 0.5)
    return nn.Embedding(rows, config.hidden_size, config.pad_token_id)


class MomentumTransformerModel(MomentumTransformerPreTrainedModel):
    cache_class = MomentumCache

    def __init__(self, config: MomentumTransformerConfig, block: Optional[BlockConfig] = None):
        super().__init__(config, block=block)
        self.embed_tokens = token_embedding(config, self.token_rows(config))
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.embed_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) \
            if config.embedding_layer_norm else nn.Identity()
        self.dropout = nn.Dropout(config.embedding_dropout)
        layer_blocks = config.layer_blocks(self.block)    # per layer_types; one checked config per kind
        self.layers = MomentumTransformerLayers(self.build_layer(layer_block, i)
                                                for i, layer_block in enumerate(layer_blocks))
        pre_norm = self.block.norm == "pre"
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if pre_norm else nn.Identity()
        self.gradient_checkpointing = False
        self.context_parallel_group = None  # hf_momentum.context_parallel.enable_context_parallel
        self.post_init()

    def token_rows(self, config: MomentumTransformerConfig) -> int:
        """The token embedding's rows: the vocabulary this stack reads."""
        return config.vocab_size

    def build_layer(self, block: BlockConfig, layer_idx: int) -> nn.Module:
        return MomentumTransformerLayer(block, layer_idx)

    def _attention_without_matrices(self) -> str:
        """Why no layer of this stack returns attention weights, for `output_attentions`."""
        kinds = {block.attention for block in self.config.layer_blocks(self.block)}
        why = ["linear (momentum) attention has none"] if kinds - {"softmax"} else []
        if "softmax" in kinds:
            why.append("softmax layers run torch's fused scaled_dot_product_attention, which returns none")
        return "; ".join(why)

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, use_cache=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, past_key_values=None, encoder_states=(), **kwargs):
        """attention_mask: (batch, past + length) with 1 for real tokens (with a
        `StaticMomentumCache` also (batch, length): it counts each row's real tokens itself).
        position_ids default to the count of real tokens before each position, so padding does
        not shift positions.
        Packed documents (hf_momentum.packing: position_ids that restart, or the
        `cu_seq_lens_q/k` / `seq_idx` of DataCollatorWithFlattening in kwargs) run each as if
        alone, positions restarting at every document, without a cache (asking for one raises).
        A given `cache` (`past_key_values` before transformers 5.24) is continued even with
        use_cache=False; an encoder (is_causal=False) runs without a cache. hidden_states: the
        embeddings, then each layer's output (the last one after the final norm). encoder_states:
        (the encoder's hidden states, its padding mask) for the layers of an encoder-decoder's
        decoder, which attend to them (`MomentumSeq2SeqDecoder`)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        given = given_cache(cache, past_key_values)
        replay_accepted(self, given, input_ids, inputs_embeds, attention_mask, position_ids)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        batch, length = inputs_embeds.shape[:2]
        output_hidden_states = resolve_flag(output_hidden_states, self.config, "output_hidden_states")
        warn_no_attention_weights(self, output_attentions, self._attention_without_matrices)
        if self.context_parallel_group is not None:
            if use_cache or given is not None:
                raise ValueError(f"use_cache / {CACHE_NAME}: context parallelism runs without a cache")
            if position_ids is None:
                raise ValueError("position_ids: context parallelism needs the global positions of this "
                                 "rank's slice (hf_momentum.context_parallel.shard_batch gives them)")
            use_cache = False
        cache = resolve_cache(self, given, use_cache, self.cache_class, can_cache=self.config.is_causal)
        packing = pop_packing_kwargs(kwargs)
        described = None
        counted_positions = position_ids is None and not isinstance(cache, StaticStateMixin)
        past = cache.get_seq_length() if counted_positions and cache is not None else 0
        if isinstance(cache, StaticStateMixin):
            padding_mask, position_ids = static_cache_inputs(cache, attention_mask, position_ids, batch,
                                                             length, inputs_embeds.device, packing)
        else:
            padding_mask, position_ids, described, cache = self._recurrent_inputs(
                cache, given, use_cache, attention_mask, position_ids, batch, length,
                inputs_embeds.device, packing)
        position_ids = position_ids.to(inputs_embeds.device)
        check_position_range(position_ids, self.config.max_position_embeddings,
                             largest=None if described is None else described.max_position,
                             bound=past + length - 1 if counted_positions else None)
        embeddings = self.embed_norm(inputs_embeds + self.embed_positions(position_ids))
        hidden = apply_dropout(self.dropout, embeddings)
        if described is None:
            segments = Segments.from_padding_mask(padding_mask, batch, length)
        else:
            segments = described
        # the final norm is applied here, not handed to the stack: accelerate's hook on `layers` moves
        # its arguments to the stack's device, an offloaded norm's weights included
        hidden, all_hidden, _ = self.layers(hidden, segments=segments, past_key_values=cache,
                                            output_hidden_states=output_hidden_states,
                                            encoder_states=encoder_states)
        hidden = self.norm(hidden)
        if all_hidden is not None:
            all_hidden = (*all_hidden[:-1], hidden)
        if cache is not None:
            cache.advance(length, padding_mask)
        out = output_with_cache(BaseModelOutputWithPast, cache, last_hidden_state=hidden,
                                hidden_states=all_hidden)
        return out if return_dict is not False else out.to_tuple()

    def _recurrent_inputs(self, cache, given, use_cache, attention_mask, position_ids, batch,
                          length, device, packing):
        """padding mask, positions, the batch's Segments where position_ids or the collator's forms
        described it (packed rows, or padded rows when each holds one document; else None) and
        cache for a `MomentumCache` or no cache."""
        past = cache.get_seq_length() if cache is not None else 0
        padding_mask = check_attention_mask(attention_mask, batch, past, length)
        if padding_mask is not None:
            padding_mask = padding_mask.to(device)
        described = None
        if past == 0:
            starts = possible_document_starts(batch, length, device, padding_mask=padding_mask,
                                              position_ids=position_ids, **packing)
            described = None if starts is None else Segments.from_starts_or_padding(
                starts, padding_mask, positions=position_ids, offsets=packing.get("cu_seq_lens_q"))
            if described is not None and described.packed:
                if given is not None or use_cache:
                    raise ValueError("packed documents (position_ids that restart, or cu_seq_lens_q / "
                                     f"seq_idx from {COLLATOR}) cannot fill one cache; pass use_cache=False "
                                     f"and no {CACHE_NAME}, and generate from each document separately")
                if self.context_parallel_group is not None:
                    raise ValueError("packed documents (position_ids that restart, or cu_seq_lens_q / "
                                     f"seq_idx from {COLLATOR}) are not supported with context "
                                     "parallelism: shard one document (or unpacked rows) over the ranks")
                cache = None
                if position_ids is None:
                    position_ids = document_positions(starts, padding_mask)
        elif has_packing_kwargs(**packing):
            raise ValueError(f"packed documents (cu_seq_lens_q / seq_idx from {COLLATOR}) cannot continue a "
                             f"cache that holds {past} tokens")
        before = None if cache is None else cache.row_positions(batch, device)
        if position_ids is None:
            position_ids = real_token_positions(before, padding_mask, length, device)
        return padding_mask, position_ids, described, cache


def check_position_range(position_ids: torch.Tensor, limit: int, *, largest: Optional[int] = None,
                         bound: Optional[int] = None) -> None:
    """Raise if a position is beyond the position embedding's `limit` rows. largest: the maximum
    already on the host (read with the batch's `Segments`); bound: a host bound on positions the
    model counted itself (real tokens before each one), within which nothing is read. Otherwise
    the maximum is read, except under torch.compile, where the embedding's own index check
    stands in (a read here would stop the graph)."""
    if largest is None and (bound is None or bound >= limit):
        if torch.compiler.is_compiling() or not position_ids.numel():
            return
        largest = int(position_ids.max())
    if largest is not None and largest >= limit:
        raise ValueError(f"position {largest} is beyond max_position_embeddings ({limit}); position_ids must "
                         f"be in [0, {limit})")


def real_token_positions(before: Optional[torch.Tensor], padding_mask: Optional[torch.Tensor], length: int,
                         device) -> torch.Tensor:
    """Default positions of the new tokens: the real tokens before each one, `before` (batch,)
    of them in the cache (None: none), so padding does not shift positions. Without padding two
    ops at most (a decoding step runs this once per token)."""
    if padding_mask is None:
        steps = torch.arange(length, device=device)[None]
        return steps if before is None else before[:, None] + steps
    count = padding_mask.long().cumsum(-1)
    return (count - 1 if before is None else before[:, None] + count - 1).clamp(min=0)


def static_cache_inputs(cache: StaticStateMixin, attention_mask, position_ids, batch: int, length: int,
                        device, packing: dict):
    """(padding mask of the new tokens or None, positions) with a static cache (`StaticMomentumCache`,
    or the encoder-decoder's `StaticMomentumSeq2SeqCache`; `static_padding_mask`). Positions default
    to each row's real tokens before each one."""
    before, padding_mask = static_padding_mask(cache, attention_mask, batch, length, device, packing,
                                               position_ids)
    if position_ids is None:
        position_ids = real_token_positions(before, padding_mask, length, device)
    return padding_mask, position_ids


@shifted_by_trainers_label_smoothing
class MomentumTransformerForCausalLM(RecurrentCausalLMMixin, MomentumTransformerPreTrainedModel,
                                     GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    cache_class = MomentumCache
    static_cache_class = StaticMomentumCache

    def __init__(self, config: MomentumTransformerConfig):
        super().__init__(config)
        if not config.is_causal:
            raise ValueError("MomentumTransformerForCausalLM needs is_causal=True")
        self.model = MomentumTransformerModel(config, self.block)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, labels=None, use_cache=None, output_hidden_states=None,
                output_attentions=None, return_dict=None, logits_to_keep=0, past_key_values=None, **kwargs):
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache, past_key_values=past_key_values, inputs_embeds=inputs_embeds,
                             use_cache=use_cache, output_hidden_states=output_hidden_states,
                             output_attentions=output_attentions, return_dict=True,
                             **pop_packing_kwargs(kwargs))
        return self.causal_lm_output(outputs, labels, logits_to_keep, return_dict, **kwargs)


class MomentumTransformerForSequenceClassification(SequenceClassificationMixin,
                                                   MomentumTransformerPreTrainedModel):
    """The final hidden states pooled (`classifier_pooling`: the mean over real tokens, the LRA
    setup, or the first real token), then a linear classifier, with `classifier_hidden_act` first a
    dense layer and that activation (RoBERTa's classification head); set `is_causal=False` for
    bidirectional attention (eq. 14)."""

    def __init__(self, config: MomentumTransformerConfig):
        super().__init__(config)
        self.model = MomentumTransformerModel(config, self.block)
        self.pool = POOLINGS[config.classifier_pooling]
        if config.classifier_hidden_act is not None:
            self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
            self.pooler_act = ACT2FN[config.classifier_hidden_act]
        self.add_classifier(config)
        self.post_init()

    def classifier_features(self, pooled: torch.Tensor) -> torch.Tensor:
        features = self.dropout(pooled)
        if self.config.classifier_hidden_act is None:
            return features
        return self.dropout(self.pooler_act(self.pooler(features)))

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_hidden_states=None, output_attentions=None, return_dict=None, **kwargs):
        refuse_packed_rows(type(self).__name__, position_ids, attention_mask, kwargs)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             inputs_embeds=inputs_embeds, use_cache=False,
                             output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                             return_dict=True)
        hidden = outputs.last_hidden_state
        logits = self.score(self.classifier_features(self.pool(hidden, attention_mask)))
        loss = self.sequence_loss(logits, labels)
        out = SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
        return out if return_dict is not False else out.to_tuple()


class MomentumTransformerForTokenClassification(TokenClassificationMixin, MomentumTransformerPreTrainedModel):
    """A linear classifier on every final hidden state (TokenClassificationMixin); set
    `is_causal=False` so that each token's label reads the whole sequence (eq. 14)."""

    def __init__(self, config: MomentumTransformerConfig):
        super().__init__(config)
        self.model = MomentumTransformerModel(config, self.block)
        self.add_classifier(config)
        self.post_init()


class MomentumTransformerForQuestionAnswering(QuestionAnsweringMixin, MomentumTransformerPreTrainedModel):
    """Start and end logits of an answer span from every final hidden state
    (QuestionAnsweringMixin); set `is_causal=False` so that each position reads the whole question
    and context (eq. 14)."""

    def __init__(self, config: MomentumTransformerConfig):
        super().__init__(config)
        self.model = MomentumTransformerModel(config, self.block)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()


class MaskedLMTransform(nn.Module):
    """BERT's prediction-head transform (dense, `hidden_act`, LayerNorm) between the encoder and
    the tied vocabulary projection: the embedding matrix then scores features made for it."""

    def __init__(self, config: MomentumTransformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(hidden)))


def labelled_tokens(labels: torch.Tensor, features: torch.Tensor):
    """(labels, features) of the tokens whose label is not -100 (the loss's ignore index), flattened
    in row-major token order: the masked LM head then runs on those alone (`sparse_prediction`).
    Selecting them waits for the device once, to count them."""
    labels = labels.reshape(-1)
    if labels.numel() != features.shape[0] * features.shape[1]:
        raise ValueError(f"labels must have one entry per token, {tuple(features.shape[:2])}; got "
                         f"{labels.numel()} entries")
    keep = (labels != -100).nonzero().squeeze(1)
    return labels.index_select(0, keep), features.reshape(-1, features.shape[-1]).index_select(0, keep)


class MomentumTransformerForMaskedLM(LMHeadMixin, MomentumTransformerPreTrainedModel):
    """Masked language modelling (BERT's objective) over a bidirectional encoder: every token reads
    the whole sequence (Momentum Transformer, eq. 14), so it needs `is_causal=False`. The final
    hidden states go through `MaskedLMTransform`, then `lm_head` (tied to the input embedding, with
    a bias), with transformers' ForMaskedLM loss (labels -100 ignored, `num_items_in_batch`
    honoured). Each token keeps its own logits, so packed rows (DataCollatorWithFlattening) are
    taken: every document runs as if alone. With `config.sparse_prediction` and labels, only the
    labelled tokens go through the head and `logits` holds their rows only."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: MomentumTransformerConfig):
        super().__init__(config)
        if config.is_causal:
            raise ValueError("MomentumTransformerForMaskedLM needs is_causal=False: a masked token is "
                             "predicted from the tokens on both sides (Momentum Transformer, eq. 14); for "
                             "next-token prediction use MomentumTransformerForCausalLM")
        self.model = MomentumTransformerModel(config, self.block)
        self.transform = MaskedLMTransform(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_hidden_states=None, output_attentions=None, return_dict=None, **kwargs):
        refuse_shifted_labels(type(self).__name__, kwargs)
        outputs = self.token_features(input_ids, attention_mask, position_ids, inputs_embeds,
                                      output_hidden_states, output_attentions, kwargs)
        features = outputs.last_hidden_state
        if self.config.sparse_prediction and labels is not None:
            labels, features = labelled_tokens(labels, features)
        logits = self.lm_head(self.transform(features))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        out = MaskedLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
        return out if return_dict is not False else out.to_tuple()
