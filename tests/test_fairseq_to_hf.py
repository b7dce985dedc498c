"""fairseq_momentum.convert_to_hf: a fairseq momentum_transformer_lm becomes a transformers
MomentumTransformerForCausalLM with fairseq's logits (float64, every position option, tied or
not, connections, hybrids, the linear preset), on padded batches too; generate() continues a prompt
as fairseq's own argmax does; a momentum_roberta becomes a MomentumTransformerForMaskedLM with
fairseq's logits (post- and pre-LN, tied or not, hybrid); what has no counterpart is refused by
its option; and through the CLIs: fairseq-train, the converter, then transformers alone (remote
code, the saved tokenizer, the text-generation and fill-mask pipelines). Also the two config
fields conversion needs, scale_embedding and embedding_layer_norm."""
import json
import os

import pytest
import torch
from helpers.clean_process import run_clean
from helpers.fairseq_cli import (
    WORDS,
    build_model,
    lm_args,
    preprocess_lm,
    random_tokens,
    run_module,
    train,
    write_lm_text,
)

import hf_momentum  # noqa: F401  (registers the model types with the Auto classes)
from fairseq_momentum.convert_to_hf import to_transformers

SIZES = ["--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
         "--decoder-attention-heads", "2"]
SMALL = [*SIZES, "--attention-momentum", "0.5", "--attention-step-size", "0.8"]
CONFIGS = {
    "sinusoidal-scaled-untied": [],
    "learned-unscaled-tied-momentum": ["--decoder-learned-pos", "--no-scale-embedding",
                                       "--share-decoder-input-output-embed", "--connection", "momentum",
                                       "--connection-momentum", "0.4"],
    "adaptive-connection-elu-embedding-norm": ["--connection", "adaptive", "--feature-map", "elu",
                                               "--layernorm-embedding"],
    "hybrid-relu-map": ["--layer-types", "linear_attention,full_attention", "--connection", "adaptive",
                        "--feature-map", "relu"],
    # fairseq computes gelu in float32 (fairseq.modules.gelu), so this one agrees to float32 rounding
    "gelu": ["--activation-fn", "gelu"],
}


def fairseq_lm(tmp_path, *extra, arch="momentum_transformer_lm", sizes=SMALL):
    model, task, args = build_model(tmp_path, *lm_args(arch, *sizes, *extra))
    return model.double().eval(), task, args


def tolerance(config):
    return 1e-6 if config == "gelu" else 1e-9


@pytest.mark.parametrize("config", CONFIGS)
def test_converted_model_gives_fairseqs_logits(tmp_path, make_generator, config):
    model, task, args = fairseq_lm(tmp_path, *CONFIGS[config])
    converted = to_transformers(model, args, task.target_dictionary)
    assert converted.model.embed_tokens.weight.dtype == torch.float64
    tokens = random_tokens(task, 3, 13, make_generator())
    with torch.no_grad():
        expected = model(tokens)[0]
        got = converted(input_ids=tokens).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=tolerance(config))
    tied = converted.lm_head.weight is converted.model.embed_tokens.weight
    assert tied == ("--share-decoder-input-output-embed" in CONFIGS[config])


def test_linear_preset_converts_to_momentum_zero(tmp_path, make_generator):
    model, task, args = fairseq_lm(tmp_path, arch="linear_transformer_lm", sizes=SIZES)
    converted = to_transformers(model, args, task.target_dictionary)
    assert (converted.config.attention_momentum, converted.config.attention_step_size) == (0.0, 1.0)
    tokens = random_tokens(task, 2, 9, make_generator())
    with torch.no_grad():
        torch.testing.assert_close(converted(input_ids=tokens).logits, model(tokens)[0], rtol=0, atol=1e-9)


