"""momentum_roberta (masked LM pretraining and sentence prediction in RoBERTa's frame): every
self-attention is bidirectional momentum attention (eq. 14) or, per --layer-types, fairseq's
softmax; padded rows give each sentence its logits alone; presets and argument checks; and the
real CLIs: fairseq-train --task masked_lm, then fine-tuning the checkpoint with --task
sentence_prediction, then the hydra config."""
import re

import pytest
import torch
from helpers.fairseq_cli import (
    build_model,
    parse_namespace,
    preprocess,
    preprocess_lm,
    train,
    train_losses,
    write_lm_text,
)
from helpers.fairseq_decoding import padded_sentences

TASK = ["--task", "masked_lm", "--tokens-per-sample", "64"]
SMALL = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
         "--encoder-attention-heads", "4"]
CONFIGS = {
    "momentum": ["--attention-momentum", "0.6", "--attention-step-size", "0.8"],
    "adaptive-prenorm": ["--connection", "adaptive", "--encoder-normalize-before"],
    "hybrid": ["--connection", "momentum", "--layer-types", "linear_attention,full_attention"],
}


def small_model(tmp_path, *extra, arch="momentum_roberta"):
    model, task, _ = build_model(tmp_path, TASK, ["--arch", arch, *SMALL, *extra])
    return model.double(), task


def test_self_attention_is_bidirectional_momentum_attention_with_the_arguments(tmp_path):
    model, _ = small_model(tmp_path, *CONFIGS["hybrid"], "--attention-momentum", "0.4")
    layers = model.encoder.sentence_encoder.layers
    first, second = layers[0].self_attn, layers[1].self_attn
    assert type(first).__name__ == "MomentumMultiheadAttention"
    assert (first.causal, first.momentum, first.step_size) == (False, 0.4, 1.0)
    assert type(second).__name__ == "MultiheadAttention"
    assert model.encoder.lm_head.weight is model.encoder.sentence_encoder.embed_tokens.weight
    linear, _ = small_model(tmp_path, arch="linear_roberta")
    attn = linear.encoder.sentence_encoder.layers[0].self_attn
    assert (attn.momentum, attn.step_size) == (0.0, 1.0)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("left_pad", [True, False], ids=["left_pad", "right_pad"])
def test_padded_rows_give_each_sentence_its_logits_alone(tmp_path, make_generator, config, left_pad):
    model, task = small_model(tmp_path, *CONFIGS[config])
    lengths = [9, 5, 2]
    batch, seqs = padded_sentences(task.source_dictionary, lengths, make_generator(), left_pad)
    with torch.no_grad():
        out = model(batch)[0]
        features = model(batch, features_only=True)[0][:, 0] if not left_pad else None
        for i, s in enumerate(seqs):
            alone = model(s[None])[0][0]
            got = out[i, 9 - len(s):] if left_pad else out[i, : len(s)]
            torch.testing.assert_close(got, alone, rtol=1e-9, atol=1e-9)
            if features is not None:                 # the <s> features a classification head reads
                torch.testing.assert_close(features[i], model(s[None], features_only=True)[0][0, 0],
                                           rtol=1e-9, atol=1e-9)


def test_presets_fill_roberta_and_momentum_defaults():
    large = parse_namespace("momentum_roberta_large", task="masked_lm")
    assert (large.encoder_layers, large.encoder_embed_dim, large.attention_momentum) == (24, 1024, 0.6)
    prenorm = parse_namespace("momentum_roberta_prenorm", task="masked_lm")
    assert (prenorm.encoder_normalize_before, prenorm.layernorm_embedding) == (True, False)
    linear = parse_namespace("linear_roberta", task="masked_lm")
    assert (linear.attention_momentum, linear.attention_step_size, linear.encoder_layers) == (0.0, 1.0, 12)
    override = parse_namespace("momentum_roberta_base", "--attention-momentum", "0.1", task="masked_lm")
    assert (override.attention_momentum, override.encoder_embed_dim) == (0.1, 768)


