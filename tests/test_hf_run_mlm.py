"""recipes/hf/run_mlm.py: the Trainer with DataCollatorForLanguageModeling pretrains the
bidirectional momentum transformer as a masked LM on plain text, with a byte-level BPE tokenizer it
trains itself (the training loss falls, evaluation reports the loss and its perplexity), in blocks
or line by line; the saved model and tokenizer fill a mask through the fill-mask pipeline;
`--model_name_or_path` continues from the saved folder (a trained model's loss before any step);
bad arguments are refused by name."""
import json
import math
import random
import sys
from pathlib import Path

import pytest
from helpers.fairseq_cli import WORDS
from helpers.train_clm import run

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "recipes" / "hf" / "run_mlm.py"
TINY = ["--hidden_size", "64", "--num_layers", "2", "--num_attention_heads", "4", "--vocab_size", "300",
        "--dropout", "0", "--max_seq_length", "32", "--per_device_train_batch_size", "16",
        "--per_device_eval_batch_size", "16", "--learning_rate", "3e-3", "--report_to", "none", "--use_cpu",
        "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "0", "--max_position_embeddings", "64"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """Lines of one word said several times: a masked piece follows from the rest of its line
    (linear attention sees the line as a whole, eq. 14), so a masked LM can learn to fill it."""
    folder = tmp_path_factory.mktemp("mlm")
    rng = random.Random(3)
    for split, n in (("train", 1500), ("valid", 100)):
        lines = [" ".join([rng.choice(WORDS)] * rng.randint(4, 12)) for _ in range(n)]
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return ["--train_file", str(folder / "train.txt"), "--validation_file", str(folder / "valid.txt")]


def metrics(out, name):
    return json.loads((out / f"{name}_results.json").read_text())


@pytest.fixture(scope="module")
def untrained(text, tmp_path_factory):
    """The evaluation loss of a model that was never trained (about ln of the vocabulary)."""
    folder = tmp_path_factory.mktemp("untrained")
    run([sys.executable, str(SCRIPT), *text, "--output_dir", str(folder / "out"), "--do_eval", *TINY], folder)
    return metrics(folder / "out", "eval")["eval_loss"]


@pytest.mark.parametrize("layout", [[], ["--line_by_line"]], ids=["blocks", "line-by-line"])
def test_pretrains_evaluates_and_saves_a_masked_lm_that_fills_masks(text, untrained, tmp_path, layout):
    out = tmp_path / "out"
    run([sys.executable, str(SCRIPT), *text, *layout, "--output_dir", str(out), "--do_train", "--do_eval",
         "--max_steps", "300", "--logging_steps", "50", *TINY], tmp_path)
    losses = [row["loss"] for row in json.loads((out / "trainer_state.json").read_text())["log_history"]
              if "loss" in row]
    assert losses[-1] < losses[0], losses
    evaluated = metrics(out, "eval")
    assert evaluated["eval_loss"] < 0.6 * untrained, (evaluated, untrained)
    assert math.isclose(evaluated["perplexity"], math.exp(evaluated["eval_loss"]), rel_tol=1e-6)
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["is_causal"]) == ("momentum_transformer", False)

    from transformers import pipeline

    import hf_momentum  # noqa: F401  (registers momentum_transformer)
    fill = pipeline("fill-mask", model=str(out))
    ids = fill.tokenizer("the cat sees a dog")["input_ids"]
    assert (ids[0], ids[-1]) == (fill.tokenizer.bos_token_id, fill.tokenizer.eos_token_id)
    assert fill.tokenizer.decode(ids, skip_special_tokens=True) == "the cat sees a dog"
    guesses = fill("elizabeth elizabeth<mask> elizabeth")
    assert len(guesses) == 5 and all(guess["sequence"].startswith("elizabeth elizabeth") for guess in guesses)


def test_continues_from_a_saved_masked_lm(text, untrained, tmp_path):
    """--model_name_or_path loads the saved model and its tokenizer: evaluated before any step of
    its own, it has the trained model's loss, far below an untrained one's."""
    first, second = tmp_path / "first", tmp_path / "second"
    run([sys.executable, str(SCRIPT), *text, "--output_dir", str(first), "--do_train", "--max_steps", "150",
         "--line_by_line", *TINY], tmp_path)
    run([sys.executable, str(SCRIPT), *text, "--output_dir", str(second), "--do_eval", "--line_by_line",
         "--model_name_or_path", str(first), *TINY], tmp_path)
    assert metrics(second, "eval")["eval_loss"] < 0.6 * untrained


@pytest.mark.parametrize("extra, message", [
    (["--mlm_probability", "1.5"], "--mlm_probability must be in"),
    (["--max_seq_length", "100"], "exceeds the model's max_position"),
    (["--config_overrides", "no_such_field=1"], "--config_overrides 'no_such_field=1'"),
    (["--config_overrides", "attention_momentum=1.5"], "attention_momentum"),
])
def test_bad_arguments_are_refused_by_name(text, tmp_path, extra, message):
    proc = run([sys.executable, str(SCRIPT), *text, "--output_dir", str(tmp_path / "out"), "--do_train",
                "--max_steps", "1", *TINY, *extra], tmp_path, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


def test_config_overrides_reach_the_model_trained_from_scratch():
    import importlib.util
    spec = importlib.util.spec_from_file_location("run_mlm", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    tokenizer = script.train_tokenizer(["a b c d e f"] * 20, 300)
    args = script.ModelArguments(hidden_size=16, num_attention_heads=2, num_layers=1,
                                 config_overrides="scale_embedding=true,connection=adaptive")
    config = script.build_model(args, tokenizer).config
    assert (config.scale_embedding, config.connection, config.hidden_size) == (True, "adaptive", 16)
    assert config.is_causal is False