def assert_padded_rows_alone(model, converted, task, generator, side, lengths=(9, 4, 1), atol=1e-9):
    """The converted model's logits of a batch padded on `side` equal fairseq's of each row alone."""
    rows = [random_tokens(task, 1, n, generator)[0] for n in lengths]
    total = max(lengths)
    ids = torch.full((len(rows), total), task.target_dictionary.pad())
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        span = slice(0, len(row)) if side == "right" else slice(total - len(row), total)
        ids[i, span], mask[i, span] = row, 1
    with torch.no_grad():
        logits = converted(input_ids=ids, attention_mask=mask).logits
        for i, row in enumerate(rows):
            torch.testing.assert_close(logits[i][mask[i].bool()], model(row[None])[0][0], rtol=0, atol=atol)


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batch_gives_each_row_fairseqs_logits_alone(tmp_path, make_generator, side):
    model, task, args = fairseq_lm(tmp_path, "--connection", "adaptive")
    converted = to_transformers(model, args, task.target_dictionary)
    assert_padded_rows_alone(model, converted, task, make_generator(), side)


def assert_greedy_continuation(model, converted, task, generator, steps=8):
    """Greedy generate() of the converted model continues a prompt as the argmax of fairseq's full
    forward over the growing sequence; the pad token is never chosen, as in fairseq's
    SequenceGenerator (fairseq reads it as padding wherever it stands)."""
    prompt = random_tokens(task, 1, 5, generator)
    pad = task.target_dictionary.pad()
    with torch.no_grad():
        tokens = converted.generate(prompt, max_new_tokens=steps, do_sample=False, eos_token_id=None,
                                    suppress_tokens=[pad])
        expected = prompt
        for _ in range(steps):
            last = model(expected)[0][:, -1:]
            last[..., pad] = -torch.inf
            expected = torch.cat([expected, last.argmax(-1)], dim=1)
    assert torch.equal(tokens, expected)


def test_generate_continues_a_prompt_as_fairseqs_argmax(tmp_path, make_generator):
    """Greedy generate() (eq. 12's recurrent state, one token a step) of a hybrid."""
    model, task, args = fairseq_lm(tmp_path, "--connection", "adaptive",
                                   "--layer-types", "linear_attention,full_attention")
    assert_greedy_continuation(model, to_transformers(model, args, task.target_dictionary), task,
                               make_generator())


@pytest.mark.parametrize("extra, message", [
    (["--adaptive-softmax-cutoff", "10"], "--adaptive-softmax-cutoff '10': a momentum_transformer model has "
                                          "no counterpart"),
    (["--decoder-output-dim", "8"], "--decoder-output-dim 8 differs from --decoder-embed-dim 16"),
    (["--no-token-positional-embeddings"], "--no-token-positional-embeddings True"),
])
def test_options_without_a_counterpart_are_refused_by_name(tmp_path, extra, message):
    model, task, args = fairseq_lm(tmp_path, *extra)
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace("+", r"\+")):
        to_transformers(model, args, task.target_dictionary)


def test_a_language_model_takes_no_head(tmp_path):
    model, task, args = fairseq_lm(tmp_path)
    with pytest.raises(ValueError, match="--head picks one of a momentum_roberta's heads"):
        to_transformers(model, args, task.target_dictionary, head="masked_lm")


def test_other_architectures_are_refused_by_name(tmp_path):
    sizes = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "8",
             "--decoder-embed-dim", "8", "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16",
             "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
    model, task, args = build_model(tmp_path, ["--task", "translation", "--source-lang", "src",
                                               "--target-lang", "tgt"], ["--arch", "transformer", *sizes])
    refusal = (r"converts momentum_transformer_lm, .* momentum_lstm and fairseq's lstm "
               r"\(and their presets\), ")
    with pytest.raises(ValueError, match=refusal + r"got TransformerModel \(--arch transformer\)"):
        to_transformers(model, args, task.target_dictionary)


# Every character Python's str.split() breaks words at (fairseq's tokenize_line), Unicode's whitespace
# and U+001C-U+001F, which Unicode does not count as whitespace.
PYTHON_WHITESPACE = "".join(chr(c) for c in range(0x3001) if chr(c).isspace())


