"""fairseq_momentum.convert_to_hf for the LSTM translation model: a fairseq `momentum_lstm`
(`--task translation`) becomes a transformers MomentumLSTMSeq2SeqForConditionalGeneration with
fairseq's logits and gradients (float64; every cell, fairseq's own `lstm` as the plain one;
left-padded sources and right-padded targets as fairseq batches them; bidirectional encoder with its
final states projected to the decoder's width; no attention; a projection to --decoder-out-embed-dim;
one embedding matrix, two or three; two dictionaries), greedy
and beam generate() give fairseq's SequenceGenerator hypotheses and scores, an adaptive softmax is
refused by its option, and through the CLIs: fairseq-train, the converter, then transformers alone
(remote code, the saved tokenizer, generate) and recipes/hf/run_translation.py fine-tuning it."""
import pytest
import torch
from helpers.fairseq_cli import build_model, cell_flags, preprocess, train, write_parallel_text
from helpers.fairseq_decoding import padded_sentences
from test_fairseq_to_hf import run_converter
from test_fairseq_translation_to_hf import assert_greedy_hypotheses, assert_translates_alone

import hf_momentum  # noqa: F401  (registers the model types with the Auto classes)
from fairseq_momentum.convert_to_hf import to_transformers
from plugins.rnn import cell_names

TASK = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt"]
SIZES = ["--encoder-embed-dim", "10", "--decoder-embed-dim", "10", "--encoder-hidden-size", "12",
         "--decoder-hidden-size", "12", "--decoder-out-embed-dim", "10", "--encoder-layers", "2",
         "--decoder-layers", "2"]
SHARED_BIDIRECTIONAL = ["--encoder-bidirectional", "--share-all-embeddings"]
LAYOUTS = {
    "bidirectional-shared": ["--encoder-bidirectional", "--share-all-embeddings"],
    "tied-output-wider-decoder": ["--share-decoder-input-output-embed", "--decoder-hidden-size", "14"],
    "three-matrices-out-projection": ["--decoder-out-embed-dim", "8"],
    "no-attention": ["--decoder-attention", "0", "--share-all-embeddings"],
}


def fairseq_lstm_translation(tmp_path, *extra, joined=True, arch="momentum_lstm"):
    model, task, args = build_model(tmp_path, TASK, ["--arch", arch, *SIZES, *extra], joined=joined)
    model = model.double().eval()
    with torch.no_grad():   # fairseq's uniform(-0.1, 0.1) initialisation barely moves the logits
        for name, parameter in model.named_parameters():
            # (a MomentumLSTM's recurrent weights start as Appendix F says; fairseq's lstm's too are uniform)
            if "embed_tokens" in name or "proj" in name or "fc" in name or arch == "lstm":
                parameter.mul_(5)
    return model, task, args


def convert(model, task, args):
    return to_transformers(model, args, task.source_dictionary, target_dictionary=task.target_dictionary)


def batch(task, generator):
    """Left-padded sources, longest first (fairseq's LSTM encoder packs them sorted), and right-padded
    previous-output tokens starting with </s>, and their masks."""
    source, target = task.source_dictionary, task.target_dictionary
    src, _ = padded_sentences(source, [9, 6, 3], generator, left_pad=True)
    prev, _ = padded_sentences(target, [5, 2, 7], generator, left_pad=False)
    prev = torch.cat([torch.full((3, 1), target.eos()), prev[:, :-1]], dim=1)
    return src, src.ne(source.pad()), prev, prev.ne(target.pad())


def assert_same_logits(model, converted, task, generator):
    """The converted model's logits at every real target position equal fairseq's (its attention
    rounds the scores to float32 before the softmax, also in a float64 model)."""
    src, src_mask, prev, prev_mask = batch(task, generator)
    with torch.no_grad():
        expected = model(src, src_mask.sum(-1), prev)[0]
        got = converted(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=prev,
                        decoder_attention_mask=prev_mask.long()).logits
    atol = 1e-10 if converted.model.decoder.attention is None else 1e-6
    torch.testing.assert_close(got[prev_mask], expected[prev_mask], rtol=0, atol=atol)
    assert expected[prev_mask].std() > 0.1      # the comparison sees logits that differ


@pytest.mark.parametrize("cell", cell_names("lstm"))
def test_every_cell_converts_with_fairseqs_logits(tmp_path, make_generator, cell):
    model, task, args = fairseq_lstm_translation(tmp_path, "--encoder-bidirectional", *cell_flags(cell))
    converted = convert(model, task, args)
    assert type(converted).__name__ == "MomentumLSTMSeq2SeqForConditionalGeneration"
    assert converted.config.cell == cell
    assert_same_logits(model, converted, task, make_generator())


