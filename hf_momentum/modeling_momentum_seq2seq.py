"""Encoder-decoder momentum transformer (Momentum Transformer, Section 3: the translation setup),
fairseq's `--arch momentum_transformer` in transformers: `AutoModelForSeq2SeqLM`, `generate()`
with greedy, sampling and beam search, Seq2SeqTrainer.

The encoder is a bidirectional `MomentumTransformerModel` (eq. 14). The decoder is one too, causal
(eq. 13; recurrent eq. 12 while generating), whose layers are the shared `DecoderBlock`s: after
self-attention, each attends to the encoder's output (`cross_attention`: eq. 14, or softmax). What
a layer's cross-attention keeps of the encoder's output (its *memory*: eq. 14's two key/value
sums, or softmax's projected keys and values) is computed once per source and held by the
`MomentumSeq2SeqCache` with the decoder's states, so a decoding step costs the same whatever the
source and target lengths (softmax cross-attention: O(source length)). Beam search reorders
states and memories together. With cache_implementation="static" they sit in fixed buffers
(`StaticMomentumSeq2SeqCache`) and generate() compiles the decode step whole.

Padding: source rows may be padded on either side (`attention_mask`), and padded target rows
(`decoder_attention_mask`) too; every row gives the outputs of its pair alone.
"""
from typing import Optional

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqModelOutput

from .configuration_momentum_seq2seq import MomentumSeq2SeqConfig
from .modeling_common import (
    CACHE_NAME,
    RecurrentCausalLMMixin,
    Seq2SeqEmbeddingsMixin,
    Seq2SeqLMMixin,
    given_cache,
    output_with_cache,
    refuse_packed_rows,
    resolve_flag,
)
from .modeling_momentum_transformer import (
    MomentumCache,
    MomentumTransformerLayer,
    MomentumTransformerModel,
    MomentumTransformerPreTrainedModel,
)
from .momentum_core import BlockConfig, DecoderBlock, KeyValueCache, NonCausalSummary, cross_attention_config
from .packing import has_packing_kwargs
from .recurrent_cache import StaticStateMixin

AUTO_MAP = {
    "AutoConfig": "configuration_momentum_seq2seq.MomentumSeq2SeqConfig",
    "AutoModel": "modeling_momentum_seq2seq.MomentumSeq2SeqModel",
    "AutoModelForSeq2SeqLM": "modeling_momentum_seq2seq.MomentumSeq2SeqForConditionalGeneration",
}


def map_memory(memory, fn):
    """A cross-attention memory with `fn` applied to each of its batch-first tensors."""
    if isinstance(memory, KeyValueCache):
        real = None if memory.real is None else fn(memory.real)
        return KeyValueCache(fn(memory.key), fn(memory.value), real)
    return NonCausalSummary(fn(memory.kv), fn(memory.z))


class MomentumSeq2SeqCache(MomentumCache):
    """The decoder's `MomentumCache` (S, z, m of eq. 12 per momentum layer, keys and values per
    softmax layer) and, from the first decoding step on, every layer's cross-attention memory of
    the encoder's output, which later steps reuse instead of the encoder's output. Beam search
    reorders (and `batch_repeat_interleave` expands) both."""

    def __init__(self, config):
        super().__init__(config)
        self.memories = [None] * config.num_hidden_layers

    @property
    def has_memories(self) -> bool:
        return all(memory is not None for memory in self.memories)

    def get_memory(self, layer_idx: int):
        return self.memories[layer_idx]

    def set_memory(self, layer_idx: int, memory) -> None:
        self.memories[layer_idx] = memory

    def reset(self) -> None:
        super().reset()
        self.memories = [None] * len(self.memories)

    def _map(self, fn) -> None:
        super()._map(fn)
        self.memories = [None if memory is None else map_memory(memory, fn) for memory in self.memories]


