"""fairseq_momentum.convert_to_hf for the translation model: a fairseq `momentum_transformer`
(`--task translation`) becomes a transformers MomentumSeq2SeqForConditionalGeneration with
fairseq's logits (float64; left-padded sources and right-padded targets as fairseq batches them;
momentum, linear and softmax cross-attention; pre- and post-LN; sinusoidal and learned positions;
one embedding matrix or three; hybrids; the linear preset), greedy generate() gives fairseq's
SequenceGenerator hypotheses, what the config cannot hold is refused by its option, and through the
CLIs: fairseq-train, the converter, then transformers alone (remote code, the saved tokenizer,
generate)."""
import json

import pytest
import torch
from helpers.clean_process import run_clean
from helpers.fairseq_cli import build_model, preprocess, train, write_parallel_text
from helpers.fairseq_decoding import padded_sentences
from test_fairseq_to_hf import run_converter
from test_hf_seq2seq import assert_layout

import hf_momentum  # noqa: F401  (registers the model types with the Auto classes)
from fairseq_momentum.convert_to_hf import to_transformers

STACK = {"layers": "2", "embed-dim": "16", "ffn-embed-dim": "32", "attention-heads": "2"}
SIZES = [*(part for side in ("encoder", "decoder") for option, value in STACK.items()
           for part in (f"--{side}-{option}", value)),
         "--attention-momentum", "0.5", "--attention-step-size", "0.8"]
TASK = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt"]
CONFIGS = {
    "shared-sinusoidal-momentum-cross": ["--share-all-embeddings"],
    "prenorm-learned-linear-cross-momentum-connection": [
        "--share-all-embeddings", "--encoder-normalize-before", "--decoder-normalize-before",
        "--encoder-learned-pos", "--decoder-learned-pos", "--cross-attention", "linear",
        "--connection", "momentum"],
    "softmax-cross-hybrid-adaptive": ["--share-all-embeddings", "--cross-attention", "softmax",
                                      "--layer-types", "linear_attention,full_attention",
                                      "--connection", "adaptive"],
    "separate-embeddings-tied-output-relu-map": ["--share-decoder-input-output-embed",
                                                 "--layernorm-embedding", "--feature-map", "relu"],
    "three-matrices-unscaled": ["--no-scale-embedding"],
}


def train_and_convert(text, tmp_path, *converter_flags):
    """fairseq-preprocess of the segmented parallel text `text`/{train,valid}.bpe.{src,tgt} (one
    dictionary), six updates of fairseq-train, then the converter with `converter_flags`: (the
    checkpoint, the transformers folder)."""
    data, save, out = tmp_path / "bin", tmp_path / "ckpt", tmp_path / "hf"
    preprocess("--source-lang", "src", "--target-lang", "tgt", "--trainpref", text / "train.bpe",
               "--validpref", text / "valid.bpe", "--destdir", data, "--workers", "1", "--joined-dictionary")
    train(data, save, *TASK, "--arch", "momentum_transformer", *SIZES, "--share-all-embeddings",
          "--batch-size", "16", "--max-update", "6", "--optimizer", "adam", "--lr", "0.003")
    checkpoint = save / "checkpoint_last.pt"
    assert run_converter(checkpoint, out, *converter_flags)["model_type"] == "momentum_seq2seq"
    return checkpoint, out


def fairseq_translation(tmp_path, *extra, arch="momentum_transformer", joined=True, sizes=SIZES):
    model, task, args = build_model(tmp_path, TASK, ["--arch", arch, *sizes, *extra], joined=joined)
    return model.double().eval(), task, args


def convert(model, task, args):
    return to_transformers(model, args, task.source_dictionary, target_dictionary=task.target_dictionary)


def batch(task, generator):
    """Left-padded sources and right-padded previous-output tokens (fairseq's layout), and masks."""
    source, target = task.source_dictionary, task.target_dictionary
    src, _ = padded_sentences(source, [6, 9, 3], generator, left_pad=True)
    prev, _ = padded_sentences(target, [5, 2, 7], generator, left_pad=False)
    prev = torch.cat([torch.full((3, 1), target.eos()), prev[:, :-1]], dim=1)   # </s> starts the decoder
    return src, src.ne(source.pad()), prev, prev.ne(target.pad())


@pytest.mark.parametrize("config", CONFIGS)
def test_converted_translation_model_gives_fairseqs_logits(tmp_path, make_generator, config):
    model, task, args = fairseq_translation(tmp_path, *CONFIGS[config])
    converted = convert(model, task, args)
    assert type(converted).__name__ == "MomentumSeq2SeqForConditionalGeneration"
    assert_layout(converted, [0, 0, 0] if "--share-all-embeddings" in CONFIGS[config] else
                  [0, 1, 1] if "--share-decoder-input-output-embed" in CONFIGS[config] else [0, 1, 2])
    assert_same_logits(model, converted, task, make_generator(), tolerance(CONFIGS[config]))


