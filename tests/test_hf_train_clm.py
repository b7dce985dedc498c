"""recipes/hf/train_clm.py: two real CPU ranks under `accelerate launch` train on different
batches and end with equal parameters; a run resumed from a checkpoint ends where the
uninterrupted run ends; the saved model reloads; --packing trains on DataCollatorWithFlattening's
rows of whole paragraphs."""
import csv
import json
import random
import sys

import pytest
from helpers.train_clm import (
    ACCELERATE,
    SCRIPT,
    TINY,
    load_script,
    records,
    run,
    uninterrupted_and_resumed,
    word_text,
)
from ports import free_port


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    return word_text(tmp_path_factory.mktemp("text") / "train.txt", 800)


def test_two_cpu_ranks_split_data_and_agree(text_file, tmp_path):
    run([str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
         "--mixed_precision", "no", "--dynamo_backend", "no", str(SCRIPT), "--train_file", str(text_file),
         "--output_dir", str(tmp_path / "out"), "--max_train_steps", "3",
         "--gradient_accumulation_steps", "2",
         "--record_dir", str(tmp_path / "rec"), *TINY], tmp_path)
    ranks = records(tmp_path / "rec")
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["step"] == ranks[1]["step"] == 3
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"]) == 6
    assert not set(ranks[0]["batches"]) & set(ranks[1]["batches"])
    assert ranks[0]["params"] == ranks[1]["params"]
    assert (tmp_path / "out" / "final" / "model.safetensors").exists()


def test_resume_from_checkpoint_ends_like_an_uninterrupted_run(text_file, tmp_path):
    """Also where the checkpoint's step is an evaluation's: the evaluation leaves the training's random
    numbers (dropout) as they were when the checkpoint saved them."""
    common = [sys.executable, str(SCRIPT), "--train_file", str(text_file), "--max_train_steps", "4",
              "--eval_steps", "2", *TINY]
    full, resumed = uninterrupted_and_resumed(common, tmp_path, 2)
    assert resumed["batches"] == full["batches"][2:]
    assert resumed["params"] == full["params"] and resumed["step"] == 4
    check = run([sys.executable, "-c",
                 "import sys, hf_momentum; from transformers import AutoModelForCausalLM; "
                 "m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); print(type(m).__name__)",
                 str(tmp_path / "resumed" / "final")], tmp_path)
    assert "MomentumTransformerForCausalLM" in check.stdout


