"""A fairseq momentum transformer LM as a transformers model: a checkpoint of
`momentum_transformer_lm` or `linear_transformer_lm` (any preset, hybrids included) becomes a
`MomentumTransformerForCausalLM` folder (config, safetensors, the modeling code for
`trust_remote_code`, a model card) with the same logits, which `from_pretrained` loads, `generate`
continues and `push_to_hub` publishes.

    python -m fairseq_momentum.convert_to_hf checkpoints/checkpoint_best.pt hf-model \\
        [--push_to_hub --hub_model_id you/name]

The layers map one to one (`plugins` holds the attention and the connection for both). fairseq's
token embedding scale (√d unless --no-scale-embedding) is the config's `scale_embedding`; its
positions (sinusoidal, or learned with fairseq's offset of padding_idx + 1) become the learned
table of `max_position_embeddings` = the model's --max-target-positions rows, so a sinusoidal model
converted and then fine-tuned trains its positions. The dictionary's ids are kept (bos is fairseq's
`</s>`, which starts every LM sample); where the task used no BPE, the dictionary also becomes a
word-level tokenizer saved beside the model. What the transformers model has no counterpart for
(adaptive input or softmax, character embeddings, projections between sizes, an embedding layer
norm, the scale_* options, ...) is refused, naming the option.
"""
import argparse
import logging
from pathlib import Path
from typing import Optional

import torch

from .configs import as_namespace, flag

logger = logging.getLogger(__name__)

ARCHS = ("momentum_transformer_lm",)
# fairseq's activation_fn → transformers' ACT2FN name of the same function
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_fast": "gelu_pytorch_tanh",
               "gelu_accurate": "gelu_pytorch_tanh", "tanh": "tanh", "linear": "linear"}
# options that change the model in ways MomentumTransformerConfig has no counterpart for (when set)
UNSUPPORTED = ("adaptive_input", "adaptive_softmax_cutoff", "character_embeddings", "layernorm_embedding",
               "no_decoder_final_norm", "no_token_positional_embeddings", "scale_attn", "scale_fc",
               "scale_heads", "scale_resids", "tie_adaptive_weights")
LAYER_PARTS = {"self_attn_layer_norm": "attn_norm", "self_attn.q_proj": "attention.q_proj",
               "self_attn.k_proj": "attention.k_proj", "self_attn.v_proj": "attention.v_proj",
               "self_attn.o_proj": "attention.o_proj", "self_attn.out_proj": "attention.o_proj",
               "final_layer_norm": "mlp_norm", "fc1": "mlp.fc_in", "fc2": "mlp.fc_out"}


def check_convertible(args, model) -> None:
    """ValueError naming the first option of `args` that MomentumTransformerForCausalLM cannot
    represent."""
    if type(model).__name__ != "MomentumTransformerLanguageModel":
        raise ValueError(f"checkpoint: converts {', '.join(ARCHS)} (and its presets), got "
                         f"{type(model).__name__} (--arch {getattr(args, 'arch', '?')})")
    for name in UNSUPPORTED:
        value = getattr(args, name, None)
        if value not in (None, False, 0, ""):
            raise ValueError(f"{flag(name)} {value!r}: a momentum_transformer model has no counterpart; "
                             f"convert a model trained without {flag(name)}")
    for name in ("decoder_input_dim", "decoder_output_dim"):
        if getattr(args, name, args.decoder_embed_dim) != args.decoder_embed_dim:
            raise ValueError(f"{flag(name)} {getattr(args, name)} differs from --decoder-embed-dim "
                             f"{args.decoder_embed_dim}: a momentum_transformer model has no projection "
                             "between them")
    if args.activation_fn not in ACTIVATIONS:
        raise ValueError(f"--activation-fn {args.activation_fn!r}: convertible ones are "
                         f"{', '.join(ACTIVATIONS)}")


def hf_config(args, dictionary, model):
    """The MomentumTransformerConfig of the fairseq LM `model` built from `args`."""
    from hf_momentum import MomentumTransformerConfig
    decoder = model.decoder
    layers = len(decoder.layers)
    layer_types = list(getattr(args, "layer_types", None) or ["linear_attention"] * layers)
    connection_fields = {"connection_momentum": "connection_momentum",
                         "connection_step_size": "connection_step_size", "connection_delta": "adaptive_delta"}
    connection = {hf: getattr(args, fs) for fs, hf in connection_fields.items()
                  if getattr(args, fs, None) is not None}
    return MomentumTransformerConfig(
        vocab_size=len(dictionary), hidden_size=args.decoder_embed_dim, num_hidden_layers=layers,
        num_attention_heads=args.decoder_attention_heads, intermediate_size=args.decoder_ffn_embed_dim,
        hidden_act=ACTIVATIONS[args.activation_fn], attention_momentum=args.attention_momentum,
        attention_step_size=args.attention_step_size, attention_feature_map=args.feature_map,
        connection=args.connection, **connection, max_position_embeddings=decoder.max_positions(),
        embedding_dropout=args.dropout, attention_dropout=args.dropout, hidden_dropout=args.dropout,
        activation_dropout=getattr(args, "activation_dropout", 0.0) or 0.0,
        layer_norm="pre" if args.decoder_normalize_before else "post",
        layer_norm_eps=decoder.layers[0].self_attn_layer_norm.eps, is_causal=True,
        pad_token_id=dictionary.pad(), bos_token_id=dictionary.eos(), eos_token_id=dictionary.eos(),
        tie_word_embeddings=bool(args.share_decoder_input_output_embed),
        scale_embedding=not args.no_scale_embedding, layer_types=layer_types)


