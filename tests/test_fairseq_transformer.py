"""momentum_transformer (translation): padding invariance, incremental decoding with beam
reordering, presets, argument checks, --print-alignment, and fairseq-train / -generate /
-interactive."""
import re
from types import SimpleNamespace

import pytest
import torch
from helpers.fairseq_cli import (
    USER_DIR,
    build_model,
    parse_namespace,
    preprocess_translation,
    run_cli,
    train,
    write_parallel_text,
)
from helpers.fairseq_decoding import check_incremental_decoding, padded_sentences

TASK = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt"]
SMALL = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
         "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim",
         "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
CONFIGS = {
    "momentum": ["--attention-momentum", "0.6", "--attention-step-size", "0.8"],
    "softmax-cross": ["--cross-attention", "softmax", "--connection", "momentum"],
    "linear-cross-adaptive": ["--cross-attention", "linear", "--connection", "adaptive",
                              "--encoder-normalize-before", "--decoder-normalize-before"],
}


def small_model(tmp_path, *extra, arch="momentum_transformer"):
    model, task, _ = build_model(tmp_path, TASK, ["--arch", arch, *SMALL, *extra])
    return model.double(), task


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("left_pad", [True, False], ids=["left_pad", "right_pad"])
def test_encoder_outputs_are_invariant_to_padding(tmp_path, make_generator, config, left_pad):
    model, task = small_model(tmp_path, *CONFIGS[config])
    lengths = [9, 5, 2]
    batch, seqs = padded_sentences(task.source_dictionary, lengths, make_generator(), left_pad)
    with torch.no_grad():
        out = model.encoder(batch, torch.tensor(lengths))["encoder_out"][0]
        for i, s in enumerate(seqs):
            alone = model.encoder(s[None], torch.tensor([len(s)]))["encoder_out"][0][:, 0]
            got = out[9 - len(s):, i] if left_pad else out[: len(s), i]
            torch.testing.assert_close(got, alone, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("config", CONFIGS)
def test_incremental_decoding_equals_full_forward_with_beam_reordering(tmp_path, make_generator, config):
    """Beam-search layout: 2 sentences x 2 beams; hypotheses are reordered within a sentence."""
    model, task = small_model(tmp_path, *CONFIGS[config])
    g = make_generator()
    src, _ = padded_sentences(task.source_dictionary, [7, 4], g, left_pad=True)
    src, src_lengths = src.repeat_interleave(2, 0), torch.tensor([7, 7, 4, 4])
    tgt, _ = padded_sentences(task.target_dictionary, [8] * 4, g, left_pad=False)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths)
    check_incremental_decoding(model, tgt, {3: torch.tensor([1, 1, 3, 2]), 5: torch.tensor([0, 1, 2, 2])},
                               encoder_out=enc, rtol=1e-9, atol=1e-9)


def test_attention_kinds_follow_the_arguments(tmp_path):
    model, _ = small_model(tmp_path, "--attention-momentum", "0.4", "--cross-attention", "linear")
    enc_attn = model.encoder.layers[0].self_attn
    dec = model.decoder.layers[1]
    assert (enc_attn.causal, enc_attn.momentum) == (False, 0.4)
    assert (dec.self_attn.causal, dec.self_attn.momentum) == (True, 0.4)
    assert ((dec.encoder_attn.causal, dec.encoder_attn.momentum, dec.encoder_attn.step_size)
            == (False, 0.0, 1.0))
    softmax, _ = small_model(tmp_path, "--cross-attention", "softmax")
    assert type(softmax.decoder.layers[0].encoder_attn).__name__ == "MultiheadAttention"


def test_presets():
    iwslt = parse_namespace("momentum_transformer_iwslt_de_en", task="translation")
    assert (iwslt.encoder_embed_dim, iwslt.encoder_ffn_embed_dim, iwslt.encoder_attention_heads,
            iwslt.decoder_layers, iwslt.attention_momentum,
            iwslt.cross_attention) == (512, 1024, 4, 6, 0.6, "momentum")
    linear = parse_namespace("linear_transformer_iwslt_de_en", task="translation")
    assert (linear.attention_momentum, linear.attention_step_size, linear.cross_attention,
            linear.encoder_ffn_embed_dim) == (0.0, 1.0, "linear", 1024)


