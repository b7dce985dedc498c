"""Training plumbing: 2-rank CPU data parallelism through recipes/launch_cpu_ddp.sh (torchrun; training,
resuming, threads per rank), and resuming from checkpoint_last.pt. Checkpoints are read with torch's default
weights_only=True, as fairseq does."""
import os
import re
import sys

import pytest
import torch
from helpers.fairseq_cli import (
    BIN,
    REPO,
    USER_DIR,
    cli_env,
    preprocess_lm,
    train,
    train_losses,
    write_lm_text,
)
from helpers.launched import run_launched

import fairseq_momentum  # noqa: F401  (allowlists fairseq's checkpoint types for torch.load)

LSTM_LM = ["--task", "language_modeling", "--arch", "momentum_lstm_lm", "--decoder-layers", "2",
           "--decoder-embed-dim", "16", "--decoder-hidden-size", "24",
           "--share-decoder-input-output-embed", "--dropout", "0.2", "--weight-drop", "0.3",
           "--decoder-embed-dropout", "0.1", "--lstm-cell", "momentum", "--lstm-momentum", "0.5",
           "--tokens-per-sample", "16", "--batch-size", "8", "--optimizer", "adam", "--lr", "0.003"]

# fairseq saves checkpoints on rank 0 only; to compare the ranks' parameters, this wrapper
# makes every rank save, under a rank suffix.
EVERY_RANK_SAVES = """
import os, sys
import torch
omp = os.environ.get("OMP_NUM_THREADS")
print(f"threads of this rank: OMP_NUM_THREADS={omp} torch={torch.get_num_threads()}", flush=True)
from fairseq.trainer import Trainer
Trainer.should_save_checkpoint_on_current_rank = property(lambda self: True)
Trainer.checkpoint_suffix = property(lambda self: f"-rank{self.data_parallel_rank}")
from fairseq_cli.train import cli_main
sys.exit(cli_main())
"""


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_lm")
    return preprocess_lm(write_lm_text(root / "text", seed=11), root / "bin")


def rank_log(logs, rank):
    """A rank's output as torchrun's --log-dir keeps it."""
    [folder] = logs.glob(f"*/attempt_0/{rank}")
    return "".join((folder / name).read_text() for name in ("stdout.log", "stderr.log"))


def run_two_ranks(lm_data, tmp_path, save, logs, max_update):
    wrapper = tmp_path / "train_every_rank_saves.py"
    wrapper.write_text(EVERY_RANK_SAVES)
    env = cli_env(FAIRSEQ_TRAIN=f"{sys.executable} {wrapper}", LOG_DIR=str(logs),
                  PATH=f"{BIN}:{os.environ['PATH']}")
    del env["OMP_NUM_THREADS"]    # the launcher sets it per rank
    cmd = [str(REPO / "recipes" / "launch_cpu_ddp.sh"), "2", str(lm_data), "--user-dir", USER_DIR,
           "--save-dir", str(save), *LSTM_LM, "--max-update", str(max_update), "--num-workers", "0",
           "--log-format", "simple", "--log-interval", "1", "--seed", "3", "--no-epoch-checkpoints",
           "--required-batch-size-multiple", "1"]
    proc = run_launched(cmd, cwd=tmp_path, env=env, timeout=400, log_dir=logs)
    assert proc.returncode == 0, proc.stderr[-3000:] + "".join(
        p.read_text()[-3000:] for p in logs.glob("*/attempt_0/*/*.log"))
    checkpoints = [torch.load(save / f"checkpoint_last-rank{r}.pt") for r in (0, 1)]
    assert [c["optimizer_history"][-1]["num_updates"] for c in checkpoints] == [max_update] * 2
    states = [c["model"] for c in checkpoints]
    assert states[0].keys() == states[1].keys()
    for name in states[0]:
        assert torch.equal(states[0][name], states[1][name]), name
    return rank_log(logs, 0)


def test_two_cpu_ranks_train_the_same_model_and_resume(lm_data, tmp_path):
    """The resume loads rank 0's checkpoint and broadcasts it (torch.save / torch.load of the
    loaded state, omegaconf config included) to rank 1, under torch's safe unpickler. Each rank
    runs on its share of the cores."""
    save = tmp_path / "ckpt"
    rank0 = run_two_ranks(lm_data, tmp_path, save, tmp_path / "logs", 6)
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    for rank in (0, 1):
        log = rank_log(tmp_path / "logs", rank)
        assert f"distributed init (rank {rank})" in log
        assert f"threads of this rank: OMP_NUM_THREADS={threads} torch={threads}" in log
    assert "distributed_world_size': 2" in rank0 and "done training" in rank0
    rank0 = run_two_ranks(lm_data, tmp_path, save, tmp_path / "logs_resumed", 8)
    assert re.search(r"Loaded checkpoint .*checkpoint_last-rank0\.pt \(epoch \d+ @ 6 updates\)", rank0)


def test_resume_from_checkpoint_last_reproduces_the_losses(lm_data, tmp_path):
    common = [*LSTM_LM, "--max-update", "10"]
    whole = train(lm_data, tmp_path / "whole", *common)
    expected = train_losses(whole.stdout + whole.stderr)
    assert sorted(expected) == list(range(1, 11))
    first = train(lm_data, tmp_path / "split", *LSTM_LM, "--max-update", "5")
    assert sorted(train_losses(first.stdout + first.stderr)) == list(range(1, 6))
    second = train(lm_data, tmp_path / "split", *common)
    log = second.stdout + second.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 5 updates\)", log)
    resumed = train_losses(log)
    assert sorted(resumed) == list(range(6, 11))
    for update, loss in resumed.items():
        assert loss == pytest.approx(expected[update], abs=2e-3), update
    assert len(set(expected.values())) > 3