def position_table(decoder, rows: int, dtype) -> torch.Tensor:
    """fairseq's position embeddings of positions 1..rows (fairseq numbers them from padding_idx + 1)
    as a (rows, dim) table: the learned rows, or the sinusoid computed as fairseq computes it."""
    from fairseq.modules import SinusoidalPositionalEmbedding
    positions = decoder.embed_positions
    start = positions.padding_idx + 1
    if isinstance(positions, SinusoidalPositionalEmbedding):
        table = SinusoidalPositionalEmbedding.get_embedding(start + rows, positions.embedding_dim,
                                                            positions.padding_idx)
    else:
        table = positions.weight.detach()
    return table[start:start + rows].to(dtype)


def hf_state_dict(model, config) -> dict:
    """The weights of the fairseq LM `model` under MomentumTransformerForCausalLM's names."""
    decoder = model.decoder
    dtype = decoder.embed_tokens.weight.dtype
    state = {"model.embed_tokens.weight": decoder.embed_tokens.weight.detach(),
             "model.embed_positions.weight": position_table(decoder, config.max_position_embeddings, dtype)}
    for i, layer in enumerate(decoder.layers):
        for name, tensor in layer.state_dict().items():
            part, _, leaf = name.rpartition(".")
            if part not in LAYER_PARTS:
                raise ValueError(f"decoder.layers.{i}.{name}: no counterpart in a momentum_transformer layer")
            state[f"model.layers.{i}.{LAYER_PARTS[part]}.{leaf}"] = tensor
    if decoder.layer_norm is not None:
        state["model.norm.weight"] = decoder.layer_norm.weight.detach()
        state["model.norm.bias"] = decoder.layer_norm.bias.detach()
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = decoder.output_projection.weight.detach()
    return state


def to_transformers(model, args, dictionary):
    """MomentumTransformerForCausalLM with the weights of the fairseq LM `model` (eval mode)."""
    from hf_momentum import MomentumTransformerForCausalLM
    check_convertible(args, model)
    config = hf_config(args, dictionary, model)
    converted = MomentumTransformerForCausalLM(config).to(decoder_dtype(model))
    missing, unexpected = converted.load_state_dict(hf_state_dict(model, config), strict=False)
    missing = [name for name in missing if not (config.tie_word_embeddings and name == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights that do not map: missing {missing}, unexpected {unexpected}")
    return converted.eval()


def decoder_dtype(model):
    return model.decoder.embed_tokens.weight.dtype


def word_tokenizer(dictionary):
    """A whitespace word-level tokenizer with the dictionary's ids (for a task without BPE)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {symbol: i for i, symbol in enumerate(dictionary.symbols)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=dictionary.unk_word))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eos = dictionary.eos_word
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token=dictionary.unk_word,
                                   pad_token=dictionary.pad_word, eos_token=eos, bos_token=eos)


def load(checkpoint):
    """(fairseq model, its args, its dictionary, the task's BPE or None) of a checkpoint file,
    through fairseq's loader (the user-dir's checks on what the file may hold included)."""
    from fairseq import checkpoint_utils
    [model], cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    return model.eval(), as_namespace(cfg.model), task.target_dictionary, cfg.bpe


def convert(checkpoint, output_dir, push_to_hub: bool = False, hub_model_id: Optional[str] = None):
    """Write the converted model (and, without BPE, the tokenizer) to `output_dir`; returns the model."""
    model, args, dictionary, bpe = load(checkpoint)
    converted = to_transformers(model, args, dictionary)
    converted.save_pretrained(output_dir)
    tokenizer = None
    if bpe is None:
        tokenizer = word_tokenizer(dictionary)
        tokenizer.save_pretrained(output_dir)
    else:
        logger.warning("the task used --bpe %s: no tokenizer is saved; encode text as fairseq does "
                       "(BPE, then the dictionary's ids)", bpe.get("_name") if hasattr(bpe, "get") else bpe)
    if push_to_hub:
        converted.push_to_hub(hub_model_id)
        if tokenizer is not None:
            tokenizer.push_to_hub(hub_model_id)
    return converted


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fairseq_momentum.convert_to_hf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a fairseq checkpoint (.pt) of momentum_transformer_lm")
    parser.add_argument("output_dir", type=Path, help="the transformers model folder to write")
    parser.add_argument("--push_to_hub", action="store_true")
    parser.add_argument("--hub_model_id", default=None,
                        help="user/name on the Hub; required by --push_to_hub")
    args = parser.parse_args(argv)
    if args.push_to_hub and not args.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id")
    if not args.checkpoint.is_file():
        parser.error(f"checkpoint: no file {args.checkpoint}")
    try:
        convert(args.checkpoint, args.output_dir, args.push_to_hub, args.hub_model_id)
    except ValueError as error:
        parser.error(str(error))
    print(args.output_dir)


if __name__ == "__main__":
    main()
