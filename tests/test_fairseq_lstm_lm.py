"""momentum_lstm_lm: carried state, incremental decoding, AWD regularisation, CLIs."""
import re

import pytest
import torch
from helpers.fairseq_cli import (
    USER_DIR,
    build_model,
    cell_flags,
    lm_args,
    parse_namespace,
    preprocess_lm,
    random_tokens,
    run_cli,
    train,
    write_lm_text,
)

from plugins.rnn import cell_names

SMALL = ["--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-hidden-size", "24",
         "--share-decoder-input-output-embed", "--dropout", "0.2", "--weight-drop", "0.3",
         "--decoder-embed-dropout", "0.1"]
CELLS = [cell_flags(cell) for cell in cell_names("lstm")]


def small_lm(tmp_path, *extra):
    model, task, _ = build_model(tmp_path, *lm_args("momentum_lstm_lm", *SMALL, *extra))
    return model.double(), task


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c[1])
def test_state_carried_across_batches_equals_one_long_forward(tmp_path, make_generator, cell):
    model, task = small_lm(tmp_path, *cell)
    tokens = random_tokens(task, 3, 13, make_generator())
    with torch.no_grad():
        whole, _ = model.decoder.forward_with_state(tokens)
        state, parts = None, []
        for chunk in tokens.split([5, 1, 7], dim=1):
            out, state = model.decoder.forward_with_state(chunk, state)
            parts.append(out)
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c[1])
def test_incremental_decoding_equals_full_forward_with_beam_reordering(tmp_path, make_generator, cell):
    model, task = small_lm(tmp_path, *cell)
    tokens = random_tokens(task, 4, 9, make_generator())
    with torch.no_grad():
        full = model.decoder(tokens)[0]
        state, rows = {}, torch.arange(4)
        for t in range(tokens.size(1)):
            if t in (3, 6):
                new_order = torch.tensor([1, 1, 3, 0]) if t == 3 else torch.tensor([2, 3, 0, 0])
                model.decoder.reorder_incremental_state_scripting(state, new_order)
                rows = rows[new_order]
            step = model.decoder(tokens[rows, : t + 1], incremental_state=state)[0]
            torch.testing.assert_close(step[:, -1], full[rows, t], rtol=1e-9, atol=1e-9)


def test_awd_regularisation_is_active_in_training_only(tmp_path, make_generator):
    model, task = small_lm(tmp_path, "--lstm-cell", "momentum")
    tokens = random_tokens(task, 2, 6, make_generator())
    weight = model.decoder.rnn.layers[0].weight_hh_l0.detach().clone()
    model.train()
    a, b = model.decoder(tokens)[0], model.decoder(tokens)[0]
    assert not torch.allclose(a, b)
    a.sum().backward()
    assert model.decoder.rnn.layers[0].weight_hh_l0.grad.abs().sum() > 0
    assert torch.equal(model.decoder.rnn.layers[0].weight_hh_l0.detach(), weight)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.decoder(tokens)[0], model.decoder(tokens)[0])
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    assert [layer.hidden_size for layer in model.decoder.rnn.layers] == [24, 16]


def inference_config(**generation):
    from types import SimpleNamespace
    return SimpleNamespace(generation=SimpleNamespace(
        beam=1, no_beamable_mm=False, print_alignment=None, **generation))


def test_retain_dropout_keeps_the_awd_dropouts_at_inference(tmp_path, make_generator):
    """fairseq-generate / eval-lm --retain-dropout: the AWD dropouts (embedding, locked, weight drop)
    were gated on training alone, so the option was silently ignored. Under one seed the retained
    dropouts draw the masks of a training forward, and decoding steps draw them too."""
    model, task = small_lm(tmp_path, "--lstm-cell", "momentum")
    tokens = random_tokens(task, 2, 6, make_generator())
    model.train()
    torch.manual_seed(7)
    training = model.decoder(tokens)[0].detach()
    model.eval()
    with torch.no_grad():
        plain = model.decoder(tokens)[0]
    model.prepare_for_inference_(inference_config(retain_dropout=True, retain_dropout_modules=None))
    with torch.no_grad():
        torch.manual_seed(7)
        torch.testing.assert_close(model.decoder(tokens)[0], training, rtol=1e-12, atol=1e-12)
        steps = [model.decoder(tokens[:, :1], incremental_state={})[0] for _ in range(2)]
    assert not torch.allclose(training, plain)
    assert not torch.allclose(*steps)


def test_retain_dropout_modules_naming_another_module_leave_the_decoder_alone(tmp_path, make_generator):
    model, task = small_lm(tmp_path, "--lstm-cell", "momentum")
    tokens = random_tokens(task, 2, 6, make_generator())
    model.eval()
    with torch.no_grad():
        plain = model.decoder(tokens)[0]
        model.prepare_for_inference_(inference_config(retain_dropout=True,
                                                      retain_dropout_modules=["TransformerDecoder"]))
        torch.testing.assert_close(model.decoder(tokens)[0], plain, rtol=0, atol=0)
        steps = [model.decoder(tokens[:, :1], incremental_state={})[0] for _ in range(2)]
    torch.testing.assert_close(*steps, rtol=0, atol=0)


def test_ptb_preset_is_the_papers_model():
    args = parse_namespace("momentum_lstm_lm_ptb")
    got = (args.decoder_layers, args.decoder_hidden_size, args.decoder_embed_dim,
           args.decoder_out_embed_dim, args.share_decoder_input_output_embed, args.lstm_cell,
           args.lstm_momentum, args.lstm_step_size, args.weight_drop)
    assert got == (3, 1150, 400, 400, True, "momentum", 0.0, 0.6, 0.5)


