"""recipes/hf/run_translation.py: Seq2SeqTrainer trains the encoder-decoder on TSV pairs with a
BPE tokenizer it trains itself (the training loss falls, evaluation and test translate with beam
search and report BLEU), the saved model and tokenizer translate through the Auto classes; two
CPU ranks under torchrun (gloo) end with one model, each rank's process group destroyed before it
exits; a TSV line without one tab is refused by number. The LSTM encoder-decoder trains with the
same recipe, and a saved model fine-tunes with --model_name_or_path."""
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from helpers.fairseq_cli import write_parallel_text
from helpers.train_clm import run
from ports import free_port

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "recipes" / "hf" / "run_translation.py"
EXIT_PROBE = REPO / "tests" / "helpers" / "exit_probe"
TINY = ["--hidden_size", "64", "--encoder_layers", "2", "--decoder_layers", "2", "--vocab_size", "120",
        "--dropout", "0", "--max_target_length", "32", "--per_device_train_batch_size", "32",
        "--learning_rate", "2e-3", "--report_to", "none", "--use_cpu", "--save_strategy", "no",
        "--disable_tqdm", "true", "--seed", "0"]


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    """train / valid / test TSV files of the fairseq tests' toy translation (words mapped, pairs swapped)."""
    folder = tmp_path_factory.mktemp("pairs")
    text = write_parallel_text(folder / "text", sizes=(("train", 2000), ("valid", 40), ("test", 40)), seed=2)
    for split in ("train", "valid", "test"):
        sources = (text / f"{split}.src").read_text().splitlines()
        targets = (text / f"{split}.tgt").read_text().splitlines()
        (folder / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(sources, targets)))
    return folder


def data_args(tsv):
    return ["--train_file", str(tsv / "train.tsv"), "--validation_file", str(tsv / "valid.tsv"),
            "--test_file", str(tsv / "test.tsv")]


def test_trains_evaluates_and_saves_a_model_that_translates(tsv, tmp_path):
    out = tmp_path / "out"
    run([sys.executable, str(SCRIPT), *data_args(tsv), "--output_dir", str(out), "--do_train", "--do_eval",
         "--do_predict", "--predict_with_generate", "--generation_num_beams", "2", "--max_steps", "300",
         "--logging_steps", "50", *TINY], tmp_path)
    losses = [row["loss"] for row in json.loads((out / "trainer_state.json").read_text())["log_history"]
              if "loss" in row]
    assert losses[-1] < 0.5 * losses[0], losses
    results = json.loads((out / "test_results.json").read_text())
    assert results["test_bleu"] > 0 and results["test_loss"] < losses[0], results
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["cross_attention"]) == ("momentum_seq2seq", "momentum")

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import hf_momentum  # noqa: F401  (registers momentum_seq2seq)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    batch = tokenizer(["the cat sees a small dog", "a red fox"], return_tensors="pt", padding=True)
    assert (batch["input_ids"][0] == tokenizer.eos_token_id).sum() == 1     # a source ends in </s>
    with torch.no_grad():
        tokens = model.generate(**batch, num_beams=2, max_new_tokens=16)
    assert all(tokenizer.batch_decode(tokens, skip_special_tokens=True))


def test_the_lstm_encoder_decoder_trains_and_a_saved_model_fine_tunes(tsv, tmp_path):
    """--model_type momentum_lstm_seq2seq trains the attentional MomentumLSTM encoder-decoder with the
    same recipe; --model_name_or_path then fine-tunes the saved model with its saved tokenizer (its
    first loss is the trained model's, below the fresh model's first), with activation checkpointing."""
    out, tuned = tmp_path / "out", tmp_path / "tuned"
    # embeddings at twice fairseq's initial scale: the attention finds the toy task's alignment
    # within these 250 steps
    lstm = ["--model_type", "momentum_lstm_seq2seq", "--cell", "momentum", "--momentum", "0.5",
            "--learning_rate", "1e-2", "--config_overrides", "initializer_range=0.2"]
    run([sys.executable, str(SCRIPT), *data_args(tsv), "--output_dir", str(out), "--do_train", "--do_predict",
         "--predict_with_generate", "--generation_num_beams", "2", "--max_steps", "250", "--logging_steps",
         "10", *TINY, *lstm], tmp_path)
    losses = logged_losses(out)
    assert losses[-1] < 0.5 * losses[0], losses
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["cell"], config["momentum"], config["encoder_bidirectional"]) == \
        ("momentum_lstm_seq2seq", "momentum", 0.5, True)
    assert json.loads((out / "test_results.json").read_text())["test_bleu"] > 0
    run([sys.executable, str(SCRIPT), *data_args(tsv), "--output_dir", str(tuned), "--do_train",
         "--model_name_or_path", str(out), "--max_steps", "10", "--logging_steps", "1",
         "--activation_checkpointing", *TINY], tmp_path)
    assert logged_losses(tuned)[0] < 0.5 * losses[0]


