"""lm-evaluation-harness (the `eval` extra) scores the native models through its own `hf` model
with trust_remote_code, offline, on a task shipped in tests/data/lm_eval: every log-likelihood it
reports in its padded batches of 4 equals the model's own log-likelihood of the continuation
computed one request at a time, unpadded. The README's command line runs as written."""
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, ByT5Tokenizer

import hf_momentum  # noqa: F401  (registers the native model types)

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.__main__ import cli_evaluate  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests" / "data" / "lm_eval"
EXTRA = {"momentum_transformer": dict(num_attention_heads=2, intermediate_size=64), "momentum_lstm": {}}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(ROOT)                       # the task's data file is relative to the root


def saved_model(model_type, path):
    tokenizer = ByT5Tokenizer()
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                  **EXTRA[model_type])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


def own_loglikelihood(model, context, continuation):
    """Σ log p(continuation | context) from one unpadded forward, over lm_eval's own encoding."""
    with torch.no_grad():
        ids = torch.tensor([context + continuation])
        logits = model(input_ids=ids, use_cache=False).logits.double().log_softmax(-1)[0]
    targets = torch.tensor(continuation)
    return float(logits[len(context) - 1:-1].gather(-1, targets[:, None]).sum())


@pytest.mark.parametrize("model_type", ["momentum_transformer", "momentum_lstm"])
def test_lm_eval_loglikelihoods_in_padded_batches_equal_the_models_own(model_type, tmp_path):
    model = saved_model(model_type, tmp_path)
    result = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={tmp_path},trust_remote_code=True,dtype=float32",
        tasks=["austen_choice"], task_manager=TaskManager(include_path=str(TASKS)), batch_size=4,
        device="cpu", log_samples=True)
    harness = lm_eval.models.huggingface.HFLM(pretrained=model, tokenizer=ByT5Tokenizer(), batch_size=1)
    checked = 0
    for sample in result["samples"]["austen_choice"]:
        for arguments, response in zip(sample["arguments"], sample["resps"]):
            context, continuation = harness._encode_pair(*arguments[:2])
            assert response[0][0] == pytest.approx(own_loglikelihood(model, context, continuation), abs=1e-4)
            checked += 1
    assert checked == 8


def test_readme_command_runs_as_written(tmp_path, monkeypatch):
    saved_model("momentum_lstm", tmp_path / "model")
    text = (ROOT / "hf_momentum" / "README.md").read_text(encoding="utf-8")
    command = re.search(r"```sh\n(lm_eval .*?)```", text.split("### Evaluation", 1)[1], re.S).group(1)
    command = command.replace("\\\n", " ").replace("path/to/saved_model", str(tmp_path / "model"))
    command = command.replace("--output_path results", f"--output_path {tmp_path / 'results'}")
    monkeypatch.setattr(sys, "argv", command.split())
    cli_evaluate()                                # lm_eval's console entry point, in this process
    written = list((tmp_path / "results").rglob("results_*.json"))
    assert written and "austen_choice" in json.loads(written[0].read_text())["results"]
