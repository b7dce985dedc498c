"""The fairseq tests' forked console scripts (helpers/cli_fork.py) behave as the installed scripts
run in fresh processes: the same training log and exit status, an argument error's status and
message, stdin read by fairseq-interactive, a call past its time killed, and an environment that
differs at import time sent to a fresh process."""
import re
import subprocess

import pytest
from helpers import fairseq_cli
from helpers.fairseq_cli import (
    COMMON_TRAIN,
    USER_DIR,
    cli_env,
    preprocess_lm,
    run_cli,
    run_fresh,
    write_lm_text,
)

LSTM_LM = ["--task", "language_modeling", "--arch", "momentum_lstm_lm", "--decoder-layers", "1",
           "--decoder-embed-dim", "16", "--decoder-hidden-size", "16", "--tokens-per-sample", "16",
           "--batch-size", "4", "--optimizer", "sgd", "--lr", "1", "--max-update", "3"]


def log_lines(text):
    """The log without its timestamps, timings and paths of the run's own folder."""
    text = re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| ", "", text, flags=re.M)
    text = re.sub(r"\b(wall|train_wall|wps|ups)([= ])[0-9.]+", r"\1\2", text)
    text = re.sub(r"\b\d+\.\d+ (seconds|s)\b", "", text)
    return [line for line in text.splitlines() if "tensorboardX" not in line]


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm")
    return preprocess_lm(write_lm_text(folder / "text", seed=3), folder / "bin")


def test_a_forked_training_run_logs_what_a_fresh_process_logs(lm_data, tmp_path):
    runs = []
    for where, call in (("forked", run_cli), ("fresh", run_fresh)):
        save = tmp_path / where / "ckpt"
        proc = call("train", lm_data, "--user-dir", USER_DIR, "--save-dir", save, *COMMON_TRAIN, *LSTM_LM)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append([line.replace(str(save), "SAVE") for line in log_lines(proc.stdout)])
    assert fairseq_cli._server is not None and fairseq_cli._server.serves(cli_env())
    assert any("num_updates=3" in line for line in runs[0])
    assert runs[0] == runs[1]


def test_an_argument_error_exits_with_the_scripts_status_and_traceback():
    forked = run_cli("train", "--no-such-flag", check=False)
    alone = run_fresh("train", "--no-such-flag")
    assert forked.returncode == alone.returncode != 0
    for proc in (forked, alone):
        assert "in parse_args_and_arch" in proc.stderr.splitlines()[-3]
    assert forked.stderr.splitlines()[-2:] == alone.stderr.splitlines()[-2:]


def test_stdin_reaches_interactive_and_an_exception_exits_1(lm_data, tmp_path):
    run_cli("train", lm_data, "--user-dir", USER_DIR, "--save-dir", tmp_path, *COMMON_TRAIN, *LSTM_LM)
    prompt = "the cat sees\nthe big dog\n"
    interactive = ["interactive", lm_data, "--user-dir", USER_DIR, "--task", "language_modeling",
                   "--beam", "2"]
    outputs = [[line for line in call(*interactive, "--path", tmp_path / "checkpoint_last.pt",
                                      stdin=prompt).stdout.splitlines() if line[:2] in ("S-", "H-")]
               for call in (run_cli, run_fresh)]
    assert [line.split("\t")[1] for line in outputs[0] if line.startswith("S-")] == prompt.splitlines()
    assert outputs[0] == outputs[1]
    proc = run_cli(*interactive, "--path", tmp_path / "missing.pt", stdin=prompt, check=False)
    assert proc.returncode == 1
    assert "missing.pt" in proc.stderr.splitlines()[-1]


def test_a_call_past_its_time_is_killed_and_the_next_one_runs(lm_data, tmp_path):
    server = fairseq_cli._forked(cli_env())
    with pytest.raises(subprocess.TimeoutExpired):
        server.run("train", [str(lm_data), "--user-dir", USER_DIR, "--save-dir", str(tmp_path / "long"),
                             *COMMON_TRAIN, *LSTM_LM, "--max-update", "100000"], None, fairseq_cli.REPO,
                   cli_env(), 3, tmp_path)
    assert run_cli("train", "--no-such-flag", check=False).returncode == 1
    assert fairseq_cli._server is server


def test_an_environment_read_at_import_goes_to_a_fresh_process():
    server = fairseq_cli._forked(cli_env())
    assert server.serves(cli_env(OMP_NUM_THREADS="2"))
    assert not server.serves(cli_env(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1"))
    assert fairseq_cli._forked(cli_env(TRITON_INTERPRET="0")) is None
