"""A fairseq momentum model as a transformers model: a checkpoint of `momentum_transformer_lm` /
`linear_transformer_lm` (any preset, hybrids included) becomes a `MomentumTransformerForCausalLM`
folder, one of the translation model `momentum_transformer` / `linear_transformer` a
`MomentumSeq2SeqForConditionalGeneration` folder, one of `momentum_roberta` / `linear_roberta` a
`MomentumTransformerForMaskedLM` folder or, fine-tuned with --task sentence_prediction, a
`MomentumTransformerForSequenceClassification` one, one of `momentum_lstm_lm` a
`MomentumLSTMForCausalLM` folder (convert_lstm_lm.py) and one of the translation model
`momentum_lstm` (or fairseq's own `lstm`) a `MomentumLSTMSeq2SeqForConditionalGeneration` folder
(convert_lstm_translation.py)
(config, safetensors, the modeling code for `trust_remote_code`, a model card), with the same
logits; `from_pretrained` loads it, `generate` or a pipeline runs it, `push_to_hub` publishes it.

    python -m fairseq_momentum.convert_to_hf checkpoints/checkpoint_best.pt hf-model \\
        [--head NAME] [--push_to_hub --hub_model_id you/name]

The layers map one to one (`plugins` holds the attention and the connection for both). fairseq's
token embedding scale (√d unless --no-scale-embedding) is the config's `scale_embedding`, its
--layernorm-embedding `embedding_layer_norm`; its positions (sinusoidal, or learned with fairseq's
offset of padding_idx + 1) become the learned table of `max_position_embeddings` = the model's
maximum positions, so a sinusoidal model converted and then fine-tuned trains its positions.
RoBERTa's LM head (dense, activation, LayerNorm, tied projection with a bias) is the masked LM's;
its classification head (the `<s>` features, dense, --pooler-activation-fn, classifier) is the
sequence classifier's with `classifier_pooling="first"` and `classifier_hidden_act`.
The dictionary's ids are kept (an LM's bos is fairseq's `</s>`, which starts every LM sample; a
masked LM's is `<s>`; a translation model's decoder starts from `</s>`, as fairseq's generator
does). The tokenizer saved beside the model: with a sentencepiece model (the task's
--bpe sentencepiece, or --sentencepiece-model for data segmented before fairseq-preprocess, as
recipes/iwslt does) one that segments with it and maps pieces to the dictionary's ids; with GPT-2's
BPE (the task's --bpe gpt2, or --gpt2-encoder-json / --gpt2-vocab-bpe for data encoded before
fairseq-preprocess, as RoBERTa's examples do) one that encodes with it and maps GPT-2 ids to the
dictionary's; with subword-nmt's BPE (the task's --bpe subword_nmt, or --bpe-codes for data
segmented before fairseq-preprocess, as fairseq's translation examples do) one that segments with its
codes, after Moses where the task had --tokenizer moses or --tokenizer moses is given, and decodes as
--post-process subword_nmt and Moses' detokenizer do; with fastBPE's (the task's --bpe fastbpe, or
--fastbpe-codes) the same, on its merges; otherwise, where the dictionary holds words, a
word-level one (Moses' words with --tokenizer moses; a translation model's appends `</s>` to a
source, as fairseq's datasets do); with another BPE, or subword symbols or GPT-2 ids and no BPE
files, none (a warning says so). A translation model's two dictionaries become the
tokenizer's two vocabularies: sources with the source's, `text_target=` and decoding with the
target's, as transformers' MarianTokenizer does.
A translation model generates as fairseq-generate does by default (5 beams, length penalty 1, no
`</s>` first, never the padding symbol, at most 200 tokens), unless generate() is told otherwise; its
beam search then finds fairseq's hypotheses, except those that reach the length limit (fairseq
forces `</s>` there with its own score, transformers stops without it; hf_momentum.FairseqLengthLimit
does as fairseq does).
A translation model's encoder and decoder must agree in width, heads, feed-forward width and norm
placement (one config holds them); its vocabularies may differ; its token embeddings are one
matrix with --share-all-embeddings, the decoder's and the output projection's one with
--share-decoder-input-output-embed, else three. What the transformers
model has no counterpart for (adaptive input or softmax, character embeddings, projections between
sizes, the scale_* options, pruned heads or blocks, a spectral-norm head) is refused, naming the
option.
"""
import argparse
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from .configs import as_namespace, flag
from .convert_lstm_lm import lstm_lm_config, lstm_lm_state_dict
from .convert_lstm_translation import (
    check_lstm_translation,
    lstm_translation_config,
    lstm_translation_state_dict,
)

logger = logging.getLogger(__name__)

# fairseq's activation_fn → transformers' ACT2FN name of the same function
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_fast": "gelu_pytorch_tanh",
               "gelu_accurate": "gelu_pytorch_tanh", "tanh": "tanh", "linear": "linear"}
# options that change the model in ways MomentumTransformerConfig has no counterpart for (when set)
UNSUPPORTED = ("adaptive_input", "adaptive_softmax_cutoff", "character_embeddings", "no_decoder_final_norm",
               "no_token_positional_embeddings", "scale_attn", "scale_fc", "scale_heads", "scale_resids",
               "tie_adaptive_weights")
PRUNING = ("mha_heads_to_keep", "ffn_blocks_to_remove")       # roberta's; -1 keeps everything
LAYER_PARTS = {"self_attn_layer_norm": "attn_norm", "self_attn.q_proj": "attention.q_proj",
               "self_attn.k_proj": "attention.k_proj", "self_attn.v_proj": "attention.v_proj",
               "self_attn.o_proj": "attention.o_proj", "self_attn.out_proj": "attention.o_proj",
               "final_layer_norm": "mlp_norm", "fc1": "mlp.fc_in", "fc2": "mlp.fc_out"}
# a translation decoder layer's cross-attention (fairseq's encoder_attn) under its transformers names
CROSS_PARTS = {"encoder_attn_layer_norm": "cross_norm", "encoder_attn.out_proj": "cross_attention.o_proj",
               **{f"encoder_attn.{p}_proj": f"cross_attention.{p}_proj" for p in ("q", "k", "v", "o")}}
# a translation model's per-stack options that the transformers config holds once
SHARED_STACK_OPTIONS = ("embed_dim", "attention_heads", "ffn_embed_dim", "normalize_before")
# fairseq-generate's defaults (--beam 5, --lenpen 1, stopping at `beam` finished hypotheses, --min-len 1
# so no </s> first, at most --max-len-b 200 tokens and </s>, within the decoder's positions): a
# converted translation model's generation_config, with the padding symbol never generated, as
# fairseq's SequenceGenerator rules
FAIRSEQ_GENERATION = dict(num_beams=5, length_penalty=1.0, early_stopping=True, min_new_tokens=1)
FAIRSEQ_MAX_LEN_B = 200
CONNECTION_FIELDS = {"connection_momentum": "connection_momentum",
                     "connection_step_size": "connection_step_size", "connection_delta": "adaptive_delta"}