def assert_same_logits(model, converted, task, generator, atol):
    """The converted model's logits at every real target position equal fairseq's."""
    src, src_mask, prev, prev_mask = batch(task, generator)
    with torch.no_grad():
        expected = model(src, src_mask.sum(-1), prev)[0]
        got = converted(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=prev,
                        decoder_attention_mask=prev_mask.long()).logits
    torch.testing.assert_close(got[prev_mask], expected[prev_mask], rtol=0, atol=atol)


def tolerance(options):
    """fairseq's softmax attention computes its weights in float32 (fairseq.utils.softmax)."""
    return 1e-6 if "softmax" in options else 1e-9


def test_linear_preset_converts_to_momentum_zero(tmp_path, make_generator):
    model, task, args = fairseq_translation(tmp_path, "--share-all-embeddings", arch="linear_transformer",
                                            sizes=SIZES[:-4])
    converted = convert(model, task, args)
    assert (converted.config.attention_momentum, converted.config.cross_attention) == (0.0, "linear")
    src, src_mask, prev, _ = batch(task, make_generator())
    with torch.no_grad():
        got = converted(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=prev).logits
        torch.testing.assert_close(got[:, 0], model(src, src_mask.sum(-1), prev)[0][:, 0], rtol=0, atol=1e-9)


@pytest.mark.parametrize("cross", ["momentum", "softmax"])
def test_greedy_generate_gives_fairseqs_hypotheses(tmp_path, make_generator, cross):
    """generate() on a left-padded batch (the decoder's recurrent state and the cross-attention
    memories in the cache) against fairseq's SequenceGenerator with beam 1, which never emits pad
    and no </s> first (min_len 1): the same tokens up to fairseq's length limit, and </s> wherever
    fairseq stopped before it."""
    model, task, args = fairseq_translation(tmp_path, "--share-all-embeddings", "--cross-attention", cross)
    assert_greedy_hypotheses(model, convert(model, task, args), task, make_generator())


def assert_greedy_hypotheses(model, converted, task, generator, batch_of=None):
    """Greedy generate() gives fairseq's SequenceGenerator (beam 1) hypotheses (see above) on the
    sources of `batch_of(task, generator)` (default `batch`)."""
    from fairseq.sequence_generator import SequenceGenerator
    dictionary = task.target_dictionary
    src, src_mask, _, _ = (batch_of or batch)(task, generator)
    limit = 8
    search = SequenceGenerator([model], dictionary, beam_size=1, max_len_a=0, max_len_b=limit)
    with torch.no_grad():
        hypotheses = search.generate([model], {"net_input": {"src_tokens": src,
                                                                "src_lengths": src_mask.sum(-1)}})
        tokens = converted.generate(input_ids=src, attention_mask=src_mask.long(), do_sample=False,
                                    num_beams=1, max_new_tokens=limit, min_new_tokens=1,
                                    suppress_tokens=[dictionary.pad()])
    for row, hypothesis in zip(tokens, hypotheses):
        words = hypothesis[0]["tokens"]
        assert torch.equal(row[1:len(words)], words[:-1])
        if len(words) <= limit:
            assert row[len(words)] == dictionary.eos()


@pytest.mark.parametrize("seed, at_limit", [(1, False), (2, False), (0, True), (1, True), (3, True)],
                         ids=["defaults-1", "defaults-2", "limit-0", "limit-1", "limit-3"])
def test_beam_search_gives_fairseqs_hypotheses_and_scores(tmp_path, seed, at_limit):
    """generate() with the converted generation_config (fairseq-generate's 5 beams, length penalty
    1, early stopping, no </s> first, no padding symbol) finds fairseq's SequenceGenerator
    hypotheses and scores (its score is transformers' sequences_score) where they end before the
    length limit (every row of seeds 1 and 2); with `FairseqLengthLimit` also where they reach it
    (most rows of seeds 0 and 3).
    `</s>`'s output embedding is scaled up so that some hypotheses end early."""
    from fairseq.sequence_generator import SequenceGenerator
    from transformers import LogitsProcessorList

    from hf_momentum import FairseqLengthLimit
    torch.manual_seed(seed)
    model, task, args = fairseq_translation(tmp_path, "--share-all-embeddings")
    dictionary = task.target_dictionary
    with torch.no_grad():
        model.decoder.embed_tokens.weight[dictionary.eos()] *= 3.0
    converted = convert(model, task, args)
    src, src_mask, _, _ = batch(task, torch.Generator().manual_seed(seed))
    limit = 12
    search = SequenceGenerator([model], dictionary, beam_size=5, max_len_a=0, max_len_b=limit)
    # fairseq's hypotheses hold up to `limit` tokens and </s>; transformers' also the start token
    processors = LogitsProcessorList([FairseqLengthLimit(limit + 2, dictionary.eos())] if at_limit else [])
    with torch.no_grad():
        hypotheses = search.generate([model], {"net_input": {"src_tokens": src,
                                                                "src_lengths": src_mask.sum(-1)}})
        out = converted.generate(input_ids=src, attention_mask=src_mask.long(), max_length=limit + 2,
                                 logits_processor=processors, output_scores=True,
                                 return_dict_in_generate=True)
    assert converted.generation_config.num_beams == 5
    compared = 0
    for row, scores, hypothesis in zip(out.sequences, out.sequences_scores, hypotheses):
        words = hypothesis[0]["tokens"]
        if len(words) == limit + 1 and not at_limit:          # </s> forced by fairseq at its limit
            continue
        assert torch.equal(row[1:len(words) + 1], words), (row, words)
        torch.testing.assert_close(scores, hypothesis[0]["score"].to(scores.dtype), rtol=1e-6, atol=1e-6)
        compared += 1
    assert compared >= 2


