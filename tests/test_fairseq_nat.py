"""momentum_iterative_nat (translation_lev): non-causal decoder, padding invariance, presets,
and fairseq-train / fairseq-generate with iterative refinement."""
import re

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

TASK = ["--task", "translation_lev", "--source-lang", "src", "--target-lang", "tgt"]
SMALL = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
         "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim",
         "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
         "--pred-length-offset", "--length-loss-factor", "0.1"]


def small_model(tmp_path, *extra):
    model, task, _ = build_model(tmp_path, TASK, ["--arch", "momentum_iterative_nat", *SMALL, *extra])
    return model.double(), task


@pytest.mark.parametrize("extra", [[], ["--connection", "adaptive", "--cross-attention", "linear"]])
def test_encoder_and_decoder_are_invariant_to_padding(tmp_path, make_generator, extra):
    model, task = small_model(tmp_path, *extra)
    g = make_generator()
    d = task.source_dictionary
    src = [torch.randint(d.nspecial, len(d), (n,), generator=g) for n in (6, 3)]
    tgt = [torch.randint(d.nspecial, len(task.target_dictionary), (n,), generator=g) for n in (7, 4)]
    pad = d.pad()
    src_batch = torch.full((2, 6), pad)
    tgt_batch = torch.full((2, 7), pad)
    for i in range(2):
        src_batch[i, 6 - len(src[i]):] = src[i]
        tgt_batch[i, : len(tgt[i])] = tgt[i]
    with torch.no_grad():
        enc = model.encoder(src_batch, torch.tensor([6, 3]))
        out = model.decoder(normalize=False, prev_output_tokens=tgt_batch, encoder_out=enc)
        for i in range(2):
            enc_i = model.encoder(src[i][None], torch.tensor([len(src[i])]))
            torch.testing.assert_close(enc["encoder_out"][0][6 - len(src[i]):, i],
                                       enc_i["encoder_out"][0][:, 0], rtol=1e-9, atol=1e-9)
            alone = model.decoder(normalize=False, prev_output_tokens=tgt[i][None], encoder_out=enc_i)
            torch.testing.assert_close(out[i, : len(tgt[i])], alone[0], rtol=1e-9, atol=1e-9)


def test_decoder_self_attention_sees_the_whole_target(tmp_path, make_generator):
    """Non-autoregressive: changing the last target token changes the first output."""
    model, task = small_model(tmp_path)
    assert not model.decoder.layers[0].self_attn.causal
    g = make_generator()
    src = torch.randint(4, 20, (1, 5), generator=g)
    tgt = torch.randint(4, 20, (1, 6), generator=g)
    other = tgt.clone()
    other[0, -1] = 4 if tgt[0, -1] != 4 else 5
    with torch.no_grad():
        enc = model.encoder(src, torch.tensor([5]))
        a = model.decoder(normalize=False, prev_output_tokens=tgt, encoder_out=enc)
        b = model.decoder(normalize=False, prev_output_tokens=other, encoder_out=enc)
    assert not torch.allclose(a[0, 0], b[0, 0])


def test_presets_follow_section_4_4_and_table_1():
    a = parse_namespace("momentum_iterative_nat_iwslt16", task="translation_lev")
    got = (a.encoder_embed_dim, a.encoder_ffn_embed_dim, a.encoder_layers, a.encoder_attention_heads,
           a.decoder_layers, a.dropout, a.attention_momentum, a.attention_step_size, a.cross_attention)
    assert got == (278, 507, 5, 2, 5, 0.1, 0.6, 0.6, "momentum")
    b = parse_namespace("linear_iterative_nat_iwslt16", task="translation_lev")
    assert (b.attention_momentum, b.attention_step_size, b.cross_attention) == (0.0, 1.0, "linear")


def test_bad_momentum_fails_at_parsing(capsys):
    with pytest.raises(SystemExit):
        parse_namespace("momentum_iterative_nat", "--attention-momentum", "2", task="translation_lev")
    assert "argument --attention-momentum: must be in [0, 1), got 2" in capsys.readouterr().err


def test_cli_train_and_iterative_generate(tmp_path):
    data = preprocess_translation(write_parallel_text(tmp_path / "text", seed=5), tmp_path / "bin")
    save = tmp_path / "ckpt"
    train(data, save, *TASK, "--arch", "momentum_iterative_nat", *SMALL, "--criterion", "nat_loss",
          "--noise", "full_mask", "--train-step", "2", "--dae-ratio", "0.5", "--stochastic-approx",
          "--apply-bert-init", "--connection", "momentum", "--ddp-backend", "legacy_ddp",
          "--max-tokens", "600", "--max-update", "8", "--optimizer", "adam", "--lr", "0.003")
    out = run_cli("generate", data, "--user-dir", USER_DIR, *TASK, "--path", save / "checkpoint_last.pt",
                  "--cpu", "--iter-decode-max-iter", "3", "--iter-decode-eos-penalty", "0", "--beam", "1",
                  "--print-step", "--batch-size", "8", "--gen-subset", "test",
                  "--required-batch-size-multiple", "1")
    assert sorted(map(int, re.findall(r"^H-(\d+)\t", out.stdout, re.M))) == list(range(20))
    assert re.search(r"^I-0\t\d+", out.stdout, re.M) and "BLEU4" in out.stdout