@dataclass
class Source:
    """What a fairseq model converts from: its layer stack (decoder or sentence encoder), the prefix
    of its options (`decoder` / `encoder`), and for RoBERTa its LM head or one classification head."""
    stack: torch.nn.Module
    side: str
    lm_head: Optional[torch.nn.Module] = None
    classifier: Optional[torch.nn.Module] = None

    def option(self, args, name, default=None):
        return getattr(args, f"{self.side}_{name}", default)


def source_of(model, args, head: Optional[str] = None) -> Source:
    """`head`: for a RoBERTa, the classification head to convert, or "masked_lm" for its LM head;
    None: its only classification head if it has one (a fine-tuned model), else the LM head."""
    kind = type(model).__name__
    if kind in ("MomentumTransformerLanguageModel", "MomentumTransformerModel"):
        if head is not None:
            raise ValueError(f"head {head!r}: --head picks one of a momentum_roberta's heads; a language "
                             "or translation model converts whole")
        return Source(model.decoder, "decoder")
    if kind == "MomentumRobertaModel":
        heads = dict(model.classification_heads.items())
        if head is None and len(heads) > 1:
            raise ValueError(f"head: the model has classification heads {sorted(heads)}; name one, or "
                             "masked_lm")
        if head is None:
            head = next(iter(heads), "masked_lm")
        if head == "masked_lm":
            return Source(model.encoder.sentence_encoder, "encoder", lm_head=model.encoder.lm_head)
        if head not in heads:
            raise ValueError(f"head {head!r}: the model's heads are {sorted(heads) + ['masked_lm']}")
        return Source(model.encoder.sentence_encoder, "encoder", classifier=heads[head])
    raise ValueError("checkpoint: converts momentum_transformer_lm, momentum_transformer, momentum_roberta, "
                     f"momentum_lstm_lm, momentum_lstm and fairseq's lstm (and their presets), got {kind} "
                     f"(--arch {getattr(args, 'arch', '?')})")


def check_convertible(args, source: Source) -> None:
    """ValueError naming the first option of `args` that the transformers model cannot represent."""
    for name in UNSUPPORTED:
        value = getattr(args, name, None)
        if value not in (None, False, 0, ""):
            raise ValueError(f"{flag(name)} {value!r}: a momentum_transformer model has no counterpart; "
                             f"convert a model trained without {flag(name)}")
    for name in PRUNING:
        if getattr(args, name, -1) not in (None, -1):
            raise ValueError(f"{flag(name)} {getattr(args, name)!r}: pruned heads or feed-forward blocks "
                             "have no counterpart in a momentum_transformer model")
    for name in ("input_dim", "output_dim"):
        width = source.option(args, name, source.option(args, "embed_dim"))
        if width != source.option(args, "embed_dim"):
            raise ValueError(f"--{source.side}-{name.replace('_', '-')} {width} differs from "
                             f"--{source.side}-embed-dim {source.option(args, 'embed_dim')}: a "
                             "momentum_transformer model has no projection between them")
    activations = ["activation_fn"] + (["pooler_activation_fn"] if source.classifier is not None else [])
    for name in activations:
        if getattr(args, name) not in ACTIVATIONS:
            raise ValueError(f"{flag(name)} {getattr(args, name)!r}: convertible ones are "
                             f"{', '.join(ACTIVATIONS)}")
    if source.classifier is not None and getattr(args, "spectral_norm_classification_head", False):
        raise ValueError("--spectral-norm-classification-head: a momentum_transformer classifier has no "
                         "spectral norm; convert a model trained without it")


def hf_config(args, dictionary, source: Source, labels=None, regression: bool = False):
    """The MomentumTransformerConfig of the fairseq model whose stack is `source`; `labels`: a
    classifier's label names, in class order; `regression`: its head predicts values
    (--regression-target), whose outputs transformers' pipelines then leave as they are."""
    from hf_momentum import MomentumTransformerConfig
    stack, encoder = source.stack, source.side == "encoder"
    classifier = {}
    if source.classifier is not None:
        classes = source.classifier.out_proj.out_features
        # the label dictionary's first `classes` symbols (fairseq pads it with madeupwords)
        names = labels[:classes] if labels is not None and len(labels) >= classes else \
            [f"LABEL_{i}" for i in range(classes)]
        classifier = dict(num_labels=classes, id2label=dict(enumerate(names)),
                          label2id={name: i for i, name in enumerate(names)}, classifier_pooling="first",
                          classifier_hidden_act=ACTIVATIONS[args.pooler_activation_fn],
                          classifier_dropout=args.pooler_dropout,
                          **({"problem_type": "regression"} if regression else {}))
    layers = len(stack.layers)
    layer_types = list(getattr(args, "layer_types", None) or ["linear_attention"] * layers)
    connection = {hf: getattr(args, fs) for fs, hf in CONNECTION_FIELDS.items()
                  if getattr(args, fs, None) is not None}
    tied = not args.untie_weights_roberta if encoder else bool(args.share_decoder_input_output_embed)
    return MomentumTransformerConfig(
        vocab_size=len(dictionary), hidden_size=source.option(args, "embed_dim"), num_hidden_layers=layers,
        num_attention_heads=source.option(args, "attention_heads"),
        intermediate_size=source.option(args, "ffn_embed_dim"), hidden_act=ACTIVATIONS[args.activation_fn],
        attention_momentum=args.attention_momentum, attention_step_size=args.attention_step_size,
        attention_feature_map=args.feature_map, connection=args.connection, **connection,
        max_position_embeddings=stack.max_positions(), embedding_dropout=args.dropout,
        attention_dropout=args.dropout, hidden_dropout=args.dropout,
        activation_dropout=getattr(args, "activation_dropout", 0.0) or 0.0,
        layer_norm="pre" if source.option(args, "normalize_before") else "post",
        layer_norm_eps=stack.layers[0].self_attn_layer_norm.eps, is_causal=not encoder,
        pad_token_id=dictionary.pad(), bos_token_id=dictionary.bos() if encoder else dictionary.eos(),
        eos_token_id=dictionary.eos(), tie_word_embeddings=tied, scale_embedding=not args.no_scale_embedding,
        embedding_layer_norm=stack.layernorm_embedding is not None, layer_types=layer_types, **classifier)


def position_table(stack, rows: int, dtype) -> torch.Tensor:
    """fairseq's position embeddings of positions 1..rows (fairseq numbers them from padding_idx + 1)
    as a (rows, dim) table: the learned rows, or the sinusoid computed as fairseq computes it."""
    from fairseq.modules import SinusoidalPositionalEmbedding
    positions = stack.embed_positions
    start = positions.padding_idx + 1
    if isinstance(positions, SinusoidalPositionalEmbedding):
        table = SinusoidalPositionalEmbedding.get_embedding(start + rows, positions.embedding_dim,
                                                            positions.padding_idx)
    else:
        table = positions.weight.detach()
    return table[start:start + rows].to(dtype)