@pytest.mark.parametrize("extra", [["--share-decoder-input-output-embed"], []], ids=["tied-output", "untied"])
def test_two_dictionaries_convert_to_two_vocabularies(tmp_path, make_generator, extra):
    """Without --joined-dictionary the source and target dictionaries differ: the encoder reads the
    source's, the decoder and the LM head the target's; fairseq's logits and greedy hypotheses."""
    model, task, args = fairseq_translation(tmp_path, *extra, joined=False)
    converted = convert(model, task, args)
    assert (converted.config.vocab_size, converted.config.decoder_vocab_size) == \
        (len(task.source_dictionary), len(task.target_dictionary))
    assert_layout(converted, [0, 1, 1] if extra else [0, 1, 2])
    assert_same_logits(model, converted, task, make_generator(), 1e-9)
    assert_greedy_hypotheses(model, converted, task, make_generator())


@pytest.mark.parametrize("extra, joined, message", [
    (["--share-all-embeddings", "--decoder-ffn-embed-dim", "24"], True,
     "--encoder-ffn-embed-dim 32 differs from --decoder-ffn-embed-dim 24"),
    (["--share-all-embeddings", "--decoder-normalize-before"], True,
     "--encoder-normalize-before False differs from --decoder-normalize-before True"),
    (["--share-all-embeddings", "--no-cross-attention"], True, "--no-cross-attention"),
    (["--share-all-embeddings", "--decoder-output-dim", "8"], True, "--decoder-output-dim 8 differs"),
])
def test_what_the_config_cannot_hold_is_refused_by_name(tmp_path, extra, joined, message):
    model, task, args = fairseq_translation(tmp_path, *extra, joined=joined)
    with pytest.raises(ValueError, match="^" + message):
        convert(model, task, args)


def test_cli_converts_a_trained_translation_model_that_transformers_runs_alone(tmp_path):
    text = write_parallel_text(tmp_path / "text", seed=5)
    data = tmp_path / "bin"
    preprocess("--source-lang", "src", "--target-lang", "tgt", "--trainpref", text / "train", "--validpref",
               text / "valid", "--destdir", data, "--workers", "1", "--joined-dictionary")
    save = tmp_path / "ckpt"
    train(data, save, *TASK, "--arch", "momentum_transformer", *SIZES, "--share-all-embeddings",
          "--cross-attention", "softmax", "--batch-size", "16", "--max-update", "6", "--optimizer", "adam",
          "--lr", "0.003", "--max-source-positions", "64", "--max-target-positions", "48")
    out = tmp_path / "hf"
    config = run_converter(save / "checkpoint_last.pt", out)
    assert (config["model_type"], config["max_position_embeddings"], config["cross_attention"],
            config["tie_word_embeddings"]) == ("momentum_seq2seq", 48, "softmax", True)

    assert_translates_alone(save / "checkpoint_last.pt", out, tmp_path, max_length=49)