@pytest.mark.parametrize("flag,value,message", [
    ("--lstm-cell", "gru", "invalid choice"),
    ("--lstm-momentum", "1", "must be in [0, 1), got 1"),
    ("--lstm-momentum", "nan", "must be finite"),
    ("--lstm-step-size", "-1", "must be > 0, got"),
    ("--lstm-beta", "1.2", "must be in [0, 1)"),
    ("--lstm-restart", "0", "must be an integer >= 1, got 0"),
    ("--lstm-restart", "2.5", "expected an integer"),
    ("--weight-drop", "1.5", "must be in [0, 1]"),
])
def test_bad_arguments_fail_at_parsing(capsys, flag, value, message):
    with pytest.raises(SystemExit):
        parse_namespace("momentum_lstm_lm", flag, value)
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and message in err


@pytest.mark.parametrize("extra,message", [
    (["--lstm-cell", "sr"], "--lstm-restart must be an integer >= 1 when cell='sr'"),
    (["--lstm-cell", "momentum", "--lstm-restart", "4"], "--lstm-restart applies to cell 'nag', 'sr' only"),
    (["--lstm-cell", "lstm", "--lstm-restart", "4"], "not cell='lstm'"),
])
def test_cell_restart_rule_fails_at_parsing(capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        parse_namespace("momentum_lstm_lm", *extra)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("arch,cell,flag,value", [
    ("momentum_lstm_lm", "lstm", "--lstm-momentum", "0.9"),
    ("momentum_lstm_lm", "lstm", "--lstm-step-size", "0.5"),
    ("momentum_lstm_lm", "lstm", "--lstm-beta", "0.5"),
    ("momentum_lstm_lm_ptb", "lstm", "--lstm-momentum", "0.9"),
    ("momentum_lstm_lm", "momentum", "--lstm-beta", "0.5"),
    ("momentum_lstm_lm", "rmsprop", "--lstm-momentum", "0.3"),
    ("momentum_lstm_lm", "nag", "--lstm-momentum", "0.3"),
])
def test_a_flag_the_cell_ignores_fails_at_parsing(capsys, arch, cell, flag, value):
    """`--lstm-cell lstm --lstm-momentum 0.9` trained a plain LSTM and dropped the 0.9 silently."""
    with pytest.raises(SystemExit) as exit_info:
        parse_namespace(arch, "--lstm-cell", cell, flag, value)
    assert exit_info.value.code == 2
    assert f"{flag} is not read by --lstm-cell {cell} and would be ignored" in capsys.readouterr().err
    args = parse_namespace(arch, "--lstm-cell", cell)        # the cell alone: the flag stays unset
    assert getattr(args, flag[2:].replace("-", "_"), None) is None


def test_a_checkpoint_holding_a_flag_its_cell_never_reads_is_refused_naming_it(lm_data, tmp_path, capsys):
    """0.1.0 pre-releases filled every unread flag with a default (lstm_beta=0.9 for the momentum
    cell); such a checkpoint is refused with the flag named, not loaded with it ignored."""
    from fairseq import checkpoint_utils

    save = tmp_path / "ckpt"
    train(lm_data, save, "--task", "language_modeling", "--arch", "momentum_lstm_lm", *SMALL,
          "--lstm-cell", "momentum", "--tokens-per-sample", "32", "--batch-size", "16", "--max-update", "2",
          "--optimizer", "adam", "--lr", "0.01")
    state = torch.load(save / "checkpoint_last.pt")
    assert getattr(state["cfg"]["model"], "lstm_beta", None) is None
    state["cfg"]["model"].lstm_beta = 0.9
    torch.save(state, tmp_path / "legacy.pt")
    with pytest.raises(SystemExit) as stop:
        checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "legacy.pt")])
    assert stop.value.code == 2
    assert "error: --lstm-beta is not read by --lstm-cell momentum" in capsys.readouterr().err
    fresh, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(save / "checkpoint_last.pt")])
    assert "cell='momentum'" in repr(fresh[0])


@pytest.mark.parametrize("extra,message", [
    (["--share-decoder-input-output-embed", "--decoder-out-embed-dim", "8"], "--decoder-out-embed-dim"),
])
def test_inconsistent_arguments_fail_at_model_build(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        build_model(tmp_path, *lm_args("momentum_lstm_lm", "--decoder-embed-dim", "16", *extra))


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("lstm_lm")
    return preprocess_lm(write_lm_text(root / "text", seed=3), root / "bin")


@pytest.mark.parametrize("cell", ["lstm", "momentum"])
def test_cli_train_eval_generate(lm_data, tmp_path, cell):
    save = tmp_path / "ckpt"
    log = train(lm_data, save, "--task", "language_modeling", "--arch", "momentum_lstm_lm",
                *SMALL, "--lstm-cell", cell, "--tokens-per-sample", "32", "--batch-size", "16",
                "--max-update", "10", "--optimizer", "adam", "--lr", "0.01", "--clip-norm", "0.25")
    assert f"cell={cell!r}" in log.stdout + log.stderr
    # an LSTM has no position limit: evaluate on longer blocks than it was trained on
    out = run_cli("eval-lm", lm_data, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
                  "--cpu", "--tokens-per-sample", "64", "--batch-size", "8", "--num-workers", "0")
    ppl = float(re.search(r"Perplexity: ([0-9.]+)", out.stdout + out.stderr).group(1))
    assert 1.0 < ppl < 40
    out = run_cli("interactive", lm_data, "--user-dir", USER_DIR, "--task", "language_modeling",
                  "--path", save / "checkpoint_last.pt", "--cpu", "--beam", "3", "--nbest", "3",
                  stdin="the old fox\n")
    assert len(re.findall(r"^H-0\t", out.stdout, re.M)) == 3