def test_stock_model_with_momentum_attention_trains(text_file, tmp_path):
    proc = run([sys.executable, str(SCRIPT), "--train_file", str(text_file), "--model_type", "llama",
                "--attn_implementation", "linear_attention", "--max_train_steps", "2",
                "--output_dir", str(tmp_path / "out"), *TINY], tmp_path)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["step"] == 2 and result["valid_perplexity"] > 1
    config = json.loads((tmp_path / "out" / "final" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["hidden_size"] == 32
    assert config["attention_momentum"] == 0.6


@pytest.fixture(scope="module")
def paragraph_file(tmp_path_factory):
    words = ["momentum", "attention", "linear", "state", "token", "heavy", "ball", "step", "gradient"]
    rng = random.Random(1)
    path = tmp_path_factory.mktemp("paragraphs") / "train.txt"
    path.write_text("\n\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
                                  for _ in range(120)))
    return path


def test_packing_batches_are_flattened_paragraphs(paragraph_file):
    """Each paragraph is one document (its bytes and the end-of-sequence token, at most
    --block_size of them); a batch is one row whose position_ids restart at every document and
    whose labels are -100 at each document's first token."""
    script = load_script()
    args = script.parse_args(["--train_file", str(paragraph_file), "--output_dir", "out", "--packing",
                              "--block_size", "32", "--per_device_batch_size", "4"])
    tokenizer = script.Tokenizer("bytes")
    paragraphs = paragraph_file.read_text().split("\n\n")
    train, valid = script.loaders(args, tokenizer)
    lengths = [len(p) + 1 for p in paragraphs]
    assert len(train.dataset) + len(valid.dataset) == sum(n - i > 1 for n in lengths for i in range(0, n, 32))
    batch = next(iter(valid))
    docs = [d["input_ids"] for d in valid.dataset[:4]]
    starts = [sum(map(len, docs[:i])) for i in range(len(docs))]
    assert batch["input_ids"].shape == (1, sum(map(len, docs)))
    assert (batch["position_ids"][0] == 0).nonzero().flatten().tolist() == starts
    assert batch["cu_seq_lens_q"].tolist() == starts + [batch["input_ids"].shape[1]]
    assert batch["labels"][0, starts].eq(-100).all() and script.samples(batch) == 4
    assert max(len(d["input_ids"]) for d in train.dataset) == 32
    assert tokenizer.eos in docs[0] or len(docs[0]) == 32


@pytest.mark.parametrize("model_type", ["momentum_transformer", "momentum_lstm", "llama"])
def test_packing_trains(paragraph_file, tmp_path, model_type):
    proc = run([sys.executable, str(SCRIPT), "--train_file", str(paragraph_file), "--packing",
                "--model_type", model_type, "--max_train_steps", "3", "--output_dir", str(tmp_path / "out"),
                "--record_dir", str(tmp_path / "rec"), *TINY], tmp_path)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["step"] == 3 and 1 < result["valid_perplexity"] < 1e6
    assert len(set(records(tmp_path / "rec")[0]["batches"])) == 3
    assert (tmp_path / "out" / "final" / "model.safetensors").exists()


def test_arguments_checked_at_parse_time_and_help_shows_defaults(capsys):
    script = load_script()
    with pytest.raises(SystemExit):
        script.parse_args(["--train_file", "a.txt", "--output_dir", "out", "--push_to_hub"])
    assert "--push_to_hub: needs --hub_model_id" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.parse_args(["--train_file", "a.txt", "--output_dir", "out", "--block_size", "512",
                           "--max_position_embeddings", "256"])
    assert "--max_position_embeddings: must be >= --block_size (512)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "training sequence length (with --packing: the longest document) (default: 128)" in help_text
    assert "(default: 2048)" in help_text


def test_saved_tokenizer_and_model_generate_through_a_pipeline_with_curves(text_file, tmp_path):
    """The output folder holds the byte-level tokenizer, so `pipeline("text-generation")` loads it;
    generation runs past --block_size; the CSV tracker logged train and eval losses and they are
    plotted."""
    run([sys.executable, str(SCRIPT), "--train_file", str(text_file), "--max_train_steps", "4",
         "--logging_steps", "2", "--eval_steps", "2", "--output_dir", str(tmp_path / "out"), *TINY],
        tmp_path)
    final = tmp_path / "out" / "final"
    code = ("import sys, hf_momentum\nfrom transformers import pipeline\n"
            "generate = pipeline('text-generation', model=sys.argv[1])\n"
            "prompt = 'momentum attention'\n"
            "ids = generate.tokenizer(prompt)['input_ids']\n"
            "assert ids == [b + 3 for b in prompt.encode()], ids\n"
            "assert generate.tokenizer.decode(ids) == prompt, ids\n"
            "out = generate(prompt, max_new_tokens=60, min_new_tokens=60, do_sample=False)\n"
            "out = out[0]['generated_text']\n"
            "assert out.startswith(prompt) and len(out.encode()) > len(prompt) + 32, out\n"
            "print('GENERATED', len(out))")
    check = run([sys.executable, "-c", code, str(final)], tmp_path)
    assert "GENERATED" in check.stdout
    with open(tmp_path / "out" / "logs" / "train_clm" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    steps = {metric: [int(r["step"]) for r in rows if r["metric"] == metric]
             for metric in ("train/loss", "eval/loss")}
    assert steps == {"train/loss": [2, 4], "eval/loss": [2, 4]}
    assert all(float(r["value"]) > 0 for r in rows if r["metric"].endswith("loss"))
    assert (tmp_path / "out" / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_saved_byte_tokenizer_adds_no_end_of_text_to_prompts(tmp_path):
    """The "bytes" tokenizer gives ByT5's ids, and once saved and reloaded with AutoTokenizer (as
    pipeline("text-generation") does) it encodes a prompt without a trailing </s>: generation must
    continue the text, not start after an end-of-text. One </s> per file is added by encode."""
    from transformers import AutoTokenizer, ByT5Tokenizer

    script = load_script()
    tokenizer = script.Tokenizer("bytes")
    tokenizer.hf.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    prompt = "héllo, momentum ✓\n\n日本"
    expected = ByT5Tokenizer()(prompt, add_special_tokens=False)["input_ids"]
    assert reloaded(prompt)["input_ids"] == expected == [b + 3 for b in prompt.encode()]
    assert reloaded(prompt, return_tensors="pt")["input_ids"][0, -1].item() != reloaded.eos_token_id
    assert reloaded.decode(expected) == prompt
    assert (reloaded.eos_token_id, reloaded.pad_token_id) == (tokenizer.eos, tokenizer.pad) == (1, 0)
    assert tokenizer.encode(prompt) == expected + [1]


def test_report_to_a_tracker_whose_package_is_missing_fails_at_parsing(capsys):
    """accelerate skips a tracker whose package is missing with one log line and trains without it;
    the recipe refuses it before training, naming the package and the pip command."""
    from accelerate.tracking import get_available_trackers

    script = load_script()
    installed = {kind.value for kind in get_available_trackers()}
    missing = next(name for name in ("tensorboard", "comet_ml", "wandb", "mlflow", "aim", "clearml")
                   if name not in installed)
    package = {"comet_ml": "comet-ml"}.get(missing, missing)
    base = ["--train_file", "a.txt", "--output_dir", "out", "--report_to", "csv"]
    with pytest.raises(SystemExit):
        script.parse_args([*base, missing])
    err = capsys.readouterr().err
    assert f"--report_to: the {missing} tracker needs the {package} package" in err
    assert f"pip install {package}" in err
    with pytest.raises(SystemExit):
        script.parse_args([*base, "tensorbord"])
    assert "unknown tracker 'tensorbord'; choose from csv, all, " in capsys.readouterr().err
    assert script.parse_args([*base, "all"]).report_to == ["csv", "all"]


def test_checkpoint_of_tied_weights_saves_without_warning_and_reloads_tied(tmp_path, caplog):
    """accelerate's save_state drops lm_head.weight (tied to the input embedding) from the
    safetensors file with a "Removed shared tensor" warning on every checkpoint; the recipe
    silences exactly that record, and load_state gives back the tie with the saved values."""
    import logging

    import torch
    from accelerate import Accelerator

    script = load_script()
    args = script.parse_args(["--train_file", "a.txt", "--output_dir", str(tmp_path), *TINY])
    tokenizer = script.Tokenizer("bytes")
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = script.build_model(args, tokenizer)
    assert model.all_tied_weights_keys == {"lm_head.weight": "model.embed_tokens.weight"}
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    model = accelerator.prepare(model)
    with caplog.at_level(logging.WARNING):
        script.save_checkpoint(accelerator, model, tmp_path / "step_1")
    assert not [r for r in caplog.records if "shared tensor" in r.getMessage()]
    torch.manual_seed(1)
    loader = Accelerator(cpu=True)
    fresh = loader.prepare(script.build_model(args, tokenizer))
    loader.load_state(str(tmp_path / "step_1"))
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in saved.items())
    other = logging.makeLogRecord({"msg": "Removed shared tensor {'model.norm.weight'} while saving."})
    assert script.TiedWeightsRecordFilter(model.all_tied_weights_keys).filter(other)


def test_model_name_or_path_fine_tunes_a_saved_model(text_file, tmp_path, capsys):
    """--model_name_or_path starts from a saved model and its saved tokenizer (not a new model of
    the size arguments), and the fine-tuned model is saved like a new one."""
    import torch

    script = load_script()
    tokenizer = script.Tokenizer("bytes")
    torch.manual_seed(3)
    new_args = script.parse_args(["--train_file", "a", "--output_dir", "o", *TINY])
    saved = script.build_model(new_args, tokenizer)
    saved.save_pretrained(tmp_path / "base")
    tokenizer.hf.save_pretrained(tmp_path / "base")
    args = script.parse_args(["--train_file", "a", "--output_dir", "o", "--model_name_or_path",
                              str(tmp_path / "base")])
    assert args.tokenizer == str(tmp_path / "base")
    loaded = script.build_model(args, script.Tokenizer(args.tokenizer))
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in saved.state_dict().items())
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        script.parse_args(["--train_file", "a", "--output_dir", "o", "--model_name_or_path",
                           str(tmp_path / "empty")])
    assert "--model_name_or_path: " in capsys.readouterr().err
    long_blocks = script.parse_args(["--train_file", "a", "--output_dir", "o", "--block_size", "4096",
                                     "--max_position_embeddings", "4096", "--model_name_or_path",
                                     str(tmp_path / "base")])
    with pytest.raises(ValueError, match="--block_size 4096 is longer than --model_name_or_path"):
        script.build_model(long_blocks, tokenizer)
    proc = run([sys.executable, str(SCRIPT), "--train_file", str(text_file), "--model_name_or_path",
                str(tmp_path / "base"), "--max_train_steps", "2", "--block_size", "32",
                "--per_device_batch_size", "2", "--output_dir", str(tmp_path / "out")], tmp_path)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 2
    config = json.loads((tmp_path / "out" / "final" / "config.json").read_text())
    assert config["hidden_size"] == 32 and config["num_hidden_layers"] == 2
    assert (tmp_path / "out" / "final" / "tokenizer.json").exists()


def test_momentum_lstm_is_built_from_its_arguments():
    """--model_type momentum_lstm builds the native MomentumLSTMForCausalLM (it takes labels, packed
    documents and generates; test_packing_trains trains it) from --cell/--momentum/--step_size;
    a value out of range is refused by its config, naming the field."""
    script = load_script()
    base = ["--train_file", "a", "--output_dir", "o", "--model_type", "momentum_lstm", *TINY]
    model = script.build_model(script.parse_args([*base, "--cell", "momentum", "--momentum", "0.3",
                                                  "--step_size", "0.5"]), script.Tokenizer("bytes"))
    assert type(model).__name__ == "MomentumLSTMForCausalLM"
    config = model.config
    assert (config.cell, config.momentum, config.step_size, config.hidden_size) == ("momentum", 0.3, 0.5, 32)
    nag = script.build_model(script.parse_args([*base, "--cell", "nag", "--step_size", "0.5"]),
                             script.Tokenizer("bytes")).config
    assert (nag.cell, nag.step_size) == ("nag", 0.5)
    with pytest.raises(ValueError, match="momentum=0.3 is not read by cell='nag'"):
        script.build_model(script.parse_args([*base, "--cell", "nag", "--momentum", "0.3"]),
                           script.Tokenizer("bytes"))
    assert (config.num_hidden_layers, config.vocab_size, config.eos_token_id) == (2, 259, 1)
    with pytest.raises(ValueError, match="momentum"):
        script.build_model(script.parse_args([*base, "--momentum", "1.5"]), script.Tokenizer("bytes"))


def test_config_overrides_set_fields_beyond_the_arguments(tmp_path):
    """--config_overrides (transformers' run_clm.py format) reaches every model type's config, parsed as
    each field's type: AWD-LSTM's regularisers of momentum_lstm, a transformer's and a stock model's
    fields; an unknown field, a value out of range, or an override of a saved model is refused."""
    script = load_script()
    base = ["--train_file", "a", "--output_dir", "o", *TINY]
    awd = "locked_dropout=true,weight_drop=0.5,word_dropout=0.1,embedding_dropout=0.3"
    lstm = script.build_model(script.parse_args([*base, "--model_type", "momentum_lstm", "--config_overrides",
                                                 awd]), script.Tokenizer("bytes")).config
    fields = ("locked_dropout", "weight_drop", "word_dropout", "embedding_dropout", "output_dropout")
    assert [getattr(lstm, name) for name in fields] == [True, 0.5, 0.1, 0.3, 0.3]
    assert (lstm.dropout, lstm.hidden_size) == (0.1, 32), "the rest from the arguments"
    transformer = script.build_model(script.parse_args([*base, "--config_overrides", "scale_embedding=true"]),
                                     script.Tokenizer("bytes")).config
    assert transformer.scale_embedding is True and transformer.hidden_size == 32
    llama = script.build_model(script.parse_args([*base, "--model_type", "llama", "--config_overrides",
                                                  "rms_norm_eps=0.001"]), script.Tokenizer("bytes")).config
    assert llama.rms_norm_eps == 0.001
    with pytest.raises(ValueError, match="--config_overrides 'no_such_field=1'"):
        script.build_model(script.parse_args([*base, "--config_overrides", "no_such_field=1"]),
                           script.Tokenizer("bytes"))
    with pytest.raises(ValueError, match="weight_drop"):
        script.build_model(script.parse_args([*base, "--model_type", "momentum_lstm", "--config_overrides",
                                              "weight_drop=1.0"]), script.Tokenizer("bytes"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        script.parse_args([*base, "--model_name_or_path", str(tmp_path), "--config_overrides", awd])


def test_nt_asgd_switches_by_the_rule_and_a_run_resumed_while_averaging_ends_the_same(tmp_path):
    """--optimizer nt_asgd: the switch comes at the evaluation the rule names (from the logged
    losses; a training text the model overfits, a validation text it does not predict); a run
    resumed from a checkpoint saved while averaging (the average as its model, the iterate in the
    optimizer's state) ends with the uninterrupted run's final model and validation loss."""
    import re

    (tmp_path / "train.txt").write_text("abc " * 600)
    (tmp_path / "valid.txt").write_text("zyxw vu " * 100)
    common = [sys.executable, str(SCRIPT), "--train_file", str(tmp_path / "train.txt"),
              "--validation_file", str(tmp_path / "valid.txt"), "--optimizer", "nt_asgd", "--nonmono", "1",
              "--learning_rate", "0.5", "--weight_decay", "0", "--max_train_steps", "16", "--eval_steps", "2",
              *TINY]
    whole = run([*common, "--output_dir", str(tmp_path / "full"), "--checkpointing_steps", "4",
                 "--record_dir", str(tmp_path / "full_rec")], tmp_path)
    switch = int(re.search(r"NT-ASGD: the validation loss [0-9.]+ at step (\d+)", whole.stdout).group(1))
    with open(next((tmp_path / "full" / "logs").glob("*/metrics.csv"))) as f:
        losses = [(int(row["step"]), float(row["value"])) for row in csv.DictReader(f)
                  if row["metric"] == "eval/loss"]
    steps = [step for step, _ in losses]
    values = [value for _, value in losses]
    first = next(i for i in range(len(values)) if i > 1 and values[i] > min(values[:i - 1]))
    assert steps[first] == switch and switch < 8
    resumed = run([*common, "--output_dir", str(tmp_path / "resumed"), "--record_dir",
                   str(tmp_path / "resumed_rec"), "--resume_from_checkpoint",
                   str(tmp_path / "full" / "step_8")], tmp_path)
    assert "NT-ASGD" not in resumed.stdout, "the switch is in the checkpoint"
    full, again = records(tmp_path / "full_rec")[0], records(tmp_path / "resumed_rec")[0]
    assert again["params"] == full["params"] and again["valid_loss"] == full["valid_loss"]
