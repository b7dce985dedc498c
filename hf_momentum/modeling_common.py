"""What the native families share: output flags, the cache's name and the cache rules of `forward`,
one mixin for both `...ForCausalLM` classes (embedding accessors, logits slicing, loss and output,
`_prepare_cache_for_generation`, refusing empty prompts in generate()), and one each for both
`...ForTokenClassification` and both `...ForQuestionAnswering` classes. A flat sibling of the
modeling files (imported with `from .modeling_common import ...`), so a saved model's remote
code carries it.
"""
import dataclasses
import warnings
from typing import Optional

import torch
import transformers
from packaging.version import Version
from torch import nn
from transformers import GenerationMixin
from transformers.generation.configuration_utils import GenerationMode
from transformers.loss.loss_utils import ForMaskedLMLoss
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    QuestionAnsweringModelOutput,
    Seq2SeqLMOutput,
    TokenClassifierOutput,
)
from transformers.utils import logging

from .packing import COLLATOR, has_packing_kwargs, pop_packing_kwargs
from .validation import check_bool, check_int

logger = logging.get_logger(__name__)

# transformers 5.24 renamed the generation cache from `past_key_values` to `cache`: a model's argument,
# its outputs' field and generate()'s model_kwargs, the old name kept as a deprecated alias. The models
# take either name, and name their outputs' field and generate()'s entry as the installed version does.
CACHE_NAME = "cache" if "cache" in {f.name for f in dataclasses.fields(BaseModelOutputWithPast)} \
    else "past_key_values"
# transformers 5.24's prefill (alone among 5.23-5.25) leaves the cut of a prompt that continues a
# filled cache to the model where every layer of the cache is a linear-attention one; its chunked
# prefill (prefill_chunk_size) then feeds the model the whole prompt, the tokens the cache holds included.
CHUNKED_PREFILL_REREADS_THE_CACHE = Version(transformers.__version__).release[:2] == (5, 24)


def given_cache(cache, past_key_values):
    """The cache a forward was given, as `cache` or as `past_key_values` (the name before
    transformers 5.24), not both."""
    if cache is not None and past_key_values is not None:
        raise ValueError("pass the cache once, as cache or as past_key_values (its name before transformers "
                         "5.24), not both")
    return past_key_values if cache is None else cache


def output_with_cache(output_class, cache, **fields):
    """`output_class(**fields)` with the cache in its field of the installed transformers."""
    return output_class(**fields, **{CACHE_NAME: cache})


def resolve_flag(value, config, name: str) -> bool:
    """A per-call flag (`output_hidden_states`, `output_attentions`) or, when None, the config's."""
    if value is None:
        value = getattr(config, name, False)
    return False if value is None else check_bool(value, name)


def warn_no_attention_weights(model, output_attentions, what) -> None:
    """`output_attentions=True` (argument or config) asks for attention matrices that the model
    never forms (`what` says why, or is a function that says it, called only to warn): say so once
    per model instead of returning nothing silently."""
    if resolve_flag(output_attentions, model.config, "output_attentions") and \
            not getattr(model, "_warned_no_attention_weights", False):
        model._warned_no_attention_weights = True
        what = what() if callable(what) else what
        warnings.warn(f"output_attentions=True is ignored: no attention matrix is formed ({what}), so "
                      "`attentions` is None", UserWarning, stacklevel=3)


def resolve_cache(model, given, use_cache, cache_class, *, can_cache: bool = True):
    """The cache `forward` runs with. A `given` cache is always used (whatever `use_cache` says:
    dropping it would give the logits of a different prefix); `use_cache` only decides whether a
    fresh cache is started. `use_cache=None` means the config's in eval mode and none in training,
    as transformers' own recurrent-state models (Mamba) decide: a training step has no use for the
    final states, and computing them (eq. 12's state with its NaN marks, per layer) costs a
    host-bound GPU step its time (docs/benchmarks.md, 2026-11-28). Training with gradient
    checkpointing cannot carry a cache."""
    if given is not None and not isinstance(given, cache_class):
        raise ValueError(f"{CACHE_NAME} must be a {cache_class.__name__}, got {type(given).__name__}")
    if use_cache is not None:
        use_cache = check_bool(use_cache, "use_cache")
    if not can_cache:
        if use_cache or given is not None:
            raise ValueError(f"use_cache / {CACHE_NAME} need is_causal=True: bidirectional attention "
                             "(Momentum Transformer, eq. 14) has no recurrent form")
        return None
    if use_cache is None:
        use_cache = bool(model.config.use_cache) and not model.training
    if getattr(model, "gradient_checkpointing", False) and model.training:
        if given is not None:
            raise ValueError(f"{CACHE_NAME} cannot be carried through gradient checkpointing in training "
                             "(the recomputed layers would update it twice); call model.eval() or pass none")
        if use_cache:
            logger.warning_once("use_cache=True is incompatible with gradient checkpointing in training; "
                                "running without a cache")
        return None
    if given is not None:
        return given
    return cache_class(model.config) if use_cache else None


