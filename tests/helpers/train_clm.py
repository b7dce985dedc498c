"""Running recipes/hf/train_clm.py (and the other recipes of recipes/hf) in the tests: as a script
(CPU, offline) or imported, with the per-rank records it writes under --record_dir."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import fork_server
from helpers.launched import abort, fail_timed_out, run_launched

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "recipes" / "hf" / "train_clm.py"
ACCELERATE = Path(sys.executable).with_name("accelerate")
# `python <recipe> args` runs forked from a server that has imported what the recipe imports
# (helpers/fork_server.py: 6-8 s of imports per start); launchers and `python -c` run fresh
FORKED = {REPO / "recipes" / "hf" / f"{name}.py" for name in ("train_clm", "run_mlm", "run_translation")}
TIMEOUT = 400
TINY = ["--hidden_size", "32", "--num_layers", "2", "--num_heads", "4", "--block_size", "32",
        "--per_device_batch_size", "2", "--connection", "momentum"]


def run(cmd, cwd, extra_env=None, check=True):
    """`cmd` with the tests' environment (CPU, offline), `extra_env` over it; asserts status 0 unless
    check=False."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               ACCELERATE_USE_CPU="1", PYTHONPATH=str(REPO), PYTHONFAULTHANDLER="1")
    env.update(extra_env or {})
    if cmd[0] == sys.executable and len(cmd) > 1 and Path(cmd[1]) in FORKED:
        script = str(cmd[1])
        try:
            proc = fork_server.server([script], env).run(script, cmd[2:], None, cwd, env, TIMEOUT, abort)
        except subprocess.TimeoutExpired as timed_out:
            fail_timed_out(cmd, TIMEOUT, timed_out.output, timed_out.stderr)
    else:
        proc = run_launched(cmd, cwd=cwd, env=env, timeout=TIMEOUT)
    assert proc.returncode == 0 or not check, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def word_text(path, count):
    """`count` words of a small vocabulary, seeded, to `path`; returns path."""
    import random
    words = ["momentum", "attention", "linear", "state", "token", "heavy", "ball", "step", "gradient"]
    rng = random.Random(0)
    path.write_text(" ".join(rng.choice(words) for _ in range(count)))
    return path


def uninterrupted_and_resumed(common, tmp_path, at):
    """Rank 0's records of `common` run whole (a checkpoint every `at` steps, in tmp_path/full) and
    resumed from its step_`at`."""
    run([*common, "--output_dir", str(tmp_path / "full"), "--checkpointing_steps", str(at),
         "--record_dir", str(tmp_path / "full_rec")], tmp_path)
    run([*common, "--output_dir", str(tmp_path / "resumed"), "--record_dir", str(tmp_path / "resumed_rec"),
         "--resume_from_checkpoint", str(tmp_path / "full" / f"step_{at}")], tmp_path)
    return records(tmp_path / "full_rec")[0], records(tmp_path / "resumed_rec")[0]


def records(folder):
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in Path(folder).glob("rank*.json")}


def load_script():
    spec = importlib.util.spec_from_file_location("train_clm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