def assert_translates_alone(checkpoint, out, tmp_path, max_length):
    """The converted folder `out`, in a process without our packages (remote code), tokenizes a raw
    line as fairseq's dictionary does, gives fairseq's logits for fairseq's greedy hypothesis and
    generates that hypothesis, which its tokenizer decodes; its generation_config is fairseq-generate's
    (5 beams, `max_length`)."""
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator
    line = "the cat sees a small dog"
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    dictionary = task.source_dictionary
    ids = dictionary.encode_line(line, add_if_not_exist=False).long()[None]
    generator = SequenceGenerator([model.eval()], dictionary, beam_size=1, max_len_a=0, max_len_b=6)
    with torch.no_grad():
        hypothesis = generator.generate(
            [model], {"net_input": {"src_tokens": ids, "src_lengths": torch.tensor([ids.shape[1]])}})[0][0]
        logits = model(ids, torch.tensor([ids.shape[1]]), hypothesis["tokens"][None].roll(1, -1))[0]
    torch.save({"ids": ids, "logits": logits, "hypothesis": hypothesis["tokens"]}, tmp_path / "expected.pt")
    proc = run_clean(f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)
        model = AutoModelForSeq2SeqLM.from_pretrained({str(out)!r}, trust_remote_code=True).eval()
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        ids = tokenizer({line!r}, return_tensors="pt")["input_ids"]
        assert torch.equal(ids, expected["ids"]), (ids, expected["ids"])
        words = expected["hypothesis"]
        with torch.no_grad():
            logits = model(input_ids=ids, decoder_input_ids=words[None].roll(1, -1)).logits
            generation = model.generation_config
            assert (generation.num_beams, generation.max_length) == (5, {max_length})
            tokens = model.generate(input_ids=ids, do_sample=False, num_beams=1, max_new_tokens=6,
                                    min_new_tokens=1, suppress_tokens=[tokenizer.pad_token_id])
        torch.testing.assert_close(logits, expected["logits"], rtol=1e-5, atol=1e-5)
        assert torch.equal(tokens[0, 1:len(words)], words[:-1]), (tokens, words)
        text = tokenizer.decode(tokens[0], skip_special_tokens=True)
        assert text == tokenizer.decode(words, skip_special_tokens=True) and text, text
        print("OK", type(model).__module__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK transformers_modules" in proc.stdout


def test_cli_converts_a_model_of_two_dictionaries_with_a_tokenizer_of_both(tmp_path):
    """fairseq-preprocess without --joined-dictionary (its default): the saved tokenizer encodes a
    source with the source dictionary and `text_target=` with the target's, and decodes generated ids
    with the target's, so transformers alone turns a raw line into fairseq's greedy translation."""
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator
    from helpers.fairseq_cli import translate
    text = write_parallel_text(tmp_path / "text", seed=6)
    data = tmp_path / "bin"
    preprocess("--source-lang", "src", "--target-lang", "tgt", "--trainpref", text / "train", "--validpref",
               text / "valid", "--destdir", data, "--workers", "1")
    save = tmp_path / "ckpt"
    train(data, save, *TASK, "--arch", "momentum_transformer", *SIZES, "--share-decoder-input-output-embed",
          "--batch-size", "16", "--max-update", "6", "--optimizer", "adam", "--lr", "0.003",
          "--max-source-positions", "64", "--max-target-positions", "48")
    out = tmp_path / "hf"
    run_converter(save / "checkpoint_last.pt", out)
    assert json.loads((out / "tokenizer_config.json").read_text())["auto_map"]["AutoTokenizer"][0] == \
        "tokenization_fairseq_dictionary.FairseqWordTokenizer"

    line = "the cat sees a small dog"
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([str(save / "checkpoint_last.pt")])
    source, target = task.source_dictionary, task.target_dictionary
    assert source.symbols != target.symbols
    ids = source.encode_line(line, add_if_not_exist=False).long()[None]
    labels = target.encode_line(" ".join(translate(line.split())), add_if_not_exist=False).long()
    generator = SequenceGenerator([model.eval()], target, beam_size=1, max_len_a=0, max_len_b=6)
    with torch.no_grad():
        hypothesis = generator.generate(
            [model], {"net_input": {"src_tokens": ids, "src_lengths": torch.tensor([ids.shape[1]])}})[0][0]
    torch.save({"ids": ids, "labels": labels, "hypothesis": hypothesis["tokens"],
                "text": target.string(hypothesis["tokens"])}, tmp_path / "expected.pt")
    proc = run_clean(f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)
        model = AutoModelForSeq2SeqLM.from_pretrained({str(out)!r}, trust_remote_code=True).eval()
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        batch = tokenizer({line!r}, text_target={" ".join(translate(line.split()))!r}, return_tensors="pt")
        assert torch.equal(batch["input_ids"], expected["ids"]), (batch["input_ids"], expected["ids"])
        assert torch.equal(batch["labels"][0], expected["labels"]), (batch["labels"], expected["labels"])
        words = expected["hypothesis"]
        with torch.no_grad():
            tokens = model.generate(input_ids=batch["input_ids"], do_sample=False, num_beams=1,
                                    max_new_tokens=6, min_new_tokens=1,
                                    suppress_tokens=[tokenizer.pad_token_id])
        assert torch.equal(tokens[0, 1:len(words)], words[:-1]), (tokens, words)
        text = tokenizer.decode(tokens[0], skip_special_tokens=True)
        assert text == expected["text"] and text, (text, expected["text"])
        print("OK", type(tokenizer).__module__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK transformers_modules" in proc.stdout