def check_attention_mask(attention_mask, batch: int, past: int, length: int) -> Optional[torch.Tensor]:
    """The new tokens' columns (batch, length) of the (batch, past + length) padding mask, as
    bool, 1/True for real tokens. A mask of any other length is refused (it does not describe
    the cache). Only the new columns are read: a decode step's work does not grow with `past`."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        raise ValueError("attention_mask must be a 2D tensor (batch, cached + new tokens), got "
                         f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}")
    if tuple(attention_mask.shape) != (batch, past + length):
        raise ValueError("attention_mask must have shape (batch, cached + new tokens) = "
                         f"({batch}, {past + length}) with {past} cached and {length} new tokens, "
                         f"got {tuple(attention_mask.shape)}")
    return attention_mask[:, past:].bool()


def static_padding_mask(cache, attention_mask, batch: int, length: int, device, packing: dict,
                        position_ids=None):
    """(each row's real tokens absorbed so far, the new tokens' padding mask as bool or None) with a
    static cache (`recurrent_cache.StaticStateMixin`), without reading the number of cached tokens (a
    Python int that changes every step, which a compiled step would be traced again for).
    attention_mask: (batch, new tokens), or (batch, cached + new tokens) as for a dynamic cache (its
    last `length` columns are read). Packed documents cannot fill one cache and are refused: the
    collator's kwargs, and position_ids that restart, read once in an eager forward of more than one
    token (a prompt; a compiled decoding step reads nothing)."""
    if has_packing_kwargs(**packing):
        raise ValueError(f"packed documents (cu_seq_lens_q / seq_idx from {COLLATOR}) cannot fill one cache; "
                         f"pass use_cache=False and no {CACHE_NAME}")
    before = cache.row_positions(batch, device)
    new = None if attention_mask is None else _new_tokens_mask(cache, attention_mask, batch, length, device)
    if position_ids is not None and length > 1 and position_ids.shape[-1] == length and \
            not torch.compiler.is_compiling() and bool(restarting_positions(position_ids, new).any()):
        raise ValueError(f"packed documents (position_ids that restart at 0 within a row) cannot fill one "
                         f"cache; pass use_cache=False and no {CACHE_NAME}, and generate from each document "
                         "separately")
    return before, new


def _new_tokens_mask(cache, attention_mask, batch: int, length: int, device) -> torch.Tensor:
    """The new tokens' columns of a static cache's attention_mask, as bool (`static_padding_mask`)."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2 or \
            attention_mask.shape[0] != batch or attention_mask.shape[1] < length:
        raise ValueError("attention_mask must be a 2D tensor (batch, new tokens) or (batch, cached + new "
                         f"tokens) with batch {batch} and {length} new tokens, got "
                         f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}")
    if not torch.compiler.is_compiling() and \
            attention_mask.shape[1] not in (length, cache.get_seq_length() + length):
        raise ValueError(f"attention_mask has {attention_mask.shape[1]} columns: with {length} new "
                         f"tokens and {cache.get_seq_length()} cached it must cover the new ones or all")
    new = attention_mask[:, attention_mask.shape[1] - length:]
    return new.to(device=device, dtype=torch.bool)


def restarting_positions(position_ids: torch.Tensor, real: Optional[torch.Tensor]) -> torch.Tensor:
    """Where position_ids fall back to 0 between two real tokens of a row (packed documents), (...,
    length - 1) bool; `real`: the tokens' padding mask (padding's positions are no document's), or
    None (all real)."""
    restarts = (position_ids[..., 1:] == 0) & (position_ids[..., :-1] > 0)
    if real is not None:
        real = real.to(device=restarts.device, dtype=torch.bool)
        restarts = restarts & real[..., 1:] & real[..., :-1]
    return restarts


