"""fairseq_momentum.convert_to_hf on momentum_lstm_lm: the AWD-LSTM language model becomes a
transformers MomentumLSTMForCausalLM with fairseq's logits (float64; every cell, the PTB preset's
last layer of the embedding's width with tied embeddings, untied, one layer, a last layer wider than
the others), on padded batches row by row; greedy generate() continues a prompt as fairseq's own
argmax does; AWD's training-time regularisers are named in a warning; and through the CLIs:
fairseq-train, the converter, then transformers alone (remote code, the saved tokenizer, the
text-generation pipeline)."""
import logging

import pytest
import torch
from helpers.fairseq_cli import (
    build_model,
    cell_flags,
    lm_args,
    preprocess_lm,
    random_tokens,
    train,
    write_lm_text,
)
from test_fairseq_to_hf import (
    assert_greedy_continuation,
    assert_loads_alone_as_a_causal_lm,
    assert_padded_rows_alone,
    run_converter,
)

import hf_momentum  # noqa: F401  (registers the model types with the Auto classes)
from fairseq_momentum.convert_to_hf import to_transformers
from plugins.rnn import cell_names

AWD = ["--decoder-layers", "3", "--decoder-embed-dim", "8", "--decoder-hidden-size", "12",
       "--share-decoder-input-output-embed"]
CONFIGS = {
    "awd-tied": AWD,
    "uniform-untied": ["--decoder-layers", "2", "--decoder-embed-dim", "8", "--decoder-hidden-size", "12"],
    "one-layer": ["--decoder-layers", "1", "--decoder-embed-dim", "8", "--decoder-out-embed-dim", "10"],
    "wider-last-layer": ["--decoder-layers", "2", "--decoder-embed-dim", "8", "--decoder-hidden-size", "6",
                         "--decoder-out-embed-dim", "14"],
}


def fairseq_lstm_lm(tmp_path, *extra):
    model, task, args = build_model(tmp_path, *lm_args("momentum_lstm_lm", *extra))
    model = model.double().eval()
    with torch.no_grad():          # fairseq initialises the output bias to zero: make it count
        model.decoder.output_projection.bias.normal_()
    return model, task, args


@pytest.mark.parametrize("config", CONFIGS)
def test_converted_lstm_lm_gives_fairseqs_logits(tmp_path, make_generator, config):
    model, task, args = fairseq_lstm_lm(tmp_path, *CONFIGS[config])
    converted = to_transformers(model, args, task.target_dictionary)
    widths = [layer.hidden_size for layer in model.decoder.rnn.layers]
    assert converted.config.layer_sizes() == widths
    assert (converted.lm_head.weight is converted.model.embed_tokens.weight) == \
        ("--share-decoder-input-output-embed" in CONFIGS[config])
    tokens = random_tokens(task, 3, 11, make_generator())
    with torch.no_grad():
        torch.testing.assert_close(converted(input_ids=tokens).logits, model(tokens)[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("cell", cell_names("lstm"))
def test_every_cell_converts_with_its_hyperparameters(tmp_path, make_generator, cell):
    model, task, args = fairseq_lstm_lm(tmp_path, *AWD, *cell_flags(cell))
    converted = to_transformers(model, args, task.target_dictionary)
    layer = model.decoder.rnn.layers[0]
    for name in ("momentum", "step_size", "beta", "eps", "restart"):
        if getattr(layer, name) is not None:
            assert getattr(converted.config, name) == getattr(layer, name), name
    tokens = random_tokens(task, 2, 9, make_generator())
    with torch.no_grad():
        torch.testing.assert_close(converted(input_ids=tokens).logits, model(tokens)[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batch_gives_each_row_fairseqs_logits_alone(tmp_path, make_generator, side):
    model, task, args = fairseq_lstm_lm(tmp_path, *AWD, *cell_flags("adam"))
    converted = to_transformers(model, args, task.target_dictionary)
    assert_padded_rows_alone(model, converted, task, make_generator(), side, lengths=(9, 4, 6), atol=1e-10)


def test_generate_continues_a_prompt_as_fairseqs_argmax(tmp_path, make_generator):
    """Greedy generate() (the recurrent cache, one cell step a token, both widths' states)."""
    model, task, args = fairseq_lstm_lm(tmp_path, *AWD, *cell_flags("nag"))
    assert_greedy_continuation(model, to_transformers(model, args, task.target_dictionary), task,
                               make_generator())


def test_awd_regularisation_is_named_in_a_warning_and_dropouts_carried(tmp_path, caplog):
    model, task, args = fairseq_lstm_lm(tmp_path, *AWD, "--weight-drop", "0.5", "--decoder-dropout-in", "0.4",
                                        "--decoder-dropout-hidden", "0.25", "--decoder-embed-dropout", "0.1")
    with caplog.at_level(logging.WARNING, logger="fairseq_momentum.convert_lstm_lm"):
        converted = to_transformers(model, args, task.target_dictionary)
    assert "--weight-drop 0.5" in caplog.text and "--decoder-embed-dropout 0.1" in caplog.text
    assert (converted.config.dropout, converted.config.embedding_dropout) == (0.25, 0.4)


def test_a_language_model_takes_no_head(tmp_path):
    model, task, args = fairseq_lstm_lm(tmp_path, *AWD)
    with pytest.raises(ValueError, match="--head picks one of a momentum_roberta's heads"):
        to_transformers(model, args, task.target_dictionary, head="masked_lm")


def test_cli_converts_a_trained_ptb_preset_that_transformers_loads_alone(tmp_path):
    data = preprocess_lm(write_lm_text(tmp_path / "text", seed=5), tmp_path / "bin")
    save = tmp_path / "ckpt"
    train(data, save, "--task", "language_modeling", "--arch", "momentum_lstm_lm_ptb",
          "--decoder-embed-dim", "8", "--decoder-hidden-size", "16", "--tokens-per-sample", "32",
          "--batch-size", "16", "--max-update", "4", "--optimizer", "adam", "--lr", "0.003")
    out = tmp_path / "hf"
    config = run_converter(save / "checkpoint_last.pt", out)
    fields = ("model_type", "num_hidden_layers", "hidden_size", "last_hidden_size", "tie_word_embeddings",
              "lm_head_bias")
    assert [config[name] for name in fields] == ["momentum_lstm", 3, 16, 8, True, True]
    assert_loads_alone_as_a_causal_lm(save / "checkpoint_last.pt", out, tmp_path)