@pytest.mark.parametrize("layout", ["bidirectional-shared", "three-matrices-out-projection"])
def test_fairseqs_own_lstm_converts_as_the_plain_cell(tmp_path, make_generator, layout):
    """fairseq's `--arch lstm` (nn.LSTM encoder, nn.LSTMCell decoder layers) converts with
    cell="lstm": fairseq's logits and greedy hypotheses."""
    model, task, args = fairseq_lstm_translation(tmp_path, *LAYOUTS[layout], arch="lstm")
    converted = convert(model, task, args)
    assert converted.config.cell == "lstm"
    assert_same_logits(model, converted, task, make_generator())
    assert_greedy_hypotheses(model, converted, task, make_generator(), batch)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_converts_with_fairseqs_logits(tmp_path, make_generator, layout):
    extra = LAYOUTS[layout]
    model, task, args = fairseq_lstm_translation(tmp_path, *cell_flags("momentum"), *extra)
    converted = convert(model, task, args)
    embeddings = [converted.model.encoder.embed_tokens.weight, converted.model.decoder.embed_tokens.weight,
                  converted.lm_head.weight]
    shared = "--share-all-embeddings" in extra
    tied = shared or "--share-decoder-input-output-embed" in extra
    assert (embeddings[0] is embeddings[1], embeddings[1] is embeddings[2]) == (shared, tied)
    assert (converted.lm_head.bias is None) == tied
    decoder = converted.model.decoder
    assert (decoder.encoder_hidden_proj is None) == (model.decoder.encoder_hidden_proj is None)
    assert (decoder.attention is None) == (layout == "no-attention")
    assert (decoder.additional_fc is None) == (not hasattr(model.decoder, "additional_fc"))
    assert_same_logits(model, converted, task, make_generator())


@pytest.mark.parametrize("layout", ["bidirectional-shared", "no-attention", "three-matrices-out-projection"])
def test_gradients_equal_fairseqs(tmp_path, make_generator, layout):
    """The gradient of every weight of the converted model (a weighted sum of the logits at real
    target positions of a padded batch) equals that of the fairseq weight it came from."""
    model, task, args = fairseq_lstm_translation(tmp_path, *cell_flags("adam"), *LAYOUTS[layout])
    converted = convert(model, task, args)
    g = make_generator()
    src, src_mask, prev, prev_mask = batch(task, g)
    weights = torch.randn(*prev.shape, len(task.target_dictionary), generator=g, dtype=torch.float64)
    weights = weights * prev_mask[..., None]
    (model(src, src_mask.sum(-1), prev)[0] * weights).sum().backward()
    logits = converted(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=prev,
                       decoder_attention_mask=prev_mask.long()).logits
    (logits * weights).sum().backward()
    fairseq_weights = {p.data_ptr(): p for p in model.parameters()}
    sources = {name: fairseq_weights[t.data_ptr()] for name, t in converted_sources(model, converted)}
    attention = converted.model.decoder.attention is not None
    compared = 0
    for name, parameter in converted.named_parameters():
        # fairseq's attention rounds its scores to float32 (see assert_same_logits)
        tolerance = dict(rtol=1e-5, atol=1e-5) if attention else dict(rtol=0, atol=1e-10)
        torch.testing.assert_close(parameter.grad, sources[name].grad, **tolerance,
                                   msg=lambda message: f"{name}: {message}")
        compared += bool(parameter.grad.any())
    assert compared == len(list(converted.parameters()))


def converted_sources(model, converted):
    """(transformers name, fairseq tensor) of every converted weight."""
    from fairseq_momentum.convert_lstm_translation import lstm_translation_state_dict
    return lstm_translation_state_dict(model, converted.config).items()


@pytest.mark.parametrize("extra", [["--share-decoder-input-output-embed"], []], ids=["tied-output", "untied"])
def test_two_dictionaries_convert_to_two_vocabularies(tmp_path, make_generator, extra):
    model, task, args = fairseq_lstm_translation(tmp_path, *cell_flags("adam"), *extra, joined=False)
    converted = convert(model, task, args)
    assert (converted.config.vocab_size, converted.config.decoder_vocab_size) == \
        (len(task.source_dictionary), len(task.target_dictionary))
    assert converted.model.encoder.embed_tokens.weight is not converted.model.decoder.embed_tokens.weight
    assert_same_logits(model, converted, task, make_generator())
    assert_greedy_hypotheses(model, converted, task, make_generator(), batch)


@pytest.mark.parametrize("cell", ["momentum", "nag"])
def test_greedy_generate_gives_fairseqs_hypotheses(tmp_path, make_generator, cell):
    model, task, args = fairseq_lstm_translation(tmp_path, *SHARED_BIDIRECTIONAL, *cell_flags(cell))
    assert_greedy_hypotheses(model, convert(model, task, args), task, make_generator(), batch)