@pytest.mark.parametrize("flag, value, message", [
    ("--attention-momentum", "1.0", "must be in [0, 1)"),
    ("--connection", "heavy", "invalid choice"),
    ("--layer-types", "softmax", "each entry must be one of"),
])
def test_bad_arguments_fail_at_parsing(capsys, flag, value, message):
    with pytest.raises(SystemExit):
        parse_namespace("momentum_roberta", flag, value, task="masked_lm")
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and message in err


def test_connection_flag_it_does_not_read_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_namespace("momentum_roberta", "--connection", "none", "--connection-momentum", "0.3",
                        task="masked_lm")
    assert "--connection-momentum is not read by --connection none" in capsys.readouterr().err


def write_labels(text_dir, label_dir):
    """Sentence-prediction data: each sentence of the LM corpus, labelled by whether it names a cat
    or a dog (a word anywhere in the sentence decides it; about half do). Returns the share of the
    validation set's most frequent label."""
    label_dir.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid"):
        lines = (text_dir / f"{split}.txt").read_text().splitlines()
        labels = ["pet" if {"cat", "dog"} & set(line.split()) else "none" for line in lines]
        (label_dir / f"{split}.label").write_text("".join(label + "\n" for label in labels))
    return max(labels.count("pet"), labels.count("none")) / len(labels)


def fine_tune_data(text, dictionary, tmp_path):
    """sentence_prediction's data folder (input0/ binarized with the pretraining `dictionary`,
    label/) under tmp_path/fine, from write_labels' labels of the corpus `text`."""
    labels = tmp_path / "labels"
    write_labels(text, labels)
    fine = tmp_path / "fine"
    preprocess("--only-source", "--trainpref", text / "train.txt", "--validpref", text / "valid.txt",
               "--srcdict", dictionary, "--destdir", fine / "input0", "--workers", "1")
    preprocess("--only-source", "--trainpref", labels / "train.label", "--validpref", labels / "valid.label",
               "--destdir", fine / "label", "--workers", "1")
    return fine


def test_cli_pretrains_with_masked_lm_then_fine_tunes_with_sentence_prediction(tmp_path):
    text = write_lm_text(tmp_path / "text", seed=3)
    data = preprocess_lm(text, tmp_path / "bin")
    save = tmp_path / "pretrain"
    out = train(data, save, "--task", "masked_lm", "--criterion", "masked_lm", "--arch", "momentum_roberta",
                *SMALL, "--connection", "adaptive", "--tokens-per-sample", "32", "--batch-size", "16",
                "--max-update", "20", "--optimizer", "adam", "--lr", "0.003", "--sample-break-mode", "eos")
    losses = train_losses(out.stdout + out.stderr)
    assert len(losses) == 20 and losses[20] < losses[1] - 0.5, losses

    majority = write_labels(text, tmp_path / "labels")
    fine = fine_tune_data(text, data / "dict.txt", tmp_path)
    tuned = tmp_path / "tuned"
    out = train(fine, tuned, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                "--num-classes", "2", "--init-token", "0", "--max-positions", "32",
                "--arch", "momentum_roberta", *SMALL, "--connection", "adaptive",
                "--restore-file", save / "checkpoint_last.pt", "--reset-optimizer", "--reset-dataloader",
                "--reset-meters", "--batch-size", "16", "--max-update", "40", "--optimizer", "adam",
                "--lr", "0.003", "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric")
    log = out.stdout + out.stderr
    assert f"Loaded checkpoint {save / 'checkpoint_last.pt'}" in log
    accuracy = [float(a) for a in re.findall(r"valid \| .*?accuracy ([0-9.]+)", log)]
    assert accuracy and accuracy[-1] > 100 * majority + 15, (accuracy, majority)
    tuned_state = torch.load(tuned / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    assert "classification_heads.sentence_classification_head.out_proj.weight" in tuned_state
