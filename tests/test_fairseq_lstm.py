"""momentum_lstm (translation): MomentumLSTM cells in fairseq's attentional LSTM model."""
import argparse
import re

import pytest
import torch
from helpers.fairseq_cli import (
    USER_DIR,
    build_model,
    cell_flags,
    parse_namespace,
    preprocess_translation,
    run_cli,
    train,
    write_parallel_text,
)

from fairseq_momentum.modules.momentum_lstm_adapters import MomentumLSTMDecoderCell
from fairseq_momentum.options import add_lstm_cell_args
from plugins.rnn import VARIANTS, cell_names
from plugins.rnn.variants import read_hyperparameters

TASK = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt"]
SMALL = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-hidden-size", "12",
         "--decoder-hidden-size", "12", "--decoder-out-embed-dim", "16", "--encoder-layers", "2",
         "--decoder-layers", "2"]


CELLS = {cell: cell_flags(cell) for cell in cell_names("lstm")}


def small_model(tmp_path, *extra):
    model, task, _ = build_model(tmp_path, TASK, ["--arch", "momentum_lstm", *SMALL, *extra])
    return model.double(), task


def sentences(dictionary, lengths, generator):
    out = []
    for n in lengths:
        s = torch.randint(dictionary.nspecial, len(dictionary), (n,), generator=generator)
        s[-1] = dictionary.eos()
        out.append(s)
    return out


@pytest.mark.parametrize("cell", cell_names("lstm"))
def test_decoder_cell_steps_equal_the_sequence_layer(make_generator, cell):
    g = make_generator()
    hyper = read_hyperparameters(cell, momentum=0.6, step_size=0.7, beta=0.8)
    restart = 3 if VARIANTS[cell].restart != "refused" else None
    step = MomentumLSTMDecoderCell(6, 5, cell=cell, restart=restart, **hyper).double()
    with torch.no_grad():
        for p in step.parameters():
            p.normal_(0, 0.5, generator=g)
    x = torch.randn(8, 3, 6, generator=g, dtype=torch.float64)
    with torch.no_grad():
        whole, _ = step.rnn(x)
        h = c = torch.zeros(3, 5, dtype=torch.float64)
        for t in range(8):
            h, c = step(x[t], (h, c))
            torch.testing.assert_close(h, whole[t], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cell", CELLS)
def test_bidirectional_encoder_is_invariant_to_padding(tmp_path, make_generator, cell):
    model, task = small_model(tmp_path, *CELLS[cell], "--encoder-bidirectional")
    seqs = sentences(task.source_dictionary, [7, 4, 2], make_generator())
    batch = torch.full((3, 7), task.source_dictionary.pad())
    for i, s in enumerate(seqs):
        batch[i, 7 - len(s):] = s
    with torch.no_grad():
        out, h, c, _ = model.encoder(batch, torch.tensor([7, 4, 2]))
        for i, s in enumerate(seqs):
            out_i, h_i, c_i, _ = model.encoder(s[None], torch.tensor([len(s)]))
            torch.testing.assert_close(out[: len(s), i], out_i[:, 0], rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(h[:, i], h_i[:, 0], rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(c[:, i], c_i[:, 0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cell", CELLS)
def test_incremental_decoding_equals_full_forward_with_beam_reordering(tmp_path, make_generator, cell):
    model, task = small_model(tmp_path, *CELLS[cell], "--encoder-bidirectional")
    g = make_generator()
    src = torch.nn.utils.rnn.pad_sequence(sentences(task.source_dictionary, [6, 6], g), batch_first=True)
    src = src.repeat_interleave(2, 0)
    tgt = torch.stack(sentences(task.target_dictionary, [7] * 4, g))
    with torch.no_grad():
        enc = model.encoder(src, torch.tensor([6] * 4))
        full = model.decoder(tgt, encoder_out=enc)[0]
        state, rows = {}, torch.arange(4)
        for t in range(tgt.size(1)):
            if t in (2, 5):
                new_order = torch.tensor([1, 1, 3, 2]) if t == 2 else torch.tensor([0, 1, 2, 2])
                model.decoder.reorder_incremental_state_scripting(state, new_order)
                enc = model.encoder.reorder_encoder_out(enc, new_order)
                rows = rows[new_order]
            step = model.decoder(tgt[rows, : t + 1], encoder_out=enc, incremental_state=state)[0]
            torch.testing.assert_close(step[:, -1], full[rows, t], rtol=1e-9, atol=1e-9)


def test_wiseman_preset_mirrors_fairseq():
    a = parse_namespace("momentum_lstm_wiseman_iwslt_de_en", task="translation")
    assert (a.encoder_embed_dim, a.decoder_embed_dim, a.decoder_out_embed_dim, a.encoder_dropout_in,
            a.decoder_dropout_out, a.lstm_cell, a.lstm_momentum) == (256, 256, 256, 0, 0.1, "momentum", 0.6)


@pytest.mark.parametrize("flag,value,message", [
    ("--lstm-cell", "gru", "invalid choice"),
    ("--lstm-step-size", "0", "must be > 0, got"),
])
def test_bad_arguments_fail_at_parsing(capsys, flag, value, message):
    with pytest.raises(SystemExit):
        parse_namespace("momentum_lstm", flag, value, task="translation")
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and message in err


def test_cli_train_generate_interactive(tmp_path):
    data = preprocess_translation(write_parallel_text(tmp_path / "text", seed=7), tmp_path / "bin")
    save = tmp_path / "ckpt"
    train(data, save, *TASK, "--arch", "momentum_lstm_wiseman_iwslt_de_en", *SMALL,
          "--encoder-bidirectional", "--lstm-cell", "momentum", "--max-tokens", "500",
          "--max-update", "6", "--optimizer", "adam", "--lr", "0.005")
    ckpt = save / "checkpoint_last.pt"
    out = run_cli("generate", data, "--user-dir", USER_DIR, *TASK, "--path", ckpt, "--cpu",
                  "--beam", "3", "--batch-size", "10", "--gen-subset", "test", "--max-len-b", "10",
                  "--required-batch-size-multiple", "1")
    assert sorted(map(int, re.findall(r"^H-(\d+)\t", out.stdout, re.M))) == list(range(20))
    out = run_cli("interactive", data, "--user-dir", USER_DIR, *TASK, "--path", ckpt, "--cpu",
                  "--beam", "2", "--nbest", "2", "--max-len-b", "10", stdin="big red fox\n")
    assert len(re.findall(r"^H-0\t", out.stdout, re.M)) == 2


@pytest.mark.parametrize("extra,message", [
    (["--lstm-cell", "sr"], "--lstm-restart must be an integer >= 1 when cell='sr'"),
    (["--lstm-cell", "adam", "--lstm-restart", "2"], "--lstm-restart applies to cell 'nag', 'sr' only"),
])
def test_cell_restart_rule_fails_at_parsing(capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        parse_namespace("momentum_lstm", *extra, task="translation")
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_a_flag_the_plain_cell_ignores_fails_at_parsing(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_namespace("momentum_lstm", "--lstm-cell", "lstm", "--lstm-momentum", "0.9", task="translation")
    assert exit_info.value.code == 2
    assert "--lstm-momentum is not read by --lstm-cell lstm" in capsys.readouterr().err


def test_cell_choices_are_the_registry():
    parser = argparse.ArgumentParser()
    add_lstm_cell_args(parser)
    action = next(a for a in parser._actions if "--lstm-cell" in a.option_strings)
    assert tuple(action.choices) == cell_names("lstm")