def logged_losses(out):
    return [row["loss"] for row in json.loads((out / "trainer_state.json").read_text())["log_history"]
            if "loss" in row]


def test_two_cpu_ranks_train_one_model(tsv, tmp_path):
    out = tmp_path / "out"
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = run([str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(free_port()), str(SCRIPT), *data_args(tsv)[:2], "--output_dir", str(out),
                "--do_train", "--max_steps", "4", "--ddp_backend", "gloo",
                "--ddp_find_unused_parameters", "false", "--log_level", "info", *TINY], tmp_path,
               extra_env={"PYTHONPATH": f"{EXIT_PROBE}{os.pathsep}{REPO}"})
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and (out / "model.safetensors").exists()
    batch = "Total train batch size (w. parallel, distributed & accumulation) = 64"    # 2 ranks x 32
    assert batch in proc.stdout + proc.stderr
    # a gloo group left up at exit can abort a rank that has finished (recipes/common/hf_trainer.py's
    # end_ranks); the launcher and both ranks report theirs down
    exits = re.findall(r"process group up at exit: (\w+)", proc.stdout)
    assert exits == ["False"] * 3, exits


def load_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("run_translation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_files_the_corpus_splits_are_read(tmp_path, monkeypatch):
    """--corpus goes through recipes.common.parallel (stood in for here: the Bible takes minutes to
    read), its valid split becoming the validation pairs."""
    from recipes.common import parallel
    splits = {split: [(f"{split} source {i}", f"{split} target {i}") for i in range(3)]
              for split in ("train", "valid", "test")}

    def corpus(source, cache, out_dir):
        return source, "en", "es", parallel.write_parallel(splits, out_dir, "en", "es")

    monkeypatch.setattr(parallel, "parallel_corpus", corpus)
    module = load_script()
    pairs = module.corpus_pairs(module.DataArguments(cache_dir=tmp_path / "cache"), tmp_path)
    assert pairs == {"train": splits["train"], "validation": splits["valid"], "test": splits["test"]}


def test_a_tsv_line_without_one_tab_is_refused_by_number(tmp_path):
    module = load_script()
    path = tmp_path / "bad.tsv"
    path.write_text("a\tb\nno tab here\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: expected source<TAB>target, got 1 fields"):
        module.read_tsv(path)


def test_lstm_arguments_are_checked():
    module = load_script()
    tokenizer = module.train_tokenizer([("a b c d", "e f g h")] * 20, 120)
    arguments = dict(model_type="momentum_lstm_seq2seq", hidden_size=16, encoder_layers=2, decoder_layers=2)
    config = module.build_model(module.ModelArguments(**arguments, cell="nag", step_size=0.3),
                                tokenizer).config
    assert (config.cell, config.step_size, config.num_hidden_layers, config.vocab_size) == \
        ("nag", 0.3, 2, len(tokenizer))
    with pytest.raises(ValueError, match="--encoder_layers 3 differs from --decoder_layers 2"):
        module.build_model(module.ModelArguments(**{**arguments, "encoder_layers": 3}), tokenizer)
    with pytest.raises(ValueError, match="momentum=0.3 is not read by cell='rmsprop'"):
        module.build_model(module.ModelArguments(**arguments, cell="rmsprop", momentum=0.3), tokenizer)
    with pytest.raises(ValueError, match="--model_type 'gpt2': one of momentum_seq2seq, momentum_lstm_"):
        module.build_model(module.ModelArguments(model_type="gpt2"), tokenizer)


def test_config_overrides_reach_the_model_trained_from_scratch():
    module = load_script()
    tokenizer = module.train_tokenizer([("a b c d", "e f g h")] * 20, 120)
    args = module.ModelArguments(hidden_size=16, num_attention_heads=2, encoder_layers=1, decoder_layers=1,
                                 config_overrides="connection=adaptive,attention_dropout=0.2")
    config = module.build_model(args, tokenizer).config
    assert (config.connection, config.attention_dropout, config.hidden_size) == ("adaptive", 0.2, 16)
    assert config.scale_embedding is True, "the recipe's own fields stay"
    with pytest.raises(ValueError, match="--config_overrides 'connection'"):
        module.build_model(module.ModelArguments(config_overrides="connection"), tokenizer)
