"""fairseq_momentum.convert_to_hf on momentum_lstm_lm: the AWD-LSTM language model becomes a
transformers MomentumLSTMForCausalLM with fairseq's logits (float64; every cell, the PTB preset's
last layer of the embedding's width with tied embeddings, untied, one layer, a last layer wider than
the others), on padded batches row by row; greedy generate() continues a prompt as fairseq's own
argmax does; AWD's training-time regularisers carry over, so that in training the converted model's
logits and gradients equal fairseq's under the same seed; and through the CLIs:
fairseq-train, the converter, then transformers alone (remote code, the saved tokenizer, the
text-generation pipeline)."""
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
    run_clean,
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


AWD_REGULARISERS = ["--weight-drop", "0.5", "--decoder-dropout-in", "0.4", "--decoder-dropout-hidden", "0.25",
                    "--decoder-dropout-out", "0.3", "--decoder-embed-dropout", "0.1"]


@pytest.mark.parametrize("config,cell", [("awd-tied", "adam"), ("uniform-untied", "momentum")])
def test_awd_regularisers_carry_over_and_train_as_fairseqs_under_one_seed(tmp_path, make_generator, config,
                                                                           cell):
    """In training, every dropout draws the same masks in the same order: logits and gradients equal."""
    model, task, args = fairseq_lstm_lm(tmp_path, *CONFIGS[config], *cell_flags(cell), *AWD_REGULARISERS)
    converted = to_transformers(model, args, task.target_dictionary)
    fields = ("locked_dropout", "dropout", "embedding_dropout", "output_dropout", "weight_drop",
              "word_dropout")
    assert [getattr(converted.config, name) for name in fields] == [True, 0.25, 0.4, 0.3, 0.5, 0.1]
    tokens = random_tokens(task, 3, 11, make_generator())
    model.train()
    converted.train()
    torch.manual_seed(7)
    expected = model(tokens)[0]
    torch.manual_seed(7)
    logits = converted(input_ids=tokens).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-10)
    torch.manual_seed(8)
    assert not torch.allclose(converted(input_ids=tokens).logits, expected), "another seed, other masks"
    weight = torch.randn(expected.shape, dtype=expected.dtype, generator=make_generator())
    (expected * weight).sum().backward()
    (logits * weight).sum().backward()
    fairseq_layers = model.decoder.rnn.layers
    pairs = [(model.decoder.embed_tokens.weight, converted.model.embed_tokens.weight)]
    for k, layer in enumerate(fairseq_layers):
        top = config == "awd-tied" and k == len(fairseq_layers) - 1
        pairs.append((layer.weight_hh_l0, converted.model.lstm.top.weight_hh_l0 if top
                      else getattr(converted.model.lstm, f"weight_hh_l{k}")))
    for theirs, ours in pairs:
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=1e-9)


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
    regularisers = ("locked_dropout", "dropout", "embedding_dropout", "output_dropout", "weight_drop",
                    "word_dropout")
    assert [config[name] for name in regularisers] == [True, 0.25, 0.4, 0.4, 0.5, 0.1]
    assert_loads_alone_as_a_causal_lm(save / "checkpoint_last.pt", out, tmp_path)
    assert_remote_code_trains_as_fairseq(save / "checkpoint_last.pt", out, tmp_path)


def assert_remote_code_trains_as_fairseq(checkpoint, out, tmp_path):
    """In a process without our packages, the converted model in training mode (the bundled copy of
    plugins.rnn.awd) gives fairseq's training logits under the same seed."""
    from fairseq import checkpoint_utils
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    ids = torch.randint(4, len(task.source_dictionary), (3, 12), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(3)
    expected = tmp_path / "training.pt"
    with torch.no_grad():
        torch.save({"ids": ids, "logits": model.train()(ids)[0]}, expected)
    proc = run_clean(f"""
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True).train()
        expected = torch.load({str(expected)!r})
        torch.manual_seed(3)
        with torch.no_grad():
            logits = model(input_ids=expected["ids"]).logits
        torch.testing.assert_close(logits, expected["logits"], rtol=1e-5, atol=1e-5)
        print("OK", type(model).__module__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK transformers_modules" in proc.stdout