def module_state(prefix: str, module) -> dict:
    return {f"{prefix}.{name}": tensor for name, tensor in module.state_dict().items()}


def stack_state(prefix: str, stack, rows: int, side: str, parts=LAYER_PARTS) -> dict:
    """The weights of a fairseq layer stack (embeddings, layers, final norm) under the names of the
    transformers stack at `prefix`, with `rows` position rows; `parts`: layer module names."""
    dtype = stack.embed_tokens.weight.dtype
    state = {f"{prefix}.embed_tokens.weight": stack.embed_tokens.weight.detach(),
             f"{prefix}.embed_positions.weight": position_table(stack, rows, dtype)}
    if stack.layernorm_embedding is not None:
        state.update(module_state(f"{prefix}.embed_norm", stack.layernorm_embedding))
    for i, layer in enumerate(stack.layers):
        for name, tensor in layer.state_dict().items():
            part, _, leaf = name.rpartition(".")
            if part not in parts:
                raise ValueError(f"{side}.layers.{i}.{name}: no counterpart in a momentum_transformer layer")
            state[f"{prefix}.layers.{i}.{parts[part]}.{leaf}"] = tensor
    if stack.layer_norm is not None:
        state.update(module_state(f"{prefix}.norm", stack.layer_norm))
    return state


def hf_state_dict(source: Source, config) -> dict:
    """The weights of the fairseq model under the transformers model's names."""
    stack = source.stack
    state = stack_state("model", stack, config.max_position_embeddings, source.side)
    if source.classifier is not None:
        state.update(module_state("pooler", source.classifier.dense))
        state.update(module_state("score", source.classifier.out_proj))
    elif source.lm_head is not None:
        head = source.lm_head
        state.update(module_state("transform.dense", head.dense))
        state.update(module_state("transform.norm", head.layer_norm))
        state["lm_head.bias"] = head.bias.detach()
    if source.classifier is None and not config.tie_word_embeddings:   # tied: the embedding itself
        projection = source.lm_head.weight if source.lm_head is not None else stack.output_projection.weight
        state["lm_head.weight"] = projection.detach()
    return state


def check_translation(args, model) -> None:
    """ValueError naming what a translation model has that MomentumSeq2SeqConfig cannot hold."""
    for name in SHARED_STACK_OPTIONS:
        encoder, decoder = getattr(args, f"encoder_{name}"), getattr(args, f"decoder_{name}")
        if encoder != decoder:
            dashed = name.replace("_", "-")
            raise ValueError(f"--encoder-{dashed} {encoder!r} differs from --decoder-{dashed} {decoder!r}: a "
                             "momentum_seq2seq model has one value for both")
    if getattr(args, "no_cross_attention", False):
        raise ValueError("--no-cross-attention: a momentum_seq2seq decoder attends to the encoder")
    check_convertible(args, Source(model.encoder, "encoder"))
    check_convertible(args, Source(model.decoder, "decoder"))


def seq2seq_config(args, model, dictionary, target_dictionary):
    """The MomentumSeq2SeqConfig of a fairseq translation model: the decoder's fields as an LM's
    (`hf_config`), the encoder's depth and layer types, the cross-attention, the two vocabularies
    and which embeddings are one matrix, one position table of the smaller stack's maximum, `</s>`
    starting the decoder."""
    from hf_momentum import MomentumSeq2SeqConfig, MomentumTransformerConfig
    fields = hf_config(args, target_dictionary, Source(model.decoder, "decoder")).to_dict()
    fields = {name: fields[name] for name in MomentumTransformerConfig.__annotations__}
    shared = bool(args.share_all_embeddings)
    fields.update(vocab_size=len(dictionary),
                  max_position_embeddings=min(model.encoder.max_positions(), model.decoder.max_positions()),
                  bos_token_id=target_dictionary.bos(),
                  tie_word_embeddings=shared or bool(args.share_decoder_input_output_embed))
    layers = len(model.encoder.layers)
    return MomentumSeq2SeqConfig(**fields, encoder_layers=layers, cross_attention=args.cross_attention,
                                 encoder_layer_types=list(getattr(args, "layer_types", None)
                                                          or ["linear_attention"] * layers),
                                 decoder_vocab_size=len(target_dictionary),
                                 share_encoder_decoder_embeddings=shared,
                                 decoder_start_token_id=target_dictionary.eos())


def seq2seq_state_dict(model, config) -> dict:
    rows = config.max_position_embeddings
    state = {**stack_state("model.encoder", model.encoder, rows, "encoder"),
             **stack_state("model.decoder", model.decoder, rows, "decoder", {**LAYER_PARTS, **CROSS_PARTS})}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = model.decoder.output_projection.weight.detach()
    return state


def to_transformers(model, args, dictionary, head: Optional[str] = None, labels=None, target_dictionary=None,
                    regression: bool = False):
    """The transformers model with the weights of the fairseq `model`, in eval mode and its dtype:
    MomentumTransformerForCausalLM for an LM; MomentumSeq2SeqForConditionalGeneration for a
    translation model (`target_dictionary`: its target's; None: `dictionary`); for a
    RoBERTa ...ForSequenceClassification with its classification head `head` (RoBERTa's head: <s>
    features, dense, activation, classifier; `labels` its label names, `regression` whether it predicts
    values) or ...ForMaskedLM (head "masked_lm", or None without such heads)."""
    from hf_momentum import (
        MomentumSeq2SeqForConditionalGeneration,
        MomentumTransformerForCausalLM,
        MomentumTransformerForMaskedLM,
        MomentumTransformerForSequenceClassification,
    )
    if type(model).__name__ == "MomentumLSTMLanguageModel":
        if head is not None:
            raise ValueError(f"head {head!r}: --head picks one of a momentum_roberta's heads; a language "
                             "model converts whole")
        from hf_momentum import MomentumLSTMForCausalLM
        config = lstm_lm_config(args, model, dictionary)
        return loaded(MomentumLSTMForCausalLM(config), lstm_lm_state_dict(model, config),
                      model.decoder.embed_tokens.weight.dtype)
    if type(model).__name__ in ("MomentumLSTMModel", "LSTMModel"):
        if head is not None:
            raise ValueError(f"head {head!r}: --head picks one of a momentum_roberta's heads; a translation "
                             "model converts whole")
        from hf_momentum import MomentumLSTMSeq2SeqForConditionalGeneration
        target_dictionary = target_dictionary or dictionary
        check_lstm_translation(args, model, dictionary, target_dictionary)
        config = lstm_translation_config(args, model, dictionary, target_dictionary)
        converted = with_fairseq_generation(MomentumLSTMSeq2SeqForConditionalGeneration(config),
                                            int(min(FAIRSEQ_MAX_LEN_B, model.decoder.max_positions() - 1)))
        return loaded(converted, lstm_translation_state_dict(model, config),
                      model.decoder.embed_tokens.weight.dtype)
    source = source_of(model, args, head)
    if type(model).__name__ == "MomentumTransformerModel":
        check_translation(args, model)
        config = seq2seq_config(args, model, dictionary, target_dictionary or dictionary)
        model_class, state = MomentumSeq2SeqForConditionalGeneration, seq2seq_state_dict(model, config)
    else:
        check_convertible(args, source)
        config = hf_config(args, dictionary, source, labels, regression and source.classifier is not None)
        model_class = MomentumTransformerForCausalLM if config.is_causal else \
            MomentumTransformerForSequenceClassification if source.classifier is not None else \
            MomentumTransformerForMaskedLM
        state = hf_state_dict(source, config)
    converted = model_class(config)
    if config.is_encoder_decoder:
        limit = min(FAIRSEQ_MAX_LEN_B, config.max_position_embeddings - 1)
        converted = with_fairseq_generation(converted, limit)
    return loaded(converted, state, source.stack.embed_tokens.weight.dtype)