@pytest.mark.parametrize("pattern", ["eos", "none", "bos_eos"])
def test_the_word_tokenizer_splits_words_where_fairseq_does(pattern):
    """The word-level tokenizer saved for a dictionary of words gives encode_line's ids on text
    separated by every character Python counts as whitespace, one at a time and in runs."""
    from fairseq.data import Dictionary

    from fairseq_momentum.convert_to_hf import word_tokenizer
    dictionary = Dictionary()
    for word in WORDS:
        dictionary.add_symbol(word)
    tokenizer = word_tokenizer(dictionary, 256, pattern)
    words = list(WORDS)
    for i, space in enumerate(PYTHON_WHITESPACE):
        line = f"{space}{words[i % len(words)]}{space}cat{space * 2}dog unknown{space}"
        ids = dictionary.encode_line(line, add_if_not_exist=False, append_eos=pattern != "none").tolist()
        if pattern == "bos_eos":
            ids = [dictionary.bos()] + ids
        assert tokenizer(line)["input_ids"] == ids, repr(space)


def fairseq_sample(dictionary, first, second, init, separator):
    """The ids fairseq's sentence_prediction task feeds for `first` (and `second`), built with its
    own datasets as its load_dataset builds them: each text ends with `</s>`, the first follows
    --init-token, the second --separator-token."""
    from fairseq.data import ConcatSentencesDataset, ListDataset, PrependTokenDataset

    def texts(*lines):
        ids = [dictionary.encode_line(line, add_if_not_exist=False).long() for line in lines]
        return ListDataset(ids, sizes=[len(i) for i in ids])
    input0 = texts(first)
    if init is not None:
        input0 = PrependTokenDataset(input0, init)
    if second is None:
        return input0[0].tolist()
    input1 = texts(second)
    if separator is not None:
        input1 = PrependTokenDataset(input1, separator)
    return ConcatSentencesDataset(input0, input1)[0].tolist()


@pytest.mark.parametrize("init, separator", [(None, None), (0, None), (0, 2), (None, 2)])
@pytest.mark.parametrize("kind", ["fast word-level", "dictionary"])
def test_a_classifiers_tokenizer_builds_its_tasks_samples(kind, init, separator, tmp_path):
    """A sentence_prediction classifier's tokenizer lays a text and a pair out as its task did in
    training (--init-token, --separator-token; RoBERTa's 0 and 2 give `<s> a </s> </s> b </s>`),
    in both tokenizer classes, saved and loaded again; the special-tokens mask marks what was added."""
    from fairseq.data import Dictionary
    from transformers import AutoConfig, AutoTokenizer

    from fairseq_momentum.convert_to_hf import dictionary_tokenizer, saved_tokenizer, wrapping
    from hf_momentum.tokenization_fairseq_dictionary import FairseqWordTokenizer
    dictionary = Dictionary()
    for word in WORDS:
        dictionary.add_symbol(word)
    dictionary.add_symbol("<mask>")      # as sentence_prediction's dictionary has it
    config = AutoConfig.for_model("momentum_transformer", vocab_size=len(dictionary), is_causal=False)
    if kind == "fast word-level":
        tokenizer = saved_tokenizer(dictionary, config, None, None, sample=(init, separator))
    else:   # the class of the sentencepiece, GPT-2 and subword-nmt tokenizers
        pattern = wrapping(dictionary, config, (init, separator))
        tokenizer = dictionary_tokenizer(FairseqWordTokenizer, [], dictionary, pattern, 64)
    tokenizer.save_pretrained(tmp_path / "saved")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "saved", trust_remote_code=True)
    first, second = "the cat sees a dog", "a small bird"
    assert tokenizer(first)["input_ids"] == fairseq_sample(dictionary, first, None, init, separator)
    pair = tokenizer(first, second, return_special_tokens_mask=True)
    expected = fairseq_sample(dictionary, first, second, init, separator)
    assert pair["input_ids"] == expected
    words = dictionary.encode_line(f"{first} {second}", add_if_not_exist=False, append_eos=False).tolist()
    assert [i for i, added in zip(expected, pair["special_tokens_mask"]) if not added] == words


def test_a_classifier_trained_with_other_special_tokens_gets_no_tokenizer(caplog):
    from fairseq.data import Dictionary
    from transformers import AutoConfig

    from fairseq_momentum.convert_to_hf import saved_tokenizer
    dictionary = Dictionary()
    config = AutoConfig.for_model("momentum_transformer", vocab_size=len(dictionary), is_causal=False)
    assert saved_tokenizer(dictionary, config, None, None, sample=(dictionary.unk(), None)) is None
    assert "--init-token 3 / --separator-token None" in caplog.text