class StaticMomentumSeq2SeqCache(StaticStateMixin, MomentumSeq2SeqCache):
    """A `MomentumSeq2SeqCache` for a compiled decode step (generate's cache_implementation="static"):
    the decoder's states in fixed buffers updated in place (`StaticStateMixin`), and the memories,
    written by the first (eager) step, kept at their addresses when beam search reorders them."""

    def set_memory(self, layer_idx: int, memory) -> None:
        if not torch.compiler.is_compiling():
            for t in memory_tensors(memory):
                torch._dynamo.mark_static_address(t)
        super().set_memory(layer_idx, memory)

    def _map(self, fn) -> None:
        held = self.memories
        super()._map(fn)
        for i, (old, new) in enumerate(zip(held, self.memories)):
            if old is None:
                continue
            pairs = list(zip(memory_tensors(old), memory_tensors(new)))
            if all((a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device) for a, b in pairs):
                for a, b in pairs:
                    a.copy_(b)
                self.memories[i] = old


def memory_tensors(memory) -> tuple:
    if isinstance(memory, KeyValueCache):
        return tuple(t for t in (memory.key, memory.value, memory.real) if t is not None)
    return memory.kv, memory.z


class MomentumSeq2SeqPreTrainedModel(Seq2SeqEmbeddingsMixin, MomentumTransformerPreTrainedModel):
    config_class = MomentumSeq2SeqConfig
    config: MomentumSeq2SeqConfig
    _no_split_modules = ["MomentumTransformerLayer", "MomentumDecoderLayer"]
    auto_map = AUTO_MAP
    card_hyperparameters = MomentumTransformerPreTrainedModel.card_hyperparameters + ("cross_attention",)


class MomentumDecoderLayer(MomentumTransformerLayer, DecoderBlock):
    """`MomentumTransformerLayer` over the shared `DecoderBlock`: self-attention (its state in the
    cache), cross-attention to the encoder's output, feed-forward. The cross-attention's memory of
    the encoder's output is the cache's, or is computed here (and then kept by the cache)."""

    def __init__(self, config: BlockConfig, cross: BlockConfig, layer_idx: int):
        super().__init__(config, layer_idx, cross=cross)

    def forward(self, hidden_states, velocity=None, previous_update=None, encoder_hidden_states=None,
                encoder_padding_mask=None, segments=None, past_key_values=None, softmax_masks=None):
        """encoder_hidden_states (B, M, hidden) and encoder_padding_mask (B, M) bool or None come
        positionally (a reentrant gradient checkpoint passes gradients to positional tensors only);
        they are not read when the cache holds this layer's memory."""
        cache = past_key_values
        memory = None if cache is None else cache.get_memory(self.layer_idx)
        if memory is None:
            memory = self.summarize_memory(encoder_hidden_states, encoder_padding_mask)
            if cache is not None:
                cache.set_memory(self.layer_idx, memory)
        return super().forward(hidden_states, velocity, previous_update, segments=segments,
                               past_key_values=past_key_values, softmax_masks=softmax_masks, memory=memory)


class MomentumSeq2SeqDecoder(MomentumTransformerModel):
    """The causal `MomentumTransformerModel` with `MomentumDecoderLayer`s and, as its cache, a
    `MomentumSeq2SeqCache`."""

    cache_class = MomentumSeq2SeqCache

    def token_rows(self, config: MomentumSeq2SeqConfig) -> int:
        return config.decoder_vocab_size

    def build_layer(self, block: BlockConfig, layer_idx: int) -> nn.Module:
        # one β, γ for self- and cross-attention: the model's momentum block, whatever kind layer i is
        return MomentumDecoderLayer(block, cross_attention_config(self.block, self.config.cross_attention),
                                    layer_idx)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=None, output_hidden_states=None, output_attentions=None, return_dict=None,
                past_key_values=None, encoder_hidden_states=None, encoder_attention_mask=None, **kwargs):
        """As `MomentumTransformerModel.forward`, attending to `encoder_hidden_states` (B, M, hidden)
        with `encoder_attention_mask` (B, M), 1 = real source token. A cache that holds the layers'
        memories (from its first call) is continued with them, and the encoder's output is then not
        read again. One target per row: packed documents are refused (they would share a source)."""
        refuse_packed_rows(type(self).__name__, position_ids, attention_mask, kwargs,
                           "their tokens would attend to one row's source")
        given = given_cache(cache, past_key_values)
        real = None
        if not remembers_source(given):
            if encoder_hidden_states is None:
                raise ValueError("encoder_hidden_states: the decoder attends to the encoder's output (B, "
                                 "source length, hidden_size); pass it, or a cache that holds its memories")
            if encoder_attention_mask is not None:
                real = encoder_attention_mask.to(device=encoder_hidden_states.device, dtype=torch.bool)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               cache=cache, inputs_embeds=inputs_embeds, use_cache=use_cache,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                               return_dict=return_dict, past_key_values=past_key_values,
                               encoder_states=(encoder_hidden_states, real))