def refuse_packed_rows(head: str, position_ids, attention_mask, kwargs: dict,
                       effect: str = "they would be pooled into one label") -> None:
    """Sequence classification pools each row into one label (question answering picks one span
    in it), so a row must hold one sequence: packed documents (DataCollatorWithFlattening's
    cu_seq_lens_q/k or seq_idx, or position_ids that fall back to 0 between two real tokens of a
    row) would be mixed; `effect` says how. Refused at the head's public entry (one host read of
    position_ids there, when they are given)."""
    advice = "pad the batch instead (DataCollatorWithPadding)"
    if has_packing_kwargs(**kwargs):
        raise ValueError(f"{head} takes one sequence per row, but got packed documents (cu_seq_lens_q / "
                         f"seq_idx): {effect}; {advice}")
    if position_ids is not None and position_ids.shape[-1] > 1:
        if bool(restarting_positions(position_ids, attention_mask).any()):
            raise ValueError(f"{head} takes one sequence per row, but position_ids restart at 0 within a "
                             f"row (packed documents): {effect}; {advice}")


def shift_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """The decoder's inputs for `labels`: the start token, then the labels but the last, with -100
    (ignored labels) read as padding (fairseq's prev_output_tokens, BART's shift_tokens_right)."""
    shifted = labels.new_empty(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


class Seq2SeqEmbeddingsMixin:
    """For an encoder-decoder PreTrainedModel whose config has `vocab_size` (the source's),
    `decoder_vocab_size` and `share_encoder_decoder_embeddings`: the base model's accessors (its
    `encoder` and `decoder`, each with `embed_tokens`) and resizing both vocabularies."""

    def get_input_embeddings(self):
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value):
        self.encoder.embed_tokens = value
        if self.config.tie_word_embeddings and self.config.share_encoder_decoder_embeddings:
            self.decoder.embed_tokens = value

    def get_encoder(self, *args, **kwargs):
        return self.encoder

    def get_decoder(self):
        return self.decoder

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        """transformers resizes the input embedding (the encoder's) and the LM head, and sets
        `vocab_size`; an untied decoder embedding is resized here too, to the same number of rows,
        and `decoder_vocab_size` follows (the loss, saving and loading read it)."""
        if self.config.decoder_vocab_size != self.config.vocab_size:
            raise ValueError("resize_token_embeddings resizes one vocabulary, but the source has "
                             f"{self.config.vocab_size} tokens and the target "
                             f"{self.config.decoder_vocab_size}")
        decoder = self.get_decoder()
        old = decoder.embed_tokens
        embeddings = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        rows = embeddings.weight.shape[0]
        if decoder.embed_tokens is not embeddings:
            resized = self._get_resized_embeddings(old, rows, mean_resizing=mean_resizing)
            decoder.embed_tokens = resized.requires_grad_(old.weight.requires_grad)
        self.config.decoder_vocab_size = rows
        return embeddings