def run_converter(checkpoint, out, *options):
    """`python -m fairseq_momentum.convert_to_hf checkpoint out *options`; the config.json it wrote."""
    proc = run_module("fairseq_momentum.convert_to_hf", checkpoint, out, *options)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "config.json").read_text())


def save_fairseq_logits(checkpoint, line, path, wrap=False, **head):
    """fairseq's own logits on `line` (its ids, in `<s> ... </s>` with `wrap`, as masked_lm and
    sentence_prediction's --init-token 0 give them; `head`: the model's forward keywords), saved
    with those ids at `path` for a clean process to compare against."""
    from fairseq import checkpoint_utils
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    dictionary = task.source_dictionary
    ids = dictionary.encode_line(line, add_if_not_exist=False, append_eos=wrap).long()
    if wrap:
        ids = torch.cat([torch.tensor([dictionary.bos()]), ids])
    with torch.no_grad():
        torch.save({"ids": ids[None], "logits": model.eval()(ids[None], **head)[0]}, path)


def clean_load_and_compare(auto_class, out, expected, line):
    """Script lines for a clean process: `tokenizer` and `model` (an `auto_class`) from `out` with
    its remote code; `ids` of `line` and the model's `logits` checked against fairseq's."""
    return f"""
        import torch
        from transformers import {auto_class}, AutoTokenizer, pipeline
        tokenizer = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)
        model = {auto_class}.from_pretrained({str(out)!r}, trust_remote_code=True).eval()
        expected = torch.load({str(expected)!r})
        ids = tokenizer({line!r}, return_tensors="pt")["input_ids"]
        assert torch.equal(ids, expected["ids"]), (ids, expected["ids"])
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        torch.testing.assert_close(logits, expected["logits"], rtol=1e-5, atol=1e-5)
    """


def test_cli_converts_a_trained_checkpoint_that_transformers_loads_alone(tmp_path):
    data = preprocess_lm(write_lm_text(tmp_path / "text", seed=4), tmp_path / "bin")
    save = tmp_path / "ckpt"
    train(data, save, "--task", "language_modeling", "--arch", "momentum_transformer_lm", *SMALL,
          "--connection", "adaptive", "--tokens-per-sample", "32", "--batch-size", "16", "--max-update", "6",
          "--optimizer", "adam", "--lr", "0.003")
    out = tmp_path / "hf"
    config = run_converter(save / "checkpoint_last.pt", out)
    assert (config["model_type"], config["max_position_embeddings"], config["scale_embedding"]) == \
        ("momentum_transformer", 32, True)

    assert_loads_alone_as_a_causal_lm(save / "checkpoint_last.pt", out, tmp_path)
    assert os.path.exists(out / "model.safetensors")