def with_fairseq_generation(converted, max_tokens: int):
    """A converted translation model generating as fairseq-generate does by default: at most
    `max_tokens` (min(max_len_b, decoder positions - 1)) tokens, then </s>; here the decoder's start
    token is counted too."""
    converted.generation_config.update(**FAIRSEQ_GENERATION, max_length=max_tokens + 2,
                                       suppress_tokens=[converted.config.pad_token_id])
    return converted


def loaded(converted, state: dict, dtype):
    """`converted` in `dtype` and eval mode with the weights `state`, which must name every weight
    but the tied ones."""
    converted = converted.to(dtype)
    missing, unexpected = converted.load_state_dict(state, strict=False)
    tied = set(converted.get_expanded_tied_weights_keys()) if converted.config.tie_word_embeddings else set()
    missing = [name for name in missing if name not in tied]
    if missing or unexpected:
        raise ValueError(f"weights that do not map: missing {missing}, unexpected {unexpected}")
    return converted.eval()


def wrapping(dictionary, config, sample=None) -> Optional[str]:
    """What the saved tokenizer wraps a text in, as fairseq's task builds its samples (the
    tokenizer's `wrap`): "eos" for a translation model's source (text, then `</s>`), "bos_eos" for
    masked_lm's `<s> ... </s>` (its dictionary has `<mask>`), "none" for an LM's prompt. `sample`: a
    sentence_prediction classifier's (--init-token, --separator-token), which build its samples
    instead: each text ends with `</s>`, the first follows the init token, the second the separator
    ("eos" or "bos_eos"; "eos_sep" / "bos_eos_sep" with the separator `</s>`: RoBERTa's pairs
    `<s> a </s> </s> b </s>`). None for tokens other than `<s>` and `</s>` there."""
    if sample is not None:
        init, separator = sample
        if init not in (None, dictionary.bos()) or separator not in (None, dictionary.eos()):
            return None
        return ("eos" if init is None else "bos_eos") + ("" if separator is None else "_sep")
    if config.is_encoder_decoder:
        return "eos"
    return "bos_eos" if "<mask>" in dictionary.indices else "none"