class Seq2SeqLMMixin:
    """For a `...ForConditionalGeneration` with `self.model` (an encoder-decoder whose `encoder` and
    `decoder` it exposes) and `self.lm_head` over the target vocabulary (`config.decoder_vocab_size`):
    the accessors, the decoder's inputs from `labels`, and the logits, loss and output of a forward."""

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.model.set_input_embeddings(value)

    def get_encoder(self, *args, **kwargs):
        return self.model.encoder

    def get_decoder(self):
        return self.model.decoder

    def decoder_inputs_for(self, labels, decoder_input_ids, decoder_inputs_embeds):
        """The decoder's input ids: those given, or with `labels` alone the labels shifted right
        after `decoder_start_token_id`."""
        if labels is None or decoder_input_ids is not None or decoder_inputs_embeds is not None:
            return decoder_input_ids
        if self.config.decoder_start_token_id is None or self.config.pad_token_id is None:
            raise ValueError("labels without decoder_input_ids: shifting them right needs "
                             "config.decoder_start_token_id and config.pad_token_id; set both or pass "
                             "decoder_input_ids")
        return self.prepare_decoder_input_ids_from_labels(labels)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """DataCollatorForSeq2Seq's hook: the decoder's inputs for `labels`."""
        return shift_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, *args, **kwargs):
        """transformers' inputs for generate()'s next forward (the decoder's new tokens, the encoder's
        output and mask, the cache); the causal mixin's prompt rule would read `attention_mask`, the
        source's, as the decoder's. Decoder ids that continue a filled cache keep only the tokens it
        has not absorbed where `decoder_attention_mask` is as wide (transformers' rule, which the
        prefill of 5.24 leaves to the model for linear-attention caches). With the static cache a
        decoder mask keeps only its new tokens' columns, as for the causal LM; the encoder's mask
        stays whole. An assistant's cache (recording its past for speculative decoding) keeps only
        the unabsorbed tokens without a decoder mask too: transformers 5.25's candidate generator
        passes none, and its prefill would re-feed the assistant every decoder id of each round."""
        cache = kwargs.get(CACHE_NAME)
        if next_sequence_length is None and cache is not None:
            mask = kwargs.get("decoder_attention_mask")
            drafting = mask is None and cache.recording_past()
            next_sequence_length = _unabsorbed_tokens(cache.get_seq_length(), input_ids, mask, None,
                                                      input_ids.shape[1] if drafting else None)
        inputs = GenerationMixin.prepare_inputs_for_generation(self, input_ids, next_sequence_length, *args,
                                                               **kwargs)
        mask = inputs.get("decoder_attention_mask")
        static = self.static_cache_class
        if static is not None and isinstance(cache, static) and isinstance(mask, torch.Tensor):
            length = inputs["decoder_input_ids"].shape[1]
            inputs["decoder_attention_mask"] = mask[:, mask.shape[1] - length:].contiguous()
        return inputs

    def create_masks_for_generate(self, config, inputs_embeds, attention_mask, *args, **kwargs):
        """generate() would build a 4D decoder mask for a compileable cache: it stays as given."""
        return attention_mask

    def seq2seq_lm_output(self, outputs, labels, logits_to_keep, num_items_in_batch, return_dict):
        """Logits of the last `logits_to_keep` target positions (0: all), the cross-entropy of every
        label not -100 (`num_items_in_batch` honoured), and the output (a tuple unless return_dict)."""
        keep = check_int(logits_to_keep, "logits_to_keep", low=0)
        logits = self.lm_head(outputs.last_hidden_state[:, -keep:])
        loss = None
        if labels is not None:
            loss = ForMaskedLMLoss(logits, labels, self.config.decoder_vocab_size,
                                   num_items_in_batch=num_items_in_batch)
        out = output_with_cache(Seq2SeqLMOutput, getattr(outputs, CACHE_NAME), loss=loss, logits=logits,
                                decoder_hidden_states=outputs.decoder_hidden_states,
                                cross_attentions=outputs.cross_attentions,
                                encoder_last_hidden_state=outputs.encoder_last_hidden_state,
                                encoder_hidden_states=outputs.encoder_hidden_states)
        return out if return_dict is not False else out.to_tuple()


class HeadOverModelMixin:
    """For a head over `self.model`, the family's base model (embedding `embed_tokens`)."""

    def add_classifier(self, config, features: Optional[int] = None) -> None:
        """`num_labels` and the linear classifier `score` (PEFT's and transformers' name) over
        `features` (default `hidden_size`) features, read through `classifier_dropout`."""
        self.num_labels = config.num_labels
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.score = nn.Linear(features or config.hidden_size, config.num_labels)

    def token_features(self, input_ids, attention_mask, position_ids, inputs_embeds, output_hidden_states,
                       output_attentions, kwargs: dict):
        """`self.model`'s outputs without a cache, for a head that scores every token on its own:
        packed rows are taken (the packing kwargs are popped from `kwargs`, the loss's stay)."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          inputs_embeds=inputs_embeds, use_cache=False,
                          output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                          return_dict=True, **pop_packing_kwargs(kwargs))

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value


class LMHeadMixin(HeadOverModelMixin):
    """For a head whose vocabulary projection is `self.lm_head` (the causal and masked LMs)."""

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value


class SequenceClassificationMixin(HeadOverModelMixin):
    """For a `...ForSequenceClassification`: transformers' loss of its pooled logits
    (`ForSequenceClassification`: cross entropy, MSE or BCE by `problem_type`), a mean over the rows
    of one batch. transformers' Trainer would pass `num_items_in_batch` to a forward that takes
    **kwargs and then leave the loss undivided by the gradient-accumulation steps, but this loss
    does not read it (MSE and BCE have no such count), so the model says it takes no loss kwargs
    and the Trainer divides: accumulated batches give the gradient of one batch of them all."""

    accepts_loss_kwargs = False

    def sequence_loss(self, logits: torch.Tensor, labels: Optional[torch.Tensor]):
        if labels is None:
            return None
        return self.loss_function(labels=labels, pooled_logits=logits, config=self.config)


class TokenClassificationMixin(HeadOverModelMixin):
    """For a `...ForTokenClassification` with `self.model`, `self.dropout` and `self.score`: a
    label per token (NER, tagging), as transformers' GenericForTokenClassification, with its loss
    (`ForTokenClassification`: labels -100 ignored, `num_items_in_batch` honoured). Each token
    keeps its own logits, so packed rows (DataCollatorWithFlattening) are taken: every document
    runs as if alone."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_hidden_states=None, output_attentions=None, return_dict=None, **kwargs):
        refuse_shifted_labels(type(self).__name__, kwargs)
        outputs = self.token_features(input_ids, attention_mask, position_ids, inputs_embeds,
                                      output_hidden_states, output_attentions, kwargs)
        logits = self.score(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config, **kwargs)
        out = TokenClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
        return out if return_dict is not False else out.to_tuple()


