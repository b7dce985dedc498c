"""The fairseq-based recipes: argument checks, and `make demo`'s code path end to end (tiny)."""
import csv

import pytest

from recipes.demo import run as demo
from recipes.iwslt import run as iwslt
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


def test_demo_end_to_end_tiny(tmp_path, capsys):
    """Two of the four demo models on a few thousand Austen tokens: table, CSV, plots, samples."""
    out = tmp_path / "demo"
    assert demo.main(["--out-dir", str(out), "--epochs", "1", "--max-train-tokens", "4000",
                      "--max-eval-tokens", "1500", "--models", "MomentumLSTM", "momentum transformer"]) == 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["model"] for r in rows] == ["MomentumLSTM", "momentum transformer"]
    for r in rows:
        assert 1.0 < float(r["valid ppl"]) < 20_000 and 1.0 < float(r["test ppl"]) < 20_000
    for plot in ("convergence.png", "convergence_wall.png", "valid_ppl.png"):
        assert (out / plot).read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "| MomentumLSTM |" in printed and "Samples from the best model" in printed
    samples = (out / "results.md").read_text().split("top-10 sampling:")[1].strip().splitlines()
    assert len(samples) == len(demo.PROMPTS)
