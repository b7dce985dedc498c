"""A fairseq `momentum_lstm_lm` (any preset and cell) as a transformers `MomentumLSTMForCausalLM`:
the config and the weights under the transformers model's names (`convert_to_hf` saves them).

The AWD stack maps layer by layer: layers of `--decoder-hidden-size`, then a last one of
`--decoder-out-embed-dim` (`last_hidden_size`; the embedding's width in momentum_lstm_lm_ptb, so
the embeddings are tied), the cell and its hyperparameters as the layers hold them, the output
projection with its bias (`lm_head_bias`). AWD-LSTM's regularisers map one to one (`locked_dropout`:
--decoder-dropout-in, -hidden and -out become `embedding_dropout`, `dropout` and `output_dropout`;
--weight-drop `weight_drop`; --decoder-embed-dropout `word_dropout`), so the converted model gives
fairseq's logits at eval time and trains as fairseq's under the same seed.
"""
HYPERPARAMETERS = ("momentum", "step_size", "beta", "eps")
LAYER_PARAMETERS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def lstm_lm_config(args, model, dictionary):
    """The MomentumLSTMConfig of a fairseq momentum_lstm_lm (`args` its parsed options)."""
    from hf_momentum import MomentumLSTMConfig
    layers = model.decoder.rnn.layers
    first = layers[0]
    # a hyperparameter the cell does not read is None on the layer, and must stay the config's default
    hyper = {name: getattr(first, name) for name in HYPERPARAMETERS if getattr(first, name) is not None}
    last = layers[-1].hidden_size
    return MomentumLSTMConfig(
        vocab_size=len(dictionary), embedding_size=first.input_size,
        hidden_size=first.hidden_size if len(layers) > 1 else last, num_hidden_layers=len(layers),
        last_hidden_size=last, cell=first.cell, restart=first.restart, **hyper,
        locked_dropout=True, dropout=args.decoder_dropout_hidden, embedding_dropout=args.decoder_dropout_in,
        output_dropout=args.decoder_dropout_out, weight_drop=args.weight_drop,
        word_dropout=args.decoder_embed_dropout,
        lm_head_bias=model.decoder.output_projection.bias is not None,
        tie_word_embeddings=bool(args.share_decoder_input_output_embed),
        pad_token_id=dictionary.pad(), bos_token_id=dictionary.eos(), eos_token_id=dictionary.eos())


def lstm_lm_state_dict(model, config) -> dict:
    """The fairseq model's weights under the transformers model's names: layer k of the AWD stack
    (a one-layer MomentumLSTM each) is layer k of `model.lstm`, or its `top` when the last layer
    has its own width."""
    decoder = model.decoder
    state = {"model.embed_tokens.weight": decoder.embed_tokens.weight.detach()}
    layers = decoder.rnn.layers
    top = config.last_hidden_size != config.hidden_size
    for k, layer in enumerate(layers):
        prefix, index = ("model.lstm.top", 0) if top and k == len(layers) - 1 else ("model.lstm", k)
        for name in LAYER_PARAMETERS:
            parameter = getattr(layer, f"{name}_l0", None)
            if parameter is not None:
                state[f"{prefix}.{name}_l{index}"] = parameter.detach()
    projection = decoder.output_projection
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = projection.weight.detach()
    if projection.bias is not None:
        state["lm_head.bias"] = projection.bias.detach()
    return state