@pytest.mark.parametrize("seed", [1, 2])
def test_beam_search_gives_fairseqs_hypotheses_and_scores(tmp_path, seed):
    """generate() with the converted generation_config (fairseq-generate's 5 beams, length penalty 1,
    early stopping, no </s> first, no padding symbol) and `FairseqLengthLimit`: beam search reorders
    the decoder's state and fed-back output in the cache, and finds fairseq's hypotheses and scores.
    `</s>`'s output row is scaled up so that some hypotheses end before the limit."""
    from fairseq.sequence_generator import SequenceGenerator
    from transformers import LogitsProcessorList

    from hf_momentum import FairseqLengthLimit
    torch.manual_seed(seed)
    model, task, args = fairseq_lstm_translation(tmp_path, *SHARED_BIDIRECTIONAL, *cell_flags("adam"))
    dictionary = task.target_dictionary
    with torch.no_grad():
        model.decoder.embed_tokens.weight[dictionary.eos()] *= 3.0
    converted = convert(model, task, args)
    src, src_mask, _, _ = batch(task, torch.Generator().manual_seed(seed))
    limit = 12
    search = SequenceGenerator([model], dictionary, beam_size=5, max_len_a=0, max_len_b=limit)
    with torch.no_grad():
        hypotheses = search.generate([model], {"net_input": {"src_tokens": src,
                                                                "src_lengths": src_mask.sum(-1)}})
        out = converted.generate(input_ids=src, attention_mask=src_mask.long(), max_length=limit + 2,
                                 logits_processor=LogitsProcessorList([FairseqLengthLimit(limit + 2,
                                                                                          dictionary.eos())]),
                                 output_scores=True, return_dict_in_generate=True)
    assert (converted.generation_config.num_beams, converted.generation_config.max_length) == (5, 202)
    lengths = []
    for row, scores, hypothesis in zip(out.sequences, out.sequences_scores, hypotheses):
        words = hypothesis[0]["tokens"]
        assert torch.equal(row[1:len(words) + 1], words), (row, words)
        torch.testing.assert_close(scores, hypothesis[0]["score"].to(scores.dtype), rtol=1e-6, atol=1e-6)
        lengths.append(len(words))
    assert min(lengths) <= limit, lengths      # a hypothesis that ended before the limit was compared


def test_adaptive_softmax_is_refused_by_its_option(tmp_path):
    model, task, args = fairseq_lstm_translation(tmp_path, "--criterion", "adaptive_loss",
                                                 "--adaptive-softmax-cutoff", "5")
    with pytest.raises(ValueError, match="^--adaptive-softmax-cutoff 5 "):
        convert(model, task, args)


def test_cli_converts_a_trained_lstm_translation_model_that_transformers_runs_alone(tmp_path):
    text = write_parallel_text(tmp_path / "text", seed=5)
    data = tmp_path / "bin"
    preprocess("--source-lang", "src", "--target-lang", "tgt", "--trainpref", text / "train", "--validpref",
               text / "valid", "--destdir", data, "--workers", "1", "--joined-dictionary")
    save = tmp_path / "ckpt"
    train(data, save, *TASK, "--arch", "momentum_lstm", *SIZES, "--encoder-bidirectional",
          "--share-all-embeddings", *cell_flags("momentum"), "--batch-size", "16", "--max-update", "6",
          "--optimizer", "adam", "--lr", "0.003")
    out = tmp_path / "hf"
    config = run_converter(save / "checkpoint_last.pt", out)
    assert (config["model_type"], config["cell"], config["encoder_bidirectional"],
            config["share_encoder_decoder_embeddings"]) == ("momentum_lstm_seq2seq", "momentum", True, True)

    assert_translates_alone(save / "checkpoint_last.pt", out, tmp_path, max_length=202)
    assert_fine_tunes_with_the_recipe(out, text, tmp_path)


def assert_fine_tunes_with_the_recipe(model_dir, text, tmp_path):
    """recipes/hf/run_translation.py --model_name_or_path fine-tunes the converted model on the
    training pairs with its saved tokenizer (remote code): the loss falls from the converted model's."""
    import json
    import sys

    from helpers.train_clm import run
    from test_hf_run_translation import SCRIPT, logged_losses
    pairs = zip((text / "train.src").read_text().splitlines(), (text / "train.tgt").read_text().splitlines())
    (tmp_path / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    out = tmp_path / "tuned"
    run([sys.executable, str(SCRIPT), "--model_name_or_path", str(model_dir), "--trust_remote_code", "true",
         "--train_file", str(tmp_path / "train.tsv"), "--output_dir", str(out), "--do_train",
         "--max_steps", "30", "--logging_steps", "5", "--learning_rate", "1e-2",
         "--per_device_train_batch_size", "16", "--report_to", "none", "--use_cpu", "--save_strategy", "no",
         "--disable_tqdm", "true"], tmp_path)
    losses = logged_losses(out)
    assert losses[-1] < losses[0], losses
    assert json.loads((out / "config.json").read_text())["model_type"] == "momentum_lstm_seq2seq"
