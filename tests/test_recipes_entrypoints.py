"""The fairseq-based recipes: argument checks, and `make demo`'s code path end to end (tiny)."""
import csv

import pytest
import torch

from recipes.copy import run as copy_run
from recipes.demo import run as demo
from recipes.iwslt import run as iwslt
from recipes.lstm_tasks import run as tasks_run
from recipes.mnist import run as mnist_run
from recipes.ptb import run as ptb


@pytest.mark.parametrize("module,argv,needle", [
    (demo, ["--epochs", "0"], "argument --epochs: expected an integer >= 1, got 0"),
    (demo, ["--max-train-tokens", "-5"], "argument --max-train-tokens: expected an integer >= 0, got -5"),
    (demo, ["--models", "GRU"], "invalid choice"),
    (demo, ["--models", "LSTM", "LSTM"], "argument --models: values must be distinct"),
    (ptb, ["--epochs", "0"], "argument --epochs: expected an integer >= 1, got 0"),
    (ptb, ["--corpus", "wikitext"], "invalid choice"),
    (ptb, ["--seeds", "1", "1"], "argument --seeds: values must be distinct"),
    (iwslt, ["--bpe-size", "10"], "argument --bpe-size: expected an integer >= 100, got 10"),
    (iwslt, ["--max-train-pairs", "-1"], "argument --max-train-pairs: expected an integer >= 0, got -1"),
])
def test_bad_arguments_are_refused(module, argv, needle, capsys):
    with pytest.raises(SystemExit):
        module.parse_args(argv)
    assert needle in capsys.readouterr().err


TINY_MNIST = "--epochs 1 --train-limit 128 --side 7 --hidden-size 8 --grad-every 0 --no-progress"


def test_demo_end_to_end_tiny(tmp_path, capsys):
    """One LM pair and PMNIST, one seed, on a few thousand Austen tokens and 128 digits: table, CSV,
    plots, samples, the device line and one verdict per pair (the verdict's arithmetic is tested in
    test_recipes_verdict.py)."""
    out = tmp_path / "demo"
    assert demo.main(["--out-dir", str(out), "--device", "cpu", "--seeds", "1", "--epochs", "1",
                      "--max-train-tokens", "4000", "--max-eval-tokens", "1500",
                      "--models", "LSTM", "MomentumLSTM",
                      "--mnist-args", TINY_MNIST]) == 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["model"], r["seeds"]) for r in rows] == [("LSTM", "1"), ("MomentumLSTM", "1")]
    for r in rows:
        assert 1.0 < float(r["valid ppl"]) < 20_000 and 1.0 < float(r["test ppl"]) < 20_000
    for plot in ("convergence.png", "convergence_wall.png", "valid_ppl.png",
                 "pmnist/pmnist_test_accuracy_vs_epoch.png"):
        assert (out / plot).read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "[demo] device: cpu" in printed and "| MomentumLSTM |" in printed
    assert "[demo] expected duration:" in printed and "[5/5 done" in printed and "ETA" in printed
    assert "Samples from the best model" in printed
    verdicts = (out / "verdicts.md").read_text().splitlines()[2:]
    assert len(verdicts) == 2
    assert verdicts[0].startswith("- MomentumLSTM vs LSTM: ") and "test perplexity" in verdicts[0]
    assert verdicts[1].startswith("- MomentumLSTM vs LSTM: ") and "PMNIST test accuracy" in verdicts[1]
    assert all("not conclusive" in line for line in verdicts)            # one seed: no spread
    samples = (out / "results.md").read_text().split("top-10 sampling:")[1].strip().splitlines()
    assert len(samples) == len(demo.PROMPTS)


def test_demo_defaults_follow_the_device():
    args = demo.parse_args(["--device", "cpu"])
    assert args.seeds == [1, 2, 3] and args.experiments == ["lm", "pmnist"] and args.epochs == 2
    assert args.lm_seeds == [1, 2] and args.max_train_tokens == 100_000
    full = demo.parse_args(["--device", "cpu", "--full"])
    assert full.lm_seeds == [1, 2, 3] and full.max_train_tokens == 200_000
    assert demo.parse_args(["--device", "cpu", "--full", "--max-train-tokens", "5"]).max_train_tokens == 5
    expected = sum(seconds for _, seconds in demo.plan(args))
    # the CPU default is sized for <= 15 min on 2 quiet cores; a fresh clone measured 8 min 28 s
    assert 7.5 * 60 <= expected <= 9.5 * 60
    assert sum(s for _, s in demo.plan(full)) > 1.8 * expected        # 1.5x the LMs' tokens, 3/2 seeds
    assert demo.parse_args(["--device", "cpu", "--seeds", "4", "--epochs", "1"]).seeds == [4]
    if not torch.cuda.is_available():
        assert demo.parse_args([]).device == "cpu"
        with pytest.raises(SystemExit):
            demo.parse_args(["--device", "cuda"])
    size = demo.SIZES["cuda"]
    assert "copy" in size.experiments and "--full" in size.copy_args and len(size.seeds) >= 3


def test_demo_copy_part_gives_a_verdict_per_pair(tmp_path, capsys):
    """The copy-task part (run by default only with CUDA), tiny, on the CPU."""
    out = tmp_path / "demo"
    assert demo.main(["--out-dir", str(out), "--device", "cpu", "--experiments", "copy", "--seeds", "1", "2",
                      "--copy-args", "--steps 4 --eval-every 2 --max-length 16 --no-progress "
                                     "--models linear momentum adaptive"]) == 0
    verdicts = (out / "verdicts.md").read_text().splitlines()[2:]
    assert [line.split(":")[0] for line in verdicts] == ["- momentum vs linear", "- adaptive vs linear"]
    assert all("final copy test accuracy" in line and "seed spread" in line for line in verdicts)
    assert (out / "copy" / "test_accuracy_vs_step.png").read_bytes()[:4] == b"\x89PNG"


DEVICE_RECIPES = [ptb, iwslt, mnist_run, copy_run, tasks_run]


@pytest.mark.parametrize("module", DEVICE_RECIPES, ids=lambda m: m.__name__.split(".")[1])
def test_every_recipe_takes_the_same_device_flag(module, monkeypatch, capsys):
    """--device auto|cpu|cuda means the same everywhere; cpu is the default of the recipes (the
    demo's default is auto)."""
    assert module.parse_args([]).device == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert module.parse_args(["--device", "auto"]).device == torch.device("cpu")
    with pytest.raises(SystemExit):
        module.parse_args(["--device", "cuda"])
    assert "argument --device: 'cuda' requested but CUDA is not available" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert module.parse_args(["--device", "auto"]).device == torch.device("cuda")
    assert module.parse_args(["--device", "cuda"]).device == torch.device("cuda")


@pytest.mark.parametrize("module", [ptb, iwslt], ids=["ptb", "iwslt"])
def test_gpu_is_a_deprecated_spelling_of_device_cuda(module, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.warns(FutureWarning, match="--gpu is deprecated: use --device cuda"):
        assert module.parse_args(["--gpu"]).device == torch.device("cuda")
    with pytest.raises(SystemExit):
        module.parse_args(["--device", "cuda:1"])
    assert "argument --device: fairseq uses every visible GPU" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(FutureWarning), pytest.raises(SystemExit):
        module.parse_args(["--gpu"])
    assert "argument --gpu: 'cuda' requested but CUDA is not available" in capsys.readouterr().err