def remembers_source(cache) -> bool:
    """Whether `cache` holds every decoder layer's memory of the encoder's output."""
    return isinstance(cache, MomentumSeq2SeqCache) and cache.has_memories


def encoder_output(encoder_outputs) -> BaseModelOutput:
    """generate() and users pass the encoder's output as a ModelOutput or a tuple (its first item
    the last hidden state)."""
    if isinstance(encoder_outputs, BaseModelOutput):
        return encoder_outputs
    if isinstance(encoder_outputs, (tuple, list)) and encoder_outputs:
        hidden = encoder_outputs[1] if len(encoder_outputs) > 1 else None
        return BaseModelOutput(last_hidden_state=encoder_outputs[0], hidden_states=hidden)
    if hasattr(encoder_outputs, "last_hidden_state"):
        return BaseModelOutput(last_hidden_state=encoder_outputs.last_hidden_state,
                               hidden_states=getattr(encoder_outputs, "hidden_states", None))
    raise ValueError("encoder_outputs must be the encoder's output (a BaseModelOutput or a tuple whose first "
                     f"item is its last hidden state), got {type(encoder_outputs).__name__}")


class MomentumSeq2SeqModel(MomentumSeq2SeqPreTrainedModel):
    """Encoder (bidirectional, eq. 14) and decoder (causal, cross-attending); their token embeddings
    are one matrix with `tie_word_embeddings` and `share_encoder_decoder_embeddings` (fairseq's
    --share-all-embeddings)."""

    _tied_weights_keys = {"decoder.embed_tokens.weight": "encoder.embed_tokens.weight"}

    def __init__(self, config: MomentumSeq2SeqConfig, block: Optional[BlockConfig] = None):
        super().__init__(config, block=block)
        self._tied_weights_keys = {name[len("model."):]: source[len("model."):]
                                   for name, source in config.tied_embeddings().items()
                                   if name.startswith("model.")}
        self.encoder = MomentumTransformerModel(config.encoder_config())
        self.decoder = MomentumSeq2SeqDecoder(config, self.block)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None,
                decoder_attention_mask=None, encoder_outputs=None, cache=None, inputs_embeds=None,
                decoder_inputs_embeds=None, decoder_position_ids=None, use_cache=None,
                output_hidden_states=None,
                output_attentions=None, return_dict=None, past_key_values=None, **kwargs):
        """input_ids / inputs_embeds and attention_mask: the source (rows padded on either side);
        encoder_outputs: the encoder's output already computed (generate() passes it), instead of
        the source; neither is needed with a cache that holds the memories (after its first call);
        decoder_*: the target so far, as `MomentumTransformerModel.forward` takes it
        (positions count real target tokens; `cache` continues generation)."""
        if has_packing_kwargs(**kwargs):
            raise ValueError("packed documents (cu_seq_lens_q / seq_idx) are not supported by an "
                             "encoder-decoder: pad the sources and targets instead (DataCollatorForSeq2Seq)")
        output_hidden_states = resolve_flag(output_hidden_states, self.config, "output_hidden_states")
        remembered = remembers_source(given_cache(cache, past_key_values))
        if encoder_outputs is None and (input_ids is not None or inputs_embeds is not None or not remembered):
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                           inputs_embeds=inputs_embeds, use_cache=False,
                                           output_hidden_states=output_hidden_states,
                                           output_attentions=output_attentions, return_dict=True)
        # a cache that holds the memories needs no source: the encoder's output is not read again
        encoder_outputs = BaseModelOutput() if encoder_outputs is None else encoder_output(encoder_outputs)
        decoder = self.decoder(input_ids=decoder_input_ids, attention_mask=decoder_attention_mask,
                               position_ids=decoder_position_ids, cache=cache,
                               past_key_values=past_key_values, inputs_embeds=decoder_inputs_embeds,
                               use_cache=use_cache, output_hidden_states=output_hidden_states,
                               output_attentions=output_attentions,
                               encoder_hidden_states=encoder_outputs.last_hidden_state,
                               encoder_attention_mask=attention_mask, return_dict=True)
        out = output_with_cache(Seq2SeqModelOutput, getattr(decoder, CACHE_NAME),
                                last_hidden_state=decoder.last_hidden_state,
                                decoder_hidden_states=decoder.hidden_states,
                                encoder_last_hidden_state=encoder_outputs.last_hidden_state,
                                encoder_hidden_states=encoder_outputs.hidden_states)
        return out if return_dict is not False else out.to_tuple()