def refuse_shifted_labels(head: str, kwargs: dict) -> None:
    """A head with one label per token (token classification, masked LM) takes no `shift_labels`
    (a causal LM's, e.g. from context_parallel.shard_batch's default), whose count of scored labels
    (`num_items_in_batch`) would not be its own."""
    if kwargs.get("shift_labels") is not None:
        raise ValueError(f"shift_labels: {head} scores each token's own label, not the next token's; for "
                         "context parallelism use shard_batch(batch, group, shift_labels=False)")


def ignored_on_padding(positions: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """Answer positions (batch,) or (batch, 1) with those on a padded token (a negative one counts
    as 0, as the loss clamps it) moved past the row, where transformers' question-answering loss
    ignores them, as it ignores a position past a row alone (where one on right padding falls). A
    padded token's logit is the dtype's lowest: its loss would overflow to inf, its gradients to NaN."""
    positions = positions.to(padding.device).reshape(-1)
    length = padding.shape[1]
    inside = positions.clamp(0, length - 1)      # the loss clamps a negative position to 0
    on_padding = padding.gather(1, inside[:, None])[:, 0] & (positions < length)
    return torch.where(on_padding, torch.full_like(positions, length), positions)


class QuestionAnsweringMixin(HeadOverModelMixin):
    """For a `...ForQuestionAnswering` with `self.model` and `self.qa_outputs` (hidden → 2): the
    start and end logits of an answer span (extractive QA), as transformers'
    GenericForQuestionAnswering, with its loss (`ForQuestionAnswering`: positions past the row
    ignored). Padded positions get the dtype's lowest logit, so that a padded row's span scores and
    loss are those of the row alone; an answer position on a padded token is ignored as one past
    the row (`ignored_on_padding`). A span is chosen over a whole row: packed documents are refused."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None,
                start_positions=None, end_positions=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, **kwargs):
        refuse_packed_rows(type(self).__name__, position_ids, attention_mask, kwargs,
                           "one answer span would be chosen across them")
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             inputs_embeds=inputs_embeds, use_cache=False,
                             output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                             return_dict=True)
        logits = self.qa_outputs(outputs.last_hidden_state)
        if attention_mask is not None:
            padding = ~attention_mask.to(device=logits.device, dtype=torch.bool)
            logits = logits.masked_fill(padding[..., None], torch.finfo(logits.dtype).min)
            if start_positions is not None and end_positions is not None:
                start_positions, end_positions = (ignored_on_padding(p, padding)
                                                  for p in (start_positions, end_positions))
        start_logits, end_logits = (part.squeeze(-1).contiguous() for part in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions, **kwargs)
        out = QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                           hidden_states=outputs.hidden_states)
        return out if return_dict is not False else out.to_tuple()


def shifted_by_trainers_label_smoothing(cls):
    """A causal LM class, named where transformers' Trainer looks: its label smoothing
    (`label_smoothing_factor`) shifts the labels by one only for a class whose name is in
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, which `AutoModelForCausalLM.register` does not extend (a
    remote-code model is never registered), so the smoothed loss scored each token's own id."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(cls.config_class.model_type, cls.__name__)
    return cls


class RecurrentCausalLMMixin(LMHeadMixin):
    """For a `...ForCausalLM` with `self.model` (embedding `embed_tokens`), `self.lm_head`, a
    `cache_class` (a RecurrentCache built from the config) and, where the decode step can be
    compiled whole, a `static_cache_class` (generate's cache_implementation="static").

    Assisted and prompt-lookup decoding work with `cache_class`, which generate can crop back to
    the verified tokens (hf_momentum.cache_history); the static cache cannot, so they are refused
    with it before generating."""

    cache_class = None
    static_cache_class = None

    def causal_lm_output(self, outputs, labels=None, logits_to_keep=0, return_dict=None, **loss_kwargs):
        """Logits of the kept positions (`logits_to_keep`: an int, the last n, 0 = all; or a 1D
        tensor of positions), the next-token loss when `labels` are given, and the output."""
        if isinstance(logits_to_keep, torch.Tensor):
            if logits_to_keep.dim() != 1 or logits_to_keep.is_floating_point():
                raise ValueError("logits_to_keep as a tensor must hold 1D integer positions, got "
                                 f"{logits_to_keep.dtype} of shape {tuple(logits_to_keep.shape)}")
            keep = logits_to_keep.to(outputs.last_hidden_state.device)
        else:
            keep = slice(-check_int(logits_to_keep, "logits_to_keep", low=0), None)
        logits = self.lm_head(outputs.last_hidden_state[:, keep])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size,
                                      **loss_kwargs)
        out = output_with_cache(CausalLMOutputWithPast, getattr(outputs, CACHE_NAME), loss=loss,
                                logits=logits, hidden_states=outputs.hidden_states)
        return out if return_dict is not False else out.to_tuple()

    def generate(self, inputs=None, *args, **kwargs):
        """transformers' generate(), after refusing an empty prompt (it would fail reading the
        last prompt token, which an empty prompt does not have)."""
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[1] == 0:
            raise ValueError("generate() needs a prompt of at least one token (input_ids has length 0); "
                             "start from the bos token, e.g. "
                             "input_ids=torch.full((batch, 1), config.bos_token_id)")
        return super().generate(inputs, *args, **kwargs)

    def _prepare_position_ids_for_generation(self, inputs_tensor, model_kwargs):
        """None: where the caller gives generate() no position_ids, its own (the real tokens before
        each one) are what the model counts itself, from the padding mask and the cache. Given
        tensors would be extended and sliced at every step and read back from the device once per
        token, to check them against the position table; counted ones stay within a bound the model
        knows on the host."""
        return None

    def init_continuous_batching(self, *args, **kwargs):
        """Refused: transformers' continuous batching (`generate_batch`, and generate() with
        cache_implementation="paged", both start here) pages key-value blocks, which momentum layers
        do not have."""
        raise ValueError("cache_implementation='paged' is one of transformers' key-value caches (continuous "
                         "batching: generate_batch, init_continuous_batching), which pages key-value blocks; "
                         "momentum layers keep a state of fixed size instead: generate() a padded batch")

    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, *args, inputs_embeds=None,
                                      **kwargs):
        """transformers' inputs for generate()'s next forward, with two changes.

        - A prompt that continues a filled cache (one passed to generate(), or an assistant's
          drafting again) keeps only the tokens the cache has not absorbed, as transformers
          does for key-value caches. The prefill of transformers 5.24 leaves the prompt whole when
          every layer of the cache is a linear-attention one, whose length it cannot tell in
          general; this cache counts its tokens.
        - With the static cache, the 2D padding mask keeps only the new tokens' columns,
          contiguous: one shape and stride at every decode step, so the compiled step is not
          traced again (the cache counts each row's real tokens itself).

        `inputs_embeds` is named in the signature because generate() reads it there to accept a
        prompt given as embeddings."""
        cache = kwargs.get(CACHE_NAME)
        if next_sequence_length is None and cache is not None:
            embeds = inputs_embeds if kwargs.get("is_first_iteration") else None
            next_sequence_length = _unabsorbed_tokens(cache.get_seq_length(), input_ids,
                                                      kwargs.get("attention_mask"), embeds,
                                                      cache.dropped_mask_columns)
        inputs = super().prepare_inputs_for_generation(input_ids, next_sequence_length, *args,
                                                       inputs_embeds=inputs_embeds, **kwargs)
        mask = inputs.get("attention_mask")
        if self.static_cache_class is not None and isinstance(cache, self.static_cache_class) and \
                isinstance(mask, torch.Tensor) and mask.dim() == 2:
            tokens = inputs["input_ids"] if inputs.get("input_ids") is not None else inputs["inputs_embeds"]
            inputs["attention_mask"] = mask[:, mask.shape[1] - tokens.shape[1]:].contiguous()
        return inputs

    def create_masks_for_generate(self, config, inputs_embeds, attention_mask, *args, **kwargs):
        """generate() would turn the padding mask into a 4D one for a compileable cache: it stays
        2D, as `forward` takes it (prepare_inputs_for_generation keeps its new tokens' columns)."""
        return attention_mask

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode=None, *args,
                                      **kwargs):
        """generate() would build a DynamicCache; install this model's recurrent cache instead
        (its `static_cache_class` for cache_implementation="static", which generate() compiles).
        A cache built for an assistant records its past, as generate() does for its own caches."""
        cache = model_kwargs.get(CACHE_NAME)
        implementation = generation_config.cache_implementation
        if implementation not in (None, "dynamic", "static"):
            static_hint = "" if self.static_cache_class is None else \
                ", or 'static' for a compiled decode step"
            raise ValueError(f"cache_implementation={implementation!r} is one of transformers' key-value "
                             f"caches; {type(self).__name__} keeps its own ({self.cache_class.__name__}: a "
                             "state of fixed size per momentum layer), so leave cache_implementation unset "
                             f"(or 'dynamic'){static_hint}")
        static = implementation == "static"
        if generation_mode == GenerationMode.ASSISTED_GENERATION and \
                (static or getattr(cache, "is_compileable", False)):
            option = ("prompt_lookup_num_tokens" if generation_config.prompt_lookup_num_tokens is not None
                      else "assistant_model")
            raise ValueError(f"{option}= (speculative decoding) crops the cache back to the accepted tokens, "
                             "which a static cache (cache_implementation='static' or a StaticMomentumCache), "
                             "updated in place, cannot do; leave cache_implementation unset and pass no "
                             "static cache")
        if static and self.static_cache_class is None:
            raise ValueError(f"cache_implementation='static' is not available for {type(self).__name__}: "
                             "its decode step has no compileable cache; leave cache_implementation unset")
        if cache is not None and static:
            raise ValueError(f"pass either cache_implementation='static' or {CACHE_NAME} (e.g. a "
                             f"{self.static_cache_class.__name__}), not both")
        if cache is not None:
            if not isinstance(cache, self.cache_class):
                raise ValueError(f"{CACHE_NAME} must be a {self.cache_class.__name__}, "
                                 f"got {type(cache).__name__}")
            if generation_config.use_cache is False:
                raise ValueError(f"generate(use_cache=False) with {CACHE_NAME}: without a cache every step "
                                 "re-reads the whole sequence, which the given cache has already absorbed")
            if CHUNKED_PREFILL_REREADS_THE_CACHE and generation_config.prefill_chunk_size is not None and \
                    cache.get_seq_length() > 0:
                raise ValueError(f"prefill_chunk_size with a filled {CACHE_NAME}: the chunked prefill of "
                                 f"transformers {transformers.__version__} would feed the model the tokens "
                                 "the cache holds again; generate without prefill_chunk_size, or with "
                                 "transformers 5.23 or >= 5.25")
            cache._is_user_defined = True
            cache.dropped_mask_columns = getattr(generation_config, "_mask_length", None)
            return
        if generation_config.use_cache is False:
            if static:
                raise ValueError("cache_implementation='static' needs use_cache=True")
            return
        cache_class = self.static_cache_class if static else self.cache_class
        model_kwargs[CACHE_NAME] = cache_class(self.config)
        if generation_config.is_assistant:
            model_kwargs[CACHE_NAME].activate_past_recording()


def _unabsorbed_tokens(past: int, input_ids, attention_mask, inputs_embeds,
                       dropped_mask_columns: Optional[int] = None) -> Optional[int]:
    """How many trailing prompt tokens a cache holding `past` tokens has not absorbed, by
    transformers' own rule (its prefill in 5.23 and 5.25): prompt embeddings are the whole sequence;
    ids are when the mask covers as many columns. generate() drops a mask of ones before the prefill
    and keeps its width (`dropped_mask_columns`), which then stands for the mask's. None: the prompt
    is only the new tokens already."""
    if past == 0:
        return None
    if inputs_embeds is not None:
        return inputs_embeds.shape[1] - past
    columns = attention_mask.shape[1] if attention_mask is not None else dropped_mask_columns
    if columns == input_ids.shape[1]:
        return input_ids.shape[1] - past
    return None