def assert_loads_alone_as_a_causal_lm(checkpoint, out, tmp_path, line="the cat sees a small dog"):
    """In a process without our packages, the converted LM in `out` (remote code, its tokenizer) gives
    fairseq's ids and logits of `line` and continues a prompt through the text-generation pipeline."""
    expected = tmp_path / "expected.pt"
    save_fairseq_logits(checkpoint, line, expected)
    proc = run_clean(clean_load_and_compare("AutoModelForCausalLM", out, expected, line) + """
        text = pipeline("text-generation", model=model, tokenizer=tokenizer)("the cat", max_new_tokens=4,
                                                                           do_sample=False)
        assert text[0]["generated_text"].startswith("the cat"), text
        print("OK", type(model).__module__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK transformers_modules" in proc.stdout


def test_scale_embedding_is_part_of_the_input_embedding(make_generator):
    """scale_embedding multiplies the token embeddings by √hidden_size inside the embedding module,
    so inputs_embeds built with get_input_embeddings() give what input_ids give; the scale survives
    resizing the vocabulary; activation_dropout reaches the feed-forward."""
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model("momentum_transformer", vocab_size=30, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, scale_embedding=True, activation_dropout=0.25)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 30, (2, 5), generator=make_generator())
    embedding = model.get_input_embeddings()
    torch.testing.assert_close(embedding(ids), embedding.weight[ids] * 4.0, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs_embeds=embedding(ids)).logits, model(input_ids=ids).logits,
                                   rtol=0, atol=0)
    assert model.resize_token_embeddings(40).embed_scale == 4.0
    assert model.model.layers[0].mlp.activation_dropout.p == 0.25
    unscaled = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "momentum_transformer", vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2))
    assert type(unscaled.get_input_embeddings()) is torch.nn.Embedding


ROBERTA = ["--encoder-layers", "2", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
           "--encoder-attention-heads", "2", "--attention-momentum", "0.5", "--attention-step-size", "0.8"]
ROBERTA_CONFIGS = {
    # roberta's defaults: post-LN, embedding layer norm, learned positions, tied head; fairseq's gelu
    # is computed in float32
    "post-gelu": [],
    "post-relu": ["--activation-fn", "relu"],
    "prenorm-relu": ["--activation-fn", "relu", "--encoder-normalize-before"],
    "hybrid-untied-adaptive": ["--activation-fn", "relu", "--layer-types", "linear_attention,full_attention",
                               "--untie-weights-roberta", "--connection", "adaptive"],
}


def fairseq_roberta(tmp_path, *extra):
    model, task, args = build_model(tmp_path, ["--task", "masked_lm", "--tokens-per-sample", "64"],
                                    ["--arch", "momentum_roberta", *ROBERTA, *extra])
    return model.double().eval(), task, args


@pytest.mark.parametrize("config", ROBERTA_CONFIGS)
def test_converted_roberta_is_a_masked_lm_with_fairseqs_logits(tmp_path, make_generator, config):
    """momentum_roberta → MomentumTransformerForMaskedLM: the LM head's logits on a right-padded
    batch (fairseq's layout) equal fairseq's at every real token."""
    model, task, args = fairseq_roberta(tmp_path, *ROBERTA_CONFIGS[config])
    converted = to_transformers(model, args, task.source_dictionary)
    assert type(converted).__name__ == "MomentumTransformerForMaskedLM" and not converted.config.is_causal
    assert (converted.lm_head.weight is converted.model.embed_tokens.weight) == ("untied" not in config)
    gen = make_generator()
    pad = task.source_dictionary.pad()
    ids = random_tokens(task, 3, 11, gen)
    ids[1, 7:], ids[2, 3:] = pad, pad
    mask = ids.ne(pad)
    with torch.no_grad():
        expected = model(ids)[0]
        got = converted(input_ids=ids, attention_mask=mask.long()).logits
    torch.testing.assert_close(got[mask], expected[mask], rtol=0, atol=1e-6 if "gelu" in config else 1e-9)


def test_cli_converts_a_pretrained_roberta_for_the_fill_mask_pipeline(tmp_path):
    data = preprocess_lm(write_lm_text(tmp_path / "text", seed=6), tmp_path / "bin")
    save = tmp_path / "ckpt"
    train(data, save, "--task", "masked_lm", "--criterion", "masked_lm", "--arch", "momentum_roberta",
          *ROBERTA, "--tokens-per-sample", "32", "--batch-size", "16", "--max-update", "6",
          "--optimizer", "adam", "--lr", "0.003", "--sample-break-mode", "eos")
    out = tmp_path / "hf"
    config = run_converter(save / "checkpoint_last.pt", out)
    assert config["architectures"] == ["MomentumTransformerForMaskedLM"]

    line = "the cat <mask> a small dog"
    expected = tmp_path / "expected.pt"
    save_fairseq_logits(save / "checkpoint_last.pt", line, expected, wrap=True)
    proc = run_clean(clean_load_and_compare("AutoModelForMaskedLM", out, expected, line) + f"""
        filled = pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=3)({line!r})
        position = ids[0].tolist().index(tokenizer.mask_token_id)
        assert [c["token"] for c in filled] == logits[0, position].topk(3).indices.tolist(), filled
        print("OK", type(model).__module__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK transformers_modules" in proc.stdout


def test_embedding_layer_norm_normalises_token_plus_position_embeddings(make_generator):
    from transformers import AutoConfig, AutoModel
    config = AutoConfig.for_model("momentum_transformer", vocab_size=30, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, embedding_layer_norm=True, is_causal=False)
    torch.manual_seed(0)
    model = AutoModel.from_config(config).eval()
    torch.nn.init.normal_(model.embed_norm.weight)
    ids = torch.randint(0, 30, (2, 5), generator=make_generator())
    with torch.no_grad():
        first = model(input_ids=ids, output_hidden_states=True).hidden_states[0]
        summed = model.embed_tokens(ids) + model.embed_positions(torch.arange(5))
        norm = model.embed_norm
        expected = torch.nn.functional.layer_norm(summed, (16,), norm.weight, norm.bias,
                                                  config.layer_norm_eps)
    torch.testing.assert_close(first, expected, rtol=1e-6, atol=1e-6)
    plain = AutoModel.from_config(AutoConfig.for_model("momentum_transformer", vocab_size=30, hidden_size=16,
                                                       num_hidden_layers=1, num_attention_heads=2))
    assert isinstance(plain.embed_norm, torch.nn.Identity)


def roberta_with_heads(tmp_path, *names):
    model, task, args = fairseq_roberta(tmp_path, "--activation-fn", "relu", "--pooler-activation-fn", "tanh")
    for name in names:
        model.register_classification_head(name, num_classes=3)
    return model.double().eval(), task, args


def test_fine_tuned_roberta_converts_to_a_sequence_classifier_with_fairseqs_logits(tmp_path, make_generator):
    """A classification head (fairseq's sentence_prediction) → ...ForSequenceClassification with
    classifier_pooling "first" and RoBERTa's dense + tanh: its logits on a right-padded batch
    starting with <s> equal fairseq's, and the label names come along."""
    model, task, args = roberta_with_heads(tmp_path, "sentence_classification_head")
    converted = to_transformers(model, args, task.source_dictionary, labels=["neg", "neu", "pos"])
    assert type(converted).__name__ == "MomentumTransformerForSequenceClassification"
    assert (converted.config.classifier_pooling, converted.config.classifier_hidden_act) == ("first", "tanh")
    assert converted.config.id2label == {0: "neg", 1: "neu", 2: "pos"}
    dictionary = task.source_dictionary
    ids = random_tokens(task, 3, 10, make_generator())
    ids[:, 0] = dictionary.bos()
    ids[1, 6:], ids[2, 2:] = dictionary.pad(), dictionary.pad()
    with torch.no_grad():
        expected = model(ids, classification_head_name="sentence_classification_head")[0]
        got = converted(input_ids=ids, attention_mask=ids.ne(dictionary.pad()).long()).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)


def test_a_roberta_head_is_chosen_by_name(tmp_path):
    model, task, args = roberta_with_heads(tmp_path, "first", "second")
    with pytest.raises(ValueError, match=r"classification heads \['first', 'second'\]; name one"):
        to_transformers(model, args, task.source_dictionary)
    with pytest.raises(ValueError, match="head 'third'"):
        to_transformers(model, args, task.source_dictionary, head="third")
    second = to_transformers(model, args, task.source_dictionary, head="second")
    torch.testing.assert_close(second.score.weight, model.classification_heads["second"].out_proj.weight)
    masked = to_transformers(model, args, task.source_dictionary, head="masked_lm")
    assert type(masked).__name__ == "MomentumTransformerForMaskedLM"


def test_cli_converts_a_fine_tuned_roberta_for_the_text_classification_pipeline(tmp_path):
    from test_fairseq_roberta import fine_tune_data
    text = write_lm_text(tmp_path / "text", seed=3)
    fine = fine_tune_data(text, preprocess_lm(text, tmp_path / "bin") / "dict.txt", tmp_path)
    save = tmp_path / "ckpt"
    train(fine, save, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
          "--num-classes", "2", "--init-token", "0", "--max-positions", "32", "--arch", "momentum_roberta",
          *ROBERTA, "--batch-size", "16", "--max-update", "4", "--optimizer", "adam", "--lr", "0.003")
    out = tmp_path / "hf"
    config = run_converter(save / "checkpoint_last.pt", out)
    assert config["architectures"] == ["MomentumTransformerForSequenceClassification"]
    assert set(config["id2label"].values()) == {"pet", "none"}
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 32
    line = "the cat sees a small dog"
    expected = tmp_path / "expected.pt"
    save_fairseq_logits(save / "checkpoint_last.pt", line, expected, wrap=True,
                        classification_head_name="sentence_classification_head")
    proc = run_clean(clean_load_and_compare("AutoModelForSequenceClassification", out, expected, line) + f"""
        classify = pipeline("text-classification", model=model, tokenizer=tokenizer, top_k=None,
                            trust_remote_code=True)
        scores = classify([{line!r}])[0]
        best = max(scores, key=lambda s: s["score"])["label"]
        assert best == model.config.id2label[int(logits.argmax())], scores
        print("OK", type(model).__module__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK transformers_modules" in proc.stdout


def test_cli_converts_a_regression_on_sentence_pairs_as_roberta_fine_tunes_it(tmp_path):
    """sentence_prediction on pairs with --regression-target and RoBERTa's --init-token 0
    --separator-token 2: the converted tokenizer gives the task's own samples for `tokenizer(a, b)`,
    the model their values, and the config says regression (no label names from the input
    dictionary; the text-classification pipeline returns the value, not a sigmoid of it)."""
    from fairseq import checkpoint_utils
    from helpers.fairseq_cli import preprocess
    text = write_lm_text(tmp_path / "text", seed=3)
    dictionary = preprocess_lm(text, tmp_path / "bin") / "dict.txt"
    fine, seconds = tmp_path / "fine", tmp_path / "seconds"
    (fine / "label").mkdir(parents=True)
    seconds.mkdir()
    for split in ("train", "valid"):
        lines = (text / f"{split}.txt").read_text().splitlines()
        (seconds / f"{split}.txt").write_text("".join(" ".join(line.split()[::-1]) + "\n" for line in lines))
        (fine / "label" / f"{split}.label").write_text("".join(f"{len(line) / 100}\n" for line in lines))
    for name, folder in (("input0", text), ("input1", seconds)):
        preprocess("--only-source", "--trainpref", folder / "train.txt", "--validpref", folder / "valid.txt",
                   "--srcdict", dictionary, "--destdir", fine / name, "--workers", "1")
    save = tmp_path / "ckpt"
    train(fine, save, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
          "--regression-target", "--num-classes", "1", "--init-token", "0", "--separator-token", "2",
          "--max-positions", "48", "--arch", "momentum_roberta", *ROBERTA, "--batch-size", "16",
          "--max-update", "4", "--optimizer", "adam", "--lr", "0.003")
    out = tmp_path / "hf"
    config = run_converter(save / "checkpoint_last.pt", out)
    assert config["problem_type"] == "regression" and config["id2label"] == {"0": "LABEL_0"}, config
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([str(save / "checkpoint_last.pt")])
    task.load_dataset("valid")
    sample = task.dataset("valid")[0]["net_input.src_tokens"]
    first = (text / "valid.txt").read_text().splitlines()[0]
    second = " ".join(first.split()[::-1])
    with torch.no_grad():
        value = model.eval()(sample[None], features_only=True,
                             classification_head_name="sentence_classification_head")[0]
    torch.save({"ids": sample[None], "value": value}, tmp_path / "expected.pt")
    proc = run_clean(f"""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
        tokenizer = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)
        model = AutoModelForSequenceClassification.from_pretrained({str(out)!r}, trust_remote_code=True)
        model.eval()
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        ids = tokenizer({first!r}, {second!r}, return_tensors="pt")["input_ids"]
        assert torch.equal(ids, expected["ids"]), (ids, expected["ids"])
        with torch.no_grad():
            value = model(input_ids=ids).logits
        torch.testing.assert_close(value, expected["value"], rtol=1e-5, atol=1e-5)
        score = pipeline("text-classification", model=model, tokenizer=tokenizer)(
            {{"text": {first!r}, "text_pair": {second!r}}})
        assert abs(score["score"] - float(value)) < 1e-5, (score, value)
        print("OK")
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK" in proc.stdout