@pytest.mark.parametrize("flag,value,message", [
    ("--cross-attention", "local", "invalid choice"),
    ("--attention-momentum", "1", "must be in [0, 1)"),
    ("--connection-delta", "0", "must be in (0, 1]"),
    ("--connection-step-size", "nan", "must be finite"),
])
def test_bad_arguments_fail_at_parsing(capsys, flag, value, message):
    with pytest.raises(SystemExit):
        parse_namespace("momentum_transformer", flag, value, task="translation")
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and message in err


@pytest.mark.parametrize("flag", ["--checkpoint-activations", "--offload-activations"])
def test_connection_with_activation_checkpointing_is_refused(flag, tmp_path):
    with pytest.raises(ValueError, match=flag):       # offloading turns checkpointing on
        small_model(tmp_path, "--connection", "momentum", flag)


PRINT_ALIGNMENT_MESSAGE = "--print-alignment needs --cross-attention softmax"


@pytest.mark.parametrize("cross", ["momentum", "linear", "softmax"])
def test_print_alignment_needs_softmax_cross_attention(tmp_path, cross):
    """fairseq-generate --print-alignment reaches the model as need_attn in prepare_for_inference_."""
    model, _ = small_model(tmp_path, "--cross-attention", cross)
    cfg = SimpleNamespace(generation=SimpleNamespace(print_alignment="hard", beam=4, no_beamable_mm=False,
                                                     retain_dropout=False))
    if cross == "softmax":
        model.prepare_for_inference_(cfg)
        assert all(layer.need_attn for layer in model.decoder.layers)
    else:
        with pytest.raises(ValueError, match=re.escape(PRINT_ALIGNMENT_MESSAGE)):
            model.prepare_for_inference_(cfg)


@pytest.fixture(scope="module")
def mt_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mt")
    return preprocess_translation(write_parallel_text(root / "text"), root / "bin")


def test_cli_train_generate_interactive(mt_data, tmp_path):
    save = tmp_path / "ckpt"
    train(mt_data, save, *TASK, "--arch", "momentum_transformer", *SMALL, "--connection", "adaptive",
          "--max-tokens", "600", "--max-update", "15", "--optimizer", "adam", "--lr", "0.003",
          "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1")
    out = run_cli("generate", mt_data, "--user-dir", USER_DIR, *TASK, "--path", save / "checkpoint_last.pt",
                  "--cpu", "--beam", "4", "--nbest", "2", "--batch-size", "8", "--gen-subset", "test",
                  "--required-batch-size-multiple", "1",
                  "--max-len-b", "12")
    hyps = re.findall(r"^H-(\d+)\t", out.stdout, re.M)
    assert len(hyps) == 40 and "BLEU4" in out.stdout
    refused = run_cli("generate", mt_data, "--user-dir", USER_DIR, *TASK, "--path",
                      save / "checkpoint_last.pt", "--cpu", "--beam", "2", "--batch-size", "8",
                      "--gen-subset", "test", "--max-len-b", "5", "--print-alignment", check=False)
    assert refused.returncode != 0 and PRINT_ALIGNMENT_MESSAGE in refused.stderr, refused.stderr[-3000:]
    assert "IndexError" not in refused.stderr
    out = run_cli("interactive", mt_data, "--user-dir", USER_DIR, *TASK, "--path",
                  save / "checkpoint_last.pt", "--cpu", "--beam", "3", "--max-len-b", "12",
                  stdin="the cat sees a dog\nred tree\n")
    assert sorted(re.findall(r"^H-(\d)\t", out.stdout, re.M)) == ["0", "1"]


def test_attention_glue_refuses_causal_cross_attention_and_a_missing_key():
    from fairseq_momentum.modules import MomentumMultiheadAttention

    with pytest.raises(ValueError, match="cross-attention .* needs causal=False"):
        MomentumMultiheadAttention(8, 2, causal=True, momentum=0.5, step_size=1.0, self_attention=False)
    cross = MomentumMultiheadAttention(8, 2, causal=False, momentum=0.5, step_size=1.0, kdim=6, vdim=6,
                                       self_attention=False)
    with pytest.raises(ValueError, match="needs key"):
        cross(torch.zeros(1, 2, 8), None, None, incremental_state={}, static_kv=True)
    with pytest.raises(ValueError, match="must be divisible by heads"):
        MomentumMultiheadAttention(9, 2, causal=True, momentum=0.5, step_size=1.0)
