"""The fairseq recipes' training step (recipes.common.fairseq_runs.train, which ptb, demo and iwslt
call with a folder named by a hash of the run's arguments) on a rerun: it emptied the folder and
trained from scratch, deleting the checkpoints of an interrupted or finished run. A finished run is
now reused, an interrupted one resumes from checkpoint_last.pt as fairseq-train resumes."""
import shutil

import pytest
import torch
from helpers.fairseq_cli import preprocess_lm, write_lm_text

from recipes.common import fairseq_runs

ARGS = ["--task", "language_modeling", "--arch", "momentum_lstm_lm", "--decoder-layers", "1",
        "--decoder-embed-dim", "16", "--decoder-hidden-size", "16", "--tokens-per-sample", "16",
        "--batch-size", "8", "--optimizer", "adam", "--lr", "0.003", "--max-update", "10",
        "--save-interval-updates", "4", "--log-interval", "1", "--num-workers", "0", "--seed", "3", "--cpu"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    write_lm_text(root / "text")
    data = preprocess_lm(root / "text", root / "bin")
    save = root / "checkpoints" / "lm-key"
    return data, save, fairseq_runs.train("lm", data, save, ARGS, echo=False)


def weights(path):
    return torch.load(path, weights_only=False)["model"]


def test_a_finished_run_is_reused_without_training(finished):
    data, save, first = finished
    stamps = {p.name: p.stat().st_mtime_ns for p in save.glob("*.pt")}
    again = fairseq_runs.train("lm", data, save, ARGS, echo=False)
    assert {p.name: p.stat().st_mtime_ns for p in save.glob("*.pt")} == stamps
    assert again.seconds == first.seconds and again.valid == first.valid and again.train == first.train
    assert [int(r["num_updates"]) for r in first.train] == list(range(1, 11))


def test_an_interrupted_run_resumes_from_its_last_checkpoint(finished, tmp_path):
    data, save, first = finished
    interrupted = tmp_path / "checkpoints" / "lm-key"
    interrupted.mkdir(parents=True)
    shutil.copy(save / "checkpoint_1_4.pt", interrupted / "checkpoint_last.pt")
    log = (save / "train.log").read_text()
    (interrupted / "train.log").write_text(log[:log.index('"num_updates": "6"')].rsplit("\n", 1)[0] + "\n")
    resumed = fairseq_runs.train("lm", data, interrupted, ARGS, echo=False)
    assert "Loaded checkpoint" in (interrupted / "train.log").read_text()
    final, want = weights(interrupted / "checkpoint_last.pt"), weights(save / "checkpoint_last.pt")
    assert final.keys() == want.keys()
    for name in want:
        assert torch.equal(final[name], want[name]), name
    assert [int(r["num_updates"]) for r in resumed.train] == list(range(1, 11))
    assert [r["loss"] for r in resumed.train] == [r["loss"] for r in first.train]
