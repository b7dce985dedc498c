"""fairseq hybrids (issue 29, item 3): `--layer-types` puts fairseq's softmax attention layers
among the momentum layers of momentum_transformer (encoder and decoder) and
momentum_transformer_lm. Incremental decoding with beam reordering equals the full forward,
padded rows equal each sequence alone, and a bad list is refused naming the flag."""
import pytest
import torch
from fairseq.modules import MultiheadAttention
from helpers.fairseq_cli import build_model, lm_args, parse_namespace, random_tokens
from helpers.fairseq_decoding import check_incremental_decoding, padded_sentences

from fairseq_momentum.modules.momentum_attention import MomentumMultiheadAttention

TASK = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt"]
SMALL_MT = ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "32",
            "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
            "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--connection", "momentum"]
SMALL_LM = ["--decoder-layers", "3", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
            "--decoder-attention-heads", "4", "--connection", "momentum"]
HYBRID = ["--layer-types", "linear_attention,full_attention,linear_attention"]
# fairseq's MultiheadAttention takes its softmax in float32 even for a float64 model.
TOL = dict(rtol=1e-6, atol=1e-6)


def kinds(layers):
    return [type(layer.self_attn) for layer in layers]


def translation(tmp_path, *extra):
    model, task, _ = build_model(tmp_path, TASK, ["--arch", "momentum_transformer", *SMALL_MT, *extra])
    return model.double().eval(), task


def language_model(tmp_path, *extra):
    model, task, _ = build_model(tmp_path, *lm_args("momentum_transformer_lm", *SMALL_LM, *extra))
    return model.double().eval(), task


def test_layer_types_choose_each_layers_attention(tmp_path):
    model, _ = translation(tmp_path, *HYBRID)
    expected = [MomentumMultiheadAttention, MultiheadAttention, MomentumMultiheadAttention]
    assert kinds(model.encoder.layers) == expected and kinds(model.decoder.layers) == expected
    assert all(layer.connection is not None for layer in model.decoder.layers)
    plain, _ = translation(tmp_path)
    assert kinds(plain.decoder.layers) == [MomentumMultiheadAttention] * 3


@pytest.mark.parametrize("left_pad", [True, False], ids=["left_pad", "right_pad"])
def test_hybrid_encoder_rows_equal_each_sentence_alone(tmp_path, make_generator, left_pad):
    model, task = translation(tmp_path, *HYBRID)
    lengths = [9, 5, 2]
    batch, seqs = padded_sentences(task.source_dictionary, lengths, make_generator(), left_pad)
    with torch.no_grad():
        out = model.encoder(batch, torch.tensor(lengths))["encoder_out"][0]
        for i, s in enumerate(seqs):
            alone = model.encoder(s[None], torch.tensor([len(s)]))["encoder_out"][0][:, 0]
            got = out[9 - len(s):, i] if left_pad else out[: len(s), i]
            torch.testing.assert_close(got, alone, **TOL)


def test_hybrid_translation_decoding_equals_the_full_forward_with_beam_reordering(tmp_path, make_generator):
    model, task = translation(tmp_path, *HYBRID)
    g = make_generator()
    src, _ = padded_sentences(task.source_dictionary, [7, 4], g, left_pad=True)
    src, src_lengths = src.repeat_interleave(2, 0), torch.tensor([7, 7, 4, 4])
    tgt = random_tokens(task, 4, 8, g)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths)
    check_incremental_decoding(model, tgt, {3: torch.tensor([1, 1, 3, 2]), 5: torch.tensor([0, 1, 2, 2])},
                               encoder_out=enc, **TOL)


def test_hybrid_lm_decoding_equals_the_full_forward_and_padded_rows_each_alone(tmp_path, make_generator):
    model, task = language_model(tmp_path, *HYBRID)
    assert kinds(model.decoder.layers)[1] is MultiheadAttention
    tokens = random_tokens(task, 4, 11, make_generator())
    check_incremental_decoding(model, tokens, {4: torch.tensor([2, 0, 0, 3]), 8: torch.tensor([3, 1, 2, 1])},
                               **TOL)
    pad = task.target_dictionary.pad()
    batch = torch.full((3, 7), pad)
    seqs = [tokens[i, :n] for i, n in enumerate([7, 4, 2])]
    for i, s in enumerate(seqs):
        batch[i, : len(s)] = s
    with torch.no_grad():
        out = model.decoder(batch)[0]
        for i, s in enumerate(seqs):
            torch.testing.assert_close(out[i, : len(s)], model.decoder(s[None])[0][0], **TOL)


def test_bad_layer_types_fail_at_parsing(capsys):
    with pytest.raises(SystemExit):
        parse_namespace("momentum_transformer_lm", "--layer-types", "linear_attention,sliding_attention")
    err = capsys.readouterr().err
    assert "argument --layer-types" in err and "'sliding_attention'" in err


def test_a_layer_types_list_of_the_wrong_length_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--layer-types has 2 entries but the decoder has 3 layers"):
        language_model(tmp_path, "--layer-types", "linear_attention,full_attention")


def test_pruned_stacks_keep_their_layers_kinds(tmp_path, make_generator):
    """fairseq's --encoder-layers-to-keep / --decoder-layers-to-keep (a --model-overrides of a
    trained model) prune a hybrid: each kept layer keeps its --layer-types kind, and the pruned
    model equals a two-layer model of those layers' weights."""
    import re
    kinds_flag = ["--layer-types", "full_attention,linear_attention,full_attention"]
    full, task, args = build_model(tmp_path, TASK, ["--arch", "momentum_transformer", *SMALL_MT, *kinds_flag])
    full = full.double()
    args.encoder_layers_to_keep = args.decoder_layers_to_keep = "1,2"   # as an override gives them
    pruned = task.build_model(args).double().eval()
    pruned.load_state_dict(full.state_dict(), model_cfg=args)           # fairseq renames the kept layers
    expected = [MomentumMultiheadAttention, MultiheadAttention]
    assert kinds(pruned.encoder.layers) == expected and kinds(pruned.decoder.layers) == expected
    small, _ = translation(tmp_path, *[flag if flag != "3" else "2" for flag in SMALL_MT],
                           "--layer-types", "linear_attention,full_attention")
    renamed = {}
    for name, value in full.state_dict().items():
        layer = re.match(r"(.*\.layers\.)(\d+)(\..*)", name)
        if layer is None:
            renamed[name] = value
        elif layer.group(2) != "0":
            renamed[f"{layer.group(1)}{int(layer.group(2)) - 1}{layer.group(3)}"] = value
    small.load_state_dict(renamed)
    source, _ = padded_sentences(task.source_dictionary, [6, 3], make_generator(), left_pad=True)
    target = random_tokens(task, 2, 4, make_generator())
    with torch.no_grad():
        got = pruned(source, torch.tensor([6, 3]), target)[0]
        torch.testing.assert_close(got, small(source, torch.tensor([6, 3]), target)[0], rtol=0, atol=0)
        assert not torch.allclose(got, full(source, torch.tensor([6, 3]), target)[0])
