"""A fairseq `momentum_lstm` translation model (any preset and cell), or fairseq's own `lstm` (its
nn.LSTM and nn.LSTMCell layers are the plain cell, `cell="lstm"`, with the same gate layout), as a
transformers `MomentumLSTMSeq2SeqForConditionalGeneration`: the config and the weights under the
transformers model's names (`convert_to_hf` saves them).

The parts map one to one: the embeddings (one matrix with --share-all-embeddings, the decoder's and
the output projection's with --share-decoder-input-output-embed), the encoder's MomentumLSTM stack
(bidirectional included), the decoder's per-layer cells as one stack, the projections of the
encoder's final states where its width differs from the decoder's, the attention, the projection to
--decoder-out-embed-dim, the output projection with its bias. The cell and its hyperparameters are
read from the layers, the dropouts from the modules, so the converted model gives fairseq's logits
at eval time. An adaptive softmax (--criterion adaptive_loss) has no counterpart and is refused.
"""
from .convert_lstm_lm import HYPERPARAMETERS, LAYER_PARAMETERS


def check_lstm_translation(args, model, dictionary, target_dictionary) -> None:
    """ValueError naming what the transformers model cannot hold."""
    if model.decoder.adaptive_softmax is not None:
        raise ValueError(f"--adaptive-softmax-cutoff {args.adaptive_softmax_cutoff} (with --criterion "
                         "adaptive_loss): a momentum_lstm_seq2seq model has no adaptive softmax; convert a "
                         "model trained with a full softmax")
    for name in ("pad", "eos"):
        source, target = getattr(dictionary, name)(), getattr(target_dictionary, name)()
        if source != target:
            raise ValueError(f"the source dictionary's {name} id {source} differs from the target's "
                             f"{target}: a momentum_lstm_seq2seq config has one")


def lstm_translation_config(args, model, dictionary, target_dictionary):
    """The MomentumLSTMSeq2SeqConfig of a fairseq momentum_lstm (`args` its parsed options);
    `</s>` starts the decoder, as fairseq's generator does."""
    from hf_momentum import MomentumLSTMSeq2SeqConfig
    encoder, decoder = model.encoder, model.decoder
    rnn = encoder_stack(model)
    # a hyperparameter the cell does not read is None on the layer, and must stay the config's default
    hyper = {name: getattr(rnn, name, None) for name in HYPERPARAMETERS}
    hyper = {name: value for name, value in hyper.items() if value is not None}
    cell = dict(cell=rnn.cell, restart=rnn.restart) if hasattr(rnn, "cell") else dict(cell="lstm")
    return MomentumLSTMSeq2SeqConfig(
        vocab_size=len(dictionary), decoder_vocab_size=len(target_dictionary),
        encoder_embedding_size=encoder.embed_tokens.embedding_dim, encoder_hidden_size=encoder.hidden_size,
        encoder_bidirectional=bool(encoder.bidirectional),
        decoder_embedding_size=decoder.embed_tokens.embedding_dim, hidden_size=decoder.hidden_size,
        decoder_output_size=args.decoder_out_embed_dim, num_hidden_layers=encoder.num_layers,
        attention=decoder.attention is not None, **cell, **hyper,
        encoder_dropout_in=encoder.dropout_in_module.p, encoder_dropout_out=encoder.dropout_out_module.p,
        decoder_dropout_in=decoder.dropout_in_module.p, decoder_dropout_out=decoder.dropout_out_module.p,
        tie_word_embeddings=bool(decoder.share_input_output_embed),
        share_encoder_decoder_embeddings=bool(args.share_all_embeddings),
        pad_token_id=target_dictionary.pad(), bos_token_id=target_dictionary.bos(),
        eos_token_id=target_dictionary.eos(), decoder_start_token_id=target_dictionary.eos())


def encoder_stack(model):
    """The encoder's LSTM stack: a MomentumLSTM (momentum_lstm's adapter holds it as `rnn`) or an
    nn.LSTM (fairseq's lstm)."""
    return getattr(model.encoder.lstm, "rnn", model.encoder.lstm)


def decoder_cell_weights(layer) -> dict:
    """{name (weight_ih, ...): tensor} of one decoder layer: a one-layer MomentumLSTM's `_l0` weights
    (momentum_lstm's adapter holds it as `rnn`), or an nn.LSTMCell's."""
    rnn = getattr(layer, "rnn", None)
    held = {name: getattr(layer, name, None) if rnn is None else getattr(rnn, f"{name}_l0", None)
            for name in LAYER_PARAMETERS}
    return {name: weight for name, weight in held.items() if weight is not None}


def module_weights(prefix: str, module) -> dict:
    return {f"{prefix}.{name}": tensor.detach() for name, tensor in module.state_dict().items()}


def lstm_translation_state_dict(model, config) -> dict:
    """The fairseq model's weights under the transformers model's names: decoder layer k (a
    one-layer MomentumLSTM or an nn.LSTMCell) is layer k of the decoder's stack."""
    encoder, decoder = model.encoder, model.decoder
    state = {"model.encoder.embed_tokens.weight": encoder.embed_tokens.weight.detach(),
             "model.decoder.embed_tokens.weight": decoder.embed_tokens.weight.detach(),
             **module_weights("model.encoder.lstm", encoder_stack(model))}
    for k, layer in enumerate(decoder.layers):
        for name, parameter in decoder_cell_weights(layer).items():
            state[f"model.decoder.lstm.{name}_l{k}"] = parameter.detach()
    for part in ("encoder_hidden_proj", "encoder_cell_proj", "attention", "additional_fc"):
        module = getattr(decoder, part, None)
        if module is not None:
            state.update(module_weights(f"model.decoder.{part}", module))
    if not config.tie_word_embeddings:
        state.update(module_weights("lm_head", decoder.fc_out))
    return state
