"""Checkpoint loading of the fairseq user-dir: torch.load stays safe after `import fairseq_momentum`
(in the process and its children), fairseq's own checkpoints still load (the CLI tests resume,
generate and eval-lm from them), and an unreadable or refused checkpoint is named."""
import fractions
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers.fairseq_cli import REPO, cli_env, preprocess_lm, train, train_losses, write_lm_text

LOAD_AFTER_IMPORT = """
import os, pathlib, pickle, subprocess, sys
import torch
import fairseq_momentum
evil, marker = sys.argv[1], pathlib.Path(sys.argv[2])
assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ, "the import set the switch"
try:
    torch.load(evil)
except pickle.UnpicklingError as error:
    assert "Weights only load failed" in str(error), error
else:
    raise SystemExit("torch.load accepted the payload in the importing process")
assert not marker.exists(), "the payload ran in the importing process"
child = subprocess.run([sys.executable, "-c", f"import torch; torch.load({evil!r})"],
                       capture_output=True, text=True)
assert child.returncode != 0 and "Weights only load failed" in child.stderr, child.stderr[-2000:]
assert not marker.exists(), "the payload ran in a child process"
print("refused")
"""


class Payload:
    """Unpickling this runs exec(code): a stand-in for any code a pickle can carry."""

    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return exec, (self.code,)


@pytest.fixture
def malicious_checkpoint(tmp_path):
    marker = tmp_path / "payload_ran"
    path = tmp_path / "checkpoint_last.pt"
    torch.save({"model": {}, "args": Payload(f"open({str(marker)!r}, 'w').close()")}, path)
    return path, marker


def run_python(script, *args, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, env=cli_env(PYTHONPATH=str(REPO), **env),
                          timeout=300)


def test_payload_runs_when_weights_only_is_switched_off(malicious_checkpoint):
    """The control: the payload is real, so the next test would catch a leak of the switch."""
    path, marker = malicious_checkpoint
    proc = run_python("import sys, torch; torch.load(sys.argv[1])", path,
                      TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert marker.exists()


def test_import_keeps_torch_load_safe_here_and_in_children(malicious_checkpoint):
    path, marker = malicious_checkpoint
    proc = run_python(LOAD_AFTER_IMPORT, path, marker)
    assert proc.returncode == 0 and "refused" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not marker.exists()


def test_fairseq_loader_explains_a_refused_type(tmp_path):
    from fairseq import checkpoint_utils

    import fairseq_momentum  # noqa: F401  (wraps fairseq's loader)
    from fairseq_momentum.checkpoints import CheckpointReadError
    path = tmp_path / "checkpoint_9_9.pt"
    torch.save({"model": {}, "cfg": None, "odd": fractions.Fraction(1, 3)}, path)
    with pytest.raises(CheckpointReadError) as error:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    message = str(error.value)
    assert str(path) in message and "fractions.Fraction" in message and "add_safe_globals" in message


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04" + b"\x00" * 64], ids=["empty", "garbage"])
def test_fairseq_loader_names_an_unreadable_file(tmp_path, content):
    from fairseq import checkpoint_utils

    import fairseq_momentum  # noqa: F401
    from fairseq_momentum.checkpoints import CheckpointReadError
    path = tmp_path / "checkpoint_last.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointReadError, match=f"cannot load checkpoint {path}"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))


LSTM_LM = ["--task", "language_modeling", "--arch", "momentum_lstm_lm", "--decoder-layers", "1",
           "--decoder-embed-dim", "16", "--tokens-per-sample", "16", "--batch-size", "8",
           "--optimizer", "adam", "--lr", "0.003"]


def test_broken_checkpoint_last_stops_training_with_its_name(tmp_path):
    data = preprocess_lm(write_lm_text(tmp_path / "text", seed=5), tmp_path / "bin")
    save = tmp_path / "ckpt"
    train(data, save, *LSTM_LM, "--max-update", "2", "--save-interval-updates", "1")
    last, good = save / "checkpoint_last.pt", save / "checkpoint_1_2.pt"
    intact = last.read_bytes()
    for name, content in (("empty", b""), ("truncated", intact[: len(intact) // 2])):
        last.write_bytes(content)
        proc = train(data, save, *LSTM_LM, "--max-update", "4", check=False)
        log = proc.stdout + proc.stderr
        assert proc.returncode != 0, name
        assert f"cannot load checkpoint {last}" in log, (name, log[-3000:])
        assert f"--restore-file {good}" in log, (name, log[-3000:])
        assert "Errno 22" not in log.splitlines()[-1]
    proc = train(data, save, *LSTM_LM, "--max-update", "4", "--restore-file", good)
    log = proc.stdout + proc.stderr
    assert f"Loaded checkpoint {good} (epoch 1 @ 2 updates)" in log
    assert sorted(train_losses(log)) == [3, 4]


def test_an_interrupted_copy_onto_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    """fairseq saves a checkpoint atomically, then copies it onto checkpoint_best.pt and
    checkpoint_last.pt with shutil.copyfile: a Ctrl-C during that copy left a truncated
    checkpoint_best.pt where the previous best had been."""
    import shutil

    from fairseq import checkpoint_utils

    import fairseq_momentum  # noqa: F401

    new, best = tmp_path / "checkpoint3.pt", tmp_path / "checkpoint_best.pt"
    new.write_bytes(b"new" * 1000)
    best.write_bytes(b"old")
    copyfile = shutil.copyfile

    def interrupted(src, dst, *args, **kwargs):
        with open(dst, "wb") as f:
            f.write(b"ne")
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copyfile", interrupted)
    with pytest.raises(KeyboardInterrupt):
        checkpoint_utils.PathManager.copy(str(new), str(best), overwrite=True)
    assert best.read_bytes() == b"old"
    monkeypatch.setattr(shutil, "copyfile", copyfile)
    assert checkpoint_utils.PathManager.copy(str(new), str(best), overwrite=True)
    assert best.read_bytes() == new.read_bytes()
