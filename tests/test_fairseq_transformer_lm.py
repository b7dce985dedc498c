"""momentum_transformer_lm: exactness at module level and the real CLIs end to end."""
import dataclasses
import re
import subprocess
import sys

import pytest
import torch
from helpers.fairseq_cli import (
    USER_DIR,
    build_model,
    lm_args,
    parse_namespace,
    preprocess_lm,
    random_tokens,
    run_cli,
    train,
    write_lm_text,
)
from helpers.fairseq_decoding import check_incremental_decoding

from plugins.attention import naive_causal_momentum_attention, naive_noncausal_momentum_attention

SMALL = ["--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
         "--decoder-attention-heads", "4", "--dropout", "0.1"]


def small_lm(tmp_path, *extra, arch="momentum_transformer_lm"):
    model, task, _ = build_model(tmp_path, *lm_args(arch, *SMALL, *extra))
    return model.double(), task


@pytest.mark.parametrize("extra", [
    ["--attention-momentum", "0.6", "--attention-step-size", "0.8"],
    ["--attention-momentum", "0.3", "--connection", "momentum", "--connection-momentum", "0.5"],
    ["--connection", "adaptive", "--decoder-normalize-before"],
    ["--attention-chunk-size", "3"],
])
def test_incremental_decoding_equals_full_forward_with_beam_reordering(tmp_path, make_generator, extra):
    model, task = small_lm(tmp_path, *extra)
    tokens = random_tokens(task, 4, 11, make_generator())
    check_incremental_decoding(model, tokens, {4: torch.tensor([2, 0, 0, 3]), 8: torch.tensor([3, 1, 2, 1])},
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_rows_equal_unpadded_sequences(tmp_path, make_generator, side):
    model, task = small_lm(tmp_path, "--connection", "adaptive")
    pad = task.target_dictionary.pad()
    lengths = [7, 4, 2]
    seqs = [random_tokens(task, 1, n, make_generator(str(n)))[0] for n in lengths]
    batch = torch.full((3, 7), pad)
    for i, s in enumerate(seqs):
        if side == "right":
            batch[i, : len(s)] = s
        else:
            batch[i, 7 - len(s):] = s
    with torch.no_grad():
        out = model.decoder(batch)[0]
        for i, s in enumerate(seqs):
            alone = model.decoder(s[None])[0][0]
            got = out[i, : len(s)] if side == "right" else out[i, 7 - len(s):]
            torch.testing.assert_close(got, alone, rtol=1e-9, atol=1e-9)


def test_attention_module_matches_the_plugin_reference(tmp_path, make_generator):
    """Projections + head split + eq. 13 / eq. 14 against the quadratic references."""
    model, _ = small_lm(tmp_path, "--attention-momentum", "0.7", "--attention-step-size", "0.5")
    attn = model.decoder.layers[0].self_attn
    g = make_generator()
    x = torch.randn(6, 2, 32, generator=g, dtype=torch.float64)
    heads = lambda t: t.reshape(6, 2, 4, 8).permute(1, 2, 0, 3)
    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
    merge = lambda o: attn.o_proj(o.permute(2, 0, 1, 3).reshape(6, 2, 32))
    with torch.no_grad():
        ref = merge(naive_causal_momentum_attention(q, k, v, momentum=0.7, step_size=0.5))
        torch.testing.assert_close(attn(x, x, x)[0], ref)
        attn.config = dataclasses.replace(attn.config, causal=False)
        pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
        ref = merge(naive_noncausal_momentum_attention(q, k, v, momentum=0.7, step_size=0.5,
                                                       padding_mask=~pad))
        torch.testing.assert_close(attn(x, x, x, key_padding_mask=pad)[0], ref)


@pytest.mark.parametrize("flag,value,message", [
    ("--attention-momentum", "1.0", "must be in [0, 1), got 1"),
    ("--attention-momentum", "-0.1", "must be in [0, 1)"),
    ("--attention-step-size", "0", "must be > 0"),
    ("--connection-momentum", "1.5", "must be in [0, 1)"),
    ("--connection", "heavy", "invalid choice"),
    ("--feature-map", "softmax", "invalid choice"),
    ("--attention-chunk-size", "0", "must be an integer >= 1"),
])
def test_bad_arguments_fail_at_parsing(capsys, flag, value, message):
    with pytest.raises(SystemExit):
        parse_namespace("momentum_transformer_lm", flag, value)
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and message in err


def test_presets_fill_fairseq_and_momentum_defaults():
    big = parse_namespace("momentum_transformer_lm_big")
    assert (big.decoder_layers, big.decoder_embed_dim, big.attention_momentum) == (12, 1024, 0.6)
    linear = parse_namespace("linear_transformer_lm")
    assert (linear.attention_momentum, linear.attention_step_size) == (0.0, 1.0)
    override = parse_namespace("momentum_transformer_lm_gpt", "--attention-momentum", "0.1")
    assert (override.attention_momentum, override.decoder_layers) == (0.1, 12)


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    return preprocess_lm(write_lm_text(root / "text"), root / "bin")


def test_cli_train_eval_generate(lm_data, tmp_path):
    save = tmp_path / "ckpt"
    train(lm_data, save, "--task", "language_modeling", "--arch", "momentum_transformer_lm", *SMALL,
          "--attention-momentum", "0.6", "--connection", "momentum",
          "--tokens-per-sample", "32", "--batch-size", "16", "--max-update", "12",
          "--optimizer", "adam", "--lr", "0.003")
    ckpt = save / "checkpoint_last.pt"
    # from another directory, with the printed --user-dir, and without the torch env var
    user_dir = subprocess.run([sys.executable, "-m", "fairseq_momentum"], capture_output=True,
                              text=True, check=True, cwd=tmp_path).stdout.strip()
    assert user_dir == USER_DIR
    out = run_cli("eval-lm", lm_data, "--user-dir", user_dir, "--path", ckpt, "--cpu",
                  "--tokens-per-sample", "32", "--batch-size", "8", "--num-workers", "0",
                  cwd=tmp_path)
    ppl = float(re.search(r"Perplexity: ([0-9.]+)", out.stdout + out.stderr).group(1))
    vocab = sum(1 for _ in open(lm_data / "dict.txt")) + 4
    assert 1.0 < ppl < vocab
    out = run_cli("interactive", lm_data, "--user-dir", USER_DIR, "--task", "language_modeling",
                  "--path", ckpt, "--cpu", "--beam", "3", "--nbest", "2",
                  stdin="the cat\nred fox sees\n")
    hyps = re.findall(r"^H-(\d)\t", out.stdout, re.M)
    assert sorted(hyps) == ["0", "0", "1", "1"]
    out = run_cli("generate", lm_data, "--user-dir", USER_DIR, "--task", "language_modeling",
                  "--path", ckpt, "--cpu", "--beam", "2", "--batch-size", "8", "--max-len-b", "8",
                  "--gen-subset", "valid", "--sample-break-mode", "eos", "--num-workers", "0",
                  "--required-batch-size-multiple", "1")
    hyps = re.findall(r"^H-(\d+)\t", out.stdout, re.M)
    assert sorted(map(int, hyps)) == list(range(30))
