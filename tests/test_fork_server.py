"""The tests' forked scripts (helpers/fork_server.py) behave as the installed scripts run in fresh
processes: fairseq-train's log and exit status, fairseq-generate's output and log (a server of its
own import order), an argument error's status and message, stdin read by fairseq-interactive, a
call past its time killed, an environment that differs at import time sent to a fresh process; and
a Python script forked as `python script args` runs it (argv, __file__, sys.path, cwd, environment,
stdin, exit status, what runs at exit), and past its time dumps its stacks."""
import os
import re
import subprocess
import sys
import textwrap

import pytest
from helpers import fairseq_cli, fork_server
from helpers.fairseq_cli import (
    COMMON_TRAIN,
    USER_DIR,
    cli_env,
    preprocess_lm,
    run_cli,
    run_fresh,
    write_lm_text,
)
from helpers.launched import abort

LSTM_LM = ["--task", "language_modeling", "--arch", "momentum_lstm_lm", "--decoder-layers", "1",
           "--decoder-embed-dim", "16", "--decoder-hidden-size", "16", "--tokens-per-sample", "16",
           "--batch-size", "4", "--optimizer", "sgd", "--lr", "1", "--max-update", "3"]


def log_lines(text):
    """The log without its timestamps, timings and paths of the run's own folder."""
    text = re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| ", "", text, flags=re.M)
    text = re.sub(r"\b(wall|train_wall|wps|ups)([= ])[0-9.]+", r"\1\2", text)
    text = re.sub(r"\b\d+\.\d+ ?(seconds|s|sentences/s|tokens/s)\b", "", text)
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
    assert fairseq_cli.server("train", cli_env()) is not None
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


def test_generate_forked_from_its_own_server_writes_what_a_fresh_process_writes(lm_data, tmp_path):
    run_cli("train", lm_data, "--user-dir", USER_DIR, "--save-dir", tmp_path, *COMMON_TRAIN, *LSTM_LM)
    generate = ["generate", lm_data, "--user-dir", USER_DIR, "--task", "language_modeling", "--path",
                tmp_path / "checkpoint_last.pt", "--beam", "2", "--batch-size", "8", "--max-len-b", "6",
                "--gen-subset", "valid", "--sample-break-mode", "eos", "--num-workers", "0",
                "--required-batch-size-multiple", "1"]
    forked, fresh = run_cli(*generate), run_fresh(*generate)
    assert fairseq_cli.server("generate", cli_env()) is not fairseq_cli.server("train", cli_env())
    assert len(re.findall(r"^H-\d+\t", forked.stdout, re.M)) == 30
    assert log_lines(forked.stdout) == log_lines(fresh.stdout)
    assert log_lines(forked.stderr) == log_lines(fresh.stderr)


def test_a_call_past_its_time_is_killed_and_the_next_one_runs(lm_data, tmp_path):
    server = fairseq_cli.server("train", cli_env())
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(fairseq_cli.BIN / "fairseq-train",
                   [lm_data, "--user-dir", USER_DIR, "--save-dir", tmp_path / "long", *COMMON_TRAIN, *LSTM_LM,
                    "--max-update", "100000"], None, fairseq_cli.REPO, cli_env(), 3)
    assert run_cli("train", "--no-such-flag", check=False).returncode == 1
    assert fairseq_cli.server("train", cli_env()) is server


def test_an_environment_read_at_import_goes_to_a_fresh_process():
    server = fairseq_cli.server("train", cli_env())
    assert server.serves(cli_env(OMP_NUM_THREADS="2"))
    assert not server.serves(cli_env(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1"))
    assert fairseq_cli.server("train", cli_env(TRITON_INTERPRET="0")) is None
    assert fairseq_cli.server("hydra-train", cli_env()) is None


SCRIPT = """
import sys
print("imported before the script ran:", "email.parser" in sys.modules)
import atexit, json, os
import email.parser                       # the server's import, made before the script runs

def main():
    atexit.register(lambda: print("at exit", flush=True))
    print(json.dumps(dict(argv=sys.argv, file=__file__, path0=sys.path[0], cwd=os.getcwd(),
                          name=__name__, env=os.environ.get("FORK_TEST"), stdin=sys.stdin.read(),
                          parser=email.parser.__name__)))
    print("to stderr", file=sys.stderr)
    sys.exit(int(sys.argv[1]))

if __name__ == "__main__":
    main()
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "tool" / "script.py"
    path.parent.mkdir()
    path.write_text(SCRIPT)
    return str(path)


def test_a_python_script_forked_runs_as_python_runs_it(script, tmp_path):
    env = dict(os.environ, FORK_TEST="yes")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    server = fork_server.server([script], env)
    for code in ("0", "3"):
        forked = server.run(script, [code, "x y"], "in\n", cwd, env, 60)
        fresh = subprocess.run([sys.executable, script, code, "x y"], input="in\n", cwd=cwd, env=env,
                               capture_output=True, text=True, timeout=60)
        first, rest = forked.stdout.split("\n", 1)
        assert first == "imported before the script ran: True"
        assert fresh.stdout == "imported before the script ran: False\n" + rest
        assert (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr)
        assert forked.returncode == int(code) and forked.stdout.endswith("at exit\n")
        assert '"stdin": "in\\n"' in forked.stdout and '"env": "yes"' in forked.stdout
    assert fork_server.server([script], env) is server


def test_a_forked_script_past_its_time_dumps_its_stacks(tmp_path):
    path = tmp_path / "wait.py"
    path.write_text(textwrap.dedent("""
        import sys
        import time

        def wait_here():
            time.sleep(600)

        if sys.argv[1:] != ["now"]:
            wait_here()
    """))
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    server = fork_server.server([str(path)], env)
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        server.run(path, [], None, tmp_path, env, 2, on_timeout=abort)
    assert "in wait_here" in timed_out.value.stderr
    assert server.run(path, ["now"], None, tmp_path, env, 60).returncode == 0


CODE = """
import json, os, sys
print(json.dumps(dict(argv=sys.argv, path0=sys.path[0], cwd=os.getcwd(), name=__name__,
                      main=sys.modules["__main__"].__dict__ is globals())))
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("flags,argv", [([], ["-c", CODE, "3", "x"]), (["-I"], ["-c", CODE, "0"]),
                                        ([], ["-m", "script", "4", "y"])], ids=["c", "c-isolated", "m"])
def test_code_and_modules_forked_run_as_python_runs_them(script, tmp_path, flags, argv):
    """`python -c`, `python -I -c` and `python -m` (sys.argv, sys.path[0], __main__): forked as fresh."""
    cwd = tmp_path / "tool"                                  # the module of -m is found from the cwd
    env = dict(os.environ, FORK_TEST="m")
    server = fork_server.server([], env, isolated=bool(flags))
    forked = server.run(argv[0], argv[1:], None, cwd, env, 60)
    fresh = subprocess.run([sys.executable, *flags, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=60)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == int(argv[2]) and ("true" in forked.stdout or argv[0] == "-m")