def word_tokenizer(dictionary, max_length: int, pattern: str):
    """A whitespace word-level tokenizer with the dictionary's ids (for a task without BPE) that
    wraps a text as `pattern` (`wrapping`) says; it knows masked_lm's `<mask>`."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    vocab = {symbol: i for i, symbol in enumerate(dictionary.symbols)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=dictionary.unk_word))
    # fairseq splits words on Python's whitespace, which has U+001C-U+001F beyond Unicode's
    tokenizer.normalizer = normalizers.Replace(Regex("[\x1c-\x1f]"), " ")
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return fast_tokenizer(tokenizer, dictionary, max_length, pattern)


def fast_tokenizer(tokenizer, dictionary, max_length: int, pattern: str, offsets=None, cls=None):
    """transformers' fast tokenizer (`cls`, PreTrainedTokenizerFast by default) of the tokenizers
    library's `tokenizer` (whose ids are the dictionary's) that wraps a text as `pattern`
    (`wrapping`) says; `offsets`: a post-processor run first (byte-level BPE's, which leaves a
    token's leading space out of its offsets)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from hf_momentum.tokenization_fairseq_dictionary import wrap_layout
    bos, eos = dictionary.bos_word, dictionary.eos_word
    lead, ends, separated = wrap_layout(pattern)
    steps = [] if offsets is None else [offsets]
    if ends:
        start, separator = f"{bos} " if lead else "", f"{eos} " if separated else ""
        specials = [(bos, dictionary.bos())] if lead else []
        steps.append(processors.TemplateProcessing(
            single=f"{start}$A {eos}", pair=f"{start}$A {eos} {separator}$B {eos}",
            special_tokens=specials + [(eos, dictionary.eos())]))
    if steps:
        tokenizer.post_processor = steps[0] if len(steps) == 1 else processors.Sequence(steps)
    return (cls or PreTrainedTokenizerFast)(tokenizer_object=tokenizer, unk_token=dictionary.unk_word,
                                            pad_token=dictionary.pad_word, eos_token=eos,
                                            bos_token=bos if lead else eos,
                                            mask_token="<mask>" if "<mask>" in dictionary.indices else None,
                                            model_max_length=max_length)


def load(checkpoint):
    """(fairseq model, its args, its dictionary, the label names of a sentence_prediction task or
    None, its whole config (the task's BPE and tokenizer are read from it), its target dictionary) of
    a checkpoint file, through fairseq's loader (the user-dir's checks on what the file may hold
    included)."""
    from fairseq import checkpoint_utils
    [model], cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    label_dictionary = getattr(task, "label_dictionary", None)
    labels = None if label_dictionary is None else label_dictionary.symbols[label_dictionary.nspecial:]
    return model.eval(), as_namespace(cfg.model), task.source_dictionary, labels, cfg, task.target_dictionary


def dictionary_tokenizer(tokenizer_class, files, dictionary, pattern: str, max_length: int,
                         target_dictionary=None, **options):
    """A `hf_momentum.tokenization_fairseq_dictionary.FairseqDictionaryTokenizer` subclass built from
    its BPE `files`, the dictionary's ids (and a translation model's target dictionary's, when it has
    its own) and its own `options`, registered for AutoTokenizer (its files are saved with it);
    `pattern`: what it wraps a text in (its `wrap`)."""
    import tempfile
    folder = Path(tempfile.mkdtemp())

    def written(name, vocabulary):
        (folder / name).write_text("".join(symbol + "\n" for symbol in vocabulary.symbols), encoding="utf-8")
        return folder / name
    target = None if target_dictionary is None else written("fairseq_target_vocab.txt", target_dictionary)
    mask = {"mask_token": "<mask>"} if "<mask>" in dictionary.indices else {}
    tokenizer = tokenizer_class(
        *files, written("fairseq_vocab.txt", dictionary), target, bos_token=dictionary.bos_word,
        pad_token=dictionary.pad_word, eos_token=dictionary.eos_word, unk_token=dictionary.unk_word,
        wrap=pattern, model_max_length=max_length, **mask, **options)
    tokenizer.register_for_auto_class("AutoTokenizer")
    return tokenizer


def sentencepiece_tokenizer(dictionary, sp_model: Path, pattern: str, max_length: int,
                            target_dictionary=None):
    """The tokenizer of the sentencepiece model `sp_model` with the dictionaries' ids: a fast one
    (`sentencepiece_fast_tokenizer`) where one dictionary holds every piece and the model is one it
    rebuilds, else
    `hf_momentum.tokenization_fairseq_sentencepiece.FairseqSentencePieceTokenizer`
    (`dictionary_tokenizer`), which maps the pieces a dictionary lacks to `<unk>` and reads a second
    dictionary."""
    import importlib.util
    if importlib.util.find_spec("sentencepiece") is None:
        raise ValueError("--sentencepiece-model needs the sentencepiece package: pip install sentencepiece")
    if target_dictionary is None:
        fast = sentencepiece_fast_tokenizer(dictionary, sp_model, pattern, max_length)
        if fast is not None:
            return fast
    from hf_momentum.tokenization_fairseq_sentencepiece import FairseqSentencePieceTokenizer
    return dictionary_tokenizer(FairseqSentencePieceTokenizer, [sp_model], dictionary, pattern, max_length,
                                target_dictionary)


def sentencepiece_fast_tokenizer(dictionary, sp_model: Path, pattern: str, max_length: int):
    """`hf_momentum.tokenization_fairseq_sentencepiece_fast.FairseqSentencePieceTokenizerFast`
    (`fast_tokenizer`: offsets, word ids) that segments as the sentencepiece model does (its
    normalization, whitespace rules and unigram or BPE pieces, in the tokenizers library) and gives
    each piece its dictionary index: its vocabulary lists the pieces in the dictionary's order. None
    where the dictionary lacks a piece (fairseq's `<unk>`, which a vocabulary cannot map), or the
    model has what this does not rebuild: byte fallback, user-defined symbols, words not split at
    spaces, spaces after them, or pieces of spaces alone."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers.convert_slow_tokenizer import import_protobuf
    from transformers.tokenization_utils_base import generate_merges

    from hf_momentum.tokenization_fairseq_dictionary import wrap_layout
    from hf_momentum.tokenization_fairseq_sentencepiece import SPACE
    from hf_momentum.tokenization_fairseq_sentencepiece_fast import FairseqSentencePieceTokenizerFast
    proto = import_protobuf().ModelProto()
    proto.ParseFromString(Path(sp_model).read_bytes())
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    normal, user_defined = 1, 4                      # sentencepiece's ModelProto.SentencePiece.Type
    pieces = [piece for piece in proto.pieces if piece.type == normal]
    missing = [piece.piece for piece in pieces if piece.piece not in dictionary.indices]
    unsupported = [what for what, present in (
        ("byte fallback", trainer.byte_fallback),
        ("words not split at spaces", not trainer.split_by_whitespace),
        ("spaces ending pieces", trainer.treat_whitespace_as_suffix),
        ("pieces of spaces alone", trainer.allow_whitespace_only_pieces),
        ("user-defined symbols", any(piece.type == user_defined for piece in proto.pieces)),
        (f"model type {trainer.model_type}", trainer.model_type not in (1, 2))) if present]
    if missing or unsupported:
        logger.info("the sentencepiece model has %s: the saved tokenizer is a slow one (no offsets)",
                    f"{len(missing)} pieces the dictionary lacks" if missing else ", ".join(unsupported))
        return None
    # the dictionary's other symbols (madeupwords, specials the tokenizer does not read) keep their
    # ids under names no text matches (a word's pieces hold no inner ▁); the specials it reads keep
    # theirs, which transformers finds in the text before the model sees it
    specials = {dictionary.pad_word, dictionary.eos_word, dictionary.unk_word, "<mask>"}
    specials |= {dictionary.bos_word} if wrap_layout(pattern)[0] else set()
    scores = {piece.piece: piece.score for piece in pieces}
    unmatched = min(scores.values(), default=0.0)    # sentencepiece's lowest score: unknown text's stays
    names = [symbol if symbol in scores or symbol in specials else symbol + SPACE
             for symbol in dictionary.symbols]
    if trainer.model_type == 1:
        model = models.Unigram([(name, scores.get(name, unmatched)) for name in names],
                               unk_id=dictionary.unk(), byte_fallback=False)
    else:
        merges = generate_merges({piece.piece: i for i, piece in enumerate(proto.pieces)})
        model = models.BPE({name: i for i, name in enumerate(names)}, merges, unk_token=dictionary.unk_word,
                           fuse_unk=True, byte_fallback=False, dropout=None)
    tokenizer = Tokenizer(model)
    # sentencepiece's normalizer: its character map; leading spaces and runs of them dropped; spaces
    # escaped; the dummy prefix; then trailing ▁ dropped, a literal ▁ of the text included. Without
    # the space rules the prefix goes first, so that a text the map empties keeps it (Prepend leaves
    # an empty text as it is); with them the trailing ▁'s removal would empty it again
    charsmap = normalizer.precompiled_charsmap
    mapped = [normalizers.Precompiled(charsmap)] if charsmap else []
    prefix = [normalizers.Prepend(SPACE)] if normalizer.add_dummy_prefix else []
    escaped = normalizers.Replace(" ", SPACE)
    if normalizer.remove_extra_whitespaces:
        steps = [*mapped, normalizers.Replace(Regex(r"\A +"), ""), normalizers.Replace(Regex(" {2,}"), " "),
                 escaped, *prefix, normalizers.Replace(Regex(SPACE + r"+\z"), "")]
    else:
        steps = [*prefix, *mapped, escaped]
    tokenizer.normalizer = normalizers.Sequence(steps)
    # fairseq splits the pieces on Python's whitespace, which no piece in the dictionary holds: a
    # character of it that sentencepiece keeps is unknown text, which fairseq drops
    python_whitespace = "".join(f"\\x{{{c:x}}}" for c in range(0x3001) if chr(c).isspace() and c != 0x20)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never", split=True),
        pre_tokenizers.Split(Regex(f"[{python_whitespace}]+"), behavior="removed")])
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    fast = fast_tokenizer(tokenizer, dictionary, max_length, pattern, cls=FairseqSentencePieceTokenizerFast)
    fast.register_for_auto_class("AutoTokenizer")
    return fast


def gpt2_tokenizer(dictionary, files, pattern: str, max_length: int, target_dictionary=None):
    """The tokenizer of GPT-2's BPE files `files` (encoder.json, vocab.bpe: paths, or the URLs
    fairseq downloads them from, through fairseq's own cache) with the dictionaries' ids: a fast one
    (`gpt2_fast_tokenizer`) where one dictionary holds every GPT-2 token (RoBERTa's dict.txt, given to
    fairseq-preprocess as --srcdict), else
    `hf_momentum.tokenization_fairseq_gpt2.FairseqGPT2Tokenizer` (`dictionary_tokenizer`), which maps
    the tokens a dictionary lacks to `<unk>` and reads a second dictionary."""
    from fairseq.file_utils import cached_path

    from hf_momentum.tokenization_fairseq_gpt2 import FairseqGPT2Tokenizer
    local = []
    for flag_name, path in zip(("--gpt2-encoder-json", "--gpt2-vocab-bpe"), files):
        try:
            resolved = cached_path(str(path))           # a URL is downloaded once, into fairseq's cache
        except OSError as error:
            raise ValueError(f"{flag_name}: no file {path} ({error})") from None
        if resolved is None or not Path(resolved).is_file():
            raise ValueError(f"{flag_name}: no file {path}")
        local.append(resolved)
    if target_dictionary is None:
        fast = gpt2_fast_tokenizer(dictionary, *local, pattern, max_length)
        if fast is not None:
            return fast
    return dictionary_tokenizer(FairseqGPT2Tokenizer, local, dictionary, pattern, max_length,
                                target_dictionary)


def gpt2_fast_tokenizer(dictionary, encoder_json, vocab_bpe, pattern: str, max_length: int):
    """`hf_momentum.tokenization_fairseq_gpt2.FairseqGPT2TokenizerFast` (`fast_tokenizer`: offsets,
    word ids) of GPT-2's byte-level BPE whose vocabulary maps each GPT-2 token to the dictionary's
    index of its GPT-2 id, as HF's RoBERTa vocab.json does; None where the dictionary lacks a GPT-2
    token, which fairseq reads as `<unk>` and a BPE vocabulary cannot (its merges need every token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    from hf_momentum.tokenization_fairseq_gpt2 import FairseqGPT2TokenizerFast
    gpt2_ids, merges = models.BPE.read_file(str(encoder_json), str(vocab_bpe))
    vocab = {token: dictionary.indices.get(str(gpt2_id)) for token, gpt2_id in gpt2_ids.items()}
    missing = sum(index is None for index in vocab.values())
    if missing:
        logger.info("%d GPT-2 tokens are not in the dictionary (fairseq reads them as <unk>): the saved "
                    "tokenizer is a slow one (no offsets)", missing)
        return None
    # the dictionary's own symbols (specials, RoBERTa's madeupwords) keep their ids, which no merge makes
    digits = set(map(str, gpt2_ids.values()))
    vocab.update({symbol: index for index, symbol in enumerate(dictionary.symbols)
                  if symbol not in digits and symbol not in vocab})
    if len(vocab) != len(dictionary) or len(set(vocab.values())) != len(vocab):
        return None         # an index no token or two tokens have: len(tokenizer) would not be the model's
    tokenizer = Tokenizer(models.BPE(vocab, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = fast_tokenizer(tokenizer, dictionary, max_length, pattern,
                          offsets=processors.ByteLevel(trim_offsets=True, add_prefix_space=False),
                          cls=FairseqGPT2TokenizerFast)
    fast.register_for_auto_class("AutoTokenizer")
    return fast


@dataclass
class Moses:
    """fairseq's `--tokenizer moses`: the languages of its tokenizer and detokenizer (None: the
    translation task's, else English, `with_task_languages`), and whether it splits at dashes and
    escapes (not --moses-no-dash-splits, not --moses-no-escape)."""
    source_lang: Optional[str] = None
    target_lang: Optional[str] = None
    dash_splits: bool = True
    escape: bool = True

    def with_task_languages(self, task) -> "Moses":
        """These options with each language left None taken from the task's config (`task`: its
        source_lang / target_lang), or English, as fairseq's --source-lang / --target-lang give it."""
        def language(given, name):
            return given or (None if task is None else task.get(name)) or "en"
        return dataclasses.replace(self, source_lang=language(self.source_lang, "source_lang"),
                                   target_lang=language(self.target_lang, "target_lang"))

    @classmethod
    def of_task(cls, tokenizer) -> Optional["Moses"]:
        """The Moses of a checkpoint's `tokenizer` config, or None where it names another one. Its
        languages are what fairseq hands sacremoses, None included (a translation task's language
        pair left to be inferred from the data's file names)."""
        if tokenizer is None or tokenizer.get("_name") != "moses":
            return None
        return cls(tokenizer.get("source_lang", "en"), tokenizer.get("target_lang", "en"),
                   not tokenizer.get("moses_no_dash_splits", False),
                   not tokenizer.get("moses_no_escape", False))


@dataclass
class SubwordNMT:
    """fairseq's `--bpe subword_nmt`: subword-nmt's codes file and the separator that ends a piece a
    word continues; or its `--bpe fastbpe` (`of_fastbpe`), which segments as subword-nmt does with the
    same merges. `name` is the fairseq BPE it stands for, `flag` the converter's option that gives it."""
    codes: Path
    separator: str = "@@"
    name: str = "subword_nmt"
    flag: str = "--bpe-codes"

    @classmethod
    def of_fastbpe(cls, codes: Path) -> "SubwordNMT":
        """fastBPE's codes as subword-nmt's: fastBPE writes a merge a line, `left right count`, in the
        order it applies them, with `</w>` ending a word's last symbol; subword-nmt's version 0.2
        codes are the same pairs in the same order without the counts. Both split a word into
        characters, `</w>` on the last, merge the lowest-ranked pair's every non-overlapping
        occurrence from the left until no pair is a code, then join the pieces with `@@ ` (fairseq's
        fastbpe has no other separator), so the saved tokenizer needs subword-nmt, not fastBPE.
        The converted codes go to a temporary file, which the saved tokenizer copies as its own."""
        import tempfile
        if not Path(codes).is_file():
            raise ValueError(f"--fastbpe-codes: no file {codes}")
        pairs = []
        with open(codes, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                fields = line.rstrip("\r\n").split(" ")
                if len(fields) != 3 or not fields[2].isdigit() or not all(fields[:2]):
                    raise ValueError(f"--fastbpe-codes: {codes}, line {number}: {line.strip()!r} is not "
                                     "fastBPE's 'left right count'")
                pairs.append(f"{fields[0]} {fields[1]}\n")
        converted = Path(tempfile.mkdtemp()) / "bpecodes"
        converted.write_text("#version: 0.2\n" + "".join(pairs), encoding="utf-8")
        return cls(converted, "@@", name="fastbpe", flag="--fastbpe-codes")


def subword_nmt_tokenizer(dictionary, bpe: Optional[SubwordNMT], moses: Optional[Moses], pattern: str,
                          max_length: int, target_dictionary=None):
    """`hf_momentum.tokenization_fairseq_subword_nmt.FairseqSubwordNMTTokenizer`: Moses (or not), then
    subword-nmt's BPE of `bpe.codes` (or none: Moses' words), with the dictionaries' ids
    (`dictionary_tokenizer`)."""
    import importlib.util
    for package, pip_name, needed_by in (("subword_nmt", "subword-nmt", bpe and bpe.flag),
                                         ("sacremoses", "sacremoses", moses and "--tokenizer moses")):
        if needed_by and importlib.util.find_spec(package) is None:
            raise ValueError(f"{needed_by} needs the {pip_name} package: pip install {pip_name}")
    if bpe is not None and not Path(bpe.codes).is_file():
        raise ValueError(f"{bpe.flag}: no file {bpe.codes}")
    from hf_momentum.tokenization_fairseq_subword_nmt import FairseqSubwordNMTTokenizer
    moses_options = {} if moses is None else dict(
        moses=True, moses_source_lang=moses.source_lang, moses_target_lang=moses.target_lang,
        moses_dash_splits=moses.dash_splits, moses_escape=moses.escape)
    return dictionary_tokenizer(FairseqSubwordNMTTokenizer, [None if bpe is None else bpe.codes], dictionary,
                                pattern, max_length, target_dictionary,
                                bpe_separator="@@" if bpe is None else bpe.separator, **moses_options)


def holds_subwords(dictionary) -> bool:
    """Whether the dictionary's symbols are subword pieces (sentencepiece's `▁`, subword-nmt's `@@`)
    or GPT-2 BPE ids (decimal numbers, RoBERTa's dictionary): the data was segmented before
    fairseq-preprocess, so raw words are not its symbols."""
    symbols = [symbol for symbol in dictionary.symbols[dictionary.nspecial:]
               if not symbol.startswith("madeupword") and symbol != "<mask>"]   # fairseq's padding symbols
    return any(symbol.startswith("\u2581") or symbol.endswith("@@") for symbol in symbols) or \
        (bool(symbols) and all(symbol.isdigit() for symbol in symbols))


def saved_tokenizer(dictionary, config, bpe, sentencepiece_model: Optional[Path], target_dictionary=None,
                    gpt2_files=None, subword_nmt: Optional[SubwordNMT] = None, moses: Optional[Moses] = None,
                    task_tokenizer=None, sample=None):
    """The tokenizer to save beside the converted model, or None (with a warning saying why): the
    sentencepiece model's (given, or the task's --bpe sentencepiece), GPT-2's BPE (`gpt2_files`:
    encoder.json and vocab.bpe given, or the task's --bpe gpt2 files), subword-nmt's BPE (given, or
    the task's --bpe subword_nmt codes; fastBPE's, the task's --bpe fastbpe, as subword-nmt's) after
    Moses where the text was Moses-tokenized (`moses` given, or the task's --tokenizer moses,
    `task_tokenizer`), else a word-level one where the dictionary holds words (Moses' words with
    Moses). A translation model's target dictionary, where it differs from the source's, is the
    tokenizer's second vocabulary (text_target= and decoding). `sample`: a sentence_prediction
    classifier's (--init-token, --separator-token) (`wrapping`)."""
    if target_dictionary is not None and target_dictionary.symbols == dictionary.symbols:
        target_dictionary = None
    from transformers.tokenization_utils_base import VERY_LARGE_INTEGER
    name = None if bpe is None else bpe.get("_name")
    if sum(given is not None for given in (sentencepiece_model, gpt2_files, subword_nmt)) > 1:
        raise ValueError("--sentencepiece-model, --gpt2-encoder-json, --bpe-codes and --fastbpe-codes: the "
                         "data had one BPE; pass one")
    if sentencepiece_model is None and gpt2_files is None and subword_nmt is None:   # the task's own BPE
        if name == "sentencepiece":
            sentencepiece_model = Path(bpe.get("sentencepiece_model"))
        elif name == "gpt2":
            gpt2_files = (bpe.get("gpt2_encoder_json"), bpe.get("gpt2_vocab_bpe"))
        elif name == "subword_nmt":
            subword_nmt = SubwordNMT(Path(bpe.get("bpe_codes")), bpe.get("bpe_separator", "@@"))
        elif name == "fastbpe":
            subword_nmt = SubwordNMT.of_fastbpe(Path(bpe.get("bpe_codes")))
    task_moses = Moses.of_task(task_tokenizer)
    task_tokenizer_name = None if task_tokenizer is None else task_tokenizer.get("_name")
    if moses is not None and (sentencepiece_model is not None or gpt2_files is not None):
        raise ValueError("--tokenizer moses: the saved tokenizer runs Moses before subword-nmt's BPE "
                         "(--bpe-codes), fastBPE's (--fastbpe-codes) or on a dictionary of words, not before "
                         "sentencepiece or GPT-2's BPE")
    if moses is None and task_tokenizer_name not in (None, "space"):
        if task_moses is None or sentencepiece_model is not None or gpt2_files is not None:
            logger.warning("the task used --tokenizer %s before its BPE: no tokenizer is saved; encode text "
                           "as fairseq does", task_tokenizer_name)
            return None
        moses = task_moses
    pattern = wrapping(dictionary, config, sample)
    if pattern is None:
        logger.warning("--init-token %s / --separator-token %s: the saved tokenizer puts <s> or nothing "
                       "before a text and </s> or nothing between a pair; no tokenizer is saved: encode as "
                       "fairseq does", *sample)
        return None
    max_length = getattr(config, "max_position_embeddings", VERY_LARGE_INTEGER)   # an LSTM has no limit
    if gpt2_files is not None:
        if name not in (None, "gpt2"):
            raise ValueError(f"--gpt2-encoder-json: the task used --bpe {name}, not gpt2")
        return gpt2_tokenizer(dictionary, gpt2_files, pattern, max_length, target_dictionary)
    if sentencepiece_model is not None:
        if name not in (None, "sentencepiece"):
            raise ValueError(f"--sentencepiece-model: the task used --bpe {name}, not sentencepiece")
        if not Path(sentencepiece_model).is_file():
            raise ValueError(f"--sentencepiece-model: no file {sentencepiece_model}")
        return sentencepiece_tokenizer(dictionary, sentencepiece_model, pattern, max_length,
                                       target_dictionary)
    if subword_nmt is not None:
        if name not in (None, subword_nmt.name):
            raise ValueError(f"{subword_nmt.flag}: the task used --bpe {name}, not {subword_nmt.name}")
        return subword_nmt_tokenizer(dictionary, subword_nmt, moses, pattern, max_length, target_dictionary)
    if name is not None:
        logger.warning("the task used --bpe %s: no tokenizer is saved; encode text as fairseq does "
                       "(BPE, then the dictionary's ids)", name)
        return None
    if holds_subwords(dictionary) or (target_dictionary is not None and holds_subwords(target_dictionary)):
        logger.warning("the dictionary holds subword pieces or GPT-2 BPE ids (the data was segmented "
                       "before fairseq-preprocess): no tokenizer is saved, as a word-level one would read "
                       "raw words as <unk>; pass --sentencepiece-model with the sentencepiece model that "
                       "segmented the data, --bpe-codes with subword-nmt's codes or --fastbpe-codes with "
                       "fastBPE's (and --tokenizer moses where Moses tokenized the text first), or "
                       "--gpt2-encoder-json and "
                       "--gpt2-vocab-bpe with GPT-2's BPE files")
        return None
    if moses is not None:
        return subword_nmt_tokenizer(dictionary, None, moses, pattern, max_length, target_dictionary)
    if target_dictionary is not None:
        from hf_momentum.tokenization_fairseq_dictionary import FairseqWordTokenizer
        return dictionary_tokenizer(FairseqWordTokenizer, [], dictionary, pattern, max_length,
                                    target_dictionary)
    return word_tokenizer(dictionary, max_length, pattern)


def convert(checkpoint, output_dir, head: Optional[str] = None, push_to_hub: bool = False,
            hub_model_id: Optional[str] = None, sentencepiece_model: Optional[Path] = None, gpt2_files=None,
            subword_nmt: Optional[SubwordNMT] = None, moses: Optional[Moses] = None):
    """Write the converted model and its tokenizer (`saved_tokenizer`) to `output_dir`; returns the
    model."""
    model, args, dictionary, labels, cfg, target_dictionary = load(checkpoint)
    regression = bool(getattr(cfg.task, "regression_target", False))
    if regression:
        labels = None       # fairseq's regression task fills its label dictionary with the input's
    converted = to_transformers(model, args, dictionary, head, labels, target_dictionary, regression)
    if moses is not None:
        moses = moses.with_task_languages(cfg.task)
    # a classifier's samples are its task's (sentence_prediction, sentence_ranking), its LM head's masked_lm's
    classifier = type(converted).__name__.endswith("ForSequenceClassification")
    sample = (cfg.task.get("init_token"), cfg.task.get("separator_token")) \
        if classifier and "init_token" in cfg.task else None
    tokenizer = saved_tokenizer(dictionary, converted.config, cfg.bpe, sentencepiece_model, target_dictionary,
                                gpt2_files, subword_nmt, moses, cfg.tokenizer, sample)
    converted.save_pretrained(output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    if push_to_hub:
        converted.push_to_hub(hub_model_id)
        if tokenizer is not None:
            tokenizer.push_to_hub(hub_model_id)
    return converted


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fairseq_momentum.convert_to_hf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path,
                        help="a fairseq checkpoint (.pt) of momentum_transformer_lm, momentum_transformer, "
                             "momentum_roberta, momentum_lstm_lm, momentum_lstm or fairseq's lstm")
    parser.add_argument("output_dir", type=Path, help="the transformers model folder to write")
    parser.add_argument("--head", default=None,
                        help="of a momentum_roberta: the classification head to convert (default: its only "
                             "one), or masked_lm for the LM head")
    parser.add_argument("--sentencepiece-model", type=Path, default=None,
                        help="the sentencepiece model that segmented the training data (when that "
                             "happened before fairseq-preprocess; a task's --bpe sentencepiece model is "
                             "found itself): the saved tokenizer segments with it and maps pieces to the "
                             "dictionary's ids")
    parser.add_argument("--gpt2-encoder-json", type=Path, default=None,
                        help="with --gpt2-vocab-bpe: GPT-2's BPE files that encoded the training data (when "
                             "that happened before fairseq-preprocess, as RoBERTa's examples do; a task's "
                             "--bpe gpt2 files are found themselves): the saved tokenizer encodes with them "
                             "and maps GPT-2 ids to the dictionary's")
    parser.add_argument("--gpt2-vocab-bpe", type=Path, default=None, help="see --gpt2-encoder-json")
    parser.add_argument("--bpe-codes", type=Path, default=None,
                        help="subword-nmt's BPE codes that segmented the training data (when that happened "
                             "before fairseq-preprocess, as fairseq's translation examples do; a task's "
                             "--bpe subword_nmt codes are found themselves): the saved tokenizer segments "
                             "with them and maps pieces to the dictionary's ids")
    parser.add_argument("--bpe-separator", default="@@", help="with --bpe-codes: subword-nmt's separator")
    parser.add_argument("--fastbpe-codes", type=Path, default=None,
                        help="fastBPE's codes that segmented the training data (when that happened before "
                             "fairseq-preprocess; a task's --bpe fastbpe codes are found themselves): the "
                             "saved tokenizer segments as fastBPE does, with subword-nmt on the same merges")
    parser.add_argument("--tokenizer", choices=["moses"], default=None,
                        help="moses: the text was Moses-tokenized before its BPE (or, without BPE, into the "
                             "dictionary's words); the saved tokenizer does the same, and detokenizes "
                             "decoded text (a task's --tokenizer moses is found itself)")
    parser.add_argument("--moses-source-lang", default=None,
                        help="with --tokenizer moses: the language Moses tokenizes (default: a translation "
                             "task's source language, else en)")
    parser.add_argument("--moses-target-lang", default=None,
                        help="with --tokenizer moses: the language Moses detokenizes (default: a translation "
                             "task's target language, else en)")
    parser.add_argument("--moses-no-dash-splits", action="store_true", help="as fairseq's")
    parser.add_argument("--moses-no-escape", action="store_true", help="as fairseq's")
    parser.add_argument("--push_to_hub", action="store_true")
    parser.add_argument("--hub_model_id", default=None,
                        help="user/name on the Hub; required by --push_to_hub")
    args = parser.parse_args(argv)
    if args.push_to_hub and not args.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id")
    if not args.checkpoint.is_file():
        parser.error(f"checkpoint: no file {args.checkpoint}")
    if (args.gpt2_encoder_json is None) != (args.gpt2_vocab_bpe is None):
        parser.error("--gpt2-encoder-json and --gpt2-vocab-bpe: pass both (GPT-2's BPE is the two files)")
    gpt2_files = None if args.gpt2_encoder_json is None else (args.gpt2_encoder_json, args.gpt2_vocab_bpe)
    moses_options = (args.moses_source_lang, args.moses_target_lang, args.moses_no_dash_splits,
                     args.moses_no_escape)
    if args.tokenizer is None and any(moses_options):
        parser.error("--moses-source-lang, --moses-target-lang, --moses-no-dash-splits, --moses-no-escape: "
                     "options of --tokenizer moses, which is not given")
    moses = None if args.tokenizer is None else Moses(args.moses_source_lang, args.moses_target_lang,
                                                      not args.moses_no_dash_splits, not args.moses_no_escape)
    if args.bpe_codes is not None and args.fastbpe_codes is not None:
        parser.error("--bpe-codes and --fastbpe-codes: the data had one BPE; pass one")
    if args.bpe_separator != "@@" and args.bpe_codes is None:
        parser.error("--bpe-separator: an option of --bpe-codes (fastBPE's separator is always @@)")
    try:
        subword_nmt = None if args.bpe_codes is None else SubwordNMT(args.bpe_codes, args.bpe_separator)
        if args.fastbpe_codes is not None:
            subword_nmt = SubwordNMT.of_fastbpe(args.fastbpe_codes)
        convert(args.checkpoint, args.output_dir, args.head, args.push_to_hub, args.hub_model_id,
                args.sentencepiece_model, gpt2_files, subword_nmt, moses)
    except ValueError as error:
        parser.error(str(error))
    print(args.output_dir)


if __name__ == "__main__":
    main()