class MomentumSeq2SeqForConditionalGeneration(Seq2SeqLMMixin, RecurrentCausalLMMixin,
                                              MomentumSeq2SeqPreTrainedModel, GenerationMixin):
    """`MomentumSeq2SeqModel` and a vocabulary projection `lm_head` over the target vocabulary (the
    decoder's token embedding with `tie_word_embeddings`). With `labels` and no decoder inputs, the
    decoder reads the labels shifted right after `decoder_start_token_id`; the loss is the
    cross-entropy of every label not -100 (`num_items_in_batch` honoured). generate() keeps the
    decoder's states and the memories in a `MomentumSeq2SeqCache`, or with
    cache_implementation="static" in a `StaticMomentumSeq2SeqCache`, whose decode step generate()
    compiles whole (on CUDA, or where compile_config says)."""

    _tied_weights_keys = {"lm_head.weight": "model.encoder.embed_tokens.weight",
                          "model.decoder.embed_tokens.weight": "model.encoder.embed_tokens.weight"}
    cache_class = MomentumSeq2SeqCache
    static_cache_class = StaticMomentumSeq2SeqCache

    def __init__(self, config: MomentumSeq2SeqConfig):
        super().__init__(config)
        self._tied_weights_keys = config.tied_embeddings()
        self.model = MomentumSeq2SeqModel(config, self.block)
        self.lm_head = nn.Linear(config.hidden_size, config.decoder_vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None,
                decoder_attention_mask=None, encoder_outputs=None, cache=None, inputs_embeds=None,
                decoder_inputs_embeds=None, decoder_position_ids=None, labels=None, use_cache=None,
                output_hidden_states=None, output_attentions=None, return_dict=None, past_key_values=None,
                logits_to_keep=0, **kwargs):
        decoder_input_ids = self.decoder_inputs_for(labels, decoder_input_ids, decoder_inputs_embeds)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             decoder_input_ids=decoder_input_ids,
                             decoder_attention_mask=decoder_attention_mask,
                             encoder_outputs=encoder_outputs, cache=cache, past_key_values=past_key_values,
                             inputs_embeds=inputs_embeds, decoder_inputs_embeds=decoder_inputs_embeds,
                             decoder_position_ids=decoder_position_ids, use_cache=use_cache,
                             output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                             return_dict=True, **kwargs)
        return self.seq2seq_lm_output(outputs, labels, logits_to_keep, num_items_in_batch, return_dict)
